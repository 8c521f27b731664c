/*
 * st.h: safetensors checkpoints of one or more shards, indexed from headers only.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [b, e]}, ...,
 *  "__metadata__": {...}}, then raw data; offsets are relative to 8 + N.
 * A directory is read through model.safetensors.index.json when present (its
 * weight_map names the shard of each tensor), else every *.safetensors file in
 * lexical order. Lookup by name is O(1) (open-addressing hash).
 *
 * Validation (every failure names the file, the tensor and the reason): header
 * length sane (<= 100 MB and inside the file), JSON well formed, dtype known,
 * shape non-negative integers, byte length == product(shape) x dtype size,
 * offsets inside the file, no overlaps, names unique (also across shards), and an
 * index that names a missing shard or a tensor not in its shard is refused.
 */
#ifndef STRATA_ST_H
#define STRATA_ST_H

#include <stddef.h>
#include <stdint.h>

enum st_dtype { DT_F32, DT_F16, DT_BF16, DT_U8, DT_I8, DT_I32, DT_I64, DT_F8_E4M3, DT_COUNT };
size_t st_dtype_size(int dtype);
const char *st_dtype_name(int dtype);  /* "BF16" */
int st_dtype_parse(const char *s);     /* -1 if unknown */

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20)

typedef struct st_tensor {
    const char *name;   /* owned by the index */
    int32_t shard;
    int32_t dtype;
    int32_t ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t off;       /* absolute byte offset in the shard file */
    uint64_t nbytes;
} st_tensor;

typedef struct st_index st_index;

/* Pure: parses one shard header. buf holds the file's first bytes (at least
 * 8 + header length, or the whole file if shorter); file_size is the shard's true
 * size. Adds the tensors to ix under shard number `shard`. `what` names the file
 * in messages. Used by st_open_dir and by the fuzz target. */
int st_parse_header(st_index *ix, int32_t shard, const uint8_t *buf, size_t len,
                    uint64_t file_size, const char *what, char *err, size_t errlen);
/* Pure: parses model.safetensors.index.json bytes; calls fn(ud, tensor, shard_file)
 * for each weight_map entry; shard file names must be plain names (no '/'). */
int st_parse_index_json(const uint8_t *buf, size_t len, const char *what,
                        int (*fn)(void *ud, const char *tensor, const char *file), void *ud,
                        char *err, size_t errlen);

st_index *st_index_create(void);     /* empty index (for st_parse_header); NULL on OOM */
/* Opens a model directory (or a single .safetensors file). *out NULL on failure. */
int st_open(st_index **out, const char *path, char *err, size_t errlen);
void st_close(st_index *ix);         /* accepts NULL; closes fds, frees everything */

size_t st_count(const st_index *ix);
const st_tensor *st_at(const st_index *ix, size_t i);        /* i < st_count; in file order */
const st_tensor *st_find(const st_index *ix, const char *name); /* NULL if absent */
int st_n_shards(const st_index *ix);
const char *st_shard_path(const st_index *ix, int shard);
uint64_t st_shard_size(const st_index *ix, int shard);
int st_shard_fd(const st_index *ix, int shard);  /* buffered read-only fd, owned by ix */
/* Reads nbytes at tensor-relative offset rel into dst (pread loop; short read = EIO). */
int st_read(const st_index *ix, const st_tensor *t, uint64_t rel, void *dst, uint64_t nbytes,
            char *err, size_t errlen);

#endif
