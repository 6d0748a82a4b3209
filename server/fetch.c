/*
 * fetch.c - downloads a file (a checkpoint, a training text) over https with
 * libcurl into a new file, refusing anything past a size limit.
 */
#define _GNU_SOURCE
#include "server.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct { FILE *f; size_t got, max; int over; } sink_t;

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
    s->got += k;
    return fwrite(p, 1, k, s->f);
}

int fetch_url(const char *url, const char *path, size_t max, const char *limit, char *err, int *status)
{
    if (strncmp(url, "https://", 8) != 0) {
        *status = 400;
        return snprintf(err, 512, "url must be https://"), -1;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    sink_t s = {fd >= 0 ? fdopen(fd, "wb") : NULL, 0, max, 0};
    if (!s.f) {
        log_line("fetch: cannot create %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd), unlink(path);
        *status = 500;
        return snprintf(err, 512, "cannot create the file to download into: %s", strerror(errno)), -1;
    }
    CURL *c = curl_easy_init();
    char cerr[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, url);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, CURLPROTO_HTTPS);
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, CURLPROTO_HTTPS);
#endif
    if (srv.cfg.ca_file) curl_easy_setopt(c, CURLOPT_CAINFO, srv.cfg.ca_file);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 600L);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);   /* under 1 kB/s for 30 s: give up */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    /* on disk before the caller links it into place */
    int bad = fflush(s.f) != 0 || fsync(fileno(s.f)) != 0;
    bad |= fclose(s.f) != 0;
    if (s.over || rc == CURLE_FILESIZE_EXCEEDED) {
        unlink(path);
        *status = 413;
        return snprintf(err, 512, "the download is over %s (%zu bytes)", limit, max), -1;
    }
    if (rc != CURLE_OK || bad) {
        unlink(path);
        *status = 400;
        return snprintf(err, 512, "cannot fetch %s: %s", url, *cerr ? cerr : curl_easy_strerror(rc)), -1;
    }
    return 0;
}
