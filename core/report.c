/*
 * report.c - JSON reports of a loaded model (see report.h).
 */
#include "report.h"


json_t *report_memory(const model_t *m)
{
    return json_pack("{s:I, s:I, s:I, s:s}", "bytes_per_stream", (json_int_t)mem_bytes(m),
                     "reference_bytes_per_stream", (json_int_t)mem_bytes_reference(m),
                     "full_span_bytes_per_stream", (json_int_t)mem_bytes_full(m), "mode",
                     m->fam == FAM_PAR ? "kv" : m->mem_mode == MEM_EXACT ? "exact" : "span");
}

json_t *report_spans(const model_t *m)
{
    json_t *r = json_pack("{s:s}", "family", model_family_name(m->fam));
    if (m->fam == FAM_ASPAN) {
        json_t *layers = json_array();
        for (int l = 0; l < m->n_layers; l++) {
            const layer_t *y = &m->layers[l];
            json_t *heads = json_array();
            for (int h = 0; h < m->n_head; h++)
                json_array_append_new(heads, json_pack("{s:f, s:f, s:i, s:i}", "z", (double)y->zfrac[h],
                                                       "span", (double)y->zfrac[h] * m->span, "reach",
                                                       y->reach[h], "key_rows", y->krows[h]));
            json_array_append_new(layers, json_pack("{s:i, s:o, s:i, s:i, s:i, s:i}", "layer", l, "heads", heads,
                                                    "max_span", y->max_span, "avg_span", y->avg_span,
                                                    "cache_size", y->cache_size, "trim_len", y->trim_len));
        }
        json_object_set_new(r, "attn_span", json_integer(m->span));
        json_object_set_new(r, "ramp", json_integer(m->ramp));
        json_object_set_new(r, "layers", layers);
    } else {
        json_t *blocks = json_array();
        for (int b = 0; b < m->n_layers; b++) {
            const layer_t *y = &m->layers[b];
            json_t *o = json_pack("{s:i, s:s}", "block", b, "kind", blk_kind_name(y->kind));
            double e[3];
            if (model_alpha_softmax(y, e) == 0)
                json_object_set_new(o, "alpha_softmax",
                                    json_pack("{s:f, s:f, s:f}", "attn", e[0], "ffn", e[1], "skip", e[2]));
            json_array_append_new(blocks, o);
        }
        json_object_set_new(r, "mem_len", json_integer(m->mem_len));
        json_object_set_new(r, "blocks", blocks);
    }
    json_object_set_new(r, "memory", report_memory(m));
    return r;
}

void model_cost_of(const model_t *m, model_cost *c)
{
    const double L = m->block_len, V = m->V, D = m->d_model, I = m->d_inner, dh = m->d_head;
    double tok = 2 * V * D, step = 0;   /* the output layer; work once a step, whatever its length */
    for (int l = 0; l < m->n_layers; l++) {
        const layer_t *y = &m->layers[l];
        if (m->fam == FAM_ASPAN) {
            /* q, k, v, o; the feed-forward; per head q.k over the key rows, q.key_pe over as many, and the
             * values of its reach */
            tok += 8 * D * D + 4 * D * I;
            for (int h = 0; h < m->n_head; h++) tok += 2 * dh * (2.0 * y->krows[h] + y->reach[h]);
        } else if (y->kind == BLK_ATTN) {
            /* qkv and o; content, position and value products over mem_len + L keys; a step longer
             * than the table of r_net (par_derive) computes r_net of all its distances */
            const double A = (double)m->n_head * dh, klen = (double)m->mem_len + L;
            tok += 8 * D * A + 6 * A * klen;
            if (m->mem_len + 1 > y->rk_len) step += 2 * D * A * klen;
        } else if (y->kind == BLK_FFN) {
            tok += 4 * D * I;
        }
    }
    c->session_bytes = mem_bytes(m);
    c->token_flops = tok + step;
    c->block_flops = tok * L + step;
}

json_t *report_cost(const model_cost *c)
{
    return json_pack("{s:I, s:f, s:f}", "session_bytes", (json_int_t)c->session_bytes, "flops_per_token",
                     c->token_flops, "flops_per_block", c->block_flops);
}

json_t *report_model(const model_t *m)
{
    json_t *cfg = json_loads(m->config_json, 0, NULL);
    return json_pack("{s:s, s:o, s:I, s:i, s:i, s:o}", "family", model_family_name(m->fam), "config",
                     cfg ? cfg : json_object(), "parameters", (json_int_t)m->n_params, "vocab_size", m->V,
                     "block_len", m->block_len, "memory", report_memory(m));
}
