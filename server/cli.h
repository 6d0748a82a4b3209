/*
 * cli.h - what the subcommands of `spanserve` share at a terminal: usage
 * errors that fit on it (the problem, then where the options are, never the
 * whole usage scrolling the problem away), the nearest option to a
 * misspelt one, a progress line, and where a model runs (--device,
 * --precision).
 */
#ifndef SPANSERVE_CLI_H
#define SPANSERVE_CLI_H

#include <getopt.h>
#include <jansson.h>
#include <stddef.h>

#include "model.h"

/* "spanserve CMD: MESSAGE" and "Run 'spanserve CMD --help' for the
 * options." on stderr; returns 2, the exit status of a usage error. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The usage error of the option getopt_long just refused (opterr = 0): an
 * unknown one, with the nearest of OPTS when one is close ("did you mean
 * --model?"), or one whose value is missing. ARGV and OPTIND as getopt_long
 * left them. Returns 2. */
int cli_bad_option(const char *cmd, const struct option *opts, char **argv, int optind);

/* A progress line on stderr while it is a terminal, redrawn at most five
 * times a second: "LABEL  DONE/TOTAL UNIT  PCT%  RATE UNIT/s  ETA". */
typedef struct {
    int tty;
    double t0, last;
    const char *label, *unit;
} cli_progress;

void cli_progress_begin(cli_progress *p, const char *label, const char *unit);
void cli_progress_update(cli_progress *p, double done, double total);
void cli_progress_end(cli_progress *p);   /* clears the line */
/* "1h02m", "3m20s", "42s": a duration for a person. */
void cli_duration(char *buf, size_t cap, double seconds);

/* --device cpu|cuda|auto and --precision bf16|fp32 for one model of a
 * command: attaches M to the GPU where DEVICE asks for it and one can be
 * used (auto: quietly the CPU when not). Returns 0, or -1 with ERR. */
int cli_parse_device(const char *s, const char **out);
/* --set: KEY=VALUE (NAMED: NAME:KEY=VALUE, under NAME) into the JSON object
 * *SETS (made on first use); VALUE is JSON where it parses (640, true),
 * else a string. -1 with ERR on a malformed one. */
int cli_settings_add(json_t **sets, const char *kv, int named, char *err);
/* The settings (of model NAME, or all of SETS when NAME is NULL) as JSON
 * text for model_load_set, or NULL when there are none. Caller frees. */
char *cli_settings_for(json_t *sets, const char *name);
int cli_place_model(model_t *m, const char *device, const char *precision, char *err);

#endif
