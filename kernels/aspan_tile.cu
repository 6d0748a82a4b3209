/*
 * aspan_tile.cu - adaptive-span attention for blocks of many queries
 * (scoring, prompts): the same result as aspan_attn.cu's kernel, with the
 * keys, values and position embeddings a tile of queries shares read once
 * into shared memory instead of once per query.
 *
 * A thread block takes ASPAN_TQ consecutive queries of one stream and one
 * head, one query per lane (ASPAN_TQ / 32 warps). Their windows together
 * cover the key positions [t0 - kw, t_last - 1]; the block walks them in
 * tiles of 32 positions, and for each tile loads into shared memory
 *   - the 32 key and value rows (the block's own rows, or the rings' slots
 *     ring_slot(s, kw) and ring_slot(s, r); zeros where no query needs one),
 *   - the key_pe columns S - d of every distance d = t - s the tile and the
 *     queries can form (ASPAN_TQ + 31 of them, stored dims-major so that
 *     lanes read consecutive words), and the mask at those distances.
 * Each lane then forms its query's 32 scores (q . k + q . key_pe[:, S-d]) /
 * sqrt(D) for the distances 1..kw it may see, and folds them into a running
 * softmax: m the largest score so far, Z = sum exp(s - m) over the window,
 * W = sum exp(s - m) m(d), O = sum exp(s - m) m(d) v (rescaled by
 * exp(m_old - m) when m grows). At the end out = (O / Z) / (W / Z + 1e-8),
 * the reference's a / (sum a + 1e-8) after a softmax over the whole window.
 * q and O live in registers, so the head's dims are a template parameter
 * (32 or 64); other widths, and decode steps, go to aspan_attn.cu.
 *
 * A long window is split (as decode's flash-decoding in aspan_attn.cu): the
 * key positions of a block's queries are cut into NSPLIT ranges of CHUNK
 * positions, one block each, which leave their (m, Z, W, O) in g->tpart;
 * aspan_tile_combine_kernel rescales them by exp(m_s - max m) and divides
 * as above. A layer whose widest window needs more than ASPAN_TILE_CHUNK
 * positions is split (at most ASPAN_TILE_SPLITS ways, as g->tpart holds):
 * otherwise the blocks of the few long heads would be the step's length.
 */
#include "gpu_internal.cuh"

#define ASPAN_TQ 128                 /* queries a block takes: 4 warps */
#define ASPAN_TK 32                  /* key positions a tile holds */
#define ASPAN_TE (ASPAN_TQ + ASPAN_TK - 1)   /* distances a tile's queries can form with it */
#define ASPAN_TILE_CHUNK 1024        /* key positions a block takes before its window is split */

template <int D> static size_t tile_smem(void)
{
    return (size_t)(2 * ASPAN_TK * D + D * ASPAN_TE + ASPAN_TE + (ASPAN_TQ / 32) * ASPAN_TK * 32) * sizeof(float);
}

