/*
 * aspan_decode.cu - adaptive-span attention for few queries a stream
 * (decode steps): the result of aspan_attn.cu's kernel in one pass over the
 * keys instead of three.
 *
 * A thread block takes one (query, head) pair and one split of its window:
 * distances 1 + s * chunk .. (s + 1) * chunk (chunk a multiple of 32; one
 * split when the window is short or the pairs are many). Each of its warps
 * takes rounds of 32 distances, one per lane: the lane reads its key row
 * whole (16-byte loads; the row is one or two cache lines) and the key_pe
 * column S - d (lanes over d: coalesced), so the score needs no reduction
 * across lanes. The warp keeps a running softmax: m the largest score,
 * Z = sum exp(s - m), W = sum exp(s - m) m(d), and O = sum exp(s - m) m(d) v
 * over the head's dims (lanes over dims); value rows are read only where the
 * mask is not zero. The warps' states meet in shared memory; a split leaves
 * its (m, Z, W, O) in g->part as aspan_attn.cu's splits do, and
 * aspan_combine_kernel finishes; otherwise the block writes
 * (O / Z) / (W / Z + 1e-8) itself.
 *
 * A step of one token a stream also writes the rings here (ring.cu's launch
 * is then skipped): the new key goes to the slot of distance kw, the new
 * value to that of distance r, and exactly one block reads each of those
 * rows (the one whose split holds the distance), so it writes them after
 * its own reads.
 *
 * Heads of 32, 64 or 128 dims (a template parameter: q is in registers);
 * other widths go to aspan_attn.cu.
 */
#include "gpu_internal.cuh"
#include "dec_tile.cuh"

#define DEC_WARPS 4
#define DEC_CHUNK_MIN 128    /* distances a split takes at least: one round of each warp */

/* q . k over a key row of D values, read with 16-byte loads */
template <int D, typename RT> static __device__ __forceinline__ float row_dot(const float *q, const RT *k)
{
    constexpr int VEC = 16 / sizeof(RT);
    float a = 0.0f;
#pragma unroll
    for (int c = 0; c < D; c += VEC) {
        float v[VEC];
        unpack16(k + c, v);
#pragma unroll
        for (int u = 0; u < VEC; u++) a = fmaf(q[c + u], v[u], a);
    }
    return a;
}

/* Lanes over a value row's dims: in float, lane L takes L + 32 x; in bf16,
 * pairs (one 4-byte load each): 64 (x / 2) + 2 L + x % 2. */
template <typename RT, int D> struct vlanes;
template <int D> struct vlanes<float, D> {
    static constexpr int T = (D + 31) / 32;
    static __device__ __forceinline__ int dim(int x, int l) { return l + 32 * x; }
    static __device__ __forceinline__ void load(const float *v, int l, bool ok, float *o)
    {
#pragma unroll
        for (int x = 0; x < T; x++) o[x] = ok && l + 32 * x < D ? __ldg(v + l + 32 * x) : 0.0f;
    }
};
template <int D> struct vlanes<bf16, D> {
    static constexpr int T = 2 * ((D + 63) / 64);
    static __device__ __forceinline__ int dim(int x, int l) { return 64 * (x >> 1) + 2 * l + (x & 1); }
    static __device__ __forceinline__ void load(const bf16 *v, int l, bool ok, float *o)
    {
#pragma unroll
        for (int p = 0; p < T / 2; p++) {
            const int c = 64 * p + 2 * l;
            float2 f = make_float2(0.0f, 0.0f);
            if (ok && c < D) f = __bfloat1622float2(__ldg((const __nv_bfloat162 *)(v + c)));
            o[2 * p] = f.x;
            o[2 * p + 1] = f.y;
        }
    }
};

