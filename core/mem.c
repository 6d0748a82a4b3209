/*
 * mem.c - the memory of a stream (see model.h): allocation, size accounting,
 * and a portable serialised form for session export and snapshots.
 */
#include "err.h"
#include "family.h"
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The layout of the rings is the family's (family.h). */
static int mem_slots(const model_t *m) { return m->family->mem_slots(m); }
static int slot_krows(const model_t *m, int i) { return m->family->slot_krows(m, i); }
static int slot_vrows(const model_t *m, int i) { return m->family->slot_vrows(m, i); }
static int slot_width(const model_t *m) { return m->family->slot_width(m); }

static size_t mem_floats(const model_t *m)
{
    size_t n = 0;
    for (int i = 0; i < mem_slots(m); i++) n += ((size_t)slot_krows(m, i) + slot_vrows(m, i)) * slot_width(m);
    return n;
}

size_t mem_bytes(const model_t *m) { return mem_floats(m) * sizeof(float) + (size_t)m->window * sizeof(int32_t); }
size_t mem_bytes_reference(const model_t *m) { return m->family->mem_reference(m); }
size_t mem_bytes_full(const model_t *m) { return m->family->mem_full(m); }
const char *mem_full_name(const model_t *m) { return m->family->full_name; }
int64_t mem_held_rows(const model_t *m, int l, int64_t pos) { return m->family->held_rows(m, l, pos); }

mem_t *mem_new(const model_t *m)
{
    mem_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->m = m;
    s->n_floats = mem_floats(m);
    s->buf = calloc(s->n_floats ? s->n_floats : 1, sizeof(float));
    s->off = calloc((size_t)mem_slots(m), sizeof *s->off);
    s->len = calloc((size_t)m->n_layers, sizeof *s->len);
    s->toks = m->window ? calloc((size_t)m->window, sizeof *s->toks) : NULL;
    s->keep = -1;
    if (!s->buf || !s->off || !s->len || (m->window && !s->toks)) {
        mem_free(s);
        return NULL;
    }
    size_t at = 0;
    for (int i = 0; i < mem_slots(m); i++) {
        s->off[i] = at;
        at += ((size_t)slot_krows(m, i) + slot_vrows(m, i)) * slot_width(m);
    }
    s->pending = -1;
    if (m->backend && m->backend->attach(m->backend->ctx, s, NULL)) {
        mem_free(s);
        return NULL;
    }
    return s;
}

void mem_free(mem_t *s)
{
    if (!s) return;
    if (s->dev) s->m->backend->detach(s->m->backend->ctx, s);
    free(s->buf);
    free(s->off);
    free(s->len);
    free(s->toks);
    free(s);
}

void mem_windows(mem_t *s, int keep)
{
    const int C = s->m->window;
    s->keep = keep < 0 ? -1 : keep >= C ? (C > 0 ? C - 1 : 0) : keep;
}

int mem_block(const mem_t *s)
{
    const model_t *m = s->m;
    return m->window && s->keep >= 0 ? m->window - s->keep : model_score_block(m);
}

void mem_reset(mem_t *s)
{
    memset(s->buf, 0, s->n_floats * sizeof(float));
    memset(s->len, 0, (size_t)s->m->n_layers * sizeof *s->len);
    if (s->toks) memset(s->toks, 0, (size_t)s->m->window * sizeof *s->toks);
    s->pos = 0;
    s->pending = -1;
    if (s->dev) s->m->backend->push(s->m->backend->ctx, s, NULL);
}

/* The host copy of the rings, up to date. */
static int mem_pull(const mem_t *s)
{
    return s->dev ? s->m->backend->pull(s->m->backend->ctx, (mem_t *)s, NULL) : 0;
}

int mem_copy(mem_t *dst, const mem_t *src)
{
    if (dst->m != src->m || mem_pull(src)) return -1;
    memcpy(dst->buf, src->buf, src->n_floats * sizeof(float));
    memcpy(dst->len, src->len, (size_t)src->m->n_layers * sizeof *src->len);
    if (src->toks) memcpy(dst->toks, src->toks, (size_t)src->m->window * sizeof *src->toks);
    dst->pos = src->pos;
    dst->keep = src->keep;
    dst->pending = src->pending;
    return dst->dev ? dst->m->backend->push(dst->m->backend->ctx, dst, NULL) : 0;
}

/* ------------------------------------------------------------ serialised form
 *
 *   0  8  magic "SPSMEM1\0"
 *   8  8  model fingerprint (little-endian u64)
 *  16  8  positions consumed (i64)
 *  24  4  pending token (i32, -1 for none)
 *  28  4  number of layers (u32)
 *  32  8  number of floats (u64)
 *  40  4*n_layers  rows held per layer (par) or zeros
 *  ... floats, little-endian IEEE 754
 *  ... window models only: the token ring, `window` int32 (position p at
 *      p % window; the last min(pos, window) positions are held, the rest 0)
 *
 * Written on the host's byte order, which every supported machine shares
 * (x86-64, aarch64): little-endian.
 */
#define MEM_MAGIC "SPSMEM1"
#define MEM_HDR 40
#define MEM_MAX_ABS 1e8

int64_t mem_room(const mem_t *s)
{
    return MEM_MAX_POS - s->pos - (s->pending >= 0);
}

