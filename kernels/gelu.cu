/*
 * gelu.cu - nanoGPT's feed-forward glue: y = GELU(y + b), the exact (erf)
 * form
 *
 *   GELU(v) = v Phi(v) = 0.5 v (1 + erf(v / sqrt 2)),
 *
 * rows of d, in place on the first linear layer's output. As core's
 * ops_linear then ops_gelu: the bias (NULL: none) added in float, the GELU
 * in double, rounded to float once. In GPU_BF16 the result goes, rounded,
 * to the second linear layer's bfloat16 input yb instead. (bias_relu.cu:
 * the same with ReLU.)
 */
#include "gpu_internal.cuh"

__global__ static void bias_gelu_kernel(float *y, bf16 *yb, const float *b, size_t total, int d)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const float v = b ? y[i] + b[i % d] : y[i];
    const float o = (float)(0.5 * (double)v * (1.0 + erf((double)v * 0.70710678118654752440)));
    if (yb) yb[i] = __float2bfloat16(o);
    else y[i] = o;
}

int gpu_bias_gelu(gpu_model *g, float *y, bf16 *yb, const float *b, int n, int d, char *err)
{
    const size_t total = (size_t)n * d;
    if (total == 0) return 0;
    bias_gelu_kernel<<<(unsigned)((total + 255) / 256), 256, 0, g->stream>>>(y, yb, b, total, d);
    LAUNCH_TRY(err, "bias_gelu");
    return 0;
}
