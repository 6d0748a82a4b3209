/*
 * train_ops.cu - the CUDA trainer's building blocks, each the float32 twin
 * of core/train_ops.c or train_optim.c:
 *
 *   tg_gemm         row-major products through cuBLAS: a row-major C is
 *                   cuBLAS's column-major C^T, so C = op(A) op(B) is
 *                   C^T = op(B)^T op(A)^T with the operands swapped; in
 *                   precision bf16 cublasGemmEx on float32 operands with
 *                   CUBLAS_COMPUTE_32F_FAST_16BF (bf16 tensor cores, float32
 *                   sums)
 *   tg_embed(_back) the token embedding; its backward sums each token's
 *                   rows (listed on the host) in order, without atomics
 *   tg_ln_fwd/back  residual + post-LayerNorm (eps 1e-5, biased variance),
 *                   sums in double, xhat and 1/sigma kept for the backward:
 *                   with g = dy w, dx = rstd (g - mean g - xhat mean(g xhat))
 *   tg_colsum       bias and LayerNorm weight gradients: column sums in
 *                   TG_COL_CHUNKS slices of rows, then the slices in order
 *   tg_xent(_back)  log-softmax, negative log-likelihood, and its gradient
 *                   (softmax - onehot) / N
 *   tg_optim        Adagrad with the reference's per-tensor clipping
 *                   (clr = lr clip / (||g|| + 1e-10) when ||g|| > clip;
 *                   sum += g^2; w -= clr g / (sqrt(sum) + 1e-10)), or Adam
 *                   after a global-norm clip of the weights the step
 *                   trains; PAR's alpha by Adam at arch_lr, unclipped;
 *                   tensors the step does not train (the branches a fixed
 *                   architecture left out) untouched; then z/S clamped to
 *                   [0, 1]. Three passes: squares per chunk, the factor
 *                   per tensor, the update per chunk; the update in double.
 *   tg_axpy, tg_dot the mixture of PAR's branches and its gradient
 */
#include "train_internal.cuh"

int tg_gemm(tgpu *g, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
            int ldb, float beta, float *C, int ldc, char *err)
{
    if (m <= 0 || n <= 0) return 0;
    if (g->bf16) {   /* float32 operands, rounded to bf16 on the tensor cores, float32 sums */
        BLAS_TRY(cublasGemmEx(g->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, B,
                              CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc,
                              CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT),
                 err, "gemm bf16");
        return 0;
    }
    BLAS_TRY(cublasSgemm(g->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, B,
                        ldb, A, lda, &beta, C, ldc),
            err, "sgemm");
    return 0;
}

int tg_gemm_batched(tgpu *g, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
                    long long sa, const float *B, int ldb, long long sb, float beta, float *C, int ldc,
                    long long sc, int count, char *err)
{
    if (m <= 0 || n <= 0 || count <= 0) return 0;
    if (g->bf16) {
        BLAS_TRY(cublasGemmStridedBatchedEx(g->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                                            k, &alpha, B, CUDA_R_32F, ldb, sb, A, CUDA_R_32F, lda, sa, &beta, C,
                                            CUDA_R_32F, ldc, sc, count, CUBLAS_COMPUTE_32F_FAST_16BF,
                                            CUBLAS_GEMM_DEFAULT),
                 err, "gemm bf16 batched");
        return 0;
    }
    BLAS_TRY(cublasSgemmStridedBatched(g->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                                      k, &alpha, B, ldb, sb, A, lda, sa, &beta, C, ldc, sc, count),
            err, "sgemm batched");
    return 0;
}

__global__ static void embed_kernel(float *x, const float *emb, const int32_t *tok, int n, int d, float scale,
                                    td_site ds)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * d) return;
    x[i] = emb[(size_t)tok[i / d] * d + i % d] * scale * tg_keep(ds, i);
}

int tg_embed(tgpu *g, float *x, const float *emb, const int32_t *tok, int n, int d, float scale, td_site ds,
             char *err)
{
    embed_kernel<<<tg_blocks((size_t)n * d, 256), 256, 0, g->stream>>>(x, emb, tok, n, d, scale, ds);
    LAUNCH_TRY(err, "embed");
    return 0;
}

