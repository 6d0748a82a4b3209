/*
 * bench_gpu.c - `make bench`: the figures of issue 4 for the benchmark
 * models of ../shared/bench/README.md, random weights of those shapes:
 *
 *   aspan-enwik8  12 layers, hidden 512, 8 heads, inner 2048, span 8192,
 *                 vocabulary 256, per-head spans of bench/span-profile.json
 *                 (spans include the ramp R = 32: current_val = (span-R)/S);
 *                 in both memory modes (model.h: exact keeps keys of the
 *                 layer's whole window, span only the head's reach)
 *   par-base      24 blocks afff x4 + f x8, d_model 512, 8 heads of 64,
 *                 inner 2048, mem_len 512, vocabulary 256
 *
 * Each in float32 and in bf16 (kernels/gpu.h: GPU_FP32, GPU_BF16). For each:
 * decode tokens/s with 1 and 64 sessions (one token a step, memory carried,
 * CUDA graphs; 1 session also without graphs and with the logprobs copied
 * to the host),
 * scoring tokens/s with 1 and 16 streams in blocks of 512, memory bytes per
 * session, and the card. Times are CUDA events on the model's stream around
 * whole gpu_forward calls (each ends in a synchronisation, so host overhead
 * counts), after warm-up; the median of 5 runs.
 * SPANSERVE_SHARED names the folder of bench/span-profile.json.
 *
 *   txl-wt103     a word-level Transformer-XL shaped like the WikiText-103
 *                 base model (16 layers, d_model 512, 8 heads of 64, inner
 *                 2048, vocabulary 267,735, cutoffs 20k/40k/200k, div_val 1,
 *                 mem_len 640, tgt_len 64, same_length), random weights:
 *                 scoring with 1 and 32 streams in segments of 64 (the
 *                 targets' logprobs to the host, as the server scores),
 *                 decode with 1 and 64 sessions: each next token sampled
 *                 on the device (temperature 1, top-p 0.9, as the server
 *                 does: kernels/sample.cu), greedy, the step alone, and
 *                 with the whole rows to the host (what sampling on the
 *                 host would cost). NVIDIA's own figures for that model: 6,936
 *                 tokens/s at batch 1 and 107,082 at batch 32 on an A100
 *                 (FP16, TorchScript, tgt_len 64, mem_len 640).
 */
#define _POSIX_C_SOURCE 200809L
#include "err.h"
#include "harness.h"
#include "model.h"

#ifndef SPANSERVE_CUDA
int main(void)
{
    printf("SKIP bench_gpu: no GPU (built without nvcc)\n");
    return 0;
}
#else

#include "../kernels/gpu.h"
#include "randmodel.h"

#include <jansson.h>
#include <unistd.h>

#define SESSIONS 64
#define BLOCK 512
#define RUNS 5

typedef struct {
    const char *name, *mode;
    int prec;
    double dec1, dec1_lp, dec1_ng, dec64, dec64_nt, sc1, sc16, sc16_nt, ms1;
    size_t bytes, ref_bytes, full_bytes;
} row_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One step of rate(): with SP, each stream's next token picked on the
 * device (gpu_forward_pick), else the rows to LP (or nowhere). */
static int step(gpu_model *g, gpu_mem **mems, int B, const int32_t *tok, int M, float *lp, const sample_params *sp,
                rm_rng *rng, char *err)
{
    if (!sp) return gpu_forward(g, mems, B, tok, M, lp, err);
    pick_req q[64];
    pick_out o[64];
    for (int b = 0; b < B && b < 64; b++)
        q[b] = (pick_req){b * M + M - 1, 1, *sp, (double)(rm_next(rng) >> 11) * 0x1.0p-53, 1};
    return gpu_forward_pick(g, mems, B, tok, M, NULL, NULL, B < 64 ? B : 64, q, o, err);
}

/* Tokens/s of STEPS calls of gpu_forward(B streams x M tokens), the median of
 * RUNS timed runs after WARM untimed calls. */
