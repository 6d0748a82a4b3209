/*
 * test_infer.c - scoring and generation over a stream's memory: chunked
 * scoring adds up to the whole, a stream batched with others gets the bits
 * it gets alone, memory export/import, sampling, the vocabulary, and the
 * attention weights recorded from the forward (attention.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "attention.h"
#include "err.h"
#include "fixtures.h"
#include "harness.h"
#include "infer.h"
#include "model.h"
#include "randmodel.h"
#include "sample.h"

#include <unistd.h>

static char path[1024];

static model_t *load(const char *name, mem_mode mode)
{
    char err[ERR_LEN], rel[256];
    snprintf(rel, sizeof rel, "fixtures/%s/model.safetensors", name);
    snprintf(path, sizeof path, "%s", ref_path(rel));
    model_t *m = model_load_mode(path, mode, err);
    CHECK(m != NULL, "%s", err);
    return m;
}

static int32_t *text_tokens(const model_t *m, size_t want, size_t *n)
{
    char err[ERR_LEN];
    FILE *f = fopen(ref_path("data/tiny_shakespeare.txt"), "rb");
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
    if (is_aspan(m)) {
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

/* The scoring block (model_score_block): adaptive-span reads k x block_len,
 * k the largest of 1..8 with k x block_len <= 4096 (random models of
 * block 20, 600 and 5000, with and without persistent memory: 160, 3600,
 * 5000); PAR keeps block_len; a stream's mem_block is it. A text scored in
 * those blocks equals the same text fed by hand in blocks of block_len to
 * float rounding (the math does not depend on the cut), and fed by hand in
 * scoring blocks, bit for bit. */
static double worst_diff(const float *a, const float *b, size_t n);

/* P (a mkstemp template) made a new empty file's name; -1 (a failed check) if not. */
static int temp_file(char *p)
{
    int fd = mkstemp(p);
    CHECK(fd >= 0, "mkstemp %s", p);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}


static void check_score_block(void)
{
    char err[ERR_LEN], p[] = "/tmp/spanserve-sblock-XXXXXX";
    if (temp_file(p)) return;
    float z[2 * 3] = {0.1f, 0.6f, 1.0f, 0.0f, 0.3f, 0.9f};
    static const int blocks[3] = {20, 600, 5000}, want[3] = {160, 3600, 5000};
    for (int i = 0; i < 3; i++)
        for (int pers = 0; pers < 2; pers++) {
            const rm_aspan c = {37, 24, 3, 40, 2, 70, blocks[i], 8, z, pers ? 5 : 0};
            CHECK(rm_write_aspan(p, &c, 31 + i, err) == 0, "%s", err);
            model_t *m = model_load(p, err);
            CHECK(m != NULL, "%s", err);
            if (!m) continue;
            mem_t *s = mem_new(m);
            CHECK(model_score_block(m) == want[i] && s && mem_block(s) == want[i],
                  "aspan (persistent %d) of block %d: scoring block %d, stream's %d, not %d", pers, blocks[i],
                  model_score_block(m), s ? mem_block(s) : -1, want[i]);
            mem_free(s);
            model_free(m);
        }
    unlink(p);
    model_t *m = load("par-small", MEM_EXACT);
    CHECK(!m || model_score_block(m) == m->block_len, "par-small: scoring block %d, not its segment %d",
          m ? model_score_block(m) : -1, m ? m->block_len : -1);
    model_free(m);
    for (int mode = 0; mode < 2; mode++) {
        m = load("aspan-small", mode ? MEM_SPAN : MEM_EXACT);
        if (!m) continue;
        const int L = m->block_len, SB = model_score_block(m), V = m->V;
        CHECK(SB == 8 * L, "aspan-small: scoring block %d, not 8 x %d", SB, L);
        size_t n;
        int32_t *t = text_tokens(m, 3 * (size_t)SB + 100, &n);   /* three scoring blocks and a rest */
        fwd_ws *ws = ws_new();
        mem_t *a = mem_new(m), *b = mem_new(m), *c = mem_new(m);
        score_t sa = {0, 0};
        float *pa = malloc(n * sizeof *pa), *lp = malloc((size_t)SB * V * sizeof *lp), *pb = malloc(n * sizeof *pb),
              *pc = malloc(n * sizeof *pc);
        CHECK(infer_score(m, a, ws, t, n, &sa, pa, err) == 0, "%s", err);
        /* by hand: inputs t[0..n-2] predicting t[1..n-1], in blocks of K */
        for (int pass = 0; pass < 2; pass++) {
            const size_t K = pass ? (size_t)SB : (size_t)L;
            mem_t *s = pass ? c : b;
            float *out = pass ? pc : pb;
            for (size_t at = 0; at + 1 < n; at += K) {
                const size_t k = n - 1 - at < K ? n - 1 - at : K;
                CHECK(model_forward(m, &s, 1, t + at, (int)k, lp, ws, err) == 0, "%s", err);
                for (size_t i = 0; i < k; i++) out[at + i] = lp[i * V + t[at + i + 1]];
            }
        }
        CHECK(sa.tokens == (long)n - 1 && memcmp(pa, pc, (n - 1) * sizeof *pa) == 0,
              "aspan-small: a text scored is not its scoring blocks fed by hand (worst %.3g)", worst_diff(pa, pc, n - 1));
        const double w = worst_diff(pa, pb, n - 1);
        printf("aspan-small (%s memory): %zu tokens in blocks of %d vs %d: worst token %.2e\n", mode ? "span" : "exact",
               n, SB, L, w);
        CHECK(w < 1e-5, "aspan-small: blocks of %d vs %d: worst token %.3g", SB, L, w);
        free(pa); free(pb); free(pc); free(lp); free(t);
        mem_free(a); mem_free(b); mem_free(c);
        ws_free(ws);
        model_free(m);
    }
}

#define MANY_B 6

/* infer_score_many equals infer_score stream by stream, bit for bit: streams
 * at different positions, with and without a pending token, one with nothing
 * to predict, in rounds of different block counts (under, at and over the
 * model's block length); a prompt read by infer_feed_many beside them in
 * blocks of other lengths equals gen_prefill's to 1e-5; the memories carry
 * on alike. */
