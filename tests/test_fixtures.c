/*
 * test_fixtures.c - the CPU forward against the reference's own outputs
 * (../shared/fixtures): logprobs of every block, the single-token step, the
 * full-evaluation bpc, the spans, and chunked scoring.
 */
#define _POSIX_C_SOURCE 200809L
#include "err.h"
#include "fixtures.h"
#include "harness.h"
#include "infer.h"
#include "model.h"
#include "report.h"
#include "st.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Feeds the fixture's token blocks and compares every logprob. */
static void check_vectors(const char *name)
{
    char err[ERR_LEN];
    model_t *m = model_load(fx(name, "model.safetensors"), err);
    CHECK(m != NULL, "%s", err);
    if (!m) return;
    st_file *vf = st_open(fx(name, "vectors.safetensors"), err);
    CHECK(vf != NULL, "%s", err);
    if (!vf) { model_free(m); return; }
    const st_tensor *tt = st_find(vf, "tokens"), *lt = st_find(vf, "logprobs"), *stp = st_find(vf, "step_logprobs");
    int S = (int)tt->shape[0], T = (int)tt->shape[1], NB = (int)lt->shape[1], M = (int)lt->shape[2], V = m->V;
    CHECK(M == m->block_len, "block length %d vs %d", M, m->block_len);
    int32_t *tok = malloc(sizeof(int32_t) * S * T);
    float *ref = malloc(sizeof(float) * S * NB * M * V), *sref = malloc(sizeof(float) * S * V);
    memcpy(tok, tt->data, sizeof(int32_t) * S * T);
    memcpy(ref, lt->data, sizeof(float) * S * NB * M * V);
    memcpy(sref, stp->data, sizeof(float) * S * V);
    fwd_ws *ws = ws_new();
    /* both streams in one batch, block by block */
    mem_t *mems[2] = {mem_new(m), mem_new(m)};
    float *lp = malloc(sizeof(float) * S * M * V);
    int32_t *in = malloc(sizeof(int32_t) * S * M);
    double worst = 0, worst_step = 0;
    for (int b = 0; b < NB; b++) {
        for (int s = 0; s < S; s++) memcpy(in + s * M, tok + s * T + b * M, sizeof(int32_t) * M);
        CHECK(model_forward(m, mems, S, in, M, lp, ws, err) == 0, "%s", err);
        for (int s = 0; s < S; s++)
            for (int i = 0; i < M * V; i++) {
                double d = fabs(lp[s * M * V + i] - ref[((size_t)s * NB + b) * M * V + i]);
                worst = d > worst ? d : worst;
            }
    }
    for (int s = 0; s < S; s++) in[s] = tok[s * T + NB * M];
    CHECK(model_forward(m, mems, S, in, 1, lp, ws, err) == 0, "%s", err);
    for (int s = 0; s < S; s++)
        for (int i = 0; i < V; i++) {
            double d = fabs(lp[s * V + i] - sref[s * V + i]);
            worst_step = d > worst_step ? d : worst_step;
        }
    printf("%s: max |logprob - reference| blocks %.2e, step %.2e\n", name, worst, worst_step);
    CHECK(worst <= 1e-4, "%s blocks: %.3g", name, worst);
    CHECK(worst_step <= 1e-4, "%s step: %.3g", name, worst_step);

    /* the same tokens fed one at a time (the decode path) */
    mem_reset(mems[0]);
    double worst_tok = 0;
    for (int i = 0; i < NB * M; i++) {
        CHECK(model_forward(m, mems, 1, tok + i, 1, lp, ws, err) == 0, "%s", err);
        if (is_aspan(m))
            for (int c = 0; c < V; c++) {
                double d = fabs(lp[c] - ref[(size_t)(i / M) * M * V + (i % M) * V + c]);
                worst_tok = d > worst_tok ? d : worst_tok;
            }
    }
    if (is_aspan(m)) {
        printf("%s: token-at-a-time max diff %.2e\n", name, worst_tok);
        CHECK(worst_tok <= 1e-4, "%s token-at-a-time: %.3g", name, worst_tok);
    }
    free(lp); free(in); free(tok); free(ref); free(sref);
    mem_free(mems[0]); mem_free(mems[1]);
    ws_free(ws);
    st_close(vf);
    model_free(m);
}

/* The predictions a full evaluation of WANT makes: all of them, or under
 * the sanitizers (`make asan` sets SPANSERVE_SANITIZED=1) the first
 * SANITIZED_EVAL, checked only for their count and a sane bpc: the same
 * code as the whole, whose 100,000 predictions a fixture took most of this
 * test's four minutes there (make test compares the whole with the
 * reference). */
