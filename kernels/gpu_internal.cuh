/*
 * gpu_internal.cuh - what the files of kernels/ share: the device model
 * (weights, derived tables, per-step buffers), error checks, and the
 * launchers of each operation (one file each: embed.cu, matmul.cu,
 * bias_relu.cu, gelu.cu, layernorm.cu, aspan_attn.cu, rel_attn.cu,
 * gpt_attn.cu, gpt_rows.cu, ring.cu, logsoftmax.cu). gpu.cu loads and
 * plans; forward.cu runs a step (a window model's: fam_gpt.cu).
 */
#ifndef SPANSERVE_GPU_INTERNAL_CUH
#define SPANSERVE_GPU_INTERNAL_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "adaptive.h"
#include "err.h"
#include "model.h"
}
#include "gpu.h"

typedef __nv_bfloat16 bf16;

/* Loads and stores in either storage type, arithmetic in float. */
static __device__ __forceinline__ float ldf(const float *p) { return __ldg(p); }
static __device__ __forceinline__ float ldf(const bf16 *p) { return __bfloat162float(__ldg(p)); }
static __device__ __forceinline__ void stf(float *p, float v) { *p = v; }
static __device__ __forceinline__ void stf(bf16 *p, float v) { *p = __float2bfloat16(v); }

/* One 16-byte load of T as floats (P 16-byte aligned): 4 floats or 8 bf16. */
static __device__ __forceinline__ void unpack16(const float *p, float *o)
{
    const float4 v = __ldg((const float4 *)p);
    o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
}
static __device__ __forceinline__ void unpack16(const bf16 *p, float *o)
{
    const uint4 v = __ldg((const uint4 *)p);
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[k]);
        o[2 * k] = f.x, o[2 * k + 1] = f.y;
    }
}

/* The attention kernels' lanes over a head's dims, in either storage type.
 * Scores: of each 64 dims, lane L takes two, c0 = cb + pd0 and c1 = cb +
 * pd1: L and L + 32 in float (as core sums), 2L and 2L + 1 in bf16 (one
 * 4-byte load; GPU_BF16 needs an even d_head, so both or neither lie inside
 * the head). Values: of each 128 dims, lane L takes four, cb + vd(t, L). */
template <typename T> struct lanes;
template <> struct lanes<float> {
    static __device__ __forceinline__ int pd0(int l) { return l; }
    static __device__ __forceinline__ int pd1(int l) { return l + 32; }
    static __device__ __forceinline__ int vd(int t, int l) { return l + 32 * t; }
    /* a = p[c0], b = p[c1] where ok0, ok1; else 0 */
    static __device__ __forceinline__ void ld2(const float *p, int c0, int c1, bool ok0, bool ok1, float &a, float &b)
    {
        a = ok0 ? __ldg(p + c0) : 0.0f;
        b = ok1 ? __ldg(p + c1) : 0.0f;
    }
    /* o[t] = p[cb + vd(t, l)] for those below D; else 0 */
    static __device__ __forceinline__ void ld4(const float *p, int cb, int l, int D, bool ok, float o[4])
    {
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const int c = cb + l + 32 * t;
            o[t] = ok && c < D ? __ldg(p + c) : 0.0f;
        }
    }
};
template <> struct lanes<bf16> {
    static __device__ __forceinline__ int pd0(int l) { return 2 * l; }
    static __device__ __forceinline__ int pd1(int l) { return 2 * l + 1; }
    static __device__ __forceinline__ int vd(int t, int l) { return 64 * (t >> 1) + 2 * l + (t & 1); }
    static __device__ __forceinline__ void ld2(const bf16 *p, int c0, int c1, bool ok0, bool ok1, float &a, float &b)
    {
        (void)c1, (void)ok1;
        if (ok0) {
            const float2 f = __bfloat1622float2(__ldg((const __nv_bfloat162 *)(p + c0)));
            a = f.x;
            b = f.y;
        } else
            a = b = 0.0f;
    }
    static __device__ __forceinline__ void ld4(const bf16 *p, int cb, int l, int D, bool ok, float o[4])
    {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int c = cb + 64 * h + 2 * l;
            if (ok && c < D) {
                const float2 f = __bfloat1622float2(__ldg((const __nv_bfloat162 *)(p + c)));
                o[2 * h] = f.x;
                o[2 * h + 1] = f.y;
            } else
                o[2 * h] = o[2 * h + 1] = 0.0f;
        }
    }
};

#include "check.cuh"   /* CU_TRY, BLAS_TRY, LAUNCH_TRY */

/* cuBLAS's (and cublasLt's) workspace, one per model: a step never allocates */
#define GPU_BLAS_WORKSPACE (32u << 20)

/* matmul.cu: a cublasLt GEMM made once for its shapes (gpu_linear_bias_relu_lt) */
typedef struct {
    int n, in, out, mode;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} gpu_lt_plan;
#define GPU_LT_PLANS 16
void gpu_lt_plan_free(gpu_lt_plan *p);

/* The operations of a step, as gpu_profile counts them. */
enum { OP_EMBED, OP_QKV, OP_ATTN, OP_RING, OP_WO, OP_LN, OP_FC1, OP_RELU, OP_FC2, OP_OUT, OP_LOGSOFTMAX, OP_N };
#define GPU_PROF_EVENTS 2048

