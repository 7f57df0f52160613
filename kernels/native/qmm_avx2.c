/* The AVX2 path: qmm_gemm_ref's bits (qmm.h's order of operations), eight output columns at a time.
 *
 * Owns the AVX2 kernels for all eight types; run only on a CPU with AVX2 (qmm_module.c checks; F16C comes with every
 * AVX2 CPU). Never uses a fused multiply-add, never picks anything by the number of rows, never reorders a float op.
 *
 * Shape: a tile is 8 output columns (weight rows) x up to TILE_ROWS activation rows. Each weight block of the 8
 * columns is loaded and decoded once for all rows of the tile (rows past the tile loop over the weights again, from
 * cache), and each row's integer dot products end in one vector whose lane c is column c:
 *  - 32-weight types, Q4_K, Q5_K: the 8 columns' blocks are transposed by dwords at decode, so lane c holds 4 codes
 *    of column c and a row's 4 matching activation bytes are broadcast: no reduction at all; the K-quants' 6-bit
 *    scales and mins are decoded lane-wise from the transposed bytes and applied by madd;
 *  - Q6_K: per column, 8 int32 lanes over the super-block, sub-block scales applied by madd; the 8 columns' vectors
 *    are reduced once a super-block by a transpose-add (sum8).
 * The float combine is then qmm.h's, lane by lane: lane c computes exactly what the reference computes for column c,
 * in the same order.
 *
 * Exactness of the integers (any order is exact while nothing saturates or overflows):
 *  - _mm256_maddubs_epi16 (unsigned x signed bytes, SATURATING int16 pair sums): the codes of Q4_*, Q5_*, Q4_K, Q5_K
 *    and Q6_K are <= 63 against |q| <= 127: a pair is <= 2*63*127 = 16002 < 32767. Q8_0's codes are signed: its dot
 *    is maddubs(|w|, q*sign(w)), |w| <= 128: a pair is <= 2*128*127 = 32512 < 32767.
 *  - int16 sums of maddubs outputs are bounded where they are made: codes <= 15 allow 8 pair sums (30480), codes
 *    <= 31 four (31496); Q8_0's and Q6_K's pairs go to int32 at once.
 *  - the K-quants' sub-block scales are applied in integers by _mm256_madd_epi16 (int16 pair sums x int16 scales,
 *    int32), one float combine per 256-weight super-block, as in the reference; every int32 stays below 2^31 (qmm.h's
 *    bounds: |isum| < 2^27).
 * The idea of applying 6-bit scales with madd after maddubs, and Q8_0's sign trick, are ggml's (ggml-quants.c).
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include "qmm.h"

#define TILE_ROWS 8
#define ALWAYS static inline __attribute__((always_inline))

/* lane c of the result = the sum of v[c]'s eight int32 lanes */
ALWAYS __m256i sum8(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    /* a's low half: v0..v3's low-half sums, its high half their high-half sums; b alike for v4..v7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* the 8 columns' float16 at byte `off` of their rows, exactly as float32 (F16C converts every float16 exactly) */
ALWAYS short f16at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return (short)h;
}

ALWAYS __m256 f16x8(const uint8_t *const w[8], size_t off) {      /* built in a register: no store to forward */
    return _mm256_cvtph_ps(_mm_setr_epi16(f16at(w[0] + off), f16at(w[1] + off), f16at(w[2] + off), f16at(w[3] + off),
                                          f16at(w[4] + off), f16at(w[5] + off), f16at(w[6] + off), f16at(w[7] + off)));
}

/* The next tile's 8 rows are the next 8 * row bytes: each column stream fetches the same offset there (ahead), so
 * short rows (8960 x 1536: 13 lines a row) still reach the core from a prefetched line (ahead = 0: the last tile, or
 * a tile's later rows, which read from cache). */
