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
 * One thread block per (query, head, split): with few pairs (decode) each
 * window is split into chunks of ASPAN_SPLIT_MIN distances or more
 * (flash-decoding); a split leaves its local max m_s, sum z_s of exp(s - m_s),
 * sum w_s of exp(s - m_s) m(d) and the unnormalised output in g->part, and
 * aspan_combine_kernel meets them (the same softmax, mask and 1e-8). Without
 * splits the block normalises itself, as before. Its warps take tiles of 32
 * distances.
 * A key row is read by a whole warp, lanes over its dims (coalesced), for 32
 * keys at once, and warp_transpose_sum leaves key d0+lane's dot product in
 * lane `lane`; the position term reads key_pe's column S-d, lanes over d
 * (coalesced too). A lane issues the loads of several key rows (and
 * position-term columns, and value rows) before their products: one
 * dependent load after another was most of the kernel's time. Pass 1 keeps the scores in shared memory (recomputed when
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
/* Decode (flash-decoding): a window is split into chunks of at least this
 * many distances, for about this many blocks in a step. */
#define ASPAN_SPLIT_MIN 128
#define ASPAN_SPLIT_TARGET 4096
/* Key rows whose loads a lane issues at once (two dims each). */
/* The most threads a block has (few pairs, windows too short to split). */
#ifndef ASPAN_MAXT
#define ASPAN_MAXT 512
#endif
#ifndef ASPAN_KROWS
#define ASPAN_KROWS 8
#endif
#ifndef ASPAN_PEROWS
#define ASPAN_PEROWS 16
#endif
/* Value rows whose loads a warp has in flight at once. */
#ifndef ASPAN_VROWS
#define ASPAN_VROWS 8
#endif

template <typename RT> struct aspan_keys {
    const float *q;       /* shared: the query's D dims */
    const RT *kb;         /* the block's key row 0 of this head (row stride `stride`) */
    const RT *kr;         /* the head's key ring; RT: float, or bf16 in GPU_BF16 */
    const float *key_pe;  /* D x S */
    size_t stride;
    int kslot;            /* key-ring slot of the query's own position: distance d is slot kslot - d (mod kw) */
    int D, S, i, kw;
    int dhi;              /* the last distance this block visits (kw, or its split's end) */
    float scale;
};

/* The score of distance d0 + lane (meaningless past kw); every lane of the
 * warp must call it with the same d0. */
template <typename RT>
__device__ __forceinline__ static float aspan_tile_scores(const aspan_keys<RT> *a, int d0, int lane)
{
    const int D = a->D;
    float v[32];
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = 0.0f;
    /* 64 dims at a time, ASPAN_KROWS key rows' loads issued before their products:
     * the loads of a tile overlap (one dependent load per key row was the
     * cost); the sums run in core's order (dims lane, lane + 32, ...) */
    for (int cb = 0; cb < D; cb += 64) {
        const int c0 = cb + lanes<RT>::pd0(lane), c1 = cb + lanes<RT>::pd1(lane);
        const float q0 = c0 < D ? a->q[c0] : 0.0f, q1 = c1 < D ? a->q[c1] : 0.0f;
#pragma unroll
        for (int hf = 0; hf < 32; hf += ASPAN_KROWS) {
            float k0[ASPAN_KROWS], k1[ASPAN_KROWS];
#pragma unroll
            for (int j = 0; j < ASPAN_KROWS; j++) {
                const int d = d0 + hf + j;
                const bool ok = d <= a->dhi;
                const int sl = a->kslot - d < 0 ? a->kslot - d + a->kw : a->kslot - d;
                const RT *k = d <= a->i ? a->kb + (size_t)(a->i - d) * a->stride : a->kr + (size_t)sl * D;
                lanes<RT>::ld2(k, c0, c1, ok && c0 < D, ok && c1 < D, k0[j], k1[j]);
            }
#pragma unroll
            for (int j = 0; j < ASPAN_KROWS; j++) v[hf + j] = c1 < D ? fmaf(q1, k1[j], fmaf(q0, k0[j], v[hf + j])) : fmaf(q0, k0[j], v[hf + j]);
        }
    }
    const float qk = warp_transpose_sum(v, lane);
    const int d = d0 + lane;
    float qp = 0.0f;
    if (d <= a->dhi) {
        const float *pe = a->key_pe + (a->S - d);
        int c = 0;
        for (; c + ASPAN_PEROWS <= D; c += ASPAN_PEROWS) {
            float t[ASPAN_PEROWS];
#pragma unroll
            for (int u = 0; u < ASPAN_PEROWS; u++) t[u] = __ldg(pe + (size_t)(c + u) * a->S);
#pragma unroll
            for (int u = 0; u < ASPAN_PEROWS; u++) qp = fmaf(a->q[c + u], t[u], qp);
        }
        for (; c < D; c++) qp = fmaf(a->q[c], pe[(size_t)c * a->S], qp);
    }
    return (qk + qp) / a->scale;
}

