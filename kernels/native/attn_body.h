/* The text of a unit of attention (attn.h states its order of operations), included once a path: attn.c compiles it
 * for any CPU of the family (the reference), attn_avx2.c for AVX2 with F16C. What a path gives it:
 *   ATTN_UNIT     the function's name
 *   ATTN_F16_ROW  (y, x, D): float16 -> float32 of D values (exact on every path)
 *   ATTN_DOTS     (q, G, D, k, s, N, scale, m): s[g N] = dot(q + g D, k) * scale + m for g < G, dot in attn.h's order
 *   ATTN_EXP_ROW  (s, n, mx): s[c] = attn_exp(s[c] - mx) for c < n (attn.h)
 *   ATTN_VALUES   (o, G, D, e, N, v, n): for g < G, d < D: o[g D + d] += e[g N + j] * v[j][d] for j < n in order,
 *                 skipping e == 0 (a block of n columns)
 * each the reference's operations in the reference's order, so the paths' bits are equal. */

/* key (kind 0) or value (kind 1) of column c for query row r, as float32: a pointer into the pool (float32) or into
 * buf (float16, converted) */
static inline const float *attn_column(const attn_t *a, int kind, int h, int c, int r, float *buf) {
    const int S = a->S, C = a->C, P = a->P, KVH = a->KVH, D = a->D;
    const void *base;
    long at;
    if (c < S) {
        base = kind ? a->sink_v : a->sink_k, at = ((long)c * KVH + h) * D;
    } else if (c < S + C) {
        base = kind ? a->ring_v : a->ring_k, at = ((long)(c - S) * KVH + h) * D;
    } else if (c < S + C + P) {
        base = kind ? a->recent_v : a->recent_k, at = ((long)h * P + (c - S - C)) * D;
    } else {
        const int j = c - S - C - P;
        base = kind ? a->new_v : a->new_k, at = ((long)h * a->ldn + (a->W ? a->path[(long)r * a->W + j] : j)) * D;
    }
    if (!a->f16) return (const float *)base + at;
    ATTN_F16_ROW(buf, (const uint16_t *)base + at, D);
    return buf;
}

/* Unit u of n takes a run of the items (kv head h, query row r, query head g of h's group), in that order: each
 * (row, query head) is computed whole by one unit, however the items fall. */
void ATTN_UNIT(const attn_t *a, int u, int n) {
    const int H = a->H, KVH = a->KVH, D = a->D, G = H / KVH, R = a->R;
    const int N = a->S + a->C + a->P + (a->W ? a->W : a->T), shared_end = a->W ? a->S + a->C + a->P : N;
    const long per_head = (long)R * G, items = KVH * per_head, i0 = items * u / n, i1 = items * (u + 1) / n;
    const float *q = a->scratch, *q_sink = a->scratch + (long)R * H * D;
    float *scores = a->scratch + 2L * R * H * D, *sums = scores + (long)R * H * N;
    float *kbuf = sums + (long)R * H + (long)u * (ATTN_BLOCK + 2) * D, *vblock = kbuf + D;
    float *zeros = vblock + ATTN_BLOCK * D;
    const float *vp[ATTN_BLOCK];
    memset(zeros, 0, sizeof(float) * (size_t)D);
    const float neg_half = -5e29f;              /* NEG/2: NEG (kernels/ring.py) = -1e30 */
    for (long i = i0; i < i1;) {
        const int h = (int)(i / per_head);
        const long end = i1 < (h + 1) * per_head ? i1 : (h + 1) * per_head;   /* this unit's items of head h */
        const long first = i - h * per_head, last = end - 1 - h * per_head;
        i += last - first + 1;
        const int r0 = (int)(first / G), r1 = (int)(last / G) + 1, g_first = (int)(first % G), g_last = (int)(last % G);
#define G0(r) ((r) == r0 ? g_first : 0)
#define G1(r) ((r) == r1 - 1 ? g_last + 1 : G)
        /* scores: s = dot * scale + mask, or -inf where masked */
        for (int c = 0; c < N; c++) {
            const float *k = NULL;
            for (int r = r0; r < r1; r++) {
                const int g0 = G0(r), g1 = G1(r);
                const float m = a->mask[(long)r * N + c];
                float *s = scores + ((long)r * H + (long)h * G) * N + c;
                if (!(m > neg_half)) {
                    for (int g = g0; g < g1; g++) s[(long)g * N] = -INFINITY;
                    continue;
                }
                if (!k || c >= shared_end) k = attn_column(a, 0, h, c, r, kbuf);
                ATTN_DOTS((c < a->S ? q_sink : q) + (long)r * H * D + (long)(h * G + g0) * D, g1 - g0, D, k,
                          s + (long)g0 * N, N, a->scale, m);
            }
        }
        /* softmax weights in place: e = attn_exp(s - max), their sum in column order; the output rows zeroed */
        for (int r = r0; r < r1; r++)
            for (int g = G0(r); g < G1(r); g++) {
                float *s = scores + ((long)r * H + (long)h * G + g) * N, mx = -INFINITY, sum = 0.0f;
                for (int c = 0; c < N; c++) mx = s[c] > mx ? s[c] : mx;
                if (mx == -INFINITY) {
                    memset(s, 0, sizeof(float) * (size_t)N);
                } else {
                    ATTN_EXP_ROW(s, N, mx);
                    for (int c = 0; c < N; c++) sum += s[c];
                }
                sums[(long)r * H + h * G + g] = sum;
                memset(a->o + (long)r * a->ldo + (long)(h * G + g) * D, 0, sizeof(float) * (size_t)D);
            }
        /* values: o += e_c * v_c in column order, a block of ATTN_BLOCK columns at a time (their values converted
         * once for every row of the unit when they are shared) */
        for (int c0 = 0; c0 < N; c0 += ATTN_BLOCK) {
            const int n_c = N - c0 < ATTN_BLOCK ? N - c0 : ATTN_BLOCK;
            for (int j = 0; j < n_c; j++) {
                const int c = c0 + j;
                vp[j] = NULL;
                if (c >= shared_end) continue;
                for (int r = r0; r < r1 && !vp[j]; r++)
                    for (int g = G0(r); g < G1(r); g++)
                        if (scores[((long)r * H + (long)h * G + g) * N + c] != 0.0f) {
                            vp[j] = attn_column(a, 1, h, c, r, vblock + (long)j * D);
                            break;
                        }
                if (!vp[j]) vp[j] = zeros;              /* seen by no row here: every weight is 0, skipped */
            }
            for (int r = r0; r < r1; r++) {
                for (int j = 0; j < n_c; j++)
                    if (c0 + j >= shared_end) vp[j] = attn_column(a, 1, h, c0 + j, r, vblock + (long)j * D);
                ATTN_VALUES(a->o + (long)r * a->ldo + (long)(h * G + G0(r)) * D, G1(r) - G0(r), D,
                            scores + ((long)r * H + (long)h * G + G0(r)) * N + c0, N, vp, n_c);
            }
        }
        for (int r = r0; r < r1; r++)
            for (int g = G0(r); g < G1(r); g++) {
                const float sum = sums[(long)r * H + h * G + g];
                float *o = a->o + (long)r * a->ldo + (long)(h * G + g) * D;
                if (sum > 0.0f)
                    for (int d = 0; d < D; d++) o[d] = o[d] / sum;
            }
#undef G0
#undef G1
    }
}