#define SANITIZED_EVAL 4096
static long eval_len(long want, const char *what)
{
    const char *v = getenv("SPANSERVE_SANITIZED");
    if (!v || strcmp(v, "1") != 0 || want <= SANITIZED_EVAL) return want;
    printf("note: %s under the sanitizers: the first %d of %ld predictions (make test compares all of them with the "
           "reference)\n", what, SANITIZED_EVAL, want);
    return SANITIZED_EVAL;
}

/* expected.json's val_bpc_full_eval: the validation text truncated to
 * val_tokens_scored + 1 tokens, scored block by block from a fresh memory. */
static void check_bpc(const char *name, mem_mode mode, double tol)
{
    char err[ERR_LEN];
    json_t *e = json_load_file(fx(name, "expected.json"), 0, NULL);
    model_t *m = model_load_mode(fx(name, "model.safetensors"), mode, err);
    CHECK(e && m, "%s", err);
    if (!e || !m) { json_decref(e); model_free(m); return; }
    size_t n = 0;
    int32_t *t = val_tokens(m, &n);
    long want = (long)json_integer_value(json_object_get(e, "val_tokens_scored"));
    CHECK(t && n > (size_t)want, "validation text of %zu tokens", n);
    if (t && n > (size_t)want) {
        mem_t *s = mem_new(m);
        fwd_ws *ws = ws_new();
        score_t sc = {0, 0};
        const long len = eval_len(want, name);
        CHECK(infer_score(m, s, ws, t, (size_t)len + 1, &sc, NULL, err) == 0, "%s", err);
        double bpc = sc.nll_sum / sc.tokens / log(2.0), ref = json_real_value(json_object_get(e, "val_bpc_full_eval"));
        printf("%s (%s memory): bpc %.7f, reference %.7f\n", name, mode == MEM_EXACT ? "exact" : "span", bpc, ref);
        CHECK(sc.tokens == len, "%ld predictions, expected %ld", sc.tokens, len);
        if (len == want) CHECK_NEAR(bpc, ref, tol, "val_bpc_full_eval");
        else CHECK(bpc > 0 && bpc < 2 * ref, "bpc %.7f of a prefix, the whole's reference %.7f", bpc, ref);
        mem_free(s);
        ws_free(ws);
    }
    free(t);
    model_free(m);
    json_decref(e);
}

/* `spans` against expected.json: z, span, and the reference's derived sizes. */
static void check_spans(void)
{
    char err[ERR_LEN];
    json_t *e = json_load_file(fx("aspan-small", "expected.json"), 0, NULL);
    model_t *m = model_load(fx("aspan-small", "model.safetensors"), err);
    CHECK(e && m, "%s", err);
    if (!e || !m) { json_decref(e); model_free(m); return; }
    json_t *r = report_spans(m), *layers = json_object_get(r, "layers"), *exp = json_object_get(e, "spans");
    CHECK(json_array_size(layers) == json_array_size(exp) && json_array_size(exp) == 4, "layer count");
    for (size_t l = 0; l < json_array_size(exp) && l < json_array_size(layers); l++) {
        json_t *x = json_array_get(exp, l), *y = json_array_get(layers, l);
        static const char *ints[][2] = {{"current_max_span", "max_span"}, {"current_avg_span", "avg_span"},
                                        {"cache_size", "cache_size"}, {"trim_len", "trim_len"}};
        for (int k = 0; k < 4; k++)
            CHECK(json_integer_value(json_object_get(x, ints[k][0])) == json_integer_value(json_object_get(y, ints[k][1])),
                  "layer %zu %s: %lld vs %lld", l, ints[k][1], (long long)json_integer_value(json_object_get(x, ints[k][0])),
                  (long long)json_integer_value(json_object_get(y, ints[k][1])));
        json_t *heads = json_object_get(y, "heads");
        for (size_t h = 0; h < json_array_size(heads); h++) {
            json_t *hd = json_array_get(heads, h);
            CHECK_NEAR(json_real_value(json_object_get(hd, "z")), json_real_value(json_array_get(json_object_get(x, "z"), h)), 1e-7, "z");
            CHECK_NEAR(json_real_value(json_object_get(hd, "span")), json_real_value(json_array_get(json_object_get(x, "span"), h)), 1e-4, "span");
            /* a head keeps values for exactly the distances its mask reaches: z + R, rounded up */
            double z = json_real_value(json_object_get(hd, "span"));
            CHECK(json_integer_value(json_object_get(hd, "reach")) == (json_int_t)ceil(z + m->ramp - 1e-9),
                  "layer %zu head %zu reach %lld for span %.3f", l, h, (long long)json_integer_value(json_object_get(hd, "reach")), z);
        }
    }
    /* memory: span mode keeps less than the reference; exact mode keeps keys
     * of the reference's window and values of each head's reach */
    model_t *ms = model_load_mode(fx("aspan-small", "model.safetensors"), MEM_SPAN, err);
    CHECK(ms != NULL, "%s", err);
    if (ms) {
        printf("aspan-small memory per stream: exact %zu, span %zu, reference %zu, full span %zu bytes\n", mem_bytes(m),
               mem_bytes(ms), mem_bytes_reference(m), mem_bytes_full(m));
        size_t exact = 0, span = 0;
        for (int l = 0; l < m->n_layers; l++)
            for (int h = 0; h < m->n_head; h++) {
                int r = m->layers[l].reach[h];
                exact += (size_t)(m->span - m->layers[l].trim_len + r) * m->d_head * sizeof(float);
                span += (size_t)2 * r * m->d_head * sizeof(float);
            }
        CHECK(mem_bytes(m) == exact, "exact mode %zu vs %zu", mem_bytes(m), exact);
        CHECK(mem_bytes(ms) == span, "span mode %zu vs %zu", mem_bytes(ms), span);
        CHECK(mem_bytes(ms) < mem_bytes_reference(ms) * 2 / 3, "span mode %zu vs reference %zu", mem_bytes(ms), mem_bytes_reference(ms));
        model_free(ms);
    }
    json_decref(r);
    model_free(m);
    json_decref(e);
}

