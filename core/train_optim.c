/*
 * train_optim.c - the optimizers of the two reference recipes.
 *
 *   adagrad  the adaptive-span reference's AdagradWithGradClip: per tensor,
 *            clr = lr, scaled by clip / (||g|| + 1e-10) when ||g|| > clip;
 *            sum += g^2;  w -= clr g / (sqrt(sum) + 1e-10).
 *   adam     PyTorch's Adam (bias-corrected) after the Transformer-XL
 *            reference's clip_grad_norm_: the gradients of all weights
 *            scaled by clip / (||g|| + 1e-6) when their global norm is over
 *            clip.
 * PAR's alpha always follows Adam at arch_lr, unclipped. After each update
 * the adaptive-span current_val (z/S) is clamped to [0, 1].
 */
#include "train.h"

#include <math.h>

double train_lr(const train_cfg *c, long s)
{
    return c->lr_warmup > 0 && s < c->lr_warmup ? c->lr * (double)s / (double)c->lr_warmup : c->lr;
}

int train_param_active(const trainer *t, int i)
{
    /* a search trains every branch and alpha; a fixed architecture only
     * its branches (tensors of no branch, -1, always) */
    const tparam *p = &t->tp[i];
    if (t->searching) return 1;
    if (p->kind == TP_ALPHA) return 0;
    return p->branch < 0 || p->branch == (int)t->arch[p->layer];
}

static void adam(trainer *t, const tparam *p, double lr, double gscale)
{
    const double b1 = t->c.beta1, b2 = t->c.beta2, eps = t->c.adam_eps;
    const double bc1 = 1.0 - pow(b1, (double)t->step), bc2 = 1.0 - pow(b2, (double)t->step);
    double *w = t->w + p->off, *g = t->g + p->off, *m = t->m1 + p->off, *v = t->m2 + p->off;
    for (size_t j = 0; j < p->n; j++) {
        double gj = g[j] * gscale;
        m[j] = b1 * m[j] + (1 - b1) * gj;
        v[j] = b2 * v[j] + (1 - b2) * gj * gj;
        w[j] -= lr / bc1 * m[j] / (sqrt(v[j]) / sqrt(bc2) + eps);
    }
}

void train_optim_step(trainer *t, double lr, double arch_lr)
{
    t->step++;
    const double clip = t->c.grad_clip;
    double gscale = 1.0;
    if (t->c.optim == OPT_ADAM && clip > 0) {
        double ss = 0;
        for (int i = 0; i < t->n_tp; i++)
            if (t->tp[i].kind != TP_ALPHA && train_param_active(t, i))
                for (size_t j = 0; j < t->tp[i].n; j++) ss += t->g[t->tp[i].off + j] * t->g[t->tp[i].off + j];
        double coef = clip / (sqrt(ss) + 1e-6);
        if (coef < 1) gscale = coef;
    }
    for (int i = 0; i < t->n_tp; i++) {
        const tparam *p = &t->tp[i];
        if (!train_param_active(t, i)) continue;
        if (p->kind == TP_ALPHA) { adam(t, p, arch_lr, 1.0); continue; }
        if (t->c.optim == OPT_ADAM) { adam(t, p, lr, gscale); continue; }
        double *w = t->w + p->off, *g = t->g + p->off, *s = t->m1 + p->off, ss = 0, clr = lr;
        for (size_t j = 0; j < p->n; j++) ss += g[j] * g[j];
        double norm = sqrt(ss);
        if (clip > 0 && norm > clip) clr *= clip / (norm + 1e-10);
        for (size_t j = 0; j < p->n; j++) {
            s[j] += g[j] * g[j];
            w[j] -= clr * g[j] / (sqrt(s[j]) + 1e-10);
        }
    }
    for (int i = 0; i < t->n_tp; i++)
        if (t->tp[i].kind == TP_ZFRAC)
            for (size_t j = 0; j < t->tp[i].n; j++) {
                double *z = t->w + t->tp[i].off + j;
                *z = *z < 0 ? 0 : *z > 1 ? 1 : *z;
            }
}
