/*
 * ring.cu - a block's keys and values enter the memory, after the layer's
 * attention has read it (a separate launch: within one launch the writes
 * would race with other queries' reads of the same rows).
 *
 *   adaptive-span: per head, the last kw keys of the block go to key-ring
 *     slot ring_slot(p, kw), the last r values to value-ring slot
 *     ring_slot(p, r) (core/aspan.c).
 *   PAR attention block: the last mem_len rows of keys and values (all
 *     heads, A wide) go to slot p % mem_len (core/par.c).
 * The rings hold the model's precision (RT: float, or bf16 as the
 * projections wrote them).
 */
#include "gpu_internal.cuh"

template <typename RT>
__global__ static void aspan_ring_kernel(const RT *qkv, int M, int D, const int *krows, const int *reach,
                                         const int64_t *off, RT *const *ring, const int64_t *pos)
{
    const int n = blockIdx.x, h = blockIdx.y, K = gridDim.y, H = K * D;
    const int b = n / M, i = n % M, kw = krows[h], r = reach[h];
    const int64_t p = pos[b] + i;
    const RT *k = qkv + (size_t)n * 3 * H + H + (size_t)h * D, *v = k + H;
    RT *kr = ring[b] + off[h], *vr = kr + (size_t)kw * D;
    const bool wk = kw > 0 && i >= M - kw, wv = r > 0 && i >= M - r;
    RT *kd = wk ? kr + (size_t)ring_slot(p, kw) * D : NULL, *vd = wv ? vr + (size_t)ring_slot(p, r) * D : NULL;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        if (wk) kd[c] = k[c];
        if (wv) vd[c] = v[c];
    }
}

template <typename RT>
__global__ static void par_ring_kernel(const RT *qkv, int M, int A, int ML, int64_t off, RT *const *ring,
                                       const int64_t *pos)
{
    const int n = blockIdx.x, b = n / M, i = n % M;
    if (i < M - ML) return;
    const int sl = (int)((pos[b] + i) % ML);
    const RT *k = qkv + (size_t)n * 3 * A + A, *v = k + A;
    RT *kd = ring[b] + off + (size_t)sl * A, *vd = ring[b] + off + (size_t)ML * A + (size_t)sl * A;
    for (int c = threadIdx.x; c < A; c += blockDim.x) {
        kd[c] = k[c];
        vd[c] = v[c];
    }
}

int gpu_aspan_ring_write(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int K = m->n_head, D = m->d_head;
    dim3 grid((unsigned)(B * M), (unsigned)K);
    const int T = D < 128 ? D : 128;
    const int *kr = g->krows + (size_t)l * K, *re = g->reach + (size_t)l * K;
    const int64_t *off = g->d_off + (size_t)l * K, *pos = stage_pos(g, g->d_stage);
    if (g->prec == GPU_BF16)
        aspan_ring_kernel<<<grid, T, 0, g->stream>>>(g->qkvb, M, D, kr, re, off, (bf16 *const *)stage_ring(g, g->d_stage), pos);
    else
        aspan_ring_kernel<<<grid, T, 0, g->stream>>>(g->qkv, M, D, kr, re, off, stage_ring(g, g->d_stage), pos);
    LAUNCH_TRY(err, "aspan_ring_write");
    return 0;
}

/* The same in 16-byte pieces (A x sizeof(RT) a multiple of 16, the rings'
 * offsets too): a warp a row, 8 rows a block */
template <typename RT>
__global__ static void __launch_bounds__(256)
    par_ring16_kernel(const RT *qkv, int n, int M, int A, int ML, int64_t off, RT *const *ring, const int64_t *pos)
{
    const int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= n) return;
    const int b = r / M, i = r % M;
    if (i < M - ML) return;
    const int sl = (int)((pos[b] + i) % ML), w = A * (int)sizeof(RT) / 16;
    const uint4 *k = (const uint4 *)(qkv + (size_t)r * 3 * A + A), *v = (const uint4 *)(qkv + (size_t)r * 3 * A + 2 * A);
    uint4 *kd = (uint4 *)(ring[b] + off + (size_t)sl * A), *vd = (uint4 *)(ring[b] + off + (size_t)ML * A + (size_t)sl * A);
    for (int c = lane; c < w; c += 32) {
        kd[c] = k[c];
        vd[c] = v[c];
    }
}

int gpu_par_ring_write(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    const int A = m->n_head * m->d_head;
    if (m->mem_len <= 0) return 0;
    const unsigned nb = (unsigned)(B * M), T = A < 256 ? A : 256;
    const int64_t off = (int64_t)g->h_off[l], *pos = stage_pos(g, g->d_stage);
    const int es = g->prec == GPU_BF16 ? 2 : 4, n = B * M;
    if ((A * es) % 16 == 0 && (off * es) % 16 == 0) {   /* (the rings and the step's buffers: cudaMalloc's) */
        if (g->prec == GPU_BF16)
            par_ring16_kernel<<<(unsigned)((n + 7) / 8), 256, 0, g->stream>>>(g->qkvb, n, M, A, m->mem_len, off,
                                                                              (bf16 *const *)stage_ring(g, g->d_stage), pos);
        else
            par_ring16_kernel<<<(unsigned)((n + 7) / 8), 256, 0, g->stream>>>(g->qkv, n, M, A, m->mem_len, off,
                                                                              stage_ring(g, g->d_stage), pos);
        LAUNCH_TRY(err, "par_ring_write");
        return 0;
    }
    if (g->prec == GPU_BF16)
        par_ring_kernel<<<nb, T, 0, g->stream>>>(g->qkvb, M, A, m->mem_len, off, (bf16 *const *)stage_ring(g, g->d_stage), pos);
    else
        par_ring_kernel<<<nb, T, 0, g->stream>>>(g->qkv, M, A, m->mem_len, off, stage_ring(g, g->d_stage), pos);
    LAUNCH_TRY(err, "par_ring_write");
    return 0;
}
