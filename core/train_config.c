/*
 * train_config.c - the keys of a training config: one table says each key's
 * family, type, range and meaning; defaults are the reference recipes
 * (../shared/fixtures/aspan-small and par-small, expected.json "config" and
 * "recipe"). Every error names the key.
 */
#include "err.h"
#include "train.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { K_INT, K_LONG, K_U64, K_REAL, K_PATH, K_BOOL, K_OPTIM, K_DEVICE } ktype;

typedef struct {
    const char *key;
    int fam;            /* FAM_ASPAN, FAM_PAR, or -1 for both */
    ktype type;
    double lo, hi;      /* numbers: the closed range, lo excluded when lo_open */
    int lo_open;
    size_t off;
    const char *doc;
} keydef;

#define F(x) offsetof(train_cfg, x)
#define BIG 1e15
static const keydef keys[] = {
    /* data, outputs, device */
    {"data", -1, K_PATH, 0, 0, 0, F(data), "the training text (UTF-8); required"},
    {"out", -1, K_PATH, 0, 0, 0, F(out), "the checkpoint to write (safetensors); OUT.state is the exact training state; required"},
    {"log", -1, K_PATH, 0, 0, 0, F(log), "progress as JSON lines to this file (default: standard output)"},
    {"device", -1, K_DEVICE, 0, 0, 0, F(device), "cpu, cuda (adaptive-span; builds with nvcc), or auto (cuda where it can, else cpu)"},
    {"tf32", FAM_ASPAN, K_BOOL, 0, 0, 0, F(tf32), "device cuda: the linear layers' products on tensor cores in TF32 (faster; not within 1e-3 of the CPU's gradients)"},
    {"val_fraction", -1, K_REAL, 0, 0.5, 1, F(val_fraction), "the last fraction of the text, in characters, is the validation text (0.1)"},
    /* schedule */
    {"steps", -1, K_LONG, 0, BIG, 0, F(steps), "optimizer steps in all (search included for PAR)"},
    {"batch_size", -1, K_INT, 1, 1 << 16, 0, F(batch_size), "parallel streams the training text is split into"},
    {"seed", -1, K_U64, 0, 9007199254740992.0, 0, F(seed), "initialisation and Gumbel noise; the same seed gives the same run"},
    {"log_every", -1, K_LONG, 1, BIG, 0, F(log_every), "a progress line every N steps (train loss averaged over them)"},
    {"eval_every", -1, K_LONG, 0, BIG, 0, F(eval_every), "validation bpc on the progress lines whose step is a multiple of N, and at the end (0: only at the end)"},
    {"eval_tokens", -1, K_LONG, 0, BIG, 0, F(eval_tokens), "predictions scored per evaluation (0: the whole validation text)"},
    {"checkpoint_every", -1, K_LONG, 0, BIG, 0, F(checkpoint_every), "checkpoint and state every N steps (0: only at the end)"},
    /* optimizer */
    {"optim", -1, K_OPTIM, 0, 0, 0, F(optim), "adagrad or adam"},
    {"lr", -1, K_REAL, 0, BIG, 1, F(lr), "learning rate of the weights"},
    {"lr_warmup", -1, K_LONG, 0, BIG, 0, F(lr_warmup), "linear warm-up: lr * min(1, step / lr_warmup), step from 1 (0: none)"},
    {"grad_clip", -1, K_REAL, 0, BIG, 0, F(grad_clip),
     "adagrad: per tensor, lr scaled by clip/||g|| when ||g|| > clip; adam: global norm clipped to clip (0: none)"},
    {"adam_beta1", -1, K_REAL, 0, 1, 0, F(beta1), "Adam's beta1 (0.9)"},
    {"adam_beta2", -1, K_REAL, 0, 1, 0, F(beta2), "Adam's beta2 (0.999)"},
    {"adam_eps", -1, K_REAL, 0, 1, 1, F(adam_eps), "Adam's epsilon (1e-8)"},
    /* adaptive-span */
    {"hidden_size", FAM_ASPAN, K_INT, 1, 65536, 0, F(hidden_size), "H, the model width"},
    {"inner_hidden_size", FAM_ASPAN, K_INT, 1, 1 << 19, 0, F(inner_hidden_size), "the feed-forward width"},
    {"nb_heads", FAM_ASPAN, K_INT, 1, 1024, 0, F(nb_heads), "K heads; H must be a multiple of K"},
    {"nb_layers", FAM_ASPAN, K_INT, 1, 1024, 0, F(nb_layers), "layers"},
    {"attn_span", FAM_ASPAN, K_INT, 1, 1 << 20, 0, F(attn_span), "S, the maximum span"},
    {"block_size", FAM_ASPAN, K_INT, 1, 1 << 20, 0, F(block_size), "M, tokens per block"},
    {"adapt_span_ramp", FAM_ASPAN, K_INT, 1, 1 << 20, 0, F(adapt_span_ramp), "R, the soft mask's ramp"},
    {"adapt_span_loss", FAM_ASPAN, K_REAL, 0, BIG, 0, F(adapt_span_loss), "span loss coefficient: coeff * S * mean(z/S) per layer"},
    {"adapt_span_init", FAM_ASPAN, K_REAL, 0, 1, 0, F(adapt_span_init), "z/S at the start, every head"},
    /* par-transformer-xl */
    {"n_blocks", FAM_PAR, K_INT, 1, 1024, 0, F(n_blocks), "stochastic blocks"},
    {"n_head", FAM_PAR, K_INT, 1, 1024, 0, F(n_head), "attention heads"},
    {"d_model", FAM_PAR, K_INT, 2, 65536, 0, F(d_model), "D, the model width (even)"},
    {"d_head", FAM_PAR, K_INT, 1, 65536, 0, F(d_head), "width of a head"},
    {"d_inner", FAM_PAR, K_INT, 1, 1 << 19, 0, F(d_inner), "the feed-forward width"},
    {"mem_len", FAM_PAR, K_INT, 0, 1 << 20, 0, F(mem_len), "memory rows per attention block"},
    {"tgt_len", FAM_PAR, K_INT, 1, 1 << 20, 0, F(tgt_len), "tokens per segment"},
    {"tie_weight", FAM_PAR, K_BOOL, 0, 0, 0, F(tie_weight), "the output layer shares the embedding"},
    {"search_steps", FAM_PAR, K_LONG, 0, BIG, 0, F(search_steps), "steps of architecture search before the argmax is fixed"},
    {"arch_lr", FAM_PAR, K_REAL, 0, BIG, 1, F(arch_lr), "Adam learning rate of alpha (not clipped)"},
    {"tau_start", FAM_PAR, K_REAL, 0, BIG, 1, F(tau_start), "Gumbel-softmax temperature at the start of the search"},
    {"tau_end", FAM_PAR, K_REAL, 0, BIG, 1, F(tau_end), "temperature at the end: tau = start * (end/start)^(step/search_steps)"},
};
#define N_KEYS (sizeof keys / sizeof *keys)

