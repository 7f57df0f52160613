/* The AVX-512 VNNI path (vpdpbusd): what an Intel Xeon (Ice Lake and later) or an AMD EPYC with AVX-512 (Zen 4) runs.
 *
 * Owns the AVX-512 VNNI kernels for all eight types; run only on a CPU with AVX-512 F/BW/VL/DQ and VNNI (qmm_module.c
 * checks). Never uses a fused multiply-add, never picks anything by the number of rows, never reorders a float op.
 *
 * Shape: a tile is 16 output columns (weight rows) x up to TILE_ROWS activation rows; each weight block of the 16
 * columns is loaded and decoded once for all the tile's rows (rows past the tile loop over the weights again, from
 * cache). Lanes are columns (qmm_avx2.c's design on 512 bits):
 *  - 32-weight types, Q4_K, Q5_K: the 16 columns' bytes are transposed by dwords at decode, so lane c holds 4 codes
 *    of column c; a row's 4 matching activation bytes are broadcast to every lane and _mm512_dpbusd_epi32 sums
 *    column c's products in lane c: no reduction at all. The K-quants' 6-bit scales and mins are decoded lane-wise
 *    from the transposed bytes and applied in integers (scales by mullo a sub-block, mins by dpwssd pairs), one float
 *    combine per 256-weight super-block;
 *  - Q6_K: per column, two blocks of codes a vector (the earlier design, faster for Q6_K at 4-8 rows), the 16
 *    columns' int32 vectors transposed-added once a super-block (reduce16).
 * The float combine is qmm.h's, lane by lane: lane c computes exactly what the reference computes for column c, in
 * the same order. Columns that do not fill a 16-tile go to the AVX2 path (8 columns a tile; the same bits), the last
 * < 8 to the reference.
 *
 * Exactness of the integers (any order is exact while nothing overflows): vpdpbusd multiplies unsigned by signed
 * bytes and adds four products to int32 WITHOUT saturation. Q8_0's signed codes go in as code + 128 (unsigned), their
 * dot less 128 * sx, the same integer as the reference's signed dot. Every int32 stays below 2^31 (qmm.h's bounds:
 * |isum| < 2^27); Q6_K's packs of four-product sums (<= 4*63*127 = 32004) to int16 do not saturate.
 * Ideas from ggml's published K-quant dot products (integer sub-block scales, one float multiply per super-block); the
 * code is ours.
 */
#if defined(__x86_64__)
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c,fma")
#include <immintrin.h>
#include "qmm.h"

#define TILE_ROWS 8
#define ALWAYS static inline __attribute__((always_inline))

ALWAYS int rd32(const void *p) {
    int v;
    memcpy(&v, p, 4);
    return v;
}

ALWAYS __m128i ld16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }

/* v[k]: lane c holds column c's bytes at + 4k .. at + 4k + 3 (k = 0..3) */
ALWAYS void transpose16(const uint8_t *const w[16], size_t at, __m512i v[4]) {
    __m512i r[4];
    for (int c = 0; c < 4; c++)            /* 128-bit lane L: column c + 4L */
        r[c] = _mm512_inserti32x4(
            _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(ld16(w[c] + at)), ld16(w[c + 4] + at), 1),
                               ld16(w[c + 8] + at), 2),
            ld16(w[c + 12] + at), 3);
    const __m512i t0 = _mm512_unpacklo_epi32(r[0], r[1]), t1 = _mm512_unpacklo_epi32(r[2], r[3]);
    const __m512i t2 = _mm512_unpackhi_epi32(r[0], r[1]), t3 = _mm512_unpackhi_epi32(r[2], r[3]);
    v[0] = _mm512_unpacklo_epi64(t0, t1);
    v[1] = _mm512_unpackhi_epi64(t0, t1);
    v[2] = _mm512_unpacklo_epi64(t2, t3);
    v[3] = _mm512_unpackhi_epi64(t2, t3);
}

