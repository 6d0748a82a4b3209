/*
 * forward.h - internals shared by the CPU forward of the two families:
 * the scratch workspace and the per-family entry points.
 */
#ifndef SPANSERVE_FORWARD_H
#define SPANSERVE_FORWARD_H

#include "model.h"

enum {
    WS_H, WS_Q, WS_K, WS_V, WS_QKV, WS_ATT, WS_TMP, WS_FF, WS_LOGITS,
    WS_KWIN, WS_VWIN, WS_SC, WS_PE, WS_QU, WS_QV, WS_RK, WS_POS, WS_P,
    WS_ADA_HP, WS_ADA_HEAD, WS_ADA_TAIL, WS_ADA_ROWS,
    WS_PICK, WS_PICK_SCRATCH,   /* model_forward_pick's rows, on the host */
    WS_N
};

struct attn_rec;

struct fwd_ws {
    float *buf[WS_N];
    size_t cap[WS_N];
    /* NULL, or what each attention row's final weights are handed to
     * (attention.h): set by attention_run on a workspace of its own */
    struct attn_rec *rec;
};

/* Buffer I of at least N floats, grown (never shrunk) as needed; NULL when
 * out of memory. */
float *ws_get(fwd_ws *w, int i, size_t n);

int aspan_forward(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                  float *logprobs, fwd_ws *ws, char *err);
int par_forward(const model_t *m, mem_t **mems, int B, const int32_t *tokens, int M, const int32_t *targets,
                float *logprobs, fwd_ws *ws, char *err);
/* Transformer-XL's sinusoid at distance T into ROW (D floats). */
void par_sinusoid(float *row, int D, double t);

#endif
