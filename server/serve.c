/*
 * serve.c - `spanserve serve`: flags, the served models, start-up and the
 * orderly shutdown (drain, save every session, exit).
 */
#define _GNU_SOURCE
#include "server.h"
#include "cli.h"
#include "jobs.h"
#include "report.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

server_t srv = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

void log_line(const char *fmt, ...)
{
    char ts[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    va_list ap;
    va_start(ap, fmt);
    flockfile(stderr);
    fprintf(stderr, "%s ", ts);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    funlockfile(stderr);
    va_end(ap);
}

int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > NAME_MAX_LEN) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* ------------------------------------------------------------ models */

smodel_t *models_find(const char *name)
{
    for (smodel_t *m = srv.models; m; m = m->next)
        if (strcmp(m->name, name) == 0) return m;
    return NULL;
}

/* Is a model of COST within what the operator allows (--max-session-bytes,
 * --max-step-gflop)? A well-formed checkpoint may still ask for gigabytes a
 * session or seconds a step, and one scheduler serves every model. */
static int model_over_limits(const char *name, const model_cost *c, char *err)
{
    if (c->session_bytes > srv.cfg.max_session_bytes)
        return snprintf(err, 512, "model '%s' is refused: a session of it holds %zu bytes of memory, over "
                        "--max-session-bytes %zu", name, c->session_bytes, srv.cfg.max_session_bytes), -1;
    if (c->block_flops > srv.cfg.max_step_flops)
        return snprintf(err, 512, "model '%s' is refused: one block of one stream costs about %.1f GFLOP, over "
                        "--max-step-gflop %g", name, c->block_flops * 1e-9, srv.cfg.max_step_flops * 1e-9), -1;
    return 0;
}

int models_name_free(const char *name, char *err, int *status)
{
    if (!valid_name(name)) {
        *status = 400;
        return snprintf(err, 512, "model name must be 1 to 64 of A-Z a-z 0-9 . _ - (and not . or ..)"), -1;
    }
    if (models_find(name)) {
        *status = 409;
        return snprintf(err, 512, "model '%s' is loaded already", name), -1;
    }
    return 0;
}

model_t *models_load(const char *name, const char *path, const char *shown, const char *settings, char *err,
                     int *status)
{
    char e2[ERR_LEN];
    model_t *m = model_load_set(path, shown, srv.cfg.mem_mode, settings, e2);
    if (!m) {
        *status = 400;
        snprintf(err, 512, "%s", e2);
        return NULL;
    }
    model_cost cost;
    model_cost_of(m, &cost);
    if (model_over_limits(name, &cost, err)) {
        model_free(m);
        *status = 422;
        return NULL;
    }
    if (srv.cfg.cuda && !device_supports(m, e2)) {
        log_line("model %s: %s", name, e2);   /* a family the GPU backend lacks runs on the CPU */
    } else if (srv.cfg.cuda && device_attach(m, srv.cfg.bf16, e2)) {
        model_free(m);
        *status = 503;
        snprintf(err, 512, "%s: cannot put the model on the GPU: %s", name, e2);
        return NULL;
    }
    return m;
}

void models_unload(model_t *m)
{
    device_detach(m);
    model_free(m);
}

smodel_t *models_insert(const char *name, model_t *m, const char *path, char *err, int *status)
{
    smodel_t *sm = calloc(1, sizeof *sm);
    if (!sm || !(sm->path = strdup(path))) {
        models_unload(m);
        free(sm);
        *status = 503;
        snprintf(err, 512, "out of memory");
        return NULL;
    }
    snprintf(sm->name, sizeof sm->name, "%s", name);
    sm->m = m;
    sm->created = time(NULL);
    chat_template_default(&sm->chat);
    model_cost_of(m, &sm->cost);
    smodel_t **p = &srv.models;
    while (*p) p = &(*p)->next;
    *p = sm;
    log_line("model %s: %s, %s, %lld parameters, %zu bytes per session, on %s (%s)", name, path,
             model_family_name(m), (long long)m->n_params, m->backend ? device_session_bytes(m) : mem_bytes(m),
             device_name(m), device_precision(m));
    if (srv.ready) {   /* loaded at run time: its saved sessions come back too */
        int n = sess_load_all(sm);
        if (n) log_line("state: %d sessions of %s found", n, name);
    }
    return sm;
}

