/*
 * fam_gpt.cu - the GPT-style window models on the device (core/gpt.c:
 * "gpt-adaptive-span", "nanogpt"). A step is not B x M rows through the
 * layers: gpt_plan (core/gpt.h, the CPU's own plan) cuts it into windows of
 * 1..window rows, a window's earlier rows' keys and values coming from the
 * stream's cache where the model keeps one (nanoGPT, from position 0). So
 * this family gives a step of its own (gpu_family.step):
 *
 *   on the host: the plan from each stream's position, mode (keep) and ring
 *     of tokens; the windows grouped up to g->step_rows rows (a group's
 *     window k computes its rows at row0.. of the step buffers); the
 *     windows' descriptors and the streams' token rings in one transfer;
 *   per group: each row's window, token and window row (gpt_rows.cu);
 *     x = wte[tok] + wpe[row]; per layer (pre-LN)
 *       qkv = LN1(x) Wqkv^T + qkv_b; the cache's rows of windows that write
 *       it; causal attention (gpt_attn.cu); x += att Wo^T + wo_b;
 *       x += fc2(act(fc1(LN2(x)) + fc1_b)) + fc2_b, act GELU (nanoGPT) or
 *       ReLU;
 *     then the wanted rows packed in output order (the plan lists the
 *     outputs in order), LN_f, the head (+ out_b), log-softmax, into
 *     g->logits at the rows launch_step would leave them.
 *
 * GPU_BF16: the linear layers' inputs (LN1, att, act, LN_f) and weights in
 * bfloat16, their outputs in float32; the projections' sum plus bias rounded
 * to bfloat16 once, the type of the stream's cache.
 *
 * What it derives at load: gpt-adaptive-span's span masks, each head's
 * mask by distance from the window's end (core's layer_t.mask, window
 * floats a head), into `derived`.
 */
#include "gpu_internal.cuh"

extern "C" {
#include "gpt.h"
}

#include <stdlib.h>
#include <string.h>

struct gpu_gpt {
    gpt_win *w;            /* host: the step's plan (room for max_batch x max_block windows) */
    gpt_stream *st;        /* host: the streams as the plan reads them (max_batch) */
    int *group;            /* host: each group's first window, then the number of windows */
    void *h_stage, *d_stage;   /* pinned and device: the streams' token rings (B x window), then the descriptors */
    size_t stage_bytes;
    int32_t *rows;         /* device: each row's window, token and window row (3 x step_rows) */
};

void gpu_gpt_free(gpu_gpt *t)
{
    if (!t) return;
    free(t->w);
    free(t->st);
    free(t->group);
    if (t->h_stage) cudaFreeHost(t->h_stage);
    cudaFree(t->d_stage);
    cudaFree(t->rows);
    free(t);
}

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Past the parameters, core's arena holds gpt-adaptive-span's mask
 * templates (buffers) and a nanoGPT lm_head saved beside the wte it equals
 * (core/gpt.c's derive takes both out of n_params). */
static size_t gpt_arena_extra(const model_t *m)
{
    size_t n = 0;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].mask) n += (size_t)m->n_head * m->span;
    if (m->tie_weight && m->out_w != m->emb) n += (size_t)m->V * m->d_model;
    return n;
}

/* The device copy of P (N floats): NULL for NULL; *BAD set when P lies outside the arena. */
static const float *bind(const gpu_model *g, const float *p, size_t n, int *bad)
{
    if (!p) return NULL;
    const float *d = gpu_on_device(g, p, n);
    if (!d) *bad = 1;
    return d;
}

