/*
 * train_internal.cuh - what the CUDA trainer's files share: the device
 * trainer (parameter arenas, memories, the activations a backward needs, the
 * backward's scratch; error checks from check.cuh and block reductions from
 * reduce.cuh, as the inference core's), the families it trains (tg_family:
 * train_gpu_aspan.cu, train_gpu_par.cu), and the launchers of train_ops.cu
 * (matrix products, embedding, LayerNorm, ReLU, loss, column sums,
 * optimizer) and train_attn.cu (the span-masked attention and the memory).
 * train_gpu.cu plans the shared buffers, moves the arenas and runs a step.
 *
 * Layouts (row-major, as core/train_aspan.c and core/train_par.c; N = B*M
 * rows of a block):
 *   row layout    [b][r][H]: the linear layers' inputs and outputs
 *                 (head h: columns h*D..h*D+D-1; the attention's batched
 *                 products take one head's columns of every stream)
 *   adaptive-span:
 *   full scores   [b][h][i][W+M]: query i against every key row of its
 *                 stream ([memory window; block]); only columns i..i+W-1
 *                 (the band) can be non-zero
 *   band          [b][h][i][W]: column c of query i is key row i + c, at
 *                 distance W - c (the softmax a is kept in this form; so
 *                 are the scores and weights on the band products' path)
 *   pe band       [b*M+i][h][W]: q_i . pe[:, S-W+c], rows of Q seen as
 *                 N*K rows of D
 *   PAR:
 *   scores        [h][b][i][KL]: query i of stream b against key row j of
 *                 [memory; block] (KL = mem_len + M, klen = mlen + M used);
 *                 a head's B*M rows are contiguous, so that products
 *                 against the positions' keys (shared by the streams) are
 *                 one product a head
 */
#ifndef SPANSERVE_TRAIN_INTERNAL_CUH
#define SPANSERVE_TRAIN_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "err.h"
#include "train.h"
}
#include "train_drop.h"
#include "train_gpu.h"

#include "check.cuh"    /* CU_TRY, BLAS_TRY, LAUNCH_TRY */
#include "reduce.cuh"   /* warp_sum, block_sum, block_max */

/* Column sums are done in TG_COL_CHUNKS slices of rows, then the slices
 * summed in order: no atomics, the same bits every run. */
#define TG_COL_CHUNKS 64
/* LayerNorm's backward sums its weights' gradients in at most this many
 * slices of rows (a block each), then the slices in order */
#define TG_LN_CHUNKS 512

typedef __nv_bfloat16 tbf16;
/* The optimizer walks the arena in chunks of this many elements, none
 * across two tensors. */
#define TG_OPT_CHUNK 4096

struct tg_family;

