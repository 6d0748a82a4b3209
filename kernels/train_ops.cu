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
 *   tg_gemm_bf      the same with bf16 operands (precision bf16's copies,
 *                   train_internal.cuh's bo), float32 sums and C;
 *                   tg_to_bf16 and tg_seg_to_bf16 make the copies
 *   tg_embed(_back) the token embedding; its backward sums each token's
 *                   rows (listed on the host) in order, without atomics
 *   tg_ln_fwd/back  residual + post-LayerNorm (eps 1e-5, biased variance),
 *                   sums in double, xhat and 1/sigma kept for the backward:
 *                   with g = dy w, dx = rstd (g - mean g - xhat mean(g xhat));
 *                   a warp a row (rows up to 1024), the backward's weight
 *                   gradients summed in the same pass by slices of rows
 *                   (TG_LN_CHUNKS), then the slices in order
 *   tg_colsum       bias gradients: column sums in TG_COL_CHUNKS slices of
 *                   rows, then the slices in order (tg_relu_back2 does the
 *                   hidden layer's bias in its own pass)
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
 *                   With GUARD (the loss's sum on the device), nothing
 *                   changes unless it is finite.
 *   tg_axpy, tg_dot the mixture of PAR's branches and its gradient
 */
#include "train_internal.cuh"

/* Row-major C = op(A) op(B) through cublasGemmEx (COUNT 0) or its strided
 * batch, operands of type T, float32 C, sums as COMPUTE */
static int gemm_ex(tgpu *g, int ta, int tb, int m, int n, int k, float alpha, const void *A, int lda, long long sa,
                   const void *B, int ldb, long long sb, cudaDataType_t T, float beta, float *C, int ldc, long long sc,
                   int count, cublasComputeType_t compute, const char *what, char *err)
{
    const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (count)
        BLAS_TRY(cublasGemmStridedBatchedEx(g->blas, ob, oa, n, m, k, &alpha, B, T, ldb, sb, A, T, lda, sa, &beta, C,
                                            CUDA_R_32F, ldc, sc, count, compute, CUBLAS_GEMM_DEFAULT),
                 err, what);
    else
        BLAS_TRY(cublasGemmEx(g->blas, ob, oa, n, m, k, &alpha, B, T, ldb, A, T, lda, &beta, C, CUDA_R_32F, ldc, compute,
                              CUBLAS_GEMM_DEFAULT),
                 err, what);
    return 0;
}

int tg_gemm(tgpu *g, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
            int ldb, float beta, float *C, int ldc, char *err)
{
    if (m <= 0 || n <= 0) return 0;
    if (g->bf16)   /* float32 operands, rounded to bf16 on the tensor cores, float32 sums */
        return gemm_ex(g, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, CUDA_R_32F, beta, C, ldc, 0, 0,
                       CUBLAS_COMPUTE_32F_FAST_16BF, "gemm bf16", err);
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
    if (g->bf16)
        return gemm_ex(g, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, CUDA_R_32F, beta, C, ldc, sc, count,
                       CUBLAS_COMPUTE_32F_FAST_16BF, "gemm bf16 batched", err);
    BLAS_TRY(cublasSgemmStridedBatched(g->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                                      k, &alpha, B, ldb, sb, A, lda, sa, &beta, C, ldc, sc, count),
            err, "sgemm batched");
    return 0;
}

int tg_gemm_bf(tgpu *g, int ta, int tb, int m, int n, int k, float alpha, const tbf16 *A, int lda, const tbf16 *B,
               int ldb, float beta, float *C, int ldc, char *err)
{
    if (m <= 0 || n <= 0) return 0;
    return gemm_ex(g, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, CUDA_R_16BF, beta, C, ldc, 0, 0,
                   CUBLAS_COMPUTE_32F, "gemm bf16 operands", err);
}

int tg_gemm_batched_bf(tgpu *g, int ta, int tb, int m, int n, int k, float alpha, const tbf16 *A, int lda,
                       long long sa, const tbf16 *B, int ldb, long long sb, float beta, float *C, int ldc,
                       long long sc, int count, char *err)
{
    if (m <= 0 || n <= 0 || count <= 0) return 0;
    return gemm_ex(g, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, CUDA_R_16BF, beta, C, ldc, sc, count,
                   CUBLAS_COMPUTE_32F, "gemm bf16 operands batched", err);
}

__global__ static void to_bf16_kernel(tbf16 *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}

int tg_to_bf16(tgpu *g, tbf16 *dst, const float *src, size_t n, char *err)
{
    if (!n) return 0;
    const size_t blocks = tg_blocks(n, 256);
    to_bf16_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, g->stream>>>(dst, src, n);
    LAUNCH_TRY(err, "to bf16");
    return 0;
}

/* blockIdx.y: the segment (src offset, dst offset, length) */
__global__ static void seg_bf16_kernel(tbf16 *dst, const float *src, const size_t *seg)
{
    const size_t *s = seg + 3 * blockIdx.y, from = s[0], to = s[1], len = s[2];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (size_t)gridDim.x * blockDim.x)
        dst[to + i] = __float2bfloat16(src[from + i]);
}

int tg_seg_to_bf16(tgpu *g, tbf16 *dst, const float *src, const size_t *seg, int nseg, char *err)
{
    if (nseg <= 0) return 0;
    seg_bf16_kernel<<<dim3(32, nseg), 256, 0, g->stream>>>(dst, src, seg);
    LAUNCH_TRY(err, "weights to bf16");
    return 0;
}

int tg_plan_bf16_weights(tgpu *g, const size_t *src, const size_t *len, int n, tbf16 **w, char *err)
{
    g->bo.nseg = n;
    free(g->bo.off);   /* a failed plan's */
    g->bo.off = (size_t *)calloc(n, sizeof(size_t));
    size_t *seg = (size_t *)calloc(3 * (size_t)n, sizeof(size_t));
    if (!g->bo.off || !seg) {
        free(seg);
        return err_set(err, "out of memory");
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        seg[3 * i] = src[i], seg[3 * i + 1] = at, seg[3 * i + 2] = len[i];
        g->bo.off[i] = at;
        at += (len[i] + 7) & ~(size_t)7;   /* 16 bytes */
    }
    int rc = tg_alloc(g, &g->bo.seg, sizeof(size_t) * 3 * n, err) || tg_alloc(g, w, sizeof(tbf16) * at, err) ? -1 : 0;
    if (!rc && (cudaMemcpyAsync(g->bo.seg, seg, sizeof(size_t) * 3 * n, cudaMemcpyHostToDevice, g->stream) !=
                    cudaSuccess ||
                cudaStreamSynchronize(g->stream) != cudaSuccess))
        rc = err_set(err, "copying the bf16 weights' table failed");
    free(seg);
    return rc;
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

/* A warp a row for rows up to TG_LN_WARP_MAX: lane l holds columns l + 32 c
 * (c < C) in registers. */
#define TG_LN_WARP_MAX 1024

static int ln_lanes(int d)
{
    const int c = (d + 31) / 32;
    return c <= 1 ? 1 : c <= 2 ? 2 : c <= 4 ? 4 : c <= 8 ? 8 : c <= 16 ? 16 : 32;
}

#define LN_DISPATCH(C, LAUNCH)                                                                                       \
    switch (C) {                                                                                                     \
    case 1: LAUNCH(1); break;                                                                                        \
    case 2: LAUNCH(2); break;                                                                                        \
    case 4: LAUNCH(4); break;                                                                                        \
    case 8: LAUNCH(8); break;                                                                                        \
    case 16: LAUNCH(16); break;                                                                                      \
    default: LAUNCH(32); break;                                                                                      \
    }

template <int C>
__global__ static void ln_fwd_warp(float *y, float *xhat, float *rstd, tbf16 *yb, const float *a, const float *bias,
                                   const float *res, const float *w, const float *b, int n, int d)
{
    const int lane = threadIdx.x & 31;
    const size_t r = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), o = r * d;
    if (r >= (size_t)n) return;   /* the whole warp */
    float u[C];
    double s = 0;
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int j = lane + 32 * c;
        u[c] = j < d ? (bias ? a[o + j] + bias[j] : a[o + j]) + res[o + j] : 0.0f;
        s += u[c];
    }
    const double mean = warp_sum(s) / d;
    double v = 0;
#pragma unroll
    for (int c = 0; c < C; c++)
        if (lane + 32 * c < d) {
            const double e = u[c] - mean;
            v += e * e;
        }
    const double inv = 1.0 / sqrt(warp_sum(v) / d + 1e-5);
    if (lane == 0) rstd[r] = (float)inv;
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int j = lane + 32 * c;
        if (j < d) {
            const float h = (float)((u[c] - mean) * inv), out = h * w[j] + b[j];
            xhat[o + j] = h;
            y[o + j] = out;
            if (yb) yb[o + j] = __float2bfloat16(out);
        }
    }
}