template <typename RT, int D>
__global__ static void __launch_bounds__(ASPAN_TQ)
    aspan_tile_kernel(float *att, bf16 *attb, const RT *qkv, int M, int S, float scale, const float *key_pe,
                      const int *krows, const int *reach, const int64_t *mask_off, const float *derived,
                      const int64_t *off, RT *const *ring, const int64_t *pos, int nsplit, int chunk, float *part)
{
    extern __shared__ float sm[];
    float *ks = sm, *vs = ks + ASPAN_TK * D, *pes = vs + ASPAN_TK * D, *mk = pes + D * ASPAN_TE,
          *scs = mk + ASPAN_TE + (threadIdx.x >> 5) * ASPAN_TK * 32;
    const int h = blockIdx.y, b = blockIdx.z / nsplit, sp = blockIdx.z % nsplit, K = gridDim.y, H = K * D;
    const int tid = threadIdx.x, lane = tid & 31;
    const int i0 = blockIdx.x * ASPAN_TQ, i = i0 + tid, nq = min(ASPAN_TQ, M - i0);
    const bool active = i < M;
    const int kw = krows[h], r = reach[h];
    const size_t stride = (size_t)3 * H, n = (size_t)b * M + i;
    const int64_t p0 = pos[b], t0 = p0 + i0, t = p0 + i;
    if (r == 0) {   /* a head whose mask is zero everywhere outputs zeros (the combine writes them when split) */
        if (active && !part)
            for (int c = 0; c < D; c++) attb ? stf(attb + n * H + (size_t)h * D + c, 0.0f) : stf(att + n * H + (size_t)h * D + c, 0.0f);
        return;
    }
    const RT *kb = qkv + (size_t)b * M * stride + H + (size_t)h * D, *vb = kb + H;
    const RT *kr = ring[b] + off[h], *vr = kr + (size_t)kw * D;
    const float *mask = derived + mask_off[h];

    float q[D], o[D];
#pragma unroll
    for (int c = 0; c < D; c++) {
        q[c] = active ? ldf(qkv + n * stride + (size_t)h * D + c) : 0.0f;
        o[c] = 0.0f;
    }
    float mx = -INFINITY, z = 0.0f, w = 0.0f;

    /* this block's key positions: [t0 - kw, t0 + nq - 2], or its split's part */
    const int64_t slo = t0 - kw + (int64_t)sp * chunk, shi = min(t0 + nq - 2, slo + chunk - 1);
    for (int64_t s0 = slo; s0 <= shi; s0 += ASPAN_TK) {
        const int64_t dmin = t0 - s0 - (ASPAN_TK - 1);   /* distance of pes/mk entry 0 */
        __syncthreads();   /* the last tile's rows are read */
        for (int e = tid; e < ASPAN_TK * D; e += blockDim.x) {
            const int j = e / D, c = e % D;
            const int64_t s = s0 + j;
            float kv = 0.0f, vv = 0.0f;
            if (s <= shi) {
                if (s >= p0) {
                    kv = ldf(kb + (size_t)(s - p0) * stride + c);
                    vv = ldf(vb + (size_t)(s - p0) * stride + c);
                } else {
                    kv = ldf(kr + (size_t)ring_slot(s, kw) * D + c);
                    if (s >= p0 - r) vv = ldf(vr + (size_t)ring_slot(s, r) * D + c);
                }
            }
            ks[e] = kv;
            vs[e] = vv;
        }
        for (int c = tid >> 5; c < D; c += blockDim.x >> 5)   /* a warp per dim, lanes over distances */
            for (int x = lane; x < ASPAN_TE; x += 32) {
                const int64_t d = dmin + x;
                pes[c * ASPAN_TE + x] = d >= 1 && d <= kw ? __ldg(key_pe + (size_t)c * S + (S - d)) : 0.0f;
            }
        for (int x = tid; x < ASPAN_TE; x += blockDim.x) {
            const int64_t d = dmin + x;
            mk[x] = d >= 1 && d <= r ? __ldg(mask + d - 1) : 0.0f;
        }
        __syncthreads();

        /* this lane's scores of the tile; the tile's largest */
        float tmax = -INFINITY;
        for (int j = 0; j < ASPAN_TK; j++) {
            const int64_t d = t - (s0 + j);
            float sc = -INFINITY;
            if (active && d >= 1 && d <= kw) {
                const float *kj = ks + j * D, *pj = pes + (d - dmin);
                float a = 0.0f, p = 0.0f;
#pragma unroll
                for (int c = 0; c < D; c++) {
                    a = fmaf(q[c], kj[c], a);
                    p = fmaf(q[c], pj[c * ASPAN_TE], p);
                }
                sc = (a + p) / scale;
                tmax = fmaxf(tmax, sc);
            }
            scs[j * 32 + lane] = sc;
        }
        if (tmax == -INFINITY) continue;   /* none of this lane's distances */
        if (tmax > mx) {
            const float f = expf(mx - tmax);   /* 0 the first time */
            z *= f;
            w *= f;
#pragma unroll
            for (int c = 0; c < D; c++) o[c] *= f;
            mx = tmax;
        }
        for (int j = 0; j < ASPAN_TK; j++) {
            const float sc = scs[j * 32 + lane];
            if (sc == -INFINITY) continue;
            const float e = expf(sc - mx);
            z += e;
            const float wt = e * mk[t - (s0 + j) - dmin];
            if (wt != 0.0f) {
                w += wt;
                const float *vj = vs + j * D;
#pragma unroll
                for (int c = 0; c < D; c++) o[c] = fmaf(wt, vj[c], o[c]);
            }
        }
    }
    if (!active) return;
    if (part) {   /* split: the partial state, met by aspan_tile_combine_kernel */
        float *rec = part + (((size_t)n * K + h) * nsplit + sp) * (D + 3);
        rec[0] = mx;
        rec[1] = z;
        rec[2] = w;
#pragma unroll
        for (int c = 0; c < D; c++) rec[3 + c] = o[c];
        return;
    }
    const float wz = w / z + 1e-8f;
#pragma unroll
    for (int c = 0; c < D; c++) {
        const float v = o[c] / z / wz;
        if (attb) stf(attb + n * H + (size_t)h * D + c, v);
        else att[n * H + (size_t)h * D + c] = v;
    }
}

