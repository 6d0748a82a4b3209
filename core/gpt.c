/*
 * gpt.c - GPT-style window models: learned absolute positions, pre-LN
 * blocks, causal attention within a window of at most block_size tokens,
 * no memory between windows (gpt.h: how a forward is cut into windows).
 *
 *   x = wte[tok] + wpe[0..T-1]
 *   per layer: x += proj(attn(LN1(x)));  x += fc2(act(fc1(LN2(x))))
 *   logprobs = log_softmax(LN_f(x) Wout^T (+ b))
 *   a head: w = softmax(q k^T / sqrt(hs)) over keys j <= i
 *
 * Two families of it (the config's "family"):
 *   gpt-adaptive-span  uuzall/adaptive_attention_span gpt.py: per-head q, k,
 *                      v without bias, a ReLU feed-forward, an lm_head with
 *                      bias, and a span mask on every head that is measured
 *                      from the window's LAST position (not the query's):
 *                        m_j = clamp((tpl[max-T+j] + z*max) / ramp + 1, 0, 1),
 *                        w = w*m / (sum(w*m) + 1e-8).
 *                      Every row's output depends on the window's length T,
 *                      so no key or value can be kept from one window to
 *                      the next: each token is a window recomputed.
 *   nanogpt            karpathy/nanoGPT model.py: c_attn (q, k, v stacked),
 *                      exact GELU, biases in every Linear and LayerNorm when
 *                      config.bias, lm_head tied to wte. Causal attention is
 *                      the same whatever follows, so a window that starts at
 *                      position 0 grows over a cache of keys and values
 *                      (a session's first block_size tokens); once the
 *                      context slides every token is a window recomputed, as
 *                      sample.py crops to the last block_size.
 */
#include "attention.h"
#include "err.h"
#include "family.h"
#include "forward.h"
#include "gpt.h"
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows a CPU forward computes at once (windows are grouped up to it). */
#define GPT_GROUP_ROWS 4096

/* ------------------------------------------------------------ the plan */

int gpt_plan(const model_t *m, const gpt_stream *st, int B, int M, gpt_win *w)
{
    const int C = m->window;
    int n = 0;
    for (int b = 0; b < B; b++) {
        const gpt_stream *s = &st[b];
        const int64_t p0 = s->pos;
        if (s->keep >= 0) {   /* fed in windows: the held context and the new tokens, one window */
            const int held = (int)(p0 < s->keep ? p0 : s->keep);
            w[n++] = (gpt_win){b, p0 - held, 0, held + M, held, b * M, 0};
            continue;
        }
        int i = 0;
        if (m->cache_kv && p0 < C) {   /* the window from position 0 grows over the cache */
            const int f = (int)(C - p0 < M ? C - p0 : M);
            w[n++] = (gpt_win){b, 0, (int)p0, f, 0, b * M, 1};
            i = f;
        }
        for (; i < M; i++) {   /* each token the last row of its own window */
            const int64_t p = p0 + i, start = p + 1 > C ? p + 1 - C : 0;
            const int T = (int)(p + 1 - start);
            w[n++] = (gpt_win){b, start, 0, T, T - 1, b * M + i, 0};
        }
    }
    return n;
}

int32_t gpt_token(const model_t *m, const gpt_stream *st, const int32_t *tokens, int M, const gpt_win *w, int r)
{
    const gpt_stream *s = &st[w->b];
    const int64_t p = w->start + r;
    return p < s->pos ? s->toks[p % m->window] : tokens[(size_t)w->b * M + (size_t)(p - s->pos)];
}

void gpt_ring_push(int C, int32_t *toks, int64_t pos, const int32_t *tokens, int M)
{
    for (int i = M > C ? M - C : 0; i < M; i++) toks[(pos + i) % C] = tokens[i];
}

/* ------------------------------------------------------------ forward */

/* Window W's computed rows (at X + its first row) through layer Y's
 * attention into ATT: keys and values of rows before `cached` from the
 * stream's cache, the rest from QKV. The rows whose output is wanted hand
 * their weights to REC (when not NULL). */