static int gpt_upload(gpu_model *g, char *err)
{
    const model_t *m = g->m;
    const size_t n = m->d_model, K = m->n_head, E = K * m->d_head, I = m->d_inner, C = m->window;
    int bad = 0;
    g->wpe = bind(g, m->wpe, C * n, &bad);
    g->lnf_w = bind(g, m->lnf_w, n, &bad);
    g->lnf_b = bind(g, m->lnf_b, n, &bad);
    if (bad || !g->wpe || !g->lnf_w) return err_set(err, "%s: wpe or ln_f lies outside the model's arena", m->path);
    size_t nd = 0;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].mask) nd += K * C;
    g->derived_floats = nd;
    CU_TRY(cudaMalloc(&g->derived, (nd ? nd : 1) * sizeof(float)), err, "cudaMalloc (span masks)");
    float *at = g->derived;
    for (int l = 0; l < m->n_layers; l++) {
        const layer_t *y = &m->layers[l];
        gpu_layer *d = &g->L[l];
        d->wqkv = bind(g, y->qkv, 3 * E * n, &bad);
        d->qkv_b = bind(g, y->qkv_b, 3 * E, &bad);
        d->wo = bind(g, y->wo, n * E, &bad);
        d->wo_b = bind(g, y->wo_b, n, &bad);
        d->ln1_w = bind(g, y->ln1_w, n, &bad);
        d->ln1_b = bind(g, y->ln1_b, n, &bad);
        d->ln2_w = bind(g, y->ln2_w, n, &bad);
        d->ln2_b = bind(g, y->ln2_b, n, &bad);
        d->fc1_w = bind(g, y->fc1_w, I * n, &bad);
        d->fc1_b = bind(g, y->fc1_b, I, &bad);
        d->fc2_w = bind(g, y->fc2_w, n * I, &bad);
        d->fc2_b = bind(g, y->fc2_b, n, &bad);
        if (bad || !d->wqkv || !d->wo || !d->ln1_w || !d->ln2_w || !d->fc1_w || !d->fc2_w)
            return err_set(err, "%s: layer %d: a weight lies outside the model's arena", m->path, l);
        if (!y->mask) continue;
        for (size_t h = 0; h < K; h++)
            CU_TRY(cudaMemcpy(at + h * C, y->mask[h], C * sizeof(float), cudaMemcpyHostToDevice), err,
                   "cudaMemcpy (span masks)");
        d->wmask = at;
        at += K * C;
    }
    g->max_window = (int)C;
    return 0;
}

/* The plan's host arrays, the staging of its transfer, the rows' index. */
static int gpt_alloc_step(gpu_model *g, char *err)
{
    const size_t N = (size_t)g->max_batch * g->max_block, C = g->m->window;
    gpu_gpt *t = (gpu_gpt *)calloc(1, sizeof *t);
    if (!(g->gpt = t)) return err_set(err, "out of memory");
    t->w = (gpt_win *)malloc((size_t)gpt_plan_max(g->max_batch, g->max_block) * sizeof *t->w);
    t->st = (gpt_stream *)malloc((size_t)g->max_batch * sizeof *t->st);
    t->group = (int *)malloc((N + 1) * sizeof *t->group);
    if (!t->w || !t->st || !t->group) return err_set(err, "out of memory for the windows of a step");
    t->stage_bytes = align16((size_t)g->max_batch * C * sizeof(int32_t)) + N * sizeof(gpu_gpt_win);
    CU_TRY(cudaMallocHost(&t->h_stage, t->stage_bytes), err, "out of pinned memory for the windows of a step");
    CU_TRY(cudaMalloc(&t->d_stage, t->stage_bytes), err, "out of device memory for the windows of a step");
    CU_TRY(cudaMalloc(&t->rows, 3 * (size_t)g->step_rows * sizeof(int32_t)), err,
           "out of device memory for the rows of a step");
    g->step_bytes += t->stage_bytes + 3 * (size_t)g->step_rows * sizeof(int32_t);
    return 0;
}

/* Runs CALL (a launcher returning 0 or -1), then marks it as operation OP. */
#define OP(op, call) ((call) != 0 || (gpu_mark(g, op), 0))   /* true when it failed */

/* y = x W^T in the model's precision: float32 (x, W) or bfloat16 (xb, Wb). */
static int linear(gpu_model *g, float *y, const float *x, const bf16 *xb, const float *W, const bf16 *Wb, int n, int in,
                  int out, char *err)
{
    return g->prec == GPU_BF16 ? gpu_linear_bf16(g, y, xb, Wb, n, in, out, err) : gpu_linear(g, y, x, W, n, in, out, err);
}

/* Layer L's attention of a group: on tensor cores (attn_mma.cu) where it
 * can (bf16, heads of 32 or 64, windows of 16 rows or more), else
 * gpt_attn.cu's warps. */
static int gpt_attend(gpu_model *g, int l, const gpu_gpt_win *w, int nw, int max_n, int R, const int32_t *rowwin,
                      char *err)
{
    const int tc = gpu_gpt_mma(g, l, w, nw, max_n, err);
    if (tc) return tc < 0 ? -1 : 0;
    return gpu_gpt_attn(g, l, w, R, rowwin, err);
}

