/*
 * train_ops.c - double-precision building blocks of the trainer and their
 * backwards (see train_ops.h). Matrix products go to the BLAS.
 */
#include "train_ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

void tops_gemm(int ta, int tb, int m, int n, int k, double alpha, const double *A, int lda, const double *B,
               int ldb, double beta, double *C, int ldc)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {   /* BLAS leaves C alone when k = 0 only for beta = 1 */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) C[(size_t)i * ldc + j] *= beta;
        return;
    }
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

void tops_linear(double *y, const double *x, const double *W, const double *b, int n, int in, int out)
{
    tops_gemm(0, 1, n, out, in, 1.0, x, in, W, in, 0.0, y, out);
    if (b)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < out; j++) y[(size_t)i * out + j] += b[j];
}

void tops_linear_back(double *dx, int acc, double *dW, double *db, const double *dy, const double *x,
                      const double *W, int n, int in, int out)
{
    tops_gemm(1, 0, out, in, n, 1.0, dy, out, x, in, 1.0, dW, in);
    if (db)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < out; j++) db[j] += dy[(size_t)i * out + j];
    if (dx) tops_gemm(0, 0, n, in, out, 1.0, dy, out, W, in, acc ? 1.0 : 0.0, dx, in);
}

void tops_layernorm(double *y, double *xhat, double *rstd, const double *x, const double *w, const double *b,
                    int n, int d)
{
    for (int i = 0; i < n; i++) {
        const double *xr = x + (size_t)i * d;
        double *hr = xhat + (size_t)i * d, *yr = y + (size_t)i * d;
        double mean = 0, var = 0;
        for (int j = 0; j < d; j++) mean += xr[j];
        mean /= d;
        for (int j = 0; j < d; j++) var += (xr[j] - mean) * (xr[j] - mean);
        var /= d;
        double r = 1.0 / sqrt(var + 1e-5);
        rstd[i] = r;
        for (int j = 0; j < d; j++) hr[j] = (xr[j] - mean) * r;
        for (int j = 0; j < d; j++) yr[j] = hr[j] * w[j] + b[j];
    }
}

/* With g = dy * w: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
void tops_layernorm_back(double *dx, double *dw, double *db, const double *dy, const double *xhat,
                         const double *rstd, const double *w, int n, int d)
{
    for (int i = 0; i < n; i++) {
        const double *gr = dy + (size_t)i * d, *hr = xhat + (size_t)i * d;
        double *dr = dx + (size_t)i * d;
        double mg = 0, mgh = 0;
        for (int j = 0; j < d; j++) {
            double g = gr[j] * w[j];
            mg += g;
            mgh += g * hr[j];
            dw[j] += gr[j] * hr[j];
            db[j] += gr[j];
        }
        mg /= d;
        mgh /= d;
        for (int j = 0; j < d; j++) dr[j] += rstd[i] * (gr[j] * w[j] - mg - hr[j] * mgh);
    }
}

double tops_logsoftmax_nll(double *x, const int32_t *y, int n, int V)
{
    double nll = 0;
    for (int i = 0; i < n; i++) {
        double *r = x + (size_t)i * V, mx = r[0], s = 0;
        for (int j = 1; j < V; j++) mx = r[j] > mx ? r[j] : mx;
        for (int j = 0; j < V; j++) s += exp(r[j] - mx);
        double lse = mx + log(s);
        for (int j = 0; j < V; j++) r[j] -= lse;
        nll -= r[y[i]];
    }
    return nll;
}

void tops_nll_back(double *logp, const int32_t *y, int n, int V, double scale)
{
    for (int i = 0; i < n; i++) {
        double *r = logp + (size_t)i * V;
        for (int j = 0; j < V; j++) r[j] = scale * exp(r[j]);
        r[y[i]] -= scale;
    }
}
