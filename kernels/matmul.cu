/*
 * matmul.cu - the linear layers, through cuBLAS.
 *
 *   y[n x out] = x[n x in] W^T,  W out x in (PyTorch's Linear layout),
 *
 * all row-major. cuBLAS is column-major: a row-major y is its column-major
 * transpose, so this is y^T = W x^T, i.e. C (out x n) = op(W)=T (out x in)
 * times x^T (in x n).
 *
 *   gpu_linear       float32 in and out. The handle's math mode (gpu.cu)
 *                    keeps the products in float32, no TF32: results agree
 *                    with the CPU's sgemm to float rounding.
 *   gpu_linear_bf16  bfloat16 x and W, float32 y, sums in float32
 *                    (CUBLAS_COMPUTE_32F: tensor cores); _out: y in
 *                    bfloat16 (the projections, whose keys and values go to
 *                    bfloat16 rings).
 *
 * A decode step multiplies a few rows (n <= GEMV_MAX_ROWS): cuBLAS's GEMM
 * kernels read the weights far below the memory's rate there (8 us for a
 * 1536 x 512 float32 matrix, 3 MB). gemv_kernel reads each weight row once
 * with 16-byte loads, one warp per output, the n rows of x beside it, and
 * sums in float32; it is taken when the shapes allow 16-byte loads. For the
 * feed-forward's first layer it also adds the bias and applies the ReLU
 * (gpu_linear_bias_relu), one launch fewer a layer. For more rows in bf16
 * that layer goes through cublasLt with the bias and the ReLU in the GEMM's
 * epilogue (gpu_linear_bias_relu_lt): the float product never goes to
 * memory (a step of 16 x 512 rows of par-base wrote and read 64 MB a
 * layer for it).
 */
#include "gpu_internal.cuh"

#define GEMV_MAX_ROWS 8
#define GEMV_WARPS 8

