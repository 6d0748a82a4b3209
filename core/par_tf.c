/*
 * par_tf.c - seed 004's PAR Transformer-XL (Jmkernes/PAR-Transformer-XL,
 * TensorFlow 2), family "par-transformer-xl-tf", as clients/convert writes
 * it from the seed's checkpoint folder. ../shared/fixtures/README.md
 * ("par-tf") is the specification.
 *
 * A stack of stochastic blocks, each the one its pi puts first (inference
 * takes the argmax: Gumbel noise off, temperature to 0): attention, the
 * feed-forward, or the identity, over x = emb[t] * sqrt(D). The forward,
 * memory and reports are PAR's (par.c), with the seed's attention where it
 * differs from kimiyoung's (model_t.tf_attn):
 *   q, k, v = split(c Wqkv^T + bqkv)     (the converter put the seed's Q, V, K
 *                                          in this order), c = [memory; x]
 *   R[p] = P[p] Wpos^T + bpos, p = 0..max_position-1, P the seed's sinusoid
 *          (cos at even i, sin at odd, frequencies 1e-4^(2 floor(i/2) / D))
 *          reversed along i: the table layer_t.rk, made once here
 *   score(i, j) = ((q_i + u) . k_j + (q_i + v) . R[klen - 1 - (i - j)]) / d_head
 *   a = ReLU(softmax(score) v Wo^T + bo);  x = LN(x + a)   (LN: Keras', eps 1e-3)
 *   feed-forward: x = LN(x + W2 relu(W1 x + b1) + b2)
 *   output: the seed's AdaptiveSoftmax (adaptive.c, projections with biases;
 *   the converter reversed the head's cluster columns into kimiyoung's
 *   order), or one Dense layer when the model has no cutoffs.
 * Each block's memory is its own input's last mem_len rows (attention blocks
 * keep their keys and values). A forward of M tokens after mlen rows needs
 * mlen + M <= max_position, as the seed's table does.
 */
#include "adaptive.h"
#include "err.h"
#include "family.h"
#include "forward.h"
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int tf_claims(const char *fam, json_t *cfg)
{
    (void)cfg;
    return strcmp(fam, "par-transformer-xl-tf") == 0;
}

/* An array of N positive integers, each below LIMIT and above the one before when RISING, into OUT. */
static int int_array(const char *p, json_t *cfg, const char *key, size_t *n, int *out, size_t cap, long long lo,
                     long long limit, int rising, char *err)
{
    json_t *a = json_object_get(cfg, key);
    if (!a || json_is_null(a)) { *n = 0; return 0; }
    if (!json_is_array(a) || json_array_size(a) > cap)
        return err_set(err, "%s: config '%s' must be an array of at most %zu integers", p, key, cap);
    *n = json_array_size(a);
    for (size_t i = 0; i < *n; i++) {
        json_t *e = json_array_get(a, i);
        long long v = json_is_integer(e) ? json_integer_value(e) : -1;
        if (v < lo || v >= limit || (rising && i && v <= out[i - 1]))
            return err_set(err, "%s: config %s[%zu] must be an integer in [%lld, %lld)%s", p, key, i, lo, limit,
                           rising ? ", above the one before" : "");
        out[i] = (int)v;
    }
    return 0;
}

