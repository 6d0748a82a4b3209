/*
 * decode_step.cu - a decode step (one token for each of up to
 * MK_MAX_B streams) as one persistent kernel: a block on every SM for the
 * whole step, layer after layer, with a barrier across the grid where
 * kernel boundaries were (issue 17). GPU_BF16 only (fp32 keeps its exact
 * launches): adaptive-span (span or exact memory, no persistent memory) and
 * PAR (relative attention), post-LN, heads of 32 or 64 dims, a model of a
 * multiple of 128 up to 512, an output layer with its log-softmax (no
 * adaptive softmax). Everything else, and a step of more streams, takes
 * forward.cu's graphs (gpu_decode_kernel_status says why). Off unless asked
 * for (gpu_decode_kernel): not yet faster than the graphs (README "Decode
 * as one kernel" has the figures and the profile).
 *
 * A step is a list of sublayers (mk_sub: attention or feed-forward, in the
 * model's order; PAR's skip blocks are none), then the output layer. Each
 * sublayer's phases, a grid barrier after each:
 *
 *   attention:    QKV  the input (below) x [Wq;Wk;Wv]^T into qkv (bf16)
 *                 ATT  each (stream, head, split of up to MK_SPLIT keys)
 *                      a block: scores, softmax and values over its keys,
 *                      the block's warps met in shared memory, splits met
 *                      by the last block to finish (a counter per stream
 *                      and head, reset by that block); the new key and
 *                      value into the rings by the block that read the rows
 *                      they replace, after its reads; att (bf16)
 *                 WO   att Wo^T into r (bf16)
 *   feed-forward: FC1  the input x fc1^T, its bias and ReLU, into ff (bf16)
 *                 FC2  ff fc2^T into r (bf16)
 *   output:       OUT  the input x Wout^T into the logits (float)
 *                 LSM  a block a row: log_softmax(logits + b) in place
 *
 * The input of QKV, FC1 and OUT: the embedding (the first sublayer), else
 * the residual's LayerNorm of the sublayer before, x = LN(x + r + rb),
 * which every block computes for itself (a warp a row, sums in float, as
 * layernorm.cu's warp kernel), rounded to bf16 in shared memory; block 0
 * writes x (float) to the other of two buffers, so no block reads what
 * another writes in a phase. Rounding points are those of forward.cu's
 * bf16 step (qkv, att, r, ff in bf16; the residual stream, LayerNorm and
 * the softmaxes in float); adaptive-span's position rows are bf16
 * (attn_mma.cu's key_pe table by distance), where the graphs' decode
 * kernel reads key_pe in float.
 *
 * The linear layers: a warp a weight row (two rows' loads in flight; bf16,
 * 16-byte loads), the B inputs from shared memory, float sums. Before each
 * barrier a block asks L2 for what it reads next (the next linear layer's
 * rows, the attention's ring and position rows and masks, the LayerNorm's
 * weights: prefetch.global.L2). The attention: a lane takes two keys and
 * reads their key, position and value rows whole (16-byte loads, all in
 * flight), weights its value rows in registers, and warp_transpose_sum
 * sums them over the lanes; value rows are read only under the mask.
 * Rows written in this kernel are read through L2 (ld.global.cg).
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

#include <stdlib.h>
#include <string.h>

#define MK_THREADS 256
#define MK_WARPS (MK_THREADS / 32)
#define MK_MAX_B 8               /* streams a step */
#define MK_MAX_IN 2048           /* the widest input of a linear layer: 8 loads of 16 bytes a lane */
#define MK_MAX_D 512             /* the widest residual stream: 4 float4s a lane */
#define MK_MAX_DH 64             /* head dims: 32 or 64 (a template parameter) */
#define MK_SPLIT (MK_WARPS * 64) /* keys a block of the attention takes: 64 a warp, two a lane */
#define MK_MAX_SPLITS 64         /* splits of a head's keys at most */
#define MK_REC (MK_MAX_DH + 4)   /* a split's partial state: m, Z, W, (pad), O */

enum { MK_ASPAN = 0, MK_REL = 1, MK_FFN = 2 };

typedef struct {
    int kind, layer;
    const bf16 *w1, *w2;         /* attention: Wqkv (3A x D), Wo (D x A); feed-forward: fc1 (I x D), fc2 (D x I) */
    const float *b1;             /* fc1's bias */
    const float *rb;             /* the residual's bias (Wo's, fc2's) or NULL */
    const float *lnw, *lnb;      /* the LayerNorm after the sublayer */
    /* adaptive-span: per head key rows, reach, mask offset in `derived`, ring offset */
    const int *krows, *reach;
    const int64_t *mask_off, *off;
    /* relative attention: r_net rows by distance, u, v; the layer's ring offset */
    const float *rk, *rwb, *rrb;
    int64_t roff;
    const int *items;            /* the attention's blocks of one stream: (head << 16) | split */
    int nitems;
} mk_sub;

typedef struct {
    const mk_sub *subs;
    int nsub, B, D, A, I, K, dh, V, ML, nl, same_len, nsmax;
    float emb_scale, eps, rel_scale;
    const float *emb, *out_b, *derived;
    const bf16 *out_h, *pe_h;   /* pe_h: adaptive-span's key_pe by distance in bf16 (attn_mma.cu's table) */
    float *X0, *X1;              /* the residual stream, two buffers */
    bf16 *qkv, *att, *r, *ff;
    float *logits, *part;
    int *cnt;                    /* the splits finished, per stream and head */
    unsigned long long *bar;     /* the grid barrier: arrivals since the plan (never reset) */
    unsigned long long bar_base; /* its count when the step starts: steps x barriers a step x blocks */
    unsigned long long *trace;   /* NULL, or gpu_decode_trace's times: per barrier, each block's arrival, then
                                  * block 0's leaving (row 0: the start) */
    const int32_t *tok;
    const int64_t *pos;
    bf16 *const *ring;
    const int *len;
} mk_args;

#define MK_MAX_BARRIERS (3 * 2 * 64 + 1)   /* a step's: 3 an attention, 2 a feed-forward, 1 the output */

struct gpu_mk {
    mk_sub *d_subs;
    int *d_items;
    float *d_part;               /* the splits' records, counters and barrier: one allocation */
    mk_args a;
    size_t smem;
    int grid;
    int nbar;                    /* barriers a step */
    unsigned long long steps;    /* steps launched since the barrier's count was 0 */
    char kind[MK_MAX_BARRIERS];  /* what each barrier ends: Q(KV), A(ttention), W(o), 1 (fc1), 2 (fc2), O(ut) */
    unsigned long long *d_trace; /* gpu_decode_trace's buffer (NULL until asked) */
};

/* ------------------------------------------------------------ the barrier */

