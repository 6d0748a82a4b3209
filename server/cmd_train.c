/*
 * cmd_train.c - `spanserve train`: the command line of the trainer
 * (core/train*.c). Reads the JSON config, applies the flags over it, checks
 * it, opens the log and runs the loop. Training never runs inside the
 * serving process: the server's jobs spawn this command. --device cuda runs
 * the steps on the GPU (kernels/train_gpu.h) in builds with nvcc.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "err.h"
#include "train.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef SPANSERVE_CUDA
#include "../kernels/train_gpu.h"
#endif

int cmd_train(int argc, char **argv);

/* SIGTERM or SIGINT: the loop stops after the step in progress, saved; a
 * second one ends the process at once. */
static void on_stop(int sig)
{
    train_request_stop();
    signal(sig, SIG_DFL);
}

static const char train_usage[] =
    "usage: spanserve train --config FILE.json [--data FILE] [--out FILE] [--steps N]\n"
    "                       [--seed N] [--device cpu|cuda|auto] [--precision fp32|tf32|bf16]\n"
    "                       [--gpus N] [--nodes N --node-rank R [--master HOST:PORT]]\n"
    "                       [--log FILE] [--json] [--resume]\n"
    "\n"
    "Trains an adaptive-span or PAR Transformer-XL model on a text file, with a\n"
    "character vocabulary built from the text and its last val_fraction held out\n"
    "for validation. Writes the checkpoint OUT (the layout `spanserve serve` and\n"
    "`score` load) and OUT.state (the exact training state) every\n"
    "checkpoint_every steps and at the end. Progress: a line per log step on\n"
    "standard output (step, loss, bpc, validation bpc, lr, tokens/s, ETA), or the\n"
    "JSON lines of --json; with --log FILE the JSON lines go to FILE, and the\n"
    "readable lines to a terminal. Every config key is listed in README.md\n"
    "(Training).\n"
    "\n"
    "  --config FILE   the JSON config; \"family\" is required, every other key\n"
    "                  defaults to the reference recipe of its family\n"
    "  --data FILE     overrides config 'data' (the text)\n"
    "  --out FILE      overrides config 'out' (the checkpoint)\n"
    "  --steps N       overrides config 'steps'\n"
    "  --seed N        overrides config 'seed'\n"
    "  --device D      overrides config 'device': cpu, cuda (the trainer on\n"
    "                  the GPU, in builds with nvcc; the same config,\n"
    "                  log, checkpoint and state formats) or auto (the default:\n"
    "                  cuda where this build, a GPU and the family allow it)\n"
    "  --precision P   overrides config 'precision': fp32 (default), tf32 or\n"
    "                  bf16 (the GPU's linear layers on tensor cores in that\n"
    "                  precision, float32 sums and weights; cuda only)\n"
    "  --gpus N        overrides config 'gpus': spread each step's streams over\n"
    "                  the first N GPUs of this machine (data parallel, the\n"
    "                  gradients summed with NCCL; batch_size a multiple of N;\n"
    "                  a run may be resumed on another N)\n"
    "  --nodes N       the run spans N machines of --gpus GPUs each (data\n"
    "                  parallel over all of them, NCCL over the network):\n"
    "                  start the same command on every machine, each with its\n"
    "                  --node-rank (0..N-1) and the same --master, the first\n"
    "                  machine's HOST:PORT (NCCL_COMM_ID); the text and, for\n"
    "                  --resume, OUT.state on every machine; the first writes\n"
    "                  the checkpoint and state\n"
    "  --log FILE      the JSON lines to FILE (appended on --resume)\n"
    "  --json          the JSON lines on standard output instead of readable ones\n"
    "  --resume        continue from OUT.state: the same numbers as a run that\n"
    "                  never stopped (steps may be raised)\n"
    "\n"
    "SIGTERM or SIGINT stops the run after the step in progress, with that\n"
    "step's checkpoint and state written and a \"stopped\" line logged; the\n"
    "exit status is then 3 (--resume goes on). A second signal ends it at once.\n"
    "Exit status: 0 done, 1 failed while running, 2 a bad config or flag.\n";

