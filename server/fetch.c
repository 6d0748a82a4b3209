/*
 * fetch.c - the requests the server makes to URLs its clients name: a
 * checkpoint or a training text downloaded over https, a webhook POSTed
 * when a job ends.
 *
 * Each of them goes through one destination policy, so that a client cannot
 * use the server to reach what only the server can reach (loopback services,
 * the cloud metadata address, the private network): every address libcurl
 * connects to, after DNS resolution and on every redirect, must be a public
 * one, unless the URL's host is named by --fetch-allow. The check is in the
 * socket callback, on the address actually used, so a name that resolves
 * differently the second time changes nothing. Failures to connect, whatever
 * their cause (refused, timed out, unresolvable, a refused address, TLS),
 * are one message to the client, so that the answers do not tell an open
 * port from a closed one; the server's log has curl's own words.
 */
#define _GNU_SOURCE
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Redirects a download follows, each one checked as the first URL was. */
#define FETCH_MAX_REDIRECTS 5

/* The one answer for every failure to reach a host (see above). */
static const char unreachable[] =
    "cannot fetch the URL: its host could not be reached, refused the connection or failed the TLS handshake "
    "(the server connects only to public addresses unless --fetch-allow names the host; its log says which)";

/* ------------------------------------------------------------ the policy */

/* IPv4 blocks that are not public unicast (IANA's special-purpose registry,
 * the ones no client should reach through the server), host order. */
static const struct { uint32_t net; int bits; const char *what; } v4_blocks[] = {
    {0x00000000u, 32, "unspecified"},              /* 0.0.0.0 */
    {0x00000000u, 8, "reserved"},                  /* "this network" */
    {0x0a000000u, 8, "private"},                   /* 10/8 */
    {0x64400000u, 10, "carrier-grade NAT"},        /* 100.64/10 */
    {0x7f000000u, 8, "loopback"},                  /* 127/8 */
    {0xa9fe0000u, 16, "link-local"},               /* 169.254/16, the cloud metadata address among them */
    {0xac100000u, 12, "private"},                  /* 172.16/12 */
    {0xc0000000u, 24, "reserved"},                 /* 192.0.0/24, IETF protocol assignments */
    {0xc0000200u, 24, "reserved"},                 /* 192.0.2/24, documentation */
    {0xc0586300u, 24, "reserved"},                 /* 192.88.99/24, the old 6to4 relays */
    {0xc0a80000u, 16, "private"},                  /* 192.168/16 */
    {0xc6120000u, 15, "reserved"},                 /* 198.18/15, benchmarking (often used inside networks) */
    {0xc6336400u, 24, "reserved"},                 /* 198.51.100/24, documentation */
    {0xcb007100u, 24, "reserved"},                 /* 203.0.113/24, documentation */
    {0xffffffffu, 32, "broadcast"},
    {0xe0000000u, 4, "multicast"},                 /* 224/4 */
    {0xf0000000u, 4, "reserved"},                  /* 240/4 */
};

static const char *v4_class(uint32_t a)
{
    for (size_t i = 0; i < sizeof v4_blocks / sizeof *v4_blocks; i++) {
        uint32_t mask = v4_blocks[i].bits ? 0xffffffffu << (32 - v4_blocks[i].bits) : 0;
        if ((a & mask) == v4_blocks[i].net) return v4_blocks[i].what;
    }
    return NULL;
}

static uint32_t v4_at(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* IPv6: forms that carry an IPv4 address are judged by it (a mapped
 * ::ffff:127.0.0.1 reaches 127.0.0.1); of the rest only global unicast
 * (2000::/3) outside the IETF's special blocks is public. */
static const char *v6_class(const uint8_t *a)
{
    static const uint8_t zero[16];
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b};   /* 64:ff9b::/96 */
    if (memcmp(a, zero, 16) == 0) return "unspecified";
    if (memcmp(a, zero, 15) == 0 && a[15] == 1) return "loopback";
    if (memcmp(a, mapped, 12) == 0 || memcmp(a, nat64, 12) == 0) return v4_class(v4_at(a + 12));
    if (memcmp(a, zero, 12) == 0) {   /* IPv4-compatible (deprecated): never public */
        const char *c = v4_class(v4_at(a + 12));
        return c ? c : "reserved";
    }
    if (a[0] == 0x20 && a[1] == 0x02) return v4_class(v4_at(a + 2));   /* 6to4: 2002:AABB:CCDD::/48 */
    if (a[0] == 0xff) return "multicast";
    if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80) return "link-local";     /* fe80::/10 */
    if (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0) return "private";        /* fec0::/10, the old site-local */
    if ((a[0] & 0xfe) == 0xfc) return "private";                        /* fc00::/7, unique local */
    if ((a[0] & 0xe0) != 0x20) return "reserved";                       /* outside 2000::/3 */
    if (a[0] == 0x20 && a[1] == 0x01 && a[2] < 0x02) return "reserved"; /* 2001::/23: Teredo, benchmarking, ORCHID */
    if (a[0] == 0x20 && a[1] == 0x01 && a[2] == 0x0d && a[3] == 0xb8) return "reserved";   /* 2001:db8::/32, documentation */
    if (a[0] == 0x3f && a[1] == 0xff && (a[2] & 0xf0) == 0) return "reserved";            /* 3fff::/20, documentation */
    return NULL;
}

