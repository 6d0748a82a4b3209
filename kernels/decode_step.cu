/*
 * decode_step.cu - a decode step (one token for each of up to
 * MK_MAX_B streams) as one persistent kernel: a block on every SM for the
 * whole step, layer after layer, with a barrier across the grid where
 * kernel boundaries were (issue 17). GPU_BF16 only (fp32 keeps its exact
 * launches): adaptive-span (span or exact memory, no persistent memory) and
 * PAR and the word-level Transformer-XL (relative attention), post-LN, heads
 * of 32 or 64 dims, a model of a multiple of 128 up to 512; an output layer
 * with its log-softmax, or an adaptive input and softmax (ADA: adaptive.cu's
 * launches around the kernel, gpu_ada_embed into X0 before it and, from the
 * x and bf16(x) its last phase leaves, gpu_ada_logprobs after it:
 * forward.cu). Everything else, and a step of more streams, takes
 * forward.cu's graphs (gpu_decode_kernel_status says why), and so, by
 * default (GPU_DECODE_AUTO), do steps of more streams than gpu_mk_limit
 * (MK_AUTO_ROUNDS). README "Decode as one kernel" has the figures and the
 * profile.
 *
 * A step is a list of sublayers (mk_sub: attention or feed-forward, in the
 * model's order; PAR's skip blocks are none), then the output layer. Each
 * sublayer's phases, a grid barrier after each:
 *
 *   attention:    QKV  the input (below) x [Wq;Wk;Wv]^T into qkv (bf16)
 *                 ATT  each (stream, head, split of up to MK_SPLIT keys)
 *                      a block, 32 keys a warp, a key's rows read by DH / 8
 *                      lanes (16 bytes each): scores, softmax and values,
 *                      the block's warps met in shared memory, splits met
 *                      by the last block to finish (a counter per stream
 *                      and head, an acquiring and releasing add, reset by
 *                      that block; every record loaded in one round); the
 *                      new key and value into the rings by the block that
 *                      read the rows they replace, after its reads; att
 *                      (bf16)
 *                 WO   att Wo^T into r (bf16); or (WO1: a step of 1 or 2
 *                      streams, gpu_decode_wo) in ATT's phase: each block
 *                      a piece of Wo (a head's columns, 32 or 64 rows),
 *                      waiting on its head's flag (set by the item that
 *                      finishes the head), its sums added in fixed point
 *                      as FFN's (wo_piece)
 *   feed-forward: FC1  the input x fc1^T, its bias and ReLU, into ff (bf16)
 *                 FC2  ff fc2^T into r (bf16)
 *             or  FFN  (a step of up to gpu_decode_ffn's streams, 8 by
 *                      default, where the shapes allow it) one phase: a
 *                      block's 16 rows of fc1, then those 16 columns of
 *                      fc2 times them, the blocks' partial sums added in
 *                      fixed point (64-bit integers: the same bits in any
 *                      order) into one of three buffers, which the next
 *                      phase's input reads (ffn_fused)
 *   output:       OUT  the input x Wout^T into the logits (float)
 *                 LSM  a block a row: log_softmax(logits + b) in place
 *             or  (ADA) block 0 alone: the input into X0, bf16 into xb, and
 *                      the kernel ends (no barrier)
 *
 * The input of QKV, FC1 and OUT: the embedding (the first sublayer; ADA's
 * adaptive input from X0), else
 * the residual's LayerNorm of the sublayer before, x = LN(x + r + rb),
 * which every block computes for itself (a warp a row, sums in float, as
 * layernorm.cu's warp kernel), rounded to bf16 in shared memory; block 0
 * writes x (float) to the other of two buffers, so no block reads what
 * another writes in a phase. Rounding points are those of forward.cu's
 * bf16 step (qkv, att, r, ff in bf16; the residual stream, LayerNorm and
 * the softmaxes in float); adaptive-span's position rows are bf16
 * (attn_mma.cu's key_pe table by distance), where the graphs' decode
 * kernel reads key_pe in float; relative attention's position term is
 * (q + u).k + q.r + v.r with r in fp16 and v.r in float (attn_mma.cu's
 * tables, as the tensor-core scoring has it), where the graphs' decode
 * kernel reads r in float.
 *
 * Latency, not bandwidth, bounds a step of a few streams, so nothing a
 * phase needs waits for a load that could have been issued earlier:
 *  - The linear layers (mk_lin, in the order the step runs them): a warp a
 *    weight row (two rows' loads at once; bf16, 16-byte loads), the B
 *    inputs from shared memory (two streams at a time), float sums; inputs
 *    of 256, 512 and 1,024 in straight code, with no test a 16-byte piece,
 *    and fc2's 2,048 for one stream too (gemv_first8): ncu showed branch and
 *    instruction-fetch stalls where each piece was tested. Each block's rows of the first
 *    pass (two a warp) are copied into shared memory (cp.async, each thread
 *    the 16-byte pieces it will read itself) two linear layers ahead, into
 *    one of two buffers, marked L2's first to evict (a step reads each
 *    weight once, more of them than L2 holds: so they no longer push out
 *    the rings and the activations); rows past the first pass are asked
 *    into L2.
 *  - The sublayers and the linear layers' list are copied into shared
 *    memory when the step starts: no pointer is fetched from global memory
 *    on the way to the data.
 *  - An attention item's constants (head, split, key rows, reach, ring and
 *    mask offsets) are one 32-byte record (the block's first item's of
 *    every attention, with its stream's position and ring, copied into
 *    shared memory when the step starts: geo_cache); its warps' key, position and
 *    value rows are loaded with the query, all in flight at once (rows
 *    written in this kernel through L2: ld.global.cg), a warp's load taking
 *    32 / (DH / 8) rows: where a lane read a row whole, a warp's load took
 *    32 cache lines, and the SM's L1 passed them one a cycle (about 3 us
 *    for an item of 256 keys). What the attention reads from earlier steps
 *    is asked into L2 a sublayer ahead.
 *  - The barriers: a releasing add and one acquiring load (grid_arrive,
 *    grid_wait); no sequentially consistent fence (__threadfence) in a
 *    step. The copies of later layers' weights are issued between a
 *    block's arrival and its wait, in the barrier's shadow.
 *  - No register spills (-Xptxas -v): the functions are not inlined, and a
 *    callee near 255 registers makes the kernel's body spill around its
 *    calls (PAR's float r rows did: hence the fp16 table).
 *  - gpu_decode_trace times each block's phases (its start, the end of its
 *    input, the end of its work, its arrival) for the report.
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

#include <stdlib.h>
#include <string.h>

#define MK_THREADS 256
#define MK_WARPS (MK_THREADS / 32)
#define MK_MAX_B 8               /* streams a step */
#define MK_MAX_IN 2048           /* the widest input of a linear layer: 8 loads of 16 bytes a lane */
#define MK_NCH (MK_MAX_IN / 256) /* those loads */
#define MK_MAX_D 512             /* the widest residual stream: 4 float4s a lane */
#define MK_MAX_DH 64             /* head dims: 32 or 64 */
#define MK_SPLIT MK_THREADS      /* keys a block of the attention takes: one a thread */
#define MK_MAX_SPLITS 64         /* splits of a head's keys at most */
#define MK_REC (MK_MAX_DH + 4)   /* a split's partial state: m, Z, W, (pad), O */
#define MK_MAX_SUBS 128          /* sublayers a step */
#define MK_FUSE_MAX_B MK_MAX_B   /* the most streams a step whose feed-forwards take one phase each may have (FFN) */
#define MK_FUSE_DEFAULT_B MK_MAX_B   /* and by default (gpu_decode_ffn) */
#define MK_RED_MAX_B 2           /* FFN: steps of up to this many streams add fc2's sums with a red a number, more with
                                  * one bulk reduction a block (H200: at 1 and 2 streams the reds were 1-4% faster a
                                  * step; at 4 and 8 the bulk reduction's step beat two phases by 3-10%) */
#define MK_WO_MAX_B 2            /* WO1: steps of up to this many streams take their attentions' Wo into the attention's
                                  * phase (H200: 1 session +2 to +5%, 2 sessions +1 to +2%; 4 sessions -2 to +2%, 8
                                  * sessions -5% on aspan-enwik8: a block's items then take rounds before its piece) */
#define MK_ACC_LEN(D) ((size_t)MK_FUSE_MAX_B * (D))   /* FFN: the numbers of one of its three buffers of sums */
#define MK_FUSE_ROWS 16          /* FFN: fc1 rows a block (two a warp), fc2's columns of them */
#define MK_FIX 0x1p30f           /* FFN: fc2's partial sums in fixed point, units of 2^-30 (sums up to 2^33) */
#define MK_LL_EPOCHS (1u << 25)  /* LL: a tag is a step's epoch (1 .. this - 1) x 128 + its sublayer (< MK_MAX_SUBS) */
#define MK_ADA_AUTO_B 1          /* GPU_DECODE_AUTO, an adaptive softmax (ADA): the most streams a step may have to take
                                  * the kernel (H100, txl-wt103 sampled on the device, alternated: 1 session 1,341-1,342
                                  * tokens/s against the graphs' 1,223, 8 sessions 7,397-7,399 against 7,551-7,552) */
#define MK_AUTO_ROUNDS 6        /* GPU_DECODE_AUTO: a step's widest attention takes at most this many rounds of the grid
                                  * (B x its items <= this x blocks); past it the graphs are faster, their attention
                                  * (aspan_decode.cu, rel_decode.cu) spread over more blocks. (H200, aspan-enwik8 in
                                  * exact memory, 248 items a stream: 4 streams, 7.5 rounds, the kernel 9,339-9,396
                                  * tokens/s, the graphs 9,912-9,963; 8 streams 12,935-12,999 against 14,615-14,647. In
                                  * span memory, 49 items, and par-base, 24, the kernel stays faster at 8 streams:
                                  * 18,850-18,925 against 16,479-16,578, 22,632-22,654 against 17,703-17,812) */

enum { MK_ASPAN = 0, MK_REL = 1, MK_FFN = 2 };

/* An attention item's constants (32 bytes, read as two int4s) */
typedef struct {
    int code;                    /* (head << 16) | split */
    int kw, r;                   /* adaptive-span: the head's key rows and reach */
    int pad;
    long long off;               /* the head's keys in a stream's ring (adaptive-span: its offset; relative: the
                                  * layer's offset + head x DH, rows A apart) */
    long long mask_off;          /* adaptive-span: its mask in `derived` */
} mk_item;

typedef struct {
    int kind, layer;
    const bf16 *w1, *w2;         /* attention: Wqkv (3A x D), Wo (D x A); feed-forward: fc1 (I x D), fc2 (D x I) */
    const float *b1;             /* fc1's bias */
    const float *rb;             /* the residual's bias (Wo's, fc2's) or NULL */
    const float *lnw, *lnb;      /* the LayerNorm after the sublayer */
    const __half *rk16;          /* relative attention: r_net's rows by distance in fp16 (attn_mma.cu's table), */
    const float *rwb, *vr;       /* u, and v . r_net's rows by distance and head, scaled (attn_mma.cu's) */
    const mk_item *items;        /* the attention's items of one stream */
    int nitems, pad;
} mk_sub;                        /* (a multiple of 16 bytes: copied as int4s) */

typedef struct {
    const bf16 *W;               /* OUT x IN, bf16 */
    int out, in;
} mk_lin;

typedef struct {
    const mk_sub *subs;
    const mk_lin *lin;           /* the step's linear layers in order: each sublayer's two, then the output */
    int nsub, nlin, nbar, B, D, A, I, K, dh, V, ML, nl, same_len, nsmax;
    float emb_scale, eps, rel_scale;
    const float *emb, *out_b, *derived;   /* (emb NULL: an adaptive input, which gpu_ada_embed wrote into X0) */
    const bf16 *pe_h;            /* adaptive-span's key_pe by distance in bf16 (attn_mma.cu's table) */
    float *X0, *X1;              /* the residual stream, two buffers */
    bf16 *qkv, *att, *r, *ff;
    float *logits, *part;
    bf16 *xb;                    /* ADA: an adaptive softmax's launches (forward.cu) take the output layer's input,
                                  * x in X0 and bf16(x) here, and make the logits (NULL: the kernel's OUT and LSM) */
    int *cnt;                    /* the splits finished, per stream and head */
    long long *acc;              /* FFN, WO1: the sums in fixed point, three buffers of MK_FUSE_MAX_B x D */
    unsigned long long *flag;    /* WO1: each stream's and head's output written, by the attention phase's epoch */
    int fuse, wo1, acc0;         /* whether this step's feed-forwards take one phase each (FFN), its attentions'
                                  * Wo none of its own (WO1); the first sums' buffer */
    unsigned ll;                 /* LL: this step's epoch (0: none), the tags' high 25 bits */
    int llq, llw;                /* LL: QKV's outputs as tagged words (no barrier between QKV and the attention); WO1:
                                  * the heads' outputs too (no flag) */
    int pad_ll;
    unsigned long long *qll;     /* LL: QKV's outputs as tagged words (ll_put), MK_MAX_B x 3A */
    unsigned long long *all;     /* LL, WO1: the heads' outputs as tagged words, MK_MAX_B x A */
    unsigned long long *bar;     /* the grid barrier: arrivals since the plan (never reset) */
    unsigned long long bar_base; /* its count when the step starts: steps x barriers a step x blocks */
    unsigned long long *trace;   /* NULL, or gpu_decode_trace's times (mk_trace_at) */
    const int32_t *tok;
    const int64_t *pos;
    bf16 *const *ring;
    const int *len;
} mk_args;

static_assert(sizeof(mk_item) == 32 && sizeof(mk_sub) % 16 == 0 && sizeof(mk_lin) == 16,
              "the plan's records are copied as int4s");

#define MK_MAX_BARRIERS (3 * MK_MAX_SUBS + 1)   /* a step's: 3 an attention, 2 a feed-forward, 1 the output */

/* Dynamic shared memory: the inputs (B x up to MK_MAX_IN floats), two
 * buffers of weight rows (two rows a warp), then the sublayers and the
 * linear layers */
#define MK_XS_BYTES ((size_t)MK_MAX_B * MK_MAX_IN * sizeof(float))
#define MK_BUF_VECS (2 * MK_NCH * MK_THREADS)
#define MK_FIXED_SMEM (MK_XS_BYTES + 2 * MK_BUF_VECS * sizeof(uint4))

struct gpu_mk {
    mk_sub *d_subs;
    mk_item *d_items;
    mk_lin *d_lin;
    float *d_part;               /* the splits' records, counters and barrier: one allocation */
    mk_args a;
    size_t smem;
    int grid;
    int auto_b;                  /* GPU_DECODE_AUTO's most streams a step (see MK_AUTO_ROUNDS) */
    unsigned long long arrivals; /* the barrier's count when the next step starts (steps x their barriers x blocks) */
    int nbar, nffn;              /* a step's barriers without FFN and WO1 (the most); its feed-forward sublayers */
    bool ffn_ok;                 /* whether the model's feed-forwards can take one phase (FFN), */
    char ffn_why[128];           /* and why not */
    bool wo_ok;                  /* whether its attentions' Wo can go into their phase (WO1), */
    char wo_why[128];            /* and why not */
    int natt;                    /* its attention sublayers */
    char kind[MK_MAX_BARRIERS];  /* what each barrier ends: Q(KV), A(ttention), W(o), 1 (fc1), 2 (fc2), O(ut) */
    int nbar_mode[8];            /* a step's barriers by mode (mk_mode: FFN, WO1, LL), counted at the plan */
    unsigned long long *d_qll;   /* LL: the words of QKV's outputs (a.qll), then of the heads' (a.all) */
    unsigned ll_epoch;           /* LL: the last step's epoch (1 .. MK_LL_EPOCHS - 1; the words zeroed at the wrap) */
    unsigned long long *d_trace; /* gpu_decode_trace's buffer (NULL until asked) */
};

/* The trace (gpu_decode_trace), G blocks, NB barriers: rows p = 0..NB of
 * G + 1 times (%globaltimer, ns; row 0: [G] the step's start; row p + 1:
 * each block's arrival at barrier p, then [G] block 0's leaving it), then
 * per point k and phase p = 0..NB (phase NB: the log-softmax) each block's
 * clock (clock64, its SM's cycles: %globaltimer ticks too coarsely for the
 * parts of a phase): k 0 the block's start of the phase, 1 the end of its
 * input, 2 the end of its work, 3 its arrival at the barrier, 4 (the
 * LayerNorm's phases) the end of mk_input's wait for its weights, 5-9
 * points within the LayerNorm (5 its loads in, 6 its sums, 7 its stores)
 * and within an attention item (5 its loads issued, 6 the scores, 7 the
 * lane's softmax and values, 8 the warps' sums in shared memory, 9 the
 * warps met) */
#define MK_POINTS 10
static __host__ __device__ __forceinline__ size_t mk_trace_at(int nb, int G, int k, int p, int b)
{
    return (size_t)(nb + 1) * (G + 1) + ((size_t)k * (nb + 1) + p) * G + b;
}

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

static __device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ void st_release(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* atomicAdd with acquire and release semantics at the GPU's scope */
static __device__ __forceinline__ int atom_add_acq_rel(int *p, int v)
{
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

/* Thread 0's wait until the count at P reaches TARGET (EQ: until the flag
 * at P equals it): relaxed polls (an acquiring load would invalidate the
 * SM's L1 at every poll, the working warps' data with it), then one
 * acquiring load of P. (The session of 2026-12-08 measured acquiring polls
 * and a fence after the polls: no faster, and 6% slower; README.) */
template <bool EQ>
static __device__ __forceinline__ void poll_until(const unsigned long long *p, unsigned long long target)
{
    while (EQ ? ld_relaxed(p) != target : ld_relaxed(p) < target) {}
    ld_acquire(p);
}

/* Thread 0's time at point K of phase PH, when tracing */
static __device__ __forceinline__ void mk_point(const mk_args &a, int k, int ph)
{
    if (a.trace && threadIdx.x == 0) a.trace[mk_trace_at(a.nbar, gridDim.x, k, ph, blockIdx.x)] = clock64();
}



/* This warp's number among the grid's for the linear layers: warp w of
 * block b is w x blocks + b, so a layer of fewer rows than warps still
 * spreads over every SM */
static __device__ __forceinline__ int lin_warp() { return (threadIdx.x >> 5) * gridDim.x + blockIdx.x; }

/* Every block of the grid waits for all the others at the step's barrier
 * PH (the count of those passed), in two halves: grid_arrive says the
 * block's writes are done, grid_wait waits for every block's (the next
 * barrier's count is returned). Between them a block issues what needs
 * nothing of this phase (the copies of later layers' weights and of the
 * next LayerNorm's), so that work stands in the barrier's shadow instead of
 * before it. Thread 0 of each block adds
 * its arrival (after the block's writes: __syncthreads, then a releasing
 * add) to a count that only grows, and polls it until every block's
 * arrival at this barrier is in (poll_until): nothing is reset between
 * barriers or steps, and no arrival waits for an answer. Between the
 * halves a block may only read what no block writes in the step (weights,
 * the plan, the streams' positions) and write its own shared memory: the
 * others may be in the next phase already. */
static __device__ __noinline__ void grid_arrive(const mk_args &a, int ph)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        if (a.trace) {
            a.trace[(size_t)(ph + 1) * (gridDim.x + 1) + blockIdx.x] = globaltimer();
            a.trace[mk_trace_at(a.nbar, gridDim.x, 3, ph, blockIdx.x)] = clock64();
        }
        red_release_add(a.bar, 1ull);
    }
}

static __device__ __noinline__ int grid_wait(const mk_args &a, int ph)
{
    if (threadIdx.x == 0) {
        poll_until<false>(a.bar, a.bar_base + (unsigned long long)(ph + 1) * gridDim.x);
        if (a.trace) {
            const unsigned long long t = globaltimer();
            if (blockIdx.x == 0) a.trace[(size_t)(ph + 1) * (gridDim.x + 1) + gridDim.x] = t;
            a.trace[mk_trace_at(a.nbar, gridDim.x, 0, ph + 1, blockIdx.x)] = clock64();
        }
    }
    __syncthreads();
    return ph + 1;
}

/* Both halves, with nothing between them */
static __device__ __forceinline__ int grid_sync(const mk_args &a, int ph)
{
    grid_arrive(a, ph);
    return grid_wait(a, ph);
}

static __device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* 16 bytes from global memory into shared memory, asynchronously (cp.async,
 * through L2 only) */
static __device__ __forceinline__ void cp16(void *s, const void *g)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(g) : "memory");
}

/* 8 bytes, the same way */
static __device__ __forceinline__ void cp8(void *s, const void *g)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(sa), "l"(g) : "memory");
}

