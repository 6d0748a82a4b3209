/*
 * jobs.c - training jobs: each one a `spanserve train` child process
 * (/proc/self/exe) in a directory of its own, STATE_DIR/jobs/ID:
 *
 *   job.json          the job's state, rewritten atomically at every change
 *   config.json       the trainer's config (absolute data, out and log paths)
 *   train.log         the trainer's JSON lines (the job's events)
 *   stderr.log        its standard output and error (the error of a failure)
 *   model.safetensors the checkpoint, and model.safetensors.state
 *
 * One runner thread starts queued jobs (at most --max-jobs at once, in the
 * order they came), reads the new lines of every running job's log, notices
 * the process ending (waitpid for our children, /proc for a process found
 * again after a restart), and finishes the job: a success registers the
 * checkpoint as a model (copied into --model-dir when there is one, loaded
 * when deploy was asked). A webhook thread POSTs the final job object with
 * libcurl, retried with backoff, so that no slow receiver holds anything.
 *
 * Training processes run in a session of their own: a server that stops
 * leaves them running, and the next one on the same state directory finds
 * them again by pid and start time; one whose process is gone is marked
 * failed, and can be resumed from its last checkpoint.
 */
#define _GNU_SOURCE
#include "jobs.h"
#include "st.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

pthread_mutex_t jobs_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jobs_wake = PTHREAD_COND_INITIALIZER;
static job_t *jobs;              /* in order of submission */
static uint64_t jobs_seq;
static int stopping, started;
/* since this start, for /metrics: runs that ended by outcome, webhooks */
static unsigned long runs_ended[JOB_CANCELLED + 1], hooks_delivered, hooks_failed;
static pthread_t runner_thread, hook_thread;
static char jobs_dir[PATH_MAX], files_dir[PATH_MAX];
static char default_device[16] = "cpu";
static int cuda_ok;              /* a GPU this build can use */
static int gpu_count;            /* the GPUs the server sees: a GPU job is given its own */
/* the server's own CUDA_VISIBLE_DEVICES, split: a job's GPU i is entry i;
 * without it, GPU i is the machine's i */
static char visible_ids[64][16];
static int n_visible = -1;
static char cuda_why[ERR_LEN] = "the jobs are not started";

/* How often the runner looks at the logs and processes: progress reaches
 * the API and streams within this. */
#define RUNNER_TICK_S 0.1
/* Webhook: attempts in all, the first retry's delay (doubled each time), and
 * a request's time limit. */
#define HOOK_ATTEMPTS 6
#define HOOK_DELAY_S 1.0
#define HOOK_TIMEOUT_S 10L

/* ------------------------------------------------------------ small helpers */

const char *job_status_name(job_status s)
{
    static const char *n[] = {"queued", "running", "succeeded", "failed", "cancelled"};
    return n[s];
}

static int status_from_name(const char *s)
{
    for (int i = 0; i <= JOB_CANCELLED; i++)
        if (s && strcmp(s, job_status_name((job_status)i)) == 0) return i;
    return -1;
}

static const char *hook_name(hook_state h)
{
    static const char *n[] = {"none", "pending", "delivered", "failed"};
    return n[h];
}

int job_is_terminal(const job_t *j) { return j->status >= JOB_SUCCEEDED; }
const char *jobs_files_dir(void) { return files_dir; }
const char *jobs_default_device(void) { return default_device; }
int jobs_stopping(void) { return stopping; }

void job_path(const job_t *j, const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s/%s", jobs_dir, j->id, name);
}

static void iso_time(char *buf, size_t cap, time_t t)
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void random_id(const char *prefix, char *buf, size_t cap)
{
    unsigned char b[8];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, b, sizeof b) != (ssize_t)sizeof b) {
        uint64_t x = (uint64_t)now_s() * 1000003u ^ (uint64_t)getpid() ^ (uint64_t)(uintptr_t)buf;
        memcpy(b, &x, sizeof b);
    }
    if (fd >= 0) close(fd);
    snprintf(buf, cap, "%s%02x%02x%02x%02x%02x%02x%02x%02x", prefix, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]);
}

int write_atomic(const char *path, const char *data, size_t len)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < len) {
        ssize_t k = write(fd, data + off, len - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        off += (size_t)k;
    }
    int bad = off != len || fsync(fd) != 0;
    bad |= close(fd) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* The start time of process PID in clock ticks since boot (field 22 of
 * /proc/PID/stat), 0 when there is no such process. */
static unsigned long long proc_start(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');   /* the name may hold spaces and parentheses */
    if (!p) return 0;
    /* fields from 3 (state) on; the start time is field 22 */
    char state = 0;
    unsigned long long v = 0;
    int field = 2;
    char *save = NULL;
    for (char *tok = strtok_r(p + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        field++;
        if (field == 3) state = tok[0];
        if (field == 22) { v = strtoull(tok, NULL, 10); break; }
    }
    if (state == 'Z' || state == 'X') return 0;   /* dead, not yet reaped by its parent */
    return v;
}

/* The last non-empty line of a job's stderr.log, or "". */
static void last_error_line(const job_t *j, char *out, size_t cap)
{
    char path[PATH_MAX], buf[4096];
    job_path(j, "stderr.log", path, sizeof path);
    *out = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    off_t size = lseek(fd, 0, SEEK_END);
    off_t from = size > (off_t)sizeof buf - 1 ? size - (off_t)sizeof buf + 1 : 0;
    ssize_t n = pread(fd, buf, sizeof buf - 1, from);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
    char *line = strrchr(buf, '\n');
    line = line ? line + 1 : buf;
    /* the message must stay valid UTF-8 in JSON: a stray byte becomes '?' */
    size_t k = 0;
    for (size_t i = 0, len = strlen(line); i < len && k + 1 < cap;) {
        uint32_t cp;
        int w = utf8_decode((const unsigned char *)line + i, len - i, &cp);
        if (w == 0 || cp < 0x20 || k + (size_t)w >= cap) { out[k++] = '?'; i += w ? (size_t)w : 1; continue; }
        memcpy(out + k, line + i, (size_t)w);
        k += (size_t)w;
        i += (size_t)w;
    }
    out[k] = 0;
}

/* ------------------------------------------------------------ the job object */

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static double job_elapsed(const job_t *j)
{
    if (!j->t_started) return 0;
    return (j->t_finished ? j->t_finished : wall_s()) - j->t_started;
}

json_t *job_json(const job_t *j)
{
    char t[32];
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(j->id));
    json_object_set_new(o, "status", json_string(job_status_name(j->status)));
    json_object_set_new(o, "family", json_string(j->fam->name));
    json_object_set_new(o, "device", json_string(j->device));
    if (j->gpus) json_object_set_new(o, "gpus", json_integer(j->gpus));
    if (j->n_gpu_ids) {
        json_t *ids = json_array();
        for (int i = 0; i < j->n_gpu_ids; i++) json_array_append_new(ids, json_integer(j->gpu_ids[i]));
        json_object_set_new(o, "gpu_ids", ids);
    }
    iso_time(t, sizeof t, j->created);
    json_object_set_new(o, "created", json_string(t));
    if (j->started) {
        iso_time(t, sizeof t, j->started);
        json_object_set_new(o, "started", json_string(t));
    }
    if (j->finished) {
        iso_time(t, sizeof t, j->finished);
        json_object_set_new(o, "finished", json_string(t));
    }
    json_t *data = json_object();
    const char *keys[] = {"file", "path", "url"};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(j->request, keys[i]);
        if (json_is_string(v)) json_object_set(data, keys[i], v);
    }
    json_object_set_new(o, "data", data);
    json_t *cfg = json_object_get(j->request, "config");
    json_object_set_new(o, "config", cfg ? json_deep_copy(cfg) : json_object());
    json_object_set_new(o, "name", json_string(j->model_name));
    json_object_set_new(o, "deploy", json_boolean(j->deploy));
    json_object_set_new(o, "steps", json_integer(j->steps));
    /* progress: the last train line's numbers */
    long step = (long)json_integer_value(json_object_get(j->progress, "step"));
    json_object_set_new(o, "step", json_integer(step));
    static const char *nums[] = {"loss", "bpc", "val_bpc", "lr", "tokens_per_s", "span_loss", "tau"};
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        json_t *v = json_object_get(j->progress, nums[i]);
        if (json_is_number(v) && isfinite(json_number_value(v))) json_object_set(o, nums[i], v);
    }
    json_object_set_new(o, "elapsed_s", json_real(job_elapsed(j)));
    double tps = json_number_value(json_object_get(j->progress, "tokens_per_s"));
    if (j->status == JOB_RUNNING && tps > 0 && step <= j->steps)
        json_object_set_new(o, "eta_s", json_real((double)(j->steps - step) * j->batch * j->block / tps));
    static const char *views[] = {"spans", "searching", "arch", "arch_weights"};
    for (size_t i = 0; i < sizeof views / sizeof *views; i++) {
        json_t *v = json_object_get(j->progress, views[i]);
        if (v) json_object_set(o, views[i], v);
    }
    json_object_set_new(o, "events", json_integer(j->n_events));
    if (j->ckpt_step >= 0) {
        char path[PATH_MAX];
        job_path(j, "model.safetensors", path, sizeof path);
        json_object_set_new(o, "checkpoint", json_pack("{s:s, s:I}", "path", path, "step", (json_int_t)j->ckpt_step));
    }
    if (j->status == JOB_SUCCEEDED) {
        json_t *m = json_pack("{s:s, s:s, s:b}", "name", j->model_name, "path", j->model_path, "deployed", j->deployed);
        if (j->model_error[0]) json_object_set_new(m, "error", json_string(j->model_error));
        json_object_set_new(o, "model", m);
    }
    if (j->error[0]) json_object_set_new(o, "error", json_string(j->error));
    if (j->exit_code >= 0) json_object_set_new(o, "exit_code", json_integer(j->exit_code));
    json_object_set_new(o, "runs", json_integer(j->runs));
    if (j->status == JOB_RUNNING && j->pid) json_object_set_new(o, "pid", json_integer(j->pid));
    if (j->cancelling) json_object_set_new(o, "cancelling", json_true());
    if (j->webhook) {
        json_t *h = json_pack("{s:s, s:s, s:i}", "url", j->webhook, "state", hook_name(j->hook), "attempts", j->hook_attempts);
        if (j->hook_error[0]) json_object_set_new(h, "error", json_string(j->hook_error));
        json_object_set_new(o, "webhook", h);
    }
    return o;
}