static int tf_config(model_t *m, json_t *cfg, char *err)
{
    const char *p = m->path;
    if (cfg_int(p, cfg, "n_blocks", 1, MODEL_MAX_LAYERS, 1, 0, &m->n_layers, err) ||
        cfg_int(p, cfg, "n_head", 1, MODEL_MAX_HEADS, 1, 0, &m->n_head, err) ||
        cfg_int(p, cfg, "d_model", 2, MODEL_MAX_DIM, 1, 0, &m->d_model, err) ||
        cfg_int(p, cfg, "d_head", 1, MODEL_MAX_DIM, 0, m->d_model / m->n_head, &m->d_head, err) ||
        cfg_int(p, cfg, "d_inner", 1, MODEL_MAX_DIM * 8LL, 1, 0, &m->d_inner, err) ||
        cfg_int(p, cfg, "mem_len", 0, MODEL_MAX_SPAN, 1, 0, &m->mem_len, err) ||
        cfg_int(p, cfg, "tgt_len", 1, MODEL_MAX_SPAN, 1, 0, &m->block_len, err) ||
        cfg_int(p, cfg, "max_position", 1, MODEL_MAX_SPAN, 1, 0, &m->max_position, err))
        return -1;
    if (m->d_model % m->n_head || m->d_head * m->n_head != m->d_model)
        return err_set(err, "%s: config d_model %d must be n_head %d x d_head %d (the seed splits d_model into the "
                       "heads)", p, m->d_model, m->n_head, m->d_head);
    if ((long long)m->block_len + m->mem_len > m->max_position)
        return err_set(err, "%s: config tgt_len %d + mem_len %d is over max_position %d: the seed's position table "
                       "has max_position rows", p, m->block_len, m->mem_len, m->max_position);
    m->tf_attn = 1;
    m->ln_eps = 1e-3;   /* tf.keras.layers.LayerNormalization's default */
    m->tie_weight = 0;
    int cut[ADA_MAX_CLUSTERS], dims[ADA_MAX_CLUSTERS];
    size_t nc = 0, nd = 0;
    if (int_array(p, cfg, "cutoffs", &nc, cut, ADA_MAX_CLUSTERS - 1, 1, m->V, 1, err) ||
        int_array(p, cfg, "proj_dims", &nd, dims, ADA_MAX_CLUSTERS - 1, 1, MODEL_MAX_DIM + 1LL, 0, err))
        return -1;
    if (nd != nc)
        return err_set(err, "%s: config proj_dims has %zu entries; the %zu tail clusters of cutoffs need as many", p,
                       nd, nc);
    if (nc) {
        adaptive *a = m->ada = calloc(1, sizeof *a);
        if (!a) return err_set(err, "out of memory");
        a->n = (int)nc + 1;
        a->cut[0] = 0;
        for (size_t i = 0; i < nc; i++) a->cut[i + 1] = cut[i];
        a->cut[a->n] = m->V;
        a->dim[0] = m->d_model;
        for (size_t i = 0; i < nc; i++) a->dim[i + 1] = dims[i];
    }
    return par_config_arch(m, cfg, ": each block's argmax of pi", err);
}