template <typename T, typename OT, int NR>
__global__ static void __launch_bounds__(32 * GEMV_WARPS)
    gemv_kernel(OT *y, const T *x, const T *W, const float *bias, int in, int out)
{
    constexpr int VEC = 16 / sizeof(T);
    const int lane = threadIdx.x & 31, o = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (o >= out) return;
    const T *w = W + (size_t)o * in;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
#pragma unroll 4
    for (int c = lane * VEC; c < in; c += 32 * VEC) {
        float wv[VEC], xv[VEC];
        unpack16(w + c, wv);
#pragma unroll
        for (int r = 0; r < NR; r++) {
            unpack16(x + (size_t)r * in + c, xv);
#pragma unroll
            for (int k = 0; k < VEC; k++) acc[r] = fmaf(wv[k], xv[k], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        float v = acc[r];
        for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
        if (bias) {   /* as bias_relu.cu: the bias added in float, then the clamp */
            v += bias[o];
            v = v < 0.0f ? 0.0f : v;
        }
        if (lane == 0) stf(y + (size_t)r * out + o, v);
    }
}

/* y = x W^T by gemv_kernel when n is small and 16-byte loads line up; 1 if
 * it ran, 0 if the shapes call for cuBLAS, -1 on a launch error. */
template <typename T, typename OT>
static int gemv(gpu_model *g, OT *y, const T *x, const T *W, int n, int in, int out, char *err,
                const float *bias = NULL)
{
    const int VEC = 16 / sizeof(T);
    if (n > GEMV_MAX_ROWS || in % VEC || ((uintptr_t)x | (uintptr_t)W) % 16) return 0;
    const unsigned blocks = (unsigned)((out + GEMV_WARPS - 1) / GEMV_WARPS), T_ = 32 * GEMV_WARPS;
    switch (n) {
    case 1: gemv_kernel<T, OT, 1><<<blocks, T_, 0, g->stream>>>(y, x, W, bias, in, out); break;
    case 2: gemv_kernel<T, OT, 2><<<blocks, T_, 0, g->stream>>>(y, x, W, bias, in, out); break;
    case 3: gemv_kernel<T, OT, 3><<<blocks, T_, 0, g->stream>>>(y, x, W, bias, in, out); break;
    case 4: gemv_kernel<T, OT, 4><<<blocks, T_, 0, g->stream>>>(y, x, W, bias, in, out); break;
    case 5: gemv_kernel<T, OT, 5><<<blocks, T_, 0, g->stream>>>(y, x, W, bias, in, out); break;
    case 6: gemv_kernel<T, OT, 6><<<blocks, T_, 0, g->stream>>>(y, x, W, bias, in, out); break;
    case 7: gemv_kernel<T, OT, 7><<<blocks, T_, 0, g->stream>>>(y, x, W, bias, in, out); break;
    default: gemv_kernel<T, OT, 8><<<blocks, T_, 0, g->stream>>>(y, x, W, bias, in, out); break;
    }
    LAUNCH_TRY(err, "gemv");
    return 1;
}

/* bf16, up to SK_MAX_ROWS rows (decode steps of many streams): cuBLAS's
 * kernels for so few rows keep few SMs streaming the weights (7-9 us a
 * layer of 512 x 2048 at 64 rows, where the weights take 0.4 us at the
 * memory's rate). skinny_kernel: a block of SK_WARPS warps a tile of NT = 8
 * NB outputs for every row, its warps each an eighth of the inputs, on the
 * tensor cores (mma.sync m16n8k16, bf16 in, float sums); a lane loads 16
 * consecutive inputs of a weight row and of its rows of x with two 16-byte
 * loads a row, and the inputs' order inside each 64 is permuted alike for
 * both operands (lane q's 16 inputs serve its fragment slots of all four
 * k-steps), so no shuffle or shared memory stands between the loads and the
 * products; the next 64's loads go out before this one's products (and the
 * first 64's weights before the kernel ahead has ended: pdl_launch). The
 * warps' sums meet in shared memory in a fixed order (the same bits every
 * run), then the epilogue: the bias and the ReLU where asked, float or bf16
 * out. */
#define SK_WARPS 8
#define SK_MAX_ROWS 64
#define SK_KCHUNK 64

static __device__ __forceinline__ unsigned u4w(const uint4 (&v)[2], int w)
{
    const uint4 &h = v[w >> 2];
    const int i = w & 3;
    return i == 0 ? h.x : i == 1 ? h.y : i == 2 ? h.z : h.w;
}

template <int NB> struct sk_chunk {
    uint4 a[4][2][2];   /* m-tile, row g / g + 8, the lane's 16 inputs */
    uint4 b[NB][2];     /* n-tile (output g of it), the lane's 16 inputs */
};

template <int NB>
static __device__ __forceinline__ void sk_load_w(sk_chunk<NB> &c, const bf16 *W, int in, int o0, int k, int g)
{
#pragma unroll
    for (int j = 0; j < NB; j++) {
        const bf16 *w = W + (size_t)(o0 + 8 * j + g) * in + k;
        c.b[j][0] = __ldg((const uint4 *)w);
        c.b[j][1] = __ldg((const uint4 *)w + 1);
    }
}

template <int NB>
static __device__ __forceinline__ void sk_load_x(sk_chunk<NB> &c, const bf16 *x, int n, int in, int k, int g, int mt)
{
    const uint4 z4 = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 16 * t + 8 * h + g;
            const bool ok = t < mt && r < n;
            const bf16 *xr = x + (size_t)(ok ? r : 0) * in + k;
            c.a[t][h][0] = ok ? __ldcg((const uint4 *)xr) : z4;
            c.a[t][h][1] = ok ? __ldcg((const uint4 *)xr + 1) : z4;
        }
}

template <int NB>
static __device__ __forceinline__ void sk_mma(float (&acc)[4][NB][4], const sk_chunk<NB> &c, int mt)
{
#pragma unroll
    for (int s = 0; s < 4; s++)
#pragma unroll
        for (int t = 0; t < 4; t++) {
            if (t >= mt) break;   /* (warp-uniform) */
            const unsigned a[4] = {u4w(c.a[t][0], 2 * s), u4w(c.a[t][1], 2 * s), u4w(c.a[t][0], 2 * s + 1),
                                   u4w(c.a[t][1], 2 * s + 1)};
#pragma unroll
            for (int j = 0; j < NB; j++) mma16816(acc[t][j], a, u4w(c.b[j], 2 * s), u4w(c.b[j], 2 * s + 1));
        }
}

template <typename OT, int NB>
__global__ static void __launch_bounds__(32 * SK_WARPS)
    skinny_kernel(OT *y, const bf16 *x, const bf16 *W, const float *bias, int n, int in, int out)
{
    constexpr int NT = 8 * NB;
    __shared__ float red[SK_WARPS][SK_MAX_ROWS * NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int o0 = blockIdx.x * NT, mt = (n + 15) / 16, per = in / SK_WARPS, k0 = warp * per + 16 * q;
    float acc[4][NB][4];
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int j = 0; j < NB; j++) acc[t][j][0] = acc[t][j][1] = acc[t][j][2] = acc[t][j][3] = 0.0f;
    sk_chunk<NB> cur, nxt;
    pdl_next();
    sk_load_w(cur, W, in, o0, k0, g);   /* (the weights: before the kernel ahead has ended) */
    pdl_wait();
    sk_load_x(cur, x, n, in, k0, g, mt);
    for (int k = SK_KCHUNK; k < per; k += SK_KCHUNK) {
        sk_load_w(nxt, W, in, o0, k0 + k, g);
        sk_load_x(nxt, x, n, in, k0 + k, g, mt);
        sk_mma(acc, cur, mt);
        cur = nxt;
    }
    sk_mma(acc, cur, mt);
    /* C fragment: rows g and g + 8 of the m-tile, outputs 2q and 2q + 1 of the n-tile */
#pragma unroll
    for (int t = 0; t < 4; t++) {
        if (t >= mt) break;
#pragma unroll
        for (int j = 0; j < NB; j++) {
            float *r0 = &red[warp][(16 * t + g) * NT + 8 * j + 2 * q], *r1 = r0 + 8 * NT;
            r0[0] = acc[t][j][0], r0[1] = acc[t][j][1], r1[0] = acc[t][j][2], r1[1] = acc[t][j][3];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n * NT; e += blockDim.x) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < SK_WARPS; w++) v += red[w][e];
        const int r = e / NT, o = o0 + e % NT;
        if (bias) {   /* as bias_relu.cu: the bias added in float, then the clamp */
            v += bias[o];
            v = v < 0.0f ? 0.0f : v;
        }
        stf(y + (size_t)r * out + o, v);
    }
}