/* Loading a large file holds srv.lock for that long, which only delays
 * other model changes and new tasks. */
smodel_t *models_add(const char *name, const char *path, const char *shown, const char *settings, char *err,
                     int *status)
{
    if (models_name_free(name, err, status)) return NULL;
    model_t *m = models_load(name, path, shown, settings, err, status);
    return m ? models_insert(name, m, path, err, status) : NULL;
}

int models_remove(const char *name, char *err, int *status)
{
    smodel_t **p = &srv.models;
    while (*p && strcmp((*p)->name, name) != 0) p = &(*p)->next;
    if (!*p) {
        *status = 404;
        return snprintf(err, 512, "no model '%s'", name), -1;
    }
    smodel_t *sm = *p;
    int busy = sm->tasks > 0;
    for (session_t *s = srv.sessions; s && !busy; s = s->next) busy = s->model == sm && s->busy;
    if (busy) {
        *status = 409;
        return snprintf(err, 512, "model '%s' has requests in flight; retry when they end", name), -1;
    }
    *p = sm->next;
    sess_delete_model(sm);
    models_unload(sm->m);
    free(sm->path);
    free(sm);
    log_line("model %s: unloaded", name);
    return 0;
}

/* OpenAI's model object (id, object, created, owned_by: what its clients
 * read), then spanserve's fields. */
json_t *models_json(const smodel_t *sm)
{
    json_t *j = json_pack("{s:s, s:s, s:I, s:s}", "id", sm->name, "object", "model", "created", (json_int_t)sm->created,
                          "owned_by", "spanserve");
    json_t *rep = report_model(sm->m);
    json_object_update(j, rep);
    json_decref(rep);
    json_object_set_new(j, "name", json_string(sm->name));
    json_object_set_new(j, "device", json_string(device_name(sm->m)));
    json_object_set_new(j, "precision", json_string(device_precision(sm->m)));
    json_object_set_new(j, "cost", report_cost(&sm->cost));
    json_object_set_new(j, "chat_template", chat_template_json(&sm->chat));
    if (sm->m->backend) {
        json_t *mem = json_object_get(j, "memory");
        if (mem) json_object_set_new(mem, "device_bytes_per_stream", json_integer((json_int_t)device_session_bytes(sm->m)));
    }
    return j;
}

/* ------------------------------------------------------------ flags */