static void attend(const model_t *m, const layer_t *y, int l, const mem_t *s, const gpt_win *w, const float *qkv,
                   float *att, float *p, attn_rec *rec)
{
    const int K = m->n_head, hs = m->d_head, E = K * hs, T = w->cached + w->n;
    const float scale = 1.0f / sqrtf((float)hs);
    const float *ck = w->cached ? gpt_cache_k(s, l) : NULL, *cv = ck ? ck + gpt_cache_v_off(m) : NULL;
    for (int h = 0; h < K; h++) {
        const float *mask = y->mask ? y->mask[h] : NULL;
        for (int j = 0; j < w->n; j++) {
            const int i = w->cached + j;   /* the query's window row: keys 0..i */
            const float *q = qkv + (size_t)j * 3 * E + h * hs;
            float mx = -INFINITY;
            for (int r = 0; r <= i; r++) {
                const float *k = r < w->cached ? ck + (size_t)r * E + h * hs
                                               : qkv + (size_t)(r - w->cached) * 3 * E + E + h * hs;
                float d = 0;
                for (int c = 0; c < hs; c++) d += q[c] * k[c];
                p[r] = d * scale;
                mx = p[r] > mx ? p[r] : mx;
            }
            double z = 0;
            for (int r = 0; r <= i; r++) z += p[r] = expf(p[r] - mx);
            double zm = 0;
            for (int r = 0; r <= i; r++) {
                p[r] = (float)(p[r] / z);
                if (mask) p[r] *= mask[T - 1 - r];
                zm += p[r];
            }
            const float inv = mask ? (float)(1.0 / (zm + 1e-8)) : 1.0f;
            if (rec && j >= w->out_from)   /* window row r is position start + r */
                attn_record(rec, w->b, l, h, w->start + i, w->start, p, i + 1, NULL, 0, inv);
            float *o = att + (size_t)j * E + h * hs;
            memset(o, 0, (size_t)hs * sizeof *o);
            for (int r = 0; r <= i; r++) {
                const float a = p[r] * inv;
                const float *v = r < w->cached ? cv + (size_t)r * E + h * hs
                                               : qkv + (size_t)(r - w->cached) * 3 * E + 2 * E + h * hs;
                for (int c = 0; c < hs; c++) o[c] += a * v[c];
            }
        }
    }
}

/* y[n x out] = x W^T + b, one product a window (a stream's bits never depend on its neighbours). */
static void win_linear(float *y, const float *x, const float *W, const float *b, int n, int in, int out)
{
    ops_linear(y, x, W, b, 1, n, in, out);
}

/* Windows W[0..nw) (their rows at RO[]) through the model; their wanted
 * outputs into LOGPROBS. */
