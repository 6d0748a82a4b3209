/*
 * train_par.c - PAR Transformer-XL's training forward and backward: the
 * search supernet of stochastic blocks, and the fixed model after it.
 *
 * Block l with input X (B x M x D), memory C of its input at the last mlen
 * positions (no gradient through it), mixed by w = softmax((alpha + g)/tau)
 * (g Gumbel noise, one sample per block per step) while searching, one-hot
 * of the fixed arch after:
 *   X' = w_attn LN_a(X + Attn(X)) + w_ffn LN_f(X + FF(X)) + w_skip X
 * Attention (Transformer-XL), cat = [C; X], klen = mlen + M:
 *   q, k, v = split(cat Wqkv^T) (queries of X's rows), r_t = Wr sinusoid(t)
 *   s(i, j) = ((q_i + u) . k_j + (q_i + v) . r_{mlen+i-j}) / sqrt(dh), j <= mlen+i
 *   Attn = softmax(s) v Wo^T
 * Backward of the mixture: dw_k = sum dX' . branch_k, and
 *   dalpha = w (dw - sum_k w_k dw_k) / tau.
 * Memory after a block: the last mem_len rows of cat.
 * Dropout (train_drop.h), while t->drop, at Transformer-XL's sites:
 * `dropout` on the embedding's output, on the sinusoid before r_net (one
 * mask for every block), on the attention's output before the residual,
 * on the feed-forward's hidden layer after its ReLU and on its output (bias
 * included) before the residual, and on the last block's output before the
 * output layer; `dropatt` on the attention probabilities. The backward
 * recomputes the masks.
 *
 * The end of the file fills the family's train_family: its config keys and
 * recipe, sizes, the supernet's tensors and their starting values, the
 * search around the steps (tau, Gumbel noise, the architecture fixed after
 * search_steps), what its progress lines report, and its checkpoint config.
 */
#include "err.h"
#include "train.h"
#include "train_drop.h"
#include "train_ops.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

enum {
    P_X,      /* (L+1) x N x D */
    P_CAT,    /* L x B x KL x D */
    P_QKV,    /* L x B x KL x 3A */
    P_POS,    /* KL x D: sinusoid(t), t = 0..KL-1 */
    P_RK,     /* L x KL x A */
    P_P,      /* L x B x nh x M x KL */
    P_AV,     /* L x N x A */
    P_OA, P_XHA, P_RA, /* L x N x D, rstd L x N */
    P_FF, P_OF, P_XHF, P_RF,
    P_LOGP,
    /* backward scratch */
    P_DX, P_DXN, P_DY, P_DS, P_DAV, P_DFF, P_DQKV, P_DRK, P_QU, P_QV, P_SC, P_SC2, P_DQ,
    P_MLEN,   /* L: the mlen of the forward */
    P_POSD,   /* KL x D: the sinusoid after dropout */
    P_XO,     /* N x D: the last output after dropout */
    P_N
};

static int par_acts_alloc(trainer *t)
{
    const size_t L = t->L, B = t->B, M = t->M, D = t->H, A = t->A, nh = t->K, I = t->I, V = t->V, N = B * M,
                 KL = (size_t)t->c.mem_len + M, dh = t->D;
    size_t sz[P_N] = {
        [P_X] = (L + 1) * N * D, [P_CAT] = L * B * KL * D, [P_QKV] = L * B * KL * 3 * A, [P_POS] = KL * D,
        [P_RK] = L * KL * A, [P_P] = L * B * nh * M * KL, [P_AV] = L * N * A, [P_OA] = L * N * D,
        [P_XHA] = L * N * D, [P_RA] = L * N, [P_FF] = L * N * I, [P_OF] = L * N * D, [P_XHF] = L * N * D,
        [P_RF] = L * N, [P_LOGP] = N * V, [P_DX] = N * D, [P_DXN] = N * D, [P_DY] = N * D, [P_DS] = N * D, [P_DAV] = N * A,
        [P_DFF] = N * I, [P_DQKV] = B * KL * 3 * A, [P_DRK] = KL * A, [P_QU] = M * dh, [P_QV] = M * dh,
        [P_SC] = M * KL, [P_SC2] = M * KL, [P_DQ] = M * dh, [P_MLEN] = L, [P_POSD] = KL * D, [P_XO] = N * D,
    };
    for (int i = 0; i < P_N; i++)
        if (acts_add(t, i, sz[i])) return -1;
    t->logp = t->act->b[P_LOGP];
    /* Transformer-XL's sinusoid: [sin(t f_i), cos(t f_i)], f_i = 1/10000^(2i/D) */
    for (size_t p = 0; p < KL; p++)
        for (size_t i = 0; i < D / 2; i++) {
            double f = 1.0 / pow(10000.0, (2.0 * i) / D);
            t->act->b[P_POS][p * D + i] = sin((double)p * f);
            t->act->b[P_POS][p * D + D / 2 + i] = cos((double)p * f);
        }
    return 0;
}

