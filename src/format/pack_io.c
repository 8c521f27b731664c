/*
 * pack_io.c: the pack's streaming I/O: source reads (aligned chunks read ahead
 * with O_DIRECT through io.c, page-cache-resident ones pread in place) and the
 * write ring for trunk.bin (io_uring, O_DIRECT, preallocated), and the disk
 * write-bandwidth measurement built on it (pack.c explains the sizes).
 */

#define XXH_STATIC_LINKING_ONLY
#include "arch.h"
#include "pack.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>
#include "io.h"
#include "jsonx.h"
#include "pack_priv.h"
#include "vfs.h"

/* ============================================================= source reads */

static int src_resident(const sstream *s, int shard, uint64_t a0, uint64_t a1) {
    uint8_t *m = s->map ? s->map[shard] : NULL;
    if (!m) return 0;
    uint64_t size = s->files[shard].size;
    if (a1 > size) a1 = size;
    uint64_t p = a0 & ~(uint64_t)(s->page - 1);
    unsigned char vec[256];
    while (p < a1) {
        uint64_t n = a1 - p;
        if (n > sizeof vec * (uint64_t)s->page) n = sizeof vec * (uint64_t)s->page;
        if (mincore(m + p, n, vec)) return 0;
        for (uint64_t i = 0; i < (n + (uint64_t)s->page - 1) / (uint64_t)s->page; i++)
            if (!(vec[i] & 1)) return 0;
        p += n;
    }
    return 1;
}

/* Plans the next chunk and starts its read. Returns 1 when a chunk was queued, 0
 * when every extent is planned, -1 when the queue or the staging slots are full.
 * A chunk runs from the first unplanned byte on, through later extents of the
 * same shard that follow within SRC_GAP (one read, not one per tensor or expert),
 * up to `chunk` bytes. The consumer walks the same extents in the same order, so
 * chunk i holds exactly the bytes the planner gave it. */
static int src_plan(sstream *s) {
    if (s->qn == SQ_MAX) return -1;
    while (s->gx < s->nx) {
        const sext *e = &s->x[s->gx];
        uint64_t end = e->off + e->len;
        if (s->gp >= end) {
            if (++s->gx < s->nx) s->gp = s->x[s->gx].off;
            continue;
        }
        if (s->last_shard == e->shard && s->last_a0 <= s->gp && s->gp < s->last_a1) {
            s->gp = end < s->last_a1 ? end : s->last_a1; /* already in the last chunk */
            continue;
        }
        break;
    }
    if (s->gx == s->nx) return 0;
    const sext *e = &s->x[s->gx];
    uint64_t a0 = io_align_down(s->gp), stop = e->off + e->len;
    for (int64_t j = s->gx + 1; j < s->nx && stop - a0 < s->chunk; j++) {
        const sext *f = &s->x[j];
        if (f->shard != e->shard || f->off < stop || f->off - stop > SRC_GAP) break;
        stop = f->off + f->len;
    }
    uint64_t a1 = io_align_up(stop);
    if (a1 - a0 > s->chunk) a1 = a0 + s->chunk;
    int resident = s->mode == PACK_SRC_CACHED || (s->mode == 0 && src_resident(s, e->shard, a0, a1)) ||
                   (s->mode == (PACK_SRC_DIRECT | PACK_SRC_CACHED) && (s->n_planned & 1));
    if (!resident && !s->n_free) return -1;
    schunk *c = &s->q[(s->qh + s->qn++) % SQ_MAX];
    *c = (schunk){.shard = e->shard, .slot = -1, .a0 = a0, .a1 = a1};
    if (!resident) {
        const io_file *f = &s->files[e->shard];
        c->slot = s->slot_free[--s->n_free];
        c->q = (io_req){.f = f, .off = a0, .len = a1 - a0, .need = (a1 < f->size ? a1 : f->size) - a0,
                        .dst = s->slot[c->slot], .ud = c};
        io_submit(s->ring, &c->q);
    }
    s->n_planned++;
    s->last_shard = e->shard;
    s->last_a0 = a0;
    s->last_a1 = a1;
    s->gp = e->off + e->len < a1 ? e->off + e->len : a1;
    return 1;
}

