/*
 * spanctl.c - the command-line client of spanserve's HTTP API (docs/API.md),
 * on libcurl and jansson. It speaks HTTP only: no model code.
 *
 *   spanctl [--url URL] [--api-key KEY] COMMAND ...
 *   generate | score | spans | models | sessions | jobs
 *
 * `jobs` speaks to the jobs listener (--jobs-listen): its URL and key come
 * from $SPANSERVE_JOBS_URL and $SPANSERVE_ADMIN_KEY unless --url and
 * --api-key are given.
 *
 * A streamed generation is read as server-sent events while they arrive, and
 * each token's text is printed (and flushed) as its event comes. Exit status:
 * 0 done, 1 an error answered by the server (its message is printed) or a
 * failed connection (curl's message), 2 wrong arguments (with the usage).
 */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SPANCTL_VERSION "0.1.0"
#define DEFAULT_URL "http://127.0.0.1:8080"

static const char *prog = "spanctl";

/* ------------------------------------------------------------------ buffers */

typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

static int buf_append(buf_t *b, const char *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0; /* always a C string too */
    return 0;
}

static void buf_free(buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* Reads all of PATH ("-" for standard input); prints the problem on failure. */
static int read_file(const char *path, buf_t *out)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
        return -1;
    }
    char chunk[65536];
    size_t k;
    int rc = 0;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (buf_append(out, chunk, k)) { rc = -1; break; }
    if (ferror(f)) rc = -1;
    if (f != stdin) fclose(f);
    if (rc) fprintf(stderr, "%s: %s: cannot read it\n", prog, path);
    else if (!out->data) buf_append(out, "", 0);
    return rc;
}

/* ------------------------------------------------------------------ usage */

static const char main_usage[] =
    "usage: spanctl [--url URL] [--api-key KEY] COMMAND [ARGS]\n"
    "\n"
    "The command-line client of spanserve's HTTP API.\n"
    "\n"
    "  --url URL        the server (default: $SPANSERVE_URL, else " DEFAULT_URL ")\n"
    "  --api-key KEY    sent as \"Authorization: Bearer KEY\" (default: $SPANSERVE_API_KEY)\n"
    "\n"
    "commands:\n"
    "  generate   generate text, printed as it comes\n"
    "  score      bits per character and perplexity of a text\n"
    "  spans      what a model learned: spans per head, PAR block choices (JSON or SVG)\n"
    "  models     list, get, load, load-url, delete models\n"
    "  sessions   list, create, get, delete, export, import sessions\n"
    "  jobs       submit, list, get, follow, cancel, resume, delete training jobs;\n"
    "             upload texts, download checkpoints\n"
    "  version    print the version\n"
    "\n"
    "`spanctl COMMAND --help` describes each. --url and --api-key may also follow\n"
    "the command. Exit status: 0 done; 1 an error from the server (its message is\n"
    "printed) or from the connection; 2 wrong arguments.\n";

static const char generate_usage[] =
    "usage: spanctl generate --model M [--prompt P] [--max-tokens N] [--temperature T]\n"
    "                        [--top-k K] [--top-p P] [--seed S] [--stop STR]...\n"
    "                        [--session ID] [--no-stream]\n"
    "\n"
    "POST /v1/generate. Prints the text as it comes (server-sent events), then a\n"
    "newline; a summary line goes to standard error.\n"
    "\n"
    "  --model M        a loaded model (not needed with --session)\n"
    "  --prompt P       text to continue (default: a newline; with --session,\n"
    "                   nothing: the session's memory is continued)\n"
    "  --max-tokens N   tokens to generate (server default 64)\n"
    "  --temperature T  0 is greedy (default 1)\n"
    "  --top-k K        sample from the K most likely tokens (0: all)\n"
    "  --top-p P        sample from the smallest set of mass >= P, in (0, 1]\n"
    "  --seed S         the same seed gives the same text (default: the server\n"
    "                   draws one and the summary line shows it)\n"
    "  --stop STR       stop before STR (repeatable, up to 16)\n"
    "  --session ID     continue the memory of session ID, and update it\n"
    "  --no-stream      one JSON answer instead of events; prints the same\n";

static const char score_usage[] =
    "usage: spanctl score [--model M] [--session ID] [--per-token] [--json] FILE\n"
    "\n"
    "POST /v1/score with the text of FILE (\"-\" for standard input). Prints the\n"
    "predictions scored, the mean negative log-likelihood (nats), bits per\n"
    "character and perplexity, as `spanserve score` does.\n"
    "\n"
    "  --model M        a loaded model (not needed with --session)\n"
    "  --session ID     score in the session: its memory predicts the first token\n"
    "  --per-token      also print each prediction's logprob, one a line\n"
    "  --json           print the server's JSON answer as it is\n";

static const char spans_usage[] =
    "usage: spanctl spans MODEL [--json | --svg]\n"
    "\n"
    "GET /v1/models/MODEL/spans: adaptive-span, each head's learned span; PAR,\n"
    "each block's kind and architecture weights; both, memory per stream. Prints\n"
    "a table (as `spanserve spans`), with --json the JSON report, with --svg the\n"
    "SVG picture.\n";

static const char models_usage[] =
    "usage: spanctl models [list [--json]]\n"
    "       spanctl models get NAME\n"
    "       spanctl models load NAME PATH       (PATH relative to the server's --model-dir)\n"
    "       spanctl models load-url NAME URL    (https only; the server fetches it)\n"
    "       spanctl models delete NAME          (its sessions are deleted with it)\n"
    "\n"
    "list prints a table (--json: the server's JSON); get and load print the\n"
    "model's JSON.\n";

static const char sessions_usage[] =
    "usage: spanctl sessions [list [--json]]\n"
    "       spanctl sessions create MODEL [ID]   (prints the new session's id)\n"
    "       spanctl sessions get ID\n"
    "       spanctl sessions delete ID\n"
    "       spanctl sessions export ID FILE      (the memory, binary; FILE \"-\": stdout)\n"
    "       spanctl sessions import ID FILE [--model M]\n"
    "\n"
    "A session is a stream's carried memory on the server. import replaces the\n"
    "memory of session ID with FILE (\"-\": stdin), or creates the session for\n"
    "model M when --model is given.\n";