/* One group: NW windows (descriptors W on the device, the most rows one
 * computes MAX_N) of R rows in all, whose wanted rows are the step's output
 * rows BASE..BASE+NOUT-1. */
static int run_group(gpu_model *g, const gpu_gpt_win *w, int nw, int max_n, int R, int any_kv, int base, int nout,
                     const int32_t *rings, int M, char *err)
{
    const model_t *m = g->m;
    const int n = m->d_model, E = m->n_head * m->d_head, I = m->d_inner, V = m->V;
    const int bf = g->prec == GPU_BF16;
    bf16 *xb = bf ? g->xb : NULL;
    int32_t *rowwin = g->gpt->rows, *rowtok = rowwin + g->step_rows, *rowpos = rowtok + g->step_rows;
    if (gpu_gpt_index(g, w, nw, rings, stage_tok(g, g->d_stage), M, rowwin, rowtok, rowpos, err) ||
        OP(OP_EMBED, gpu_gpt_embed(g, g->x, rowtok, rowpos, R, err)))
        return -1;
    for (int l = 0; l < m->n_layers; l++) {
        const gpu_layer *d = &g->L[l];
        /* attention: qkv = LN1(x) Wqkv^T + b (bf16: rounded once, the cache's type) */
        if (OP(OP_LN, gpu_layernorm_to(g, g->tmp, xb, g->x, d->ln1_w, d->ln1_b, R, n, err)) ||
            linear(g, g->qkv, g->tmp, xb, d->wqkv, d->wqkv_h, R, n, 3 * E, err) ||
            ((bf || d->qkv_b) && gpu_gpt_bias(g, g->qkv, bf ? g->qkvb : NULL, g->qkv, d->qkv_b, R, 3 * E, err)))
            return -1;
        gpu_mark(g, OP_QKV);
        if (any_kv && OP(OP_RING, gpu_gpt_cache_write(g, l, w, R, rowwin, err))) return -1;
        if (OP(OP_ATTN, gpt_attend(g, l, w, nw, max_n, R, rowwin, err)) ||
            OP(OP_WO, linear(g, g->tmp, g->att, g->attb, d->wo, d->wo_h, R, E, n, err)) ||
            OP(OP_LN, gpu_add_residual(g, g->x, NULL, g->tmp, d->wo_b, R, n, err)))
            return -1;
        /* feed-forward: x += fc2(act(fc1(LN2(x)) + b1)) + b2 */
        if (OP(OP_LN, gpu_layernorm_to(g, g->tmp, xb, g->x, d->ln2_w, d->ln2_b, R, n, err)) ||
            OP(OP_FC1, linear(g, g->ff, g->tmp, xb, d->fc1_w, d->fc1_h, R, n, I, err)) ||
            OP(OP_RELU, m->gelu ? gpu_bias_gelu(g, g->ff, bf ? g->ffb : NULL, d->fc1_b, R, I, err)
                                : gpu_bias_relu(g, g->ff, bf ? g->ffb : NULL, d->fc1_b, R, I, err)) ||
            OP(OP_FC2, linear(g, g->tmp, g->ff, g->ffb, d->fc2_w, d->fc2_h, R, I, n, err)) ||
            OP(OP_LN, gpu_add_residual(g, g->x, NULL, g->tmp, d->fc2_b, R, n, err)))
            return -1;
    }
    /* the wanted rows: packed (tmp), LN_f (in place, or into xb), the head, log-softmax */
    float *lp = g->logits + (size_t)base * V;
    if (gpu_gpt_gather(g, g->tmp, g->x, w, R, rowwin, base, err) ||
        OP(OP_LN, gpu_layernorm_to(g, g->tmp, xb, g->tmp, g->lnf_w, g->lnf_b, nout, n, err)) ||
        OP(OP_OUT, linear(g, lp, g->tmp, xb, g->out_w, g->out_h, nout, n, V, err)) ||
        OP(OP_LOGSOFTMAX, gpu_log_softmax(g, lp, g->out_b, nout, V, err)))
        return -1;
    return 0;
}

