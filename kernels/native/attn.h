/* The native pass's attention: one stream's rows of one layer against [sink slots | ring slots | recent | new rows].
 *
 * Owns the order of every floating-point operation of a row's attention (attn_body.h, compiled once for each path),
 * the rotation of the layer's new queries and keys, and the new rows' K/V in the pool's type. Never decides what a
 * row sees: the mask and the path the runner made say it (models/runner.py), as they do for the ONNX graph.
 *
 * For query row r, query head h = kvh*G + g (kvh its key/value head), and each column c of the row's mask:
 *   key c: sink slot c (c < S; scored by the query rotated with the sink tables), ring slot c - S (c < S + C),
 *          recent position c - S - C (c < S + C + P), then new row c - S - C - P (a chain) or new row
 *          path[r][c - S - C - P] (a tree); new rows' keys as the pool stores them (rounded to its type first).
 *   visible when mask[r][c] > NEG/2 (a masked column weighs exactly 0 in the graph's softmax too, so it is skipped);
 *   s_c = dot(q, k_c) * scale + mask[r][c], dot in 8 lanes (lane j sums d = j mod 8 in order of d, then
 *         ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)));
 *   m = max s_c; e_c = attn_exp(s_c - m) (below); sum = e_0 + e_1 + ... in column order;
 *   o[d] = (e_0 v_0[d] + e_1 v_1[d] + ...) in column order (columns with e_c == 0 skipped), then o[d] / sum.
 * Rotation, per pair (a, b) of a head (interleaved: (2i, 2i+1); else (i, i + D/2)) and the row's cos/sin:
 *   (a cos - b sin, b cos + a sin). Compiled without contraction (-ffp-contract=off): no fused multiply-add.
 * A row's bits therefore depend only on its own query and the columns it sees, never on the rows beside it, the
 * threads or the path (every path runs this text; a float16 pool's values convert to float32 exactly).
 */
#ifndef RINGSPEC_ATTN_H
#define RINGSPEC_ATTN_H

#include <stdint.h>
#include <string.h>

typedef struct {
    int T, R;                   /* rows in the pass (rotated, stored as new K/V), of which the first R are queried */
    int H, KVH, D, S, C, P, W;  /* heads, kv heads, head size, sink slots, ring slots read, recent, tree width (0) */
    int interleaved, f16;       /* rotation pairing; the pools' type is float16 (else float32) */
    float scale;
    const float *qkv;           /* [T, ldq]: Q (H*D) | K (KVH*D) | V (KVH*D) of each row, bias added */
    int ldq;
    const float *cos, *sin, *cos_s, *sin_s;   /* [T, D/2] each: the rows' tables, and their sink tables (S > 0) */
    const float *mask;          /* [R, N]: N = S + C + P + (W ? W : T) */
    const int64_t *path;        /* [T, W] (a tree) or NULL */
    const void *recent_k, *recent_v;          /* [KVH, P, D] */
    const void *sink_k, *sink_v;              /* [S, KVH, D] */
    const void *ring_k, *ring_v;              /* [C, KVH, D] */
    void *new_k, *new_v;        /* out: [KVH, ldn rows, D], this stream's rows at 0..T */
    int ldn;
    float *o;                   /* out: [R, ldo], heads side by side */
    int ldo;
    float *scratch;             /* attn_scratch_floats(...) floats */
} attn_t;

/* exp(x) for x <= 0 from +, * and exponent bits only, so every path computes it alike (cephes' expf: x = n ln2 + r,
 * ln2 in two parts, a degree-6 polynomial in r, times 2^n); 0 below -87 (2^-126: exp is < 1.7e-38 there, and a
 * softmax's largest term is 1). Within 2 ulp of exp on [-87, 0]. */
#define ATTN_EXP_MIN (-87.0f)
#define ATTN_LOG2E 1.44269504088896341f
#define ATTN_ROUND 12582912.0f  /* 1.5 * 2^23: x + it - it rounds x to an integer, ties to even, for |x| < 2^22 */
#define ATTN_LN2_HI 0.693359375f
#define ATTN_LN2_LO (-2.12194440e-4f)
#define ATTN_P0 1.9875691500e-4f
#define ATTN_P1 1.3981999507e-3f
#define ATTN_P2 8.3334519073e-3f
#define ATTN_P3 4.1665795894e-2f
#define ATTN_P4 1.6666665459e-1f
#define ATTN_P5 5.0000001201e-1f

static inline float attn_exp(float x) {
    if (!(x >= ATTN_EXP_MIN)) return 0.0f;
    const float n = (x * ATTN_LOG2E + ATTN_ROUND) - ATTN_ROUND;
    const float r = (x - n * ATTN_LN2_HI) - n * ATTN_LN2_LO;
    float p = ATTN_P0;
    p = p * r + ATTN_P1;
    p = p * r + ATTN_P2;
    p = p * r + ATTN_P3;
    p = p * r + ATTN_P4;
    p = p * r + ATTN_P5;
    p = (p * (r * r) + r) + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;             /* 2^n: n >= -126 wherever x >= -87 */
    float two_n;
    memcpy(&two_n, &bits, 4);
    return p * two_n;
}

#define ATTN_NEG_HALF (-5e29f)  /* NEG/2, NEG = -1e30 (kernels/ring.py): a column is visible when its mask is above */

/* floats of scratch a call needs: the rotated queries (both tables), a score row and a sum per query row and head */
static inline long attn_scratch_floats(int R, int H, int D, int N) {
    return 2L * R * H * D + (long)R * H * N + (long)R * H;
}

/* Rotate the rows' queries and keys, store the new K/V (attn->new_k/new_v) and the queries (scratch). */
void attn_prepare(const attn_t *a);
/* Unit u of n: the (row, query head) pairs split between units, each pair in one unit; after attn_prepare. */
typedef void (*attn_unit_fn)(const attn_t *a, int u, int n);
void attn_unit_ref(const attn_t *a, int u, int n);
#if defined(__x86_64__)
void attn_unit_avx2(const attn_t *a, int u, int n);
#endif

#endif