/* 4 bytes, the same way (any float's alignment: a model's weights lie in
 * its arena as the file has them) */
static __device__ __forceinline__ void cp4(void *s, const void *g)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(sa), "l"(g) : "memory");
}

static __device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/* This thread's copies but its last group's have landed */
static __device__ __forceinline__ void cp_wait_but_last() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

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

/* S + the dot product of a lane's 8 weights WF with its 8 inputs X0, X1
 * (in order: the sums' order is the same everywhere) */
static __device__ __forceinline__ float dot8(const float *wf, const float4 &x0, const float4 &x1, float s)
{
    s = fmaf(wf[0], x0.x, s), s = fmaf(wf[1], x0.y, s), s = fmaf(wf[2], x0.z, s), s = fmaf(wf[3], x0.w, s);
    s = fmaf(wf[4], x1.x, s), s = fmaf(wf[5], x1.y, s), s = fmaf(wf[6], x1.z, s), s = fmaf(wf[7], x1.w, s);
    return s;
}

/* Where thread T keeps piece C (of MK_NCH) of its warp's row R (0 or 1) of
 * the first pass in a weight buffer */
static __device__ __forceinline__ int buf_at(int r, int c, int t) { return (r * MK_NCH + c) * MK_THREADS + t; }

/* What a block's copies of linear layer J take (wbuf_issue): the rows of
 * gemv's first pass (LIN_ROWS), or in a step whose feed-forwards take one
 * phase (FFN, ffn_fused) the block's MK_FUSE_ROWS rows of fc1 (LIN_FC1)
 * and those columns of fc2 (LIN_FC2), or in a step whose attentions take
 * their Wo into their phase (WO1, wo_piece) the block's piece of Wo
 * (LIN_WO, heads of 32 dims; LIN_WO + 1, of 64). SUBS: the plan's
 * sublayers (in global or shared memory). */
enum { LIN_ROWS, LIN_FC1, LIN_FC2, LIN_WO };
static __device__ __forceinline__ int lin_role(const mk_args &a, const mk_sub *subs, int j)
{
    if (j >= 2 * a.nsub) return LIN_ROWS;
    if (subs[j >> 1].kind == MK_FFN) return a.fuse ? LIN_FC1 + (j & 1) : LIN_ROWS;
    return a.wo1 && (j & 1) ? LIN_WO + (a.dh == 64) : LIN_ROWS;
}

/* WO1: Wo (D x A) in pieces of a head's DH columns and RP rows (a thread a
 * 16-byte part of a row: RP = 256 / (DH / 8)), piece p = blockIdx.x of
 * the K x D / RP: head p / (D / RP), rows (p % (D / RP)) RP on */
template <int DH>
struct wo_geom {
    static constexpr int LPR = DH / 8, RP = MK_THREADS / LPR;
};

/* Where thread T keeps piece C (0, 1) of row T + 256 R of fc2's columns
 * (LIN_FC2) */
static __device__ __forceinline__ int col_at(int r, int c, int t) { return (2 * r + c) * MK_THREADS + t; }

/* cp16 with an L2 policy (createpolicy): the weights' copies (wbuf_issue) as L2's first to evict */
static __device__ __forceinline__ void cp16_policy(void *s, const void *g, unsigned long long pol)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(sa), "l"(g), "l"(pol) : "memory");
}

/* The linear layer at LP into BUF as one group of copies (an empty group
 * when HAVE is 0, so every thread's groups stay in step with the linear
 * layers), each thread the 16-byte pieces it will read itself. ROLE
 * LIN_ROWS: the first pass's rows (this warp's two: gw and gw + warps),
 * the rows past it into L2; LIN_FC1: rows base + warp and base + warp + 8
 * (base: the block's MK_FUSE_ROWS); LIN_FC2 (D rows of I): columns base ..
 * base + 15 of rows T and T + 256 (32 bytes a row). */
static __device__ __noinline__ void wbuf_issue(const mk_lin *lp, int have, uint4 *buf, int role)
{
    /* (a step streams every weight once, 76 MB on aspan-enwik8 against 50 MB of L2: marked first to evict, they
     * no longer push out what stays, the rings, the activations and the plan; H200: +9 to +10% at 1 session) */
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    if (have) {
        const mk_lin L = *lp;
        const int lane = threadIdx.x & 31, gw = lin_warp(), nw = gridDim.x * MK_WARPS, base = MK_FUSE_ROWS * blockIdx.x;
        const int nv = L.in / 8;
        if (role >= LIN_WO) {   /* the block's piece of Wo: a 16-byte part of a row a thread */
            const int DH = role == LIN_WO ? 32 : 64, LPR = DH / 8, RP = MK_THREADS / LPR, per = L.out / RP;
            const int p = blockIdx.x;
            if (p < L.in / DH * per)
                cp16_policy(buf + threadIdx.x, L.W + (size_t)((p % per) * RP + threadIdx.x / LPR) * L.in + (p / per) * DH +
                                            8 * (threadIdx.x % LPR), pol);
        } else if (role == LIN_FC2) {
            for (int r = 0; r < 2 && base < L.in; r++) {
                const int o = threadIdx.x + r * MK_THREADS;
                if (o >= L.out) break;
                cp16_policy(buf + col_at(r, 0, threadIdx.x), L.W + (size_t)o * L.in + base, pol);
                cp16_policy(buf + col_at(r, 1, threadIdx.x), L.W + (size_t)o * L.in + base + 8, pol);
            }
        } else {
            for (int r = 0; r < 2; r++) {
                const int o = role == LIN_FC1 ? base + (threadIdx.x >> 5) + 8 * r : gw + r * nw;
                if (o >= L.out) break;
                for (int c = 0; c < MK_NCH && lane + 32 * c < nv; c++)
                    cp16_policy(buf + buf_at(r, c, threadIdx.x), L.W + (size_t)o * L.in + 8 * lane + 256 * c, pol);
            }
            const int lines = L.in * (int)sizeof(bf16) / 128;
            if (role == LIN_ROWS)
                for (int o = gw + 2 * nw; o < L.out; o += nw)
                    for (int c = lane; c < lines; c += 32) prefetch_l2((const char *)(L.W + (size_t)o * L.in) + 128 * c);
        }
    }
    cp_commit();
}

/* gemv's epilogues: bf16(y) into Y, bf16(max(y + bias, 0)) into Y, y in
 * float into YF, or (EPI_LL, QKV in a step whose attention reads its
 * outputs as they land: LL) bf16(y) with a tag in one 64-bit word (ll_put)
 * into the words at YF, the tag's bits passed as BIAS */
enum { EPI_BF16, EPI_BIAS_RELU, EPI_FLOAT, EPI_LL };

/* LL: one number in the low 16 bits (bf16) of a 64-bit word whose high 32
 * are the tag of the phase that wrote it, stored at once (a relaxed
 * 64-bit store is single-copy atomic): a reader that sees its phase's tag
 * has the number, with no fence on either side and no barrier between */
static __device__ __forceinline__ void ll_put(unsigned long long *p, float v, unsigned tag)
{
    const unsigned long long w = (unsigned long long)tag << 32 | __bfloat16_as_ushort(__float2bfloat16(v));
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}

/* LL: the numbers of the 8 words at P (16-byte aligned) as 8 bf16s, once
 * every word holds TAG (polled with relaxed loads: each word is its own
 * number and tag, so nothing else need be ordered) */
static __device__ __forceinline__ uint4 ll_get8(const unsigned long long *p, unsigned tag)
{
    unsigned long long w[8];
    for (;;) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
                         : "=l"(w[2 * k]), "=l"(w[2 * k + 1])
                         : "l"(p + 2 * k)
                         : "memory");
        bool ok = true;
#pragma unroll
        for (int k = 0; k < 8; k++) ok &= (unsigned)(w[k] >> 32) == tag;
        if (ok) break;
    }
    return make_uint4((unsigned)(w[0] & 0xffffu) | (unsigned)(w[1] & 0xffffu) << 16,
                      (unsigned)(w[2] & 0xffffu) | (unsigned)(w[3] & 0xffffu) << 16,
                      (unsigned)(w[4] & 0xffffu) | (unsigned)(w[5] & 0xffffu) << 16,
                      (unsigned)(w[6] & 0xffffu) | (unsigned)(w[7] & 0xffffu) << 16);
}

