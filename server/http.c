/*
 * http.c - the libmicrohttpd daemons: the API listener (--listen) and the
 * jobs listener (--jobs-listen), each with one table that maps (method, path
 * pattern) to a handler and keys of its own (API keys; admin keys). Bodies
 * are gathered under --max-body, except an upload route's, which goes to a
 * file under --max-upload; authentication, content types and errors are
 * handled here once, in one JSON error shape; one log line per request.
 */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------ routes */

typedef enum MHD_Result (*handler_fn)(request_t *r);

typedef struct {
    const char *method;
    const char *pattern;         /* segments; "*" matches one */
    handler_fn fn;
    int open;                    /* no API key needed */
    int json;                    /* the body must be application/json */
    int upload;                  /* the body is streamed to a file (files_upload_open) */
} route_t;

static const route_t routes[] = {
    {"GET", "/", route_ui_page, 1, 0, 0},   /* the dashboard: the page only, its data through the API */
    {"GET", "/ui.js", route_ui_js, 1, 0, 0},
    {"GET", "/ui.css", route_ui_css, 1, 0, 0},
    {"GET", "/healthz", route_healthz, 1, 0, 0},
    {"GET", "/readyz", route_readyz, 1, 0, 0},
    {"GET", "/metrics", route_metrics, 0, 0, 0},
    {"GET", "/openapi.json", route_openapi, 0, 0, 0},
    {"GET", "/v1/models", route_models_list, 0, 0, 0},
    {"POST", "/v1/models", route_models_post, 0, 1, 0},
    {"GET", "/v1/models/*", route_models_get, 0, 0, 0},
    {"DELETE", "/v1/models/*", route_models_delete, 0, 0, 0},
    {"GET", "/v1/models/*/spans", route_models_spans, 0, 0, 0},
    {"POST", "/v1/generate", route_generate, 0, 1, 0},
    {"POST", "/v1/score", route_score, 0, 1, 0},
    {"POST", "/v1/attention", route_attention, 0, 1, 0},
    {"POST", "/v1/completions", route_completions, 0, 1, 0},
    {"POST", "/v1/chat/completions", route_chat_completions, 0, 1, 0},
    {"POST", "/v1/sessions", route_sessions_post, 0, 1, 0},
    {"GET", "/v1/sessions", route_sessions_list, 0, 0, 0},
    {"GET", "/v1/sessions/*", route_sessions_get, 0, 0, 0},
    {"DELETE", "/v1/sessions/*", route_sessions_delete, 0, 0, 0},
    {"GET", "/v1/sessions/*/state", route_sessions_state_get, 0, 0, 0},
    {"PUT", "/v1/sessions/*/state", route_sessions_state_put, 0, 0, 0},
};

/* The jobs listener: training texts and jobs (route_jobs.c), admin keys. */
static const route_t job_routes[] = {
    {"GET", "/", route_ui_jobs_page, 1, 0, 0},   /* the jobs page of the dashboard */
    {"GET", "/ui.js", route_ui_js, 1, 0, 0},
    {"GET", "/ui.css", route_ui_css, 1, 0, 0},
    {"GET", "/healthz", route_jobs_healthz, 1, 0, 0},
    {"GET", "/openapi.json", route_jobs_openapi, 0, 0, 0},
    {"POST", "/v1/files", route_files_post, 0, 0, 1},
    {"GET", "/v1/files", route_files_list, 0, 0, 0},
    {"GET", "/v1/files/*", route_files_get, 0, 0, 0},
    {"DELETE", "/v1/files/*", route_files_delete, 0, 0, 0},
    {"POST", "/v1/jobs", route_jobs_post, 0, 1, 0},
    {"GET", "/v1/jobs", route_jobs_list, 0, 0, 0},
    {"GET", "/v1/jobs/*", route_jobs_get, 0, 0, 0},
    {"DELETE", "/v1/jobs/*", route_jobs_delete, 0, 0, 0},
    {"GET", "/v1/jobs/*/events", route_jobs_events, 0, 0, 0},
    {"POST", "/v1/jobs/*/cancel", route_jobs_cancel, 0, 0, 0},
    {"POST", "/v1/jobs/*/resume", route_jobs_resume, 0, 0, 0},
    {"GET", "/v1/jobs/*/spans.svg", route_jobs_svg, 0, 0, 0},
    {"GET", "/v1/jobs/*/checkpoint", route_jobs_checkpoint, 0, 0, 0},
};

