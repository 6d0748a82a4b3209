/*
 * device.c - where the models run (--device cpu|cuda|auto): with the CUDA
 * core (kernels/gpu.h), each model gets a gpu_model and core's backend hook
 * (model.h: fwd_backend), so model_forward runs on the device and every
 * memory of the model keeps its rings there; the host copy is brought up to
 * date only when a session is exported or spilled to disk. --precision
 * picks the gpu_model's precision (GPU_BF16 by default, GPU_FP32).
 *
 * The scheduler thread runs the steps; HTTP threads create and export
 * memories, the state writer writes them. One lock per model orders steps,
 * and making and freeing memories (kernels/gpu.h: one thread at a time per
 * gpu_model); copies of one memory need none (dev_pull).
 */
#include "server.h"

#include <stdlib.h>
#include <string.h>

#ifdef SPANSERVE_CUDA
#include "../kernels/gpu.h"

/* A step plans buffers for this many streams: more than the scheduler ever
 * batches (256). */
#define DEVICE_MAX_BATCH 256

typedef struct {
    gpu_model *g;
    const model_t *m;
    pthread_mutex_t lock;
    fwd_backend be;
    gpu_mem *batch[DEVICE_MAX_BATCH];
} device_model;

/* The device memory's position, lengths, pending token and (window models)
 * mode follow the host memory's: model_forward, the scheduler and
 * mem_windows keep those on the host. (A window model's token ring is
 * advanced on both sides by every forward, and copied with the rings.) */
static void sync_scalars(gpu_mem *g, const mem_t *s)
{
    g->pos = s->pos;
    g->pending = s->pending;
    g->keep = s->keep;
    memcpy(g->len, s->len, (size_t)s->m->n_layers * sizeof *g->len);
}

/* One step on the device: with PICK the N picks Q (and TARGETS' logprobs
 * into LOGPROBS, B x M floats), else LOGPROBS (model_forward_targets').
 * MW runs while the step computes, with d->lock held: it must not wait for a
 * lock whose holders may wait for d->lock (the server's only tries
 * srv.lock, under which sessions are attached and freed). */
static int dev_step(device_model *d, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                    float *logprobs, int pick, int n, const pick_req *q, pick_out *o, fwd_meanwhile mw, void *mw_ctx,
                    char *err)
{
    if (B > DEVICE_MAX_BATCH) return err_set(err, "a step of %d streams is over %d", B, DEVICE_MAX_BATCH);
    pthread_mutex_lock(&d->lock);
    for (int b = 0; b < B; b++) {
        d->batch[b] = mems[b]->dev;
        sync_scalars(d->batch[b], mems[b]);
    }
    int rc = pick ? gpu_forward_pick_while(d->g, d->batch, B, tokens, M, targets, logprobs, n, q, o, mw, mw_ctx, err)
               : gpu_forward_targets(d->g, d->batch, B, tokens, M, targets, logprobs, err);
    for (int b = 0; rc == 0 && b < B; b++)   /* par: the rows each attention block now holds */
        memcpy(mems[b]->len, d->batch[b]->len, (size_t)d->m->n_layers * sizeof *mems[b]->len);
    pthread_mutex_unlock(&d->lock);
    return rc;
}

static int dev_forward(void *ctx, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                       float *logprobs, char *err)
{
    return dev_step(ctx, mems, B, tokens, M, targets, logprobs, 0, 0, NULL, NULL, NULL, NULL, err);
}

static int dev_forward_pick(void *ctx, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                            float *tlp, int n, const pick_req *q, pick_out *o, fwd_meanwhile mw, void *mw_ctx,
                            char *err)
{
    return dev_step(ctx, mems, B, tokens, M, targets, tlp, 1, n, q, o, mw, mw_ctx, err);
}

static int dev_attach(void *ctx, mem_t *s, char *err)
{
    device_model *d = ctx;
    pthread_mutex_lock(&d->lock);
    gpu_mem *g = gpu_mem_new(d->g, err);
    int rc = g ? gpu_mem_upload(g, s, err) : -1;
    if (rc && g) gpu_mem_free(g);
    else if (!rc) s->dev = g;
    pthread_mutex_unlock(&d->lock);
    return rc;
}

static void dev_detach(void *ctx, mem_t *s)
{
    device_model *d = ctx;
    pthread_mutex_lock(&d->lock);
    gpu_mem_free(s->dev);
    s->dev = NULL;
    pthread_mutex_unlock(&d->lock);
}

/* A pull or a push touches only its own session's device memory, which no
 * step in flight holds (a session belongs to one task at a time, and a
 * session is pulled or pushed only while it is held or idle), and copies on
 * the default stream while steps run on the model's non-blocking one: no
 * lock, so that a session's state goes to disk (sessions.c's writer) while
 * the next step runs. */
