/*
 * rel_attn.cu - Transformer-XL relative attention of one PAR block, with the
 * block's memory (core/par.c; kimiyoung/transformer-xl's
 * RelPartialLearnableMultiHeadAttn in eval mode).
 *
 * Stream b holds mlen rows of memory (positions p0-mlen .. p0-1, ring slot
 * p % mem_len); a query i of the block (key index qi = mlen + i) sees keys
 * j = 0..qi, the memory then the block up to itself:
 *   s(j) = ((q_i + u) . k_j + (q_i + v) . r_{roff+qi-j}) * scale
 *   out  = sum_j softmax(s)(j) v_j
 * u, v are r_w_bias, r_r_bias of the head; r_t = r_net(sinusoid(t)) is a
 * table planned at load (fam_rel.cu) for every distance a step can ask for,
 * scale 1/sqrt(d_head); par-tf: the seed's table reversed, roff = its rows
 * less the stream's klen, scale 1/d_head (roff is 0 otherwise). The ring
 * writes of this block come in a later launch (ring.cu).
 *
 * One thread block per (query, head), its warps on tiles of 32 keys, as
 * aspan_attn.cu: a warp reads each key row and r row with lanes over the
 * head's dims (coalesced) and warp_transpose_sum gives key j0+lane's score
 * to lane `lane`. Scores stay in shared memory when they fit (else are
 * recomputed); the denominator is summed in double, as core; each lane's
 * weight is broadcast and the warp adds weight x value row in registers.
 * Loads of several key, r and value rows are issued before their products.
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

#define REL_SCORE_CAP 16384
#define REL_DCHUNK 128
/* Key (and r) rows, and value rows, whose loads a lane issues at once. */
#ifndef REL_KROWS
#define REL_KROWS 4
#endif
#define REL_VROWS 8

template <typename RT> struct rel_keys {
    const float *qu, *qv;   /* shared: q + u, q + v */
    const RT *kb;           /* the block's key row 0 of this head (stride `stride`) */
    const RT *kr;           /* the ring's key row 0 of this head (stride A; float, or bf16 in GPU_BF16) */
    const float *rk;        /* r_0 of this head (stride A) */
    size_t stride;
    int mslot;              /* ring slot of memory row 0 (position p0 - mlen): row j is slot mslot + j (mod ML) */
    int dh, A, ML, mlen, qi;
    int roff;               /* r row of distance 0 (par-tf: rk_rows - klen; else 0) */
    float scale;
};

/* The score of key j0 + lane (meaningless past qi); every lane of the warp
 * must call it with the same j0. */
template <typename RT>
__device__ __forceinline__ static float rel_tile_scores(const rel_keys<RT> *a, int j0, int lane)
{
    const int dh = a->dh;
    float v[32];
#pragma unroll
    for (int jj = 0; jj < 32; jj++) v[jj] = 0.0f;
    /* 64 dims at a time, REL_KROWS key and r rows' loads issued before their
     * products, so that a tile's loads overlap (one dependent load after
     * another was the cost); heads of up to 64 dims sum as before */
    for (int cb = 0; cb < dh; cb += 64) {
        const int c0 = cb + lanes<RT>::pd0(lane), c1 = cb + lanes<RT>::pd1(lane);
        const float u0 = c0 < dh ? a->qu[c0] : 0.0f, u1 = c1 < dh ? a->qu[c1] : 0.0f;
        const float w0 = c0 < dh ? a->qv[c0] : 0.0f, w1 = c1 < dh ? a->qv[c1] : 0.0f;
#pragma unroll
        for (int hf = 0; hf < 32; hf += REL_KROWS) {
            float k0[REL_KROWS], k1[REL_KROWS], r0[REL_KROWS], r1[REL_KROWS];
#pragma unroll
            for (int jj = 0; jj < REL_KROWS; jj++) {
                const int j = j0 + hf + jj;
                const bool ok = j <= a->qi;
                const int sl = a->mslot + j >= a->ML ? a->mslot + j - a->ML : a->mslot + j;
                const RT *k = j < a->mlen ? a->kr + (size_t)sl * a->A : a->kb + (size_t)(j - a->mlen) * a->stride;
                const float *r = a->rk + (size_t)(ok ? a->roff + a->qi - j : 0) * a->A;
                lanes<RT>::ld2(k, c0, c1, ok && c0 < dh, ok && c1 < dh, k0[jj], k1[jj]);
                r0[jj] = ok && c0 < dh ? __ldg(r + c0) : 0.0f;
                r1[jj] = ok && c1 < dh ? __ldg(r + c1) : 0.0f;
            }
#pragma unroll
            for (int jj = 0; jj < REL_KROWS; jj++) {
                float ac = fmaf(u0, k0[jj], 0.0f), bd = fmaf(w0, r0[jj], 0.0f);
                if (c1 < dh) {
                    ac = fmaf(u1, k1[jj], ac);
                    bd = fmaf(w1, r1[jj], bd);
                }
                v[hf + jj] += ac + bd;
            }
        }
    }
    return warp_transpose_sum(v, lane) * a->scale;
}

