/*
 * ops.c - CPU numeric building blocks (see ops.h). Matrix products go to the
 * BLAS; the rest accumulates in double so that float32 results stay within
 * rounding of the reference.
 */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

void ops_gemm_nt(float *C, int ldc, const float *A, int lda, const float *B, int ldb, int m, int n, int k)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        for (int i = 0; i < m; i++) memset(C + (size_t)i * ldc, 0, (size_t)n * sizeof *C);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

void ops_gemm_nn(float *C, int ldc, const float *A, int lda, const float *B, int ldb, int m, int n, int k)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        for (int i = 0; i < m; i++) memset(C + (size_t)i * ldc, 0, (size_t)n * sizeof *C);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

/* One product per stream, the very call the stream makes when forwarded
 * alone. A BLAS picks its kernel by the product's shape (OpenBLAS:
 * small-matrix kernels up to m*n*k = 100^3 on x86-64, GEMV for a single row
 * on arm64, the blocked kernel past those), the kernels round differently,
 * and one product over every stream's rows gave a stream other bits beside
 * others than alone (logprobs a few 1e-6 apart). Sharing only the products
 * that take the blocked kernel either way is not enough: OpenBLAS's Haswell
 * kernels still round a row by the rows around it. */
void ops_linear(float *y, const float *x, const float *W, const float *b, int B, int M, int in, int out)
{
    for (int s = 0; s < B; s++)
        ops_gemm_nt(y + (size_t)s * M * out, out, x + (size_t)s * M * in, in, W, in, M, out, in);
    if (b)
        for (size_t i = 0; i < (size_t)B * M; i++)
            for (int j = 0; j < out; j++) y[i * out + j] += b[j];
}

void ops_add_layernorm(float *x, const float *r, const float *w, const float *b, int n, int d)
{
    ops_add_layernorm_eps(x, r, w, b, n, d, 1e-5);
}

void ops_add_layernorm_eps(float *x, const float *r, const float *w, const float *b, int n, int d, double eps)
{
    for (int i = 0; i < n; i++) {
        float *row = x + (size_t)i * d;
        if (r)
            for (int j = 0; j < d; j++) row[j] += r[(size_t)i * d + j];
        double mean = 0, var = 0;
        for (int j = 0; j < d; j++) mean += row[j];
        mean /= d;
        for (int j = 0; j < d; j++) var += (row[j] - mean) * (row[j] - mean);
        var /= d;
        double inv = 1.0 / sqrt(var + eps);
        for (int j = 0; j < d; j++) row[j] = (float)((row[j] - mean) * inv) * w[j] + (b ? b[j] : 0.0f);
    }
}

void ops_gelu(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(0.5 * x[i] * (1.0 + erf(x[i] * 0.70710678118654752440)));
}

void ops_relu(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] < 0) x[i] = 0;
}

void ops_log_softmax(float *x, int n, int d)
{
    for (int i = 0; i < n; i++) {
        float *row = x + (size_t)i * d;
        float mx = row[0];
        for (int j = 1; j < d; j++)
            if (row[j] > mx) mx = row[j];
        double s = 0;
        for (int j = 0; j < d; j++) s += exp((double)row[j] - mx);
        double lse = mx + log(s);
        for (int j = 0; j < d; j++) row[j] = (float)((double)row[j] - lse);
    }
}
