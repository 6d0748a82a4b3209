/*
 * ops.h - the small numeric building blocks of the CPU forward: matrix
 * products through cblas, LayerNorm, ReLU, log-softmax.
 */
#ifndef SPANSERVE_OPS_H
#define SPANSERVE_OPS_H

#include <stddef.h>

/* y = x W^T (+ b) for B streams of M rows each (x is B*M x in, y B*M x out),
 * W is out x in (PyTorch's Linear layout). A stream's rows get the same bits
 * whatever streams are beside it. */
void ops_linear(float *y, const float *x, const float *W, const float *b, int B, int M, int in, int out);
/* C[m x n] = A[m x k] B[n x k]^T, with leading dimensions. */
void ops_gemm_nt(float *C, int ldc, const float *A, int lda, const float *B, int ldb, int m, int n, int k);
/* C[m x n] = A[m x k] B[k x n], with leading dimensions. */
void ops_gemm_nn(float *C, int ldc, const float *A, int lda, const float *B, int ldb, int m, int n, int k);
/* x[n x d] = LayerNorm(x + r) * w + b (eps 1e-5, biased variance); r and b may be NULL. */
void ops_add_layernorm(float *x, const float *r, const float *w, const float *b, int n, int d);
/* The same with epsilon EPS (Keras' LayerNormalization: 1e-3). */
void ops_add_layernorm_eps(float *x, const float *r, const float *w, const float *b, int n, int d, double eps);
void ops_relu(float *x, size_t n);
/* x * Phi(x), the exact (erf) GELU */
void ops_gelu(float *x, size_t n);
/* Row-wise log-softmax of x[n x d], in place. */
void ops_log_softmax(float *x, int n, int d);

#endif
