/*
 * svg.c - pictures of what a model learned, for people: an adaptive-span
 * model as a layers x heads heat map of spans (colour on a log scale of the
 * span, the value written in each cell); a PAR model as its block sequence,
 * each block coloured by its kind with bars for the softmax of its
 * architecture weights. And the same over the course of a training job,
 * from its progress lines: spans per layer, or each block's weights,
 * against the step.
 */
#define _GNU_SOURCE
#include "server.h"

#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* white -> deep blue as X goes 0 -> 1 */
static void heat(double x, char *buf, size_t cap)
{
    x = x < 0 ? 0 : x > 1 ? 1 : x;
    int r = (int)(255 - x * 225), g = (int)(255 - x * 170), b = (int)(255 - x * 60);
    snprintf(buf, cap, "#%02x%02x%02x", r, g, b);
}

/* Drawn from the model's report (report_spans: what `spans --json` and
 * /spans give): the heads' spans where it has layers of heads, else its
 * blocks. */
char *svg_spans(const model_t *m)
{
    char *buf = NULL;
    size_t len = 0;
    json_t *r = report_spans(m);
    FILE *f = r ? open_memstream(&buf, &len) : NULL;
    if (!f) {
        json_decref(r);
        return NULL;
    }
    json_t *layers = json_object_get(r, "layers"), *blocks = json_object_get(r, "blocks"), *mem = json_object_get(r, "memory");
    const size_t bytes = (size_t)json_integer_value(json_object_get(mem, "bytes_per_stream"));
    if (layers) {
        const int nl = (int)json_array_size(layers), nh = (int)json_array_size(json_object_get(json_array_get(layers, 0), "heads"));
        const int S = (int)json_integer_value(json_object_get(r, "attn_span")), R = (int)json_integer_value(json_object_get(r, "ramp"));
        int cw = 64, chh = 28, x0 = 70, y0 = 50, W = x0 + cw * nh + 20, H = y0 + chh * nl + 50;
        if (W < 640) W = 640;   /* the title and the memory line fit */
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
        fprintf(f, "<title>Adaptive spans: %d layers x %d heads, maximum span %d</title>\n", nl, nh, S);
        fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">Learned span z per head (tokens; maximum %d, ramp %d)</text>\n", x0, S, R);
        for (int h = 0; h < nh; h++)
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">head %d</text>\n", x0 + h * cw + cw / 2, y0 - 8, h);
        for (int l = 0; l < nl; l++) {
            json_t *heads = json_object_get(json_array_get(layers, (size_t)l), "heads");
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">layer %d</text>\n", x0 - 8, y0 + l * chh + chh / 2 + 4, l);
            for (int h = 0; h < nh; h++) {
                json_t *hd = json_array_get(heads, (size_t)h);
                double span = json_number_value(json_object_get(hd, "span"));
                char col[8];
                heat(log1p(span) / log1p(S), col, sizeof col);
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"#888\"><title>layer %d head %d: span %.1f, reach %d</title></rect>\n",
                        x0 + h * cw, y0 + l * chh, cw, chh, col, l, h, span, (int)json_integer_value(json_object_get(hd, "reach")));
                fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"%s\">%.0f</text>\n", x0 + h * cw + cw / 2,
                        y0 + l * chh + chh / 2 + 4, span > S * 0.3 ? "#fff" : "#000", span);
            }
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\">memory per session: %zu bytes (reference: %zu)</text>\n", x0, y0 + chh * nl + 30,
                bytes, (size_t)json_integer_value(json_object_get(mem, "reference_bytes_per_stream")));
    } else if (!blocks) {   /* a window model without spans: every head sees its whole window */
        const int window = (int)json_integer_value(json_object_get(r, "window"));
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"560\" height=\"90\" font-family=\"sans-serif\" font-size=\"12\">\n");
        fprintf(f, "<title>%s: a window of %d tokens</title>\n", json_string_value(json_object_get(r, "family")), window);
        fprintf(f, "<text x=\"20\" y=\"24\" font-size=\"14\">No learned spans: every head attends to its whole window of %d tokens</text>\n", window);
        fprintf(f, "<rect x=\"20\" y=\"36\" width=\"520\" height=\"16\" fill=\"#d9534f\"><title>window: %d tokens</title></rect>\n", window);
        fprintf(f, "<text x=\"20\" y=\"76\">memory per session: %zu bytes (a session recomputes %s)</text>\n", bytes,
                json_string_value(json_object_get(r, "recompute")));
    } else {
        static const char *kinds[3] = {"attn", "ffn", "skip"}, *kind_col[3] = {"#d9534f", "#5b9bd5", "#bbbbbb"};
        const int nb = (int)json_array_size(blocks);
        int bw = 56, x0 = 20, y0 = 50, bh = 90, W = x0 * 2 + bw * nb, H = y0 + bh + 80;
        if (W < 560) W = 560;   /* the title and the memory line fit */
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
        fprintf(f, "<title>%s: %d blocks</title>\n", json_string_value(json_object_get(r, "family")), nb);
        /* PAR's softmax of its architecture logits, or the TensorFlow seed's pi (its argmax the kind) */
        const int pis = json_object_get(json_array_get(blocks, 0), "pi") != NULL;
        const char *wname = pis ? "pi" : "p";
        fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">Blocks and their architecture weights%s (attn / ffn / skip)</text>\n", x0,
                pis ? ", pi" : "");
        for (int b = 0; b < nb; b++) {
            json_t *y = json_array_get(blocks, (size_t)b), *p = json_object_get(y, pis ? "pi" : "alpha_softmax");
            const char *kind = json_string_value(json_object_get(y, "kind"));
            int k0 = 0;
            while (k0 < 2 && (!kind || strcmp(kind, kinds[k0]) != 0)) k0++;
            int x = x0 + b * bw;
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"24\" fill=\"%s\" stroke=\"#444\"><title>block %d: %s</title></rect>\n",
                    x + 2, y0, bw - 4, kind_col[k0], b, kinds[k0]);
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#fff\">%s</text>\n", x + bw / 2, y0 + 16, kinds[k0]);
            for (int k = 0; p && k < 3; k++) {
                double pk = json_number_value(json_object_get(p, kinds[k]));
                int h = (int)((pk < 0 ? 0 : pk > 1 ? 1 : pk) * (bh - 30));
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"%d\" fill=\"%s\"><title>block %d %s(%s) = %.3f</title></rect>\n",
                        x + 6 + k * 15, y0 + bh + 10 - h, h, kind_col[k], b, wname, kinds[k], pk);
            }
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", x + bw / 2, y0 + bh + 26, b);
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\">memory per session: %zu bytes (mem_len %d)</text>\n", x0, y0 + bh + 50, bytes,
                (int)json_integer_value(json_object_get(r, "mem_len")));
    }
    fprintf(f, "</svg>\n");
    fclose(f);
    json_decref(r);
    return buf;
}

