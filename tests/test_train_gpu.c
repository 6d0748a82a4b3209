/*
 * test_train_gpu.c - the CUDA trainer (kernels/train_gpu.h) against the
 * double-precision CPU trainer on tiny configurations, both from the same
 * weights. Adaptive-span (core/train_aspan.c):
 *   - the loss and the span loss of blocks with the memory carried, and the
 *     memories after them;
 *   - the gradient of every element of every tensor (z/S, key_pe and every
 *     weight) on the same batch, to relative 1e-3 (an element may miss by
 *     1e-5 of its tensor's largest, where float32 sums cancel);
 *   - five steps of Adagrad (the reference's per-tensor clipping, warm-up)
 *     and of Adam: the losses track the CPU's to 1e-4 and the weights to a
 *     thousandth of lr a step (but elements whose gradient is below
 *     float32's resolution, which Adagrad's normalisation turns into up to
 *     lr);
 *   - windows trimmed below the span, blocks longer than the span;
 *   - the attention's products on the band (kernels/train_band.cu) against
 *     the full score matrices' (SPANSERVE_TRAIN_BAND_MAX=0): float32 every
 *     element, tf32 and bf16 each tensor's norm; the fused tensor-core
 *     kernels against the band's tiles (SPANSERVE_TRAIN_BAND_TC=0) every
 *     element; windows of 64 to 256 at once, heads of 64, 16 and 8;
 *   - `spanserve train`'s loop (train_run_on) on a slice of tiny_shakespeare:
 *     the GPU's logged losses and validation bpc follow the CPU's (5e-3
 *     after 40 steps), the checkpoint loads, and a
 *     resumed GPU run equals the GPU run that never stopped.
 * and the same of PAR Transformer-XL (core/train_par.c) on tiny configs:
 *   - the losses of blocks while the memory fills, and the memories;
 *   - every gradient element while searching (alpha through the
 *     Gumbel-softmax included) and of the fixed architecture (the branches
 *     it left out: none on either side);
 *   - steps of Adam (alpha at arch_lr, unclipped) in both phases; the
 *     branches left out do not move;
 *   - no memory, a memory shorter than a block, untied output, heads
 *     narrower than the model, Adagrad;
 *   - the loop: the same architecture fixed, a stop during the search
 *     resumed past its end.
 * Several GPUs (train_multi.cu), where the machine has them (else a SKIP
 * line): the same steps on 2 GPUs and on one (losses, weights, memories),
 * both families with dropout; the refusals; the loop on 2 GPUs against one,
 * and a run stopped on 2 resumed on one.
 * Both with dropout at every site (the masks are the CPU trainer's:
 * core/train_drop.h), in the comparisons and in the loops.
 * Without a GPU (or built without nvcc) it reports itself skipped.
 */
#define _POSIX_C_SOURCE 200809L
#include "err.h"
#include "harness.h"
#include "model.h"
#include "train.h"

#ifndef SPANSERVE_CUDA
int main(void)
{
    printf("SKIP test_train_gpu: no GPU (built without nvcc)\n");
    return test_summary("test_train_gpu");
}
#else

#include "../kernels/train_gpu.h"

#include <cuda_runtime_api.h>
#include <jansson.h>
#include <unistd.h>

static train_rng rng = {777};

static void rand_tokens(int32_t *x, int32_t *y, int n, int V)
{
    for (int i = 0; i < n; i++) {
        x[i] = (int32_t)(train_rng_next(&rng) % (uint64_t)V);
        y[i] = (int32_t)(train_rng_next(&rng) % (uint64_t)V);
    }
}

static double rel(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-12 ? fabs(b) : 1e-12); }

/* Every tensor's gradient: |gpu - cpu| <= 1e-3 |cpu| + 1e-5 max|cpu of the tensor|;
 * a tensor the step does not train (a branch a fixed PAR architecture left
 * out) has none on either side. */
static void compare_grads(const trainer *t, const double *gg, const char *what)
{
    double worst_all = 0;
    for (int i = 0; i < t->n_tp; i++) {
        const tparam *p = &t->tp[i];
        const double *gc = t->g + p->off, *gd = gg + p->off;
        double mx = 0, worst = 0;
        size_t at = 0;
        if (!train_param_active(t, i)) {
            for (size_t j = 0; j < p->n; j++) mx = fmax(mx, fabs(gc[j]) + fabs(gd[j]));
            CHECK(mx == 0, "%s: %s is not trained this step but has a gradient (%.3g)", what, p->name, mx);
            continue;
        }
        for (size_t j = 0; j < p->n; j++) mx = fmax(mx, fabs(gc[j]));
        for (size_t j = 0; j < p->n; j++) {
            double d = fabs(gd[j] - gc[j]), e = d / (1e-3 * fabs(gc[j]) + 1e-5 * mx);
            if (!(e <= worst)) worst = e, at = j;   /* NaN counts */
        }
        CHECK(mx > 1e-9, "%s: %s has no gradient on the CPU", what, p->name);
        CHECK(worst <= 1, "%s: %s[%zu]: gpu %.9g cpu %.9g (max |g| %.3g): %.3g x the tolerance", what, p->name, at,
              gd[at], gc[at], mx, worst);
        worst_all = fmax(worst_all, worst);
    }
    printf("%s: gradients of %d tensors, the worst at %.3g of the tolerance\n", what, t->n_tp, worst_all);
}

/* A flag per element of T's arena: its gradient (t->g) is at most RES of
 * its tensor's largest; *N counts them. */
static char *unresolved(const trainer *t, double res, size_t *n)
{
    char *u = calloc(t->n, 1);
    for (int i = 0; u && i < t->n_tp; i++) {
        const tparam *p = &t->tp[i];
        double mx = 0;
        for (size_t j = 0; j < p->n; j++) mx = fmax(mx, fabs(t->g[p->off + j]));
        for (size_t j = 0; j < p->n; j++)
            if (fabs(t->g[p->off + j]) <= res * mx) u[p->off + j] = 1, (*n)++;
    }
    return u;
}

/* Two trainers of C from the same weights (SEED): 0, or -1 (checked, both freed) */
static int trainer_pair(const train_cfg *c, int V, uint64_t seed, trainer **a, trainer **b, const char *what)
{
    char err[ERR_LEN];
    *a = trainer_new(c, V, err);
    *b = *a ? trainer_new(c, V, err) : NULL;
    CHECK(*a && *b, "%s: trainer_new: %s", what, err);
    if (!*a || !*b) {
        trainer_free(*a);
        trainer_free(*b);
        return -1;
    }
    trainer_init(*a, seed);
    trainer_init(*b, seed);
    return 0;
}

/* A CPU trainer and a GPU one from the same weights (z/S set to ZF, one per
 * layer and head): blocks with the memory, the gradient, STEPS steps. */
