/*
 * forward.cu - one step on the device: core's model_forward launch by
 * launch, each family's attention through its gpu_family (fam_aspan.cu,
 * fam_rel.cu); a family with a step of its own (fam_gpt.cu: the window
 * models' ragged windows) runs it in place of launch_step, and the rest
 * (targets, picks, the copies back, advancing the memories) is shared.
 *
 *   adaptive-span layer: qkv = x [Wq;Wk;Wv]^T; span attention (reads the
 *     rings and the block); ring writes (a separate launch, so that no write
 *     races a read of the same layer); x = LN1(x + att Wo^T);
 *     x = LN2(x + fc2(relu(fc1 x)))
 *   PAR block: attention: qkv = x Wqkv^T; relative attention; ring writes;
 *     x = LN(x + att Wo^T). feed-forward: x = LN(x + fc2(relu(fc1 x))).
 *     skip: nothing. par-tf's attention: qkv = x Wqkv^T + bqkv, x = LN(x +
 *     relu(att Wo^T + bo)) (LayerNorm's eps is the model's).
 *   then logprobs = log_softmax(x Wout^T + b).
 *
 * The inputs of a step (tokens, each stream's position, ring base and
 * per-layer lengths) go to the device in one transfer from pinned memory;
 * the step allocates nothing. It ends with one synchronisation, after which
 * the memories' positions and lengths advance on the host. With gpu_profile
 * on, an event after each operation times it (gpu.cu sums them).
 *
 * GPU_BF16: each linear layer reads a bfloat16 copy of its input, written by
 * the operation before it (embedding, LayerNorm, attention, ReLU), and its
 * bfloat16 weights; the projections write queries, keys and values in
 * bfloat16 (what the rings keep), and with post-LN Wo and fc2 write their
 * output in bfloat16 for the residual's LayerNorm (out_bf16); the other
 * outputs, the residual stream, the softmaxes and LayerNorm stay float32.
 *
 * A bf16 post-LN decode step of 9 to 64 streams carries its LayerNorms in
 * the products around them instead (run_layers_carried, matmul.cu's
 * skinny modes): Wo and fc2 add the residual and sum its rows, QKV and fc1
 * apply the LayerNorm after their product.
 *
 * Decode steps (M = 1) are launch-bound: about ten launches a layer of a few
 * microseconds each. The first step of B streams is captured as a CUDA graph
 * (everything between the input transfer and the logprobs' copy: the
 * kernels read the step's inputs from the same device buffer every time),
 * later steps of B streams launch the graph.
 */
#include "gpu_internal.cuh"

extern "C" {
#include "gpt.h"   /* gpt_ring_push: a window model's token ring, as core advances it */
}

#include <math.h>
#include <string.h>

/* gpu_profile: an event after each operation (the step's first event is
 * recorded before the embedding). */
void gpu_mark(gpu_model *g, int op)
{
    if (!g->prof_on || g->prof_n >= GPU_PROF_EVENTS) return;
    cudaEventRecord(g->prof_ev[g->prof_n + 1], g->stream);
    g->prof_op[g->prof_n++] = op;
}

/* Runs CALL (a launcher returning 0 or -1), then marks it as operation OP. */
#define OP(op, call) ((call) != 0 || (gpu_mark(g, op), 0))   /* true when it failed */

/* y = x W^T in the model's precision: float32 (x, W) or bfloat16 (xb, Wb). */
static int linear(gpu_model *g, float *y, const float *x, const bf16 *xb, const float *W, const bf16 *Wb, int n, int in,
                  int out, char *err)
{
    return g->prec == GPU_BF16 ? gpu_linear_bf16(g, y, xb, Wb, n, in, out, err) : gpu_linear(g, y, x, W, n, in, out, err);
}

/* The sublayer's input: x, or with pre_lnorm LN(x) into tmp (xb in
 * GPU_BF16, which the linear layers read), x left as it is. */
static int sublayer_in(gpu_model *g, const float *w, const float *b, int N, const float **in, char *err)
{
    *in = g->x;
    if (!g->m->pre_lnorm) return 0;
    *in = g->tmp;
    return OP(OP_LN, gpu_layernorm_to(g, g->tmp, g->prec == GPU_BF16 ? g->xb : NULL, g->x, w, b, N, g->m->d_model, err))
               ? -1 : 0;
}

/* The sublayer's output R (+ RB) into the residual stream: x = LN(x + r),
 * or x + r with pre_lnorm (xb, which then holds LN(x), kept for the next
 * sublayer's LN to write). RH: R in bfloat16 instead (out_bf16). */
