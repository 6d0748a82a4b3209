/*
 * test_grad.c - the CPU trainer's backward (core/train_*.c) against central
 * finite differences, for every element of every tensor of tiny models of
 * both families, in double precision, with the memory active (the checked
 * block follows blocks whose hidden states it attends to):
 *   - adaptive-span: z/S (current_val) of every head through the soft mask
 *     and the span loss; key_pe; every weight;
 *   - PAR: the search supernet (every branch and alpha through the
 *     Gumbel-softmax at a temperature), and a fixed architecture of all
 *     three kinds with an untied output layer;
 * both again with dropout at every site (the masks are fixed by the seed
 * and the step, so the loss is a function of the weights); the dropout
 * masks' rate, scale and independence; and the optimizers' updates against
 * values worked out by hand; and the table of families the config parser
 * finds them in.
 */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"
#include "err.h"
#include "model.h"
#include "train.h"
#include "train_drop.h"

#include <unistd.h>

static train_rng rng = {12345};

static void rand_tokens(int32_t *x, int32_t *y, int n, int V)
{
    for (int i = 0; i < n; i++) {
        x[i] = (int32_t)(train_rng_next(&rng) % (uint64_t)V);
        y[i] = (int32_t)(train_rng_next(&rng) % (uint64_t)V);
    }
}

/* Checks every element of every tensor: analytic vs (f(w+e) - f(w-e)) / 2e
 * of the loss nll + aux. Returns how many elements were checked. */
static long grad_check(trainer *t, const int32_t *x, const int32_t *y, const char *what)
{
    char err[ERR_LEN];
    double aux;
    double f0 = trainer_forward(t, x, y, 1, 0, &aux, err);
    CHECK(isfinite(f0), "%s: loss %g (%s)", what, f0, err);
    double *g = malloc(t->n * sizeof *g);
    memcpy(g, t->g, t->n * sizeof *g);
    const double eps = 1e-5;
    long checked = 0;
    for (int i = 0; i < t->n_tp; i++) {
        const tparam *p = &t->tp[i];
        double worst = 0, gmax = 0;
        size_t at = 0;
        for (size_t j = 0; j < p->n; j++) {
            double *w = t->w + p->off + j, keep = *w, a1, a2;
            *w = keep + eps;
            double fp = trainer_forward(t, x, y, 0, 0, &a1, err) + a1;
            *w = keep - eps;
            double fm = trainer_forward(t, x, y, 0, 0, &a2, err) + a2;
            *w = keep;
            double num = (fp - fm) / (2 * eps), ana = g[p->off + j];
            double e = fabs(num - ana) / (1e-6 + fabs(num));
            if (fabs(num - ana) > 1e-8 && e > worst) { worst = e; at = j; }
            gmax = fmax(gmax, fabs(ana));
            checked++;
        }
        CHECK(worst < 1e-4, "%s: %s[%zu]: relative error %.3g of the analytic gradient", what, p->name, at, worst);
        /* a gradient check of zeros would pass anything: every tensor that
         * takes part in the loss must have some gradient */
        if (train_param_active(t, i) && !(t->c.fam == &train_family_par && !t->searching && p->kind == TP_ALPHA))
            CHECK(gmax > 1e-9, "%s: %s has no gradient (max %g)", what, p->name, gmax);
    }
    free(g);
    return checked;
}