static __device__ __forceinline__ void red_release_add(unsigned long long *p, unsigned long long v)
{
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

static __device__ __forceinline__ unsigned long long globaltimer()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* Every block of the grid waits here for all the others, at the step's
 * barrier PH (the count of those passed; the next is returned). Thread 0
 * of each block adds its arrival (after the block's writes, which the
 * fence makes visible to the grid) to a count that only grows, and polls
 * it with relaxed loads (an acquiring load would invalidate the SM's L1 at
 * every poll, the working warps' data with it) until every block's arrival
 * at this barrier is in, then fences once: nothing is reset between
 * barriers or steps, and no arrival waits for an answer. */
static __device__ __noinline__ int grid_sync(const mk_args &a, int ph)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        const size_t row = (size_t)(ph + 1) * (gridDim.x + 1);
        if (a.trace) a.trace[row + blockIdx.x] = globaltimer();
        __threadfence();
        red_release_add(a.bar, 1ull);
        const unsigned long long target = a.bar_base + (unsigned long long)(ph + 1) * gridDim.x;
        while (ld_relaxed(a.bar) < target) {}
        __threadfence();
        if (a.trace && blockIdx.x == 0) a.trace[row + gridDim.x] = globaltimer();
    }
    __syncthreads();
    return ph + 1;
}

static __device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* This warp's rows of W (OUT x IN bf16) into L2, ahead of their phase */
static __device__ __noinline__ void prefetch_rows(const bf16 *W, int out, int in)
{
    const int lane = threadIdx.x & 31, gw = blockIdx.x * MK_WARPS + (threadIdx.x >> 5), nw = gridDim.x * MK_WARPS;
    const int lines = in * (int)sizeof(bf16) / 128;
    for (int o = gw; o < out; o += nw)
        for (int c = lane; c < lines; c += 32) prefetch_l2((const char *)(W + (size_t)o * in) + 128 * c);
}

/* The 128-byte lines of N bytes at P into L2, over the block's threads */
static __device__ __forceinline__ void prefetch_bytes(const void *p, size_t n)
{
    const char *e = (const char *)p + n;
    for (const char *q = (const char *)((uintptr_t)p & ~(uintptr_t)127) + 128 * threadIdx.x; q < e; q += 128 * blockDim.x)
        prefetch_l2(q);
}

/* The lines of N bytes at P (128-byte aligned) into L2, by this thread */
static __device__ __forceinline__ void prefetch_bytes1(const void *p, int n)
{
    for (int o = 0; o < n; o += 128) prefetch_l2((const char *)p + o);
}

/* ------------------------------------------------------------ the linear layers */

static __device__ __forceinline__ void bf8(const uint4 &v, float *o)
{
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[k]);
        o[2 * k] = f.x, o[2 * k + 1] = f.y;
    }
}

enum { EPI_BF16, EPI_BIAS_RELU, EPI_FLOAT };

/* y[b][o] = W[o] . xs[b] for the B inputs in shared memory (LD floats
 * apart), rows o a warp each; EPI: bf16(y) into Y (B x OUT), bf16(max(y +
 * bias, 0)), or y in float into YF. */
static __device__ __forceinline__ void gemv_out(int epi, float v, int b, int o, int out, bf16 *y, float *yf,
                                                const float *bias)
{
    if (epi == EPI_BF16) y[(size_t)b * out + o] = __float2bfloat16(v);
    else if (epi == EPI_BIAS_RELU) y[(size_t)b * out + o] = __float2bfloat16(fmaxf(v + __ldg(bias + o), 0.0f));
    else yf[(size_t)b * out + o] = v;
}

/* y[b][o] = W[o] . xs[b] for the B inputs in shared memory (LD floats
 * apart), rows o a warp each, two rows' loads in flight at once; EPI:
 * bf16(y) into Y (B x OUT), bf16(max(y + bias, 0)), or y in float into
 * YF. (Loops that need not be unrolled are not: the kernel's code must
 * stay small enough for the instruction caches.) */
static __device__ __noinline__ void gemv(int epi, const bf16 *W, int out, int in, const float *xs, int ld, int B, bf16 *y,
                                         float *yf, const float *bias)
{
    constexpr int NC = MK_MAX_IN / 256;
    const int lane = threadIdx.x & 31, gw = blockIdx.x * MK_WARPS + (threadIdx.x >> 5), nw = gridDim.x * MK_WARPS;
    const int nv = in / 8;   /* 16-byte vectors of a row: lane L takes L, L + 32, ... */
    for (int o = gw; o < out; o += 2 * nw) {
        const int o2 = o + nw;
        const bool two = o2 < out;
        uint4 w[2][NC];
#pragma unroll
        for (int c = 0; c < NC; c++)
            if (lane + 32 * c < nv) {
                w[0][c] = __ldg((const uint4 *)(W + (size_t)o * in + 8 * lane + 256 * c));
                if (two) w[1][c] = __ldg((const uint4 *)(W + (size_t)o2 * in + 8 * lane + 256 * c));
            }
        /* a stream at a time (the weights stay packed) */
#pragma unroll 1
        for (int b = 0; b < B; b++) {
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                if (lane + 32 * c >= nv) break;
                const float4 x0 = *(const float4 *)(xs + b * ld + 256 * c + 8 * lane);
                const float4 x1 = *(const float4 *)(xs + b * ld + 256 * c + 8 * lane + 4);
                float wf[8];
                bf8(w[0][c], wf);
                s0 = fmaf(wf[0], x0.x, s0), s0 = fmaf(wf[1], x0.y, s0), s0 = fmaf(wf[2], x0.z, s0), s0 = fmaf(wf[3], x0.w, s0);
                s0 = fmaf(wf[4], x1.x, s0), s0 = fmaf(wf[5], x1.y, s0), s0 = fmaf(wf[6], x1.z, s0), s0 = fmaf(wf[7], x1.w, s0);
                bf8(w[1][c], wf);
                s1 = fmaf(wf[0], x0.x, s1), s1 = fmaf(wf[1], x0.y, s1), s1 = fmaf(wf[2], x0.z, s1), s1 = fmaf(wf[3], x0.w, s1);
                s1 = fmaf(wf[4], x1.x, s1), s1 = fmaf(wf[5], x1.y, s1), s1 = fmaf(wf[6], x1.z, s1), s1 = fmaf(wf[7], x1.w, s1);
            }
            s0 = warp_sum(s0);
            s1 = warp_sum(s1);
            if (lane == 0) {
                gemv_out(epi, s0, b, o, out, y, yf, bias);
                if (two) gemv_out(epi, s1, b, o2, out, y, yf, bias);
            }
        }
    }
}

/* The B rows of a bf16 buffer written in this kernel (L2, not L1) into
 * shared memory as floats, LD apart */
static __device__ __noinline__ void load_rows(float *xs, int ld, const bf16 *src, int n, int B)
{
    for (int i = threadIdx.x; i < B * n / 2; i += blockDim.x) {
        const int b = 2 * i / n, c = 2 * i % n;
        const unsigned u = __ldcg((const unsigned *)(src + (size_t)b * n + c));
        const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&u);
        xs[b * ld + c] = f.x;
        xs[b * ld + c + 1] = f.y;
    }
}

