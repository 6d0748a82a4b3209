/*
 * aspan_attn.cu - adaptive-span attention of one layer, visiting only each
 * head's window (core/aspan.c, the reference's AdaptiveSpan in eval mode).
 *
 * For a query at position t = p0 + i of stream b and head h, distances
 * d = 1..kw (kw = krows[h], the keys kept):
 *   s(d) = (q . k_{t-d} + q . key_pe[:, S-d]) / sqrt(D)
 *   p(d) = exp(s(d) - max s) / sum_{d'<=kw} exp(s(d') - max s)
 *   a(d) = p(d) * m(d) for d = 1..r (r = reach[h]: m is zero past it)
 *   out  = sum_d a(d) v_{t-d} / (sum_d a(d) + 1e-8)
 * A key or value at position t-d is the block's own row i-d when d <= i,
 * else a ring row: ring_slot(t-d, kw) of the head's key ring, ring_slot(t-d,
 * r) of its value ring (found from the slot of t by a subtraction: a 64-bit
 * modulo per key cost more than the key's arithmetic). Rows before the start are the zeros the ring was
 * made of. The ring writes of this block come in a later launch (ring.cu),
 * so every read here sees the memory as it was before the block.
 *
 * One thread block per (query, head); its warps take tiles of 32 distances.
 * A key row is read by a whole warp, lanes over its dims (coalesced), for 32
 * keys at once, and warp_transpose_sum leaves key d0+lane's dot product in
 * lane `lane`; the position term reads key_pe's column S-d, lanes over d
 * (coalesced too). Pass 1 keeps the scores in shared memory (recomputed when
 * the window is past ASPAN_SCORE_CAP) and takes their maximum; pass 2 sums
 * the softmax's denominator in double, as core; pass 3 forms each weight in
 * its lane, broadcasts it, and the warp adds weight x value row (lanes over
 * dims, registers) for its tiles; the warps' sums meet in shared memory.
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

/* Scores kept in shared memory up to this many distances (64 KB). */
#define ASPAN_SCORE_CAP 16384
/* Dims a lane accumulates in registers per pass over the values: 4 x 32. */
#define ASPAN_DCHUNK 128

typedef struct {
    const float *q;       /* shared: the query's D dims */
    const float *kb;      /* the block's key row 0 of this head (row stride `stride`) */
    const float *kr;      /* the head's key ring */
    const float *key_pe;  /* D x S */
    size_t stride;
    int kslot;            /* key-ring slot of the query's own position: distance d is slot kslot - d (mod kw) */
    int D, S, i, kw;
    float scale;
} aspan_keys;

/* The score of distance d0 + lane (meaningless past kw); every lane of the
 * warp must call it with the same d0. */
__device__ __forceinline__ static float aspan_tile_scores(const aspan_keys *a, int d0, int lane)
{
    const int D = a->D;
    float v[32];
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int d = d0 + j;
        float part = 0.0f;
        if (d <= a->kw) {
            const int sl = a->kslot - d < 0 ? a->kslot - d + a->kw : a->kslot - d;
            const float *k = d <= a->i ? a->kb + (size_t)(a->i - d) * a->stride : a->kr + (size_t)sl * D;
            for (int c = lane; c < D; c += 32) part = fmaf(a->q[c], k[c], part);
        }
        v[j] = part;
    }
    const float qk = warp_transpose_sum(v, lane);
    const int d = d0 + lane;
    float qp = 0.0f;
    if (d <= a->kw) {
        const float *pe = a->key_pe + (a->S - d);
        for (int c = 0; c < D; c++) qp = fmaf(a->q[c], pe[(size_t)c * a->S], qp);
    }
    return (qk + qp) / a->scale;
}

