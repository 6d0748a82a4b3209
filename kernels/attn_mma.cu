/*
 * attn_mma.cu - the attention of blocks of queries on tensor cores
 * (GPU_BF16, heads of 32 or 64 dims), three kinds:
 *   adaptive-span attention (aspan_tile.cu's result, both memory modes),
 *     with persistent memory too (aspan_pers.cu's): attn_mma_kernel,
 *     MMA_ASPAN;
 *   the window models' causal attention (gpt_attn.cu's): attn_mma_kernel,
 *     MMA_GPT;
 *   PAR / Transformer-XL / par-tf relative attention (rel_tile.cu's,
 *     same_length, clamp_len, par-tf's table): rel_mma_kernel (below, with
 *     what it does differently),
 * with the products q.k, q.position and p.v as mma.sync.m16n8k16 (bf16
 * inputs, fp32 sums) and a FlashAttention-style online softmax over tiles
 * of keys in fp32.
 *
 * A thread block takes MMA_BQ = 64 consecutive queries of one stream (or
 * window) and one head, 16 a warp (the rows of the mma's A operand); it
 * walks their keys in tiles of MMA_BK = 64. For each tile it copies into
 * shared memory (cp.async, 16 bytes a copy, all in flight at once)
 *   - the 64 key and value rows (the step's own rows, the memory's, or a
 *     window's cache),
 *   - the position rows of the 127 distances d = t - s that the tile and
 *     the block's queries can form (adaptive-span: key_pe's column S - d,
 *     kept transposed and in bf16 by gpu_mma_upload), and adaptive-span's
 *     soft mask at those distances (a window model's mask is by key: its
 *     distance from the window's last row).
 * Each warp then forms
 *   S = q K^T         (16 x 64: the tile's keys)
 *   P = q band^T      (16 x 80: its 16 queries' distances to the tile)
 * with q the projection's bf16 query as it is; P goes through shared
 * memory so that each score can take its own distance's term:
 *   adaptive-span  score(i, j) = (S[i][j] + P[i][d]) / sqrt(D)
 *   window models  score(i, j) = S[i][j] / sqrt(D)   (no position term)
 * Persistent vectors are a first tile of keys (the layer's N, in bf16)
 * with no position term and weight 1.
 * Scores outside a query's window are -inf. The running softmax per query
 * row keeps m (the largest score so far), Z = sum exp(s - m), and, with
 * a = exp(s - m) x mask (1 for persistent vectors), W = sum a and
 * O = sum a v (the A operand of p.v is a in bf16, straight from the score
 * fragments' registers). At the end out = (O / Z) / (W / Z + 1e-8) (the
 * references' a / (sum a + 1e-8) after a softmax over the whole window;
 * without a mask it is O / Z). A long window, or too few blocks to fill
 * the device (one stream, a few heads), is split over several blocks
 * (mma_split), whose partial states (m, Z, W, O) in g->tpart
 * aspan_tile.cu's combine kernel meets.
 *
 * Rounding, against the CUDA-core kernels of the same precision: adaptive-
 * span's position rows are bf16 (those kernels read them in float), and so
 * are the weights a of p.v (Z and W are summed from the unrounded a).
 */
#include "gpu_internal.cuh"

#define MMA_BQ 64                  /* queries a block takes: 4 warps of 16 */
#define MMA_BK 64                  /* key positions a tile holds */
#define MMA_NB 128                 /* position rows a tile's band holds (MMA_BQ + MMA_BK - 1, rounded up) */
#define MMA_PW 80                  /* distances of one warp's band (16 + 64 - 1, rounded up to the n-tile) */
#define MMA_PST 84                 /* floats a row of a warp's position scores takes (fewer bank conflicts) */
#define MMA_CHUNK 1024             /* key positions a block takes before an adaptive-span window is split */

enum { MMA_ASPAN, MMA_GPT };   /* attn_mma_kernel's two attentions (its MODE) */

/* ---- mma.sync and its fragments ---- */

/* (mma16816: gpu_internal.cuh) */

/* Four 8x8 bf16 matrices from shared memory, transposed: lane L gives the
 * address of row L % 8 of matrix L / 8 and receives, of each matrix, rows
 * 2 (L % 4) and 2 (L % 4) + 1 of column L / 4. */
