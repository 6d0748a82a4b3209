/*
 * st.c - safetensors reader and writer (see st.h for the layout).
 *
 * The reader trusts nothing in the file: the header length, every dtype,
 * shape and offset is checked before any tensor byte is touched, so a
 * truncated, hostile or simply wrong file gives a message, never a read out
 * of bounds. tests/fuzz/fuzz_st.c drives st_parse with arbitrary bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include "st.h"
#include "err.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_NAME 1024

struct st_file {
    void *map;          /* st_open's mapping, or NULL for st_parse */
    size_t map_len;
    json_t *meta;       /* __metadata__ object, or NULL */
    int n;
    st_tensor *t;
};

static const struct { const char *name; size_t size; } dtypes[ST_NDTYPES] = {
    [ST_F64] = {"F64", 8},  [ST_F32] = {"F32", 4},  [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4},
    [ST_I16] = {"I16", 2},  [ST_I8] = {"I8", 1},    [ST_U64] = {"U64", 8},
    [ST_U32] = {"U32", 4},  [ST_U16] = {"U16", 2},  [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1},
};

const char *st_dtype_name(st_dtype d) { return d < ST_NDTYPES ? dtypes[d].name : "?"; }
size_t st_dtype_size(st_dtype d) { return d < ST_NDTYPES ? dtypes[d].size : 0; }

