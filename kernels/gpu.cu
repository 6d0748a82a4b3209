/*
 * gpu.cu - a model on the device: the weights uploaded once, the tables its
 * family derives at load (fam_aspan.cu, fam_rel.cu, fam_gpt.cu, listed here
 * by name), every per-step buffer planned for max_batch x max_block tokens;
 * the memory of a stream on the device, in mem_t's layout (and a window
 * model's token ring, on the host); the device's name; timers.
 *
 * The weights: core keeps every tensor in one float arena (core/model.c), so
 * the arena travels in one copy and each device pointer is the host pointer's
 * offset into it. The adaptive-span query, key and value projections are
 * packed into one 3H x H matrix so that a layer's projections are one GEMM.
 * In GPU_BF16 the linear layers' weights are also kept in bfloat16 (converted
 * on the device from the float32 copy), and the memory of a stream is a
 * bfloat16 copy of mem_t's rings.
 */
#include "gpu_internal.cuh"
#include <cuda_profiler_api.h>

extern "C" {
#include "family.h"   /* the family's name and memory slots */
}

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Bounds on a plan: a step of more rows than this is a caller's mistake
 * (65536 streams of 1 token, or 64 of 16384), and keeps the products below
 * from overflowing. */
#define GPU_MAX_ROWS (1 << 20)

int gpu_available(char *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return err_set(err, "%s", cudaGetErrorString(e));
    if (n == 0) return err_set(err, "no CUDA device");
    return 0;
}

int gpu_device_name(char *name, size_t cap, char *err)
{
    int dev = 0;
    cudaDeviceProp p;
    CU_TRY(cudaGetDevice(&dev), err, "cudaGetDevice");
    CU_TRY(cudaGetDeviceProperties(&p, dev), err, "cudaGetDeviceProperties");
    snprintf(name, cap, "%s", p.name);
    return 0;
}

const model_t *gpu_model_host(const gpu_model *g) { return g->m; }
const char *gpu_model_device_name(const gpu_model *g) { return g->device; }
size_t gpu_model_weight_bytes(const gpu_model *g) { return g->weight_bytes; }
size_t gpu_model_step_bytes(const gpu_model *g) { return g->step_bytes; }
const float *gpu_logprobs_device(const gpu_model *g) { return g->logits; }
int gpu_model_precision(const gpu_model *g) { return g->prec; }
size_t gpu_mem_bytes(const gpu_model *g) { return g->mem_floats * g->ring_elem; }

const char *gpu_precision_name(int precision) { return precision == GPU_BF16 ? "bf16" : "fp32"; }

int gpu_precision_parse(const char *name)
{
    if (name && strcmp(name, "fp32") == 0) return GPU_FP32;
    if (name && strcmp(name, "bf16") == 0) return GPU_BF16;
    return -1;
}

void gpu_graphs(gpu_model *g, int on)
{
    g->graphs_on = on;
    if (on) g->graph_why[0] = 0;
}

/* The decode graphs captured so far (they hold the kernels chosen then). */
static void drop_graphs(gpu_model *g)
{
    cudaStreamSynchronize(g->stream);
    for (int b = 0; g->graph && b < g->max_batch; b++)
        if (g->graph[b]) {
            cudaGraphExecDestroy(g->graph[b]);
            g->graph[b] = NULL;
        }
    for (int i = 0; i < GPU_LAYER_GRAPHS; i++)
        if (g->lgraph[i]) {
            cudaGraphExecDestroy(g->lgraph[i]);
            g->lgraph[i] = NULL;
        }
}

void gpu_decode_attn_tiles(gpu_model *g, int tiles)
{
    if (tiles < 1) tiles = 1;
    if (tiles != g->dec_tiles) drop_graphs(g);
    g->dec_tiles = tiles;
}

void gpu_decode_attn_fill(gpu_model *g, int fill)
{
    fill = fill < 1 ? DEC_FILL_DEFAULT : fill > 64 ? 64 : fill;
    if (fill != g->dec_fill) drop_graphs(g);
    g->dec_fill = fill;
}

void gpu_decode_split_order(gpu_model *g, int order)
{
    order = order < 0 || order > 2 ? 1 : order;
    if (order != g->split_order) drop_graphs(g);
    g->split_order = order;
}

void gpu_decode_splitk(gpu_model *g, int mode)
{
    mode = mode < 0 || mode > 2 ? 2 : mode;
    if (mode != g->sk_split) drop_graphs(g);
    g->sk_split = mode;
}

void gpu_decode_out_fold(gpu_model *g, int on)
{
    on = on != 0;
    if (on != g->out_fold) drop_graphs(g);
    g->out_fold = on;
}

void gpu_decode_msplit(gpu_model *g, int on)
{
    on = on != 0;
    if (on != g->sk_msplit) drop_graphs(g);
    g->sk_msplit = on;
}

void gpu_decode_combine(gpu_model *g, int on)
{
    on = on != 0;
    if (on != g->comb_warp) drop_graphs(g);
    g->comb_warp = on;
}

void gpu_decode_twice(gpu_model *g, unsigned ops, int layer)
{
    if (ops != g->twice || layer != g->twice_layer) drop_graphs(g);
    g->twice = ops;
    g->twice_layer = layer < 0 ? -1 : layer;
}

void gpu_decode_ln_fuse(gpu_model *g, int on)
{
    on = on != 0;
    if (on != g->lnf_on) drop_graphs(g);   /* a graph keeps the kernels of its capture */
    g->lnf_on = on;
}

long gpu_decode_ln_fuse_steps(const gpu_model *g) { return g->lnf_steps; }

void gpu_tiles(gpu_model *g, int on)
{
    if (on != g->tile_on) drop_graphs(g);   /* a graph keeps the kernels of its capture */
    g->tile_on = on;
}

