/*
 * matmul.cu - the linear layers, through cuBLAS in float32.
 *
 *   y[n x out] = x[n x in] W^T,  W out x in (PyTorch's Linear layout),
 *
 * all row-major. cuBLAS is column-major: a row-major y is its column-major
 * transpose, so this is y^T = W x^T, i.e. C (out x n) = op(W)=T (out x in)
 * times x^T (in x n). The handle's math mode (gpu.cu) keeps float32
 * products in float32, no TF32: results agree with the CPU's sgemm to float
 * rounding.
 */
#include "gpu_internal.cuh"

int gpu_linear(gpu_model *g, float *y, const float *x, const float *W, int n, int in, int out, char *err)
{
    const float one = 1.0f, zero = 0.0f;
    if (n <= 0 || out <= 0) return 0;
    BLAS_TRY(cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W, in, x, in, &zero, y, out), err,
             "cublasSgemm");
    return 0;
}
