/*
 * gpt_attn.cu - causal attention within ragged windows (core/gpt.c's
 * attend), for a group of a window model's step: one warp per (row, head).
 *
 * The query at window row i of a window of T = cached + n rows attends to
 * the keys of rows 0..i: rows below `cached` from the stream's cache
 * (layer l's slot: K rows, then V rows window x E elements later), the
 * others from this group's projections (the window's computed rows at
 * row0..). With s_r = q.k_r / sqrt(hs), e_r = exp(s_r - max) and m_r the
 * head's span mask of the key's distance from the window's LAST row
 * (gpt-adaptive-span: mask[h][T-1-r]; 1 without spans), core computes
 *
 *   p_r = e_r / sum e,   a_r = p_r m_r / (sum_r p_r m_r + 1e-8),
 *   out = sum_r a_r v_r,
 *
 * i.e. out = sum(e m v) / (sum(e m) + 1e-8 sum(e)): one pass over the keys
 * with a running max (flash attention's online softmax) that rescales both
 * sums and the output, then one division. Without spans out = sum(e v) /
 * sum(e).
 *
 * Keys go 32 at a time, a lane a key: its score (its own dot product over
 * the head's dims, summed in core's order), the chunk's max and sums by warp
 * shuffles; then the chunk's values a row at a time, each lane a slice of
 * the dims (coalesced), weights by shuffle, keys of weight 0 (beyond a span)
 * skipped. The query and the output sums live in shared memory, a slice per
 * warp (2 x hs floats), so any head size fits that the device's shared
 * memory holds (gpu_model_new refuses the rest at load).
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

#define GPT_ATTN_WARPS 4

template <typename T>
__global__ static void __launch_bounds__(32 * GPT_ATTN_WARPS)
    gpt_attn_kernel(T *att, const T *qkv, void *const *rings, size_t off, int C, const gpu_gpt_win *win,
                    const int32_t *rowwin, const float *mask, int R, int K, int hs, float scale)
{
    extern __shared__ float sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t idx = (int64_t)blockIdx.x * GPT_ATTN_WARPS + warp;
    if (idx >= (int64_t)R * K) return;   /* the whole warp: no block-wide barrier below */
    const int row = (int)(idx / K), h = (int)(idx % K), E = K * hs;
    float *q = sm + (size_t)warp * 2 * hs, *acc = q + hs;   /* acc[c]: only lane c % 32 touches it */
    const gpu_gpt_win w = win[rowwin[row]];
    const int i = w.cached + (row - w.row0), rows = w.cached + w.n;   /* the query's window row; the window's rows */
    const T *qrow = qkv + (size_t)row * 3 * E + (size_t)h * hs;
    for (int c = lane; c < hs; c += 32) {
        q[c] = ldf(qrow + c);
        acc[c] = 0.0f;
    }
    __syncwarp();
    /* key and value of window row r: the cache below `cached`, else this group's row */
    const T *ck = w.cached ? (const T *)rings[w.b] + off + (size_t)h * hs : NULL;
    const T *cv = ck ? ck + (size_t)C * E : NULL;
    const float *hm = mask ? mask + (size_t)h * C : NULL;
    float mx = -INFINITY, se = 0.0f, sem = 0.0f;
    for (int base = 0; base <= i; base += 32) {
        const int r = base + lane;
        const bool ok = r <= i;
        float s = -INFINITY;
        if (ok) {
            const T *k = r < w.cached ? ck + (size_t)r * E
                                      : qkv + (size_t)(w.row0 + r - w.cached) * 3 * E + E + (size_t)h * hs;
            float d = 0.0f;
            for (int c = 0; c < hs; c++) d += q[c] * ldf(k + c);
            s = d * scale;
        }
        const float nmx = fmaxf(mx, warp_max(s));   /* finite: key `base` <= i is in the chunk */
        const float alpha = expf(mx - nmx);         /* 0 for the first chunk (mx = -inf) */
        const float e = ok ? expf(s - nmx) : 0.0f;
        const float em = ok && hm ? e * hm[rows - 1 - r] : e;
        se = se * alpha + warp_sum(e);
        sem = sem * alpha + warp_sum(em);
        mx = nmx;
        for (int c = lane; c < hs; c += 32) acc[c] *= alpha;
        const int nk = i + 1 - base < 32 ? i + 1 - base : 32;
        for (int t = 0; t < nk; t++) {
            const float a = __shfl_sync(0xffffffffu, em, t);   /* the same for every lane */
            if (a == 0.0f) continue;
            const int rr = base + t;
            const T *v = rr < w.cached ? cv + (size_t)rr * E
                                       : qkv + (size_t)(w.row0 + rr - w.cached) * 3 * E + 2 * (size_t)E + (size_t)h * hs;
            for (int c = lane; c < hs; c += 32) acc[c] += a * ldf(v + c);
        }
    }
    const float inv = hm ? 1.0f / (sem + 1e-8f * se) : 1.0f / se;
    T *o = att + (size_t)row * E + (size_t)h * hs;
    for (int c = lane; c < hs; c += 32) stf(o + c, acc[c] * inv);
}

size_t gpu_gpt_attn_smem(const gpu_model *g) { return (size_t)GPT_ATTN_WARPS * 2 * g->m->d_head * sizeof(float); }

template <typename T>
static int launch(gpu_model *g, T *att, const T *qkv, int l, const gpu_gpt_win *w, int R, const int32_t *rowwin,
                  char *err)
{
    const model_t *m = g->m;
    const int K = m->n_head, hs = m->d_head;
    const size_t smem = gpu_gpt_attn_smem(g);
    if (smem > 48 * 1024)   /* past the default: the device's opt-in (gpu_model_new checked it) */
        CU_TRY(cudaFuncSetAttribute(gpt_attn_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err,
               "cudaFuncSetAttribute (gpt attention)");
    const int64_t warps = (int64_t)R * K;
    const unsigned blocks = (unsigned)((warps + GPT_ATTN_WARPS - 1) / GPT_ATTN_WARPS);
    gpt_attn_kernel<T><<<blocks, 32 * GPT_ATTN_WARPS, smem, g->stream>>>(
        att, qkv, (void *const *)stage_ring(g, g->d_stage), m->cache_kv ? g->h_off[l] : 0, m->window,
        w, rowwin, g->L[l].wmask, R, K, hs, 1.0f / sqrtf((float)hs));
    LAUNCH_TRY(err, "gpt_attn");
    return 0;
}

int gpu_gpt_attn(gpu_model *g, int l, const gpu_gpt_win *w, int R, const int32_t *rowwin, char *err)
{
    if (R <= 0) return 0;
    return g->prec == GPU_BF16 ? launch(g, g->attb, (const bf16 *)g->qkvb, l, w, R, rowwin, err)
                               : launch(g, g->att, (const float *)g->qkv, l, w, R, rowwin, err);
}
