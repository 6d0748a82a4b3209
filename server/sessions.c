/*
 * sessions.c - the session store: each session is one stream's memory on
 * the server, for one model.
 *
 * Live sessions are held in memory up to --session-memory bytes; past it the
 * least recently used idle ones are written to the state directory and
 * freed, and read back on their next use. On shutdown every session is
 * written; on start the state directory is read again, so a restart loses
 * none. On disk, per session:
 *   STATE/sessions/ID.json   {"id", "model", "created", "last_used"}
 *   STATE/sessions/ID.mem    the memory (mem_serialize; names the model's fingerprint)
 * Both written to a temporary name and renamed. Everything here runs under
 * srv.lock.
 */
#define _GNU_SOURCE
#include "server.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static unsigned long id_counter;
static uint64_t use_counter;   /* orders uses exactly, for the LRU: last_used has seconds only */

static void sess_path(char *buf, size_t cap, const char *id, const char *ext)
{
    snprintf(buf, cap, "%s/sessions/%s.%s", srv.cfg.state_dir, id, ext);
}

static int write_file(const char *path, const void *data, size_t len)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t k = write(fd, p, left);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { close(fd); unlink(tmp); return -1; }
        p += k;
        left -= (size_t)k;
    }
    if (fsync(fd) != 0 || close(fd) != 0) { unlink(tmp); return -1; }
    return rename(tmp, path);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0 || st.st_size > (1LL << 34)) { fclose(f); return NULL; }
    char *b = malloc((size_t)st.st_size + 1);
    if (b && fread(b, 1, (size_t)st.st_size, f) != (size_t)st.st_size) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[st.st_size] = 0; *len = (size_t)st.st_size; }
    return b;
}

static void iso_time(char *buf, size_t cap, time_t t)
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int write_meta(const session_t *s)
{
    char path[1100];
    sess_path(path, sizeof path, s->id, "json");
    json_t *j = json_pack("{s:s, s:s, s:I, s:I}", "id", s->id, "model", s->model->name, "created",
                          (json_int_t)s->created, "last_used", (json_int_t)s->last_used);
    char *txt = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    int rc = txt ? write_file(path, txt, strlen(txt)) : -1;
    free(txt);
    return rc;
}

/* Writes S's memory and metadata to disk. */
static int sess_write(const session_t *s)
{
    if (!s->mem) return 0;   /* on disk already */
    char path[1100];
    size_t n = mem_serial_size(s->mem);
    void *buf = malloc(n);
    if (!buf) return -1;
    mem_serialize(s->mem, buf, n);
    sess_path(path, sizeof path, s->id, "mem");
    int rc = write_file(path, buf, n);
    free(buf);
    if (rc == 0) rc = write_meta(s);
    if (rc) log_line("session %s: cannot write to %s: %s", s->id, srv.cfg.state_dir, strerror(errno));
    return rc;
}

/* Reads S's memory back from disk. */
static int sess_read(session_t *s, char *err)
{
    char path[1100];
    size_t n = 0;
    sess_path(path, sizeof path, s->id, "mem");
    char *buf = read_file(path, &n);
    mem_t *m = mem_new(s->model->m);
    if (!buf || !m) {
        free(buf);
        mem_free(m);
        return snprintf(err, 512, "session %s: its saved memory cannot be read (%s)", s->id, path), -1;
    }
    char e2[ERR_LEN];
    if (mem_deserialize(m, buf, n, e2)) {
        free(buf);
        mem_free(m);
        return snprintf(err, 512, "session %s: its saved memory is unusable: %s", s->id, e2), -1;
    }
    free(buf);
    s->mem = m;
    /* the live memory is the session now: a copy left on disk would bring
     * it back from this older point after a crash */
    unlink(path);
    sess_path(path, sizeof path, s->id, "json");
    unlink(path);
    return 0;
}

size_t sess_live_bytes(void)
{
    size_t b = 0;
    for (session_t *s = srv.sessions; s; s = s->next)
        if (s->mem) b += s->mem->n_floats * sizeof(float);
    return b;
}