static double rate(gpu_model *g, gpu_timer *t, gpu_mem **mems, int B, int M, int steps, int warm, float *lp,
                   const sample_params *sp, rm_rng *rng, double *ms_step)
{
    char err[ERR_LEN];
    const int V = gpu_model_host(g)->V;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * M);
    double r[RUNS];
    for (int i = 0; i < B * M; i++) tok[i] = (int32_t)(rm_next(rng) % (uint64_t)V);
    for (int i = 0; i < warm; i++)
        if (step(g, mems, B, tok, M, lp, sp, rng, err)) { printf("FAIL: %s\n", err); free(tok); return 0; }
    if (steps == 0) { free(tok); return 0; }
    for (int k = 0; k < RUNS; k++) {
        gpu_timer_start(t);
        for (int i = 0; i < steps; i++) {
            tok[i % (B * M)] = (int32_t)(rm_next(rng) % (uint64_t)V);
            if (step(g, mems, B, tok, M, lp, sp, rng, err)) { printf("FAIL: %s\n", err); free(tok); return 0; }
        }
        double ms = gpu_timer_stop_ms(t);
        r[k] = ms / steps;
    }
    free(tok);
    qsort(r, RUNS, sizeof *r, cmp_double);
    if (ms_step) *ms_step = r[RUNS / 2];
    return (double)B * M / (r[RUNS / 2] / 1000.0);
}

static void profile(gpu_model *g, gpu_mem **mems, int B, int M, int steps, const char *what);

/* Tokens/s of scoring B streams x M tokens with targets (only their
 * logprobs come to the host), as rate(). */
static double rate_targets(gpu_model *g, gpu_timer *t, gpu_mem **mems, int B, int M, int steps, float *lp, rm_rng *rng)
{
    char err[ERR_LEN];
    const int V = gpu_model_host(g)->V;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * M), *tg = malloc(sizeof(int32_t) * (size_t)B * M);
    double r[RUNS];
    for (int i = 0; i < B * M; i++) {
        tok[i] = (int32_t)(rm_next(rng) % (uint64_t)V);
        tg[i] = (int32_t)(rm_next(rng) % (uint64_t)V);
    }
    if (gpu_forward_targets(g, mems, B, tok, M, tg, lp, err)) { printf("FAIL: %s\n", err); free(tok); free(tg); return 0; }
    for (int k = 0; k < RUNS; k++) {
        gpu_timer_start(t);
        for (int i = 0; i < steps; i++)
            if (gpu_forward_targets(g, mems, B, tok, M, tg, lp, err)) { printf("FAIL: %s\n", err); free(tok); free(tg); return 0; }
        r[k] = gpu_timer_stop_ms(t) / steps;
    }
    free(tok);
    free(tg);
    qsort(r, RUNS, sizeof *r, cmp_double);
    return (double)B * M / (r[RUNS / 2] / 1000.0);
}

/* The word-level benchmark (the header): scoring 1 and 32 streams, decode
 * 1 and 64 sessions, bytes a session. */
