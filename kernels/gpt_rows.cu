/*
 * gpt_rows.cu - the rows of a window model's step (core/gpt.c, fam_gpt.cu):
 * a group of windows is R rows in the step buffers, window k's computed
 * rows at row0..row0+n-1 (gpu_gpt_win). The glue around the linear layers
 * and the attention:
 *
 *   index   each row's window, token and window row (the token of window
 *           row r, absolute position p = start + r: the stream's ring before
 *           the step, p % window, else the step's own tokens);
 *   embed   x = wte[token] + wpe[window row];
 *   bias    the projections' bias, into float or the bfloat16 copy the
 *           attention and the cache read;
 *   cache   the keys and values of a window that grows over the stream's
 *           cache (nanoGPT from position 0) into it: layer l's K rows at the
 *           slot's offset, V rows window x E elements later (mem_t's layout);
 *   gather  the wanted rows (out_from..) packed in output order, for LN_f
 *           and the head.
 *
 * One thread an element (or a row), nothing shared: each kernel is a loop
 * of core's written out.
 */
#include "gpu_internal.cuh"

/* One block a window: its rows' window, token and window row. */
__global__ static void gpt_index_kernel(const gpu_gpt_win *w, const int32_t *rings, const int32_t *tokens, int M, int C,
                                        int32_t *rowwin, int32_t *rowtok, int32_t *rowpos)
{
    const int k = blockIdx.x;
    const gpu_gpt_win v = w[k];
    for (int j = threadIdx.x; j < v.n; j += blockDim.x) {
        const int r = v.cached + j, row = v.row0 + j;
        const int64_t p = v.start + r;
        rowwin[row] = k;
        rowpos[row] = r;
        rowtok[row] = p < v.pos ? rings[(size_t)v.b * C + (size_t)(p % C)] : tokens[(size_t)v.b * M + (size_t)(p - v.pos)];
    }
}

int gpu_gpt_index(gpu_model *g, const gpu_gpt_win *w, int nw, const int32_t *rings, const int32_t *tokens, int M,
                  int32_t *rowwin, int32_t *rowtok, int32_t *rowpos, char *err)
{
    if (nw <= 0) return 0;
    gpt_index_kernel<<<nw, 128, 0, g->stream>>>(w, rings, tokens, M, g->m->window, rowwin, rowtok, rowpos);
    LAUNCH_TRY(err, "gpt_index");
    return 0;
}

/* x = wte[tok] + wpe[window row], as core adds them */
__global__ static void gpt_embed_kernel(float *x, const float *wte, const float *wpe, const int32_t *rowtok,
                                        const int32_t *rowpos, size_t total, int d)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const size_t row = i / d, c = i % d;
    x[i] = wte[(size_t)rowtok[row] * d + c] + wpe[(size_t)rowpos[row] * d + c];
}

int gpu_gpt_embed(gpu_model *g, float *x, const int32_t *rowtok, const int32_t *rowpos, int R, char *err)
{
    const int d = g->m->d_model;
    const size_t total = (size_t)R * d;
    if (total == 0) return 0;
    gpt_embed_kernel<<<(unsigned)((total + 255) / 256), 256, 0, g->stream>>>(x, g->emb, g->wpe, rowtok, rowpos, total, d);
    LAUNCH_TRY(err, "gpt_embed");
    return 0;
}

/* out = y + b (b may be NULL), as core's ops_linear adds a bias */
template <typename T> __global__ static void gpt_bias_kernel(T *out, const float *y, const float *b, size_t total, int d)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    stf(out + i, b ? y[i] + b[i % d] : y[i]);
}

int gpu_gpt_bias(gpu_model *g, float *out, bf16 *outb, const float *y, const float *b, int R, int d, char *err)
{
    const size_t total = (size_t)R * d;
    if (total == 0) return 0;
    const unsigned blocks = (unsigned)((total + 255) / 256);
    if (outb) gpt_bias_kernel<bf16><<<blocks, 256, 0, g->stream>>>(outb, y, b, total, d);
    else gpt_bias_kernel<float><<<blocks, 256, 0, g->stream>>>(out, y, b, total, d);
    LAUNCH_TRY(err, "gpt_bias");
    return 0;
}

/* A thread an element of a row's key (and value): rows of windows that
 * write their keys and values into the cache of their stream. RINGS: each
 * stream's memory (the staged ring bases), OFF: layer l's slot offset. */
template <typename T>
__global__ static void gpt_cache_kernel(void *const *rings, size_t off, int C, const T *qkv, const gpu_gpt_win *w,
                                        const int32_t *rowwin, size_t total, int E)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const size_t row = i / E, c = i % E;
    const gpu_gpt_win v = w[rowwin[row]];
    if (!v.write_kv) return;
    const size_t r = (size_t)v.cached + (row - (size_t)v.row0);   /* the window row (< window) */
    T *k = (T *)rings[v.b] + off;
    const T *src = qkv + row * 3 * E;
    k[r * E + c] = src[E + c];
    k[(size_t)C * E + r * E + c] = src[2 * (size_t)E + c];
}

int gpu_gpt_cache_write(gpu_model *g, int l, const gpu_gpt_win *w, int R, const int32_t *rowwin, char *err)
{
    const model_t *m = g->m;
    const int E = m->n_head * m->d_head;
    const size_t total = (size_t)R * E;
    if (total == 0) return 0;
    void *const *rings = (void *const *)stage_ring(g, g->d_stage);
    const unsigned blocks = (unsigned)((total + 255) / 256);
    if (g->prec == GPU_BF16)
        gpt_cache_kernel<bf16><<<blocks, 256, 0, g->stream>>>(rings, g->h_off[l], m->window, g->qkvb, w, rowwin, total, E);
    else
        gpt_cache_kernel<float><<<blocks, 256, 0, g->stream>>>(rings, g->h_off[l], m->window, g->qkv, w, rowwin, total, E);
    LAUNCH_TRY(err, "gpt_cache_write");
    return 0;
}

/* y[o - base] = x[row] for each wanted row (window row out_from.. of its window), o its output row */
__global__ static void gpt_gather_kernel(float *y, const float *x, const gpu_gpt_win *w, const int32_t *rowwin,
                                         size_t total, int d, int base)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const size_t row = i / d, c = i % d;
    const gpu_gpt_win v = w[rowwin[row]];
    const int j = (int)(row - (size_t)v.row0);
    if (j < v.out_from) return;
    const size_t o = (size_t)(v.out_row + (j - v.out_from) - base);
    y[o * d + c] = x[i];
}

int gpu_gpt_gather(gpu_model *g, float *y, const float *x, const gpu_gpt_win *w, int R, const int32_t *rowwin, int base,
                   char *err)
{
    const int d = g->m->d_model;
    const size_t total = (size_t)R * d;
    if (total == 0) return 0;
    gpt_gather_kernel<<<(unsigned)((total + 255) / 256), 256, 0, g->stream>>>(y, x, w, rowwin, total, d, base);
    LAUNCH_TRY(err, "gpt_gather");
    return 0;
}