ALWAYS void prefetch_next(const uint8_t *const w[8], size_t ahead, size_t off, int bb) {
    if (!ahead) return;
    for (int c = 0; c < 8; c++)
        for (int l = 0; l < bb; l += 64) _mm_prefetch((const char *)(w[c] + ahead + off + l), _MM_HINT_T0);
}

ALWAYS __m256i load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ---- the 32-weight types: acc += (dx*d) * (float)(dot - z*sx), or (dx*d)*(float)dot + (dx*m)*(float)sx ----
 * Lanes are columns from the start, so no reduction is needed: the 8 columns' 16-byte runs at `at` are transposed by
 * dwords, giving v[k] whose lane c holds column c's bytes 4k..4k+3 (v[k] for k < 4 from the block's first 16 bytes
 * at `at`, k >= 4 from `at + 16`, Q8_0 only). A row's 4 activation bytes of the same weights are broadcast to every
 * lane, so maddubs + madd sums column c's products in lane c. */

ALWAYS void transpose4(const uint8_t *const w[8], size_t at, __m256i v[4]) {
    __m256i r[4];
    for (int c = 0; c < 4; c++)            /* low half column c, high half column c + 4 */
        r[c] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w[c] + at))),
                                       _mm_loadu_si128((const __m128i *)(w[c + 4] + at)), 1);
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpacklo_epi32(r[2], r[3]);
    const __m256i t2 = _mm256_unpackhi_epi32(r[0], r[1]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    v[0] = _mm256_unpacklo_epi64(t0, t1);
    v[1] = _mm256_unpackhi_epi64(t0, t1);
    v[2] = _mm256_unpacklo_epi64(t2, t3);
    v[3] = _mm256_unpackhi_epi64(t2, t3);
}

ALWAYS int rd32(const uint8_t *p) {
    int v;
    memcpy(&v, p, 4);
    return v;
}

/* Q5_0/Q5_1: the fifth bits (qh: bit j is weight j's) of weights 4k..4k+3 in lane c's bytes, as 16 or 0; h: lane c
 * holds column c's qh */
ALWAYS __m256i fifth_bits(__m256i h, int k) {
    const int byte = k >> 1;                                        /* bits 4k..4k+3 sit in qh's byte k/2 */
    const __m256i spread = _mm256_set1_epi32(0x01010101 * byte);
    const __m256i at = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404, 0x08080808, 0x0c0c0c0c);
    const __m256i bit = _mm256_set1_epi32((int)(0x08040201u << (4 * (k & 1))));
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(h, _mm256_add_epi8(at, spread)), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(16));
}

ALWAYS __m256i bcast4(const int8_t *q) { return _mm256_set1_epi32(rd32((const uint8_t *)q)); }