static void check_many(const char *name, mem_mode mode)
{
    char err[ERR_LEN];
    model_t *m = load(name, mode);
    if (!m) return;
    size_t n;
    int32_t *t = text_tokens(m, 20000, &n);
    fwd_ws *ws = ws_new();
    const int L = m->block_len;
    /* streams prepared alike, REF[b] to score alone and BAT[b] batched: PRE[b]
     * tokens of the text at OFF[b] scored (0: fresh, without a pending token) */
    static const size_t pre[MANY_B] = {0, 37, 1, 0, 200, 0};
    static const size_t off[MANY_B] = {0, 1000, 2500, 4000, 6000, 9000};
    mem_t *ref[MANY_B], *bat[MANY_B];
    score_t sink = {0, 0};
    for (int b = 0; b < MANY_B; b++) {
        ref[b] = mem_new(m);
        bat[b] = mem_new(m);
        CHECK(infer_score(m, ref[b], ws, t + off[b], pre[b], &sink, NULL, err) == 0, "%s", err);
        CHECK(infer_score(m, bat[b], ws, t + off[b], pre[b], &sink, NULL, err) == 0, "%s", err);
    }
    /* rounds: M inputs per stream; stream 5 only takes a pending token, then scores nothing */
    const size_t rounds[] = {1, 50, (size_t)L, (size_t)L + 17, 3, 2 * (size_t)L + 1};
    size_t at[MANY_B] = {0};
    for (size_t b = 0; b < MANY_B; b++) at[b] = off[b] + pre[b];
    float *pr = malloc(sizeof(float) * (3 * L + 2)), *pb = malloc(sizeof(float) * MANY_B * (3 * L + 2));
    double worst = 0;
    int same_counts = 1, same_state = 1;
    for (size_t r = 0; r < sizeof rounds / sizeof *rounds; r++) {
        size_t M = rounds[r];
        score_job jobs[MANY_B];
        score_t ob[MANY_B], orf[MANY_B];
        for (int b = 0; b < MANY_B; b++) {
            size_t k = M + (bat[b]->pending < 0);   /* a fresh stream feeds one token more than it predicts */
            if (b == 5) k = r == 0;   /* one token of a fresh stream, then none: nothing to predict */
            ob[b] = orf[b] = (score_t){b, 0.5 * b};   /* totals are added to */
            jobs[b] = (score_job){bat[b], t + at[b], k, &ob[b], pb + (size_t)b * (3 * L + 2)};
        }
        CHECK(infer_score_many(m, jobs, MANY_B, ws, err) == 0, "round %zu: %s", r, err);
        for (int b = 0; b < MANY_B; b++) {
            CHECK(infer_score(m, ref[b], ws, t + at[b], jobs[b].n, &orf[b], pr, err) == 0, "%s", err);
            same_counts &= ob[b].tokens == orf[b].tokens;
            CHECK(ob[b].nll_sum == orf[b].nll_sum, "total nll, batched vs alone: %.17g vs %.17g", ob[b].nll_sum,
                  orf[b].nll_sum);
            for (long i = 0; i < orf[b].tokens - b; i++) worst = fmax(worst, fabs(pr[i] - jobs[b].per_token[i]));
            same_state &= ref[b]->pos == bat[b]->pos && ref[b]->pending == bat[b]->pending;
            at[b] += jobs[b].n;
        }
        CHECK(ob[0].tokens == (long)M && ob[1].tokens == 1 + (long)M && ob[5].tokens == 5,
              "round %zu: %ld, %ld, %ld predictions", r, ob[0].tokens, ob[1].tokens, ob[5].tokens);
    }
    printf("%s: %d streams batched vs alone: worst token %.2e\n", name, MANY_B, worst);
    CHECK(same_counts, "the same predictions counted");
    CHECK(worst == 0, "worst per-token difference %.3g", worst);
    CHECK(same_state, "the same positions and pending tokens");

    /* a prompt read beside two texts, against gen_prefill alone */
    gen_params gp = {{0, 0, 1.0f}, 1, 4, NULL, 0};
    gen_state ga, gb;
    mem_t *pa = mem_new(m), *pbm = mem_new(m);
    const size_t np = 2 * (size_t)L + 9;
    CHECK(gen_begin(&ga, m, pa, t + 12000, np, &gp, 2, 1, err) == 0, "%s", err);
    CHECK(gen_begin(&gb, m, pbm, t + 12000, np, &gp, 2, 1, err) == 0, "%s", err);
    long left;
    while ((left = gen_prefill(&ga, ws, err)) > 0) {}
    CHECK(left == 0, "%s", err);
    gen_state *gs = &gb;
    size_t M = 30;
    while (gen_prefill_left(&gb) > 0) {
        M = M < gen_prefill_left(&gb) ? M : gen_prefill_left(&gb);
        score_job jobs[2];
        score_t o[2] = {{0, 0}, {0, 0}};
        for (int b = 0; b < 2; b++) {
            jobs[b] = (score_job){bat[b], t + at[b], M + (bat[b]->pending < 0), &o[b], NULL};
            at[b] += jobs[b].n;
        }
        CHECK(infer_feed_many(m, jobs, 2, &gs, 1, M, ws, err) == 0, "%s", err);
        M = M * 2 + 1;
    }
    double wg = 0;
    for (size_t i = 1; i < np; i++) wg = fmax(wg, fabs(ga.prompt_lp[i] - gb.prompt_lp[i]));
    wg = fmax(wg, fabs(ga.picked.lp - gb.picked.lp));
    CHECK(ga.picked.token == gb.picked.token, "the next token picked alone and beside texts");
    CHECK(wg < 1e-5, "prompt read beside texts vs alone: worst %.3g", wg);
    CHECK(memcmp(ga.prompt_top + 2, gb.prompt_top + 2, (np - 1) * 2 * sizeof(int32_t)) == 0, "the same top tokens");
    CHECK(pa->pos == pbm->pos && pa->pending == pbm->pending, "prompt memories at %lld/%lld",
          (long long)pa->pos, (long long)pbm->pos);
    gen_result res;
    gen_end(&ga, &res);
    gen_result_free(&res);
    gen_end(&gb, &res);
    gen_result_free(&res);

    /* what the streams must agree on, and what is refused */
    const int64_t pos0 = bat[0]->pos;
    score_t o[2] = {{0, 0}, {0, 0}};
    score_job bad[2] = {{bat[0], t, 10, &o[0], NULL}, {bat[1], t, 11, &o[1], NULL}};
    CHECK(infer_score_many(m, bad, 2, ws, err) != 0 && strstr(err, "inputs"), "unequal inputs: %s", err);
    bad[1].s = bat[0];
    bad[1].n = 10;
    CHECK(infer_score_many(m, bad, 2, ws, err) != 0 && strstr(err, "share one memory"), "shared memory: %s", err);
    int32_t wrong[3] = {1, m->V, 2};
    bad[1] = (score_job){bat[1], wrong, 3, &o[1], NULL};
    bad[0].n = 3;
    CHECK(infer_score_many(m, bad, 2, ws, err) != 0 && strstr(err, "outside the vocabulary"), "bad token: %s", err);
    CHECK(o[0].tokens == 0 && o[1].tokens == 0 && bat[0]->pos == pos0, "a refused call changes nothing");

    free(pr);
    free(pb);
    free(t);
    for (int b = 0; b < MANY_B; b++) {
        mem_free(ref[b]);
        mem_free(bat[b]);
    }
    mem_free(pa);
    mem_free(pbm);
    ws_free(ws);
    model_free(m);
}

