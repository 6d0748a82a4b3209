/*
 * route_infer.c - the routes that run the model: /v1/generate, /v1/score and
 * the OpenAI-compatible /v1/completions. Each validates its request, builds
 * a task (with the session's memory, or a fresh one), queues it for the
 * scheduler and suspends the connection (or opens an event stream); when
 * the task is done the connection is resumed here to answer. The blocks of
 * that path (task_*) serve /v1/chat/completions too (route_chat.c), and the
 * OpenAI APIs' answers and stream chunks are built here or there.
 */
#define _GNU_SOURCE
#include "server.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ------------------------------------------------------------ building tasks */

task_t *task_new(task_kind kind, api_kind api)
{
    task_t *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->kind = kind;
    t->api = api;
    t->fd = -1;
    t->created = time(NULL);
    return t;
}

/* task_bind under srv.lock. */
static int bind_locked(task_t *t, const char *model, const char *session, char *err)
{
    int status = 400;
    if (session) {
        session_t *s = sess_find(session);
        if (!s) return snprintf(err, 512, "no session '%.64s'", session), 404;
        if (model && strcmp(model, s->model->name) != 0)
            return snprintf(err, 512, "session '%s' belongs to model '%s', not '%.64s'", s->id, s->model->name, model), 409;
        if (sess_acquire(s, err, &status)) return status;
        if (sess_mark(s, err)) {
            sess_release(s);
            return 503;
        }
        t->sess = s;
        snprintf(t->sess_id, sizeof t->sess_id, "%s", s->id);
        t->sm = s->model;
        t->mem = s->mem;
    } else {
        if (!model) return snprintf(err, 512, "model is required"), 400;
        t->sm = models_find(model);
        if (!t->sm) return snprintf(err, 512, "no model '%.64s'", model), 404;
        t->mem = mem_new(t->sm->m);
        if (!t->mem) return snprintf(err, 512, "out of memory"), 503;
    }
    t->sm->tasks++;
    t->holds_model = 1;
    return 0;
}

int task_bind(task_t *t, const char *model, const char *session, char *err)
{
    pthread_mutex_lock(&srv.lock);
    int status = bind_locked(t, model, session, err);
    pthread_mutex_unlock(&srv.lock);
    return status;
}

/* Undoes task_bind for a task that never reached the scheduler (the model
 * is let go with the task). */
static void task_unbind(task_t *t)
{
    if (t->sess) sess_release(t->sess);
}

/* (The positions' bound, MEM_MAX_POS, is reached only by a state imported
 * near it.) */
int task_fits(task_t *t, int more, char *err)
{
    if (t->n > (size_t)srv.cfg.max_prompt)
        return snprintf(err, 512, "%zu tokens is over the limit of %d (--max-prompt)", t->n, srv.cfg.max_prompt), 413;
    if ((int64_t)t->n + more > mem_room(t->mem))
        return snprintf(err, 512, "the session has seen %lld tokens and may take %lld more: a stream holds at most "
                        "%lld", (long long)(MEM_MAX_POS - mem_room(t->mem)), (long long)mem_room(t->mem),
                        (long long)MEM_MAX_POS), 400;
    return 0;
}

/* Text -> tokens under the limits: 422 outside the vocabulary, then
 * task_fits. */
static int encode(task_t *t, const char *text, int open, int more, char *err)
{
    char e2[ERR_LEN];
    t->text_len = strlen(text);
    if (!(t->text = strdup(text))) return snprintf(err, 512, "out of memory"), 503;
    if (vocab_encode_offsets(&t->sm->m->vocab, text, t->text_len, open, &t->toks, &t->offs, &t->n, e2))
        return snprintf(err, 512, "%s", e2), 422;
    return task_fits(t, more, err);
}

int task_generate_start(task_t *t, int session, char *err)
{
    if (t->n == 0 && t->mem->pending < 0)
        return snprintf(err, 512, "%s", session ? "the prompt is empty and the session has seen no tokens" : "prompt must not be empty"), 400;
    char e2[ERR_LEN];
    if (gen_begin(&t->g, t->sm->m, t->mem, t->toks, t->n, &t->gp, t->top_n > 0 ? t->top_n : 0, t->echo, e2))
        return snprintf(err, 512, "%s", e2), 503;
    return 0;
}