static int sublayer_out(gpu_model *g, const float *r, const bf16 *rh, const float *rb, const float *w, const float *b, int N,
                        char *err)
{
    const int Dm = g->m->d_model;
    if (g->m->pre_lnorm) return OP(OP_LN, gpu_add_residual(g, g->x, NULL, r, rb, N, Dm, err)) ? -1 : 0;
    if (rh) return OP(OP_LN, gpu_add_layernorm_b(g, g->x, g->xb, rh, rb, w, b, N, Dm, err)) ? -1 : 0;
    return OP(OP_LN, gpu_add_layernorm(g, g->x, g->xb, r, rb, w, b, N, Dm, err)) ? -1 : 0;
}

/* GPU_BF16 with post-LN: Wo's and fc2's outputs are written in bfloat16
 * (g->tmpb) and the residual's LayerNorm reads them so: the sum in float,
 * rounded once, as every bf16 linear layer's input already is; half the
 * bytes written and read again (a word model's step: 32 LayerNorms of
 * 2,048 x 512). Pre-LN adds r to the float residual stream unrounded, and
 * par-tf's Wo has its ReLU after it. */
static bool out_bf16(const gpu_model *g) { return g->prec == GPU_BF16 && !g->m->pre_lnorm; }

/* r = in W^T into the sublayer's output: g->tmpb (out_bf16) or g->tmp */
static int sublayer_linear(gpu_model *g, const float *in, const bf16 *inb, const float *W, const bf16 *Wb, int n, int din,
                           int dout, bool bf_out, char *err)
{
    return bf_out ? gpu_linear_bf16_out(g, g->tmpb, inb, Wb, n, din, dout, err)
                  : linear(g, g->tmp, in, inb, W, Wb, n, din, dout, err);
}

static int ffn(gpu_model *g, const gpu_layer *d, int N, char *err)
{
    const model_t *m = g->m;
    const int Dm = m->d_model, I = m->d_inner;
    const float *in;
    if (sublayer_in(g, d->ln2_w, d->ln2_b, N, &in, err)) return -1;
    /* a few rows: fc1, its bias and the ReLU in one launch (matmul.cu) */
    const int fused = gpu_linear_bias_relu(g, g->ff, g->ffb, in, g->xb, d->fc1_w, d->fc1_h, d->fc1_b, N, Dm, I, err);
    if (fused < 0) return -1;
    /* many rows in bf16: the bias and the ReLU in the GEMM's epilogue (cublasLt) */
    const int lt = !fused && g->prec == GPU_BF16 ? gpu_linear_bias_relu_lt(g, g->ffb, g->xb, d->fc1_h, d->fc1_b, d->fc1_bh, N, Dm,
                                                                         I, err)
                                                 : 0;
    if (lt < 0) return -1;
    if (fused || lt) gpu_mark(g, OP_FC1);
    else if (OP(OP_FC1, linear(g, g->ff, in, g->xb, d->fc1_w, d->fc1_h, N, Dm, I, err)) ||
             OP(OP_RELU, gpu_bias_relu(g, g->ff, g->ffb, d->fc1_b, N, I, err)))
        return -1;
    const bool bo = out_bf16(g);
    if (OP(OP_FC2, sublayer_linear(g, g->ff, g->ffb, d->fc2_w, d->fc2_h, N, I, Dm, bo, err)) ||
        sublayer_out(g, g->tmp, bo ? g->tmpb : NULL, d->fc2_b, d->ln2_w, d->ln2_b, N, err))
        return -1;
    return 0;
}

/* qkv = in Wqkv^T (+ qkv_b: par-tf's bias). GPU_BF16: queries, keys and
 * values in bf16, the rings' type, rounded once (with a bias: the float sum
 * in g->qkv, then the bias, then the rounding, as fam_gpt.cu's). */
static int qkv_proj(gpu_model *g, const gpu_layer *d, const float *in, int N, char *err)
{
    const int Dm = g->m->d_model, A = g->m->n_head * g->m->d_head;
    const bool bf = g->prec == GPU_BF16;
    if (!d->qkv_b)
        return OP(OP_QKV, bf ? gpu_linear_bf16_out(g, g->qkvb, g->xb, d->wqkv_h, N, Dm, 3 * A, err)
                             : gpu_linear(g, g->qkv, in, d->wqkv, N, Dm, 3 * A, err)) ? -1 : 0;
    return OP(OP_QKV, linear(g, g->qkv, in, g->xb, d->wqkv, d->wqkv_h, N, Dm, 3 * A, err) ||
                          gpu_gpt_bias(g, g->qkv, bf ? g->qkvb : NULL, g->qkv, d->qkv_b, N, 3 * A, err)) ? -1 : 0;
}

/* A post-LN bf16 step can carry its LayerNorms in the products around them
 * (matmul.cu's gpu_linear_residual, gpu_linear_ln; issue 17): the product
 * that adds a sublayer's output to the residual stream leaves it before
 * its LayerNorm (h, and bf16(w h) for the next product) with each row's
 * sums, and the first product of the next sublayer applies the LayerNorm
 * after its own product, through S = W w and C = W b folded at load. */

