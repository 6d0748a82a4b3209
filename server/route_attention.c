/*
 * route_attention.c - POST /v1/attention: what a model attends to over a
 * short text. For each position, each attention layer and head, the weights
 * of the positions it saw (core/attention.h: recorded from the CPU forward,
 * after the span mask and the renormalisation), as JSON: the heaviest top_k
 * keys of each row, or, for one layer and head, the whole rows; or with
 * format svg that head's heat map (queries x keys).
 *
 * The work is a forward of the whole text on the CPU whatever device serves
 * the model (a GPU's host copy of the weights), so it runs on a thread of
 * its own with the connection suspended, never on an HTTP thread nor in the
 * scheduler: bounded by the text's length (ATTENTION_MAX_TOKENS and
 * --max-prompt), by the answer's size (ATTENTION_MAX_WEIGHTS), by the
 * computations at once (ATTENTION_MAX_RUNNING) and by --request-timeout,
 * and given up between blocks when the server drains. The model is held
 * (smodel_t.tasks) until the answer is built: DELETE /v1/models is 409 meanwhile.
 */
#define _GNU_SOURCE
#include "server.h"

#include "attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens of a text at most: every position is a query row of every head,
 * and the forward is the whole text's on the CPU (a score of 1024 tokens). */
#define ATTENTION_MAX_TOKENS 1024
/* Weights an answer lists at most: some 20 bytes of JSON each, so about 20 MB. */
#define ATTENTION_MAX_WEIGHTS (1 << 20)
/* Tokens a heat map draws at most: n(n+1)/2 cells, a few MB of SVG. */
#define ATTENTION_SVG_MAX_TOKENS 256
/* Computations at once, a thread each: more is 429. */
#define ATTENTION_MAX_RUNNING 2
/* Keys a row lists unless top_k says otherwise. */
#define ATTENTION_TOP_K 8
/* The heat map leaves cells lighter than this blank (white). */
#define SVG_MIN_WEIGHT 1e-3

static int running;   /* computations in flight (srv.lock) */

typedef struct {
    request_t *r;
    smodel_t *sm;                /* held (sm->tasks) while the job runs */
    attn_opts o;
    int svg;
    int32_t *toks;
    size_t *offs, n;
    double t0;
    int stopped;                 /* why the run stopped: 1 draining, 2 --request-timeout */
    /* the answer */
    char *body;
    size_t len;
    const char *type;
    int status;
    char err[512];
} attn_job;

static void job_free(attn_job *j)
{
    free(j->toks);
    free(j->offs);
    free(j->body);
    free(j);
}

static void job_free_ctx(void *ctx) { job_free(ctx); }

/* Lets the model and the slot go (srv.lock held). */
static void job_release_locked(attn_job *j)
{
    j->sm->tasks--;
    running--;
}

static int job_stop(void *ctx)
{
    attn_job *j = ctx;
    pthread_mutex_lock(&srv.lock);
    int draining = srv.draining;
    pthread_mutex_unlock(&srv.lock);
    if (draining) j->stopped = 1;
    else if (srv.cfg.request_timeout > 0 && now_s() - j->t0 > srv.cfg.request_timeout) j->stopped = 2;
    return j->stopped;
}

/* ------------------------------------------------------------ JSON */

/* S (LEN bytes) as a JSON string. */
static void put_str(FILE *f, const char *s, size_t len)
{
    json_t *v = json_stringn(s, len);
    char *q = v ? json_dumps(v, JSON_ENCODE_ANY) : NULL;
    fputs(q ? q : "\"\"", f);
    free(q);
    json_decref(v);
}

static void put_token_list(FILE *f, const attn_job *j, char *piece)
{
    const model_t *m = j->sm->m;
    fputs("\"tokens\":[", f);
    for (size_t i = 0; i < j->n; i++) {
        size_t len = vocab_piece(&m->vocab, i ? j->toks[i - 1] : -1, j->toks[i], piece);
        fprintf(f, "%s{\"id\":%d,\"text\":", i ? "," : "", j->toks[i]);
        put_str(f, piece, len);
        fprintf(f, ",\"offset\":%zu}", j->offs[i]);
    }
    fputs("]", f);
}

static void put_row(FILE *f, const attn_result *res, const attn_row *row, int pers)
{
    fprintf(f, "{\"query\":%lld,\"sum\":%.10g,\"before_start\":%.10g", (long long)row->query, row->sum,
            row->before_start);
    if (pers) fprintf(f, ",\"persistent\":%.10g", row->persistent);
    fputs(",\"keys\":[", f);
    for (int k = 0; k < row->n; k++) fprintf(f, "%s%lld", k ? "," : "", (long long)row->pos[k]);
    fputs("],\"weights\":[", f);
    for (int k = 0; k < row->n; k++) fprintf(f, "%s%.9g", k ? "," : "", (double)row->w[k]);
    fputs("]", f);
    if (row->pw) {
        fputs(",\"persistent_weights\":[", f);
        for (int k = 0; k < res->n_pers; k++) fprintf(f, "%s%.9g", k ? "," : "", (double)row->pw[k]);
        fputs("]", f);
    }
    fputs("}", f);
}

