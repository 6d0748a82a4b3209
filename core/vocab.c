/*
 * vocab.c - what every vocabulary kind shares: the table of kinds, UTF-8,
 * and the entry points that dispatch to a kind (see vocab.h).
 */
#include "vocab.h"
#include "err.h"

#include <stdlib.h>
#include <string.h>

extern const tokenizer tok_chars, tok_words, tok_spm;

const tokenizer *const vocab_kinds[] = {&tok_chars, &tok_words, &tok_spm, NULL};

const tokenizer *vocab_kind(const char *name)
{
    for (int i = 0; vocab_kinds[i]; i++)
        if (strcmp(vocab_kinds[i]->name, name) == 0) return vocab_kinds[i];
    return NULL;
}

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

void vocab_free(vocab_t *v)
{
    if (v->release) v->release(v);
    free(v->tok);
    free(v->pool);
    free(v->cp);
    free(v->sorted);
    free(v->table);
    memset(v, 0, sizeof *v);
}

int vocab_parse_kind(vocab_t *v, const tokenizer *kind, const char *json_text, char *err)
{
    memset(v, 0, sizeof *v);
    if (!kind) kind = &tok_chars;
    if (kind->parse(v, json_text, err)) {
        vocab_free(v);
        return -1;
    }
    v->kind = kind;
    return 0;
}

int vocab_parse(vocab_t *v, const char *json_text, char *err) { return vocab_parse_kind(v, &tok_chars, json_text, err); }

int vocab_encode_offsets(const vocab_t *v, const char *text, size_t len, int open, int32_t **out, size_t **offs,
                         size_t *n, char *err)
{
    size_t cap = v->kind->max_tokens(len);
    int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
    size_t *off = malloc((cap ? cap : 1) * sizeof *off);
    if (!ids || !off) {
        free(ids);
        free(off);
        return err_set(err, "out of memory");
    }
    long k = v->kind->encode(v, text, len, open, ids, off, cap, err);
    if (k < 0) {
        free(ids);
        free(off);
        return -1;
    }
    *out = ids;
    *n = (size_t)k;
    if (offs) *offs = off;
    else free(off);
    return 0;
}

int vocab_encode(const vocab_t *v, const char *text, size_t len, int32_t **out, size_t *n, char *err)
{
    return vocab_encode_offsets(v, text, len, 0, out, NULL, n, err);
}

size_t vocab_piece(const vocab_t *v, int32_t prev, int32_t id, char *buf) { return v->kind->piece(v, prev, id, buf); }

int vocab_decode(const vocab_t *v, const int32_t *ids, size_t n, char *buf, size_t cap)
{
    size_t at = 0;
    char *piece = malloc(v->max_piece + 1);
    if (!piece) return -1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n) { free(piece); return -1; }
        size_t l = vocab_piece(v, i ? ids[i - 1] : -1, ids[i], piece);
        if (at + l + 1 > cap) { free(piece); return -1; }
        memcpy(buf + at, piece, l);
        at += l;
    }
    free(piece);
    if (cap) buf[at] = 0;
    return (int)at;
}
