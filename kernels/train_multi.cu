/*
 * train_multi.cu - data-parallel training over the GPUs of one machine
 * (config 'gpus', `spanserve train --gpus N`): the batch's B streams are
 * cut into N shares of B/N, device r trains the streams [r B/N, (r+1) B/N)
 * with its own copy of the weights (a tgpu of train_gpu.cu), and the
 * gradient is summed over the devices by NCCL. On one machine, in one
 * all-reduce after the backward: measured on 2 H200s over NVLink, that
 * costs 0.15 ms a step, where the all-reduces of buckets overlapped with
 * the backward slowed it by 0.5 ms (NCCL's kernels hold SMs while they wait
 * for the other GPU). Across machines, where the network is slower, in
 * buckets as the backward goes (each layer's tensors once its backward is
 * done, on a stream of their own of the highest priority, overlapped with
 * the layers below; the tensors of no layer at the end).
 * SPANSERVE_GRAD_OVERLAP=1 or 0 asks for the one or the other. Each
 * device's loss is its tokens' share of the mean over all B*M tokens, so
 * the sum is the one-GPU gradient of the same batch; every
 * device then takes the same optimizer step from the same gradient, and the
 * copies stay equal. The dropout masks are drawn by the streams' places in
 * the whole batch (core/train_drop.h): N devices drop what one drops.
 *
 * One host thread a device (each makes its device current once and runs
 * its share of every command: forward and backward, step, memory reset and
 * stash, download); the host trainer stays the one mirror the loop reads.
 * The first device writes the mirror of z/S and alpha and, on download, the
 * weights and moments; each device its streams' memories. So a checkpoint
 * is written once, by the loop, in the one-GPU layout, and a run may be
 * resumed on any number of GPUs that divides its batch.
 *
 * A device that fails aborts every communicator, so that no other device
 * waits forever in a collective; the trainer then refuses further commands
 * and names the device and its error.
 *
 * Several machines (--nodes, --node-rank; NCCL_COMM_ID the first one's
 * bootstrap address, the same on every machine): each process drives its
 * machine's GPUs, device r of machine k is rank k G + r of the run's N G,
 * one communicator spans them all (ncclCommInitRank). Each forward sums the
 * loss and the stop requests over every device (a stop asked on any machine
 * stops every machine after the same step); a download gathers every
 * device's memories (all-gather), so that each machine's host trainer
 * holds the whole state, which the first machine alone writes.
 */
#include "train_internal.cuh"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef SPANSERVE_NCCL
#include <nccl.h>
#endif

#define TM_MAX 16

enum { TM_FORWARD, TM_STEP, TM_TRAIN, TM_RESET, TM_STASH, TM_DOWNLOAD, TM_EXIT };

typedef struct {
    tmulti *m;
    int r;
} tm_arg;

struct tmulti {
    int n, threads;
    int nodes, node_rank, world;   /* the run's machines, this one's place, its devices in all */
    int stop;                      /* the stop request every device agreed on in the last forward */
    tgpu *g[TM_MAX];
    pthread_t th[TM_MAX];
    tm_arg arg[TM_MAX];
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned gen;
    int pending, cmd;
    /* the command's arguments */
    const trainer *t;
    trainer *tw;
    const int32_t *x, *y;
    int backward, carry, restore;
    long step;
    double lr;
    /* each device's results */
    double sum[TM_MAX], aux[TM_MAX];
    int rc[TM_MAX];
    char err[TM_MAX][ERR_LEN];
    void *comm[TM_MAX];
    int aborted, broken;
    char broken_why[ERR_LEN];
    char name[320];
};

static void tm_abort(tmulti *m)
{
#ifdef SPANSERVE_NCCL
    pthread_mutex_lock(&m->mu);
    const int first = !m->aborted;
    m->aborted = 1;
    pthread_mutex_unlock(&m->mu);
    if (first)
        for (int r = 0; r < m->n; r++)
            if (m->comm[r]) ncclCommAbort((ncclComm_t)m->comm[r]);
#else
    (void)m;
#endif
}

/* Several machines: every device's memories to every device (NCCL
 * all-gather), and the first local device puts them in T in the one-GPU
 * layout with the weights, moments and memory rows: each machine's host
 * trainer then holds the whole state. */
