/*
 * layernorm.cu - fused residual + LayerNorm, post-LN as both references:
 *
 *   x = LN(x + (r + rb)) * w + b,   LN(u) = (u - mean) / sqrt(var + eps)
 *
 * with the biased variance, eps the model's (model_t.ln_eps: PyTorch's 1e-5,
 * Keras' 1e-3 for par-transformer-xl-tf); rb (the second linear layer's
 * bias) may be NULL; r float, or bfloat16 (gpu_add_layernorm_b: a bf16
 * step's Wo and fc2 output).
 * The mean and the variance are summed in double as core's
 * ops_add_layernorm does (in float in GPU_BF16's warp kernel). Rows of 128
 * to 1024 floats (a multiple of 128, the rows 16-byte aligned; the weights
 * and biases any float's alignment, as they lie in the model's file) take
 * a warp each, the row in registers (float4 loads, warp shuffles, no shared
 * memory); others a block each. In GPU_BF16 the
 * result is also written, rounded, to xb: the next linear layer's input.
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

/* 4 of the residual's elements (float, or bfloat16: gpu_add_layernorm_b;
 * one at a time: gpu_internal.cuh's ldf) */
static __device__ __forceinline__ float4 ln_ld4(const float *p) { return __ldcg((const float4 *)p); }
static __device__ __forceinline__ float4 ln_ld4(const bf16 *p)
{
    const uint2 u = __ldcg((const uint2 *)p);
    const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

template <typename R>
__global__ static void add_layernorm_kernel(float *x, bf16 *xb, const R *r, const float *rb, const float *w, const float *b,
                                            int d, double eps)
{
    __shared__ double scratch[32];
    float *row = x + (size_t)blockIdx.x * d;
    const R *rr = r + (size_t)blockIdx.x * d;
    double s = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float t = rb ? ldf(rr + j) + rb[j] : ldf(rr + j);
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

/* P[4c .. 4c + 3] through the read-only cache, P 4-byte aligned (a model's
 * weights lie in its arena as the file has them) */
static __device__ __forceinline__ float4 ldg4(const float *p, int c)
{
    p += 4 * c;
    return make_float4(__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3));
}

#define LN_ROWS 4   /* rows a block of ln_warp_kernel (a warp each) */

/* A warp a row of d = 128 NV floats: lane L holds the float4s L + 32 k. With
 * R NULL it is LayerNorm alone (layernorm_to), from X into Y (may be X).
 * The weights, biases and rb are read before the sums, off their path. S:
 * the sums' type, double (float32 steps, as core) or float (GPU_BF16, whose
 * output is rounded to bfloat16 for the next layer: the double sums' chain
 * of dependent adds, square root and division was the kernel's time). */
template <int NV, typename S, typename R>
__global__ static void __launch_bounds__(LN_ROWS * 32)
    ln_warp_kernel(float *y, bf16 *yb, const float *x, const R *r, const float *rb, const float *w, const float *b, int n,
                   double eps, bool keep_sum)
{
    const int row = blockIdx.x * LN_ROWS + (threadIdx.x >> 5), lane = threadIdx.x & 31, d = 128 * NV;
    pdl_next();
    if (row >= n) return;
    const float4 *xr = (const float4 *)(x + (size_t)row * d);
    float4 u[NV], ww[NV], bv[NV], rbv[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {   /* the weights: before the kernel ahead has ended (pdl_launch) */
        const int c = lane + 32 * k;
        ww[k] = ldg4(w, c);
        bv[k] = b ? ldg4(b, c) : make_float4(0, 0, 0, 0);
        rbv[k] = r && rb ? ldg4(rb, c) : make_float4(0, 0, 0, 0);
    }
    pdl_wait();
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int c = lane + 32 * k;
        float4 v = __ldcg(xr + c);
        if (r) {
            float4 t = ln_ld4(r + (size_t)row * d + 4 * c);
            t.x += rbv[k].x, t.y += rbv[k].y, t.z += rbv[k].z, t.w += rbv[k].w;
            v.x += t.x, v.y += t.y, v.z += t.z, v.w += t.w;
        }
        u[k] = v;
    }
    S s = 0;
#pragma unroll
    for (int k = 0; k < NV; k++) s += (S)u[k].x + (S)u[k].y + (S)u[k].z + (S)u[k].w;
    const S mean = warp_sum(s) / d;
    S q = 0;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const S a = u[k].x - mean, bb = u[k].y - mean, c = u[k].z - mean, e = u[k].w - mean;
        q += a * a + bb * bb + c * c + e * e;
    }
    const S inv = (S)1 / sqrt(warp_sum(q) / d + (S)eps);
    float4 *yr = (float4 *)(y + (size_t)row * d);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int c = lane + 32 * k;
        float4 o;
        o.x = (float)((u[k].x - mean) * inv) * ww[k].x + bv[k].x;
        o.y = (float)((u[k].y - mean) * inv) * ww[k].y + bv[k].y;
        o.z = (float)((u[k].z - mean) * inv) * ww[k].z + bv[k].z;
        o.w = (float)((u[k].w - mean) * inv) * ww[k].w + bv[k].w;
        if (keep_sum || !yb) yr[c] = o;
        if (yb) {
            __nv_bfloat162 *p = (__nv_bfloat162 *)(yb + (size_t)row * d + 4 * c);
            p[0] = __floats2bfloat162_rn(o.x, o.y);
            p[1] = __floats2bfloat162_rn(o.z, o.w);
        }
    }
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* The warp kernel when the shapes allow it: 1 if it ran. */
template <typename R>
static int ln_warp(gpu_model *g, float *y, bf16 *yb, const float *x, const R *r, const float *rb, const float *w,
                   const float *b, int n, int d, bool keep_sum, char *err)
{
    /* (the weights and rb: any float's alignment, read a float at a time) */
    if (d % 128 || d > 1024 || !al16(y) || !al16(x) || ((uintptr_t)r & (4 * sizeof(R) - 1)) || ((uintptr_t)yb & 7))
        return 0;
    const unsigned grid = (unsigned)((n + LN_ROWS - 1) / LN_ROWS);
    const double eps = g->m->ln_eps;
    switch (d / 128) {
#define LN_CASE(k)                                                                                                     \
    case k:                                                                                                            \
        if (g->prec == GPU_BF16)                                                                                       \
            CU_TRY(pdl_launch(g, ln_warp_kernel<k, float, R>, dim3(grid), dim3(LN_ROWS * 32), 0, y, yb, x, r, rb, w, b, \
                              n, eps, keep_sum),                                                                       \
                   err, "layernorm (a warp a row)");                                                                   \
        else                                                                                                           \
            ln_warp_kernel<k, double, R><<<grid, LN_ROWS * 32, 0, g->stream>>>(y, yb, x, r, rb, w, b, n, eps, keep_sum);\
        break;
        LN_CASE(1) LN_CASE(2) LN_CASE(3) LN_CASE(4) LN_CASE(5) LN_CASE(6) LN_CASE(7) LN_CASE(8)
#undef LN_CASE
    }
    LAUNCH_TRY(err, "layernorm (a warp a row)");
    return 1;
}