void par_set_mix(trainer *t, const double *gumbel)
{
    for (int i = 0; i < 3 * t->L; i++) t->gumbel[i] = gumbel ? gumbel[i] : 0.0;
}

void par_fix_arch(trainer *t)
{
    for (int b = 0; b < t->L; b++) t->arch[b] = par_argmax(t->w + t->ly[b].alpha);
    t->searching = 0;
}

void par_mix(const trainer *t, double *mix)
{
    for (int b = 0; b < t->L; b++) {
        double *m = mix + 3 * b;
        if (!t->searching) {
            for (int k = 0; k < 3; k++) m[k] = k == (int)t->arch[b];
            continue;
        }
        const double *a = t->w + t->ly[b].alpha, *gn = t->gumbel + 3 * b;
        double y[3], mx = -INFINITY, z = 0;
        for (int k = 0; k < 3; k++) {
            y[k] = (a[k] + gn[k]) / t->tau;
            mx = y[k] > mx ? y[k] : mx;
        }
        for (int k = 0; k < 3; k++) z += m[k] = exp(y[k] - mx);
        for (int k = 0; k < 3; k++) m[k] /= z;
    }
}

/* site S of layer L at rate P this step (none unless t->drop) */
static td_site drop_site(const trainer *t, int s, int l, double p)
{
    return td_make(t->c.seed, t->step, s, l, t->drop ? p : 0);
}

/* x[j] *= the site's factor of element j, n of them */
static void drop_apply(double *x, const td_site *s, size_t n)
{
    if (s->thresh)
        for (size_t j = 0; j < n; j++) x[j] *= td_factor(s, j);
}