static void put_json(FILE *f, const attn_job *j, const attn_result *res, char *piece)
{
    const model_t *m = j->sm->m;
    fputs("{\"model\":", f);
    put_str(f, j->sm->name, strlen(j->sm->name));
    fputs(",\"family\":", f);
    put_str(f, model_family_name(m), strlen(model_family_name(m)));
    fputc(',', f);
    put_token_list(f, j, piece);
    fprintf(f, ",\"full\":%s", res->full ? "true" : "false");
    if (!res->full) fprintf(f, ",\"top_k\":%d", res->top_k);
    if (m->pers) fprintf(f, ",\"pers_mem_size\":%d", m->pers);
    fputs(",\"heads\":[", f);
    for (int i = 0; i < res->n_rows; i += res->n_tokens) {
        const attn_row *r0 = &res->rows[i];
        fprintf(f, "%s{\"layer\":%d,\"head\":%d,\"rows\":[", i ? "," : "", r0->layer, r0->head);
        for (int t = 0; t < res->n_tokens; t++) {
            if (t) fputc(',', f);
            put_row(f, res, &r0[t], m->pers > 0);
        }
        fputs("]}", f);
    }
    fputs("]}", f);
}

/* ------------------------------------------------------------ SVG */

/* LEN bytes of token text as SVG text: markup escaped, whitespace and
 * control characters (which XML cannot hold) shown as visible symbols. */
static void put_xml_text(FILE *f, const char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = utf8_decode((const unsigned char *)s + i, len - i, &cp);
        if (k == 0) { fputc('?', f); i++; continue; }
        if (cp == '\n') fputs("\xe2\x8f\x8e", f);            /* U+23CE return symbol */
        else if (cp == ' ') fputs("\xe2\x90\xa3", f);        /* U+2423 open box */
        else if (cp == '\t') fputs("\xe2\x87\xa5", f);       /* U+21E5 */
        else if (cp < 0x20 || cp == 0x7f || cp == 0xfffe || cp == 0xffff) fputc('?', f);
        else if (cp == '&') fputs("&amp;", f);
        else if (cp == '<') fputs("&lt;", f);
        else if (cp == '>') fputs("&gt;", f);
        else if (cp == '"') fputs("&quot;", f);
        else fwrite(s + i, 1, (size_t)k, f);
        i += (size_t)k;
    }
}

/* white -> deep blue as X goes 0 -> 1 (svg.c's scale) */
static void heat(double x, char *buf, size_t cap)
{
    x = x < 0 ? 0 : x > 1 ? 1 : x;
    int r = (int)(255 - x * 225), g = (int)(255 - x * 170), b = (int)(255 - x * 60);
    snprintf(buf, cap, "#%02x%02x%02x", r, g, b);
}

/* Token I's label: its text, cut to 12 characters. */
static void put_label(FILE *f, const attn_job *j, size_t i, char *piece)
{
    size_t len = vocab_piece(&j->sm->m->vocab, i ? j->toks[i - 1] : -1, j->toks[i], piece), cut = 0;
    for (int chars = 0; cut < len && chars < 12; chars++) {
        uint32_t cp;
        int k = utf8_decode((const unsigned char *)piece + cut, len - cut, &cp);
        cut += k ? (size_t)k : 1;
    }
    put_xml_text(f, piece, cut);
}

/* One cell of the map at column COL, row T: weight A, described by what. */
static void put_cell(FILE *f, int x0, int y0, int c, int col, int t, double a, const char *what, long long key)
{
    if (a < SVG_MIN_WEIGHT) return;
    char fill[8];
    heat(sqrt(a), fill, sizeof fill);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"><title>query %d, ", x0 + col * c,
            y0 + t * c, c, c, fill, t);
    if (key >= 0) fprintf(f, "key %lld", key);
    else fputs(what, f);
    fprintf(f, ": %.4f</title></rect>\n", a);
}

/* The head's heat map: a row per query, a column per position (and one
 * for the mass before the start, one for the persistent vectors, where the
 * model has them), the colour the square root of the weight. */
