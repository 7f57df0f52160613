/* The AVX-512 VNNI path (vpdpbusd): what an Intel Xeon (Ice Lake and later) or an AMD EPYC with AVX-512 (Zen 4) runs.
 *
 * A tile is 16 output columns x up to MT rows: each column's block is loaded and decoded once for all the tile's rows;
 * each row's integer sums for the 16 columns are transposed-added into one vector whose lane c is column c, and the
 * float combine runs lane-wise in the reference's order (qmm.h), so every element's bits are the reference's. Columns
 * that do not fill a tile go to the reference itself. Ideas from ggml's published K-quant dot products (integer
 * sub-block scales, one float multiply per super-block); the code is ours.
 */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c,fma")
#include <immintrin.h>
#include "qmm.h"

#define MT 8                 /* rows a tile */

/* lane c of the result = the sum of v[c]'s 16 lanes */
static inline __m512i reduce16(const __m512i v[16]) {
    __m512i t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]), _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    /* u[i]'s 128-bit lane L now holds lane L's sums of v[4i .. 4i+3], in lanes (4i+0, 4i+2, 4i+1, 4i+3)-permuted
       order undone below by the same shuffles every time: the lane order is fixed by construction */
    __m512i x01 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
    __m512i x23 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x88), _mm512_shuffle_i32x4(u[2], u[3], 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(x01, x23, 0x88), _mm512_shuffle_i32x4(x01, x23, 0xDD));
}

/* two blocks a vector: lane c of *a = the sum of v[c]'s lanes 0..7, of *b = of its lanes 8..15 */
static inline void reduce16_halves(const __m512i v[16], __m512i *a, __m512i *b) {
    __m512i t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]), _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    /* u[i]: 128-bit lane L = lane L's sums of v[4i..4i+3]; the first block is lanes 0, 1, the second 2, 3 */
    __m512i x01 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
    __m512i x23 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x88), _mm512_shuffle_i32x4(u[2], u[3], 0xDD));
    /* x01 = [A of v0..3, B of v0..3, A of v4..7, B of v4..7] (lane order as reduce16's) */
    *a = _mm512_shuffle_i32x4(x01, x23, 0x88);
    *b = _mm512_shuffle_i32x4(x01, x23, 0xDD);
}

/* the 16 columns' 16-bit fields at byte `at` of their blocks (column c's block at base + c*stride) as floats */
static inline __m512 f16_fields(const uint8_t *base, int stride, int at) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(stride));
    __m512i g = _mm512_i32gather_epi32(idx, (const void *)(base + at), 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
}

static inline __m512 f16_high_fields(const uint8_t *base, int stride, int at) {   /* the field 2 bytes later */
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(stride));
    __m512i g = _mm512_i32gather_epi32(idx, (const void *)(base + at), 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
}

/* ---- the 32-weight types: two blocks (64 weights) a vector, natural order ---- */

static inline __m512i nibbles64(const uint8_t *qa, const uint8_t *qb) {    /* [A lo, A hi, B lo, B hi] */
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const void *)qa)),
                                           _mm_loadu_si128((const void *)qb), 1);
    __m256i lo = _mm256_and_si256(both, m4), hi = _mm256_and_si256(_mm256_srli_epi16(both, 4), m4);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);      /* [A lo, B lo, A hi, B hi] */
    return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
}

static inline __m512i codes64(int type, const uint8_t *a, const uint8_t *b, int two) {
    __m512i c;
    switch (type) {
    case QMM_Q4_0: c = nibbles64(a + 2, two ? b + 2 : a + 2); break;
    case QMM_Q4_1: c = nibbles64(a + 4, two ? b + 4 : a + 4); break;
    case QMM_Q5_0: case QMM_Q5_1: {
        const int at = type == QMM_Q5_0 ? 2 : 4;
        uint32_t ha, hb;
        memcpy(&ha, a + at, 4);
        memcpy(&hb, (two ? b : a) + at, 4);
        c = nibbles64(a + at + 4, (two ? b : a) + at + 4);
        c = _mm512_mask_add_epi8(c, (__mmask64)ha | ((__mmask64)hb << 32), c, _mm512_set1_epi8(16));
        break;
    }
    default: {                                              /* Q8_0: int8 + 128, unsigned */
        __m256i qa = _mm256_loadu_si256((const void *)(a + 2)), qb = _mm256_loadu_si256((const void *)((two ? b : a) + 2));
        c = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1), _mm512_set1_epi8((char)0x80));
    }
    }
    return two ? c : _mm512_maskz_mov_epi8(0xFFFFFFFFull, c);
}

