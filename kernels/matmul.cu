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

#include <cooperative_groups.h>
namespace cg = cooperative_groups;

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
 * out.
 *
 * Two more modes carry a post-LN model's LayerNorm, so that it needs no
 * launch of its own (forward.cu, issue 17: a decode step of 64 streams was
 * 24 LayerNorm launches among about 85). With LN(h) = ((h - mean) * rstd)
 * * w + b, a product of LN(h) is rstd * (W (w h) - mean * W w) + W b, so
 * the product after the residual can read h scaled by w instead of LN(h):
 *   SK_RES  (Wo, fc2) h = x' + (bf16(a W^T) + bias) into x in place, the
 *           residual stream before the LayerNorm that follows, and
 *           bf16(w h) into xb for the product after it. x' is x, or where x
 *           still waits for the LayerNorm before (acc_in set) that one
 *           applied by its rows' statistics. Each row's sum and sum of
 *           squares of h go out as 64-bit integers in units of 2^-24
 *           (red.add: the same sums in any order, so a step gives the same
 *           bits every time), into acc_out.
 *   SK_LNF  (QKV, fc1) y = rstd (acc - mean s) + c (+ bias, ReLU), acc the
 *           plain product of xb = bf16(w h), s = W w and c = W b per output
 *           (forward.cu folds them at load), mean and rstd from the sums;
 *           block 0 zeroes the sums the next SK_RES adds into.
 * The rounding moves from LN(h) to w h (bf16 either way); where a row's
 * mean is large against its spread the subtraction after the product costs
 * more of bf16's digits than rounding LN(h) did (tests/test_gpu.c compares
 * both paths with the CPU). */
#define SK_WARPS 8
#define SK_KCHUNK 64
#define SK_PLAIN 0
#define SK_RES 1
#define SK_LNF 2
#define SK_UNIT 16777216.0   /* 2^24: the row sums' fixed point */

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

/* The LayerNorm the SK_LNF and SK_RES modes carry (matmul.cu, forward.cu) */
struct sk_ln {
    const unsigned long long *acc_in;   /* the rows' sums of x's pending LayerNorm (NULL: SK_RES's x plain) */
    unsigned long long *acc_out;        /* SK_RES adds h's sums into it, SK_LNF zeroes it */
    const float *w, *b;                 /* SK_RES: the pending LayerNorm's weight and bias (any float's alignment) */
    const float *wn;                    /* SK_RES: the next LayerNorm's weight (xb = bf16(wn h)) */
    bf16 *xb;                           /* SK_RES: that product's input */
    const float *s, *c;                 /* SK_LNF: W w and W b by output */
    float eps;
    int d;                              /* the LayerNorm's width */
};

/* A row's mean and 1 / sqrt(var + eps) from its sums S, Q (units of 2^-24)
 * over D values: in double up to the variance (the sums are exact), then
 * float */
static __device__ __forceinline__ float2 sk_stats(unsigned long long s, unsigned long long q, int d, float eps)
{
    const double inv = 1.0 / ((double)d * SK_UNIT), mean = (double)(long long)s * inv;
    const double var = (double)(long long)q * inv - mean * mean;
    return make_float2((float)mean, rsqrtf((float)(var > 0.0 ? var : 0.0) + eps));
}

static __device__ __forceinline__ float ln_apply(float u, float mean, float rstd, float w, float b)
{
    return __fmaf_rn(__fmul_rn(__fsub_rn(u, mean), rstd), w, b);
}

/* SK_RES: a row's sums over the NT lanes that hold its outputs (consecutive
 * lanes of a warp), added once a block */
template <int NT>
static __device__ __forceinline__ void sk_row_sums(unsigned long long *acc, int r, long long s, long long q, bool lead)
{
#pragma unroll
    for (int m = 1; m < NT; m <<= 1) s += __shfl_xor_sync(0xffffffffu, s, m), q += __shfl_xor_sync(0xffffffffu, q, m);
    if (lead) atomicAdd(acc + 2 * r, (unsigned long long)s), atomicAdd(acc + 2 * r + 1, (unsigned long long)q);
}

/* The warps' sums of output E in a fixed order (KS 2: then the other block's) */
template <int KS, int NT>
static __device__ __forceinline__ float sk_sum(const float (&red)[SK_WARPS][SK_MAX_ROWS * NT], const float *rem, int e)
{
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < SK_WARPS; w++) v += red[w][e];
    if constexpr (KS > 1)
