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
 * scoring tokens/s with 1 and 16 streams in blocks of 512 (16 also with the
 * per-query kernels, and in bf16 with the tiled attention on CUDA cores
 * instead of tensor cores: gpu_tensor_cores), aspan-enwik8 also with 1
 * stream in blocks of 4096 (a gpu_model of its own, max_batch 1 x max_block
 * 4096), memory bytes per session, and the card. Times are CUDA events on
 * the model's stream around whole gpu_forward calls (each ends in a
 * synchronisation, so host overhead counts), after warm-up; the median of 5
 * runs. SPANSERVE_SHARED names the folder of bench/span-profile.json.
 *
 * Model FLOP utilisation (MFU) of the scoring figures: model FLOPs a token
 * x tokens/s / the card's dense bf16 peak (989 TFLOP/s for an H100 SXM or an
 * H200, by gpu_device_name; env SPANSERVE_PEAK_TFLOPS sets it; another card
 * gets its TFLOP/s and "peak unknown"), in both precisions. The FLOPs of
 * one scored token (flops_per_token), 2 per multiply-add, norms,
 * activations, softmax and the span mask left out:
 *   every linear layer: the output layer 2 V d_model; adaptive-span q, k, v,
 *     o 4 x 2 H^2 and the feed-forward 2 x 2 H d_inner a layer; PAR qkv and
 *     o 4 x 2 d_model (n_head d_head) an attention block, the feed-forward
 *     2 x 2 d_model d_inner a feed-forward block;
 *   attention, per query and head of D = d_head dims, over the keys it
 *     actually scores: adaptive-span 2 D kw (q.k) + 2 D kw (q.pe, the
 *     position term) + 2 D r (p.v), kw = layers[l].krows[h] (the layer's
 *     window in exact memory, the head's reach in span memory) and r =
 *     layers[l].reach[h]; PAR 2 D n each for q.k, q.r and p.v, n = mem_len
 *     + i + 1 keys for query i of a block of M (mem_len + (M+1)/2 on
 *     average; the memory is full in the benchmark). PAR's r_net of the
 *     distances is a table made at load, not counted.
 * The count is the model's, not the kernels': in exact memory the scores
 * past a head's reach count (the reference computes them), a tile of keys
 * a kernel computes and masks does not.
 *
 * `bench_gpu txl` runs the word-level model alone; `bench_gpu txl-ncu` runs
 * one bf16 step of it (32 x 64, Zipf targets) between cudaProfilerStart and
 * Stop, after warm-up, for `ncu --profile-from-start off` (README "Scoring
 * on tensor cores" has the kernels it timed).
 *
 * `bench_gpu write-models DIR` writes the two models (the same random
 * weights, aspan-enwik8 with the spans of span-profile.json) to
 * DIR/aspan-enwik8.safetensors and DIR/par-base.safetensors, with a
 * vocabulary of the characters U+0001..U+0100 instead of randmodel.h's
 * U+0100.., so that any ASCII or Latin-1 text scores (tests/bench_server.py
 * serves them), and exits; it needs no GPU.
 *
 *   txl-wt103     a word-level Transformer-XL shaped like the WikiText-103
 *                 base model (16 layers, d_model 512, 8 heads of 64, inner
 *                 2048, vocabulary 267,735, cutoffs 20k/40k/200k, div_val 1,
 *                 mem_len 640, tgt_len 64, same_length), random weights:
 *                 scoring with 1 and 32 streams in segments of 64 (the
 *                 targets' logprobs to the host, as the server scores;
 *                 targets uniform over the vocabulary, and by Zipf's law,
 *                 P(id) ~ 1/(id + 1), as on text, where about 80% fall in
 *                 the 20k shortlist and a tail cluster computes only its
 *                 rows: kernels/adaptive.cu),
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
#include "randmodel.h"
#include "st.h"

#include <jansson.h>
#include <unistd.h>

#define BLOCK 512
#define LONG_BLOCK 4096   /* aspan-enwik8 scored by 1 stream in blocks of this many */

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

/* The benchmark's aspan-enwik8 (seed 1) at PATH. */
static int write_aspan_enwik8(const char *path, char *err)
{
    int L = 0, K = 0;
    float *z = enwik8_spans(&L, &K, err);
    if (!z) return -1;
    rm_aspan a = {256, 512, K, 2048, L, 8192, BLOCK, 32, z, 0};
    int rc = rm_write_aspan(path, &a, 1, err);
    free(z);
    return rc;
}

/* The benchmark's par-base (seed 2) at PATH. */
static int write_par_base(const char *path, char *err)
{
    rm_par q = {256, 512, 8, 64, 2048, 512, BLOCK, 1, "afffafffafffafffffffffff"};
    return rm_write_par(path, &q, 2, err);
}

/* SRC's tensors and config at DST, with the vocabulary of the characters
 * U+0001..U+0100 (256, as the models'): ASCII and Latin-1 texts encode. */
static int write_with_text_vocab(const char *src, const char *dst, char *err)
{
    st_file *f = st_open(src, err);
    if (!f) return -1;
    json_t *v = json_array();
    for (uint32_t cp = 1; cp <= 256; cp++) {
        char u[2] = {(char)cp, 0};
        if (cp >= 0x80) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F));
        json_array_append_new(v, json_stringn(u, cp < 0x80 ? 1 : 2));
    }
    char *vocab = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    st_writer *w = st_writer_new();
    const char *config = st_meta(f, "config");
    int rc = vocab && w && config ? 0 : err_set(err, "%s: out of memory, or no config", src);
    if (rc == 0) rc = st_writer_meta(w, "config", config) || st_writer_meta(w, "vocab", vocab) ? err_set(err, "out of memory") : 0;
    for (int i = 0; rc == 0 && i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        if (st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data)) rc = err_set(err, "out of memory");
    }
    if (rc == 0) rc = st_writer_save(w, dst, err);
    if (w) st_writer_free(w);
    free(vocab);
    st_close(f);
    return rc;
}

/* bench_gpu write-models DIR (the header). */
static int write_models(const char *dir)
{
    char err[ERR_LEN], tmp[1024], dst[1024];
    static const char *const names[2] = {"aspan-enwik8", "par-base"};
    if (!shared_path("bench/span-profile.json")) {
        printf("FAIL bench_gpu write-models: no %s/bench/span-profile.json (set SPANSERVE_SHARED)\n", shared_dir());
        return 1;
    }
    for (int k = 0; k < 2; k++) {
        snprintf(tmp, sizeof tmp, "%s/.%s.random.safetensors", dir, names[k]);
        snprintf(dst, sizeof dst, "%s/%s.safetensors", dir, names[k]);
        int rc = k == 0 ? write_aspan_enwik8(tmp, err) : write_par_base(tmp, err);
        if (rc == 0) rc = write_with_text_vocab(tmp, dst, err);
        unlink(tmp);
        if (rc) { printf("FAIL bench_gpu write-models: %s\n", err); return 1; }
        printf("wrote %s\n", dst);
    }
    return 0;
}

