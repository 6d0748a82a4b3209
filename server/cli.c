/*
 * cli.c - the command line's shared pieces (cli.h).
 */
#define _GNU_SOURCE
#include "cli.h"
#include "err.h"
#include "server.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "spanserve %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun 'spanserve %s --help' for the options.\n", cmd);
    va_end(ap);
    return 2;
}

/* Edits (insertions, deletions, substitutions) from A to B, at most 64
 * bytes of each counted. */
static int edit_distance(const char *a, const char *b)
{
    int n = (int)strnlen(a, 64), m = (int)strnlen(b, 64), d[65];
    for (int j = 0; j <= m; j++) d[j] = j;
    for (int i = 1; i <= n; i++) {
        int diag = d[0];
        d[0] = i;
        for (int j = 1; j <= m; j++) {
            int up = d[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (d[j - 1] + 1 < best) best = d[j - 1] + 1;
            diag = up;
            d[j] = best;
        }
    }
    return d[m];
}

int cli_bad_option(const char *cmd, const struct option *opts, char **argv, int optind)
{
    const char *arg = optind > 0 ? argv[optind - 1] : "";
    char name[80];
    snprintf(name, sizeof name, "%s", arg + (strncmp(arg, "--", 2) == 0 ? 2 : arg[0] == '-' ? 1 : 0));
    name[strcspn(name, "=")] = 0;
    const struct option *best = NULL;
    int best_d = 1 << 30;
    for (const struct option *o = opts; o->name; o++) {
        if (strcmp(o->name, name) == 0 && o->has_arg == required_argument)
            return cli_usage_error(cmd, "--%s needs a value", o->name);
        int d = edit_distance(name, o->name);
        if (d < best_d) best_d = d, best = o;
    }
    /* close: a slip of a couple of keys, or a prefix of a longer name */
    if (best && *name && (best_d <= 2 || strncmp(best->name, name, strlen(name)) == 0))
        return cli_usage_error(cmd, "unknown option '%s' (did you mean --%s?)", arg, best->name);
    return cli_usage_error(cmd, "unknown option '%s'", arg);
}

static double clock_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

void cli_duration(char *buf, size_t cap, double s)
{
    if (!(s >= 0) || s > 1e8) snprintf(buf, cap, "?");
    else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(buf, cap, "%.0fs", s);
}

void cli_progress_begin(cli_progress *p, const char *label, const char *unit)
{
    p->tty = isatty(2);
    p->t0 = clock_now();
    p->last = 0;
    p->label = label;
    p->unit = unit;
}

void cli_progress_update(cli_progress *p, double done, double total)
{
    if (!p->tty) return;
    double now = clock_now(), dt = now - p->t0;
    if (now - p->last < 0.2 && done < total) return;
    p->last = now;
    double rate = dt > 0 ? done / dt : 0;
    char eta[32];
    cli_duration(eta, sizeof eta, rate > 0 ? (total - done) / rate : -1);
    fprintf(stderr, "\r\033[K%s  %.0f/%.0f %s  %.1f%%  %.0f %s/s  ETA %s", p->label, done, total, p->unit,
            total > 0 ? 100 * done / total : 100.0, rate, p->unit, eta);
    fflush(stderr);
}

void cli_progress_end(cli_progress *p)
{
    if (p->tty && p->last > 0) fputs("\r\033[K", stderr);
}

int cli_parse_device(const char *s, const char **out)
{
    if (strcmp(s, "cpu") && strcmp(s, "cuda") && strcmp(s, "auto")) return -1;
    *out = s;
    return 0;
}

int cli_place_model(model_t *m, const char *device, const char *precision, char *err)
{
    if (strcmp(device, "cpu") == 0) return 0;
    char why[ERR_LEN];
    if (!device_cuda_usable(why)) {
        if (strcmp(device, "auto") == 0) return 0;
        return err_set(err, "--device cuda: %s", why);
    }
    if (!device_supports(m, why)) {
        if (strcmp(device, "auto") == 0) return 0;
        return err_set(err, "--device cuda: %s", why);
    }
    return device_attach(m, strcmp(precision, "fp32") != 0, err);
}

int cli_settings_add(json_t **sets, const char *kv, int named, char *err)
{
    const char *key = kv, *eq = strchr(kv, '=');
    char name[128] = "";
    if (named) {
        const char *colon = strchr(kv, ':');
        if (!colon || (eq && colon > eq) || colon == kv || colon - kv >= (long)sizeof name)
            return err_set(err, "'%.64s' is not NAME:KEY=VALUE", kv);
        snprintf(name, sizeof name, "%.*s", (int)(colon - kv), kv);
        key = colon + 1;
    }
    if (!eq || eq == key || eq - key > 64) return err_set(err, "'%.64s' is not %sKEY=VALUE", kv, named ? "NAME:" : "");
    char k[80];
    snprintf(k, sizeof k, "%.*s", (int)(eq - key), key);
    json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!v) v = json_string(eq + 1);
    if (!v) return err_set(err, "'%.64s': the value is not UTF-8", kv);
    if (!*sets) *sets = json_object();
    json_t *into = *sets;
    if (named) {
        into = json_object_get(*sets, name);
        if (!into) json_object_set_new(*sets, name, into = json_object());
    }
    json_object_set_new(into, k, v);
    return 0;
}

char *cli_settings_for(json_t *sets, const char *name)
{
    json_t *s = name ? json_object_get(sets, name) : sets;
    return s && json_object_size(s) ? json_dumps(s, JSON_COMPACT) : NULL;
}