template <typename RT, int D>
__global__ static void __launch_bounds__(32 * DEC_WARPS)
    aspan_decode_kernel(float *att, bf16 *attb, const RT *qkv, int M, int S, float scale, const float *key_pe,
                        const int *krows, const int *reach, const int64_t *mask_off, const float *derived,
                        const int64_t *off, RT *const *ring, const int64_t *pos, int chunk, float *part,
                        bool wring)
{
    typedef vlanes<RT, D> VL;
    constexpr int T = VL::T;   /* dims a lane accumulates */
    __shared__ float wst[DEC_WARPS][3 + D];
    const int n = blockIdx.x, h = blockIdx.y, K = gridDim.y, H = K * D, sp = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int b = n / M, i = n % M, kw = krows[h], r = reach[h];
    const int dlo = 1 + sp * chunk, dhi = min(kw, dlo + chunk - 1);
    const size_t oo = (size_t)n * H + (size_t)h * D;
    const size_t stride = (size_t)3 * H;
    const RT *kb = qkv + (size_t)b * M * stride + H + (size_t)h * D, *vb = kb + H;
    RT *const kr = ring[b] + off[h], *const vr = kr + (size_t)kw * D;
    const int64_t t = pos[b] + i;
    const int kslot = kw > 0 ? ring_slot(t, kw) : 0, vslot = r > 0 ? ring_slot(t, r) : 0;
    /* wring (M = 1): this block holds distance kw (r), the ring row the new key (value) replaces */
    const bool wk = wring && dlo <= kw && kw <= dhi, wv = wring && dlo <= r && r <= dhi;
    if (r == 0 || dlo > kw) {   /* nothing here (a zero mask: aspan_combine_kernel or this block writes zeros) */
        if (!part && r == 0)
            for (int c = threadIdx.x; c < D; c += blockDim.x) attb ? stf(attb + oo + c, 0.0f) : stf(att + oo + c, 0.0f);
        if (wk)   /* no value ring; the key is still the window's */
            for (int c = threadIdx.x; c < D; c += blockDim.x) kr[(size_t)kslot * D + c] = kb[c];
        return;
    }
    const float *mask = derived + mask_off[h];

    float q[D];
#pragma unroll
    for (int c = 0; c < D; c++) q[c] = ldf(qkv + (size_t)n * stride + (size_t)h * D + c);
    float mx = -INFINITY, z = 0.0f, w = 0.0f, o[T];
#pragma unroll
    for (int u = 0; u < T; u++) o[u] = 0.0f;

    for (int d0 = dlo + 32 * warp; d0 <= dhi; d0 += 32 * DEC_WARPS) {
        const int d = d0 + lane;
        const bool ok = d <= dhi;
        float s = -INFINITY;
        if (ok) {
            const int sl = kslot - d < 0 ? kslot - d + kw : kslot - d;
            const RT *k = d <= i ? kb + (size_t)(i - d) * stride : kr + (size_t)sl * D;
            float qp = 0.0f;
            const float *pe = key_pe + (S - d);
#pragma unroll
            for (int c = 0; c < D; c++) qp = fmaf(q[c], __ldg(pe + (size_t)c * S), qp);
            s = (row_dot<D>(q, k) + qp) / scale;
        }
        float rm = s;
        for (int o2 = 16; o2 > 0; o2 >>= 1) rm = fmaxf(rm, __shfl_xor_sync(0xffffffffu, rm, o2));
        if (rm > mx) {   /* warp-uniform */
            const float f = expf(mx - rm);
            z *= f;
            w *= f;
#pragma unroll
            for (int u = 0; u < T; u++) o[u] *= f;
            mx = rm;
        }
        const float e = ok ? expf(s - mx) : 0.0f;
        const float wt = ok && d <= r ? e * mask[d - 1] : 0.0f;
        float se = e, sw = wt;
        for (int o2 = 16; o2 > 0; o2 >>= 1) {
            se += __shfl_xor_sync(0xffffffffu, se, o2);
            sw += __shfl_xor_sync(0xffffffffu, sw, o2);
        }
        z += se;
        w += sw;
        /* values: the rounds' rows with a weight, lanes over dims, 8 rows' loads at once */
        const int cnt = min(32, min(dhi, r) - d0 + 1);
        for (int j0 = 0; j0 < cnt; j0 += 8) {
            float vv[8][T];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int dd = d0 + j0 + u;
                const bool okv = j0 + u < cnt;
                const int sl = vslot - dd < 0 ? vslot - dd + r : vslot - dd;
                const RT *v = dd <= i ? vb + (size_t)(i - dd) * stride : vr + (size_t)(okv ? sl : 0) * D;
                VL::load(v, lane, okv, vv[u]);
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const float wj = __shfl_sync(0xffffffffu, wt, (j0 + u) & 31);
#pragma unroll
                for (int x = 0; x < T; x++) o[x] = fmaf(wj, vv[u][x], o[x]);
            }
        }
    }
    /* the warps meet */
    if (lane == 0) {
        wst[warp][0] = mx;
        wst[warp][1] = z;
        wst[warp][2] = w;
    }
