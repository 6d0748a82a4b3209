/*
 * fuzz_vocab.c - libFuzzer target for text -> tokens (`make fuzz`): every
 * prompt and scored text goes through vocab_encode, every training text
 * through utf8_decode. The first byte picks a vocabulary: a tiny model's
 * (tests/fuzz/models), or one parsed from the rest of the input when the
 * byte is odd (the JSON of a checkpoint's __metadata__.vocab) with a fixed
 * text. A refusal comes with a message; text that encodes decodes back to
 * the same bytes, and valid UTF-8 decodes code point by code point to
 * values below 0x110000 that are no surrogates.
 */
#include "fuzz_models.h"
#include "vocab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    char err[ERR_LEN];
    vocab_t own;
    const vocab_t *v;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char *json = NULL;
    if (data[0] & 1) {
        json = malloc(size);
        REQUIRE(json);
        memcpy(json, data + 1, size - 1);
        json[size - 1] = 0;
        err[0] = 0;
        if (vocab_parse(&own, json, err)) {
            REQUIRE(err[0] != 0);
            free(json);
            return 0;
        }
        v = &own;
        static const char fixed[] = "the cat sat on a mat\n";
        text = fixed;
        len = sizeof fixed - 1;
        for (int i = 0; i < v->n; i++) REQUIRE(vocab_id(v, v->cp[i]) == i);
    } else {
        fuzz_models_load();
        v = &fuzz_model(data[0] >> 1)->vocab;
    }
    for (size_t at = 0; at < len;) {
        uint32_t cp;
        int k = utf8_decode((const unsigned char *)text + at, len - at, &cp);
        if (!k) break;
        REQUIRE(k >= 1 && k <= 4 && (size_t)k <= len - at && cp < 0x110000 && (cp < 0xD800 || cp > 0xDFFF));
        at += (size_t)k;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    err[0] = 0;
    if (vocab_encode(v, text, len, &ids, &n, err) == 0) {
        char *back = malloc(len + 1);
        REQUIRE(back && n <= len);
        REQUIRE(vocab_decode(v, ids, n, back, len + 1) == (int)len && memcmp(back, text, len) == 0);
        free(back);
    } else {
        REQUIRE(err[0] != 0);
    }
    free(ids);
    if (json) {
        vocab_free(&own);
        free(json);
    }
    return 0;
}
