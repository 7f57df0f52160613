/* The reference path of the native attention (attn.h), and what every path shares: the rotation of the new rows and
 * the new K/V stored in the pool's type. Compiled for the family's baseline (SSE2 on x86-64, NEON on AArch64). */
#include <math.h>
#include <string.h>
#include "attn.h"
#include "qmm.h"

/* float32 -> float16 bits, rounded to nearest, ties to even (as numpy's astype and F16C's vcvtps2ph) */
static uint16_t f16_of(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
    if (ax >= 0x477ff000) return (uint16_t)(sign | 0x7c00);        /* from 65520 on: rounds past 65504 */
    if (ax < 0x38800000) {                                         /* below 2^-14: a subnormal (or zero) */
        float v, t;
        memcpy(&v, &ax, 4);
        t = v * 16777216.0f + 8388608.0f;                         /* units of 2^-24, rounded by the addition */
        uint32_t bits;
        memcpy(&bits, &t, 4);
        return (uint16_t)(sign | (bits - 0x4b000000));
    }
    const uint32_t r = ax - (112u << 23);                          /* rebias 127 -> 15 */
    return (uint16_t)(sign | ((r + 0xfff + ((r >> 13) & 1)) >> 13));
}

static void rotate(const float *x, const float *cos, const float *sin, int heads, int D, int interleaved, float *y) {
    const int half = D / 2;
    for (int h = 0; h < heads; h++, x += D, y += D)
        for (int i = 0; i < half; i++) {
            const int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
            const float xa = x[ia], xb = x[ib];
            y[ia] = xa * cos[i] - xb * sin[i];
            y[ib] = xb * cos[i] + xa * sin[i];
        }
}

static void store(const attn_t *a, void *pool, int h, int t, const float *x) {
    const long at = ((long)h * a->ldn + t) * a->D;
    if (!a->f16) {
        memcpy((float *)pool + at, x, sizeof(float) * (size_t)a->D);
        return;
    }
    for (int d = 0; d < a->D; d++) ((uint16_t *)pool)[at + d] = f16_of(x[d]);
}

void attn_prepare(const attn_t *a) {
    const int H = a->H, KVH = a->KVH, D = a->D, half = D / 2;
    float k[KVH * D];
    for (int t = 0; t < a->T; t++) {
        const float *row = a->qkv + (long)t * a->ldq;
        rotate(row + H * D, a->cos + (long)t * half, a->sin + (long)t * half, KVH, D, a->interleaved, k);
        for (int h = 0; h < KVH; h++) {
            store(a, a->new_k, h, t, k + h * D);
            store(a, a->new_v, h, t, row + (H + KVH) * D + h * D);
        }
        if (t >= a->R) continue;
        rotate(row, a->cos + (long)t * half, a->sin + (long)t * half, H, D, a->interleaved,
               a->scratch + (long)t * H * D);
        if (a->S)
            rotate(row, a->cos_s + (long)t * half, a->sin_s + (long)t * half, H, D, a->interleaved,
                   a->scratch + (long)(a->R + t) * H * D);
    }
}

static inline void f16_row(float *y, const uint16_t *x, int D) {
    for (int d = 0; d < D; d++) y[d] = qmm_f16(x[d]);
}

/* ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), lane j summing d = j mod 8 in order of d; a float16 key
 * converted once for the G heads */
static inline void dots(const float *q, int G, int D, const void *k, long stride, int n, float *s, int N,
                        const float *m, float scale, int f16) {
    float kb[D];
    for (int j = 0; j < n; j++) {
        if (!(m[j] > ATTN_NEG_HALF)) {
            for (int g = 0; g < G; g++) s[(long)g * N + j] = -INFINITY;
            continue;
        }
        const float *key = (const float *)k + (long)j * stride;
        if (f16) {
            f16_row(kb, (const uint16_t *)k + (long)j * stride, D);
            key = kb;
        }
        for (int g = 0; g < G; g++) {
            const float *qg = q + (long)g * D;
            float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int d = 0; d < D; d += 8)
                for (int i = 0; i < 8; i++) l[i] = l[i] + qg[d + i] * key[d + i];
            s[(long)g * N + j] = (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))) * scale + m[j];
        }
    }
}

/* o[g][d] + e_j v_j[d] in column order, a value converted once for the G heads */
static inline void values(float *o, int G, int D, const float *e, int N, const void *v, long stride, int n, int f16) {
    float vb[D];
    for (int j = 0; j < n; j++) {
        const float *vj = (const float *)v + (long)j * stride;
        if (f16) {
            f16_row(vb, (const uint16_t *)v + (long)j * stride, D);
            vj = vb;
        }
        for (int g = 0; g < G; g++) {
            const float w = e[(long)g * N + j];
            if (w == 0.0f) continue;
            for (int d = 0; d < D; d++) o[(long)g * D + d] = o[(long)g * D + d] + w * vj[d];
        }
    }
}

static inline void exp_row(float *s, int n, float mx) {
    for (int c = 0; c < n; c++) s[c] = attn_exp(s[c] - mx);
}

#define ATTN_UNIT attn_unit_ref
#define ATTN_DOTS dots
#define ATTN_VALUES values
#define ATTN_EXP_ROW exp_row
#include "attn_body.h"
