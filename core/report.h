/*
 * report.h - what a model learned and what it costs, as JSON: the spans of
 * every adaptive-span head, the PAR block choices, memory bytes per stream.
 * The same objects back `spanserve spans --json` and the server's routes.
 */
#ifndef SPANSERVE_REPORT_H
#define SPANSERVE_REPORT_H

#include <jansson.h>

#include "model.h"

/* Adaptive-span: {"family", "max_span", "ramp", "layers": [{"layer", "heads":
 * [{"z", "span", "reach", "key_rows"}], "max_span", "avg_span", "cache_size",
 * "trim_len"}], "memory": {...}}. PAR: {"family", "blocks": [{"block",
 * "kind", "alpha_softmax"}], "memory": {...}}. */
json_t *report_spans(const model_t *m);
/* {"family", "config", "parameters", "vocab_size", "block_len", "score_block_len", "memory"} */
json_t *report_model(const model_t *m);
/* {"bytes_per_stream", "reference_bytes_per_stream", "full_span_bytes_per_stream", "mode"} */
json_t *report_memory(const model_t *m);

/* What serving a model costs, for the limits a server sets on the models it
 * loads (a well-formed checkpoint may still be absurd: a small model with a
 * memory of a million positions). FLOPs count the multiply-adds of the
 * matrix products and the attention (2 per multiply-add) at a full memory;
 * norms and activations are left out: an estimate of the step's work, not a
 * prediction of its time. */
typedef struct {
    size_t session_bytes;   /* a stream's memory on the host (mem_bytes) */
    double token_flops;     /* one token of one stream (a decode step) */
    double block_flops;     /* one block of block_len tokens of one stream */
    double step_flops;      /* of those, the work once a step, whatever its length */
    int score_block;        /* the scoring block (model_score_block) */
    double score_block_flops;   /* one scoring block of one stream */
} model_cost;

void model_cost_of(const model_t *m, model_cost *c);
/* One step of one stream of M tokens. */
double model_cost_tokens(const model_cost *c, size_t M);
/* {"session_bytes", "flops_per_token", "flops_per_block", "flops_per_score_block"} */
json_t *report_cost(const model_cost *c);

#endif