int tg_ln_fwd2(tgpu *g, float *y, float *xhat, float *rstd, tbf16 *yb, const float *a, const float *bias,
               const float *res, const float *w, const float *b, int n, int d, char *err)
{
    if (n <= 0) return 0;
    if (d > TG_LN_WARP_MAX) {
        ln_fwd_kernel<<<n, ln_threads(d), 0, g->stream>>>(y, xhat, rstd, a, bias, res, w, b, d);
        LAUNCH_TRY(err, "layernorm");
        return yb ? tg_to_bf16(g, yb, y, (size_t)n * d, err) : 0;
    }
#define LN_FWD(C) ln_fwd_warp<C><<<tg_blocks(n, 8), 256, 0, g->stream>>>(y, xhat, rstd, yb, a, bias, res, w, b, n, d)
    LN_DISPATCH(ln_lanes(d), LN_FWD)
#undef LN_FWD
    LAUNCH_TRY(err, "layernorm");
    return 0;
}

int tg_ln_fwd(tgpu *g, float *y, float *xhat, float *rstd, const float *a, const float *bias, const float *res,
              const float *w, const float *b, int n, int d, char *err)
{
    return tg_ln_fwd2(g, y, xhat, rstd, NULL, a, bias, res, w, b, n, d, err);
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

/* Rows [blockIdx.x per, + per), warp w of the block taking every
 * (blockDim.x / 32)th from the w-th; each lane sums its columns of dy xhat,
 * dy and (NSUM 3) dx over its rows in float, then the block's warps in
 * double into part[k][blockIdx.x][j], k < NSUM (fold_kernel adds the
 * slices in order). Dynamic shared memory: warps x d floats. */
template <int C>
__global__ static void ln_back_warp(float *dx, float *dx2, tbf16 *dxb, double *part, const float *dy,
                                    const float *xhat, const float *rstd, const float *w, int n, int d, int per,
                                    int nsum)
{
    extern __shared__ float ln_sh[];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int r0 = blockIdx.x * per, r1 = min(n, r0 + per);
    float aw[C], ab[C], ao[C];
#pragma unroll
    for (int c = 0; c < C; c++) aw[c] = ab[c] = ao[c] = 0.0f;
    for (int r = r0 + wi; r < r1; r += nw) {
        const size_t o = (size_t)r * d;
        float gv[C], hv[C];
        double mg = 0, mgh = 0;
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int j = lane + 32 * c;
            gv[c] = j < d ? dy[o + j] : 0.0f;
            hv[c] = j < d ? xhat[o + j] : 0.0f;
            const double gj = j < d ? (double)gv[c] * w[j] : 0.0;
            mg += gj;
            mgh += gj * hv[c];
        }
        mg = warp_sum(mg) / d;
        mgh = warp_sum(mgh) / d;
        const double rs = rstd[r];
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int j = lane + 32 * c;
            if (j < d) {
                const float out = (float)(rs * ((double)gv[c] * w[j] - mg - hv[c] * mgh));
                if (dx) dx[o + j] = out;
                if (dx2) dx2[o + j] = out;
                if (dxb) dxb[o + j] = __float2bfloat16(out);
                aw[c] += gv[c] * hv[c];
                ab[c] += gv[c];
                ao[c] += out;
            }
        }
    }
    for (int k = 0; k < nsum; k++) {
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int j = lane + 32 * c;
            if (j < d) ln_sh[wi * d + j] = k == 0 ? aw[c] : k == 1 ? ab[c] : ao[c];
        }
        __syncthreads();
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            double s = 0;
            for (int i = 0; i < nw; i++) s += ln_sh[i * d + j];
            part[((size_t)k * gridDim.x + blockIdx.x) * d + j] = s;
        }
        __syncthreads();
    }
}

