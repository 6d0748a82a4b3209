/*
 * par.c - the PAR Transformer-XL family (Mandava et al. 2020): a stack of
 * blocks, each Transformer-XL relative attention, a ReLU feed-forward, or
 * the identity, as config.arch chose; and the forward, memory and reports
 * that every Transformer-XL family shares (txl.c builds its layers as blocks
 * attn, ffn, attn, ffn, ...). Equal to kimiyoung/transformer-xl's
 * RelPartialLearnableMultiHeadAttn and PositionwiseFF in eval mode.
 *
 *   h = emb[x] * sqrt(D)                         (or the adaptive input, adaptive.c)
 *   attention block, memory of mlen rows, klen = mlen + qlen:
 *     q, k, v = split(n([mem; h]) Wqkv^T)         (queries of h only; n = LN with
 *                                                  pre_lnorm, else the identity)
 *     r_t = Wr . sinusoid(min(t, clamp_len)), distance t = 0..klen-1
 *     score(i, j) = ((q_i + u) . k_j + (q_i + v) . r_{i-j}) / sqrt(d_head),
 *                   keys j <= i (the whole memory and the segment so far);
 *                   with same_length also j > i - shift (every query sees as many)
 *     a = softmax(score) v Wo^T
 *     h = LN(h + a), or h + a with pre_lnorm
 *   feed-forward block: f = W2 relu(W1 n(h) + b1) + b2; h = LN(h + f), or h + f
 *   logprobs = log_softmax(h Emb^T + b)          (or the adaptive softmax)
 *
 * Memory: each attention block keeps keys and values of its input's last
 * mem_len positions (a ring), so a decode step projects one row, not the
 * whole memory (keys and values are row by row functions of the input, so
 * this is the reference's memory of hidden states, projected once). r_t
 * depends on t alone: computed once at load (par_derive_tables).
 *
 * With model_t.tf_attn (seed 004's TensorFlow PAR, par_tf.c, its header has
 * the math) the same forward adds the projections' biases, scales by
 * 1/d_head, reads the position table by the key's row (klen - 1 - (i - j),
 * not the distance), applies ReLU after o_net, and LayerNorm takes the
 * model's epsilon.
 */
