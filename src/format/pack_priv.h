/*
 * pack_priv.h: what the pack files share. pack.c builds a pack (layout, trunk
 * copy, expert checksums, the build itself), pack_io.c streams the source reads
 * and the trunk writes, pack_manifest.c holds the pack's identity, finds packs,
 * reads and writes manifests and opens a pack, pack_verify.c verifies a pack and
 * digests its content. Here: the I/O sizes, the layout of a pack being written,
 * the source stream, the write ring, the tensor-hash walk, and the functions one
 * file gives another. Private to those files: the module's interface is pack.h,
 * which this header does not include (pack.c includes this one), so pack.h's
 * types are named by their tags.
 */
#ifndef STRATA_PACK_PRIV_H
#define STRATA_PACK_PRIV_H

#include <stddef.h>
#include <stdint.h>
#include <liburing.h>
#include <xxhash.h>
#include "cfg.h"
#include "io.h"
#include "jsonx.h"
#include "st.h"

struct pack_result;
/* pack.h's progress callback, repeated (C11 allows an identical typedef twice) */
typedef void (*pack_progress_fn)(void *ud, const char *phase, uint64_t done, uint64_t total, double secs);

/* 4 MiB reads x 6 in flight and 4 MiB writes x 5 in flight: on this disk (shared
 * VM, O_DIRECT, 1 GiB files) 4 MiB x 8 and 16 MiB x 4 writes measured the same
 * within the noise (medians 1.5-1.7 GB/s, runs 1.2-2.7); IO_CHUNK explains the
 * read size. Gaps up to SRC_GAP between extents of one shard are read through. */
#define SRC_CHUNK (4u << 20)
#define SRC_SLOTS 6
#define SRC_GAP (256u << 10)
#define OUT_BYTES (4u << 20)
#define OUT_BUFS 6
/* PACK_SMALL_IO (tests): every chunk and buffer boundary falls inside tiny models */
#define SMALL_CHUNK (8u << 10)
#define SMALL_OUT (12u << 10)

/* ======================================================= layout (pack.c) */

typedef struct lt {            /* one tensor while laying out */
    const st_tensor *src;
    int role, kind;            /* kind: tspec's (a quantised matrix's parts share a role) */
    uint64_t off;              /* relative to the region */
    uint64_t xxh3;             /* of its bytes (pack_write_trunk) */
    int64_t blk_rows, n_blk;   /* row blocks with their own hashes (pack_block_rows; 0: none) */
    uint64_t *blk;             /* their XXH3s (pack_write_trunk) */
} lt;

typedef struct lregion {
    uint64_t off, nbytes, xxh3;
    int n;
    lt *t;
    int verbatim;              /* one gap-free source run: copied as one stream */
    int src_shard;
    uint64_t src_off, src_len;
} lregion;

typedef struct layout {
    int64_t n_units;
    lregion embed;
    lregion *units;
    uint64_t total;
} layout;

/* ================================================== source reads (pack_io.c) */

/* A source extent: bytes [off, off+len) of shard `shard`. A pass (the trunk copy,
 * the expert checksums) is one list of extents consumed in order. */
typedef struct sext {
    int shard;
    uint64_t off, len;
} sext;

/* One planned read: the aligned range [a0, a1) of a shard. slot >= 0: read with
 * O_DIRECT into that staging slot ahead of use. slot < 0: every page of the range
 * was in the page cache when planned, so nothing is read ahead; the consumer
 * preads the bytes straight to where they go (no disk time, no staging copy). */
typedef struct schunk {
    int shard, slot, done;
    uint64_t a0, a1;
    io_req q;
} schunk;

enum { SQ_MAX = 16 };          /* planned chunks, resident ones included */

typedef struct sstream {
    const sext *x;
    int64_t nx;
    int mode;                  /* PACK_SRC_DIRECT, PACK_SRC_CACHED, both (alternate), 0: by residency */
    int64_t n_planned;
    uint64_t chunk;            /* bytes per read, multiple of IO_ALIGN */
    int n_files;
    io_file *files;            /* per shard */
    uint8_t **map;             /* per shard: PROT_READ mapping for mincore, or NULL */
    long page;
    io_ring *ring;
    uint8_t *slot[SRC_SLOTS];  /* `chunk` bytes each */
    int slot_free[SRC_SLOTS], n_free;
    schunk q[SQ_MAX];          /* FIFO in consumption order */
    int qh, qn;
    int64_t gx;                /* planner: extent, and its first byte not yet planned */
    uint64_t gp;
    int last_shard;            /* the last planned chunk (-1: none) */
    uint64_t last_a0, last_a1;
    int64_t cx;                /* consumer: extent and next byte */
    uint64_t cp;
    uint64_t bytes_direct, bytes_cached;
} sstream;

