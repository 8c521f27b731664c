/*
 * io.h: aligned reads of byte ranges, many in flight.
 *
 * io.c never interprets bytes; it moves [off, off+len) of a file into memory.
 * Files are opened twice: O_DIRECT (streamed data is read once per use and must
 * not fill the page cache, which would also count against a cgroup budget) and
 * buffered (fallback when the filesystem refuses O_DIRECT, and for unaligned
 * requests). A ring is one thread's queue: io_uring when the kernel allows it,
 * else synchronous pread at submit time. Rings are never shared between threads.
 *
 * Requests are split into chunks of at most IO_CHUNK bytes submitted up to the
 * ring's depth; short reads are resubmitted; a read that reaches end of file after
 * `need` bytes is complete (the aligned tail of a file's last record may extend
 * past EOF).
 */
#ifndef STRATA_IO_H
#define STRATA_IO_H

#include <stddef.h>
#include <stdint.h>

#define IO_ALIGN 4096u
/* bench-io, 256 MB trunk-like runs on this disk (loaded): 4 MiB chunks at depth 32
 * 1.44 GB/s, the best of 1/4/8 MiB x 8/16/32 (1 MiB: 1.18, 8 MiB: 0.54-0.87). */
#define IO_CHUNK (4u << 20)
#define IO_DEPTH 32u

static inline uint64_t io_align_down(uint64_t x) { return x & ~(uint64_t)(IO_ALIGN - 1); }
static inline uint64_t io_align_up(uint64_t x) { return (x + IO_ALIGN - 1) & ~(uint64_t)(IO_ALIGN - 1); }

typedef struct io_file {
    int fd_direct;   /* -1 if O_DIRECT was refused */
    int fd_buf;
    uint64_t size;
    char path[1024];
} io_file;

int io_file_open(io_file *f, const char *path, char *err, size_t errlen);
void io_file_close(io_file *f); /* accepts a zeroed/closed file */

/* Advises transparent huge pages for a large read buffer allocated once (expert
 * cache slots, the trunk arena). An O_DIRECT read into untouched memory faults and
 * zeroes its pages inside the submitting thread; with 2 MiB pages that is one
 * fault per 2 MiB instead of 512. */
void io_buffer_advise(void *p, uint64_t bytes);
/* Faults in the pages of [p, p + bytes) without writing them (MADV_POPULATE_WRITE;
 * a no-op where the kernel lacks it), so it may run while reads land in the same
 * buffer. Returns 0, or -1 if nothing was done. */
int io_buffer_populate(void *p, uint64_t bytes);

typedef struct io_ring io_ring;

/* depth: reads in flight (0 = IO_DEPTH); chunk: bytes per read (0 = IO_CHUNK,
 * multiple of IO_ALIGN); no_uring: force the pread path. */
int io_ring_create(io_ring **out, unsigned depth, uint64_t chunk, int no_uring, char *err, size_t errlen);
void io_ring_free(io_ring *r); /* waits for reads in flight; accepts NULL */
int io_ring_uring(const io_ring *r); /* 1 if io_uring is in use */

typedef struct io_req {
    /* set by the caller */
    const io_file *f;
    uint64_t off, len;  /* file range; direct path when off, len, dst are IO_ALIGN-aligned */
    uint64_t need;      /* bytes that must exist (<= len); 0 = len */
    uint8_t *dst;
    void *ud;
    /* owned by io.c while in flight */
    uint64_t sub;       /* bytes submitted */
    uint64_t got;       /* bytes landed */
    int n_out;          /* chunks in flight */
    int eof;            /* a chunk hit end of file */
    int rc;             /* STRATA_OK or error once complete */
    int err_no;
    struct io_req *next;
} io_req;

/* Queues q (its fields from `sub` on are reset). Never blocks on reads of other
 * requests except to free ring slots. */
int io_submit(io_ring *r, io_req *q);
/* Completes one request: returns 1 and sets *done, 0 if nothing is outstanding
 * (or, with wait == 0, nothing landed yet). A failed read is reported through
 * (*done)->rc, never lost. */
int io_reap(io_ring *r, int wait, io_req **done);
/* Requests submitted and not yet returned by io_reap. */
int io_pending(const io_ring *r);
/* Formats a completed request's failure ("path: short read at byte X (need Y)"). */
void io_req_errstr(const io_req *q, char *err, size_t errlen);

/* Synchronous read of an arbitrary range [off, off+n) into dst (any alignment):
 * reads the enclosing aligned range into bounce (>= io_align_up(n) + 2*IO_ALIGN
 * bytes, IO_ALIGN-aligned) and copies. bounce == NULL: buffered pread. */
int io_read_at(io_ring *r, const io_file *f, uint64_t off, uint64_t n, void *dst, uint8_t *bounce,
               char *err, size_t errlen);

/* Time accounting: seconds during which this ring had at least one read in flight,
 * bytes landed and reads issued. */
typedef struct io_counters { double busy_s; uint64_t bytes, reads; } io_counters;
void io_ring_counters(const io_ring *r, io_counters *c);

#endif