static __device__ __forceinline__ void ldsm_x4_trans(unsigned r[4], const bf16 *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* Four 8x8 16-bit matrices from shared memory as they lie: lane L gives the
 * address of row L % 8 of matrix L / 8 and receives, of each matrix, row
 * L / 4, columns 2 (L % 4) and 2 (L % 4) + 1 (an mma's B fragments out of
 * rows that hold its k dimension) */
static __device__ __forceinline__ void ldsm_x4(unsigned r[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* O += a V over KEYS keys of a tile from KEY0 (V's rows DP apart in shared
 * memory; A's fragments in PA): V's B fragments transposed out of its rows */
template <int D, int KEYS>
static __device__ __forceinline__ void mma_pv(float (&o)[D / 8][4], const unsigned (&pa)[KEYS / 16][4], const bf16 *vs,
                                              int dp, int key0, int lane)
{
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; kk++)
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
            unsigned vf[4];
            const int mi = lane >> 3, key = key0 + kk * 16 + (lane & 7) + (mi & 1) * 8, dim = n * 8 + (mi >> 1) * 8;
            ldsm_x4_trans(vf, vs + (size_t)key * dp + dim);
            mma16816(o[n], pa[kk], vf[0], vf[1]);
            mma16816(o[n + 1], pa[kk], vf[2], vf[3]);
        }
}

/* the largest of V over the four lanes that hold a row of a fragment */
static __device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

/* 2^x (ex2.approx.ftz: a result below 2^-126 is 0; no range fix-up around
 * it, which __expf spends a dozen instructions on) */
static __device__ __forceinline__ float ex2_ftz(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

#define MMA_LOG2E 1.4426950408889634f

/* a row's maximum M in base 2, what a score's exponent subtracts: exp(s - m)
 * = 2^(s log2(e) - l), one FFMA and one ex2 (0 while no score is there, so
 * that every -inf gives exp 0) */
static __device__ __forceinline__ float mma_l2max(float m) { return m == -INFINITY ? 0.0f : m * MMA_LOG2E; }

/* The running softmax of a warp's rows g and g + 8 (m, Z, W where there is
 * one, O's fragments) rescaled to the rows' new maxima N0 and N1 */
template <int D>
static __device__ __forceinline__ void mma_rescale(float n0, float n1, float &mx0, float &mx1, float &z0, float &z1,
                                                   float *w0, float *w1, float (&o)[D / 8][4])
{
    const float f0 = n0 == -INFINITY ? 1.0f : ex2_ftz((mx0 - n0) * MMA_LOG2E),
                f1 = n1 == -INFINITY ? 1.0f : ex2_ftz((mx1 - n1) * MMA_LOG2E);
    mx0 = n0;
    mx1 = n1;
    z0 *= f0, z1 *= f1;
    if (w0) *w0 *= f0, *w1 *= f1;
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] *= f0, o[n][1] *= f0, o[n][2] *= f1, o[n][3] *= f1;
}

static __device__ __forceinline__ unsigned pack_bf16(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const unsigned *)&v;
}

static __device__ __forceinline__ unsigned ld32(const bf16 *p) { return *(const unsigned *)p; }

/* ---- the two attentions' arguments ---- */

typedef struct {
    bf16 *attb;                    /* out: B*M x A */
    const bf16 *qkv;               /* B*M x 3A: queries, keys, values */
    bf16 *const *ring;             /* each stream's memory */
    const int64_t *pos;            /* each stream's first position */
    int M, A;
    float scale;                   /* scores are multiplied by it */
    /* adaptive-span */
    const bf16 *pe;                /* (S + 1) x D: row d is key_pe's column S - d (row 0 unused) */
    const int *krows, *reach;      /* the layer's heads' */
    const int64_t *mask_off, *off; /* the layer's heads' mask in `derived`, rings in the memory */
    const float *derived;
    const bf16 *pk, *pv;           /* persistent memory (all-attention layers): K x N x D keys' and values', bf16 */
    int pers_n;                    /* N, or 0 */
    int nsplit, chunk;             /* key positions cut in NSPLIT ranges of CHUNK, a block each */
    float *part;                   /* split: the partial states (NULL: not split) */
    /* relative */
    const float *rwb, *rrb;        /* r_w_bias, r_r_bias of the block: A each */
    const __half *rk;              /* rk_rows x A: the r row of each distance (par-tf: from roff), fp16 */
    const float *vr;               /* rk_rows x K: r_r_bias . r row, per head (gpu_mma_upload) */
    int rk_rows, tf, ML, nl, layer, same_length;
    int ring_write;                /* the block writes its head's keys and values of the step into the ring */
    int64_t roff_ring;             /* the layer's rings in the memory */
    const int *len;                /* the memory rows each stream's layers hold */
    /* window models (fam_gpt.cu): the group's windows, a block's z its window */
    const gpu_gpt_win *win;
    const float *wmask;            /* K x C soft masks by distance from the window's last row, or NULL */
    size_t cache_off;              /* the layer's cache in a stream's ring (K rows, then V rows C x A later) */
    int C;                         /* the window: the cache's rows */
} mma_args;

/* Row g + 8 X of a warp's fragments out (step row NROW, head H of K): the
 * partial state (m, Z, W, O) that aspan_tile.cu's combine meets where the
 * window is split (range SP), else O / DEN in bf16 */
template <int D>
static __device__ __forceinline__ void mma_row_out(const mma_args &a, size_t nrow, int h, int K, int sp, int x, float m,
                                                   float z, float w, float den, const float (&o)[D / 8][4], int c4)
{
    if (a.part) {
        float *rec = a.part + ((nrow * K + h) * a.nsplit + sp) * (D + 3);
        if (c4 == 0) rec[0] = m, rec[1] = z, rec[2] = w;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            rec[3 + n * 8 + 2 * c4] = o[n][2 * x];
            rec[3 + n * 8 + 2 * c4 + 1] = o[n][2 * x + 1];
        }
        return;
    }
    bf16 *out = a.attb + nrow * a.A + (size_t)h * D;
#pragma unroll
    for (int n = 0; n < D / 8; n++)
        *(__nv_bfloat162 *)(out + n * 8 + 2 * c4) = __floats2bfloat162_rn(o[n][2 * x] / den, o[n][2 * x + 1] / den);
}

/* attn_mma_kernel's shared memory */
template <int D> struct mma_smem {
    static const int DP = D + 8;   /* bf16 a shared row takes: 16-byte aligned, no bank conflicts */
    static const size_t k = 0, v = k + (size_t)MMA_BK * DP * 2, band = v + (size_t)MMA_BK * DP * 2,
                        mask = band + (size_t)MMA_NB * DP * 2, pw = mask + MMA_NB * 4,
                        bytes = pw + (size_t)(MMA_BQ / 16) * 16 * MMA_PST * 4;
};

/* N (16 or 0) bytes from SRC into the shared address DST, the rest of its
 * 16 zeros (cp.async) */
static __device__ __forceinline__ void cp16n(unsigned dst, const void *src, int n)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

/* Copies ROWS rows of D bf16 into shared memory (row stride DP) in 16-byte
 * pieces, asynchronously (cp.async: every piece of the tile in flight at
 * once, no registers on the way): row j from src(j), or zeros where src(j)
 * is NULL (a copy of 0 bytes from ZERO_SRC, any valid address, fills 16).
 * mma_copies_wait() waits for all of them (then __syncthreads). */
template <int D, typename F>
static __device__ __forceinline__ void copy_rows(bf16 *dst, int rows, const bf16 *zero_src, F src)
{
    const int per = D / 8;   /* 16-byte pieces a row */
    for (int e = threadIdx.x; e < rows * per; e += blockDim.x) {
        const int j = e / per, c = (e % per) * 8;
        const bf16 *s = src(j);
        cp16n((unsigned)__cvta_generic_to_shared(dst + j * (D + 8) + c), s ? s + c : zero_src, s ? 16 : 0);
    }
}

