/*
 * spm.h - the SentencePiece library (libsentencepiece, C++) behind a C
 * interface: core/spm.cc is the only C++ in the project, a thin shim that
 * loads a serialized model and calls the library's encoder and decoder.
 * tok_spm.c builds the vocabulary kind on it.
 */
#ifndef SPANSERVE_SPM_H
#define SPANSERVE_SPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spm spm;

/* A processor from the N bytes of a SentencePiece model file (its
 * serialized ModelProto); NULL with ERR (ERR_LEN bytes) when the library
 * refuses them. */
spm *spm_load(const void *bytes, size_t n, char *err);
void spm_free(spm *p);
/* Pieces in the model (ids 0 .. n-1). */
int spm_size(const spm *p);
/* The piece of ID as the model lists it (e.g. "\xe2\x96\x81the"), NUL-terminated
 * into BUF of CAP bytes (cut to fit); its full length in bytes. */
size_t spm_id_to_piece(const spm *p, int id, char *buf, size_t cap);
/* Whether ID is a control piece (no text: [PAD], [BOS], ...), the unknown
 * piece, or a byte piece (<0xNN>). */
int spm_is_control(const spm *p, int id);
int spm_is_unknown(const spm *p, int id);
int spm_is_byte(const spm *p, int id);
/* Encodes LEN bytes of TEXT (UTF-8) as the library does: the count of
 * pieces, of which at most CAP are written to IDS, with the byte offset
 * (in TEXT) where each begins into OFFS; -1 with ERR on a library error. */
long spm_encode(const spm *p, const char *text, size_t len, int32_t *ids, size_t *offs, size_t cap, char *err);
/* The library's text of IDS (N ids): its length; at most CAP - 1 bytes and
 * a NUL are written to BUF. -1 on an error (an id out of range). */
long spm_decode(const spm *p, const int32_t *ids, int n, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
