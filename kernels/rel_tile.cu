/*
 * rel_tile.cu - Transformer-XL relative attention of a PAR block for blocks
 * of many queries (scoring, prompts): the same result as rel_attn.cu's
 * kernel, with the keys, values and r rows a tile of queries shares read
 * once into shared memory instead of once per query (aspan_tile.cu is the
 * adaptive-span counterpart).
 *
 * A thread block takes REL_TQ consecutive queries of one stream and one
 * head, one query per lane. Query t = p0 + i sees the key positions
 * p0 - mlen .. t (the memory, then the block up to itself); the block walks
 * p0 - mlen .. t_last in tiles of 32 positions, and for each tile loads
 *   - the 32 key and value rows (memory row j at ring slot mslot + j mod
 *     mem_len, or the block's own row),
 *   - the r rows of every distance d = t - s the tile and the queries can
 *     form (REL_TQ + 31 of them, dims-major), and for each the head's
 *     (v - u) . r_d, so that a lane's score needs one query vector:
 *       (q + u) . k + (q + v) . r_d = (q + u) . (k + r_d) + (v - u) . r_d.
 *   (par-tf: the r row of distance d is roff + d, fam_rel.cu's reversed
 *   table, roff = rk_rows - klen; 0 otherwise).
 * Each lane folds its 32 scores (times 1/sqrt(d_head), or par-tf's
 * 1/d_head) into a running softmax (max m, Z = sum exp(s - m),
 * O = sum exp(s - m) v) and writes O / Z. Windows are at most mem_len +
 * the block, so no split. q + u and O live in registers: heads of 32 or 64
 * dims.
 */
#include "gpu_internal.cuh"

#define REL_TQ 128
#define REL_TK 32
#define REL_TE (REL_TQ + REL_TK - 1)

template <int D> static size_t rel_tile_smem(void)
{
    return (size_t)(2 * REL_TK * D + D * REL_TE + REL_TE + (REL_TQ / 32) * REL_TK * 32) * sizeof(float);
}

template <typename RT, int D>
__global__ static void __launch_bounds__(REL_TQ)
    rel_tile_kernel(float *att, bf16 *attb, const RT *qkv, int M, int ML, int nl, int layer, float scale,
                    const float *rwb, const float *rrb, const float *rk, int rk_rows, int tf, int64_t off,
                    RT *const *ring, const int64_t *pos, const int *len, int same_length)
{
    extern __shared__ float sm[];
    float *ks = sm, *vs = ks + REL_TK * D, *rs = vs + REL_TK * D, *bd = rs + D * REL_TE,
          *scs = bd + REL_TE + (threadIdx.x >> 5) * REL_TK * 32;
    const int h = blockIdx.y, b = blockIdx.z, A = gridDim.y * D, tid = threadIdx.x, lane = tid & 31;
    const int warp = tid >> 5, NW = blockDim.x >> 5;
    const int i0 = blockIdx.x * REL_TQ, i = i0 + tid, nq = min(REL_TQ, M - i0);
    const bool active = i < M;
    const int mlen = len[(size_t)b * nl + layer];
    const int roff = tf ? rk_rows - (mlen + M) : 0;   /* the r row of distance 0 */
    /* same_length: query i also loses the keys of index j <= i - shift (core/par.c) */
    const int mask_len = mlen + M - ML, shift = mask_len > 0 ? M - mask_len : M;

    const int64_t p0 = pos[b], t0 = p0 + i0, t = p0 + i;
    const int64_t s_lo = same_length ? p0 - mlen + (i - shift + 1) : -((int64_t)1 << 62);   /* the first key it sees */
    const size_t stride = (size_t)3 * A, n = (size_t)b * M + i;
    const RT *kb = qkv + (size_t)b * M * stride + A + (size_t)h * D, *vb = kb + A;
    const RT *kr = ring[b] + off + (size_t)h * D, *vr = kr + (size_t)ML * A;
    const int mslot = ML > 0 ? (int)((p0 - mlen) % ML) : 0;   /* memory row 0's slot */
    const float *rkh = rk + (size_t)h * D, *u = rwb + (size_t)h * D, *v = rrb + (size_t)h * D;

    float q[D], o[D];
#pragma unroll
    for (int c = 0; c < D; c++) {
        q[c] = (active ? ldf(qkv + n * stride + (size_t)h * D + c) : 0.0f) + __ldg(u + c);
        o[c] = 0.0f;
    }
    float mx = -INFINITY, z = 0.0f;
    const int64_t smin = p0 - mlen, smax = t0 + nq - 1;

    for (int64_t s0 = smin; s0 <= smax; s0 += REL_TK) {
        const int64_t dmin = t0 - s0 - (REL_TK - 1);   /* distance of rs/bd entry 0 */
        __syncthreads();   /* the last tile's rows are read */
        for (int e = tid; e < REL_TK * D; e += blockDim.x) {
            const int j = e / D, c = e % D;
            const int64_t s = s0 + j;
            float kv = 0.0f, vv = 0.0f;
            if (s <= smax) {
                if (s >= p0) {
                    kv = ldf(kb + (size_t)(s - p0) * stride + c);
                    vv = ldf(vb + (size_t)(s - p0) * stride + c);
                } else {
                    int sl = mslot + (int)(s - smin);
                    if (sl >= ML) sl -= ML;
                    kv = ldf(kr + (size_t)sl * A + c);
                    vv = ldf(vr + (size_t)sl * A + c);
                }
            }
            ks[e] = kv;
            vs[e] = vv;
        }
        for (int x = warp; x < REL_TE; x += NW)   /* a warp per distance, lanes over dims */
            for (int c = lane; c < D; c += 32) {
                const int64_t d = dmin + x;
                rs[c * REL_TE + x] = d >= 0 && roff + d < rk_rows ? __ldg(rkh + (size_t)(roff + d) * A + c) : 0.0f;
            }
        __syncthreads();
        for (int x = tid; x < REL_TE; x += blockDim.x) {
            float a = 0.0f;
            for (int c = 0; c < D; c++) a = fmaf(__ldg(v + c) - __ldg(u + c), rs[c * REL_TE + x], a);
            bd[x] = a;
        }
        __syncthreads();

        float tmax = -INFINITY;
        for (int j = 0; j < REL_TK; j++) {
            const int64_t d = t - (s0 + j);
            float sc = -INFINITY;
            if (active && d >= 0 && s0 + j >= s_lo) {
                const float *kj = ks + j * D, *rj = rs + (d - dmin);
                float a = 0.0f, p = 0.0f;
#pragma unroll
                for (int c = 0; c < D; c++) {
                    a = fmaf(q[c], kj[c], a);
                    p = fmaf(q[c], rj[c * REL_TE], p);
                }
                sc = (a + p + bd[d - dmin]) * scale;
                tmax = fmaxf(tmax, sc);
            }
            scs[j * 32 + lane] = sc;
        }
        if (tmax == -INFINITY) continue;
        if (tmax > mx) {
            const float f = expf(mx - tmax);
            z *= f;
#pragma unroll
            for (int c = 0; c < D; c++) o[c] *= f;
            mx = tmax;
        }
        for (int j = 0; j < REL_TK; j++) {
            const float sc = scs[j * 32 + lane];
            if (sc == -INFINITY) continue;
            const float e = expf(sc - mx);
            z += e;
            const float *vj = vs + j * D;
#pragma unroll
            for (int c = 0; c < D; c++) o[c] = fmaf(e, vj[c], o[c]);
        }
    }
    if (!active) return;
#pragma unroll
    for (int c = 0; c < D; c++) {
        const float val = o[c] / z;
        if (attb) stf(attb + n * A + (size_t)h * D + c, val);
        else att[n * A + (size_t)h * D + c] = val;
    }
}