static void tile_small(int type, const uint8_t *W, size_t row, int K, const qmm_act *x, int M, float *Y, int ldy,
                       int n) {
    const int nb = K / 32, bb = qmm_block_bytes[type];
    const int z = type == QMM_Q4_0 ? 8 : type == QMM_Q5_0 ? 16 : type == QMM_Q8_0 ? 128 : 0;   /* code of weight 0 */
    const int with_m = type == QMM_Q4_1 || type == QMM_Q5_1;
    const uint8_t *col0 = W + (size_t)n * row;
    __m512 acc[MT];
    __m512i t[MT][16];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        for (int c = 0; c < 16; c++) {
            const uint8_t *blk = col0 + (size_t)c * row + (size_t)b * bb;
            __m512i codes = codes64(type, blk, blk + bb, two);
            for (int m = 0; m < M; m++) {
                const int8_t *q = x->q + (size_t)m * K + 32 * b;
                __m512i xv = two ? _mm512_loadu_si512((const void *)q) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, q);
                t[m][c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xv);
            }
        }
        for (int half = 0; half < 1 + two; half++) {
            const uint8_t *base = col0 + (size_t)(b + half) * bb;
            const __m512 D = f16_fields(base, (int)row, 0);
            const __m512 Mv = with_m ? f16_high_fields(base, (int)row, 0) : _mm512_setzero_ps();
            for (int m = 0; m < M; m++) {
                __m512i dots, other;
                if (half == 0) reduce16_halves(t[m], &dots, &other);
                else reduce16_halves(t[m], &other, &dots);
                const int16_t *s = x->s + (size_t)m * (K / 16) + 2 * (b + half);
                const int sx = s[0] + s[1];
                const __m512 dx = _mm512_set1_ps(x->d[(size_t)m * nb + b + half]);
                if (with_m) {                 /* acc += (dx*d) * (float)dot + (dx*m) * (float)sx */
                    __m512 t1 = _mm512_mul_ps(_mm512_mul_ps(dx, D), _mm512_cvtepi32_ps(dots));
                    __m512 t2 = _mm512_mul_ps(_mm512_mul_ps(dx, Mv), _mm512_set1_ps((float)sx));
                    acc[m] = _mm512_add_ps(acc[m], _mm512_add_ps(t1, t2));
                } else {                      /* acc += (dx*d) * (float)(dot - z*sx) */
                    __m512i i = _mm512_sub_epi32(dots, _mm512_set1_epi32(z * sx));
                    acc[m] = _mm512_add_ps(acc[m], _mm512_mul_ps(_mm512_mul_ps(dx, D), _mm512_cvtepi32_ps(i)));
                }
            }
        }
    }
    for (int m = 0; m < M; m++) _mm512_storeu_ps(Y + (size_t)m * ldy + n, acc[m]);
}

/* ---- the K-quants: one super-block (256 weights) a step ---- */

/* int16 lane i of a packs_epi32(A, B) result, per 128-bit lane L: A's lanes 4L..4L+3 then B's: the scale index of
   A's and B's sub-blocks in that lane (Q4_K/Q5_K: A = sub-blocks (0|2) by halves, B = (1|3); +4 for the second pair) */
static inline __m512i k4_scale_index(int second) {
    int16_t idx[32];
    for (int L = 0; L < 4; L++)
        for (int e = 0; e < 8; e++) idx[8 * L + e] = (int16_t)((L < 2 ? 0 : 2) + (e < 4 ? 0 : 1) + 4 * second);
    return _mm512_loadu_si512(idx);
}

static inline __m512i q6_scale_index(int h) {     /* Q6_K half h: A = 16-blocks 8h+L, B = 8h+4+L */
    int16_t idx[32];
    for (int L = 0; L < 4; L++)
        for (int e = 0; e < 8; e++) idx[8 * L + e] = (int16_t)(8 * h + L + (e < 4 ? 0 : 4));
    return _mm512_loadu_si512(idx);
}