#include "adaptive.h"
#include "attention.h"
#include "err.h"
#include "family.h"
#include "forward.h"
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int par_forward(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                float *logprobs, fwd_ws *ws, char *err)
{
    const int D = m->d_model, nh = m->n_head, dh = m->d_head, A = nh * dh, I = m->d_inner, V = m->V;
    const int ML = m->mem_len;
    const size_t N = (size_t)B * M;
    const int kmax = ML + M;
    float *x = ws_get(ws, WS_H, N * D), *qkv = ws_get(ws, WS_QKV, N * 3 * A), *att = ws_get(ws, WS_ATT, N * A),
          *tmp = ws_get(ws, WS_TMP, N * D), *ff = ws_get(ws, WS_FF, N * I),
          *acm = ws_get(ws, WS_KWIN, (size_t)M * (ML ? ML : 1)), *acb = ws_get(ws, WS_VWIN, (size_t)M * M),
          *bd = ws_get(ws, WS_PE, (size_t)M * kmax),
          *qu = ws_get(ws, WS_QU, (size_t)M * dh), *qv = ws_get(ws, WS_QV, (size_t)M * dh),
          *p = ws_get(ws, WS_P, (size_t)kmax);
    float *out = logprobs ? logprobs : ws_get(ws, WS_LOGITS, N * V);
    if (!x || !qkv || !att || !tmp || !ff || !acm || !acb || !bd || !qu || !qv || !p || !out)
        return err_set(err, "out of memory for a block of %d x %d tokens", B, M);
    const float emb_scale = (float)sqrt((double)D), scale = (float)(1.0 / (m->tf_attn ? dh : sqrt((double)dh)));
    const int tf = m->tf_attn;
    const double eps = m->ln_eps;

    if (!m->emb) adaptive_embed(m, tokens, N, x);
    else
        for (size_t n = 0; n < N; n++)
            for (int c = 0; c < D; c++) x[n * D + c] = m->emb[(size_t)tokens[n] * D + c] * emb_scale;

    for (int l = 0; l < m->n_layers; l++) {
        const layer_t *y = &m->layers[l];
        if (y->kind == BLK_SKIP) continue;
        if (y->kind == BLK_FFN) {
            const float *in = x;
            if (m->pre_lnorm) {
                memcpy(tmp, x, N * D * sizeof *tmp);
                ops_add_layernorm_eps(tmp, NULL, y->ln2_w, y->ln2_b, (int)N, D, eps);
                in = tmp;
            }
            ops_linear(ff, in, y->fc1_w, y->fc1_b, B, M, D, I);
            ops_relu(ff, N * I);
            ops_linear(tmp, ff, y->fc2_w, y->fc2_b, B, M, I, D);
            if (m->pre_lnorm)
                for (size_t i = 0; i < N * D; i++) x[i] += tmp[i];
            else
                ops_add_layernorm_eps(x, tmp, y->ln2_w, y->ln2_b, (int)N, D, eps);
            continue;
        }
        if (m->pre_lnorm) {
            memcpy(tmp, x, N * D * sizeof *tmp);
            ops_add_layernorm_eps(tmp, NULL, y->ln1_w, y->ln1_b, (int)N, D, eps);
            ops_linear(qkv, tmp, y->qkv, y->qkv_b, B, M, D, 3 * A);
        } else {
            ops_linear(qkv, x, y->qkv, y->qkv_b, B, M, D, 3 * A);
        }
        /* r_t for t = 0..klen-1: the table from load, or computed here for
         * blocks longer than it covers */
        const float *rk = y->rk;
        if (kmax > y->rk_len && tf)   /* the seed's table ends there */
            return err_set(err, "a block of %d tokens after %d rows of memory is over the model's max_position %d",
                           M, ML, m->max_position);
        if (kmax > y->rk_len) {
            float *pos = ws_get(ws, WS_POS, (size_t)kmax * D), *r = ws_get(ws, WS_RK, (size_t)kmax * A);
            if (!pos || !r) return err_set(err, "out of memory for a block of %d tokens", M);
            for (int t = 0; t < kmax; t++) par_sinusoid(pos + (size_t)t * D, D, par_distance(m, t));
            ops_linear(r, pos, y->rnet, NULL, 1, kmax, D, A);
            rk = r;
        }
        for (int b = 0; b < B; b++) {
            mem_t *s = mems[b];
            const int mlen = s->len[l], klen = mlen + M;   /* ring slots 0..mlen-1 are filled */
            /* same_length: keys j <= i - shift are masked too (the reference's
             * tril(ones, -shift)), shift from how far the keys pass mem_len */
            const int mask_len = klen - ML, shift = mask_len > 0 ? M - mask_len : M;
            const int64_t p0 = s->pos;
            const size_t row0 = (size_t)b * M;
            float *kr = s->buf + s->off[l], *vr = kr + (size_t)ML * A;
            for (int h = 0; h < nh; h++) {
                /* keys: the ring's mlen rows (slots 0..mlen-1 hold the memory
                 * until it is full) and this block's rows (stride 3A); no copies */
                const float *kb = qkv + row0 * 3 * A + A + h * dh, *vb = kb + A;
                for (int i = 0; i < M; i++) {
                    const float *row = qkv + (row0 + i) * 3 * A;
                    for (int c = 0; c < dh; c++) {
                        qu[i * dh + c] = row[h * dh + c] + y->r_w_bias[h * dh + c];
                        qv[i * dh + c] = row[h * dh + c] + y->r_r_bias[h * dh + c];
                    }
                }
                ops_gemm_nt(acm, mlen ? mlen : 1, qu, dh, kr + h * dh, A, M, mlen, dh);
                ops_gemm_nt(acb, M, qu, dh, kb, 3 * A, M, M, dh);
                ops_gemm_nt(bd, klen, qv, dh, rk + h * dh, A, M, klen, dh);
                for (int i = 0; i < M; i++) {
                    const int qi = mlen + i;   /* the query's index among the keys; keys j0..qi */
                    const int j0 = m->same_length && i - shift + 1 > 0 ? i - shift + 1 : 0;
                    const float *ami = acm + (size_t)i * (mlen ? mlen : 1), *abi = acb + (size_t)i * M,
                                *bi = bd + (size_t)i * klen;
                    float mx = -INFINITY;
                    /* key j: memory row j (the ring's slot of position p0-mlen+j, running on
                     * with j) or block row j-mlen */
                    const int sl0 = mlen ? (int)((p0 - mlen + (j0 < mlen ? j0 : 0)) % ML) : 0;
                    for (int j = j0, sl = sl0; j < mlen; j++, sl = sl + 1 == ML ? 0 : sl + 1) {
                        p[j] = (ami[sl] + bi[tf ? klen - 1 - qi + j : qi - j]) * scale;
                        mx = p[j] > mx ? p[j] : mx;
                    }
                    for (int j = j0 > mlen ? j0 : mlen; j <= qi; j++) {
                        p[j] = (abi[j - mlen] + bi[tf ? klen - 1 - qi + j : qi - j]) * scale;
                        mx = p[j] > mx ? p[j] : mx;
                    }
                    double z = 0;
                    for (int j = j0; j <= qi; j++) {
                        p[j] = expf(p[j] - mx);
                        z += p[j];
                    }
                    const float inv = (float)(1.0 / z);
                    if (ws->rec)   /* key j is position p0 - mlen + j */
                        attn_record(ws->rec, b, l, h, p0 + i, p0 - mlen + j0, p + j0, qi - j0 + 1, NULL, 0, inv);
                    float *o = att + (row0 + i) * A + h * dh;
                    memset(o, 0, (size_t)dh * sizeof *o);
                    for (int j = j0, sl = sl0; j <= qi; j++) {
                        const float a = p[j] * inv;
                        const float *vv = j < mlen ? vr + (size_t)sl * A + h * dh : vb + (size_t)(j - mlen) * 3 * A;
                        if (j < mlen) sl = sl + 1 == ML ? 0 : sl + 1;
                        for (int c = 0; c < dh; c++) o[c] += a * vv[c];
                    }
                }
            }
            /* the block's keys and values enter the ring: the last mem_len rows of [memory; block] */
            if (ML > 0) {
                for (int i = M > ML ? M - ML : 0; i < M; i++) {
                    int sl = (int)((p0 + i) % ML);
                    const float *row = qkv + (row0 + i) * 3 * A;
                    memcpy(kr + (size_t)sl * A, row + A, (size_t)A * sizeof *kr);
                    memcpy(vr + (size_t)sl * A, row + 2 * A, (size_t)A * sizeof *vr);
                }
                s->len[l] = klen < ML ? klen : ML;
            }
        }
        ops_linear(tmp, att, y->onet, y->wo_b, B, M, A, D);
        if (tf) ops_relu(tmp, N * D);
        if (m->pre_lnorm)
            for (size_t i = 0; i < N * D; i++) x[i] += tmp[i];
        else
            ops_add_layernorm_eps(x, tmp, y->ln1_w, y->ln1_b, (int)N, D, eps);
    }
    if (m->ada) return adaptive_logprobs(m, x, B, M, targets, out, ws, err);
    ops_linear(out, x, m->out_w, m->out_b, B, M, D, V);
    ops_log_softmax(out, (int)N, V);
    return 0;
}

