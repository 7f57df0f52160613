/* The AVX2 path: qmm_gemm_ref's bits (qmm.h's order of operations), eight output columns at a time.
 *
 * Owns the AVX2 kernels for all eight types; run only on a CPU with AVX2 (qmm_module.c checks; F16C comes with every
 * AVX2 CPU). Never uses a fused multiply-add, never picks anything by the number of rows, never reorders a float op.
 *
 * Shape: a tile is 8 output columns (weight rows) x up to TILE_ROWS activation rows. Each weight block of the 8
 * columns is loaded and decoded once for all rows of the tile (rows past the tile loop over the weights again, from
 * cache); per row and column the block's integer dot product is built in 8 int32 lanes, and the 8 columns' vectors
 * are reduced by a transpose-add into one vector whose lane c is column c. The float combine is then qmm.h's, lane by
 * lane: lane c computes exactly what the reference computes for column c, in the same order.
 *
 * Exactness of the integers (any order is exact while nothing saturates or overflows):
 *  - _mm256_maddubs_epi16 (unsigned x signed bytes, SATURATING int16 pair sums): the codes of Q4_*, Q5_*, Q4_K, Q5_K
 *    and Q6_K are <= 63 against |q| <= 127: a pair is <= 2*63*127 = 16002 < 32767. Q8_0's codes are signed: its dot
 *    is maddubs(|w|, q*sign(w)), |w| <= 128: a pair is <= 2*128*127 = 32512 < 32767.
 *  - the K-quants' sub-block scales are applied in integers by _mm256_madd_epi16 (int16 pair sums x int16 scales,
 *    int32), one float combine per 256-weight super-block, as in the reference; every int32 stays below 2^31 (qmm.h's
 *    bounds: |isum| < 2^27).
 * The idea of applying 6-bit scales with madd after maddubs, and Q8_0's sign trick, are ggml's (ggml-quants.c).
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include "qmm.h"

#define TILE_ROWS 4
#define ALWAYS static inline __attribute__((always_inline))

/* lane c of the result = the sum of v[c]'s eight int32 lanes */
ALWAYS __m256i sum8(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    /* a's low half: v0..v3's low-half sums, its high half their high-half sums; b alike for v4..v7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* the 8 columns' float16 at byte `off` of their rows, exactly as float32 (F16C converts every float16 exactly) */
ALWAYS __m256 f16x8(const uint8_t *const w[8], size_t off) {
    uint16_t h[8];
    for (int c = 0; c < 8; c++) memcpy(&h[c], w[c] + off, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

ALWAYS __m256i load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 bytes of nibbles -> 32 codes in weight order: the low nibbles, then the high ones */
ALWAYS __m256i nibbles(const uint8_t *qs) {
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(15));
}

/* Q5_0/Q5_1's qh (bit j: weight j's fifth bit) -> 16 in byte j where the bit is set */
ALWAYS __m256i fifth_bits(const uint8_t *qh) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(16));
}

/* ---- the 32-weight types: acc += (dx*d) * (float)(dot - z*sx), or (dx*d)*(float)dot + (dx*m)*(float)sx ---- */

ALWAYS void tile32(const int type, const uint8_t *const w[8], int nb, const qmm_act *x, int m0, const int R, float *Y,
                   int ldy, int n) {
    const int K = x->K, bb = qmm_block_bytes[type];
    const int z = type == QMM_Q4_0 ? 8 : type == QMM_Q5_0 ? 16 : 0;
    const int with_min = type == QMM_Q4_1 || type == QMM_Q5_1;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TILE_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t off = (size_t)b * bb;
        __m256i part[TILE_ROWS][8];
        for (int c = 0; c < 8; c++) {
            const uint8_t *blk = w[c] + off;
            __m256i v;
            switch (type) {
            case QMM_Q4_0: v = nibbles(blk + 2); break;
            case QMM_Q4_1: v = nibbles(blk + 4); break;
            case QMM_Q5_0: v = _mm256_or_si256(nibbles(blk + 6), fifth_bits(blk + 2)); break;
            case QMM_Q5_1: v = _mm256_or_si256(nibbles(blk + 8), fifth_bits(blk + 4)); break;
            default: v = load(blk + 2); break;                                     /* Q8_0: signed codes */
            }
            if (type == QMM_Q8_0) {
                const __m256i a = _mm256_sign_epi8(v, v);                          /* |w|, 128 read unsigned */
                for (int r = 0; r < R; r++) {
                    const __m256i q = load(x->q + (size_t)(m0 + r) * K + 32 * b);
                    part[r][c] = _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(q, v)), ones);
                }
            } else {
                for (int r = 0; r < R; r++) {
                    const __m256i q = load(x->q + (size_t)(m0 + r) * K + 32 * b);
                    part[r][c] = _mm256_madd_epi16(_mm256_maddubs_epi16(v, q), ones);
                }
            }
        }
        const __m256 dw = f16x8(w, off);
        const __m256 mw = with_min ? f16x8(w, off + 2) : dw;
        for (int r = 0; r < R; r++) {
            const __m256i dot = sum8(part[r]);
            const int16_t *s = x->s + (size_t)(m0 + r) * (K / 16) + 2 * b;
            const int sx = s[0] + s[1];
            const __m256 dx = _mm256_set1_ps(x->d[(size_t)(m0 + r) * (K / 32) + b]);
            if (with_min)
                acc[r] = _mm256_add_ps(acc[r], _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(dx, dw), _mm256_cvtepi32_ps(dot)),
                                                             _mm256_mul_ps(_mm256_mul_ps(dx, mw),
                                                                           _mm256_set1_ps((float)sx))));
            else
                acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_mul_ps(dx, dw),
                                                             _mm256_cvtepi32_ps(_mm256_sub_epi32(
                                                                 dot, _mm256_set1_epi32(z * sx)))));
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(Y + (size_t)(m0 + r) * ldy + n, acc[r]);
}