int task_generate_begin(task_t *t, const char *prompt, int session, char *err)
{
    int status = encode(t, prompt, 1, t->gp.max_tokens, err);
    return status ? status : task_generate_start(t, session, err);
}

/* The sampling fields shared by /v1/generate, /v1/completions and
 * /v1/chat/completions. */
int task_sampling(json_t *b, task_t *t, const char *max_key, long long dflt, char *err)
{
    long long mt, top_k, seed;
    double temp, top_p;
    if (field_int(b, max_key, 0, srv.cfg.max_tokens, dflt < srv.cfg.max_tokens ? dflt : srv.cfg.max_tokens, &mt, err) ||
        field_num(b, "temperature", 0, 100, 1.0, &temp, err) || field_int(b, "top_k", 0, 1 << 20, 0, &top_k, err) ||
        field_num(b, "top_p", 0, 1, 1.0, &top_p, err))
        return -1;
    if (top_p <= 0) return snprintf(err, 512, "top_p must be in (0, 1]"), -1;
    json_t *js = json_object_get(b, "seed");
    if (js && !json_is_null(js)) {
        if (field_int(b, "seed", 0, (1LL << 53), 0, &seed, err)) return -1;
    } else {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, 0) != sizeof r) r = (uint64_t)(now_s() * 1e9);
        seed = (long long)(r & ((1ULL << 53) - 1));
    }
    json_t *st = json_object_get(b, "stop");
    int n_stop = 0;
    if (json_is_string(st)) {
        if (!*json_string_value(st) || strlen(json_string_value(st)) > 256)
            return snprintf(err, 512, "stop strings must be 1 to 256 bytes"), -1;
        t->stop_buf[n_stop++] = strdup(json_string_value(st));
    } else if (json_is_array(st)) {
        if (json_array_size(st) > 16) return snprintf(err, 512, "stop takes at most 16 strings"), -1;
        for (size_t i = 0; i < json_array_size(st); i++) {
            const char *s = json_string_value(json_array_get(st, i));
            if (!s || !*s || strlen(s) > 256) return snprintf(err, 512, "stop strings must be 1 to 256 bytes"), -1;
            t->stop_buf[n_stop++] = strdup(s);
        }
    } else if (st && !json_is_null(st)) {
        return snprintf(err, 512, "stop must be a string or an array of strings"), -1;
    }
    for (int i = 0; i < n_stop; i++)
        if (!t->stop_buf[i]) return snprintf(err, 512, "out of memory"), -1;
    t->gp.sp.temperature = temp;
    t->gp.sp.top_k = (int)top_k;
    t->gp.sp.top_p = top_p;
    t->gp.seed = (uint64_t)seed;
    t->gp.max_tokens = (int)mt;
    t->gp.stop = (const char *const *)t->stop_buf;
    t->gp.n_stop = n_stop;
    return 0;
}

static int client_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

enum MHD_Result task_submit(request_t *r, task_t *t, json_t *b)
{
    char err[512];
    int status;
    json_decref(b);
    t->conn = r->conn;
    t->fd = client_fd(r->conn);
    t->refs = 1;   /* the request's, dropped when the request completes */
    r->task = t;
    pthread_mutex_lock(&srv.lock);
    if (sched_submit(t, err, &status)) {
        task_unbind(t);
        r->task = NULL;
        task_release(t);   /* and its model */
        pthread_mutex_unlock(&srv.lock);
        return reply_error(r, status, "%s", err);
    }
    if (!t->stream) {
        http_wait(r, t);   /* suspended before the scheduler can resume it: under the lock */
        pthread_mutex_unlock(&srv.lock);
        return MHD_YES;
    }
    t->refs++;   /* the event stream's, dropped when it is freed */
    pthread_mutex_unlock(&srv.lock);
    return reply_stream(r, t);
}