static int dev_pull(void *ctx, mem_t *s, char *err)
{
    (void)ctx;
    sync_scalars(s->dev, s);
    return gpu_mem_download(s->dev, s, err);
}

static int dev_push(void *ctx, mem_t *s, char *err)
{
    (void)ctx;
    return gpu_mem_upload(s->dev, s, err);
}

int device_cuda_usable(char *err) { return gpu_available(err) == 0; }
int device_supports(const model_t *m, char *why) { return gpu_supports(m, why); }

int device_attach(model_t *m, int bf16, char *err)
{
    device_model *d = calloc(1, sizeof *d);
    if (!d) return err_set(err, "out of memory");
    d->m = m;
    d->g = gpu_model_new(m, DEVICE_MAX_BATCH, m->block_len, bf16 ? GPU_BF16 : GPU_FP32, err);
    if (!d->g) {
        free(d);
        return -1;
    }
    /* kernels/gpu.h: whether this model's decode steps run as one kernel, and why not */
    const char *why = "";
    const int lim = gpu_decode_kernel_limit(d->g);
    if (!gpu_decode_kernel_status(d->g, NULL, &why))
        log_line("%s: decode steps run as CUDA graphs, not as one kernel: %s", m->path, why);
    else if (lim > 0) {
        const char *fwhy = "";
        const int ffn = gpu_decode_ffn_status(d->g, NULL, &fwhy), fmax = gpu_decode_ffn_max(d->g);
        char fs[512];
        const char *wwhy = "";
        const int wo = gpu_decode_wo_status(d->g, NULL, &wwhy);
        int w = 0;
        if (!ffn) w = snprintf(fs, sizeof fs, "each feed-forward in two phases: %s", fwhy);
        else if (fmax > 0)
            w = snprintf(fs, sizeof fs, "each feed-forward one phase in steps of up to %d (SPANSERVE_GPU_DECODE_FFN)", fmax);
        else w = snprintf(fs, sizeof fs, "each feed-forward in two phases: SPANSERVE_GPU_DECODE_FFN=0");
        const char *wpart = !wo                        ? "Wo a phase of its own: "
                            : !gpu_decode_wo_on(d->g) ? "Wo a phase of its own: SPANSERVE_GPU_DECODE_WO=0"
                                                      : "Wo in the attention's phase in steps of up to 2 (SPANSERVE_GPU_DECODE_WO)";
        if (w > 0 && (size_t)w < sizeof fs) snprintf(fs + w, sizeof fs - (size_t)w, "; %s%s", wpart, !wo ? wwhy : "");
        log_line("%s: decode steps of up to %d session%s run as one kernel (%s), more as CUDA graphs", m->path, lim,
                 lim == 1 ? "" : "s", fs);
    }
    else
        log_line("%s: decode steps run as CUDA graphs: SPANSERVE_GPU_DECODE_KERNEL=0, or the model's widest attention "
                 "is more than the default takes as one kernel even for one session", m->path);
    pthread_mutex_init(&d->lock, NULL);
    d->be = (fwd_backend){d, dev_forward, dev_forward_pick, dev_attach, dev_detach, dev_pull, dev_push};
    m->backend = &d->be;
    return 0;
}

void device_detach(model_t *m)
{
    if (!m->backend) return;
    device_model *d = m->backend->ctx;
    m->backend = NULL;
    gpu_model_free(d->g);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

const char *device_name(const model_t *m)
{
    return m->backend ? gpu_model_device_name(((device_model *)m->backend->ctx)->g) : "cpu";
}

const char *device_precision(const model_t *m)
{
    return m->backend ? gpu_precision_name(gpu_model_precision(((device_model *)m->backend->ctx)->g)) : "fp32";
}

size_t device_session_bytes(const model_t *m)
{
    return m->backend ? gpu_mem_bytes(((device_model *)m->backend->ctx)->g) : 0;
}

#else /* a build without nvcc */

int device_cuda_usable(char *err) { return err_set(err, "this build has no CUDA core (nvcc was not found)"), 0; }
int device_attach(model_t *m, int bf16, char *err) { (void)m, (void)bf16; return err_set(err, "this build has no CUDA core"); }
int device_supports(const model_t *m, char *why) { (void)m; return err_set(why, "this build has no CUDA core"), 0; }
void device_detach(model_t *m) { (void)m; }
const char *device_name(const model_t *m) { (void)m; return "cpu"; }
const char *device_precision(const model_t *m) { (void)m; return "fp32"; }
size_t device_session_bytes(const model_t *m) { (void)m; return 0; }

#endif
