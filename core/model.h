/*
 * model.h - the model families behind one model type, the memory of a
 * stream, and the CPU forward.
 *
 *   adaptive-span  Sukhbaatar et al. 2019, the reference `TransformerSeq`:
 *                  post-LN layers, each head attends to the S positions before
 *                  it under a soft mask of learned length z.
 *   par-transformer-xl
 *                  Mandava et al. 2020: a Transformer-XL whose blocks are each
 *                  attention, feed-forward or identity (config.arch).
 *   transformer-xl kimiyoung/transformer-xl's MemTransformerLM: layers of
 *                  attention then feed-forward (held as blocks attn, ffn, ...),
 *                  adaptive input and softmax, pre-LN, clamp_len, same_length.
 *   par-transformer-xl-tf
 *                  seed 004's TensorFlow PAR Transformer-XL (Jmkernes/
 *                  PAR-Transformer-XL, par_tf.c): its own relative attention
 *                  (biased projections, scores over d_head, positions by the
 *                  key's row, a ReLU output), Keras LayerNorm, its adaptive
 *                  softmax, SentencePiece pieces; each block the argmax of pi.
 *   gpt            GPT-style models of a fixed context window and no memory
 *                  between windows: nanoGPT, and the GPT with adaptive spans
 *                  of uuzall/adaptive_attention_span (family names "nanogpt",
 *                  "gpt-adaptive-span").
 *
 * core/family.h is the interface each family fills (one file each).
 *
 * ../shared/fixtures/README.md is the specification of tensor names and
 * semantics. Weights live in one float arena laid out at load.
 */
#ifndef SPANSERVE_MODEL_H
#define SPANSERVE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "vocab.h"
#include "sample.h"

typedef enum { BLK_ATTN, BLK_FFN, BLK_SKIP } blk_kind;

/* How an adaptive-span head keeps its memory.
 *   MEM_EXACT: keys of the layer's whole attention window (S - trim_len, as
 *     the reference attends), values of the head's reach only. The reference
 *     softmaxes over the whole window before the mask and renormalises with
 *     a / (sum a + 1e-8): positions past the reach enter through that 1e-8,
 *     which moves a logprob by up to ~1e-4 on heads whose span was cut short.
 *     This mode reproduces it.
 *   MEM_SPAN: keys and values of the head's reach only: the least memory;
 *     outputs differ from the reference only through that 1e-8 term. */
typedef enum { MEM_EXACT, MEM_SPAN } mem_mode;

/* Sizes past these are refused at load: they bound every allocation that a
 * config can cause and are far past any model of these families. */
#define MODEL_MAX_DIM 65536
#define MODEL_MAX_LAYERS 1024
#define MODEL_MAX_HEADS 1024
#define MODEL_MAX_SPAN (1 << 20)
#define MODEL_MAX_VOCAB (1 << 20)
#define MODEL_MAX_PARAMS (16LL << 30)

typedef struct {
    /* adaptive-span layer, or a PAR block (kind says which parts are set) */
    blk_kind kind;
    const float *wq, *wk, *wv, *wo;          /* aspan: H x H each */
    const float *qkv, *rnet, *onet;          /* par: 3*nh*dh x D, nh*dh x D, D x nh*dh */
    const float *ln1_w, *ln1_b;              /* aspan norm1; par attention layer_norm */
    const float *fc1_w, *fc1_b, *fc2_w, *fc2_b;
    const float *ln2_w, *ln2_b;              /* aspan norm2; par ff layer_norm */
    const float *alpha;                      /* par: 3 architecture logits, or NULL */
    const float *qkv_b, *wo_b;               /* gpt, par-tf: the attention's biases (NULL: none) */
    const float *rnet_b;                     /* par-tf: W_pos's bias (in the table rk) */
    const float *pi;                         /* par-tf: the block's 3 probabilities (attn, ffn, skip) */
    const float **bound;                     /* gpt: where each head's tensors were loaded (5 x K) */
    const float *r_w_bias, *r_r_bias;        /* attention blocks: Transformer-XL's u and v (nh x dh) */
    /* adaptive-span spans, as the reference computes them */
    float *zfrac;                            /* K: current_val = z / S */
    const float *mask_tpl;                   /* S: the stored mask_template, checked at load */
    /* adaptive-span with persistent memory (all-attention layers): N key and
     * value vectors a head, and the span module listed again under them */
    const float *pkey, *pval;                /* K x D x N, K x N x D */
    const float *pzfrac, *pmask_tpl;         /* the same values as zfrac, mask_tpl (checked) */
    float *pkey_s, *pval_s;                  /* derived: K x N x D, key^T * sqrt(D); val * sqrt(N) */
    int mask_tpl_bits;                       /* its dtype's significand bits (24, 11 or 8) */
    int *reach;                              /* K: farthest distance with a nonzero mask (values kept) */
    int *krows;                              /* K: distances whose keys are kept (window or reach) */
    float **mask;                            /* K: mask[h][d-1], d = 1..reach[h] */
    int max_span, avg_span, cache_size, trim_len;
    /* par: r_net of the sinusoid at distance t, rows t = 0..rk_len-1
     * (par-tf: R = W_pos(P) + b at position p, rows p = 0..max_position-1) */
    float *rk;
    int rk_len;
} layer_t;

