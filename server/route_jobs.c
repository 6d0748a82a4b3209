/*
 * route_jobs.c - the jobs listener's routes (--jobs-listen, admin keys):
 * training texts (/v1/files: uploaded to the data directory, listed,
 * deleted) and training jobs (/v1/jobs: submitted, listed, described,
 * followed as JSON or server-sent events, cancelled, resumed, and their
 * spans or architecture weights over training as a picture). jobs.c runs
 * the jobs; these handlers validate and answer.
 *
 * No path a client sends is opened unless it resolves, links followed, to a
 * regular file inside the data directory; ids and names are 1-64 of
 * [A-Za-z0-9._-], never "." or "..".
 */
#define _GNU_SOURCE
#include "jobs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Fetches of training texts by URL at once (each holds a thread and a
 * suspended connection). */
#define MAX_FETCHES 2
/* Events of one JSON answer of /events, by default and at most. */
#define EVENTS_DEFAULT 1000
#define EVENTS_MAX 10000

static int fetches;              /* under jobs_lock */

int jobs_fetching(void)
{
    pthread_mutex_lock(&jobs_lock);
    int n = fetches;
    pthread_mutex_unlock(&jobs_lock);
    return n;
}

enum MHD_Result route_jobs_healthz(request_t *r)
{
    return reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
}

enum MHD_Result route_jobs_openapi(request_t *r)
{
    return reply_bytes(r, 200, "application/json", openapi_jobs_json, strlen(openapi_jobs_json));
}

/* ------------------------------------------------------------ files */

int files_upload_open(request_t *r)
{
    snprintf(r->upload_tmp, sizeof r->upload_tmp, "%s/.upload-XXXXXX", jobs_files_dir());
    int fd = mkostemp(r->upload_tmp, O_CLOEXEC);
    if (fd < 0) {
        r->upload_tmp[0] = 0;
        reply_error(r, 500, "cannot store an upload in the data directory: %s", strerror(errno));
        return -1;
    }
    r->upload_fd = fd;
    r->uploading = 1;
    return 0;
}

static json_t *file_load(const char *id)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s.json", jobs_files_dir(), id);
    json_t *j = json_load_file(p, 0, NULL);
    if (j && !json_is_object(j)) { json_decref(j); j = NULL; }
    return j;
}

/* Stores the text at TMP (already in the files directory) as a new file:
 * checks it is UTF-8, renames it, writes its description. Returns the file
 * object, or NULL with ERR and STATUS. */
