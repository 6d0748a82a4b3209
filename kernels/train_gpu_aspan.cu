/*
 * train_gpu_aspan.cu - the adaptive-span family on the CUDA trainer
 * (train_internal.cuh's tg_family): its buffers and its block, in the order
 * of core/train_aspan.c. The attention's products, for windows up to
 * TG_BAND_MAX: on the band alone (train_band.cu; with tf32 or bf16 a
 * layer's scores, softmax and o = w v one tensor-core kernel, and dw, the
 * band's backward and dQ another); wider windows: cuBLAS batched products
 * on the full score matrices, head by head. train_attn.cu has the
 * span-masked band's rows and the memory, train_ops.cu the rest.
 *
 * Dropout (core/train_drop.h, the CPU trainer's masks): `dropout` on the
 * final weights (in the band softmax's weights, again in the backward's,
 * and on the gradient the band's backward reads) and on the hidden layer
 * (in the bias + ReLU; its backward scales what the ReLU passed);
 * `emb_dropout` in the embedding and its backward.
 *
 * Memory: every buffer is allocated once for B streams of M tokens and the
 * longest window S (a layer whose window W is shorter packs its keys,
 * scores and band at W); a step allocates nothing. The largest are the
 * softmax bands kept per layer (L B K M S floats) and the two score
 * buffers of one layer (B K M (S+M) each: full rows, or bands of W).
 */
#include "train_internal.cuh"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* wider windows: cuBLAS's products on the full score matrices were
 * faster (train_band.cu) */
#define TG_BAND_MAX 256

static int aspan_plan(tgpu *g, const trainer *t, char *err)
{
    g->S = t->c.attn_span, g->R = t->c.adapt_span_ramp, g->coeff = t->c.adapt_span_loss;
    g->key_pe = t->key_pe;
    const size_t L = g->L, B = g->B, M = g->M, H = g->H, K = g->K, S = g->S, I = g->I, N = g->N, SMx = S + M,
                 F = sizeof(float);
    g->zoff = (size_t *)calloc(L, sizeof *g->zoff);
    g->win = (int *)calloc(L, sizeof *g->win);
    g->cache = (int *)calloc(L, sizeof *g->cache);
    if (!g->zoff || !g->win || !g->cache) return err_set(err, "out of memory");
    for (size_t l = 0; l < L; l++) g->zoff[l] = t->ly[l].zfrac;
    /* the band's products for windows up to TG_BAND_MAX unless
     * SPANSERVE_TRAIN_BAND_MAX says up to which (0: never) */
    g->band_max = TG_BAND_MAX;
    const char *bm = getenv("SPANSERVE_TRAIN_BAND_MAX");
    if (bm && *bm) {
        char *end;
        const long v = strtol(bm, &end, 10);
        if (*end || v < 0 || v > INT_MAX)
            return err_set(err, "SPANSERVE_TRAIN_BAND_MAX: '%s' is not a window (a count of key rows, 0 or more)", bm);
        g->band_max = (int)v;
    }
    /* SPANSERVE_TRAIN_BAND_TC=0: the band's CUDA-core-shaped tiles (their
     * tensor-core variant in tf32 and bf16) instead of the fused whole-tile
     * kernels; for comparing the two */
    const char *btc = getenv("SPANSERVE_TRAIN_BAND_TC");
    g->band_tc_off = btc && !strcmp(btc, "0");
    g->f2_w = TG_F2_ZERO;   /* tg_alloc's zeros */
    return tg_band_tc_setup(g, err) || tg_alloc(g, &g->hall, F * L * B * SMx * H, err) ||
                   tg_alloc(g, &g->Q, F * L * N * H, err) || tg_alloc(g, &g->Kr, F * L * B * SMx * H, err) ||
                   tg_alloc(g, &g->Vr, F * L * B * SMx * H, err) || tg_alloc(g, &g->A, F * L * B * K * M * S, err) ||
                   tg_alloc(g, &g->nrm, F * L * B * K * M, err) || tg_alloc(g, &g->mask, F * L * K * S, err) ||
                   tg_alloc(g, &g->mskin, F * L * K * S, err) || tg_alloc(g, &g->att, F * L * N * H, err) ||
                   tg_alloc(g, &g->xh1, F * L * N * H, err) || tg_alloc(g, &g->x1, F * L * N * H, err) ||
                   tg_alloc(g, &g->xh2, F * L * N * H, err) || tg_alloc(g, &g->r1, F * L * N, err) ||
                   tg_alloc(g, &g->r2, F * L * N, err) || tg_alloc(g, &g->ff, F * L * N * I, err) ||
                   tg_alloc(g, &g->F1, F * B * K * M * SMx, err) || tg_alloc(g, &g->F2, F * B * K * M * SMx, err) ||
                   tg_alloc(g, &g->PB, F * N * K * S, err) || tg_alloc(g, &g->dX1, F * N * H, err) ||
                   tg_alloc(g, &g->dAtt, F * N * H, err) || tg_alloc(g, &g->dQ, F * N * H, err) ||
                   tg_alloc(g, &g->dFF, F * N * I, err) || tg_alloc(g, &g->dKr, F * B * SMx * H, err) ||
                   tg_alloc(g, &g->dVr, F * B * SMx * H, err) || tg_alloc(g, &g->dzrow, F * B * K * M, err)
               ? -1
               : 0;
}

