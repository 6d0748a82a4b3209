/*
 * bench_train.c - `make bench`'s training figure (issue 5): tokens/s of the
 * CUDA trainer (kernels/train_gpu.h) on the reference aspan-small training
 * configuration: 8 layers, hidden 256, 4 heads, inner 1024, span 1024,
 * block 256, batch 64, vocabulary 65 (tiny_shakespeare's), random weights
 * and tokens (drawn before the clock starts; each step copies its batch as
 * the loop copies it from the text). A step is the whole of a training step
 * as `spanserve train` runs it (tgpu_train_step): the tokens' upload,
 * forward, loss, backward, Adagrad, z/S back to the host. The attention's
 * cost follows the spans, so it is measured at two: z/S = 0 (the recipe's start: windows of 64) and z/S = 1 (every head
 * at the full span: windows of 1024); in float32 (the default), with the
 * linear layers in TF32 and in bf16 (precision). Wall time of STEPS steps
 * after WARM, median of RUNS.
 * Where the machine has two GPUs or more, the same global batches on 1 and
 * on 2 GPUs (`gpus`, train_multi.cu), tf32 and bf16 (PAR: tf32), and the
 * ratio; then 2 GPUs with twice the batch (each GPU keeps one GPU's), and
 * where each step's wall time went (the host's copy of its batch, the
 * step's call).
 * `bench_train --profile [fp32|tf32|bf16]`: one step at z/S = 0 in that
 * precision (float32 by default) only, for a profiler (ncu) to time each
 * kernel; `--profile-par [fp32|tf32|bf16]`: one step of PAR's
 * fixed architecture in float32 only. `bench_train --batch N`: aspan-small
 * alone with N streams (N = 32: what each of two GPUs does with the batch
 * of 64; with --profile, that step); `bench_train --scaling
 * [tf32|bf16|par]`: the 2 GPUs' figures alone (of the one configuration
 * named).
 *
 * Then PAR Transformer-XL of par-base's shape (../shared/bench: 24 blocks,
 * d_model 512, 8 heads of 64, d_inner 2048, mem_len 512, vocabulary 256)
 * with segments of 512 and 16 streams (8,192 tokens a step), Adam with the
 * global clip: the fixed architecture `afff` x 4 + `f` x 8, and the search
 * supernet (every block computes both branches and alpha's gradient), in
 * float32, tf32 and bf16. tests/bench_par_torch.py measures the same model
 * written in PyTorch (eager, float32) the same way.
 */
#define _POSIX_C_SOURCE 200809L
#include "err.h"
#include "harness.h"
#include "train.h"

#ifndef SPANSERVE_CUDA
int main(void)
{
    printf("SKIP bench_train: no GPU (built without nvcc)\n");
    return 0;
}
#else

#include "../kernels/train_gpu.h"

#include <cuda_runtime_api.h>

#include <time.h>

static int WARM = 3, STEPS = 10, RUNS = 3;
/* where the timed steps' wall time went, for the scaling's report: the
 * host's batch (a copy, as the loop's from the text), the step's call */
static double PHASE[2];
static long PHASE_N;
static int PROFILE_PREC;   /* --profile's precision: 0 fp32, 1 tf32, 2 bf16 */
static const char *const PREC_NAME[] = {"fp32", "tf32", "bf16"};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One training step of batch X, Y, as train_run_on takes it: 0, or -1
 * with ERR set. */
typedef int (*bench_step)(void *ctx, trainer *t, const int32_t *x, const int32_t *y, char *err);

static int step_tgpu(void *ctx, trainer *t, const int32_t *x, const int32_t *y, char *err)
{
    double aux;
    return isfinite(tgpu_train_step((tgpu *)ctx, t, x, y, train_lr(&t->c, t->step + 1), &aux, err)) ? 0 : -1;
}

/* through the trainer's device table (one GPU or the config's gpus) */
static int step_dev(void *ctx, trainer *t, const int32_t *x, const int32_t *y, char *err)
{
    double aux;
    return isfinite(tgpu_train_device.train_step(ctx, t, x, y, train_lr(&t->c, t->step + 1), &aux, err)) ? 0 : -1;
}

/* tokens/s of STEP on random batches (PAR's search draws tau and the
 * Gumbel noise each step), or -1. The batches are drawn before the clock
 * starts, and each step copies its own into X, Y, as the loop copies its
 * from the text. */
