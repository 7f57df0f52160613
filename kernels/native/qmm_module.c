/* kernels._qmm: the quantized matmul's CPython entry, its path choice and its thread pool.
 *
 * Owns which path runs (chosen once from the CPU's features, or named by the caller: tests and doctor run each) and
 * the split of a call's output columns over threads: parts of whole 16-column runs, each computed by one thread, so
 * a column is computed in the reference's order whatever the thread count or whichever thread takes its part. Never
 * splits a reduction, never looks at the number of rows to choose anything. Holds no weights: every call passes its buffers (kernels/qmatmul.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include "qmm.h"
#include "attn.h"
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

/* A path whose file is not linked in (another CPU family, a file not built) is a null weak symbol: unavailable. */
#if defined(__x86_64__)
#pragma weak qmm_gemm_avx512_vnni
#pragma weak qmm_gemm_avx2
#pragma weak attn_unit_avx2
#pragma weak qmm_swiglu_avx2
#endif
#if defined(__aarch64__)
#pragma weak qmm_gemm_neon_dotprod
#endif

static const char *const isa_names[QMM_NISAS] = {"scalar", "avx2", "avx512", "avx512_vnni", "neon_dotprod"};

static qmm_gemm_fn path_of(int isa) {
    switch (isa) {
    case QMM_SCALAR: return qmm_gemm_ref;
#if defined(__x86_64__)
    case QMM_AVX2:
        return __builtin_cpu_supports("avx2") ? qmm_gemm_avx2 : NULL;
    case QMM_AVX512_VNNI:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") ? qmm_gemm_avx512_vnni : NULL;
#endif
#if defined(__aarch64__) && defined(__linux__)
    case QMM_NEON_DOTPROD:
        return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? qmm_gemm_neon_dotprod : NULL;
#endif
    default: return NULL;
    }
}

/* Best first, by measurement (a fixed order, never the rows): `python -m bench.qmatmul_speed --types
 * Q4_K,Q6_K,Q8_0,Q5_0,Q4_1 --rows 1,4 --threads 1 --paths avx512_vnni,avx2 --shapes up` on an Intel Xeon with
 * AVX-512 VNNI, GB/s at 1 and 4 rows, AVX-512 VNNI / AVX2: Q4_K 15.8, 10.3 / 15.6, 7.5; Q6_K 16.0, 8.7 / 14.3, 7.5;
 * Q8_0 20.6, 13.9 / 17.0, 8.3; Q5_0 14.1, 9.3 / 8.6, 5.3; Q4_1 13.9, 9.6 / 9.8, 6.1. */
static const int preference[] = {QMM_AVX512_VNNI, QMM_AVX512, QMM_AVX2, QMM_NEON_DOTPROD, QMM_SCALAR};

static int best_isa(void) {
    static const int *order = preference;
    for (size_t i = 0; i < sizeof preference / sizeof *preference; i++)
        if (path_of(order[i])) return order[i];
    return QMM_SCALAR;
}

/* ---- the thread pool: a call's columns are cut into parts (runs of 16 columns, a few per thread), claimed one at
 * a time by the caller and the workers, so a worker the OS has descheduled delays nothing: the others take its parts.
 * Who computes a part never changes its bits (a column is one thread's, in the reference's order). Workers spin a
 * little after a call (the next linear follows within microseconds), then sleep on a condition variable (an idle
 * gateway burns no core). ---- */

#define MAX_THREADS 64
#define PARTS_PER_THREAD 4
#define SPIN_ROUNDS 20000

#define MAX_WEIGHTS 4                      /* weights sharing one call's input (a fused projection's parts) */

typedef struct {
    int type, N, col, units;                /* units: 16-column runs */
    const uint8_t *W;
    const qmm_act *x;                       /* the input quantized in this type's family */
} weight_t;

typedef struct {
    qmm_gemm_fn fn;
    int K, M, ldy, n_weights, units, parts;
    weight_t w[MAX_WEIGHTS];
    float *Y;
    attn_unit_fn unit;                      /* or an attention's units (then parts = its units) */
    const attn_t *attn;
} job_t;

