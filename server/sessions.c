/*
 * sessions.c - the session store: each session is one stream's memory on
 * the server, for one model, kept in the state directory so that neither a
 * restart nor a crash loses it.
 *
 * On disk, per session:
 *   STATE/sessions/ID.json   {"id", "model", "created", "last_used"}: the session exists
 *   STATE/sessions/ID.mem    its memory (mem_serialize; names the model's fingerprint);
 *                            none yet: the memory of a new stream
 * each written to ID.*.tmp and renamed over the old one.
 *
 * Durability (--durability):
 *   fsync  (default) a request that changed a session writes its memory
 *          before its answer is sent (fdatasync, rename, fsync of the
 *          directory); a new session's .json likewise. A crash of the process
 *          or of the machine loses at most the requests in flight.
 *   write  the same without the syncs: survives the process dying (kill -9,
 *          OOM), not the machine.
 *   off    memories are written when spilled and on shutdown only: a crash
 *          loses what changed since.
 * The writes of completed requests run on a thread of their own (the state
 * writer), many files a round with one directory sync; the session stays
 * acquired, and the answer waits, until its write ended.
 *
 * A request that does not complete (an error, the client gone, a timeout,
 * the drain) leaves its session as it was before the request: rolled back
 * to its disk copy, or to a snapshot taken when the request began where the
 * disk copy is not that state (durability off, or a session whose last
 * write failed).
 *
 * A write that fails (a full disk) never drops the only copy: the session
 * stays in memory, marked dirty, past --session-memory if need be; new
 * sessions are refused with 507 until a write succeeds; the writer retries
 * the dirty sessions once a second; /metrics and /readyz say so.
 *
 * Live sessions are held in memory up to --session-memory bytes; past it the
 * least recently used idle ones are spilled (written if dirty, then freed)
 * and read back on their next use. Everything here runs under srv.lock but
 * the writer's file I/O.
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
#include <sys/uio.h>
#include <unistd.h>

static unsigned long id_counter;
static uint64_t use_counter;   /* orders uses exactly, for the LRU: last_used has seconds only */

/* The state of the state directory, for /readyz and /metrics. */
static char state_err[256];    /* "" while writes succeed */
static unsigned long writes_ok, writes_failed;
static double write_seconds_sum;
static unsigned long write_rounds;
static int spill_blocked_logged;
static int retrying;           /* a write failed: the writer retries the dirty sessions */
/* Wakes the writers: a commit queued, a stop, or the first write that failed
 * (the first writer, which retries, may be the one asleep). */
static pthread_cond_t writer_wake = PTHREAD_COND_INITIALIZER;

static void sess_path(char *buf, size_t cap, const char *id, const char *ext)
{
    snprintf(buf, cap, "%s/sessions/%s.%s", srv.cfg.state_dir, id, ext);
}

/* ------------------------------------------------------------ files */

