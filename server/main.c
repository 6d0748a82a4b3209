/*
 * main.c - the `spanserve` command: one binary, one subcommand per job.
 *
 *   spanserve score    --model PATH [--json] FILE   bits per character of a text
 *   spanserve spans    --model PATH [--json]        what the model learned
 *   spanserve generate --model PATH [...]           sample text
 *   spanserve train    --config FILE [...]          train a model (cmd_train.c)
 *
 * Every subcommand answers --help; wrong arguments print the usage and exit
 * with status 2; a failure at run time prints one line and exits 1.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "err.h"
#include "infer.h"
#include "model.h"
#include "report.h"
#include "server.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPANSERVE_VERSION "0.1.0"

static const char *prog = "spanserve";

static double clock_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_memory_mode(const char *s, mem_mode *out)
{
    if (strcmp(s, "exact") == 0) *out = MEM_EXACT;
    else if (strcmp(s, "span") == 0) *out = MEM_SPAN;
    else return -1;
    return 0;
}

/* Reads all of PATH ("-" for standard input). */
static char *read_all(const char *path, size_t *len, char *err)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        err_set(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
        if (n == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) { free(buf); buf = NULL; }
            else buf = b;
        }
    }
    int bad = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf || bad) {
        free(buf);
        err_set(err, "%s: %s", path, bad ? "read error" : "out of memory");
        return NULL;
    }
    *len = n;
    return buf;
}

/* ------------------------------------------------------------------ score */

static const char score_usage[] =
    "usage: spanserve score --model PATH [--json] [--memory exact|span]\n"
    "                       [--device cpu|cuda|auto] [--precision bf16|fp32]\n"
    "                       [--stride N] [--set KEY=VALUE]... FILE\n"
    "\n"
    "Scores every prediction of the text in FILE (\"-\" for standard input):\n"
    "token i+1 given all before it, in blocks of the model's block length with\n"
    "the memory carried; a model of a fixed window (nanogpt, gpt-adaptive-span)\n"
    "in consecutive windows of its block_size, each alone, as those projects\n"
    "evaluate (the last window may be shorter), or with --stride N in sliding\n"
    "windows: each a window of N new tokens after the block_size - N before\n"
    "them. Prints the tokens scored, the mean negative\n"
    "log-likelihood (nats), bits per character (character models) and\n"
    "perplexity; on a terminal, a progress line on stderr meanwhile. A word\n"
    "model reads FILE as its trainer read a file: each line's words, then <eos>.\n"
    "\n"
    "  --model PATH     checkpoint (.safetensors)\n"
    "  --json           print {\"tokens\":N,\"nll\":x,\"bpc\":x,\"ppl\":x} (bpc for character models)\n"
    "  --memory MODE    adaptive-span memory: exact (default: keys of the whole\n"
    "                   attention window, as the reference) or span (only what\n"
    "                   each head's span reaches; least memory)\n"
    "  --device D       cpu, cuda, or auto (default: the GPU when there is one and\n"
    "                   this build has the CUDA core, else the CPU)\n"
    "  --precision P    on the GPU: bf16 (default; weights and memory in bfloat16,\n"
    "                   sums in fp32) or fp32 (the reference to 1e-4)\n"
    "  --stride N       window models: sliding windows of N new tokens (1..block_size)\n"
    "  --set KEY=VALUE  a setting over the checkpoint's (transformer-xl:\n"
    "                   eval_tgt_len, eval_mem_len, eval_clamp_len, eval_same_length)\n";

static void free_model(model_t *m)
{
    if (!m) return;
    device_detach(m);
    model_free(m);
}

/* Model PATH in MODE, on DEVICE at PRECISION (cli.h); NULL after saying why. */
static model_t *open_model(const char *path, mem_mode mode, const char *device, const char *precision, json_t *sets)
{
    char err[ERR_LEN];
    char *settings = cli_settings_for(sets, NULL);
    model_t *m = model_load_set(path, path, mode, settings, err);
    free(settings);
    json_decref(sets);
    if (m && cli_place_model(m, device, precision, err)) {
        model_free(m);
        m = NULL;
    }
    if (!m) fprintf(stderr, "%s: %s\n", prog, err);
    return m;
}

/* Scores TOKS[0..n) with the memory S in pieces of whole blocks (what one
 * call over the whole text computes, cut where it cuts its blocks), so that
 * a progress line can follow. */
