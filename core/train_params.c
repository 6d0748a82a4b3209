/*
 * train_params.c - the trainer's parameters: the table of tensors under the
 * names model_load() reads (../shared/fixtures/README.md), one arena each
 * for the weights, their gradients and the optimizer's moments, the
 * reference initialisation, and the checkpoint writer.
 *
 * A PAR trainer holds the whole search supernet: every block has both
 * branches and its alpha, as the fixture checkpoint does; config.arch says
 * which branch the model uses.
 */
#define _POSIX_C_SOURCE 200809L
#include "err.h"
#include "st.h"
#include "train.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static size_t add(trainer *t, tparam_kind kind, int layer, int branch, int ndim, int64_t a, int64_t b, int64_t c,
                  const char *fmt, ...) __attribute__((format(printf, 9, 10)));

static size_t add(trainer *t, tparam_kind kind, int layer, int branch, int ndim, int64_t a, int64_t b, int64_t c,
                  const char *fmt, ...)
{
    tparam *p = &t->tp[t->n_tp++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = ndim;
    p->shape[0] = a;
    p->shape[1] = b;
    p->shape[2] = c;
    p->n = (size_t)a * (ndim > 1 ? (size_t)b : 1) * (ndim > 2 ? (size_t)c : 1);
    p->off = t->n;
    p->kind = kind;
    p->layer = layer;
    p->branch = branch;
    t->n += p->n;
    return p->off;
}

static void build_aspan(trainer *t)
{
    const int V = t->V, H = t->H, K = t->K, I = t->I, S = t->c.attn_span;
    t->emb = add(t, TP_WEIGHT, -1, -1, 2, V, H, 0, "in_emb.weight");
    t->key_pe = add(t, TP_WEIGHT, -1, -1, 3, 1, H / K, S, "key_pe");
    t->out_w = add(t, TP_WEIGHT, -1, -1, 2, V, H, 0, "out_emb.weight");
    t->out_b = add(t, TP_WEIGHT, -1, -1, 1, V, 0, 0, "out_emb.bias");
    for (int l = 0; l < t->L; l++) {
        tlayer *y = &t->ly[l];
        y->wq = add(t, TP_WEIGHT, l, -1, 2, H, H, 0, "layers.%d.attn.proj_query.weight", l);
        y->wk = add(t, TP_WEIGHT, l, -1, 2, H, H, 0, "layers.%d.attn.proj_key.weight", l);
        y->wv = add(t, TP_WEIGHT, l, -1, 2, H, H, 0, "layers.%d.attn.proj_val.weight", l);
        y->wo = add(t, TP_WEIGHT, l, -1, 2, H, H, 0, "layers.%d.attn.proj_out.weight", l);
        y->zfrac = add(t, TP_ZFRAC, l, -1, 3, K, 1, 1, "layers.%d.attn.attn.adaptive_span._mask.current_val", l);
        y->ln1_w = add(t, TP_WEIGHT, l, -1, 1, H, 0, 0, "layers.%d.norm1.weight", l);
        y->ln1_b = add(t, TP_WEIGHT, l, -1, 1, H, 0, 0, "layers.%d.norm1.bias", l);
        y->ln2_w = add(t, TP_WEIGHT, l, -1, 1, H, 0, 0, "layers.%d.norm2.weight", l);
        y->ln2_b = add(t, TP_WEIGHT, l, -1, 1, H, 0, 0, "layers.%d.norm2.bias", l);
        y->fc1_w = add(t, TP_WEIGHT, l, -1, 2, I, H, 0, "layers.%d.ff.fc1.weight", l);
        y->fc1_b = add(t, TP_WEIGHT, l, -1, 1, I, 0, 0, "layers.%d.ff.fc1.bias", l);
        y->fc2_w = add(t, TP_WEIGHT, l, -1, 2, H, I, 0, "layers.%d.ff.fc2.weight", l);
        y->fc2_b = add(t, TP_WEIGHT, l, -1, 1, H, 0, 0, "layers.%d.ff.fc2.bias", l);
    }
}

static void build_par(trainer *t)
{
    const int V = t->V, D = t->H, nh = t->K, dh = t->D, A = t->A, I = t->I;
    t->emb = add(t, TP_WEIGHT, -1, -1, 2, V, D, 0, "emb.weight");
    t->out_b = add(t, TP_WEIGHT, -1, -1, 1, V, 0, 0, "out.bias");
    t->out_w = t->c.tie_weight ? t->emb : add(t, TP_WEIGHT, -1, -1, 2, V, D, 0, "out.weight");
    t->r_w_bias = add(t, TP_WEIGHT, -1, -1, 2, nh, dh, 0, "r_w_bias");
    t->r_r_bias = add(t, TP_WEIGHT, -1, -1, 2, nh, dh, 0, "r_r_bias");
    for (int b = 0; b < t->L; b++) {
        tlayer *y = &t->ly[b];
        y->alpha = add(t, TP_ALPHA, b, -1, 1, 3, 0, 0, "blocks.%d.alpha", b);
        y->qkv = add(t, TP_WEIGHT, b, BLK_ATTN, 2, 3 * A, D, 0, "blocks.%d.attn.qkv_net.weight", b);
        y->rnet = add(t, TP_WEIGHT, b, BLK_ATTN, 2, A, D, 0, "blocks.%d.attn.r_net.weight", b);
        y->onet = add(t, TP_WEIGHT, b, BLK_ATTN, 2, D, A, 0, "blocks.%d.attn.o_net.weight", b);
        y->ln1_w = add(t, TP_WEIGHT, b, BLK_ATTN, 1, D, 0, 0, "blocks.%d.attn.layer_norm.weight", b);
        y->ln1_b = add(t, TP_WEIGHT, b, BLK_ATTN, 1, D, 0, 0, "blocks.%d.attn.layer_norm.bias", b);
        y->fc1_w = add(t, TP_WEIGHT, b, BLK_FFN, 2, I, D, 0, "blocks.%d.ff.CoreNet.0.weight", b);
        y->fc1_b = add(t, TP_WEIGHT, b, BLK_FFN, 1, I, 0, 0, "blocks.%d.ff.CoreNet.0.bias", b);
        y->fc2_w = add(t, TP_WEIGHT, b, BLK_FFN, 2, D, I, 0, "blocks.%d.ff.CoreNet.3.weight", b);
        y->fc2_b = add(t, TP_WEIGHT, b, BLK_FFN, 1, D, 0, 0, "blocks.%d.ff.CoreNet.3.bias", b);
        y->ln2_w = add(t, TP_WEIGHT, b, BLK_FFN, 1, D, 0, 0, "blocks.%d.ff.layer_norm.weight", b);
        y->ln2_b = add(t, TP_WEIGHT, b, BLK_FFN, 1, D, 0, 0, "blocks.%d.ff.layer_norm.bias", b);
    }
}

trainer *trainer_new(const train_cfg *c, int V, char *err)
{
    trainer *t = calloc(1, sizeof *t);
    if (!t) { err_set(err, "out of memory"); return NULL; }
    t->c = *c;
    t->V = V;
    t->B = c->batch_size;
    size_t nmem;
    if (c->fam == FAM_ASPAN) {
        t->L = c->nb_layers;
        t->H = c->hidden_size;
        t->K = c->nb_heads;
        t->D = t->H / t->K;
        t->I = c->inner_hidden_size;
        t->M = c->block_size;
        nmem = (size_t)t->L * t->B * c->attn_span * t->H;
    } else {
        t->L = c->n_blocks;
        t->H = c->d_model;
        t->K = c->n_head;
        t->D = c->d_head;
        t->A = t->K * t->D;
        t->I = c->d_inner;
        t->M = c->tgt_len;
        nmem = (size_t)t->L * t->B * c->mem_len * t->H;
        t->searching = c->search_steps > 0;
        t->tau = c->tau_start;
    }
    t->tp = calloc((size_t)14 * t->L + 8, sizeof *t->tp);
    t->ly = calloc((size_t)t->L, sizeof *t->ly);
    t->mlen = calloc((size_t)t->L, sizeof *t->mlen);
    t->arch = calloc((size_t)t->L, sizeof *t->arch);
    t->mix = calloc((size_t)t->L * 3, sizeof *t->mix);
    t->gumbel = calloc((size_t)t->L * 3, sizeof *t->gumbel);
    if (!t->tp || !t->ly || !t->mlen || !t->arch || !t->mix || !t->gumbel) goto oom;
    if (c->fam == FAM_ASPAN) build_aspan(t);
    else build_par(t);
    t->w = calloc(t->n, sizeof *t->w);
    t->g = calloc(t->n, sizeof *t->g);
    t->m1 = calloc(t->n, sizeof *t->m1);
    t->m2 = calloc(t->n, sizeof *t->m2);
    t->mem = calloc(nmem ? nmem : 1, sizeof *t->mem);
    if (!t->w || !t->g || !t->m1 || !t->m2 || !t->mem) goto oom;
    if (c->fam == FAM_ASPAN ? aspan_acts_alloc(t) : par_acts_alloc(t)) goto oom;
    if (c->fam == FAM_PAR) par_set_mix(t, NULL);
    return t;
oom:
    trainer_free(t);
    err_set(err, "out of memory for the trainer's arenas");
    return NULL;
}

int acts_add(trainer *t, int i, size_t n)
{
    if (!t->act && !(t->act = calloc(1, sizeof *t->act))) return -1;
    free(t->act->b[i]);
    t->act->b[i] = calloc(n ? n : 1, sizeof(double));
    return t->act->b[i] ? 0 : -1;
}

void acts_free(tacts *a)
{
    if (!a) return;
    for (int i = 0; i < TACT_MAX; i++) free(a->b[i]);
    free(a);
}

void trainer_free(trainer *t)
{
    if (!t) return;
    acts_free(t->act);
    free(t->tp);
    free(t->ly);
    free(t->mlen);
    free(t->arch);
    free(t->mix);
    free(t->gumbel);
    free(t->w);
    free(t->g);
    free(t->m1);
    free(t->m2);
    free(t->mem);
    free(t);
}

static double normal(train_rng *r)
{
    double u1 = train_rng_unif(r), u2 = train_rng_unif(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* aspan: PyTorch's defaults of the reference modules (Linear:
 * uniform(+-1/sqrt(fan_in)) weights and biases; Embedding and key_pe:
 * normal(0, 1); LayerNorm 1, 0; current_val: adapt_span_init).
 * par: weights and embedding normal(0, 0.02), biases 0, LayerNorm 1, 0,
 * r_w_bias and r_r_bias normal(0, 0.02), alpha 0. */
void trainer_init(trainer *t, uint64_t seed)
{
    train_rng r = {seed ^ 0x5EED5EED5EEDULL};
    const int aspan = t->c.fam == FAM_ASPAN;
    for (int i = 0; i < t->n_tp; i++) {
        const tparam *p = &t->tp[i];
        double *w = t->w + p->off;
        const char *nm = p->name;
        size_t len = strlen(nm);
        int is_ln = strstr(nm, "norm") != NULL;
        int is_bias = len > 5 && strcmp(nm + len - 5, ".bias") == 0;
        if (p->kind == TP_ZFRAC) {
            for (size_t j = 0; j < p->n; j++) w[j] = t->c.adapt_span_init;
        } else if (p->kind == TP_ALPHA) {
            for (size_t j = 0; j < p->n; j++) w[j] = 0;
        } else if (is_ln) {
            for (size_t j = 0; j < p->n; j++) w[j] = is_bias ? 0.0 : 1.0;
        } else if (aspan) {
            if (p->off == t->emb || p->off == t->key_pe) {
                for (size_t j = 0; j < p->n; j++) w[j] = normal(&r);
            } else {
                /* fan_in: the weight's second dimension, or its layer's */
                const tparam *wt = is_bias ? p - 1 : p;
                double bound = 1.0 / sqrt((double)wt->shape[1]);
                for (size_t j = 0; j < p->n; j++) w[j] = (2.0 * train_rng_unif(&r) - 1.0) * bound;
            }
        } else {
            for (size_t j = 0; j < p->n; j++) w[j] = is_bias && p->off != t->r_w_bias ? 0.0 : 0.02 * normal(&r);
        }
    }
}

void trainer_reset_memory(trainer *t)
{
    size_t n = t->c.fam == FAM_ASPAN ? (size_t)t->L * t->B * t->c.attn_span * t->H
                                     : (size_t)t->L * t->B * t->c.mem_len * t->H;
    memset(t->mem, 0, n * sizeof *t->mem);
    memset(t->mlen, 0, (size_t)t->L * sizeof *t->mlen);
}

double trainer_forward(trainer *t, const int32_t *x, const int32_t *y, int backward, int carry, double *aux,
                       char *err)
{
    for (int i = 0; i < t->B * t->M; i++)
        if (x[i] < 0 || x[i] >= t->V || y[i] < 0 || y[i] >= t->V) {
            err_set(err, "token id at %d is outside the vocabulary [0, %d)", i, t->V);
            return NAN;
        }
    double a = 0, nll;
    if (t->c.fam == FAM_ASPAN) nll = aspan_train_forward(t, x, y, backward, carry, &a);
    else nll = par_train_forward(t, x, y, backward, carry);
    if (aux) *aux = a;
    if (!isfinite(nll)) err_set(err, "the loss is not finite (%g): the learning rate may be too high", nll);
    return nll;
}

int trainer_save_checkpoint(const trainer *t, const char *path, const char *vocab_json, const char *history,
                            char *err)
{
    const int S = t->c.attn_span;
    float *f = malloc((t->n ? t->n : 1) * sizeof *f), *tpl = NULL;
    st_writer *w = st_writer_new();
    const char *arch[1024];   /* n_blocks <= 1024 (config) */
    char *cfg = NULL, (*names)[96] = NULL;
    int rc = -1;
    if (!f || !w) { err_set(err, "out of memory"); goto out; }
    for (size_t i = 0; i < t->n; i++) f[i] = (float)t->w[i];
    for (int i = 0; i < t->n_tp; i++) {
        const tparam *p = &t->tp[i];
        if (st_writer_add(w, p->name, ST_F32, p->ndim, p->shape, f + p->off)) { err_set(err, "out of memory"); goto out; }
    }
    if (t->c.fam == FAM_ASPAN) {
        /* the reference's derived buffer: linspace(1-S, 0, S) */
        if (!(tpl = malloc((size_t)S * sizeof *tpl))) { err_set(err, "out of memory"); goto out; }
        for (int j = 0; j < S; j++) tpl[j] = (float)(1 - S + j);
        if (!(names = malloc((size_t)t->L * sizeof *names))) { err_set(err, "out of memory"); goto out; }
        int64_t shape[1] = {S};
        for (int l = 0; l < t->L; l++) {
            snprintf(names[l], sizeof names[l], "layers.%d.attn.attn.adaptive_span._mask.mask_template", l);
            if (st_writer_add(w, names[l], ST_F32, 1, shape, tpl)) { err_set(err, "out of memory"); goto out; }
        }
    } else {
        /* the architecture the model uses: the fixed one, or argmax(alpha) during the search */
        for (int b = 0; b < t->L && b < 1024; b++) {
            arch[b] = blk_kind_name(t->searching ? par_argmax(t->w + t->ly[b].alpha) : t->arch[b]);
        }
    }
    cfg = train_model_config_json(&t->c, t->V, arch);
    if (!cfg || st_writer_meta(w, "config", cfg) || st_writer_meta(w, "vocab", vocab_json) ||
        (history && st_writer_meta(w, "arch_history", history))) {
        err_set(err, "out of memory");
        goto out;
    }
    rc = st_writer_save(w, path, err);
out:
    st_writer_free(w);   /* before the names and data it refers to */
    free(names);
    free(cfg);
    free(tpl);
    free(f);
    return rc;
}
