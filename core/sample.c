/*
 * sample.c - next-token sampling (see sample.h). The order is the usual one:
 * temperature, then top-k, then top-p over what is left, then one draw.
 * The weights are integers (sample_weight) and their sums exact, so that
 * the device (kernels/sample.cu), which sums in another order, draws the
 * same token from the same row and the same u.
 * The generator is xoshiro256** seeded through splitmix64.
 */
#include "sample.h"

#include <math.h>
#include <stdint.h>
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

typedef struct {
    float v;
    int id;
    uint64_t w;   /* the weight, fixed point */
} cand_t;
_Static_assert(sizeof(cand_t) == 4 * sizeof(float), "SAMPLE_SCRATCH holds V candidates");

static int cmp_desc(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

uint64_t sample_weight(float v, double mx, double inv_t)
{
    const float w = expf((float)(((double)v - mx) * inv_t));
    return (uint64_t)((double)w * SAMPLE_SCALE);
}

int sample_draws(const sample_params *p) { return p->temperature > 0 && p->top_k != 1; }

int32_t sample_token(const float *lp, int V, const sample_params *p, double u, float *scratch)
{
    if (!sample_draws(p)) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (lp[i] > lp[best]) best = i;
        return best;
    }
    /* candidates by probability, descending; then their weights */
    cand_t *c = (cand_t *)scratch;
    for (int i = 0; i < V; i++) c[i] = (cand_t){lp[i], i, 0};
    qsort(c, (size_t)V, sizeof *c, cmp_desc);
    int n = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    const double mx = c[0].v, inv_t = 1.0 / p->temperature;
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += c[i].w = sample_weight(c[i].v, mx, inv_t);
    if (p->top_p > 0 && p->top_p < 1) {
        const double target = p->top_p * (double)total;
        uint64_t cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += c[i].w;
            if ((double)cum >= target) { keep = i + 1; break; }
        }
        n = keep;
        total = 0;
        for (int i = 0; i < n; i++) total += c[i].w;
    }
    const double target = u * (double)total;
    uint64_t acc = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].w;
        if ((double)acc > target) return c[i].id;
    }
    return c[n - 1].id;
}

void sample_top(const float *lp, int V, int n, int32_t *ids, float *lps)
{
    for (int k = 0; k < n; k++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            if (k && (lp[i] > lps[k - 1] || (lp[i] == lps[k - 1] && i <= ids[k - 1]))) continue;   /* taken */
            if (best < 0 || lp[i] > lp[best]) best = i;
        }
        ids[k] = best;
        lps[k] = best >= 0 ? lp[best] : -INFINITY;
    }
}

int sample_pick(const float *row, int V, const pick_req *q, pick_out *o, float *scratch)
{
    memset(o, 0, sizeof *o);
    o->token = -1;
    for (int i = 0; i < V; i++)
        if (!isfinite(row[i])) return -1;
    const int n = q->top_n < 0 ? 0 : q->top_n > PICK_MAX_TOP ? PICK_MAX_TOP : q->top_n;
    sample_top(row, V, n, o->top, o->top_lp);
    o->token = q->sample ? sample_token(row, V, &q->sp, q->u, scratch) : 0;
    o->lp = row[o->token];
    return 0;
}
