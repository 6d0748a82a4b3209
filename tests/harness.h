/*
 * harness.h - the tests' few macros. Each check prints one line when it
 * fails; test_summary() prints "N passed, N failed" for the binary and
 * returns its exit status. tests/run.sh adds the binaries' counts up.
 */
#ifndef SPANSERVE_HARNESS_H
#define SPANSERVE_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_pass, t_fail;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (cond) t_pass++;                                                       \
        else {                                                                    \
            t_fail++;                                                             \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
            printf(__VA_ARGS__);                                                  \
            printf("\n");                                                         \
        }                                                                         \
    } while (0)

#define CHECK_NEAR(a, b, tol, what)                                               \
    do {                                                                          \
        double a_ = (a), b_ = (b);                                                \
        CHECK(fabs(a_ - b_) <= (tol), "%s: %.9g vs %.9g (|diff| %.3g > %.3g)",   \
              what, a_, b_, fabs(a_ - b_), (double)(tol));                        \
    } while (0)

/* Where ../shared is: $SPANSERVE_SHARED, else ../shared from the repo root. */
static inline const char *shared_dir(void)
{
    const char *s = getenv("SPANSERVE_SHARED");
    return s && *s ? s : "../shared";
}

/* The reference data the core tests need, REL a path inside ../shared
 * ("fixtures/aspan-small/model.safetensors", "data/tiny_shakespeare.txt"):
 * SHARED/REL when it is there, else tests/REL, the copy a clone carries
 * (tests/fixtures/README.md). A static buffer: use before the next call. */
static inline const char *ref_path(const char *rel)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", shared_dir(), rel);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    else snprintf(path, sizeof path, "tests/%s", rel);
    return path;
}

/* SHARED/REL for what only ../shared has (the larger fixtures, the
 * benchmark's files), or NULL when it is not there: the caller prints a
 * "SKIP name: ..." line naming it. A static buffer, as ref_path's. */
static inline const char *shared_path(const char *rel)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", shared_dir(), rel);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fclose(f);
    return path;
}

static inline int test_summary(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, t_pass, t_fail);
    return t_fail ? 1 : 0;
}

#endif
