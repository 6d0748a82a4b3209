/*
 * aspan.c - CPU forward of the adaptive-span Transformer (Sukhbaatar et al.
 * 2019), equal to the reference `TransformerSeq` in eval mode.
 *
 * Per layer, with H = K heads of D dims, S the maximum span, R the ramp:
 *   q, k, v = h Wq^T, h Wk^T, h Wv^T            (no biases)
 *   for a query at position t and distance d = 1..S (keys strictly before t):
 *     s(d) = (q_t . k_{t-d} + q_t . pe[:, S-d]) / sqrt(D)
 *     a = softmax_d(s);  a(d) *= m(d) = clamp((1 - d + z)/R + 1, 0, 1)
 *     a = a / (sum a + 1e-8);  out_t = sum_d a(d) v_{t-d}
 *   h = LN1(h + out Wo^T);  h = LN2(h + fc2(relu(fc1(h))))
 *   logprobs = log_softmax(h Wout^T + b)
 *
 * The memory trick: m(d) is zero past each head's reach (z + R), so a head
 * keeps values of only its last `reach` positions in a ring. Keys have no
 * bias and no position term (the position term is on the query side,
 * q . pe), so a key computed once stays valid: nothing is recomputed from
 * hidden states. Positions past the reach still enter the softmax's
 * denominator, and through the renormalisation's 1e-8 the output: in
 * MEM_EXACT a head keeps keys for the layer's whole window (S - trim_len, as
 * the reference attends) to reproduce that; in MEM_SPAN it keeps keys of its
 * reach only (model.h).
 * The reference's memory starts as zeros and is attended to; unwritten ring
 * rows are zeros too, so the first block sees exactly what it sees.
 *
 * Persistent memory (pers_mem_size N > 0: the all-attention layers of
 * Sukhbaatar et al. 2019b): each head also scores N learned keys,
 *   s(n) = (q_t . key[:, n] sqrt(D)) / sqrt(D),
 * in one softmax with the context's; the span mask multiplies the context
 * part only, then the whole row is renormalised jointly,
 *   a = a / (sum context a + sum persistent a + 1e-8),
 *   out_t = sum_d a(d) v_{t-d} + sum_n a(n) val[n] sqrt(N),
 * and the layer has no feed-forward: h = LN1(h + out Wo^T). A head whose
 * mask is zero everywhere still attends to its persistent vectors.
 */
#include "attention.h"
#include "err.h"
#include "family.h"
#include "forward.h"
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Ring row of absolute position P (may be negative: the zeros before the
 * start) in a ring of R rows. */
static inline int ring_slot(int64_t p, int r)
{
    int64_t s = p % r;
    return (int)(s < 0 ? s + r : s);
}