static double par_forward(trainer *t, const int32_t *x, const int32_t *y, int backward, int carry, double *aux)
{
    *aux = 0;   /* no regulariser */
    double **P = t->act->b;
    const int L = t->L, B = t->B, M = t->M, D = t->H, nh = t->K, dh = t->D, A = t->A, I = t->I, V = t->V,
              ML = t->c.mem_len, KL = ML + M, N = B * M;
    const double scale = 1.0 / sqrt((double)dh), esc = sqrt((double)D);
    double *w = t->w, *g = t->g;
    const double *u = w + t->r_w_bias, *vb = w + t->r_r_bias;
    par_mix(t, t->mix);
    const double pd = t->c.dropout;
    const td_site de = drop_site(t, TD_EMB, 0, pd), dpos = drop_site(t, TD_POS, 0, pd), dout = drop_site(t, TD_OUT, 0, pd);

    for (int n = 0; n < N; n++)
        for (int j = 0; j < D; j++)
            P[P_X][(size_t)n * D + j] = w[t->emb + (size_t)x[n] * D + j] * esc * td_factor(&de, (uint64_t)n * D + j);
    memcpy(P[P_POSD], P[P_POS], (size_t)KL * D * sizeof(double));
    drop_apply(P[P_POSD], &dpos, (size_t)KL * D);

    for (int l = 0; l < L; l++) {
        const tlayer *ly = &t->ly[l];
        const double *mix = t->mix + 3 * l;
        const int mlen = t->mlen[l], klen = mlen + M;
        const td_site da = drop_site(t, TD_ATT, l, t->c.dropatt), dao = drop_site(t, TD_AOUT, l, pd),
                      dff = drop_site(t, TD_FF, l, pd), dfo = drop_site(t, TD_FOUT, l, pd);
        P[P_MLEN][l] = mlen;
        double *X = P[P_X] + (size_t)l * N * D, *Xn = X + (size_t)N * D;
        for (size_t j = 0; j < (size_t)N * D; j++) Xn[j] = mix[BLK_SKIP] * X[j];
        double *cat = P[P_CAT] + (size_t)l * B * KL * D, *mem = t->mem + (size_t)l * B * ML * D;
        for (int b = 0; b < B; b++) {
            double *cb = cat + (size_t)b * KL * D;
            memcpy(cb, mem + (size_t)b * ML * D, (size_t)mlen * D * sizeof *cb);
            memcpy(cb + (size_t)mlen * D, X + (size_t)b * M * D, (size_t)M * D * sizeof *cb);
        }
        if (mix[BLK_ATTN] != 0) {
            double *qkv = P[P_QKV] + (size_t)l * B * KL * 3 * A, *rk = P[P_RK] + (size_t)l * KL * A,
                   *pr = P[P_P] + (size_t)l * B * nh * M * KL, *av = P[P_AV] + (size_t)l * N * A,
                   *oa = P[P_OA] + (size_t)l * N * D, *tmp = P[P_DY];
            tops_linear(rk, P[P_POSD], w + ly->rnet, NULL, klen, D, A);
            for (int b = 0; b < B; b++) {
                double *qb = qkv + (size_t)b * KL * 3 * A;
                tops_linear(qb, cat + (size_t)b * KL * D, w + ly->qkv, NULL, klen, D, 3 * A);
                for (int h = 0; h < nh; h++) {
                    double *qu = P[P_QU], *qv = P[P_QV], *ac = P[P_SC], *bd = P[P_SC2];
                    for (int i = 0; i < M; i++)
                        for (int c = 0; c < dh; c++) {
                            double q = qb[(size_t)(mlen + i) * 3 * A + h * dh + c];
                            qu[i * dh + c] = q + u[h * dh + c];
                            qv[i * dh + c] = q + vb[h * dh + c];
                        }
                    tops_gemm(0, 1, M, klen, dh, 1.0, qu, dh, qb + A + h * dh, 3 * A, 0.0, ac, klen);
                    tops_gemm(0, 1, M, klen, dh, 1.0, qv, dh, rk + h * dh, A, 0.0, bd, klen);
                    double *pb = pr + ((size_t)b * nh + h) * M * KL;
                    for (int i = 0; i < M; i++) {
                        const int qi = mlen + i;
                        double *pi = pb + (size_t)i * KL, mx = -INFINITY, z = 0;
                        for (int j = 0; j <= qi; j++) {
                            pi[j] = (ac[(size_t)i * klen + j] + bd[(size_t)i * klen + qi - j]) * scale;
                            mx = pi[j] > mx ? pi[j] : mx;
                        }
                        for (int j = 0; j <= qi; j++) z += pi[j] = exp(pi[j] - mx);
                        for (int j = 0; j <= qi; j++) pi[j] /= z;
                        for (int j = qi + 1; j < klen; j++) pi[j] = 0;
                    }
                    /* the probabilities after dropatt weigh the values (ac is free) */
                    const double *pv = pb;
                    if (da.thresh) {
                        for (int i = 0; i < M; i++)
                            for (int j = 0; j < klen; j++) {
                                const uint64_t di = (((uint64_t)b * nh + h) * M + i) * KL + j;
                                ac[(size_t)i * KL + j] = pb[(size_t)i * KL + j] * td_factor(&da, di);
                            }
                        pv = ac;
                    }
                    tops_gemm(0, 0, M, dh, klen, 1.0, pv, KL, qb + 2 * A + h * dh, 3 * A, 0.0,
                              av + (size_t)b * M * A + h * dh, A);
                }
            }
            tops_linear(tmp, av, w + ly->onet, NULL, N, A, D);
            drop_apply(tmp, &dao, (size_t)N * D);
            for (size_t j = 0; j < (size_t)N * D; j++) tmp[j] += X[j];
            tops_layernorm(oa, P[P_XHA] + (size_t)l * N * D, P[P_RA] + (size_t)l * N, tmp, w + ly->ln1_w,
                           w + ly->ln1_b, N, D);
            for (size_t j = 0; j < (size_t)N * D; j++) Xn[j] += mix[BLK_ATTN] * oa[j];
        }
        if (mix[BLK_FFN] != 0) {
            double *ff = P[P_FF] + (size_t)l * N * I, *of = P[P_OF] + (size_t)l * N * D, *tmp = P[P_DY];
            tops_linear(ff, X, w + ly->fc1_w, w + ly->fc1_b, N, D, I);
            for (size_t j = 0; j < (size_t)N * I; j++) ff[j] = ff[j] > 0 ? ff[j] * td_factor(&dff, j) : 0;
            tops_linear(tmp, ff, w + ly->fc2_w, w + ly->fc2_b, N, I, D);
            drop_apply(tmp, &dfo, (size_t)N * D);
            for (size_t j = 0; j < (size_t)N * D; j++) tmp[j] += X[j];
            tops_layernorm(of, P[P_XHF] + (size_t)l * N * D, P[P_RF] + (size_t)l * N, tmp, w + ly->ln2_w,
                           w + ly->ln2_b, N, D);
            for (size_t j = 0; j < (size_t)N * D; j++) Xn[j] += mix[BLK_FFN] * of[j];
        }
        if (carry && ML > 0) {   /* the last mem_len rows of [memory; X] */
            int keep = klen < ML ? klen : ML;
            for (int b = 0; b < B; b++)
                memcpy(mem + (size_t)b * ML * D, cat + ((size_t)b * KL + klen - keep) * D, (size_t)keep * D * sizeof *mem);
            t->mlen[l] = keep;
        }
    }
    double *logp = P[P_LOGP], *XL = P[P_XO];
    memcpy(XL, P[P_X] + (size_t)L * N * D, (size_t)N * D * sizeof *XL);
    drop_apply(XL, &dout, (size_t)N * D);
    tops_linear(logp, XL, w + t->out_w, w + t->out_b, N, D, V);
    double nll = tops_logsoftmax_nll(logp, y, N, V) / N;
    if (!backward) return nll;

    /* ---------------------------------------------------------- backward */
    memset(g, 0, t->n * sizeof *g);
    tops_nll_back(logp, y, N, V, 1.0 / N);
    double *dX = P[P_DX], *dXn = P[P_DXN], *dY = P[P_DY];
    tops_linear_back(dX, 0, g + t->out_w, g + t->out_b, logp, XL, w + t->out_w, N, D, V);
    drop_apply(dX, &dout, (size_t)N * D);
    for (int l = L - 1; l >= 0; l--) {
        const tlayer *ly = &t->ly[l];
        const double *mix = t->mix + 3 * l, *X = P[P_X] + (size_t)l * N * D;
        const int mlen = (int)P[P_MLEN][l], klen = mlen + M;
        const td_site da = drop_site(t, TD_ATT, l, t->c.dropatt), dao = drop_site(t, TD_AOUT, l, pd),
                      dff = drop_site(t, TD_FF, l, pd), dfo = drop_site(t, TD_FOUT, l, pd);
        double dmix[3] = {0, 0, 0};
        for (size_t j = 0; j < (size_t)N * D; j++) {
            dmix[BLK_SKIP] += dX[j] * X[j];
            dXn[j] = mix[BLK_SKIP] * dX[j];
        }
        if (mix[BLK_FFN] != 0) {
            const double *ff = P[P_FF] + (size_t)l * N * I, *of = P[P_OF] + (size_t)l * N * D;
            double *dFF = P[P_DFF], *dS = P[P_DS];
            for (size_t j = 0; j < (size_t)N * D; j++) {
                dmix[BLK_FFN] += dX[j] * of[j];
                dS[j] = mix[BLK_FFN] * dX[j];
            }
            memset(dY, 0, (size_t)N * D * sizeof *dY);
            tops_layernorm_back(dY, g + ly->ln2_w, g + ly->ln2_b, dS, P[P_XHF] + (size_t)l * N * D,
                                P[P_RF] + (size_t)l * N, w + ly->ln2_w, N, D);
            for (size_t j = 0; j < (size_t)N * D; j++) dXn[j] += dY[j];
            drop_apply(dY, &dfo, (size_t)N * D);   /* the residual took dY before the output's dropout */
            tops_linear_back(dFF, 0, g + ly->fc2_w, g + ly->fc2_b, dY, ff, w + ly->fc2_w, N, I, D);
            /* ff > 0: the ReLU passed it and dropout kept it */
            for (size_t j = 0; j < (size_t)N * I; j++) dFF[j] = ff[j] > 0 ? dFF[j] * td_factor(&dff, j) : 0;
            tops_linear_back(dXn, 1, g + ly->fc1_w, g + ly->fc1_b, dFF, X, w + ly->fc1_w, N, D, I);
        }
        if (mix[BLK_ATTN] != 0) {
            const double *qkv = P[P_QKV] + (size_t)l * B * KL * 3 * A, *rk = P[P_RK] + (size_t)l * KL * A,
                         *pr = P[P_P] + (size_t)l * B * nh * M * KL, *av = P[P_AV] + (size_t)l * N * A,
                         *oa = P[P_OA] + (size_t)l * N * D, *cat = P[P_CAT] + (size_t)l * B * KL * D;
            double *dAV = P[P_DAV], *dQKV = P[P_DQKV], *dRK = P[P_DRK];
            double *dS = P[P_DS];
            for (size_t j = 0; j < (size_t)N * D; j++) {
                dmix[BLK_ATTN] += dX[j] * oa[j];
                dS[j] = mix[BLK_ATTN] * dX[j];
            }
            memset(dY, 0, (size_t)N * D * sizeof *dY);
            tops_layernorm_back(dY, g + ly->ln1_w, g + ly->ln1_b, dS, P[P_XHA] + (size_t)l * N * D,
                                P[P_RA] + (size_t)l * N, w + ly->ln1_w, N, D);
            for (size_t j = 0; j < (size_t)N * D; j++) dXn[j] += dY[j];
            drop_apply(dY, &dao, (size_t)N * D);
            tops_linear_back(dAV, 0, g + ly->onet, NULL, dY, av, w + ly->onet, N, A, D);
            memset(dRK, 0, (size_t)klen * A * sizeof *dRK);
            for (int b = 0; b < B; b++) {
                const double *qb = qkv + (size_t)b * KL * 3 * A;
                double *dqb = dQKV + (size_t)b * KL * 3 * A;
                memset(dqb, 0, (size_t)klen * 3 * A * sizeof *dqb);
                for (int h = 0; h < nh; h++) {
                    const double *pb = pr + ((size_t)b * nh + h) * M * KL, *doh = dAV + (size_t)b * M * A + h * dh;
                    double *qu = P[P_QU], *qv = P[P_QV], *dp = P[P_SC], *dbd = P[P_SC2], *dq = P[P_DQ];
                    for (int i = 0; i < M; i++)
                        for (int c = 0; c < dh; c++) {
                            double q = qb[(size_t)(mlen + i) * 3 * A + h * dh + c];
                            qu[i * dh + c] = q + u[h * dh + c];
                            qv[i * dh + c] = q + vb[h * dh + c];
                        }
                    /* dV = P'^T dO (P' = P after dropatt, made in dbd);  dP' = dO V^T */
                    const double *pv = pb;
                    int pld = KL;
                    if (da.thresh) {
                        for (int i = 0; i < M; i++)
                            for (int j = 0; j < klen; j++)
                                dbd[(size_t)i * klen + j] =
                                    pb[(size_t)i * KL + j] * td_factor(&da, (((uint64_t)b * nh + h) * M + i) * KL + j);
                        pv = dbd;
                        pld = klen;
                    }
                    tops_gemm(1, 0, klen, dh, M, 1.0, pv, pld, doh, A, 0.0, dqb + 2 * A + h * dh, 3 * A);
                    tops_gemm(0, 1, M, klen, dh, 1.0, doh, A, qb + 2 * A + h * dh, 3 * A, 0.0, dp, klen);
                    if (da.thresh)   /* dP = dP' through the mask */
                        for (int i = 0; i < M; i++)
                            for (int j = 0; j < klen; j++)
                                dp[(size_t)i * klen + j] *= td_factor(&da, (((uint64_t)b * nh + h) * M + i) * KL + j);
                    memset(dbd, 0, (size_t)M * klen * sizeof *dbd);
                    for (int i = 0; i < M; i++) {
                        const int qi = mlen + i;
                        const double *pi = pb + (size_t)i * KL;
                        double *dpi = dp + (size_t)i * klen, s = 0;
                        for (int j = 0; j <= qi; j++) s += pi[j] * dpi[j];
                        for (int j = 0; j <= qi; j++) {
                            dpi[j] = pi[j] * (dpi[j] - s) * scale;   /* d(AC) */
                            dbd[(size_t)i * klen + qi - j] = dpi[j];
                        }
                        for (int j = qi + 1; j < klen; j++) dpi[j] = 0;
                    }
                    /* dq = dAC k + dBD r;  dk = dAC^T (q+u);  dr += dBD^T (q+v);  du, dv: sums over queries */
                    tops_gemm(0, 0, M, dh, klen, 1.0, dp, klen, qb + A + h * dh, 3 * A, 0.0, dq, dh);
                    for (int i = 0; i < M; i++)
                        for (int c = 0; c < dh; c++) g[t->r_w_bias + h * dh + c] += dq[i * dh + c];
                    tops_gemm(0, 0, M, dh, klen, 1.0, dbd, klen, rk + h * dh, A, 0.0, qu, dh);   /* qu := dBD r */
                    for (int i = 0; i < M; i++)
                        for (int c = 0; c < dh; c++) {
                            g[t->r_r_bias + h * dh + c] += qu[i * dh + c];
                            dqb[(size_t)(mlen + i) * 3 * A + h * dh + c] = dq[i * dh + c] + qu[i * dh + c];
                        }
                    /* qu was overwritten: dk needs q + u again */
                    for (int i = 0; i < M; i++)
                        for (int c = 0; c < dh; c++) qu[i * dh + c] = qb[(size_t)(mlen + i) * 3 * A + h * dh + c] + u[h * dh + c];
                    tops_gemm(1, 0, klen, dh, M, 1.0, dp, klen, qu, dh, 0.0, dqb + A + h * dh, 3 * A);
                    tops_gemm(1, 0, klen, dh, M, 1.0, dbd, klen, qv, dh, 1.0, dRK + h * dh, A);
                }
                /* weights see every row of cat; the input only the block's (memory is detached) */
                tops_gemm(1, 0, 3 * A, D, klen, 1.0, dqb, 3 * A, cat + (size_t)b * KL * D, D, 1.0, g + ly->qkv, D);
                tops_gemm(0, 0, M, D, 3 * A, 1.0, dqb + (size_t)mlen * 3 * A, 3 * A, w + ly->qkv, D, 1.0,
                          dXn + (size_t)b * M * D, D);
            }
            tops_gemm(1, 0, A, D, klen, 1.0, dRK, A, P[P_POSD], D, 1.0, g + ly->rnet, D);
        }
        if (t->searching) {   /* through the Gumbel-softmax to alpha */
            double s = 0, *ga = g + ly->alpha;
            for (int k = 0; k < 3; k++) s += mix[k] * dmix[k];
            for (int k = 0; k < 3; k++) ga[k] += mix[k] * (dmix[k] - s) / t->tau;
        }
        memcpy(dX, dXn, (size_t)N * D * sizeof *dX);
    }
    for (int n = 0; n < N; n++) {
        double *ge = g + t->emb + (size_t)x[n] * D;
        for (int j = 0; j < D; j++) ge[j] += dX[(size_t)n * D + j] * esc * td_factor(&de, (uint64_t)n * D + j);
    }
    return nll;
}

