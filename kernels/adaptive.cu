/*
 * adaptive.cu - the word-level Transformer-XL's adaptive input and adaptive
 * softmax on the device, as core/adaptive.c computes them (its header has
 * the math); par-tf's adaptive softmax too (its tail projections' biases,
 * gpu_ada.proj_b: added to the projection's float sum).
 *
 *   input: a thread per (token, output dim): the token's row of its
 *     cluster's table dotted with that dim's row of the projection, in
 *     core's order (products then sums, no fused multiply-add), times
 *     sqrt(d_model) in double; one launch for every cluster.
 *   softmax: the head (the shortlist and a column per tail cluster) by a
 *     GEMM into a buffer of its own and log_softmax; its shortlist copied
 *     into the logits; each tail cluster k by a GEMM straight into its
 *     columns [c_k, c_{k+1}) of the logits (rows V apart), then its bias,
 *     the log-softmax of the segment and the head's column for cluster k
 *     (the k-th from the end). A segment is cut in chunks of ADA_CHUNK, one
 *     thread block each (a decode step has one row: a block a row would
 *     leave the device idle, waiting on one SM's loads): each chunk's max
 *     and sum of exp (float in a warp, double across them), then each
 *     chunk's block meets its row's partials into the log-sum-exp (a warp's
 *     sum in double) and writes its chunk.
 * GPU_BF16: the projections write bfloat16, the GEMMs read bfloat16 weights
 * and sum in float32 (as every linear layer of the bf16 step).
 *
 * A step of targets only (scoring) writes no logits: the head's GEMM into a
 * buffer of its own, each row's chunk partials, the shortlist's targets and
 * each row's logprob of every tail cluster; then each tail cluster over the
 * rows whose target lies in it (gathered), its partials, the target's logit
 * captured as they are made, and a warp a row meets them. In GPU_BF16 these
 * GEMMs write their logits in bfloat16 (summed in float, rounded once):
 * 2,048 rows of a 267,735-word model write and read 330 MB of float logits
 * a step otherwise, a tenth of the step. Its logprobs are then within 8 bits
 * of a logit's mantissa of the step of whole rows (which stays float).
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

typedef struct {
    int n;
    int cut[ADA_MAX_CLUSTERS + 1], dim[ADA_MAX_CLUSTERS];
    const float *emb[ADA_MAX_CLUSTERS], *proj[ADA_MAX_CLUSTERS];
} ada_in;

__global__ static void ada_embed_kernel(float *x, bf16 *xb, ada_in a, const int32_t *tok, int n, int D, double scale)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * D) return;
    const int r = (int)(i / D), c = (int)(i % D), t = tok[r];
    int k = 0;
    while (k + 1 < a.n && t >= a.cut[k + 1]) k++;
    const int d = a.dim[k];
    const float *e = a.emb[k] + (size_t)(t - a.cut[k]) * d;
    float v;
    if (!a.proj[k]) {
        v = (float)(__ldg(e + c) * scale);
    } else {
        const float *p = a.proj[k] + (size_t)c * d;
        float s = 0.0f;
        for (int j = 0; j < d; j++) s = __fadd_rn(s, __fmul_rn(__ldg(e + j), __ldg(p + j)));
        v = (float)(s * scale);
    }
    x[i] = v;
    if (xb) xb[i] = __float2bfloat16(v);
}

int gpu_ada_embed(gpu_model *g, float *x, bf16 *xb, const int32_t *tok, int n, char *err)
{
    const gpu_ada *d = g->ada;
    const int D = g->m->d_model;
    ada_in a;
    memset(&a, 0, sizeof a);
    a.n = d->n;
    for (int k = 0; k < d->n; k++) {
        a.cut[k] = d->cut[k];
        a.dim[k] = d->dim[k];
        a.emb[k] = d->emb[k];
        a.proj[k] = d->emb_proj[k];
    }
    a.cut[d->n] = d->cut[d->n];
    const size_t total = (size_t)n * D;
    ada_embed_kernel<<<(unsigned)((total + 255) / 256), 256, 0, g->stream>>>(x, xb, a, tok, n, D, sqrt((double)D));
    LAUNCH_TRY(err, "ada_embed");
    return 0;
}

#define ADA_CHUNK 8192   /* (gpu.cu sizes the partials by it) */

