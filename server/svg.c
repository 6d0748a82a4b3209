/*
 * svg.c - pictures of what a model learned, for people: an adaptive-span
 * model as a layers x heads heat map of spans (colour on a log scale of the
 * span, the value written in each cell); a PAR model as its block sequence,
 * each block coloured by its kind with bars for the softmax of its
 * architecture weights.
 */
#define _GNU_SOURCE
#include "server.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* white -> deep blue as X goes 0 -> 1 */
static void heat(double x, char *buf, size_t cap)
{
    x = x < 0 ? 0 : x > 1 ? 1 : x;
    int r = (int)(255 - x * 225), g = (int)(255 - x * 170), b = (int)(255 - x * 60);
    snprintf(buf, cap, "#%02x%02x%02x", r, g, b);
}

char *svg_spans(const model_t *m)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    if (m->fam == FAM_ASPAN) {
        int cw = 64, chh = 28, x0 = 70, y0 = 50, W = x0 + cw * m->n_head + 20, H = y0 + chh * m->n_layers + 50;
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
        fprintf(f, "<title>Adaptive spans: %d layers x %d heads, maximum span %d</title>\n", m->n_layers, m->n_head, m->span);
        fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">Learned span z per head (tokens; maximum %d, ramp %d)</text>\n", x0, m->span, m->ramp);
        for (int h = 0; h < m->n_head; h++)
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">head %d</text>\n", x0 + h * cw + cw / 2, y0 - 8, h);
        for (int l = 0; l < m->n_layers; l++) {
            const layer_t *y = &m->layers[l];
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">layer %d</text>\n", x0 - 8, y0 + l * chh + chh / 2 + 4, l);
            for (int h = 0; h < m->n_head; h++) {
                double span = (double)y->zfrac[h] * m->span;
                char col[8];
                heat(log1p(span) / log1p(m->span), col, sizeof col);
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"#888\"><title>layer %d head %d: span %.1f, reach %d</title></rect>\n",
                        x0 + h * cw, y0 + l * chh, cw, chh, col, l, h, span, y->reach[h]);
                fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"%s\">%.0f</text>\n", x0 + h * cw + cw / 2,
                        y0 + l * chh + chh / 2 + 4, span > m->span * 0.3 ? "#fff" : "#000", span);
            }
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\">memory per session: %zu bytes (reference: %zu)</text>\n", x0,
                y0 + chh * m->n_layers + 30, mem_bytes(m), mem_bytes_reference(m));
    } else {
        int bw = 56, x0 = 20, y0 = 50, bh = 90, W = x0 * 2 + bw * m->n_layers, H = y0 + bh + 80;
        static const char *kind_col[3] = {"#d9534f", "#5b9bd5", "#bbbbbb"};
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
        fprintf(f, "<title>PAR Transformer-XL: %d blocks</title>\n", m->n_layers);
        fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">Blocks and their architecture weights (attn / ffn / skip)</text>\n", x0);
        for (int b = 0; b < m->n_layers; b++) {
            const layer_t *y = &m->layers[b];
            int x = x0 + b * bw;
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"24\" fill=\"%s\" stroke=\"#444\"><title>block %d: %s</title></rect>\n",
                    x + 2, y0, bw - 4, kind_col[y->kind], b, blk_kind_name(y->kind));
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#fff\">%s</text>\n", x + bw / 2, y0 + 16, blk_kind_name(y->kind));
            double p[3];
            if (model_alpha_softmax(y, p) == 0)
                for (int k = 0; k < 3; k++) {
                    int h = (int)(p[k] * (bh - 30));
                    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"%d\" fill=\"%s\"><title>block %d p(%s) = %.3f</title></rect>\n",
                            x + 6 + k * 15, y0 + bh + 10 - h, h, kind_col[k], b, blk_kind_name((blk_kind)k), p[k]);
                }
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", x + bw / 2, y0 + bh + 26, b);
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\">memory per session: %zu bytes (mem_len %d)</text>\n", x0, y0 + bh + 50,
                mem_bytes(m), m->mem_len);
    }
    fprintf(f, "</svg>\n");
    fclose(f);
    return buf;
}
