/*
 * sample.h - choosing the next token: greedy, temperature, top-k, top-p,
 * from a seeded generator (same seed, same text).
 */
#ifndef SPANSERVE_SAMPLE_H
#define SPANSERVE_SAMPLE_H

#include <stdint.h>

typedef struct { uint64_t s[4]; } rng_t;

void rng_seed(rng_t *r, uint64_t seed);
uint64_t rng_next(rng_t *r);
double rng_uniform(rng_t *r);   /* [0, 1) */

/* Doubles, as requests give them: a top_p of 1e-40 is not a float's 0 (which
 * would turn top-p off) but "the most likely token". */
typedef struct {
    double temperature;  /* 0: greedy (argmax, lowest id on ties) */
    int top_k;           /* 0: off */
    double top_p;        /* 1: off; else keep the smallest set of mass >= top_p */
} sample_params;

/* Whether P draws (a uniform number) to pick a token: not when greedy. */
int sample_draws(const sample_params *p);

/* A token's weight exp((v - max) / T), in [0, 1], as the integer
 * w * 2^SAMPLE_FIX (rounded down; INV_T is 1 / T): sums of up to
 * MODEL_MAX_VOCAB (2^20) of them are exact in 64 bits, in any order. */
#define SAMPLE_FIX 40
#define SAMPLE_SCALE 1099511627776.0   /* 2^SAMPLE_FIX: a product by it is exact */
uint64_t sample_weight(float v, double mx, double inv_t);

/* Floats of scratch the host's sampler needs for V tokens. */
#define SAMPLE_SCRATCH(V) (4 * (size_t)(V))

/* Draws a token from LOGPROBS (V natural-log probabilities), with U (in
 * [0, 1)) the generator's draw when sample_draws(P): the tokens sorted by
 * value (the lowest id first on ties), the first top_k kept, then the
 * shortest prefix whose weight reaches top_p of theirs, then the first
 * token whose running weight passes U times the total. SCRATCH holds
 * SAMPLE_SCRATCH(V) floats. */
int32_t sample_token(const float *logprobs, int V, const sample_params *p, double u, float *scratch);

/* What to pick from one row of a forward's logprobs (model_forward_pick):
 * the ROW (stream b, position i: b*M + i), a token drawn as sample_token
 * draws it when SAMPLE, and the TOP_N most likely tokens. The same on every
 * backend: a GPU picks where the logprobs are, and only these come back. */
#define PICK_MAX_TOP 5
typedef struct {
    int row;
    int sample;          /* 0: only the top tokens */
    sample_params sp;
    double u;            /* the draw, when sample_draws(&sp) */
    int top_n;           /* 0..PICK_MAX_TOP */
} pick_req;

typedef struct {
    int32_t token;       /* -1: the row has a log-probability that is not finite (nothing drawn) */
    float lp;            /* the token's logprob */
    int32_t top[PICK_MAX_TOP];   /* most likely first, the lowest id first on ties */
    float top_lp[PICK_MAX_TOP];
} pick_out;

/* The N most likely of LOGPROBS (V), most likely first, the lowest id first
 * on ties (the order sample_token sorts them in). */
void sample_top(const float *logprobs, int V, int n, int32_t *ids, float *lps);

/* The pick Q from ROW (V logprobs) on the host; SCRATCH holds
 * SAMPLE_SCRATCH(V) floats.
 * 0, or -1 (o->token -1) when a logprob is not finite. */
int sample_pick(const float *row, int V, const pick_req *q, pick_out *o, float *scratch);

#endif
