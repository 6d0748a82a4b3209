/*
 * gpu.h - the CUDA forward of the families: the same computation as core's
 * model_forward (core/aspan.c, core/par.c, core/txl.c, core/gpt.c), on the
 * device, in one of two precisions:
 *
 *   GPU_FP32  float32 throughout: core's results to float rounding.
 *   GPU_BF16  the weights of the linear layers, their inputs and the memory's
 *             rings in bfloat16; products, sums, softmax, LayerNorm and the
 *             residual stream in float32 (cuBLAS on tensor cores). Half the
 *             bytes a step reads and a session keeps.
 *
 *   gpu_model  a model's weights on the device (uploaded once) and every
 *              per-step buffer, planned for max_batch streams x max_block
 *              tokens: a step allocates nothing.
 *   gpu_mem    the memory of a stream on the device: the same rings, in the
 *              same layout and at the same offsets as core's mem_t
 *              (core/mem.c), so a session moves between host and device with
 *              one copy (gpu_mem_upload / gpu_mem_download).
 *
 * Plain C11: no CUDA type appears here. A gpu_model and its memories belong
 * to one thread at a time, except that gpu_mem_upload and gpu_mem_download
 * of a memory may run beside a gpu_forward of other memories (they copy on
 * the default stream; steps run on the model's non-blocking stream). Errors
 * follow core/err.h: -1 or NULL, and a message in ERR (ERR_LEN bytes, may be
 * NULL).
 */
#ifndef SPANSERVE_GPU_H
#define SPANSERVE_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "model.h"

typedef struct gpu_model gpu_model;

enum { GPU_FP32 = 0, GPU_BF16 = 1 };

typedef struct gpu_mem {
    gpu_model *g;
    void *buf;             /* device: all rings, laid out as mem_t's buf, in the model's precision */
    size_t n_floats;       /* elements (mem_t's floats): 4 bytes each in GPU_FP32, 2 in GPU_BF16 */
    int64_t pos;           /* positions consumed so far */
    int *len;              /* host, n_layers: par rows held per layer */
    int32_t pending;       /* the last token, not yet fed; -1 if none */
    /* window models (model_t.window > 0; NULL and -1 otherwise): mem_t's
     * ring of the last `window` tokens fed, on the host (gpt_plan reads it
     * to cut a step into windows; the GPU forward advances it as core's
     * model_forward does), and how a forward reads it (mem_windows' keep) */
    int32_t *toks;
    int keep;
} gpu_mem;

/* 0 when a CUDA device can be used; else -1 and why in ERR. */
int gpu_available(char *err);
/* The current device's name (cudaGetDeviceProperties) into NAME (CAP
 * bytes); 0, or -1 and why in ERR. */
int gpu_device_name(char *name, size_t cap, char *err);

/* Uploads M's weights (M must outlive the result) and plans the buffers of a
 * step of up to MAX_BATCH streams x MAX_BLOCK tokens, in PRECISION
 * (GPU_FP32 or GPU_BF16). Adaptive-span models plan by rows only: a step
 * may be any B x M of up to MAX_BATCH x MAX_BLOCK rows (B <= MAX_BATCH),
 * so that one stream reads a long block (core's model_score_block). */
gpu_model *gpu_model_new(const model_t *m, int max_batch, int max_block, int precision, char *err);
/* Whether this backend runs M's family (0 with WHY when it does not). */
int gpu_supports(const model_t *m, char *why);
void gpu_model_free(gpu_model *g);
const model_t *gpu_model_host(const gpu_model *g);
const char *gpu_model_device_name(const gpu_model *g);
/* Device bytes held by the weights (and derived tables) and by the step
 * buffers. */
size_t gpu_model_weight_bytes(const gpu_model *g);
size_t gpu_model_step_bytes(const gpu_model *g);
int gpu_model_precision(const gpu_model *g);
/* "fp32" or "bf16"; gpu_precision_parse gives GPU_FP32, GPU_BF16 or -1. */
const char *gpu_precision_name(int precision);
int gpu_precision_parse(const char *name);
/* Device bytes of one stream's memory (gpu_mem_new's allocation). */
size_t gpu_mem_bytes(const gpu_model *g);

