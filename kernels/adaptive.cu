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
 *     and sum of exp (double), then each chunk's block meets its row's
 *     partials into the log-sum-exp and writes its chunk.
 * GPU_BF16: the projections write bfloat16, the GEMMs read bfloat16 weights
 * and sum in float32 (as every linear layer of the bf16 step).
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

#define ADA_CHUNK 4096

/* Chunk c of row r of Y (rows LD apart, a multiple of 4; LEN wide): + bias
 * (in place unless KEEP: a step of targets reads only its targets, adding
 * their bias); its max and sum of exp into part[(r * C + c) * 2]. A thread
 * takes 4 runs of 4 floats (16-byte loads; the bias as it lies, a float at
 * a time); the exponentials in float (each at most 1), the block's sum in
 * double. */
__global__ static void __launch_bounds__(256) ada_part_kernel(float *y, int ld, int len, const float *bias, double *part,
                                                              int C, bool keep)
{
    __shared__ float fs[32];
    __shared__ double ds[32];
    const int r = blockIdx.x, c = blockIdx.y, j0 = c * ADA_CHUNK, j1 = min(len, j0 + ADA_CHUNK);
    float *row = y + (size_t)r * ld;
    float v[ADA_CHUNK / 256];   /* this thread's values of the chunk (blockDim.x == 256) */
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < ADA_CHUNK / 1024; k++) {
        const int j = j0 + 4 * (threadIdx.x + 256 * k);
        float4 x = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        if (j + 3 < j1) {
            x = *(const float4 *)(row + j);
            x.x += __ldg(bias + j), x.y += __ldg(bias + j + 1), x.z += __ldg(bias + j + 2), x.w += __ldg(bias + j + 3);
            if (!keep) *(float4 *)(row + j) = x;
        } else {
            float *e = &x.x;
            for (int i = 0; i < 4 && j + i < j1; i++) {
                e[i] = row[j + i] + __ldg(bias + j + i);
                if (!keep) row[j + i] = e[i];
            }
        }
        v[4 * k] = x.x, v[4 * k + 1] = x.y, v[4 * k + 2] = x.z, v[4 * k + 3] = x.w;
        mx = fmaxf(mx, fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)));
    }
    mx = block_max(mx, fs);
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < ADA_CHUNK / 256; k++) t += expf(v[k] - mx);   /* (exp(-inf) = 0) */
    const double s = block_sum((double)t, ds);
    if (threadIdx.x == 0) {
        part[((size_t)r * C + c) * 2] = mx;
        part[((size_t)r * C + c) * 2 + 1] = s;
    }
}

/* The log-sum-exp of row R from its C chunks' partials at P */
__device__ static double ada_lse(const double *p, int C)
{
    double mx = -INFINITY, s = 0;
    for (int k = 0; k < C; k++) mx = fmax(mx, p[2 * k]);
    for (int k = 0; k < C; k++) s += p[2 * k + 1] * exp(p[2 * k] - mx);
    return mx + log(s);
}

/* The row's log-sum-exp from its chunks' partials; chunk c of SRC (rows LDS
 * apart) written to DST (rows LDD apart) as x - lse (+ head[r][col] when
 * head is given, rows LDH apart). */
__global__ static void ada_write_kernel(float *dst, int ldd, const float *src, int lds, int len, const double *part,
                                        int C, const float *head, int ldh, int col)
{
    __shared__ double lse_s;
    const int r = blockIdx.x, c = blockIdx.y, j0 = c * ADA_CHUNK, j1 = min(len, j0 + ADA_CHUNK);
    if (threadIdx.x == 0) lse_s = ada_lse(part + (size_t)r * C * 2, C);
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
    ada_part_kernel<<<grid, 256, 0, g->stream>>>(src, lds, len, bias, g->ada->part, C, false);
    ada_write_kernel<<<grid, 256, 0, g->stream>>>(dst, ldd, src, lds, len, g->ada->part, C, head, ldh, col);
    LAUNCH_TRY(err, "ada_lsm");
    return 0;
}

/* Scoring (every row wants only its target's logprob), the head's pass:
 * row r's head log-sum-exp (its chunks' partials) into hlse[r]; a target T
 * in the shortlist has the logprob head[r][T] + b[T] - lse. Nothing else is
 * written. */
__global__ static void ada_head_target_kernel(float *tl, double *hlse, const int32_t *tgt, const float *head, int ldh,
                                              const float *hb, const double *part, int C, int c1, int n)
{
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    const double lse = ada_lse(part + (size_t)r * C * 2, C);
    hlse[r] = lse;
    const int t = tgt[r];
    if (t >= 0 && t < c1) tl[r] = (float)((double)(head[(size_t)r * ldh + t] + hb[t]) - lse);
}

/* A tail cluster's rows: row i of TAIL is step row rows[i] (or i where rows
 * is NULL; i < n), its logits without their bias; the target's logprob
 * is the head's column COL for the cluster (less the head's log-sum-exp)
 * plus the target's logit less the tail's log-sum-exp. */
