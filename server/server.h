/*
 * server.h - the HTTP service's shared state: configuration, served models,
 * sessions, the scheduler's tasks, metrics, and the HTTP helpers the route
 * files use.
 *
 * Threads: libmicrohttpd's polling thread parses requests and runs the route
 * handlers, which validate, build a task, queue it and suspend the
 * connection; one scheduler thread (sched.c) owns every model computation
 * and resumes connections with results. One mutex (srv.lock) guards models,
 * sessions and tasks; model math runs outside it.
 */
#ifndef SPANSERVE_SERVER_H
#define SPANSERVE_SERVER_H

#include <curl/curl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>

#include "err.h"
#include "infer.h"
#include "model.h"
#include "report.h"

#define NAME_MAX_LEN 64

/* ------------------------------------------------------------ configuration */

typedef struct {
    const char *listen_addr;     /* --listen HOST:PORT (default 127.0.0.1:8080) */
    int port;
    const char *model_dir;       /* --model-dir: where POST /v1/models may load from, and downloads go */
    const char *state_dir;       /* --state-dir: session snapshots (default ./spanserve-state) */
    char **api_keys;             /* --api-key, --api-key-file */
    int n_api_keys;
    size_t session_memory;       /* --session-memory: bytes of live session memory before spilling */
    int max_queue;               /* --max-queue: tasks queued or running before 429 */
    size_t max_body;             /* --max-body: request body bytes (413) */
    int max_tokens;              /* --max-tokens: per request */
    int max_prompt;              /* --max-prompt: tokens per prompt or text (413) */
    double drain_timeout;        /* --drain-timeout: seconds to finish in-flight work on shutdown */
    double request_timeout;      /* --request-timeout: seconds a request may run */
    size_t max_download;         /* --max-download: bytes of a checkpoint fetched by URL */
    const char *ca_file;         /* --ca-file: PEM authorities for https downloads and webhooks (NULL: the system's) */
    char **fetch_allow;          /* --fetch-allow: hosts downloads and webhooks may reach at any address */
    int n_fetch_allow;
    mem_mode mem_mode;           /* --memory exact|span */
    int durability;              /* --durability: DURABLE_FSYNC, DURABLE_WRITE or DURABLE_OFF (sessions.c) */
    size_t max_session_bytes;    /* --max-session-bytes: a model whose session costs more is refused */
    double max_step_flops;       /* --max-step-gflop (x 1e9): one block of one stream may cost no more */
    int cuda;                    /* --device: models run on the CUDA core */
    int bf16;                    /* --precision bf16 (the default on the GPU), 0 for fp32 */
    int http_threads;            /* --http-threads */
    double header_timeout;       /* --header-timeout: seconds a request's headers may take to arrive */
    int max_connections;         /* --max-connections: open connections, each listener */
    int max_conn_per_client;     /* --max-connections-per-client: from one address (0: no bound) */
    /* training jobs (jobs.c), on a listener of their own */
    const char *jobs_listen;     /* --jobs-listen HOST:PORT (default: none, jobs off) */
    int jobs_port;
    char **admin_keys;           /* --admin-key, --admin-key-file, SPANSERVE_ADMIN_KEY: the jobs listener's keys */
    int n_admin_keys;
    const char *data_dir;        /* --data-dir: training texts (default STATE_DIR/data), made absolute */
    int max_jobs;                /* --max-jobs: training processes at once */
    size_t max_upload;           /* --max-upload: bytes of a training text uploaded or fetched */
    double cancel_grace;         /* --cancel-grace: seconds between SIGTERM and SIGKILL on cancel */
    double job_retention;        /* --job-retention: seconds a finished job is kept (0: until deleted) */
    double sse_keepalive;        /* --sse-keepalive: seconds between comments on a quiet job stream (0: none) */
} config_t;

/* ------------------------------------------------------------ models */

/* How /v1/chat/completions writes a conversation as a prompt for a model
 * (route_chat.c): each message is its speaker's name, speaker_end, its
 * content and turn_end; then the assistant's name and speaker_end; the
 * reply stops at turn_end. Set by POST /v1/models "chat_template", else
 * chat_template_default. Each string at most CHAT_FIELD_MAX bytes. */
#define CHAT_FIELD_MAX 64
typedef struct {
    char system[CHAT_FIELD_MAX + 1], user[CHAT_FIELD_MAX + 1], assistant[CHAT_FIELD_MAX + 1];   /* speaker names */
    char speaker_end[CHAT_FIELD_MAX + 1];
    char turn_end[CHAT_FIELD_MAX + 1];   /* never empty: it ends the reply */
} chat_template_t;