struct mem;
struct family_ops;
struct adaptive;

/* Host work a caller does while a step computes (model_forward_pick_while):
 * called at most once a step. MAY_BLOCK 0: the device's lock is held
 * meanwhile, so the work must not wait for a lock whose holders may attach
 * or free a memory of the model; 1: no lock of the model is held (the CPU). */
typedef void (*fwd_meanwhile)(void *ctx, int may_block);

/* Another device's forward (kernels/ through server/device.c): while a model
 * has one, model_forward runs there and every memory of the model keeps its
 * rings in a copy on that device (mem_t.dev), the host copy brought up to
 * date only when the host needs it (export, spill to disk). */
typedef struct fwd_backend {
    void *ctx;
    /* model_forward_targets' contract (TARGETS may be NULL) */
    int (*forward)(void *ctx, struct mem **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                   float *logprobs, char *err);
    /* model_forward_pick_while's contract: the picks made on the device, MW(MW_CTX) (if not NULL) called once
     * the step is launched, before its answer is waited for */
    int (*forward_pick)(void *ctx, struct mem **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                        float *tlp, int n, const pick_req *q, pick_out *o, fwd_meanwhile mw, void *mw_ctx,
                        char *err);
    int (*attach)(void *ctx, struct mem *s, char *err);   /* make s->dev from the host copy */
    void (*detach)(void *ctx, struct mem *s);             /* free s->dev */
    int (*pull)(void *ctx, struct mem *s, char *err);     /* device -> host */
    int (*push)(void *ctx, struct mem *s, char *err);     /* host -> device */
} fwd_backend;

typedef struct model {
    const struct family_ops *family;   /* its functions (family.h) */
    const fwd_backend *backend;   /* NULL: the CPU */
    mem_mode mem_mode;
    char *path;            /* the file's name in messages (model_load_named's NAME) */
    char *config_json;     /* __metadata__.config as found */
    char *vocab_json;      /* __metadata__.vocab as found */
    vocab_t vocab;
    int V;                 /* vocabulary size */
    int n_layers;          /* aspan layers, or PAR blocks */
    int d_model;           /* H or D */
    int n_head, d_head, d_inner;
    int block_len;         /* block_size (aspan, gpt) or tgt_len (par): the tokens a forward feeds */
    /* gpt: the context window (block_size); 0 for the families with a memory */
    int window;
    int gelu;              /* gpt: the feed-forward's activation is GELU (erf form), not ReLU */
    int cache_kv;          /* gpt: keys and values of a window that starts at 0 stay valid as it grows */
    int bias;              /* gpt: its Linear and LayerNorm layers have biases (nanoGPT's config.bias) */
    const float *wpe;      /* gpt: learned positions, window x d_model */
    const float *lnf_w, *lnf_b;   /* gpt: the final LayerNorm (lnf_b NULL: no bias) */
    /* adaptive-span */
    int span;              /* S, the maximum span */
    int ramp;              /* R */
    const float *key_pe;   /* D x S, column c <-> distance S - c */
    int pers;              /* N persistent vectors a head (0: none); such layers have no feed-forward */
    /* par, transformer-xl */
    int mem_len, tie_weight;
    const float *r_w_bias, *r_r_bias;   /* shared by every block (NULL where each block has its own) */
    int pre_lnorm;         /* sublayer(LN(x)) + x, not LN(x + sublayer(x)) */
    int clamp_len;         /* distances past it are embedded as it (0: none) */
    int same_length;       /* every query of a block sees as many keys */
    struct adaptive *ada;  /* adaptive input and softmax (NULL: emb / out_w / out_b); input only where emb is NULL */
    /* par-transformer-xl-tf (par_tf.c): the attention's projections have
     * biases, scores are divided by d_head (not its root), key j of query i
     * (klen keys) reads row klen-1-(i-j) of the position table rk (rows by
     * position, max_position of them), the output is ReLU(a Wo + bo) */
    int tf_attn;
    int max_position;
    double ln_eps;         /* every LayerNorm's epsilon: 1e-5 (PyTorch), Keras' 1e-3 for par-transformer-xl-tf */
    /* both */
    const float *emb;      /* V x d_model */
    const float *out_w;    /* V x d_model (== emb when tied) */
    const float *out_b;    /* V */
    layer_t *layers;
    float *arena;          /* every weight, one allocation */
    int64_t n_params;
    uint64_t fingerprint;  /* FNV-1a of config, vocab and weights: names a model in saved memories */
} model_t;