__global__ static void ada_target_rows_kernel(float *tl, const int32_t *tgt, const int *rows, int n,
                                              const float *head, int ldh, const float *hb, const double *hlse,
                                              const float *tail, int ldt, const float *bias, const double *part, int C,
                                              int lo, int hi, int col)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int r = rows ? rows[i] : i, t = tgt[r];
    if (t < lo || t >= hi) return;
    const float hc = (float)((double)(head[(size_t)r * ldh + col] + hb[col]) - hlse[r]);
    tl[r] = hc + (float)((double)(tail[(size_t)i * ldt + (t - lo)] + bias[t - lo]) - ada_lse(part + (size_t)i * C * 2, C));
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
        if (k == 0) {
            const int C = (H + ADA_CHUNK - 1) / ADA_CHUNK;
            if (bf ? gpu_linear_bf16_ld(g, a->head, a->ldh, pb, a->head_w_h, n, a->dim[0], ada_pad8(H), err)
                   : gpu_linear_ld(g, a->head, a->ldh, p, a->head_w, n, a->dim[0], H, err))
                return -1;
            if (tgt) {   /* the head's log-sum-exp a row, and the shortlist's targets: no row written */
                ada_part_kernel<<<dim3((unsigned)n, (unsigned)C), 256, 0, g->stream>>>(a->head, a->ldh, H, a->head_b, a->part,
                                                                                       C, true);
                ada_head_target_kernel<<<(n + 127) / 128, 128, 0, g->stream>>>(tl, a->hlse, tgt, a->head, a->ldh, a->head_b,
                                                                                a->part, C, c1, n);
                LAUNCH_TRY(err, "ada_head_target");
                continue;
            }
            if (ada_lsm(g, a->head, a->ldh, a->head, a->ldh, H, a->head_b, NULL, 0, 0, n, err)) return -1;
            ada_head_kernel<<<n, 256, 0, g->stream>>>(g->logits, a->head, V, a->ldh, c1);
            LAUNCH_TRY(err, "ada_head");
            continue;
        }
        const int lo = a->cut[k], Vk = a->cut[k + 1] - lo, C = (Vk + ADA_CHUNK - 1) / ADA_CHUNK, wk = bf ? ada_pad8(Vk) : Vk;
        if (gather) {   /* the cluster's rows only: gathered, their logits, partials and targets */
            const int nk = a->h_cnt[k - 1], dk = a->dim[k];
            const int *rows = a->rows + (size_t)(k - 1) * n;
            const unsigned gb = (unsigned)(((size_t)nk * dk + 255) / 256);
            if (bf) ada_gather_kernel<bf16><<<gb, 256, 0, g->stream>>>(a->hgb, pb, rows, nk, dk);
            else ada_gather_kernel<float><<<gb, 256, 0, g->stream>>>(a->hg, p, rows, nk, dk);
            LAUNCH_TRY(err, "ada_gather");
            if (bf ? gpu_linear_bf16_ld(g, a->tail, a->ldt, a->hgb, a->out_w_h[k], nk, dk, wk, err)
                   : gpu_linear_ld(g, a->tail, a->ldt, a->hg, a->out_w[k], nk, dk, Vk, err))
                return -1;
            ada_part_kernel<<<dim3((unsigned)nk, (unsigned)C), 256, 0, g->stream>>>(a->tail, a->ldt, Vk, a->out_b[k], a->part,
                                                                                    C, true);
            ada_target_rows_kernel<<<(nk + 127) / 128, 128, 0, g->stream>>>(tl, tgt, rows, nk, a->head,
                                                                             a->ldh, a->head_b, a->hlse, a->tail, a->ldt,
                                                                             a->out_b[k], a->part, C, lo, lo + Vk, H - k);
            LAUNCH_TRY(err, "ada_target");
            continue;
        }
        if (bf ? gpu_linear_bf16_ld(g, a->tail, a->ldt, pb, a->out_w_h[k], n, a->dim[k], wk, err)
               : gpu_linear_ld(g, a->tail, a->ldt, p, a->out_w[k], n, a->dim[k], Vk, err))
            return -1;
        if (tgt) {   /* the tail's partials for every row, and the targets of the rows whose target lies in it */
            ada_part_kernel<<<dim3((unsigned)n, (unsigned)C), 256, 0, g->stream>>>(a->tail, a->ldt, Vk, a->out_b[k], a->part, C,
                                                                                   true);
            ada_target_rows_kernel<<<(n + 127) / 128, 128, 0, g->stream>>>(tl, tgt, NULL, n, a->head, a->ldh, a->head_b,
                                                                            a->hlse, a->tail, a->ldt, a->out_b[k], a->part,
                                                                            C, lo, lo + Vk, H - k);
            LAUNCH_TRY(err, "ada_target");
        } else if (ada_lsm(g, g->logits + lo, V, a->tail, a->ldt, Vk, a->out_b[k], a->head, a->ldh, H - k, n, err))
            return -1;
    }
    return 0;
}
