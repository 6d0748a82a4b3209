/*
 * fam_rel.cu - Transformer-XL's relative attention on the device, for the
 * families whose blocks are attention, feed-forward or skip: PAR
 * (core/par.c), kimiyoung's word-level Transformer-XL (core/txl.c, its
 * layers as attention and feed-forward blocks) and seed 004's TensorFlow PAR
 * (core/par_tf.c, model_t.tf_attn). The attention (rel_attn.cu,
 * rel_tile.cu) reads rings of mem_len rows a block. What it derives at
 * load: each attention block's r_net(sinusoid(t)) rows for every distance a
 * query of the plan can see (core's table, then the rest computed here as
 * core computes them on the fly, distances past clamp_len embedded as it).
 *
 * par-tf: core's table R holds the seed's rows by position p = 0..T-1
 * (T = max_position), and key j of query qi (klen keys) reads row
 * klen-1-(qi-j). The device keeps R reversed, row t = R[T-1-t], so that
 * the kernels read it by distance d = qi - j as PAR's, from row
 * roff + d with roff = T - klen (a stream's own: klen = its mlen + M);
 * PAR's roff is 0. A step with mem_len + M > T is refused, as core does.
 */
#include "gpu_internal.cuh"

extern "C" {
#include "forward.h"   /* par_sinusoid */
}

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t rel_arena_extra(const model_t *m)
{
    (void)m;
    return 0;
}

/* Rows of a block's rk table: core's, or every distance of the plan
 * (par-tf: the seed's max_position rows, never more). */
static int rk_rows(const gpu_model *g, const layer_t *y)
{
    if (g->m->tf_attn) return y->rk_len;
    const int want = g->m->mem_len + g->max_block;
    return y->rk_len > want ? y->rk_len : want;
}

/* The sinusoids of distances FROM.. (N rows of D_model) on the device, in
 * *DPOS (the caller frees). */
static int sinusoids(const model_t *m, int from, int n, float **dpos, char *err)
{
    const int Dm = m->d_model;
    float *pos = (float *)malloc((size_t)n * Dm * sizeof *pos);
    if (!pos || cudaMalloc(dpos, (size_t)n * Dm * sizeof **dpos) != cudaSuccess) {
        free(pos);
        return err_set(err, "out of memory for the position table");
    }
    for (int t = 0; t < n; t++) {
        const int dist = from + t;
        par_sinusoid(pos + (size_t)t * Dm, Dm, m->clamp_len > 0 && dist > m->clamp_len ? m->clamp_len : dist);
    }
    cudaError_t e = cudaMemcpy(*dpos, pos, (size_t)n * Dm * sizeof *pos, cudaMemcpyHostToDevice);
    free(pos);
    return e == cudaSuccess ? 0 : err_set(err, "cudaMemcpy (positions)");
}

/* An attention block's pointers and its rk table at *AT (advanced). */
static int upload_attn(gpu_model *g, gpu_layer *d, const layer_t *y, float **at, float **dpos, int l, char *err)
{
    const model_t *m = g->m;
    const int Dm = m->d_model, A = m->n_head * m->d_head;
    d->wqkv = gpu_on_device(g, y->qkv, (size_t)3 * A * Dm);
    d->wo = gpu_on_device(g, y->onet, (size_t)Dm * A);
    d->ln1_w = gpu_on_device(g, y->ln1_w, Dm);
    d->ln1_b = gpu_on_device(g, y->ln1_b, Dm);
    const float *rnet = gpu_on_device(g, y->rnet, (size_t)A * Dm);
    d->rwb = gpu_on_device(g, y->r_w_bias, A);
    d->rrb = gpu_on_device(g, y->r_r_bias, A);
    d->qkv_b = gpu_on_device(g, y->qkv_b, (size_t)3 * A);   /* par-tf's biases (NULL elsewhere) */
    d->wo_b = gpu_on_device(g, y->wo_b, Dm);
    if (!d->wqkv || !d->wo || !d->ln1_w || !d->ln1_b || !rnet || !d->rwb || !d->rrb || (y->qkv_b && !d->qkv_b) ||
        (y->wo_b && !d->wo_b))
        return err_set(err, "%s: block %d: a weight lies outside the arena", m->path, l);
    const int rows = rk_rows(g, y), extra = rows - y->rk_len;
    if (m->tf_attn) {   /* the seed's rows by position, reversed: rows by distance from roff (above) */
        float *rev = (float *)malloc((size_t)rows * A * sizeof *rev);
        if (!rev) return err_set(err, "out of memory for the position table");
        for (int t = 0; t < rows; t++)
            memcpy(rev + (size_t)t * A, y->rk + (size_t)(rows - 1 - t) * A, (size_t)A * sizeof *rev);
        cudaError_t e = cudaMemcpy(*at, rev, (size_t)rows * A * sizeof *rev, cudaMemcpyHostToDevice);
        free(rev);
        if (e != cudaSuccess) return err_set(err, "cudaMemcpy (rk table)");
    } else
        CU_TRY(cudaMemcpy(*at, y->rk, (size_t)y->rk_len * A * sizeof(float), cudaMemcpyHostToDevice), err,
               "cudaMemcpy (rk table)");
    /* every block's table is as long as core's (rk_len is the model's): one set of sinusoids serves all */
    if (extra > 0 && !*dpos && sinusoids(m, y->rk_len, extra, dpos, err)) return -1;
    if (extra > 0 && gpu_linear(g, *at + (size_t)y->rk_len * A, *dpos, rnet, extra, Dm, A, err)) return -1;
    d->rk = *at;
    d->rk_rows = rows;
    *at += (size_t)rows * A;
    return 0;
}