int64_t st_numel(const st_tensor *t)
{
    /* A zero extent makes the count 0 whatever the others are, and the reader
     * bounds the others only when none is zero: multiply only then. */
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int st_count(const st_file *f) { return f->n; }
const st_tensor *st_at(const st_file *f, int i) { return i >= 0 && i < f->n ? &f->t[i] : NULL; }

const st_tensor *st_find(const st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

const char *st_meta(const st_file *f, const char *key)
{
    json_t *v = f->meta ? json_object_get(f->meta, key) : NULL;
    return v ? json_string_value(v) : NULL;
}

void st_close(st_file *f)
{
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->t[i].name);
    free(f->t);
    json_decref(f->meta);
    if (f->map) munmap(f->map, f->map_len);
    free(f);
}

/* Reads one tensor entry of the header into T; offsets into BEGIN/END. */
static int parse_entry(const char *label, const char *name, json_t *v, size_t data_len,
                       st_tensor *t, size_t *begin, size_t *end, char *err)
{
    if (strlen(name) > ST_MAX_NAME)
        return err_set(err, "%s: tensor name of %zu bytes (limit %d)", label, strlen(name), ST_MAX_NAME);
    if (!json_is_object(v))
        return err_set(err, "%s: tensor '%s': header entry is not an object", label, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return err_set(err, "%s: tensor '%s': missing or non-string dtype", label, name);
    t->dtype = ST_NDTYPES;
    for (int d = 0; d < ST_NDTYPES; d++)
        if (strcmp(json_string_value(jd), dtypes[d].name) == 0) t->dtype = (st_dtype)d;
    if (t->dtype == ST_NDTYPES)
        return err_set(err, "%s: tensor '%s': unknown dtype '%.32s'", label, name, json_string_value(jd));
    if (!json_is_array(js) || json_array_size(js) > ST_MAX_DIM)
        return err_set(err, "%s: tensor '%s': shape must be an array of at most %d integers",
                       label, name, ST_MAX_DIM);
    t->ndim = (int)json_array_size(js);
    /* numel * size must equal the byte range, which is bounded by the file
     * size; check each product against that bound so nothing overflows. */
    size_t bytes = st_dtype_size(t->dtype);
    int zero = 0;
    for (int i = 0; i < t->ndim; i++) {
        json_t *e = json_array_get(js, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return err_set(err, "%s: tensor '%s': shape[%d] is not a non-negative integer", label, name, i);
        t->shape[i] = json_integer_value(e);
        if (t->shape[i] == 0) zero = 1;
    }
    for (int i = 0; i < t->ndim && !zero; i++) {
        if ((uint64_t)t->shape[i] > data_len / bytes + 1)
            return err_set(err, "%s: tensor '%s': shape is larger than the file's data (%zu bytes)",
                           label, name, data_len);
        bytes *= (size_t)t->shape[i];
        if (bytes > data_len)
            return err_set(err, "%s: tensor '%s': shape needs more bytes than the file's data holds (%zu)",
                           label, name, data_len);
    }
    if (zero) bytes = 0;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return err_set(err, "%s: tensor '%s': data_offsets must be two integers", label, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return err_set(err, "%s: tensor '%s': data_offsets [%lld, %lld] are not an increasing pair",
                       label, name, (long long)b, (long long)e);
    if ((uint64_t)e > data_len)
        return err_set(err, "%s: tensor '%s': data_offsets end %lld is past the end of the data (%zu bytes)",
                       label, name, (long long)e, data_len);
    if ((size_t)(e - b) != bytes)
        return err_set(err, "%s: tensor '%s': %s shape needs %zu bytes but data_offsets give %lld",
                       label, name, dtypes[t->dtype].name, bytes, (long long)(e - b));
    t->nbytes = bytes;
    *begin = (size_t)b;
    *end = (size_t)e;
    return 0;
}

typedef struct { size_t begin, end; int idx; } span_t;

static int cmp_span(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

st_file *st_parse(const void *buf, size_t len, const char *label, char *err)
{
    const unsigned char *p = buf;
    if (len < 8) {
        err_set(err, "%s: truncated: %zu bytes, a safetensors file starts with an 8-byte header length", label, len);
        return NULL;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | p[i];
    if (n > len - 8) {
        err_set(err, "%s: header length %llu runs past the end of the file (%zu bytes): truncated or not safetensors",
                label, (unsigned long long)n, len);
        return NULL;
    }
    if (n > ST_MAX_HEADER) {
        err_set(err, "%s: header length %llu is over the limit of %u bytes", label, (unsigned long long)n, ST_MAX_HEADER);
        return NULL;
    }
    if (n < 2) {
        err_set(err, "%s: header of %llu bytes cannot hold a JSON object", label, (unsigned long long)n);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        err_set(err, "%s: header is not valid JSON (byte %d: %s)", label, je.position, je.text);
        return NULL;
    }
    st_file *f = calloc(1, sizeof *f);
    span_t *spans = NULL;
    if (!f) { err_set(err, "%s: out of memory", label); goto fail; }
    if (!json_is_object(root)) { err_set(err, "%s: header is not a JSON object", label); goto fail; }
    size_t data_len = len - 8 - (size_t)n;
    size_t count = json_object_size(root);
    json_t *meta = json_object_get(root, "__metadata__");
    if (meta) {
        if (!json_is_object(meta)) { err_set(err, "%s: __metadata__ is not an object", label); goto fail; }
        const char *k;
        json_t *v;
        json_object_foreach(meta, k, v) {
            if (!json_is_string(v)) {
                err_set(err, "%s: __metadata__['%.64s'] is not a string", label, k);
                goto fail;
            }
        }
        f->meta = json_incref(meta);
        count--;
    }
    if (count > ST_MAX_TENSORS) { err_set(err, "%s: %zu tensors (limit %d)", label, count, ST_MAX_TENSORS); goto fail; }
    f->t = calloc(count ? count : 1, sizeof *f->t);
    spans = calloc(count ? count : 1, sizeof *spans);
    if (!f->t || !spans) { err_set(err, "%s: out of memory", label); goto fail; }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (strcmp(name, "__metadata__") == 0) continue;
        st_tensor *t = &f->t[f->n];
        if (parse_entry(label, name, v, data_len, t, &spans[f->n].begin, &spans[f->n].end, err)) goto fail;
        t->name = strdup(name);
        if (!t->name) { err_set(err, "%s: out of memory", label); goto fail; }
        t->data = p + 8 + n + spans[f->n].begin;
        spans[f->n].idx = f->n;
        f->n++;
    }
    /* The tensors must tile [0, data_len) exactly. */
    qsort(spans, (size_t)f->n, sizeof *spans, cmp_span);
    size_t at = 0;
    for (int i = 0; i < f->n; i++) {
        if (spans[i].begin < at) {
            err_set(err, "%s: tensor '%s' (bytes %zu..%zu) overlaps the tensor before it (ending at %zu)", label,
                    f->t[spans[i].idx].name, spans[i].begin, spans[i].end, at);
            goto fail;
        }
        if (spans[i].begin > at) {
            err_set(err, "%s: bytes %zu..%zu of the data belong to no tensor (before '%s')", label, at,
                    spans[i].begin, f->t[spans[i].idx].name);
            goto fail;
        }
        at = spans[i].end;
    }
    if (at != data_len) {
        err_set(err, "%s: %zu bytes after the last tensor belong to no tensor", label, data_len - at);
        goto fail;
    }
    free(spans);
    json_decref(root);
    return f;
fail:
    free(spans);
    json_decref(root);
    st_close(f);
    return NULL;
}

st_file *st_open(const char *path, char *err) { return st_open_named(path, path, err); }

st_file *st_open_named(const char *path, const char *name, char *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_set(err, "%s: cannot open: %s", name, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        err_set(err, "%s: not a regular file", name);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)sb.st_size;
    void *map = NULL;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            err_set(err, "%s: cannot map: %s", name, strerror(errno));
            close(fd);
            return NULL;
        }
    }
    close(fd);
    static const char empty[1];
    st_file *f = st_parse(map ? map : empty, len, name, err);
    if (!f) {
        if (map) munmap(map, len);
        return NULL;
    }
    f->map = map;
    f->map_len = len;
    return f;
}

/* ------------------------------------------------------------------ writer */

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIM];
    const void *data;
} wtensor;

struct st_writer {
    json_t *meta;
    wtensor *t;
    int n, cap;
};

st_writer *st_writer_new(void)
{
    st_writer *w = calloc(1, sizeof *w);
    if (w && !(w->meta = json_object())) { free(w); return NULL; }
    return w;
}

void st_writer_free(st_writer *w)
{
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    json_decref(w->meta);
    free(w);
}

int st_writer_meta(st_writer *w, const char *key, const char *value)
{
    return json_object_set_new(w->meta, key, json_string(value));
}

int st_writer_add(st_writer *w, const char *name, st_dtype dtype, int ndim, const int64_t *shape, const void *data)
{
    if (ndim < 0 || ndim > ST_MAX_DIM || dtype >= ST_NDTYPES) return -1;
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return -1;
        w->t = t;
        w->cap = cap;
    }
    wtensor *t = &w->t[w->n];
    if (!(t->name = strdup(name))) return -1;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
    w->n++;
    return 0;
}

