/*
 * metrics.c - Prometheus metrics: requests by route and status, request
 * latency and time to first token histograms, tokens generated and scored,
 * queue depth, sessions and their memory.
 */
#define _GNU_SOURCE
#include "server.h"
#include "jobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t mlock = PTHREAD_MUTEX_INITIALIZER;

#define N_BUCKETS 12
static const double buckets[N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};

typedef struct {
    unsigned long counts[N_BUCKETS + 1];
    double sum;
} hist_t;

typedef struct { const char *route; int status; unsigned long n; } req_count;

static req_count reqs[256];
static int n_reqs;
static struct { const char *route; hist_t h; } lat[64];   /* the routes of both listeners */
static int n_lat;
static hist_t ttft;
static unsigned long tok_gen, tok_scored;

static void hist_add(hist_t *h, double v)
{
    int i = 0;
    while (i < N_BUCKETS && v > buckets[i]) i++;
    h->counts[i]++;
    h->sum += v;
}

void metrics_request(const char *route, int status, double seconds)
{
    pthread_mutex_lock(&mlock);
    int i = 0;
    while (i < n_reqs && !(reqs[i].route == route && reqs[i].status == status)) i++;
    if (i == n_reqs && n_reqs < 256) reqs[n_reqs++] = (req_count){route, status, 0};
    if (i < n_reqs) reqs[i].n++;
    int j = 0;
    while (j < n_lat && lat[j].route != route) j++;
    if (j == n_lat && n_lat < 64) lat[n_lat++].route = route;
    if (j < n_lat) hist_add(&lat[j].h, seconds);
    pthread_mutex_unlock(&mlock);
}

void metrics_ttft(double seconds)
{
    pthread_mutex_lock(&mlock);
    hist_add(&ttft, seconds);
    pthread_mutex_unlock(&mlock);
}

void metrics_tokens(long generated, long scored)
{
    pthread_mutex_lock(&mlock);
    tok_gen += (unsigned long)generated;
    tok_scored += (unsigned long)scored;
    pthread_mutex_unlock(&mlock);
}

static void hist_render(FILE *f, const char *name, const char *label, const hist_t *h)
{
    unsigned long cum = 0;
    for (int i = 0; i <= N_BUCKETS; i++) {
        cum += h->counts[i];
        if (i < N_BUCKETS) fprintf(f, "%s_bucket{%s%sle=\"%g\"} %lu\n", name, label, *label ? "," : "", buckets[i], cum);
        else fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %lu\n", name, label, *label ? "," : "", cum);
    }
    fprintf(f, "%s_sum{%s} %.6f\n%s_count{%s} %lu\n", name, label, h->sum, name, label, cum);
}

char *metrics_render(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    pthread_mutex_lock(&srv.lock);
    int queued = srv.queued + srv.running, live = sess_count(0), disk = sess_count(1);
    size_t bytes = sess_live_bytes();
    pthread_mutex_unlock(&srv.lock);
    pthread_mutex_lock(&mlock);
    fprintf(f, "# HELP spanserve_requests_total HTTP requests by route and status.\n# TYPE spanserve_requests_total counter\n");
    for (int i = 0; i < n_reqs; i++)
        fprintf(f, "spanserve_requests_total{route=\"%s\",status=\"%d\"} %lu\n", reqs[i].route, reqs[i].status, reqs[i].n);
    fprintf(f, "# HELP spanserve_request_seconds Request latency by route.\n# TYPE spanserve_request_seconds histogram\n");
    for (int j = 0; j < n_lat; j++) {
        char label[96];
        snprintf(label, sizeof label, "route=\"%s\"", lat[j].route);
        hist_render(f, "spanserve_request_seconds", label, &lat[j].h);
    }
    fprintf(f, "# HELP spanserve_time_to_first_token_seconds From queueing to the first generated token.\n"
               "# TYPE spanserve_time_to_first_token_seconds histogram\n");
    hist_render(f, "spanserve_time_to_first_token_seconds", "", &ttft);
    fprintf(f, "# HELP spanserve_tokens_generated_total Tokens generated.\n# TYPE spanserve_tokens_generated_total counter\n"
               "spanserve_tokens_generated_total %lu\n", tok_gen);
    fprintf(f, "# HELP spanserve_tokens_scored_total Predictions scored.\n# TYPE spanserve_tokens_scored_total counter\n"
               "spanserve_tokens_scored_total %lu\n", tok_scored);
    pthread_mutex_unlock(&mlock);
    fprintf(f, "# HELP spanserve_queue_depth Requests queued or running (what --max-queue bounds).\n# TYPE spanserve_queue_depth gauge\n"
               "spanserve_queue_depth %d\n", queued);
    fprintf(f, "# HELP spanserve_sessions Sessions by where their memory is.\n# TYPE spanserve_sessions gauge\n"
               "spanserve_sessions{state=\"live\"} %d\nspanserve_sessions{state=\"disk\"} %d\n", live, disk);
    fprintf(f, "# HELP spanserve_session_memory_bytes Memory held by live sessions.\n# TYPE spanserve_session_memory_bytes gauge\n"
               "spanserve_session_memory_bytes %zu\n", bytes);
    fprintf(f, "# HELP spanserve_slow_connections_closed_total Connections closed because a request's headers did "
               "not arrive within --header-timeout.\n# TYPE spanserve_slow_connections_closed_total counter\n"
               "spanserve_slow_connections_closed_total %lu\n", http_slow_connections_closed());
    sess_metrics(f);
    jobs_metrics(f);
    fclose(f);
    return buf;
}