/* 2^x (ex2.approx.ftz: 2 ulp, a result below 2^-126 is 0; none of
 * expf's range fix-up): the chunks' sums of exp */
static __device__ __forceinline__ float ada_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#define ADA_LOG2E 1.4426950408889634f

/* The logits' element: float, or (GPU_BF16, a step of targets) bfloat16.
 * Plain loads, not gpu_internal.cuh's ldf / unpack16 (the read-only path):
 * ada_lsm's partials rewrite their float chunk in place. */
static __device__ __forceinline__ float ada_ld1(const float *p) { return *p; }
static __device__ __forceinline__ float ada_ld1(const bf16 *p) { return __bfloat162float(*p); }
/* 16 bytes at P (aligned): 4 floats or 8 bfloat16 into X */
static __device__ __forceinline__ void ada_ld16(const float *p, float *x)
{
    const float4 u = *(const float4 *)p;
    x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w;
}
static __device__ __forceinline__ void ada_ld16(const bf16 *p, float *x)
{
    const uint4 u = *(const uint4 *)p;
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[i]);
        x[2 * i] = f.x, x[2 * i + 1] = f.y;
    }
}

/* Chunk c of row r of Y (rows LD apart, a multiple of 8; LEN wide): + bias
 * (in place unless KEEP, float only: a step of targets reads only its
 * targets, adding their bias); its max and sum of exp into part[(r * C + c)
 * * 2]. With TVAL, row r's target (tgt[rows[r]], or tgt[r] where rows is
 * NULL, less TLO) lying in the chunk: its value + bias into tval[r]. A
 * thread takes 32 values in runs of one 16-byte load each (the bias 16-byte
 * aligned: the head's, and gpu.cu's copies of the tails'); each thread's
 * exponentials and its warp's in float (each at most 1, by ex2.approx),
 * the warps' sums met in double. */
template <typename T>
__global__ static void __launch_bounds__(256) ada_part_kernel(T *y, int ld, int len, const float *bias, double *part, int C,
                                                              bool keep, const int32_t *tgt, const int *rows, int tlo,
                                                              float *tval)
{
    __shared__ float fs[8], ts[8];   /* (blockDim.x == 256) */
    const int r = blockIdx.x, c = blockIdx.y, j0 = c * ADA_CHUNK, j1 = min(len, j0 + ADA_CHUNK);
    T *row = y + (size_t)r * ld;
    float *rowf = (float *)row;   /* (written only where T is float: keep is false in ada_lsm alone) */
    const int tj = tval ? tgt[rows ? rows[r] : r] - tlo : -1;   /* the target's column in Y */
    constexpr int E = 16 / sizeof(T);   /* values a 16-byte load */
    float v[ADA_CHUNK / 256];           /* this thread's values of the chunk (blockDim.x == 256) */
    float mx = -INFINITY;
    /* every load of the thread first (its runs of E values), then the sums */
#pragma unroll
    for (int k = 0; k < ADA_CHUNK / (256 * E); k++) {
        const int j = j0 + E * (threadIdx.x + 256 * k);
        float *x = v + E * k;
        if (j + E - 1 < j1) {
            ada_ld16(row + j, x);
#pragma unroll
            for (int q = 0; q < E; q += 4) {
                const float4 bq = __ldg((const float4 *)(bias + j + q));
                x[q] += bq.x, x[q + 1] += bq.y, x[q + 2] += bq.z, x[q + 3] += bq.w;
                if (!keep) *(float4 *)(rowf + j + q) = make_float4(x[q], x[q + 1], x[q + 2], x[q + 3]);
            }
        } else
#pragma unroll
            for (int i = 0; i < E; i++) {
                x[i] = j + i < j1 ? ada_ld1(row + j + i) + __ldg(bias + j + i) : -INFINITY;
                if (!keep && j + i < j1) rowf[j + i] = x[i];
            }
#pragma unroll
        for (int i = 0; i < E; i++) {
            if (tj == j + i && tj < j1) tval[r] = x[i];
            mx = fmaxf(mx, x[i]);
        }
    }
    /* each thread's (max, sum of exp) over its values, then the warp's and the block's met pairwise: one
     * barrier */
    float t = 0.0f;
    const float ml = mx == -INFINITY ? 0.0f : mx * ADA_LOG2E;   /* exp(v - mx) = 2^(v log2(e) - ml): 0 for -inf */
#pragma unroll
    for (int k = 0; k < ADA_CHUNK / 256; k++) t += ada_ex2(fmaf(v[k], ADA_LOG2E, -ml));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, mx, o), ot = __shfl_xor_sync(0xffffffffu, t, o), nm = fmaxf(mx, om);
        if (nm != -INFINITY) t = t * ada_ex2((mx - nm) * ADA_LOG2E) + ot * ada_ex2((om - nm) * ADA_LOG2E);
        mx = nm;
    }
    const int w = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) fs[w] = mx, ts[w] = t;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = -INFINITY;
        for (int i = 0; i < 8; i++) m = fmaxf(m, fs[i]);
        double sum = 0;
        for (int i = 0; i < 8; i++) sum += fs[i] == -INFINITY ? 0.0 : (double)ts[i] * exp((double)fs[i] - m);
        part[((size_t)r * C + c) * 2] = m;
        part[((size_t)r * C + c) * 2 + 1] = sum;
    }
}