#ifdef SPANSERVE_CUDA

#include "../kernels/gpu.h"

#define SESSIONS 64
#define RUNS 5

typedef struct {
    const char *name, *mode;
    int prec;
    double dec1, dec1_lp, dec1_ng, dec64, dec64_nt, sc1, sc16, sc16_nt, ms1;
    /* decode_step.cu's one kernel a step (bf16; 0: not planned): 1 session sampled on the device (as the server
     * generates), 8 sessions; decode 1 through the graphs instead; the step's floor in ms (weights and memory read
     * once at the card's bandwidth) */
    double dec1_mk, dec1_pick, dec8, dec1_graph, dec8_graph, dec4, dec4_graph, floor1, floor8;
    int mk_auto;        /* GPU_DECODE_AUTO's most sessions a kernel step */
    size_t bytes, ref_bytes, full_bytes;
    double sc16_cc;     /* bf16: 16x512 with the tiles on CUDA cores (gpu_tensor_cores 0); 0: not measured */
    double sc_long;     /* 1 x LONG_BLOCK (aspan-enwik8); 0: not measured */
    double flops, flops_long;   /* model FLOPs a token in blocks of BLOCK, of LONG_BLOCK */
} row_t;

/* Model FLOPs of one token scored in blocks of M (the header's count). */
static double flops_per_token(const model_t *m, int M)
{
    const double D = m->d_model, I = m->d_inner, dh = m->d_head, A = (double)m->n_head * m->d_head;
    const int aspan = strcmp(model_family_name(m), "adaptive-span") == 0;
    double f = 2.0 * m->V * D;   /* the output layer */
    for (int l = 0; l < m->n_layers; l++) {
        const layer_t *y = &m->layers[l];
        if (aspan) {
            /* q, k, v, o and the feed-forward; per head q.k and q.pe over kw keys, p.v over the reach
             * (and the persistent vectors' scores and values where there are any) */
            f += 8 * D * D + (m->pers ? 0 : 4 * D * I);
            for (int h = 0; h < m->n_head; h++) f += 2 * dh * (2.0 * y->krows[h] + y->reach[h] + 2.0 * m->pers);
        } else if (y->kind == BLK_ATTN) {
            /* qkv and o; q.k, q.r, p.v over mem_len + i + 1 keys for query i */
            f += 8 * D * A + 3 * 2 * A * (m->mem_len + (M + 1) / 2.0);
        } else if (y->kind == BLK_FFN) {
            f += 4 * D * I;
        }
    }
    return f;
}

/* The card's dense bf16 peak in TFLOP/s (the header): SPANSERVE_PEAK_TFLOPS,
 * else 989 for an H100 SXM ("H100 80GB HBM3"; not PCIe, not NVL) or an
 * H200, else 0: unknown. */
static double peak_tflops(const char *card)
{
    const char *e = getenv("SPANSERVE_PEAK_TFLOPS");
    if (e && atof(e) > 0) return atof(e);
    if (strstr(card, "H200") || (strstr(card, "H100") && !strstr(card, "PCIe") && !strstr(card, "NVL"))) return 989;
    return 0;
}

/* "T TFLOP/s, MFU x.x% of P TFLOP/s" of TOKS tokens/s at FLOPS a token
 * (LONG: the line's form; else the table's "T (x.x%)"). */
static const char *mfu_text(char *buf, size_t cap, double toks, double flops, double peak, int lng)
{
    const double tf = toks * flops * 1e-12;
    if (toks <= 0) snprintf(buf, cap, "-");
    else if (!lng && peak > 0) snprintf(buf, cap, "%.1f (%.1f%%)", tf, 100 * tf / peak);
    else if (!lng) snprintf(buf, cap, "%.1f (peak unknown)", tf);
    else if (peak > 0) snprintf(buf, cap, "%.1f TFLOP/s, MFU %.1f%% of %.0f TFLOP/s", tf, 100 * tf / peak, peak);
    else snprintf(buf, cap, "%.1f TFLOP/s, peak unknown", tf);
    return buf;
}

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

static void profile(gpu_model *g, gpu_mem **mems, int B, int M, int steps, const char *what, const int32_t *tg, float *lp);

/* Tokens/s of scoring B streams x M tokens with targets (only their
 * logprobs come to the host), as rate(). */
/* A token id drawn from Zipf's law over V ids by rank (P(id) ~ 1 / (id + 1):
 * a word-level vocabulary is sorted by frequency, so on text most targets
 * fall in the adaptive softmax's shortlist), from CDF (V cumulative sums). */
static int32_t zipf_draw(const double *cdf, int V, rm_rng *rng)
{
    const double u = (double)(rm_next(rng) >> 11) * 0x1.0p-53 * cdf[V - 1];
    int lo = 0, hi = V - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (cdf[mid] < u) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* N target ids (the caller frees): by Zipf's law (ZIPF), else uniform over
 * the vocabulary */
static int32_t *draw_targets(int V, int n, rm_rng *rng, int zipf)
{
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)n);
    double *cdf = zipf ? malloc(sizeof(double) * (size_t)V) : NULL;
    for (int v = 0; cdf && v < V; v++) cdf[v] = (v ? cdf[v - 1] : 0.0) + 1.0 / (v + 1);
    for (int i = 0; i < n; i++) tg[i] = cdf ? zipf_draw(cdf, V, rng) : (int32_t)(rm_next(rng) % (uint64_t)V);
    free(cdf);
    return tg;
}

