/*
 * fuzz_http.c - libFuzzer target for the HTTP request path (`make fuzz`):
 * method, path, headers and body through libmicrohttpd, the route table,
 * the routes' validation and the scheduler of a real server, started once
 * in this process on a loopback port with the tiny models of
 * tests/fuzz/models ("aspan", "aspan-span" and "par" from tiny-par), a model directory
 * holding them and a state directory of its own.
 *
 * An input is lines: the method, the path (with its query), header lines up
 * to an empty line, then the body (any bytes). The request is sent as
 *   METHOD PATH HTTP/1.1 / Host / the headers / Content-Length: BODY / body
 * unless the input has its own Content-Length or Transfer-Encoding (then as
 * it is, and the server may wait for bytes that never come: that is not a
 * finding, the read gives up after a while). Every answer must be:
 *   - an HTTP/1.x status line;
 *   - JSON bodies valid JSON, and an error (4xx/5xx) in the error shape
 *     {"error": {"code": STATUS, "type", "message"}}, under 2 KiB;
 *   - libmicrohttpd's own refusals (a request it cannot parse): a short
 *     body under 512 bytes;
 *   - event streams: every data line JSON (or [DONE]);
 * and a well-framed request must get an answer within 10 s (no hang).
 * AddressSanitizer and UBSan watch the server's threads meanwhile.
 * FUZZ_HTTP_SLOW=1 prints the inputs whose answer took over 0.3 s.
 */
#define _GNU_SOURCE
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define REQUIRE(c)                                                                                   \
    do {                                                                                             \
        if (!(c)) {                                                                                  \
            fprintf(stderr, "fuzz_http: %s failed (line %d)\n", #c, __LINE__);                     \
            abort();                                                                                 \
        }                                                                                            \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int port;

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    REQUIRE(a && b);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) REQUIRE(fwrite(buf, 1, n, b) == n);
    fclose(a);
    fclose(b);
}

static void start_server(void)
{
    const char *models = getenv("FUZZ_MODELS");
    if (!models) models = "tests/fuzz/models";
    static char dir[] = "/tmp/spanserve-fuzz-http-XXXXXX";
    REQUIRE(mkdtemp(dir));
    static char state[600], mdir[600], sessions[700];
    snprintf(state, sizeof state, "%s/state", dir);
    snprintf(mdir, sizeof mdir, "%s/models", dir);
    snprintf(sessions, sizeof sessions, "%s/sessions", state);
    REQUIRE(mkdir(state, 0700) == 0 && mkdir(sessions, 0700) == 0 && mkdir(mdir, 0700) == 0);
    char from[1024], to[1024];
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "tiny-par" : "tiny-aspan";
        snprintf(from, sizeof from, "%s/%s.safetensors", models, name);
        snprintf(to, sizeof to, "%s/%s.safetensors", mdir, name);
        copy_file(from, to);
    }
    config_t *c = &srv.cfg;
    serve_defaults(c);
    c->listen_addr = "127.0.0.1:0";
    c->port = 0;
    c->state_dir = state;
    c->model_dir = realpath(mdir, NULL);
    c->max_tokens = 16;      /* bounded work per input */
    c->max_prompt = 512;
    c->max_body = 1 << 16;
    c->request_timeout = 5;
    c->durability = DURABLE_WRITE;   /* the same code path; a sync per input would be all the fuzzer does */
    c->session_memory = 1 << 20;
    REQUIRE(c->model_dir);
    signal(SIGPIPE, SIG_IGN);
    REQUIRE(http_start() == 0);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv.daemon, MHD_DAEMON_INFO_BIND_PORT);
    REQUIRE(info && info->port);
    port = info->port;
    pthread_mutex_lock(&srv.lock);
    static const char *names[3] = {"aspan", "aspan-span", "par"};
    for (int i = 0; i < 3; i++) {
        char err[512];
        int status;
        snprintf(to, sizeof to, "%s/%s.safetensors", c->model_dir, i == 2 ? "tiny-par" : "tiny-aspan");
        c->mem_mode = i == 1 ? MEM_SPAN : MEM_EXACT;
        if (!models_add(names[i], to, to, NULL, err, &status)) {
            fprintf(stderr, "fuzz_http: %s\n", err);
            exit(2);
        }
    }
    c->mem_mode = MEM_EXACT;
    srv.ready = 1;
    pthread_mutex_unlock(&srv.lock);
    REQUIRE(sess_writer_start() == 0 && sched_start() == 0);
}

/* The request of an input (see the top); *FRAMED when the harness set its
 * Content-Length (the server has all it needs to answer). */
