/*
 * model.c - loading a checkpoint of either family into one model type.
 *
 * The file's config decides the shape of every tensor; each tensor of the
 * file is then matched against that list: a missing one, an extra one, a
 * wrong dtype or shape is an error naming the tensor. F32, F16 and BF16
 * tensors are accepted and held as float32 in one arena. Quantities the
 * reference derives (the spans, the soft mask, Transformer-XL's projected
 * position embeddings) are computed here once.
 */
#define _POSIX_C_SOURCE 200809L
#include "model.h"
#include "err.h"
#include "forward.h"
#include "ops.h"
#include "st.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *model_family_name(model_family f) { return f == FAM_ASPAN ? "adaptive-span" : "par-transformer-xl"; }
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

static int cfg_int(const char *path, json_t *cfg, const char *key, long long lo, long long hi, int required,
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

/* ------------------------------------------------------------ tensor list */

enum { W_LOAD, W_OPTIONAL, W_IGNORE };  /* required; loaded if present; allowed but not loaded */

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[3];
    const float **dst;
    int need;
    st_dtype dtype;     /* as found in the file */
} want_t;

typedef struct {
    want_t *w;
    int n, cap;
} wantlist;

static int want(wantlist *L, const float **dst, int need, int ndim, int64_t a, int64_t b, int64_t c,
                const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

static int want(wantlist *L, const float **dst, int need, int ndim, int64_t a, int64_t b, int64_t c,
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
        int same = t->ndim == w->ndim;
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
                    st_at(f, i)->name, model_family_name(m->fam));
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

/* ------------------------------------------------------------ adaptive span */

static int aspan_config(model_t *m, json_t *cfg, char *err)
{
    const char *p = m->path;
    if (cfg_int(p, cfg, "hidden_size", 1, MODEL_MAX_DIM, 1, 0, &m->d_model, err) ||
        cfg_int(p, cfg, "inner_hidden_size", 1, MODEL_MAX_DIM * 8LL, 1, 0, &m->d_inner, err) ||
        cfg_int(p, cfg, "nb_heads", 1, MODEL_MAX_HEADS, 1, 0, &m->n_head, err) ||
        cfg_int(p, cfg, "nb_layers", 1, MODEL_MAX_LAYERS, 1, 0, &m->n_layers, err) ||
        cfg_int(p, cfg, "attn_span", 1, MODEL_MAX_SPAN, 1, 0, &m->span, err) ||
        cfg_int(p, cfg, "block_size", 1, MODEL_MAX_SPAN, 1, 0, &m->block_len, err) ||
        cfg_int(p, cfg, "adapt_span_ramp", 1, MODEL_MAX_SPAN, 1, 0, &m->ramp, err))
        return -1;
    if (m->d_model % m->n_head)
        return err_set(err, "%s: config hidden_size %d is not a multiple of nb_heads %d", p, m->d_model, m->n_head);
    m->d_head = m->d_model / m->n_head;
    return 0;
}

static int aspan_tensors(model_t *m, wantlist *L)
{
    int64_t V = m->V, H = m->d_model, I = m->d_inner, S = m->span, K = m->n_head;
    int bad = want(L, &m->emb, W_LOAD, 2, V, H, 0, "in_emb.weight") ||
              want(L, &m->key_pe, W_LOAD, 3, 1, H / K, S, "key_pe") ||
              want(L, &m->out_w, W_LOAD, 2, V, H, 0, "out_emb.weight") ||
              want(L, &m->out_b, W_LOAD, 1, V, 0, 0, "out_emb.bias");
    for (int l = 0; l < m->n_layers && !bad; l++) {
        layer_t *y = &m->layers[l];
        bad = want(L, &y->wq, W_LOAD, 2, H, H, 0, "layers.%d.attn.proj_query.weight", l) ||
              want(L, &y->wk, W_LOAD, 2, H, H, 0, "layers.%d.attn.proj_key.weight", l) ||
              want(L, &y->wv, W_LOAD, 2, H, H, 0, "layers.%d.attn.proj_val.weight", l) ||
              want(L, &y->wo, W_LOAD, 2, H, H, 0, "layers.%d.attn.proj_out.weight", l) ||
              want(L, (const float **)&y->zfrac, W_LOAD, 3, K, 1, 1,
                   "layers.%d.attn.attn.adaptive_span._mask.current_val", l) ||
              want(L, &y->mask_tpl, W_LOAD, 1, S, 0, 0, "layers.%d.attn.attn.adaptive_span._mask.mask_template", l) ||
              want(L, &y->ln1_w, W_LOAD, 1, H, 0, 0, "layers.%d.norm1.weight", l) ||
              want(L, &y->ln1_b, W_LOAD, 1, H, 0, 0, "layers.%d.norm1.bias", l) ||
              want(L, &y->ln2_w, W_LOAD, 1, H, 0, 0, "layers.%d.norm2.weight", l) ||
              want(L, &y->ln2_b, W_LOAD, 1, H, 0, 0, "layers.%d.norm2.bias", l) ||
              want(L, &y->fc1_w, W_LOAD, 2, I, H, 0, "layers.%d.ff.fc1.weight", l) ||
              want(L, &y->fc1_b, W_LOAD, 1, I, 0, 0, "layers.%d.ff.fc1.bias", l) ||
              want(L, &y->fc2_w, W_LOAD, 2, H, I, 0, "layers.%d.ff.fc2.weight", l) ||
              want(L, &y->fc2_b, W_LOAD, 1, H, 0, 0, "layers.%d.ff.fc2.bias", l);
    }
    return bad;
}

/* The reference's AdaptiveMask, evaluated once per head:
 *   m(d) = clamp((mask_template[S-d] + current_val * S) / R + 1, 0, 1),
 * with mask_template[S-d] = 1 - d, in float32 as PyTorch computes it. */
static float span_mask(float zfrac, int S, int R, int d)
{
    float z = zfrac * (float)S;
    float x = ((float)(1 - d) + z) / (float)R + 1.0f;
    return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x;
}

static int aspan_derive(model_t *m, const wantlist *L, char *err)
{
    for (int i = 0; i < L->n; i++)
        for (int l = 0; l < m->n_layers; l++)
            if (L->w[i].dst == &m->layers[l].mask_tpl)
                m->layers[l].mask_tpl_bits = L->w[i].dtype == ST_BF16 ? 8 : L->w[i].dtype == ST_F16 ? 11 : 24;
    int S = m->span, R = m->ramp, K = m->n_head;
    for (int l = 0; l < m->n_layers; l++) {
        layer_t *y = &m->layers[l];
        /* the mask template is derived, not learned: it must be linspace(1-S, 0, S) */
        /* to the rounding of the file's dtype: bf16 holds -511 as -510 */
        for (int j = 0; j < S; j++)
            if (fabsf(y->mask_tpl[j] - (float)(1 - S + j)) > ldexpf((float)(S - 1 - j), -y->mask_tpl_bits))
                return err_set(err, "%s: tensor 'layers.%d.attn.attn.adaptive_span._mask.mask_template' is not "
                               "linspace(1-S, 0, S): [%d] = %g", m->path, l, j, (double)y->mask_tpl[j]);
        float zmax = 0, zsum = 0;
        for (int h = 0; h < K; h++) {
            float z = y->zfrac[h];
            if (!(z >= 0.0f && z <= 1.0f))
                return err_set(err, "%s: layers.%d current_val[%d] = %g is outside [0, 1] (the reference clamps it)",
                               m->path, l, h, (double)z);
            zmax = z > zmax ? z : zmax;
            zsum += z;
        }
        /* get_current_max_size / get_current_avg_size / get_trim_len / get_cache_size */
        int cms = (int)ceil((double)zmax * S) + R;
        cms = cms < 0 ? 0 : cms > S ? S : cms;
        int cas = (int)ceil((double)(zsum / (float)K) * S) + R;
        cas = cas < 0 ? 0 : cas > S ? S : cas;
        int trim = (S - 1 < S - cms ? S - 1 : S - cms) / 64 * 64;
        y->max_span = cms;
        y->avg_span = cas;
        y->trim_len = trim;
        y->cache_size = S < S - trim + 64 ? S : S - trim + 64;
        int window = S - trim;   /* distances 1..window enter the reference's softmax */
        y->reach = calloc((size_t)K, sizeof *y->reach);
        y->krows = calloc((size_t)K, sizeof *y->krows);
        y->mask = calloc((size_t)K, sizeof *y->mask);
        if (!y->reach || !y->krows || !y->mask) return err_set(err, "out of memory");
        for (int h = 0; h < K; h++) {
            int r = 0;
            for (int d = 1; d <= window; d++)
                if (span_mask(y->zfrac[h], S, R, d) > 0.0f) r = d;
            y->reach[h] = r;
            y->krows[h] = m->mem_mode == MEM_EXACT && r > 0 ? window : r;
            y->mask[h] = malloc((size_t)(r ? r : 1) * sizeof(float));
            if (!y->mask[h]) return err_set(err, "out of memory");
            for (int d = 1; d <= r; d++) y->mask[h][d - 1] = span_mask(y->zfrac[h], S, R, d);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ PAR Transformer-XL */

static int par_config(model_t *m, json_t *cfg, char *err)
{
    const char *p = m->path;
    if (cfg_int(p, cfg, "n_blocks", 1, MODEL_MAX_LAYERS, 1, 0, &m->n_layers, err) ||
        cfg_int(p, cfg, "n_head", 1, MODEL_MAX_HEADS, 1, 0, &m->n_head, err) ||
        cfg_int(p, cfg, "d_model", 2, MODEL_MAX_DIM, 1, 0, &m->d_model, err) ||
        cfg_int(p, cfg, "d_head", 1, MODEL_MAX_DIM, 1, 0, &m->d_head, err) ||
        cfg_int(p, cfg, "d_inner", 1, MODEL_MAX_DIM * 8LL, 1, 0, &m->d_inner, err) ||
        cfg_int(p, cfg, "mem_len", 0, MODEL_MAX_SPAN, 1, 0, &m->mem_len, err) ||
        cfg_int(p, cfg, "tgt_len", 1, MODEL_MAX_SPAN, 1, 0, &m->block_len, err))
        return -1;
    if (m->d_model % 2) return err_set(err, "%s: config d_model %d must be even", p, m->d_model);
    if ((long long)m->n_head * m->d_head > MODEL_MAX_DIM)
        return err_set(err, "%s: config n_head * d_head = %lld is over %d", p, (long long)m->n_head * m->d_head,
                       MODEL_MAX_DIM);
    json_t *tw = json_object_get(cfg, "tie_weight");
    if (tw && !json_is_boolean(tw)) return err_set(err, "%s: config 'tie_weight' must be true or false", p);
    m->tie_weight = tw ? json_is_true(tw) : 1;
    json_t *arch = json_object_get(cfg, "arch");
    if (!json_is_array(arch) || json_array_size(arch) != (size_t)m->n_layers)
        return err_set(err, "%s: config 'arch' must be an array of n_blocks = %d kinds (attn, ffn, skip)", p,
                       m->n_layers);
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) return err_set(err, "out of memory");
    for (int b = 0; b < m->n_layers; b++) {
        const char *k = json_string_value(json_array_get(arch, (size_t)b));
        if (k && strcmp(k, "attn") == 0) m->layers[b].kind = BLK_ATTN;
        else if (k && strcmp(k, "ffn") == 0) m->layers[b].kind = BLK_FFN;
        else if (k && strcmp(k, "skip") == 0) m->layers[b].kind = BLK_SKIP;
        else return err_set(err, "%s: config arch[%d] must be \"attn\", \"ffn\" or \"skip\"", p, b);
    }
    return 0;
}

static int par_tensors(model_t *m, wantlist *L)
{
    int64_t V = m->V, D = m->d_model, I = m->d_inner, nh = m->n_head, dh = m->d_head, A = nh * dh;
    int bad = want(L, &m->emb, W_LOAD, 2, V, D, 0, "emb.weight") ||
              want(L, &m->out_b, W_LOAD, 1, V, 0, 0, "out.bias") ||
              want(L, &m->r_w_bias, W_LOAD, 2, nh, dh, 0, "r_w_bias") ||
              want(L, &m->r_r_bias, W_LOAD, 2, nh, dh, 0, "r_r_bias");
    if (!m->tie_weight && !bad) bad = want(L, &m->out_w, W_LOAD, 2, V, D, 0, "out.weight");
    for (int b = 0; b < m->n_layers && !bad; b++) {
        layer_t *y = &m->layers[b];
        int at = y->kind == BLK_ATTN ? W_LOAD : W_IGNORE, ff = y->kind == BLK_FFN ? W_LOAD : W_IGNORE;
        bad = want(L, &y->alpha, W_OPTIONAL, 1, 3, 0, 0, "blocks.%d.alpha", b) ||
              want(L, &y->qkv, at, 2, 3 * A, D, 0, "blocks.%d.attn.qkv_net.weight", b) ||
              want(L, &y->rnet, at, 2, A, D, 0, "blocks.%d.attn.r_net.weight", b) ||
              want(L, &y->onet, at, 2, D, A, 0, "blocks.%d.attn.o_net.weight", b) ||
              want(L, &y->ln1_w, at, 1, D, 0, 0, "blocks.%d.attn.layer_norm.weight", b) ||
              want(L, &y->ln1_b, at, 1, D, 0, 0, "blocks.%d.attn.layer_norm.bias", b) ||
              want(L, &y->fc1_w, ff, 2, I, D, 0, "blocks.%d.ff.CoreNet.0.weight", b) ||
              want(L, &y->fc1_b, ff, 1, I, 0, 0, "blocks.%d.ff.CoreNet.0.bias", b) ||
              want(L, &y->fc2_w, ff, 2, D, I, 0, "blocks.%d.ff.CoreNet.3.weight", b) ||
              want(L, &y->fc2_b, ff, 1, D, 0, 0, "blocks.%d.ff.CoreNet.3.bias", b) ||
              want(L, &y->ln2_w, ff, 1, D, 0, 0, "blocks.%d.ff.layer_norm.weight", b) ||
              want(L, &y->ln2_b, ff, 1, D, 0, 0, "blocks.%d.ff.layer_norm.bias", b);
    }
    return bad;
}

/* Transformer-XL's relative position embedding at distance t:
 *   [sin(t f_0) .. sin(t f_{D/2-1}), cos(t f_0) .. cos(t f_{D/2-1})],
 *   f_i = 1 / 10000^(2i/D). */
void par_sinusoid(float *row, int D, double t)
{
    for (int i = 0; i < D / 2; i++) {
        double f = 1.0 / pow(10000.0, (2.0 * i) / D);
        row[i] = (float)sin(t * f);
        row[D / 2 + i] = (float)cos(t * f);
    }
}

/* Rows of r_net(sinusoid) kept per attention block, and the bytes of all
 * blocks' tables together: a cache, so a shape that would make it large
 * (wide heads over a long memory) gets a shorter one instead of an
 * allocation the file's size never hinted at; steps longer than the table
 * compute r_net on the fly. */
#define RK_TABLE_MAX 8192
#define RK_TABLE_BYTES (256LL << 20)

static int par_derive(model_t *m, char *err)
{
    if (m->tie_weight) m->out_w = m->emb;
    int D = m->d_model, A = m->n_head * m->d_head, n_attn = 0;
    for (int b = 0; b < m->n_layers; b++) n_attn += m->layers[b].kind == BLK_ATTN;
    long long want_rows = (long long)m->mem_len + m->block_len;
    long long fit = n_attn ? RK_TABLE_BYTES / ((long long)n_attn * A * (long long)sizeof(float)) : RK_TABLE_MAX;
    if (fit < want_rows) want_rows = fit > 1 ? fit : 1;
    int T = (int)(want_rows < RK_TABLE_MAX ? want_rows : RK_TABLE_MAX);
    float *pos = malloc((size_t)T * D * sizeof *pos);
    if (!pos) return err_set(err, "out of memory");
    for (int t = 0; t < T; t++) par_sinusoid(pos + (size_t)t * D, D, t);
    for (int b = 0; b < m->n_layers; b++) {
        layer_t *y = &m->layers[b];
        if (y->kind != BLK_ATTN) continue;
        y->rk = malloc((size_t)T * A * sizeof *y->rk);
        if (!y->rk) { free(pos); return err_set(err, "out of memory"); }
        ops_linear(y->rk, pos, y->rnet, NULL, 1, T, D, A);
        y->rk_len = T;
    }
    free(pos);
    return 0;
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
    for (int l = 0; m->layers && l < m->n_layers; l++) {
        layer_t *y = &m->layers[l];
        for (int h = 0; y->mask && h < m->n_head; h++) free(y->mask[h]);
        free(y->mask);
        free(y->reach);
        free(y->krows);
        free(y->rk);
    }
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

model_t *model_load_named(const char *path, const char *name, mem_mode mode, char *err)
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
    const char *cj = st_meta(f, "config"), *vj = st_meta(f, "vocab");
    if (!cj) { err_set(err, "%s: no __metadata__.config: not a spanserve checkpoint", name); goto fail; }
    if (!vj) { err_set(err, "%s: no __metadata__.vocab: the checkpoint does not say its vocabulary", name); goto fail; }
    json_error_t je;
    cfg = json_loads(cj, 0, &je);
    if (!json_is_object(cfg)) { err_set(err, "%s: __metadata__.config is not a JSON object", name); goto fail; }
    if (vocab_parse(&m->vocab, vj, e2)) { err_set(err, "%s: %s", name, e2); goto fail; }
    m->config_json = strdup(cj);
    m->vocab_json = strdup(vj);
    if (!m->config_json || !m->vocab_json) { err_set(err, "out of memory"); goto fail; }
    m->V = m->vocab.n;
    int vs = 0;
    if (cfg_int(name, cfg, "vocab_size", 1, MODEL_MAX_VOCAB, 0, m->V, &vs, err)) goto fail;
    if (vs != m->V) {
        err_set(err, "%s: config vocab_size %d but the vocabulary lists %d characters", name, vs, m->V);
        goto fail;
    }
    const char *fam = json_string_value(json_object_get(cfg, "family"));
    if (!fam) { err_set(err, "%s: config has no 'family'", name); goto fail; }
    if (strcmp(fam, "adaptive-span") == 0) {
        m->fam = FAM_ASPAN;
        if (aspan_config(m, cfg, err)) goto fail;
        if (!(m->layers = calloc((size_t)m->n_layers, sizeof *m->layers))) { err_set(err, "out of memory"); goto fail; }
        if (aspan_tensors(m, &L)) { err_set(err, "out of memory"); goto fail; }
    } else if (strcmp(fam, "par-transformer-xl") == 0 || strcmp(fam, "transformer-xl") == 0) {
        m->fam = FAM_PAR;
        if (par_config(m, cfg, err)) goto fail;
        if (par_tensors(m, &L)) { err_set(err, "out of memory"); goto fail; }
    } else {
        err_set(err, "%s: unknown family '%.64s' (expected adaptive-span or par-transformer-xl)", name, fam);
        goto fail;
    }
    if (bind_tensors(m, f, &L, err)) goto fail;
    if (m->fam == FAM_ASPAN ? aspan_derive(m, &L, err) : par_derive(m, err)) goto fail;
    if (m->fam == FAM_ASPAN) m->n_params -= (int64_t)m->n_layers * m->span;   /* mask templates are buffers */
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
