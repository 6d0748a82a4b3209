/*
 * embed.cu - token embedding: x[n] = emb[tok[n]] * scale (scale sqrt(D) for
 * PAR Transformer-XL, 1 for adaptive-span), and in bfloat16 into xb for
 * the first linear layer when the model runs in GPU_BF16. One thread per
 * element.
 */
#include "gpu_internal.cuh"

__global__ static void embed_kernel(float *x, bf16 *xb, const float *emb, const int32_t *tok, int n, int d,
                                    float scale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * d) return;
    size_t r = i / d, c = i % d;
    const float v = emb[(size_t)tok[r] * d + c] * scale;
    x[i] = v;
    if (xb) xb[i] = __float2bfloat16(v);
}

int gpu_embed(gpu_model *g, float *x, bf16 *xb, const float *emb, const int32_t *tok, int n, int d, float scale,
              char *err)
{
    size_t total = (size_t)n * d;
    embed_kernel<<<(unsigned)((total + 255) / 256), 256, 0, g->stream>>>(x, xb, emb, tok, n, d, scale);
    LAUNCH_TRY(err, "embed");
    return 0;
}
