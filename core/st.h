/*
 * st.h - safetensors files: read (mmap'd, every offset checked) and write
 * (atomically: a temporary file, fsync, rename).
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON
 * ({"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets"}}),
 * then the raw little-endian tensor bytes. Offsets are relative to the end of
 * the header; the tensors must tile the data exactly (no overlap, no hole, no
 * trailing bytes), as the format's specification says.
 */
#ifndef SPANSERVE_ST_H
#define SPANSERVE_ST_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIM 8
/* A header is a few kB per hundred tensors; 100 MiB is far past any real
 * checkpoint and keeps a hostile length from allocating without bound. */
#define ST_MAX_HEADER (100u << 20)
#define ST_MAX_TENSORS 100000

typedef enum {
    ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8,
    ST_U64, ST_U32, ST_U16, ST_U8, ST_BOOL, ST_NDTYPES
} st_dtype;

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIM];
    size_t nbytes;
    const void *data;   /* into the mapping or the parsed buffer; may be unaligned */
} st_tensor;

typedef struct st_file st_file;

/* Opens and validates PATH (mmap'd read-only). */
st_file *st_open(const char *path, char *err);
/* The same, naming the file NAME in every error: a server shows its clients
 * a name they gave, never where its files live. */
st_file *st_open_named(const char *path, const char *name, char *err);
/* Validates an in-memory file image (BUF stays owned by the caller and must
 * outlive the result). Used by st_open and by the fuzz target. */
st_file *st_parse(const void *buf, size_t len, const char *label, char *err);
void st_close(st_file *f);

int st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, int i);
const st_tensor *st_find(const st_file *f, const char *name);
/* The string value of __metadata__[KEY], or NULL. */
const char *st_meta(const st_file *f, const char *key);

const char *st_dtype_name(st_dtype d);
size_t st_dtype_size(st_dtype d);
int64_t st_numel(const st_tensor *t);

/* Writing. Tensors are referenced, not copied: keep their data alive until
 * st_writer_save returns. */
typedef struct st_writer st_writer;
st_writer *st_writer_new(void);
int st_writer_meta(st_writer *w, const char *key, const char *value);
int st_writer_add(st_writer *w, const char *name, st_dtype dtype, int ndim,
                  const int64_t *shape, const void *data);
int st_writer_save(st_writer *w, const char *path, char *err);
void st_writer_free(st_writer *w);

#endif