/* out_k[j] += the CHUNKS slices part[k][c][j] (blockIdx.y = k), in a fixed
 * order: FOLD_ROWS rows of threads over the slices, then those rows in
 * order */
#define FOLD_ROWS 32
__global__ static void fold_kernel(float *o0, float *o1, float *o2, const double *part, int chunks, int d)
{
    __shared__ double sh[FOLD_ROWS][33];
    const int j = blockIdx.x * 32 + threadIdx.x, k = blockIdx.y;
    double s = 0;
    if (j < d)
        for (int c = threadIdx.y; c < chunks; c += FOLD_ROWS) s += part[((size_t)k * chunks + c) * d + j];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < d) {
        double t = 0;
        for (int i = 0; i < FOLD_ROWS; i++) t += sh[i][threadIdx.x];
        float *o = k == 0 ? o0 : k == 1 ? o1 : o2;
        o[j] += (float)t;
    }
}

static int fold(tgpu *g, float *o0, float *o1, float *o2, const double *part, int nsum, int chunks, int d, char *err)
{
    fold_kernel<<<dim3(tg_blocks(d, 32), nsum), dim3(32, FOLD_ROWS), 0, g->stream>>>(o0, o1, o2, part, chunks, d);
    LAUNCH_TRY(err, "column sums' slices");
    return 0;
}

