/*
 * train_attn.cu - the adaptive-span attention of the CUDA trainer, forward
 * and backward, and the memory carried between blocks (core/train_aspan.c
 * has the math; train_internal.cuh the layouts).
 *
 * The products q.k, w v and their backwards are cuBLAS batched products on
 * the full score matrices (train_gpu_aspan.cu); the kernels here do what
 * lies on the band, one warp per (stream, head, query) row, and write the
 * full rows' zeros off the band only when the buffer does not hold them
 * from the band before (the same window):
 *
 *   forward   s_c = (q.k_{i+c} + q.pe_c) / sqrt(D);  a = softmax(s);
 *             w_c = a_c m_c / n,  n = sum_c a_c m_c + 1e-8
 *   backward  (dw from dO V^T)  db_c = (dw_c - sum_j dw_j w_j) / n;
 *             da_c = db_c m_c;  ds_c = a_c (da_c - sum_j a_j da_j) / sqrt(D);
 *             dz += db_c a_c S/R where the mask's clamp passes a gradient
 *
 * The mask m_c = clamp((1 - (W - c) + z S) / R + 1, 0, 1) is computed from
 * the device's z/S each forward. Rows are summed in double.
 *
 * The memory moves on in place, only over the rows that can be non-zero.
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
 * row; the full row gets VAL(c) there and zeros elsewhere. A warp a row
 * (BAND_WARPS rows a block), lane l the band's columns c = l mod 32, its
 * sums in double across the warp. */
#define BAND_WARPS 4

__device__ __forceinline__ void band_row_ids(int r, int M, int K, int &b, int &h, int &i)
{
    i = r % M;
    const int bh = r / M;
    b = bh / K;
    h = bh % K;
}

/* The zeros of a full row off its band (columns 0..i-1 and i+W..W+M-1),
 * written only when F2 does not hold them already (tg_f2_full). */
__device__ __forceinline__ void band_zeros(float *fr, int i, int W, int SM, int lane)
{
    for (int j = lane; j < i; j += 32) fr[j] = 0.0f;
    for (int j = i + W + lane; j < SM; j += 32) fr[j] = 0.0f;
}

/* the final weights w_c = a_c m_c / n through dropout DS, into the band of
 * the full row FR (each lane its own columns) */
__device__ __forceinline__ void band_put(float *fr, const float *ar, const float *mk, double zb, int r, int S, int W,
                                         int lane, const td_site &drop)
{
    for (int c = lane; c < W; c += 32) fr[c] = (float)(ar[c] * mk[c] / zb) * tg_keep(drop, (size_t)r * S + c);
}

__global__ static void band_softmax_kernel(const float *F1, const float *PB, float *A, float *nrm, float *F2,
                                           const float *mask, int rows, int W, int M, int K, int S, float scale,
                                           int full, td_site drop)
{
    const int r = blockIdx.x * BAND_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31, SM = W + M;
    if (r >= rows) return;
    int b, h, i;
    band_row_ids(r, M, K, b, h, i);
    const float *sr = F1 + (size_t)r * SM + i, *pr = PB + ((size_t)(b * M + i) * K + h) * W;
    const float *mk = mask + (size_t)h * S;
    float *ar = A + (size_t)r * W, *fr = F2 + (size_t)r * SM;
    float mx = -INFINITY;
    for (int c = lane; c < W; c += 32) mx = fmaxf(mx, (sr[c] + pr[c]) * scale);
    mx = warp_max(mx);
    double z = 0;
    for (int c = lane; c < W; c += 32) {
        const float e = expf((sr[c] + pr[c]) * scale - mx);
        ar[c] = e;
        z += e;
    }
    z = warp_sum(z);
    double zb = 0;
    for (int c = lane; c < W; c += 32) {
        const float a = (float)(ar[c] / z);
        ar[c] = a;
        zb += (double)a * mk[c];
    }
    zb = warp_sum(zb) + 1e-8;
    if (lane == 0) nrm[r] = (float)zb;
    band_put(fr + i, ar, mk, zb, r, S, W, lane, drop);
    if (full) band_zeros(fr, i, W, SM, lane);
}

