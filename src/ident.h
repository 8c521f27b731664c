/*
 * ident.h: the model identity, the 64-bit id that state files, prefix-cache
 * files and the ranks of a cluster are tied to.
 *
 * It covers the config (infer_cfg_fingerprint), the tensor table (every tensor's
 * name, dtype, shape, shard and byte range) and the content of every tensor the
 * engine reads: XXH3 over each trunk tensor's XXH3 and each expert's
 * (pack_content_digest). Where a pack of the model is open, those record hashes
 * come from its manifest (no read: its shard stamps and, as the bytes are read,
 * its checksums tie it to the shards); otherwise they are computed from the shards
 * (every weight byte read once) and cached in
 * $XDG_CACHE_HOME/strata/identity/<hash of the model's realpath>.json, keyed by the
 * table hash and each shard's name, size, mtime (ns), inode and device. The two
 * ways give the same id for the same bytes. The cache file is untrusted: anything
 * malformed or not matching exactly is recomputed and rewritten. Models under
 * 256 MiB are hashed at every load instead (STRATA_IDENT_CACHE_MIN: bytes).
 */
#ifndef STRATA_IDENT_H
#define STRATA_IDENT_H

#include <stddef.h>
#include <stdint.h>
#include "model.h"
#include "pack.h"

typedef struct ident_opts {
    pack_progress_fn progress; /* hashing the shards: ("identity", done, total, secs) */
    void *ud;
    int flags;                 /* PACK_SRC_*, PACK_SMALL_IO for the shard reads */
} ident_opts;

/* Where the content digest came from (ident_result.source). */
enum { IDENT_FROM_PACK = 1, IDENT_FROM_CACHE = 2, IDENT_HASHED = 3 };

typedef struct ident_result {
    uint64_t id;               /* never 0 */
    uint64_t table, content;   /* the two halves */
    int source;                /* IDENT_FROM_* */
    uint64_t bytes_hashed;     /* IDENT_HASHED: shard bytes read */
    double secs;
} ident_result;

/* The identity of the model in model_dir (c, ix opened from it); pk: its open pack
 * or NULL. A pack whose record hashes disagree with a cached hash of the shards
 * (same stamps) is refused (STRATA_EINVAL, naming the pack). Errors name the file. */
int ident_model(const char *model_dir, const cfg *c, const st_index *ix, const pack *pk, const ident_opts *o,
                ident_result *res, char *err, size_t errlen);

/* The cache file of model_dir (for messages and tests). */
void ident_cache_path(const char *model_dir, char *out, size_t n);

#endif
