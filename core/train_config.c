/*
 * train_config.c - the keys of a training config: a table says each shared
 * key's type, range and meaning, and each family (train_family.c) brings
 * the table of its own; defaults are the reference recipes
 * (../shared/fixtures/aspan-small and par-small, expected.json "config" and
 * "recipe"), the shared ones here, the rest the family's. Every error names
 * the key.
 */
#include "err.h"
#include "train.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F(x) offsetof(train_cfg, x)
#define BIG TRAIN_KEY_BIG
/* The keys of every family; a family's own are in its file (train_family). */
static const train_key shared_keys[] = {
    /* data, outputs, device */
    {"data", TK_PATH, 0, 0, 0, F(data), "the training text (UTF-8); required"},
    {"out", TK_PATH, 0, 0, 0, F(out), "the checkpoint to write (safetensors); OUT.state is the exact training state; required"},
    {"log", TK_PATH, 0, 0, 0, F(log), "progress as JSON lines to this file (default: standard output)"},
    {"device", TK_DEVICE, 0, 0, 0, F(device), "cpu, cuda (builds with nvcc), or auto (cuda where it can, else cpu)"},
    {"tf32", TK_BOOL, 0, 0, 0, F(tf32), "device cuda: the linear layers' products on tensor cores in TF32 (faster; not within 1e-3 of the CPU's gradients)"},
    {"precision", TK_PRECISION, 0, 0, 0, F(bf16),
     "fp32 (the default), tf32 (as 'tf32': true) or bf16: the CUDA trainer's linear layers on tensor cores in that "
     "precision, with float32 sums, weights and optimizer state"},
    {"gpus", TK_INT, 1, 16, 0, F(gpus), "device cuda: the GPUs of this machine the batch's streams are spread over (data parallel; batch_size a multiple of it)"},
    {"val_fraction", TK_REAL, 0, 0.5, 1, F(val_fraction), "the last fraction of the text, in characters, is the validation text (0.1)"},
    /* schedule */
    {"steps", TK_LONG, 0, BIG, 0, F(steps), "optimizer steps in all (search included for PAR)"},
    {"batch_size", TK_INT, 1, 1 << 16, 0, F(batch_size), "parallel streams the training text is split into"},
    {"seed", TK_U64, 0, 9007199254740992.0, 0, F(seed), "initialisation and Gumbel noise; the same seed gives the same run"},
    {"log_every", TK_LONG, 1, BIG, 0, F(log_every), "a progress line every N steps (train loss averaged over them)"},
    {"eval_every", TK_LONG, 0, BIG, 0, F(eval_every), "validation bpc on the progress lines whose step is a multiple of N, and at the end (0: only at the end)"},
    {"eval_tokens", TK_LONG, 0, BIG, 0, F(eval_tokens), "predictions scored per evaluation (0: the whole validation text)"},
    {"checkpoint_every", TK_LONG, 0, BIG, 0, F(checkpoint_every), "checkpoint and state every N steps (0: only at the end)"},
    /* optimizer */
    {"optim", TK_OPTIM, 0, 0, 0, F(optim), "adagrad or adam"},
    {"lr", TK_REAL, 0, BIG, 1, F(lr), "learning rate of the weights"},
    {"lr_warmup", TK_LONG, 0, BIG, 0, F(lr_warmup), "linear warm-up: lr * min(1, step / lr_warmup), step from 1 (0: none)"},
    {"grad_clip", TK_REAL, 0, BIG, 0, F(grad_clip),
     "adagrad: per tensor, lr scaled by clip/||g|| when ||g|| > clip; adam: global norm clipped to clip (0: none)"},
    {"adam_beta1", TK_REAL, 0, 1, 0, F(beta1), "Adam's beta1 (0.9)"},
    {"adam_beta2", TK_REAL, 0, 1, 0, F(beta2), "Adam's beta2 (0.999)"},
    {"adam_eps", TK_REAL, 0, 1, 1, F(adam_eps), "Adam's epsilon (1e-8)"},
    /* regularisation */
    {"dropout", TK_REAL, 0, 0.99, 0, F(dropout),
     "dropout rate at the reference's sites (adaptive-span: attention weights, feed-forward hidden layer; PAR: as "
     "Transformer-XL's, embedding, positions, attention and feed-forward outputs, hidden layer, last output); 0: none"},
};
#define N_SHARED (sizeof shared_keys / sizeof *shared_keys)

/* tf32 is the CUDA trainer's: a key only of the families it runs */
static int cuda_key(const train_key *k) { return k->off == F(tf32) || k->off == F(gpus) || k->off == F(bf16); }