/* (ZIPF: the targets by Zipf's law, else uniform over the vocabulary) */
static double rate_targets(gpu_model *g, gpu_timer *t, gpu_mem **mems, int B, int M, int steps, float *lp, rm_rng *rng,
                           int zipf)
{
    char err[ERR_LEN];
    const int V = gpu_model_host(g)->V;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * M), *tg = draw_targets(V, B * M, rng, zipf);
    double r[RUNS];
    for (int i = 0; i < B * M; i++) tok[i] = (int32_t)(rm_next(rng) % (uint64_t)V);
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
    double sc1 = rate_targets(g, t, mems, 1, Q, 10, lp, &rng, 0), sc32 = rate_targets(g, t, mems, 32, Q, 5, lp, &rng, 0);
    /* targets by Zipf's law (as on text, where most fall in the 20k shortlist) */
    double sz1 = rate_targets(g, t, mems, 1, Q, 10, lp, &rng, 1), sz32 = rate_targets(g, t, mems, 32, Q, 5, lp, &rng, 1);
    /* decode: each token sampled on the device (temperature 1, top-p 0.9), greedy, the step alone, and
     * the rows copied to the host to sample there (what a host sampler costs) */
    const sample_params nucleus = {1, 0, 0.9}, argmax = {0, 0, 1};
    double d1 = rate(g, t, mems, 1, 1, 100, 10, NULL, &nucleus, &rng, NULL),
           d64 = rate(g, t, mems, NS, 1, 30, 5, NULL, &nucleus, &rng, NULL);
    double d1g = rate(g, t, mems, 1, 1, 100, 10, NULL, &argmax, &rng, NULL),
           d64g = rate(g, t, mems, NS, 1, 30, 5, NULL, &argmax, &rng, NULL);
    double d1n = rate(g, t, mems, 1, 1, 100, 10, NULL, NULL, &rng, NULL), d64n = rate(g, t, mems, NS, 1, 30, 5, NULL, NULL, &rng, NULL);
    double d1l = rate(g, t, mems, 1, 1, 100, 10, lp, NULL, &rng, NULL), d64l = rate(g, t, mems, NS, 1, 30, 5, lp, NULL, &rng, NULL);
    printf("txl-wt103 %s: scoring, targets by Zipf's law: 1x%d %.0f tok/s, 32x%d %.0f tok/s\n", gpu_precision_name(prec), Q,
           sz1, Q, sz32);
    printf("txl-wt103 %s: scoring 1x%d %.0f tok/s, 32x%d %.0f tok/s; decode 1 %.0f tok/s sampled on the device (greedy %.0f, "
           "the step alone %.0f, rows to the host %.0f), 64 %.0f tok/s (%.0f, %.0f, %.0f); %zu bytes a session on the device "
           "(reference %zu); weights %.1f MB, step buffers %.1f MB\n",
           gpu_precision_name(prec), Q, sc1, Q, sc32, d1, d1g, d1n, d1l, d64, d64g, d64n, d64l, gpu_mem_bytes(g),
           mem_bytes_reference(m), gpu_model_weight_bytes(g) / 1e6, gpu_model_step_bytes(g) / 1e6);
    snprintf(line, cap, "| txl-wt103 | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %zu | %zu | %.0f | %.0f |",
             gpu_precision_name(prec), sc1, sc32, d1, d1l, d64, d64l, gpu_mem_bytes(g), mem_bytes_reference(m), sz1, sz32);
    long launches = 0;
    int captured = 0;
    const char *why = "";
    gpu_graph_status(g, &launches, &captured, &why);
    printf("  graphs: %d captured, %ld steps%s%s\n", captured, launches, why[0] ? ", off: " : "", why);
    /* bf16 decode as one kernel with the adaptive input and softmax launched around it, against the graphs, each
     * sampled on the device, alternated twice (the default, GPU_DECODE_AUTO, set again after) */
    if (prec == GPU_BF16 && gpu_decode_kernel_status(g, NULL, &why)) {
        static const int bs[4] = {1, 2, 4, 8};
        double r[2][4][2];   /* kernel or graphs, sessions, run */
        for (int k = 0; k < 2; k++)
            for (int w = 0; w < 2; w++) {
                gpu_decode_kernel(g, w ? GPU_DECODE_GRAPHS : GPU_DECODE_KERNEL);
                for (int i = 0; i < 4; i++) r[w][i][k] = rate(g, t, mems, bs[i], 1, bs[i] == 1 ? 100 : 50, 5, NULL, &nucleus, &rng, NULL);
            }
        gpu_decode_kernel(g, GPU_DECODE_AUTO);
        printf("  txl-wt103 bf16 decode, sampled on the device, alternated twice, tok/s, one kernel (the adaptive input and "
               "softmax launched around it) against the graphs:");
        for (int i = 0; i < 4; i++)
            printf("%s %d session%s %.0f / %.0f against %.0f / %.0f", i ? ";" : "", bs[i], bs[i] > 1 ? "s" : "", r[0][i][0],
                   r[0][i][1], r[1][i][0], r[1][i][1]);
        printf("; the kernel takes steps of up to %d sessions by default\n", gpu_decode_kernel_limit(g));
    } else if (prec == GPU_BF16)
        printf("  txl-wt103 bf16: no decode kernel: %s\n", why);
    int32_t *tz = draw_targets(m->V, 32 * Q, &rng, 1);
    profile(g, mems, 32, Q, 2, "scoring 32x64 (whole rows)", NULL, NULL);
    profile(g, mems, 32, Q, 2, "scoring 32x64 (Zipf targets)", tz, lp);
    free(tz);
    profile(g, mems, 1, 1, 20, "decode 1", NULL, NULL);
    profile(g, mems, NS, 1, 5, "decode 64", NULL, NULL);
    fflush(stdout);
    free(lp);
    for (int s = 0; s < NS; s++) gpu_mem_free(mems[s]);
    gpu_timer_free(t);
    gpu_model_free(g);
    return 0;
}

/* `bench_gpu txl-ncu`: one bf16 step of txl-wt103 scoring 32 x 64 with
 * Zipf targets between cudaProfilerStart and Stop, after warm-up, for
 * `ncu --profile-from-start off` (each kernel of the step, timed alone). */
static int bench_txl_ncu(const model_t *m)
{
    char err[ERR_LEN];
    const int B = 32, Q = m->block_len;
    gpu_model *g = gpu_model_new(m, B, Q, GPU_BF16, err);
    if (!g) { printf("FAIL txl-ncu: %s\n", err); return 1; }
    gpu_mem *mems[32];
    for (int s = 0; s < B; s++)
        if (!(mems[s] = gpu_mem_new(g, err))) { printf("FAIL txl-ncu: %s\n", err); return 1; }
    float *lp = malloc(sizeof(float) * (size_t)B * Q * m->V);
    rm_rng rng = {7};
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * Q), *tg = draw_targets(m->V, B * Q, &rng, 1);
    for (int i = 0; i < B * Q; i++) tok[i] = (int32_t)(rm_next(&rng) % (uint64_t)m->V);
    int rc = 0;
    for (int k = 0; k < m->mem_len / Q + 3 && rc == 0; k++) rc = gpu_forward_targets(g, mems, B, tok, Q, tg, lp, err);
    gpu_profiler_range(1);
    if (rc == 0) rc = gpu_forward_targets(g, mems, B, tok, Q, tg, lp, err);
    gpu_profiler_range(0);
    if (rc) printf("FAIL txl-ncu: %s\n", err);
    free(tok);
    free(tg);
    free(lp);
    for (int s = 0; s < B; s++) gpu_mem_free(mems[s]);
    gpu_model_free(g);
    return rc ? 1 : 0;
}

