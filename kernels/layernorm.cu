/*
 * layernorm.cu - fused residual + LayerNorm, post-LN as both references:
 *
 *   x = LN(x + (r + rb)) * w + b,   LN(u) = (u - mean) / sqrt(var + eps)
 *
 * with the biased variance, eps the model's (model_t.ln_eps: PyTorch's 1e-5,
 * Keras' 1e-3 for par-transformer-xl-tf); rb (the second linear layer's
 * bias) may be NULL.
 * One block per row; the row is updated in place, then the mean and the
 * variance are summed in double as core's ops_add_layernorm does. In
 * GPU_BF16 the result is also written, rounded, to xb: the next linear
 * layer's input.
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

__global__ static void add_layernorm_kernel(float *x, bf16 *xb, const float *r, const float *rb, const float *w,
                                            const float *b, int d, double eps)
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
    const double inv = 1.0 / sqrt(block_sum(v, scratch) / d + eps);
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
    add_layernorm_kernel<<<n, threads, 0, g->stream>>>(x, xb, r, rb, w, b, d, g->m->ln_eps);
    LAUNCH_TRY(err, "add_layernorm");
    return 0;
}

/* pre-LN (a word-level Transformer-XL with pre_lnorm, the GPT window
 * models): the sublayer reads LN(x), the residual stream x is left as it is
 * (core/par.c: a copy, then ops_add_layernorm with no residual). b may be
 * NULL (a LayerNorm without bias: nanoGPT's bias=False), and y may be x (in
 * place: each thread rewrites only the values it read last). */
__global__ static void layernorm_to_kernel(float *y, bf16 *yb, const float *x, const float *w, const float *b, int d,
                                           double eps)
{
    __shared__ double scratch[32];
    const float *row = x + (size_t)blockIdx.x * d;
    double s = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) s += row[j];
    const double mean = block_sum(s, scratch) / d;
    double v = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        double c = row[j] - mean;
        v += c * c;
    }
    const double inv = 1.0 / sqrt(block_sum(v, scratch) / d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float o = (float)((row[j] - mean) * inv) * w[j] + (b ? b[j] : 0.0f);
        if (yb) yb[(size_t)blockIdx.x * d + j] = __float2bfloat16(o);
        else y[(size_t)blockIdx.x * d + j] = o;
    }
}

int gpu_layernorm_to(gpu_model *g, float *y, bf16 *yb, const float *x, const float *w, const float *b, int n, int d,
                     char *err)
{
    int threads = d >= 512 ? 256 : d >= 128 ? 128 : 64;
    layernorm_to_kernel<<<n, threads, 0, g->stream>>>(y, yb, x, w, b, d, g->m->ln_eps);
    LAUNCH_TRY(err, "layernorm_to");
    return 0;
}

/* x += r (+ rb), as core adds the sublayer's output (the bias first, as add_layernorm_kernel) */
__global__ static void add_residual_kernel(float *x, bf16 *xb, const float *r, const float *rb, int n, int d)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * d) return;
    const float t = rb ? r[i] + rb[i % d] : r[i];
    const float u = x[i] + t;
    x[i] = u;
    if (xb) xb[i] = __float2bfloat16(u);
}

int gpu_add_residual(gpu_model *g, float *x, bf16 *xb, const float *r, const float *rb, int n, int d, char *err)
{
    const size_t total = (size_t)n * d;
    add_residual_kernel<<<(unsigned)((total + 255) / 256), 256, 0, g->stream>>>(x, xb, r, rb, n, d);
    LAUNCH_TRY(err, "add_residual");
    return 0;
}
