/* The native pass's row-wise operations around the matmuls: RMSNorm, SwiGLU's gate, a token's table row, the
 * surprisal of a logit row. Each reads and writes one row at a time in one fixed order, so a row's bits do not depend
 * on the rows beside it. The formulas are ggml's (ggml-cpu/ops.cpp: rms_norm's sum in double, silu as
 * x / (1 + exp(-x))), so the pass stays close to llama.cpp's numbers; the code is ours. */
#include <math.h>
#include "qmm.h"

void qmm_rmsnorm(const float *x, const float *gamma, float eps, int T, int d, float *y) {
    for (int t = 0; t < T; t++, x += d, y += d) {
        double sum = 0.0;
        for (int i = 0; i < d; i++) sum += (double)x[i] * (double)x[i];
        const float scale = 1.0f / sqrtf((float)(sum / d) + eps);
        for (int i = 0; i < d; i++) y[i] = (x[i] * scale) * gamma[i];
    }
}

/* exp(x) by one formula every path spells the same way (qmm_avx2.c's `exp8`; qmm.h's constants): x = n ln2 + r
 * (Cody-Waite: n * QMM_EXP_C1 exact), exp(r) by Cephes' degree-5 polynomial (S. Moshier, expf.c), times 2^n through
 * the exponent's bits. 0 below QMM_EXP_LO (exp < 2^-125: 1 + exp(-g) is 1 there anyway), +inf above QMM_EXP_HI, a NaN
 * kept; within 2 ulp of exp between (tests/kernels/test_rowwise.py). As ggml's SIMD silu, not libm's expf: a few
 * multiplies and adds, the same in a vector as alone. */
float qmm_expf(float x) {
    if (x != x) return x;
    if (x > QMM_EXP_HI) return INFINITY;
    if (x < QMM_EXP_LO) return 0.0f;
    const float n = rintf(x * QMM_LOG2E);
    const float r = (x - n * QMM_EXP_C1) - n * QMM_EXP_C2;
    const float p = (((((QMM_EXP_P0 * r + QMM_EXP_P1) * r + QMM_EXP_P2) * r + QMM_EXP_P3) * r + QMM_EXP_P4) * r +
                     QMM_EXP_P5);
    const float y = (p * (r * r) + r) + 1.0f;
    const uint32_t bits = (uint32_t)((int)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* gate_up [T, 2F] (gate, then up) -> out [T, F] = silu(gate) * up, silu(g) = g / (1 + exp(-g)) */
void qmm_swiglu(const float *gu, int T, int F, float *out) {
    for (int t = 0; t < T; t++, gu += 2 * F, out += F)
        for (int i = 0; i < F; i++) {
            const float g = gu[i];
            out[i] = (g / (1.0f + qmm_expf(-g))) * gu[F + i];
        }
}

/* One block's weights as float32, as ggml's dequantize_row_* computes them: each a float16 scale times a code (exact
 * in float32), then at most one rounding operation (Q4_1/Q5_1's + m, the K-quants' - dmin * min). */
static void dequant_block(int type, const uint8_t *blk, float *y) {
    int32_t c[256];
    qmm_codes(type, blk, c);
    const uint16_t *h = (const uint16_t *)blk;
    switch (type) {
    case QMM_Q4_0: case QMM_Q5_0: case QMM_Q8_0: {
        const int z = type == QMM_Q4_0 ? 8 : type == QMM_Q5_0 ? 16 : 0;
        const float d = qmm_f16(h[0]);
        for (int j = 0; j < 32; j++) y[j] = d * (c[j] - z);
        break;
    }
    case QMM_Q4_1: case QMM_Q5_1: {
        const float d = qmm_f16(h[0]), m = qmm_f16(h[1]);
        for (int j = 0; j < 32; j++) y[j] = d * c[j] + m;
        break;
    }
    case QMM_Q4_K: case QMM_Q5_K: {                      /* d, dmin, scales sit alike in Q5_K */
        const blk_q4_k *k4 = (const blk_q4_k *)blk;
        uint8_t sc[8], mn[8];
        qmm_k4_scales(k4->scales, sc, mn);
        const float d = qmm_f16(k4->d), dmin = qmm_f16(k4->dmin);
        for (int s = 0; s < 8; s++) {
            const float d1 = d * sc[s], m1 = dmin * mn[s];
            for (int l = 0; l < 32; l++) y[32 * s + l] = d1 * c[32 * s + l] - m1;
        }
        break;
    }
    case QMM_Q6_K: {
        const blk_q6_k *b6 = (const blk_q6_k *)blk;
        const float d = qmm_f16(b6->d);
        for (int i = 0; i < 256; i++) y[i] = d * b6->scales[i / 16] * (c[i] - 32);
        break;
    }
    }
}

/* rows ids[0..T) of a table W [V, K] in `type` blocks -> out [T, K] float32 */
void qmm_rows(int type, const uint8_t *W, int K, const int64_t *ids, int T, float *out) {
    const size_t row = (size_t)(K / qmm_block_weights[type]) * qmm_block_bytes[type];
    for (int t = 0; t < T; t++)
        for (int b = 0; b < K / qmm_block_weights[type]; b++)
            dequant_block(type, W + (size_t)ids[t] * row + (size_t)b * qmm_block_bytes[type],
                          out + (size_t)t * K + (size_t)b * qmm_block_weights[type]);
}

/* nll[m] = -log softmax(logits[m])[targets[m]]: the max, then the sum of exponentials in double, in column order */
void qmm_nll(const float *logits, int M, int V, int ld, const int64_t *targets, float *nll) {
    for (int m = 0; m < M; m++, logits += ld) {
        float mx = logits[0];
        for (int i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp((double)(logits[i] - mx));
        nll[m] = (float)(log(sum) - (double)(logits[targets[m]] - mx));
    }
}