void gpu_tensor_cores(gpu_model *g, int on)
{
    if (on != g->tc_on) drop_graphs(g);
    g->tc_on = on;
}

void gpu_decode_kernel(gpu_model *g, int mode) { g->mk_on = mode; }

int gpu_decode_kernel_limit(const gpu_model *g) { return gpu_mk_limit(g); }

int gpu_decode_kernel_status(const gpu_model *g, long *steps, const char **why)
{
    if (steps) *steps = g->mk_steps;
    if (why) *why = g->mk ? "" : g->mk_why;
    return g->mk != NULL;
}

long gpu_picks_staged(const gpu_model *g) { return g->picks_staged; }

int gpu_picks_mapped(gpu_model *g, int on)
{
    g->m_po = on ? g->m_po_dev : NULL;
    return g->m_po != NULL;
}

void gpu_graph_status(const gpu_model *g, long *launches, int *captured, const char **why)
{
    if (launches) *launches = g->graph_launches;
    if (captured) *captured = g->graphs_captured;
    if (why) *why = g->graph_why;
}

const float *gpu_on_device(const gpu_model *g, const float *p, size_t n)
{
    if (!p) return NULL;
    const float *a = g->m->arena;
    if (p < a || p + n > a + g->arena_floats) return NULL;
    return g->arena + (p - a);
}


static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

void gpu_model_free(gpu_model *g)
{
    if (!g) return;
    if (g->stream) cudaStreamSynchronize(g->stream);
    if (g->graph) {
        for (int b = 0; b < g->max_batch; b++)
            if (g->graph[b]) cudaGraphExecDestroy(g->graph[b]);
        free(g->graph);
    }
    for (int i = 0; i < GPU_LAYER_GRAPHS; i++)
        if (g->lgraph[i]) cudaGraphExecDestroy(g->lgraph[i]);
    cudaFree(g->arena);
    cudaFree(g->wbf);
    cudaFree(g->lnf_tab);
    cudaFree(g->derived);
    cudaFree(g->mma_tab);
    cudaFree(g->mma_vr);
    cudaFree(g->krows);
    cudaFree(g->reach);
    cudaFree(g->mask_off);
    cudaFree(g->d_off);
    cudaFree(g->x);
    cudaFree(g->part);
    cudaFree(g->tpart);
    cudaFree(g->d_stage);
    cudaFree(g->blas_ws);
    cudaFree(g->ada_mem);
    cudaFree(g->tl);
    if (g->ada && g->ada->h_cnt) cudaFreeHost(g->ada->h_cnt);
    if (g->ada && g->ada->h_rows) cudaFreeHost(g->ada->h_rows);
    free(g->ada);
    gpu_gpt_free(g->gpt);
    gpu_mk_free(g->mk);
    if (g->h_tl) cudaFreeHost(g->h_tl);
    cudaFree(g->d_pq);
    cudaFree(g->d_po);
    if (g->h_pq) cudaFreeHost(g->h_pq);
    if (g->h_po) cudaFreeHost(g->h_po);
    if (g->h_stage) cudaFreeHost(g->h_stage);
    if (g->prof_ev) {
        for (int i = 0; i <= GPU_PROF_EVENTS; i++) cudaEventDestroy(g->prof_ev[i]);
        free(g->prof_ev);
    }
    if (g->blas) cublasDestroy(g->blas);
    for (int k = 0; k < GPU_LT_PLANS; k++) gpu_lt_plan_free(&g->lt_plans[k]);
    if (g->lt) cublasLtDestroy(g->lt);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g->L);
    free(g->h_off);
    free(g);
}

/* The feed-forward sublayer's weights of layer Y into D; -1 when one lies
 * outside the arena. */
int gpu_bind_ffn(const gpu_model *g, gpu_layer *d, const layer_t *y)
{
    const size_t Dm = g->m->d_model, I = g->m->d_inner;
    d->fc1_w = gpu_on_device(g, y->fc1_w, I * Dm);
    d->fc1_b = gpu_on_device(g, y->fc1_b, I);
    d->fc2_w = gpu_on_device(g, y->fc2_w, I * Dm);
    d->fc2_b = gpu_on_device(g, y->fc2_b, Dm);
    d->ln2_w = gpu_on_device(g, y->ln2_w, Dm);
    d->ln2_b = gpu_on_device(g, y->ln2_b, Dm);
    return d->fc1_w && d->fc1_b && d->fc2_w && d->fc2_b && d->ln2_w && d->ln2_b ? 0 : -1;
}

/* The adaptive input and softmax: pointers into the arena, and what core
 * derived at load (the projections transposed, the head's stacked weights)
 * copied up, with the softmax's step buffers, in one allocation. */