int aspan_forward(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                  float *logprobs, fwd_ws *ws, char *err)
{
    (void)targets;   /* the whole rows: one softmax is all the output layer has */
    const int H = m->d_model, K = m->n_head, D = m->d_head, S = m->span, I = m->d_inner, V = m->V;
    const size_t N = (size_t)B * M;
    int maxr = 0;   /* the most rows any head's window holds */
    for (int l = 0; l < m->n_layers; l++)
        for (int h = 0; h < K; h++) maxr = m->layers[l].krows[h] > maxr ? m->layers[l].krows[h] : maxr;
    float *x = ws_get(ws, WS_H, N * H), *q = ws_get(ws, WS_Q, N * H), *k = ws_get(ws, WS_K, N * H),
          *v = ws_get(ws, WS_V, N * H), *att = ws_get(ws, WS_ATT, N * H), *tmp = ws_get(ws, WS_TMP, N * H),
          *ff = ws_get(ws, WS_FF, N * I), *scm = ws_get(ws, WS_SC, (size_t)M * (maxr ? maxr : 1)),
          *scb = ws_get(ws, WS_KWIN, (size_t)M * M), *pe = ws_get(ws, WS_PE, (size_t)M * (maxr ? maxr : 1)),
          *p = ws_get(ws, WS_P, (size_t)maxr + m->pers + 1);
    float *out = logprobs ? logprobs : ws_get(ws, WS_LOGITS, N * V),
          *psc = m->pers ? ws_get(ws, WS_QU, (size_t)M * m->pers) : NULL;   /* q . persistent keys */
    if (!x || !q || !k || !v || !att || !tmp || !ff || !scm || !scb || !pe || !p || !out || (m->pers && !psc))
        return err_set(err, "out of memory for a block of %d x %d tokens", B, M);
    const float scale = sqrtf((float)D);
    const int NP = m->pers;

    for (size_t n = 0; n < N; n++) memcpy(x + n * H, m->emb + (size_t)tokens[n] * H, (size_t)H * sizeof *x);

    for (int l = 0; l < m->n_layers; l++) {
        const layer_t *y = &m->layers[l];
        ops_linear(q, x, y->wq, NULL, B, M, H, H);
        ops_linear(k, x, y->wk, NULL, B, M, H, H);
        ops_linear(v, x, y->wv, NULL, B, M, H, H);
        for (int b = 0; b < B; b++) {
            mem_t *s = mems[b];
            const int64_t p0 = s->pos;
            const size_t row0 = (size_t)b * M;
            for (int h = 0; h < K; h++) {
                const int r = y->reach[h], kw = y->krows[h];
                const float *mask = y->mask[h];
                float *kr = s->buf + s->off[l * K + h], *vr = kr + (size_t)kw * D;
                if (r == 0 && !NP) {   /* a head whose mask is zero everywhere outputs zeros */
                    for (int i = 0; i < M; i++) memset(att + (row0 + i) * H + h * D, 0, (size_t)D * sizeof *att);
                    continue;
                }
                /* this block's queries, keys and values of head h (rows of stride H) */
                const float *qh = q + row0 * H + h * D, *kb = k + row0 * H + h * D, *vb = v + row0 * H + h * D;
                /* scm[i][slot] = q_i . ring key;  scb[i][j] = q_i . block key j;
                 * pe[i][c] = q_i . key_pe[:, S-kw+c] (distance kw-c). No copies:
                 * distances are mapped to ring slots or block rows below. */
                if (kw) {
                    ops_gemm_nt(scm, kw, qh, H, kr, D, M, kw, D);
                    ops_gemm_nt(scb, M, qh, H, kb, H, M, M, D);
                    ops_gemm_nn(pe, kw, qh, H, m->key_pe + (S - kw), S, M, kw, D);
                }
                const float *pv = NP ? y->pval_s + (size_t)h * NP * D : NULL;
                if (NP) ops_gemm_nt(psc, NP, qh, H, y->pkey_s + (size_t)h * NP * D, D, M, NP, D);
                for (int i = 0; i < M; i++) {
                    const float *smi = scm + (size_t)i * kw, *sbi = scb + (size_t)i * M, *pi = pe + (size_t)i * kw;
                    float mx = -INFINITY;
                    /* distance d = kw - c: the ring (position p0+i-d, slots
                     * running on from that of p0+i-kw) while d > i, then the block */
                    const int in_ring = kw - i < 0 ? 0 : kw - i;   /* c < in_ring: d > i */
                    for (int c = 0, sl = ring_slot(p0 + i - kw, kw); c < in_ring; c++, sl = sl + 1 == kw ? 0 : sl + 1) {
                        p[c] = (smi[sl] + pi[c]) / scale;
                        mx = p[c] > mx ? p[c] : mx;
                    }
                    for (int c = in_ring; c < kw; c++) {
                        p[c] = (sbi[i - (kw - c)] + pi[c]) / scale;
                        mx = p[c] > mx ? p[c] : mx;
                    }
                    for (int n = 0; n < NP; n++) {   /* the persistent keys, after the context's */
                        p[kw + n] = psc[(size_t)i * NP + n] / scale;
                        mx = p[kw + n] > mx ? p[kw + n] : mx;
                    }
                    double z = 0, zm = 0;
                    for (int c = 0; c < kw + NP; c++) {
                        p[c] = expf(p[c] - mx);
                        z += p[c];
                    }
                    /* distances 1..r keep a nonzero mask: p[kw - d] */
                    float *pr = p + (kw - r);
                    for (int j = 0; j < r; j++) {
                        pr[j] = (float)(pr[j] / z) * mask[r - j - 1];
                        zm += pr[j];
                    }
                    for (int n = 0; n < NP; n++) {
                        p[kw + n] = (float)(p[kw + n] / z);
                        zm += p[kw + n];
                    }
                    const float inv = (float)(1.0 / (zm + 1e-8));
                    if (ws->rec)   /* the keys of distances r..1, then the persistent vectors */
                        attn_record(ws->rec, b, l, h, p0 + i, p0 + i - r, pr, r, p + kw, NP, inv);
                    float *o = att + (row0 + i) * H + h * D;
                    memset(o, 0, (size_t)D * sizeof *o);
                    for (int j = 0, sl = ring_slot(p0 + i - r, r); j < r; j++, sl = sl + 1 == r ? 0 : sl + 1) {
                        int d = r - j;   /* distance; the ring's slot of position p0+i-d runs with j */
                        const float a = pr[j] * inv;
                        const float *vv = d <= i ? vb + (size_t)(i - d) * H : vr + (size_t)sl * D;
                        for (int c = 0; c < D; c++) o[c] += a * vv[c];
                    }
                    for (int n = 0; n < NP; n++) {
                        const float a = p[kw + n] * inv, *vv = pv + (size_t)n * D;
                        for (int c = 0; c < D; c++) o[c] += a * vv[c];
                    }
                }
                /* the block's keys and values enter the rings (the last kw and r of them) */
                for (int i = M > kw ? M - kw : 0; i < M; i++)
                    memcpy(kr + (size_t)ring_slot(p0 + i, kw) * D, kb + (size_t)i * H, (size_t)D * sizeof *kr);
                for (int i = M > r ? M - r : 0; i < M; i++)
                    memcpy(vr + (size_t)ring_slot(p0 + i, r) * D, vb + (size_t)i * H, (size_t)D * sizeof *vr);
            }
        }
        ops_linear(tmp, att, y->wo, NULL, B, M, H, H);
        ops_add_layernorm(x, tmp, y->ln1_w, y->ln1_b, (int)N, H);
        if (NP) continue;   /* all-attention layers: no feed-forward */
        ops_linear(ff, x, y->fc1_w, y->fc1_b, B, M, H, I);
        ops_relu(ff, N * I);
        ops_linear(tmp, ff, y->fc2_w, y->fc2_b, B, M, I, H);
        ops_add_layernorm(x, tmp, y->ln2_w, y->ln2_b, (int)N, H);
    }
    ops_linear(out, x, m->out_w, m->out_b, B, M, H, V);
    ops_log_softmax(out, (int)N, V);
    return 0;
}

