/*
 * fuzz_vocab.c - libFuzzer target for text -> tokens (`make fuzz`): every
 * prompt and scored text goes through vocab_encode, every training text
 * through utf8_decode. The first byte picks a vocabulary: a tiny model's
 * (tests/fuzz/models), or one parsed from the rest of the input when the
 * byte is odd (the JSON of a checkpoint's __metadata__.vocab) with a fixed
 * text. A refusal comes with a message; text that encodes decodes back to
 * the same bytes, and valid UTF-8 decodes code point by code point to
 * values below 0x110000 that are no surrogates.
 * With the first byte 2 or 3 mod 4 the vocabulary is words instead (a fixed
 * one for the input's text, or one parsed from the input with a fixed
 * text): every valid UTF-8 text encodes (unknown words are <unk>), as a
 * whole text and as a prompt; offsets rise and point at each word as the
 * vocabulary spells it; the ids' text encodes back to the same ids.
 * With the first byte 0xF0 or above, SentencePiece (tests/fixtures/tiny-spm.model
 * through the library): the rest is a text (even byte) that encodes or is
 * refused with a message, ids in range, offsets rising inside the text, and
 * decodes piece by piece to valid UTF-8; or (odd byte) the bytes of a
 * tokenizer model, refused with a message or encoding a fixed text so.
 */
#include "fuzz_models.h"
#include "vocab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* vocab JSON {"sentencepiece": base64 of the N bytes at B} (malloc'd) */
static char *spm_vocab_json(const unsigned char *b, size_t n)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *j = malloc(n / 3 * 4 + 40), *o = j;
    REQUIRE(j);
    o += sprintf(o, "{\"sentencepiece\": \"");
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)b[i] << 16 | (i + 1 < n ? (unsigned)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        *o++ = a[v >> 18 & 63];
        *o++ = a[v >> 12 & 63];
        *o++ = i + 1 < n ? a[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? a[v & 63] : '=';
    }
    strcpy(o, "\"}");
    return j;
}

/* TEXT through a SentencePiece vocabulary: encodes (or a message), ids and
 * offsets in range and rising, every piece valid UTF-8 within max_piece. */
static void check_spm(const vocab_t *v, const char *text, size_t len)
{
    char err[ERR_LEN];
    int32_t *ids = NULL;
    size_t *offs = NULL, n = 0;
    err[0] = 0;
    if (vocab_encode_offsets(v, text, len, 0, &ids, &offs, &n, err)) {
        REQUIRE(err[0] != 0);
        return;
    }
    char *piece = malloc(vocab_max_piece(v) + 1);
    REQUIRE(piece);
    for (size_t i = 0; i < n; i++) {
        REQUIRE(ids[i] >= 0 && ids[i] < v->n && offs[i] <= len && (i == 0 || offs[i] >= offs[i - 1]));
        size_t l = vocab_piece(v, i ? ids[i - 1] : -1, ids[i], piece);
        REQUIRE(l <= vocab_max_piece(v) && piece[l] == 0);
        for (size_t at = 0; at < l;) {
            uint32_t cp;
            int k = utf8_decode((const unsigned char *)piece + at, l - at, &cp);
            REQUIRE(k > 0);
            at += (size_t)k;
        }
    }
    free(piece);
    free(ids);
    free(offs);
}

static void fuzz_spm(const uint8_t *data, size_t size)
{
    static vocab_t tiny;
    static int loaded;
    char err[ERR_LEN];
    if (!loaded) {
        FILE *f = fopen("tests/fixtures/tiny-spm.model", "rb");
        unsigned char buf[1 << 16];
        size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
        REQUIRE(f && n > 0 && n < sizeof buf);
        fclose(f);
        char *j = spm_vocab_json(buf, n);
        REQUIRE(vocab_parse_kind(&tiny, vocab_kind("sentencepiece"), j, err) == 0);
        free(j);
        loaded = 1;
    }
    if (!(data[0] & 1)) {
        check_spm(&tiny, (const char *)data + 1, size - 1);
        return;
    }
    char *j = spm_vocab_json(data + 1, size - 1);
    vocab_t v;
    err[0] = 0;
    if (vocab_parse_kind(&v, vocab_kind("sentencepiece"), j, err) == 0) {
        static const char fixed[] = "the cat sat\non a mat \xc3\xa9t\xc3\xa9\n";
        check_spm(&v, fixed, sizeof fixed - 1);
        vocab_free(&v);
    } else {
        REQUIRE(err[0] != 0);
    }
    free(j);
}