typedef struct spiece {        /* pack_src_next: the next bytes of the current extent */
    const uint8_t *p;          /* in a staging slot (valid until the next call), or NULL: resident */
    int shard;
    uint64_t off, n;
} spiece;

/* ==================================================== write ring (pack_io.c) */

/* Sequential writes from a ring of aligned buffers: the caller fills the current
 * buffer and queues it; up to nbuf - 1 writes are in flight (io_uring, O_DIRECT
 * when the file allows it) while the next one is filled and hashed. Without
 * io_uring the writes are synchronous pwrites. */
typedef struct wring {
    int fd, uring, nbuf, cur, inflight;
    struct io_uring ring;
    uint64_t bsz, off;         /* buffer size; file offset of the current buffer */
    uint8_t *buf[OUT_BUFS];
    uint64_t len[OUT_BUFS], boff[OUT_BUFS];
    int busy[OUT_BUFS];
    int rc, err_no;
} wring;

/* ================================================ tensor hashes (pack.c) */

/* Hashes of a region's tensors and of their row blocks, computed as the region's
 * bytes go by in order (tensors never overlap; a gap or padding belongs to none).
 * The writer fills the layout's hashes with it; pack --verify recomputes them. */
typedef struct twt {
    uint64_t off, nbytes;      /* relative to the region */
    uint64_t bb;               /* bytes per block (0: no blocks) */
    uint64_t *h, *blk;         /* out: the tensor's hash, its blocks' */
} twt;
typedef struct twalk {
    twt *t;
    int n, ti;                 /* ti: the tensor being hashed (-1: find the next) */
    uint64_t pos;
    XXH3_state_t th, bh;
} twalk;

/* ============================================================== functions */

/* pack.c */
int pack_layout_build(const cfg *c, const st_index *ix, layout *l, char *err, size_t errlen);
void pack_layout_free(layout *l);
void pack_tw_start(twalk *w, twt *t, int n);
void pack_tw_bytes(twalk *w, const uint8_t *p, uint64_t k);
int pack_write_trunk(layout *l, const st_index *ix, const char *tmp, int flags, pack_progress_fn progress,
                     void *ud, uint64_t *hashes, struct pack_result *res, char *err, size_t errlen);
int pack_hash_experts(const cfg *c, const st_index *ix, uint64_t *out, const uint64_t *expect, int flags,
                      pack_progress_fn progress, void *ud, uint64_t *bytes_done, char *err, size_t errlen);

/* pack_io.c */
int pack_src_open_files(sstream *s, int n_files, const char *(*path)(const void *ctx, int i), const void *ctx,
                        const sext *x, int64_t nx, int mode, uint64_t chunk, char *err, size_t errlen);
int pack_src_open(sstream *s, const st_index *ix, const sext *x, int64_t nx, int mode, uint64_t chunk,
                  char *err, size_t errlen);
int pack_src_next(sstream *s, spiece *pc, char *err, size_t errlen);
int pack_src_pread(const sstream *s, const spiece *pc, uint8_t *dst, char *err, size_t errlen);
void pack_src_close(sstream *s);
int pack_wring_init(wring *w, int fd, uint64_t bsz, char *err, size_t errlen);
int pack_wring_put(wring *w, uint64_t len);
int pack_wring_drain(wring *w);
void pack_wring_free(wring *w);
int pack_wfile_open(const char *path, int tmpfile, uint64_t bytes, char *err, size_t errlen);

/* pack_manifest.c */
json_t *pack_stamps_json(const st_index *ix, char *err, size_t errlen);
int pack_stamps_stale(const json_t *rec, const st_index *ix, char *why, size_t n);
void pack_pointer_path(const char *model_dir, char *out, size_t n);
json_t *pack_region_json(const lregion *r, uint64_t h);
int pack_lacks_blocks(json_t *j);
int pack_load_manifest(const char *dir, json_t **out, uint64_t *id, int64_t *version, char *err, size_t errlen);

#endif
