/*
 * aspan_pers.cu - adaptive-span attention with persistent memory (the
 * all-attention layers; core/aspan.c has the math): for a query at
 * position t = p0 + i of stream b and head h,
 *   s(d) = (q . k_{t-d} + q . key_pe[:, S-d]) / sqrt(D),  d = 1..kw
 *   s(n) = (q . key'_n) / sqrt(D),  n = 1..N   (key' = key sqrt(D), derived)
 *   p = exp(s - max) / sum over both;  a(d) = p(d) m(d) for d <= r;  a(n) = p(n)
 *   out = (sum_d a(d) v_{t-d} + sum_n a(n) val'_n) / (sum a + 1e-8)
 * One block of threads per (query, head): the scores in shared memory, the
 * sums in double, and each thread one output dim, adding the terms in
 * core's order (distances from the farthest, then the persistent vectors),
 * so that it is core's float arithmetic. Keys and values at distance d are
 * the block's own rows while d <= i, else ring rows, as aspan_attn.cu reads
 * them; the ring writes come in a later launch.
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

#define PERS_THREADS 128

template <typename RT>
__global__ static void __launch_bounds__(PERS_THREADS)
    pers_attn_kernel(float *att, bf16 *attb, const RT *qkv, int M, int D, int S, int N, float scale,
                     const float *key_pe, const int *krows, const int *reach, const int64_t *mask_off,
                     const float *derived, const float *pk, const float *pv, const int64_t *off, RT *const *ring,
                     const int64_t *pos)
{
    extern __shared__ float sm[];
    __shared__ float fred[32];
    __shared__ double dred[32];
    const int n = blockIdx.x, h = blockIdx.y, K = gridDim.y, H = K * D, tid = threadIdx.x;
    const int b = n / M, i = n % M, r = reach[h], kw = krows[h];
    const size_t stride = (size_t)3 * H, oo = (size_t)n * H + (size_t)h * D;
    float *q = sm, *s = q + D;   /* s: kw context scores, then N persistent ones */
    const RT *kb = qkv + (size_t)b * M * stride + H + (size_t)h * D, *vb = kb + H;
    const RT *kr = ring[b] + off[h], *vr = kr + (size_t)kw * D;
    const int64_t t = pos[b] + i;
    const float *pkh = pk + (size_t)h * N * D, *pvh = pv + (size_t)h * N * D;
    for (int c = tid; c < D; c += blockDim.x) q[c] = ldf(qkv + (size_t)n * stride + (size_t)h * D + c);
    __syncthreads();
    float mx = -INFINITY;
    for (int j = tid; j < kw + N; j += blockDim.x) {
        float v = 0.0f;
        if (j < kw) {   /* distance d = kw - j, in core's order of the scores */
            const int d = kw - j;
            const RT *k = d <= i ? kb + (size_t)(i - d) * stride : kr + (size_t)ring_slot(t - d, kw) * D;
            float qk = 0.0f, qp = 0.0f;
            for (int c = 0; c < D; c++) qk = fmaf(q[c], ldf(k + c), qk);
            for (int c = 0; c < D; c++) qp = fmaf(q[c], key_pe[(size_t)c * S + (S - d)], qp);
            v = (qk + qp) / scale;
        } else {
            const float *k = pkh + (size_t)(j - kw) * D;
            for (int c = 0; c < D; c++) v = fmaf(q[c], k[c], v);
            v = v / scale;
        }
        s[j] = v;
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx, fred);   /* its barrier also publishes s */
    double z = 0;
    for (int j = tid; j < kw + N; j += blockDim.x) z += expf(s[j] - mx);
    z = block_sum(z, dred);
    /* the weights: the context's masked (distances 1..r: s[kw - d]), the persistent ones not */
    const float *mask = derived + mask_off[h];
    double w = 0;
    for (int j = tid; j < kw + N; j += blockDim.x) {
        const int d = kw - j;
        const float p = (float)((double)expf(s[j] - mx) / z);
        s[j] = j < kw ? (d <= r ? p * mask[d - 1] : 0.0f) : p;
        w += s[j];
    }
    w = block_sum(w, dred);   /* its barrier publishes the weights */
    const float inv = (float)(1.0 / (w + 1e-8));
    for (int c = tid; c < D; c += blockDim.x) {
        float o = 0.0f;
        for (int d = r; d >= 1; d--) {
            const RT *v = d <= i ? vb + (size_t)(i - d) * stride : vr + (size_t)ring_slot(t - d, r) * D;
            o += s[kw - d] * inv * ldf(v + c);
        }
        for (int m = 0; m < N; m++) o += s[kw + m] * inv * pvh[(size_t)m * D + c];
        if (attb) stf(attb + oo + c, o);
        else att[oo + c] = o;
    }
}

size_t gpu_aspan_pers_smem(const gpu_model *g)
{
    return (size_t)(g->m->d_head + g->max_window + g->m->pers) * sizeof(float);
}

int gpu_aspan_pers_attn(gpu_model *g, int l, int B, int M, char *err)
{
    const int tc = gpu_aspan_mma(g, l, B, M, err);   /* bf16 blocks of queries: on tensor cores (attn_mma.cu) */
    if (tc) return tc < 0 ? -1 : 0;
    const model_t *m = g->m;
    const int K = m->n_head, D = m->d_head;
    const size_t smem = gpu_aspan_pers_smem(g);
    const bool bf = g->prec == GPU_BF16;
    const int *kr = g->krows + (size_t)l * K, *re = g->reach + (size_t)l * K;
    const int64_t *mo = g->mask_off + (size_t)l * K, *off = g->d_off + (size_t)l * K, *pos = stage_pos(g, g->d_stage);
    const gpu_layer *y = &g->L[l];
    dim3 grid((unsigned)(B * M), (unsigned)K);
    if (smem > 48 * 1024)
        CU_TRY(bf ? cudaFuncSetAttribute(pers_attn_kernel<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                  : cudaFuncSetAttribute(pers_attn_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
               err, "aspan_pers: shared memory");
    if (bf)
        pers_attn_kernel<bf16><<<grid, PERS_THREADS, smem, g->stream>>>(
            NULL, g->attb, g->qkvb, M, D, m->span, m->pers, sqrtf((float)D), g->key_pe, kr, re, mo, g->derived, y->pk,
            y->pv, off, (bf16 *const *)stage_ring(g, g->d_stage), pos);
    else
        pers_attn_kernel<float><<<grid, PERS_THREADS, smem, g->stream>>>(
            g->att, NULL, g->qkv, M, D, m->span, m->pers, sqrtf((float)D), g->key_pe, kr, re, mo, g->derived, y->pk,
            y->pv, off, stage_ring(g, g->d_stage), pos);
    LAUNCH_TRY(err, "aspan_pers");
    return 0;
}
