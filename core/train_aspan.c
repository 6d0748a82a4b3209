/*
 * train_aspan.c - the adaptive-span Transformer's training forward and
 * backward, as the reference `TransformerSeq` trains.
 *
 * Per layer l with input X (B streams x M positions x H), memory C of the
 * layer's input at the last S positions (no gradient through it), and the
 * window W = S - trim_len the reference attends to at the current z:
 *   hall = [C[S-W:]; X]                       (W + M rows per stream)
 *   q = X Wq^T,  k = hall Wk^T,  v = hall Wv^T
 *   for query i and column c (distance d = W - c, key row i + c):
 *     s_c = (q_i . k_{i+c} + q_i . pe[:, S-W+c]) / sqrt(D)
 *     a = softmax(s);  b_c = a_c m_c;  w_c = b_c / (sum b + 1e-8)
 *     m_c = clamp((1 - d + z)/R + 1, 0, 1),  z = current_val * S
 *     o_i = sum_c w_c v_{i+c}
 *   X1 = LN1(X + o Wo^T);  X' = LN2(X1 + fc2(relu(fc1(X1))))
 *   loss = mean NLL + sum_l coeff * S * mean_h current_val
 * Backward of the renormalised mask (n = sum b + 1e-8):
 *   db_c = (dw_c - sum_j dw_j w_j) / n;  da_c = db_c m_c;
 *   dz += db_c a_c S/R where 0 <= x <= 1 (PyTorch's clamp passes the
 *   gradient at the bounds);  ds_c = a_c (da_c - sum_j a_j da_j).
 * The memory after a block is the last S rows of [C; X], rows older than
 * the reference's cache_size set to zero (what the reference no longer has
 * and pads with zeros).
 * Dropout (train_drop.h), while t->drop: `dropout` on the final weights w
 * (after the mask, before they weigh the values) and on the feed-forward's
 * hidden layer after its ReLU, as the reference's SeqAttention and
 * FeedForwardLayer; `emb_dropout` on the embedding's output. The backward
 * recomputes the masks.
 *
 * The end of the file fills the family's train_family: its config keys and
 * recipe, sizes, tensors and their starting values, the spans its progress
 * lines report, and what its checkpoint adds (config, mask templates).
 */
#include "err.h"
#include "st.h"
#include "train.h"
#include "train_drop.h"
#include "train_ops.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum {
    A_X,      /* (L+1) x N x H: every layer's input, and the last output */
    A_HALL,   /* L x B x (S+M) x H */
    A_Q,      /* L x N x H */
    A_K, A_V, /* L x B x (S+M) x H */
    A_PA, A_PW, /* L x B x K x M x S: softmax a, final weights w */
    A_NRM,    /* L x B x K x M: sum b + 1e-8 */
    A_MASK, A_MIN, /* L x K x S: m_c, and whether its clamp passes a gradient */
    A_ATT,    /* L x N x H */
    A_XH1, A_X1, A_XH2, A_R1, A_R2, /* L x N x H; rstd L x N */
    A_FF,     /* L x N x I after the ReLU */
    A_LOGP,   /* N x V */
    /* backward scratch */
    A_DX, A_DY, A_DX1, A_DATT, A_DQ, A_DFF, A_DK, A_DV, A_SC, A_SC2, A_PE,
    A_WIN,    /* L x 2 ints as doubles: window, cache */
    A_N
};

void aspan_window(const trainer *t, int l, int *window, int *cache)
{
    const int S = t->c.attn_span, R = t->c.adapt_span_ramp;
    const double *z = t->w + t->ly[l].zfrac;
    double zmax = 0;
    for (int h = 0; h < t->K; h++) zmax = z[h] > zmax ? z[h] : zmax;
    int cms = (int)ceil(zmax * S) + R;   /* get_current_max_size */
    cms = cms < 0 ? 0 : cms > S ? S : cms;
    int trim = (S - 1 < S - cms ? S - 1 : S - cms) / 64 * 64;
    *window = S - trim;
    *cache = S < S - trim + 64 ? S : S - trim + 64;
}

