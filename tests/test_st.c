/*
 * test_st.c - core/st.c: what the writer saves the reader gives back (every
 * dtype, shapes, metadata, a zero-size tensor, the 8-byte padding of the
 * header), and every way a file can be wrong is refused with a message that
 * names the problem. Malformed files are built as byte buffers in memory and
 * given to st_parse; a few go to a temporary directory for st_open.
 */
#define _POSIX_C_SOURCE 200809L
#include "err.h"
#include "harness.h"
#include "st.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[512];

static const char *tmp_path(const char *name)
{
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return p;
}

/* An image: 8-byte little-endian LENGTH, the header HDR (strlen bytes), then
 * NDATA data bytes 0, 1, 2, ... Caller frees. */
static unsigned char *image_len(uint64_t length, const char *hdr, size_t ndata, size_t *len)
{
    size_t hl = strlen(hdr);
    *len = 8 + hl + ndata;
    unsigned char *b = malloc(*len + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(length >> (8 * i));
    memcpy(b + 8, hdr, hl);
    for (size_t i = 0; i < ndata; i++) b[8 + hl + i] = (unsigned char)i;
    return b;
}

static unsigned char *image(const char *hdr, size_t ndata, size_t *len)
{
    return image_len(strlen(hdr), hdr, ndata, len);
}

static int write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t k = len ? fwrite(buf, 1, len, f) : 0;
    return fclose(f) == 0 && k == len ? 0 : -1;
}

/* st_parse must refuse BUF with a message that contains NEEDLE (and the
 * label, so the caller can tell which file it was). */
static void reject_buf(const char *what, const unsigned char *buf, size_t len, const char *needle)
{
    char err[ERR_LEN] = "";
    st_file *f = st_parse(buf, len, "img", err);
    CHECK(f == NULL, "%s: accepted", what);
    CHECK(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err, needle);
    CHECK(strncmp(err, "img: ", 5) == 0, "%s: message '%s' does not start with the label", what, err);
    st_close(f);
}

static void reject(const char *what, const char *hdr, size_t ndata, const char *needle)
{
    size_t len;
    unsigned char *b = image(hdr, ndata, &len);
    reject_buf(what, b, len, needle);
    free(b);
}

static st_file *accept(const char *what, const char *hdr, size_t ndata, unsigned char **keep)
{
    char err[ERR_LEN] = "";
    size_t len;
    *keep = image(hdr, ndata, &len);
    st_file *f = st_parse(*keep, len, "img", err);
    CHECK(f != NULL, "%s: refused: %s", what, err);
    return f;
}

/* ------------------------------------------------------------ round trip */