/* The log-sum-exp of a row from its C chunks' partials at P, by a warp
 * (every lane returns it; the chunks a lane each in turn): the same sum in
 * a step of targets and in a step of whole rows */
__device__ static double ada_lse_warp(const double *p, int C)
{
    const int lane = threadIdx.x & 31;
    double mx = -INFINITY, s = 0;
    for (int k = lane; k < C; k += 32) mx = fmax(mx, p[2 * k]);
    for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int k = lane; k < C; k += 32) s += p[2 * k + 1] * exp(p[2 * k] - mx);
    return mx + log(warp_sum(s));
}

/* The row's log-sum-exp from its chunks' partials; chunk c of SRC (rows LDS
 * apart) written to DST (rows LDD apart) as x - lse (+ head[r][col] when
 * head is given, rows LDH apart). */
__global__ static void ada_write_kernel(float *dst, int ldd, const float *src, int lds, int len, const double *part,
                                        int C, const float *head, int ldh, int col)
{
    __shared__ double lse_s;
    const int r = blockIdx.x, c = blockIdx.y, j0 = c * ADA_CHUNK, j1 = min(len, j0 + ADA_CHUNK);
    if (threadIdx.x < 32) {
        const double l = ada_lse_warp(part + (size_t)r * C * 2, C);
        if (threadIdx.x == 0) lse_s = l;
    }
    __syncthreads();
    const double lse = lse_s;
    const float base = head ? head[(size_t)r * ldh + col] : 0.0f;
    const float *in = src + (size_t)r * lds;
    float *out = dst + (size_t)r * ldd;
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x)
        out[j] = head ? base + (float)((double)in[j] - lse) : (float)((double)in[j] - lse);
}

/* DST = log_softmax(SRC + bias) over rows of LEN (+ head's column COL if
 * head), N rows. */
static int ada_lsm(gpu_model *g, float *dst, int ldd, float *src, int lds, int len, const float *bias, const float *head,
                   int ldh, int col, int n, char *err)
{
    const int C = (len + ADA_CHUNK - 1) / ADA_CHUNK;
    dim3 grid((unsigned)n, (unsigned)C);
    ada_part_kernel<float><<<grid, 256, 0, g->stream>>>(src, lds, len, bias, g->ada->part, C, false, NULL, NULL, 0, NULL);
    ada_write_kernel<<<grid, 256, 0, g->stream>>>(dst, ldd, src, lds, len, g->ada->part, C, head, ldh, col);
    LAUNCH_TRY(err, "ada_lsm");
    return 0;
}

/* Scoring (every row wants only its target's logprob), the head's pass
 * over N rows, a warp a row: the row's log-sum-exp from its chunks'
 * partials; a target T in the shortlist has the logprob head[r][T] + b[T]
 * - lse, and the row's logprob of tail cluster k (its head column H - k,
 * k = 1 .. NT) goes to hcol[r][k] (ADA_MAX_CLUSTERS a row) for the tails'
 * pass. */