/* ------------------------------------------------------------ over training */

static const char *palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

/* x of STEP on an axis of [0, MAXSTEP] that is W wide from X0 */
static double xs(double step, double maxstep, int x0, int w) { return x0 + w * (maxstep > 0 ? step / maxstep : 0); }

/* "spans": one line per layer, its mean span z (solid) and its largest
 * (dashed), against the step. */
static void draw_spans(FILE *f, const char *title, json_t *points, int nl, double maxstep, int x0, int w, int top)
{
    size_t i, k;
    json_t *p, *e;
    double maxspan = 1;
    json_array_foreach(points, i, p) {
        json_array_foreach(json_object_get(p, "spans"), k, e) maxspan = fmax(maxspan, json_number_value(json_object_get(e, "max")));
    }
    int h = 260, H = top + h + 60 + 16 * nl;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            x0 + w + 30, H);
    fprintf(f, "<title>Spans over training: %s</title>\n", title);
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">Span z per layer over training (mean solid, largest dashed): %s</text>\n",
            x0, title);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n", x0, top, w, h);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.0f</text><text x=\"%d\" y=\"%d\" text-anchor=\"end\">0</text>\n",
            x0 - 6, top + 10, maxspan, x0 - 6, top + h);
    fprintf(f, "<text x=\"%d\" y=\"%d\">step 0</text><text x=\"%d\" y=\"%d\" text-anchor=\"end\">step %.0f</text>\n", x0,
            top + h + 16, x0 + w, top + h + 16, maxstep);
    for (int l = 0; l < nl; l++) {
        for (int which = 0; which < 2; which++) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", palette[l % 10],
                    which ? " stroke-dasharray=\"4 3\"" : "");
            json_array_foreach(points, i, p) {
                e = json_array_get(json_object_get(p, "spans"), (size_t)l);
                if (!e) continue;
                double v = json_number_value(json_object_get(e, which ? "max" : "mean"));
                fprintf(f, "%.1f,%.1f ", xs(json_number_value(json_object_get(p, "step")), maxstep, x0, w),
                        top + h - h * v / maxspan);
            }
            fprintf(f, "\"><title>layer %d %s span</title></polyline>\n", l, which ? "largest" : "mean");
        }
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">layer %d</text>\n",
                x0, top + h + 30 + 16 * l, palette[l % 10], x0 + 18, top + h + 40 + 16 * l, l);
    }
}

