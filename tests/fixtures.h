/*
 * fixtures.h - the tests' access to the small reference fixtures (from
 * ../shared, else tests/fixtures: ref_path in harness.h) and to the
 * validation text the reference scored.
 */
#ifndef SPANSERVE_TEST_FIXTURES_H
#define SPANSERVE_TEST_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>

#include "err.h"
#include "harness.h"
#include "model.h"

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

#endif
