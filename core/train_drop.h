/*
 * train_drop.h - the trainers' dropout masks, the same on the CPU and on
 * the GPU: whether element I of dropout site SITE of layer L is kept at
 * optimizer step S of a run of seed SEED is a hash of those numbers (a
 * counter-based generator: splitmix64's finaliser), so that
 *   - a run is deterministic per seed, and a resumed run draws the masks the
 *     uninterrupted one drew (the step is in the state);
 *   - the CUDA trainer drops exactly the elements the CPU trainer drops, and
 *     their gradients can be compared element by element with dropout on;
 *   - nothing is stored: the backward recomputes the mask it needs.
 * A kept element is scaled by 1 / (1 - p) (inverted dropout, as PyTorch's
 * nn.Dropout); p is resolved to 24 bits.
 *
 * Plain C (core/train_*.c) and CUDA (kernels/train_*.cu): under nvcc the
 * functions are __host__ __device__.
 */
#ifndef SPANSERVE_TRAIN_DROP_H
#define SPANSERVE_TRAIN_DROP_H

#include <stdint.h>

#ifdef __CUDACC__
#define TD_FN static inline __host__ __device__
#else
#define TD_FN static inline
#endif

/* Dropout sites (the layer is a separate number). */
enum {
    TD_EMB = 0,    /* the embedding's output (aspan: emb_dropout; PAR: dropout) */
    TD_ATT = 1,    /* the attention's weights after softmax and span mask (aspan: dropout; PAR: dropatt) */
    TD_FF = 2,     /* the feed-forward's hidden layer after its ReLU (dropout) */
    TD_POS = 3,    /* PAR: the sinusoid of the distances before r_net (dropout) */
    TD_AOUT = 4,   /* PAR: the attention's output before the residual (dropout) */
    TD_FOUT = 5,   /* PAR: the feed-forward's output (bias included) before the residual (dropout) */
    TD_OUT = 6     /* PAR: the last block's output before the output layer (dropout) */
};

/* A rate as the hash compares it: drop where the hash's top 24 bits are
 * below thresh. */
typedef struct {
    uint64_t key;      /* the site's key at this step */
    uint64_t off;      /* added to every element index: where a device's share of the streams starts (0 on the CPU) */
    uint32_t thresh;   /* round(p 2^24); 0: nothing dropped */
    float scale;       /* 1 / (1 - p) */
} td_site;

TD_FN uint64_t td_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* the key of (seed, step, site, layer) */
TD_FN uint64_t td_key(uint64_t seed, long step, int site, int layer)
{
    uint64_t k = td_mix(seed + 0x5851F42D4C957F2DULL);
    k = td_mix(k + (uint64_t)step * 0x9E3779B97F4A7C15ULL);
    return td_mix(k + ((uint64_t)(uint32_t)site << 32 | (uint32_t)layer));
}

/* 1 if element I is kept */
TD_FN int td_kept(const td_site *s, uint64_t i)
{
    return (uint32_t)(td_mix(s->key + (i + s->off + 1) * 0xD1B54A32D192ED03ULL) >> 40) >= s->thresh;
}

/* the factor of element I: 0, or 1 / (1 - p) (1 when nothing drops) */
TD_FN double td_factor(const td_site *s, uint64_t i)
{
    if (!s->thresh) return 1.0;
    return td_kept(s, i) ? 1.0 / (1.0 - (double)s->thresh / 16777216.0) : 0.0;
}

/* the site of rate P (0 <= p < 1): none when p is 0 */
TD_FN td_site td_make(uint64_t seed, long step, int site, int layer, double p)
{
    td_site s;
    double t = p * 16777216.0 + 0.5;
    s.thresh = p > 0 ? (uint32_t)(t < 16777215.0 ? t : 16777215.0) : 0u;
    s.key = td_key(seed, step, site, layer);
    s.off = 0;
    s.scale = s.thresh ? (float)(1.0 / (1.0 - (double)s.thresh / 16777216.0)) : 1.0f;
    return s;
}

#endif