template <typename RT, int D>
static int rel_launch(gpu_model *g, int l, int B, int M, float *att, bf16 *attb, const RT *qkv, RT *const *ring,
                      char *err)
{
    const model_t *m = g->m;
    const size_t smem = rel_tile_smem<D>();
    if (smem > 48 * 1024)
        CU_TRY(cudaFuncSetAttribute(rel_tile_kernel<RT, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err,
               "rel_tile: shared memory");
    dim3 grid((unsigned)((M + REL_TQ - 1) / REL_TQ), (unsigned)m->n_head, (unsigned)B);
    rel_tile_kernel<RT, D><<<grid, REL_TQ, smem, g->stream>>>(
        att, attb, qkv, M, m->mem_len, m->n_layers, l, gpu_rel_scale(m), g->L[l].rwb, g->L[l].rrb, g->L[l].rk,
        g->L[l].rk_rows, m->tf_attn, (int64_t)g->h_off[l], ring, stage_pos(g, g->d_stage), stage_len(g, g->d_stage),
        m->same_length);
    LAUNCH_TRY(err, "rel_tile");
    return 1;
}

int gpu_rel_tile(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int D = m->d_head;
    const int tc = gpu_rel_mma(g, l, B, M, err);   /* bf16: on tensor cores (attn_mma.cu) */
    if (tc) return tc;
    if (M < REL_TILE_MIN_M || (D != 32 && D != 64) || !g->tile_on) return 0;
    /* too few blocks to fill the device: the per-query kernel has more
     * (unless gpu_tiles(g, 2) forces this one, for the tests) */
    if (g->tile_on < 2 && (int64_t)((M + REL_TQ - 1) / REL_TQ) * m->n_head * B < g->n_sm) return 0;
    if (g->prec == GPU_BF16) {
        bf16 *const *ring = (bf16 *const *)stage_ring(g, g->d_stage);
        return D == 64 ? rel_launch<bf16, 64>(g, l, B, M, NULL, g->attb, g->qkvb, ring, err)
                       : rel_launch<bf16, 32>(g, l, B, M, NULL, g->attb, g->qkvb, ring, err);
    }
    float *const *ring = stage_ring(g, g->d_stage);
    return D == 64 ? rel_launch<float, 64>(g, l, B, M, g->att, NULL, g->qkv, ring, err)
                   : rel_launch<float, 32>(g, l, B, M, g->att, NULL, g->qkv, ring, err);
}