/* one block per token id, a thread per column */
__global__ static void embed_back_kernel(float *gemb, const float *dx, const int32_t *off, const int32_t *idx,
                                         int d, float scale, td_site ds)
{
    const int v = blockIdx.x, a = off[v], b = off[v + 1];
    if (a == b) return;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float s = 0;
        for (int k = a; k < b; k++) {
            const size_t at = (size_t)idx[k] * d + j;
            s += dx[at] * tg_keep(ds, at);
        }
        gemb[(size_t)v * d + j] += s * scale;
    }
}

int tg_embed_back(tgpu *g, float *gemb, const float *dx, const int32_t *off, const int32_t *idx, int V, int d,
                  float scale, td_site ds, char *err)
{
    embed_back_kernel<<<V, d >= 256 ? 256 : 64, 0, g->stream>>>(gemb, dx, off, idx, d, scale, ds);
    LAUNCH_TRY(err, "embed_back");
    return 0;
}

/* one block per row; u is written to y first, then normalised in place */
__global__ static void ln_fwd_kernel(float *y, float *xhat, float *rstd, const float *a, const float *bias,
                                     const float *res, const float *w, const float *b, int d)
{
    __shared__ double scratch[32];
    const size_t r = blockIdx.x;
    float *yr = y + r * d, *hr = xhat + r * d;
    const float *ar = a + r * d, *rr = res + r * d;
    double s = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float u = (bias ? ar[j] + bias[j] : ar[j]) + rr[j];
        yr[j] = u;
        s += u;
    }
    const double mean = block_sum(s, scratch) / d;
    double v = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const double c = yr[j] - mean;
        v += c * c;
    }
    const double inv = 1.0 / sqrt(block_sum(v, scratch) / d + 1e-5);
    if (threadIdx.x == 0) rstd[r] = (float)inv;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float h = (float)((yr[j] - mean) * inv);
        hr[j] = h;
        yr[j] = h * w[j] + b[j];
    }
}

static int ln_threads(int d) { return d >= 512 ? 256 : d >= 128 ? 128 : 32; }

int tg_ln_fwd(tgpu *g, float *y, float *xhat, float *rstd, const float *a, const float *bias, const float *res,
              const float *w, const float *b, int n, int d, char *err)
{
    ln_fwd_kernel<<<n, ln_threads(d), 0, g->stream>>>(y, xhat, rstd, a, bias, res, w, b, d);
    LAUNCH_TRY(err, "layernorm");
    return 0;
}

__global__ static void ln_back_kernel(float *dx, const float *dy, const float *xhat, const float *rstd,
                                      const float *w, int d)
{
    __shared__ double scratch[32];
    const size_t r = blockIdx.x;
    const float *gr = dy + r * d, *hr = xhat + r * d;
    float *dr = dx + r * d;
    double mg = 0, mgh = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const double gj = (double)gr[j] * w[j];
        mg += gj;
        mgh += gj * hr[j];
    }
    mg = block_sum(mg, scratch) / d;
    mgh = block_sum(mgh, scratch) / d;
    const double rs = rstd[r];
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        dr[j] = (float)(rs * ((double)gr[j] * w[j] - mg - hr[j] * mgh));
}

int tg_ln_back(tgpu *g, float *dx, float *gw, float *gb, const float *dy, const float *xhat, const float *rstd,
               const float *w, int n, int d, char *err)
{
    ln_back_kernel<<<n, ln_threads(d), 0, g->stream>>>(dx, dy, xhat, rstd, w, d);
    LAUNCH_TRY(err, "layernorm back");
    if (tg_colsum(g, gw, dy, xhat, n, d, err) || tg_colsum(g, gb, dy, NULL, n, d, err)) return -1;
    return 0;
}

/* blocks (column tile of 32, row chunk); threads 32 x 8 */
__global__ static void colsum_part_kernel(double *part, const float *a, const float *b, int rows, int cols, int per)
{
    __shared__ double sh[8][33];
    const int j = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * per, r1 = min(rows, r0 + per);
    double s = 0;
    if (j < cols)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            const size_t at = (size_t)r * cols + j;
            s += b ? (double)a[at] * b[at] : (double)a[at];
        }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
        double t = 0;
        for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
        part[(size_t)blockIdx.y * cols + j] = t;
    }
}