static const char jobs_usage[] =
    "usage: spanctl jobs [list [--json] [--status S]]\n"
    "       spanctl jobs submit CONFIG.json (--text FILE | --file ID | --path P | --url-text URL)\n"
    "                   [--family F] [--id ID] [--name NAME] [--deploy] [--webhook URL]\n"
    "                   [--device cpu|cuda]          (prints the job's id)\n"
    "       spanctl jobs get ID\n"
    "       spanctl jobs events ID [--follow]       (the progress lines, JSON, one a line)\n"
    "       spanctl jobs cancel ID\n"
    "       spanctl jobs resume ID\n"
    "       spanctl jobs delete ID                   (a finished job and its directory)\n"
    "       spanctl jobs download ID [FILE]         (its last checkpoint; default stdout)\n"
    "       spanctl jobs upload FILE [--name NAME]  (prints the file's id)\n"
    "\n"
    "Training jobs on the jobs listener: the URL is --url, else $SPANSERVE_JOBS_URL,\n"
    "else http://127.0.0.1:8081; the key --api-key, else $SPANSERVE_ADMIN_KEY.\n"
    "CONFIG.json holds the trainer's config keys (README, Training), \"family\"\n"
    "included unless --family is given: a `spanserve train` config as it is (its\n"
    "\"device\" is the job's unless --device is given; \"data\", \"out\" and \"log\"\n"
    "are left out, the job's own). --text uploads FILE first (deleted again if\n"
    "the job is refused), --url-text has the server fetch an https URL. --follow\n"
    "streams the lines as they come and ends with the job: status 0 when it\n"
    "succeeded, 1 otherwise (its status and error on standard error); a stream\n"
    "that breaks (a server restart) is followed again after its last line, for\n"
    "up to 60 s without a line.\n";

/* The problem in one line, and where the options are (the command's name
 * is the usage's first words: "usage: spanctl score [..." -> spanctl score),
 * instead of the whole usage scrolling the problem away. */
static int usage_error(const char *usage, const char *fmt, ...)
{
    const char *cmd = usage + strlen("usage: ");
    size_t n = 0;
    for (const char *w = cmd; *w && *w != '\n';) {   /* the words before the first [OPTION or ARGUMENT */
        if (*w == '[' || (*w >= 'A' && *w <= 'Z') || *w == '-') break;
        while (*w && *w != ' ' && *w != '\n') w++;
        n = (size_t)(w - cmd);
        while (*w == ' ') w++;
    }
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%.*s: ", (int)n, cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun '%.*s --help' for the options.\n", (int)n, cmd);
    va_end(ap);
    return 2;
}

/* ------------------------------------------------------------------ HTTP */

/* Server-sent events of one response: the line being read, the event being
 * assembled, and what the command does with each complete event. */
typedef struct sse sse_t;
struct sse {
    buf_t line, data;
    char event[64];
    int (*on_event)(sse_t *s, const char *event, const char *data);
    json_t *done;  /* the data of the `done` event */
    json_t *error; /* the data of an `error` event */
    int n_events;
    long long last_id; /* the last `id:` field (a job stream's lines so far) */
};

typedef struct {
    CURL *curl;
    const char *url; /* the server's base URL */
    const char *key;
    int url_set, key_set; /* given as options (the jobs command has its own defaults) */
    char errbuf[CURL_ERROR_SIZE];
} ctl_t;

/* What one request is answered with: a status, and the body (unless the
 * answer was a stream of events given to `sse`). */
typedef struct {
    ctl_t *ctl;
    long status;
    int streaming; /* -1 undecided, 0 body buffered, 1 events */
    buf_t body;
    sse_t *sse;
} resp_t;

static int sse_dispatch(sse_t *s)
{
    int rc = 0;
    if (s->data.len || s->event[0]) {
        s->n_events++;
        rc = s->on_event(s, s->event[0] ? s->event : "message", s->data.data ? s->data.data : "");
    }
    s->event[0] = 0;
    s->data.len = 0;
    if (s->data.data) s->data.data[0] = 0;
    return rc;
}

/* One line of the event stream, without its line ending (text/event-stream:
 * "event: NAME", "data: ...", ": comment", an empty line ends the event). */
static int sse_line(sse_t *s, char *line, size_t n)
{
    if (n == 0) return sse_dispatch(s);
    if (line[0] == ':') return 0;
    char *colon = memchr(line, ':', n);
    size_t klen = colon ? (size_t)(colon - line) : n;
    const char *v = colon ? colon + 1 : line + n;
    if (*v == ' ') v++;
    size_t vlen = (size_t)(line + n - v);
    if (klen == 5 && memcmp(line, "event", 5) == 0) {
        size_t k = vlen < sizeof s->event - 1 ? vlen : sizeof s->event - 1;
        memcpy(s->event, v, k);
        s->event[k] = 0;
    } else if (klen == 4 && memcmp(line, "data", 4) == 0) {
        if (s->data.len && buf_append(&s->data, "\n", 1)) return -1;
        if (buf_append(&s->data, v, vlen)) return -1;
    } else if (klen == 2 && memcmp(line, "id", 2) == 0) {
        char num[24];
        size_t k = vlen < sizeof num - 1 ? vlen : sizeof num - 1;
        memcpy(num, v, k);
        num[k] = 0;
        s->last_id = strtoll(num, NULL, 10);
    }
    return 0;
}

static int sse_feed(sse_t *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            if (buf_append(&s->line, &p[i], 1)) return -1;
            continue;
        }
        size_t len = s->line.len;
        if (len && s->line.data[len - 1] == '\r') len--;
        int rc = sse_line(s, s->line.data ? s->line.data : (char *)"", len);
        s->line.len = 0;
        if (rc) return rc;
    }
    return 0;
}

static void sse_free(sse_t *s)
{
    buf_free(&s->line);
    buf_free(&s->data);
    json_decref(s->done);
    json_decref(s->error);
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *userdata)
{
    resp_t *r = userdata;
    size_t n = size * nmemb;
    if (r->streaming < 0) {
        /* Decided at the first bytes, when the headers are in: only a
         * successful text/event-stream answer is read as events. */
        char *ctype = NULL;
        curl_easy_getinfo(r->ctl->curl, CURLINFO_RESPONSE_CODE, &r->status);
        curl_easy_getinfo(r->ctl->curl, CURLINFO_CONTENT_TYPE, &ctype);
        r->streaming = r->sse && r->status < 400 && ctype && strncmp(ctype, "text/event-stream", 17) == 0;
    }
    if (r->streaming) return sse_feed(r->sse, p, n) ? 0 : n;
    return buf_append(&r->body, p, n) ? 0 : n;
}

/* Appends "/"-separated SEGMENTS to the base URL, each escaped. */
static char *make_url(ctl_t *c, const char *path, const char *seg1, const char *seg2, const char *query)
{
    buf_t u = {0};
    size_t bl = strlen(c->url);
    while (bl && c->url[bl - 1] == '/') bl--; /* the base without its trailing slashes */
    buf_append(&u, c->url, bl);
    buf_append(&u, path, strlen(path));
    const char *segs[] = {seg1, seg2};
    for (int i = 0; i < 2; i++) {
        if (!segs[i]) continue;
        char *e = curl_easy_escape(c->curl, segs[i], 0);
        if (!e) { buf_free(&u); return NULL; }
        buf_append(&u, "/", 1);
        buf_append(&u, e, strlen(e));
        curl_free(e);
    }
    if (query) buf_append(&u, query, strlen(query));
    return u.data;
}

/* Sends one request and waits for the whole answer. Returns 0 when the
 * server answered (any status, in r->status), 1 when the connection failed
 * (curl's message printed). */
