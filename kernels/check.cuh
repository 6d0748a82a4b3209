/*
 * check.cuh - error checks of CUDA and cuBLAS calls, shared by the
 * inference core (gpu_internal.cuh) and the trainer (train_internal.cuh):
 * a failed call puts a message in err (core/err.h) and returns -1.
 */
#ifndef SPANSERVE_CHECK_CUH
#define SPANSERVE_CHECK_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "err.h"
}

#define CU_TRY(call, err, what)                                                                        \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) return err_set(err, "%s: %s", what, cudaGetErrorString(e_));            \
    } while (0)
#define BLAS_TRY(call, err, what)                                                                      \
    do {                                                                                               \
        cublasStatus_t s_ = (call);                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) return err_set(err, "%s: cuBLAS status %d", what, (int)s_);   \
    } while (0)
/* After a launch: a bad configuration shows here, a fault at the next sync. */
#define LAUNCH_TRY(err, what) CU_TRY(cudaGetLastError(), err, what)

#endif
