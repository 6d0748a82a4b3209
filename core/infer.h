/*
 * infer.h - scoring and generation over a stream's memory: the loops that
 * the command line and the server share.
 *
 * A stream's memory holds every token it was given but the last, which
 * waits as `pending`: the next call feeds it first. So scoring a text in
 * chunks, one call after another, predicts every token exactly once, and the
 * chunks add up to the whole; generation continues from wherever the stream
 * stopped.
 */
#ifndef SPANSERVE_INFER_H
#define SPANSERVE_INFER_H

#include <stddef.h>

#include "model.h"
#include "sample.h"

typedef struct {
    long tokens;        /* predictions scored */
    double nll_sum;     /* their negative log-likelihood, nats */
} score_t;

/* Scores TOKS[0..n) after the stream S: the first token is predicted from
 * the pending token (a stream without one starts predicting at toks[1]).
 * Feeds blocks of the model's block length. PER_TOKEN, if not NULL, gets the
 * logprob of each prediction (room for n floats). Adds to *OUT. */
int infer_score(const model_t *m, mem_t *s, fwd_ws *ws, const int32_t *toks, size_t n, score_t *out,
                float *per_token, char *err);

typedef enum { FINISH_LENGTH, FINISH_STOP, FINISH_CANCELLED } finish_reason;
const char *finish_name(finish_reason f);

typedef struct {
    sample_params sp;
    uint64_t seed;
    int max_tokens;
    const char *const *stop;   /* stop strings; generation ends before the first */
    int n_stop;
} gen_params;

/* Called with each piece of text as it becomes final (held back while it may
 * still begin a stop string); return non-zero to cancel. */
typedef int (*gen_emit)(void *ctx, const char *text, size_t len);

typedef struct {
    char *text;              /* the generated text (stop string removed); caller frees */
    size_t text_len;
    int32_t *tokens;         /* the generated tokens; caller frees */
    float *logprobs;         /* logprob of each generated token */
    int n_tokens;
    int prompt_tokens;
    finish_reason finish;
} gen_result;

/* Feeds PROMPT (may be empty if the stream has a pending token) and samples
 * up to p->max_tokens tokens. */
int infer_generate(const model_t *m, mem_t *s, fwd_ws *ws, const int32_t *prompt, size_t n_prompt,
                   const gen_params *p, gen_emit emit, void *ctx, gen_result *res, char *err);
void gen_result_free(gen_result *r);

#endif
