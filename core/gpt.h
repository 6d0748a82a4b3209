/*
 * gpt.h - the windows a GPT-style model computes for a forward (core/gpt.c
 * on the CPU, kernels/fam_gpt.cu on a GPU: both run the same plan).
 *
 * A window model has no memory between windows: what it predicts after a
 * token is a function of the window of tokens that ends there. A forward of
 * B streams x M tokens is cut into windows (gpt_plan):
 *
 *   fed in windows (mem_windows, scoring): one window a stream, the KEEP
 *     tokens held before the M new ones and the M new ones, fed whole; the
 *     outputs of the new rows.
 *   a stream (generation's semantics, the seeds' `generate`): each token is
 *     predicted from the window of the last `window` tokens ending at it, at
 *     the window's last position. Where the model's keys and values do not
 *     depend on the window's length (cache_kv: no span mask measured from the
 *     window's end) and the window still starts at position 0, the new tokens
 *     extend one window whose earlier rows' keys and values the memory holds
 *     (the cache); every other token is a window of its own, recomputed.
 *
 * A window's rows are its positions 0..T-1 (T = cached + n); rows 0..cached-1
 * come from the memory's cache, rows cached..T-1 are computed; the computed
 * rows from `out_from` on give the batch's output rows out_row, out_row+1, ...
 */
#ifndef SPANSERVE_GPT_H
#define SPANSERVE_GPT_H

#include <stdint.h>

#include "model.h"

typedef struct {
    int b;              /* the stream */
    int64_t start;      /* absolute position of the window's row 0 */
    int cached;         /* rows whose keys and values the memory holds */
    int n;              /* rows computed */
    int out_from;       /* the first computed row whose output is wanted */
    int out_row;        /* its row in the batch's B x M outputs */
    int write_kv;       /* the computed rows' keys and values go into the memory's cache */
} gpt_win;

/* What the plan needs of a stream, as before the forward (mem_t's, or a
 * device memory's): its position, its mode (mem_windows) and its ring of
 * the last `window` tokens. */
typedef struct {
    int64_t pos;
    int keep;
    const int32_t *toks;
} gpt_stream;

/* The windows of a forward of B streams x M tokens into W (room for
 * gpt_plan_max(B, M)); returns their number. */
int gpt_plan(const model_t *m, const gpt_stream *st, int B, int M, gpt_win *w);
static inline int gpt_plan_max(int B, int M) { return B * M; }
/* The token at row R of window W: the stream's ring before the forward's
 * tokens, TOKENS (B x M) after. */
int32_t gpt_token(const model_t *m, const gpt_stream *st, const int32_t *tokens, int M, const gpt_win *w, int r);
/* The streams' rings after feeding them TOKENS (B x M): what model_forward
 * does to a memory's (core/forward.c). */
void gpt_ring_push(int C, int32_t *toks, int64_t pos, const int32_t *tokens, int M);

/* Stream b's cache: layer L's keys (then values) of window rows, `window`
 * rows of n_head * head_size floats each. */
static inline float *gpt_cache_k(const mem_t *s, int l) { return s->buf + s->off[l]; }
static inline size_t gpt_cache_v_off(const model_t *m) { return (size_t)m->window * m->n_head * m->d_head; }

/* gpt-adaptive-span's mask of a head for a key D positions before the
 * window's last row (D = 0..window-1): mask[h][D] (layer_t.mask); NULL
 * without spans. */

#endif