static void put_svg(FILE *f, const attn_job *j, const attn_result *res, char *piece)
{
    const int n = res->n_tokens, pers = j->sm->m->pers > 0;
    int pre = 0;
    for (int t = 0; t < n; t++) pre |= res->rows[t].before_start >= SVG_MIN_WEIGHT;
    const int cols = pre + n + pers, c = n <= 40 ? 18 : n <= 80 ? 10 : n <= 160 ? 5 : 3, labels = c >= 10;
    const int x0 = labels ? 110 : 40, y0 = labels ? 140 : 60, W = x0 + cols * c + 30, H = y0 + n * c + 50;
    const attn_row *r0 = res->rows;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"11\">\n", W, H);
    fprintf(f, "<title>Attention of %s (%s), layer %d head %d, over %d tokens</title>\n", j->sm->name,
            model_family_name(j->sm->m), r0->layer, r0->head, n);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">%s, layer %d head %d: a row per query, a column per "
               "position it saw</text>\n", 10, j->sm->name, r0->layer, r0->head);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", x0, y0,
            cols * c, n * c);
    if (labels) {
        for (int t = 0; t < n; t++) {   /* queries down the left, keys along the top */
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", x0 - 4, y0 + t * c + c - 3);
            put_label(f, j, (size_t)t, piece);
            fprintf(f, "</text>\n<text transform=\"translate(%d,%d) rotate(-90)\">", x0 + (pre + t) * c + c - 4, y0 - 4);
            put_label(f, j, (size_t)t, piece);
            fputs("</text>\n", f);
        }
        if (pre) fprintf(f, "<text transform=\"translate(%d,%d) rotate(-90)\">before start</text>\n", x0 + c - 4, y0 - 4);
        if (pers)
            fprintf(f, "<text transform=\"translate(%d,%d) rotate(-90)\">persistent</text>\n", x0 + (cols - 1) * c + c - 4,
                    y0 - 4);
    }
    for (int t = 0; t < n; t++) {
        const attn_row *row = &r0[t];
        if (pre) put_cell(f, x0, y0, c, 0, t, row->before_start, "before the start", -1);
        for (int k = 0; k < row->n; k++)
            put_cell(f, x0, y0, c, pre + (int)row->pos[k], t, row->w[k], "", (long long)row->pos[k]);
        if (pers) put_cell(f, x0, y0, c, cols - 1, t, row->persistent, "the persistent vectors", -1);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\">colour: the square root of the weight (white below %g)</text>\n", x0,
            y0 + n * c + 30, SVG_MIN_WEIGHT);
    fputs("</svg>\n", f);
}

/* ------------------------------------------------------------ the job */

static enum MHD_Result attention_done(request_t *r)
{
    attn_job *j = r->resume_ctx;
    r->on_resume = NULL;
    r->resume_ctx = NULL;
    enum MHD_Result rc = j->body ? reply_bytes(r, 200, j->type, j->body, j->len) : reply_error(r, j->status, "%s", j->err);
    job_free(j);
    return rc;
}

static void *attention_main(void *arg)
{
    attn_job *j = arg;
    const model_t *m = j->sm->m;
    attn_result res;
    char e2[ERR_LEN];
    if (attention_run(m, j->toks, (int)j->n, &j->o, job_stop, j, &res, e2)) {
        j->status = j->stopped ? 503 : strstr(e2, "out of memory") ? 503 : 500;
        snprintf(j->err, sizeof j->err, "%s",
                 j->stopped == 1 ? "the server is shutting down"
                 : j->stopped == 2 ? "the request ran past --request-timeout" : e2);
        if (j->status == 500) log_line("attention: %s", e2);
    } else {
        char *piece = malloc(vocab_max_piece(&m->vocab) + 1);
        FILE *f = piece ? open_memstream(&j->body, &j->len) : NULL;
        if (f) {
            if (j->svg) put_svg(f, j, &res, piece);
            else put_json(f, j, &res, piece);
            if (fclose(f) != 0) {
                free(j->body);
                j->body = NULL;
            }
        }
        free(piece);
        j->type = j->svg ? "image/svg+xml" : "application/json";
        if (!j->body) j->status = 503, snprintf(j->err, sizeof j->err, "out of memory for the answer");
        attention_free(&res);
    }
    pthread_mutex_lock(&srv.lock);
    job_release_locked(j);
    j->r->on_resume = attention_done;
    j->r->resume_free = job_free_ctx;
    MHD_resume_connection(j->r->conn);
    pthread_mutex_unlock(&srv.lock);
    return NULL;
}

/* ------------------------------------------------------------ the route */