/* precision bf16: g->bo's copies (train_internal.cuh), planned when bf16 is
 * first set */
static int aspan_plan_bf16(tgpu *g, char *err)
{
    const size_t L = g->L, B = g->B, N = g->N, H = g->H, I = g->I, SMx = (size_t)g->S + g->M, E = sizeof(tbf16);
    size_t *src = (size_t *)calloc(12 * L, sizeof(size_t)), *len = src + 6 * L;
    if (!src) return err_set(err, "out of memory");
    for (size_t l = 0; l < L; l++) {
        const tlayer *ly = &g->ly[l];
        const size_t s6[6] = {ly->wq, ly->wk, ly->wv, ly->wo, ly->fc1_w, ly->fc2_w};
        for (int k = 0; k < 6; k++) src[6 * l + k] = s6[k], len[6 * l + k] = k < 4 ? H * H : I * H;
    }
    tbf16 *w = NULL;
    const int rc = tg_plan_bf16_weights(g, src, len, (int)(6 * L), &w, err) ||
                           tg_alloc(g, &g->bo.X, E * (L + 1) * N * H, err) ||
                           tg_alloc(g, &g->bo.hall, E * L * B * SMx * H, err) ||
                           tg_alloc(g, &g->bo.att, E * L * N * H, err) || tg_alloc(g, &g->bo.x1, E * L * N * H, err) ||
                           tg_alloc(g, &g->bo.ff, E * L * N * I, err) || tg_alloc(g, &g->bo.dY, E * N * H, err) ||
                           tg_alloc(g, &g->bo.dFF, E * N * I, err) || tg_alloc(g, &g->bo.dQ, E * N * H, err) ||
                           tg_alloc(g, &g->bo.dKr, E * B * SMx * H, err) ||
                           tg_alloc(g, &g->bo.dVr, E * B * SMx * H, err)
                       ? -1
                       : 0;
    free(src);
    if (!rc) g->bo.w = w;   /* last: bo.w says the rest is there */
    return rc;
}

/* C = op(A) op(B) + beta C from the bf16 copies AB, BB where both are
 * given, else from the float32 A, B */
static int gemm2(tgpu *g, int ta, int tb, int m, int n, int k, const float *A, const tbf16 *AB, int lda, const float *B,
                 const tbf16 *BB, int ldb, float beta, float *C, int ldc, char *err)
{
    return AB && BB ? tg_gemm_bf(g, ta, tb, m, n, k, 1, AB, lda, BB, ldb, beta, C, ldc, err)
                    : tg_gemm(g, ta, tb, m, n, k, 1, A, lda, B, ldb, beta, C, ldc, err);
}

/* layer l's bf16 operands (all NULL without them) */
typedef struct bf_ops {
    tbf16 *X, *Xn, *hall, *att, *x1, *ff, *dY, *dFF, *dQ, *dKr, *dVr;
    const tbf16 *wq, *wk, *wv, *wo, *fc1, *fc2;
} bf_ops;