static const train_key *key_in(const train_key *keys, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(keys[i].key, key) == 0) return &keys[i];
    return NULL;
}

void train_cfg_defaults(train_cfg *c, const train_family *fam)
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
    c->gpus = 1;
    fam->defaults(c);
}

static int set_key(train_cfg *c, const train_key *k, json_t *v, const char *label, char *err)
{
    char *at = (char *)c + k->off;
    switch (k->type) {
    case TK_PATH:
        if (!json_is_string(v) || !*json_string_value(v))
            return err_set(err, "%s: config '%s' must be a non-empty string (%s)", label, k->key, k->doc);
        if (strlen(json_string_value(v)) >= TRAIN_PATH_LEN)
            return err_set(err, "%s: config '%s' is longer than %d bytes", label, k->key, TRAIN_PATH_LEN - 1);
        strcpy(at, json_string_value(v));
        return 0;
    case TK_DEVICE:
        if (!json_is_string(v) || (strcmp(json_string_value(v), "cpu") && strcmp(json_string_value(v), "cuda") &&
                                   strcmp(json_string_value(v), "auto")))
            return err_set(err, "%s: config 'device' must be \"cpu\", \"cuda\" or \"auto\"", label);
        strcpy(at, json_string_value(v));
        return 0;
    case TK_PRECISION: {
        const char *p = json_string_value(v);
        if (!p || (strcmp(p, "fp32") && strcmp(p, "tf32") && strcmp(p, "bf16")))
            return err_set(err, "%s: config 'precision' must be \"fp32\", \"tf32\" or \"bf16\"", label);
        c->tf32 = !strcmp(p, "tf32");
        c->bf16 = !strcmp(p, "bf16");
        return 0;
    }
    case TK_OPTIM:
        if (json_is_string(v) && strcmp(json_string_value(v), "adagrad") == 0) *(train_optim *)at = OPT_ADAGRAD;
        else if (json_is_string(v) && strcmp(json_string_value(v), "adam") == 0) *(train_optim *)at = OPT_ADAM;
        else return err_set(err, "%s: config 'optim' must be \"adagrad\" or \"adam\"", label);
        return 0;
    case TK_BOOL:
        if (!json_is_boolean(v)) return err_set(err, "%s: config '%s' must be true or false", label, k->key);
        *(int *)at = json_is_true(v);
        return 0;
    default: break;
    }
    int integral = k->type != TK_REAL;
    if (integral ? !json_is_integer(v) : !json_is_number(v))
        return err_set(err, "%s: config '%s' must be %s (%s)", label, k->key, integral ? "an integer" : "a number", k->doc);
    double x = json_number_value(v);
    if (!isfinite(x) || x < k->lo || x > k->hi || (k->lo_open && x <= k->lo))
        return err_set(err, "%s: config '%s' = %g is outside %s%g, %g] (%s)", label, k->key, x, k->lo_open ? "(" : "[",
                       k->lo, k->hi, k->doc);
    switch (k->type) {
    case TK_INT: *(int *)at = (int)json_integer_value(v); break;
    case TK_LONG: *(long *)at = (long)json_integer_value(v); break;
    case TK_U64: *(uint64_t *)at = (uint64_t)json_integer_value(v); break;
    default: *(double *)at = x; break;
    }
    return 0;
}

/* The family that has KEY among its own keys, or NULL. */
static const train_family *key_owner(const char *key)
{
    for (int i = 0; train_families[i]; i++)
        if (key_in(train_families[i]->keys, (size_t)train_families[i]->n_keys, key)) return train_families[i];
    return NULL;
}

/* KEY of config C: its definition, or NULL with ERR set (unknown, or
 * another family's). */
static const train_key *find_key(const train_cfg *c, const char *key, const char *label, char *err)
{
    char names[256];
    const train_key *k = key_in(shared_keys, N_SHARED, key);
    if (!k) k = key_in(c->fam->keys, (size_t)c->fam->n_keys, key);
    const train_family *owner = k ? NULL : key_owner(key);
    if (k && cuda_key(k) && !c->fam->cuda)
        err_set(err, "%s: config key '%s' belongs to %s, not %s", label, key, train_family_names(names, sizeof names, 1, ""),
                c->fam->name);
    else if (owner)
        err_set(err, "%s: config key '%s' belongs to %s, not %s", label, key, owner->name, c->fam->name);
    else if (!k)
        err_set(err, "%s: unknown config key '%.64s'", label, key);
    else
        return k;
    return NULL;
}

