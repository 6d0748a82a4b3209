/*
 * family.h - a model family behind one interface (for core/ only; the rest
 * of the project sees model.h).
 *
 * A family is one struct of functions, filled in a file of its own and
 * listed in model.c's table:
 *   adaptive-span       aspan.c   Sukhbaatar et al. 2019
 *   par-transformer-xl  par.c     Mandava et al. 2020 (and character
 *                                 Transformer-XLs converted to its layout)
 *   transformer-xl      txl.c     kimiyoung/transformer-xl's MemTransformerLM:
 *                                 adaptive input and softmax, word vocabularies
 *   par-transformer-xl-tf par_tf.c seed 004's TensorFlow PAR Transformer-XL
 *                                 (Jmkernes): SentencePiece, its attention
 *   gpt-adaptive-span   gpt.c     GPT-style window models (gpt.h): the GPT with
 *   nanogpt                       adaptive spans of uuzall/adaptive_attention_span,
 *                                 karpathy/nanoGPT
 * model_load reads the config and the vocabulary, asks the table which
 * family the config names, and calls its functions in this order: config,
 * tensors, (the file's tensors bound), derive. Memory, the forward and the
 * reports call the rest. Adding a family touches its file, the table, and
 * its tests.
 */
#ifndef SPANSERVE_FAMILY_H
#define SPANSERVE_FAMILY_H

#include <jansson.h>

#include "model.h"
#include "st.h"

/* ------------------------------------------------------------ loading helpers */

enum { W_LOAD, W_OPTIONAL, W_IGNORE };  /* required; loaded if present; allowed but not loaded */

typedef struct {
    char name[96];
    int ndim;           /* -1: any shape (W_IGNORE only) */
    int64_t shape[3];
    const float **dst;
    int need;
    st_dtype dtype;     /* as found in the file */
} want_t;

/* The tensors a config implies: each bound to a pointer into the arena. */
typedef struct wantlist {
    want_t *w;
    int n, cap;
} wantlist;

/* Adds the tensor named FMT (shape a x b x c, NDIM of them) to L; -1 when
 * out of memory. */
int want(wantlist *L, const float **dst, int need, int ndim, int64_t a, int64_t b, int64_t c, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
/* Integer config KEY in [LO, HI] into *OUT; DFLT when absent and not REQUIRED. */
int cfg_int(const char *path, json_t *cfg, const char *key, long long lo, long long hi, int required, long long dflt,
            int *out, char *err);
/* Boolean config KEY into *OUT (DFLT when absent). */
int cfg_bool(const char *path, json_t *cfg, const char *key, int dflt, int *out, char *err);

/* ------------------------------------------------------------ the interface */

typedef struct family_ops {
    const char *name;                  /* the API's name of the family */
    /* Config keys a load may set over the file's (model_load_set), NULL-terminated; NULL: none. */
    const char *const *settings;
    /* Whether the config (its "family" string FAM) is this family's. */
    int (*claims)(const char *fam, json_t *cfg);
    /* Sizes from the config; allocates m->layers. */
    int (*config)(model_t *m, json_t *cfg, char *err);
    /* The tensors the config implies. -1: out of memory. */
    int (*tensors)(model_t *m, wantlist *L);
    /* What the reference derives from the weights, once (spans, tables). */
    int (*derive)(model_t *m, const wantlist *L, char *err);
    void (*free_derived)(model_t *m);
    /* The CPU forward (model_forward_targets' contract). */
    int (*forward)(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                   float *logprobs, fwd_ws *ws, char *err);
    /* A stream's memory: SLOTS rings, slot I of KROWS key rows and VROWS
     * value rows of WIDTH floats; what the reference keeps per stream, and
     * the reference at its full span. */
    int (*mem_slots)(const model_t *m);
    int (*slot_krows)(const model_t *m, int i);
    int (*slot_vrows)(const model_t *m, int i);
    int (*slot_width)(const model_t *m);
    /* Rows block L's memory holds (mem_t.len) after POS positions (0: the family keeps no count). */
    int64_t (*held_rows)(const model_t *m, int l, int64_t pos);
    size_t (*mem_reference)(const model_t *m);
    size_t (*mem_full)(const model_t *m);
    const char *full_name;             /* what mem_full measures, in words */
    const char *(*mem_kind)(const model_t *m);   /* report_memory's "mode" */
    /* What it learned, into the report R (report_spans). */
    void (*report)(const model_t *m, json_t *r);
    /* FLOPs of one token (*TOK) and once per step whatever its length (*STEP). */
    void (*cost)(const model_t *m, double *tok, double *step);
    /* 1 where a stream's results do not depend on where its tokens are cut
     * into blocks: each query's keys are a fixed window of the positions
     * before it, whatever block it is fed in (adaptive-span). Such a model's
     * texts are read in longer blocks (model_score_block). 0 (the default)
     * where a block's context depends on its start (Transformer-XL's
     * segments, GPT windows). */
    int cut_free;
} family_ops;

/* The heads of an adaptive-span layer Y as the reports give them: z, span
 * (z * m->span), reach, key_rows (KEY_ROWS, or each head's own when -1). */
json_t *span_heads_report(const model_t *m, const layer_t *y, int key_rows);

extern const family_ops family_aspan, family_par, family_txl, family_par_tf, family_gpt_aspan, family_nanogpt;

/* What the Transformer-XL families share (par.c): the forward (forward.h),
 * the r_net tables, memory of mem_len rows per attention block, reports. */
int par_distance(const model_t *m, int t);
/* m->layers from config 'arch' (n_blocks kinds: attn, ffn, skip); NOTE adds to its message. */
int par_config_arch(model_t *m, json_t *cfg, const char *note, char *err);
int par_derive_tables(model_t *m, char *err);
void par_free_derived(model_t *m);
int par_mem_slots(const model_t *m);
int par_slot_rows(const model_t *m, int i);
int par_slot_width(const model_t *m);
int64_t par_held_rows(const model_t *m, int l, int64_t pos);
size_t par_mem_reference(const model_t *m);
size_t par_mem_full(const model_t *m);
const char *par_mem_kind(const model_t *m);
void par_report(const model_t *m, json_t *r);
void par_cost(const model_t *m, double *tok, double *step);

#endif