static int score_with_progress(const model_t *m, mem_t *s, fwd_ws *ws, const int32_t *toks, size_t n, score_t *sc,
                               char *err)
{
    const size_t piece = (size_t)mem_block(s) * 64;
    cli_progress p;
    cli_progress_begin(&p, "scoring", "tokens");
    /* the first piece also feeds the first token, which nothing predicts */
    for (size_t at = 0; at < n;) {
        size_t k = at == 0 ? 1 + piece : piece;
        if (k > n - at) k = n - at;
        if (infer_score(m, s, ws, toks + at, k, sc, NULL, err)) {
            cli_progress_end(&p);
            return -1;
        }
        at += k;
        cli_progress_update(&p, (double)sc->tokens, (double)(n - 1));
    }
    cli_progress_end(&p);
    return 0;
}

static int cmd_score(int argc, char **argv)
{
    static const struct option opts[] = {{"model", 1, 0, 'm'}, {"json", 0, 0, 'j'}, {"memory", 1, 0, 'M'},
                                          {"device", 1, 0, 'd'}, {"precision", 1, 0, 'p'}, {"help", 0, 0, 'h'},
                                          {"set", 1, 0, 'e'}, {"stride", 1, 0, 's'}, {0, 0, 0, 0}};
    const char *model = NULL, *device = "auto", *precision = "bf16";
    int json = 0, c;
    long stride = 0;
    json_t *sets = NULL;
    char set_err[ERR_LEN];
    mem_mode mode = MEM_EXACT;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'j': json = 1; break;
        case 'M':
            if (parse_memory_mode(optarg, &mode)) return cli_usage_error("score", "--memory must be exact or span");
            break;
        case 'd':
            if (cli_parse_device(optarg, &device)) return cli_usage_error("score", "--device must be cpu, cuda or auto");
            break;
        case 'p':
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32")) return cli_usage_error("score", "--precision must be bf16 or fp32");
            precision = optarg;
            break;
        case 'e':
            if (cli_settings_add(&sets, optarg, 0, set_err)) return cli_usage_error("score", "--set: %s", set_err);
            break;
        case 's': {
            char *end;
            stride = strtol(optarg, &end, 10);
            if (end == optarg || *end || stride < 1 || stride > MODEL_MAX_SPAN)
                return cli_usage_error("score", "--stride must be a positive integer");
            break;
        }
        case 'h': fputs(score_usage, stdout); return 0;
        default: return cli_bad_option("score", opts, argv, optind);
        }
    }
    if (!model) return cli_usage_error("score", "--model is required");
    if (optind != argc - 1) return cli_usage_error("score", "one FILE to score is required");
    char err[ERR_LEN];
    size_t len, n = 0;
    char *text = read_all(argv[optind], &len, err);
    if (!text) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 1;
    }
    model_t *m = open_model(model, mode, device, precision, sets);
    int32_t *toks = NULL;
    int rc = 1;
    if (!m) goto out;
    if (vocab_encode(&m->vocab, text, len, &toks, &n, err)) {
        fprintf(stderr, "%s: %s: %s\n", prog, argv[optind], err);
        goto out;
    }
    if (n < 2) { fprintf(stderr, "%s: %s: a text of %zu tokens has nothing to predict\n", prog, argv[optind], n); goto out; }
    if (stride && (!m->window || stride > m->window)) {
        if (!m->window) fprintf(stderr, "%s: --stride applies to models with a fixed window (nanogpt, gpt-adaptive-span)\n", prog);
        else fprintf(stderr, "%s: --stride %ld is over the model's window of %d tokens\n", prog, stride, m->window);
        goto out;
    }
    mem_t *s = mem_new(m);
    if (s && m->window) mem_windows(s, stride ? m->window - (int)stride : 0);
    fwd_ws *ws = ws_new();
    score_t sc = {0, 0};
    double t0 = clock_s();
    if (!s || !ws || score_with_progress(m, s, ws, toks, n, &sc, err)) {
        fprintf(stderr, "%s: %s\n", prog, s && ws ? err : "out of memory");
    } else {
        double dt = clock_s() - t0, nll = sc.nll_sum / (double)sc.tokens;
        const int chars = m->vocab.kind->per_character;   /* bits per character only where a token is one */
        if (json && chars)
            printf("{\"tokens\":%ld,\"nll\":%.9g,\"bpc\":%.9g,\"ppl\":%.9g}\n", sc.tokens, nll, nll / M_LN2, exp(nll));
        else if (json)
            printf("{\"tokens\":%ld,\"nll\":%.9g,\"ppl\":%.9g}\n", sc.tokens, nll, exp(nll));
        else {
            printf("tokens  %ld\nnll     %.6f nats\n", sc.tokens, nll);
            if (chars) printf("bpc     %.6f\n", nll / M_LN2);
            printf("ppl     %.4f\n", exp(nll));
            fflush(stdout);
            fprintf(stderr, "%.0f tokens/s (%.2f s) on %s (%s)\n", sc.tokens / dt, dt, device_name(m), device_precision(m));
        }
        rc = 0;
    }
    mem_free(s);
    ws_free(ws);
