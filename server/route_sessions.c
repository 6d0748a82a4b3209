/*
 * route_sessions.c - /v1/sessions: create, list, describe, delete, and the
 * memory exported as a binary file and imported again (on this replica or
 * another one serving the same model).
 */
#include "server.h"

#include <stdlib.h>
#include <string.h>

enum MHD_Result route_sessions_post(request_t *r)
{
    json_t *b = body_json(r);
    if (!b) return MHD_YES;
    char err[512];
    const char *model, *id;
    int status = 400;
    if (field_str(b, "model", &model, err) || field_str(b, "id", &id, err)) goto bad;
    if (!model) { snprintf(err, sizeof err, "model is required"); goto bad; }
    pthread_mutex_lock(&srv.lock);
    smodel_t *sm = models_find(model);
    session_t *s = sm ? sess_create(sm, id, err, &status) : NULL;
    json_t *j = s ? sess_json(s) : NULL;
    pthread_mutex_unlock(&srv.lock);
    if (!sm) { status = 404; snprintf(err, sizeof err, "no model '%.64s'", model); goto bad; }
    json_decref(b);
    if (!s) return reply_error(r, status, "%s", err);
    return reply_json(r, 201, j);
bad:
    json_decref(b);
    return reply_error(r, status, "%s", err);
}

enum MHD_Result route_sessions_list(request_t *r)
{
    pthread_mutex_lock(&srv.lock);
    json_t *j = sess_list_json();
    pthread_mutex_unlock(&srv.lock);
    return reply_json(r, 200, j);
}

enum MHD_Result route_sessions_get(request_t *r)
{
    pthread_mutex_lock(&srv.lock);
    session_t *s = sess_find(r->seg[2]);
    json_t *j = s ? sess_json(s) : NULL;
    pthread_mutex_unlock(&srv.lock);
    if (!s) return reply_error(r, 404, "no session '%.64s'", r->seg[2]);
    return reply_json(r, 200, j);
}

enum MHD_Result route_sessions_delete(request_t *r)
{
    char err[512];
    int status;
    pthread_mutex_lock(&srv.lock);
    int rc = sess_delete(r->seg[2], err, &status);
    pthread_mutex_unlock(&srv.lock);
    if (rc) return reply_error(r, status, "%s", err);
    return reply_json(r, 200, json_pack("{s:s}", "deleted", r->seg[2]));
}

enum MHD_Result route_sessions_state_get(request_t *r)
{
    char err[512];
    int status = 404;
    void *buf = NULL;
    size_t n = 0;
    pthread_mutex_lock(&srv.lock);
    session_t *s = sess_find(r->seg[2]);
    if (!s) snprintf(err, sizeof err, "no session '%.64s'", r->seg[2]);
    else if (sess_acquire(s, err, &status) == 0) {
        n = mem_serial_size(s->mem);
        buf = malloc(n);
        if (buf) mem_serialize(s->mem, buf, n);
        else status = 500, snprintf(err, sizeof err, "out of memory");
        sess_release(s);
    }
    pthread_mutex_unlock(&srv.lock);
    if (!buf) return reply_error(r, status, "%s", err);
    enum MHD_Result rc = reply_bytes(r, 200, "application/octet-stream", buf, n);
    free(buf);
    return rc;
}

enum MHD_Result route_sessions_state_put(request_t *r)
{
    char err[512], e2[ERR_LEN];
    int status = 400, created = 0;
    const char *model = query_arg(r, "model");
    pthread_mutex_lock(&srv.lock);
    session_t *s = sess_find(r->seg[2]);
    if (!s) {
        smodel_t *sm = model ? models_find(model) : NULL;
        if (!model) { status = 404; snprintf(err, sizeof err, "no session '%.64s' (give ?model=NAME to create it)", r->seg[2]); }
        else if (!sm) { status = 404; snprintf(err, sizeof err, "no model '%.64s'", model); }
        else if ((s = sess_create(sm, r->seg[2], err, &status))) created = 1;
    } else if (model && strcmp(model, s->model->name) != 0) {
        status = 409;
        snprintf(err, sizeof err, "session '%s' belongs to model '%s', not '%.64s'", s->id, s->model->name, model);
        s = NULL;
    }
    json_t *j = NULL;
    if (s && sess_acquire(s, err, &status) == 0) {
        /* into a scratch memory first: a bad file leaves the session as it was */
        mem_t *tmp = mem_new(s->model->m);
        if (!tmp) status = 500, snprintf(err, sizeof err, "out of memory");
        else if (mem_deserialize(tmp, r->body ? r->body : "", r->len, e2)) {
            status = strstr(e2, "another model") ? 409 : 400;
            snprintf(err, sizeof err, "%s", e2);
        } else if (mem_copy(s->mem, tmp)) {
            status = 500;
            snprintf(err, sizeof err, "the state could not be put on the model's device");
        } else {
            sess_commit_bytes(s, r->body, r->len);
            j = sess_json(s);
        }
        mem_free(tmp);
        sess_release(s);
        if (!j && created) sess_delete(s->id, e2, &created);
    } else if (s && created) {
        sess_delete(s->id, e2, &created);
    }
    pthread_mutex_unlock(&srv.lock);
    if (!j) return reply_error(r, status, "%s", err);
    return reply_json(r, 200, j);
}