static bf_ops layer_bf(const tgpu *g, int l)
{
    bf_ops b16;
    memset(&b16, 0, sizeof b16);
    if (!g->bf16 || !g->bo.w) return b16;
    const size_t N = g->N, H = g->H, I = g->I, SMx = (size_t)g->S + g->M, *off = g->bo.off + 6 * (size_t)l;
    b16.X = g->bo.X + (size_t)l * N * H, b16.Xn = b16.X + N * H, b16.hall = g->bo.hall + (size_t)l * g->B * SMx * H;
    b16.att = g->bo.att + (size_t)l * N * H, b16.x1 = g->bo.x1 + (size_t)l * N * H, b16.ff = g->bo.ff + (size_t)l * N * I;
    b16.dY = g->bo.dY, b16.dFF = g->bo.dFF, b16.dQ = g->bo.dQ, b16.dKr = g->bo.dKr, b16.dVr = g->bo.dVr;
    b16.wq = g->bo.w + off[0], b16.wk = g->bo.w + off[1], b16.wv = g->bo.w + off[2], b16.wo = g->bo.w + off[3];
    b16.fc1 = g->bo.w + off[4], b16.fc2 = g->bo.w + off[5];
    return b16;
}

/* The attention's products, head by head: for head h the B streams' D
 * columns of the row-layout operands (leading dimension H, a stream apart)
 * and its full-score matrices, in one batched product each. Operand X is
 * at X + h * hX, advanced by sX a stream. */
static int heads_gemm(tgpu *g, int ta, int tb, int m, int n, int k, const float *A, int lda, long long sa, size_t ha,
                      const float *B, int ldb, long long sb, size_t hb, float *C, int ldc, long long sc, size_t hc,
                      char *err)
{
    for (int h = 0; h < g->K; h++)
        if (tg_gemm_batched(g, ta, tb, m, n, k, 1, A + h * ha, lda, sa, B + h * hb, ldb, sb, 0, C + h * hc, ldc, sc,
                            g->B, err))
            return -1;
    return 0;
}

/* layer l's dropout sites this step: the attention weights, the hidden layer */
static void layer_sites(const tgpu *g, const trainer *t, int l, td_site *da, td_site *df)
{
    *da = tg_site(g, t, TD_ATT, l, t->c.dropout, (size_t)g->K * g->M * g->S);
    *df = tg_site(g, t, TD_FF, l, t->c.dropout, (size_t)g->M * g->I);
}