void train_cfg_defaults(train_cfg *c, model_family fam)
{
    memset(c, 0, sizeof *c);
    c->fam = fam;
    strcpy(c->device, "auto");
    c->val_fraction = 0.1;
    c->steps = 3000;
    c->batch_size = 32;
    c->seed = 1;
    c->log_every = 200;
    c->eval_every = 1000;
    c->checkpoint_every = 1000;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->adam_eps = 1e-8;
    if (fam == FAM_ASPAN) {   /* aspan-small */
        c->optim = OPT_ADAGRAD;
        c->lr = 0.07;
        c->lr_warmup = 300;
        c->grad_clip = 0.03;
        c->hidden_size = 128;
        c->inner_hidden_size = 512;
        c->nb_heads = 4;
        c->nb_layers = 4;
        c->attn_span = 512;
        c->block_size = 64;
        c->adapt_span_ramp = 32;
        c->adapt_span_loss = 2e-5;
        c->adapt_span_init = 0;
    } else {                  /* par-small */
        c->optim = OPT_ADAM;
        c->lr = 1e-3;
        c->lr_warmup = 0;
        c->grad_clip = 0.25;
        c->n_blocks = 8;
        c->n_head = 4;
        c->d_model = 128;
        c->d_head = 32;
        c->d_inner = 512;
        c->mem_len = 96;
        c->tgt_len = 48;
        c->tie_weight = 1;
        c->search_steps = 2000;
        c->arch_lr = 3e-3;
        c->tau_start = 1.0;
        c->tau_end = 0.05;
    }
}

static const char *fam_name(int f) { return f == FAM_ASPAN ? "adaptive-span" : "par-transformer-xl"; }