#define CO_MAX 17   /* streams in the largest batch: one and 16 others */

/* The same memory, bit for bit: rings, rows held, position, pending token. */
static int mem_same(const mem_t *a, const mem_t *b)
{
    return a->pos == b->pos && a->pending == b->pending && a->n_floats == b->n_floats &&
           memcmp(a->buf, b->buf, a->n_floats * sizeof *a->buf) == 0 &&
           memcmp(a->len, b->len, (size_t)a->m->n_layers * sizeof *a->len) == 0;
}

static double worst_diff(const float *a, const float *b, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
    return w;
}

/* A companion of the readers in check_feed_alone_or_batched: a stream reading
 * its own text, M inputs a call. */
typedef struct {
    mem_t *s;
    const int32_t *toks;
    size_t at;
    score_t out;
} companion;

/* A text scored and a prompt read through infer_feed_many as the scheduler
 * feeds them (reader_batch: blocks of the stream's block, mem_block, from
 * the start, with the readers whose own next block has the same length)
 * beside other texts and a prompt, against infer_score and gen_prefill
 * alone: the same per-token logprobs, totals, next-token distribution and
 * memories, bit for bit. */
static void check_feed_alone_or_batched(const char *name, model_t *m, mem_t *const *prim, const int32_t *t)
{
    char err[ERR_LEN];
    const int L = mem_block(prim[0]);   /* the scoring block: block_len x 8 for adaptive-span (model_score_block) */
    fwd_ws *ws = ws_new();
    const int32_t *text = t + 5000, *prompt = t + 6000;
    const size_t n = 2 * (size_t)L + 7, np = (size_t)L + 5;
    gen_params gp = {{0, 0, 1.0f}, 1, 2, NULL, 0};
    /* alone */
    mem_t *sa = mem_new(m), *ga_mem = mem_new(m);
    mem_copy(sa, prim[1]);
    mem_copy(ga_mem, prim[2]);
    score_t oa = {0, 0};
    float *pa = malloc(n * sizeof *pa), *pb = malloc(n * sizeof *pb);
    CHECK(infer_score(m, sa, ws, text, n, &oa, pa, err) == 0, "%s", err);
    gen_state ga, gb;
    CHECK(gen_begin(&ga, m, ga_mem, prompt, np, &gp, 0, 1, err) == 0, "%s", err);
    long left;
    while ((left = gen_prefill(&ga, ws, err)) > 0) {}
    CHECK(left == 0, "%s", err);
    /* batched: the two readers beside three texts and a long prompt */
    mem_t *sb = mem_new(m), *gb_mem = mem_new(m), *cg_mem = mem_new(m);
    mem_copy(sb, prim[1]);
    mem_copy(gb_mem, prim[2]);
    mem_copy(cg_mem, prim[3]);
    gen_state cg;
    CHECK(gen_begin(&gb, m, gb_mem, prompt, np, &gp, 0, 1, err) == 0, "%s", err);
    CHECK(gen_begin(&cg, m, cg_mem, t + 7000, 8 * (size_t)L, &gp, 0, 0, err) == 0, "%s", err);
    companion co[3];
    for (int c = 0; c < 3; c++) {
        co[c] = (companion){mem_new(m), t + 8000 + 500 * c, 0, {0, 0}};
        mem_copy(co[c].s, prim[4 + c]);
    }
    score_t ob = {0, 0};
    size_t fed = 0;   /* the text's inputs fed: all n after its pending token */
    CHECK(sb->pending >= 0 && gb_mem->pending >= 0, "%s: the readers continue streams", name);
    while (fed < n || gen_prefill_left(&gb) > 0) {
        const size_t ls = n - fed, lg = gen_prefill_left(&gb), bs = ls < (size_t)L ? ls : (size_t)L,
                     bg = lg < (size_t)L ? lg : (size_t)L, M = bs ? bs : bg;
        score_job jobs[4];
        gen_state *gens[2] = {&cg, &gb};
        int ns = 0, ng = 1 + (bg == M);
        if (bs == M) jobs[ns++] = (score_job){sb, text + fed, M, &ob, pb + fed};
        for (int c = 0; c < 3; c++) {
            companion *k = &co[c];
            size_t kn = M + (k->s->pending < 0);
            jobs[ns++] = (score_job){k->s, k->toks + k->at, kn, &k->out, NULL};
            k->at += kn;
        }
        CHECK(infer_feed_many(m, jobs, ns, gens, ng, M, ws, err) == 0, "%s", err);
        if (bs == M) fed += M;
    }
    CHECK(ob.tokens == oa.tokens && ob.nll_sum == oa.nll_sum && memcmp(pa, pb, n * sizeof *pa) == 0,
          "%s: a text scored beside others: %ld predictions, nll %.17g vs %.17g alone, worst token %.3g", name,
          ob.tokens, ob.nll_sum, oa.nll_sum, worst_diff(pa, pb, n));
    CHECK(memcmp(ga.prompt_lp, gb.prompt_lp, np * sizeof *pa) == 0 && memcmp(&ga.picked, &gb.picked, sizeof ga.picked) == 0,
          "%s: a prompt read beside others: worst prompt token %.3g, next token %d (%.9g) vs %d (%.9g)", name,
          worst_diff(ga.prompt_lp, gb.prompt_lp, np), ga.picked.token, ga.picked.lp, gb.picked.token, gb.picked.lp);
    CHECK(mem_same(sa, sb) && mem_same(ga_mem, gb_mem), "%s: the memories after reading, alone and beside others", name);
    gen_result r;
    gen_state *all[3] = {&ga, &gb, &cg};
    for (int i = 0; i < 3; i++) {
        gen_end(all[i], &r);
        gen_result_free(&r);
    }
    for (int c = 0; c < 3; c++) mem_free(co[c].s);
    mem_free(sa); mem_free(sb); mem_free(ga_mem); mem_free(gb_mem); mem_free(cg_mem);
    free(pa);
    free(pb);
    ws_free(ws);
}