/* gpu_family.step: the plan, its one transfer, the groups' launches. */
static int gpt_step(gpu_model *g, gpu_mem **mems, int B, const int32_t *tokens, int M, char *err)
{
    (void)tokens;   /* staged already (stage_tok): the rows' tokens are looked up on the device */
    const model_t *m = g->m;
    gpu_gpt *t = g->gpt;
    const int C = m->window, V = m->V;
    /* the streams: their mode's bound (core's forward_check), their rings staged and checked (ids the
     * device will index tables with) */
    const size_t od = align16((size_t)B * C * sizeof(int32_t));
    int32_t *rings = (int32_t *)t->h_stage;
    for (int b = 0; b < B; b++) {
        const gpu_mem *s = mems[b];
        if (s->pos < 0 || s->pos > MEM_MAX_POS - M)
            return err_set(err, "stream %d is at position %lld: a stream holds at most %lld positions", b,
                           (long long)s->pos, (long long)MEM_MAX_POS);
        if (s->keep >= 0) {
            const int64_t held = s->pos < s->keep ? s->pos : s->keep;
            if (held + M > C)
                return err_set(err, "stream %d: a window of %lld tokens held and %d new is over the model's %d", b,
                               (long long)held, M, C);
        }
        for (int i = 0; i < C; i++)
            if (s->toks[i] < 0 || s->toks[i] >= V)
                return err_set(err, "stream %d's token ring holds %d at %d, outside the vocabulary [0, %d)", b,
                               s->toks[i], i, V);
        memcpy(rings + (size_t)b * C, s->toks, (size_t)C * sizeof *rings);
        const gpt_stream e = {s->pos, s->keep, s->toks};
        t->st[b] = e;
    }
    const int nw = gpt_plan(m, t->st, B, M, t->w);
    /* groups of up to step_rows rows (at least a window each); the outputs must come in order */
    gpu_gpt_win *hd = (gpu_gpt_win *)((char *)t->h_stage + od);
    int ng = 0, R = 0, next = 0;
    for (int k = 0; k < nw; k++) {
        const gpt_win *v = &t->w[k];
        if (v->n < 1 || v->n > C || v->out_row != next)
            return err_set(err, "the plan's window %d (%d rows, output row %d; expected %d) is not what this step "
                           "can compute", k, v->n, v->out_row, next);
        if (k == 0 || R + v->n > g->step_rows) {
            t->group[ng++] = k;
            R = 0;
        }
        const gpu_gpt_win e = {v->start, t->st[v->b].pos, v->b, v->cached, v->n, v->out_from, v->out_row, v->write_kv,
                               R, 0};
        hd[k] = e;
        R += v->n;
        next += v->n - v->out_from;
    }
    t->group[ng] = nw;
    if (next != B * M) return err_set(err, "the plan gives %d output rows of a step of %d", next, B * M);
    CU_TRY(cudaMemcpyAsync(t->d_stage, t->h_stage, od + (size_t)nw * sizeof *hd, cudaMemcpyHostToDevice, g->stream),
           err, "copying the step's windows");
    const gpu_gpt_win *dw = (const gpu_gpt_win *)((char *)t->d_stage + od);
    for (int q = 0; q < ng; q++) {
        const int k0 = t->group[q], k1 = t->group[q + 1];
        const gpu_gpt_win *last = &hd[k1 - 1];
        int any_kv = 0, max_n = 0;
        for (int k = k0; k < k1; k++) {
            any_kv |= hd[k].write_kv;
            max_n = hd[k].n > max_n ? hd[k].n : max_n;
        }
        const int base = hd[k0].out_row, nout = last->out_row + (last->n - last->out_from) - base;
        if (run_group(g, dw + k0, k1 - k0, max_n, last->row0 + last->n, any_kv, base, nout, (const int32_t *)t->d_stage,
                      M, err))
            return -1;
    }
    return 0;
}

/* (the shared launches' hooks: this family's step never calls them) */
static int gpt_sublayers(const model_t *m, int l)
{
    (void)m, (void)l;
    return GPU_SUB_ATTN | GPU_SUB_FFN;
}

static int gpt_attend(gpu_model *g, int l, int B, int M, char *err)
{
    (void)g, (void)l, (void)B, (void)M;
    return err_set(err, "a window model's layers run in its own step");
}

static float gpt_embed_scale(const model_t *m)
{
    (void)m;
    return 1.0f;
}

const gpu_family gpu_family_gpt = {
    gpt_arena_extra, gpt_upload, gpu_gpt_attn_smem, gpt_alloc_step, gpt_sublayers, gpt_attend, gpt_embed_scale,
    gpt_step,
};
