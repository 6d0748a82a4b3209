/*
 * adaptive.c - adaptive input and projected adaptive softmax on the CPU
 * (see adaptive.h for the math).
 */
#include "adaptive.h"
#include "err.h"
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int adaptive_prepare(adaptive *a, int D, char *err)
{
    for (int i = 0; i < a->n; i++) {
        if (!a->out_proj[i]) continue;
        const int d = a->dim[i];
        float *t = malloc((size_t)d * D * sizeof *t);
        if (!t) return err_set(err, "out of memory");
        for (int r = 0; r < D; r++)
            for (int c = 0; c < d; c++) t[(size_t)c * D + r] = a->out_proj[i][(size_t)r * d + c];
        a->out_proj_t[i] = t;
    }
    const int c1 = a->cut[1], tails = a->n - 1, d0 = a->dim[0];
    a->head_w = malloc((size_t)(c1 + tails) * d0 * sizeof *a->head_w);
    a->head_b = malloc((size_t)(c1 + tails) * sizeof *a->head_b);
    if (!a->head_w || !a->head_b) return err_set(err, "out of memory");
    memcpy(a->head_w, a->out_w[0], (size_t)c1 * d0 * sizeof *a->head_w);
    memcpy(a->head_b, a->out_b[0], (size_t)c1 * sizeof *a->head_b);
    if (tails) {
        memcpy(a->head_w + (size_t)c1 * d0, a->cluster_w, (size_t)tails * d0 * sizeof *a->head_w);
        memcpy(a->head_b + c1, a->cluster_b, (size_t)tails * sizeof *a->head_b);
    }
    return 0;
}

void adaptive_free(adaptive *a)
{
    if (!a) return;
    for (int i = 0; i < a->n; i++) free(a->out_proj_t[i]);
    free(a->head_w);
    free(a->head_b);
    free(a);
}

/* The cluster of token T. */
static int cluster_of(const adaptive *a, int32_t t)
{
    int i = 0;
    while (t >= a->cut[i + 1]) i++;
    return i;
}

void adaptive_embed(const model_t *m, const int32_t *tokens, size_t N, float *x)
{
    const adaptive *a = m->ada;
    const int D = m->d_model;
    const double scale = sqrt((double)D);
    for (size_t n = 0; n < N; n++) {
        const int i = cluster_of(a, tokens[n]), d = a->dim[i];
        const float *e = a->emb[i] + (size_t)(tokens[n] - a->cut[i]) * d, *P = a->emb_proj[i];
        float *row = x + n * D;
        if (!P) {
            for (int c = 0; c < D; c++) row[c] = (float)(e[c] * scale);
            continue;
        }
        for (int c = 0; c < D; c++) {
            const float *p = P + (size_t)c * d;
            float s = 0;
            for (int k = 0; k < d; k++) s += e[k] * p[k];
            row[c] = (float)(s * scale);
        }
    }
}

/* HP = H Q_i (+ q_i) (N x d_i): H itself where the cluster has no projection. */
static const float *project(const adaptive *a, int i, const float *h, int B, int M, int D, float *hp)
{
    if (!a->out_proj_t[i]) return h;
    ops_linear(hp, h, a->out_proj_t[i], a->out_proj_b[i], B, M, D, a->dim[i]);
    return hp;
}

/* Stream b's rows whose target is in tail cluster K: their hidden states
 * gathered, projected and scored against that cluster alone. */
static void target_tail(const adaptive *a, int k, const float *h, int M, int D, int V, const int32_t *tg,
                        const float *head, int H, float *out, float *rows, float *hp, float *tail)
{
    const int lo = a->cut[k], Vk = a->cut[k + 1] - lo;
    int n = 0;
    for (int i = 0; i < M; i++)
        if (tg[i] >= lo && tg[i] < a->cut[k + 1]) memcpy(rows + (size_t)n++ * D, h + (size_t)i * D, (size_t)D * sizeof *rows);
    if (!n) return;
    const float *pk = project(a, k, rows, 1, n, D, hp);
    ops_linear(tail, pk, a->out_w[k], a->out_b[k], 1, n, a->dim[k], Vk);
    ops_log_softmax(tail, n, Vk);
    for (int i = 0, j = 0; i < M; i++)
        if (tg[i] >= lo && tg[i] < a->cut[k + 1]) {
            out[(size_t)i * V + tg[i]] = head[(size_t)i * H + H - k] + tail[(size_t)j * Vk + tg[i] - lo];
            j++;
        }
}

int adaptive_logprobs(const model_t *m, const float *h, int B, int M, const int32_t *targets, float *out, fwd_ws *ws,
                      char *err)
{
    const adaptive *a = m->ada;
    const int D = m->d_model, V = m->V, c1 = a->cut[1], tails = a->n - 1, H = c1 + tails;
    const size_t N = (size_t)B * M;
    int dmax = 0, vmax = 0;
    for (int i = 0; i < a->n; i++) {
        dmax = a->dim[i] > dmax ? a->dim[i] : dmax;
        vmax = a->cut[i + 1] - a->cut[i] > vmax ? a->cut[i + 1] - a->cut[i] : vmax;
    }
    float *hp = ws_get(ws, WS_ADA_HP, N * (dmax > D ? dmax : D)), *head = ws_get(ws, WS_ADA_HEAD, N * H),
          *tail = ws_get(ws, WS_ADA_TAIL, N * vmax), *rows = ws_get(ws, WS_ADA_ROWS, (size_t)M * D);
    if (!hp || !head || !tail || !rows) return err_set(err, "out of memory for the adaptive softmax of %zu rows", N);
    /* the head of every row (ops_linear keeps each stream's rows apart) */
    const float *p0 = project(a, 0, h, B, M, D, hp);
    ops_linear(head, p0, a->head_w, a->head_b, B, M, a->dim[0], H);
    ops_log_softmax(head, (int)N, H);
    for (int b = 0; b < B; b++) {
        const size_t r0 = (size_t)b * M;
        const float *hb = h + r0 * D, *headb = head + r0 * H;
        float *ob = out + r0 * V;
        if (targets && targets[r0] >= 0) {   /* the cheap path: the head and each row's target's cluster */
            const int32_t *tg = targets + r0;
            for (int i = 0; i < M; i++)
                if (tg[i] < c1) ob[(size_t)i * V + tg[i]] = headb[(size_t)i * H + tg[i]];
            for (int k = 1; k < a->n; k++) target_tail(a, k, hb, M, D, V, tg, headb, H, ob, rows, hp, tail);
            continue;
        }
        for (int i = 0; i < M; i++) memcpy(ob + (size_t)i * V, headb + (size_t)i * H, (size_t)c1 * sizeof *ob);
        for (int k = 1; k < a->n; k++) {
            const int lo = a->cut[k], Vk = a->cut[k + 1] - lo;
            const float *pk = project(a, k, hb, 1, M, D, hp);
            ops_linear(tail, pk, a->out_w[k], a->out_b[k], 1, M, a->dim[k], Vk);
            ops_log_softmax(tail, M, Vk);
            for (int i = 0; i < M; i++) {
                const float base = headb[(size_t)i * H + H - k];   /* cluster k: the k-th head column from the end */
                float *o = ob + (size_t)i * V + lo;
                const float *t = tail + (size_t)i * Vk;
                for (int j = 0; j < Vk; j++) o[j] = base + t[j];
            }
        }
    }
    return 0;
}
