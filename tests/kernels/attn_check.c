/* The native attention's reference (kernels/native/attn.c) run on one pass read from a file, its outputs written to
 * another: tests/kernels/test_attention_arm.py runs it under qemu-aarch64 and compares the bits with x86's.
 * Input: int32 T R H KVH D S C P W interleaved f16, float scale, then qkv [T, (H+2KVH)D], cos sin cos_s sin_s
 * [T, D/2] each, mask [R, N], path [T, W] int64 (W > 0), recent_k recent_v [KVH, P, D], sink_k sink_v [S, KVH, D],
 * ring_k ring_v [C, KVH, D] (pools in float16 when f16). Output: o [R, H D] float32, new_k new_v [KVH, T, D]. */
#include <stdio.h>
#include <stdlib.h>
#include "attn.h"

static void *take(FILE *f, size_t n) {
    void *p = calloc(n ? n : 1, 1);
    if (n && fread(p, 1, n, f) != n) { fprintf(stderr, "short input\n"); exit(2); }
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: attn_check IN OUT\n"); return 2; }
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    if (!in || !out) { perror("open"); return 2; }
    int32_t d[11];
    attn_t a = {0};
    if (fread(d, 4, 11, in) != 11 || fread(&a.scale, 4, 1, in) != 1) { fprintf(stderr, "short header\n"); return 2; }
    a.T = d[0], a.R = d[1], a.H = d[2], a.KVH = d[3], a.D = d[4], a.S = d[5], a.C = d[6], a.P = d[7], a.W = d[8];
    a.interleaved = d[9], a.f16 = d[10];
    const size_t e = a.f16 ? 2 : 4, KD = (size_t)a.KVH * a.D, HD = (size_t)a.H * a.D;
    const int N = a.S + a.C + a.P + (a.W ? a.W : a.T);
    a.ldq = (int)(HD + 2 * KD), a.ldn = a.T, a.ldo = (int)HD;
    a.qkv = take(in, 4 * (size_t)a.T * a.ldq);
    a.cos = take(in, 4 * (size_t)a.T * a.D / 2), a.sin = take(in, 4 * (size_t)a.T * a.D / 2);
    a.cos_s = take(in, 4 * (size_t)a.T * a.D / 2), a.sin_s = take(in, 4 * (size_t)a.T * a.D / 2);
    a.mask = take(in, 4 * (size_t)a.R * N);
    a.path = a.W ? take(in, 8 * (size_t)a.T * a.W) : NULL;
    a.recent_k = take(in, e * a.P * KD), a.recent_v = take(in, e * a.P * KD);
    a.sink_k = take(in, e * a.S * KD), a.sink_v = take(in, e * a.S * KD);
    a.ring_k = take(in, e * a.C * KD), a.ring_v = take(in, e * a.C * KD);
    a.new_k = calloc(e * KD * a.T, 1), a.new_v = calloc(e * KD * a.T, 1);
    a.o = calloc(4 * (size_t)a.R * HD, 1);
    a.scratch = calloc(4 * (size_t)attn_scratch_floats(a.R, a.H, a.D, N), 1);
    attn_prepare(&a);
    attn_unit_ref(&a, 0, 1);
    fwrite(a.o, 4, (size_t)a.R * HD, out);
    fwrite(a.new_k, e, KD * a.T, out);
    fwrite(a.new_v, e, KD * a.T, out);
    fclose(out);
    printf("attn_check: %d rows of %d heads over %d columns\n", a.R, a.H, N);
    return 0;
}