static __device__ __forceinline__ void mma_copies_wait(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

template <int D, int MODE>
__global__ static void __launch_bounds__(MMA_BQ * 2) attn_mma_kernel(mma_args a)
{
    const bool GPT = MODE == MMA_GPT;
    extern __shared__ __align__(16) unsigned char smraw[];
    typedef mma_smem<D> L;
    const int DP = L::DP;
    bf16 *ks = (bf16 *)(smraw + L::k), *vs = (bf16 *)(smraw + L::v), *band = (bf16 *)(smraw + L::band);
    /* mk: adaptive-span's mask by band distance, or a window model's mask by key */
    float *mk = (float *)(smraw + L::mask);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
    float *pw = (float *)(smraw + L::pw) + warp * 16 * MMA_PST;

    /* the block's queries: i0.. of QN (a stream's block of M, or a window's computed rows), row QBASE + i of
     * the step's buffers, at position P0 + i (a window model: the window's row cached + i) */
    const int nsplit = a.nsplit;
    const int h = blockIdx.y, sp = blockIdx.z % nsplit, K = gridDim.y, A = a.A, M = a.M;
    gpu_gpt_win wn = {};
    if (GPT) wn = a.win[blockIdx.z];
    const int b = GPT ? wn.b : blockIdx.z / nsplit, qn = GPT ? wn.n : M;
    const int i0 = blockIdx.x * MMA_BQ, nq = min(MMA_BQ, qn - i0), iw = i0 + warp * 16;   /* warp's first query */
    if (nq <= 0) return;   /* (a window with fewer tiles than the group's longest) */
    const size_t stride = (size_t)3 * A, qbase = GPT ? (size_t)wn.row0 : (size_t)b * M;
    const int64_t p0 = GPT ? wn.cached : a.pos[b], t0 = p0 + i0;
    const bf16 *kb = a.qkv + qbase * stride + A + (size_t)h * D, *vb = kb + A;

    /* the window: key positions [slo, shi] of the block; per query, the distances it may see */
    int kw = 0, r = 0;
    int64_t slo, shi;
    const bf16 *kr, *vr;
    if (GPT) {   /* window rows 0 .. the block's last query: the cache's below `cached` */
        slo = 0;
        shi = t0 + nq - 1;
        kr = wn.cached ? (const bf16 *)a.ring[b] + a.cache_off + (size_t)h * D : NULL;
        vr = kr ? kr + (size_t)a.C * A : NULL;
    } else {
        kw = a.krows[h];
        r = a.reach[h];
        if (r == 0 && a.pers_n == 0) {   /* a head whose mask is zero everywhere outputs zeros (the combine writes
                                           * them when split); with persistent memory it still attends to it */
            if (!a.part)
                for (int e = threadIdx.x; e < nq * D; e += blockDim.x)
                    a.attb[(qbase + i0 + e / D) * A + (size_t)h * D + e % D] = __float2bfloat16(0.0f);
            return;
        }
        kr = a.ring[b] + a.off[h];
        vr = kr + (size_t)kw * D;
        slo = t0 - kw + (int64_t)sp * a.chunk;
        shi = min(t0 + nq - 2, slo + a.chunk - 1);
    }
    const float *mask = GPT ? (a.wmask ? a.wmask + (size_t)h * a.C : NULL) : a.derived + a.mask_off[h];

    /* the queries' A fragments (rows g and g + 8 of the warp, dims 2 c4 + {0, 1, 8, 9} of each 16), the
     * projection's bf16 as they are */
    unsigned qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int row = iw + g + (x & 1) * 8, c = kk * 16 + 2 * c4 + (x >> 1) * 8;
            qa[kk][x] = row < qn ? ld32(a.qkv + (qbase + row) * stride + (size_t)h * D + c) : 0u;
        }
    /* the rows' positions */
    const int64_t tr0 = p0 + iw + g, tr1 = tr0 + 8;
    const bool act0 = iw + g < qn, act1 = iw + g + 8 < qn;

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float mx0 = -INFINITY, mx1 = -INFINITY, z0 = 0.0f, z1 = 0.0f, w0 = 0.0f, w1 = 0.0f;

    /* One tile: the keys from S0 on (PERS: adaptive-span's persistent vectors S0.. of the layer's N, with no
     * position term and weight 1 in W) */
    auto tile = [&](int64_t s0, bool pers) {
        const int64_t dmin = t0 - s0 - (MMA_BK - 1);   /* distance of band row 0 */
        __syncthreads();   /* the last tile is read */
        copy_rows<D>(ks, MMA_BK, a.qkv, [&](int j) -> const bf16 * {
            const int64_t s = s0 + j;
            if (pers) return s < a.pers_n ? a.pk + ((size_t)h * a.pers_n + s) * D : NULL;
            if (s > shi) return NULL;
            if (s >= p0) return kb + (size_t)(s - p0) * stride;
            if (GPT) return kr + (size_t)s * A;
            return kr + (size_t)ring_slot(s, kw) * D;
        });
        copy_rows<D>(vs, MMA_BK, a.qkv, [&](int j) -> const bf16 * {
            const int64_t s = s0 + j;
            if (pers) return s < a.pers_n ? a.pv + ((size_t)h * a.pers_n + s) * D : NULL;
            if (s > shi) return NULL;
            if (s >= p0) return vb + (size_t)(s - p0) * stride;
            if (GPT) return vr + (size_t)s * A;
            return s >= p0 - r ? vr + (size_t)ring_slot(s, r) * D : NULL;
        });
        if (!pers && !GPT)
            copy_rows<D>(band, MMA_NB, a.qkv, [&](int x) -> const bf16 * {
                const int64_t d = dmin + x;
                return d >= 1 && d <= kw ? a.pe + (size_t)d * D : NULL;
            });
        for (int x = threadIdx.x; x < MMA_NB && !pers; x += blockDim.x) {
            if (GPT) {   /* by key: the mask at the key's distance from the window's last row */
                const int64_t sk = s0 + x;
                if (x < MMA_BK) mk[x] = sk > shi ? 0.0f : mask ? __ldg(mask + (wn.cached + wn.n - 1 - sk)) : 1.0f;
                continue;
            }
            const int64_t d = dmin + x;
            mk[x] = d >= 1 && d <= r ? __ldg(mask + d - 1) : 0.0f;
        }
        mma_copies_wait();
        __syncthreads();

        /* P = q band^T over the warp's 80 distances (band rows 16 warp ..), into pw */
        if (!pers && !GPT) {
            const bf16 *bw = band + (size_t)warp * 16 * DP;
#pragma unroll
            for (int n = 0; n < MMA_PW / 8; n++) {
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    const bf16 *row = bw + (size_t)(n * 8 + g) * DP + kk * 16 + 2 * c4;
                    mma16816(acc, qa[kk], ld32(row), ld32(row + 8));
                }
                *(float2 *)(pw + g * MMA_PST + n * 8 + 2 * c4) = make_float2(acc[0], acc[1]);
                *(float2 *)(pw + (g + 8) * MMA_PST + n * 8 + 2 * c4) = make_float2(acc[2], acc[3]);
            }
        }
        /* S = q K^T */
        float s[MMA_BK / 8][4];
#pragma unroll
        for (int n = 0; n < MMA_BK / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const bf16 *row = ks + (size_t)(n * 8 + g) * DP + kk * 16 + 2 * c4;
                mma16816(s[n], qa[kk], ld32(row), ld32(row + 8));
            }
        }
        __syncwarp();   /* pw is written */

        /* the scores: + the position term of each one's distance, scaled, -inf outside the windows */
        float tm0 = -INFINITY, tm1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < MMA_BK / 8; n++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int rr = g + (x >> 1) * 8, j = n * 8 + 2 * c4 + (x & 1);   /* row in the warp, key in the tile */
                const int64_t sk = s0 + j, t = (x >> 1) ? tr1 : tr0, d = t - sk;
                const bool ok = ((x >> 1) ? act1 : act0) &&
                                (pers ? sk < a.pers_n : sk <= shi && (GPT ? d >= 0 : d >= 1 && d <= kw));
                float v = s[n][x] + (pers || GPT ? 0.0f : pw[rr * MMA_PST + rr - j + MMA_BK - 1]);
                v = ok ? v * a.scale : -INFINITY;
                s[n][x] = v;
                if (x >> 1) tm1 = fmaxf(tm1, v);
                else tm0 = fmaxf(tm0, v);
            }
        tm0 = quad_max(tm0);
        tm1 = quad_max(tm1);
        __syncwarp();   /* pw is read before the next tile's writes */
        /* none of the warp's queries sees the tile (warp-wide: mma.sync and ldmatrix need every lane) */
        if (!__any_sync(0xffffffffu, tm0 != -INFINITY || tm1 != -INFINITY)) return;
        mma_rescale<D>(fmaxf(mx0, tm0), fmaxf(mx1, tm1), mx0, mx1, z0, z1, &w0, &w1, o);

        /* a = exp(s - m) x mask: Z, W, and the A fragments of p.v */
        unsigned pa[MMA_BK / 16][4];
        const float l0 = mma_l2max(mx0), l1 = mma_l2max(mx1);
