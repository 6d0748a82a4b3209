/*
 * fixtures.h - the tests' access to the small reference fixtures (from
 * ../shared, else tests/fixtures: ref_path in harness.h) and to the
 * validation text the reference scored.
 */
#ifndef SPANSERVE_TEST_FIXTURES_H
#define SPANSERVE_TEST_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "harness.h"
#include "model.h"

/* Whether M is an adaptive-span model (its memory and decode path differ). */
static inline int is_aspan(const model_t *m) { return strcmp(model_family_name(m), "adaptive-span") == 0; }

/* fixtures/NAME/FILE (a static buffer: use before the next call). */
static inline const char *fx(const char *name, const char *file)
{
    char rel[512];
    snprintf(rel, sizeof rel, "fixtures/%s/%s", name, file);
    return ref_path(rel);
}

/* The validation text: the last 10% of tiny_shakespeare.txt by characters
 * (the file is ASCII, so characters are bytes), as token ids. */
static inline int32_t *val_tokens(const model_t *m, size_t *n)
{
    char err[ERR_LEN];
    FILE *f = fopen(ref_path("data/tiny_shakespeare.txt"), "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len);
    size_t got = text ? fread(text, 1, (size_t)len, f) : 0;
    fclose(f);
    size_t start = (size_t)(0.9 * (double)got);
    int32_t *t = NULL;
    if (text && vocab_encode(&m->vocab, text + start, got - start, &t, n, err)) printf("note: %s\n", err);
    free(text);
    return t;
}

/* The word fixture's validation lines (fixtures/README.md, "txl-word"):
 * lines[FROM:] of the text split at newlines, each with its newline (the
 * last, empty after the file's final newline, too), as M's token ids. NULL
 * with ERR when the text is missing or does not encode. */
static inline int32_t *val_lines_tokens(const model_t *m, long from, size_t *n, char *err)
{
    FILE *f = fopen(ref_path("data/tiny_shakespeare.txt"), "rb");
    if (!f) return err_set(err, "no data/tiny_shakespeare.txt"), NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 2);
    size_t got = text ? fread(text, 1, (size_t)len, f) : 0, start = 0;
    fclose(f);
    if (!text) return err_set(err, "out of memory"), NULL;
    long line = 0;
    for (size_t i = 0; i < got && line < from; i++)
        if (text[i] == '\n') line++, start = i + 1;
    text[got] = '\n';
    int32_t *t = NULL;
    if (vocab_encode(&m->vocab, text + start, got + 1 - start, &t, n, err)) t = NULL;
    free(text);
    return t;
}

#endif