typedef struct listener {
    const char *name;            /* for the log */
    const route_t *routes;
    size_t n_routes;
    char ***keys;                /* the listener's keys (config_t's arrays) */
    int *n_keys;
    const char *key_kind;        /* "API key" or "admin key", for the 401 message */
} listener_t;

static const listener_t api_listener = {"api", routes, sizeof routes / sizeof *routes, &srv.cfg.api_keys,
                                        &srv.cfg.n_api_keys, "API key"};
static const listener_t jobs_listener = {"jobs", job_routes, sizeof job_routes / sizeof *job_routes,
                                         &srv.cfg.admin_keys, &srv.cfg.n_admin_keys, "admin key"};

/* Splits the URL path into segments (in R->path); -1 if it is too long or
 * too deep to be any route. */
static int split_path(request_t *r, const char *url)
{
    if (strlen(url) >= sizeof r->path) return -1;
    strcpy(r->path, url);
    r->nseg = 0;
    for (char *p = r->path; *p;) {
        while (*p == '/') *p++ = 0;
        if (!*p) break;
        if (r->nseg == 8) return -1;
        r->seg[r->nseg++] = p;
        while (*p && *p != '/') p++;
    }
    return 0;
}

static int pattern_match(const request_t *r, const char *pattern)
{
    char buf[128], *save = NULL;
    snprintf(buf, sizeof buf, "%s", pattern);
    int i = 0;
    for (char *tok = strtok_r(buf, "/", &save); tok; tok = strtok_r(NULL, "/", &save), i++) {
        if (i >= r->nseg) return 0;
        if (strcmp(tok, "*") != 0 && strcmp(tok, r->seg[i]) != 0) return 0;
    }
    return i == r->nseg;
}

/* ------------------------------------------------------------ replies */

static void add_common_headers(struct MHD_Response *resp)
{
    MHD_add_response_header(resp, "Cache-Control", "no-store");
}

enum MHD_Result reply_bytes(request_t *r, int status, const char *type, const void *data, size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    add_common_headers(resp);
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (status == 429 || status == 503) MHD_add_response_header(resp, "Retry-After", "1");
    enum MHD_Result rc = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->status = status;
    r->responded = 1;
    return rc;
}

enum MHD_Result reply_file(request_t *r, int fd, size_t len, const char *type, const char *filename)
{
    struct MHD_Response *resp = MHD_create_response_from_fd64(len, fd);
    if (!resp) {
        close(fd);
        return reply_error(r, 503, "out of memory");
    }
    char disp[300];
    snprintf(disp, sizeof disp, "attachment; filename=\"%s\"", filename);
    MHD_add_response_header(resp, "Content-Type", type);
    MHD_add_response_header(resp, "Content-Disposition", disp);
    add_common_headers(resp);
    enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->status = 200;
    r->responded = 1;
    return rc;
}

enum MHD_Result reply_json(request_t *r, int status, json_t *body)
{
    char *s = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(body);
    if (!s) return reply_error(r, 500, "the answer could not be encoded as JSON (out of memory, or a number that is not finite)");
    enum MHD_Result rc = reply_bytes(r, status, "application/json", s, strlen(s));
    free(s);
    return rc;
}

const char *error_type(int status)
{
    switch (status) {
    case 400: return "invalid_request";
    case 401: return "unauthorized";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 409: return "conflict";
    case 413: return "payload_too_large";
    case 415: return "unsupported_media_type";
    case 422: return "unprocessable";
    case 429: return "rate_limited";
    case 503: return "unavailable";
    case 507: return "insufficient_storage";
    default: return "internal";
    }
}

/* The error body {"error": {"code", "type", "message"}} of FMT: bounded
 * (the message is cut to 600 bytes) and valid JSON whatever the client sent
 * (it quotes what clients sent: kept valid UTF-8, a '?' for each stray
 * byte, and escaped by jansson). NULL when out of memory. */