/* Walks the sublayers as run_layers_carried does: F(l, first product's W,
 * its inputs, outputs, the pending LayerNorm's weight and bias or NULL
 * after the embedding, whether it is the attention's) */
template <typename F> static int walk_carried(gpu_model *g, F f)
{
    const model_t *m = g->m;
    const int Dm = m->d_model, A = m->n_head * m->d_head;
    const float *pw = NULL, *pb = NULL;
    for (int l = 0; l < m->n_layers; l++) {
        const gpu_layer *d = &g->L[l];
        const int sub = g->fam->sublayers(m, l);
        if (sub & GPU_SUB_ATTN) {
            if (f(l, d->wqkv_h, Dm, 3 * A, pw, pb, true)) return -1;
            pw = d->ln1_w, pb = d->ln1_b;
        }
        if (sub & GPU_SUB_FFN) {
            if (f(l, d->fc1_h, Dm, m->d_inner, pw, pb, false)) return -1;
            pw = d->ln2_w, pb = d->ln2_b;
        }
    }
    return 0;
}

int gpu_ln_carry_plan(gpu_model *g, char *err)
{
    const model_t *m = g->m;
    const int Dm = m->d_model, A = m->n_head * m->d_head, I = m->d_inner;
    g->lnf_ok = 0;
    if (g->prec != GPU_BF16 || m->pre_lnorm || m->tf_attn || g->fam->step || !g->xb || g->max_batch <= 8 ||
        ((uintptr_t)g->x | (uintptr_t)g->xb | (uintptr_t)g->tmp) % 16 ||
        (size_t)g->step_rows * Dm * sizeof(float) < 2 * LNC_ACC_U64 * sizeof(unsigned long long))
        return 0;
    /* every linear layer within skinny_kernel's shapes, every LayerNorm with its weight and bias */
    size_t n = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const gpu_layer *d = &g->L[l];
        const int sub = g->fam->sublayers(m, l);
        if ((sub & GPU_SUB_ATTN) && (d->qkv_b || !d->ln1_w || !d->ln1_b || !gpu_linear_ln_fits(g, 64, Dm, 3 * A, d->wqkv_h) ||
                                     !gpu_linear_ln_fits(g, 64, A, Dm, d->wo_h)))
            return 0;
        if ((sub & GPU_SUB_FFN) && (!d->ln2_w || !d->ln2_b || !gpu_linear_ln_fits(g, 64, Dm, I, d->fc1_h) ||
                                    !gpu_linear_ln_fits(g, 64, I, Dm, d->fc2_h)))
            return 0;
    }
    const float *lw = NULL, *lb = NULL;   /* the last LayerNorm: into the output layer where it fits */
    walk_carried(g, [&](int l, const bf16 *, int, int out, const float *pw, const float *, bool attn) {
        n += pw ? 2 * (size_t)out : 0;
        lw = attn ? g->L[l].ln1_w : g->L[l].ln2_w, lb = attn ? g->L[l].ln1_b : g->L[l].ln2_b;
        return 0;
    });
    const bool fold_out = lw && lb && !g->ada && g->out_h && gpu_linear_ln_fits(g, 64, Dm, m->V, g->out_h);
    n += fold_out ? 2 * (size_t)m->V : 0;
    CU_TRY(cudaMalloc(&g->lnf_tab, (n ? n : 1) * sizeof(float)), err, "cudaMalloc (folded LayerNorms)");
    float *at = g->lnf_tab;
    if (walk_carried(g, [&](int l, const bf16 *W, int in, int out, const float *pw, const float *pb, bool attn) {
            if (!pw) return 0;
            gpu_layer *d = &g->L[l];
            (attn ? d->qkv_s : d->fc1_s) = at;
            (attn ? d->qkv_c : d->fc1_c) = at + out;
            const int rc = gpu_ln_fold(g, at, at + out, W, pw, pb, in, out, err);
            at += 2 * (size_t)out;
            return rc;
        }))
        return -1;
    if (fold_out) {
        if (gpu_ln_fold(g, at, at + m->V, g->out_h, lw, lb, Dm, m->V, err)) return -1;
        g->out_s = at, g->out_c = at + m->V;
    }
    g->weight_bytes += n * sizeof(float);
    g->lnf_ok = 1;
    return 0;
}

/* Whether a step of B streams x M tokens carries its LayerNorms: a decode
 * step of 9 to 64 streams of a model that allows it (gpu_ln_carry_plan),
 * unless turned off (gpu_decode_ln_fuse, SPANSERVE_GPU_LN_FUSE=0) */
static bool ln_carried(const gpu_model *g, int B, int M)
{
    return g->lnf_on && g->lnf_ok && g->gemv_on && M == 1 && B > 8 && B <= 64;
}

/* CALL, and again where gpu_decode_twice asks for operation T twice (a diagnostic) */
#define TWICE(t, call) ((call) != 0 || (gpu_twice(g, t, l) && (call) != 0))