static const char serve_usage[] =
    "usage: spanserve serve [--listen HOST:PORT] [--model NAME=PATH]... [options]\n"
    "\n"
    "Serves models over HTTP (docs/API.md; GET /openapi.json).\n"
    "\n"
    "  --listen HOST:PORT      address to listen on (default 127.0.0.1:8080; [::1]:8080 for IPv6)\n"
    "  --model NAME=PATH       load a checkpoint at start (repeatable)\n"
    "  --set NAME:KEY=VALUE    a setting of model NAME over its checkpoint's (repeatable;\n"
    "                          transformer-xl: eval_tgt_len, eval_mem_len, eval_clamp_len,\n"
    "                          eval_same_length)\n"
    "  --model-dir DIR         where POST /v1/models may load checkpoints from, and where\n"
    "                          downloads go (default: none, run-time loading off)\n"
    "  --state-dir DIR         session snapshots (default ./spanserve-state)\n"
    "  --api-key KEY           require Authorization: Bearer KEY (repeatable); also\n"
    "                          SPANSERVE_API_KEY\n"
    "  --api-key-file FILE     keys, one per line\n"
    "  --session-memory BYTES  live session memory before the least recently used\n"
    "                          sessions go to disk (default 1073741824; suffixes k, M, G)\n"
    "  --max-queue N           requests queued or running before 429 (default 256)\n"
    "  --max-body BYTES        request body limit (default 8M)\n"
    "  --max-tokens N          max_tokens limit per request (default 4096)\n"
    "  --max-prompt N          tokens per prompt or scored text (default 1000000)\n"
    "  --max-download BYTES    checkpoint size fetched by URL (default 2G)\n"
    "  --ca-file FILE          certificate authorities (PEM) trusted for https downloads\n"
    "                          and webhooks instead of the system's (a private CA)\n"
    "  --fetch-allow HOST      a host that downloads and webhooks may reach at any address\n"
    "                          (repeatable; a name or an IP address as URLs write it). By\n"
    "                          default they connect only to public addresses: never to\n"
    "                          loopback, private, link-local or other special ones\n"
    "  --request-timeout S     seconds a request may take (default 600)\n"
    "  --drain-timeout S       seconds to finish in-flight work on SIGTERM (default 30)\n"
    "  --memory exact|span     adaptive-span memory (default exact; see README)\n"
    "  --durability fsync|write|off\n"
    "                          when sessions reach --state-dir: after every request that\n"
    "                          changed one, synced (default: a crash of the process or the\n"
    "                          machine loses at most the requests in flight), written but not\n"
    "                          synced (survives the process dying, not the machine), or only\n"
    "                          when spilled and on shutdown (a crash loses what changed)\n"
    "  --max-session-bytes BYTES\n"
    "                          a model whose session memory is larger is refused (default 1G)\n"
    "  --max-step-gflop G      a model whose block of one stream costs more is refused, and\n"
    "                          a batch of streams is cut to stay under it (default 200)\n"
    "  --http-threads N        HTTP threads (default 2)\n"
    "  --header-timeout S      seconds a request's headers may take to arrive, counted from\n"
    "                          the connection's start or its previous request's end (default 10)\n"
    "  --max-connections N     open connections on each listener (default 1000)\n"
    "  --max-connections-per-client N\n"
    "                          open connections from one client address (default 256; 0: no\n"
    "                          bound; behind a proxy every client has the proxy's address)\n"
    "  --device cpu|cuda|auto  where the models run (default auto: the GPU when there is\n"
    "                          one and this build has the CUDA core, else the CPU)\n"
    "  --precision bf16|fp32   on the GPU: bf16 weights and memory, fp32 sums (default,\n"
    "                          fastest) or fp32 throughout (the reference to 1e-4);\n"
    "                          the CPU always computes in fp32\n"
    "\n"
    "Training jobs (a listener of their own; README \"Training jobs\"):\n"
    "  --jobs-listen HOST:PORT the jobs API's address (default: none, jobs off)\n"
    "  --admin-key KEY         the jobs API's key, required there (repeatable); also\n"
    "                          SPANSERVE_ADMIN_KEY\n"
    "  --admin-key-file FILE   admin keys, one per line\n"
    "  --data-dir DIR          training texts: uploads, and the paths jobs may name\n"
    "                          (default STATE_DIR/data)\n"
    "  --max-jobs N            training processes at once (default: one per GPU, 1 on\n"
    "                          the CPU)\n"
    "  --max-upload BYTES      a training text uploaded or fetched by URL (default 1G)\n"
    "  --cancel-grace S        seconds from SIGTERM to SIGKILL when a job is cancelled\n"
    "                          (default 10)\n"
    "  --job-retention S       finished jobs older than this are deleted with their\n"
    "                          directories (default 0: kept until DELETE /v1/jobs/ID)\n"
    "  --sse-keepalive S       a comment line on a quiet event stream this often\n"
    "                          (default 15; 0: none)\n"
    "\n"
    "Durations (S) are seconds, or a number with a suffix s, m, h or d.\n";

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1024, end++;
    else if (*end == 'M') mul = 1024.0 * 1024, end++;
    else if (*end == 'G') mul = 1024.0 * 1024 * 1024, end++;
    if (*end || v * mul > 1e18) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static int parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