static void tile_k(int type, const uint8_t *W, size_t row, int K, const qmm_act *x, int M, float *Y, int ldy, int n) {
    const int nb = K / 256, bb = qmm_block_bytes[type];
    const uint8_t *col0 = W + (size_t)n * row;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x03);
    const __m512i P0 = k4_scale_index(0), P1 = k4_scale_index(1), Q0 = q6_scale_index(0), Q1 = q6_scale_index(1);
    __m512 acc[MT];
    __m512i is[MT][16], ms[MT][16];
    int8_t xr[MT][256] __attribute__((aligned(64)));      /* Q4_K/Q5_K: the activations in the nibbles' order */
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        if (type != QMM_Q6_K)
            for (int m = 0; m < M; m++) {
                const int8_t *q = x->q + (size_t)m * K + 256 * b;
                /* l0 = [0..31 | 64..95], h0 = [32..63 | 96..127], l1 = [128..159 | 192..223], h1 = [160.. | 224..] */
                static const int src[8] = {0, 64, 32, 96, 128, 192, 160, 224};
                for (int i = 0; i < 8; i++) memcpy(xr[m] + 32 * i, q + src[i], 32);
            }
        for (int c = 0; c < 16; c++) {
            const uint8_t *blk = col0 + (size_t)c * row + (size_t)b * bb;
            if (type == QMM_Q6_K) {
                const blk_q6_k *w = (const blk_q6_k *)blk;
                __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)w->scales));
                __m512i sc16 = _mm512_castsi256_si512(sc);
                __m512i S[2] = {_mm512_permutexvar_epi16(Q0, sc16), _mm512_permutexvar_epi16(Q1, sc16)};
                __m512i lo[2], hi[2];
                for (int h = 0; h < 2; h++) {
                    __m512i ql = _mm512_loadu_si512((const void *)(w->ql + 64 * h));
                    __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)(w->qh + 32 * h)));
                    const __m512i sh_lo = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
                    const __m512i sh_hi = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
                    lo[h] = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_lo), m2), 4));
                    hi[h] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m2), 4));
                }
                for (int m = 0; m < M; m++) {
                    const int8_t *q = x->q + (size_t)m * K + 256 * b;
                    __m512i v = _mm512_setzero_si512();
                    for (int h = 0; h < 2; h++) {
                        __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[h], _mm512_loadu_si512((const void *)(q + 128 * h)));
                        __m512i e = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[h], _mm512_loadu_si512((const void *)(q + 128 * h + 64)));
                        v = _mm512_add_epi32(v, _mm512_madd_epi16(_mm512_packs_epi32(a, e), S[h]));
                    }
                    /* - 32 * sum_j sc_j * sx_j (the codes' zero point, 32) */
                    __m256i sx = _mm256_loadu_si256((const void *)(x->s + (size_t)m * (K / 16) + 16 * b));
                    __m256i zsum = _mm256_madd_epi16(sc, sx);
                    is[m][c] = _mm512_sub_epi32(v, _mm512_slli_epi32(_mm512_zextsi256_si512(zsum), 5));
                }
                continue;
            }
            const blk_q4_k *w = (const blk_q4_k *)blk;       /* d, dmin, scales sit alike in Q5_K */
            const uint8_t *qs = type == QMM_Q4_K ? w->qs : ((const blk_q5_k *)blk)->qs;
            uint8_t sc[8], mn[8];
            qmm_k4_scales(w->scales, sc, mn);
            __m512i sc16 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_loadl_epi64((const void *)sc)));
            __m512i S0 = _mm512_permutexvar_epi16(P0, sc16), S1 = _mm512_permutexvar_epi16(P1, sc16);
            __m128i mn16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const void *)mn));
            __m512i q0 = _mm512_loadu_si512((const void *)qs), q1 = _mm512_loadu_si512((const void *)(qs + 64));
            __m512i v[4] = {_mm512_and_si512(q0, m4), _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4),
                            _mm512_and_si512(q1, m4), _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4)};
            if (type == QMM_Q5_K) {              /* vector i holds sub-blocks s | s+2: their bits in qh[0..31] */
                __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)((const blk_q5_k *)blk)->qh));
                static const int first[4] = {0, 1, 4, 5};
                for (int i = 0; i < 4; i++) {
                    __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << first[i])),
                                                     _mm256_set1_epi8((char)(1 << (first[i] + 2))), 1);
                    __mmask64 k = _mm512_test_epi8_mask(qh, bit);
                    v[i] = _mm512_mask_add_epi8(v[i], k, v[i], _mm512_set1_epi8(16));
                }
            }
            for (int m = 0; m < M; m++) {
                const int8_t *xm = xr[m];
                __m512i t0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[0], _mm512_load_si512((const void *)xm));
                __m512i t1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[1], _mm512_load_si512((const void *)(xm + 64)));
                __m512i t2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[2], _mm512_load_si512((const void *)(xm + 128)));
                __m512i t3 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[3], _mm512_load_si512((const void *)(xm + 192)));
                is[m][c] = _mm512_add_epi32(_mm512_madd_epi16(_mm512_packs_epi32(t0, t1), S0),
                                            _mm512_madd_epi16(_mm512_packs_epi32(t2, t3), S1));
                const int16_t *s = x->s + (size_t)m * (K / 16) + 16 * b;
                __m128i s0 = _mm_loadu_si128((const void *)s), s1 = _mm_loadu_si128((const void *)(s + 8));
                __m128i sx32 = _mm_packs_epi32(_mm_madd_epi16(s0, _mm_set1_epi16(1)), _mm_madd_epi16(s1, _mm_set1_epi16(1)));
                ms[m][c] = _mm512_zextsi128_si512(_mm_madd_epi16(mn16, sx32));
            }
        }
        const uint8_t *base = col0 + (size_t)b * bb;
        if (type == QMM_Q6_K) {
            const __m512 D = f16_fields(base, (int)row, 208);
            for (int m = 0; m < M; m++) {               /* acc += (dx*d) * (float)isum */
                const __m512 dx = _mm512_set1_ps(x->d[(size_t)m * nb + b]);
                acc[m] = _mm512_add_ps(acc[m], _mm512_mul_ps(_mm512_mul_ps(dx, D), _mm512_cvtepi32_ps(reduce16(is[m]))));
            }
        } else {
            const __m512 D = f16_fields(base, (int)row, 0), DM = f16_high_fields(base, (int)row, 0);
            for (int m = 0; m < M; m++) {               /* acc += (dx*d) * (float)isum - (dx*dmin) * (float)msum */
                const __m512 dx = _mm512_set1_ps(x->d[(size_t)m * nb + b]);
                __m512 a = _mm512_mul_ps(_mm512_mul_ps(dx, D), _mm512_cvtepi32_ps(reduce16(is[m])));
                __m512 e = _mm512_mul_ps(_mm512_mul_ps(dx, DM), _mm512_cvtepi32_ps(reduce16(ms[m])));
                acc[m] = _mm512_add_ps(acc[m], _mm512_sub_ps(a, e));
            }
        }
    }
    for (int m = 0; m < M; m++) _mm512_storeu_ps(Y + (size_t)m * ldy + n, acc[m]);
}

void qmm_gemm_avx512_vnni(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0,
                          int n1) {
    const size_t row = (size_t)(K / qmm_block_weights[type]) * qmm_block_bytes[type];
    const int full = n0 + (n1 - n0) / 16 * 16;
    for (int m0 = 0; m0 < M; m0 += MT) {
        const int mt = M - m0 < MT ? M - m0 : MT;
        const qmm_act xt = {x->q + (size_t)m0 * K, x->d + (size_t)m0 * (K / x->B), x->s + (size_t)m0 * (K / 16), K, x->B};
        for (int n = n0; n < full; n += 16) {
            if (type >= QMM_Q4_K) tile_k(type, W, row, K, &xt, mt, Y + (size_t)m0 * ldy, ldy, n);
            else tile_small(type, W, row, K, &xt, mt, Y + (size_t)m0 * ldy, ldy, n);
        }
    }
    if (full < n1) qmm_gemm_ref(type, W, K, x, M, Y, ldy, full, n1);
}
#endif