#pragma unroll
        for (int w = 0; w < SK_WARPS; w++) v += rem[w * SK_MAX_ROWS * NT + e];
    return v;
}

/* KS 2 with PUSH (gpu_decode_splitk 2): the cluster's second block stores
 * its warps' sums straight into the first block's shared memory and
 * arrives on the first block's mbarrier (release at the cluster's scope);
 * the first waits on it (acquire) and meets the sums as before, in the
 * same order: the same bits as the two cluster barriers, but the second
 * block never waits for the first to finish. A cluster barrier split in
 * two (arrived at the kernel's start, waited before the stores) makes sure
 * the first block has started and initialised its mbarrier. */
static __device__ __forceinline__ unsigned sk_smem(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

static __device__ __forceinline__ unsigned sk_mapa(unsigned a, unsigned rank)
{
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}

static __device__ __forceinline__ void sk_mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n\tfence.mbarrier_init.release.cluster;" ::"r"(bar), "r"(count)
                 : "memory");
}

static __device__ __forceinline__ void sk_cluster_arrive() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
static __device__ __forceinline__ void sk_cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

static __device__ __forceinline__ void sk_st_remote2(unsigned a, float x, float y)
{
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(x), "f"(y) : "memory");
}

static __device__ __forceinline__ void sk_arrive_remote(unsigned bar)
{
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}

static __device__ __forceinline__ void sk_mbar_wait(unsigned bar, unsigned parity)
{
    asm volatile("{\n\t.reg .pred p;\n\tSK_WAIT:\n\t"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra SK_WAIT;\n\t}" ::"r"(bar), "r"(parity)
                 : "memory");
}

/* Rows split (gridDim.y 2, gpu_decode_msplit): each block takes 32 of the
 * rows (the first 32, or the rest), so a product of few tiles (Wo: 64)
 * spreads over twice the blocks, each loading half of x. Every output's
 * sum is the same as unsplit (the same bits). */
