/* The NEON path with dotprod (ARMv8.2-A: the RK3588's Cortex-A76 and A55): qmm_gemm_neon_dotprod, bit for bit the
 * scalar reference's output (qmm.h's order of operations), every type.
 *
 * Owns the tiling and the vector decode of the blocks: a tile of 4 output columns x up to 4 rows; each weight block
 * is decoded once for all rows of the tile; the 4 columns' int32x4 partial dot products are reduced by a transpose-add
 * (vpaddq_s32 twice) into one int32x4 whose lane c is column c; the K-quants' sub-block scales and mins are applied in
 * integers (lane c holds column c's scale), then one float combine per block, lane-wise, in the reference's order.
 * Columns that do not fill a tile go to qmm_gemm_ref. Never fuses a multiply-add in floats (no vfmaq/vmlaq_f32: the
 * file is built with -ffp-contract=off), never picks anything by the number of rows.
 *
 * Why the bits are equal: integer dot products are exact in any order (every stored code fits an int8 as stored:
 * 4/5/6-bit codes are 0..63, Q8_0's are int8; zero points and mins use the activation sums, as the reference does);
 * vcvtq_f32_s32 rounds to nearest even like C's (float) (both follow FPCR.RMode); vmulq/vaddq/vsubq_f32 are IEEE
 * single operations, the same instructions' semantics per lane as the scalar ones, operands in the reference's order.
 * One thing no path can promise: when two NaNs of different payloads meet (a file's NaN float16 scale and a NaN
 * activation row), the survivor is the first operand's, and GCC orders a commutative C operation as it likes in the
 * reference too; every NaN the computation makes itself is AArch64's one default NaN (tests/kernels/qmm_check.c).
 * Built for armv8.2-a+dotprod by the pragma below (the rest of the module stays armv8-a); qmm_module.c calls it only
 * when the kernel reports HWCAP_ASIMDDP. Ideas from ggml's published NEON kernels (nibble split, vdotq per 16 bytes);
 * the code is ours. Checked under qemu-aarch64 by tests/kernels/qmm_check.c (tests/kernels/test_qmatmul_neon.py).
 */
#if defined(__aarch64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif
#include <arm_neon.h>
#include "qmm.h"

#define INLINE static inline __attribute__((always_inline))
#define TILE_N 4
#define TILE_M 4

/* 4 columns' float16 scales -> float32x4. vcvt quiets a signalling NaN where qmm_f16 keeps it (and a signalling NaN
 * wins over a quiet one in a product): a NaN or infinity among the four takes the reference's scalar conversion. */
INLINE float32x4_t f16x4(const uint16_t h[TILE_N]) {
    const uint16x4_t v = vld1_u16(h);
    if (vmaxv_u16(vceq_u16(vand_u16(v, vdup_n_u16(0x7c00)), vdup_n_u16(0x7c00)))) {
        const float f[TILE_N] = {qmm_f16(h[0]), qmm_f16(h[1]), qmm_f16(h[2]), qmm_f16(h[3])};
        return vld1q_f32(f);
    }
    return vcvt_f32_f16(vreinterpret_f16_u16(v));
}

INLINE uint16_t u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* lane c = the sum of p[c]'s four lanes */
INLINE int32x4_t reduce4(const int32x4_t p[TILE_N]) {
    return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

/* bytes of 4 columns' eight (or sixteen) per-sub-block values, column-major [c][j] -> int32x4 per j, lane c */
static const uint8_t tr8_idx[2][16] = {{0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27},
                                       {4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31}};

INLINE void widen_u8(uint8x16_t t, int32x4_t *o) {       /* 16 u8 -> 4 x int32x4 */
    const uint16x8_t lo = vmovl_u8(vget_low_u8(t)), hi = vmovl_high_u8(t);
    o[0] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(lo)));
    o[1] = vreinterpretq_s32_u32(vmovl_high_u16(lo));
    o[2] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(hi)));
    o[3] = vreinterpretq_s32_u32(vmovl_high_u16(hi));
}

INLINE void widen_s8(int8x16_t t, int32x4_t *o) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(t)), hi = vmovl_high_s8(t);
    o[0] = vmovl_s16(vget_low_s16(lo));
    o[1] = vmovl_high_s16(lo);
    o[2] = vmovl_s16(vget_low_s16(hi));
    o[3] = vmovl_high_s16(hi);
}

