/*
 * pack.h: the streaming layout of a model ("strata pack").
 *
 * A pack directory holds two files:
 *   trunk.bin      the embedding table, then one run per trunk unit (layers
 *                  0..n_layers-1, then the head pseudo-layer: final norm, output
 *                  AttnRes vectors, lm_head). Every region starts at a multiple of
 *                  4096 and is zero-padded to one, so a unit is ONE O_DIRECT read;
 *                  tensors inside a run start at multiples of 64. The embedding
 *                  table keeps its row-major bytes, so a row is read by offset.
 *   manifest.json  {"format": "strata-pack", "version": 2, "model_id": hex XXH3 of
 *                  the source identity (config.json, index json, every shard's name,
 *                  size and header bytes), "source": realpath of the model directory,
 *                  "shards": [{"name", "size", "mtime_ns"}...] (stamps taken before
 *                  the first source byte was read), "align": 4096, "trunk_bytes",
 *                  "embed": region, "units": [region...], "experts": {"mode":
 *                  "in_place", "n_layers_moe", "n_experts", "xxh3": [hex...]}}
 *                  with region = {"off", "nbytes", "xxh3", "tensors": [{"name",
 *                  "role", "dtype", "shape", "off" (relative to the region),
 *                  "nbytes", "xxh3", "block_rows", "blocks": [hex...]}]}. A
 *                  region's xxh3 is XXH3-64 of its padded bytes, a tensor's of its
 *                  own bytes (optional: packs written before it have none; a
 *                  streamed matrix read in row slices is checked against it), an
 *                  expert's of its six tensors in schema order. "blocks" (optional,
 *                  layer and head matrices of more than PACK_BLOCK_BYTES): the
 *                  XXH3-64 of each run of block_rows rows (the last may be
 *                  shorter); a streamed unit's matrices are checked block by block
 *                  by the threads that multiply with them (mm.c), its other
 *                  tensors against their own xxh3.
 * Experts stay in place in the shards: they are contiguous there, and an O_DIRECT
 * read of the enclosing 4096-aligned range costs < 8 KB extra per 17.5 MB expert,
 * while repacking would copy 1.45 TB for K3. make bench-io on the ladder model
 * (16,128 experts of 1.67 MB, 14,934 of them not 4096-aligned; loaded machine):
 * in place 0.69 / 1.04 / 0.78 / 0.85 / 0.69 GB/s at depth 1 / 4 / 8 / 16 / 32,
 * aligned (as if repacked) 0.67 / 0.86 / 0.85 / 0.89 / 0.88 GB/s: equal within
 * the run-to-run noise (3 later runs: paired median ratio 1.02, both 0.2-1.0
 * GB/s), so repacking buys nothing. It would cost a copy: on one disk reads and
 * writes share the bandwidth, and an O_DIRECT copy ran at ~0.5 GB/s, against
 * checksum reads at disk speed.
 *
 * Crash safety: trunk.bin is written as trunk.bin.tmp.<pid> and renamed;
 * manifest.json is written last (atomically) and is the commit point. One writer
 * per pack directory (flock on .strata-pack.lock in it). A directory holding
 * another model's manifest is refused.
 *
 * Integrity: the model id covers the headers, not the tensor bytes (hashing those
 * on every run would read the whole model). A pack is stale when the id differs or
 * a shard's size or mtime differs from its stamp: pack_open refuses it, pack_build
 * rebuilds it. Bytes changed with the mtime kept are caught as they are read (the
 * streaming source checks every record against these hashes) or by pack_verify,
 * which hashes trunk.bin, the trunk as the shards would pack now, and the experts.
 */
#ifndef STRATA_PACK_H
#define STRATA_PACK_H

#include <stddef.h>
#include <stdint.h>
#include "model.h"

#define PACK_DIRNAME "strata.pack"
#define PACK_VERSION 2 /* manifest version written and read (2: "source" and "shards" stamps) */
#define PACK_ALIGN 4096u
#define PACK_TENSOR_ALIGN 64u
/* Bytes per checksummed row block (rounded down to whole rows, at least one): a
 * block is hashed right after it was multiplied, from the multiplying core's L2
 * (1 MB on the dev VM), which a 256 KiB block and the kernel's own streams fit. */
