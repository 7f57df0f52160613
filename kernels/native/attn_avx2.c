/* The AVX2 path of the native attention: attn_body.h's text compiled for AVX2, float16 pools read with F16C (exact,
 * as the reference's conversion). Run only on a CPU with AVX2 (qmm_module.c checks; F16C comes with every AVX2 CPU). */
#if defined(__x86_64__)
#pragma GCC target("avx2,f16c")
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "attn.h"

static inline void f16_row(float *y, const uint16_t *x, int D) {      /* D: a multiple of 8 (kernels/attention.py) */
    for (int d = 0; d < D; d += 8)
        _mm256_storeu_ps(y + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + d))));
}

/* the reference's ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) of a vector of eight lanes */
static inline float lanes(__m256 l) {
    const __m128 m = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));   /* l0+l4 .. l3+l7 */
    const __m128 t = _mm_add_ps(m, _mm_movehl_ps(m, m));                                  /* m0+m2, m1+m3 */
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/* n (1..4) query heads against one key at once: independent sums, so the adds' latency overlaps */
static inline __attribute__((always_inline)) void dots_n(const float *q, int n, int D, const float *k, float *s, int N,
                                                          float scale, float m) {
    __m256 l[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int d = 0; d < D; d += 8) {
        const __m256 kd = _mm256_loadu_ps(k + d);
        for (int j = 0; j < n; j++) l[j] = _mm256_add_ps(l[j], _mm256_mul_ps(_mm256_loadu_ps(q + (long)j * D + d), kd));
    }
    for (int j = 0; j < n; j++) s[(long)j * N] = lanes(l[j]) * scale + m;
}

static inline void dots(const float *q, int G, int D, const float *k, float *s, int N, float scale, float m) {
    int g = 0;
    for (; g + 4 <= G; g += 4) dots_n(q + (long)g * D, 4, D, k, s + (long)g * N, N, scale, m);
    switch (G - g) {
    case 3: dots_n(q + (long)g * D, 3, D, k, s + (long)g * N, N, scale, m); break;
    case 2: dots_n(q + (long)g * D, 2, D, k, s + (long)g * N, N, scale, m); break;
    case 1: dots_n(q + (long)g * D, 1, D, k, s + (long)g * N, N, scale, m); break;
    }
}

/* a[i] += w * v[i] for the four registers of 32 values, when w != 0 (the reference skips a zero weight) */
static inline __attribute__((always_inline)) void add4(__m256 a[4], float w, const __m256 v[4]) {
    if (w == 0.0f) return;
    const __m256 wv = _mm256_set1_ps(w);
    for (int i = 0; i < 4; i++) a[i] = _mm256_add_ps(a[i], _mm256_mul_ps(wv, v[i]));
}

static inline __attribute__((always_inline)) void load4(__m256 a[4], const float *p) {
    for (int i = 0; i < 4; i++) a[i] = _mm256_loadu_ps(p + 8 * i);
}

static inline __attribute__((always_inline)) void store4(float *p, const __m256 a[4]) {
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(p + 8 * i, a[i]);
}

/* 32 output values of two heads in eight registers over the block's columns (a value row loaded once for both:
 * eight independent sums hide the adds' latency), then the next 32; an odd head in four registers; D past a multiple
 * of 32, eight at a time */
static inline void values(float *o, int G, int D, const float *e, int N, const float *const *v, int n) {
    int g = 0;
    for (; g + 2 <= G && D % 32 == 0; g += 2, o += 2 * D, e += 2 * N)
        for (int d = 0; d < D; d += 32) {
            __m256 a[4], b[4], vj[4];
            load4(a, o + d);
            load4(b, o + D + d);
            for (int j = 0; j < n; j++) {
                load4(vj, v[j] + d);
                add4(a, e[j], vj);
                add4(b, e[N + j], vj);
            }
            store4(o + d, a);
            store4(o + D + d, b);
        }
    for (; g < G; g++, o += D, e += N) {
        int d = 0;
        for (; d + 32 <= D; d += 32) {
            __m256 a[4], vj[4];
            load4(a, o + d);
            for (int j = 0; j < n; j++) {
                if (e[j] == 0.0f) continue;
                load4(vj, v[j] + d);
                add4(a, e[j], vj);
            }
            store4(o + d, a);
        }
        for (; d < D; d += 8) {
            __m256 acc = _mm256_loadu_ps(o + d);
            for (int j = 0; j < n; j++)
                if (e[j] != 0.0f)
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(e[j]), _mm256_loadu_ps(v[j] + d)));
            _mm256_storeu_ps(o + d, acc);
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
#define ATTN_F16_ROW f16_row
#define ATTN_DOTS dots
#define ATTN_VALUES values
#define ATTN_EXP_ROW exp_row
#include "attn_body.h"
#endif
