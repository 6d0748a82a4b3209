/*
 * fam_aspan.cu - the adaptive-span family on the device (core/aspan.c):
 * every layer is attention, then feed-forward. The attention is limited to
 * each head's learned span (aspan_attn.cu, aspan_tile.cu, aspan_decode.cu),
 * over rings that keep each head's own key rows. What it derives at load:
 * the query, key and value projections packed into one 3H x H matrix (one
 * GEMM a layer), and each head's soft mask m(d), d = 1..reach, with the key
 * rows and reach of every head.
 */
#include "gpu_internal.cuh"

#include <stdlib.h>

/* core keeps the mask templates in the arena past the parameters */
static size_t aspan_arena_extra(const model_t *m) { return (size_t)m->n_layers * m->span; }

/* Uploads per head: key rows, reach and where its mask lies in `derived`. */
static int upload_spans(gpu_model *g, const int64_t *moff, char *err)
{
    const model_t *m = g->m;
    const size_t n = (size_t)m->n_layers * m->n_head;
    const int K = m->n_head;
    int *kr = (int *)malloc(n * sizeof *kr), *re = (int *)malloc(n * sizeof *re);
    int rc = kr && re ? 0 : err_set(err, "out of memory");
    for (int l = 0; rc == 0 && l < m->n_layers; l++)
        for (int h = 0; h < K; h++) {
            kr[l * K + h] = m->layers[l].krows[h];
            re[l * K + h] = m->layers[l].reach[h];
            if (kr[l * K + h] > g->max_window) g->max_window = kr[l * K + h];
        }
    if (rc == 0 && (cudaMalloc(&g->krows, n * sizeof(int)) != cudaSuccess ||
                    cudaMalloc(&g->reach, n * sizeof(int)) != cudaSuccess ||
                    cudaMalloc(&g->mask_off, n * sizeof(int64_t)) != cudaSuccess ||
                    cudaMemcpy(g->krows, kr, n * sizeof(int), cudaMemcpyHostToDevice) != cudaSuccess ||
                    cudaMemcpy(g->reach, re, n * sizeof(int), cudaMemcpyHostToDevice) != cudaSuccess ||
                    cudaMemcpy(g->mask_off, moff, n * sizeof(int64_t), cudaMemcpyHostToDevice) != cudaSuccess))
        rc = err_set(err, "uploading the span tables failed");
    free(kr);
    free(re);
    return rc;
}

