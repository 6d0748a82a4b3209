/*
 * txl.c - the Transformer-XL family as kimiyoung/transformer-xl's
 * MemTransformerLM builds it (and the Hugging Face TransfoXLLMHeadModel and
 * NVIDIA DeepLearningExamples ports of it, once clients/convert has named
 * their tensors as the reference does): n_layer layers of relative attention
 * then feed-forward, adaptive input and adaptive softmax (adaptive.c), word
 * vocabularies (tok_words.c). ../shared/fixtures/README.md ("txl-word") is
 * the specification.
 *
 * A layer l is held as two blocks, 2l (attn) and 2l+1 (ffn), so that the
 * forward, the memory (keys and values of each attention block's input, the
 * last mem_len rows) and the reports are PAR's (par.c). Serving uses the
 * checkpoint's evaluation settings: eval_tgt_len segments, eval_mem_len rows
 * of memory, eval_clamp_len, eval_same_length.
 */
#include "adaptive.h"
#include "err.h"
#include "family.h"
#include "forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int div_val, d_embed, tie_projs[ADA_MAX_CLUSTERS];
    const float *emb_table, *emb_proj0, *out_w0, *out_b0;   /* div_val 1: one table of all V rows */
} txl_load;

/* The layout details kept between config and derive (freed by derive). */
static txl_load *load_of(model_t *m) { return (txl_load *)(m->ada + 1); }

static int txl_claims(const char *fam, json_t *cfg)
{
    return strcmp(fam, "transformer-xl") == 0 && json_object_get(cfg, "arch") == NULL;
}

static int txl_config(model_t *m, json_t *cfg, char *err)
{
    const char *p = m->path;
    int n_layer, tgt_len, mem_len, ext_len, attn_type, eval_clamp;
    if (cfg_int(p, cfg, "n_layer", 1, MODEL_MAX_LAYERS / 2, 1, 0, &n_layer, err) ||
        cfg_int(p, cfg, "n_head", 1, MODEL_MAX_HEADS, 1, 0, &m->n_head, err) ||
        cfg_int(p, cfg, "d_model", 2, MODEL_MAX_DIM, 1, 0, &m->d_model, err) ||
        cfg_int(p, cfg, "d_head", 1, MODEL_MAX_DIM, 1, 0, &m->d_head, err) ||
        cfg_int(p, cfg, "d_inner", 1, MODEL_MAX_DIM * 8LL, 1, 0, &m->d_inner, err) ||
        cfg_int(p, cfg, "tgt_len", 1, MODEL_MAX_SPAN, 1, 0, &tgt_len, err) ||
        cfg_int(p, cfg, "mem_len", 0, MODEL_MAX_SPAN, 1, 0, &mem_len, err) ||
        cfg_int(p, cfg, "ext_len", 0, 0, 0, 0, &ext_len, err) ||
        cfg_int(p, cfg, "attn_type", 0, 0, 0, 0, &attn_type, err) ||
        cfg_int(p, cfg, "eval_tgt_len", 1, MODEL_MAX_SPAN, 0, tgt_len, &m->block_len, err) ||
        cfg_int(p, cfg, "eval_mem_len", 0, MODEL_MAX_SPAN, 0, mem_len, &m->mem_len, err) ||
        cfg_int(p, cfg, "eval_clamp_len", -1, MODEL_MAX_SPAN, 0, -1, &eval_clamp, err) ||
        cfg_bool(p, cfg, "eval_same_length", 0, &m->same_length, err) ||
        cfg_bool(p, cfg, "pre_lnorm", 0, &m->pre_lnorm, err) || cfg_bool(p, cfg, "tie_weight", 1, &m->tie_weight, err))
        return -1;
    m->clamp_len = eval_clamp > 0 ? eval_clamp : 0;
    if (m->d_model % 2) return err_set(err, "%s: config d_model %d must be even", p, m->d_model);
    if ((long long)m->n_head * m->d_head > MODEL_MAX_DIM)
        return err_set(err, "%s: config n_head * d_head = %lld is over %d", p, (long long)m->n_head * m->d_head,
                       MODEL_MAX_DIM);
    m->ada = calloc(1, sizeof(adaptive) + sizeof(txl_load));
    if (!m->ada) return err_set(err, "out of memory");
    adaptive *a = m->ada;
    txl_load *t = load_of(m);
    if (cfg_int(p, cfg, "d_embed", 1, MODEL_MAX_DIM, 0, m->d_model, &t->d_embed, err) ||
        cfg_int(p, cfg, "div_val", 1, 1 << 16, 0, 1, &t->div_val, err))
        return -1;
    /* cutoffs: increasing, inside the vocabulary */
    json_t *cut = json_object_get(cfg, "cutoffs");
    if (cut && !json_is_array(cut)) return err_set(err, "%s: config 'cutoffs' must be an array of token ids", p);
    size_t nc = cut ? json_array_size(cut) : 0;
    if (nc + 1 > ADA_MAX_CLUSTERS) return err_set(err, "%s: config 'cutoffs' has %zu entries; at most %d", p, nc, ADA_MAX_CLUSTERS - 1);
    a->n = (int)nc + 1;
    a->cut[0] = 0;
    for (size_t i = 0; i < nc; i++) {
        json_t *c = json_array_get(cut, i);
        long long v = json_is_integer(c) ? json_integer_value(c) : -1;
        if (v <= a->cut[i] || v >= m->V)
            return err_set(err, "%s: config cutoffs[%zu] must be an integer above the one before and below the "
                           "vocabulary size %d", p, i, m->V);
        a->cut[i + 1] = (int)v;
    }
    a->cut[a->n] = m->V;
    /* d_i = d_embed / div_val^i, at least 1 */
    long long d = t->d_embed;
    for (int i = 0; i < a->n; i++) {
        if (d < 1) return err_set(err, "%s: config d_embed %d / div_val %d^%d leaves no dims for cluster %d", p,
                                  t->d_embed, t->div_val, i, i);
        a->dim[i] = (int)d;
        if (t->div_val > 1) d /= t->div_val;
    }
    json_t *tp = json_object_get(cfg, "tie_projs");
    if (tp && (!json_is_array(tp) || json_array_size(tp) != (size_t)a->n))
        return err_set(err, "%s: config 'tie_projs' must be an array of %d booleans (the shortlist and each cluster)",
                       p, a->n);
    for (int i = 0; tp && i < a->n; i++) {
        json_t *b = json_array_get(tp, (size_t)i);
        if (!json_is_boolean(b)) return err_set(err, "%s: config tie_projs[%d] must be true or false", p, i);
        t->tie_projs[i] = json_is_true(b);
    }
    m->n_layers = 2 * n_layer;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return err_set(err, "out of memory");
    for (int b = 0; b < m->n_layers; b++) m->layers[b].kind = b % 2 ? BLK_FFN : BLK_ATTN;
    return 0;
}