#pragma unroll
        for (int n = 0; n < MMA_BK / 8; n++) {
            float e[4];
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int rr = g + (x >> 1) * 8, j = n * 8 + 2 * c4 + (x & 1);
                const float p = ex2_ftz(fmaf(s[n][x], MMA_LOG2E, -((x >> 1) ? l1 : l0)));
                const float wt = pers ? p : p * mk[GPT ? j : warp * 16 + rr - j + MMA_BK - 1];
                if (x >> 1) z1 += p, w1 += wt;
                else z0 += p, w0 += wt;
                e[x] = wt;
            }
            pa[n >> 1][(n & 1) * 2] = pack_bf16(e[0], e[1]);
            pa[n >> 1][(n & 1) * 2 + 1] = pack_bf16(e[2], e[3]);
        }
        mma_pv<D, MMA_BK>(o, pa, vs, DP, 0, lane);   /* O += a V */
    };
    if (sp == 0)   /* (the first range of a split window takes the persistent vectors) */
        for (int64_t s0 = 0; s0 < a.pers_n; s0 += MMA_BK) tile(s0, true);
    for (int64_t s0 = slo; s0 <= shi; s0 += MMA_BK) tile(s0, false);

    /* the rows' sums over the four lanes that hold them */
#pragma unroll
    for (int k = 1; k <= 2; k <<= 1) {
        z0 += __shfl_xor_sync(0xffffffffu, z0, k);
        z1 += __shfl_xor_sync(0xffffffffu, z1, k);
        w0 += __shfl_xor_sync(0xffffffffu, w0, k);
        w1 += __shfl_xor_sync(0xffffffffu, w1, k);
    }
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const int row = iw + g + 8 * x;
        if (row >= qn) continue;
        const float z = x ? z1 : z0, w = x ? w1 : w0, m = x ? mx1 : mx0;
        mma_row_out<D>(a, qbase + row, h, K, sp, x, m, z, w, z * (w / z + 1e-8f), o, c4);
    }
}

/* ---- relative attention (PAR, Transformer-XL, par-tf) ----
 *
 * rel_mma_kernel: a block of MMA_BQ queries of one stream and one head, as
 * attn_mma_kernel, for relative attention alone, with its tiles' copies two
 * stages deep (tile n + 1 in flight while tile n is computed) and each
 * score one shared-memory read:
 *   S = (q + u) K^T    as two products, (q + u) x scale in bf16 hi + lo (the
 *                      sum in float: no more rounding than q's own), so that
 *                      u . k needs no pass of its own;
 *   P = q r_d^T        in fp16 (q x scale: q's bf16 is exact in fp16, and so
 *                      is its product with a power of two, the scale of heads
 *                      of 64; the r rows rounded once to fp16's 11 bits: the
 *                      fixture's worst logprob as with the bf16 hi + lo that
 *                      it replaces), into pw with v . r_d x scale (the float
 *                      table vr) added as it is written;
 *   score(i, j) = S[i][j] + pw[i][63 + i - j],
 * -inf outside the query's window (its split range, d >= 0, same_length's
 * first key), a window kept as two bounds a row relative to the tile.
 * A layer whose r rows do not fit fp16 (|r| > 65000) stays on the CUDA
 * cores (gpu_mma_upload); a query past fp16's range is clamped to it.
 */
#define REL_WARPS 8                /* rel_mma_kernel: 4 groups of 16 queries x 2 halves of a tile's keys */
#define REL_KW (MMA_BK / 2)        /* keys of a tile a warp takes */
#define REL_PW 48                  /* distances of one warp's band (16 + 32 - 1, rounded up to the n-tile) */
#define REL_PST 52                 /* floats a row of a warp's position scores takes */

template <int D> struct rel_smem {
    static const int DP = D + 8;   /* 16-bit values a shared row takes: 16-byte aligned, no bank conflicts */
    static const size_t k = 0, v = k + (size_t)MMA_BK * DP * 2, band = v + (size_t)MMA_BK * DP * 2,
                        vrs = band + (size_t)MMA_NB * DP * 2, stage = vrs + MMA_NB * 4,
                        pw = 2 * stage, bytes = pw + (size_t)REL_WARPS * 16 * REL_PST * 4;
};

