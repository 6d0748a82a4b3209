/*
 * test_model_errors.c - model_load on checkpoints that are wrong in one way
 * each, and on copies that are right in a way the fixtures are not.
 *
 * Every checkpoint is made here: the fixture's tensors and metadata are
 * copied into an st_writer with one change (a tensor left out, added,
 * reshaped, retyped, poisoned; a config key or the vocabulary edited) and
 * saved to a temporary directory. A wrong one must be refused with a message
 * that names the file and the problem (the tensor and its expected shape, or
 * the config key); a right one must load and give the logprobs it should.
 */
#define _POSIX_C_SOURCE 200809L
#include "err.h"
#include "harness.h"
#include "model.h"
#include "st.h"

#include <jansson.h>
#include <stdint.h>
#include <unistd.h>

#define ASPAN "aspan-small"
#define PAR "par-small"
#define TXL "txl-word"   /* ../shared only: its tests skip without it */
#define GA "gpt-aspan"    /* ../shared only, as the next */
#define NG "nanogpt-char"
#define N_FIX 5

static char tmpdir[512], ckpt[600];

/* The fixtures, open for the whole run: edited copies reference their data. */
static struct fixture {
    const char *name;
    char path[1024];
    st_file *f;
    model_t *m;          /* the fixture itself, loaded */
    int32_t tokens[128]; /* the first block of stream 0 of vectors.safetensors */
} fx[N_FIX] = {{.name = ASPAN}, {.name = PAR}, {.name = TXL}, {.name = GA}, {.name = NG}};

static struct fixture *fixture(const char *name)
{
    for (int k = 0; k < N_FIX; k++)
        if (strcmp(name, fx[k].name) == 0) return &fx[k];
    return &fx[0];
}

/* ------------------------------------------------------------ building copies */

typedef struct {
    const char *fixture;
    /* tensors left out: exact names, or prefixes ending in '*' */
    const char *drop[8];
    int (*drop_fn)(const char *name);
    /* a tensor replaced by this one (same name) */
    const char *repl;
    st_dtype repl_dtype;
    int repl_ndim;
    int64_t repl_shape[3];
    const void *repl_data;   /* NULL: the fixture's own bytes */
    /* a tensor added */
    const char *add;
    int64_t add_len;         /* F32 [add_len], data from the fixture's first tensor */
    /* metadata: NULL keeps the fixture's, OMIT leaves the key out */
    const char *config, *vocab;
    /* convert F32 tensors to F16 or BF16 (0: keep), except names containing
     * keep_f32; with widen, the rounded values are stored back as F32 */
    st_dtype half;
    const char *keep_f32;
    int widen;
} edit_t;

static const char OMIT[] = "(omit)";

static int dropped(const edit_t *e, const char *name)
{
    for (int i = 0; i < 8 && e->drop[i]; i++) {
        size_t n = strlen(e->drop[i]);
        if (e->drop[i][n - 1] == '*' ? strncmp(name, e->drop[i], n - 1) == 0 : strcmp(name, e->drop[i]) == 0)
            return 1;
    }
    return e->drop_fn && e->drop_fn(name);
}

static uint16_t f32_to_bf16(float x)   /* truncation: the low 16 bits dropped */
{
    uint32_t b;
    memcpy(&b, &x, 4);
    return (uint16_t)(b >> 16);
}