/* Device time per operation over STEPS steps of B x M (gpu_profile), in ms
 * a step, largest first: whole rows, or with TG the targets' logprobs only
 * (into LP, as the server scores). */
static void profile(gpu_model *g, gpu_mem **mems, int B, int M, int steps, const char *what, const int32_t *tg, float *lp)
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
        if (gpu_forward_targets(g, mems, B, tok, M, tg, tg ? lp : NULL, err)) { printf("FAIL: %s\n", err); break; }
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
    if (strcmp(what, "decode 64") == 0) {   /* the last step's operations by layer: where the attention's time goes */
        const char *on[256];
        double om[256];
        const int k = gpu_profile_last(g, on, om, 256);
        printf("  the last step's operations, us (launched one by one):");
        for (int i = 0; i < k; i++) printf(" %s%s %.1f", strcmp(on[i], "qkv") == 0 ? "| " : "", on[i], om[i] * 1e3);
        printf("\n");
    }
}

/* Tokens/s of 1 stream scored in blocks of LONG_BLOCK, on a gpu_model of
 * its own (max_batch 1: its step buffers are an eighth of the 64 x 512
 * model's). */
static double rate_long(const model_t *m, int prec, rm_rng *rng, size_t *step_bytes)
{
    char err[ERR_LEN];
    gpu_model *g = gpu_model_new(m, 1, LONG_BLOCK, prec, err);
    gpu_timer *t = g ? gpu_timer_new(g, err) : NULL;
    gpu_mem *mem = t ? gpu_mem_new(g, err) : NULL;
    double r = 0;
    if (!mem) printf("FAIL score 1x%d: %s\n", LONG_BLOCK, err);
    else {
        r = rate(g, t, &mem, 1, LONG_BLOCK, 3, 2, NULL, NULL, rng, NULL);
        *step_bytes = gpu_model_step_bytes(g);
    }
    if (mem) gpu_mem_free(mem);
    if (t) gpu_timer_free(t);
    if (g) gpu_model_free(g);
    return r;
}

/* The card's memory bandwidth in TB/s (../shared/bench/README.md's
 * datasheet figures: H100 SXM 3.35, H200 4.8; SPANSERVE_PEAK_TBS sets it),
 * 0: unknown */
static double peak_tbs(const char *card)
{
    const char *e = getenv("SPANSERVE_PEAK_TBS");
    if (e && atof(e) > 0) return atof(e);
    if (strstr(card, "H200")) return 4.8;
    if (strstr(card, "H100") && !strstr(card, "PCIe") && !strstr(card, "NVL")) return 3.35;
    return 0;
}

/* Bytes a decode step of B streams reads at the least: every weight of a
 * linear layer once (bf16: 2 bytes, fp32: 4), the B embedding rows, and
 * each stream's memory (the rings the attention reads: all of them) */
static double decode_floor_bytes(const model_t *m, const gpu_model *g, int prec, int B)
{
    const double D = m->d_model, I = m->d_inner, A = (double)m->n_head * m->d_head, w = prec == GPU_BF16 ? 2 : 4;
    double n = (double)m->V * D;   /* the output layer */
    for (int l = 0; l < m->n_layers; l++) {
        const int aspan = strcmp(model_family_name(m), "adaptive-span") == 0;
        const int attn = aspan || m->layers[l].kind == BLK_ATTN, ffn = aspan ? !m->pers : m->layers[l].kind == BLK_FFN;
        n += attn ? 4 * D * A : 0;
        n += ffn ? 2 * D * I : 0;
    }
    return n * w + B * (D * 4 + (double)gpu_mem_bytes(g));
}

/* 64 sessions' decode with a setting SET at 0, ON, 0, alternated in this
 * process (left at ON): "  decode 64, OFF_WHAT (ENV=0): a / b tok/s;
 * ON_WHAT again between them: c" */
static void bench_toggle_from(gpu_model *g, gpu_timer *t, gpu_mem **mems, rm_rng *rng, void (*set)(gpu_model *, int),
                              int off_v, int on, const char *off_what, const char *env, const char *on_what)
{
    double off[2], at = 0;
    for (int k = 0; k < 2; k++) {
        set(g, off_v);
        off[k] = rate(g, t, mems, SESSIONS, 1, 50, 10, NULL, NULL, rng, NULL);
        set(g, on);
        if (k == 0) at = rate(g, t, mems, SESSIONS, 1, 50, 10, NULL, NULL, rng, NULL);
    }
    printf("  decode 64, %s (%s=%d): %.0f / %.0f tok/s; %s again between them: %.0f\n", off_what, env, off_v, off[0],
           off[1], on_what, at);
}

/* 64 sessions with SET(DEF) (the default) and SET(ALT), alternated twice in one process, the default left set */
static void bench_ab(gpu_model *g, gpu_timer *t, gpu_mem **mems, rm_rng *rng, void (*set)(gpu_model *, int), int def,
                     int alt, const char *env, const char *def_what, const char *alt_what)
{
    double r[2][2];
    for (int k = 0; k < 2; k++)
        for (int a = 0; a < 2; a++) {
            set(g, a ? alt : def);
            r[a][k] = rate(g, t, mems, SESSIONS, 1, 50, 10, NULL, NULL, rng, NULL);
        }
    set(g, def);
    printf("  decode 64, %s (%s=%d): %.0f / %.0f tok/s against %s (%d, the default): %.0f / %.0f\n", alt_what, env, alt,
           r[1][0], r[1][1], def_what, def, r[0][0], r[0][1]);
}

/* A step of B sessions replayed on the device (gpu_decode_replay: no host between the steps) against the
 * step with the host's part, after a rate() of B sessions */