ALWAYS void tile32(const int type, const uint8_t *const w[8], int nb, const qmm_act *x, int m0, const int R, float *Y,
                   int ldy, int n, size_t ahead) {
    const int K = x->K, bb = qmm_block_bytes[type];
    const int z = type == QMM_Q4_0 ? 8 : type == QMM_Q5_0 ? 16 : 0;
    const int with_min = type == QMM_Q4_1 || type == QMM_Q5_1;
    const int qs_at = type == QMM_Q4_0 ? 2 : type == QMM_Q4_1 ? 4 : type == QMM_Q5_0 ? 6 : type == QMM_Q5_1 ? 8 : 2;
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(15);
    __m256 acc[TILE_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t off = (size_t)b * bb;
        prefetch_next(w, ahead, off, bb);
        __m256i v[8];                /* v[k]: weights 4k..4k+3 of each column (lane), k = 0..7 */
        if (type == QMM_Q8_0) {
            transpose4(w, off + 2, v);
            transpose4(w, off + 18, v + 4);
        } else {
            __m256i t[4];
            transpose4(w, off + qs_at, t);
            for (int k = 0; k < 4; k++) {
                v[k] = _mm256_and_si256(t[k], low4);                               /* weights 4k.. */
                v[k + 4] = _mm256_and_si256(_mm256_srli_epi16(t[k], 4), low4);     /* weights 16 + 4k.. */
            }
            if (type == QMM_Q5_0 || type == QMM_Q5_1) {
                const int qh_at = type == QMM_Q5_0 ? 2 : 4;
                const __m256i h = _mm256_setr_epi32(rd32(w[0] + off + qh_at), rd32(w[1] + off + qh_at),
                                                    rd32(w[2] + off + qh_at), rd32(w[3] + off + qh_at),
                                                    rd32(w[4] + off + qh_at), rd32(w[5] + off + qh_at),
                                                    rd32(w[6] + off + qh_at), rd32(w[7] + off + qh_at));
                for (int k = 0; k < 8; k++) v[k] = _mm256_or_si256(v[k], fifth_bits(h, k));
            }
        }
        const __m256 dw = f16x8(w, off);
        const __m256 mw = with_min ? f16x8(w, off + 2) : dw;
        for (int r = 0; r < R; r++) {
            const int8_t *q = x->q + (size_t)(m0 + r) * K + 32 * b;
            __m256i dot;
            if (type == QMM_Q8_0) {  /* signed codes: |w| against q*sign(w); a pair <= 2*128*127, so int32 at once */
                dot = _mm256_setzero_si256();
                for (int k = 0; k < 8; k++) {
                    const __m256i qk = bcast4(q + 4 * k);
                    dot = _mm256_add_epi32(dot, _mm256_madd_epi16(
                        _mm256_maddubs_epi16(_mm256_sign_epi8(v[k], v[k]), _mm256_sign_epi8(qk, v[k])), ones));
                }
            } else if (type == QMM_Q4_0 || type == QMM_Q4_1) {
                /* codes <= 15: eight pair sums <= 8*2*15*127 = 30480 add in int16 exactly */
                __m256i p = _mm256_setzero_si256();
                for (int k = 0; k < 8; k++)
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(v[k], bcast4(q + 4 * k)));
                dot = _mm256_madd_epi16(p, ones);
            } else {
                /* codes <= 31: four pair sums <= 4*2*31*127 = 31496 add in int16 exactly */
                __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
                for (int k = 0; k < 4; k++) {
                    p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(v[k], bcast4(q + 4 * k)));
                    p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(v[k + 4], bcast4(q + 16 + 4 * k)));
                }
                dot = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
            }
            const int16_t *s = x->s + (size_t)(m0 + r) * (K / 16) + 2 * b;
            const int sx = s[0] + s[1];
            const __m256 dx = _mm256_set1_ps(x->d[(size_t)(m0 + r) * (K / 32) + b]);
            if (with_min)
                acc[r] = _mm256_add_ps(acc[r],
                                       _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(dx, dw), _mm256_cvtepi32_ps(dot)),
                                                     _mm256_mul_ps(_mm256_mul_ps(dx, mw), _mm256_set1_ps((float)sx))));
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

/* Q6_K per column: 8 int32 lanes over the super-block (maddubs by 32 weights, madd by the two 16-weight sub-blocks'
 * int8 scales), reduced once a super-block by sum8. (Lanes as columns, as Q4_K, measured no faster for Q6_K: its
 * 63-codes allow int16 sums of two maddubs only, and its decode is three transposes a half.) */
