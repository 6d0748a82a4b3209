/*
 * model.c - loading a checkpoint of any family into one model type.
 *
 * The file's config names its family (family.h: one table lists them) and
 * its vocabulary kind (vocab.h); the family's config decides the shape of
 * every tensor; each tensor of the file is then matched against that list:
 * a missing one, an extra one, a wrong dtype or shape is an error naming the
 * tensor. F32, F16 and BF16 tensors are accepted and held as float32 in one
 * arena. Quantities the reference derives (the spans, the soft mask,
 * Transformer-XL's projected position embeddings) are computed once, by the
 * family.
 */
#define _POSIX_C_SOURCE 200809L
#include "model.h"
#include "err.h"
#include "family.h"
#include "forward.h"
#include "st.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The families, in the order a config is offered to them. */
static const family_ops *const families[] = {&family_aspan, &family_par, &family_txl, &family_par_tf,
                                             &family_gpt_aspan, &family_nanogpt, NULL};

const char *model_family_name(const model_t *m) { return m->family->name; }

int model_score_block(const model_t *m)
{
    const int L = m->block_len;
    if (!m->family->cut_free || L >= MODEL_SCORE_BLOCK_TOKENS) return L;
    int k = MODEL_SCORE_BLOCK_TOKENS / L;
    if (k > MODEL_SCORE_BLOCK_MULT) k = MODEL_SCORE_BLOCK_MULT;
    /* a scoring block of one stream costs at most MODEL_SCORE_BLOCK_GFLOP (report.c's count) */
    double tok = 2.0 * m->V * m->d_model, step = 0;
    m->family->cost(m, &tok, &step);
    while (k > 1 && tok * k * L + step > MODEL_SCORE_BLOCK_GFLOP * 1e9) k--;
    return k * L;
}

int model_alpha_softmax(const layer_t *y, double p[3])
{
    if (!y->alpha) return -1;
    double mx = fmax(y->alpha[0], fmax(y->alpha[1], y->alpha[2])), z = 0;
    for (int i = 0; i < 3; i++) z += p[i] = exp(y->alpha[i] - mx);
    for (int i = 0; i < 3; i++) p[i] /= z;
    return 0;
}

const char *blk_kind_name(blk_kind k) { return k == BLK_ATTN ? "attn" : k == BLK_FFN ? "ffn" : "skip"; }

/* ------------------------------------------------------------ config */

int cfg_int(const char *path, json_t *cfg, const char *key, long long lo, long long hi, int required,
                   long long dflt, int *out, char *err)
{
    json_t *v = json_object_get(cfg, key);
    if (!v) {
        if (required) return err_set(err, "%s: config has no '%s'", path, key);
        *out = (int)dflt;
        return 0;
    }
    if (!json_is_integer(v))
        return err_set(err, "%s: config '%s' must be an integer", path, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return err_set(err, "%s: config '%s' = %lld is outside [%lld, %lld]", path, key, x, lo, hi);
    *out = (int)x;
    return 0;
}

int cfg_bool(const char *path, json_t *cfg, const char *key, int dflt, int *out, char *err)
{
    json_t *v = json_object_get(cfg, key);
    if (v && !json_is_boolean(v)) return err_set(err, "%s: config '%s' must be true or false", path, key);
    *out = v ? json_is_true(v) : dflt;
    return 0;
}

/* ------------------------------------------------------------ tensor list */

int want(wantlist *L, const float **dst, int need, int ndim, int64_t a, int64_t b, int64_t c,
                const char *fmt, ...)
{
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 64;
        want_t *w = realloc(L->w, (size_t)cap * sizeof *w);
        if (!w) return -1;
        L->w = w;
        L->cap = cap;
    }
    want_t *w = &L->w[L->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->name, sizeof w->name, fmt, ap);
    va_end(ap);
    w->ndim = ndim;
    w->shape[0] = a;
    w->shape[1] = b;
    w->shape[2] = c;
    w->dst = dst;
    w->need = need;
    return 0;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *s)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