static void test_aspan(void)
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
    c.adapt_span_loss = 0.01;   /* large enough that its gradient shows */
    char err[ERR_LEN];
    trainer *t = trainer_new(&c, 7, err);
    CHECK(t != NULL, "trainer_new: %s", err);
    if (!t) return;
    trainer_init(t, 3);
    /* spans that cut the window at a non-integer z (no kink of the clamp within eps) */
    static const double zf[4] = {0.31, 0.57, 0.43, 0.12};
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) t->w[t->ly[l].zfrac + h] = zf[2 * l + h];
    int32_t x[10], y[10];
    double aux;
    /* two blocks fill the memory (5 + 5 of its 12 rows), then the checked one */
    for (int s = 0; s < 2; s++) {
        rand_tokens(x, y, 10, 7);
        trainer_forward(t, x, y, 0, 1, &aux, err);
    }
    double mem_abs = 0;
    for (size_t i = 0; i < (size_t)2 * 2 * 12 * 8; i++) mem_abs += fabs(t->mem[i]);
    CHECK(mem_abs > 1, "aspan: the memory was not carried (sum |mem| = %g)", mem_abs);
    int W, C;
    aspan_window(t, 0, &W, &C);
    CHECK(W == 12 && C == 12, "aspan: window %d, cache %d (expected 12, 12 for S = 12)", W, C);
    rand_tokens(x, y, 10, 7);
    long n = grad_check(t, x, y, "aspan");
    CHECK(n == (long)trainer_n_params(t), "aspan: checked %ld of %zu elements", n, trainer_n_params(t));

    /* the span loss alone: coeff * S * mean_h(z/S) per layer, and its gradient */
    trainer_forward(t, x, y, 0, 0, &aux, err);
    double want = 0;
    for (int i = 0; i < 4; i++) want += 0.01 * 12 * zf[i] / 2;
    CHECK_NEAR(aux, want, 1e-12, "aspan: span loss");
    double keep = t->w[t->ly[1].zfrac + 1], a1, a2;
    t->w[t->ly[1].zfrac + 1] = keep + 1e-4;
    trainer_forward(t, x, y, 0, 0, &a1, err);
    t->w[t->ly[1].zfrac + 1] = keep - 1e-4;
    trainer_forward(t, x, y, 0, 0, &a2, err);
    t->w[t->ly[1].zfrac + 1] = keep;
    CHECK_NEAR((a1 - a2) / 2e-4, 0.01 * 12 / 2, 1e-9, "aspan: d(span loss)/d(z/S)");

    /* a span so short the window is trimmed (S = 200, R = 4: max span ceil(3.46)+4 = 8,
     * trim_len = floor(min(199, 192) / 64) * 64 = 192, window 8, cache 72) */
    trainer_free(t);
    c.attn_span = 200;
    c.nb_layers = 1;
    t = trainer_new(&c, 7, err);
    trainer_init(t, 4);
    t->w[t->ly[0].zfrac] = 0.0123;
    t->w[t->ly[0].zfrac + 1] = 0.0173;   /* z = 3.46: ceil(z) + R = 8 */
    aspan_window(t, 0, &W, &C);
    CHECK(W == 8 && C == 72, "aspan: trimmed window %d, cache %d (expected 8, 72)", W, C);
    for (int s = 0; s < 2; s++) {
        rand_tokens(x, y, 10, 7);
        trainer_forward(t, x, y, 0, 1, &aux, err);
    }
    rand_tokens(x, y, 10, 7);
    grad_check(t, x, y, "aspan trimmed");
    trainer_free(t);

    /* dropout on the attention weights, the hidden layer and the embedding */
    c.attn_span = 12;
    c.nb_layers = 2;
    c.dropout = 0.3;
    c.emb_dropout = 0.2;
    t = trainer_new(&c, 7, err);
    trainer_init(t, 3);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) t->w[t->ly[l].zfrac + h] = zf[2 * l + h];
    t->step = 17;
    for (int s = 0; s < 2; s++) {
        rand_tokens(x, y, 10, 7);
        trainer_forward(t, x, y, 0, 1, &aux, err);
    }
    rand_tokens(x, y, 10, 7);
    grad_check(t, x, y, "aspan dropout");
    /* the masks change the loss, evaluation has none, and the next step draws others */
    double with = trainer_forward(t, x, y, 0, 0, &aux, err);
    t->drop = 0;
    double without = trainer_forward(t, x, y, 0, 0, &aux, err);
    t->drop = 1;
    t->step++;
    double next = trainer_forward(t, x, y, 0, 0, &aux, err);
    CHECK(fabs(with - without) > 1e-3 && fabs(next - with) > 1e-3, "aspan dropout: loss %g, without dropout %g, "
          "next step %g", with, without, next);
    c.dropout = c.emb_dropout = 0;
    trainer *t0 = trainer_new(&c, 7, err);
    trainer_init(t0, 3);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) t0->w[t0->ly[l].zfrac + h] = zf[2 * l + h];
    memcpy(t0->mem, t->mem, trainer_mem_floats(t) * sizeof *t->mem);
    CHECK(trainer_forward(t0, x, y, 0, 0, &aux, err) == without, "aspan dropout: evaluation differs from a model "
          "without dropout");
    trainer_free(t0);
    trainer_free(t);
}