/* PAR: the chosen blocks and the softmax of alpha against expected.json */
static void check_arch(void)
{
    char err[ERR_LEN];
    json_t *e = json_load_file(fx("par-small", "expected.json"), 0, NULL);
    model_t *m = model_load(fx("par-small", "model.safetensors"), err);
    CHECK(e && m, "%s", err);
    if (!e || !m) { json_decref(e); model_free(m); return; }
    json_t *r = report_spans(m), *blocks = json_object_get(r, "blocks");
    json_t *arch = json_object_get(e, "arch"), *sm = json_object_get(e, "alpha_softmax");
    CHECK(json_array_size(blocks) == json_array_size(arch), "block count");
    for (size_t b = 0; b < json_array_size(arch) && b < json_array_size(blocks); b++) {
        json_t *o = json_array_get(blocks, b), *a = json_object_get(o, "alpha_softmax");
        CHECK(strcmp(json_string_value(json_object_get(o, "kind")), json_string_value(json_array_get(arch, b))) == 0,
              "block %zu kind", b);
        static const char *k[3] = {"attn", "ffn", "skip"};
        for (int i = 0; i < 3; i++)
            CHECK_NEAR(json_real_value(json_object_get(a, k[i])), json_real_value(json_array_get(json_array_get(sm, b), i)),
                       1e-6, "alpha_softmax");
    }
    /* three attention blocks of eight: memory for those three only */
    CHECK(mem_bytes(m) == 3 * 2 * (size_t)m->mem_len * m->n_head * m->d_head * sizeof(float), "par memory %zu", mem_bytes(m));
    json_decref(r);
    model_free(m);
    json_decref(e);
}

/* A checkpoint written entirely in BF16 (the mask template included, which
 * bf16 cannot hold exactly) loads and scores close to the F32 one. */
static void check_bf16(void)
{
    char err[ERR_LEN], out[] = "/tmp/spanserve-bf16-XXXXXX";
    int fd = mkstemp(out);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    st_file *f = st_open(fx("aspan-small", "model.safetensors"), err);
    CHECK(f != NULL, "%s", err);
    if (!f) return;
    st_writer *w = st_writer_new();
    uint16_t **halves = calloc((size_t)st_count(f), sizeof *halves);
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        int64_t n = st_numel(t);
        halves[i] = malloc((size_t)n * 2 + 2);
        for (int64_t j = 0; j < n; j++) {
            float x;
            uint32_t b;
            memcpy(&x, (const char *)t->data + 4 * j, 4);
            memcpy(&b, &x, 4);
            halves[i][j] = (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16);   /* round to nearest even */
        }
        st_writer_add(w, t->name, ST_BF16, t->ndim, t->shape, halves[i]);
    }
    st_writer_meta(w, "config", st_meta(f, "config"));
    st_writer_meta(w, "vocab", st_meta(f, "vocab"));
    CHECK(st_writer_save(w, out, err) == 0, "%s", err);
    model_t *a = model_load(fx("aspan-small", "model.safetensors"), err), *b = model_load(out, err);
    CHECK(a && b, "bf16 checkpoint: %s", err);
    if (a && b) {
        size_t n = 0;
        int32_t *t = val_tokens(a, &n);
        mem_t *ma = mem_new(a), *mb = mem_new(b);
        fwd_ws *ws = ws_new();
        score_t sa = {0, 0}, sb = {0, 0};
        CHECK(infer_score(a, ma, ws, t, 2000, &sa, NULL, err) == 0 && infer_score(b, mb, ws, t, 2000, &sb, NULL, err) == 0,
              "%s", err);
        printf("aspan-small bf16 weights: bpc %.5f vs %.5f in f32\n", sb.nll_sum / sb.tokens / log(2.0), sa.nll_sum / sa.tokens / log(2.0));
        CHECK_NEAR(sb.nll_sum / sb.tokens, sa.nll_sum / sa.tokens, 0.02, "bf16 mean nll");
        free(t);
        mem_free(ma);
        mem_free(mb);
        ws_free(ws);
    }
    model_free(a);
    model_free(b);
    for (int i = 0; i < st_count(f); i++) free(halves[i]);
    free(halves);
    st_writer_free(w);
    st_close(f);
    unlink(out);
}