static int aspan_acts_alloc(trainer *t)
{
    const size_t L = t->L, B = t->B, M = t->M, H = t->H, K = t->K, S = t->c.attn_span, I = t->I, V = t->V,
                 N = B * M, SM = S + M;
    size_t sz[A_N] = {
        [A_X] = (L + 1) * N * H, [A_HALL] = L * B * SM * H, [A_Q] = L * N * H, [A_K] = L * B * SM * H,
        [A_V] = L * B * SM * H, [A_PA] = L * B * K * M * S, [A_PW] = L * B * K * M * S, [A_NRM] = L * B * K * M,
        [A_MASK] = L * K * S, [A_MIN] = L * K * S, [A_ATT] = L * N * H, [A_XH1] = L * N * H, [A_X1] = L * N * H,
        [A_XH2] = L * N * H, [A_R1] = L * N, [A_R2] = L * N, [A_FF] = L * N * I, [A_LOGP] = N * V,
        [A_DX] = N * H, [A_DY] = N * H, [A_DX1] = N * H, [A_DATT] = N * H, [A_DQ] = N * H, [A_DFF] = N * I,
        [A_DK] = B * SM * H, [A_DV] = B * SM * H, [A_SC] = M * SM, [A_SC2] = M * SM, [A_PE] = M * S,
        [A_WIN] = 2 * L,
    };
    for (int i = 0; i < A_N; i++)
        if (acts_add(t, i, sz[i])) return -1;
    t->logp = t->act->b[A_LOGP];
    return 0;
}

/* site S of layer L at rate P this step (none unless t->drop) */
static td_site drop_site(const trainer *t, int s, int l, double p)
{
    return td_make(t->c.seed, t->step, s, l, t->drop ? p : 0);
}