static void compare_case(train_cfg c, int V, const double *zf, int steps, const char *what)
{
    char err[ERR_LEN];
    trainer *tc, *tg;
    if (trainer_pair(&c, V, 11, &tc, &tg, what)) return;
    for (int l = 0; l < tc->L; l++)
        for (int h = 0; h < tc->K; h++)
            tc->w[tc->ly[l].zfrac + h] = tg->w[tg->ly[l].zfrac + h] = zf[(l * tc->K + h) % 8];
    tgpu *g = tgpu_new(tg, err);
    CHECK(g != NULL, "%s: tgpu_new: %s", what, err);
    if (!g) { trainer_free(tc); trainer_free(tg); return; }
    const int N = tc->B * tc->M;
    int32_t *x = malloc(sizeof *x * N), *y = malloc(sizeof *y * N);
    double *buf = malloc(sizeof *buf * (tc->n > (size_t)tc->L * tc->B * c.attn_span * tc->H ? tc->n
                                                                                             : (size_t)tc->L * tc->B * c.attn_span * tc->H));
    /* three blocks fill the memory */
    for (int s = 0; s < 3; s++) {
        rand_tokens(x, y, N, V);
        double ac, ag, lc = trainer_forward(tc, x, y, 0, 1, &ac, err), lg = tgpu_forward(g, tg, x, y, 0, 1, &ag, err);
        CHECK(rel(lg, lc) < 1e-5, "%s: block %d: loss gpu %.9g cpu %.9g (%s)", what, s, lg, lc, err);
        CHECK(rel(ag, ac) < 1e-9, "%s: block %d: span loss gpu %.9g cpu %.9g", what, s, ag, ac);
    }
    size_t nm = (size_t)tc->L * tc->B * c.attn_span * tc->H;
    CHECK(tgpu_download_memory(g, buf, err) == 0, "%s: %s", what, err);
    double md = 0, mabs = 0;
    for (size_t i = 0; i < nm; i++) md = fmax(md, fabs(buf[i] - tc->mem[i])), mabs += fabs(tc->mem[i]);
    CHECK(mabs > 1 && md < 1e-4, "%s: memories differ by %.3g (sum |cpu| %.3g)", what, md, mabs);

    /* the gradient of one block */
    rand_tokens(x, y, N, V);
    double ac, ag, lc = trainer_forward(tc, x, y, 1, 1, &ac, err), lg = tgpu_forward(g, tg, x, y, 1, 1, &ag, err);
    CHECK(rel(lg, lc) < 1e-5, "%s: loss gpu %.9g cpu %.9g (%s)", what, lg, lc, err);
    CHECK(tgpu_download_grad(g, buf, err) == 0, "%s: %s", what, err);
    compare_grads(tc, buf, what);
    /* elements whose gradient float32 cannot resolve: below 1e-5 of their
     * tensor's largest (key_pe columns that every head's mask zeroes move
     * the loss only through the 1e-8 of the mask's normalisation) */
    size_t n_unres = 0;
    char *unres = unresolved(tc, 1e-5, &n_unres);

    /* steps: the same batches, warm-up from step 1 */
    double worst_loss = 0;
    for (int s = 1; s <= steps; s++) {
        rand_tokens(x, y, N, V);
        lc = trainer_forward(tc, x, y, 1, 1, &ac, err);
        lg = tgpu_forward(g, tg, x, y, 1, 1, &ag, err);
        double lr = train_lr(&c, s);
        train_optim_step(tc, lr, 0);
        CHECK(tgpu_step(g, tg, lr, err) == 0, "%s: step: %s", what, err);
        CHECK(rel(lg, lc) < 1e-4, "%s: step %d: loss gpu %.9g cpu %.9g", what, s, lg, lc);
        worst_loss = fmax(worst_loss, rel(lg, lc));
    }
    CHECK(tg->step == tc->step, "%s: %ld steps on the GPU, %ld on the CPU", what, tg->step, tc->step);
    if (steps) {
        CHECK(tgpu_download(g, tg, err) == 0, "%s: %s", what, err);
        /* Each step moves a weight by about lr at most, and float32's
         * rounding of the gradients moves the GPU's weights a thousandth of
         * that. Adagrad divides each gradient by its own root sum of
         * squares: an element whose gradient float32 cannot resolve moves
         * by a different fraction of lr (within 2 lr a step). */
        double worst = 0, worst_res = 0, tight = 1e-3 * c.lr * steps;
        size_t off_tight = 0;
        const char *wn = "", *rn = "";
        for (int i = 0; i < tc->n_tp; i++) {
            const tparam *p = &tc->tp[i];
            for (size_t j = 0; j < p->n; j++) {
                double d = fabs(tg->w[p->off + j] - tc->w[p->off + j]);
                if (!(d <= worst)) worst = d, wn = p->name;
                if (unres[p->off + j]) continue;
                if (!(d <= tight)) off_tight++;
                if (!(d <= worst_res)) worst_res = d, rn = p->name;
            }
        }
        CHECK(worst <= 2 * c.lr * steps, "%s: after %d steps a weight of %s differs by %.3g", what, steps, wn, worst);
        CHECK(off_tight == 0, "%s: after %d steps %zu of %zu weights differ by more than %.3g (the most %.3g, %s)",
              what, steps, off_tight, tc->n, tight, worst_res, rn);
        printf("%s: %d steps, losses within %.2g, weights within %.3g (%s; %zu of %zu unresolved within %.3g)\n", what,
               steps, worst_loss, worst_res, rn, n_unres, tc->n, worst);
    }
    free(unres);
    free(x);
    free(y);
    free(buf);
    tgpu_free(g);
    trainer_free(tc);
    trainer_free(tg);
}

static train_cfg tiny(void)
{
    train_cfg c;
    train_cfg_defaults(&c, &train_family_aspan);
    c.nb_layers = 2;
    c.hidden_size = 8;
    c.nb_heads = 2;
    c.inner_hidden_size = 12;
    c.attn_span = 12;
    c.block_size = 5;
    c.batch_size = 2;
    c.adapt_span_ramp = 4;
    c.adapt_span_loss = 0.01;
    c.lr_warmup = 3;
    return c;
}

/* config 'tf32' and 'precision' "bf16": the linear layers on tensor cores,
 * near the CPU but not within float32's 1e-3: tf32 the loss to 1e-2, every
 * tensor's gradient to 5e-2 of its norm; bf16 (8-bit mantissas) to 2e-2
 * and 1e-1 */
static void test_fast(train_cfg c, int bf16, const char *what)
{
    char err[ERR_LEN];
    c.tf32 = !bf16;
    c.bf16 = bf16;
    strcpy(c.device, "cuda");
    CHECK(train_cfg_check(&c, err) != 0 && strstr(err, "'data' is required"), "%s with cuda: %s", what, err);
    trainer *tc = trainer_new(&c, 11, err), *tg = trainer_new(&c, 11, err);
    tgpu *g = tg ? tgpu_new(tg, err) : NULL;
    CHECK(tc && tg && g, "%s: %s", what, err);
    if (tc && tg && g) {
        trainer_init(tc, 5);
        trainer_init(tg, 5);
        CHECK(tgpu_upload(g, tg, err) == 0, "%s: %s", what, err);
        int32_t x[64], y[64];
        const int N = tc->B * tc->M;
        CHECK(N <= 64, "%s: %d tokens a block (at most 64 here)", what, N);
        double ac, ag, lc = 0, lg = 0, *gg = malloc(sizeof *gg * tc->n);
        for (int s = 0; s < 3 && N <= 64; s++) {
            rand_tokens(x, y, N, 11);
            lc = trainer_forward(tc, x, y, s == 2, 1, &ac, err);
            lg = tgpu_forward(g, tg, x, y, s == 2, 1, &ag, err);
        }
        CHECK(rel(lg, lc) < (bf16 ? 2e-2 : 1e-2), "%s: loss gpu %.9g cpu %.9g", what, lg, lc);
        CHECK(tgpu_download_grad(g, gg, err) == 0, "%s: %s", what, err);
        double worst = 0;
        for (int i = 0; i < tc->n_tp; i++) {
            const tparam *p = &tc->tp[i];
            double d2 = 0, n2 = 0;
            for (size_t j = 0; j < p->n; j++) {
                d2 += (gg[p->off + j] - tc->g[p->off + j]) * (gg[p->off + j] - tc->g[p->off + j]);
                n2 += tc->g[p->off + j] * tc->g[p->off + j];
            }
            worst = fmax(worst, sqrt(d2 / n2));
        }
        CHECK(worst < (bf16 ? 1e-1 : 5e-2), "%s: a tensor's gradient is off by %.3g of its norm", what, worst);
        printf("%s: loss within %.2g, gradients within %.3g of their norms\n", what, rel(lg, lc), worst);
        free(gg);
    }
    tgpu_free(g);
    trainer_free(tc);
    trainer_free(tg);
}