static int upload_ada(gpu_model *g, char *err)
{
    const model_t *m = g->m;
    const adaptive *a = m->ada;
    const size_t D = m->d_model, N = (size_t)g->max_batch * g->max_block;
    gpu_ada *d = (gpu_ada *)calloc(1, sizeof *d);
    if (!(g->ada = d)) return err_set(err, "out of memory");
    d->n = a->n;
    d->H = a->cut[1] + a->n - 1;
    size_t nf = align16((size_t)d->H * a->dim[0]) + align16(d->H);
    for (int k = 0; k < a->n; k++) {
        const size_t rows = (size_t)(a->cut[k + 1] - a->cut[k]), dim = a->dim[k];
        d->cut[k] = a->cut[k];
        d->dim[k] = a->dim[k];
        d->dmax = a->dim[k] > d->dmax ? a->dim[k] : d->dmax;
        /* the adaptive input's tables, unless a plain embedding comes first (par-tf: m->emb) */
        d->emb[k] = m->emb ? NULL : gpu_on_device(g, a->emb[k], rows * dim);
        d->emb_proj[k] = !m->emb && a->emb_proj[k] ? gpu_on_device(g, a->emb_proj[k], D * dim) : NULL;
        d->out_w[k] = gpu_on_device(g, a->out_w[k], rows * dim);
        d->out_b[k] = gpu_on_device(g, a->out_b[k], rows);
        d->proj_b[k] = gpu_on_device(g, a->out_proj_b[k], dim);
        if ((!m->emb && (!d->emb[k] || (a->emb_proj[k] && !d->emb_proj[k]))) || !d->out_w[k] || !d->out_b[k] ||
            (a->out_proj_b[k] && !d->proj_b[k]))
            return err_set(err, "%s: cluster %d: a weight lies outside the model's arena", m->path, k);
        if (a->out_proj_t[k]) nf += align16(dim * D);
        if (k > 0) nf += align16(rows);   /* the tail's bias, 16-byte aligned (adaptive.cu reads it 4 floats at a time) */
    }
    d->cut[a->n] = a->cut[a->n];
    int vmax = d->H, tmax = 1;   /* the longest segment a log-softmax chunks (adaptive.cu, 8192 a chunk) */
    for (int k = 1; k < a->n; k++) tmax = a->cut[k + 1] - a->cut[k] > tmax ? a->cut[k + 1] - a->cut[k] : tmax;
    vmax = tmax > vmax ? tmax : vmax;
    d->ldh = (d->H + 7) & ~7;
    d->ldt = (tmax + 7) & ~7;
    const size_t nhead = align16(N * d->ldh), nhp = align16(N * (size_t)d->dmax), ntail = a->n > 1 ? align16(N * d->ldt) : 0;
    const size_t npart = align16(N * (size_t)((vmax + 8191) / 8192) * 4);   /* 2 doubles a chunk */
    const size_t nrows = align16(N * (size_t)a->n + 16);   /* the tail clusters' row lists and counts (ints) */
    /* a step of targets: each row's logprob of each tail cluster, and the target's logit a row of a cluster */
    const size_t ntgt = align16(N * (size_t)ADA_MAX_CLUSTERS) + align16(N);
    nf += nhead + nhp + ntail + npart + ntgt + (g->prec == GPU_BF16 ? align16((nhp + 1) / 2) : 0);
    nf += nrows + nhp + (g->prec == GPU_BF16 ? align16((nhp + 1) / 2) : 0);
    CU_TRY(cudaMalloc(&g->ada_mem, nf * sizeof(float)), err, "cudaMalloc (adaptive softmax)");
    float *at = g->ada_mem;
    CU_TRY(cudaMemcpy(at, a->head_w, (size_t)d->H * a->dim[0] * sizeof(float), cudaMemcpyHostToDevice), err,
           "cudaMemcpy (adaptive head)");
    d->head_w = at;
    at += align16((size_t)d->H * a->dim[0]);
    CU_TRY(cudaMemcpy(at, a->head_b, (size_t)d->H * sizeof(float), cudaMemcpyHostToDevice), err, "cudaMemcpy (adaptive head)");
    d->head_b = at;
    at += align16(d->H);
    for (int k = 0; k < a->n; k++)
        if (a->out_proj_t[k]) {
            CU_TRY(cudaMemcpy(at, a->out_proj_t[k], (size_t)a->dim[k] * D * sizeof(float), cudaMemcpyHostToDevice), err,
                   "cudaMemcpy (adaptive projections)");
            d->proj_t[k] = at;
            at += align16((size_t)a->dim[k] * D);
        }
    for (int k = 1; k < a->n; k++) {   /* the tails' biases, aligned (the arena's out_b above checked only that it is there) */
        const size_t rows = (size_t)(a->cut[k + 1] - a->cut[k]);
        CU_TRY(cudaMemcpy(at, a->out_b[k], rows * sizeof(float), cudaMemcpyHostToDevice), err, "cudaMemcpy (adaptive bias)");
        d->out_b[k] = at;
        at += align16(rows);
    }
    g->derived_floats += at - g->ada_mem;   /* weights, as the rk tables */
    d->head = at;
    d->hp = at + nhead;
    d->tail = d->hp + nhp;
    d->part = (double *)(d->tail + ntail);
    d->hcol = d->tail + ntail + npart;
    d->tval = d->hcol + align16(N * (size_t)ADA_MAX_CLUSTERS);
    float *after = d->tail + ntail + npart + ntgt;
    if (g->prec == GPU_BF16) {
        d->hpb = (bf16 *)after;
        after += align16((nhp + 1) / 2);
    }
    d->rows = (int *)after;
    d->hg = after + nrows;
    if (g->prec == GPU_BF16) d->hgb = (bf16 *)(d->hg + nhp);
    d->step_floats = nhead + nhp + ntail + npart + ntgt + (g->prec == GPU_BF16 ? 2 * align16((nhp + 1) / 2) : 0) + nrows + nhp;
    CU_TRY(cudaMallocHost(&d->h_cnt, ADA_MAX_CLUSTERS * sizeof(int)), err, "cudaMallocHost (adaptive softmax)");
    CU_TRY(cudaMallocHost(&d->h_rows, ((size_t)N * a->n + 16) * sizeof(int)), err, "cudaMallocHost (adaptive softmax)");
    return 0;
}

/* GPU_BF16: bfloat16 copies of every linear layer's weights (the packed
 * projections, the output projection, the feed-forward and the output
 * layer), converted on the device from the float32 ones. */