/* LL: the number of the word at P, once it holds TAG */
static __device__ __forceinline__ bf16 ll_get1(const unsigned long long *p, unsigned tag)
{
    unsigned long long w;
    do w = ld_relaxed(p);
    while ((unsigned)(w >> 32) != tag);
    return __ushort_as_bfloat16((unsigned short)(w & 0xffffu));
}

static __device__ __forceinline__ void gemv_out(int epi, float v, int b, int o, int out, bf16 *y, float *yf, float bias)
{
    if (epi == EPI_BF16) y[(size_t)b * out + o] = __float2bfloat16(v);
    else if (epi == EPI_BIAS_RELU) y[(size_t)b * out + o] = __float2bfloat16(fmaxf(v + bias, 0.0f));
    else if (epi == EPI_LL) ll_put((unsigned long long *)yf + (size_t)b * out + o, v, __float_as_uint(bias));
    else yf[(size_t)b * out + o] = v;
}

/* gemv's sums for rows O and O2 (TWO) of its warp, its weights W, for the
 * B streams (PAIR: two at a time; without, B is 1 and the code is one
 * stream's alone: the pairs' took a quarter of a microsecond more a phase
 * of fc2 on one stream). NC: the row's 16-byte pieces are exactly NC a
 * lane (an input of 256 NC), so no piece is tested; 0: up to MK_NCH, each
 * tested against NV. Row O2's sums are taken whether or not it exists
 * (its weights are then whatever the buffer holds; they are never
 * stored): a branch a piece cost more than the products. */
template <int NC, bool PAIR, int MAXC = MK_NCH>
static __device__ __forceinline__ void gemv_rows(int epi, const uint4 (&w)[2][MK_NCH], const float *xs, int ld, int B, int lane,
                                                 int nv, int o, int o2, bool two, int out, bf16 *y, float *yf, float bo,
                                                 float bo2)
{
    constexpr int NCH = NC ? NC : MAXC;   /* (MAXC: the most pieces a lane the tested loop may take) */
#pragma unroll 1
    for (int b = 0; b < B; b += PAIR ? 2 : 1) {
        const bool sb = PAIR && b + 1 < B;
        float s0 = 0.0f, s1 = 0.0f, t0 = 0.0f, t1 = 0.0f;   /* rows o, o2 of stream b; of stream b + 1 */
#pragma unroll
        for (int c = 0; c < NCH; c++) {
            if (!NC && lane + 32 * c >= nv) break;
            const float *xb = xs + b * ld + 256 * c + 8 * lane;
            const float4 x0 = *(const float4 *)xb, x1 = *(const float4 *)(xb + 4);
            /* (the order of the unpacking as measured fastest: both rows' first for pairs, one at a time alone) */
            float wf[8], wg[8];
            bf8(w[0][c], wf);
            if (PAIR) bf8(w[1][c], wg);
            s0 = dot8(wf, x0, x1, s0);
            if (!PAIR) bf8(w[1][c], wg);
            s1 = dot8(wg, x0, x1, s1);
            if (sb) {
                const float4 y0 = *(const float4 *)(xb + ld), y1 = *(const float4 *)(xb + ld + 4);
                t0 = dot8(wf, y0, y1, t0);
                t1 = dot8(wg, y0, y1, t1);
            }
        }
        s0 = warp_sum(s0);
        s1 = warp_sum(s1);
        if (sb) t0 = warp_sum(t0), t1 = warp_sum(t1);
        if (lane == 0) {
            gemv_out(epi, s0, b, o, out, y, yf, bo);
            if (two) gemv_out(epi, s1, b, o2, out, y, yf, bo2);
            if (sb) {
                gemv_out(epi, t0, b + 1, o, out, y, yf, bo);
                if (two) gemv_out(epi, t1, b + 1, o2, out, y, yf, bo2);
            }
        }
    }
}

/* y[b][o] = W[o] . xs[b] for the linear layer at LP and the B inputs in
 * shared memory (LD floats apart), rows o a warp each, two rows' loads in
 * flight at once, those of the first pass from BUF (wbuf_issue's, the group
 * before the newest); EPI: bf16(y) into Y (B x OUT), bf16(max(y + bias,
 * 0)), or y in float into YF. NC as gemv_rows's: an input of 256 NC takes
 * straight code (no test a piece; the first pass's rows from BUF whether
 * or not the second row exists), any other the tested loop. (Loops that
 * need not be unrolled are not: the kernel's code must stay small enough
 * for the instruction caches.) */
template <int NC>
static __device__ __forceinline__ void gemv_t(int epi, const mk_lin *lp, const float *xs, int ld, int B, bf16 *y, float *yf,
                                           const float *bias, const uint4 *buf, unsigned tag)
{
    constexpr int NCH = NC ? NC : MK_NCH;
    const mk_lin L = *lp;
    const bf16 *W = L.W;
    const int out = L.out, in = L.in;
    const int lane = threadIdx.x & 31, gw = lin_warp(), nw = gridDim.x * MK_WARPS;
    const int nv = in / 8;   /* 16-byte vectors of a row: lane L takes L, L + 32, ... */
    cp_wait_but_last();
    for (int o = gw; o < out; o += 2 * nw) {
        const int o2 = o + nw;
        const bool two = o2 < out;
        const float bo = epi == EPI_LL ? __uint_as_float(tag) : epi == EPI_BIAS_RELU && lane == 0 ? __ldg(bias + o) : 0.0f,
                    bo2 = epi == EPI_LL ? bo : epi == EPI_BIAS_RELU && lane == 0 && two ? __ldg(bias + o2) : 0.0f;
        uint4 w[2][MK_NCH];
        if (o == gw) {
#pragma unroll
            for (int c = 0; c < NCH; c++)
                if (NC || lane + 32 * c < nv) {
                    w[0][c] = buf[buf_at(0, c, threadIdx.x)];
                    w[1][c] = buf[buf_at(1, c, threadIdx.x)];
                }
        } else {
#pragma unroll
            for (int c = 0; c < NCH; c++)
                if (NC || lane + 32 * c < nv) {
                    w[0][c] = __ldg((const uint4 *)(W + (size_t)o * in + 8 * lane + 256 * c));
                    w[1][c] = two ? __ldg((const uint4 *)(W + (size_t)o2 * in + 8 * lane + 256 * c)) : make_uint4(0, 0, 0, 0);
                }
        }
        /* one stream, or two at a time (the weights unpacked once for both, four sums in flight) */
        if (B == 1) gemv_rows<NC, false>(epi, w, xs, ld, 1, lane, nv, o, o2, two, out, y, yf, bo, bo2);
        else gemv_rows<NC, true>(epi, w, xs, ld, B, lane, nv, o, o2, two, out, y, yf, bo, bo2);
    }
}

/* gemv's EPI_BF16 (fc2's) for one stream, an input of 2,048 (8 pieces a
 * lane) and a layer that one pass covers (the rows of a warp from BUF; the
 * caller waits for them), in straight code: each piece's two rows read from BUF as the
 * products need them, two pieces an iteration, the sums in gemv_rows's
 * order. (gemv_rows<8> with every piece's rows in registers, and any call
 * of this from gemv, made the kernel's body spill around its calls: the
 * kernel calls it itself, for fc2.) */
static __device__ __noinline__ void gemv_first8(const mk_lin *lp, const float *xs, bf16 *y, const uint4 *buf)
{
    const int out = lp->out, lane = threadIdx.x & 31, o = lin_warp(), o2 = o + gridDim.x * MK_WARPS;
    if (o >= out) return;
    const bool two = o2 < out;
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 2
    for (int c = 0; c < 8; c++) {
        const uint4 wa = buf[buf_at(0, c, threadIdx.x)], wb = buf[buf_at(1, c, threadIdx.x)];
        const float *xb = xs + 256 * c + 8 * lane;
        const float4 x0 = *(const float4 *)xb, x1 = *(const float4 *)(xb + 4);
        float wf[8], wg[8];
        bf8(wa, wf);
        s0 = dot8(wf, x0, x1, s0);
        bf8(wb, wg);
        s1 = dot8(wg, x0, x1, s1);
    }
    s0 = warp_sum(s0);
    s1 = warp_sum(s1);
    if (lane == 0) {
        y[o] = __float2bfloat16(s0);
        if (two) y[o2] = __float2bfloat16(s1);
    }
}

/* gemv_t for the linear layer's input width (one function: each of its
 * own made the kernel's body spill around the calls); an input of 2,048
 * takes the tested loop (and gemv_first8, called by the kernel for fc2 of
 * one stream) */
static __device__ __noinline__ void gemv(int epi, const mk_lin *lp, const float *xs, int ld, int B, bf16 *y, float *yf,
                                            const float *bias, const uint4 *buf, unsigned tag = 0)
{
    switch (lp->in % 256 ? 0 : lp->in / 256) {
    case 1: gemv_t<1>(epi, lp, xs, ld, B, y, yf, bias, buf, tag); break;
    case 2: gemv_t<2>(epi, lp, xs, ld, B, y, yf, bias, buf, tag); break;
    case 4: gemv_t<4>(epi, lp, xs, ld, B, y, yf, bias, buf, tag); break;
    default: gemv_t<0>(epi, lp, xs, ld, B, y, yf, bias, buf, tag); break;
    }
}

/* A relaxed add of V to the 64-bit integer at P, no answer asked */
static __device__ __forceinline__ void red_add_u64(long long *p, long long v)
{
    asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* N bytes of 64-bit integers at S (shared memory) added into those at G,
 * by the copy engine (cp.reduce.async.bulk: the L2 takes whole lines, where
 * a red a number took a pass of its atomic unit each), waited for; the
 * proxy fences order the generic proxy's writes before (the zeros, the
 * block's partial sums) and its reads after. By one thread, after every
 * thread's fence.proxy.async.shared::cta and a __syncthreads. */
static __device__ __forceinline__ void bulk_add_u64(long long *g, const long long *s, unsigned n)
{
    asm volatile("fence.proxy.async.global;" ::: "memory");
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u64 [%0], [%1], %2;" ::"l"(g),
                 "r"((unsigned)__cvta_generic_to_shared(s)), "r"(n)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

/* FFN's fc1 for the block's MK_FUSE_ROWS rows (base + warp and base + warp
 * + 8, from BUF: wbuf_issue's LIN_FC1), its bias and ReLU, rounded to bf16
 * into HS (B x MK_FUSE_ROWS, shared memory): gemv's sums, in its order, in
 * straight code. Its input, the model's width: 512 (NC 2), 256 (NC 1) or
 * 128 (NC 1, lanes 16-31 with zero weights and inputs from Z8, 8 zeros in
 * shared memory). (The tested loop made the kernel's body spill around the
 * call, as a model of 384 would need it: that one takes two phases.) */
template <int NC>
static __device__ __forceinline__ void ffn_fc1_t(const mk_lin *l1, const float *b1, const float *xs, int B, const uint4 *buf,
                                                 bf16 *hs, const float *z8)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, base = MK_FUSE_ROWS * blockIdx.x, in = l1->in, nv = in / 8;
    const float bo = lane == 0 ? __ldg(b1 + base + warp) : 0.0f, bo2 = lane == 0 ? __ldg(b1 + base + warp + 8) : 0.0f;
    const bool ok = lane < nv;
    uint4 w[2][MK_NCH];
#pragma unroll
    for (int c = 0; c < NC; c++) {
        w[0][c] = ok ? buf[buf_at(0, c, threadIdx.x)] : make_uint4(0, 0, 0, 0);
        w[1][c] = ok ? buf[buf_at(1, c, threadIdx.x)] : make_uint4(0, 0, 0, 0);
    }
    const float *x = ok ? xs : z8 - 8 * lane;   /* (gemv_rows reads x + b ld + 8 lane) */
    const int ld = ok ? in : 0;
    if (B == 1) gemv_rows<NC, false>(EPI_BIAS_RELU, w, x, ld, 1, lane, nv, warp, warp + 8, true, MK_FUSE_ROWS, hs, NULL, bo, bo2);
    else gemv_rows<NC, true>(EPI_BIAS_RELU, w, x, ld, B, lane, nv, warp, warp + 8, true, MK_FUSE_ROWS, hs, NULL, bo, bo2);
}

/* ffn_fc1_t for the model's width (a function of its own: inlined into
 * ffn_fused, it made that spill) */
static __device__ __noinline__ void ffn_fc1(const mk_lin *l1, const float *b1, const float *xs, int B, const uint4 *buf,
                                            bf16 *hs, const float *z8)
{
    if (l1->in == 512) ffn_fc1_t<2>(l1, b1, xs, B, buf, hs, z8);
    else ffn_fc1_t<1>(l1, b1, xs, B, buf, hs, z8);
}

/* The sums' buffer NXT (MK_FUSE_MAX_B x D) zeroed by the grid (FFN, WO1:
 * the buffer of the sublayer after next, which no block reads or adds to
 * in this phase) */
static __device__ __forceinline__ void acc_zero(long long *nxt, int D)
{
    for (int i = blockIdx.x * MK_THREADS + threadIdx.x; i < MK_FUSE_MAX_B * D; i += gridDim.x * MK_THREADS) nxt[i] = 0;
}

/* A feed-forward sublayer as one phase (FFN: steps of up to MK_FUSE_MAX_B
 * streams): block k takes fc1's rows 16 k .. 16 k + 15 (ffn_fc1_t, from
 * BUF1), then those 16 columns of fc2 (BUF2: wbuf_issue's LIN_FC2) times
 * them, a thread each of fc2's rows T and T + 256, its D sums a stream in
 * fixed point (units of 2^-30, rounded to nearest: integers' sums do not
 * depend on the blocks' order, so a step gives the same bits every time)
 * added into ACC (B x D): up to MK_RED_MAX_B streams with a red each
 * (H200: the sums 32 or 128 bytes apart, over more of the L2's slices, made
 * a step 3-7% slower: the next phase reads them one by one), more
 * into shared memory over XS (fc1's input, read by then) and from there
 * by one bulk reduction (bulk_add_u64); the next phase's input
 * reads them (mk_input). The grid zeroes NXT (MK_FUSE_MAX_B x D), the
 * buffer of the feed-forward after next, which no block reads or adds to
 * in this phase. */
static __device__ __noinline__ void ffn_fused(const mk_args &a, const mk_lin *l1, const mk_lin *l2, const float *b1,
                                              float *xs, const uint4 *buf1, const uint4 *buf2, long long *acc,
                                              long long *nxt, const float *z8)
{
    __shared__ __align__(16) bf16 hs[MK_FUSE_MAX_B * MK_FUSE_ROWS];
    const int base = MK_FUSE_ROWS * blockIdx.x, I = l1->out, D = l2->out, B = a.B, t = threadIdx.x;
    acc_zero(nxt, D);
    cp_wait_but_last();   /* (fc1's rows: the step's first sublayer's input waits for none) */
    if (base < I) ffn_fc1(l1, b1, xs, B, buf1, hs, z8);
    asm volatile("cp.async.wait_all;" ::: "memory");   /* (fc2's columns: the newest group) */
    __syncthreads();
    if (base >= I) return;
    long long *part = (long long *)xs;   /* (B x D: 32 KB at most, of XS's 64) */
#pragma unroll 1
    for (int r = 0; r < 2; r++) {
        const int o = t + r * MK_THREADS;
        if (o >= D) break;
        float wf[MK_FUSE_ROWS];
        bf8(buf2[col_at(r, 0, t)], wf);
        bf8(buf2[col_at(r, 1, t)], wf + 8);
        for (int b = 0; b < B; b++) {
            float h[MK_FUSE_ROWS];
            bf8(*(const uint4 *)(hs + b * MK_FUSE_ROWS), h);
            bf8(*(const uint4 *)(hs + b * MK_FUSE_ROWS + 8), h + 8);
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < MK_FUSE_ROWS; k++) s = fmaf(wf[k], h[k], s);
            if (B <= MK_RED_MAX_B) red_add_u64(acc + b * D + o, __float2ll_rn(s * MK_FIX));
            else part[b * D + o] = __float2ll_rn(s * MK_FIX);
        }
    }
    if (B <= MK_RED_MAX_B) return;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (t == 0) bulk_add_u64(acc, part, (unsigned)(B * D * sizeof(long long)));
}