/* ---- the K-quants, one float combine per 256 weights ----
 * Q4_K, Q5_K: acc += (dx*d) * (float)(sum_j sc_j*dot_j) - (dx*dmin) * (float)(sum_j m_j*sx_j)
 * Q6_K:       acc += (dx*d) * (float)(sum_j sc_j*(dot_j - 32*sx_j)) */

ALWAYS void tile256(const int type, const uint8_t *const w[8], int nb, const qmm_act *x, int m0, const int R,
                    float *Y, int ldy, int n) {
    const int K = x->K, bb = qmm_block_bytes[type];
    const __m256i low4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16), b45 = _mm256_set1_epi8(0x30);
    __m256 acc[TILE_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t off = (size_t)b * bb;
        __m256i pi[TILE_ROWS][8], pm[TILE_ROWS][8];
        for (int c = 0; c < 8; c++) {
            const uint8_t *blk = w[c] + off;
            __m256i a[TILE_ROWS];
            for (int r = 0; r < R; r++) a[r] = _mm256_setzero_si256();
            if (type == QMM_Q6_K) {
                const blk_q6_k *b6 = (const blk_q6_k *)blk;
                const __m128i sc = _mm_loadu_si128((const __m128i *)b6->scales);
                for (int h = 0; h < 2; h++) {
                    const __m256i l0 = load(b6->ql + 64 * h), l1 = load(b6->ql + 64 * h + 32), hb = load(b6->qh + 32 * h);
                    const __m256i v[4] = {
                        _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), b45)),
                        _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), b45)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(hb, b45)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                        _mm256_and_si256(_mm256_srli_epi16(hb, 2), b45))};
                    for (int k = 0; k < 4; k++) {
                        const int g = 4 * h + k;      /* weights 32g..32g+31: sub-blocks 2g (low lane), 2g+1 (high) */
                        const __m256i S = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                            sc, _mm_set_epi64x((long long)(0x0101010101010101ull * (2 * g + 1)),
                                               (long long)(0x0101010101010101ull * (2 * g)))));
                        for (int r = 0; r < R; r++) {
                            const __m256i q = load(x->q + (size_t)(m0 + r) * K + 256 * b + 32 * g);
                            a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(_mm256_maddubs_epi16(v[k], q), S));
                        }
                    }
                }
                const __m256i sc16 = _mm256_cvtepi8_epi16(sc);
                for (int r = 0; r < R; r++) {
                    const __m256i s = load(x->s + (size_t)(m0 + r) * (K / 16) + 16 * b);
                    pi[r][c] = _mm256_sub_epi32(a[r], _mm256_slli_epi32(_mm256_madd_epi16(s, sc16), 5));
                }
            } else {
                const blk_q4_k *k4 = (const blk_q4_k *)blk;             /* d, dmin, scales sit alike in Q5_K */
                const uint8_t *qs = type == QMM_Q4_K ? k4->qs : ((const blk_q5_k *)blk)->qs;
                uint8_t scb[16], mnb[16];
                qmm_k4_scales(k4->scales, scb, mnb);
                const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)scb)));
                __m256i qh = type == QMM_Q5_K ? load(((const blk_q5_k *)blk)->qh) : _mm256_setzero_si256();
                for (int j = 0; j < 4; j++) {
                    const __m256i xq = load(qs + 32 * j);
                    __m256i lo = _mm256_and_si256(xq, low4), hi = _mm256_and_si256(_mm256_srli_epi16(xq, 4), low4);
                    if (type == QMM_Q5_K) {   /* qh shifted right by 2j: bit 0 is sub-block 2j's, bit 1 2j+1's */
                        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh, 4), b4));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(qh, 3), b4));
                        qh = _mm256_srli_epi16(qh, 2);
                    }
                    const __m256i s0 = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((short)((4 * j + 1) << 8 | 4 * j)));
                    const __m256i s1 = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((short)((4 * j + 3) << 8 | (4 * j + 2))));
                    for (int r = 0; r < R; r++) {
                        const int8_t *q = x->q + (size_t)(m0 + r) * K + 256 * b + 64 * j;
                        a[r] = _mm256_add_epi32(a[r], _mm256_add_epi32(
                                                          _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load(q)), s0),
                                                          _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load(q + 32)), s1)));
                    }
                }
                /* (m0, m0, m1, m1, ..., m7, m7) against the row's sixteen sums of 16: m_j * sx_j in int32 lane j */
                const __m256i mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
                    _mm_loadl_epi64((const __m128i *)mnb), _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
                for (int r = 0; r < R; r++) {
                    pi[r][c] = a[r];
                    pm[r][c] = _mm256_madd_epi16(load(x->s + (size_t)(m0 + r) * (K / 16) + 16 * b), mins);
                }
            }
        }
        const __m256 d = f16x8(w, off + (type == QMM_Q6_K ? 208 : 0));
        const __m256 dmin = type == QMM_Q6_K ? d : f16x8(w, off + 2);
        for (int r = 0; r < R; r++) {
            const __m256 dx = _mm256_set1_ps(x->d[(size_t)(m0 + r) * (K / 256) + b]);
            const __m256 main = _mm256_mul_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sum8(pi[r])));
            if (type == QMM_Q6_K)
                acc[r] = _mm256_add_ps(acc[r], main);
            else
                acc[r] = _mm256_add_ps(acc[r], _mm256_sub_ps(main, _mm256_mul_ps(_mm256_mul_ps(dx, dmin),
                                                                                 _mm256_cvtepi32_ps(sum8(pm[r])))));
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(Y + (size_t)(m0 + r) * ldy + n, acc[r]);
}