/* ------------------------------------------------------------ loading */


static int aspan_config(model_t *m, json_t *cfg, char *err)
{
    const char *p = m->path;
    /* all-attention layers (persistent memory) have no feed-forward, and need no inner_hidden_size */
    if (cfg_int(p, cfg, "pers_mem_size", 0, MODEL_MAX_SPAN, 0, 0, &m->pers, err) ||
        cfg_int(p, cfg, "hidden_size", 1, MODEL_MAX_DIM, 1, 0, &m->d_model, err) ||
        cfg_int(p, cfg, "inner_hidden_size", 1, MODEL_MAX_DIM * 8LL, !m->pers, 1, &m->d_inner, err) ||
        cfg_int(p, cfg, "nb_heads", 1, MODEL_MAX_HEADS, 1, 0, &m->n_head, err) ||
        cfg_int(p, cfg, "nb_layers", 1, MODEL_MAX_LAYERS, 1, 0, &m->n_layers, err) ||
        cfg_int(p, cfg, "attn_span", 1, MODEL_MAX_SPAN, 1, 0, &m->span, err) ||
        cfg_int(p, cfg, "block_size", 1, MODEL_MAX_SPAN, 1, 0, &m->block_len, err) ||
        cfg_int(p, cfg, "adapt_span_ramp", 1, MODEL_MAX_SPAN, 1, 0, &m->ramp, err))
        return -1;
    if (m->d_model % m->n_head)
        return err_set(err, "%s: config hidden_size %d is not a multiple of nb_heads %d", p, m->d_model, m->n_head);
    m->d_head = m->d_model / m->n_head;
    if (!(m->layers = calloc((size_t)m->n_layers, sizeof *m->layers))) return err_set(err, "out of memory");
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
              want(L, &y->ln1_b, W_LOAD, 1, H, 0, 0, "layers.%d.norm1.bias", l);
        if (m->pers) {   /* persistent keys and values; the span module is listed again under them */
            const int64_t D = H / K, P = m->pers;
            bad = bad || want(L, &y->pkey, W_LOAD, 3, K, D, P, "layers.%d.attn.attn.persistent_memory.key", l) ||
                  want(L, &y->pval, W_LOAD, 3, K, P, D, "layers.%d.attn.attn.persistent_memory.val", l) ||
                  want(L, &y->pzfrac, W_OPTIONAL, 3, K, 1, 1,
                       "layers.%d.attn.attn.persistent_memory.adaptive_span._mask.current_val", l) ||
                  want(L, &y->pmask_tpl, W_OPTIONAL, 1, S, 0, 0,
                       "layers.%d.attn.attn.persistent_memory.adaptive_span._mask.mask_template", l);
            continue;
        }
        bad = bad || want(L, &y->ln2_w, W_LOAD, 1, H, 0, 0, "layers.%d.norm2.weight", l) ||
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

/* Persistent memory: the keys transposed to K x N x D and scaled by
 * sqrt(D), the values scaled by sqrt(N), as the reference multiplies them
 * (float32 by the double's float); the span module listed again under the
 * persistent memory is the layer's own (the same values, not counted twice). */
static int derive_pers(model_t *m, char *err)
{
    const int K = m->n_head, D = m->d_head, P = m->pers, S = m->span;
    const float sd = (float)sqrt((double)D), sp = (float)sqrt((double)P);
    for (int l = 0; l < m->n_layers; l++) {
        layer_t *y = &m->layers[l];
        for (int h = 0; y->pzfrac && h < K; h++)
            if (y->pzfrac[h] != y->zfrac[h])
                return err_set(err, "%s: layers.%d: the persistent memory's current_val[%d] = %g is not the layer's %g "
                               "(the reference shares one module)", m->path, l, h, (double)y->pzfrac[h],
                               (double)y->zfrac[h]);
        for (int j = 0; y->pmask_tpl && j < S; j++)
            if (y->pmask_tpl[j] != y->mask_tpl[j])
                return err_set(err, "%s: layers.%d: the persistent memory's mask_template differs from the layer's at %d",
                               m->path, l, j);
        m->n_params -= (y->pzfrac ? K : 0) + (y->pmask_tpl ? S : 0);
        y->pkey_s = malloc((size_t)K * P * D * sizeof *y->pkey_s);
        y->pval_s = malloc((size_t)K * P * D * sizeof *y->pval_s);
        if (!y->pkey_s || !y->pval_s) return err_set(err, "out of memory");
        for (int h = 0; h < K; h++)
            for (int n = 0; n < P; n++)
                for (int c = 0; c < D; c++) {
                    const size_t at = ((size_t)h * P + n) * D + c;
                    y->pkey_s[at] = y->pkey[((size_t)h * D + c) * P + n] * sd;
                    y->pval_s[at] = y->pval[at] * sp;
                }
    }
    return 0;
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
            /* a head with persistent memory attends (to those) even when its span is zero: exact, it keeps
             * the window's keys, whose scores share the softmax */
            y->krows[h] = m->mem_mode == MEM_EXACT && (r > 0 || m->pers) ? window : r;
            y->mask[h] = malloc((size_t)(r ? r : 1) * sizeof(float));
            if (!y->mask[h]) return err_set(err, "out of memory");
            for (int d = 1; d <= r; d++) y->mask[h][d - 1] = span_mask(y->zfrac[h], S, R, d);
        }
    }
    m->n_params -= (int64_t)m->n_layers * m->span;   /* mask templates are buffers, not parameters */
    return m->pers ? derive_pers(m, err) : 0;
}