static int run_group(const model_t *m, mem_t *const *mems, const gpt_stream *st, const int32_t *tokens, int M,
                     const gpt_win *w, int nw, const int *ro, int R, float *logprobs, fwd_ws *ws, char *err)
{
    const int n = m->d_model, K = m->n_head, hs = m->d_head, E = K * hs, I = m->d_inner, V = m->V, C = m->window;
    float *x = ws_get(ws, WS_H, (size_t)R * n), *hb = ws_get(ws, WS_TMP, (size_t)R * (n > E ? n : E)),
          *qkv = ws_get(ws, WS_QKV, (size_t)R * 3 * E), *att = ws_get(ws, WS_ATT, (size_t)R * E),
          *ff = ws_get(ws, WS_FF, (size_t)R * I), *p = ws_get(ws, WS_P, (size_t)C + 1),
          *lg = ws_get(ws, WS_LOGITS, (size_t)C * V);
    if (!x || !hb || !qkv || !att || !ff || !p || !lg)
        return err_set(err, "out of memory for %d rows of windows", R);
    for (int k = 0; k < nw; k++)
        for (int j = 0; j < w[k].n; j++) {
            const int r = w[k].cached + j;
            const float *te = m->emb + (size_t)gpt_token(m, st, tokens, M, &w[k], r) * n, *pe = m->wpe + (size_t)r * n;
            float *o = x + (size_t)(ro[k] + j) * n;
            for (int c = 0; c < n; c++) o[c] = te[c] + pe[c];
        }
    for (int l = 0; l < m->n_layers; l++) {
        const layer_t *y = &m->layers[l];
        memcpy(hb, x, (size_t)R * n * sizeof *hb);
        ops_add_layernorm(hb, NULL, y->ln1_w, y->ln1_b, R, n);
        for (int k = 0; k < nw; k++) {
            const gpt_win *v = &w[k];
            float *q = qkv + (size_t)ro[k] * 3 * E;
            win_linear(q, hb + (size_t)ro[k] * n, y->qkv, y->qkv_b, v->n, n, 3 * E);
            if (v->write_kv) {   /* the cache: keys and values of window rows cached.. */
                mem_t *s = mems[v->b];
                float *ck = gpt_cache_k(s, l), *cv = ck + gpt_cache_v_off(m);
                for (int j = 0; j < v->n; j++) {
                    memcpy(ck + (size_t)(v->cached + j) * E, q + (size_t)j * 3 * E + E, (size_t)E * sizeof *ck);
                    memcpy(cv + (size_t)(v->cached + j) * E, q + (size_t)j * 3 * E + 2 * E, (size_t)E * sizeof *cv);
                }
            }
            attend(m, y, l, mems[v->b], v, q, att + (size_t)ro[k] * E, p, ws->rec);
        }
        for (int k = 0; k < nw; k++)
            win_linear(hb + (size_t)ro[k] * n, att + (size_t)ro[k] * E, y->wo, y->wo_b, w[k].n, E, n);
        for (size_t i = 0; i < (size_t)R * n; i++) x[i] += hb[i];
        memcpy(hb, x, (size_t)R * n * sizeof *hb);
        ops_add_layernorm(hb, NULL, y->ln2_w, y->ln2_b, R, n);
        for (int k = 0; k < nw; k++)
            win_linear(ff + (size_t)ro[k] * I, hb + (size_t)ro[k] * n, y->fc1_w, y->fc1_b, w[k].n, n, I);
        if (m->gelu) ops_gelu(ff, (size_t)R * I);
        else ops_relu(ff, (size_t)R * I);
        for (int k = 0; k < nw; k++)
            win_linear(hb + (size_t)ro[k] * n, ff + (size_t)ro[k] * I, y->fc2_w, y->fc2_b, w[k].n, I, n);
        for (size_t i = 0; i < (size_t)R * n; i++) x[i] += hb[i];
    }
    /* the wanted rows: LN_f, the head, log-softmax */
    for (int k = 0; k < nw; k++) {
        const int nout = w[k].n - w[k].out_from;
        float *h = x + (size_t)(ro[k] + w[k].out_from) * n;
        ops_add_layernorm(h, NULL, m->lnf_w, m->lnf_b, nout, n);
        float *dst = logprobs ? logprobs + (size_t)w[k].out_row * V : lg;
        win_linear(dst, h, m->out_w, m->out_b, nout, n, V);
        ops_log_softmax(dst, nout, V);
    }
    return 0;
}

static int gpt_forward(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                       float *logprobs, fwd_ws *ws, char *err)
{
    (void)targets;   /* whole rows: one softmax is all the head has */
    gpt_win *w = malloc((size_t)gpt_plan_max(B, M) * sizeof *w);
    int *ro = malloc(((size_t)gpt_plan_max(B, M) + 1) * sizeof *ro);
    gpt_stream *st = malloc((size_t)B * sizeof *st);
    int rc = 0;
    if (!w || !ro || !st) rc = err_set(err, "out of memory for a plan of %d x %d tokens", B, M);
    for (int b = 0; rc == 0 && b < B; b++) st[b] = (gpt_stream){mems[b]->pos, mems[b]->keep, mems[b]->toks};
    const int nw = rc ? 0 : gpt_plan(m, st, B, M, w);
    for (int k0 = 0, k1; rc == 0 && k0 < nw; k0 = k1) {
        int R = 0;
        for (k1 = k0; k1 < nw && (k1 == k0 || R + w[k1].n <= GPT_GROUP_ROWS); k1++) {
            ro[k1 - k0] = R;
            R += w[k1].n;
        }
        rc = run_group(m, mems, st, tokens, M, w + k0, k1 - k0, ro, R, logprobs, ws, err);
    }
    free(w);
    free(ro);
    free(st);
    return rc;
}

/* ------------------------------------------------------------ loading */

enum { B_Q, B_K, B_V, B_Z, B_TPL, B_N };   /* layer_t.bound: each head's tensors */

static int gpt_config_common(model_t *m, char *err)
{
    if (m->d_head < 1) return err_set(err, "%s: n_embd %d over n_head %d leaves no head dims", m->path, m->d_model, m->n_head);
    m->block_len = m->window;
    m->d_inner = 4 * m->d_model;
    if (!(m->layers = calloc((size_t)m->n_layers, sizeof *m->layers))) return err_set(err, "out of memory");
    return 0;
}