/* lane c: the dword at byte `at` of column c's row (the columns' rows `row` bytes apart); every read stays inside
 * its block (Q6_K's d, its last two bytes, is read as the high half of the dword at 206) */
ALWAYS __m512i dwords(const uint8_t *const w[16], size_t at, __m512i idx) {
    return _mm512_i32gather_epi32(idx, (const void *)(w[0] + at), 1);
}

/* float16 in the low / high half of each dword, exactly as float32 (every float16 is a float32) */
ALWAYS __m512 f16lo(__m512i g) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)); }
ALWAYS __m512 f16hi(__m512i g) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))); }

/* The next tile's 16 rows are the next 16 * row bytes: each column stream fetches the same offset there (ahead), so
 * short rows still reach the core from a prefetched line (ahead = 0: the last tile, or a tile's later rows). */
ALWAYS void prefetch_next(const uint8_t *const w[16], size_t ahead, size_t off, int bb) {
    if (!ahead) return;
    for (int c = 0; c < 16; c++)
        for (int l = 0; l < bb; l += 64) _mm_prefetch((const char *)(w[c] + ahead + off + l), _MM_HINT_T0);
}

ALWAYS __m512i bcast4(const int8_t *q) { return _mm512_set1_epi32(rd32(q)); }

/* the dot of 32 weights (v[k]: weights 4k..4k+3, lane = column) with a row's 32 activations; two chains */
ALWAYS __m512i dot32(const __m512i v[8], const int8_t *q) {
    __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
        a = _mm512_dpbusd_epi32(a, v[k], bcast4(q + 4 * k));
        b = _mm512_dpbusd_epi32(b, v[k + 1], bcast4(q + 4 * k + 4));
    }
    return _mm512_add_epi32(a, b);
}

/* ---- the 32-weight types: acc += (dx*d) * (float)(dot - z*sx), or (dx*d)*(float)dot + (dx*m)*(float)sx ---- */

/* Q5_0/Q5_1: the byte mask of weights 4k..4k+3's fifth bits (qh's bit j: weight j's); h: lane c holds column c's qh */
ALWAYS __mmask64 fifth_bits(__m512i h, int k) {
    const __m512i at = _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0);    /* lane c's dword in its 128 */
    const __m512i spread = _mm512_set1_epi32(0x01010101 * (k >> 1));               /* bits 4k.. in qh's byte k/2 */
    const __m512i bit = _mm512_set1_epi32((int)(0x08040201u << (4 * (k & 1))));
    return _mm512_test_epi8_mask(_mm512_shuffle_epi8(h, _mm512_add_epi8(at, spread)), bit);
}