static int tm_gather(tmulti *m, int r, char *err)
{
#ifdef SPANSERVE_NCCL
    tgpu *g = m->g[r];
    const size_t n = g->mem_n, all = n * m->world, per = (size_t)g->mem_rows * g->H, nb = g->B;
    if (r == 0 && tgpu_download_part(g, m->tw, 1, err)) return -1;
    if (!n) return 0;
    float *buf = NULL, *host = NULL;
    int rc = -1;
    if (cudaMalloc((void **)&buf, sizeof(float) * all) != cudaSuccess) {
        err_set(err, "cudaMalloc of %.1f MB for the memories' gather failed", sizeof(float) * all / 1e6);
        goto out;
    }
    if (ncclAllGather(g->mem, buf, n, ncclFloat32, (ncclComm_t)g->comm, g->stream) != ncclSuccess) {
        err_set(err, "the memories' all-gather failed");
        goto out;
    }
    if (r == 0) {
        host = (float *)malloc(sizeof(float) * all);
        if (!host) { err_set(err, "out of memory"); goto out; }
        if (cudaMemcpyAsync(host, buf, sizeof(float) * all, cudaMemcpyDeviceToHost, g->stream) != cudaSuccess ||
            cudaStreamSynchronize(g->stream) != cudaSuccess) {
            err_set(err, "the memories' download failed");
            goto out;
        }
        /* device q's share: layer l's streams [q nb, (q+1) nb) */
        trainer *t = m->tw;
        for (int q = 0; q < m->world; q++)
            for (int l = 0; l < g->L; l++) {
                const float *src = host + (size_t)q * n + (size_t)l * nb * per;
                double *dst = t->mem + (size_t)l * g->B_all * per + (size_t)q * nb * per;
                for (size_t i = 0; i < nb * per; i++) dst[i] = src[i];
            }
    } else if (cudaStreamSynchronize(g->stream) != cudaSuccess) {
        err_set(err, "the memories' all-gather failed");
        goto out;
    }
    rc = 0;
out:
    if (buf) cudaFree(buf);
    free(host);
    return rc;
#else
    (void)m, (void)r;
    return err_set(err, "this build has no NCCL");
#endif
}

static int tm_run(tmulti *m, int r, int cmd)
{
    tgpu *g = m->g[r];
    char *err = m->err[r];
    switch (cmd) {
    case TM_FORWARD: return tgpu_forward_sum(g, m->t, m->x, m->y, m->backward, m->carry, &m->sum[r], &m->aux[r], err);
    case TM_STEP: return tgpu_step_part(g, m->tw, m->step, m->lr, r == 0, err);
    case TM_TRAIN:
        return tgpu_train_step_sum(g, m->tw, m->x, m->y, m->step, m->lr, r == 0, &m->sum[r], &m->aux[r], err);
    case TM_RESET: return tgpu_reset_memory(g, err);
    case TM_STASH: return tgpu_stash_memory(g, m->restore, err);
    case TM_DOWNLOAD: return m->nodes > 1 ? tm_gather(m, r, err) : tgpu_download_part(g, m->tw, r == 0, err);
    default: return 0;
    }
}

static void *tm_worker(void *p)
{
    tm_arg *a = (tm_arg *)p;
    tmulti *m = a->m;
    const int r = a->r;
    unsigned seen = 0;
    const cudaError_t set = cudaSetDevice(r);
    for (;;) {
        pthread_mutex_lock(&m->mu);
        while (m->gen == seen) pthread_cond_wait(&m->go, &m->mu);
        seen = m->gen;
        const int cmd = m->cmd;
        pthread_mutex_unlock(&m->mu);
        if (cmd == TM_EXIT) return NULL;
        int rc = set != cudaSuccess ? err_set(m->err[r], "cudaSetDevice(%d): %s", r, cudaGetErrorString(set))
                                    : tm_run(m, r, cmd);
        if (rc) tm_abort(m);   /* the others may wait for this device in a collective */
        pthread_mutex_lock(&m->mu);
        m->rc[r] = rc;
        if (--m->pending == 0) pthread_cond_broadcast(&m->done);
        pthread_mutex_unlock(&m->mu);
    }
}

