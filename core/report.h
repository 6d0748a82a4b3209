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
/* {"family", "config", "parameters", "vocab_size", "block_len", "memory"} */
json_t *report_model(const model_t *m);
/* {"bytes_per_stream", "reference_bytes_per_stream", "full_span_bytes_per_stream", "mode"} */
json_t *report_memory(const model_t *m);

#endif
