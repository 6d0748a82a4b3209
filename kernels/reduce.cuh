/*
 * reduce.cuh - block-wide sums and maxima (warp shuffles, then one value per
 * warp through shared memory). Every thread of the block must call them;
 * every thread gets the result.
 */
#ifndef SPANSERVE_REDUCE_CUH
#define SPANSERVE_REDUCE_CUH

template <typename T> __device__ __forceinline__ T warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* SCRATCH: at least 32 values of T in shared memory. */
template <typename T> __device__ T block_sum(T v, T *scratch)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();   /* scratch may still be read by an earlier call */
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    T t = 0;
    for (int i = 0; i < nw; i++) t += scratch[i];
    return t;
}

__device__ inline float block_max(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int i = 0; i < nw; i++) t = fmaxf(t, scratch[i]);
    return t;
}

/* Thirty-two dot products at once: lane l holds V[j], its partial sum of
 * product j; returns the whole sum of product `lane` (over all lanes). Each
 * step halves the products a lane carries and doubles the lanes summed:
 * 16 + 8 + 4 + 2 + 1 = 31 shuffles for 32 sums. (Steps as templates, so that
 * every index is a constant and V stays in registers.) */
template <int OFF> __device__ __forceinline__ void transpose_step(float (&v)[32], int lane)
{
    const bool upper = lane & OFF;
#pragma unroll
    for (int j = 0; j < OFF; j++) {
        const float lo = v[j], hi = v[j + OFF];
        const float send = upper ? lo : hi, keep = upper ? hi : lo;
        v[j] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
    }
}

__device__ __forceinline__ float warp_transpose_sum(float (&v)[32], int lane)
{
    transpose_step<16>(v, lane);
    transpose_step<8>(v, lane);
    transpose_step<4>(v, lane);
    transpose_step<2>(v, lane);
    transpose_step<1>(v, lane);
    return v[0];
}

#endif