/* y = x W^T (+ bias, ReLU) by skinny_kernel where the shapes allow it: 1 if
 * it ran, 0 if not, -1 on a launch error */
template <typename OT>
static int skinny(gpu_model *g, OT *y, const bf16 *x, const bf16 *W, int n, int in, int out, char *err,
                  const float *bias = NULL)
{
    if (n < 1 || n > SK_MAX_ROWS || in % (SK_WARPS * SK_KCHUNK) || out % 8 || ((uintptr_t)x | (uintptr_t)W) % 16)
        return 0;
    if (out % 16 == 0 && out / 16 >= g->n_sm / 2)
        CU_TRY(pdl_launch(g, skinny_kernel<OT, 2>, dim3((unsigned)(out / 16)), dim3(32 * SK_WARPS), 0, y, x, W, bias, n, in,
                          out),
               err, "skinny GEMM");
    else
        CU_TRY(pdl_launch(g, skinny_kernel<OT, 1>, dim3((unsigned)(out / 8)), dim3(32 * SK_WARPS), 0, y, x, W, bias, n, in,
                          out),
               err, "skinny GEMM");
    return 1;
}

int gpu_linear(gpu_model *g, float *y, const float *x, const float *W, int n, int in, int out, char *err)
{
    const float one = 1.0f, zero = 0.0f;
    if (n <= 0 || out <= 0) return 0;
    const int r = g->gemv_on ? gemv(g, y, x, W, n, in, out, err) : 0;
    if (r) return r < 0 ? -1 : 0;
    BLAS_TRY(cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W, in, x, in, &zero, y, out), err,
             "cublasSgemm");
    return 0;
}

int gpu_linear_bf16(gpu_model *g, float *y, const bf16 *x, const bf16 *W, int n, int in, int out, char *err)
{
    const float one = 1.0f, zero = 0.0f;
    if (n <= 0 || out <= 0) return 0;
    int r = g->gemv_on ? gemv(g, y, x, W, n, in, out, err) : 0;
    if (!r && g->gemv_on) r = skinny(g, y, x, W, n, in, out, err);
    if (r) return r < 0 ? -1 : 0;
    BLAS_TRY(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W, CUDA_R_16BF, in, x, CUDA_R_16BF, in,
                          &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             err, "cublasGemmEx (bf16)");
    return 0;
}

int gpu_linear_bf16_out(gpu_model *g, bf16 *y, const bf16 *x, const bf16 *W, int n, int in, int out, char *err)
{
    const float one = 1.0f, zero = 0.0f;
    if (n <= 0 || out <= 0) return 0;
    int r = g->gemv_on ? gemv(g, y, x, W, n, in, out, err) : 0;
    if (!r && g->gemv_on) r = skinny(g, y, x, W, n, in, out, err);
    if (r) return r < 0 ? -1 : 0;
    BLAS_TRY(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W, CUDA_R_16BF, in, x, CUDA_R_16BF, in,
                          &zero, y, CUDA_R_16BF, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             err, "cublasGemmEx (bf16 out)");
    return 0;
}

int gpu_linear_bias_relu(gpu_model *g, float *y, bf16 *yb, const float *x, const bf16 *xb, const float *W,
                         const bf16 *Wb, const float *b, int n, int in, int out, char *err)
{
    if (!g->gemv_on || n <= 0) return 0;
    if (g->prec != GPU_BF16) return gemv(g, y, x, W, n, in, out, err, b);
    const int r = gemv(g, yb, xb, Wb, n, in, out, err, b);
    return r ? r : skinny(g, yb, xb, Wb, n, in, out, err, b);
}

