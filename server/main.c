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
#include "err.h"
#include "infer.h"
#include "model.h"
#include "report.h"

int cmd_serve(int argc, char **argv);
int cmd_train(int argc, char **argv);

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

static int usage_error(const char *usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n\n%s", usage);
    va_end(ap);
    return 2;
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
    "usage: spanserve score --model PATH [--json] [--memory exact|span] FILE\n"
    "\n"
    "Scores every prediction of the text in FILE (\"-\" for standard input):\n"
    "token i+1 given all before it, in blocks of the model's block length with\n"
    "the memory carried. Prints the tokens scored, the mean negative\n"
    "log-likelihood (nats), bits per character and perplexity.\n"
    "\n"
    "  --model PATH     checkpoint (.safetensors)\n"
    "  --json           print {\"tokens\":N,\"nll\":x,\"bpc\":x,\"ppl\":x}\n"
    "  --memory MODE    adaptive-span memory: exact (default: keys of the whole\n"
    "                   attention window, as the reference) or span (only what\n"
    "                   each head's span reaches; least memory)\n";

static int cmd_score(int argc, char **argv)
{
    static const struct option opts[] = {{"model", 1, 0, 'm'}, {"json", 0, 0, 'j'}, {"memory", 1, 0, 'M'},
                                          {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    const char *model = NULL;
    int json = 0, c;
    mem_mode mode = MEM_EXACT;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'j': json = 1; break;
        case 'M':
            if (parse_memory_mode(optarg, &mode)) return usage_error(score_usage, "--memory must be exact or span");
            break;
        case 'h': fputs(score_usage, stdout); return 0;
        default: return usage_error(score_usage, "unknown option");
        }
    }
    if (!model) return usage_error(score_usage, "--model is required");
    if (optind != argc - 1) return usage_error(score_usage, "one FILE to score is required");
    char err[ERR_LEN];
    model_t *m = model_load_mode(model, mode, err);
    if (!m) { fprintf(stderr, "%s: %s\n", prog, err); return 1; }
    size_t len, n = 0;
    int32_t *toks = NULL;
    char *text = read_all(argv[optind], &len, err);
    int rc = 1;
    if (!text || vocab_encode(&m->vocab, text, len, &toks, &n, err)) {
        fprintf(stderr, "%s: %s%s\n", prog, text ? argv[optind] : "", text ? ": " : "");
        fprintf(stderr, "  %s\n", err);
        goto out;
    }
    if (n < 2) { fprintf(stderr, "%s: %s: a text of %zu tokens has nothing to predict\n", prog, argv[optind], n); goto out; }
    mem_t *s = mem_new(m);
    fwd_ws *ws = ws_new();
    score_t sc = {0, 0};
    double t0 = clock_s();
    if (!s || !ws || infer_score(m, s, ws, toks, n, &sc, NULL, err)) {
        fprintf(stderr, "%s: %s\n", prog, s && ws ? err : "out of memory");
    } else {
        double dt = clock_s() - t0, nll = sc.nll_sum / (double)sc.tokens;
        if (json) printf("{\"tokens\":%ld,\"nll\":%.9g,\"bpc\":%.9g,\"ppl\":%.9g}\n", sc.tokens, nll, nll / M_LN2, exp(nll));
        else {
            printf("tokens  %ld\nnll     %.6f nats\nbpc     %.6f\nppl     %.4f\n", sc.tokens, nll, nll / M_LN2, exp(nll));
            fflush(stdout);
            fprintf(stderr, "%.0f tokens/s (%.2f s)\n", sc.tokens / dt, dt);
        }
        rc = 0;
    }
    mem_free(s);
    ws_free(ws);
out:
    free(toks);
    free(text);
    model_free(m);
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
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'j': json = 1; break;
        case 'M':
            if (parse_memory_mode(optarg, &mode)) return usage_error(spans_usage, "--memory must be exact or span");
            break;
        case 'h': fputs(spans_usage, stdout); return 0;
        default: return usage_error(spans_usage, "unknown option");
        }
    }
    if (!model) return usage_error(spans_usage, "--model is required");
    if (optind != argc) return usage_error(spans_usage, "unexpected argument '%s'", argv[optind]);
    char err[ERR_LEN];
    model_t *m = model_load_mode(model, mode, err);
    if (!m) { fprintf(stderr, "%s: %s\n", prog, err); return 1; }
    if (json) {
        json_t *r = report_spans(m);
        char *s = json_dumps(r, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
        puts(s);
        free(s);
        json_decref(r);
    } else if (m->fam == FAM_ASPAN) {
        printf("adaptive-span: %d layers x %d heads, maximum span %d, ramp %d\n\n", m->n_layers, m->n_head, m->span, m->ramp);
        printf("layer  max_span avg_span cache_size   spans per head (z*S; rows kept: keys/values)\n");
        for (int l = 0; l < m->n_layers; l++) {
            const layer_t *y = &m->layers[l];
            printf("%5d  %8d %8d %10d  ", l, y->max_span, y->avg_span, y->cache_size);
            for (int h = 0; h < m->n_head; h++)
                printf(" %.1f(%d/%d)", (double)y->zfrac[h] * m->span, y->krows[h], y->reach[h]);
            printf("\n");
        }
        printf("\n");
    } else {
        printf("par-transformer-xl: %d blocks, mem_len %d\n\n", m->n_layers, m->mem_len);
        printf("block  kind   p(attn)  p(ffn)  p(skip)\n");
        for (int b = 0; b < m->n_layers; b++) {
            const layer_t *y = &m->layers[b];
            printf("%5d  %-5s", b, blk_kind_name(y->kind));
            double e[3];
            if (model_alpha_softmax(y, e) == 0) printf("  %7.3f %7.3f %7.3f", e[0], e[1], e[2]);
            printf("\n");
        }
        printf("\n");
    }
    if (!json) {
        print_bytes("memory per stream (this server)", mem_bytes(m));
        print_bytes("memory per stream (reference)", mem_bytes_reference(m));
        print_bytes(m->fam == FAM_ASPAN ? "reference at the full span" : "Transformer-XL, every block", mem_bytes_full(m));
    }
    model_free(m);
    return 0;
}