out:
    free(toks);
    free(text);
    free_model(m);
    return rc;
}

/* ------------------------------------------------------------------ spans */

static const char spans_usage[] =
    "usage: spanserve spans --model PATH [--json] [--memory exact|span]\n"
    "\n"
    "What the model learned. Adaptive-span: per layer and head the span\n"
    "z = current_val * S, the reference's max_span, avg_span and cache_size,\n"
    "and the rows this server keeps. PAR: per block the chosen kind and the\n"
    "softmax of its architecture logits. Both: memory bytes per stream.\n";

static void print_bytes(const char *what, size_t b)
{
    printf("%-34s %10zu bytes (%.2f MB)\n", what, b, b / 1e6);
}

static int cmd_spans(int argc, char **argv)
{
    static const struct option opts[] = {{"model", 1, 0, 'm'}, {"json", 0, 0, 'j'}, {"memory", 1, 0, 'M'},
                                          {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    const char *model = NULL;
    int json = 0, c;
    mem_mode mode = MEM_EXACT;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'j': json = 1; break;
        case 'M':
            if (parse_memory_mode(optarg, &mode)) return cli_usage_error("spans", "--memory must be exact or span");
            break;
        case 'h': fputs(spans_usage, stdout); return 0;
        default: return cli_bad_option("spans", opts, argv, optind);
        }
    }
    if (!model) return cli_usage_error("spans", "--model is required");
    if (optind != argc) return cli_usage_error("spans", "unexpected argument '%s'", argv[optind]);
    char err[ERR_LEN];
    model_t *m = model_load_mode(model, mode, err);
    if (!m) { fprintf(stderr, "%s: %s\n", prog, err); return 1; }
    if (json) {
        json_t *r = report_spans(m);
        char *s = json_dumps(r, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
        puts(s);
        free(s);
        json_decref(r);
    } else {
        /* the report, as a table: heads' spans per layer, or the blocks */
        json_t *r = report_spans(m), *layers = json_object_get(r, "layers"), *blocks = json_object_get(r, "blocks");
        size_t i;
        json_t *y;
        const int window = (int)json_integer_value(json_object_get(r, "window"));
        if (window)
            printf("%s: a window of %d tokens, no memory between windows; a session recomputes %s\n\n",
                   json_string_value(json_object_get(r, "family")), window,
                   json_string_value(json_object_get(r, "recompute")));
        if (layers && window) {
            printf("layer  spans per head (z*max_size; reach: keys from the window's end with a nonzero mask)\n");
            json_array_foreach(layers, i, y) {
                printf("%5zu ", i);
                size_t h;
                json_t *hd;
                json_array_foreach(json_object_get(y, "heads"), h, hd)
                    printf(" %.1f(%d)", json_number_value(json_object_get(hd, "span")),
                           (int)json_integer_value(json_object_get(hd, "reach")));
                printf("\n");
            }
        } else if (layers) {
            printf("%s: %zu layers x %d heads, maximum span %d, ramp %d\n\n", json_string_value(json_object_get(r, "family")),
                   json_array_size(layers), m->n_head, (int)json_integer_value(json_object_get(r, "attn_span")),
                   (int)json_integer_value(json_object_get(r, "ramp")));
            if (json_integer_value(json_object_get(r, "pers_mem_size")))
                printf("persistent memory: %d key/value vectors a head, attended with the span; no feed-forward\n\n",
                       (int)json_integer_value(json_object_get(r, "pers_mem_size")));
            printf("layer  max_span avg_span cache_size   spans per head (z*S; rows kept: keys/values)\n");
            json_array_foreach(layers, i, y) {
                printf("%5zu  %8d %8d %10d  ", i, (int)json_integer_value(json_object_get(y, "max_span")),
                       (int)json_integer_value(json_object_get(y, "avg_span")),
                       (int)json_integer_value(json_object_get(y, "cache_size")));
                size_t h;
                json_t *hd;
                json_array_foreach(json_object_get(y, "heads"), h, hd)
                    printf(" %.1f(%d/%d)", json_number_value(json_object_get(hd, "span")),
                           (int)json_integer_value(json_object_get(hd, "key_rows")),
                           (int)json_integer_value(json_object_get(hd, "reach")));
                printf("\n");
            }
        } else if (blocks) {
            printf("%s: %zu blocks, mem_len %d, %s tokens\n\n", json_string_value(json_object_get(r, "family")),
                   json_array_size(blocks), (int)json_integer_value(json_object_get(r, "mem_len")),
                   json_string_value(json_object_get(r, "tokenizer")));
            /* the softmax of PAR's architecture logits, or the TensorFlow seed's pi */
            const int pis = json_object_get(json_array_get(blocks, 0), "pi") != NULL;
            printf("block  kind   %s\n", pis ? "pi(attn) pi(ffn) pi(skip)" : "p(attn)  p(ffn)  p(skip)");
            json_array_foreach(blocks, i, y) {
                json_t *p = json_object_get(y, pis ? "pi" : "alpha_softmax");
                printf("%5zu  %-5s", i, json_string_value(json_object_get(y, "kind")));
                if (p)
                    printf("  %7.3f %7.3f %7.3f", json_number_value(json_object_get(p, "attn")),
                           json_number_value(json_object_get(p, "ffn")), json_number_value(json_object_get(p, "skip")));
                printf("\n");
            }
        }
        printf("\n");
        json_decref(r);
    }
    if (!json) {
        print_bytes("memory per stream (this server)", mem_bytes(m));
        print_bytes("memory per stream (reference)", mem_bytes_reference(m));
        print_bytes(mem_full_name(m), mem_bytes_full(m));
    }
    model_free(m);
    return 0;
}

/* ------------------------------------------------------------------ generate */

static const char generate_usage[] =
    "usage: spanserve generate --model PATH [--prompt TEXT] [--max-tokens N]\n"
    "                          [--temperature T] [--top-k K] [--top-p P]\n"
    "                          [--seed S] [--stop STR]... [--memory exact|span]\n"
    "                          [--device cpu|cuda|auto] [--precision bf16|fp32]\n"
    "                          [--set KEY=VALUE]...\n"
    "\n"
    "Continues PROMPT (default: a newline) and prints the text as it comes.\n"
    "\n"
    "  --max-tokens N   tokens to generate (default 200, at most 1000000)\n"
    "  --temperature T  0 is greedy (default 1.0)\n"
    "  --top-k K        sample from the K most likely tokens (0: all; default 0)\n"
    "  --top-p P        sample from the smallest set of mass >= P (default 1)\n"
    "  --seed S         random seed (default 0): the same seed gives the same text\n"
    "  --stop STR       stop before STR (repeatable, up to 16)\n"
    "  --device D       cpu, cuda, or auto (default: the GPU when there is one and\n"
    "                   this build has the CUDA core, else the CPU)\n"
    "  --precision P    on the GPU: bf16 (default) or fp32\n"
    "  --set KEY=VALUE  a setting over the checkpoint's (as for score)\n";

static int emit_stdout(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static int cmd_generate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"max-tokens", 1, 0, 'n'}, {"temperature", 1, 0, 't'},
        {"top-k", 1, 0, 'k'}, {"top-p", 1, 0, 'P'},  {"seed", 1, 0, 's'},       {"stop", 1, 0, 'S'},
        {"memory", 1, 0, 'M'}, {"device", 1, 0, 'd'}, {"precision", 1, 0, 'r'}, {"help", 0, 0, 'h'},
        {"set", 1, 0, 'e'}, {0, 0, 0, 0}};
    const char *model = NULL, *prompt = "\n", *stop[16], *device = "auto", *precision = "bf16";
    int n_stop = 0, c;
    json_t *sets = NULL;
    char set_err[ERR_LEN];
    long max_tokens = 200, top_k = 0, seed = 0;
    double temp = 1.0, top_p = 1.0;
    mem_mode mode = MEM_EXACT;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case 'd':
            if (cli_parse_device(optarg, &device)) return cli_usage_error("generate", "--device must be cpu, cuda or auto");
            break;
        case 'r':
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32")) return cli_usage_error("generate", "--precision must be bf16 or fp32");
            precision = optarg;
            break;
        case 'n':
            if (parse_long(optarg, 0, 1000000, &max_tokens))
                return cli_usage_error("generate", "--max-tokens must be an integer in [0, 1000000]");
            break;
        case 't':
            if (parse_double(optarg, 0, 1000, &temp)) return cli_usage_error("generate", "--temperature must be a number in [0, 1000]");
            break;
        case 'k':
            if (parse_long(optarg, 0, 1 << 20, &top_k)) return cli_usage_error("generate", "--top-k must be a non-negative integer");
            break;
        case 'P':
            if (parse_double(optarg, 0, 1, &top_p) || top_p <= 0) return cli_usage_error("generate", "--top-p must be a number in (0, 1]");
            break;
        case 's':
            if (parse_long(optarg, 0, LONG_MAX, &seed)) return cli_usage_error("generate", "--seed must be a non-negative integer");
            break;
        case 'S':
            if (n_stop == 16 || !*optarg) return cli_usage_error("generate", "--stop takes a non-empty string, at most 16 times");
            stop[n_stop++] = optarg;
            break;
        case 'M':
            if (parse_memory_mode(optarg, &mode)) return cli_usage_error("generate", "--memory must be exact or span");
            break;
        case 'e':
            if (cli_settings_add(&sets, optarg, 0, set_err)) return cli_usage_error("generate", "--set: %s", set_err);
            break;
        case 'h': fputs(generate_usage, stdout); return 0;
        default: return cli_bad_option("generate", opts, argv, optind);
        }
    }
    if (!model) return cli_usage_error("generate", "--model is required");
    if (optind != argc) return cli_usage_error("generate", "unexpected argument '%s'", argv[optind]);
    char err[ERR_LEN];
    model_t *m = open_model(model, mode, device, precision, sets);
    if (!m) return 1;
    int32_t *toks = NULL;
    size_t n = 0;
    int rc = 1;
    mem_t *s = mem_new(m);
    fwd_ws *ws = ws_new();
    if (vocab_encode_prompt(&m->vocab, prompt, strlen(prompt), &toks, &n, err)) {
        fprintf(stderr, "%s: prompt: %s\n", prog, err);
    } else if (n == 0) {
        fprintf(stderr, "%s: the prompt is empty\n", prog);
    } else if (s && ws) {
        gen_params gp = {{temp, (int)top_k, top_p}, (uint64_t)seed, (int)max_tokens, stop, n_stop};
        gen_result res;
        double t0 = clock_s();
        if (infer_generate(m, s, ws, toks, n, &gp, emit_stdout, NULL, &res, err)) {
            fprintf(stderr, "%s: %s\n", prog, err);
        } else {
            double dt = clock_s() - t0;
            printf("\n");
            fprintf(stderr, "[%d tokens, finish %s, %.0f tokens/s]\n", res.n_tokens, finish_name(res.finish),
                    res.n_tokens / (dt > 0 ? dt : 1e-9));
            gen_result_free(&res);
            rc = 0;
        }
    }
    free(toks);
    mem_free(s);
    ws_free(ws);
    free_model(m);
    return rc;
}