static int sync_dir(void)
{
    if (srv.cfg.durability != DURABLE_FSYNC) return 0;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/sessions", srv.cfg.state_dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* PATH.tmp with the N parts IOV, synced when SYNC, renamed to PATH. The
 * directory is not synced here. Returns 0, or -1 with errno. */
static int write_parts(const char *path, struct iovec *iov, int n, int sync)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    while (n > 0) {
        ssize_t k = writev(fd, iov, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : ENOSPC;
            close(fd);
            unlink(tmp);
            errno = e;
            return -1;
        }
        size_t done = (size_t)k;
        while (n > 0 && done >= iov->iov_len) {   /* the parts written whole */
            done -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {   /* and one written in part */
            iov->iov_base = (char *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
    if ((sync && fdatasync(fd) != 0) || close(fd) != 0) {
        int e = errno;
        if (sync) close(fd);
        unlink(tmp);
        errno = e;
        return -1;
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

static int write_file(const char *path, const void *data, size_t len, int sync)
{
    struct iovec v = {(void *)data, len};
    return write_parts(path, &v, 1, sync);
}

/* Writes the memory of S to ID.mem: its header, then its floats and a
 * window model's tokens as they are (no copy). S must not change meanwhile:
 * acquired, or under srv.lock. */
static int write_memory(session_t *s, int sync)
{
    size_t cap = mem_serial_size(s->mem) - s->mem->n_floats * sizeof(float);
    void *hdr = malloc(cap);
    size_t h = hdr ? mem_serial_header(s->mem, hdr, cap) : 0;
    if (!h) {
        free(hdr);
        return errno = ENOMEM, -1;
    }
    char path[1100];
    sess_path(path, sizeof path, s->id, "mem");
    struct iovec v[3] = {{hdr, h}, {s->mem->buf, s->mem->n_floats * sizeof(float)},
                         {s->mem->toks, (size_t)s->mem->m->window * sizeof *s->mem->toks}};
    int rc = write_parts(path, v, s->mem->toks ? 3 : 2, sync);
    int e = errno;
    free(hdr);
    errno = e;
    return rc;
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

/* A write's outcome, for the state of the directory (srv.lock held). */
static void note_write(int ok, const char *what, int err)
{
    if (ok) {
        writes_ok++;
        if (state_err[0]) log_line("state: writes succeed again in %s", srv.cfg.state_dir);
        state_err[0] = 0;
        spill_blocked_logged = 0;
        return;
    }
    writes_failed++;
    /* the failure may be another writer's, or a request thread's: the
     * first writer must not sleep on through it (it alone retries) */
    if (!retrying) pthread_cond_broadcast(&writer_wake);
    retrying = 1;
    if (!state_err[0]) {
        snprintf(state_err, sizeof state_err, "%s", strerror(err));
        log_line("state: cannot write %s in %s: %s; sessions stay in memory and new ones are refused (507) "
                 "until a write succeeds", what, srv.cfg.state_dir, state_err);
    }
}

static int write_meta(const session_t *s, int sync)
{
    char path[1100];
    sess_path(path, sizeof path, s->id, "json");
    json_t *j = json_pack("{s:s, s:s, s:I, s:I}", "id", s->id, "model", s->model->name, "created",
                          (json_int_t)s->created, "last_used", (json_int_t)s->last_used);
    char *txt = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!txt) return errno = ENOMEM, -1;
    int rc = write_file(path, txt, strlen(txt), sync);
    free(txt);
    return rc;
}

/* Serialises S's memory (brought up from the device if it lives there). */
static void *serialize(const session_t *s, size_t *n)
{
    *n = mem_serial_size(s->mem);
    void *buf = malloc(*n);
    if (buf && mem_serialize(s->mem, buf, *n)) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

/* Writes S's memory and metadata now, synced unless durability is write
 * (srv.lock held: a spill, the shutdown, a retry, an import). */
static int sess_write(session_t *s)
{
    if (!s->mem || !s->dirty) return 0;
    int sync = srv.cfg.durability != DURABLE_WRITE;
    int rc = write_memory(s, sync);
    if (rc == 0) rc = write_meta(s, sync);
    if (rc == 0 && sync) rc = sync_dir();
    note_write(rc == 0, "a session", errno);
    if (rc == 0) s->dirty = 0;
    return rc;
}

/* Reads S's memory from its disk copy into MEM: the memory of a new stream
 * when there is none. */
static int load_copy(const session_t *s, mem_t *mem, char *err)
{
    char path[1100];
    size_t n = 0;
    sess_path(path, sizeof path, s->id, "mem");
    char *buf = read_file(path, &n);
    if (!buf) {
        if (errno == ENOENT) {
            mem_reset(mem);
            return 0;
        }
        return snprintf(err, 512, "session %s: its saved memory cannot be read (%s)", s->id, strerror(errno)), -1;
    }
    char e2[ERR_LEN];
    int rc = mem_deserialize(mem, buf, n, e2);
    free(buf);
    if (rc) return snprintf(err, 512, "session %s: its saved memory is unusable: %s", s->id, e2), -1;
    return 0;
}

/* Reads S's memory back from disk. */
static int sess_read(session_t *s, char *err)
{
    mem_t *m = mem_new(s->model->m);
    if (!m) return snprintf(err, 512, "session %s: out of memory", s->id), -1;
    if (load_copy(s, m, err)) {
        mem_free(m);
        return -1;
    }
    s->mem = m;
    s->dirty = 0;
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

int sess_count_unsaved(void)
{
    int n = 0;
    for (session_t *s = srv.sessions; s; s = s->next) n += s->dirty;
    return n;
}

const char *sess_state_error(void) { return state_err; }

/* Spills the least recently used idle sessions while over the budget: a
 * dirty one is written first, and kept when that fails. */
static void enforce_budget(void)
{
    size_t live = sess_live_bytes();
    uint64_t skip_below = 0;   /* sessions that could not be written this round, by use order */
    while (live > srv.cfg.session_memory) {
        session_t *lru = NULL;
        for (session_t *s = srv.sessions; s; s = s->next)
            if (s->mem && !s->busy && s->use_seq >= skip_below && (!lru || s->use_seq < lru->use_seq)) lru = s;
        if (!lru) return;
        if (sess_write(lru)) {
            if (!spill_blocked_logged++)
                log_line("state: sessions cannot be spilled (%s): live session memory %zu bytes is over "
                         "--session-memory %zu", state_err, live, srv.cfg.session_memory);
            skip_below = lru->use_seq + 1;
            continue;
        }
        live -= lru->mem->n_floats * sizeof(float);
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
    if (state_err[0]) {
        *status = 507;
        snprintf(err, 512, "the state directory cannot be written (%s): new sessions are refused until it can; "
                 "the sessions there are kept", state_err);
        return NULL;
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
    if (srv.cfg.durability != DURABLE_OFF) {   /* it exists once its .json does */
        int rc = write_meta(s, srv.cfg.durability == DURABLE_FSYNC);
        if (rc == 0) rc = sync_dir();
        note_write(rc == 0, "a new session", errno);
        if (rc) {
            char path[1100];
            sess_path(path, sizeof path, s->id, "json");
            unlink(path);
            mem_free(s->mem);
            free(s);
            *status = 507;
            snprintf(err, 512, "the state directory cannot be written (%s): new sessions are refused until it can",
                     state_err);
            return NULL;
        }
    }
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

int sess_mark(session_t *s, char *err)
{
    free(s->mark);
    s->mark = NULL;
    if (srv.cfg.durability != DURABLE_OFF && !s->dirty) return 0;   /* the disk copy is the state */
    if (!(s->mark = serialize(s, &s->mark_len))) return snprintf(err, 512, "out of memory"), -1;
    return 0;
}

void sess_rollback(session_t *s)
{
    char err[512], e2[ERR_LEN];
    int rc = s->mark ? mem_deserialize(s->mem, s->mark, s->mark_len, e2) : load_copy(s, s->mem, err);
    if (rc && s->mark) snprintf(err, sizeof err, "%s", e2);
    if (rc) log_line("session %s: cannot roll back a request that did not complete: %s", s->id, err);
}

/* ------------------------------------------------------------ the state writer */

typedef struct commit {
    session_t *s;
    int rc, err;
    void (*done)(void *ctx);
    void *ctx;
    struct commit *next;
} commit_t;

static commit_t *commits;             /* queued (srv.lock) */
/* Writers at once: a write is a device-to-host copy, a conversion and a
 * file with its sync, and one thread of them fell behind a GPU's steps
 * (about 500 sessions a second of aspan-small on an H100). */
#define STATE_WRITERS 4

static pthread_t writer_threads[STATE_WRITERS];
static int writer_running, writer_stop, n_commits;

int sess_commit(session_t *s, void (*done)(void *ctx), void *ctx)
{
    s->dirty = 1;
    if (srv.cfg.durability == DURABLE_OFF) return 1;
    commit_t *c = writer_running ? calloc(1, sizeof *c) : NULL;
    if (!c) {   /* stays dirty: retried by the writer, written on shutdown */
        if (writer_running) note_write(0, "a session", ENOMEM);
        return 1;
    }
    c->s = s;
    c->done = done;
    c->ctx = ctx;
    commit_t **p = &commits;
    while (*p) p = &(*p)->next;
    *p = c;
    n_commits++;
    srv.committing++;
    pthread_cond_signal(&writer_wake);
    return 0;
}

int sess_commit_bytes(session_t *s, const void *buf, size_t n)
{
    s->dirty = 1;
    if (srv.cfg.durability == DURABLE_OFF) return -1;
    char path[1100];
    sess_path(path, sizeof path, s->id, "mem");
    int sync = srv.cfg.durability == DURABLE_FSYNC;
    int rc = write_file(path, buf, n, sync);
    if (rc == 0 && sync) rc = sync_dir();
    note_write(rc == 0, "a session", errno);
    if (rc == 0) s->dirty = 0;
    return rc;
}

/* After a write failed: the dirty idle sessions again, until one fails;
 * once all are written, the budget is enforced again (they may be spilled
 * now) and retrying ends. */
static void retry_dirty(void)
{
    int left = 0;
    for (session_t *s = srv.sessions; s; s = s->next)
        if (s->dirty && s->mem) {
            if (s->busy || sess_write(s)) left = 1;
            if (state_err[0]) break;
        }
    if (!left) {
        retrying = 0;
        enforce_budget();
    }
}

/* One of the writers: rounds of the queued writes, a share of them each
 * (the writers split what is queued), one sync of the directory a round.
 * The first writer also retries the writes that failed. */
static void *writer_main(void *arg)
{
    const int first = (intptr_t)arg == 0;
    pthread_mutex_lock(&srv.lock);
    for (;;) {
        if (!commits) {
            if (writer_stop) break;
            if (first && retrying && srv.cfg.durability != DURABLE_OFF) {
                retry_dirty();
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += 1;
                pthread_cond_timedwait(&writer_wake, &srv.lock, &ts);
            } else {
                pthread_cond_wait(&writer_wake, &srv.lock);
            }
            continue;
        }
        /* a round: this writer's share of the queue, then one sync of the directory */
        int take = (n_commits + STATE_WRITERS - 1) / STATE_WRITERS, taken = 0;
        commit_t *round = commits, **cut = &commits;
        for (; taken < take && *cut; taken++) cut = &(*cut)->next;
        commits = *cut;
        *cut = NULL;
        n_commits -= taken;
        if (commits) pthread_cond_signal(&writer_wake);   /* the rest for another writer */
        int sync = srv.cfg.durability == DURABLE_FSYNC;
        pthread_mutex_unlock(&srv.lock);
        double t0 = now_s();
        int dir_rc = 0;
        for (commit_t *c = round; c; c = c->next) {   /* acquired: nothing else touches them */
            c->rc = write_memory(c->s, sync);
            c->err = errno;
        }
        if (sync && (dir_rc = sync_dir()) != 0) dir_rc = errno;
        double dt = now_s() - t0;
        pthread_mutex_lock(&srv.lock);
        write_rounds++;
        write_seconds_sum += dt;
        while (round) {
            commit_t *c = round;
            round = c->next;
            if (c->rc == 0 && dir_rc) c->rc = -1, c->err = dir_rc;
            note_write(c->rc == 0, "a session", c->err);
            if (c->rc == 0) c->s->dirty = 0;
            srv.committing--;
            c->done(c->ctx);
            free(c);
        }
    }
    pthread_mutex_unlock(&srv.lock);
    return NULL;
}

int sess_writer_start(void)
{
    writer_stop = 0;
    for (; writer_running < STATE_WRITERS; writer_running++)
        if (pthread_create(&writer_threads[writer_running], NULL, writer_main, (void *)(intptr_t)writer_running)) {
            sess_writer_stop();
            return -1;
        }
    return 0;
}

/* Ends the writers once the queued writes are done (their tasks complete). */
void sess_writer_stop(void)
{
    if (!writer_running) return;
    pthread_mutex_lock(&srv.lock);
    writer_stop = 1;
    pthread_cond_broadcast(&writer_wake);
    pthread_mutex_unlock(&srv.lock);
    for (int i = 0; i < writer_running; i++) pthread_join(writer_threads[i], NULL);
    writer_running = 0;
}

/* ------------------------------------------------------------ the rest of the store */

static void sess_free(session_t *s)
{
    char path[1100];
    sess_path(path, sizeof path, s->id, "mem");
    unlink(path);
    sess_path(path, sizeof path, s->id, "json");
    unlink(path);
    mem_free(s->mem);
    free(s->mark);
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
    free(s->mark);
    s->mark = NULL;
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
    sync_dir();   /* a deleted session does not come back after a crash */
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
    sync_dir();
}

/* Tokens seen by S: the memory's, or its disk copy's header (bytes 16..24
 * and 24..28) while spilled. */
static json_int_t tokens_seen(const session_t *s)
{
    if (s->mem) return (json_int_t)(s->mem->pos + (s->mem->pending >= 0));
    char path[1100];
    sess_path(path, sizeof path, s->id, "mem");
    FILE *f = fopen(path, "rb");
    unsigned char h[28];
    json_int_t seen = 0;
    if (f && fread(h, 1, 28, f) == 28) {
        int64_t pos;
        int32_t pend;
        memcpy(&pos, h + 16, 8);
        memcpy(&pend, h + 24, 4);
        seen = (json_int_t)(pos + (pend >= 0));
    }
    if (f) fclose(f);
    return seen;
}

json_t *sess_json(const session_t *s)
{
    char c[32], u[32];
    iso_time(c, sizeof c, s->created);
    iso_time(u, sizeof u, s->last_used);
    return json_pack("{s:s, s:s, s:I, s:I, s:s, s:s, s:s, s:b}", "id", s->id, "model", s->model->name,
                     "tokens_seen", tokens_seen(s), "memory_bytes", (json_int_t)mem_bytes(s->model->m), "created",
                     c, "last_used", u, "location", s->mem ? "memory" : "disk", "saved", !s->dirty);
}

json_t *sess_list_json(void)
{
    json_t *a = json_array();
    for (session_t *s = srv.sessions; s; s = s->next) json_array_append_new(a, sess_json(s));
    return json_pack("{s:o}", "sessions", a);
}

void sess_save_all(int *saved, int *failed)
{
    *saved = *failed = 0;
    for (session_t *s = srv.sessions; s; s = s->next) {
        int sync = srv.cfg.durability != DURABLE_WRITE;
        int rc = s->dirty ? sess_write(s) : 0;
        if (rc == 0 && s->mem) rc = write_meta(s, sync);   /* last_used */
        if (rc == 0) ++*saved;
        else ++*failed;
    }
    if (sync_dir() != 0 && *saved) log_line("state: cannot sync %s/sessions: %s", srv.cfg.state_dir, strerror(errno));
}

/* Does the saved memory at PATH belong to model M (fingerprint and size)?
 * No memory yet is a new stream's: it does. */
static int state_matches(const char *path, const model_t *m)
{
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT;
    unsigned char h[40];
    int ok = fread(h, 1, sizeof h, f) == sizeof h;
    fclose(f);
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
 * on disk. Temporary files of writes a crash cut short are removed. */
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
        char path[1400], mpath[1400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!only && l > 4 && strcmp(e->d_name + l - 4, ".tmp") == 0) {
            unlink(path);
            continue;
        }
        if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0) continue;
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
            log_line("state: skipping %s: not a session file", e->d_name);
        } else if (!sm) {
            log_line("state: session %s belongs to model '%s', which is not loaded: left on disk", id, model ? model : "?");
        } else if (!state_matches(mpath, sm->m)) {
            log_line("state: session %s was saved by other weights or another --memory mode of '%s': left on disk", id,
                     model);
        } else {
            session_t *s = calloc(1, sizeof *s);
            if (s) {
                struct stat st;
                snprintf(s->id, sizeof s->id, "%s", id);
                s->model = sm;
                s->created = (time_t)json_integer_value(json_object_get(j, "created"));
                s->last_used = (time_t)json_integer_value(json_object_get(j, "last_used"));
                /* a request's write after the last .json: its time is the memory's */
                if (stat(mpath, &st) == 0 && st.st_mtime > s->last_used) s->last_used = st.st_mtime;
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

void sess_metrics(FILE *f)
{
    pthread_mutex_lock(&srv.lock);
    int unsaved = sess_count_unsaved(), writable = !state_err[0];
    unsigned long ok = writes_ok, bad = writes_failed, rounds = write_rounds;
    double secs = write_seconds_sum;
    pthread_mutex_unlock(&srv.lock);
    fprintf(f, "# HELP spanserve_sessions_unsaved Sessions whose latest state is in memory only (a write failed, "
               "or --durability off).\n# TYPE spanserve_sessions_unsaved gauge\nspanserve_sessions_unsaved %d\n", unsaved);
    fprintf(f, "# HELP spanserve_state_writable 1 while session states can be written to the state directory.\n"
               "# TYPE spanserve_state_writable gauge\nspanserve_state_writable %d\n", writable);
    fprintf(f, "# HELP spanserve_state_writes_total Session state files written, by result.\n"
               "# TYPE spanserve_state_writes_total counter\n"
               "spanserve_state_writes_total{result=\"ok\"} %lu\nspanserve_state_writes_total{result=\"error\"} %lu\n",
            ok, bad);
    fprintf(f, "# HELP spanserve_state_write_rounds_total Rounds of the state writer (one directory sync each), "
               "and their seconds.\n# TYPE spanserve_state_write_rounds_total counter\n"
               "spanserve_state_write_rounds_total %lu\n# TYPE spanserve_state_write_seconds_total counter\n"
               "spanserve_state_write_seconds_total %.6f\n", rounds, secs);
}