enum MHD_Result task_refuse(request_t *r, task_t *t, json_t *b, int status, const char *err)
{
    pthread_mutex_lock(&srv.lock);
    task_unbind(t);
    t->refs = 1;
    task_release(t);   /* and its model */
    pthread_mutex_unlock(&srv.lock);
    json_decref(b);
    return reply_error(r, status, "%s", err);
}

/* ------------------------------------------------------------ /v1/generate, /v1/completions */

static enum MHD_Result generate_common(request_t *r, api_kind api)
{
    json_t *b = body_json(r);
    if (!b) return MHD_YES;
    task_t *t = task_new(TASK_GENERATE, api);
    if (!t) { json_decref(b); return reply_error(r, 503, "out of memory"); }
    char err[512];
    const char *model, *session, *prompt = NULL;
    int status;
    if (field_str(b, "model", &model, err) || field_str(b, "session", &session, err) ||
        field_bool(b, "stream", 0, &t->stream, err) ||
        task_sampling(b, t, "max_tokens", api == API_OPENAI ? 16 : 64, err))
        return task_refuse(r, t, b, 400, err);
    json_t *jp = json_object_get(b, "prompt");
    if (json_is_array(jp) && api == API_OPENAI) {
        if (json_array_size(jp) != 1 || !json_is_string(json_array_get(jp, 0)))
            return task_refuse(r, t, b, 400, "prompt must be a string (or an array of one string)");
        jp = json_array_get(jp, 0);
    }
    if (jp && !json_is_null(jp) && !json_is_string(jp)) return task_refuse(r, t, b, 400, "prompt must be a string");
    prompt = jp ? json_string_value(jp) : NULL;
    if (!prompt) prompt = "";
    if (api == API_OPENAI) {
        long long lp, n;
        json_t *jl = json_object_get(b, "logprobs");
        if (json_is_boolean(jl)) return task_refuse(r, t, b, 400, "logprobs must be an integer in [0, 5] or null");
        if (field_int(b, "logprobs", 0, GEN_MAX_TOP, -1, &lp, err) || field_bool(b, "echo", 0, &t->echo, err) ||
            field_int(b, "n", 1, 1, 1, &n, err))
            return task_refuse(r, t, b, 400, err);
        t->top_n = (int)lp;   /* -1: no logprobs object */
        snprintf(t->cmpl_id, sizeof t->cmpl_id, "cmpl-%016llx", (unsigned long long)t->gp.seed ^ (unsigned long long)(now_s() * 1e6));
    }
    if ((status = task_bind(t, model, session, err)) || (status = task_generate_begin(t, prompt, session != NULL, err)))
        return task_refuse(r, t, b, status, err);
    return task_submit(r, t, b);
}

enum MHD_Result route_generate(request_t *r) { return generate_common(r, API_NATIVE); }
enum MHD_Result route_completions(request_t *r) { return generate_common(r, API_OPENAI); }

/* ------------------------------------------------------------ /v1/score */

enum MHD_Result route_score(request_t *r)
{
    json_t *b = body_json(r);
    if (!b) return MHD_YES;
    task_t *t = task_new(TASK_SCORE, API_NATIVE);
    if (!t) { json_decref(b); return reply_error(r, 503, "out of memory"); }
    char err[512];
    const char *model, *session, *text;
    int status;
    long long stride;
    if (field_str(b, "model", &model, err) || field_str(b, "session", &session, err) ||
        field_str(b, "text", &text, err) || field_bool(b, "per_token", 0, &t->per_token, err) ||
        field_int(b, "stride", 1, MODEL_MAX_SPAN, 0, &stride, err))
        return task_refuse(r, t, b, 400, err);
    if (!text) return task_refuse(r, t, b, 400, "text is required");
    if ((status = task_bind(t, model, session, err))) return task_refuse(r, t, b, status, err);
    /* a window model scored without a session: windows of its context, each alone or sliding by stride */
    const int C = t->sm->m->window;
    if (stride && !C)
        return task_refuse(r, t, b, 400, "stride applies to models with a fixed context window (nanogpt, "
                           "gpt-adaptive-span); a model of this family carries its memory from block to block");
    if (stride && t->sess)
        return task_refuse(r, t, b, 400, "stride applies to scoring without a session: a session predicts each "
                           "token from the window of the last tokens it has seen");
    if (stride > C) {
        snprintf(err, sizeof err, "stride %lld is over the model's window of %d tokens", stride, C);
        return task_refuse(r, t, b, 400, err);
    }
    if (C && !t->sess) mem_windows(t->mem, stride ? C - (int)stride : 0);
    if ((status = encode(t, text, 0, 0, err))) return task_refuse(r, t, b, status, err);
    if (t->n == 0 || (t->n == 1 && t->mem->pending < 0))
        return task_refuse(r, t, b, 400, "the text has nothing to predict: it needs 2 characters (or 1 in a session that has seen text)");
    if (t->per_token && !(t->lps = malloc(t->n * sizeof *t->lps))) return task_refuse(r, t, b, 503, "out of memory");
    return task_submit(r, t, b);
}

