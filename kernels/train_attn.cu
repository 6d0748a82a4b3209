/*
 * train_attn.cu - the adaptive-span attention of the CUDA trainer, forward
 * and backward, and the memory carried between blocks (core/train_aspan.c
 * has the math; train_internal.cuh the layouts).
 *
 * The products q.k, w v and their backwards are cuBLAS batched products on
 * the full score matrices (train_gpu.cu); the kernels here do what lies on
 * the band, one block per (stream, head, query) row:
 *
 *   forward   s_c = (q.k_{i+c} + q.pe_c) / sqrt(D);  a = softmax(s);
 *             w_c = a_c m_c / n,  n = sum_c a_c m_c + 1e-8
 *   backward  (dw from dO V^T)  db_c = (dw_c - sum_j dw_j w_j) / n;
 *             da_c = db_c m_c;  ds_c = a_c (da_c - sum_j a_j da_j) / sqrt(D);
 *             dz += db_c a_c S/R where the mask's clamp passes a gradient
 *
 * The mask m_c = clamp((1 - (W - c) + z S) / R + 1, 0, 1) is computed from
 * the device's z/S each forward. Rows are summed in double.
 */
#include "train_internal.cuh"

__global__ static void span_mask_kernel(float *mask, float *mskin, const float *zf, int W, int S, int R)
{
    const int h = blockIdx.x;
    const double z = (double)zf[h] * S;
    for (int c = threadIdx.x; c < W; c += blockDim.x) {
        const double xm = (1.0 - (W - c) + z) / R + 1.0;
        mask[(size_t)h * S + c] = (float)(xm < 0 ? 0 : xm > 1 ? 1 : xm);
        mskin[(size_t)h * S + c] = xm >= 0 && xm <= 1 ? 1.0f : 0.0f;
    }
}

int tg_span_mask(tgpu *g, float *mask, float *mskin, const float *zf, int W, char *err)
{
    span_mask_kernel<<<g->K, 256, 0, g->stream>>>(mask, mskin, zf, W, g->S, g->R);
    LAUNCH_TRY(err, "span mask");
    return 0;
}

__global__ static void hall_kernel(float *hall, const float *mem, const float *x, size_t total, int W, int M, int S,
                                   int H)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int col = (int)(i % H), SM = W + M;
    const size_t row = i / H, b = row / SM;
    const int r = (int)(row % SM);
    hall[i] = r < W ? mem[(b * S + S - W + r) * H + col] : x[(b * M + r - W) * H + col];
}

int tg_build_hall(tgpu *g, float *hall, const float *mem, const float *x, int W, char *err)
{
    const size_t total = (size_t)g->B * (W + g->M) * g->H;
    hall_kernel<<<tg_blocks(total, 256), 256, 0, g->stream>>>(hall, mem, x, total, W, g->M, g->S, g->H);
    LAUNCH_TRY(err, "hall");
    return 0;
}

/* Row r = (b K + h) M + i: its band sits at columns i..i+W-1 of the full
 * row; the full row gets VAL(c) there and zeros elsewhere. */
__device__ __forceinline__ void band_row_ids(int r, int M, int K, int &b, int &h, int &i)
{
    i = r % M;
    const int bh = r / M;
    b = bh / K;
    h = bh % K;
}

__global__ static void band_softmax_kernel(const float *F1, const float *PB, float *A, float *nrm, float *F2,
                                           const float *mask, int W, int M, int K, int S, float scale, td_site drop)
{
    __shared__ float fs[32];
    __shared__ double ds[32];
    const int r = blockIdx.x, SM = W + M;
    int b, h, i;
    band_row_ids(r, M, K, b, h, i);
    const float *sr = F1 + (size_t)r * SM + i, *pr = PB + ((size_t)(b * M + i) * K + h) * W;
    const float *mk = mask + (size_t)h * S;
    float *ar = A + (size_t)r * W, *fr = F2 + (size_t)r * SM;
    float mx = -INFINITY;
    for (int c = threadIdx.x; c < W; c += blockDim.x) mx = fmaxf(mx, (sr[c] + pr[c]) * scale);
    mx = block_max(mx, fs);
    double z = 0;
    for (int c = threadIdx.x; c < W; c += blockDim.x) {
        const float e = expf((sr[c] + pr[c]) * scale - mx);
        ar[c] = e;
        z += e;
    }
    z = block_sum(z, ds);
    double zb = 0;
    for (int c = threadIdx.x; c < W; c += blockDim.x) {
        const float a = (float)(ar[c] / z);
        ar[c] = a;
        zb += (double)a * mk[c];
    }
    zb = block_sum(zb, ds) + 1e-8;
    if (threadIdx.x == 0) nrm[r] = (float)zb;
    for (int j = threadIdx.x; j < SM; j += blockDim.x) {
        const int c = j - i;
        fr[j] = c >= 0 && c < W ? (float)(ar[c] * mk[c] / zb) * tg_keep(drop, (size_t)r * S + c) : 0.0f;
    }
}

int tg_band_softmax(tgpu *g, const float *F1, const float *PB, float *A, float *nrm, float *F2, const float *mask,
                    int W, td_site ds, char *err)
{
    const float scale = (float)(1.0 / sqrt((double)g->D));
    band_softmax_kernel<<<g->B * g->K * g->M, 128, 0, g->stream>>>(F1, PB, A, nrm, F2, mask, W, g->M, g->K, g->S,
                                                                    scale, ds);
    LAUNCH_TRY(err, "band softmax");
    return 0;
}

