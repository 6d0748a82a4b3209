/*
 * load.c - a load generator for `spanserve serve`: N sessions (default 64)
 * each generating in a loop (POST /v1/generate with its session, max_tokens
 * 32) for a duration (default 30 s), all at once over one libcurl multi
 * handle, so that the client costs one thread and the timings are the
 * server's. Reports requests, errors by status, generated tokens per second,
 * and request latency p50/p90/p99/max.
 *
 * Build and run (a server must be listening; tests/load/run.sh starts one):
 *   cc -std=c11 -O2 -Wall -Wextra -Werror tests/load/load.c $(pkg-config --cflags --libs libcurl) -o build/load
 *   build/load --url http://127.0.0.1:8080 [--model aspan] [--sessions 64] [--seconds 30]
 *              [--max-tokens 32] [--prompt TEXT] [--api-key KEY]
 *   sh tests/load/run.sh [load options]     # builds, starts a server on a free port, runs, stops it
 *
 * Each session's first request sends the prompt (default "ROMEO:"); the later
 * ones send an empty prompt, continuing the session's memory. The sessions
 * are created first (ids load-PID-I) and deleted at the end. The last line is
 * machine-readable:
 *   load: requests=N ok=N errors=N tokens=N seconds=S tokens_per_s=X requests_per_s=X p50_ms=X p99_ms=X
 * Exit status: 0 when every request succeeded, 1 when any failed, 2 on bad
 * arguments or when the sessions could not be made. Only the given URL is
 * contacted (use a loopback address).
 */
#define _POSIX_C_SOURCE 200809L
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SESSIONS 1024
#define RESP_CAP 65536          /* a generate response of 32 tokens is ~600 bytes */

typedef struct {
    CURL *h;
    char id[64];
    char body[4096];
    char resp[RESP_CAP];
    size_t resp_len;
    struct curl_slist *hdrs;
    double t_start;
    int requests;               /* requests made by this session so far */
} conn_t;

static struct {
    const char *url, *model, *prompt, *key;
    int sessions, max_tokens;
    double seconds;
} opt = {"http://127.0.0.1:8080", "aspan", "ROMEO:", NULL, 64, 32, 30};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t on_data(char *p, size_t size, size_t n, void *cls)
{
    conn_t *c = cls;
    size_t k = size * n, room = RESP_CAP - 1 - c->resp_len;
    memcpy(c->resp + c->resp_len, p, k < room ? k : room);
    c->resp_len += k < room ? k : room;
    c->resp[c->resp_len] = 0;
    return k;
}

/* Writes S as a JSON string (quotes included) into OUT; returns 0, or -1 if it does not fit. */
static int json_quote(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    if (cap < 3) return -1;
    out[o++] = '"';
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        char esc[8];
        int n;
        if (ch == '"' || ch == '\\') n = snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch < 0x20) n = snprintf(esc, sizeof esc, "\\u%04x", ch);
        else esc[0] = (char)ch, esc[1] = 0, n = 1;
        if (o + (size_t)n + 2 > cap) return -1;
        memcpy(out + o, esc, (size_t)n);
        o += (size_t)n;
    }
    out[o++] = '"';
    out[o] = 0;
    return 0;
}

static struct curl_slist *make_headers(void)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "Expect:");   /* no 100-continue round trip */
    if (opt.key) {
        char auth[512];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", opt.key);
        h = curl_slist_append(h, auth);
    }
    return h;
}

/* One blocking request (setup and cleanup); returns the HTTP status, 0 on a transport error. */
static long request_once(const char *method, const char *path, const char *body)
{
    char url[1024];
    static conn_t tmp;   /* only its response buffer is used */
    tmp.resp_len = 0;
    tmp.resp[0] = 0;
    snprintf(url, sizeof url, "%s%s", opt.url, path);
    CURL *h = curl_easy_init();
    struct curl_slist *hdrs = make_headers();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &tmp);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    if (body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 300) fprintf(stderr, "load: %s %s: %ld %s\n", method, path, status, tmp.resp);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return status;
}