/* A stream forwarded alone and among others (their own texts, at other
 * positions; the stream anywhere in the batch) gets the same bits: its
 * logprobs and its memory after the block, for one token (a decode step), a
 * few, and a whole block; then the readers of check_feed_alone_or_batched. */
static void check_alone_or_batched(const char *name, model_t *m)
{
    char err[ERR_LEN];
    const int L = m->block_len, V = m->V;
    /* token ids: any will do, a fixed pseudo-random sequence */
    const size_t nt = 12000 + 10 * (size_t)L;
    int32_t *t = malloc(nt * sizeof *t);
    uint64_t r = 7;
    for (size_t i = 0; i < nt; i++) t[i] = (int32_t)((r = r * 6364136223846793005ULL + 1442695040888963407ULL) >> 33) % V;
    fwd_ws *ws = ws_new();
    /* prim[b]: stream b after the first 20 + 37 b^2 % 300 tokens of its own part of the text */
    mem_t *prim[CO_MAX], *run[CO_MAX], *solo = mem_new(m);
    score_t sink = {0, 0};
    for (int b = 0; b < CO_MAX; b++) {
        prim[b] = mem_new(m);
        run[b] = mem_new(m);
        CHECK(infer_score(m, prim[b], ws, t + 100 * b, (size_t)(20 + 37 * b * b) % 300, &sink, NULL, err) == 0, "%s", err);
    }
    static const int Ms[] = {1, 2, 3, 17, 0}, Bs[] = {2, 3, 5, 16, CO_MAX};   /* 0: block_len */
    float *alone = malloc((size_t)L * V * sizeof *alone), *lp = malloc((size_t)CO_MAX * L * V * sizeof *lp);
    int32_t *in = malloc((size_t)CO_MAX * L * sizeof *in);
    const int32_t *own = t + 3000;   /* the stream's block */
    int cases = 0, same = 0;
    for (size_t i = 0; i < sizeof Ms / sizeof *Ms; i++)
        for (size_t k = 0; k < sizeof Bs / sizeof *Bs; k++) {
            const int M = Ms[i] && Ms[i] < L ? Ms[i] : L, B = Bs[k], j = (int)(i + 2 * k) % B;   /* j: its place */
            CHECK(mem_copy(solo, prim[0]) == 0 && model_forward(m, &solo, 1, own, M, alone, ws, err) == 0, "%s", err);
            for (int b = 0, o = 1; b < B; b++) {
                CHECK(mem_copy(run[b], b == j ? prim[0] : prim[o++]) == 0, "copy");
                memcpy(in + (size_t)b * M, b == j ? own : t + 2000 + 50 * b, (size_t)M * sizeof *in);
            }
            CHECK(model_forward(m, run, B, in, M, lp, ws, err) == 0, "%s", err);
            const float *mine = lp + (size_t)j * M * V;
            int ok = memcmp(alone, mine, (size_t)M * V * sizeof *lp) == 0 && mem_same(solo, run[j]);
            CHECK(ok, "%s: %d tokens as stream %d of %d: other bits than alone (worst logprob %.3g, memory %s)", name, M,
                  j, B, worst_diff(alone, mine, (size_t)M * V), mem_same(solo, run[j]) ? "the same" : "other");
            cases++;
            same += ok;
        }
    printf("%s: a stream alone or among others: %d of %d cases bit for bit\n", name, same, cases);
    check_feed_alone_or_batched(name, m, prim, t);
    for (int b = 0; b < CO_MAX; b++) {
        mem_free(prim[b]);
        mem_free(run[b]);
    }
    mem_free(solo);
    free(alone);
    free(lp);
    free(in);
    free(t);
    ws_free(ws);
}

/* check_alone_or_batched on random models of odd sizes (rows of any stride,
 * so a stream's rows start anywhere in memory; small ones, and wider ones
 * whose products are past OpenBLAS's small-matrix kernels) and on the
 * fixtures. */
