/*
 * tok_words.c - the word vocabulary of kimiyoung/transformer-xl's `Vocab`
 * (and of the Hugging Face and NVIDIA ports): a text is read as Python reads
 * a file line by line (a line ends at \n, \r\n or \r; a last line without an
 * end counts, except in a prompt, whose last line goes on; an end at the very
 * end of the text begins no other line); each
 * line is `line.strip().split()` (Python's whitespace) followed by <eos>; a
 * word the vocabulary lacks is <unk>. Output: words joined by one space,
 * <eos> back to a newline.
 */
#include "err.h"
#include "vocab.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Past these a file is not a word vocabulary of any trained model (the
 * largest, WikiText-103's, has 267,735 words). */
#define WORDS_MAX (1 << 22)
#define WORD_MAX_BYTES 1024

/* Python's str.isspace(): what split() and strip() split on. */
static int py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

/* The id of the word of N bytes at S, or -1. */
static int32_t lookup(const vocab_t *v, const char *s, size_t n)
{
    for (size_t at = hash_bytes(s, n) & v->table_mask;; at = (at + 1) & v->table_mask) {
        int32_t id = v->table[at];
        if (id < 0) return -1;
        const char *w = id == v->eos ? "<eos>" : v->tok[id];
        if (strlen(w) == n && memcmp(w, s, n) == 0) return id;   /* the text may hold NUL bytes */
    }
}

static int words_parse(vocab_t *v, const char *text, char *err)
{
    json_error_t je;
    json_t *a = json_loads(text, 0, &je);
    if (!a) return err_set(err, "vocab is not valid JSON (%s)", je.text);
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > WORDS_MAX) {
        json_decref(a);
        return err_set(err, "vocab must be a JSON array of 1 to %d words", WORDS_MAX);
    }
    v->n = (int)json_array_size(a);
    size_t bytes = 0, cap = 16;
    while (cap < 2 * (size_t)v->n) cap *= 2;
    for (int i = 0; i < v->n; i++) bytes += json_string_length(json_array_get(a, (size_t)i)) + 1;
    v->tok = calloc((size_t)v->n, sizeof *v->tok);
    v->pool = malloc(bytes + 2);
    v->table = malloc(cap * sizeof *v->table);
    if (!v->tok || !v->pool || !v->table) { json_decref(a); return err_set(err, "out of memory"); }
    for (size_t i = 0; i < cap; i++) v->table[i] = -1;
    v->table_mask = cap - 1;
    v->eos = v->unk = -1;
    /* the pool holds each word; <eos>'s own text is the newline, kept last */
    char *at = v->pool;
    size_t longest = 0;
    for (int i = 0; i < v->n; i++) {
        json_t *e = json_array_get(a, (size_t)i);
        const char *s = json_string_value(e);
        size_t len = s ? json_string_length(e) : 0;
        if (!s || len == 0 || len > WORD_MAX_BYTES || memchr(s, 0, len)) {
            json_decref(a);
            return err_set(err, "vocab[%d] is not a word (a string of 1 to %d bytes)", i, WORD_MAX_BYTES);
        }
        for (size_t k = 0; k < len;) {
            uint32_t cp;
            int m = utf8_decode((const unsigned char *)s + k, len - k, &cp);
            if (m && py_space(cp)) {
                json_decref(a);
                return err_set(err, "vocab[%d] holds whitespace: a word vocabulary splits text there", i);
            }
            k += m ? (size_t)m : 1;
        }
        memcpy(at, s, len + 1);
        v->tok[i] = at;
        at += len + 1;
        longest = len > longest ? len : longest;
        if (lookup(v, s, len) >= 0) {
            err_set(err, "vocab[%d] '%.64s' repeats a word listed earlier", i, at - len - 1);   /* the pool's copy */
            json_decref(a);
            return -1;
        }
        size_t slot = hash_bytes(s, len) & v->table_mask;
        while (v->table[slot] >= 0) slot = (slot + 1) & v->table_mask;
        v->table[slot] = i;
        if (strcmp(s, "<eos>") == 0) v->eos = i;
        if (strcmp(s, "<unk>") == 0) v->unk = i;
    }
    json_decref(a);
    if (v->eos < 0) return err_set(err, "a word vocabulary needs <eos> (the end of every line)");
    memcpy(at, "\n", 2);
    v->tok[v->eos] = at;
    v->max_piece = longest + 1;   /* a space, then the word */
    return 0;
}

/* Token *K: ID (-1: the word of N bytes at byte AT is unknown: <unk>, or an
 * error where the vocabulary has none), beginning at byte AT. */
static int put(const vocab_t *v, int32_t id, const char *text, size_t at, size_t n, int32_t *ids, size_t *offs,
               size_t *k, size_t cap, char *err)
{
    if (id < 0 && v->unk < 0)
        return err_set(err, "word '%.*s' at byte %zu is not in the model's vocabulary, which has no <unk>",
                       (int)(n < 64 ? n : 64), text + at, at);
    if (*k == cap) return err_set(err, "too many tokens");
    offs[*k] = at;
    ids[(*k)++] = id < 0 ? v->unk : id;
    return 0;
}

static long words_encode(const vocab_t *v, const char *text, size_t len, int open, int32_t *ids, size_t *offs,
                         size_t cap, char *err)
{
    size_t k = 0, i = 0, word = 0;
    int in_word = 0;
    while (i < len) {
        uint32_t cp;
        int m = utf8_decode((const unsigned char *)text + i, len - i, &cp);
        if (!m) return err_set(err, "invalid UTF-8 at byte %zu", i);
        int end_line = cp == '\n' || cp == '\r';
        if (in_word && (end_line || py_space(cp))) {
            if (put(v, lookup(v, text + word, i - word), text, word, i - word, ids, offs, &k, cap, err)) return -1;
            in_word = 0;
        }
        if (end_line) {
            if (put(v, v->eos, text, i, 0, ids, offs, &k, cap, err)) return -1;
            if (cp == '\r' && i + 1 < len && text[i + 1] == '\n') i++;   /* \r\n ends one line */
        } else if (!in_word && !py_space(cp)) {
            in_word = 1;
            word = i;
        }
        i += (size_t)m;
    }
    if (in_word && put(v, lookup(v, text + word, len - word), text, word, len - word, ids, offs, &k, cap, err)) return -1;
    /* a last line without its end still ends in <eos>, unless the text goes on */
    if (!open && len > 0 && text[len - 1] != '\n' && text[len - 1] != '\r' &&
        put(v, v->eos, text, len, 0, ids, offs, &k, cap, err))
        return -1;
    return (long)k;
}

/* A token takes at least one byte, and a last line without an end adds one <eos>. */
static size_t words_max_tokens(size_t len) { return len + 1; }

static size_t words_piece(const vocab_t *v, int32_t prev, int32_t id, char *buf)
{
    size_t at = 0;
    if (id != v->eos && prev >= 0 && prev != v->eos) buf[at++] = ' ';
    size_t l = strlen(v->tok[id]);
    memcpy(buf + at, v->tok[id], l + 1);
    return at + l;
}

const tokenizer tok_words = {"words", 0, words_parse, words_encode, words_max_tokens, words_piece};
