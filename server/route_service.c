/*
 * route_service.c - the service routes: liveness, readiness, metrics and the
 * OpenAPI document.
 */
#include "server.h"

#include <stdlib.h>
#include <string.h>

enum MHD_Result route_healthz(request_t *r)
{
    return reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
}

enum MHD_Result route_readyz(request_t *r)
{
    pthread_mutex_lock(&srv.lock);
    int ready = srv.ready && !srv.draining, draining = srv.draining;
    char state[300];
    snprintf(state, sizeof state, "%s", sess_state_error());
    pthread_mutex_unlock(&srv.lock);
    if (!ready) return reply_error(r, 503, "%s", draining ? "draining: the server is shutting down" : "loading models");
    json_t *j = json_pack("{s:s}", "status", "ready");
    /* still ready: its sessions are served from memory, and a router that
     * hashes sessions to replicas must keep sending them here */
    if (*state)
        json_object_set_new(j, "warning", json_sprintf("session states cannot be written to the state directory "
                                                       "(%s): new sessions are refused (507)", state));
    return reply_json(r, 200, j);
}

enum MHD_Result route_metrics(request_t *r)
{
    char *m = metrics_render();
    if (!m) return reply_error(r, 500, "out of memory");
    enum MHD_Result rc = reply_bytes(r, 200, "text/plain; version=0.0.4", m, strlen(m));
    free(m);
    return rc;
}

enum MHD_Result route_openapi(request_t *r)
{
    return reply_bytes(r, 200, "application/json", openapi_json, strlen(openapi_json));
}
