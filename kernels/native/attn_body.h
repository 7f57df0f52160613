/* The text of a unit of attention (attn.h states its order of operations), included once a path: attn.c compiles it
 * for any CPU of the family (the reference), attn_avx2.c for AVX2 with F16C. What a path gives it:
 *   ATTN_UNIT     the function's name
 *   ATTN_DOTS     (q, G, D, k, stride, n, s, N, m, scale, f16): a run of n columns whose keys sit `stride` values
 *                 apart from k (float16 if f16, else float32): for g < G, j < n: s[g N + j] = dot(q + g D, key j) *
 *                 scale + m[j] in attn.h's order, or -inf where m[j] is not above ATTN_NEG_HALF
 *   ATTN_EXP_ROW  (s, n, mx): s[c] = attn_exp(s[c] - mx) for c < n (attn.h)
 *   ATTN_VALUES   (o, G, D, e, N, v, stride, n, f16): a run of n columns, values `stride` apart from v: for g < G,
 *                 d < D: o[g D + d] += e[g N + j] * value j [d] for j < n in order, skipping e == 0
 * each the reference's operations in the reference's order, so the paths' bits are equal. */

/* the value at element `at` of a pool of the call's type */
static inline const void *attn_at(const attn_t *a, const void *pool, long at) {
    return (const char *)pool + at * (a->f16 ? 2 : 4);
}

/* mx[i] = the largest of row i's n values (a NaN never taken), for the first n4 <= 4 rows of s [n4, n] */
static inline void attn_max4(const float *s, int n, int n4, float mx[4]) {
    const float *s1 = s + (n4 > 1 ? n : 0), *s2 = s + (n4 > 2 ? 2L * n : 0), *s3 = s + (n4 > 3 ? 3L * n : 0);
    float m0 = mx[0], m1 = mx[1], m2 = mx[2], m3 = mx[3];
    for (int c = 0; c < n; c++) {            /* rows past n4 read row 0 again, their maxima unused */
        m0 = s[c] > m0 ? s[c] : m0;
        m1 = s1[c] > m1 ? s1[c] : m1;
        m2 = s2[c] > m2 ? s2[c] : m2;
        m3 = s3[c] > m3 ? s3[c] : m3;
    }
    mx[0] = m0, mx[1] = m1, mx[2] = m2, mx[3] = m3;
}

/* sum[i] = row i's n values added in column order, for the first n4 <= 4 rows of s [n4, n] */
static inline void attn_sum4(const float *s, int n, int n4, float sum[4]) {
    const float *s1 = s + (n4 > 1 ? n : 0), *s2 = s + (n4 > 2 ? 2L * n : 0), *s3 = s + (n4 > 3 ? 3L * n : 0);
    float t0 = sum[0], t1 = sum[1], t2 = sum[2], t3 = sum[3];
    for (int c = 0; c < n; c++) {
        t0 += s[c];
        t1 += s1[c];
        t2 += s2[c];
        t3 += s3[c];
    }
    sum[0] = t0, sum[1] = t1, sum[2] = t2, sum[3] = t3;
}

/* Unit u of n takes a run of the items (kv head h, query row r, query head g of h's group), in that order: each
 * (row, query head) is computed whole by one unit, however the items fall. */