/* Device pointers of one layer or block (NULL where the kind has none). */
typedef struct {
    const float *wqkv;            /* aspan: [Wq; Wk; Wv], 3H x H (packed at load); par: qkv_net */
    const float *wo;              /* aspan proj_out, par o_net */
    const float *ln1_w, *ln1_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b, *ln2_w, *ln2_b;
    const float *rk;              /* par: r_net(sinusoid(t)), t = 0..rk_rows-1, A wide; par-tf: the seed's
                                   * table by position reversed (row t is position rk_rows-1-t: fam_rel.cu) */
    int rk_rows;
    const float *rwb, *rrb;       /* attention: Transformer-XL's u and v (shared, or the layer's own) */
    const float *pk, *pv;         /* aspan with persistent memory: key' and val' (K x N x D each, in `derived`) */
    const float *qkv_b, *wo_b;    /* gpt, par-tf: the attention's biases (NULL: none; so may ln1_b, ln2_b, fc1_b,
                                   * fc2_b be for gpt) */
    const float *wmask;           /* gpt-adaptive-span: K x window soft masks by distance from the window's end
                                   * (in `derived`), NULL without spans */
    /* GPU_BF16: the linear layers' weights in bfloat16 (NULL in GPU_FP32) */
    const bf16 *wqkv_h, *wo_h, *fc1_h, *fc2_h;
    const bf16 *fc1_bh;           /* GPU_BF16: fc1_b in bfloat16, for cublasLt's epilogue where it wants D's type */
    const __half *rk16;           /* GPU_BF16, relative attention: rk in fp16 for attn_mma.cu (or NULL: an r
                                   * row past fp16's range), */
    const float *vr;              /* and r_r_bias . rk per row and head (rk_rows x n_head) */
    const bf16 *pk_h, *pv_h;      /* GPU_BF16, persistent memory: pk and pv in bfloat16 for attn_mma.cu (or NULL) */
    /* GPU_BF16, post-LN: the first product of each sublayer with the LayerNorm before it folded in (W w, W b by
     * output: forward.cu's run_layers_carried; NULL after the embedding) */
    const float *qkv_s, *qkv_c, *fc1_s, *fc1_c;
} gpu_layer;

/* The word-level Transformer-XL's adaptive input and softmax on the device
 * (adaptive.cu; core/adaptive.h has the math); par-tf's adaptive softmax
 * (biased projections) after a plain embedding (gpu_model.emb set). */
/* ROWS rounded up to 8: the rows of an adaptive softmax's bf16 head and tail
 * matrices (the padding zeros), the width of their GEMMs */
static inline int ada_pad8(int rows) { return (rows + 7) & ~7; }

#define GPU_LAYER_GRAPHS 8

typedef struct {
    int n, H, dmax;               /* clusters (the shortlist one of them); head columns; widest d_i */
    int cut[ADA_MAX_CLUSTERS + 1], dim[ADA_MAX_CLUSTERS];
    const float *emb[ADA_MAX_CLUSTERS], *emb_proj[ADA_MAX_CLUSTERS];   /* in the arena */
    const float *out_w[ADA_MAX_CLUSTERS], *out_b[ADA_MAX_CLUSTERS];    /* in the arena */
    const float *proj_t[ADA_MAX_CLUSTERS];   /* Q_i^T (d_i x d_model) in `derived`, or NULL */
    const float *proj_b[ADA_MAX_CLUSTERS];   /* q_i, its bias (par-tf's; in the arena), or NULL */
    const float *head_w, *head_b;            /* [W_0; cluster_w], [b_0; cluster_b] in `derived` */
    const bf16 *proj_t_h[ADA_MAX_CLUSTERS], *out_w_h[ADA_MAX_CLUSTERS], *head_w_h;   /* GPU_BF16 */
    float *head, *hp, *tail;      /* step buffers: N x ldh, N x dmax, N x ldt */
    int ldh, ldt;                 /* head and tail rows: H and the widest tail cluster, rounded up to 8 */
    double *part;                 /* the log-softmaxes' chunk partials (adaptive.cu): N x chunks x 2 */
    /* a step of targets only (adaptive.cu): each row's logprob of each tail
     * cluster k (hcol[r * ADA_MAX_CLUSTERS + k], from the head's pass), and
     * the target's logit + bias of a tail cluster's row i (tval[i]) */
    float *hcol, *tval;
    size_t step_floats;           /* floats of those step buffers */
    bf16 *hpb;                    /* GPU_BF16: N x dmax */
    /* a step of targets only: each tail cluster's rows (those whose target
     * lies in it) in order, (n - 1) x N, then their counts (device; made on
     * the host in h_rows, pinned, and h_cnt), and those rows' inputs
     * gathered (N x dmax, bf16 in GPU_BF16) */
    int *rows, *h_rows, *h_cnt;
    float *hg;
    bf16 *hgb;
} gpu_ada;

/* A family on the device: what its layers do differently. The rest of a
 * step (embedding, linear layers, LayerNorm, feed-forward, the output
 * layer) is shared (forward.cu). One implementation a file (fam_aspan.cu,
 * fam_rel.cu, fam_gpt.cu), listed by core's family name in gpu.cu's table.
 * A family whose step is not B x M rows through the layers (the window
 * models: ragged windows) gives a `step` of its own instead. */
enum { GPU_SUB_ATTN = 1, GPU_SUB_FFN = 2 };

/* The picks a step may stage with its inputs (forward.cu: gpu_forward_pick); a step of more copies them up on
 * their own */