static void aspan_free_derived(model_t *m)
{
    for (int l = 0; m->layers && l < m->n_layers; l++) {
        layer_t *y = &m->layers[l];
        free(y->pkey_s);
        free(y->pval_s);
        for (int h = 0; y->mask && h < m->n_head; h++) free(y->mask[h]);
        free(y->mask);
        free(y->reach);
        free(y->krows);
    }
}

static int aspan_claims(const char *fam, json_t *cfg)
{
    (void)cfg;
    return strcmp(fam, "adaptive-span") == 0;
}

/* ------------------------------------------------------------ memory */

/* One ring per layer and head: keys of krows[h] rows, values of reach[h]. */
static int aspan_mem_slots(const model_t *m) { return m->n_layers * m->n_head; }
static int aspan_slot_krows(const model_t *m, int i) { return m->layers[i / m->n_head].krows[i % m->n_head]; }
static int aspan_slot_vrows(const model_t *m, int i) { return m->layers[i / m->n_head].reach[i % m->n_head]; }
static int aspan_slot_width(const model_t *m) { return m->d_head; }
/* Rings of positions, not counted rows: mem_t.len stays 0. */
static int64_t aspan_held_rows(const model_t *m, int l, int64_t pos) { (void)m, (void)l, (void)pos; return 0; }