/* The same, out of line: the passes that recompute scores (windows past
 * ASPAN_SCORE_CAP) call it, so that its registers are not the kernel's. */
template <typename RT>
__device__ __noinline__ static float aspan_tile_scores_again(const aspan_keys<RT> *a, int d0, int lane)
{
    return aspan_tile_scores(a, d0, lane);
}

template <typename RT>
__global__ static void __launch_bounds__(ASPAN_MAXT)
    aspan_attn_kernel(float *att, bf16 *attb, const RT *qkv, int M, int D, int S, float scale, const float *key_pe,
                      const int *krows, const int *reach, const int64_t *mask_off, const float *derived,
                      const int64_t *off, RT *const *ring, const int64_t *pos, int cap, int chunk, float *part)
{
    extern __shared__ float sm[];
    __shared__ float fred[32];
    __shared__ double dred[32];
    const int n = blockIdx.x, h = blockIdx.y, K = gridDim.y, H = K * D, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, NW = blockDim.x >> 5;
    const int b = n / M, i = n % M, r = reach[h], kw = krows[h];
    const size_t oo = (size_t)n * H + (size_t)h * D;   /* the output's offset in att (or attb) */
    /* split (part != NULL): this block takes distances dlo..dhi of the
     * window and leaves its partial max, sum and output in `part` */
    const int dlo = 1 + blockIdx.z * chunk, dhi = min(kw, dlo + chunk - 1);
    float *rec = part ? part + (((size_t)n * K + h) * gridDim.z + blockIdx.z) * (D + 4) : NULL;
    if (r == 0 || dlo > kw) {   /* a head whose mask is zero everywhere outputs zeros */
        if (!part)
            for (int c = tid; c < D; c += blockDim.x) attb ? stf(attb + oo + c, 0.0f) : stf(att + oo + c, 0.0f);
        return;
    }
    float *q = sm, *accw = q + D, *sc = accw + NW * ASPAN_DCHUNK;
    aspan_keys<RT> a;
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
    a.dhi = dhi;
    a.scale = scale;
    const RT *vb = a.kb + H, *vr = a.kr + (size_t)kw * D;
    const int vslot = ring_slot(pos[b] + i, r);
    const bool store = dhi - dlo + 1 <= cap;
    for (int c = tid; c < D; c += blockDim.x) q[c] = ldf(qkv + (size_t)n * a.stride + (size_t)h * D + c);
    __syncthreads();

    float mx = -INFINITY;
    for (int d0 = dlo + 32 * warp; d0 <= dhi; d0 += 32 * NW) {
        const float s = aspan_tile_scores(&a, d0, lane);
        if (d0 + lane <= dhi) {
            if (store) sc[d0 + lane - dlo] = s;
            mx = fmaxf(mx, s);
        }
    }
    mx = block_max(mx, fred);   /* its barrier also publishes sc */
    double z = 0;
    for (int d0 = dlo + 32 * warp; d0 <= dhi; d0 += 32 * NW) {
        const float s = store ? sc[min(d0 + lane, dhi) - dlo] : aspan_tile_scores_again(&a, d0, lane);
        if (d0 + lane <= dhi) z += expf(s - mx);
    }
    z = block_sum(z, dred);

    const float *mask = derived + mask_off[h];
    double wsum = 0;
    float inv = 0.0f;
    const int vhi = min(r, dhi);   /* the mask is zero past the reach */
    for (int cb = 0; cb < D; cb += ASPAN_DCHUNK) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int d0 = dlo + 32 * warp; d0 <= vhi; d0 += 32 * NW) {
            const int d = d0 + lane;
            const float s = store ? sc[min(d, dhi) - dlo] : aspan_tile_scores_again(&a, d0, lane);
            /* split: unnormalised exp(s - local max) x mask; the combine scales it */
            const float wt = d > vhi ? 0.0f
                             : part  ? expf(s - mx) * mask[d - 1]
                                     : (float)((double)expf(s - mx) / z) * mask[d - 1];
            if (cb == 0) wsum += wt;
            const int cnt = vhi - d0 + 1 < 32 ? vhi - d0 + 1 : 32;
            /* ASPAN_VROWS value rows' loads in flight, then their products */
            for (int j0 = 0; j0 < cnt; j0 += ASPAN_VROWS) {
                float vv[ASPAN_VROWS][4];
#pragma unroll
                for (int u = 0; u < ASPAN_VROWS; u++) {
                    const int dd = d0 + j0 + u;
                    const bool ok = j0 + u < cnt;
                    const int sl = vslot - dd < 0 ? vslot - dd + r : vslot - dd;
                    const RT *v = dd <= i ? vb + (size_t)(i - dd) * a.stride : vr + (size_t)sl * D;
                    lanes<RT>::ld4(v, cb, lane, D, ok, vv[u]);   /* (ASPAN_DCHUNK is 128: cb + vd < cb + 128) */
                }
#pragma unroll
                for (int u = 0; u < ASPAN_VROWS; u++) {
                    const float w = __shfl_sync(0xffffffffu, wt, (j0 + u) & 31);
                    if (j0 + u < cnt) {
#pragma unroll
                        for (int t = 0; t < 4; t++)
                            if (cb + lanes<RT>::vd(t, lane) < D) acc[t] = fmaf(w, vv[u][t], acc[t]);
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < 4; t++) accw[warp * ASPAN_DCHUNK + lanes<RT>::vd(t, lane)] = acc[t];
        if (cb == 0) {
            const double ws = block_sum(wsum, dred);   /* its barrier publishes accw */
            inv = part ? 1.0f : (float)(1.0 / (ws + 1e-8));
            if (part && tid == 0) {
                rec[0] = mx;
                rec[1] = (float)z;
                rec[2] = (float)ws;
            }
        } else
            __syncthreads();
        for (int c = tid; c < ASPAN_DCHUNK && cb + c < D; c += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < NW; w++) o += accw[w * ASPAN_DCHUNK + c];
            if (part) rec[4 + cb + c] = o;
            else if (attb) stf(attb + oo + cb + c, o * inv);
            else att[oo + cb + c] = o * inv;
        }
        __syncthreads();   /* accw is read before the next chunk writes it */
    }
}