/* ------------------------------------------------------------------ the family */

#define F(x) offsetof(train_cfg, x)
#define BIG TRAIN_KEY_BIG
static const train_key par_keys[] = {
    {"n_blocks", TK_INT, 1, 1024, 0, F(n_blocks), "stochastic blocks"},
    {"n_head", TK_INT, 1, 1024, 0, F(n_head), "attention heads"},
    {"d_model", TK_INT, 2, 65536, 0, F(d_model), "D, the model width (even)"},
    {"d_head", TK_INT, 1, 65536, 0, F(d_head), "width of a head"},
    {"d_inner", TK_INT, 1, 1 << 19, 0, F(d_inner), "the feed-forward width"},
    {"mem_len", TK_INT, 0, 1 << 20, 0, F(mem_len), "memory rows per attention block"},
    {"tgt_len", TK_INT, 1, 1 << 20, 0, F(tgt_len), "tokens per segment"},
    {"tie_weight", TK_BOOL, 0, 0, 0, F(tie_weight), "the output layer shares the embedding"},
    {"search_steps", TK_LONG, 0, BIG, 0, F(search_steps), "steps of architecture search before the argmax is fixed"},
    {"arch_lr", TK_REAL, 0, BIG, 1, F(arch_lr), "Adam learning rate of alpha (not clipped)"},
    {"tau_start", TK_REAL, 0, BIG, 1, F(tau_start), "Gumbel-softmax temperature at the start of the search"},
    {"tau_end", TK_REAL, 0, BIG, 1, F(tau_end), "temperature at the end: tau = start * (end/start)^(step/search_steps)"},
    {"dropatt", TK_REAL, 0, 0.99, 0, F(dropatt), "dropout rate of the attention probabilities (Transformer-XL's; 0: none)"},
};