ALWAYS void tile32(const int type, const uint8_t *const w[16], __m512i idx, int nb, const qmm_act *x, int m0,
                   const int R, float *Y, int ldy, int n, size_t ahead) {
    const int K = x->K, bb = qmm_block_bytes[type];
    const int z = type == QMM_Q4_0 ? 8 : type == QMM_Q5_0 ? 16 : type == QMM_Q8_0 ? 128 : 0;   /* Q8_0: code + 128 */
    const int with_min = type == QMM_Q4_1 || type == QMM_Q5_1;
    const int qs_at = type == QMM_Q4_0 ? 2 : type == QMM_Q4_1 ? 4 : type == QMM_Q5_0 ? 6 : type == QMM_Q5_1 ? 8 : 2;
    const __m512i low4 = _mm512_set1_epi8(15), b4 = _mm512_set1_epi8(16), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[TILE_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t off = (size_t)b * bb;
        prefetch_next(w, ahead, off, bb);
        __m512i v[8];                /* v[k]: weights 4k..4k+3 of each column (lane), k = 0..7 */
        if (type == QMM_Q8_0) {
            transpose16(w, off + 2, v);
            transpose16(w, off + 18, v + 4);
            for (int k = 0; k < 8; k++) v[k] = _mm512_xor_si512(v[k], flip);
        } else {
            __m512i t[4];
            transpose16(w, off + qs_at, t);
            for (int k = 0; k < 4; k++) {
                v[k] = _mm512_and_si512(t[k], low4);                               /* weights 4k.. */
                v[k + 4] = _mm512_and_si512(_mm512_srli_epi16(t[k], 4), low4);     /* weights 16 + 4k.. */
            }
            if (type == QMM_Q5_0 || type == QMM_Q5_1) {
                const __m512i h = dwords(w, off + (type == QMM_Q5_0 ? 2 : 4), idx);
                for (int k = 0; k < 8; k++) v[k] = _mm512_mask_add_epi8(v[k], fifth_bits(h, k), v[k], b4);
            }
        }
        const __m512i g = dwords(w, off, idx);            /* d (and Q4_1/Q5_1's m) */
        const __m512 dw = f16lo(g);
        const __m512 mw = with_min ? f16hi(g) : dw;
        for (int r = 0; r < R; r++) {
            const __m512i dot = dot32(v, x->q + (size_t)(m0 + r) * K + 32 * b);
            const int16_t *s = x->s + (size_t)(m0 + r) * (K / 16) + 2 * b;
            const int sx = s[0] + s[1];
            const __m512 dx = _mm512_set1_ps(x->d[(size_t)(m0 + r) * (K / 32) + b]);
            if (with_min)
                acc[r] = _mm512_add_ps(acc[r],
                                       _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(dx, dw), _mm512_cvtepi32_ps(dot)),
                                                     _mm512_mul_ps(_mm512_mul_ps(dx, mw), _mm512_set1_ps((float)sx))));
            else
                acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(dx, dw),
                                                             _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                                                 dot, _mm512_set1_epi32(z * sx)))));
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(Y + (size_t)(m0 + r) * ldy + n, acc[r]);
}

/* ---- Q4_K, Q5_K: acc += (dx*d) * (float)(sum_j sc_j*dot_j) - (dx*dmin) * (float)(sum_j m_j*sx_j) ----
 * The 16 columns' bytes transposed by dwords (header and codes alike: every decode step is bytewise or within a
 * dword, so it commutes with the transpose); a sub-block's 8 code vectors in registers for all rows. Per row and
 * sub-block i: eight dpbusd (int32, lane c = column c), one mullo by sc_i (<= 63: |sc_i*dot_i| < 2^23); the mins' sum
 * as four dpwssd of (m_2k, m_2k+1) pairs against the row's (sx_2k, sx_2k+1). No reduction. */