struct tgpu {
    /* data parallel (train_multi.cu): this device's streams are [b0, b0 + B)
     * of the step's B_all; rank 0 adds the loss's constant gradients; the
     * mean loss divides by all the tokens N_all = B_all M. With a
     * communicator (an ncclComm_t; NULL alone) the gradient is summed over
     * the devices: with OVERLAP (and BUCKETS: each layer's tensors one
     * run), in buckets as the backward goes: layer l's tensors
     * [bk_lo[l], bk_hi[l]) once its backward is done (on cstream, of the
     * highest priority, after ev_grad), the rest's runs [rest_lo, rest_hi)
     * at the end, and the next work on the step's stream waits for
     * ev_comm; else the whole gradient in one all-reduce on the step's
     * stream after the backward */
    int b0, B_all, rank;
    size_t N_all;
    void *comm;
    /* with a communicator: the forward sums its loss (and the stop request
     * STOP_LOCAL) over every device of the run; STOP_ALL how many asked */
    int sum_all, stop_local, stop_all;
    cudaStream_t cstream;
    cudaEvent_t ev_grad, ev_comm;
    size_t *bk_lo, *bk_hi, *rest_lo, *rest_hi;
    int n_rest, buckets, overlap;
    const struct tg_family *fam;
    int L, B, M, H, K, D, S, I, V, R, N;
    int AW;                       /* PAR: the attention's width nh * dh */
    int bf16;                     /* products on bf16 tensor cores (cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_16BF) */
    int tf32;                     /* the linear layers in TF32 (cuBLAS's math mode) */
    /* adaptive-span: the attention's products on the band (train_band.cu)
     * for windows up to band_max (SPANSERVE_TRAIN_BAND_MAX; else cuBLAS on
     * the full score matrices), on the tensor cores in TF32 where the step's
     * products are (tf32 or bf16) */
    int band_max;
    int smem_optin;               /* the device's shared memory a block may have */
    int band_tc_off;              /* SPANSERVE_TRAIN_BAND_TC=0: not the fused tensor-core kernels */
    double coeff;                 /* adapt_span_loss */
    train_optim optim;
    double grad_clip, beta1, beta2, adam_eps;
    size_t n;                     /* parameters */
    int n_tp;
    size_t *zoff;                 /* host, L: offset of layer l's current_val */
    size_t emb, key_pe, out_w, out_b, r_w_bias, r_r_bias;
    tlayer *ly;                   /* host copy of the trainer's offsets */
    char device[256];
    cudaStream_t stream;
    cublasHandle_t blas;
    size_t bytes;
    /* arenas of n floats, the host trainer's layout */
    float *w, *g, *m1, *m2;
    /* memories, the host trainer's layout (L x B x mem_rows x H, mem_n
     * floats); the stash for evaluation */
    size_t mem_n;
    int mem_rows;
    float *mem, *mem_keep;
    /* host, L: the memory rows in use (PAR's t->mlen), their stash, and the
     * rows each layer's last forward saw */
    int *mlen, *mlen_keep, *mlen_fwd;
    /* host, L (adaptive-span): the rows at the end of each layer's memory
     * that may be non-zero (the rows before them are zeros), and their
     * stash; the carry writes only those and the cache */
    int *mem_live, *mem_live_keep;
    /* adaptive-span (train_gpu_aspan.cu): activations kept for the backward
     * (per layer unless said) */
    float *X;                     /* (L+1) x N x H: every layer's input and the last output */
    float *hall;                  /* L x B x (W+M) x H, packed at the layer's window W */
    float *Q, *Kr, *Vr;           /* L x N x H; L x B x (W+M) x H twice */
    float *A;                     /* L x (B K M) x W: the softmax a (band) */
    float *nrm;                   /* L x B K M: sum a m + 1e-8 */
    float *mask, *mskin;          /* L x K x S: m_c, and 1 where its clamp passes a gradient */
    float *att, *xh1, *x1, *xh2;  /* L x N x H */
    float *r1, *r2;               /* L x N */
    float *ff;                    /* L x N x I, after the ReLU */
    float *logp;                  /* N x V; the loss gradient in place in the backward */
    float *nll;                   /* N */
    int *win, *cache;             /* host, L: the window and cache of the last forward */
    /* adaptive-span scratch */
    float *F1, *F2;               /* scores: B K M (S+M) each (full rows, or bands of W) */
    int f2_w;                     /* F2 holds the zeros off the bands of window f2_w (TG_F2_ZERO: all zeros;
                                   * TG_F2_BAND: bands, no full rows) */
    float *PB;                    /* pe band: N K S */
    float *tmp, *dX, *dY, *dX1, *dAtt, *dQ;   /* N x H */
    float *dFF;                   /* N x I */
    float *dKr, *dVr;             /* B x (S+M) x H */
    float *dzrow;                 /* B K M */
    double *colpart;              /* TG_COL_CHUNKS x max(H, I, V) */
    double *lnpart;               /* 3 x TG_LN_CHUNKS x H: LayerNorm's backward's slices */
    /* precision bf16 (tg_family.plan_bf16; PAR: its feed-forward branch
     * only, w holding fc1_w and fc2_w at off[2 l + k], X one block's
     * input, ff every block's hidden layer, dY and dFF; below, adaptive-
     * span's): the
     * products whose operands a kernel of the step writes read bf16 copies
     * of them (cuBLAS's bf16 kernels, float32 sums): the weights (w: each
     * layer's wq wk wv wo fc1_w fc2_w at off[6 l + k], every element at 16
     * bytes' alignment; seg: their (arena offset, offset in w, length)
     * triples on the device, nseg of them), every layer's input (L+1 x N x
     * H), key rows (as hall), attention output, LN1 output (N x H each) and
     * hidden layer after its ReLU (N x I), and the backward's dY, dFF, dQ,
     * dKr and dVr of one layer. NULL w: none (float32 operands, rounded to
     * bf16 on the tensor cores). */
    struct {
        tbf16 *w, *X, *hall, *att, *x1, *ff, *dY, *dFF, *dQ, *dKr, *dVr;
        size_t *off, *seg;
        int nseg;
    } bo;
    double *dsum;                 /* scalar results */
    /* the block's tokens: x, y (N each), then the rows of each token id
     * (offsets V+1, row indices N) for the embedding's backward */
    int32_t *d_tok, *h_tok;
    /* PAR (train_gpu_par.cu), kept per layer: cat = [memory; X] (L x B x KL
     * x D, rows from klen on zero), its q k v (L x B x KL x 3A), the
     * positions' keys (L x KL x A), the softmax (L x scores), the heads'
     * outputs (L x N x A), each branch's LayerNorm output, xhat and rstd
     * (L x N x D; L x N), the feed-forward after its ReLU (L x N x I); the
     * sinusoid of distances 0..KL-1 (KL x D) */
    struct {
        int KL;
        float *cat, *qkv, *pos, *rk, *P, *av, *oa, *xha, *ra, *ff, *of, *xhf, *rf;
        /* dropout: the sinusoid after its mask (KL x D) and the sinusoid
         * this forward used (pos or posd); the last output after its mask
         * (N x D) */
        float *posd, *posu, *xo;
        /* scratch: q + r_w_bias, q + r_r_bias (N x A), two score matrices,
         * the gradients of the next layer's input, of a branch's output
         * (N x D), of av and the two parts of dq (N x A), of the
         * feed-forward (N x I), of qkv (B x KL x 3A, rows of no query or
         * key zero), of the positions' keys (KL x A); the mixture's three
         * dot products */
        float *qu, *qv, *S1, *S2, *dXn, *dS, *dAV, *dq1, *dq2, *dFF, *dqkv, *dRK;
        double *dmix;
    } par;
    /* optimizer: chunks (tensor, offset, length), per tensor its first
     * chunk, chunk count and kind; partial sums and the per-tensor factor;
     * per tensor what this step does with it (TG_ACT_*), on the host and
     * the device */
    int n_chunk;
    int *ck_t, *ck_len, *tp_first, *tp_nck, *tp_kind, *tp_act, *h_act;
    size_t *ck_off;
    double *ck_part, *tp_scale;
    /* the elements the host trainer mirrors after each step (z/S, alpha):
     * their arena offsets (host and device) and a gather buffer */
    int n_mirror;
    size_t *mir_off, *h_mir_off;
    float *mirror, *h_mirror;
    double *h_sum;   /* pinned: the loss and stop requests from the device, the stop flag to it */
    /* every device allocation, freed together */
    void *allocs[120];
    int n_allocs;
};