/* txl-word (../shared only: 8 MB): the word-level Transformer-XL with
 * adaptive input and softmax against its reference (fixtures/README.md):
 * nll of every segment, the single step, full distributions, and the
 * perplexity of the validation lines. */
static void check_txl_word(void)
{
    char err[ERR_LEN];
    const char *mp = shared_path("fixtures/txl-word/model.safetensors");
    if (!mp) {
        printf("SKIP test_fixtures txl-word: ../shared/fixtures/txl-word is not here (CI has it)\n");
        return;
    }
    model_t *m = model_load(mp, err);
    CHECK(m != NULL, "%s", err);
    if (!m) return;
    CHECK(strcmp(model_family_name(m), "transformer-xl") == 0 && strcmp(model_tokenizer_name(m), "words") == 0,
          "family %s, tokenizer %s", model_family_name(m), model_tokenizer_name(m));
    st_file *vf = st_open(shared_path("fixtures/txl-word/vectors.safetensors"), err);
    CHECK(vf != NULL, "%s", err);
    if (!vf) { model_free(m); return; }
    const st_tensor *tt = st_find(vf, "tokens"), *nt = st_find(vf, "nll"), *st = st_find(vf, "step_nll"),
                    *ft = st_find(vf, "full_logprobs");
    const int S = (int)tt->shape[0], T = (int)tt->shape[1], G = (int)nt->shape[1], Q = (int)nt->shape[2], V = m->V;
    CHECK(Q == m->block_len && ft->shape[1] == V, "segment %d vs %d, V %lld vs %d", Q, m->block_len,
          (long long)ft->shape[1], V);
    int32_t *tok = malloc(sizeof(int32_t) * S * T), *in = malloc(sizeof(int32_t) * S * Q);
    float *nll = malloc(sizeof(float) * S * G * Q), *snll = malloc(sizeof(float) * S), *full = malloc(sizeof(float) * 4 * V);
    float *lp = malloc(sizeof(float) * S * Q * V);
    memcpy(tok, tt->data, sizeof(int32_t) * S * T);
    memcpy(nll, nt->data, sizeof(float) * S * G * Q);
    memcpy(snll, st->data, sizeof(float) * S);
    memcpy(full, ft->data, sizeof(float) * 4 * V);
    fwd_ws *ws = ws_new();
    mem_t *mems[2] = {mem_new(m), mem_new(m)};
    double worst = 0, worst_full = 0, worst_step = 0;
    static const int at[4][2] = {{0, 0}, {0, 47}, {1, 5}, {1, 47}};
    for (int g = 0; g < G; g++) {
        for (int s = 0; s < S; s++) memcpy(in + s * Q, tok + s * T + g * Q, sizeof(int32_t) * Q);
        CHECK(model_forward(m, mems, S, in, Q, lp, ws, err) == 0, "%s", err);
        for (int s = 0; s < S; s++)
            for (int i = 0; i < Q; i++) {
                double d = fabs(-lp[((size_t)s * Q + i) * V + tok[s * T + g * Q + i + 1]] - nll[(s * G + g) * Q + i]);
                worst = d > worst ? d : worst;
            }
        for (int k = 0; g == 0 && k < 4; k++)
            for (int c = 0; c < V; c++) {
                double d = fabs(lp[((size_t)at[k][0] * Q + at[k][1]) * V + c] - full[(size_t)k * V + c]);
                worst_full = d > worst_full ? d : worst_full;
            }
    }
    for (int s = 0; s < S; s++) in[s] = tok[s * T + G * Q];
    CHECK(model_forward(m, mems, S, in, 1, lp, ws, err) == 0, "%s", err);
    for (int s = 0; s < S; s++) {
        double d = fabs(-lp[(size_t)s * V + tok[s * T + G * Q + 1]] - snll[s]);
        worst_step = d > worst_step ? d : worst_step;
    }
    printf("txl-word: max |nll - reference| segments %.2e, step %.2e, full distributions %.2e\n", worst, worst_step,
           worst_full);
    /* the cheap path (head and one cluster a row) against the whole rows; and a stream's values alone
     * or beside a stream that wants whole rows are the same bits */
    {
        mem_t *x0[2] = {mem_new(m), mem_new(m)}, *x1[1] = {mem_new(m)};
        int32_t *tg = malloc(sizeof(int32_t) * S * Q);
        float *lt = malloc(sizeof(float) * S * Q * V), *l1 = malloc(sizeof(float) * Q * V);
        double worst_t = 0;
        int same = 1;
        for (int g = 0; g < G; g++) {
            for (int s = 0; s < S; s++) memcpy(in + s * Q, tok + s * T + g * Q, sizeof(int32_t) * Q);
            for (int i = 0; i < Q; i++) tg[i] = tok[g * Q + i + 1];   /* stream 0 scores, stream 1 wants rows */
            tg[Q] = -1;
            CHECK(model_forward_targets(m, x0, S, in, Q, tg, lt, ws, err) == 0, "%s", err);
            CHECK(model_forward_targets(m, x1, 1, in, Q, tg, l1, ws, err) == 0, "%s", err);
            for (int i = 0; i < Q; i++) {
                double d = fabs(-lt[(size_t)i * V + tg[i]] - nll[g * Q + i]);
                worst_t = d > worst_t ? d : worst_t;
                same &= lt[(size_t)i * V + tg[i]] == l1[(size_t)i * V + tg[i]];
            }
            for (int i = 0; i < Q; i++) {   /* stream 1's whole rows are still the reference's */
                double d = fabs(-lt[((size_t)Q + i) * V + tok[T + g * Q + i + 1]] - nll[(G + g) * Q + i]);
                worst_t = d > worst_t ? d : worst_t;
            }
        }
        printf("txl-word: targets only, max |nll - reference| %.2e\n", worst_t);
        CHECK(worst_t <= 1e-4, "txl-word targets: %.3g", worst_t);
        CHECK(same, "a scored stream's logprobs depend on the stream beside it");
        tg[0] = 9984;
        CHECK(model_forward_targets(m, x1, 1, in, Q, tg, l1, ws, err) != 0 && strstr(err, "target id 9984"), "%s", err);
        free(tg); free(lt); free(l1);
        mem_free(x0[0]); mem_free(x0[1]); mem_free(x1[0]);
    }
    CHECK(worst <= 1e-4, "txl-word segments: %.3g", worst);
    CHECK(worst_step <= 1e-4, "txl-word step: %.3g", worst_step);
    CHECK(worst_full <= 1e-4, "txl-word full_logprobs: %.3g", worst_full);

    /* the validation lines: lines[36000:] of text.split("\n"), each with its newline */
    json_t *e = json_load_file(shared_path("fixtures/txl-word/expected.json"), 0, NULL);
    size_t n = 0;
    int32_t *t = e ? val_lines_tokens(m, (long)json_integer_value(json_object_get(e, "val_lines_from")), &n, err) : NULL;
    CHECK(e && t, "expected.json and the validation lines: %s", err);
    if (e && t) {
        long want = (long)json_integer_value(json_object_get(e, "val_tokens_scored"));
        CHECK((long)n == want + 1, "validation lines: %zu tokens, expected %ld", n, want + 1);
        mem_reset(mems[0]);
        score_t sc = {0, 0};
        CHECK(infer_score(m, mems[0], ws, t, n, &sc, NULL, err) == 0, "%s", err);
        double ppl = exp(sc.nll_sum / (double)sc.tokens), ref = json_real_value(json_object_get(e, "val_ppl_full_eval"));
        printf("txl-word: validation ppl %.6f over %ld predictions, reference %.6f\n", ppl, sc.tokens, ref);
        CHECK(sc.tokens == want, "%ld predictions, expected %ld", sc.tokens, want);
        CHECK(fabs(ppl - ref) <= 1e-4 * ref, "val_ppl_full_eval %.8f vs %.8f", ppl, ref);
    }
    free(t);
    json_decref(e);
    free(tok); free(in); free(nll); free(snll); free(full); free(lp);
    mem_free(mems[0]); mem_free(mems[1]);
    ws_free(ws);
    st_close(vf);
    model_free(m);
}

