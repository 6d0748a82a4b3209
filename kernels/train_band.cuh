/*
 * train_band.cuh - one (stream, head, query) row of the adaptive-span
 * band's softmax and its backward, band_lanes(W) lanes a row (lane l of a
 * row the columns c = l mod their count), float sums across the row's
 * lanes in a fixed order: the math of train_attn.cu's band
 * kernels, and of train_band.cu's fused kernels, which read the row's scores
 * from shared memory instead (core/train_aspan.c):
 *
 *   forward   s_c = (q.k_{i+c} + q.pe_c) / sqrt(D);  a = softmax(s);
 *             w_c = a_c m_c / n,  n = sum_c a_c m_c + 1e-8
 *   backward  (dw from dO V^T)  db_c = (dw_c - sum_j dw_j w_j) / n;
 *             da_c = db_c m_c;  ds_c = a_c (da_c - sum_j a_j da_j) / sqrt(D);
 *             dz += db_c a_c S/R where the mask's clamp passes a gradient
 *
 * R is the row's index (b K + h) M + i, dropout's element R S + c.
 */
#ifndef SPANSERVE_TRAIN_BAND_CUH
#define SPANSERVE_TRAIN_BAND_CUH

#include "train_internal.cuh"

/* a row's lanes: 8 for windows up to 256 (4 rows a warp at once), a warp
 * for wider ones (their rows are long enough to keep 32 lanes busy) */
__host__ __device__ __forceinline__ int band_lanes(int W) { return W <= 256 ? 8 : 32; }

/* a row's lanes: its place among them, how many, and their shuffle mask */
struct band_lane {
    int l, n;
    unsigned mask;
};

__device__ __forceinline__ band_lane band_lane_of(int lane, int W)
{
    const int n = band_lanes(W);
    band_lane b = {lane % n, n, n == 32 ? 0xffffffffu : ((1u << n) - 1) << (lane / n * n)};
    return b;
}

__device__ __forceinline__ float band_sum(float v, const band_lane &bl)
{
    for (int o = bl.n / 2; o; o >>= 1) v += __shfl_xor_sync(bl.mask, v, o, bl.n);
    return v;
}

__device__ __forceinline__ float band_max(float v, const band_lane &bl)
{
    for (int o = bl.n / 2; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(bl.mask, v, o, bl.n));
    return v;
}

/* the final weights w_c = a_c m_c / n through dropout DS, into the band FR */
__device__ __forceinline__ void band_put(float *fr, const float *ar, const float *mk, float zb, int r, int S, int W,
                                         const band_lane &bl, const td_site &drop)
{
    const float iz = 1.0f / zb;
    for (int c = bl.l; c < W; c += bl.n) fr[c] = ar[c] * mk[c] * iz * tg_keep(drop, (size_t)r * S + c);
}

/* scores SR (q.k), pe band PR -> a into AR, n into *NRM, the final weights
 * into FR; TMP holds e, then a, on the way (AR itself, or a row of shared
 * memory: then SR's, which it may overwrite) */
__device__ __forceinline__ void band_softmax_row(const float *sr, const float *pr, const float *mk, float *tmp,
                                                 float *ar, float *nrm, float *fr, int r, int W, int S, float scale,
                                                 const band_lane &bl, const td_site &drop)
{
    float mx = -INFINITY;
    for (int c = bl.l; c < W; c += bl.n) mx = fmaxf(mx, (sr[c] + pr[c]) * scale);
    mx = band_max(mx, bl);
    float z = 0;
    for (int c = bl.l; c < W; c += bl.n) {
        const float e = __expf((sr[c] + pr[c]) * scale - mx);
        tmp[c] = e;
        z += e;
    }
    const float iz = 1.0f / band_sum(z, bl);
    float zb = 0;
    for (int c = bl.l; c < W; c += bl.n) {
        const float a = tmp[c] * iz;
        tmp[c] = a;
        zb += a * mk[c];
    }
    zb = band_sum(zb, bl) + 1e-8f;
    if (bl.l == 0) *nrm = zb;
    const float izb = 1.0f / zb;
    for (int c = bl.l; c < W; c += bl.n) {
        if (ar != tmp) ar[c] = tmp[c];
        fr[c] = tmp[c] * mk[c] * izb * tg_keep(drop, (size_t)r * S + c);
    }
}

/* dw (DWR, before dropout's mask) -> ds into PR (and FR unless NULL), the
 * row's z/S gradient into *DZ; TMP holds da on the way (PR itself, or a
 * row of shared memory: then DWR's, which it may overwrite) */
__device__ __forceinline__ void band_back_row(const float *dwr, const float *ar, float n, const float *mk,
                                              const float *mi, float *tmp, float *pr, float *fr, float *dz_out,
                                              int r, int W, int S, float scale, float s_over_r, const band_lane &bl,
                                              const td_site &drop)
{
    const float in = 1.0f / n;
    float sw = 0;
    for (int c = bl.l; c < W; c += bl.n) sw += dwr[c] * tg_keep(drop, (size_t)r * S + c) * (ar[c] * mk[c] * in);
    sw = band_sum(sw, bl);
    float sa = 0, dz = 0;
    for (int c = bl.l; c < W; c += bl.n) {
        const float db = (dwr[c] * tg_keep(drop, (size_t)r * S + c) - sw) * in, da = db * mk[c];
        if (mi[c] != 0.0f) dz += db * ar[c];
        sa += ar[c] * da;
        tmp[c] = da;
    }
    sa = band_sum(sa, bl);
    dz = band_sum(dz, bl);
    if (bl.l == 0) *dz_out = dz * s_over_r;
    for (int c = bl.l; c < W; c += bl.n) {
        const float v = ar[c] * (tmp[c] - sa) * scale;
        pr[c] = v;
        if (fr) fr[c] = v;
    }
}

#endif
