/*
 * forward.c - the CPU forward's entry point and its workspace.
 */
#include "forward.h"
#include "err.h"
#include "family.h"
#include "gpt.h"

#include <stdlib.h>
#include <string.h>

fwd_ws *ws_new(void) { return calloc(1, sizeof(fwd_ws)); }

void ws_free(fwd_ws *w)
{
    if (!w) return;
    for (int i = 0; i < WS_N; i++) free(w->buf[i]);
    free(w);
}

float *ws_get(fwd_ws *w, int i, size_t n)
{
    if (n > w->cap[i]) {
        size_t cap = n + n / 4 + 64;
        float *p = realloc(w->buf[i], cap * sizeof *p);
        if (!p) return NULL;
        w->buf[i] = p;
        w->cap[i] = cap;
    }
    return w->buf[i];
}

int model_forward(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, float *logprobs,
                  fwd_ws *ws, char *err)
{
    return model_forward_targets(m, mems, B, tokens, M, NULL, logprobs, ws, err);
}

/* What every forward checks before it runs: the streams' memories, their
 * positions, the tokens and the targets. */
static int forward_check(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                         char *err)
{
    if (B <= 0 || M <= 0) return err_set(err, "empty batch (%d streams x %d tokens)", B, M);
    for (int b = 0; b < B; b++)
        if (!mems[b] || mems[b]->m != m) return err_set(err, "stream %d's memory belongs to another model", b);
        else if (mems[b]->pos > MEM_MAX_POS - M)
            return err_set(err, "stream %d is at position %lld: a stream holds at most %lld positions", b,
                           (long long)mems[b]->pos, (long long)MEM_MAX_POS);
        else if (m->window && mems[b]->keep >= 0) {   /* fed in windows: one window a forward */
            const int64_t held = mems[b]->pos < mems[b]->keep ? mems[b]->pos : mems[b]->keep;
            if (held + M > m->window)
                return err_set(err, "stream %d: a window of %lld tokens held and %d new is over the model's %d", b,
                               (long long)held, M, m->window);
        }
    for (long i = 0; i < (long)B * M; i++)
        if (tokens[i] < 0 || tokens[i] >= m->V)
            return err_set(err, "token id %d at %ld is outside the vocabulary [0, %d)", tokens[i], i, m->V);
    for (int b = 0; targets && b < B; b++)
        for (int i = 0; targets[(long)b * M] >= 0 && i < M; i++)
            if (targets[(long)b * M + i] < 0 || targets[(long)b * M + i] >= m->V)
                return err_set(err, "target id %d of stream %d is outside the vocabulary [0, %d)",
                               targets[(long)b * M + i], b, m->V);
    return 0;
}

/* The streams consumed their M tokens: positions, and a window model's rings of tokens. */
static void advance(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M)
{
    const int C = m->window;
    for (int b = 0; b < B; b++) {
        mem_t *s = mems[b];
        if (C) gpt_ring_push(C, s->toks, s->pos, tokens + (size_t)b * M, M);
        s->pos += M;
    }
}

int model_forward_targets(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M,
                          const int32_t *targets, float *logprobs, fwd_ws *ws, char *err)
{
    if (forward_check(m, mems, B, tokens, M, targets, err)) return -1;
    int rc;
    if (m->backend) rc = m->backend->forward(m->backend->ctx, mems, B, tokens, M, targets, logprobs, err);
    else rc = m->family->forward(m, mems, B, tokens, M, targets, logprobs, ws, err);
    if (rc == 0) advance(m, mems, B, tokens, M);
    return rc;
}

int model_forward_pick(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                       float *tlp, int n, const pick_req *q, pick_out *o, fwd_ws *ws, char *err)
{
    return model_forward_pick_while(m, mems, B, tokens, M, targets, tlp, n, q, o, NULL, NULL, ws, err);
}

int model_forward_pick_while(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M,
                             const int32_t *targets, float *tlp, int n, const pick_req *q, pick_out *o,
                             fwd_meanwhile mw, void *mw_ctx, fwd_ws *ws, char *err)
{
    if (targets && !tlp) return err_set(err, "targets but nowhere for their logprobs");
    if (n < 0 || (n && (!q || !o))) return err_set(err, "no picks");
    for (int i = 0; i < n; i++)
        if (q[i].row < 0 || (long)q[i].row >= (long)B * M || q[i].top_n < 0 || q[i].top_n > PICK_MAX_TOP ||
            (q[i].sample && sample_draws(&q[i].sp) && !(q[i].u >= 0 && q[i].u < 1)))
            return err_set(err, "pick %d: row %d of %d, %d top tokens (at most %d) or a draw outside [0, 1)", i,
                           q[i].row, B * M, q[i].top_n, PICK_MAX_TOP);
    if (forward_check(m, mems, B, tokens, M, targets, err)) return -1;
    if (m->backend && m->backend->forward_pick) {
        if (m->backend->forward_pick(m->backend->ctx, mems, B, tokens, M, targets, tlp, n, q, o, mw, mw_ctx, err))
            return -1;
        advance(m, mems, B, tokens, M);
        return 0;
    }
    /* the host: a stream with picks gets its rows whole, the others only their targets (adaptive
     * softmax: the cheap path) */
    const size_t V = (size_t)m->V, N = (size_t)B * M;
    float *rows = ws_get(ws, WS_PICK, N * V), *scratch = ws_get(ws, WS_PICK_SCRATCH, SAMPLE_SCRATCH(V));
    int32_t *tg = targets ? malloc(N * sizeof *tg) : NULL;
    if (!rows || !scratch || (targets && !tg)) {
        free(tg);
        return err_set(err, "out of memory for %d x %d rows of logprobs", B, M);
    }
    if (tg) {
        memcpy(tg, targets, N * sizeof *tg);
        for (int i = 0; i < n; i++) tg[(size_t)(q[i].row / M) * M] = -1;
    }
    if (mw) mw(mw_ctx, 1);   /* the host computes the step itself: its work first, as it would come */
    int rc = model_forward_targets(m, mems, B, tokens, M, tg, rows, ws, err);
    for (size_t r = 0; rc == 0 && targets && r < N; r++)
        if (targets[r / M * M] >= 0) tlp[r] = rows[r * V + targets[r]];
    for (int i = 0; rc == 0 && i < n; i++) sample_pick(rows + (size_t)q[i].row * V, m->V, &q[i], &o[i], scratch);
    free(tg);
    return rc;
}
