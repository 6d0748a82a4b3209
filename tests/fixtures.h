/*
 * fixtures.h - the tests' access to ../shared: fixture paths and the
 * validation text the reference scored.
 */
#ifndef SPANSERVE_TEST_FIXTURES_H
#define SPANSERVE_TEST_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>

#include "err.h"
#include "harness.h"
#include "model.h"

/* SHARED/fixtures/NAME/FILE (a static buffer: use before the next call). */
static inline const char *fx(const char *name, const char *file)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/fixtures/%s/%s", shared_dir(), name, file);
    return path;
}

/* The validation text: the last 10% of tiny_shakespeare.txt by characters
 * (the file is ASCII, so characters are bytes), as token ids. */
static inline int32_t *val_tokens(const model_t *m, size_t *n)
{
    char p[1024], err[ERR_LEN];
    snprintf(p, sizeof p, "%s/data/tiny_shakespeare.txt", shared_dir());
    FILE *f = fopen(p, "rb");
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