/* ------------------------------------------------------------ progress for a person
 *
 * The loop writes JSON lines (core/train_loop.c); a person at a terminal
 * gets each as one readable line instead: the loop writes to a stream of
 * this file's (fopencookie) that passes the JSON on to the log file, if
 * any, and prints the readable line. */

typedef struct {
    FILE *json;          /* where the JSON lines go, or NULL */
    FILE *human;         /* where the readable lines go, or NULL */
    char line[1 << 16];  /* the JSON line being written (a longer one is cut: it is only shown) */
    size_t len;
    long steps;          /* the run's last step, for the ETA */
    double t0;
    long step0;          /* the step the run (or the resume) began at */
} progress_sink;

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

/* One JSON line of the loop as a readable line on P->human. */
static void human_line(progress_sink *p, const char *text)
{
    json_t *o = json_loads(text, 0, NULL);
    const char *ev = json_string_value(json_object_get(o, "event"));
    long step = (long)json_integer_value(json_object_get(o, "step"));
    FILE *f = p->human;
    if (!ev) {
        json_decref(o);
        return;
    }
    if (!strcmp(ev, "start") || !strcmp(ev, "resume")) {
        const char *dev = json_string_value(json_object_get(o, "device"));
        p->t0 = wall_s();
        p->step0 = step;
        fprintf(f, "%s at step %ld of %ld on %s\n", !strcmp(ev, "start") ? "training" : "resuming", step, p->steps,
                dev ? dev : "?");
    } else if (!strcmp(ev, "train")) {
        double dt = wall_s() - p->t0, per = step > p->step0 ? dt / (double)(step - p->step0) : -1;
        char eta[32];
        cli_duration(eta, sizeof eta, per >= 0 ? per * (double)(p->steps - step) : -1);
        fprintf(f, "step %6ld/%ld  loss %.4f  bpc %.4f", step, p->steps, num(o, "loss"), num(o, "bpc"));
        if (json_object_get(o, "val_bpc")) fprintf(f, "  val_bpc %.4f", num(o, "val_bpc"));
        fprintf(f, "  lr %.3g  %.0f tokens/s  ETA %s\n", num(o, "lr"), num(o, "tokens_per_s"), eta);
    } else if (!strcmp(ev, "arch_fixed")) {
        fprintf(f, "step %ld: the architecture is fixed:", step);
        json_t *a = json_object_get(o, "arch");
        for (size_t i = 0; i < json_array_size(a); i++) fprintf(f, " %s", json_string_value(json_array_get(a, i)));
        fprintf(f, "\n");
    } else if (!strcmp(ev, "checkpoint")) {
        fprintf(f, "step %ld: checkpoint written\n", step);
    } else if (!strcmp(ev, "done")) {
        char d[32];
        cli_duration(d, sizeof d, num(o, "seconds"));
        const char *ck = json_string_value(json_object_get(o, "checkpoint"));
        fprintf(f, "done at step %ld in %s: validation bpc %.4f, checkpoint %s\n", step, d, num(o, "val_bpc"),
                ck ? ck : "?");
    } else if (!strcmp(ev, "stopped")) {
        fprintf(f, "stopped at step %ld, saved\n", step);
    }
    fflush(f);
    json_decref(o);
}

static ssize_t sink_write(void *cookie, const char *buf, size_t n)
{
    progress_sink *p = cookie;
    if (p->json && (fwrite(buf, 1, n, p->json) != n || fflush(p->json) != 0)) return -1;
    for (size_t i = 0; p->human && i < n; i++) {
        if (buf[i] != '\n') {
            if (p->len < sizeof p->line - 1) p->line[p->len++] = buf[i];
            continue;
        }
        p->line[p->len] = 0;
        human_line(p, p->line);
        p->len = 0;
    }
    return (ssize_t)n;
}

static int sink_close(void *cookie)
{
    progress_sink *p = cookie;
    return p->json && p->json != stdout ? fclose(p->json) : 0;
}