static int gpt_aspan_config(model_t *m, json_t *cfg, char *err)
{
    const char *p = m->path;
    if (cfg_int(p, cfg, "n_embd", 1, MODEL_MAX_DIM, 1, 0, &m->d_model, err) ||
        cfg_int(p, cfg, "n_head", 1, MODEL_MAX_HEADS, 1, 0, &m->n_head, err) ||
        cfg_int(p, cfg, "n_layer", 1, MODEL_MAX_LAYERS, 1, 0, &m->n_layers, err) ||
        cfg_int(p, cfg, "block_size", 1, MODEL_MAX_SPAN, 1, 0, &m->window, err) ||
        cfg_int(p, cfg, "max_size", m->window, MODEL_MAX_SPAN, 0, m->window, &m->span, err) ||
        cfg_int(p, cfg, "ramp_size", 1, MODEL_MAX_SPAN, 0, m->window, &m->ramp, err))
        return -1;
    m->d_head = m->d_model / m->n_head;   /* gpt.py: head_size = n_embd // n_head */
    if (gpt_config_common(m, err)) return -1;
    for (int l = 0; l < m->n_layers; l++)
        if (!(m->layers[l].bound = calloc((size_t)B_N * m->n_head, sizeof *m->layers[l].bound)))
            return err_set(err, "out of memory");
    return 0;
}

static int nanogpt_config(model_t *m, json_t *cfg, char *err)
{
    const char *p = m->path;
    int bias;
    if (cfg_int(p, cfg, "n_embd", 1, MODEL_MAX_DIM, 1, 0, &m->d_model, err) ||
        cfg_int(p, cfg, "n_head", 1, MODEL_MAX_HEADS, 1, 0, &m->n_head, err) ||
        cfg_int(p, cfg, "n_layer", 1, MODEL_MAX_LAYERS, 1, 0, &m->n_layers, err) ||
        cfg_int(p, cfg, "block_size", 1, MODEL_MAX_SPAN, 1, 0, &m->window, err) ||
        cfg_bool(p, cfg, "bias", 1, &bias, err))
        return -1;
    if (m->d_model % m->n_head)
        return err_set(err, "%s: config n_embd %d is not a multiple of n_head %d", p, m->d_model, m->n_head);
    m->d_head = m->d_model / m->n_head;
    m->gelu = 1;
    m->cache_kv = 1;
    m->bias = bias;
    return gpt_config_common(m, err);
}

static int gpt_aspan_tensors(model_t *m, wantlist *L)
{
    const int64_t V = m->V, n = m->d_model, K = m->n_head, hs = m->d_head, E = K * hs, C = m->window, S = m->span;
    static const char *const qkv[3] = {"query", "key", "value"};
    int bad = want(L, &m->emb, W_LOAD, 2, V, n, 0, "token_embedding.weight") ||
              want(L, &m->wpe, W_LOAD, 2, C, n, 0, "position_embedding.weight") ||
              want(L, &m->lnf_w, W_LOAD, 1, n, 0, 0, "ln_f.weight") ||
              want(L, &m->lnf_b, W_LOAD, 1, n, 0, 0, "ln_f.bias") ||
              want(L, &m->out_w, W_LOAD, 2, V, n, 0, "lm_head.weight") ||
              want(L, &m->out_b, W_LOAD, 1, V, 0, 0, "lm_head.bias");
    for (int l = 0; l < m->n_layers && !bad; l++) {
        layer_t *y = &m->layers[l];
        /* the heads' queries, then keys, then values: one 3E x n matrix in the arena */
        for (int t = 0; t < 3; t++)
            for (int h = 0; h < K && !bad; h++)
                bad = want(L, &y->bound[t * K + h], W_LOAD, 2, hs, n, 0, "blocks.%d.sa.heads.%d.%s.weight", l, h, qkv[t]);
        for (int h = 0; h < K && !bad; h++)
            bad = want(L, &y->bound[B_Z * K + h], W_OPTIONAL, 3, 1, 1, 1, "blocks.%d.sa.heads.%d.adaptive_span.current_val",
                       l, h);
        for (int h = 0; h < K && !bad; h++)
            bad = want(L, &y->bound[B_TPL * K + h], W_OPTIONAL, 1, S, 0, 0,
                       "blocks.%d.sa.heads.%d.adaptive_span.mask_template", l, h) ||
                  want(L, NULL, W_IGNORE, 2, C, C, 0, "blocks.%d.sa.heads.%d.tril", l, h);
        bad = bad || want(L, &y->wo, W_LOAD, 2, n, E, 0, "blocks.%d.sa.proj.weight", l) ||
              want(L, &y->wo_b, W_LOAD, 1, n, 0, 0, "blocks.%d.sa.proj.bias", l) ||
              want(L, &y->fc1_w, W_LOAD, 2, 4 * n, n, 0, "blocks.%d.ff.net.0.weight", l) ||
              want(L, &y->fc1_b, W_LOAD, 1, 4 * n, 0, 0, "blocks.%d.ff.net.0.bias", l) ||
              want(L, &y->fc2_w, W_LOAD, 2, n, 4 * n, 0, "blocks.%d.ff.net.2.weight", l) ||
              want(L, &y->fc2_b, W_LOAD, 1, n, 0, 0, "blocks.%d.ff.net.2.bias", l) ||
              want(L, &y->ln1_w, W_LOAD, 1, n, 0, 0, "blocks.%d.ln1.weight", l) ||
              want(L, &y->ln1_b, W_LOAD, 1, n, 0, 0, "blocks.%d.ln1.bias", l) ||
              want(L, &y->ln2_w, W_LOAD, 1, n, 0, 0, "blocks.%d.ln2.weight", l) ||
              want(L, &y->ln2_b, W_LOAD, 1, n, 0, 0, "blocks.%d.ln2.bias", l);
    }
    return bad;
}