/* par-tf: seed 004's TensorFlow PAR Transformer-XL, as clients/convert
 * writes it from the checkpoint folder (tests/convert_fixtures.sh, in make
 * test where tensorflow is installed: $SPANSERVE_CONVERTED/par-tf.safetensors)
 * against the seed's outputs (fixtures/README.md "par-tf"): three segments of
 * 32 with memory, the whole rows of the last, a single step, and the
 * validation text in segments of seq_len with the memory carried. */
static void check_par_tf(void)
{
    char err[ERR_LEN], path[1024];
    const char *dir = getenv("SPANSERVE_CONVERTED");
    snprintf(path, sizeof path, "%s/par-tf.safetensors", dir ? dir : "build/fixtures");
    const char *vp = shared_path("fixtures/par-tf/vectors.safetensors");
    if (!vp) {
        printf("SKIP test_fixtures par-tf: ../shared/fixtures/par-tf is not here (CI has it)\n");
        return;
    }
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        printf("SKIP test_fixtures par-tf: no %s (tests/convert_fixtures.sh converts the seed's TensorFlow "
               "checkpoint in make test where tensorflow is installed: pip install tensorflow-cpu==2.15.1)\n", path);
        return;
    }
    fclose(probe);
    model_t *m = model_load(path, err);
    CHECK(m != NULL, "%s", err);
    if (!m) return;
    CHECK(strcmp(model_family_name(m), "par-transformer-xl-tf") == 0 && strcmp(model_tokenizer_name(m), "sentencepiece") == 0,
          "family %s, tokenizer %s", model_family_name(m), model_tokenizer_name(m));
    st_file *vf = st_open(vp, err);
    CHECK(vf != NULL, "%s", err);
    if (!vf) { model_free(m); return; }
    const st_tensor *tt = st_find(vf, "tokens"), *lt = st_find(vf, "logprobs"), *ft = st_find(vf, "last_full_logprobs"),
                    *sp = st_find(vf, "step_logprobs");
    const int S = (int)tt->shape[0], T = (int)tt->shape[1], G = (int)lt->shape[1], Q = (int)lt->shape[2], V = m->V;
    CHECK(Q == m->block_len && ft->shape[2] == V, "segment %d vs %d, V %lld vs %d", Q, m->block_len,
          (long long)ft->shape[2], V);
    /* copies: a tensor's data may be unaligned */
    int32_t *tok = malloc(sizeof(int32_t) * S * T);
    float *ref = malloc(sizeof(float) * S * G * Q), *full = malloc(sizeof(float) * S * Q * V),
          *step = malloc(sizeof(float) * S * V);
    memcpy(tok, tt->data, sizeof(int32_t) * S * T);
    memcpy(ref, lt->data, sizeof(float) * S * G * Q);
    memcpy(full, ft->data, sizeof(float) * S * Q * V);
    memcpy(step, sp->data, sizeof(float) * S * V);
    int32_t *in = malloc(sizeof(int32_t) * S * Q);
    float *lp = malloc(sizeof(float) * S * Q * V);
    fwd_ws *ws = ws_new();
    mem_t *mems[2] = {mem_new(m), mem_new(m)};
    double worst = 0, worst_full = 0, worst_step = 0;
    for (int g = 0; g < G; g++) {
        for (int s = 0; s < S; s++) memcpy(in + s * Q, tok + s * T + g * Q, sizeof(int32_t) * Q);
        CHECK(model_forward(m, mems, S, in, Q, lp, ws, err) == 0, "%s", err);
        for (int s = 0; s < S; s++)
            for (int i = 0; i < Q; i++) {
                double d = fabs(lp[((size_t)s * Q + i) * V + tok[s * T + g * Q + i + 1]] - ref[(s * G + g) * Q + i]);
                worst = d > worst ? d : worst;
                for (int c = 0; g == G - 1 && c < V; c++) {
                    d = fabs(lp[((size_t)s * Q + i) * V + c] - full[((size_t)s * Q + i) * V + c]);
                    worst_full = d > worst_full ? d : worst_full;
                }
            }
    }
    for (int s = 0; s < S; s++) in[s] = tok[s * T + G * Q];
    CHECK(model_forward(m, mems, S, in, 1, lp, ws, err) == 0, "%s", err);
    for (int s = 0; s < S; s++)
        for (int c = 0; c < V; c++) {
            double d = fabs(lp[(size_t)s * V + c] - step[(size_t)s * V + c]);
            worst_step = d > worst_step ? d : worst_step;
        }
    printf("par-tf: max |logprob - reference| segments %.2e, last segment's rows %.2e, step %.2e\n", worst,
           worst_full, worst_step);
    CHECK(worst <= 1e-4, "par-tf segments: %.3g", worst);
    CHECK(worst_full <= 1e-4, "par-tf last_full_logprobs: %.3g", worst_full);
    CHECK(worst_step <= 1e-4, "par-tf step_logprobs: %.3g", worst_step);

    json_t *e = json_load_file(shared_path("fixtures/par-tf/expected.json"), 0, NULL);
    size_t n = 0;
    int32_t *t = e ? val_tokens(m, &n) : NULL;
    CHECK(e && t, "expected.json and the validation text");
    if (e && t) {
        const long want = (long)json_integer_value(json_object_get(e, "val_tokens_scored"));
        const double refnll = json_real_value(json_object_get(e, "val_nll_full_eval"));
        mem_t *s = mem_new(m);
        score_t sc = {0, 0};
        CHECK(s && infer_score(m, s, ws, t, n, &sc, NULL, err) == 0, "%s", err);
        const double nll = sc.nll_sum / (double)sc.tokens;
        printf("par-tf: validation nll %.8f over %ld predictions, reference %.8f over %ld\n", nll, sc.tokens, refnll, want);
        CHECK(sc.tokens == want, "%ld predictions, expected %ld", sc.tokens, want);
        CHECK(fabs(nll - refnll) <= 1e-4 * refnll, "val_nll_full_eval %.8f vs %.8f", nll, refnll);
        mem_free(s);
    }
    free(t);
    json_decref(e);
    free(in); free(lp); free(tok); free(ref); free(full); free(step);
    mem_free(mems[0]); mem_free(mems[1]);
    ws_free(ws);
    st_close(vf);
    model_free(m);
}