typedef struct smodel {
    char name[NAME_MAX_LEN + 1];
    char *path;
    model_t *m;
    model_cost cost;             /* what a session and a step of it cost (report.h) */
    chat_template_t chat;        /* its conversations' prompts (/v1/chat/completions) */
    time_t created;              /* when it was loaded (the OpenAI model object's "created") */
    int tasks;                   /* tasks holding it, from task_bind until their answer is built
                                  * (task_unhold; srv.lock): while any does, DELETE /v1/models
                                  * answers 409 */
    struct smodel *next;
} smodel_t;

/* ------------------------------------------------------------ sessions */

/* How sessions reach the state directory (--durability; sessions.c). */
enum { DURABLE_FSYNC, DURABLE_WRITE, DURABLE_OFF };

typedef struct session {
    char id[NAME_MAX_LEN + 1];
    smodel_t *model;
    mem_t *mem;                  /* NULL while spilled to disk */
    time_t created, last_used;
    int busy;                    /* a task (or a route) holds it */
    int dirty;                   /* the memory is newer than its copy in the state directory */
    void *mark;                  /* what a failed request rolls back to (sess_mark), NULL: the disk copy */
    size_t mark_len;
    uint64_t use_seq;            /* order of last use, for the LRU */
    struct session *next;
} session_t;

/* ------------------------------------------------------------ tasks */

typedef enum { TASK_SCORE, TASK_GENERATE } task_kind;
typedef enum { API_NATIVE, API_OPENAI, API_CHAT } api_kind;

/* Stop strings of a generation: the client's 16, and a chat template's turn end. */
#define TASK_MAX_STOP 17

typedef struct task {
    task_kind kind;
    api_kind api;
    smodel_t *sm;                /* held (sm->tasks) until the answer is built (task_unhold) */
    int holds_model;
    session_t *sess;             /* or NULL: mem is the task's own; released when the task is done */
    char sess_id[NAME_MAX_LEN + 1];   /* for the answer, which is built after the session is released */
    mem_t *mem;
    int32_t *toks;               /* text to score, or the prompt */
    size_t n;
    char *text;                  /* that text as received (NULL: tokens made otherwise, as chat's) */
    size_t text_len;
    size_t *offs;                /* byte offset of each token in text */
    /* score */
    int per_token;
    float *lps;
    size_t scored_upto;          /* tokens of toks handed to the scorer */
    score_t sc;
    /* generate */
    gen_params gp;
    char *stop_buf[TASK_MAX_STOP];
    int top_n, echo;             /* top_n -1: no logprobs object (OpenAI APIs) */
    gen_state g;
    int prefill_done;
    gen_result res;              /* when done: a view of g's result, valid until release */
    /* streaming: events appended by the scheduler, read by the connection */
    int stream;
    char *sse;
    size_t sse_len, sse_cap;
    int reader_waiting;          /* the connection is suspended waiting for events */
    int include_usage;           /* chat: a last chunk with the usage (stream_options) */
    int echo_sent;               /* completions: the echoed prompt's chunk went out */
    size_t sent_bytes;           /* OpenAI streams: bytes of text sent, the echoed prompt's included */
    size_t lp_sent, lp_off;      /* tokens whose logprobs were sent, and the bytes of their text */
    char cmpl_id[40];
    time_t created;
    /* state */
    struct MHD_Connection *conn;
    int fd;                      /* the client's socket, to notice a disconnect */
    double t_gone_check;         /* when the scheduler last looked at it (sched.c: GONE_CHECK_S) */
    int started, done, cancelled;
    int refs;                    /* the HTTP side and the scheduler */
    int status;                  /* on failure: an HTTP status, with err */
    char err[512];
    double t_enqueue, t_start, t_first, t_prefill, t_end;
    struct task *next;           /* queue / active list */
} task_t;

/* ------------------------------------------------------------ the server */

typedef struct {
    config_t cfg;
    pthread_mutex_t lock;
    pthread_cond_t wake;         /* the scheduler waits on it */
    smodel_t *models;
    session_t *sessions;
    task_t *queue, *active;      /* waiting, and started */
    int queued, running;
    int committing;              /* tasks done computing, waiting for their session to be written */
    int draining, stopping, ready;
    int downloads;               /* model downloads in flight (their connections are suspended) */
    struct MHD_Daemon *daemon;
    struct MHD_Daemon *jobs_daemon;   /* --jobs-listen */
    pthread_t sched_thread;
} server_t;