int train_cfg_from_json(train_cfg *c, const char *text, const char *label, char *err)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!o) return err_set(err, "%s: not valid JSON: %s (line %d)", label, je.text, je.line);
    int rc = -1;
    char names[256];
    if (!json_is_object(o)) { err_set(err, "%s: a config must be a JSON object", label); goto out; }
    const char *name = json_string_value(json_object_get(o, "family"));
    const train_family *fam = train_family_find(name);
    train_family_names(names, sizeof names, 0, "\"");
    if (!name) { err_set(err, "%s: config 'family' is required: %s", label, names); goto out; }
    if (!fam) { err_set(err, "%s: config 'family' = \"%.64s\" is not %s", label, name, names); goto out; }
    train_cfg_defaults(c, fam);
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (strcmp(key, "family") == 0) continue;
        const train_key *k = find_key(c, key, label, err);
        if (!k || set_key(c, k, v, label, err)) goto out;
    }
    /* 'tf32' is the older spelling of 'precision' "tf32": both, in any
     * order, must agree */
    json_t *prec = json_object_get(o, "precision");
    if (prec && json_is_true(json_object_get(o, "tf32")) && strcmp(json_string_value(prec), "tf32")) {
        err_set(err, "%s: config 'tf32' is true but 'precision' is \"%s\": give one precision", label,
                json_string_value(prec));
        goto out;
    }
    if (prec && set_key(c, find_key(c, "precision", label, err), prec, label, err)) goto out;
    rc = 0;
out:
    json_decref(o);
    return rc;
}

int train_cfg_check(const train_cfg *c, char *err)
{
    char names[256];
    if (strcmp(c->device, "cuda") == 0 && !c->fam->cuda)
        return err_set(err, "config 'device' = \"%s\": the CUDA trainer covers the %s family only; train %s with "
                       "--device cpu", c->device, train_family_names(names, sizeof names, 1, ""), c->fam->name);
    if (c->tf32 && strcmp(c->device, "cpu") == 0)
        return err_set(err, "config 'tf32' is true but 'device' is \"%s\": TF32 is the CUDA trainer's", c->device);
    if (c->bf16 && strcmp(c->device, "cpu") == 0)
        return err_set(err, "config 'precision' is \"bf16\" but 'device' is \"%s\": bf16 is the CUDA trainer's (the CPU "
                       "trainer computes in double)", c->device);
    if (c->bf16 && c->tf32) return err_set(err, "config 'tf32' and 'precision' \"bf16\" disagree: give one precision");
    if (c->gpus > 1 && strcmp(c->device, "cpu") == 0)
        return err_set(err, "config 'gpus' = %d but 'device' is \"%s\": several GPUs are the CUDA trainer's", c->gpus,
                       c->device);
    if (c->batch_size % c->gpus)
        return err_set(err, "config 'batch_size' = %d is not a multiple of 'gpus' = %d (each GPU takes as many streams)",
                       c->batch_size, c->gpus);
    if (!c->data[0]) return err_set(err, "config 'data' is required: the text file to train on (or --data FILE)");
    if (!c->out[0]) return err_set(err, "config 'out' is required: the checkpoint to write (or --out FILE)");
    return c->fam->check(c, err);
}

static json_t *key_json(const train_cfg *c, const train_key *k)
{
    const char *at = (const char *)c + k->off;
    switch (k->type) {
    case TK_PATH: return *at ? json_string(at) : NULL;   /* an unset path (log: standard output) is absent, as in a config */
    case TK_DEVICE: return json_string(at);
    case TK_PRECISION: return json_string(c->bf16 ? "bf16" : c->tf32 ? "tf32" : "fp32");
    case TK_OPTIM: return json_string(*(const train_optim *)at == OPT_ADAM ? "adam" : "adagrad");
    case TK_BOOL: return json_boolean(*(const int *)at);
    case TK_INT: return json_integer(*(const int *)at);
    case TK_LONG: return json_integer(*(const long *)at);
    case TK_U64: return json_integer((json_int_t) * (const uint64_t *)at);
    default: return json_real(*(const double *)at);
    }
}

char *train_cfg_json(const train_cfg *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "family", json_string(c->fam->name));
    for (size_t i = 0; i < N_SHARED; i++) {
        json_t *v = cuda_key(&shared_keys[i]) && !c->fam->cuda ? NULL : key_json(c, &shared_keys[i]);
        if (v) json_object_set_new(o, shared_keys[i].key, v);
    }
    for (int i = 0; i < c->fam->n_keys; i++) {
        json_t *v = key_json(c, &c->fam->keys[i]);
        if (v) json_object_set_new(o, c->fam->keys[i].key, v);
    }
    char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    return s;
}