/* Loads and validates a checkpoint. Every problem is an error naming the
 * file, the tensor, and what was expected against what was found. */
model_t *model_load(const char *path, char *err);
model_t *model_load_mode(const char *path, mem_mode mode, char *err);
/* Reads PATH but names it NAME in every message (the server's clients see
 * them, and must not learn where its files are). */
model_t *model_load_named(const char *path, const char *name, mem_mode mode, char *err);
/* The same with SETTINGS (a JSON object of config keys, or NULL) over the
 * file's config: only the keys the family lets a load set (transformer-xl:
 * eval_tgt_len, eval_mem_len, eval_clamp_len, eval_same_length); any other
 * is an error naming those. The model's config (and fingerprint) is the
 * result. */
model_t *model_load_set(const char *path, const char *name, mem_mode mode, const char *settings, char *err);
void model_free(model_t *m);
/* The API's name of M's family ("adaptive-span", "par-transformer-xl", "transformer-xl"). */
const char *model_family_name(const model_t *m);
/* PAR: the softmax of a block's architecture logits (attn, ffn, skip);
 * returns -1 when the checkpoint has none. */
int model_alpha_softmax(const layer_t *y, double p[3]);
const char *blk_kind_name(blk_kind k);

/* The name of the model's vocabulary kind (chars, words), for reports. */
static inline const char *model_tokenizer_name(const model_t *m) { return m->vocab.kind->name; }

/* ------------------------------------------------------------------ memory
 * The memory of a stream: what the model carries from one block to the next,
 * plus the one token fed last but not yet consumed ("pending").
 *
 * adaptive-span: per layer and head, a ring of the keys and values of the
 *   last reach[h] positions: only what that head's span can reach (the
 *   reference keeps the layer's input hidden states for the longest span of
 *   the layer). Starts as zeros, as the reference's memory does.
 * par: per attention block, a ring of the keys and values of the last
 *   mem_len positions; starts empty. Feed-forward and skip blocks keep none.
 */
typedef struct mem {
    const model_t *m;
    float *buf;            /* all rings */
    size_t n_floats;
    size_t *off;           /* per layer*head (aspan) or layer (par): offset of K ring; V follows */
    int64_t pos;           /* positions consumed so far */
    int *len;              /* par: rows held per layer (<= mem_len) */
    int32_t pending;       /* the last token, not yet fed; -1 if none */
    /* window models (model_t.window > 0): the last `window` tokens fed, a
     * ring by position; and how a forward reads them (mem_windows) */
    int32_t *toks;
    int keep;
    void *dev;             /* the backend's copy of buf (authoritative while set), or NULL */
} mem_t;

/* Positions a stream may consume: far past any text, far from int64
 * overflow. One bound for feeding, import, export and the state directory,
 * so that a state the server wrote it can always read back. */
#define MEM_MAX_POS (INT64_C(1) << 53)

mem_t *mem_new(const model_t *m);
/* A window model's stream fed in windows, as such models are evaluated: each
 * forward's tokens form one window, fed whole, after the last KEEP tokens
 * held (0: each window alone; window - stride: sliding windows of STRIDE
 * new tokens). Without it (KEEP -1, mem_new's) a stream predicts each token
 * as its model generates: from the window of the last `window` tokens ending
 * at it. A memory model's streams ignore it. */
void mem_windows(mem_t *s, int keep);
/* Tokens a forward of stream S feeds at most in one piece: the model's
 * scoring block (model_score_block), or a window model's stride in windows
 * (mem_windows). Every text, prompt and session chunk is cut into pieces of
 * this length from its start, alone or beside others. */
int mem_block(const mem_t *s);

