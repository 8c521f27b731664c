/*
 * stw.h: safetensors writer (the reading side is st.h).
 *
 * A file is: u64 little-endian N, N bytes of JSON header, then the data of every
 * tensor back to back, no holes (the format forbids them). The header lists each
 * tensor as {"dtype", "shape", "data_offsets": [begin, end]} relative to the data
 * start, plus "__metadata__" with string values. The header is padded with spaces
 * so the data starts at a multiple of `align` (8 at least, which the format asks
 * for; 4096 keeps the first tensor O_DIRECT-aligned).
 *
 * The writer never holds tensor data: stw_header builds the prefix from names,
 * dtypes and shapes; the caller then streams the bytes through stw_file_write in
 * header order. stw_save is the all-in-memory convenience for small fixtures.
 */
#ifndef STRATA_STW_H
#define STRATA_STW_H

#include <stddef.h>
#include <stdint.h>
#include "st.h"

typedef struct stw_entry {
    const char *name;   /* borrowed; plain text, escaped on output */
    int dtype;          /* enum st_dtype */
    int ndim;           /* 1..4 */
    int64_t shape[4];
    uint64_t nbytes;    /* must equal product(shape) * dtype size */
} stw_entry;

/* "BF16", ... and bytes per element; "?" / 0 for an unknown dtype. Same table as
 * st.h's st_dtype_* (kept here so the writer does not depend on the reader). */
const char *stw_dtype_name(int dtype);
size_t stw_dtype_size(int dtype);

/* Builds the file prefix (u64 N + header JSON + space padding) for entries e[0..n)
 * laid out in that order. meta is n_meta key/value string pairs (meta[2i] = key,
 * meta[2i+1] = value) for "__metadata__" (omitted when n_meta == 0). Returns a
 * MEM_MISC buffer the caller base_free()s, its length in *out_len and the data
 * size in *data_bytes; NULL on OOM or on an entry whose nbytes does not match its
 * shape (message in err). */
uint8_t *stw_header(const stw_entry *e, size_t n, const char *const *meta, size_t n_meta,
                    size_t align, size_t *out_len, uint64_t *data_bytes, char *err, size_t errlen);

/* One file written sequentially. */
typedef struct stw_file {
    int fd;
    int direct;         /* O_DIRECT is on */
    uint64_t written;
    char path[4096];
} stw_file;

/* Creates (truncates) path. */
int stw_file_create(stw_file *f, const char *path, char *err, size_t errlen);
/* Appends n bytes. With direct I/O on, an unaligned write (pointer, length or
 * file offset not a multiple of STW_DIRECT_ALIGN) or one the filesystem refuses
 * turns it off and goes through the page cache, so callers never need to care. */
int stw_file_write(stw_file *f, const void *p, size_t n, char *err, size_t errlen);
/* Asks for O_DIRECT writes (on = 1) or buffered ones; returns the new state (0 if
 * the filesystem does not support it). */
int stw_file_direct(stw_file *f, int on);
#define STW_DIRECT_ALIGN 4096
/* Extends the file to final_size with a hole when final_size > written (sparse
 * files), fsyncs and closes. */
int stw_file_finish(stw_file *f, uint64_t final_size, char *err, size_t errlen);
/* Closes and unlinks a file that will not be finished. */
void stw_file_abort(stw_file *f);

/* Writes a complete small safetensors file atomically (path.tmp + fsync + rename)
 * from in-memory tensors: data[i] holds e[i].nbytes bytes. align as stw_header. */
int stw_save(const char *path, const stw_entry *e, size_t n, const void *const *data,
             const char *const *meta, size_t n_meta, size_t align, char *err, size_t errlen);

#endif
