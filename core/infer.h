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
 * Feeds blocks of the stream's block length (mem_block: the model's scoring
 * block, model_score_block). PER_TOKEN, if not NULL, gets the
 * logprob of each prediction (room for n floats). Adds to *OUT. A
 * prediction that is not finite is an error. */
int infer_score(const model_t *m, mem_t *s, fwd_ws *ws, const int32_t *toks, size_t n, score_t *out,
                float *per_token, char *err);

/* One stream of infer_score_many: the arguments of one infer_score call. */
typedef struct {
    mem_t *s;
    const int32_t *toks;
    size_t n;
    score_t *out;
    float *per_token;
} score_job;

/* The tokens J feeds to the model: all n after a pending token, n - 1
 * without one (the first token is then fed but not predicted). */
size_t score_inputs(const score_job *j);

/* infer_score for B streams at once: each stream (distinct memories) is
 * scored as infer_score would score it alone, but the streams' blocks go
 * through one model_forward side by side (B streams x up to mem_block
 * tokens), which on a GPU costs little more than one stream's. Every stream
 * with inputs must have the same number of them (score_inputs); streams with
 * none (n == 0, or one token and no pending token) only take their pending
 * token, as infer_score does. On failure the memories hold what was fed
 * before it and their pending tokens are unchanged. */
int infer_score_many(const model_t *m, score_job *jobs, int B, fwd_ws *ws, char *err);

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
 *   while (gen_sample(g) == 1) {          takes the picked token; 0 when done
 *       gen_pick_req(g, row, &q)          what to pick from the next position
 *       model_forward_pick(.., &g->next, 1, .., &q, &o ..)   any number of streams at once
 *       gen_accept(g, &o)                 the pick
 *   }
 *
 * The pick (sample.h) happens where the logprobs are (on a GPU, on the
 * device): only the token, its logprob and the top tokens come back.
 *
 * TOP_N > 0 records, for each generated token (and, with ECHO, each prompt
 * token), the TOP_N most likely tokens and their logprobs. */
#define GEN_MAX_TOP PICK_MAX_TOP

typedef struct {
    const model_t *m;
    mem_t *s;
    gen_params p;
    rng_t rng;
    int32_t *in;             /* inputs still to feed in prefill: [pending] + prompt */
    size_t n_in, fed;
    int has_pending_in;      /* in[0] was the stream's pending token */
    pick_out picked;         /* the next token, picked from its logprobs */
    int32_t next;            /* the token gen_sample took, to feed */
    int32_t prev0;           /* the token before the first generated one (-1: none): a word's text depends on it */
    char *piece;             /* one token's text (vocab_piece) */
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
/* The prompt inputs gen_prefill has still to feed. */
size_t gen_prefill_left(const gen_state *g);
/* The inputs the prefill's next forward feeds: the stream's block from the
 * prompt's start (mem_block), the last one shorter. Where a block's length
 * moves its rows' positions (par-transformer-xl-tf: model_t.tf_attn), the
 * prompt's last input is fed alone after blocks cut as a score of the same
 * text cuts them: echo's logprobs are the score's, and the first token is
 * drawn from a step of one token after the prompt. */
size_t gen_prefill_block(const gen_state *g);
/* Takes the picked token. Returns 1 when it must be fed (g->next) before
 * the next sample, 0 when the generation finished (length or stop), -1 when
 * the logprobs were not all finite (nothing drawn). */
int gen_sample(gen_state *g);
/* The pick of the next token from ROW of the coming forward (draws from the
 * generation's generator when it samples: one draw a token, in order). */
void gen_pick_req(gen_state *g, int row, pick_req *q);
/* The pick after feeding g->next. */
void gen_accept(gen_state *g, const pick_out *o);
/* The settled text not yet handed out: [*text, *text + *len). Advances. */
void gen_take_text(gen_state *g, const char **text, size_t *len);
/* Moves the result out (caller frees with gen_result_free) and frees the rest. */
void gen_end(gen_state *g, gen_result *out);

/* All of the above for one stream: feeds PROMPT (may be empty if the stream
 * has a pending token) and samples up to p->max_tokens tokens. */
int infer_generate(const model_t *m, mem_t *s, fwd_ws *ws, const int32_t *prompt, size_t n_prompt,
                   const gen_params *p, gen_emit emit, void *ctx, gen_result *res, char *err);
void gen_result_free(gen_result *r);

/* Texts being scored and prompts being read, fed together: one forward per
 * block of up to mem_block tokens, every stream side by side. The NS score
 * jobs as infer_score_many (each with M inputs, or none); the NG generations
 * each feed the next M inputs of their prompt (at least M left), as
 * gen_prefill would in blocks of that size. All memories distinct. Each
 * block is one model_forward_pick: a text's targets, a prompt's (with
 * echo) and the picks of its top tokens and first token, so that on a GPU
 * no row of logprobs comes to the host. */
int infer_feed_many(const model_t *m, score_job *jobs, int ns, gen_state **gens, int ng, size_t M, fwd_ws *ws,
                    char *err);


#endif
