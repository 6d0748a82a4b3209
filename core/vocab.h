/*
 * vocab.h - the checkpoint's vocabulary: token id <-> the one character
 * (a UTF-8 code point) it stands for.
 */
#ifndef SPANSERVE_VOCAB_H
#define SPANSERVE_VOCAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n;
    char (*tok)[5];        /* token id -> NUL-terminated UTF-8 of its character */
    uint32_t *cp;          /* token id -> code point */
    int32_t *sorted;       /* token ids sorted by code point, for lookup */
    int32_t ascii[128];    /* code point -> id for ASCII, -1 if absent */
} vocab_t;

/* Builds from the JSON array text of __metadata__.vocab. */
int vocab_parse(vocab_t *v, const char *json_text, char *err);
void vocab_free(vocab_t *v);
/* The id of code point CP, or -1. */
int32_t vocab_id(const vocab_t *v, uint32_t cp);
/* Text (LEN bytes of UTF-8) -> token ids. *OUT is malloc'd (caller frees).
 * A character outside the vocabulary or invalid UTF-8 is an error naming the
 * byte offset. */
int vocab_encode(const vocab_t *v, const char *text, size_t len, int32_t **out, size_t *n, char *err);
/* Appends the characters of IDS to BUF (capacity CAP, NUL-terminated);
 * returns the bytes written, or -1 if it does not fit or an id is invalid. */
int vocab_decode(const vocab_t *v, const int32_t *ids, size_t n, char *buf, size_t cap);
/* Decodes one UTF-8 code point at S (LEN bytes left); returns its length in
 * bytes, or 0 if the bytes are not valid UTF-8. */
int utf8_decode(const unsigned char *s, size_t len, uint32_t *cp);

#endif