static json_t *file_store(const char *tmp, const char *name, const char *source, char *err, int *status)
{
    size_t chars, distinct;
    struct stat st;
    if (stat(tmp, &st) != 0) { *status = 500; snprintf(err, 512, "the upload is gone: %s", strerror(errno)); return NULL; }
    if (st.st_size == 0) { *status = 400; snprintf(err, 512, "the text is empty"); return NULL; }
    if (jobs_scan_text(tmp, &chars, &distinct, err)) { *status = 400; return NULL; }
    char id[NAME_MAX_LEN + 1], path[PATH_MAX], meta[PATH_MAX], t[32];
    do {
        random_id("file-", id, sizeof id);
        snprintf(path, sizeof path, "%s/%s", jobs_files_dir(), id);
    } while (access(path, F_OK) == 0);
    snprintf(meta, sizeof meta, "%s.json", path);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *f = json_pack("{s:s, s:s, s:I, s:I, s:I, s:s}", "id", id, "name", name ? name : id, "bytes",
                          (json_int_t)st.st_size, "characters", (json_int_t)chars, "distinct_characters",
                          (json_int_t)distinct, "created", t);
    if (source) json_object_set_new(f, "url", json_string(source));
    char *s = f ? json_dumps(f, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (!s || rename(tmp, path) != 0 || write_atomic(meta, s, strlen(s)) != 0) {
        unlink(path);
        free(s);
        json_decref(f);
        *status = 500;
        snprintf(err, 512, "cannot store the text in the data directory: %s", strerror(errno));
        return NULL;
    }
    free(s);
    return f;
}

enum MHD_Result route_files_post(request_t *r)
{
    const char *name = query_arg(r, "name");
    if (name && !valid_name(name))
        return reply_error(r, 400, "name must be 1 to 64 of A-Z a-z 0-9 . _ - (and not . or ..)");
    if (r->upload_errno) return reply_error(r, 500, "cannot store the upload: %s", strerror(r->upload_errno));
    if (!r->uploading || r->upload_fd < 0) return reply_error(r, 500, "the upload was not stored");
    int bad = fsync(r->upload_fd) != 0;
    bad |= close(r->upload_fd) != 0;
    r->upload_fd = -1;
    if (bad) return reply_error(r, 500, "cannot store the upload: %s", strerror(errno));
    char err[512];
    int status;
    pthread_mutex_lock(&jobs_lock);
    json_t *f = file_store(r->upload_tmp, name, NULL, err, &status);
    pthread_mutex_unlock(&jobs_lock);
    if (!f) return reply_error(r, status, "%s", err);
    r->upload_tmp[0] = 0;   /* kept */
    log_line("file %s: %lld bytes uploaded", json_string_value(json_object_get(f, "id")),
             (long long)json_integer_value(json_object_get(f, "bytes")));
    return reply_json(r, 201, f);
}

static int cmp_created(const void *a, const void *b)
{
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    int c = strcmp(json_string_value(json_object_get(x, "created")) ?: "", json_string_value(json_object_get(y, "created")) ?: "");
    return c ? c : strcmp(json_string_value(json_object_get(x, "id")) ?: "", json_string_value(json_object_get(y, "id")) ?: "");
}

enum MHD_Result route_files_list(request_t *r)
{
    json_t **v = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&jobs_lock);
    DIR *d = opendir(jobs_files_dir());
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0) continue;
        char id[NAME_MAX_LEN + 1];
        if (l - 5 > NAME_MAX_LEN) continue;
        snprintf(id, sizeof id, "%.*s", (int)(l - 5), e->d_name);
        json_t *f = valid_name(id) ? file_load(id) : NULL;
        if (!f) continue;
        if (n == cap) {
            json_t **b = realloc(v, (cap = cap ? cap * 2 : 16) * sizeof *v);
            if (!b) { json_decref(f); break; }
            v = b;
        }
        v[n++] = f;
    }
    if (d) closedir(d);
    pthread_mutex_unlock(&jobs_lock);
    if (n) qsort(v, n, sizeof *v, cmp_created);
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, v[i]);
    free(v);
    return reply_json(r, 200, json_pack("{s:o}", "files", a));
}

enum MHD_Result route_files_get(request_t *r)
{
    pthread_mutex_lock(&jobs_lock);
    json_t *f = valid_name(r->seg[2]) ? file_load(r->seg[2]) : NULL;
    pthread_mutex_unlock(&jobs_lock);
    if (!f) return reply_error(r, 404, "no file '%.64s'", r->seg[2]);
    return reply_json(r, 200, f);
}

enum MHD_Result route_files_delete(request_t *r)
{
    const char *id = r->seg[2];
    pthread_mutex_lock(&jobs_lock);
    json_t *f = valid_name(id) ? file_load(id) : NULL;
    int busy = f && jobs_file_in_use(id);
    if (f && !busy) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", jobs_files_dir(), id);
        unlink(p);
        snprintf(p, sizeof p, "%s/%s.json", jobs_files_dir(), id);
        unlink(p);
    }
    pthread_mutex_unlock(&jobs_lock);
    json_decref(f);
    if (!f) return reply_error(r, 404, "no file '%.64s'", id);
    if (busy) return reply_error(r, 409, "file '%s' is the text of a queued or running job", id);
    log_line("file %s: deleted", id);
    return reply_json(r, 200, json_pack("{s:s}", "deleted", id));
}

/* ------------------------------------------------------------ submitting */