static job_t job;
static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;    /* one call at a time uses the pool */
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static atomic_uint generation;                /* bumped by each call that uses the workers */
static _Atomic uint64_t claim;                /* (that call's generation << 32) | its next unclaimed part */
static atomic_int parts_done, sleepers;
static int n_workers;

static void run_part(int p) {          /* the p-th of job.parts runs of 16 columns, over the weights in order */
    if (job.unit) {
        job.unit(job.attn, p, job.parts);
        return;
    }
    const int u0 = (int)((long)job.units * p / job.parts), u1 = (int)((long)job.units * (p + 1) / job.parts);
    int start = 0;
    for (int i = 0; i < job.n_weights; start += job.w[i].units, i++) {
        const weight_t *w = &job.w[i];
        const int a = u0 > start ? u0 : start, b = u1 < start + w->units ? u1 : start + w->units;
        if (a >= b) continue;
        const int n0 = (a - start) * 16, n1 = (b - start) * 16 < w->N ? (b - start) * 16 : w->N;
        job.fn(w->type, w->W, job.K, w->x, job.M, job.Y + w->col, job.ldy, n0, n1);
    }
}

/* the next part of call `gen`, or -1 when it has none left (or is over: a late worker claims nothing) */
static int claim_part(unsigned gen) {
    uint64_t v = atomic_load_explicit(&claim, memory_order_acquire);
    for (;;) {
        if ((unsigned)(v >> 32) != gen || (int)(uint32_t)v >= job.parts) return -1;
        if (atomic_compare_exchange_weak_explicit(&claim, &v, v + 1, memory_order_acq_rel, memory_order_acquire))
            return (int)(uint32_t)v;
    }
}

static void work(unsigned gen) {
    int p;
    while ((p = claim_part(gen)) >= 0) {
        run_part(p);
        atomic_fetch_add_explicit(&parts_done, 1, memory_order_release);
    }
}

static inline void relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *worker(void *arg) {
    unsigned seen = (unsigned)(uintptr_t)arg;         /* the generation it was started in */
    for (;;) {
        unsigned now;
        int spins = 0;
        while ((now = atomic_load_explicit(&generation, memory_order_acquire)) == seen && spins++ < SPIN_ROUNDS)
            relax();
        if (now == seen) {
            pthread_mutex_lock(&wake_lock);
            atomic_fetch_add(&sleepers, 1);
            while ((now = atomic_load(&generation)) == seen) pthread_cond_wait(&wake, &wake_lock);
            atomic_fetch_sub(&sleepers, 1);
            pthread_mutex_unlock(&wake_lock);
        }
        seen = now;
        work(seen);
    }
    return NULL;
}

static void after_fork_child(void) {          /* a forked child has none of the parent's threads */
    n_workers = 0;
    atomic_store(&sleepers, 0);
    pthread_mutex_init(&call_lock, NULL);
    pthread_mutex_init(&wake_lock, NULL);
    pthread_cond_init(&wake, NULL);
}

static void grow_pool(int threads) {          /* as many workers as it can start, up to threads - 1 */
    static int registered;
    if (!registered) { pthread_atfork(NULL, NULL, after_fork_child); registered = 1; }
    while (n_workers < threads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, worker, (void *)(uintptr_t)atomic_load(&generation));
        pthread_attr_destroy(&attr);
        if (rc != 0) return;                  /* fewer workers: the caller and those there are take every part */
        n_workers++;
    }
}

static void run_job(const job_t *todo, int threads) {
    pthread_mutex_lock(&call_lock);
    job = *todo;
    if (!job.unit) {
        job.units = 0;
        for (int i = 0; i < job.n_weights; i++) job.units += job.w[i].units = (job.w[i].N + 15) / 16;
        const int units = job.units;
        job.parts = threads > 1 ? (units < threads * PARTS_PER_THREAD ? units : threads * PARTS_PER_THREAD) : 1;
    }
    if (job.parts <= 1) {
        run_part(0);
    } else {
        grow_pool(threads);
        const unsigned gen = atomic_load(&generation) + 1;
        atomic_store_explicit(&parts_done, 0, memory_order_relaxed);
        atomic_store_explicit(&claim, (uint64_t)gen << 32, memory_order_release);
        atomic_store_explicit(&generation, gen, memory_order_release);
        if (atomic_load(&sleepers) > 0) {
            pthread_mutex_lock(&wake_lock);
            pthread_cond_broadcast(&wake);
            pthread_mutex_unlock(&wake_lock);
        }
        work(gen);
        while (atomic_load_explicit(&parts_done, memory_order_acquire) < job.parts) relax();
    }
    pthread_mutex_unlock(&call_lock);
}

