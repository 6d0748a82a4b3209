/*
 * train_gpu.h - the CUDA trainer of both families: the training step of
 * core/train_aspan.c and core/train_par.c (forward with the activations
 * kept, backward, Adagrad or Adam of core/train_optim.c, the z/S clamp,
 * PAR's search, the memory carried between blocks) on the device, in
 * float32.
 *
 * A tgpu mirrors a host trainer (core/train.h): the parameter, gradient and
 * moment arenas have the host's layout (every tparam at its offset), the
 * memories the host's layout (per layer, B x mem_rows x H). The host
 * trainer keeps the configuration, the step count, the search (tau, the
 * Gumbel noise, the fixed architecture) and a copy of z/S (current_val)
 * and alpha, which the host needs to choose each layer's window and each
 * block's weights; tgpu_step brings that copy up to date. The memory rows
 * in use (t->mlen) come with tgpu_download. Everything else lives on the
 * device until tgpu_download.
 *
 * Linear layers go through cuBLAS SGEMM in float32 (no TF32), so that the
 * gradients agree with the double-precision CPU trainer to about 1e-5;
 * every reduction is done in a fixed order (no atomics), so a run is
 * deterministic on one device.
 *
 * Plain C11: no CUDA type appears here. Built only where nvcc exists
 * (SPANSERVE_CUDA). Errors follow core/err.h: -1, NULL or NAN, and a message
 * in ERR.
 */
#ifndef SPANSERVE_TRAIN_GPU_H
#define SPANSERVE_TRAIN_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "train.h"

typedef struct tgpu tgpu;

/* 0 when a CUDA device can be used; else -1 and why in ERR. */
int tgpu_available(char *err);

/* Plans the device buffers for T's configuration and uploads T's weights,
 * moments and memories. */
tgpu *tgpu_new(const trainer *t, char *err);
void tgpu_free(tgpu *g);
/* Device bytes the plan holds. */
size_t tgpu_bytes(const tgpu *g);
const char *tgpu_device_name(const tgpu *g);

/* ON 1: the linear layers' products on tensor cores in TF32 (10-bit
 * mantissas, float32 sums; faster, no longer within 1e-3 of the CPU); 0:
 * float32 throughout (the default). */
int tgpu_set_tf32(tgpu *g, int on, char *err);
/* ON 1: every product on bf16 tensor cores (operands rounded to 8-bit
 * mantissas, float32 sums; weights, activations and optimizer state stay
 * float32); 0: as tgpu_set_tf32 left it. */
int tgpu_set_bf16(tgpu *g, int on, char *err);

/* Host -> device: weights, moments and memories of T (after a resume). */
int tgpu_upload(tgpu *g, const trainer *t, char *err);
/* Device -> host: weights, moments and memories into T (for checkpoints and
 * the state sidecar). */
int tgpu_download(tgpu *g, trainer *t, char *err);
/* The gradient of the last backward into GRAD (t->n doubles). */
int tgpu_download_grad(tgpu *g, double *grad, char *err);

/* trainer_forward on the device: X, Y are B x M token ids (checked by the
 * caller). T is the host mirror (config, z/S, PAR's tau, noise and
 * architecture). Returns the mean NLL, *AUX the span loss (PAR: 0); with
 * BACKWARD the gradient stays on the device for tgpu_step; with CARRY the
 * memories advance. NAN on error. */
double tgpu_forward(tgpu *g, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                    double *aux, char *err);
/* train_optim_step on the device at learning rate LR (PAR's alpha at
 * t->c.arch_lr): t->step advances and t's copies of z/S (clamped) and
 * alpha take the new values. */
int tgpu_step(tgpu *g, trainer *t, double lr, char *err);
/* tgpu_forward with backward and the memories carried, then tgpu_step at
 * LR, launched together with one wait at the end: the mean NLL, t->step
 * advanced; NAN (the weights as they were, the step not taken) when the
 * loss is not finite or on error. */
double tgpu_train_step(tgpu *g, trainer *t, const int32_t *x, const int32_t *y, double lr, double *aux, char *err);
/* Zero every memory (trainer_reset_memory). */
int tgpu_reset_memory(tgpu *g, char *err);
/* RESTORE 0: keeps a copy of the memories; 1: puts it back (evaluation
 * runs from zero memories in between). */
int tgpu_stash_memory(tgpu *g, int restore, char *err);
/* The memories into MEM (L x B x S x H doubles), for tests. */
int tgpu_download_memory(tgpu *g, double *mem, char *err);

/* The table train_run drives the device with (core/train.h). */
extern const train_device tgpu_train_device;

#ifdef __cplusplus
}
#endif

#endif