/* The splits of (query n, head h) met: with M the largest partial max and
 * e_s = exp(m_s - M), Z = sum z_s e_s, W = sum w_s e_s, O = sum o_s e_s,
 * and out = (O / Z) / (W / Z + 1e-8), zeros for a head of reach 0 (REACH
 * given); without RENORM (relative attention, no mask: attn_mma.cu's
 * splits) out = O / Z. */
__global__ static void aspan_tile_combine_kernel(float *att, bf16 *attb, const float *part, int D, int nsplit,
                                                 const int *reach, int renorm)
{
    const int n = blockIdx.x, h = blockIdx.y, K = gridDim.y;
    const size_t oo = (size_t)n * K * D + (size_t)h * D;
    const float *rec = part + ((size_t)n * K + h) * nsplit * (D + 3);
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, rec[(size_t)s * (D + 3)]);
    float Z = 0.0f, W = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        const float *p = rec + (size_t)s * (D + 3);
        if (p[0] == -INFINITY) continue;
        const float e = expf(p[0] - M);
        Z += p[1] * e;
        W += p[2] * e;
    }
    const float wz = renorm ? W / Z + 1e-8f : 1.0f;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            const float *p = rec + (size_t)s * (D + 3);
            if (p[0] != -INFINITY) o += p[3 + c] * expf(p[0] - M);
        }
        const float v = reach && reach[h] == 0 ? 0.0f : o / Z / wz;
        if (attb) stf(attb + oo + c, v);
        else att[oo + c] = v;
    }
}

/* The tile kernel for this layer when its shapes suit it (M >= min_m
 * queries, heads of 32 or 64 dims): 1 if it ran, 0 if not, -1 on an
 * error. */