/* PATH must name a regular file inside the data directory, links resolved. */
static int resolve_in_data_dir(const char *path, char *out, size_t cap, char *err)
{
    const char *dir = srv.cfg.data_dir;
    if (!*path || path[0] == '/') return snprintf(err, 512, "path must be relative to the data directory"), -1;
    for (const char *p = path; *p; p++)
        if (p[0] == '.' && p[1] == '.' && (p == path || p[-1] == '/') && (p[2] == '/' || p[2] == 0))
            return snprintf(err, 512, "path must not contain '..'"), -1;
    char joined[PATH_MAX];
    if ((size_t)snprintf(joined, sizeof joined, "%s/%s", dir, path) >= sizeof joined)
        return snprintf(err, 512, "path is too long"), -1;
    char *real = realpath(joined, NULL);
    if (!real) return snprintf(err, 512, "path %.200s: %s", path, strerror(errno)), -1;
    size_t n = strlen(dir);
    struct stat st;
    int inside = strncmp(real, dir, n) == 0 && real[n] == '/';
    int regular = stat(real, &st) == 0 && S_ISREG(st.st_mode);
    if (inside && regular) snprintf(out, cap, "%s", real);
    free(real);
    if (!inside) return snprintf(err, 512, "path resolves outside the data directory"), -1;
    if (!regular) return snprintf(err, 512, "path %.200s is not a regular file", path), -1;
    return 0;
}

/* Under jobs_lock: submits REQ on the text DATA (FILE_ID's, or NULL) and
 * answers (201 new, 200 the same submission again). */
static enum MHD_Result submit_and_reply(request_t *r, json_t *req, const char *data, const char *file_id)
{
    char err[512];
    int status, existed;
    job_t *j = jobs_submit(req, data, file_id, &existed, err, &status);
    json_t *o = j ? job_json(j) : NULL;
    pthread_mutex_unlock(&jobs_lock);
    if (!j) return reply_error(r, status, "%s", err);
    return reply_json(r, existed ? 200 : 201, o);
}

/* A text fetched by URL, on a thread of its own (the connection waits
 * suspended), becomes a file, then the job is submitted on it. */
typedef struct {
    request_t *r;
    json_t *req;
    char tmp[PATH_MAX];
    json_t *file;
    int status;
    char err[512];
} fetch_t;

static void fetch_free(void *ctx)
{
    fetch_t *f = ctx;
    json_decref(f->req);
    json_decref(f->file);
    free(f);
}

static enum MHD_Result fetch_done(request_t *r)
{
    fetch_t *f = r->resume_ctx;
    r->on_resume = NULL;
    r->resume_ctx = NULL;
    enum MHD_Result rc;
    if (!f->file) {
        rc = reply_error(r, f->status, "%s", f->err);
    } else {
        const char *id = json_string_value(json_object_get(f->file, "id"));
        char path[PATH_MAX], err[512];
        int status, existed;
        snprintf(path, sizeof path, "%s/%s", jobs_files_dir(), id);
        pthread_mutex_lock(&jobs_lock);
        job_t *j = jobs_submit(f->req, path, id, &existed, err, &status);
        json_t *o = j ? job_json(j) : NULL;
        if (!j || existed) {   /* the text is nobody's: it goes */
            unlink(path);
            snprintf(path, sizeof path, "%s/%s.json", jobs_files_dir(), id);
            unlink(path);
        }
        pthread_mutex_unlock(&jobs_lock);
        rc = j ? reply_json(r, existed ? 200 : 201, o) : reply_error(r, status, "%s", err);
    }
    fetch_free(f);
    return rc;
}

static void *fetch_main(void *arg)
{
    fetch_t *f = arg;
    const char *url = json_string_value(json_object_get(f->req, "url"));
    if (fetch_url(url, f->tmp, srv.cfg.max_upload, "--max-upload", f->err, &f->status) == 0) {
        pthread_mutex_lock(&jobs_lock);
        f->file = file_store(f->tmp, NULL, url, f->err, &f->status);
        pthread_mutex_unlock(&jobs_lock);
        if (!f->file) unlink(f->tmp);
    }
    pthread_mutex_lock(&jobs_lock);
    fetches--;
    f->r->on_resume = fetch_done;
    f->r->resume_free = fetch_free;
    MHD_resume_connection(f->r->conn);
    pthread_mutex_unlock(&jobs_lock);
    return NULL;
}