static int nanogpt_tensors(model_t *m, wantlist *L)
{
    const int64_t V = m->V, n = m->d_model, C = m->window;
    const int b = m->bias ? W_LOAD : W_IGNORE;   /* biases: config.bias */
    int bad = want(L, &m->emb, W_LOAD, 2, V, n, 0, "transformer.wte.weight") ||
              want(L, &m->wpe, W_LOAD, 2, C, n, 0, "transformer.wpe.weight") ||
              want(L, &m->lnf_w, W_LOAD, 1, n, 0, 0, "transformer.ln_f.weight") ||
              want(L, &m->out_w, W_OPTIONAL, 2, V, n, 0, "lm_head.weight");
    if (b == W_LOAD) bad = bad || want(L, &m->lnf_b, W_LOAD, 1, n, 0, 0, "transformer.ln_f.bias");
    for (int l = 0; l < m->n_layers && !bad; l++) {
        layer_t *y = &m->layers[l];
        bad = want(L, &y->ln1_w, W_LOAD, 1, n, 0, 0, "transformer.h.%d.ln_1.weight", l) ||
              want(L, &y->qkv, W_LOAD, 2, 3 * n, n, 0, "transformer.h.%d.attn.c_attn.weight", l) ||
              want(L, &y->wo, W_LOAD, 2, n, n, 0, "transformer.h.%d.attn.c_proj.weight", l) ||
              want(L, &y->ln2_w, W_LOAD, 1, n, 0, 0, "transformer.h.%d.ln_2.weight", l) ||
              want(L, &y->fc1_w, W_LOAD, 2, 4 * n, n, 0, "transformer.h.%d.mlp.c_fc.weight", l) ||
              want(L, &y->fc2_w, W_LOAD, 2, n, 4 * n, 0, "transformer.h.%d.mlp.c_proj.weight", l) ||
              /* the causal mask older nanoGPTs keep as a buffer (1 x 1 x C x C) */
              want(L, NULL, W_IGNORE, -1, 0, 0, 0, "transformer.h.%d.attn.bias", l);
        if (b == W_LOAD)
            bad = bad || want(L, &y->ln1_b, W_LOAD, 1, n, 0, 0, "transformer.h.%d.ln_1.bias", l) ||
                  want(L, &y->qkv_b, W_LOAD, 1, 3 * n, 0, 0, "transformer.h.%d.attn.c_attn.bias", l) ||
                  want(L, &y->wo_b, W_LOAD, 1, n, 0, 0, "transformer.h.%d.attn.c_proj.bias", l) ||
                  want(L, &y->ln2_b, W_LOAD, 1, n, 0, 0, "transformer.h.%d.ln_2.bias", l) ||
                  want(L, &y->fc1_b, W_LOAD, 1, 4 * n, 0, 0, "transformer.h.%d.mlp.c_fc.bias", l) ||
                  want(L, &y->fc2_b, W_LOAD, 1, n, 0, 0, "transformer.h.%d.mlp.c_proj.bias", l);
    }
    return bad;
}

