/* The AVX2 path of the native attention: attn_body.h's text compiled for AVX2, float16 pools read with F16C (exact,
 * as the reference's conversion). Run only on a CPU with AVX2 (qmm_module.c checks; F16C comes with every AVX2 CPU). */
#if defined(__x86_64__)
#pragma GCC target("avx2,f16c")
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "attn.h"

/* the reference's ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) of a vector of eight lanes */
static inline float lanes(__m256 l) {
    const __m128 m = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));   /* l0+l4 .. l3+l7 */
    const __m128 t = _mm_add_ps(m, _mm_movehl_ps(m, m));                                  /* m0+m2, m1+m3 */
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/* eight values of a key or value row at element `at`, as float32 (F16C converts every float16 exactly) */
static inline __attribute__((always_inline)) __m256 key8(const void *k, long at, int f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)k + at)))
               : _mm256_loadu_ps((const float *)k + at);
}

/* lane c = `lanes` of L[c]: the same adds of the same operands, eight columns at once (pairs (c, c + 4) share a
 * register after the first add; unpack and shuffle bring each level's operands into matching lanes) */
static inline __attribute__((always_inline)) __m256 lanes8(const __m256 L[8]) {
    __m256 A[4];                                                      /* per half: l0+l4, l1+l5, l2+l6, l3+l7 */
    for (int c = 0; c < 4; c++)
        A[c] = _mm256_add_ps(_mm256_permute2f128_ps(L[c], L[c + 4], 0x20),
                             _mm256_permute2f128_ps(L[c], L[c + 4], 0x31));
    const __m256 t01 = _mm256_add_ps(_mm256_unpacklo_ps(A[0], A[1]), _mm256_unpackhi_ps(A[0], A[1]));
    const __m256 t23 = _mm256_add_ps(_mm256_unpacklo_ps(A[2], A[3]), _mm256_unpackhi_ps(A[2], A[3]));
    /* t01 per half: (l0+l4)+(l2+l6) of columns c, c+1, then (l1+l5)+(l3+l7) of both; t23 alike for c+2, c+3 */
    return _mm256_add_ps(_mm256_shuffle_ps(t01, t23, 0x44), _mm256_shuffle_ps(t01, t23, 0xee));
}

/* the run eight columns at a time (eight independent sums a head), its last n % 8 columns one at a time with up to
 * four heads' sums side by side; a block of eight masked columns is not read */
static inline __attribute__((always_inline)) void dots_of(const float *q, int G, int D, const void *k, long stride,
                                                          int n, float *s, int N, const float *m, float scale,
                                                          const int f16) {
    const __m256 vscale = _mm256_set1_ps(scale), half = _mm256_set1_ps(ATTN_NEG_HALF), ninf = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 mj = _mm256_loadu_ps(m + j), seen = _mm256_cmp_ps(mj, half, _CMP_GT_OQ);
        if (!_mm256_movemask_ps(seen)) {
            for (int g = 0; g < G; g++) _mm256_storeu_ps(s + (long)g * N + j, ninf);
            continue;
        }
        for (int g = 0; g < G; g++) {
            const float *qg = q + (long)g * D;
            __m256 L[8];
            for (int c = 0; c < 8; c++) L[c] = _mm256_setzero_ps();
            for (int d = 0; d < D; d += 8) {
                const __m256 qd = _mm256_loadu_ps(qg + d);
                for (int c = 0; c < 8; c++)
                    L[c] = _mm256_add_ps(L[c], _mm256_mul_ps(qd, key8(k, (long)(j + c) * stride + d, f16)));
            }
            /* a masked column's sum may be anything (an unwritten slot): -inf replaces it */
            _mm256_storeu_ps(s + (long)g * N + j,
                             _mm256_blendv_ps(ninf, _mm256_add_ps(_mm256_mul_ps(lanes8(L), vscale), mj), seen));
        }
    }
    for (; j < n; j++) {
        if (!(m[j] > ATTN_NEG_HALF)) {
            for (int g = 0; g < G; g++) s[(long)g * N + j] = -INFINITY;
            continue;
        }
        for (int g = 0; g < G; g += 4) {
            const int heads = G - g < 4 ? G - g : 4;
            __m256 l[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int d = 0; d < D; d += 8) {
                const __m256 kd = key8(k, (long)j * stride + d, f16);
                for (int i = 0; i < 4; i++)
                    if (i < heads)
                        l[i] = _mm256_add_ps(l[i], _mm256_mul_ps(_mm256_loadu_ps(q + (long)(g + i) * D + d), kd));
            }
            for (int i = 0; i < heads; i++) s[(long)(g + i) * N + j] = lanes(l[i]) * scale + m[j];
        }
    }
}

