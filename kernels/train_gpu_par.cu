/*
 * train_gpu_par.cu - PAR Transformer-XL on the CUDA trainer
 * (train_internal.cuh's tg_family): the search supernet's blocks and the
 * fixed model after it, in the order of core/train_par.c, in float32.
 *
 * Block l, input X (N x D), memory C of its input at the last mlen
 * positions, weights w = the host's par_mix (Gumbel-softmax while
 * searching, one-hot after; a branch of weight 0 is not computed):
 *   X' = w_attn LN_a(X + Attn(X)) + w_ffn LN_f(X + FF(X)) + w_skip X
 * Attention over cat = [C; X] (klen = mlen + M rows):
 *   q, k, v = cat Wqkv^T;  r = Wr sinusoid(distance)
 *   s(i, j) = ((q_i + u) . k_j + (q_i + v) . r_{mlen+i-j}) / sqrt(dh), j <= mlen + i
 * The products are cuBLAS products, a head at a time: the content scores
 * batched over the streams, the position scores (r is the same for every
 * stream) one product over all B*M queries; the kernels here build cat,
 * add the two biases, take the softmax over the causal rows and its
 * backward (which also scatters d(position score) back by distance), and
 * the mixture's gradient to alpha:
 *   dalpha_k = w_k (dw_k - sum_j w_j dw_j) / tau,  dw_k = dX' . branch_k.
 * The memory after a block is the last mem_len rows of cat. Every
 * reduction runs in a fixed order: a run repeats itself on one GPU.
 * Dropout (core/train_drop.h, the CPU trainer's masks and sites): the
 * embedding, the sinusoid (once a forward), the attention probabilities
 * (dropatt: a copy after the mask weighs the values; the softmax's
 * backward takes the mask off the gradient), the attention's output, the
 * hidden layer (in the bias + ReLU), the feed-forward's output with its
 * bias, and the last output.
 */
#include "train_internal.cuh"

#include <math.h>
#include <stdlib.h>