#define POOL 4
static double bench(trainer *t, bench_step step, void *ctx, int32_t *x, int32_t *y, train_rng *r, char *err)
{
    const int search = t->c.fam->search && t->searching;
    const size_t N = (size_t)t->B * t->M;
    int32_t *pool = malloc(sizeof *pool * 2 * POOL * N);
    if (!pool) { err_set(err, "out of memory"); return -1; }
    for (size_t i = 0; i < 2 * POOL * N; i++) pool[i] = (int32_t)(train_rng_next(r) % (uint64_t)t->V);
    double runs[3];
    PHASE[0] = PHASE[1] = 0, PHASE_N = 0;
    for (int k = 0; k < RUNS; k++) {
        double t0 = 0;
        for (int s = 0; s < WARM + STEPS; s++) {
            if (s == WARM) t0 = now_s();
            const double a = now_s();
            const int32_t *b = pool + (size_t)2 * N * ((k * (WARM + STEPS) + s) % POOL);
            memcpy(x, b, sizeof *x * N);
            memcpy(y, b + N, sizeof *y * N);
            if (search) t->c.fam->step_begin(t, t->step + 1, r);
            const double m = now_s();
            if (step(ctx, t, x, y, err)) { free(pool); return -1; }
            if (s >= WARM) PHASE[0] += m - a, PHASE[1] += now_s() - m, PHASE_N++;
        }
        runs[k] = (double)STEPS * N / (now_s() - t0);
    }
    free(pool);
    qsort(runs, RUNS, sizeof *runs, cmp_double);
    return runs[RUNS / 2];
}

/* Data parallel on the machine's GPUs (train_multi.cu), tf32 and bf16:
 * aspan-small at z/S = 0, and PAR of par-base's shape, fixed architecture.
 * The same global batch on 1 and on 2 GPUs (what `--gpus 2` does to a
 * config), one GPU with half of it (what each of the two then does), and 2
 * GPUs with the batch doubled (each GPU keeps the one-GPU batch). ONLY: -1
 * every configuration, else that one (0 aspan tf32, 1 aspan bf16, 2 PAR). */
static int bench_scaling(int only, char *err)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("SKIP bench_train scaling: this machine has %d CUDA device%s\n", n, n == 1 ? "" : "s");
        return 0;
    }
    /* aspan-small in tf32 and bf16, PAR in tf32 */
    for (int run = 0; run < 3; run++) {
        if (only >= 0 && run != only) continue;
        const int fam = run == 2, bf16 = run == 1;
        train_cfg c;
        int V;
        if (fam == 0) {
            train_cfg_defaults(&c, &train_family_aspan);
            c.nb_layers = 8, c.hidden_size = 256, c.nb_heads = 4, c.inner_hidden_size = 1024, c.attn_span = 1024;
            c.block_size = 256, c.batch_size = 64, c.adapt_span_ramp = 32, c.grad_clip = 0.03, c.lr = 0.07;
            c.lr_warmup = 1;
            V = 65;
        } else {
            train_cfg_defaults(&c, &train_family_par);
            c.n_blocks = 24, c.n_head = 8, c.d_model = 512, c.d_head = 64, c.d_inner = 2048, c.mem_len = 512;
            c.tgt_len = 512, c.batch_size = 16, c.lr = 2.5e-4, c.search_steps = 0;
            V = 256;
        }
        c.tf32 = !bf16;
        c.bf16 = bf16;
        /* one GPU with the whole batch, one with half of it, two with the
         * whole, two with twice it */
        double tps[4] = {0, 0, 0, 0}, ph[4][2];
        char name[320] = "";
        const int B = c.batch_size;
        static const char *const what[4] = {"one GPU", "one GPU, half the batch", "2 GPUs", "2 GPUs, twice the batch"};
        for (int k = 0; k < 4; k++) {
            c.gpus = k >= 2 ? 2 : 1;
            c.batch_size = k == 1 ? B / 2 : k == 3 ? 2 * B : B;
            trainer *t = trainer_new(&c, V, err);
            if (!t) { printf("FAIL bench_train: %s\n", err); return 1; }
            trainer_init(t, 1);
            for (int l = 0; fam == 1 && l < t->L; l++) t->arch[l] = l < 16 && l % 4 == 0 ? BLK_ATTN : BLK_FFN;
            const int N = t->B * t->M;
            int32_t *x = malloc(sizeof *x * N), *y = malloc(sizeof *y * N);
            train_rng r = {5};
            void *ctx = tgpu_train_device.open(t, err);
            if (!ctx) { printf("FAIL bench_train: %s\n", err); return 1; }
            snprintf(name, sizeof name, "%s", tgpu_train_device.device_name(ctx));
            tps[k] = bench(t, step_dev, ctx, x, y, &r, err);
            for (int p = 0; p < 2; p++) ph[k][p] = PHASE_N ? 1e3 * PHASE[p] / PHASE_N : 0;
            tgpu_train_device.close(ctx);
            free(x);
            free(y);
            trainer_free(t);
            if (tps[k] < 0) { printf("FAIL bench_train: %s\n", err); return 1; }
        }
        const char *model = fam ? "PAR afff x4 + f x8 (par-base's shape)" : "aspan-small z/S 0";
        const int M = fam ? c.tgt_len : c.block_size;
        printf("bench_train: %s, %s, %s, the same batch of %d x %d: one GPU %.0f tokens/s, 2 GPUs %.0f: %.2fx "
               "(one GPU with half the batch, what each of the two does: %.0f; 2 GPUs reach %.0f%% of twice that)\n",
               name, model, bf16 ? "bf16" : "tf32", B, M, tps[0], tps[2], tps[2] / tps[0], tps[1],
               100 * tps[2] / (2 * tps[1]));
        printf("bench_train: %s, %s, %s, each GPU keeps the batch of %d x %d (2 GPUs: %d streams): one GPU %.0f "
               "tokens/s, 2 GPUs %.0f: %.2fx\n",
               name, model, bf16 ? "bf16" : "tf32", B, M, 2 * B, tps[0], tps[3], tps[3] / tps[0]);
        for (int k = 0; k < 4; k++)
            printf("bench_train:   %s: a step %.2f ms: the host's batch %.2f, the step's call %.2f\n", what[k],
                   ph[k][0] + ph[k][1], ph[k][0], ph[k][1]);
    }
    return 0;
}