/* gpt.py's adaptive_span.forward, evaluated once per head for a key D rows
 * before the window's last: (tpl[max-1-D] + z*max) / ramp + 1, clamped, in
 * float32 as PyTorch computes it. */
static float win_mask(const float *tpl, float zfrac, int S, int R, int d)
{
    const float x = (tpl[S - 1 - d] + zfrac * (float)S) / (float)R + 1.0f;
    return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x;
}

static int gpt_aspan_derive(model_t *m, const wantlist *L, char *err)
{
    (void)L;
    const int K = m->n_head, hs = m->d_head, n = m->d_model, C = m->window, S = m->span;
    int spans = -1;   /* every head has its span module, or none does */
    for (int l = 0; l < m->n_layers; l++) {
        layer_t *y = &m->layers[l];
        for (int t = 0; t < 3; t++)
            for (int h = 0; h < K; h++)
                if (y->bound[t * K + h] != y->bound[0] + ((size_t)t * K + h) * hs * n)
                    return err_set(err, "%s: blocks.%d: the heads' projections are not one matrix", m->path, l);
        y->qkv = y->bound[0];
        for (int h = 0; h < K; h++) {
            const int has = y->bound[B_Z * K + h] != NULL, tpl = y->bound[B_TPL * K + h] != NULL;
            if (has != tpl || (spans >= 0 && has != spans))
                return err_set(err, "%s: blocks.%d.sa.heads.%d: %s; every head has an adaptive_span (current_val and "
                               "mask_template) or none does", m->path, l, h, has ? "has a span" : "has no span");
            spans = has;
        }
        if (!spans) continue;
        y->zfrac = (float *)y->bound[B_Z * K];
        y->mask = calloc((size_t)K, sizeof *y->mask);
        y->reach = calloc((size_t)K, sizeof *y->reach);
        if (!y->mask || !y->reach) return err_set(err, "out of memory");
        for (int h = 0; h < K; h++) {
            const float *tpl = y->bound[B_TPL * K + h], z = y->zfrac[h];
            if (y->bound[B_Z * K + h] != y->zfrac + h || tpl != y->bound[B_TPL * K] + (size_t)h * S)
                return err_set(err, "%s: blocks.%d: the heads' spans are not one table", m->path, l);
            for (int j = 0; j < S; j++)
                if (fabsf(tpl[j] - (float)(1 - S + j)) > ldexpf((float)(S - 1 - j), -8))
                    return err_set(err, "%s: tensor 'blocks.%d.sa.heads.%d.adaptive_span.mask_template' is not "
                                   "linspace(1-max_size, 0, max_size): [%d] = %g", m->path, l, h, j, (double)tpl[j]);
            if (!(z >= 0.0f && z <= 1.0f))
                return err_set(err, "%s: blocks.%d.sa.heads.%d current_val = %g is outside [0, 1] (the reference "
                               "clamps it)", m->path, l, h, (double)z);
            if (!(y->mask[h] = malloc((size_t)C * sizeof(float)))) return err_set(err, "out of memory");
            for (int d = 0; d < C; d++) {
                y->mask[h][d] = win_mask(tpl, z, S, m->ramp, d);
                if (y->mask[h][d] > 0.0f) y->reach[h] = d + 1;
            }
        }
        m->n_params -= (int64_t)K * S;   /* mask templates are buffers, not parameters */
    }
    return 0;
}

static int nanogpt_derive(model_t *m, const wantlist *L, char *err)
{
    (void)L, (void)err;
    m->tie_weight = 1;
    if (!m->out_w) m->out_w = m->emb;   /* tied, as nanoGPT ties them */
    else if (memcmp(m->out_w, m->emb, (size_t)m->V * m->d_model * sizeof(float)) == 0)
        m->n_params -= (int64_t)m->V * m->d_model;   /* the same tensor, saved twice */
    else m->tie_weight = 0;   /* an untied head: served as it is */
    return 0;
}

static void gpt_free_derived(model_t *m)
{
    for (int l = 0; m->layers && l < m->n_layers; l++) {
        layer_t *y = &m->layers[l];
        for (int h = 0; y->mask && h < m->n_head; h++) free(y->mask[h]);
        free(y->mask);
        free(y->reach);
        free((void *)y->bound);
    }
}

static int gpt_aspan_claims(const char *fam, json_t *cfg)
{
    (void)cfg;
    return strcmp(fam, "gpt-adaptive-span") == 0;
}