/* ---- the 32-weight types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 ---- */

/* one block's 32 codes as stored, weight order: w[0] weights 0..15, w[1] weights 16..31 */
INLINE void decode32(int type, const uint8_t *b, int8x16_t w[2]) {
    if (type == QMM_Q8_0) {
        w[0] = vld1q_s8((const int8_t *)b + 2);
        w[1] = vld1q_s8((const int8_t *)b + 18);
        return;
    }
    const int qs_at = type == QMM_Q4_0 ? 2 : type == QMM_Q4_1 ? 4 : type == QMM_Q5_0 ? 6 : 8;
    const uint8x16_t v = vld1q_u8(b + qs_at), m4 = vdupq_n_u8(15);
    uint8x16_t lo = vandq_u8(v, m4), hi = vshrq_n_u8(v, 4);          /* low nibbles: 0..15, high: 16..31 */
    if (type == QMM_Q5_0 || type == QMM_Q5_1) {                        /* qh bit j: weight j's fifth bit */
        static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        static const uint8_t pick[2][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                            {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}};
        uint32_t qh;
        memcpy(&qh, b + qs_at - 4, 4);
        const uint8x16_t h = vreinterpretq_u8_u32(vdupq_n_u32(qh)), bits = vld1q_u8(bit), b16 = vdupq_n_u8(16);
        lo = vorrq_u8(lo, vandq_u8(vtstq_u8(vqtbl1q_u8(h, vld1q_u8(pick[0])), bits), b16));
        hi = vorrq_u8(hi, vandq_u8(vtstq_u8(vqtbl1q_u8(h, vld1q_u8(pick[1])), bits), b16));
    }
    w[0] = vreinterpretq_s8_u8(lo);
    w[1] = vreinterpretq_s8_u8(hi);
}

/* Y[r, 4 columns] for R rows: acc += (dx*d) * (float)(dot - z*sx), or (dx*d) * (float)dot + (dx*m) * (float)sx */
INLINE void tile32(const int type, const int R, const uint8_t *const w[TILE_N], int K, const int8_t *q, const float *d,
                   const int16_t *s, float *y, int ldy) {
    const int bb = type == QMM_Q4_0 ? 18 : type == QMM_Q4_1 ? 20 : type == QMM_Q5_0 ? 22 : type == QMM_Q5_1 ? 24 : 34;
    const int z = type == QMM_Q4_0 ? 8 : type == QMM_Q5_0 ? 16 : 0, has_min = type == QMM_Q4_1 || type == QMM_Q5_1;
    const int nb = K / 32;
    float32x4_t acc[TILE_M];
    for (int r = 0; r < R; r++) acc[r] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        int8x16_t wc[TILE_N][2];
        uint16_t dh[TILE_N], mh[TILE_N];
        for (int c = 0; c < TILE_N; c++) {
            const uint8_t *blk = w[c] + (size_t)b * bb;
            decode32(type, blk, wc[c]);
            dh[c] = u16_at(blk);
            mh[c] = has_min ? u16_at(blk + 2) : 0;
        }
        const float32x4_t dw = f16x4(dh), mw = has_min ? f16x4(mh) : vdupq_n_f32(0.0f);
        for (int r = 0; r < R; r++) {
            const int8_t *qr = q + (size_t)r * K + 32 * b;
            const int8x16_t q0 = vld1q_s8(qr), q1 = vld1q_s8(qr + 16);
            int32x4_t p[TILE_N];
            for (int c = 0; c < TILE_N; c++) p[c] = vdotq_s32(vdotq_s32(vdupq_n_s32(0), wc[c][0], q0), wc[c][1], q1);
            const int32x4_t dot = reduce4(p);
            const int16_t *sr = s + (size_t)r * (K / 16) + 2 * b;
            const int32_t sx = sr[0] + sr[1];
            const float32x4_t dx = vdupq_n_f32(d[(size_t)r * nb + b]);
            if (has_min)
                acc[r] = vaddq_f32(acc[r], vaddq_f32(vmulq_f32(vmulq_f32(dx, dw), vcvtq_f32_s32(dot)),
                                                     vmulq_f32(vmulq_f32(dx, mw), vdupq_n_f32((float)sx))));
            else
                acc[r] = vaddq_f32(acc[r], vmulq_f32(vmulq_f32(dx, dw), vcvtq_f32_s32(vsubq_s32(dot, vdupq_n_s32(z * sx)))));
        }
    }
    for (int r = 0; r < R; r++) vst1q_f32(y + (size_t)r * ldy, acc[r]);
}