#define GPU_STAGE_PICKS 16
typedef struct {
    /* floats of core's arena past the parameters that the device needs too */
    size_t (*arena_extra)(const model_t *m);
    /* after the arena is up: each layer's pointers (g->L), the tables the
     * family derives (g->derived, derived_floats), g->max_window */
    int (*upload)(gpu_model *g, char *err);
    /* shared memory a block of its attention needs (over the device's: refused at load) */
    size_t (*attn_smem)(const gpu_model *g);
    /* step buffers of its own (adds them to step_bytes); may raise g->max_m
     * where nothing of the family's step depends on max_block but through
     * the rows B x M */
    int (*alloc_step)(gpu_model *g, char *err);
    /* layer L's sublayers, GPU_SUB_ATTN and/or GPU_SUB_FFN (attention first), 0: skipped */
    int (*sublayers)(const model_t *m, int l);
    /* layer L's attention of B x M queries: reads g->qkv (qkvb), writes g->att
     * (attb) and the keys and values into the rings; marks its operations */
    int (*attend)(gpu_model *g, int l, int B, int M, char *err);
    /* the embedding's factor (an adaptive input scales itself) */
    float (*embed_scale)(const model_t *m);
    /* NULL, or what replaces the shared launches (forward.cu's launch_step)
     * of a step whose inputs are staged (g->d_stage: tokens, targets,
     * positions, ring bases): it leaves the B x M rows of log-probabilities
     * in g->logits as launch_step does, and everything after (targets,
     * picks, the copies back) is shared. Its steps never run as graphs.
     * It must not advance the memories (forward.cu does, after the step). */
    int (*step)(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, char *err);
} gpu_family;

extern const gpu_family gpu_family_aspan, gpu_family_rel, gpu_family_gpt;

/* fam_gpt.cu's state of a step (the plan on the host, staging, the rows'
 * index on the device); freed with the model. */
typedef struct gpu_gpt gpu_gpt;
void gpu_gpt_free(gpu_gpt *t);

/* decode_step.cu: a decode step of up to a few streams as one persistent
 * kernel (its plan made at load, freed with the model) */
typedef struct gpu_mk gpu_mk;
void gpu_mk_free(gpu_mk *k);
/* the plan, where the model's shapes allow it (else WHY says why, and
 * g->mk stays NULL); -1 only on an error */
int gpu_mk_plan(gpu_model *g, char *why, size_t cap, char *err);
/* whether a step of B streams x M tokens takes it (in g->mk_on's mode);
 * the most streams a step may have to; its launch */
int gpu_mk_takes(const gpu_model *g, int B, int M);
int gpu_mk_limit(const gpu_model *g);
int gpu_mk_step(gpu_model *g, int B, char *err);