static int upload_bf16(gpu_model *g, char *err)
{
    const model_t *m = g->m;
    const size_t Dm = m->d_model, I = m->d_inner, A = (size_t)m->n_head * m->d_head;
    const gpu_ada *a = g->ada;
    size_t n = a ? 0 : (size_t)m->V * Dm;
    /* an adaptive softmax's head and tail clusters with their rows rounded up to 8 (zeros past the last):
     * a GEMM of an odd width leaves cuBLAS only its slowest kernels (adaptive.cu computes the padded width
     * and reads the real one) */
    for (int k = 0; a && k < a->n; k++)
        n += (size_t)(a->proj_t[k] ? a->dim[k] * Dm : 0) + (size_t)(k ? ada_pad8(a->cut[k + 1] - a->cut[k]) : 0) * a->dim[k];
    if (a) n += (size_t)ada_pad8(a->H) * a->dim[0];
    for (int l = 0; l < m->n_layers; l++) {
        const gpu_layer *d = &g->L[l];
        if (d->wqkv) n += 3 * A * Dm + Dm * A;
        if (d->fc1_w) n += 2 * I * Dm + (d->fc1_b ? (I + 7) / 8 * 8 : 0);
    }
    g->wbf_elems = n;
    CU_TRY(cudaMalloc(&g->wbf, n * sizeof(bf16)), err, "cudaMalloc (bf16 weights)");
    bf16 *at = g->wbf;
#define TO_BF16(dst, src, count)                                                                                           do {                                                                                                                       if (gpu_to_bf16(g, at, (src), (count), err)) return -1;                                                                (dst) = at;                                                                                                            at += (count);                                                                                                     } while (0)
/* zero rows after a matrix of ROWS rows of DIM, up to ada_pad8(ROWS) */
#define PAD_ROWS(rows, dim)                                                                                            \
    do {                                                                                                               \
        const size_t pad_ = (size_t)(ada_pad8((int)(rows)) - (rows)) * (dim);                                          \
        CU_TRY(cudaMemsetAsync(at, 0, pad_ * sizeof(bf16), g->stream), err, "cudaMemset (padded rows)");               \
        at += pad_;                                                                                                    \
    } while (0)
    if (!a) TO_BF16(g->out_h, g->out_w, (size_t)m->V * Dm);
    else {
        gpu_ada *w = g->ada;
        for (int k = 0; k < a->n; k++) {
            if (a->proj_t[k]) TO_BF16(w->proj_t_h[k], a->proj_t[k], (size_t)a->dim[k] * Dm);
            if (k) {
                const size_t rows = (size_t)(a->cut[k + 1] - a->cut[k]);
                TO_BF16(w->out_w_h[k], a->out_w[k], rows * a->dim[k]);
                PAD_ROWS(rows, a->dim[k]);
            }
        }
        TO_BF16(w->head_w_h, a->head_w, (size_t)a->H * a->dim[0]);
        PAD_ROWS((size_t)a->H, a->dim[0]);
    }
    for (int l = 0; l < m->n_layers; l++) {
        gpu_layer *d = &g->L[l];
        if (d->wqkv) {
            TO_BF16(d->wqkv_h, d->wqkv, 3 * A * Dm);
            TO_BF16(d->wo_h, d->wo, Dm * A);
        }
        if (d->fc1_w) {
            TO_BF16(d->fc1_h, d->fc1_w, I * Dm);
            TO_BF16(d->fc2_h, d->fc2_w, I * Dm);
            if (d->fc1_b) {
                TO_BF16(d->fc1_bh, d->fc1_b, I);
                at += (8 - I % 8) % 8;   /* (the next matrix 16-byte aligned) */
            }
        }
    }
#undef TO_BF16
#undef PAD_ROWS
    CU_TRY(cudaStreamSynchronize(g->stream), err, "converting the weights to bf16");
    return 0;
}

/* float32 products in float32. cuBLAS's default math mode never lowers a
 * float32 GEMM to TF32 (only CUBLAS_TF32_TENSOR_OP_MATH or the environment's
 * NVIDIA_TF32_OVERRIDE=1 would; gpu_model_new refuses the latter).
 * SPANSERVE_GPU_PEDANTIC=1 asks for CUBLAS_PEDANTIC_MATH instead, the
 * slowest and most careful mode, to compare against. */
static cublasMath_t gpu_math_mode(void)
{
    const char *p = getenv("SPANSERVE_GPU_PEDANTIC");
    return p && strcmp(p, "1") == 0 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH;
}

/* The families this backend runs, by core's family name (family_ops). */
static const struct {
    const char *name;
    const gpu_family *fam;
} gpu_families[] = {
    {"adaptive-span", &gpu_family_aspan},
    {"par-transformer-xl", &gpu_family_rel},
    {"transformer-xl", &gpu_family_rel},
    {"par-transformer-xl-tf", &gpu_family_rel},
    {"gpt-adaptive-span", &gpu_family_gpt},
    {"nanogpt", &gpu_family_gpt},
};

static const gpu_family *family_of(const model_t *m)
{
    for (size_t i = 0; i < sizeof gpu_families / sizeof *gpu_families; i++)
        if (strcmp(gpu_families[i].name, m->family->name) == 0) return gpu_families[i].fam;
    return NULL;
}

int gpu_supports(const model_t *m, char *why)
{
    if (family_of(m)) return 1;
    err_set(why, "%s: the CUDA backend does not run %s models yet: it runs on the CPU", m->path, m->family->name);
    return 0;
}