/* The splits of (query n, head h) met: with M the largest partial max and
 * e_s = exp(m_s - M), Z = sum z_s e_s is the softmax's denominator over the
 * whole window, W = sum w_s e_s / Z the weights' sum, and the output
 * sum o_s e_s / Z / (W + 1e-8), as the one-block kernel's. */
__global__ static void aspan_combine_kernel(float *att, bf16 *attb, const float *part, int D, int chunk, int nsplit,
                                            const int *krows, const int *reach)
{
    const int n = blockIdx.x, h = blockIdx.y, K = gridDim.y, H = K * D;
    const size_t oo = (size_t)n * H + (size_t)h * D;
    const int r = reach[h], ns = (krows[h] + chunk - 1) / chunk;   /* the splits that met a key */
    pdl_next();
    pdl_wait();   /* (launched by pdl_launch: the records are the kernel ahead's) */
    if (r == 0) {
        for (int c = threadIdx.x; c < D; c += blockDim.x) attb ? stf(attb + oo + c, 0.0f) : stf(att + oo + c, 0.0f);
        return;
    }
    const float *rec = part + ((size_t)n * K + h) * nsplit * (D + 4);
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, __ldcg(rec + (size_t)s * (D + 4)));
    double Z = 0, W = 0;
    for (int s = 0; s < ns; s++) {
        const float *p = rec + (size_t)s * (D + 4);
        const double e = (double)expf(__ldcg(p) - M);
        Z += (double)__ldcg(p + 1) * e;
        W += (double)__ldcg(p + 2) * e;
    }
    const double inv = 1.0 / Z / (W / Z + 1e-8);
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        double o = 0;
        for (int s = 0; s < ns; s++) {
            const float *p = rec + (size_t)s * (D + 4);
            o += (double)__ldcg(p + 4 + c) * (double)expf(__ldcg(p) - M);
        }
        if (attb) stf(attb + oo + c, (float)(o * inv));
        else att[oo + c] = (float)(o * inv);
    }
}