/* Seconds, or a number with a suffix s, m, h or d; in [LO, HI] seconds. */
static int parse_duration(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s) return -1;
    static const struct { char c; double mul; } units[] = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}};
    for (size_t i = 0; *end && i < sizeof units / sizeof *units; i++)
        if (*end == units[i].c && !end[1]) v *= units[i].mul, end++;
    if (*end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

/* Appends a copy of K to the list *V of *N strings (keys, hosts). */
static int list_add(char ***v, int *n, const char *k)
{
    char **a = realloc(*v, (size_t)(*n + 1) * sizeof *a);
    if (!a) return -1;
    *v = a;
    if (!(a[*n] = strdup(k))) return -1;
    (*n)++;
    return 0;
}

/* A host as --fetch-allow takes it: what a URL's host part may be (an IPv6
 * literal with or without its brackets), not a URL or HOST:PORT. */
static int valid_fetch_host(const char *h)
{
    size_t n = strlen(h), colons = 0;
    if (n == 0 || n > 253) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)h[i];
        if (ch == ':') colons++;
        else if (!(ch == '.' || ch == '-' || ch == '_' || ch == '[' || ch == ']' || (ch >= '0' && ch <= '9')
                   || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z')))
            return 0;
    }
    return colons != 1;   /* one colon is HOST:PORT; IPv6 has two or more */
}

static int add_key(const char *k) { return list_add(&srv.cfg.api_keys, &srv.cfg.n_api_keys, k); }
static int add_admin_key(const char *k) { return list_add(&srv.cfg.admin_keys, &srv.cfg.n_admin_keys, k); }

/* Keys of FILE, one a line ('#' starts a comment line). */
static int read_keys(const char *path, int (*add)(const char *))
{
    FILE *f = fopen(path, "r");
    if (!f) return fprintf(stderr, "spanserve serve: %s: %s\n", path, strerror(errno)), -1;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (*line && *line != '#' && add(line)) { fclose(f); return -1; }
    }
    fclose(f);
    return 0;
}

static int mkdirs(const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0700) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(buf, 0700) && errno != EEXIST ? -1 : 0;
}

/* ------------------------------------------------------------ run */

static int stop_pipe[2] = {-1, -1};

static void on_stop_signal(int sig)
{
    int e = errno;
    unsigned char c = (unsigned char)sig;
    if (write(stop_pipe[1], &c, 1) < 0) {}   /* full: a stop is pending already */
    errno = e;
}

void serve_defaults(config_t *c)
{
    c->listen_addr = "127.0.0.1:8080";
    c->state_dir = "spanserve-state";
    c->session_memory = 1u << 30;
    c->max_queue = 256;
    c->max_body = 8u << 20;
    c->max_tokens = 4096;
    c->max_prompt = 1000000;
    c->max_download = 2ull << 30;
    c->request_timeout = 600;
    c->drain_timeout = 30;
    c->mem_mode = MEM_EXACT;
    c->durability = DURABLE_FSYNC;
    c->max_session_bytes = 1ull << 30;
    c->max_step_flops = 200e9;
    c->http_threads = 2;
    c->header_timeout = 10;
    c->max_connections = 1000;
    c->max_conn_per_client = 256;
    c->bf16 = 1;
    c->max_upload = 1ull << 30;
    c->cancel_grace = 10;
    c->sse_keepalive = 15;
}