/* job.json: what the API shows, and what only a restart needs. */
static int job_save(const job_t *j)
{
    json_t *o = json_pack("{s:s, s:s, s:O, s:I, s:I, s:I, s:I, s:i, s:i, s:i, s:i, s:s, s:i, s:s, s:i, s:s, s:s, s:i, s:i, s:s}",
                          "id", j->id, "status", job_status_name(j->status), "request", j->request,
                          "seq", (json_int_t)j->seq, "created", (json_int_t)j->created, "started", (json_int_t)j->started,
                          "finished", (json_int_t)j->finished, "pid", (int)j->pid, "own", 0, "runs", j->runs,
                          "resume", j->resume, "error", j->error, "exit_code", j->exit_code, "model_path", j->model_path,
                          "deployed", j->deployed, "model_error", j->model_error, "hook", hook_name(j->hook),
                          "hook_attempts", j->hook_attempts, "cancelling", j->cancelling, "hook_error", j->hook_error);
    if (!o) return -1;
    json_object_set_new(o, "pid_start", json_integer((json_int_t)j->pid_start));
    json_t *ids = json_array();
    for (int i = 0; i < j->n_gpu_ids; i++) json_array_append_new(ids, json_integer(j->gpu_ids[i]));
    json_object_set_new(o, "gpu_ids", ids);
    json_object_set_new(o, "t_started", json_real(j->t_started));
    json_object_set_new(o, "t_finished", json_real(j->t_finished));
    char *s = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!s) return -1;
    char path[PATH_MAX];
    job_path(j, "job.json", path, sizeof path);
    int rc = write_atomic(path, s, strlen(s));
    free(s);
    if (rc) log_line("job %s: cannot write %s: %s", j->id, path, strerror(errno));
    return rc;
}

/* ------------------------------------------------------------ validation */

/* An http(s) URL of printable ASCII, of a sane length. */
static int valid_hook_url(const char *u)
{
    size_t n = strlen(u);
    if (n > 2048 || (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0)) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)u[i] <= 0x20 || (unsigned char)u[i] >= 0x7f) return 0;
    return strlen(u + (u[4] == 's' ? 8 : 7)) > 0;
}

/* The config handed to the trainer's parser: the client's keys with the
 * family, the device and the paths the server chooses. */
static json_t *trainer_config(json_t *req, const char *device, const char *data, const char *out, const char *log)
{
    json_t *c = json_deep_copy(json_object_get(req, "config"));
    if (!c) c = json_object();
    json_object_set(c, "family", json_object_get(req, "family"));
    json_object_set_new(c, "device", json_string(device));
    json_object_set_new(c, "data", json_string(data));
    json_object_set_new(c, "out", json_string(out));
    json_object_set_new(c, "log", json_string(log));
    return c;
}

int jobs_validate(json_t *req, train_cfg *cfg, char *err, int *status)
{
    static const char *fields[] = {"id", "family", "config", "file", "path", "url", "name", "deploy", "webhook", "device"};
    *status = 400;
    const char *k;
    json_t *v;
    json_object_foreach(req, k, v) {
        size_t i = 0;
        while (i < sizeof fields / sizeof *fields && strcmp(k, fields[i]) != 0) i++;
        if (i == sizeof fields / sizeof *fields)
            return snprintf(err, 512, "unknown field '%.64s' (training settings go in config)", k), -1;
    }
    const char *id, *family, *name, *hook, *device, *file, *path, *url;
    int deploy;
    if (field_str(req, "id", &id, err) || field_str(req, "family", &family, err) || field_str(req, "name", &name, err) ||
        field_str(req, "webhook", &hook, err) || field_str(req, "device", &device, err) ||
        field_str(req, "file", &file, err) || field_str(req, "path", &path, err) || field_str(req, "url", &url, err) ||
        field_bool(req, "deploy", 0, &deploy, err))
        return -1;
    if (id && !valid_name(id)) return snprintf(err, 512, "id must be 1 to 64 of A-Z a-z 0-9 . _ - (and not . or ..)"), -1;
    char names[256];
    train_family_names(names, sizeof names, 0, "\"");
    if (!family) return snprintf(err, 512, "family is required: %s", names), -1;
    if (!train_family_find(family)) return snprintf(err, 512, "family must be %s, not \"%.64s\"", names, family), -1;
    json_t *c = json_object_get(req, "config");
    if (c && !json_is_object(c) && !json_is_null(c)) return snprintf(err, 512, "config must be a JSON object"), -1;
    static const char *server_keys[] = {"family", "data", "out", "log", "device"};
    for (size_t i = 0; c && i < sizeof server_keys / sizeof *server_keys; i++)
        if (json_object_get(c, server_keys[i]))
            return snprintf(err, 512, "config '%s' is set by the server (%s)", server_keys[i],
                            i == 0 ? "give family beside config" : i == 4 ? "give device beside config" :
                            "the text is file, path or url; the checkpoint and log are the job's"), -1;
    if (name && !valid_name(name)) return snprintf(err, 512, "name must be 1 to 64 of A-Z a-z 0-9 . _ - (and not . or ..)"), -1;
    if (hook && !valid_hook_url(hook))
        return snprintf(err, 512, "webhook must be an http:// or https:// URL of printable ASCII, at most 2048 bytes"), -1;
    if (device && strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0)
        return snprintf(err, 512, "device must be \"cpu\" or \"cuda\""), -1;
    if (device && strcmp(device, "cuda") == 0 && !cuda_ok)
        return snprintf(err, 512, "device \"cuda\": %s; train with \"cpu\"", cuda_why), -1;
    if ((file != NULL) + (path != NULL) + (url != NULL) != 1)
        return snprintf(err, 512, "give the training text as one of file (an uploaded file's id), path (inside the data directory) or url (https)"), -1;
    if (file && !valid_name(file)) return snprintf(err, 512, "file must be a file id (1 to 64 of A-Z a-z 0-9 . _ -)"), -1;
    if (url && (strncmp(url, "https://", 8) != 0 || strlen(url) > 2048 || !url[8]))
        return snprintf(err, 512, "url must be https:// and at most 2048 bytes"), -1;
    /* the trainer's own parser and checks, on the paths it will get; with
     * no device asked, the default (cuda where it can), else the CPU where
     * the trainer keeps this config off the GPU */
    for (int pass = 0; pass < 2; pass++) {
        const char *dev = device ? device : pass == 0 ? default_device : "cpu";
        json_t *tc = trainer_config(req, dev, "/data", "/out", "/log");
        char *text = json_dumps(tc, JSON_COMPACT);
        json_decref(tc);
        char e2[ERR_LEN];
        int rc = !text || train_cfg_from_json(cfg, text, "config", e2) || train_cfg_check(cfg, e2);
        free(text);
        if (!rc) return 0;
        if (device || strcmp(dev, "cpu") == 0) return snprintf(err, 512, "%s", e2), -1;
    }
    return snprintf(err, 512, "no device can train this config"), -1;
}