/* par-small's recipe */
static void par_defaults(train_cfg *c)
{
    c->optim = OPT_ADAM;
    c->lr = 1e-3;
    c->lr_warmup = 0;
    c->grad_clip = 0.25;
    c->n_blocks = 8;
    c->n_head = 4;
    c->d_model = 128;
    c->d_head = 32;
    c->d_inner = 512;
    c->mem_len = 96;
    c->tgt_len = 48;
    c->tie_weight = 1;
    c->search_steps = 2000;
    c->arch_lr = 3e-3;
    c->tau_start = 1.0;
    c->tau_end = 0.05;
}

static int par_check(const train_cfg *c, char *err)
{
    if (c->d_model % 2) return err_set(err, "config 'd_model' = %d must be even (sinusoid pairs)", c->d_model);
    if ((long long)c->n_head * c->d_head > 65536)
        return err_set(err, "config 'n_head' * 'd_head' = %lld is over 65536", (long long)c->n_head * c->d_head);
    if (c->n_blocks > 1024) return err_set(err, "config 'n_blocks' is over 1024");   /* the loader's bound */
    return 0;
}

static int par_block_len(const train_cfg *c) { return c->tgt_len; }

/* the block's input at the last mem_len positions */
static int par_mem_rows(const train_cfg *c) { return c->mem_len; }