static int http_do(ctl_t *c, const char *method, const char *url, const char *ctype, const char *body, size_t len,
                   resp_t *r)
{
    CURL *h = c->curl;
    curl_easy_reset(h);
    struct curl_slist *hdr = NULL;
    char line[1024];
    if (c->key && *c->key) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", c->key);
        hdr = curl_slist_append(hdr, line);
    }
    if (ctype) {
        snprintf(line, sizeof line, "Content-Type: %s", ctype);
        hdr = curl_slist_append(hdr, line);
    }
    hdr = curl_slist_append(hdr, "Expect:"); /* no 100-continue round trip */
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "spanctl/" SPANCTL_VERSION);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->errbuf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    if (strcmp(method, "GET") != 0 && !(strcmp(method, "POST") == 0 && body))
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    c->errbuf[0] = 0;
    r->ctl = c;
    r->streaming = -1;
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    if (rc != CURLE_OK && !(rc == CURLE_WRITE_ERROR && r->status)) {
        fprintf(stderr, "%s: %s: %s\n", prog, url, c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc));
        return 1;
    }
    if (rc == CURLE_WRITE_ERROR) {
        fprintf(stderr, "%s: %s: the answer could not be read (out of memory or a bad event)\n", prog, url);
        return 1;
    }
    return 0;
}

/* Prints the server's error message of a failed answer; 1 if it failed. */
static int check_status(const resp_t *r)
{
    if (r->status >= 200 && r->status < 300) return 0;
    json_t *j = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, NULL);
    json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *type = json_string_value(json_object_get(e, "type"));
    if (msg)
        fprintf(stderr, "%s: %s (%ld %s)\n", prog, msg, r->status, type ? type : "error");
    else
        fprintf(stderr, "%s: HTTP %ld: %.300s\n", prog, r->status, r->body.data ? r->body.data : "");
    json_decref(j);
    return 1;
}

/* One whole exchange: 0 and a 2xx answer in *r, else 1 (printed). URL
 * (from make_url) is consumed. */
static int http_call(ctl_t *c, const char *method, char *url, const char *ctype, const char *body, size_t len,
                     resp_t *r)
{
    if (!url) { fprintf(stderr, "%s: out of memory\n", prog); return 1; }
    int rc = http_do(c, method, url, ctype, body, len, r);
    free(url);
    return rc ? rc : check_status(r);
}

/* A JSON request: the body is dumped from `req` (which is consumed). */
static int http_json(ctl_t *c, const char *method, char *url, json_t *req, resp_t *r)
{
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (req && !body) {
        free(url);
        fprintf(stderr, "%s: the request could not be made\n", prog);
        return 1;
    }
    int rc = http_call(c, method, url, body ? "application/json" : NULL, body, body ? strlen(body) : 0, r);
    free(body);
    return rc;
}

static json_t *parse_body(const resp_t *r)
{
    json_error_t je;
    json_t *j = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, &je);
    if (!j) fprintf(stderr, "%s: the server's answer is not JSON: %s\n", prog, je.text);
    return j;
}

static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    if (s) puts(s);
    free(s);
}

/* Prints a body as it came, ending it with a newline. */
static void print_body(const resp_t *r)
{
    fwrite(r->body.data ? r->body.data : "", 1, r->body.len, stdout);
    if (r->body.len && r->body.data[r->body.len - 1] != '\n') putchar('\n');
}

/* ------------------------------------------------------------------ options */

static int parse_long(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* --url and --api-key, accepted after the command too. */
#define COMMON_OPTS {"url", 1, 0, 'U'}, {"api-key", 1, 0, 'K'}, {"help", 0, 0, 'h'}

static int common_opt(ctl_t *c, int opt)
{
    if (opt == 'U') c->url = optarg, c->url_set = 1;
    else if (opt == 'K') c->key = optarg, c->key_set = 1;
    else return 0;
    return 1;
}

/* ------------------------------------------------------------------ generate */

static int on_generate_event(sse_t *s, const char *event, const char *data)
{
    json_error_t je;
    json_t *j = json_loads(data, 0, &je);
    if (!j) {
        fprintf(stderr, "%s: event '%s' is not JSON: %s\n", prog, event, je.text);
        return -1;
    }
    if (strcmp(event, "token") == 0) {
        const char *t = json_string_value(json_object_get(j, "text"));
        if (t) {
            fwrite(t, 1, json_string_length(json_object_get(j, "text")), stdout);
            fflush(stdout);
        }
        json_decref(j);
    } else if (strcmp(event, "done") == 0) {
        json_decref(s->done);
        s->done = j;
    } else if (strcmp(event, "error") == 0) {
        json_decref(s->error);
        s->error = j;
    } else {
        json_decref(j);
    }
    return 0;
}

static void print_summary(json_t *done)
{
    json_t *usage = json_object_get(done, "usage"), *tm = json_object_get(done, "timings");
    const char *finish = json_string_value(json_object_get(done, "finish_reason"));
    const char *session = json_string_value(json_object_get(done, "session"));
    fprintf(stderr, "[%lld tokens, finish %s, seed %lld, %.0f tokens/s%s%s]\n",
            (long long)json_integer_value(json_object_get(usage, "completion_tokens")), finish ? finish : "?",
            (long long)json_integer_value(json_object_get(done, "seed")),
            json_number_value(json_object_get(tm, "tokens_per_second")), session ? ", session " : "",
            session ? session : "");
}

static int cmd_generate(ctl_t *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"max-tokens", 1, 0, 'n'}, {"temperature", 1, 0, 't'},
        {"top-k", 1, 0, 'k'}, {"top-p", 1, 0, 'P'},  {"seed", 1, 0, 's'},       {"stop", 1, 0, 'S'},
        {"session", 1, 0, 'e'}, {"no-stream", 0, 0, 'N'}, COMMON_OPTS, {0, 0, 0, 0}};
    json_t *req = json_object(), *stop = json_array();
    const char *model = NULL, *session = NULL, *prompt = NULL;
    int stream = 1, opt;
    long long v;
    double d;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const char *bad = NULL;
        switch (opt) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case 'e': session = optarg; break;
        case 'N': stream = 0; break;
        case 'S': json_array_append_new(stop, json_string(optarg)); break;
        case 'n':
            if (parse_long(optarg, &v)) bad = "--max-tokens takes an integer";
            else json_object_set_new(req, "max_tokens", json_integer(v));
            break;
        case 'k':
            if (parse_long(optarg, &v)) bad = "--top-k takes an integer";
            else json_object_set_new(req, "top_k", json_integer(v));
            break;
        case 's':
            if (parse_long(optarg, &v)) bad = "--seed takes an integer";
            else json_object_set_new(req, "seed", json_integer(v));
            break;
        case 't':
            if (parse_double(optarg, &d)) bad = "--temperature takes a number";
            else json_object_set_new(req, "temperature", json_real(d));
            break;
        case 'P':
            if (parse_double(optarg, &d)) bad = "--top-p takes a number";
            else json_object_set_new(req, "top_p", json_real(d));
            break;
        case 'h':
            json_decref(req);
            json_decref(stop);
            fputs(generate_usage, stdout);
            return 0;
        default:
            if (!common_opt(c, opt)) bad = "unknown option";
        }
        if (bad) {
            json_decref(req);
            json_decref(stop);
            return usage_error(generate_usage, "%s", bad);
        }
    }
    const char *bad = optind != argc ? "unexpected argument" : !model && !session ? "--model (or --session) is required" : NULL;
    if (bad) {
        json_decref(req);
        json_decref(stop);
        return usage_error(generate_usage, "%s", bad);
    }
    if (model) json_object_set_new(req, "model", json_string(model));
    if (session) json_object_set_new(req, "session", json_string(session));
    /* No prompt: a newline, as `spanserve generate`; in a session, nothing,
     * so that its memory is continued. */
    json_object_set_new(req, "prompt", json_string(prompt ? prompt : session ? "" : "\n"));
    if (json_array_size(stop)) json_object_set(req, "stop", stop);
    json_decref(stop);
    json_object_set_new(req, "stream", json_boolean(stream));
    if (!json_object_get(req, "prompt")) {
        json_decref(req);
        fprintf(stderr, "%s: the prompt is not valid UTF-8\n", prog);
        return 1;
    }

    sse_t sse = {.on_event = on_generate_event};
    resp_t r = {.sse = stream ? &sse : NULL};
    int rc = http_json(c, "POST", make_url(c, "/v1/generate", NULL, NULL, NULL), req, &r);
    if (rc == 0 && r.streaming == 1) {
        sse_feed(&sse, "\n\n", 2); /* an event the stream did not end */
        json_t *e = json_object_get(sse.error, "error");
        if (sse.error) {
            const char *msg = json_string_value(json_object_get(e, "message"));
            fprintf(stderr, "\n%s: %s\n", prog, msg ? msg : "the server ended the stream with an error");
            rc = 1;
        } else if (!sse.done) {
            fprintf(stderr, "\n%s: the stream ended before its done event\n", prog);
            rc = 1;
        } else {
            putchar('\n');
            fflush(stdout);
            print_summary(sse.done);
        }
    } else if (rc == 0) {
        json_t *j = parse_body(&r);
        json_t *text = json_object_get(j, "text");
        if (!json_is_string(text)) {
            if (j) fprintf(stderr, "%s: the answer has no text\n", prog);
            rc = 1;
        } else {
            fwrite(json_string_value(text), 1, json_string_length(text), stdout);
            putchar('\n');
            fflush(stdout);
            print_summary(j);
        }
        json_decref(j);
    }
    sse_free(&sse);
    buf_free(&r.body);
    return rc;
}