#pragma unroll
    for (int x = 0; x < T; x++)
        if (VL::dim(x, lane) < D) wst[warp][3 + VL::dim(x, lane)] = o[x];
    __syncthreads();
    float M2 = -INFINITY;
    for (int v = 0; v < DEC_WARPS; v++) M2 = fmaxf(M2, wst[v][0]);
    float Z = 0.0f, W = 0.0f, ev[DEC_WARPS];
    for (int v = 0; v < DEC_WARPS; v++) {
        ev[v] = wst[v][0] == -INFINITY ? 0.0f : expf(wst[v][0] - M2);
        Z += wst[v][1] * ev[v];
        W += wst[v][2] * ev[v];
    }
    float *rec = part ? part + (((size_t)n * K + h) * gridDim.z + sp) * (D + 4) : NULL;
    if (rec && threadIdx.x == 0) {
        rec[0] = M2;
        rec[1] = Z;
        rec[2] = W;
    }
    const float wz = W / Z + 1e-8f;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float acc = 0.0f;
        for (int v = 0; v < DEC_WARPS; v++) acc += wst[v][3 + c] * ev[v];
        if (rec) rec[4 + c] = acc;
        else if (attb) stf(attb + oo + c, acc / Z / wz);
        else att[oo + c] = acc / Z / wz;
        /* the block's reads are done (the barrier above): the new key and value in */
        if (wk) kr[(size_t)kslot * D + c] = kb[c];
        if (wv) vr[(size_t)vslot * D + c] = vb[c];
    }
}

/* GPU_BF16, one token a stream (decode), heads of 32 or 64 dims: a block
 * of DBW_WARPS warps takes a (stream, head) pair's split of distances in
 * tiles of 32 a warp, and every load of a tile goes out at once: a key's
 * rows are read by DH / 8 lanes, 8 dims (16 bytes) each, so a warp's load
 * takes 32 / (DH / 8) whole rows (full cache lines, where a lane a row
 * touched 32 lines a load), and its key, position (attn_mma.cu's bf16
 * key_pe by distance, pe_h) and value rows and its mask are loaded together,
 * values before the scores are known (decode_step.cu's attention item, the
 * persistent kernel's, does the same). The score q.(k + pe) / sqrt(DH), the
 * lanes' parts summed by shuffles; the warp's running softmax (m, Z = sum e,
 * W = sum e m(d), O = sum e m(d) v, each lane its 8 dims of its keys:
 * dec_tile.cuh); the warps met in shared memory, a split's record into
 * g->part (aspan_combine_kernel's format, which meets them) or the block's
 * output; the step's key and value into the rings by the block that read
 * the rows they replace, after its reads. The grid is the layer's items,
 * each head's splits (one for a head of zero reach) for every stream, of
 * dec_tiles_per_block's tiles each. The first tile's loads (the rings hold
 * earlier steps' rows) go out before the kernel ahead has ended
 * (pdl_launch), the query after. A layer whose widest window is 32 or 64
 * keys (the short spans of aspan-enwik8's first five layers: 32) takes
 * blocks of 1 or 2 warps (NW), so that its items, one block each, fit the
 * device at once (64 streams x 8 heads in blocks of 4 warps, 3 an SM, took
 * two rounds). */