static int par_plan(tgpu *g, const trainer *t, char *err)
{
    const int ML = t->c.mem_len;
    g->par.KL = ML + g->M;
    const size_t L = g->L, B = g->B, M = g->M, D = g->H, A = g->AW, nh = g->K, I = g->I, N = g->N,
                 KL = g->par.KL, F = sizeof(float), SC = nh * B * M * KL;
    if (tg_alloc(g, &g->par.cat, F * L * B * KL * D, err) || tg_alloc(g, &g->par.qkv, F * L * B * KL * 3 * A, err) ||
        tg_alloc(g, &g->par.pos, F * KL * D, err) || tg_alloc(g, &g->par.rk, F * L * KL * A, err) ||
        tg_alloc(g, &g->par.P, F * L * SC, err) || tg_alloc(g, &g->par.av, F * L * N * A, err) ||
        tg_alloc(g, &g->par.oa, F * L * N * D, err) || tg_alloc(g, &g->par.xha, F * L * N * D, err) ||
        tg_alloc(g, &g->par.ra, F * L * N, err) || tg_alloc(g, &g->par.ff, F * L * N * I, err) ||
        tg_alloc(g, &g->par.of, F * L * N * D, err) || tg_alloc(g, &g->par.xhf, F * L * N * D, err) ||
        tg_alloc(g, &g->par.rf, F * L * N, err) || tg_alloc(g, &g->par.qu, F * N * A, err) ||
        tg_alloc(g, &g->par.qv, F * N * A, err) || tg_alloc(g, &g->par.S1, F * SC, err) ||
        tg_alloc(g, &g->par.S2, F * SC, err) || tg_alloc(g, &g->par.dXn, F * N * D, err) ||
        tg_alloc(g, &g->par.dS, F * N * D, err) || tg_alloc(g, &g->par.dAV, F * N * A, err) ||
        tg_alloc(g, &g->par.dq1, F * N * A, err) || tg_alloc(g, &g->par.dq2, F * N * A, err) ||
        tg_alloc(g, &g->par.dFF, F * N * I, err) || tg_alloc(g, &g->par.dqkv, F * B * KL * 3 * A, err) ||
        tg_alloc(g, &g->par.dRK, F * KL * A, err) || tg_alloc(g, &g->par.dmix, sizeof(double) * 3, err) ||
        tg_alloc(g, &g->par.posd, F * KL * D, err) || tg_alloc(g, &g->par.xo, F * N * D, err))
        return -1;
    /* Transformer-XL's sinusoid of distance p: [sin(p f_i), cos(p f_i)],
     * f_i = 1/10000^(2i/D), in double as the CPU's, then float */
    float *pos = (float *)malloc(F * KL * D);
    if (!pos) return err_set(err, "out of memory");
    for (size_t p = 0; p < KL; p++)
        for (size_t i = 0; i < D / 2; i++) {
            const double f = 1.0 / pow(10000.0, (2.0 * i) / D);
            pos[p * D + i] = (float)sin((double)p * f);
            pos[p * D + D / 2 + i] = (float)cos((double)p * f);
        }
    cudaError_t e = cudaMemcpyAsync(g->par.pos, pos, F * KL * D, cudaMemcpyHostToDevice, g->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    free(pos);
    CU_TRY(e, err, "sinusoid upload");
    return 0;
}

/* precision bf16: the feed-forward branch's products read bf16 copies of
 * their operands (g->bo): fc1_w and fc2_w of every block (each at 16 bytes'
 * alignment; off[2 l], off[2 l + 1]), the branch's input (X: one block's,
 * cast where it is read), the hidden layer after its ReLU (ff: every
 * block's, its only copy), dY and dFF. The attention's products keep
 * float32 operands rounded on the tensor cores. */
static int par_plan_bf16(tgpu *g, char *err)
{
    const size_t L = g->L, N = g->N, D = g->H, I = g->I, E = sizeof(tbf16);
    size_t *src = (size_t *)calloc(4 * L, sizeof(size_t)), *len = src + 2 * L;
    if (!src) return err_set(err, "out of memory");
    for (size_t l = 0; l < L; l++) {
        src[2 * l] = g->ly[l].fc1_w, src[2 * l + 1] = g->ly[l].fc2_w;
        len[2 * l] = len[2 * l + 1] = I * D;
    }
    tbf16 *w = NULL;
    const int rc = tg_plan_bf16_weights(g, src, len, (int)(2 * L), &w, err) ||
                           tg_alloc(g, &g->bo.X, E * N * D, err) || tg_alloc(g, &g->bo.ff, E * L * N * I, err) ||
                           tg_alloc(g, &g->bo.dY, E * N * D, err) || tg_alloc(g, &g->bo.dFF, E * N * I, err)
                       ? -1
                       : 0;
    free(src);
    if (!rc) g->bo.w = w;   /* last: bo.w says the rest is there */
    return rc;
}

/* block l's bf16 copies: fc1_w, fc2_w and its hidden layer; NULL without them */
static int ffn_bf(const tgpu *g, int l, const tbf16 **fc1, const tbf16 **fc2, tbf16 **ff)
{
    if (!g->bf16 || !g->bo.w) return 0;
    *fc1 = g->bo.w + g->bo.off[2 * l], *fc2 = g->bo.w + g->bo.off[2 * l + 1];
    *ff = g->bo.ff + (size_t)l * g->N * g->I;
    return 1;
}

/* ---- kernels ---- */

/* qu = q + u, qv = q + v for the block's queries (rows mlen.. of each stream's qkv) */
__global__ static void bias_q_kernel(float *qu, float *qv, const float *qkv, const float *u, const float *v,
                                     int M, int A, int KL, int mlen, size_t total)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int c = (int)(i % A);
    const size_t n = i / A, b = n / M, r = n % M;
    const float q = qkv[(b * KL + mlen + r) * 3 * A + c];
    qu[i] = q + u[c];
    qv[i] = q + v[c];
}

/* one block a score row (h, b, i): P_j = softmax over j <= mlen + i of
 * (S1_j + S2_{mlen+i-j}) scale, zeros after */
__global__ static void rel_softmax_kernel(float *P, const float *S1, const float *S2, int M, int KL, int mlen,
                                          float scale)
{
    __shared__ float fs[32];
    __shared__ double ds[32];
    const size_t r = blockIdx.x;
    const int qi = mlen + (int)(r % M);
    const float *ac = S1 + r * KL, *bd = S2 + r * KL;
    float *pr = P + r * KL;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= qi; j += blockDim.x) mx = fmaxf(mx, (ac[j] + bd[qi - j]) * scale);
    mx = block_max(mx, fs);
    double z = 0;
    for (int j = threadIdx.x; j <= qi; j += blockDim.x) {
        const float e = expf((ac[j] + bd[qi - j]) * scale - mx);
        pr[j] = e;
        z += e;
    }
    z = block_sum(z, ds);
    for (int j = threadIdx.x; j < KL; j += blockDim.x) pr[j] = j <= qi ? (float)(pr[j] / z) : 0.0f;
}