static inline void dots(const float *q, int G, int D, const void *k, long stride, int n, float *s, int N,
                        const float *m, float scale, int f16) {
    if (f16)
        dots_of(q, G, D, k, stride, n, s, N, m, scale, 1);
    else
        dots_of(q, G, D, k, stride, n, s, N, m, scale, 0);
}

/* HB heads' 16 (or, at D's end, 8) output values in registers over the run's columns, each value row read once for
 * the HB heads. A zero weight adds nothing, as the reference skips it: its product is masked to +0 (a sum that
 * starts at +0 never becomes -0, so adding +0 leaves its bits), which also keeps an unwritten slot's NaN out. */
static inline __attribute__((always_inline)) void values_of(float *o, const int HB, int D, const float *e, int N,
                                                            const void *v, long stride, int n, const int f16) {
    const __m256 zero = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 16) {
        const int two = D - d >= 16;
        __m256 a[4][2];
        for (int i = 0; i < HB; i++) {
            a[i][0] = _mm256_loadu_ps(o + (long)i * D + d);
            a[i][1] = two ? _mm256_loadu_ps(o + (long)i * D + d + 8) : zero;
        }
        for (int j = 0; j < n; j++) {
            const __m256 v0 = key8(v, (long)j * stride + d, f16);
            const __m256 v1 = two ? key8(v, (long)j * stride + d + 8, f16) : zero;
            for (int i = 0; i < HB; i++) {
                const __m256 w = _mm256_broadcast_ss(e + (long)i * N + j);
                const __m256 nz = _mm256_cmp_ps(w, zero, _CMP_NEQ_UQ);          /* the reference's w != 0 */
                a[i][0] = _mm256_add_ps(a[i][0], _mm256_and_ps(nz, _mm256_mul_ps(w, v0)));
                if (two) a[i][1] = _mm256_add_ps(a[i][1], _mm256_and_ps(nz, _mm256_mul_ps(w, v1)));
            }
        }
        for (int i = 0; i < HB; i++) {
            _mm256_storeu_ps(o + (long)i * D + d, a[i][0]);
            if (two) _mm256_storeu_ps(o + (long)i * D + d + 8, a[i][1]);
        }
    }
}

/* four heads at a time (a value row read once for them), the last one to three together */
static inline void values(float *o, int G, int D, const float *e, int N, const void *v, long stride, int n, int f16) {
    for (int g = 0; g < G; g += 4) {
        float *og = o + (long)g * D;
        const float *eg = e + (long)g * N;
        switch ((G - g < 4 ? G - g : 4) * 2 + !!f16) {
        case 8: values_of(og, 4, D, eg, N, v, stride, n, 0); break;
        case 9: values_of(og, 4, D, eg, N, v, stride, n, 1); break;
        case 6: values_of(og, 3, D, eg, N, v, stride, n, 0); break;
        case 7: values_of(og, 3, D, eg, N, v, stride, n, 1); break;
        case 4: values_of(og, 2, D, eg, N, v, stride, n, 0); break;
        case 5: values_of(og, 2, D, eg, N, v, stride, n, 1); break;
        case 2: values_of(og, 1, D, eg, N, v, stride, n, 0); break;
        default: values_of(og, 1, D, eg, N, v, stride, n, 1); break;
        }
    }
}

/* attn_exp (attn.h) of eight columns at a time: the same operations on each lane */
static inline void exp_row(float *s, int n, float mx) {
    const __m256 m = _mm256_set1_ps(mx), lo = _mm256_set1_ps(ATTN_EXP_MIN), round = _mm256_set1_ps(ATTN_ROUND);
    int c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + c), m);
        const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
        const __m256 n_f = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(ATTN_LOG2E)), round), round);
        const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n_f, _mm256_set1_ps(ATTN_LN2_HI))),
                                       _mm256_mul_ps(n_f, _mm256_set1_ps(ATTN_LN2_LO)));
        __m256 p = _mm256_set1_ps(ATTN_P0);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(ATTN_P1));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(ATTN_P2));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(ATTN_P3));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(ATTN_P4));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(ATTN_P5));
        p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
        /* n_f's lanes below -87/ln2 are masked out below; clamp so the exponent arithmetic stays defined */
        const __m256i n_i = _mm256_cvtps_epi32(_mm256_max_ps(n_f, _mm256_set1_ps(-126.0f)));
        const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(n_i, _mm256_set1_epi32(127)), 23);
        _mm256_storeu_ps(s + c, _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(e))));
    }
    for (; c < n; c++) s[c] = attn_exp(s[c] - mx);              /* the tail, one at a time */
}

#define ATTN_UNIT attn_unit_avx2
#define ATTN_DOTS dots
#define ATTN_VALUES values
#define ATTN_EXP_ROW exp_row
#include "attn_body.h"
#endif