/* The attention's products on the band (kernels/train_band.cu) against
 * another way, in precision PREC ("fp32", "tf32" or "bf16"), from the same
 * weights and batches: the second trainer made with ENV ("NAME=value"):
 * SPANSERVE_TRAIN_BAND_MAX=0, cuBLAS's products on the full score
 * matrices; SPANSERVE_TRAIN_BAND_TC=0, the band's tiles of 64 x 64 instead
 * of the fused whole-tile tensor-core kernels (the same TF32 products, so
 * element by element). The losses, and each tensor's gradient within TOL
 * of its norm, or ELEMENTWISE every element within TOL of its tensor's
 * largest. ZF gives each layer's z/S (its window). */
static void compare_band(train_cfg c, const double *zf, const char *prec, const char *env, int elementwise, double tol,
                         const char *what)
{
    char err[ERR_LEN];
    c.tf32 = !strcmp(prec, "tf32");
    c.bf16 = !strcmp(prec, "bf16");
        trainer *t[2] = {trainer_new(&c, 40, err), trainer_new(&c, 40, err)};
    tgpu *g[2] = {NULL, NULL};
    CHECK(t[0] && t[1], "%s: %s", what, err);
    if (!t[0] || !t[1]) { trainer_free(t[0]); trainer_free(t[1]); return; }
    for (int k = 0; k < 2; k++) {
        trainer_init(t[k], 5);
        for (int l = 0; l < t[k]->L; l++)
            for (int h = 0; h < t[k]->K; h++) t[k]->w[t[k]->ly[l].zfrac + h] = zf[l] - 0.01 * h;
        char var[64];
        snprintf(var, sizeof var, "%s", env);
        char *eq = strchr(var, '=');
        if (eq) *eq = 0;
        if (k && eq) setenv(var, eq + 1, 1);
        g[k] = tgpu_new(t[k], err);
        if (eq) unsetenv(var);
        CHECK(g[k] != NULL, "%s: tgpu_new: %s", what, err);
    }
    const int N = t[0]->B * t[0]->M;
    train_rng r = {4242};
    int32_t *x = malloc(sizeof *x * N), *y = malloc(sizeof *y * N);
    double *gg[2] = {malloc(sizeof(double) * t[0]->n), malloc(sizeof(double) * t[0]->n)};
    for (int s = 0; s < 3 && g[0] && g[1]; s++) {
        /* its own tokens: the draws of the checks after it stay as they were */
        for (int i = 0; i < N; i++) {
            x[i] = (int32_t)(train_rng_next(&r) % 40u);
            y[i] = (int32_t)(train_rng_next(&r) % 40u);
        }
        t[0]->step = t[1]->step = s + 1;   /* dropout's masks */
        double a0, a1, l0 = tgpu_forward(g[0], t[0], x, y, s == 2, 1, &a0, err),
                       l1 = tgpu_forward(g[1], t[1], x, y, s == 2, 1, &a1, err);
        CHECK(rel(l0, l1) < tol, "%s: block %d: loss on the band %.9g, full %.9g", what, s, l0, l1);
    }
    if (g[0] && g[1] && tgpu_download_grad(g[0], gg[0], err) == 0 && tgpu_download_grad(g[1], gg[1], err) == 0) {
        double worst = 0, n2all = 0;
        const char *at = "";
        int bad = 0;
        for (int i = 0; i < t[0]->n_tp; i++) {
            const tparam *p = &t[0]->tp[i];
            double d2 = 0, n2 = 0, big = 0, d = 0;
            for (size_t j = 0; j < p->n; j++) {
                const double u = gg[0][p->off + j], v = gg[1][p->off + j];
                bad += !isfinite(u) || !isfinite(v);
                d2 += (u - v) * (u - v), n2 += v * v;
                big = fmax(big, fabs(v)), d = fmax(d, fabs(u - v));
            }
            n2all += n2;
            /* ELEMENTWISE: every element; else each tensor as a whole (a
             * ReLU unit whose input sits within TF32's rounding of zero
             * takes the other side and moves its row's elements by a
             * token's share) */
            const double e = elementwise ? (big > 0 ? d / big : 0) : (n2 > 0 ? sqrt(d2 / n2) : 0);
            if (e > worst) worst = e, at = p->name;
        }
        CHECK(bad == 0 && n2all > 0, "%s: %d gradient elements not finite, sum of squares %g", what, bad, n2all);
        CHECK(worst < tol, "%s: gradient of %s off by %.3g", what, at, worst);
        printf("%s: gradients within %.3g (%s; worst: %s)\n", what, worst,
               elementwise ? "every element, of its tensor's largest" : "of each tensor's norm", at);
    }
    free(x), free(y), free(gg[0]), free(gg[1]);
    for (int k = 0; k < 2; k++) tgpu_free(g[k]), trainer_free(t[k]);
}

/* ---- PAR ---- */

/* the Gumbel noise and tau of a search step, the same on both trainers */
static void par_noise(trainer *a, trainer *b, long s)
{
    a->tau = b->tau = a->c.tau_start * pow(a->c.tau_end / a->c.tau_start, (double)s / (double)a->c.search_steps);
    for (int i = 0; i < 3 * a->L; i++) a->gumbel[i] = b->gumbel[i] = -log(-log(train_rng_unif(&rng)));
}

/* A CPU trainer and a GPU one from the same weights: blocks that fill the
 * memory (compared after them), the gradient of every element while
 * searching (alpha included), STEPS steps of the search, the architecture
 * fixed, the gradient of the fixed model, STEPS more steps (the branches
 * left out untouched on both). */