/* dropatt's element of score row r = (h B + b) M + i, column j: the CPU's
 * ((b nh + h) M + i) KL + j */
__device__ __forceinline__ uint64_t att_index(size_t r, int j, int B, int nh, int M, int KL)
{
    const size_t i = r % M, b = (r / M) % B, h = r / ((size_t)M * B);
    return (((uint64_t)b * nh + h) * M + i) * KL + j;
}

/* out = P after dropatt, a block a row */
__global__ static void probs_drop_kernel(float *out, const float *P, int B, int nh, int M, int KL, td_site drop)
{
    const size_t r = blockIdx.x;
    for (int j = threadIdx.x; j < KL; j += blockDim.x)
        out[r * KL + j] = P[r * KL + j] * tg_keep(drop, att_index(r, j, B, nh, M, KL));
}

/* the softmax's backward, a block a row: dP' (after dropatt) in S1 ->
 * d(content score) in S1, d(position score) by distance in S2 (zeros past
 * the causal rows) */
__global__ static void rel_softmax_back_kernel(float *S1, float *S2, const float *P, int B, int nh, int M, int KL,
                                               int mlen, float scale, td_site drop)
{
    __shared__ double ds[32];
    const size_t r = blockIdx.x;
    const int qi = mlen + (int)(r % M);
    const float *pr = P + r * KL;
    float *dp = S1 + r * KL, *dbd = S2 + r * KL;
    double s = 0;
    for (int j = threadIdx.x; j <= qi; j += blockDim.x)
        s += (double)pr[j] * (dp[j] * tg_keep(drop, att_index(r, j, B, nh, M, KL)));
    s = block_sum(s, ds);
    for (int j = threadIdx.x; j < KL; j += blockDim.x) {
        if (j <= qi) {
            const float d = (float)(pr[j] * (dp[j] * tg_keep(drop, att_index(r, j, B, nh, M, KL)) - s) * scale);
            dp[j] = d;
            dbd[qi - j] = d;
        } else {
            dp[j] = 0.0f;
            dbd[j] = 0.0f;
        }
    }
}

/* the queries' rows of dqkv: dq = dAC k + dBD r */
__global__ static void dq_kernel(float *dqkv, const float *dq1, const float *dq2, int M, int A, int KL, int mlen,
                                 size_t total)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int c = (int)(i % A);
    const size_t n = i / A, b = n / M, r = n % M;
    dqkv[(b * KL + mlen + r) * 3 * A + c] = dq1[i] + dq2[i];
}

/* alpha's gradient through the Gumbel-softmax: mix w, dmix = dX' . branch */
__global__ static void alpha_grad_kernel(float *ga, const double *dmix, double w0, double w1, double w2, double tau)
{
    const double w[3] = {w0, w1, w2};
    double s = 0;
    for (int k = 0; k < 3; k++) s += w[k] * dmix[k];
    for (int k = 0; k < 3; k++) ga[k] += (float)(w[k] * (dmix[k] - s) / tau);
}

/* ---- the block ---- */

/* cat[b] = [mem[b] rows 0..mlen-1; X[b]; zeros to KL] */
static int build_cat(tgpu *g, float *cat, const float *mem, const float *X, int mlen, char *err)
{
    const size_t B = g->B, M = g->M, D = g->H, KL = g->par.KL, ML = KL - M, F = sizeof(float);
    if (mlen > 0)
        CU_TRY(cudaMemcpy2DAsync(cat, F * KL * D, mem, F * ML * D, F * mlen * D, B, cudaMemcpyDeviceToDevice, g->stream),
               err, "cat memory");
    CU_TRY(cudaMemcpy2DAsync(cat + mlen * D, F * KL * D, X, F * M * D, F * M * D, B, cudaMemcpyDeviceToDevice, g->stream),
           err, "cat block");
    if ((size_t)mlen < ML)
        CU_TRY(cudaMemset2DAsync(cat + (mlen + M) * D, F * KL * D, 0, F * (ML - mlen) * D, B, g->stream), err,
               "cat rest");
    return 0;
}

/* block l's dropout sites this step: the attention's probabilities and
 * output; the feed-forward's hidden layer and output */
static void attn_sites(const tgpu *g, const trainer *t, int l, td_site *da, td_site *dao)
{
    *da = tg_site(g, t, TD_ATT, l, t->c.dropatt, (size_t)g->K * g->M * g->par.KL);
    *dao = tg_site(g, t, TD_AOUT, l, t->c.dropout, (size_t)g->M * g->H);
}