/* the masks: the kept fraction is 1 - p, a kept element is scaled by
 * 1/(1-p), the sites, layers and steps draw different masks, the same
 * numbers the same mask */
static void test_dropout_masks(void)
{
    const size_t n = 1 << 20;
    td_site a = td_make(1, 5, TD_FF, 2, 0.3), b = td_make(1, 5, TD_FF, 2, 0.3), s2 = td_make(1, 6, TD_FF, 2, 0.3),
            l2 = td_make(1, 5, TD_FF, 3, 0.3), k2 = td_make(1, 5, TD_ATT, 2, 0.3), d2 = td_make(2, 5, TD_FF, 2, 0.3),
            none = td_make(1, 5, TD_FF, 2, 0);
    size_t kept = 0, same_s = 0, same_l = 0, same_k = 0, same_d = 0, differ = 0, dropped0 = 0;
    double mean = 0;
    for (size_t i = 0; i < n; i++) {
        const int ka = td_kept(&a, i);
        kept += ka;
        mean += td_factor(&a, i);
        differ += ka != td_kept(&b, i);
        same_s += ka == td_kept(&s2, i);
        same_l += ka == td_kept(&l2, i);
        same_k += ka == td_kept(&k2, i);
        same_d += ka == td_kept(&d2, i);
        dropped0 += td_factor(&none, i) != 1.0;
    }
    CHECK(differ == 0, "dropout: the same site draws another mask at %zu elements", differ);
    CHECK(dropped0 == 0, "dropout: p = 0 drops %zu elements", dropped0);
    /* independent masks agree on 0.7^2 + 0.3^2 = 58% of the elements */
    CHECK(fabs((double)kept / n - 0.7) < 3e-3, "dropout: kept %.4f (expected 0.7)", (double)kept / n);
    CHECK(fabs(mean / n - 1.0) < 5e-3, "dropout: the mean factor %.4f (expected 1)", mean / n);
    CHECK(fabs((double)same_s / n - 0.58) < 3e-3 && fabs((double)same_l / n - 0.58) < 3e-3 &&
              fabs((double)same_k / n - 0.58) < 3e-3 && fabs((double)same_d / n - 0.58) < 3e-3,
          "dropout: masks of another step %.4f, layer %.4f, site %.4f, seed %.4f agree (expected 0.58)",
          (double)same_s / n, (double)same_l / n, (double)same_k / n, (double)same_d / n);
    CHECK(fabs(td_factor(&a, 0) + td_factor(&a, 1) + td_factor(&a, 2) + td_factor(&a, 3)) > 0 &&
              fabs(a.scale - 1 / 0.7) < 1e-6,
          "dropout: scale %g (expected 1/0.7)", a.scale);
}

static train_cfg par_cfg(int tie)
{
    train_cfg c;
    train_cfg_defaults(&c, &train_family_par);
    c.n_blocks = 3;
    c.n_head = 2;
    c.d_model = 8;
    c.d_head = 3;
    c.d_inner = 12;
    c.mem_len = 6;
    c.tgt_len = 4;
    c.batch_size = 2;
    c.tie_weight = tie;
    return c;
}