static char *error_body(int status, const char *fmt, va_list ap)
{
    char msg[600];
    vsnprintf(msg, sizeof msg, fmt, ap);
    for (size_t i = 0, n = strlen(msg); i < n;) {
        uint32_t cp;
        int k = utf8_decode((const unsigned char *)msg + i, n - i, &cp);
        if (k == 0 || cp == 0) msg[i++] = '?';
        else i += (size_t)k;
    }
    json_t *e = json_pack("{s:{s:i, s:s, s:s}}", "error", "code", status, "type", error_type(status), "message", msg);
    char *s = e ? json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(e);
    return s;
}

enum MHD_Result reply_error(request_t *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = error_body(status, fmt, ap);
    va_end(ap);
    if (!s) return MHD_NO;
    enum MHD_Result rc = reply_bytes(r, status, "application/json", s, strlen(s));
    free(s);
    return rc;
}

/* An error answered before the body was read, or one that leaves the
 * connection's framing in doubt: sent with "Connection: close", and the
 * extra header NAME: VALUE when NAME is not NULL. */
static enum MHD_Result reply_error_close(request_t *r, int status, const char *name, const char *value,
                                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result reply_error_close(request_t *r, int status, const char *name, const char *value,
                                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = error_body(status, fmt, ap);
    va_end(ap);
    struct MHD_Response *resp = s ? MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!resp) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json");
    add_common_headers(resp);
    if (name) MHD_add_response_header(resp, name, value);
    if (status != 405) MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result rc = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->status = status;
    r->responded = 1;
    return rc;
}

/* ------------------------------------------------------------ request data */

json_t *body_json(request_t *r)
{
    json_error_t je;
    json_t *j = json_loadb(r->body ? r->body : "", r->len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        reply_error(r, 400, "the body is not valid JSON: %s (byte %d)", je.text, je.position);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        reply_error(r, 400, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

const char *query_arg(request_t *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

int field_int(json_t *o, const char *k, long long lo, long long hi, long long dflt, long long *out, char *err)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) { *out = dflt; return 0; }
    /* integral reals (16.0) are integers too; anything else is refused */
    double d = json_is_real(v) ? json_real_value(v) : 0;
    if (json_is_integer(v)) *out = json_integer_value(v);
    else if (json_is_real(v) && d == floor(d) && fabs(d) < 9e15) *out = (long long)d;
    else return snprintf(err, 512, "%s must be an integer in [%lld, %lld]", k, lo, hi), -1;
    if (*out < lo || *out > hi) return snprintf(err, 512, "%s must be an integer in [%lld, %lld]", k, lo, hi), -1;
    return 0;
}

int field_num(json_t *o, const char *k, double lo, double hi, double dflt, double *out, char *err)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) { *out = dflt; return 0; }
    if (!json_is_number(v)) return snprintf(err, 512, "%s must be a number in [%g, %g]", k, lo, hi), -1;
    *out = json_number_value(v);
    if (!isfinite(*out) || *out < lo || *out > hi) return snprintf(err, 512, "%s must be a number in [%g, %g]", k, lo, hi), -1;
    return 0;
}

int field_bool(json_t *o, const char *k, int dflt, int *out, char *err)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) { *out = dflt; return 0; }
    if (!json_is_boolean(v)) return snprintf(err, 512, "%s must be true or false", k), -1;
    *out = json_is_true(v);
    return 0;
}

int field_str(json_t *o, const char *k, const char **out, char *err)
{
    json_t *v = json_object_get(o, k);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return snprintf(err, 512, "%s must be a string", k), -1;
    *out = json_string_value(v);
    return 0;
}

/* ------------------------------------------------------------ waiting on tasks */

void http_wait(request_t *r, task_t *t)
{
    r->task = t;
    MHD_suspend_connection(r->conn);
}

int http_wait_thread(request_t *r, void *(*fn)(void *), void *ctx)
{
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    r->resume_ctx = ctx;
    MHD_suspend_connection(r->conn);
    int rc = pthread_create(&th, &at, fn, ctx);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        MHD_resume_connection(r->conn);
        r->resume_ctx = NULL;
        return -1;
    }
    return 0;
}