ALWAYS void tile_k45(const int type, const uint8_t *const w[16], int nb, const qmm_act *x, int m0, const int R,
                     float *Y, int ldy, int n, size_t ahead) {
    const int K = x->K, bb = qmm_block_bytes[type], qs_at = type == QMM_Q4_K ? 16 : 48;
    const __m512i low4 = _mm512_set1_epi8(15), b4 = _mm512_set1_epi8(16), byte = _mm512_set1_epi32(0xff);
    const __m512i m3f = _mm512_set1_epi8(0x3f), m30 = _mm512_set1_epi8(0x30);
    const __m512i at = _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0);
    __m512 acc[TILE_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t off = (size_t)b * bb;
        prefetch_next(w, ahead, off, bb);
        __m512i u[4];                          /* lane c: column c's (d, dmin), then the scale bytes' dwords u0..u2 */
        transpose16(w, off, u);
        /* qmm_k4_scales in each lane: sc[0..3], sc[4..7], m[0..3], m[4..7] */
        const __m512i sc[2] = {_mm512_and_si512(u[1], m3f),
                               _mm512_or_si512(_mm512_and_si512(u[3], low4),
                                               _mm512_and_si512(_mm512_srli_epi32(u[1], 2), m30))};
        __m512i qh[8];
        if (type == QMM_Q5_K) {
            transpose16(w, off + 16, qh);
            transpose16(w, off + 32, qh + 4);
        }
        __m512i isum[TILE_ROWS];
        for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {                          /* qs bytes 32j..32j+31: sub-blocks 2j, 2j+1 */
            __m512i t[8];
            transpose16(w, off + qs_at + 32 * j, t);
            transpose16(w, off + qs_at + 32 * j + 16, t + 4);
            for (int half = 0; half < 2; half++) {
                const int i = 2 * j + half;
                __m512i v[8];
                for (int k = 0; k < 8; k++) {
                    v[k] = _mm512_and_si512(half ? _mm512_srli_epi16(t[k], 4) : t[k], low4);
                    if (type == QMM_Q5_K)                   /* bit i of qh's bytes -> 16 */
                        v[k] = _mm512_mask_add_epi8(v[k], _mm512_test_epi8_mask(qh[k], _mm512_set1_epi8((char)(1 << i))),
                                                    v[k], b4);
                }
                const __m512i sci = _mm512_and_si512(_mm512_srli_epi32(sc[i >> 2], 8 * (i & 3)), byte);
                for (int r = 0; r < R; r++) {
                    const __m512i dot = dot32(v, x->q + (size_t)(m0 + r) * K + 256 * b + 32 * i);
                    isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(dot, sci));
                }
            }
        }
        const __m512i mn[2] = {_mm512_and_si512(u[2], m3f),
                               _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u[3], 4), low4),
                                               _mm512_and_si512(_mm512_srli_epi32(u[2], 2), m30))};
        __m512i mp[4];                         /* (m_2k, m_2k+1) in lane c's int16 halves */
        for (int k = 0; k < 4; k++) {
            const int lo = (2 * k) & 3;
            mp[k] = _mm512_shuffle_epi8(mn[k >> 1],
                                        _mm512_add_epi8(at, _mm512_set1_epi32((int)(0x80008000u | (lo + 1) << 16 | lo))));
        }
        const __m512 d = f16lo(u[0]), dmin = f16hi(u[0]);
        for (int r = 0; r < R; r++) {
            const int16_t *s = x->s + (size_t)(m0 + r) * (K / 16) + 16 * b;
            __m512i msum = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {      /* against (sx_2k, sx_2k+1) */
                const int sx0 = s[4 * k] + s[4 * k + 1], sx1 = s[4 * k + 2] + s[4 * k + 3];
                msum = _mm512_dpwssd_epi32(msum, mp[k],
                                           _mm512_set1_epi32((int)((uint32_t)(uint16_t)sx0 | (uint32_t)sx1 << 16)));
            }
            const __m512 dx = _mm512_set1_ps(x->d[(size_t)(m0 + r) * (K / 256) + b]);
            acc[r] = _mm512_add_ps(acc[r],
                                   _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(dx, d), _mm512_cvtepi32_ps(isum[r])),
                                                 _mm512_mul_ps(_mm512_mul_ps(dx, dmin), _mm512_cvtepi32_ps(msum))));
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(Y + (size_t)(m0 + r) * ldy + n, acc[r]);
}

/* ---- Q6_K: acc += (dx*d) * (float)(sum_j sc_j*(dot_j - 32*sx_j)), per column then reduce16 ---- */

/* lane c of the result = the sum of v[c]'s 16 lanes */
static inline __m512i reduce16(const __m512i v[16]) {
    __m512i t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]),
                                _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    /* u[i]'s 128-bit lane L now holds lane L's sums of v[4i .. 4i+3]; the shuffles below gather them by column */
    __m512i x01 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
    __m512i x23 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x88), _mm512_shuffle_i32x4(u[2], u[3], 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(x01, x23, 0x88), _mm512_shuffle_i32x4(x01, x23, 0xDD));
}

static inline __m512i q6_scale_index(int h) {     /* half h: A = 16-blocks 8h+L, B = 8h+4+L */
    int16_t idx[32];
    for (int L = 0; L < 4; L++)
        for (int e = 0; e < 8; e++) idx[8 * L + e] = (int16_t)(8 * h + L + (e < 4 ? 0 : 4));
    return _mm512_loadu_si512(idx);
}