ALWAYS void tile_q6k(const int type, const uint8_t *const w[8], int nb, const qmm_act *x, int m0, const int R,
                     float *Y, int ldy, int n, size_t ahead) {
    const int K = x->K, bb = qmm_block_bytes[type];
    const __m256i low4 = _mm256_set1_epi8(15), b45 = _mm256_set1_epi8(0x30);
    __m256 acc[TILE_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t off = (size_t)b * bb;
        prefetch_next(w, ahead, off, bb);
        __m256i pi[TILE_ROWS][8];
        for (int c = 0; c < 8; c++) {
            const blk_q6_k *b6 = (const blk_q6_k *)(w[c] + off);
            const __m128i sc = _mm_loadu_si128((const __m128i *)b6->scales);
            __m256i a[TILE_ROWS];
            for (int r = 0; r < R; r++) a[r] = _mm256_setzero_si256();
            for (int h = 0; h < 2; h++) {
                const __m256i l0 = load(b6->ql + 64 * h), l1 = load(b6->ql + 64 * h + 32), hb = load(b6->qh + 32 * h);
                const __m256i v[4] = {
                    _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), b45)),
                    _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), b45)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(hb, b45)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                    _mm256_and_si256(_mm256_srli_epi16(hb, 2), b45))};
                for (int k = 0; k < 4; k++) {
                    const int g = 4 * h + k;          /* weights 32g..32g+31: sub-blocks 2g (low lane), 2g+1 (high) */
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
        }
        const __m256 d = f16x8(w, off + 208);
        for (int r = 0; r < R; r++) {
            const __m256 dx = _mm256_set1_ps(x->d[(size_t)(m0 + r) * (K / 256) + b]);
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sum8(pi[r]))));
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(Y + (size_t)(m0 + r) * ldy + n, acc[r]);
}

/* Q4_K, Q5_K with lanes as columns, as the 32-weight types: the 8 columns' bytes transposed by dwords (scales and
 * codes alike: every decode step is bytewise or within a dword, so it commutes with the transpose), a sub-block's 8
 * code vectors kept in registers for all rows. Per row and sub-block i: eight maddubs summed in int16 (codes <= 15:
 * 8*2*15*127 = 30480; Q5_K's codes <= 31: two sums of four, 31496), one madd by sc_i, lane c = column c; the mins'
 * sum as four madds of (m_2k, m_2k+1) pairs against the row's (sx_2k, sx_2k+1). No reduction. */
