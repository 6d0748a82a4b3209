/*
 * train_ops.h - the trainer's numeric building blocks in double precision,
 * each with its backward: matrix products (cblas_dgemm), linear layers,
 * LayerNorm, ReLU, log-softmax with the negative log-likelihood.
 */
#ifndef SPANSERVE_TRAIN_OPS_H
#define SPANSERVE_TRAIN_OPS_H

#include <stddef.h>
#include <stdint.h>

/* C[m x n] = alpha op(A) op(B) + beta C, row-major; TA/TB: 1 = transposed. */
void tops_gemm(int ta, int tb, int m, int n, int k, double alpha, const double *A, int lda, const double *B,
               int ldb, double beta, double *C, int ldc);
/* y[n x out] = x[n x in] W^T (+ b), W is out x in. */
void tops_linear(double *y, const double *x, const double *W, const double *b, int n, int in, int out);
/* Backward of tops_linear: dW += dy^T x, db += sum_rows dy (if db), and
 * dx = dy W (ACC = 0) or dx += dy W (ACC = 1) (if dx). */
void tops_linear_back(double *dx, int acc, double *dW, double *db, const double *dy, const double *x,
                      const double *W, int n, int in, int out);
/* y = LayerNorm(x) * w + b per row of d (eps 1e-5, biased variance); keeps
 * xhat (n x d) and 1/sigma (n) for the backward. y may be x. */
void tops_layernorm(double *y, double *xhat, double *rstd, const double *x, const double *w, const double *b,
                    int n, int d);
/* dx += LN backward of dy; dw += sum dy*xhat, db += sum dy. */
void tops_layernorm_back(double *dx, double *dw, double *db, const double *dy, const double *xhat,
                         const double *rstd, const double *w, int n, int d);
/* Row-wise log-softmax of x[n x V] in place; returns sum_i -x[i][y_i]. */
double tops_logsoftmax_nll(double *x, const int32_t *y, int n, int V);
/* In place: logp -> d(SCALE * sum nll)/dlogits = SCALE (softmax - onehot). */
void tops_nll_back(double *logp, const int32_t *y, int n, int V, double scale);

#endif