template <typename T>
__global__ static void ada_head_target_kernel(float *tl, float *hcol, const int32_t *tgt, const T *head, int ldh,
                                              const float *hb, const double *part, int C, int c1, int H, int nt, int n)
{
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= n) return;
    const double lse = ada_lse_warp(part + (size_t)r * C * 2, C);
    const T *h = head + (size_t)r * ldh;
    if (lane >= 1 && lane <= nt)
        hcol[(size_t)r * ADA_MAX_CLUSTERS + lane] = (float)((double)(ada_ld1(h + H - lane) + hb[H - lane]) - lse);
    const int t = tgt[r];
    if (lane == 0 && t >= 0 && t < c1) tl[r] = (float)((double)(ada_ld1(h + t) + hb[t]) - lse);
}

/* Tail cluster K's rows, [LO, HI) of the vocabulary: row i is step row
 * rows[i] (or i where rows is NULL; i < n); its target's logit + bias in
 * tval[i] (ada_part_kernel's), its chunks' partials in PART. The target's
 * logprob is the head's logprob of the cluster plus the target's logit
 * less the tail's log-sum-exp. A warp a row: its lanes take the chunks in
 * turn (a tail of 160,000 words has 40, each an exp in double). */
__global__ static void ada_target_rows_kernel(float *tl, const int32_t *tgt, const int *rows, int n, const float *hcol,
                                              int k, const float *tval, const double *part, int C, int lo, int hi)
{
    const int i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (i >= n) return;
    const int r = rows ? rows[i] : i, t = tgt[r];
    if (t < lo || t >= hi) return;
    const double lse = ada_lse_warp(part + (size_t)i * C * 2, C);
    if (lane == 0) tl[r] = hcol[(size_t)r * ADA_MAX_CLUSTERS + k] + (float)((double)tval[i] - lse);
}

/* dst[i] = src[rows[i]], rows of D elements, i < nrows */
template <typename T> __global__ static void ada_gather_kernel(T *dst, const T *src, const int *rows, int nrows, int d)
{
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)nrows * d) return;
    const int i = (int)(e / d), c = (int)(e % d);
    dst[e] = src[(size_t)rows[i] * d + c];
}

/* logits[r][j] = head[r][j], j < c1 */
__global__ static void ada_head_kernel(float *logits, const float *head, int V, int ldh, int c1)
{
    const float *h = head + (size_t)blockIdx.x * ldh;
    float *o = logits + (size_t)blockIdx.x * V;
    for (int j = threadIdx.x; j < c1; j += blockDim.x) o[j] = h[j];
}

/* A step of targets only: the head over N rows (its input P, or PB in
 * GPU_BF16): its GEMM, each row's partials, the shortlist's targets and the
 * rows' logprobs of each tail cluster (hcol). In GPU_BF16 the logits are
 * written in bfloat16 (summed in float, rounded once): a word model's head
 * of 2,048 rows is 164 MB of float written and read again, which was a
 * tenth of its step. */
static int ada_head_targets(gpu_model *g, const float *p, const bf16 *pb, int n, const int32_t *tgt, float *tl, char *err)
{
    const gpu_ada *a = g->ada;
    const int H = a->H, d0 = a->dim[0], C = (H + ADA_CHUNK - 1) / ADA_CHUNK;
    const dim3 grid((unsigned)n, (unsigned)C);
    const unsigned tb = (unsigned)((n + 3) / 4);   /* a warp a row */
    if (g->prec == GPU_BF16) {
        bf16 *hd = (bf16 *)a->head;   /* (rows ldh = ada_pad8(H) apart) */
        if (gpu_linear_bf16_out(g, hd, pb, a->head_w_h, n, d0, a->ldh, err)) return -1;
        ada_part_kernel<bf16><<<grid, 256, 0, g->stream>>>(hd, a->ldh, H, a->head_b, a->part, C, true, NULL, NULL, 0, NULL);
        ada_head_target_kernel<bf16><<<tb, 128, 0, g->stream>>>(tl, a->hcol, tgt, hd, a->ldh, a->head_b, a->part, C,
                                                                a->cut[1], H, a->n - 1, n);
    } else {
        if (gpu_linear_ld(g, a->head, a->ldh, p, a->head_w, n, d0, H, err)) return -1;
        ada_part_kernel<float><<<grid, 256, 0, g->stream>>>(a->head, a->ldh, H, a->head_b, a->part, C, true, NULL, NULL, 0,
                                                            NULL);
        ada_head_target_kernel<float><<<tb, 128, 0, g->stream>>>(tl, a->hcol, tgt, a->head, a->ldh, a->head_b, a->part, C,
                                                                 a->cut[1], H, a->n - 1, n);
    }
    LAUNCH_TRY(err, "ada_head_target");
    return 0;
}