ALWAYS void tile_k45(const int type, const uint8_t *const w[8], int nb, const qmm_act *x, int m0, const int R,
                     float *Y, int ldy, int n, size_t ahead) {
    const int K = x->K, bb = qmm_block_bytes[type], qs_at = type == QMM_Q4_K ? 16 : 48;
    const __m256i low4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16);
    const __m256i m3f = _mm256_set1_epi8(0x3f), m30 = _mm256_set1_epi8(0x30);
    const __m256i at = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404, 0x08080808, 0x0c0c0c0c);
    __m256 acc[TILE_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t off = (size_t)b * bb;
        prefetch_next(w, ahead, off, bb);
        __m256i u[4];                          /* lane c: column c's (d, dmin), then the scale bytes' dwords u0..u2 */
        transpose4(w, off, u);
        const __m256i dd = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(u[0], _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                                       0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)), 0xd8);
        const __m256 d = _mm256_cvtph_ps(_mm256_castsi256_si128(dd));
        const __m256 dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(dd, 1));
        /* qmm_k4_scales in each lane: sc[0..3], sc[4..7], m[0..3], m[4..7] */
        const __m256i sc[2] = {_mm256_and_si256(u[1], m3f),
                               _mm256_or_si256(_mm256_and_si256(u[3], low4),
                                               _mm256_and_si256(_mm256_srli_epi32(u[1], 2), m30))};
        const __m256i mn[2] = {_mm256_and_si256(u[2], m3f),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u[3], 4), low4),
                                               _mm256_and_si256(_mm256_srli_epi32(u[2], 2), m30))};
        __m256i isum[TILE_ROWS], msum[TILE_ROWS];
        for (int r = 0; r < R; r++) {
            const int16_t *s = x->s + (size_t)(m0 + r) * (K / 16) + 16 * b;
            isum[r] = msum[r] = _mm256_setzero_si256();
            for (int k = 0; k < 4; k++) {      /* (m_2k, m_2k+1) in lane c's int16 halves, against (sx_2k, sx_2k+1) */
                const int lo = (2 * k) & 3;
                const __m256i mp = _mm256_shuffle_epi8(
                    mn[k >> 1], _mm256_add_epi8(at, _mm256_set1_epi32((int)(0x80008000u | (lo + 1) << 16 | lo))));
                const int sx0 = s[4 * k] + s[4 * k + 1], sx1 = s[4 * k + 2] + s[4 * k + 3];
                const __m256i sx = _mm256_set1_epi32((int)((uint32_t)(uint16_t)sx0 | (uint32_t)sx1 << 16));
                msum[r] = _mm256_add_epi32(msum[r], _mm256_madd_epi16(mp, sx));
            }
        }
        __m256i qh[8];
        if (type == QMM_Q5_K) {
            transpose4(w, off + 16, qh);
            transpose4(w, off + 32, qh + 4);
        }
        for (int j = 0; j < 4; j++) {                          /* qs bytes 32j..32j+31: sub-blocks 2j, 2j+1 */
            __m256i t[8];
            transpose4(w, off + qs_at + 32 * j, t);
            transpose4(w, off + qs_at + 32 * j + 16, t + 4);
            for (int half = 0; half < 2; half++) {
                const int i = 2 * j + half;
                __m256i v[8];
                for (int k = 0; k < 8; k++) {
                    v[k] = _mm256_and_si256(half ? _mm256_srli_epi16(t[k], 4) : t[k], low4);
                    if (type == QMM_Q5_K)                   /* bit i of qh's bytes -> 16 */
                        v[k] = _mm256_or_si256(v[k], _mm256_and_si256(i <= 4 ? _mm256_slli_epi16(qh[k], 4 - i)
                                                                             : _mm256_srli_epi16(qh[k], i - 4), b4));
                }
                const __m256i sci = _mm256_shuffle_epi8(
                    sc[i >> 2], _mm256_add_epi8(at, _mm256_set1_epi32((int)(0x80008000u | (i & 3) << 16 | (i & 3)))));
                for (int r = 0; r < R; r++) {
                    const int8_t *q = x->q + (size_t)(m0 + r) * K + 256 * b + 32 * i;
                    __m256i dot;
                    if (type == QMM_Q4_K) {
                        __m256i p = _mm256_setzero_si256();
                        for (int k = 0; k < 8; k++)
                            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(v[k], bcast4(q + 4 * k)));
                        dot = _mm256_madd_epi16(p, sci);
                    } else {
                        __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
                        for (int k = 0; k < 4; k++) {
                            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(v[k], bcast4(q + 4 * k)));
                            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(v[k + 4], bcast4(q + 16 + 4 * k)));
                        }
                        dot = _mm256_add_epi32(_mm256_madd_epi16(p0, sci), _mm256_madd_epi16(p1, sci));
                    }
                    isum[r] = _mm256_add_epi32(isum[r], dot);
                }
            }
        }
        for (int r = 0; r < R; r++) {
            const __m256 dx = _mm256_set1_ps(x->d[(size_t)(m0 + r) * (K / 256) + b]);
            acc[r] = _mm256_add_ps(acc[r],
                                   _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(isum[r])),
                                                 _mm256_mul_ps(_mm256_mul_ps(dx, dmin), _mm256_cvtepi32_ps(msum[r]))));
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(Y + (size_t)(m0 + r) * ldy + n, acc[r]);
}

/* one tile, the type and row count made constants so each (type, rows) pair is its own unrolled kernel */
#define ROWS(fn, T)                                                                                                   \
    switch (R) {                                                                                                      \
    case 1: fn(T, w, nb, x, m0, 1, Y, ldy, n, ahead); break;                                                          \
    case 2: fn(T, w, nb, x, m0, 2, Y, ldy, n, ahead); break;                                                          \
    case 3: fn(T, w, nb, x, m0, 3, Y, ldy, n, ahead); break;                                                          \
    case 4: fn(T, w, nb, x, m0, 4, Y, ldy, n, ahead); break;                                                          \
    case 5: fn(T, w, nb, x, m0, 5, Y, ldy, n, ahead); break;                                                          \
    case 6: fn(T, w, nb, x, m0, 6, Y, ldy, n, ahead); break;                                                          \
    case 7: fn(T, w, nb, x, m0, 7, Y, ldy, n, ahead); break;                                                          \
    default: fn(T, w, nb, x, m0, 8, Y, ldy, n, ahead); break;                                                         \
    }

