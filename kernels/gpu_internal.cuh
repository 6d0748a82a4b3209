/*
 * gpu_internal.cuh - what the files of kernels/ share: the device model
 * (weights, derived tables, per-step buffers), error checks, and the
 * launchers of each operation (one file each: embed.cu, matmul.cu,
 * bias_relu.cu, layernorm.cu, aspan_attn.cu, rel_attn.cu, ring.cu,
 * logsoftmax.cu). gpu.cu loads and plans; forward.cu runs a step.
 */
#ifndef SPANSERVE_GPU_INTERNAL_CUH
#define SPANSERVE_GPU_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "err.h"
#include "model.h"
}
#include "gpu.h"

/* A failed CUDA or cuBLAS call: message into err, return -1. */
#define CU_TRY(call, err, what)                                                                        \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) return err_set(err, "%s: %s", what, cudaGetErrorString(e_));            \
    } while (0)
#define BLAS_TRY(call, err, what)                                                                      \
    do {                                                                                               \
        cublasStatus_t s_ = (call);                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) return err_set(err, "%s: cuBLAS status %d", what, (int)s_);   \
    } while (0)
/* After a launch: a bad configuration shows here, a fault at the next sync. */
#define LAUNCH_TRY(err, what) CU_TRY(cudaGetLastError(), err, what)

/* The operations of a step, as gpu_profile counts them. */
enum { OP_EMBED, OP_QKV, OP_ATTN, OP_RING, OP_WO, OP_LN, OP_FC1, OP_RELU, OP_FC2, OP_OUT, OP_LOGSOFTMAX, OP_N };
#define GPU_PROF_EVENTS 2048

/* Device pointers of one layer or block (NULL where the kind has none). */
typedef struct {
    const float *wqkv;            /* aspan: [Wq; Wk; Wv], 3H x H (packed at load); par: qkv_net */
    const float *wo;              /* aspan proj_out, par o_net */
    const float *ln1_w, *ln1_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b, *ln2_w, *ln2_b;
    const float *rk;              /* par: r_net(sinusoid(t)), t = 0..rk_rows-1, A wide */
    int rk_rows;
} gpu_layer;

struct gpu_model {
    const model_t *m;
    int max_batch, max_block;
    char device[256];
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;                /* cuBLAS workspace, so that a step never allocates */
    /* weights: the host arena uploaded whole, plus the packed and derived tables */
    float *arena;
    size_t arena_floats;
    float *derived;               /* packed aspan QKV, par rk tables, aspan masks */
    size_t derived_floats;
    gpu_layer *L;                 /* host array, n_layers */
    const float *emb, *out_w, *out_b, *key_pe, *r_w_bias, *r_r_bias;
    /* aspan, per layer*head: key rows, reach, offset of the mask in `derived` */
    int *krows, *reach;
    int64_t *mask_off;
    int max_window;               /* the most key rows (aspan) or keys (par) a query visits */
    /* the memory's layout: mem_t's offsets, per slot (layer*head or layer) */
    size_t mem_floats;
    size_t *h_off;
    int64_t *d_off;
    /* per-step buffers, rows N = max_batch * max_block */
    float *x, *qkv, *att, *tmp, *ff, *logits;
    /* aspan decode: the partial results of a query's key splits
     * (ASPAN_SPLIT_BLOCKS records of d_head + 4 floats), NULL for par */
    float *part;
    /* per-step inputs: staged in pinned host memory, copied in one transfer */
    void *h_stage, *d_stage;
    size_t stage_bytes;
    size_t o_tok, o_pos, o_ring, o_len;   /* offsets in the stage */
    size_t step_bytes, weight_bytes;
    /* gpu_profile: an event before the step and after each operation */
    int prof_on, prof_n;
    cudaEvent_t *prof_ev;         /* GPU_PROF_EVENTS + 1, created when profiling starts */
    int prof_op[GPU_PROF_EVENTS];
    double prof_ms[OP_N];
    long prof_calls[OP_N];
};

/* Step inputs, on the device. */
static inline int32_t *stage_tok(const gpu_model *g, void *base) { return (int32_t *)((char *)base + g->o_tok); }
static inline int64_t *stage_pos(const gpu_model *g, void *base) { return (int64_t *)((char *)base + g->o_pos); }
static inline float **stage_ring(const gpu_model *g, void *base) { return (float **)((char *)base + g->o_ring); }
static inline int *stage_len(const gpu_model *g, void *base) { return (int *)((char *)base + g->o_len); }

/* Ring row of absolute position P (negative: the zeros before the start) in
 * a ring of R rows, as core/aspan.c. */
static __device__ __forceinline__ int ring_slot(int64_t p, int r)
{
    int64_t s = p % r;
    return (int)(s < 0 ? s + r : s);
}

/* The most (query, head, split) blocks an adaptive-span step splits its keys
 * over (flash-decoding); the partials buffer holds one record for each. */
#define ASPAN_SPLIT_BLOCKS 8192

/* ---- launchers (each in its own file) ---- */

/* matmul.cu: y[n x out] = x[n x in] W^T, W out x in row-major (no bias). */
int gpu_linear(gpu_model *g, float *y, const float *x, const float *W, int n, int in, int out, char *err);
/* embed.cu: x[n] = emb[tok[n]] * scale */
int gpu_embed(gpu_model *g, float *x, const float *emb, const int32_t *tok, int n, int d, float scale, char *err);
/* bias_relu.cu: y = max(y + b, 0), rows of d */
int gpu_bias_relu(gpu_model *g, float *y, const float *b, int n, int d, char *err);
/* layernorm.cu: x = LN(x + (r + rb)) * w + b; rb may be NULL */
int gpu_add_layernorm(gpu_model *g, float *x, const float *r, const float *rb, const float *w, const float *b, int n,
                      int d, char *err);
/* logsoftmax.cu: y = log_softmax(y + b), rows of d */
int gpu_log_softmax(gpu_model *g, float *y, const float *b, int n, int d, char *err);
/* aspan_attn.cu: one layer's span-limited attention for B streams x M queries */
int gpu_aspan_attn(gpu_model *g, int layer, int B, int M, char *err);
/* rel_attn.cu: one PAR block's relative attention */
int gpu_rel_attn(gpu_model *g, int layer, int B, int M, char *err);
/* the most shared memory a block of either attention asks for */
size_t gpu_aspan_attn_smem(const gpu_model *g);
size_t gpu_rel_attn_smem(const gpu_model *g);
/* ring.cu: the block's keys and values into the rings (after the layer's attention) */
int gpu_aspan_ring_write(gpu_model *g, int layer, int B, int M, char *err);
int gpu_par_ring_write(gpu_model *g, int layer, int B, int M, char *err);

#endif