template <typename RT, int D>
static int launch(gpu_model *g, int l, int B, int M, int nsplit, int chunk, float *att, bf16 *attb, const RT *qkv,
                  RT *const *ring, char *err)
{
    const model_t *m = g->m;
    const int K = m->n_head;
    const size_t smem = tile_smem<D>();
    float *part = nsplit > 1 ? g->tpart : NULL;
    if (smem > 48 * 1024)
        CU_TRY(cudaFuncSetAttribute(aspan_tile_kernel<RT, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
               err, "aspan_tile: shared memory");
    dim3 grid((unsigned)((M + ASPAN_TQ - 1) / ASPAN_TQ), (unsigned)K, (unsigned)(B * nsplit));
    aspan_tile_kernel<RT, D><<<grid, ASPAN_TQ, smem, g->stream>>>(
        att, attb, qkv, M, m->span, sqrtf((float)D), g->key_pe, g->krows + (size_t)l * K, g->reach + (size_t)l * K,
        g->mask_off + (size_t)l * K, g->derived, g->d_off + (size_t)l * K, ring, stage_pos(g, g->d_stage), nsplit, chunk,
        part);
    LAUNCH_TRY(err, "aspan_tile");
    if (part && gpu_aspan_tile_combine(g, g->reach + (size_t)l * K, 1, B, M, nsplit, err)) return -1;
    return 1;
}

int gpu_aspan_tile_combine(gpu_model *g, const int *reach, int renorm, int B, int M, int nsplit, char *err)
{
    const int K = g->m->n_head;
    const bool bf = g->prec == GPU_BF16;
    aspan_tile_combine_kernel<<<dim3((unsigned)(B * M), (unsigned)K), 64, 0, g->stream>>>(
        bf ? NULL : g->att, bf ? g->attb : NULL, g->tpart, g->m->d_head, nsplit, reach, renorm);
    LAUNCH_TRY(err, "aspan_tile: combine");
    return 0;
}

size_t gpu_aspan_tile_part_floats(const gpu_model *g)
{
    const model_t *m = g->m;
    if (m->d_head != 32 && m->d_head != 64) return 0;
    size_t want = (size_t)g->max_batch * g->max_block * m->n_head * ASPAN_TILE_SPLITS * (m->d_head + 3);
    return want < ASPAN_TILE_PART_FLOATS ? want : ASPAN_TILE_PART_FLOATS;
}

int gpu_aspan_tile(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int D = m->d_head, K = m->n_head;
    const int tc = gpu_aspan_mma(g, l, B, M, err);   /* bf16: on tensor cores (attn_mma.cu) */
    if (tc) return tc;
    if (M < ASPAN_TILE_MIN_M || (D != 32 && D != 64) || !g->tile_on) return 0;
    /* the layer's widest window, split into chunks of at least
     * ASPAN_TILE_CHUNK positions (multiples of the tile), as many as the
     * partials buffer holds */
    int lw = 0;
    for (int h = 0; h < K; h++)
        if (m->layers[l].krows[h] > lw) lw = m->layers[l].krows[h];
    const int span = lw + (M < ASPAN_TQ ? M : ASPAN_TQ) - 1;   /* key positions of a block */
    int nsplit = (span + ASPAN_TILE_CHUNK - 1) / ASPAN_TILE_CHUNK;
    if (nsplit > ASPAN_TILE_SPLITS) nsplit = ASPAN_TILE_SPLITS;
    while (nsplit > 1 && (size_t)B * M * K * nsplit * (D + 3) > g->tpart_floats) nsplit--;
    int chunk = (span + nsplit - 1) / nsplit;
    chunk = (chunk + ASPAN_TK - 1) / ASPAN_TK * ASPAN_TK;
    nsplit = (span + chunk - 1) / chunk;
    /* too few blocks to fill the device: the per-query kernel has more
     * (unless gpu_tiles(g, 2) forces this one, for the tests) */
    if (g->tile_on < 2 && (int64_t)((M + ASPAN_TQ - 1) / ASPAN_TQ) * K * B * nsplit < g->n_sm) return 0;
    if (g->prec == GPU_BF16) {
        bf16 *const *ring = (bf16 *const *)stage_ring(g, g->d_stage);
        return D == 64 ? launch<bf16, 64>(g, l, B, M, nsplit, chunk, NULL, g->attb, g->qkvb, ring, err)
                       : launch<bf16, 32>(g, l, B, M, nsplit, chunk, NULL, g->attb, g->qkvb, ring, err);
    }
    float *const *ring = stage_ring(g, g->d_stage);
    return D == 64 ? launch<float, 64>(g, l, B, M, nsplit, chunk, g->att, NULL, g->qkv, ring, err)
                   : launch<float, 32>(g, l, B, M, nsplit, chunk, g->att, NULL, g->qkv, ring, err);
}