/* The layers of a step that carries its LayerNorms: x holds the residual
 * stream before the LayerNorm still to apply (after the embedding: x and
 * xb as they are). The k-th product that adds to the residual sums its
 * rows into acc[k % 2]; the product before it zeroed that buffer, and the
 * one after reads it. The last LayerNorm goes into the output layer's
 * product (g->out_acc, launch_out; gpu_decode_out_fold), or runs on its
 * own where that is off or the output layer does not allow it. */
static int run_layers_carried(gpu_model *g, int N, char *err)
{
    const model_t *m = g->m;
    const int Dm = m->d_model, A = m->n_head * m->d_head, I = m->d_inner;
    unsigned long long *acc[2] = {(unsigned long long *)g->tmp, (unsigned long long *)g->tmp + LNC_ACC_U64};
    const float *pw = NULL, *pb = NULL;
    int k = 0;   /* the products that added to the residual so far */
    for (int l = 0; l < m->n_layers; l++) {
        const gpu_layer *d = &g->L[l];
        const int sub = g->fam->sublayers(m, l);
        const unsigned long long *in = pw ? acc[(k + 1) & 1] : NULL;
        if (sub & GPU_SUB_ATTN) {
            if (OP(OP_QKV, TWICE(GPU_TWICE_QKV, gpu_linear_ln(g, g->qkvb, g->xb, in, acc[k & 1], d->qkv_s, d->qkv_c,
                                                              d->wqkv_h, NULL, N, Dm, 3 * A, err))) ||
                TWICE(GPU_TWICE_ATTN, g->fam->attend(g, l, N, 1, err)) ||
                OP(OP_WO, TWICE(GPU_TWICE_WO, gpu_linear_residual(g, g->x, g->xb, in, pw, pb, acc[k & 1], d->ln1_w, g->attb,
                                                                  d->wo_h, d->wo_b, N, A, Dm, err))))
                return -1;
            pw = d->ln1_w, pb = d->ln1_b, in = acc[k & 1], k++;
        }
        if (sub & GPU_SUB_FFN) {
            if (OP(OP_FC1, TWICE(GPU_TWICE_FC1, gpu_linear_ln(g, g->ffb, g->xb, in, acc[k & 1], d->fc1_s, d->fc1_c,
                                                              d->fc1_h, d->fc1_b, N, Dm, I, err))) ||
                OP(OP_FC2, TWICE(GPU_TWICE_FC2, gpu_linear_residual(g, g->x, g->xb, in, pw, pb, acc[k & 1], d->ln2_w,
                                                                    g->ffb, d->fc2_h, d->fc2_b, N, I, Dm, err))))
                return -1;
            pw = d->ln2_w, pb = d->ln2_b, k++;
        }
    }
    /* the last LayerNorm: carried into the output layer (launch_out), or on its own */
    if (pw && g->out_fold && g->out_s) {
        g->out_acc = acc[(k + 1) & 1];
        return 0;
    }
    return pw && OP(OP_LN, gpu_layernorm_keep(g, g->x, g->xb, pw, pb, N, Dm, err)) ? -1 : 0;
}

static int run_layers(gpu_model *g, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int Dm = m->d_model, A = m->n_head * m->d_head, N = B * M;
    if (ln_carried(g, B, M)) return run_layers_carried(g, N, err);
    for (int l = 0; l < m->n_layers; l++) {
        const gpu_layer *d = &g->L[l];
        const int sub = g->fam->sublayers(m, l);
        if (sub & GPU_SUB_ATTN) {
            const float *in;
            if (sublayer_in(g, d->ln1_w, d->ln1_b, N, &in, err)) return -1;
            if (qkv_proj(g, d, in, N, err) || g->fam->attend(g, l, B, M, err)) return -1;
            /* par-tf: a = ReLU(att Wo^T + bo), then the residual and LayerNorm as PAR's */
            const bool bo = out_bf16(g) && !m->tf_attn;
            if (OP(OP_WO, sublayer_linear(g, g->att, g->attb, d->wo, d->wo_h, N, A, Dm, bo, err)) ||
                (m->tf_attn && OP(OP_RELU, gpu_bias_relu(g, g->tmp, NULL, d->wo_b, N, Dm, err))) ||
                sublayer_out(g, g->tmp, bo ? g->tmpb : NULL, m->tf_attn ? NULL : d->wo_b, d->ln1_w, d->ln1_b, N, err))
                return -1;
        }
        if ((sub & GPU_SUB_FFN) && ffn(g, d, N, err)) return -1;
    }
    return 0;
}

/* The launches of a step of B streams x M tokens up to the output layer,
 * after its inputs are on the device: the embedding and the layers. */