static int layer_forward(tgpu *g, const trainer *t, int l, int carry, char *err)
{
    td_site da, df;
    layer_sites(g, t, l, &da, &df);
    const int B = g->B, M = g->M, H = g->H, K = g->K, D = g->D, S = g->S, I = g->I, N = g->N, W = g->win[l],
              SM = W + M;
    const size_t SMx = (size_t)S + M;
    const tlayer *ly = &g->ly[l];
    const float *w = g->w;
    float *X = g->X + (size_t)l * N * H, *Xn = X + (size_t)N * H, *hall = g->hall + (size_t)l * B * SMx * H,
          *Q = g->Q + (size_t)l * N * H, *Kr = g->Kr + (size_t)l * B * SMx * H, *Vr = g->Vr + (size_t)l * B * SMx * H,
          *A = g->A + (size_t)l * B * K * M * S, *nrm = g->nrm + (size_t)l * B * K * M,
          *mask = g->mask + (size_t)l * K * S, *mskin = g->mskin + (size_t)l * K * S, *att = g->att + (size_t)l * N * H,
          *x1 = g->x1 + (size_t)l * N * H, *xh1 = g->xh1 + (size_t)l * N * H, *xh2 = g->xh2 + (size_t)l * N * H,
          *r1 = g->r1 + (size_t)l * N, *r2 = g->r2 + (size_t)l * N, *ff = g->ff + (size_t)l * N * I,
          *mem = g->mem + (size_t)l * B * S * H;
    const long long sq = (long long)M * H, sk = (long long)SM * H, sf = (long long)K * M * SM;
    const size_t hf = (size_t)M * SM;
    const int band = W <= g->band_max, tc = band && tg_band_tc(g, W);
    const bf_ops b16 = layer_bf(g, l);
    /* with bf16 operands the hidden layer's float32 product is scratch
     * (dFF) and only its bf16 copy is kept */
    float *ffp = b16.ff ? g->dFF : ff;
    if (tg_span_mask(g, mask, mskin, w + ly->zfrac, W, err) ||
        /* q = X Wq^T and its pe band */
        gemm2(g, 0, 1, N, H, H, X, b16.X, H, w + ly->wq, b16.wq, H, 0, Q, H, err) ||
        tg_gemm(g, 0, 0, N * K, W, D, 1, Q, D, w + g->key_pe + (S - W), S, 0, g->PB, W, err) ||
        /* k, v of [memory window; X] */
        tg_build_hall(g, hall, b16.hall, mem, X, W, err) ||
        gemm2(g, 0, 1, B * SM, H, H, hall, b16.hall, H, w + ly->wk, b16.wk, H, 0, Kr, H, err) ||
        gemm2(g, 0, 1, B * SM, H, H, hall, b16.hall, H, w + ly->wv, b16.wv, H, 0, Vr, H, err) ||
        /* scores, the masked softmax, o = w v */
        (tc ? tg_band_attend(g, Q, Kr, Vr, g->PB, A, nrm, mask, att, W, da, err)
            : (band ? tg_band_qk(g, tg_band_rows(g, g->F1, W), Q, Kr, W, err)
                    : heads_gemm(g, 0, 1, M, SM, D, Q, H, sq, D, Kr, H, sk, D, g->F1, SM, sf, hf, err)) ||
                  tg_band_softmax(g, g->F1, g->PB, A, nrm, g->F2, mask, W, band, da, err) ||
                  (band ? tg_band_av(g, att, tg_band_rows(g, g->F2, W), Vr, W, err)
                        : heads_gemm(g, 0, 0, M, D, SM, g->F2, SM, sf, hf, Vr, H, sk, D, att, H, sq, D, err))) ||
        (b16.att && tg_to_bf16(g, b16.att, att, (size_t)N * H, err)) ||
        /* X1 = LN1(X + o Wo^T);  X' = LN2(X1 + fc2(relu(fc1(X1)))) */
        gemm2(g, 0, 1, N, H, H, att, b16.att, H, w + ly->wo, b16.wo, H, 0, g->tmp, H, err) ||
        tg_ln_fwd2(g, x1, xh1, r1, b16.x1, g->tmp, NULL, X, w + ly->ln1_w, w + ly->ln1_b, N, H, err) ||
        gemm2(g, 0, 1, N, I, H, x1, b16.x1, H, w + ly->fc1_w, b16.fc1, H, 0, ffp, I, err) ||
        tg_bias_relu2(g, ff, b16.ff, ffp, w + ly->fc1_b, N, I, df, err) ||
        gemm2(g, 0, 1, N, H, I, ff, b16.ff, I, w + ly->fc2_w, b16.fc2, I, 0, g->tmp, H, err) ||
        tg_ln_fwd2(g, Xn, xh2, r2, b16.Xn, g->tmp, w + ly->fc2_b, x1, w + ly->ln2_w, w + ly->ln2_b, N, H, err))
        return -1;
    if (carry && tg_mem_carry(g, l, X, g->cache[l], err)) return -1;
    return 0;
}