static void bench_replay(gpu_model *g, gpu_timer *t, gpu_mem **mems, rm_rng *rng, int B, const char *what)
{
    char err[ERR_LEN];
    const int K = B > 8 ? 50 : 200;
    double with[2], dev[2];
    for (int k = 0; k < 2; k++) {
        with[k] = 1e6 * B / rate(g, t, mems, B, 1, K, 10, NULL, NULL, rng, NULL);
        gpu_timer_start(t);
        if (gpu_decode_replay(g, B, K, err)) { printf("FAIL replay: %s\n", err); return; }
        dev[k] = 1e3 * gpu_timer_stop_ms(t) / K;
    }
    printf("  decode %d (%s), the step replayed on the device: %.1f / %.1f us a step against %.1f / %.1f us with the "
           "host's part (its inputs' copy, launch and wait): %.1f us a step\n", B, what, dev[0], dev[1], with[0], with[1],
           (with[0] + with[1] - dev[0] - dev[1]) / 2);
}

/* What the decode kernel's phases read as they land (gpu_decode_ll: the
 * steps' bits are the same), alternated twice in this process; tok/s at 1
 * session, 1 session sampled on the device (SP), 2 and 8 sessions; the
 * default left set */
static void bench_ways(gpu_model *g, gpu_timer *t, gpu_mem **mems, rm_rng *rng, const sample_params *sp)
{
    enum { NW = 4 };
    static const int way[NW] = {0, GPU_LL_QKV | GPU_LL_WO, GPU_LL_QKV, GPU_LL_WO};
    static const char *const names[NW] = {"LL 0 (QKV's barrier, Wo's flags)", "LL 3", "LL 1 (QKV's words)",
                                          "LL 2 (the heads' words)"};
    const int def_ll = gpu_decode_ll_mode(g);
    double r[NW][4][2];   /* way, what, run */
    for (int k = 0; k < 2; k++)
        for (int w = 0; w < NW; w++) {
            gpu_decode_ll(g, way[w]);
            r[w][0][k] = rate(g, t, mems, 1, 1, 200, 20, NULL, NULL, rng, NULL);
            r[w][1][k] = rate(g, t, mems, 1, 1, 200, 20, NULL, sp, rng, NULL);
            r[w][2][k] = rate(g, t, mems, 2, 1, 100, 10, NULL, NULL, rng, NULL);
            r[w][3][k] = rate(g, t, mems, 8, 1, 100, 10, NULL, NULL, rng, NULL);
        }
    gpu_decode_ll(g, def_ll);
    printf("  decode kernel's LL (SPANSERVE_GPU_DECODE_LL; the default %d), tok/s, 1 session / sampled / 2 / 8 sessions, "
           "alternated twice:", def_ll);
    for (int w = 0; w < NW; w++)
        printf("%s %s: %.0f / %.0f, %.0f / %.0f, %.0f / %.0f, %.0f / %.0f", w ? ";" : "", names[w], r[w][0][0], r[w][0][1],
               r[w][1][0], r[w][1][1], r[w][2][0], r[w][2][1], r[w][3][0], r[w][3][1]);
    printf("\n");
}

static void bench_toggle(gpu_model *g, gpu_timer *t, gpu_mem **mems, rm_rng *rng, void (*set)(gpu_model *, int),
                         int on, const char *off_what, const char *env, const char *on_what)
{
    bench_toggle_from(g, t, mems, rng, set, 0, on, off_what, env, on_what);
}

/* SPANSERVE_BENCH_TWICE=1 with SPANSERVE_BENCH_DECODE_ONLY=64: what each
 * kind of operation costs inside a step of 64 sessions on the graphs, as
 * the step's time with those operations launched twice (gpu_decode_twice)
 * less the plain step's, each alternated with a plain step in one process */
static void bench_twice(gpu_model *g, gpu_timer *t, gpu_mem **mems, rm_rng *rng, int layers)
{
    static const struct { unsigned ops; const char *what; } k[] = {
        {GPU_TWICE_QKV, "QKV"}, {GPU_TWICE_ATTN, "the attention (with its combine)"}, {GPU_TWICE_WO, "Wo"},
        {GPU_TWICE_FC1, "fc1"}, {GPU_TWICE_FC2, "fc2"}, {GPU_TWICE_COMBINE, "splits' meeting (adaptive-span)"}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        double us[2][2];
        for (int r = 0; r < 2; r++)
            for (int tw = 0; tw < 2; tw++) {
                gpu_decode_twice(g, tw ? k[i].ops : 0, -1);
                us[tw][r] = 64e6 / rate(g, t, mems, SESSIONS, 1, 50, 10, NULL, NULL, rng, NULL);
            }
        printf("  decode 64, every %s twice: a step %.1f / %.1f us against %.1f / %.1f: %.1f us a step (%.2f a layer of %d)\n",
               k[i].what, us[1][0], us[1][1], us[0][0], us[0][1], (us[1][0] + us[1][1] - us[0][0] - us[0][1]) / 2,
               (us[1][0] + us[1][1] - us[0][0] - us[0][1]) / 2 / layers, layers);
    }
    /* the attention (and its meeting) layer by layer */
    printf("  decode 64, each layer's attention (with its meeting) twice, us a step more:");
    for (int l = 0; l < layers; l++) {
        double us[2][2];
        for (int r = 0; r < 2; r++)
            for (int tw = 0; tw < 2; tw++) {
                gpu_decode_twice(g, tw ? GPU_TWICE_ATTN : 0, l);
                us[tw][r] = 64e6 / rate(g, t, mems, SESSIONS, 1, 50, 10, NULL, NULL, rng, NULL);
            }
        printf(" %d: %.1f;", l, (us[1][0] + us[1][1] - us[0][0] - us[0][1]) / 2);
    }
    printf("\n");
    gpu_decode_twice(g, 0, -1);
}

/* SPANSERVE_BENCH_DECODE_ONLY=64 (and =64only): 64 sessions' decode on the
 * graphs, alternated with the LayerNorms launched where it carries them and
 * with the attention's splits in each other order, and the profile of a
 * step launched one by one */