static void test_round_trip(void)
{
    /* one tensor of every dtype, distinct bytes in each */
    static const struct { const char *name; st_dtype dt; int ndim; int64_t shape[3]; } T[] = {
        {"f64", ST_F64, 2, {2, 3}},  {"f32", ST_F32, 1, {5}},      {"f16", ST_F16, 2, {2, 2}},
        {"bf16", ST_BF16, 1, {3}},   {"i64", ST_I64, 1, {2}},      {"i32", ST_I32, 3, {2, 1, 2}},
        {"i16", ST_I16, 1, {5}},     {"i8", ST_I8, 1, {7}},        {"u64", ST_U64, 1, {1}},
        {"u32", ST_U32, 1, {3}},     {"u16", ST_U16, 1, {2}},      {"u8", ST_U8, 1, {9}},
        {"bool", ST_BOOL, 1, {3}},   {"empty", ST_F32, 2, {0, 5}}, {"scalar", ST_F32, 0, {0}},
        {"layers.0.attn.proj_key.weight", ST_F32, 2, {3, 2}},
    };
    enum { NT = sizeof T / sizeof T[0] };
    unsigned char *data[NT];
    size_t nbytes[NT], total = 0;
    char err[ERR_LEN] = "";
    st_writer *w = st_writer_new();
    CHECK(w != NULL, "st_writer_new");
    for (int i = 0; i < NT; i++) {
        int64_t n = 1;
        for (int d = 0; d < T[i].ndim; d++) n *= T[i].shape[d];
        nbytes[i] = (size_t)n * st_dtype_size(T[i].dt);
        total += nbytes[i];
        data[i] = malloc(nbytes[i] + 1);
        for (size_t j = 0; j < nbytes[i]; j++) data[i][j] = (unsigned char)(31 * i + 7 * j + 1);
        CHECK(st_writer_add(w, T[i].name, T[i].dt, T[i].ndim, T[i].shape, data[i]) == 0, "add %s", T[i].name);
    }
    const char *odd = "quote \" backslash \\ newline \n tab \t and \xc3\xa9\xe2\x82\xac";
    CHECK(st_writer_meta(w, "config", "{\"hidden_size\": 128}") == 0, "meta config");
    CHECK(st_writer_meta(w, "odd", odd) == 0, "meta odd");
    CHECK(st_writer_meta(w, "empty", "") == 0, "meta empty");
    /* the writer refuses what no reader could read back */
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(st_writer_add(w, "nine", ST_F32, 9, nine, data[0]) != 0, "9 dims accepted");
    CHECK(st_writer_add(w, "bad", ST_NDTYPES, 1, nine, data[0]) != 0, "dtype ST_NDTYPES accepted");
    const char *path = tmp_path("rt.safetensors");
    CHECK(st_writer_save(w, path, err) == 0, "save: %s", err);

    /* the raw layout: header length a multiple of 8, padded with spaces, the
     * data right after it and nothing else */
    FILE *fp = fopen(path, "rb");
    unsigned char lenb[8] = {0};
    CHECK(fp && fread(lenb, 1, 8, fp) == 8, "read length");
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | lenb[i];
    CHECK(hl % 8 == 0, "header length %llu is not a multiple of 8", (unsigned long long)hl);
    CHECK((8 + hl) % 8 == 0, "data starts at %llu", (unsigned long long)(8 + hl));
    char *hdr = calloc(1, (size_t)hl + 1);
    CHECK(fp && fread(hdr, 1, (size_t)hl, fp) == hl, "read header");
    CHECK(hdr[0] == '{', "header starts with '%c'", hdr[0]);
    size_t end = strlen(hdr);
    while (end > 0 && hdr[end - 1] == ' ') end--;
    CHECK(end > 0 && hdr[end - 1] == '}', "header does not end with '}' before its padding");
    CHECK(hl - end < 8, "%llu bytes of padding", (unsigned long long)(hl - end));
    free(hdr);
    if (fp) fclose(fp);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (uint64_t)sb.st_size == 8 + hl + total, "file size %lld, expected %llu",
          (long long)sb.st_size, (unsigned long long)(8 + hl + total));

    st_file *f = st_open(path, err);
    CHECK(f != NULL, "open: %s", err);
    if (f) {
        CHECK(st_count(f) == NT, "count %d, expected %d", st_count(f), NT);
        for (int i = 0; i < NT; i++) {
            const st_tensor *t = st_find(f, T[i].name);
            CHECK(t != NULL, "tensor %s not found", T[i].name);
            if (!t) continue;
            CHECK(strcmp(t->name, T[i].name) == 0, "name %s", t->name);
            CHECK(t->dtype == T[i].dt, "%s dtype %s", T[i].name, st_dtype_name(t->dtype));
            CHECK(t->ndim == T[i].ndim, "%s ndim %d vs %d", T[i].name, t->ndim, T[i].ndim);
            int same = 1;
            for (int d = 0; d < T[i].ndim; d++) same &= t->shape[d] == T[i].shape[d];
            CHECK(same, "%s shape differs", T[i].name);
            CHECK(t->nbytes == nbytes[i], "%s nbytes %zu vs %zu", T[i].name, t->nbytes, nbytes[i]);
            CHECK((size_t)st_numel(t) * st_dtype_size(t->dtype) == nbytes[i], "%s numel %lld", T[i].name,
                  (long long)st_numel(t));
            CHECK(nbytes[i] == 0 || memcmp(t->data, data[i], nbytes[i]) == 0, "%s bytes differ", T[i].name);
        }
        /* the first tensor's data begins the data section, which the padding
         * put at an 8-byte aligned offset of the page-aligned mapping */
        const st_tensor *t0 = st_find(f, T[0].name);
        CHECK(t0 && (uintptr_t)t0->data % 8 == 0, "data section not 8-aligned in the mapping");
        CHECK(st_numel(st_find(f, "scalar")) == 1, "a 0-dim tensor holds one element");
        CHECK(st_numel(st_find(f, "empty")) == 0, "a [0, 5] tensor holds none");
        CHECK(st_find(f, "nine") == NULL && st_find(f, "bad") == NULL, "refused tensors were saved");
        CHECK(st_find(f, "F32") == NULL && st_find(f, "") == NULL, "found a tensor that is not there");
        CHECK(st_at(f, -1) == NULL && st_at(f, NT) == NULL, "st_at out of range gives a tensor");
        CHECK(st_at(f, 0) != NULL && st_at(f, NT - 1) != NULL, "st_at in range gives none");
        const char *c = st_meta(f, "config"), *o = st_meta(f, "odd"), *e = st_meta(f, "empty");
        CHECK(c && strcmp(c, "{\"hidden_size\": 128}") == 0, "config meta '%s'", c ? c : "(null)");
        CHECK(o && strcmp(o, odd) == 0, "odd meta '%s'", o ? o : "(null)");
        CHECK(e && strcmp(e, "") == 0, "empty meta");
        CHECK(st_meta(f, "vocab") == NULL, "absent key found");
        st_close(f);
    }

    /* saving again replaces the file whole */
    st_writer *w2 = st_writer_new();
    float one = 1.5f;
    int64_t s1 = 1;
    CHECK(st_writer_add(w2, "only", ST_F32, 1, &s1, &one) == 0, "add only");
    CHECK(st_writer_save(w2, path, err) == 0, "save again: %s", err);
    f = st_open(path, err);
    CHECK(f && st_count(f) == 1 && st_meta(f, "config") == NULL, "second save not read back: %s", f ? "" : err);
    const st_tensor *t = f ? st_find(f, "only") : NULL;
    float back = 0;
    if (t) memcpy(&back, t->data, 4);
    CHECK(t && back == 1.5f, "value %g", (double)back);
    st_close(f);
    CHECK(st_writer_save(w2, "/nonexistent-dir/x.safetensors", err) != 0, "saved into a missing directory");
    CHECK(strstr(err, "cannot create") != NULL, "message '%s'", err);
    st_writer_free(w2);
    unlink(path);

    st_writer_free(w);
    for (int i = 0; i < NT; i++) free(data[i]);
}