static int launch_layers(gpu_model *g, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int N = B * M;
    const float scale = g->fam->embed_scale(m);
    /* with pre_lnorm xb holds the sublayers' LN(x): the output layer's bf16 input is made at the end */
    bf16 *xb = m->pre_lnorm ? NULL : g->xb;
    g->out_acc = NULL;   /* (run_layers_carried may leave the last LayerNorm to the output layer) */
    /* the adaptive input where there is no table (par-tf's adaptive softmax follows a plain embedding) */
    if (!g->emb ? OP(OP_EMBED, gpu_ada_embed(g, g->x, xb, stage_tok(g, g->d_stage), N, err))
                : OP(OP_EMBED, gpu_embed(g, g->x, xb, g->emb, stage_tok(g, g->d_stage), N, m->d_model, scale, err)))
        return -1;
    if (run_layers(g, B, M, err)) return -1;
    if (m->pre_lnorm && g->prec == GPU_BF16 && gpu_to_bf16(g, g->xb, g->x, (size_t)N * m->d_model, err)) return -1;
    return 0;
}

/* The output layer and log-softmax of a step of N rows */
static int launch_out(gpu_model *g, int N, int targets_only, char *err)
{
    const model_t *m = g->m;
    /* targets only: an adaptive softmax writes each row's target's logprob into g->tl, no logits */
    if (g->ada)
        return OP(OP_OUT, gpu_ada_logprobs(g, g->x, g->xb, N, targets_only ? stage_tgt(g, g->d_stage) : NULL,
                                           targets_only ? stage_tgt(g, g->h_stage) : NULL, g->tl, err))
                   ? -1 : 0;
    const unsigned long long *acc = g->out_acc;   /* (run_layers_carried left the last LayerNorm to it) */
    g->out_acc = NULL;
    if (OP(OP_OUT, acc ? gpu_linear_ln_f(g, g->logits, g->xb, acc, g->out_s, g->out_c, g->out_h, N, m->d_model, m->V, err)
                       : linear(g, g->logits, g->x, g->xb, g->out_w, g->out_h, N, m->d_model, m->V, err)) ||
        OP(OP_LOGSOFTMAX, gpu_log_softmax(g, g->logits, g->out_b, N, m->V, err)))
        return -1;
    return 0;
}

/* Every launch of a step of B streams x M tokens */
static int launch_step(gpu_model *g, int B, int M, int targets_only, char *err)
{
    return launch_layers(g, B, M, err) || launch_out(g, B * M, targets_only, err) ? -1 : 0;
}

/* LAUNCH (the launches of a step, a launcher taking err and returning 0 or
 * -1) captured as a graph. A failed capture turns graphs off, saying why
 * (WHAT: the step), and gives NULL: the step then launches one by one. */
template <typename F> static cudaGraphExec_t capture_graph(gpu_model *g, const char *what, F launch)
{
    char err[ERR_LEN] = "";
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeRelaxed);
    if (e == cudaSuccess) {
        int rc = launch(err);
        e = cudaStreamEndCapture(g->stream, &graph);
        if (rc == 0 && e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
        if (rc && !err[0]) snprintf(err, sizeof err, "a launch failed while capturing");
    }
    if (graph) cudaGraphDestroy(graph);
    if (e != cudaSuccess || !exec) {
        cudaGetLastError();   /* the failed capture's error is not the next launch's */
        snprintf(g->graph_why, sizeof g->graph_why, "capturing %s: %s", what, err[0] ? err : cudaGetErrorString(e));
        g->graphs_on = 0;
        if (exec) cudaGraphExecDestroy(exec);
        return NULL;
    }
    g->graphs_captured++;
    return exec;
}

/* The graph of a scoring step's layers (B x M, M > 1), the last
 * GPU_LAYER_GRAPHS shapes kept (a text scored in blocks repeats its shape;
 * the output layer runs outside it: an adaptive softmax's tail clusters
 * take a step's own row counts). */
static cudaGraphExec_t layers_graph(gpu_model *g, int B, int M)
{
    for (int i = 0; i < GPU_LAYER_GRAPHS; i++)
        if (g->lgraph[i] && g->lgraph_b[i] == B && g->lgraph_m[i] == M) return g->lgraph[i];
    char what[64];
    snprintf(what, sizeof what, "the layers of a step of %d x %d", B, M);
    cudaGraphExec_t exec = capture_graph(g, what, [&](char *err) { return launch_layers(g, B, M, err); });
    if (!exec) return NULL;
    const int i = g->lgraph_next;
    g->lgraph_next = (i + 1) % GPU_LAYER_GRAPHS;
    if (g->lgraph[i]) {
        cudaStreamSynchronize(g->stream);   /* (the graph it replaces may still run) */
        cudaGraphExecDestroy(g->lgraph[i]);
    }
    g->lgraph[i] = exec;
    g->lgraph_b[i] = B;
    g->lgraph_m[i] = M;
    return exec;
}