static void bench_decode64(gpu_model *g, gpu_timer *t, gpu_mem **mems, const char *name, const char *mode, int prec,
                           rm_rng *rng, row_t *row, int layers)
{
    row->dec64 = rate(g, t, mems, SESSIONS, 1, 50, 10, NULL, NULL, rng, NULL);
    const long carried = gpu_decode_ln_fuse_steps(g);
    printf("%-13s %-5s %s decode 64: %.0f tok/s (%.3f ms a step; LayerNorms carried in the products: %s)\n", name,
           mode, gpu_precision_name(prec), row->dec64, 64e3 / row->dec64, carried ? "yes" : "no");
    if (carried)
        bench_toggle(g, t, mems, rng, gpu_decode_ln_fuse, 1, "the LayerNorms launched", "SPANSERVE_GPU_LN_FUSE",
                     "carried");
    bench_toggle(g, t, mems, rng, gpu_decode_split_order, 2, "the splits stream by stream", "SPANSERVE_GPU_SPLIT_ORDER",
                 "every stream's copy of a split together, in head order (2)");
    bench_toggle(g, t, mems, rng, gpu_decode_split_order, 1, "the splits stream by stream", "SPANSERVE_GPU_SPLIT_ORDER",
                 "longest first (1)");
    bench_toggle_from(g, t, mems, rng, gpu_decode_splitk, 1, 2, "fc2's cluster meeting at two cluster barriers",
                      "SPANSERVE_GPU_SPLITK", "the second block's sums pushed to the first (2)");
    bench_toggle(g, t, mems, rng, gpu_decode_splitk, 2, "a block a product's tile", "SPANSERVE_GPU_SPLITK",
                 "the cluster, pushed (2)");
    bench_toggle(g, t, mems, rng, gpu_decode_combine, 1, "the splits met by a block's loops", "SPANSERVE_GPU_COMBINE",
                 "a warp a head (1)");
    bench_ab(g, t, mems, rng, gpu_decode_msplit, 1, 0, "SPANSERVE_GPU_MSPLIT", "Wo's rows split over two blocks a tile",
             "a block a tile");
    bench_ab(g, t, mems, rng, gpu_decode_out_fold, 1, 0, "SPANSERVE_GPU_OUT_FOLD",
             "the last LayerNorm carried into the output layer", "the last LayerNorm launched");
    bench_replay(g, t, mems, rng, SESSIONS, "the graphs");
    const char *fl = getenv("SPANSERVE_BENCH_FILL");   /* the attention's blocks against the SMs (gpu_decode_attn_fill) */
    if (fl && strcmp(fl, "1") == 0)
        for (int i = 0; i < 5; i++)
            bench_toggle_from(g, t, mems, rng, gpu_decode_attn_fill, (const int[]){2, 4, 6, 9, 12}[i], 3,
                              "adaptive-span's attention's blocks against the SMs", "fill", "3 (the default)");
    const char *tw = getenv("SPANSERVE_BENCH_TWICE");
    if (tw && strcmp(tw, "1") == 0) bench_twice(g, t, mems, rng, layers);
    profile(g, mems, SESSIONS, 1, 5, "decode 64", NULL, NULL);
    fflush(stdout);
}

/* bench_model's model, timer, sessions and logprobs freed: 0 */
static int bench_release(gpu_model *g, gpu_timer *t, gpu_mem **mems, float *lp)
{
    free(lp);
    for (int s = 0; s < SESSIONS; s++) gpu_mem_free(mems[s]);
    gpu_timer_free(t);
    gpu_model_free(g);
    return 0;
}

