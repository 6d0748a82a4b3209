/*
 * test_fixtures.c - the CPU forward against the reference's own outputs
 * (../shared/fixtures): logprobs of every block, the single-token step, the
 * full-evaluation bpc, the spans, and chunked scoring.
 */
#include "err.h"
#include "harness.h"
#include "model.h"
#include "st.h"

#include <jansson.h>

static char path[1024];

static const char *fx(const char *name, const char *file)
{
    snprintf(path, sizeof path, "%s/fixtures/%s/%s", shared_dir(), name, file);
    return path;
}

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
        if (m->fam == FAM_ASPAN)
            for (int c = 0; c < V; c++) {
                double d = fabs(lp[c] - ref[(size_t)(i / M) * M * V + (i % M) * V + c]);
                worst_tok = d > worst_tok ? d : worst_tok;
            }
    }
    if (m->fam == FAM_ASPAN) {
        printf("%s: token-at-a-time max diff %.2e\n", name, worst_tok);
        CHECK(worst_tok <= 1e-4, "%s token-at-a-time: %.3g", name, worst_tok);
    }
    free(lp); free(in); free(tok); free(ref); free(sref);
    mem_free(mems[0]); mem_free(mems[1]);
    ws_free(ws);
    st_close(vf);
    model_free(m);
}

int main(void)
{
    check_vectors("aspan-small");
    check_vectors("par-small");
    return test_summary("test_fixtures");
}
