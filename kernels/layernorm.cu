/*
 * layernorm.cu - fused residual + LayerNorm, post-LN as both references:
 *
 *   x = LN(x + (r + rb)) * w + b,   LN(u) = (u - mean) / sqrt(var + 1e-5)
 *
 * with the biased variance; rb (the second linear layer's bias) may be NULL.
 * One block per row; the row is updated in place, then the mean and the
 * variance are summed in double as core's ops_add_layernorm does. In
 * GPU_BF16 the result is also written, rounded, to xb: the next linear
 * layer's input.
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

__global__ static void add_layernorm_kernel(float *x, bf16 *xb, const float *r, const float *rb, const float *w,
                                            const float *b, int d)
{
    __shared__ double scratch[32];
    float *row = x + (size_t)blockIdx.x * d;
    const float *rr = r + (size_t)blockIdx.x * d;
    double s = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float t = rb ? rr[j] + rb[j] : rr[j];
        float u = row[j] + t;
        row[j] = u;
        s += u;
    }
    const double mean = block_sum(s, scratch) / d;
    double v = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        double c = row[j] - mean;
        v += c * c;
    }
    const double inv = 1.0 / sqrt(block_sum(v, scratch) / d + 1e-5);
    bf16 *rowb = xb ? xb + (size_t)blockIdx.x * d : NULL;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float y = (float)((row[j] - mean) * inv) * w[j] + b[j];
        row[j] = y;
        if (rowb) rowb[j] = __float2bfloat16(y);
    }
}

int gpu_add_layernorm(gpu_model *g, float *x, bf16 *xb, const float *r, const float *rb, const float *w,
                      const float *b, int n, int d, char *err)
{
    int threads = d >= 512 ? 256 : d >= 128 ? 128 : 64;
    add_layernorm_kernel<<<n, threads, 0, g->stream>>>(x, xb, r, rb, w, b, d);
    LAUNCH_TRY(err, "add_layernorm");
    return 0;
}