static int set_key(train_cfg *c, const keydef *k, json_t *v, const char *label, char *err)
{
    char *at = (char *)c + k->off;
    switch (k->type) {
    case K_PATH:
        if (!json_is_string(v) || !*json_string_value(v))
            return err_set(err, "%s: config '%s' must be a non-empty string (%s)", label, k->key, k->doc);
        if (strlen(json_string_value(v)) >= TRAIN_PATH_LEN)
            return err_set(err, "%s: config '%s' is longer than %d bytes", label, k->key, TRAIN_PATH_LEN - 1);
        strcpy(at, json_string_value(v));
        return 0;
    case K_DEVICE:
        if (!json_is_string(v) || (strcmp(json_string_value(v), "cpu") && strcmp(json_string_value(v), "cuda") &&
                                   strcmp(json_string_value(v), "auto")))
            return err_set(err, "%s: config 'device' must be \"cpu\", \"cuda\" or \"auto\"", label);
        strcpy(at, json_string_value(v));
        return 0;
    case K_OPTIM:
        if (json_is_string(v) && strcmp(json_string_value(v), "adagrad") == 0) *(train_optim *)at = OPT_ADAGRAD;
        else if (json_is_string(v) && strcmp(json_string_value(v), "adam") == 0) *(train_optim *)at = OPT_ADAM;
        else return err_set(err, "%s: config 'optim' must be \"adagrad\" or \"adam\"", label);
        return 0;
    case K_BOOL:
        if (!json_is_boolean(v)) return err_set(err, "%s: config '%s' must be true or false", label, k->key);
        *(int *)at = json_is_true(v);
        return 0;
    default: break;
    }
    int integral = k->type != K_REAL;
    if (integral ? !json_is_integer(v) : !json_is_number(v))
        return err_set(err, "%s: config '%s' must be %s (%s)", label, k->key, integral ? "an integer" : "a number", k->doc);
    double x = json_number_value(v);
    if (!isfinite(x) || x < k->lo || x > k->hi || (k->lo_open && x <= k->lo))
        return err_set(err, "%s: config '%s' = %g is outside %s%g, %g] (%s)", label, k->key, x, k->lo_open ? "(" : "[",
                       k->lo, k->hi, k->doc);
    switch (k->type) {
    case K_INT: *(int *)at = (int)json_integer_value(v); break;
    case K_LONG: *(long *)at = (long)json_integer_value(v); break;
    case K_U64: *(uint64_t *)at = (uint64_t)json_integer_value(v); break;
    default: *(double *)at = x; break;
    }
    return 0;
}

int train_cfg_from_json(train_cfg *c, const char *text, const char *label, char *err)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!o) return err_set(err, "%s: not valid JSON: %s (line %d)", label, je.text, je.line);
    int rc = -1;
    if (!json_is_object(o)) { err_set(err, "%s: a config must be a JSON object", label); goto out; }
    const char *fam = json_string_value(json_object_get(o, "family"));
    if (!fam) { err_set(err, "%s: config 'family' is required: \"adaptive-span\" or \"par-transformer-xl\"", label); goto out; }
    if (strcmp(fam, "adaptive-span") == 0) train_cfg_defaults(c, FAM_ASPAN);
    else if (strcmp(fam, "par-transformer-xl") == 0) train_cfg_defaults(c, FAM_PAR);
    else {
        err_set(err, "%s: config 'family' = \"%.64s\" is not \"adaptive-span\" or \"par-transformer-xl\"", label, fam);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (strcmp(key, "family") == 0) continue;
        const keydef *k = NULL;
        for (size_t i = 0; i < N_KEYS && !k; i++)
            if (strcmp(keys[i].key, key) == 0) k = &keys[i];
        if (!k) { err_set(err, "%s: unknown config key '%.64s'", label, key); goto out; }
        if (k->fam >= 0 && k->fam != (int)c->fam) {
            err_set(err, "%s: config key '%s' belongs to %s, not %s", label, key, fam_name(k->fam), fam);
            goto out;
        }
        if (set_key(c, k, v, label, err)) goto out;
    }
    rc = 0;
out:
    json_decref(o);
    return rc;
}

int train_cfg_check(const train_cfg *c, char *err)
{
    if (strcmp(c->device, "cuda") == 0 && c->fam != FAM_ASPAN)
        return err_set(err, "config 'device' = \"%s\": the CUDA trainer covers the adaptive-span family only; train "
                       "par-transformer-xl with --device cpu", c->device);
    if (c->tf32 && strcmp(c->device, "cpu") == 0)
        return err_set(err, "config 'tf32' is true but 'device' is \"%s\": TF32 is the CUDA trainer's", c->device);
    if (!c->data[0]) return err_set(err, "config 'data' is required: the text file to train on (or --data FILE)");
    if (!c->out[0]) return err_set(err, "config 'out' is required: the checkpoint to write (or --out FILE)");
    if (c->fam == FAM_ASPAN) {
        if (c->hidden_size % c->nb_heads)
            return err_set(err, "config 'hidden_size' = %d is not a multiple of 'nb_heads' = %d", c->hidden_size,
                           c->nb_heads);
    } else {
        if (c->d_model % 2) return err_set(err, "config 'd_model' = %d must be even (sinusoid pairs)", c->d_model);
        if ((long long)c->n_head * c->d_head > 65536)
            return err_set(err, "config 'n_head' * 'd_head' = %lld is over 65536", (long long)c->n_head * c->d_head);
    }
    return 0;
}