static double aspan_forward(trainer *t, const int32_t *x, const int32_t *y, int backward, int carry, double *aux)
{
    double **A = t->act->b;
    const int L = t->L, B = t->B, M = t->M, H = t->H, K = t->K, D = t->D, S = t->c.attn_span, I = t->I, V = t->V,
              R = t->c.adapt_span_ramp, N = B * M, SM = S + M;
    const double scale = 1.0 / sqrt((double)D);
    double *w = t->w, *g = t->g;
    const double *pe = w + t->key_pe;

    const td_site de = drop_site(t, TD_EMB, 0, t->c.emb_dropout);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++)
            A[A_X][(size_t)n * H + j] = w[t->emb + (size_t)x[n] * H + j] * td_factor(&de, (uint64_t)n * H + j);

    double span_loss = 0;
    for (int l = 0; l < L; l++) {
        const tlayer *ly = &t->ly[l];
        int W, C;
        aspan_window(t, l, &W, &C);
        A[A_WIN][2 * l] = W;
        A[A_WIN][2 * l + 1] = C;
        const double *zf = w + ly->zfrac;
        const td_site da = drop_site(t, TD_ATT, l, t->c.dropout), df = drop_site(t, TD_FF, l, t->c.dropout);
        double zs = 0;
        for (int h = 0; h < K; h++) zs += zf[h];
        span_loss += t->c.adapt_span_loss * S * zs / K;
        double *X = A[A_X] + (size_t)l * N * H, *hall = A[A_HALL] + (size_t)l * B * SM * H,
               *Q = A[A_Q] + (size_t)l * N * H, *Kb = A[A_K] + (size_t)l * B * SM * H,
               *Vb = A[A_V] + (size_t)l * B * SM * H, *pa = A[A_PA] + (size_t)l * B * K * M * S,
               *pw = A[A_PW] + (size_t)l * B * K * M * S, *nrm = A[A_NRM] + (size_t)l * B * K * M,
               *mask = A[A_MASK] + (size_t)l * K * S, *min = A[A_MIN] + (size_t)l * K * S,
               *att = A[A_ATT] + (size_t)l * N * H, *mem = t->mem + (size_t)l * B * S * H;
        for (int h = 0; h < K; h++)
            for (int c = 0; c < W; c++) {
                double xm = (1.0 - (W - c) + zf[h] * S) / R + 1.0;
                mask[h * S + c] = xm < 0 ? 0 : xm > 1 ? 1 : xm;
                min[h * S + c] = xm >= 0 && xm <= 1;
            }
        tops_linear(Q, X, w + ly->wq, NULL, N, H, H);
        for (int b = 0; b < B; b++) {
            double *hb = hall + (size_t)b * SM * H, *kb = Kb + (size_t)b * SM * H, *vb = Vb + (size_t)b * SM * H;
            memcpy(hb, mem + ((size_t)b * S + S - W) * H, (size_t)W * H * sizeof(double));
            memcpy(hb + (size_t)W * H, X + (size_t)b * M * H, (size_t)M * H * sizeof(double));
            tops_linear(kb, hb, w + ly->wk, NULL, W + M, H, H);
            tops_linear(vb, hb, w + ly->wv, NULL, W + M, H, H);
            for (int h = 0; h < K; h++) {
                const double *qh = Q + (size_t)b * M * H + h * D;
                double *sc = A[A_SC], *pp = A[A_PE], *wf = A[A_SC2];
                tops_gemm(0, 1, M, W + M, D, 1.0, qh, H, kb + h * D, H, 0.0, sc, W + M);
                tops_gemm(0, 0, M, W, D, 1.0, qh, H, pe + (S - W), S, 0.0, pp, W);
                memset(wf, 0, (size_t)M * (W + M) * sizeof *wf);
                for (int i = 0; i < M; i++) {
                    double *ai = pa + (((size_t)b * K + h) * M + i) * S, *wi = pw + (((size_t)b * K + h) * M + i) * S;
                    double mx = -INFINITY, z = 0, zb = 0;
                    for (int c = 0; c < W; c++) {
                        ai[c] = (sc[(size_t)i * (W + M) + i + c] + pp[(size_t)i * W + c]) * scale;
                        mx = ai[c] > mx ? ai[c] : mx;
                    }
                    for (int c = 0; c < W; c++) z += ai[c] = exp(ai[c] - mx);
                    for (int c = 0; c < W; c++) {
                        ai[c] /= z;
                        zb += wi[c] = ai[c] * mask[h * S + c];
                    }
                    zb += 1e-8;
                    nrm[((size_t)b * K + h) * M + i] = zb;
                    const uint64_t di = (((uint64_t)b * K + h) * M + i) * S;
                    for (int c = 0; c < W; c++) {
                        wi[c] /= zb;
                        wf[(size_t)i * (W + M) + i + c] = wi[c] * td_factor(&da, di + c);
                    }
                }
                tops_gemm(0, 0, M, D, W + M, 1.0, wf, W + M, vb + h * D, H, 0.0, att + (size_t)b * M * H + h * D, H);
            }
        }
        double *X1 = A[A_X1] + (size_t)l * N * H, *ff = A[A_FF] + (size_t)l * N * I, *Xn = X + (size_t)N * H,
               *tmp = A[A_DY];
        tops_linear(tmp, att, w + ly->wo, NULL, N, H, H);
        for (size_t j = 0; j < (size_t)N * H; j++) tmp[j] += X[j];
        tops_layernorm(X1, A[A_XH1] + (size_t)l * N * H, A[A_R1] + (size_t)l * N, tmp, w + ly->ln1_w, w + ly->ln1_b, N, H);
        tops_linear(ff, X1, w + ly->fc1_w, w + ly->fc1_b, N, H, I);
        for (size_t j = 0; j < (size_t)N * I; j++) ff[j] = ff[j] > 0 ? ff[j] * td_factor(&df, j) : 0;
        tops_linear(tmp, ff, w + ly->fc2_w, w + ly->fc2_b, N, I, H);
        for (size_t j = 0; j < (size_t)N * H; j++) tmp[j] += X1[j];
        tops_layernorm(Xn, A[A_XH2] + (size_t)l * N * H, A[A_R2] + (size_t)l * N, tmp, w + ly->ln2_w, w + ly->ln2_b, N, H);
        if (carry)   /* the last S rows of [memory; X], zeros past cache_size C */
            for (int b = 0; b < B; b++) {
                double *mb = mem + (size_t)b * S * H;
                if (M < S) memmove(mb, mb + (size_t)M * H, (size_t)(S - M) * H * sizeof *mb);
                int k0 = M < S ? M : S;
                memcpy(mb + (size_t)(S - k0) * H, X + ((size_t)b * M + M - k0) * H, (size_t)k0 * H * sizeof *mb);
                memset(mb, 0, (size_t)(S - C) * H * sizeof *mb);
            }
    }
    double *logp = A[A_LOGP], *XL = A[A_X] + (size_t)L * N * H;
    tops_linear(logp, XL, w + t->out_w, w + t->out_b, N, H, V);
    double nll = tops_logsoftmax_nll(logp, y, N, V) / N;
    *aux = span_loss;
    if (!backward) return nll;

    /* ---------------------------------------------------------- backward */
    memset(g, 0, t->n * sizeof *g);
    tops_nll_back(logp, y, N, V, 1.0 / N);
    double *dX = A[A_DX], *dY = A[A_DY], *dX1 = A[A_DX1], *dAtt = A[A_DATT], *dQ = A[A_DQ], *dFF = A[A_DFF];
    tops_linear_back(dX, 0, g + t->out_w, g + t->out_b, logp, XL, w + t->out_w, N, H, V);
    for (int l = L - 1; l >= 0; l--) {
        const tlayer *ly = &t->ly[l];
        const int W = (int)A[A_WIN][2 * l];
        const td_site da = drop_site(t, TD_ATT, l, t->c.dropout), df = drop_site(t, TD_FF, l, t->c.dropout);
        const double *X = A[A_X] + (size_t)l * N * H, *hall = A[A_HALL] + (size_t)l * B * SM * H,
                     *Q = A[A_Q] + (size_t)l * N * H, *Kb = A[A_K] + (size_t)l * B * SM * H,
                     *Vb = A[A_V] + (size_t)l * B * SM * H, *pa = A[A_PA] + (size_t)l * B * K * M * S,
                     *pw = A[A_PW] + (size_t)l * B * K * M * S, *nrm = A[A_NRM] + (size_t)l * B * K * M,
                     *mask = A[A_MASK] + (size_t)l * K * S, *min = A[A_MIN] + (size_t)l * K * S,
                     *att = A[A_ATT] + (size_t)l * N * H, *X1 = A[A_X1] + (size_t)l * N * H,
                     *ff = A[A_FF] + (size_t)l * N * I;
        /* X' = LN2(X1 + FF(X1)) */
        memset(dY, 0, (size_t)N * H * sizeof *dY);
        tops_layernorm_back(dY, g + ly->ln2_w, g + ly->ln2_b, dX, A[A_XH2] + (size_t)l * N * H,
                            A[A_R2] + (size_t)l * N, w + ly->ln2_w, N, H);
        memcpy(dX1, dY, (size_t)N * H * sizeof *dX1);
        tops_linear_back(dFF, 0, g + ly->fc2_w, g + ly->fc2_b, dY, ff, w + ly->fc2_w, N, I, H);
        /* ff > 0: the ReLU passed it and dropout kept it */
        for (size_t j = 0; j < (size_t)N * I; j++) dFF[j] = ff[j] > 0 ? dFF[j] * td_factor(&df, j) : 0;
        tops_linear_back(dX1, 1, g + ly->fc1_w, g + ly->fc1_b, dFF, X1, w + ly->fc1_w, N, H, I);
        /* X1 = LN1(X + att Wo^T) */
        memset(dY, 0, (size_t)N * H * sizeof *dY);
        tops_layernorm_back(dY, g + ly->ln1_w, g + ly->ln1_b, dX1, A[A_XH1] + (size_t)l * N * H,
                            A[A_R1] + (size_t)l * N, w + ly->ln1_w, N, H);
        memcpy(dX, dY, (size_t)N * H * sizeof *dX);   /* the residual */
        tops_linear_back(dAtt, 0, g + ly->wo, NULL, dY, att, w + ly->wo, N, H, H);
        /* attention */
        double *dK = A[A_DK], *dV = A[A_DV], *dzf = g + ly->zfrac, *dpe = g + t->key_pe;
        for (int b = 0; b < B; b++) {
            const double *kb = Kb + (size_t)b * SM * H, *vb = Vb + (size_t)b * SM * H;
            double *dkb = dK + (size_t)b * SM * H, *dvb = dV + (size_t)b * SM * H;
            for (int h = 0; h < K; h++) {
                const double *qh = Q + (size_t)b * M * H + h * D, *doh = dAtt + (size_t)b * M * H + h * D;
                double *dwf = A[A_SC], *wf = A[A_SC2], *dpp = A[A_PE];
                /* the weights again as an M x (W+M) matrix (dropout's
                 * mask applied), for dV = wf^T dO */
                memset(wf, 0, (size_t)M * (W + M) * sizeof *wf);
                for (int i = 0; i < M; i++) {
                    const double *wi = pw + (((size_t)b * K + h) * M + i) * S;
                    const uint64_t di = (((uint64_t)b * K + h) * M + i) * S;
                    for (int c = 0; c < W; c++) wf[(size_t)i * (W + M) + i + c] = wi[c] * td_factor(&da, di + c);
                }
                tops_gemm(1, 0, W + M, D, M, 1.0, wf, W + M, doh, H, 0.0, dvb + h * D, H);
                tops_gemm(0, 1, M, W + M, D, 1.0, doh, H, vb + h * D, H, 0.0, dwf, W + M);
                /* through dropout: the gradient of w before its mask */
                if (da.thresh)
                    for (int i = 0; i < M; i++) {
                        const uint64_t di = (((uint64_t)b * K + h) * M + i) * S;
                        for (int c = 0; c < W; c++) dwf[(size_t)i * (W + M) + i + c] *= td_factor(&da, di + c);
                    }
                /* dwf becomes d(score) in place, wf becomes zero then dS's full form */
                memset(wf, 0, (size_t)M * (W + M) * sizeof *wf);
                for (int i = 0; i < M; i++) {
                    const double *ai = pa + (((size_t)b * K + h) * M + i) * S, *wi = pw + (((size_t)b * K + h) * M + i) * S;
                    const double *dwi = dwf + (size_t)i * (W + M) + i, n = nrm[((size_t)b * K + h) * M + i];
                    double sw = 0, sa = 0, dz = 0;
                    for (int c = 0; c < W; c++) sw += dwi[c] * wi[c];
                    double *ds = dpp + (size_t)i * W;   /* da first, then ds */
                    for (int c = 0; c < W; c++) {
                        double db = (dwi[c] - sw) / n;
                        ds[c] = db * mask[h * S + c];
                        if (min[h * S + c]) dz += db * ai[c];
                        sa += ai[c] * ds[c];
                    }
                    dzf[h] += dz * S / R;
                    for (int c = 0; c < W; c++) {
                        ds[c] = ai[c] * (ds[c] - sa) * scale;
                        wf[(size_t)i * (W + M) + i + c] = ds[c];
                    }
                }
                /* dQ = dS k + dPE pe^T;  dK = dS^T q;  dpe += q^T dPE */
                double *dqh = dQ + (size_t)b * M * H + h * D;
                tops_gemm(0, 0, M, D, W + M, 1.0, wf, W + M, kb + h * D, H, 0.0, dqh, H);
                tops_gemm(0, 1, M, D, W, 1.0, dpp, W, pe + (S - W), S, 1.0, dqh, H);
                tops_gemm(1, 0, W + M, D, M, 1.0, wf, W + M, qh, H, 0.0, dkb + h * D, H);
                tops_gemm(1, 0, D, W, M, 1.0, qh, H, dpp, W, 1.0, dpe + (S - W), S);
            }
        }
        for (int h = 0; h < K; h++) dzf[h] += t->c.adapt_span_loss * S / K;
        tops_linear_back(dX, 1, g + ly->wq, NULL, dQ, X, w + ly->wq, N, H, H);
        for (int b = 0; b < B; b++) {
            const double *hb = hall + (size_t)b * SM * H;
            double *dkb = dK + (size_t)b * SM * H, *dvb = dV + (size_t)b * SM * H;
            /* weights see every row; the input only the block's (memory is detached) */
            tops_gemm(1, 0, H, H, W + M, 1.0, dkb, H, hb, H, 1.0, g + ly->wk, H);
            tops_gemm(1, 0, H, H, W + M, 1.0, dvb, H, hb, H, 1.0, g + ly->wv, H);
            double *dxb = dX + (size_t)b * M * H;
            tops_gemm(0, 0, M, H, H, 1.0, dkb + (size_t)W * H, H, w + ly->wk, H, 1.0, dxb, H);
            tops_gemm(0, 0, M, H, H, 1.0, dvb + (size_t)W * H, H, w + ly->wv, H, 1.0, dxb, H);
        }
    }
    for (int n = 0; n < N; n++) {
        double *ge = g + t->emb + (size_t)x[n] * H;
        for (int j = 0; j < H; j++) ge[j] += dX[(size_t)n * H + j] * td_factor(&de, (uint64_t)n * H + j);
    }
    return nll;
}