int jobs_scan_text(const char *path, size_t *chars, size_t *distinct, char *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return snprintf(err, 512, "the training text: %s", strerror(errno)), -1;
    /* code points, and a bit per code point seen, read in chunks */
    static const size_t CH = 1 << 16;
    unsigned char *buf = malloc(CH + 4);
    unsigned char *seen = calloc(0x110000 / 8, 1);
    size_t have = 0, n = 0, V = 0, at = 0;
    int rc = -1;
    if (!buf || !seen) { snprintf(err, 512, "out of memory"); goto out; }
    for (;;) {
        ssize_t k = read(fd, buf + have, CH + 4 - have);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) { snprintf(err, 512, "the training text: %s", strerror(errno)); goto out; }
        have += (size_t)k;
        size_t i = 0;
        while (i < have) {
            uint32_t cp;
            int w = utf8_decode(buf + i, have - i, &cp);
            if (w == 0 && k > 0 && have - i < 4) break;   /* a character cut by the chunk: read on */
            if (w == 0) { snprintf(err, 512, "the training text is not valid UTF-8 (byte %zu)", at + i); goto out; }
            if (!(seen[cp >> 3] & (1u << (cp & 7)))) { seen[cp >> 3] |= (unsigned char)(1u << (cp & 7)); V++; }
            n++;
            i += (size_t)w;
        }
        memmove(buf, buf + i, have - i);
        at += i;
        have -= i;
        if (k == 0) break;
    }
    *chars = n;
    *distinct = V;
    rc = 0;
out:
    close(fd);
    free(buf);
    free(seen);
    return rc;
}

int jobs_check_text(const char *path, const train_cfg *c, char *err)
{
    size_t n, V;
    if (jobs_scan_text(path, &n, &V, err)) return -1;
    /* as train_run: the validation text is the last val_fraction; each of
     * batch_size streams needs two blocks and a token of training text and
     * a block and a token of validation text */
    size_t split = (size_t)((1.0 - c->val_fraction) * (double)n), B = (size_t)c->batch_size;
    size_t M = (size_t)c->fam->block_len(c);
    if (V < 2) return snprintf(err, 512, "the training text has %zu distinct characters: nothing to learn", V), -1;
    if (V > MODEL_MAX_VOCAB)
        return snprintf(err, 512, "the training text has %zu distinct characters, over %d", V, MODEL_MAX_VOCAB), -1;
    if (split / B < 2 * M + 1)
        return snprintf(err, 512, "the training text (%zu characters) is too short for batch_size %zu streams of at "
                        "least 2 blocks of %zu + 1", split, B, M), -1;
    if ((n - split) / B < M + 1)
        return snprintf(err, 512, "the validation text (%zu characters, val_fraction %g) is too short for batch_size "
                        "%zu streams of a block of %zu + 1", n - split, c->val_fraction, B, M), -1;
    return 0;
}

/* ------------------------------------------------------------ the list */

job_t *jobs_find(const char *id)
{
    for (job_t *j = jobs; j; j = j->next)
        if (strcmp(j->id, id) == 0) return j;
    return NULL;
}

job_t *jobs_list(void) { return jobs; }

int jobs_file_in_use(const char *file_id)
{
    for (job_t *j = jobs; j; j = j->next)
        if (!job_is_terminal(j) && strcmp(j->file_id, file_id) == 0) return 1;
    return 0;
}

static void jobs_append(job_t *j)
{
    job_t **p = &jobs;
    while (*p && (*p)->seq < j->seq) p = &(*p)->next;
    j->next = *p;
    *p = j;
}

static void job_free(job_t *j)
{
    json_decref(j->request);
    json_decref(j->progress);
    free(j->webhook);
    free(j);
}

/* The fields a job takes from its request and config. */
static int job_init(job_t *j, json_t *req, const train_cfg *cfg)
{
    j->request = json_incref(req);
    j->fam = cfg->fam;
    snprintf(j->device, sizeof j->device, "%s", cfg->device);
    j->gpus = strcmp(cfg->device, "cuda") == 0 ? cfg->gpus : 0;
    j->steps = cfg->steps;
    j->batch = cfg->batch_size;
    j->block = cfg->fam->block_len(cfg);
    const char *name = json_string_value(json_object_get(req, "name"));
    snprintf(j->model_name, sizeof j->model_name, "%s", name ? name : j->id);
    j->deploy = json_is_true(json_object_get(req, "deploy"));
    const char *hook = json_string_value(json_object_get(req, "webhook"));
    if (hook && !(j->webhook = strdup(hook))) return -1;
    j->progress = json_object();
    j->ckpt_step = -1;
    j->exit_code = -1;
    return j->progress ? 0 : -1;
}

/* A model name another job will take, or a model file that exists. */
static int name_taken(const job_t *self, const char *name, int deploy, char *err)
{
    for (job_t *j = jobs; j; j = j->next)
        if (j != self && !job_is_terminal(j) && strcmp(j->model_name, name) == 0)
            return snprintf(err, 512, "job '%s' will make a model named '%s' already", j->id, name), 1;
    if (srv.cfg.model_dir) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s.safetensors", srv.cfg.model_dir, name);
        if (access(p, F_OK) == 0) return snprintf(err, 512, "the model directory has %s.safetensors already", name), 1;
    }
    if (deploy) {
        pthread_mutex_lock(&srv.lock);
        int loaded = models_find(name) != NULL;
        pthread_mutex_unlock(&srv.lock);
        if (loaded) return snprintf(err, 512, "model '%s' is loaded already", name), 1;
    }
    return 0;
}

