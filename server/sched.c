/*
 * sched.c - the scheduler: one thread that owns every model computation.
 *
 * Each turn it
 *   1. takes the newly queued tasks and drops cancelled ones (a client that
 *      disconnected, checked on its socket; a request past its timeout);
 *   2. runs one decode step for every generating task, batched per model:
 *      each task samples its next token, then one forward feeds all of them
 *      (continuous batching: tasks join and leave between steps);
 *   3. feeds one block of the tasks still reading a prompt or scoring a
 *      text, many sessions in one forward (reader_batch says which), so long
 *      inputs never stall decoding and many of them fill the device;
 *   4. finishes what is done: results for the waiting connections, events
 *      for the streaming ones, sessions released.
 */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Streams in one forward, for the decode step and for the readers' block
 * alike; server/device.c plans the device's buffers for as many
 * (DEVICE_MAX_BATCH) of block_len tokens, and a block of readers holds at
 * most as many rows: SCHED_MAX_BATCH x block_len (longer scoring blocks,
 * model_score_block, go fewer at a time). */
#define SCHED_MAX_BATCH 256

static fwd_ws *ws;

int sched_busy(void)
{
    return srv.queue != NULL || srv.active != NULL || srv.committing > 0;
}

int sched_submit(task_t *t, char *err, int *status)
{
    if (srv.draining) {
        snprintf(err, 512, "the server is shutting down");
        *status = 503;
        return -1;
    }
    if (srv.queued + srv.running >= srv.cfg.max_queue) {
        snprintf(err, 512, "too many requests in flight (%d, --max-queue); retry shortly", srv.queued + srv.running);
        *status = 429;
        return -1;
    }
    t->t_enqueue = now_s();
    t->refs++;   /* the scheduler's reference */
    task_t **p = &srv.queue;
    while (*p) p = &(*p)->next;
    *p = t;
    t->next = NULL;
    srv.queued++;
    pthread_cond_signal(&srv.wake);
    return 0;
}

void task_unhold(task_t *t)
{
    if (!t->holds_model) return;
    if (!t->sess) {   /* its own memory: freed by the model's backend, so before the model can go */
        mem_free(t->mem);
        t->mem = NULL;
    }
    t->holds_model = 0;
    t->sm->tasks--;
}

void task_release(task_t *t)
{
    if (--t->refs > 0) return;
    task_unhold(t);
    if (t->kind == TASK_GENERATE && t->g.m) {   /* t->res is a view of the state's result */
        gen_result r;
        gen_end(&t->g, &r);
        gen_result_free(&r);
    }
    for (int i = 0; i < TASK_MAX_STOP; i++) free(t->stop_buf[i]);
    if (!t->sess) mem_free(t->mem);
    free(t->toks);
    free(t->text);
    free(t->offs);
    free(t->lps);
    free(t->sse);
    free(t);
}

/* ------------------------------------------------------------ events */

void task_sse_append(task_t *t, const char *s, size_t n)
{
    if (t->sse_len + n + 1 > t->sse_cap) {
        size_t cap = (t->sse_len + n + 1) * 2;
        char *b = realloc(t->sse, cap);
        if (!b) return;   /* out of memory: the event is lost, the stream goes on */
        t->sse = b;
        t->sse_cap = cap;
    }
    memcpy(t->sse + t->sse_len, s, n);
    t->sse_len += n;
}

/* An SSE event (srv.lock held): "event: NAME\ndata: JSON\n\n" or, for the
 * OpenAI API, "data: JSON\n\n". */