/* ------------------------------------------------------------ answers */

static json_t *timings(const task_t *t, int n_tokens)
{
    double total = t->t_end - t->t_enqueue, decode = t->t_end - (t->t_prefill > 0 ? t->t_prefill : t->t_end);
    return json_pack("{s:f, s:f, s:f, s:f, s:f}", "queue_ms", (t->t_start - t->t_enqueue) * 1e3, "prefill_ms",
                     ((t->t_prefill > 0 ? t->t_prefill : t->t_end) - t->t_start) * 1e3, "decode_ms", decode * 1e3,
                     "total_ms", total * 1e3, "tokens_per_second", decode > 0 ? n_tokens / decode : 0.0);
}

json_t *task_usage(const task_t *t)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", (int)t->n, "completion_tokens", t->res.n_tokens,
                     "total_tokens", (int)t->n + t->res.n_tokens);
}

const char *task_finish(const task_t *t)
{
    return t->res.finish == FINISH_STOP ? "stop" : "length";
}

static json_t *generate_json(const task_t *t)
{
    json_t *toks = json_array();   /* the tokens of the text: a stop string's are left out with it */
    for (int i = 0; i < t->res.n_text_tokens; i++) json_array_append_new(toks, json_integer(t->res.tokens[i]));
    json_t *j = json_pack("{s:s, s:s%, s:o, s:s, s:I}", "model", t->sm->name, "text", t->res.text ? t->res.text : "",
                          t->res.text_len, "tokens", toks, "finish_reason", task_finish(t), "seed", (json_int_t)t->gp.seed);
    if (t->sess) json_object_set_new(j, "session", json_string(t->sess_id));
    json_object_set_new(j, "usage", task_usage(t));
    json_object_set_new(j, "timings", timings(t, t->res.n_tokens));
    return j;
}

/* The echoed prompt's tokens of an answer (they come first). */
static size_t echoed(const task_t *t)
{
    return t->echo ? t->n : 0;
}

void task_token(const task_t *t, size_t i, int32_t *id, float *lp, const int32_t **top, const float **top_lp)
{
    const gen_state *g = &t->g;
    size_t k = (size_t)g->top_n, e = echoed(t);
    if (i < e) {
        *id = t->toks[i];
        *lp = g->prompt_lp[i];
        *top = g->prompt_top + i * k;
        *top_lp = g->prompt_top_lp + i * k;
    } else {
        i -= e;
        *id = g->res.tokens[i];
        *lp = g->res.logprobs[i];
        *top = g->top + i * k;
        *top_lp = g->top_lp + i * k;
    }
}

/* The id of the answer's token before token I, or -1 at the start of the stream. */
static int32_t answer_prev(const task_t *t, size_t i)
{
    if (i == 0) return echoed(t) ? (t->g.has_pending_in ? t->g.in[0] : -1) : t->g.prev0;
    int32_t id;
    float lp;
    const int32_t *top;
    const float *top_lp;
    task_token(t, i - 1, &id, &lp, &top, &top_lp);
    return id;
}

size_t task_token_text(const task_t *t, size_t i, int32_t id, char *buf)
{
    return vocab_piece(&t->sm->m->vocab, answer_prev(t, i), id, buf);
}

/* Where the answer's token I ends in its text, given where it starts (AT):
 * an echoed token ends where the next begins in the prompt as received. */
