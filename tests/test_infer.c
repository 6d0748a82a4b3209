/*
 * test_infer.c - scoring and generation over a stream's memory: chunked
 * scoring adds up to the whole, memory export/import, sampling, the
 * vocabulary.
 */
#include "err.h"
#include "harness.h"
#include "infer.h"
#include "model.h"
#include "sample.h"

static char path[1024];

static model_t *load(const char *name, mem_mode mode)
{
    char err[ERR_LEN];
    snprintf(path, sizeof path, "%s/fixtures/%s/model.safetensors", shared_dir(), name);
    model_t *m = model_load_mode(path, mode, err);
    CHECK(m != NULL, "%s", err);
    return m;
}

static int32_t *text_tokens(const model_t *m, size_t want, size_t *n)
{
    char p[1024], err[ERR_LEN];
    snprintf(p, sizeof p, "%s/data/tiny_shakespeare.txt", shared_dir());
    FILE *f = fopen(p, "rb");
    char *buf = malloc(want);
    size_t got = f ? fread(buf, 1, want, f) : 0;
    if (f) fclose(f);
    int32_t *t = NULL;
    CHECK(vocab_encode(&m->vocab, buf, got, &t, n, err) == 0, "%s", err);
    free(buf);
    return t;
}

/* Scoring in one call equals scoring in chunks of any sizes with the memory
 * carried; for adaptive-span to 1e-5 (block boundaries do not matter). */
static void check_chunks(const char *name, mem_mode mode)
{
    char err[ERR_LEN];
    model_t *m = load(name, mode);
    if (!m) return;
    size_t n;
    int32_t *t = text_tokens(m, 3000, &n);
    fwd_ws *ws = ws_new();
    mem_t *a = mem_new(m), *b = mem_new(m);
    score_t whole = {0, 0}, parts = {0, 0};
    float *pt_whole = malloc(n * sizeof(float)), *pt_parts = malloc(n * sizeof(float));
    CHECK(infer_score(m, a, ws, t, n, &whole, pt_whole, err) == 0, "%s", err);
    CHECK(whole.tokens == (long)n - 1, "%ld predictions of %zu tokens", whole.tokens, n);
    static const size_t sizes[] = {1, 7, 64, 65, 200, 3, 500, 1, 129};
    size_t at = 0;
    for (int i = 0; at < n; i = (i + 1) % 9) {
        size_t k = sizes[i] < n - at ? sizes[i] : n - at;
        long before = parts.tokens;
        CHECK(infer_score(m, b, ws, t + at, k, &parts, pt_parts + before, err) == 0, "%s", err);
        at += k;
    }
    CHECK(parts.tokens == whole.tokens, "%ld vs %ld predictions", parts.tokens, whole.tokens);
    double worst = 0;
    for (long i = 0; i < whole.tokens; i++) worst = fmax(worst, fabs(pt_whole[i] - pt_parts[i]));
    printf("%s: chunked vs whole: total nll %.9f vs %.9f, worst token %.2e\n", name, parts.nll_sum, whole.nll_sum, worst);
    if (m->fam == FAM_ASPAN) {
        CHECK_NEAR(parts.nll_sum / parts.tokens, whole.nll_sum / whole.tokens, 1e-5, "mean nll, chunked vs whole");
        CHECK(worst < 1e-5, "worst per-token difference %.3g", worst);
    } else {   /* PAR segments differ in where they start: close, not equal */
        CHECK_NEAR(parts.nll_sum / parts.tokens, whole.nll_sum / whole.tokens, 0.05, "mean nll, chunked vs whole");
    }
    CHECK(a->pending == t[n - 1] && b->pending == t[n - 1], "pending token");
    CHECK(a->pos == (int64_t)n - 1 && b->pos == (int64_t)n - 1, "positions %lld %lld", (long long)a->pos, (long long)b->pos);
    free(pt_whole);
    free(pt_parts);
    free(t);
    mem_free(a);
    mem_free(b);
    ws_free(ws);
    model_free(m);
}

/* A memory exported and imported gives the same next distribution; an
 * export refuses a model of another shape or weights. */