/* ---- Python ---- */

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t act_bytes(long M, long K, int B) {
    return align64((size_t)(M * K)) + align64(sizeof(float) * (size_t)(M * K / B)) + align64(sizeof(int16_t) * (size_t)(M * K / 16));
}

/* the scratch of an input quantized both ways (32-blocks first, then 256-blocks when K allows) */
static size_t scratch_bytes(long M, long K) {
    return act_bytes(M, K, 32) + (K % 256 == 0 ? act_bytes(M, K, 256) : 0);
}

static qmm_act act_at(char *base, long M, long K, int B) {
    int8_t *q = (int8_t *)base;
    float *d = (float *)(base + align64((size_t)(M * K)));
    int16_t *s = (int16_t *)((char *)d + align64(sizeof(float) * (size_t)(M * K / B)));
    return (qmm_act){q, d, s, (int)K, B};
}

static PyObject *py_scratch_bytes(PyObject *self, PyObject *args) {
    long M, K;
    if (!PyArg_ParseTuple(args, "ll", &M, &K)) return NULL;
    return PyLong_FromSize_t(scratch_bytes(M, K));
}

/* matmul(weights, x, M, K, Y, ldy, threads, isa, scratch) -> the path that ran. weights: up to MAX_WEIGHTS tuples
 * (type, W, N, col), each writing Y[m*ldy + col + n], n < N, from the same input x [M, K] (quantized once a family).
 * Shapes are checked here against the buffers' lengths; kernels/qmatmul.py gives the readable errors first. */
static PyObject *py_matmul(PyObject *self, PyObject *args) {
    PyObject *weights;
    int threads, isa;
    long M, K, ldy;
    Py_buffer x, y, sc, w[MAX_WEIGHTS];
    if (!PyArg_ParseTuple(args, "O!y*llw*liiw*", &PyTuple_Type, &weights, &x, &M, &K, &y, &ldy, &threads, &isa, &sc))
        return NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(weights);
    job_t todo = {0};
    int got = 0, need32 = 0, need256 = 0;
    const char *err = NULL;
    if (n < 1 || n > MAX_WEIGHTS) err = "one to four weights a call";
    if (isa < 0) isa = best_isa();
    todo.fn = isa < QMM_NISAS ? path_of(isa) : NULL;
    if (!err && !todo.fn) err = "that path is not available on this CPU";
    if (!err && (M < 1 || K < 1 || (size_t)x.len < sizeof(float) * (size_t)(M * K))) err = "x is shorter than M x K floats";
    if (!err && (size_t)sc.len < scratch_bytes(M, K)) err = "scratch is too short";
    if (!err && (threads < 1 || threads > MAX_THREADS)) err = "threads must be 1..64";
    for (Py_ssize_t i = 0; !err && i < n; i++) {
        weight_t *wt = &todo.w[i];
        long N, col;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(weights, i), "iy*ll", &wt->type, &w[i], &N, &col)) {
            err = "";                                /* the parser's own error */
            break;
        }
        got++;
        wt->N = (int)N, wt->col = (int)col, wt->W = (const uint8_t *)w[i].buf;
        if (wt->type < 0 || wt->type >= QMM_NTYPES) { err = "unknown type"; break; }
        const size_t row = (size_t)(K / qmm_block_weights[wt->type]) * qmm_block_bytes[wt->type];
        if (K % qmm_block_weights[wt->type] != 0) err = "K is not a whole number of blocks";
        else if (N < 1 || (size_t)w[i].len < row * (size_t)N) err = "W is shorter than N rows of blocks";
        else if (col < 0 || ldy < col + N || (size_t)y.len < sizeof(float) * (size_t)((M - 1) * ldy + col + N))
            err = "Y is too short";
        need32 |= qmm_act_block(wt->type) == 32;
        need256 |= qmm_act_block(wt->type) == 256;
    }
    PyObject *result = NULL;
    if (err) {
        if (*err) PyErr_SetString(PyExc_ValueError, err);
    } else {
        qmm_act a32 = act_at((char *)sc.buf, M, K, 32);
        qmm_act a256 = act_at((char *)sc.buf + act_bytes(M, K, 32), M, K, 256);
        todo.K = (int)K, todo.M = (int)M, todo.ldy = (int)ldy, todo.n_weights = (int)n, todo.Y = (float *)y.buf;
        for (Py_ssize_t i = 0; i < n; i++) todo.w[i].x = qmm_act_block(todo.w[i].type) == 32 ? &a32 : &a256;
        Py_BEGIN_ALLOW_THREADS
        if (need32) qmm_quantize((const float *)x.buf, (int)M, (int)K, 32, (int8_t *)a32.q, (float *)a32.d, (int16_t *)a32.s);
        if (need256) qmm_quantize((const float *)x.buf, (int)M, (int)K, 256, (int8_t *)a256.q, (float *)a256.d, (int16_t *)a256.s);
        run_job(&todo, threads);
        Py_END_ALLOW_THREADS
        result = PyUnicode_FromString(isa_names[isa]);
    }
    for (int i = 0; i < got; i++) PyBuffer_Release(&w[i]);
    PyBuffer_Release(&x); PyBuffer_Release(&y); PyBuffer_Release(&sc);
    return result;
}