/* The request's fields into J; 0, or an HTTP status with ERR. */
static int parse(request_t *r, json_t *b, attn_job *j, const char **model, const char **text, char *err)
{
    const char *format, *qformat = query_arg(r, "format");
    long long layer, head, top_k;
    if (field_str(b, "model", model, err) || field_str(b, "text", text, err) || field_str(b, "format", &format, err) ||
        field_int(b, "layer", 0, MODEL_MAX_LAYERS - 1, -1, &layer, err) ||
        field_int(b, "head", 0, MODEL_MAX_HEADS - 1, -1, &head, err) ||
        field_int(b, "top_k", 1, ATTN_MAX_TOP_K, ATTENTION_TOP_K, &top_k, err))
        return 400;
    if (!*model) return snprintf(err, 512, "model is required"), 400;
    if (!*text) return snprintf(err, 512, "text is required"), 400;
    if (!**text) return snprintf(err, 512, "text must not be empty"), 400;
    if (format && qformat && strcmp(format, qformat) != 0)
        return snprintf(err, 512, "format is given twice, as %.16s and %.16s", format, qformat), 400;
    if (!format) format = qformat;
    if (format && strcmp(format, "json") != 0 && strcmp(format, "svg") != 0)
        return snprintf(err, 512, "format must be json or svg"), 400;
    j->svg = format && strcmp(format, "svg") == 0;
    if (j->svg && (layer < 0 || head < 0))
        return snprintf(err, 512, "format svg draws one head's heat map: give layer and head"), 400;
    j->o = (attn_opts){(int)layer, (int)head, (int)top_k};
    return 0;
}

/* The text under the limits, for J's model (held). 0, or an HTTP status with ERR. */
static int prepare(attn_job *j, const char *text, char *err)
{
    const model_t *m = j->sm->m;
    char e2[ERR_LEN];
    if (attention_check(m, &j->o, e2)) return snprintf(err, 512, "%s", e2), 400;
    if (vocab_encode_offsets(&m->vocab, text, strlen(text), 0, &j->toks, &j->offs, &j->n, e2))
        return snprintf(err, 512, "%s", e2), 422;
    if (j->n == 0) return snprintf(err, 512, "the text has no tokens"), 400;
    const size_t limit = srv.cfg.max_prompt < ATTENTION_MAX_TOKENS ? (size_t)srv.cfg.max_prompt : ATTENTION_MAX_TOKENS;
    if (j->n > limit)
        return snprintf(err, 512, "%zu tokens is over the limit of %zu (/v1/attention reads at most %d, and "
                        "--max-prompt)", j->n, limit, ATTENTION_MAX_TOKENS), 413;
    if (j->svg && j->n > ATTENTION_SVG_MAX_TOKENS)
        return snprintf(err, 512, "%zu tokens is over the limit of %d a heat map draws (format svg)", j->n,
                        ATTENTION_SVG_MAX_TOKENS), 413;
    const size_t w = attention_weights_max(m, (int)j->n, &j->o);
    if (w > ATTENTION_MAX_WEIGHTS)
        return snprintf(err, 512, "the answer would list up to %zu weights, over the limit of %d: ask for one layer "
                        "or head, a smaller top_k or a shorter text", w, ATTENTION_MAX_WEIGHTS), 413;
    return 0;
}

enum MHD_Result route_attention(request_t *r)
{
    json_t *b = body_json(r);
    if (!b) return MHD_YES;
    attn_job *j = calloc(1, sizeof *j);
    if (!j) {
        json_decref(b);
        return reply_error(r, 503, "out of memory");
    }
    j->r = r;
    j->t0 = now_s();
    char err[512];
    const char *model = NULL, *text = NULL;
    int status = parse(r, b, j, &model, &text, err);
    if (!status) {
        pthread_mutex_lock(&srv.lock);
        if (srv.draining) status = 503, snprintf(err, sizeof err, "the server is shutting down");
        else if (!(j->sm = models_find(model))) status = 404, snprintf(err, sizeof err, "no model '%.64s'", model);
        else if (running >= ATTENTION_MAX_RUNNING)
            status = 429, snprintf(err, sizeof err, "%d attention requests are running already; retry later",
                                   ATTENTION_MAX_RUNNING);
        else j->sm->tasks++, running++;
        pthread_mutex_unlock(&srv.lock);
        if (!status && (status = prepare(j, text, err))) {
            pthread_mutex_lock(&srv.lock);
            job_release_locked(j);
            pthread_mutex_unlock(&srv.lock);
        }
    }
    json_decref(b);   /* model and text are not read past here */
    if (status) {
        job_free(j);
        return reply_error(r, status, "%s", err);
    }
    pthread_mutex_lock(&srv.lock);   /* the thread resumes the connection under it: suspended first */
    if (http_wait_thread(r, attention_main, j)) {
        job_release_locked(j);
        pthread_mutex_unlock(&srv.lock);
        job_free(j);
        return reply_error(r, 503, "cannot start the computation");
    }
    pthread_mutex_unlock(&srv.lock);
    return MHD_YES;
}