static void check_serialize(const char *name)
{
    char err[ERR_LEN];
    model_t *m = load(name, MEM_EXACT);
    if (!m) return;
    size_t n;
    int32_t *t = text_tokens(m, 500, &n);
    fwd_ws *ws = ws_new();
    mem_t *a = mem_new(m), *b = mem_new(m);
    score_t sc = {0, 0};
    CHECK(infer_score(m, a, ws, t, n - 1, &sc, NULL, err) == 0, "%s", err);
    size_t sz = mem_serial_size(a);
    unsigned char *buf = malloc(sz);
    CHECK(mem_serialize(a, buf, sz) == 0, "serialize");
    CHECK(mem_deserialize(b, buf, sz, err) == 0, "%s", err);
    score_t x = {0, 0}, y = {0, 0};
    CHECK(infer_score(m, a, ws, t + n - 1, 1, &x, NULL, err) == 0, "%s", err);
    CHECK(infer_score(m, b, ws, t + n - 1, 1, &y, NULL, err) == 0, "%s", err);
    CHECK(x.tokens == 1 && y.tokens == 1 && x.nll_sum == y.nll_sum, "after import: %.9g vs %.9g", x.nll_sum, y.nll_sum);
    /* damaged or foreign states are refused with a message */
    CHECK(mem_deserialize(b, buf, sz - 1, err) != 0 && strstr(err, "size"), "truncated: %s", err);
    buf[0] ^= 1;
    CHECK(mem_deserialize(b, buf, sz, err) != 0 && strstr(err, "magic"), "bad magic: %s", err);
    buf[0] ^= 1;
    buf[8] ^= 1;
    CHECK(mem_deserialize(b, buf, sz, err) != 0 && strstr(err, "another model"), "fingerprint: %s", err);
    buf[8] ^= 1;
    model_t *other = load(strcmp(name, "par-small") ? "par-small" : "aspan-small", MEM_EXACT);
    if (other) {
        mem_t *c = mem_new(other);
        CHECK(mem_deserialize(c, buf, sz, err) != 0 && strstr(err, "another model"), "other model: %s", err);
        mem_free(c);
        model_free(other);
    }
    free(buf);
    free(t);
    mem_free(a);
    mem_free(b);
    ws_free(ws);
    model_free(m);
}

static int collect(void *ctx, const char *s, size_t len)
{
    char *out = ctx;
    strncat(out, s, len);
    return 0;
}

static void check_generate(void)
{
    char err[ERR_LEN];
    model_t *m = load("aspan-small", MEM_EXACT);
    if (!m) return;
    fwd_ws *ws = ws_new();
    int32_t *p;
    size_t np;
    CHECK(vocab_encode(&m->vocab, "ROMEO:\n", 7, &p, &np, err) == 0, "%s", err);
    gen_params gp = {{0.8f, 0, 1.0f}, 42, 120, NULL, 0};
    gen_result r1, r2, r3;
    char streamed[4096] = "";
    mem_t *a = mem_new(m), *b = mem_new(m), *c = mem_new(m);
    CHECK(infer_generate(m, a, ws, p, np, &gp, collect, streamed, &r1, err) == 0, "%s", err);
    CHECK(infer_generate(m, b, ws, p, np, &gp, NULL, NULL, &r2, err) == 0, "%s", err);
    CHECK(r1.n_tokens == 120 && r1.finish == FINISH_LENGTH, "%d tokens, finish %d", r1.n_tokens, r1.finish);
    CHECK(strcmp(r1.text, r2.text) == 0, "same seed, same text");
    CHECK(strcmp(r1.text, streamed) == 0, "streamed pieces add up to the text");
    gp.seed = 43;
    CHECK(infer_generate(m, c, ws, p, np, &gp, NULL, NULL, &r3, err) == 0, "%s", err);
    CHECK(strcmp(r1.text, r3.text) != 0, "another seed, another text");
    gen_result_free(&r3);
    /* greedy: each token is the argmax of the distribution it was drawn from */
    mem_reset(c);
    gp.sp.temperature = 0;
    CHECK(infer_generate(m, c, ws, p, np, &gp, NULL, NULL, &r3, err) == 0, "%s", err);
    mem_t *d = mem_new(m);
    score_t sc = {0, 0};
    float *lp = malloc(sizeof(float) * m->V);
    int32_t *all = malloc(sizeof(int32_t) * (np + r3.n_tokens));
    memcpy(all, p, np * sizeof *all);
    memcpy(all + np, r3.tokens, r3.n_tokens * sizeof *all);
    float *pt = malloc(sizeof(float) * (np + r3.n_tokens));
    CHECK(infer_score(m, d, ws, all, np + r3.n_tokens, &sc, pt, err) == 0, "%s", err);
    int greedy_ok = 1;
    for (int i = 0; i < r3.n_tokens; i++)
        greedy_ok &= fabsf(pt[np - 1 + i] - r3.logprobs[i]) < 1e-4f;
    CHECK(greedy_ok, "generated logprobs equal scored logprobs");
    /* the generation left the memory where scoring the same tokens does */
    CHECK(c->pos == d->pos && c->pending == d->pending, "memory after generation: pos %lld/%lld", (long long)c->pos,
          (long long)d->pos);
    /* stop strings end the text before them */
    mem_reset(a);
    gp.sp.temperature = 0.8f;
    gp.seed = 42;
    const char *stop[] = {"e"};
    gp.stop = stop;
    gp.n_stop = 1;
    streamed[0] = 0;
    gen_result r4;
    CHECK(infer_generate(m, a, ws, p, np, &gp, collect, streamed, &r4, err) == 0, "%s", err);
    char *e = strchr(r1.text, 'e');
    CHECK(e && r4.finish == FINISH_STOP && r4.text_len == (size_t)(e - r1.text) && strcmp(r4.text, streamed) == 0,
          "stop: '%s' (finish %d) vs '%.*s'", r4.text, r4.finish, (int)(e ? e - r1.text : 0), r1.text);
    /* an empty prompt continues from the pending token; without one it is an error */
    mem_reset(a);
    gen_result_free(&r3);
    CHECK(infer_generate(m, a, ws, NULL, 0, &gp, NULL, NULL, &r3, err) != 0 && strstr(err, "empty"),
          "empty prompt: %s", err);
    gen_result_free(&r1);
    gen_result_free(&r2);
    gen_result_free(&r4);
    free(lp); free(all); free(pt); free(p);
    mem_free(a); mem_free(b); mem_free(c); mem_free(d);
    ws_free(ws);
    model_free(m);
}

