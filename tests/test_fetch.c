/*
 * test_fetch.c - server/fetch.c, the destination policy of the server's own
 * requests, alone: the class of every kind of address (a table of IPv4 and
 * IPv6 addresses, the IPv6 forms that carry an IPv4 one included),
 * --fetch-allow's matching of hosts, and fetch_url against loopback ports
 * this test opens: refused without --fetch-allow (nothing connects, nothing
 * is written), let through with it, one message for a refused address, a
 * closed port and an open port that speaks no TLS, and never a write over a
 * file that exists. The server around fetch.c is two stubs (srv, log_line).
 */
#define _GNU_SOURCE
#include "harness.h"
#include "server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

server_t srv;
static char last_log[1024];

void log_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_log, sizeof last_log, fmt, ap);
    va_end(ap);
}

/* The class fetch_addr_class gives the address TEXT (IPv4 or IPv6), or "public" for NULL. */
static const char *class_of(const char *text)
{
    struct sockaddr_in in = {.sin_family = AF_INET};
    struct sockaddr_in6 in6 = {.sin6_family = AF_INET6};
    const char *c;
    if (inet_pton(AF_INET, text, &in.sin_addr) == 1) c = fetch_addr_class((struct sockaddr *)&in, sizeof in);
    else if (inet_pton(AF_INET6, text, &in6.sin6_addr) == 1) c = fetch_addr_class((struct sockaddr *)&in6, sizeof in6);
    else return "not an address";
    return c ? c : "public";
}

static void test_classes(void)
{
    static const struct { const char *addr, *want; } table[] = {
        /* IPv4 */
        {"127.0.0.1", "loopback"}, {"127.255.255.254", "loopback"}, {"127.0.0.2", "loopback"},
        {"0.0.0.0", "unspecified"}, {"0.1.2.3", "reserved"},
        {"10.0.0.1", "private"}, {"10.255.255.255", "private"},
        {"172.16.0.1", "private"}, {"172.31.255.255", "private"}, {"172.15.255.255", "public"}, {"172.32.0.0", "public"},
        {"192.168.1.1", "private"}, {"192.169.0.1", "public"},
        {"169.254.169.254", "link-local"}, {"169.254.0.1", "link-local"},
        {"100.64.0.1", "carrier-grade NAT"}, {"100.127.255.255", "carrier-grade NAT"}, {"100.63.255.255", "public"},
        {"100.128.0.0", "public"},
        {"224.0.0.1", "multicast"}, {"239.255.255.250", "multicast"}, {"255.255.255.255", "broadcast"},
        {"240.0.0.1", "reserved"}, {"192.0.2.1", "reserved"}, {"198.18.0.1", "reserved"}, {"198.19.255.255", "reserved"},
        {"198.51.100.7", "reserved"}, {"203.0.113.9", "reserved"}, {"192.0.0.8", "reserved"},
        {"8.8.8.8", "public"}, {"1.1.1.1", "public"}, {"93.184.216.34", "public"}, {"126.255.255.255", "public"},
        {"128.0.0.1", "public"}, {"223.255.255.255", "public"},
        /* IPv6 */
        {"::1", "loopback"}, {"::", "unspecified"},
        {"fe80::1", "link-local"}, {"febf::1", "link-local"}, {"fec0::1", "private"},
        {"fc00::1", "private"}, {"fd12:3456::1", "private"},
        {"ff02::1", "multicast"}, {"ff0e::1", "multicast"},
        {"2001:db8::1", "reserved"}, {"2001::1", "reserved"}, {"100::1", "reserved"}, {"3fff::1", "reserved"},
        {"2606:4700:4700::1111", "public"}, {"2a00:1450:4001::1", "public"},
        /* IPv6 forms of IPv4 addresses: judged by the IPv4 address */
        {"::ffff:127.0.0.1", "loopback"}, {"::ffff:10.1.2.3", "private"}, {"::ffff:169.254.169.254", "link-local"},
        {"::ffff:0.0.0.0", "unspecified"}, {"::ffff:8.8.8.8", "public"},
        {"::127.0.0.1", "loopback"}, {"::10.0.0.1", "private"}, {"::8.8.8.8", "reserved"},
        {"64:ff9b::7f00:1", "loopback"}, {"64:ff9b::a9fe:a9fe", "link-local"}, {"64:ff9b::808:808", "public"},
        {"2002:7f00:1::1", "loopback"}, {"2002:c0a8:101::", "private"}, {"2002:808:808::1", "public"},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        const char *got = class_of(table[i].addr);
        CHECK(strcmp(got, table[i].want) == 0, "%s: %s, expected %s", table[i].addr, got, table[i].want);
    }
    struct sockaddr_un_like { sa_family_t family; char path[20]; } un = {AF_UNIX, "/tmp/x"};
    CHECK(fetch_addr_class((struct sockaddr *)&un, sizeof un) != NULL, "a unix socket address is not public");
    struct sockaddr_in short_in = {.sin_family = AF_INET};
    CHECK(fetch_addr_class((struct sockaddr *)&short_in, 4) != NULL, "a truncated address is not public");
}