static int bench_txl(const model_t *m, int prec, char *line, size_t cap)
{
    char err[ERR_LEN];
    const int NS = 64, Q = m->block_len;
    gpu_model *g = gpu_model_new(m, NS, Q, prec, err);
    if (!g) { printf("FAIL txl-wt103: %s\n", err); return -1; }
    gpu_timer *t = gpu_timer_new(g, err);
    gpu_mem *mems[64];
    for (int s = 0; s < NS; s++)
        if (!(mems[s] = gpu_mem_new(g, err))) { printf("FAIL txl-wt103: %s\n", err); return -1; }
    float *lp = malloc(sizeof(float) * (size_t)NS * Q * m->V);   /* the server's layout; only targets are written */
    rm_rng rng = {7};
    /* every session's memory full first: mem_len 640 = 10 segments */
    for (int k = 0; k < m->mem_len / Q + 1; k++) rate(g, t, mems, NS, Q, 0, 1, NULL, NULL, &rng, NULL);
    double sc1 = rate_targets(g, t, mems, 1, Q, 10, lp, &rng), sc32 = rate_targets(g, t, mems, 32, Q, 5, lp, &rng);
    /* decode: each token sampled on the device (temperature 1, top-p 0.9), greedy, the step alone, and
     * the rows copied to the host to sample there (what a host sampler costs) */
    const sample_params nucleus = {1, 0, 0.9}, argmax = {0, 0, 1};
    double d1 = rate(g, t, mems, 1, 1, 100, 10, NULL, &nucleus, &rng, NULL),
           d64 = rate(g, t, mems, NS, 1, 30, 5, NULL, &nucleus, &rng, NULL);
    double d1g = rate(g, t, mems, 1, 1, 100, 10, NULL, &argmax, &rng, NULL),
           d64g = rate(g, t, mems, NS, 1, 30, 5, NULL, &argmax, &rng, NULL);
    double d1n = rate(g, t, mems, 1, 1, 100, 10, NULL, NULL, &rng, NULL), d64n = rate(g, t, mems, NS, 1, 30, 5, NULL, NULL, &rng, NULL);
    double d1l = rate(g, t, mems, 1, 1, 100, 10, lp, NULL, &rng, NULL), d64l = rate(g, t, mems, NS, 1, 30, 5, lp, NULL, &rng, NULL);
    printf("txl-wt103 %s: scoring 1x%d %.0f tok/s, 32x%d %.0f tok/s; decode 1 %.0f tok/s sampled on the device (greedy %.0f, "
           "the step alone %.0f, rows to the host %.0f), 64 %.0f tok/s (%.0f, %.0f, %.0f); %zu bytes a session on the device "
           "(reference %zu); weights %.1f MB, step buffers %.1f MB\n",
           gpu_precision_name(prec), Q, sc1, Q, sc32, d1, d1g, d1n, d1l, d64, d64g, d64n, d64l, gpu_mem_bytes(g),
           mem_bytes_reference(m), gpu_model_weight_bytes(g) / 1e6, gpu_model_step_bytes(g) / 1e6);
    snprintf(line, cap, "| txl-wt103 | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %zu | %zu |", gpu_precision_name(prec),
             sc1, sc32, d1, d1l, d64, d64l, gpu_mem_bytes(g), mem_bytes_reference(m));
    long launches = 0;
    int captured = 0;
    const char *why = "";
    gpu_graph_status(g, &launches, &captured, &why);
    printf("  graphs: %d captured, %ld steps%s%s\n", captured, launches, why[0] ? ", off: " : "", why);
    profile(g, mems, 32, Q, 2, "scoring 32x64");
    profile(g, mems, 1, 1, 20, "decode 1");
    profile(g, mems, NS, 1, 5, "decode 64");
    fflush(stdout);
    free(lp);
    for (int s = 0; s < NS; s++) gpu_mem_free(mems[s]);
    gpu_timer_free(t);
    gpu_model_free(g);
    return 0;
}

/* Device time per operation over STEPS steps of B x M (gpu_profile), in ms
 * a step, largest first. */
static void profile(gpu_model *g, gpu_mem **mems, int B, int M, int steps, const char *what)
{
    char err[ERR_LEN];
    const int V = gpu_model_host(g)->V;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * M);
    for (int i = 0; i < B * M; i++) tok[i] = (int32_t)(i * 7919 % V);
    const char *names[32];
    double ms[32], total = 0;
    long calls[32];
    gpu_profile(g, 1, err);
    gpu_profile_read(g, names, ms, calls, 32);
    for (int i = 0; i < steps; i++)
        if (gpu_forward(g, mems, B, tok, M, NULL, err)) { printf("FAIL: %s\n", err); break; }
    int n = gpu_profile_read(g, names, ms, calls, 32);
    gpu_profile(g, 0, err);
    free(tok);
    for (int i = 0; i < n; i++) total += ms[i];
    printf("  profile, %s: %.3f ms a step on the device:", what, total / steps);
    for (int k = 0; k < n; k++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (ms[i] >= 0 && (best < 0 || ms[i] > ms[best])) best = i;
        if (best < 0 || ms[best] <= 0) break;
        printf(" %s %.3f (%.0f%%, %ld launches)", names[best], ms[best] / steps, 100 * ms[best] / total,
               calls[best] / steps);
        ms[best] = -1;
    }
    printf("\n");
}

