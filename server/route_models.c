/*
 * route_models.c - /v1/models: list, describe, load at run time (a path in
 * --model-dir, or an https URL; with a chat template), unload, and the spans
 * report or picture. The list and the model objects have OpenAI's shape
 * ({"object": "list", "data": [...]}; id, object, created, owned_by), so
 * that OpenAI clients read them, with spanserve's fields beside.
 *
 * A download never writes over a file of the model directory: it goes to a
 * hidden temporary file there, is loaded from it (a file that is not a valid
 * model goes no further), and only then takes its name NAME.safetensors,
 * with link(), which fails when the name exists, or, when the request says
 * "replace", with rename(), which replaces the old file in one step. Errors
 * name files relative to the model directory: clients never learn where it
 * is, nor the temporary names.
 */
#define _GNU_SOURCE
#include "server.h"
#include "jobs.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "report.h"

enum MHD_Result route_models_list(request_t *r)
{
    json_t *a = json_array();
    pthread_mutex_lock(&srv.lock);
    for (smodel_t *m = srv.models; m; m = m->next) json_array_append_new(a, models_json(m));
    pthread_mutex_unlock(&srv.lock);
    return reply_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", a));   /* OpenAI's list */
}

enum MHD_Result route_models_get(request_t *r)
{
    pthread_mutex_lock(&srv.lock);
    smodel_t *m = models_find(r->seg[2]);
    json_t *j = m ? models_json(m) : NULL;
    pthread_mutex_unlock(&srv.lock);
    if (!j) return reply_error(r, 404, "no model '%.64s'", r->seg[2]);
    return reply_json(r, 200, j);
}

enum MHD_Result route_models_spans(request_t *r)
{
    const char *fmt = query_arg(r, "format");
    if (fmt && strcmp(fmt, "svg") != 0 && strcmp(fmt, "json") != 0)
        return reply_error(r, 400, "format must be json or svg");
    pthread_mutex_lock(&srv.lock);
    smodel_t *m = models_find(r->seg[2]);
    json_t *j = NULL;
    char *svg = NULL;
    if (m && fmt && strcmp(fmt, "svg") == 0) svg = svg_spans(m->m);
    else if (m) j = report_spans(m->m);
    pthread_mutex_unlock(&srv.lock);
    if (!m) return reply_error(r, 404, "no model '%.64s'", r->seg[2]);
    if (svg) {
        enum MHD_Result rc = reply_bytes(r, 200, "image/svg+xml", svg, strlen(svg));
        free(svg);
        return rc;
    }
    if (!j) return reply_error(r, 500, "out of memory");
    json_object_set_new(j, "model", json_string(m->name));
    return reply_json(r, 200, j);
}

/* PATH must name a regular file inside --model-dir, links resolved. */
static int resolve_in_model_dir(const char *path, char *out, size_t cap, char *err)
{
    if (!srv.cfg.model_dir) return snprintf(err, 512, "loading by path needs the server started with --model-dir"), -1;
    if (!*path || path[0] == '/') return snprintf(err, 512, "path must be relative to the model directory"), -1;
    for (const char *p = path; *p; p++)
        if (p[0] == '.' && p[1] == '.' && (p == path || p[-1] == '/') && (p[2] == '/' || p[2] == 0))
            return snprintf(err, 512, "path must not contain '..'"), -1;
    char joined[PATH_MAX];
    snprintf(joined, sizeof joined, "%s/%s", srv.cfg.model_dir, path);
    char *real = realpath(joined, NULL);
    if (!real) return snprintf(err, 512, "%s: %s", path, strerror(errno)), -1;
    size_t n = strlen(srv.cfg.model_dir);
    struct stat st;
    int inside = strncmp(real, srv.cfg.model_dir, n) == 0 && real[n] == '/';
    int regular = stat(real, &st) == 0 && S_ISREG(st.st_mode);
    if (inside && regular) snprintf(out, cap, "%s", real);
    free(real);
    if (!inside) return snprintf(err, 512, "path resolves outside the model directory"), -1;
    if (!regular) return snprintf(err, 512, "%s is not a regular file", path), -1;
    return 0;
}

/* The temporary name of a download: hidden, and never NAME.safetensors,
 * the name of a model file. */
#define DOWNLOAD_PREFIX ".download-"

int models_dir_clean(void)
{
    DIR *d = opendir(srv.cfg.model_dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *x = e->d_name + strlen(DOWNLOAD_PREFIX);
        if (strncmp(e->d_name, DOWNLOAD_PREFIX, strlen(DOWNLOAD_PREFIX)) != 0 || strlen(x) != 16 || strspn(x, "0123456789abcdef") != 16)
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", srv.cfg.model_dir, e->d_name);
        n += unlink(path) == 0;
    }
    if (d) closedir(d);
    return n;
}