/* par-base's shape; ARCH "afff" x 4 + "f" x 8, or the search */
static int bench_par(char *err, int profile)
{
    train_cfg c;
    train_cfg_defaults(&c, &train_family_par);
    c.n_blocks = 24, c.n_head = 8, c.d_model = 512, c.d_head = 64, c.d_inner = 2048, c.mem_len = 512;
    c.tgt_len = 512, c.batch_size = 16, c.lr = 2.5e-4, c.search_steps = 1000;
    const int V = 256, N = c.batch_size * c.tgt_len;
    trainer *t = trainer_new(&c, V, err);
    if (!t) { printf("FAIL bench_train: %s\n", err); return 1; }
    int32_t *x = malloc(sizeof *x * N), *y = malloc(sizeof *y * N);
    train_rng r = {7};
    printf("bench_train: PAR training step of par-base's shape (24 blocks, D 512, 8 heads of 64, inner 2048, "
           "mem_len 512, tgt_len 512, B 16, V %d; Adam)\n", V);
    for (int search = 0; search < (profile ? 1 : 2); search++)
        for (int prec = profile ? PROFILE_PREC : 0; prec < (profile ? PROFILE_PREC + 1 : 3); prec++) {
            trainer_init(t, 1);
            t->step = 0;
            t->searching = search;
            t->tau = c.tau_start;
            for (int l = 0; l < t->L; l++) t->arch[l] = l < 16 && l % 4 == 0 ? BLK_ATTN : BLK_FFN;
            trainer_reset_memory(t);
            tgpu *g = tgpu_new(t, err);
            if (!g || tgpu_set_tf32(g, prec == 1, err) || tgpu_set_bf16(g, prec == 2, err)) {
                printf("FAIL bench_train: %s\n", err);
                return 1;
            }
            double tps = bench(t, step_tgpu, g, x, y, &r, err);
            if (tps < 0) { printf("FAIL bench_train: %s\n", err); return 1; }
            printf("bench_train: %s, PAR %s, %s: %.0f tokens/s, %.1f ms a step, %.2f GB on the device\n",
                   tgpu_device_name(g), search ? "search (every block both branches)" : "afff x4 + f x8",
                   PREC_NAME[prec], tps, 1e3 * N / tps, tgpu_bytes(g) / 1e9);
            tgpu_free(g);
        }
    free(x);
    free(y);
    trainer_free(t);
    return 0;
}