template <typename OT, int NB, int MODE, int KS, bool PUSH>
__global__ static void __launch_bounds__(32 * SK_WARPS)
    skinny_kernel(OT *y, const bf16 *x, const bf16 *W, const float *bias, int n, int in, int out, sk_ln ln)
{
    constexpr int NT = 8 * NB, EPT = SK_MAX_ROWS * NT / (32 * SK_WARPS);
    __shared__ float red[SK_WARPS][SK_MAX_ROWS * NT];
    /* KS 2 with PUSH: the second block's sums (pushed by it) and the mbarrier they arrive on */
    __shared__ float red1[PUSH ? SK_WARPS : 1][PUSH ? SK_MAX_ROWS * NT : 1];
    __shared__ unsigned long long pbar;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    if (gridDim.y > 1) {   /* rows split: this block's 32 (the arguments shifted to them) */
        const int r0 = 32 * (int)blockIdx.y;
        x += (size_t)r0 * in, y += (size_t)r0 * out;
        if (ln.acc_in) ln.acc_in += 2 * r0;
        if (ln.acc_out) ln.acc_out += 2 * r0;
        if (ln.xb) ln.xb += (size_t)r0 * out;
        n = n - r0 < 32 ? n - r0 : 32;
    }
    /* KS 2: a cluster of two blocks an output tile, each half of the inputs; the first meets the sums */
    const int kr = KS > 1 ? (int)blockIdx.x % KS : 0;
    const int o0 = (int)blockIdx.x / KS * NT, mt = (n + 15) / 16, per = in / (SK_WARPS * KS),
              k0 = kr * (in / KS) + warp * per + 16 * q;
    float acc[4][NB][4];
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int j = 0; j < NB; j++) acc[t][j][0] = acc[t][j][1] = acc[t][j][2] = acc[t][j][3] = 0.0f;
    sk_chunk<NB> cur, nxt;
    /* SK_RES, SK_LNF: this thread's outputs (column eo, rows threadIdx.x / NT + k (32 SK_WARPS / NT)): their
     * column's constants now, their rows' x and statistics after the wait */
    const int eo = o0 + (int)threadIdx.x % NT;
    float cb = 0.0f, cw = 1.0f, cbb = 0.0f, cwn = 1.0f, px[EPT];
    __shared__ float2 rowst[SK_MAX_ROWS];   /* SK_RES, SK_LNF: the rows' mean and rstd (of acc_in) */
    unsigned long long rs = 0, rq = 0;       /* thread r < n: row r's sums, loaded after the wait */
    if constexpr (PUSH) {
        if (kr == 0 && threadIdx.x == 0) sk_mbar_init(sk_smem(&pbar), 32 * SK_WARPS);
        sk_cluster_arrive();
    }
    pdl_next();
    sk_load_w(cur, W, in, o0, k0, g);   /* (the weights: before the kernel ahead has ended) */
    if constexpr (MODE == SK_RES) {
        if (bias) cb = __ldg(bias + eo);
        if (ln.acc_in) cw = __ldg(ln.w + eo), cbb = __ldg(ln.b + eo);
        cwn = __ldg(ln.wn + eo);
    }
    if constexpr (MODE == SK_LNF) cw = __ldg(ln.s + eo), cbb = __ldg(ln.c + eo), cb = bias ? __ldg(bias + eo) : 0.0f;
    pdl_wait();
    sk_load_x(cur, x, n, in, k0, g, mt);
    if constexpr (MODE != SK_PLAIN) {
        if (ln.acc_in && (int)threadIdx.x < n) rs = __ldcg(ln.acc_in + 2 * threadIdx.x), rq = __ldcg(ln.acc_in + 2 * threadIdx.x + 1);
#pragma unroll
        for (int i = 0; i < EPT; i++) {
            const int r = (int)(threadIdx.x + i * 32 * SK_WARPS) / NT;
            if (MODE == SK_RES) px[i] = r < n ? __ldcg((const float *)y + (size_t)r * out + eo) : 0.0f;
        }
    }
    if (MODE != SK_RES && ln.acc_out && blockIdx.x == 0 && (int)threadIdx.x < 2 * n) ln.acc_out[threadIdx.x] = 0ull;
    for (int k = SK_KCHUNK; k < per; k += SK_KCHUNK) {
        sk_load_w(nxt, W, in, o0, k0 + k, g);
        sk_load_x(nxt, x, n, in, k0 + k, g, mt);
        sk_mma(acc, cur, mt);
        cur = nxt;
    }
    sk_mma(acc, cur, mt);
    /* (the rows' statistics, once a row, their loads long arrived) */
    if (MODE != SK_PLAIN && ln.acc_in && (int)threadIdx.x < n) rowst[threadIdx.x] = sk_stats(rs, rq, ln.d, ln.eps);
    if constexpr (PUSH) {
        if (kr) {   /* the second block: its sums into the first's red1, then its arrival; done */
            sk_cluster_wait();
            const unsigned base = sk_mapa(sk_smem(&red1[warp][0]), 0);
#pragma unroll
            for (int t = 0; t < 4; t++) {
                if (t >= mt) break;
#pragma unroll
                for (int j = 0; j < NB; j++) {
                    const unsigned e = (unsigned)(((16 * t + g) * NT + 8 * j + 2 * q) * 4);
                    sk_st_remote2(base + e, acc[t][j][0], acc[t][j][1]);
                    sk_st_remote2(base + e + 8 * NT * 4, acc[t][j][2], acc[t][j][3]);
                }
            }
            sk_arrive_remote(sk_mapa(sk_smem(&pbar), 0));
            return;
        }
    }
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
    const float *rem = NULL;   /* KS 2: the other block's sums (distributed shared memory) */
    if constexpr (PUSH) {
        __syncthreads();
        sk_cluster_wait();   /* (pairs this block's arrival; the second block arrived at its start) */
        sk_mbar_wait(sk_smem(&pbar), 0);
        rem = &red1[0][0];
    } else if constexpr (KS > 1) {
        cg::cluster_group cl = cg::this_cluster();
        cl.sync();
        if (kr) {
            cl.sync();   /* (its shared memory stays while the first block reads it) */
            return;
        }
        rem = cl.map_shared_rank(&red[0][0], 1);
    } else {
        __syncthreads();
    }
    if constexpr (MODE == SK_PLAIN) {
        for (int e = threadIdx.x; e < n * NT; e += blockDim.x) {
            float v = sk_sum<KS, NT>(red, rem, e);
            const int r = e / NT, o = o0 + e % NT;
            if (bias) {   /* as bias_relu.cu: the bias added in float, then the clamp */
                v += bias[o];
                v = v < 0.0f ? 0.0f : v;
            }
            stf(y + (size_t)r * out + o, v);
        }
    } else {
#pragma unroll
        for (int i = 0; i < EPT; i++) {
            const int e = threadIdx.x + i * 32 * SK_WARPS, r = e / NT;
            if (MODE == SK_LNF && r >= n) break;   /* (SK_RES: every lane goes on to the shuffles) */
            float v = sk_sum<KS, NT>(red, rem, e);
            if constexpr (MODE == SK_RES) {
                /* as layernorm.cu's input: x' + (the product rounded to bf16 + the bias) */
                const float2 st = ln.acc_in ? rowst[r] : make_float2(0.0f, 1.0f);
                const float xo = ln.acc_in ? ln_apply(px[i], st.x, st.y, cw, cbb) : px[i];
                const float h = xo + (__bfloat162float(__float2bfloat16(v)) + cb);
                long long hs = 0, hq = 0;
                if (r < n) {   /* (h 2^24 exact in float; h^2 rounded once, then scaled exactly) */
                    ((float *)y)[(size_t)r * out + eo] = h;
                    ln.xb[(size_t)r * out + eo] = __float2bfloat16(cwn * h);
                    hs = __float2ll_rn(h * (float)SK_UNIT);
                    hq = __float2ll_rn(__fmul_rn(h, h) * (float)SK_UNIT);
                }
                sk_row_sums<NT>(ln.acc_out, r, hs, hq, r < n && (threadIdx.x % NT) == 0);
            } else {
                const float2 st = rowst[r];
                v = __fmaf_rn(st.y, __fsub_rn(v, __fmul_rn(st.x, cw)), cbb);
                if (bias) {   /* fc1: the bias, then the clamp */
                    v += cb;
                    v = v < 0.0f ? 0.0f : v;
                }
                stf(y + (size_t)r * out + eo, v);
            }
        }
    }
    if constexpr (KS > 1 && !PUSH) cg::this_cluster().sync();
}