/* 4 floats at P, any float's alignment (a model's weights lie in its arena
 * as the file has them) */
static __device__ __forceinline__ float4 ld4(const float *p)
{
    return make_float4(__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3));
}

/* The input of QKV, FC1 or OUT into shared memory, rounded to bf16 (the
 * linear layers' input type), from the embedding (PREV NULL) or as x =
 * LN(x + r + rb) of the sublayer before; block 0 writes x (float) into XO
 * while every block reads XI. A warp a row, lane L holding the float4s L
 * + 32 k; every load of the row (x, r and the LayerNorm's weights, which
 * the barrier before brought into L2) issued before any arithmetic. */
static __device__ __noinline__ void mk_input(const mk_args &a, const mk_sub *prev, const float *xi, float *xo, float *xs,
                                             int ld)
{
    constexpr int NV = MK_MAX_D / 128;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, D = a.D;
    for (int b = warp; b < a.B; b += MK_WARPS) {
        float4 u[NV], w[NV], bb[NV];
        if (!prev) {
            const float *e = a.emb + (size_t)__ldg(a.tok + b) * D;
#pragma unroll
            for (int k = 0; k < NV; k++)
                if (128 * k < D) {
                    const float4 v = ld4(e + 4 * (lane + 32 * k));
                    u[k] = make_float4(v.x * a.emb_scale, v.y * a.emb_scale, v.z * a.emb_scale, v.w * a.emb_scale);
                }
        } else {
            float4 t[NV];
            uint2 rr[NV];
#pragma unroll
            for (int k = 0; k < NV; k++)
                if (128 * k < D) {
                    const int c = 4 * (lane + 32 * k);
                    u[k] = __ldcg((const float4 *)(xi + (size_t)b * D + c));
                    rr[k] = __ldcg((const uint2 *)(a.r + (size_t)b * D + c));
                    t[k] = prev->rb ? ld4(prev->rb + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    w[k] = ld4(prev->lnw + c);
                    bb[k] = ld4(prev->lnb + c);
                }
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < NV; k++)
                if (128 * k < D) {
                    const float2 r0 = __bfloat1622float2(*(const __nv_bfloat162 *)&rr[k].x),
                                 r1 = __bfloat1622float2(*(const __nv_bfloat162 *)&rr[k].y);
                    u[k].x += r0.x + t[k].x, u[k].y += r0.y + t[k].y, u[k].z += r1.x + t[k].z, u[k].w += r1.y + t[k].w;
                    s += u[k].x + u[k].y + u[k].z + u[k].w;
                }
            const float mean = warp_sum(s) / D;
            float q = 0.0f;
#pragma unroll
            for (int k = 0; k < NV; k++)
                if (128 * k < D) {
                    const float e0 = u[k].x - mean, e1 = u[k].y - mean, e2 = u[k].z - mean, e3 = u[k].w - mean;
                    q += e0 * e0 + e1 * e1 + e2 * e2 + e3 * e3;
                }
            const float inv = 1.0f / sqrtf(warp_sum(q) / D + a.eps);
#pragma unroll
            for (int k = 0; k < NV; k++)
                if (128 * k < D) {
                    u[k].x = (u[k].x - mean) * inv * w[k].x + bb[k].x;
                    u[k].y = (u[k].y - mean) * inv * w[k].y + bb[k].y;
                    u[k].z = (u[k].z - mean) * inv * w[k].z + bb[k].z;
                    u[k].w = (u[k].w - mean) * inv * w[k].w + bb[k].w;
                }
        }
#pragma unroll
        for (int k = 0; k < NV; k++)
            if (128 * k < D) {
                const int c = 4 * (lane + 32 * k);
                if (blockIdx.x == 0) *(float4 *)(xo + (size_t)b * D + c) = u[k];
                *(float4 *)(xs + b * ld + c) =
                    make_float4(__bfloat162float(__float2bfloat16(u[k].x)), __bfloat162float(__float2bfloat16(u[k].y)),
                                __bfloat162float(__float2bfloat16(u[k].z)), __bfloat162float(__float2bfloat16(u[k].w)));
            }
    }
    __syncthreads();
}

/* ------------------------------------------------------------ attention */

/* Shared memory of the attention: q (or q + u, q + v), the warps' states */
struct mk_att_sm {
    float q[2][MK_MAX_DH];
    float m[MK_WARPS], z[MK_WARPS], w[MK_WARPS];
    float o[MK_WARPS][MK_MAX_DH];
    float ev[MK_WARPS];
    float rm[MK_MAX_SPLITS], rz[MK_MAX_SPLITS], rw[MK_MAX_SPLITS];   /* the splits' records met */
    int last;
};

/* Rows of the rings and the step's own keys and values are read through L2
 * (ld.global.cg): the step's were written in this kernel, and no row is
 * read twice by one SM. */

/* A bf16 row of DH (32 or 64) dims, dot with Q (shared) */
static __device__ __forceinline__ float dot_row(const bf16 *k, const float *q, int DH)
{
    uint4 r[MK_MAX_DH / 8];
#pragma unroll
    for (int c = 0; c < MK_MAX_DH / 8; c++) r[c] = 8 * c < DH ? __ldcg((const uint4 *)k + c) : make_uint4(0, 0, 0, 0);
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < MK_MAX_DH / 8; c++) {
        if (8 * c >= DH) break;   /* (q past DH is not written: never read it) */
        float v[8];
        bf8(r[c], v);
#pragma unroll
        for (int u = 0; u < 8; u++) s = fmaf(q[8 * c + u], v[u], s);
    }
    return s;
}

/* The end of an attention item, shared by both kinds: the lane's two
 * keys' scores S0, S1 (-inf where none) and mask weights MW0, MW1 (1 for
 * relative attention), their value rows V0, V1 (read only where the weight
 * e x mw is not zero), into the warp's running softmax (M, Z = sum e, W =
 * sum e mw, O = sum e mw v: each lane weights its rows in registers, then
 * warp_transpose_sum sums them over the lanes, lane L keeping dims L + 32
 * x); the block's warps met in shared memory; then the step's key and
 * value into the rings (KD, VD: the rows they replace, which only this
 * block reads, or NULL) after the block's reads; then the (stream, head)'s
 * result (head_finish). */