/* ------------------------------------------------------------------ the family */

#define F(x) offsetof(train_cfg, x)
#define BIG TRAIN_KEY_BIG
static const train_key aspan_keys[] = {
    {"hidden_size", TK_INT, 1, 65536, 0, F(hidden_size), "H, the model width"},
    {"inner_hidden_size", TK_INT, 1, 1 << 19, 0, F(inner_hidden_size), "the feed-forward width"},
    {"nb_heads", TK_INT, 1, 1024, 0, F(nb_heads), "K heads; H must be a multiple of K"},
    {"nb_layers", TK_INT, 1, 1024, 0, F(nb_layers), "layers"},
    {"attn_span", TK_INT, 1, 1 << 20, 0, F(attn_span), "S, the maximum span"},
    {"block_size", TK_INT, 1, 1 << 20, 0, F(block_size), "M, tokens per block"},
    {"adapt_span_ramp", TK_INT, 1, 1 << 20, 0, F(adapt_span_ramp), "R, the soft mask's ramp"},
    {"adapt_span_loss", TK_REAL, 0, BIG, 0, F(adapt_span_loss), "span loss coefficient: coeff * S * mean(z/S) per layer"},
    {"adapt_span_init", TK_REAL, 0, 1, 0, F(adapt_span_init), "z/S at the start, every head"},
    {"emb_dropout", TK_REAL, 0, 0.99, 0, F(emb_dropout), "dropout rate of the embedding's output (0: none)"},
};