job_t *jobs_submit(json_t *req, const char *data, const char *file_id, int *existed, char *err, int *status)
{
    train_cfg cfg;
    *existed = 0;
    if (jobs_validate(req, &cfg, err, status)) return NULL;
    const char *id = json_string_value(json_object_get(req, "id"));
    if (id) {
        job_t *old = jobs_find(id);
        if (old && json_equal(old->request, req)) { *existed = 1; return old; }
        if (old) {
            *status = 409;
            return snprintf(err, 512, "job '%s' exists with another request (an id names one submission)", id), NULL;
        }
    }
    if (stopping) { *status = 503; return snprintf(err, 512, "the server is shutting down"), NULL; }
    /* a GPU job that could never start here */
    if (!strcmp(cfg.device, "cuda") && cfg.gpus > srv.cfg.max_jobs) {
        *status = 400;
        return snprintf(err, 512, "config 'gpus' = %d but this server runs jobs on at most %d GPUs at once (--max-jobs)",
                        cfg.gpus, srv.cfg.max_jobs), NULL;
    }
    if (!strcmp(cfg.device, "cuda") && gpu_count && cfg.gpus > gpu_count) {
        *status = 400;
        return snprintf(err, 512, "config 'gpus' = %d but this machine has %d GPUs", cfg.gpus, gpu_count), NULL;
    }
    if (jobs_check_text(data, &cfg, err)) { *status = 400; return NULL; }
    job_t *j = calloc(1, sizeof *j);
    if (!j) { *status = 503; return snprintf(err, 512, "out of memory"), NULL; }
    if (id) snprintf(j->id, sizeof j->id, "%s", id);
    else do random_id("job-", j->id, sizeof j->id); while (jobs_find(j->id));
    if (job_init(j, req, &cfg)) { job_free(j); *status = 503; return snprintf(err, 512, "out of memory"), NULL; }
    if (name_taken(j, j->model_name, j->deploy, err)) { job_free(j); *status = 409; return NULL; }
    snprintf(j->file_id, sizeof j->file_id, "%s", file_id ? file_id : "");
    j->created = time(NULL);
    j->seq = ++jobs_seq;
    /* the directory and the trainer's config, then the state: a job.json
     * on disk is a whole job */
    char dir[PATH_MAX], out[PATH_MAX], logp[PATH_MAX], cpath[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", jobs_dir, j->id);
    job_path(j, "model.safetensors", out, sizeof out);
    job_path(j, "train.log", logp, sizeof logp);
    job_path(j, "config.json", cpath, sizeof cpath);
    if (mkdir(dir, 0700) != 0) {
        *status = errno == EEXIST ? 409 : 500;
        snprintf(err, 512, errno == EEXIST ? "a job directory '%s' exists already" : "cannot make the job directory %s",
                 j->id);
        job_free(j);
        return NULL;
    }
    json_t *tc = trainer_config(req, cfg.device, data, out, logp);
    char *text = json_dumps(tc, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(tc);
    if (!text || write_atomic(cpath, text, strlen(text)) || job_save(j)) {
        free(text);
        *status = 500;
        snprintf(err, 512, "cannot write the job's files in %s", dir);
        job_free(j);
        return NULL;
    }
    free(text);
    jobs_append(j);
    log_line("job %s: queued (%s on %s, %ld steps)", j->id, j->fam->name, j->device, j->steps);
    pthread_cond_broadcast(&jobs_wake);
    *status = 201;
    return j;
}

/* ------------------------------------------------------------ watchers */

void jobs_wake_watchers(job_t *j)
{
    for (job_watcher *w = j->watchers; w; w = w->next)
        if (w->waiting) {
            w->waiting = 0;
            MHD_resume_connection(w->conn);
        }
}

void jobs_watch(job_t *j, job_watcher *w)
{
    w->next = j->watchers;
    j->watchers = w;
}

void jobs_unwatch(job_t *j, job_watcher *w)
{
    job_watcher **p = &j->watchers;
    while (*p && *p != w) p = &(*p)->next;
    if (*p) *p = w->next;
    if (j->removed && !j->watchers) job_free(j);
}

/* Wakes the streams that have waited --sse-keepalive seconds: each sends a
 * comment line, so that proxies and clients see the connection alive while
 * a job waits in the queue or a long step runs. */
static void keepalive_watchers(void)
{
    double now = now_s(), every = srv.cfg.sse_keepalive;
    if (every <= 0) return;
    for (job_t *j = jobs; j; j = j->next)
        for (job_watcher *w = j->watchers; w; w = w->next)
            if (w->waiting && now - w->since >= every) {
                w->waiting = 0;
                MHD_resume_connection(w->conn);
            }
}

/* ------------------------------------------------------------ the log */

/* One progress line into the job's summary. */
static void take_event(job_t *j, json_t *e)
{
    const char *ev = json_string_value(json_object_get(e, "event"));
    if (!ev) return;
    j->n_events++;
    if (strcmp(ev, "train") == 0 || strcmp(ev, "start") == 0 || strcmp(ev, "resume") == 0) {
        json_t *keep = json_object_get(j->progress, "val_bpc");
        json_incref(keep);
        if (strcmp(ev, "train") == 0) json_object_clear(j->progress);
        json_object_update(j->progress, e);
        if (keep && !json_object_get(e, "val_bpc")) json_object_set(j->progress, "val_bpc", keep);
        json_decref(keep);
        if (strcmp(ev, "train") != 0) {   /* start or resume: the run's first step */
            j->run_step0 = (long)json_integer_value(json_object_get(e, "step"));
            j->run_t0 = now_s();
        }
    } else if (strcmp(ev, "arch_fixed") == 0) {
        json_object_set(j->progress, "arch", json_object_get(e, "arch"));
        json_object_set(j->progress, "arch_weights", json_object_get(e, "arch_weights"));
        json_object_set_new(j->progress, "searching", json_false());
    } else if (strcmp(ev, "checkpoint") == 0) {
        j->ckpt_step = (long)json_integer_value(json_object_get(e, "step"));
    } else if (strcmp(ev, "done") == 0) {
        j->done_seen = 1;
        json_object_set(j->progress, "val_bpc", json_object_get(e, "val_bpc"));
        json_object_set(j->progress, "step", json_object_get(e, "step"));
    }
}

/* Reads the log's complete new lines. Returns 1 when there were some. */
static int read_log(job_t *j)
{
    char path[PATH_MAX];
    job_path(j, "train.log", path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_size < j->log_off) {   /* a fresh run truncated it */
        j->log_off = 0;
        j->n_events = 0;
        json_object_clear(j->progress);
        j->ckpt_step = -1;
        j->done_seen = 0;
    }
    int any = 0;
    char buf[1 << 16];
    for (;;) {
        ssize_t n = pread(fd, buf, sizeof buf, j->log_off);
        if (n <= 0) break;
        char *p = buf, *end = buf + n, *nl;
        while ((nl = memchr(p, '\n', (size_t)(end - p)))) {
            json_t *e = json_loadb(p, (size_t)(nl - p), 0, NULL);
            if (json_is_object(e)) take_event(j, e);
            json_decref(e);
            j->log_off += nl + 1 - p;
            p = nl + 1;
            any = 1;
        }
        if (p == buf) {   /* a line longer than the buffer: not one of the trainer's; skip it */
            if (n < (ssize_t)sizeof buf) break;
            j->log_off += n;
        }
        if (n < (ssize_t)sizeof buf) break;
    }
    close(fd);
    return any;
}

/* ------------------------------------------------------------ processes */

/* Starts J's trainer. The child: a session of its own (a signal to the
 * server's group does not reach it; it outlives the server), the job's
 * directory as working directory, its output to stderr.log, no descriptor
 * of the server's, default signals. Everything is prepared before fork. */
static int job_spawn(job_t *j, char *err)
{
    char dir[PATH_MAX], cfg[PATH_MAX], logp[PATH_MAX], errp[PATH_MAX], state[PATH_MAX + 8], out[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", jobs_dir, j->id);
    job_path(j, "config.json", cfg, sizeof cfg);
    job_path(j, "train.log", logp, sizeof logp);
    job_path(j, "stderr.log", errp, sizeof errp);
    job_path(j, "model.safetensors", out, sizeof out);
    train_state_path(out, state, sizeof state);
    int resume = j->resume && access(state, F_OK) == 0;
    char *argv[] = {"spanserve", "train", "--config", cfg, "--log", logp, "--device", j->device,
                    resume ? "--resume" : NULL, NULL};
    int efd = open(errp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int nfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (efd < 0 || nfd < 0) {
        if (efd >= 0) close(efd);
        if (nfd >= 0) close(nfd);
        return snprintf(err, 512, "cannot open %s", errp), -1;
    }
    /* the environment, less the server's keys: the trainer needs none */
    extern char **environ;
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **envp = malloc((ne + 2) * sizeof *envp);
    if (!envp) {
        close(efd);
        close(nfd);
        return snprintf(err, 512, "out of memory"), -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "SPANSERVE_ADMIN_KEY=", 20) != 0 && strncmp(environ[i], "SPANSERVE_API_KEY=", 18) != 0 &&
            (!j->n_gpu_ids || strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) != 0))
            envp[k++] = environ[i];
    /* a GPU job sees only the GPUs it was given */
    char visible[32 + 16 * 18];
    if (j->n_gpu_ids) {
        int len = snprintf(visible, sizeof visible, "CUDA_VISIBLE_DEVICES=");
        for (int i = 0; i < j->n_gpu_ids && len < (int)sizeof visible; i++) {
            const int g = j->gpu_ids[i];
            if (n_visible > 0 && g < n_visible)
                len += snprintf(visible + len, sizeof visible - (size_t)len, "%s%s", i ? "," : "", visible_ids[g]);
            else
                len += snprintf(visible + len, sizeof visible - (size_t)len, "%s%d", i ? "," : "", g);
        }
        envp[k++] = visible;
    }
    envp[k] = NULL;
    long maxfd = sysconf(_SC_OPEN_MAX);
    if (maxfd < 0 || maxfd > 65536) maxfd = 65536;
    sigset_t none;
    sigemptyset(&none);
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        if (chdir(dir) != 0) _exit(126);
        dup2(nfd, 0);
        dup2(efd, 1);
        dup2(efd, 2);
#ifdef SYS_close_range
        if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
#endif
            for (long fd = 3; fd < maxfd; fd++) close((int)fd);
        signal(SIGPIPE, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    free(envp);
    close(efd);
    close(nfd);
    if (pid < 0) return snprintf(err, 512, "cannot start the trainer: %s", strerror(errno)), -1;
    j->pid = pid;
    j->own = 1;
    j->pid_start = proc_start(pid);
    j->runs++;
    j->run_t0 = now_s();
    j->run_step0 = resume ? j->ckpt_step : 0;
    if (!resume) {   /* the trainer starts its log afresh */
        j->log_off = 0;
        j->n_events = 0;
        json_object_clear(j->progress);
        j->ckpt_step = -1;
    }
    j->done_seen = 0;
    log_line("job %s: started, pid %d%s", j->id, (int)pid, resume ? " (resumed from its last checkpoint)" : "");
    return 0;
}

/* Whether J's process has ended; *CODE gets its exit status (-1: unknown,
 * or killed: *SIG the signal). */
static int job_exited(job_t *j, int *code, int *sig)
{
    *code = -1;
    *sig = 0;
    if (j->own) {
        int st;
        pid_t p = waitpid(j->pid, &st, WNOHANG);
        if (p == 0) return 0;
        if (p == j->pid) {
            if (WIFEXITED(st)) *code = WEXITSTATUS(st);
            else if (WIFSIGNALED(st)) *sig = WTERMSIG(st);
        }
        return 1;   /* reaped, or not ours after all (ECHILD) */
    }
    return proc_start(j->pid) != j->pid_start || j->pid_start == 0;
}

/* ------------------------------------------------------------ finishing */

/* Copies SRC to DST (a new file) through a temporary file. */
static int copy_file(const char *src, const char *dst)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.copy", dst);
    int in = open(src, O_RDONLY | O_CLOEXEC), out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = in < 0 || out < 0 ? -1 : 0;
    char buf[1 << 16];
    while (rc == 0) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) { rc = n < 0 ? -1 : 0; break; }
        if (write(out, buf, (size_t)n) != n) rc = -1;
    }
    if (in >= 0) close(in);
    if (out >= 0 && (fsync(out) || close(out))) rc = -1;
    if (rc == 0 && link(tmp, dst) != 0) rc = -1;   /* never over an existing model file */
    unlink(tmp);
    return rc;
}