static char *build_request(const uint8_t *d, size_t n, size_t *len, int *framed)
{
    char *out = NULL;
    size_t cap = 0;
    FILE *f = open_memstream(&out, &cap);
    REQUIRE(f);
    const uint8_t *end = d + n, *p = d;
    /* a line: up to '\n', '\r' left out (the harness writes the line ends) */
    const uint8_t *line[2 + 32];
    size_t llen[2 + 32];
    int nl = 0, own_length = 0;
    while (p < end && nl < 2 + 32) {
        const uint8_t *q = memchr(p, '\n', (size_t)(end - p));
        size_t k = q ? (size_t)(q - p) : (size_t)(end - p);
        while (k && p[k - 1] == '\r') k--;   /* "\r\n" ends a line as "\n" does */
        line[nl] = p;
        llen[nl++] = k;
        p = q ? q + 1 : end;
        if (nl > 2 && k == 0) break;   /* the empty line: the body follows */
    }
    for (int i = 0; i < 2; i++) {   /* the method (GET when empty), then the path ("/" when none) */
        if (i) fputc(' ', f);
        if (i >= nl || !llen[i]) fputs(i ? "/" : "GET", f);
        for (size_t j = 0; i < nl && j < llen[i]; j++)
            if (line[i][j] != '\r') fputc(line[i][j], f);
    }
    fputs(" HTTP/1.1\r\nHost: fuzz\r\n", f);
    for (int i = 2; i < nl; i++) {
        if (!llen[i]) break;
        char name[32];
        size_t k = llen[i] < sizeof name - 1 ? llen[i] : sizeof name - 1;
        memcpy(name, line[i], k);
        name[k] = 0;
        if (!strncasecmp(name, "content-length", 14) || !strncasecmp(name, "transfer-encoding", 17)) own_length = 1;
        for (size_t j = 0; j < llen[i]; j++)
            if (line[i][j] != '\r') fputc(line[i][j], f);
        fputs("\r\n", f);
    }
    size_t body = (size_t)(end - p);
    if (!own_length) fprintf(f, "Content-Length: %zu\r\n", body);
    fputs("\r\n", f);
    fwrite(p, 1, body, f);
    fclose(f);
    *len = cap;
    *framed = !own_length;
    return out;
}

/* Reads an answer: the headers (after any 100 Continue), then the body by
 * its Content-Length, chunked, or to the connection's end (none for HEAD). Returns the bytes
 * read (*N; 0 when the server closed without answering); *LATE when LIMIT
 * seconds passed first. */