ALWAYS void tile_q6k(const uint8_t *const w[16], __m512i idx, int nb, const qmm_act *x, int m0, const int R, float *Y,
                     int ldy, int n, size_t ahead) {
    const int K = x->K, bb = qmm_block_bytes[QMM_Q6_K];
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x03);
    const __m512i Q0 = q6_scale_index(0), Q1 = q6_scale_index(1);
    const __m512i sh_lo = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i sh_hi = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    __m512 acc[TILE_ROWS];
    __m512i is[TILE_ROWS][16];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t off = (size_t)b * bb;
        prefetch_next(w, ahead, off, bb);
        for (int c = 0; c < 16; c++) {
            const blk_q6_k *b6 = (const blk_q6_k *)(w[c] + off);
            const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)b6->scales));
            const __m512i sc16 = _mm512_castsi256_si512(sc);
            const __m512i S[2] = {_mm512_permutexvar_epi16(Q0, sc16), _mm512_permutexvar_epi16(Q1, sc16)};
            __m512i lo[2], hi[2];
            for (int h = 0; h < 2; h++) {
                const __m512i ql = _mm512_loadu_si512((const void *)(b6->ql + 64 * h));
                const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)(b6->qh + 32 * h)));
                lo[h] = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                        _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_lo), m2), 4));
                hi[h] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                        _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m2), 4));
            }
            for (int r = 0; r < R; r++) {
                const int8_t *q = x->q + (size_t)(m0 + r) * K + 256 * b;
                __m512i v = _mm512_setzero_si512();
                for (int h = 0; h < 2; h++) {
                    const __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[h],
                                                          _mm512_loadu_si512((const void *)(q + 128 * h)));
                    const __m512i e = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[h],
                                                          _mm512_loadu_si512((const void *)(q + 128 * h + 64)));
                    v = _mm512_add_epi32(v, _mm512_madd_epi16(_mm512_packs_epi32(a, e), S[h]));
                }
                /* - 32 * sum_j sc_j * sx_j (the codes' zero point, 32) */
                const __m256i sx = _mm256_loadu_si256((const void *)(x->s + (size_t)(m0 + r) * (K / 16) + 16 * b));
                const __m256i zsum = _mm256_madd_epi16(sc, sx);
                is[r][c] = _mm512_sub_epi32(v, _mm512_slli_epi32(_mm512_zextsi256_si512(zsum), 5));
            }
        }
        const __m512 D = f16hi(dwords(w, off + 206, idx));   /* d: bytes 208..209, the block's last (210) */
        for (int r = 0; r < R; r++) {               /* acc += (dx*d) * (float)isum */
            const __m512 dx = _mm512_set1_ps(x->d[(size_t)(m0 + r) * (K / 256) + b]);
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(dx, D), _mm512_cvtepi32_ps(reduce16(is[r]))));
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(Y + (size_t)(m0 + r) * ldy + n, acc[r]);
}

/* one tile, the type and row count made constants so each (type, rows) pair is its own unrolled kernel */
#define ROWS(call)                                                                                                    \
    switch (R) {                                                                                                      \
    case 1: call(1); break;                                                                                           \
    case 2: call(2); break;                                                                                           \
    case 3: call(3); break;                                                                                           \
    case 4: call(4); break;                                                                                           \
    case 5: call(5); break;                                                                                           \
    case 6: call(6); break;                                                                                           \
    case 7: call(7); break;                                                                                           \
    default: call(8); break;                                                                                          \
    }