int tg_ln_back2(tgpu *g, float *dx, float *dx2, tbf16 *dxb, float *gw, float *gb, float *gout, const float *dy,
                const float *xhat, const float *rstd, const float *w, int n, int d, char *err)
{
    if (n <= 0) return 0;
    if (d > TG_LN_WARP_MAX) {   /* a block a row, then the column sums */
        float *out = dx ? dx : dx2;
        if (!out) return err_set(err, "layernorm back: no float32 output for rows of %d", d);
        ln_back_kernel<<<n, ln_threads(d), 0, g->stream>>>(out, dy, xhat, rstd, w, d);
        LAUNCH_TRY(err, "layernorm back");
        if (dx && dx2)
            CU_TRY(cudaMemcpyAsync(dx2, dx, sizeof(float) * n * d, cudaMemcpyDeviceToDevice, g->stream), err,
                   "layernorm back's copy");
        if (dxb && tg_to_bf16(g, dxb, out, (size_t)n * d, err)) return -1;
        return tg_colsum(g, gw, dy, xhat, n, d, err) || tg_colsum(g, gb, dy, NULL, n, d, err) ||
                       (gout && tg_colsum(g, gout, out, NULL, n, d, err))
                   ? -1
                   : 0;
    }
    int chunks = (n + 31) / 32;
    if (chunks > TG_LN_CHUNKS) chunks = TG_LN_CHUNKS;
    const int per = (n + chunks - 1) / chunks, nsum = gout ? 3 : 2;
    chunks = (n + per - 1) / per;
    const size_t sh = sizeof(float) * 8 * d;
#define LN_BACK(C)                                                                                                   \
    ln_back_warp<C><<<chunks, 256, sh, g->stream>>>(dx, dx2, dxb, g->lnpart, dy, xhat, rstd, w, n, d, per, nsum)
    LN_DISPATCH(ln_lanes(d), LN_BACK)
#undef LN_BACK
    LAUNCH_TRY(err, "layernorm back");
    return fold(g, gw, gb, gout, g->lnpart, nsum, chunks, d, err);
}

int tg_ln_back(tgpu *g, float *dx, float *gw, float *gb, const float *dy, const float *xhat, const float *rstd,
               const float *w, int n, int d, char *err)
{
    return tg_ln_back2(g, dx, NULL, NULL, gw, gb, NULL, dy, xhat, rstd, w, n, d, err);
}

/* a block (32 columns x 8 rows of threads) of the column sums: thread
 * (x, y)'s S summed over y in order into part[blockIdx.y][column j] */
__device__ __forceinline__ static void col_part_store(double *part, double s, int j, int cols)
{
    __shared__ double sh[8][33];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
        double t = 0;
        for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
        part[(size_t)blockIdx.y * cols + j] = t;
    }
}