static void test_par(void)
{
    char err[ERR_LEN];
    double aux;
    int32_t x[8], y[8];
    /* the supernet while searching, tied output */
    train_cfg c = par_cfg(1);
    trainer *t = trainer_new(&c, 7, err);
    CHECK(t != NULL, "trainer_new: %s", err);
    if (!t) return;
    trainer_init(t, 5);
    CHECK(t->searching, "par: a config with search_steps starts searching");
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 3; k++) t->w[t->ly[b].alpha + k] = 0.3 * (k - b) + 0.1 * b;
    /* LayerNorm weights away from 1 and biases away from 0 so their gradients differ from a plain LN */
    for (int i = 0; i < t->n_tp; i++)
        if (strstr(t->tp[i].name, "layer_norm") || strstr(t->tp[i].name, "bias"))
            for (size_t j = 0; j < t->tp[i].n; j++) t->w[t->tp[i].off + j] += 0.2 * (train_rng_unif(&rng) - 0.5);
    t->tau = 0.7;
    double gn[9];
    for (int s = 0; s < 2; s++) {   /* memories 4 rows, then 6 (full) */
        rand_tokens(x, y, 8, 7);
        trainer_forward(t, x, y, 0, 1, &aux, err);
    }
    CHECK(t->mlen[0] == 6 && t->mlen[2] == 6, "par: memory rows %d, %d (expected 6)", t->mlen[0], t->mlen[2]);
    for (int i = 0; i < 9; i++) gn[i] = -log(-log(train_rng_unif(&rng)));
    par_set_mix(t, gn);
    rand_tokens(x, y, 8, 7);
    long n = grad_check(t, x, y, "par search");
    CHECK(n == (long)trainer_n_params(t), "par: checked %ld of %zu elements", n, trainer_n_params(t));
    double s = 0;
    for (int k = 0; k < 3; k++) s += t->mix[3 + k];
    CHECK_NEAR(s, 1.0, 1e-12, "par: block weights sum to 1");
    trainer_free(t);

    /* a fixed architecture of each kind, untied output */
    c = par_cfg(0);
    t = trainer_new(&c, 7, err);
    trainer_init(t, 6);
    for (int b = 0; b < 3; b++) t->w[t->ly[b].alpha + (b + 1) % 3] = 1.0;   /* ffn, skip, attn */
    par_fix_arch(t);
    CHECK(t->arch[0] == BLK_FFN && t->arch[1] == BLK_SKIP && t->arch[2] == BLK_ATTN, "par: argmax arch %d %d %d",
          t->arch[0], t->arch[1], t->arch[2]);
    for (int s2 = 0; s2 < 3; s2++) {
        rand_tokens(x, y, 8, 7);
        trainer_forward(t, x, y, 0, 1, &aux, err);
    }
    rand_tokens(x, y, 8, 7);
    grad_check(t, x, y, "par fixed");
    /* what the fixed model does not use has no gradient and is not active */
    int inactive = 0;
    for (int i = 0; i < t->n_tp; i++) {
        double gm = 0;
        for (size_t j = 0; j < t->tp[i].n; j++) gm = fmax(gm, fabs(t->g[t->tp[i].off + j]));
        if (!train_param_active(t, i)) {
            inactive++;
            CHECK(gm == 0, "par fixed: unused %s has gradient %g", t->tp[i].name, gm);
        }
    }
    CHECK(inactive == 3 + 5 + 6 + 6 + 5, "par fixed: %d inactive tensors (alpha x3, block 0's attention, "
          "block 1's both branches, block 2's feed-forward)", inactive);
    trainer_free(t);
}

/* PAR with dropout at every site and dropatt, searching and fixed */
static void test_par_dropout(void)
{
    char err[ERR_LEN];
    double aux;
    int32_t x[8], y[8];
    for (int fixed = 0; fixed < 2; fixed++) {
        train_cfg c = par_cfg(fixed);
        c.dropout = 0.25;
        c.dropatt = 0.3;
        trainer *t = trainer_new(&c, 7, err);
        trainer_init(t, 8);
        t->step = 4;
        if (fixed) {
            for (int b = 0; b < 3; b++) t->w[t->ly[b].alpha + (b == 1 ? 1 : 0)] = 1.0;   /* attn, ffn, attn */
            par_fix_arch(t);
        } else {
            t->tau = 0.8;
            double gn[9];
            for (int i = 0; i < 9; i++) gn[i] = -log(-log(train_rng_unif(&rng)));
            par_set_mix(t, gn);
        }
        for (int s = 0; s < 2; s++) {
            rand_tokens(x, y, 8, 7);
            trainer_forward(t, x, y, 0, 1, &aux, err);
        }
        rand_tokens(x, y, 8, 7);
        grad_check(t, x, y, fixed ? "par dropout fixed" : "par dropout search");
        double with = trainer_forward(t, x, y, 0, 0, &aux, err);
        t->drop = 0;
        double without = trainer_forward(t, x, y, 0, 0, &aux, err);
        t->drop = 1;
        CHECK(fabs(with - without) > 1e-3, "par dropout: loss %g, without dropout %g", with, without);
        trainer_free(t);
    }
}