/* Tail cluster K in a step of targets: its NK rows (gathered into pb / p,
 * step rows ROWS, or the step's rows where ROWS is NULL): their logits (in
 * bfloat16 in GPU_BF16, as the head's), partials and targets */
static int ada_tail_targets(gpu_model *g, int k, const float *p, const bf16 *pb, int nk, const int *rows, const int32_t *tgt,
                            float *tl, char *err)
{
    const gpu_ada *a = g->ada;
    const int lo = a->cut[k], Vk = a->cut[k + 1] - lo, dk = a->dim[k], C = (Vk + ADA_CHUNK - 1) / ADA_CHUNK;
    const dim3 grid((unsigned)nk, (unsigned)C);
    if (g->prec == GPU_BF16) {
        bf16 *tb = (bf16 *)a->tail;   /* (rows ada_pad8(Vk) apart) */
        const int wk = ada_pad8(Vk);
        if (gpu_linear_bf16_out(g, tb, pb, a->out_w_h[k], nk, dk, wk, err)) return -1;
        ada_part_kernel<bf16><<<grid, 256, 0, g->stream>>>(tb, wk, Vk, a->out_b[k], a->part, C, true, tgt, rows, lo, a->tval);
    } else {
        if (gpu_linear_ld(g, a->tail, a->ldt, p, a->out_w[k], nk, dk, Vk, err)) return -1;
        ada_part_kernel<float><<<grid, 256, 0, g->stream>>>(a->tail, a->ldt, Vk, a->out_b[k], a->part, C, true, tgt, rows, lo,
                                                            a->tval);
    }
    ada_target_rows_kernel<<<(nk + 3) / 4, 128, 0, g->stream>>>(tl, tgt, rows, nk, a->hcol, k, a->tval, a->part, C, lo,
                                                                 lo + Vk);
    LAUNCH_TRY(err, "ada_target");
    return 0;
}