/* SSE: the scheduler appends to t->sse; this hands it out, and suspends the
 * connection while there is nothing new (sched.c resumes it). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    task_t *t = cls;
    ssize_t n;
    pthread_mutex_lock(&srv.lock);
    if (pos < t->sse_len) {
        n = (ssize_t)(t->sse_len - pos < max ? t->sse_len - pos : max);
        memcpy(buf, t->sse + pos, (size_t)n);
    } else if (t->done) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        t->reader_waiting = 1;
        MHD_suspend_connection(t->conn);
        n = 0;
    }
    pthread_mutex_unlock(&srv.lock);
    return n;
}

static void stream_free(void *cls)
{
    task_t *t = cls;
    pthread_mutex_lock(&srv.lock);
    if (!t->done) t->cancelled = 1;   /* the client went away */
    task_release(t);
    pthread_mutex_unlock(&srv.lock);
}

enum MHD_Result reply_stream(request_t *r, task_t *t)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, t, stream_free);
    if (!resp) {
        pthread_mutex_lock(&srv.lock);
        task_release(t);   /* the reference the caller took for the stream */
        pthread_mutex_unlock(&srv.lock);
        return MHD_NO;
    }
    return reply_event_stream(r, resp);
}

enum MHD_Result reply_event_stream(request_t *r, struct MHD_Response *resp)
{
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");   /* nginx: pass each event on at once */
    enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->status = 200;
    r->responded = 1;
    return rc;
}

/* ------------------------------------------------------------ connections
 *
 * Every connection is tracked from accept to close (libmicrohttpd's
 * connection notifications), so that a client sending its request headers a
 * byte at a time cannot hold a connection for long: a request's headers
 * must arrive within --header-timeout seconds of the connection's start, or
 * of the end of its previous request (which bounds an idle keep-alive
 * connection the same way). A reaper thread shuts such connections down;
 * libmicrohttpd then closes them as a client that hung up. Connections per
 * client address are bounded by libmicrohttpd (--max-connections-per-client),
 * all of them by --max-connections.
 */

typedef struct conn_info {
    int fd;
    double since;                /* when the request now awaited began to be awaited */
    int in_request;              /* its headers arrived: a request is being served */
    int bad_escape;              /* the request's URL or an argument decodes to a NUL byte */
    struct conn_info *prev, *next;
} conn_info;

static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;
static conn_info *conns;
static pthread_t reaper_thread;
static int reaper_running, reaper_stop;
static unsigned long reaped;     /* connections shut for slow headers, for /metrics */

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx, enum MHD_ConnectionNotificationCode code)
{
    (void)cls;
    pthread_mutex_lock(&conn_lock);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_info *ci = calloc(1, sizeof *ci);
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci && info) {
            ci->fd = info->connect_fd;
            ci->since = now_s();
            ci->next = conns;
            if (conns) conns->prev = ci;
            conns = ci;
        } else {
            free(ci);
            ci = NULL;
        }
        *socket_ctx = ci;
    } else if (*socket_ctx) {   /* closed: called before libmicrohttpd closes the socket */
        conn_info *ci = *socket_ctx;
        if (ci->prev) ci->prev->next = ci->next;
        else conns = ci->next;
        if (ci->next) ci->next->prev = ci->prev;
        free(ci);
        *socket_ctx = NULL;
    }
    pthread_mutex_unlock(&conn_lock);
}

static conn_info *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? info->socket_context : NULL;
}

static void conn_request_begins(struct MHD_Connection *c)
{
    conn_info *ci = conn_of(c);
    pthread_mutex_lock(&conn_lock);
    if (ci) ci->in_request = 1;
    pthread_mutex_unlock(&conn_lock);
}

static void conn_request_ends(struct MHD_Connection *c)
{
    conn_info *ci = conn_of(c);
    pthread_mutex_lock(&conn_lock);
    if (ci) {
        ci->in_request = 0;
        ci->bad_escape = 0;
        ci->since = now_s();
    }
    pthread_mutex_unlock(&conn_lock);
}

static void *reaper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&conn_lock);
    while (!reaper_stop) {
        double now = now_s();
        for (conn_info *ci = conns; ci; ci = ci->next)
            if (!ci->in_request && ci->fd >= 0 && now - ci->since > srv.cfg.header_timeout) {
                shutdown(ci->fd, SHUT_RDWR);   /* the socket stays open (and ours) until libmicrohttpd closes it */
                ci->fd = -1;
                reaped++;
            }
        pthread_mutex_unlock(&conn_lock);
        usleep(200000);
        pthread_mutex_lock(&conn_lock);
    }
    pthread_mutex_unlock(&conn_lock);
    return NULL;
}