/* Updates worked out by hand on a one-layer model's tensors. */
static void test_optim(void)
{
    train_cfg c;
    train_cfg_defaults(&c, &train_family_aspan);
    c.nb_layers = 1; c.hidden_size = 4; c.nb_heads = 1; c.inner_hidden_size = 4;
    c.attn_span = 4; c.block_size = 2; c.batch_size = 1;
    c.grad_clip = 0.5;
    char err[ERR_LEN];
    trainer *t = trainer_new(&c, 3, err);
    CHECK(t != NULL, "trainer_new: %s", err);
    if (!t) return;
    /* Adagrad: out_emb.bias g = (3, 4, 0): ||g|| = 5 > 0.5, clr = 0.1 * 0.5/5;
     * sum = g^2, w -= clr g / (|g| + 1e-10) = clr sign(g) */
    memset(t->g, 0, t->n * sizeof *t->g);
    double *b = t->w + t->out_b, *gb = t->g + t->out_b;
    gb[0] = 3; gb[1] = 4;
    t->w[t->ly[0].zfrac] = 0.99;
    t->g[t->ly[0].zfrac] = -1;   /* pushes z/S past 1: clamped */
    train_optim_step(t, 0.1, 0);
    double clr = 0.1 * 0.5 / (5 + 1e-10);
    CHECK_NEAR(b[0], -clr * 3 / (3 + 1e-10), 1e-15, "adagrad clipped update [0]");
    CHECK_NEAR(b[1], -clr * 4 / (4 + 1e-10), 1e-15, "adagrad clipped update [1]");
    CHECK(b[2] == 0, "adagrad: zero gradient, no move (%g)", b[2]);
    CHECK(t->w[t->ly[0].zfrac] == 1.0, "z/S clamped to 1 (%g)", t->w[t->ly[0].zfrac]);
    /* second step, small gradient (no clipping): sum = 9 + 0.01 */
    gb[0] = 0.1; gb[1] = 0;
    double b0 = b[0];
    train_optim_step(t, 0.1, 0);
    CHECK_NEAR(b[0], b0 - 0.1 * 0.1 / (sqrt(9.01) + 1e-10), 1e-15, "adagrad accumulated update");
    /* warm-up */
    c.lr = 0.07; c.lr_warmup = 300;
    CHECK_NEAR(train_lr(&c, 1), 0.07 / 300, 1e-18, "warm-up at step 1");
    CHECK_NEAR(train_lr(&c, 150), 0.035, 1e-15, "warm-up at step 150");
    CHECK_NEAR(train_lr(&c, 300), 0.07, 0, "warm-up ends at step lr_warmup");
    CHECK_NEAR(train_lr(&c, 5000), 0.07, 0, "after warm-up");
    trainer_free(t);

    /* Adam with global clipping: every gradient zero but out_emb.bias (3, 4, 0) */
    c.optim = OPT_ADAM;
    c.grad_clip = 1.0;
    t = trainer_new(&c, 3, err);
    memset(t->g, 0, t->n * sizeof *t->g);
    b = t->w + t->out_b;
    gb = t->g + t->out_b;
    gb[0] = 3; gb[1] = 4;
    train_optim_step(t, 0.01, 0);
    /* clipped g = (0.6, 0.8) / (1 + 2e-7 ...): first Adam step moves by lr * g/(|g| + eps') ~ lr */
    double gc = 3 * (1.0 / (5 + 1e-6));
    double m = 0.1 * gc, v = 0.001 * gc * gc;
    CHECK_NEAR(b[0], -0.01 / 0.1 * m / (sqrt(v) / sqrt(0.001) + 1e-8), 1e-15, "adam first step");
    CHECK(b[2] == 0, "adam: zero gradient, no move (%g)", b[2]);
    trainer_free(t);
}

/* The trainer's forward equals the serving forward (core/aspan.c, par.c,
 * which match the reference fixtures) on the checkpoint it writes: same
 * log-probabilities over consecutive blocks with the memory carried. */