/* Under jobs_lock (released): starts the fetch, or answers why not. */
static enum MHD_Result start_fetch(request_t *r, json_t *req)
{
    fetch_t *f = calloc(1, sizeof *f);
    if (!f) { pthread_mutex_unlock(&jobs_lock); return reply_error(r, 503, "out of memory"); }
    if (fetches >= MAX_FETCHES || jobs_stopping()) {
        pthread_mutex_unlock(&jobs_lock);
        free(f);
        return jobs_stopping() ? reply_error(r, 503, "the server is shutting down")
                               : reply_error(r, 429, "%d texts are being fetched already; retry later", MAX_FETCHES);
    }
    f->r = r;
    f->req = json_incref(req);
    random_id(".fetch-", f->err, sizeof f->err);
    snprintf(f->tmp, sizeof f->tmp, "%s/%s", jobs_files_dir(), f->err);
    f->err[0] = 0;
    if (http_wait_thread(r, fetch_main, f)) {
        pthread_mutex_unlock(&jobs_lock);
        json_decref(f->req);
        free(f);
        return reply_error(r, 503, "cannot start the fetch");
    }
    fetches++;
    pthread_mutex_unlock(&jobs_lock);
    return MHD_YES;
}

enum MHD_Result route_jobs_post(request_t *r)
{
    json_t *req = body_json(r);
    if (!req) return MHD_YES;
    char err[512], data[PATH_MAX];
    int status;
    train_cfg cfg;
    enum MHD_Result rc;
    if (jobs_validate(req, &cfg, err, &status)) goto bad;
    const char *id = json_string_value(json_object_get(req, "id"));
    const char *file = json_string_value(json_object_get(req, "file"));
    const char *path = json_string_value(json_object_get(req, "path"));
    pthread_mutex_lock(&jobs_lock);
    /* a retried submission is answered before anything is fetched */
    job_t *old = id ? jobs_find(id) : NULL;
    if (old && json_equal(old->request, req)) {
        json_t *o = job_json(old);
        pthread_mutex_unlock(&jobs_lock);
        json_decref(req);
        return reply_json(r, 200, o);
    }
    if (old) {
        pthread_mutex_unlock(&jobs_lock);
        status = 409;
        snprintf(err, sizeof err, "job '%s' exists with another request (an id names one submission)", id);
        goto bad;
    }
    if (file) {
        snprintf(data, sizeof data, "%s/%s", jobs_files_dir(), file);
        json_t *f = file_load(file);
        json_decref(f);
        if (!f) {
            pthread_mutex_unlock(&jobs_lock);
            status = 404;
            snprintf(err, sizeof err, "no file '%.64s' (upload it with POST /v1/files)", file);
            goto bad;
        }
        rc = submit_and_reply(r, req, data, file);
    } else if (path) {
        if (resolve_in_data_dir(path, data, sizeof data, err)) {
            pthread_mutex_unlock(&jobs_lock);
            status = 400;
            goto bad;
        }
        rc = submit_and_reply(r, req, data, NULL);
    } else {
        rc = start_fetch(r, req);
    }
    json_decref(req);
    return rc;
bad:
    json_decref(req);
    return reply_error(r, status, "%s", err);
}

/* ------------------------------------------------------------ reading jobs */

enum MHD_Result route_jobs_list(request_t *r)
{
    const char *st = query_arg(r, "status");
    if (st && strcmp(st, "queued") && strcmp(st, "running") && strcmp(st, "succeeded") && strcmp(st, "failed") &&
        strcmp(st, "cancelled"))
        return reply_error(r, 400, "status must be queued, running, succeeded, failed or cancelled");
    json_t *a = json_array();
    pthread_mutex_lock(&jobs_lock);
    for (job_t *j = jobs_list(); j; j = j->next)
        if (!st || strcmp(st, job_status_name(j->status)) == 0) json_array_append_new(a, job_json(j));
    pthread_mutex_unlock(&jobs_lock);
    return reply_json(r, 200, json_pack("{s:o}", "jobs", a));
}

enum MHD_Result route_jobs_get(request_t *r)
{
    pthread_mutex_lock(&jobs_lock);
    job_t *j = jobs_find(r->seg[2]);
    json_t *o = j ? job_json(j) : NULL;
    pthread_mutex_unlock(&jobs_lock);
    if (!j) return reply_error(r, 404, "no job '%.64s'", r->seg[2]);
    return reply_json(r, 200, o);
}