/* blocks (column tile of 32, row chunk); threads 32 x 8 */
__global__ static void colsum_part_kernel(double *part, const float *a, const float *b, int rows, int cols, int per)
{
    const int j = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * per, r1 = min(rows, r0 + per);
    double s = 0;
    if (j < cols)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            const size_t at = (size_t)r * cols + j;
            s += b ? (double)a[at] * b[at] : (double)a[at];
        }
    col_part_store(part, s, j, cols);
}

int tg_colsum(tgpu *g, float *out, const float *a, const float *b, int rows, int cols, char *err)
{
    const int chunks = rows < TG_COL_CHUNKS ? (rows > 0 ? rows : 1) : TG_COL_CHUNKS, per = (rows + chunks - 1) / chunks;
    colsum_part_kernel<<<dim3(tg_blocks(cols, 32), chunks), dim3(32, 8), 0, g->stream>>>(g->colpart, a, b, rows,
                                                                                          cols, per);
    LAUNCH_TRY(err, "colsum");
    return fold(g, out, NULL, NULL, g->colpart, 1, chunks, cols, err);
}

/* a block a row of D */
__global__ static void bias_relu_row_kernel(float *y, tbf16 *yb, const float *x, const float *bias, int d, td_site ds)
{
    const size_t o = (size_t)blockIdx.x * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const size_t i = o + j;
        const float v = x[i] + bias[j], out = v > 0 ? v * tg_keep(ds, i) : 0.0f;
        if (yb)
            yb[i] = __float2bfloat16(out);
        else
            y[i] = out;
    }
}

int tg_bias_relu2(tgpu *g, float *y, tbf16 *yb, const float *x, const float *bias, int n, int d, td_site ds,
                  char *err)
{
    if (n <= 0 || d <= 0) return 0;
    bias_relu_row_kernel<<<n, d >= 256 ? 256 : 32 * ((d + 31) / 32), 0, g->stream>>>(y, yb, x, bias, d, ds);
    LAUNCH_TRY(err, "bias_relu");
    return 0;
}

/* blocks (column tile of 32, slice of rows) as colsum_part_kernel's: the
 * ReLU's backward of each element, and its column's sum over the slice */
__global__ static void relu_back_sum_kernel(float *dy, tbf16 *dyb, const float *y, const tbf16 *yb, double *part,
                                            int rows, int cols, int per, float scale)
{
    const int j = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * per, r1 = min(rows, r0 + per);
    double s = 0;
    if (j < cols)
#pragma unroll 4
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            const size_t at = (size_t)r * cols + j;
            const float yv = yb ? __bfloat162float(yb[at]) : y[at], v = yv > 0 ? dy[at] * scale : 0.0f;
            if (dyb)
                dyb[at] = __float2bfloat16(v);
            else
                dy[at] = v;
            s += v;
        }
    col_part_store(part, s, j, cols);
}

int tg_bias_relu(tgpu *g, float *y, const float *bias, int n, int d, td_site ds, char *err)
{
    return tg_bias_relu2(g, y, NULL, y, bias, n, d, ds, err);
}

int tg_relu_back2(tgpu *g, float *dy, tbf16 *dyb, const float *y, const tbf16 *yb, float *gbias, int rows, int cols,
                  float scale, char *err)
{
    if (rows <= 0 || cols <= 0) return 0;
    const int chunks = rows < TG_COL_CHUNKS ? rows : TG_COL_CHUNKS, per = (rows + chunks - 1) / chunks;
    relu_back_sum_kernel<<<dim3(tg_blocks(cols, 32), chunks), dim3(32, 8), 0, g->stream>>>(dy, dyb, y, yb, g->colpart,
                                                                                          rows, cols, per, scale);
    LAUNCH_TRY(err, "relu_back");
    return fold(g, gbias, NULL, NULL, g->colpart, 1, chunks, cols, err);
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
                                         double b2, double eps, double bc1, double bc2, const double *guard)
{
    if (guard && !isfinite(*guard)) return;   /* a loss that is not finite changes nothing */
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

int tg_optim(tgpu *g, double lr, double arch_lr, long step, const double *guard, char *err)
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
                                                         g->beta1, g->beta2, g->adam_eps, bc1, bc2, guard);
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