void ATTN_UNIT(const attn_t *a, int u, int n) {
    const int H = a->H, KVH = a->KVH, D = a->D, G = H / KVH, R = a->R;
    const int N = a->S + a->C + a->P + (a->W ? a->W : a->T);
    const long per_head = (long)R * G, items = KVH * per_head, i0 = items * u / n, i1 = items * (u + 1) / n;
    const float *q = a->scratch, *q_sink = a->scratch + (long)R * H * D;
    float *scores = a->scratch + 2L * R * H * D, *sums = scores + (long)R * H * N;
    for (long i = i0; i < i1;) {
        const int h = (int)(i / per_head);
        const long end = i1 < (h + 1) * per_head ? i1 : (h + 1) * per_head;   /* this unit's items of head h */
        const long first = i - h * per_head, last = end - 1 - h * per_head;
        i += last - first + 1;
        const int r0 = (int)(first / G), r1 = (int)(last / G) + 1, g_first = (int)(first % G), g_last = (int)(last % G);
#define G0(r) ((r) == r0 ? g_first : 0)
#define G1(r) ((r) == r1 - 1 ? g_last + 1 : G)
        /* scores: s = dot * scale + mask, or -inf where masked; a run of columns from one pool at a time */
        for (int r = r0; r < r1; r++) {
            const int S = a->S, C = a->C, P = a->P, g0 = G0(r), nG = G1(r) - g0;
            const long at = (long)r * H * D + (long)(h * G + g0) * D;
            float *s = scores + ((long)r * H + (long)h * G + g0) * N;
            const float *m = a->mask + (long)r * N;
            if (S)
                ATTN_DOTS(q_sink + at, nG, D, attn_at(a, a->sink_k, (long)h * D), (long)KVH * D, S, s, N, m, a->scale,
                          a->f16);
            if (C)
                ATTN_DOTS(q + at, nG, D, attn_at(a, a->ring_k, (long)h * D), (long)KVH * D, C, s + S, N, m + S,
                          a->scale, a->f16);
            if (P)
                ATTN_DOTS(q + at, nG, D, attn_at(a, a->recent_k, (long)h * P * D), D, P, s + S + C, N, m + S + C,
                          a->scale, a->f16);
            const int c = S + C + P;
            if (!a->W)
                ATTN_DOTS(q + at, nG, D, attn_at(a, a->new_k, (long)h * a->ldn * D), D, a->T, s + c, N, m + c,
                          a->scale, a->f16);
            else
                for (int j = 0; j < a->W; j++)      /* a tree: row r's path, a column at a time */
                    ATTN_DOTS(q + at, nG, D, attn_at(a, a->new_k, ((long)h * a->ldn + a->path[(long)r * a->W + j]) * D),
                              D, 1, s + c + j, N, m + c + j, a->scale, a->f16);
        }
        /* softmax weights in place: e = attn_exp(s - max), their sum in column order; the output rows zeroed. Four
         * heads' maxima and sums side by side, each in its own column order: four chains the adds' latency overlaps */
        for (int r = r0; r < r1; r++)
            for (int g = G0(r); g < G1(r); g += 4) {
                const int n4 = G1(r) - g < 4 ? G1(r) - g : 4;
                float *s = scores + ((long)r * H + (long)h * G + g) * N;
                float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                attn_max4(s, N, n4, mx);
                for (int i = 0; i < n4; i++) {
                    if (mx[i] == -INFINITY)
                        memset(s + (long)i * N, 0, sizeof(float) * (size_t)N);    /* its sum stays 0 */
                    else
                        ATTN_EXP_ROW(s + (long)i * N, N, mx[i]);
                    memset(a->o + (long)r * a->ldo + (long)(h * G + g + i) * D, 0, sizeof(float) * (size_t)D);
                }
                attn_sum4(s, N, n4, sum);
                for (int i = 0; i < n4; i++) sums[(long)r * H + h * G + g + i] = sum[i];
            }
        /* values: o += e_c * v_c in column order, a run of columns from one pool at a time */
        for (int r = r0; r < r1; r++) {
            const int S = a->S, C = a->C, P = a->P, g0 = G0(r), nG = G1(r) - g0;
            float *o = a->o + (long)r * a->ldo + (long)(h * G + g0) * D;
            const float *e = scores + ((long)r * H + (long)h * G + g0) * N;
            if (S)
                ATTN_VALUES(o, nG, D, e, N, attn_at(a, a->sink_v, (long)h * D), (long)KVH * D, S, a->f16);
            if (C)
                ATTN_VALUES(o, nG, D, e + S, N, attn_at(a, a->ring_v, (long)h * D), (long)KVH * D, C, a->f16);
            if (P)
                ATTN_VALUES(o, nG, D, e + S + C, N, attn_at(a, a->recent_v, (long)h * P * D), D, P, a->f16);
            const int c = S + C + P;
            if (!a->W)
                ATTN_VALUES(o, nG, D, e + c, N, attn_at(a, a->new_v, (long)h * a->ldn * D), D, a->T, a->f16);
            else
                for (int j = 0; j < a->W; j++)
                    ATTN_VALUES(o, nG, D, e + c + j, N,
                                attn_at(a, a->new_v, ((long)h * a->ldn + a->path[(long)r * a->W + j]) * D), D, 1, a->f16);
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