int gpu_ada_logprobs(gpu_model *g, const float *x, const bf16 *xb, int n, const int32_t *tgt, const int32_t *htgt, float *tl,
                     char *err)
{
    const gpu_ada *a = g->ada;
    const int D = g->m->d_model, V = g->m->V, H = a->H, c1 = a->cut[1];
    const bool bf = g->prec == GPU_BF16;
    /* a step of targets only: each tail cluster computes the rows whose
     * target lies in it, gathered, instead of all n (on text most targets
     * are in the head; on any, a row needs one tail). The rows' lists and
     * counts are made on the host from its copy of the targets (HTGT), as
     * the step's inputs, and go up with one copy: the host never waits for
     * the device inside a step. */
    const bool gather = tgt && htgt && a->n > 1;
    if (gather) {
        int *hr = a->h_rows;
        for (int k = 1; k < a->n; k++) a->h_cnt[k - 1] = 0;
        for (int r = 0; r < n; r++) {
            int k = 1;
            while (k < a->n && htgt[r] >= a->cut[k + 1]) k++;
            if (htgt[r] >= a->cut[1] && k < a->n) hr[(size_t)(k - 1) * n + a->h_cnt[k - 1]++] = r;
        }
        for (int k = 1; k < a->n; k++) hr[(size_t)(a->n - 1) * n + k - 1] = a->h_cnt[k - 1];
        CU_TRY(cudaMemcpyAsync(a->rows, hr, ((size_t)(a->n - 1) * n + a->n - 1) * sizeof(int), cudaMemcpyHostToDevice,
                               g->stream),
               err, "copying the clusters' rows");
    }
    for (int k = 0; k < a->n; k++) {
        if (gather && k > 0 && a->h_cnt[k - 1] == 0) continue;   /* no row's target in this cluster */
        /* h Q_k: into hp (hpb), or h itself where the cluster has no projection */
        const float *p = x;
        const bf16 *pb = xb;
        if (a->proj_t[k] && !a->proj_b[k]) {
            if (bf ? gpu_linear_bf16_out(g, a->hpb, xb, a->proj_t_h[k], n, D, a->dim[k], err)
                   : gpu_linear(g, a->hp, x, a->proj_t[k], n, D, a->dim[k], err))
                return -1;
            p = a->hp;
            pb = a->hpb;
        } else if (a->proj_t[k]) {   /* par-tf: h Q_k + q_k, the sum in float, then (bf16) rounded once */
            if ((bf ? gpu_linear_bf16(g, a->hp, xb, a->proj_t_h[k], n, D, a->dim[k], err)
                    : gpu_linear(g, a->hp, x, a->proj_t[k], n, D, a->dim[k], err)) ||
                gpu_gpt_bias(g, a->hp, bf ? a->hpb : NULL, a->hp, a->proj_b[k], n, a->dim[k], err))
                return -1;
            p = a->hp;
            pb = a->hpb;
        }
        /* GEMMs into buffers whose rows are 8 floats aligned (the logits' V
         * apart are not: cuBLAS then leaves the tensor cores); in bf16 as
         * wide as the padded weights (ada_pad8), which an odd width needs too */
        if (k == 0 && tgt) {   /* the head's log-sum-exp a row, and the shortlist's targets: no row written */
            if (ada_head_targets(g, p, pb, n, tgt, tl, err)) return -1;
            continue;
        }
        if (k == 0) {
            if (bf ? gpu_linear_bf16_ld(g, a->head, a->ldh, pb, a->head_w_h, n, a->dim[0], ada_pad8(H), err)
                   : gpu_linear_ld(g, a->head, a->ldh, p, a->head_w, n, a->dim[0], H, err))
                return -1;
            if (ada_lsm(g, a->head, a->ldh, a->head, a->ldh, H, a->head_b, NULL, 0, 0, n, err)) return -1;
            ada_head_kernel<<<n, 256, 0, g->stream>>>(g->logits, a->head, V, a->ldh, c1);
            LAUNCH_TRY(err, "ada_head");
            continue;
        }
        if (gather) {   /* the cluster's rows only: gathered, their logits, partials and targets */
            const int nk = a->h_cnt[k - 1], dk = a->dim[k];
            const int *rows = a->rows + (size_t)(k - 1) * n;
            const unsigned gb = (unsigned)(((size_t)nk * dk + 255) / 256);
            if (bf) ada_gather_kernel<bf16><<<gb, 256, 0, g->stream>>>(a->hgb, pb, rows, nk, dk);
            else ada_gather_kernel<float><<<gb, 256, 0, g->stream>>>(a->hg, p, rows, nk, dk);
            LAUNCH_TRY(err, "ada_gather");
            if (ada_tail_targets(g, k, a->hg, a->hgb, nk, rows, tgt, tl, err)) return -1;
            continue;
        }
        if (tgt) {   /* every row's partials, and the targets of the rows whose target lies in the cluster */
            if (ada_tail_targets(g, k, p, pb, n, NULL, tgt, tl, err)) return -1;
            continue;
        }
        const int lo = a->cut[k], Vk = a->cut[k + 1] - lo, wk = bf ? ada_pad8(Vk) : Vk;
        if ((bf ? gpu_linear_bf16_ld(g, a->tail, a->ldt, pb, a->out_w_h[k], n, a->dim[k], wk, err)
                : gpu_linear_ld(g, a->tail, a->ldt, p, a->out_w[k], n, a->dim[k], Vk, err)) ||
            ada_lsm(g, g->logits + lo, V, a->tail, a->ldt, Vk, a->out_b[k], a->head, a->ldh, H - k, n, err))
            return -1;
    }
    return 0;
}