extern server_t srv;

double now_s(void);
void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int valid_name(const char *s);

/* models (serve.c); under srv.lock */
smodel_t *models_find(const char *name);
/* 0 when NAME may name a new model; else 400 (not a name) or 409 (taken). */
int models_name_free(const char *name, char *err, int *status);
/* Reads the checkpoint PATH for the model NAME (and puts it on the GPU
 * with --device cuda); errors name the file SHOWN, which is what the client
 * may see (a path relative to --model-dir), never where the file lies. */
/* SETTINGS: a JSON object's text of config keys over the file's (model_load_set), or NULL. */
model_t *models_load(const char *name, const char *path, const char *shown, const char *settings, char *err,
                     int *status);
void models_unload(model_t *m);   /* a model of models_load that is not served */
/* Serves M (taken; unloaded on failure) as NAME, a name models_name_free
 * let through under the same hold of srv.lock; PATH is its file. */
smodel_t *models_insert(const char *name, model_t *m, const char *path, char *err, int *status);
/* models_name_free, models_load, models_insert. */
smodel_t *models_add(const char *name, const char *path, const char *shown, const char *settings, char *err,
                     int *status);
int models_remove(const char *name, char *err, int *status);
json_t *models_json(const smodel_t *sm);
/* Removes from --model-dir the temporary files of downloads that a crash
 * cut short (route_models.c); the number removed. At start, before any. */
int models_dir_clean(void);

/* sessions (sessions.c); under srv.lock */
session_t *sess_find(const char *id);
/* 507 when the state directory cannot be written (a new session could not
 * be kept). */
session_t *sess_create(smodel_t *sm, const char *id, char *err, int *status);
int sess_acquire(session_t *s, char *err, int *status);   /* loads if spilled; marks busy */
/* A request on acquired S begins: what S must go back to if it does not
 * complete (a snapshot where the disk copy is not that). -1 when out of
 * memory. */
int sess_mark(session_t *s, char *err);
/* Back to the mark: the request failed or was cancelled. */
void sess_rollback(session_t *s);
/* A request on acquired S completed: S's memory goes to the state directory
 * (--durability). Returns 0 when the write was queued: DONE(CTX) is called
 * under srv.lock once it ended (the session still acquired); 1 when there is
 * nothing to wait for. */
int sess_commit(session_t *s, void (*done)(void *ctx), void *ctx);
/* Writes the serialised memory BUF of acquired S now (an import); -1 when
 * it stays unsaved (a failed write: sess_json says "saved": false). */
int sess_commit_bytes(session_t *s, const void *buf, size_t n);
void sess_release(session_t *s);
int sess_delete(const char *id, char *err, int *status);
void sess_delete_model(smodel_t *sm);
json_t *sess_json(const session_t *s);
json_t *sess_list_json(void);
/* Writes every session not yet on disk (shutdown); *SAVED and *FAILED count
 * the sessions whose state is (or is not) in the state directory after it. */
void sess_save_all(int *saved, int *failed);
int sess_load_all(smodel_t *only);   /* NULL: every loaded model */
size_t sess_live_bytes(void);
int sess_count(int on_disk);
int sess_count_unsaved(void);
/* The state writer thread (commits, and writes retried while they fail). */
int sess_writer_start(void);
void sess_writer_stop(void);
/* "" while session states can be written, else why not (srv.lock held). */
const char *sess_state_error(void);
void sess_metrics(FILE *f);

/* scheduler (sched.c) */
int sched_start(void);
void sched_stop(void);
/* Queues T (srv.lock held); 429 past --max-queue. */
int sched_submit(task_t *t, char *err, int *status);
void task_release(task_t *t);   /* srv.lock held */
/* Lets T's model go (srv.lock held): once its answer or last event is built,
 * so a client that reads it may unload the model at once; frees the task's
 * own memory first (the model's backend holds it). T->sm is not read after. */
void task_unhold(task_t *t);
/* Appends an SSE event to T's stream ("event: NAME" when NAME; steals DATA). */
void task_event(task_t *t, const char *name, json_t *data);
void task_sse_append(task_t *t, const char *s, size_t n);   /* raw bytes of the stream */
int sched_busy(void);           /* tasks queued or running (srv.lock held) */

/* metrics (metrics.c) */
void metrics_request(const char *route, int status, double seconds);
void metrics_ttft(double seconds);
void metrics_tokens(long generated, long scored);
char *metrics_render(void);

