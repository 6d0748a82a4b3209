/*
 * randmodel.h - checkpoints of the families with random weights, written
 * with core's safetensors writer: the GPU test's random models and the
 * benchmark's models of the reference shapes (../shared/bench/README.md).
 * Weights are uniform, scaled like PyTorch's default initialisation so that
 * activations stay of order one; a seed makes them reproducible.
 */
#ifndef SPANSERVE_RANDMODEL_H
#define SPANSERVE_RANDMODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "st.h"

typedef struct { uint64_t s; } rm_rng;

static inline uint64_t rm_next(rm_rng *r)   /* splitmix64 */
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static inline float rm_uniform(rm_rng *r) { return (float)((double)(rm_next(r) >> 11) * 0x1.0p-52 - 1.0); }

typedef struct {
    st_writer *w;
    float *data[4096];
    char names[4096][96];
    int n;
    rm_rng rng;
} rm_file;

/* A tensor of the given shape: uniform * SCALE + SHIFT, or VALUES if given. */
static int rm_add(rm_file *f, const char *name, int ndim, int64_t a, int64_t b, int64_t c, float scale, float shift,
                  const float *values)
{
    if (f->n == 4096) return -1;
    int64_t shape[3] = {a, b, c}, n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *d = malloc((size_t)n * sizeof *d);
    if (!d) return -1;
    for (int64_t i = 0; i < n; i++) d[i] = values ? values[i] : rm_uniform(&f->rng) * scale + shift;
    f->data[f->n] = d;
    snprintf(f->names[f->n], sizeof f->names[f->n], "%s", name);
    st_writer_add(f->w, f->names[f->n], ST_F32, ndim, shape, d);
    f->n++;
    return 0;
}

/* The vocabulary: V distinct characters, U+0100 onwards. */
static char *rm_vocab(int V)
{
    char *s = malloc((size_t)V * 9 + 3), *p = s;
    if (!s) return NULL;
    *p++ = '[';
    for (int i = 0; i < V; i++) p += sprintf(p, "%s\"\\u%04x\"", i ? "," : "", 0x100 + i);
    *p++ = ']';
    *p = 0;
    return s;
}

static void rm_free(rm_file *f)
{
    for (int i = 0; i < f->n; i++) free(f->data[i]);
    st_writer_free(f->w);
    free(f);
}

/* A word vocabulary of V: <eos>, <unk>, w2, w3, ... */
static inline char *rm_words(int V)
{
    char *s = malloc((size_t)V * 12 + 32), *p = s;
    if (!s) return NULL;
    p += sprintf(p, "[\"<eos>\", \"<unk>\"");
    for (int i = 2; i < V; i++) p += sprintf(p, ",\"w%d\"", i);
    sprintf(p, "]");
    return s;
}

static int rm_save(rm_file *f, const char *path, const char *config, int V, char *err)
{
    char *vocab = strstr(config, "\"words\"") ? rm_words(V) : rm_vocab(V);
    int rc = vocab ? 0 : err_set(err, "out of memory");
    if (rc == 0) {
        st_writer_meta(f->w, "config", config);
        st_writer_meta(f->w, "vocab", vocab);
        rc = st_writer_save(f->w, path, err);
    }
    free(vocab);
    rm_free(f);
    return rc;
}

static rm_file *rm_open(uint64_t seed)
{
    rm_file *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->w = st_writer_new();
    f->rng.s = seed;
    return f;
}

/* Adaptive-span: ZFRAC holds L*K values of current_val (z / S). */
typedef struct {
    int V, H, K, I, L, S, block, R;
    const float *zfrac;
    int P;   /* persistent vectors a head (all-attention layers: no feed-forward); 0: none */
} rm_aspan;

/* added to every LayerNorm bias rm_write_aspan writes (0: none): rows of a
 * large mean against their spread */
static float rm_ln_shift;