/* f2_w of an F2 of zeros only (as allocated): any window's zeros; of an F2
 * the band products used (no zeros kept) */
#define TG_F2_ZERO (-2)
#define TG_F2_BAND (-1)

/* A band of W columns a (stream b, head h, query i) row: element c at
 * p + b sb + h sh + i si + c. tg_band_rows: [(b K + h) M + i][W] (the
 * softmax's, the scores'); tg_band_pe: [(b M + i) K + h][W] (the pe band's) */
typedef struct tg_band {
    float *p;
    long long sb, sh, si;
} tg_band;

/* What the optimizer does with a tensor this step (train_param_active):
 * leave it alone, update it as a weight, or as PAR's alpha (Adam at
 * arch_lr, outside the clipping). */
enum { TG_ACT_NONE = 0, TG_ACT_WEIGHT = 1, TG_ACT_ALPHA = 2 };

/* A family the CUDA trainer runs: its file's plan of the buffers beyond
 * the shared ones (train_gpu.cu's tgpu_new allocates w, g, m1, m2, the
 * memories, X, logp, nll, dX, dY, tmp and the column sums' scratch) and its
 * block: the forward from the uploaded tokens (g->d_tok), with BACKWARD the
 * gradient into g->g (zeroed by the caller), with CARRY the memories
 * advanced; the loss summed into g->dsum[0]; *AUX the family's
 * regulariser. */