static int tf_tensors(model_t *m, wantlist *L)
{
    const int64_t V = m->V, D = m->d_model, I = m->d_inner, nh = m->n_head, dh = m->d_head, A = nh * dh;
    int bad = want(L, &m->emb, W_LOAD, 2, V, D, 0, "emb.weight");
    adaptive *a = m->ada;
    if (!a && !bad)
        bad = want(L, &m->out_w, W_LOAD, 2, V, D, 0, "out.weight") || want(L, &m->out_b, W_LOAD, 1, V, 0, 0, "out.bias");
    if (a && !bad)
        bad = want(L, &a->out_w[0], W_LOAD, 2, a->cut[1], D, 0, "crit.out_layers.0.weight") ||
              want(L, &a->out_b[0], W_LOAD, 1, a->cut[1], 0, 0, "crit.out_layers.0.bias") ||
              want(L, &a->cluster_w, W_LOAD, 2, a->n - 1, D, 0, "crit.cluster_weight") ||
              want(L, &a->cluster_b, W_LOAD, 1, a->n - 1, 0, 0, "crit.cluster_bias");
    for (int k = 1; a && k < a->n && !bad; k++) {
        const int64_t n = a->cut[k + 1] - a->cut[k], d = a->dim[k];
        bad = want(L, &a->out_proj[k], W_LOAD, 2, D, d, 0, "crit.out_projs.%d", k) ||
              want(L, &a->out_proj_b[k], W_LOAD, 1, d, 0, 0, "crit.out_projs_bias.%d", k) ||
              want(L, &a->out_w[k], W_LOAD, 2, n, d, 0, "crit.out_layers.%d.weight", k) ||
              want(L, &a->out_b[k], W_LOAD, 1, n, 0, 0, "crit.out_layers.%d.bias", k);
    }
    for (int b = 0; b < m->n_layers && !bad; b++) {
        layer_t *y = &m->layers[b];
        const int at = y->kind == BLK_ATTN ? W_LOAD : W_IGNORE, ff = y->kind == BLK_FFN ? W_LOAD : W_IGNORE;
        bad = want(L, &y->pi, W_LOAD, 1, 3, 0, 0, "blocks.%d.pi", b) ||
              want(L, &y->qkv, at, 2, 3 * A, D, 0, "blocks.%d.attn.qkv_net.weight", b) ||
              want(L, &y->qkv_b, at, 1, 3 * A, 0, 0, "blocks.%d.attn.qkv_net.bias", b) ||
              want(L, &y->rnet, at, 2, A, D, 0, "blocks.%d.attn.r_net.weight", b) ||
              want(L, &y->rnet_b, at, 1, A, 0, 0, "blocks.%d.attn.r_net.bias", b) ||
              want(L, &y->r_w_bias, at, 2, nh, dh, 0, "blocks.%d.attn.r_w_bias", b) ||
              want(L, &y->r_r_bias, at, 2, nh, dh, 0, "blocks.%d.attn.r_r_bias", b) ||
              want(L, &y->onet, at, 2, D, A, 0, "blocks.%d.attn.o_net.weight", b) ||
              want(L, &y->wo_b, at, 1, D, 0, 0, "blocks.%d.attn.o_net.bias", b) ||
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

/* The argmax of a block's pi (the first of equals, as numpy's). */
static blk_kind pi_kind(const float *pi)
{
    int k = 0;
    for (int i = 1; i < 3; i++)
        if (pi[i] > pi[k]) k = i;
    return k == 0 ? BLK_ATTN : k == 1 ? BLK_FFN : BLK_SKIP;
}

/* The seed's positional_encoding(max_position, D) reversed along its last
 * axis, row P (float32 as TensorFlow computes it). */
static void tf_position(float *row, int D, int p)
{
    for (int i = 0; i < D; i++) {
        const float f = powf(1e-4f, (float)(2 * (i / 2)) / (float)D), angle = (float)p * f;
        row[D - 1 - i] = i % 2 ? sinf(angle) : cosf(angle);
    }
}

static int tf_derive(model_t *m, const wantlist *L, char *err)
{
    (void)L;
    for (int b = 0; b < m->n_layers; b++) {
        const layer_t *y = &m->layers[b];
        for (int i = 0; i < 3; i++)
            if (!isfinite(y->pi[i])) return err_set(err, "%s: blocks.%d.pi is not finite", m->path, b);
        if (pi_kind(y->pi) != y->kind)
            return err_set(err, "%s: config arch[%d] is %s but blocks.%d.pi = [%g, %g, %g] chooses %s", m->path, b,
                           blk_kind_name(y->kind), b, y->pi[0], y->pi[1], y->pi[2], blk_kind_name(pi_kind(y->pi)));
    }
    if (m->ada && adaptive_prepare(m->ada, m->d_model, err)) return -1;
    const int D = m->d_model, A = m->n_head * m->d_head, T = m->max_position;
    float *pos = malloc((size_t)T * D * sizeof *pos);
    if (!pos) return err_set(err, "out of memory");
    for (int p = 0; p < T; p++) tf_position(pos + (size_t)p * D, D, p);
    for (int b = 0; b < m->n_layers; b++) {
        layer_t *y = &m->layers[b];
        if (y->kind != BLK_ATTN) continue;
        y->rk = malloc((size_t)T * A * sizeof *y->rk);
        if (!y->rk) { free(pos); return err_set(err, "out of memory"); }
        ops_linear(y->rk, pos, y->rnet, y->rnet_b, 1, T, D, A);
        y->rk_len = T;
    }
    free(pos);
    return 0;
}

/* Each block's pi and the kind its argmax chose. */
static void tf_report(const model_t *m, json_t *r)
{
    json_t *blocks = json_array();
    for (int b = 0; b < m->n_layers; b++) {
        const layer_t *y = &m->layers[b];
        json_array_append_new(blocks, json_pack("{s:i, s:s, s:{s:f, s:f, s:f}}", "block", b, "kind",
                                                blk_kind_name(y->kind), "pi", "attn", y->pi[0], "ffn", y->pi[1],
                                                "skip", y->pi[2]));
    }
    json_object_set_new(r, "mem_len", json_integer(m->mem_len));
    json_object_set_new(r, "max_position", json_integer(m->max_position));
    json_object_set_new(r, "blocks", blocks);
}

/* The seed keeps every block's input (attention or not) of mem_len rows. */
static size_t tf_mem_reference(const model_t *m)
{
    return (size_t)m->n_layers * m->mem_len * m->d_model * sizeof(float);
}

const family_ops family_par_tf = {
    .name = "par-transformer-xl-tf",
    .claims = tf_claims,
    .config = tf_config,
    .tensors = tf_tensors,
    .derive = tf_derive,
    .free_derived = par_free_derived,
    .forward = par_forward,
    .mem_slots = par_mem_slots,
    .slot_krows = par_slot_rows,
    .slot_vrows = par_slot_rows,
    .slot_width = par_slot_width,
    .held_rows = par_held_rows,
    .mem_reference = tf_mem_reference,
    .mem_full = tf_mem_reference,
    .full_name = "the seed's memory, every block's input",
    .mem_kind = par_mem_kind,
    .report = tf_report,
    .cost = par_cost,
};