static int rel_upload(gpu_model *g, char *err)
{
    const model_t *m = g->m;
    const int A = m->n_head * m->d_head, nl = m->n_layers;
    size_t nd = 0;
    for (int l = 0; l < nl; l++)
        if (m->layers[l].kind == BLK_ATTN) nd += (size_t)rk_rows(g, &m->layers[l]) * A;
    g->derived_floats = nd;
    CU_TRY(cudaMalloc(&g->derived, (nd ? nd : 1) * sizeof(float)), err, "cudaMalloc (derived tables)");
    float *at = g->derived, *dpos = NULL;
    int rc = 0;
    for (int l = 0; l < nl && rc == 0; l++) {
        const layer_t *y = &m->layers[l];
        if (y->kind == BLK_ATTN) rc = upload_attn(g, &g->L[l], y, &at, &dpos, l, err);
        else if (y->kind == BLK_FFN && gpu_bind_ffn(g, &g->L[l], y))
            rc = err_set(err, "%s: block %d: a weight lies outside the arena", m->path, l);
    }
    if (rc == 0 && cudaStreamSynchronize(g->stream) != cudaSuccess) rc = err_set(err, "building the rk tables failed");
    cudaFree(dpos);
    g->max_window = m->mem_len + g->max_block;
    return rc;
}

/* GPU_BF16: the partial states of attn_mma.cu's split windows (its
 * attention on tensor cores), as adaptive-span's tiles keep them */
static int rel_alloc_step(gpu_model *g, char *err)
{
    if (g->prec != GPU_BF16) return 0;
    g->tpart_floats = gpu_aspan_tile_part_floats(g);
    if (g->tpart_floats)
        CU_TRY(cudaMalloc(&g->tpart, g->tpart_floats * sizeof(float)), err,
               "out of device memory for the tiled attention's partial states");
    g->step_bytes += g->tpart_floats * sizeof(float);
    return 0;
}

static int rel_sublayers(const model_t *m, int l)
{
    const blk_kind k = m->layers[l].kind;
    return k == BLK_ATTN ? GPU_SUB_ATTN : k == BLK_FFN ? GPU_SUB_FFN : 0;
}

static int rel_attend(gpu_model *g, int l, int B, int M, char *err)
{
    const model_t *m = g->m;
    if (m->tf_attn && m->mem_len + M > g->L[l].rk_rows)   /* the seed's table ends there (core/par.c) */
        return err_set(err, "a block of %d tokens after %d rows of memory is over the model's max_position %d", M,
                       m->mem_len, m->max_position);
    g->ring_fused = 0;
    if (gpu_rel_attn(g, l, B, M, err)) return -1;
    gpu_mark(g, OP_ATTN);
    if (!g->ring_fused && gpu_par_ring_write(g, l, B, M, err)) return -1;
    gpu_mark(g, OP_RING);
    return 0;
}

/* h = emb[x] * sqrt(D) (an adaptive input scales itself: adaptive.cu) */
static float rel_embed_scale(const model_t *m) { return (float)sqrt((double)m->d_model); }

const gpu_family gpu_family_rel = {
    rel_arena_extra, rel_upload, gpu_rel_attn_smem, rel_alloc_step, rel_sublayers, rel_attend, rel_embed_scale, NULL,
};