unsigned long http_slow_connections_closed(void)
{
    pthread_mutex_lock(&conn_lock);
    unsigned long n = reaped;
    pthread_mutex_unlock(&conn_lock);
    return n;
}

/* libmicrohttpd's decoding of %XX in the URL and its arguments, refusing
 * %00: a NUL would cut a name short (DELETE /v1/models/a%00b deleting
 * "a"). The request is flagged, and answered 400 before any route runs. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    size_t n = MHD_http_unescape(s);
    if (strlen(s) != n) {
        conn_info *ci = conn_of(c);
        pthread_mutex_lock(&conn_lock);
        if (ci) ci->bad_escape = 1;
        pthread_mutex_unlock(&conn_lock);
    }
    return n;
}

static int conn_bad_escape(struct MHD_Connection *c)
{
    conn_info *ci = conn_of(c);
    pthread_mutex_lock(&conn_lock);
    int bad = ci && ci->bad_escape;
    pthread_mutex_unlock(&conn_lock);
    return bad;
}

/* Counts the headers named NAME (case-insensitively). */
typedef struct { const char *name; int n; } hdr_count;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind, (void)value;
    hdr_count *h = cls;
    if (key && strcasecmp(key, h->name) == 0) h->n++;
    return MHD_YES;
}

static int header_count(struct MHD_Connection *c, const char *name)
{
    hdr_count h = {name, 0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &h);
    return h.n;
}

/* What is wrong with a request's framing before any route sees it (a
 * request-smuggling risk behind a proxy that reads it another way), or NULL. */
static const char *framing_problem(struct MHD_Connection *c)
{
    int cl = header_count(c, "Content-Length"), te = header_count(c, "Transfer-Encoding");
    if (cl > 1) return "the request has more than one Content-Length header";
    if (cl && te) return "the request has both Content-Length and Transfer-Encoding";
    if (te > 1) return "the request has more than one Transfer-Encoding header";
    return NULL;
}

/* ------------------------------------------------------------ the handler */

static int authorized(const listener_t *l, struct MHD_Connection *c)
{
    if (*l->n_keys == 0) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    while (*h == ' ') h++;
    for (int i = 0; i < *l->n_keys; i++) {
        /* compare the whole key whatever the first difference, so timing
         * says nothing of the key */
        const char *k = (*l->keys)[i];
        size_t a = strlen(h), b = strlen(k);
        unsigned diff = (unsigned)(a != b);
        for (size_t j = 0; j < b; j++) diff |= (unsigned)(k[j] ^ (j < a ? h[j] : 0));
        if (!diff) return 1;
    }
    return 0;
}

static int is_json_type(struct MHD_Connection *c)
{
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (!ct) return 0;
    while (*ct == ' ') ct++;
    return strncasecmp(ct, "application/json", 16) == 0 && (ct[16] == 0 || ct[16] == ';' || ct[16] == ' ');
}

/* The route of R's method and path (split into R), or NULL; ALLOW gets the
 * methods the path has. */
static const route_t *find_route(request_t *r, char *allow, size_t cap)
{
    const listener_t *l = r->lsn;
    /* HEAD is GET without the body (libmicrohttpd leaves the body out) */
    const char *method = strcmp(r->method, "HEAD") == 0 ? "GET" : r->method;
    *allow = 0;
    for (size_t i = 0; i < l->n_routes; i++) {
        const route_t *rt = &l->routes[i];
        if (!pattern_match(r, rt->pattern)) continue;
        if (strcmp(rt->method, method) == 0) return rt;
        const char *add = strcmp(rt->method, "GET") == 0 ? "GET, HEAD" : rt->method;
        if (strlen(allow) + strlen(add) + 3 < cap) {
            if (*allow) strcat(allow, ", ");
            strcat(allow, add);
        }
    }
    return NULL;
}