static int bench_model(const model_t *m, const char *name, const char *mode, int prec, int long_block, double peak,
                       row_t *row)
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
    const char *dec_only = getenv("SPANSERVE_BENCH_DECODE_ONLY");
    if (dec_only && strcmp(dec_only, "64only") == 0) {   /* the 64 sessions first and alone (a profiler's launches) */
        gpu_decode_kernel(g, GPU_DECODE_GRAPHS);
        bench_decode64(g, t, mems, name, mode, prec, &rng, row, m->n_layers);
        return bench_release(g, t, mems, lp);
    }
    gpu_decode_kernel(g, GPU_DECODE_GRAPHS);   /* the graphs, then decode_step.cu's one kernel */
    row->dec1 = rate(g, t, mems, 1, 1, 200, 20, NULL, NULL, &rng, &row->ms1);
    row->dec1_lp = rate(g, t, mems, 1, 1, 200, 20, lp, NULL, &rng, NULL);
    const char *mk_why = "";
    const int mk = gpu_decode_kernel_status(g, NULL, &mk_why);
    row->dec8_graph = mk ? rate(g, t, mems, 8, 1, 100, 10, NULL, NULL, &rng, NULL) : 0;
    row->dec4_graph = mk ? rate(g, t, mems, 4, 1, 100, 10, NULL, NULL, &rng, NULL) : 0;
    gpu_graphs(g, 0);
    row->dec1_ng = rate(g, t, mems, 1, 1, 200, 20, NULL, NULL, &rng, NULL);
    gpu_graphs(g, 1);
    const sample_params top_p = {1.0, 0, 0.9};
    double ms_mk = 0;
    row->dec1_graph = row->dec1;
    gpu_decode_kernel(g, GPU_DECODE_AUTO);
    row->mk_auto = gpu_decode_kernel_limit(g);
    gpu_decode_kernel(g, GPU_DECODE_KERNEL);
    row->dec1_mk = mk ? rate(g, t, mems, 1, 1, 200, 20, NULL, NULL, &rng, &ms_mk) : 0;
    row->dec1_pick = mk ? rate(g, t, mems, 1, 1, 200, 20, NULL, &top_p, &rng, NULL) : 0;
    row->dec8 = mk ? rate(g, t, mems, 8, 1, 100, 10, NULL, NULL, &rng, NULL) : 0;
    if (mk) bench_replay(g, t, mems, &rng, 1, "one kernel a step");
    if (mk) bench_ways(g, t, mems, &rng, &top_p);
    row->dec4 = mk ? rate(g, t, mems, 4, 1, 100, 10, NULL, NULL, &rng, NULL) : 0;
    const double dec2 = mk ? rate(g, t, mems, 2, 1, 100, 10, NULL, NULL, &rng, NULL) : 0;
    const char *ffn_why = "";
    const int ffn = gpu_decode_ffn_status(g, NULL, &ffn_why);
    char ffn_max[32];
    snprintf(ffn_max, sizeof ffn_max, "%d sessions)", gpu_decode_ffn_max(g));
    const double tbs = peak_tbs(gpu_model_device_name(g));
    row->floor1 = tbs > 0 ? decode_floor_bytes(m, g, prec, 1) / (tbs * 1e12) * 1e3 : 0;
    row->floor8 = tbs > 0 ? decode_floor_bytes(m, g, prec, 8) / (tbs * 1e12) * 1e3 : 0;
    if (mk)
        printf("%-13s %-5s %s decode, one kernel a step: 1 session %.0f tok/s (%.1f us a step; floor %.1f us at %.2f TB/s: "
               "%.0f%% of it), sampled on the device %.0f tok/s; 8 sessions %.0f tok/s (%.1f us a step; floor %.1f us: "
               "%.0f%%); 4 sessions %.0f tok/s; 2 sessions %.0f tok/s; graphs instead: 1 session %.0f tok/s, 4 sessions "
               "%.0f tok/s, 8 sessions %.0f tok/s; the default (auto) takes the kernel for steps of up to %d sessions; %s%s; "
               "%s\n",
               name, mode, gpu_precision_name(prec), row->dec1_mk, 1e3 * ms_mk, 1e3 * row->floor1, tbs,
               row->floor1 > 0 ? 100 * row->floor1 / ms_mk : 0, row->dec1_pick, row->dec8, 8e6 / row->dec8,
               1e3 * row->floor8, row->floor8 > 0 ? 100 * row->floor8 * row->dec8 / 8e3 : 0, row->dec4, dec2,
               row->dec1_graph, row->dec4_graph, row->dec8_graph, row->mk_auto,
               ffn ? "a feed-forward a phase (SPANSERVE_GPU_DECODE_FFN: steps of up to " : "each feed-forward in two phases: ",
               ffn ? ffn_max : ffn_why,
               gpu_decode_wo_status(g, NULL, NULL) && gpu_decode_wo_on(g) ? "Wo in the attention's phase for steps of up to 2"
                                                                          : "Wo a phase of its own");
    else
        printf("%-13s %-5s %s decode: no decode kernel (%s)\n", name, mode, gpu_precision_name(prec), mk_why);
    for (int B = 1; mk && B <= 8; B += 7) {   /* where a step's time goes: one traced step of 1 and of 8 sessions */
        char rep[4096];
        if (gpu_decode_trace(g, 1, err) || step(g, mems, B, (const int32_t[8]){1, 2, 3, 4, 5, 6, 7, 8}, 1, NULL, NULL,
                                                 &rng, err) ||
            gpu_decode_trace_report(g, rep, sizeof rep, err) || gpu_decode_trace(g, 0, err))
            printf("FAIL decode trace: %s\n", err);
        else
            printf("  decode %d, one traced step: %s\n", B, rep);
    }
    gpu_decode_kernel(g, GPU_DECODE_GRAPHS);
    if (dec_only) {
        if (strcmp(dec_only, "64") == 0) bench_decode64(g, t, mems, name, mode, prec, &rng, row, m->n_layers);
        return bench_release(g, t, mems, lp);
    }
    row->dec64 = rate(g, t, mems, SESSIONS, 1, 50, 10, NULL, NULL, &rng, NULL);
    row->sc1 = rate(g, t, mems, 1, BLOCK, 10, 2, NULL, NULL, &rng, NULL);
    row->sc16 = rate(g, t, mems, 16, BLOCK, 4, 1, NULL, NULL, &rng, NULL);
    row->sc16_cc = 0;
    if (prec == GPU_BF16) {   /* (fp32 keeps its exact kernels either way) */
        gpu_tensor_cores(g, 0);
        row->sc16_cc = rate(g, t, mems, 16, BLOCK, 4, 1, NULL, NULL, &rng, NULL);
        gpu_tensor_cores(g, 1);
    }
    gpu_tiles(g, 0);
    row->sc16_nt = rate(g, t, mems, 16, BLOCK, 4, 1, NULL, NULL, &rng, NULL);
    row->dec64_nt = rate(g, t, mems, SESSIONS, 1, 50, 10, NULL, NULL, &rng, NULL);
    gpu_tiles(g, 1);
    row->bytes = gpu_mem_bytes(g);
    row->ref_bytes = mem_bytes_reference(m);
    row->full_bytes = mem_bytes_full(m);
    row->flops = flops_per_token(m, BLOCK);
    row->flops_long = flops_per_token(m, LONG_BLOCK);
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
    char a[128], b[128];
    printf("  model FLOPs a scored token %.1f M (blocks of %d); scoring 1x%d: %s; 16x%d: %s", row->flops / 1e6, BLOCK,
           BLOCK, mfu_text(a, sizeof a, row->sc1, row->flops, peak, 1), BLOCK,
           mfu_text(b, sizeof b, row->sc16, row->flops, peak, 1));
    if (row->sc16_cc > 0) printf("; 16x%d with the tiles on CUDA cores: %.0f tok/s", BLOCK, row->sc16_cc);
    printf("\n");
    /* (the profile launches one by one: its events sit between the launches) */
    profile(g, mems, 1, 1, 20, "decode 1", NULL, NULL);
    profile(g, mems, SESSIONS, 1, 5, "decode 64", NULL, NULL);
    profile(g, mems, 16, BLOCK, 2, "scoring 16x512", NULL, NULL);
    fflush(stdout);
    free(lp);
    for (int s = 0; s < SESSIONS; s++) gpu_mem_free(mems[s]);
    gpu_timer_free(t);
    gpu_model_free(g);
    row->sc_long = 0;
    if (long_block) {   /* after the 64 x 512 model is freed */
        size_t sb = 0;
        row->sc_long = rate_long(m, prec, &rng, &sb);
        printf("  score 1x%d: %.0f tok/s, %s (a model of 1 x %d tokens: step buffers %.1f MB)\n", LONG_BLOCK,
               row->sc_long, mfu_text(a, sizeof a, row->sc_long, row->flops_long, peak, 1), LONG_BLOCK, sb / 1e6);
        fflush(stdout);
    }
    return 0;
}