__global__ static void colsum_fold_kernel(float *out, const double *part, int chunks, int cols)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    double s = 0;
    for (int c = 0; c < chunks; c++) s += part[(size_t)c * cols + j];
    out[j] += (float)s;
}

int tg_colsum(tgpu *g, float *out, const float *a, const float *b, int rows, int cols, char *err)
{
    const int chunks = rows < TG_COL_CHUNKS ? (rows > 0 ? rows : 1) : TG_COL_CHUNKS, per = (rows + chunks - 1) / chunks;
    colsum_part_kernel<<<dim3(tg_blocks(cols, 32), chunks), dim3(32, 8), 0, g->stream>>>(g->colpart, a, b, rows,
                                                                                          cols, per);
    LAUNCH_TRY(err, "colsum");
    colsum_fold_kernel<<<tg_blocks(cols, 128), 128, 0, g->stream>>>(out, g->colpart, chunks, cols);
    LAUNCH_TRY(err, "colsum fold");
    return 0;
}

__global__ static void bias_relu_kernel(float *y, const float *bias, size_t n, int d, td_site ds)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = y[i] + bias[i % d];
    y[i] = v > 0 ? v * tg_keep(ds, i) : 0;
}

int tg_bias_relu(tgpu *g, float *y, const float *bias, int n, int d, td_site ds, char *err)
{
    const size_t total = (size_t)n * d;
    bias_relu_kernel<<<tg_blocks(total, 256), 256, 0, g->stream>>>(y, bias, total, d, ds);
    LAUNCH_TRY(err, "bias_relu");
    return 0;
}

__global__ static void relu_back_kernel(float *dy, const float *y, size_t n, float scale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dy[i] = y[i] > 0 ? dy[i] * scale : 0.0f;
}

int tg_relu_back(tgpu *g, float *dy, const float *y, size_t n, float scale, char *err)
{
    relu_back_kernel<<<tg_blocks(n, 256), 256, 0, g->stream>>>(dy, y, n, scale);
    LAUNCH_TRY(err, "relu_back");
    return 0;
}

__global__ static void xent_kernel(float *x, float *nll, const float *bias, const int32_t *y, int V)
{
    __shared__ float fs[32];
    __shared__ double ds[32];
    const size_t r = blockIdx.x;
    float *row = x + r * V;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float v = row[j] + bias[j];
        row[j] = v;
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx, fs);
    double s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += exp((double)row[j] - mx);
    const double lse = mx + log(block_sum(s, ds));
    __syncthreads();   /* every thread has read row[] before it changes */
    for (int j = threadIdx.x; j < V; j += blockDim.x) row[j] = (float)(row[j] - lse);
    __syncthreads();
    if (threadIdx.x == 0) nll[r] = -row[y[r]];
}

int tg_xent(tgpu *g, float *logits, float *nll, const float *bias, const int32_t *y, int n, int V, char *err)
{
    xent_kernel<<<n, V >= 256 ? 256 : 64, 0, g->stream>>>(logits, nll, bias, y, V);
    LAUNCH_TRY(err, "log_softmax");
    return 0;
}

__global__ static void xent_back_kernel(float *x, const int32_t *y, int V, float scale)
{
    const size_t r = blockIdx.x;
    float *row = x + r * V;
    for (int j = threadIdx.x; j < V; j += blockDim.x) row[j] = scale * (expf(row[j]) - (j == y[r] ? 1.0f : 0.0f));
}

int tg_xent_back(tgpu *g, float *logp, const int32_t *y, int n, int V, float scale, char *err)
{
    xent_back_kernel<<<n, V >= 256 ? 256 : 64, 0, g->stream>>>(logp, y, V, scale);
    LAUNCH_TRY(err, "log_softmax back");
    return 0;
}

/* *out = the sum of x[0..n), one block (a float or double array) */
template <typename T> __global__ static void sum_kernel(double *out, const T *x, int n)
{
    __shared__ double sc[32];
    double s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    s = block_sum(s, sc);
    if (threadIdx.x == 0) *out = s;
}

