/*
 * attention.h - what a model attends to: the weights each head gives the
 * positions a query saw, recorded from the CPU forward itself (not a second
 * implementation of the attention), for POST /v1/attention.
 *
 * Recording: a forward's workspace (fwd_ws.rec, forward.h) may carry a
 * recorder, NULL normally (then the forward pays one branch per query row).
 * Each family's attention loop hands it, once per (layer, head, query), the
 * FINAL weights it multiplies the values by: after the softmax, the span
 * mask and the renormalisation (attn_record). Keys are contiguous
 * positions, so a row is a pointer, a count and the position of its first
 * key; nothing is copied for the recorder.
 *
 * What a row's keys are, by family:
 *   adaptive-span  the positions t-reach .. t-1 (never the query itself);
 *                  positions < 0 are the reference's zero memory before the
 *                  stream's start, reported as one mass (before_start); with
 *                  persistent memory also the N persistent vectors' weights.
 *                  Keys past a head's reach have weight 0 (the mask) and are
 *                  not listed.
 *   Transformer-XL / PAR
 *                  the memory rows and the segment up to the query itself.
 *   GPT            the rows of the window ending at the query (a stream:
 *                  the window the next token is predicted from).
 * A row's sum is what the reference's renormalisation leaves: 1 for a plain
 * softmax, sum(a m) / (sum(a m) + 1e-8) under a span mask.
 */
#ifndef SPANSERVE_ATTENTION_H
#define SPANSERVE_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* ------------------------------------------------------------ recording (the forwards' side) */

typedef struct attn_rec attn_rec;

/* One query row of stream B: head HEAD of layer LAYER, the query at absolute
 * position QUERY; the key at position FIRST + j (j < N) has weight
 * W[j] * SCALE, persistent vector j (j < NP) weight PW[j] * SCALE (the
 * products the forward itself forms, in float). */
void attn_record(attn_rec *r, int b, int layer, int head, int64_t query, int64_t first, const float *w, int n,
                 const float *pw, int np, float scale);

/* ------------------------------------------------------------ attention_run (the server's side) */

/* Keys listed per row at most in top-k mode. */
#define ATTN_MAX_TOP_K 64

typedef struct {
    int layer;   /* -1: every attention layer */
    int head;    /* -1: every head */
    int top_k;   /* 1..ATTN_MAX_TOP_K: the heaviest keys of a row; full rows when layer and head are both given */
} attn_opts;

/* One (layer, head, query) row. */
typedef struct {
    int layer, head;
    int64_t query;
    double sum;            /* every weight of the row: keys, before_start, persistent */
    double before_start;   /* keys at positions < 0 (adaptive-span's zero memory) */
    double persistent;     /* the persistent vectors together (0 without) */
    int n;                 /* keys listed: by weight (top-k) or by position (full rows) */
    int64_t *pos;
    float *w;
    float *pw;             /* full rows with persistent memory: each vector's weight (NULL otherwise) */
} attn_row;

typedef struct {
    int n_tokens;
    int full;              /* rows are full (layer and head given), else top_k of each */
    int top_k;
    int n_pers;            /* persistent vectors a head (0: none) */
    int n_rows;            /* by layer, then head, then query */
    attn_row *rows;
    /* storage of the rows' keys */
    int64_t *pos_pool;
    float *w_pool, *pw_pool;
} attn_result;

/* Whether O suits M: layer and head in range, the layer an attention block,
 * top_k in 1..ATTN_MAX_TOP_K. 0, or -1 with ERR. */
int attention_check(const model_t *m, const attn_opts *o, char *err);
/* The attention layers O selects of M, and the weights a text of N tokens
 * lists at most (for the caller's bound on an answer's size). */
int attention_layers(const model_t *m, const attn_opts *o);
size_t attention_weights_max(const model_t *m, int n, const attn_opts *o);

/* Feeds TOKS[0..n) to M as one stream from its start (the first token
 * included: each position's row is its own query), in blocks of the
 * model's block length as a stream is read, through the CPU forward
 * whatever device M is served on, and fills OUT. STOP, if not NULL, is asked
 * before each block; non-zero stops with ERR "stopped". 0, or -1 with ERR
 * (out of memory, a weight that is not finite). */
int attention_run(const model_t *m, const int32_t *toks, int n, const attn_opts *o, int (*stop)(void *ctx), void *ctx,
                  attn_result *out, char *err);
void attention_free(attn_result *r);

#endif
