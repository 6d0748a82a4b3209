/*
 * train_band.cu - the adaptive-span attention's products on the band alone
 * (the CUDA trainer, train_gpu_aspan.cu): query i of a stream sees the key
 * rows j = i + c, c < W, of [memory window; block] (SM = W + M rows), so
 * every product of the attention is a product over a diagonal strip of the
 * (query, key row) plane. Three kinds, each batched over (stream, head):
 *
 *   qk   out(i, c)  = sum_d X[i][d] Y[i + c][d]          scores, dw = dO.v
 *   av   out[i][d]  = sum_c P(i, c) Y[i + c][d]          o = w v, dQ = ds k
 *   tav  out[j][d]  = sum_i P(i, j - i) X[i][d]          dK = ds^T q, dV = w^T dO
 *
 * X is a block's rows ([b][M][H], head h's D columns), Y the key rows
 * ([b][SM][H]), P and out(i, c) bands of W columns in a strided layout
 * (tg_band). Every output element is written (tav's rows no query sees
 * get zeros), so no buffer needs clearing.
 *
 * Two ways, the same sums in a fixed order:
 *  - tiles of 64 x 64 outputs a thread block, the reduction in chunks of 32
 *    copied into shared memory by cp.async (elements off the band or the
 *    matrices as zeros), then the tile through shared memory to its global
 *    places (coalesced): float32 on the CUDA cores (a thread 4 x 4
 *    outputs) in float32, or on the tensor cores in TF32 (wmma m16n16k8, a
 *    warp 16 x 32) where the step's products are (tf32 and bf16 precision);
 *  - with tf32 or bf16, heads a multiple of 16 and tiles that fit
 *    (tg_band_tc; windows up to 192 with heads of 64), whole tiles at once
 *    on the tensor cores, the softmax rows (train_band.cuh) fused between
 *    the scores and the product with v (forward) and between dw and
 *    dQ = ds k (backward): below.
 * A 64-query tile touches 64 + W - 1 key rows, so the full score matrices'
 * M x (W + M) a stream and head become M x (64 + W - 1) at most, and the
 * scores and weights move as bands.
 */
#include "train_band.cuh"

#include <math.h>
#include <mma.h>
#include <type_traits>

/* cp.async: 16 bytes; 4 bytes, or (OK false) a zero, the source not read
 * (SRC must still be an address of the operand) */
__device__ __forceinline__ void cp16(float *s, const float *gsrc)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gsrc));
}

__device__ __forceinline__ void cp4(float *s, const float *gsrc, bool ok)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sa), "l"(gsrc), "r"(ok ? 4 : 0));
}

__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

#define BT 64          /* a tile's rows and columns */
#define BK 32          /* the reduction's chunk */
#define BLD 68         /* shared rows' stride (16-byte rows, 32-byte fragment starts) */
#define BTHREADS 256

enum { BAND_QK, BAND_AV, BAND_TAV };

struct band_args {
    int M, W, SM, H, D, K;
    /* X: [b][M][H]; Y: [b][SM][H]; out rows (av: [b][M][H], tav: [b][SM][H]) */
    const float *X, *Y;
    float *out;
    tg_band P, O;   /* P: av's and tav's band; O: qk's output band */
};

__device__ __forceinline__ size_t band_at(const tg_band &p, int b, int h, int i, int c)
{
    return (size_t)b * p.sb + (size_t)h * p.sh + (size_t)i * p.si + c;
}