static char *slurp(const char *path, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) { err_set(err, "--config %s: %s", path, strerror(errno)); return NULL; }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
        if (n == cap) {
            /* a config is a few hundred bytes: a megabyte is not one */
            if (cap >= (1u << 20)) { free(buf); buf = NULL; err_set(err, "--config %s: over 1 MiB", path); fclose(f); return NULL; }
            char *b = realloc(buf, (cap *= 2) + 1);
            if (!b) { free(buf); buf = NULL; }
            else buf = b;
        }
    }
    fclose(f);
    if (!buf) { err_set(err, "out of memory"); return NULL; }
    buf[n] = 0;
    return buf;
}

static int set_path(char *dst, const char *v, const char *flag, char *err)
{
    if (!*v || strlen(v) >= TRAIN_PATH_LEN) return err_set(err, "%s must be a path of 1 to %d bytes", flag, TRAIN_PATH_LEN - 1);
    strcpy(dst, v);
    return 0;
}

static int parse_nonneg(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0) return -1;
    *out = v;
    return 0;
}

int cmd_train(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", 1, 0, 'c'}, {"data", 1, 0, 'd'},   {"out", 1, 0, 'o'},       {"steps", 1, 0, 'n'},
        {"seed", 1, 0, 's'},   {"device", 1, 0, 'D'}, {"precision", 1, 0, 'p'}, {"log", 1, 0, 'l'},
        {"json", 0, 0, 'j'},   {"resume", 0, 0, 'r'}, {"help", 0, 0, 'h'},      {"gpus", 1, 0, 'g'},
        {"nodes", 1, 0, 'N'},  {"node-rank", 1, 0, 'R'}, {"master", 1, 0, 'M'},  {0, 0, 0, 0}};
    const char *config = NULL, *data = NULL, *out = NULL, *device = NULL, *logp = NULL, *precision = NULL;
    long long steps = -1, seed = -1, gpus = -1, nodes = 1, node_rank = -1;
    const char *master = NULL;
    int resume = 0, json_out = 0, c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case 'd': data = optarg; break;
        case 'o': out = optarg; break;
        case 'n':
            if (parse_nonneg(optarg, &steps) || steps > 1000000000000LL)
                return cli_usage_error("train", "--steps must be a non-negative integer, not '%s'", optarg);
            break;
        case 's':
            if (parse_nonneg(optarg, &seed))
                return cli_usage_error("train", "--seed must be a non-negative integer, not '%s'", optarg);
            break;
        case 'D':
            if (cli_parse_device(optarg, &device))
                return cli_usage_error("train", "--device must be cpu, cuda or auto, not '%s'", optarg);
            break;
        case 'p':
            if (strcmp(optarg, "fp32") && strcmp(optarg, "tf32") && strcmp(optarg, "bf16"))
                return cli_usage_error("train", "--precision must be fp32, tf32 or bf16, not '%s'", optarg);
            precision = optarg;
            break;
        case 'g':
            if (parse_nonneg(optarg, &gpus) || gpus < 1 || gpus > 16)
                return cli_usage_error("train", "--gpus must be an integer from 1 to 16, not '%s'", optarg);
            break;
        case 'N':
            if (parse_nonneg(optarg, &nodes) || nodes < 1 || nodes > 64)
                return cli_usage_error("train", "--nodes must be an integer from 1 to 64, not '%s'", optarg);
            break;
        case 'R':
            if (parse_nonneg(optarg, &node_rank) || node_rank > 63)
                return cli_usage_error("train", "--node-rank must be an integer from 0 to 63, not '%s'", optarg);
            break;
        case 'M':
            if (!strchr(optarg, ':') || strlen(optarg) > 255)
                return cli_usage_error("train", "--master must be HOST:PORT, not '%s'", optarg);
            master = optarg;
            break;
        case 'l': logp = optarg; break;
        case 'j': json_out = 1; break;
        case 'r': resume = 1; break;
        case 'h': fputs(train_usage, stdout); return 0;
        default: return cli_bad_option("train", opts, argv, optind);
        }
    }
    if (optind != argc) return cli_usage_error("train", "unexpected argument '%s'", argv[optind]);
    if (nodes > 1 && (node_rank < 0 || node_rank >= nodes))
        return cli_usage_error("train", "--nodes %lld needs --node-rank from 0 to %lld", nodes, nodes - 1);
    if (nodes == 1 && node_rank > 0) return cli_usage_error("train", "--node-rank %lld without --nodes", node_rank);
    if (master) setenv("NCCL_COMM_ID", master, 1);
    if (!config) return cli_usage_error("train", "--config is required");
    char err[ERR_LEN];
    train_cfg cfg;
    char *text = slurp(config, err);
    if (!text || train_cfg_from_json(&cfg, text, config, err)) {
        free(text);
        fprintf(stderr, "spanserve train: %s\n", err);
        return 2;
    }
    free(text);
    if ((data && set_path(cfg.data, data, "--data", err)) || (out && set_path(cfg.out, out, "--out", err)) ||
        (logp && set_path(cfg.log, logp, "--log", err))) {
        fprintf(stderr, "spanserve train: %s\n", err);
        return 2;
    }
    if (steps >= 0) cfg.steps = (long)steps;
    if (seed >= 0) cfg.seed = (uint64_t)seed;
    if (device) snprintf(cfg.device, sizeof cfg.device, "%s", device);
    if (precision) cfg.tf32 = !strcmp(precision, "tf32"), cfg.bf16 = !strcmp(precision, "bf16");
    if (gpus > 0) cfg.gpus = (int)gpus;
    cfg.nodes = (int)nodes;
    cfg.node_rank = node_rank > 0 ? (int)node_rank : 0;
    if (nodes > 1 && strcmp(cfg.device, "cpu") == 0) {
        fprintf(stderr, "spanserve train: --nodes %lld: several machines are the CUDA trainer's; give --device cuda\n",
                nodes);
        return 2;
    }
    if (nodes > 1) snprintf(cfg.device, sizeof cfg.device, "cuda");
    /* the GPU trainer: asked for, or "auto" where this build has it, a GPU
     * answers and the family is one it trains */
    const train_device *dev = NULL;
    char why[ERR_LEN] = "this build has no CUDA trainer (built without nvcc)";
