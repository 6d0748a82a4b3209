/*
 * train_gpu.cu - the CUDA trainer (train_gpu.h): the plan of the shared
 * device buffers, the transfers between the host trainer's double arenas
 * and the device's float ones, and the step: the family's block (forward
 * with the activations kept, loss, backward into the gradient arena:
 * train_gpu_aspan.cu, train_gpu_par.cu), the optimizer, and the values the
 * host mirrors (z/S, alpha). train_ops.cu and train_attn.cu have the
 * kernels.
 *
 * Every buffer is allocated once in tgpu_new; a step allocates nothing.
 */
#include "train_internal.cuh"

#ifdef SPANSERVE_NCCL
#include <nccl.h>
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

int tg_alloc(tgpu *g, void *pp, size_t bytes, char *err)
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

int tgpu_set_bf16(tgpu *g, int on, char *err)
{
    if (on && g->fam->plan_bf16 && !g->bo.w && g->fam->plan_bf16(g, err)) return -1;
    g->bf16 = on;
    return 0;
}

int tgpu_set_tf32(tgpu *g, int on, char *err)
{
    BLAS_TRY(cublasSetMathMode(g->blas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), err, "math mode");
    g->tf32 = on;
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
    if (g->h_mirror) cudaFreeHost(g->h_mirror);
    if (g->h_sum) cudaFreeHost(g->h_sum);
    if (g->cstream) cudaStreamDestroy(g->cstream);
    if (g->ev_grad) cudaEventDestroy(g->ev_grad);
    if (g->ev_comm) cudaEventDestroy(g->ev_comm);
    free(g->bk_lo);
    free(g->bk_hi);
    free(g->rest_lo);
    free(g->rest_hi);
    if (g->blas) cublasDestroy(g->blas);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g->zoff);
    free(g->bo.off);
    free(g->ly);
    free(g->win);
    free(g->cache);
    free(g->mlen);
    free(g->mlen_keep);
    free(g->mlen_fwd);
    free(g->mem_live);
    free(g->mem_live_keep);
    free(g->h_act);
    free(g->h_mir_off);
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
    if (tg_alloc(g, &g->ck_t, sizeof(int) * nc, err) || tg_alloc(g, &g->ck_len, sizeof(int) * nc, err) ||
        tg_alloc(g, &g->ck_off, sizeof(size_t) * nc, err) || tg_alloc(g, &g->tp_first, sizeof(int) * t->n_tp, err) ||
        tg_alloc(g, &g->tp_nck, sizeof(int) * t->n_tp, err) || tg_alloc(g, &g->tp_kind, sizeof(int) * t->n_tp, err) ||
        tg_alloc(g, &g->ck_part, sizeof(double) * nc, err) || tg_alloc(g, &g->tp_scale, sizeof(double) * t->n_tp, err) ||
        tg_alloc(g, &g->tp_act, sizeof(int) * t->n_tp, err))
        goto out;
    /* every tensor starts "left alone" on both sides: the first step uploads what it trains */
    if (!(g->h_act = (int *)calloc(t->n_tp, sizeof(int)))) { err_set(err, "out of memory"); goto out; }
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

/* the elements of z/S and alpha, which the host reads between steps */
static int plan_mirror(tgpu *g, const trainer *t, char *err)
{
    int n = 0;
    for (int i = 0; i < t->n_tp; i++)
        if (t->tp[i].kind != TP_WEIGHT) n += (int)t->tp[i].n;
    g->n_mirror = n;
    if (!(g->h_mir_off = (size_t *)calloc(n ? n : 1, sizeof(size_t)))) return err_set(err, "out of memory");
    n = 0;
    for (int i = 0; i < t->n_tp; i++)
        if (t->tp[i].kind != TP_WEIGHT)
            for (size_t j = 0; j < t->tp[i].n; j++) g->h_mir_off[n++] = t->tp[i].off + j;
    if (tg_alloc(g, &g->mir_off, sizeof(size_t) * (n ? n : 1), err) || tg_alloc(g, &g->mirror, sizeof(float) * (n ? n : 1), err))
        return -1;
    if (cudaMallocHost((void **)&g->h_mirror, sizeof(float) * (n ? n : 1)) != cudaSuccess)
        return err_set(err, "cudaMallocHost failed");
    CU_TRY(cudaMemcpyAsync(g->mir_off, g->h_mir_off, sizeof(size_t) * n, cudaMemcpyHostToDevice, g->stream), err,
           "mirror plan");
    CU_TRY(cudaStreamSynchronize(g->stream), err, "mirror plan");
    return 0;
}