const char *fetch_addr_class(const struct sockaddr *sa, size_t len)
{
    if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in in;
        memcpy(&in, sa, sizeof in);
        return v4_class(ntohl(in.sin_addr.s_addr));
    }
    if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, sa, sizeof in6);
        return v6_class(in6.sin6_addr.s6_addr);
    }
    return "not an internet address";
}

int fetch_host_allowed(const char *host)
{
    size_t n = strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') host++, n -= 2;   /* an IPv6 literal as URLs write it */
    for (int i = 0; i < srv.cfg.n_fetch_allow; i++) {
        const char *a = srv.cfg.fetch_allow[i];
        size_t k = strlen(a);
        if (k >= 2 && a[0] == '[' && a[k - 1] == ']') a++, k -= 2;
        if (k == n && strncasecmp(a, host, n) == 0) return 1;
    }
    return 0;
}

/* One request's view of the policy, for the socket callback. */
typedef struct {
    int allowed;        /* the URL's host is named by --fetch-allow: any address */
    char refused[96];   /* the last address refused, and why, for the log */
} guard_t;

static curl_socket_t open_guarded(void *cls, curlsocktype purpose, struct curl_sockaddr *a)
{
    (void)purpose;
    guard_t *g = cls;
    const char *what = g->allowed ? NULL : fetch_addr_class(&a->addr, a->addrlen);
    if (what) {
        char ip[INET6_ADDRSTRLEN] = "?";
        struct sockaddr_storage ss;
        memcpy(&ss, &a->addr, a->addrlen < sizeof ss ? a->addrlen : sizeof ss);
        if (a->family == AF_INET) inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip, sizeof ip);
        else if (a->family == AF_INET6) inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, ip, sizeof ip);
        snprintf(g->refused, sizeof g->refused, "%s is a %s address", ip, what);
        return CURL_SOCKET_BAD;   /* curl tries the host's other addresses, if it has any */
    }
    /* close-on-exec: the job runner forks trainers, which must not inherit it */
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

CURLcode fetch_perform(CURL *c, const char *url, char *err, size_t cap)
{
    guard_t g = {0};
    char host[256] = "";
    CURLU *u = curl_url();
    char *h = NULL;
    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK && curl_url_get(u, CURLUPART_HOST, &h, 0) == CURLUE_OK)
        snprintf(host, sizeof host, "%s", h);
    curl_free(h);
    curl_url_cleanup(u);
    if (!*host) {
        snprintf(err, cap, "cannot fetch the URL: it names no host");
        return CURLE_URL_MALFORMAT;
    }
    g.allowed = fetch_host_allowed(host);
    char cerr[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_guarded);
    curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, &g);
    /* no proxy, whatever the environment says: through one the server would
     * see the proxy's address, never the destination's */
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    if (srv.cfg.ca_file) curl_easy_setopt(c, CURLOPT_CAINFO, srv.cfg.ca_file);
    CURLcode rc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, NULL);   /* cerr ends here */
    if (rc == CURLE_HTTP_RETURNED_ERROR) {
        snprintf(err, cap, "cannot fetch the URL: the host answered HTTP %ld", code);
    } else if (rc == CURLE_ABORTED_BY_CALLBACK) {
        snprintf(err, cap, "the server is shutting down");
    } else if (rc != CURLE_OK) {
        log_line("fetch from %s: %s%s%s", host, *cerr ? cerr : curl_easy_strerror(rc), *g.refused ? "; refused: " : "",
                 g.refused);
        snprintf(err, cap, "%s", unreachable);
    }
    return rc;
}

/* ------------------------------------------------------------ downloads */

typedef struct { int fd; size_t got, max; int over, werr; } sink_t;