static void test_dtype_table(void)
{
    static const char *names[ST_NDTYPES] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16",
                                            "I8",  "U64", "U32", "U16", "U8",  "BOOL"};
    static const size_t sizes[ST_NDTYPES] = {8, 4, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1, 1};
    for (int d = 0; d < ST_NDTYPES; d++) {
        CHECK(strcmp(st_dtype_name((st_dtype)d), names[d]) == 0, "dtype %d name %s", d, st_dtype_name((st_dtype)d));
        CHECK(st_dtype_size((st_dtype)d) == sizes[d], "dtype %s size %zu", names[d], st_dtype_size((st_dtype)d));
    }
    CHECK(strcmp(st_dtype_name(ST_NDTYPES), "?") == 0 && st_dtype_size(ST_NDTYPES) == 0, "out-of-range dtype");
}

/* ------------------------------------------------------------ valid edge cases */

static void test_accepts(void)
{
    unsigned char *b;
    st_file *f = accept("empty object", "{}", 0, &b);
    CHECK(f && st_count(f) == 0 && st_meta(f, "x") == NULL, "empty object");
    st_close(f);
    free(b);

    f = accept("metadata only", "{\"__metadata__\":{\"a\":\"b\"}}", 0, &b);
    CHECK(f && st_count(f) == 0 && st_meta(f, "a") && strcmp(st_meta(f, "a"), "b") == 0, "metadata only");
    st_close(f);
    free(b);

    /* a header padded with spaces, as writers do */
    f = accept("padded", "{\"t\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}      ", 3, &b);
    CHECK(f && st_count(f) == 1 && st_find(f, "t") && st_find(f, "t")->nbytes == 3, "padded header");
    if (f) CHECK(((const unsigned char *)st_find(f, "t")->data)[2] == 2, "data byte");
    st_close(f);
    free(b);

    /* tensors listed out of data order; a zero-size tensor between two */
    f = accept("unordered",
               "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
               "\"z\":{\"dtype\":\"I64\",\"shape\":[3,0,2],\"data_offsets\":[4,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
               8, &b);
    CHECK(f && st_count(f) == 3, "unordered: count");
    if (f) {
        const st_tensor *a = st_find(f, "a"), *bb = st_find(f, "b"), *z = st_find(f, "z");
        CHECK(a && bb && z, "unordered: names");
        if (a && bb && z) {
            CHECK(((const unsigned char *)bb->data)[0] == 4, "b starts at data byte 4");
            CHECK(((const unsigned char *)a->data)[0] == 0, "a starts at data byte 0");
            CHECK(z->nbytes == 0 && st_numel(z) == 0 && z->ndim == 3 && z->shape[2] == 2, "zero-size tensor");
        }
    }
    st_close(f);
    free(b);

    /* a zero-size tensor at the very end of the data, and one alone */
    f = accept("zero at end",
               "{\"a\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]},"
               "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
               4, &b);
    CHECK(f && st_find(f, "z") && st_find(f, "z")->nbytes == 0, "zero at end");
    st_close(f);
    free(b);

    /* st_parse never writes through a NULL message buffer */
    size_t len;
    b = image("{", 0, &len);
    CHECK(st_parse(b, len, "img", NULL) == NULL, "bad image accepted with err NULL");
    free(b);
}

