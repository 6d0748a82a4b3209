/*
 * train_loop.c - `spanserve train`'s loop: the text, its character
 * vocabulary and split, the batches, the steps, evaluation, progress lines,
 * checkpoints and the exact state for --resume.
 *
 * Data, as the reference recipes read it: the vocabulary is the sorted set
 * of the characters of the whole text; the last val_fraction of the
 * characters is the validation text; the training text is split into
 * batch_size parallel streams (equal lengths, the remainder dropped), and
 * each step reads the next block of M tokens of every stream (and the token
 * after each as its target), the memory carried. When a stream has fewer
 * than M tokens left past the next block, every stream starts over at 0 and
 * the memories are reset to zeros.
 *
 * Evaluation scores the validation text split the same way into batch_size
 * streams, consecutive blocks from a zero memory, up to eval_tokens
 * predictions (0: all). During a PAR search it mixes the blocks by
 * softmax(alpha / tau), without noise.
 *
 * State sidecar (OUT.state, a safetensors file): the weights, the optimizer
 * moments and the memories in float64, and in its metadata the step, the
 * data position, the random generator, the search's state and history, the
 * loss accumulated since the last progress line, the config and a hash of
 * the text. A resumed run continues with the same numbers as one that never
 * stopped.
 *
 * With a train_device (--device cuda), the steps and evaluation run there;
 * the weights, moments and memories come back to the host trainer before
 * each checkpoint and state file, which are the CPU's formats.
 */
#define _POSIX_C_SOURCE 200809L
#include "err.h"
#include "st.h"
#include "train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LN2 0.69314718055994530942

void train_state_path(const char *out, char *buf, size_t cap) { snprintf(buf, cap, "%s.state", out); }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t fnv1a(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
    return h;
}

/* ------------------------------------------------------------------ text */

typedef struct {
    int32_t *tok;        /* every character's id */
    size_t n, split;     /* characters; the first of the validation text */
    uint32_t *cps;       /* the vocabulary: sorted code points */
    int V;
    char *vocab_json;
    uint64_t hash;
} text_t;

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void text_free(text_t *x)
{
    free(x->tok);
    free(x->cps);
    free(x->vocab_json);
}