typedef struct tg_family {
    const train_family *fam;
    int (*plan)(tgpu *g, const trainer *t, char *err);
    /* NULL, or the bf16 copies of g->bo, planned once when bf16 is first set */
    int (*plan_bf16)(tgpu *g, char *err);
    int (*block)(tgpu *g, const trainer *t, int backward, int carry, double *aux, char *err);
} tg_family;
extern const tg_family tg_family_aspan, tg_family_par;

/* ---- train_gpu.cu, for the data-parallel trainer (train_multi.cu) ---- */

/* tgpu_new for the streams [b0, b0 + nb) of T's batch on the current
 * device, RANK its place among the devices */
tgpu *tgpu_new_part(const trainer *t, int b0, int nb, int rank, char *err);
/* the forward of this device's streams of X, Y: the sum of their NLLs */
int tgpu_forward_sum(tgpu *g, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                     double *sum, double *aux, char *err);
/* the optimizer at STEP (1-based), T left as it is but for the mirror of
 * z/S and alpha (MIRROR: this device writes it) */
int tgpu_step_part(tgpu *g, trainer *t, long step, double lr, int mirror, char *err);
/* both in one: forward and backward with the memories carried, then the
 * optimizer at STEP unless the loss (*SUM, every device's) is not finite,
 * all launched before one wait */
int tgpu_train_step_sum(tgpu *g, trainer *t, const int32_t *x, const int32_t *y, long step, double lr, int mirror,
                        double *sum, double *aux, char *err);
/* into T: this device's streams of the memories, and with WEIGHTS the
 * weights, moments and memory rows */
int tgpu_download_part(tgpu *g, trainer *t, int weights, char *err);

/* ---- train_multi.cu: one step over several devices ---- */
typedef struct tmulti tmulti;
/* T's batch over its config's gpus devices (0..gpus-1), one host thread a
 * device, the gradient summed by NCCL */
tmulti *tmulti_new(const trainer *t, char *err);
void tmulti_free(tmulti *m);
double tmulti_forward(tmulti *m, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                      double *aux, char *err);
int tmulti_step(tmulti *m, trainer *t, double lr, char *err);
/* tmulti_forward (backward, memories carried) and tmulti_step in one
 * command (tgpu_train_step_sum on every device) */
double tmulti_train_step(tmulti *m, trainer *t, const int32_t *x, const int32_t *y, double lr, double *aux, char *err);
int tmulti_reset_memory(tmulti *m, char *err);
int tmulti_stash_memory(tmulti *m, int restore, char *err);
int tmulti_download(tmulti *m, trainer *t, char *err);
const char *tmulti_device_name(tmulti *m);
int tmulti_primary(tmulti *m);
int tmulti_stop_agreed(tmulti *m);

/* cudaMalloc'd (and zeroed) buffer of BYTES into *PP, freed by tgpu_free */
int tg_alloc(tgpu *g, void *pp, size_t bytes, char *err);
/* The output layer and the loss of the last layer's output XL: the NLL of
 * each row summed into g->dsum[0]; tg_loss_back: the gradient of the mean
 * loss to out_w, out_b and into g->dX. */