/* The splits' records of a decode step (one token a stream, bf16 out) met
 * as aspan_combine_kernel meets them, a warp a (stream, head): its lanes
 * load the records' heads (m, Z, W) of 32 splits at once and the values of
 * 8 splits at a time (a lane D / 32 dims), rather than one record after
 * another; the sums over the splits in double, in another order (the
 * lanes', then a butterfly over the warp). H the (stream, head) pairs. */
#define ACW_WARPS 4
template <int D>
__global__ static void __launch_bounds__(32 * ACW_WARPS)
    aspan_combine_warp_kernel(bf16 *attb, const float *part, int K, int H, int chunk, int nsplit, const int *krows,
                              const int *reach)
{
    constexpr int C = D / 32, R = D + 4;   /* a lane's dims; a record's floats */
    const int lane = threadIdx.x & 31, it = (int)blockIdx.x * ACW_WARPS + (int)(threadIdx.x >> 5);
    const int h = it % K, n = it / K;
    /* (the model's constants: before the kernel ahead has ended) */
    const int r = it < H ? __ldg(reach + h) : 0, ns = it < H ? (__ldg(krows + h) + chunk - 1) / chunk : 0;
    pdl_next();
    pdl_wait();   /* (the records are the kernel ahead's) */
    if (it >= H) return;
    bf16 *out = attb + (size_t)it * D + C * lane;
    if (r == 0) {
#pragma unroll
        for (int c = 0; c < C; c++) out[c] = __float2bfloat16(0.0f);
        return;
    }
    const float *rec = part + ((size_t)n * K + h) * nsplit * R;
    float M = -INFINITY;
    for (int s = lane; s < ns; s += 32) M = fmaxf(M, __ldcg(rec + (size_t)s * R));
    M = warp_max(M);
    double Z = 0, W = 0, o[C];
#pragma unroll
    for (int c = 0; c < C; c++) o[c] = 0;
    for (int s0 = 0; s0 < ns; s0 += 32) {
        float e = 0.0f;
        if (s0 + lane < ns) {
            const float *p = rec + (size_t)(s0 + lane) * R;
            e = expf(__ldcg(p) - M);
            Z += (double)__ldcg(p + 1) * (double)e;
            W += (double)__ldcg(p + 2) * (double)e;
        }
        const int nr = ns - s0 < 32 ? ns - s0 : 32;
        for (int j0 = 0; j0 < nr; j0 += 8) {
            float v[8][C];
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int c = 0; c < C; c++)
                    v[j][c] = j0 + j < nr ? __ldcg(rec + (size_t)(s0 + j0 + j) * R + 4 + C * lane + c) : 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const double ej = (double)__shfl_sync(0xffffffffu, e, (j0 + j) & 31);
#pragma unroll
                for (int c = 0; c < C; c++) o[c] += (double)v[j][c] * ej;
            }
        }
    }
    Z = warp_sum(Z);
    W = warp_sum(W);
    const double inv = 1.0 / Z / (W / Z + 1e-8);