/* Whether the band kernels must write the zeros of F2's rows at window W
 * (row stride W + M): not while F2 holds them already, from its allocation
 * (all zeros) or from the last band written at the same W. Only the band
 * kernels write F2. */
static int tg_f2_full(tgpu *g, int W)
{
    const int full = g->f2_w != W && g->f2_w != TG_F2_ZERO;
    g->f2_w = W;
    return full;
}

static unsigned band_blocks(const tgpu *g) { return tg_blocks((size_t)g->B * g->K * g->M, BAND_WARPS); }

int tg_band_softmax(tgpu *g, const float *F1, const float *PB, float *A, float *nrm, float *F2, const float *mask,
                    int W, td_site ds, char *err)
{
    const float scale = (float)(1.0 / sqrt((double)g->D));
    band_softmax_kernel<<<band_blocks(g), 32 * BAND_WARPS, 0, g->stream>>>(
        F1, PB, A, nrm, F2, mask, g->B * g->K * g->M, W, g->M, g->K, g->S, scale, tg_f2_full(g, W), ds);
    LAUNCH_TRY(err, "band softmax");
    return 0;
}

__global__ static void band_weights_kernel(const float *A, const float *nrm, const float *mask, float *F2, int rows,
                                           int W, int M, int K, int S, int full, td_site drop)
{
    const int r = blockIdx.x * BAND_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31, SM = W + M;
    if (r >= rows) return;
    int b, h, i;
    band_row_ids(r, M, K, b, h, i);
    float *fr = F2 + (size_t)r * SM;
    band_put(fr + i, A + (size_t)r * W, mask + (size_t)h * S, (double)nrm[r], r, S, W, lane, drop);
    if (full) band_zeros(fr, i, W, SM, lane);
}

int tg_band_weights(tgpu *g, const float *A, const float *nrm, const float *mask, float *F2, int W, td_site ds,
                    char *err)
{
    band_weights_kernel<<<band_blocks(g), 32 * BAND_WARPS, 0, g->stream>>>(A, nrm, mask, F2, g->B * g->K * g->M, W,
                                                                          g->M, g->K, g->S, tg_f2_full(g, W), ds);
    LAUNCH_TRY(err, "band weights");
    return 0;
}

__global__ static void band_back_kernel(const float *F1, const float *A, const float *nrm, const float *mask,
                                        const float *mskin, float *F2, float *PB, float *dzrow, int rows, int W,
                                        int M, int K, int S, float scale, float s_over_r, int full, td_site drop)
{
    const int r = blockIdx.x * BAND_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31, SM = W + M;
    if (r >= rows) return;
    int b, h, i;
    band_row_ids(r, M, K, b, h, i);
    const float *dwr = F1 + (size_t)r * SM + i, *ar = A + (size_t)r * W, *mk = mask + (size_t)h * S,
                *mi = mskin + (size_t)h * S;
    float *pr = PB + ((size_t)(b * M + i) * K + h) * W, *fr = F2 + (size_t)r * SM;
    const double n = nrm[r];
    /* dw before dropout's mask */
    double sw = 0;
    for (int c = lane; c < W; c += 32)
        sw += (double)(dwr[c] * tg_keep(drop, (size_t)r * S + c)) * (ar[c] * mk[c] / n);
    sw = warp_sum(sw);
    double sa = 0, dz = 0;
    for (int c = lane; c < W; c += 32) {
        const double db = (dwr[c] * tg_keep(drop, (size_t)r * S + c) - sw) / n, da = db * mk[c];
        if (mi[c] != 0.0f) dz += db * ar[c];
        sa += ar[c] * da;
        pr[c] = (float)da;   /* da for now; ds below, by the same lane */
    }
    sa = warp_sum(sa);
    dz = warp_sum(dz);
    if (lane == 0) dzrow[r] = (float)(dz * s_over_r);
    for (int c = lane; c < W; c += 32) {
        const float v = (float)(ar[c] * (pr[c] - sa) * scale);
        pr[c] = v;
        fr[i + c] = v;
    }
    if (full) band_zeros(fr, i, W, SM, lane);
}

