/*
 * train.h - the CPU trainer of both families: configuration, parameters,
 * the training forward (activations kept) and its backward, the optimizers,
 * and the loop that reads a text, logs JSON lines and writes checkpoints in
 * the layout model_load() reads.
 *
 * The CPU trainer computes in double precision: it is the reference that a
 * faster trainer is checked against, and finite differences need it. Weights
 * are saved as float32 in the checkpoint; the exact double state (weights,
 * optimizer moments, memories, random generator, data position) goes to a
 * sidecar so that --resume continues bit for bit.
 *
 * A family is a plug-in (train_family, below): one struct filled in a file
 * of its own and listed in train_family.c's table. The rest of the trainer
 * and the job server call only the struct.
 *
 * Files: train_family.c (the table of families), train_config.c (the shared
 * keys, defaults, checks), train_params.c (tensor table, initialisation,
 * checkpoint), train_ops.c (double linear algebra and their backwards),
 * train_aspan.c, train_par.c (each family: its keys, tensors, forward and
 * backward, what it reports), train_optim.c (Adagrad, Adam, clipping),
 * train_loop.c (data, steps, evaluation, logging, resume).
 */
#ifndef SPANSERVE_TRAIN_H
#define SPANSERVE_TRAIN_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model.h"

#define TRAIN_PATH_LEN 1024

/* The trainer's random numbers: splitmix64, so that a state is one word
 * that the sidecar can carry. */