/* The scoring block: the tokens a stream is fed in one forward when it reads
 * a text or a prompt. block_len, except where the family's results do not
 * depend on where blocks are cut (family_ops.cut_free: adaptive-span, with or
 * without persistent memory): there k * block_len, k the largest of 1..
 * MODEL_SCORE_BLOCK_MULT with k * block_len <= MODEL_SCORE_BLOCK_TOKENS and
 * the block of one stream at most MODEL_SCORE_BLOCK_GFLOP (the server's
 * default --max-step-gflop: a longer block never makes a step longer than
 * the default bound allows), so that one stream fills a GPU. A property of
 * the model alone: the command line and the server cut a text alike,
 * whatever else they run or their flags. */
#define MODEL_SCORE_BLOCK_TOKENS 4096
#define MODEL_SCORE_BLOCK_MULT 8
#define MODEL_SCORE_BLOCK_GFLOP 200.0
int model_score_block(const model_t *m);
/* Tokens stream S may still be given (its pending token counts as given). */
int64_t mem_room(const mem_t *s);
void mem_free(mem_t *s);
void mem_reset(mem_t *s);
int mem_copy(mem_t *dst, const mem_t *src);
size_t mem_bytes(const model_t *m);             /* what this project keeps per stream */
/* Rows block L's memory holds after POS positions (mem_t.len; 0 where the family counts none). */
int64_t mem_held_rows(const model_t *m, int l, int64_t pos);
size_t mem_bytes_reference(const model_t *m);   /* what the reference keeps (hidden states) */
size_t mem_bytes_full(const model_t *m);        /* the reference at the full span */
const char *mem_full_name(const model_t *m);    /* what mem_bytes_full measures, in words */

/* Serialised memory (for session export and snapshots): a header naming the
 * model's shape, then the rings. */
size_t mem_serial_size(const mem_t *s);
int mem_serialize(mem_t *s, void *buf, size_t cap);   /* brings the host copy up to date first */
/* The same in two parts, for writing it without a copy: the header (its
 * size returned, 0 when CAP is short or the device copy cannot be brought
 * up), then the floats of s->buf as they are. */
size_t mem_serial_header(mem_t *s, void *buf, size_t cap);
int mem_deserialize(mem_t *s, const void *buf, size_t len, char *err);

/* ------------------------------------------------------------------ forward
 * Scratch buffers, grown on first use of a larger shape and reused after:
 * the decode step allocates nothing once warm. One per thread. */
typedef struct fwd_ws fwd_ws;
fwd_ws *ws_new(void);
void ws_free(fwd_ws *w);

/* Feeds tokens[b*M + i] (B streams, M tokens each) through the model with
 * each stream's memory, advancing the memories. Writes log-probabilities of
 * the next token, B*M rows of V, to LOGPROBS (if not NULL). Returns 0, or -1
 * with ERR set (out of memory, bad token id). On the CPU a stream's
 * logprobs and memory are bit for bit what it gets forwarded alone (the
 * same M tokens: blocks of other lengths round otherwise). */
int model_forward(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M,
                  float *logprobs, fwd_ws *ws, char *err);
/* The same where only some log-probabilities are wanted: a stream b whose
 * TARGETS[b*M] is >= 0 wants, for each of its rows i, only that of token
 * TARGETS[b*M + i] (written at LOGPROBS[(b*M + i)*V + target]; the rest of
 * the row is left as it was); a stream whose TARGETS[b*M] is -1 wants its
 * whole rows. An adaptive softmax then computes the head and one cluster a
 * row (the cheap path for scoring); other output layers compute the rows.
 * A stream's values never depend on the others in the batch. */
int model_forward_targets(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M,
                          const int32_t *targets, float *logprobs, fwd_ws *ws, char *err);

/* model_forward, then the N picks Q (sample.h) from its B x M rows of
 * logprobs into O, made where the logprobs are: on a GPU the host never
 * holds a row (what decoding needs of a vocabulary of 267,735 words is a
 * token, not a megabyte). TARGETS (B x M, or NULL; a stream whose first is
 * negative has none) get their logprobs in TLP (B x M floats). A row that
 * is not finite is o->token -1, not an error. */
int model_forward_pick(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                       float *tlp, int n, const pick_req *q, pick_out *o, fwd_ws *ws, char *err);
/* The same, with MW(MW_CTX) called once while the step computes: on a device
 * after its launch, before its answer is waited for (the host's work on the
 * last step's answer, a server's events, then costs the step nothing); on
 * the CPU before the forward. Not called when the request is refused before
 * the step starts (bad tokens, picks): a caller that must do the work checks
 * whether it ran. */
int model_forward_pick_while(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M,
                             const int32_t *targets, float *tlp, int n, const pick_req *q, pick_out *o,
                             fwd_meanwhile mw, void *mw_ctx, fwd_ws *ws, char *err);

#endif