#define PACK_BLOCK_BYTES (256u << 10)
#define PACK_SMALL_BLOCK_BYTES 1024u /* PACK_SMALL_BLOCKS: tiny test models get blocks too */
/* Rows per block of bb bytes of a (rows, ...) tensor of nbytes (0: it gets no
 * block hashes: not a matrix, or one block would hold it). */
static inline int64_t pack_block_rows(int ndim, int64_t rows, uint64_t nbytes, uint64_t bb) {
    if (ndim != 2 || rows < 2 || nbytes <= bb || nbytes % (uint64_t)rows) return 0;
    const uint64_t rb = nbytes / (uint64_t)rows;
    return rb >= bb ? 1 : (int64_t)(bb / rb);
}

typedef struct pack_tensor {
    const char *name;    /* owned by the pack */
    int32_t role, dtype, ndim;
    int64_t shape[4];
    uint64_t off, nbytes; /* off relative to the region start */
    uint64_t xxh3;        /* XXH3-64 of its nbytes (has_xxh3: the manifest has it) */
    int has_xxh3;
    int64_t blk_rows, n_blk; /* row blocks with their own XXH3 (0: the manifest has none) */
    uint64_t *blk;
} pack_tensor;

typedef struct pack_region {
    uint64_t off, nbytes; /* in trunk.bin; nbytes padded to PACK_ALIGN */
    uint64_t xxh3;
    int32_t n_tensors;
    pack_tensor *t;
} pack_region;

typedef struct pack {
    uint64_t model_id;
    int64_t n_layers, n_moe, n_experts;
    uint64_t trunk_bytes;
    pack_region embed;
    pack_region *units;   /* n_layers + 1 */
    uint64_t *expert_xxh3; /* n_moe * n_experts, (L - first_dense) * n_experts + E */
    char dir[1024];
    char trunk_path[1100];
    char stale[900];      /* PACK_OPEN_STALE_OK: why the shards no longer match the stamps ("" if they do) */
} pack;

/* Identity of the source model: XXH3 over config.json, the index json, and each
 * shard's file name, size and header bytes. */
int pack_model_id(const char *model_dir, const st_index *ix, uint64_t *id, char *err, size_t errlen);

/* Finds the pack of model_dir: model_dir/strata.pack, else the pointer written by a
 * pack with --out elsewhere ($XDG_CACHE_HOME/strata/packs/<hash of realpath>).
 * Returns 1 and the directory in out if a manifest exists there, else 0. */
int pack_find(const char *model_dir, char *out, size_t n);
/* pack_find, and -1 with why where the model has a pack that cannot be used: its
 * strata.pack directory holds no readable manifest.json (an interrupted or removed
 * pack, a directory this user cannot read), or the pack pointer is unreadable or
 * names a directory without one. */
int pack_find_ex(const char *model_dir, char *out, size_t n, char *why, size_t whylen);

typedef void (*pack_progress_fn)(void *ud, const char *phase, uint64_t done, uint64_t total, double secs);

typedef struct pack_result {
    uint64_t trunk_bytes, expert_bytes_hashed;
    double trunk_secs, expert_secs;
    double write_bw;      /* trunk bytes / trunk seconds (open to fsync) */
    double disk_bw;       /* PACK_MEASURE: the disk's write bandwidth just before; else 0 */
    uint64_t src_direct_bytes, src_cached_bytes; /* trunk source: read from disk / from the page cache */
    int already;          /* 1: an identical pack existed; nothing written */
    char stale[900];      /* non-empty: the pack there was stale (why) and was rebuilt */
    char dir[1024];
} pack_result;