/* ---- Q4_K, Q5_K: 8 sub-blocks of 32, 6-bit scales and mins ---- */

/* Y[r, 4 columns]: acc += (dx*d) * (float)(sum_j sc_j*dot_j) - (dx*dmin) * (float)(sum_j m_j*sx_j) */
INLINE void tile_k45(const int type, const int R, const uint8_t *const w[TILE_N], int K, const int8_t *q,
                     const float *d, const int16_t *s, float *y, int ldy) {
    const int bb = type == QMM_Q4_K ? 144 : 176, qs_at = type == QMM_Q4_K ? 16 : 48, nb = K / 256;
    const uint8x16_t m4 = vdupq_n_u8(15), b16 = vdupq_n_u8(16);
    float32x4_t acc[TILE_M];
    for (int r = 0; r < R; r++) acc[r] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk[TILE_N];
        uint8_t scm[2][TILE_N][8];                                    /* [scales, mins][column][sub-block] */
        uint16_t dh[TILE_N], mh[TILE_N];
        for (int c = 0; c < TILE_N; c++) {
            blk[c] = w[c] + (size_t)b * bb;
            qmm_k4_scales(blk[c] + 4, scm[0][c], scm[1][c]);
            dh[c] = u16_at(blk[c]);
            mh[c] = u16_at(blk[c] + 2);
        }
        int32x4_t sc4[8], mn4[8];                                     /* lane c: column c's scale (min) of sub-block j */
        for (int k = 0; k < 2; k++) {
            const uint8x16x2_t t = vld1q_u8_x2(&scm[k][0][0]);
            widen_u8(vqtbl2q_u8(t, vld1q_u8(tr8_idx[0])), k ? mn4 : sc4);
            widen_u8(vqtbl2q_u8(t, vld1q_u8(tr8_idx[1])), k ? mn4 + 4 : sc4 + 4);
        }
        int32x4_t isum[TILE_M];
        for (int r = 0; r < R; r++) isum[r] = vdupq_n_s32(0);
        for (int j2 = 0; j2 < 4; j2++) {                              /* 32 bytes: sub-blocks 2*j2 (low), 2*j2+1 (high) */
            int8x16_t lo[TILE_N][2], hi[TILE_N][2];
            for (int c = 0; c < TILE_N; c++) {
                const uint8_t *qs = blk[c] + qs_at + 32 * j2;
                for (int h = 0; h < 2; h++) {
                    const uint8x16_t v = vld1q_u8(qs + 16 * h);
                    uint8x16_t l = vandq_u8(v, m4), u = vshrq_n_u8(v, 4);
                    if (type == QMM_Q5_K) {                           /* sub-block i's fifth bits: bit i of qh[l] */
                        const uint8x16_t qh = vld1q_u8(blk[c] + 16 + 16 * h);
                        l = vorrq_u8(l, vandq_u8(vtstq_u8(qh, vdupq_n_u8((uint8_t)(1u << (2 * j2)))), b16));
                        u = vorrq_u8(u, vandq_u8(vtstq_u8(qh, vdupq_n_u8((uint8_t)(2u << (2 * j2)))), b16));
                    }
                    lo[c][h] = vreinterpretq_s8_u8(l);
                    hi[c][h] = vreinterpretq_s8_u8(u);
                }
            }
            for (int r = 0; r < R; r++) {
                const int8_t *qr = q + (size_t)r * K + 256 * b + 64 * j2;
                const int8x16_t q0 = vld1q_s8(qr), q1 = vld1q_s8(qr + 16), q2 = vld1q_s8(qr + 32), q3 = vld1q_s8(qr + 48);
                int32x4_t pl[TILE_N], ph[TILE_N];
                for (int c = 0; c < TILE_N; c++) {
                    pl[c] = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo[c][0], q0), lo[c][1], q1);
                    ph[c] = vdotq_s32(vdotq_s32(vdupq_n_s32(0), hi[c][0], q2), hi[c][1], q3);
                }
                isum[r] = vmlaq_s32(isum[r], reduce4(pl), sc4[2 * j2]);
                isum[r] = vmlaq_s32(isum[r], reduce4(ph), sc4[2 * j2 + 1]);
            }
        }
        const float32x4_t dw = f16x4(dh), mw = f16x4(mh);
        for (int r = 0; r < R; r++) {
            const int16_t *sr = s + (size_t)r * (K / 16) + 16 * b;
            int32x4_t msum = vdupq_n_s32(0);
            for (int j = 0; j < 8; j++) msum = vmlaq_n_s32(msum, mn4[j], sr[2 * j] + sr[2 * j + 1]);
            const float32x4_t dx = vdupq_n_f32(d[(size_t)r * nb + b]);
            acc[r] = vaddq_f32(acc[r], vsubq_f32(vmulq_f32(vmulq_f32(dx, dw), vcvtq_f32_s32(isum[r])),
                                                 vmulq_f32(vmulq_f32(dx, mw), vcvtq_f32_s32(msum))));
        }
    }
    for (int r = 0; r < R; r++) vst1q_f32(y + (size_t)r * ldy, acc[r]);
}