/* every device runs CMD; -1 and the first failure's device and message */
static int tm_do(tmulti *m, int cmd, char *err)
{
    if (m->broken) return err_set(err, "the multi-GPU trainer stopped after an error: %s", m->broken_why);
    pthread_mutex_lock(&m->mu);
    m->cmd = cmd;
    m->pending = m->threads;
    m->gen++;
    pthread_cond_broadcast(&m->go);
    while (m->pending) pthread_cond_wait(&m->done, &m->mu);
    pthread_mutex_unlock(&m->mu);
    for (int r = 0; r < m->n; r++)
        if (m->rc[r]) {
            m->broken = 1;
            snprintf(m->broken_why, sizeof m->broken_why, "GPU %d: %s", r, m->err[r]);
            return err_set(err, "%s", m->broken_why);
        }
    return 0;
}

void tmulti_free(tmulti *m)
{
    if (!m) return;
    int cur = 0;   /* the caller's current device, as it was */
    cudaGetDevice(&cur);
    if (m->threads) {
        pthread_mutex_lock(&m->mu);
        m->cmd = TM_EXIT;
        m->gen++;
        pthread_cond_broadcast(&m->go);
        pthread_mutex_unlock(&m->mu);
        for (int r = 0; r < m->threads; r++) pthread_join(m->th[r], NULL);
    }
    for (int r = 0; r < m->n; r++) {
        cudaSetDevice(r);
#ifdef SPANSERVE_NCCL
        if (m->comm[r] && !m->aborted) ncclCommDestroy((ncclComm_t)m->comm[r]);
#endif
        if (m->g[r]) m->g[r]->comm = NULL;
        tgpu_free(m->g[r]);
    }
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->go);
    pthread_cond_destroy(&m->done);
    free(m);
    cudaSetDevice(cur);
}

tmulti *tmulti_new(const trainer *t, char *err)
{
    const int n = t->c.gpus, nodes = t->c.nodes > 1 ? t->c.nodes : 1, world = n * nodes;
#ifndef SPANSERVE_NCCL
    (void)n;
    err_set(err, "config 'gpus' = %d: this build has no NCCL (nccl.h was not found when it was built); train on one GPU",
            t->c.gpus);
    return NULL;
#else
    int have = 0;
    if (tgpu_available(err)) return NULL;
    if (cudaGetDeviceCount(&have) != cudaSuccess) have = 0;
    if (n < 1 || n > TM_MAX || n > have) {
        err_set(err, "config 'gpus' = %d: this machine has %d CUDA device%s%s", n, have, have == 1 ? "" : "s",
                n > TM_MAX ? " (and at most 16 are driven)" : "");
        return NULL;
    }
    if (t->B % world) {
        err_set(err, "config 'batch_size' = %d is not a multiple of the run's GPUs (%d machines of %d)", t->B, nodes, n);
        return NULL;
    }
    if (nodes > 1 && !getenv("NCCL_COMM_ID")) {
        err_set(err, "%d machines: set NCCL_COMM_ID=HOST:PORT, the first machine's address, on every machine (or --master)",
                nodes);
        return NULL;
    }
    /* NVLink multicast stays off (it can take a shared host's GPUs down) */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    int cur = 0;   /* the caller's current device, given back on return */
    cudaGetDevice(&cur);
    tmulti *m = (tmulti *)calloc(1, sizeof *m);
    if (!m) { err_set(err, "out of memory"); return NULL; }
    m->n = n, m->nodes = nodes, m->node_rank = t->c.node_rank, m->world = world;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->go, NULL);
    pthread_cond_init(&m->done, NULL);
    const int nb = t->B / world;
    int devs[TM_MAX];
    for (int r = 0; r < n; r++) {
        devs[r] = r;
        if (cudaSetDevice(r) != cudaSuccess) { err_set(err, "cudaSetDevice(%d) failed", r); goto fail; }
        char e2[ERR_LEN];
        const int grank = m->node_rank * n + r;   /* its place among all the run's devices */
        if (!(m->g[r] = tgpu_new_part(t, grank * nb, nb, grank, e2))) { err_set(err, "GPU %d: %s", r, e2); goto fail; }
        tgpu *g = m->g[r];
        g->sum_all = 1;
        const char *ov = getenv("SPANSERVE_GRAD_OVERLAP");
        g->overlap = ov && *ov ? strcmp(ov, "0") != 0 : nodes > 1;
        int lo_prio = 0, hi_prio = 0;   /* the all-reduces start as soon as SMs free */
        if (cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio) != cudaSuccess) hi_prio = 0;
        if (cudaStreamCreateWithPriority(&g->cstream, cudaStreamNonBlocking, hi_prio) != cudaSuccess ||
            cudaEventCreateWithFlags(&g->ev_grad, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&g->ev_comm, cudaEventDisableTiming) != cudaSuccess) {
            err_set(err, "GPU %d: cannot create the all-reduce's stream and events", r);
            goto fail;
        }
    }
    {
        ncclComm_t comms[TM_MAX];
        ncclResult_t rr;
        if (nodes == 1) {
            rr = ncclCommInitAll(comms, n, devs);
        } else {   /* every machine's NCCL_COMM_ID gives the same id: the first machine's bootstrap */
            ncclUniqueId id;
            rr = ncclGetUniqueId(&id);
            if (rr == ncclSuccess) {
                ncclGroupStart();
                for (int r = 0; r < n; r++) {
                    cudaSetDevice(r);
                    ncclCommInitRank(&comms[r], world, id, m->node_rank * n + r);
                }
                rr = ncclGroupEnd();
            }
        }
        if (rr != ncclSuccess) {
            err_set(err, "NCCL over %d GPUs (%d machines): %s", world, nodes, ncclGetErrorString(rr));
            goto fail;
        }
        for (int r = 0; r < n; r++) m->comm[r] = comms[r], m->g[r]->comm = comms[r];
    }
    for (int r = 0; r < n; r++) {
        m->arg[r].m = m, m->arg[r].r = r;
        if (pthread_create(&m->th[r], NULL, tm_worker, &m->arg[r])) {
            err_set(err, "cannot start the thread of GPU %d", r);
            goto fail;
        }
        m->threads++;
    }
    if (nodes > 1)
        snprintf(m->name, sizeof m->name, "%d x %s, machine %d of %d", n, tgpu_device_name(m->g[0]), m->node_rank + 1,
                 nodes);
    else
        snprintf(m->name, sizeof m->name, "%d x %s", n, tgpu_device_name(m->g[0]));
    cudaSetDevice(cur);
    return m;