static __device__ __noinline__ void att_finish(const mk_args &a, mk_att_sm *sm, float *O, float s0, float s1, float mw0,
                                               float mw1, const bf16 *v0, const bf16 *v1, bf16 *kd, bf16 *vd,
                                               const bf16 *nk, const bf16 *nv, int b, int h, int sp, int nsplit,
                                               bool renorm, bf16 *out)
{
    const int DH = a.dh, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* (no branch around the shuffles: every lane reaches each of them) */
    const float mx = warp_max(fmaxf(s0, s1));
    const float e0 = s0 == -INFINITY ? 0.0f : expf(s0 - mx), e1 = s1 == -INFINITY ? 0.0f : expf(s1 - mx);
    const float w0 = e0 * mw0, w1 = e1 * mw1;
    const float z = warp_sum(e0 + e1), wsum = warp_sum(w0 + w1);
    uint4 r0[MK_MAX_DH / 8], r1[MK_MAX_DH / 8];
#pragma unroll
    for (int c = 0; c < MK_MAX_DH / 8; c++) {
        r0[c] = w0 != 0.0f && 8 * c < DH ? __ldcg((const uint4 *)v0 + c) : make_uint4(0, 0, 0, 0);
        r1[c] = w1 != 0.0f && 8 * c < DH ? __ldcg((const uint4 *)v1 + c) : make_uint4(0, 0, 0, 0);
    }
    float acc[MK_MAX_DH];
#pragma unroll
    for (int c = 0; c < MK_MAX_DH / 8; c++) {
        float f[8], g[8];
        bf8(r0[c], f);
        bf8(r1[c], g);
#pragma unroll
        for (int u = 0; u < 8; u++) acc[8 * c + u] = fmaf(w1, g[u], w0 * f[u]);
    }
    float o0 = warp_transpose_sum(*(float(*)[32])acc, lane), o1 = warp_transpose_sum(*(float(*)[32])(acc + 32), lane);
    sm->o[warp][lane] = o0;
    sm->o[warp][lane + 32] = o1;
    if (lane == 0) sm->m[warp] = mx, sm->z[warp] = z, sm->w[warp] = wsum;
    __syncthreads();
    float M = -INFINITY;
    for (int v = 0; v < MK_WARPS; v++) M = fmaxf(M, sm->m[v]);
    float Z = 0.0f, W = 0.0f;
    for (int v = 0; v < MK_WARPS; v++) {
        const float e = sm->m[v] == -INFINITY ? 0.0f : expf(sm->m[v] - M);
        Z += sm->z[v] * e;
        W += sm->w[v] * e;
        if (threadIdx.x == v) sm->ev[v] = e;
    }
    __syncthreads();   /* (and the block's reads are done) */
    if (threadIdx.x < DH) {
        float o = 0.0f;
        for (int v = 0; v < MK_WARPS; v++) o += sm->o[v][threadIdx.x] * sm->ev[v];
        O[threadIdx.x] = o;
        if (kd) kd[threadIdx.x] = __ldcg(nk + threadIdx.x);
        if (vd) vd[threadIdx.x] = __ldcg(nv + threadIdx.x);
    }
    if (nsplit > 1) {   /* the split's record; the last split to finish meets them all */
        float *rec = a.part + (((size_t)b * a.K + h) * a.nsmax + sp) * MK_REC;
        if (threadIdx.x < DH) rec[4 + threadIdx.x] = O[threadIdx.x];
        if (threadIdx.x == 0) rec[0] = M, rec[1] = Z, rec[2] = W;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) sm->last = atomicAdd(a.cnt + b * a.K + h, 1) == nsplit - 1;
        __syncthreads();
        if (!sm->last) return;
        __threadfence();
        /* every record's (m, Z, W) at once, then the outputs' loads 8 records at a time */
        const float *r0 = a.part + ((size_t)b * a.K + h) * a.nsmax * MK_REC;
        if (threadIdx.x < nsplit) {
            const float4 v = __ldcg((const float4 *)(r0 + (size_t)threadIdx.x * MK_REC));
            sm->rm[threadIdx.x] = v.x, sm->rz[threadIdx.x] = v.y, sm->rw[threadIdx.x] = v.z;
        }
        __syncthreads();
        M = -INFINITY;
        for (int s = 0; s < nsplit; s++) M = fmaxf(M, sm->rm[s]);
        __syncthreads();
        if (threadIdx.x < nsplit) sm->rm[threadIdx.x] = sm->rm[threadIdx.x] == -INFINITY ? 0.0f : expf(sm->rm[threadIdx.x] - M);
        __syncthreads();
        Z = W = 0.0f;
        for (int s = 0; s < nsplit; s++) Z += sm->rz[s] * sm->rm[s], W += sm->rw[s] * sm->rm[s];
        if (threadIdx.x < DH) {
            float o = 0.0f;
#pragma unroll 8
            for (int s = 0; s < nsplit; s++) o += __ldcg(r0 + (size_t)s * MK_REC + 4 + threadIdx.x) * sm->rm[s];
            O[threadIdx.x] = o;
        }
        if (threadIdx.x == 0) a.cnt[b * a.K + h] = 0;
    }
    if (threadIdx.x < DH) {
        const float v = renorm ? O[threadIdx.x] / Z / (W / Z + 1e-8f) : O[threadIdx.x] / Z;
        out[threadIdx.x] = __float2bfloat16(v);
    }
}

/* Adaptive-span: one (stream, head, split) item; as aspan_decode.cu:
 * distances d = 1..kw of the head's key rows (the lane's: two of the
 * warp's 64), their position rows (key_pe of distance d), the mask m(d)
 * up to the reach r, q.(k + pe) / sqrt(DH); the new key into the slot of
 * distance kw, the new value into that of distance r. */
static __device__ __noinline__ void att_aspan(const mk_args &a, const mk_sub *u, mk_att_sm *sm, float *O, int b, int h,
                                              int sp)
{
    const int DH = a.dh, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, A = a.A;
    const int kw = __ldg(u->krows + h), r = __ldg(u->reach + h);
    const int nsplit = kw > 0 ? (kw + MK_SPLIT - 1) / MK_SPLIT : 1;
    const int dlo = 1 + sp * MK_SPLIT, dhi = min(kw, dlo + MK_SPLIT - 1);
    const int64_t t = __ldg(a.pos + b);
    const int kslot = kw > 0 ? ring_slot(t, kw) : 0, vslot = r > 0 ? ring_slot(t, r) : 0;
    bf16 *const kr = a.ring[b] + __ldg(u->off + h), *const vr = kr + (size_t)kw * DH;
    const bf16 *qv = a.qkv + (size_t)b * 3 * A + (size_t)h * DH, *nk = qv + A, *nv = qv + 2 * A;
    bf16 *out = a.att + (size_t)b * A + (size_t)h * DH;
    bf16 *kd = dlo <= kw && kw <= dhi ? kr + (size_t)kslot * DH : NULL;
    bf16 *vd = r > 0 && dlo <= r && r <= dhi ? vr + (size_t)vslot * DH : NULL;
    if (r == 0) {   /* a zero mask: zeros; the key is still the window's */
        if (threadIdx.x < DH) {
            if (sp == 0) out[threadIdx.x] = __float2bfloat16(0.0f);
            if (kd) kd[threadIdx.x] = __ldcg(nk + threadIdx.x);
        }
        return;
    }
    if (threadIdx.x < DH) sm->q[0][threadIdx.x] = __bfloat162float(__ldcg(qv + threadIdx.x));
    __syncthreads();
    const float *q = sm->q[0], *mask = a.derived + __ldg(u->mask_off + h);
    const float scale = sqrtf((float)DH);
    const int da = dlo + 64 * warp + lane, db = da + 32;
    const bool oka = da <= dhi, okb = db <= dhi;
    /* the lane's two key rows and their position rows (key_pe by distance in bf16, attn_mma.cu's table),
     * every load in flight at once: s = q . (k + pe) / sqrt(DH) */
    const int ka = kslot - da < 0 ? kslot - da + kw : kslot - da, kb = kslot - db < 0 ? kslot - db + kw : kslot - db;
    const bf16 *k0 = kr + (size_t)ka * DH, *k1 = kr + (size_t)kb * DH, *p0 = a.pe_h + (size_t)da * DH,
               *p1 = a.pe_h + (size_t)db * DH;
    uint4 rk0[MK_MAX_DH / 8], rp0[MK_MAX_DH / 8], rk1[MK_MAX_DH / 8], rp1[MK_MAX_DH / 8];
    const uint4 z4 = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int c = 0; c < MK_MAX_DH / 8; c++) {
        const bool in = 8 * c < DH;
        rk0[c] = oka && in ? __ldcg((const uint4 *)k0 + c) : z4;
        rp0[c] = oka && in ? __ldg((const uint4 *)p0 + c) : z4;
        rk1[c] = okb && in ? __ldcg((const uint4 *)k1 + c) : z4;
        rp1[c] = okb && in ? __ldg((const uint4 *)p1 + c) : z4;
    }
    const float m0 = oka && da <= r ? __ldg(mask + da - 1) : 0.0f, m1 = okb && db <= r ? __ldg(mask + db - 1) : 0.0f;
    float t0 = 0.0f, t1 = 0.0f;