__global__ static void __launch_bounds__(512) aspan_attn_kernel(float *att, const float *qkv, int M, int D, int S, float scale,
                                         const float *key_pe, const int *krows, const int *reach,
                                         const int64_t *mask_off, const float *derived, const int64_t *off,
                                         float *const *ring, const int64_t *pos, int cap)
{
    extern __shared__ float sm[];
    __shared__ float fred[32];
    __shared__ double dred[32];
    const int n = blockIdx.x, h = blockIdx.y, K = gridDim.y, H = K * D, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, NW = blockDim.x >> 5;
    const int b = n / M, i = n % M, r = reach[h], kw = krows[h];
    float *out = att + (size_t)n * H + (size_t)h * D;
    if (r == 0) {   /* a head whose mask is zero everywhere outputs zeros */
        for (int c = tid; c < D; c += blockDim.x) out[c] = 0.0f;
        return;
    }
    float *q = sm, *accw = q + D, *sc = accw + NW * ASPAN_DCHUNK;
    aspan_keys a;
    a.stride = (size_t)3 * H;
    a.q = q;
    a.kb = qkv + (size_t)b * M * a.stride + H + (size_t)h * D;
    a.kr = ring[b] + off[h];
    a.key_pe = key_pe;
    a.kslot = ring_slot(pos[b] + i, kw);   /* the one 64-bit division: slots move by subtraction */
    a.D = D;
    a.S = S;
    a.i = i;
    a.kw = kw;
    a.scale = scale;
    const float *vb = a.kb + H, *vr = a.kr + (size_t)kw * D;
    const int vslot = ring_slot(pos[b] + i, r);
    const bool store = kw <= cap;
    for (int c = tid; c < D; c += blockDim.x) q[c] = qkv[(size_t)n * a.stride + (size_t)h * D + c];
    __syncthreads();

    float mx = -INFINITY;
    for (int d0 = 1 + 32 * warp; d0 <= kw; d0 += 32 * NW) {
        const float s = aspan_tile_scores(&a, d0, lane);
        if (d0 + lane <= kw) {
            if (store) sc[d0 + lane - 1] = s;
            mx = fmaxf(mx, s);
        }
    }
    mx = block_max(mx, fred);   /* its barrier also publishes sc */
    double z = 0;
    for (int d0 = 1 + 32 * warp; d0 <= kw; d0 += 32 * NW) {
        const float s = store ? sc[min(d0 + lane, kw) - 1] : aspan_tile_scores(&a, d0, lane);
        if (d0 + lane <= kw) z += expf(s - mx);
    }
    z = block_sum(z, dred);

    const float *mask = derived + mask_off[h];
    double wsum = 0;
    float inv = 0.0f;
    for (int cb = 0; cb < D; cb += ASPAN_DCHUNK) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int d0 = 1 + 32 * warp; d0 <= r; d0 += 32 * NW) {
            const int d = d0 + lane;
            const float s = store ? sc[min(d, kw) - 1] : aspan_tile_scores(&a, d0, lane);
            const float wt = d <= r ? (float)((double)expf(s - mx) / z) * mask[d - 1] : 0.0f;
            if (cb == 0) wsum += wt;
            const int cnt = r - d0 + 1 < 32 ? r - d0 + 1 : 32;
#pragma unroll 4
            for (int j = 0; j < cnt; j++) {
                const float w = __shfl_sync(0xffffffffu, wt, j);
                const int dd = d0 + j;
                const int sl = vslot - dd < 0 ? vslot - dd + r : vslot - dd;
                const float *v = dd <= i ? vb + (size_t)(i - dd) * a.stride : vr + (size_t)sl * D;
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    const int c = cb + lane + 32 * t;
                    if (c < D && c < cb + ASPAN_DCHUNK) acc[t] = fmaf(w, v[c], acc[t]);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < 4; t++) accw[warp * ASPAN_DCHUNK + lane + 32 * t] = acc[t];
        if (cb == 0) inv = (float)(1.0 / (block_sum(wsum, dred) + 1e-8));   /* its barrier publishes accw */
        else __syncthreads();
        for (int c = tid; c < ASPAN_DCHUNK && cb + c < D; c += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < NW; w++) o += accw[w * ASPAN_DCHUNK + c];
            out[cb + c] = o * inv;
        }
        __syncthreads();   /* accw is read before the next chunk writes it */
    }
}

/* Shared memory of a block of T threads: the query, the warps' sums, the
 * scores kept. */
static size_t aspan_smem(const gpu_model *g, int T)
{
    const int cap = g->max_window < ASPAN_SCORE_CAP ? g->max_window : ASPAN_SCORE_CAP;
    return (size_t)(g->m->d_head + (T / 32) * ASPAN_DCHUNK + cap) * sizeof(float);
}

size_t gpu_aspan_attn_smem(const gpu_model *g) { return aspan_smem(g, 512); }

int gpu_aspan_attn(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int K = m->n_head, D = m->d_head;
    /* few (query, head) pairs (decode): more warps each, to share a long span */
    const int T = (int64_t)B * M * K < 1024 ? 512 : 128;
    const int cap = g->max_window < ASPAN_SCORE_CAP ? g->max_window : ASPAN_SCORE_CAP;
    const size_t smem = aspan_smem(g, T);
    if (smem > 48 * 1024)
        CU_TRY(cudaFuncSetAttribute(aspan_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err,
               "aspan_attn: shared memory");
    dim3 grid((unsigned)(B * M), (unsigned)K);
    aspan_attn_kernel<<<grid, T, smem, g->stream>>>(
        g->att, g->qkv, M, D, m->span, sqrtf((float)D), g->key_pe, g->krows + (size_t)l * K, g->reach + (size_t)l * K,
        g->mask_off + (size_t)l * K, g->derived, g->d_off + (size_t)l * K, stage_ring(g, g->d_stage),
        stage_pos(g, g->d_stage), cap);
    LAUNCH_TRY(err, "aspan_attn");
    return 0;
}