size_t mem_serial_size(const mem_t *s)
{
    return MEM_HDR + 4 * (size_t)s->m->n_layers + s->n_floats * sizeof(float) + 4 * (size_t)s->m->window;
}

size_t mem_serial_header(mem_t *s, void *buf, size_t cap)
{
    size_t n = MEM_HDR + 4 * (size_t)s->m->n_layers;
    if (cap < n || mem_pull(s)) return 0;
    unsigned char *p = buf;
    uint32_t nl = (uint32_t)s->m->n_layers;
    uint64_t nf = s->n_floats;
    int32_t pend = s->pending;
    memcpy(p, MEM_MAGIC, 8);
    memcpy(p + 8, &s->m->fingerprint, 8);
    memcpy(p + 16, &s->pos, 8);
    memcpy(p + 24, &pend, 4);
    memcpy(p + 28, &nl, 4);
    memcpy(p + 32, &nf, 8);
    for (uint32_t l = 0; l < nl; l++) {
        int32_t len = s->len[l];
        memcpy(p + MEM_HDR + 4 * l, &len, 4);
    }
    return n;
}

int mem_serialize(mem_t *s, void *buf, size_t cap)
{
    if (cap < mem_serial_size(s)) return -1;
    size_t h = mem_serial_header(s, buf, cap);
    if (!h) return -1;
    memcpy((unsigned char *)buf + h, s->buf, s->n_floats * sizeof(float));
    if (s->toks) memcpy((unsigned char *)buf + h + s->n_floats * sizeof(float), s->toks, 4 * (size_t)s->m->window);
    return 0;
}

int mem_deserialize(mem_t *s, const void *buf, size_t len, char *err)
{
    const unsigned char *p = buf;
    const model_t *m = s->m;
    if (len < MEM_HDR || memcmp(p, MEM_MAGIC, 8) != 0)
        return err_set(err, "not a spanserve session state (bad magic)");
    uint64_t fp, nf;
    int64_t pos;
    int32_t pend;
    uint32_t nl;
    memcpy(&fp, p + 8, 8);
    memcpy(&pos, p + 16, 8);
    memcpy(&pend, p + 24, 4);
    memcpy(&nl, p + 28, 4);
    memcpy(&nf, p + 32, 8);
    if (fp != m->fingerprint)
        return err_set(err, "the state belongs to another model (fingerprint %016llx, this model %016llx)",
                       (unsigned long long)fp, (unsigned long long)m->fingerprint);
    if (nl != (uint32_t)m->n_layers)
        return err_set(err, "the state has %u layers, the model %d", nl, m->n_layers);
    if (nf != s->n_floats)
        return err_set(err, "the state holds %llu floats, a memory of this model %zu (another --memory mode?)",
                       (unsigned long long)nf, s->n_floats);
    if (len != mem_serial_size(s))
        return err_set(err, "the state is %zu bytes, %s than the %zu its header describes", len,
                       len < mem_serial_size(s) ? "shorter" : "longer", mem_serial_size(s));
    if (pos < 0 || pos > MEM_MAX_POS - (pend >= 0) || pend < -1 || pend >= m->V)
        return err_set(err, "the state's position (%lld, with %s pending token) or pending token (%d) is invalid: "
                       "a stream holds at most %lld positions and tokens are in [0, %d)", (long long)pos,
                       pend >= 0 ? "a" : "no", pend, (long long)MEM_MAX_POS, m->V);
    for (uint32_t l = 0; l < nl; l++) {
        int32_t k;
        memcpy(&k, p + MEM_HDR + 4 * l, 4);
        int64_t want = m->family->held_rows(m, (int)l, pos);
        if (k != want) return err_set(err, "the state's memory length of layer %u is invalid", l);
    }
    /* what a model writes is finite and far inside this bound; past it (a
     * made-up state) the forward could overflow to infinities and NaNs */
    const unsigned char *vals = p + MEM_HDR + 4 * nl;
    for (size_t i = 0; i < s->n_floats; i++) {
        float v;
        memcpy(&v, vals + 4 * i, 4);
        if (!(fabsf(v) <= MEM_MAX_ABS))
            return err_set(err, "the state's value %zu is %g: a memory holds finite values within +-%g", i, (double)v,
                           MEM_MAX_ABS);
    }
    /* a window model's tokens: ids of the vocabulary where held, zeros elsewhere */
    const unsigned char *tv = vals + 4 * s->n_floats;
    const int C = m->window;
    const int64_t held = pos < C ? pos : C;
    for (int i = 0; i < C; i++) {
        int32_t t;
        memcpy(&t, tv + 4 * (size_t)i, 4);
        const int64_t age = ((pos - 1 - i) % C + C) % C;   /* slot i holds position pos-1-age */
        if (age < held ? (t < 0 || t >= m->V) : t != 0)
            return err_set(err, "the state's token %d is %d: a window holds token ids in [0, %d) where it has seen "
                           "tokens and 0 elsewhere", i, t, m->V);
    }
    for (uint32_t l = 0; l < nl; l++) {
        int32_t k;
        memcpy(&k, p + MEM_HDR + 4 * l, 4);
        s->len[l] = k;
    }
    memcpy(s->buf, vals, s->n_floats * sizeof(float));
    if (C) memcpy(s->toks, tv, 4 * (size_t)C);
    s->pos = pos;
    s->pending = pend;
    if (s->dev && m->backend->push(m->backend->ctx, s, err)) return -1;
    return 0;
}