#pragma unroll
    for (int c = 0; c < MK_MAX_DH / 8; c++) {
        if (8 * c >= DH) break;   /* (q past DH is not written: never read it) */
        float kf[8], pf[8], kg[8], pg[8];
        bf8(rk0[c], kf), bf8(rp0[c], pf), bf8(rk1[c], kg), bf8(rp1[c], pg);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            t0 = fmaf(q[8 * c + u], kf[u] + pf[u], t0);
            t1 = fmaf(q[8 * c + u], kg[u] + pg[u], t1);
        }
    }
    const float s0 = oka ? t0 / scale : -INFINITY, s1 = okb ? t1 / scale : -INFINITY;
    const int va = vslot - da < 0 ? vslot - da + r : vslot - da, vb = vslot - db < 0 ? vslot - db + r : vslot - db;
    att_finish(a, sm, O, s0, s1, m0, m1, vr + (size_t)va * DH, vr + (size_t)vb * DH, kd, vd, nk, nv, b, h, sp, nsplit,
               true, out);
}

/* Relative attention: one (stream, head, split) item, keys j = jlo..mlen
 * (the memory, then the step's own) of the split's MK_SPLIT, ((q + u).k_j
 * + (q + v).r_{mlen-j}) scale; as rel_attn.cu. The step's key and value go
 * to slot p % ML, which memory row 0 holds when the memory is full (then
 * split 0 writes it after its reads), else no key of the step (then the
 * split of the step's own key). */
static __device__ __noinline__ void att_rel(const mk_args &a, const mk_sub *u, mk_att_sm *sm, float *O, int b, int h, int sp)
{
    const int DH = a.dh, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, A = a.A, ML = a.ML;
    const int mlen = __ldg(a.len + (size_t)b * a.nl + u->layer), L = mlen + 1;
    const int mask_len = mlen + 1 - ML, shift = mask_len > 0 ? 1 - mask_len : 1;
    const int jlo = a.same_len && 1 - shift > 0 ? 1 - shift : 0;
    const int64_t p = __ldg(a.pos + b);
    const int mslot = ML > 0 ? (int)((p - mlen) % ML) : 0;
    bf16 *const kr = a.ring[b] + u->roff + (size_t)h * DH, *const vr = kr + (size_t)ML * A;
    const bf16 *qv = a.qkv + (size_t)b * 3 * A + (size_t)h * DH, *nk = qv + A, *nv = qv + 2 * A;
    if (threadIdx.x < DH) {
        const float qq = __bfloat162float(__ldcg(qv + threadIdx.x));
        sm->q[0][threadIdx.x] = qq + __ldg(u->rwb + h * DH + threadIdx.x);
        sm->q[1][threadIdx.x] = qq + __ldg(u->rrb + h * DH + threadIdx.x);
    }
    __syncthreads();
    const float *qu = sm->q[0], *qr = sm->q[1];
    const int nsplit = (ML + MK_SPLIT) / MK_SPLIT;   /* ((ML + 1) keys at most) */
    float s[2];
    const bf16 *vrow[2];
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const int j = sp * MK_SPLIT + 64 * warp + 32 * x + lane;
        const int sl = mslot + j >= ML ? mslot + j - ML : mslot + j;
        vrow[x] = j < mlen ? vr + (size_t)sl * A : nv;
        s[x] = -INFINITY;
        if (j < L && j >= jlo) {
            const float ac = dot_row(j < mlen ? kr + (size_t)sl * A : nk, qu, DH);
            const float4 *rr = (const float4 *)(u->rk + (size_t)(mlen - j) * A + (size_t)h * DH);
            float bd = 0.0f;
#pragma unroll 4
            for (int c = 0; c < DH / 4; c++) {
                const float4 v = __ldg(rr + c);
                bd = fmaf(qr[4 * c], v.x, bd), bd = fmaf(qr[4 * c + 1], v.y, bd);
                bd = fmaf(qr[4 * c + 2], v.z, bd), bd = fmaf(qr[4 * c + 3], v.w, bd);
            }
            s[x] = (ac + bd) * a.rel_scale;
        }
    }
    const int ws = ML > 0 ? (int)(p % ML) : 0;
    const bool wr = ML > 0 && sp == (mlen == ML ? 0 : mlen / MK_SPLIT);
    att_finish(a, sm, O, s[0], s[1], 1.0f, 1.0f, vrow[0], vrow[1], wr ? kr + (size_t)ws * A : NULL,
               wr ? vr + (size_t)ws * A : NULL, nk, nv, b, h, sp, nsplit, false, a.att + (size_t)b * A + (size_t)h * DH);
}

/* What the block's items of sublayer U's attention will read from earlier
 * steps (ring rows, key_pe rows, masks, r rows) into L2, while the
 * barrier before the attention waits */
