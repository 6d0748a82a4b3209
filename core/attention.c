/*
 * attention.c - the attention weights of a text, recorded from the CPU
 * forward (attention.h): a recorder in the forward's workspace collects, per
 * (layer, head, query), the heaviest top_k keys of the row (a bounded heap:
 * one comparison a key once it is full) or, for one layer and head, the
 * whole row; attention_run feeds the text as a stream is read.
 */
#include "attention.h"
#include "err.h"
#include "forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct attn_rec {
    attn_result *res;
    const int *slot;      /* model layer -> its index among the layers recorded, -1: not recorded */
    int n_layers;
    int head;             /* the one head recorded, or -1: all */
    int n_heads;          /* heads recorded a layer */
    int bad;              /* a weight that is not finite */
};

/* Key (pa, wa) comes before key (pb, wb) in a top-k list: heavier, or as
 * heavy and nearer the query. */
static int before(float wa, int64_t pa, float wb, int64_t pb) { return wa > wb || (wa == wb && pa > pb); }

/* The heap of a top-k row keeps its last key (the one every other comes before) at the root. */
static void sift_down(int64_t *pos, float *w, int n, int i)
{
    for (;;) {
        int c = 2 * i + 1, last = i;
        if (c < n && before(w[last], pos[last], w[c], pos[c])) last = c;
        if (c + 1 < n && before(w[last], pos[last], w[c + 1], pos[c + 1])) last = c + 1;
        if (last == i) return;
        int64_t tp = pos[i];
        float tw = w[i];
        pos[i] = pos[last], w[i] = w[last];
        pos[last] = tp, w[last] = tw;
        i = last;
    }
}

static void heap_add(attn_row *row, int k, int64_t p, float a)
{
    if (row->n < k) {   /* room: sift up */
        int i = row->n++;
        while (i > 0) {
            int up = (i - 1) / 2;
            if (!before(row->w[up], row->pos[up], a, p)) break;
            row->pos[i] = row->pos[up], row->w[i] = row->w[up];
            i = up;
        }
        row->pos[i] = p, row->w[i] = a;
    } else if (before(a, p, row->w[0], row->pos[0])) {   /* it beats the last kept */
        row->pos[0] = p, row->w[0] = a;
        sift_down(row->pos, row->w, k, 0);
    }
}

/* Heap order -> the list's order (heapsort: the last to the end, repeatedly). */
static void heap_sort(attn_row *row)
{
    for (int n = row->n; n > 1; n--) {
        int64_t tp = row->pos[0];
        float tw = row->w[0];
        row->pos[0] = row->pos[n - 1], row->w[0] = row->w[n - 1];
        row->pos[n - 1] = tp, row->w[n - 1] = tw;
        sift_down(row->pos, row->w, n - 1, 0);
    }
}

void attn_record(attn_rec *r, int b, int layer, int head, int64_t query, int64_t first, const float *w, int n,
                 const float *pw, int np, float scale)
{
    attn_result *res = r->res;
    if (b != 0 || layer < 0 || layer >= r->n_layers || r->slot[layer] < 0 || (r->head >= 0 && head != r->head) ||
        query < 0 || query >= res->n_tokens)
        return;
    attn_row *row = &res->rows[((size_t)r->slot[layer] * r->n_heads + (r->head >= 0 ? 0 : head)) * res->n_tokens + query];
    double sum = 0, before_start = 0, pers = 0;
    int j = 0;
    for (; j < n && first + j < 0; j++) before_start += w[j] * scale;
    row->n = 0;
    for (; j < n; j++) {
        const float a = w[j] * scale;
        sum += a;
        if (!isfinite(a)) r->bad = 1;
        if (!res->full) heap_add(row, res->top_k, first + j, a);
        else if (row->n <= query) {   /* positions 0..query: room for all */
            row->pos[row->n] = first + j;
            row->w[row->n++] = a;
        }
    }
    for (int k = 0; k < np; k++) {
        const float a = pw[k] * scale;
        pers += a;
        if (row->pw && k < res->n_pers) row->pw[k] = a;
    }
    if (!isfinite(before_start) || !isfinite(pers)) r->bad = 1;
    row->before_start = before_start;
    row->persistent = pers;
    row->sum = sum + before_start + pers;
}

/* ------------------------------------------------------------ the run */

int attention_check(const model_t *m, const attn_opts *o, char *err)
{
    if (o->layer < -1 || o->layer >= m->n_layers)
        return err_set(err, "layer %d is not a layer of the model: it has %d (0..%d)", o->layer, m->n_layers,
                       m->n_layers - 1);
    if (o->layer >= 0 && m->layers[o->layer].kind != BLK_ATTN) {
        char list[256] = "";
        size_t at = 0;
        for (int l = 0; l < m->n_layers && at + 16 < sizeof list; l++)
            if (m->layers[l].kind == BLK_ATTN) at += (size_t)snprintf(list + at, sizeof list - at, "%s%d", at ? ", " : "", l);
        return err_set(err, "layer %d is not attention (its block is %s): the attention layers are %s", o->layer,
                       blk_kind_name(m->layers[o->layer].kind), *list ? list : "none");
    }
    if (o->head < -1 || o->head >= m->n_head)
        return err_set(err, "head %d is not a head of the model: it has %d a layer (0..%d)", o->head, m->n_head,
                       m->n_head - 1);
    if (o->top_k < 1 || o->top_k > ATTN_MAX_TOP_K)
        return err_set(err, "top_k must be in [1, %d]", ATTN_MAX_TOP_K);
    return 0;
}