/* WO1: Wo for the block's piece (wo_geom: head h, RP rows; its weights
 * in BUF, a thread's 16 bytes: wbuf_issue's LIN_WO) of every stream b:
 * waits until the attention phase's item that finishes head h of stream
 * b has flagged its output (FLAG b K + h = EPOCH: a releasing store after
 * it, polled by thread 0 with relaxed loads, then one acquiring load),
 * then each row's part sums (LPR lanes, shuffles) are added into ACC (b D
 * + row) in fixed point, as ffn_fused's. Waiting cannot deadlock: every
 * block does its attention items, which never wait, before its piece. */
template <int DH>
static __device__ __noinline__ void wo_piece(const mk_args &a, const uint4 *buf, long long *acc, unsigned long long epoch,
                                             unsigned wtag)
{
    constexpr int LPR = wo_geom<DH>::LPR, RP = wo_geom<DH>::RP;
    const int D = a.D, per = D / RP, p = blockIdx.x, t = threadIdx.x;
    if (p >= a.K * per) return;
    const int h = p / per, row = (p % per) * RP + t / LPR, c = t % LPR;
    float w[8];
    bf8(buf[t], w);
    for (int b = 0; b < a.B; b++) {
        float x[8];
        if (wtag)   /* LL: each thread's 8 numbers of the head's output, as they land */
            bf8(ll_get8(a.all + (size_t)b * a.A + h * DH + 8 * c, wtag), x);
        else {
            if (t == 0) poll_until<true>(a.flag + b * a.K + h, epoch);
            __syncthreads();
            bf8(__ldcg((const uint4 *)(a.att + (size_t)b * a.A + h * DH) + c), x);
        }
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) sum = fmaf(w[e], x[e], sum);
#pragma unroll
        for (int o = 1; o < LPR; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (c == 0) red_add_u64(acc + b * D + row, __float2ll_rn(sum * MK_FIX));
    }
}

/* The B rows of N of a bf16 buffer written in this kernel (L2, not L1)
 * into shared memory as floats, N apart: every load first */
static __device__ __noinline__ void load_rows(float *xs, const bf16 *src, int n, int B)
{
    constexpr int NL = MK_MAX_B * MK_MAX_IN / 8 / MK_THREADS;
    const int nv = B * n / 8;   /* (N is a multiple of 8) */
    uint4 v[NL];
#pragma unroll
    for (int k = 0; k < NL; k++)
        v[k] = threadIdx.x + k * MK_THREADS < nv ? __ldcg((const uint4 *)src + threadIdx.x + k * MK_THREADS)
                                                 : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < NL; k++) {
        const int i = threadIdx.x + k * MK_THREADS;
        if (i < nv) {
            float f[8];
            bf8(v[k], f);
            *(float4 *)(xs + 8 * i) = make_float4(f[0], f[1], f[2], f[3]);
            *(float4 *)(xs + 8 * i + 4) = make_float4(f[4], f[5], f[6], f[7]);
        }
    }
    __syncthreads();
}

/* The LayerNorm after sublayer U (its weight, bias and the residual's
 * bias, zeros without one) into LNP (3 x D floats) as a group of copies,
 * a phase ahead of mk_input */
static __device__ __noinline__ void ln_issue(const mk_sub *u, float *lnp, int D)
{
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        cp4(lnp + i, u->lnw + i);
        cp4(lnp + D + i, u->lnb + i);
        if (u->rb) cp4(lnp + 2 * D + i, u->rb + i);
        else lnp[2 * D + i] = 0.0f;
    }
    cp_commit();
}

/* The input of QKV, FC1 (FFN) or OUT into shared memory, rounded to bf16
 * (the linear layers' input type), from the embedding (FIRST) or as x =
 * LN(x + r + rb) of the sublayer before, its weights in LNP (ln_issue's,
 * the group before the newest); r is bf16 in a.r, or after an FFN its
 * fixed-point sums in RACC (rounded to bf16 as fc2's output is); block 0
 * writes x (float) into XO while every block reads XI. A warp a row, lane
 * L holding the float4s L + 32 k; the row's loads (x and r) issued before
 * any arithmetic. */
template <int NV>
static __device__ __noinline__ void mk_input_t(const mk_args &a, bool first, const float *xi, float *xo, float *xs,
                                               const float *lnp, const long long *racc, int ph, bf16 *xbo)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, D = 128 * NV;
    if (!first) {
        cp_wait_but_last();
        __syncthreads();
        if (a.trace && threadIdx.x == 0) a.trace[mk_trace_at(a.nbar, gridDim.x, 4, ph, blockIdx.x)] = clock64();
    }
    for (int b = warp; b < a.B; b += MK_WARPS) {
        float4 u[NV];
        if (first && !a.emb) {   /* an adaptive input: gpu_ada_embed's rows (scaled) in XI */
#pragma unroll
            for (int k = 0; k < NV; k++) u[k] = __ldcg((const float4 *)(xi + (size_t)b * D + 4 * (lane + 32 * k)));
        } else if (first) {
            const float *e = a.emb + (size_t)__ldg(a.tok + b) * D;
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const float *p = e + 4 * (lane + 32 * k);
                u[k] = make_float4(__ldg(p) * a.emb_scale, __ldg(p + 1) * a.emb_scale, __ldg(p + 2) * a.emb_scale,
                                   __ldg(p + 3) * a.emb_scale);
            }
        } else {
            uint2 rr[NV];
            if (racc) {
                longlong2 f[NV][2];
#pragma unroll
                for (int k = 0; k < NV; k++) {
                    const int c = 4 * (lane + 32 * k);
                    u[k] = __ldcg((const float4 *)(xi + (size_t)b * D + c));
                    f[k][0] = __ldcg((const longlong2 *)(racc + (size_t)b * D + c));
                    f[k][1] = __ldcg((const longlong2 *)(racc + (size_t)b * D + c) + 1);
                }
#pragma unroll
                for (int k = 0; k < NV; k++) {
                    const __nv_bfloat162 r0 = __floats2bfloat162_rn(__ll2float_rn(f[k][0].x) * (1.0f / MK_FIX),
                                                                    __ll2float_rn(f[k][0].y) * (1.0f / MK_FIX)),
                                         r1 = __floats2bfloat162_rn(__ll2float_rn(f[k][1].x) * (1.0f / MK_FIX),
                                                                    __ll2float_rn(f[k][1].y) * (1.0f / MK_FIX));
                    rr[k] = make_uint2(*(const unsigned *)&r0, *(const unsigned *)&r1);
                }
            } else
#pragma unroll
                for (int k = 0; k < NV; k++) {
                    const int c = 4 * (lane + 32 * k);
                    u[k] = __ldcg((const float4 *)(xi + (size_t)b * D + c));
                    rr[k] = __ldcg((const uint2 *)(a.r + (size_t)b * D + c));
                }
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int c = 4 * (lane + 32 * k);
                const float4 t = *(const float4 *)(lnp + 2 * D + c);
                const float2 r0 = __bfloat1622float2(*(const __nv_bfloat162 *)&rr[k].x),
                             r1 = __bfloat1622float2(*(const __nv_bfloat162 *)&rr[k].y);
                u[k].x += r0.x + t.x, u[k].y += r0.y + t.y, u[k].z += r1.x + t.z, u[k].w += r1.y + t.w;
                s += u[k].x + u[k].y + u[k].z + u[k].w;
            }
            mk_point(a, 5, ph);
            const float mean = warp_sum(s) * (1.0f / (128 * NV));
            float q = 0.0f;
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const float e0 = u[k].x - mean, e1 = u[k].y - mean, e2 = u[k].z - mean, e3 = u[k].w - mean;
                q += e0 * e0 + e1 * e1 + e2 * e2 + e3 * e3;
            }
            const float inv = rsqrtf(warp_sum(q) * (1.0f / (128 * NV)) + a.eps);
            mk_point(a, 6, ph);
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int c = 4 * (lane + 32 * k);
                const float4 w = *(const float4 *)(lnp + c), bb = *(const float4 *)(lnp + D + c);
                u[k].x = (u[k].x - mean) * inv * w.x + bb.x;
                u[k].y = (u[k].y - mean) * inv * w.y + bb.y;
                u[k].z = (u[k].z - mean) * inv * w.z + bb.z;
                u[k].w = (u[k].w - mean) * inv * w.w + bb.w;
            }
        }
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int c = 4 * (lane + 32 * k);
            if (blockIdx.x == 0) *(float4 *)(xo + (size_t)b * D + c) = u[k];
            const __nv_bfloat162 h0 = __floats2bfloat162_rn(u[k].x, u[k].y), h1 = __floats2bfloat162_rn(u[k].z, u[k].w);
            if (xbo) *(uint2 *)(xbo + (size_t)b * D + c) = make_uint2(*(const unsigned *)&h0, *(const unsigned *)&h1);
            const float2 f0 = __bfloat1622float2(h0), f1 = __bfloat1622float2(h1);
            *(float4 *)(xs + b * D + c) = make_float4(f0.x, f0.y, f1.x, f1.y);
        }
    }
    if (!first) mk_point(a, 7, ph);
    __syncthreads();
}

/* mk_input_t for the model's width (D = 128 NV) */
static __device__ __forceinline__ void mk_input(const mk_args &a, bool first, const float *xi, float *xo, float *xs,
                                                const float *lnp, const long long *racc, int ph, bf16 *xbo = NULL)
{
    switch (a.D / 128) {
    case 1: mk_input_t<1>(a, first, xi, xo, xs, lnp, racc, ph, xbo); break;
    case 2: mk_input_t<2>(a, first, xi, xo, xs, lnp, racc, ph, xbo); break;
    case 3: mk_input_t<3>(a, first, xi, xo, xs, lnp, racc, ph, xbo); break;
    default: mk_input_t<MK_MAX_D / 128>(a, first, xi, xo, xs, lnp, racc, ph, xbo); break;
    }
}

/* ------------------------------------------------------------ attention */

/* Shared memory of the attention: the warps' states, the splits' records */
struct __align__(16) mk_att_sm {
    float m[MK_WARPS], z[MK_WARPS], w[MK_WARPS];
    float o[MK_WARPS][MK_MAX_DH];
    float ev[MK_WARPS];
    float rm[MK_MAX_SPLITS], rz[MK_MAX_SPLITS], rw[MK_MAX_SPLITS];   /* the splits' records met */
    float ev2[MK_MAX_SPLITS];
    int last;
};

/* An attention item: what it writes, and where its keys lie (att_head) */
struct mk_head {
    int h, sp, nsplit;
    bool zero;                   /* adaptive-span, a zero mask: the output is zeros */
    bf16 *kd, *vd;               /* the ring rows the step's key and value replace (NULL: another split's) */
    const bf16 *nk, *nv;         /* the step's own key and value (in qkv) */
    /* where the split's keys lie (att_key): the head's key and value rows in the ring, and */
    bf16 *kr, *vr;
    int kslot, vslot, kw, r, dlo, dhi;   /* adaptive-span: the slots of distance 0, the key rows, the reach, the split's
                                          * distances */
    int mslot, jlo, L, mlen;     /* relative attention: memory row 0's slot, the first key that counts, the keys, the
                                  * memory's rows */
    const __half *ph;            /* relative attention: the head's r_net row of distance 0 (fp16), */
    const float *vrh;            /* and v . that row (scaled), rows K apart */
};
/* An item's inputs: its record, then its stream's position, ring and
 * (relative attention) memory length; in shared memory (geo_cache copies
 * the block's first item's of every attention when the step starts) */
struct mk_geo {
    int4 i0;                     /* code, kw, r, pad */
    longlong2 i1;                /* off, mask_off */
    long long pos;
    unsigned long long ring;
    int mlen, pad[3];
};

struct mk_key {
    bool ok, vok;                /* a key; its value weighs */
    const bf16 *k, *v, *pb;      /* its key and value rows; adaptive-span: its position row (bf16) */
    const __half *ph;            /* relative attention: its r_net row (fp16) */
    int md;                      /* its distance: adaptive-span's mask, relative attention's v . r */
};

/* What an item of stream B (its inputs G) writes and where its keys lie:
 * computed once an item (the ring slots' remainders), not once a key */
