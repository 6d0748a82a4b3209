/*
 * train_params.c - the trainer's parameters: the table of tensors under the
 * names model_load() reads (../shared/fixtures/README.md), one arena each
 * for the weights, their gradients and the optimizer's moments, the
 * reference initialisation, and the checkpoint writer.
 *
 * What differs between the families (their sizes, tensors, starting
 * values, derived buffers and config keys) comes from the config's
 * train_family.
 */
#define _POSIX_C_SOURCE 200809L
#include "err.h"
#include "st.h"
#include "train.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t train_param_add(trainer *t, tparam_kind kind, int layer, int branch, int ndim, int64_t a, int64_t b, int64_t c,
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
    /* the next tensor starts 16 bytes aligned: a product's operand at a
     * weight's offset gets cuBLAS's aligned kernels (a row of 65 biases
     * before the layers made every weight's product take the unaligned
     * ones) */
    t->n += (p->n + TRAIN_ALIGN - 1) / TRAIN_ALIGN * TRAIN_ALIGN;
    return p->off;
}

size_t trainer_n_params(const trainer *t)
{
    size_t n = 0;
    for (int i = 0; i < t->n_tp; i++) n += t->tp[i].n;
    return n;
}

size_t trainer_mem_floats(const trainer *t) { return (size_t)t->L * t->B * t->c.fam->mem_rows(&t->c) * t->H; }

trainer *trainer_new(const train_cfg *c, int V, char *err)
{
    trainer *t = calloc(1, sizeof *t);
    if (!t) { err_set(err, "out of memory"); return NULL; }
    t->c = *c;
    t->V = V;
    t->B = c->batch_size;
    t->drop = 1;
    c->fam->setup(t);
    t->tp = calloc((size_t)14 * t->L + 8, sizeof *t->tp);
    t->ly = calloc((size_t)t->L, sizeof *t->ly);
    t->mlen = calloc((size_t)t->L, sizeof *t->mlen);
    t->arch = calloc((size_t)t->L, sizeof *t->arch);
    t->mix = calloc((size_t)t->L * 3, sizeof *t->mix);
    t->gumbel = calloc((size_t)t->L * 3, sizeof *t->gumbel);
    if (!t->tp || !t->ly || !t->mlen || !t->arch || !t->mix || !t->gumbel) goto oom;
    c->fam->params(t);
    t->w = calloc(t->n, sizeof *t->w);
    t->g = calloc(t->n, sizeof *t->g);
    t->m1 = calloc(t->n, sizeof *t->m1);
    t->m2 = calloc(t->n, sizeof *t->m2);
    size_t nmem = trainer_mem_floats(t);
    t->mem = calloc(nmem ? nmem : 1, sizeof *t->mem);
    if (!t->w || !t->g || !t->m1 || !t->m2 || !t->mem) goto oom;
    if (c->fam->acts_alloc(t)) goto oom;
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

/* LayerNorms start as the identity (weight 1, bias 0) in both references;
 * every other tensor as its family's reference module starts it. */
void trainer_init(trainer *t, uint64_t seed)
{
    train_rng r = {seed ^ 0x5EED5EED5EEDULL};
    for (int i = 0; i < t->n_tp; i++) {
        const tparam *p = &t->tp[i];
        double *w = t->w + p->off;
        size_t len = strlen(p->name);
        int is_bias = len > 5 && strcmp(p->name + len - 5, ".bias") == 0;
        if (strstr(p->name, "norm"))
            for (size_t j = 0; j < p->n; j++) w[j] = is_bias ? 0.0 : 1.0;
        else
            t->c.fam->init(t, p, w, &r);
    }
}

void trainer_reset_memory(trainer *t)
{
    memset(t->mem, 0, trainer_mem_floats(t) * sizeof *t->mem);
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
    double a = 0, nll = t->c.fam->forward(t, x, y, backward, carry, &a);
    if (aux) *aux = a;
    if (!isfinite(nll)) err_set(err, "the loss is not finite (%g): the learning rate may be too high", nll);
    return nll;
}

/* The model's config as the checkpoint records it (__metadata__.config):
 * the family's keys around the shared ones, and what wrote it. */
static char *model_config_json(const trainer *t)
{
    const train_cfg *c = &t->c;
    json_t *o = json_object();
    c->fam->config_head(t, o);
    json_object_set_new(o, "optim", json_string(c->optim == OPT_ADAM ? "adam" : "adagrad"));
    json_object_set_new(o, "family", json_string(c->fam->name));
    json_object_set_new(o, "vocab_size", json_integer(t->V));
    if (c->fam->config_tail) c->fam->config_tail(t, o);
    json_object_set_new(o, "trainer",
                        json_sprintf("spanserve train (%s%s)", c->device, c->tf32 ? ", tf32" : c->bf16 ? ", bf16" : ""));
    char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    return s;
}

int trainer_save_checkpoint(const trainer *t, const char *path, const char *vocab_json, const char *history,
                            char *err)
{
    float *f = malloc((t->n ? t->n : 1) * sizeof *f);
    st_writer *w = st_writer_new();
    char *cfg = NULL;
    void *keep = NULL;   /* the family's extra tensors' data */
    int rc = -1;
    if (!f || !w) { err_set(err, "out of memory"); goto out; }
    for (size_t i = 0; i < t->n; i++) f[i] = (float)t->w[i];
    for (int i = 0; i < t->n_tp; i++) {
        const tparam *p = &t->tp[i];
        if (st_writer_add(w, p->name, ST_F32, p->ndim, p->shape, f + p->off)) { err_set(err, "out of memory"); goto out; }
    }
    if (t->c.fam->extra_tensors && t->c.fam->extra_tensors(t, w, &keep)) { err_set(err, "out of memory"); goto out; }
    cfg = model_config_json(t);
    if (!cfg || st_writer_meta(w, "config", cfg) || st_writer_meta(w, "vocab", vocab_json) ||
        (history && st_writer_meta(w, "arch_history", history))) {
        err_set(err, "out of memory");
        goto out;
    }
    rc = st_writer_save(w, path, err);
out:
    st_writer_free(w);   /* before the data it refers to */
    free(keep);
    free(cfg);
    free(f);
    return rc;
}