/* device (device.c): the CUDA core as a model's backend */
int device_cuda_usable(char *err);   /* 1 when a GPU can be used */
int device_attach(model_t *m, int bf16, char *err);
/* Whether the GPU backend runs M's family (0 with WHY: it stays on the CPU). */
int device_supports(const model_t *m, char *why);
void device_detach(model_t *m);
const char *device_name(const model_t *m);
const char *device_precision(const model_t *m);   /* "fp32" or "bf16" ("fp32" on the CPU) */
size_t device_session_bytes(const model_t *m);    /* device bytes of a session's memory; 0 on the CPU */

/* svg (svg.c) */
char *svg_spans(const model_t *m);
/* What a training job learned over its course, as the trainer's progress
 * lines carry it under KIND (the family's history_kind): "spans" (POINTS of
 * {step, spans: [{layer, mean, max}]}) or "arch_weights" ({step,
 * arch_weights: [[attn, ffn, skip]]}); another kind draws a frame that says
 * so. */
char *svg_training(const char *title, const char *kind, json_t *points);

/* fetch (fetch.c): the server's requests to URLs that clients name
 * (checkpoints, training texts, webhooks), under one destination policy. */
/* The kind of address SA (LEN bytes) is when a client may not have the
 * server connect to it: "loopback", "private", "link-local", "multicast",
 * ...; NULL for a public (globally routed unicast) address. IPv6 forms that
 * carry an IPv4 address (mapped, compatible, NAT64, 6to4) are judged by it. */
const char *fetch_addr_class(const struct sockaddr *sa, size_t len);
/* 1 when HOST (a name or an IP literal as a URL writes it, an IPv6 one with
 * or without brackets) is named by --fetch-allow, case aside. */
int fetch_host_allowed(const char *host);
/* Performs C's request of URL under the policy: the URL's host is named by
 * --fetch-allow, or every address curl connects to is public (else that
 * address is never connected to). Sets the URL, the policy, no proxy and
 * --ca-file on C. On failure writes ERR (CAP bytes) for the client: an HTTP
 * status of the host (with CURLOPT_FAILONERROR), "the server is shutting
 * down" (a progress callback's abort), or one message for every failure to
 * reach the host, whose cause goes to the log alone. */
CURLcode fetch_perform(CURL *c, const char *url, char *err, size_t cap);
/* An https URL -> the new file PATH (created here, never over an existing
 * file; removed again on failure), at most MAX bytes (LIMIT: the flag that
 * sets it, for the 413 message), redirects followed under the policy. */
int fetch_url(const char *url, const char *path, size_t max, const char *limit, char *err, int *status);

/* the OpenAPI documents (built from server/openapi.json and openapi_jobs.json) */
extern const char openapi_json[];
extern const char openapi_jobs_json[];
/* the dashboard (built from server/ui/: index.html, jobs.html, ui.js, ui.css; route_ui.c) */
extern const char ui_index_html[], ui_jobs_html[], ui_ui_js[], ui_ui_css[];

/* ------------------------------------------------------------ jobs (jobs.c) */

/* Starts the job runner: creates the directories, finds the jobs of an
 * earlier run (running ones again, dead ones failed), starts the runner and
 * webhook threads. */
int jobs_start(char *err);
/* Stops the threads; training processes go on running (the next start finds
 * them). */
void jobs_stop(void);
/* The trainer's default device for jobs: "cuda" where this build's trainer
 * and a GPU can train, else "cpu". */
const char *jobs_default_device(void);

/* ------------------------------------------------------------ HTTP helpers (http.c) */

typedef struct request request_t;
struct request {
    const struct listener *lsn; /* the listener it came in on */
    char *body;
    size_t len, cap;
    int too_big;
    const char *route;           /* the matched route's name, for logs and metrics */
    const char *method;
    char path[512];
    char *seg[8];                /* path segments (into a copy of path) */
    int nseg;
    struct MHD_Connection *conn;
    task_t *task;
    enum MHD_Result (*on_resume)(request_t *r);   /* answers a request suspended for other work */
    void *resume_ctx;
    /* frees resume_ctx where the connection ends (its client gone) after the
     * work set on_resume, before on_resume could answer */
    void (*resume_free)(void *ctx);
    int responded;
    int status;
    double t0;
    /* an upload route's body goes to a file in the data directory, not memory */
    int uploading;               /* files_upload_open succeeded */
    int upload_fd;               /* -1 when none */
    int upload_errno;            /* a write failed */
    char upload_tmp[1100];       /* its path; "" once the route took it */
    size_t upload_len;
};

