/*
 * train_gpu.cu - the CUDA trainer of the adaptive-span family
 * (train_gpu.h): the plan of the device buffers, the transfers between the
 * host trainer's double arenas and the device's float ones, and the step:
 * forward with the activations kept, loss, backward into the gradient
 * arena, and the optimizer. The order of operations is core/train_aspan.c's;
 * train_ops.cu and train_attn.cu have the kernels.
 *
 * Memory: every buffer is allocated once in tgpu_new for B streams of M
 * tokens and the longest window S (a layer whose window W is shorter packs
 * its keys, scores and band at W); a step allocates nothing. The largest
 * are the softmax bands kept per layer (L B K M S floats) and the two full
 * score matrices of one layer (B K M (S+M) each).
 */
#include "train_internal.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int dev_alloc(tgpu *g, void *pp, size_t bytes, char *err)
{
    void **p = (void **)pp;
    if (g->n_allocs >= (int)(sizeof g->allocs / sizeof *g->allocs)) return err_set(err, "too many device buffers");
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess)
        return err_set(err, "cudaMalloc of %.1f MB (%.1f MB planned before it): %s", bytes / 1e6, g->bytes / 1e6,
                       cudaGetErrorString(e));
    g->allocs[g->n_allocs++] = *p;
    g->bytes += bytes;
    CU_TRY(cudaMemsetAsync(*p, 0, bytes ? bytes : 16, g->stream), err, "cudaMemset");
    return 0;
}

int tgpu_available(char *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return err_set(err, "no CUDA device: %s", cudaGetErrorString(e));
    if (n == 0) return err_set(err, "no CUDA device");
    return 0;
}

int tgpu_set_tf32(tgpu *g, int on, char *err)
{
    BLAS_TRY(cublasSetMathMode(g->blas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), err, "math mode");
    return 0;
}

size_t tgpu_bytes(const tgpu *g) { return g->bytes; }
const char *tgpu_device_name(const tgpu *g) { return g->device; }

void tgpu_free(tgpu *g)
{
    if (!g) return;
    if (g->stream) cudaStreamSynchronize(g->stream);
    for (int i = 0; i < g->n_allocs; i++) cudaFree(g->allocs[i]);
    if (g->h_tok) cudaFreeHost(g->h_tok);
    if (g->blas) cublasDestroy(g->blas);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g->zoff);
    free(g->ly);
    free(g->win);
    free(g->cache);
    free(g);
}