static void serving_forward(train_cfg *c, const char *what)
{
    char err[ERR_LEN], path[] = "/tmp/spanserve_test_grad_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    trainer *t = trainer_new(c, 7, err);
    CHECK(t != NULL, "%s: trainer_new: %s", what, err);
    if (!t) return;
    trainer_init(t, 9);
    if (c->fam == &train_family_aspan)
        for (int l = 0; l < t->L; l++)
            for (int h = 0; h < t->K; h++) t->w[t->ly[l].zfrac + h] = 0.05 + 0.03 * h + 0.02 * l;
    else {
        for (int b = 0; b < t->L; b++) t->w[t->ly[b].alpha + (b * 2) % 3] = 1.0;   /* attn, skip, ffn, attn */
        par_fix_arch(t);
    }
    for (size_t i = 0; i < t->n; i++) t->w[i] = (float)t->w[i];   /* the checkpoint's float32 values */
    CHECK(trainer_save_checkpoint(t, path, "[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\"]", NULL, err) == 0,
          "%s: save: %s", what, err);
    model_t *m = model_load(path, err);
    CHECK(m != NULL, "%s: the checkpoint does not load: %s", what, err);
    if (m) {
        mem_t *mems[2] = {mem_new(m), mem_new(m)};
        fwd_ws *ws = ws_new();
        const int B = t->B, M = t->M, V = 7;
        int32_t x[64], y[64];
        float lp[64 * 7];
        double worst = 0;
        for (int blk = 0; blk < 4; blk++) {
            rand_tokens(x, y, B * M, V);
            double aux;
            trainer_forward(t, x, y, 0, 1, &aux, err);
            CHECK(model_forward(m, mems, B, x, M, lp, ws, err) == 0, "%s: model_forward: %s", what, err);
            for (int i = 0; i < B * M * V; i++) worst = fmax(worst, fabs(lp[i] - t->logp[i]));
        }
        CHECK(worst < 2e-5, "%s: trainer and server log-probabilities differ by %g", what, worst);
        mem_free(mems[0]);
        mem_free(mems[1]);
        ws_free(ws);
        model_free(m);
    }
    unlink(path);
    trainer_free(t);
}

static void test_serving(void)
{
    train_cfg c;
    train_cfg_defaults(&c, &train_family_aspan);
    c.nb_layers = 2; c.hidden_size = 8; c.nb_heads = 2; c.inner_hidden_size = 12;
    c.attn_span = 12; c.block_size = 5; c.batch_size = 2; c.adapt_span_ramp = 4;
    serving_forward(&c, "aspan S=12");
    c.attn_span = 80;   /* z = 4..6.4: window 16 of 80 (trim_len 64), cache 80 */
    serving_forward(&c, "aspan trimmed");
    c = par_cfg(1);
    c.n_blocks = 4;
    serving_forward(&c, "par tied");
    c = par_cfg(0);
    c.n_blocks = 4;
    serving_forward(&c, "par untied");
}

/* The table (core/train_family.c): found by name, listed in errors, and a
 * family's own keys refused in another's config, naming their owner. */
static void test_families(void)
{
    char names[256], err[ERR_LEN];
    train_cfg c;
    CHECK(train_family_find("adaptive-span") == &train_family_aspan &&
          train_family_find("par-transformer-xl") == &train_family_par && !train_family_find("gpt") &&
          !train_family_find(NULL), "train_family_find");
    train_family_names(names, sizeof names, 0, "\"");
    CHECK(strcmp(names, "\"adaptive-span\" or \"par-transformer-xl\"") == 0, "names: %s", names);
    train_family_names(names, sizeof names, 1, "");
    CHECK(strcmp(names, "adaptive-span or par-transformer-xl") == 0, "the CUDA trainer's: %s", names);
    CHECK(train_cfg_from_json(&c, "{\"family\": \"gpt\"}", "t", err) != 0 &&
          strcmp(err, "t: config 'family' = \"gpt\" is not \"adaptive-span\" or \"par-transformer-xl\"") == 0,
          "unknown family: %s", err);
    CHECK(train_cfg_from_json(&c, "{\"family\": \"adaptive-span\", \"mem_len\": 3}", "t", err) != 0 &&
          strcmp(err, "t: config key 'mem_len' belongs to par-transformer-xl, not adaptive-span") == 0,
          "another family's key: %s", err);
    /* the CUDA trainer's key, of both families now */
    CHECK(train_cfg_from_json(&c, "{\"family\": \"par-transformer-xl\", \"tf32\": true}", "t", err) == 0 && c.tf32,
          "the CUDA trainer's key: %s", err);
    CHECK(train_cfg_from_json(&c, "{\"family\": \"par-transformer-xl\", \"tgt_len\": 5}", "t", err) == 0 &&
          c.fam == &train_family_par && c.fam->block_len(&c) == 5 && c.fam->mem_rows(&c) == 96,
          "a PAR config: %s", err);
}

int main(void)
{
    test_dropout_masks();
    test_par_dropout();
    test_families();
    test_aspan();
    test_par();
    test_optim();
    test_serving();
    return test_summary("test_grad");
}