/* the gradient's buckets: each layer's tensors when they are one run of the
 * arena, and the runs of the tensors of no layer; else one bucket, the whole
 * arena, at the end */
static int plan_buckets(tgpu *g, const trainer *t, char *err)
{
    const int L = t->L;
    g->bk_lo = (size_t *)calloc(L, sizeof(size_t));
    g->bk_hi = (size_t *)calloc(L, sizeof(size_t));
    g->rest_lo = (size_t *)calloc(t->n_tp + 1, sizeof(size_t));
    g->rest_hi = (size_t *)calloc(t->n_tp + 1, sizeof(size_t));
    if (!g->bk_lo || !g->bk_hi || !g->rest_lo || !g->rest_hi) return err_set(err, "out of memory");
    g->buckets = 1;
    for (int l = 0; l < L; l++) {
        size_t lo = (size_t)-1, hi = 0;
        for (int i = 0; i < t->n_tp; i++)
            if (t->tp[i].layer == l) {
                lo = t->tp[i].off < lo ? t->tp[i].off : lo;
                hi = t->tp[i].off + t->tp[i].n > hi ? t->tp[i].off + t->tp[i].n : hi;
            }
        if (hi == 0) g->buckets = 0;
        /* one run of its own: no other tensor inside (the alignment's gaps are zeros) */
        for (int i = 0; i < t->n_tp; i++)
            if (t->tp[i].layer != l && t->tp[i].off < hi && t->tp[i].off + t->tp[i].n > lo) g->buckets = 0;
        g->bk_lo[l] = lo, g->bk_hi[l] = hi;
    }
    /* the tensors of no layer, in arena order, adjacent ones merged */
    g->n_rest = 0;
    for (size_t at = 0;;) {
        int next = -1;
        for (int i = 0; i < t->n_tp; i++)
            if (t->tp[i].layer < 0 && t->tp[i].off >= at && (next < 0 || t->tp[i].off < t->tp[next].off)) next = i;
        if (next < 0) break;
        const tparam *p = &t->tp[next];
        /* merged with the run before when nothing but the alignment's gap lies between */
        int between = 0;
        for (int i = 0; g->n_rest && i < t->n_tp; i++)
            if (t->tp[i].layer >= 0 && t->tp[i].off >= g->rest_hi[g->n_rest - 1] && t->tp[i].off < p->off) between = 1;
        if (g->n_rest && !between) g->rest_hi[g->n_rest - 1] = p->off + p->n;
        else g->rest_lo[g->n_rest] = p->off, g->rest_hi[g->n_rest] = p->off + p->n, g->n_rest++;
        at = p->off + p->n;
    }
    return 0;
}

static const tg_family *const tg_families[] = {&tg_family_aspan, &tg_family_par};

tgpu *tgpu_new(const trainer *t, char *err) { return tgpu_new_part(t, 0, t->B, 0, err); }