#ifdef SPANSERVE_CUDA
    int gpu = tgpu_available(why) == 0;
#else
    int gpu = 0;
#endif
    if (!strcmp(cfg.device, "auto") && !(gpu && cfg.fam->cuda)) snprintf(cfg.device, sizeof cfg.device, "cpu");
    if (train_cfg_check(&cfg, err)) {
        fprintf(stderr, "spanserve train: %s\n", err);
        return 2;
    }
    if (strcmp(cfg.device, "cpu") && !gpu) {
        fprintf(stderr, "spanserve train: --device cuda: %s; train with --device cpu\n", why);
        return strstr(why, "without nvcc") ? 2 : 1;
    }
#ifdef SPANSERVE_CUDA
    if (strcmp(cfg.device, "cpu")) dev = &tgpu_train_device;
#endif
    /* the JSON lines to --log, or to stdout with --json; readable lines to
     * stdout otherwise, and beside --log when stdout is a terminal */
    progress_sink sink = {.steps = cfg.steps, .t0 = wall_s()};
    if (cfg.log[0] && !(sink.json = fopen(cfg.log, resume ? "a" : "w"))) {
        fprintf(stderr, "spanserve train: log '%s': %s\n", cfg.log, strerror(errno));
        return 1;
    }
    if (json_out && !sink.json) sink.json = stdout;
    else if (!json_out && (!sink.json || isatty(1))) sink.human = stdout;
    FILE *log = fopencookie(&sink, "w", (cookie_io_functions_t){NULL, sink_write, NULL, sink_close});
    if (!log) {
        fprintf(stderr, "spanserve train: %s\n", strerror(errno));
        if (sink.json && sink.json != stdout) fclose(sink.json);
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_stop};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int rc = train_run_on(&cfg, dev, resume, log, err);
    fclose(log);
    if (rc == TRAIN_STOPPED)
        fprintf(stderr, "spanserve train: stopped by a signal; the checkpoint and state of the last step are saved "
                "(--resume goes on)\n");
    else if (rc)
        fprintf(stderr, "spanserve train: %s\n", err);
    return rc == TRAIN_STOPPED ? TRAIN_STOPPED : rc ? 1 : 0;
}