int sess_count(int on_disk)
{
    int n = 0;
    for (session_t *s = srv.sessions; s; s = s->next) n += on_disk ? !s->mem : !!s->mem;
    return n;
}

/* Spills the least recently used idle sessions while over the budget. */
static void enforce_budget(void)
{
    while (sess_live_bytes() > srv.cfg.session_memory) {
        session_t *lru = NULL;
        for (session_t *s = srv.sessions; s; s = s->next)
            if (s->mem && !s->busy && (!lru || s->use_seq < lru->use_seq)) lru = s;
        if (!lru || sess_write(lru)) return;
        mem_free(lru->mem);
        lru->mem = NULL;
    }
}

session_t *sess_find(const char *id)
{
    for (session_t *s = srv.sessions; s; s = s->next)
        if (strcmp(s->id, id) == 0) return s;
    return NULL;
}

session_t *sess_create(smodel_t *sm, const char *id, char *err, int *status)
{
    char gen[NAME_MAX_LEN + 1];
    if (id) {
        if (!valid_name(id)) {
            *status = 400;
            snprintf(err, 512, "id must be 1 to 64 of A-Z a-z 0-9 . _ - (and not . or ..)");
            return NULL;
        }
        char path[1100];
        sess_path(path, sizeof path, id, "json");
        if (sess_find(id) || access(path, F_OK) == 0) {
            *status = 409;
            snprintf(err, 512, "session '%s' exists%s", id,
                     sess_find(id) ? "" : " in the state directory (its model is not loaded)");
            return NULL;
        }
    } else {
        do snprintf(gen, sizeof gen, "s-%lx-%lx", (unsigned long)time(NULL), ++id_counter);
        while (sess_find(gen));
        id = gen;
    }
    session_t *s = calloc(1, sizeof *s);
    if (s) s->mem = mem_new(sm->m);
    if (!s || !s->mem) {
        free(s);
        *status = 503;
        snprintf(err, 512, "out of memory for a session of %s", sm->name);
        return NULL;
    }
    snprintf(s->id, sizeof s->id, "%s", id);
    s->model = sm;
    s->created = s->last_used = time(NULL);
    s->use_seq = ++use_counter;
    s->next = srv.sessions;
    srv.sessions = s;
    enforce_budget();
    return s;
}

int sess_acquire(session_t *s, char *err, int *status)
{
    if (s->busy) {
        *status = 409;
        return snprintf(err, 512, "session '%s' is busy with another request", s->id), -1;
    }
    if (!s->mem && sess_read(s, err)) {
        *status = 500;
        return -1;
    }
    s->busy = 1;
    s->last_used = time(NULL);
    s->use_seq = ++use_counter;
    return 0;
}

static void sess_free(session_t *s)
{
    char path[1100];
    sess_path(path, sizeof path, s->id, "mem");
    unlink(path);
    sess_path(path, sizeof path, s->id, "json");
    unlink(path);
    mem_free(s->mem);
    free(s);
}

static void unlink_session(session_t *s)
{
    session_t **p = &srv.sessions;
    while (*p && *p != s) p = &(*p)->next;
    if (*p) *p = s->next;
}

void sess_release(session_t *s)
{
    s->busy = 0;
    s->last_used = time(NULL);
    s->use_seq = ++use_counter;
    enforce_budget();
}

int sess_delete(const char *id, char *err, int *status)
{
    session_t *s = sess_find(id);
    if (!s) {
        *status = 404;
        return snprintf(err, 512, "no session '%s'", id), -1;
    }
    if (s->busy) {   /* requests on a session are serialised: so is its deletion */
        *status = 409;
        return snprintf(err, 512, "session '%s' is busy with a request; delete it when that ends", id), -1;
    }
    unlink_session(s);
    sess_free(s);
    return 0;
}

void sess_delete_model(smodel_t *sm)
{
    for (session_t *s = srv.sessions, *nx; s; s = nx) {
        nx = s->next;
        if (s->model != sm) continue;
        unlink_session(s);
        sess_free(s);
    }
}