int tg_loss(tgpu *g, const float *XL, char *err);
int tg_loss_back(tgpu *g, const float *XL, char *err);

/* the factor of element I at dropout site S on the device: 0 or 1/(1-p) */
__device__ __forceinline__ float tg_keep(const td_site &s, uint64_t i)
{
    return s.thresh == 0 ? 1.0f : td_kept(&s, i) ? s.scale : 0.0f;
}
/* dropout site SITE of layer L at rate P for T's step (none unless
 * t->drop); PER_STREAM: the site's elements a stream, so that a device
 * whose streams start at b0 draws the elements the CPU's indices name */
static inline td_site tg_site(const tgpu *g, const trainer *t, int site, int l, double p, size_t per_stream);

static inline td_site tg_site(const tgpu *g, const trainer *t, int site, int l, double p, size_t per_stream)
{
    td_site s = td_make(t->c.seed, t->step, site, l, t->drop ? p : 0);
    s.off = (uint64_t)g->b0 * per_stream;
    return s;
}

/* After the backward of layer L (-1: the whole backward is done): with a
 * communicator, the sum over the devices of the gradient it finished */
int tg_grad_ready(tgpu *g, int l, char *err);

static inline unsigned tg_blocks(size_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

/* ---- train_ops.cu ---- */

/* Row-major C[m x n] = alpha op(A) op(B) + beta C (TA, TB: 1 = transposed),
 * as core's tops_gemm; _batched: COUNT products, each operand advanced by
 * its stride (0: shared). */
int tg_gemm(tgpu *g, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
            int ldb, float beta, float *C, int ldc, char *err);
int tg_gemm_batched(tgpu *g, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
                    long long sa, const float *B, int ldb, long long sb, float beta, float *C, int ldc,
                    long long sc, int count, char *err);
/* tg_gemm with bf16 operands (float32 sums and C) */
int tg_gemm_bf(tgpu *g, int ta, int tb, int m, int n, int k, float alpha, const tbf16 *A, int lda, const tbf16 *B,
               int ldb, float beta, float *C, int ldc, char *err);
int tg_gemm_batched_bf(tgpu *g, int ta, int tb, int m, int n, int k, float alpha, const tbf16 *A, int lda,
                       long long sa, const tbf16 *B, int ldb, long long sb, float beta, float *C, int ldc,
                       long long sc, int count, char *err);
/* dst[i] = bf16(src[i]), n elements; _seg: the NSEG (src offset, dst
 * offset, length) triples SEG (device) of src into dst */
int tg_to_bf16(tgpu *g, tbf16 *dst, const float *src, size_t n, char *err);
int tg_seg_to_bf16(tgpu *g, tbf16 *dst, const float *src, const size_t *seg, int nseg, char *err);
/* the bf16 copy of N weight tensors (arena offsets SRC, lengths LEN), for a
 * family's plan_bf16: g->bo.off[i] each one's place in the copy (at 16
 * bytes' alignment), g->bo.seg and nseg the table tg_seg_to_bf16 reads
 * (on the device), *W the copy (allocated; the caller sets g->bo.w) */
int tg_plan_bf16_weights(tgpu *g, const size_t *src, const size_t *len, int n, tbf16 **w, char *err);
/* x[n] = emb[tok[n]] * scale, then dropout site DS (element n*d + j) */
int tg_embed(tgpu *g, float *x, const float *emb, const int32_t *tok, int n, int d, float scale, td_site ds,
             char *err);
/* gemb[v] += scale * the sum of dx's rows of token v (rows listed by off/idx), through DS */
int tg_embed_back(tgpu *g, float *gemb, const float *dx, const int32_t *off, const int32_t *idx, int V, int d,
                  float scale, td_site ds, char *err);
/* y[i] = (x[i] (+ bias[i % cols])) * dropout DS's factor of element i, n elements (y may be x) */
int tg_dropout(tgpu *g, float *y, const float *x, const float *bias, int cols, size_t n, td_site ds, char *err);
/* y = a x (ACC 0) or y += a x (ACC 1), n elements */
int tg_axpy(tgpu *g, float *y, const float *x, float a, size_t n, int acc, char *err);
/* *out (device double) = sum of x[i] y[i] over n */
int tg_dot(tgpu *g, double *out, const float *x, const float *y, size_t n, char *err);
/* u = a (+ bias) + res;  y = (u - mean) rstd * w + b, xhat and rstd kept */
int tg_ln_fwd(tgpu *g, float *y, float *xhat, float *rstd, const float *a, const float *bias, const float *res,
              const float *w, const float *b, int n, int d, char *err);
/* tg_ln_fwd, and with YB y's bf16 copy too */
int tg_ln_fwd2(tgpu *g, float *y, float *xhat, float *rstd, tbf16 *yb, const float *a, const float *bias,
               const float *res, const float *w, const float *b, int n, int d, char *err);
/* dx = rstd (dy w - mean(dy w) - xhat mean(dy w xhat)) (overwrites dx);
 * gw += sum dy xhat, gb += sum dy */
int tg_ln_back(tgpu *g, float *dx, float *gw, float *gb, const float *dy, const float *xhat, const float *rstd,
               const float *w, int n, int d, char *err);
/* tg_ln_back, dx written also to DX2 and as bf16 to DXB (each unless
 * NULL; dx itself may be NULL where DX2 is given), and with GOUT gout +=
 * sum dx (the column sums in the same pass, a warp a row, for d up to
 * 1024) */
int tg_ln_back2(tgpu *g, float *dx, float *dx2, tbf16 *dxb, float *gw, float *gb, float *gout, const float *dy,
                const float *xhat, const float *rstd, const float *w, int n, int d, char *err);
/* out[j] += sum_i a[i][j] (* b[i][j] if b), rows of COLS */
int tg_colsum(tgpu *g, float *out, const float *a, const float *b, int rows, int cols, char *err);
/* y = max(y + bias, 0), then dropout DS (element n*d + j) */
int tg_bias_relu(tgpu *g, float *y, const float *bias, int n, int d, td_site ds, char *err);
/* tg_bias_relu from X (may be y) into y, or with YB into yb (bf16) only */
int tg_bias_relu2(tgpu *g, float *y, tbf16 *yb, const float *x, const float *bias, int n, int d, td_site ds,
                  char *err);
/* dy = y > 0 ? dy * scale : 0 over rows x cols (y after the ReLU and
 * dropout, read as YB where given; SCALE the kept elements' factor), the
 * result into DYB (bf16) instead of dy where given, and gbias += its
 * column sums (in the same pass) */
int tg_relu_back2(tgpu *g, float *dy, tbf16 *dyb, const float *y, const tbf16 *yb, float *gbias, int rows, int cols,
                  float scale, char *err);
/* logits += bias, log-softmax in place, nll[i] = -logp[i][y_i] */
int tg_xent(tgpu *g, float *logits, float *nll, const float *bias, const int32_t *y, int n, int V, char *err);
/* logp -> SCALE (softmax - onehot) */
int tg_xent_back(tgpu *g, float *logp, const int32_t *y, int n, int V, float scale, char *err);
/* *out (device double) = sum of x[0..n) */
int tg_sum(tgpu *g, double *out, const float *x, int n, char *err);
/* dst[i] = src[i] (float <-> double), on the device */
int tg_f2d(tgpu *g, double *dst, const float *src, size_t n, char *err);
int tg_d2f(tgpu *g, float *dst, const double *src, size_t n, char *err);
/* One optimizer update of every tensor the step trains (g->tp_act;
 * core/train_optim.c): weights at LR, PAR's alpha by Adam at ARCH_LR; then
 * z/S clamped. */
int tg_optim(tgpu *g, double lr, double arch_lr, long step, const double *guard, char *err);
/* g->mirror[i] = g->w[g->mir_off[i]] */
int tg_gather_mirror(tgpu *g, char *err);

/* ---- train_band.cu: the attention's products on the band (windows of W;
 * X a block's rows, Y the key rows [memory window; block], H columns, head
 * h's D of them) ---- */

/* out(b, h, i, c) = X[b][i] . Y[b][i + c] over head h's columns */
int tg_band_qk(tgpu *g, tg_band out, const float *X, const float *Y, int W, char *err);
/* out[b][i] (head h's columns) = sum_c P(b, h, i, c) Y[b][i + c] */
int tg_band_av(tgpu *g, float *out, tg_band P, const float *Y, int W, char *err);
/* out[b][j] (every key row, head h's columns) = sum_i P(b, h, i, j - i) X[b][i] */
int tg_band_tav(tgpu *g, float *out, tg_band P, const float *X, int W, char *err);
tg_band tg_band_rows(const tgpu *g, float *p, int W);
tg_band tg_band_pe(const tgpu *g, float *p, int W);
/* Whether windows of W run on the tensor cores (the step's products are
 * tf32 or bf16, heads a multiple of 16 up to 128, the tiles fit the shared
 * memory); then tg_band_av and tg_band_tav do, and a layer's attention
 * (scores, the softmax rows of train_band.cuh, o = w v) is one kernel,
 * tg_band_attend: a, nrm and att, not the weights (tg_band_weights makes
 * them for the backward); tg_band_attend_back: dw = dO v^T, the rows'
 * backward (ds into the pe band PB, dzrow) and dQ = ds K (overwritten). */
int tg_band_tc(const tgpu *g, int W);
int tg_band_tc_setup(tgpu *g, char *err);
int tg_band_attend(tgpu *g, const float *Q, const float *Kr, const float *Vr, const float *PB, float *A, float *nrm,
                   const float *mask, float *att, int W, td_site ds, char *err);
int tg_band_attend_back(tgpu *g, const float *dO, const float *Vr, const float *Kr, const float *A, const float *nrm,
                        const float *mask, const float *mskin, float *PB, float *dzrow, float *dQ, int W, td_site ds,
                        char *err);

/* ---- train_attn.cu ---- */

/* mask[h][c] = clamp((1 - (W - c) + z_h S) / R + 1, 0, 1) for c < W, and
 * mskin 1 where the clamp passes a gradient */
int tg_span_mask(tgpu *g, float *mask, float *mskin, const float *zf, int W, char *err);
/* hall[b] = [mem[b][S-W..S); x[b]], and its bf16 copy into HB unless NULL */
int tg_build_hall(tgpu *g, float *hall, tbf16 *hb, const float *mem, const float *x, int W, char *err);
/* BAND: F1 and F2 hold bands (tg_band_rows), else full rows of W + M.
 * Scores F1 + pe band -> a (band), nrm, and the final weights w into F2,
 * through dropout DS (element row * S + c) */
int tg_band_softmax(tgpu *g, const float *F1, const float *PB, float *A, float *nrm, float *F2, const float *mask,
                    int W, int band, td_site ds, char *err);
/* the final weights again from a, mask and nrm, through DS, into F2 */
int tg_band_weights(tgpu *g, const float *A, const float *nrm, const float *mask, float *F2, int W, int band,
                    td_site ds, char *err);
/* from dw (F1, after dropout DS): d(score) as the pe band into PB (and, full
 * rows, into F2), each row's z/S gradient into dzrow */
int tg_band_back(tgpu *g, const float *F1, const float *A, const float *nrm, const float *mask, const float *mskin,
                 float *F2, float *PB, float *dzrow, int W, int band, td_site ds, char *err);
/* gz[h] += sum of head h's dzrow + coeff S / K */
int tg_span_grad(tgpu *g, float *gz, const float *dzrow, char *err);
/* layer L's memory = the last S rows of [memory; x], rows before S - C
 * zeroed (g->mem_live[L] becomes C) */
int tg_mem_carry(tgpu *g, int l, const float *x, int C, char *err);

#endif