/* ------------------------------------------------------------------ score */

static int cmd_score(ctl_t *c, int argc, char **argv)
{
    static const struct option opts[] = {{"model", 1, 0, 'm'}, {"session", 1, 0, 'e'}, {"per-token", 0, 0, 'T'},
                                         {"json", 0, 0, 'j'},  COMMON_OPTS,            {0, 0, 0, 0}};
    const char *model = NULL, *session = NULL;
    int per_token = 0, as_json = 0, opt;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': model = optarg; break;
        case 'e': session = optarg; break;
        case 'T': per_token = 1; break;
        case 'j': as_json = 1; break;
        case 'h': fputs(score_usage, stdout); return 0;
        default:
            if (!common_opt(c, opt)) return usage_error(score_usage, "unknown option");
        }
    }
    if (!model && !session) return usage_error(score_usage, "--model (or --session) is required");
    if (optind != argc - 1) return usage_error(score_usage, "one FILE to score is required");
    buf_t text = {0};
    if (read_file(argv[optind], &text)) { buf_free(&text); return 1; }
    json_t *t = json_stringn(text.data, text.len);
    buf_free(&text);
    if (!t) {
        fprintf(stderr, "%s: %s: not valid UTF-8\n", prog, argv[optind]);
        return 1;
    }
    json_t *req = json_object();
    if (model) json_object_set_new(req, "model", json_string(model));
    if (session) json_object_set_new(req, "session", json_string(session));
    json_object_set_new(req, "text", t);
    if (per_token) json_object_set_new(req, "per_token", json_true());
    resp_t r = {0};
    int rc = http_json(c, "POST", make_url(c, "/v1/score", NULL, NULL, NULL), req, &r);
    if (rc == 0 && as_json) print_body(&r);
    else if (rc == 0) {
        json_t *j = parse_body(&r);
        if (!j) rc = 1;
        else {
            double nll = json_number_value(json_object_get(j, "nll"));
            printf("tokens  %lld\nnll     %.6f nats\n", (long long)json_integer_value(json_object_get(j, "tokens")), nll);
            if (json_is_number(json_object_get(j, "bpc")))   /* character models */
                printf("bpc     %.6f\n", json_number_value(json_object_get(j, "bpc")));
            printf("ppl     %.4f\n", json_number_value(json_object_get(j, "ppl")));
            json_t *lp = json_object_get(j, "token_logprobs"), *x;
            size_t i;
            json_array_foreach(lp, i, x) printf("%zu\t%.6f\n", i, json_number_value(x));
        }
        json_decref(j);
    }
    buf_free(&r.body);
    return rc;
}

/* ------------------------------------------------------------------ spans */

/* The spans report as `spanserve spans` prints it. */
static void print_spans_table(json_t *j)
{
    const char *fam = json_string_value(json_object_get(j, "family"));
    json_t *x, *h;
    size_t i, k;
    if (fam && strcmp(fam, "adaptive-span") == 0) {
        printf("adaptive-span: maximum span %lld, ramp %lld\n\n", (long long)json_integer_value(json_object_get(j, "attn_span")),
               (long long)json_integer_value(json_object_get(j, "ramp")));
        printf("layer  max_span avg_span cache_size   spans per head (z*S; rows kept: keys/values)\n");
        json_array_foreach(json_object_get(j, "layers"), i, x) {
            printf("%5lld  %8lld %8lld %10lld  ", (long long)json_integer_value(json_object_get(x, "layer")),
                   (long long)json_integer_value(json_object_get(x, "max_span")),
                   (long long)json_integer_value(json_object_get(x, "avg_span")),
                   (long long)json_integer_value(json_object_get(x, "cache_size")));
            json_array_foreach(json_object_get(x, "heads"), k, h)
                printf(" %.1f(%lld/%lld)", json_number_value(json_object_get(h, "span")),
                       (long long)json_integer_value(json_object_get(h, "key_rows")),
                       (long long)json_integer_value(json_object_get(h, "reach")));
            printf("\n");
        }
    } else {
        printf("%s: mem_len %lld\n\n", fam ? fam : "?", (long long)json_integer_value(json_object_get(j, "mem_len")));
        printf("block  kind   p(attn)  p(ffn)  p(skip)\n");
        json_array_foreach(json_object_get(j, "blocks"), i, x) {
            const char *kind = json_string_value(json_object_get(x, "kind"));
            printf("%5lld  %-5s", (long long)json_integer_value(json_object_get(x, "block")), kind ? kind : "?");
            json_t *a = json_object_get(x, "alpha_softmax");
            if (a)
                printf("  %7.3f %7.3f %7.3f", json_number_value(json_object_get(a, "attn")),
                       json_number_value(json_object_get(a, "ffn")), json_number_value(json_object_get(a, "skip")));
            printf("\n");
        }
    }
    json_t *mem = json_object_get(j, "memory");
    printf("\n%-34s %10lld bytes\n%-34s %10lld bytes\n", "memory per stream (this server)",
           (long long)json_integer_value(json_object_get(mem, "bytes_per_stream")), "memory per stream (reference)",
           (long long)json_integer_value(json_object_get(mem, "reference_bytes_per_stream")));
}