static int src_wait(sstream *s, schunk *c) {
    while (c->slot >= 0 && !c->done) {
        io_req *d;
        if (io_reap(s->ring, 1, &d) != 1) return -1;
        ((schunk *)d->ud)->done = 1;
    }
    return 0;
}

static void src_pop(sstream *s) {
    schunk *c = &s->q[s->qh];
    src_wait(s, c); /* its piece was used, so the read is done; guards the slot anyway */
    if (c->slot >= 0) s->slot_free[s->n_free++] = c->slot;
    s->qh = (s->qh + 1) % SQ_MAX;
    s->qn--;
}

static int src_holds(const schunk *c, int shard, uint64_t p) { return c->shard == shard && c->a0 <= p && p < c->a1; }

/* The next piece of the current extent (see spiece); 1, 0 after the last extent,
 * or an error. Pieces never span two extents. */
int pack_src_next(sstream *s, spiece *pc, char *err, size_t errlen) {
    while (s->cx < s->nx && s->cp >= s->x[s->cx].off + s->x[s->cx].len)
        if (++s->cx < s->nx) s->cp = s->x[s->cx].off;
    if (s->cx == s->nx) return 0;
    const sext *e = &s->x[s->cx];
    while (s->qn && !src_holds(&s->q[s->qh], e->shard, s->cp)) src_pop(s); /* used up */
    while (src_plan(s) == 1) {} /* keep reads in flight */
    schunk *c = &s->q[s->qh];
    if (!s->qn || !src_holds(c, e->shard, s->cp))
        return base_fail(err, errlen, STRATA_EIO, "pack: internal error: read plan out of step at %s byte %llu",
                         s->files[e->shard].path, (unsigned long long)s->cp);
    if (src_wait(s, c)) return base_fail(err, errlen, STRATA_EIO, "pack: a read was lost");
    if (c->slot >= 0 && c->q.rc) {
        io_req_errstr(&c->q, err, errlen);
        return STRATA_EIO;
    }
    uint64_t end = e->off + e->len < c->a1 ? e->off + e->len : c->a1;
    *pc = (spiece){.p = c->slot >= 0 ? s->slot[c->slot] + (s->cp - c->a0) : NULL, .shard = e->shard, .off = s->cp,
                   .n = end - s->cp};
    if (c->slot >= 0) s->bytes_direct += pc->n; else s->bytes_cached += pc->n;
    s->cp = end;
    return 1;
}

/* Reads a resident piece (pc->p == NULL) into dst through the page cache. */
int pack_src_pread(const sstream *s, const spiece *pc, uint8_t *dst, char *err, size_t errlen) {
    const io_file *f = &s->files[pc->shard];
    for (uint64_t got = 0; got < pc->n;) {
        ssize_t r = vfs_pread(f->fd_buf, dst + got, pc->n - got, pc->off + got);
        if (r <= 0)
            return base_fail(err, errlen, STRATA_EIO, "%s: read at byte %llu: %s", f->path,
                             (unsigned long long)(pc->off + got), r < 0 ? strerror(errno) : "end of file");
        got += (uint64_t)r;
    }
    return STRATA_OK;
}

void pack_src_close(sstream *s) {
    io_ring_free(s->ring); /* waits for reads in flight before their slots go */
    for (int i = 0; i < SRC_SLOTS; i++) base_free(s->slot[i]);
    for (int i = 0; s->files && i < s->n_files; i++) {
        if (s->map && s->map[i]) munmap(s->map[i], s->files[i].size);
        io_file_close(&s->files[i]);
    }
    base_free(s->map);
    base_free(s->files);
    memset(s, 0, sizeof *s);
}

/* Opens files 0..n_files-1 (path(ctx, i) names file i, the `shard` of an extent)
 * for a pass over x[0..nx). mode: PACK_SRC_DIRECT, PACK_SRC_CACHED, both (every
 * other chunk, for tests) or 0: by page-cache residency, checked per chunk with
 * mincore on a read-only mapping that is never touched. */