static int layer_backward(tgpu *g, const trainer *t, int l, char *err)
{
    td_site da, df;
    layer_sites(g, t, l, &da, &df);
    const int B = g->B, M = g->M, H = g->H, K = g->K, D = g->D, S = g->S, I = g->I, N = g->N, W = g->win[l],
              SM = W + M;
    const size_t SMx = (size_t)S + M;
    const tlayer *ly = &g->ly[l];
    const float *w = g->w;
    float *gg = g->g;
    const float *X = g->X + (size_t)l * N * H, *hall = g->hall + (size_t)l * B * SMx * H,
                *Q = g->Q + (size_t)l * N * H, *Kr = g->Kr + (size_t)l * B * SMx * H,
                *Vr = g->Vr + (size_t)l * B * SMx * H, *A = g->A + (size_t)l * B * K * M * S,
                *nrm = g->nrm + (size_t)l * B * K * M, *mask = g->mask + (size_t)l * K * S,
                *mskin = g->mskin + (size_t)l * K * S, *att = g->att + (size_t)l * N * H,
                *x1 = g->x1 + (size_t)l * N * H, *xh1 = g->xh1 + (size_t)l * N * H,
                *xh2 = g->xh2 + (size_t)l * N * H, *r1 = g->r1 + (size_t)l * N, *r2 = g->r2 + (size_t)l * N,
                *ff = g->ff + (size_t)l * N * I;
    const long long sq = (long long)M * H, sk = (long long)SM * H, sf = (long long)K * M * SM;
    const size_t hf = (size_t)M * SM;
    const int band = W <= g->band_max, tc = band && tg_band_tc(g, W);
    const bf_ops b16 = layer_bf(g, l);
    /* X' = LN2(X1 + FF(X1)): dY (and dX1, which the feed-forward's input
     * gradient adds to), LN2's and fc2_b's gradients in one pass; with bf16
     * operands dY as bf16 alone */
    if (tg_ln_back2(g, b16.dY ? NULL : g->dY, g->dX1, b16.dY, gg + ly->ln2_w, gg + ly->ln2_b, gg + ly->fc2_b, g->dX, xh2,
                    r2, w + ly->ln2_w, N, H, err) ||
        gemm2(g, 1, 0, H, I, N, g->dY, b16.dY, H, ff, b16.ff, I, 1, gg + ly->fc2_w, I, err) ||
        gemm2(g, 0, 0, N, I, H, g->dY, b16.dY, H, w + ly->fc2_w, b16.fc2, I, 0, g->dFF, I, err) ||
        tg_relu_back2(g, g->dFF, b16.dFF, ff, b16.ff, gg + ly->fc1_b, N, I, df.scale, err) ||
        gemm2(g, 1, 0, I, H, N, g->dFF, b16.dFF, I, x1, b16.x1, H, 1, gg + ly->fc1_w, H, err) ||
        gemm2(g, 0, 0, N, H, I, g->dFF, b16.dFF, I, w + ly->fc1_w, b16.fc1, H, 1, g->dX1, H, err) ||
        /* X1 = LN1(X + att Wo^T): dY and dX, which the projections add to */
        tg_ln_back2(g, b16.dY ? NULL : g->dY, g->dX, b16.dY, gg + ly->ln1_w, gg + ly->ln1_b, NULL, g->dX1, xh1, r1,
                    w + ly->ln1_w, N, H, err) ||
        gemm2(g, 1, 0, H, H, N, g->dY, b16.dY, H, att, b16.att, H, 1, gg + ly->wo, H, err) ||
        gemm2(g, 0, 0, N, H, H, g->dY, b16.dY, H, w + ly->wo, b16.wo, H, 0, g->dAtt, H, err) ||
        /* attention: dV = w^T dO, dw = dO V^T, then the band's backward */
        tg_band_weights(g, A, nrm, mask, g->F2, W, band, da, err))
        return -1;
    if (band) {
        /* dS as the pe band (PB) only: dQ = dS K, dK = dS^T Q read it there */
        const tg_band ds = tg_band_pe(g, g->PB, W);
        if (tg_band_tav(g, g->dVr, tg_band_rows(g, g->F2, W), g->dAtt, W, err) ||
            (tc
                 ? tg_band_attend_back(g, g->dAtt, Vr, Kr, A, nrm, mask, mskin, g->PB, g->dzrow, g->dQ, W, da, err)
                 : tg_band_qk(g, tg_band_rows(g, g->F1, W), g->dAtt, Vr, W, err) ||
                       tg_band_back(g, g->F1, A, nrm, mask, mskin, g->F2, g->PB, g->dzrow, W, band, da, err) ||
                       tg_band_av(g, g->dQ, ds, Kr, W, err)) ||
            tg_band_tav(g, g->dKr, ds, Q, W, err))
            return -1;
    } else if (heads_gemm(g, 1, 0, SM, D, M, g->F2, SM, sf, hf, g->dAtt, H, sq, D, g->dVr, H, sk, D, err) ||
               heads_gemm(g, 0, 1, M, SM, D, g->dAtt, H, sq, D, Vr, H, sk, D, g->F1, SM, sf, hf, err) ||
               tg_band_back(g, g->F1, A, nrm, mask, mskin, g->F2, g->PB, g->dzrow, W, band, da, err) ||
               /* dQ = dS K;  dK = dS^T Q */
               heads_gemm(g, 0, 0, M, D, SM, g->F2, SM, sf, hf, Kr, H, sk, D, g->dQ, H, sq, D, err) ||
               heads_gemm(g, 1, 0, SM, D, M, g->F2, SM, sf, hf, Q, H, sq, D, g->dKr, H, sk, D, err))
        return -1;
    if (tg_span_grad(g, gg + ly->zfrac, g->dzrow, err) ||
        /* dQ += dPE pe^T;  dpe += Q^T dPE */
        tg_gemm(g, 0, 1, N * K, D, W, 1, g->PB, W, w + g->key_pe + (S - W), S, 1, g->dQ, D, err) ||
        tg_gemm(g, 1, 0, D, W, N * K, 1, Q, D, g->PB, W, 1, gg + g->key_pe + (S - W), S, err) ||
        /* the projections: weights see every row, the input only the block's
         * (the memory is detached); with bf16 operands dQ, dK and dV as bf16 */
        (b16.dQ && (tg_to_bf16(g, b16.dQ, g->dQ, (size_t)N * H, err) ||
                    tg_to_bf16(g, b16.dKr, g->dKr, (size_t)B * SM * H, err) ||
                    tg_to_bf16(g, b16.dVr, g->dVr, (size_t)B * SM * H, err))) ||
        gemm2(g, 1, 0, H, H, N, g->dQ, b16.dQ, H, X, b16.X, H, 1, gg + ly->wq, H, err) ||
        gemm2(g, 0, 0, N, H, H, g->dQ, b16.dQ, H, w + ly->wq, b16.wq, H, 1, g->dX, H, err) ||
        gemm2(g, 1, 0, H, H, B * SM, g->dKr, b16.dKr, H, hall, b16.hall, H, 1, gg + ly->wk, H, err) ||
        gemm2(g, 1, 0, H, H, B * SM, g->dVr, b16.dVr, H, hall, b16.hall, H, 1, gg + ly->wv, H, err) ||
        (b16.dKr ? tg_gemm_batched_bf(g, 0, 0, M, H, H, 1, b16.dKr + (size_t)W * H, H, (long long)SM * H, b16.wk, H,
                                      0, 1, g->dX, H, (long long)M * H, B, err) ||
                       tg_gemm_batched_bf(g, 0, 0, M, H, H, 1, b16.dVr + (size_t)W * H, H, (long long)SM * H, b16.wv,
                                          H, 0, 1, g->dX, H, (long long)M * H, B, err)
                 : tg_gemm_batched(g, 0, 0, M, H, H, 1, g->dKr + (size_t)W * H, H, (long long)SM * H, w + ly->wk, H,
                                   0, 1, g->dX, H, (long long)M * H, B, err) ||
                       tg_gemm_batched(g, 0, 0, M, H, H, 1, g->dVr + (size_t)W * H, H, (long long)SM * H, w + ly->wv,
                                       H, 0, 1, g->dX, H, (long long)M * H, B, err)))
        return -1;
    return 0;
}