template <typename R>
static int add_layernorm(gpu_model *g, float *x, bf16 *xb, const R *r, const float *rb, const float *w, const float *b,
                         int n, int d, char *err)
{
    const int wr = ln_warp<R>(g, x, xb, x, r, rb, w, b, n, d, true, err);
    if (wr) return wr < 0 ? -1 : 0;
    int threads = d >= 512 ? 256 : d >= 128 ? 128 : 64;
    add_layernorm_kernel<R><<<n, threads, 0, g->stream>>>(x, xb, r, rb, w, b, d, g->m->ln_eps);
    LAUNCH_TRY(err, "add_layernorm");
    return 0;
}

int gpu_add_layernorm(gpu_model *g, float *x, bf16 *xb, const float *r, const float *rb, const float *w,
                      const float *b, int n, int d, char *err)
{
    return add_layernorm<float>(g, x, xb, r, rb, w, b, n, d, err);
}

int gpu_add_layernorm_b(gpu_model *g, float *x, bf16 *xb, const bf16 *r, const float *rb, const float *w, const float *b,
                        int n, int d, char *err)
{
    return add_layernorm<bf16>(g, x, xb, r, rb, w, b, n, d, err);
}

int gpu_layernorm_keep(gpu_model *g, float *x, bf16 *xb, const float *w, const float *b, int n, int d, char *err)
{
    const int wr = ln_warp<float>(g, x, xb, x, NULL, NULL, w, b, n, d, true, err);
    if (wr) return wr < 0 ? -1 : 0;
    /* (rows past the warp kernel's 1,024: in place, then the bf16 copy) */
    return gpu_layernorm_to(g, x, NULL, x, w, b, n, d, err) || gpu_to_bf16(g, xb, x, (size_t)n * d, err) ? -1 : 0;
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
    /* (r NULL: aligned; yb set: y is not written, as the block kernel) */
    const int wr = ln_warp<float>(g, y, yb, x, NULL, NULL, w, b, n, d, false, err);
    if (wr) return wr < 0 ? -1 : 0;
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