/* ------------------------------------------------------------ loading */


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
    if (cfg_bool(p, cfg, "tie_weight", 1, &m->tie_weight, err)) return -1;
    return par_config_arch(m, cfg, "", err);
}

int par_config_arch(model_t *m, json_t *cfg, const char *note, char *err)
{
    const char *p = m->path;
    json_t *arch = json_object_get(cfg, "arch");
    if (!json_is_array(arch) || json_array_size(arch) != (size_t)m->n_layers)
        return err_set(err, "%s: config 'arch' must be an array of n_blocks = %d kinds (attn, ffn, skip%s)", p,
                       m->n_layers, note);
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

/* The distance the position embedding sees: clamped to clamp_len. */
int par_distance(const model_t *m, int t) { return m->clamp_len > 0 && t > m->clamp_len ? m->clamp_len : t; }

/* Rows of r_net(sinusoid) kept per attention block, and the bytes of all
 * blocks' tables together: a cache, so a shape that would make it large
 * (wide heads over a long memory) gets a shorter one instead of an
 * allocation the file's size never hinted at; steps longer than the table
 * compute r_net on the fly. */
#define RK_TABLE_MAX 8192
#define RK_TABLE_BYTES (256LL << 20)

int par_derive_tables(model_t *m, char *err)
{
    int D = m->d_model, A = m->n_head * m->d_head, n_attn = 0;
    for (int b = 0; b < m->n_layers; b++) n_attn += m->layers[b].kind == BLK_ATTN;
    long long want_rows = (long long)m->mem_len + m->block_len;
    long long fit = n_attn ? RK_TABLE_BYTES / ((long long)n_attn * A * (long long)sizeof(float)) : RK_TABLE_MAX;
    if (fit < want_rows) want_rows = fit > 1 ? fit : 1;
    int T = (int)(want_rows < RK_TABLE_MAX ? want_rows : RK_TABLE_MAX);
    float *pos = malloc((size_t)T * D * sizeof *pos);
    if (!pos) return err_set(err, "out of memory");
    for (int t = 0; t < T; t++) par_sinusoid(pos + (size_t)t * D, D, par_distance(m, t));
    for (int b = 0; b < m->n_layers; b++) {
        layer_t *y = &m->layers[b];
        if (y->kind != BLK_ATTN) continue;
        if (!y->r_w_bias) y->r_w_bias = m->r_w_bias, y->r_r_bias = m->r_r_bias;
        y->rk = malloc((size_t)T * A * sizeof *y->rk);
        if (!y->rk) { free(pos); return err_set(err, "out of memory"); }
        ops_linear(y->rk, pos, y->rnet, NULL, 1, T, D, A);
        y->rk_len = T;
    }
    free(pos);
    return 0;
}

static int par_derive(model_t *m, const wantlist *L, char *err)
{
    (void)L;
    if (m->tie_weight) m->out_w = m->emb;
    return par_derive_tables(m, err);
}

void par_free_derived(model_t *m)
{
    for (int l = 0; m->layers && l < m->n_layers; l++) free(m->layers[l].rk);
    adaptive_free(m->ada);
    m->ada = NULL;
}

/* A char Transformer-XL converted to this layout says "transformer-xl" with
 * an arch; kimiyoung's own config (n_layer, no arch) is txl.c's. */
static int par_claims(const char *fam, json_t *cfg)
{
    return strcmp(fam, "par-transformer-xl") == 0 ||
           (strcmp(fam, "transformer-xl") == 0 && json_object_get(cfg, "arch") != NULL);
}

/* ------------------------------------------------------------ memory */

/* One ring per block: mem_len rows of keys and of values for attention. */
int par_mem_slots(const model_t *m) { return m->n_layers; }
int par_slot_rows(const model_t *m, int i) { return m->layers[i].kind == BLK_ATTN ? m->mem_len : 0; }
int par_slot_width(const model_t *m) { return m->n_head * m->d_head; }

/* Every position passes every attention block: it holds min(pos, mem_len) rows. */
int64_t par_held_rows(const model_t *m, int l, int64_t pos)
{
    return m->layers[l].kind == BLK_ATTN ? (pos < m->mem_len ? pos : m->mem_len) : 0;
}

/* The reference keeps each attention block's input of mem_len rows. */
size_t par_mem_reference(const model_t *m)
{
    size_t n = 0;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].kind == BLK_ATTN) n += (size_t)m->mem_len * m->d_model;
    return n * sizeof(float);
}