struct gpu_model {
    const model_t *m;
    const gpu_family *fam;
    gpu_ada *ada;                 /* NULL: one softmax; with emb NULL also the adaptive input */
    float *ada_mem;               /* the adaptive softmax's derived weights and step buffers */
    int max_batch, max_block;
    /* the longest M of a step: max_block, or where the family plans every
     * per-step buffer by rows (its alloc_step says so) any M of up to
     * max_batch x max_block rows, B x M within them too */
    int max_m;
    int prec;                     /* GPU_FP32 or GPU_BF16 */
    int gemv_on;                  /* a few rows go through matmul.cu's gemv_kernel (SPANSERVE_GPU_GEMV=0: cuBLAS) */
    int dec_tiles;                /* gpu_decode_attn_tiles: the decode attentions' tiles a block at least */
    int dec_fill;                 /* gpu_decode_attn_fill: adaptive-span's blocks about this many times the SMs */
    int pdl_on;                   /* the decode path's kernels launch before the one ahead ends (pdl_launch;
                                   * SPANSERVE_GPU_PDL=0: plain launches) */
    int dec_narrow;               /* aspan_decode_bw_kernel's blocks of 1 or 2 warps for layers of windows of
                                   * up to 32 or 64 keys (SPANSERVE_GPU_DECODE_NARROW=0: 4 warps) */
    int split_order;              /* aspan_decode_bw_kernel's grid (gpu_decode_split_order): 1 a layer's items
                                   * longest first, 2 in head order, each with every stream's copy together;
                                   * 0 (SPANSERVE_GPU_SPLIT_ORDER=0) stream by stream */
    int sk_split;                 /* skinny products of 1,024 inputs or more split them over a cluster of two
                                   * blocks (matmul.cu; gpu_decode_splitk: 2 the second pushes its sums to
                                   * the first, 1 two cluster barriers, 0 one block an output tile) */
    int sk_msplit;                /* skinny products of few tiles and more than 32 rows split the rows over two
                                   * blocks a tile (matmul.cu; gpu_decode_msplit) */
    int comb_warp;                /* a decode step's splits met a warp a (stream, head) (gpu_decode_combine;
                                   * SPANSERVE_GPU_COMBINE=0: aspan_combine_kernel's block and loops) */
    unsigned twice;               /* a diagnostic (gpu_decode_twice): the GPU_TWICE_ operations a carried decode
                                   * step launches twice, */
    int twice_layer;              /* in every layer (-1) or in this one */
    int lnf_on;                   /* a post-LN decode step of 9 to 64 streams carries its LayerNorms in the
                                   * products around them (forward.cu; gpu_decode_ln_fuse, SPANSERVE_GPU_LN_FUSE) */
    long lnf_steps;               /* the steps that did */
    int lnf_ok;                   /* the model allows it (gpu_ln_carry_plan) */
    float *lnf_tab;               /* the folded tables (gpu_layer's qkv_s .. fc1_c, out_s, out_c) */
    const float *out_s, *out_c;   /* the output layer's, with the last LayerNorm folded in (NULL: none) */
    int out_fold;                 /* the last LayerNorm carried into the output layer (gpu_decode_out_fold) */
    const unsigned long long *out_acc; /* (while a step's launches are made: the rows' sums the output layer
                                   * applies the last LayerNorm by, or NULL) */
    int tile_on;                  /* blocks of queries go through aspan_tile.cu (gpu_tiles) */
    int tc_on;                    /* bf16 tiles on tensor cores (gpu_tensor_cores) */
    int ring_fused;               /* the last relative attention wrote the step's keys and values into the
                                   * rings itself (attn_mma.cu), so no ring launch follows it */
    int n_sm;                     /* the device's multiprocessors */
    size_t ring_elem;             /* bytes of a memory element: 4 or 2 */
    char device[256];
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;                /* cuBLAS workspace, so that a step never allocates */
    cublasLtHandle_t lt;          /* cublasLt, for the feed-forward's bias + ReLU in a GEMM's epilogue */
    int lt_mode;                  /* its bias: 0 not tried yet, 1 float, 2 bf16, -1 no algorithm (two launches) */
    gpu_lt_plan lt_plans[GPU_LT_PLANS];   /* its plans by shapes, replaced in turn */
    int lt_next;
    /* weights: the host arena uploaded whole, plus the packed and derived tables */
    float *arena;
    size_t arena_floats;
    float *derived;               /* packed aspan QKV, par rk tables, aspan masks */
    size_t derived_floats;
    gpu_layer *L;                 /* host array, n_layers */
    const float *emb, *out_w, *out_b, *key_pe;   /* out_b NULL: none (nanoGPT) */
    const float *wpe, *lnf_w, *lnf_b;             /* gpt: positions, the final LayerNorm (lnf_b may be NULL) */
    /* GPU_BF16: the linear layers' weights in bfloat16, one allocation */
    bf16 *wbf;
    size_t wbf_elems;
    const bf16 *out_h;
    /* aspan, per layer*head: key rows, reach, offset of the mask in `derived` */
    int *krows, *reach;
    int64_t *mask_off;
    int max_window;               /* the most key rows (aspan) or keys (par) a query visits */
    /* the memory's layout: mem_t's offsets, per slot (layer*head or layer) */
    size_t mem_floats;
    size_t *h_off;
    int64_t *d_off;
    /* per-step buffers: logits of N = max_batch * max_block rows; x, tmp,
     * qkv, att, ff (and their bf16 copies) of step_rows rows: N, or for a
     * family with its own step (window models) at least one window */
    int step_rows;
    float *x, *qkv, *att, *tmp, *ff, *logits;
    /* GPU_BF16: the linear layers' inputs in bfloat16 (x, att, relu(ff)),
     * and the projections' output (queries, keys, values) in bfloat16, the
     * rings' type */
    bf16 *xb, *attb, *ffb, *qkvb;
    /* GPU_BF16, post-LN: the output of the attention's Wo and of fc2 in
     * bfloat16 (tmpb), which the residual's LayerNorm reads (forward.cu) */
    bf16 *tmpb;
    gpu_gpt *gpt;                 /* window models: fam_gpt.cu's step state */
    /* decode_step.cu: decode steps as one kernel (NULL: not planned, mk_why
     * says why), taken in mk_on's mode (gpu.h: GPU_DECODE_AUTO unless
     * SPANSERVE_GPU_DECODE_KERNEL says otherwise at load, or
     * gpu_decode_kernel); its steps */
    gpu_mk *mk;
    int mk_on;
    long mk_steps;
    int mk_fuse;                  /* the most streams a step whose feed-forwards take one phase (gpu.h) */
    long mk_ffn_steps;            /* steps that did */
    int mk_wo;                    /* whether such steps take their attentions' Wo into the attention's phase */
    int mk_ll;                    /* what its phases read as it lands (gpu_decode_ll) */
    long mk_wo_steps;             /* steps that did */
    char mk_why[160];
    /* aspan decode: the partial results of a query's key splits
     * (ASPAN_SPLIT_BLOCKS records of d_head + 4 floats), NULL for par */
    float *part;
    /* attn_mma.cu's tables in bfloat16 (GPU_BF16; NULL where it never runs):
     * adaptive-span's key_pe by distance (pe_h), each attention block's rk */
    bf16 *mma_tab;
    float *mma_vr;
    const bf16 *pe_h;
    /* aspan_tile.cu: the partial states of split windows */
    float *tpart;
    size_t part_recs;             /* records of D + 4 floats that part holds (at least ASPAN_SPLIT_BLOCKS) */
    size_t tpart_floats;
    /* per-step inputs: staged in pinned host memory, copied in one transfer of what the step uses: the
     * streams' positions, ring bases and rows held (max_batch each), up to GPU_STAGE_PICKS picks, then the
     * B x M tokens of the step (of up to max_batch x max_block), and the targets (as many) in a second transfer
     * when the step has any */
    void *h_stage, *d_stage;
    size_t stage_bytes;
    size_t o_pos, o_ring, o_len, o_pick, o_tok, o_tgt;   /* offsets in the stage */
    /* h_po's device address (pinned memory is mapped): staged picks are written there; NULL: into d_po,
     * copied back */
    pick_out *m_po, *m_po_dev;    /* (m_po: m_po_dev, or NULL while gpu_picks_mapped turns it off) */
    long picks_staged;            /* picks read from the stage (gpu_picks_staged) */
    /* model_forward_targets: each row's target's logprob, on the device and in pinned host memory */
    float *tl, *h_tl;
    /* gpu_forward_pick: the picks asked for (up to max_batch * max_block) and
     * made, on the device and in pinned host memory */
    pick_req *d_pq, *h_pq;
    pick_out *d_po, *h_po;
    size_t step_bytes, weight_bytes;
    /* decode steps as CUDA graphs: graph[B-1] for B streams x 1 token */
    cudaGraphExec_t *graph;
    /* the layers of a step of B x M tokens (M > 1: scoring) as CUDA graphs,
     * the last GPU_LAYER_GRAPHS shapes (forward.cu) */
    cudaGraphExec_t lgraph[GPU_LAYER_GRAPHS];
    int lgraph_b[GPU_LAYER_GRAPHS], lgraph_m[GPU_LAYER_GRAPHS], lgraph_next;
    int graphs_on, graphs_captured;
    long graph_launches;
    char graph_why[200];
    /* gpu_profile: an event before the step and after each operation */
    int prof_on, prof_n;
    cudaEvent_t *prof_ev;         /* GPU_PROF_EVENTS + 1, created when profiling starts */
    int prof_op[GPU_PROF_EVENTS];
    double prof_ms[OP_N];
    long prof_calls[OP_N];
    float prof_last[GPU_PROF_EVENTS];   /* the last profiled step's operations' milliseconds, in order */
    int prof_last_n;
};