/* "arch_weights": a panel per block, the softmax of its architecture
 * weights (attn, ffn, skip) against the step. */
static void draw_arch_weights(FILE *f, const char *title, json_t *points, int nl, double maxstep, int x0, int w, int top)
{
    static const char *kind[3] = {"attn", "ffn", "skip"}, *col[3] = {"#d9534f", "#5b9bd5", "#999999"};
    size_t i;
    json_t *p;
    int h = 90, gap = 28, H = top + nl * (h + gap) + 30;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            x0 + w + 30, H);
    fprintf(f, "<title>Architecture weights over training: %s</title>\n", title);
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">Block weights over training (", x0);
    for (int k = 0; k < 3; k++) fprintf(f, "<tspan fill=\"%s\">%s</tspan>%s", col[k], kind[k], k < 2 ? " / " : "");
    fprintf(f, "): %s</text>\n", title);
    for (int b = 0; b < nl; b++) {
        int y = top + b * (h + gap);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n", x0, y, w, h);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">block %d</text>\n", x0 - 6, y + h / 2 + 4, b);
        for (int k = 0; k < 3; k++) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col[k]);
            json_array_foreach(points, i, p) {
                json_t *row = json_array_get(json_object_get(p, "arch_weights"), (size_t)b);
                if (!row) continue;
                double v = json_number_value(json_array_get(row, (size_t)k));
                fprintf(f, "%.1f,%.1f ", xs(json_number_value(json_object_get(p, "step")), maxstep, x0, w), y + h - h * v);
            }
            fprintf(f, "\"><title>block %d p(%s)</title></polyline>\n", b, kind[k]);
        }
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\">step 0</text><text x=\"%d\" y=\"%d\" text-anchor=\"end\">step %.0f</text>\n", x0,
            H - 10, x0 + w, H - 10, maxstep);
}

/* The drawings, by what the progress lines carry. */
typedef void (*svg_drawing)(FILE *f, const char *title, json_t *points, int nl, double maxstep, int x0, int w, int top);
static const struct {
    const char *kind;
    svg_drawing draw;
} drawings[] = {{"spans", draw_spans}, {"arch_weights", draw_arch_weights}};

char *svg_training(const char *title, const char *kind, json_t *points)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    size_t np = json_array_size(points), i;
    json_t *p;
    double maxstep = 0;
    int nl = 0;
    json_array_foreach(points, i, p) {
        maxstep = fmax(maxstep, json_number_value(json_object_get(p, "step")));
        nl = (int)fmax(nl, (double)json_array_size(json_object_get(p, kind)));
    }
    if (nl > 1024) nl = 1024;
    const int x0 = 60, w = 520, top = 40;
    size_t d = 0;
    while (d < sizeof drawings / sizeof *drawings && strcmp(drawings[d].kind, kind) != 0) d++;
    if (d < sizeof drawings / sizeof *drawings) {
        drawings[d].draw(f, title, points, nl, maxstep, x0, w, top);
    } else {
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n",
                x0 + w + 30, top + 60);
        fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">%s: no drawing of '%s'</text>\n", x0, title, kind);
    }
    if (np == 0) fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#888\">no progress lines yet</text>\n", x0 + 10, top + 30);
    fprintf(f, "</svg>\n");
    fclose(f);
    return buf;
}
