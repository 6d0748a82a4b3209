/*
 * fuzz_st.c - libFuzzer target for the safetensors reader (`make fuzz`).
 *
 * Arbitrary bytes go to st_parse. A refusal must come with a message; an
 * accepted file is walked the way model_load walks it (every tensor, its
 * element count, its first and last byte, lookups by name and of metadata),
 * and the reader's promises are checked: each tensor lies inside the input,
 * its byte count is numel * dtype size, and the tensors tile the data.
 * tests/fuzz/corpus/ holds the seed files.
 */
#include "err.h"
#include "st.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c) do { if (!(c)) abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERR_LEN];
    err[0] = 0;
    st_file *f = st_parse(data, size, "fuzz", err);
    if (!f) {
        REQUIRE(strncmp(err, "fuzz: ", 6) == 0);
        return 0;
    }
    volatile unsigned sink = 0;
    size_t total = 0;
    int n = st_count(f);
    REQUIRE(n >= 0 && st_at(f, -1) == NULL && st_at(f, n) == NULL);
    for (int i = 0; i < n; i++) {
        const st_tensor *t = st_at(f, i);
        REQUIRE(t != NULL && t->name != NULL);
        REQUIRE(t->dtype < ST_NDTYPES && t->ndim >= 0 && t->ndim <= ST_MAX_DIM);
        int64_t numel = st_numel(t);
        REQUIRE(numel >= 0);
        REQUIRE((uint64_t)numel * st_dtype_size(t->dtype) == t->nbytes);
        const uint8_t *p = t->data;
        REQUIRE(p >= data && t->nbytes <= size && p - data <= (ptrdiff_t)(size - t->nbytes));
        if (t->nbytes) sink += p[0] + p[t->nbytes - 1];
        REQUIRE(st_find(f, t->name) == t);
        sink += (unsigned)strlen(st_dtype_name(t->dtype));
        total += t->nbytes;
    }
    /* the tensors tile the data: their bytes add up to what follows the header */
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | data[i];
    REQUIRE(hl <= size - 8 && total == size - 8 - hl);
    const char *keys[] = {"config", "vocab", "format", "", "__metadata__"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *v = st_meta(f, keys[k]);
        if (v) sink += (unsigned)strlen(v);
    }
    if (n > 0) {
        const char *v = st_meta(f, st_at(f, 0)->name);
        if (v) sink += (unsigned)strlen(v);
    }
    (void)sink;
    st_close(f);
    return 0;
}