static int text_load(text_t *x, const train_cfg *c, char *err)
{
    memset(x, 0, sizeof *x);
    FILE *f = fopen(c->data, "rb");
    if (!f) return err_set(err, "data '%s': %s", c->data, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        size_t k = fread(buf + len, 1, cap - len, f);
        len += k;
        if (k == 0) break;
        if (len == cap) {
            unsigned char *b = realloc(buf, cap *= 2);
            if (!b) { free(buf); buf = NULL; }
            else buf = b;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) { free(buf); return err_set(err, "data '%s': %s", c->data, bad ? "read error" : "out of memory"); }
    x->hash = fnv1a(buf, len);
    uint32_t *cp = malloc((len ? len : 1) * sizeof *cp);
    int rc = -1;
    if (!cp) { err_set(err, "out of memory"); goto out; }
    for (size_t at = 0; at < len;) {
        int k = utf8_decode(buf + at, len - at, &cp[x->n]);
        if (!k) { err_set(err, "data '%s': invalid UTF-8 at byte %zu", c->data, at); goto out; }
        at += (size_t)k;
        x->n++;
    }
    x->cps = malloc((x->n ? x->n : 1) * sizeof *x->cps);
    x->tok = malloc((x->n ? x->n : 1) * sizeof *x->tok);
    if (!x->cps || !x->tok) { err_set(err, "out of memory"); goto out; }
    memcpy(x->cps, cp, x->n * sizeof *cp);
    qsort(x->cps, x->n, sizeof *x->cps, cmp_u32);
    size_t V = 0;
    for (size_t i = 0; i < x->n; i++)
        if (V == 0 || x->cps[i] != x->cps[V - 1]) x->cps[V++] = x->cps[i];
    if (V < 2) { err_set(err, "data '%s': the text has %zu distinct characters: nothing to learn", c->data, V); goto out; }
    if (V > MODEL_MAX_VOCAB) { err_set(err, "data '%s': %zu distinct characters, over %d", c->data, V, MODEL_MAX_VOCAB); goto out; }
    x->V = (int)V;
    for (size_t i = 0; i < x->n; i++)
        x->tok[i] = (int32_t)((uint32_t *)bsearch(&cp[i], x->cps, V, sizeof *x->cps, cmp_u32) - x->cps);
    json_t *a = json_array();
    for (size_t i = 0; i < V; i++) {
        char s[5] = {0};
        uint32_t u = x->cps[i];
        if (u < 0x80) s[0] = (char)u;
        else if (u < 0x800) { s[0] = (char)(0xC0 | u >> 6); s[1] = (char)(0x80 | (u & 0x3F)); }
        else if (u < 0x10000) { s[0] = (char)(0xE0 | u >> 12); s[1] = (char)(0x80 | ((u >> 6) & 0x3F)); s[2] = (char)(0x80 | (u & 0x3F)); }
        else { s[0] = (char)(0xF0 | u >> 18); s[1] = (char)(0x80 | ((u >> 12) & 0x3F)); s[2] = (char)(0x80 | ((u >> 6) & 0x3F)); s[3] = (char)(0x80 | (u & 0x3F)); }
        json_array_append_new(a, json_stringn(s, strlen(s) ? strlen(s) : 1));
    }
    x->vocab_json = json_dumps(a, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(a);
    if (!x->vocab_json) { err_set(err, "out of memory"); goto out; }
    /* text[int((1 - val_fraction) * len):] is the validation text */
    x->split = (size_t)((1.0 - c->val_fraction) * (double)x->n);
    rc = 0;
out:
    free(cp);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------ run */

typedef struct {
    const train_cfg *c;
    trainer *t;
    text_t text;
    FILE *log;
    size_t nb, nbv;      /* tokens per training / validation stream */
    long pos;            /* position in the training streams */
    train_rng rng;       /* the family's noise (PAR: Gumbel) */
    double loss_sum, aux_sum;
    long loss_n;
    json_t *history;     /* the family's search: a row per progress line of it (PAR: [step, tau, softmax(alpha)...]) */
    double *mem_keep;    /* the training memories while evaluating */
    int *mlen_keep;
    int32_t *x, *y;
    const train_device *dev;   /* NULL: the CPU */
    void *dev_ctx;
} run_t;

/* ------------------------------------------------------------------ device */

static double run_forward(run_t *r, int backward, double *aux, char *err)
{
    if (!r->dev) return trainer_forward(r->t, r->x, r->y, backward, 1, aux, err);
    return r->dev->forward(r->dev_ctx, r->t, r->x, r->y, backward, 1, aux, err);
}

static int run_reset_memory(run_t *r, char *err)
{
    if (r->dev) return r->dev->reset_memory(r->dev_ctx, err);
    trainer_reset_memory(r->t);
    return 0;
}

/* Block at POS of every stream of a split (S0: its first token, NS: tokens per stream). */
static void fill_block(run_t *r, size_t s0, size_t ns, long pos)
{
    const int B = r->t->B, M = r->t->M;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < M; i++) {
            size_t at = s0 + (size_t)b * ns + (size_t)pos + (size_t)i;
            r->x[b * M + i] = r->text.tok[at];
            r->y[b * M + i] = r->text.tok[at + 1];
        }
}

static double evaluate(run_t *r, char *err)
{
    trainer *t = r->t;
    const int B = t->B, M = t->M;
    long blocks = (long)((r->nbv - 1) / (size_t)M);
    if (r->c->eval_tokens > 0) {
        long want = (r->c->eval_tokens + (long)B * M - 1) / ((long)B * M);
        blocks = want < blocks ? want : blocks;
    }
    size_t nm = trainer_mem_floats(t);
    if (r->dev) {
        if (r->dev->stash_memory(r->dev_ctx, 0, err) || r->dev->reset_memory(r->dev_ctx, err)) return NAN;
    } else {
        memcpy(r->mem_keep, t->mem, nm * sizeof *t->mem);
        memcpy(r->mlen_keep, t->mlen, (size_t)t->L * sizeof *t->mlen);
        trainer_reset_memory(t);
    }
    if (t->c.fam->eval_begin) t->c.fam->eval_begin(t);
    t->drop = 0;   /* evaluation sees the whole model */
    double sum = 0;
    for (long k = 0; k < blocks; k++) {
        fill_block(r, r->text.split, r->nbv, k * M);
        double aux, nll = run_forward(r, 0, &aux, err);
        if (!isfinite(nll)) { sum = NAN; break; }
        sum += nll * B * M;
    }
    t->drop = 1;
    if (r->dev) {
        if (r->dev->stash_memory(r->dev_ctx, 1, err)) return NAN;
    } else {
        memcpy(t->mem, r->mem_keep, nm * sizeof *t->mem);
        memcpy(t->mlen, r->mlen_keep, (size_t)t->L * sizeof *t->mlen);
    }
    return sum / ((double)blocks * B * M) / LN2;
}

static void emit(run_t *r, json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    if (s) {
        fprintf(r->log, "%s\n", s);
        fflush(r->log);
    }
    free(s);
    json_decref(o);
}

/* ------------------------------------------------------------------ state */

static char *fmt_hex(char *buf, double x)
{
    snprintf(buf, 48, "%a", x);
    return buf;
}

static int save_state(run_t *r, char *err)
{
    trainer *t = r->t;
    char path[TRAIN_PATH_LEN + 16], b[64];
    train_state_path(r->c->out, path, sizeof path);
    st_writer *w = st_writer_new();
    char *cfg = train_cfg_json(r->c), *hist = json_dumps(r->history, JSON_COMPACT | JSON_REAL_PRECISION(17));
    int32_t *ints = malloc((size_t)2 * t->L * sizeof *ints);
    int rc = -1;
    if (!w || !cfg || !hist || !ints) { err_set(err, "out of memory"); goto out; }
    for (int l = 0; l < t->L; l++) {
        ints[l] = t->mlen[l];
        ints[t->L + l] = (int32_t)t->arch[l];
    }
    int64_t n[1] = {(int64_t)t->n}, nm[1] = {(int64_t)trainer_mem_floats(t)}, nl[1] = {2 * t->L};
    st_writer_add(w, "weights", ST_F64, 1, n, t->w);
    st_writer_add(w, "moment1", ST_F64, 1, n, t->m1);
    st_writer_add(w, "moment2", ST_F64, 1, n, t->m2);
    st_writer_add(w, "memory", ST_F64, 1, nm, t->mem);
    st_writer_add(w, "mlen_arch", ST_I32, 1, nl, ints);
    st_writer_meta(w, "format", "spanserve-train-state 1");
    st_writer_meta(w, "config", cfg);
    st_writer_meta(w, "vocab", r->text.vocab_json);
    st_writer_meta(w, "arch_history", hist);
    snprintf(b, sizeof b, "%016llx", (unsigned long long)r->text.hash);
    st_writer_meta(w, "text_hash", b);
    snprintf(b, sizeof b, "%ld", t->step);
    st_writer_meta(w, "step", b);
    snprintf(b, sizeof b, "%ld", r->pos);
    st_writer_meta(w, "pos", b);
    snprintf(b, sizeof b, "%016llx", (unsigned long long)r->rng.s);
    st_writer_meta(w, "rng", b);
    snprintf(b, sizeof b, "%d", t->searching);
    st_writer_meta(w, "searching", b);
    st_writer_meta(w, "tau", fmt_hex(b, t->tau));
    st_writer_meta(w, "loss_sum", fmt_hex(b, r->loss_sum));
    st_writer_meta(w, "aux_sum", fmt_hex(b, r->aux_sum));
    snprintf(b, sizeof b, "%ld", r->loss_n);
    st_writer_meta(w, "loss_n", b);
    rc = st_writer_save(w, path, err);
out:
    free(cfg);
    free(hist);
    free(ints);
    st_writer_free(w);
    return rc;
}

/* Keys that a resumed run may change: they do not enter the numbers. */
static int may_change(const char *k)
{
    static const char *ok[] = {"steps", "log", "log_every", "eval_every", "eval_tokens", "checkpoint_every", "device", "data",
                               "tf32", "gpus", "precision"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (strcmp(k, ok[i]) == 0) return 1;
    return 0;
}

static int meta_long(st_file *f, const char *key, long *out, const char *path, char *err)
{
    const char *s = st_meta(f, key);
    char *end;
    if (!s) return err_set(err, "%s: the state has no '%s'", path, key);
    errno = 0;
    *out = strtol(s, &end, 10);
    if (errno || end == s || *end) return err_set(err, "%s: the state's '%s' is not an integer", path, key);
    return 0;
}

static int meta_double(st_file *f, const char *key, double *out, const char *path, char *err)
{
    const char *s = st_meta(f, key);
    char *end;
    if (!s) return err_set(err, "%s: the state has no '%s'", path, key);
    *out = strtod(s, &end);
    if (end == s || *end) return err_set(err, "%s: the state's '%s' is not a number", path, key);
    return 0;
}

static int load_tensor(st_file *f, const char *name, st_dtype dt, void *dst, size_t n, const char *path, char *err)
{
    const st_tensor *x = st_find(f, name);
    if (!x || x->dtype != dt || (size_t)st_numel(x) != n)
        return err_set(err, "%s: tensor '%s' is missing or not %zu values of %s: the state is of another model", path,
                       name, n, st_dtype_name(dt));
    memcpy(dst, x->data, n * st_dtype_size(dt));
    return 0;
}

/* An arena of T's layout into DST; a state written before the tensors
 * were aligned (TRAIN_ALIGN) holds them back to back, in the same order:
 * read that too. */
static int load_arena(st_file *f, const char *name, const trainer *t, double *dst, const char *path, char *err)
{
    const st_tensor *x = st_find(f, name);
    const size_t packed = trainer_n_params(t);
    if (x && x->dtype == ST_F64 && (size_t)st_numel(x) == packed && packed != t->n) {
        const double *src = (const double *)x->data;
        for (int i = 0; i < t->n_tp; i++) {
            memcpy(dst + t->tp[i].off, src, t->tp[i].n * sizeof *dst);
            src += t->tp[i].n;
        }
        return 0;
    }
    return load_tensor(f, name, ST_F64, dst, t->n, path, err);
}

static int load_state(run_t *r, char *err)
{
    trainer *t = r->t;
    char path[TRAIN_PATH_LEN + 16];
    train_state_path(r->c->out, path, sizeof path);
    st_file *f = st_open(path, err);
    if (!f) return -1;
    int rc = -1;
    json_t *now = NULL, *was = NULL;
    int32_t *ints = malloc((size_t)2 * t->L * sizeof *ints);
    const char *fmt = st_meta(f, "format"), *cfg = st_meta(f, "config"), *hash = st_meta(f, "text_hash"),
               *hist = st_meta(f, "arch_history"), *rng = st_meta(f, "rng");
    if (!ints) { err_set(err, "out of memory"); goto out; }
    if (!fmt || strcmp(fmt, "spanserve-train-state 1") != 0 || !cfg || !hash || !hist || !rng) {
        err_set(err, "%s: not a spanserve training state", path);
        goto out;
    }
    char *now_s = train_cfg_json(r->c);
    now = now_s ? json_loads(now_s, 0, NULL) : NULL;
    free(now_s);
    was = json_loads(cfg, 0, NULL);
    if (!now || !json_is_object(was)) { err_set(err, "%s: the state's config is not JSON", path); goto out; }
    const char *k;
    json_t *v;
    /* a key the state does not have (it came with a later version) may
     * stand at its default */
    train_cfg dc;
    train_cfg_defaults(&dc, r->c->fam);
    char *def_s = train_cfg_json(&dc);
    json_t *def = def_s ? json_loads(def_s, 0, NULL) : NULL;
    free(def_s);
    json_object_foreach(now, k, v) {
        json_t *o = json_object_get(was, k);
        if (!o && def && json_equal(json_object_get(def, k), v)) continue;
        if (!may_change(k) && (!o || !json_equal(o, v))) {
            char *a = o ? json_dumps(o, JSON_ENCODE_ANY) : NULL, *b = json_dumps(v, JSON_ENCODE_ANY);
            err_set(err, "--resume: config '%s' is %s now but %s in the run being resumed (%s); only steps, "
                    "log, log_every, eval_every, eval_tokens, checkpoint_every, device, tf32, precision, gpus and data may change",
                    k, b ? b : "?", a ? a : "absent", path);
            free(a);
            free(b);
            json_decref(def);
            goto out;
        }
    }
    json_decref(def);
    char hb[32];
    snprintf(hb, sizeof hb, "%016llx", (unsigned long long)r->text.hash);
    if (strcmp(hb, hash) != 0) {
        err_set(err, "--resume: the text of data '%s' is not the text the run started with", r->c->data);
        goto out;
    }
    long step = 0, pos = 0, searching = 0, loss_n = 0;
    if (meta_long(f, "step", &step, path, err) || meta_long(f, "pos", &pos, path, err) ||
        meta_long(f, "searching", &searching, path, err) || meta_long(f, "loss_n", &loss_n, path, err) ||
        meta_double(f, "tau", &t->tau, path, err) || meta_double(f, "loss_sum", &r->loss_sum, path, err) ||
        meta_double(f, "aux_sum", &r->aux_sum, path, err))
        goto out;
    if (step < 0 || pos < 0 || (size_t)pos + (size_t)t->M + 1 > r->nb) {
        err_set(err, "%s: step %ld or position %ld is out of range", path, step, pos);
        goto out;
    }
    if (load_arena(f, "weights", t, t->w, path, err) || load_arena(f, "moment1", t, t->m1, path, err) ||
        load_arena(f, "moment2", t, t->m2, path, err) ||
        load_tensor(f, "memory", ST_F64, t->mem, trainer_mem_floats(t), path, err) ||
        load_tensor(f, "mlen_arch", ST_I32, ints, (size_t)2 * t->L, path, err))
        goto out;
    for (int l = 0; l < t->L; l++) {
        t->mlen[l] = ints[l];
        t->arch[l] = (blk_kind)ints[t->L + l];
        if (ints[l] < 0 || ints[l] > t->c.mem_len || ints[t->L + l] < 0 || ints[t->L + l] > 2) {
            err_set(err, "%s: memory rows or architecture out of range", path);
            goto out;
        }
    }
    t->step = step;
    t->searching = (int)searching;
    r->pos = pos;
    r->loss_n = loss_n;
    r->rng.s = strtoull(rng, NULL, 16);
    json_decref(r->history);
    r->history = json_loads(hist, 0, NULL);
    if (!json_is_array(r->history)) { err_set(err, "%s: arch_history is not a JSON array", path); goto out; }
    rc = 0;
out:
    json_decref(now);
    json_decref(was);
    free(ints);
    st_close(f);
    return rc;
}

/* this process writes the files: one machine, or the first of several */
static int run_primary(const run_t *r) { return !r->dev || !r->dev->primary || r->dev->primary(r->dev_ctx); }

static int save_all(run_t *r, char *err)
{
    /* every machine downloads (the memories are gathered across them); the
     * first writes */
    if (r->dev && r->dev->download(r->dev_ctx, r->t, err)) return -1;
    if (!run_primary(r)) return 0;
    char *hist = r->t->c.fam->search ? json_dumps(r->history, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    int rc = save_state(r, err);
    if (rc == 0) rc = trainer_save_checkpoint(r->t, r->c->out, r->text.vocab_json, hist, err);
    free(hist);
    if (rc == 0) {
        json_t *o = json_object();
        json_object_set_new(o, "event", json_string("checkpoint"));
        json_object_set_new(o, "step", json_integer(r->t->step));
        json_object_set_new(o, "path", json_string(r->c->out));
        emit(r, o);
    }
    return rc;
}

/* ------------------------------------------------------------------ loop */

static void progress(run_t *r, double lr, double tok_s, int with_eval, double val_bpc)
{
    trainer *t = r->t;
    json_t *o = json_object();
    double loss = r->loss_n ? r->loss_sum / r->loss_n : NAN;
    json_object_set_new(o, "event", json_string("train"));
    json_object_set_new(o, "step", json_integer(t->step));
    json_object_set_new(o, "loss", json_real(loss));
    json_object_set_new(o, "bpc", json_real(loss / LN2));
    if (with_eval) json_object_set_new(o, "val_bpc", json_real(val_bpc));
    json_object_set_new(o, "lr", json_real(lr));
    json_object_set_new(o, "tokens_per_s", json_real(tok_s));
    json_object_set_new(o, "data_pos", json_integer(r->pos));   /* where the next block starts in every stream */
    t->c.fam->progress(t, r->loss_n ? r->aux_sum / r->loss_n : 0, o, r->history);
    emit(r, o);
    r->loss_sum = r->aux_sum = 0;
    r->loss_n = 0;
}

int train_run(const train_cfg *c, int resume, FILE *logf, char *err) { return train_run_on(c, NULL, resume, logf, err); }

static volatile sig_atomic_t stop_asked;

void train_request_stop(void) { stop_asked = 1; }
int train_stop_pending(void) { return stop_asked != 0; }

int train_run_on(const train_cfg *cfg, const train_device *dev, int resume, FILE *logf, char *err)
{
    train_cfg resolved = *cfg;   /* "auto" becomes the device the run is on, as the checkpoint records it */
    const train_cfg *c = &resolved;
    if (strcmp(resolved.device, "auto") == 0) snprintf(resolved.device, sizeof resolved.device, "%s", dev ? "cuda" : "cpu");
    if (train_cfg_check(c, err)) return -1;
    if (strcmp(c->device, "cpu") != 0 && !dev)
        return err_set(err, "config 'device' = \"%s\": this build has no CUDA trainer (built without nvcc); train "
                       "with --device cpu", c->device);
    if (strcmp(c->device, "cpu") == 0) dev = NULL;
    run_t r = {.c = c, .log = logf, .dev = dev};
    int rc = -1;
    if (text_load(&r.text, c, err)) return -1;
    const int B = c->batch_size, M = c->fam->block_len(c);
    r.nb = r.text.split / (size_t)B;
    r.nbv = (r.text.n - r.text.split) / (size_t)B;
    if (r.nb < (size_t)2 * M + 1) {
        err_set(err, "data '%s': the training text (%zu characters) is too short for batch_size %d streams of at least "
                "2 blocks of %d + 1", c->data, r.text.split, B, M);
        goto out;
    }
    if (r.nbv < (size_t)M + 1) {
        err_set(err, "data '%s': the validation text (%zu characters, val_fraction %g) is too short for batch_size %d "
                "streams of a block of %d + 1", c->data, r.text.n - r.text.split, c->val_fraction, B, M);
        goto out;
    }
    r.t = trainer_new(c, r.text.V, err);
    if (!r.t) goto out;
    trainer *t = r.t;
    r.history = json_array();
    r.mem_keep = malloc((trainer_mem_floats(t) ? trainer_mem_floats(t) : 1) * sizeof *r.mem_keep);
    r.mlen_keep = malloc((size_t)t->L * sizeof *r.mlen_keep);
    r.x = malloc((size_t)B * M * sizeof *r.x);
    r.y = malloc((size_t)B * M * sizeof *r.y);
    if (!r.history || !r.mem_keep || !r.mlen_keep || !r.x || !r.y) { err_set(err, "out of memory"); goto out; }
    r.rng.s = c->seed * 0x9E3779B97F4A7C15ULL + 0x6A09E667F3BCC909ULL;
    trainer_init(t, c->seed);
    if (resume && load_state(&r, err)) goto out;
    if (dev && !(r.dev_ctx = dev->open(t, err))) goto out;
    {
        json_t *o = json_object();
        json_object_set_new(o, "event", json_string(resume ? "resume" : "start"));
        json_object_set_new(o, "step", json_integer(t->step));
        json_object_set_new(o, "family", json_string(c->fam->name));
        json_object_set_new(o, "parameters", json_integer((json_int_t)trainer_n_params(t)));
        json_object_set_new(o, "vocab_size", json_integer(t->V));
        json_object_set_new(o, "train_tokens", json_integer((json_int_t)r.text.split));
        json_object_set_new(o, "val_tokens", json_integer((json_int_t)(r.text.n - r.text.split)));
        json_object_set_new(o, "device", json_string(dev ? dev->name : "cpu"));
        if (dev) json_object_set_new(o, "device_name", json_string(dev->device_name(r.dev_ctx)));
        emit(&r, o);
    }
    double t0 = now_s(), lr = train_lr(c, t->step ? t->step : 1), val = NAN;
    long tok0 = t->step;
    int evaluated = 0;
    while (t->step < c->steps) {
        const long s = t->step + 1;
        if (c->fam->step_begin) c->fam->step_begin(t, s, &r.rng);
        fill_block(&r, 0, r.nb, r.pos);
        lr = train_lr(c, s);
        double aux, nll;
        if (dev && dev->train_step) {   /* the device's forward, backward and step, one wait */
            nll = dev->train_step(r.dev_ctx, t, r.x, r.y, lr, &aux, err);
            if (!isfinite(nll)) goto out;
        } else {
            nll = run_forward(&r, 1, &aux, err);
            if (!isfinite(nll)) goto out;
            if (dev) {
                if (dev->step(r.dev_ctx, t, lr, err)) goto out;
            } else
                train_optim_step(t, lr, c->arch_lr);
        }
        r.loss_sum += nll;
        r.aux_sum += aux;
        r.loss_n++;
        r.pos += M;
        if ((size_t)r.pos >= r.nb - (size_t)M) {
            r.pos = 0;
            if (run_reset_memory(&r, err)) goto out;
        }
        /* progress every log_every steps; a run that stops between them
         * keeps its partial sums in the state, so that a resumed run logs
         * what an uninterrupted one does */
        evaluated = 0;
        if ((c->eval_every && s % c->eval_every == 0 && s % c->log_every == 0) || s == c->steps) {
            val = evaluate(&r, err);
            if (!isfinite(val)) goto out;
            evaluated = 1;
        }
        if (s % c->log_every == 0) {
            double dt = now_s() - t0;
            progress(&r, lr, dt > 0 ? (double)(s - tok0) * B * M / dt : 0, evaluated, val);
        }
        json_t *event = c->fam->step_end ? c->fam->step_end(t, s) : NULL;
        if (event) emit(&r, event);
        const int saved = (c->checkpoint_every && s % c->checkpoint_every == 0) || s == c->steps;
        if (saved && save_all(&r, err)) goto out;
        /* several machines stop after the step they agreed on */
        const int stop = dev && dev->stop_agreed ? dev->stop_agreed(r.dev_ctx) : stop_asked != 0;
        if (stop && s < c->steps) {   /* asked to stop: this step is the run's last, saved */
            if (!saved && save_all(&r, err)) goto out;
            json_t *o = json_object();
            json_object_set_new(o, "event", json_string("stopped"));
            json_object_set_new(o, "step", json_integer(s));
            json_object_set_new(o, "checkpoint", json_string(c->out));
            json_object_set_new(o, "seconds", json_real(now_s() - t0));
            emit(&r, o);
            rc = TRAIN_STOPPED;
            goto out;
        }
    }
    if (!evaluated) {   /* a resumed run that had nothing left to do still reports */
        val = evaluate(&r, err);
        if (!isfinite(val)) goto out;
        if (save_all(&r, err)) goto out;
    }
    {
        json_t *o = json_object();
        json_object_set_new(o, "event", json_string("done"));
        json_object_set_new(o, "step", json_integer(t->step));
        json_object_set_new(o, "val_bpc", json_real(val));
        json_object_set_new(o, "checkpoint", json_string(c->out));
        json_object_set_new(o, "seconds", json_real(now_s() - t0));
        emit(&r, o);
    }
    rc = 0;
out:
    if (r.dev_ctx) dev->close(r.dev_ctx);
    trainer_free(r.t);
    text_free(&r.text);
    json_decref(r.history);
    free(r.mem_keep);
    free(r.mlen_keep);
    free(r.x);
    free(r.y);
    return rc;
}