#pragma unroll
    for (int c = 0; c < C; c++) out[c] = __float2bfloat16((float)(o[c] * inv));
}

/* aspan_combine_kernel's meeting of a decode step of B streams into
 * g->attb, by aspan_combine_warp_kernel (heads of 32 or 64; gpu_decode_combine) */
static int combine_dec(gpu_model *g, int l, int B, int chunk, int nsplit, char *err)
{
    const int K = g->m->n_head, D = g->m->d_head, H = B * K;
    const dim3 grid((unsigned)((H + ACW_WARPS - 1) / ACW_WARPS)), block(32 * ACW_WARPS);
    const int *kr = g->krows + (size_t)l * K, *re = g->reach + (size_t)l * K;
    CU_TRY(pdl_launch(g, D == 64 ? aspan_combine_warp_kernel<64> : aspan_combine_warp_kernel<32>, grid, block, 0, g->attb,
                      (const float *)g->part, K, H, chunk, nsplit, kr, re),
           err, "aspan_attn: combine (a warp a head)");
    return 0;
}

int gpu_aspan_combine_dec(gpu_model *g, int l, int B, int chunk, int nsplit, char *err)
{
    const int D = g->m->d_head;
    for (int k = 0; k < (gpu_twice(g, GPU_TWICE_COMBINE, l) ? 2 : 1); k++)
        if (g->comb_warp && (D == 32 || D == 64) ? combine_dec(g, l, B, chunk, nsplit, err)
                                                 : gpu_aspan_combine(g, l, B, 1, chunk, nsplit, NULL, g->attb, err))
            return -1;
    return 0;
}

int gpu_aspan_combine(gpu_model *g, int l, int B, int M, int chunk, int nsplit, float *att, bf16 *attb, char *err)
{
    const int K = g->m->n_head;
    CU_TRY(pdl_launch(g, aspan_combine_kernel, dim3((unsigned)(B * M), (unsigned)K), dim3(64), 0, att, attb,
                      (const float *)g->part, (int)g->m->d_head, chunk, nsplit, (const int *)(g->krows + (size_t)l * K),
                      (const int *)(g->reach + (size_t)l * K)),
           err, "aspan_attn: combine");
    return 0;
}

/* Shared memory of a block of T threads: the query, the warps' sums, the
 * scores kept. */
static size_t aspan_smem(const gpu_model *g, int T)
{
    const int cap = g->max_window < ASPAN_SCORE_CAP ? g->max_window : ASPAN_SCORE_CAP;
    return (size_t)(g->m->d_head + (T / 32) * ASPAN_DCHUNK + cap) * sizeof(float);
}

size_t gpu_aspan_attn_smem(const gpu_model *g) { return aspan_smem(g, ASPAN_MAXT); }

