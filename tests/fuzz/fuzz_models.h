/*
 * fuzz_models.h - the tiny models the fuzz targets run (tests/fuzz/models,
 * or $FUZZ_MODELS): fuzz_model(k) is adaptive-span with exact memory, with
 * span memory, PAR, the GPT with adaptive spans or nanoGPT (window models
 * of 8 tokens), or seed 004's TensorFlow PAR with SentencePiece pieces, by
 * k % FUZZ_N_MODELS. Loaded once; a model that does not load
 * stops the fuzzer (the seeds would mean nothing).
 */
#ifndef SPANSERVE_FUZZ_MODELS_H
#define SPANSERVE_FUZZ_MODELS_H

#include "err.h"
#include "model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(c) do { if (!(c)) abort(); } while (0)

#define FUZZ_N_MODELS 6
static model_t *fuzz_models[FUZZ_N_MODELS];

static void fuzz_models_load(void)
{
    if (fuzz_models[0]) return;
    const char *dir = getenv("FUZZ_MODELS");
    if (!dir) dir = "tests/fuzz/models";
    static const char *files[FUZZ_N_MODELS] = {"tiny-aspan", "tiny-aspan", "tiny-par", "tiny-gpt-aspan", "tiny-nanogpt",
                                                     "tiny-par-tf"};
    for (int i = 0; i < FUZZ_N_MODELS; i++) {
        char path[1024], err[ERR_LEN];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, files[i]);
        fuzz_models[i] = model_load_mode(path, i == 1 ? MEM_SPAN : MEM_EXACT, err);
        if (!fuzz_models[i]) {
            fprintf(stderr, "fuzz: %s\n", err);
            exit(2);
        }
    }
}

static const model_t *fuzz_model(unsigned k) { return fuzz_models[k % FUZZ_N_MODELS]; }

#endif
