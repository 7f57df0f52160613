/* ringspec's quantized matmul: Y[m, n] = sum_k X[m, k] * W[n, k], W in GGUF blocks exactly as stored.
 *
 * Owns the block layouts it reads (ggml-common.h's, as GGUF stores them), the activation quantization (one
 * implementation, qmm_quantize) and the order of every floating-point operation (the scalar reference, qmm_ref.c).
 * Never picks a kernel by the number of rows: a path is chosen by CPU features once, and every path computes each
 * output element with the same integer dot products (exact in any order) and the same float operations in the same
 * order as the reference, so its bits equal the reference's whatever the rows, threads or path.
 *
 * Activations: each row of X is quantized to int8 per block of B values (B = 32 for the 32-weight types, 256 for the
 * K-quants, as llama.cpp's Q8_0/Q8_1 and Q8_K), q = round-to-nearest-even(x * 127/amax) with the scale d = amax/127,
 * rounded to float16 for B = 32 as llama.cpp stores it there (unless past float16's range): |x - d*q| <= amax/254
 * per value, plus q's share of d's rounding (2^-11 relative) for B = 32. The int16 sums of q per 16 values carry
 * the formats' zero points and mins.
 *
 * Per output element, blocks in order, acc starting at 0.0f (dx: the activation block's scale; dot: the integer dot
 * product of the stored codes and q; sx: the sum of q over the weight block):
 *   Q4_0, Q5_0, Q8_0:   acc += (dx*d) * (float)(dot - z*sx)                 z = 8, 16, 0
 *   Q4_1, Q5_1:         acc += (dx*d) * (float)dot + (dx*m) * (float)sx
 *   Q4_K, Q5_K:         acc += (dx*d) * (float)(sum_j sc_j*dot_j) - (dx*dmin) * (float)(sum_j m_j*sx_j)   j: 8 x 32
 *   Q6_K:               acc += (dx*d) * (float)(sum_j sc_j*(dot_j - 32*sx_j))                            j: 16 x 16
 * compiled without contraction (-ffp-contract=off): no fused multiply-add anywhere.
 */
#ifndef RINGSPEC_QMM_H
#define RINGSPEC_QMM_H

#include <stdint.h>
#include <string.h>

enum qmm_type { QMM_Q4_0, QMM_Q4_1, QMM_Q5_0, QMM_Q5_1, QMM_Q8_0, QMM_Q4_K, QMM_Q5_K, QMM_Q6_K, QMM_NTYPES };
enum qmm_isa { QMM_SCALAR, QMM_AVX2, QMM_AVX512, QMM_AVX512_VNNI, QMM_NEON_DOTPROD, QMM_NISAS };

/* ggml-common.h's blocks, byte for byte (fp16 fields as raw uint16) */
typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;                                    /* 18 */
typedef struct { uint16_t d, m; uint8_t qs[16]; } blk_q4_1;                                 /* 20 */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;                     /* 22 */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_1;                  /* 24 */
typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;                                     /* 34 */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_k;        /* 144 */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_k;  /* 176 */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_k;          /* 210 */

extern const int qmm_block_bytes[QMM_NTYPES];     /* bytes a block */
extern const int qmm_block_weights[QMM_NTYPES];   /* weights a block: 32 or 256 */

/* Quantized activations of M rows of K values: row m's q at q + m*K, its scales at d + m*(K/B), sums at s + m*(K/16).
 * B is the block of the weight type's family (qmm_act_block). */
typedef struct {
    const int8_t *q;
    const float *d;
    const int16_t *s;
    int K, B;
} qmm_act;

static inline int qmm_act_block(int type) { return type >= QMM_Q4_K ? 256 : 32; }

/* x [M, K] float32 -> the caller's buffers q [M*K], d [M*K/B], s [M*K/16]. A block holding a NaN or an infinity gets
 * d = NaN (its outputs are NaN, as the float product would be). */
void qmm_quantize(const float *x, int M, int K, int B, int8_t *q, float *d, int16_t *s);

/* One block's integer codes as stored (unsigned, or int8 for Q8_0), weight order: the reference's reading of every
 * format, also the table rows' (qmm_ops.c). */
void qmm_codes(int type, const uint8_t *blk, int32_t *c);

/* Y[m*ldy + n] for n in [n0, n1), every m < M. W: N rows of K/block blocks. */
typedef void (*qmm_gemm_fn)(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0,
                            int n1);

void qmm_gemm_ref(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0, int n1);
#if defined(__x86_64__)
void qmm_gemm_avx512_vnni(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0,
                          int n1);
void qmm_gemm_avx2(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0, int n1);
#endif
#if defined(__aarch64__)
void qmm_gemm_neon_dotprod(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0,
                           int n1);
#endif

/* SwiGLU's exp, one formula (qmm_ops.c `qmm_expf`; qmm_avx2.c `exp8`: the same operations on these constants) */
#define QMM_EXP_HI 88.0f                   /* above: +inf (n <= 127 below it) */
#define QMM_EXP_LO -87.0f                  /* below: 0 (n >= -126 above it) */
#define QMM_LOG2E 1.44269504088896341f
#define QMM_EXP_C1 0.693359375f            /* ln 2 = C1 - C2, C1 with 9 significant bits */
#define QMM_EXP_C2 -2.12194440e-4f
#define QMM_EXP_P0 1.9875691500e-4f        /* Cephes expf.c's polynomial for exp(r), |r| <= ln2 / 2 */
#define QMM_EXP_P1 1.3981999507e-3f
#define QMM_EXP_P2 8.3334519073e-3f
#define QMM_EXP_P3 4.1665795894e-2f
#define QMM_EXP_P4 1.6666665459e-1f
#define QMM_EXP_P5 5.0000001201e-1f
float qmm_expf(float x);
void qmm_swiglu(const float *gu, int T, int F, float *out);
#if defined(__x86_64__)
void qmm_swiglu_avx2(const float *gu, int T, int F, float *out);
#endif

/* float16 bits -> float32, exactly (every float16 is a float32), without F16C */
static inline float qmm_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);                      /* inf, NaN */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);              /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign;                                                  /* zero */
    } else {                                                          /* subnormal: normalize */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K/Q5_K's twelve bytes -> eight 6-bit scales and eight 6-bit mins (ggml's get_scale_min_k4, four at a time) */
static inline void qmm_k4_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4); memcpy(&u1, s + 4, 4); memcpy(&u2, s + 8, 4);
    uint32_t a = u0 & 0x3f3f3f3f, b = (u2 & 0x0f0f0f0f) | ((u0 >> 2) & 0x30303030);
    uint32_t c = u1 & 0x3f3f3f3f, d = ((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 2) & 0x30303030);
    memcpy(sc, &a, 4); memcpy(sc + 4, &b, 4); memcpy(mn, &c, 4); memcpy(mn + 4, &d, 4);
}

#endif