/* The checkpoint becomes a model: a file in --model-dir named after it
 * (when the server has one), loaded when deploy was asked. A failure here
 * leaves the job succeeded, with the reason in model.error. */
static void register_model(job_t *j)
{
    char ckpt[PATH_MAX];
    job_path(j, "model.safetensors", ckpt, sizeof ckpt);
    snprintf(j->model_path, sizeof j->model_path, "%s", ckpt);
    if (srv.cfg.model_dir) {
        char dst[PATH_MAX];
        snprintf(dst, sizeof dst, "%s/%s.safetensors", srv.cfg.model_dir, j->model_name);
        if (link(ckpt, dst) == 0 || copy_file(ckpt, dst) == 0) snprintf(j->model_path, sizeof j->model_path, "%s", dst);
        else snprintf(j->model_error, sizeof j->model_error, "cannot put the checkpoint in the model directory as %s.safetensors: %s",
                      j->model_name, strerror(errno));
    }
    if (j->deploy && !j->model_error[0]) {
        char e[512];
        int st;
        pthread_mutex_lock(&srv.lock);
        smodel_t *sm = srv.draining ? NULL : models_add(j->model_name, j->model_path, j->model_path, NULL, e, &st);
        pthread_mutex_unlock(&srv.lock);
        if (sm) j->deployed = 1;
        else snprintf(j->model_error, sizeof j->model_error, "not deployed: %s", srv.draining ? "the server is shutting down" : e);
    }
    log_line("job %s: model %s at %s%s%s", j->id, j->model_name, j->model_path, j->deployed ? ", deployed" : "",
             j->model_error[0] ? j->model_error : "");
}

/* The step of J's state sidecar, the step a resume starts from (-1: none).
 * The trainer writes it, then the checkpoint, then the log's "checkpoint"
 * line: a process killed between them leaves files newer than its log. */
static long state_step(const job_t *j)
{
    char path[PATH_MAX], err[512];
    job_path(j, "model.safetensors.state", path, sizeof path);
    if (access(path, F_OK) != 0) return -1;
    st_file *f = st_open(path, err);
    const char *v = f ? st_meta(f, "step") : NULL;
    char *end = NULL;
    long step = v ? strtol(v, &end, 10) : -1;
    if (!v || end == v || *end || step < 0) step = -1;
    st_close(f);
    return step;
}

/* The process of J ended (CODE, SIG: job_exited's): the outcome. */
static void job_finish(job_t *j, int code, int sig)
{
    read_log(j);
    long on_disk = state_step(j);
    if (on_disk > j->ckpt_step) j->ckpt_step = on_disk;
    j->exit_code = code;
    j->finished = time(NULL);
    j->t_finished = wall_s();
    j->pid = 0;
    j->n_gpu_ids = 0;   /* its GPUs are free again */
    char last[400];
    last_error_line(j, last, sizeof last);
    if (j->cancelling) {
        j->status = JOB_CANCELLED;
        snprintf(j->error, sizeof j->error, "cancelled%s", j->ckpt_step >= 0 ? "; the last checkpoint is kept" : "");
    } else if ((code == 0 || (code < 0 && !sig)) && j->done_seen) {
        j->status = JOB_SUCCEEDED;
        j->error[0] = 0;
        register_model(j);
    } else {
        j->status = JOB_FAILED;
        if (sig) snprintf(j->error, sizeof j->error, "the trainer was killed by signal %d (%s)%s%s", sig, strsignal(sig),
                          *last ? ": " : "", last);
        else if (code > 0) snprintf(j->error, sizeof j->error, "the trainer exited with status %d%s%s", code,
                                    *last ? ": " : "", last);
        else snprintf(j->error, sizeof j->error, "the trainer's process ended without finishing (the server was not "
                                                  "watching)%s%s", *last ? ": " : "", last);
    }
    j->cancelling = 0;
    runs_ended[j->status]++;
    if (j->webhook) {
        j->hook = HOOK_PENDING;
        j->hook_attempts = 0;
        j->hook_next = now_s();
        j->hook_error[0] = 0;
    }
    log_line("job %s: %s%s%s", j->id, job_status_name(j->status), j->error[0] ? ": " : "", j->error);
    job_save(j);
    jobs_wake_watchers(j);
    pthread_cond_broadcast(&jobs_wake);
}

