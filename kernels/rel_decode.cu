/*
 * rel_decode.cu - relative attention (PAR, the word-level Transformer-XL,
 * par-tf) of one token a stream, GPU_BF16, heads of 32 or 64 dims: decode
 * steps of many streams, read at the memory's bandwidth.
 *
 * A thread block takes a (stream, head) pair's split of its keys j =
 * jlo..mlen (the memory's rows, then the step's own key; dec_tiles_per_block's
 * tiles of 128), 32 keys a warp a tile. A key's rows are read by DH / 8 lanes, 8 dims (16 bytes) each, so a
 * warp's load takes 32 / (DH / 8) whole rows; a tile's key, value and r rows
 * (attn_mma.cu's fp16 r table, row roff + mlen - j) and its v . r (the same
 * file's float table, scaled) are loaded at once, values before the scores
 * are known, as decode_step.cu's attention item does. The score is the
 * tensor-core scoring's: ((q + u) . k + q . r) scale + v . r. Each warp
 * keeps a running softmax (m, Z = sum e, O = sum e v; a lane its 8 dims of
 * its keys: dec_tile.cuh); the warps meet in shared memory; a split leaves (m, Z, O) in
 * g->tpart (every split, an empty one as m = -inf) and rel_combine_kernel
 * divides; one split writes out = O / Z itself.
 *
 * The first tile's loads (the memory's rows: earlier steps') go out before
 * the kernel ahead has ended (pdl_launch); the query and the step's own key
 * and value after.
 *
 * The step's key and value go into ring slot p % mem_len here (fam_rel.cu
 * then launches no ring kernel): that slot is memory row 0's when the memory
 * is full (split 0 reads it and writes it after its reads), else no row a
 * block reads (the split of the step's own key writes it).
 */
#include "gpu_internal.cuh"
#include "dec_tile.cuh"

#define RDEC_WARPS 4
#define RDEC_TILE (32 * RDEC_WARPS)   /* keys a block takes a round */

struct rdec_args {
    bf16 *attb;
    const bf16 *qkv;
    const float *rwb;      /* u: the layer's r_w_bias (any float's alignment) */
    const __half *rk;      /* r rows by distance (fp16), A apart */
    const float *vr;       /* v . r x scale by row and head */
    bf16 *const *ring;
    const int64_t *pos;
    const int *len;
    float *part;           /* NULL: one split */
    int64_t off;           /* the layer's rings in a stream's */
    int rk_rows, tf, ML, nl, layer, same_length, chunk;
    float scale;
};