static void test_allow(void)
{
    static char *allow[] = {"LocalHost", "127.0.0.1", "[::1]", "fd00::5"};
    srv.cfg.fetch_allow = allow;
    srv.cfg.n_fetch_allow = 4;
    static const struct { const char *host; int want; } table[] = {
        {"localhost", 1}, {"LOCALHOST", 1}, {"127.0.0.1", 1}, {"[::1]", 1}, {"::1", 1}, {"[fd00::5]", 1}, {"FD00::5", 1},
        {"127.0.0.2", 0}, {"localhost.", 0}, {"evil-localhost", 0}, {"localhost.example.com", 0}, {"127.0.0.1.nip.io", 0},
        {"[::2]", 0}, {"", 0}, {"[]", 0}, {"0x7f000001", 0},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        CHECK(fetch_host_allowed(table[i].host) == table[i].want, "host '%s': %d", table[i].host, !table[i].want);
    srv.cfg.n_fetch_allow = 0;
    CHECK(!fetch_host_allowed("localhost"), "nothing is allowed without --fetch-allow");
}

/* ---------------------------------------------------------------- live */

/* A loopback port that accepts connections, counts them and closes them at
 * once (no TLS), until stopped. */
typedef struct { int fd, port, accepted, stop; pthread_t th; } listener_t;

static void *accept_main(void *arg)
{
    listener_t *l = arg;
    while (!__atomic_load_n(&l->stop, __ATOMIC_RELAXED)) {
        int c = accept(l->fd, NULL, NULL);
        if (c >= 0) {
            __atomic_add_fetch(&l->accepted, 1, __ATOMIC_RELAXED);
            close(c);
        } else {
            usleep(10000);
        }
    }
    return NULL;
}

static int listener_start(listener_t *l)
{
    memset(l, 0, sizeof *l);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    l->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (l->fd < 0 || bind(l->fd, (struct sockaddr *)&a, sizeof a) || listen(l->fd, 8) ||
        getsockname(l->fd, (struct sockaddr *)&a, &n))
        return -1;
    l->port = ntohs(a.sin_port);
    return pthread_create(&l->th, NULL, accept_main, l);
}

static void listener_stop(listener_t *l)
{
    __atomic_store_n(&l->stop, 1, __ATOMIC_RELAXED);
    pthread_join(l->th, NULL);
    close(l->fd);
}

/* A loopback port where nothing listens (bound, then closed). */
static int closed_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &n);
    close(fd);
    return ntohs(a.sin_port);
}

static int fetch(const char *url, const char *path, char *err)
{
    int status = 0;
    err[0] = 0;
    int rc = fetch_url(url, path, 1 << 20, "--max-download", err, &status);
    return rc ? status : 0;
}