static __device__ __noinline__ void att_prefetch(const mk_args &a, const mk_sub *u)
{
    const int DH = a.dh;
    for (int it = blockIdx.x; it < a.B * u->nitems; it += gridDim.x) {
        const int b = it / u->nitems, code = __ldg(u->items + it % u->nitems), h = code >> 16, sp = code & 0xffff;
        const int64_t p = __ldg(a.pos + b);
        if (u->kind == MK_ASPAN) {
            const int kw = __ldg(u->krows + h), r = __ldg(u->reach + h);
            const int dlo = 1 + sp * MK_SPLIT, dhi = min(kw, dlo + MK_SPLIT - 1);
            if (r == 0 || dlo > dhi) continue;
            const int kslot = ring_slot(p, kw), vslot = ring_slot(p, r);
            const bf16 *kr = a.ring[b] + __ldg(u->off + h), *vr = kr + (size_t)kw * DH;
            for (int d = dlo + threadIdx.x; d <= dhi; d += blockDim.x) {
                const int sk = kslot - d < 0 ? kslot - d + kw : kslot - d;
                prefetch_bytes1(kr + (size_t)sk * DH, DH * sizeof(bf16));
                if (d <= r) {
                    const int sv = vslot - d < 0 ? vslot - d + r : vslot - d;
                    prefetch_bytes1(vr + (size_t)sv * DH, DH * sizeof(bf16));
                }
            }
            prefetch_bytes(a.pe_h + (size_t)dlo * DH, (size_t)(dhi - dlo + 1) * DH * sizeof(bf16));
            prefetch_bytes(a.derived + __ldg(u->mask_off + h) + dlo - 1, (size_t)(min(dhi, r) - dlo + 1) * sizeof(float));
        } else {
            const int ML = a.ML, mlen = __ldg(a.len + (size_t)b * a.nl + u->layer), A = a.A;
            const int mslot = ML > 0 ? (int)((p - mlen) % ML) : 0;
            const bf16 *kr = a.ring[b] + u->roff + (size_t)h * DH, *vr = kr + (size_t)ML * A;
            for (int j = sp * MK_SPLIT + threadIdx.x; j <= mlen && j < (sp + 1) * MK_SPLIT; j += blockDim.x) {
                if (j < mlen) {
                    const int sl = mslot + j >= ML ? mslot + j - ML : mslot + j;
                    prefetch_bytes1(kr + (size_t)sl * A, DH * sizeof(bf16));
                    prefetch_bytes1(vr + (size_t)sl * A, DH * sizeof(bf16));
                }
                prefetch_bytes1(u->rk + (size_t)(mlen - j) * A + (size_t)h * DH, DH * sizeof(float));
            }
        }
    }
}

/* The attention phase of sublayer U: its blocks over the grid */
static __device__ void att_phase(const mk_args &a, const mk_sub *u, mk_att_sm *sm, float *O)
{
    for (int it = blockIdx.x; it < a.B * u->nitems; it += gridDim.x) {
        const int b = it / u->nitems, code = __ldg(u->items + it % u->nitems);
        if (u->kind == MK_ASPAN) att_aspan(a, u, sm, O, b, code >> 16, code & 0xffff);
        else att_rel(a, u, sm, O, b, code >> 16, code & 0xffff);
        __syncthreads();
    }
}

/* ------------------------------------------------------------ the step */

__global__ static void __launch_bounds__(MK_THREADS, 1) mk_kernel(const __grid_constant__ mk_args a)
{
    extern __shared__ float4 smraw[];
    float *xs = (float *)smraw;
    __shared__ mk_att_sm asm_;
    __shared__ float O[MK_MAX_DH];
    __shared__ double dred[32];
    __shared__ float fred[32];
    const int ld = MK_MAX_IN, B = a.B, D = a.D, A = a.A, I = a.I;
    const float *xi = a.X0;
    float *xo = a.X1;
    const mk_sub *prev = NULL;
    int ph = 0;   /* barriers passed */
    if (a.trace && blockIdx.x == 0 && threadIdx.x == 0) a.trace[gridDim.x] = globaltimer();
    for (int s = 0; s < a.nsub; s++) {
        const mk_sub *u = &a.subs[s];
        mk_input(a, prev, xi, xo, xs, ld);
        { float *t = (float *)xi; xi = xo; xo = t; }
        if (u->kind == MK_FFN) {
            gemv(EPI_BIAS_RELU, u->w1, I, D, xs, ld, B, a.ff, NULL, u->b1);
            prefetch_rows(u->w2, D, I);
            ph = grid_sync(a, ph);
            load_rows(xs, ld, a.ff, I, B);
            __syncthreads();
            gemv(EPI_BF16, u->w2, D, I, xs, ld, B, a.r, NULL, NULL);
        } else {
            gemv(EPI_BF16, u->w1, 3 * A, D, xs, ld, B, a.qkv, NULL, NULL);
            att_prefetch(a, u);
            ph = grid_sync(a, ph);
            att_phase(a, u, &asm_, O);
            prefetch_rows(u->w2, D, A);
            ph = grid_sync(a, ph);
            load_rows(xs, ld, a.att, A, B);
            __syncthreads();
            gemv(EPI_BF16, u->w2, D, A, xs, ld, B, a.r, NULL, NULL);
        }
        /* the next linear layer's rows and this sublayer's LayerNorm into L2 while the barrier waits */
        if (s + 1 < a.nsub) prefetch_rows(a.subs[s + 1].w1, a.subs[s + 1].kind == MK_FFN ? I : 3 * A, D);
        else prefetch_rows(a.out_h, a.V, D);
        prefetch_bytes(u->lnw, D * sizeof(float));
        prefetch_bytes(u->lnb, D * sizeof(float));
        if (u->rb) prefetch_bytes(u->rb, D * sizeof(float));
        ph = grid_sync(a, ph);
        prev = &a.subs[s];
    }
    mk_input(a, prev, xi, xo, xs, ld);
    gemv(EPI_FLOAT, a.out_h, a.V, D, xs, ld, B, NULL, a.logits, NULL);
    ph = grid_sync(a, ph);
    /* log_softmax(y + b), a block a row, as logsoftmax.cu */
    for (int b = blockIdx.x; b < B; b += gridDim.x) {
        float *row = a.logits + (size_t)b * a.V;
        float mx = -INFINITY;
        for (int j = threadIdx.x; j < a.V; j += blockDim.x) {
            const float v = __ldcg(row + j) + (a.out_b ? __ldg(a.out_b + j) : 0.0f);
            row[j] = v;
            mx = fmaxf(mx, v);
        }
        mx = block_max(mx, fred);
        double sum = 0;
        for (int j = threadIdx.x; j < a.V; j += blockDim.x) sum += (double)expf(row[j] - mx);
        const double lse = mx + log(block_sum(sum, dred));
        for (int j = threadIdx.x; j < a.V; j += blockDim.x) row[j] = (float)((double)row[j] - lse);
    }
}

/* ------------------------------------------------------------ the plan */

void gpu_mk_free(gpu_mk *k)
{
    if (!k) return;
    cudaFree(k->d_subs);
    cudaFree(k->d_items);
    cudaFree(k->d_part);
    cudaFree(k->d_trace);
    free(k);
}