static char *read_answer(int fd, size_t *n, double limit, int head, int *late)
{
    size_t cap = 1 << 16, got = 0;
    char *b = malloc(cap + 1);
    REQUIRE(b);
    double t0 = now_s();
    long want = -1;   /* total bytes, once the headers tell */
    int chunked = 0;
    *late = 0;
    for (;;) {
        if (want >= 0 && got >= (size_t)want) break;
        if (chunked && got >= 5 && memcmp(b + got - 5, "0\r\n\r\n", 5) == 0) break;
        double left = limit - (now_s() - t0);
        struct pollfd pf = {fd, POLLIN, 0};
        if (left <= 0 || poll(&pf, 1, (int)(left * 1000) + 1) <= 0) {
            *late = 1;
            break;
        }
        if (got == cap) {
            cap *= 2;
            REQUIRE(cap < (64u << 20));   /* no answer of the fuzz server is this large */
            b = realloc(b, cap + 1);
            REQUIRE(b);
        }
        ssize_t k = recv(fd, b + got, cap - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
        b[got] = 0;
        char *he;
        while (want < 0 && !chunked && (he = strstr(b, "\r\n\r\n"))) {
            if (strncmp(b, "HTTP/1.1 1", 10) == 0) {   /* an interim answer: the final one follows */
                size_t k2 = (size_t)(he + 4 - b);
                memmove(b, he + 4, got - k2 + 1);
                got -= k2;
                continue;
            }
            const char *cl = strcasestr(b, "\r\nContent-Length:");
            if (head) want = he + 4 - b;
            else if (cl && cl < he) want = (he + 4 - b) + strtol(cl + 17, NULL, 10);
            const char *te = strcasestr(b, "\r\nTransfer-Encoding: chunked");
            if (te && te < he && !head) chunked = 1;
            if (want < 0 && !chunked) want = LONG_MAX;   /* to the connection's end */
            break;
        }
    }
    b[got] = 0;
    *n = got;
    return b;
}

/* A chunked body BODY (LEN bytes) decoded in place; returns its length. */
static size_t dechunk(char *body, size_t len)
{
    size_t in = 0, out = 0;
    while (in < len) {
        char *end;
        unsigned long k = strtoul(body + in, &end, 16);
        char *crlf = strstr(body + in, "\r\n");
        if (!crlf || end > crlf || k == 0) break;
        in = (size_t)(crlf + 2 - body);
        if (k > len - in) k = len - in;
        memmove(body + out, body + in, k);
        out += k;
        in += k + 2;
    }
    body[out] = 0;
    return out;
}

/* The checks of the top on one answer. */
static void check_answer(char *b, size_t n, int framed, int head)
{
    if (n == 0) return;   /* libmicrohttpd closed a request it could not parse, or one still waiting for bytes */
    REQUIRE(n >= 12 && (memcmp(b, "HTTP/1.1 ", 9) == 0 || memcmp(b, "HTTP/1.0 ", 9) == 0));
    int status = atoi(b + 9);
    REQUIRE(status >= 100 && status < 600);
    const char *he = strstr(b, "\r\n\r\n");
    if (!he) {
        REQUIRE(!framed);   /* a whole request gets whole headers */
        return;
    }
    char *body = (char *)he + 4;
    size_t blen = n - (size_t)(body - b);
    const char *te = strcasestr(b, "\r\nTransfer-Encoding: chunked"), *cl = strcasestr(b, "\r\nContent-Length:");
    if (te && te < he) blen = dechunk(body, blen);
    else if (cl && cl < he && (size_t)strtol(cl + 17, NULL, 10) < blen) {
        /* what follows is the answer to another request: a body the harness framed that the server read as
         * shorter (a header line the harness did not see as a Content-Length, folded into another) */
        blen = (size_t)strtol(cl + 17, NULL, 10);
        body[blen] = 0;
    }
    const char *ct = strcasestr(b, "\r\nContent-Type: ");
    if (ct > he) ct = NULL;
    if (head || status == 304 || status == 204) return;
    if (ct && strncmp(ct + 16, "application/json", 16) == 0) {
        if (cl && cl < he && (size_t)strtol(cl + 17, NULL, 10) > blen) return;   /* cut short by the deadline */
        json_error_t je;
        json_t *j = json_loadb(body, blen, 0, &je);
        if (!j) fprintf(stderr, "fuzz_http: not JSON (%s): %.300s\n", je.text, b);
        REQUIRE(j);
        if (status >= 400) {
            json_t *e = json_object_get(j, "error");
            REQUIRE(json_is_object(e) && json_object_size(j) == 1);
            REQUIRE(json_integer_value(json_object_get(e, "code")) == status);
            REQUIRE(json_is_string(json_object_get(e, "type")) && json_is_string(json_object_get(e, "message")));
            REQUIRE(blen < 2048);
        }
        json_decref(j);
    } else if (ct && strncmp(ct + 16, "text/event-stream", 17) == 0) {
        for (const char *p = body; (p = strstr(p, "data: ")); p += 6) {
            const char *e = strchr(p, '\n');
            if (!e) break;
            if (strncmp(p + 6, "[DONE]", 6) == 0) continue;
            json_error_t je;
            json_t *j = json_loadb(p + 6, (size_t)(e - p - 6), 0, &je);
            if (!j) fprintf(stderr, "fuzz_http: event not JSON: %.*s\n", (int)(e - p), p);
            REQUIRE(j);
            json_decref(j);
        }
    } else if (status >= 400) {
        REQUIRE(blen < 512);   /* libmicrohttpd's own refusal page */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!port) start_server();
    size_t len;
    int framed;
    char *req = build_request(data, size, &len, &framed);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    for (size_t at = 0; at < len;) {
        ssize_t k = send(fd, req + at, len - at, MSG_NOSIGNAL);
        if (k <= 0) break;   /* the server may answer and close before the body (401, 413) */
        at += (size_t)k;
    }
    size_t n;
    int late, head = len >= 5 && memcmp(req, "HEAD ", 5) == 0;
    double t0 = now_s();
    char *ans = read_answer(fd, &n, framed ? 10.0 : 0.2, head, &late);
    if (getenv("FUZZ_HTTP_SLOW") && now_s() - t0 > 0.3)
        fprintf(stderr, "fuzz_http: %.2f s (%zu bytes back, framed %d) for: %.200s\n", now_s() - t0, n, framed, req);
    if (framed && late && n == 0) fprintf(stderr, "fuzz_http: no answer in 10 s to: %.300s\n", req);
    REQUIRE(!(framed && late && n == 0));   /* a whole request is answered: nothing hangs */
    check_answer(ans, n, framed, head);
    close(fd);
    free(ans);
    free(req);
    return 0;
}