int pack_src_open_files(sstream *s, int n_files, const char *(*path)(const void *ctx, int i), const void *ctx,
                          const sext *x, int64_t nx, int mode, uint64_t chunk, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->x = x;
    s->nx = nx;
    s->mode = mode;
    s->chunk = chunk;
    s->last_shard = -1;
    s->page = sysconf(_SC_PAGESIZE);
    if (s->page <= 0 || (s->page & (s->page - 1))) s->page = 4096;
    if (nx) { s->gp = x[0].off; s->cp = x[0].off; }
    s->n_files = n_files;
    s->files = base_calloc((size_t)s->n_files, sizeof *s->files, MEM_IO);
    s->map = base_calloc((size_t)s->n_files, sizeof *s->map, MEM_IO);
    if (!s->files || !s->map) { pack_src_close(s); return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); }
    for (int i = 0; i < s->n_files; i++) s->files[i].fd_direct = s->files[i].fd_buf = -1;
    int rc = STRATA_OK;
    for (int i = 0; i < s->n_files && !rc; i++) {
        rc = io_file_open(&s->files[i], path(ctx, i), err, errlen);
        if (!rc && mode == 0 && s->files[i].size) {
            void *m = mmap(NULL, s->files[i].size, PROT_READ, MAP_SHARED, s->files[i].fd_buf, 0);
            s->map[i] = m == MAP_FAILED ? NULL : m;
        }
    }
    for (int i = 0; i < SRC_SLOTS && !rc; i++) {
        if (!(s->slot[i] = base_alloc_aligned(chunk, IO_ALIGN, MEM_IO))) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
        s->slot_free[s->n_free++] = i;
    }
    if (!rc) rc = io_ring_create(&s->ring, SRC_SLOTS, chunk, 0, err, errlen);
    if (rc) pack_src_close(s);
    return rc;
}

static const char *shard_path(const void *ix, int i) { return st_shard_path(ix, i); }

/* Opens every shard of ix for a pass over x[0..nx) (see pack_src_open_files). */
int pack_src_open(sstream *s, const st_index *ix, const sext *x, int64_t nx, int mode, uint64_t chunk,
                    char *err, size_t errlen) {
    return pack_src_open_files(s, st_n_shards(ix), shard_path, ix, x, nx, mode, chunk, err, errlen);
}

/* ============================================================== write ring */

int pack_wring_init(wring *w, int fd, uint64_t bsz, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    w->fd = fd;
    w->nbuf = OUT_BUFS;
    w->bsz = bsz;
    for (int i = 0; i < w->nbuf; i++)
        if (!(w->buf[i] = base_alloc_aligned(bsz, IO_ALIGN, MEM_IO))) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    w->uring = io_uring_queue_init((unsigned)w->nbuf, &w->ring, 0) == 0;
    return STRATA_OK;
}

static void wring_done(wring *w, int i, int res) {
    if (res == -EINTR || res == -EAGAIN) { /* rare: retry synchronously */
        ssize_t k = vfs_pwrite(w->fd, w->buf[i], w->len[i], w->boff[i]);
        res = k < 0 ? -errno : (int)k;
    }
    if (res >= 0 && (uint64_t)res < w->len[i]) {
        /* short (a signal, or the disk filling up): write the rest here; what
         * stops that is the real reason */
        int e = vfs_pwrite_full(w->fd, w->buf[i] + res, w->len[i] - (uint64_t)res, w->boff[i] + (uint64_t)res);
        res = e ? -e : (int)w->len[i];
    }
    if (res < 0 && !w->rc) { w->rc = STRATA_EIO; w->err_no = -res; }
    w->busy[i] = 0;
    w->inflight--;
}

static void wring_reap(wring *w) {
    struct io_uring_cqe *cqe;
    int r;
    while ((r = io_uring_wait_cqe(&w->ring, &cqe)) == -EINTR) {}
    if (r < 0) { /* cannot happen with writes in flight; do not spin */
        if (!w->rc) { w->rc = STRATA_EIO; w->err_no = -r; }
        for (int i = 0; i < w->nbuf; i++) if (w->busy[i]) { w->busy[i] = 0; w->inflight--; }
        return;
    }
    int i = (int)(uintptr_t)io_uring_cqe_get_data(cqe), res = vfs_cqe(cqe->res, w->len[i], 1);
    io_uring_cqe_seen(&w->ring, cqe);
    wring_done(w, i, res);
}

/* Queues len bytes (a multiple of IO_ALIGN for O_DIRECT) of the current buffer and
 * returns once the next one is free; a failed write surfaces here or at drain. */
