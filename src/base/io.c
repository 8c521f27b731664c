/*
 * io.c: aligned reads with many in flight (see io.h).
 *
 * One io_uring per ring; each request is cut into chunks of at most r->chunk bytes
 * and up to r->depth chunks are in the kernel at once. A chunk descriptor pool of
 * `depth` entries carries (request, offset) through user_data, so no allocation
 * happens after io_ring_create. When io_uring is unavailable (seccomp, old kernel)
 * or refused, reads run synchronously at submit time with pread: correct, QD1.
 *
 * Why chunking: one 2 GB O_DIRECT read is a single request the device serves
 * serially; 4 MiB chunks at depth 32 keep the queue full and let completions
 * overlap the caller's work (bench-io measures chunk x depth on this disk).
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "base.h"
#include "vfs.h"

/* madvise wants page-aligned ranges in the kernel's page size, which on arm64 may
 * be 16 or 64 KiB (IO_ALIGN is the O_DIRECT unit, not a page). */
static uintptr_t page_bytes(void) {
    long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 && !(pg & (pg - 1)) ? (uintptr_t)pg : IO_ALIGN;
}

void io_buffer_advise(void *p, uint64_t bytes) {
#ifdef MADV_HUGEPAGE
    const uintptr_t m = page_bytes() - 1, b = (uintptr_t)p, e = b + bytes;
    const uintptr_t pb = (b + m) & ~m, pe = e & ~m; /* whole pages inside the buffer */
    if (pe > pb) madvise((void *)pb, (size_t)(pe - pb), MADV_HUGEPAGE); /* a hint: failure is harmless */
#else
    (void)p; (void)bytes;
#endif
}

int io_buffer_populate(void *p, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
    /* outward: the pages holding the first and last byte are mapped, and populating
     * writes no data */
    const uintptr_t m = page_bytes() - 1, b = (uintptr_t)p & ~m, e = ((uintptr_t)p + bytes + m) & ~m;
    return e > b && madvise((void *)b, (size_t)(e - b), MADV_POPULATE_WRITE) == 0 ? 0 : -1;
#else
    (void)p; (void)bytes;
    return -1;
#endif
}

int io_file_open(io_file *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    f->fd_direct = f->fd_buf = -1;
    snprintf(f->path, sizeof f->path, "%s", path);
    f->fd_buf = vfs_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (f->fd_buf < 0) return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(f->fd_buf, &sb)) {
        int e = errno;
        close(f->fd_buf);
        f->fd_buf = -1;
        return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(e));
    }
    f->size = (uint64_t)sb.st_size;
    /* tmpfs and some overlay filesystems refuse O_DIRECT: buffered reads then. */
    f->fd_direct = vfs_open(path, O_RDONLY | O_CLOEXEC | O_DIRECT, 0);
    return STRATA_OK;
}

void io_file_close(io_file *f) {
    if (f->fd_direct >= 0) close(f->fd_direct);
    if (f->fd_buf > 0) close(f->fd_buf);
    f->fd_direct = f->fd_buf = -1;
}

typedef struct chunk {
    io_req *q;
    uint64_t rel;   /* offset in the request */
    uint64_t len;
    struct chunk *next_free;
} chunk;

struct io_ring {
    int uring;
    struct io_uring ring;
    unsigned depth;
    uint64_t chunk_bytes;
    chunk *chunks;          /* depth descriptors */
    chunk *free_chunks;
    unsigned inflight;      /* chunks in the kernel */
    io_req *sq_head, *sq_tail;   /* requests with bytes not yet submitted */
    io_req *done_head, *done_tail;
    int pending;            /* submitted and not yet reaped */
    double busy_since, busy_s;
    uint64_t bytes, reads;
};

int io_ring_create(io_ring **out, unsigned depth, uint64_t chunk_bytes, int no_uring, char *err, size_t errlen) {
    *out = NULL;
    io_ring *r = base_calloc(1, sizeof *r, MEM_IO);
    if (!r) return base_fail(err, errlen, STRATA_ENOMEM, "io: out of memory");
    r->depth = depth ? depth : IO_DEPTH;
    r->chunk_bytes = chunk_bytes ? io_align_up(chunk_bytes) : IO_CHUNK;
    r->chunks = base_calloc(r->depth, sizeof *r->chunks, MEM_IO);
    if (!r->chunks) { base_free(r); return base_fail(err, errlen, STRATA_ENOMEM, "io: out of memory"); }
    for (unsigned i = 0; i < r->depth; i++) {
        r->chunks[i].next_free = r->free_chunks;
        r->free_chunks = &r->chunks[i];
    }
    if (!no_uring && io_uring_queue_init(r->depth, &r->ring, 0) == 0) r->uring = 1;
    *out = r;
    return STRATA_OK;
}

int io_ring_uring(const io_ring *r) { return r->uring; }