/* Decode steps (one token per stream) run as CUDA graphs, one captured per
 * batch size at its first step, unless turned off here (on by default; off
 * while profiling, whose events need the launches one by one). A capture
 * that fails turns graphs off for the model, with the reason in
 * gpu_graph_status. */
void gpu_graphs(gpu_model *g, int on);
/* Blocks of 16 queries or more (heads of 32 or 64 dims) take the tiled
 * attention kernels (kernels/aspan_tile.cu, rel_tile.cu) when they have blocks
 * enough to fill the device, and adaptive-span decode steps the one-pass
 * kernel (aspan_decode.cu): ON 1 (the default); 0 never (the per-query
 * kernels aspan_attn.cu and rel_attn.cu, to compare); 2 the tiled kernels
 * whenever the shapes allow (for tests). */
void gpu_tiles(gpu_model *g, int on);
/* Decode steps' attention of one token a stream in GPU_BF16 (aspan_decode.cu,
 * rel_decode.cu) splits each head's keys into pieces of at least TILES tiles
 * (of 128 keys) a thread block. 1, the default, leaves the choice to the
 * step's size (1 to 8 tiles, so that the blocks fill the device about
 * twice; more where the partial states' buffer needs it); more makes fewer
 * blocks, each looping over its tiles (for tests and comparisons). */
void gpu_decode_attn_tiles(gpu_model *g, int tiles);
/* ... and, in adaptive-span, chooses the tiles a block so that the blocks
 * are about FILL times the SMs (1 to 64; 3, the default: one round of the
 * kernel's blocks of 4 warps, 3 an SM. Relative attention keeps 6: two
 * rounds) */
void gpu_decode_attn_fill(gpu_model *g, int fill);
/* The order of the blocks of a decode attention of many streams
 * (aspan_decode.cu's bf16 kernel), one a (stream, head, split of the
 * head's keys): ORDER 1 (the default, and for any other value) puts every
 * stream's copy of a split together and the splits longest first, so that
 * the blocks that start last are short; 2 every stream's copy together, in
 * head order; 0 stream by stream, each stream's heads and splits in order.
 * SPANSERVE_GPU_SPLIT_ORDER=0 or 2 at load sets it. The same bits in every
 * order. */
void gpu_decode_split_order(gpu_model *g, int order);
/* The skinny products (bf16, 9 to 64 rows: decode steps of many streams) of
 * 1,024 inputs or more whose tiles fill no more than half the SMs (fc2):
 * MODE 2 (the default) takes a cluster of two blocks a tile, half the
 * inputs each, the second storing its sums into the first's shared memory
 * and arriving on its mbarrier; 1 the same cluster meeting at two cluster
 * barriers (the same bits); 0 a block a tile. SPANSERVE_GPU_SPLITK=0 or 1
 * at load sets it. */
void gpu_decode_splitk(gpu_model *g, int mode);
/* The skinny products (as above) whose tiles of 8 outputs fill no more
 * than half the SMs (Wo of 512 outputs), in steps of more than 32 streams:
 * ON 1 (the default) splits the rows over two blocks a tile (32 each, half
 * of x's rows loaded a block; the same bits), 0 a block a tile.
 * SPANSERVE_GPU_MSPLIT=0 at load turns it off. */
void gpu_decode_msplit(gpu_model *g, int on);
/* A decode step that carries its LayerNorms (below) with a plain output
 * layer: ON 1 (the default) carries the last LayerNorm into the output
 * layer's product too (its weight and bias folded in at load, as QKV's and
 * fc1's), so it needs no launch of its own; 0 launches it.
 * SPANSERVE_GPU_OUT_FOLD=0 at load turns it off. */
void gpu_decode_out_fold(gpu_model *g, int on);
/* How a bf16 decode step of many streams (the graphs) meets the splits of
 * adaptive-span's attention: ON 1 (the default; SPANSERVE_GPU_COMBINE=0 at
 * load turns it off) a warp a (stream, head), the records loaded at once;
 * 0 a block a (stream, head) looping over the records one after another. */