/* ACT (jobs_cancel, jobs_resume) on the job of the path; 200 and the job. */
static enum MHD_Result job_action(request_t *r, int (*act)(job_t *, char *, int *))
{
    char err[512];
    int status = 404;
    pthread_mutex_lock(&jobs_lock);
    job_t *j = jobs_find(r->seg[2]);
    int rc = j ? act(j, err, &status) : -1;
    json_t *o = j && rc == 0 ? job_json(j) : NULL;
    pthread_mutex_unlock(&jobs_lock);
    if (!j) return reply_error(r, 404, "no job '%.64s'", r->seg[2]);
    if (rc) return reply_error(r, status, "%s", err);
    return reply_json(r, 200, o);
}

enum MHD_Result route_jobs_cancel(request_t *r) { return job_action(r, jobs_cancel); }
enum MHD_Result route_jobs_resume(request_t *r) { return job_action(r, jobs_resume); }

enum MHD_Result route_jobs_delete(request_t *r)
{
    char err[512];
    int status = 404;
    pthread_mutex_lock(&jobs_lock);
    job_t *j = jobs_find(r->seg[2]);
    int rc = j ? jobs_delete(j, err, &status) : -1;
    pthread_mutex_unlock(&jobs_lock);
    if (!j) return reply_error(r, 404, "no job '%.64s'", r->seg[2]);
    if (rc) return reply_error(r, status, "%s", err);
    return reply_json(r, 200, json_pack("{s:s}", "deleted", r->seg[2]));   /* the id, as jobs_find matched it */
}

/* The job's last checkpoint, as the trainer wrote it (a file renamed into
 * place: the one opened here is whole even while a newer one is written). */
enum MHD_Result route_jobs_checkpoint(request_t *r)
{
    char path[PATH_MAX], name[NAME_MAX_LEN + 32];
    pthread_mutex_lock(&jobs_lock);
    job_t *j = jobs_find(r->seg[2]);
    if (j) {
        job_path(j, "model.safetensors", path, sizeof path);
        snprintf(name, sizeof name, "%s.safetensors", j->id);
    }
    int fd = j ? open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
    pthread_mutex_unlock(&jobs_lock);
    if (!j) return reply_error(r, 404, "no job '%.64s'", r->seg[2]);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        return reply_error(r, 404, "job '%.64s' has no checkpoint yet", r->seg[2]);
    }
    return reply_file(r, fd, (size_t)st.st_size, "application/octet-stream", name);
}