/* Row I of LP (V wide) against REF's row: the largest difference so far in *WORST. */
static void row_diff(const float *lp, const float *ref, int V, double *worst)
{
    for (int c = 0; c < V; c++) {
        double d = fabs(lp[c] - ref[c]);
        *worst = d > *worst ? d : *worst;
    }
}

/* A GPT-style window model (fixtures/README.md, "gpt-aspan", "nanogpt-char"):
 * each window fed whole in windows mode; short windows; the stream's
 * predictions (each token the last of its window, as the seeds' generate);
 * 40 greedy tokens after window 0; val_bpc_windows. */
static void check_gpt(const char *name)
{
    char err[ERR_LEN];
    model_t *m = model_load(fx(name, "model.safetensors"), err);
    st_file *vf = m ? st_open(fx(name, "vectors.safetensors"), err) : NULL;
    json_t *e = json_load_file(fx(name, "expected.json"), 0, NULL);
    CHECK(m && vf && e, "%s: %s", name, err);
    if (!m || !vf || !e) { model_free(m); st_close(vf); json_decref(e); return; }
    const st_tensor *tt = st_find(vf, "tokens"), *lt = st_find(vf, "logprobs"), *sh = st_find(vf, "short_logprobs"),
                    *gt = st_find(vf, "greedy");
    const int S = (int)tt->shape[0], T = (int)tt->shape[1], V = m->V, G = (int)gt->shape[0];
    const int32_t *tok = tt->data, *greedy = gt->data;
    const float *ref = lt->data, *sref = sh ? sh->data : NULL;
    const int TS = sh ? (int)sh->shape[1] : 0;
    CHECK(T == m->window, "%s: window %d vs the vectors' %d", name, m->window, T);
    fwd_ws *ws = ws_new();
    mem_t *s = mem_new(m);
    float *lp = malloc(sizeof(float) * (size_t)T * V);
    double whole = 0, shorter = 0, stream = 0, stream1 = 0;
    for (int w = 0; w < S; w++) {
        mem_reset(s);
        mem_windows(s, 0);
        CHECK(model_forward(m, &s, 1, tok + w * T, T, lp, ws, err) == 0, "%s", err);
        for (int i = 0; i < T; i++) row_diff(lp + (size_t)i * V, ref + ((size_t)w * T + i) * V, V, &whole);
        if (sref) {
            mem_reset(s);
            CHECK(model_forward(m, &s, 1, tok + w * T, TS, lp, ws, err) == 0, "%s", err);
            for (int i = 0; i < TS; i++) row_diff(lp + (size_t)i * V, sref + ((size_t)w * TS + i) * V, V, &shorter);
        }
    }
    /* a stream: row i is the last of the window ending at i (for the adaptive-span GPT the short
     * window's last row; for nanoGPT every row of the whole window) */
    mem_reset(s);
    mem_windows(s, -1);
    CHECK(model_forward(m, &s, 1, tok, T, lp, ws, err) == 0, "%s", err);
    row_diff(lp + (size_t)(T - 1) * V, ref + (size_t)(T - 1) * V, V, &stream);
    if (sref) row_diff(lp + (size_t)(TS - 1) * V, sref + (size_t)(TS - 1) * V, V, &stream);
    else
        for (int i = 0; i < T; i++) row_diff(lp + (size_t)i * V, ref + (size_t)i * V, V, &stream);
    /* the same a token at a time */
    mem_reset(s);
    for (int i = 0; i < T; i++) {
        CHECK(model_forward(m, &s, 1, tok + i, 1, lp, ws, err) == 0, "%s", err);
        if (i == T - 1 || (!sref && i % 17 == 0)) row_diff(lp, ref + (size_t)i * V, V, &stream1);
        if (sref && i == TS - 1) row_diff(lp, sref + (size_t)i * V, V, &stream1);
    }
    /* greedy: each step from the last `window` tokens */
    int same = 0;
    for (int g = 0; g < G; g++) {
        int best = 0;
        for (int c = 1; c < V; c++) best = lp[c] > lp[best] ? c : best;
        same += best == greedy[g];
        if (best != greedy[g]) break;
        int32_t x = best;
        CHECK(model_forward(m, &s, 1, &x, 1, lp, ws, err) == 0, "%s", err);
    }
    printf("%s: max |logprob - reference| windows %.2e, short windows %.2e, stream %.2e, token at a time %.2e; "
           "greedy %d of %d\n", name, whole, shorter, stream, stream1, same, G);
    CHECK(whole <= 1e-4 && shorter <= 1e-4, "%s windows: %.3g, short: %.3g", name, whole, shorter);
    CHECK(stream <= 1e-4 && stream1 <= 1e-4, "%s stream: %.3g, a token at a time: %.3g", name, stream, stream1);
    CHECK(same == G, "%s: greedy tokens agree for %d of %d", name, same, G);
    /* val_bpc_windows: consecutive windows of the validation text, each alone */
    size_t n = 0;
    int32_t *t = val_tokens(m, &n);
    long want = (long)json_integer_value(json_object_get(e, "val_tokens_scored"));
    CHECK(t && n > (size_t)want, "validation text of %zu tokens", n);
    if (t && n > (size_t)want) {
        score_t sc = {0, 0};
        mem_reset(s);
        mem_windows(s, 0);
        const long len = eval_len(want, name);
        CHECK(infer_score(m, s, ws, t, (size_t)len + 1, &sc, NULL, err) == 0, "%s", err);
        double bpc = sc.nll_sum / sc.tokens / log(2.0), r = json_real_value(json_object_get(e, "val_bpc_windows"));
        printf("%s: windows bpc %.7f, reference %.7f (%ld predictions)\n", name, bpc, r, sc.tokens);
        CHECK(sc.tokens == len, "%ld predictions, expected %ld", sc.tokens, len);
        if (len == want) CHECK_NEAR(bpc, r, 1e-4, "val_bpc_windows");
        else CHECK(bpc > 0 && bpc < 2 * r, "windows bpc %.7f of a prefix, the whole's reference %.7f", bpc, r);
    }
    free(t);
    free(lp);
    mem_free(s);
    ws_free(ws);
    st_close(vf);
    json_decref(e);
    model_free(m);
}