/* Whether skinny_kernel takes a product of N rows of IN -> OUT (x and W
 * 16-byte aligned) */
static bool skinny_fits(int n, int in, int out, const void *x, const void *W)
{
    return n >= 1 && n <= SK_MAX_ROWS && in % (SK_WARPS * SK_KCHUNK) == 0 && out % 8 == 0 &&
           ((uintptr_t)x | (uintptr_t)W) % 16 == 0;
}

/* skinny_kernel's launch in MODE (NB 2 where its blocks still fill half the
 * SMs, else 1) */
template <typename OT, int MODE>
static cudaError_t skinny_launch(gpu_model *g, OT *y, const bf16 *x, const bf16 *W, const float *bias, int n, int in,
                                 int out, sk_ln ln)
{
    if (out % 16 == 0 && out / 16 >= g->n_sm / 2)
        return pdl_launch(g, skinny_kernel<OT, 2, MODE, 1, false>, dim3((unsigned)(out / 16)), dim3(32 * SK_WARPS), 0, y, x, W,
                          bias, n, in, out, ln);
    /* long inputs and few tiles (fc2): two blocks a tile, half the inputs each, so that more SMs read x */
    if (g->sk_split && in >= 2 * SK_WARPS * SK_KCHUNK && in % (2 * SK_WARPS * SK_KCHUNK) == 0 && out / 8 * 2 <= g->n_sm) {
        if (g->sk_split == 2)
            return pdl_launch_cluster(g, skinny_kernel<OT, 1, MODE, 2, true>, dim3((unsigned)(out / 8 * 2)),
                                      dim3(32 * SK_WARPS), 2u, y, x, W, bias, n, in, out, ln);
        return pdl_launch_cluster(g, skinny_kernel<OT, 1, MODE, 2, false>, dim3((unsigned)(out / 8 * 2)),
                                  dim3(32 * SK_WARPS), 2u, y, x, W, bias, n, in, out, ln);
    }
    /* few tiles (Wo: 64) and more than 32 rows: the rows split over two blocks a tile (gpu_decode_msplit) */
    const unsigned ys = g->sk_msplit && n > 32 && out / 8 * 2 <= g->n_sm ? 2u : 1u;
    return pdl_launch(g, skinny_kernel<OT, 1, MODE, 1, false>, dim3((unsigned)(out / 8), ys), dim3(32 * SK_WARPS), 0, y, x, W,
                      bias, n, in, out, ln);
}

/* y = x W^T (+ bias, ReLU) by skinny_kernel where the shapes allow it: 1 if
 * it ran, 0 if not, -1 on a launch error */
template <typename OT>
static int skinny(gpu_model *g, OT *y, const bf16 *x, const bf16 *W, int n, int in, int out, char *err,
                  const float *bias = NULL)
{
    if (!skinny_fits(n, in, out, x, W)) return 0;
    const sk_ln none = {};
    CU_TRY((skinny_launch<OT, SK_PLAIN>(g, y, x, W, bias, n, in, out, none)), err, "skinny GEMM");
    return 1;
}