/* aspan-small's recipe */
static void aspan_defaults(train_cfg *c)
{
    c->optim = OPT_ADAGRAD;
    c->lr = 0.07;
    c->lr_warmup = 300;
    c->grad_clip = 0.03;
    c->hidden_size = 128;
    c->inner_hidden_size = 512;
    c->nb_heads = 4;
    c->nb_layers = 4;
    c->attn_span = 512;
    c->block_size = 64;
    c->adapt_span_ramp = 32;
    c->adapt_span_loss = 2e-5;
    c->adapt_span_init = 0;
}

static int aspan_check(const train_cfg *c, char *err)
{
    if (c->hidden_size % c->nb_heads)
        return err_set(err, "config 'hidden_size' = %d is not a multiple of 'nb_heads' = %d", c->hidden_size,
                       c->nb_heads);
    return 0;
}

static int aspan_block_len(const train_cfg *c) { return c->block_size; }

/* the layer's input at the last S positions */
static int aspan_mem_rows(const train_cfg *c) { return c->attn_span; }

static void aspan_setup(trainer *t)
{
    const train_cfg *c = &t->c;
    t->L = c->nb_layers;
    t->H = c->hidden_size;
    t->K = c->nb_heads;
    t->D = t->H / t->K;
    t->I = c->inner_hidden_size;
    t->M = c->block_size;
}