static void tile(int type, const uint8_t *const w[16], __m512i idx, int nb, const qmm_act *x, int m0, int R, float *Y,
                 int ldy, int n, size_t ahead) {
#define C32(T, rr) tile32(T, w, idx, nb, x, m0, rr, Y, ldy, n, ahead)
#define Q40(rr) C32(QMM_Q4_0, rr)
#define Q41(rr) C32(QMM_Q4_1, rr)
#define Q50(rr) C32(QMM_Q5_0, rr)
#define Q51(rr) C32(QMM_Q5_1, rr)
#define Q80(rr) C32(QMM_Q8_0, rr)
#define Q4K(rr) tile_k45(QMM_Q4_K, w, nb, x, m0, rr, Y, ldy, n, ahead)
#define Q5K(rr) tile_k45(QMM_Q5_K, w, nb, x, m0, rr, Y, ldy, n, ahead)
#define Q6K(rr) tile_q6k(w, idx, nb, x, m0, rr, Y, ldy, n, ahead)
    switch (type) {
    case QMM_Q4_0: ROWS(Q40); break;
    case QMM_Q4_1: ROWS(Q41); break;
    case QMM_Q5_0: ROWS(Q50); break;
    case QMM_Q5_1: ROWS(Q51); break;
    case QMM_Q8_0: ROWS(Q80); break;
    case QMM_Q4_K: ROWS(Q4K); break;
    case QMM_Q5_K: ROWS(Q5K); break;
    case QMM_Q6_K: ROWS(Q6K); break;
    }
}

void qmm_gemm_avx512_vnni(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0,
                          int n1) {
    const int nb = K / qmm_block_weights[type];
    const size_t row = (size_t)nb * qmm_block_bytes[type];
    const int n16 = n0 + (n1 - n0) / 16 * 16;
    /* the gathers' offsets (column c at c * row) must fit int32: else the tiles go to the AVX2 path */
    const int full = row <= (size_t)0x7fffffff / 16 ? n16 : n0;
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)(full > n0 ? row : 0)));
    for (int n = n0; n < full; n += 16) {
        const uint8_t *w[16];
        for (int c = 0; c < 16; c++) w[c] = W + (size_t)(n + c) * row;
        for (int m0 = 0; m0 < M; m0 += TILE_ROWS)
            tile(type, w, idx, nb, x, m0, M - m0 < TILE_ROWS ? M - m0 : TILE_ROWS, Y, ldy, n,
                 m0 == 0 && n + 16 < full ? 16 * row : 0);
    }
    if (full < n1) qmm_gemm_avx2(type, W, K, x, M, Y, ldy, full, n1);   /* 8 columns a tile, the rest the reference */
    /* Leave no 512-bit state behind: vzeroupper (the compiler's) does not clear zmm16-31, and with their upper halves
     * dirty the SSE code that runs next on this thread (libm's exp in the row-wise operations) ran 20x slower
     * (swiglu of 8960 values: 2.68 ms after this path, 0.14 after the AVX2 path: /work/notes figures, issue 56). */
    __asm__ __volatile__("vpxord %%zmm16, %%zmm16, %%zmm16\n\tvpxord %%zmm17, %%zmm17, %%zmm17\n\t"
                         "vpxord %%zmm18, %%zmm18, %%zmm18\n\tvpxord %%zmm19, %%zmm19, %%zmm19\n\t"
                         "vpxord %%zmm20, %%zmm20, %%zmm20\n\tvpxord %%zmm21, %%zmm21, %%zmm21\n\t"
                         "vpxord %%zmm22, %%zmm22, %%zmm22\n\tvpxord %%zmm23, %%zmm23, %%zmm23\n\t"
                         "vpxord %%zmm24, %%zmm24, %%zmm24\n\tvpxord %%zmm25, %%zmm25, %%zmm25\n\t"
                         "vpxord %%zmm26, %%zmm26, %%zmm26\n\tvpxord %%zmm27, %%zmm27, %%zmm27\n\t"
                         "vpxord %%zmm28, %%zmm28, %%zmm28\n\tvpxord %%zmm29, %%zmm29, %%zmm29\n\t"
                         "vpxord %%zmm30, %%zmm30, %%zmm30\n\tvpxord %%zmm31, %%zmm31, %%zmm31\n\t"
                         "vzeroupper" ::: "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23",
                         "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31");
}
#endif
