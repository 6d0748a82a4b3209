/*
 * fuzz_config.c - libFuzzer target for the trainer's config parser (`make
 * fuzz`): the "config" a training job submits. A refusal must come with a
 * message naming it; a config that parses and passes train_cfg_check
 * writes itself out (train_cfg_json) as a JSON text that parses back to the
 * same config and the same text.
 */
#include "err.h"
#include "train.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(c) do { if (!(c)) abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1), err[ERR_LEN];
    REQUIRE(text);
    memcpy(text, data, size);
    text[size] = 0;
    train_cfg c, d;
    err[0] = 0;
    if (train_cfg_from_json(&c, text, "fuzz", err) || train_cfg_check(&c, err)) {
        REQUIRE(strncmp(err, "fuzz: ", 6) == 0 || err[0] != 0);
        free(text);
        return 0;
    }
    char *a = train_cfg_json(&c);
    REQUIRE(a != NULL);
    REQUIRE(train_cfg_from_json(&d, a, "again", err) == 0 && train_cfg_check(&d, err) == 0);
    char *b = train_cfg_json(&d);
    REQUIRE(b != NULL && strcmp(a, b) == 0);
    free(a);
    free(b);
    free(text);
    return 0;
}