static void aspan_params(trainer *t)
{
    const int V = t->V, H = t->H, K = t->K, I = t->I, S = t->c.attn_span;
    t->emb = train_param_add(t, TP_WEIGHT, -1, -1, 2, V, H, 0, "in_emb.weight");
    t->key_pe = train_param_add(t, TP_WEIGHT, -1, -1, 3, 1, H / K, S, "key_pe");
    t->out_w = train_param_add(t, TP_WEIGHT, -1, -1, 2, V, H, 0, "out_emb.weight");
    t->out_b = train_param_add(t, TP_WEIGHT, -1, -1, 1, V, 0, 0, "out_emb.bias");
    for (int l = 0; l < t->L; l++) {
        tlayer *y = &t->ly[l];
        y->wq = train_param_add(t, TP_WEIGHT, l, -1, 2, H, H, 0, "layers.%d.attn.proj_query.weight", l);
        y->wk = train_param_add(t, TP_WEIGHT, l, -1, 2, H, H, 0, "layers.%d.attn.proj_key.weight", l);
        y->wv = train_param_add(t, TP_WEIGHT, l, -1, 2, H, H, 0, "layers.%d.attn.proj_val.weight", l);
        y->wo = train_param_add(t, TP_WEIGHT, l, -1, 2, H, H, 0, "layers.%d.attn.proj_out.weight", l);
        y->zfrac = train_param_add(t, TP_ZFRAC, l, -1, 3, K, 1, 1, "layers.%d.attn.attn.adaptive_span._mask.current_val", l);
        y->ln1_w = train_param_add(t, TP_WEIGHT, l, -1, 1, H, 0, 0, "layers.%d.norm1.weight", l);
        y->ln1_b = train_param_add(t, TP_WEIGHT, l, -1, 1, H, 0, 0, "layers.%d.norm1.bias", l);
        y->ln2_w = train_param_add(t, TP_WEIGHT, l, -1, 1, H, 0, 0, "layers.%d.norm2.weight", l);
        y->ln2_b = train_param_add(t, TP_WEIGHT, l, -1, 1, H, 0, 0, "layers.%d.norm2.bias", l);
        y->fc1_w = train_param_add(t, TP_WEIGHT, l, -1, 2, I, H, 0, "layers.%d.ff.fc1.weight", l);
        y->fc1_b = train_param_add(t, TP_WEIGHT, l, -1, 1, I, 0, 0, "layers.%d.ff.fc1.bias", l);
        y->fc2_w = train_param_add(t, TP_WEIGHT, l, -1, 2, H, I, 0, "layers.%d.ff.fc2.weight", l);
        y->fc2_b = train_param_add(t, TP_WEIGHT, l, -1, 1, H, 0, 0, "layers.%d.ff.fc2.bias", l);
    }
}


