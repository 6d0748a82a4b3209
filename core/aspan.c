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
 */
#include "err.h"
#include "forward.h"
#include "ops.h"

#include <math.h>
#include <string.h>

/* Ring row of absolute position P (may be negative: the zeros before the
 * start) in a ring of R rows. */
static inline int ring_slot(int64_t p, int r)
{
    int64_t s = p % r;
    return (int)(s < 0 ? s + r : s);
}

int aspan_forward(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, float *logprobs,
                  fwd_ws *ws, char *err)
{
    const int H = m->d_model, K = m->n_head, D = m->d_head, S = m->span, I = m->d_inner, V = m->V;
    const size_t N = (size_t)B * M;
    int maxr = 0;   /* the most rows any head's window holds */
    for (int l = 0; l < m->n_layers; l++)
        for (int h = 0; h < K; h++) maxr = m->layers[l].krows[h] > maxr ? m->layers[l].krows[h] : maxr;
    float *x = ws_get(ws, WS_H, N * H), *q = ws_get(ws, WS_Q, N * H), *k = ws_get(ws, WS_K, N * H),
          *v = ws_get(ws, WS_V, N * H), *att = ws_get(ws, WS_ATT, N * H), *tmp = ws_get(ws, WS_TMP, N * H),
          *ff = ws_get(ws, WS_FF, N * I), *scm = ws_get(ws, WS_SC, (size_t)M * (maxr ? maxr : 1)),
          *scb = ws_get(ws, WS_KWIN, (size_t)M * M), *pe = ws_get(ws, WS_PE, (size_t)M * (maxr ? maxr : 1)),
          *p = ws_get(ws, WS_P, (size_t)maxr + 1);
    float *out = logprobs ? logprobs : ws_get(ws, WS_LOGITS, N * V);
    if (!x || !q || !k || !v || !att || !tmp || !ff || !scm || !scb || !pe || !p || !out)
        return err_set(err, "out of memory for a block of %d x %d tokens", B, M);
    const float scale = sqrtf((float)D);

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
                if (r == 0) {   /* a head whose mask is zero everywhere outputs zeros */
                    for (int i = 0; i < M; i++) memset(att + (row0 + i) * H + h * D, 0, (size_t)D * sizeof *att);
                    continue;
                }
                /* this block's queries, keys and values of head h (rows of stride H) */
                const float *qh = q + row0 * H + h * D, *kb = k + row0 * H + h * D, *vb = v + row0 * H + h * D;
                /* scm[i][slot] = q_i . ring key;  scb[i][j] = q_i . block key j;
                 * pe[i][c] = q_i . key_pe[:, S-kw+c] (distance kw-c). No copies:
                 * distances are mapped to ring slots or block rows below. */
                ops_gemm_nt(scm, kw, qh, H, kr, D, M, kw, D);
                ops_gemm_nt(scb, M, qh, H, kb, H, M, M, D);
                ops_gemm_nn(pe, kw, qh, H, m->key_pe + (S - kw), S, M, kw, D);
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
                    double z = 0, zm = 0;
                    for (int c = 0; c < kw; c++) {
                        p[c] = expf(p[c] - mx);
                        z += p[c];
                    }
                    /* distances 1..r keep a nonzero mask: p[kw - d] */
                    float *pr = p + (kw - r);
                    for (int j = 0; j < r; j++) {
                        pr[j] = (float)(pr[j] / z) * mask[r - j - 1];
                        zm += pr[j];
                    }
                    const float inv = (float)(1.0 / (zm + 1e-8));
                    float *o = att + (row0 + i) * H + h * D;
                    memset(o, 0, (size_t)D * sizeof *o);
                    for (int j = 0, sl = ring_slot(p0 + i - r, r); j < r; j++, sl = sl + 1 == r ? 0 : sl + 1) {
                        int d = r - j;   /* distance; the ring's slot of position p0+i-d runs with j */
                        const float a = pr[j] * inv;
                        const float *vv = d <= i ? vb + (size_t)(i - d) * H : vr + (size_t)sl * D;
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
        ops_linear(ff, x, y->fc1_w, y->fc1_b, B, M, H, I);
        ops_relu(ff, N * I);
        ops_linear(tmp, ff, y->fc2_w, y->fc2_b, B, M, I, H);
        ops_add_layernorm(x, tmp, y->ln2_w, y->ln2_b, (int)N, H);
    }
    ops_linear(out, x, m->out_w, m->out_b, B, M, H, V);
    ops_log_softmax(out, (int)N, V);
    return 0;
}