static PyObject *py_paths(PyObject *self, PyObject *noargs) {     /* the paths this CPU can run, best first */
    PyObject *out = PyList_New(0);
    for (size_t i = 0; i < sizeof preference / sizeof *preference; i++)
        if (path_of(preference[i])) {
            PyObject *item = Py_BuildValue("(si)", isa_names[preference[i]], preference[i]);
            PyList_Append(out, item);
            Py_DECREF(item);
        }
    return out;
}

/* ---- the pass's row-wise operations (qmm_ops.c) ---- */

void qmm_rmsnorm(const float *x, const float *gamma, float eps, int T, int d, float *y);
void qmm_rows(int type, const uint8_t *W, int K, const int64_t *ids, int T, float *out);
void qmm_nll(const float *logits, int M, int V, int ld, const int64_t *targets, float *nll);

static int too_short(const Py_buffer *b, size_t need, const char *what) {
    if ((size_t)b->len >= need) return 0;
    PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %zu needed", what, b->len, need);
    return 1;
}

static PyObject *py_rmsnorm(PyObject *self, PyObject *args) {      /* rmsnorm(x, gamma, eps, T, d, y) */
    Py_buffer x, g, y;
    float eps;
    int T, d;
    if (!PyArg_ParseTuple(args, "y*y*fiiw*", &x, &g, &eps, &T, &d, &y)) return NULL;
    size_t n = sizeof(float) * (size_t)T * d;
    int bad = too_short(&x, n, "x") || too_short(&g, sizeof(float) * (size_t)d, "gamma") || too_short(&y, n, "y");
    if (!bad) { Py_BEGIN_ALLOW_THREADS qmm_rmsnorm(x.buf, g.buf, eps, T, d, y.buf); Py_END_ALLOW_THREADS }
    PyBuffer_Release(&x); PyBuffer_Release(&g); PyBuffer_Release(&y);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

typedef void (*swiglu_fn)(const float *gu, int T, int F, float *out);

static swiglu_fn swiglu_path_of(int isa) {        /* a matmul path's CPU runs AVX2's text, or the reference's */
#if defined(__x86_64__)
    if (isa != QMM_SCALAR && path_of(isa) && qmm_swiglu_avx2) return qmm_swiglu_avx2;
#endif
    return path_of(isa) ? qmm_swiglu : NULL;
}

/* swiglu(gate_up, T, F, out, isa) -> the path that ran */
static PyObject *py_swiglu(PyObject *self, PyObject *args) {
    Py_buffer gu, out;
    int T, F, isa;
    if (!PyArg_ParseTuple(args, "y*iiw*i", &gu, &T, &F, &out, &isa)) return NULL;
    if (isa < 0) isa = best_isa();
    const swiglu_fn fn = isa < QMM_NISAS ? swiglu_path_of(isa) : NULL;
    int bad = too_short(&gu, sizeof(float) * 2 * (size_t)T * F, "gate_up") ||
              too_short(&out, sizeof(float) * (size_t)T * F, "out");
    if (!bad && !fn) {
        PyErr_SetString(PyExc_ValueError, "that path is not available");
        bad = 1;
    }
    if (!bad) { Py_BEGIN_ALLOW_THREADS fn(gu.buf, T, F, out.buf); Py_END_ALLOW_THREADS }
    PyBuffer_Release(&gu); PyBuffer_Release(&out);
    if (bad) return NULL;
    return PyUnicode_FromString(fn == qmm_swiglu ? "scalar" : "avx2");
}

static PyObject *py_expf(PyObject *self, PyObject *args) {     /* expf(x, out, n): SwiGLU's exp, the reference's */
    Py_buffer x, out;
    int n;
    if (!PyArg_ParseTuple(args, "y*w*i", &x, &out, &n)) return NULL;
    int bad = too_short(&x, sizeof(float) * (size_t)n, "x") || too_short(&out, sizeof(float) * (size_t)n, "out");
    for (int i = 0; !bad && i < n; i++) ((float *)out.buf)[i] = qmm_expf(((const float *)x.buf)[i]);
    PyBuffer_Release(&x); PyBuffer_Release(&out);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_rows(PyObject *self, PyObject *args) {         /* rows(type, W, V, K, ids, T, out) */
    Py_buffer w, ids, out;
    int type, T;
    long V, K;
    if (!PyArg_ParseTuple(args, "iy*lly*iw*", &type, &w, &V, &K, &ids, &T, &out)) return NULL;
    int bad = type < 0 || type >= QMM_NTYPES || K % qmm_block_weights[type] != 0;
    if (bad) PyErr_SetString(PyExc_ValueError, "unknown type, or K not a whole number of blocks");
    bad = bad || too_short(&w, (size_t)V * (K / qmm_block_weights[type]) * qmm_block_bytes[type], "W") ||
          too_short(&ids, sizeof(int64_t) * (size_t)T, "ids") || too_short(&out, sizeof(float) * (size_t)T * K, "out");
    for (int t = 0; !bad && t < T; t++)
        if (((const int64_t *)ids.buf)[t] < 0 || ((const int64_t *)ids.buf)[t] >= V) {
            PyErr_Format(PyExc_ValueError, "token id %lld is outside the table's %ld rows",
                         (long long)((const int64_t *)ids.buf)[t], V);
            bad = 1;
        }
    if (!bad) { Py_BEGIN_ALLOW_THREADS qmm_rows(type, w.buf, (int)K, ids.buf, T, out.buf); Py_END_ALLOW_THREADS }
    PyBuffer_Release(&w); PyBuffer_Release(&ids); PyBuffer_Release(&out);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_nll(PyObject *self, PyObject *args) {          /* nll(logits, M, V, ld, targets, out) */
    Py_buffer lg, tg, out;
    int M, V, ld;
    if (!PyArg_ParseTuple(args, "y*iiiy*w*", &lg, &M, &V, &ld, &tg, &out)) return NULL;
    int bad = M < 1 || V < 1 || ld < V;
    if (bad) PyErr_SetString(PyExc_ValueError, "need M >= 1, V >= 1 and ld >= V");
    bad = bad || too_short(&lg, sizeof(float) * ((size_t)(M - 1) * ld + V), "logits") ||
          too_short(&tg, sizeof(int64_t) * (size_t)M, "targets") || too_short(&out, sizeof(float) * (size_t)M, "out");
    for (int m = 0; !bad && m < M; m++)
        if (((const int64_t *)tg.buf)[m] < 0 || ((const int64_t *)tg.buf)[m] >= V) {
            PyErr_SetString(PyExc_ValueError, "a target is outside the vocabulary");
            bad = 1;
        }
    if (!bad) { Py_BEGIN_ALLOW_THREADS qmm_nll(lg.buf, M, V, ld, tg.buf, out.buf); Py_END_ALLOW_THREADS }
    PyBuffer_Release(&lg); PyBuffer_Release(&tg); PyBuffer_Release(&out);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

/* ---- the native attention (attn.h) ---- */

static PyObject *py_attention_scratch(PyObject *self, PyObject *args) {
    int R, H, D, N;
    if (!PyArg_ParseTuple(args, "iiii", &R, &H, &D, &N)) return NULL;
    return PyLong_FromLong(attn_scratch_floats(R, H, D, N));
}

static attn_unit_fn attn_path_of(int isa) {        /* the attention a matmul path's CPU runs: AVX2's text or the
                                                      reference's (NEON: the reference compiled for AArch64) */
#if defined(__x86_64__)
    if (isa != QMM_SCALAR && path_of(isa) && attn_unit_avx2) return attn_unit_avx2;
#endif
    return path_of(isa) ? attn_unit_ref : NULL;
}

/* attention(qkv, ldq, dims (T, R, H, KVH, D, S, C, P, W, interleaved, f16), scale, (cos, sin, cos_s, sin_s), mask,
 * path or None, (recent_k, recent_v, sink_k, sink_v, ring_k, ring_v), new_k, new_v, ldn, o, ldo, scratch, threads,
 * isa) -> the path that ran. Lengths are checked here; kernels/attention.py gives the readable errors first. */
static PyObject *py_attention(PyObject *self, PyObject *args) {
    Py_buffer qkv, cs[4], mask, kv[6], nk, nv, o, sc, path = {0};
    PyObject *path_obj;
    attn_t a = {0};
    int threads, isa;
    if (!PyArg_ParseTuple(args, "y*i(iiiiiiiiiii)f(y*y*y*y*)y*O(y*y*y*y*y*y*)w*w*iw*iw*ii", &qkv, &a.ldq, &a.T, &a.R,
                          &a.H, &a.KVH, &a.D, &a.S, &a.C, &a.P, &a.W, &a.interleaved, &a.f16, &a.scale, &cs[0],
                          &cs[1], &cs[2], &cs[3], &mask, &path_obj, &kv[0], &kv[1], &kv[2], &kv[3], &kv[4], &kv[5],
                          &nk, &nv, &a.ldn, &o, &a.ldo, &sc, &threads, &isa))
        return NULL;
    const int has_path = path_obj != Py_None && PyObject_GetBuffer(path_obj, &path, PyBUF_SIMPLE) == 0;
    const size_t esz = a.f16 ? 2 : 4;
    const long N = (long)a.S + a.C + a.P + (a.W ? a.W : a.T), HD = (long)a.H * a.D, KD = (long)a.KVH * a.D;
    if (isa < 0) isa = best_isa();
    const attn_unit_fn unit = isa < QMM_NISAS ? attn_path_of(isa) : NULL;
    const int units = a.H * a.R < threads ? a.H * a.R : threads;     /* attn_body.h's items: (row, head) */
    int bad = PyErr_Occurred() != NULL;
    if (!bad && (!unit || a.T < 1 || a.R < 1 || a.R > a.T || a.KVH < 1 || a.H % a.KVH || a.D % 8 || a.S < 0 ||
                 a.C < 0 || a.P < 0 || a.W < 0 || a.W > a.T || (a.W > 0) != has_path || threads < 1 ||
                 threads > MAX_THREADS || a.ldq < HD + 2 * KD || a.ldo < HD || a.ldn < a.T)) {
        PyErr_SetString(PyExc_ValueError, unit ? "attention: inconsistent dimensions" : "that path is not available");
        bad = 1;
    }
    for (int i = 0; !bad && i < 4; i++) bad = too_short(&cs[i], sizeof(float) * (size_t)a.T * a.D / 2, "a table");
    bad = bad || too_short(&qkv, sizeof(float) * (size_t)((a.T - 1) * (long)a.ldq + HD + 2 * KD), "qkv") ||
          too_short(&mask, sizeof(float) * (size_t)(a.R * N), "mask") ||
          (has_path && too_short(&path, sizeof(int64_t) * (size_t)a.T * a.W, "path")) ||
          too_short(&kv[0], esz * (size_t)(a.P * KD), "recent_k") ||
          too_short(&kv[1], esz * (size_t)(a.P * KD), "recent_v") ||
          too_short(&kv[2], esz * (size_t)(a.S * KD), "sink_k") || too_short(&kv[3], esz * (size_t)(a.S * KD), "sink_v") ||
          too_short(&kv[4], esz * (size_t)(a.C * KD), "ring_k") || too_short(&kv[5], esz * (size_t)(a.C * KD), "ring_v") ||
          too_short(&nk, esz * (size_t)(((a.KVH - 1) * (long)a.ldn + a.T) * a.D), "new_k") ||
          too_short(&nv, esz * (size_t)(((a.KVH - 1) * (long)a.ldn + a.T) * a.D), "new_v") ||
          too_short(&o, sizeof(float) * (size_t)((a.R - 1) * (long)a.ldo + HD), "o") ||
          too_short(&sc, sizeof(float) * (size_t)attn_scratch_floats(a.R, a.H, a.D, (int)N), "scratch");
    for (long i = 0; !bad && has_path && i < (long)a.T * a.W; i++)
        if (((const int64_t *)path.buf)[i] < 0 || ((const int64_t *)path.buf)[i] >= a.T) {
            PyErr_SetString(PyExc_ValueError, "a path names a row outside the pass");
            bad = 1;
        }
    if (!bad) {
        a.qkv = qkv.buf, a.cos = cs[0].buf, a.sin = cs[1].buf, a.cos_s = cs[2].buf, a.sin_s = cs[3].buf;
        a.mask = mask.buf, a.path = has_path ? path.buf : NULL;
        a.recent_k = kv[0].buf, a.recent_v = kv[1].buf, a.sink_k = kv[2].buf, a.sink_v = kv[3].buf;
        a.ring_k = kv[4].buf, a.ring_v = kv[5].buf, a.new_k = nk.buf, a.new_v = nv.buf, a.o = o.buf, a.scratch = sc.buf;
        job_t todo = {0};
        todo.unit = unit, todo.attn = &a, todo.parts = units;
        Py_BEGIN_ALLOW_THREADS
        attn_prepare(&a);
        run_job(&todo, threads);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&qkv); PyBuffer_Release(&mask); PyBuffer_Release(&nk); PyBuffer_Release(&nv);
    PyBuffer_Release(&o); PyBuffer_Release(&sc);
    for (int i = 0; i < 4; i++) PyBuffer_Release(&cs[i]);
    for (int i = 0; i < 6; i++) PyBuffer_Release(&kv[i]);
    if (has_path) PyBuffer_Release(&path);
    if (bad) return NULL;
    return PyUnicode_FromString(unit == attn_unit_ref ? "scalar" : "avx2");
}

static PyMethodDef methods[] = {
    {"attention", py_attention, METH_VARARGS, "attention(qkv, ldq, dims, scale, tables, mask, path, pools, new_k, "
                                              "new_v, ldn, o, ldo, scratch, threads, isa) -> path"},
    {"attention_scratch", py_attention_scratch, METH_VARARGS, "attention_scratch(R, H, D, N) -> floats"},
    {"rmsnorm", py_rmsnorm, METH_VARARGS, "rmsnorm(x, gamma, eps, T, d, y)"},
    {"swiglu", py_swiglu, METH_VARARGS, "swiglu(gate_up, T, F, out, isa) -> path"},
    {"expf", py_expf, METH_VARARGS, "expf(x, out, n): SwiGLU's exp, the reference's (tests)"},
    {"rows", py_rows, METH_VARARGS, "rows(type, W, V, K, ids, T, out)"},
    {"nll", py_nll, METH_VARARGS, "nll(logits, M, V, ld, targets, out)"},
    {"matmul", py_matmul, METH_VARARGS, "matmul(((type, W, N, col), ...), x, M, K, Y, ldy, threads, isa, scratch) -> path"},
    {"scratch_bytes", py_scratch_bytes, METH_VARARGS, "scratch_bytes(M, K) -> bytes"},
    {"paths", py_paths, METH_NOARGS, "paths() -> [(name, id)], best first"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qmm", "ringspec's quantized matmul (kernels/qmatmul.py)",
                                    -1, methods};

PyMODINIT_FUNC PyInit__qmm(void) { return PyModule_Create(&module); }
