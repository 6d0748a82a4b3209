/*
 * par.c - CPU forward of PAR Transformer-XL (Mandava et al. 2020): a stack
 * of blocks, each Transformer-XL relative attention, a ReLU feed-forward, or
 * the identity, as config.arch chose. Equal to kimiyoung/transformer-xl's
 * RelPartialLearnableMultiHeadAttn and PositionwiseFF (post-LN, eval mode).
 *
 *   h = emb[x] * sqrt(D)
 *   attention block, memory of mlen rows, klen = mlen + qlen:
 *     q, k, v = split([mem; h] Wqkv^T)           (queries of h only)
 *     r_t = Wr . sinusoid(t), distance t = 0..klen-1
 *     score(i, j) = ((q_i + u) . k_j + (q_i + v) . r_{i-j}) / sqrt(d_head),
 *                   keys j <= i (the whole memory and the segment so far)
 *     h = LN(h + softmax(score) v Wo^T)
 *   feed-forward block: h = LN(h + W2 relu(W1 h + b1) + b2)
 *   logprobs = log_softmax(h Emb^T + b)
 *
 * Memory: each attention block keeps keys and values of its input's last
 * mem_len positions (a ring), so a decode step projects one row, not the
 * whole memory. r_t depends on t alone: computed once at load (model.c).
 */
#include "err.h"
#include "forward.h"
#include "ops.h"

#include <math.h>
#include <string.h>

int par_forward(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, float *logprobs,
                fwd_ws *ws, char *err)
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
    const float emb_scale = (float)sqrt((double)D), scale = (float)(1.0 / sqrt((double)dh));

    for (size_t n = 0; n < N; n++)
        for (int c = 0; c < D; c++) x[n * D + c] = m->emb[(size_t)tokens[n] * D + c] * emb_scale;

    for (int l = 0; l < m->n_layers; l++) {
        const layer_t *y = &m->layers[l];
        if (y->kind == BLK_SKIP) continue;
        if (y->kind == BLK_FFN) {
            ops_linear(ff, x, y->fc1_w, y->fc1_b, B, M, D, I);
            ops_relu(ff, N * I);
            ops_linear(tmp, ff, y->fc2_w, y->fc2_b, B, M, I, D);
            ops_add_layernorm(x, tmp, y->ln2_w, y->ln2_b, (int)N, D);
            continue;
        }
        ops_linear(qkv, x, y->qkv, NULL, B, M, D, 3 * A);
        /* r_t for t = 0..klen-1: the table from load, or computed here for
         * blocks longer than it covers */
        const float *rk = y->rk;
        if (kmax > y->rk_len) {
            float *pos = ws_get(ws, WS_POS, (size_t)kmax * D), *r = ws_get(ws, WS_RK, (size_t)kmax * A);
            if (!pos || !r) return err_set(err, "out of memory for a block of %d tokens", M);
            for (int t = 0; t < kmax; t++) par_sinusoid(pos + (size_t)t * D, D, t);
            ops_linear(r, pos, y->rnet, NULL, 1, kmax, D, A);
            rk = r;
        }
        for (int b = 0; b < B; b++) {
            mem_t *s = mems[b];
            const int mlen = s->len[l], klen = mlen + M;   /* ring slots 0..mlen-1 are filled */
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
                        qu[i * dh + c] = row[h * dh + c] + m->r_w_bias[h * dh + c];
                        qv[i * dh + c] = row[h * dh + c] + m->r_r_bias[h * dh + c];
                    }
                }
                ops_gemm_nt(acm, mlen ? mlen : 1, qu, dh, kr + h * dh, A, M, mlen, dh);
                ops_gemm_nt(acb, M, qu, dh, kb, 3 * A, M, M, dh);
                ops_gemm_nt(bd, klen, qv, dh, rk + h * dh, A, M, klen, dh);
                for (int i = 0; i < M; i++) {
                    const int qi = mlen + i;   /* the query's index among the keys; keys 0..qi */
                    const float *ami = acm + (size_t)i * (mlen ? mlen : 1), *abi = acb + (size_t)i * M,
                                *bi = bd + (size_t)i * klen;
                    float mx = -INFINITY;
                    /* key j: memory row j (the ring's slot of position p0-mlen+j, running on
                     * with j) or block row j-mlen */
                    const int sl0 = mlen ? (int)((p0 - mlen) % ML) : 0;
                    for (int j = 0, sl = sl0; j < mlen; j++, sl = sl + 1 == ML ? 0 : sl + 1) {
                        p[j] = (ami[sl] + bi[qi - j]) * scale;
                        mx = p[j] > mx ? p[j] : mx;
                    }
                    for (int j = mlen; j <= qi; j++) {
                        p[j] = (abi[j - mlen] + bi[qi - j]) * scale;
                        mx = p[j] > mx ? p[j] : mx;
                    }
                    double z = 0;
                    for (int j = 0; j <= qi; j++) {
                        p[j] = expf(p[j] - mx);
                        z += p[j];
                    }
                    const float inv = (float)(1.0 / z);
                    float *o = att + (row0 + i) * A + h * dh;
                    memset(o, 0, (size_t)dh * sizeof *o);
                    for (int j = 0, sl = sl0; j <= qi; j++) {
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
        ops_linear(tmp, att, y->onet, NULL, B, M, A, D);
        ops_add_layernorm(x, tmp, y->ln1_w, y->ln1_b, (int)N, D);
    }
    ops_linear(out, x, m->out_w, m->out_b, B, M, D, V);
    ops_log_softmax(out, (int)N, V);
    return 0;
}