static void ffn_sites(const tgpu *g, const trainer *t, int l, td_site *dff, td_site *dfo)
{
    *dff = tg_site(g, t, TD_FF, l, t->c.dropout, (size_t)g->M * g->I);
    *dfo = tg_site(g, t, TD_FOUT, l, t->c.dropout, (size_t)g->M * g->H);
}

static int attn_forward(tgpu *g, const trainer *t, int l, const float *X, int mlen, char *err)
{
    td_site da, dao;
    attn_sites(g, t, l, &da, &dao);
    const int B = g->B, M = g->M, D = g->H, nh = g->K, dh = g->D, A = g->AW, N = g->N, KL = g->par.KL,
              klen = mlen + M;
    const tlayer *ly = &g->ly[l];
    const float *w = g->w;
    const size_t BMK = (size_t)B * M * KL;
    float *cat = g->par.cat + (size_t)l * B * KL * D, *qkv = g->par.qkv + (size_t)l * B * KL * 3 * A,
          *rk = g->par.rk + (size_t)l * KL * A, *P = g->par.P + (size_t)l * nh * BMK, *av = g->par.av + (size_t)l * N * A,
          *S1 = g->par.S1, *S2 = g->par.S2, *qu = g->par.qu, *qv = g->par.qv;
    const long long sc = (long long)M * KL, sq = (long long)M * A, skv = (long long)KL * 3 * A;
    /* r = Wr sinusoid; q k v of every row of cat */
    if (tg_gemm(g, 0, 1, klen, A, D, 1, g->par.posu, D, w + ly->rnet, D, 0, rk, A, err) ||
        tg_gemm_batched(g, 0, 1, klen, 3 * A, D, 1, cat, D, (long long)KL * D, w + ly->qkv, D, 0, 0, qkv, 3 * A, skv, B,
                        err))
        return -1;
    const size_t nq = (size_t)N * A;
    bias_q_kernel<<<tg_blocks(nq, 256), 256, 0, g->stream>>>(qu, qv, qkv, w + g->r_w_bias, w + g->r_r_bias, M, A, KL,
                                                              mlen, nq);
    LAUNCH_TRY(err, "q biases");
    for (int h = 0; h < nh; h++) {
        const size_t ho = (size_t)h * dh;
        /* (q + u) . k per stream; (q + v) . r for every query at once */
        if (tg_gemm_batched(g, 0, 1, M, klen, dh, 1, qu + ho, A, sq, qkv + A + ho, 3 * A, skv, 0, S1 + h * BMK, KL, sc,
                            B, err) ||
            tg_gemm(g, 0, 1, N, klen, dh, 1, qv + ho, A, rk + ho, A, 0, S2 + h * BMK, KL, err))
            return -1;
    }
    rel_softmax_kernel<<<(unsigned)(nh * (size_t)N), 128, 0, g->stream>>>(P, S1, S2, M, KL, mlen,
                                                                          (float)(1.0 / sqrt((double)dh)));
    LAUNCH_TRY(err, "relative softmax");
    const float *pv = P;   /* the probabilities that weigh the values: after dropatt, in S1 */
    if (da.thresh) {
        probs_drop_kernel<<<(unsigned)(nh * (size_t)N), 128, 0, g->stream>>>(S1, P, B, nh, M, KL, da);
        LAUNCH_TRY(err, "dropatt");
        pv = S1;
    }
    for (int h = 0; h < nh; h++) {
        const size_t ho = (size_t)h * dh;
        if (tg_gemm_batched(g, 0, 0, M, dh, klen, 1, pv + h * BMK, KL, sc, qkv + 2 * A + ho, 3 * A, skv, 0, av + ho, A,
                            sq, B, err))
            return -1;
    }
    /* LN_a(X + drop(av Wo^T)) */
    return tg_gemm(g, 0, 1, N, D, A, 1, av, A, w + ly->onet, A, 0, g->tmp, D, err) ||
                   (dao.thresh && tg_dropout(g, g->tmp, g->tmp, NULL, D, (size_t)N * D, dao, err)) ||
                   tg_ln_fwd(g, g->par.oa + (size_t)l * N * D, g->par.xha + (size_t)l * N * D, g->par.ra + (size_t)l * N,
                             g->tmp, NULL, X, w + ly->ln1_w, w + ly->ln1_b, N, D, err)
               ? -1
               : 0;
}