/* ------------------------------------------------------------------ generate */

static const char generate_usage[] =
    "usage: spanserve generate --model PATH [--prompt TEXT] [--max-tokens N]\n"
    "                          [--temperature T] [--top-k K] [--top-p P]\n"
    "                          [--seed S] [--stop STR]... [--memory exact|span]\n"
    "\n"
    "Continues PROMPT (default: a newline) and prints the text as it comes.\n"
    "\n"
    "  --max-tokens N   tokens to generate (default 200, at most 1000000)\n"
    "  --temperature T  0 is greedy (default 1.0)\n"
    "  --top-k K        sample from the K most likely tokens (0: all; default 0)\n"
    "  --top-p P        sample from the smallest set of mass >= P (default 1)\n"
    "  --seed S         random seed (default 0): the same seed gives the same text\n"
    "  --stop STR       stop before STR (repeatable, up to 16)\n";

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
        {"memory", 1, 0, 'M'}, {"help", 0, 0, 'h'},  {0, 0, 0, 0}};
    const char *model = NULL, *prompt = "\n", *stop[16];
    int n_stop = 0, c;
    long max_tokens = 200, top_k = 0, seed = 0;
    double temp = 1.0, top_p = 1.0;
    mem_mode mode = MEM_EXACT;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n':
            if (parse_long(optarg, 0, 1000000, &max_tokens))
                return usage_error(generate_usage, "--max-tokens must be an integer in [0, 1000000]");
            break;
        case 't':
            if (parse_double(optarg, 0, 1000, &temp)) return usage_error(generate_usage, "--temperature must be a number in [0, 1000]");
            break;
        case 'k':
            if (parse_long(optarg, 0, 1 << 20, &top_k)) return usage_error(generate_usage, "--top-k must be a non-negative integer");
            break;
        case 'P':
            if (parse_double(optarg, 0, 1, &top_p) || top_p <= 0) return usage_error(generate_usage, "--top-p must be a number in (0, 1]");
            break;
        case 's':
            if (parse_long(optarg, 0, LONG_MAX, &seed)) return usage_error(generate_usage, "--seed must be a non-negative integer");
            break;
        case 'S':
            if (n_stop == 16 || !*optarg) return usage_error(generate_usage, "--stop takes a non-empty string, at most 16 times");
            stop[n_stop++] = optarg;
            break;
        case 'M':
            if (parse_memory_mode(optarg, &mode)) return usage_error(generate_usage, "--memory must be exact or span");
            break;
        case 'h': fputs(generate_usage, stdout); return 0;
        default: return usage_error(generate_usage, "unknown option");
        }
    }
    if (!model) return usage_error(generate_usage, "--model is required");
    if (optind != argc) return usage_error(generate_usage, "unexpected argument '%s'", argv[optind]);
    char err[ERR_LEN];
    model_t *m = model_load_mode(model, mode, err);
    if (!m) { fprintf(stderr, "%s: %s\n", prog, err); return 1; }
    int32_t *toks = NULL;
    size_t n = 0;
    int rc = 1;
    mem_t *s = mem_new(m);
    fwd_ws *ws = ws_new();
    if (vocab_encode(&m->vocab, prompt, strlen(prompt), &toks, &n, err)) {
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
    model_free(m);
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
    "  train      train a model on a text file (CPU)\n"
    "  version    print the version\n"
    "\n"
    "`spanserve COMMAND --help` describes each.\n";

int main(int argc, char **argv)
{
    if (argc < 2) return usage_error(main_usage, "a command is required");
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
    return usage_error(main_usage, "unknown command '%s'", cmd);
}