/* d (16x8 fp32) += a (16x16 fp16, row-major) b (16x8 fp16, column-major) */
static __device__ __forceinline__ void mma16816_f16(float d[4], const unsigned a[4], unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ unsigned pack_f16(float lo, float hi)
{
    const __half2 v = __floats2half2_rn(fminf(fmaxf(lo, -65000.0f), 65000.0f), fminf(fmaxf(hi, -65000.0f), 65000.0f));
    return *(const unsigned *)&v;
}

template <int D>
__global__ static void __launch_bounds__(REL_WARPS * 32, 2) rel_mma_kernel(mma_args a)
{
    extern __shared__ __align__(16) unsigned char smraw[];
    typedef rel_smem<D> L;
    const int DP = L::DP, PER = D / 8, NT = REL_WARPS * 32;   /* 16-byte pieces a row; threads */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
    /* the warp's 16 queries (group qg) and half of each tile's keys (kh): keys kh x 32 .., band rows xb .. */
    const int qg = warp & 3, kh = warp >> 2, kj0 = kh * REL_KW, xb = (MMA_BK - REL_KW) + 16 * qg - kj0;
    float *pw = (float *)(smraw + L::pw) + warp * 16 * REL_PST;

    const int nsplit = a.nsplit, h = blockIdx.y, sp = blockIdx.z % nsplit, K = gridDim.y, A = a.A, M = a.M;
    const int b = blockIdx.z / nsplit, i0 = blockIdx.x * MMA_BQ, nq = min(MMA_BQ, M - i0), iw = i0 + qg * 16;
    if (nq <= 0) return;
    const size_t stride = (size_t)3 * A, qbase = (size_t)b * M;
    const int64_t p0 = a.pos[b];
    const bf16 *kb = a.qkv + qbase * stride + A + (size_t)h * D, *vb = kb + A;
    const int mlen = a.len[(size_t)b * a.nl + a.layer], roff = a.tf ? a.rk_rows - (mlen + M) : 0;
    const int mask_len = mlen + M - a.ML, shift = mask_len > 0 ? M - mask_len : M;
    /* key positions relative to p0: the block's range [klo, khi] (the memory's first row is -mlen) */
    const int klo = -mlen + sp * a.chunk, khi = min(i0 + nq - 1, klo + a.chunk - 1);
    const bf16 *kr = a.ring[b] + a.roff_ring + (size_t)h * D, *vr = kr + (size_t)a.ML * A;
    const int mslot = a.ML > 0 ? (int)((p0 - mlen) % a.ML) : 0;
    const __half *rk = a.rk;

    /* the queries' A fragments (rows g and g + 8 of the warp, dims 2 c4 + {0, 1, 8, 9} of each 16): (q + u)
     * x scale as bf16 hi + lo, and q x scale in fp16 */
    unsigned qh[D / 16][4], ql[D / 16][4], qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int row = iw + g + (x & 1) * 8, c = kk * 16 + 2 * c4 + (x >> 1) * 8;
            float2 q = make_float2(0.0f, 0.0f), u = q;
            if (row < nq + i0) {
                q = __bfloat1622float2(*(const __nv_bfloat162 *)(a.qkv + (qbase + row) * stride + (size_t)h * D + c));
                u = make_float2(__ldg(a.rwb + (size_t)h * D + c), __ldg(a.rwb + (size_t)h * D + c + 1));
            }
            const float sx = (q.x + u.x) * a.scale, sy = (q.y + u.y) * a.scale;
            const __nv_bfloat162 hi = __floats2bfloat162_rn(sx, sy);
            const float2 hf = __bfloat1622float2(hi);
            qh[kk][x] = *(const unsigned *)&hi;
            ql[kk][x] = pack_bf16(sx - hf.x, sy - hf.y);
            qf[kk][x] = pack_f16(q.x * a.scale, q.y * a.scale);
        }
    /* each of this thread's two rows: the window as key positions [lo, hi] relative to p0 */
    int wlo[2], whi[2];
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const int row = iw + g + 8 * x;
        wlo[x] = a.same_length ? -mlen + row - shift + 1 : INT_MIN / 2;
        whi[x] = row < i0 + nq ? min(row, khi) : INT_MIN / 2;
    }

    /* tile T's copies into stage ST: keys and values from s0 = klo + 64 T on, the band of r rows of the
     * distances dmin.. (dmin = i0 - s0 - 63), v . r of each. A thread copies the 16 bytes at dims cc.. of
     * rows cr, cr + NT / PER, ..; a piece outside the window or the table is a copy of 0 bytes (zeros) from
     * a valid address. */
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(smraw);
    const int cc = (threadIdx.x % PER) * 8, cr = threadIdx.x / PER;
    const unsigned st32 = (unsigned)stride;   /* (32-bit offsets from the block's bases: gpu_rel_mma checks the sizes) */
    const __half *rkh = rk + (size_t)h * D;
    const float *vrh = a.vr + h;
    auto issue = [&](int t, int st) {
        const unsigned sb = sm0 + (unsigned)(st * L::stage);
        const int s0 = klo + t * MMA_BK, dmin = i0 - s0 - (MMA_BK - 1);
#pragma unroll
        for (int y = 0; y < MMA_BK * PER / NT; y++) {
            const int j = cr + y * (NT / PER), s = s0 + j;
            int sl = mslot + (s + mlen);
            if (sl >= a.ML) sl -= a.ML;
            const bool direct = s >= 0, in = s <= khi;
            const unsigned off = !in ? cc : direct ? (unsigned)s * st32 + cc : (unsigned)sl * A + cc;
            const bf16 *kbase = direct || !in ? kb : kr, *vbase = direct || !in ? vb : vr;
            const unsigned dst = sb + (unsigned)((j * DP + cc) * 2);
            cp16n(dst + (unsigned)L::k, kbase + off, in ? 16 : 0);
            cp16n(dst + (unsigned)L::v, vbase + off, in ? 16 : 0);
        }
#pragma unroll
        for (int y = 0; y < MMA_NB * PER / NT; y++) {
            const int x = cr + y * (NT / PER), d = roff + dmin + x;
            const bool ok = d >= roff && d < a.rk_rows;
            cp16n(sb + (unsigned)L::band + (unsigned)((x * DP + cc) * 2), rkh + (ok ? (unsigned)d * A + cc : cc), ok ? 16 : 0);
        }
        if (threadIdx.x < MMA_NB) {
            const int d = roff + dmin + (int)threadIdx.x;
            const bool ok = d >= roff && d < a.rk_rows;
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sb + (unsigned)L::vrs + threadIdx.x * 4),
                         "l"(vrh + (ok ? (unsigned)d * K : 0u)), "r"(ok ? 4 : 0));
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float mx0 = -INFINITY, mx1 = -INFINITY, z0 = 0.0f, z1 = 0.0f;

    const int ntiles = khi >= klo ? (khi - klo) / MMA_BK + 1 : 0;
    if (ntiles) issue(0, 0);
    for (int t = 0; t < ntiles; t++) {
        if (t + 1 < ntiles) {
            issue(t + 1, (t + 1) & 1);
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        } else
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();   /* tile t is in its stage */
        const unsigned char *sb = smraw + (size_t)(t & 1) * L::stage;
        const bf16 *ks = (const bf16 *)(sb + L::k), *vs = (const bf16 *)(sb + L::v);
        const __half *band = (const __half *)(sb + L::band);
        const float *vrs = (const float *)(sb + L::vrs);
        const int s0 = klo + t * MMA_BK;

        /* the B fragments of two n-tiles (rows R0 .. R0 + 15 of a table of DP a row, dims kk x 16 ..) by one
         * ldmatrix: lane L's row and column */
        const int lr = (lane >> 4) * 8 + (lane & 7), lc = ((lane >> 3) & 1) * 8;
        /* P = q band^T over the warp's 48 distances (band rows xb ..) + v . r_d, into pw */
#pragma unroll
        for (int n = 0; n < REL_PW / 8; n += 2) {
            float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                unsigned bf[4];
                ldsm_x4(bf, band + (size_t)(xb + n * 8 + lr) * DP + kk * 16 + lc);
                mma16816_f16(acc[0], qf[kk], bf[0], bf[1]);
                mma16816_f16(acc[1], qf[kk], bf[2], bf[3]);
            }
#pragma unroll
            for (int y = 0; y < 2; y++) {
                const float2 vv = *(const float2 *)(vrs + xb + (n + y) * 8 + 2 * c4);
                *(float2 *)(pw + g * REL_PST + (n + y) * 8 + 2 * c4) = make_float2(acc[y][0] + vv.x, acc[y][1] + vv.y);
                *(float2 *)(pw + (g + 8) * REL_PST + (n + y) * 8 + 2 * c4) =
                    make_float2(acc[y][2] + vv.x, acc[y][3] + vv.y);
            }
        }
        /* S = (q + u) K^T over the warp's 32 keys */
        float s[REL_KW / 8][4];