static uint16_t f32_to_f16(float x)    /* round to nearest even */
{
    uint32_t b;
    memcpy(&b, &x, 4);
    uint32_t s = (b >> 16) & 0x8000, m = b & 0x7FFFFF;
    int32_t e = (int32_t)((b >> 23) & 0xFF) - 127 + 15;
    if (((b >> 23) & 0xFF) == 0xFF) return (uint16_t)(s | 0x7C00 | (m ? 0x200 : 0));
    if (e >= 31) return (uint16_t)(s | 0x7C00);
    if (e <= 0) {   /* subnormal half: value = h * 2^-24 */
        if (e < -10) return (uint16_t)s;
        m |= 0x800000;
        int shift = 14 - e;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(s | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;   /* a carry into the exponent is right */
    return (uint16_t)(s | h);
}

static float f16_to_f32(uint16_t h)
{
    int e = (h >> 10) & 0x1F, f = h & 0x3FF;
    float v = e == 0 ? ldexpf((float)f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexpf((float)(f | 0x400), e - 25);
    return h & 0x8000 ? -v : v;
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    float v;
    memcpy(&v, &b, 4);
    return v;
}

/* Writes the edited copy to ckpt; returns 0 or -1. */
static int build(const edit_t *e)
{
    struct fixture *x = fixture(e->fixture);
    char err[ERR_LEN];
    st_writer *w = st_writer_new();
    void *owned[1024];
    int n_owned = 0, rc = -1;
    if (!w) return -1;
    for (int i = 0; i < st_count(x->f); i++) {
        const st_tensor *t = st_at(x->f, i);
        if (dropped(e, t->name)) continue;
        if (e->repl && strcmp(t->name, e->repl) == 0) {
            if (st_writer_add(w, t->name, e->repl_dtype, e->repl_ndim, e->repl_shape,
                              e->repl_data ? e->repl_data : t->data))
                goto out;
            continue;
        }
        if (e->half && t->dtype == ST_F32 && !(e->keep_f32 && strstr(t->name, e->keep_f32))) {
            int64_t n = st_numel(t);
            void *q = malloc((size_t)(n ? n : 1) * (e->widen ? 4 : 2));
            if (!q || n_owned == 1024) { free(q); goto out; }
            owned[n_owned++] = q;
            for (int64_t j = 0; j < n; j++) {
                float v;
                memcpy(&v, (const char *)t->data + 4 * j, 4);
                uint16_t h = e->half == ST_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
                if (e->widen) ((float *)q)[j] = e->half == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
                else ((uint16_t *)q)[j] = h;
            }
            if (st_writer_add(w, t->name, e->widen ? ST_F32 : e->half, t->ndim, t->shape, q)) goto out;
            continue;
        }
        if (st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data)) goto out;
    }
    if (e->add) {
        int64_t shape[1] = {e->add_len};
        if (st_writer_add(w, e->add, ST_F32, 1, shape, st_at(x->f, 0)->data)) goto out;
    }
    const char *cfg = e->config ? e->config : st_meta(x->f, "config");
    const char *voc = e->vocab ? e->vocab : st_meta(x->f, "vocab");
    if (cfg != OMIT && st_writer_meta(w, "config", cfg)) goto out;
    if (voc != OMIT && st_writer_meta(w, "vocab", voc)) goto out;
    rc = st_writer_save(w, ckpt, err);
    if (rc) printf("build: %s\n", err);
out:
    st_writer_free(w);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    return rc;
}

/* The fixture's config with KEY set to VAL (stolen), or removed if VAL is
 * NULL. Caller frees. */
static char *config_with(const char *fix, const char *key, json_t *val)
{
    json_t *c = json_loads(st_meta(fixture(fix)->f, "config"), 0, NULL);
    if (val) json_object_set_new(c, key, val);
    else json_object_del(c, key);
    char *s = json_dumps(c, JSON_PRESERVE_ORDER);
    json_decref(c);
    return s;
}

/* The fixture's vocabulary with entry I set to VAL (stolen). Caller frees. */
static char *vocab_with(const char *fix, int i, json_t *val)
{
    json_t *v = json_loads(st_meta(fixture(fix)->f, "vocab"), 0, NULL);
    json_array_set_new(v, (size_t)i, val);
    char *s = json_dumps(v, 0);
    json_decref(v);
    return s;
}

/* ------------------------------------------------------------ checks */

/* The copy must be refused with a message naming the file and containing
 * N1 and N2 (if not NULL). */
static void refuse(const edit_t *e, const char *what, const char *n1, const char *n2)
{
    char err[ERR_LEN] = "";
    CHECK(build(e) == 0, "%s: could not build the checkpoint", what);
    model_t *m = model_load(ckpt, err);
    CHECK(m == NULL, "%s: loaded", what);
    CHECK(strstr(err, n1) != NULL, "%s: message '%s' lacks '%s'", what, err, n1);
    if (n2) CHECK(strstr(err, n2) != NULL, "%s: message '%s' lacks '%s'", what, err, n2);
    CHECK(strstr(err, ckpt) != NULL, "%s: message '%s' does not name the file", what, err);
    model_free(m);
    /* named as the server names a file to its clients: that name, never the path */
    m = model_load_named(ckpt, "shown/x.safetensors", MEM_EXACT, err);
    CHECK(m == NULL && strstr(err, "shown/x.safetensors") && strstr(err, n1) && !strstr(err, ckpt),
          "%s: model_load_named's message '%s'", what, err);
    model_free(m);
}

static void refuse_config(const char *fix, const char *key, json_t *val, const char *n1, const char *n2)
{
    char *c = config_with(fix, key, val), what[160];
    snprintf(what, sizeof what, "%s config %s", fix, key);
    edit_t e = {.fixture = fix, .config = c};
    refuse(&e, what, n1, n2);
    free(c);
}

static void refuse_vocab(const char *fix, const char *vocab, const char *what, const char *n1, const char *n2)
{
    edit_t e = {.fixture = fix, .vocab = vocab};
    refuse(&e, what, n1, n2);
}

static model_t *load(const edit_t *e, const char *what)
{
    char err[ERR_LEN] = "";
    CHECK(build(e) == 0, "%s: could not build the checkpoint", what);
    model_t *m = model_load(ckpt, err);
    CHECK(m != NULL, "%s: refused: %s", what, err);
    return m;
}

/* Logprobs of the fixture's first block (block_len tokens) from a fresh
 * memory, block_len x V. Caller frees. */
static float *block_logprobs(const model_t *m, const int32_t *tokens)
{
    char err[ERR_LEN] = "";
    int M = m->block_len;
    float *lp = malloc(sizeof(float) * (size_t)M * m->V);
    mem_t *mem = mem_new(m);
    fwd_ws *ws = ws_new();
    int rc = lp && mem && ws ? model_forward(m, &mem, 1, tokens, M, lp, ws, err) : -1;
    CHECK(rc == 0, "model_forward: %s", err);
    mem_free(mem);
    ws_free(ws);
    if (rc) { free(lp); return NULL; }
    return lp;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* ------------------------------------------------------------ tensors */

static void test_tensor_errors(void)
{
    refuse(&(edit_t){.fixture = ASPAN, .drop = {"layers.1.attn.proj_key.weight"}}, "aspan missing proj_key",
           "missing tensor 'layers.1.attn.proj_key.weight'", "expected shape [128, 128]");
    refuse(&(edit_t){.fixture = ASPAN, .drop = {"out_emb.bias"}}, "aspan missing out_emb.bias",
           "missing tensor 'out_emb.bias'", "[65]");
    refuse(&(edit_t){.fixture = ASPAN, .drop = {"layers.3.attn.attn.adaptive_span._mask.mask_template"}},
           "aspan missing mask_template", "missing tensor 'layers.3.attn.attn.adaptive_span._mask.mask_template'",
           "[512]");
    refuse(&(edit_t){.fixture = PAR, .drop = {"blocks.3.attn.qkv_net.weight"}}, "par missing qkv of an attn block",
           "missing tensor 'blocks.3.attn.qkv_net.weight'", "expected shape [384, 128]");
    refuse(&(edit_t){.fixture = PAR, .drop = {"blocks.0.ff.CoreNet.3.bias"}}, "par missing ff of an ffn block",
           "missing tensor 'blocks.0.ff.CoreNet.3.bias'", "[128]");
    refuse(&(edit_t){.fixture = PAR, .drop = {"r_r_bias"}}, "par missing r_r_bias", "missing tensor 'r_r_bias'",
           "[4, 32]");

    refuse(&(edit_t){.fixture = ASPAN, .add = "layers.4.norm1.weight", .add_len = 128}, "aspan extra layer",
           "unexpected tensor 'layers.4.norm1.weight'", "adaptive-span");
    refuse(&(edit_t){.fixture = ASPAN, .add = "in_emb.bias", .add_len = 65}, "aspan extra bias",
           "unexpected tensor 'in_emb.bias'", NULL);
    refuse(&(edit_t){.fixture = PAR, .add = "out.weight", .add_len = 65}, "par out.weight while tied",
           "unexpected tensor 'out.weight'", "par-transformer-xl");

    refuse(&(edit_t){.fixture = ASPAN, .repl = "in_emb.weight", .repl_dtype = ST_F32, .repl_ndim = 2,
                     .repl_shape = {128, 65}},
           "aspan transposed embedding", "tensor 'in_emb.weight' has shape [128, 65], expected [65, 128]", NULL);
    refuse(&(edit_t){.fixture = ASPAN, .repl = "key_pe", .repl_dtype = ST_F32, .repl_ndim = 3,
                     .repl_shape = {1, 32, 511}},
           "aspan short key_pe", "tensor 'key_pe' has shape [1, 32, 511], expected [1, 32, 512]", NULL);
    refuse(&(edit_t){.fixture = ASPAN, .repl = "layers.2.attn.attn.adaptive_span._mask.current_val",
                     .repl_dtype = ST_F32, .repl_ndim = 1, .repl_shape = {4}},
           "aspan current_val of 1 dim", "'layers.2.attn.attn.adaptive_span._mask.current_val' has shape [4]",
           "expected [4, 1, 1]");
    refuse(&(edit_t){.fixture = PAR, .repl = "blocks.5.attn.r_net.weight", .repl_dtype = ST_F32, .repl_ndim = 2,
                     .repl_shape = {128, 64}},
           "par narrow r_net", "tensor 'blocks.5.attn.r_net.weight' has shape [128, 64], expected [128, 128]", NULL);
    /* a branch the model does not use is checked all the same */
    refuse(&(edit_t){.fixture = PAR, .repl = "blocks.0.attn.o_net.weight", .repl_dtype = ST_F32, .repl_ndim = 2,
                     .repl_shape = {64, 128}},
           "par unused branch of wrong shape", "tensor 'blocks.0.attn.o_net.weight' has shape [64, 128]",
           "expected [128, 128]");

    refuse(&(edit_t){.fixture = ASPAN, .repl = "layers.0.ff.fc1.bias", .repl_dtype = ST_I32, .repl_ndim = 1,
                     .repl_shape = {512}},
           "aspan I32 bias", "tensor 'layers.0.ff.fc1.bias' has dtype I32", "expected F32");
    refuse(&(edit_t){.fixture = PAR, .repl = "emb.weight", .repl_dtype = ST_I32, .repl_ndim = 2,
                     .repl_shape = {65, 128}},
           "par I32 embedding", "tensor 'emb.weight' has dtype I32", NULL);
    refuse(&(edit_t){.fixture = PAR, .repl = "blocks.1.alpha", .repl_dtype = ST_U8, .repl_ndim = 1,
                     .repl_shape = {3}},
           "par U8 alpha", "tensor 'blocks.1.alpha' has dtype U8", NULL);

    /* non-finite weights */
    const st_tensor *t = st_find(fixture(ASPAN)->f, "layers.2.ff.fc2.weight");
    float *w = malloc(t->nbytes);
    memcpy(w, t->data, t->nbytes);
    w[1000] = NAN;
    refuse(&(edit_t){.fixture = ASPAN, .repl = t->name, .repl_dtype = ST_F32, .repl_ndim = 2,
                     .repl_shape = {128, 512}, .repl_data = w},
           "aspan NaN weight", "tensor 'layers.2.ff.fc2.weight' holds a non-finite value at index 1000", NULL);
    free(w);
    t = st_find(fixture(PAR)->f, "emb.weight");
    w = malloc(t->nbytes);
    memcpy(w, t->data, t->nbytes);
    w[65 * 128 - 1] = -INFINITY;
    refuse(&(edit_t){.fixture = PAR, .repl = t->name, .repl_dtype = ST_F32, .repl_ndim = 2, .repl_shape = {65, 128},
                     .repl_data = w},
           "par -inf embedding", "tensor 'emb.weight' holds a non-finite value at index 8319", NULL);
    free(w);
}

/* ------------------------------------------------------------ config and vocab */

static void test_config_errors(void)
{
    refuse_config(ASPAN, "hidden_size", json_integer(1000000000), "config 'hidden_size' = 1000000000 is outside",
                  "[1, 65536]");
    refuse_config(ASPAN, "nb_layers", json_integer(0), "config 'nb_layers' = 0 is outside [1, ", NULL);
    refuse_config(ASPAN, "attn_span", json_integer(-64), "config 'attn_span' = -64 is outside", NULL);
    refuse_config(ASPAN, "nb_heads", json_real(4.5), "config 'nb_heads' must be an integer", NULL);
    refuse_config(ASPAN, "block_size", json_string("64"), "config 'block_size' must be an integer", NULL);
    refuse_config(ASPAN, "adapt_span_ramp", json_integer(0), "config 'adapt_span_ramp' = 0 is outside", NULL);
    refuse_config(ASPAN, "inner_hidden_size", NULL, "config has no 'inner_hidden_size'", NULL);
    refuse_config(ASPAN, "nb_heads", json_integer(3), "hidden_size 128 is not a multiple of nb_heads 3", NULL);
    /* sizes that are valid but not this checkpoint's: the first tensor they disagree with */
    refuse_config(ASPAN, "nb_layers", json_integer(5), "missing tensor 'layers.4.attn.proj_query.weight'", NULL);
    refuse_config(ASPAN, "nb_layers", json_integer(3), "unexpected tensor 'layers.3.", NULL);
    refuse_config(ASPAN, "inner_hidden_size", json_integer(256),
                  "tensor 'layers.0.ff.fc1.weight' has shape [512, 128], expected [256, 128]", NULL);
    refuse_config(ASPAN, "attn_span", json_integer(256), "tensor 'key_pe' has shape [1, 32, 512], expected [1, 32, 256]",
                  NULL);
    refuse_config(ASPAN, "vocab_size", json_integer(64), "config vocab_size 64 but the vocabulary lists 65 tokens",
                  NULL);
    refuse_config(PAR, "vocab_size", json_integer(66), "config vocab_size 66 but the vocabulary lists 65", NULL);
    refuse_config(ASPAN, "vocab_size", json_integer(0), "config 'vocab_size' = 0 is outside", NULL);
    refuse_config(ASPAN, "family", json_string("gpt2"), "unknown family 'gpt2'", NULL);
    refuse_config(ASPAN, "family", NULL, "config has no 'family'", NULL);
    refuse_config(PAR, "family", json_integer(1), "config has no 'family'", NULL);

    refuse_config(PAR, "n_blocks", json_integer(0), "config 'n_blocks' = 0 is outside", NULL);
    refuse_config(PAR, "d_model", json_integer(1000000000), "config 'd_model' = 1000000000 is outside", NULL);
    refuse_config(PAR, "d_model", json_integer(127), "config d_model 127 must be even", NULL);
    refuse_config(PAR, "d_head", json_real(32.0), "config 'd_head' must be an integer", NULL);
    refuse_config(PAR, "mem_len", json_integer(-1), "config 'mem_len' = -1 is outside", NULL);
    refuse_config(PAR, "tgt_len", NULL, "config has no 'tgt_len'", NULL);
    refuse_config(PAR, "d_head", json_integer(65536), "n_head * d_head = 262144 is over 65536", NULL);
    refuse_config(PAR, "tie_weight", json_string("yes"), "config 'tie_weight' must be true or false", NULL);
    refuse_config(PAR, "tie_weight", json_false(), "missing tensor 'out.weight'", "[65, 128]");

    /* the architecture */
    refuse_config(PAR, "arch", json_pack("[sssssss]", "ffn", "ffn", "ffn", "attn", "ffn", "attn", "attn"),
                  "config 'arch' must be an array of n_blocks = 8 kinds", NULL);
    refuse_config(PAR, "arch", json_string("attn"), "config 'arch' must be an array of n_blocks = 8", NULL);
    refuse_config(PAR, "arch", NULL, "config 'arch' must be an array", NULL);
    refuse_config(PAR, "arch", json_pack("[ssssssss]", "ffn", "ffn", "ffn", "conv", "ffn", "attn", "attn", "ffn"),
                  "config arch[3] must be \"attn\", \"ffn\" or \"skip\"", NULL);
    refuse_config(PAR, "arch", json_pack("[isssssss]", 0, "ffn", "ffn", "attn", "ffn", "attn", "attn", "ffn"),
                  "config arch[0] must be", NULL);
    refuse_config(PAR, "arch", json_pack("[ssssssss]", "ffn", "ffn", "ffn", "ATTN", "ffn", "attn", "attn", "ffn"),
                  "config arch[3] must be", NULL);

    /* the metadata itself */
    refuse(&(edit_t){.fixture = ASPAN, .config = OMIT}, "aspan no config", "no __metadata__.config", NULL);
    refuse(&(edit_t){.fixture = PAR, .vocab = OMIT}, "par no vocab", "no __metadata__.vocab", NULL);
    refuse(&(edit_t){.fixture = ASPAN, .config = "[1, 2]"}, "config an array", "__metadata__.config is not a JSON object",
           NULL);
    refuse(&(edit_t){.fixture = ASPAN, .config = "{\"family\": "}, "config not JSON",
           "__metadata__.config is not a JSON object", NULL);

    refuse_vocab(ASPAN, "{\"a\": 0}", "vocab an object", "vocab must be a JSON array", NULL);
    refuse_vocab(ASPAN, "[\"a\", ", "vocab not JSON", "vocab is not valid JSON", NULL);
    refuse_vocab(ASPAN, "[]", "vocab empty", "vocab must be a JSON array of 1 to", NULL);
    char *v = vocab_with(ASPAN, 13, json_string("AB"));
    refuse_vocab(ASPAN, v, "vocab entry of two characters", "vocab[13] is not a string of exactly one character", NULL);
    free(v);
    v = vocab_with(PAR, 20, json_string(""));
    refuse_vocab(PAR, v, "vocab entry empty", "vocab[20] is not a string of exactly one character", NULL);
    free(v);
    v = vocab_with(ASPAN, 2, json_integer(33));
    refuse_vocab(ASPAN, v, "vocab entry a number", "vocab[2] is not a string", NULL);
    free(v);
    v = vocab_with(ASPAN, 14, json_string("A"));   /* 13 is "A" already */
    refuse_vocab(ASPAN, v, "vocab repeats a character", "repeats a character listed earlier", NULL);
    free(v);
    v = vocab_with(PAR, 40, json_string("\xc3\xa9\xc3\xa9"));   /* two code points in 4 bytes */
    refuse_vocab(PAR, v, "vocab entry of two code points", "vocab[40] is not a string of exactly one character", NULL);
    free(v);
}

/* ------------------------------------------------------------ adaptive-span buffers */

static void test_span_errors(void)
{
    const char *cv = "layers.1.attn.attn.adaptive_span._mask.current_val";
    const st_tensor *t = st_find(fixture(ASPAN)->f, cv);
    float z[4];
    memcpy(z, t->data, sizeof z);
    z[2] = 1.5f;
    refuse(&(edit_t){.fixture = ASPAN, .repl = cv, .repl_dtype = ST_F32, .repl_ndim = 3, .repl_shape = {4, 1, 1},
                     .repl_data = z},
           "current_val above 1", "layers.1 current_val[2] = 1.5 is outside [0, 1]", NULL);
    memcpy(z, t->data, sizeof z);
    z[0] = -0.25f;
    refuse(&(edit_t){.fixture = ASPAN, .repl = cv, .repl_dtype = ST_F32, .repl_ndim = 3, .repl_shape = {4, 1, 1},
                     .repl_data = z},
           "current_val below 0", "layers.1 current_val[0] = -0.25 is outside [0, 1]", NULL);

    const char *mt = "layers.2.attn.attn.adaptive_span._mask.mask_template";
    t = st_find(fixture(ASPAN)->f, mt);
    float tpl[512];
    memcpy(tpl, t->data, sizeof tpl);
    CHECK(tpl[0] == -511.0f && tpl[511] == 0.0f, "fixture mask_template [%g .. %g]", (double)tpl[0], (double)tpl[511]);
    tpl[100] += 0.5f;
    refuse(&(edit_t){.fixture = ASPAN, .repl = mt, .repl_dtype = ST_F32, .repl_ndim = 1, .repl_shape = {512},
                     .repl_data = tpl},
           "mask_template bent", "tensor 'layers.2.attn.attn.adaptive_span._mask.mask_template' is not linspace",
           "[100] = -410.5");
    for (int j = 0; j < 512; j++) tpl[j] = (float)j - 511.0f + 1.0f;   /* linspace(-510, 1): shifted by one */
    refuse(&(edit_t){.fixture = ASPAN, .repl = mt, .repl_dtype = ST_F32, .repl_ndim = 1, .repl_shape = {512},
                     .repl_data = tpl},
           "mask_template shifted", "is not linspace(1-S, 0, S): [0] = -510", NULL);
}

/* The word-level Transformer-XL: its config, its adaptive layout, its r
 * biases, its word vocabulary; and copies that load. */
static void test_txl_errors(void)
{
    refuse_config(TXL, "cutoffs", json_pack("[ii]", 4000, 1000), "config cutoffs[1] must be an integer above the one before", NULL);
    refuse_config(TXL, "cutoffs", json_pack("[ii]", 1000, 9984), "below the vocabulary size 9984", NULL);
    refuse_config(TXL, "cutoffs", json_string("1000"), "config 'cutoffs' must be an array", NULL);
    refuse_config(TXL, "cutoffs", json_pack("[i]", 1000), "config 'tie_projs' must be an array of 2 booleans", NULL);
    refuse_config(TXL, "tie_projs", json_pack("[bb]", 0, 1), "config 'tie_projs' must be an array of 3 booleans", NULL);
    refuse_config(TXL, "tie_projs", json_pack("[bbi]", 0, 1, 1), "config tie_projs[2] must be true or false", NULL);
    refuse_config(TXL, "ext_len", json_integer(8), "config 'ext_len' = 8 is outside [0, 0]", NULL);
    refuse_config(TXL, "attn_type", json_integer(2), "config 'attn_type' = 2 is outside [0, 0]", NULL);
    refuse_config(TXL, "div_val", json_integer(1), "tensor 'word_emb.emb_layers.0.weight' has shape [1000, 128], expected [9984, 128]", NULL);
    refuse_config(TXL, "div_val", json_integer(200), "d_embed 128 / div_val 200^1 leaves no dims for cluster 1", NULL);
    refuse_config(TXL, "d_embed", json_integer(64), "expected [1000, 64]", NULL);
    refuse_config(TXL, "n_layer", json_integer(5), "missing tensor 'layers.4.dec_attn.qkv_net.weight'", NULL);
    refuse_config(TXL, "eval_same_length", json_integer(1), "config 'eval_same_length' must be true or false", NULL);
    refuse_config(TXL, "tokenizer", json_string("bytes"), "config 'tokenizer' must be one of: chars, words", NULL);
    refuse_config(TXL, "tokenizer", NULL, "vocab[0] is not a string of exactly one character", NULL);
    refuse(&(edit_t){.fixture = TXL, .drop = {"r_w_bias"}}, "txl one r bias", "r_w_bias and r_r_bias must come together", NULL);
    refuse(&(edit_t){.fixture = TXL, .drop = {"r_w_bias", "r_r_bias"}}, "txl no r biases",
           "the r biases must be either shared", NULL);
    refuse(&(edit_t){.fixture = TXL, .drop = {"crit.out_projs.0"}}, "txl untied projection missing",
           "missing tensor 'crit.out_projs.0'", "[128, 128]");
    refuse(&(edit_t){.fixture = TXL, .drop = {"crit.cluster_bias"}}, "txl cluster bias", "missing tensor 'crit.cluster_bias'", NULL);
    /* the vocabulary: words need <eos>, refuse whitespace and repeats */
    refuse_vocab(TXL, "[\"a\", \"b\"]", "txl vocab without <eos>", "a word vocabulary needs <eos>", NULL);
    char *v = vocab_with(TXL, 0, json_string("<eos2>"));
    refuse_vocab(TXL, v, "txl no <eos>", "a word vocabulary needs <eos>", NULL);
    free(v);
    v = vocab_with(TXL, 5, json_string("two words"));
    refuse_vocab(TXL, v, "txl whitespace", "vocab[5] holds whitespace", NULL);
    free(v);
    v = vocab_with(TXL, 5, json_string("the"));
    refuse_vocab(TXL, v, "txl repeat", "vocab[5] 'the' repeats a word", NULL);
    free(v);
    v = vocab_with(TXL, 5, json_string(""));
    refuse_vocab(TXL, v, "txl empty word", "vocab[5] is not a word", NULL);
    free(v);
    /* a copy loads and computes what the fixture does */
    model_t *m = load(&(edit_t){.fixture = TXL}, "txl copy");
    if (m) {
        struct fixture *x = fixture(TXL);
        float *a = block_logprobs(m, x->tokens), *b = block_logprobs(x->m, x->tokens);
        CHECK(a && b && memcmp(a, b, (size_t)m->block_len * m->V * sizeof(float)) == 0, "txl copy's logprobs differ");
        CHECK(m->n_params == x->m->n_params, "txl params %lld vs %lld", (long long)m->n_params, (long long)x->m->n_params);
        free(a);
        free(b);
    }
    model_free(m);
}

/* The window models: their spans all or none, the mask template and z as
 * gpt.py derives them, nanoGPT's biases as config.bias says, its head tied
 * or its own; copies load and compute what the fixtures do. */
static int span_of_head_1(const char *name) { return strstr(name, "heads.1.adaptive_span.") != NULL; }
static int any_span(const char *name) { return strstr(name, "adaptive_span.") != NULL; }
static int nano_bias(const char *name)   /* every Linear's and LayerNorm's bias */
{
    const size_t n = strlen(name);
    return n > 5 && strcmp(name + n - 5, ".bias") == 0;
}

static void test_gpt_errors(void)
{
    refuse(&(edit_t){.fixture = GA, .drop_fn = span_of_head_1}, "gpt-aspan one head without a span",
           "every head has an adaptive_span", "blocks.0.sa.heads.1");
    static const float zbad[1] = {1.5f};
    refuse(&(edit_t){.fixture = GA, .repl = "blocks.2.sa.heads.3.adaptive_span.current_val", .repl_dtype = ST_F32,
                     .repl_ndim = 3, .repl_shape = {1, 1, 1}, .repl_data = zbad},
           "gpt-aspan z out of range", "blocks.2.sa.heads.3 current_val = 1.5 is outside [0, 1]", NULL);
    static float tpl[128];
    for (int j = 0; j < 128; j++) tpl[j] = (float)j;
    refuse(&(edit_t){.fixture = GA, .repl = "blocks.1.sa.heads.0.adaptive_span.mask_template", .repl_dtype = ST_F32,
                     .repl_ndim = 1, .repl_shape = {128}, .repl_data = tpl},
           "gpt-aspan mask template", "'blocks.1.sa.heads.0.adaptive_span.mask_template' is not linspace", NULL);
    refuse(&(edit_t){.fixture = GA, .drop = {"blocks.3.sa.heads.2.value.weight"}}, "gpt-aspan a head's value",
           "missing tensor 'blocks.3.sa.heads.2.value.weight'", "[32, 128]");
    refuse(&(edit_t){.fixture = GA, .drop = {"lm_head.bias"}}, "gpt-aspan head bias", "missing tensor 'lm_head.bias'", NULL);
    refuse_config(GA, "n_head", json_integer(8), "blocks.0.sa.heads.0.query.weight' has shape [32, 128], expected [16, 128]", NULL);
    refuse_config(GA, "max_size", json_integer(64), "config 'max_size' = 64 is outside [128,", NULL);
    refuse_config(GA, "block_size", json_integer(256), "config 'max_size' = 128 is outside [256,", NULL);
    refuse_config(NG, "bias", json_integer(1), "config 'bias' must be true or false", NULL);
    refuse_config(NG, "n_head", json_integer(3), "config n_embd 128 is not a multiple of n_head 3", NULL);
    refuse_config(NG, "bias", json_false(), "unexpected tensor 'transformer.", "bias");
    refuse(&(edit_t){.fixture = NG, .drop = {"transformer.wpe.weight"}}, "nanogpt positions",
           "missing tensor 'transformer.wpe.weight'", "[128, 128]");
    /* copies that load: spans all absent (plain attention), the head tied, biases absent with bias false */
    model_t *m = load(&(edit_t){.fixture = GA, .drop_fn = any_span}, "gpt-aspan without spans");
    if (m) {
        CHECK(m->layers[0].mask == NULL, "gpt-aspan without spans has a mask");
        float *a = block_logprobs(m, fixture(GA)->tokens), *b = block_logprobs(fixture(GA)->m, fixture(GA)->tokens);
        CHECK(a && b && max_diff(a, b, (size_t)m->block_len * m->V) > 1e-3, "gpt-aspan: spans change nothing");
        free(a);
        free(b);
    }
    model_free(m);
    m = load(&(edit_t){.fixture = NG, .drop = {"lm_head.weight"}}, "nanogpt tied head left out");
    if (m) {
        struct fixture *x = fixture(NG);
        float *a = block_logprobs(m, x->tokens), *b = block_logprobs(x->m, x->tokens);
        CHECK(a && b && memcmp(a, b, (size_t)m->block_len * m->V * sizeof(float)) == 0, "nanogpt tied head differs");
        CHECK(m->n_params == x->m->n_params && m->tie_weight, "nanogpt params %lld vs %lld",
              (long long)m->n_params, (long long)x->m->n_params);
        free(a);
        free(b);
    }
    model_free(m);
    char *c = config_with(NG, "bias", json_false());
    m = load(&(edit_t){.fixture = NG, .config = c, .drop_fn = nano_bias}, "nanogpt bias false");
    free(c);
    if (m) CHECK(m->layers[0].qkv_b == NULL && m->lnf_b == NULL && m->bias == 0, "nanogpt bias false has biases");
    model_free(m);
}

/* ------------------------------------------------------------ copies that load */

static void test_round_trip(void)
{
    for (int k = 0; k < 2; k++) {
        struct fixture *x = &fx[k];
        model_t *m = load(&(edit_t){.fixture = x->name}, x->name);
        if (!m) continue;
        CHECK(m->fingerprint == x->m->fingerprint, "%s: copy's fingerprint %016llx vs %016llx", x->name,
              (unsigned long long)m->fingerprint, (unsigned long long)x->m->fingerprint);
        CHECK(m->n_params == x->m->n_params && m->V == 65 && m->n_layers == x->m->n_layers, "%s: sizes", x->name);
        float *a = block_logprobs(m, x->tokens), *b = block_logprobs(x->m, x->tokens);
        size_t n = (size_t)m->block_len * m->V;
        CHECK(a && b && memcmp(a, b, n * sizeof(float)) == 0, "%s: copy's logprobs differ from the fixture's", x->name);
        /* and they are the reference's: the next-token logprob of the text is
         * well above a uniform guess */
        double nll = 0;
        for (int i = 0; a && i + 1 < m->block_len; i++) nll -= a[(size_t)i * m->V + x->tokens[i + 1]];
        nll /= m->block_len - 1;
        CHECK(a && nll < log(65.0) * 0.8, "%s: mean NLL %.3f of the fixture text", x->name, nll);
        free(a);
        free(b);
        model_free(m);
    }
}

/* The unused branch of every PAR block. */
static int unused_branch(const char *name)
{
    static const char *arch[8] = {"ffn", "ffn", "ffn", "attn", "ffn", "attn", "attn", "ffn"};
    int b;
    char rest[64];
    if (sscanf(name, "blocks.%d.%63s", &b, rest) != 2 || b < 0 || b >= 8) return 0;
    if (strcmp(arch[b], "attn") == 0) return strncmp(rest, "ff.", 3) == 0;
    return strncmp(rest, "attn.", 5) == 0;
}

static void test_par_pruned(void)
{
    struct fixture *x = fixture(PAR);
    /* the fixture's arch is what unused_branch assumes */
    for (int b = 0; b < 8; b++) {
        static const blk_kind k[8] = {BLK_FFN, BLK_FFN, BLK_FFN, BLK_ATTN, BLK_FFN, BLK_ATTN, BLK_ATTN, BLK_FFN};
        CHECK(x->m->layers[b].kind == k[b], "block %d is %s", b, blk_kind_name(x->m->layers[b].kind));
    }
    model_t *m = load(&(edit_t){.fixture = PAR, .drop_fn = unused_branch}, "par without unused branches");
    if (!m) return;
    CHECK(m->fingerprint == x->m->fingerprint, "pruned fingerprint %016llx vs %016llx",
          (unsigned long long)m->fingerprint, (unsigned long long)x->m->fingerprint);
    CHECK(m->n_params == x->m->n_params, "pruned n_params %lld vs %lld", (long long)m->n_params,
          (long long)x->m->n_params);
    float *a = block_logprobs(m, x->tokens), *b = block_logprobs(x->m, x->tokens);
    size_t n = (size_t)m->block_len * m->V;
    CHECK(a && b && memcmp(a, b, n * sizeof(float)) == 0, "pruned logprobs differ: max %.3g",
          a && b ? max_diff(a, b, n) : -1.0);
    free(a);
    free(b);
    model_free(m);
    /* the file is smaller by the branches left out */
    FILE *fp = fopen(ckpt, "rb");
    long size = -1;
    if (fp && fseek(fp, 0, SEEK_END) == 0) size = ftell(fp);
    if (fp) fclose(fp);
    CHECK(size > 0 && size < 6897420 * 3 / 4, "pruned file of %ld bytes", size);
}

/* PAR's supernet holds both branches in every block, so the same weights
 * make a plain Transformer-XL (attn, ffn, attn, ffn, ...). */
static void test_par_plain_txl(void)
{
    struct fixture *x = fixture(PAR);
    char *c = config_with(PAR, "arch", json_pack("[ssssssss]", "attn", "ffn", "attn", "ffn", "attn", "ffn", "attn", "ffn"));
    model_t *m = load(&(edit_t){.fixture = PAR, .config = c}, "par as plain Transformer-XL");
    free(c);
    if (!m) return;
    for (int b = 0; b < 8; b++)
        CHECK(m->layers[b].kind == (b % 2 ? BLK_FFN : BLK_ATTN), "block %d is %s", b,
              blk_kind_name(m->layers[b].kind));
    CHECK(m->fingerprint != x->m->fingerprint, "a different architecture has the fixture's fingerprint");
    float *a = block_logprobs(m, x->tokens), *b = block_logprobs(x->m, x->tokens);
    int V = m->V, M = m->block_len, finite = 1;
    double worst_sum = 0;
    for (int i = 0; a && i < M; i++) {
        double s = 0;
        for (int v = 0; v < V; v++) {
            float l = a[(size_t)i * V + v];
            finite &= isfinite(l) && l <= 0;
            s += exp(l);
        }
        worst_sum = fmax(worst_sum, fabs(s - 1));
    }
    CHECK(a && finite, "non-finite or positive logprob");
    CHECK(a && worst_sum < 1e-4, "rows of exp(logprob) sum to 1 within %.3g", worst_sum);
    CHECK(a && b && max_diff(a, b, (size_t)M * V) > 1e-2, "the architecture changed nothing");
    free(a);
    free(b);
    model_free(m);

    c = config_with(PAR, "family", json_string("transformer-xl"));
    m = load(&(edit_t){.fixture = PAR, .config = c}, "family transformer-xl");
    free(c);
    CHECK(m && !strcmp(model_family_name(m), "par-transformer-xl") && m->n_params == x->m->n_params, "transformer-xl is read as PAR");
    model_free(m);
}

/* Half-precision copies load, decode to exactly the floats they hold, and
 * stay close to the float32 model. bf16 keeps 8 bits of mantissa, and
 * truncation biases every weight towards zero: its logprobs move by up to
 * ~0.26 on these models (0.08 with rounding to nearest), so bf16 is held to
 * the probabilities rather than the logprobs of rare characters. */
static void test_half(void)
{
    static const struct {
        const char *fix;
        st_dtype dt;
        const char *keep;
        double lp_tol, p_tol;
    } H[] = {
        {ASPAN, ST_F16, NULL, 0.05, 0.01},
        /* bf16 holds integers exactly only up to 256: mask_template (up to
         * 511 in magnitude) stays F32 in this copy, whose F32 twin stores
         * the rounded values (a fully bf16 file loads: test_fixtures) */
        {ASPAN, ST_BF16, "mask_template", 0.3, 0.05},
        {PAR, ST_F16, NULL, 0.05, 0.01},
        {PAR, ST_BF16, NULL, 0.3, 0.05},
    };
    for (size_t k = 0; k < sizeof H / sizeof H[0]; k++) {
        struct fixture *x = fixture(H[k].fix);
        char what[64];
        snprintf(what, sizeof what, "%s %s", H[k].fix, st_dtype_name(H[k].dt));
        /* the same rounded values stored as F32: the half copy must decode to them */
        model_t *w = load(&(edit_t){.fixture = H[k].fix, .half = H[k].dt, .keep_f32 = H[k].keep, .widen = 1}, what);
        model_t *m = load(&(edit_t){.fixture = H[k].fix, .half = H[k].dt, .keep_f32 = H[k].keep}, what);
        if (!m || !w) {
            model_free(m);
            model_free(w);
            continue;
        }
        char err[ERR_LEN];
        st_file *f = st_open(ckpt, err);
        const st_tensor *t = f ? st_at(f, 0) : NULL;
        CHECK(t && t->dtype == H[k].dt, "%s: first tensor is %s", what, t ? st_dtype_name(t->dtype) : "?");
        st_close(f);
        CHECK(m->n_params == x->m->n_params, "%s: %lld parameters", what, (long long)m->n_params);
        CHECK(m->fingerprint == w->fingerprint, "%s: fingerprint differs from its F32 twin's", what);
        CHECK(memcmp(m->arena, w->arena, (size_t)m->n_params * sizeof(float)) == 0, "%s: decoded weights differ", what);
        float *a = block_logprobs(m, x->tokens), *b = block_logprobs(x->m, x->tokens), *c = block_logprobs(w, x->tokens);
        size_t n = (size_t)m->block_len * m->V;
        CHECK(a && c && memcmp(a, c, n * sizeof(float)) == 0, "%s: logprobs differ from its F32 twin's", what);
        double d = 1e9, dp = 1e9;
        if (a && b) {
            d = max_diff(a, b, n);
            dp = 0;
            for (size_t i = 0; i < n; i++) dp = fmax(dp, fabs(exp((double)a[i]) - exp((double)b[i])));
        }
        printf("%s: max |logprob - float32| %.2e, max |prob - float32| %.2e\n", what, d, dp);
        CHECK(d <= H[k].lp_tol, "%s: max |logprob diff| %.3g", what, d);
        CHECK(dp <= H[k].p_tol, "%s: max |prob diff| %.3g", what, dp);
        CHECK(d > 0, "%s: identical to float32: not converted", what);
        free(a);
        free(b);
        free(c);
        model_free(m);
        model_free(w);
    }
}

int main(void)
{
    char err[ERR_LEN] = "";
    const char *td = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_model_errors.XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(ckpt, sizeof ckpt, "%s/model.safetensors", tmpdir);
    int ok = 1;
    for (int k = 0; k < N_FIX; k++) {
        struct fixture *x = &fx[k];
        char rel[256];
        snprintf(rel, sizeof rel, "fixtures/%s/model.safetensors", x->name);
        if (k >= 2 && !shared_path(rel)) {
            printf("SKIP test_model_errors %s: ../shared/fixtures/%s is not here (CI has it)\n", x->name, x->name);
            continue;
        }
        snprintf(rel, sizeof rel, "fixtures/%s/model.safetensors", x->name);
        snprintf(x->path, sizeof x->path, "%s", ref_path(rel));
        x->f = st_open(x->path, err);
        CHECK(x->f != NULL, "%s", err);
        x->m = model_load(x->path, err);
        CHECK(x->m != NULL, "%s", err);
        snprintf(rel, sizeof rel, "fixtures/%s/vectors.safetensors", x->name);
        st_file *vf = st_open(ref_path(rel), err);
        const st_tensor *tt = vf ? st_find(vf, "tokens") : NULL;
        const size_t nt = tt && tt->shape[1] < 128 ? (size_t)tt->shape[1] : 128;
        CHECK(tt && tt->dtype == ST_I32 && tt->ndim == 2 && tt->shape[1] >= 64, "%s tokens", x->name);
        if (tt) memcpy(x->tokens, tt->data, nt * sizeof *x->tokens);
        st_close(vf);
        ok &= x->f && x->m && tt;
    }
    if (ok) {
        test_tensor_errors();
        test_config_errors();
        test_span_errors();
        test_round_trip();
        test_par_pruned();
        test_par_plain_txl();
        test_half();
        if (fx[2].m) test_txl_errors();
        if (fx[3].m && fx[4].m) test_gpt_errors();
    }
    for (int k = 0; k < N_FIX; k++) {
        model_free(fx[k].m);
        st_close(fx[k].f);
    }
    unlink(ckpt);
    CHECK(rmdir(tmpdir) == 0, "temporary directory %s not empty", tmpdir);
    return test_summary("test_model_errors");
}