static float half_to_float(uint16_t h, int bf16)
{
    uint32_t bits;
    if (bf16) {
        bits = (uint32_t)h << 16;
    } else {
        uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1F, f = h & 0x3FF;
        if (e == 0) {
            if (f == 0) bits = s;
            else {   /* subnormal half: normalise */
                e = 127 - 15 + 1;
                while (!(f & 0x400)) { f <<= 1; e--; }
                bits = s | (e << 23) | ((f & 0x3FF) << 13);
            }
        } else if (e == 31) bits = s | 0x7F800000u | (f << 13);
        else bits = s | ((e + 127 - 15) << 23) | (f << 13);
    }
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

/* Matches the file's tensors against the list and copies them to the arena. */
static int bind_tensors(model_t *m, st_file *f, wantlist *L, char *err)
{
    const char *path = m->path;
    char got[96], exp[96];
    int64_t total = 0;
    int *used = calloc((size_t)st_count(f) + 1, sizeof *used);
    const st_tensor **found = calloc((size_t)L->n + 1, sizeof *found);
    int rc = -1;
    if (!used || !found) { err_set(err, "%s: out of memory", path); goto out; }
    for (int i = 0; i < L->n; i++) {
        want_t *w = &L->w[i];
        const st_tensor *t = st_find(f, w->name);
        shape_str(exp, sizeof exp, w->ndim, w->shape);
        if (!t) {
            if (w->need == W_LOAD) {
                err_set(err, "%s: missing tensor '%s' (expected shape %s)", path, w->name, exp);
                goto out;
            }
            continue;
        }
        used[t - st_at(f, 0)] = 1;
        if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16) {
            err_set(err, "%s: tensor '%s' has dtype %s, expected F32 (or F16/BF16)", path, w->name,
                    st_dtype_name(t->dtype));
            goto out;
        }
        int same = w->ndim < 0 || t->ndim == w->ndim;   /* ndim -1: any shape (an ignored buffer) */
        for (int d = 0; same && d < w->ndim; d++) same = t->shape[d] == w->shape[d];
        if (!same) {
            shape_str(got, sizeof got, t->ndim, t->shape);
            err_set(err, "%s: tensor '%s' has shape %s, expected %s from the config", path, w->name, got, exp);
            goto out;
        }
        if (w->need != W_IGNORE) {
            found[i] = t;
            total += st_numel(t);
        }
    }
    for (int i = 0; i < st_count(f); i++)
        if (!used[i]) {
            err_set(err, "%s: unexpected tensor '%s': not part of a %s model with this config", path,
                    st_at(f, i)->name, m->family->name);
            goto out;
        }
    m->arena = malloc((size_t)(total ? total : 1) * sizeof(float));
    if (!m->arena) { err_set(err, "%s: out of memory for %lld parameters", path, (long long)total); goto out; }
    m->n_params = total;
    float *at = m->arena;
    for (int i = 0; i < L->n; i++) {
        const st_tensor *t = found[i];
        if (!t) continue;
        int64_t n = st_numel(t);
        if (t->dtype == ST_F32) memcpy(at, t->data, (size_t)n * 4);   /* the mapping may be unaligned */
        else
            for (int64_t j = 0; j < n; j++) {
                uint16_t h;
                memcpy(&h, (const char *)t->data + 2 * j, 2);
                at[j] = half_to_float(h, t->dtype == ST_BF16);
            }
        for (int64_t j = 0; j < n; j++)
            if (!isfinite(at[j])) {
                err_set(err, "%s: tensor '%s' holds a non-finite value at index %lld", path, t->name, (long long)j);
                goto out;
            }
        *L->w[i].dst = at;
        L->w[i].dtype = t->dtype;
        at += n;
    }
    rc = 0;
out:
    free(used);
    free(found);
    return rc;
}

/* ------------------------------------------------------------ load */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ULL;
    return h;
}

void model_free(model_t *m)
{
    if (!m) return;
    if (m->family && m->family->free_derived) m->family->free_derived(m);
    free(m->layers);
    free(m->arena);
    vocab_free(&m->vocab);
    free(m->config_json);
    free(m->vocab_json);
    free(m->path);
    free(m);
}

model_t *model_load(const char *path, char *err) { return model_load_mode(path, MEM_EXACT, err); }

model_t *model_load_mode(const char *path, mem_mode mode, char *err) { return model_load_named(path, path, mode, err); }

/* The family the config names, or NULL with ERR. */
static const family_ops *family_of(const char *name, json_t *cfg, char *err)
{
    const char *fam = json_string_value(json_object_get(cfg, "family"));
    if (!fam) return err_set(err, "%s: config has no 'family'", name), NULL;
    for (int i = 0; families[i]; i++)
        if (families[i]->claims(fam, cfg)) return families[i];
    char known[256];
    size_t at = 0;
    for (int i = 0; families[i] && at < sizeof known; i++)
        at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", i ? ", " : "", families[i]->name);
    return err_set(err, "%s: unknown family '%.64s' (known: %s)", name, fam, known), NULL;
}

/* The vocabulary kind the config names ("tokenizer"; characters when absent). */
static const tokenizer *tokenizer_of(const char *name, json_t *cfg, char *err)
{
    json_t *t = json_object_get(cfg, "tokenizer");
    if (!t) return vocab_kind("chars");
    const tokenizer *k = json_is_string(t) ? vocab_kind(json_string_value(t)) : NULL;
    if (!k) {
        char known[256];
        size_t at = 0;
        for (int i = 0; vocab_kinds[i] && at < sizeof known; i++)
            at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", i ? ", " : "", vocab_kinds[i]->name);
        return err_set(err, "%s: config 'tokenizer' must be one of: %s", name, known), NULL;
    }
    return k;
}