int main(int argc, char **argv)
{
    char err[ERR_LEN];
    int profile = 0, profile_par = 0, scaling = 0, scaling_only = -1, batch = 64, batch_only = 0;
    for (int i = 1; i < argc; i++) {
        const int more = i + 1 < argc && argv[i + 1][0] != '-';
        if (!strcmp(argv[i], "--profile") || !strcmp(argv[i], "--profile-par")) {
            if (!strcmp(argv[i], "--profile"))
                profile = 1;
            else
                profile_par = 1;
            if (more) {
                i++;
                PROFILE_PREC = !strcmp(argv[i], "tf32") ? 1 : !strcmp(argv[i], "bf16") ? 2 : 0;
            }
        } else if (!strcmp(argv[i], "--batch") && more) {
            batch = atoi(argv[++i]), batch_only = 1;
            if (batch < 1 || batch > 1024) {
                printf("FAIL bench_train: --batch %s: a count of streams, 1 to 1024\n", argv[i]);
                return 1;
            }
        } else if (!strcmp(argv[i], "--scaling")) {
            scaling = 1;
            if (more) {
                i++;
                static const char *const which[3] = {"tf32", "bf16", "par"};
                for (int k = 0; k < 3; k++)
                    if (!strcmp(argv[i], which[k])) scaling_only = k;
                if (scaling_only < 0) {
                    printf("FAIL bench_train: --scaling %s: tf32, bf16 or par "
                           "(aspan-small in tf32 or bf16, PAR in tf32)\n",
                           argv[i]);
                    return 1;
                }
            }
        } else {
            printf("FAIL bench_train: %s: the options are --profile [fp32|tf32|bf16], --profile-par [...], "
                   "--batch N, --scaling [tf32|bf16|par]\n",
                   argv[i]);
            return 1;
        }
    }
    if (scaling) return bench_scaling(scaling_only, err) ? 1 : 0;
    if (profile || profile_par) WARM = 0, STEPS = 1, RUNS = 1;
    if (tgpu_available(err)) {
        printf("SKIP bench_train: %s\n", err);
        return 0;
    }
    if (profile_par) return bench_par(err, 1);
    train_cfg c;
    train_cfg_defaults(&c, &train_family_aspan);
    c.nb_layers = 8, c.hidden_size = 256, c.nb_heads = 4, c.inner_hidden_size = 1024, c.attn_span = 1024;
    c.block_size = 256, c.batch_size = batch, c.adapt_span_ramp = 32, c.grad_clip = 0.03, c.lr = 0.07;
    c.lr_warmup = 1;
    const int V = 65;
    trainer *t = trainer_new(&c, V, err);
    if (!t) { printf("FAIL bench_train: %s\n", err); return 1; }
    int32_t *x = malloc(sizeof *x * c.batch_size * c.block_size), *y = malloc(sizeof *y * c.batch_size * c.block_size);
    train_rng r = {99};
    printf("bench_train: aspan-small training step (L 8, H 256, heads 4, inner 1024, S 1024, M 256, B %d, V %d)\n",
           batch, V);
    for (int span = 0; span < (profile ? 1 : 2); span++)
        for (int prec = profile ? PROFILE_PREC : 0; prec < (profile ? PROFILE_PREC + 1 : 3); prec++) {
            trainer_init(t, 1);
            t->step = 0;
            for (int l = 0; l < t->L; l++)
                for (int h = 0; h < t->K; h++) t->w[t->ly[l].zfrac + h] = span;
            tgpu *g = tgpu_new(t, err);
            if (!g || tgpu_set_tf32(g, prec == 1, err) || tgpu_set_bf16(g, prec == 2, err)) {
                printf("FAIL bench_train: %s\n", err);
                return 1;
            }
            int W, C;
            aspan_window(t, 0, &W, &C);
            double tps = bench(t, step_tgpu, g, x, y, &r, err);
            if (tps < 0) { printf("FAIL bench_train: %s\n", err); return 1; }
            printf("bench_train: %s, z/S %d (window %d), %s: %.0f tokens/s, %.1f ms a step, %.2f GB on the device\n",
                   tgpu_device_name(g), span, W, PREC_NAME[prec], tps,
                   1e3 * c.batch_size * c.block_size / tps, tgpu_bytes(g) / 1e9);
            tgpu_free(g);
        }
    free(x);
    free(y);
    trainer_free(t);
    if (profile || batch_only) return 0;
    return bench_par(err, profile_par) || (!profile_par && bench_scaling(-1, err)) ? 1 : 0;
}
#endif