typedef struct { uint64_t s; } train_rng;
static inline uint64_t train_rng_next(train_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
/* uniform in (0, 1): never 0, so that logs are finite */
static inline double train_rng_unif(train_rng *r) { return ((double)(train_rng_next(r) >> 11) + 0.5) * 0x1.0p-53; }

/* normal(0, 1) by Box-Muller, as the reference initialisations draw */
static inline double train_rng_normal(train_rng *r)
{
    double u1 = train_rng_unif(r), u2 = train_rng_unif(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

typedef enum { OPT_ADAGRAD, OPT_ADAM } train_optim;

typedef struct train_family train_family;

/* Every key of a training config (train_config.c documents the shared ones,
 * each family's file its own, and README.md "Training" lists them). Defaults
 * are the reference recipes of
 * ../shared/fixtures/{aspan-small,par-small}/expected.json. */
typedef struct {
    const train_family *fam;
    /* data and outputs */
    char data[TRAIN_PATH_LEN];   /* the text file */
    char out[TRAIN_PATH_LEN];    /* the checkpoint; the state sidecar is OUT.state */
    char log[TRAIN_PATH_LEN];    /* JSON lines; empty: standard output */
    char device[16];             /* "cpu", "cuda" (builds with nvcc), or "auto": the GPU
                                  * trainer when train_run_on is given one, else the CPU */
    int tf32;                    /* cuda: linear layers in TF32 */
    int bf16;                    /* cuda: linear layers' products on bf16 tensor cores (float32 sums, weights, optimizer) */
    int gpus;                    /* cuda: the GPUs of this machine a step's streams are spread over (data parallel) */
    /* not config keys, the command line's (--nodes, --node-rank): the run
     * spans NODES machines of GPUS each, this one the NODE_RANK-th (0:
     * the one that writes the files) */
    int nodes, node_rank;
    double val_fraction;         /* the last fraction of the text (in characters) is validation */
    /* schedule */
    long steps, log_every, eval_every, checkpoint_every, eval_tokens;
    uint64_t seed;
    int batch_size;
    /* optimizer */
    train_optim optim;
    long lr_warmup;
    double lr, grad_clip, beta1, beta2, adam_eps;
    /* dropout (train_drop.h): the references' sites; emb_dropout
     * adaptive-span's, dropatt PAR's */
    double dropout, emb_dropout, dropatt;
    /* adaptive-span */
    int hidden_size, inner_hidden_size, nb_heads, nb_layers, attn_span, block_size, adapt_span_ramp;
    double adapt_span_loss, adapt_span_init;
    /* par-transformer-xl */
    int n_blocks, n_head, d_model, d_head, d_inner, mem_len, tgt_len, tie_weight;
    long search_steps;
    double arch_lr, tau_start, tau_end;
} train_cfg;

/* One key of a config: its name, type, range and meaning, and where it
 * lives in train_cfg. */
typedef enum { TK_INT, TK_LONG, TK_U64, TK_REAL, TK_PATH, TK_BOOL, TK_OPTIM, TK_DEVICE, TK_PRECISION } train_key_type;
typedef struct {
    const char *key;
    train_key_type type;
    double lo, hi;      /* numbers: the closed range, lo excluded when lo_open */
    int lo_open;
    size_t off;         /* offsetof(train_cfg, the field) */
    const char *doc;
} train_key;
#define TRAIN_KEY_BIG 1e15   /* the upper bound of an unbounded number */

/* Defaults of FAM's recipe (data, out empty). */
void train_cfg_defaults(train_cfg *c, const train_family *fam);
/* Reads a JSON config object: "family" first, then every key; an unknown
 * key, a key of another family, a wrong type or a value out of range is an
 * error naming the key. */
int train_cfg_from_json(train_cfg *c, const char *json_text, const char *label, char *err);
/* Checks the keys together (sizes that must divide, required paths). */
int train_cfg_check(const train_cfg *c, char *err);
/* The config as a JSON object (every key), as stored in the state sidecar;
 * caller frees. */
char *train_cfg_json(const train_cfg *c);

/* ------------------------------------------------------------------ model */

/* One tensor of the checkpoint: its name as the loader knows it, its shape,
 * and where it lives in the parameter arena. */
typedef enum { TP_WEIGHT, TP_ZFRAC, TP_ALPHA } tparam_kind;
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[3];
    size_t off, n;
    tparam_kind kind;
    int branch;   /* par: BLK_ATTN or BLK_FFN branch of block `layer`; -1 otherwise */
    int layer;
} tparam;

/* Offsets of a layer's tensors in the arena (SIZE_MAX: none). */
typedef struct {
    size_t wq, wk, wv, wo, zfrac;                       /* aspan */
    size_t qkv, rnet, onet, alpha;                      /* par */
    size_t ln1_w, ln1_b, fc1_w, fc1_b, fc2_w, fc2_b, ln2_w, ln2_b;
} tlayer;

/* Activations of one step and the backward's scratch: buffers laid out once
 * by the family's acts_alloc (indices are the family's), no allocation in
 * a step. */
#define TACT_MAX 40
typedef struct tacts {
    double *b[TACT_MAX];
} tacts;

typedef struct trainer {
    train_cfg c;
    int V, L, H, K, D, I, A, M, B;   /* vocab, layers, width, heads, head dim, inner, nh*dh (par), block, streams */
    /* parameters, gradients, optimizer moments: arenas of n doubles */
    tparam *tp;
    int n_tp;
    size_t n;
    double *w, *g, *m1, *m2;
    tlayer *ly;
    size_t emb, key_pe, out_w, out_b, r_w_bias, r_r_bias;
    long step;          /* optimizer steps done */
    /* 1: forwards apply the config's dropout, with the masks of step
     * `step` (train_drop.h; trainer_new sets it, the loop clears it while
     * evaluating) */
    int drop;
    /* memory carried between blocks (no gradient through it):
     *   aspan: per layer, B x S x H, the layer's input of the last S positions,
     *          rows the reference would not keep are zeros;
     *   par:   per layer, B x mem_len x D, the block's input of the last
     *          mlen[l] positions (rows 0..mlen-1). */
    double *mem;
    int *mlen;
    /* par: the search */
    int searching;      /* 1 while the architecture is searched */
    blk_kind *arch;     /* the fixed architecture (argmax alpha) once searching ends */
    double *mix;        /* L x 3: this step's block weights (Gumbel-softmax sample, or one-hot) */
    double *gumbel;     /* L x 3: this step's Gumbel noise g (the weights are softmax((alpha + g) / tau)) */
    double tau;
    tacts *act;
    double *logp;       /* log-probabilities of the last forward without backward, B*M rows of V */
} trainer;

trainer *trainer_new(const train_cfg *c, int V, char *err);
void trainer_free(trainer *t);
/* Initialises the weights as the reference modules do, from SEED. */
void trainer_init(trainer *t, uint64_t seed);
/* Zeroes every memory (start of the data, or a wrap). */
void trainer_reset_memory(trainer *t);
/* Doubles of t->mem: L x B x the family's mem_rows x H. */
size_t trainer_mem_floats(const trainer *t);

/* The training forward of one block: X, Y are B x M token ids (input and
 * next token). Returns the mean negative log-likelihood (nats); *AUX gets the
 * regulariser (the family's: aspan's span loss; par: 0). With BACKWARD, the gradient of
 * nll + aux goes to t->g (overwritten). With CARRY, the memories advance. On
 * error returns NAN with ERR set. PAR reads t->mix for the blocks' weights. */
double trainer_forward(trainer *t, const int32_t *x, const int32_t *y, int backward, int carry, double *aux,
                       char *err);

void acts_free(tacts *a);
/* Allocates buffer I of N doubles (zeroed); -1 when out of memory. */
int acts_add(trainer *t, int i, size_t n);
/* Every tensor starts at a multiple of TRAIN_ALIGN doubles of the arena
 * (floats on the device: 16 bytes); the gaps stay zero. */
#define TRAIN_ALIGN 4
/* The parameters of T's tensors (t->n less the gaps). */
size_t trainer_n_params(const trainer *t);
/* Adds a tensor named FMT (shape a x b x c, NDIM of them) to t's table and
 * arena; returns its offset. The table has room for 14 per layer and 8 more. */
size_t train_param_add(trainer *t, tparam_kind kind, int layer, int branch, int ndim, int64_t a, int64_t b,
                       int64_t c, const char *fmt, ...) __attribute__((format(printf, 9, 10)));

/* ------------------------------------------------------------------ families */

struct json_t;
struct st_writer;

/* A model family as the trainer sees it: one struct of data and functions,
 * filled in the family's own file and listed in train_family.c, as SQLite's
 * VFS is. The config, the trainer, the loop, the checkpoint writer and the
 * job server call only these; "NULL: none" marks members a family may leave
 * out. */
struct train_family {
    const char *name;            /* as configs, the API, logs and checkpoints name it */
    int cuda;                    /* kernels/train_gpu trains it (device "cuda", and "auto" on a GPU) */
    const train_key *keys;       /* its own config keys, in the order train_cfg_json writes them */
    int n_keys;
    const char *history_kind;    /* the key of a progress line that carries what it learns ("spans",
                                  * "arch_weights"): the job server draws it over training */
    int search;                  /* it searches an architecture: checkpoints keep the search's history */
    /* its config */
    void (*defaults)(train_cfg *c);                /* its recipe, over the shared defaults */
    int (*check)(const train_cfg *c, char *err);   /* its keys together; -1 with ERR naming them */
    int (*block_len)(const train_cfg *c);          /* M: tokens per block of each stream */
    int (*mem_rows)(const train_cfg *c);           /* rows of memory per layer and stream */
    /* its trainer */
    void (*setup)(trainer *t);                     /* sizes (L H K D A I M) and starting state from t->c */
    void (*params)(trainer *t);                    /* its tensors (train_param_add), in the checkpoint's order */
    /* the starting values W of tensor P, drawing from R (LayerNorms are shared: 1, 0) */
    void (*init)(const trainer *t, const tparam *p, double *w, train_rng *r);
    int (*acts_alloc)(trainer *t);                 /* its activations (acts_add); -1: out of memory */
    /* trainer_forward of checked tokens: the mean NLL, *AUX its regulariser */
    double (*forward)(trainer *t, const int32_t *x, const int32_t *y, int backward, int carry, double *aux);
    /* the loop */
    void (*step_begin)(trainer *t, long s, train_rng *rng);   /* before step S's forward; NULL: none */
    void (*eval_begin)(trainer *t);                /* before an evaluation's forwards; NULL: none */
    struct json_t *(*step_end)(trainer *t, long s);   /* after step S is logged: an event line or NULL; NULL: none */
    /* adds what it learned to progress line LINE (AUX: the mean regulariser
     * since the last line) and, while searching, a row to HISTORY */
    void (*progress)(const trainer *t, double aux, struct json_t *line, struct json_t *history);
    /* the checkpoint: the model config's own keys, before the shared ones
     * (optim, family, vocab_size) and after them (NULL: none) */
    void (*config_head)(const trainer *t, struct json_t *o);
    void (*config_tail)(const trainer *t, struct json_t *o);
    /* tensors the loader reads beside the table (NULL: none); W refers to
     * data the family allocates in *KEEP, which the caller frees after
     * saving; -1: out of memory */
    int (*extra_tensors)(const trainer *t, struct st_writer *w, void **keep);
};

/* The table (train_family.c), NULL-terminated, and its families. */
extern const train_family *const train_families[];
extern const train_family train_family_aspan, train_family_par;
/* The family named NAME, or NULL. */
const train_family *train_family_find(const char *name);
/* The families' names (only those the CUDA trainer runs, with CUDA_ONLY),
 * each between QUOTEs, as `"a", "b" or "c"`, into BUF; returns BUF. */
const char *train_family_names(char *buf, size_t cap, int cuda_only, const char *quote);

/* adaptive-span (train_aspan.c): the window the reference attends to at
 * layer l with the current z (S - trim_len), and the rows it caches
 * (cache_size). */
void aspan_window(const trainer *t, int l, int *window, int *cache);

/* PAR (train_par.c): the index (attn, ffn, skip) of the largest of 3
 * logits, the first on a tie. */
static inline blk_kind par_argmax(const double *a)
{
    int k = 0;
    for (int i = 1; i < 3; i++)
        if (a[i] > a[k]) k = i;
    return (blk_kind)k;
}
/* PAR: this step's Gumbel noise G (L x 3; NULL: none, for evaluation).
 * The forward mixes the blocks by softmax((alpha + g) / tau) while
 * searching, one-hot of the fixed arch after. */
void par_set_mix(trainer *t, const double *gumbel);
/* PAR: the blocks' weights of a forward into MIX (L x 3: attn, ffn,
 * skip): softmax((alpha + g) / tau) while searching, one-hot of the fixed
 * arch after. */
void par_mix(const trainer *t, double *mix);
/* PAR: fixes the architecture as argmax(alpha) and ends the search. */
void par_fix_arch(trainer *t);

/* ------------------------------------------------------------------ optimizer */

/* One update with the gradient in t->g at learning rate LR (weights) and
 * ARCH_LR (alpha, Adam, not clipped). Tensors that took no part in the step
 * are left alone, as PyTorch leaves parameters without a gradient: alpha
 * once the architecture is fixed, and the branches it did not choose. Then
 * z/S is clamped to [0, 1]. */
void train_optim_step(trainer *t, double lr, double arch_lr);
/* Whether tensor I of the table takes part in the current step. */
int train_param_active(const trainer *t, int i);
/* The learning rate of step (1-based) S: lr * min(1, s / lr_warmup). */
double train_lr(const train_cfg *c, long s);

/* ------------------------------------------------------------------ files */

/* Writes the checkpoint in the loader's layout (float32), atomically;
 * VOCAB_JSON is the vocabulary's JSON array, HISTORY (may be NULL) the PAR
 * annealing history, stored as __metadata__.arch_history. */
int trainer_save_checkpoint(const trainer *t, const char *path, const char *vocab_json, const char *history,
                            char *err);

/* ------------------------------------------------------------------ loop */

/* Another device that runs the steps (kernels/train_gpu.h's
 * tgpu_train_device, which server/cmd_train.c passes for --device cuda).
 * The host trainer stays the mirror the loop reads: the config, the step
 * count and z/S (current_val), which the device's step writes back; the
 * weights, moments and memories live on the device and come back with
 * download (checkpoints, the state sidecar). */
typedef struct train_device {
    const char *name;
    void *(*open)(const trainer *t, char *err);   /* plans and uploads t's state */
    void (*close)(void *ctx);
    double (*forward)(void *ctx, const trainer *t, const int32_t *x, const int32_t *y, int backward, int carry,
                      double *aux, char *err);    /* as trainer_forward */
    int (*step)(void *ctx, trainer *t, double lr, char *err);   /* as train_optim_step */
    int (*reset_memory)(void *ctx, char *err);
    int (*stash_memory)(void *ctx, int restore, char *err);    /* keep (0) or put back (1) the memories */
    int (*download)(void *ctx, trainer *t, char *err);         /* weights, moments, memories into t */
    const char *(*device_name)(void *ctx);
    /* several machines (NULL: one): 0 on any but the first, which alone
     * writes checkpoints and state; and the stop request the machines agreed
     * on in the last forward (one asked anywhere stops all after the same
     * step) */
    int (*primary)(void *ctx);
    int (*stop_agreed)(void *ctx);
    /* NULL, or forward (backward, memories carried) and step at LR in one
     * call: the device launches the optimizer behind the backward and
     * waits once; the mean NLL, t->step advanced; NAN with ERR set, and
     * nothing changed, when the loss is not finite */
    double (*train_step)(void *ctx, trainer *t, const int32_t *x, const int32_t *y, double lr, double *aux,
                         char *err);
} train_device;

/* Runs the whole training of C: reads the text, builds the vocabulary,
 * trains, evaluates, writes checkpoints and the state sidecar (OUT.state),
 * and writes progress as JSON lines to LOG. With RESUME, continues from the
 * sidecar. Returns 0, TRAIN_STOPPED (train_request_stop: the checkpoint and
 * state of the last whole step are written, a "stopped" line logged), or -1
 * with ERR set. */
#define TRAIN_STOPPED 3
/* Asks the running loop to stop after the step in progress (from a signal
 * handler: it only sets a flag). */
void train_request_stop(void);
/* Whether a stop was asked (train_request_stop, or a signal). */
int train_stop_pending(void);
int train_run(const train_cfg *c, int resume, FILE *log, char *err);
/* The same, the steps run on DEV when not NULL (config 'device' "cuda"). */
int train_run_on(const train_cfg *c, const train_device *dev, int resume, FILE *log, char *err);

/* The path of the state sidecar of checkpoint OUT. */
void train_state_path(const char *out, char *buf, size_t cap);

#endif
