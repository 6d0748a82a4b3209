/*
 * report.c - JSON reports of a loaded model (see report.h).
 */
#include "report.h"
#include "family.h"


json_t *report_memory(const model_t *m)
{
    return json_pack("{s:I, s:I, s:I, s:s}", "bytes_per_stream", (json_int_t)mem_bytes(m),
                     "reference_bytes_per_stream", (json_int_t)mem_bytes_reference(m),
                     "full_span_bytes_per_stream", (json_int_t)mem_bytes_full(m), "mode",
                     m->family->mem_kind(m));
}

json_t *report_spans(const model_t *m)
{
    json_t *r = json_pack("{s:s, s:s}", "family", m->family->name, "tokenizer", model_tokenizer_name(m));
    m->family->report(m, r);
    json_object_set_new(r, "memory", report_memory(m));
    return r;
}

void model_cost_of(const model_t *m, model_cost *c)
{
    /* the output layer, and the family's layers; work once a step, whatever its length */
    double tok = 2.0 * m->V * m->d_model, step = 0;
    m->family->cost(m, &tok, &step);
    c->session_bytes = mem_bytes(m);
    c->token_flops = tok + step;
    c->block_flops = tok * m->block_len + step;
    c->step_flops = step;
    c->score_block = model_score_block(m);
    c->score_block_flops = tok * c->score_block + step;
}

double model_cost_tokens(const model_cost *c, size_t M)
{
    return (c->token_flops - c->step_flops) * (double)M + c->step_flops;
}

json_t *report_cost(const model_cost *c)
{
    return json_pack("{s:I, s:f, s:f, s:f}", "session_bytes", (json_int_t)c->session_bytes, "flops_per_token",
                     c->token_flops, "flops_per_block", c->block_flops, "flops_per_score_block",
                     c->score_block_flops);
}

json_t *report_model(const model_t *m)
{
    json_t *cfg = json_loads(m->config_json, 0, NULL);
    return json_pack("{s:s, s:s, s:o, s:I, s:i, s:i, s:i, s:o}", "family", m->family->name, "tokenizer",
                     model_tokenizer_name(m), "config", cfg ? cfg : json_object(), "parameters",
                     (json_int_t)m->n_params, "vocab_size", m->V, "block_len", m->block_len, "score_block_len",
                     model_score_block(m), "memory", report_memory(m));
}