#pragma unroll
        for (int n = 0; n < REL_KW / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int n = 0; n < REL_KW / 8; n += 2)
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                unsigned bf[4];
                ldsm_x4(bf, ks + (size_t)(kj0 + n * 8 + lr) * DP + kk * 16 + lc);
                mma16816(s[n], qh[kk], bf[0], bf[1]);
                mma16816(s[n], ql[kk], bf[0], bf[1]);
                mma16816(s[n + 1], qh[kk], bf[2], bf[3]);
                mma16816(s[n + 1], ql[kk], bf[2], bf[3]);
            }
        __syncwarp();   /* pw is written */

        /* the scores: + the position term of each one's distance (both already scaled), -inf outside the
         * windows (a tile inside every window of the warp's rows, the most of them, checks nothing); key j
         * of the tile (kj0 + jl) at distance column 31 + i - jl of row i's pw */
        float tm0 = -INFINITY, tm1 = -INFINITY;
        const int lo0 = wlo[0] - s0, hi0 = whi[0] - s0, lo1 = wlo[1] - s0, hi1 = whi[1] - s0;
        const float *p0r = pw + g * (REL_PST + 1) + (REL_KW - 1), *p1r = p0r + 8 * (REL_PST + 1);
        if (__all_sync(0xffffffffu, lo0 <= kj0 && lo1 <= kj0 && hi0 >= kj0 + REL_KW - 1 && hi1 >= kj0 + REL_KW - 1)) {
#pragma unroll
            for (int n = 0; n < REL_KW / 8; n++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    const int jl = n * 8 + 2 * c4 + (x & 1);
                    const float v = s[n][x] + ((x >> 1) ? p1r : p0r)[-jl];
                    s[n][x] = v;
                    if (x >> 1) tm1 = fmaxf(tm1, v);
                    else tm0 = fmaxf(tm0, v);
                }
        } else {
#pragma unroll
            for (int n = 0; n < REL_KW / 8; n++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    const int jl = n * 8 + 2 * c4 + (x & 1), j = kj0 + jl;   /* key in the warp's half, in the tile */
                    const bool r1 = x >> 1;
                    const bool ok = r1 ? (j >= lo1 && j <= hi1) : (j >= lo0 && j <= hi0);
                    const float v = ok ? s[n][x] + (r1 ? p1r : p0r)[-jl] : -INFINITY;
                    s[n][x] = v;
                    if (r1) tm1 = fmaxf(tm1, v);
                    else tm0 = fmaxf(tm0, v);
                }
        }
        tm0 = quad_max(tm0);
        tm1 = quad_max(tm1);
        __syncwarp();   /* pw is read before the next tile's writes */
        /* (warp-wide: mma.sync and ldmatrix need every lane) */
        if (__any_sync(0xffffffffu, tm0 != -INFINITY || tm1 != -INFINITY)) {
            const float n0 = fmaxf(mx0, tm0), n1 = fmaxf(mx1, tm1);
            if (__any_sync(0xffffffffu, n0 != mx0 || n1 != mx1))   /* (a larger score: the sums so far rescaled) */
                mma_rescale<D>(n0, n1, mx0, mx1, z0, z1, NULL, NULL, o);
            unsigned pa[REL_KW / 16][4];
            const float l0 = mma_l2max(mx0), l1 = mma_l2max(mx1);
#pragma unroll
            for (int n = 0; n < REL_KW / 8; n++) {
                float e[4];
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    e[x] = ex2_ftz(fmaf(s[n][x], MMA_LOG2E, -((x >> 1) ? l1 : l0)));
                    if (x >> 1) z1 += e[x];
                    else z0 += e[x];
                }
                pa[n >> 1][(n & 1) * 2] = pack_bf16(e[0], e[1]);
                pa[n >> 1][(n & 1) * 2 + 1] = pack_bf16(e[2], e[3]);
            }
            mma_pv<D, REL_KW>(o, pa, vs, DP, kj0, lane);
        }
        __syncthreads();   /* the stage is read before tile t + 2's copies overwrite it */
    }

    /* the ring writes (gpu_par_ring_write's, this head's dims): the block is the only reader of its head's
     * dims of the slots the step's rows replace, and every read of them is done (the loop's last barrier;
     * a.ring_write: one block of queries a stream, not split) */
    if (a.ring_write && a.ML > 0)
        for (int e = threadIdx.x; e < M * PER; e += NT) {
            const int i = e / PER, c = (e % PER) * 8;
            if (i < M - a.ML) continue;
            const int sl = (int)((p0 + i) % a.ML);
            *(uint4 *)(const_cast<bf16 *>(kr) + (size_t)sl * A + c) = *(const uint4 *)(kb + (size_t)i * stride + c);
            *(uint4 *)(const_cast<bf16 *>(vr) + (size_t)sl * A + c) = *(const uint4 *)(vb + (size_t)i * stride + c);
        }
#pragma unroll
    for (int k = 1; k <= 2; k <<= 1) {
        z0 += __shfl_xor_sync(0xffffffffu, z0, k);
        z1 += __shfl_xor_sync(0xffffffffu, z1, k);
    }
    /* the two halves of each query group meet: the second's state (m, Z, O of its rows) through the first
     * stage's memory (free after the loop's last barrier), into the first's */
    float *xs = (float *)smraw + (size_t)qg * 16 * (D + 2);
    if (kh == 1) {
#pragma unroll
        for (int x = 0; x < 2; x++) {
            float *r = xs + (size_t)(g + 8 * x) * (D + 2);
            if (c4 == 0) r[D] = x ? mx1 : mx0, r[D + 1] = x ? z1 : z0;
#pragma unroll
            for (int n = 0; n < D / 8; n++) r[n * 8 + 2 * c4] = o[n][2 * x], r[n * 8 + 2 * c4 + 1] = o[n][2 * x + 1];
        }
    }
    __syncthreads();
    if (kh == 1) return;
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const float *r = xs + (size_t)(g + 8 * x) * (D + 2);
        const float m1 = r[D], ma = x ? mx1 : mx0, mm = fmaxf(ma, m1);
        const float fa = mm == -INFINITY ? 0.0f : __expf(ma - mm), fb = mm == -INFINITY ? 0.0f : __expf(m1 - mm);
        if (x) mx1 = mm, z1 = z1 * fa + r[D + 1] * fb;
        else mx0 = mm, z0 = z0 * fa + r[D + 1] * fb;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][2 * x] = o[n][2 * x] * fa + r[n * 8 + 2 * c4] * fb;
            o[n][2 * x + 1] = o[n][2 * x + 1] * fa + r[n * 8 + 2 * c4 + 1] * fb;
        }
    }
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const int row = iw + g + 8 * x;
        if (row >= i0 + nq) continue;
        const float z = x ? z1 : z0, m = x ? mx1 : mx0;
        mma_row_out<D>(a, qbase + row, h, K, sp, x, m, z, z, z, o, c4);   /* (W = Z: no mask) */
    }
}

