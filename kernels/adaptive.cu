/*
 * adaptive.cu - the word-level Transformer-XL's adaptive input and adaptive
 * softmax on the device, as core/adaptive.c computes them (its header has
 * the math).
 *
 *   input: a thread per (token, output dim): the token's row of its
 *     cluster's table dotted with that dim's row of the projection, in
 *     core's order (products then sums, no fused multiply-add), times
 *     sqrt(d_model) in double; one launch for every cluster.
 *   softmax: the head (the shortlist and a column per tail cluster) by a
 *     GEMM into a buffer of its own and log_softmax; its shortlist copied
 *     into the logits; each tail cluster k by a GEMM straight into its
 *     columns [c_k, c_{k+1}) of the logits (rows V apart), then one launch a
 *     row that adds its bias, takes the log-softmax of the segment and adds
 *     the head's column for cluster k (the k-th from the end).
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

/* logits[r][j] = head[r][j], j < c1 */
__global__ static void ada_head_kernel(float *logits, const float *head, int V, int H, int c1)
{
    const float *h = head + (size_t)blockIdx.x * H;
    float *o = logits + (size_t)blockIdx.x * V;
    for (int j = threadIdx.x; j < c1; j += blockDim.x) o[j] = h[j];
}

/* Row r's segment [lo, lo + Vk) of the logits: + bias, log-softmax (sums in
 * double, as log_softmax_kernel and core), + the head's column COL. */
__global__ static void ada_tail_kernel(float *logits, const float *bias, const float *head, int V, int H, int lo,
                                       int Vk, int col)
{
    __shared__ float fs[32];
    __shared__ double ds[32];
    float *row = logits + (size_t)blockIdx.x * V + lo;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < Vk; j += blockDim.x) {
        const float v = row[j] + bias[j];
        row[j] = v;
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx, fs);
    double s = 0;
    for (int j = threadIdx.x; j < Vk; j += blockDim.x) s += exp((double)row[j] - mx);
    const double lse = mx + log(block_sum(s, ds));
    const float base = head[(size_t)blockIdx.x * H + col];
    for (int j = threadIdx.x; j < Vk; j += blockDim.x) row[j] = base + (float)((double)row[j] - lse);
}

int gpu_ada_logprobs(gpu_model *g, const float *x, const bf16 *xb, int n, char *err)
{
    const gpu_ada *a = g->ada;
    const int D = g->m->d_model, V = g->m->V, H = a->H, c1 = a->cut[1];
    const bool bf = g->prec == GPU_BF16;
    for (int k = 0; k < a->n; k++) {
        /* h Q_k: into hp (hpb), or h itself where the cluster has no projection */
        const float *p = x;
        const bf16 *pb = xb;
        if (a->proj_t[k]) {
            if (bf ? gpu_linear_bf16_out(g, a->hpb, xb, a->proj_t_h[k], n, D, a->dim[k], err)
                   : gpu_linear(g, a->hp, x, a->proj_t[k], n, D, a->dim[k], err))
                return -1;
            p = a->hp;
            pb = a->hpb;
        }
        if (k == 0) {
            if ((bf ? gpu_linear_bf16(g, a->head, pb, a->head_w_h, n, a->dim[0], H, err)
                    : gpu_linear(g, a->head, p, a->head_w, n, a->dim[0], H, err)) ||
                gpu_log_softmax(g, a->head, a->head_b, n, H, err))
                return -1;
            ada_head_kernel<<<n, 256, 0, g->stream>>>(g->logits, a->head, V, H, c1);
            LAUNCH_TRY(err, "ada_head");
            continue;
        }
        const int lo = a->cut[k], Vk = a->cut[k + 1] - lo;
        if (bf ? gpu_linear_bf16_ld(g, g->logits + lo, V, pb, a->out_w_h[k], n, a->dim[k], Vk, err)
               : gpu_linear_ld(g, g->logits + lo, V, p, a->out_w[k], n, a->dim[k], Vk, err))
            return -1;
        ada_tail_kernel<<<n, Vk >= 1024 ? 256 : 128, 0, g->stream>>>(g->logits, a->out_b[k], a->head, V, H, lo, Vk, H - k);
        LAUNCH_TRY(err, "ada_tail");
    }
    return 0;
}