/* A query argument that must be an integer in [LO, HI]; -1 (replied) when bad. */
static int query_long(request_t *r, const char *key, long lo, long hi, long dflt, long *out)
{
    const char *v = query_arg(r, key);
    *out = dflt;
    if (!v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        reply_error(r, 400, "%s must be an integer in [%ld, %ld]", key, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* The event name of a progress line: its "event" if it is a plain word. */
static void event_name(json_t *e, char *buf, size_t cap)
{
    const char *s = json_string_value(json_object_get(e, "event"));
    size_t n = s ? strlen(s) : 0;
    int ok = n > 0 && n < cap;
    for (size_t i = 0; ok && i < n; i++) ok = (s[i] >= 'a' && s[i] <= 'z') || s[i] == '_';
    snprintf(buf, cap, "%s", ok ? s : "progress");
}

/* Calls FN on each complete line of the log from byte *OFF, advancing it,
 * until FN returns nonzero or the lines end. */
static void log_lines(const char *path, off_t *off, int (*fn)(void *ctx, const char *line, size_t n), void *ctx)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[1 << 16];
    for (;;) {
        ssize_t n = pread(fd, buf, sizeof buf, *off);
        if (n <= 0) break;
        char *p = buf, *end = buf + n, *nl;
        int stop = 0;
        while (!stop && (nl = memchr(p, '\n', (size_t)(end - p)))) {
            stop = fn(ctx, p, (size_t)(nl - p));
            *off += nl + 1 - p;
            p = nl + 1;
        }
        if (stop) break;
        if (p == buf && n == (ssize_t)sizeof buf) { *off += n; continue; }   /* an overlong line: skipped */
        if (n < (ssize_t)sizeof buf) break;
    }
    close(fd);
}

typedef struct {
    long line, after, limit;
    json_t *events;
} collect_t;

static int collect_line(void *ctx, const char *line, size_t n)
{
    collect_t *c = ctx;
    if (c->line++ < c->after) return 0;
    if ((long)json_array_size(c->events) == c->limit) { c->line--; return 1; }
    json_t *e = json_loadb(line, n, 0, NULL);
    json_array_append_new(c->events, e ? e : json_string("(not JSON)"));
    return 0;
}

/* ------------------------------------------------------------ the event stream */

typedef struct {
    job_watcher w;               /* in the job's list while the stream lives */
    job_t *job;
    char log[PATH_MAX];
    off_t off;                   /* bytes of the log sent */
    long line, after;            /* lines seen; lines to skip */
    char *out;                   /* formatted events not yet handed out */
    size_t out_len, out_pos;
    int phase;                   /* 0: the job's first object to send; 1: following; 2: done */
    double sent;                 /* when bytes last went out (monotonic) */
} stream_t;

static int stream_line(void *ctx, const char *line, size_t n)
{
    stream_t *s = ctx;
    if (s->line++ < s->after) return 0;
    json_t *e = json_loadb(line, n, 0, NULL);
    char name[32];
    event_name(e, name, sizeof name);
    char *d = e ? json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(e);
    if (d) sse_format(&s->out, &s->out_len, name, d, s->line);   /* its id: the lines sent, Last-Event-ID's after */
    free(d);
    return s->out_len > (1 << 16);   /* enough for one turn */
}

static void stream_job_event(stream_t *s)
{
    json_t *o = job_json(s->job);
    char *d = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(o);
    if (d) sse_format(&s->out, &s->out_len, "job", d, -1);
    free(d);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream_t *s = cls;
    ssize_t n = 0;
    pthread_mutex_lock(&jobs_lock);
    if (s->out_pos == s->out_len) {
        s->out_pos = s->out_len = 0;
        if (s->phase == 0) {
            stream_job_event(s);
            s->phase = 1;
        } else if (s->phase == 1) {
            struct stat st;
            if (stat(s->log, &st) == 0 && st.st_size < s->off) s->off = 0, s->line = 0;   /* a fresh run's log */
            log_lines(s->log, &s->off, stream_line, s);
            /* the process has ended before the job is terminal: its whole log is read */
            if (s->out_len == 0 && job_is_terminal(s->job)) {
                stream_job_event(s);
                s->phase = 2;
            }
        }
    }
    if (s->out_pos < s->out_len) {
        n = (ssize_t)(s->out_len - s->out_pos < max ? s->out_len - s->out_pos : max);
        memcpy(buf, s->out + s->out_pos, (size_t)n);
        s->out_pos += (size_t)n;
    } else if (s->phase == 2 || jobs_stopping()) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (srv.cfg.sse_keepalive > 0 && now_s() - s->sent >= srv.cfg.sse_keepalive) {
        static const char ping[] = ": keep-alive\n\n";   /* a comment: EventSource clients ignore it */
        n = (ssize_t)(sizeof ping - 1 < max ? sizeof ping - 1 : max);
        memcpy(buf, ping, (size_t)n);
    } else {
        s->w.waiting = 1;
        s->w.since = now_s();
        MHD_suspend_connection(s->w.conn);
    }
    if (n > 0) s->sent = now_s();
    pthread_mutex_unlock(&jobs_lock);
    return n;
}

static void stream_free(void *cls)
{
    stream_t *s = cls;
    pthread_mutex_lock(&jobs_lock);
    jobs_unwatch(s->job, &s->w);
    pthread_mutex_unlock(&jobs_lock);
    free(s->out);
    free(s);
}

static int wants_stream(request_t *r, int *bad)
{
    const char *q = query_arg(r, "stream");
    *bad = 0;
    if (q) {
        if (strcmp(q, "true") == 0) return 1;
        if (strcmp(q, "false") == 0) return 0;
        *bad = 1;
        return 0;
    }
    const char *acc = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Accept");
    return acc && strstr(acc, "text/event-stream") != NULL;
}

enum MHD_Result route_jobs_events(request_t *r)
{
    long after, limit;
    int bad;
    int stream = wants_stream(r, &bad);
    if (bad) return reply_error(r, 400, "stream must be true or false");
    if (query_long(r, "after", 0, LONG_MAX, 0, &after) || query_long(r, "limit", 1, EVENTS_MAX, EVENTS_DEFAULT, &limit))
        return MHD_YES;
    /* an EventSource that reconnects names the last line it had */
    const char *last = stream ? MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Last-Event-ID") : NULL;
    if (last && !query_arg(r, "after")) {
        char *end;
        errno = 0;
        long x = strtol(last, &end, 10);
        if (errno || end == last || *end || x < 0) return reply_error(r, 400, "Last-Event-ID must be a line count (an id this stream sent)");
        after = x;
    }
    pthread_mutex_lock(&jobs_lock);
    job_t *j = jobs_find(r->seg[2]);
    if (!j) {
        pthread_mutex_unlock(&jobs_lock);
        return reply_error(r, 404, "no job '%.64s'", r->seg[2]);
    }
    if (!stream) {
        char log[PATH_MAX];
        job_path(j, "train.log", log, sizeof log);
        collect_t c = {0, after, limit, json_array()};
        off_t off = 0;
        log_lines(log, &off, collect_line, &c);
        json_t *o = json_pack("{s:s, s:s, s:o, s:I, s:b}", "id", j->id, "status", job_status_name(j->status), "events",
                              c.events, "next", (json_int_t)(c.line > after ? c.line : after), "more",
                              (long)json_array_size(c.events) == limit);
        pthread_mutex_unlock(&jobs_lock);
        /* the trainer's numbers as it wrote them (17 digits), as the stream sends them */
        char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        json_decref(o);
        if (!text) return reply_error(r, 500, "out of memory");
        enum MHD_Result rc = reply_bytes(r, 200, "application/json", text, strlen(text));
        free(text);
        return rc;
    }
    stream_t *s = calloc(1, sizeof *s);
    if (!s) {
        pthread_mutex_unlock(&jobs_lock);
        return reply_error(r, 503, "out of memory");
    }
    s->job = j;
    s->after = after;
    s->w.conn = r->conn;
    s->sent = now_s();
    job_path(j, "train.log", s->log, sizeof s->log);
    jobs_watch(j, &s->w);
    pthread_mutex_unlock(&jobs_lock);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, s, stream_free);
    if (!resp) {
        stream_free(s);
        return reply_error(r, 503, "out of memory");
    }
    return reply_event_stream(r, resp);
}

/* ------------------------------------------------------------ the picture */

typedef struct {
    const char *key;     /* what the family's progress lines carry (train_family.history_kind) */
    json_t *points;
} svg_collect_t;

static int svg_line(void *ctx, const char *line, size_t n)
{
    svg_collect_t *c = ctx;
    json_t *e = json_loadb(line, n, 0, NULL);
    const char *ev = json_string_value(json_object_get(e, "event"));
    const char *key = c->key;
    if (ev && (strcmp(ev, "train") == 0 || strcmp(ev, "arch_fixed") == 0) && json_is_array(json_object_get(e, key)))
        json_array_append_new(c->points, json_pack("{s:O, s:O}", "step", json_object_get(e, "step"), key,
                                                   json_object_get(e, key)));
    json_decref(e);
    return 0;
}

enum MHD_Result route_jobs_svg(request_t *r)
{
    pthread_mutex_lock(&jobs_lock);
    job_t *j = jobs_find(r->seg[2]);
    if (!j) {
        pthread_mutex_unlock(&jobs_lock);
        return reply_error(r, 404, "no job '%.64s'", r->seg[2]);
    }
    char log[PATH_MAX], title[160];
    job_path(j, "train.log", log, sizeof log);
    svg_collect_t c = {j->fam->history_kind, json_array()};
    off_t off = 0;
    log_lines(log, &off, svg_line, &c);
    snprintf(title, sizeof title, "job %s (%s, %s)", j->id, j->fam->name, job_status_name(j->status));
    pthread_mutex_unlock(&jobs_lock);
    char *svg = svg_training(title, c.key, c.points);
    json_decref(c.points);
    if (!svg) return reply_error(r, 500, "out of memory");
    enum MHD_Result rc = reply_bytes(r, 200, "image/svg+xml", svg, strlen(svg));
    free(svg);
    return rc;
}