/* The reference keeps each layer's hidden states of its cache_size. */
static size_t aspan_mem_reference(const model_t *m)
{
    size_t n = 0;
    for (int l = 0; l < m->n_layers; l++) n += (size_t)m->layers[l].cache_size * m->d_model;
    return n * sizeof(float);
}

static size_t aspan_mem_full(const model_t *m) { return (size_t)m->n_layers * m->span * m->d_model * sizeof(float); }
static const char *aspan_mem_kind(const model_t *m) { return m->mem_mode == MEM_EXACT ? "exact" : "span"; }

/* ------------------------------------------------------------ reports */

json_t *span_heads_report(const model_t *m, const layer_t *y, int key_rows)
{
    json_t *heads = json_array();
    for (int h = 0; h < m->n_head; h++)
        json_array_append_new(heads, json_pack("{s:f, s:f, s:i, s:i}", "z", (double)y->zfrac[h], "span",
                                               (double)y->zfrac[h] * m->span, "reach", y->reach[h], "key_rows",
                                               key_rows < 0 ? y->krows[h] : key_rows));
    return heads;
}

static void aspan_report(const model_t *m, json_t *r)
{
    json_t *layers = json_array();
    for (int l = 0; l < m->n_layers; l++) {
        const layer_t *y = &m->layers[l];
        json_t *heads = span_heads_report(m, y, -1);
        json_array_append_new(layers, json_pack("{s:i, s:o, s:i, s:i, s:i, s:i}", "layer", l, "heads", heads,
                                                "max_span", y->max_span, "avg_span", y->avg_span, "cache_size",
                                                y->cache_size, "trim_len", y->trim_len));
    }
    json_object_set_new(r, "attn_span", json_integer(m->span));
    json_object_set_new(r, "ramp", json_integer(m->ramp));
    if (m->pers) json_object_set_new(r, "pers_mem_size", json_integer(m->pers));
    json_object_set_new(r, "layers", layers);
}

/* q, k, v, o; the feed-forward; per head q.k over the key rows, q.key_pe
 * over as many, and the values of its reach. */
static void aspan_cost(const model_t *m, double *tok, double *step)
{
    const double D = m->d_model, I = m->d_inner, dh = m->d_head;
    for (int l = 0; l < m->n_layers; l++) {
        const layer_t *y = &m->layers[l];
        *tok += 8 * D * D + (m->pers ? 0 : 4 * D * I);
        for (int h = 0; h < m->n_head; h++) *tok += 2 * dh * (2.0 * y->krows[h] + y->reach[h] + 2.0 * m->pers);
    }
    (void)step;
}

const family_ops family_aspan = {
    .name = "adaptive-span",
    .claims = aspan_claims,
    .config = aspan_config,
    .tensors = aspan_tensors,
    .derive = aspan_derive,
    .free_derived = aspan_free_derived,
    .forward = aspan_forward,
    .mem_slots = aspan_mem_slots,
    .slot_krows = aspan_slot_krows,
    .slot_vrows = aspan_slot_vrows,
    .slot_width = aspan_slot_width,
    .held_rows = aspan_held_rows,
    .mem_reference = aspan_mem_reference,
    .mem_full = aspan_mem_full,
    .full_name = "reference at the full span",
    .mem_kind = aspan_mem_kind,
    .report = aspan_report,
    .cost = aspan_cost,
    .cut_free = 1,   /* distances 1..S before each query, in whatever block it comes */
};
