/*
 * logsoftmax.cu - the output distribution: y = log_softmax(y + b) per row of
 * V logits, in place. The bias (NULL: none, as nanoGPT's head) is added in
 * float (as core's ops_linear), the sum of exp(y - max) is taken in double
 * (as core's ops_log_softmax). One block per row.
 */
#include "gpu_internal.cuh"
#include "reduce.cuh"

__global__ static void log_softmax_kernel(float *y, const float *b, int d)
{
    __shared__ float fs[32];
    __shared__ double ds[32];
    float *row = y + (size_t)blockIdx.x * d;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = b ? row[j] + b[j] : row[j];
        row[j] = v;
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx, fs);
    double s = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) s += exp((double)row[j] - mx);
    const double lse = mx + log(block_sum(s, ds));
    for (int j = threadIdx.x; j < d; j += blockDim.x) row[j] = (float)((double)row[j] - lse);
}

int gpu_log_softmax(gpu_model *g, float *y, const float *b, int n, int d, char *err)
{
    int threads = d >= 1024 ? 256 : d >= 128 ? 128 : 64;
    log_softmax_kernel<<<n, threads, 0, g->stream>>>(y, b, d);
    LAUNCH_TRY(err, "log_softmax");
    return 0;
}

__global__ static void gather_kernel(float *tl, const float *y, const int32_t *tgt, int n, int d)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && tgt[i] >= 0) tl[i] = y[(size_t)i * d + tgt[i]];
}

int gpu_gather_targets(gpu_model *g, float *tl, const float *y, const int32_t *tgt, int n, int d, char *err)
{
    gather_kernel<<<(n + 255) / 256, 256, 0, g->stream>>>(tl, y, tgt, n, d);
    LAUNCH_TRY(err, "gather_targets");
    return 0;
}