static void compare_par(train_cfg c, int V, int steps, const char *what)
{
    char err[ERR_LEN];
    trainer *tc, *tg;
    if (trainer_pair(&c, V, 13, &tc, &tg, what)) return;
    /* alpha away from 0, so that the mixture's gradient is not symmetric */
    for (int l = 0; l < tc->L; l++)
        for (int k = 0; k < 3; k++)
            tc->w[tc->ly[l].alpha + k] = tg->w[tg->ly[l].alpha + k] = 0.3 * sin(1.7 * l + 2.1 * k);
    tgpu *g = tgpu_new(tg, err);
    CHECK(g != NULL, "%s: tgpu_new: %s", what, err);
    if (!g) { trainer_free(tc); trainer_free(tg); return; }
    const int N = tc->B * tc->M;
    const size_t nm = trainer_mem_floats(tc);
    int32_t *x = malloc(sizeof *x * N), *y = malloc(sizeof *y * N);
    double *buf = malloc(sizeof *buf * (tc->n > nm ? tc->n : nm + 1));
    double ac, ag, lc, lg;
    /* blocks: the memory fills (mlen 0, M, ... up to mem_len) */
    for (int s = 0; s < 3; s++) {
        par_noise(tc, tg, 1);
        rand_tokens(x, y, N, V);
        lc = trainer_forward(tc, x, y, 0, 1, &ac, err);
        lg = tgpu_forward(g, tg, x, y, 0, 1, &ag, err);
        CHECK(rel(lg, lc) < 1e-5, "%s: block %d: loss gpu %.9g cpu %.9g (%s)", what, s, lg, lc, err);
    }
    if (nm) {
        CHECK(tgpu_download_memory(g, buf, err) == 0, "%s: %s", what, err);
        double md = 0, mabs = 0;
        for (size_t i = 0; i < nm; i++) md = fmax(md, fabs(buf[i] - tc->mem[i])), mabs += fabs(tc->mem[i]);
        CHECK(mabs > 1 && md < 1e-4, "%s: memories differ by %.3g (sum |cpu| %.3g)", what, md, mabs);
    }
    for (int phase = 0; phase < 2; phase++) {
        const char *ph = phase == 0 ? "searching" : "fixed";
        char label[200];
        snprintf(label, sizeof label, "%s, %s", what, ph);
        if (phase == 1) {
            par_fix_arch(tc);
            par_fix_arch(tg);
            for (int l = 0; l < tc->L; l++)
                CHECK(tc->arch[l] == tg->arch[l], "%s: block %d: arch gpu %d cpu %d", label, l, tg->arch[l], tc->arch[l]);
        }
        /* the gradient of one block */
        if (phase == 0) par_noise(tc, tg, 3);
        rand_tokens(x, y, N, V);
        lc = trainer_forward(tc, x, y, 1, 1, &ac, err);
        lg = tgpu_forward(g, tg, x, y, 1, 1, &ag, err);
        CHECK(rel(lg, lc) < 1e-5, "%s: loss gpu %.9g cpu %.9g (%s)", label, lg, lc, err);
        CHECK(tgpu_download_grad(g, buf, err) == 0, "%s: %s", label, err);
        compare_grads(tc, buf, label);
        /* elements whose gradient float32 cannot resolve to 1e-3: Adam and
         * Adagrad divide each by its own root (mean) square, so they may
         * move by a different fraction of lr. compare_grads allows an
         * element 1e-5 of its tensor's largest: for Adam (eps 1e-8 under
         * the root) the elements below that; Adagrad's ratio of an
         * element's own gradients takes their relative error whole, which
         * is over 1e-3 below 1e-2 of the largest */
        size_t n_unres = 0;
        char *unres = unresolved(tc, c.optim == OPT_ADAGRAD ? 1e-2 : 1e-5, &n_unres);
        double *w0 = malloc(sizeof *w0 * tc->n);
        CHECK(tgpu_download(g, tg, err) == 0, "%s: %s", label, err);
        memcpy(w0, tg->w, sizeof *w0 * tc->n);
        /* steps of Adam (weights clipped, alpha at arch_lr) */
        double worst_loss = 0;
        for (int s = 1; s <= steps; s++) {
            if (phase == 0) par_noise(tc, tg, s);
            rand_tokens(x, y, N, V);
            lc = trainer_forward(tc, x, y, 1, 1, &ac, err);
            lg = tgpu_forward(g, tg, x, y, 1, 1, &ag, err);
            double lr = train_lr(&c, s);
            train_optim_step(tc, lr, c.arch_lr);
            CHECK(tgpu_step(g, tg, lr, err) == 0, "%s: step: %s", label, err);
            CHECK(rel(lg, lc) < 1e-4, "%s: step %d: loss gpu %.9g cpu %.9g", label, s, lg, lc);
            worst_loss = fmax(worst_loss, rel(lg, lc));
        }
        CHECK(tgpu_download(g, tg, err) == 0, "%s: %s", label, err);
        /* Adam moves a weight by about lr a step; float32's rounding a
         * thousandth of that */
        const double lr_max = fmax(c.lr, c.arch_lr), tight = 1e-3 * lr_max * steps;
        double worst = 0, worst_res = 0;
        const char *wn = "", *rn = "";
        size_t off_tight = 0, moved = 0;
        for (int i = 0; i < tc->n_tp; i++) {
            const tparam *p = &tc->tp[i];
            const int active = train_param_active(tc, i);
            for (size_t j = 0; j < p->n; j++) {
                const size_t at = p->off + j;
                double d = fabs(tg->w[at] - tc->w[at]);
                if (!(d <= worst)) worst = d, wn = p->name;
                if (!active && tg->w[at] != w0[at]) moved++;
                if (unres[at]) continue;
                if (!(d <= tight)) off_tight++;
                if (!(d <= worst_res)) worst_res = d, rn = p->name;
            }
        }
        CHECK(worst <= 2 * lr_max * steps, "%s: after %d steps a weight of %s differs by %.3g", label, steps, wn, worst);
        CHECK(off_tight == 0, "%s: after %d steps %zu weights differ by more than %.3g (the most %.3g, %s)", label,
              steps, off_tight, tight, worst_res, rn);
        CHECK(moved == 0, "%s: %zu weights of branches the architecture left out moved", label, moved);
        for (int l = 0; l < tc->L; l++)
            CHECK(tc->mlen[l] == tg->mlen[l], "%s: block %d: mlen gpu %d cpu %d", label, l, tg->mlen[l], tc->mlen[l]);
        printf("%s: %d steps, losses within %.2g, weights within %.3g (%s; %zu of %zu unresolved within %.3g)\n",
               label, steps, worst_loss, worst_res, rn, n_unres, tc->n, worst);
        free(unres);
        free(w0);
    }
    free(x);
    free(y);
    free(buf);
    tgpu_free(g);
    trainer_free(tc);
    trainer_free(tg);
}

static train_cfg tiny_par(void)
{
    train_cfg c;
    train_cfg_defaults(&c, &train_family_par);
    c.n_blocks = 4, c.n_head = 2, c.d_model = 8, c.d_head = 3, c.d_inner = 12, c.mem_len = 7, c.tgt_len = 4;
    c.batch_size = 3, c.search_steps = 100, c.lr = 0.01, c.arch_lr = 0.02, c.grad_clip = 0.25;
    return c;
}

/* ---- the loop ---- */

/* The "train" lines' losses and the final val_bpc of a log. */
static int read_log(FILE *f, double *loss, int cap, double *val)
{
    char line[65536];
    int n = 0;
    *val = NAN;
    rewind(f);
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        const char *ev = json_string_value(json_object_get(o, "event"));
        if (ev && strcmp(ev, "train") == 0 && n < cap) loss[n++] = json_real_value(json_object_get(o, "loss"));
        if (ev && strcmp(ev, "done") == 0) *val = json_real_value(json_object_get(o, "val_bpc"));
        json_decref(o);
    }
    return n;
}

/* the text: the first 60,000 characters of tiny_shakespeare; 0 or -1 */
static int loop_text(const char *dir, char *text, size_t cap)
{
    char src[1024];
    snprintf(src, sizeof src, "%s", ref_path("data/tiny_shakespeare.txt"));
    snprintf(text, cap, "%s/text.txt", dir);
    FILE *in = fopen(src, "rb"), *out = fopen(text, "wb");
    CHECK(in && out, "cannot read %s", src);
    if (!in || !out) { if (in) fclose(in); if (out) fclose(out); return -1; }
    char *buf = malloc(60000);
    size_t k = fread(buf, 1, 60000, in);
    fwrite(buf, 1, k, out);
    fclose(in);
    fclose(out);
    free(buf);
    return 0;
}

/* The architecture of a log's "arch_fixed" line, as one string ("" if none). */
static void read_arch(FILE *f, char *arch, size_t cap)
{
    char line[65536];
    arch[0] = 0;
    rewind(f);
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        const char *ev = json_string_value(json_object_get(o, "event"));
        if (ev && strcmp(ev, "arch_fixed") == 0) {
            char *a = json_dumps(json_object_get(o, "arch"), JSON_COMPACT);
            snprintf(arch, cap, "%s", a ? a : "");
            free(a);
        }
        json_decref(o);
    }
}