static void par_setup(trainer *t)
{
    const train_cfg *c = &t->c;
    t->L = c->n_blocks;
    t->H = c->d_model;
    t->K = c->n_head;
    t->D = c->d_head;
    t->A = t->K * t->D;
    t->I = c->d_inner;
    t->M = c->tgt_len;
    t->searching = c->search_steps > 0;
    t->tau = c->tau_start;
}

/* The whole search supernet: every block has both branches and its alpha,
 * as the fixture checkpoint does; config.arch says which branch the model
 * uses. */
static void par_params(trainer *t)
{
    const int V = t->V, D = t->H, nh = t->K, dh = t->D, A = t->A, I = t->I;
    t->emb = train_param_add(t, TP_WEIGHT, -1, -1, 2, V, D, 0, "emb.weight");
    t->out_b = train_param_add(t, TP_WEIGHT, -1, -1, 1, V, 0, 0, "out.bias");
    t->out_w = t->c.tie_weight ? t->emb : train_param_add(t, TP_WEIGHT, -1, -1, 2, V, D, 0, "out.weight");
    t->r_w_bias = train_param_add(t, TP_WEIGHT, -1, -1, 2, nh, dh, 0, "r_w_bias");
    t->r_r_bias = train_param_add(t, TP_WEIGHT, -1, -1, 2, nh, dh, 0, "r_r_bias");
    for (int b = 0; b < t->L; b++) {
        tlayer *y = &t->ly[b];
        y->alpha = train_param_add(t, TP_ALPHA, b, -1, 1, 3, 0, 0, "blocks.%d.alpha", b);
        y->qkv = train_param_add(t, TP_WEIGHT, b, BLK_ATTN, 2, 3 * A, D, 0, "blocks.%d.attn.qkv_net.weight", b);
        y->rnet = train_param_add(t, TP_WEIGHT, b, BLK_ATTN, 2, A, D, 0, "blocks.%d.attn.r_net.weight", b);
        y->onet = train_param_add(t, TP_WEIGHT, b, BLK_ATTN, 2, D, A, 0, "blocks.%d.attn.o_net.weight", b);
        y->ln1_w = train_param_add(t, TP_WEIGHT, b, BLK_ATTN, 1, D, 0, 0, "blocks.%d.attn.layer_norm.weight", b);
        y->ln1_b = train_param_add(t, TP_WEIGHT, b, BLK_ATTN, 1, D, 0, 0, "blocks.%d.attn.layer_norm.bias", b);
        y->fc1_w = train_param_add(t, TP_WEIGHT, b, BLK_FFN, 2, I, D, 0, "blocks.%d.ff.CoreNet.0.weight", b);
        y->fc1_b = train_param_add(t, TP_WEIGHT, b, BLK_FFN, 1, I, 0, 0, "blocks.%d.ff.CoreNet.0.bias", b);
        y->fc2_w = train_param_add(t, TP_WEIGHT, b, BLK_FFN, 2, D, I, 0, "blocks.%d.ff.CoreNet.3.weight", b);
        y->fc2_b = train_param_add(t, TP_WEIGHT, b, BLK_FFN, 1, D, 0, 0, "blocks.%d.ff.CoreNet.3.bias", b);
        y->ln2_w = train_param_add(t, TP_WEIGHT, b, BLK_FFN, 1, D, 0, 0, "blocks.%d.ff.layer_norm.weight", b);
        y->ln2_b = train_param_add(t, TP_WEIGHT, b, BLK_FFN, 1, D, 0, 0, "blocks.%d.ff.layer_norm.bias", b);
    }
}