int http_start(void);
void http_stop(void);
/* Connections closed because their request's headers were too slow. */
unsigned long http_slow_connections_closed(void);
/* The jobs listener (--jobs-listen): its own routes and admin keys. */
int http_jobs_start(void);
void http_jobs_stop(void);
/* "event: NAME\ndata: DATA\n\n" appended to *BUF (malloc'd, *LEN bytes),
 * after "id: ID\n" when ID >= 0; -1 when out of memory. */
int sse_format(char **buf, size_t *len, const char *name, const char *data, long id);
enum MHD_Result reply_json(request_t *r, int status, json_t *body);            /* steals body */
enum MHD_Result reply_error(request_t *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The error type of an HTTP status, as in every error body. */
const char *error_type(int status);
enum MHD_Result reply_bytes(request_t *r, int status, const char *type, const void *data, size_t len);
/* 200 with LEN bytes of the open file FD (taken: closed when sent) as an
 * attachment named FILENAME. */
enum MHD_Result reply_file(request_t *r, int fd, size_t len, const char *type, const char *filename);
/* The request body as a JSON object; on failure replies (400/415) and returns NULL. */
json_t *body_json(request_t *r);
const char *query_arg(request_t *r, const char *key);
/* Suspends the connection until the task's scheduler step resumes it. */
void http_wait(request_t *r, task_t *t);
/* Suspends R's connection and runs FN(CTX) on a detached thread of its own
 * (R's resume_ctx is CTX): work that may take long, a download, holds no
 * HTTP thread. The caller holds the lock under which FN will resume the
 * connection (setting on_resume), so it is suspended before it can be
 * resumed. -1 when no thread could start: the connection is as it was. */
int http_wait_thread(request_t *r, void *(*fn)(void *), void *ctx);
/* A streaming response fed from T's event buffer; takes over a reference
 * to T that the caller holds for it (dropped when the stream is freed). */
enum MHD_Result reply_stream(request_t *r, task_t *t);
/* Queues RESP (a callback response, destroyed here) as a 200
 * text/event-stream that proxies pass on unbuffered. */
enum MHD_Result reply_event_stream(request_t *r, struct MHD_Response *resp);

/* Field readers: on a bad value they write a message to ERR and return -1. */
int field_int(json_t *o, const char *k, long long lo, long long hi, long long dflt, long long *out, char *err);
int field_num(json_t *o, const char *k, double lo, double hi, double dflt, double *out, char *err);
int field_bool(json_t *o, const char *k, int dflt, int *out, char *err);
int field_str(json_t *o, const char *k, const char **out, char *err);   /* absent: *out = NULL */

/* route handlers */
enum MHD_Result route_healthz(request_t *r);
enum MHD_Result route_readyz(request_t *r);
enum MHD_Result route_metrics(request_t *r);
enum MHD_Result route_openapi(request_t *r);
enum MHD_Result route_ui_page(request_t *r);   /* route_ui.c: GET /, /ui.js, /ui.css */
enum MHD_Result route_ui_jobs_page(request_t *r);   /* GET / of the jobs listener */
enum MHD_Result route_ui_js(request_t *r);
enum MHD_Result route_ui_css(request_t *r);
enum MHD_Result route_models_list(request_t *r);
enum MHD_Result route_models_get(request_t *r);
enum MHD_Result route_models_post(request_t *r);
enum MHD_Result route_models_delete(request_t *r);
enum MHD_Result route_models_spans(request_t *r);
enum MHD_Result route_generate(request_t *r);
enum MHD_Result route_completions(request_t *r);
enum MHD_Result route_chat_completions(request_t *r);
enum MHD_Result route_score(request_t *r);
enum MHD_Result route_attention(request_t *r);   /* route_attention.c */
enum MHD_Result route_sessions_post(request_t *r);
enum MHD_Result route_sessions_list(request_t *r);
enum MHD_Result route_sessions_get(request_t *r);
enum MHD_Result route_sessions_delete(request_t *r);
enum MHD_Result route_sessions_state_get(request_t *r);
enum MHD_Result route_sessions_state_put(request_t *r);
/* jobs listener (route_jobs.c) */
enum MHD_Result route_jobs_healthz(request_t *r);
enum MHD_Result route_jobs_openapi(request_t *r);
enum MHD_Result route_files_post(request_t *r);
enum MHD_Result route_files_list(request_t *r);
enum MHD_Result route_files_get(request_t *r);
enum MHD_Result route_files_delete(request_t *r);
enum MHD_Result route_jobs_post(request_t *r);
enum MHD_Result route_jobs_list(request_t *r);
enum MHD_Result route_jobs_get(request_t *r);
enum MHD_Result route_jobs_events(request_t *r);
enum MHD_Result route_jobs_cancel(request_t *r);
enum MHD_Result route_jobs_delete(request_t *r);
enum MHD_Result route_jobs_checkpoint(request_t *r);
enum MHD_Result route_jobs_resume(request_t *r);
enum MHD_Result route_jobs_svg(request_t *r);
/* Opens the file an upload's body is written to (upload_fd, upload_tmp);
 * on failure replies and returns -1. */
int files_upload_open(request_t *r);
/* Called again after the task finished. */
enum MHD_Result route_task_done(request_t *r);
/* The events of a streaming task's settled text PIECE (srv.lock held). */
void route_stream_piece(task_t *t, const char *piece, size_t len);
/* The last event of a streaming task (srv.lock held). */
void route_stream_final(task_t *t);

/* The building blocks of the routes that run the model (route_infer.c),
 * shared with /v1/chat/completions (route_chat.c). A task is made, its
 * fields parsed, bound to its model or session, given its prompt, then
 * submitted; until submitted, task_refuse undoes it. */
task_t *task_new(task_kind kind, api_kind api);
/* max_tokens (under the name MAX_KEY, default DFLT), temperature, top_k,
 * top_p, seed, stop. */
int task_sampling(json_t *b, task_t *t, const char *max_key, long long dflt, char *err);
/* The model and stream: the session's (busy until the task ends) or a
 * fresh memory. Takes srv.lock. 0, or an HTTP status with ERR. */
int task_bind(task_t *t, const char *model, const char *session, char *err);
/* The N tokens of the prompt (t->toks, t->n, set by the caller) are within
 * --max-prompt (413) and the positions the stream may still take, counting
 * the MORE a generation adds (400). 0, or an HTTP status with ERR. */
int task_fits(task_t *t, int more, char *err);
/* PROMPT -> t->toks (422 outside the vocabulary), task_fits, then the
 * generation begun on it. 0, or an HTTP status with ERR. */
int task_generate_begin(task_t *t, const char *prompt, int session, char *err);
/* The generation begun on t->toks, which the caller set (400 when there are
 * none and the stream has no token to go on from). */
int task_generate_start(task_t *t, int session, char *err);
/* Queues T and waits for it, or opens its event stream. Takes B. */
enum MHD_Result task_submit(request_t *r, task_t *t, json_t *b);
/* Fails T before it was queued: the error answer. Takes B. */
enum MHD_Result task_refuse(request_t *r, task_t *t, json_t *b, int status, const char *err);
/* The I-th token of T's answer (its echoed prompt, then what it generated):
 * id, logprob (NAN: none, the first token of a prompt), and its top_n
 * alternatives. */
void task_token(const task_t *t, size_t i, int32_t *id, float *lp, const int32_t **top, const float **top_lp);
/* The text answer token I adds when it is token ID (its own, or an
 * alternative in its place: a word's text depends on the token before it)
 * into BUF (vocab_max_piece + 1 bytes); its length. */
size_t task_token_text(const task_t *t, size_t i, int32_t id, char *buf);
/* The tokens whose text a stream has sent (t->sent_bytes) and whose
 * logprobs it has not: [*from, return value). Advances t->lp_sent. */
size_t task_stream_tokens(task_t *t, size_t *from);
json_t *task_usage(const task_t *t);
const char *task_finish(const task_t *t);

/* /v1/chat/completions (route_chat.c) */
void chat_template_default(chat_template_t *c);
/* A "chat_template" object of POST /v1/models over the default; 400 with ERR. */
int chat_template_parse(json_t *j, chat_template_t *c, char *err);
/* Every character of C is in M's vocabulary; else 422 with ERR. */
int chat_template_check(const chat_template_t *c, const vocab_t *v, char *err);
json_t *chat_template_json(const chat_template_t *c);
/* The answer of a chat task, the chunk of a streamed piece, its last events. */
json_t *chat_json(const task_t *t);
json_t *chat_chunk(task_t *t, const char *piece, size_t len);
void chat_stream_final(task_t *t);

/* The serve flags' defaults (what `spanserve serve --help` says). */
void serve_defaults(config_t *c);
int cmd_serve(int argc, char **argv);
int cmd_train(int argc, char **argv);   /* cmd_train.c */

#endif