/* `spanserve train`'s loop on the CPU and on the GPU from config C (40
 * steps, progress every 10): the curves, the validation, the
 * architecture PAR fixes, the checkpoint, and a stop at 20 resumed to 40 */
static void test_loop(train_cfg c, const char *what)
{
    char err[ERR_LEN], dir[] = "/tmp/test_train_gpu.XXXXXX", text[1100];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    if (loop_text(dir, text, sizeof text)) return;
    c.steps = 40, c.log_every = 10, c.eval_every = 20, c.eval_tokens = 2000, c.checkpoint_every = 20;
    snprintf(c.data, sizeof c.data, "%s", text);
    double lc[8], lg[8], lr_[8], vc, vg, vr;
    char ac[512], ag[512], ar[512];
    FILE *f = tmpfile();
    snprintf(c.out, sizeof c.out, "%s/cpu.safetensors", dir);
    CHECK(train_run_on(&c, NULL, 0, f, err) == 0, "%s: cpu run: %s", what, err);
    int nc = read_log(f, lc, 8, &vc);
    read_arch(f, ac, sizeof ac);
    fclose(f);
    strcpy(c.device, "cuda");
    f = tmpfile();
    snprintf(c.out, sizeof c.out, "%s/gpu.safetensors", dir);
    CHECK(train_run_on(&c, &tgpu_train_device, 0, f, err) == 0, "%s: gpu run: %s", what, err);
    int ng = read_log(f, lg, 8, &vg);
    read_arch(f, ag, sizeof ag);
    fclose(f);
    CHECK(nc == 4 && ng == 4, "%s: progress lines: cpu %d, gpu %d (expected 4)", what, nc, ng);
    /* 40 steps carry float32's rounding further than one step
     * (compare_case): the curves agree to a few thousandths */
    for (int i = 0; i < nc && i < ng; i++)
        CHECK(rel(lg[i], lc[i]) < 5e-3, "%s: loss at line %d: gpu %.9g cpu %.9g", what, i, lg[i], lc[i]);
    CHECK(rel(vg, vc) < 5e-3, "%s: val_bpc gpu %.9g cpu %.9g", what, vg, vc);
    CHECK(nc > 0 && lc[nc - 1] < lc[0], "%s: the loss does not fall (%g -> %g)", what, lc[0], nc ? lc[nc - 1] : 0);
    CHECK(strcmp(ac, ag) == 0, "%s: the search fixed %s on the GPU, %s on the CPU", what, ag, ac);
    /* the GPU's checkpoint serves */
    model_t *m = model_load(c.out, err);
    CHECK(m != NULL, "%s: the GPU's checkpoint does not load: %s", what, err);
    model_free(m);
    /* stop at 20, resume to 40: the same as the run that never stopped */
    c.steps = 20;
    f = tmpfile();
    snprintf(c.out, sizeof c.out, "%s/gpu2.safetensors", dir);
    CHECK(train_run_on(&c, &tgpu_train_device, 0, f, err) == 0, "%s: gpu run to 20: %s", what, err);
    fclose(f);
    c.steps = 40;
    f = tmpfile();
    CHECK(train_run_on(&c, &tgpu_train_device, 1, f, err) == 0, "%s: gpu resume: %s", what, err);
    int nr = read_log(f, lr_, 8, &vr);
    read_arch(f, ar, sizeof ar);
    fclose(f);
    CHECK(nr == 2, "%s: resumed run: %d progress lines (expected 2)", what, nr);
    for (int i = 0; i < nr && i + 2 < ng; i++)
        CHECK(lr_[i] == lg[i + 2], "%s: resume: loss at line %d: %.17g vs %.17g without a stop", what, i + 2, lr_[i],
              lg[i + 2]);
    CHECK(vr == vg, "%s: resume: val_bpc %.17g vs %.17g without a stop", what, vr, vg);
    CHECK(strcmp(ar, ag) == 0, "%s: resume: the search fixed %s, %s without a stop", what, ar, ag);
    printf("%s loop: cpu losses %.6f .. %.6f val %.6f; gpu %.6f .. %.6f val %.6f%s%s\n", what, lc[0],
           lc[nc ? nc - 1 : 0], vc, lg[0], lg[ng ? ng - 1 : 0], vg, ag[0] ? "; arch " : "", ag);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) printf("note: could not remove %s\n", dir);
}

/* ---- several GPUs (train_multi.cu) ---- */

/* The same steps on 1 GPU and on N through the trainer's device table
 * (what `spanserve train` drives): the losses, the weights after them and
 * the memories agree to float32's summation order. */
static void compare_multi(train_cfg c, int V, int gpus, int steps, const char *what)
{
    char err[ERR_LEN];
    const train_device *dev = &tgpu_train_device;
    c.gpus = 1;
    trainer *t1 = trainer_new(&c, V, err);
    c.gpus = gpus;
    trainer *tn = trainer_new(&c, V, err);
    CHECK(t1 && tn, "%s: trainer_new: %s", what, err);
    if (!t1 || !tn) { trainer_free(t1); trainer_free(tn); return; }
    trainer_init(t1, 21);
    trainer_init(tn, 21);
    void *d1 = dev->open(t1, err);
    CHECK(d1 != NULL, "%s: one GPU: %s", what, err);
    void *dn = d1 ? dev->open(tn, err) : NULL;
    CHECK(dn != NULL, "%s: %d GPUs: %s", what, gpus, err);
    if (!d1 || !dn) {
        if (d1) dev->close(d1);
        trainer_free(t1);
        trainer_free(tn);
        return;
    }
    CHECK(strstr(dev->device_name(dn), "2 x ") != NULL || gpus != 2, "%s: device name '%s'", what, dev->device_name(dn));
    const int N = t1->B * t1->M;
    int32_t *x = malloc(sizeof *x * N), *y = malloc(sizeof *y * N);
    double worst = 0;
    for (int s = 1; s <= steps; s++) {
        if (c.fam->step_begin) {   /* the same tau and noise on both */
            train_rng r1 = {(uint64_t)s}, r2 = {(uint64_t)s};
            c.fam->step_begin(t1, s, &r1);
            c.fam->step_begin(tn, s, &r2);
        }
        rand_tokens(x, y, N, V);
        double a1, an, l1 = dev->forward(d1, t1, x, y, 1, 1, &a1, err), ln = dev->forward(dn, tn, x, y, 1, 1, &an, err);
        CHECK(isfinite(l1) && isfinite(ln), "%s: step %d: %s", what, s, err);
        /* the span loss comes from each run's own z/S, which float32's
         * order of sums moves by about 1e-7 */
        CHECK(rel(ln, l1) < 1e-5 && rel(an, a1) < 1e-5, "%s: step %d: loss %d GPUs %.9g, one %.9g; span loss %.9g, %.9g",
              what, s, gpus, ln, l1, an, a1);
        worst = fmax(worst, rel(ln, l1));
        double lr = train_lr(&c, s);
        CHECK(dev->step(d1, t1, lr, err) == 0 && dev->step(dn, tn, lr, err) == 0, "%s: step %d: %s", what, s, err);
    }
    /* an evaluation-like forward without the backward, then the state */
    rand_tokens(x, y, N, V);
    double a1, an, l1 = dev->forward(d1, t1, x, y, 0, 1, &a1, err), ln = dev->forward(dn, tn, x, y, 0, 1, &an, err);
    CHECK(rel(ln, l1) < 1e-5, "%s: forward only: loss %d GPUs %.9g, one %.9g", what, gpus, ln, l1);
    CHECK(dev->download(d1, t1, err) == 0 && dev->download(dn, tn, err) == 0, "%s: download: %s", what, err);
    CHECK(t1->step == tn->step, "%s: steps %ld and %ld", what, tn->step, t1->step);
    double dw = 0, dm = 0, mabs = 0;
    for (size_t i = 0; i < t1->n; i++) dw = fmax(dw, fabs(tn->w[i] - t1->w[i]));
    for (size_t i = 0; i < trainer_mem_floats(t1); i++) dm = fmax(dm, fabs(tn->mem[i] - t1->mem[i])), mabs += fabs(t1->mem[i]);
    for (int l = 0; l < t1->L; l++) CHECK(tn->mlen[l] == t1->mlen[l], "%s: mlen of layer %d", what, l);
    /* each step moves a weight by about lr; float32's other order of sums
     * a thousandth of that */
    CHECK(dw < 1e-3 * fmax(c.lr, c.arch_lr) * steps, "%s: weights differ by %.3g after %d steps", what, dw, steps);
    CHECK(mabs > 1 && dm < 1e-3, "%s: memories differ by %.3g (sum |one GPU| %.3g)", what, dm, mabs);
    printf("%s: %d GPUs vs one, %d steps: losses within %.2g, weights within %.3g, memories within %.3g\n", what, gpus,
           steps, worst, dw, dm);
    free(x);
    free(y);
    dev->close(d1);
    dev->close(dn);
    trainer_free(t1);
    trainer_free(tn);
}