/* The same, out of line, for the passes that recompute scores. */
template <typename RT>
__device__ __noinline__ static float rel_tile_scores_again(const rel_keys<RT> *a, int j0, int lane)
{
    return rel_tile_scores(a, j0, lane);
}

template <typename RT>
__global__ static void __launch_bounds__(512)
    rel_attn_kernel(float *att, bf16 *attb, const RT *qkv, int M, int nh, int dh, int ML, int nl, int layer,
                    float scale, const float *rwb, const float *rrb, const float *rk, int rk_rows, int tf, int64_t off,
                    RT *const *ring, const int64_t *pos, const int *len, int cap, int same_length)
{
    extern __shared__ float sm[];
    __shared__ float fred[32];
    __shared__ double dred[32];
    const int n = blockIdx.x, h = blockIdx.y, A = nh * dh, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, NW = blockDim.x >> 5;
    const int b = n / M, i = n % M, mlen = len[(size_t)b * nl + layer], qi = mlen + i, L = qi + 1;
    /* same_length: keys j < jlo are masked too (core/par.c), so every query sees as many */
    const int mask_len = mlen + M - ML, shift = mask_len > 0 ? M - mask_len : M;
    const int jlo = same_length && i - shift + 1 > 0 ? i - shift + 1 : 0;
    float *qu = sm, *qv = qu + dh, *accw = qv + dh, *sc = accw + NW * REL_DCHUNK;
    rel_keys<RT> a;
    a.stride = (size_t)3 * A;
    a.qu = qu;
    a.qv = qv;
    a.kb = qkv + (size_t)b * M * a.stride + A + (size_t)h * dh;
    a.kr = ring[b] + off + (size_t)h * dh;
    a.rk = rk + (size_t)h * dh;
    a.mslot = ML > 0 ? (int)((pos[b] - mlen) % ML) : 0;   /* the one 64-bit division */
    a.dh = dh;
    a.A = A;
    a.ML = ML;
    a.mlen = mlen;
    a.qi = qi;
    a.roff = tf ? rk_rows - (mlen + M) : 0;
    a.scale = scale;
    const RT *vb = a.kb + A, *vr = a.kr + (size_t)ML * A;
    const bool store = L <= cap;
    for (int c = tid; c < dh; c += blockDim.x) {
        float q = ldf(qkv + (size_t)n * a.stride + (size_t)h * dh + c);
        qu[c] = q + rwb[h * dh + c];
        qv[c] = q + rrb[h * dh + c];
    }
    __syncthreads();

    float mx = -INFINITY;
    for (int j0 = 32 * warp; j0 < L; j0 += 32 * NW) {
        const float s = rel_tile_scores(&a, j0, lane);
        if (j0 + lane < L && j0 + lane >= jlo) {
            if (store) sc[j0 + lane] = s;
            mx = fmaxf(mx, s);
        }
    }
    mx = block_max(mx, fred);
    double z = 0;
    for (int j0 = 32 * warp; j0 < L; j0 += 32 * NW) {
        const float s = store ? sc[min(j0 + lane, L - 1)] : rel_tile_scores_again(&a, j0, lane);
        if (j0 + lane < L && j0 + lane >= jlo) z += expf(s - mx);
    }
    const float inv = (float)(1.0 / block_sum(z, dred));

    const size_t oo = (size_t)n * A + (size_t)h * dh;   /* the output's offset in att (or attb) */
    for (int cb = 0; cb < dh; cb += REL_DCHUNK) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int j0 = 32 * warp; j0 < L; j0 += 32 * NW) {
            const float s = store ? sc[min(j0 + lane, L - 1)] : rel_tile_scores_again(&a, j0, lane);
            const float wt = j0 + lane < L && j0 + lane >= jlo ? expf(s - mx) * inv : 0.0f;
            const int cnt = L - j0 < 32 ? L - j0 : 32;
            /* REL_VROWS value rows' loads in flight, then their products */
            for (int jb = 0; jb < cnt; jb += REL_VROWS) {
                float vv[REL_VROWS][4];
#pragma unroll
                for (int u = 0; u < REL_VROWS; u++) {
                    const int k = j0 + jb + u;
                    const bool ok = jb + u < cnt;
                    const int sl = a.mslot + k >= ML ? a.mslot + k - ML : a.mslot + k;
                    const RT *v = k < mlen ? vr + (size_t)sl * A : vb + (size_t)(k - mlen) * a.stride;
                    lanes<RT>::ld4(v, cb, lane, dh, ok, vv[u]);   /* (REL_DCHUNK is 128) */
                }
#pragma unroll
                for (int u = 0; u < REL_VROWS; u++) {
                    const float w = __shfl_sync(0xffffffffu, wt, (jb + u) & 31);
                    if (jb + u < cnt) {
#pragma unroll
                        for (int t = 0; t < 4; t++) {
                            if (cb + lanes<RT>::vd(t, lane) < dh) acc[t] = fmaf(w, vv[u][t], acc[t]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < 4; t++) accw[warp * REL_DCHUNK + lanes<RT>::vd(t, lane)] = acc[t];
        __syncthreads();
        for (int c = tid; c < REL_DCHUNK && cb + c < dh; c += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < NW; w++) o += accw[w * REL_DCHUNK + c];
            if (attb) stf(attb + oo + cb + c, o);
            else att[oo + cb + c] = o;
        }
        __syncthreads();
    }
}

/* Shared memory of a block of T threads: q + u, q + v, the warps' sums, the
 * scores kept. */
static size_t rel_smem(const gpu_model *g, int T)
{
    const int cap = g->max_window < REL_SCORE_CAP ? g->max_window : REL_SCORE_CAP;
    return (size_t)(2 * g->m->d_head + (T / 32) * REL_DCHUNK + cap) * sizeof(float);
}

size_t gpu_rel_attn_smem(const gpu_model *g) { return rel_smem(g, 512); }

int gpu_rel_attn(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int nh = m->n_head, dh = m->d_head;
    const int tiled = gpu_rel_tile(g, l, B, M, err);   /* blocks of many queries: rel_tile.cu */
    if (tiled) return tiled < 0 ? -1 : 0;
    const int dec = gpu_rel_decode(g, l, B, M, err);   /* bf16 decode steps: rel_decode.cu */
    if (dec) return dec < 0 ? -1 : 0;
    const int T = (int64_t)B * M * nh < 1024 ? 512 : 128;
    const int cap = g->max_window < REL_SCORE_CAP ? g->max_window : REL_SCORE_CAP;
    const size_t smem = rel_smem(g, T);
    const bool bf = g->prec == GPU_BF16;
    if (smem > 48 * 1024)
        CU_TRY(bf ? cudaFuncSetAttribute(rel_attn_kernel<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                  : cudaFuncSetAttribute(rel_attn_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
               err, "rel_attn: shared memory");
    dim3 grid((unsigned)(B * M), (unsigned)nh);
    const float scale = gpu_rel_scale(m);
    const int64_t off = (int64_t)g->h_off[l], *pos = stage_pos(g, g->d_stage);
    const int *len = stage_len(g, g->d_stage);
    const gpu_layer *d = &g->L[l];
    if (bf)
        rel_attn_kernel<bf16><<<grid, T, smem, g->stream>>>(NULL, g->attb, g->qkvb, M, nh, dh, m->mem_len, m->n_layers, l,
                                                             scale, d->rwb, d->rrb, d->rk, d->rk_rows, m->tf_attn, off,
                                                             (bf16 *const *)stage_ring(g, g->d_stage), pos, len, cap,
                                                             m->same_length);
    else
        rel_attn_kernel<float><<<grid, T, smem, g->stream>>>(g->att, NULL, g->qkv, M, nh, dh, m->mem_len, m->n_layers, l,
                                                              scale, d->rwb, d->rrb, d->rk, d->rk_rows, m->tf_attn, off,
                                                              stage_ring(g, g->d_stage), pos, len, cap, m->same_length);
    LAUNCH_TRY(err, "rel_attn");
    return 0;
}