static int ffn_forward(tgpu *g, const trainer *t, int l, const float *X, char *err)
{
    const int N = g->N, D = g->H, I = g->I;
    const tlayer *ly = &g->ly[l];
    const float *w = g->w;
    float *ff = g->par.ff + (size_t)l * N * I;
    td_site dff, dfo;
    ffn_sites(g, t, l, &dff, &dfo);
    const tbf16 *fc1b = NULL, *fc2b = NULL;
    tbf16 *ffb = NULL;
    if (ffn_bf(g, l, &fc1b, &fc2b, &ffb)) {   /* fc1 into scratch (dFF), the hidden layer as bf16 only */
        if (tg_to_bf16(g, g->bo.X, X, (size_t)N * D, err) ||
            tg_gemm_bf(g, 0, 1, N, I, D, 1, g->bo.X, D, fc1b, D, 0, g->par.dFF, I, err) ||
            tg_bias_relu2(g, NULL, ffb, g->par.dFF, w + ly->fc1_b, N, I, dff, err) ||
            tg_gemm_bf(g, 0, 1, N, D, I, 1, ffb, I, fc2b, I, 0, g->tmp, D, err))
            return -1;
    } else if (tg_gemm(g, 0, 1, N, I, D, 1, X, D, w + ly->fc1_w, D, 0, ff, I, err) ||
               tg_bias_relu(g, ff, w + ly->fc1_b, N, I, dff, err) ||
               tg_gemm(g, 0, 1, N, D, I, 1, ff, I, w + ly->fc2_w, I, 0, g->tmp, D, err))
        return -1;
    /* the output's dropout takes the bias with it; else the LayerNorm adds it */
    return (dfo.thresh && tg_dropout(g, g->tmp, g->tmp, w + ly->fc2_b, D, (size_t)N * D, dfo, err)) ||
                   tg_ln_fwd(g, g->par.of + (size_t)l * N * D, g->par.xhf + (size_t)l * N * D, g->par.rf + (size_t)l * N,
                             g->tmp, dfo.thresh ? NULL : w + ly->fc2_b, X, w + ly->ln2_w, w + ly->ln2_b, N, D, err)
               ? -1
               : 0;
}

static int layer_forward(tgpu *g, const trainer *t, int l, const double *mix, int carry, char *err)
{
    const int B = g->B, M = g->M, D = g->H, N = g->N, KL = g->par.KL, ML = KL - M, mlen = g->mlen[l],
              klen = mlen + M;
    const size_t ND = (size_t)N * D, F = sizeof(float);
    float *X = g->X + (size_t)l * ND, *Xn = X + ND, *cat = g->par.cat + (size_t)l * B * KL * D,
          *mem = g->mem + (size_t)l * B * ML * D;
    g->mlen_fwd[l] = mlen;
    if (tg_axpy(g, Xn, X, (float)mix[BLK_SKIP], ND, 0, err) || build_cat(g, cat, mem, X, mlen, err)) return -1;
    if (mix[BLK_ATTN] != 0 &&
        (attn_forward(g, t, l, X, mlen, err) ||
         tg_axpy(g, Xn, g->par.oa + (size_t)l * ND, (float)mix[BLK_ATTN], ND, 1, err)))
        return -1;
    if (mix[BLK_FFN] != 0 &&
        (ffn_forward(g, t, l, X, err) || tg_axpy(g, Xn, g->par.of + (size_t)l * ND, (float)mix[BLK_FFN], ND, 1, err)))
        return -1;
    if (carry && ML > 0) {   /* the last mem_len rows of [memory; X] */
        const int keep = klen < ML ? klen : ML;
        CU_TRY(cudaMemcpy2DAsync(mem, F * ML * D, cat + (size_t)(klen - keep) * D, F * KL * D, F * keep * D, B,
                                 cudaMemcpyDeviceToDevice, g->stream),
               err, "memory carry");
        g->mlen[l] = keep;
    }
    return 0;
}