/* Step inputs, on the device. */
static inline int32_t *stage_tok(const gpu_model *g, void *base) { return (int32_t *)((char *)base + g->o_tok); }
static inline int64_t *stage_pos(const gpu_model *g, void *base) { return (int64_t *)((char *)base + g->o_pos); }
static inline float **stage_ring(const gpu_model *g, void *base) { return (float **)((char *)base + g->o_ring); }
static inline int *stage_len(const gpu_model *g, void *base) { return (int *)((char *)base + g->o_len); }
static inline int32_t *stage_tgt(const gpu_model *g, void *base) { return (int32_t *)((char *)base + g->o_tgt); }
static inline pick_req *stage_pick(const gpu_model *g, void *base) { return (pick_req *)((char *)base + g->o_pick); }

/* Relative attention's score factor (core/par.c): 1/sqrt(d_head), or the
 * seed's 1/d_head for par-transformer-xl-tf (model_t.tf_attn). */
static inline float gpu_rel_scale(const model_t *m)
{
    return (float)(1.0 / (m->tf_attn ? m->d_head : sqrt((double)m->d_head)));
}

/* Ring row of absolute position P (negative: the zeros before the start) in
 * a ring of R rows, as core/aspan.c. */
static __device__ __forceinline__ int ring_slot(int64_t p, int r)
{
    if ((uint64_t)p >> 32 == 0) return (int)((uint32_t)p % (uint32_t)r);   /* (a 32-bit remainder: a few instructions, where
                                                                               * 64 bits take about a hundred) */
    int64_t s = p % r;
    return (int)(s < 0 ? s + r : s);
}

/* d (16x8 fp32) += a (16x16 bf16, row-major) b (16x8 bf16, column-major):
 * attn_mma.cu's products, matmul.cu's skinny_kernel */