/* NAME.safetensors exists in the model directory: 409, unless replacing. */
static int model_file_taken(const char *name, char *err, int *status)
{
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s.safetensors", srv.cfg.model_dir, name);
    if (lstat(path, &st) != 0) return 0;
    *status = 409;
    return snprintf(err, 512, "the model directory has a file %s.safetensors already; send \"replace\": true to replace it", name), -1;
}

/* Downloads run on a thread of their own, so a slow or silent host never
 * holds an HTTP thread: the connection waits suspended. */
#define MAX_DOWNLOADS 2

typedef struct {
    request_t *r;
    char name[NAME_MAX_LEN + 1];
    char *url;
    char *settings;              /* JSON text, or NULL */
    int replace;
    chat_template_t chat;
    char tmp[PATH_MAX];          /* the temporary file, in the model directory */
    int status;
    json_t *result;
    char err[512];
} download_t;

static void download_free(void *ctx)
{
    download_t *d = ctx;
    json_decref(d->result);
    free(d->url);
    free(d->settings);
    free(d);
}

static enum MHD_Result download_done(request_t *r)
{
    download_t *d = r->resume_ctx;
    enum MHD_Result rc = d->result ? reply_json(r, 201, d->result) : reply_error(r, d->status, "%s", d->err);
    d->result = NULL;   /* reply_json took it */
    download_free(d);
    r->on_resume = NULL;
    r->resume_ctx = NULL;
    return rc;
}

/* M, loaded, with the chat template CT, which its vocabulary must be able
 * to write (422, and M unloaded). */
static int template_fits(model_t *m, const chat_template_t *ct, char *err, int *status)
{
    if (chat_template_check(ct, &m->vocab, err) == 0) return 0;
    models_unload(m);
    *status = 422;
    return -1;
}

/* The download, valid, as the model D->name in the file NAME.safetensors.
 * Under srv.lock: no other load of the name comes between the checks and
 * the move. */
static smodel_t *download_install(download_t *d)
{
    if (models_name_free(d->name, d->err, &d->status)) return NULL;
    model_t *m = models_load(d->name, d->tmp, "the downloaded file", d->settings, d->err, &d->status);
    if (!m || template_fits(m, &d->chat, d->err, &d->status)) return NULL;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.safetensors", srv.cfg.model_dir, d->name);
    if ((d->replace ? rename(d->tmp, path) : link(d->tmp, path)) != 0) {
        int e = errno;
        if (e == EEXIST && !d->replace) model_file_taken(d->name, d->err, &d->status);
        else {
            log_line("model %s: cannot move the download %s to %s: %s", d->name, d->tmp, path, strerror(e));
            d->status = 500;
            snprintf(d->err, sizeof d->err, "cannot put the download in the model directory as %s.safetensors: %s", d->name,
                     strerror(e));
        }
        models_unload(m);
        return NULL;
    }
    smodel_t *sm = models_insert(d->name, m, path, d->err, &d->status);
    if (sm) sm->chat = d->chat;
    return sm;
}

static void *download_main(void *arg)
{
    download_t *d = arg;
    if (fetch_url(d->url, d->tmp, srv.cfg.max_download, "--max-download", d->err, &d->status) == 0) {
        pthread_mutex_lock(&srv.lock);
        smodel_t *sm = download_install(d);
        if (sm) d->result = models_json(sm);
        pthread_mutex_unlock(&srv.lock);
        unlink(d->tmp);   /* linked into place, renamed (then gone already), or refused */
    }
    pthread_mutex_lock(&srv.lock);
    srv.downloads--;
    d->r->on_resume = download_done;
    d->r->resume_free = download_free;
    MHD_resume_connection(d->r->conn);
    pthread_mutex_unlock(&srv.lock);
    return NULL;
}

