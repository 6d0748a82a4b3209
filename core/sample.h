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

/* Draws a token from LOGPROBS (V natural-log probabilities). SCRATCH holds
 * 2*V floats. */
int32_t sample_token(const float *logprobs, int V, const sample_params *p, rng_t *r, float *scratch);

#endif
