/*
 * sample.c - next-token sampling (see sample.h). The order is the usual one:
 * temperature, then top-k, then top-p over what is left, then one draw.
 * The generator is xoshiro256** seeded through splitmix64.
 */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void rng_seed(rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(rng_t *r)
{
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double rng_uniform(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

typedef struct { float v; int id; } cand_t;

static int cmp_desc(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

int32_t sample_token(const float *lp, int V, const sample_params *p, rng_t *r, float *scratch)
{
    if (!(p->temperature > 0) || p->top_k == 1) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (lp[i] > lp[best]) best = i;
        return best;
    }
    /* candidates by probability, descending; then their weights in place */
    cand_t *c = (cand_t *)scratch;
    for (int i = 0; i < V; i++) c[i] = (cand_t){lp[i], i};
    qsort(c, (size_t)V, sizeof *c, cmp_desc);
    int n = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    double mx = c[0].v, total = 0;
    for (int i = 0; i < n; i++) {
        c[i].v = (float)exp(((double)c[i].v - mx) / p->temperature);
        total += c[i].v;
    }
    if (p->top_p > 0 && p->top_p < 1) {
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += c[i].v;
            if (cum >= p->top_p * total) { keep = i + 1; break; }
        }
        n = keep;
        total = 0;
        for (int i = 0; i < n; i++) total += c[i].v;
    }
    double u = rng_uniform(r) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].v;
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}