int jobs_cancel(job_t *j, char *err, int *status)
{
    if (j->status == JOB_CANCELLED) return 0;
    if (job_is_terminal(j)) {
        *status = 409;
        return snprintf(err, 512, "job '%s' has %s already", j->id, job_status_name(j->status)), -1;
    }
    if (j->status == JOB_QUEUED) {
        j->status = JOB_CANCELLED;
        j->finished = time(NULL);
        j->t_finished = j->t_started ? wall_s() : 0;
        snprintf(j->error, sizeof j->error, "cancelled before it started");
        if (j->webhook) { j->hook = HOOK_PENDING; j->hook_attempts = 0; j->hook_next = now_s(); }
        log_line("job %s: cancelled while queued", j->id);
    } else if (!j->cancelling) {
        j->cancelling = 1;
        j->kill_at = now_s() + srv.cfg.cancel_grace;
        if (kill(j->pid, SIGTERM) != 0 && errno != ESRCH) log_line("job %s: SIGTERM: %s", j->id, strerror(errno));
        log_line("job %s: cancelling (SIGTERM to %d, SIGKILL in %.0f s)", j->id, (int)j->pid, srv.cfg.cancel_grace);
    }
    job_save(j);
    jobs_wake_watchers(j);
    pthread_cond_broadcast(&jobs_wake);
    return 0;
}

int jobs_resume(job_t *j, char *err, int *status)
{
    if (j->status != JOB_FAILED && j->status != JOB_CANCELLED) {
        *status = 409;
        return snprintf(err, 512, "job '%s' is %s: only a failed or cancelled job can be resumed", j->id,
                        job_status_name(j->status)), -1;
    }
    if (stopping) { *status = 503; return snprintf(err, 512, "the server is shutting down"), -1; }
    if (j->file_id[0]) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", files_dir, j->file_id);
        if (access(p, R_OK) != 0) {
            *status = 409;
            return snprintf(err, 512, "file '%s', the job's text, has been deleted", j->file_id), -1;
        }
    }
    char e[512];
    if (name_taken(j, j->model_name, j->deploy, e)) { *status = 409; return snprintf(err, 512, "%s", e), -1; }
    j->status = JOB_QUEUED;
    j->resume = 1;
    j->error[0] = 0;
    j->exit_code = -1;
    j->finished = 0;
    j->t_finished = 0;
    j->seq = ++jobs_seq;   /* to the back of the queue */
    job_t **p = &jobs;
    while (*p != j) p = &(*p)->next;
    *p = j->next;
    jobs_append(j);
    j->hook = HOOK_NONE;
    j->hook_attempts = 0;
    j->hook_error[0] = 0;
    log_line("job %s: resumed (queued again)", j->id);
    job_save(j);
    jobs_wake_watchers(j);
    pthread_cond_broadcast(&jobs_wake);
    return 0;
}

/* Removes directory DIR of plain files (job directories hold nothing else);
 * links are removed, never followed. */
static int remove_flat_dir(const char *dir, char *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : (snprintf(err, 512, "cannot open %s: %s", dir, strerror(errno)), -1);
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return snprintf(err, 512, "cannot read %s: %s", dir, strerror(errno)), -1;
    }
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && unlinkat(fd, e->d_name, 0) != 0 && errno != ENOENT) {
            snprintf(err, 512, "cannot remove %s/%s: %s", dir, e->d_name, strerror(errno));
            rc = -1;
        }
    closedir(d);
    if (rc == 0 && rmdir(dir) != 0 && errno != ENOENT) {
        snprintf(err, 512, "cannot remove %s: %s", dir, strerror(errno));
        rc = -1;
    }
    return rc;
}

/* A job directory is renamed to ID~deleting (a name no job can have) before
 * its files go, so that a crash midway leaves no half a job; start removes
 * what such a crash left. */
#define TRASH_SUFFIX "~deleting"

static void remove_trash(void)
{
    DIR *d = opendir(jobs_dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name), t = strlen(TRASH_SUFFIX);
        if (n <= t || strcmp(e->d_name + n - t, TRASH_SUFFIX) != 0) continue;
        char path[PATH_MAX], err[512];
        snprintf(path, sizeof path, "%s/%s", jobs_dir, e->d_name);
        if (remove_flat_dir(path, err)) log_line("jobs: %s", err);
    }
    if (d) closedir(d);
}

/* Whether a model is loaded from J's directory (J succeeded without
 * --model-dir and deployed its checkpoint). */
static int serves_from_job(const job_t *j)
{
    if (j->status != JOB_SUCCEEDED || !j->model_path[0]) return 0;
    char dir[PATH_MAX];
    job_path(j, "", dir, sizeof dir);
    if (strncmp(j->model_path, dir, strlen(dir)) != 0) return 0;
    pthread_mutex_lock(&srv.lock);
    smodel_t *sm = models_find(j->model_name);
    int served = sm && sm->path && strcmp(sm->path, j->model_path) == 0;
    pthread_mutex_unlock(&srv.lock);
    return served;
}

int jobs_delete(job_t *j, char *err, int *status)
{
    *status = 409;
    if (!job_is_terminal(j))
        return snprintf(err, 512, "job '%s' is %s: cancel it first", j->id, job_status_name(j->status)), -1;
    if (serves_from_job(j))
        return snprintf(err, 512, "model '%s' is served from job '%s''s directory: delete the model first "
                        "(DELETE /v1/models/%s on the inference listener)", j->model_name, j->id, j->model_name), -1;
    char dir[PATH_MAX], trash[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", jobs_dir, j->id);
    snprintf(trash, sizeof trash, "%s/%s" TRASH_SUFFIX, jobs_dir, j->id);
    *status = 500;
    if (rename(dir, trash) != 0 && errno != ENOENT)
        return snprintf(err, 512, "cannot remove %s: %s", dir, strerror(errno)), -1;
    char e2[512];
    if (remove_flat_dir(trash, e2)) log_line("job %s: %s (left for the next start)", j->id, e2);
    job_t **p = &jobs;
    while (*p && *p != j) p = &(*p)->next;
    if (*p) *p = j->next;
    log_line("job %s: deleted%s", j->id, j->hook == HOOK_PENDING ? " (its webhook not delivered)" : "");
    if (j->watchers) {   /* their streams end, the last one frees it */
        j->removed = 1;
        jobs_wake_watchers(j);
    } else {
        job_free(j);
    }
    return 0;
}

/* --job-retention: finished jobs past it are deleted (not one whose webhook
 * is still due, or whose model is served from its directory). */
static void prune_jobs(void)
{
    static double next;
    if (srv.cfg.job_retention <= 0 || now_s() < next) return;
    next = now_s() + 1;   /* once a second is plenty */
    time_t now = time(NULL);
    for (job_t *j = jobs, *nx; j; j = nx) {
        nx = j->next;
        if (!job_is_terminal(j) || !j->finished || difftime(now, j->finished) < srv.cfg.job_retention ||
            j->hook == HOOK_PENDING || j->prune_failed || serves_from_job(j))
            continue;
        char err[512], id[NAME_MAX_LEN + 1];
        int st;
        snprintf(id, sizeof id, "%s", j->id);
        if (jobs_delete(j, err, &st) == 0) {
            log_line("job %s: finished more than %.0f s ago: deleted (--job-retention)", id, srv.cfg.job_retention);
        } else {
            j->prune_failed = 1;   /* said once; DELETE /v1/jobs/ID or a restart tries again */
            log_line("job %s: --job-retention: %s", id, err);
        }
    }
}

/* ------------------------------------------------------------ the runner */

/* What a job takes of --max-jobs: its GPUs, or one. */
static int job_units(const job_t *j) { return j->gpus > 0 ? j->gpus : 1; }

/* J's GPUs among those no running job holds, lowest first; 0 when not
 * enough are free yet (or the machine's GPUs cannot be listed: then the
 * job sees them all, as a job on one GPU always did) */
static int assign_gpus(job_t *j)
{
    j->n_gpu_ids = 0;
    if (!j->gpus || !gpu_count) return 1;
    char busy[64] = {0};
    for (job_t *o = jobs; o; o = o->next)
        if (o->status == JOB_RUNNING)
            for (int i = 0; i < o->n_gpu_ids; i++) busy[o->gpu_ids[i] & 63] = 1;
    int ids[16], n = 0;
    for (int g = 0; g < gpu_count && g < 64 && n < j->gpus; g++)
        if (!busy[g]) ids[n++] = g;
    if (n < j->gpus) return 0;
    memcpy(j->gpu_ids, ids, sizeof(int) * n);
    j->n_gpu_ids = n;
    return 1;
}

static void *runner_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&jobs_lock);
    while (!stopping) {
        int running = 0;   /* in units of --max-jobs */
        for (job_t *j = jobs; j; j = j->next) {
            if (j->status != JOB_RUNNING) continue;
            int changed = read_log(j);
            int code, sig;
            if (job_exited(j, &code, &sig)) {
                job_finish(j, code, sig);
                continue;
            }
            running += job_units(j);
            if (j->cancelling && now_s() >= j->kill_at) {
                log_line("job %s: still running %.0f s after SIGTERM: SIGKILL", j->id, srv.cfg.cancel_grace);
                kill(j->pid, SIGKILL);
                j->kill_at = now_s() + 3600;
            }
            if (changed) jobs_wake_watchers(j);
        }
        /* in the order they came: the first that cannot start yet (too few
         * units or GPUs free) waits, and those after it too */
        for (job_t *j = jobs; j; j = j->next) {
            if (j->status != JOB_QUEUED) continue;
            if (running + job_units(j) > srv.cfg.max_jobs || !assign_gpus(j)) break;
            char err[512];
            j->status = JOB_RUNNING;
            j->started = time(NULL);   /* of this run: elapsed_s is the current run's */
            j->t_started = wall_s();
            j->t_finished = 0;
            if (job_spawn(j, err)) {
                j->status = JOB_FAILED;
                j->finished = time(NULL);
                j->n_gpu_ids = 0;
                snprintf(j->error, sizeof j->error, "%s", err);
                log_line("job %s: %s", j->id, err);
            } else {
                running += job_units(j);
            }
            job_save(j);
            jobs_wake_watchers(j);
        }
        keepalive_watchers();
        prune_jobs();
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(RUNNER_TICK_S * 1e9);
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&jobs_wake, &jobs_lock, &ts);
    }
    pthread_mutex_unlock(&jobs_lock);
    return NULL;
}