#define DBW_WARPS 4
#define DBW_TILE (32 * DBW_WARPS)   /* distances a block of DBW_WARPS takes a round */

/* The order of a layer's items (a head's split each) in the grid, every
 * stream's copy of an item together (g->split_order 1: longest first, so
 * that the blocks that start last, blocks starting in about the order of
 * their index, are short ones; 2: in head order); n 0: stream by stream,
 * each stream's heads and splits in order. A kernel parameter: a block
 * finds its item in one read. */
#define DBW_ORDER_MAX 320
struct dbw_order {
    int n;
    unsigned short sp[DBW_ORDER_MAX];
    unsigned char h[DBW_ORDER_MAX];
};

template <int DH, int NW>
__global__ static void __launch_bounds__(32 * NW)
    aspan_decode_bw_kernel(bf16 *attb, const bf16 *qkv, const bf16 *pe_h, const int *krows, const int *reach,
                           const int64_t *mask_off, const float *derived, const int64_t *off, bf16 *const *ring,
                           const int64_t *pos, int K, int items, int chunk, int nsplit, float *part,
                           const __grid_constant__ dbw_order ord)
{
    constexpr int LPK = DH / 8, KPI = 32 / LPK, R = 32 / KPI;
    __shared__ __align__(16) float wst[NW][4 + DH];   /* (dec_meet stores float4 rows) */
    /* the block's item: ORD's, or stream b's heads' splits in order (a head of zero reach one, else one a chunk
     * of its keys) */
    const int H = K * DH;
    int b, h = 0, sp;
    if (ord.n) {
        const int nb = (int)gridDim.x / ord.n, it = (int)blockIdx.x / nb;
        b = (int)blockIdx.x % nb;
        h = ord.h[it];
        sp = ord.sp[it];
    } else {
        b = blockIdx.x / items;
        sp = blockIdx.x % items;
        for (;; h++) {
            const int kh = __ldg(krows + h), nh = __ldg(reach + h) == 0 || kh == 0 ? 1 : (kh + chunk - 1) / chunk;
            if (sp < nh || h == K - 1) break;
            sp -= nh;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = lane % LPK, grp = lane / LPK;
    const int kw = krows[h], r = reach[h];
    const int dlo = 1 + sp * chunk, dhi = min(kw, dlo + chunk - 1);
    const size_t oo = (size_t)b * H + (size_t)h * DH;
    const bf16 *qb = qkv + (size_t)b * 3 * H + (size_t)h * DH, *kb = qb + H, *vb = kb + H;
    bf16 *const kr = ring[b] + off[h], *const vr = kr + (size_t)kw * DH;
    const int64_t t = pos[b];
    const int kslot = kw > 0 ? ring_slot(t, kw) : 0, vslot = r > 0 ? ring_slot(t, r) : 0;
    /* this block holds distance kw (r), the ring row the new key (value) replaces */
    const bool wk = dlo <= kw && kw <= dhi, wv = r > 0 && dlo <= r && r <= dhi;
    pdl_next();
    if (r == 0 || dlo > kw) {   /* a zero mask (aspan_combine_kernel or this block writes zeros), or no key */
        pdl_wait();
        if (!part && r == 0)
            for (int x = threadIdx.x; x < DH; x += blockDim.x) attb[oo + x] = __float2bfloat16(0.0f);
        if (r == 0 && kw > 0)   /* (the head's one item) no value ring; the key is still the window's */
            for (int x = threadIdx.x; x < DH; x += blockDim.x) kr[(size_t)kslot * DH + x] = __ldcg(kb + x);
        return;
    }
    const float *mask = derived + mask_off[h];
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    uint4 kk[R], vv[R], pp[R];
    float mw[R];
    unsigned okm = 0;
    /* a tile's loads: the rings (earlier steps'), key_pe and the mask, nothing this step writes before the
     * block's own ring writes: the first tile's go out before the kernel ahead (QKV) has ended */
    const auto load = [&](int d0) {
        okm = 0;
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int d = d0 + KPI * i + grp;
            const bool ok = d <= dhi, vok = ok && d <= r;
            const int ks = kslot - d < 0 ? kslot - d + kw : kslot - d, vs = vslot - d < 0 ? vslot - d + r : vslot - d;
            okm |= ok ? 1u << i : 0u;
            kk[i] = ok ? __ldcg((const uint4 *)(kr + (size_t)ks * DH) + c) : z4;
            pp[i] = ok ? __ldg((const uint4 *)(pe_h + (size_t)d * DH) + c) : z4;
            vv[i] = vok ? __ldcg((const uint4 *)(vr + (size_t)vs * DH) + c) : z4;
            mw[i] = vok ? __ldg(mask + d - 1) : 0.0f;
        }
    };
    int d0 = dlo + 32 * warp;
    if (d0 <= dhi) load(d0);
    pdl_wait();
    float q[8];
    unpack_bf8(__ldcg((const uint4 *)(qb + 8 * c)), q);
    float mx = -INFINITY, z = 0.0f, w = 0.0f, acc[8];
#pragma unroll
    for (int e = 0; e < 8; e++) acc[e] = 0.0f;
    /* a tile's scores, softmax and weighted values into the warp's state */
    const auto tile = [&]() {
        float sc[R];
#pragma unroll
        for (int i = 0; i < R; i++) {
            float kf[8], pf[8], s = 0.0f;
            unpack_bf8(kk[i], kf);
            unpack_bf8(pp[i], pf);
#pragma unroll
            for (int e = 0; e < 8; e++) s = fmaf(q[e], kf[e] + pf[e], s);
            sc[i] = s;
        }
        dec_sum_parts<LPK>(sc);
#pragma unroll
        for (int i = 0; i < R; i++) sc[i] = okm >> i & 1u ? sc[i] / sqrtf((float)DH) : -INFINITY;
        dec_softmax<LPK, R, true>(sc, mw, vv, mx, z, w, acc);
    };
    if (d0 <= dhi) {
        tile();
        for (d0 += 32 * NW; d0 <= dhi; d0 += 32 * NW) {
            load(d0);
            tile();
        }
    }
    /* the warp's key groups, then the warps, met (and the block's reads are done) */
    float M2, Z, W, ev[NW];
    dec_meet<LPK, NW, DH>(wst, mx, z, w, acc, M2, Z, W, ev);
    float *rec = part ? part + (((size_t)b * K + h) * nsplit + sp) * (DH + 4) : NULL;
    if (rec && threadIdx.x == 0) rec[0] = M2, rec[1] = Z, rec[2] = W;
    const float wz = W / Z + 1e-8f;
    for (int x = threadIdx.x; x < DH; x += blockDim.x) {
        float o = 0.0f;
        for (int v = 0; v < NW; v++) o += wst[v][4 + x] * ev[v];
        if (rec) rec[4 + x] = o;
        else attb[oo + x] = __float2bfloat16(o / Z / wz);
        if (wk) kr[(size_t)kslot * DH + x] = __ldcg(kb + x);
        if (wv) vr[(size_t)vslot * DH + x] = __ldcg(vb + x);
    }
}

/* aspan_decode_bw_kernel's launch: splits of whole tiles, as many as
 * g->part holds records for (gpu_aspan_part_recs), each split of each head
 * a block (a grid of the layer's items, no block without keys) */
template <int DH, int NW> static int dec_bw_launch(gpu_model *g, int l, int B, int lw, char *err)
{
    const model_t *m = g->m;
    const int K = m->n_head, T = 32 * NW;
    const int64_t pairs = (int64_t)B * K, tiles = (lw + T - 1) / T;
    int64_t work = 0;
    for (int h = 0; h < K; h++)
        if (m->layers[l].reach[h] > 0) work += (m->layers[l].krows[h] + T - 1) / T;
    int64_t per = dec_tiles_per_block(g, work * B, g->dec_fill);   /* tiles a split */
    const int64_t least = (pairs * tiles + (int64_t)g->part_recs - 1) / (int64_t)g->part_recs;
    if (per < least) per = least;
    const int chunk = (int)(per * T), nsplit = lw > 0 ? (lw + chunk - 1) / chunk : 1;
    int items = 0;
    for (int h = 0; h < K; h++) {
        const int kh = m->layers[l].krows[h];
        items += m->layers[l].reach[h] == 0 || kh == 0 ? 1 : (kh + chunk - 1) / chunk;
    }
    /* g->split_order's order of the items (longest first: by their keys, ties in head and split order), where
     * there are few enough */
    dbw_order ord;
    ord.n = 0;
    if (g->split_order && items > 1 && items <= DBW_ORDER_MAX && K <= 256) {
        int keys[DBW_ORDER_MAX];
        for (int h = 0; h < K; h++) {
            const int kh = m->layers[l].krows[h], zero = m->layers[l].reach[h] == 0 || kh == 0;
            for (int sp = 0; sp < (zero ? 1 : (kh + chunk - 1) / chunk); sp++) {
                int i = ord.n++;
                const int k = zero ? 0 : (kh - sp * chunk < chunk ? kh - sp * chunk : chunk);
                for (; g->split_order == 1 && i > 0 && keys[i - 1] < k; i--)
                    keys[i] = keys[i - 1], ord.h[i] = ord.h[i - 1], ord.sp[i] = ord.sp[i - 1];
                keys[i] = k;
                ord.h[i] = (unsigned char)h;
                ord.sp[i] = (unsigned short)sp;
            }
        }
    }
    float *part = nsplit > 1 ? g->part : NULL;
    CU_TRY(pdl_launch(g, aspan_decode_bw_kernel<DH, NW>, dim3((unsigned)(B * items)), dim3(32 * NW), 0, g->attb,
                      (const bf16 *)g->qkvb, (const bf16 *)g->pe_h, (const int *)(g->krows + (size_t)l * K),
                      (const int *)(g->reach + (size_t)l * K), (const int64_t *)(g->mask_off + (size_t)l * K),
                      (const float *)g->derived, (const int64_t *)(g->d_off + (size_t)l * K),
                      (bf16 *const *)stage_ring(g, g->d_stage), (const int64_t *)stage_pos(g, g->d_stage), K, items,
                      chunk, nsplit, part, ord),
           err, "aspan_decode (bf16)");
    if (part && gpu_aspan_combine_dec(g, l, B, chunk, nsplit, err)) return -1;
    return 1;
}

size_t gpu_aspan_part_recs(const gpu_model *g)
{
    /* where aspan_decode_bw_kernel may run (GPU_BF16, heads of 32 or 64): a tile a split for every stream and head
     * of the widest window, at most 2^18 records (71 MB for heads of 64; past it a split takes more tiles);
     * never fewer than ASPAN_SPLIT_BLOCKS, the other kernels' bound */
    const int D = g->m->d_head;
    if (g->prec != GPU_BF16 || (D != 32 && D != 64)) return ASPAN_SPLIT_BLOCKS;
    size_t n = (size_t)g->max_batch * g->m->n_head * (size_t)((g->max_window + DBW_TILE - 1) / DBW_TILE);
    if (n > ((size_t)1 << 18)) n = (size_t)1 << 18;
    return n < ASPAN_SPLIT_BLOCKS ? ASPAN_SPLIT_BLOCKS : n;
}

template <typename RT, int D>
static int dec_launch(gpu_model *g, int l, int B, int M, int nsplit, int chunk, float *att, bf16 *attb, const RT *qkv,
                      RT *const *ring, char *err)
{
    const model_t *m = g->m;
    const int K = m->n_head;
    float *part = nsplit > 1 ? g->part : NULL;
    aspan_decode_kernel<RT, D><<<dim3((unsigned)(B * M), (unsigned)K, (unsigned)nsplit), 32 * DEC_WARPS, 0, g->stream>>>(
        att, attb, qkv, M, m->span, sqrtf((float)D), g->key_pe, g->krows + (size_t)l * K, g->reach + (size_t)l * K,
        g->mask_off + (size_t)l * K, g->derived, g->d_off + (size_t)l * K, ring, stage_pos(g, g->d_stage), chunk, part,
        M == 1);
    LAUNCH_TRY(err, "aspan_decode");
    if (part && gpu_aspan_combine(g, l, B, M, chunk, nsplit, att, attb, err)) return -1;
    return 1;
}

int gpu_aspan_decode(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int D = m->d_head, K = m->n_head;
    if (!g->tile_on || (D != 32 && D != 64 && D != 128)) return 0;   /* gpu_tiles(g, 0): the per-query kernel */
    int lw = 0;
    for (int h = 0; h < K; h++)
        if (m->layers[l].krows[h] > lw) lw = m->layers[l].krows[h];
    /* splits of at least DEC_CHUNK_MIN distances, as many as g->part holds
     * (ASPAN_SPLIT_BLOCKS records) */
    const int64_t pairs = (int64_t)B * M * K;
    int most = (int)(ASPAN_SPLIT_BLOCKS / pairs), nsplit = (lw + DEC_CHUNK_MIN - 1) / DEC_CHUNK_MIN;
    if (nsplit > most) nsplit = most;
    if (nsplit < 1) nsplit = 1;
    int chunk = (lw + nsplit - 1) / nsplit;
    chunk = (chunk + 31) / 32 * 32;
    if (chunk < 32) chunk = 32;
    nsplit = (lw + chunk - 1) / chunk;
    if (nsplit < 1) nsplit = 1;
    if (g->prec == GPU_BF16 && M == 1 && g->pe_h && D != 128) {   /* decode: aspan_decode_bw_kernel */
        /* (blocks of 1 or 2 warps for windows of up to 32 or 64 keys; SPANSERVE_GPU_DECODE_NARROW=0: 4) */
        if (g->dec_narrow && lw <= 32)
            return D == 32 ? dec_bw_launch<32, 1>(g, l, B, lw, err) : dec_bw_launch<64, 1>(g, l, B, lw, err);
        if (g->dec_narrow && lw <= 64)
            return D == 32 ? dec_bw_launch<32, 2>(g, l, B, lw, err) : dec_bw_launch<64, 2>(g, l, B, lw, err);
        return D == 32 ? dec_bw_launch<32, DBW_WARPS>(g, l, B, lw, err) : dec_bw_launch<64, DBW_WARPS>(g, l, B, lw, err);
    }
    if (g->prec == GPU_BF16) {
        bf16 *const *ring = (bf16 *const *)stage_ring(g, g->d_stage);
        switch (D) {
        case 32: return dec_launch<bf16, 32>(g, l, B, M, nsplit, chunk, NULL, g->attb, g->qkvb, ring, err);
        case 64: return dec_launch<bf16, 64>(g, l, B, M, nsplit, chunk, NULL, g->attb, g->qkvb, ring, err);
        default: return dec_launch<bf16, 128>(g, l, B, M, nsplit, chunk, NULL, g->attb, g->qkvb, ring, err);
        }
    }
    float *const *ring = stage_ring(g, g->d_stage);
    switch (D) {
    case 32: return dec_launch<float, 32>(g, l, B, M, nsplit, chunk, g->att, NULL, g->qkv, ring, err);
    case 64: return dec_launch<float, 64>(g, l, B, M, nsplit, chunk, g->att, NULL, g->qkv, ring, err);
    default: return dec_launch<float, 128>(g, l, B, M, nsplit, chunk, g->att, NULL, g->qkv, ring, err);
    }
}