int tg_band_back(tgpu *g, const float *F1, const float *A, const float *nrm, const float *mask, const float *mskin,
                 float *F2, float *PB, float *dzrow, int W, td_site ds, char *err)
{
    const float scale = (float)(1.0 / sqrt((double)g->D));
    band_back_kernel<<<band_blocks(g), 32 * BAND_WARPS, 0, g->stream>>>(
        F1, A, nrm, mask, mskin, F2, PB, dzrow, g->B * g->K * g->M, W, g->M, g->K, g->S, scale, (float)g->S / g->R,
        tg_f2_full(g, W), ds);
    LAUNCH_TRY(err, "band back");
    return 0;
}

/* one block per head: its rows (b, h, i) summed in a fixed order (a
 * thread every SPAN_GRAD_THREADS-th row, its loads in flight together) */
#define SPAN_GRAD_THREADS 1024

__global__ static void span_grad_kernel(float *gz, const float *dzrow, int B, int K, int M, double extra)
{
    __shared__ double ds[32];
    const int h = blockIdx.x;
    double s = 0;
#pragma unroll 8
    for (int k = threadIdx.x; k < B * M; k += SPAN_GRAD_THREADS) {
        const int b = k / M, i = k % M;
        s += dzrow[((size_t)b * K + h) * M + i];
    }
    s = block_sum(s, ds);
    if (threadIdx.x == 0) gz[h] += (float)(s + extra);
}

int tg_span_grad(tgpu *g, float *gz, const float *dzrow, char *err)
{
    /* the span loss's own gradient once, on the first device */
    span_grad_kernel<<<g->K, SPAN_GRAD_THREADS, 0, g->stream>>>(gz, dzrow, g->B, g->K, g->M,
                                                               g->rank == 0 ? g->coeff * g->S / g->K : 0.0);
    LAUNCH_TRY(err, "span grad");
    return 0;
}

/* The next memory, in place: row r becomes row r + M of [mem; x], or zero
 * before S - C. Only the last R rows are written (R = max(C, the rows that
 * may be non-zero now): those before are zeros already). A thread a
 * (stream, column) walks its rows upward, CARRY_ROWS at a time, all of a
 * batch's reads before its writes: row r + M > r is read before it is
 * written, and no written row is read again. */
#define CARRY_ROWS 8

__global__ static void carry_kernel(float *mem, const float *x, int B, int S, int M, int H, int C, int R)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)B * H) return;
    const size_t b = t / H, col = t % H;
    float *mb = mem + b * S * H + col;
    const float *xb = x + b * M * H + col;
    for (int r0 = S - R; r0 < S; r0 += CARRY_ROWS) {
        float v[CARRY_ROWS];
#pragma unroll
        for (int k = 0; k < CARRY_ROWS; k++) {
            const int r = r0 + k, p = r + M;
            v[k] = r >= S || r < S - C ? 0.0f : p < S ? mb[(size_t)p * H] : xb[(size_t)(p - S) * H];
        }
#pragma unroll
        for (int k = 0; k < CARRY_ROWS; k++)
            if (r0 + k < S) mb[(size_t)(r0 + k) * H] = v[k];
    }
}

int tg_mem_carry(tgpu *g, int l, const float *x, int C, char *err)
{
    const int R = C > g->mem_live[l] ? C : g->mem_live[l];
    float *mem = g->mem + (size_t)l * g->B * g->S * g->H;
    if (R > 0) {
        carry_kernel<<<tg_blocks((size_t)g->B * g->H, 128), 128, 0, g->stream>>>(mem, x, g->B, g->S, g->M, g->H, C, R);
        LAUNCH_TRY(err, "memory carry");
    }
    g->mem_live[l] = C;
    return 0;
}
