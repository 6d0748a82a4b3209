/*
 * route_ui.c - the dashboard: GET / (server/ui/index.html; on the jobs
 * listener server/ui/jobs.html), /ui.js and /ui.css, compiled into the binary (the Makefile embeds server/ui/ as C
 * strings), so that it works offline and with nothing to install. The page
 * speaks only the public API with the key its user enters, so these routes
 * are open: they hold no data, only the page. Every answer forbids what the
 * page does not need (Content-Security-Policy: scripts and styles from this
 * origin only, no inline script, no framing) and is not cached (no-store,
 * as every answer of the server), so a new binary's page is never mixed
 * with an old one's script.
 */
#include "server.h"

#include <string.h>

/* connect-src 'self': the API; img-src blob: the SVGs fetched with the key;
 * data: the empty favicon. */
#define UI_CSP "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; " \
               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

static enum MHD_Result reply_asset(request_t *r, const char *type, const char *data, size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    MHD_add_response_header(resp, "Content-Security-Policy", UI_CSP);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, "X-Frame-Options", "DENY");
    enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->status = 200;
    r->responded = 1;
    return rc;
}

enum MHD_Result route_ui_page(request_t *r)
{
    return reply_asset(r, "text/html; charset=utf-8", ui_index_html, strlen(ui_index_html));
}

enum MHD_Result route_ui_jobs_page(request_t *r)
{
    return reply_asset(r, "text/html; charset=utf-8", ui_jobs_html, strlen(ui_jobs_html));
}

enum MHD_Result route_ui_js(request_t *r)
{
    return reply_asset(r, "text/javascript; charset=utf-8", ui_ui_js, strlen(ui_ui_js));
}

enum MHD_Result route_ui_css(request_t *r)
{
    return reply_asset(r, "text/css; charset=utf-8", ui_ui_css, strlen(ui_ui_css));
}