/* one tile, the type and row count made constants so each (type, rows) pair is its own unrolled kernel */
#define ROWS(fn, T)                                                                                                   \
    switch (R) {                                                                                                      \
    case 1: fn(T, w, nb, x, m0, 1, Y, ldy, n); break;                                                                 \
    case 2: fn(T, w, nb, x, m0, 2, Y, ldy, n); break;                                                                 \
    case 3: fn(T, w, nb, x, m0, 3, Y, ldy, n); break;                                                                 \
    default: fn(T, w, nb, x, m0, 4, Y, ldy, n); break;                                                                \
    }

static void tile(int type, const uint8_t *const w[8], int nb, const qmm_act *x, int m0, int R, float *Y, int ldy,
                 int n) {
    switch (type) {
    case QMM_Q4_0: ROWS(tile32, QMM_Q4_0); break;
    case QMM_Q4_1: ROWS(tile32, QMM_Q4_1); break;
    case QMM_Q5_0: ROWS(tile32, QMM_Q5_0); break;
    case QMM_Q5_1: ROWS(tile32, QMM_Q5_1); break;
    case QMM_Q8_0: ROWS(tile32, QMM_Q8_0); break;
    case QMM_Q4_K: ROWS(tile256, QMM_Q4_K); break;
    case QMM_Q5_K: ROWS(tile256, QMM_Q5_K); break;
    case QMM_Q6_K: ROWS(tile256, QMM_Q6_K); break;
    }
}

void qmm_gemm_avx2(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0, int n1) {
    const int nb = K / qmm_block_weights[type];
    const size_t row = (size_t)nb * qmm_block_bytes[type];
    const int n8 = n0 + (n1 - n0) / 8 * 8;
    for (int n = n0; n < n8; n += 8) {
        const uint8_t *w[8];
        for (int c = 0; c < 8; c++) w[c] = W + (size_t)(n + c) * row;
        for (int m0 = 0; m0 < M; m0 += TILE_ROWS) tile(type, w, nb, x, m0, M - m0 < TILE_ROWS ? M - m0 : TILE_ROWS, Y, ldy, n);
    }
    if (n8 < n1) qmm_gemm_ref(type, W, K, x, M, Y, ldy, n8, n1);      /* the columns that do not fill a tile */
}
#endif
