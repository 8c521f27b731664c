/*
 * wblk.h: a streamed matrix checked block by block by the threads that use it.
 *
 * Why: hashing every streamed trunk byte on the reader thread as it lands read it
 * from DRAM a second time, on a third thread beside two compute threads: ladder at
 * 1 GB decoded at x1.09-1.16 the time of --no-verify (issue 16's target is 5%).
 * A pack now carries the XXH3 of each run of rows of a layer's matrices (pack.h,
 * "blocks"). The source (wsrc_stream) does not hash those matrices when it streams
 * a unit; it hands them out with a wblk in their view (wt.vb). Whoever computes
 * rows [r0, r1) calls wblk_rows right after, which hashes the blocks starting
 * there while they are still in that core's cache, and the layer calls wblk_check
 * before anything it computed leaves the layer: the blocks nobody used are hashed
 * then, and a mismatch is an error naming the file and byte range, never output.
 *
 * Threads: wblk_rows runs on any pool thread (flags and counters are atomics);
 * wblk_reset is the source's, while no one holds the unit; wblk_check is the
 * layer's, after its products.
 */
#ifndef STRATA_WBLK_H
#define STRATA_WBLK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct wblk {
    const uint64_t *want;      /* n expected XXH3-64s (the pack's) */
    int64_t n, rows, R;        /* blocks, matrix rows, rows per block (the last block may be shorter) */
    uint64_t row_bytes;
    const uint8_t *p;          /* the matrix in this load (wblk_reset) */
    _Atomic uint8_t *done;     /* n flags: block hashed and equal since the load */
    _Atomic int64_t bad;       /* a block that did not match (-1: none) */
    _Atomic uint64_t bytes, ns; /* bytes hashed and the time it took (the run report) */
    const char *name, *path;   /* the tensor, the file it came from */
    uint64_t off;              /* its first byte in that file */
};
typedef struct wblk wblk;

/* Forgets every block's state: the matrix was read again, now at p. */
void wblk_reset(wblk *b, const uint8_t *p);
/* Hashes the blocks whose first row is in [r0, r1) and not yet checked. */
void wblk_rows(wblk *b, int64_t r0, int64_t r1);
/* Hashes the blocks not yet checked; 0, or STRATA_ECORRUPT with err naming
 * `what`, the tensor, the file and the byte range of the first bad block. */
int wblk_check(wblk *b, const char *what, char *err, size_t errlen);
/* XXH3_64bits_update(h, p, n) for bytes that are in DRAM, not in this core's
 * cache (a read that just landed): the same value, fed in WBLK_COLD_STEP pieces,
 * each after an L2 prefetch of the piece WBLK_COLD_AHEAD bytes further on. The
 * library's loop prefetches about 0.5 KB ahead, too close for memory latency on
 * one core: a landed 1.68 MB ladder expert hashed at 10.1-10.4 GB/s, and at
 * 13.1-14.7 with 1-4 KB pieces 4-32 KB ahead (best 2 KB / 8 KB; 16 KB pieces
 * gain nothing; Intel Xeon VM, 2 rounds of 300 experts). */
#define WBLK_COLD_STEP 2048
#define WBLK_COLD_AHEAD 8192
struct XXH3_state_s;
void wblk_hash_cold(struct XXH3_state_s *h, const void *p, size_t n);
/* The first row at or after r that starts a block (rows for r >= rows). */
static inline int64_t wblk_align(const wblk *b, int64_t r) {
    const int64_t a = (r + b->R - 1) / b->R * b->R;
    return a < b->rows ? a : b->rows;
}

#endif