static void test_live(void)
{
    char dir[] = "/tmp/spanserve-test-fetch-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char path[256], url[128], err[512], generic[512];
    snprintf(path, sizeof path, "%s/download", dir);
    listener_t l;
    if (listener_start(&l)) {
        CHECK(0, "a loopback listener");
        return;
    }
    struct stat st;

    /* without --fetch-allow: refused before any connection, nothing written */
    srv.cfg.n_fetch_allow = 0;
    snprintf(url, sizeof url, "https://127.0.0.1:%d/m.safetensors", l.port);
    CHECK(fetch(url, path, generic) == 400, "loopback without --fetch-allow: 400 (%s)", generic);
    CHECK(strstr(generic, "cannot fetch the URL") && strstr(generic, "--fetch-allow"), "the message: %s", generic);
    CHECK(strstr(last_log, "127.0.0.1 is a loopback address") != NULL, "the log says why: %s", last_log);
    CHECK(stat(path, &st) != 0, "no file left behind");
    usleep(100000);
    CHECK(__atomic_load_n(&l.accepted, __ATOMIC_RELAXED) == 0, "nothing connected: %d", l.accepted);
    snprintf(url, sizeof url, "https://localhost:%d/m.safetensors", l.port);
    CHECK(fetch(url, path, err) == 400 && strcmp(err, generic) == 0, "a name of a loopback address: the same answer: %s", err);
    snprintf(url, sizeof url, "https://[::ffff:127.0.0.1]:%d/m.safetensors", l.port);
    CHECK(fetch(url, path, err) == 400 && strcmp(err, generic) == 0, "an IPv4-mapped loopback address: the same: %s", err);
    CHECK(fetch("https://169.254.0.1/latest/meta-data/", path, err) == 400 && strcmp(err, generic) == 0,
          "a link-local address (the cloud metadata kind): the same: %s", err);
    CHECK(strstr(last_log, "169.254.0.1 is a link-local address") != NULL, "the log: %s", last_log);
    CHECK(__atomic_load_n(&l.accepted, __ATOMIC_RELAXED) == 0, "still nothing connected: %d", l.accepted);

    /* with --fetch-allow 127.0.0.1: the port is reached; it speaks no TLS,
     * and a closed port answers the same */
    static char *allow[] = {"127.0.0.1"};
    srv.cfg.fetch_allow = allow;
    srv.cfg.n_fetch_allow = 1;
    snprintf(url, sizeof url, "https://127.0.0.1:%d/m.safetensors", l.port);
    CHECK(fetch(url, path, err) == 400 && strcmp(err, generic) == 0, "an open port without TLS: the same answer: %s", err);
    CHECK(__atomic_load_n(&l.accepted, __ATOMIC_RELAXED) >= 1, "allowed: connected (%d)", l.accepted);
    CHECK(strstr(last_log, "refused") == NULL, "the log names curl's error only: %s", last_log);
    snprintf(url, sizeof url, "https://127.0.0.1:%d/m.safetensors", closed_port());
    CHECK(fetch(url, path, err) == 400 && strcmp(err, generic) == 0, "a closed port: the same answer: %s", err);
    CHECK(strstr(last_log, "onnect") != NULL, "the log has curl's words: %s", last_log);
    snprintf(url, sizeof url, "https://localhost:%d/m.safetensors", l.port);
    CHECK(fetch(url, path, err) == 400 && strcmp(err, generic) == 0, "localhost is not 127.0.0.1: refused: %s", err);
    CHECK(stat(path, &st) != 0, "no file left behind");

    /* a file that exists is never written over */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    CHECK(fd >= 0 && write(fd, "keep", 4) == 4 && close(fd) == 0, "a file");
    snprintf(url, sizeof url, "https://127.0.0.1:%d/m.safetensors", l.port);
    CHECK(fetch(url, path, err) == 500 && strstr(err, dir) == NULL, "over an existing file: 500, no path shown: %s", err);
    char buf[16] = "";
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && read(fd, buf, sizeof buf) == 4 && memcmp(buf, "keep", 4) == 0, "the file is as it was");
    if (fd >= 0) close(fd);
    unlink(path);
    CHECK(fetch("http://127.0.0.1/x", path, err) == 400 && strstr(err, "https"), "http: %s", err);

    listener_stop(&l);
    rmdir(dir);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    test_classes();
    test_allow();
    test_live();
    curl_global_cleanup();
    return test_summary("test_fetch");
}
