/*
 * jobs.h - training jobs (jobs.c) as the routes of the jobs listener
 * (route_jobs.c) see them: a job is a `spanserve train` child process with a
 * directory of its own under STATE_DIR/jobs/ID (config.json, job.json,
 * train.log, stderr.log, model.safetensors and its .state); training texts
 * are files under the data directory (DATA_DIR/files/ID, uploaded or
 * fetched).
 *
 * Every field of a job and the list of jobs are guarded by jobs_lock. The
 * runner thread (jobs.c) starts queued jobs, follows the running ones' logs
 * and processes, and finishes them; route handlers read and change jobs
 * under the same lock and wake the runner. Lock order: jobs_lock, then
 * srv.lock (a finished job registers its model).
 */
#ifndef SPANSERVE_JOBS_H
#define SPANSERVE_JOBS_H

#include <limits.h>
#include <sys/types.h>

#include "server.h"
#include "train.h"

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELLED } job_status;
typedef enum { HOOK_NONE, HOOK_PENDING, HOOK_DELIVERED, HOOK_FAILED } hook_state;

/* An SSE connection following a job (route_jobs.c). */
typedef struct job_watcher {
    struct MHD_Connection *conn;
    int waiting;                 /* suspended until the job changes */
    double since;                /* when it was suspended (monotonic): a keep-alive is due */
    struct job_watcher *next;
} job_watcher;

typedef struct job {
    char id[NAME_MAX_LEN + 1];
    job_status status;
    json_t *request;             /* the submission as accepted: compared on a retry with the same id */
    const train_family *fam;     /* the config's (train_family_find) */
    char device[16];
    int gpus;                    /* cuda: the GPUs it trains on (config 'gpus'); 0 on the CPU */
    int gpu_ids[16], n_gpu_ids;  /* while running: the machine's GPUs it was given (CUDA_VISIBLE_DEVICES) */
    long steps;                  /* the config's steps */
    int batch, block;            /* tokens of a step: batch x block */
    char file_id[NAME_MAX_LEN + 1];   /* the text's file, when it came from one ("" otherwise) */
    char model_name[NAME_MAX_LEN + 1];
    int deploy;
    uint64_t seq;                /* order of submission: the queue's order */
    time_t created, started, finished;
    double t_started, t_finished;   /* the same, to the microsecond (wall clock): elapsed_s */
    /* the process */
    pid_t pid;                   /* 0 when none */
    unsigned long long pid_start;   /* its start time (/proc/PID/stat), to know it again after a restart */
    int own;                     /* our child (waitpid), or found again after a restart */
    int runs;                    /* processes started: 1, plus one per resume */
    int resume;                  /* the next run continues from the state file */
    int cancelling;              /* SIGTERM sent; SIGKILL at kill_at */
    double kill_at;
    /* progress, from train.log */
    off_t log_off;               /* bytes of the log read so far */
    long n_events;               /* its lines */
    json_t *progress;            /* the last train line's fields, val_bpc the last evaluated */
    int done_seen;               /* the log's "done" line */
    long ckpt_step;              /* the last checkpoint line's step (-1: none) */
    double run_t0;               /* monotonic start of the current run */
    long run_step0;              /* the step it started from */
    /* the outcome */
    char error[512];
    int exit_code;               /* -1: unknown */
    char model_path[PATH_MAX];   /* succeeded: the model's file */
    int deployed;
    char model_error[512];
    /* the webhook */
    char *webhook;
    hook_state hook;
    int hook_attempts;
    double hook_next;            /* monotonic time of the next attempt */
    char hook_error[256];
    job_watcher *watchers;
    int removed;                 /* deleted while streams followed it: freed with the last */
    int prune_failed;            /* --job-retention could not delete it (logged once) */
    struct job *next;
} job_t;

extern pthread_mutex_t jobs_lock;

/* Jobs and files (jobs_lock held). */
job_t *jobs_find(const char *id);
job_t *jobs_list(void);
/* Checks a submission's fields and config (the trainer's own checks, with
 * placeholder paths): a bad one is 400 before anything is stored or
 * fetched. Fills CFG. */
int jobs_validate(json_t *req, train_cfg *cfg, char *err, int *status);
/* Validates a submission, and on success creates the job (queued, on disk)
 * and returns it; *EXISTED when ID named an equal earlier submission. On
 * failure: NULL, ERR and STATUS. DATA is the text's absolute path (checked
 * by the caller to be inside the data directory), FILE_ID its file or NULL. */
job_t *jobs_submit(json_t *req, const char *data, const char *file_id, int *existed, char *err, int *status);
/* The job as the API shows it. */
json_t *job_json(const job_t *j);
int jobs_cancel(job_t *j, char *err, int *status);
int jobs_resume(job_t *j, char *err, int *status);
/* Deletes a finished job and its directory (a queued or running one, or one
 * whose model is served from that directory, is 409). J is gone after. */
int jobs_delete(job_t *j, char *err, int *status);
/* Whether a queued or running job reads file ID. */
int jobs_file_in_use(const char *file_id);
/* The directories (absolute). */
const char *jobs_files_dir(void);
/* The paths of a job's files. */
void job_path(const job_t *j, const char *name, char *buf, size_t cap);
int job_is_terminal(const job_t *j);
const char *job_status_name(job_status s);
/* Wakes every SSE connection of J. */
void jobs_wake_watchers(job_t *j);
/* Adds W (its conn set) to J's SSE connections; jobs_unwatch takes it off,
 * and frees J when it was deleted meanwhile and W was its last. */
void jobs_watch(job_t *j, job_watcher *w);
void jobs_unwatch(job_t *j, job_watcher *w);
/* Whether the server is stopping the jobs (streams end). */
int jobs_stopping(void);

/* Texts being fetched by URL (route_jobs.c). */
int jobs_fetching(void);
/* The jobs' lines of /metrics (nothing when the jobs listener is off);
 * takes jobs_lock, so the caller holds no lock. */
void jobs_metrics(FILE *f);
/* Frees the jobs once the jobs listener has stopped (jobs_stop first). */
void jobs_free(void);

/* The characters (code points) of a UTF-8 text file, and the distinct
 * ones; -1 (ERR) when it cannot be read or is not UTF-8. */
int jobs_scan_text(const char *path, size_t *chars, size_t *distinct, char *err);
/* Checks a training text: UTF-8, at least 2 distinct characters, and long
 * enough for the config's batch of blocks (what train_run checks once it
 * has read the text). */
int jobs_check_text(const char *path, const train_cfg *cfg, char *err);

/* Writes LEN bytes of DATA to PATH atomically (a temporary file, fsync,
 * rename). */
int write_atomic(const char *path, const char *data, size_t len);
/* A fresh id: PREFIX and 16 hex digits. */
void random_id(const char *prefix, char *buf, size_t cap);

#endif
