/*
 * fuzz_state.c - libFuzzer target for session states (`make fuzz`): the
 * bytes PUT /v1/sessions/ID/state hands to mem_deserialize.
 *
 * The first byte picks a tiny model of tests/fuzz/models (adaptive-span with
 * exact or span memory, PAR, or a window model: fuzz_models.h); the rest is
 * the state. A refusal must come
 * with a message and leave the memory as it was. An accepted state
 * serialises back to the same bytes, and two tokens fed from it give finite
 * log-probabilities (or, at the bound on positions, a refusal that says
 * so): the bounds mem_deserialize puts on a state's values are what keeps a
 * made-up state from overflowing the forward. The seeds are real states
 * (fuzz_state_seeds.c).
 */
#include "fuzz_models.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    fuzz_models_load();
    const model_t *m = fuzz_model(data[0]);
    mem_t *s = mem_new(m);
    REQUIRE(s != NULL);
    size_t n = mem_serial_size(s);
    unsigned char *before = malloc(n), *after = malloc(n);
    REQUIRE(before && after);
    REQUIRE(mem_serialize(s, before, n) == 0);
    char err[ERR_LEN];
    err[0] = 0;
    if (mem_deserialize(s, data + 1, size - 1, err)) {
        REQUIRE(err[0] != 0);
        REQUIRE(mem_serialize(s, after, n) == 0 && memcmp(before, after, n) == 0);
    } else {
        REQUIRE(size - 1 == n && mem_serialize(s, after, n) == 0 && memcmp(after, data + 1, n) == 0);
        int32_t toks[2] = {data[size - 1] % m->V, data[size / 2] % m->V};
        float *lp = malloc(2 * (size_t)m->V * sizeof *lp);
        fwd_ws *ws = ws_new();
        REQUIRE(lp && ws);
        if (s->pos > MEM_MAX_POS - 2) {   /* at the bound on positions: refused, saying so */
            REQUIRE(model_forward(m, &s, 1, toks, 2, lp, ws, err) != 0 && strstr(err, "at most"));
        } else {
            REQUIRE(model_forward(m, &s, 1, toks, 2, lp, ws, err) == 0);
            for (int i = 0; i < 2 * m->V; i++) REQUIRE(isfinite(lp[i]));
        }
        ws_free(ws);
        free(lp);
    }
    free(before);
    free(after);
    mem_free(s);
    return 0;
}