/* PyTorch's defaults of the reference modules: Linear uniform(+-1/sqrt(fan_in))
 * weights and biases; Embedding and key_pe normal(0, 1); current_val
 * adapt_span_init. */
static void aspan_init(const trainer *t, const tparam *p, double *w, train_rng *r)
{
    size_t len = strlen(p->name);
    int is_bias = len > 5 && strcmp(p->name + len - 5, ".bias") == 0;
    if (p->kind == TP_ZFRAC) {
        for (size_t j = 0; j < p->n; j++) w[j] = t->c.adapt_span_init;
    } else if (p->off == t->emb || p->off == t->key_pe) {
        for (size_t j = 0; j < p->n; j++) w[j] = train_rng_normal(r);
    } else {
        /* fan_in: the weight's second dimension, or its layer's */
        const tparam *wt = is_bias ? p - 1 : p;
        double bound = 1.0 / sqrt((double)wt->shape[1]);
        for (size_t j = 0; j < p->n; j++) w[j] = (2.0 * train_rng_unif(r) - 1.0) * bound;
    }
}

/* The span loss, and each layer's spans z = current_val * S: their mean over
 * the heads and the largest. */
static void aspan_progress(const trainer *t, double aux, json_t *o, json_t *history)
{
    (void)history;
    const int S = t->c.attn_span;
    json_object_set_new(o, "span_loss", json_real(aux));
    json_t *sp = json_array();
    for (int l = 0; l < t->L; l++) {
        const double *z = t->w + t->ly[l].zfrac;
        double mean = 0, mx = 0;
        for (int h = 0; h < t->K; h++) {
            mean += z[h] * S / t->K;
            mx = fmax(mx, z[h] * S);
        }
        json_t *e = json_object();
        json_object_set_new(e, "layer", json_integer(l));
        json_object_set_new(e, "mean", json_real(mean));
        json_object_set_new(e, "max", json_real(mx));
        json_array_append_new(sp, e);
    }
    json_object_set_new(o, "spans", sp);
}

