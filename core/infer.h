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
    int n_tokens;            /* generated (the stream's memory saw them all) */
    int n_text_tokens;       /* of those, the ones whose characters are in text: all but a stop string's */
    int prompt_tokens;
    finish_reason finish;
} gen_result;

/* Generation, step by step, so that a scheduler can batch the decode steps
 * of many streams into one forward:
 *
 *   gen_begin(...)                        prompt tokens queued for feeding
 *   while (gen_prefill(g, ws, limit) > 0) one block of the prompt a call
 *   while (gen_sample(g) == 1) {          picks the next token; 0 when done
 *       model_forward(.., &g->next, 1 ..) (any number of streams at once)
 *       gen_accept(g, row)                the logprobs of the next position
 *   }
 *
 * TOP_N > 0 records, for each generated token (and, with ECHO, each prompt
 * token), the TOP_N most likely tokens and their logprobs. */
#define GEN_MAX_TOP 5

typedef struct {
    const model_t *m;
    mem_t *s;
    gen_params p;
    rng_t rng;
    int32_t *in;             /* inputs still to feed in prefill: [pending] + prompt */
    size_t n_in, fed;
    int has_pending_in;      /* in[0] was the stream's pending token */
    float *cur;              /* V logprobs of the next token */
    float *scratch;          /* 2V floats for the sampler */
    float *block;            /* block_len * V logprobs of the prefill */
    int32_t next;            /* the token gen_sample picked, to feed */
    size_t emitted;          /* bytes of text handed out as settled */
    int top_n, echo;
    float *prompt_lp;        /* echo: logprob of each prompt token (NAN for the first without pending) */
    int32_t *prompt_top;     /* echo: top_n ids per prompt token */
    float *prompt_top_lp;
    int32_t *top;            /* top_n ids per generated token */
    float *top_lp;
    gen_result res;
} gen_state;

int gen_begin(gen_state *g, const model_t *m, mem_t *s, const int32_t *prompt, size_t n_prompt,
              const gen_params *p, int top_n, int echo, char *err);
/* Feeds up to one block of the prompt; returns the inputs left to feed (0:
 * the prefill is done and the first prediction is ready), or -1. */
long gen_prefill(gen_state *g, fwd_ws *ws, char *err);
/* Samples the next token from the current logprobs. Returns 1 when it must
 * be fed (g->next) before the next sample, 0 when the generation finished
 * (length or stop). */
int gen_sample(gen_state *g);
/* The logprobs after feeding g->next. */
void gen_accept(gen_state *g, const float *logprobs);
/* The settled text not yet handed out: [*text, *text + *len). Advances. */
void gen_take_text(gen_state *g, const char **text, size_t *len);
/* Moves the result out (caller frees with gen_result_free) and frees the rest. */
void gen_end(gen_state *g, gen_result *out);

/* All of the above for one stream: feeds PROMPT (may be empty if the stream
 * has a pending token) and samples up to p->max_tokens tokens. */
int infer_generate(const model_t *m, mem_t *s, fwd_ws *ws, const int32_t *prompt, size_t n_prompt,
                   const gen_params *p, gen_emit emit, void *ctx, gen_result *res, char *err);
void gen_result_free(gen_result *r);

/* The N most likely tokens of LOGPROBS (V), most likely first. */
void top_tokens(const float *logprobs, int V, int n, int32_t *ids, float *lps);

#endif