static int rm_write_aspan(const char *path, const rm_aspan *c, uint64_t seed, char *err)
{
    rm_file *f = rm_open(seed);
    if (!f) return err_set(err, "out of memory");
    const int V = c->V, H = c->H, K = c->K, I = c->I, S = c->S, D = H / K;
    const float sh = 1.0f / sqrtf((float)H), si = 1.0f / sqrtf((float)I);
    float *tpl = malloc((size_t)S * sizeof *tpl);
    char name[96];
    int bad = !tpl;
    for (int j = 0; !bad && j < S; j++) tpl[j] = (float)(1 - S + j);   /* linspace(1-S, 0, S) */
    bad = bad || rm_add(f, "in_emb.weight", 2, V, H, 0, 1.0f, 0, NULL) ||
          rm_add(f, "key_pe", 3, 1, D, S, 1.0f / sqrtf((float)D), 0, NULL) ||
          rm_add(f, "out_emb.weight", 2, V, H, 0, sh, 0, NULL) || rm_add(f, "out_emb.bias", 1, V, 0, 0, 0.1f, 0, NULL);
    static const char *proj[4] = {"proj_query", "proj_key", "proj_val", "proj_out"};
    for (int l = 0; !bad && l < c->L; l++) {
        for (int k = 0; k < 4 && !bad; k++) {
            snprintf(name, sizeof name, "layers.%d.attn.%s.weight", l, proj[k]);
            bad = rm_add(f, name, 2, H, H, 0, sh, 0, NULL);
        }
        snprintf(name, sizeof name, "layers.%d.attn.attn.adaptive_span._mask.current_val", l);
        bad = bad || rm_add(f, name, 3, K, 1, 1, 0, 0, c->zfrac + (size_t)l * K);
        snprintf(name, sizeof name, "layers.%d.attn.attn.adaptive_span._mask.mask_template", l);
        bad = bad || rm_add(f, name, 1, S, 0, 0, 0, 0, tpl);
        if (c->P) {   /* persistent keys and values, no feed-forward and no norm2 */
            snprintf(name, sizeof name, "layers.%d.attn.attn.persistent_memory.key", l);
            bad = bad || rm_add(f, name, 3, K, D, c->P, 1.0f / sqrtf((float)D), 0, NULL);
            snprintf(name, sizeof name, "layers.%d.attn.attn.persistent_memory.val", l);
            bad = bad || rm_add(f, name, 3, K, c->P, D, 1.0f / sqrtf((float)c->P), 0, NULL);
            snprintf(name, sizeof name, "layers.%d.norm1.weight", l);
            bad = bad || rm_add(f, name, 1, H, 0, 0, 0.1f, 1.0f, NULL);
            snprintf(name, sizeof name, "layers.%d.norm1.bias", l);
            bad = bad || rm_add(f, name, 1, H, 0, 0, 0.1f, 0, NULL);
            continue;
        }
        for (int k = 1; k <= 2 && !bad; k++) {
            snprintf(name, sizeof name, "layers.%d.norm%d.weight", l, k);
            bad = rm_add(f, name, 1, H, 0, 0, 0.1f, 1.0f, NULL);
            snprintf(name, sizeof name, "layers.%d.norm%d.bias", l, k);
            bad = bad || rm_add(f, name, 1, H, 0, 0, 0.1f, rm_ln_shift, NULL);
        }
        snprintf(name, sizeof name, "layers.%d.ff.fc1.weight", l);
        bad = bad || rm_add(f, name, 2, I, H, 0, sh, 0, NULL);
        snprintf(name, sizeof name, "layers.%d.ff.fc1.bias", l);
        bad = bad || rm_add(f, name, 1, I, 0, 0, sh, 0, NULL);
        snprintf(name, sizeof name, "layers.%d.ff.fc2.weight", l);
        bad = bad || rm_add(f, name, 2, H, I, 0, si, 0, NULL);
        snprintf(name, sizeof name, "layers.%d.ff.fc2.bias", l);
        bad = bad || rm_add(f, name, 1, H, 0, 0, si, 0, NULL);
    }
    free(tpl);
    char config[512];
    snprintf(config, sizeof config,
             "{\"family\": \"adaptive-span\", \"hidden_size\": %d, \"inner_hidden_size\": %d, \"nb_heads\": %d, "
             "\"nb_layers\": %d, \"attn_span\": %d, \"block_size\": %d, \"adapt_span_ramp\": %d, \"vocab_size\": %d, "
             "\"pers_mem_size\": %d}",
             H, I, K, c->L, S, c->block, c->R, V, c->P);
    if (bad) {
        rm_free(f);
        return err_set(err, "out of memory");
    }
    return rm_save(f, path, config, V, err);
}

/* PAR Transformer-XL: ARCH is one letter a block: a(ttn), f(fn), s(kip). */
typedef struct {
    int V, D, nh, dh, I, mem_len, tgt_len, tie;
    const char *arch;
} rm_par;