/* pack_build flags */
#define PACK_FORCE 1          /* rebuild an existing pack of the same model */
#define PACK_MEASURE 2        /* first measure the disk's write bandwidth in the pack directory */
#define PACK_SRC_DIRECT 0x100 /* tests: read every source byte with O_DIRECT, even if cached */
#define PACK_SRC_CACHED 0x200 /* tests: read every source byte through the page cache (both: alternate) */
#define PACK_SMALL_IO 0x400   /* tests: 8 KiB reads and 12 KiB writes (every boundary case) */
#define PACK_SMALL_BLOCKS 0x800 /* tests: checksummed row blocks of PACK_SMALL_BLOCK_BYTES */
#define PACK_MEASURE_BYTES (1ull << 30)

/* Writes the pack of the model (c, ix from model_dir) into out_dir (NULL = the
 * default model_dir/strata.pack); flags: PACK_*. The output bytes do not depend on
 * the flags (PACK_SMALL_BLOCKS changes the manifest's blocks only). An up-to-date
 * pack there: res->already (PACK_FORCE rebuilds it). A
 * stale pack of this model (the default location, or "source" is model_dir):
 * rebuilt, res->stale says why. Another model's pack: STRATA_EINVAL, even with
 * PACK_FORCE. Another writer: STRATA_EBUSY. */
int pack_build(const char *model_dir, const cfg *c, const st_index *ix, const char *out_dir, int flags,
               pack_progress_fn progress, void *ud, pack_result *res, char *err, size_t errlen);

/* Loads and validates a manifest against the model: format and version (exactly
 * PACK_VERSION), identity, shard stamps (stale: STRATA_EINVAL, "re-run strata
 * pack"), hashes of exactly 16 hex digits, trunk.bin size, every region and tensor
 * at the offset the model's layout gives it, with the index's dtype and shape.
 * Every refusal names the manifest file. */
int pack_open(pack **out, const char *pack_dir, const char *model_dir, const cfg *c, const st_index *ix,
              char *err, size_t errlen);
/* pack_open with flags: PACK_OPEN_STALE_OK opens a pack whose shard stamps (size,
 * mtime) changed, recording why in p->stale (pack --verify then checks the bytes). */
#define PACK_OPEN_STALE_OK 1
int pack_open_ex(pack **out, const char *pack_dir, const char *model_dir, const cfg *c, const st_index *ix, int flags,
                 char *err, size_t errlen);
void pack_close(pack *p); /* accepts NULL */

/* The model's content digest (ident.h): XXH3 over every trunk tensor's XXH3 (in the
 * pack's layout order) and every expert's (its tensors in schema order, experts in
 * (layer, expert) order). From an open pack's manifest (no read; -1 when a trunk
 * tensor has no hash: a pack from before tensor hashes), or from the shards (reads
 * every trunk and expert byte once; flags: PACK_SRC_*, PACK_SMALL_IO). The two agree
 * whenever the pack holds the shards' bytes. */
int pack_content_digest(const pack *p, uint64_t *out);
int pack_content_digest_shards(const cfg *c, const st_index *ix, int flags, pack_progress_fn progress, void *ud,
                               uint64_t *out, char *err, size_t errlen);

/* Re-reads every region of trunk.bin, the trunk as the shards would pack now, and
 * every expert, and checks each XXH3; the first mismatch is named in err ("layer 7:
 * checksum mismatch in FILE bytes A..B", "layer 1: tensor T differs from the pack
 * at SHARD byte N") and returns STRATA_ECORRUPT. */
int pack_verify(const pack *p, const cfg *c, const st_index *ix, pack_progress_fn progress, void *ud,
                char *err, size_t errlen);

/* The wt view (model.h conventions) of a tensor of this dtype and shape at p. */
wt pack_view(const void *p, int dtype, int ndim, const int64_t *shape, int role);

/* Disk write bandwidth measured in dir the way pack writes the trunk: an unnamed
 * preallocated file, `bytes` (at most a quarter of the free space) in 4 MiB
 * O_DIRECT writes with several in flight, then fsync; timed from open to fsync.
 * Returns bytes/s, 0 if it could not measure. */
double pack_measure_write_bw(const char *dir, uint64_t bytes);

#endif