/* SETTINGS (JSON object text) over CFG, each key one FAM lets a load set:
 * how many there were, or -1. */
static int apply_settings(const char *name, const family_ops *fam, json_t *cfg, const char *settings, char *err)
{
    json_error_t je;
    json_t *set = json_loads(settings, 0, &je), *v;
    if (!json_is_object(set)) {
        json_decref(set);
        return err_set(err, "%s: the settings must be a JSON object", name);
    }
    const char *key;
    char allowed[256] = "";
    size_t at = 0;
    for (int i = 0; fam->settings && fam->settings[i] && at < sizeof allowed; i++)
        at += (size_t)snprintf(allowed + at, sizeof allowed - at, "%s%s", i ? ", " : "", fam->settings[i]);
    json_object_foreach(set, key, v) {
        int ok = 0;
        for (int i = 0; fam->settings && fam->settings[i] && !ok; i++) ok = strcmp(key, fam->settings[i]) == 0;
        if (!ok) {
            err_set(err, "%s: '%.64s' is not a setting of a %s model (%s)", name, key, fam->name,
                    at ? allowed : "it has none");
            json_decref(set);
            return -1;
        }
        json_object_set(cfg, key, v);
    }
    int n = (int)json_object_size(set);
    json_decref(set);
    return n;
}

model_t *model_load_named(const char *path, const char *name, mem_mode mode, char *err)
{
    return model_load_set(path, name, mode, NULL, err);
}

model_t *model_load_set(const char *path, const char *name, mem_mode mode, const char *settings, char *err)
{
    char e2[ERR_LEN];
    wantlist L = {0};
    json_t *cfg = NULL;
    model_t *m = calloc(1, sizeof *m);
    st_file *f = st_open_named(path, name, err);
    if (!f || !m || !(m->path = strdup(name))) {
        if (f && !m) err_set(err, "out of memory");
        goto fail;
    }
    m->mem_mode = mode;
    m->ln_eps = 1e-5;   /* PyTorch's LayerNorm; a family may say otherwise */
    const char *cj = st_meta(f, "config"), *vj = st_meta(f, "vocab");
    if (!cj) { err_set(err, "%s: no __metadata__.config: not a spanserve checkpoint", name); goto fail; }
    if (!vj) { err_set(err, "%s: no __metadata__.vocab: the checkpoint does not say its vocabulary", name); goto fail; }
    json_error_t je;
    cfg = json_loads(cj, 0, &je);
    if (!json_is_object(cfg)) { err_set(err, "%s: __metadata__.config is not a JSON object", name); goto fail; }
    const family_ops *fam = family_of(name, cfg, err);
    const tokenizer *tk = fam ? tokenizer_of(name, cfg, err) : NULL;
    if (!tk) goto fail;
    if (vocab_parse_kind(&m->vocab, tk, vj, e2)) { err_set(err, "%s: %s", name, e2); goto fail; }
    /* with settings the config (and so the fingerprint a saved session names) is the one served */
    int n_set = settings ? apply_settings(name, fam, cfg, settings, err) : 0;
    if (n_set < 0) goto fail;
    m->config_json = n_set ? json_dumps(cfg, JSON_COMPACT | JSON_PRESERVE_ORDER) : strdup(cj);
    m->vocab_json = strdup(vj);
    if (!m->config_json || !m->vocab_json) { err_set(err, "out of memory"); goto fail; }
    m->V = m->vocab.n;
    if (m->V > MODEL_MAX_VOCAB) { err_set(err, "%s: a vocabulary of %d tokens is over %d", name, m->V, MODEL_MAX_VOCAB); goto fail; }
    int vs = 0;
    if (cfg_int(name, cfg, "vocab_size", 1, MODEL_MAX_VOCAB, 0, m->V, &vs, err)) goto fail;
    if (vs != m->V) {
        err_set(err, "%s: config vocab_size %d but the vocabulary lists %d tokens", name, vs, m->V);
        goto fail;
    }
    m->family = fam;
    if (fam->config(m, cfg, err)) goto fail;
    if (fam->tensors(m, &L)) { err_set(err, "out of memory"); goto fail; }
    if (bind_tensors(m, f, &L, err)) goto fail;
    if (fam->derive(m, &L, err)) goto fail;
    if (m->n_params > MODEL_MAX_PARAMS) { err_set(err, "%s: too many parameters", name); goto fail; }
    m->fingerprint = fnv1a(fnv1a(fnv1a(1469598103934665603ULL, m->config_json, strlen(m->config_json)),
                                 m->vocab_json, strlen(m->vocab_json)),
                           m->arena, (size_t)m->n_params * sizeof(float));
    free(L.w);
    json_decref(cfg);
    st_close(f);
    return m;
fail:
    free(L.w);
    json_decref(cfg);
    st_close(f);
    model_free(m);
    return NULL;
}