static void check_batch_invariance(void)
{
    char err[ERR_LEN], p[] = "/tmp/spanserve-infer-XXXXXX";
    if (temp_file(p)) return;
    float z[2 * 3] = {0.1f, 0.6f, 1.0f, 0.0f, 0.3f, 0.9f};
    const rm_aspan as[2] = {{37, 36, 3, 52, 2, 70, 20, 8, z, 0}, {37, 132, 3, 264, 1, 60, 48, 8, z, 0}};
    const rm_par ps[2] = {{37, 40, 3, 11, 56, 30, 20, 0, "afsa"}, {37, 132, 3, 44, 264, 30, 48, 0, "afsa"}};
    static const char *an[2][2] = {{"random aspan", "random aspan (span memory)"},
                                   {"wide random aspan", "wide random aspan (span memory)"}},
                      *pn[2] = {"random par", "wide random par"};
    for (int w = 0; w < 2; w++) {
        CHECK(rm_write_aspan(p, &as[w], 21 + w, err) == 0, "%s", err);
        for (int mode = 0; mode < 2; mode++) {
            model_t *m = model_load_mode(p, mode ? MEM_SPAN : MEM_EXACT, err);
            CHECK(m != NULL, "%s: %s", an[w][mode], err);
            if (m) check_alone_or_batched(an[w][mode], m);
            model_free(m);
        }
        CHECK(rm_write_par(p, &ps[w], 23 + w, err) == 0, "%s", err);
        model_t *m = model_load(p, err);
        CHECK(m != NULL, "%s: %s", pn[w], err);
        if (m) check_alone_or_batched(pn[w], m);
        model_free(m);
    }
    unlink(p);
    model_t *m;
    static const char *fx[3] = {"aspan-small", "aspan-small", "par-small"};
    for (int i = 0; i < 3; i++) {
        m = load(fx[i], i == 1 ? MEM_SPAN : MEM_EXACT);
        if (m) check_alone_or_batched(i == 1 ? "aspan-small (span memory)" : fx[i], m);
        model_free(m);
    }
}

/* model_forward_pick_while on the CPU: the host's work runs once, before
 * the forward (the memories not yet advanced), the picks are
 * model_forward_pick's bits, and a step refused before it starts (a token
 * outside the vocabulary) never calls it. */
typedef struct {
    mem_t **mems;
    int B, calls;
    long long pos_seen;
} pick_while_seen;

static void pick_while_note(void *ctx, int may_block)
{
    pick_while_seen *w = ctx;
    w->calls += may_block ? 1 : 100;   /* no lock of the model is held on the CPU */
    w->pos_seen = w->mems[w->B - 1]->pos;
}