int pack_wring_put(wring *w, uint64_t len) {
    int i = w->cur;
    w->len[i] = len;
    w->boff[i] = w->off;
    w->off += len;
    w->busy[i] = 1;
    w->inflight++;
    struct io_uring_sqe *sqe = w->uring ? io_uring_get_sqe(&w->ring) : NULL;
    if (sqe) {
        io_uring_prep_write(sqe, w->fd, w->buf[i], (unsigned)len, w->boff[i]);
        io_uring_sqe_set_data(sqe, (void *)(uintptr_t)i);
        io_uring_submit(&w->ring);
    } else {
        uint64_t done = 0;
        int e = 0;
        while (done < len) {
            ssize_t k = vfs_pwrite(w->fd, w->buf[i] + done, len - done, w->boff[i] + done);
            if (k <= 0) { e = k < 0 ? errno : ENOSPC; break; }
            done += (uint64_t)k;
        }
        wring_done(w, i, e ? -e : (int)len);
    }
    w->cur = (w->cur + 1) % w->nbuf;
    while (w->busy[w->cur]) wring_reap(w);
    return w->rc;
}

int pack_wring_drain(wring *w) {
    while (w->inflight) wring_reap(w);
    return w->rc;
}

void pack_wring_free(wring *w) {
    if (w->uring) { pack_wring_drain(w); io_uring_queue_exit(&w->ring); }
    for (int i = 0; i < OUT_BUFS; i++) base_free(w->buf[i]);
    memset(w, 0, sizeof *w);
}

/* Opens path for sequential writes of `bytes`: O_DIRECT when the filesystem allows
 * it, preallocated (ext4 serialises O_DIRECT writes past EOF, and a full disk fails
 * here rather than half way). tmpfile: an unnamed file in the directory path. */
int pack_wfile_open(const char *path, int tmpfile, uint64_t bytes, char *err, size_t errlen) {
    int base = O_WRONLY | O_CLOEXEC | (tmpfile ? O_TMPFILE : O_CREAT | O_TRUNC);
    int fd = vfs_open(path, base | O_DIRECT, 0644);
    if (fd < 0) fd = vfs_open(path, base, 0644);
    if (fd < 0) return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno));
    if (bytes && vfs_fallocate(fd, bytes) && errno == ENOSPC) {
        close(fd);
        return base_fail(err, errlen, STRATA_EIO, "%s: no space left on the device for %llu bytes", path,
                         (unsigned long long)bytes);
    }
    return fd;
}

/* ========================================================= write bandwidth */

double pack_measure_write_bw(const char *dir, uint64_t bytes) {
    struct statvfs sv;
    if (statvfs(dir, &sv) == 0 && bytes > (uint64_t)sv.f_bavail * sv.f_frsize / 4)
        bytes = (uint64_t)sv.f_bavail * sv.f_frsize / 4; /* never crowd a nearly full disk */
    bytes -= bytes % OUT_BYTES;
    if (bytes < 4ull * OUT_BYTES) return 0;
    wring w;
    double bw = 0;
    if (pack_wring_init(&w, -1, OUT_BYTES, NULL, 0)) { pack_wring_free(&w); return 0; }
    /* not zeros: a virtual disk may skip or compress zero blocks */
    uint64_t z = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < w.nbuf; i++)
        for (uint64_t k = 0; k < w.bsz / 8; k++) {
            z ^= z << 13; z ^= z >> 7; z ^= z << 17;
            memcpy(w.buf[i] + 8 * k, &z, 8);
        }
    /* timed like pack_write_trunk: open, preallocate, write, fsync */
    double t0 = base_now();
    int fd = pack_wfile_open(dir, 1, bytes, NULL, 0);
    if (fd < 0) { /* no O_TMPFILE here: a named file, unlinked at once */
        char path[2048];
        snprintf(path, sizeof path, "%s/.strata-bw.%d", dir, (int)getpid());
        fd = pack_wfile_open(path, 0, bytes, NULL, 0);
        unlink(path);
    }
    if (fd >= 0) {
        w.fd = fd;
        int rc = 0;
        for (uint64_t o = 0; o < bytes && !rc; o += w.bsz) rc = pack_wring_put(&w, w.bsz);
        if (!pack_wring_drain(&w) && !rc && !vfs_fsync(fd)) bw = (double)bytes / (base_now() - t0);
    }
    pack_wring_free(&w);
    if (fd >= 0) close(fd);
    return bw;
}