template <int DH> __global__ static void __launch_bounds__(32 * RDEC_WARPS, 3) rel_decode_kernel(const rdec_args a)
{
    constexpr int LPK = DH / 8, KPI = 32 / LPK, R = 32 / KPI;
    __shared__ float wst[RDEC_WARPS][4 + DH];
    const int b = blockIdx.x, h = blockIdx.y, K = gridDim.y, A = K * DH, sp = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = lane % LPK, grp = lane / LPK;
    const int ML = a.ML, mlen = a.len[(size_t)b * a.nl + a.layer], L = mlen + 1;
    /* same_length: keys j < jlo are masked too (core/par.c), so every query sees as many */
    const int mask_len = mlen + 1 - ML, shift = mask_len > 0 ? 1 - mask_len : 1;
    const int jlo = a.same_length && 1 - shift > 0 ? 1 - shift : 0;
    const int jbeg = sp * a.chunk, jend = min(L, jbeg + a.chunk);
    const int64_t p = a.pos[b];
    const int mslot = ML > 0 ? ring_slot(p - mlen, ML) : 0;
    const bf16 *qb = a.qkv + (size_t)b * 3 * A + (size_t)h * DH, *kb = qb + A, *vb = kb + A;
    bf16 *const kr = a.ring[b] + a.off + (size_t)h * DH, *const vring = kr + (size_t)ML * A;
    const int roff = a.tf ? a.rk_rows - L : 0;
    const size_t oo = (size_t)b * A + (size_t)h * DH;
    float *rec = a.part ? a.part + (((size_t)b * K + h) * gridDim.z + sp) * (DH + 4) : NULL;
    /* the split that writes the step's key and value (ML > 0) */
    const bool wr = ML > 0 && sp == (mlen == ML ? 0 : mlen / a.chunk);
    pdl_next();
    if (jbeg >= jend) {   /* no key here: an empty record (a split past the stream's keys never writes the rings) */
        pdl_wait();
        if (rec && threadIdx.x == 0) rec[0] = -INFINITY, rec[1] = 0.0f;
        return;
    }
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    uint4 kk[R], vv[R], pp[R];
    float mw[R];
    unsigned okm = 0;
    /* a tile's loads: the memory's rows (earlier steps'), the r rows and v . r; the step's own key and value
     * (row mlen, from qkv) only once the kernel ahead has ended (OWN) */
    const auto load = [&](int j0, bool own) {
        okm = 0;
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int j = j0 + KPI * i + grp;
            const bool ok = j < jend && j >= jlo, mem = j < mlen;
            const int sl = mslot + j >= ML ? mslot + j - ML : mslot + j, t = roff + mlen - j;
            const bf16 *kp = mem ? kr + (size_t)sl * A : kb, *vp = mem ? vring + (size_t)sl * A : vb;
            okm |= ok ? 1u << i : 0u;
            kk[i] = ok && (mem || own) ? __ldcg((const uint4 *)kp + c) : z4;
            vv[i] = ok && (mem || own) ? __ldcg((const uint4 *)vp + c) : z4;
            pp[i] = ok ? __ldg((const uint4 *)(a.rk + (size_t)t * A + (size_t)h * DH) + c) : z4;
            mw[i] = ok ? __ldg(a.vr + (size_t)t * K + h) : 0.0f;
        }
    };
    int j0 = jbeg + 32 * warp;
    if (j0 < jend) load(j0, false);
    pdl_wait();
    float q[8], qu[8];
    unpack_bf8(__ldcg((const uint4 *)qb + c), q);
#pragma unroll
    for (int e = 0; e < 8; e++) qu[e] = q[e] + __ldg(a.rwb + h * DH + 8 * c + e);
    if (j0 < jend && j0 <= mlen && mlen < j0 + 32) {   /* the tile holds the step's own key: its rows now */
#pragma unroll
        for (int i = 0; i < R; i++)
            if (j0 + KPI * i + grp == mlen && (okm >> i & 1u)) {
                kk[i] = __ldcg((const uint4 *)kb + c);
                vv[i] = __ldcg((const uint4 *)vb + c);
            }
    }
    float mx = -INFINITY, z = 0.0f, w = 0.0f, acc[8];
#pragma unroll
    for (int e = 0; e < 8; e++) acc[e] = 0.0f;
    /* a tile's scores, softmax and weighted values into the warp's state */
    const auto tile = [&]() {
        float sc[R];
#pragma unroll
        for (int i = 0; i < R; i++) {
            float kf[8], rf[8], ac = 0.0f, bd = 0.0f;
            unpack_bf8(kk[i], kf);
            unpack_h8(pp[i], rf);
#pragma unroll
            for (int e = 0; e < 8; e++) ac = fmaf(qu[e], kf[e], ac), bd = fmaf(q[e], rf[e], bd);
            sc[i] = ac + bd;
        }
        dec_sum_parts<LPK>(sc);
#pragma unroll
        for (int i = 0; i < R; i++) sc[i] = okm >> i & 1u ? fmaf(sc[i], a.scale, mw[i]) : -INFINITY;
        dec_softmax<LPK, R, false>(sc, mw, vv, mx, z, w, acc);
    };
    if (j0 < jend) {
        tile();
        for (j0 += RDEC_TILE; j0 < jend; j0 += RDEC_TILE) {
            load(j0, true);
            tile();
        }
    }
    /* the warp's key groups, then the warps, met (and the block's reads are done) */
    float M2, Z, W, ev[RDEC_WARPS];
    dec_meet<LPK, RDEC_WARPS, DH>(wst, mx, z, w, acc, M2, Z, W, ev);
    (void)W;
    if (rec && threadIdx.x == 0) rec[0] = M2, rec[1] = Z;
    const int ws = ML > 0 ? ring_slot(p, ML) : 0;
    for (int x = threadIdx.x; x < DH; x += blockDim.x) {
        float o = 0.0f;
        for (int v = 0; v < RDEC_WARPS; v++) o += wst[v][4 + x] * ev[v];
        if (rec) rec[4 + x] = o;
        else a.attb[oo + x] = __float2bfloat16(o / Z);
        if (wr) {
            kr[(size_t)ws * A + x] = __ldcg(kb + x);
            vring[(size_t)ws * A + x] = __ldcg(vb + x);
        }
    }
}