/* the optimizer's chunks: each tensor cut into pieces of TG_OPT_CHUNK */
static int plan_optimizer(tgpu *g, const trainer *t, char *err)
{
    int nc = 0;
    for (int i = 0; i < t->n_tp; i++) nc += (int)((t->tp[i].n + TG_OPT_CHUNK - 1) / TG_OPT_CHUNK);
    g->n_chunk = nc;
    g->n_tp = t->n_tp;
    int *ck_t = (int *)malloc(sizeof(int) * nc), *ck_len = (int *)malloc(sizeof(int) * nc),
        *first = (int *)malloc(sizeof(int) * t->n_tp), *nck = (int *)malloc(sizeof(int) * t->n_tp),
        *kind = (int *)malloc(sizeof(int) * t->n_tp);
    size_t *ck_off = (size_t *)malloc(sizeof(size_t) * nc);
    int rc = -1;
    if (!ck_t || !ck_len || !first || !nck || !kind || !ck_off) { err_set(err, "out of memory"); goto out; }
    nc = 0;
    for (int i = 0; i < t->n_tp; i++) {
        const tparam *p = &t->tp[i];
        first[i] = nc;
        kind[i] = (int)p->kind;
        for (size_t o = 0; o < p->n; o += TG_OPT_CHUNK) {
            ck_t[nc] = i;
            ck_off[nc] = p->off + o;
            ck_len[nc] = (int)(p->n - o < TG_OPT_CHUNK ? p->n - o : TG_OPT_CHUNK);
            nc++;
        }
        nck[i] = nc - first[i];
    }
    if (dev_alloc(g, &g->ck_t, sizeof(int) * nc, err) || dev_alloc(g, &g->ck_len, sizeof(int) * nc, err) ||
        dev_alloc(g, &g->ck_off, sizeof(size_t) * nc, err) || dev_alloc(g, &g->tp_first, sizeof(int) * t->n_tp, err) ||
        dev_alloc(g, &g->tp_nck, sizeof(int) * t->n_tp, err) || dev_alloc(g, &g->tp_kind, sizeof(int) * t->n_tp, err) ||
        dev_alloc(g, &g->ck_part, sizeof(double) * nc, err) || dev_alloc(g, &g->tp_scale, sizeof(double) * t->n_tp, err))
        goto out;
    /* the zeroing memsets run on g->stream, which does not wait for the default stream's copies */
    if (cudaStreamSynchronize(g->stream) != cudaSuccess ||
        cudaMemcpy(g->ck_t, ck_t, sizeof(int) * nc, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(g->ck_len, ck_len, sizeof(int) * nc, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(g->ck_off, ck_off, sizeof(size_t) * nc, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(g->tp_first, first, sizeof(int) * t->n_tp, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(g->tp_nck, nck, sizeof(int) * t->n_tp, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(g->tp_kind, kind, sizeof(int) * t->n_tp, cudaMemcpyHostToDevice) != cudaSuccess) {
        err_set(err, "copying the optimizer's plan to the device failed");
        goto out;
    }
    rc = 0;
out:
    free(ck_t);
    free(ck_len);
    free(first);
    free(nck);
    free(kind);
    free(ck_off);
    return rc;
}

tgpu *tgpu_new(const trainer *t, char *err)
{
    if (t->c.fam != &train_family_aspan) {
        err_set(err, "the CUDA trainer covers the adaptive-span family only");
        return NULL;
    }
    if (tgpu_available(err)) return NULL;
    tgpu *g = (tgpu *)calloc(1, sizeof *g);
    if (!g) { err_set(err, "out of memory"); return NULL; }
    g->L = t->L, g->B = t->B, g->M = t->M, g->H = t->H, g->K = t->K, g->D = t->D, g->I = t->I, g->V = t->V;
    g->S = t->c.attn_span, g->R = t->c.adapt_span_ramp, g->N = t->B * t->M;
    g->coeff = t->c.adapt_span_loss, g->optim = t->c.optim, g->grad_clip = t->c.grad_clip;
    g->beta1 = t->c.beta1, g->beta2 = t->c.beta2, g->adam_eps = t->c.adam_eps;
    g->n = t->n;
    g->emb = t->emb, g->key_pe = t->key_pe, g->out_w = t->out_w, g->out_b = t->out_b;
    const size_t L = g->L, B = g->B, M = g->M, H = g->H, K = g->K, S = g->S, I = g->I, V = g->V, N = g->N,
                 SMx = S + M, F = sizeof(float);
    size_t maxc = H > I ? H : I;
    maxc = maxc > V ? maxc : V;
    g->zoff = (size_t *)calloc(L, sizeof *g->zoff);
    g->ly = (tlayer *)calloc(L, sizeof *g->ly);
    g->win = (int *)calloc(L, sizeof *g->win);
    g->cache = (int *)calloc(L, sizeof *g->cache);
    if (!g->zoff || !g->ly || !g->win || !g->cache) { err_set(err, "out of memory"); goto fail; }
    for (size_t l = 0; l < L; l++) g->ly[l] = t->ly[l], g->zoff[l] = t->ly[l].zfrac;
    {
        cudaDeviceProp p;
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
            err_set(err, "cudaGetDeviceProperties failed");
            goto fail;
        }
        snprintf(g->device, sizeof g->device, "%s", p.name);
    }
    if (cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) != cudaSuccess) {
        err_set(err, "cudaStreamCreate failed");
        goto fail;
    }
    if (cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(g->blas, g->stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
        err_set(err, "cuBLAS could not be initialised");
        goto fail;
    }
    if (dev_alloc(g, &g->w, F * g->n, err) || dev_alloc(g, &g->g, F * g->n, err) ||
        dev_alloc(g, &g->m1, F * g->n, err) || dev_alloc(g, &g->m2, F * g->n, err) ||
        dev_alloc(g, &g->mem, F * L * B * S * H, err) || dev_alloc(g, &g->mem_keep, F * L * B * S * H, err) ||
        dev_alloc(g, &g->mem_tmp, F * B * S * H, err) || dev_alloc(g, &g->X, F * (L + 1) * N * H, err) ||
        dev_alloc(g, &g->hall, F * L * B * SMx * H, err) || dev_alloc(g, &g->Q, F * L * N * H, err) ||
        dev_alloc(g, &g->Kr, F * L * B * SMx * H, err) || dev_alloc(g, &g->Vr, F * L * B * SMx * H, err) ||
        dev_alloc(g, &g->A, F * L * B * K * M * S, err) || dev_alloc(g, &g->nrm, F * L * B * K * M, err) ||
        dev_alloc(g, &g->mask, F * L * K * S, err) || dev_alloc(g, &g->mskin, F * L * K * S, err) ||
        dev_alloc(g, &g->att, F * L * N * H, err) || dev_alloc(g, &g->xh1, F * L * N * H, err) ||
        dev_alloc(g, &g->x1, F * L * N * H, err) || dev_alloc(g, &g->xh2, F * L * N * H, err) ||
        dev_alloc(g, &g->r1, F * L * N, err) || dev_alloc(g, &g->r2, F * L * N, err) ||
        dev_alloc(g, &g->ff, F * L * N * I, err) || dev_alloc(g, &g->logp, F * N * V, err) ||
        dev_alloc(g, &g->nll, F * N, err) || dev_alloc(g, &g->F1, F * B * K * M * SMx, err) ||
        dev_alloc(g, &g->F2, F * B * K * M * SMx, err) || dev_alloc(g, &g->PB, F * N * K * S, err) ||
        dev_alloc(g, &g->tmp, F * N * H, err) ||
        dev_alloc(g, &g->dX, F * N * H, err) || dev_alloc(g, &g->dY, F * N * H, err) ||
        dev_alloc(g, &g->dX1, F * N * H, err) || dev_alloc(g, &g->dAtt, F * N * H, err) ||
        dev_alloc(g, &g->dQ, F * N * H, err) || dev_alloc(g, &g->dFF, F * N * I, err) ||
        dev_alloc(g, &g->dKr, F * B * SMx * H, err) || dev_alloc(g, &g->dVr, F * B * SMx * H, err) ||
        dev_alloc(g, &g->dzrow, F * B * K * M, err) ||
        dev_alloc(g, &g->colpart, sizeof(double) * TG_COL_CHUNKS * maxc, err) ||
        dev_alloc(g, &g->dsum, sizeof(double) * 4, err) ||
        dev_alloc(g, &g->d_tok, sizeof(int32_t) * (3 * N + V + 1), err))
        goto fail;
    if (cudaMallocHost((void **)&g->h_tok, sizeof(int32_t) * (3 * N + V + 1)) != cudaSuccess) {
        err_set(err, "cudaMallocHost failed");
        goto fail;
    }
    if (plan_optimizer(g, t, err) || tgpu_set_tf32(g, t->c.tf32, err) || tgpu_upload(g, t, err)) goto fail;
    return g;
fail:
    tgpu_free(g);
    return NULL;
}

/* ---- transfers: doubles on the host, floats on the device, through a
 * bounded staging buffer ---- */

#define TG_STAGE (1u << 20)

static int up(tgpu *g, float *dst, const double *src, size_t n, char *err)
{
    float *buf = (float *)malloc(sizeof(float) * (n < TG_STAGE ? (n ? n : 1) : TG_STAGE));
    if (!buf) return err_set(err, "out of memory");
    for (size_t o = 0; o < n; o += TG_STAGE) {
        size_t k = n - o < TG_STAGE ? n - o : TG_STAGE;
        for (size_t i = 0; i < k; i++) buf[i] = (float)src[o + i];
        cudaError_t e = cudaMemcpyAsync(dst + o, buf, k * sizeof(float), cudaMemcpyHostToDevice, g->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
        if (e != cudaSuccess) { free(buf); return err_set(err, "upload: %s", cudaGetErrorString(e)); }
    }
    free(buf);
    return 0;
}

static int down(tgpu *g, double *dst, const float *src, size_t n, char *err)
{
    float *buf = (float *)malloc(sizeof(float) * (n < TG_STAGE ? (n ? n : 1) : TG_STAGE));
    if (!buf) return err_set(err, "out of memory");
    for (size_t o = 0; o < n; o += TG_STAGE) {
        size_t k = n - o < TG_STAGE ? n - o : TG_STAGE;
        cudaError_t e = cudaMemcpyAsync(buf, src + o, k * sizeof(float), cudaMemcpyDeviceToHost, g->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
        if (e != cudaSuccess) { free(buf); return err_set(err, "download: %s", cudaGetErrorString(e)); }
        for (size_t i = 0; i < k; i++) dst[o + i] = buf[i];
    }
    free(buf);
    return 0;
}

static size_t mem_n(const tgpu *g) { return (size_t)g->L * g->B * g->S * g->H; }

int tgpu_upload(tgpu *g, const trainer *t, char *err)
{
    return up(g, g->w, t->w, g->n, err) || up(g, g->m1, t->m1, g->n, err) || up(g, g->m2, t->m2, g->n, err) ||
                   up(g, g->mem, t->mem, mem_n(g), err)
               ? -1
               : 0;
}

int tgpu_download(tgpu *g, trainer *t, char *err)
{
    return down(g, t->w, g->w, g->n, err) || down(g, t->m1, g->m1, g->n, err) || down(g, t->m2, g->m2, g->n, err) ||
                   down(g, t->mem, g->mem, mem_n(g), err)
               ? -1
               : 0;
}

int tgpu_download_grad(tgpu *g, double *grad, char *err) { return down(g, grad, g->g, g->n, err); }
int tgpu_download_memory(tgpu *g, double *mem, char *err) { return down(g, mem, g->mem, mem_n(g), err); }

int tgpu_reset_memory(tgpu *g, char *err)
{
    CU_TRY(cudaMemsetAsync(g->mem, 0, sizeof(float) * mem_n(g), g->stream), err, "memory reset");
    return 0;
}

int tgpu_stash_memory(tgpu *g, int restore, char *err)
{
    float *dst = restore ? g->mem : g->mem_keep, *src = restore ? g->mem_keep : g->mem;
    CU_TRY(cudaMemcpyAsync(dst, src, sizeof(float) * mem_n(g), cudaMemcpyDeviceToDevice, g->stream), err,
           "memory stash");
    return 0;
}

/* ---- the step ---- */

/* x, y and, for the embedding's backward, the rows of each token id
 * (a counting sort), in one transfer */
static int upload_tokens(tgpu *g, const int32_t *x, const int32_t *y, char *err)
{
    const int N = g->N, V = g->V;
    int32_t *hx = g->h_tok, *hy = hx + N, *off = hy + N, *idx = off + V + 1;
    memcpy(hx, x, sizeof(int32_t) * N);
    memcpy(hy, y, sizeof(int32_t) * N);
    memset(off, 0, sizeof(int32_t) * (V + 1));
    for (int n = 0; n < N; n++) off[x[n] + 1]++;
    for (int v = 0; v < V; v++) off[v + 1] += off[v];
    for (int n = 0; n < N; n++) idx[off[x[n]]++] = n;
    for (int v = V; v > 0; v--) off[v] = off[v - 1];
    off[0] = 0;
    CU_TRY(cudaMemcpyAsync(g->d_tok, g->h_tok, sizeof(int32_t) * (3 * N + V + 1), cudaMemcpyHostToDevice, g->stream),
           err, "token upload");
    return 0;
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

static int layer_forward(tgpu *g, int l, int carry, char *err)
{
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
    if (tg_span_mask(g, mask, mskin, w + ly->zfrac, W, err) ||
        /* q = X Wq^T and its pe band */
        tg_gemm(g, 0, 1, N, H, H, 1, X, H, w + ly->wq, H, 0, Q, H, err) ||
        tg_gemm(g, 0, 0, N * K, W, D, 1, Q, D, w + g->key_pe + (S - W), S, 0, g->PB, W, err) ||
        /* k, v of [memory window; X] */
        tg_build_hall(g, hall, mem, X, W, err) ||
        tg_gemm(g, 0, 1, B * SM, H, H, 1, hall, H, w + ly->wk, H, 0, Kr, H, err) ||
        tg_gemm(g, 0, 1, B * SM, H, H, 1, hall, H, w + ly->wv, H, 0, Vr, H, err) ||
        /* scores, the masked softmax, o = w v */
        heads_gemm(g, 0, 1, M, SM, D, Q, H, sq, D, Kr, H, sk, D, g->F1, SM, sf, hf, err) ||
        tg_band_softmax(g, g->F1, g->PB, A, nrm, g->F2, mask, W, err) ||
        heads_gemm(g, 0, 0, M, D, SM, g->F2, SM, sf, hf, Vr, H, sk, D, att, H, sq, D, err) ||
        /* X1 = LN1(X + o Wo^T);  X' = LN2(X1 + fc2(relu(fc1(X1)))) */
        tg_gemm(g, 0, 1, N, H, H, 1, att, H, w + ly->wo, H, 0, g->tmp, H, err) ||
        tg_ln_fwd(g, x1, xh1, r1, g->tmp, NULL, X, w + ly->ln1_w, w + ly->ln1_b, N, H, err) ||
        tg_gemm(g, 0, 1, N, I, H, 1, x1, H, w + ly->fc1_w, H, 0, ff, I, err) ||
        tg_bias_relu(g, ff, w + ly->fc1_b, N, I, err) ||
        tg_gemm(g, 0, 1, N, H, I, 1, ff, I, w + ly->fc2_w, I, 0, g->tmp, H, err) ||
        tg_ln_fwd(g, Xn, xh2, r2, g->tmp, w + ly->fc2_b, x1, w + ly->ln2_w, w + ly->ln2_b, N, H, err))
        return -1;
    if (carry && tg_mem_carry(g, mem, X, g->cache[l], err)) return -1;
    return 0;
}

static int layer_backward(tgpu *g, int l, char *err)
{
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
    const size_t NH = sizeof(float) * N * H, hf = (size_t)M * SM;
    /* X' = LN2(X1 + FF(X1)) */
    if (tg_ln_back(g, g->dY, gg + ly->ln2_w, gg + ly->ln2_b, g->dX, xh2, r2, w + ly->ln2_w, N, H, err)) return -1;
    CU_TRY(cudaMemcpyAsync(g->dX1, g->dY, NH, cudaMemcpyDeviceToDevice, g->stream), err, "copy");
    if (tg_gemm(g, 1, 0, H, I, N, 1, g->dY, H, ff, I, 1, gg + ly->fc2_w, I, err) ||
        tg_colsum(g, gg + ly->fc2_b, g->dY, NULL, N, H, err) ||
        tg_gemm(g, 0, 0, N, I, H, 1, g->dY, H, w + ly->fc2_w, I, 0, g->dFF, I, err) ||
        tg_relu_back(g, g->dFF, ff, (size_t)N * I, err) ||
        tg_gemm(g, 1, 0, I, H, N, 1, g->dFF, I, x1, H, 1, gg + ly->fc1_w, H, err) ||
        tg_colsum(g, gg + ly->fc1_b, g->dFF, NULL, N, I, err) ||
        tg_gemm(g, 0, 0, N, H, I, 1, g->dFF, I, w + ly->fc1_w, H, 1, g->dX1, H, err) ||
        /* X1 = LN1(X + att Wo^T) */
        tg_ln_back(g, g->dY, gg + ly->ln1_w, gg + ly->ln1_b, g->dX1, xh1, r1, w + ly->ln1_w, N, H, err))
        return -1;
    CU_TRY(cudaMemcpyAsync(g->dX, g->dY, NH, cudaMemcpyDeviceToDevice, g->stream), err, "copy");
    if (tg_gemm(g, 1, 0, H, H, N, 1, g->dY, H, att, H, 1, gg + ly->wo, H, err) ||
        tg_gemm(g, 0, 0, N, H, H, 1, g->dY, H, w + ly->wo, H, 0, g->dAtt, H, err) ||
        /* attention: dV = w^T dO, dw = dO V^T, then the band's backward */
        tg_band_weights(g, A, nrm, mask, g->F2, W, err) ||
        heads_gemm(g, 1, 0, SM, D, M, g->F2, SM, sf, hf, g->dAtt, H, sq, D, g->dVr, H, sk, D, err) ||
        heads_gemm(g, 0, 1, M, SM, D, g->dAtt, H, sq, D, Vr, H, sk, D, g->F1, SM, sf, hf, err) ||
        tg_band_back(g, g->F1, A, nrm, mask, mskin, g->F2, g->PB, g->dzrow, W, err) ||
        tg_span_grad(g, gg + ly->zfrac, g->dzrow, err) ||
        /* dQ = dS K + dPE pe^T;  dK = dS^T Q;  dpe += Q^T dPE */
        heads_gemm(g, 0, 0, M, D, SM, g->F2, SM, sf, hf, Kr, H, sk, D, g->dQ, H, sq, D, err) ||
        heads_gemm(g, 1, 0, SM, D, M, g->F2, SM, sf, hf, Q, H, sq, D, g->dKr, H, sk, D, err) ||
        tg_gemm(g, 0, 1, N * K, D, W, 1, g->PB, W, w + g->key_pe + (S - W), S, 1, g->dQ, D, err) ||
        tg_gemm(g, 1, 0, D, W, N * K, 1, Q, D, g->PB, W, 1, gg + g->key_pe + (S - W), S, err) ||
        /* the projections: weights see every row, the input only the block's
         * (the memory is detached) */
        tg_gemm(g, 1, 0, H, H, N, 1, g->dQ, H, X, H, 1, gg + ly->wq, H, err) ||
        tg_gemm(g, 0, 0, N, H, H, 1, g->dQ, H, w + ly->wq, H, 1, g->dX, H, err) ||
        tg_gemm(g, 1, 0, H, H, B * SM, 1, g->dKr, H, hall, H, 1, gg + ly->wk, H, err) ||
        tg_gemm(g, 1, 0, H, H, B * SM, 1, g->dVr, H, hall, H, 1, gg + ly->wv, H, err) ||
        tg_gemm_batched(g, 0, 0, M, H, H, 1, g->dKr + (size_t)W * H, H, (long long)SM * H, w + ly->wk, H, 0, 1,
                        g->dX, H, (long long)M * H, B, err) ||
        tg_gemm_batched(g, 0, 0, M, H, H, 1, g->dVr + (size_t)W * H, H, (long long)SM * H, w + ly->wv, H, 0, 1,
                        g->dX, H, (long long)M * H, B, err))
        return -1;
    return 0;
}

double tgpu_forward(tgpu *g, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                    double *aux, char *err)
{
    const int L = g->L, N = g->N, H = g->H, V = g->V, K = g->K, S = g->S;
    const int32_t *dx = g->d_tok, *dy = g->d_tok + N, *doff = g->d_tok + 2 * N, *didx = doff + V + 1;
    double span_loss = 0, nll = 0;
    for (int l = 0; l < L; l++) {
        aspan_window(t, l, &g->win[l], &g->cache[l]);
        double zs = 0;
        for (int h = 0; h < K; h++) zs += t->w[t->ly[l].zfrac + h];
        span_loss += t->c.adapt_span_loss * S * zs / K;
    }
    if (upload_tokens(g, x, y, err) || tg_embed(g, g->X, g->w + g->emb, dx, N, H, err)) return NAN;
    for (int l = 0; l < L; l++)
        if (layer_forward(g, l, carry, err)) return NAN;
    float *XL = g->X + (size_t)L * N * H;
    if (tg_gemm(g, 0, 1, N, V, H, 1, XL, H, g->w + g->out_w, H, 0, g->logp, V, err) ||
        tg_xent(g, g->logp, g->nll, g->w + g->out_b, dy, N, V, err) || tg_sum(g, g->dsum, g->nll, N, err))
        return NAN;
    if (backward) {
        float *gg = g->g;
        if (cudaMemsetAsync(gg, 0, sizeof(float) * g->n, g->stream) != cudaSuccess) {
            err_set(err, "gradient reset failed");
            return NAN;
        }
        if (tg_xent_back(g, g->logp, dy, N, V, 1.0f / N, err) ||
            tg_gemm(g, 1, 0, V, H, N, 1, g->logp, V, XL, H, 1, gg + g->out_w, H, err) ||
            tg_colsum(g, gg + g->out_b, g->logp, NULL, N, V, err) ||
            tg_gemm(g, 0, 0, N, H, V, 1, g->logp, V, g->w + g->out_w, H, 0, g->dX, H, err))
            return NAN;
        for (int l = L - 1; l >= 0; l--)
            if (layer_backward(g, l, err)) return NAN;
        if (tg_embed_back(g, gg + g->emb, g->dX, doff, didx, V, H, err)) return NAN;
    }
    cudaError_t e = cudaMemcpyAsync(&nll, g->dsum, sizeof nll, cudaMemcpyDeviceToHost, g->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    if (e != cudaSuccess) {
        err_set(err, "training step: %s", cudaGetErrorString(e));
        return NAN;
    }
    if (aux) *aux = span_loss;
    nll /= N;
    if (!isfinite(nll)) err_set(err, "the loss is not finite (%g): the learning rate may be too high", nll);
    return nll;
}

int tgpu_step(tgpu *g, trainer *t, double lr, char *err)
{
    t->step++;
    if (tg_optim(g, lr, t->step, err)) return -1;
    float z[64];
    for (int l = 0; l < g->L; l++)
        for (int h0 = 0; h0 < g->K; h0 += 64) {
            const int k = g->K - h0 < 64 ? g->K - h0 : 64;
            CU_TRY(cudaMemcpyAsync(z, g->w + g->zoff[l] + h0, sizeof(float) * k, cudaMemcpyDeviceToHost, g->stream),
                   err, "z download");
            CU_TRY(cudaStreamSynchronize(g->stream), err, "optimizer step");
            for (int h = 0; h < k; h++) t->w[g->zoff[l] + h0 + h] = z[h];
        }
    return 0;
}

/* ---- the table train_run drives ---- */

static void *dev_open(const trainer *t, char *err) { return tgpu_new(t, err); }
static void dev_close(void *ctx) { tgpu_free((tgpu *)ctx); }
static double dev_forward(void *ctx, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                          double *aux, char *err)
{
    return tgpu_forward((tgpu *)ctx, t, x, y, backward, carry, aux, err);
}
static int dev_step(void *ctx, trainer *t, double lr, char *err) { return tgpu_step((tgpu *)ctx, t, lr, err); }
static int dev_reset(void *ctx, char *err) { return tgpu_reset_memory((tgpu *)ctx, err); }
static int dev_stash(void *ctx, int restore, char *err) { return tgpu_stash_memory((tgpu *)ctx, restore, err); }
static int dev_download(void *ctx, trainer *t, char *err) { return tgpu_download((tgpu *)ctx, t, err); }
static const char *dev_name(void *ctx) { return tgpu_device_name((tgpu *)ctx); }

const train_device tgpu_train_device = {"cuda", dev_open, dev_close, dev_forward, dev_step,
                                        dev_reset, dev_stash, dev_download, dev_name};