void gpu_decode_combine(gpu_model *g, int on);
/* A diagnostic for the benchmark: a decode step that carries its
 * LayerNorms (below) launches the operations in OPS (GPU_TWICE_ bits) twice
 * each, so that a step's time less the plain step's is what those
 * operations cost inside the graph, overlaps included (GPU_TWICE_ATTN: the
 * attention and its splits' meeting; GPU_TWICE_COMBINE: adaptive-span's
 * meeting alone, in any decode step of many streams). The results are then
 * wrong (the residual is added twice, the rings written twice): for timing
 * only. LAYER: in that layer alone, or (-1) in every layer. OPS 0,
 * the default, launches each once. */
enum { GPU_TWICE_QKV = 1, GPU_TWICE_ATTN = 2, GPU_TWICE_WO = 4, GPU_TWICE_FC1 = 8, GPU_TWICE_FC2 = 16, GPU_TWICE_COMBINE = 32 };
void gpu_decode_twice(gpu_model *g, unsigned ops, int layer);
/* A diagnostic for the benchmark: the last decode step of B streams (its
 * inputs as they are on the device) launched again K times back to back,
 * then one wait: a step's time on the device, without the host's part of
 * each step (the inputs' copy, the launch, the wait). The memories are
 * not advanced (each replay writes the same rows into the rings again):
 * for timing only. 0, or -1 with ERR. */
int gpu_decode_replay(gpu_model *g, int B, int k, char *err);
/* A bf16 decode step of 9 to 64 streams on the graphs, of a post-LN model
 * whose linear layers take 512 inputs or a multiple (the skinny products):
 * ON 1 (the default; SPANSERVE_GPU_LN_FUSE=0 at load turns it off) carries
 * each residual's LayerNorm in the products around it: Wo or fc2 adds the
 * residual and sums each row, QKV or fc1 applies the LayerNorm after its
 * product (the LayerNorm's weight and bias folded into it at load), so the
 * step has no LayerNorm launch but its last (none where the output layer
 * carries that one: gpu_decode_out_fold); 0 launches them. _steps: the
 * steps that took it. */
void gpu_decode_ln_fuse(gpu_model *g, int on);
long gpu_decode_ln_fuse_steps(const gpu_model *g);
/* In GPU_BF16, the attention of blocks of 16 queries or more (heads of 32
 * or 64 dims) runs its products (q.k, q.position, p.v) on tensor cores
 * (kernels/attn_mma.cu: mma.sync, bf16 inputs, fp32 sums, an online softmax
 * over tiles of keys; adaptive-span with or without persistent memory,
 * relative attention, the window models): ON 1 (the default), 0 the
 * CUDA-core kernels (to compare). GPU_FP32 always keeps its exact kernels. */
void gpu_tensor_cores(gpu_model *g, int on);
/* In GPU_BF16 a decode step of up to 8 streams can run as one persistent
 * kernel (kernels/decode_step.cu), planned at load where the model's shapes
 * allow it (adaptive-span and PAR, heads of 32 or 64 dims:
 * gpu_decode_kernel_status gives 1, else 0 and *WHY the reason; *STEPS:
 * the steps it ran). MODE: GPU_DECODE_AUTO (the default) takes it for a
 * step of few enough streams that the step's widest attention keeps the
 * grid busy for at most a few rounds of its blocks (past that the graphs'
 * attention kernels are faster: README "Decode as one kernel"),
 * GPU_DECODE_KERNEL for every step of up to 8 streams, GPU_DECODE_GRAPHS
 * never. SPANSERVE_GPU_DECODE_KERNEL at load: "auto", "1" (the kernel) or
 * "0" (the graphs). gpu_decode_kernel_limit: the most streams a step may
 * have to take it in the current mode (0: none). */