static void check_words(const vocab_t *v, const char *text, size_t len)
{
    char err[ERR_LEN];
    for (int open = 0; open < 2; open++) {
        int32_t *ids = NULL;
        size_t *offs = NULL, n = 0;
        err[0] = 0;
        if (vocab_encode_offsets(v, text, len, open, &ids, &offs, &n, err)) {
            /* only invalid UTF-8 is refused, or an unknown word where there is no <unk> */
            REQUIRE(err[0] != 0 && (strstr(err, "UTF-8") || (v->unk < 0 && strstr(err, "no <unk>"))));
            return;
        }
        REQUIRE(n <= len + 1);
        for (size_t i = 0; i < n; i++) {
            REQUIRE(ids[i] >= 0 && ids[i] < v->n && offs[i] <= len && (i == 0 || offs[i] > offs[i - 1]));
            if (ids[i] == v->eos)   /* a line's end, or the word <eos> written out (the reference reads it so) */
                REQUIRE(offs[i] == len || text[offs[i]] == '\n' || text[offs[i]] == '\r' ||
                        (len - offs[i] >= 5 && memcmp(text + offs[i], "<eos>", 5) == 0));
            else if (ids[i] != v->unk) REQUIRE(strncmp(text + offs[i], v->tok[ids[i]], strlen(v->tok[ids[i]])) == 0);
        }
        if (!open && len) REQUIRE(n && ids[n - 1] == v->eos);
        if (!open) {   /* the ids' text reads back as the same ids */
            size_t cap = n * (vocab_max_piece(v) + 1) + 1;
            char *back = malloc(cap);
            REQUIRE(back);
            int bl = vocab_decode(v, ids, n, back, cap);
            REQUIRE(bl >= 0);
            int32_t *again = NULL;
            size_t m = 0;
            REQUIRE(vocab_encode(v, back, (size_t)bl, &again, &m, err) == 0);
            REQUIRE(m == n && memcmp(again, ids, n * sizeof *ids) == 0);
            free(again);
            free(back);
        }
        free(ids);
        free(offs);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (data[0] >= 0xF0) {
        fuzz_spm(data, size);
        return 0;
    }
    if ((data[0] & 3) >= 2) {   /* words */
        char err[ERR_LEN];
        vocab_t w;
        static const char fixed_vocab[] = "[\"<eos>\", \"<unk>\", \"the\", \"cat\", \"sat\", \"\u00e9t\u00e9\", \"a\", \"<\"]";
        static const char fixed_text[] = "the cat  sat\ton a\r\nmat\r\xc3\xa9t\xc3\xa9 <\n\n";
        const char *text = (const char *)data + 1;
        size_t len = size - 1;
        char *json = NULL;
        if (data[0] & 1) {
            json = malloc(size);
            REQUIRE(json);
            memcpy(json, data + 1, size - 1);
            json[size - 1] = 0;
            err[0] = 0;
            if (vocab_parse_kind(&w, vocab_kind("words"), json, err)) {
                REQUIRE(err[0] != 0);
                free(json);
                return 0;
            }
            text = fixed_text;
            len = sizeof fixed_text - 1;
        } else {
            REQUIRE(vocab_parse_kind(&w, vocab_kind("words"), fixed_vocab, err) == 0);
        }
        check_words(&w, text, len);
        vocab_free(&w);
        free(json);
        return 0;
    }
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
        if (v->kind != vocab_kind("chars")) {   /* the SentencePiece model's */
            check_spm(v, text, len);
            return 0;
        }
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