static int bench_main(int argc, char **argv)
{
    char err[ERR_LEN], card[256];
    const int only_txl = argc > 1 && strcmp(argv[1], "txl") == 0;   /* bench_gpu txl: the word-level model alone */
    if (gpu_available(err)) {
        printf("SKIP bench_gpu: no GPU (%s)\n", err);
        return 0;
    }
    gpu_device_name(card, sizeof card, err);
    const double peak = peak_tflops(card);
    const char *ped = getenv("SPANSERVE_GPU_PEDANTIC");
    const char *math = ped && strcmp(ped, "1") == 0 ? "cuBLAS pedantic math" : "cuBLAS default math, no TF32";
    printf("bench_gpu on %s (float32: %s; bf16: cuBLAS bf16 x bf16 -> fp32)\n", card, math);
    row_t rows[6];
    int nrows = 0;
    char txl_rows[2][512] = {"", ""};
    /* SPANSERVE_BENCH_DECODE_ONLY=1: the bf16 decode figures of aspan-enwik8 and par-base alone (=64: with 64
     * sessions on the graphs too; =64only: the 64 sessions' figures alone, first after each session's first block,
     * so that a profiler's --launch-skip counts their steps); SPANSERVE_BENCH_MEMORY=span or exact: aspan-enwik8 in
     * that memory mode alone */
    const int dec_only = getenv("SPANSERVE_BENCH_DECODE_ONLY") != NULL;
    if (!dec_only) {
        const char *pt = "/tmp/spanserve-bench-txl-wt103.safetensors";
        rm_txl w = {267735, 512, 8, 64, 2048, 16, 512, 1, 3, {20000, 40000, 200000}, 1, 0, 0, 0, 64, 640, -1, 1, 1};
        if (rm_write_txl(pt, &w, 3, err)) { printf("FAIL: %s\n", err); return 1; }
        model_t *mt = model_load(pt, err);
        unlink(pt);
        if (!mt) { printf("FAIL: %s\n", err); return 1; }
        if (argc > 1 && strcmp(argv[1], "txl-ncu") == 0) {
            const int rc = bench_txl_ncu(mt);
            model_free(mt);
            return rc;
        }
        for (int prec = GPU_FP32; prec <= GPU_BF16; prec++) bench_txl(mt, prec, txl_rows[prec == GPU_BF16], sizeof txl_rows[0]);
        model_free(mt);
        printf("\ncard: %s; tokens/s (median of %d runs)\n", card, RUNS);
        printf("| model | precision | score 1x64 | score 32x64 | decode 1 (sampled on device) | decode 1 (rows to host) | "
               "decode 64 (sampled on device) | decode 64 (rows to host) | bytes/session | reference bytes | score 1x64 (Zipf targets) | score 32x64 (Zipf targets) |\n"
               "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        printf("%s\n%s\n\n", txl_rows[0], txl_rows[1]);
        if (only_txl) return txl_rows[0][0] && txl_rows[1][0] ? 0 : 1;
    }

    if (!shared_path("bench/span-profile.json")) {
        printf("SKIP bench_gpu: no %s/bench/span-profile.json (the reference's spans; set SPANSERVE_SHARED)\n", shared_dir());
        return 0;
    }
    const char *pa = "/tmp/spanserve-bench-aspan-enwik8.safetensors", *pp = "/tmp/spanserve-bench-par-base.safetensors";
    if (write_aspan_enwik8(pa, err)) { printf("FAIL: %s\n", err); return 1; }
    const char *only_mem = getenv("SPANSERVE_BENCH_MEMORY");   /* exact or span: aspan-enwik8 in that mode alone */
    if (only_mem && strcmp(only_mem, "span") != 0 && strcmp(only_mem, "exact") != 0) {
        printf("FAIL: SPANSERVE_BENCH_MEMORY=%s: span or exact\n", only_mem);
        unlink(pa);
        return 1;
    }
    int want = 3;
    for (int mode = 0; mode < 2; mode++) {
        if (only_mem && strcmp(only_mem, mode ? "span" : "exact") != 0) {
            want--;
            continue;
        }
        model_t *m = model_load_mode(pa, mode ? MEM_SPAN : MEM_EXACT, err);
        if (!m) { printf("FAIL: %s\n", err); return 1; }
        for (int prec = dec_only ? GPU_BF16 : GPU_FP32; prec <= GPU_BF16; prec++)
            if (bench_model(m, "aspan-enwik8", mode ? "span" : "exact", prec, 1, peak, &rows[nrows]) == 0) nrows++;
        model_free(m);
    }
    unlink(pa);

    if (write_par_base(pp, err)) { printf("FAIL: %s\n", err); return 1; }
    model_t *m = model_load(pp, err);
    if (!m) { printf("FAIL: %s\n", err); return 1; }
    for (int prec = dec_only ? GPU_BF16 : GPU_FP32; prec <= GPU_BF16; prec++)
        if (bench_model(m, "par-base", "-", prec, 0, peak, &rows[nrows]) == 0) nrows++;
    model_free(m);
    unlink(pp);
    if (dec_only) return nrows == want ? 0 : 1;

    printf("\ncard: %s; float32: %s; tokens/s (median of %d runs, CUDA events, after warm-up); TFLOP/s (MFU) of the "
           "model FLOPs of bench_gpu.c's header, MFU of ", card, math, RUNS);
    const char *pe = getenv("SPANSERVE_PEAK_TFLOPS");
    if (peak > 0) printf("the dense bf16 peak, %.0f TFLOP/s%s\n", peak, pe && atof(pe) > 0 ? " (SPANSERVE_PEAK_TFLOPS)" : "");
    else printf("a peak unknown for this card (set SPANSERVE_PEAK_TFLOPS)\n");
    printf("| model | memory | precision | decode 1 | decode 1 (no graph) | decode 1 (+logprobs to host) | decode 64 | "
           "score 1x512 | score 16x512 | score 16x512 (untiled) | decode 64 (per-query kernel) | bytes/session | "
           "reference bytes | full-span bytes | score 16x512 (tiles on CUDA cores) | score 1x4096 | MFLOP/token | "
           "TFLOP/s (MFU) 1x512 | TFLOP/s (MFU) 16x512 | TFLOP/s (MFU) 1x4096 |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
           "| --- |\n");
    for (int i = 0; i < nrows; i++) {
        row_t *r = &rows[i];
        char cc[32] = "-", lb[32] = "-", m1[64], m16[64], ml[64];
        if (r->sc16_cc > 0) snprintf(cc, sizeof cc, "%.0f", r->sc16_cc);
        if (r->sc_long > 0) snprintf(lb, sizeof lb, "%.0f", r->sc_long);
        printf("| %s | %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %zu | %zu | %zu | %s | %s | %.1f | %s "
               "| %s | %s |\n",
               r->name, r->mode, gpu_precision_name(r->prec), r->dec1, r->dec1_ng, r->dec1_lp, r->dec64, r->sc1, r->sc16,
               r->sc16_nt, r->dec64_nt, r->bytes, r->ref_bytes, r->full_bytes, cc, lb, r->flops / 1e6,
               mfu_text(m1, sizeof m1, r->sc1, r->flops, peak, 0), mfu_text(m16, sizeof m16, r->sc16, r->flops, peak, 0),
               mfu_text(ml, sizeof ml, r->sc_long, r->flops_long, peak, 0));
    }
    return nrows == 6 ? 0 : 1;
}
#endif

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "write-models") == 0) {
        if (argc != 3) { printf("usage: bench_gpu write-models DIR\n"); return 2; }
        return write_models(argv[2]);
    }
#ifdef SPANSERVE_CUDA
    return bench_main(argc, argv);
#else
    printf("SKIP bench_gpu: no GPU (built without nvcc)\n");
    return 0;
#endif
}