static __device__ __forceinline__ void mma16816(float d[4], const unsigned a[4], unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Programmatic dependent launch (Hopper): a kernel launched by pdl_launch
 * may start while the kernel before it in the stream is still running (once
 * every block of that one has called pdl_next, or has ended). Before
 * pdl_wait() it may only read what no kernel of the step writes (weights,
 * tables, the step's staged inputs, the rings of earlier steps) and must
 * write nothing; pdl_wait() returns once the kernel before has ended and
 * its writes are visible (at once after a plain launch). Every kernel
 * launched so waits before it ends, so that its end still implies the end
 * of everything before it. */
static __device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
static __device__ __forceinline__ void pdl_next() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

template <typename... K, typename... A>
static cudaError_t pdl_launch(const gpu_model *g, void (*kern)(K...), dim3 grid, dim3 block, size_t smem, A... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = g->stream;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = g->pdl_on ? 1 : 0;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, ((K)args)...);
}

/* pdl_launch in clusters of CX blocks along x */
template <typename... K, typename... A>
static cudaError_t pdl_launch_cluster(const gpu_model *g, void (*kern)(K...), dim3 grid, dim3 block, unsigned cx,
                                      A... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = g->stream;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = g->pdl_on ? 1 : 0;
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = cx, at[1].val.clusterDim.y = 1, at[1].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 2;
    return cudaLaunchKernelEx(&cfg, kern, ((K)args)...);
}

/* matmul.cu's skinny_kernel: the most rows of a product; a carried
 * LayerNorm's buffer of row sums holds two 64-bit sums a row (the sum and
 * the sum of squares: forward.cu's run_layers_carried keeps two) */
#define SK_MAX_ROWS 64
#define LNC_ACC_U64 (2 * SK_MAX_ROWS)

/* Tiles of 128 keys a thread block of the decode attentions takes
 * (aspan_decode.cu, rel_decode.cu), from WORK, the tiles of a layer's keys
 * over every stream and head: the blocks about FILL times the SMs (the
 * device holds 3 an SM: adaptive-span one round, DEC_FILL_DEFAULT, since
 * the splits are met a warp a head; relative attention two), at most 8
 * tiles a block, at least gpu_decode_attn_tiles'. (H100, 64 streams, in one
 * process, 2026-12-07: adaptive-span's fill 3 against 6: aspan-enwik8
 * 138,026 / 137,886 tokens/s against 135,039 in span memory, 76,127 /
 * 76,118 against 76,143 in exact; relative attention's: par-base 166,472 /
 * 166,707 against 168,960.)
 * (H200, 64 streams, tiles a block fixed: aspan-enwik8 1 / 2 / 4 / 8: span
 * memory 109,813 / 121,082 / 123,699 / 122,853 tokens/s, exact 51,863 /
 * 63,758 / 70,622 / 73,419; par-base 151,964 / 153,640 / 154,871 / 155,058) */
#define DEC_FILL_DEFAULT 3   /* adaptive-span's (gpu_decode_attn_fill) */
#define DEC_FILL_REL 6       /* relative attention's */
static inline int dec_tiles_per_block(const gpu_model *g, int64_t work, int fill)
{
    int64_t per = work / ((int64_t)fill * g->n_sm);
    if (per > 8) per = 8;
    if (per < g->dec_tiles) per = g->dec_tiles;
    return per < 1 ? 1 : (int)per;
}

/* The most (query, head, split) blocks an adaptive-span step splits its keys
 * over (flash-decoding); the partials buffer holds one record for each. */
#define ASPAN_SPLIT_BLOCKS 8192

/* ---- launchers (each in its own file) ---- */

/* matmul.cu: y[n x out] = x[n x in] W^T, W out x in row-major (no bias);
 * gpu_linear_bf16: the same with bfloat16 x and W, float32 y and sums. */
int gpu_linear(gpu_model *g, float *y, const float *x, const float *W, int n, int in, int out, char *err);
int gpu_linear_bf16(gpu_model *g, float *y, const bf16 *x, const bf16 *W, int n, int in, int out, char *err);
/* the same, y in bfloat16 (the sums in float32, rounded once) */
int gpu_linear_bf16_out(gpu_model *g, bf16 *y, const bf16 *x, const bf16 *W, int n, int in, int out, char *err);
/* matmul.cu: y = max(x W^T + b, 0) in one launch for a few rows (decode),
 * into y (GPU_FP32) or yb (GPU_BF16): 1 if it ran, 0 if the shapes call for
 * gpu_linear then gpu_bias_relu, -1 on an error */
int gpu_linear_bias_relu(gpu_model *g, float *y, bf16 *yb, const float *x, const bf16 *xb, const float *W,
                         const bf16 *Wb, const float *b, int n, int in, int out, char *err);
/* matmul.cu: y = bf16(max(x W^T + b, 0)) for many rows (GPU_BF16, a bias):
 * cublasLt's GEMM with the bias and the ReLU in its epilogue (float sums,
 * rounded once; the bias B in float where cublasLt takes it, else its
 * bf16 copy BH), so that the float product never goes to memory: 1 if it
 * ran, 0 if cublasLt has no algorithm for it (then never again for this
 * model: the caller takes gpu_linear_bf16 and gpu_bias_relu), -1 on an
 * error */
int gpu_linear_bias_relu_lt(gpu_model *g, bf16 *y, const bf16 *x, const bf16 *W, const float *b, const bf16 *bh, int n,
                            int in, int out, char *err);
/* matmul.cu: dst[i] = bf16(src[i]) */
int gpu_to_bf16(gpu_model *g, bf16 *dst, const float *src, size_t n, char *err);
/* embed.cu: x[n] = emb[tok[n]] * scale; also into xb (bfloat16) if not NULL */
int gpu_embed(gpu_model *g, float *x, bf16 *xb, const float *emb, const int32_t *tok, int n, int d, float scale,
              char *err);
/* bias_relu.cu: y = max(y + b, 0), rows of d (b may be NULL); into yb
 * (bfloat16) instead of y when yb is not NULL */
int gpu_bias_relu(gpu_model *g, float *y, bf16 *yb, const float *b, int n, int d, char *err);
/* layernorm.cu: x = LN(x + (r + rb)) * w + b; rb may be NULL; also into xb
 * (bfloat16) if not NULL */
int gpu_add_layernorm(gpu_model *g, float *x, bf16 *xb, const float *r, const float *rb, const float *w,
                      const float *b, int n, int d, char *err);
/* the same with r in bfloat16 (GPU_BF16: a linear layer's output rounded once) */
int gpu_add_layernorm_b(gpu_model *g, float *x, bf16 *xb, const bf16 *r, const float *rb, const float *w, const float *b,
                        int n, int d, char *err);
/* layernorm.cu: x = LN(x) * w + b in place, also into xb: a post-LN step's
 * last LayerNorm where the products carried the others (gpu_linear_ln) */
int gpu_layernorm_keep(gpu_model *g, float *x, bf16 *xb, const float *w, const float *b, int n, int d, char *err);
/* matmul.cu, a post-LN model's LayerNorm inside the products around it
 * (GPU_BF16, skinny_kernel's products of GEMV_MAX_ROWS + 1 to 64 rows: a
 * decode step of 9 to 64 streams; forward.cu). The rows' sums and sums of
 * squares are 64-bit integers in units of 2^-24, two a row.
 * gpu_linear_residual: h = x' + (bf16(a W^T) + bias) into x in place (N x
 *   OUT), x' = LN(x) * w + b by the sums ACC_IN where it is set (the
 *   LayerNorm before, which the product between carried), else x; bf16(wn
 *   h) into xb; h's sums added into ACC_OUT (zero).
 * gpu_linear_ln: y = bf16(rstd (xb W^T - mean s) + c (+ bias, then ReLU)),
 *   xb = bf16(w h), the rows' mean and rstd from ACC_IN, s = W w and c = W
 *   b (gpu_ln_fold); ACC_IN NULL: y = bf16(xb W^T (+ bias, ReLU)). Zeroes
 *   ACC_OUT.
 * gpu_linear_ln_fits: whether the shapes allow both (x, a 16-byte aligned) */
bool gpu_linear_ln_fits(const gpu_model *g, int n, int in, int out, const void *W);
int gpu_linear_residual(gpu_model *g, float *x, bf16 *xb, const unsigned long long *acc_in, const float *w, const float *b,
                        unsigned long long *acc_out, const float *wn, const bf16 *a, const bf16 *W, const float *bias, int n,
                        int in, int out, char *err);
int gpu_linear_ln(gpu_model *g, bf16 *y, const bf16 *xb, const unsigned long long *acc_in, unsigned long long *acc_out,
                  const float *s, const float *c, const bf16 *W, const float *bias, int n, int in, int out, char *err);
/* gpu_linear_ln with float out and ACC_IN set (the output layer's logits), ACC_OUT left alone */
int gpu_linear_ln_f(gpu_model *g, float *y, const bf16 *xb, const unsigned long long *acc_in, const float *s,
                    const float *c, const bf16 *W, int n, int in, int out, char *err);
int gpu_ln_fold(gpu_model *g, float *s, float *c, const bf16 *W, const float *w, const float *b, int in, int out, char *err);
/* forward.cu: the folded tables of the LayerNorms the products carry
 * (g->lnf_tab, the layers' qkv_s .. fc1_c, and g->out_s, out_c where the
 * output layer can carry the last one), where the model allows it: at
 * load. 0, or -1 on an error (a model that cannot is not one) */
int gpu_ln_carry_plan(gpu_model *g, char *err);
/* logsoftmax.cu: y = log_softmax(y + b), rows of d (b may be NULL) */
int gpu_log_softmax(gpu_model *g, float *y, const float *b, int n, int d, char *err);
/* logsoftmax.cu: tl[n] = y[n * d + tgt[n]] for the rows whose tgt is >= 0 */
int gpu_gather_targets(gpu_model *g, float *tl, const float *y, const int32_t *tgt, int n, int d, char *err);
/* gpu.cu: the device copy of host weight P (N floats), NULL unless it lies
 * in the arena; the feed-forward weights of layer Y into D (-1: outside) */
const float *gpu_on_device(const gpu_model *g, const float *p, size_t n);
int gpu_bind_ffn(const gpu_model *g, gpu_layer *d, const layer_t *y);
/* forward.cu: with gpu_profile on, marks the end of operation OP */
void gpu_mark(gpu_model *g, int op);
/* sample.cu: the N picks D_REQ from the step's logprobs (g->logits) into
 * D_OUT, on the device (core/sample.c's sample_pick) */
int gpu_pick(gpu_model *g, int n, const pick_req *d_req, pick_out *d_out, char *err);
/* matmul.cu: y = x W^T with rows of y LDY floats apart (a column block of a wider matrix) */
int gpu_linear_ld(gpu_model *g, float *y, int ldy, const float *x, const float *W, int n, int in, int out, char *err);
int gpu_linear_bf16_ld(gpu_model *g, float *y, int ldy, const bf16 *x, const bf16 *W, int n, int in, int out, char *err);
/* layernorm.cu: y = LN(x) * w + b (x unchanged), into y (float) or yb
 * (bfloat16); b may be NULL, y may be x */
int gpu_layernorm_to(gpu_model *g, float *y, bf16 *yb, const float *x, const float *w, const float *b, int n, int d,
                     char *err);
/* layernorm.cu: x += r (+ rb); also into xb (bfloat16) if not NULL */
int gpu_add_residual(gpu_model *g, float *x, bf16 *xb, const float *r, const float *rb, int n, int d, char *err);
/* adaptive.cu: x[n] = the adaptive input of tok[n] (and into xb); the
 * adaptive softmax of x (xb) into g->logits, whole rows */
int gpu_ada_embed(gpu_model *g, float *x, bf16 *xb, const int32_t *tok, int n, char *err);
int gpu_ada_logprobs(gpu_model *g, const float *x, const bf16 *xb, int n, const int32_t *tgt, const int32_t *htgt, float *tl,
                     char *err);
/* (TGT: every row's target id on the device: only tl[r], its logprob, is written) */
/* aspan_attn.cu: one layer's span-limited attention for B streams x M
 * queries, into g->att (GPU_FP32) or g->attb (GPU_BF16); the rings are read
 * in the model's precision (so are rel_attn's and written by ring.cu's) */
int gpu_aspan_attn(gpu_model *g, int layer, int B, int M, int *ring_done, char *err);
/* aspan_pers.cu: the same with persistent memory (all-attention layers),
 * one block per query and head; and its shared memory a block */
int gpu_aspan_pers_attn(gpu_model *g, int layer, int B, int M, char *err);
size_t gpu_aspan_pers_smem(const gpu_model *g);
/* rel_attn.cu: one PAR block's relative attention */
int gpu_rel_attn(gpu_model *g, int layer, int B, int M, char *err);
/* aspan_tile.cu: the same for blocks of at least ASPAN_TILE_MIN_M queries
 * and heads of 32 or 64 dims, a tile of queries sharing each key: 1 if it
 * ran, 0 if the shapes are not its, -1 on an error */
#define ASPAN_TILE_MIN_M 16
#define ASPAN_TILE_SPLITS 8
#define ASPAN_TILE_PART_FLOATS ((size_t)64 << 20)   /* 256 MB of partial states at most */
int gpu_aspan_tile(gpu_model *g, int layer, int B, int M, char *err);
/* aspan_tile.cu: the split windows' partial states in g->tpart met into
 * g->att (attb): RENORM adaptive-span's (O / Z) / (W / Z + 1e-8), with the
 * layer's REACH per head (zeros where it is 0) or NULL (persistent memory);
 * else relative attention's O / Z */
int gpu_aspan_tile_combine(gpu_model *g, const int *reach, int renorm, int B, int M, int nsplit, char *err);
/* attn_mma.cu: the same on tensor cores (GPU_BF16, gpu_tensor_cores on,
 * heads of 32 or 64, M >= the tiles' minimum): 1 if it ran, 0 if the
 * shapes call for another kernel, -1 on an error; gpu_rel_mma for PAR's
 * relative attention. gpu_mma_upload builds their bfloat16 tables at load
 * (after the family's upload and the bf16 weights). */
int gpu_aspan_mma(gpu_model *g, int layer, int B, int M, char *err);
int gpu_rel_mma(gpu_model *g, int layer, int B, int M, char *err);
int gpu_mma_upload(gpu_model *g, char *err);

/* floats of g->tpart that the plan wants (0: the tile kernel never runs) */
size_t gpu_aspan_tile_part_floats(const gpu_model *g);
/* aspan_decode.cu: the same for few queries (decode), heads of 32, 64 or
 * 128 dims, one pass over the keys: 1 if it ran, 0 if not, -1 on an error */
int gpu_aspan_decode(gpu_model *g, int layer, int B, int M, char *err);
/* the records g->part holds for it (aspan_decode.cu) */
size_t gpu_aspan_part_recs(const gpu_model *g);
/* aspan_attn.cu: splits' partial states in g->part met into att or attb */
int gpu_aspan_combine(gpu_model *g, int layer, int B, int M, int chunk, int nsplit, float *att, bf16 *attb, char *err);
/* the same for a decode step's records (M 1, into g->attb): a warp a (stream, head) unless gpu_decode_combine is 0 */
int gpu_aspan_combine_dec(gpu_model *g, int layer, int B, int chunk, int nsplit, char *err);
/* whether gpu_decode_twice asks for operation T (a GPU_TWICE_ bit) of layer L twice */
static inline bool gpu_twice(const gpu_model *g, unsigned t, int l)
{
    return (g->twice & t) && (g->twice_layer < 0 || g->twice_layer == l);
}
/* rel_tile.cu: PAR's relative attention the same way (heads of 32 or 64
 * dims, blocks of at least REL_TILE_MIN_M queries) */
#define REL_TILE_MIN_M 16
int gpu_rel_tile(gpu_model *g, int layer, int B, int M, char *err);
/* rel_decode.cu: the same for one token a stream (decode) in GPU_BF16, heads
 * of 32 or 64 dims, with the step's ring writes (g->ring_fused): 1 if it
 * ran, 0 if not, -1 on an error */
int gpu_rel_decode(gpu_model *g, int layer, int B, int M, char *err);
/* the most shared memory a block of either attention asks for */
size_t gpu_aspan_attn_smem(const gpu_model *g);
size_t gpu_rel_attn_smem(const gpu_model *g);
/* ring.cu: the block's keys and values into the rings (after the layer's attention) */
int gpu_aspan_ring_write(gpu_model *g, int layer, int B, int M, char *err);
int gpu_par_ring_write(gpu_model *g, int layer, int B, int M, char *err);

/* ---- window models (fam_gpt.cu, core/gpt.h) ----
 * A step's windows (gpt_plan's gpt_win, with what the device needs) are
 * computed in groups of up to g->step_rows rows; a group's window k has its
 * computed rows at row0.. of the group's buffers (x, qkv, att, ...). */
typedef struct {
    int64_t start;     /* absolute position of the window's row 0 */
    int64_t pos;       /* the stream's position before the step */
    int b;             /* the stream */
    int cached;        /* rows 0..cached-1: keys and values from the stream's cache */
    int n;             /* rows computed: window rows cached..cached+n-1 */
    int out_from;      /* computed rows from out_from on are wanted, */
    int out_row;       /* into the step's output rows out_row.. */
    int write_kv;      /* the computed rows' keys and values go into the cache */
    int row0;          /* the first computed row's row in the group */
    int pad;
} gpu_gpt_win;
/* gelu.cu: y = GELU(y + b) (the erf form, as core's ops_gelu: in double),
 * rows of d, b may be NULL; into yb (bfloat16) instead of y when not NULL */
int gpu_bias_gelu(gpu_model *g, float *y, bf16 *yb, const float *b, int n, int d, char *err);
/* gpt_rows.cu: the group's rows (R) from its NW windows W: each row's window
 * (ROWWIN), token (ROWTOK: the stream's ring RINGS[b * window + p % window]
 * before the step, the step's TOKENS, B x M, after) and window row (ROWPOS) */
int gpu_gpt_index(gpu_model *g, const gpu_gpt_win *w, int nw, const int32_t *rings, const int32_t *tokens, int M,
                  int32_t *rowwin, int32_t *rowtok, int32_t *rowpos, char *err);
/* gpt_rows.cu: x[R] = wte[tok] + wpe[window row] */
int gpu_gpt_embed(gpu_model *g, float *x, const int32_t *rowtok, const int32_t *rowpos, int R, char *err);
/* gpt_rows.cu: out = y + b (b may be NULL), R rows of d, into OUT (float,
 * may be Y) or OUTB (bfloat16) */
int gpu_gpt_bias(gpu_model *g, float *out, bf16 *outb, const float *y, const float *b, int R, int d, char *err);
/* gpt_rows.cu: layer L's keys and values of the write_kv windows' rows
 * (from the projections, in the model's precision) into their streams'
 * caches (ring bases in the staged inputs) */
int gpu_gpt_cache_write(gpu_model *g, int l, const gpu_gpt_win *w, int R, const int32_t *rowwin, char *err);
/* gpt_rows.cu: each window's wanted rows of X (R rows) into Y, packed: the
 * wanted row of output row o at Y's row o - BASE */
int gpu_gpt_gather(gpu_model *g, float *y, const float *x, const gpu_gpt_win *w, int R, const int32_t *rowwin, int base,
                   char *err);
/* gpt_attn.cu: layer L's causal attention of the group's R rows (span
 * masks of gpt-adaptive-span), into g->att (GPU_FP32) or g->attb; and the
 * shared memory a block of it asks for */
int gpu_gpt_attn(gpu_model *g, int l, const gpu_gpt_win *w, int R, const int32_t *rowwin, char *err);
/* attn_mma.cu: the same on tensor cores for a group of NW windows of up to
 * MAX_N computed rows each (W on the device; GPU_BF16, heads of 32 or 64,
 * MAX_N >= GPT_MMA_MIN_ROWS): 1 if it ran, 0 if not, -1 on an error */
#define GPT_MMA_MIN_ROWS 16
int gpu_gpt_mma(gpu_model *g, int l, const gpu_gpt_win *w, int nw, int max_n, char *err);
size_t gpu_gpt_attn_smem(const gpu_model *g);

#endif
