/*
 * adaptive.h - adaptive input embedding and projected adaptive softmax
 * (Baevski & Auli 2019; Grave et al. 2017) as kimiyoung/transformer-xl's
 * AdaptiveEmbedding and ProjectedAdaptiveLogSoftmax compute them.
 *
 * The vocabulary is cut at c = [0, cutoffs..., V]: cluster i holds ids
 * [c_i, c_{i+1}) with vectors of d_i = d_embed / div_val^i dims.
 *   input:  x = (E_i[t - c_i] P_i^T) * sqrt(d_model)        (P_i: d_model x d_i)
 *   output: head = log_softmax([(h Q_0) W_0^T + b_0, h Q_0 . w_k + b_k])
 *           over the shortlist c_0..c_1 and one column per tail cluster;
 *           log p(t) = head[t] in the shortlist, else
 *           head[c_1 + n - k] + log_softmax((h Q_k) W_k^T + b_k)[t - c_k]
 *           for t in tail cluster k = 1..n (cluster k reads the k-th head
 *           column from the end, as the reference does).
 * Q_k (d_model x d_k) is absent where the reference has none; seed 004's
 * TensorFlow AdaptiveSoftmax (par_tf.c) projects with a bias, h Q_k + q_k,
 * and takes no adaptive input (model_t.emb set).
 */
#ifndef SPANSERVE_ADAPTIVE_H
#define SPANSERVE_ADAPTIVE_H

#include "forward.h"

#define ADA_MAX_CLUSTERS 16

typedef struct adaptive {
    int n;                                   /* clusters, the shortlist included (1 + tail clusters) */
    int cut[ADA_MAX_CLUSTERS + 1];           /* c_0 = 0 .. c_n = V */
    int dim[ADA_MAX_CLUSTERS];               /* d_i */
    const float *emb[ADA_MAX_CLUSTERS];      /* (c_{i+1} - c_i) x d_i rows */
    const float *emb_proj[ADA_MAX_CLUSTERS]; /* d_model x d_i, or NULL (d_i == d_model) */
    const float *out_w[ADA_MAX_CLUSTERS];    /* (c_{i+1} - c_i) x d_i */
    const float *out_b[ADA_MAX_CLUSTERS];    /* c_{i+1} - c_i */
    const float *out_proj[ADA_MAX_CLUSTERS]; /* d_model x d_i, or NULL */
    const float *out_proj_b[ADA_MAX_CLUSTERS]; /* d_i: the projection's bias (seed 004's), or NULL */
    float *out_proj_t[ADA_MAX_CLUSTERS];     /* its transpose, d_i x d_model (made at load) */
    const float *cluster_w, *cluster_b;      /* (n - 1) x d_0, n - 1 */
    float *head_w, *head_b;                  /* [W_0; cluster_w], [b_0; cluster_b] (made at load) */
} adaptive;

/* Makes the transposed projections and the head's stacked weights. */
int adaptive_prepare(adaptive *a, int d_model, char *err);
void adaptive_free(adaptive *a);
/* x[n] = the adaptive input of tokens[n], n < N (d_model each). */
void adaptive_embed(const model_t *m, const int32_t *tokens, size_t N, float *x);
/* OUT = log-probabilities of all V tokens for each of the B*M rows of H;
 * for a stream whose TARGETS (model_forward_targets) are given, only each
 * row's target's, from the head and the target's cluster. A stream's values
 * are the same whatever the other streams are. */
int adaptive_logprobs(const model_t *m, const float *h, int B, int M, const int32_t *targets, float *out, fwd_ws *ws,
                      char *err);

#endif