static enum MHD_Result start_download(request_t *r, const char *name, const char *url, int replace,
                                      const chat_template_t *chat, const char *settings, char *err, int *status)
{
    download_t *d = calloc(1, sizeof *d);
    if (!d || !(d->url = strdup(url)) || (settings && !(d->settings = strdup(settings)))) {
        if (d) free(d->url);
        free(d);
        *status = 503;
        snprintf(err, 512, "out of memory");
        return MHD_NO;
    }
    d->r = r;
    d->replace = replace;
    d->chat = *chat;
    snprintf(d->name, sizeof d->name, "%s", name);
    char tmp[64];
    random_id(DOWNLOAD_PREFIX, tmp, sizeof tmp);
    snprintf(d->tmp, sizeof d->tmp, "%s/%s", srv.cfg.model_dir, tmp);
    pthread_mutex_lock(&srv.lock);
    if (srv.downloads >= MAX_DOWNLOADS || srv.draining) {
        pthread_mutex_unlock(&srv.lock);
        free(d->url);
        free(d->settings);
        free(d);
        *status = srv.draining ? 503 : 429;
        snprintf(err, 512, "%s", srv.draining ? "the server is shutting down" : "two downloads are running already; retry later");
        return MHD_NO;
    }
    if (http_wait_thread(r, download_main, d)) {
        pthread_mutex_unlock(&srv.lock);
        free(d->url);
        free(d->settings);
        free(d);
        *status = 503;
        snprintf(err, 512, "cannot start the download");
        return MHD_NO;
    }
    srv.downloads++;
    pthread_mutex_unlock(&srv.lock);
    return MHD_YES;
}

enum MHD_Result route_models_post(request_t *r)
{
    json_t *b = body_json(r);
    if (!b) return MHD_YES;
    char err[512], path[PATH_MAX];
    const char *name, *p, *url;
    int status = 400, replace;
    enum MHD_Result rc;
    chat_template_t chat;
    char *settings = NULL;
    if (field_str(b, "name", &name, err) || field_str(b, "path", &p, err) || field_str(b, "url", &url, err) ||
        field_bool(b, "replace", 0, &replace, err) || chat_template_parse(json_object_get(b, "chat_template"), &chat, err))
        goto bad;
    json_t *sj = json_object_get(b, "settings");
    if (sj && !json_is_object(sj)) { snprintf(err, sizeof err, "settings must be an object of config keys"); goto bad; }
    if (sj && !(settings = json_dumps(sj, JSON_COMPACT))) { status = 503; snprintf(err, sizeof err, "out of memory"); goto bad; }
    if (!name || !valid_name(name)) { snprintf(err, sizeof err, "name must be 1 to 64 of A-Z a-z 0-9 . _ - (and not . or ..)"); goto bad; }
    if (!p == !url) { snprintf(err, sizeof err, "give either path or url"); goto bad; }
    if (p && replace) { snprintf(err, sizeof err, "replace is for url: a path names a file in the model directory already"); goto bad; }
    pthread_mutex_lock(&srv.lock);
    int taken = models_find(name) != NULL;
    pthread_mutex_unlock(&srv.lock);
    if (taken) { status = 409; snprintf(err, sizeof err, "model '%s' is loaded already", name); goto bad; }
    if (p) {
        if (resolve_in_model_dir(p, path, sizeof path, err)) goto bad;
    } else {
        if (!srv.cfg.model_dir) { snprintf(err, sizeof err, "loading by url needs the server started with --model-dir"); goto bad; }
        if (strncmp(url, "https://", 8) != 0) { snprintf(err, sizeof err, "url must be https://"); goto bad; }
        /* before the download, to spare it; download_install decides */
        if (!replace && model_file_taken(name, err, &status)) goto bad;
        rc = start_download(r, name, url, replace, &chat, settings, err, &status);
        free(settings);
        json_decref(b);
        return rc == MHD_YES ? MHD_YES : reply_error(r, status, "%s", err);
    }
    pthread_mutex_lock(&srv.lock);
    smodel_t *sm = NULL;
    if (!models_name_free(name, err, &status)) {   /* models_add, with the template checked before it serves */
        model_t *m = models_load(name, path, p, settings, err, &status);
        if (m && !template_fits(m, &chat, err, &status) && (sm = models_insert(name, m, path, err, &status)))
            sm->chat = chat;
    }
    json_t *j = sm ? models_json(sm) : NULL;
    pthread_mutex_unlock(&srv.lock);
    free(settings);
    json_decref(b);
    if (!sm) return reply_error(r, status, "%s", err);
    return reply_json(r, 201, j);
bad:
    free(settings);
    json_decref(b);
    rc = reply_error(r, status, "%s", err);
    return rc;
}

enum MHD_Result route_models_delete(request_t *r)
{
    char err[512];
    int status;
    pthread_mutex_lock(&srv.lock);
    int rc = models_remove(r->seg[2], err, &status);
    pthread_mutex_unlock(&srv.lock);
    if (rc) return reply_error(r, status, "%s", err);
    return reply_json(r, 200, json_pack("{s:s}", "deleted", r->seg[2]));
}