/* ---- Q6_K: 16 sub-blocks of 16, int8 scales, codes 0..63 with the zero point 32 ---- */

/* Y[r, 4 columns]: acc += (dx*d) * (float)(sum_j sc_j*(dot_j - 32*sx_j)) */
INLINE void tile_q6k(const int R, const uint8_t *const w[TILE_N], int K, const int8_t *q, const float *d,
                     const int16_t *s, float *y, int ldy) {
    static const uint8_t tr16_idx[4][16] = {{0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51},
                                            {4, 20, 36, 52, 5, 21, 37, 53, 6, 22, 38, 54, 7, 23, 39, 55},
                                            {8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59},
                                            {12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63}};
    const int nb = K / 256;
    const uint8x16_t m4 = vdupq_n_u8(15), m30 = vdupq_n_u8(0x30);
    float32x4_t acc[TILE_M];
    for (int r = 0; r < R; r++) acc[r] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk[TILE_N];
        uint16_t dh[TILE_N];
        for (int c = 0; c < TILE_N; c++) {
            blk[c] = w[c] + (size_t)b * 210;
            dh[c] = u16_at(blk[c] + 208);
        }
        int32x4_t sc4[16];                                            /* lane c: column c's scale of sub-block j */
        const uint8x16x4_t t = {{vld1q_u8(blk[0] + 192), vld1q_u8(blk[1] + 192), vld1q_u8(blk[2] + 192),
                                 vld1q_u8(blk[3] + 192)}};
        for (int k = 0; k < 4; k++) widen_s8(vreinterpretq_s8_u8(vqtbl4q_u8(t, vld1q_u8(tr16_idx[k]))), sc4 + 4 * k);
        int32x4_t isum[TILE_M];
        for (int r = 0; r < R; r++) isum[r] = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++)                                   /* halves of 128: four runs of 32 each */
            for (int k = 0; k < 4; k++) {                             /* run k: weights 128h+32k .. +31 */
                int8x16_t x[TILE_N][2];
                for (int c = 0; c < TILE_N; c++) {
                    const uint8_t *ql = blk[c] + 64 * h + (k & 1) * 32, *qh = blk[c] + 128 + 32 * h;
                    for (int i = 0; i < 2; i++) {
                        const uint8x16_t l = vld1q_u8(ql + 16 * i), u = vld1q_u8(qh + 16 * i);
                        const uint8x16_t low = k < 2 ? vandq_u8(l, m4) : vshrq_n_u8(l, 4);
                        const uint8x16_t high = k == 0 ? vshlq_n_u8(u, 4) : k == 1 ? vshlq_n_u8(u, 2)
                                                : k == 2 ? u : vshrq_n_u8(u, 2);   /* bits 2k, 2k+1 -> 4, 5 */
                        x[c][i] = vreinterpretq_s8_u8(vorrq_u8(low, vandq_u8(high, m30)));
                    }
                }
                const int j = 8 * h + 2 * k;                          /* x[c][0]: sub-block j, x[c][1]: j + 1 */
                for (int r = 0; r < R; r++) {
                    const int8_t *qr = q + (size_t)r * K + 256 * b + 128 * h + 32 * k;
                    const int8x16_t q0 = vld1q_s8(qr), q1 = vld1q_s8(qr + 16);
                    const int16_t *sr = s + (size_t)r * (K / 16) + 16 * b + j;
                    int32x4_t p0[TILE_N], p1[TILE_N];
                    for (int c = 0; c < TILE_N; c++) {
                        p0[c] = vdotq_s32(vdupq_n_s32(0), x[c][0], q0);
                        p1[c] = vdotq_s32(vdupq_n_s32(0), x[c][1], q1);
                    }
                    isum[r] = vmlaq_s32(isum[r], vsubq_s32(reduce4(p0), vdupq_n_s32(32 * sr[0])), sc4[j]);
                    isum[r] = vmlaq_s32(isum[r], vsubq_s32(reduce4(p1), vdupq_n_s32(32 * sr[1])), sc4[j + 1]);
                }
            }
        const float32x4_t dw = f16x4(dh);
        for (int r = 0; r < R; r++) {
            const float32x4_t dx = vdupq_n_f32(d[(size_t)r * nb + b]);
            acc[r] = vaddq_f32(acc[r], vmulq_f32(vmulq_f32(dx, dw), vcvtq_f32_s32(isum[r])));
        }
    }
    for (int r = 0; r < R; r++) vst1q_f32(y + (size_t)r * ldy, acc[r]);
}