/* The Transformer-XL reference's: weights, embedding, r_w_bias and r_r_bias
 * normal(0, 0.02), biases 0, alpha 0. */
static void par_init(const trainer *t, const tparam *p, double *w, train_rng *r)
{
    size_t len = strlen(p->name);
    int is_bias = len > 5 && strcmp(p->name + len - 5, ".bias") == 0;
    if (p->kind == TP_ALPHA) {
        for (size_t j = 0; j < p->n; j++) w[j] = 0;
    } else {
        for (size_t j = 0; j < p->n; j++) w[j] = is_bias && p->off != t->r_w_bias ? 0.0 : 0.02 * train_rng_normal(r);
    }
}

/* While searching, step S anneals tau = start * (end/start)^(s/search_steps)
 * and draws the Gumbel noise g = -log(-log(u)) of every block. */
static void par_step_begin(trainer *t, long s, train_rng *rng)
{
    const train_cfg *c = &t->c;
    if (!t->searching) return;
    t->tau = c->tau_start * pow(c->tau_end / c->tau_start, (double)s / (double)c->search_steps);
    for (int i = 0; i < 3 * t->L; i++) t->gumbel[i] = -log(-log(train_rng_unif(rng)));
}

/* Evaluation mixes the blocks by softmax(alpha / tau), without noise (the
 * next step draws its own). */