/* ------------------------------------------------------------ webhooks */

static int hook_abort(void *cls, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)cls, (void)dt, (void)dn, (void)ut, (void)un;
    return __atomic_load_n(&stopping, __ATOMIC_RELAXED);
}

static size_t hook_discard(char *p, size_t size, size_t n, void *cls)
{
    (void)p, (void)cls;
    return size * n;
}

/* One POST of BODY to URL, under fetch.c's destination policy (no
 * redirects followed); 0 on a 2xx answer, else ERR. */
static int hook_post(const char *url, const char *body, char *err, size_t cap)
{
    CURL *c = curl_easy_init();
    if (!c) return snprintf(err, cap, "libcurl could not start"), -1;
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "User-Agent: spanserve-jobs");
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, CURLPROTO_HTTP | CURLPROTO_HTTPS);
#endif
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 5L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, HOOK_TIMEOUT_S);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, hook_discard);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, hook_abort);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    CURLcode rc = fetch_perform(c, url, err, cap);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) return -1;
    if (status < 200 || status >= 300) return snprintf(err, cap, "the receiver answered HTTP %ld", status), -1;
    return 0;
}

static void *hook_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&jobs_lock);
    while (!stopping) {
        job_t *due = NULL;
        double next = now_s() + 1;
        for (job_t *j = jobs; j; j = j->next) {
            if (j->hook != HOOK_PENDING) continue;
            if (j->hook_next <= now_s()) { due = j; break; }
            if (j->hook_next < next) next = j->hook_next;
        }
        if (!due) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double wait = next - now_s();
            wait = wait < 0.01 ? 0.01 : wait > 1 ? 1 : wait;
            ts.tv_sec += (time_t)wait;
            ts.tv_nsec += (long)((wait - floor(wait)) * 1e9);
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&jobs_wake, &jobs_lock, &ts);
            continue;
        }
        /* the request runs without the lock: the job's object is taken now */
        due->hook_attempts++;
        json_t *o = job_json(due);
        char *body = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        json_decref(o);
        char *url = strdup(due->webhook);
        char id[NAME_MAX_LEN + 1];
        snprintf(id, sizeof id, "%s", due->id);
        pthread_mutex_unlock(&jobs_lock);
        char err[256] = "out of memory";
        int rc = body && url ? hook_post(url, body, err, sizeof err) : -1;
        free(body);
        free(url);
        pthread_mutex_lock(&jobs_lock);
        job_t *j = jobs_find(id);
        if (!j || j->hook != HOOK_PENDING) continue;   /* resumed meanwhile */
        if (rc == 0) {
            j->hook = HOOK_DELIVERED;
            hooks_delivered++;
            j->hook_error[0] = 0;
            log_line("job %s: webhook delivered (attempt %d)", j->id, j->hook_attempts);
        } else {
            snprintf(j->hook_error, sizeof j->hook_error, "%s", err);
            if (j->hook_attempts >= HOOK_ATTEMPTS || stopping) {
                if (!stopping) {
                    j->hook = HOOK_FAILED;
                    hooks_failed++;
                }
                log_line("job %s: webhook %s after %d attempts: %s", j->id, stopping ? "left for the next start" : "failed",
                         j->hook_attempts, err);
            } else {
                j->hook_next = now_s() + HOOK_DELAY_S * pow(2, j->hook_attempts - 1);
                log_line("job %s: webhook attempt %d failed (%s); again in %.0f s", j->id, j->hook_attempts, err,
                         HOOK_DELAY_S * pow(2, j->hook_attempts - 1));
            }
        }
        job_save(j);
    }
    pthread_mutex_unlock(&jobs_lock);
    return NULL;
}

/* ------------------------------------------------------------ start and stop */

static int mkdir_p(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0700) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(buf, 0700) && errno != EEXIST ? -1 : 0;
}

/* A job of an earlier run, from its job.json; NULL (logged) when it cannot
 * be read. */