static __device__ __forceinline__ void att_head(const mk_args &a, const mk_sub *u, const mk_geo &g, int b, mk_head &H, int DH,
                                                bool rel)
{
    const int A = a.A;
    const int4 i0 = g.i0;
    const longlong2 i1 = g.i1;
    H.h = i0.x >> 16;
    H.sp = i0.x & 0xffff;
    const int64_t p = g.pos;
    bf16 *const ring = (bf16 *)g.ring;
    const bf16 *qv = a.qkv + (size_t)b * 3 * A + (size_t)H.h * DH;
    H.nk = qv + A;
    H.nv = qv + 2 * A;
    if (!rel) {
        const int kw = i0.y, r = i0.z;
        H.kw = kw;
        H.r = r;
        H.nsplit = kw > 0 ? (kw + MK_SPLIT - 1) / MK_SPLIT : 1;
        H.zero = r == 0;
        H.dlo = 1 + H.sp * MK_SPLIT;
        H.dhi = min(kw, H.dlo + MK_SPLIT - 1);
        H.kslot = kw > 0 ? ring_slot(p, kw) : 0;
        H.vslot = r > 0 ? ring_slot(p, r) : 0;
        H.kr = ring + i1.x;
        H.vr = H.kr + (size_t)kw * DH;
        H.kd = H.dlo <= kw && kw <= H.dhi ? H.kr + (size_t)H.kslot * DH : NULL;
        H.vd = r > 0 && H.dlo <= r && r <= H.dhi ? H.vr + (size_t)H.vslot * DH : NULL;
    } else {
        const int ML = a.ML, mlen = g.mlen;
        const int mask_len = mlen + 1 - ML, shift = mask_len > 0 ? 1 - mask_len : 1;
        H.mlen = mlen;
        H.L = mlen + 1;
        H.jlo = a.same_len && 1 - shift > 0 ? 1 - shift : 0;
        H.mslot = ML > 0 ? ring_slot(p - mlen, ML) : 0;
        H.kr = ring + i1.x;
        H.vr = H.kr + (size_t)ML * A;
        H.nsplit = (ML + MK_SPLIT) / MK_SPLIT;   /* ((ML + 1) keys at most) */
        H.zero = false;
        const int ws = ML > 0 ? ring_slot(p, ML) : 0;
        const bool wr = ML > 0 && H.sp == (mlen == ML ? 0 : mlen / MK_SPLIT);
        H.kd = wr ? H.kr + (size_t)ws * A : NULL;
        H.vd = wr ? H.vr + (size_t)ws * A : NULL;
        H.ph = u->rk16 + (size_t)H.h * DH;
        H.vrh = u->vr + H.h;
    }
}

/* The item's key number T (0 .. MK_SPLIT - 1 of the split): where its
 * rows lie. Adaptive-span (as aspan_decode.cu): distances d = 1..kw of
 * the head's key rows, their position rows (key_pe of distance d), the
 * mask m(d) up to the reach r; the new key into the slot of distance kw,
 * the new value into that of distance r. Relative attention (as
 * rel_attn.cu): keys j = jlo..mlen (the memory, then the step's own), r_net
 * row mlen - j; the step's key and value to slot p % ML, which memory row 0
 * holds when the memory is full (then split 0 writes it after its reads),
 * else no key of the step (then the split of the step's own key). */
static __device__ __forceinline__ void att_key(const mk_args &a, const mk_head &H, int t, mk_key &K, int DH, bool rel)
{
    K.pb = NULL;
    K.ph = NULL;
    if (!rel) {
        const int d = H.dlo + t;
        K.ok = !H.zero && d <= H.dhi;
        K.vok = K.ok && d <= H.r;
        const int ks = H.kslot - d < 0 ? H.kslot - d + H.kw : H.kslot - d,
                  vs = H.vslot - d < 0 ? H.vslot - d + H.r : H.vslot - d;
        K.k = H.kr + (size_t)ks * DH;
        K.v = H.vr + (size_t)vs * DH;
        K.pb = a.pe_h + (size_t)d * DH;
        K.md = d;
    } else {
        const int A = a.A, ML = a.ML;
        const int j = H.sp * MK_SPLIT + t;
        const int sl = H.mslot + j >= ML ? H.mslot + j - ML : H.mslot + j;
        K.ok = K.vok = j < H.L && j >= H.jlo;
        K.k = j < H.mlen ? H.kr + (size_t)sl * A : H.nk;
        K.v = j < H.mlen ? H.vr + (size_t)sl * A : H.nv;
        K.md = H.mlen - j;
        K.ph = H.ph + (size_t)K.md * A;
    }
}

/* WO1: head H of stream B's output is written (by this block's threads
 * under DH): after the block's barrier, thread 0's releasing store of the
 * phase's epoch into its flag (wo_piece waits for it) */
static __device__ __forceinline__ void att_done(const mk_args &a, int b, int h, int ph)
{
    __syncthreads();
    if (threadIdx.x == 0) st_release(a.flag + b * a.K + h, a.bar_base + (unsigned long long)ph + 1);
}

/* One (stream, head, split) item of sublayer U, stream B, its inputs GP:
 * 32 keys a warp, a key's rows read by DH / 8 lanes, 8 dims each (its key,
 * position and value rows loaded with the lane's dims of the query, every
 * load in flight at once), the score (adaptive-span: q.(k + pe) /
 * sqrt(DH); relative: ((q + u).k + q.r) scale + v.r, r in fp16, v.r from
 * its table), the lanes' parts summed by shuffles; the warp's softmax (M,
 * Z = sum e, W = sum e mw, O = sum e mw v: each lane weights its 8 dims of
 * each value row, then shuffles sum them over the key groups); the block's
 * warps met in shared memory; then the step's key and value into the rings
 * after the block's reads; then the splits met (the last to finish), the
 * head's output. */
template <int DH, bool REL>
static __device__ __noinline__ void att_item(const mk_args &a, const mk_sub *u, const mk_geo *gp, int b, mk_att_sm *sm,
                                             float *O, int ph, unsigned tag, unsigned wtag)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr bool rel = REL;
    /* a key's rows are read by LPK lanes, 8 dims (16 bytes of bf16) each: a warp's load takes KPI rows, KPI cache
     * lines, where a lane a row took 32; a warp's 32 keys in R rounds */
    constexpr int LPK = DH / 8, KPI = 32 / LPK, R = 32 / KPI;
    const int c = lane % LPK, grp = lane / LPK;
    const mk_geo g = *gp;
    const longlong2 i1 = g.i1;
    mk_head H;
    att_head(a, u, g, b, H, DH, REL);
    bf16 *out = a.att + (size_t)b * a.A + (size_t)H.h * DH;
    /* LL (TAG): the stream's query, key and value of the head as QKV's tagged words, read as they land */
    const unsigned long long *ql = a.qll + (size_t)b * 3 * a.A + (size_t)H.h * DH;
    if (H.zero) {   /* a zero mask: zeros; the key is still the window's */
        if (tid < DH) {
            if (H.sp == 0 && wtag) ll_put(a.all + (size_t)b * a.A + (size_t)H.h * DH + tid, 0.0f, wtag);
            else if (H.sp == 0) out[tid] = __float2bfloat16(0.0f);
            if (H.kd) H.kd[tid] = tag ? ll_get1(ql + a.A + tid, tag) : __ldcg(H.nk + tid);
        }
        if (a.wo1 && H.sp == 0 && !wtag) att_done(a, b, H.h, ph);
        return;
    }
    /* every load at once: the lane's dims of the query, the step's key and value where this item writes them,
     * the rows of its keys, their masks (relative attention: v . r); with LL the rows of the ring first, then
     * QKV's words, polled */
    bf16 nkd = __float2bfloat16(0.0f), nvd = nkd;
    uint4 qraw = make_uint4(0, 0, 0, 0);
    if (!tag) {
        if (tid < DH) {
            if (H.kd) nkd = __ldcg(H.nk + tid);
            if (H.vd) nvd = __ldcg(H.nv + tid);
        }
        qraw = __ldcg((const uint4 *)(H.nk - a.A) + c);
    }
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    uint4 kk[R], vv[R], pp[R];   /* (a lane's 8 dims of a key, value and position row: bf16, bf16, bf16 or fp16) */
    float mw[R];                 /* adaptive-span: the mask; relative attention: v . r (scaled) */
    unsigned okm = 0, own = 0;   /* (own: LL, relative attention: the step's own key, from QKV's words) */
#pragma unroll
    for (int r = 0; r < R; r++) {
        mk_key K;
        att_key(a, H, 32 * warp + KPI * r + grp, K, DH, REL);
        okm |= K.ok ? 1u << r : 0u;
        const bool mine = REL && tag && K.ok && K.k == H.nk;
        own |= mine ? 1u << r : 0u;
        kk[r] = K.ok && !mine ? __ldcg((const uint4 *)K.k + c) : z4;
        vv[r] = K.vok && !mine ? __ldcg((const uint4 *)K.v + c) : z4;
        pp[r] = K.ok ? __ldg((const uint4 *)(REL ? (const void *)K.ph : (const void *)K.pb) + c) : z4;
        mw[r] = rel ? (K.ok ? __ldg(H.vrh + (size_t)K.md * a.K) : 0.0f) : K.vok ? __ldg(a.derived + i1.y + K.md - 1) : 0.0f;
    }
    if (tag) {
        qraw = ll_get8(ql + 8 * c, tag);
        if (tid < DH) {
            if (H.kd) nkd = ll_get1(ql + a.A + tid, tag);
            if (H.vd) nvd = ll_get1(ql + 2 * a.A + tid, tag);
        }
        if (REL && own)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (own >> r & 1u) kk[r] = ll_get8(ql + a.A + 8 * c, tag), vv[r] = ll_get8(ql + 2 * a.A + 8 * c, tag);
    }
    mk_point(a, 5, ph);
    float q[8], qr[8];
    bf8(qraw, q);
#pragma unroll
    for (int e = 0; e < 8; e++) qr[e] = q[e];
    if (rel)   /* q + u (u lies as the file has it: any float's alignment) */
#pragma unroll
        for (int e = 0; e < 8; e++) q[e] += __ldg(u->rwb + H.h * DH + 8 * c + e);
    /* the lane's part of each score, summed over the key's LPK lanes */
    float sc[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        float kf[8], t0 = 0.0f;
        bf8(kk[r], kf);
        if (!rel) {
            float pf[8];
            bf8(pp[r], pf);
#pragma unroll
            for (int e = 0; e < 8; e++) t0 = fmaf(q[e], kf[e] + pf[e], t0);
        } else {   /* (q + u) . k + q . r (fp16 r); v . r comes from the table */
            const unsigned w[4] = {pp[r].x, pp[r].y, pp[r].z, pp[r].w};
            float pf[8];
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const float2 f = __half22float2(*(const __half2 *)&w[x]);
                pf[2 * x] = f.x, pf[2 * x + 1] = f.y;
            }
            float bd = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) t0 = fmaf(q[e], kf[e], t0), bd = fmaf(qr[e], pf[e], bd);
            t0 += bd;
        }
        sc[r] = t0;
    }
#pragma unroll
    for (int o = 1; o < LPK; o <<= 1)
#pragma unroll
        for (int r = 0; r < R; r++) sc[r] += __shfl_xor_sync(0xffffffffu, sc[r], o);
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < R; r++) {
        sc[r] = okm >> r & 1u ? (rel ? fmaf(sc[r], a.rel_scale, mw[r]) : sc[r] / sqrtf((float)DH)) : -INFINITY;
        mx = fmaxf(mx, sc[r]);
    }
    mk_point(a, 6, ph);
    /* the warp's softmax and weighted values (M, Z = sum e, W = sum e mw, O = sum e mw v), over the key groups (no
     * branch around the shuffles: every lane reaches each) */
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float z = 0.0f, wsum = 0.0f, acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float e = sc[r] == -INFINITY ? 0.0f : expf(sc[r] - mx), w = rel ? e : e * mw[r];
        float vf[8];
        bf8(vv[r], vf);
        z += e;
        wsum += w;
#pragma unroll
        for (int x = 0; x < 8; x++) acc[x] = fmaf(w, vf[x], acc[x]);
    }
    mk_point(a, 7, ph);
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) {
        z += __shfl_xor_sync(0xffffffffu, z, o);
        wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
#pragma unroll
        for (int x = 0; x < 8; x++) acc[x] += __shfl_xor_sync(0xffffffffu, acc[x], o);
    }
    if (grp == 0) {
        *(float4 *)&sm->o[warp][8 * c] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        *(float4 *)&sm->o[warp][8 * c + 4] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
    if (lane == 0) sm->m[warp] = mx, sm->z[warp] = z, sm->w[warp] = wsum;
    __syncthreads();
    mk_point(a, 8, ph);
    /* the block's warps met */
    float M = -INFINITY;
    for (int v = 0; v < MK_WARPS; v++) M = fmaxf(M, sm->m[v]);
    float Z = 0.0f, W = 0.0f;
    for (int v = 0; v < MK_WARPS; v++) {
        const float ev = sm->m[v] == -INFINITY ? 0.0f : expf(sm->m[v] - M);
        Z += sm->z[v] * ev;
        W += sm->w[v] * ev;
        if (tid == v) sm->ev[v] = ev;
    }
    __syncthreads();   /* (and the block's reads are done) */
    mk_point(a, 9, ph);
    if (tid < DH) {
        float o = 0.0f;
        for (int v = 0; v < MK_WARPS; v++) o += sm->o[v][tid] * sm->ev[v];
        O[tid] = o;
        if (H.kd) H.kd[tid] = nkd;
        if (H.vd) H.vd[tid] = nvd;
    }
    const int nsplit = H.nsplit;
    if (nsplit > 1) {   /* the split's record; the last split to finish meets them all */
        float *rec = a.part + (((size_t)b * a.K + H.h) * a.nsmax + H.sp) * MK_REC;
        if (tid < DH) rec[4 + tid] = O[tid];
        if (tid == 0) rec[0] = M, rec[1] = Z, rec[2] = W;
        /* thread 0's add releases the block's records (the barrier orders them before it) and acquires the
         * others' */
        __syncthreads();
        if (tid == 0) sm->last = atom_add_acq_rel(a.cnt + b * a.K + H.h, 1) == nsplit - 1;
        __syncthreads();
        if (!sm->last) return;
        const float *r0 = a.part + ((size_t)b * a.K + H.h) * a.nsmax * MK_REC;
        {
            /* one round of loads for up to G x 8 splits (more take more rounds): record T's (m, Z, W) by thread T,
             * dim tid % DH of records tid / DH + k G by every thread, summed in G groups */
            constexpr int G = MK_THREADS / DH, PER = 8;
            const int dd = tid % DH, grp = tid / DH;
            float ov[PER];
#pragma unroll
            for (int k = 0; k < PER; k++) {
                const int x = grp + k * G;
                ov[k] = x < nsplit ? __ldcg(r0 + (size_t)x * MK_REC + 4 + dd) : 0.0f;
            }
            if (tid < nsplit) {
                const float4 v = __ldcg((const float4 *)(r0 + (size_t)tid * MK_REC));
                sm->rm[tid] = v.x, sm->rz[tid] = v.y, sm->rw[tid] = v.z;
            }
            __syncthreads();
            M = -INFINITY;
            for (int x = 0; x < nsplit; x++) M = fmaxf(M, sm->rm[x]);
            float o = 0.0f;
            for (int x0 = 0;; x0 += G * PER) {
#pragma unroll
                for (int k = 0; k < PER; k++) {
                    const int x = x0 + grp + k * G;
                    if (x < nsplit && sm->rm[x] != -INFINITY) o += ov[k] * expf(sm->rm[x] - M);
                }
                if (x0 + G * PER >= nsplit) break;
#pragma unroll
                for (int k = 0; k < PER; k++) {
                    const int x = x0 + G * PER + grp + k * G;
                    ov[k] = x < nsplit ? __ldcg(r0 + (size_t)x * MK_REC + 4 + dd) : 0.0f;
                }
            }
            sm->o[grp][dd] = o;
            if (tid < nsplit) sm->ev2[tid] = sm->rm[tid] == -INFINITY ? 0.0f : expf(sm->rm[tid] - M);
            __syncthreads();
            Z = W = 0.0f;
            for (int x = 0; x < nsplit; x++) Z += sm->rz[x] * sm->ev2[x], W += sm->rw[x] * sm->ev2[x];
            if (tid < DH) {
                o = 0.0f;
#pragma unroll
                for (int v = 0; v < G; v++) o += sm->o[v][tid];
                O[tid] = o;
            }
            if (tid == 0) a.cnt[b * a.K + H.h] = 0;
        }
    }
    if (tid < DH) {
        const float v = rel ? O[tid] / Z : O[tid] / Z / (W / Z + 1e-8f);
        if (wtag) ll_put(a.all + (size_t)b * a.A + (size_t)H.h * DH + tid, v, wtag);   /* (LL, WO1: for wo_piece) */
        else out[tid] = __float2bfloat16(v);
    }
    if (a.wo1 && !wtag) att_done(a, b, H.h, ph);
}