static int cmd_spans(ctl_t *c, int argc, char **argv)
{
    static const struct option opts[] = {{"svg", 0, 0, 'g'}, {"json", 0, 0, 'j'}, COMMON_OPTS, {0, 0, 0, 0}};
    int svg = 0, as_json = 0, opt;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'g': svg = 1; break;
        case 'j': as_json = 1; break;
        case 'h': fputs(spans_usage, stdout); return 0;
        default:
            if (!common_opt(c, opt)) return usage_error(spans_usage, "unknown option");
        }
    }
    if (optind != argc - 1) return usage_error(spans_usage, "one MODEL is required");
    resp_t r = {0};
    int rc = http_call(c, "GET", make_url(c, "/v1/models", argv[optind], "spans", svg ? "?format=svg" : NULL), NULL,
                       NULL, 0, &r);
    if (rc == 0 && (svg || as_json)) print_body(&r);
    else if (rc == 0) {
        json_t *j = parse_body(&r);
        if (j) print_spans_table(j);
        else rc = 1;
        json_decref(j);
    }
    buf_free(&r.body);
    return rc;
}

/* ------------------------------------------------------------------ models */

static void print_model_table(json_t *list)
{
    printf("%-24s %-20s %12s %6s %10s %14s\n", "NAME", "FAMILY", "PARAMETERS", "VOCAB", "BLOCK_LEN", "BYTES/STREAM");
    json_t *m;
    size_t i;
    json_array_foreach(list, i, m) {
        const char *name = json_string_value(json_object_get(m, "name"));
        const char *fam = json_string_value(json_object_get(m, "family"));
        printf("%-24s %-20s %12lld %6lld %10lld %14lld\n", name ? name : "?", fam ? fam : "?",
               (long long)json_integer_value(json_object_get(m, "parameters")),
               (long long)json_integer_value(json_object_get(m, "vocab_size")),
               (long long)json_integer_value(json_object_get(m, "block_len")),
               (long long)json_integer_value(json_object_get(json_object_get(m, "memory"), "bytes_per_stream")));
    }
}

static void print_session_table(json_t *list)
{
    printf("%-24s %-24s %12s %12s %-8s %s\n", "ID", "MODEL", "TOKENS_SEEN", "MEMORY_BYTES", "LOCATION", "LAST_USED");
    json_t *s;
    size_t i;
    json_array_foreach(list, i, s) {
        const char *id = json_string_value(json_object_get(s, "id"));
        const char *model = json_string_value(json_object_get(s, "model"));
        const char *loc = json_string_value(json_object_get(s, "location"));
        const char *last = json_string_value(json_object_get(s, "last_used"));
        printf("%-24s %-24s %12lld %12lld %-8s %s\n", id ? id : "?", model ? model : "?",
               (long long)json_integer_value(json_object_get(s, "tokens_seen")),
               (long long)json_integer_value(json_object_get(s, "memory_bytes")), loc ? loc : "?", last ? last : "?");
    }
}

/* GET a list; prints the JSON (--json) or a table of its array KEY. */
static int list_objects(ctl_t *c, const char *path, const char *key, int as_json, void (*table)(json_t *))
{
    resp_t r = {0};
    int rc = http_call(c, "GET", make_url(c, path, NULL, NULL, NULL), NULL, NULL, 0, &r);
    if (rc == 0 && as_json) print_body(&r);
    else if (rc == 0) {
        json_t *j = parse_body(&r);
        if (j) table(json_object_get(j, key));
        else rc = 1;
        json_decref(j);
    }
    buf_free(&r.body);
    return rc;
}

/* Sends a request and prints the JSON answer (pretty), or with PRINT_KEY
 * only that string field of it ("deleted X" for DELETE). */
static int call_print(ctl_t *c, const char *method, char *url, json_t *req, const char *print_key, const char *prefix)
{
    resp_t r = {0};
    int rc = http_json(c, method, url, req, &r);
    if (rc == 0) {
        json_t *j = parse_body(&r);
        if (!j) rc = 1;
        else if (!print_key) print_json(j);
        else {
            const char *v = json_string_value(json_object_get(j, print_key));
            printf("%s%s\n", prefix, v ? v : "?");
        }
        json_decref(j);
    }
    buf_free(&r.body);
    return rc;
}

/* Checks that ACTION got between LO and HI arguments. */
static int want_args(const char *usage, const char *action, int n, int lo, int hi)
{
    if (n >= lo && n <= hi) return 0;
    return usage_error(usage, "'%s' takes %d%s argument%s, not %d", action, lo, hi > lo ? " or more" : "",
                       lo == 1 && hi == lo ? "" : "s", n);
}

static int cmd_models(ctl_t *c, int argc, char **argv)
{
    static const struct option opts[] = {{"json", 0, 0, 'j'}, COMMON_OPTS, {0, 0, 0, 0}};
    int as_json = 0, opt;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'j': as_json = 1; break;
        case 'h': fputs(models_usage, stdout); return 0;
        default:
            if (!common_opt(c, opt)) return usage_error(models_usage, "unknown option");
        }
    }
    const char *action = optind < argc ? argv[optind++] : "list";
    char **a = argv + optind;
    int n = argc - optind;
    if (strcmp(action, "list") == 0) {
        if (n) return usage_error(models_usage, "'list' takes no arguments");
        return list_objects(c, "/v1/models", "data", as_json, print_model_table);   /* OpenAI's list */
    }
    if (as_json) return usage_error(models_usage, "--json is for 'list' (the others print JSON)");
    if (strcmp(action, "get") == 0) {
        if (n != 1) return want_args(models_usage, action, n, 1, 1);
        return call_print(c, "GET", make_url(c, "/v1/models", a[0], NULL, NULL), NULL, NULL, NULL);
    }
    if (strcmp(action, "load") == 0 || strcmp(action, "load-url") == 0) {
        if (n != 2) return want_args(models_usage, action, n, 2, 2);
        json_t *req = json_pack("{s:s, s:s}", "name", a[0], strcmp(action, "load") == 0 ? "path" : "url", a[1]);
        return call_print(c, "POST", make_url(c, "/v1/models", NULL, NULL, NULL), req, NULL, NULL);
    }
    if (strcmp(action, "delete") == 0) {
        if (n != 1) return want_args(models_usage, action, n, 1, 1);
        return call_print(c, "DELETE", make_url(c, "/v1/models", a[0], NULL, NULL), NULL, "deleted", "deleted ");
    }
    return usage_error(models_usage, "unknown models action '%s'", action);
}