static int txl_tensors(model_t *m, wantlist *L)
{
    adaptive *a = m->ada;
    txl_load *t = load_of(m);
    const int64_t V = m->V, D = m->d_model, I = m->d_inner, nh = m->n_head, dh = m->d_head, A = nh * dh, E = t->d_embed;
    const int tied = m->tie_weight ? W_IGNORE : W_LOAD;
    int bad = want(L, &m->r_w_bias, W_OPTIONAL, 2, nh, dh, 0, "r_w_bias") ||
              want(L, &m->r_r_bias, W_OPTIONAL, 2, nh, dh, 0, "r_r_bias") ||
              want(L, NULL, W_IGNORE, 1, D / 2, 0, 0, "pos_emb.inv_freq");
    if (t->div_val == 1) {
        /* one table; projections only where d_embed != d_model */
        bad = bad || want(L, &t->emb_table, W_LOAD, 2, V, E, 0, "word_emb.emb_layers.0.weight") ||
              want(L, &t->out_w0, tied, 2, V, E, 0, "crit.out_layers.0.weight") ||
              want(L, &t->out_b0, W_LOAD, 1, V, 0, 0, "crit.out_layers.0.bias");
        if (E != D) {
            bad = bad || want(L, &t->emb_proj0, W_LOAD, 2, D, E, 0, "word_emb.emb_projs.0");
            for (int i = 0; i < a->n && !bad; i++)
                bad = want(L, &a->out_proj[i], t->tie_projs[i] ? W_IGNORE : W_LOAD, 2, D, E, 0, "crit.out_projs.%d", i);
        }
    } else {
        for (int i = 0; i < a->n && !bad; i++) {
            const int64_t n = a->cut[i + 1] - a->cut[i], d = a->dim[i];
            bad = want(L, &a->emb[i], W_LOAD, 2, n, d, 0, "word_emb.emb_layers.%d.weight", i) ||
                  want(L, &a->emb_proj[i], W_LOAD, 2, D, d, 0, "word_emb.emb_projs.%d", i) ||
                  want(L, &a->out_w[i], tied, 2, n, d, 0, "crit.out_layers.%d.weight", i) ||
                  want(L, &a->out_b[i], W_LOAD, 1, n, 0, 0, "crit.out_layers.%d.bias", i) ||
                  want(L, &a->out_proj[i], t->tie_projs[i] ? W_IGNORE : W_LOAD, 2, D, d, 0, "crit.out_projs.%d", i);
        }
    }
    if (a->n > 1 && !bad)
        bad = want(L, &a->cluster_w, W_LOAD, 2, a->n - 1, a->dim[0], 0, "crit.cluster_weight") ||
              want(L, &a->cluster_b, W_LOAD, 1, a->n - 1, 0, 0, "crit.cluster_bias");
    for (int l = 0; 2 * l < m->n_layers && !bad; l++) {
        layer_t *y = &m->layers[2 * l], *f = &m->layers[2 * l + 1];
        bad = want(L, &y->qkv, W_LOAD, 2, 3 * A, D, 0, "layers.%d.dec_attn.qkv_net.weight", l) ||
              want(L, &y->rnet, W_LOAD, 2, A, D, 0, "layers.%d.dec_attn.r_net.weight", l) ||
              want(L, &y->onet, W_LOAD, 2, D, A, 0, "layers.%d.dec_attn.o_net.weight", l) ||
              want(L, &y->ln1_w, W_LOAD, 1, D, 0, 0, "layers.%d.dec_attn.layer_norm.weight", l) ||
              want(L, &y->ln1_b, W_LOAD, 1, D, 0, 0, "layers.%d.dec_attn.layer_norm.bias", l) ||
              want(L, &y->r_w_bias, W_OPTIONAL, 2, nh, dh, 0, "layers.%d.dec_attn.r_w_bias", l) ||
              want(L, &y->r_r_bias, W_OPTIONAL, 2, nh, dh, 0, "layers.%d.dec_attn.r_r_bias", l) ||
              want(L, &f->fc1_w, W_LOAD, 2, I, D, 0, "layers.%d.pos_ff.CoreNet.0.weight", l) ||
              want(L, &f->fc1_b, W_LOAD, 1, I, 0, 0, "layers.%d.pos_ff.CoreNet.0.bias", l) ||
              want(L, &f->fc2_w, W_LOAD, 2, D, I, 0, "layers.%d.pos_ff.CoreNet.3.weight", l) ||
              want(L, &f->fc2_b, W_LOAD, 1, D, 0, 0, "layers.%d.pos_ff.CoreNet.3.bias", l) ||
              want(L, &f->ln2_w, W_LOAD, 1, D, 0, 0, "layers.%d.pos_ff.layer_norm.weight", l) ||
              want(L, &f->ln2_b, W_LOAD, 1, D, 0, 0, "layers.%d.pos_ff.layer_norm.bias", l);
    }
    return bad;
}