/* ------------------------------------------------------------ refusals */

#define ENT(name, dtype, shape, offs) "\"" name "\":{\"dtype\":" dtype ",\"shape\":" shape ",\"data_offsets\":" offs "}"

static void test_rejects_framing(void)
{
    unsigned char buf[16] = {0};
    reject_buf("empty", buf, 0, "truncated");
    reject_buf("5 bytes", (const unsigned char *)"\x02\0\0\0\0", 5, "truncated");
    reject_buf("7 bytes", buf, 7, "truncated");
    size_t len;
    unsigned char *b = image_len(100, "{}", 8, &len);
    reject_buf("length 100, 10 bytes follow", b, len, "past the end");
    free(b);
    b = image_len(3, "{}", 0, &len);
    reject_buf("length one past the end", b, len, "past the end");
    free(b);
    b = image_len(1ULL << 63, "{}", 0, &len);
    reject_buf("length 2^63", b, len, "past the end");
    free(b);
    b = image_len(UINT64_MAX, "{}", 0, &len);
    reject_buf("length 2^64-1", b, len, "past the end");
    free(b);
    b = image_len(0, "", 8, &len);
    reject_buf("length 0", b, len, "cannot hold a JSON object");
    free(b);
    b = image_len(1, "{", 0, &len);
    reject_buf("length 1", b, len, "cannot hold a JSON object");
    free(b);
    /* a length past ST_MAX_HEADER in a file that is long enough: refused
     * from the length field alone (calloc's zero pages are never touched) */
    size_t big = (size_t)ST_MAX_HEADER + 64;
    unsigned char *huge = calloc(1, big);
    if (huge) {
        uint64_t n = (uint64_t)ST_MAX_HEADER + 1;
        for (int i = 0; i < 8; i++) huge[i] = (unsigned char)(n >> (8 * i));
        reject_buf("length over ST_MAX_HEADER", huge, big, "over the limit");
        free(huge);
    }
}