static enum MHD_Result dispatch(request_t *r, const char *url)
{
    if (split_path(r, url)) return reply_error(r, 404, "no such route");
    char allow[64];
    const route_t *hit = find_route(r, allow, sizeof allow);
    if (!hit && *allow) {
        r->route = "other";
        return reply_error_close(r, 405, "Allow", allow, "%.32s is not allowed here; use %s", r->method, allow);
    }
    if (!hit) {
        r->route = "other";
        return reply_error(r, 404, "no route %.32s %.200s", r->method, url);
    }
    r->route = hit->pattern;
    if (!hit->open && !authorized(r->lsn, r->conn))
        return reply_error(r, 401, "a valid %s is required: send Authorization: Bearer KEY", r->lsn->key_kind);
    if (r->too_big && hit->upload)
        return reply_error(r, 413, "the upload is over the limit of %zu bytes (--max-upload)", srv.cfg.max_upload);
    if (r->too_big)
        return reply_error(r, 413, "the body is over the limit of %zu bytes (--max-body)", srv.cfg.max_body);
    if (hit->json && !is_json_type(r->conn))
        return reply_error(r, 415, "the body must be JSON: send Content-Type: application/json");
    return hit->fn(r);
}

/* The first call of an upload route: the key and the declared length are
 * checked before a byte is stored, then the file is opened. */
static enum MHD_Result upload_begin(request_t *r, const char *url)
{
    char allow[64];
    if (split_path(r, url)) return MHD_YES;
    const route_t *hit = find_route(r, allow, sizeof allow);
    if (!hit || !hit->upload) return MHD_YES;   /* answered after the body, as every request */
    r->route = hit->pattern;
    if (!hit->open && !authorized(r->lsn, r->conn))
        return reply_error(r, 401, "a valid %s is required: send Authorization: Bearer KEY", r->lsn->key_kind);
    const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > srv.cfg.max_upload)
        return reply_error(r, 413, "the upload is over the limit of %zu bytes (--max-upload)", srv.cfg.max_upload);
    files_upload_open(r);   /* replies itself on failure */
    return MHD_YES;
}

/* A chunk of an upload, to its file; past --max-upload the file goes and
 * the rest is read and dropped (413 at the end). */