__global__ static void band_weights_kernel(const float *A, const float *nrm, const float *mask, float *F2, int W,
                                           int M, int K, int S, td_site drop)
{
    const int r = blockIdx.x, SM = W + M;
    int b, h, i;
    band_row_ids(r, M, K, b, h, i);
    const float *ar = A + (size_t)r * W, *mk = mask + (size_t)h * S;
    const double zb = nrm[r];
    float *fr = F2 + (size_t)r * SM;
    for (int j = threadIdx.x; j < SM; j += blockDim.x) {
        const int c = j - i;
        fr[j] = c >= 0 && c < W ? (float)(ar[c] * mk[c] / zb) * tg_keep(drop, (size_t)r * S + c) : 0.0f;
    }
}

int tg_band_weights(tgpu *g, const float *A, const float *nrm, const float *mask, float *F2, int W, td_site ds,
                    char *err)
{
    band_weights_kernel<<<g->B * g->K * g->M, 128, 0, g->stream>>>(A, nrm, mask, F2, W, g->M, g->K, g->S, ds);
    LAUNCH_TRY(err, "band weights");
    return 0;
}

__global__ static void band_back_kernel(const float *F1, const float *A, const float *nrm, const float *mask,
                                        const float *mskin, float *F2, float *PB, float *dzrow, int W, int M, int K,
                                        int S, float scale, float s_over_r, td_site drop)
{
    __shared__ double ds[32];
    const int r = blockIdx.x, SM = W + M;
    int b, h, i;
    band_row_ids(r, M, K, b, h, i);
    const float *dwr = F1 + (size_t)r * SM + i, *ar = A + (size_t)r * W, *mk = mask + (size_t)h * S,
                *mi = mskin + (size_t)h * S;
    float *pr = PB + ((size_t)(b * M + i) * K + h) * W, *fr = F2 + (size_t)r * SM;
    const double n = nrm[r];
    /* dw before dropout's mask */
    double sw = 0;
    for (int c = threadIdx.x; c < W; c += blockDim.x)
        sw += (double)(dwr[c] * tg_keep(drop, (size_t)r * S + c)) * (ar[c] * mk[c] / n);
    sw = block_sum(sw, ds);
    double sa = 0, dz = 0;
    for (int c = threadIdx.x; c < W; c += blockDim.x) {
        const double db = (dwr[c] * tg_keep(drop, (size_t)r * S + c) - sw) / n, da = db * mk[c];
        if (mi[c] != 0.0f) dz += db * ar[c];
        sa += ar[c] * da;
        pr[c] = (float)da;   /* da for now; ds below, by the same thread */
    }
    sa = block_sum(sa, ds);
    dz = block_sum(dz, ds);
    if (threadIdx.x == 0) dzrow[r] = (float)(dz * s_over_r);
    for (int j = threadIdx.x; j < SM; j += blockDim.x) {
        const int c = j - i;
        float v = 0.0f;
        if (c >= 0 && c < W) {
            v = (float)(ar[c] * (pr[c] - sa) * scale);
            pr[c] = v;
        }
        fr[j] = v;
    }
}

int tg_band_back(tgpu *g, const float *F1, const float *A, const float *nrm, const float *mask, const float *mskin,
                 float *F2, float *PB, float *dzrow, int W, td_site ds, char *err)
{
    const float scale = (float)(1.0 / sqrt((double)g->D));
    band_back_kernel<<<g->B * g->K * g->M, 128, 0, g->stream>>>(F1, A, nrm, mask, mskin, F2, PB, dzrow, W, g->M,
                                                                 g->K, g->S, scale, (float)g->S / g->R, ds);
    LAUNCH_TRY(err, "band back");
    return 0;
}

/* one block per head: its rows (b, h, i) summed in order */
__global__ static void span_grad_kernel(float *gz, const float *dzrow, int B, int K, int M, double extra)
{
    __shared__ double ds[32];
    const int h = blockIdx.x;
    double s = 0;
    for (int k = threadIdx.x; k < B * M; k += blockDim.x) {
        const int b = k / M, i = k % M;
        s += dzrow[((size_t)b * K + h) * M + i];
    }
    s = block_sum(s, ds);
    if (threadIdx.x == 0) gz[h] += (float)(s + extra);
}

int tg_span_grad(tgpu *g, float *gz, const float *dzrow, char *err)
{
    /* the span loss's own gradient once, on the first device */
    span_grad_kernel<<<g->K, 256, 0, g->stream>>>(gz, dzrow, g->B, g->K, g->M, g->rank == 0 ? g->coeff * g->S / g->K : 0.0);
    LAUNCH_TRY(err, "span grad");
    return 0;
}

/* into tmp: row r of the next memory is row r + M of [mem; x] */
__global__ static void carry_kernel(float *out, const float *mem, const float *x, size_t total, int S, int M, int H,
                                    int C)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int col = (int)(i % H);
    const size_t row = i / H, b = row / S;
    const int r = (int)(row % S), p = r + M;
    out[i] = r < S - C ? 0.0f : p < S ? mem[(b * S + p) * H + col] : x[(b * M + p - S) * H + col];
}

int tg_mem_carry(tgpu *g, float *mem, const float *x, int C, char *err)
{
    const size_t total = (size_t)g->B * g->S * g->H;
    carry_kernel<<<tg_blocks(total, 256), 256, 0, g->stream>>>(g->mem_tmp, mem, x, total, g->S, g->M, g->H, C);
    LAUNCH_TRY(err, "memory carry");
    CU_TRY(cudaMemcpyAsync(mem, g->mem_tmp, total * sizeof(float), cudaMemcpyDeviceToDevice, g->stream), err,
           "memory carry copy");
    return 0;
}