enum { GPU_DECODE_GRAPHS = 0, GPU_DECODE_AUTO = 1, GPU_DECODE_KERNEL = 2 };
void gpu_decode_kernel(gpu_model *g, int mode);
int gpu_decode_kernel_status(const gpu_model *g, long *steps, const char **why);
int gpu_decode_kernel_limit(const gpu_model *g);
/* The decode kernel's steps of up to MAX_B streams (0 to 8; the default,
 * gpu_decode_ffn_default, 8) take each feed-forward sublayer as one phase,
 * fc2's sums over the grid added in fixed point (decode_step.cu: FFN),
 * where the model's shapes allow it (an inner layer of a multiple of 16
 * up to 16 x the SMs, a model of 128, 256 or 512); other steps take fc1
 * and fc2 as two phases. SPANSERVE_GPU_DECODE_FFN at load: a digit 0-8.
 * gpu_decode_ffn_status: whether the shapes allow it (else *WHY says why),
 * *STEPS the steps that took it. */
void gpu_decode_ffn(gpu_model *g, int max_b);
int gpu_decode_ffn_default(void);
int gpu_decode_ffn_max(const gpu_model *g);   /* MAX_B now */
int gpu_decode_ffn_status(const gpu_model *g, long *steps, const char **why);
/* The decode kernel's steps of 1 or 2 streams take each attention's Wo
 * into the attention's phase (ON 1, the default; 0: a phase of its own):
 * each block takes a piece of Wo (a head's columns, 32 or 64 rows), waits
 * for that head's output (a flag its item sets) and adds its sums in fixed
 * point, as the one-phase feed-forward does (decode_step.cu: WO1), where
 * the pieces are no more than the SMs. SPANSERVE_GPU_DECODE_WO=0 at load
 * turns it off. gpu_decode_wo_status: whether the shapes allow it, *STEPS
 * the steps that took it. */
void gpu_decode_wo(gpu_model *g, int on);
int gpu_decode_wo_on(const gpu_model *g);
int gpu_decode_wo_status(const gpu_model *g, long *steps, const char **why);
/* What the decode kernel's phases read as it lands (decode_step.cu: LL),
 * MODE's bits: GPU_LL_QKV, the attention reads QKV's outputs so (no grid
 * barrier between QKV and the attention: one fewer a layer); GPU_LL_WO, in
 * steps whose attention takes its Wo (gpu_decode_wo), Wo reads the heads'
 * outputs so (no flag a head). The writer puts each number with its
 * phase's tag in one 64-bit word; the reader, its other loads issued,
 * polls the words it needs until they hold its tag. The steps give the
 * same bits either way. GPU_DECODE_LL_DEFAULT unless SPANSERVE_GPU_DECODE_LL
 * (a digit, 0 to 3) at load says otherwise; 0 keeps the barrier and the
 * flags. */
enum { GPU_LL_QKV = 1, GPU_LL_WO = 2 };
#define GPU_DECODE_LL_DEFAULT 0   /* (off until a device has measured it: README) */
void gpu_decode_ll(gpu_model *g, int mode);
int gpu_decode_ll_mode(const gpu_model *g);
/* For tests: the LL epoch set so that the step after N more steps of LL
 * wraps it (the words zeroed; -1 without a decode kernel) */
int gpu_decode_ll_wrap_in(gpu_model *g, long n);
/* With ON, the decode kernel's steps record when each block reaches each
 * of its grid barriers (-1 without a decode kernel); after a step,
 * gpu_decode_trace_report writes that step's time by phase (the slowest
 * block's work, the barrier's wait) into OUT. For make bench. */
int gpu_decode_trace(gpu_model *g, int on, char *err);
int gpu_decode_trace_report(gpu_model *g, char *out, size_t cap, char *err);
/* Steps run as a graph so far, and graphs captured; *WHY (may be NULL) is
 * the reason graphs went off, or "". */
void gpu_graph_status(const gpu_model *g, long *launches, int *captured, const char **why);

/* A zeroed memory (what mem_new gives: a window model's stream mode, keep
 * -1), on the device. */
gpu_mem *gpu_mem_new(gpu_model *g, char *err);
void gpu_mem_free(gpu_mem *s);
/* What mem_reset does: rings, lengths, token ring, position and pending
 * token cleared; keep (the stream's mode) left as it is. */