/* ------------------------------------------------------------------ main */

static const char main_usage[] =
    "usage: spanserve COMMAND [OPTIONS]\n"
    "\n"
    "Serves adaptive-span Transformers and PAR Transformer-XL models.\n"
    "\n"
    "commands:\n"
    "  serve      the HTTP service (docs/API.md)\n"
    "  score      bits per character and perplexity of a text\n"
    "  spans      what a model learned: spans per head, PAR block choices, memory\n"
    "  generate   sample text from a model\n"
    "  train      train a model on a text file (the CPU, or the GPU)\n"
    "  version    print the version\n"
    "\n"
    "`spanserve COMMAND --help` describes each.\n";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "%s: a command is required (serve, score, spans, generate, train, version)\n"
                        "Run 'spanserve --help' for what each does.\n", prog);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(main_usage, stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("spanserve %s\n", SPANSERVE_VERSION);
        return 0;
    }
    static const struct { const char *name; int (*fn)(int, char **); } cmds[] = {
        {"serve", cmd_serve}, {"score", cmd_score}, {"spans", cmd_spans}, {"generate", cmd_generate}, {"train", cmd_train}};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
        if (strcmp(cmd, cmds[i].name) == 0) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "%s: unknown command '%s' (serve, score, spans, generate, train, version)\n"
                    "Run 'spanserve --help' for what each does.\n", prog, cmd);
    return 2;
}