/* dX: the gradient of block l's output; into dXn its input's */
static int ffn_backward(tgpu *g, const trainer *t, int l, const float *X, float w_ffn, char *err)
{
    const int N = g->N, D = g->H, I = g->I;
    td_site dff, dfo;
    ffn_sites(g, t, l, &dff, &dfo);
    const tlayer *ly = &g->ly[l];
    const float *w = g->w, *ff = g->par.ff + (size_t)l * N * I;
    float *gg = g->g, *dY = g->dY, *dFF = g->par.dFF;
    if (tg_axpy(g, g->par.dS, g->dX, w_ffn, (size_t)N * D, 0, err) ||
        tg_ln_back(g, dY, gg + ly->ln2_w, gg + ly->ln2_b, g->par.dS, g->par.xhf + (size_t)l * N * D,
                   g->par.rf + (size_t)l * N, w + ly->ln2_w, N, D, err) ||
        tg_axpy(g, g->par.dXn, dY, 1.0f, (size_t)N * D, 1, err) ||
        (dfo.thresh && tg_dropout(g, dY, dY, NULL, D, (size_t)N * D, dfo, err)))
        return -1;
    const tbf16 *fc1b = NULL, *fc2b = NULL;
    tbf16 *ffb = NULL;
    if (ffn_bf(g, l, &fc1b, &fc2b, &ffb))   /* dY, dFF and the input as bf16 copies */
        return tg_to_bf16(g, g->bo.dY, dY, (size_t)N * D, err) ||
                       tg_gemm_bf(g, 1, 0, D, I, N, 1, g->bo.dY, D, ffb, I, 1, gg + ly->fc2_w, I, err) ||
                       tg_colsum(g, gg + ly->fc2_b, dY, NULL, N, D, err) ||
                       tg_gemm_bf(g, 0, 0, N, I, D, 1, g->bo.dY, D, fc2b, I, 0, dFF, I, err) ||
                       tg_relu_back2(g, dFF, g->bo.dFF, NULL, ffb, gg + ly->fc1_b, N, I, dff.scale, err) ||
                       tg_to_bf16(g, g->bo.X, X, (size_t)N * D, err) ||
                       tg_gemm_bf(g, 1, 0, I, D, N, 1, g->bo.dFF, I, g->bo.X, D, 1, gg + ly->fc1_w, D, err) ||
                       tg_gemm_bf(g, 0, 0, N, D, I, 1, g->bo.dFF, I, fc1b, D, 1, g->par.dXn, D, err)
                   ? -1
                   : 0;
    return tg_gemm(g, 1, 0, D, I, N, 1, dY, D, ff, I, 1, gg + ly->fc2_w, I, err) ||
                   tg_colsum(g, gg + ly->fc2_b, dY, NULL, N, D, err) ||
                   tg_gemm(g, 0, 0, N, I, D, 1, dY, D, w + ly->fc2_w, I, 0, dFF, I, err) ||
                   tg_relu_back2(g, dFF, NULL, ff, NULL, gg + ly->fc1_b, N, I, dff.scale, err) ||
                   tg_gemm(g, 1, 0, I, D, N, 1, dFF, I, X, D, 1, gg + ly->fc1_w, D, err) ||
                   tg_gemm(g, 0, 0, N, D, I, 1, dFF, I, w + ly->fc1_w, D, 1, g->par.dXn, D, err)
               ? -1
               : 0;
}

