/*
 * tok_chars.c - the character vocabulary: one token per UTF-8 character
 * (__metadata__.vocab lists id -> the character; every fixture of the two
 * founding families).
 */
#include "err.h"
#include "vocab.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Vocabularies beyond a million characters are not character models. */
#define VOCAB_MAX (1 << 20)

static const vocab_t *sort_ctx;
static int cmp_cp(const void *a, const void *b)
{
    uint32_t x = sort_ctx->cp[*(const int32_t *)a], y = sort_ctx->cp[*(const int32_t *)b];
    return x < y ? -1 : x > y;
}

static int chars_parse(vocab_t *v, const char *text, char *err)
{
    json_error_t je;
    json_t *a = json_loads(text, 0, &je);
    if (!a) return err_set(err, "vocab is not valid JSON (%s)", je.text);
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > VOCAB_MAX) {
        json_decref(a);
        return err_set(err, "vocab must be a JSON array of 1 to %d strings", VOCAB_MAX);
    }
    v->n = (int)json_array_size(a);
    v->tok = calloc((size_t)v->n, sizeof *v->tok);
    v->pool = calloc((size_t)v->n, 5);
    v->cp = calloc((size_t)v->n, sizeof *v->cp);
    v->sorted = calloc((size_t)v->n, sizeof *v->sorted);
    if (!v->tok || !v->pool || !v->cp || !v->sorted) { json_decref(a); return err_set(err, "out of memory"); }
    for (int i = 0; i < 128; i++) v->ascii[i] = -1;
    for (int i = 0; i < v->n; i++) {
        json_t *e = json_array_get(a, (size_t)i);
        const char *s = json_string_value(e);
        size_t len = s ? json_string_length(e) : 0;
        uint32_t cp;
        if (!s || len == 0 || len > 4 || utf8_decode((const unsigned char *)s, len, &cp) != (int)len) {
            json_decref(a);
            return err_set(err, "vocab[%d] is not a string of exactly one character", i);
        }
        v->tok[i] = v->pool + (size_t)i * 5;
        memcpy(v->tok[i], s, len);
        v->max_piece = len > v->max_piece ? len : v->max_piece;
        v->cp[i] = cp;
        v->sorted[i] = i;
    }
    json_decref(a);
    sort_ctx = v;
    qsort(v->sorted, (size_t)v->n, sizeof *v->sorted, cmp_cp);
    for (int i = 1; i < v->n; i++)
        if (v->cp[v->sorted[i]] == v->cp[v->sorted[i - 1]])
            return err_set(err, "vocab[%d] repeats a character listed earlier", v->sorted[i]);
    for (int i = 0; i < v->n; i++)
        if (v->cp[i] < 128) v->ascii[v->cp[i]] = i;
    v->eos = v->unk = -1;
    return 0;
}

int32_t vocab_id(const vocab_t *v, uint32_t cp)
{
    if (!v->cp) return -1;
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

static long chars_encode(const vocab_t *v, const char *text, size_t len, int open, int32_t *ids, size_t *offs,
                         size_t cap, char *err)
{
    (void)open;
    size_t k = 0;
    for (size_t i = 0; i < len && k < cap;) {
        uint32_t cp;
        int m = utf8_decode((const unsigned char *)text + i, len - i, &cp);
        if (!m) return err_set(err, "invalid UTF-8 at byte %zu", i);
        int32_t id = vocab_id(v, cp);
        if (id < 0) {
            if (cp >= 0x20 && cp != 0x7F && cp != '\'')
                return err_set(err, "character '%.*s' (U+%04X) at byte %zu is not in the model's vocabulary",
                               m, text + i, (unsigned)cp, i);
            return err_set(err, "character U+%04X at byte %zu is not in the model's vocabulary", (unsigned)cp, i);
        }
        offs[k] = i;
        ids[k++] = id;
        i += (size_t)m;
    }
    return (long)k;
}

static size_t chars_max_tokens(size_t len) { return len; }

static size_t chars_piece(const vocab_t *v, int32_t prev, int32_t id, char *buf)
{
    (void)prev;
    size_t l = strlen(v->tok[id]);
    memcpy(buf, v->tok[id], l + 1);
    return l;
}

const tokenizer tok_chars = {"chars", 1, chars_parse, chars_encode, chars_max_tokens, chars_piece};
