/*
 * fuzz_model.c - libFuzzer target for model loading (`make fuzz`): a
 * checkpoint as POST /v1/models reads one (safetensors header, config,
 * vocabulary, every tensor's dtype and shape, the derived sizes), from a
 * memory file. The first byte's low bit picks the memory mode (exact or
 * span). A refusal must come with a message naming the file; a model that
 * loads gets a fresh stream's memory and a forward of three tokens. The
 * seeds are the tiny models of tests/fuzz/models.
 */
#define _GNU_SOURCE
#include "err.h"
#include "model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define REQUIRE(c) do { if (!(c)) abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int fd = memfd_create("fuzz-model", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, data + 1, size - 1) == (ssize_t)(size - 1));
    char path[64], err[ERR_LEN];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    err[0] = 0;
    model_t *m = model_load_mode(path, data[0] & 1 ? MEM_SPAN : MEM_EXACT, err);
    close(fd);
    if (!m) {
        REQUIRE(err[0] != 0 && (strstr(err, path) || strstr(err, "out of memory")));
        return 0;
    }
    mem_t *s = mem_new(m);
    fwd_ws *ws = ws_new();
    float *lp = malloc(3 * (size_t)m->V * sizeof *lp);
    REQUIRE(s && ws && lp);
    int32_t toks[3] = {0, (int32_t)(size % (size_t)m->V), m->V - 1};
    REQUIRE(model_forward(m, &s, 1, toks, 3, lp, ws, err) == 0);
    free(lp);
    ws_free(ws);
    mem_free(s);
    model_free(m);
    return 0;
}