static size_t wt_bytes(const wtensor *t)
{
    size_t b = st_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) b *= (size_t)t->shape[i];
    return b;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t k = write(fd, p, len);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

int st_writer_save(st_writer *w, const char *path, char *err)
{
    json_t *root = json_object();
    size_t off = 0;
    if (!root) return err_set(err, "%s: out of memory", path);
    if (json_object_size(w->meta)) json_object_set(root, "__metadata__", w->meta);
    for (int i = 0; i < w->n; i++) {
        json_t *e = json_object(), *shape = json_array();
        for (int d = 0; d < w->t[i].ndim; d++) json_array_append_new(shape, json_integer(w->t[i].shape[d]));
        size_t b = wt_bytes(&w->t[i]);
        json_object_set_new(e, "dtype", json_string(st_dtype_name(w->t[i].dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + b)));
        json_object_set_new(root, w->t[i].name, e);
        off += b;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) return err_set(err, "%s: out of memory", path);
    /* Pad the header with spaces so the data starts 8-byte aligned. */
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    size_t tcap = strlen(path) + 32;
    char *tmp = malloc(tcap);
    if (!tmp) { free(hdr); return err_set(err, "%s: out of memory", path); }
    snprintf(tmp, tcap, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        err_set(err, "%s: cannot create: %s", tmp, strerror(errno));
        free(hdr);
        free(tmp);
        return -1;
    }
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int bad = write_all(fd, lenb, 8) || write_all(fd, hdr, hl) || write_all(fd, "        ", padded - hl);
    for (int i = 0; i < w->n && !bad; i++) bad = write_all(fd, w->t[i].data, wt_bytes(&w->t[i]));
    if (!bad) bad = fsync(fd);
    int saved = errno;
    if (close(fd) != 0 && !bad) { bad = 1; saved = errno; }
    free(hdr);
    if (bad || rename(tmp, path) != 0) {
        if (!bad) saved = errno;
        unlink(tmp);
        err_set(err, "%s: cannot write: %s", path, strerror(saved));
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}
