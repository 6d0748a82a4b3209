/*
 * tok_spm.c - SentencePiece vocabularies (config "tokenizer":
 * "sentencepiece"), through the SentencePiece library (spm.h): the model
 * file travels inside the checkpoint, __metadata__.vocab being the JSON
 * object {"sentencepiece": "<base64 of the .model file>"}.
 *
 * As seed 004's data pipeline (Jmkernes/PAR-Transformer-XL) reads text: each
 * line (split on \n) is encoded alone, without BOS or EOS, and the newlines
 * themselves are dropped. A token's text is what the library decodes: the
 * piece after the one before it (its leading "\xe2\x96\x81" a space, none at
 * the start of a stream; a control piece nothing, the unknown piece " \xe2\x81\x87 ").
 */
#include "err.h"
#include "spm.h"
#include "vocab.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Past these a file is not a tokenizer model of any trained model (the large
 * ones are a few MB, their pieces at most a few dozen bytes): they bound
 * what a piece's text costs each token of every answer. */
#define SPM_MAX_BYTES (64u << 20)
#define SPM_MAX_PIECE 1024
/* The most text a piece of N bytes adds to a stream (vocab_t.max_piece). */
#define SPM_PIECE_TEXT(n) (3 * ((size_t)(n) + 8))

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 (padding required) of LEN bytes at S into a malloc'd
 * buffer; its size into *N. NULL when S is not such base64. */
static unsigned char *b64_decode(const char *s, size_t len, size_t *n)
{
    if (len % 4) return NULL;
    size_t out = len / 4 * 3;
    if (len && s[len - 1] == '=') out--;
    if (len > 1 && s[len - 2] == '=') out--;
    unsigned char *b = malloc(out ? out : 1);
    if (!b) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++) {
            const int pad = s[i + j] == '=' && i + 4 == len && j >= 2 && (j == 3 || s[i + 3] == '=');
            v[j] = pad ? 0 : b64_value((unsigned char)s[i + j]);
            if (v[j] < 0) { free(b); return NULL; }
        }
        const unsigned w = (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 | (unsigned)v[3];
        const unsigned char t[3] = {(unsigned char)(w >> 16), (unsigned char)(w >> 8), (unsigned char)w};
        for (int j = 0; j < 3 && k < out; j++) b[k++] = t[j];
    }
    *n = out;
    return b;
}

static void spm_release(vocab_t *v)
{
    spm_free(v->spm);
    v->spm = NULL;
}

static int spm_parse(vocab_t *v, const char *text, char *err)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    json_t *s = json_object_get(o, "sentencepiece");
    if (!json_is_object(o) || !json_is_string(s) || json_object_size(o) != 1) {
        json_decref(o);
        return err_set(err, "a SentencePiece vocab must be the JSON object {\"sentencepiece\": \"<base64 of the "
                       "tokenizer's .model file>\"}");
    }
    size_t n = 0;
    const size_t len = json_string_length(s);
    unsigned char *bytes = len / 4 * 3 <= SPM_MAX_BYTES ? b64_decode(json_string_value(s), len, &n) : NULL;
    json_decref(o);
    if (!bytes) return err_set(err, "vocab's sentencepiece model is not standard base64 of at most %u bytes", SPM_MAX_BYTES);
    char e2[ERR_LEN];
    v->spm = spm_load(bytes, n, e2);
    free(bytes);
    v->release = spm_release;
    if (!v->spm) return err_set(err, "%s", e2);
    v->n = spm_size(v->spm);
    size_t longest = 0;
    for (int i = 0; i < v->n; i++) {
        char b[8];
        size_t l = spm_id_to_piece(v->spm, i, b, sizeof b);
        if (l > SPM_MAX_PIECE)
            return err_set(err, "the SentencePiece model's piece %d is %zu bytes long: at most %d", i, l, SPM_MAX_PIECE);
        longest = l > longest ? l : longest;
    }
    /* a piece's text is at most its own bytes, the unknown surface, or
     * replacement characters for bytes that are not UTF-8 alone */
    v->max_piece = SPM_PIECE_TEXT(longest);
    return 0;
}

/* LEN bytes at S into BUF (CAP bytes, CAP >= 3 * LEN + 1) with each byte
 * that does not begin valid UTF-8 a U+FFFD: the answers are JSON strings.
 * Its length. */
static size_t utf8_clean(const char *s, size_t len, char *buf, size_t cap)
{
    size_t at = 0;
    for (size_t i = 0; i < len && at + 4 <= cap;) {
        uint32_t cp;
        int m = utf8_decode((const unsigned char *)s + i, len - i, &cp);
        if (m) {
            memcpy(buf + at, s + i, (size_t)m);
            at += (size_t)m;
            i += (size_t)m;
        } else {
            memcpy(buf + at, "\xef\xbf\xbd", 3);
            at += 3;
            i++;
        }
    }
    buf[at] = 0;
    return at;
}

static size_t spm_piece(const vocab_t *v, int32_t prev, int32_t id, char *buf)
{
    /* on the stack: the decode step asks for a piece a token */
    char both[SPM_PIECE_TEXT(SPM_MAX_PIECE) + 1], one[SPM_PIECE_TEXT(SPM_MAX_PIECE) + 1];
    const size_t cap = v->max_piece + 1, room = v->max_piece / 3;
    /* the library's text of (prev, id) past its text of prev alone */
    const int32_t ids[2] = {prev, id};
    long l2 = prev >= 0 ? spm_decode(v->spm, ids, 2, both, cap) : spm_decode(v->spm, ids + 1, 1, both, cap);
    long l1 = prev >= 0 ? spm_decode(v->spm, ids, 1, one, cap) : 0;
    size_t n;
    if (l2 >= 0 && l1 >= 0 && l2 >= l1 && (size_t)l2 < cap && memcmp(both, one, (size_t)l1) == 0 &&
        (size_t)(l2 - l1) <= room) {
        n = utf8_clean(both + l1, (size_t)(l2 - l1), buf, cap);
    } else {   /* pieces the library joins (bytes of one character): the piece alone */
        long l = spm_decode(v->spm, ids + 1, 1, one, cap);
        n = l > 0 && (size_t)l <= room ? utf8_clean(one, (size_t)l, buf, cap) : 0;
        buf[n] = 0;
    }
    return n;
}

static long spm_encode_text(const vocab_t *v, const char *text, size_t len, int open, int32_t *ids, size_t *offs,
                            size_t cap, char *err)
{
    (void)open;   /* lines are encoded alone: a line that goes on is encoded as it stands */
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int m = utf8_decode((const unsigned char *)text + i, len - i, &cp);
        if (!m) return err_set(err, "invalid UTF-8 at byte %zu", i);
        i += (size_t)m;
    }
    size_t k = 0;
    for (size_t a = 0; a < len;) {
        const char *nl = memchr(text + a, '\n', len - a);
        const size_t b = nl ? (size_t)(nl - text) : len;
        if (b > a) {
            long n = spm_encode(v->spm, text + a, b - a, ids + k, offs + k, cap - k, err);
            if (n < 0) return -1;
            if ((size_t)n > cap - k) return err_set(err, "the text makes more than %zu tokens", cap);
            for (long j = 0; j < n; j++) offs[k + (size_t)j] += a;
            k += (size_t)n;
        }
        a = b + 1;
    }
    return (long)k;
}

/* Normalization can widen a character (NFKC); past this the text is refused. */
static size_t spm_max_tokens(size_t len) { return 4 * len + 4; }

const tokenizer tok_spm = {"sentencepiece", 0, spm_parse, spm_encode_text, spm_max_tokens, spm_piece};