static int rm_write_par(const char *path, const rm_par *c, uint64_t seed, char *err)
{
    rm_file *f = rm_open(seed);
    if (!f) return err_set(err, "out of memory");
    const int V = c->V, D = c->D, A = c->nh * c->dh, I = c->I, nb = (int)strlen(c->arch);
    const float sd = 1.0f / sqrtf((float)D), sa = 1.0f / sqrtf((float)A), si = 1.0f / sqrtf((float)I);
    char name[96];
    int bad = rm_add(f, "emb.weight", 2, V, D, 0, 1.0f / sqrtf((float)D), 0, NULL) ||
              rm_add(f, "out.bias", 1, V, 0, 0, 0.1f, 0, NULL) ||
              rm_add(f, "r_w_bias", 2, c->nh, c->dh, 0, 0.1f, 0, NULL) ||
              rm_add(f, "r_r_bias", 2, c->nh, c->dh, 0, 0.1f, 0, NULL);
    if (!c->tie) bad = bad || rm_add(f, "out.weight", 2, V, D, 0, sd, 0, NULL);
    for (int b = 0; !bad && b < nb; b++) {
        if (c->arch[b] == 'a') {
            snprintf(name, sizeof name, "blocks.%d.attn.qkv_net.weight", b);
            bad = rm_add(f, name, 2, 3 * A, D, 0, sd, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.attn.r_net.weight", b);
            bad = bad || rm_add(f, name, 2, A, D, 0, sd, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.attn.o_net.weight", b);
            bad = bad || rm_add(f, name, 2, D, A, 0, sa, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.attn.layer_norm.weight", b);
            bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 1.0f, NULL);
            snprintf(name, sizeof name, "blocks.%d.attn.layer_norm.bias", b);
            bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 0, NULL);
        } else if (c->arch[b] == 'f') {
            snprintf(name, sizeof name, "blocks.%d.ff.CoreNet.0.weight", b);
            bad = rm_add(f, name, 2, I, D, 0, sd, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.ff.CoreNet.0.bias", b);
            bad = bad || rm_add(f, name, 1, I, 0, 0, sd, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.ff.CoreNet.3.weight", b);
            bad = bad || rm_add(f, name, 2, D, I, 0, si, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.ff.CoreNet.3.bias", b);
            bad = bad || rm_add(f, name, 1, D, 0, 0, si, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.ff.layer_norm.weight", b);
            bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 1.0f, NULL);
            snprintf(name, sizeof name, "blocks.%d.ff.layer_norm.bias", b);
            bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 0, NULL);
        }
    }
    char config[8192];
    int at = snprintf(config, sizeof config,
                      "{\"family\": \"par-transformer-xl\", \"n_blocks\": %d, \"n_head\": %d, \"d_model\": %d, "
                      "\"d_head\": %d, \"d_inner\": %d, \"mem_len\": %d, \"tgt_len\": %d, \"tie_weight\": %s, "
                      "\"vocab_size\": %d, \"arch\": [",
                      nb, c->nh, D, c->dh, I, c->mem_len, c->tgt_len, c->tie ? "true" : "false", V);
    for (int b = 0; b < nb && at < (int)sizeof config - 16; b++)
        at += snprintf(config + at, sizeof config - at, "%s\"%s\"", b ? ", " : "",
                       c->arch[b] == 'a' ? "attn" : c->arch[b] == 'f' ? "ffn" : "skip");
    snprintf(config + at, sizeof config - at, "]}");
    if (bad) {
        rm_free(f);
        return err_set(err, "out of memory");
    }
    return rm_save(f, path, config, V, err);
}

/* Seed 004's TensorFlow PAR Transformer-XL (core/par_tf.c, family
 * "par-transformer-xl-tf") as clients/convert writes it: ARCH one letter a
 * block (a, f, s; each block's pi puts its kind first), heads of D / NH
 * dims, the attention's projections with biases, the position table's
 * MAX_POSITION rows; NCUT cutoffs with tail projections of PROJ[k] dims
 * (with biases), else one output layer. A character vocabulary ("tokenizer":
 * "chars": the family does not care which). */
typedef struct {
    int V, D, nh, I, mem_len, tgt_len, max_position, ncut, cut[3], proj[3];
    const char *arch;
} rm_par_tf;

static inline int rm_write_par_tf(const char *path, const rm_par_tf *c, uint64_t seed, char *err)
{
    rm_file *f = rm_open(seed);
    if (!f) return err_set(err, "out of memory");
    const int V = c->V, D = c->D, nh = c->nh, dh = D / nh, A = nh * dh, I = c->I, nb = (int)strlen(c->arch);
    const int n = c->ncut + 1;
    const float sd = 1.0f / sqrtf((float)D), sa = 1.0f / sqrtf((float)A), si = 1.0f / sqrtf((float)I);
    int cut[5] = {0};
    for (int k = 0; k < c->ncut; k++) cut[k + 1] = c->cut[k];
    cut[n] = V;
    char name[96];
    int bad = rm_add(f, "emb.weight", 2, V, D, 0, 1.0f / sqrtf((float)D), 0, NULL);
    if (!c->ncut)
        bad = bad || rm_add(f, "out.weight", 2, V, D, 0, sd, 0, NULL) || rm_add(f, "out.bias", 1, V, 0, 0, 0.1f, 0, NULL);
    else
        bad = bad || rm_add(f, "crit.out_layers.0.weight", 2, cut[1], D, 0, sd, 0, NULL) ||
              rm_add(f, "crit.out_layers.0.bias", 1, cut[1], 0, 0, 0.1f, 0, NULL) ||
              rm_add(f, "crit.cluster_weight", 2, n - 1, D, 0, sd, 0, NULL) ||
              rm_add(f, "crit.cluster_bias", 1, n - 1, 0, 0, 0.1f, 0, NULL);
    for (int k = 1; k < n && !bad; k++) {
        const int d = c->proj[k - 1];
        snprintf(name, sizeof name, "crit.out_projs.%d", k);
        bad = rm_add(f, name, 2, D, d, 0, sd, 0, NULL);
        snprintf(name, sizeof name, "crit.out_projs_bias.%d", k);
        bad = bad || rm_add(f, name, 1, d, 0, 0, 0.1f, 0, NULL);
        snprintf(name, sizeof name, "crit.out_layers.%d.weight", k);
        bad = bad || rm_add(f, name, 2, cut[k + 1] - cut[k], d, 0, 1.0f / sqrtf((float)d), 0, NULL);
        snprintf(name, sizeof name, "crit.out_layers.%d.bias", k);
        bad = bad || rm_add(f, name, 1, cut[k + 1] - cut[k], 0, 0, 0.1f, 0, NULL);
    }
    for (int b = 0; !bad && b < nb; b++) {
        const int kind = c->arch[b] == 'a' ? 0 : c->arch[b] == 'f' ? 1 : 2;
        float pi[3] = {0.2f, 0.2f, 0.2f};
        pi[kind] = 0.6f;
        snprintf(name, sizeof name, "blocks.%d.pi", b);
        bad = rm_add(f, name, 1, 3, 0, 0, 0, 0, pi);
        if (kind == 0) {
            static const char *const part[3] = {"qkv_net", "r_net", "o_net"};
            const int rows[3] = {3 * A, A, D}, cols[3] = {D, D, A};
            const float sc[3] = {sd, sd, sa};
            for (int k = 0; k < 3 && !bad; k++) {
                snprintf(name, sizeof name, "blocks.%d.attn.%s.weight", b, part[k]);
                bad = rm_add(f, name, 2, rows[k], cols[k], 0, sc[k], 0, NULL);
                snprintf(name, sizeof name, "blocks.%d.attn.%s.bias", b, part[k]);
                bad = bad || rm_add(f, name, 1, rows[k], 0, 0, 0.1f, 0, NULL);
            }
            snprintf(name, sizeof name, "blocks.%d.attn.r_w_bias", b);
            bad = bad || rm_add(f, name, 2, nh, dh, 0, 0.1f, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.attn.r_r_bias", b);
            bad = bad || rm_add(f, name, 2, nh, dh, 0, 0.1f, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.attn.layer_norm.weight", b);
            bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 1.0f, NULL);
            snprintf(name, sizeof name, "blocks.%d.attn.layer_norm.bias", b);
            bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 0, NULL);
        } else if (kind == 1) {
            snprintf(name, sizeof name, "blocks.%d.ff.CoreNet.0.weight", b);
            bad = rm_add(f, name, 2, I, D, 0, sd, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.ff.CoreNet.0.bias", b);
            bad = bad || rm_add(f, name, 1, I, 0, 0, sd, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.ff.CoreNet.3.weight", b);
            bad = bad || rm_add(f, name, 2, D, I, 0, si, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.ff.CoreNet.3.bias", b);
            bad = bad || rm_add(f, name, 1, D, 0, 0, si, 0, NULL);
            snprintf(name, sizeof name, "blocks.%d.ff.layer_norm.weight", b);
            bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 1.0f, NULL);
            snprintf(name, sizeof name, "blocks.%d.ff.layer_norm.bias", b);
            bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 0, NULL);
        }
    }
    char config[4096], cuts[64] = "", projs[64] = "";
    for (int k = 0, at = 0, bt = 0; k < c->ncut; k++) {
        at += snprintf(cuts + at, sizeof cuts - at, "%s%d", k ? ", " : "", c->cut[k]);
        bt += snprintf(projs + bt, sizeof projs - bt, "%s%d", k ? ", " : "", c->proj[k]);
    }
    int at = snprintf(config, sizeof config,
                      "{\"family\": \"par-transformer-xl-tf\", \"tokenizer\": \"chars\", \"vocab_size\": %d, "
                      "\"d_model\": %d, \"n_head\": %d, \"d_head\": %d, \"d_inner\": %d, \"n_blocks\": %d, "
                      "\"mem_len\": %d, \"tgt_len\": %d, \"max_position\": %d, \"cutoffs\": [%s], "
                      "\"proj_dims\": [%s], \"arch\": [",
                      V, D, nh, dh, I, nb, c->mem_len, c->tgt_len, c->max_position, cuts, projs);
    for (int b = 0; b < nb && at < (int)sizeof config - 16; b++)
        at += snprintf(config + at, sizeof config - at, "%s\"%s\"", b ? ", " : "",
                       c->arch[b] == 'a' ? "attn" : c->arch[b] == 'f' ? "ffn" : "skip");
    snprintf(config + at, sizeof config - at, "]}");
    if (bad) {
        rm_free(f);
        return err_set(err, "out of memory");
    }
    return rm_save(f, path, config, V, err);
}

/* Word-level Transformer-XL (kimiyoung's MemTransformerLM, core/txl.c):
 * NCUT cutoffs, adaptive input and softmax with DIV_VAL, tied weights, every
 * projection tied or not, pre-LN or post-LN, the r biases shared or each
 * layer's own; WORDS: a word vocabulary, else characters. */
typedef struct {
    int V, D, nh, dh, I, n_layer, d_embed, div_val, ncut, cut[4];
    int tie_weight, tie_projs, pre_lnorm, untie_r, tgt_len, mem_len, clamp_len, same_length, words;
} rm_txl;

static inline int rm_write_txl(const char *path, const rm_txl *c, uint64_t seed, char *err)
{
    rm_file *f = rm_open(seed);
    if (!f) return err_set(err, "out of memory");
    const int V = c->V, D = c->D, A = c->nh * c->dh, I = c->I, E = c->d_embed, n = c->ncut + 1;
    const float sd = 1.0f / sqrtf((float)D), sa = 1.0f / sqrtf((float)A), si = 1.0f / sqrtf((float)I);
    int cut[6] = {0}, dim[5];
    for (int k = 0; k < c->ncut; k++) cut[k + 1] = c->cut[k];
    cut[n] = V;
    for (int k = 0, d = E; k < n; k++, d = c->div_val > 1 ? d / c->div_val : d) dim[k] = d;
    char name[96];
    int bad = 0;
    if (c->div_val == 1) {
        bad = rm_add(f, "word_emb.emb_layers.0.weight", 2, V, E, 0, 1.0f / sqrtf((float)E), 0, NULL) ||
              rm_add(f, "crit.out_layers.0.bias", 1, V, 0, 0, 0.1f, 0, NULL);
        if (!c->tie_weight) bad = bad || rm_add(f, "crit.out_layers.0.weight", 2, V, E, 0, 1.0f / sqrtf((float)E), 0, NULL);
        if (E != D) {
            bad = bad || rm_add(f, "word_emb.emb_projs.0", 2, D, E, 0, 1.0f / sqrtf((float)E), 0, NULL);
            for (int k = 0; k < n && !c->tie_projs && !bad; k++) {
                snprintf(name, sizeof name, "crit.out_projs.%d", k);
                bad = rm_add(f, name, 2, D, E, 0, sd, 0, NULL);
            }
        }
    } else {
        for (int k = 0; k < n && !bad; k++) {
            const int rows = cut[k + 1] - cut[k];
            const float se = 1.0f / sqrtf((float)dim[k]);
            snprintf(name, sizeof name, "word_emb.emb_layers.%d.weight", k);
            bad = rm_add(f, name, 2, rows, dim[k], 0, se, 0, NULL);
            snprintf(name, sizeof name, "word_emb.emb_projs.%d", k);
            bad = bad || rm_add(f, name, 2, D, dim[k], 0, se, 0, NULL);
            snprintf(name, sizeof name, "crit.out_layers.%d.bias", k);
            bad = bad || rm_add(f, name, 1, rows, 0, 0, 0.1f, 0, NULL);
            if (!c->tie_weight) {
                snprintf(name, sizeof name, "crit.out_layers.%d.weight", k);
                bad = bad || rm_add(f, name, 2, rows, dim[k], 0, se, 0, NULL);
            }
            if (!c->tie_projs) {
                snprintf(name, sizeof name, "crit.out_projs.%d", k);
                bad = bad || rm_add(f, name, 2, D, dim[k], 0, sd, 0, NULL);
            }
        }
    }
    if (n > 1)
        bad = bad || rm_add(f, "crit.cluster_weight", 2, n - 1, dim[0], 0, 1.0f / sqrtf((float)dim[0]), 0, NULL) ||
              rm_add(f, "crit.cluster_bias", 1, n - 1, 0, 0, 0.1f, 0, NULL);
    if (!c->untie_r)
        bad = bad || rm_add(f, "r_w_bias", 2, c->nh, c->dh, 0, 0.1f, 0, NULL) ||
              rm_add(f, "r_r_bias", 2, c->nh, c->dh, 0, 0.1f, 0, NULL);
    for (int l = 0; !bad && l < c->n_layer; l++) {
        static const char *part[3] = {"qkv_net", "r_net", "o_net"};
        for (int k = 0; k < 3 && !bad; k++) {
            snprintf(name, sizeof name, "layers.%d.dec_attn.%s.weight", l, part[k]);
            bad = k == 2 ? rm_add(f, name, 2, D, A, 0, sa, 0, NULL) : rm_add(f, name, 2, k ? A : 3 * A, D, 0, sd, 0, NULL);
        }
        if (c->untie_r) {
            snprintf(name, sizeof name, "layers.%d.dec_attn.r_w_bias", l);
            bad = bad || rm_add(f, name, 2, c->nh, c->dh, 0, 0.1f, 0, NULL);
            snprintf(name, sizeof name, "layers.%d.dec_attn.r_r_bias", l);
            bad = bad || rm_add(f, name, 2, c->nh, c->dh, 0, 0.1f, 0, NULL);
        }
        snprintf(name, sizeof name, "layers.%d.dec_attn.layer_norm.weight", l);
        bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 1.0f, NULL);
        snprintf(name, sizeof name, "layers.%d.dec_attn.layer_norm.bias", l);
        bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 0, NULL);
        snprintf(name, sizeof name, "layers.%d.pos_ff.CoreNet.0.weight", l);
        bad = bad || rm_add(f, name, 2, I, D, 0, sd, 0, NULL);
        snprintf(name, sizeof name, "layers.%d.pos_ff.CoreNet.0.bias", l);
        bad = bad || rm_add(f, name, 1, I, 0, 0, sd, 0, NULL);
        snprintf(name, sizeof name, "layers.%d.pos_ff.CoreNet.3.weight", l);
        bad = bad || rm_add(f, name, 2, D, I, 0, si, 0, NULL);
        snprintf(name, sizeof name, "layers.%d.pos_ff.CoreNet.3.bias", l);
        bad = bad || rm_add(f, name, 1, D, 0, 0, si, 0, NULL);
        snprintf(name, sizeof name, "layers.%d.pos_ff.layer_norm.weight", l);
        bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 1.0f, NULL);
        snprintf(name, sizeof name, "layers.%d.pos_ff.layer_norm.bias", l);
        bad = bad || rm_add(f, name, 1, D, 0, 0, 0.1f, 0, NULL);
    }
    char config[2048], cuts[64] = "", ties[64] = "";
    for (int k = 0, at = 0; k < c->ncut; k++) at += snprintf(cuts + at, sizeof cuts - at, "%s%d", k ? ", " : "", c->cut[k]);
    for (int k = 0, at = 0; k < n; k++)
        at += snprintf(ties + at, sizeof ties - at, "%s%s", k ? ", " : "", c->tie_projs ? "true" : "false");
    snprintf(config, sizeof config,
             "{\"family\": \"transformer-xl\", \"tokenizer\": \"%s\", \"n_layer\": %d, \"n_head\": %d, "
             "\"d_model\": %d, \"d_head\": %d, \"d_inner\": %d, \"d_embed\": %d, \"div_val\": %d, "
             "\"cutoffs\": [%s], \"tie_weight\": %s, \"tie_projs\": [%s], \"pre_lnorm\": %s, \"tgt_len\": %d, "
             "\"mem_len\": %d, \"ext_len\": 0, \"attn_type\": 0, \"eval_tgt_len\": %d, \"eval_mem_len\": %d, "
             "\"eval_clamp_len\": %d, \"eval_same_length\": %s, \"vocab_size\": %d}",
             c->words ? "words" : "chars", c->n_layer, c->nh, D, c->dh, I, E, c->div_val, cuts,
             c->tie_weight ? "true" : "false", ties, c->pre_lnorm ? "true" : "false", c->tgt_len, c->mem_len,
             c->tgt_len, c->mem_len, c->clamp_len, c->same_length ? "true" : "false", V);
    if (bad) {
        rm_free(f);
        return err_set(err, "out of memory");
    }
    return rm_save(f, path, config, V, err);
}

/* GPT-style window models (core/gpt.c): "gpt-adaptive-span" (ASPAN: per-head
 * q, k, v without bias, a span mask on every head, ZFRAC L*K values of
 * current_val, MAX_SIZE >= C and RAMP; ReLU feed-forward; lm_head with bias)
 * or "nanogpt" (BIAS: config.bias; HEAD 0 tied to wte (no lm_head), 1 its
 * own, 2 saved beside wte with the same values). N need not be a multiple of
 * K for gpt-adaptive-span (heads of N / K dims). */
typedef struct {
    int V, N, K, L, C;
    int aspan;
    const float *zfrac;
    int max_size, ramp;
    int bias, head;
} rm_gpt;

static inline int rm_write_gpt(const char *path, const rm_gpt *c, uint64_t seed, char *err)
{
    rm_file *f = rm_open(seed);
    if (!f) return err_set(err, "out of memory");
    const int V = c->V, n = c->N, K = c->K, C = c->C, hs = n / K, E = K * hs, I = 4 * n;
    const float sn = 1.0f / sqrtf((float)n), se = 1.0f / sqrtf((float)E), si = 1.0f / sqrtf((float)I);
    char name[128];
    int bad = 0;
    if (c->aspan) {
        const int S = c->max_size;
        float *tpl = malloc((size_t)S * sizeof *tpl);
        bad = !tpl;
        for (int j = 0; !bad && j < S; j++) tpl[j] = (float)(1 - S + j);   /* linspace(1-S, 0, S) */
        bad = bad || rm_add(f, "token_embedding.weight", 2, V, n, 0, 1.0f, 0, NULL) ||
              rm_add(f, "position_embedding.weight", 2, C, n, 0, 0.5f, 0, NULL) ||
              rm_add(f, "ln_f.weight", 1, n, 0, 0, 0.1f, 1.0f, NULL) || rm_add(f, "ln_f.bias", 1, n, 0, 0, 0.1f, 0, NULL) ||
              rm_add(f, "lm_head.weight", 2, V, n, 0, sn, 0, NULL) || rm_add(f, "lm_head.bias", 1, V, 0, 0, 0.1f, 0, NULL);
        static const char *const qkv[3] = {"query", "key", "value"};
        for (int l = 0; !bad && l < c->L; l++) {
            for (int h = 0; h < K && !bad; h++) {
                for (int t = 0; t < 3 && !bad; t++) {
                    snprintf(name, sizeof name, "blocks.%d.sa.heads.%d.%s.weight", l, h, qkv[t]);
                    bad = rm_add(f, name, 2, hs, n, 0, sn, 0, NULL);
                }
                snprintf(name, sizeof name, "blocks.%d.sa.heads.%d.adaptive_span.current_val", l, h);
                bad = bad || rm_add(f, name, 3, 1, 1, 1, 0, 0, c->zfrac + (size_t)l * K + h);
                snprintf(name, sizeof name, "blocks.%d.sa.heads.%d.adaptive_span.mask_template", l, h);
                bad = bad || rm_add(f, name, 1, S, 0, 0, 0, 0, tpl);
            }
            static const char *const lin[3] = {"sa.proj", "ff.net.0", "ff.net.2"};
            const int rows[3] = {n, I, n}, cols[3] = {E, n, I};
            const float sc[3] = {se, sn, si};
            for (int k = 0; k < 3 && !bad; k++) {
                snprintf(name, sizeof name, "blocks.%d.%s.weight", l, lin[k]);
                bad = rm_add(f, name, 2, rows[k], cols[k], 0, sc[k], 0, NULL);
                snprintf(name, sizeof name, "blocks.%d.%s.bias", l, lin[k]);
                bad = bad || rm_add(f, name, 1, rows[k], 0, 0, sc[k], 0, NULL);
            }
            for (int k = 1; k <= 2 && !bad; k++) {
                snprintf(name, sizeof name, "blocks.%d.ln%d.weight", l, k);
                bad = rm_add(f, name, 1, n, 0, 0, 0.1f, 1.0f, NULL);
                snprintf(name, sizeof name, "blocks.%d.ln%d.bias", l, k);
                bad = bad || rm_add(f, name, 1, n, 0, 0, 0.1f, 0, NULL);
            }
        }
        free(tpl);
    } else {
        bad = rm_add(f, "transformer.wte.weight", 2, V, n, 0, 0.3f, 0, NULL) ||
              rm_add(f, "transformer.wpe.weight", 2, C, n, 0, 0.5f, 0, NULL) ||
              rm_add(f, "transformer.ln_f.weight", 1, n, 0, 0, 0.1f, 1.0f, NULL);
        const float *wte = bad ? NULL : f->data[0];
        if (c->bias) bad = bad || rm_add(f, "transformer.ln_f.bias", 1, n, 0, 0, 0.1f, 0, NULL);
        if (c->head == 1) bad = bad || rm_add(f, "lm_head.weight", 2, V, n, 0, sn, 0, NULL);
        if (c->head == 2) bad = bad || rm_add(f, "lm_head.weight", 2, V, n, 0, 0, 0, wte);
        static const char *const lin[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
        const int rows[4] = {3 * n, n, I, n}, cols[4] = {n, n, n, I};
        const float sc[4] = {sn, sn, sn, si};
        for (int l = 0; !bad && l < c->L; l++) {
            for (int k = 0; k < 4 && !bad; k++) {
                snprintf(name, sizeof name, "transformer.h.%d.%s.weight", l, lin[k]);
                bad = rm_add(f, name, 2, rows[k], cols[k], 0, sc[k], 0, NULL);
                snprintf(name, sizeof name, "transformer.h.%d.%s.bias", l, lin[k]);
                if (c->bias) bad = bad || rm_add(f, name, 1, rows[k], 0, 0, sc[k], 0, NULL);
            }
            for (int k = 1; k <= 2 && !bad; k++) {
                snprintf(name, sizeof name, "transformer.h.%d.ln_%d.weight", l, k);
                bad = rm_add(f, name, 1, n, 0, 0, 0.1f, 1.0f, NULL);
                snprintf(name, sizeof name, "transformer.h.%d.ln_%d.bias", l, k);
                if (c->bias) bad = bad || rm_add(f, name, 1, n, 0, 0, 0.1f, 0, NULL);
            }
        }
    }
    char config[512];
    if (c->aspan)
        snprintf(config, sizeof config,
                 "{\"family\": \"gpt-adaptive-span\", \"n_embd\": %d, \"n_head\": %d, \"n_layer\": %d, "
                 "\"block_size\": %d, \"max_size\": %d, \"ramp_size\": %d, \"dropout\": 0.0, \"vocab_size\": %d}",
                 n, K, c->L, C, c->max_size, c->ramp, V);
    else
        snprintf(config, sizeof config,
                 "{\"family\": \"nanogpt\", \"n_embd\": %d, \"n_head\": %d, \"n_layer\": %d, \"block_size\": %d, "
                 "\"bias\": %s, \"dropout\": 0.0, \"vocab_size\": %d}",
                 n, K, c->L, C, c->bias ? "true" : "false", V);
    if (bad) {
        rm_free(f);
        return err_set(err, "out of memory");
    }
    return rm_save(f, path, config, V, err);
}

#endif