/* the tile's reduction chunk K0..K0+BK into As[k][m], Bs[k][n] */
template <int KIND>
__device__ __forceinline__ void band_load(const band_args &a, float *As, float *Bs, int b, int h, int r0, int c0,
                                          int k0)
{
    const int t = threadIdx.x;
    /* the stream's rows at head h's columns (av reads no X, tav no Y) */
    const float *X = KIND == BAND_AV ? NULL : a.X + (size_t)b * a.M * a.H + (size_t)h * a.D;
    const float *Y = KIND == BAND_TAV ? NULL : a.Y + (size_t)b * a.SM * a.H + (size_t)h * a.D;
    for (int e = t; e < BT * BK; e += BTHREADS) {
        if (KIND == BAND_QK) {
            /* r0: the first query, c0: the first key row, k0: the first dim */
            const int m = e / BK, k = e % BK, d = k0 + k, i = r0 + m, j = c0 + m;
            const bool xo = i < a.M && d < a.D, yo = j < a.SM && d < a.D;
            cp4(As + k * BLD + m, xo ? X + (size_t)i * a.H + d : X, xo);
            cp4(Bs + k * BLD + m, yo ? Y + (size_t)j * a.H + d : Y, yo);
        } else if (KIND == BAND_AV) {
            /* r0: the first query, c0: the first output dim, k0: the first key row */
            {
                const int m = e / BK, k = e % BK, i = r0 + m, c = k0 + k - i;
                const bool ok = i < a.M && c >= 0 && c < a.W;
                cp4(As + k * BLD + m, ok ? a.P.p + band_at(a.P, b, h, i, c) : a.P.p, ok);
            }
            {
                const int k = e / BT, n = e % BT, j = k0 + k, d = c0 + n;
                const bool ok = j < a.SM && d < a.D;
                cp4(Bs + k * BLD + n, ok ? Y + (size_t)j * a.H + d : Y, ok);
            }
        } else {
            /* r0: the first key row, c0: the first output dim, k0: the first query */
            const int k = e / BT, n = e % BT, i = k0 + k, c = r0 + n - i, d = c0 + n;
            const bool po = i < a.M && c >= 0 && c < a.W, xo = i < a.M && d < a.D;
            cp4(As + k * BLD + n, po ? a.P.p + band_at(a.P, b, h, i, c) : a.P.p, po);
            cp4(Bs + k * BLD + n, xo ? X + (size_t)i * a.H + d : X, xo);
        }
    }
    cp_wait_all();
}