int attention_layers(const model_t *m, const attn_opts *o)
{
    if (o->layer >= 0) return 1;
    int n = 0;
    for (int l = 0; l < m->n_layers; l++) n += m->layers[l].kind == BLK_ATTN;
    return n;
}

size_t attention_weights_max(const model_t *m, int n, const attn_opts *o)
{
    const size_t N = n > 0 ? (size_t)n : 0;
    if (o->layer >= 0 && o->head >= 0) return N * (N + 1) / 2 + N * (size_t)m->pers;
    const size_t rows = (size_t)attention_layers(m, o) * (size_t)(o->head >= 0 ? 1 : m->n_head) * N;
    return rows * (N < (size_t)o->top_k ? N : (size_t)o->top_k);
}

void attention_free(attn_result *r)
{
    if (!r) return;
    free(r->rows);
    free(r->pos_pool);
    free(r->w_pool);
    free(r->pw_pool);
    memset(r, 0, sizeof *r);
}

/* The rows of OUT, laid out for O: by layer, head, query; keys into the pools. */
static int rows_alloc(const model_t *m, int n, const attn_opts *o, const int *slot, attn_result *out)
{
    const int nh = o->head >= 0 ? 1 : m->n_head, full = o->layer >= 0 && o->head >= 0;
    out->n_tokens = n;
    out->full = full;
    out->top_k = o->top_k;
    out->n_pers = full ? m->pers : 0;
    out->n_rows = attention_layers(m, o) * nh * n;
    const size_t keys = full ? (size_t)n * (n + 1) / 2 : (size_t)out->n_rows * o->top_k;
    out->rows = calloc((size_t)out->n_rows ? (size_t)out->n_rows : 1, sizeof *out->rows);
    out->pos_pool = malloc((keys ? keys : 1) * sizeof *out->pos_pool);
    out->w_pool = malloc((keys ? keys : 1) * sizeof *out->w_pool);
    out->pw_pool = out->n_pers ? calloc((size_t)n * out->n_pers, sizeof *out->pw_pool) : NULL;
    if (!out->rows || !out->pos_pool || !out->w_pool || (out->n_pers && !out->pw_pool)) return -1;
    size_t at = 0;
    attn_row *row = out->rows;
    for (int l = 0; l < m->n_layers; l++) {
        if (slot[l] < 0) continue;
        for (int h = 0; h < m->n_head; h++) {
            if (o->head >= 0 && h != o->head) continue;
            for (int t = 0; t < n; t++, row++) {
                row->layer = l, row->head = h, row->query = t;
                row->pos = out->pos_pool + at;
                row->w = out->w_pool + at;
                row->pw = out->n_pers ? out->pw_pool + (size_t)t * out->n_pers : NULL;
                at += full ? (size_t)t + 1 : (size_t)o->top_k;
            }
        }
    }
    return 0;
}

int attention_run(const model_t *m, const int32_t *toks, int n, const attn_opts *o, int (*stop)(void *ctx), void *ctx,
                  attn_result *out, char *err)
{
    memset(out, 0, sizeof *out);
    if (attention_check(m, o, err)) return -1;
    if (n <= 0) return err_set(err, "no tokens");
    int *slot = malloc((size_t)m->n_layers * sizeof *slot);
    if (!slot) return err_set(err, "out of memory");
    for (int l = 0, k = 0; l < m->n_layers; l++)
        slot[l] = m->layers[l].kind == BLK_ATTN && (o->layer < 0 || o->layer == l) ? k++ : -1;
    if (rows_alloc(m, n, o, slot, out)) {
        free(slot);
        attention_free(out);
        return err_set(err, "out of memory for the attention of %d tokens", n);
    }
    attn_rec rec = {out, slot, m->n_layers, o->head, o->head >= 0 ? 1 : m->n_head, 0};
    /* The host's view of the model: its weights stay on the host whatever
     * device serves it; without the backend, the memory stays on the host
     * too (mem_new) and model_forward runs the family's CPU forward. */
    model_t host = *m;
    host.backend = NULL;
    mem_t *s = mem_new(&host);
    fwd_ws *ws = ws_new();
    int rc = 0;
    if (!s || !ws) rc = err_set(err, "out of memory");
    if (ws) ws->rec = &rec;
    /* blocks of a stream's length: a Transformer-XL segment's context depends on where it starts.
     * The tokens are their own targets: any valid id does, and an adaptive softmax then computes a
     * cluster a row, not the whole vocabulary (the logprobs are not wanted). */
    for (int i = 0, M; rc == 0 && i < n; i += M) {
        M = n - i < mem_block(s) ? n - i : mem_block(s);
        if (stop && stop(ctx)) rc = err_set(err, "stopped");
        else rc = model_forward_targets(&host, &s, 1, toks + i, M, toks + i, NULL, ws, err);
    }
    if (rc == 0 && rec.bad) rc = err_set(err, "an attention weight is not finite: the model's arithmetic overflows");
    for (int i = 0; rc == 0 && !out->full && i < out->n_rows; i++) heap_sort(&out->rows[i]);
    mem_free(s);
    ws_free(ws);
    free(slot);
    if (rc) attention_free(out);
    return rc;
}