/* Prepares C's next POST /v1/generate. */
static void arm(conn_t *c, CURLM *multi)
{
    char prompt[2048], url[1024];
    if (json_quote(c->requests == 0 ? opt.prompt : "", prompt, sizeof prompt)) prompt[0] = 0;
    snprintf(c->body, sizeof c->body, "{\"session\":\"%s\",\"prompt\":%s,\"max_tokens\":%d,\"seed\":%d}", c->id, prompt,
             opt.max_tokens, c->requests);
    snprintf(url, sizeof url, "%s/v1/generate", opt.url);
    curl_easy_reset(c->h);
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, c->hdrs);
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, c->body);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->h, CURLOPT_PRIVATE, c);
    curl_easy_setopt(c->h, CURLOPT_TIMEOUT, 120L);
    c->resp_len = 0;
    c->resp[0] = 0;
    c->t_start = now_s();
    curl_multi_add_handle(multi, c->h);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *v, size_t n, double p)
{
    if (!n) return 0;
    size_t i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static int usage(void)
{
    fprintf(stderr, "usage: load [--url URL] [--model NAME] [--sessions N] [--seconds S] [--max-tokens N] "
                    "[--prompt TEXT] [--api-key KEY]\n");
    return 2;
}

int main(int argc, char **argv)
{
    opt.key = getenv("SPANSERVE_API_KEY");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(), 0;
        if (!v) return usage();
        if (strcmp(a, "--url") == 0) opt.url = v;
        else if (strcmp(a, "--model") == 0) opt.model = v;
        else if (strcmp(a, "--prompt") == 0) opt.prompt = v;
        else if (strcmp(a, "--api-key") == 0) opt.key = v;
        else if (strcmp(a, "--sessions") == 0) opt.sessions = atoi(v);
        else if (strcmp(a, "--max-tokens") == 0) opt.max_tokens = atoi(v);
        else if (strcmp(a, "--seconds") == 0) opt.seconds = atof(v);
        else return usage();
        i++;
    }
    if (opt.sessions < 1 || opt.sessions > MAX_SESSIONS || opt.max_tokens < 0 || !(opt.seconds > 0 && opt.seconds <= 3600) ||
        strlen(opt.model) > 64 || !*opt.prompt)
        return usage();
    curl_global_init(CURL_GLOBAL_DEFAULT);

    conn_t *conns = calloc((size_t)opt.sessions, sizeof *conns);
    size_t lat_cap = 1 << 16, lat_n = 0;
    double *lat = malloc(lat_cap * sizeof *lat);
    if (!conns || !lat) return fprintf(stderr, "load: out of memory\n"), 2;
    for (int i = 0; i < opt.sessions; i++) {
        conn_t *c = &conns[i];
        char body[256];
        snprintf(c->id, sizeof c->id, "load-%ld-%d", (long)getpid(), i);
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"id\":\"%s\"}", opt.model, c->id);
        if (request_once("POST", "/v1/sessions", body) != 201) {
            fprintf(stderr, "load: cannot create session %s at %s\n", c->id, opt.url);
            for (int k = 0; k < i; k++) {
                char path[128];
                snprintf(path, sizeof path, "/v1/sessions/%s", conns[k].id);
                request_once("DELETE", path, NULL);
            }
            return 2;
        }
        c->h = curl_easy_init();
        c->hdrs = make_headers();
    }

    CURLM *multi = curl_multi_init();
    curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)opt.sessions);
    double t0 = now_s(), t_end = t0 + opt.seconds;
    for (int i = 0; i < opt.sessions; i++) arm(&conns[i], multi);
    long requests = 0, ok = 0, errors = 0, tokens = 0, by_status[600] = {0}, transport = 0;
    int running = opt.sessions, shown = 0;
    while (running > 0) {
        curl_multi_perform(multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(multi, &left))) {
            if (m->msg != CURLMSG_DONE) continue;
            conn_t *c;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&c);
            double t = now_s();
            long status = 0;
            curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
            CURLcode rc = m->data.result;
            curl_multi_remove_handle(multi, c->h);
            requests++;
            c->requests++;
            if (lat_n == lat_cap) {
                double *nl = realloc(lat, 2 * lat_cap * sizeof *lat);
                if (nl) lat = nl, lat_cap *= 2;
            }
            if (lat_n < lat_cap) lat[lat_n++] = (t - c->t_start) * 1e3;
            const char *ct = strstr(c->resp, "\"completion_tokens\":");
            if (rc == CURLE_OK && status == 200 && ct) {
                ok++;
                tokens += atol(ct + 20);
            } else {
                errors++;
                if (rc != CURLE_OK) transport++;
                else if (status > 0 && status < 600) by_status[status]++;
                if (shown++ < 3)
                    fprintf(stderr, "load: %s: %s %ld %.200s\n", c->id, rc != CURLE_OK ? curl_easy_strerror(rc) : "HTTP", status,
                            c->resp);
            }
            if (t < t_end) arm(c, multi);
        }
        if (running > 0 || now_s() < t_end) {
            int numfds;
            curl_multi_poll(multi, NULL, 0, 100, &numfds);
        }
        if (running == 0 && now_s() < t_end) curl_multi_perform(multi, &running);
    }
    double wall = now_s() - t0;

    for (int i = 0; i < opt.sessions; i++) {
        char path[128];
        snprintf(path, sizeof path, "/v1/sessions/%s", conns[i].id);
        request_once("DELETE", path, NULL);
        curl_slist_free_all(conns[i].hdrs);
        curl_easy_cleanup(conns[i].h);
    }
    curl_multi_cleanup(multi);

    qsort(lat, lat_n, sizeof *lat, cmp_double);
    printf("load: %s, model %s, %d sessions, max_tokens %d, %.1f s\n", opt.url, opt.model, opt.sessions, opt.max_tokens, wall);
    printf("  requests        %ld (%.1f/s)\n", requests, requests / wall);
    printf("  ok              %ld\n", ok);
    printf("  errors          %ld", errors);
    if (transport) printf("  transport %ld", transport);
    for (int s = 0; s < 600; s++)
        if (by_status[s]) printf("  http %d: %ld", s, by_status[s]);
    printf("\n  tokens          %ld generated, %.1f tokens/s\n", tokens, tokens / wall);
    size_t slow = 0;
    for (size_t i = 0; i < lat_n; i++) slow += lat[i] > 1000.0;
    printf("  latency ms      p50 %.1f  p90 %.1f  p99 %.1f  max %.1f  (%zu over 1 s)\n", pct(lat, lat_n, 50), pct(lat, lat_n, 90),
           pct(lat, lat_n, 99), lat_n ? lat[lat_n - 1] : 0.0, slow);
    printf("load: requests=%ld ok=%ld errors=%ld tokens=%ld seconds=%.1f tokens_per_s=%.1f requests_per_s=%.1f p50_ms=%.1f "
           "p99_ms=%.1f\n",
           requests, ok, errors, tokens, wall, tokens / wall, requests / wall, pct(lat, lat_n, 50), pct(lat, lat_n, 99));
    free(lat);
    free(conns);
    curl_global_cleanup();
    return errors ? 1 : 0;
}