/* `spanserve train --gpus N`'s loop against one GPU's, and a run stopped on
 * N GPUs resumed on one */
static void test_loop_multi(train_cfg c, int gpus, const char *what)
{
    char err[ERR_LEN], dir[] = "/tmp/test_train_gpu_multi.XXXXXX", text[1100];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    if (loop_text(dir, text, sizeof text)) return;
    c.steps = 40, c.log_every = 10, c.eval_every = 20, c.eval_tokens = 2000, c.checkpoint_every = 20;
    strcpy(c.device, "cuda");
    snprintf(c.data, sizeof c.data, "%s", text);
    double l1[8], ln[8], lr_[8], v1, vn, vr;
    FILE *f = tmpfile();
    snprintf(c.out, sizeof c.out, "%s/one.safetensors", dir);
    CHECK(train_run_on(&c, &tgpu_train_device, 0, f, err) == 0, "%s: one GPU: %s", what, err);
    int n1 = read_log(f, l1, 8, &v1);
    fclose(f);
    c.gpus = gpus;
    f = tmpfile();
    snprintf(c.out, sizeof c.out, "%s/multi.safetensors", dir);
    CHECK(train_run_on(&c, &tgpu_train_device, 0, f, err) == 0, "%s: %d GPUs: %s", what, gpus, err);
    int nn = read_log(f, ln, 8, &vn);
    fclose(f);
    CHECK(n1 == 4 && nn == 4, "%s: progress lines %d and %d", what, n1, nn);
    for (int i = 0; i < n1 && i < nn; i++)
        CHECK(rel(ln[i], l1[i]) < 1e-3, "%s: loss at line %d: %d GPUs %.9g, one %.9g", what, i, gpus, ln[i], l1[i]);
    CHECK(rel(vn, v1) < 1e-3, "%s: val_bpc %d GPUs %.9g, one %.9g", what, gpus, vn, v1);
    model_t *m = model_load(c.out, err);
    CHECK(m != NULL, "%s: the %d-GPU checkpoint does not load: %s", what, gpus, err);
    model_free(m);
    /* stop at 20 on N GPUs, resume to 40 on one */
    c.steps = 20;
    f = tmpfile();
    snprintf(c.out, sizeof c.out, "%s/r.safetensors", dir);
    CHECK(train_run_on(&c, &tgpu_train_device, 0, f, err) == 0, "%s: %d GPUs to 20: %s", what, gpus, err);
    fclose(f);
    c.steps = 40, c.gpus = 1;
    f = tmpfile();
    CHECK(train_run_on(&c, &tgpu_train_device, 1, f, err) == 0, "%s: resumed on one GPU: %s", what, err);
    int nr = read_log(f, lr_, 8, &vr);
    fclose(f);
    CHECK(nr == 2, "%s: resumed run: %d progress lines (expected 2)", what, nr);
    for (int i = 0; i < nr && i + 2 < nn; i++)
        CHECK(rel(lr_[i], ln[i + 2]) < 1e-3, "%s: resumed on one GPU: loss at line %d %.9g, %.9g on %d", what, i + 2,
              lr_[i], ln[i + 2], gpus);
    CHECK(rel(vr, vn) < 1e-3, "%s: resumed on one GPU: val_bpc %.9g, %.9g on %d", what, vr, vn, gpus);
    printf("%s loop: one GPU %.6f .. %.6f val %.6f; %d GPUs %.6f .. %.6f val %.6f; stopped on %d, resumed on one: val "
           "%.6f\n", what, l1[0], l1[n1 ? n1 - 1 : 0], v1, gpus, ln[0], ln[nn ? nn - 1 : 0], vn, gpus, vr);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) printf("note: could not remove %s\n", dir);
}

/* The device table's train_step (forward, backward and optimizer launched
 * together, one wait) against its forward then step on GPUS devices: the
 * same kernels in the same order, so the same losses and weights to the
 * bit on one GPU (NCCL's sums too, on several). Then a loss that is not
 * finite: NAN, the error said, and neither the step count nor any weight
 * or moment moved. */