/* the host's part of a step: each layer's window and cache from z/S (the
 * host's mirror), and the span loss */
static double aspan_shapes(tgpu *g, const trainer *t)
{
    double span_loss = 0;
    for (int l = 0; l < g->L; l++) {
        aspan_window(t, l, &g->win[l], &g->cache[l]);
        double zs = 0;
        for (int h = 0; h < g->K; h++) zs += t->w[t->ly[l].zfrac + h];
        span_loss += t->c.adapt_span_loss * g->S * zs / g->K;
    }
    return span_loss;
}

static int aspan_block(tgpu *g, const trainer *t, int backward, int carry, double *aux, char *err)
{
    const int L = g->L, N = g->N, H = g->H, V = g->V;
    const int32_t *dx = g->d_tok, *doff = g->d_tok + 2 * N, *didx = doff + V + 1;
    *aux = aspan_shapes(g, t);
    const td_site de = tg_site(g, t, TD_EMB, 0, t->c.emb_dropout, (size_t)g->M * H);
    if (tg_embed(g, g->X, g->w + g->emb, dx, N, H, 1.0f, de, err)) return -1;
    /* bf16 operands: the weights' copies (the optimizer changed them) and
     * the first layer's input's */
    if (g->bf16 && g->bo.w &&
        (tg_seg_to_bf16(g, g->bo.w, g->w, g->bo.seg, g->bo.nseg, err) ||
         tg_to_bf16(g, g->bo.X, g->X, (size_t)N * H, err)))
        return -1;
    for (int l = 0; l < L; l++)
        if (layer_forward(g, t, l, carry, err)) return -1;
    const float *XL = g->X + (size_t)L * N * H;
    if (tg_loss(g, XL, err)) return -1;
    if (!backward) return 0;
    if (tg_loss_back(g, XL, err)) return -1;
    for (int l = L - 1; l >= 0; l--)
        if (layer_backward(g, t, l, err) || tg_grad_ready(g, l, err)) return -1;
    return tg_embed_back(g, g->g + g->emb, g->dX, doff, didx, V, H, 1.0f, de, err) || tg_grad_ready(g, -1, err) ? -1
                                                                                                                 : 0;
}

const tg_family tg_family_aspan = {&train_family_aspan, aspan_plan, aspan_plan_bf16, aspan_block};
