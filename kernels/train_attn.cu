/*
 * train_attn.cu - the adaptive-span attention of the CUDA trainer, forward
 * and backward, and the memory carried between blocks (core/train_aspan.c
 * has the math; train_internal.cuh the layouts).
 *
 * The products q.k, w v and their backwards are train_band.cu's on the band
 * (windows up to TG_BAND_MAX; F1 and F2 then hold bands of W) or cuBLAS
 * batched products on the full score matrices (train_gpu_aspan.cu); the
 * kernels here do what lies on the band (train_band.cuh's rows,
 * band_lanes(W) lanes a (stream, head, query) row), and write full rows'
 * zeros off the band only when the buffer does not hold them from the band
 * before (the same window):
 *
 *   forward   s_c = (q.k_{i+c} + q.pe_c) / sqrt(D);  a = softmax(s);
 *             w_c = a_c m_c / n,  n = sum_c a_c m_c + 1e-8
 *   backward  (dw from dO V^T)  db_c = (dw_c - sum_j dw_j w_j) / n;
 *             da_c = db_c m_c;  ds_c = a_c (da_c - sum_j a_j da_j) / sqrt(D);
 *             dz += db_c a_c S/R where the mask's clamp passes a gradient
 *
 * The mask m_c = clamp((1 - (W - c) + z S) / R + 1, 0, 1) is computed from
 * the device's z/S each forward. Rows are summed in float, in a fixed order.
 *
 * The memory moves on in place, only over the rows that can be non-zero.
 */
#include "train_band.cuh"

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

__global__ static void hall_kernel(float *hall, tbf16 *hb, const float *mem, const float *x, size_t total, int W,
                                   int M, int S, int H)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int col = (int)(i % H), SM = W + M;
    const size_t row = i / H, b = row / SM;
    const int r = (int)(row % SM);
    const float v = r < W ? mem[(b * S + S - W + r) * H + col] : x[(b * M + r - W) * H + col];
    hall[i] = v;
    if (hb) hb[i] = __float2bfloat16(v);
}

int tg_build_hall(tgpu *g, float *hall, tbf16 *hb, const float *mem, const float *x, int W, char *err)
{
    const size_t total = (size_t)g->B * (W + g->M) * g->H;
    hall_kernel<<<tg_blocks(total, 256), 256, 0, g->stream>>>(hall, hb, mem, x, total, W, g->M, g->S, g->H);
    LAUNCH_TRY(err, "hall");
    return 0;
}

/* Row r = (b K + h) M + i: its band sits at columns i..i+W-1 of the full
 * row (or is the row, with bands); the full row gets VAL(c) there and zeros
 * elsewhere. band_lanes(W) lanes a row, BAND_THREADS threads a block. */
#define BAND_THREADS 128

__device__ __forceinline__ void band_row_ids(int r, int M, int K, int &b, int &h, int &i)
{
    i = r % M;
    const int bh = r / M;
    b = bh / K;
    h = bh % K;
}

/* The zeros of a full row off its band (columns 0..i-1 and i+W..W+M-1),
 * written only when F2 does not hold them already (tg_f2_full). */
__device__ __forceinline__ void band_zeros(float *fr, int i, int W, int SM, const band_lane &bl)
{
    for (int j = bl.l; j < i; j += bl.n) fr[j] = 0.0f;
    for (int j = i + W + bl.l; j < SM; j += bl.n) fr[j] = 0.0f;
}

/* F1's and F2's rows: bands (BAND: W columns, the band at 0) or full rows
 * (W + M, the band at column i) */
__device__ __forceinline__ size_t band_ld(int band, int W, int M) { return band ? (size_t)W : (size_t)W + M; }

__global__ static void band_softmax_kernel(const float *F1, const float *PB, float *A, float *nrm, float *F2,
                                           const float *mask, int rows, int W, int M, int K, int S, float scale,
                                           int full, int band, td_site drop)
{
    const int r = blockIdx.x * (BAND_THREADS / band_lanes(W)) + threadIdx.x / band_lanes(W), SM = W + M;
    if (r >= rows) return;
    const band_lane bl = band_lane_of(threadIdx.x & 31, W);
    int b, h, i;
    band_row_ids(r, M, K, b, h, i);
    const size_t ld = band_ld(band, W, M), at = band ? 0 : i;
    const float *sr = F1 + (size_t)r * ld + at, *pr = PB + ((size_t)(b * M + i) * K + h) * W;
    const float *mk = mask + (size_t)h * S;
    float *ar = A + (size_t)r * W, *fr = F2 + (size_t)r * ld;
    band_softmax_row(sr, pr, mk, ar, ar, nrm + r, fr + at, r, W, S, scale, bl, drop);
    if (full) band_zeros(fr, i, W, SM, bl);
}

/* Whether the band kernels must write the zeros of F2's full rows at window
 * W (row stride W + M): not while F2 holds them already, from its
 * allocation (all zeros) or from the last band written at the same W. Only
 * the band kernels write F2. BAND: F2 holds bands now, no zeros. */
static int tg_f2_full(tgpu *g, int W, int band)
{
    if (band) {
        g->f2_w = TG_F2_BAND;
        return 0;
    }
    const int full = g->f2_w != W && g->f2_w != TG_F2_ZERO;
    g->f2_w = W;
    return full;
}