/* The graph of a decode step of B streams: captured from launch_step */
static cudaGraphExec_t decode_graph(gpu_model *g, int B)
{
    if (g->graph[B - 1]) return g->graph[B - 1];
    char what[64];
    snprintf(what, sizeof what, "a decode step of %d streams", B);
    cudaGraphExec_t exec = capture_graph(g, what, [&](char *err) { return launch_step(g, B, 1, 0, err); });
    if (!exec) return NULL;
    return g->graph[B - 1] = exec;
}

int gpu_decode_replay(gpu_model *g, int B, int k, char *err)
{
    if (B < 1 || B > g->max_batch || k < 1) return err_set(err, "replaying %d decode steps of %d streams", k, B);
    for (int i = 0; i < k; i++) {
        if (gpu_mk_takes(g, B, 1) && !g->prof_on) {
            if (gpu_mk_step(g, B, err) || (g->ada && launch_out(g, B, 0, err))) return -1;
            continue;
        }
        cudaGraphExec_t gr = g->graphs_on && !g->prof_on && !g->fam->step ? decode_graph(g, B) : NULL;
        if (!gr) return err_set(err, "no decode graph of %d streams to replay", B);
        CU_TRY(cudaGraphLaunch(gr, g->stream), err, "launching the decode step's graph");
    }
    CU_TRY(cudaStreamSynchronize(g->stream), err, "the replayed steps failed on the device");
    return 0;
}

int gpu_forward(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, float *logprobs, char *err)
{
    return gpu_forward_targets(g, mems, B, tokens, M, NULL, logprobs, err);
}

/* Whether a step's N picks go up with its inputs (up to GPU_STAGE_PICKS), or on their own */
static int picks_staged(int n) { return n > 0 && n <= GPU_STAGE_PICKS; }

/* The step's inputs to the device and its launches (a graph for a decode
 * step); *ANY_TG and *ANY_ROWS say whether streams want only their targets'
 * logprobs, or whole rows. */
static int step_launch(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                       int want_lp, int npick, const pick_req *q, int *any_tg, int *any_rows, cudaGraphExec_t *graph,
                       char *err)
{
    const model_t *m = g->m;
    const int nl = m->n_layers, V = m->V;
    /* B x M within the plan's rows; M up to max_block, or up to all the rows where the family plans by rows
     * (adaptive-span: a text scored in long blocks) */
    if (B < 1 || M < 1 || B > g->max_batch || M > g->max_m ||
        (int64_t)B * M > (int64_t)g->max_batch * g->max_block)
        return err_set(err, "a step of %d streams x %d tokens is outside this plan (1..%d streams x 1..%d tokens, "
                       "%d rows)", B, M, g->max_batch, g->max_m, g->max_batch * g->max_block);
    for (int b = 0; b < B; b++) {
        if (!mems[b] || mems[b]->g != g) return err_set(err, "stream %d's memory belongs to another model", b);
        for (int c = 0; c < b; c++)
            if (mems[c] == mems[b]) return err_set(err, "streams %d and %d share one memory", c, b);
    }
    const size_t N = (size_t)B * M;
    for (size_t i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return err_set(err, "token id %d at %zu is outside the vocabulary [0, %d)", tokens[i], i, V);

    *any_tg = 0, *any_rows = !targets;
    for (int b = 0; targets && b < B; b++)
        if (targets[(size_t)b * M] < 0) *any_rows = 1;
        else {
            *any_tg = 1;
            for (int i = 0; i < M; i++)
                if (targets[(size_t)b * M + i] < 0 || targets[(size_t)b * M + i] >= V)
                    return err_set(err, "target id %d of stream %d is outside the vocabulary [0, %d)",
                                   targets[(size_t)b * M + i], b, V);
        }

    /* the step's inputs, in one transfer up to its tokens (the targets in a second, when it has any), with its
     * picks (NPICK of Q) when they are few enough (GPU_STAGE_PICKS) */
    if (picks_staged(npick)) memcpy(stage_pick(g, g->h_stage), q, (size_t)npick * sizeof *q);
    memcpy(stage_tok(g, g->h_stage), tokens, N * sizeof *tokens);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < M; i++)
            stage_tgt(g, g->h_stage)[(size_t)b * M + i] =
                *any_tg && targets[(size_t)b * M] >= 0 ? targets[(size_t)b * M + i] : -1;
    for (int b = 0; b < B; b++) {
        stage_pos(g, g->h_stage)[b] = mems[b]->pos;
        stage_ring(g, g->h_stage)[b] = (float *)mems[b]->buf;
        memcpy(stage_len(g, g->h_stage) + (size_t)b * nl, mems[b]->len, (size_t)nl * sizeof(int));
    }
    CU_TRY(cudaMemcpyAsync(g->d_stage, g->h_stage, g->o_tok + N * sizeof(int32_t), cudaMemcpyHostToDevice, g->stream),
           err, "copying the step's inputs");
    if (*any_tg)
        CU_TRY(cudaMemcpyAsync(stage_tgt(g, g->d_stage), stage_tgt(g, g->h_stage), N * sizeof(int32_t),
                               cudaMemcpyHostToDevice, g->stream),
               err, "copying the step's targets");

    g->prof_n = 0;
    /* a decode step of a few streams: one kernel (decode_step.cu; profiling times the launches one by one) */
    *graph = NULL;
    if (gpu_mk_takes(g, B, M) && !g->prof_on) {
        if (gpu_mk_step(g, B, err)) return -1;
        g->mk_steps++;
        /* an adaptive softmax: the kernel left the output layer's input in g->x and g->xb, as launch_layers does */
        return g->ada ? launch_out(g, B, want_lp && *any_tg && !*any_rows, err) : 0;
    }
    if (ln_carried(g, B, M)) g->lnf_steps++;
    /* (a family's own step plans its launches from the memories every time: no graph) */
    *graph = M == 1 && g->graphs_on && !g->prof_on && !g->fam->step ? decode_graph(g, B) : NULL;
    if (*graph) {
        CU_TRY(cudaGraphLaunch(*graph, g->stream), err, "launching the decode step's graph");
        g->graph_launches++;
        return 0;
    }
    if (g->prof_on) cudaEventRecord(g->prof_ev[0], g->stream);
    if (g->fam->step) return g->fam->step(g, mems, B, tokens, M, err);
    /* a scoring step: its layers as one graph (launched one by one, a step's ~10 launches a layer each
     * paid a gap on the device) */
    cudaGraphExec_t lg = M > 1 && g->graphs_on && !g->prof_on ? layers_graph(g, B, M) : NULL;
    if (lg) {
        CU_TRY(cudaGraphLaunch(lg, g->stream), err, "launching the step's layers' graph");
        g->graph_launches++;
        return launch_out(g, B * M, want_lp && *any_tg && !*any_rows, err);
    }
    return launch_step(g, B, M, want_lp && *any_tg && !*any_rows, err);
}