static size_t token_end(const task_t *t, size_t i, size_t at, size_t len)
{
    const size_t e = echoed(t);
    if (i >= e) return at + len;
    return i + 1 < e ? t->offs[i + 1] : t->text_len;
}

size_t task_stream_tokens(task_t *t, size_t *from)
{
    size_t total = echoed(t) + (size_t)t->g.res.n_text_tokens;
    char *buf = malloc(vocab_max_piece(&t->sm->m->vocab) + 1);
    *from = t->lp_sent;
    while (buf && t->lp_sent < total) {
        int32_t id;
        float lp;
        const int32_t *top;
        const float *top_lp;
        task_token(t, t->lp_sent, &id, &lp, &top, &top_lp);
        size_t end = token_end(t, t->lp_sent, t->lp_off, task_token_text(t, t->lp_sent, id, buf));
        if (end > t->sent_bytes) break;   /* held back with its text */
        t->lp_off = end;
        t->lp_sent++;
    }
    free(buf);
    return t->lp_sent;
}

/* OpenAI's legacy logprobs object over the tokens [FROM, TO) of the answer,
 * the first at byte OFF of its text (an echoed prompt's tokens at their
 * offsets in the prompt as received). */
static json_t *completion_logprobs(const task_t *t, size_t from, size_t to, size_t off)
{
    const vocab_t *v = &t->sm->m->vocab;
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    char *buf = malloc(vocab_max_piece(v) + 1);
    for (size_t i = from; buf && i < to; i++) {
        int32_t id;
        float lp;
        const int32_t *ti;
        const float *tl;
        task_token(t, i, &id, &lp, &ti, &tl);
        size_t len = task_token_text(t, i, id, buf), at = i < echoed(t) ? t->offs[i] : off;
        json_array_append_new(toks, json_stringn(buf, len));
        json_array_append_new(offs, json_integer((json_int_t)at));
        off = token_end(t, i, at, len);
        if (isnan(lp)) {
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, json_real(lp));
        json_t *o = json_object();
        for (int k = 0; k < t->g.top_n; k++) {
            task_token_text(t, i, ti[k], buf);
            json_object_set_new(o, buf, json_real(tl[k]));
        }
        json_array_append_new(tops, o);
    }
    free(buf);
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset", offs);
}

/* The echoed prompt: as received, or (tokens made otherwise) their text. */
static void put_prompt(const task_t *t, FILE *f)
{
    if (t->text) {
        fwrite(t->text, 1, t->text_len, f);
        return;
    }
    char *buf = malloc(vocab_max_piece(&t->sm->m->vocab) + 1);
    for (size_t i = 0; buf && i < t->n; i++) fwrite(buf, 1, task_token_text(t, i, t->toks[i], buf), f);
    free(buf);
}

static json_t *completion_json(const task_t *t)
{
    char *text = NULL;
    size_t len = 0;
    /* echo: the prompt comes first */
    FILE *f = open_memstream(&text, &len);
    if (t->echo && f) put_prompt(t, f);
    if (t->res.text) fwrite(t->res.text, 1, t->res.text_len, f);
    fclose(f);
    json_t *choice = json_pack("{s:i, s:s%, s:s}", "index", 0, "text", text ? text : "", len, "finish_reason", task_finish(t));
    free(text);
    json_object_set_new(choice, "logprobs", t->top_n >= 0 ? completion_logprobs(t, 0, echoed(t) + (size_t)t->res.n_text_tokens, 0)
                                                          : json_null());
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", t->cmpl_id, "object", "text_completion", "created",
                          (json_int_t)t->created, "model", t->sm->name, "choices", choice);
    json_object_set_new(j, "usage", task_usage(t));
    return j;
}

/* A chunk of a completions stream: the text TEXT (just counted in
 * t->sent_bytes) with the logprobs of exactly its tokens (generation holds
 * back text that may begin a stop string, and its tokens' logprobs with
 * it), and FINISH on the last. */