static unsigned band_blocks(const tgpu *g, int W)
{
    return tg_blocks((size_t)g->B * g->K * g->M, BAND_THREADS / band_lanes(W));
}

int tg_band_softmax(tgpu *g, const float *F1, const float *PB, float *A, float *nrm, float *F2, const float *mask,
                    int W, int band, td_site ds, char *err)
{
    const float scale = (float)(1.0 / sqrt((double)g->D));
    band_softmax_kernel<<<band_blocks(g, W), BAND_THREADS, 0, g->stream>>>(
        F1, PB, A, nrm, F2, mask, g->B * g->K * g->M, W, g->M, g->K, g->S, scale, tg_f2_full(g, W, band), band, ds);
    LAUNCH_TRY(err, "band softmax");
    return 0;
}

__global__ static void band_weights_kernel(const float *A, const float *nrm, const float *mask, float *F2, int rows,
                                           int W, int M, int K, int S, int full, int band, td_site drop)
{
    const int r = blockIdx.x * (BAND_THREADS / band_lanes(W)) + threadIdx.x / band_lanes(W), SM = W + M;
    if (r >= rows) return;
    const band_lane bl = band_lane_of(threadIdx.x & 31, W);
    int b, h, i;
    band_row_ids(r, M, K, b, h, i);
    float *fr = F2 + (size_t)r * band_ld(band, W, M);
    band_put(fr + (band ? 0 : i), A + (size_t)r * W, mask + (size_t)h * S, nrm[r], r, S, W, bl, drop);
    if (full) band_zeros(fr, i, W, SM, bl);
}

int tg_band_weights(tgpu *g, const float *A, const float *nrm, const float *mask, float *F2, int W, int band,
                    td_site ds, char *err)
{
    band_weights_kernel<<<band_blocks(g, W), BAND_THREADS, 0, g->stream>>>(
        A, nrm, mask, F2, g->B * g->K * g->M, W, g->M, g->K, g->S, tg_f2_full(g, W, band), band, ds);
    LAUNCH_TRY(err, "band weights");
    return 0;
}

__global__ static void band_back_kernel(const float *F1, const float *A, const float *nrm, const float *mask,
                                        const float *mskin, float *F2, float *PB, float *dzrow, int rows, int W,
                                        int M, int K, int S, float scale, float s_over_r, int full, int band,
                                        td_site drop)
{
    const int r = blockIdx.x * (BAND_THREADS / band_lanes(W)) + threadIdx.x / band_lanes(W), SM = W + M;
    if (r >= rows) return;
    const band_lane bl = band_lane_of(threadIdx.x & 31, W);
    int b, h, i;
    band_row_ids(r, M, K, b, h, i);
    const float *dwr = F1 + (size_t)r * band_ld(band, W, M) + (band ? 0 : i), *ar = A + (size_t)r * W,
                *mk = mask + (size_t)h * S, *mi = mskin + (size_t)h * S;
    float *pr = PB + ((size_t)(b * M + i) * K + h) * W, *fr = F2 + (size_t)r * SM;
    band_back_row(dwr, ar, nrm[r], mk, mi, pr, pr, band ? NULL : fr + i, dzrow + r, r, W, S, scale, s_over_r, bl,
                  drop);
    if (full) band_zeros(fr, i, W, SM, bl);
}

int tg_band_back(tgpu *g, const float *F1, const float *A, const float *nrm, const float *mask, const float *mskin,
                 float *F2, float *PB, float *dzrow, int W, int band, td_site ds, char *err)
{
    const float scale = (float)(1.0 / sqrt((double)g->D));
    /* with bands F2 keeps the weights (the backward's dV has read them) */
    const int full = band ? 0 : tg_f2_full(g, W, 0);
    band_back_kernel<<<band_blocks(g, W), BAND_THREADS, 0, g->stream>>>(
        F1, A, nrm, mask, mskin, F2, PB, dzrow, g->B * g->K * g->M, W, g->M, g->K, g->S, scale, (float)g->S / g->R,
        full, band, ds);
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
 * may be non-zero now): those before are zeros already), in launches of at
 * most M rows going upward, a thread an element: a launch over rows
 * [r0, r1) reads rows r + M >= r1 (or x), which only later launches
 * write. */
__global__ static void carry_kernel(float *mem, const float *x, int S, int M, int H, int C, int r0, int rows,
                                    size_t total)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    const size_t per = (size_t)rows * H, b = t / per;
    const int r = r0 + (int)(t % per / H), col = (int)(t % H), p = r + M;
    float *mb = mem + b * S * H;
    mb[(size_t)r * H + col] = r < S - C ? 0.0f : p < S ? mb[(size_t)p * H + col] : x[(b * M + p - S) * H + col];
}

int tg_mem_carry(tgpu *g, int l, const float *x, int C, char *err)
{
    const int R = C > g->mem_live[l] ? C : g->mem_live[l];
    float *mem = g->mem + (size_t)l * g->B * g->S * g->H;
    for (int r0 = g->S - R; r0 < g->S; r0 += g->M) {
        const int rows = g->S - r0 < g->M ? g->S - r0 : g->M;
        const size_t total = (size_t)g->B * rows * g->H;
        carry_kernel<<<tg_blocks(total, 256), 256, 0, g->stream>>>(mem, x, g->S, g->M, g->H, C, r0, rows, total);
        LAUNCH_TRY(err, "memory carry");
    }
    g->mem_live[l] = C;
    return 0;
}