static void check_pick_while(void)
{
    char err[ERR_LEN], p[] = "/tmp/spanserve-infer-XXXXXX";
    if (temp_file(p)) return;
    float z[2 * 3] = {0.1f, 0.6f, 1.0f, 0.0f, 0.3f, 0.9f};
    const rm_aspan as = {37, 36, 3, 52, 2, 70, 20, 8, z, 0};
    CHECK(rm_write_aspan(p, &as, 29, err) == 0, "%s", err);
    model_t *m = model_load(p, err);
    unlink(p);
    CHECK(m != NULL, "%s", err);
    if (!m) return;
    fwd_ws *ws = ws_new();
    enum { B = 3 };
    mem_t *a[B], *b[B];
    for (int i = 0; i < B; i++) a[i] = mem_new(m), b[i] = mem_new(m);
    int32_t tok[B] = {1, 5, 9};
    pick_req q[B];
    pick_out oa[B], ob[B];
    int same = 1, calls_ok = 1, before_ok = 1;
    for (int step = 0; step < 12; step++) {
        for (int i = 0; i < B; i++)
            q[i] = (pick_req){i, 1, {0.7f + 0.1f * i, i == 1 ? 5 : 0, i == 2 ? 0.9 : 1.0}, 0.13 + 0.27 * i, 2};
        pick_while_seen w = {a, B, 0, -1};
        const long long pos0 = a[B - 1]->pos;
        CHECK(model_forward_pick_while(m, a, B, tok, 1, NULL, NULL, B, q, oa, pick_while_note, &w, ws, err) == 0,
              "%s", err);
        CHECK(model_forward_pick(m, b, B, tok, 1, NULL, NULL, B, q, ob, ws, err) == 0, "%s", err);
        calls_ok &= w.calls == 1;
        before_ok &= w.pos_seen == pos0 && a[B - 1]->pos == pos0 + 1;
        for (int i = 0; i < B; i++) {
            same &= oa[i].token == ob[i].token && oa[i].lp == ob[i].lp;
            for (int k = 0; k < q[i].top_n; k++) same &= oa[i].top[k] == ob[i].top[k] && oa[i].top_lp[k] == ob[i].top_lp[k];
            tok[i] = oa[i].token;
        }
    }
    CHECK(calls_ok, "the host's work ran once a step");
    CHECK(before_ok, "before the forward, on the CPU");
    CHECK(same, "the picks are model_forward_pick's");
    int32_t bad[B] = {1, m->V, 2};
    pick_while_seen w = {a, B, 0, -1};
    CHECK(model_forward_pick_while(m, a, B, bad, 1, NULL, NULL, B, q, oa, pick_while_note, &w, ws, err) != 0 &&
              w.calls == 0,
          "a refused step does not call it (%d calls): %s", w.calls, err);
    for (int i = 0; i < B; i++) mem_free(a[i]), mem_free(b[i]);
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
    /* the message says what is wrong, not "N bytes, expected N" */
    CHECK(mem_deserialize(b, buf, sz - 1, err) != 0 && strstr(err, "shorter than the"), "truncated: %s", err);
    unsigned char *longer = calloc(1, sz + 1);
    memcpy(longer, buf, sz);
    CHECK(mem_deserialize(b, longer, sz + 1, err) != 0 && strstr(err, "longer than the"), "longer: %s", err);
    free(longer);
    uint64_t nf_bad = a->n_floats + 1;
    memcpy(buf + 32, &nf_bad, 8);
    CHECK(mem_deserialize(b, buf, sz, err) != 0 && strstr(err, "floats"), "float count: %s", err);
    memcpy(buf + 32, &a->n_floats, 8);
    uint32_t nl_bad = (uint32_t)m->n_layers + 1;
    memcpy(buf + 28, &nl_bad, 4);
    CHECK(mem_deserialize(b, buf, sz, err) != 0 && strstr(err, "layers"), "layer count: %s", err);
    nl_bad--;
    memcpy(buf + 28, &nl_bad, 4);
    /* one bound on positions for import, feeding and export: a stream imported at the last position it may
     * hold takes its pending token, refuses one more, and what it exports imports again */
    {
        mem_t *c = mem_new(m);
        int64_t last = MEM_MAX_POS - 1;
        unsigned char *edge = malloc(sz);
        memcpy(edge, buf, sz);
        memcpy(edge + 16, &last, 8);
        int ok = is_aspan(m) && c && mem_deserialize(c, edge, sz, err) == 0;
        if (is_aspan(m)) {   /* par's rows per layer follow the position: set by the model's own feeding */
            CHECK(ok && c->pending >= 0 && mem_room(c) == 0, "import at 2^53 - 1: %s room %lld", err,
                  ok ? (long long)mem_room(c) : -1LL);
            float *row = malloc((size_t)m->V * sizeof *row);
            int32_t p = c->pending;
            CHECK(ok && model_forward(m, &c, 1, &p, 1, row, ws, err) == 0 && c->pos == MEM_MAX_POS, "feed: %s", err);
            c->pending = -1;
            CHECK(ok && model_forward(m, &c, 1, &p, 1, row, ws, err) != 0 && strstr(err, "at most"),
                  "past the bound: %s", err);
            CHECK(ok && mem_serialize(c, edge, sz) == 0 && mem_deserialize(b, edge, sz, err) == 0,
                  "export at the bound imports again: %s", err);
            free(row);
        }
        memcpy(edge + 16, &(int64_t){MEM_MAX_POS}, 8);
        int32_t pend = 0;
        memcpy(edge + 24, &pend, 4);
        CHECK(mem_deserialize(c, edge, sz, err) != 0 && strstr(err, "at most"), "2^53 with a pending token: %s", err);
        free(edge);
        mem_free(c);
    }
    buf[0] ^= 1;
    CHECK(mem_deserialize(b, buf, sz, err) != 0 && strstr(err, "magic"), "bad magic: %s", err);
    buf[0] ^= 1;
    buf[8] ^= 1;
    CHECK(mem_deserialize(b, buf, sz, err) != 0 && strstr(err, "another model"), "fingerprint: %s", err);
    buf[8] ^= 1;
    /* a state's values: finite, within +-1e8; at the bound (every value, in
     * turn +1e8 and -1e8) the model still predicts finite log-probabilities */
    const size_t at = sz - a->n_floats * sizeof(float);
    float v = NAN;
    memcpy(buf + at + 4 * 17, &v, 4);
    CHECK(mem_deserialize(b, buf, sz, err) != 0 && strstr(err, "value 17 is nan"), "NaN: %s", err);
    v = 1.5e8f;
    memcpy(buf + at + 4 * 17, &v, 4);
    CHECK(mem_deserialize(b, buf, sz, err) != 0 && strstr(err, "finite values within"), "1.5e8: %s", err);
    for (size_t i = 0; i < a->n_floats; i++) {
        v = i % 2 ? -1e8f : 1e8f;
        memcpy(buf + at + 4 * i, &v, 4);
    }
    CHECK(mem_deserialize(b, buf, sz, err) == 0, "at the bound: %s", err);
    float *lp = malloc((size_t)m->V * 4 * sizeof *lp);
    int32_t four[4] = {t[0], t[1], t[2], t[3]};
    CHECK(lp && model_forward(m, &b, 1, four, 4, lp, ws, err) == 0, "%s", err);
    int finite = 1;
    for (int i = 0; lp && i < m->V * 4; i++) finite &= isfinite(lp[i]) != 0;
    CHECK(finite, "%s: a state at the bound gives non-finite log-probabilities", name);
    free(lp);
    int64_t far = INT64_C(1) << 60;
    memcpy(buf + 16, &far, 8);
    CHECK(mem_deserialize(b, buf, sz, err) != 0 && strstr(err, "position"), "position 2^60: %s", err);
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
    float lp[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    _Alignas(uint64_t) float scratch[SAMPLE_SCRATCH(4)];   /* the sampler keeps 64-bit weights there */
    rng_t r;
    rng_seed(&r, 1);
    sample_params greedy = {0, 0, 1}, k1 = {1, 1, 1}, plain = {1, 0, 1}, topk2 = {1, 2, 1}, topp = {1, 0, 0.7f};
    CHECK(sample_token(lp, 4, &greedy, rng_uniform(&r), scratch) == 0, "greedy");
    CHECK(sample_token(lp, 4, &k1, rng_uniform(&r), scratch) == 0, "top-k 1");
    int cnt[4] = {0}, cntk[4] = {0}, cntp[4] = {0};
    const int N = 200000;
    for (int i = 0; i < N; i++) {
        cnt[sample_token(lp, 4, &plain, rng_uniform(&r), scratch)]++;
        cntk[sample_token(lp, 4, &topk2, rng_uniform(&r), scratch)]++;
        cntp[sample_token(lp, 4, &topp, rng_uniform(&r), scratch)]++;
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
    for (int i = 0; i < 10000; i++) c0 += sample_token(lp, 4, &cold, rng_uniform(&r), scratch) == 0;
    CHECK(c0 > 9900, "temperature 0.1 picks the mode %d of 10000", c0);

    /* sample_pick: the draw is sample_token's for the same u; the top tokens
     * by value, the lowest id first on ties; a row that is not finite picks
     * nothing */
    float tie[6] = {logf(0.1f), logf(0.3f), logf(0.1f), logf(0.3f), logf(0.1f), logf(0.1f)};
    _Alignas(uint64_t) float sc[SAMPLE_SCRATCH(6)];
    pick_req q = {0, 1, {1, 0, 1}, 0, 3};
    pick_out o;
    for (int i = 0; i < 1000; i++) {
        q.u = rng_uniform(&r);
        q.sp = (sample_params){0.5 + (i % 3), i % 4, i % 5 ? 0.2 * (i % 5) : 1};
        CHECK(sample_pick(tie, 6, &q, &o, sc) == 0 && o.token == sample_token(tie, 6, &q.sp, q.u, sc) &&
                  o.lp == tie[o.token], "pick %d: %d", i, o.token);
    }
    CHECK(o.top[0] == 1 && o.top[1] == 3 && o.top[2] == 0 && o.top_lp[2] == tie[0], "top %d %d %d", o.top[0], o.top[1],
          o.top[2]);
    q.sp = (sample_params){0, 0, 1};
    CHECK(sample_pick(tie, 6, &q, &o, sc) == 0 && o.token == 1, "greedy: the lowest id of the tied best (%d)", o.token);
    q.sample = 0, q.top_n = 5;
    CHECK(sample_pick(tie, 6, &q, &o, sc) == 0 && o.top[4] == 4 && o.top_lp[4] == tie[4], "top 5: %d", o.top[4]);
    tie[5] = NAN;
    CHECK(sample_pick(tie, 6, &q, &o, sc) == -1 && o.token == -1, "not finite");
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

/* Words as kimiyoung's Vocab reads a file: lines (\n, \r\n, \r), Python's
 * whitespace, <eos> per line (not after a prompt's last line), <unk>. */
static void check_words(void)
{
    char err[ERR_LEN];
    vocab_t v;
    const tokenizer *w = vocab_kind("words");
    CHECK(w != NULL && vocab_kind("chars") != NULL && vocab_kind("bytes") == NULL, "the kinds");
    if (!w) return;
    CHECK(vocab_parse_kind(&v, w, "[\"<eos>\", \"<unk>\", \"the\", \"cat\", \"sat\", \"\u00e9t\u00e9\"]", err) == 0,
          "%s", err);
    CHECK(v.n == 6 && v.eos == 0 && v.unk == 1 && !w->per_character && vocab_kind("chars")->per_character, "ids");
    /* two spaces, a tab, a no-break space (U+00A0), \r\n, \r, an unknown word, a last line without its end */
    const char *s = "the  cat\t\xc2\xa0sat\r\n\xc3\xa9t\xc3\xa9 dog\r\rcat";
    int32_t *t;
    size_t *off, n;
    CHECK(vocab_encode_offsets(&v, s, strlen(s), 0, &t, &off, &n, err) == 0, "%s", err);
    int32_t want[] = {2, 3, 4, 0, 5, 1, 0, 0, 3, 0};
    size_t woff[] = {0, 5, 11, 14, 16, 22, 25, 26, 27, 30};
    CHECK(n == 10 && memcmp(t, want, sizeof want) == 0 && memcmp(off, woff, sizeof woff) == 0, "ids and offsets (%zu)", n);
    free(t);
    free(off);
    /* a prompt's last line goes on; a final newline begins no other line */
    CHECK(vocab_encode_prompt(&v, "the cat", 7, &t, &n, err) == 0 && n == 2 && t[1] == 3, "prompt: %zu", n);
    free(t);
    CHECK(vocab_encode(&v, "the cat\n", 8, &t, &n, err) == 0 && n == 3 && t[2] == 0, "final newline: %zu", n);
    free(t);
    CHECK(vocab_encode(&v, "", 0, &t, &n, err) == 0 && n == 0, "empty text");
    free(t);
    CHECK(vocab_encode(&v, "\n\n", 2, &t, &n, err) == 0 && n == 2 && t[0] == 0 && t[1] == 0, "empty lines");
    free(t);
    CHECK(vocab_encode(&v, "the\xff", 4, &t, &n, err) != 0 && strstr(err, "invalid UTF-8 at byte 3"), "bad utf8: %s", err);
    /* text: words joined by one space, <eos> a newline */
    char out[64], piece[64];
    int32_t ids[] = {2, 3, 0, 4, 1, 0};
    CHECK(vocab_decode(&v, ids, 6, out, sizeof out) == 18 && strcmp(out, "the cat\nsat <unk>\n") == 0, "decode '%s'", out);
    CHECK(vocab_piece(&v, -1, 2, piece) == 3 && strcmp(piece, "the") == 0, "first word");
    CHECK(vocab_piece(&v, 2, 3, piece) == 4 && strcmp(piece, " cat") == 0, "next word");
    CHECK(vocab_piece(&v, 0, 3, piece) == 3 && strcmp(piece, "cat") == 0, "after a newline");
    CHECK(vocab_max_piece(&v) == 6, "max piece %zu", vocab_max_piece(&v));
    vocab_free(&v);
    CHECK(vocab_parse_kind(&v, w, "[\"<eos>\", \"the\"]", err) == 0, "%s", err);
    CHECK(vocab_encode(&v, "the dog", 7, &t, &n, err) != 0 && strstr(err, "word 'dog' at byte 4") && strstr(err, "no <unk>"),
          "no <unk>: %s", err);
    vocab_free(&v);
    CHECK(vocab_parse_kind(&v, w, "[\"the\"]", err) != 0 && strstr(err, "needs <eos>"), "no eos: %s", err);
    CHECK(vocab_parse_kind(&v, w, "[\"<eos>\", \"a b\"]", err) != 0 && strstr(err, "whitespace"), "space: %s", err);
    CHECK(vocab_parse_kind(&v, w, "[\"<eos>\", \"a\\u3000b\"]", err) != 0 && strstr(err, "whitespace"), "ideographic space: %s", err);
    CHECK(vocab_parse_kind(&v, w, "[\"<eos>\", \"a\", \"a\"]", err) != 0 && strstr(err, "repeats"), "repeat: %s", err);
    CHECK(vocab_parse_kind(&v, w, "[\"<eos>\", 3]", err) != 0 && strstr(err, "not a word"), "number: %s", err);
}

/* ------------------------------------------------------------ attention */

/* A device backend that must not be used: attention_run reads a model on
 * the CPU whatever serves it (its memory never attached, its forward never
 * called). */
static int fake_calls;
static int fake_forward(void *ctx, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                        float *lp, char *err)
{
    (void)ctx, (void)mems, (void)B, (void)tokens, (void)M, (void)targets, (void)lp;
    fake_calls++;
    return err_set(err, "the device was used");
}
static int fake_attach(void *ctx, mem_t *s, char *err)
{
    (void)ctx, (void)s;
    fake_calls++;
    return err_set(err, "the device was used");
}

/* Row R's keys in top-k order (heaviest, then nearest) into POS/W; their count (at most K). */
static int top_of(const attn_row *r, int k, int64_t *pos, float *w)
{
    int n = 0;
    for (int i = 0; i < r->n; i++) {
        int at = n < k ? n++ : k;   /* insertion into the sorted prefix */
        while (at > 0 && (r->w[i] > w[at - 1] || (r->w[i] == w[at - 1] && r->pos[i] > pos[at - 1]))) {
            if (at < k) pos[at] = pos[at - 1], w[at] = w[at - 1];
            at--;
        }
        if (at < k) pos[at] = r->pos[i], w[at] = r->w[i];
    }
    return n;
}

static void check_attention(const char *name, int layer, double sum_tol)
{
    char err[ERR_LEN];
    model_t *m = load(name, MEM_EXACT);
    if (!m) return;
    size_t n;
    int32_t *t = text_tokens(m, 150, &n);
    /* whole rows of one head, through the CPU while the model has a backend */
    const fwd_backend fake = {NULL, fake_forward, NULL, fake_attach, NULL, NULL, NULL};
    m->backend = &fake;
    fake_calls = 0;
    attn_result full, top;
    attn_opts o = {layer, 1, 8};
    int rc = attention_run(m, t, (int)n, &o, NULL, NULL, &full, err);
    m->backend = NULL;
    CHECK(rc == 0 && fake_calls == 0, "%s: %s (%d calls to the device)", name, rc ? err : "", fake_calls);
    if (rc) goto out;
    CHECK(full.full && full.n_tokens == (int)n && full.n_rows == (int)n, "%s: %d rows of %zu tokens", name, full.n_rows, n);
    double worst = 0, worst_sum = 0;
    int bad_keys = 0;
    for (int i = 0; i < full.n_rows; i++) {
        const attn_row *r = &full.rows[i];
        double s = r->before_start + r->persistent;
        for (int k = 0; k < r->n; k++) {
            s += r->w[k];
            bad_keys += r->pos[k] < 0 || r->pos[k] > r->query || (k && r->pos[k] <= r->pos[k - 1]);
        }
        worst = fabs(s - r->sum) > worst ? fabs(s - r->sum) : worst;
        worst_sum = fabs(r->sum - 1) > worst_sum ? fabs(r->sum - 1) : worst_sum;
        bad_keys += r->layer != layer || r->head != 1 || r->query != i;
    }
    CHECK(bad_keys == 0, "%s: %d keys out of order or past the query", name, bad_keys);
    CHECK(worst <= 1e-6, "%s: a row's weights add up to %g off its sum", name, worst);
    CHECK(worst_sum <= sum_tol, "%s: a sum is %g off 1", name, worst_sum);
    /* every head's top 5: head 1's are the head of its whole rows, bit for bit */
    o = (attn_opts){layer, -1, 5};
    rc = attention_run(m, t, (int)n, &o, NULL, NULL, &top, err);
    CHECK(rc == 0 && !top.full && top.n_rows == m->n_head * (int)n, "%s: %s", name, rc ? err : "rows");
    int differ = 0;
    for (int i = 0; rc == 0 && i < (int)n; i++) {
        const attn_row *a = &top.rows[(size_t)n + i], *b = &full.rows[i];
        int64_t pos[5];
        float w[5];
        int k = top_of(b, 5, pos, w);
        differ += a->head != 1 || a->n != k || a->sum != b->sum || memcmp(a->pos, pos, (size_t)k * sizeof *pos) ||
                  memcmp(a->w, w, (size_t)k * sizeof *w);
    }
    CHECK(differ == 0, "%s: %d top-5 lists are not the heads of the whole rows", name, differ);
    if (rc == 0) attention_free(&top);
    attention_free(&full);
    CHECK(attention_weights_max(m, 100, &(attn_opts){layer, 1, 8}) == 5050 + 100 * (size_t)m->pers, "%s: bound", name);
    CHECK(attention_weights_max(m, 100, &(attn_opts){-1, -1, 8}) ==
              (size_t)attention_layers(m, &(attn_opts){-1, -1, 8}) * m->n_head * 100 * 8, "%s: bound", name);
out:
    free(t);
    model_free(m);
}

/* What attention_check refuses, with messages that say what would do. */
static void check_attention_errors(void)
{
    char err[ERR_LEN];
    model_t *m = load("par-small", MEM_EXACT);
    if (!m) return;
    CHECK(attention_check(m, &(attn_opts){0, -1, 8}, err) != 0 && strstr(err, "not attention") &&
              strstr(err, "the attention layers are 3, 5, 6"), "ffn block: %s", err);
    CHECK(attention_check(m, &(attn_opts){8, -1, 8}, err) != 0 && strstr(err, "0..7"), "layer 8: %s", err);
    CHECK(attention_check(m, &(attn_opts){3, 4, 8}, err) != 0 && strstr(err, "0..3"), "head 4: %s", err);
    CHECK(attention_check(m, &(attn_opts){3, -1, 0}, err) != 0 && strstr(err, "top_k"), "top_k 0: %s", err);
    CHECK(attention_check(m, &(attn_opts){3, -1, ATTN_MAX_TOP_K + 1}, err) != 0, "top_k past the bound");
    CHECK(attention_check(m, &(attn_opts){5, 3, ATTN_MAX_TOP_K}, err) == 0, "%s", err);
    attn_result r;
    CHECK(attention_run(m, NULL, 0, &(attn_opts){5, 3, 8}, NULL, NULL, &r, err) != 0, "no tokens");
    int32_t tok[3] = {1, 2, 3};
    CHECK(attention_run(m, tok, 3, &(attn_opts){5, 3, 8}, NULL, NULL, &r, err) == 0 && r.n_rows == 3 &&
              r.rows[0].n == 1 && r.rows[0].pos[0] == 0 && r.rows[0].w[0] == 1.0f, "%s", err);
    attention_free(&r);
    model_free(m);
}

int main(void)
{
    check_words();
    check_chunks("aspan-small", MEM_EXACT);
    check_chunks("aspan-small", MEM_SPAN);
    check_chunks("par-small", MEM_EXACT);
    check_score_block();
    check_many("aspan-small", MEM_EXACT);
    check_many("aspan-small", MEM_SPAN);
    check_many("par-small", MEM_EXACT);
    check_batch_invariance();
    check_pick_while();
    check_serialize("aspan-small");
    check_serialize("par-small");
    check_generate();
    check_sampling();
    check_vocab();
    check_attention("aspan-small", 2, 1e-5);   /* sums: 1 less the renormalisation's 1e-8 share */
    check_attention("par-small", 5, 1e-6);
    check_attention_errors();
    return test_summary("test_infer");
}