/* the reference's config.json */
static void aspan_config_head(const trainer *t, json_t *o)
{
    const train_cfg *c = &t->c;
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "inner_hidden_size", json_integer(c->inner_hidden_size));
    json_object_set_new(o, "nb_heads", json_integer(c->nb_heads));
    json_object_set_new(o, "nb_layers", json_integer(c->nb_layers));
    json_object_set_new(o, "attn_span", json_integer(c->attn_span));
    json_object_set_new(o, "block_size", json_integer(c->block_size));
    json_object_set_new(o, "batch_size", json_integer(c->batch_size));
    json_object_set_new(o, "adapt_span_loss", json_real(c->adapt_span_loss));
    json_object_set_new(o, "adapt_span_ramp", json_integer(c->adapt_span_ramp));
    json_object_set_new(o, "adapt_span_init", json_real(c->adapt_span_init));
    json_object_set_new(o, "lr", json_real(c->lr));
    json_object_set_new(o, "lr_warmup", json_integer(c->lr_warmup));
    json_object_set_new(o, "grad_clip", json_real(c->grad_clip));
    json_object_set_new(o, "dropout", json_real(c->dropout));
    json_object_set_new(o, "emb_dropout", json_real(c->emb_dropout));
}

/* The reference's derived buffer, every layer's: linspace(1-S, 0, S). */
static int aspan_extra_tensors(const trainer *t, st_writer *w, void **keep)
{
    const int S = t->c.attn_span;
    float *tpl = malloc((size_t)S * sizeof *tpl);
    if (!(*keep = tpl)) return -1;
    for (int j = 0; j < S; j++) tpl[j] = (float)(1 - S + j);
    int64_t shape[1] = {S};
    char name[96];
    for (int l = 0; l < t->L; l++) {
        snprintf(name, sizeof name, "layers.%d.attn.attn.adaptive_span._mask.mask_template", l);
        if (st_writer_add(w, name, ST_F32, 1, shape, tpl)) return -1;
    }
    return 0;
}

const train_family train_family_aspan = {
    .name = "adaptive-span",
    .cuda = 1,
    .keys = aspan_keys,
    .n_keys = (int)(sizeof aspan_keys / sizeof *aspan_keys),
    .history_kind = "spans",
    .search = 0,
    .defaults = aspan_defaults,
    .check = aspan_check,
    .block_len = aspan_block_len,
    .mem_rows = aspan_mem_rows,
    .setup = aspan_setup,
    .params = aspan_params,
    .init = aspan_init,
    .acts_alloc = aspan_acts_alloc,
    .forward = aspan_forward,
    .progress = aspan_progress,
    .config_head = aspan_config_head,
    .extra_tensors = aspan_extra_tensors,
};