int gpu_aspan_attn(gpu_model *g, int l, int B, int M, int *ring_done, char *err)
{
    *ring_done = 0;
    const model_t *m = g->m;
    const int K = m->n_head, D = m->d_head;
    const int64_t pairs = (int64_t)B * M * K;
    const int tiled = gpu_aspan_tile(g, l, B, M, err);   /* blocks of many queries: aspan_tile.cu */
    if (tiled) return tiled < 0 ? -1 : 0;
    const int dec = gpu_aspan_decode(g, l, B, M, err);   /* heads of 32, 64 or 128 dims: aspan_decode.cu */
    if (dec > 0) *ring_done = M == 1;                    /* it wrote the rings of a one-token step */
    if (dec) return dec < 0 ? -1 : 0;
    int lw = 0;   /* the layer's widest window */
    for (int h = 0; h < K; h++)
        if (m->layers[l].krows[h] > lw) lw = m->layers[l].krows[h];
    /* few (query, head) pairs (decode): split each window into chunks of at
     * least ASPAN_SPLIT_MIN distances (a multiple of 32), one block of 128
     * threads each, for about ASPAN_SPLIT_TARGET blocks in all */
    int nsplit = 1, chunk = lw;
    if (pairs * 2 <= ASPAN_SPLIT_BLOCKS && lw > ASPAN_SPLIT_MIN) {
        int want = (int)((ASPAN_SPLIT_TARGET + pairs - 1) / pairs), most = (lw + ASPAN_SPLIT_MIN - 1) / ASPAN_SPLIT_MIN;
        if ((int64_t)want * pairs > ASPAN_SPLIT_BLOCKS) want = (int)(ASPAN_SPLIT_BLOCKS / pairs);
        nsplit = want < most ? want : most;
        if (nsplit < 2) nsplit = 1;
        else {
            chunk = (lw + nsplit - 1) / nsplit;
            chunk = (chunk + 31) & ~31;
            nsplit = (lw + chunk - 1) / chunk;
        }
    }
    const int T = nsplit > 1 ? 128 : pairs < 1024 ? ASPAN_MAXT : 128;
    const int wmax = nsplit > 1 ? chunk : g->max_window;
    const int cap = wmax < ASPAN_SCORE_CAP ? wmax : ASPAN_SCORE_CAP;
    const size_t smem = (size_t)(D + (T / 32) * ASPAN_DCHUNK + cap) * sizeof(float);
    dim3 grid((unsigned)(B * M), (unsigned)K, (unsigned)nsplit);
    float *part = nsplit > 1 ? g->part : NULL;
    if (nsplit == 1) chunk = g->max_window > 0 ? g->max_window : 1;
    const bool bf = g->prec == GPU_BF16;
    float *att = bf ? NULL : g->att;
    bf16 *attb = bf ? g->attb : NULL;
    const int *kr = g->krows + (size_t)l * K, *re = g->reach + (size_t)l * K;
    const int64_t *mo = g->mask_off + (size_t)l * K, *off = g->d_off + (size_t)l * K, *pos = stage_pos(g, g->d_stage);
    if (smem > 48 * 1024)
        CU_TRY(bf ? cudaFuncSetAttribute(aspan_attn_kernel<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                  : cudaFuncSetAttribute(aspan_attn_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
               err, "aspan_attn: shared memory");
    if (bf)
        aspan_attn_kernel<bf16><<<grid, T, smem, g->stream>>>(att, attb, g->qkvb, M, D, m->span, sqrtf((float)D), g->key_pe,
                                                               kr, re, mo, g->derived, off,
                                                               (bf16 *const *)stage_ring(g, g->d_stage), pos, cap, chunk, part);
    else
        aspan_attn_kernel<float><<<grid, T, smem, g->stream>>>(att, attb, g->qkv, M, D, m->span, sqrtf((float)D), g->key_pe,
                                                                kr, re, mo, g->derived, off, stage_ring(g, g->d_stage), pos,
                                                                cap, chunk, part);
    LAUNCH_TRY(err, "aspan_attn");
    if (nsplit > 1) {
        aspan_combine_kernel<<<dim3((unsigned)(B * M), (unsigned)K), 64, 0, g->stream>>>(att, attb, g->part, D, chunk,
                                                                                         nsplit, kr, re);
        LAUNCH_TRY(err, "aspan_attn: combine");
    }
    return 0;
}