static int nanogpt_claims(const char *fam, json_t *cfg)
{
    (void)cfg;
    return strcmp(fam, "nanogpt") == 0;
}

/* ------------------------------------------------------------ memory */

/* nanoGPT: one cache a layer, keys and values of `window` rows; the
 * adaptive-span GPT keeps its tokens only (mem_t.toks). */
static int gpt_mem_slots(const model_t *m) { return m->cache_kv ? m->n_layers : 0; }
static int gpt_slot_rows(const model_t *m, int i) { (void)i; return m->window; }
static int gpt_slot_width(const model_t *m) { return m->n_head * m->d_head; }
static int64_t gpt_held_rows(const model_t *m, int l, int64_t pos) { (void)m, (void)l, (void)pos; return 0; }
/* The seeds' generate keeps the window's token ids (int64) and recomputes. */
static size_t gpt_mem_reference(const model_t *m) { return (size_t)m->window * 8; }
static size_t gpt_mem_full(const model_t *m)
{
    return (size_t)m->n_layers * 2 * m->window * m->n_head * m->d_head * sizeof(float);
}
static const char *gpt_mem_kind(const model_t *m) { return m->cache_kv ? "window-cache" : "window-tokens"; }

/* ------------------------------------------------------------ reports */

static void gpt_report(const model_t *m, json_t *r)
{
    json_object_set_new(r, "window", json_integer(m->window));
    json_object_set_new(r, "recompute", json_string(m->cache_kv ? "each token once the window is full"
                                                                : "each token (spans measured from the window's end)"));
    /* what a session's token costs: a row over the cache while the window grows (nanoGPT), else a window */
    const double n = m->d_model, E = (double)m->n_head * m->d_head, C = m->window, head = 2.0 * m->V * n;
    const double row = 2 * n * 3 * E + 2 * E * n + 4 * n * m->d_inner;
    double tok = head, step = 0;
    m->family->cost(m, &tok, &step);
    json_object_set_new(r, "session", json_pack("{s:i, s:f, s:f}", "tokens_held", m->window,
                                                "flops_per_token_cached",
                                                m->cache_kv ? head + m->n_layers * (row + 4 * E * C) : tok,
                                                "flops_per_token_recomputed", tok));
    if (!m->layers[0].mask) return;
    json_t *layers = json_array();
    for (int l = 0; l < m->n_layers; l++) {
        json_array_append_new(layers, json_pack("{s:i, s:o}", "layer", l, "heads",
                                                span_heads_report(m, &m->layers[l], m->window)));
    }
    json_object_set_new(r, "attn_span", json_integer(m->span));
    json_object_set_new(r, "ramp", json_integer(m->ramp));
    json_object_set_new(r, "layers", layers);
}

/* A token whose window is recomputed: every row of a full window through
 * the layers (q, k, v, proj, the feed-forward) and causal attention. */
static void gpt_cost(const model_t *m, double *tok, double *step)
{
    const double n = m->d_model, E = (double)m->n_head * m->d_head, I = m->d_inner, C = m->window;
    const double row = 2 * n * 3 * E + 2 * E * n + 4 * n * I;
    *tok += m->n_layers * (C * row + 2 * E * C * (C + 1));
    (void)step;
}

#define GPT_OPS                                 \
    .free_derived = gpt_free_derived, .forward = gpt_forward, .mem_slots = gpt_mem_slots, \
    .slot_krows = gpt_slot_rows, .slot_vrows = gpt_slot_rows, .slot_width = gpt_slot_width,          \
    .held_rows = gpt_held_rows, .mem_reference = gpt_mem_reference, .mem_full = gpt_mem_full,        \
    .full_name = "keys and values of a full window, every layer", .mem_kind = gpt_mem_kind,            \
    .report = gpt_report, .cost = gpt_cost

const family_ops family_gpt_aspan = {
    .name = "gpt-adaptive-span",
    .claims = gpt_aspan_claims,
    .config = gpt_aspan_config,
    .tensors = gpt_aspan_tensors,
    .derive = gpt_aspan_derive,
    GPT_OPS,
};

const family_ops family_nanogpt = {
    .name = "nanogpt",
    .claims = nanogpt_claims,
    .config = nanogpt_config,
    .tensors = nanogpt_tensors,
    .derive = nanogpt_derive,
    GPT_OPS,
};
