/*
 * vocab.c - character vocabulary: parsing, encoding and decoding.
 */
#include "vocab.h"
#include "err.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
    if (len == 0) return 0;
    unsigned c = s[0];
    int n;
    uint32_t v, min;
    if (c < 0x80) { *cp = c; return 1; }
    else if ((c & 0xE0) == 0xC0) { n = 2; v = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { n = 3; v = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { n = 4; v = c & 0x07; min = 0x10000; }
    else return 0;
    if ((size_t)n > len) return 0;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

static const vocab_t *sort_ctx;
static int cmp_cp(const void *a, const void *b)
{
    uint32_t x = sort_ctx->cp[*(const int32_t *)a], y = sort_ctx->cp[*(const int32_t *)b];
    return x < y ? -1 : x > y;
}

void vocab_free(vocab_t *v)
{
    free(v->tok);
    free(v->cp);
    free(v->sorted);
    memset(v, 0, sizeof *v);
}

/* Vocabularies beyond a million characters are not character models. */
#define VOCAB_MAX (1 << 20)

int vocab_parse(vocab_t *v, const char *text, char *err)
{
    memset(v, 0, sizeof *v);
    json_error_t je;
    json_t *a = json_loads(text, 0, &je);
    if (!a) return err_set(err, "vocab is not valid JSON (%s)", je.text);
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > VOCAB_MAX) {
        json_decref(a);
        return err_set(err, "vocab must be a JSON array of 1 to %d strings", VOCAB_MAX);
    }
    v->n = (int)json_array_size(a);
    v->tok = calloc((size_t)v->n, sizeof *v->tok);
    v->cp = calloc((size_t)v->n, sizeof *v->cp);
    v->sorted = calloc((size_t)v->n, sizeof *v->sorted);
    if (!v->tok || !v->cp || !v->sorted) { json_decref(a); vocab_free(v); return err_set(err, "out of memory"); }
    for (int i = 0; i < 128; i++) v->ascii[i] = -1;
    for (int i = 0; i < v->n; i++) {
        json_t *e = json_array_get(a, (size_t)i);
        const char *s = json_string_value(e);
        size_t len = s ? json_string_length(e) : 0;
        uint32_t cp;
        if (!s || len == 0 || len > 4 || utf8_decode((const unsigned char *)s, len, &cp) != (int)len) {
            json_decref(a);
            vocab_free(v);
            return err_set(err, "vocab[%d] is not a string of exactly one character", i);
        }
        memcpy(v->tok[i], s, len);
        v->cp[i] = cp;
        v->sorted[i] = i;
    }
    json_decref(a);
    sort_ctx = v;
    qsort(v->sorted, (size_t)v->n, sizeof *v->sorted, cmp_cp);
    for (int i = 1; i < v->n; i++)
        if (v->cp[v->sorted[i]] == v->cp[v->sorted[i - 1]]) {
            int dup = v->sorted[i];
            vocab_free(v);
            return err_set(err, "vocab[%d] repeats a character listed earlier", dup);
        }
    for (int i = 0; i < v->n; i++)
        if (v->cp[i] < 128) v->ascii[v->cp[i]] = i;
    return 0;
}

int32_t vocab_id(const vocab_t *v, uint32_t cp)
{
    if (cp < 128) return v->ascii[cp];
    int lo = 0, hi = v->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        uint32_t c = v->cp[v->sorted[mid]];
        if (c == cp) return v->sorted[mid];
        if (c < cp) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

int vocab_encode(const vocab_t *v, const char *text, size_t len, int32_t **out, size_t *n, char *err)
{
    int32_t *ids = malloc((len ? len : 1) * sizeof *ids);
    size_t k = 0;
    if (!ids) return err_set(err, "out of memory");
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int m = utf8_decode((const unsigned char *)text + i, len - i, &cp);
        if (!m) {
            free(ids);
            return err_set(err, "invalid UTF-8 at byte %zu", i);
        }
        int32_t id = vocab_id(v, cp);
        if (id < 0) {
            free(ids);
            if (cp >= 0x20 && cp != 0x7F && cp != '\'')
                return err_set(err, "character '%.*s' (U+%04X) at byte %zu is not in the model's vocabulary",
                               m, text + i, (unsigned)cp, i);
            return err_set(err, "character U+%04X at byte %zu is not in the model's vocabulary", (unsigned)cp, i);
        }
        ids[k++] = id;
        i += (size_t)m;
    }
    *out = ids;
    *n = k;
    return 0;
}

int vocab_decode(const vocab_t *v, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n) return -1;
        size_t l = strlen(v->tok[ids[i]]);
        if (at + l + 1 > cap) return -1;
        memcpy(buf + at, v->tok[ids[i]], l);
        at += l;
    }
    if (cap) buf[at] = 0;
    return (int)at;
}