int cmd_serve(int argc, char **argv)
{
    static const struct option opts[] = {
        {"listen", 1, 0, 'l'},        {"model", 1, 0, 'm'},        {"model-dir", 1, 0, 'D'},
        {"state-dir", 1, 0, 's'},     {"api-key", 1, 0, 'k'},      {"api-key-file", 1, 0, 'K'},
        {"session-memory", 1, 0, 'S'}, {"max-queue", 1, 0, 'q'},   {"max-body", 1, 0, 'b'},
        {"max-tokens", 1, 0, 't'},    {"max-prompt", 1, 0, 'p'},   {"max-download", 1, 0, 'd'},
        {"request-timeout", 1, 0, 'T'}, {"drain-timeout", 1, 0, 'r'}, {"memory", 1, 0, 'M'},
        {"http-threads", 1, 0, 'h'},  {"device", 1, 0, 'v'},       {"help", 0, 0, 'H'},
        {"precision", 1, 0, 'P'},
        {"jobs-listen", 1, 0, 'J'},   {"admin-key", 1, 0, 'A'},    {"admin-key-file", 1, 0, 'F'},
        {"data-dir", 1, 0, 'x'},      {"max-jobs", 1, 0, 'j'},     {"max-upload", 1, 0, 'u'},
        {"cancel-grace", 1, 0, 'g'},  {"ca-file", 1, 0, 'C'},     {"job-retention", 1, 0, 'R'},
        {"sse-keepalive", 1, 0, 'E'}, {"durability", 1, 0, 'Y'},  {"max-session-bytes", 1, 0, 'B'},
        {"max-step-gflop", 1, 0, 'W'}, {"header-timeout", 1, 0, 'O'}, {"max-connections", 1, 0, 'N'},
        {"max-connections-per-client", 1, 0, 'I'}, {"fetch-allow", 1, 0, 'a'}, {"set", 1, 0, 1001},
        {0, 0, 0, 0}};
    config_t *c = &srv.cfg;
    serve_defaults(c);
    const char *models[64], *device = "auto";
    int n_models = 0, ch;
    double d;
    json_t *model_sets = NULL;   /* --set NAME:KEY=VALUE: {NAME: {KEY: VALUE}} */
    char set_err[ERR_LEN];
    size_t z;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'l': c->listen_addr = optarg; break;
        case 'm':
            if (n_models == 64 || !strchr(optarg, '=')) return cli_usage_error("serve", "--model takes NAME=PATH (at most 64)");
            models[n_models++] = optarg;
            break;
        case 1001:
            if (cli_settings_add(&model_sets, optarg, 1, set_err)) return cli_usage_error("serve", "--set: %s", set_err);
            break;
        case 'D': c->model_dir = optarg; break;
        case 's': c->state_dir = optarg; break;
        case 'k':
            if (!*optarg || add_key(optarg)) return cli_usage_error("serve", "--api-key takes a non-empty key");
            break;
        case 'K':
            if (read_keys(optarg, add_key)) return 1;
            break;
        case 'J': c->jobs_listen = optarg; break;
        case 'A':
            if (!*optarg || add_admin_key(optarg)) return cli_usage_error("serve", "--admin-key takes a non-empty key");
            break;
        case 'F':
            if (read_keys(optarg, add_admin_key)) return 1;
            break;
        case 'x': c->data_dir = optarg; break;
        case 'j':
            if (parse_num(optarg, 1, 1024, &d)) return cli_usage_error("serve", "--max-jobs takes 1 to 1024");
            c->max_jobs = (int)d;
            break;
        case 'u':
            if (parse_size(optarg, &c->max_upload) || c->max_upload < 1) return cli_usage_error("serve", "--max-upload takes a byte count");
            break;
        case 'g':
            if (parse_duration(optarg, 0, 86400, &c->cancel_grace)) return cli_usage_error("serve", "--cancel-grace takes 0 to 86400 seconds");
            break;
        case 'R':
            if (parse_duration(optarg, 0, 1e10, &c->job_retention)) return cli_usage_error("serve", "--job-retention takes a duration (0: keep)");
            break;
        case 'E':
            if (parse_duration(optarg, 0, 3600, &c->sse_keepalive)) return cli_usage_error("serve", "--sse-keepalive takes 0 to 3600 seconds");
            break;
        case 'C':
            if (access(optarg, R_OK) != 0)
                return fprintf(stderr, "spanserve serve: --ca-file %s: %s\n", optarg, strerror(errno)), 2;
            c->ca_file = optarg;
            break;
        case 'a':
            if (!valid_fetch_host(optarg) || list_add(&c->fetch_allow, &c->n_fetch_allow, optarg))
                return cli_usage_error("serve", "--fetch-allow takes a host name or an IP address, without a port");
            break;
        case 'S':
            if (parse_size(optarg, &c->session_memory)) return cli_usage_error("serve", "--session-memory takes a byte count");
            break;
        case 'q':
            if (parse_num(optarg, 1, 1e6, &d)) return cli_usage_error("serve", "--max-queue takes 1 to 1000000");
            c->max_queue = (int)d;
            break;
        case 'b':
            if (parse_size(optarg, &z) || z < 1024 || z > (1ull << 32)) return cli_usage_error("serve", "--max-body takes 1k to 4G");
            c->max_body = z;
            break;
        case 't':
            if (parse_num(optarg, 1, 1e6, &d)) return cli_usage_error("serve", "--max-tokens takes 1 to 1000000");
            c->max_tokens = (int)d;
            break;
        case 'p':
            if (parse_num(optarg, 1, 1e9, &d)) return cli_usage_error("serve", "--max-prompt takes 1 to 1000000000");
            c->max_prompt = (int)d;
            break;
        case 'd':
            if (parse_size(optarg, &c->max_download)) return cli_usage_error("serve", "--max-download takes a byte count");
            break;
        case 'T':
            if (parse_duration(optarg, 0, 1e7, &c->request_timeout)) return cli_usage_error("serve", "--request-timeout takes seconds");
            break;
        case 'r':
            if (parse_duration(optarg, 0, 1e7, &c->drain_timeout)) return cli_usage_error("serve", "--drain-timeout takes seconds");
            break;
        case 'M':
            if (strcmp(optarg, "exact") == 0) c->mem_mode = MEM_EXACT;
            else if (strcmp(optarg, "span") == 0) c->mem_mode = MEM_SPAN;
            else return cli_usage_error("serve", "--memory takes exact or span");
            break;
        case 'Y':
            if (strcmp(optarg, "fsync") == 0) c->durability = DURABLE_FSYNC;
            else if (strcmp(optarg, "write") == 0) c->durability = DURABLE_WRITE;
            else if (strcmp(optarg, "off") == 0) c->durability = DURABLE_OFF;
            else return cli_usage_error("serve", "--durability takes fsync, write or off");
            break;
        case 'B':
            if (parse_size(optarg, &c->max_session_bytes) || c->max_session_bytes < 1)
                return cli_usage_error("serve", "--max-session-bytes takes a byte count");
            break;
        case 'W':
            if (parse_num(optarg, 1e-6, 1e9, &d)) return cli_usage_error("serve", "--max-step-gflop takes a number of GFLOP");
            c->max_step_flops = d * 1e9;
            break;
        case 'O':
            if (parse_duration(optarg, 0.5, 3600, &c->header_timeout)) return cli_usage_error("serve", "--header-timeout takes 0.5 to 3600 seconds");
            break;
        case 'N':
            if (parse_num(optarg, 1, 100000, &d)) return cli_usage_error("serve", "--max-connections takes 1 to 100000");
            c->max_connections = (int)d;
            break;
        case 'I':
            if (parse_num(optarg, 0, 100000, &d)) return cli_usage_error("serve", "--max-connections-per-client takes 0 to 100000");
            c->max_conn_per_client = (int)d;
            break;
        case 'h':
            if (parse_num(optarg, 1, 64, &d)) return cli_usage_error("serve", "--http-threads takes 1 to 64");
            c->http_threads = (int)d;
            break;
        case 'v':
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "auto") != 0 && strcmp(optarg, "cuda") != 0)
                return cli_usage_error("serve", "--device takes cpu, cuda or auto");
            device = optarg;
            break;
        case 'P':
            if (strcmp(optarg, "bf16") == 0) c->bf16 = 1;
            else if (strcmp(optarg, "fp32") == 0) c->bf16 = 0;
            else return cli_usage_error("serve", "--precision takes bf16 or fp32");
            break;
        case 'H': fputs(serve_usage, stdout); return 0;
        default: return cli_bad_option("serve", opts, argv, optind);
        }
    }
    if (optind != argc) return cli_usage_error("serve", "unexpected argument '%s'", argv[optind]);
    const char *colon = strrchr(c->listen_addr, ':');
    if (!colon || parse_num(colon + 1, 1, 65535, &d)) return cli_usage_error("serve", "--listen takes HOST:PORT");
    c->port = (int)d;
    char derr[ERR_LEN];
    if (strcmp(device, "cpu") != 0) {
        c->cuda = device_cuda_usable(derr);
        if (!c->cuda && strcmp(device, "cuda") == 0)
            return fprintf(stderr, "spanserve serve: --device cuda: %s\n", derr), 1;
    }
    const char *envkey = getenv("SPANSERVE_API_KEY");
    if (envkey && *envkey && add_key(envkey)) return 1;
    const char *envadmin = getenv("SPANSERVE_ADMIN_KEY");
    if (envadmin && *envadmin && add_admin_key(envadmin)) return 1;
    if (c->jobs_listen) {
        const char *jc = strrchr(c->jobs_listen, ':');
        if (!jc || parse_num(jc + 1, 1, 65535, &d)) return cli_usage_error("serve", "--jobs-listen takes HOST:PORT");
        c->jobs_port = (int)d;
        if (c->n_admin_keys == 0)
            return cli_usage_error("serve", "--jobs-listen needs an admin key (--admin-key, --admin-key-file or SPANSERVE_ADMIN_KEY)");
    }
    if (c->model_dir) {
        char *real = realpath(c->model_dir, NULL);
        if (!real) return fprintf(stderr, "spanserve serve: --model-dir %s: %s\n", c->model_dir, strerror(errno)), 1;
        c->model_dir = real;
        int n = models_dir_clean();   /* downloads a crash cut short */
        if (n) log_line("%d unfinished downloads removed from %s", n, c->model_dir);
    }
    char sdir[1100];
    snprintf(sdir, sizeof sdir, "%s/sessions", c->state_dir);
    if (mkdirs(sdir)) return fprintf(stderr, "spanserve serve: --state-dir %s: %s\n", c->state_dir, strerror(errno)), 1;
    char ddir[1100];
    if (c->jobs_listen) {   /* the data directory, absolute: paths are checked against it */
        if (!c->data_dir) snprintf(ddir, sizeof ddir, "%s/data", c->state_dir);
        if (mkdirs(c->data_dir ? c->data_dir : ddir))
            return fprintf(stderr, "spanserve serve: --data-dir %s: %s\n", c->data_dir ? c->data_dir : ddir, strerror(errno)), 1;
        char *real = realpath(c->data_dir ? c->data_dir : ddir, NULL);
        if (!real) return fprintf(stderr, "spanserve serve: --data-dir: %s\n", strerror(errno)), 1;
        c->data_dir = real;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);   /* once, before any thread may use libcurl */

    /* SIGTERM and SIGINT: a handler writes to a pipe this thread reads once
     * serving. A handler and not a blocked mask with sigwait: OpenBLAS starts
     * its threads before main, with the signals unblocked, and a signal
     * delivered to one of them killed the process instead of draining it. A
     * signal during start-up waits in the pipe. */
    if (pipe2(stop_pipe, O_CLOEXEC) != 0) return fprintf(stderr, "spanserve serve: pipe: %s\n", strerror(errno)), 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* listen first, so /healthz answers and /readyz says 503 while models load */
    if (http_start()) {
        fprintf(stderr, "spanserve serve: cannot listen on %s\n", c->listen_addr);
        return 1;
    }
    const char *set_name;
    json_t *set_v;
    json_object_foreach(model_sets, set_name, set_v) {
        int found = 0;
        for (int i = 0; i < n_models && !found; i++)
            found = strncmp(models[i], set_name, strlen(set_name)) == 0 && models[i][strlen(set_name)] == '=';
        if (!found) {
            fprintf(stderr, "spanserve serve: --set %s:...: no --model %s=PATH\n", set_name, set_name);
            http_stop();
            json_decref(model_sets);
            return 2;
        }
    }
    pthread_mutex_lock(&srv.lock);
    for (int i = 0; i < n_models; i++) {
        char name[128], err[512];
        const char *eq = strchr(models[i], '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq - models[i]), models[i]);
        int status;
        char *set = cli_settings_for(model_sets, name);
        smodel_t *sm = models_add(name, eq + 1, eq + 1, set, err, &status);
        free(set);
        if (!sm) {
            pthread_mutex_unlock(&srv.lock);
            fprintf(stderr, "spanserve serve: --model %s: %s\n", models[i], err);
            http_stop();
            json_decref(model_sets);
            return 1;
        }
    }
    json_decref(model_sets);
    int restored = sess_load_all(NULL);
    if (restored) log_line("state: %d sessions found in %s", restored, c->state_dir);
    /* said once the models are in: a model that fails to load stops the server before it ever said so
     * (meanwhile /healthz answers and /readyz says 503) */
    log_line("listening on http://%s", c->listen_addr);
    srv.ready = 1;
    pthread_mutex_unlock(&srv.lock);
    if (sess_writer_start() || sched_start()) {
        fprintf(stderr, "spanserve serve: cannot start the scheduler\n");
        http_stop();
        return 1;
    }
    if (c->jobs_listen) {   /* after the models: a job that finished meanwhile deploys onto them */
        char err[512] = "";
        if (jobs_start(err) || (http_jobs_start() && snprintf(err, sizeof err, "cannot listen on %s (--jobs-listen)", c->jobs_listen))) {
            fprintf(stderr, "spanserve serve: %s\n", err);
            jobs_stop();
            sched_stop();
            http_stop();
            return 1;
        }
        log_line("jobs API listening on http://%s", c->jobs_listen);
    }

    unsigned char sig = 0;
    while (read(stop_pipe[0], &sig, 1) != 1 && errno == EINTR) {}
    log_line("%s: draining (up to %.0f s)", sig == SIGINT ? "SIGINT" : "SIGTERM", c->drain_timeout);
    pthread_mutex_lock(&srv.lock);
    srv.draining = 1;
    pthread_mutex_unlock(&srv.lock);
    double t0 = now_s();
    for (;;) {
        pthread_mutex_lock(&srv.lock);
        int busy = sched_busy();
        pthread_mutex_unlock(&srv.lock);
        if (!busy || now_s() - t0 > c->drain_timeout) break;
        usleep(20000);
    }
    jobs_stop();    /* the training processes go on; their event streams end */
    sched_stop();   /* cancels whatever is left, resuming its connections */
    sess_writer_stop();   /* the last states written; their connections resume */
    for (;;) {      /* downloads abort on draining; their connections resume */
        pthread_mutex_lock(&srv.lock);
        int n = srv.downloads;
        pthread_mutex_unlock(&srv.lock);
        if (!n) break;
        usleep(20000);
    }
    /* let the resumed connections send their last bytes */
    for (int i = 0; i < 100; i++) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv.daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (!info || info->num_connections == 0) break;
        usleep(20000);
    }
    while (jobs_fetching()) usleep(20000);   /* fetches abort on draining; their connections resume */
    for (int i = 0; i < 100 && srv.jobs_daemon; i++) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv.jobs_daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (!info || info->num_connections == 0) break;
        usleep(20000);
    }
    http_jobs_stop();
    jobs_free();
    http_stop();
    pthread_mutex_lock(&srv.lock);
    int saved, failed;
    sess_save_all(&saved, &failed);
    const char *why = sess_state_error();
    if (failed)
        log_line("stopped: %d sessions saved in %s; %d could not be written (%s): what changed in them since "
                 "their last write is lost", saved, c->state_dir, failed, *why ? why : "error");
    else
        log_line("stopped: %d sessions saved in %s", saved, c->state_dir);
    pthread_mutex_unlock(&srv.lock);
    return failed ? 1 : 0;
}