static json_t *completion_chunk(task_t *t, const char *text, size_t len, const char *finish)
{
    json_t *lp = json_null();
    if (t->top_n >= 0) {
        size_t off = t->lp_off, from, to = task_stream_tokens(t, &from);
        lp = completion_logprobs(t, from, to, off);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:[{s:s%, s:i, s:o, s:s?}]}", "id", t->cmpl_id, "object", "text_completion",
                     "created", (json_int_t)t->created, "model", t->sm->name, "choices", "text", text, len, "index", 0,
                     "logprobs", lp, "finish_reason", finish);
}

/* The echoed prompt, the first piece of a completions stream: sent once the
 * prompt is read, when its logprobs are known. */
static void stream_echo(task_t *t)
{
    t->echo_sent = 1;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f) put_prompt(t, f);
    if (f) fclose(f);
    if (text && len) {
        t->sent_bytes += len;
        task_event(t, NULL, completion_chunk(t, text, len, NULL));
    }
    free(text);
}

static json_t *score_json(const task_t *t)
{
    double nll = t->sc.tokens ? t->sc.nll_sum / (double)t->sc.tokens : 0;
    json_t *j = json_pack("{s:s, s:I, s:f, s:f}", "model", t->sm->name, "tokens", (json_int_t)t->sc.tokens, "nll",
                          nll, "ppl", exp(nll));
    if (t->sm->m->vocab.kind->per_character)   /* bits per character only where a token is one */
        json_object_set_new(j, "bpc", json_real(nll / log(2.0)));
    if (t->sess) json_object_set_new(j, "session", json_string(t->sess_id));
    else if (t->sm->m->window)   /* how a window model's text was cut */
        json_object_set_new(j, "windows", json_pack("{s:i, s:i}", "window", t->sm->m->window, "stride",
                                                    mem_block(t->mem)));
    if (t->lps) {
        json_t *a = json_array();
        for (long i = 0; i < t->sc.tokens; i++) json_array_append_new(a, json_real(t->lps[i]));
        json_object_set_new(j, "token_logprobs", a);
    }
    return j;
}

enum MHD_Result route_task_done(request_t *r)
{
    task_t *t = r->task;
    pthread_mutex_lock(&srv.lock);
    json_t *j = NULL;
    int status = t->status;
    char err[512];
    snprintf(err, sizeof err, "%s", t->err);
    if (!status) {
        if (t->kind == TASK_SCORE) j = score_json(t);
        else if (t->api == API_NATIVE) j = generate_json(t);
        else if (t->api == API_CHAT) j = chat_json(t);
        else j = completion_json(t);
    }
    /* The answer is built: the model may go before the client reads it (a
     * DELETE /v1/models sent on receipt must not find it still held). */
    task_unhold(t);
    pthread_mutex_unlock(&srv.lock);
    if (status) return reply_error(r, status, "%s", err);
    return reply_json(r, 200, j);
}

void route_stream_piece(task_t *t, const char *piece, size_t len)
{
    if (t->api == API_OPENAI && t->echo && !t->echo_sent) stream_echo(t);
    if (!len) return;
    t->sent_bytes += len;
    task_event(t, NULL, t->api == API_CHAT ? chat_chunk(t, piece, len) : completion_chunk(t, piece, len, NULL));
}

void route_stream_final(task_t *t)
{
    if (t->api == API_NATIVE) {
        task_event(t, t->status ? "error" : "done", t->status ? json_pack("{s:{s:i, s:s, s:s}}", "error", "code", t->status,
                                                                          "type", error_type(t->status), "message", t->err)
                                                              : generate_json(t));
        return;
    }
    if (t->status) {
        task_event(t, NULL, json_pack("{s:{s:i, s:s, s:s}}", "error", "code", t->status, "type", error_type(t->status),
                                      "message", t->err));
    } else {
        const char *piece;   /* whatever text is left: all of it is settled now */
        size_t len;
        gen_take_text(&t->g, &piece, &len);
        route_stream_piece(t, piece, len);
        if (t->api == API_CHAT) {
            chat_stream_final(t);
        } else {
            json_t *j = completion_chunk(t, "", 0, task_finish(t));
            json_object_set_new(j, "usage", task_usage(t));
            task_event(t, NULL, j);
        }
    }
    task_sse_append(t, "data: [DONE]\n\n", 14);
}