int tg_sum(tgpu *g, double *out, const float *x, int n, char *err)
{
    sum_kernel<float><<<1, 1024, 0, g->stream>>>(out, x, n);
    LAUNCH_TRY(err, "sum");
    return 0;
}

__global__ static void dropout_kernel(float *y, const float *x, const float *bias, int cols, size_t n, td_site ds)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (bias ? x[i] + bias[i % cols] : x[i]) * tg_keep(ds, i);
}

int tg_dropout(tgpu *g, float *y, const float *x, const float *bias, int cols, size_t n, td_site ds, char *err)
{
    if (!n) return 0;
    dropout_kernel<<<tg_blocks(n, 256), 256, 0, g->stream>>>(y, x, bias, cols, n, ds);
    LAUNCH_TRY(err, "dropout");
    return 0;
}

__global__ static void axpy_kernel(float *y, const float *x, float a, size_t n, int acc)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = acc ? y[i] + a * x[i] : a * x[i];
}

int tg_axpy(tgpu *g, float *y, const float *x, float a, size_t n, int acc, char *err)
{
    if (!n) return 0;
    axpy_kernel<<<tg_blocks(n, 256), 256, 0, g->stream>>>(y, x, a, n, acc);
    LAUNCH_TRY(err, "axpy");
    return 0;
}

/* TG_DOT_PARTS blocks each sum a slice, then one block sums the slices in
 * order: the same bits every run */
#define TG_DOT_PARTS 256
__global__ static void dot_part_kernel(double *part, const float *x, const float *y, size_t n)
{
    __shared__ double sc[32];
    const size_t per = (n + gridDim.x - 1) / gridDim.x, a = blockIdx.x * per, b = a + per < n ? a + per : n;
    double s = 0;
    for (size_t i = a + threadIdx.x; i < b; i += blockDim.x) s += (double)x[i] * y[i];
    s = block_sum(s, sc);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

int tg_dot(tgpu *g, double *out, const float *x, const float *y, size_t n, char *err)
{
    /* the column sums' scratch holds TG_COL_CHUNKS x (at least 3) doubles */
    dot_part_kernel<<<TG_DOT_PARTS, 256, 0, g->stream>>>(g->colpart, x, y, n);
    LAUNCH_TRY(err, "dot");
    sum_kernel<double><<<1, 256, 0, g->stream>>>(out, g->colpart, TG_DOT_PARTS);
    LAUNCH_TRY(err, "dot fold");
    return 0;
}

__global__ static void f2d_kernel(double *d, const float *s, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = s[i];
}

__global__ static void d2f_kernel(float *d, const double *s, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = (float)s[i];
}

int tg_f2d(tgpu *g, double *dst, const float *src, size_t n, char *err)
{
    if (!n) return 0;
    f2d_kernel<<<tg_blocks(n, 256), 256, 0, g->stream>>>(dst, src, n);
    LAUNCH_TRY(err, "f2d");
    return 0;
}

int tg_d2f(tgpu *g, float *dst, const double *src, size_t n, char *err)
{
    if (!n) return 0;
    d2f_kernel<<<tg_blocks(n, 256), 256, 0, g->stream>>>(dst, src, n);
    LAUNCH_TRY(err, "d2f");
    return 0;
}

/* ---- optimizer ---- */

__global__ static void opt_squares_kernel(double *part, const float *grad, const size_t *ck_off, const int *ck_len)
{
    __shared__ double sc[32];
    const float *gp = grad + ck_off[blockIdx.x];
    const int n = ck_len[blockIdx.x];
    double s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)gp[i] * gp[i];
    s = block_sum(s, sc);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* adam: the squares of every chunk of the weights this step trains, one
 * block, each thread its chunks in order, into *total */
__global__ static void opt_global_kernel(double *total, const double *part, const int *ck_t, const int *act,
                                         int n_chunk)
{
    __shared__ double sc[32];
    double s = 0;
    for (int c = threadIdx.x; c < n_chunk; c += blockDim.x)
        if (act[ck_t[c]] == TG_ACT_WEIGHT) s += part[c];
    s = block_sum(s, sc);
    if (threadIdx.x == 0) *total = s;
}

/* one thread per tensor: adagrad's clipped rate factor; adam (global): the
 * gradient scale, the same for all, from the weights' total */
__global__ static void opt_factor_kernel(double *scale, const double *part, const int *first, const int *nck,
                                         const double *total, int n_tp, int global, double clip)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tp) return;
    double ss = 0;
    if (global) {
        ss = *total;
        const double coef = clip / (sqrt(ss) + 1e-6);
        scale[t] = clip > 0 && coef < 1 ? coef : 1.0;
    } else {
        for (int c = 0; c < nck[t]; c++) ss += part[first[t] + c];
        const double norm = sqrt(ss);
        scale[t] = clip > 0 && norm > clip ? clip / (norm + 1e-10) : 1.0;
    }
}