static int attn_backward(tgpu *g, const trainer *t, int l, float w_attn, char *err)
{
    td_site da, dao;
    attn_sites(g, t, l, &da, &dao);
    const int B = g->B, M = g->M, D = g->H, nh = g->K, dh = g->D, A = g->AW, N = g->N, KL = g->par.KL,
              mlen = g->mlen_fwd[l], klen = mlen + M;
    const tlayer *ly = &g->ly[l];
    const float *w = g->w;
    float *gg = g->g, *dY = g->dY, *dAV = g->par.dAV, *dqkv = g->par.dqkv, *dRK = g->par.dRK, *S1 = g->par.S1,
          *S2 = g->par.S2, *qu = g->par.qu, *qv = g->par.qv, *dq1 = g->par.dq1, *dq2 = g->par.dq2;
    const size_t BMK = (size_t)B * M * KL;
    const float *cat = g->par.cat + (size_t)l * B * KL * D, *qkv = g->par.qkv + (size_t)l * B * KL * 3 * A,
                *rk = g->par.rk + (size_t)l * KL * A, *P = g->par.P + (size_t)l * nh * BMK,
                *av = g->par.av + (size_t)l * N * A;
    const long long sc = (long long)M * KL, sq = (long long)M * A, skv = (long long)KL * 3 * A;
    /* through LN_a(X + av Wo^T) */
    if (tg_axpy(g, g->par.dS, g->dX, w_attn, (size_t)N * D, 0, err) ||
        tg_ln_back(g, dY, gg + ly->ln1_w, gg + ly->ln1_b, g->par.dS, g->par.xha + (size_t)l * N * D,
                   g->par.ra + (size_t)l * N, w + ly->ln1_w, N, D, err) ||
        tg_axpy(g, g->par.dXn, dY, 1.0f, (size_t)N * D, 1, err) ||
        (dao.thresh && tg_dropout(g, dY, dY, NULL, D, (size_t)N * D, dao, err)) ||
        tg_gemm(g, 1, 0, D, A, N, 1, dY, D, av, A, 1, gg + ly->onet, A, err) ||
        tg_gemm(g, 0, 0, N, A, D, 1, dY, D, w + ly->onet, A, 0, dAV, A, err))
        return -1;
    CU_TRY(cudaMemsetAsync(dqkv, 0, sizeof(float) * B * KL * 3 * A, g->stream), err, "dqkv reset");
    /* q + u and q + v again (the forward's were overwritten by later layers) */
    const size_t nq = (size_t)N * A;
    bias_q_kernel<<<tg_blocks(nq, 256), 256, 0, g->stream>>>(qu, qv, qkv, w + g->r_w_bias, w + g->r_r_bias, M, A, KL,
                                                              mlen, nq);
    LAUNCH_TRY(err, "q biases");
    const float *pv = P;   /* the probabilities after dropatt, in S2 until the softmax's backward */
    if (da.thresh) {
        probs_drop_kernel<<<(unsigned)(nh * (size_t)N), 128, 0, g->stream>>>(S2, P, B, nh, M, KL, da);
        LAUNCH_TRY(err, "dropatt");
        pv = S2;
    }
    for (int h = 0; h < nh; h++) {
        const size_t ho = (size_t)h * dh;
        /* dV = P'^T dO;  dP' = dO V^T */
        if (tg_gemm_batched(g, 1, 0, klen, dh, M, 1, pv + h * BMK, KL, sc, dAV + ho, A, sq, 0, dqkv + 2 * A + ho, 3 * A,
                            skv, B, err) ||
            tg_gemm_batched(g, 0, 1, M, klen, dh, 1, dAV + ho, A, sq, qkv + 2 * A + ho, 3 * A, skv, 0, S1 + h * BMK, KL,
                            sc, B, err))
            return -1;
    }
    rel_softmax_back_kernel<<<(unsigned)(nh * (size_t)N), 128, 0, g->stream>>>(S1, S2, P, B, nh, M, KL, mlen,
                                                                               (float)(1.0 / sqrt((double)dh)), da);
    LAUNCH_TRY(err, "relative softmax back");
    for (int h = 0; h < nh; h++) {
        const size_t ho = (size_t)h * dh;
        /* dq = dAC k + dBD r;  dk = dAC^T (q + u);  dr = dBD^T (q + v) */
        if (tg_gemm_batched(g, 0, 0, M, dh, klen, 1, S1 + h * BMK, KL, sc, qkv + A + ho, 3 * A, skv, 0, dq1 + ho, A, sq,
                            B, err) ||
            tg_gemm(g, 0, 0, N, dh, klen, 1, S2 + h * BMK, KL, rk + ho, A, 0, dq2 + ho, A, err) ||
            tg_gemm_batched(g, 1, 0, klen, dh, M, 1, S1 + h * BMK, KL, sc, qu + ho, A, sq, 0, dqkv + A + ho, 3 * A, skv,
                            B, err) ||
            tg_gemm(g, 1, 0, klen, dh, N, 1, S2 + h * BMK, KL, qv + ho, A, 0, dRK + ho, A, err))
            return -1;
    }
    /* u and v see every query's dq parts */
    if (tg_colsum(g, gg + g->r_w_bias, dq1, NULL, N, A, err) || tg_colsum(g, gg + g->r_r_bias, dq2, NULL, N, A, err))
        return -1;
    dq_kernel<<<tg_blocks(nq, 256), 256, 0, g->stream>>>(dqkv, dq1, dq2, M, A, KL, mlen, nq);
    LAUNCH_TRY(err, "dq");
    /* Wqkv sees every row of cat (the rows past klen are zeros on both
     * sides); the input only the block's rows (the memory is detached);
     * Wr the sinusoid */
    return tg_gemm(g, 1, 0, 3 * A, D, B * KL, 1, dqkv, 3 * A, cat, D, 1, gg + ly->qkv, D, err) ||
                   tg_gemm_batched(g, 0, 0, M, D, 3 * A, 1, dqkv + (size_t)mlen * 3 * A, 3 * A, skv, w + ly->qkv, D, 0,
                                   1, g->par.dXn, D, (long long)M * D, B, err) ||
                   tg_gemm(g, 1, 0, A, D, klen, 1, dRK, A, g->par.posu, D, 1, gg + ly->rnet, D, err)
               ? -1
               : 0;
}