static int txl_derive(model_t *m, const wantlist *L, char *err)
{
    (void)L;
    adaptive *a = m->ada;
    txl_load *t = load_of(m);
    /* the r biases: shared (untie_r false) or every layer's own (untie_r true, as Hugging Face's wt103) */
    if (!m->r_w_bias != !m->r_r_bias) return err_set(err, "%s: r_w_bias and r_r_bias must come together", m->path);
    for (int b = 0; b < m->n_layers; b += 2) {
        const layer_t *y = &m->layers[b];
        const int own = y->r_w_bias && y->r_r_bias;
        if (!y->r_w_bias != !y->r_r_bias || own == !!m->r_w_bias)
            return err_set(err, "%s: layer %d: the r biases must be either shared (r_w_bias, r_r_bias) or each "
                           "layer's own (layers.%d.dec_attn.r_w_bias, .r_r_bias), not both or neither",
                           m->path, b / 2, b / 2);
    }
    if (t->div_val == 1) {
        const int E = t->d_embed;
        const float *w = m->tie_weight ? t->emb_table : t->out_w0;
        for (int i = 0; i < a->n; i++) {
            a->emb[i] = t->emb_table + (size_t)a->cut[i] * E;
            a->emb_proj[i] = t->emb_proj0;
            a->out_w[i] = w + (size_t)a->cut[i] * E;
            a->out_b[i] = t->out_b0 + a->cut[i];
            if (E != m->d_model && t->tie_projs[i]) a->out_proj[i] = t->emb_proj0;
        }
    } else {
        for (int i = 0; i < a->n; i++) {
            if (m->tie_weight) a->out_w[i] = a->emb[i];
            if (t->tie_projs[i]) a->out_proj[i] = a->emb_proj[i];
        }
    }
    if (adaptive_prepare(a, m->d_model, err)) return -1;
    return par_derive_tables(m, err);
}

/* The reference keeps every layer's input, n_layer + 1 of them (the last is
 * never read), of mem_len rows; this project keeps each layer's keys and
 * values instead (computed once, not at every step). */
static size_t txl_mem_reference(const model_t *m)
{
    return (size_t)(m->n_layers / 2 + 1) * m->mem_len * m->d_model * sizeof(float);
}

/* The evaluation settings: a server may serve with a longer memory than the
 * checkpoint evaluated with (WikiText-103 models are often scored at
 * mem_len 1600, clamp_len 1000). */
static const char *const txl_settings[] = {"eval_tgt_len", "eval_mem_len", "eval_clamp_len", "eval_same_length", NULL};

const family_ops family_txl = {
    .name = "transformer-xl",
    .settings = txl_settings,
    .claims = txl_claims,
    .config = txl_config,
    .tensors = txl_tensors,
    .derive = txl_derive,
    .free_derived = par_free_derived,
    .forward = par_forward,
    .mem_slots = par_mem_slots,
    .slot_krows = par_slot_rows,
    .slot_vrows = par_slot_rows,
    .slot_width = par_slot_width,
    .held_rows = par_held_rows,
    .mem_reference = txl_mem_reference,
    .mem_full = txl_mem_reference,
    .full_name = "reference, every layer's input",
    .mem_kind = par_mem_kind,
    .report = par_report,
    .cost = par_cost,
};