static void test_rejects_header(void)
{
    reject("invalid JSON", "{\"a\":", 0, "not valid JSON");
    reject("garbage", "\x01\x02\x03\xff", 0, "not valid JSON");
    reject("trailing garbage in header", "{} x", 0, "not valid JSON");
    reject("JSON array", "[1,2]", 0, "not a JSON object");
    reject("JSON string", "\"abc\"", 0, "not valid JSON");
    reject("NUL inside header", "{\"a\\u0000b\":{}}", 0, "not valid JSON");
    reject("duplicate tensor key", "{" ENT("a", "\"U8\"", "[1]", "[0,1]") "," ENT("a", "\"U8\"", "[1]", "[1,2]") "}",
           2, "duplicate");
    reject("duplicate metadata key", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate");
    reject("duplicate key is not valid JSON",
           "{" ENT("a", "\"U8\"", "[1]", "[0,1]") "," ENT("a", "\"U8\"", "[1]", "[1,2]") "}", 2, "not valid JSON");
    reject("__metadata__ array", "{\"__metadata__\":[\"a\"]}", 0, "__metadata__ is not an object");
    reject("__metadata__ string", "{\"__metadata__\":\"a\"}", 0, "__metadata__ is not an object");
    reject("__metadata__ number value", "{\"__metadata__\":{\"k\":1}}", 0, "__metadata__['k'] is not a string");
    reject("__metadata__ object value", "{\"__metadata__\":{\"ok\":\"x\",\"cfg\":{\"a\":1}}}", 0,
           "__metadata__['cfg'] is not a string");
    reject("__metadata__ null value", "{\"__metadata__\":{\"n\":null}}", 0, "is not a string");

    reject("entry is an array", "{\"t\":[1,2]}", 0, "tensor 't': header entry is not an object");
    reject("entry is a string", "{\"t\":\"F32\"}", 0, "header entry is not an object");
    reject("missing dtype", "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 't': missing or non-string dtype");
    reject("numeric dtype", "{" ENT("t", "4", "[1]", "[0,4]") "}", 4, "missing or non-string dtype");
    reject("unknown dtype", "{" ENT("t", "\"F8\"", "[1]", "[0,1]") "}", 1, "unknown dtype 'F8'");
    reject("lower-case dtype", "{" ENT("t", "\"f32\"", "[1]", "[0,4]") "}", 4, "unknown dtype 'f32'");
    reject("empty dtype", "{" ENT("t", "\"\"", "[1]", "[0,4]") "}", 4, "unknown dtype");

    reject("shape missing", "{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, "shape must be an array");
    reject("shape a number", "{" ENT("t", "\"U8\"", "1", "[0,1]") "}", 1, "shape must be an array");
    reject("shape an object", "{" ENT("t", "\"U8\"", "{\"0\":1}", "[0,1]") "}", 1, "shape must be an array");
    reject("shape negative", "{" ENT("t", "\"U8\"", "[2,-1]", "[0,1]") "}", 1,
           "shape[1] is not a non-negative integer");
    reject("shape real", "{" ENT("t", "\"U8\"", "[1.0]", "[0,1]") "}", 1, "shape[0] is not a non-negative integer");
    reject("shape string", "{" ENT("t", "\"U8\"", "[\"1\"]", "[0,1]") "}", 1, "shape[0] is not a non-negative integer");
    reject("shape null", "{" ENT("t", "\"U8\"", "[null]", "[0,1]") "}", 1, "not a non-negative integer");
    reject("shape of 9 dims", "{" ENT("t", "\"U8\"", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1, "at most 8");
    reject("shape beyond int64", "{" ENT("t", "\"U8\"", "[99999999999999999999]", "[0,1]") "}", 1, "not valid JSON");
    reject("shape far larger than the data", "{" ENT("t", "\"F32\"", "[1000000]", "[0,4]") "}", 4,
           "shape is larger than the file's data");
    reject("shape whose product overflows", "{" ENT("t", "\"F64\"", "[4294967296,4294967296,4294967296]", "[0,8]") "}",
           8, "shape is larger than the file's data");
    reject("shape one past the data", "{" ENT("t", "\"F32\"", "[2]", "[0,4]") "}", 4,
           "shape needs more bytes than the file's data holds");

    reject("offsets missing", "{\"t\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "data_offsets must be two integers");
    reject("offsets of one", "{" ENT("t", "\"U8\"", "[1]", "[1]") "}", 1, "data_offsets must be two integers");
    reject("offsets of three", "{" ENT("t", "\"U8\"", "[1]", "[0,1,1]") "}", 1, "data_offsets must be two integers");
    reject("offsets real", "{" ENT("t", "\"U8\"", "[1]", "[0,1.0]") "}", 1, "data_offsets must be two integers");
    reject("offsets object", "{" ENT("t", "\"U8\"", "[1]", "{\"a\":0}") "}", 1, "data_offsets must be two integers");
    reject("offsets decreasing", "{" ENT("t", "\"U8\"", "[0]", "[4,2]") "}", 4, "[4, 2] are not an increasing pair");
    reject("offsets negative", "{" ENT("t", "\"U8\"", "[2]", "[-2,0]") "}", 4, "not an increasing pair");
    reject("offsets past the end", "{" ENT("t", "\"F32\"", "[1]", "[4,8]") "}", 4, "end 8 is past the end of the data");
    reject("offsets far past the end", "{" ENT("t", "\"U8\"", "[0]", "[9223372036854775807,9223372036854775807]") "}",
           4, "past the end of the data");
    reject("bytes do not match shape", "{" ENT("t", "\"F32\"", "[2]", "[0,4]") "}", 8,
           "F32 shape needs 8 bytes but data_offsets give 4");
    reject("bytes of a zero-size tensor", "{" ENT("t", "\"F32\"", "[0,3]", "[0,4]") "}", 4,
           "needs 0 bytes but data_offsets give 4");

    reject("overlap", "{" ENT("a", "\"F32\"", "[2]", "[0,8]") "," ENT("b", "\"F32\"", "[1]", "[4,8]") "}", 8,
           "overlaps the tensor before it");
    reject("same range twice", "{" ENT("a", "\"F32\"", "[1]", "[0,4]") "," ENT("b", "\"F32\"", "[1]", "[0,4]") "}", 4,
           "overlaps");
    reject("hole", "{" ENT("a", "\"F32\"", "[1]", "[0,4]") "," ENT("b", "\"F32\"", "[1]", "[8,12]") "}", 12,
           "bytes 4..8 of the data belong to no tensor (before 'b')");
    reject("hole at the start", "{" ENT("a", "\"F32\"", "[1]", "[4,8]") "}", 8, "bytes 0..4 of the data belong to no tensor");
    reject("trailing bytes", "{" ENT("a", "\"F32\"", "[1]", "[0,4]") "}", 8,
           "4 bytes after the last tensor belong to no tensor");
    reject("data but no tensors", "{}", 3, "3 bytes after the last tensor");

    char name[1200], hdr[1400];
    memset(name, 'n', 1100);
    name[1100] = 0;
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", name);
    reject("name of 1100 bytes", hdr, 1, "tensor name of 1100 bytes");
}

/* Zero-size tensors may have any other extent; their element count is 0
 * however large the other dimensions are. */
static void test_zero_size_extents(void)
{
    unsigned char *b;
    st_file *f = accept("huge zero-size", "{" ENT("z", "\"F32\"", "[4611686018427387904,4,0]", "[0,0]") "}", 0, &b);
    const st_tensor *z = f ? st_find(f, "z") : NULL;
    CHECK(z && z->nbytes == 0, "huge zero-size tensor");
    CHECK(z && st_numel(z) == 0, "numel of [2^62, 4, 0] is %lld", z ? (long long)st_numel(z) : -1LL);
    st_close(f);
    free(b);
}

/* st_open: paths that are not safetensors files, and images on disk. */
static void test_open(void)
{
    char err[ERR_LEN] = "";
    st_file *f = st_open(tmp_path("no-such-file.safetensors"), err);
    CHECK(f == NULL, "opened a missing file");
    CHECK(strstr(err, "cannot open") && strstr(err, "No such file") && strstr(err, "no-such-file"), "message '%s'", err);
    f = st_open(tmpdir, err);
    CHECK(f == NULL, "opened a directory");
    CHECK(strstr(err, "not a regular file") != NULL, "message '%s'", err);
    /* st_open_named: the name given, never the path */
    f = st_open_named(tmp_path("no-such-file.safetensors"), "given.safetensors", err);
    CHECK(f == NULL && strstr(err, "given.safetensors: cannot open") && !strstr(err, tmpdir), "message '%s'", err);
    f = st_open_named(tmpdir, "given", err);
    CHECK(f == NULL && strstr(err, "given: not a regular file") && !strstr(err, tmpdir), "message '%s'", err);

    CHECK(write_file(tmp_path("empty.safetensors"), "", 0) == 0, "write empty");
    f = st_open(tmp_path("empty.safetensors"), err);
    CHECK(f == NULL, "opened an empty file");
    CHECK(strstr(err, "truncated") && strstr(err, "empty.safetensors"), "message '%s'", err);

    /* a file cut short inside its header */
    size_t len;
    unsigned char *b = image("{" ENT("t", "\"F32\"", "[4]", "[0,16]") "}", 16, &len);
    CHECK(write_file(tmp_path("cut.safetensors"), b, 20) == 0, "write cut");
    f = st_open(tmp_path("cut.safetensors"), err);
    CHECK(f == NULL, "opened a cut file");
    CHECK(strstr(err, "past the end") && strstr(err, "cut.safetensors"), "message '%s'", err);
    f = st_open_named(tmp_path("cut.safetensors"), "given", err);
    CHECK(f == NULL && strstr(err, "given: ") && strstr(err, "past the end") && !strstr(err, tmpdir), "message '%s'", err);
    /* the same header, the data cut short */
    CHECK(write_file(tmp_path("short.safetensors"), b, len - 4) == 0, "write short");
    f = st_open(tmp_path("short.safetensors"), err);
    CHECK(f == NULL, "opened a file with short data");
    CHECK(strstr(err, "tensor 't'") && strstr(err, "more bytes than the file's data holds"), "message '%s'", err);
    /* whole, it opens and the data reads back */
    CHECK(write_file(tmp_path("whole.safetensors"), b, len) == 0, "write whole");
    f = st_open(tmp_path("whole.safetensors"), err);
    CHECK(f != NULL, "whole file: %s", err);
    if (f) {
        const st_tensor *t = st_find(f, "t");
        CHECK(t && t->nbytes == 16 && ((const unsigned char *)t->data)[15] == 15, "whole file data");
        st_close(f);
    }
    free(b);
    unlink(tmp_path("empty.safetensors"));
    unlink(tmp_path("cut.safetensors"));
    unlink(tmp_path("short.safetensors"));
    unlink(tmp_path("whole.safetensors"));
}

int main(void)
{
    const char *td = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_st.XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_dtype_table();
    test_round_trip();
    test_accepts();
    test_rejects_framing();
    test_rejects_header();
    test_zero_size_extents();
    test_open();
    CHECK(rmdir(tmpdir) == 0, "temporary directory %s not empty", tmpdir);
    return test_summary("test_st");
}
