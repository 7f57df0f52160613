/* Every native path against the scalar reference, byte for byte: a standalone check, built for aarch64 and run under
 * qemu-aarch64 by tests/kernels/test_qmatmul_neon.py (this x86 machine cannot run the NEON path natively).
 *
 *   aarch64-linux-gnu-gcc -O3 -std=gnu11 -ffp-contract=off -static -Ikernels/native tests/kernels/qmm_check.c \
 *       kernels/native/qmm_ref.c kernels/native/qmm_neon.c -lm -o qmm_check && qemu-aarch64 -cpu cortex-a76 qmm_check
 *
 * Fixed seed; every type; M in 1..9, 17, 64; column ranges with tails (N not a multiple of the tile, n0 > 0); random
 * codes, scale and min bytes; activation rows with NaN, infinity, zeros, huge and subnormal values; weights' float16
 * scales in three modes: ordinary (one in 16 an edge value), edge values only (+-65504, the smallest normal,
 * subnormals, +-0, +-infinity), and edge values or NaNs. Y starts filled with a sentinel in both outputs, so a write
 * outside [n0, n1) is a mismatch too. Every output must be byte-equal, with one exception in the NaN-scales mode: two
 * NaNs that differ only in payload. When two NaNs of different payloads meet in one multiply or add (a NaN scale's
 * payload and a NaN activation row's default NaN), the result carries the first operand's, and which operand is first
 * is the compiler's choice for a commutative C operation (GCC 12 writes the reference's Q4_1 sum as the min term plus
 * the scale term), so no path can promise the reference's payload. Only GGUF files with NaN scales reach it; every
 * NaN this computation makes itself is AArch64's default NaN, so without NaN scales every byte must agree.
 * Prints one line per type (OK/FAIL, the first mismatch), exits 1 on any mismatch. On another CPU family the NEON
 * part is skipped (the reference still runs: the harness builds everywhere). Optional argument: a timing repeat count
 * (under emulation the time means nothing).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include "qmm.h"
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#define HAVE_NEON_PATH 1
#endif

static const char *const type_names[QMM_NTYPES] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next(void) {                         /* xorshift64*: fixed seed, the same stream on every machine */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}
static float uniform(void) { return (float)(next() >> 8) / 16777216.0f; }       /* [0, 1) */

/* a float16 scale: mostly ordinary; mode 1: always an edge value; mode 2: an edge value or a NaN */
static uint16_t f16_scale(int mode) {
    static const uint16_t edge[] = {0x7bff, 0xfbff, 0x0400, 0x03ff, 0x0001, 0x8001, 0x0000, 0x8000, 0x03ef,
                                    0x7c00, 0xfc00, 0x7e00, 0x7d01, 0xfe3f};      /* ..., +-inf, qNaN, sNaN, -qNaN */
    if (mode || next() % 16 == 0) return edge[next() % (mode == 2 ? 14 : 11)];
    return (uint16_t)(0x1000 + next() % 0x2400);        /* about 2^-11 .. 2^-2, either sign below */
}

static void fill_weights(int type, uint8_t *w, int nblocks, int mode) {
    const int bb = qmm_block_bytes[type];
    for (int i = 0; i < nblocks * bb; i++) w[i] = (uint8_t)next();    /* codes, qh, scale and min bytes: anything */
    if (next() % 4 == 0)                   /* the largest codes (Q8_0: -1), so integer sums pass 2^24 and (float) rounds */
        for (int i = 0; i < nblocks * bb; i++)
            w[i] = type == QMM_Q6_K && i % bb >= 192 ? (uint8_t)(i % 2 ? 0x81 : 0x7f)     /* Q6_K's scales: +-127 */
                 : type == QMM_Q8_0 && i % bb >= 2 ? 0x81 : 0xff;                           /* Q8_0's codes: -127 */
    for (int b = 0; b < nblocks; b++) {
        uint8_t *blk = w + (size_t)b * bb;
        uint16_t d = f16_scale(mode), m = f16_scale(mode);
        if (next() % 2) m |= 0x8000;
        if (type == QMM_Q6_K) {
            memcpy(blk + 208, &d, 2);
        } else {
            memcpy(blk, &d, 2);
            if (type == QMM_Q4_1 || type == QMM_Q5_1 || type == QMM_Q4_K || type == QMM_Q5_K) memcpy(blk + 2, &m, 2);
        }
    }
}

static void fill_activations(float *x, int M, int K) {
    for (int m = 0; m < M; m++) {
        float *r = x + (size_t)m * K;
        const int kind = next() % 11;
        const float scale = kind == 5 ? 3e38f : kind == 6 ? 1e-40f : powf(2.0f, (float)((int)(next() % 24) - 12));
        for (int k = 0; k < K; k++) r[k] = (uniform() * 2.0f - 1.0f) * scale;
        if (kind == 1) memset(r, 0, sizeof(float) * K);                             /* all zeros */
        if (kind == 2) r[next() % K] = NAN;                                         /* a NaN in one block */
        if (kind == 3) r[next() % K] = (next() % 2) ? INFINITY : -INFINITY;
        if (kind == 4) memset(r, 0, sizeof(float) * (K / 2));                       /* some blocks zero */
        if (kind == 7) r[next() % K] = 65504.0f * 1e30f;                            /* one huge value: others round to 0 */
        if (kind == 8) for (int k = 0; k < K; k++) r[k] = scale;                    /* every code +127: the largest sums */
    }
}

typedef struct { int M, K, N, n0; } shape_t;