/* one tile: the type and the row count become constants of an inlined copy each */
#define BY_ROWS(CALL)                                                                                                 \
    switch (R) {                                                                                                      \
    case 1: CALL(1); break;                                                                                           \
    case 2: CALL(2); break;                                                                                           \
    case 3: CALL(3); break;                                                                                           \
    default: CALL(4); break;                                                                                          \
    }

static void tile(int type, int R, const uint8_t *const w[TILE_N], int K, const int8_t *q, const float *d,
                 const int16_t *s, float *y, int ldy) {
#define T32(T, RR) tile32(T, RR, w, K, q, d, s, y, ldy)
#define C_Q4_0(RR) T32(QMM_Q4_0, RR)
#define C_Q4_1(RR) T32(QMM_Q4_1, RR)
#define C_Q5_0(RR) T32(QMM_Q5_0, RR)
#define C_Q5_1(RR) T32(QMM_Q5_1, RR)
#define C_Q8_0(RR) T32(QMM_Q8_0, RR)
#define C_Q4_K(RR) tile_k45(QMM_Q4_K, RR, w, K, q, d, s, y, ldy)
#define C_Q5_K(RR) tile_k45(QMM_Q5_K, RR, w, K, q, d, s, y, ldy)
#define C_Q6_K(RR) tile_q6k(RR, w, K, q, d, s, y, ldy)
    switch (type) {
    case QMM_Q4_0: BY_ROWS(C_Q4_0) break;
    case QMM_Q4_1: BY_ROWS(C_Q4_1) break;
    case QMM_Q5_0: BY_ROWS(C_Q5_0) break;
    case QMM_Q5_1: BY_ROWS(C_Q5_1) break;
    case QMM_Q8_0: BY_ROWS(C_Q8_0) break;
    case QMM_Q4_K: BY_ROWS(C_Q4_K) break;
    case QMM_Q5_K: BY_ROWS(C_Q5_K) break;
    case QMM_Q6_K: BY_ROWS(C_Q6_K) break;
    }
}

void qmm_gemm_neon_dotprod(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0,
                           int n1) {
    const size_t row = (size_t)(K / qmm_block_weights[type]) * qmm_block_bytes[type];
    int n = n0;
    for (; n + TILE_N <= n1; n += TILE_N) {
        const uint8_t *const w[TILE_N] = {W + n * row, W + (n + 1) * row, W + (n + 2) * row, W + (n + 3) * row};
        for (int m0 = 0; m0 < M; m0 += TILE_M)
            tile(type, M - m0 < TILE_M ? M - m0 : TILE_M, w, K, x->q + (size_t)m0 * K, x->d + (size_t)m0 * (K / x->B),
                 x->s + (size_t)m0 * (K / 16), Y + (size_t)m0 * ldy + n, ldy);
    }
    if (n < n1) qmm_gemm_ref(type, W, K, x, M, Y, ldy, n, n1);     /* the tail: fewer columns than a tile */
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
typedef int qmm_neon_not_aarch64;      /* ISO C wants a declaration in every translation unit */
#endif