gpu_model *gpu_model_new(const model_t *m, int max_batch, int max_block, int precision, char *err)
{
    if (!m) { err_set(err, "no model"); return NULL; }
    if (!gpu_supports(m, err)) return NULL;
    if (precision != GPU_FP32 && precision != GPU_BF16) {
        err_set(err, "precision %d is neither GPU_FP32 nor GPU_BF16", precision);
        return NULL;
    }
    if (precision == GPU_BF16 && m->d_head % 2) {   /* the bf16 kernels read dims in pairs */
        err_set(err, "%s: bf16 needs heads of an even number of dims (these have %d): use fp32", m->path, m->d_head);
        return NULL;
    }
    if (max_batch < 1 || max_block < 1 || (int64_t)max_batch * max_block > GPU_MAX_ROWS) {
        err_set(err, "a step of %d streams x %d tokens is outside [1, %d] rows", max_batch, max_block, GPU_MAX_ROWS);
        return NULL;
    }
    if (gpu_available(err)) return NULL;
    const char *tf32 = getenv("NVIDIA_TF32_OVERRIDE");
    if (tf32 && strcmp(tf32, "0") != 0) {
        err_set(err, "NVIDIA_TF32_OVERRIDE=%s would turn float32 products into TF32: unset it", tf32);
        return NULL;
    }
    gpu_model *g = (gpu_model *)calloc(1, sizeof *g);
    if (!g) { err_set(err, "out of memory"); return NULL; }
    g->m = m;
    g->fam = family_of(m);
    g->max_batch = max_batch;
    g->max_block = max_block;
    g->max_m = max_block;   /* (a family's alloc_step may raise it) */
    g->prec = precision;
    g->ring_elem = precision == GPU_BF16 ? sizeof(bf16) : sizeof(float);
    g->graphs_on = 1;
    const char *gv = getenv("SPANSERVE_GPU_GEMV");
    g->gemv_on = !(gv && strcmp(gv, "0") == 0);
    const char *pdl = getenv("SPANSERVE_GPU_PDL");
    g->pdl_on = !(pdl && strcmp(pdl, "0") == 0);
    const char *nar = getenv("SPANSERVE_GPU_DECODE_NARROW");
    g->dec_narrow = !(nar && strcmp(nar, "0") == 0);
    const char *sor = getenv("SPANSERVE_GPU_SPLIT_ORDER");
    g->split_order = sor && (strcmp(sor, "0") == 0 || strcmp(sor, "2") == 0) ? sor[0] - '0' : 1;
    const char *spk = getenv("SPANSERVE_GPU_SPLITK");
    g->sk_split = spk && (strcmp(spk, "0") == 0 || strcmp(spk, "1") == 0) ? spk[0] - '0' : 2;
    const char *ofd = getenv("SPANSERVE_GPU_OUT_FOLD");
    g->out_fold = !(ofd && strcmp(ofd, "0") == 0);
    const char *msp = getenv("SPANSERVE_GPU_MSPLIT");
    g->sk_msplit = !(msp && strcmp(msp, "0") == 0);
    const char *cmb = getenv("SPANSERVE_GPU_COMBINE");
    g->comb_warp = !(cmb && strcmp(cmb, "0") == 0);
    const char *lnf = getenv("SPANSERVE_GPU_LN_FUSE");
    g->lnf_on = !(lnf && strcmp(lnf, "0") == 0);
    g->tile_on = 1;
    g->tc_on = 1;
    g->dec_tiles = 1;
    g->dec_fill = DEC_FILL_DEFAULT;
    g->graph = (cudaGraphExec_t *)calloc((size_t)max_batch, sizeof *g->graph);
    g->L = (gpu_layer *)calloc((size_t)m->n_layers, sizeof *g->L);
    const int slots = m->family->mem_slots(m);
    g->h_off = (size_t *)calloc((size_t)(slots ? slots : 1), sizeof *g->h_off);
    mem_t *lay = mem_new(m);   /* the layout, taken from core itself */
    int rc = 0;
    if (!g->L || !g->h_off || !lay || !g->graph) rc = err_set(err, "out of memory");
    if (rc == 0) {
        g->mem_floats = lay->n_floats;
        memcpy(g->h_off, lay->off, (size_t)slots * sizeof *g->h_off);
    }
    mem_free(lay);
    if (rc == 0 && gpu_device_name(g->device, sizeof g->device, err)) rc = -1;
    int dev = 0;
    if (rc == 0 && (cudaGetDevice(&dev) != cudaSuccess ||
                    cudaDeviceGetAttribute(&g->n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess))
        rc = err_set(err, "cudaDeviceGetAttribute (multiprocessors) failed");
    if (rc == 0 && (cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) != cudaSuccess ||
                    cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS ||
                    cublasSetStream(g->blas, g->stream) != CUBLAS_STATUS_SUCCESS ||
                    cublasSetMathMode(g->blas, gpu_math_mode()) != CUBLAS_STATUS_SUCCESS ||
                    cudaMalloc(&g->blas_ws, GPU_BLAS_WORKSPACE) != cudaSuccess ||
                    cublasSetWorkspace(g->blas, g->blas_ws, GPU_BLAS_WORKSPACE) != CUBLAS_STATUS_SUCCESS ||
                    cublasLtCreate(&g->lt) != CUBLAS_STATUS_SUCCESS))
        rc = err_set(err, "CUDA stream or cuBLAS setup failed");
    /* the arena: every tensor core bound (mask templates included) */
    if (rc == 0) {
        g->arena_floats = (size_t)m->n_params + g->fam->arena_extra(m);
        if (cudaMalloc(&g->arena, g->arena_floats * sizeof(float)) != cudaSuccess ||
            cudaMemcpy(g->arena, m->arena, g->arena_floats * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
            rc = err_set(err, "uploading %zu weights failed", g->arena_floats);
    }
    if (rc == 0) {
        const int Dm = m->d_model, A = m->n_head * m->d_head, V = m->V;
        /* the embedding table (NULL: the adaptive input; par-tf has both a table and the adaptive softmax) */
        g->emb = gpu_on_device(g, m->emb, (size_t)V * Dm);
        if (m->ada) rc = upload_ada(g, err);
        else {
            g->out_w = gpu_on_device(g, m->out_w, (size_t)V * Dm);
            g->out_b = gpu_on_device(g, m->out_b, V);
        }
        (void)A;   /* the r biases are each attention block's (the family's upload) */
        if (rc == 0 && ((m->emb && !g->emb) || (!m->ada && (!g->emb || !g->out_w || (m->out_b && !g->out_b)))))
            rc = err_set(err, "%s: a weight lies outside the model's arena", m->path);
    }
    if (rc == 0) rc = g->fam->upload(g, err);
    if (rc == 0 && precision == GPU_BF16) rc = upload_bf16(g, err);
    if (rc == 0) rc = gpu_mma_upload(g, err);
    if (rc == 0) {   /* heads too wide for the attention kernels' shared memory are refused here, not mid-step */
        int dev = 0, optin = 0;
        size_t need = g->fam->attn_smem(g);
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
            rc = err_set(err, "cudaDeviceGetAttribute failed");
        else if (need > (size_t)optin)
            rc = err_set(err, "%s: heads of %d dims need %zu bytes of shared memory a block, the device has %d",
                         m->path, m->d_head, need, optin);
    }
    if (rc == 0) {
        int64_t *off = (int64_t *)malloc((size_t)(slots ? slots : 1) * sizeof *off);
        if (!off) rc = err_set(err, "out of memory");
        for (int i = 0; rc == 0 && i < slots; i++) off[i] = (int64_t)g->h_off[i];
        if (rc == 0 && (cudaMalloc(&g->d_off, (size_t)slots * sizeof *off) != cudaSuccess ||
                        cudaMemcpy(g->d_off, off, (size_t)slots * sizeof *off, cudaMemcpyHostToDevice) != cudaSuccess))
            rc = err_set(err, "uploading the memory layout failed");
        free(off);
    }
    /* per-step buffers, one allocation, poisoned (NaN) so that a value read
     * before it is written shows */
    if (rc == 0) {
        const size_t N = (size_t)max_batch * max_block, Dm = m->d_model, A = (size_t)m->n_head * m->d_head;
        /* the layers' rows: a family with its own step (window models) computes windows of up to m->window
         * rows, grouped up to this many */
        const size_t NR = g->fam->step && (size_t)m->window > N ? (size_t)m->window : N;
        g->step_rows = (int)NR;
        size_t nx = align16(NR * Dm), nqkv = align16(NR * 3 * A), natt = align16(NR * A), nff = align16(NR * m->d_inner),
               nlog = align16(N * m->V);
        /* GPU_BF16: the bfloat16 inputs of the linear layers after them
         * (x, att, relu(ff): half a float each, rounded up to whole floats),
         * the projections' output and tmp's bfloat16 twin */
        size_t nb = precision == GPU_BF16 ? 2 * align16((nx + 1) / 2) + align16((natt + 1) / 2) + align16((nff + 1) / 2) +
                                                align16((nqkv + 1) / 2)
                                          : 0;
        size_t total = 2 * nx + nqkv + natt + nff + nlog + nb;
        if (cudaMalloc(&g->x, total * sizeof(float)) != cudaSuccess)
            rc = err_set(err, "out of device memory for a step of %zu rows", NR);
        else {
            g->tmp = g->x + nx;
            g->qkv = g->tmp + nx;
            g->att = g->qkv + nqkv;
            g->ff = g->att + natt;
            g->logits = g->ff + nff;
            if (precision == GPU_BF16) {
                g->xb = (bf16 *)(g->logits + nlog);
                g->attb = g->xb + 2 * align16((nx + 1) / 2);
                g->ffb = g->attb + 2 * align16((natt + 1) / 2);
                g->qkvb = g->ffb + 2 * align16((nff + 1) / 2);
                g->tmpb = g->qkvb + 2 * align16((nqkv + 1) / 2);
            }
            g->step_bytes = total * sizeof(float);
            if (g->ada) g->step_bytes += g->ada->step_floats * sizeof(float);   /* upload_ada's step buffers */
            if (cudaMemset(g->x, 0xFF, total * sizeof(float)) != cudaSuccess) rc = err_set(err, "cudaMemset");
        }
        if (rc == 0) rc = g->fam->alloc_step(g, err);
        /* (the tokens last: a step copies the stage up to its own tokens; a server's plan of 256 x 512 rows
         * staged 1 MB a decode step when the whole stage went up every step) */
        g->o_pos = 0;
        g->o_ring = align16(g->o_pos + (size_t)max_batch * sizeof(int64_t));
        g->o_len = align16(g->o_ring + (size_t)max_batch * sizeof(float *));
        g->o_pick = align16(g->o_len + (size_t)max_batch * m->n_layers * sizeof(int));
        g->o_tok = align16(g->o_pick + GPU_STAGE_PICKS * sizeof(pick_req));
        g->o_tgt = align16(g->o_tok + N * sizeof(int32_t));
        g->stage_bytes = align16(g->o_tgt + N * sizeof(int32_t));
        if (rc == 0 && (cudaMalloc(&g->tl, N * sizeof(float)) != cudaSuccess ||
                        cudaMallocHost(&g->h_tl, N * sizeof(float)) != cudaSuccess))
            rc = err_set(err, "out of memory for the targets' logprobs");
        if (rc == 0 && (cudaMalloc(&g->d_pq, N * sizeof *g->d_pq) != cudaSuccess ||
                        cudaMalloc(&g->d_po, N * sizeof *g->d_po) != cudaSuccess ||
                        cudaMallocHost(&g->h_pq, N * sizeof *g->h_pq) != cudaSuccess ||
                        cudaMallocHost(&g->h_po, N * sizeof *g->h_po) != cudaSuccess))
            rc = err_set(err, "out of memory for the picks");
        if (rc == 0 && cudaHostGetDevicePointer((void **)&g->m_po_dev, g->h_po, 0) != cudaSuccess) {
            cudaGetLastError();
            g->m_po_dev = NULL;
        }
        g->m_po = g->m_po_dev;
        if (rc == 0 && (cudaMallocHost(&g->h_stage, g->stage_bytes) != cudaSuccess ||
                        cudaMalloc(&g->d_stage, g->stage_bytes) != cudaSuccess))
            rc = err_set(err, "out of memory for the step inputs");
        g->step_bytes += g->stage_bytes;
    }
    g->weight_bytes = (g->arena_floats + g->derived_floats) * sizeof(float) + g->wbf_elems * sizeof(bf16);
    /* the one-kernel decode step is planned where the shapes allow (gpu.h: gpu_decode_kernel) */
    const char *mk = getenv("SPANSERVE_GPU_DECODE_KERNEL");
    g->mk_on = mk && strcmp(mk, "1") == 0 ? GPU_DECODE_KERNEL : mk && strcmp(mk, "0") == 0 ? GPU_DECODE_GRAPHS
                                                                                          : GPU_DECODE_AUTO;
    const char *ffn = getenv("SPANSERVE_GPU_DECODE_FFN");
    gpu_decode_ffn(g, ffn && ffn[0] >= '0' && ffn[0] <= '8' && !ffn[1] ? ffn[0] - '0' : gpu_decode_ffn_default());
    const char *wo = getenv("SPANSERVE_GPU_DECODE_WO");
    g->mk_wo = !(wo && strcmp(wo, "0") == 0);
    const char *ll = getenv("SPANSERVE_GPU_DECODE_LL");
    gpu_decode_ll(g, ll && ll[0] >= '0' && ll[0] <= '3' && !ll[1] ? ll[0] - '0' : GPU_DECODE_LL_DEFAULT);
    if (rc == 0) rc = gpu_mk_plan(g, g->mk_why, sizeof g->mk_why, err);
    if (rc == 0) rc = gpu_ln_carry_plan(g, err);
    if (rc == 0 && cudaDeviceSynchronize() != cudaSuccess) rc = err_set(err, "loading on the device failed");
    if (rc) {
        gpu_model_free(g);
        return NULL;
    }
    return g;
}

/* ------------------------------------------------------------ memory */

gpu_mem *gpu_mem_new(gpu_model *g, char *err)
{
    gpu_mem *s = (gpu_mem *)calloc(1, sizeof *s);
    if (!s || !(s->len = (int *)calloc((size_t)g->m->n_layers, sizeof *s->len))) {
        free(s);
        err_set(err, "out of memory");
        return NULL;
    }
    s->g = g;
    s->n_floats = g->mem_floats;
    s->pending = -1;
    s->keep = -1;
    if (g->m->window && !(s->toks = (int32_t *)calloc((size_t)g->m->window, sizeof *s->toks))) {
        err_set(err, "out of memory");
        gpu_mem_free(s);
        return NULL;
    }
    size_t bytes = (s->n_floats ? s->n_floats : 1) * g->ring_elem;
    if (cudaMalloc(&s->buf, bytes) != cudaSuccess || cudaMemset(s->buf, 0, bytes) != cudaSuccess) {
        err_set(err, "out of device memory for a session of %zu bytes", bytes);
        gpu_mem_free(s);
        return NULL;
    }
    return s;
}

void gpu_mem_free(gpu_mem *s)
{
    if (!s) return;
    cudaFree(s->buf);
    free(s->len);
    free(s->toks);
    free(s);
}

int gpu_mem_reset(gpu_mem *s, char *err)
{
    CU_TRY(cudaMemset(s->buf, 0, s->n_floats * s->g->ring_elem), err, "cudaMemset (session)");
    memset(s->len, 0, (size_t)s->g->m->n_layers * sizeof *s->len);
    if (s->toks) memset(s->toks, 0, (size_t)s->g->m->window * sizeof *s->toks);
    s->pos = 0;
    s->pending = -1;
    return 0;
}

/* GPU_BF16: the calling thread's pinned host buffer of at least N bfloat16
 * elements, for a session's rings on their way up or down (NULL when out of
 * memory). Kept for the thread's next copy (the server's state writers copy
 * one session after another: a fresh allocation each time, mapped, faulted
 * in and unmapped, held them up), freed when the thread ends. */
typedef struct { bf16 *p; size_t n; } stage_t;
static pthread_key_t stage_key;
static pthread_once_t stage_once = PTHREAD_ONCE_INIT;

static void stage_free(void *v)
{
    stage_t *st = (stage_t *)v;
    cudaFreeHost(st->p);
    free(st);
}

static void stage_init(void) { pthread_key_create(&stage_key, stage_free); }

static bf16 *bf16_host(size_t n)
{
    pthread_once(&stage_once, stage_init);
    stage_t *st = (stage_t *)pthread_getspecific(stage_key);
    if (!st) {
        if (!(st = (stage_t *)calloc(1, sizeof *st))) return NULL;
        pthread_setspecific(stage_key, st);
    }
    if (st->n < n || !st->p) {   /* (a memory of no rings, gpt-adaptive-span's, still gets a buffer) */
        cudaFreeHost(st->p);
        st->p = NULL;
        st->n = 0;
        if (cudaHostAlloc((void **)&st->p, (n ? n : 1) * sizeof(bf16), cudaHostAllocDefault) != cudaSuccess) return NULL;
        st->n = n;
    }
    return st->p;
}

/* A session's copy between host and device, finished on return, on the
 * calling thread's own stream: the server's state writers copy several
 * sessions at once, which one default stream would take one at a time. */
static cudaError_t copy_now(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, cudaStreamPerThread);
    return e == cudaSuccess ? cudaStreamSynchronize(cudaStreamPerThread) : e;
}

int gpu_mem_upload(gpu_mem *dst, const mem_t *src, char *err)
{
    if (src->m != dst->g->m || src->n_floats != dst->n_floats)
        return err_set(err, "the session's memory belongs to another model");
    if (dst->g->prec == GPU_BF16) {
        bf16 *h = bf16_host(src->n_floats);
        if (!h) return err_set(err, "out of memory");
        for (size_t i = 0; i < src->n_floats; i++) h[i] = __float2bfloat16(src->buf[i]);
        CU_TRY(copy_now(dst->buf, h, src->n_floats * sizeof(bf16), cudaMemcpyHostToDevice), err, "uploading a session");
    } else
        CU_TRY(copy_now(dst->buf, src->buf, src->n_floats * sizeof(float), cudaMemcpyHostToDevice), err,
               "uploading a session");
    memcpy(dst->len, src->len, (size_t)src->m->n_layers * sizeof *dst->len);
    if (dst->toks) memcpy(dst->toks, src->toks, (size_t)src->m->window * sizeof *dst->toks);
    dst->pos = src->pos;
    dst->pending = src->pending;
    dst->keep = src->keep;
    return 0;
}

int gpu_mem_download(const gpu_mem *src, mem_t *dst, char *err)
{
    if (dst->m != src->g->m || src->n_floats != dst->n_floats)
        return err_set(err, "the session's memory belongs to another model");
    if (src->g->prec == GPU_BF16) {
        bf16 *h = bf16_host(src->n_floats);
        if (!h) return err_set(err, "out of memory");
        CU_TRY(copy_now(h, src->buf, src->n_floats * sizeof(bf16), cudaMemcpyDeviceToHost), err, "downloading a session");
        for (size_t i = 0; i < src->n_floats; i++) dst->buf[i] = __bfloat162float(h[i]);
    } else
        CU_TRY(copy_now(dst->buf, src->buf, src->n_floats * sizeof(float), cudaMemcpyDeviceToHost), err,
               "downloading a session");
    memcpy(dst->len, src->len, (size_t)dst->m->n_layers * sizeof *dst->len);
    if (src->toks) memcpy(dst->toks, src->toks, (size_t)dst->m->window * sizeof *dst->toks);
    dst->pos = src->pos;
    dst->pending = src->pending;
    dst->keep = src->keep;
    return 0;
}

/* ------------------------------------------------------------ profile */

static const char *const op_names[OP_N] = {"embed", "qkv", "attention", "ring", "wo", "layernorm",
                                           "fc1", "relu", "fc2", "out", "logsoftmax"};

int gpu_profile(gpu_model *g, int on, char *err)
{
    if (on && !g->prof_ev) {
        g->prof_ev = (cudaEvent_t *)calloc(GPU_PROF_EVENTS + 1, sizeof *g->prof_ev);
        if (!g->prof_ev) return err_set(err, "out of memory");
        for (int i = 0; i <= GPU_PROF_EVENTS; i++)
            CU_TRY(cudaEventCreate(&g->prof_ev[i]), err, "cudaEventCreate");
    }
    g->prof_on = on;
    return 0;
}

int gpu_profile_read(gpu_model *g, const char **names, double *ms, long *calls, int cap)
{
    int n = cap < OP_N ? cap : OP_N;
    for (int i = 0; i < n; i++) {
        names[i] = op_names[i];
        ms[i] = g->prof_ms[i];
        calls[i] = g->prof_calls[i];
    }
    memset(g->prof_ms, 0, sizeof g->prof_ms);
    memset(g->prof_calls, 0, sizeof g->prof_calls);
    return n;
}

int gpu_profile_last(const gpu_model *g, const char **names, double *ms, int cap)
{
    const int n = g->prof_last_n < cap ? g->prof_last_n : cap;
    for (int i = 0; i < n; i++) names[i] = op_names[g->prof_op[i]], ms[i] = g->prof_last[i];
    return n;
}

void gpu_profiler_range(int on)
{
    if (on) cudaProfilerStart();
    else cudaProfilerStop();
}

/* ------------------------------------------------------------ timers */

struct gpu_timer {
    gpu_model *g;
    cudaEvent_t a, b;
};

gpu_timer *gpu_timer_new(gpu_model *g, char *err)
{
    gpu_timer *t = (gpu_timer *)calloc(1, sizeof *t);
    if (!t) { err_set(err, "out of memory"); return NULL; }
    t->g = g;
    if (cudaEventCreate(&t->a) != cudaSuccess || cudaEventCreate(&t->b) != cudaSuccess) {
        err_set(err, "cudaEventCreate failed");
        free(t);
        return NULL;
    }
    return t;
}

void gpu_timer_start(gpu_timer *t) { cudaEventRecord(t->a, t->g->stream); }

double gpu_timer_stop_ms(gpu_timer *t)
{
    float ms = 0;
    cudaEventRecord(t->b, t->g->stream);
    cudaEventSynchronize(t->b);
    cudaEventElapsedTime(&ms, t->a, t->b);
    return ms;
}

void gpu_timer_free(gpu_timer *t)
{
    if (!t) return;
    cudaEventDestroy(t->a);
    cudaEventDestroy(t->b);
    free(t);
}