static void compare_fused(train_cfg c, int V, int gpus, int steps, const char *what)
{
    char err[ERR_LEN];
    const train_device *dev = &tgpu_train_device;
    c.gpus = gpus;
    trainer *ta = trainer_new(&c, V, err), *tb = trainer_new(&c, V, err);
    CHECK(ta && tb, "%s: trainer_new: %s", what, err);
    if (!ta || !tb) { trainer_free(ta); trainer_free(tb); return; }
    trainer_init(ta, 31);
    trainer_init(tb, 31);
    if (c.fam == &train_family_par && !ta->searching)   /* a fixed architecture of both kinds of block */
        for (int l = 0; l < ta->L; l++) ta->arch[l] = tb->arch[l] = l % 2 ? BLK_FFN : BLK_ATTN;
    void *da = dev->open(ta, err);
    CHECK(da != NULL, "%s: open: %s", what, err);
    void *db = da ? dev->open(tb, err) : NULL;
    CHECK(db != NULL, "%s: open: %s", what, err);
    const int N = ta->B * ta->M;
    int32_t *x = malloc(sizeof *x * N), *y = malloc(sizeof *y * N);
    for (int s = 1; s <= steps && db; s++) {
        if (c.fam->step_begin) {
            train_rng r1 = {(uint64_t)s}, r2 = {(uint64_t)s};
            c.fam->step_begin(ta, s, &r1);
            c.fam->step_begin(tb, s, &r2);
        }
        rand_tokens(x, y, N, V);
        const double lr = train_lr(&c, s);
        double aa, ab, la = dev->forward(da, ta, x, y, 1, 1, &aa, err);
        CHECK(isfinite(la) && dev->step(da, ta, lr, err) == 0, "%s: step %d, forward then step: %s", what, s, err);
        const double lb = dev->train_step(db, tb, x, y, lr, &ab, err);
        CHECK(isfinite(lb), "%s: step %d, train_step: %s", what, s, err);
        CHECK(la == lb && aa == ab, "%s: step %d: loss %.17g vs %.17g, aux %.17g vs %.17g", what, s, lb, la, ab, aa);
    }
    if (db) {
        CHECK(dev->download(da, ta, err) == 0 && dev->download(db, tb, err) == 0, "%s: download: %s", what, err);
        CHECK(ta->step == steps && tb->step == steps, "%s: steps %ld and %ld", what, ta->step, tb->step);
        size_t diff = 0;
        for (size_t i = 0; i < ta->n; i++) diff += ta->w[i] != tb->w[i] || ta->m1[i] != tb->m1[i];
        CHECK(diff == 0, "%s: %zu weights or moments differ after %d steps", what, diff, steps);
        printf("%s: train_step and forward + step: %d steps, %d GPU%s, losses and weights equal to the bit\n", what,
               steps, gpus, gpus == 1 ? "" : "s");
    }
    if (da) dev->close(da);
    if (db) dev->close(db);
    /* a weight that is not a number: the loss is not finite */
    trainer_init(tb, 31);
    tb->step = 0;
    size_t at = 0;
    for (int i = 0; i < tb->n_tp; i++)
        if (tb->tp[i].kind == TP_WEIGHT) { at = tb->tp[i].off; break; }
    tb->w[at] = NAN;
    double *w0 = malloc(sizeof *w0 * tb->n * 3);
    memcpy(w0, tb->w, sizeof *w0 * tb->n);
    memcpy(w0 + tb->n, tb->m1, sizeof *w0 * tb->n);
    if (tb->m2) memcpy(w0 + 2 * tb->n, tb->m2, sizeof *w0 * tb->n);
    db = dev->open(tb, err);
    CHECK(db != NULL, "%s: open: %s", what, err);
    if (db) {
        for (int i = 0; i < N; i++) x[i] = 0, y[i] = 1;   /* every row reads the broken weight's row */
        double aux;
        err[0] = 0;
        const double l = dev->train_step(db, tb, x, y, 0.1, &aux, err);
        CHECK(isnan(l) && strstr(err, "not finite"), "%s: a NaN weight: loss %g, '%s'", what, l, err);
        CHECK(tb->step == 0, "%s: a step that was not taken counted: %ld", what, tb->step);
        CHECK(dev->download(db, tb, err) == 0, "%s: download: %s", what, err);
        size_t moved = 0;
        for (size_t i = 0; i < tb->n; i++)
            moved += i != at && (tb->w[i] != (float)w0[i] || tb->m1[i] != (float)w0[tb->n + i] ||
                                 (tb->m2 && tb->m2[i] != (float)w0[2 * tb->n + i]));   /* the device keeps floats */
        CHECK(moved == 0 && isnan(tb->w[at]), "%s: a loss that is not finite moved %zu weights or moments", what, moved);
        dev->close(db);
    }
    free(w0);
    free(x);
    free(y);
    trainer_free(ta);
    trainer_free(tb);
}

static void test_fused_multi(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("SKIP test_train_gpu train_step on several GPUs: this machine has %d CUDA device%s\n", n,
               n == 1 ? "" : "s");
        return;
    }
    train_cfg c = tiny();
    c.batch_size = 4, c.dropout = 0.2, c.optim = OPT_ADAM, c.lr = 0.01;
    compare_fused(c, 7, 2, 4, "train_step aspan, 2 GPUs");
    train_cfg p = tiny_par();
    p.batch_size = 4, p.dropout = 0.2;
    compare_fused(p, 9, 2, 4, "train_step par, 2 GPUs");
}

static void test_multi(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("SKIP test_train_gpu several GPUs: this machine has %d CUDA device%s\n", n, n == 1 ? "" : "s");
        return;
    }
    char err[ERR_LEN];
    /* adaptive-span with dropout, 4 streams over 2 GPUs */
    train_cfg c = tiny();
    c.batch_size = 4, c.dropout = 0.2, c.emb_dropout = 0.1, c.optim = OPT_ADAM, c.lr = 0.01;
    compare_multi(c, 7, 2, 5, "aspan, 2 GPUs");
    /* PAR searching, dropout and dropatt */
    train_cfg p = tiny_par();
    p.batch_size = 4, p.dropout = 0.2, p.dropatt = 0.2;
    compare_multi(p, 9, 2, 5, "par, 2 GPUs");
    /* the all-reduces of buckets overlapped with the backward (what several
     * machines do) on this one */
    setenv("SPANSERVE_GRAD_OVERLAP", "1", 1);
    compare_multi(c, 7, 2, 5, "aspan, 2 GPUs, buckets overlapped");
    compare_multi(p, 9, 2, 5, "par, 2 GPUs, buckets overlapped");
    unsetenv("SPANSERVE_GRAD_OVERLAP");
    /* refusals: more GPUs than the machine has; a batch they do not divide */
    c = tiny();
    c.gpus = n + 1;
    c.batch_size = 2 * (n + 1);
    trainer *t = trainer_new(&c, 7, err);
    void *d = t ? tgpu_train_device.open(t, err) : NULL;
    CHECK(!d && strstr(err, "CUDA device"), "gpus %d of %d: %s", n + 1, n, err);
    if (d) tgpu_train_device.close(d);
    trainer_free(t);
    c.gpus = 2, c.batch_size = 3;
    strcpy(c.device, "cuda");
    strcpy(c.data, "x"), strcpy(c.out, "y");
    CHECK(train_cfg_check(&c, err) != 0 && strstr(err, "is not a multiple of 'gpus'"), "batch 3 on 2 GPUs: %s", err);
    /* the loops */
    train_cfg a;
    train_cfg_defaults(&a, &train_family_aspan);
    a.hidden_size = 32, a.inner_hidden_size = 64, a.nb_heads = 4, a.nb_layers = 2, a.attn_span = 80;
    a.block_size = 16, a.batch_size = 8, a.adapt_span_ramp = 8, a.adapt_span_init = 0.1, a.lr = 0.07;
    a.lr_warmup = 10, a.dropout = 0.1;
    test_loop_multi(a, 2, "adaptive-span, 2 GPUs");
    p = tiny_par();
    p.n_blocks = 4, p.n_head = 4, p.d_head = 8, p.d_model = 32, p.d_inner = 64, p.mem_len = 16, p.tgt_len = 16;
    p.batch_size = 8, p.search_steps = 25, p.lr = 3e-3, p.arch_lr = 0.05, p.dropout = 0.1;
    test_loop_multi(p, 2, "par-transformer-xl, 2 GPUs");
}