static void tile(int type, const uint8_t *const w[8], int nb, const qmm_act *x, int m0, int R, float *Y, int ldy,
                 int n, size_t ahead) {
    switch (type) {
    case QMM_Q4_0: ROWS(tile32, QMM_Q4_0); break;
    case QMM_Q4_1: ROWS(tile32, QMM_Q4_1); break;
    case QMM_Q5_0: ROWS(tile32, QMM_Q5_0); break;
    case QMM_Q5_1: ROWS(tile32, QMM_Q5_1); break;
    case QMM_Q8_0: ROWS(tile32, QMM_Q8_0); break;
    case QMM_Q4_K: ROWS(tile_k45, QMM_Q4_K); break;
    case QMM_Q5_K: ROWS(tile_k45, QMM_Q5_K); break;
    case QMM_Q6_K: ROWS(tile_q6k, QMM_Q6_K); break;
    }
}

void qmm_gemm_avx2(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0, int n1) {
    const int nb = K / qmm_block_weights[type];
    const size_t row = (size_t)nb * qmm_block_bytes[type];
    const int n8 = n0 + (n1 - n0) / 8 * 8;
    const int rows = type == QMM_Q6_K ? 4 : TILE_ROWS;      /* Q6_K's per-column accumulators spill past 4 rows */
    for (int n = n0; n < n8; n += 8) {
        const uint8_t *w[8];
        for (int c = 0; c < 8; c++) w[c] = W + (size_t)(n + c) * row;
        for (int m0 = 0; m0 < M; m0 += rows)
            tile(type, w, nb, x, m0, M - m0 < rows ? M - m0 : rows, Y, ldy, n, m0 == 0 && n + 8 < n8 ? 8 * row : 0);
    }
    if (n8 < n1) qmm_gemm_ref(type, W, K, x, M, Y, ldy, n8, n1);      /* the columns that do not fill a tile */
}

/* qmm_ops.c's qmm_expf on eight lanes: the same operations in the same order (no fused multiply-add), so each lane's
 * bits are the reference's; lanes out of range or NaN take the reference's special values at the end. */
ALWAYS __m256 exp8(__m256 x) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(QMM_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(QMM_EXP_C1))),
                                   _mm256_mul_ps(n, _mm256_set1_ps(QMM_EXP_C2)));
    __m256 p = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(QMM_EXP_P0), r), _mm256_set1_ps(QMM_EXP_P1));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(QMM_EXP_P2));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(QMM_EXP_P3));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(QMM_EXP_P4));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(QMM_EXP_P5));
    const __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
    const __m256 nn = _mm256_max_ps(_mm256_min_ps(n, _mm256_set1_ps(127.0f)), _mm256_set1_ps(-126.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127)), 23);
    __m256 e = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    e = _mm256_blendv_ps(e, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, _mm256_set1_ps(QMM_EXP_HI), _CMP_GT_OQ));
    e = _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(QMM_EXP_LO), _CMP_LT_OQ));
    return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* qmm_swiglu's bits, eight values at a time (the last F % 8 by the reference's formula) */
void qmm_swiglu_avx2(const float *gu, int T, int F, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int t = 0; t < T; t++, gu += 2 * F, out += F) {
        int i = 0;
        for (; i + 8 <= F; i += 8) {
            const __m256 g = _mm256_loadu_ps(gu + i);
            const __m256 e = exp8(_mm256_xor_ps(g, sign));                     /* -g, as the reference's negation */
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(gu + F + i)));
        }
        for (; i < F; i++) out[i] = (gu[i] / (1.0f + qmm_expf(-gu[i]))) * gu[F + i];
    }
}
#endif