static int bench_model(const model_t *m, const char *name, const char *mode, int prec, row_t *row)
{
    char err[ERR_LEN];
    gpu_model *g = gpu_model_new(m, SESSIONS, BLOCK, prec, err);
    if (!g) { printf("FAIL %s: %s\n", name, err); return -1; }
    gpu_timer *t = gpu_timer_new(g, err);
    gpu_mem *mems[SESSIONS];
    for (int s = 0; s < SESSIONS; s++)
        if (!(mems[s] = gpu_mem_new(g, err))) { printf("FAIL %s: %s\n", name, err); return -1; }
    float *lp = malloc(sizeof(float) * SESSIONS * m->V);
    rm_rng rng = {42};
    /* every session first takes one block, so PAR's memory is full */
    for (int s = 0; s < SESSIONS; s += 16) rate(g, t, mems + s, 16, BLOCK, 0, 1, NULL, NULL, &rng, NULL);
    row->name = name;
    row->mode = mode;
    row->prec = prec;
    row->dec1 = rate(g, t, mems, 1, 1, 200, 20, NULL, NULL, &rng, &row->ms1);
    row->dec1_lp = rate(g, t, mems, 1, 1, 200, 20, lp, NULL, &rng, NULL);
    gpu_graphs(g, 0);
    row->dec1_ng = rate(g, t, mems, 1, 1, 200, 20, NULL, NULL, &rng, NULL);
    gpu_graphs(g, 1);
    row->dec64 = rate(g, t, mems, SESSIONS, 1, 50, 10, NULL, NULL, &rng, NULL);
    row->sc1 = rate(g, t, mems, 1, BLOCK, 10, 2, NULL, NULL, &rng, NULL);
    row->sc16 = rate(g, t, mems, 16, BLOCK, 4, 1, NULL, NULL, &rng, NULL);
    gpu_tiles(g, 0);
    row->sc16_nt = rate(g, t, mems, 16, BLOCK, 4, 1, NULL, NULL, &rng, NULL);
    row->dec64_nt = rate(g, t, mems, SESSIONS, 1, 50, 10, NULL, NULL, &rng, NULL);
    gpu_tiles(g, 1);
    row->bytes = gpu_mem_bytes(g);
    row->ref_bytes = mem_bytes_reference(m);
    row->full_bytes = mem_bytes_full(m);
    long launches = 0;
    int captured = 0;
    const char *why = "";
    gpu_graph_status(g, &launches, &captured, &why);
    printf("%-13s %-5s %s decode 1: %.0f tok/s (%.3f ms a step; %.0f without graphs; %.0f with logprobs to the host), "
           "64: %.0f tok/s; scoring 1x512: %.0f tok/s, 16x512: %.0f tok/s; %zu bytes a session (reference %zu); "
           "device: weights %.1f MB, step buffers %.1f MB; graphs: %d captured, %ld steps%s%s\n",
           name, mode, gpu_precision_name(prec), row->dec1, row->ms1, row->dec1_ng, row->dec1_lp, row->dec64, row->sc1,
           row->sc16, row->bytes, row->ref_bytes, gpu_model_weight_bytes(g) / 1e6, gpu_model_step_bytes(g) / 1e6,
           captured, launches, why[0] ? ", off: " : "", why);
    /* (the profile launches one by one: its events sit between the launches) */
    profile(g, mems, 1, 1, 20, "decode 1");
    profile(g, mems, SESSIONS, 1, 5, "decode 64");
    profile(g, mems, 16, BLOCK, 2, "scoring 16x512");
    fflush(stdout);
    free(lp);
    for (int s = 0; s < SESSIONS; s++) gpu_mem_free(mems[s]);
    gpu_timer_free(t);
    gpu_model_free(g);
    return 0;
}

/* current_val per head from bench/span-profile.json: (span - R) / S. */
static float *enwik8_spans(int *L, int *K, char *err)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/bench/span-profile.json", shared_dir());
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je), *sp = json_object_get(j, "spans");
    if (!json_is_array(sp) || json_array_size(sp) == 0) {
        err_set(err, "%s: %s", p, j ? "no spans" : je.text);
        json_decref(j);
        return NULL;
    }
    int S = (int)json_integer_value(json_object_get(j, "max_span")), R = (int)json_integer_value(json_object_get(j, "ramp"));
    *L = (int)json_array_size(sp);
    *K = (int)json_array_size(json_array_get(sp, 0));
    float *z = malloc(sizeof(float) * (size_t)*L * *K);
    for (int l = 0; l < *L; l++)
        for (int h = 0; h < *K; h++) {
            double s = json_number_value(json_array_get(json_array_get(sp, (size_t)l), (size_t)h));
            z[l * *K + h] = (float)((s - R > 0 ? s - R : 0) / S);
        }
    json_decref(j);
    return z;
}