/* ------------------------------------------------------------------ sessions */

/* GET URL into the file PATH ("-": stdout); WHAT names it in the message. */
static int download_to(ctl_t *c, char *url, const char *path, const char *what)
{
    resp_t r = {0};
    int rc = http_call(c, "GET", url, NULL, NULL, 0, &r);
    if (rc == 0) {
        FILE *f = strcmp(path, "-") == 0 ? stdout : fopen(path, "wb");
        if (!f || fwrite(r.body.data ? r.body.data : "", 1, r.body.len, f) != r.body.len ||
            (f != stdout ? fclose(f) : fflush(f)) != 0) {
            fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
            rc = 1;
        } else if (f != stdout) {
            fprintf(stderr, "%s: wrote %zu bytes of %s to %s\n", prog, r.body.len, what, path);
        }
    }
    buf_free(&r.body);
    return rc;
}

static int export_state(ctl_t *c, const char *id, const char *path)
{
    char what[128];
    snprintf(what, sizeof what, "session %.64s", id);
    return download_to(c, make_url(c, "/v1/sessions", id, "state", NULL), path, what);
}

static int import_state(ctl_t *c, const char *id, const char *path, const char *model)
{
    buf_t state = {0};
    if (read_file(path, &state)) { buf_free(&state); return 1; }
    char *query = NULL;
    if (model) {
        char *e = curl_easy_escape(c->curl, model, 0);
        if (e && asprintf(&query, "?model=%s", e) < 0) query = NULL;
        curl_free(e);
        if (!query) { buf_free(&state); fprintf(stderr, "%s: out of memory\n", prog); return 1; }
    }
    char *url = make_url(c, "/v1/sessions", id, "state", query);
    free(query);
    resp_t r = {0};
    int rc = http_call(c, "PUT", url, "application/octet-stream", state.data, state.len, &r);
    buf_free(&state);
    if (rc == 0) {
        json_t *j = parse_body(&r);
        if (j) print_json(j);
        else rc = 1;
        json_decref(j);
    }
    buf_free(&r.body);
    return rc;
}

static int cmd_sessions(ctl_t *c, int argc, char **argv)
{
    static const struct option opts[] = {{"json", 0, 0, 'j'}, {"model", 1, 0, 'm'}, COMMON_OPTS, {0, 0, 0, 0}};
    int as_json = 0, opt;
    const char *model = NULL;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'j': as_json = 1; break;
        case 'm': model = optarg; break;
        case 'h': fputs(sessions_usage, stdout); return 0;
        default:
            if (!common_opt(c, opt)) return usage_error(sessions_usage, "unknown option");
        }
    }
    const char *action = optind < argc ? argv[optind++] : "list";
    char **a = argv + optind;
    int n = argc - optind;
    if (model && strcmp(action, "import") != 0) return usage_error(sessions_usage, "--model is for 'import'");
    if (as_json && strcmp(action, "list") != 0) return usage_error(sessions_usage, "--json is for 'list'");
    if (strcmp(action, "list") == 0) {
        if (n) return usage_error(sessions_usage, "'list' takes no arguments");
        return list_objects(c, "/v1/sessions", "sessions", as_json, print_session_table);
    }
    if (strcmp(action, "create") == 0) {
        if (n < 1 || n > 2) return want_args(sessions_usage, action, n, 1, 2);
        json_t *req = json_pack("{s:s}", "model", a[0]);
        if (n == 2) json_object_set_new(req, "id", json_string(a[1]));
        return call_print(c, "POST", make_url(c, "/v1/sessions", NULL, NULL, NULL), req, "id", "");
    }
    if (strcmp(action, "get") == 0 || strcmp(action, "delete") == 0) {
        if (n != 1) return want_args(sessions_usage, action, n, 1, 1);
        int del = action[0] == 'd';
        return call_print(c, del ? "DELETE" : "GET", make_url(c, "/v1/sessions", a[0], NULL, NULL), NULL,
                          del ? "deleted" : NULL, "deleted ");
    }
    if (strcmp(action, "export") == 0) {
        if (n != 2) return want_args(sessions_usage, action, n, 2, 2);
        return export_state(c, a[0], a[1]);
    }
    if (strcmp(action, "import") == 0) {
        if (n != 2) return want_args(sessions_usage, action, n, 2, 2);
        return import_state(c, a[0], a[1], model);
    }
    return usage_error(sessions_usage, "unknown sessions action '%s'", action);
}

/* ------------------------------------------------------------------ jobs */

static void print_job_table(json_t *list)
{
    printf("%-24s %-10s %-20s %13s %8s %s\n", "ID", "STATUS", "FAMILY", "STEP", "VAL_BPC", "MODEL");
    json_t *j;
    size_t i;
    json_array_foreach(list, i, j) {
        const char *id = json_string_value(json_object_get(j, "id"));
        const char *st = json_string_value(json_object_get(j, "status"));
        const char *fam = json_string_value(json_object_get(j, "family"));
        const char *name = json_string_value(json_object_get(j, "name"));
        char step[32], bpc[16] = "-";
        snprintf(step, sizeof step, "%lld/%lld", (long long)json_integer_value(json_object_get(j, "step")),
                 (long long)json_integer_value(json_object_get(j, "steps")));
        json_t *v = json_object_get(j, "val_bpc");
        if (json_is_number(v)) snprintf(bpc, sizeof bpc, "%.4f", json_number_value(v));
        printf("%-24s %-10s %-20s %13s %8s %s\n", id ? id : "?", st ? st : "?", fam ? fam : "?", step, bpc,
               name ? name : "?");
    }
}

/* POST /v1/files with the text of PATH; the new file's id into ID. */
static int upload_text(ctl_t *c, const char *path, const char *name, char *id, size_t cap)
{
    buf_t text = {0};
    if (read_file(path, &text)) { buf_free(&text); return 1; }
    char *query = NULL;
    if (name) {
        char *e = curl_easy_escape(c->curl, name, 0);
        if (!e || asprintf(&query, "?name=%s", e) < 0) query = NULL;
        curl_free(e);
        if (!query) { buf_free(&text); fprintf(stderr, "%s: out of memory\n", prog); return 1; }
    }
    resp_t r = {0};
    int rc = http_call(c, "POST", make_url(c, "/v1/files", NULL, NULL, query), "text/plain", text.data, text.len, &r);
    free(query);
    buf_free(&text);
    if (rc == 0) {
        json_t *j = parse_body(&r);
        const char *v = json_string_value(json_object_get(j, "id"));
        if (v) snprintf(id, cap, "%s", v);
        else rc = 1;
        json_decref(j);
    }
    buf_free(&r.body);
    return rc;
}

/* The progress lines of a followed job: each printed as it comes; the job
 * object (event "job") kept, the last one being the job as it ended. */
