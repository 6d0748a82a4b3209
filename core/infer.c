/*
 * infer.c - scoring and generation loops (see infer.h).
 */
#include "infer.h"
#include "err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *finish_name(finish_reason f)
{
    return f == FINISH_LENGTH ? "length" : f == FINISH_STOP ? "stop" : "cancelled";
}

int infer_score(const model_t *m, mem_t *s, fwd_ws *ws, const int32_t *toks, size_t n, score_t *out,
                float *per_token, char *err)
{
    score_job j = {s, toks, n, out, per_token};
    return infer_score_many(m, &j, 1, ws, err);
}

size_t score_inputs(const score_job *j)
{
    return j->n && j->s->pending < 0 ? j->n - 1 : j->n;
}

int infer_score_many(const model_t *m, score_job *jobs, int B, fwd_ws *ws, char *err)
{
    size_t M = 0;   /* the inputs of the streams that have some (infer_feed_many checks they agree) */
    for (int b = 0; jobs && b < B; b++)
        if (jobs[b].s && score_inputs(&jobs[b])) M = score_inputs(&jobs[b]);
    return infer_feed_many(m, jobs, B, NULL, 0, M, ws, err);
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

int gen_begin(gen_state *g, const model_t *m, mem_t *s, const int32_t *prompt, size_t n_prompt,
              const gen_params *p, int top_n, int echo, char *err)
{
    memset(g, 0, sizeof *g);
    if (n_prompt == 0 && s->pending < 0)
        return err_set(err, "nothing to continue from: the prompt is empty and the stream has no previous token");
    const int maxt = p->max_tokens > 0 ? p->max_tokens : 0;
    g->m = m;
    g->s = s;
    g->p = *p;
    g->p.max_tokens = maxt;
    g->top_n = top_n < 0 ? 0 : top_n > GEN_MAX_TOP ? GEN_MAX_TOP : top_n;
    g->echo = echo;
    g->has_pending_in = s->pending >= 0;
    g->n_in = n_prompt + (size_t)g->has_pending_in;
    rng_seed(&g->rng, p->seed);
    size_t tn = (size_t)(g->top_n ? g->top_n : 1);
    g->in = malloc(g->n_in * sizeof *g->in);
    g->res.tokens = malloc(((size_t)maxt + 1) * sizeof *g->res.tokens);
    g->res.logprobs = malloc(((size_t)maxt + 1) * sizeof *g->res.logprobs);
    g->res.text = malloc((size_t)maxt * vocab_max_piece(&m->vocab) + 1);
    g->piece = malloc(vocab_max_piece(&m->vocab) + 1);
    g->top = malloc(((size_t)maxt + 1) * tn * sizeof *g->top);
    g->top_lp = malloc(((size_t)maxt + 1) * tn * sizeof *g->top_lp);
    if (echo) {
        g->prompt_lp = malloc((n_prompt + 1) * sizeof *g->prompt_lp);
        g->prompt_top = malloc((n_prompt + 1) * tn * sizeof *g->prompt_top);
        g->prompt_top_lp = malloc((n_prompt + 1) * tn * sizeof *g->prompt_top_lp);
    }
    if (!g->in || !g->res.tokens || !g->res.logprobs || !g->res.text || !g->piece ||
        !g->top || !g->top_lp || (echo && (!g->prompt_lp || !g->prompt_top || !g->prompt_top_lp))) {
        gen_result r;
        gen_end(g, &r);
        gen_result_free(&r);
        return err_set(err, "out of memory");
    }
    if (g->has_pending_in) g->in[0] = s->pending;
    memcpy(g->in + g->has_pending_in, prompt, n_prompt * sizeof *g->in);
    g->prev0 = g->n_in ? g->in[g->n_in - 1] : -1;
    for (size_t i = 0; echo && i < n_prompt; i++) g->prompt_lp[i] = NAN;
    g->res.text[0] = 0;
    g->res.prompt_tokens = (int)n_prompt;
    g->res.finish = FINISH_LENGTH;
    return 0;
}

/* Inputs the prefill feeds: all of them when tokens follow, else all but the
 * last, which stays pending. */
static size_t prefill_total(const gen_state *g)
{
    return g->p.max_tokens > 0 ? g->n_in : g->n_in - 1;
}

size_t gen_prefill_left(const gen_state *g)
{
    return prefill_total(g) - g->fed;
}

size_t gen_prefill_block(const gen_state *g)
{
    const size_t left = gen_prefill_left(g), L = (size_t)mem_block(g->s), k = left < L ? left : L;
    /* the block holds the prompt's last input: feed it alone after the rest */
    if (g->m->tf_attn && g->p.max_tokens > 0 && k == left && left > 1) return left - 1;
    return k;
}

long gen_prefill(gen_state *g, fwd_ws *ws, char *err)
{
    if (infer_feed_many(g->m, NULL, 0, &g, 1, gen_prefill_block(g), ws, err)) return -1;
    return (long)gen_prefill_left(g);
}

/* What a prompt's next K inputs, fed as stream B of a block, ask of it:
 * their targets in TG (with echo, each row's next prompt token: its
 * logprob), and into Q from *N the picks (with echo and top logprobs,
 * each row's top tokens; after the prompt's last input, the first token). */
static void prefill_ask(gen_state *g, int b, int k, int32_t *tg, pick_req *q, int *n)
{
    for (int i = 0; i < k; i++) {
        /* row i predicts input fed+i+1, which is prompt token fed+i+1-has_pending */
        const size_t r = g->fed + (size_t)i + 1;
        tg[i] = !g->echo ? -1 : r < g->n_in ? g->in[r] : 0;   /* (0: a row past the prompt, whose logprob goes nowhere) */
        if (g->echo && g->top_n && r < g->n_in) q[(*n)++] = (pick_req){b * k + i, 0, g->p.sp, 0, g->top_n};
    }
    if (g->fed + (size_t)k == prefill_total(g) && g->p.max_tokens > 0) gen_pick_req(g, b * k + k - 1, &q[(*n)++]);
}

/* The answers to prefill_ask: TL the targets' logprobs, O from *N the picks. */
static void prefill_accept(gen_state *g, int k, const float *tl, const pick_out *o, int *n)
{
    g->s->pending = -1;
    for (int i = 0; g->echo && i < k; i++) {
        const size_t r = g->fed + (size_t)i + 1;
        if (r >= g->n_in) break;
        const size_t j = r - (size_t)g->has_pending_in;
        g->prompt_lp[j] = tl[i];
        if (!g->top_n) continue;
        memcpy(g->prompt_top + j * g->top_n, o[*n].top, (size_t)g->top_n * sizeof *o->top);
        memcpy(g->prompt_top_lp + j * g->top_n, o[*n].top_lp, (size_t)g->top_n * sizeof *o->top_lp);
        (*n)++;
    }
    g->fed += (size_t)k;
    if (g->fed == prefill_total(g) && g->p.max_tokens > 0) g->picked = o[(*n)++];   /* the first token */
}

/* Checks the streams of infer_feed_many; the memories of those with inputs
 * go to MEMS (score jobs first, then generations). Returns their number, or
 * -1. */
static int feed_check(const model_t *m, const score_job *jobs, int ns, gen_state *const *gens, int ng, size_t M,
                      mem_t **mems, char *err)
{
    int S = 0;
    for (int b = 0; b < ns; b++) {
        const score_job *j = &jobs[b];
        if (!j->s || j->s->m != m || !j->out || (j->n && !j->toks))
            return err_set(err, "score stream %d: no memory of this model, no totals, or no tokens", b);
        for (size_t i = 0; i < j->n; i++)
            if (j->toks[i] < 0 || j->toks[i] >= m->V)
                return err_set(err, "score stream %d: token id %d at %zu is outside the vocabulary [0, %d)", b,
                               j->toks[i], i, m->V);
        size_t k = score_inputs(j);
        if (k && k != M) return err_set(err, "score stream %d has %zu inputs, not the block's %zu", b, k, M);
        if (k) mems[S++] = j->s;
    }
    for (int b = 0; b < ng; b++) {
        const gen_state *g = gens[b];
        if (!g || g->m != m || !g->s) return err_set(err, "generation %d: not begun with this model", b);
        if (gen_prefill_left(g) < M)
            return err_set(err, "generation %d has %zu prompt inputs left, fewer than the block's %zu", b,
                           gen_prefill_left(g), M);
        if (M) mems[S++] = g->s;
    }
    /* one memory fed twice in one forward would see neither block */
    for (int b = 0; b < ns + ng; b++) {
        const mem_t *s = b < ns ? jobs[b].s : gens[b - ns]->s;
        for (int c = 0; c < b; c++)
            if ((c < ns ? jobs[c].s : gens[c - ns]->s) == s)
                return err_set(err, "streams %d and %d share one memory", c, b);
    }
    return S;
}

int infer_feed_many(const model_t *m, score_job *jobs, int ns, gen_state **gens, int ng, size_t M, fwd_ws *ws,
                    char *err)
{
    if (!m || ns < 0 || ng < 0 || (ns && !jobs) || (ng && !gens)) return err_set(err, "no model or no streams");
    mem_t **mems = malloc(((size_t)ns + (size_t)ng + 1) * sizeof *mems);
    if (!mems) return err_set(err, "out of memory");
    int S = feed_check(m, jobs, ns, gens, ng, M, mems, err), rc = S < 0 ? -1 : 0;
    /* pieces of the streams' block (mem_block: the model's scoring block, or a window model fed in
     * windows feeds one a forward) */
    size_t L = (size_t)model_score_block(m);
    for (int b = 0; b < S; b++) L = (size_t)mem_block(mems[b]) < L ? (size_t)mem_block(mems[b]) : L;
    const size_t blk = M < L ? M : L;
    int32_t *in = NULL, *tg = NULL;
    float *tl = NULL;
    pick_req *q = NULL;
    pick_out *o = NULL;
    if (rc == 0 && S > 0 && M > 0) {
        const size_t rows = (size_t)S * blk;
        in = malloc(rows * sizeof *in);
        tg = malloc(rows * sizeof *tg);
        tl = malloc(rows * sizeof *tl);
        q = malloc(rows * sizeof *q);   /* at most a pick a row */
        o = malloc(rows * sizeof *o);
        if (!in || !tg || !tl || !q || !o) rc = err_set(err, "out of memory for a block of %d x %zu tokens", S, blk);
    }
    size_t k;
    for (size_t done = 0; rc == 0 && S > 0 && done < M; done += k) {
        k = M - done < L ? M - done : L;
        /* a text's inputs: [pending] + toks[0..n-2] predicting toks[0..n-1], or
         * without a pending token toks[0..n-2] predicting toks[1..n-1] */
        int b = 0, n = 0;
        for (int j = 0; j < ns; j++) {
            const score_job *sj = &jobs[j];
            if (!score_inputs(sj)) continue;
            const size_t first = sj->s->pending >= 0 ? 0 : 1;
            for (size_t i = 0; i < k; i++) {
                size_t t = first + done + i;   /* index of the target */
                in[(size_t)b * k + i] = t == 0 ? sj->s->pending : sj->toks[t - 1];
                tg[(size_t)b * k + i] = sj->toks[t];   /* a score wants only these (adaptive softmax: cheaper) */
            }
            b++;
        }
        for (int j = 0; j < ng; j++, b++) {
            memcpy(in + (size_t)b * k, gens[j]->in + gens[j]->fed, k * sizeof *in);
            prefill_ask(gens[j], b, (int)k, tg + (size_t)b * k, q, &n);
        }
        if (model_forward_pick(m, mems, S, in, (int)k, tg, tl, n, q, o, ws, err)) {
            rc = -1;
            break;
        }
        b = 0;
        for (int j = 0; j < ns; j++) {
            const score_job *sj = &jobs[j];
            if (!score_inputs(sj)) continue;
            const size_t first = sj->s->pending >= 0 ? 0 : 1;
            for (size_t i = 0; i < k; i++) {
                float l = tl[(size_t)b * k + i];
                if (!isfinite(l) && rc == 0)
                    rc = err_set(err, "the model gave a log-probability that is not finite at token %zu (of score "
                                 "stream %d): its weights or this stream's memory overflow", first + done + i, j);
                sj->out->nll_sum -= l;
                if (sj->per_token) sj->per_token[done + i] = l;
            }
            sj->out->tokens += (long)k;
            b++;
        }
        if (rc) break;
        n = 0;
        for (int j = 0; j < ng; j++, b++) prefill_accept(gens[j], (int)k, tl + (size_t)b * k, o, &n);
    }
    if (rc == 0) {
        for (int j = 0; j < ns; j++)
            if (jobs[j].n) jobs[j].s->pending = jobs[j].toks[jobs[j].n - 1];
        for (int j = 0; j < ng; j++) {
            gen_state *g = gens[j];
            if (g->fed == prefill_total(g) && g->p.max_tokens == 0 && g->n_in > 0) g->s->pending = g->in[g->n_in - 1];
        }
    }
    free(mems);
    free(in);
    free(tg);
    free(tl);
    free(q);
    free(o);
    return rc;
}

int gen_sample(gen_state *g)
{
    gen_result *r = &g->res;
    const model_t *m = g->m;
    if (r->finish != FINISH_LENGTH || r->n_tokens >= g->p.max_tokens) return 0;
    const pick_out *o = &g->picked;
    if (o->token < 0) return -1;   /* nothing to draw from */
    int32_t x = o->token;
    int t = r->n_tokens++;
    r->tokens[t] = x;
    r->logprobs[t] = o->lp;
    if (g->top_n) {
        memcpy(g->top + (size_t)t * g->top_n, o->top, (size_t)g->top_n * sizeof *o->top);
        memcpy(g->top_lp + (size_t)t * g->top_n, o->top_lp, (size_t)g->top_n * sizeof *o->top_lp);
    }
    g->s->pending = x;
    size_t l = vocab_piece(&m->vocab, t ? r->tokens[t - 1] : g->prev0, x, g->piece);
    const size_t before = r->text_len;
    memcpy(r->text + r->text_len, g->piece, l);
    r->text_len += l;
    r->text[r->text_len] = 0;
    /* a stop string not found before ends in the new piece: look only from there; the earliest wins */
    for (int i = 0; i < g->p.n_stop; i++) {
        const size_t sl = strlen(g->p.stop[i]), from = before >= sl ? before - sl + 1 : 0;
        const char *hit = sl && from <= r->text_len ? strstr(r->text + from, g->p.stop[i]) : NULL;
        if (hit) {
            r->text_len = (size_t)(hit - r->text);
            r->text[r->text_len] = 0;
            r->finish = FINISH_STOP;
        }
    }
    /* the tokens whose characters are in the text (each token's text is whole): all of them, until a
     * stop string cuts the text (once: the generation ends) */
    r->n_text_tokens = r->n_tokens;
    if (r->finish == FINISH_STOP) {
        size_t at = 0;
        r->n_text_tokens = 0;
        for (int i = 0; i < r->n_tokens; i++) {
            size_t k = vocab_piece(&m->vocab, i ? r->tokens[i - 1] : g->prev0, r->tokens[i], g->piece);
            if (at + k > r->text_len) break;
            at += k;
            r->n_text_tokens++;
        }
    }
    if (r->finish == FINISH_STOP || r->n_tokens == g->p.max_tokens) return 0;
    g->next = x;
    return 1;
}

void gen_pick_req(gen_state *g, int row, pick_req *q)
{
    q->row = row;
    q->sample = 1;
    q->sp = g->p.sp;
    q->u = sample_draws(&g->p.sp) ? rng_uniform(&g->rng) : 0;
    q->top_n = g->top_n;
}

void gen_accept(gen_state *g, const pick_out *o)
{
    g->s->pending = -1;
    g->picked = *o;
}

void gen_take_text(gen_state *g, const char **text, size_t *len)
{
    const gen_result *r = &g->res;
    int settled = r->finish != FINISH_LENGTH || r->n_tokens >= g->p.max_tokens;
    size_t ready = settled ? r->text_len : r->text_len - held_back(r->text, r->text_len, &g->p);
    if (ready < g->emitted) ready = g->emitted;
    *text = r->text + g->emitted;
    *len = ready - g->emitted;
    g->emitted = ready;
}

void gen_end(gen_state *g, gen_result *out)
{
    *out = g->res;
    free(g->in);
    free(g->top);
    free(g->top_lp);
    free(g->prompt_lp);
    free(g->prompt_top);
    free(g->prompt_top_lp);
    free(g->piece);
    memset(g, 0, sizeof *g);
}

int infer_generate(const model_t *m, mem_t *s, fwd_ws *ws, const int32_t *prompt, size_t n_prompt,
                   const gen_params *p, gen_emit emit, void *ctx, gen_result *res, char *err)
{
    gen_state g;
    memset(res, 0, sizeof *res);
    if (gen_begin(&g, m, s, prompt, n_prompt, p, 0, 0, err)) return -1;
    long left;
    while ((left = gen_prefill(&g, ws, err)) > 0) {}
    int rc = left < 0 ? -1 : 0;
    const char *piece;
    size_t len;
    int more;
    while (rc == 0 && (more = gen_sample(&g)) != 0) {
        if (more < 0) { rc = err_set(err, "the model gave a log-probability that is not finite"); break; }
        gen_take_text(&g, &piece, &len);
        if (emit && len && emit(ctx, piece, len)) { g.res.finish = FINISH_CANCELLED; break; }
        pick_req q;
        pick_out o;
        gen_pick_req(&g, 0, &q);
        if (model_forward_pick(m, &s, 1, &g.next, 1, NULL, NULL, 1, &q, &o, ws, err)) { rc = -1; break; }
        gen_accept(&g, &o);
    }
    if (rc == 0 && emit && g.res.finish != FINISH_CANCELLED) {
        gen_take_text(&g, &piece, &len);
        if (len) emit(ctx, piece, len);
    }
    gen_end(&g, res);
    if (rc) gen_result_free(res);
    return rc;
}