void io_ring_counters(const io_ring *r, io_counters *c) {
    c->busy_s = r->busy_s + (r->inflight ? base_now() - r->busy_since : 0);
    c->bytes = r->bytes;
    c->reads = r->reads;
}

static int req_direct(const io_req *q, uint64_t rel, uint64_t n) {
    return q->f->fd_direct >= 0 && ((q->off + rel) % IO_ALIGN) == 0 && (n % IO_ALIGN) == 0 &&
           ((uintptr_t)(q->dst + rel) % IO_ALIGN) == 0;
}

static void done_push(io_ring *r, io_req *q) {
    q->next = NULL;
    if (r->done_tail) r->done_tail->next = q; else r->done_head = q;
    r->done_tail = q;
}

/* Synchronous path: pread loop, direct when aligned. */
static void read_sync(io_ring *r, io_req *q) {
    uint64_t rel = 0;
    double t0 = base_now();
    while (rel < q->len) {
        uint64_t n = q->len - rel;
        if (n > r->chunk_bytes) n = r->chunk_bytes;
        int direct = req_direct(q, rel, n);
        ssize_t got = vfs_pread(direct ? q->f->fd_direct : q->f->fd_buf, q->dst + rel, n, q->off + rel);
        if (got < 0) { q->rc = STRATA_EIO; q->err_no = errno; break; }
        if (got == 0) { q->eof = 1; break; }
        rel += (uint64_t)got;
        r->reads++;
    }
    q->got = rel;
    r->bytes += rel;
    r->busy_s += base_now() - t0;
    if (q->rc == STRATA_OK && q->got < q->need) q->rc = STRATA_EIO;
}