static int on_job_event(sse_t *s, const char *event, const char *data)
{
    if (strcmp(event, "job") == 0) {
        json_t *j = json_loads(data, 0, NULL);
        if (!j) return -1;
        json_decref(s->done);
        s->done = j;
        return 0;
    }
    printf("%s\n", data);
    fflush(stdout);
    return 0;
}

#define FOLLOW_PATIENCE 60

static int job_events(ctl_t *c, const char *id, int follow)
{
    resp_t r = {0};
    if (follow) {
        /* A stream that breaks (the server restarting, the network) is
         * followed again after its last line, until the job has ended or
         * FOLLOW_PATIENCE seconds pass without a line. */
        sse_t s = {.on_event = on_job_event};
        int rc = 1, delay = 1;
        time_t give_up = time(NULL) + FOLLOW_PATIENCE;
        for (;;) {
            char q[64];
            snprintf(q, sizeof q, "?stream=true&after=%lld", s.last_id);
            resp_t rr = {.sse = &s};
            int seen = s.n_events;
            rc = http_call(c, "GET", make_url(c, "/v1/jobs", id, "events", q), NULL, NULL, 0, &rr);
            buf_free(&rr.body);
            s.line.len = s.data.len = 0;   /* a broken event is read again whole */
            s.event[0] = 0;
            const char *st = json_string_value(json_object_get(s.done, "status"));
            int ended = st && (strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0);
            if (rc == 0 && ended) break;
            if (rc && rr.status >= 400 && rr.status < 500) break;   /* the server's answer: no job, no key */
            if (s.n_events > seen + 1) give_up = time(NULL) + FOLLOW_PATIENCE, delay = 1;
            if (time(NULL) >= give_up) {
                fprintf(stderr, "%s: job %s's stream: no line for %d s; giving up\n", prog, id, FOLLOW_PATIENCE);
                rc = 1;
                break;
            }
            fprintf(stderr, "%s: job %s's stream broke; following it again after line %lld in %d s\n", prog, id,
                    s.last_id, delay);
            sleep((unsigned)delay);
            delay = delay < 8 ? 2 * delay : 10;
        }
        if (rc == 0) {
            const char *st = json_string_value(json_object_get(s.done, "status"));
            const char *err = json_string_value(json_object_get(s.done, "error"));
            fprintf(stderr, "job %s: %s%s%s\n", id, st ? st : "?", err ? ": " : "", err ? err : "");
            rc = st && strcmp(st, "succeeded") == 0 ? 0 : 1;
        }
        sse_free(&s);
        return rc;
    }
    long long after = 0;
    for (;;) {   /* page by page */
        char q[64];
        snprintf(q, sizeof q, "?after=%lld", after);
        int rc = http_call(c, "GET", make_url(c, "/v1/jobs", id, "events", q), NULL, NULL, 0, &r);
        json_t *j = rc == 0 ? parse_body(&r) : NULL;
        buf_free(&r.body);
        if (rc || !j) return 1;
        json_t *e;
        size_t i;
        json_array_foreach(json_object_get(j, "events"), i, e) {
            char *line = json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
            if (line) puts(line);
            free(line);
        }
        int more = json_is_true(json_object_get(j, "more"));
        after = (long long)json_integer_value(json_object_get(j, "next"));
        json_decref(j);
        if (!more) return 0;
    }
}

static int job_submit(ctl_t *c, const char *config, const char *family, const char *text, const char *file,
                      const char *path, const char *url, json_t *extra)
{
    json_error_t je;
    json_t *cfg = json_load_file(config, 0, &je);
    if (!json_is_object(cfg)) {
        fprintf(stderr, "%s: %s: %s\n", prog, config, cfg ? "a config must be a JSON object" : je.text);
        json_decref(cfg);
        json_decref(extra);
        return 1;
    }
    /* A config written for `spanserve train` is taken as it is: its family
     * and device go beside the config (the flags win), and its text,
     * checkpoint and log are left out, being the job's own (the text is
     * --text, --file, --path or --url-text). */
    json_t *req = extra;
    json_t *fam = json_object_get(cfg, "family"), *dev = json_object_get(cfg, "device");
    if (family) json_object_set_new(req, "family", json_string(family));
    else if (fam) json_object_set(req, "family", fam);
    if (dev && !json_object_get(req, "device")) json_object_set(req, "device", dev);
    static const char *own[] = {"family", "device", "data", "out", "log"};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
        if (i >= 2 && json_object_get(cfg, own[i]))
            fprintf(stderr, "%s: note: the config's \"%s\" is left out: a job's %s is its own\n", prog, own[i],
                    i == 2 ? "text" : i == 3 ? "checkpoint" : "log");
        json_object_del(cfg, own[i]);
    }
    json_object_set_new(req, "config", cfg);
    char id[128];
    if (text) {
        if (upload_text(c, text, NULL, id, sizeof id)) { json_decref(req); return 1; }
        json_object_set_new(req, "file", json_string(id));
    } else if (file) json_object_set_new(req, "file", json_string(file));
    else if (path) json_object_set_new(req, "path", json_string(path));
    else json_object_set_new(req, "url", json_string(url));
    resp_t r = {0};
    int rc = http_json(c, "POST", make_url(c, "/v1/jobs", NULL, NULL, NULL), req, &r);
    if (rc == 0) {
        json_t *j = parse_body(&r);
        const char *v = json_string_value(json_object_get(j, "id"));
        printf("%s\n", v ? v : "?");
        rc = j ? 0 : 1;
        json_decref(j);
    } else if (text && r.status >= 400 && r.status < 500) {
        /* refused: the text uploaded for it would stay in the data
         * directory, unused */
        resp_t d = {0};
        if (http_call(c, "DELETE", make_url(c, "/v1/files", id, NULL, NULL), NULL, NULL, 0, &d) == 0)
            fprintf(stderr, "%s: the text uploaded for it (%s) is deleted again\n", prog, id);
        buf_free(&d.body);
    }
    buf_free(&r.body);
    return rc;
}