fail:
    tmulti_free(m);
    cudaSetDevice(cur);
    return NULL;
#endif
}

double tmulti_forward(tmulti *m, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                      double *aux, char *err)
{
    m->t = t, m->x = x, m->y = y, m->backward = backward, m->carry = carry;
    const int stop = train_stop_pending();
    for (int r = 0; r < m->n; r++) m->g[r]->stop_local = stop;
    if (tm_do(m, TM_FORWARD, err)) return NAN;
    const double sum = m->sum[0];   /* every device's sum is the run's (all-reduced) */
    m->stop = m->g[0]->stop_all;
    if (aux) *aux = m->aux[0];
    const double nll = sum / ((double)t->B * t->M);
    if (!isfinite(nll)) err_set(err, "the loss is not finite (%g): the learning rate may be too high", nll);
    return nll;
}

int tmulti_step(tmulti *m, trainer *t, double lr, char *err)
{
    m->tw = t, m->step = t->step + 1, m->lr = lr;
    if (tm_do(m, TM_STEP, err)) return -1;
    t->step++;
    return 0;
}

double tmulti_train_step(tmulti *m, trainer *t, const int32_t *x, const int32_t *y, double lr, double *aux, char *err)
{
    m->t = t, m->tw = t, m->x = x, m->y = y, m->step = t->step + 1, m->lr = lr;
    const int stop = train_stop_pending();
    for (int r = 0; r < m->n; r++) m->g[r]->stop_local = stop;
    if (tm_do(m, TM_TRAIN, err)) return NAN;
    m->stop = m->g[0]->stop_all;
    if (aux) *aux = m->aux[0];
    const double nll = m->sum[0] / ((double)t->B * t->M);   /* every device's sum is the run's */
    if (!isfinite(nll)) {   /* no device took the step */
        err_set(err, "the loss is not finite (%g): the learning rate may be too high", nll);
        return NAN;
    }
    t->step++;
    return nll;
}

int tmulti_reset_memory(tmulti *m, char *err) { return tm_do(m, TM_RESET, err); }

int tmulti_stash_memory(tmulti *m, int restore, char *err)
{
    m->restore = restore;
    return tm_do(m, TM_STASH, err);
}

int tmulti_download(tmulti *m, trainer *t, char *err)
{
    m->tw = t;
    return tm_do(m, TM_DOWNLOAD, err);
}

const char *tmulti_device_name(tmulti *m) { return m->name; }
int tmulti_primary(tmulti *m) { return m->node_rank == 0; }
int tmulti_stop_agreed(tmulti *m) { return m->stop; }