static void upload_chunk(request_t *r, const char *p, size_t n)
{
    if (r->upload_errno) return;
    if (r->too_big || r->upload_len + n > srv.cfg.max_upload) {
        r->too_big = 1;
        if (r->upload_fd >= 0) {
            close(r->upload_fd);
            r->upload_fd = -1;
            unlink(r->upload_tmp);
            r->upload_tmp[0] = 0;
        }
        return;
    }
    while (n) {
        ssize_t k = write(r->upload_fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {   /* a full disk: the route answers 500 with the reason */
            r->upload_errno = k < 0 ? errno : ENOSPC;
            r->too_big = 0;
            close(r->upload_fd);
            r->upload_fd = -1;
            return;
        }
        p += k;
        n -= (size_t)k;
        r->upload_len += (size_t)k;
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    request_t *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->lsn = cls;
        r->conn = conn;
        r->method = method;
        r->t0 = now_s();
        r->route = "other";
        r->upload_fd = -1;
        *con_cls = r;
        conn_request_begins(conn);
        const char *bad = framing_problem(conn);
        if (bad) return reply_error_close(r, 400, NULL, NULL, "%s", bad);
        if (conn_bad_escape(conn))
            return reply_error_close(r, 400, NULL, NULL, "the URL decodes to a NUL byte (%%00), which no name may hold");
        if (strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0) return upload_begin(r, url);
        return MHD_YES;
    }
    if (*upload_size && r->uploading) {
        upload_chunk(r, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size && r->responded) {   /* answered at the first call (401, 413): drop the body */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->too_big || r->len + n > srv.cfg.max_body) {
            r->too_big = 1;   /* keep reading, answer 413 at the end */
            free(r->body);
            r->body = NULL;
            r->len = r->cap = 0;
            return MHD_YES;
        }
        if (r->len + n + 1 > r->cap) {
            size_t cap = (r->len + n + 1) * 2;
            if (cap > srv.cfg.max_body + 1) cap = srv.cfg.max_body + 1;
            char *b = realloc(r->body, cap);
            if (!b) return MHD_NO;
            r->body = b;
            r->cap = cap;
        }
        memcpy(r->body + r->len, upload, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    if (r->responded) return MHD_YES;
    if (r->on_resume) return r->on_resume(r);
    if (r->task) return route_task_done(r);
    return dispatch(r, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    request_t *r = *con_cls;
    conn_request_ends(conn);
    if (!r) return;
    double dt = now_s() - r->t0;
    int status = r->status ? r->status : 499;
    long tokens = 0;
    if (r->task) {
        pthread_mutex_lock(&srv.lock);
        task_t *t = r->task;
        if (!t->done) t->cancelled = 1;
        tokens = t->kind == TASK_SCORE ? t->sc.tokens : t->done ? t->res.n_tokens : 0;
        task_release(t);
        pthread_mutex_unlock(&srv.lock);
    }
    char method[33];   /* a client's bytes: cut, and printable, in the log */
    size_t k = 0;
    for (; r->method[k] && k < sizeof method - 1; k++) method[k] = r->method[k] > 32 && r->method[k] < 127 ? r->method[k] : '?';
    method[k] = 0;
    log_line("%s %s %d %.1fms %ld tokens%s", method, r->route, status, dt * 1e3, tokens,
             toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection closed early)");
    metrics_request(r->route, status, dt);
    /* work that finished for a client that left: its answer was never built (on_resume did not run) */
    if (r->on_resume && r->resume_free) r->resume_free(r->resume_ctx);
    if (r->upload_fd >= 0) close(r->upload_fd);
    if (r->upload_tmp[0]) unlink(r->upload_tmp);   /* an upload the route did not keep */
    free(r->body);
    free(r);
    *con_cls = NULL;
}

/* A daemon for listener L on ADDR (HOST:PORT, IPv4 or [IPv6]) and PORT. */
static struct MHD_Daemon *start_daemon(const listener_t *l, const char *a, int port, unsigned threads)
{
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    char host[256];
    const char *colon = strrchr(a, ':');
    if (!colon || (size_t)(colon - a) >= sizeof host) return NULL;
    memcpy(host, a, (size_t)(colon - a));
    host[colon - a] = 0;
    if (host[0] == '[') {
        size_t n = strlen(host);
        if (n < 2 || host[n - 1] != ']') return NULL;
        memmove(host, host + 1, n - 2);
        host[n - 2] = 0;
    }
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        flags |= MHD_USE_IPv6;
    } else {
        return NULL;
    }
    /* a connection idle this long (no byte either way) is closed; one
     * awaiting a request's headers is closed earlier by the reaper */
    return MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, (void *)l,
                                  MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                                  MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                                  MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
                                  MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
                                  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv.cfg.max_connections,
                                  MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)srv.cfg.max_conn_per_client,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                                  MHD_OPTION_THREAD_POOL_SIZE, threads > 1 ? threads : 0u,
                                  MHD_OPTION_END);
}

int http_start(void)
{
    const char *a = srv.cfg.listen_addr;
    srv.daemon = start_daemon(&api_listener, a, srv.cfg.port, (unsigned)srv.cfg.http_threads);
    if (!srv.daemon) return -1;
    reaper_stop = 0;
    if (!reaper_running && pthread_create(&reaper_thread, NULL, reaper_main, NULL) == 0) reaper_running = 1;
    return reaper_running ? 0 : -1;
}

void http_stop(void)
{
    if (srv.daemon) MHD_stop_daemon(srv.daemon);
    srv.daemon = NULL;
    if (reaper_running) {
        pthread_mutex_lock(&conn_lock);
        reaper_stop = 1;
        pthread_mutex_unlock(&conn_lock);
        pthread_join(reaper_thread, NULL);
        reaper_running = 0;
    }
}

/* The jobs listener: two threads are plenty for an admin API whose work
 * (spawning, reading logs) is short. */
int http_jobs_start(void)
{
    srv.jobs_daemon = start_daemon(&jobs_listener, srv.cfg.jobs_listen, srv.cfg.jobs_port, 2);
    return srv.jobs_daemon ? 0 : -1;
}

void http_jobs_stop(void)
{
    if (srv.jobs_daemon) MHD_stop_daemon(srv.jobs_daemon);
    srv.jobs_daemon = NULL;
}

int sse_format(char **buf, size_t *len, const char *name, const char *data, long id)
{
    size_t need = *len + strlen(name) + strlen(data) + 48;
    char *b = realloc(*buf, need);
    if (!b) return -1;
    *buf = b;
    if (id >= 0) *len += (size_t)sprintf(b + *len, "id: %ld\n", id);
    *len += (size_t)sprintf(b + *len, "event: %s\ndata: %s\n\n", name, data);
    return 0;
}
