/* tests/kernels/test_rowwise.py's AArch64 harness: SwiGLU by kernels/native/qmm_ops.c's reference on the rows of a
 * file (int32 T, int32 F, then float32 gate_up [T, 2F]), the result (float32 [T, F]) written to another. */
#include <stdio.h>
#include <stdlib.h>
#include "qmm.h"

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    int dims[2];
    if (!in || !out || fread(dims, sizeof dims, 1, in) != 1) return 3;
    const size_t n = (size_t)dims[0] * dims[1];
    float *gu = malloc(2 * n * sizeof(float)), *y = malloc(n * sizeof(float));
    if (!gu || !y || fread(gu, sizeof(float), 2 * n, in) != 2 * n) return 4;
    qmm_swiglu(gu, dims[0], dims[1], y);
    return fwrite(y, sizeof(float), n, out) == n && fclose(out) == 0 ? 0 : 5;
}