/* Moves chunks of queued requests into the kernel while descriptors remain. */
static void pump(io_ring *r) {
    int added = 0;
    while (r->sq_head && r->free_chunks) {
        io_req *q = r->sq_head;
        if (q->sub >= q->len || q->eof || q->rc) { /* nothing more to submit */
            r->sq_head = q->next;
            if (!r->sq_head) r->sq_tail = NULL;
            q->next = NULL;
            if (q->n_out == 0) { /* possible when a resubmission was not needed */
                if (q->rc == STRATA_OK && q->got < q->need) q->rc = STRATA_EIO;
                done_push(r, q);
            }
            continue;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
        if (!sqe) break;
        chunk *ch = r->free_chunks;
        r->free_chunks = ch->next_free;
        ch->q = q;
        ch->rel = q->sub;
        ch->len = q->len - q->sub < r->chunk_bytes ? q->len - q->sub : r->chunk_bytes;
        int direct = req_direct(q, ch->rel, ch->len);
        io_uring_prep_read(sqe, direct ? q->f->fd_direct : q->f->fd_buf, q->dst + ch->rel,
                           (unsigned)ch->len, q->off + ch->rel);
        io_uring_sqe_set_data(sqe, ch);
        /* Direct reads run in io_uring's workers, not inline in io_uring_enter: the
         * first read into a buffer faults and zeroes its pages (GUP), which then
         * happens beside the submitter's compute. Ladder resident rung, expert
         * misses into fresh cache slots: prefill 0.53-1.03 -> 0.30-0.38 s/token. */
        if (direct) io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
        q->sub += ch->len;
        q->n_out++;
        if (r->inflight++ == 0) r->busy_since = base_now();
        r->reads++;
        added++;
    }
    if (added || io_uring_sq_ready(&r->ring)) io_uring_submit(&r->ring);
}

/* One completion: account, resubmit a short read's rest, finish the request. */
static void complete(io_ring *r, chunk *ch, int res) {
    io_req *q = ch->q;
    if (--r->inflight == 0) r->busy_s += base_now() - r->busy_since;
    q->n_out--;
    if (res < 0) {
        if (!q->rc) { q->rc = STRATA_EIO; q->err_no = -res; }
    } else if (res == 0) {
        q->eof = 1;
    } else {
        q->got += (uint64_t)res;
        r->bytes += (uint64_t)res;
        if ((uint64_t)res < ch->len && !q->eof && !q->rc) {
            /* Short read (rare: signals, end of file): later chunks may already be in
             * flight, so the rest of this chunk is read synchronously. */
            uint64_t rel = ch->rel + (uint64_t)res, end = ch->rel + ch->len;
            while (rel < end) {
                int direct = req_direct(q, rel, end - rel);
                ssize_t g = vfs_pread(direct ? q->f->fd_direct : q->f->fd_buf, q->dst + rel, end - rel, q->off + rel);
                if (g < 0) { q->rc = STRATA_EIO; q->err_no = errno; break; }
                if (g == 0) { q->eof = 1; break; }
                rel += (uint64_t)g;
                q->got += (uint64_t)g;
                r->bytes += (uint64_t)g;
            }
        }
    }
    ch->next_free = r->free_chunks;
    r->free_chunks = ch;
    if (q->n_out == 0 && (q->sub >= q->len || q->eof || q->rc)) {
        /* Remove from the submit queue if it is still there (eof/rc cut it short). */
        if (r->sq_head == q) {
            r->sq_head = q->next;
            if (!r->sq_head) r->sq_tail = NULL;
        }
        if (q->rc == STRATA_OK && q->got < q->need) q->rc = STRATA_EIO;
        done_push(r, q);
    }
}

int io_submit(io_ring *r, io_req *q) {
    q->sub = q->got = 0;
    q->n_out = q->eof = q->rc = q->err_no = 0;
    q->next = NULL;
    if (!q->need || q->need > q->len) q->need = q->len;
    r->pending++;
    if (!r->uring || q->len == 0) {
        if (q->len) read_sync(r, q);
        done_push(r, q);
        return STRATA_OK;
    }
    if (r->sq_tail) r->sq_tail->next = q; else r->sq_head = q;
    r->sq_tail = q;
    pump(r);
    return STRATA_OK;
}

int io_pending(const io_ring *r) { return r->pending; }

int io_reap(io_ring *r, int wait, io_req **done) {
    *done = NULL;
    for (;;) {
        if (r->done_head) {
            io_req *q = r->done_head;
            r->done_head = q->next;
            if (!r->done_head) r->done_tail = NULL;
            q->next = NULL;
            r->pending--;
            *done = q;
            return 1;
        }
        if (r->pending == 0 || !r->uring) return 0;
        pump(r);
        if (r->inflight == 0) {
            if (r->done_head) continue;
            return 0; /* not reachable with consistent counters */
        }
        struct io_uring_cqe *cqe = NULL;
        int rc = wait ? io_uring_wait_cqe(&r->ring, &cqe) : io_uring_peek_cqe(&r->ring, &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0 || !cqe) {
            if (!wait) return 0;
            continue;
        }
        chunk *ch = io_uring_cqe_get_data(cqe);
        int res = vfs_cqe(cqe->res, ch->len, 0);
        io_uring_cqe_seen(&r->ring, cqe);
        if (res == -EINTR || res == -EAGAIN) {
            /* Retry the whole chunk: put the request back at the front with `sub`
             * rewound is wrong when later chunks are out; read synchronously. */
            io_req *q = ch->q;
            ssize_t g = vfs_pread(q->f->fd_buf, q->dst + ch->rel, ch->len, q->off + ch->rel);
            res = g < 0 ? -errno : (int)g;
        }
        complete(r, ch, res);
        pump(r);
    }
}

void io_req_errstr(const io_req *q, char *err, size_t errlen) {
    if (q->err_no)
        base_fail(err, errlen, STRATA_EIO, "%s: read of %llu bytes at %llu failed: %s", q->f->path,
                  (unsigned long long)q->len, (unsigned long long)q->off, strerror(q->err_no));
    else
        base_fail(err, errlen, STRATA_EIO, "%s: short read at byte %llu (file is %llu bytes, need %llu bytes from %llu)",
                  q->f->path, (unsigned long long)(q->off + q->got), (unsigned long long)q->f->size,
                  (unsigned long long)q->need, (unsigned long long)q->off);
}

void io_ring_free(io_ring *r) {
    if (!r) return;
    io_req *q;
    while (io_pending(r) && io_reap(r, 1, &q) == 1) {}
    if (r->uring) io_uring_queue_exit(&r->ring);
    base_free(r->chunks);
    base_free(r);
}

int io_read_at(io_ring *r, const io_file *f, uint64_t off, uint64_t n, void *dst, uint8_t *bounce,
               char *err, size_t errlen) {
    if (n == 0) return STRATA_OK;
    if (!bounce || f->fd_direct < 0) {
        uint64_t done = 0;
        while (done < n) {
            ssize_t g = vfs_pread(f->fd_buf, (uint8_t *)dst + done, n - done, off + done);
            if (g <= 0)
                return base_fail(err, errlen, STRATA_EIO, "%s: read of %llu bytes at %llu failed: %s", f->path,
                                 (unsigned long long)n, (unsigned long long)off, g < 0 ? strerror(errno) : "end of file");
            done += (uint64_t)g;
        }
        return STRATA_OK;
    }
    uint64_t a0 = io_align_down(off), a1 = io_align_up(off + n);
    io_req q = {.f = f, .off = a0, .len = a1 - a0, .need = off + n - a0, .dst = bounce};
    io_submit(r, &q);
    io_req *d;
    /* Drain until our request is back; other requests on this ring are not
     * expected here (synchronous helper), but are kept in order if present. */
    while (io_reap(r, 1, &d) == 1 && d != &q) {}
    if (q.rc) { io_req_errstr(&q, err, errlen); return q.rc; }
    memcpy(dst, bounce + (off - a0), n);
    return STRATA_OK;
}
