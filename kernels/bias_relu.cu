/*
 * bias_relu.cu - the feed-forward's glue: y = max(y + b, 0), rows of d, in
 * place on the first linear layer's output (as core's ops_linear then
 * ops_relu: the bias added in float, then the clamp; b NULL: none). In
 * GPU_BF16 the result goes, rounded, to the second linear layer's bfloat16
 * input yb instead. (gelu.cu: the same with GELU.)
 */
#include "gpu_internal.cuh"

__global__ static void bias_relu_kernel(float *y, bf16 *yb, const float *b, size_t total, int d)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float v = b ? y[i] + b[i % d] : y[i];
    v = v < 0.0f ? 0.0f : v;
    if (yb) yb[i] = __float2bfloat16(v);
    else y[i] = v;
}

int gpu_bias_relu(gpu_model *g, float *y, bf16 *yb, const float *b, int n, int d, char *err)
{
    size_t total = (size_t)n * d;
    bias_relu_kernel<<<(unsigned)((total + 255) / 256), 256, 0, g->stream>>>(y, yb, b, total, d);
    LAUNCH_TRY(err, "bias_relu");
    return 0;
}