/* Why the model's decode steps cannot take the kernel ("" when they can) */
static void mk_why(const gpu_model *g, char *why, size_t cap)
{
    const model_t *m = g->m;
    const int D = m->d_model, A = m->n_head * m->d_head, I = m->d_inner;
    why[0] = 0;
    if (g->prec != GPU_BF16) snprintf(why, cap, "fp32 keeps its exact launches");
    else if (g->fam != &gpu_family_aspan && g->fam != &gpu_family_rel) snprintf(why, cap, "a family it does not cover");
    else if (m->pers) snprintf(why, cap, "persistent memory");
    else if (m->tf_attn) snprintf(why, cap, "the TensorFlow PAR's attention");
    else if (g->ada || !g->emb || !g->out_h) snprintf(why, cap, "an adaptive input or softmax");
    else if (m->pre_lnorm) snprintf(why, cap, "pre-LN");
    else if (m->d_head != 32 && m->d_head != 64)
        snprintf(why, cap, "heads of %d dims (it takes 32 or 64)", m->d_head);
    else if (D % 128 || A % 8 || I % 8 || D > MK_MAX_D || A > MK_MAX_IN || I > MK_MAX_IN)
        snprintf(why, cap, "widths %d, %d, %d (it takes a model of a multiple of 128 up to %d, heads and inner layer "
                 "of a multiple of 8 up to %d)", D, A, I, MK_MAX_D, MK_MAX_IN);
    else if (g->fam == &gpu_family_aspan && !g->pe_h) snprintf(why, cap, "no bf16 key_pe table");
    else if (g->fam == &gpu_family_rel && m->mem_len + 1 > MK_SPLIT * MK_MAX_SPLITS)
        snprintf(why, cap, "a memory of %d rows (it takes up to %d)", m->mem_len, MK_SPLIT * MK_MAX_SPLITS - 1);
}

/* The attention's splits of head H of layer L: MK_SPLIT keys each (at
 * least one) over its key rows (adaptive-span) or mem_len + 1 keys (PAR) */
static int head_splits(const model_t *m, bool rel, int l, int h)
{
    const int kw = rel ? m->mem_len + 1 : m->layers[l].krows[h];
    return kw > 0 ? (kw + MK_SPLIT - 1) / MK_SPLIT : 1;
}

/* A sublayer's kind, layer, weights (its two linear layers', fc1's bias,
 * the residual's bias) and the LayerNorm after it */
static void sub_init(mk_sub *u, int kind, int l, const bf16 *w1, const bf16 *w2, const float *b1, const float *rb,
                     const float *lnw, const float *lnb)
{
    u->kind = kind;
    u->layer = l;
    u->w1 = w1;
    u->w2 = w2;
    u->b1 = b1;
    u->rb = rb;
    u->lnw = lnw;
    u->lnb = lnb;
}

int gpu_mk_plan(gpu_model *g, char *why, size_t cap, char *err)
{
    const model_t *m = g->m;
    mk_why(g, why, cap);
    if (why[0]) return 0;
    const int K = m->n_head, nl = m->n_layers;
    const bool rel = g->fam == &gpu_family_rel;
    /* the sublayers and the attention's blocks */
    mk_sub *subs = (mk_sub *)calloc((size_t)2 * nl, sizeof *subs);
    int nsub = 0, nit = 0, nsmax = 1;
    for (int l = 0; l < nl && subs; l++) {
        const int sub = g->fam->sublayers(m, l);
        if (sub & GPU_SUB_ATTN) {
            for (int h = 0; h < K; h++) {
                const int ns = head_splits(m, rel, l, h);
                nit += ns;
                if (ns > nsmax) nsmax = ns;
            }
            nsub++;
        }
        if (sub & GPU_SUB_FFN) nsub++;
    }
    if (subs && nsmax > MK_MAX_SPLITS) {
        free(subs);
        snprintf(why, cap, "windows of %d keys (it takes up to %d)", nsmax * MK_SPLIT, MK_MAX_SPLITS * MK_SPLIT);
        return 0;
    }
    if (subs && 3 * nsub + 1 > MK_MAX_BARRIERS) {
        free(subs);
        snprintf(why, cap, "%d sublayers (it takes up to %d)", nsub, (MK_MAX_BARRIERS - 1) / 3);
        return 0;
    }
    int *items = (int *)malloc((size_t)(nit ? nit : 1) * sizeof *items);
    if (!subs || !items) {
        free(subs);
        free(items);
        return err_set(err, "out of memory");
    }
    gpu_mk *k = (gpu_mk *)calloc(1, sizeof *k);
    int rc = k ? 0 : err_set(err, "out of memory");
    size_t nrec = (size_t)MK_MAX_B * K * nsmax * MK_REC, ncnt = (size_t)MK_MAX_B * K;
    if (rc == 0 && (cudaMalloc(&k->d_subs, (size_t)nsub * sizeof *subs) != cudaSuccess ||
                    cudaMalloc(&k->d_items, (size_t)(nit ? nit : 1) * sizeof *items) != cudaSuccess ||
                    cudaMalloc(&k->d_part, (nrec + ncnt + 4) * sizeof(float)) != cudaSuccess ||
                    cudaMemset(k->d_part, 0, (nrec + ncnt + 4) * sizeof(float)) != cudaSuccess))
        rc = err_set(err, "out of device memory for the decode kernel's plan");
    int s = 0, it = 0;
    for (int l = 0; rc == 0 && l < nl; l++) {
        const int sub = g->fam->sublayers(m, l);
        const gpu_layer *d = &g->L[l];
        if (sub & GPU_SUB_ATTN) {
            k->kind[k->nbar++] = 'Q', k->kind[k->nbar++] = 'A', k->kind[k->nbar++] = 'W';
            mk_sub *u = &subs[s++];
            sub_init(u, rel ? MK_REL : MK_ASPAN, l, d->wqkv_h, d->wo_h, NULL, d->wo_b, d->ln1_w, d->ln1_b);
            if (rel) {
                u->rk = d->rk;
                u->rwb = d->rwb;
                u->rrb = d->rrb;
                u->roff = (int64_t)g->h_off[l];
            } else {
                u->krows = g->krows + (size_t)l * K;
                u->reach = g->reach + (size_t)l * K;
                u->mask_off = g->mask_off + (size_t)l * K;
                u->off = g->d_off + (size_t)l * K;
            }
            u->items = k->d_items + it;
            for (int h = 0; h < K; h++) {
                const int ns = head_splits(m, rel, l, h);
                for (int sp = 0; sp < ns; sp++) items[it++] = h << 16 | sp;
                u->nitems += ns;
            }
            if (!u->w1 || !u->w2) rc = err_set(err, "layer %d: no bf16 weights for the decode kernel", l);
        }
        if (sub & GPU_SUB_FFN) {
            k->kind[k->nbar++] = '1', k->kind[k->nbar++] = '2';
            mk_sub *u = &subs[s++];
            sub_init(u, MK_FFN, l, d->fc1_h, d->fc2_h, d->fc1_b, d->fc2_b, d->ln2_w, d->ln2_b);
            if (!u->w1 || !u->w2) rc = err_set(err, "layer %d: no bf16 weights for the decode kernel", l);
        }
    }
    if (rc == 0) k->kind[k->nbar++] = 'O';
    if (rc == 0 && (cudaMemcpy(k->d_subs, subs, (size_t)nsub * sizeof *subs, cudaMemcpyHostToDevice) != cudaSuccess ||
                    cudaMemcpy(k->d_items, items, (size_t)(nit ? nit : 1) * sizeof *items, cudaMemcpyHostToDevice) !=
                        cudaSuccess))
        rc = err_set(err, "uploading the decode kernel's plan failed");
    free(subs);
    free(items);
    if (rc == 0) {
        mk_args *a = &k->a;
        a->subs = k->d_subs;
        a->nsub = nsub;
        a->D = m->d_model;
        a->A = K * m->d_head;
        a->I = m->d_inner;
        a->K = K;
        a->dh = m->d_head;
        a->V = m->V;
        a->ML = m->mem_len;
        a->nl = nl;
        a->same_len = m->same_length;
        a->nsmax = nsmax;
        a->emb_scale = g->fam->embed_scale(m);
        a->eps = (float)m->ln_eps;
        a->rel_scale = gpu_rel_scale(m);
        a->emb = g->emb;
        a->out_b = g->out_b;
        a->derived = g->derived;
        a->out_h = g->out_h;
        a->pe_h = g->pe_h;
        a->X0 = g->x;
        a->X1 = g->tmp;
        a->qkv = g->qkvb;
        a->att = g->attb;
        a->r = g->tmpb;
        a->ff = g->ffb;
        a->logits = g->logits;
        a->part = k->d_part;
        a->cnt = (int *)(k->d_part + nrec);
        a->bar = (unsigned long long *)(k->d_part + nrec + ncnt);   /* (nrec and ncnt are even: 8-byte aligned) */
        a->tok = stage_tok(g, g->d_stage);
        a->pos = stage_pos(g, g->d_stage);
        a->ring = (bf16 *const *)stage_ring(g, g->d_stage);
        a->len = stage_len(g, g->d_stage);
        k->smem = (size_t)MK_MAX_B * MK_MAX_IN * sizeof(float);
        int per_sm = 0;
        if (cudaFuncSetAttribute(mk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k->smem) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mk_kernel, MK_THREADS, k->smem) != cudaSuccess) {
            cudaGetLastError();
            snprintf(why, cap, "the kernel cannot be set up on this device");
        } else if (per_sm < 1)
            snprintf(why, cap, "no block of the kernel fits an SM");
        k->grid = g->n_sm;
    }
    if (rc || why[0]) {
        gpu_mk_free(k);
        return rc;
    }
    g->mk = k;
    return 0;
}