/* Item IT of sublayer U's attention (stream it / nitems) into G, loaded
 * now */
static __device__ __forceinline__ void geo_load(const mk_args &a, const mk_sub *u, int it, mk_geo &g)
{
    const int b = it / u->nitems;
    const mk_item *ip = u->items + it % u->nitems;
    g.i0 = __ldg((const int4 *)ip);
    g.i1 = __ldg((const longlong2 *)ip + 1);
    g.pos = __ldg(a.pos + b);
    g.ring = __ldg((const unsigned long long *)a.ring + b);
    g.mlen = u->kind == MK_REL ? __ldg(a.len + (size_t)b * a.nl + u->layer) : 0;
}

/* The block's first item of each attention sublayer s into G0[s], a
 * thread a sublayer (from the plan in global memory), as one group of
 * copies, when the step starts: the attention's phase need not wait for a
 * load to find its rows. Landed (and seen by the block) once the step's
 * first linear layer has waited for its rows and the block has passed the
 * first barrier. */
static __device__ __noinline__ void geo_cache(const mk_args &a, mk_geo *G0)
{
    for (int s = threadIdx.x; s < a.nsub; s += blockDim.x) {
        const mk_sub *u = a.subs + s;
        const int kind = u->kind, n = u->nitems, it = blockIdx.x;
        if (kind == MK_FFN || it >= a.B * n) continue;
        const int b = it / n;
        const mk_item *ip = u->items + it % n;
        cp16(&G0[s].i0, ip);
        cp16(&G0[s].i1, (const char *)ip + 16);
        cp8(&G0[s].pos, a.pos + b);
        cp8(&G0[s].ring, a.ring + b);
        if (kind == MK_REL) cp4(&G0[s].mlen, a.len + (size_t)b * a.nl + u->layer);
    }
    cp_commit();
}

/* The attention phase of sublayer U: its items over the grid, the first's
 * inputs in G0 (geo_cache's), the others' loaded into G by thread 0 */
static __device__ void att_phase(const mk_args &a, const mk_sub *u, mk_att_sm *sm, float *O, const mk_geo *g0, mk_geo *gl,
                                 int ph, unsigned tag, unsigned wtag)
{
    for (int it = blockIdx.x; it < a.B * u->nitems; it += gridDim.x) {
        const mk_geo *g = g0;
        if (it != (int)blockIdx.x) {
            if (threadIdx.x == 0) geo_load(a, u, it, *gl);
            __syncthreads();
            g = gl;
        }
        const int b = it / u->nitems;
        if (u->kind == MK_REL) {
            if (a.dh == 64) att_item<64, true>(a, u, g, b, sm, O, ph, tag, wtag);
            else att_item<32, true>(a, u, g, b, sm, O, ph, tag, wtag);
        } else {
            if (a.dh == 64) att_item<64, false>(a, u, g, b, sm, O, ph, tag, wtag);
            else att_item<32, false>(a, u, g, b, sm, O, ph, tag, wtag);
        }
        __syncthreads();
    }
}

/* ------------------------------------------------------------ the step */

__global__ static void __launch_bounds__(MK_THREADS, 1) mk_kernel(const __grid_constant__ mk_args a0)
{
    /* the arguments into shared memory: the functions below take them by reference, and a reference to a kernel
     * parameter is a generic load from global memory, which every barrier's fence sends back to L2 */
    __shared__ mk_args sa;
    static_assert(sizeof(mk_args) % sizeof(int) == 0, "mk_args is copied as ints");
    for (int i = threadIdx.x; i < (int)(sizeof(mk_args) / sizeof(int)); i += blockDim.x)
        ((int *)&sa)[i] = ((const int *)&a0)[i];
    __syncthreads();
    const mk_args &a = sa;
    extern __shared__ uint4 smraw[];
    float *xs = (float *)smraw;
    uint4 *const buf0 = smraw + MK_XS_BYTES / sizeof(uint4);   /* buffer i: buf0 + i x MK_BUF_VECS */
    mk_sub *S = (mk_sub *)(smraw + MK_FIXED_SMEM / sizeof(uint4));
    mk_lin *Ls = (mk_lin *)(S + a.nsub);
    float *lnp = (float *)(Ls + a.nlin);   /* the next LayerNorm's weights (ln_issue) */
    mk_geo *G0 = (mk_geo *)(lnp + 3 * MK_MAX_D);   /* each attention's first item of the block (geo_cache) */
    __shared__ mk_att_sm asm_;
    __shared__ float O[MK_MAX_DH];
    __shared__ double dred[32];
    __shared__ float fred[32];
    __shared__ mk_geo geo;
    __shared__ __align__(16) float z8[8];   /* zeros (ffn_fc1_t) */
    const int B = a.B, D = a.D, A = a.A, I = a.I;
    const float *xi = a.X0;
    float *xo = a.X1;
    const mk_sub *prev = NULL;
    int ph = 0;   /* barriers passed */
    if (a.trace && threadIdx.x == 0) {
        const unsigned long long t = globaltimer();
        if (blockIdx.x == 0) a.trace[gridDim.x] = t;
        a.trace[mk_trace_at(a.nbar, gridDim.x, 0, 0, blockIdx.x)] = clock64();
    }
    if (threadIdx.x < 8) z8[threadIdx.x] = 0.0f;
    /* the first two linear layers' rows, then the plan into shared memory */
    wbuf_issue(a.lin, a.nlin > 0, buf0, lin_role(a, a.subs, 0));
    geo_cache(a, G0);   /* (the first linear layer waits for it with its rows) */
    wbuf_issue(a.lin + 1, a.nlin > 1, buf0 + MK_BUF_VECS, lin_role(a, a.subs, 1));
    {
        const int ns = a.nsub * (int)(sizeof(mk_sub) / sizeof(uint4)), nl = a.nlin * (int)(sizeof(mk_lin) / sizeof(uint4));
        for (int i = threadIdx.x; i < ns; i += blockDim.x) ((uint4 *)S)[i] = __ldg((const uint4 *)a.subs + i);
        for (int i = threadIdx.x; i < nl; i += blockDim.x) ((uint4 *)Ls)[i] = __ldg((const uint4 *)a.lin + i);
    }
    __syncthreads();
    /* (no L2 prefetch of the attentions' rows: with the weights first to evict the rings stay in L2, and the
     * prefetch's own work, in a barrier's shadow or a half block's, cost more than it saved; H200: 1 session +4
     * to +7%, 8 sessions +2 to +5% without it) */
    int j = 0;                        /* linear layers done */
    int f = a.acc0;                   /* FFN: the next feed-forward's buffer */
    const long long *racc = NULL;     /* FFN: the sublayer before's sums, when it was one */
    for (int s = 0; s < a.nsub; s++) {
        const mk_sub *u = &S[s];
        mk_input(a, prev == NULL, xi, xo, xs, lnp, racc, ph);
        { float *t = (float *)xi; xi = xo; xo = t; }
        mk_point(a, 1, ph);
        racc = NULL;
        if (u->kind == MK_FFN && a.fuse) {   /* FFN: one phase (ffn_fused), both buffers' copies in its shadow */
            long long *acc = a.acc + (size_t)f * MK_ACC_LEN(D);
            ffn_fused(a, &Ls[j], &Ls[j + 1], u->b1, xs, buf0 + (j & 1) * MK_BUF_VECS, buf0 + ((j + 1) & 1) * MK_BUF_VECS,
                      acc, a.acc + (size_t)(f == 2 ? 0 : f + 1) * MK_ACC_LEN(D), z8);
            mk_point(a, 2, ph);
            grid_arrive(a, ph);
            ln_issue(u, lnp, D);
            wbuf_issue(&Ls[j + 2], j + 2 < a.nlin, buf0 + (j & 1) * MK_BUF_VECS, lin_role(a, S, j + 2));
            wbuf_issue(&Ls[j + 3], j + 3 < a.nlin, buf0 + ((j + 1) & 1) * MK_BUF_VECS, lin_role(a, S, j + 3));
            j += 2;
            ph = grid_wait(a, ph);
            racc = acc;
            f = f == 2 ? 0 : f + 1;
            prev = u;
            continue;
        }
        if (u->kind == MK_FFN) {
            gemv(EPI_BIAS_RELU, &Ls[j], xs, D, B, a.ff, NULL, u->b1, buf0 + (j & 1) * MK_BUF_VECS);
            mk_point(a, 2, ph);
            grid_arrive(a, ph);
            wbuf_issue(&Ls[j + 2], j + 2 < a.nlin, buf0 + (j & 1) * MK_BUF_VECS, lin_role(a, S, j + 2));
            j++;
            ph = grid_wait(a, ph);
            load_rows(xs, a.ff, I, B);
            mk_point(a, 1, ph);
            if (B == 1 && I == 2048 && Ls[j].out <= 2 * (int)gridDim.x * MK_WARPS) {   /* (one stream, one pass) */
                cp_wait_but_last();
                gemv_first8(&Ls[j], xs, a.r, buf0 + (j & 1) * MK_BUF_VECS);
            } else
                gemv(EPI_BF16, &Ls[j], xs, I, B, a.r, NULL, NULL, buf0 + (j & 1) * MK_BUF_VECS);
        } else {
            /* LL: QKV's outputs as tagged words, and the block on to its attention items with no barrier */
            const unsigned tag = a.llq ? a.ll << 7 | (unsigned)s : 0u, wtag = a.llw ? a.ll << 7 | (unsigned)s : 0u;
            if (tag) gemv(EPI_LL, &Ls[j], xs, D, B, NULL, (float *)a.qll, NULL, buf0 + (j & 1) * MK_BUF_VECS, tag);
            else {
                gemv(EPI_BF16, &Ls[j], xs, D, B, a.qkv, NULL, NULL, buf0 + (j & 1) * MK_BUF_VECS);
                mk_point(a, 2, ph);
                grid_arrive(a, ph);
            }
            wbuf_issue(&Ls[j + 2], j + 2 < a.nlin, buf0 + (j & 1) * MK_BUF_VECS, lin_role(a, S, j + 2));
            j++;
            if (!tag) {
                ph = grid_wait(a, ph);
                mk_point(a, 1, ph);
            } else
                __syncthreads();   /* (the block's copies of G0, waited for by each thread in gemv: seen by all) */
            att_phase(a, u, &asm_, O, G0 + s, &geo, ph, tag, wtag);
            if (a.wo1) {   /* WO1: the block's piece of Wo (wo_piece) in the attention's phase */
                long long *acc = a.acc + (size_t)f * MK_ACC_LEN(D);
                cp_wait_but_last();   /* (its weights: the group before the newest) */
                if (a.dh == 64) wo_piece<64>(a, buf0 + (j & 1) * MK_BUF_VECS, acc, a.bar_base + (unsigned long long)ph + 1, wtag);
                else wo_piece<32>(a, buf0 + (j & 1) * MK_BUF_VECS, acc, a.bar_base + (unsigned long long)ph + 1, wtag);
                acc_zero(a.acc + (size_t)(f == 2 ? 0 : f + 1) * MK_ACC_LEN(D), D);
                mk_point(a, 2, ph);
                grid_arrive(a, ph);
                ln_issue(u, lnp, D);
                wbuf_issue(&Ls[j + 2], j + 2 < a.nlin, buf0 + (j & 1) * MK_BUF_VECS, lin_role(a, S, j + 2));
                j++;
                ph = grid_wait(a, ph);
                racc = acc;
                f = f == 2 ? 0 : f + 1;
                prev = u;
                continue;
            }
            mk_point(a, 2, ph);
            ph = grid_sync(a, ph);
            load_rows(xs, a.att, A, B);
            mk_point(a, 1, ph);
            gemv(EPI_BF16, &Ls[j], xs, A, B, a.r, NULL, NULL, buf0 + (j & 1) * MK_BUF_VECS);
        }
        mk_point(a, 2, ph);
        grid_arrive(a, ph);
        ln_issue(u, lnp, D);
        wbuf_issue(&Ls[j + 2], j + 2 < a.nlin, buf0 + (j & 1) * MK_BUF_VECS, lin_role(a, S, j + 2));
        j++;
        ph = grid_wait(a, ph);
        prev = u;
    }
    if (a.xb) {
        /* ADA: the output layer's input, x and bf16(x), for the adaptive softmax's launches after the kernel: block
         * 0 alone, into X0 (its rows' loads come before its stores, a warp a row, and no other block reads them) */
        if (blockIdx.x == 0) mk_input(a, prev == NULL, xi, a.X0, xs, lnp, racc, ph, a.xb);
        return;
    }
    mk_input(a, prev == NULL, xi, xo, xs, lnp, racc, ph);
    mk_point(a, 1, ph);
    gemv(EPI_FLOAT, &Ls[j], xs, D, B, NULL, a.logits, NULL, buf0 + (j & 1) * MK_BUF_VECS);
    mk_point(a, 2, ph);
    ph = grid_sync(a, ph);
    mk_point(a, 1, ph);
    /* log_softmax(y + b), a block a row, as logsoftmax.cu */
    for (int b = blockIdx.x; b < B; b += gridDim.x) {
        float *row = a.logits + (size_t)b * a.V;
        float mx = -INFINITY;
        for (int j2 = threadIdx.x; j2 < a.V; j2 += blockDim.x) {
            const float v = __ldcg(row + j2) + (a.out_b ? __ldg(a.out_b + j2) : 0.0f);
            row[j2] = v;
            mx = fmaxf(mx, v);
        }
        mx = block_max(mx, fred);
        double sum = 0;
        for (int j2 = threadIdx.x; j2 < a.V; j2 += blockDim.x) sum += (double)expf(row[j2] - mx);
        const double lse = mx + log(block_sum(sum, dred));
        for (int j2 = threadIdx.x; j2 < a.V; j2 += blockDim.x) row[j2] = (float)((double)row[j2] - lse);
    }
    mk_point(a, 2, ph);
}