static void par_eval_begin(trainer *t) { par_set_mix(t, NULL); }

/* softmax(alpha) of every block, [attn, ffn, skip] */
static json_t *arch_weights(const trainer *t)
{
    json_t *a = json_array();
    for (int b = 0; b < t->L; b++) {
        const double *al = t->w + t->ly[b].alpha;
        double mx = fmax(al[0], fmax(al[1], al[2])), e[3], z = 0;
        for (int k = 0; k < 3; k++) z += e[k] = exp(al[k] - mx);
        json_t *row = json_array();
        for (int k = 0; k < 3; k++) json_array_append_new(row, json_real(e[k] / z));
        json_array_append_new(a, row);
    }
    return a;
}

/* the architecture the model uses: the fixed one, or argmax(alpha) during the search */
static json_t *arch_names(const trainer *t)
{
    json_t *a = json_array();
    for (int b = 0; b < t->L; b++)
        json_array_append_new(a, json_string(blk_kind_name(t->searching ? par_argmax(t->w + t->ly[b].alpha) : t->arch[b])));
    return a;
}

/* The search ends after step search_steps: the architecture is fixed. */
static json_t *par_step_end(trainer *t, long s)
{
    if (!t->searching || s != t->c.search_steps) return NULL;
    par_fix_arch(t);
    json_t *o = json_object();
    json_object_set_new(o, "event", json_string("arch_fixed"));
    json_object_set_new(o, "step", json_integer(s));
    json_object_set_new(o, "arch", arch_names(t));
    json_object_set_new(o, "arch_weights", arch_weights(t));
    return o;
}

/* The search's state and the architecture; a searching line is also a row
 * [step, tau, softmax(alpha) per block] of the history. */
static void par_progress(const trainer *t, double aux, json_t *o, json_t *history)
{
    (void)aux;
    json_object_set_new(o, "searching", json_boolean(t->searching));
    if (t->searching) json_object_set_new(o, "tau", json_real(t->tau));
    json_object_set_new(o, "arch", arch_names(t));
    json_object_set_new(o, "arch_weights", arch_weights(t));
    if (t->searching) {
        json_t *row = json_array();
        json_array_append_new(row, json_integer(t->step));
        json_array_append_new(row, json_real(t->tau));
        json_array_extend(row, json_object_get(o, "arch_weights"));
        json_array_append_new(history, row);
    }
}

/* the reference's sizes and recipe */
static void par_config_head(const trainer *t, json_t *o)
{
    const train_cfg *c = &t->c;
    json_object_set_new(o, "n_blocks", json_integer(c->n_blocks));
    json_object_set_new(o, "n_head", json_integer(c->n_head));
    json_object_set_new(o, "d_model", json_integer(c->d_model));
    json_object_set_new(o, "d_head", json_integer(c->d_head));
    json_object_set_new(o, "d_inner", json_integer(c->d_inner));
    json_object_set_new(o, "mem_len", json_integer(c->mem_len));
    json_object_set_new(o, "tgt_len", json_integer(c->tgt_len));
    json_object_set_new(o, "batch_size", json_integer(c->batch_size));
    json_object_set_new(o, "lr", json_real(c->lr));
    json_object_set_new(o, "arch_lr", json_real(c->arch_lr));
    json_object_set_new(o, "tau_start", json_real(c->tau_start));
    json_object_set_new(o, "tau_end", json_real(c->tau_end));
    json_object_set_new(o, "search_steps", json_integer(c->search_steps));
    json_object_set_new(o, "dropout", json_real(c->dropout));
    json_object_set_new(o, "dropatt", json_real(c->dropatt));
}

static void par_config_tail(const trainer *t, json_t *o)
{
    json_object_set_new(o, "arch", arch_names(t));
    json_object_set_new(o, "tie_weight", json_boolean(t->c.tie_weight));
}

const train_family train_family_par = {
    .name = "par-transformer-xl",
    .cuda = 1,
    .keys = par_keys,
    .n_keys = (int)(sizeof par_keys / sizeof *par_keys),
    .history_kind = "arch_weights",
    .search = 1,
    .defaults = par_defaults,
    .check = par_check,
    .block_len = par_block_len,
    .mem_rows = par_mem_rows,
    .setup = par_setup,
    .params = par_params,
    .init = par_init,
    .acts_alloc = par_acts_alloc,
    .forward = par_forward,
    .step_begin = par_step_begin,
    .eval_begin = par_eval_begin,
    .step_end = par_step_end,
    .progress = par_progress,
    .config_head = par_config_head,
    .config_tail = par_config_tail,
};