static int aspan_upload(gpu_model *g, char *err)
{
    const model_t *m = g->m;
    const int Dm = m->d_model, K = m->n_head, nl = m->n_layers;
    const size_t HH = (size_t)Dm * Dm;
    g->key_pe = gpu_on_device(g, m->key_pe, (size_t)m->d_head * m->span);
    if (!g->key_pe) return err_set(err, "%s: key_pe lies outside the model's arena", m->path);
    size_t nd = 0;
    for (int l = 0; l < nl; l++) {
        nd += 3 * HH + (size_t)2 * K * m->pers * m->d_head;   /* (persistent memory: key' and val') */
        for (int h = 0; h < K; h++) nd += (size_t)m->layers[l].reach[h];
    }
    g->derived_floats = nd;
    CU_TRY(cudaMalloc(&g->derived, (nd ? nd : 1) * sizeof(float)), err, "cudaMalloc (derived tables)");
    int64_t *moff = (int64_t *)calloc((size_t)nl * K, sizeof *moff);
    if (!moff) return err_set(err, "out of memory");
    float *at = g->derived;
    int rc = 0;
    for (int l = 0; l < nl && rc == 0; l++) {
        const layer_t *y = &m->layers[l];
        gpu_layer *d = &g->L[l];
        const float *w[3] = {y->wq, y->wk, y->wv};
        for (int k = 0; k < 3 && rc == 0; k++)
            if (cudaMemcpy(at + k * HH, w[k], HH * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
                rc = err_set(err, "cudaMemcpy (projections)");
        d->wqkv = at;
        at += 3 * HH;
        for (int h = 0; h < K && rc == 0; h++) {
            moff[l * K + h] = at - g->derived;
            if (y->reach[h] &&
                cudaMemcpy(at, y->mask[h], (size_t)y->reach[h] * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
                rc = err_set(err, "cudaMemcpy (masks)");
            at += y->reach[h];
        }
        if (m->pers) {
            const size_t np = (size_t)K * m->pers * m->d_head;
            if (cudaMemcpy(at, y->pkey_s, np * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess ||
                cudaMemcpy(at + np, y->pval_s, np * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
                rc = err_set(err, "cudaMemcpy (persistent memory)");
            d->pk = at;
            d->pv = at + np;
            at += 2 * np;
        }
        d->wo = gpu_on_device(g, y->wo, HH);
        d->ln1_w = gpu_on_device(g, y->ln1_w, Dm);
        d->ln1_b = gpu_on_device(g, y->ln1_b, Dm);
        if (rc == 0 && (!d->wo || !d->ln1_w || !d->ln1_b || (!m->pers && gpu_bind_ffn(g, d, y))))
            rc = err_set(err, "%s: layer %d: a weight lies outside the arena", m->path, l);
    }
    if (rc == 0) rc = upload_spans(g, moff, err);
    free(moff);
    return rc;
}

/* The decode splits' partial sums and the tiled attention's partial states.
 * Nothing of this family's step is planned by the block's length: the
 * shared buffers are rows (max_batch x max_block), the attention's windows
 * are each head's key rows (g->max_window), the partial states are bounded
 * by rows x splits and checked per step; so a step may feed one stream a
 * block as long as all the rows (a text scored in long blocks,
 * core's model_score_block). */
static int aspan_alloc_step(gpu_model *g, char *err)
{
    const model_t *m = g->m;
    g->max_m = g->max_batch * g->max_block;
    g->part_recs = gpu_aspan_part_recs(g);
    CU_TRY(cudaMalloc(&g->part, g->part_recs * (m->d_head + 4) * sizeof(float)), err,
           "out of device memory for the attention's partial sums");
    g->step_bytes += g->part_recs * (m->d_head + 4) * sizeof(float);
    g->tpart_floats = gpu_aspan_tile_part_floats(g);
    if (g->tpart_floats)
        CU_TRY(cudaMalloc(&g->tpart, g->tpart_floats * sizeof(float)), err,
               "out of device memory for the tiled attention's partial states");
    g->step_bytes += g->tpart_floats * sizeof(float);
    return 0;
}

/* attention, then feed-forward; all-attention layers (persistent memory) have none */
static int aspan_sublayers(const model_t *m, int l)
{
    (void)l;
    return m->pers ? GPU_SUB_ATTN : GPU_SUB_ATTN | GPU_SUB_FFN;
}

/* A one-token step's rings are written by the attention itself
 * (aspan_decode.cu); otherwise by a launch of their own, so that no write
 * races a read of the same layer. */
static int aspan_attend(gpu_model *g, int l, int B, int M, char *err)
{
    int ring_done = 0;
    if (g->m->pers ? gpu_aspan_pers_attn(g, l, B, M, err) : gpu_aspan_attn(g, l, B, M, &ring_done, err)) return -1;
    gpu_mark(g, OP_ATTN);
    if (ring_done) return 0;
    if (gpu_aspan_ring_write(g, l, B, M, err)) return -1;
    gpu_mark(g, OP_RING);
    return 0;
}

static float aspan_embed_scale(const model_t *m)
{
    (void)m;
    return 1.0f;
}

/* the widest kernel's: with persistent memory, aspan_pers.cu's too */
static size_t aspan_smem(const gpu_model *g)
{
    const size_t a = gpu_aspan_attn_smem(g), p = g->m->pers ? gpu_aspan_pers_smem(g) : 0;
    return a > p ? a : p;
}

const gpu_family gpu_family_aspan = {
    aspan_arena_extra, aspan_upload, aspan_smem, aspan_alloc_step, aspan_sublayers, aspan_attend,
    aspan_embed_scale, NULL,
};