json_t *sess_json(const session_t *s)
{
    char c[32], u[32];
    iso_time(c, sizeof c, s->created);
    iso_time(u, sizeof u, s->last_used);
    json_int_t seen = 0;
    if (s->mem) seen = (json_int_t)(s->mem->pos + (s->mem->pending >= 0));
    else {
        /* on disk: the count is in the saved header (bytes 16..24 and 24..28) */
        char path[1100];
        sess_path(path, sizeof path, s->id, "mem");
        FILE *f = fopen(path, "rb");
        unsigned char h[28];
        if (f && fread(h, 1, 28, f) == 28) {
            int64_t pos;
            int32_t pend;
            memcpy(&pos, h + 16, 8);
            memcpy(&pend, h + 24, 4);
            seen = (json_int_t)(pos + (pend >= 0));
        }
        if (f) fclose(f);
    }
    return json_pack("{s:s, s:s, s:I, s:I, s:s, s:s, s:s}", "id", s->id, "model", s->model->name, "tokens_seen", seen,
                     "memory_bytes", (json_int_t)mem_bytes(s->model->m), "created", c, "last_used", u, "location",
                     s->mem ? "memory" : "disk");
}

json_t *sess_list_json(void)
{
    json_t *a = json_array();
    for (session_t *s = srv.sessions; s; s = s->next) json_array_append_new(a, sess_json(s));
    return json_pack("{s:o}", "sessions", a);
}

int sess_save_all(void)
{
    int bad = 0;
    for (session_t *s = srv.sessions; s; s = s->next) bad |= sess_write(s) != 0;
    return bad ? -1 : 0;
}

/* Does the saved memory at PATH belong to model M (fingerprint and size)? */
static int state_matches(const char *path, const model_t *m)
{
    FILE *f = fopen(path, "rb");
    unsigned char h[40];
    int ok = f && fread(h, 1, sizeof h, f) == sizeof h;
    if (f) fclose(f);
    if (!ok) return 0;
    uint64_t fp, nf;
    memcpy(&fp, h + 8, 8);
    memcpy(&nf, h + 32, 8);
    mem_t *probe = mem_new(m);
    ok = probe && fp == m->fingerprint && nf == probe->n_floats;
    mem_free(probe);
    return ok;
}

/* Finds the sessions saved in the state directory for model ONLY (every
 * loaded model when NULL); their memories are read on first use. Sessions of
 * models not loaded, or saved by different weights or memory mode, are left
 * on disk. */
int sess_load_all(smodel_t *only)
{
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/sessions", srv.cfg.state_dir);
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0) continue;
        char path[1400], mpath[1400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        json_t *j = json_load_file(path, 0, NULL);
        const char *id = json_string_value(json_object_get(j, "id"));
        const char *model = json_string_value(json_object_get(j, "model"));
        smodel_t *sm = model ? models_find(model) : NULL;
        if (only && sm != only) {
            json_decref(j);
            continue;
        }
        if (id) snprintf(mpath, sizeof mpath, "%s/%s.mem", dir, id);
        if (!id || !valid_name(id) || sess_find(id)) {
            log_line("state: skipping %s: not a session file", path);
        } else if (!sm) {
            log_line("state: session %s belongs to model '%s', which is not loaded: left on disk", id, model ? model : "?");
        } else if (!state_matches(mpath, sm->m)) {
            log_line("state: session %s was saved by other weights or another --memory mode of '%s': left on disk", id,
                     model);
        } else {
            session_t *s = calloc(1, sizeof *s);
            if (s) {
                snprintf(s->id, sizeof s->id, "%s", id);
                s->model = sm;
                s->created = (time_t)json_integer_value(json_object_get(j, "created"));
                s->last_used = (time_t)json_integer_value(json_object_get(j, "last_used"));
                s->use_seq = 0;   /* on disk: ordered once it is read back */
                s->next = srv.sessions;
                srv.sessions = s;
                n++;
            }
        }
        json_decref(j);
    }
    closedir(d);
    return n;
}