void task_event(task_t *t, const char *name, json_t *data)
{
    char *s = json_dumps(data, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(data);
    if (!s) return;
    if (name) {
        task_sse_append(t, "event: ", 7);
        task_sse_append(t, name, strlen(name));
        task_sse_append(t, "\n", 1);
    }
    task_sse_append(t, "data: ", 6);
    task_sse_append(t, s, strlen(s));
    task_sse_append(t, "\n\n", 2);
    free(s);
}

static void wake_reader(task_t *t)
{
    if (t->reader_waiting) {
        t->reader_waiting = 0;
        MHD_resume_connection(t->conn);
    }
}

/* The events of one decode step (srv.lock held). */
static void emit_token(task_t *t, const char *piece, size_t len)
{
    const gen_result *r = &t->g.res;
    int i = r->n_tokens - 1;
    if (t->api == API_NATIVE)
        task_event(t, "token", json_pack("{s:i, s:i, s:s%, s:f}", "index", i, "token", r->tokens[i], "text", piece, len,
                                         "logprob", (double)r->logprobs[i]));
    else
        route_stream_piece(t, piece, len);   /* the OpenAI APIs' chunks: their shapes are the routes' */
    wake_reader(t);
}

/* ------------------------------------------------------------ finishing */

/* Seconds between two looks at a task's socket: a look is a system call
 * (recv with MSG_PEEK), and at every decode step it cost each stream about 1.5
 * us of the step's time on a 2-core machine; a client that leaves is noticed
 * at most this much later. */
#define GONE_CHECK_S 0.01

static int client_gone(const task_t *t)
{
    char c;
    if (t->fd < 0) return 0;
    ssize_t k = recv(t->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Hands T's result to the connection and releases its session (srv.lock
 * held): the end of finish, once the session's state is written. */
static void complete(void *ctx)
{
    task_t *t = ctx;
    if (t->sess) sess_release(t->sess);
    t->done = 1;
    if (t->t_first > 0) metrics_ttft(t->t_first - t->t_enqueue);
    metrics_tokens(t->kind == TASK_GENERATE ? t->res.n_tokens : 0, t->kind == TASK_SCORE ? t->sc.tokens : 0);
    if (t->stream) {
        route_stream_final(t);   /* the last event: its shape is the route's */
        task_unhold(t);          /* the rest of the stream is text: the model may go */
        wake_reader(t);
    } else {
        MHD_resume_connection(t->conn);   /* the route answers from the task */
    }
    task_release(t);
}

/* Takes T off the active list and ends it (srv.lock held). A session a task
 * changed is written to the state directory before the answer goes out
 * (sess_commit); one whose request failed or was cancelled goes back to what
 * it was before the request. */
static void finish(task_t *t)
{
    task_t **p = &srv.active;
    while (*p && *p != t) p = &(*p)->next;
    if (*p) {
        *p = t->next;
        srv.running--;
    }
    t->t_end = now_s();
    if (t->kind == TASK_GENERATE) {
        /* a view: the state keeps its buffers (the echo and top logprobs) until release */
        t->res = t->g.res;
        if (t->cancelled) t->res.finish = FINISH_CANCELLED;
    }
    if (t->sess && (t->status || t->cancelled)) sess_rollback(t->sess);
    else if (t->sess && sess_commit(t->sess, complete, t) == 0) return;
    complete(t);
}

static void fail(task_t *t, int status, const char *msg)
{
    t->status = status;
    snprintf(t->err, sizeof t->err, "%s", msg);
    finish(t);
}

/* ------------------------------------------------------------ work */

/* Streams of one forward: SCHED_MAX_BATCH, fewer where a stream's step
 * costs so much (FLOPS) that the batch would pass --max-step-gflop; at least
 * one. What bounds the time any other model's request waits for a turn. */
static int batch_cap(double flops)
{
    double n = flops > 0 ? srv.cfg.max_step_flops / flops : SCHED_MAX_BATCH;
    return n < 1 ? 1 : n > SCHED_MAX_BATCH ? SCHED_MAX_BATCH : (int)n;
}

/* Streams of a readers' block of M inputs of model SM: batch_cap of that
 * block's cost (a scoring block of one stream costs at most
 * MODEL_SCORE_BLOCK_GFLOP, the default budget; under a lower
 * --max-step-gflop one runs alone), and no more rows than the device plans
 * for. */
static int reader_cap(const smodel_t *sm, size_t M)
{
    const int by_cost = batch_cap(model_cost_tokens(&sm->cost, M));
    const size_t rows = (size_t)SCHED_MAX_BATCH * (size_t)sm->m->block_len, by_rows = M ? rows / M : SCHED_MAX_BATCH;
    const int cap = by_rows < (size_t)by_cost ? (int)by_rows : by_cost;
    return cap < 1 ? 1 : cap;
}

/* Inputs a task has still to feed before it is done reading: a score task's
 * tokens, less the one a stream without a pending token starts from (it is
 * fed, not predicted); a generation's prompt (gen_prefill_left). */
static size_t inputs_left(const task_t *t)
{
    if (t->kind == TASK_GENERATE) return gen_prefill_left(&t->g);
    size_t left = t->n - t->scored_upto;
    return left && t->mem->pending < 0 ? left - 1 : left;
}

/* The inputs T feeds a forward at most: its stream's block (mem_block: the
 * model's scoring block; a window model scored in windows feeds one window,
 * or a stride, at a time); a generation's next prefill block
 * (gen_prefill_block). */
static size_t task_block(const task_t *t)
{
    return t->kind == TASK_GENERATE ? gen_prefill_block(&t->g) : (size_t)mem_block(t->mem);
}

static int is_decoding(const task_t *t)
{
    return t->kind == TASK_GENERATE && t->prefill_done && !t->done;
}

static int is_reading(const task_t *t)
{
    return !t->done && !is_decoding(t);
}

/* The tasks whose next block goes through one forward (srv.lock held),
 * oldest first: the first reading task of the active list (the one that has
 * waited longest for its turn) feeds the block it would feed alone, M =
 * min(its block, its inputs left) inputs (task_block); every later reading
 * task of the same model whose own next block is M long joins, up to
 * reader_cap (the block's cost under --max-step-gflop, the device's rows).
 * So each text is cut where it would be cut alone, into blocks of the
 * model's scoring block from its start (model_score_block: block_len, or
 * for adaptive-span, whose math does not depend on the cut, up to 8 of them,
 * 4096 tokens and 200 GFLOP): a PAR segment's context depends on where it starts, and
 * even where the math does not, a block of another length rounds otherwise.
 * The length is the model's alone, never the load's. With the forward's
 * products per stream (ops_linear), each request gets the bits it gets
 * alone, whatever else is read beside it; full blocks, most of any long
 * text, still go through together.
 * Sessions are exclusive to one task (sess_acquire), so the memories are
 * distinct; a task with nothing to feed (M = 0) goes alone. Returns B. */
static int reader_batch(task_t **batch, size_t *M)
{
    task_t *head = srv.active;
    while (head && !is_reading(head)) head = head->next;
    if (!head) return 0;
    const size_t L = task_block(head), left = inputs_left(head);
    *M = left < L ? left : L;
    const int max_b = reader_cap(head->sm, *M);
    batch[0] = head;
    int B = 1;
    for (task_t *t = head->next; t && *M > 0 && B < max_b; t = t->next) {
        if (t->sm != head->sm || !is_reading(t)) continue;
        size_t l = inputs_left(t), Lt = task_block(t);
        if ((l < Lt ? l : Lt) == *M) batch[B++] = t;
    }
    return B;
}

/* One block of M inputs for each task of BATCH in one forward (outside the
 * lock): a score task feeds M inputs of its text (one token more, to start
 * from, when its stream has no pending token), a generation M inputs of its
 * prompt. */
static int feed_readers(task_t **batch, int B, size_t M, char *err)
{
    const model_t *m = batch[0]->sm->m;
    score_job jobs[SCHED_MAX_BATCH];
    gen_state *gens[SCHED_MAX_BATCH];
    task_t *scoring[SCHED_MAX_BATCH];
    int ns = 0, ng = 0;
    for (int i = 0; i < B; i++) {
        task_t *t = batch[i];
        if (t->kind == TASK_GENERATE) {
            gens[ng++] = &t->g;
            continue;
        }
        size_t left = t->n - t->scored_upto, k = M + (t->mem->pending < 0);
        if (k > left) k = left;
        scoring[ns] = t;
        jobs[ns++] = (score_job){t->mem, t->toks + t->scored_upto, k, &t->sc, t->lps ? t->lps + t->sc.tokens : NULL};
    }
    if (infer_feed_many(m, jobs, ns, gens, ng, M, ws, err)) return -1;
    for (int i = 0; i < ns; i++) scoring[i]->scored_upto += jobs[i].n;
    for (int i = 0; i < B; i++) {
        task_t *t = batch[i];
        if (t->kind == TASK_GENERATE && gen_prefill_left(&t->g) == 0) {
            t->prefill_done = 1;
            t->t_prefill = now_s();
        }
    }
    return 0;
}

/* The events of a decode step's tokens: sent while the device computes the
 * next step (model_forward_pick_while), or after it. */
typedef struct {
    task_t **tasks;
    const char **pieces;
    size_t *lens;
    int n;
    int sent;
} step_events;

static void send_events(step_events *e)
{
    for (int i = 0; i < e->n; i++) {
        task_t *t = e->tasks[i];
        if (t->g.res.n_tokens == 1) t->t_first = now_s();
        if (t->stream && t->g.res.n_tokens > 0) emit_token(t, e->pieces[i], e->lens[i]);
    }
    e->sent = 1;
}

/* While the step computes: the events. On a device, only if srv.lock is
 * free now: the step holds the device's lock, and a thread holding srv.lock
 * may be waiting for it (a session attached or freed), so waiting here could
 * deadlock; a busy lock leaves the events for after the step. */
static void send_events_meanwhile(void *ctx, int may_block)
{
    step_events *e = ctx;
    if (may_block) pthread_mutex_lock(&srv.lock);
    else if (pthread_mutex_trylock(&srv.lock) != 0) return;
    send_events(e);
    pthread_mutex_unlock(&srv.lock);
}

/* One decode step for every generating task of model SM (outside the lock,
 * except for the events): each task takes the token its last step picked,
 * then one forward feeds those that go on and picks their next. The tokens'
 * events go out while that forward computes. */
static void decode_batch(task_t **batch, int B)
{
    const model_t *m = batch[0]->sm->m;
    mem_t *mems[SCHED_MAX_BATCH];
    int32_t toks[SCHED_MAX_BATCH];
    int n = 0;
    task_t *feed[SCHED_MAX_BATCH], *said[SCHED_MAX_BATCH];
    const char *pieces[SCHED_MAX_BATCH];
    size_t lens[SCHED_MAX_BATCH];
    step_events ev = {said, pieces, lens, 0, 0};
    for (int i = 0; i < B; i++) {
        task_t *t = batch[i];
        int more = gen_sample(&t->g);
        if (more < 0) {
            pthread_mutex_lock(&srv.lock);
            fail(t, 500, "the model gave a log-probability that is not finite: its weights or this session's memory "
                         "overflow (reset or delete the session)");
            pthread_mutex_unlock(&srv.lock);
            continue;
        }
        /* the text stays where it is until the task's next gen_accept, after the events */
        gen_take_text(&t->g, &pieces[ev.n], &lens[ev.n]);
        said[ev.n++] = t;
        if (more) {
            feed[n] = t;
            mems[n] = t->mem;
            toks[n++] = t->g.next;
        }
    }
    int rc = 0;
    char err[ERR_LEN];
    pick_req q[SCHED_MAX_BATCH];
    pick_out o[SCHED_MAX_BATCH];
    if (n) {
        /* the next tokens are picked where the logprobs are (on a GPU, the device) */
        for (int i = 0; i < n; i++) gen_pick_req(&feed[i]->g, i, &q[i]);
        rc = model_forward_pick_while(m, mems, n, toks, 1, NULL, NULL, n, q, o, send_events_meanwhile, &ev, ws, err);
    }
    pthread_mutex_lock(&srv.lock);
    if (!ev.sent) send_events(&ev);
    for (int i = 0; rc && i < n; i++) fail(feed[i], 500, err);
    pthread_mutex_unlock(&srv.lock);
    for (int i = 0; !rc && i < n; i++) gen_accept(&feed[i]->g, &o[i]);
}

static int finished_generating(const task_t *t)
{
    const gen_result *r = &t->g.res;
    return r->finish != FINISH_LENGTH || r->n_tokens >= t->g.p.max_tokens;
}

static void *sched_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&srv.lock);
    while (!srv.stopping || srv.active || srv.queue) {
        /* 1. take new tasks; drop the cancelled and the late */
        /* to the end of the active list: tasks take turns oldest first */
        task_t **tail = &srv.active;
        while (*tail) tail = &(*tail)->next;
        while (srv.queue) {
            task_t *t = srv.queue;
            srv.queue = t->next;
            srv.queued--;
            srv.running++;
            t->next = NULL;
            *tail = t;
            tail = &t->next;
            t->started = 1;
            t->t_start = now_s();
        }
        double now = now_s();
        for (task_t *t = srv.active, *nx; t; t = nx) {
            nx = t->next;
            if (!t->cancelled && now - t->t_gone_check >= GONE_CHECK_S) {
                t->t_gone_check = now;
                if (client_gone(t)) t->cancelled = 1;
            }
            if (t->cancelled) fail(t, 499, "the client went away");
            else if (srv.cfg.request_timeout > 0 && now - t->t_enqueue > srv.cfg.request_timeout)
                fail(t, 503, "the request ran past --request-timeout");
            else if (srv.stopping) fail(t, 503, "the server is shutting down");
        }
        if (!srv.active) {
            if (srv.stopping) break;
            pthread_cond_wait(&srv.wake, &srv.lock);
            continue;
        }
        /* 2. one decode step for all generating tasks, per model */
        task_t *batch[SCHED_MAX_BATCH];
        for (smodel_t *sm = srv.models; sm; sm = sm->next) {
            int B = 0, max_b = batch_cap(sm->cost.token_flops);
            for (task_t *t = srv.active; t && B < max_b; t = t->next)
                if (t->sm == sm && is_decoding(t)) batch[B++] = t;
            if (!B) continue;
            /* held through the step: a task it fails frees the model for
             * DELETE /v1/models before this loop goes on to sm->next */
            sm->tasks++;
            pthread_mutex_unlock(&srv.lock);
            decode_batch(batch, B);
            pthread_mutex_lock(&srv.lock);
            sm->tasks--;
        }
        for (task_t *t = srv.active, *nx; t; t = nx) {
            nx = t->next;
            if (is_decoding(t) && finished_generating(t)) finish(t);
        }
        /* 3. one block of the tasks still reading their input, in one
         * forward; those not done then go to the end of the list, so
         * readers take turns */
        size_t M;
        int B = reader_batch(batch, &M);
        if (B) {
            char err[ERR_LEN];
            pthread_mutex_unlock(&srv.lock);
            int rc = feed_readers(batch, B, M, err);
            pthread_mutex_lock(&srv.lock);
            for (int i = 0; i < B; i++) {
                task_t *t = batch[i];
                if (rc) fail(t, 500, err);
                else if (t->kind == TASK_SCORE && t->scored_upto == t->n) finish(t);
                else if (t->kind == TASK_GENERATE && t->prefill_done && t->g.p.max_tokens == 0) finish(t);
                else {
                    task_t **p = &srv.active;
                    while (*p != t) p = &(*p)->next;
                    *p = t->next;
                    while (*p) p = &(*p)->next;
                    *p = t;
                    t->next = NULL;
                }
            }
        }
    }
    pthread_mutex_unlock(&srv.lock);
    return NULL;
}

int sched_start(void)
{
    ws = ws_new();
    if (!ws) return -1;
    return pthread_create(&srv.sched_thread, NULL, sched_main, NULL);
}

void sched_stop(void)
{
    pthread_mutex_lock(&srv.lock);
    srv.stopping = 1;
    pthread_cond_signal(&srv.wake);
    pthread_mutex_unlock(&srv.lock);
    pthread_join(srv.sched_thread, NULL);
    ws_free(ws);
    ws = NULL;
}
