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

/* The same, four floats a thread (d a multiple of 4, y and b 16-byte
 * aligned), the column by a 32-bit remainder: the 64-bit one per element
 * above cost more than the bytes. */
__global__ static void bias_relu4_kernel(float *y, bf16 *yb, const float *b, unsigned total4, unsigned d4)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total4) return;
    float4 v = ((const float4 *)y)[i];
    if (b) {
        const float4 q = __ldg((const float4 *)b + i % d4);
        v.x += q.x, v.y += q.y, v.z += q.z, v.w += q.w;
    }
    v.x = v.x < 0.0f ? 0.0f : v.x;
    v.y = v.y < 0.0f ? 0.0f : v.y;
    v.z = v.z < 0.0f ? 0.0f : v.z;
    v.w = v.w < 0.0f ? 0.0f : v.w;
    if (yb) {
        __nv_bfloat162 *p = (__nv_bfloat162 *)(yb + (size_t)i * 4);
        p[0] = __floats2bfloat162_rn(v.x, v.y);
        p[1] = __floats2bfloat162_rn(v.z, v.w);
    } else
        ((float4 *)y)[i] = v;
}

int gpu_bias_relu(gpu_model *g, float *y, bf16 *yb, const float *b, int n, int d, char *err)
{
    if (d % 4 == 0 && (size_t)n * d / 4 < 0xFFFFFFFFu && ((uintptr_t)y & 15) == 0 && ((uintptr_t)b & 15) == 0 &&
        ((uintptr_t)yb & 7) == 0) {
        const unsigned t4 = (unsigned)((size_t)n * d / 4);
        bias_relu4_kernel<<<(t4 + 255) / 256, 256, 0, g->stream>>>(y, yb, b, t4, (unsigned)(d / 4));
        LAUNCH_TRY(err, "bias_relu");
        return 0;
    }
    size_t total = (size_t)n * d;
    bias_relu_kernel<<<(unsigned)((total + 255) / 256), 256, 0, g->stream>>>(y, yb, b, total, d);
    LAUNCH_TRY(err, "bias_relu");
    return 0;
}