static int layer_backward(tgpu *g, const trainer *t, int l, const double *mix, char *err)
{
    const int N = g->N, D = g->H;
    const size_t ND = (size_t)N * D;
    const float *X = g->X + (size_t)l * ND;
    double *dmix = g->par.dmix;
    /* the mixture's dot products: only alpha's gradient needs them */
    const int search = t->searching;
    if (search) CU_TRY(cudaMemsetAsync(dmix, 0, sizeof(double) * 3, g->stream), err, "dmix reset");
    if ((search && tg_dot(g, dmix + BLK_SKIP, g->dX, X, ND, err)) ||
        tg_axpy(g, g->par.dXn, g->dX, (float)mix[BLK_SKIP], ND, 0, err))
        return -1;
    if (mix[BLK_FFN] != 0 && ((search && tg_dot(g, dmix + BLK_FFN, g->dX, g->par.of + (size_t)l * ND, ND, err)) ||
                              ffn_backward(g, t, l, X, (float)mix[BLK_FFN], err)))
        return -1;
    if (mix[BLK_ATTN] != 0 && ((search && tg_dot(g, dmix + BLK_ATTN, g->dX, g->par.oa + (size_t)l * ND, ND, err)) ||
                               attn_backward(g, t, l, (float)mix[BLK_ATTN], err)))
        return -1;
    if (search) {
        alpha_grad_kernel<<<1, 1, 0, g->stream>>>(g->g + g->ly[l].alpha, dmix, mix[0], mix[1], mix[2], t->tau);
        LAUNCH_TRY(err, "alpha gradient");
    }
    /* the next layer down takes dXn as its output's gradient */
    float *s = g->dX;
    g->dX = g->par.dXn;
    g->par.dXn = s;
    return 0;
}

static int par_block(tgpu *g, const trainer *t, int backward, int carry, double *aux, char *err)
{
    const int L = g->L, N = g->N, D = g->H, V = g->V;
    const int32_t *dx = g->d_tok, *doff = g->d_tok + 2 * N, *didx = doff + V + 1;
    const float esc = (float)sqrt((double)D);
    double mix[3 * 1024];   /* n_blocks <= 1024 (train_par.c's check) */
    *aux = 0;
    par_mix(t, mix);
    const td_site de = tg_site(g, t, TD_EMB, 0, t->c.dropout, (size_t)g->M * D),
                  dpos = tg_site(g, t, TD_POS, 0, t->c.dropout, 0),
                  dout = tg_site(g, t, TD_OUT, 0, t->c.dropout, (size_t)g->M * D);
    const size_t ND = (size_t)N * D;
    g->par.posu = g->par.pos;
    if (dpos.thresh) {   /* one mask of the sinusoid for every block */
        if (tg_dropout(g, g->par.posd, g->par.pos, NULL, D, (size_t)g->par.KL * D, dpos, err)) return -1;
        g->par.posu = g->par.posd;
    }
    if (tg_embed(g, g->X, g->w + g->emb, dx, N, D, esc, de, err)) return -1;
    /* bf16 operands: the feed-forward weights' copies (the optimizer changed them) */
    if (g->bf16 && g->bo.w && tg_seg_to_bf16(g, g->bo.w, g->w, g->bo.seg, g->bo.nseg, err)) return -1;
    for (int l = 0; l < L; l++)
        if (layer_forward(g, t, l, mix + 3 * l, carry, err)) return -1;
    const float *XL = g->X + (size_t)L * N * D;
    if (dout.thresh) {
        if (tg_dropout(g, g->par.xo, XL, NULL, D, ND, dout, err)) return -1;
        XL = g->par.xo;
    }
    if (tg_loss(g, XL, err)) return -1;
    if (!backward) return 0;
    if (tg_loss_back(g, XL, err) || (dout.thresh && tg_dropout(g, g->dX, g->dX, NULL, D, ND, dout, err))) return -1;
    for (int l = L - 1; l >= 0; l--)
        if (layer_backward(g, t, l, mix + 3 * l, err) || tg_grad_ready(g, l, err)) return -1;
    return tg_embed_back(g, g->g + g->emb, g->dX, doff, didx, V, D, esc, de, err) || tg_grad_ready(g, -1, err) ? -1
                                                                                                                : 0;
}

const tg_family tg_family_par = {&train_family_par, par_plan, par_plan_bf16, par_block};