/* After the step's copies: waits for it, adds up the profile and advances
 * the memories (as core/forward.c's advance, and the rows each holds). */
static int step_end(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, char *err)
{
    CU_TRY(cudaStreamSynchronize(g->stream), err, "the step failed on the device");
    for (int i = 0; g->prof_on && i < g->prof_n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, g->prof_ev[i], g->prof_ev[i + 1]);
        g->prof_ms[g->prof_op[i]] += ms;
        g->prof_calls[g->prof_op[i]]++;
        g->prof_last[i] = ms;
    }
    if (g->prof_on) g->prof_last_n = g->prof_n;
    for (int b = 0; b < B; b++) {
        gpu_mem *s = mems[b];
        for (int l = 0; l < g->m->n_layers; l++) s->len[l] = (int)mem_held_rows(g->m, l, s->pos + M);
        if (s->toks) gpt_ring_push(g->m->window, s->toks, s->pos, tokens + (size_t)b * M, M);
        s->pos += M;
    }
    return 0;
}

int gpu_forward_targets(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                        float *logprobs, char *err)
{
    const int V = g->m->V;
    const size_t N = (size_t)B * M;
    int any_tg, any_rows;
    cudaGraphExec_t graph;
    if (step_launch(g, mems, B, tokens, M, targets, logprobs != NULL, 0, NULL, &any_tg, &any_rows, &graph, err))
        return -1;
    if (logprobs && any_tg) {
        /* the targets' logprobs, a float a row (an adaptive softmax wrote them for a step of targets
         * only); whole rows only of the streams that want them */
        if (!(g->ada && !any_rows && !graph) &&
            gpu_gather_targets(g, g->tl, g->logits, stage_tgt(g, g->d_stage), (int)N, V, err))
            return -1;
        CU_TRY(cudaMemcpyAsync(g->h_tl, g->tl, N * sizeof(float), cudaMemcpyDeviceToHost, g->stream), err,
               "copying the targets' logprobs");
        for (int b = 0; b < B; b++)
            if (targets[(size_t)b * M] < 0)
                CU_TRY(cudaMemcpyAsync(logprobs + (size_t)b * M * V, g->logits + (size_t)b * M * V,
                                       (size_t)M * V * sizeof(float), cudaMemcpyDeviceToHost, g->stream),
                       err, "copying the logprobs");
    } else if (logprobs) {
        CU_TRY(cudaMemcpyAsync(logprobs, g->logits, N * V * sizeof(float), cudaMemcpyDeviceToHost, g->stream), err,
               "copying the logprobs");
    }
    if (step_end(g, mems, B, tokens, M, err)) return -1;
    for (int b = 0; logprobs && any_tg && b < B; b++)
        if (targets[(size_t)b * M] >= 0)
            for (int i = 0; i < M; i++) {
                const size_t r = (size_t)b * M + i;
                logprobs[r * V + targets[r]] = g->h_tl[r];
            }
    return 0;
}