int gpu_mk_step(gpu_model *g, int B, char *err)
{
    gpu_mk *k = g->mk;
    k->a.B = B;
    k->a.bar_base = k->steps * (unsigned long long)k->nbar * (unsigned long long)k->grid;
    void *args[] = {&k->a};
    cudaError_t e = cudaLaunchCooperativeKernel((const void *)mk_kernel, dim3((unsigned)k->grid), dim3(MK_THREADS), args,
                                                k->smem, g->stream);
    if (e != cudaSuccess) {
        /* the barrier's count starts again from 0 (a launch that failed passed none of it, or the context is lost) */
        cudaGetLastError();
        k->steps = 0;
        cudaMemsetAsync(k->a.bar, 0, sizeof *k->a.bar, g->stream);
        return err_set(err, "launching the decode kernel: %s", cudaGetErrorString(e));
    }
    k->steps++;
    return 0;
}

int gpu_decode_trace(gpu_model *g, int on, char *err)
{
    gpu_mk *k = g->mk;
    if (!k) return err_set(err, "no decode kernel: %s", g->mk_why);
    if (on && !k->d_trace)
        CU_TRY(cudaMalloc(&k->d_trace, (size_t)(k->nbar + 1) * (k->grid + 1) * sizeof *k->d_trace), err,
               "cudaMalloc (decode trace)");
    k->a.trace = on ? k->d_trace : NULL;
    return 0;
}

int gpu_decode_trace_report(gpu_model *g, char *out, size_t cap, char *err)
{
    gpu_mk *k = g->mk;
    if (!k || !k->d_trace) return err_set(err, "no decode trace was taken");
    const size_t G = (size_t)k->grid, n = (size_t)(k->nbar + 1) * (G + 1);
    unsigned long long *t = (unsigned long long *)malloc(n * sizeof *t);
    if (!t) return err_set(err, "out of memory");
    if (cudaStreamSynchronize(g->stream) != cudaSuccess ||
        cudaMemcpy(t, k->d_trace, n * sizeof *t, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(t);
        return err_set(err, "copying the decode trace failed");
    }
    /* per kind of phase: the slowest block's work (its arrival less block 0's leaving of the barrier before),
     * and the barrier (block 0's leaving less the last arrival) */
    const char *kinds = "QAW12O", *names[] = {"qkv", "attention", "wo", "fc1", "fc2", "output"};
    double work[6] = {0}, wait[6] = {0};
    int cnt[6] = {0};
    for (int p = 0; p < k->nbar; p++) {
        const unsigned long long *row = t + (size_t)(p + 1) * (G + 1), start = t[(size_t)p * (G + 1) + G];
        unsigned long long last = 0;
        for (size_t b = 0; b < G; b++)
            if (row[b] > last) last = row[b];
        const int i = (int)(strchr(kinds, k->kind[p]) - kinds);
        work[i] += (double)(last - start) / 1e3;
        wait[i] += (double)(row[G] - last) / 1e3;
        cnt[i]++;
    }
    const double total = (double)(t[(size_t)k->nbar * (G + 1) + G] - t[G]) / 1e3;
    int w = snprintf(out, cap, "%.1f us to the last barrier:", total);
    for (int i = 0; i < 6 && w >= 0 && (size_t)w < cap; i++)
        if (cnt[i])
            w += snprintf(out + w, cap - (size_t)w, " %s %d x (work %.1f us, barrier %.1f us);", names[i], cnt[i],
                          work[i], wait[i]);
    /* each attention's work, in order */
    for (int p = 0; p < k->nbar && w >= 0 && (size_t)w < cap; p++)
        if (k->kind[p] == 'A') {
            const unsigned long long *row = t + (size_t)(p + 1) * (G + 1), start = t[(size_t)p * (G + 1) + G];
            unsigned long long last = 0;
            for (size_t b = 0; b < G; b++)
                if (row[b] > last) last = row[b];
            w += snprintf(out + w, cap - (size_t)w, " %.1f", (double)(last - start) / 1e3);
        }
    free(t);
    return 0;
}

int gpu_mk_takes(const gpu_model *g, int B, int M) { return g->mk && g->mk_on && M == 1 && B >= 1 && B <= MK_MAX_B; }