int main(int argc, char **argv) {
    const int repeat = argc > 1 ? atoi(argv[1]) : 0;
#if defined(HAVE_NEON_PATH)
    const int have_path = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    if (!have_path) printf("neon_dotprod: this CPU lacks asimddp: only the reference runs\n");
#else
    const int have_path = 0;
    printf("neon_dotprod: not an aarch64 build: only the reference runs\n");
#endif
    static const int Ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64};
    static const int Ns[][2] = {{4, 0}, {5, 0}, {13, 1}, {8, 4}, {3, 0}, {16, 2}};   /* N, n0: tails and offsets */
    int failed = 0;
    for (int type = 0; type < QMM_NTYPES; type++) {
        const int bw = qmm_block_weights[type], B = qmm_act_block(type);
        const int Ks[3] = {bw, 3 * bw, bw == 32 ? 8 * bw : 2 * bw};
        long cases = 0, bad = 0, payloads = 0;
        char first[200] = "";
        for (int ki = 0; ki < 3; ki++)
            for (int mi = 0; mi < (int)(sizeof Ms / sizeof *Ms); mi++)
                for (int ni = 0; ni < (int)(sizeof Ns / sizeof *Ns); ni++)
                    for (int mode = 0; mode < 3; mode++) {
                        const int K = Ks[ki], M = Ms[mi], N = Ns[ni][0], n0 = Ns[ni][1], ldy = N + 3;
                        const size_t row = (size_t)(K / bw) * qmm_block_bytes[type];
                        uint8_t *W = malloc(row * N);
                        float *x = malloc(sizeof(float) * M * K), *d = malloc(sizeof(float) * M * K / B);
                        int8_t *q = malloc((size_t)M * K);
                        int16_t *s = malloc(sizeof(int16_t) * M * K / 16);
                        float *Yr = malloc(sizeof(float) * M * ldy), *Yp = malloc(sizeof(float) * M * ldy);
                        fill_weights(type, W, (int)(N * (K / bw)), mode);
                        fill_activations(x, M, K);
                        qmm_quantize(x, M, K, B, q, d, s);
                        const qmm_act act = {q, d, s, K, B};
                        memset(Yr, 0xa5, sizeof(float) * M * ldy);
                        memset(Yp, 0xa5, sizeof(float) * M * ldy);
                        qmm_gemm_ref(type, W, K, &act, M, Yr, ldy, n0, N);
#if defined(HAVE_NEON_PATH)
                        if (have_path) qmm_gemm_neon_dotprod(type, W, K, &act, M, Yp, ldy, n0, N);
#endif
                        if (!have_path) memcpy(Yp, Yr, sizeof(float) * M * ldy);
                        cases++;
                        int wrong = 0;
                        for (int i = 0; i < M * ldy; i++) {
                            if (!memcmp(Yr + i, Yp + i, 4)) continue;
                            if (mode == 2 && isnan(Yr[i]) && isnan(Yp[i])) {   /* NaN scales: see the header */
                                payloads++;
                                continue;
                            }
                            if (!wrong++ && !first[0]) {
                                uint32_t u, v;
                                memcpy(&u, Yr + i, 4); memcpy(&v, Yp + i, 4);
                                snprintf(first, sizeof first, "K=%d M=%d N=%d n0=%d scales=%d: Y[%d, %d] ref %08x (%g) "
                                         "path %08x (%g)", K, M, N, n0, mode, i / ldy, i % ldy, u, Yr[i], v, Yp[i]);
                            }
                        }
                        bad += wrong != 0;
                        free(W); free(x); free(d); free(q); free(s); free(Yr); free(Yp);
                    }
        printf("%s %s: %ld cases, %ld mismatched%s%s (NaN payloads apart under NaN scales: %ld)\n", type_names[type],
               bad ? "FAIL" : "OK", cases, bad, first[0] ? "; first: " : "", first, payloads);
        failed |= bad != 0;
    }
#if defined(HAVE_NEON_PATH)
    if (repeat > 0 && have_path) {        /* a sanity figure only: under emulation the time means nothing */
        const int M = 4, K = 1536, N = 256;
        for (int type = 0; type < QMM_NTYPES; type++) {
            const int bw = qmm_block_weights[type], B = qmm_act_block(type);
            const size_t row = (size_t)(K / bw) * qmm_block_bytes[type];
            uint8_t *W = malloc(row * N);
            float *x = malloc(sizeof(float) * M * K), *d = malloc(sizeof(float) * M * K / B), *Y = malloc(sizeof(float) * M * N);
            int8_t *q = malloc((size_t)M * K);
            int16_t *s = malloc(sizeof(int16_t) * M * K / 16);
            fill_weights(type, W, N * (K / bw), 0);
            for (int i = 0; i < M * K; i++) x[i] = uniform() - 0.5f;
            qmm_quantize(x, M, K, B, q, d, s);
            const qmm_act act = {q, d, s, K, B};
            double t[2];
            for (int p = 0; p < 2; p++) {
                struct timespec a, b;
                clock_gettime(CLOCK_MONOTONIC, &a);
                for (int i = 0; i < repeat; i++)
                    (p ? qmm_gemm_neon_dotprod : qmm_gemm_ref)(type, W, K, &act, M, Y, N, 0, N);
                clock_gettime(CLOCK_MONOTONIC, &b);
                t[p] = ((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6) / repeat;
            }
            printf("time %s M=%d K=%d N=%d: reference %.2f ms, neon_dotprod %.2f ms (%.1fx)\n", type_names[type], M, K,
                   N, t[0], t[1], t[0] / t[1]);
            free(W); free(x); free(d); free(Y); free(q); free(s);
        }
    }
#else
    (void)repeat;
#endif
    printf("%s\n", failed ? "FAIL" : "OK");
    return failed;
}
