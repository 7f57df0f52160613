/* The scalar reference: what every SIMD path must equal bit for bit (qmm.h), and the one activation quantizer.
 * Written for reading, not speed: each block is decoded to its integer codes, then combined in qmm.h's order. */
#include <math.h>
#include <float.h>
#include "qmm.h"

const int qmm_block_bytes[QMM_NTYPES] = {18, 20, 22, 24, 34, 144, 176, 210};
const int qmm_block_weights[QMM_NTYPES] = {32, 32, 32, 32, 32, 256, 256, 256};

void qmm_quantize(const float *x, int M, int K, int B, int8_t *q, float *d, int16_t *s) {
    for (int b = 0; b < M * K / B; b++, x += B, q += B) {
        float amax = 0.0f;
        int finite = 1;
        for (int i = 0; i < B; i++) {
            float a = fabsf(x[i]);
            if (!(a <= FLT_MAX)) finite = 0;                 /* NaN or infinity */
            else if (a > amax) amax = a;
        }
        if (!finite || amax == 0.0f) {
            memset(q, 0, (size_t)B);
            d[b] = finite ? 0.0f : NAN;
        } else {
            float id = 127.0f / amax;
            for (int i = 0; i < B; i++) {
                float v = nearbyintf(x[i] * id);            /* round to nearest even (the default mode) */
                q[i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v);
            }
            d[b] = amax / 127.0f;
            if (B == 32 && d[b] <= 65504.0f)               /* as llama.cpp's Q8_0/Q8_1 store it: float16 */
                d[b] = (float)(_Float16)d[b];
        }
        for (int j = 0; j < B / 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += q[16 * j + i];
            s[b * (B / 16) + j] = (int16_t)sum;
        }
    }
}

void qmm_codes(int type, const uint8_t *blk, int32_t *c) {
    switch (type) {
    case QMM_Q4_0: case QMM_Q4_1: {
        const uint8_t *qs = type == QMM_Q4_0 ? ((const blk_q4_0 *)blk)->qs : ((const blk_q4_1 *)blk)->qs;
        for (int j = 0; j < 16; j++) { c[j] = qs[j] & 15; c[j + 16] = qs[j] >> 4; }
        break;
    }
    case QMM_Q5_0: case QMM_Q5_1: {
        const uint8_t *qs = type == QMM_Q5_0 ? ((const blk_q5_0 *)blk)->qs : ((const blk_q5_1 *)blk)->qs;
        const uint8_t *hb = type == QMM_Q5_0 ? ((const blk_q5_0 *)blk)->qh : ((const blk_q5_1 *)blk)->qh;
        uint32_t qh;
        memcpy(&qh, hb, 4);                                  /* bit j: weight j's fifth bit */
        for (int j = 0; j < 16; j++) {
            c[j] = (qs[j] & 15) | (((qh >> j) & 1) << 4);
            c[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        }
        break;
    }
    case QMM_Q8_0:
        for (int j = 0; j < 32; j++) c[j] = ((const blk_q8_0 *)blk)->qs[j];
        break;
    case QMM_Q4_K: case QMM_Q5_K: {                       /* 64 weights a 32 bytes: low nibbles, then high */
        const uint8_t *qs = type == QMM_Q4_K ? ((const blk_q4_k *)blk)->qs : ((const blk_q5_k *)blk)->qs;
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                c[64 * j + l] = qs[32 * j + l] & 15;
                c[64 * j + 32 + l] = qs[32 * j + l] >> 4;
            }
        if (type == QMM_Q5_K) {                            /* sub-block i's fifth bits: bit i of qh[0..31] */
            const uint8_t *qh = ((const blk_q5_k *)blk)->qh;
            for (int i = 0; i < 8; i++)
                for (int l = 0; l < 32; l++) c[32 * i + l] |= ((qh[l] >> i) & 1) << 4;
        }
        break;
    }
    case QMM_Q6_K: {                                      /* two halves of 128: four runs of 32 each */
        const blk_q6_k *b6 = (const blk_q6_k *)blk;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b6->ql + 64 * h, *qh = b6->qh + 32 * h;
            int32_t *o = c + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (ql[l] & 15) | (((qh[l] >> 0) & 3) << 4);
                o[l + 32] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
                o[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                o[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        break;
    }
    }
}

static int32_t dot(const int32_t *c, const int8_t *q, int n) {
    int32_t sum = 0;
    for (int i = 0; i < n; i++) sum += c[i] * q[i];
    return sum;
}

static int32_t sums(const int16_t *s, int n) {       /* n consecutive 16-value sums */
    int32_t sum = 0;
    for (int i = 0; i < n; i++) sum += s[i];
    return sum;
}

/* One output element: row q/d/s of the activations against one weight row. */
static float element(int type, const uint8_t *w, int K, const int8_t *q, const float *d, const int16_t *s) {
    const int bw = qmm_block_weights[type], bb = qmm_block_bytes[type];
    int32_t c[256];
    float acc = 0.0f;
    for (int b = 0; b < K / bw; b++, w += bb, q += bw, s += bw / 16) {
        const float dx = d[b];
        qmm_codes(type, w, c);
        switch (type) {
        case QMM_Q4_0: case QMM_Q5_0: case QMM_Q8_0: {
            const int z = type == QMM_Q4_0 ? 8 : type == QMM_Q5_0 ? 16 : 0;
            const float dw = qmm_f16(((const uint16_t *)w)[0]);
            acc += (dx * dw) * (float)(dot(c, q, 32) - z * sums(s, 2));
            break;
        }
        case QMM_Q4_1: case QMM_Q5_1: {
            const float dw = qmm_f16(((const uint16_t *)w)[0]), mw = qmm_f16(((const uint16_t *)w)[1]);
            acc += (dx * dw) * (float)dot(c, q, 32) + (dx * mw) * (float)sums(s, 2);
            break;
        }
        case QMM_Q4_K: case QMM_Q5_K: {
            const blk_q4_k *k4 = (const blk_q4_k *)w;        /* d, dmin, scales sit alike in Q5_K */
            uint8_t sc[8], mn[8];
            qmm_k4_scales(k4->scales, sc, mn);
            int32_t isum = 0, msum = 0;
            for (int j = 0; j < 8; j++) {
                isum += sc[j] * dot(c + 32 * j, q + 32 * j, 32);
                msum += mn[j] * sums(s + 2 * j, 2);
            }
            acc += (dx * qmm_f16(k4->d)) * (float)isum - (dx * qmm_f16(k4->dmin)) * (float)msum;
            break;
        }
        case QMM_Q6_K: {
            const blk_q6_k *b6 = (const blk_q6_k *)w;
            int32_t isum = 0;
            for (int j = 0; j < 16; j++) isum += b6->scales[j] * (dot(c + 16 * j, q + 16 * j, 16) - 32 * s[j]);
            acc += (dx * qmm_f16(b6->d)) * (float)isum;
            break;
        }
        }
    }
    return acc;
}

void qmm_gemm_ref(int type, const uint8_t *W, int K, const qmm_act *x, int M, float *Y, int ldy, int n0, int n1) {
    const size_t row = (size_t)(K / qmm_block_weights[type]) * qmm_block_bytes[type];
    for (int n = n0; n < n1; n++)
        for (int m = 0; m < M; m++)
            Y[(size_t)m * ldy + n] = element(type, W + n * row, K, x->q + (size_t)m * K, x->d + (size_t)m * (K / x->B),
                                             x->s + (size_t)m * (K / 16));
}