int gpu_mem_reset(gpu_mem *s, char *err);
/* Host <-> device: rings, position, lengths, pending token, and a window
 * model's token ring and keep. S's model must be the gpu_model's. In
 * GPU_BF16 the rings are rounded to bfloat16 on the way up and widened on
 * the way down. */
int gpu_mem_upload(gpu_mem *dst, const mem_t *src, char *err);
int gpu_mem_download(const gpu_mem *src, mem_t *dst, char *err);

/* model_forward on the device: feeds tokens[b*M + i] (B <= max_batch
 * streams, M <= max_block tokens each; adaptive-span: any M with B x M <=
 * max_batch x max_block) with each stream's memory, advancing
 * the memories (pos, len; a window model's token ring). Writes B*M rows of V log-probabilities to
 * LOGPROBS (host memory) if not NULL. Returns when the step is done: 0, or
 * -1 with ERR set. */
int gpu_forward(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, float *logprobs, char *err);
/* The same with model_forward_targets' TARGETS (NULL: whole rows): a stream
 * with targets gets only those logprobs from the device (one float a row,
 * not V). */
int gpu_forward_targets(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                        float *logprobs, char *err);

/* gpu_forward, then the N picks Q (core/sample.h: sample_pick) from the
 * step's B*M rows, made on the device: only O comes back to the host (and
 * with TARGETS, model_forward_pick's, their logprobs into TLP). */
int gpu_forward_pick(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                     float *tlp, int n, const pick_req *q, pick_out *o, char *err);
/* The same, with MW(MW_CTX) (if not NULL) called once the step and its picks
 * are launched, before they are waited for (model_forward_pick_while). */
int gpu_forward_pick_while(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                           float *tlp, int n, const pick_req *q, pick_out *o, fwd_meanwhile mw, void *mw_ctx,
                           char *err);
/* Picks (gpu_forward_pick) that went up with their step's inputs, since
 * the load: a step of up to 16 picks stages them in its one transfer, and
 * the pick kernel writes its answers into pinned host memory (no copy
 * either way of their own); more take a copy each way. */
long gpu_picks_staged(const gpu_model *g);
/* Whether staged picks are written into pinned host memory through its
 * device address (ON 1: the default, where the device maps it) or into
 * device memory and copied back (0); returns whether they now go straight. */
int gpu_picks_mapped(gpu_model *g, int on);

/* The picks Q from N_ROWS rows of V logprobs the host gives (ROWS), made as
 * gpu_forward_pick makes them (tests and benchmarks of the picking alone). */
int gpu_pick_rows(gpu_model *g, const float *rows, int n_rows, int n, const pick_req *q, pick_out *o, char *err);

/* The log-probabilities of the last step, on the device (B*M rows of V). */
const float *gpu_logprobs_device(const gpu_model *g);

/* Device time per operation: while on, each step records an event after
 * each operation (embed, qkv, attention, ring, wo, layernorm, fc1, relu,
 * fc2, out, logsoftmax). gpu_profile_read gives up to CAP names with their
 * milliseconds and calls since the last read, and starts again; it returns
 * how many. */
int gpu_profile(gpu_model *g, int on, char *err);
int gpu_profile_read(gpu_model *g, const char **names, double *ms, long *calls, int cap);
/* The last profiled step's operations in the order they ran, up to CAP,
 * with their milliseconds (a layer's attention, products ...): how many */
int gpu_profile_last(const gpu_model *g, const char **names, double *ms, int cap);

/* Starts (ON) or stops the profiler's capture (cudaProfilerStart/Stop:
 * `ncu --profile-from-start off` then profiles only the kernels between). */
void gpu_profiler_range(int on);

/* Wall time between two marks on the model's stream, measured with CUDA
 * events (for benchmarks). */
typedef struct gpu_timer gpu_timer;
gpu_timer *gpu_timer_new(gpu_model *g, char *err);
void gpu_timer_start(gpu_timer *t);
double gpu_timer_stop_ms(gpu_timer *t);   /* waits for the stop mark */
void gpu_timer_free(gpu_timer *t);

#ifdef __cplusplus
}
#endif

#endif