size_t par_mem_full(const model_t *m) { return (size_t)m->n_layers * m->mem_len * m->d_model * sizeof(float); }
const char *par_mem_kind(const model_t *m) { (void)m; return "kv"; }

/* ------------------------------------------------------------ reports */

void par_report(const model_t *m, json_t *r)
{
    json_t *blocks = json_array();
    for (int b = 0; b < m->n_layers; b++) {
        const layer_t *y = &m->layers[b];
        json_t *o = json_pack("{s:i, s:s}", "block", b, "kind", blk_kind_name(y->kind));
        double e[3];
        if (model_alpha_softmax(y, e) == 0)
            json_object_set_new(o, "alpha_softmax", json_pack("{s:f, s:f, s:f}", "attn", e[0], "ffn", e[1], "skip", e[2]));
        json_array_append_new(blocks, o);
    }
    json_object_set_new(r, "mem_len", json_integer(m->mem_len));
    json_object_set_new(r, "blocks", blocks);
}

/* qkv and o; content, position and value products over mem_len + L keys; a
 * step longer than the table of r_net (par_derive_tables) computes r_net of
 * all its distances. */
void par_cost(const model_t *m, double *tok, double *step)
{
    const double L = m->block_len, D = m->d_model, I = m->d_inner, A = (double)m->n_head * m->d_head;
    for (int l = 0; l < m->n_layers; l++) {
        const layer_t *y = &m->layers[l];
        if (y->kind == BLK_ATTN) {
            const double klen = (double)m->mem_len + L;
            *tok += 8 * D * A + 6 * A * klen;
            if (m->mem_len + 1 > y->rk_len) *step += 2 * D * A * klen;
        } else if (y->kind == BLK_FFN) {
            *tok += 4 * D * I;
        }
    }
}

const family_ops family_par = {
    .name = "par-transformer-xl",
    .claims = par_claims,
    .config = par_config,
    .tensors = par_tensors,
    .derive = par_derive,
    .free_derived = par_free_derived,
    .forward = par_forward,
    .mem_slots = par_mem_slots,
    .slot_krows = par_slot_rows,
    .slot_vrows = par_slot_rows,
    .slot_width = par_slot_width,
    .held_rows = par_held_rows,
    .mem_reference = par_mem_reference,
    .mem_full = par_mem_full,
    .full_name = "Transformer-XL, every block",
    .mem_kind = par_mem_kind,
    .report = par_report,
    .cost = par_cost,
};