/* Aborts a transfer when the server shuts down. */
static int on_progress(void *cls, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)cls, (void)dt, (void)dn, (void)ut, (void)un;
    return __atomic_load_n(&srv.stopping, __ATOMIC_RELAXED) || __atomic_load_n(&srv.draining, __ATOMIC_RELAXED);
}

static size_t on_data(char *p, size_t size, size_t n, void *cls)
{
    sink_t *s = cls;
    size_t k = size * n;
    if (s->got + k > s->max) {
        s->over = 1;
        return 0;   /* aborts the transfer */
    }
    for (size_t off = 0; off < k;) {
        ssize_t w = write(s->fd, p + off, k - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            s->werr = w < 0 ? errno : EIO;
            return 0;
        }
        off += (size_t)w;
    }
    s->got += k;
    return k;
}

/* Follows the redirects itself: each hop's host is checked against
 * --fetch-allow again (an allowed host may redirect anywhere), and a
 * redirect's body must not end up in the file. */
static int download(CURL *c, const char *url, sink_t *s, const char *limit, char *err, int *status)
{
    char *next = NULL;
    CURLcode rc;
    long code = 0;
    int hops = 0;
    for (;;) {
        rc = fetch_perform(c, url, err, 512);
        code = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        char *loc = NULL;
        if (rc != CURLE_OK || code / 100 != 3 || curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &loc) != CURLE_OK || !loc)
            break;
        if (++hops > FETCH_MAX_REDIRECTS || strncasecmp(loc, "https://", 8) != 0) {
            free(next);
            *status = 400;
            if (hops > FETCH_MAX_REDIRECTS) return snprintf(err, 512, "cannot fetch the URL: more than %d redirects", FETCH_MAX_REDIRECTS), -1;
            return snprintf(err, 512, "cannot fetch the URL: redirected to a URL that is not https://"), -1;
        }
        char *to = strdup(loc);
        free(next);
        if (!(next = to)) {
            *status = 503;
            return snprintf(err, 512, "out of memory"), -1;
        }
        url = next;
        if (ftruncate(s->fd, 0) != 0 || lseek(s->fd, 0, SEEK_SET) != 0) s->werr = errno;
        s->got = 0;
        if (s->werr) break;
    }
    free(next);
    if (s->over || rc == CURLE_FILESIZE_EXCEEDED) {
        *status = 413;
        return snprintf(err, 512, "the download is over %s (%zu bytes)", limit, s->max), -1;
    }
    if (s->werr) {
        *status = 500;
        return snprintf(err, 512, "cannot write the download: %s", strerror(s->werr)), -1;
    }
    if (rc == CURLE_ABORTED_BY_CALLBACK) return *status = 503, -1;
    if (rc != CURLE_OK) return *status = 400, -1;
    if (code / 100 != 2) {   /* a 3xx without a Location */
        *status = 400;
        return snprintf(err, 512, "cannot fetch the URL: the host answered HTTP %ld", code), -1;
    }
    return 0;
}

int fetch_url(const char *url, const char *path, size_t max, const char *limit, char *err, int *status)
{
    if (strncmp(url, "https://", 8) != 0) {
        *status = 400;
        return snprintf(err, 512, "url must be https://"), -1;
    }
    sink_t s = {open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644), 0, max, 0, 0};
    if (s.fd < 0) {
        log_line("fetch: cannot create %s: %s", path, strerror(errno));
        *status = 500;
        return snprintf(err, 512, "cannot create the file to download into: %s", strerror(errno)), -1;
    }
    CURL *c = curl_easy_init();
    int rc = -1;
    if (!c) {
        *status = 503;
        snprintf(err, 512, "libcurl could not start");
    } else {
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "https");
#else
        curl_easy_setopt(c, CURLOPT_PROTOCOLS, CURLPROTO_HTTPS);
#endif
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 600L);
        curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);   /* under 1 kB/s for 30 s: give up */
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);
        rc = download(c, url, &s, limit, err, status);
        curl_easy_cleanup(c);
    }
    /* on disk before the caller links it into place */
    if (rc == 0 && fsync(s.fd) != 0) {
        *status = 500;
        snprintf(err, 512, "cannot write the download: %s", strerror(errno));
        rc = -1;
    }
    if (close(s.fd) != 0 && rc == 0) {
        *status = 500;
        snprintf(err, 512, "cannot write the download: %s", strerror(errno));
        rc = -1;
    }
    if (rc) unlink(path);
    return rc;
}
