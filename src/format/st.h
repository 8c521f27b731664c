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
 * Stricter than the letter of the format on purpose: shape entries and offsets
 * must be JSON integers (2.0 is refused), a tensor entry has exactly the keys
 * dtype/shape/data_offsets, "__metadata__" is an object of strings, a tensor in a
 * shard but absent from the index is refused, and gaps between tensors are allowed.
 * Shard numbers follow the lexical order of the shard file names (with or without
 * an index); shard files the index does not name are ignored.
 *
 * Thread-safety: after st_open returns, every query (st_find, st_at, st_read, ...)
 * is read-only and may be called from any number of threads.
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
    uint64_t nbytes;    /* == product(shape) x st_dtype_size(dtype); rank 0 = 1 element */
} st_tensor;

typedef struct st_index st_index;

/* Pure: parses one shard header. buf holds the file's first bytes (at least
 * 8 + header length, or the whole file if shorter); file_size is the shard's true
 * size. Adds the tensors to ix under shard number `shard`. `what` names the file
 * in messages. Used by st_open_dir and by the fuzz target. */
int st_parse_header(st_index *ix, int32_t shard, const uint8_t *buf, size_t len,
                    uint64_t file_size, const char *what, char *err, size_t errlen);
/* On failure st_parse_header leaves ix as it was (tensors added by earlier calls
 * stay). Tensor pointers from st_at/st_find are invalidated by the next
 * st_parse_header on the same index; after st_open they stay valid until st_close. */
/* Pure: parses model.safetensors.index.json bytes; calls fn(ud, tensor, shard_file)
 * for each weight_map entry; shard file names must be plain names (no '/').
 * Streaming: fn sees entries in file order as they are read, so it may have been
 * called for earlier entries before a later syntax error is reported. The strings
 * passed to fn are valid only during the call. A non-zero return from fn stops the
 * parse and is returned. Duplicate tensor keys are passed through (st_open refuses
 * them); "metadata" must be an object if present; other top-level keys are ignored. */
int st_parse_index_json(const uint8_t *buf, size_t len, const char *what,
                        int (*fn)(void *ud, const char *tensor, const char *file), void *ud,
                        char *err, size_t errlen);

st_index *st_index_create(void);     /* empty index (for st_parse_header); NULL on OOM */
/* Opens a model directory (or a single .safetensors file, or a *.index.json file
 * whose shards sit next to it). *out NULL on failure; release with st_close. */
int st_open(st_index **out, const char *path, char *err, size_t errlen);
void st_close(st_index *ix);         /* accepts NULL; closes fds, frees everything */

size_t st_count(const st_index *ix);
/* i < st_count; in file order: shard number, then data offset (ties: empty tensor
 * first, then name). NULL when i >= st_count. */
const st_tensor *st_at(const st_index *ix, size_t i);
const st_tensor *st_find(const st_index *ix, const char *name); /* NULL if absent */
int st_n_shards(const st_index *ix);
const char *st_shard_path(const st_index *ix, int shard);
uint64_t st_shard_size(const st_index *ix, int shard);
/* Read-only fd (O_RDONLY|O_CLOEXEC, opened once at st_open), owned by ix: use
 * pread on it, never close it or move its offset. -1 if shard is out of range. */
int st_shard_fd(const st_index *ix, int shard);
/* Reads nbytes at tensor-relative offset rel into dst (pread loop; short read = EIO).
 * rel + nbytes beyond the tensor's bytes = EINVAL. Thread-safe. */
int st_read(const st_index *ix, const st_tensor *t, uint64_t rel, void *dst, uint64_t nbytes,
            char *err, size_t errlen);

#endif