int main(void)
{
    check_bf16();
    check_vectors("aspan-small");
    check_vectors("par-small");
    check_spans();
    check_arch();
    check_bpc("aspan-small", MEM_EXACT, 1e-4);
    check_bpc("par-small", MEM_EXACT, 1e-4);
    /* span-only memory: the 1e-8 renormalisation term is all it drops */
    check_bpc("aspan-small", MEM_SPAN, 2e-3);
    check_txl_word();
    check_par_tf();
    /* adaptive span with persistent memory (all-attention layers): ../shared only */
    if (!shared_path("fixtures/allattn-small/model.safetensors"))
        printf("SKIP test_fixtures allattn-small: ../shared/fixtures/allattn-small is not here\n");
    else {
        check_vectors("allattn-small");
        check_bpc("allattn-small", MEM_EXACT, 1e-4);
        check_bpc("allattn-small", MEM_SPAN, 2e-3);
    }
    /* GPT-style window models: ../shared only */
    const char *gpts[] = {"gpt-aspan", "nanogpt-char"};
    for (int i = 0; i < 2; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "fixtures/%s/model.safetensors", gpts[i]);
        if (!shared_path(rel)) printf("SKIP test_fixtures %s: ../shared/fixtures/%s is not here\n", gpts[i], gpts[i]);
        else check_gpt(gpts[i]);
    }
    return test_summary("test_fixtures");
}