char *train_cfg_json(const train_cfg *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "family", json_string(fam_name(c->fam)));
    for (size_t i = 0; i < N_KEYS; i++) {
        const keydef *k = &keys[i];
        if (k->fam >= 0 && k->fam != (int)c->fam) continue;
        const char *at = (const char *)c + k->off;
        json_t *v;
        switch (k->type) {
        case K_PATH:
            if (!*at) continue;   /* an unset path (log: standard output) is absent, as in a config */
            v = json_string(at);
            break;
        case K_DEVICE: v = json_string(at); break;
        case K_OPTIM: v = json_string(*(const train_optim *)at == OPT_ADAM ? "adam" : "adagrad"); break;
        case K_BOOL: v = json_boolean(*(const int *)at); break;
        case K_INT: v = json_integer(*(const int *)at); break;
        case K_LONG: v = json_integer(*(const long *)at); break;
        case K_U64: v = json_integer((json_int_t) * (const uint64_t *)at); break;
        default: v = json_real(*(const double *)at); break;
        }
        json_object_set_new(o, k->key, v);
    }
    char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    return s;
}

char *train_model_config_json(const train_cfg *c, int V, const char *const *arch)
{
    json_t *o = json_object();
    if (c->fam == FAM_ASPAN) {
        json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
        json_object_set_new(o, "inner_hidden_size", json_integer(c->inner_hidden_size));
        json_object_set_new(o, "nb_heads", json_integer(c->nb_heads));
        json_object_set_new(o, "nb_layers", json_integer(c->nb_layers));
        json_object_set_new(o, "attn_span", json_integer(c->attn_span));
        json_object_set_new(o, "block_size", json_integer(c->block_size));
        json_object_set_new(o, "batch_size", json_integer(c->batch_size));
        json_object_set_new(o, "adapt_span_loss", json_real(c->adapt_span_loss));
        json_object_set_new(o, "adapt_span_ramp", json_integer(c->adapt_span_ramp));
        json_object_set_new(o, "adapt_span_init", json_real(c->adapt_span_init));
        json_object_set_new(o, "lr", json_real(c->lr));
        json_object_set_new(o, "lr_warmup", json_integer(c->lr_warmup));
        json_object_set_new(o, "grad_clip", json_real(c->grad_clip));
    } else {
        json_object_set_new(o, "n_blocks", json_integer(c->n_blocks));
        json_object_set_new(o, "n_head", json_integer(c->n_head));
        json_object_set_new(o, "d_model", json_integer(c->d_model));
        json_object_set_new(o, "d_head", json_integer(c->d_head));
        json_object_set_new(o, "d_inner", json_integer(c->d_inner));
        json_object_set_new(o, "mem_len", json_integer(c->mem_len));
        json_object_set_new(o, "tgt_len", json_integer(c->tgt_len));
        json_object_set_new(o, "batch_size", json_integer(c->batch_size));
        json_object_set_new(o, "lr", json_real(c->lr));
        json_object_set_new(o, "arch_lr", json_real(c->arch_lr));
        json_object_set_new(o, "tau_start", json_real(c->tau_start));
        json_object_set_new(o, "tau_end", json_real(c->tau_end));
        json_object_set_new(o, "search_steps", json_integer(c->search_steps));
    }
    json_object_set_new(o, "optim", json_string(c->optim == OPT_ADAM ? "adam" : "adagrad"));
    json_object_set_new(o, "family", json_string(fam_name(c->fam)));
    json_object_set_new(o, "vocab_size", json_integer(V));
    if (c->fam == FAM_PAR) {
        json_t *a = json_array();
        for (int b = 0; b < c->n_blocks; b++) json_array_append_new(a, json_string(arch[b]));
        json_object_set_new(o, "arch", a);
        json_object_set_new(o, "tie_weight", json_boolean(c->tie_weight));
    }
    json_object_set_new(o, "trainer", json_sprintf("spanserve train (%s%s)", c->device, c->tf32 ? ", tf32" : ""));
    char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    return s;
}