static job_t *job_load(const char *id)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s/job.json", jobs_dir, id);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    job_t *j = calloc(1, sizeof *j);
    train_cfg cfg;
    char err[512];
    int st, status = o ? status_from_name(json_string_value(json_object_get(o, "status"))) : -1;
    json_t *req = json_object_get(o, "request");
    if (!j || status < 0 || !json_is_object(req) || jobs_validate(req, &cfg, err, &st)) {
        log_line("jobs: %s: not a job (%s); left alone", path, o ? (status < 0 ? "no status" : err) : je.text);
        json_decref(o);
        free(j);
        return NULL;
    }
    snprintf(j->id, sizeof j->id, "%s", id);
    if (job_init(j, req, &cfg)) { json_decref(o); job_free(j); return NULL; }
    /* the device the job was given, whatever the default is now */
    json_t *c = json_load_file((snprintf(path, sizeof path, "%s/%s/config.json", jobs_dir, id), path), 0, NULL);
    const char *dev = json_string_value(json_object_get(c, "device"));
    if (dev) snprintf(j->device, sizeof j->device, "%s", dev);
    const char *data = json_string_value(json_object_get(c, "data"));
    const char *file = json_string_value(json_object_get(req, "file"));
    if (file && data && strncmp(data, files_dir, strlen(files_dir)) == 0) snprintf(j->file_id, sizeof j->file_id, "%s", file);
    json_decref(c);
    j->status = (job_status)status;
    j->seq = (uint64_t)json_integer_value(json_object_get(o, "seq"));
    j->created = (time_t)json_integer_value(json_object_get(o, "created"));
    j->started = (time_t)json_integer_value(json_object_get(o, "started"));
    j->finished = (time_t)json_integer_value(json_object_get(o, "finished"));
    j->t_started = json_number_value(json_object_get(o, "t_started"));
    j->t_finished = json_number_value(json_object_get(o, "t_finished"));
    j->pid = (pid_t)json_integer_value(json_object_get(o, "pid"));
    j->pid_start = (unsigned long long)json_integer_value(json_object_get(o, "pid_start"));
    json_t *ids = json_object_get(o, "gpu_ids");
    for (size_t i = 0; i < json_array_size(ids) && j->n_gpu_ids < 16; i++) {
        json_int_t g = json_integer_value(json_array_get(ids, i));
        if (g >= 0 && g < 64) j->gpu_ids[j->n_gpu_ids++] = (int)g;
    }
    j->runs = (int)json_integer_value(json_object_get(o, "runs"));
    j->resume = json_integer_value(json_object_get(o, "resume")) != 0;
    j->cancelling = json_integer_value(json_object_get(o, "cancelling")) != 0;
    j->exit_code = (int)json_integer_value(json_object_get(o, "exit_code"));
    j->deployed = json_integer_value(json_object_get(o, "deployed")) != 0;
    j->hook_attempts = (int)json_integer_value(json_object_get(o, "hook_attempts"));
    snprintf(j->error, sizeof j->error, "%s", json_string_value(json_object_get(o, "error")) ?: "");
    snprintf(j->model_path, sizeof j->model_path, "%s", json_string_value(json_object_get(o, "model_path")) ?: "");
    snprintf(j->model_error, sizeof j->model_error, "%s", json_string_value(json_object_get(o, "model_error")) ?: "");
    snprintf(j->hook_error, sizeof j->hook_error, "%s", json_string_value(json_object_get(o, "hook_error")) ?: "");
    const char *h = json_string_value(json_object_get(o, "hook"));
    for (int i = 0; h && i <= HOOK_FAILED; i++)
        if (strcmp(h, hook_name((hook_state)i)) == 0) j->hook = (hook_state)i;
    if (!j->webhook) j->hook = HOOK_NONE;
    j->hook_next = now_s();
    json_decref(o);
    read_log(j);
    if (j->status == JOB_RUNNING) {
        /* our child no more: found again if its process is still the one */
        j->own = 0;
        if (j->pid > 0 && j->pid_start && proc_start(j->pid) == j->pid_start) {
            log_line("job %s: still running (pid %d): followed again", j->id, (int)j->pid);
            if (j->cancelling) j->kill_at = now_s() + srv.cfg.cancel_grace;
            j->run_t0 = now_s();
            j->run_step0 = (long)json_integer_value(json_object_get(j->progress, "step"));
        } else {
            job_finish(j, -1, 0);   /* finished while away (its log says how), or died */
        }
    }
    return j;
}

static int count_gpus(void)
{
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

int jobs_start(char *err)
{
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", srv.cfg.state_dir);
    snprintf(files_dir, sizeof files_dir, "%s/files", srv.cfg.data_dir);
    if (mkdir_p(jobs_dir) || mkdir_p(files_dir))
        return snprintf(err, 512, "cannot make %s and %s: %s", jobs_dir, files_dir, strerror(errno)), -1;
    char *real = realpath(jobs_dir, NULL);
    if (!real) return snprintf(err, 512, "%s: %s", jobs_dir, strerror(errno)), -1;
    snprintf(jobs_dir, sizeof jobs_dir, "%s", real);
    free(real);
    /* the trainer's device: cuda where its checks take a family's recipe
     * and there is a GPU */
    cuda_ok = device_cuda_usable(cuda_why);
    for (int i = 0; cuda_ok && train_families[i]; i++) {
        train_cfg probe;
        char e2[ERR_LEN];
        train_cfg_defaults(&probe, train_families[i]);
        strcpy(probe.device, "cuda");
        strcpy(probe.data, "/data");
        strcpy(probe.out, "/out");
        if (train_cfg_check(&probe, e2) == 0) strcpy(default_device, "cuda");
    }
    gpu_count = cuda_ok ? count_gpus() : 0;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (cuda_ok && cvd) {   /* the server was given some of the machine's GPUs: its jobs share those */
        n_visible = 0;
        for (const char *p = cvd; *p && n_visible < 64;) {
            size_t n = strcspn(p, ",");
            if (n > 0 && n < sizeof visible_ids[0]) snprintf(visible_ids[n_visible++], sizeof visible_ids[0], "%.*s", (int)n, p);
            p += n + (p[n] == ',');
        }
        gpu_count = n_visible;
    }
    if (srv.cfg.max_jobs <= 0) {
        int g = strcmp(default_device, "cuda") == 0 ? gpu_count : 0;
        srv.cfg.max_jobs = g > 0 ? g : 1;
    }
    pthread_mutex_lock(&jobs_lock);
    remove_trash();
    DIR *d = opendir(jobs_dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!valid_name(e->d_name)) continue;
        job_t *j = job_load(e->d_name);
        if (!j) continue;
        jobs_append(j);
        if (j->seq > jobs_seq) jobs_seq = j->seq;
        n++;
    }
    if (d) closedir(d);
    started = 1;
    pthread_mutex_unlock(&jobs_lock);
    if (n) log_line("jobs: %d found in %s", n, jobs_dir);
    if (pthread_create(&runner_thread, NULL, runner_main, NULL) || pthread_create(&hook_thread, NULL, hook_main, NULL))
        return snprintf(err, 512, "cannot start the job threads"), -1;
    log_line("jobs: up to %d at once on %s; texts in %s", srv.cfg.max_jobs, default_device, files_dir);
    return 0;
}

void jobs_stop(void)
{
    if (!started) return;
    pthread_mutex_lock(&jobs_lock);
    stopping = 1;
    for (job_t *j = jobs; j; j = j->next) jobs_wake_watchers(j);   /* their streams end */
    pthread_cond_broadcast(&jobs_wake);
    pthread_mutex_unlock(&jobs_lock);
    pthread_join(runner_thread, NULL);
    pthread_join(hook_thread, NULL);
}

void jobs_metrics(FILE *f)
{
    pthread_mutex_lock(&jobs_lock);
    if (!started) {
        pthread_mutex_unlock(&jobs_lock);
        return;
    }
    int by[JOB_CANCELLED + 1] = {0};
    for (job_t *j = jobs; j; j = j->next) by[j->status]++;
    fprintf(f, "# HELP spanserve_jobs Training jobs by status.\n# TYPE spanserve_jobs gauge\n");
    for (int i = 0; i <= JOB_CANCELLED; i++)
        fprintf(f, "spanserve_jobs{status=\"%s\"} %d\n", job_status_name((job_status)i), by[i]);
    fprintf(f, "# HELP spanserve_job_runs_ended_total Training processes that ended, by the job's outcome.\n"
               "# TYPE spanserve_job_runs_ended_total counter\n");
    for (int i = JOB_SUCCEEDED; i <= JOB_CANCELLED; i++)
        fprintf(f, "spanserve_job_runs_ended_total{outcome=\"%s\"} %lu\n", job_status_name((job_status)i), runs_ended[i]);
    fprintf(f, "# HELP spanserve_job_webhooks_total Webhook deliveries: delivered, or given up after every retry.\n"
               "# TYPE spanserve_job_webhooks_total counter\n"
               "spanserve_job_webhooks_total{result=\"delivered\"} %lu\nspanserve_job_webhooks_total{result=\"failed\"} %lu\n",
            hooks_delivered, hooks_failed);
    pthread_mutex_unlock(&jobs_lock);
}

/* Frees the list, once the jobs listener has stopped. */
void jobs_free(void)
{
    pthread_mutex_lock(&jobs_lock);
    int running = 0;
    while (jobs) {
        job_t *j = jobs;
        jobs = j->next;
        running += j->status == JOB_RUNNING;
        job_free(j);
    }
    pthread_mutex_unlock(&jobs_lock);
    if (running) log_line("jobs: %d training processes left running; the next start follows them", running);
}