tgpu *tgpu_new_part(const trainer *t, int b0, int nb, int rank, char *err)
{
    const tg_family *fam = NULL;
    for (size_t i = 0; i < sizeof tg_families / sizeof *tg_families; i++)
        if (tg_families[i]->fam == t->c.fam) fam = tg_families[i];
    if (!fam) {
        err_set(err, "the CUDA trainer does not run the %s family", t->c.fam->name);
        return NULL;
    }
    if (tgpu_available(err)) return NULL;
    tgpu *g = (tgpu *)calloc(1, sizeof *g);
    if (!g) { err_set(err, "out of memory"); return NULL; }
    g->fam = fam;
    g->L = t->L, g->B = nb, g->M = t->M, g->H = t->H, g->K = t->K, g->D = t->D, g->I = t->I, g->V = t->V;
    g->AW = t->A, g->N = nb * t->M;
    g->b0 = b0, g->B_all = t->B, g->rank = rank, g->N_all = (size_t)t->B * t->M;
    g->optim = t->c.optim, g->grad_clip = t->c.grad_clip;
    g->beta1 = t->c.beta1, g->beta2 = t->c.beta2, g->adam_eps = t->c.adam_eps;
    g->n = t->n;
    g->emb = t->emb, g->out_w = t->out_w, g->out_b = t->out_b, g->r_w_bias = t->r_w_bias, g->r_r_bias = t->r_r_bias;
    g->mem_rows = t->c.fam->mem_rows(&t->c);
    g->mem_n = (size_t)t->L * nb * g->mem_rows * t->H;
    const size_t L = g->L, N = g->N, H = g->H, I = g->I, V = g->V, F = sizeof(float);
    size_t maxc = H > I ? H : I;
    maxc = maxc > V ? maxc : V;
    maxc = maxc > (size_t)3 * t->A ? maxc : (size_t)3 * t->A;
    maxc = maxc > 4 ? maxc : 4;   /* tg_dot's 256 slices */
    g->ly = (tlayer *)calloc(L, sizeof *g->ly);
    g->mlen = (int *)calloc(L, sizeof(int));
    g->mlen_keep = (int *)calloc(L, sizeof(int));
    g->mlen_fwd = (int *)calloc(L, sizeof(int));
    g->mem_live = (int *)calloc(L, sizeof(int));   /* tg_alloc zeroes the memories */
    g->mem_live_keep = (int *)calloc(L, sizeof(int));
    if (!g->ly || !g->mlen || !g->mlen_keep || !g->mlen_fwd || !g->mem_live || !g->mem_live_keep) {
        err_set(err, "out of memory");
        goto fail;
    }
    for (size_t l = 0; l < L; l++) g->ly[l] = t->ly[l];
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
    if (tg_alloc(g, &g->w, F * g->n, err) || tg_alloc(g, &g->g, F * g->n, err) ||
        tg_alloc(g, &g->m1, F * g->n, err) || tg_alloc(g, &g->m2, F * g->n, err) ||
        tg_alloc(g, &g->mem, F * g->mem_n, err) || tg_alloc(g, &g->mem_keep, F * g->mem_n, err) ||
        tg_alloc(g, &g->X, F * (L + 1) * N * H, err) || tg_alloc(g, &g->logp, F * N * V, err) ||
        tg_alloc(g, &g->nll, F * N, err) || tg_alloc(g, &g->tmp, F * N * H, err) ||
        tg_alloc(g, &g->dX, F * N * H, err) || tg_alloc(g, &g->dY, F * N * H, err) ||
        tg_alloc(g, &g->colpart, sizeof(double) * TG_COL_CHUNKS * maxc, err) ||
        tg_alloc(g, &g->lnpart, sizeof(double) * 3 * TG_LN_CHUNKS * H, err) ||
        tg_alloc(g, &g->dsum, sizeof(double) * 4, err) ||
        tg_alloc(g, &g->d_tok, sizeof(int32_t) * (3 * N + V + 1), err))
        goto fail;
    if (cudaMallocHost((void **)&g->h_tok, sizeof(int32_t) * (3 * N + V + 1)) != cudaSuccess ||
        cudaMallocHost((void **)&g->h_sum, sizeof(double) * 4) != cudaSuccess) {
        err_set(err, "cudaMallocHost failed");
        goto fail;
    }
    if (fam->plan(g, t, err) || plan_optimizer(g, t, err) || plan_mirror(g, t, err) || plan_buckets(g, t, err) ||
        tgpu_set_tf32(g, t->c.tf32, err) || tgpu_set_bf16(g, t->c.bf16, err) || tgpu_upload(g, t, err))
        goto fail;
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

static size_t mem_n(const tgpu *g) { return g->mem_n; }

/* this device's streams of the host's memories (L x B_all x rows x H):
 * per layer, the streams [b0, b0 + B) */
static int mem_move(tgpu *g, double *host, int to_host, char *err)
{
    const size_t per = (size_t)g->mem_rows * g->H, dev_l = (size_t)g->B * per, host_l = (size_t)g->B_all * per;
    for (int l = 0; l < g->L; l++) {
        if (!to_host) g->mem_live[l] = g->mem_rows;   /* the host's rows: any may be non-zero */
        double *h = host + l * host_l + (size_t)g->b0 * per;
        float *d = g->mem + l * dev_l;
        if (to_host ? down(g, h, d, dev_l, err) : up(g, d, h, dev_l, err)) return -1;
    }
    return 0;
}

int tgpu_upload_weights(tgpu *g, const trainer *t, char *err)
{
    return up(g, g->w, t->w, g->n, err) || up(g, g->m1, t->m1, g->n, err) || up(g, g->m2, t->m2, g->n, err) ? -1 : 0;
}

int tgpu_upload(tgpu *g, const trainer *t, char *err)
{
    memcpy(g->mlen, t->mlen, sizeof(int) * g->L);
    return tgpu_upload_weights(g, t, err) || mem_move(g, t->mem, 0, err) ? -1 : 0;
}

int tgpu_download_part(tgpu *g, trainer *t, int weights, char *err)
{
    if (weights) {
        memcpy(t->mlen, g->mlen, sizeof(int) * g->L);
        if (down(g, t->w, g->w, g->n, err) || down(g, t->m1, g->m1, g->n, err) || down(g, t->m2, g->m2, g->n, err))
            return -1;
    }
    return mem_move(g, t->mem, 1, err);
}

int tgpu_download(tgpu *g, trainer *t, char *err) { return tgpu_download_part(g, t, 1, err); }

int tgpu_download_grad(tgpu *g, double *grad, char *err) { return down(g, grad, g->g, g->n, err); }
int tgpu_download_memory(tgpu *g, double *mem, char *err) { return mem_move(g, mem, 1, err); }

int tgpu_reset_memory(tgpu *g, char *err)
{
    memset(g->mlen, 0, sizeof(int) * g->L);
    memset(g->mem_live, 0, sizeof(int) * g->L);
    CU_TRY(cudaMemsetAsync(g->mem, 0, sizeof(float) * mem_n(g), g->stream), err, "memory reset");
    return 0;
}

int tgpu_stash_memory(tgpu *g, int restore, char *err)
{
    float *dst = restore ? g->mem : g->mem_keep, *src = restore ? g->mem_keep : g->mem;
    memcpy(restore ? g->mlen : g->mlen_keep, restore ? g->mlen_keep : g->mlen, sizeof(int) * g->L);
    memcpy(restore ? g->mem_live : g->mem_live_keep, restore ? g->mem_live_keep : g->mem_live, sizeof(int) * g->L);
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


int tg_loss(tgpu *g, const float *XL, char *err)
{
    const int N = g->N, H = g->H, V = g->V;
    const int32_t *dy = g->d_tok + N;
    return tg_gemm(g, 0, 1, N, V, H, 1, XL, H, g->w + g->out_w, H, 0, g->logp, V, err) ||
                   tg_xent(g, g->logp, g->nll, g->w + g->out_b, dy, N, V, err) || tg_sum(g, g->dsum, g->nll, N, err)
               ? -1
               : 0;
}

int tg_loss_back(tgpu *g, const float *XL, char *err)
{
    const int N = g->N, H = g->H, V = g->V;
    const int32_t *dy = g->d_tok + N;
    float *gg = g->g;
    return tg_xent_back(g, g->logp, dy, N, V, 1.0f / (float)g->N_all, err) ||
                   tg_gemm(g, 1, 0, V, H, N, 1, g->logp, V, XL, H, 1, gg + g->out_w, H, err) ||
                   tg_colsum(g, gg + g->out_b, g->logp, NULL, N, V, err) ||
                   tg_gemm(g, 0, 0, N, H, V, 1, g->logp, V, g->w + g->out_w, H, 0, g->dX, H, err)
               ? -1
               : 0;
}

/* the forward (and backward) of this device's streams, launched: the
 * tokens' upload, the block, and with several devices the all-reduce of
 * the loss and of the stop requests into g->dsum[0..1] */
static int forward_launch(tgpu *g, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                          double *aux, char *err)
{
    double a = 0;
    const size_t at = (size_t)g->b0 * g->M;   /* this device's streams */
    if (upload_tokens(g, x + at, y + at, err)) return -1;
    if (backward && cudaMemsetAsync(g->g, 0, sizeof(float) * g->n, g->stream) != cudaSuccess)
        return err_set(err, "gradient reset failed");
    if (g->fam->block(g, t, backward, carry, &a, err)) return -1;
    if (g->sum_all && g->comm) {   /* the loss and the stop requests of every device of the run */
#ifdef SPANSERVE_NCCL
        g->h_sum[2] = g->stop_local;   /* pinned: the copy does not wait for the stream */
        CU_TRY(cudaMemcpyAsync(g->dsum + 1, g->h_sum + 2, sizeof(double), cudaMemcpyHostToDevice, g->stream), err,
               "stop flag");
        ncclResult_t r = ncclAllReduce(g->dsum, g->dsum, 2, ncclFloat64, ncclSum, (ncclComm_t)g->comm, g->stream);
        if (r != ncclSuccess) return err_set(err, "the loss's all-reduce: %s", ncclGetErrorString(r));
#endif
    }
    if (aux) *aux = a;
    return 0;
}

/* the launched work's end: the loss and stop requests to the host */
static int forward_wait(tgpu *g, double *sum, char *err)
{
    cudaError_t e = cudaMemcpyAsync(g->h_sum, g->dsum, 2 * sizeof(double), cudaMemcpyDeviceToHost, g->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    if (e != cudaSuccess) return err_set(err, "training step: %s", cudaGetErrorString(e));
    g->stop_all = g->h_sum[1] > 0.5;
    *sum = g->h_sum[0];
    return 0;
}

int tgpu_forward_sum(tgpu *g, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                     double *sum, double *aux, char *err)
{
    return forward_launch(g, t, x, y, backward, carry, aux, err) || forward_wait(g, sum, err) ? -1 : 0;
}

double tgpu_forward(tgpu *g, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                    double *aux, char *err)
{
    double sum = 0;
    if (tgpu_forward_sum(g, t, x, y, backward, carry, &sum, aux, err)) return NAN;
    const double nll = sum / (double)g->N_all;
    if (!isfinite(nll)) err_set(err, "the loss is not finite (%g): the learning rate may be too high", nll);
    return nll;
}

int tgpu_step(tgpu *g, trainer *t, double lr, char *err)
{
    if (tgpu_step_part(g, t, t->step + 1, lr, 1, err)) return -1;
    t->step++;
    return 0;
}

/* the optimizer at STEP, launched (GUARD: it leaves the weights as they are
 * unless the loss in g->dsum[0] is finite), and with MIRROR the new z/S and
 * alpha on their way to the host */
static int step_launch(tgpu *g, const trainer *t, long step, double lr, int mirror, int guard, char *err)
{
    /* what this step trains: everything while PAR searches, the chosen
     * branches after (uploaded when it changes) */
    int changed = 0;
    for (int i = 0; i < g->n_tp; i++) {
        const int a = !train_param_active(t, i) ? TG_ACT_NONE : t->tp[i].kind == TP_ALPHA ? TG_ACT_ALPHA : TG_ACT_WEIGHT;
        changed |= a != g->h_act[i];
        g->h_act[i] = a;
    }
    if (changed)
        CU_TRY(cudaMemcpyAsync(g->tp_act, g->h_act, sizeof(int) * g->n_tp, cudaMemcpyHostToDevice, g->stream), err,
               "optimizer plan");
    if (tg_optim(g, lr, t->c.arch_lr, step, guard ? g->dsum : NULL, err) || tg_gather_mirror(g, err)) return -1;
    if (g->n_mirror && mirror)
        CU_TRY(cudaMemcpyAsync(g->h_mirror, g->mirror, sizeof(float) * g->n_mirror, cudaMemcpyDeviceToHost, g->stream),
               err, "mirror download");
    return 0;
}

static void mirror_write(const tgpu *g, trainer *t)
{
    for (int i = 0; i < g->n_mirror; i++) t->w[g->h_mir_off[i]] = g->h_mirror[i];
}

int tgpu_step_part(tgpu *g, trainer *t, long step, double lr, int mirror, char *err)
{
    if (step_launch(g, t, step, lr, mirror, 0, err)) return -1;
    CU_TRY(cudaStreamSynchronize(g->stream), err, "optimizer step");
    if (mirror) mirror_write(g, t);
    return 0;
}

int tgpu_train_step_sum(tgpu *g, trainer *t, const int32_t *x, const int32_t *y, long step, double lr, int mirror,
                        double *sum, double *aux, char *err)
{
    if (forward_launch(g, t, x, y, 1, 1, aux, err) || step_launch(g, t, step, lr, mirror, 1, err) ||
        forward_wait(g, sum, err))
        return -1;
    if (mirror && isfinite(*sum)) mirror_write(g, t);
    return 0;
}

double tgpu_train_step(tgpu *g, trainer *t, const int32_t *x, const int32_t *y, double lr, double *aux, char *err)
{
    double sum = 0;
    if (tgpu_train_step_sum(g, t, x, y, t->step + 1, lr, 1, &sum, aux, err)) return NAN;
    const double nll = sum / (double)g->N_all;
    if (!isfinite(nll)) {
        err_set(err, "the loss is not finite (%g): the learning rate may be too high", nll);
        return NAN;
    }
    t->step++;
    return nll;
}

int tg_grad_ready(tgpu *g, int l, char *err)
{
    if (!g->comm) return 0;
#ifdef SPANSERVE_NCCL
    ncclComm_t comm = (ncclComm_t)g->comm;
    if (!g->overlap || !g->buckets) {   /* one all-reduce, after the backward */
        if (l >= 0) return 0;
        const ncclResult_t r = ncclAllReduce(g->g, g->g, g->n, ncclFloat32, ncclSum, comm, g->stream);
        return r != ncclSuccess ? err_set(err, "the gradient's all-reduce: %s", ncclGetErrorString(r)) : 0;
    }
    CU_TRY(cudaEventRecord(g->ev_grad, g->stream), err, "gradient event");
    CU_TRY(cudaStreamWaitEvent(g->cstream, g->ev_grad, 0), err, "gradient event wait");
    ncclResult_t r = ncclSuccess;
    if (l >= 0)
        r = ncclAllReduce(g->g + g->bk_lo[l], g->g + g->bk_lo[l], g->bk_hi[l] - g->bk_lo[l], ncclFloat32, ncclSum, comm,
                          g->cstream);
    else
        for (int i = 0; i < g->n_rest && r == ncclSuccess; i++)
            r = ncclAllReduce(g->g + g->rest_lo[i], g->g + g->rest_lo[i], g->rest_hi[i] - g->rest_lo[i], ncclFloat32,
                              ncclSum, comm, g->cstream);
    if (r != ncclSuccess) return err_set(err, "the gradient's all-reduce: %s", ncclGetErrorString(r));
    if (l < 0) {   /* the optimizer waits for every bucket */
        CU_TRY(cudaEventRecord(g->ev_comm, g->cstream), err, "all-reduce event");
        CU_TRY(cudaStreamWaitEvent(g->stream, g->ev_comm, 0), err, "all-reduce event wait");
    }
    return 0;
#else
    (void)l;
    return err_set(err, "this build has no NCCL");
#endif
}

/* ---- the table train_run drives ---- */

/* one GPU, or the config's gpus through train_multi.cu */
typedef struct {
    tgpu *one;
    tmulti *multi;
} tdev;

static void *dev_open(const trainer *t, char *err)
{
    tdev *d = (tdev *)calloc(1, sizeof *d);
    if (!d) { err_set(err, "out of memory"); return NULL; }
    if (t->c.gpus > 1 || t->c.nodes > 1) d->multi = tmulti_new(t, err);
    else d->one = tgpu_new(t, err);
    if (!d->one && !d->multi) { free(d); return NULL; }
    return d;
}
static void dev_close(void *ctx)
{
    tdev *d = (tdev *)ctx;
    tgpu_free(d->one);
    tmulti_free(d->multi);
    free(d);
}
static double dev_forward(void *ctx, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                          double *aux, char *err)
{
    tdev *d = (tdev *)ctx;
    return d->multi ? tmulti_forward(d->multi, t, x, y, backward, carry, aux, err)
                    : tgpu_forward(d->one, t, x, y, backward, carry, aux, err);
}
static int dev_step(void *ctx, trainer *t, double lr, char *err)
{
    tdev *d = (tdev *)ctx;
    return d->multi ? tmulti_step(d->multi, t, lr, err) : tgpu_step(d->one, t, lr, err);
}
static double dev_train_step(void *ctx, trainer *t, const int32_t *x, const int32_t *y, double lr, double *aux,
                             char *err)
{
    tdev *d = (tdev *)ctx;
    return d->multi ? tmulti_train_step(d->multi, t, x, y, lr, aux, err) : tgpu_train_step(d->one, t, x, y, lr, aux, err);
}
static int dev_reset(void *ctx, char *err)
{
    tdev *d = (tdev *)ctx;
    return d->multi ? tmulti_reset_memory(d->multi, err) : tgpu_reset_memory(d->one, err);
}
static int dev_stash(void *ctx, int restore, char *err)
{
    tdev *d = (tdev *)ctx;
    return d->multi ? tmulti_stash_memory(d->multi, restore, err) : tgpu_stash_memory(d->one, restore, err);
}
static int dev_download(void *ctx, trainer *t, char *err)
{
    tdev *d = (tdev *)ctx;
    return d->multi ? tmulti_download(d->multi, t, err) : tgpu_download(d->one, t, err);
}
static const char *dev_name(void *ctx)
{
    tdev *d = (tdev *)ctx;
    return d->multi ? tmulti_device_name(d->multi) : tgpu_device_name(d->one);
}

static int dev_primary(void *ctx)
{
    tdev *d = (tdev *)ctx;
    return d->multi ? tmulti_primary(d->multi) : 1;
}
static int dev_stop_agreed(void *ctx)
{
    tdev *d = (tdev *)ctx;
    return d->multi ? tmulti_stop_agreed(d->multi) : train_stop_pending();
}

const train_device tgpu_train_device = {"cuda",     dev_open,     dev_close, dev_forward, dev_step,
                                        dev_reset,  dev_stash,    dev_download, dev_name, dev_primary,
                                        dev_stop_agreed, dev_train_step};