__global__ static void opt_update_kernel(float *w, const float *grad, float *m1, float *m2, const size_t *ck_off,
                                         const int *ck_len, const int *ck_t, const int *kind, const int *act,
                                         const double *scale, int adam_w, double lr_w, double arch_lr, double b1,
                                         double b2, double eps, double bc1, double bc2)
{
    const size_t o = ck_off[blockIdx.x];
    const int n = ck_len[blockIdx.x], t = ck_t[blockIdx.x], a = act[t];
    if (a == TG_ACT_NONE) return;
    /* alpha: Adam at arch_lr, unclipped */
    const int adam = a == TG_ACT_ALPHA || adam_w;
    const double f = a == TG_ACT_ALPHA ? 1.0 : scale[t], lr = a == TG_ACT_ALPHA ? arch_lr : lr_w;
    const bool clamp = kind[t] == TP_ZFRAC;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const size_t j = o + i;
        double wj = w[j];
        if (adam) {
            const double gj = grad[j] * f;
            const double m = b1 * m1[j] + (1 - b1) * gj, v = b2 * m2[j] + (1 - b2) * gj * gj;
            m1[j] = (float)m;
            m2[j] = (float)v;
            wj -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps);
        } else {
            const double gj = grad[j], s = (double)m1[j] + gj * gj;
            m1[j] = (float)s;
            wj -= lr * f * gj / (sqrt(s) + 1e-10);
        }
        if (clamp) wj = wj < 0 ? 0 : wj > 1 ? 1 : wj;
        w[j] = (float)wj;
    }
}

int tg_optim(tgpu *g, double lr, double arch_lr, long step, char *err)
{
    const int adam = g->optim == OPT_ADAM;
    opt_squares_kernel<<<g->n_chunk, 256, 0, g->stream>>>(g->ck_part, g->g, g->ck_off, g->ck_len);
    LAUNCH_TRY(err, "optimizer norms");
    if (adam) {
        opt_global_kernel<<<1, 1024, 0, g->stream>>>(g->dsum + 2, g->ck_part, g->ck_t, g->tp_act, g->n_chunk);
        LAUNCH_TRY(err, "optimizer norm");
    }
    opt_factor_kernel<<<tg_blocks(g->n_tp, 64), 64, 0, g->stream>>>(g->tp_scale, g->ck_part, g->tp_first, g->tp_nck,
                                                                      g->dsum + 2, g->n_tp, adam, g->grad_clip);
    LAUNCH_TRY(err, "optimizer factors");
    const double bc1 = 1.0 - pow(g->beta1, (double)step), bc2 = 1.0 - pow(g->beta2, (double)step);
    opt_update_kernel<<<g->n_chunk, 256, 0, g->stream>>>(g->w, g->g, g->m1, g->m2, g->ck_off, g->ck_len, g->ck_t,
                                                         g->tp_kind, g->tp_act, g->tp_scale, adam, lr, arch_lr,
                                                         g->beta1, g->beta2, g->adam_eps, bc1, bc2);
    LAUNCH_TRY(err, "optimizer update");
    return 0;
}

__global__ static void gather_kernel(float *out, const float *w, const size_t *off, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = w[off[i]];
}

int tg_gather_mirror(tgpu *g, char *err)
{
    if (!g->n_mirror) return 0;
    gather_kernel<<<tg_blocks(g->n_mirror, 128), 128, 0, g->stream>>>(g->mirror, g->w, g->mir_off, g->n_mirror);
    LAUNCH_TRY(err, "mirror gather");
    return 0;
}
