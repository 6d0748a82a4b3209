/*
 * cmd_train.c - `spanserve train`: the command line of the trainer
 * (core/train*.c). Reads the JSON config, applies the flags over it, checks
 * it, opens the log and runs the loop. Training never runs inside the
 * serving process: the server's jobs spawn this command. --device cuda runs
 * the steps on the GPU (kernels/train_gpu.h) in builds with nvcc.
 */
#define _GNU_SOURCE
#include "err.h"
#include "train.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    "                       [--seed N] [--device cpu|cuda] [--log FILE] [--resume]\n"
    "\n"
    "Trains an adaptive-span or PAR Transformer-XL model on a text file, with a\n"
    "character vocabulary built from the text and its last val_fraction held out\n"
    "for validation. Writes the checkpoint OUT (the layout `spanserve serve` and\n"
    "`score` load) and OUT.state (the exact training state) every\n"
    "checkpoint_every steps and at the end; progress as JSON lines on standard\n"
    "output or --log FILE. Every config key is listed in README.md (Training).\n"
    "\n"
    "  --config FILE   the JSON config; \"family\" is required, every other key\n"
    "                  defaults to the reference recipe of its family\n"
    "  --data FILE     overrides config 'data' (the text)\n"
    "  --out FILE      overrides config 'out' (the checkpoint)\n"
    "  --steps N       overrides config 'steps'\n"
    "  --seed N        overrides config 'seed'\n"
    "  --device D      cpu, or cuda: the adaptive-span trainer on the GPU in\n"
    "                  float32 (builds with nvcc); the same config, log,\n"
    "                  checkpoint and state formats\n"
    "  --log FILE      progress to FILE (appended on --resume) instead of stdout\n"
    "  --resume        continue from OUT.state: the same numbers as a run that\n"
    "                  never stopped (steps may be raised)\n"
    "\n"
    "SIGTERM or SIGINT stops the run after the step in progress, with that\n"
    "step's checkpoint and state written and a \"stopped\" line logged; the\n"
    "exit status is then 3 (--resume goes on). A second signal ends it at once.\n"
    "Exit status: 0 done, 1 failed while running, 2 a bad config or flag.\n";

static int usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "spanserve train: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n\n%s", train_usage);
    return 2;
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
        {"config", 1, 0, 'c'}, {"data", 1, 0, 'd'}, {"out", 1, 0, 'o'}, {"steps", 1, 0, 'n'},
        {"seed", 1, 0, 's'},   {"device", 1, 0, 'D'}, {"log", 1, 0, 'l'}, {"resume", 0, 0, 'r'},
        {"help", 0, 0, 'h'},   {0, 0, 0, 0}};
    const char *config = NULL, *data = NULL, *out = NULL, *device = NULL, *logp = NULL;
    long long steps = -1, seed = -1;
    int resume = 0, c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case 'd': data = optarg; break;
        case 'o': out = optarg; break;
        case 'n':
            if (parse_nonneg(optarg, &steps) || steps > 1000000000000LL) return usage("--steps must be a non-negative integer, not '%s'", optarg);
            break;
        case 's':
            if (parse_nonneg(optarg, &seed)) return usage("--seed must be a non-negative integer, not '%s'", optarg);
            break;
        case 'D':
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) return usage("--device must be cpu or cuda, not '%s'", optarg);
            device = optarg;
            break;
        case 'l': logp = optarg; break;
        case 'r': resume = 1; break;
        case 'h': fputs(train_usage, stdout); return 0;
        default: return usage("%s", "unknown option");
        }
    }
    if (optind != argc) return usage("unexpected argument '%s'", argv[optind]);
    if (!config) return usage("%s", "--config is required");
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
    if (device) strcpy(cfg.device, device);
    if (train_cfg_check(&cfg, err)) {
        fprintf(stderr, "spanserve train: %s\n", err);
        return 2;
    }
    const train_device *dev = NULL;
    if (strcmp(cfg.device, "cuda") == 0) {
#ifdef SPANSERVE_CUDA
        dev = &tgpu_train_device;
#else
        fprintf(stderr, "spanserve train: --device cuda: this build has no CUDA trainer (built without nvcc); train "
                "with --device cpu\n");
        return 2;
#endif
    }
    FILE *log = stdout;
    if (cfg.log[0] && !(log = fopen(cfg.log, resume ? "a" : "w"))) {
        fprintf(stderr, "spanserve train: log '%s': %s\n", cfg.log, strerror(errno));
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_stop};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int rc = train_run_on(&cfg, dev, resume, log, err);
    if (rc == TRAIN_STOPPED)
        fprintf(stderr, "spanserve train: stopped by a signal; the checkpoint and state of the last step are saved "
                "(--resume goes on)\n");
    else if (rc)
        fprintf(stderr, "spanserve train: %s\n", err);
    if (log != stdout) fclose(log);
    return rc == TRAIN_STOPPED ? TRAIN_STOPPED : rc ? 1 : 0;
}