bool gpu_linear_ln_fits(const gpu_model *g, int n, int in, int out, const void *W)
{
    return g->prec == GPU_BF16 && g->gemv_on && n > GEMV_MAX_ROWS && skinny_fits(n, in, out, W, W);
}

int gpu_linear_residual(gpu_model *g, float *x, bf16 *xb, const unsigned long long *acc_in, const float *w, const float *b,
                        unsigned long long *acc_out, const float *wn, const bf16 *a, const bf16 *W, const float *bias, int n,
                        int in, int out, char *err)
{
    if (!gpu_linear_ln_fits(g, n, in, out, W) || ((uintptr_t)a & 15))
        return err_set(err, "a residual inside a product of %d x %d -> %d: outside the skinny kernel's shapes", n, in, out);
    sk_ln ln = {};
    ln.acc_in = acc_in, ln.acc_out = acc_out, ln.w = w, ln.b = b, ln.wn = wn, ln.xb = xb;
    ln.eps = (float)g->m->ln_eps, ln.d = out;
    CU_TRY((skinny_launch<float, SK_RES>(g, x, a, W, bias, n, in, out, ln)), err, "skinny GEMM (residual out)");
    return 0;
}

int gpu_linear_ln(gpu_model *g, bf16 *y, const bf16 *xb, const unsigned long long *acc_in, unsigned long long *acc_out,
                  const float *s, const float *c, const bf16 *W, const float *bias, int n, int in, int out, char *err)
{
    if (!gpu_linear_ln_fits(g, n, in, out, W) || ((uintptr_t)xb & 15))
        return err_set(err, "a LayerNorm inside a product of %d x %d -> %d: outside the skinny kernel's shapes", n, in, out);
    sk_ln ln = {};
    ln.acc_in = acc_in, ln.acc_out = acc_out, ln.s = s, ln.c = c;
    ln.eps = (float)g->m->ln_eps, ln.d = in;
    if (!acc_in)   /* (after the embedding: no LayerNorm to apply, the sums to zero all the same) */
        CU_TRY((skinny_launch<bf16, SK_PLAIN>(g, y, xb, W, bias, n, in, out, ln)), err, "skinny GEMM");
    else
        CU_TRY((skinny_launch<bf16, SK_LNF>(g, y, xb, W, bias, n, in, out, ln)), err, "skinny GEMM (LayerNorm in)");
    return 0;
}

int gpu_linear_ln_f(gpu_model *g, float *y, const bf16 *xb, const unsigned long long *acc_in, const float *s,
                    const float *c, const bf16 *W, int n, int in, int out, char *err)
{
    if (!gpu_linear_ln_fits(g, n, in, out, W) || ((uintptr_t)xb & 15) || !acc_in)
        return err_set(err, "a LayerNorm inside a product of %d x %d -> %d: outside the skinny kernel's shapes", n, in, out);
    sk_ln ln = {};
    ln.acc_in = acc_in, ln.s = s, ln.c = c;
    ln.eps = (float)g->m->ln_eps, ln.d = in;
    CU_TRY((skinny_launch<float, SK_LNF>(g, y, xb, W, NULL, n, in, out, ln)), err, "skinny GEMM (LayerNorm in, float out)");
    return 0;
}

/* S[o] = sum_k W[o][k] w[k], C[o] = sum_k W[o][k] b[k] (W in bf16 as the
 * products read it; in double, a warp an output, the same order every time) */
__global__ static void ln_fold_kernel(float *S, float *C, const bf16 *W, const float *w, const float *b, int in, int out)
{
    const int o = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (o >= out) return;
    double s = 0.0, c = 0.0;
    for (int k = lane; k < in; k += 32) {
        const double v = (double)__bfloat162float(W[(size_t)o * in + k]);
        s += v * (double)w[k];
        c += v * (double)b[k];
    }
    for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m), c += __shfl_xor_sync(0xffffffffu, c, m);
    if (lane == 0) S[o] = (float)s, C[o] = (float)c;
}

int gpu_ln_fold(gpu_model *g, float *s, float *c, const bf16 *W, const float *w, const float *b, int in, int out, char *err)
{
    ln_fold_kernel<<<(unsigned)((out + 7) / 8), 256, 0, g->stream>>>(s, c, W, w, b, in, out);
    LAUNCH_TRY(err, "folding a LayerNorm into a product");
    return 0;
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