template <int D> static int rel_launch(gpu_model *g, const mma_args &a, int B, int nsplit, char *err)
{
    const size_t smem = rel_smem<D>::bytes;
    CU_TRY(cudaFuncSetAttribute(rel_mma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err,
           "rel_mma: shared memory");
    dim3 grid((unsigned)((a.M + MMA_BQ - 1) / MMA_BQ), (unsigned)(a.A / D), (unsigned)(B * nsplit));
    rel_mma_kernel<D><<<grid, REL_WARPS * 32, smem, g->stream>>>(a);
    LAUNCH_TRY(err, "rel_mma");
    return 0;
}

/* B x NSPLIT blocks of the M queries' tiles a head (a window model: B windows of up to M rows) */
template <int D, int MODE> static int mma_launch(gpu_model *g, const mma_args &a, int B, int nsplit, char *err)
{
    const size_t smem = mma_smem<D>::bytes;
    CU_TRY(cudaFuncSetAttribute(attn_mma_kernel<D, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err,
           "attn_mma: shared memory");
    dim3 grid((unsigned)((a.M + MMA_BQ - 1) / MMA_BQ), (unsigned)(a.A / D), (unsigned)(B * nsplit));
    attn_mma_kernel<D, MODE><<<grid, MMA_BQ * 2, smem, g->stream>>>(a);
    LAUNCH_TRY(err, "attn_mma");
    return 0;
}

/* Whether this step's layer can go through here: bf16, tensor cores on,
 * heads of 32 or 64, a block of queries, and every ring row 16-byte aligned
 * (the memory's offsets are multiples of 8 elements). */
static bool mma_fits(const gpu_model *g, int M, int min_m)
{
    const int D = g->m->d_head;
    return g->prec == GPU_BF16 && g->tc_on && g->tile_on && M >= min_m && (D == 32 || D == 64);
}

/* How a layer's key positions are cut (SPAN of them for a block of
 * queries): chunks of at most MMA_CHUNK, multiples of the tile, more while
 * the grid has fewer blocks than the device has SMs (one stream, few
 * heads: each block's tiles run one after another; past one block an SM
 * the partial states and their combine cost more than they give: 32
 * streams of the word-level model, 256 blocks, were 24% slower split in
 * two), at most ASPAN_TILE_SPLITS, as many as g->tpart holds. */
static void mma_split(const gpu_model *g, int B, int M, int span, int *nsplit, int *chunk)
{
    const int K = g->m->n_head, D = g->m->d_head;
    const int64_t blocks = (int64_t)((M + MMA_BQ - 1) / MMA_BQ) * K * B;
    int n = (span + MMA_CHUNK - 1) / MMA_CHUNK;
    while (n < ASPAN_TILE_SPLITS && blocks * n < g->n_sm && span / (n + 1) >= 2 * MMA_BK) n++;
    if (n > ASPAN_TILE_SPLITS) n = ASPAN_TILE_SPLITS;
    while (n > 1 && (size_t)B * M * K * n * (D + 3) > g->tpart_floats) n--;
    int c = (span + n - 1) / n;
    c = (c + MMA_BK - 1) / MMA_BK * MMA_BK;
    *chunk = c;
    *nsplit = (span + c - 1) / c;
}

int gpu_aspan_mma(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int D = m->d_head, K = m->n_head;
    if (!mma_fits(g, M, ASPAN_TILE_MIN_M) || !g->pe_h || (m->pers && !g->L[l].pk_h)) return 0;
    for (int h = 0; h < K; h++)
        if (g->h_off[(size_t)l * K + h] % 8) return 0;
    /* the layer's widest window, cut by mma_split */
    int lw = 0;
    for (int h = 0; h < K; h++)
        if (m->layers[l].krows[h] > lw) lw = m->layers[l].krows[h];
    const int span = lw + (M < MMA_BQ ? M : MMA_BQ) - 1;
    int nsplit, chunk;
    mma_split(g, B, M, span, &nsplit, &chunk);

    mma_args a = {};
    a.attb = g->attb;
    a.qkv = g->qkvb;
    a.ring = (bf16 *const *)stage_ring(g, g->d_stage);
    a.pos = stage_pos(g, g->d_stage);
    a.M = M;
    a.A = K * D;
    a.scale = 1.0f / sqrtf((float)D);
    a.pe = g->pe_h;
    a.krows = g->krows + (size_t)l * K;
    a.reach = g->reach + (size_t)l * K;
    a.mask_off = g->mask_off + (size_t)l * K;
    a.off = g->d_off + (size_t)l * K;
    a.derived = g->derived;
    a.pk = g->L[l].pk_h;
    a.pv = g->L[l].pv_h;
    a.pers_n = m->pers;
    a.nsplit = nsplit;
    a.chunk = chunk;
    a.part = nsplit > 1 ? g->tpart : NULL;
    if (D == 64 ? mma_launch<64, MMA_ASPAN>(g, a, B, nsplit, err) : mma_launch<32, MMA_ASPAN>(g, a, B, nsplit, err)) return -1;
    /* (with persistent memory no head outputs zeros: its vectors have no mask) */
    if (nsplit > 1 && gpu_aspan_tile_combine(g, m->pers ? NULL : g->reach + (size_t)l * K, 1, B, M, nsplit, err))
        return -1;
    return 1;
}

int gpu_rel_mma(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int D = m->d_head, K = m->n_head;
    const gpu_layer *y = &g->L[l];
    if (!mma_fits(g, M, REL_TILE_MIN_M) || !y->rk16 || g->h_off[l] % 8) return 0;
    /* rel_mma_kernel's copies take 32-bit offsets from a stream's first row, its ring and the r table */
    const size_t A = (size_t)K * D, lim = (size_t)1 << 31;
    if ((size_t)M * 3 * A >= lim || (size_t)m->mem_len * A >= lim || (size_t)y->rk_rows * A >= lim) return 0;
    mma_args a = {};
    a.attb = g->attb;
    a.qkv = g->qkvb;
    a.ring = (bf16 *const *)stage_ring(g, g->d_stage);
    a.pos = stage_pos(g, g->d_stage);
    a.M = M;
    a.A = K * D;
    a.scale = gpu_rel_scale(m);
    a.rwb = y->rwb;
    a.rrb = y->rrb;
    a.rk = y->rk16;
    a.vr = y->vr;
    a.rk_rows = y->rk_rows;
    a.tf = m->tf_attn;
    a.ML = m->mem_len;
    a.nl = m->n_layers;
    a.layer = l;
    a.same_length = m->same_length;
    a.roff_ring = (int64_t)g->h_off[l];
    a.len = stage_len(g, g->d_stage);
    /* a block's keys: the memory (at most mem_len rows) and the step's rows up to its last query (the
     * last block's: mem_len + M; an earlier block's later ranges are empty) */
    int nsplit, chunk;
    mma_split(g, B, M, m->mem_len + M, &nsplit, &chunk);
    a.nsplit = nsplit;
    a.chunk = chunk;
    a.part = nsplit > 1 ? g->tpart : NULL;
    /* one block of queries a stream and head, not split: it writes the rings itself (fam_rel.cu then
     * launches no ring kernel) */
    a.ring_write = nsplit == 1 && M <= MMA_BQ;
    if (D == 64 ? rel_launch<64>(g, a, B, nsplit, err) : rel_launch<32>(g, a, B, nsplit, err)) return -1;
    if (nsplit > 1 && gpu_aspan_tile_combine(g, NULL, 0, B, M, nsplit, err)) return -1;
    g->ring_fused = a.ring_write;
    return 1;
}

int gpu_gpt_mma(gpu_model *g, int l, const gpu_gpt_win *w, int nw, int max_n, char *err)
{
    const model_t *m = g->m;
    const int D = m->d_head;
    if (!mma_fits(g, max_n, GPT_MMA_MIN_ROWS) || nw < 1) return 0;
    if (m->cache_kv && g->h_off[l] % 8) return 0;
    mma_args a = {};
    a.attb = g->attb;
    a.qkv = g->qkvb;
    a.ring = (bf16 *const *)stage_ring(g, g->d_stage);
    a.M = max_n;
    a.A = m->n_head * D;
    a.scale = 1.0f / sqrtf((float)D);
    a.nsplit = 1;
    a.win = w;
    a.wmask = g->L[l].wmask;
    a.cache_off = m->cache_kv ? g->h_off[l] : 0;
    a.C = m->window;
    if (D == 64 ? mma_launch<64, MMA_GPT>(g, a, nw, 1, err) : mma_launch<32, MMA_GPT>(g, a, nw, 1, err)) return -1;
    return 1;
}

/* key_pe[c][S - d] -> pe[d][c] in bf16, d = 1..S (row 0 zeros) */
__global__ static void pe_table_kernel(bf16 *pe, const float *key_pe, int S, int D)
{
    const size_t n = (size_t)(S + 1) * D;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const int d = (int)(e / D), c = (int)(e % D);
        pe[e] = __float2bfloat16(d == 0 ? 0.0f : key_pe[(size_t)c * S + (S - d)]);
    }
}

/* y = fp16(x); *BIG set where some |x| is past 65000 (the layer then stays
 * on the CUDA cores) */
__global__ static void f16_kernel(__half *y, const float *x, size_t n, int *big)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const float v = x[e];
        if (!(fabsf(v) <= 65000.0f)) *big = 1;
        y[e] = __float2half_rn(fminf(fmaxf(v, -65000.0f), 65000.0f));
    }
}