/* A cublasLt plan of the RELU_BIAS GEMM for N rows of IN -> OUT and the
 * bias of MODE (1 float, 2 bf16), made once (descriptors, layouts and the
 * heuristic's algorithm: tens of microseconds of host time, as long as a
 * whole layer of a one-stream step) and kept in g->lt_plans: NULL with *ST
 * cublasLt's status when it cannot be made (NOT_SUPPORTED: no algorithm). */
static gpu_lt_plan *lt_plan(gpu_model *g, int n, int in, int out, int mode, cublasStatus_t *st)
{
    for (int k = 0; k < GPU_LT_PLANS; k++) {
        gpu_lt_plan *p = &g->lt_plans[k];
        if (p->op && p->n == n && p->in == in && p->out == out && p->mode == mode) return p;
    }
    gpu_lt_plan *p = &g->lt_plans[g->lt_next];
    g->lt_next = (g->lt_next + 1) % GPU_LT_PLANS;
    gpu_lt_plan_free(p);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU_BIAS;
    const cudaDataType_t bias_type = mode == 1 ? CUDA_R_32F : CUDA_R_16BF;
    const size_t ws = GPU_BLAS_WORKSPACE;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    /* as gpu_linear_bf16: y^T (out x n) = W (stored in x out, transposed) x^T (in x n), column-major */
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, in, out, in);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, in, n, in);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_16BF, out, n, out);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &h, &found);
    if (s == CUBLAS_STATUS_SUCCESS && found < 1) s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    *st = s;
    if (s != CUBLAS_STATUS_SUCCESS) {
        gpu_lt_plan_free(p);
        return NULL;
    }
    p->n = n, p->in = in, p->out = out, p->mode = mode, p->algo = h.algo;
    return p;
}

void gpu_lt_plan_free(gpu_lt_plan *p)
{
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

/* One GEMM with the RELU_BIAS epilogue, the bias B of MODE: cublasLt's status. */
static cublasStatus_t lt_relu_bias(gpu_model *g, bf16 *y, const bf16 *x, const bf16 *W, const void *b, int mode, int n,
                                   int in, int out)
{
    cublasStatus_t st;
    gpu_lt_plan *p = lt_plan(g, n, in, out, mode, &st);
    if (!p) return st;
    const float one = 1.0f, zero = 0.0f;
    st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(g->lt, p->op, &one, W, p->la, x, p->lb, &zero, y, p->lc, y, p->lc, &p->algo, g->blas_ws,
                            GPU_BLAS_WORKSPACE, g->stream);
    return st;
}

int gpu_linear_bias_relu_lt(gpu_model *g, bf16 *y, const bf16 *x, const bf16 *W, const float *b, const bf16 *bh, int n,
                            int in, int out, char *err)
{
    if (g->lt_mode < 0 || !b || n <= 0 || out <= 0) return 0;
    /* the bias in float where cublasLt takes it with a bf16 output, else in bf16 (as the weights are) */
    for (int mode = g->lt_mode ? g->lt_mode : 1; mode <= 2; mode++) {
        if (mode == 2 && !bh) break;
        const cublasStatus_t st = lt_relu_bias(g, y, x, W, mode == 1 ? (const void *)b : (const void *)bh, mode, n, in, out);
        if (st == CUBLAS_STATUS_SUCCESS) {
            g->lt_mode = mode;
            return 1;
        }
        if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
            return err_set(err, "cublasLtMatmul (bias + ReLU epilogue): status %d", (int)st);
        if (g->lt_mode) break;   /* (a mode that worked before: the shapes, not the types) */
    }
    if (!g->lt_mode) g->lt_mode = -1;   /* no algorithm for either: the two launches, from now on */
    return 0;
}

__global__ static void to_bf16_kernel(bf16 *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}

int gpu_to_bf16(gpu_model *g, bf16 *dst, const float *src, size_t n, char *err)
{
    if (n == 0) return 0;
    size_t blocks = (n + 255) / 256;
    to_bf16_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, g->stream>>>(dst, src, n);
    LAUNCH_TRY(err, "to_bf16");
    return 0;
}

int gpu_linear_ld(gpu_model *g, float *y, int ldy, const float *x, const float *W, int n, int in, int out, char *err)
{
    const float one = 1.0f, zero = 0.0f;
    if (n <= 0 || out <= 0) return 0;
    BLAS_TRY(cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W, in, x, in, &zero, y, ldy), err,
             "cublasSgemm (ld)");
    return 0;
}

int gpu_linear_bf16_ld(gpu_model *g, float *y, int ldy, const bf16 *x, const bf16 *W, int n, int in, int out, char *err)
{
    const float one = 1.0f, zero = 0.0f;
    if (n <= 0 || out <= 0) return 0;
    BLAS_TRY(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W, CUDA_R_16BF, in, x, CUDA_R_16BF, in,
                          &zero, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             err, "cublasGemmEx (bf16, ld)");
    return 0;
}