static int cmd_jobs(ctl_t *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", 0, 0, 'j'},   {"status", 1, 0, 's'}, {"follow", 0, 0, 'f'}, {"text", 1, 0, 't'},
        {"file", 1, 0, 'F'},   {"path", 1, 0, 'p'},   {"url-text", 1, 0, 'u'}, {"family", 1, 0, 'a'},
        {"id", 1, 0, 'i'},     {"name", 1, 0, 'n'},   {"deploy", 0, 0, 'd'}, {"webhook", 1, 0, 'w'},
        {"device", 1, 0, 'D'}, COMMON_OPTS,           {0, 0, 0, 0}};
    int as_json = 0, follow = 0, deploy = 0, opt;
    const char *status = NULL, *text = NULL, *file = NULL, *path = NULL, *url = NULL, *family = NULL, *id = NULL,
               *name = NULL, *webhook = NULL, *device = NULL;
    /* --url is the server's: a text fetched by the server is --url-text */
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'j': as_json = 1; break;
        case 's': status = optarg; break;
        case 'f': follow = 1; break;
        case 't': text = optarg; break;
        case 'F': file = optarg; break;
        case 'p': path = optarg; break;
        case 'u': url = optarg; break;
        case 'a': family = optarg; break;
        case 'i': id = optarg; break;
        case 'n': name = optarg; break;
        case 'd': deploy = 1; break;
        case 'w': webhook = optarg; break;
        case 'D': device = optarg; break;
        case 'h': fputs(jobs_usage, stdout); return 0;
        default:
            if (!common_opt(c, opt)) return usage_error(jobs_usage, "unknown option");
        }
    }
    if (!c->url_set) {
        const char *u = getenv("SPANSERVE_JOBS_URL");
        c->url = u && *u ? u : "http://127.0.0.1:8081";
    }
    if (!c->key_set) c->key = getenv("SPANSERVE_ADMIN_KEY");
    const char *action = optind < argc ? argv[optind++] : "list";
    char **a = argv + optind;
    int n = argc - optind;
    int submit = strcmp(action, "submit") == 0;
    if (!submit && (text || file || path || url || family || id || deploy || webhook || device))
        return usage_error(jobs_usage, "--text, --file, --path, --url-text, --family, --id, --deploy, --webhook and --device are for 'submit'");
    if (name && !submit && strcmp(action, "upload") != 0) return usage_error(jobs_usage, "--name is for 'submit' and 'upload'");
    if ((as_json || status) && strcmp(action, "list") != 0) return usage_error(jobs_usage, "--json and --status are for 'list'");
    if (follow && strcmp(action, "events") != 0) return usage_error(jobs_usage, "--follow is for 'events'");
    if (strcmp(action, "list") == 0) {
        if (n) return usage_error(jobs_usage, "'list' takes no arguments");
        char q[64] = "";
        if (status) snprintf(q, sizeof q, "?status=%.40s", status);
        resp_t r = {0};
        int rc = http_call(c, "GET", make_url(c, "/v1/jobs", NULL, NULL, *q ? q : NULL), NULL, NULL, 0, &r);
        if (rc == 0 && as_json) print_body(&r);
        else if (rc == 0) {
            json_t *j = parse_body(&r);
            if (j) print_job_table(json_object_get(j, "jobs"));
            else rc = 1;
            json_decref(j);
        }
        buf_free(&r.body);
        return rc;
    }
    if (submit) {
        if (n != 1) return want_args(jobs_usage, action, n, 1, 1);
        if ((text != NULL) + (file != NULL) + (path != NULL) + (url != NULL) != 1)
            return usage_error(jobs_usage, "give the text as one of --text FILE, --file ID, --path P, --url-text URL");
        json_t *extra = json_object();
        if (id) json_object_set_new(extra, "id", json_string(id));
        if (name) json_object_set_new(extra, "name", json_string(name));
        if (deploy) json_object_set_new(extra, "deploy", json_true());
        if (webhook) json_object_set_new(extra, "webhook", json_string(webhook));
        if (device) json_object_set_new(extra, "device", json_string(device));
        return job_submit(c, a[0], family, text, file, path, url, extra);
    }
    if (strcmp(action, "upload") == 0) {
        if (n != 1) return want_args(jobs_usage, action, n, 1, 1);
        char fid[128];
        int rc = upload_text(c, a[0], name, fid, sizeof fid);
        if (rc == 0) puts(fid);
        return rc;
    }
    if (strcmp(action, "download") == 0 ? n < 1 || n > 2 : n != 1)
        return want_args(jobs_usage, action, n, 1, strcmp(action, "download") == 0 ? 2 : 1);
    if (strcmp(action, "get") == 0) return call_print(c, "GET", make_url(c, "/v1/jobs", a[0], NULL, NULL), NULL, NULL, NULL);
    if (strcmp(action, "events") == 0) return job_events(c, a[0], follow);
    if (strcmp(action, "delete") == 0)
        return call_print(c, "DELETE", make_url(c, "/v1/jobs", a[0], NULL, NULL), NULL, "deleted", "deleted ");
    if (strcmp(action, "download") == 0) {
        char what[128];
        snprintf(what, sizeof what, "job %.64s's checkpoint", a[0]);
        return download_to(c, make_url(c, "/v1/jobs", a[0], "checkpoint", NULL), n == 2 ? a[1] : "-", what);
    }
    if (strcmp(action, "cancel") == 0 || strcmp(action, "resume") == 0) {
        resp_t r = {0};
        int rc = http_call(c, "POST", make_url(c, "/v1/jobs", a[0], action, NULL), NULL, NULL, 0, &r);
        if (rc == 0) {
            json_t *j = parse_body(&r);
            const char *st = json_string_value(json_object_get(j, "status"));
            printf("%s: %s%s\n", a[0], st ? st : "?", json_is_true(json_object_get(j, "cancelling")) ? " (cancelling)" : "");
            json_decref(j);
        }
        buf_free(&r.body);
        return rc;
    }
    return usage_error(jobs_usage, "unknown jobs action '%s'", action);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv)
{
    static const struct option opts[] = {COMMON_OPTS, {"version", 0, 0, 'v'}, {0, 0, 0, 0}};
    ctl_t c = {0};
    c.url = getenv("SPANSERVE_URL");
    if (!c.url || !*c.url) c.url = DEFAULT_URL;
    c.key = getenv("SPANSERVE_API_KEY");
    int opt;
    /* "+": the global options end at the command's name. */
    while ((opt = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
        if (opt == 'h') { fputs(main_usage, stdout); return 0; }
        if (opt == 'v') { printf("spanctl %s\n", SPANCTL_VERSION); return 0; }
        if (!common_opt(&c, opt)) return usage_error(main_usage, "unknown option");
    }
    if (optind >= argc) return usage_error(main_usage, "a command is required");
    const char *cmd = argv[optind];
    if (strcmp(cmd, "help") == 0) { fputs(main_usage, stdout); return 0; }
    if (strcmp(cmd, "version") == 0) { printf("spanctl %s\n", SPANCTL_VERSION); return 0; }
    static const struct { const char *name; int (*fn)(ctl_t *, int, char **); } cmds[] = {
        {"generate", cmd_generate}, {"score", cmd_score},       {"spans", cmd_spans},
        {"models", cmd_models},     {"sessions", cmd_sessions}, {"jobs", cmd_jobs}};
    int (*fn)(ctl_t *, int, char **) = NULL;
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
        if (strcmp(cmd, cmds[i].name) == 0) fn = cmds[i].fn;
    if (!fn) return usage_error(main_usage, "unknown command '%s'", cmd);

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || !(c.curl = curl_easy_init())) {
        fprintf(stderr, "%s: libcurl could not start\n", prog);
        return 1;
    }
    int first = optind;
    optind = 0; /* GNU getopt: start afresh on the command's arguments */
    int rc = fn(&c, argc - first, argv + first);
    curl_easy_cleanup(c.curl);
    curl_global_cleanup();
    return rc;
}
