/*
 * fuzz_state_seeds.c - writes fuzz_state's seeds into DIR: for each tiny
 * model, the state of a fresh stream and of streams fed 3, 9 and 40 tokens
 * (past the span, mem_len and window), each prefixed by the model's selector byte.
 */
#include "fuzz_models.h"

int main(int argc, char **argv)
{
    if (argc != 2) return fprintf(stderr, "usage: fuzz_state_seeds DIR\n"), 2;
    fuzz_models_load();
    static const int fed[] = {0, 3, 9, 40};
    for (int k = 0; k < FUZZ_N_MODELS; k++)
        for (size_t f = 0; f < sizeof fed / sizeof *fed; f++) {
            const model_t *m = fuzz_model((unsigned)k);
            mem_t *s = mem_new(m);
            fwd_ws *ws = ws_new();
            char err[ERR_LEN];
            REQUIRE(s && ws);
            for (int t = 0; t < fed[f]; t++) {
                int32_t tok = (t * 7 + k) % m->V;
                REQUIRE(model_forward(m, &s, 1, &tok, 1, NULL, ws, err) == 0);
            }
            size_t n = mem_serial_size(s);
            unsigned char *b = malloc(n + 1);
            REQUIRE(b);
            b[0] = (unsigned char)k;
            REQUIRE(mem_serialize(s, b + 1, n) == 0);
            char path[1024];
            snprintf(path, sizeof path, "%s/state-%d-%d", argv[1], k, fed[f]);
            FILE *o = fopen(path, "wb");
            REQUIRE(o && fwrite(b, 1, n + 1, o) == n + 1 && fclose(o) == 0);
            free(b);
            ws_free(ws);
            mem_free(s);
        }
    return 0;
}