/* Cs[m][n] = sum over the chunks of As[k][m] Bs[k][n] (Cs over As and Bs) */
template <int KIND, bool TC>
__device__ __forceinline__ void band_tile(const band_args &a, float *sm, int b, int h, int r0, int c0, int klo,
                                          int khi)
{
    float *As = sm, *Bs = sm + BK * BLD, *Cs = sm;
    const int t = threadIdx.x;
    if (TC) {
        using namespace nvcuda;
        const int w = t >> 5, wm = (w & 3) * 16, wn = (w >> 2) * 32;
        wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc0, acc1;
        wmma::fill_fragment(acc0, 0.0f);
        wmma::fill_fragment(acc1, 0.0f);
        for (int k0 = klo; k0 < khi; k0 += BK) {
            band_load<KIND>(a, As, Bs, b, h, r0, c0, k0);
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < BK; kk += 8) {
                wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb0, fb1;
                wmma::load_matrix_sync(fa, As + kk * BLD + wm, BLD);
                wmma::load_matrix_sync(fb0, Bs + kk * BLD + wn, BLD);
                wmma::load_matrix_sync(fb1, Bs + kk * BLD + wn + 16, BLD);
#pragma unroll
                for (int q = 0; q < fa.num_elements; q++) fa.x[q] = wmma::__float_to_tf32(fa.x[q]);
#pragma unroll
                for (int q = 0; q < fb0.num_elements; q++) {
                    fb0.x[q] = wmma::__float_to_tf32(fb0.x[q]);
                    fb1.x[q] = wmma::__float_to_tf32(fb1.x[q]);
                }
                wmma::mma_sync(acc0, fa, fb0, acc0);
                wmma::mma_sync(acc1, fa, fb1, acc1);
            }
            __syncthreads();
        }
        wmma::store_matrix_sync(Cs + wm * BLD + wn, acc0, BLD, wmma::mem_row_major);
        wmma::store_matrix_sync(Cs + wm * BLD + wn + 16, acc1, BLD, wmma::mem_row_major);
    } else {
        const int tx = t & 15, ty = t >> 4;
        float acc[4][4] = {};
        for (int k0 = klo; k0 < khi; k0 += BK) {
            band_load<KIND>(a, As, Bs, b, h, r0, c0, k0);
            __syncthreads();
#pragma unroll 8
            for (int k = 0; k < BK; k++) {
                const float4 x = *(const float4 *)(As + k * BLD + ty * 4), y = *(const float4 *)(Bs + k * BLD + tx * 4);
                const float xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
                for (int r = 0; r < 4; r++)
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[r][c] = fmaf(xs[r], ys[c], acc[r][c]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int r = 0; r < 4; r++)
            *(float4 *)(Cs + (ty * 4 + r) * BLD + tx * 4) = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    }
    __syncthreads();
}

/* blockIdx.y = b K + h; blockIdx.x the tile (kind's order) */
template <int KIND, bool TC>
__global__ static void __launch_bounds__(BTHREADS) band_kernel(band_args a)
{
    __shared__ __align__(128) float sm[BT * BLD];
    const int b = blockIdx.y / a.K, h = blockIdx.y % a.K, t = threadIdx.x;
    if (KIND == BAND_QK) {
        const int nj = (BT + a.W - 1 + BT - 1) / BT, i0 = (blockIdx.x / nj) * BT, j0 = i0 + (blockIdx.x % nj) * BT;
        band_tile<KIND, TC>(a, sm, b, h, i0, j0, 0, a.D);
        for (int e = t; e < BT * BT; e += BTHREADS) {
            const int m = e / BT, n = e % BT, i = i0 + m, c = j0 + n - i;
            if (i < a.M && c >= 0 && c < a.W) a.O.p[band_at(a.O, b, h, i, c)] = sm[m * BLD + n];
        }
    } else if (KIND == BAND_AV) {
        const int nd = (a.D + BT - 1) / BT, i0 = (blockIdx.x / nd) * BT, d0 = (blockIdx.x % nd) * BT;
        const int last = (i0 + BT < a.M ? i0 + BT : a.M) - 1 + a.W;   /* one past the last key row */
        band_tile<KIND, TC>(a, sm, b, h, i0, d0, i0, last);
        for (int e = t; e < BT * BT; e += BTHREADS) {
            const int m = e / BT, n = e % BT, i = i0 + m, d = d0 + n;
            if (i < a.M && d < a.D) a.out[((size_t)b * a.M + i) * a.H + (size_t)h * a.D + d] = sm[m * BLD + n];
        }
    } else {
        const int nd = (a.D + BT - 1) / BT, j0 = (blockIdx.x / nd) * BT, d0 = (blockIdx.x % nd) * BT;
        const int lo = j0 - a.W + 1 > 0 ? j0 - a.W + 1 : 0, hi = j0 + BT < a.M ? j0 + BT : a.M;
        band_tile<KIND, TC>(a, sm, b, h, j0, d0, lo, hi);   /* no chunk (zeros) where lo >= hi */
        for (int e = t; e < BT * BT; e += BTHREADS) {
            const int m = e / BT, n = e % BT, j = j0 + m, d = d0 + n;
            if (j < a.SM && d < a.D) a.out[((size_t)b * a.SM + j) * a.H + (size_t)h * a.D + d] = sm[m * BLD + n];
        }
    }
}

template <int KIND>
static int band_launch(tgpu *g, const band_args &a, unsigned tiles, const char *what, char *err)
{
    const dim3 grid(tiles, (unsigned)(g->B * g->K));
    if (g->tf32 || g->bf16)
        band_kernel<KIND, true><<<grid, BTHREADS, 0, g->stream>>>(a);
    else
        band_kernel<KIND, false><<<grid, BTHREADS, 0, g->stream>>>(a);
    LAUNCH_TRY(err, what);
    return 0;
}

static band_args band_base(const tgpu *g, int W)
{
    band_args a = {};
    a.M = g->M, a.W = W, a.SM = W + g->M, a.H = g->H, a.D = g->D, a.K = g->K;
    return a;
}

static unsigned cdiv(int a, int b) { return (unsigned)((a + b - 1) / b); }

int tg_band_qk(tgpu *g, tg_band out, const float *X, const float *Y, int W, char *err)
{
    band_args a = band_base(g, W);
    a.X = X, a.Y = Y, a.O = out;
    return band_launch<BAND_QK>(g, a, cdiv(g->M, BT) * cdiv(BT + W - 1, BT), "band qk", err);
}

static int tc_av(tgpu *g, float *out, tg_band P, const float *Y, int W, char *err);
static int tc_tav(tgpu *g, float *out, tg_band P, const float *X, int W, char *err);

int tg_band_av(tgpu *g, float *out, tg_band P, const float *Y, int W, char *err)
{
    if (tg_band_tc(g, W)) return tc_av(g, out, P, Y, W, err);
    band_args a = band_base(g, W);
    a.Y = Y, a.P = P, a.out = out;
    return band_launch<BAND_AV>(g, a, cdiv(g->M, BT) * cdiv(g->D, BT), "band av", err);
}

int tg_band_tav(tgpu *g, float *out, tg_band P, const float *X, int W, char *err)
{
    if (tg_band_tc(g, W)) return tc_tav(g, out, P, X, W, err);
    band_args a = band_base(g, W);
    a.X = X, a.P = P, a.out = out;
    return band_launch<BAND_TAV>(g, a, cdiv(W + g->M, BT) * cdiv(g->D, BT), "band tav", err);
}

tg_band tg_band_rows(const tgpu *g, float *p, int W)
{
    tg_band r = {p, (long long)g->K * g->M * W, (long long)g->M * W, W};
    return r;
}

tg_band tg_band_pe(const tgpu *g, float *p, int W)
{
    tg_band r = {p, (long long)g->M * g->K * W, W, (long long)g->K * W};
    return r;
}

/* ---- on the tensor cores, whole tiles at once (train_band.cuh's rows
 * fused between the products) ----
 *
 * A block takes 64 queries (or, tav, 64 key rows) of a (stream, head) and
 * every row of the other side its outputs need: JT = 63 + W rounded up to
 * 32 key rows (queries). Everything a block reads comes into shared memory
 * by cp.async at its start (dense rows 16 bytes a copy; bands, the pe band,
 * a, the mask 4 bytes, zeros off the band), so that no load waits on
 * another, and is rounded to TF32 there once. 8 warps: warp w the 16 rows
 * (w mod 4) x 16 and every other 16 columns from w / 4, in TF32
 * (m16n16k8), float32 sums. The rows' kernel keeps the scores in shared
 * memory over the operands it has read, runs the band's rows on them in
 * place (the weights, or ds, left on the band and zeros off it) and
 * multiplies that tile by the third operand's rows. Needs D a multiple of
 * 16 up to 128 and the tiles within the device's shared memory
 * (tg_band_tc). */
#define TC_THREADS 256
#define TC_LDT 68      /* the 64-wide tiles' stride */
#define TC_MAXF 10     /* a warp's 16-column score tiles: JT <= 320 */

/* rows r0 .. r0 + n - 1 of a row-layout operand (BASE: the stream's row 0
 * at head h's columns, rows H apart) into shared rows of LD; rows from
 * LIMIT on as zeros */
__device__ __forceinline__ void tc_rows(float *s, int ld, const float *base, int H, int D, int r0, int n, int limit)
{
    const int q = D / 4;
    for (int e = threadIdx.x; e < n * q; e += TC_THREADS) {
        const int r = e / q, c = (e % q) * 4;
        float *dst = s + r * ld + c;
        if (r0 + r < limit)
            cp16(dst, base + (size_t)(r0 + r) * H + c);
        else
            *(float4 *)dst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

namespace wm = nvcuda::wmma;
typedef wm::fragment<wm::accumulator, 16, 16, 8, float> tc_acc;

/* the N floats at S rounded to TF32 in place, once, so that fragments load
 * them as they are */
__device__ __forceinline__ void tc_round_smem(float *s, int n)
{
    for (int e = threadIdx.x; e < n; e += TC_THREADS) s[e] = wm::__float_to_tf32(s[e]);
}

struct band_tc_args {
    int M, W, SM, H, D, K, S, JT;
    const float *X, *Y, *Z;
    float *out;
    tg_band P;
    /* the fused rows */
    float *PB, *A, *nrm, *F2, *dzrow;
    const float *mask, *mskin;
    float scale, s_over_r;
    td_site drop;
};

static int tc_jt(int W) { return (63 + W + 31) / 32 * 32; }

/* shared floats of the fused rows' kernel: the product's rows (JT), the
 * scores over the scores' operands (64 + JT rows), the pe band or a (64 x
 * W), the mask and its clamp's */
static size_t tc_rows_smem(int D, int JT, int W)
{
    const size_t ops = (size_t)(64 + JT) * (D + 4), sc = (size_t)64 * (JT + 4);
    return (size_t)JT * (D + 4) + (ops > sc ? ops : sc) + (size_t)64 * W + 2 * (size_t)W;
}
/* av, tav: the band's tile (the output's over it, once read), the rows */
static size_t tc_av_smem(int D, int JT)
{
    const size_t p = (size_t)64 * (JT + 4), o = (size_t)64 * (D + 4);
    return (p > o ? p : o) + (size_t)JT * (D + 4);
}
static size_t tc_tav_smem(int D, int JT)
{
    const size_t p = (size_t)JT * TC_LDT, o = (size_t)64 * (D + 4);
    return (p > o ? p : o) + (size_t)JT * (D + 4);
}
#define TC_MAXD 4      /* a warp's 16-column output tiles: D <= 128 */

/* the 64 x D tile in OS to rows r0.. of OUT (the stream's row 0 at head
 * h's columns), rows below LIMIT */
__device__ __forceinline__ void tc_out(float *out, const float *Os, int ldo, int H, int D, int r0, int limit)
{
    const int q = D / 4;
    for (int e = threadIdx.x; e < 64 * q; e += TC_THREADS) {
        const int m = e / q, d = (e % q) * 4;
        if (r0 + m < limit) *(float4 *)(out + (size_t)(r0 + m) * H + d) = *(const float4 *)(Os + m * ldo + d);
    }
}

/* acc[t] (the warp's 16 rows from m0, columns 16 (w / 4 + 2 t)) += A B over
 * K0 rows of the reduction: A at AS (row-major, or ACOL: column-major),
 * B at BS row-major */
template <bool ACOL>
__device__ __forceinline__ void tc_mma(tc_acc *acc, const float *As, int lda, const float *Bs, int ldb, int m0, int w,
                                       int nf, int kmax)
{
    for (int k = 0; k < kmax; k += 8) {
        typedef typename std::conditional<ACOL, wm::col_major, wm::row_major>::type lay;
        wm::fragment<wm::matrix_a, 16, 16, 8, wm::precision::tf32, lay> fa;
        wm::load_matrix_sync(fa, ACOL ? As + k * lda + m0 : As + m0 * lda + k, lda);
#pragma unroll
        for (int t = 0; t < TC_MAXD; t++) {
            const int f = (w >> 2) + 2 * t;
            if (f < nf) {
                wm::fragment<wm::matrix_b, 16, 16, 8, wm::precision::tf32, wm::row_major> fb;
                wm::load_matrix_sync(fb, Bs + k * ldb + f * 16, ldb);
                wm::mma_sync(acc[t], fa, fb, acc[t]);
            }
        }
    }
}

/* the warp's tiles into OS (row-major, LDO) once every warp is done with
 * what OS lies over, then the 64 x D tile to rows r0.. of OUT below LIMIT */
__device__ __forceinline__ void tc_finish(tc_acc *acc, float *Os, int ldo, float *out, int H, int D, int r0,
                                          int limit, int m0, int w)
{
    __syncthreads();
#pragma unroll
    for (int t = 0; t < TC_MAXD; t++) {
        const int f = (w >> 2) + 2 * t;
        if (f < D / 16) wm::store_matrix_sync(Os + m0 * ldo + f * 16, acc[t], ldo, wm::mem_row_major);
    }
    __syncthreads();
    tc_out(out, Os, ldo, H, D, r0, limit);
}

/* out's 64 x D tile (rows r0.. below LIMIT) = A B over KMAX rows of the
 * reduction (tc_mma's operands), through OS */
template <bool ACOL>
__device__ __forceinline__ void tc_product(const float *As, int lda, const float *Bs, int ldb, int kmax, float *Os,
                                           int ldo, float *out, int H, int D, int r0, int limit)
{
    const int w = threadIdx.x >> 5, m0 = (w & 3) * 16;
    tc_acc acc[TC_MAXD];
#pragma unroll
    for (int t = 0; t < TC_MAXD; t++) wm::fill_fragment(acc[t], 0.0f);
    tc_mma<ACOL>(acc, As, lda, Bs, ldb, m0, w, D / 16, kmax);
    tc_finish(acc, Os, ldo, out, H, D, r0, limit, m0, w);
}

/* EPI 0: scores q.k, the softmax rows (a, n; the weights w over the scores),
 * then o = w v; 1: dw = dO.v, the backward rows (ds into the pe band and
 * over dw, dz), then dQ = ds k. X: q or dO; Y: k or v; Z: v or k; out: o
 * or dQ. */
template <int EPI>
__global__ static void __launch_bounds__(TC_THREADS) band_rows_tc(band_tc_args a)
{
    extern __shared__ __align__(128) float sm[];
    const int LDX = a.D + 4, LDS = a.JT + 4, W = a.W;
    const size_t ops = (size_t)(64 + a.JT) * LDX, sc = (size_t)64 * LDS;
    float *Zs = sm, *Xs = Zs + (size_t)a.JT * LDX, *Ys = Xs + 64 * LDX;
    float *Ss = Xs, *Os = Xs;   /* the scores, then the output, over the operands once read */
    float *Pb = Xs + (ops > sc ? ops : sc), *mk = Pb + 64 * W, *mi = mk + W;   /* Pb: the pe band, or a */
    const int b = blockIdx.y / a.K, h = blockIdx.y % a.K, i0 = blockIdx.x * 64;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, m0 = (w & 3) * 16;
    const size_t so = (size_t)b * a.SM * a.H + (size_t)h * a.D;
    tc_rows(Xs, LDX, a.X + (size_t)b * a.M * a.H + (size_t)h * a.D, a.H, a.D, i0, 64, a.M);
    tc_rows(Ys, LDX, a.Y + so, a.H, a.D, i0, a.JT, a.SM);
    tc_rows(Zs, LDX, a.Z + so, a.H, a.D, i0, a.JT, a.SM);
    for (int m = w; m < 64; m += TC_THREADS / 32) {
        const int i = i0 + m;
        const bool ok = i < a.M;
        const float *pr = EPI == 0 ? a.PB + ((size_t)(b * a.M + (ok ? i : 0)) * a.K + h) * W
                                   : a.A + ((size_t)(b * a.K + h) * a.M + (ok ? i : 0)) * W;
        for (int c = lane; c < W; c += 32) cp4(Pb + m * W + c, pr + c, ok);
    }
    for (int c = threadIdx.x; c < W; c += TC_THREADS) {
        cp4(mk + c, a.mask + (size_t)h * a.S + c, true);
        if (EPI == 1) cp4(mi + c, a.mskin + (size_t)h * a.S + c, true);
    }
    cp_wait_all();
    __syncthreads();
    tc_round_smem(Zs, (int)ops + a.JT * LDX);   /* the product's rows and the scores' operands */
    __syncthreads();
    /* the scores */
    {
        tc_acc acc[TC_MAXF];
        const int nf = a.JT / 16;
#pragma unroll
        for (int t = 0; t < TC_MAXF; t++) wm::fill_fragment(acc[t], 0.0f);
        for (int k = 0; k < a.D; k += 8) {
            wm::fragment<wm::matrix_a, 16, 16, 8, wm::precision::tf32, wm::row_major> fa;
            wm::load_matrix_sync(fa, Xs + m0 * LDX + k, LDX);
#pragma unroll
            for (int t = 0; t < TC_MAXF; t++) {
                const int f = (w >> 2) + 2 * t;
                if (f < nf) {
                    wm::fragment<wm::matrix_b, 16, 16, 8, wm::precision::tf32, wm::col_major> fb;
                    wm::load_matrix_sync(fb, Ys + f * 16 * LDX + k, LDX);
                    wm::mma_sync(acc[t], fa, fb, acc[t]);
                }
            }
        }
        __syncthreads();   /* every warp done with the operands: the scores over them */
#pragma unroll
        for (int t = 0; t < TC_MAXF; t++) {
            const int f = (w >> 2) + 2 * t;
            if (f < nf) wm::store_matrix_sync(Ss + m0 * LDS + f * 16, acc[t], LDS, wm::mem_row_major);
        }
    }
    __syncthreads();
    /* off the band (and rows past the block) zeros: the rows below leave
     * there the weights (or ds), a dense tile for the product after */
    for (int e = threadIdx.x; e < 64 * a.JT; e += TC_THREADS) {
        const int m = e / a.JT, col = e % a.JT;
        if (i0 + m >= a.M || (unsigned)(col - m) >= (unsigned)W) Ss[m * LDS + col] = 0.0f;
    }
    const band_lane bl = band_lane_of(lane, W);
    for (int m = w * (32 / bl.n) + lane / bl.n; m < 64 && i0 + m < a.M; m += TC_THREADS / bl.n) {
        const int i = i0 + m, r = (b * a.K + h) * a.M + i;
        float *sr = Ss + m * LDS + m;   /* key row i + c is column m + c; the row's scratch, then its result */
        if (EPI == 0)
            band_softmax_row(sr, Pb + m * W, mk, sr, a.A + (size_t)r * W, a.nrm + r, sr, r, W, a.S, a.scale, bl,
                             a.drop);
        else
            band_back_row(sr, Pb + m * W, a.nrm[r], mk, mi, sr, a.PB + ((size_t)(b * a.M + i) * a.K + h) * W, sr,
                          a.dzrow + r, r, W, a.S, a.scale, a.s_over_r, bl, a.drop);
    }
    __syncthreads();
    tc_round_smem(Ss, 64 * LDS);
    __syncthreads();
    const int rows = a.M - i0 < 64 ? a.M - i0 : 64;
    tc_product<false>(Ss, LDS, Zs, LDX, (rows + W - 1 + 7) / 8 * 8, Os, LDX,
                      a.out + (size_t)b * a.M * a.H + (size_t)h * a.D, a.H, a.D, i0, a.M);
}

/* out[i] = sum_c P(i, c) Y[i + c]: 64 queries, their JT key rows */
__global__ static void __launch_bounds__(TC_THREADS) band_av_tc(band_tc_args a)
{
    extern __shared__ __align__(128) float sm[];
    const int LDP = a.JT + 4, LDY = a.D + 4;
    const size_t pn = (size_t)64 * LDP, on = (size_t)64 * LDY;
    float *Ps = sm, *Os = sm, *Ys = sm + (pn > on ? pn : on);
    const int b = blockIdx.y / a.K, h = blockIdx.y % a.K, i0 = blockIdx.x * 64;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    tc_rows(Ys, LDY, a.Y + (size_t)b * a.SM * a.H + (size_t)h * a.D, a.H, a.D, i0, a.JT, a.SM);
    for (int m = w; m < 64; m += TC_THREADS / 32) {
        const int i = i0 + m;
        const bool iok = i < a.M;
        const float *pr = a.P.p + band_at(a.P, b, h, iok ? i : 0, 0);
        for (int col = lane; col < a.JT; col += 32) {
            const bool ok = iok && (unsigned)(col - m) < (unsigned)a.W;
            cp4(Ps + m * LDP + col, ok ? pr + (col - m) : pr, ok);
        }
    }
    cp_wait_all();
    __syncthreads();
    tc_round_smem(Ps, (int)pn);
    tc_round_smem(Ys, a.JT * LDY);
    __syncthreads();
    const int rows = a.M - i0 < 64 ? a.M - i0 : 64;
    tc_product<false>(Ps, LDP, Ys, LDY, (rows + a.W - 1 + 7) / 8 * 8, Os, LDY,
                      a.out + (size_t)b * a.M * a.H + (size_t)h * a.D, a.H, a.D, i0, a.M);
}

/* out[j] = sum_i P(i, j - i) X[i]: 64 key rows, the queries that see them */
__global__ static void __launch_bounds__(TC_THREADS) band_tav_tc(band_tc_args a)
{
    extern __shared__ __align__(128) float sm[];
    const int LDY = a.D + 4;
    const size_t pn = (size_t)a.JT * TC_LDT, on = (size_t)64 * LDY;
    float *Pt = sm, *Os = sm, *Xs = sm + (pn > on ? pn : on);
    const int b = blockIdx.y / a.K, h = blockIdx.y % a.K, j0 = blockIdx.x * 64;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int lo = j0 - a.W + 1 > 0 ? j0 - a.W + 1 : 0, hi = j0 + 64 < a.M ? j0 + 64 : a.M,
              cnt = hi > lo ? hi - lo : 0;
    tc_rows(Xs, LDY, a.X + (size_t)b * a.M * a.H + (size_t)h * a.D, a.H, a.D, lo, a.JT, hi);
    for (int k = w; k < a.JT; k += TC_THREADS / 32) {
        const int i = lo + k;
        const bool kok = k < cnt;
        const float *pr = a.P.p + band_at(a.P, b, h, kok ? i : 0, 0);
        for (int m = lane; m < 64; m += 32) {
            const int c = j0 + m - i;
            const bool ok = kok && (unsigned)c < (unsigned)a.W;
            cp4(Pt + k * TC_LDT + m, ok ? pr + c : pr, ok);
        }
    }
    cp_wait_all();
    __syncthreads();
    tc_round_smem(Pt, (int)pn);
    tc_round_smem(Xs, a.JT * LDY);
    __syncthreads();
    tc_product<true>(Pt, TC_LDT, Xs, LDY, (cnt + 7) / 8 * 8, Os, LDY,
                     a.out + (size_t)b * a.SM * a.H + (size_t)h * a.D, a.H, a.D, j0, a.SM);
}

int tg_band_tc(const tgpu *g, int W)
{
    if (!(g->tf32 || g->bf16) || g->band_tc_off || g->D % 16 || g->D > 16 * 2 * TC_MAXD || g->H % 4) return 0;
    const int JT = tc_jt(W);
    if (JT > 16 * 2 * TC_MAXF) return 0;
    size_t need = tc_rows_smem(g->D, JT, W);
    need = tc_av_smem(g->D, JT) > need ? tc_av_smem(g->D, JT) : need;
    need = tc_tav_smem(g->D, JT) > need ? tc_tav_smem(g->D, JT) : need;
    return need * sizeof(float) <= (size_t)g->smem_optin;
}

int tg_band_tc_setup(tgpu *g, char *err)
{
    int dev = 0, v = 0;
    CU_TRY(cudaGetDevice(&dev), err, "device");
    CU_TRY(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), err, "shared memory");
    g->smem_optin = v;
    CU_TRY(cudaFuncSetAttribute(band_rows_tc<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, v), err, "attribute");
    CU_TRY(cudaFuncSetAttribute(band_rows_tc<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, v), err, "attribute");
    CU_TRY(cudaFuncSetAttribute(band_av_tc, cudaFuncAttributeMaxDynamicSharedMemorySize, v), err, "attribute");
    CU_TRY(cudaFuncSetAttribute(band_tav_tc, cudaFuncAttributeMaxDynamicSharedMemorySize, v), err, "attribute");
    return 0;
}

static band_tc_args tc_base(const tgpu *g, int W)
{
    band_tc_args a = {};
    a.M = g->M, a.W = W, a.SM = W + g->M, a.H = g->H, a.D = g->D, a.K = g->K, a.S = g->S, a.JT = tc_jt(W);
    a.scale = (float)(1.0 / sqrt((double)g->D));
    a.s_over_r = (float)g->S / g->R;
    return a;
}

int tg_band_attend(tgpu *g, const float *Q, const float *Kr, const float *Vr, const float *PB, float *A, float *nrm,
                   const float *mask, float *att, int W, td_site ds, char *err)
{
    band_tc_args a = tc_base(g, W);
    a.X = Q, a.Y = Kr, a.Z = Vr, a.PB = (float *)PB, a.A = A, a.nrm = nrm, a.mask = mask, a.out = att, a.drop = ds;
    band_rows_tc<0><<<dim3(cdiv(g->M, 64), g->B * g->K), TC_THREADS, sizeof(float) * tc_rows_smem(g->D, a.JT, W),
                      g->stream>>>(a);
    LAUNCH_TRY(err, "band attention");
    return 0;
}

int tg_band_attend_back(tgpu *g, const float *dO, const float *Vr, const float *Kr, const float *A, const float *nrm,
                        const float *mask, const float *mskin, float *PB, float *dzrow, float *dQ, int W, td_site ds,
                        char *err)
{
    band_tc_args a = tc_base(g, W);
    a.X = dO, a.Y = Vr, a.Z = Kr, a.PB = PB, a.A = (float *)A, a.nrm = (float *)nrm, a.mask = mask, a.mskin = mskin,
    a.dzrow = dzrow, a.out = dQ, a.drop = ds;
    band_rows_tc<1><<<dim3(cdiv(g->M, 64), g->B * g->K), TC_THREADS, sizeof(float) * tc_rows_smem(g->D, a.JT, W),
                      g->stream>>>(a);
    LAUNCH_TRY(err, "band attention backward");
    return 0;
}

static int tc_av(tgpu *g, float *out, tg_band P, const float *Y, int W, char *err)
{
    band_tc_args a = tc_base(g, W);
    a.Y = Y, a.P = P, a.out = out;
    band_av_tc<<<dim3(cdiv(g->M, 64), g->B * g->K), TC_THREADS, sizeof(float) * tc_av_smem(g->D, a.JT), g->stream>>>(
        a);
    LAUNCH_TRY(err, "band av");
    return 0;
}

static int tc_tav(tgpu *g, float *out, tg_band P, const float *X, int W, char *err)
{
    band_tc_args a = tc_base(g, W);
    a.X = X, a.P = P, a.out = out;
    band_tav_tc<<<dim3(cdiv(W + g->M, 64), g->B * g->K), TC_THREADS, sizeof(float) * tc_tav_smem(g->D, a.JT),
                  g->stream>>>(a);
    LAUNCH_TRY(err, "band tav");
    return 0;
}