int main(void)
{
    char err[ERR_LEN];
    if (tgpu_available(err)) {
        printf("SKIP test_train_gpu: %s\n", err);
        return test_summary("test_train_gpu");
    }
    static const double zf[8] = {0.31, 0.57, 0.43, 0.12, 0.9, 0.05, 0.66, 0.2};
    train_cfg c = tiny();
    compare_case(c, 7, zf, 5, "tiny adagrad");
    c.optim = OPT_ADAM;
    c.lr = 0.01;
    compare_case(c, 7, zf, 5, "tiny adam");
    /* dropout on the attention weights, the hidden layer and the embedding:
     * the CPU's masks (core/train_drop.h) */
    c = tiny();
    c.dropout = 0.3;
    c.emb_dropout = 0.2;
    compare_case(c, 7, zf, 4, "tiny dropout");

    /* a window trimmed to 8 of 200 (cache 72), blocks longer than S - W */
    static const double zs[8] = {0.0123, 0.0173, 0.01, 0.02, 0, 0, 0, 0};
    c = tiny();
    c.attn_span = 200;
    c.nb_layers = 1;
    compare_case(c, 7, zs, 3, "trimmed window");

    /* blocks longer than the span (M > S) */
    c = tiny();
    c.attn_span = 6;
    c.block_size = 9;
    c.adapt_span_ramp = 2;
    compare_case(c, 7, zf, 3, "block over span");

    /* heads of 64 like aspan-small, several streams, a span of two windows of 64 */
    c = tiny();
    c.hidden_size = 256;
    c.nb_heads = 4;
    c.inner_hidden_size = 128;
    c.attn_span = 160;
    c.block_size = 48;
    c.batch_size = 3;
    c.adapt_span_ramp = 32;
    c.adapt_span_loss = 2e-3;
    /* z = (z/S) S away from integers: the mask's clamp has kinks there, where
     * float32 and double may take different sides */
    static const double zm[8] = {0.3013, 0.8027, 0.0519, 0.5533, 0.9871, 0.0071, 0.4219, 0.7013};
    compare_case(c, 40, zm, 4, "heads of 64");

    /* the band's products against the full score matrices' on aspan-small's
     * heads: windows of 64, 128, 192 and 256 (z/S 0, .05, .12, .19 of 1024),
     * blocks of 100 (tiles past the block's end), 3 streams, dropout */
    c = tiny();
    c.nb_layers = 4, c.hidden_size = 256, c.nb_heads = 4, c.inner_hidden_size = 128, c.attn_span = 1024;
    c.block_size = 100, c.batch_size = 3, c.adapt_span_ramp = 32, c.adapt_span_loss = 2e-3;
    c.dropout = 0.1;
    static const double zb[4] = {0.0, 0.05, 0.12, 0.19};
    compare_band(c, zb, "fp32", "SPANSERVE_TRAIN_BAND_MAX=0", 1, 1e-4, "band fp32 / full, heads of 64");
    compare_band(c, zb, "tf32", "SPANSERVE_TRAIN_BAND_TC=0", 1, 1e-4, "band tf32 fused / tiles, heads of 64");
    compare_band(c, zb, "tf32", "SPANSERVE_TRAIN_BAND_MAX=0", 0, 5e-2, "band tf32 / full, heads of 64");
    compare_band(c, zb, "bf16", "SPANSERVE_TRAIN_BAND_MAX=0", 0, 5e-2, "band bf16 / full, heads of 64");
    /* heads of 16 and a window over the block (blocks of 40, windows of 64) */
    c.hidden_size = 64, c.block_size = 40, c.dropout = 0;
    compare_band(c, zb, "tf32", "SPANSERVE_TRAIN_BAND_TC=0", 1, 1e-4, "band tf32 fused / tiles, heads of 16");
    compare_band(c, zb, "fp32", "SPANSERVE_TRAIN_BAND_MAX=0", 1, 1e-4, "band fp32 / full, heads of 16");
    /* heads of 8: the tiles in tf32 too */
    c.hidden_size = 32;
    compare_band(c, zb, "tf32", "SPANSERVE_TRAIN_BAND_MAX=0", 0, 5e-2, "band tf32 / full, heads of 8");

    train_cfg f = tiny();
    f.hidden_size = 64, f.inner_hidden_size = 128, f.attn_span = 40, f.block_size = 16;
    test_fast(f, 0, "tf32");
    test_fast(f, 1, "bf16");
    f = tiny_par();
    f.d_model = 64, f.n_head = 2, f.d_head = 32, f.d_inner = 128, f.tgt_len = 16, f.mem_len = 16, f.batch_size = 4;
    test_fast(f, 1, "par bf16");

    train_cfg a;
    train_cfg_defaults(&a, &train_family_aspan);
    a.hidden_size = 32, a.inner_hidden_size = 64, a.nb_heads = 4, a.nb_layers = 2, a.attn_span = 80;
    a.block_size = 16, a.batch_size = 8, a.adapt_span_ramp = 8, a.adapt_span_init = 0.1, a.lr = 0.07;
    a.lr_warmup = 10;
    a.dropout = 0.1;
    a.emb_dropout = 0.05;
    test_loop(a, "adaptive-span");

    /* PAR: the memory filling (mem_len 7, blocks of 4), heads narrower
     * than the model (2 x 3 of 8), untied output */
    train_cfg p = tiny_par();
    compare_par(p, 9, 4, "par tiny");
    p.tie_weight = 0;
    compare_par(p, 9, 3, "par untied");
    /* no memory; a memory shorter than a block; Adagrad for the weights */
    p = tiny_par();
    p.mem_len = 0;
    compare_par(p, 9, 3, "par without memory");
    p = tiny_par();
    p.mem_len = 3, p.tgt_len = 5, p.optim = OPT_ADAGRAD, p.lr = 0.05;
    compare_par(p, 9, 3, "par short memory, adagrad");
    /* par-small's heads (4 x 32 of 128), several streams */
    p = tiny_par();
    p.n_blocks = 3, p.n_head = 4, p.d_head = 32, p.d_model = 128, p.d_inner = 256, p.mem_len = 40, p.tgt_len = 24;
    p.batch_size = 4;
    compare_par(p, 30, 3, "par heads of 32");
    /* dropout at Transformer-XL's sites and dropatt */
    p = tiny_par();
    p.dropout = 0.2;
    p.dropatt = 0.3;
    compare_par(p, 9, 3, "par dropout");

    /* the search ends at step 25, between the stop and the resume */
    p = tiny_par();
    p.n_blocks = 4, p.n_head = 4, p.d_head = 8, p.d_model = 32, p.d_inner = 64, p.mem_len = 16, p.tgt_len = 16;
    p.batch_size = 8, p.search_steps = 25, p.lr = 3e-3, p.arch_lr = 0.05;
    p.dropout = 0.1, p.dropatt = 0.1;
    test_loop(p, "par-transformer-xl");

    test_multi();

    /* (last: these draw from the shared generator) bf16 operands with
     * dropout on each site */
    train_cfg fd = tiny();
    fd.hidden_size = 64, fd.inner_hidden_size = 128, fd.attn_span = 40, fd.block_size = 16;
    fd.dropout = 0.1, fd.emb_dropout = 0.1;
    test_fast(fd, 1, "bf16 dropout");
    /* rows wider than LayerNorm's warp a row (1024): a block a row and the
     * column sums apart */
    c = tiny();
    c.hidden_size = 1040, c.nb_heads = 2, c.nb_layers = 1, c.inner_hidden_size = 16;
    compare_case(c, 7, zf, 0, "rows of 1040");   /* the gradients: Adagrad magnifies what float32 cannot resolve */
    /* the one-wait step */
    c = tiny();
    compare_fused(c, 7, 1, 4, "train_step aspan adagrad");
    c.optim = OPT_ADAM, c.lr = 0.01, c.dropout = 0.1;
    compare_fused(c, 7, 1, 4, "train_step aspan adam dropout");
    train_cfg fp = tiny_par();
    compare_fused(fp, 9, 1, 4, "train_step par search");
    fp.search_steps = 0;
    compare_fused(fp, 9, 1, 3, "train_step par fixed");
    c = tiny();
    c.bf16 = 1;
    compare_fused(c, 7, 1, 3, "train_step aspan bf16");
    fp = tiny_par();
    fp.bf16 = 1, fp.dropout = 0.1;
    compare_fused(fp, 9, 1, 3, "train_step par bf16");
    /* PAR's feed-forward branch on bf16 copies, with dropout on its sites */
    fp = tiny_par();
    fp.d_model = 64, fp.n_head = 2, fp.d_head = 32, fp.d_inner = 128, fp.tgt_len = 16, fp.mem_len = 16;
    fp.batch_size = 4, fp.dropout = 0.1;
    test_fast(fp, 1, "par bf16 dropout");
    test_fused_multi();
    return test_summary("test_train_gpu");
}
#endif