/* The picks' checks; then, after the step's launches, their copy up, the
 * kernel and their copy down (waited for by step_end). */
static int picks_check(const gpu_model *g, int rows, int n, const pick_req *q, char *err)
{
    if (n < 0 || n > g->max_batch * g->max_block)
        return err_set(err, "%d picks: this plan makes at most %d", n, g->max_batch * g->max_block);
    for (int i = 0; i < n; i++)
        if (q[i].row < 0 || q[i].row >= rows || q[i].top_n < 0 || q[i].top_n > PICK_MAX_TOP)
            return err_set(err, "pick %d: row %d of %d, or %d top tokens (at most %d)", i, q[i].row, rows, q[i].top_n,
                           PICK_MAX_TOP);
    return 0;
}

static int picks_launch(gpu_model *g, int n, const pick_req *q, char *err)
{
    if (!n) return 0;
    memcpy(g->h_pq, q, (size_t)n * sizeof *q);
    CU_TRY(cudaMemcpyAsync(g->d_pq, g->h_pq, (size_t)n * sizeof *q, cudaMemcpyHostToDevice, g->stream), err,
           "copying the picks");
    if (gpu_pick(g, n, g->d_pq, g->d_po, err)) return -1;
    CU_TRY(cudaMemcpyAsync(g->h_po, g->d_po, (size_t)n * sizeof *g->h_po, cudaMemcpyDeviceToHost, g->stream), err,
           "copying the picks back");
    return 0;
}

int gpu_forward_pick(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                     float *tlp, int n, const pick_req *q, pick_out *o, char *err)
{
    return gpu_forward_pick_while(g, mems, B, tokens, M, targets, tlp, n, q, o, NULL, NULL, err);
}

int gpu_forward_pick_while(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                           float *tlp, int n, const pick_req *q, pick_out *o, fwd_meanwhile mw, void *mw_ctx,
                           char *err)
{
    const size_t N = (size_t)B * M;
    int any_tg, any_rows;
    cudaGraphExec_t graph;
    if (targets && !tlp) return err_set(err, "targets but nowhere for their logprobs");
    if (picks_check(g, B * M, n, q, err) ||
        step_launch(g, mems, B, tokens, M, targets, 0, n, q, &any_tg, &any_rows, &graph, err))
        return -1;
    if (any_tg) {   /* the targets' logprobs from the rows, a float a row to the host */
        if (gpu_gather_targets(g, g->tl, g->logits, stage_tgt(g, g->d_stage), (int)N, g->m->V, err)) return -1;
        CU_TRY(cudaMemcpyAsync(g->h_tl, g->tl, N * sizeof(float), cudaMemcpyDeviceToHost, g->stream), err,
               "copying the targets' logprobs");
    }
    /* the picks: up to GPU_STAGE_PICKS read from the stage, written into h_po through its device address (else
     * into d_po, copied back); more copied up on their own (picks_launch) */
    const int staged = picks_staged(n);
    if (staged) {
        if (gpu_pick(g, n, stage_pick(g, g->d_stage), g->m_po ? g->m_po : g->d_po, err)) return -1;
        if (!g->m_po)
            CU_TRY(cudaMemcpyAsync(g->h_po, g->d_po, (size_t)n * sizeof *g->h_po, cudaMemcpyDeviceToHost, g->stream),
                   err, "copying the picks back");
        g->picks_staged += n;
    }
    if (!staged && picks_launch(g, n, q, err)) return -1;
    if (mw) mw(mw_ctx, 0);   /* the host's work while the device computes */
    if (step_end(g, mems, B, tokens, M, err)) return -1;
    for (size_t r = 0; any_tg && r < N; r++)
        if (targets[r / M * M] >= 0) tlp[r] = g->h_tl[r];
    if (n) memcpy(o, g->h_po, (size_t)n * sizeof *o);
    return 0;
}

int gpu_pick_rows(gpu_model *g, const float *rows, int n_rows, int n, const pick_req *q, pick_out *o, char *err)
{
    const size_t V = (size_t)g->m->V;
    if (n_rows < 1 || n_rows > g->max_batch * g->max_block)
        return err_set(err, "%d rows: this plan holds 1..%d", n_rows, g->max_batch * g->max_block);
    if (picks_check(g, n_rows, n, q, err)) return -1;
    CU_TRY(cudaMemcpyAsync(g->logits, rows, n_rows * V * sizeof *rows, cudaMemcpyHostToDevice, g->stream), err,
           "copying the rows");
    if (picks_launch(g, n, q, err)) return -1;
    CU_TRY(cudaStreamSynchronize(g->stream), err, "the picks failed on the device");
    if (n) memcpy(o, g->h_po, (size_t)n * sizeof *o);
    return 0;
}