int main(int argc, char **argv)
{
    char err[ERR_LEN], card[256];
    const int only_txl = argc > 1 && strcmp(argv[1], "txl") == 0;   /* bench_gpu txl: the word-level model alone */
    if (gpu_available(err)) {
        printf("SKIP bench_gpu: no GPU (%s)\n", err);
        return 0;
    }
    gpu_device_name(card, sizeof card, err);
    const char *ped = getenv("SPANSERVE_GPU_PEDANTIC");
    const char *math = ped && strcmp(ped, "1") == 0 ? "cuBLAS pedantic math" : "cuBLAS default math, no TF32";
    printf("bench_gpu on %s (float32: %s; bf16: cuBLAS bf16 x bf16 -> fp32)\n", card, math);
    row_t rows[6];
    int nrows = 0;
    char txl_rows[2][512] = {"", ""};
    {
        const char *pt = "/tmp/spanserve-bench-txl-wt103.safetensors";
        rm_txl w = {267735, 512, 8, 64, 2048, 16, 512, 1, 3, {20000, 40000, 200000}, 1, 0, 0, 0, 64, 640, -1, 1, 1};
        if (rm_write_txl(pt, &w, 3, err)) { printf("FAIL: %s\n", err); return 1; }
        model_t *mt = model_load(pt, err);
        unlink(pt);
        if (!mt) { printf("FAIL: %s\n", err); return 1; }
        for (int prec = GPU_FP32; prec <= GPU_BF16; prec++) bench_txl(mt, prec, txl_rows[prec == GPU_BF16], sizeof txl_rows[0]);
        model_free(mt);
        printf("\ncard: %s; tokens/s (median of %d runs)\n", card, RUNS);
        printf("| model | precision | score 1x64 | score 32x64 | decode 1 (sampled on device) | decode 1 (rows to host) | "
               "decode 64 (sampled on device) | decode 64 (rows to host) | bytes/session | reference bytes |\n"
               "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        printf("%s\n%s\n\n", txl_rows[0], txl_rows[1]);
        if (only_txl) return txl_rows[0][0] && txl_rows[1][0] ? 0 : 1;
    }

    if (!shared_path("bench/span-profile.json")) {
        printf("SKIP bench_gpu: no %s/bench/span-profile.json (the reference's spans; set SPANSERVE_SHARED)\n", shared_dir());
        return 0;
    }
    int L = 0, K = 0;
    float *z = enwik8_spans(&L, &K, err);
    if (!z) { printf("FAIL: %s\n", err); return 1; }
    const char *pa = "/tmp/spanserve-bench-aspan-enwik8.safetensors", *pp = "/tmp/spanserve-bench-par-base.safetensors";
    rm_aspan a = {256, 512, K, 2048, L, 8192, BLOCK, 32, z, 0};
    if (rm_write_aspan(pa, &a, 1, err)) { printf("FAIL: %s\n", err); return 1; }
    free(z);
    for (int mode = 0; mode < 2; mode++) {
        model_t *m = model_load_mode(pa, mode ? MEM_SPAN : MEM_EXACT, err);
        if (!m) { printf("FAIL: %s\n", err); return 1; }
        for (int prec = GPU_FP32; prec <= GPU_BF16; prec++)
            if (bench_model(m, "aspan-enwik8", mode ? "span" : "exact", prec, &rows[nrows]) == 0) nrows++;
        model_free(m);
    }
    unlink(pa);

    rm_par q = {256, 512, 8, 64, 2048, 512, BLOCK, 1, "afffafffafffafffffffffff"};
    if (rm_write_par(pp, &q, 2, err)) { printf("FAIL: %s\n", err); return 1; }
    model_t *m = model_load(pp, err);
    if (!m) { printf("FAIL: %s\n", err); return 1; }
    for (int prec = GPU_FP32; prec <= GPU_BF16; prec++)
        if (bench_model(m, "par-base", "-", prec, &rows[nrows]) == 0) nrows++;
    model_free(m);
    unlink(pp);

    printf("\ncard: %s; float32: %s; tokens/s (median of %d runs, CUDA events, after warm-up)\n", card, math, RUNS);
    printf("| model | memory | precision | decode 1 | decode 1 (no graph) | decode 1 (+logprobs to host) | decode 64 | "
           "score 1x512 | score 16x512 | score 16x512 (untiled) | decode 64 (per-query kernel) | bytes/session | "
           "reference bytes | full-span bytes |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < nrows; i++) {
        row_t *r = &rows[i];
        printf("| %s | %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %zu | %zu | %zu |\n", r->name,
               r->mode, gpu_precision_name(r->prec), r->dec1, r->dec1_ng, r->dec1_lp, r->dec64, r->sc1, r->sc16,
               r->sc16_nt, r->dec64_nt, r->bytes, r->ref_bytes, r->full_bytes);
    }
    return nrows == 6 ? 0 : 1;
}
#endif