static void check_sampling(void)
{
    float lp[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)}, scratch[8];
    rng_t r;
    rng_seed(&r, 1);
    sample_params greedy = {0, 0, 1}, k1 = {1, 1, 1}, plain = {1, 0, 1}, topk2 = {1, 2, 1}, topp = {1, 0, 0.7f};
    CHECK(sample_token(lp, 4, &greedy, &r, scratch) == 0, "greedy");
    CHECK(sample_token(lp, 4, &k1, &r, scratch) == 0, "top-k 1");
    int cnt[4] = {0}, cntk[4] = {0}, cntp[4] = {0};
    const int N = 200000;
    for (int i = 0; i < N; i++) {
        cnt[sample_token(lp, 4, &plain, &r, scratch)]++;
        cntk[sample_token(lp, 4, &topk2, &r, scratch)]++;
        cntp[sample_token(lp, 4, &topp, &r, scratch)]++;
    }
    static const double want[4] = {0.5, 0.3, 0.15, 0.05};
    for (int i = 0; i < 4; i++) CHECK_NEAR((double)cnt[i] / N, want[i], 0.005, "temperature 1 frequencies");
    CHECK_NEAR((double)cntk[0] / N, 0.5 / 0.8, 0.005, "top-k 2");
    CHECK(cntk[2] == 0 && cntk[3] == 0, "top-k 2 never draws the third");
    /* top-p 0.7: {0.5, 0.3} is the smallest set with mass >= 0.7 */
    CHECK_NEAR((double)cntp[1] / N, 0.3 / 0.8, 0.005, "top-p 0.7");
    CHECK(cntp[2] == 0 && cntp[3] == 0, "top-p excludes the tail");
    /* low temperature sharpens */
    sample_params cold = {0.1f, 0, 1};
    int c0 = 0;
    for (int i = 0; i < 10000; i++) c0 += sample_token(lp, 4, &cold, &r, scratch) == 0;
    CHECK(c0 > 9900, "temperature 0.1 picks the mode %d of 10000", c0);
}

static void check_vocab(void)
{
    char err[ERR_LEN];
    vocab_t v;
    CHECK(vocab_parse(&v, "[\"a\", \"b\", \"\\u00e9\", \"\\n\", \"\\u4e2d\"]", err) == 0, "%s", err);
    int32_t *t;
    size_t n;
    const char *s = "ab\xc3\xa9\n\xe4\xb8\xad" "a";
    CHECK(vocab_encode(&v, s, strlen(s), &t, &n, err) == 0 && n == 6, "%s", err);
    int32_t want[6] = {0, 1, 2, 3, 4, 0};
    CHECK(n == 6 && memcmp(t, want, sizeof want) == 0, "ids");
    char out[64];
    CHECK(vocab_decode(&v, t, n, out, sizeof out) == (int)strlen(s) && strcmp(out, s) == 0, "decode round trip");
    free(t);
    CHECK(vocab_encode(&v, "abz", 3, &t, &n, err) != 0 && strstr(err, "'z'") && strstr(err, "byte 2"), "unknown: %s", err);
    CHECK(vocab_encode(&v, "a\xff", 2, &t, &n, err) != 0 && strstr(err, "invalid UTF-8 at byte 1"), "bad utf8: %s", err);
    CHECK(vocab_encode(&v, "a\xc3", 2, &t, &n, err) != 0 && strstr(err, "invalid UTF-8"), "cut utf8: %s", err);
    CHECK(vocab_encode(&v, "\xc0\x80", 2, &t, &n, err) != 0, "overlong UTF-8 is refused");
    vocab_free(&v);
    CHECK(vocab_parse(&v, "[\"a\", \"a\"]", err) != 0 && strstr(err, "repeats"), "duplicate: %s", err);
    CHECK(vocab_parse(&v, "[\"ab\"]", err) != 0 && strstr(err, "one character"), "two chars: %s", err);
    CHECK(vocab_parse(&v, "[]", err) != 0, "empty vocab");
    CHECK(vocab_parse(&v, "{\"a\":1}", err) != 0, "not an array");
    CHECK(vocab_parse(&v, "[1]", err) != 0, "not strings");
}

int main(void)
{
    check_chunks("aspan-small", MEM_EXACT);
    check_chunks("aspan-small", MEM_SPAN);
    check_chunks("par-small", MEM_EXACT);
    check_serialize("aspan-small");
    check_serialize("par-small");
    check_generate();
    check_sampling();
    check_vocab();
    return test_summary("test_infer");
}