/* ------------------------------------------------------------ the plan */

void gpu_mk_free(gpu_mk *k)
{
    if (!k) return;
    cudaFree(k->d_subs);
    cudaFree(k->d_items);
    cudaFree(k->d_lin);
    cudaFree(k->d_part);
    cudaFree(k->d_trace);
    cudaFree(k->d_qll);
    free(k);
}

/* Whether every attention layer of a relative-attention model has
 * attn_mma.cu's fp16 r table and its v . r table */
static bool mk_rel_tables(const gpu_model *g)
{
    for (int l = 0; l < g->m->n_layers; l++)
        if ((g->fam->sublayers(g->m, l) & GPU_SUB_ATTN) && (!g->L[l].rk16 || !g->L[l].vr)) return false;
    return true;
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
    else if (!g->ada && (!g->emb || !g->out_h)) snprintf(why, cap, "no bf16 output layer");
    else if (m->pre_lnorm) snprintf(why, cap, "pre-LN");
    else if (m->d_head != 32 && m->d_head != 64)
        snprintf(why, cap, "heads of %d dims (it takes 32 or 64)", m->d_head);
    else if (D % 128 || A % 8 || I % 8 || D > MK_MAX_D || A > MK_MAX_IN || I > MK_MAX_IN)
        snprintf(why, cap, "widths %d, %d, %d (it takes a model of a multiple of 128 up to %d, heads and inner layer "
                 "of a multiple of 8 up to %d)", D, A, I, MK_MAX_D, MK_MAX_IN);
    else if (g->fam == &gpu_family_aspan && !g->pe_h) snprintf(why, cap, "no bf16 key_pe table");
    else if (g->fam == &gpu_family_rel && !mk_rel_tables(g))
        snprintf(why, cap, "an r_net row past fp16's range (its attention takes attn_mma.cu's fp16 table)");
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

static void lin_init(mk_lin *L, const bf16 *W, int out, int in)
{
    L->W = W;
    L->out = out;
    L->in = in;
}

/* A step's mode: whether its feed-forwards take one phase (FFN), its
 * attentions' Wo none of its own (WO1) */
enum { MK_MODE_FFN = 1, MK_MODE_WO1 = 2, MK_MODE_LL = 4 };
static int mk_mode(const mk_args *a)
{
    return (a->fuse ? MK_MODE_FFN : 0) | (a->wo1 ? MK_MODE_WO1 : 0) | (a->llq ? MK_MODE_LL : 0);
}

/* The kinds of a step's barriers in MODE into OUT (NULL: none), their
 * count returned: the plan's, with FFN each feed-forward's fc1 and fc2 one
 * F, with WO1 no Wo */
static int mk_kinds(const gpu_mk *k, int mode, char *out)
{
    int n = 0;
    for (int p = 0; p < k->nbar; p++) {
        const char c = k->kind[p];
        if ((c == 'W' && (mode & MK_MODE_WO1)) || (c == '2' && (mode & MK_MODE_FFN)) || (c == 'Q' && (mode & MK_MODE_LL)))
            continue;
        if (out) out[n] = c == '1' && (mode & MK_MODE_FFN) ? 'F' : c;
        n++;
    }
    return n;
}

int gpu_mk_plan(gpu_model *g, char *why, size_t cap, char *err)
{
    const model_t *m = g->m;
    mk_why(g, why, cap);
    if (why[0]) return 0;
    const int K = m->n_head, nl = m->n_layers, DH = m->d_head, D = m->d_model, A = K * DH, I = m->d_inner;
    const bool rel = g->fam == &gpu_family_rel;
    /* the sublayers and the attention's items */
    int nsub = 0, nit = 0, nsmax = 1;
    for (int l = 0; l < nl; l++) {
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
    if (nsmax > MK_MAX_SPLITS) {
        snprintf(why, cap, "windows of %d keys (it takes up to %d)", nsmax * MK_SPLIT, MK_MAX_SPLITS * MK_SPLIT);
        return 0;
    }
    if (nsub > MK_MAX_SUBS) {
        snprintf(why, cap, "%d sublayers (it takes up to %d)", nsub, MK_MAX_SUBS);
        return 0;
    }
    const int nlin = 2 * nsub + (g->ada ? 0 : 1);   /* (ADA: the output layer is the adaptive softmax's launches) */
    int sub_items[MK_MAX_SUBS] = {0};   /* each sublayer's attention items a stream */
    mk_sub *subs = (mk_sub *)calloc((size_t)(nsub ? nsub : 1), sizeof *subs);
    mk_item *items = (mk_item *)calloc((size_t)(nit ? nit : 1), sizeof *items);
    mk_lin *lin = (mk_lin *)calloc((size_t)nlin, sizeof *lin);
    int64_t *moff = !rel ? (int64_t *)calloc((size_t)nl * K, sizeof *moff) : NULL;
    gpu_mk *k = (gpu_mk *)calloc(1, sizeof *k);
    int rc = subs && items && lin && k && (rel || moff) ? 0 : err_set(err, "out of memory");
    if (rc == 0 && !rel &&
        cudaMemcpy(moff, g->mask_off, (size_t)nl * K * sizeof *moff, cudaMemcpyDeviceToHost) != cudaSuccess)
        rc = err_set(err, "reading the span tables back failed");
    size_t nrec = (size_t)MK_MAX_B * K * nsmax * MK_REC, ncnt = (size_t)MK_MAX_B * K,
           nacc = 3 * MK_ACC_LEN(D) * sizeof(long long) / sizeof(float),   /* (after the barrier: 4 floats) */
           nflag = (size_t)MK_MAX_B * K * sizeof(unsigned long long) / sizeof(float);
    if (rc == 0 && (cudaMalloc(&k->d_subs, (size_t)(nsub ? nsub : 1) * sizeof *subs) != cudaSuccess ||
                    cudaMalloc(&k->d_items, (size_t)(nit ? nit : 1) * sizeof *items) != cudaSuccess ||
                    cudaMalloc(&k->d_lin, (size_t)nlin * sizeof *lin) != cudaSuccess ||
                    cudaMalloc(&k->d_part, (nrec + ncnt + 4 + nacc + nflag) * sizeof(float)) != cudaSuccess ||
                    cudaMemset(k->d_part, 0, (nrec + ncnt + 4 + nacc + nflag) * sizeof(float)) != cudaSuccess ||
                    cudaMalloc(&k->d_qll, (size_t)MK_MAX_B * 4 * A * sizeof *k->d_qll) != cudaSuccess ||
                    cudaMemset(k->d_qll, 0, (size_t)MK_MAX_B * 4 * A * sizeof *k->d_qll) != cudaSuccess))
        rc = err_set(err, "out of device memory for the decode kernel's plan");
    int s = 0, it = 0, nbar = 0, nffn = 0;
    for (int l = 0; rc == 0 && l < nl; l++) {
        const int sub = g->fam->sublayers(m, l);
        const gpu_layer *d = &g->L[l];
        if (sub & GPU_SUB_ATTN) {
            k->kind[nbar++] = 'Q', k->kind[nbar++] = 'A', k->kind[nbar++] = 'W';
            k->natt++;
            lin_init(&lin[2 * s], d->wqkv_h, 3 * A, D);
            lin_init(&lin[2 * s + 1], d->wo_h, D, A);
            mk_sub *u = &subs[s++];
            sub_init(u, rel ? MK_REL : MK_ASPAN, l, d->wqkv_h, d->wo_h, NULL, d->wo_b, d->ln1_w, d->ln1_b);
            if (rel) {
                u->rk16 = d->rk16;
                u->rwb = d->rwb;
                u->vr = d->vr;
            }
            u->items = k->d_items + it;
            sub_items[s - 1] = 0;
            for (int h = 0; h < K; h++) {
                const int ns = head_splits(m, rel, l, h);
                for (int sp = 0; sp < ns; sp++) {
                    mk_item *e = &items[it++];
                    e->code = h << 16 | sp;
                    if (rel) e->off = (long long)g->h_off[l] + (long long)h * DH;
                    else {
                        e->kw = m->layers[l].krows[h];
                        e->r = m->layers[l].reach[h];
                        e->off = (long long)g->h_off[(size_t)l * K + h];
                        e->mask_off = (long long)moff[(size_t)l * K + h];
                    }
                }
                u->nitems += ns;
                sub_items[s - 1] += ns;
            }
            if (!u->w1 || !u->w2) rc = err_set(err, "layer %d: no bf16 weights for the decode kernel", l);
        }
        if (sub & GPU_SUB_FFN) {
            k->kind[nbar++] = '1', k->kind[nbar++] = '2';
            nffn++;
            lin_init(&lin[2 * s], d->fc1_h, I, D);
            lin_init(&lin[2 * s + 1], d->fc2_h, D, I);
            mk_sub *u = &subs[s++];
            sub_init(u, MK_FFN, l, d->fc1_h, d->fc2_h, d->fc1_b, d->fc2_b, d->ln2_w, d->ln2_b);
            if (!u->w1 || !u->w2) rc = err_set(err, "layer %d: no bf16 weights for the decode kernel", l);
        }
    }
    if (rc == 0 && !g->ada) {
        k->kind[nbar++] = 'O';
        lin_init(&lin[2 * nsub], g->out_h, m->V, D);
    }
    if (rc == 0 && (cudaMemcpy(k->d_subs, subs, (size_t)nsub * sizeof *subs, cudaMemcpyHostToDevice) != cudaSuccess ||
                    cudaMemcpy(k->d_items, items, (size_t)(nit ? nit : 1) * sizeof *items, cudaMemcpyHostToDevice) !=
                        cudaSuccess ||
                    cudaMemcpy(k->d_lin, lin, (size_t)nlin * sizeof *lin, cudaMemcpyHostToDevice) != cudaSuccess))
        rc = err_set(err, "uploading the decode kernel's plan failed");
    free(subs);
    free(items);
    free(lin);
    free(moff);
    if (rc == 0) {
        mk_args *a = &k->a;
        a->subs = k->d_subs;
        a->lin = k->d_lin;
        a->nsub = nsub;
        a->nlin = nlin;
        a->nbar = k->nbar = nbar;
        k->nffn = nffn;
        a->D = D;
        a->A = A;
        a->I = I;
        a->K = K;
        a->dh = DH;
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
        a->pe_h = g->pe_h;
        a->X0 = g->x;
        a->X1 = g->tmp;
        a->qkv = g->qkvb;
        a->att = g->attb;
        a->r = g->tmpb;
        a->ff = g->ffb;
        a->logits = g->logits;
        a->xb = g->ada ? g->xb : NULL;
        a->part = k->d_part;
        a->cnt = (int *)(k->d_part + nrec);
        a->bar = (unsigned long long *)(k->d_part + nrec + ncnt);   /* (nrec and ncnt are even: 8-byte aligned) */
        a->acc = (long long *)(k->d_part + nrec + ncnt + 4);   /* (16-byte aligned: mk_input reads longlong2s) */
        a->flag = (unsigned long long *)(k->d_part + nrec + ncnt + 4 + nacc);
        a->qll = k->d_qll;
        a->all = k->d_qll + (size_t)MK_MAX_B * 3 * A;
        a->tok = stage_tok(g, g->d_stage);
        a->pos = stage_pos(g, g->d_stage);
        a->ring = (bf16 *const *)stage_ring(g, g->d_stage);
        a->len = stage_len(g, g->d_stage);
        k->smem = MK_FIXED_SMEM + (size_t)nsub * sizeof(mk_sub) + (size_t)nlin * sizeof(mk_lin) + 3 * MK_MAX_D * sizeof(float) +
                  (size_t)nsub * sizeof(mk_geo);
        int per_sm = 0;
        if (cudaFuncSetAttribute(mk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k->smem) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mk_kernel, MK_THREADS, k->smem) != cudaSuccess) {
            cudaGetLastError();
            snprintf(why, cap, "the kernel cannot be set up on this device (%zu bytes of shared memory)", k->smem);
        } else if (per_sm < 1)
            snprintf(why, cap, "no block of the kernel fits an SM");
        k->grid = g->n_sm;
        /* FFN: a block's 16 rows of fc1 (the inner layer a multiple of 16, at most 16 a block; a model of 128, 256
         * or 512: ffn_fc1_t) and fc2's 16 columns of them, two rows a thread */
        k->ffn_ok = I % MK_FUSE_ROWS == 0 && I / MK_FUSE_ROWS <= k->grid && (D == 128 || D == 256 || D == 512);
        if (D != 128 && D != 256 && D != 512)
            snprintf(k->ffn_why, sizeof k->ffn_why, "a model of %d (one phase takes 128, 256 or 512)", D);
        else if (!k->ffn_ok)
            snprintf(k->ffn_why, sizeof k->ffn_why,
                     "an inner layer of %d (one phase takes a multiple of %d up to %d, %d a block on %d SMs)", I,
                     MK_FUSE_ROWS, MK_FUSE_ROWS * k->grid, MK_FUSE_ROWS, k->grid);
        /* WO1: the pieces of Wo (wo_geom) one a block */
        const int rp = MK_THREADS / (DH / 8);
        k->wo_ok = D % rp == 0 && K * (D / rp) <= k->grid;
        if (!k->wo_ok)
            snprintf(k->wo_why, sizeof k->wo_why, "%d pieces of Wo (%d heads x a model of %d / %d rows) for %d SMs", K * (D / rp),
                     K, D, rp, k->grid);
        for (int mode = 0; mode < 8; mode++) k->nbar_mode[mode] = mk_kinds(k, mode, NULL);
        int maxit = 1;
        for (int i = 0; i < nsub; i++)
            if (sub_items[i] > maxit) maxit = sub_items[i];
        k->auto_b = MK_AUTO_ROUNDS * k->grid / maxit;
        if (k->auto_b > MK_MAX_B) k->auto_b = MK_MAX_B;
        if (g->ada && k->auto_b > MK_ADA_AUTO_B) k->auto_b = MK_ADA_AUTO_B;
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
    k->a.fuse = k->ffn_ok && B <= g->mk_fuse;
    k->a.wo1 = k->wo_ok && B <= MK_WO_MAX_B && g->mk_wo;
    k->a.ll = 0;
    k->a.llq = (g->mk_ll & GPU_LL_QKV) != 0;
    k->a.llw = (g->mk_ll & GPU_LL_WO) != 0 && k->a.wo1;
    if (k->a.llq || k->a.llw) {   /* LL: a new epoch; at the wrap every word's tag back to 0, below any epoch's */
        if (++k->ll_epoch >= MK_LL_EPOCHS) {
            if (cudaMemsetAsync(k->d_qll, 0, (size_t)MK_MAX_B * 4 * k->a.A * sizeof *k->d_qll, g->stream) != cudaSuccess) {
                k->ll_epoch--;   /* (the next step tries the wrap again) */
                return err_set(err, "decode kernel: zeroing the LL words failed: %s", cudaGetErrorString(cudaGetLastError()));
            }
            k->ll_epoch = 1;
        }
        k->a.ll = k->ll_epoch;
    }
    k->a.nbar = k->nbar_mode[mk_mode(&k->a)];
    k->a.bar_base = k->arrivals;
    if (k->a.trace)   /* (a block records only the points it passes: none left from an earlier step) */
        cudaMemsetAsync(k->d_trace, 0, mk_trace_at(k->nbar, k->grid, MK_POINTS, 0, 0) * sizeof *k->d_trace, g->stream);
    /* an adaptive input: its rows into X0 first (adaptive.cu), where the first sublayer's input reads them */
    if (!k->a.emb && gpu_ada_embed(g, k->a.X0, NULL, k->a.tok, B, err)) return -1;
    void *args[] = {&k->a};
    cudaError_t e = cudaLaunchCooperativeKernel((const void *)mk_kernel, dim3((unsigned)k->grid), dim3(MK_THREADS), args,
                                                k->smem, g->stream);
    if (e != cudaSuccess) {
        /* the barrier's count starts again from 0 (a launch that failed passed none of it, or the context is lost) */
        cudaGetLastError();
        k->arrivals = 0;
        k->a.acc0 = 0;
        cudaMemsetAsync(k->a.bar, 0, sizeof *k->a.bar, g->stream);
        cudaMemsetAsync(k->a.acc, 0, 3 * MK_ACC_LEN(k->a.D) * sizeof *k->a.acc, g->stream);
        cudaMemsetAsync(k->a.flag, 0, (size_t)MK_MAX_B * k->a.K * sizeof *k->a.flag, g->stream);
        return err_set(err, "launching the decode kernel: %s", cudaGetErrorString(e));
    }
    k->arrivals += (unsigned long long)k->a.nbar * (unsigned long long)k->grid;
    k->a.acc0 = (k->a.acc0 + (k->a.fuse ? k->nffn : 0) + (k->a.wo1 ? k->natt : 0)) % 3;
    if (k->a.fuse) g->mk_ffn_steps++;
    if (k->a.wo1) g->mk_wo_steps++;
    return 0;
}

int gpu_decode_trace(gpu_model *g, int on, char *err)
{
    gpu_mk *k = g->mk;
    if (!k) return err_set(err, "no decode kernel: %s", g->mk_why);
    if (on && !k->d_trace) {
        const size_t n = mk_trace_at(k->nbar, k->grid, MK_POINTS, 0, 0);   /* (a step without FFN has the most) */
        CU_TRY(cudaMalloc(&k->d_trace, n * sizeof *k->d_trace), err, "cudaMalloc (decode trace)");
        CU_TRY(cudaMemset(k->d_trace, 0, n * sizeof *k->d_trace), err, "cudaMemset (decode trace)");
    }
    k->a.trace = on ? k->d_trace : NULL;
    return 0;
}

/* The latest of block times T[b] - F[b] over the G blocks (F NULL: 0) */
static double trace_max(const unsigned long long *t, const unsigned long long *f, size_t G)
{
    double mx = 0;
    for (size_t b = 0; b < G; b++) {
        const double v = (double)t[b] - (f ? (double)f[b] : 0.0);
        if (v > mx) mx = v;
    }
    return mx;
}

int gpu_decode_trace_report(gpu_model *g, char *out, size_t cap, char *err)
{
    gpu_mk *k = g->mk;
    if (!k || !k->d_trace) return err_set(err, "no decode trace was taken");
    const int nb = k->a.nbar;   /* (the last step's) */
    char kind[MK_MAX_BARRIERS];
    mk_kinds(k, mk_mode(&k->a), kind);   /* (the last step's) */
    const size_t G = (size_t)k->grid, n = mk_trace_at(nb, k->grid, MK_POINTS, 0, 0);
    unsigned long long *t = (unsigned long long *)malloc(n * sizeof *t);
    if (!t) return err_set(err, "out of memory");
    if (cudaStreamSynchronize(g->stream) != cudaSuccess ||
        cudaMemcpy(t, k->d_trace, n * sizeof *t, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(t);
        return err_set(err, "copying the decode trace failed");
    }
    /* per kind of phase, summed over its phases: the phase (the last arrival less block 0's leaving of the barrier
     * before, in ns), its slowest block's start (after block 0's leaving) and, in the SM's cycles at the device's
     * clock rate, the slowest block's input, work and tail (from its work's end to its arrival); the barrier (block
     * 0's leaving less the last arrival) */
    int khz = 0, dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev) != cudaSuccess ||
        khz <= 0)
        khz = 1000000;
    const double cyc_us = 1e3 / khz;
    const char *kinds = "QAW12OF", *names[] = {"qkv", "attention", "wo", "fc1", "fc2", "output", "ffn"};
    double ph[7] = {0}, skew[7] = {0}, inp[7] = {0}, lnw[7] = {0}, work[7] = {0}, tail[7] = {0}, wait[7] = {0};
    double sub[7][6] = {{0}}, cyc0 = 0, ns0 = 0;
    int cnt[7] = {0};
    for (int p = 0; p < nb; p++) {
        const unsigned long long *row = t + (size_t)(p + 1) * (G + 1), start = t[(size_t)p * (G + 1) + G];
        const unsigned long long *c0 = t + mk_trace_at(nb, k->grid, 0, p, 0), *c1 = t + mk_trace_at(nb, k->grid, 1, p, 0),
                                 *c2 = t + mk_trace_at(nb, k->grid, 2, p, 0), *c3 = t + mk_trace_at(nb, k->grid, 3, p, 0),
                                 *c4 = t + mk_trace_at(nb, k->grid, 4, p, 0);
        const double last = trace_max(row, NULL, G);
        const int i = (int)(strchr(kinds, kind[p]) - kinds);
        ph[i] += (last - (double)start) / 1e3;
        /* (the start: from %globaltimer rows, the arrival less the block's own cycles since its start) */
        double sk = 0;
        for (size_t x = 0; x < G; x++) {
            const double v = (double)row[x] - (double)(c3[x] - c0[x]) * cyc_us * 1e3 - (double)start;
            if (v > sk) sk = v;
        }
        skew[i] += sk / 1e3;
        inp[i] += trace_max(c1, c0, G) * cyc_us;
        if (strchr("Q1OF", kind[p])) lnw[i] += trace_max(c4, c0, G) * cyc_us;
        work[i] += trace_max(c2, c1, G) * cyc_us;
        tail[i] += trace_max(c3, c2, G) * cyc_us;
        wait[i] += ((double)row[G] - last) / 1e3;
        cnt[i]++;
        /* the points inside: from the wait's end (the LayerNorm) or the start to 5, 5 to 6, ... 8 to 9 */
        for (int q = 5; q <= 9; q++) {
            const unsigned long long *cp = t + mk_trace_at(nb, k->grid, q == 5 && strchr("Q1OF", kind[p]) ? 4 : q == 5 ? 0 : q - 1, p, 0),
                                     *cq = t + mk_trace_at(nb, k->grid, q, p, 0);
            double mx = 0;
            for (size_t x = 0; x < G; x++)
                if (cq[x] && cp[x] && cq[x] > cp[x] && (double)(cq[x] - cp[x]) > mx) mx = (double)(cq[x] - cp[x]);
            sub[i][q - 5] += mx * cyc_us;
        }
        /* the SM's clock: block 0's cycles against %globaltimer over the phase */
        cyc0 += (double)(c3[0] - c0[0]);
        ns0 += (double)row[0] - (double)start;
    }
    const double total = (double)(t[(size_t)nb * (G + 1) + G] - t[G]) / 1e3;
    int w = snprintf(out, cap, "%.1f us to the last barrier:", total);
    w += snprintf(out + w, cap - (size_t)w, " (the SM's clock %.2f GHz)", ns0 > 0 ? cyc0 / ns0 : 0.0);
    for (int i = 0; i < 7 && w >= 0 && (size_t)w < cap; i++)
        if (cnt[i]) {
            w += snprintf(out + w, cap - (size_t)w,
                          " %s %d x (%.1f us: start %.1f, input %.1f (wait %.1f), work %.1f, tail %.1f; barrier %.1f us",
                          names[i], cnt[i], ph[i], skew[i], inp[i], lnw[i], work[i], tail[i], wait[i]);
            if (sub[i][0] + sub[i][1] + sub[i][2] > 0 && w >= 0 && (size_t)w < cap)
                w += snprintf(out + w, cap - (size_t)w, "; inside %.1f %.1f %.1f %.1f %.1f", sub[i][0], sub[i][1], sub[i][2],
                              sub[i][3], sub[i][4]);
            if (w >= 0 && (size_t)w < cap) w += snprintf(out + w, cap - (size_t)w, ");");
        }
    /* every phase in order: its kind, its time (us), and for an attention the slowest block's time to its
     * items' loads (point 5) and to its work's end */
    if (w >= 0 && (size_t)w < cap) w += snprintf(out + w, cap - (size_t)w, " phases:");
    for (int p = 0; p < nb && w >= 0 && (size_t)w < cap; p++) {
        const unsigned long long *row = t + (size_t)(p + 1) * (G + 1), start = t[(size_t)p * (G + 1) + G];
        w += snprintf(out + w, cap - (size_t)w, " %c%.1f", kind[p], (trace_max(row, NULL, G) - (double)start) / 1e3);
        if (kind[p] == 'A' && w >= 0 && (size_t)w < cap)
            w += snprintf(out + w, cap - (size_t)w, "(%.1f/%.1f)",
                          trace_max(t + mk_trace_at(nb, k->grid, 5, p, 0), t + mk_trace_at(nb, k->grid, 0, p, 0), G) * cyc_us,
                          trace_max(t + mk_trace_at(nb, k->grid, 2, p, 0), t + mk_trace_at(nb, k->grid, 0, p, 0), G) * cyc_us);
    }
    free(t);
    return 0;
}

int gpu_mk_limit(const gpu_model *g)
{
    if (!g->mk || g->mk_on == GPU_DECODE_GRAPHS) return 0;
    return g->mk_on == GPU_DECODE_KERNEL ? MK_MAX_B : g->mk->auto_b;
}

int gpu_mk_takes(const gpu_model *g, int B, int M) { return M == 1 && B >= 1 && B <= gpu_mk_limit(g); }

void gpu_decode_ffn(gpu_model *g, int max_b) { g->mk_fuse = max_b < 0 ? 0 : max_b > MK_FUSE_MAX_B ? MK_FUSE_MAX_B : max_b; }

int gpu_decode_ffn_default(void) { return MK_FUSE_DEFAULT_B; }

int gpu_decode_ffn_max(const gpu_model *g) { return g->mk_fuse; }

void gpu_decode_ll(gpu_model *g, int mode) { g->mk_ll = mode & (GPU_LL_QKV | GPU_LL_WO); }

int gpu_decode_ll_mode(const gpu_model *g) { return g->mk_ll; }

int gpu_decode_ll_wrap_in(gpu_model *g, long n)
{
    if (!g->mk) return -1;
    n = n < 0 ? 0 : n > (long)MK_LL_EPOCHS - 2 ? (long)MK_LL_EPOCHS - 2 : n;
    g->mk->ll_epoch = MK_LL_EPOCHS - 1 - (unsigned)n;
    return 0;
}

void gpu_decode_wo(gpu_model *g, int on) { g->mk_wo = on != 0; }

int gpu_decode_wo_on(const gpu_model *g) { return g->mk_wo; }

int gpu_decode_wo_status(const gpu_model *g, long *steps, const char **why)
{
    if (steps) *steps = g->mk_wo_steps;
    if (why) *why = !g->mk ? g->mk_why : g->mk->wo_why;
    return g->mk && g->mk->wo_ok;
}

int gpu_decode_ffn_status(const gpu_model *g, long *steps, const char **why)
{
    if (steps) *steps = g->mk_ffn_steps;
    if (why) *why = !g->mk ? g->mk_why : g->mk->ffn_why;
    return g->mk && g->mk->ffn_ok;
}
