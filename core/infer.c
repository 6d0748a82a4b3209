/*
 * infer.c - scoring and generation loops (see infer.h).
 */
#include "infer.h"
#include "err.h"

#include <stdlib.h>
#include <string.h>

const char *finish_name(finish_reason f)
{
    return f == FINISH_LENGTH ? "length" : f == FINISH_STOP ? "stop" : "cancelled";
}

int infer_score(const model_t *m, mem_t *s, fwd_ws *ws, const int32_t *toks, size_t n, score_t *out,
                float *per_token, char *err)
{
    if (n == 0) return 0;
    const int L = m->block_len, V = m->V;
    float *lp = malloc((size_t)L * V * sizeof *lp);
    int32_t *in = malloc((size_t)L * sizeof *in);
    if (!lp || !in) {
        free(lp);
        free(in);
        return err_set(err, "out of memory");
    }
    /* inputs: [pending] + toks[0..n-2]; targets: toks[0..n-1] (or without a
     * pending token: toks[0..n-2] predicting toks[1..n-1]) */
    size_t first = s->pending >= 0 ? 0 : 1, done = 0, total = n - first;
    int rc = 0;
    while (done < total) {
        int k = total - done < (size_t)L ? (int)(total - done) : L;
        for (int i = 0; i < k; i++) {
            size_t t = first + done + i;   /* index of the target */
            in[i] = t == 0 ? s->pending : toks[t - 1];
        }
        if (model_forward(m, &s, 1, in, k, lp, ws, err)) { rc = -1; break; }
        for (int i = 0; i < k; i++) {
            int32_t y = toks[first + done + i];
            float l = lp[(size_t)i * V + y];
            out->nll_sum -= l;
            if (per_token) per_token[done + i] = l;
        }
        out->tokens += k;
        done += (size_t)k;
    }
    if (rc == 0) s->pending = toks[n - 1];
    free(lp);
    free(in);
    return rc;
}

void gen_result_free(gen_result *r)
{
    free(r->text);
    free(r->tokens);
    free(r->logprobs);
    memset(r, 0, sizeof *r);
}

/* Length of the longest suffix of TEXT that is a proper prefix of a stop
 * string: text that may yet turn into a stop string is held back. */
static size_t held_back(const char *text, size_t len, const gen_params *p)
{
    size_t hold = 0;
    for (int i = 0; i < p->n_stop; i++) {
        size_t sl = strlen(p->stop[i]);
        for (size_t k = sl > 1 ? sl - 1 : 0; k > hold; k--)
            if (k <= len && memcmp(text + len - k, p->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

int infer_generate(const model_t *m, mem_t *s, fwd_ws *ws, const int32_t *prompt, size_t n_prompt,
                   const gen_params *p, gen_emit emit, void *ctx, gen_result *res, char *err)
{
    memset(res, 0, sizeof *res);
    const int V = m->V, L = m->block_len, maxt = p->max_tokens > 0 ? p->max_tokens : 0;
    if (n_prompt == 0 && s->pending < 0)
        return err_set(err, "nothing to continue from: the prompt is empty and the stream has no previous token");
    res->prompt_tokens = (int)n_prompt;
    if (maxt == 0) {   /* feed the prompt, keep its last token pending */
        score_t sc = {0, 0};
        return infer_score(m, s, ws, prompt, n_prompt, &sc, NULL, err);
    }
    size_t n_in = n_prompt + (s->pending >= 0);
    int32_t *in = malloc(n_in * sizeof *in);
    float *lp = malloc((size_t)L * V * sizeof *lp), *scratch = malloc(2 * (size_t)V * sizeof *scratch);
    res->tokens = malloc((size_t)maxt * sizeof *res->tokens);
    res->logprobs = malloc((size_t)maxt * sizeof *res->logprobs);
    res->text = malloc((size_t)maxt * 4 + 1);
    int rc = -1;
    if (!in || !lp || !scratch || !res->tokens || !res->logprobs || !res->text) {
        err_set(err, "out of memory");
        goto out;
    }
    if (s->pending >= 0) in[0] = s->pending;
    memcpy(in + (s->pending >= 0), prompt, n_prompt * sizeof *in);
    /* the prompt in blocks; the last row gives the first prediction */
    int last = 0;
    for (size_t at = 0; at < n_in; at += (size_t)last) {
        last = n_in - at < (size_t)L ? (int)(n_in - at) : L;
        if (model_forward(m, &s, 1, in + at, last, lp, ws, err)) goto out;
    }
    const float *cur = lp + (size_t)(last - 1) * V;
    rng_t rng;
    rng_seed(&rng, p->seed);
    size_t emitted = 0;
    res->finish = FINISH_LENGTH;
    res->text[0] = 0;
    for (int t = 0; t < maxt; t++) {
        int32_t x = sample_token(cur, V, &p->sp, &rng, scratch);
        res->tokens[t] = x;
        res->logprobs[t] = cur[x];
        res->n_tokens = t + 1;
        s->pending = x;
        size_t l = strlen(m->vocab.tok[x]);
        memcpy(res->text + res->text_len, m->vocab.tok[x], l);
        res->text_len += l;
        res->text[res->text_len] = 0;
        for (int i = 0; i < p->n_stop; i++) {
            const char *hit = p->stop[i][0] ? strstr(res->text, p->stop[i]) : NULL;
            if (hit && (size_t)(hit - res->text) <= res->text_len) {
                res->text_len = (size_t)(hit - res->text);
                res->text[res->text_len] = 0;
                res->finish = FINISH_STOP;
            }
        }
        size_t ready = res->finish == FINISH_STOP ? res->text_len : res->text_len - held_back(res->text, res->text_len, p);
        if (emit && ready > emitted) {
            if (emit(ctx, res->text + emitted, ready - emitted)) { res->finish = FINISH_CANCELLED; break; }
            emitted = ready;
        }
        if (res->finish == FINISH_STOP || t + 1 == maxt) break;
        /* feed the sampled token: it leaves `pending` for the memory */
        if (model_forward(m, &s, 1, &x, 1, lp, ws, err)) goto out;
        s->pending = -1;
        cur = lp;
    }
    if (emit && res->finish == FINISH_LENGTH && res->text_len > emitted)
        emit(ctx, res->text + emitted, res->text_len - emitted);
    rc = 0;
out:
    free(in);
    free(lp);
    free(scratch);
    if (rc) gen_result_free(res);
    return rc;
}