/* The splits' records of each (stream, head) met: out = sum e^(m_s - M) O_s
 * / sum e^(m_s - M) Z_s over the splits that met a key */
__global__ static void rel_combine_kernel(bf16 *attb, const float *part, int D, int nsplit)
{
    const int b = blockIdx.x, h = blockIdx.y, K = gridDim.y;
    const float *rec = part + ((size_t)b * K + h) * nsplit * (D + 4);
    pdl_next();
    pdl_wait();
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, __ldcg(rec + (size_t)s * (D + 4)));
    float Z = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        const float m = __ldcg(rec + (size_t)s * (D + 4));
        if (m != -INFINITY) Z += __ldcg(rec + (size_t)s * (D + 4) + 1) * expf(m - M);
    }
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            const float m = __ldcg(rec + (size_t)s * (D + 4));
            if (m != -INFINITY) o += __ldcg(rec + (size_t)s * (D + 4) + 4 + c) * expf(m - M);
        }
        attb[((size_t)b * K + h) * D + c] = __float2bfloat16(o / Z);
    }
}

int gpu_rel_decode(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int D = m->d_head, K = m->n_head, ML = m->mem_len;
    const gpu_layer *y = &g->L[l];
    if (g->prec != GPU_BF16 || M != 1 || (D != 32 && D != 64) || !y->rk16 || !y->vr || g->h_off[l] % 8 || !g->tile_on)
        return 0;
    /* dec_tiles_per_block's tiles a block, as many blocks as g->tpart holds records for */
    const int keys = ML + 1;
    const int tiles = (keys + RDEC_TILE - 1) / RDEC_TILE, per = dec_tiles_per_block(g, (int64_t)B * K * tiles, DEC_FILL_REL);
    int nsplit = (tiles + per - 1) / per;
    while (nsplit > 1 && (size_t)B * K * nsplit * (D + 4) > g->tpart_floats) nsplit--;
    int chunk = (keys + nsplit - 1) / nsplit;
    chunk = (chunk + RDEC_TILE - 1) / RDEC_TILE * RDEC_TILE;
    nsplit = (keys + chunk - 1) / chunk;
    rdec_args a;
    a.attb = g->attb;
    a.qkv = g->qkvb;
    a.rwb = y->rwb;
    a.rk = y->rk16;
    a.vr = y->vr;
    a.ring = (bf16 *const *)stage_ring(g, g->d_stage);
    a.pos = stage_pos(g, g->d_stage);
    a.len = stage_len(g, g->d_stage);
    a.part = nsplit > 1 ? g->tpart : NULL;
    a.off = (int64_t)g->h_off[l];
    a.rk_rows = y->rk_rows;
    a.tf = m->tf_attn;
    a.ML = ML;
    a.nl = m->n_layers;
    a.layer = l;
    a.same_length = m->same_length;
    a.chunk = chunk;
    a.scale = gpu_rel_scale(m);
    const dim3 grid((unsigned)B, (unsigned)K, (unsigned)nsplit);
    CU_TRY(pdl_launch(g, D == 64 ? rel_decode_kernel<64> : rel_decode_kernel<32>, grid, dim3(32 * RDEC_WARPS), 0, a), err,
           "rel_decode");
    if (a.part)
        CU_TRY(pdl_launch(g, rel_combine_kernel, dim3((unsigned)B, (unsigned)K), dim3(64), 0, g->attb, (const float *)g->tpart,
                          D, nsplit),
               err, "rel_decode: combine");
    g->ring_fused = 1;
    return 1;
}