/* vr[t][h] = (r_r_bias_h . rk[t][h's dims]) x scale, in double (the
 * scores' scale: rel_mma_kernel adds it to scaled products) */
__global__ static void vr_table_kernel(float *vr, const float *rk, const float *rrb, int rows, int K, int D, double scale)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * K) return;
    const int t = e / K, h = e % K;
    double acc = 0.0;
    for (int c = 0; c < D; c++) acc += (double)rrb[h * D + c] * rk[(size_t)t * K * D + (size_t)h * D + c];
    vr[e] = (float)(acc * scale);
}

int gpu_mma_upload(gpu_model *g, char *err)
{
    const model_t *m = g->m;
    const int D = m->d_head, A = m->n_head * D;
    if (g->prec != GPU_BF16 || (D != 32 && D != 64)) return 0;
    const bool aspan = g->fam == &gpu_family_aspan && g->key_pe, rel = g->fam == &gpu_family_rel;
    if (!aspan && !rel) return 0;
    const size_t np = (size_t)m->n_head * m->pers * D;   /* a layer's persistent keys (values as many) */
    size_t n = aspan ? (size_t)(m->span + 1) * D + (size_t)m->n_layers * 2 * np : 0;
    for (int l = 0; rel && l < m->n_layers; l++)
        if (g->L[l].rk) n += (size_t)g->L[l].rk_rows * A;
    if (n == 0) return 0;
    CU_TRY(cudaMalloc(&g->mma_tab, n * sizeof(bf16)), err, "cudaMalloc (the tensor-core attention's tables)");
    g->weight_bytes += n * sizeof(bf16);
    bf16 *at = g->mma_tab;
    if (aspan) {
        pe_table_kernel<<<256, 256, 0, g->stream>>>(at, g->key_pe, m->span, D);
        LAUNCH_TRY(err, "attn_mma: key_pe table");
        g->pe_h = at;
        at += (size_t)(m->span + 1) * D;
        for (int l = 0; np && l < m->n_layers; l++) {
            if (gpu_to_bf16(g, at, g->L[l].pk, np, err) || gpu_to_bf16(g, at + np, g->L[l].pv, np, err)) return -1;
            g->L[l].pk_h = at;
            g->L[l].pv_h = at + np;
            at += 2 * np;
        }
    }
    size_t nv = 0;
    for (int l = 0; rel && l < m->n_layers; l++)
        if (g->L[l].rk) nv += (size_t)g->L[l].rk_rows * m->n_head;
    if (nv) {
        CU_TRY(cudaMalloc(&g->mma_vr, nv * sizeof(float)), err, "cudaMalloc (the tensor-core attention's tables)");
        g->weight_bytes += nv * sizeof(float);
    }
    float *vt = g->mma_vr;
    /* a flag a layer: some r row past fp16's range */
    const size_t nl = (size_t)m->n_layers;
    int *big = NULL, *h_big = rel ? (int *)calloc(nl, sizeof(int)) : NULL;
    if (rel && !h_big) return err_set(err, "out of memory");
    if (rel && (cudaMalloc(&big, nl * sizeof(int)) != cudaSuccess ||
                cudaMemsetAsync(big, 0, nl * sizeof(int), g->stream) != cudaSuccess)) {
        free(h_big);
        cudaFree(big);
        return err_set(err, "cudaMalloc (the r tables' range)");
    }
    for (int l = 0; rel && l < m->n_layers; l++)
        if (g->L[l].rk) {
            const int rows = g->L[l].rk_rows;
            f16_kernel<<<256, 256, 0, g->stream>>>((__half *)at, g->L[l].rk, (size_t)rows * A, big + l);
            g->L[l].rk16 = (const __half *)at;
            at += (size_t)rows * A;
            vr_table_kernel<<<(rows * m->n_head + 255) / 256, 256, 0, g->stream>>>(vt, g->L[l].rk, g->L[l].rrb, rows,
                                                                                    m->n_head, D, gpu_rel_scale(m));
            g->L[l].vr = vt;   /* (the launches' errors: cudaGetLastError below) */
            vt += (size_t)rows * m->n_head;
        }
    if (big) {   /* a layer with an r row past fp16's range keeps the CUDA-core kernels */
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaMemcpyAsync(h_big, big, nl * sizeof(int), cudaMemcpyDeviceToHost, g->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
        cudaFree(big);
        for (size_t l = 0; e == cudaSuccess && l < nl; l++)
            if (h_big[l]) g->L[l].rk16 = NULL;
        free(h_big);
        CU_TRY(e, err, "building the tensor-core attention's tables");
    }
    CU_TRY(cudaStreamSynchronize(g->stream), err, "building the tensor-core attention's tables");
    return 0;
}
