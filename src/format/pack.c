/*
 * pack.c: writes, loads and verifies the streaming layout (see pack.h).
 *
 * Writing is one thread driving two asynchronous queues. Source bytes come in
 * aligned chunks of up to 4 MiB, SRC_SLOTS of them read ahead with O_DIRECT
 * through io.c; a chunk whose pages are all in the page cache (mincore) is not
 * read ahead but pread straight into the output buffer when its turn comes, so a
 * warm source costs no disk time. The thread copies each piece into the current
 * 4 MiB output buffer and hashes it there, while up to OUT_BUFS - 1 earlier
 * buffers are being written to trunk.bin.tmp (io_uring, O_DIRECT, preallocated).
 * Expert checksums stream through the same chunked reads. Memory: SRC_SLOTS +
 * OUT_BUFS buffers (48 MiB) whatever the model's size.
 *
 * One thread is enough: pread from the page cache plus XXH3 run at 4.5-5.2 GB/s
 * on one core here, against ~2 GB/s of disk. Hashing on a second thread measured
 * no faster (warm 2.4 GB trunk, loaded machine, medians 1.30 vs 1.19 GB/s). A cold
 * source is read from the same disk the trunk goes to, and reads and writes share
 * its bandwidth: such a copy runs at 1 / (1/read + 1/write), not at write speed.
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
#include "vfs.h"

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

/* ===================================================================== views */

wt pack_view(const void *p, int dtype, int ndim, const int64_t *shape, int role) {
    wt w = {.p = p, .dtype = dtype, .rows = 1, .cols = 0};
    if (ndim <= 1) {
        w.cols = ndim == 1 ? shape[0] : 1;
    } else if (ndim == 2) {
        w.rows = shape[0];
        w.cols = shape[1];
        /* MXFP4 packed codes: cols is the logical input width (model.h) */
        if (role == R_EXP_W1P || role == R_EXP_W2P || role == R_EXP_W3P) w.cols *= 2;
    } else {
        w.rows = shape[0];
        w.cols = shape[1] * shape[2];
    }
    return w;
}

/* ================================================================== identity */

static int hash_file(XXH3_state_t *st, const char *path, int required, char *err, size_t errlen) {
    uint8_t *buf;
    size_t len;
    if (!base_is_file(path)) {
        if (required) return base_fail(err, errlen, STRATA_EIO, "%s: missing", path);
        return STRATA_OK;
    }
    int rc = base_read_file(path, 1u << 30, &buf, &len, err, errlen);
    if (rc) return rc;
    XXH3_64bits_update(st, buf, len);
    base_free(buf);
    return STRATA_OK;
}

int pack_model_id(const char *model_dir, const st_index *ix, uint64_t *id, char *err, size_t errlen) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    int rc = hash_file(&st, path, 1, err, errlen);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", model_dir);
    if ((rc = hash_file(&st, path, 0, err, errlen))) return rc;
    for (int s = 0; s < st_n_shards(ix); s++) {
        const char *sp = st_shard_path(ix, s);
        const char *base = strrchr(sp, '/');
        base = base ? base + 1 : sp;
        uint64_t size = st_shard_size(ix, s);
        XXH3_64bits_update(&st, base, strlen(base) + 1);
        XXH3_64bits_update(&st, &size, sizeof size);
        int fd = st_shard_fd(ix, s);
        uint8_t len8[8];
        int e = vfs_pread_full(fd, len8, 8, 0);
        if (e) return base_fail(err, errlen, STRATA_EIO, "%s: cannot read the header: %s", sp, e > 0 ? strerror(e) : "end of file");
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
        if (n > ST_MAX_HEADER || n + 8 > size) return base_fail(err, errlen, STRATA_EFORMAT, "%s: bad header length", sp);
        uint8_t *h = base_alloc(n + 8, MEM_IO);
        if (!h) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
        if ((e = vfs_pread_full(fd, h, n + 8, 0))) {
            base_free(h);
            return base_fail(err, errlen, STRATA_EIO, "%s: cannot read the header: %s", sp, e > 0 ? strerror(e) : "end of file");
        }
        XXH3_64bits_update(&st, h, n + 8);
        base_free(h);
    }
    *id = XXH3_64bits_digest(&st);
    return STRATA_OK;
}

/* The manifest's hashes are exactly 16 hex digits (as written): anything else,
 * which strtoull read as 0 or as a prefix, is a malformed manifest. */
static int hex64(const char *h, uint64_t *out) {
    if (!h || strlen(h) != 16) return -1;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        int c = h[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

static const char *base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

/* Size and modification time of every shard: the part of the pack's identity that
 * covers tensor data at the cost of a stat (the model id covers only the
 * headers). Hashing the data on every run would read the whole model. */
static json_t *stamps_json(const st_index *ix, char *err, size_t errlen) {
    json_t *a = json_array();
    for (int s = 0; s < st_n_shards(ix); s++) {
        struct stat sb;
        if (stat(st_shard_path(ix, s), &sb)) {
            base_fail(err, errlen, STRATA_EIO, "%s: %s", st_shard_path(ix, s), strerror(errno));
            json_decref(a);
            return NULL;
        }
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(base_name(st_shard_path(ix, s))));
        json_object_set_new(o, "size", json_integer((json_int_t)sb.st_size));
        json_object_set_new(o, "mtime_ns", json_integer((json_int_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec));
        json_array_append_new(a, o);
    }
    return a;
}

/* 0: every shard has the size and modification time recorded at packing; 1: stale,
 * why says which shard changed and how. */
static int stamps_stale(const json_t *rec, const st_index *ix, char *why, size_t n) {
    if (!json_is_array(rec) || (int)json_array_size(rec) != st_n_shards(ix)) {
        snprintf(why, n, "the manifest does not list the model's %d shards", st_n_shards(ix));
        return 1;
    }
    for (int s = 0; s < st_n_shards(ix); s++) {
        const json_t *o = json_array_get(rec, (size_t)s);
        const char *name = json_string_value(json_object_get(o, "name"));
        int64_t size, mt;
        struct stat sb;
        const char *path = st_shard_path(ix, s);
        if (!name || strcmp(name, base_name(path)) || jsonx_int(json_object_get(o, "size"), &size) ||
            jsonx_int(json_object_get(o, "mtime_ns"), &mt)) {
            snprintf(why, n, "the manifest's shard %d is not %s", s, base_name(path));
            return 1;
        }
        if (stat(path, &sb)) { snprintf(why, n, "%s: %s", path, strerror(errno)); return 1; }
        int64_t now = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        if ((int64_t)sb.st_size != size) {
            snprintf(why, n, "%s changed size after packing (%lld bytes, packed %lld)", path, (long long)sb.st_size, (long long)size);
            return 1;
        }
        if (now != mt) {
            snprintf(why, n, "%s was modified after packing (mtime %+.3f s from the packed one)", path, (double)(now - mt) / 1e9);
            return 1;
        }
    }
    return 0;
}

/* ============================================================ finding a pack */

static void pointer_path(const char *model_dir, char *out, size_t n) {
    char real[4096];
    if (!realpath(model_dir, real)) snprintf(real, sizeof real, "%s", model_dir);
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[2048];
    if (xdg && *xdg) snprintf(base, sizeof base, "%s/strata/packs", xdg);
    else snprintf(base, sizeof base, "%s/.cache/strata/packs", home && *home ? home : "/tmp");
    snprintf(out, n, "%s/%016llx", base, (unsigned long long)XXH3_64bits(real, strlen(real)));
}

int pack_find_ex(const char *model_dir, char *out, size_t n, char *why, size_t whylen) {
    char path[4200], dir[4096];
    struct stat sb;
    if (why && whylen) why[0] = 0;
    snprintf(dir, sizeof dir, "%s/%s", model_dir, PACK_DIRNAME);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (base_is_file(path)) {
        snprintf(out, n, "%s", dir);
        return 1;
    }
    /* the model's own pack directory without a usable manifest: an interrupted
     * `strata pack` (the manifest is written last), a removed manifest, or a
     * directory this user cannot read. Never silently the unverified shards. */
    if (!lstat(dir, &sb)) {
        int e = stat(path, &sb) ? errno : 0;
        if (why && whylen)
            snprintf(why, whylen, "%s %s (%s); run strata pack", dir,
                     e == ENOENT ? "holds no manifest.json" : e ? "is unreadable" : "holds a manifest.json that is not a regular file",
                     e == ENOENT ? "an interrupted or removed pack" : e ? strerror(e) : "refused");
        return -1;
    }
    char ptr[4096];
    pointer_path(model_dir, ptr, sizeof ptr);
    if (!base_is_file(ptr)) return 0; /* no pointer (or not a regular file: never opened, a FIFO would block) */
    uint8_t *buf;
    size_t len;
    char e2[512];
    if (base_read_file(ptr, 4096, &buf, &len, e2, sizeof e2)) {
        if (why && whylen) snprintf(why, whylen, "the pack pointer %s is unreadable: %s", ptr, e2);
        return -1;
    }
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' ')) buf[--len] = 0;
    snprintf(path, sizeof path, "%s/manifest.json", (char *)buf);
    int ok = base_is_file(path);
    if (ok) snprintf(out, n, "%s", (char *)buf);
    else if (why && whylen)
        snprintf(why, whylen, "the pack pointer %s names %s, which holds no readable manifest.json (%s); run strata pack again "
                 "or remove the pointer", ptr, (char *)buf, stat(path, &sb) ? strerror(errno) : "not a regular file");
    base_free(buf);
    return ok ? 1 : -1;
}

int pack_find(const char *model_dir, char *out, size_t n) { return pack_find_ex(model_dir, out, n, NULL, 0) == 1; }

/* ==================================================================== layout */

typedef struct lt {            /* one tensor while laying out */
    const st_tensor *src;
    int role;
    uint64_t off;              /* relative to the region */
    uint64_t xxh3;             /* of its bytes (write_trunk) */
    int64_t blk_rows, n_blk;   /* row blocks with their own hashes (pack_block_rows; 0: none) */
    uint64_t *blk;             /* their XXH3s (write_trunk) */
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

typedef struct collect {
    const cfg *c;
    const st_index *ix;
    lregion *r;
    int cap;
    int cls_mask;              /* for the head: which classes to take */
    sbuf *missing;
} collect;

static int collect_fn(void *ud, const tspec *t) {
    collect *c = ud;
    if (c->cls_mask && !((1 << t->cls) & c->cls_mask)) return 0;
    const st_tensor *s = st_find(c->ix, t->name);
    /* tensors the config switches off may be absent (as in wsrc_resident) */
    if (!s && ((t->role == R_MLA_G && !c->c->mla_out_gate) || (t->role == R_MOE_LAT_NORM && !c->c->latent_norm))) return 0;
    if (!s) { sbuf_line(c->missing, "tensor %s is missing", t->name); return 0; }
    if (c->r->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 32;
        lt *nt = base_realloc(c->r->t, (size_t)cap * sizeof *nt, MEM_INDEX);
        if (!nt) return STRATA_ENOMEM;
        c->r->t = nt;
        c->cap = cap;
    }
    c->r->t[c->r->n++] = (lt){.src = s, .role = t->role};
    return 0;
}

static void layout_free(layout *l) {
    base_free(l->embed.t);
    if (l->units)
        for (int64_t u = 0; u < l->n_units; u++) {
            for (int i = 0; i < l->units[u].n; i++) base_free(l->units[u].t[i].blk);
            base_free(l->units[u].t);
        }
    base_free(l->units);
    memset(l, 0, sizeof *l);
}

static int layout_build(const cfg *c, const st_index *ix, layout *l, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    l->n_units = c->n_layers + 1;
    l->units = base_calloc((size_t)l->n_units, sizeof *l->units, MEM_INDEX);
    if (!l->units) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    sbuf missing = {0};
    int rc = 0;
    collect cl = {.c = c, .ix = ix, .r = &l->embed, .cls_mask = 1 << TC_EMBED, .missing = &missing};
    rc = schema_walk(c, 0, collect_fn, &cl);
    for (int64_t L = 0; L < c->n_layers && !rc; L++) {
        cl = (collect){.c = c, .ix = ix, .r = &l->units[L], .missing = &missing};
        rc = schema_walk_layer(c, L, collect_fn, &cl);
    }
    if (!rc) {
        cl = (collect){.c = c, .ix = ix, .r = &l->units[c->n_layers], .cls_mask = (1 << TC_FINAL) | (1 << TC_LM_HEAD), .missing = &missing};
        rc = schema_walk(c, 0, collect_fn, &cl);
    }
    if (rc || missing.n) {
        if (rc == STRATA_ENOMEM) base_fail(err, errlen, rc, "pack: out of memory laying out the trunk");
        else rc = base_fail(err, errlen, rc ? rc : STRATA_EFORMAT, "pack: %d tensors missing:\n%s", missing.n,
                            missing.s ? missing.s : "");
        sbuf_free(&missing);
        layout_free(l);
        return rc;
    }
    uint64_t off = 0;
    for (int64_t u = -1; u < l->n_units; u++) {
        lregion *r = u < 0 ? &l->embed : &l->units[u];
        r->off = off;
        uint64_t rel = 0;
        /* A region whose tensors form one gap-free run in one shard (the released
         * checkpoint's layers, the generator's) keeps the source's relative offsets,
         * so it is copied as ONE sequential stream of 32 MB reads instead of tensor
         * by tensor (the per-tensor copy of the ladder trunk ran at 42% of the disk's
         * write bandwidth). Otherwise tensors are packed at 64-byte alignment. */
        uint64_t lo = UINT64_MAX, hi = 0, sum = 0;
        int same = r->n > 0;
        for (int i = 0; i < r->n; i++) {
            const st_tensor *s = r->t[i].src;
            if (s->shard != r->t[0].src->shard) same = 0;
            if (s->off < lo) lo = s->off;
            if (s->off + s->nbytes > hi) hi = s->off + s->nbytes;
            sum += s->nbytes;
        }
        if (same && hi - lo == sum) {
            r->verbatim = 1;
            r->src_shard = r->t[0].src->shard;
            r->src_off = lo;
            r->src_len = hi - lo;
            for (int i = 0; i < r->n; i++) r->t[i].off = r->t[i].src->off - lo;
            rel = hi - lo;
        } else {
            for (int i = 0; i < r->n; i++) {
                rel = (rel + PACK_TENSOR_ALIGN - 1) & ~(uint64_t)(PACK_TENSOR_ALIGN - 1);
                r->t[i].off = rel;
                rel += r->t[i].src->nbytes;
            }
        }
        r->nbytes = io_align_up(rel ? rel : 1);
        off += r->nbytes;
    }
    l->total = off;
    return STRATA_OK;
}

/* Row blocks of bb bytes (pack_block_rows) for the layers' and the head's
 * matrices, their hashes filled by write_trunk. */
static int layout_blocks(layout *l, uint64_t bb, char *err, size_t errlen) {
    for (int64_t u = 0; u < l->n_units; u++)
        for (int i = 0; i < l->units[u].n; i++) {
            lt *x = &l->units[u].t[i];
            if (!(x->blk_rows = pack_block_rows(x->src->ndim, x->src->shape[0], x->src->nbytes, bb))) continue;
            x->n_blk = (x->src->shape[0] + x->blk_rows - 1) / x->blk_rows;
            if (!(x->blk = base_calloc((size_t)x->n_blk, sizeof *x->blk, MEM_INDEX)))
                return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
        }
    return STRATA_OK;
}

/* ============================================================= source reads */

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

typedef struct spiece {        /* src_next: the next bytes of the current extent */
    const uint8_t *p;          /* in a staging slot (valid until the next call), or NULL: resident */
    int shard;
    uint64_t off, n;
} spiece;

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
static int src_next(sstream *s, spiece *pc, char *err, size_t errlen) {
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
static int src_pread(const sstream *s, const spiece *pc, uint8_t *dst, char *err, size_t errlen) {
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

static void src_close(sstream *s) {
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
static int src_open_files(sstream *s, int n_files, const char *(*path)(const void *ctx, int i), const void *ctx,
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
    if (!s->files || !s->map) { src_close(s); return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); }
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
    if (rc) src_close(s);
    return rc;
}

static const char *shard_path(const void *ix, int i) { return st_shard_path(ix, i); }

/* Opens every shard of ix for a pass over x[0..nx) (see src_open_files). */
static int src_open(sstream *s, const st_index *ix, const sext *x, int64_t nx, int mode, uint64_t chunk,
                    char *err, size_t errlen) {
    return src_open_files(s, st_n_shards(ix), shard_path, ix, x, nx, mode, chunk, err, errlen);
}

/* ============================================================== write ring */

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

static int wring_init(wring *w, int fd, uint64_t bsz, char *err, size_t errlen) {
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
static int wring_put(wring *w, uint64_t len) {
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

static int wring_drain(wring *w) {
    while (w->inflight) wring_reap(w);
    return w->rc;
}

static void wring_free(wring *w) {
    if (w->uring) { wring_drain(w); io_uring_queue_exit(&w->ring); }
    for (int i = 0; i < OUT_BUFS; i++) base_free(w->buf[i]);
    memset(w, 0, sizeof *w);
}

/* Opens path for sequential writes of `bytes`: O_DIRECT when the filesystem allows
 * it, preallocated (ext4 serialises O_DIRECT writes past EOF, and a full disk fails
 * here rather than half way). tmpfile: an unnamed file in the directory path. */
static int wfile_open(const char *path, int tmpfile, uint64_t bytes, char *err, size_t errlen) {
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

/* ==================================================================== trunk */

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

static void tw_start(twalk *w, twt *t, int n) {
    w->t = t;
    w->n = n;
    w->ti = -1;
    w->pos = 0;
}

static void tw_bytes(twalk *w, const uint8_t *p, uint64_t k) {
    while (k) {
        if (w->ti < 0) { /* the tensor at or after pos with the lowest offset */
            int best = -1;
            for (int i = 0; i < w->n; i++)
                if (w->t[i].off + w->t[i].nbytes > w->pos && (best < 0 || w->t[i].off < w->t[best].off)) best = i;
            if (best < 0) { w->pos += k; return; }
            w->ti = best;
            XXH3_64bits_reset(&w->th);
            XXH3_64bits_reset(&w->bh);
        }
        const twt *x = &w->t[w->ti];
        if (w->pos < x->off) { /* a gap before it */
            const uint64_t g = x->off - w->pos < k ? x->off - w->pos : k;
            w->pos += g; p += g; k -= g;
            continue;
        }
        const uint64_t end = x->off + x->nbytes;
        uint64_t n = end - w->pos < k ? end - w->pos : k;
        if (x->bb) { /* up to the end of the block */
            const uint64_t q = w->pos - x->off;
            uint64_t be = (q / x->bb + 1) * x->bb;
            if (be > x->nbytes) be = x->nbytes;
            if (n > be - q) n = be - q;
            XXH3_64bits_update(&w->bh, p, n);
            if (q + n == be) {
                x->blk[q / x->bb] = XXH3_64bits_digest(&w->bh);
                XXH3_64bits_reset(&w->bh);
            }
        }
        XXH3_64bits_update(&w->th, p, n);
        w->pos += n; p += n; k -= n;
        if (w->pos == end) {
            *x->h = XXH3_64bits_digest(&w->th);
            w->ti = -1;
        }
    }
}

typedef struct tcopy {         /* the trunk copy in progress */
    int hash_only;             /* pack_verify: hash the source layout, write nothing */
    const char *phase;
    const char *path;          /* the file written (messages) */
    wring *w;
    sstream *s;
    uint64_t fill, done, total;
    double t0, last;
    pack_progress_fn progress;
    void *ud;
    twalk tw;                  /* the region being written: its tensors' hashes */
} tcopy;

static int tc_flush(tcopy *t, char *err, size_t errlen) {
    int rc = t->hash_only ? 0 : wring_put(t->w, t->fill);
    t->done += t->fill;
    t->fill = 0;
    if (rc) return base_fail(err, errlen, STRATA_EIO, "%s: write failed: %s", t->path, strerror(t->w->err_no));
    double now = base_now();
    if (t->progress && now - t->last > 0.5) {
        t->progress(t->ud, t->phase, t->done, t->total, now - t->t0);
        t->last = now;
    }
    return STRATA_OK;
}

/* The region whose bytes come next: its tensors' own hashes and their blocks'
 * follow them (a tensor read alone, in row slices, is checked against its own; a
 * streamed matrix block by block, wsrc_stream). */
static int tc_region(tcopy *t, lregion *r, char *err, size_t errlen) {
    base_free(t->tw.t);
    t->tw.t = NULL;
    twt *a = base_calloc((size_t)r->n + 1, sizeof *a, MEM_INDEX);
    if (!a) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    for (int i = 0; i < r->n; i++) {
        const lt *x = &r->t[i];
        a[i] = (twt){x->off, x->src->nbytes, x->n_blk ? (uint64_t)x->blk_rows * (x->src->nbytes / (uint64_t)x->src->shape[0]) : 0,
                     &r->t[i].xxh3, x->blk};
    }
    tw_start(&t->tw, a, r->n);
    return STRATA_OK;
}

/* Appends n bytes to the trunk and to the region's hash: zeros (pc == NULL) or the
 * piece pc (copied from its slot, or pread straight into place when resident). */
static int tc_put(tcopy *t, XXH3_state_t *h, const spiece *pc, uint64_t n, char *err, size_t errlen) {
    for (uint64_t o = 0; o < n;) {
        uint64_t k = t->w->bsz - t->fill;
        if (k > n - o) k = n - o;
        uint8_t *dst = t->w->buf[t->w->cur] + t->fill;
        if (!pc) {
            memset(dst, 0, k);
        } else if (pc->p) {
            memcpy(dst, pc->p + o, k);
        } else {
            spiece part = {.shard = pc->shard, .off = pc->off + o, .n = k};
            int rc = src_pread(t->s, &part, dst, err, errlen);
            if (rc) return rc;
        }
        XXH3_64bits_update(h, dst, k);
        tw_bytes(&t->tw, dst, k);
        t->fill += k;
        o += k;
        if (t->fill == t->w->bsz) {
            int rc = tc_flush(t, err, errlen);
            if (rc) return rc;
        }
    }
    return STRATA_OK;
}

/* Appends the next n source bytes (one extent) of the stream. */
static int tc_src(tcopy *t, XXH3_state_t *h, uint64_t n, char *err, size_t errlen) {
    while (n) {
        spiece pc;
        int rc = src_next(t->s, &pc, err, errlen);
        if (rc < 0) return rc;
        if (rc == 0 || pc.n > n) return base_fail(err, errlen, STRATA_EIO, "pack: internal error: source stream ended early");
        if ((rc = tc_put(t, h, &pc, pc.n, err, errlen))) return rc;
        n -= pc.n;
    }
    return STRATA_OK;
}

/* Writes trunk.bin.tmp: regions in order, each region's XXH3 into hashes[u + 1]
 * (embed: hashes[0]) and each tensor's into its lt. One thread: source reads and writes are both asynchronous,
 * so the copy into a buffer and its hashing overlap the reads ahead and the
 * writes behind it. tmp == NULL: only the hashes (the source as it would be
 * packed now, for pack_verify), nothing is written. */
static int write_trunk(layout *l, const st_index *ix, const char *tmp, int flags, pack_progress_fn progress,
                       void *ud, uint64_t *hashes, pack_result *res, char *err, size_t errlen) {
    int64_t nx = 0;
    for (int64_t u = -1; u < l->n_units; u++) {
        const lregion *r = u < 0 ? &l->embed : &l->units[u];
        nx += r->verbatim ? 1 : r->n;
    }
    sext *x = base_alloc((size_t)(nx + 1) * sizeof *x, MEM_IO);
    if (!x) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    nx = 0;
    for (int64_t u = -1; u < l->n_units; u++) {
        const lregion *r = u < 0 ? &l->embed : &l->units[u];
        if (r->verbatim) x[nx++] = (sext){r->src_shard, r->src_off, r->src_len};
        else for (int i = 0; i < r->n; i++) x[nx++] = (sext){r->t[i].src->shard, r->t[i].src->off, r->t[i].src->nbytes};
    }
    const int small = flags & PACK_SMALL_IO;
    sstream s;
    wring w;
    memset(&w, 0, sizeof w);
    double t0 = base_now(); /* timed like pack_measure_write_bw: open to fsync */
    int fd = tmp ? wfile_open(tmp, 0, l->total, err, errlen) : -1;
    if (tmp && fd < 0) { base_free(x); return fd; }
    int rc = src_open(&s, ix, x, nx, flags & (PACK_SRC_DIRECT | PACK_SRC_CACHED), small ? SMALL_CHUNK : SRC_CHUNK, err, errlen);
    if (rc) { if (fd >= 0) close(fd); base_free(x); return rc; }
    rc = wring_init(&w, fd, small ? SMALL_OUT : OUT_BYTES, err, errlen);
    tcopy t = {.hash_only = !tmp, .phase = tmp ? "trunk" : "source", .path = tmp, .w = &w, .s = &s, .total = l->total,
               .t0 = base_now(), .progress = progress, .ud = ud};
    for (int64_t u = -1; u < l->n_units && !rc; u++) {
        lregion *r = u < 0 ? &l->embed : &l->units[u];
        XXH3_state_t h;
        XXH3_64bits_reset(&h);
        rc = tc_region(&t, r, err, errlen);
        uint64_t rel = 0;
        if (!rc && r->verbatim) {
            rc = tc_src(&t, &h, r->src_len, err, errlen);
            rel = r->src_len;
        }
        for (int i = 0; i < r->n && !rc && !r->verbatim; i++) {
            rc = tc_put(&t, &h, NULL, r->t[i].off - rel, err, errlen);
            if (!rc) rc = tc_src(&t, &h, r->t[i].src->nbytes, err, errlen);
            rel = r->t[i].off + r->t[i].src->nbytes;
        }
        if (!rc) rc = tc_put(&t, &h, NULL, r->nbytes - rel, err, errlen);
        hashes[u + 1] = XXH3_64bits_digest(&h);
    }
    if (!rc && t.fill) rc = tc_flush(&t, err, errlen);
    if (tmp && !rc && wring_drain(&w)) rc = base_fail(err, errlen, STRATA_EIO, "%s: write failed: %s", tmp, strerror(w.err_no));
    if (tmp && !rc && vfs_fsync(fd)) rc = base_fail(err, errlen, STRATA_EIO, "%s: fsync: %s", tmp, strerror(errno));
    base_free(t.tw.t);
    res->trunk_secs = base_now() - t0;
    res->src_direct_bytes = s.bytes_direct;
    res->src_cached_bytes = s.bytes_cached;
    wring_free(&w);
    src_close(&s);
    if (fd >= 0) close(fd);
    base_free(x);
    if (progress && !rc) progress(ud, t.phase, l->total, l->total, base_now() - t.t0);
    return rc;
}

/* =================================================================== experts */

typedef struct xrec {
    int64_t L, E;
    int shard;
    uint64_t off, nbytes;    /* contiguous run, or nbytes = 0 when scattered */
} xrec;

typedef struct xcollect { const st_index *ix; const st_tensor *t[8]; int n; } xcollect;
static int xcollect_fn(void *ud, const tspec *t) {
    xcollect *x = ud;
    if (x->n < 8) x->t[x->n++] = st_find(x->ix, t->name);
    return 0;
}

static int expert_tensors(const cfg *c, const st_index *ix, int bf16, int64_t L, int64_t E, xcollect *x) {
    x->ix = ix;
    x->n = 0;
    schema_walk_expert(c, L, E, bf16, xcollect_fn, x);
    for (int i = 0; i < x->n; i++) if (!x->t[i]) return -1;
    return 0;
}

static int xrec_cmp(const void *a, const void *b) {
    const xrec *x = a, *y = b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int experts_bf16(const cfg *c, const st_index *ix) {
    char name[200];
    snprintf(name, sizeof name, "%slayers.%lld.block_sparse_moe.experts.0.w1.weight", arch_of(c)->pfx,
             (long long)c->first_dense);
    return st_find(ix, name) != NULL;
}

/* Hashes every expert in disk order; out[(L - first_dense) * n_experts + E]. The
 * experts stream through the same chunked reads as the trunk (large reads across
 * neighbouring experts, page-cache-resident chunks not read again), so memory
 * stays bounded whatever an expert's size. With expect != NULL compares instead
 * and reports the first mismatch. */
static int hash_experts(const cfg *c, const st_index *ix, uint64_t *out, const uint64_t *expect, int flags,
                        pack_progress_fn progress, void *ud, uint64_t *bytes_done, char *err, size_t errlen) {
    const int64_t n_moe = c->n_layers - c->first_dense, NE = c->n_experts, n_all = n_moe * NE;
    if (n_moe <= 0) return STRATA_OK;
    int bf16 = experts_bf16(c, ix);
    xrec *recs = base_alloc((size_t)n_all * sizeof *recs, MEM_INDEX);
    if (!recs) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    int rc = STRATA_OK;
    uint64_t total = 0;
    int64_t nx = 0;
    for (int64_t L = c->first_dense; L < c->n_layers && !rc; L++)
        for (int64_t E = 0; E < NE; E++) {
            xcollect x;
            if (expert_tensors(c, ix, bf16, L, E, &x)) {
                rc = base_fail(err, errlen, STRATA_EFORMAT, "pack: layer %lld expert %lld: tensor missing", (long long)L, (long long)E);
                break;
            }
            xrec *r = &recs[(L - c->first_dense) * NE + E];
            *r = (xrec){.L = L, .E = E, .shard = x.t[0]->shard, .off = x.t[0]->off};
            uint64_t end = x.t[0]->off, sum = 0;
            int contig = 1;
            for (int i = 0; i < x.n; i++) {
                if (x.t[i]->shard != r->shard || x.t[i]->off != end) contig = 0;
                end = x.t[i]->off + x.t[i]->nbytes;
                sum += x.t[i]->nbytes;
            }
            r->nbytes = contig ? sum : 0;
            nx += contig ? 1 : x.n;
            total += sum;
        }
    sext *x = rc ? NULL : base_alloc((size_t)(nx + 1) * sizeof *x, MEM_INDEX);
    if (!rc && !x) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    if (rc) { base_free(recs); return rc; }
    qsort(recs, (size_t)n_all, sizeof *recs, xrec_cmp);
    nx = 0;
    for (int64_t i = 0; i < n_all; i++) {
        const xrec *r = &recs[i];
        if (r->nbytes) { x[nx++] = (sext){r->shard, r->off, r->nbytes}; continue; }
        xcollect xc; /* scattered: its tensors in schema order, hashed as one */
        expert_tensors(c, ix, bf16, r->L, r->E, &xc);
        for (int k = 0; k < xc.n; k++) x[nx++] = (sext){xc.t[k]->shard, xc.t[k]->off, xc.t[k]->nbytes};
    }
    const uint64_t chunk = flags & PACK_SMALL_IO ? SMALL_CHUNK : SRC_CHUNK;
    sstream s;
    uint8_t *scratch = base_alloc_aligned(chunk, IO_ALIGN, MEM_IO); /* resident pieces */
    if (!scratch) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    else rc = src_open(&s, ix, x, nx, flags & (PACK_SRC_DIRECT | PACK_SRC_CACHED), chunk, err, errlen);
    if (rc) { base_free(scratch); base_free(x); base_free(recs); return rc; }
    double t0 = base_now(), last = t0;
    uint64_t done = 0;
    int64_t xi = 0;
    for (int64_t i = 0; i < n_all && !rc; i++) {
        const xrec *r = &recs[i];
        int n_ext = 1;
        if (!r->nbytes) {
            xcollect xc;
            expert_tensors(c, ix, bf16, r->L, r->E, &xc);
            n_ext = xc.n;
        }
        XXH3_state_t h;
        XXH3_64bits_reset(&h);
        for (int k = 0; k < n_ext && !rc; k++, xi++) {
            for (uint64_t left = x[xi].len; left && !rc;) {
                spiece pc;
                int got = src_next(&s, &pc, err, errlen);
                if (got <= 0 || pc.n > left) {
                    char e2[1024];
                    snprintf(e2, sizeof e2, "%s", got < 0 ? err : "read plan out of step");
                    rc = base_fail(err, errlen, STRATA_EIO, "layer %lld expert %lld unreadable: %s", (long long)r->L,
                                   (long long)r->E, e2);
                    break;
                }
                const uint8_t *p = pc.p;
                if (!p && !(rc = src_pread(&s, &pc, scratch, err, errlen))) p = scratch;
                if (rc) break;
                XXH3_64bits_update(&h, p, pc.n);
                left -= pc.n;
                done += pc.n;
            }
        }
        out[(r->L - c->first_dense) * NE + r->E] = XXH3_64bits_digest(&h);
        double now = base_now();
        if (progress && now - last > 0.5) { progress(ud, "experts", done, total, now - t0); last = now; }
    }
    if (!rc && expect) {
        /* report the first mismatch in (layer, expert) order */
        for (int64_t i = 0; i < n_all && !rc; i++)
            if (out[i] != expect[i]) {
                const int64_t L = c->first_dense + i / NE, E = i % NE;
                xcollect xc;
                expert_tensors(c, ix, bf16, L, E, &xc);
                const st_tensor *a = xc.t[0], *b = xc.t[xc.n - 1];
                rc = base_fail(err, errlen, STRATA_ECORRUPT,
                               "layer %lld expert %lld: checksum mismatch in %s bytes %llu..%llu (expected %016llx, got %016llx): "
                               "the shard changed after packing or is corrupt",
                               (long long)L, (long long)E, st_shard_path(ix, a->shard), (unsigned long long)a->off,
                               (unsigned long long)(b->off + b->nbytes), (unsigned long long)expect[i], (unsigned long long)out[i]);
            }
    }
    if (progress && !rc) progress(ud, "experts", total, total, base_now() - t0);
    if (bytes_done) *bytes_done = done;
    src_close(&s);
    base_free(scratch);
    base_free(x);
    base_free(recs);
    return rc;
}

/* ============================================================ content digest */

/* XXH3 over the record hashes in the pack's order: each trunk tensor's own XXH3
 * (embedding, layers 0.., head; tensors in layout order), then each expert's (its
 * tensors in schema order, (layer, expert) order). A pack holds these hashes, so a
 * digest from its manifest and one from the shards agree for the same bytes. */
static void digest_begin(XXH3_state_t *h, int64_t n_trunk, int64_t n_exp) {
    XXH3_64bits_reset(h);
    const char tag[16] = "strata-content1";
    XXH3_64bits_update(h, tag, sizeof tag);
    XXH3_64bits_update(h, &n_trunk, sizeof n_trunk);
    XXH3_64bits_update(h, &n_exp, sizeof n_exp);
}

int pack_content_digest(const pack *p, uint64_t *out) {
    int64_t nt = p->embed.n_tensors;
    for (int64_t u = 0; u <= p->n_layers; u++) nt += p->units[u].n_tensors;
    XXH3_state_t h;
    digest_begin(&h, nt, p->n_moe * p->n_experts);
    for (int64_t u = -1; u <= p->n_layers; u++) {
        const pack_region *r = u < 0 ? &p->embed : &p->units[u];
        for (int i = 0; i < r->n_tensors; i++) {
            if (!r->t[i].has_xxh3) return -1;
            XXH3_64bits_update(&h, &r->t[i].xxh3, sizeof r->t[i].xxh3);
        }
    }
    if (p->n_moe > 0 && p->n_experts > 0)
        XXH3_64bits_update(&h, p->expert_xxh3, (size_t)(p->n_moe * p->n_experts) * sizeof *p->expert_xxh3);
    *out = XXH3_64bits_digest(&h);
    return 0;
}

int pack_content_digest_shards(const cfg *c, const st_index *ix, int flags, pack_progress_fn progress, void *ud,
                               uint64_t *out, char *err, size_t errlen) {
    layout l;
    int rc = layout_build(c, ix, &l, err, errlen);
    if (rc) return rc;
    const int64_t n_moe = c->n_layers > c->first_dense ? c->n_layers - c->first_dense : 0, n_exp = n_moe * c->n_experts;
    uint64_t *hashes = base_calloc((size_t)(l.n_units + 1), sizeof *hashes, MEM_INDEX);
    uint64_t *xh = base_calloc((size_t)(n_exp + 1), sizeof *xh, MEM_INDEX);
    pack_result res;
    memset(&res, 0, sizeof res);
    if (!hashes || !xh) rc = base_fail(err, errlen, STRATA_ENOMEM, "identity: out of memory");
    if (!rc) rc = write_trunk(&l, ix, NULL, flags, progress, ud, hashes, &res, err, errlen);
    if (!rc) rc = hash_experts(c, ix, xh, NULL, flags, progress, ud, NULL, err, errlen);
    if (!rc) {
        int64_t nt = 0;
        for (int64_t u = -1; u < l.n_units; u++) nt += (u < 0 ? &l.embed : &l.units[u])->n;
        XXH3_state_t h;
        digest_begin(&h, nt, n_exp);
        for (int64_t u = -1; u < l.n_units; u++) {
            const lregion *r = u < 0 ? &l.embed : &l.units[u];
            for (int i = 0; i < r->n; i++) XXH3_64bits_update(&h, &r->t[i].xxh3, sizeof r->t[i].xxh3);
        }
        if (n_exp) XXH3_64bits_update(&h, xh, (size_t)n_exp * sizeof *xh);
        *out = XXH3_64bits_digest(&h);
    }
    base_free(hashes);
    base_free(xh);
    layout_free(&l);
    return rc;
}

/* ================================================================== manifest */

static json_t *region_json(const lregion *r, uint64_t h) {
    json_t *o = json_object(), *ts = json_array();
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    json_object_set_new(o, "off", json_integer((json_int_t)r->off));
    json_object_set_new(o, "nbytes", json_integer((json_int_t)r->nbytes));
    json_object_set_new(o, "xxh3", json_string(hex));
    for (int i = 0; i < r->n; i++) {
        const st_tensor *s = r->t[i].src;
        json_t *t = json_object(), *sh = json_array();
        json_object_set_new(t, "name", json_string(s->name));
        json_object_set_new(t, "role", json_integer(r->t[i].role));
        json_object_set_new(t, "dtype", json_string(st_dtype_name(s->dtype)));
        for (int d = 0; d < s->ndim; d++) json_array_append_new(sh, json_integer(s->shape[d]));
        json_object_set_new(t, "shape", sh);
        json_object_set_new(t, "off", json_integer((json_int_t)r->t[i].off));
        json_object_set_new(t, "nbytes", json_integer((json_int_t)s->nbytes));
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)r->t[i].xxh3);
        json_object_set_new(t, "xxh3", json_string(hex));
        if (r->t[i].n_blk) {
            json_t *b = json_array();
            for (int64_t k = 0; k < r->t[i].n_blk; k++) {
                snprintf(hex, sizeof hex, "%016llx", (unsigned long long)r->t[i].blk[k]);
                json_array_append_new(b, json_string(hex));
            }
            json_object_set_new(t, "block_rows", json_integer(r->t[i].blk_rows));
            json_object_set_new(t, "blocks", b);
        }
        json_array_append_new(ts, t);
    }
    json_object_set_new(o, "tensors", ts);
    return o;
}

/* A manifest written before row-block checksums: some layer or head matrix
 * large enough for blocks (pack_block_rows) has none. Such a pack still runs,
 * verified as each unit lands, at a higher cost; plain `pack` rewrites it. */
static int lacks_blocks(json_t *j) {
    json_t *units = json_object_get(j, "units");
    for (size_t u = 0; u < json_array_size(units); u++) {
        json_t *ts = json_object_get(json_array_get(units, u), "tensors");
        for (size_t i = 0; i < json_array_size(ts); i++) {
            json_t *t = json_array_get(ts, i), *sh = json_object_get(t, "shape");
            int64_t nb, rows;
            if (json_object_get(t, "blocks") || json_array_size(sh) != 2 || jsonx_int(json_object_get(t, "nbytes"), &nb) ||
                jsonx_int(json_array_get(sh, 0), &rows) || nb < 0)
                continue;
            if (pack_block_rows(2, rows, (uint64_t)nb, PACK_BLOCK_BYTES)) return 1;
        }
    }
    return 0;
}

/* Reads dir/manifest.json: the format, the model id and the version (checked by
 * the callers: pack_open refuses another version, pack_build replaces it). */
static int load_manifest(const char *dir, json_t **out, uint64_t *id, int64_t *version, char *err, size_t errlen) {
    char path[2048];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    uint8_t *buf;
    size_t len;
    int rc = base_read_file(path, 1u << 30, &buf, &len, err, errlen);
    if (rc) return rc;
    json_t *j;
    rc = jsonx_parse(&j, buf, len, path, err, errlen);
    base_free(buf);
    if (rc) return rc;
    const char *fmt = json_string_value(json_object_get(j, "format"));
    const char *mid = json_string_value(json_object_get(j, "model_id"));
    if (!fmt || strcmp(fmt, "strata-pack") || !mid) {
        json_decref(j);
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: not a strata pack manifest", path);
    }
    if (hex64(mid, id) || jsonx_int(json_object_get(j, "version"), version)) {
        json_decref(j);
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: model_id must be 16 hex digits and version an integer", path);
    }
    *out = j;
    return STRATA_OK;
}

/* ===================================================================== build */

#define PACK_LOCK ".strata-pack.lock"

/* 1 if the manifest's "source" is model_dir (after realpath). */
static int same_source(const json_t *j, const char *model_dir) {
    const char *src = json_string_value(json_object_get(j, "source"));
    char real[4096];
    return src && realpath(model_dir, real) && !strcmp(src, real);
}

/* pack_build with dir locked against other writers. */
static int build_locked(const char *model_dir, const cfg *c, const st_index *ix, const char *out_dir, const char *dir,
                        uint64_t id, int flags, pack_progress_fn progress, void *ud, pack_result *res, char *err,
                        size_t errlen) {
    int rc = STRATA_OK;
    char path[2048], tmp[2048];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    /* A pack directory holds the pack only: never write among other files. With
     * the lock held, trunk.bin.tmp.<pid> files are left by writers that died. */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *n = e->d_name;
        if (!strncmp(n, "trunk.bin.tmp", 13)) {
            snprintf(tmp, sizeof tmp, "%s/%s", dir, n);
            unlink(tmp);
            continue;
        }
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strncmp(n, "trunk.bin", 9) || !strncmp(n, "manifest.json", 13) ||
            !strcmp(n, PACK_LOCK))
            continue;
        rc = base_fail(err, errlen, STRATA_EINVAL, "%s is not empty (holds %s, which is not part of a strata pack); refusing to write there",
                       dir, n);
        closedir(d);
        return rc;
    }
    if (d) closedir(d);
    /* An existing pack: identical (nothing to do), stale (this model's pack, out of
     * date: rebuilt), or another model's (refused, even with --force). */
    if (base_is_file(path)) {
        json_t *j;
        uint64_t old;
        int64_t ver;
        char why[900];
        if (load_manifest(dir, &j, &old, &ver, why, sizeof why)) {
            if (!(flags & PACK_FORCE))
                return base_fail(err, errlen, STRATA_EINVAL, "%s holds an unreadable manifest (%s); use --force to replace it", dir, why);
            snprintf(res->stale, sizeof res->stale, "its manifest was unreadable");
        } else {
            /* the default location belongs to the model; elsewhere the manifest names its source */
            const int ours = !out_dir || same_source(j, model_dir);
            int stale = 1;
            if (old != id) snprintf(why, sizeof why, "the model's config, index, shard sizes or shard headers changed after packing");
            else if (ver != PACK_VERSION)
                snprintf(why, sizeof why, "it was written by another strata (manifest version %lld, this one writes %d)",
                         (long long)ver, PACK_VERSION);
            else stale = stamps_stale(json_object_get(j, "shards"), ix, why, sizeof why);
            if (!stale && lacks_blocks(j)) {
                stale = 1;
                snprintf(why, sizeof why, "it predates the per-block checksums that let a run verify streamed matrices "
                         "as it multiplies with them");
            }
            json_decref(j);
            if (old != id && !ours)
                return base_fail(err, errlen, STRATA_EINVAL,
                                 "%s holds the pack of another model (id %016llx, this model is %016llx); refusing to overwrite it "
                                 "(remove it first)", dir, (unsigned long long)old, (unsigned long long)id);
            if (stale && !ours)
                return base_fail(err, errlen, STRATA_EINVAL,
                                 "%s holds a pack of another copy of this model, stale for this one (%s); refusing to overwrite it "
                                 "(remove it first)", dir, why);
            if (!stale && !(flags & PACK_FORCE)) { res->already = 1; goto pointer; }
            if (stale) snprintf(res->stale, sizeof res->stale, "%s", why);
        }
    }
    /* stamps before the first source byte is read: a shard written while we pack
     * leaves the pack stale, not silently mixed */
    jsonx_build_begin(); /* covers the stamps and the manifest built below */
    json_t *stamps = stamps_json(ix, err, errlen);
    if (!stamps) return STRATA_EIO;
    char real[4096];
    if (!realpath(model_dir, real)) snprintf(real, sizeof real, "%s", model_dir);
    layout l;
    if ((rc = layout_build(c, ix, &l, err, errlen))) { json_decref(stamps); return rc; }
    uint64_t *hashes = base_calloc((size_t)(l.n_units + 1), sizeof *hashes, MEM_INDEX);
    const int64_t n_moe = c->n_layers > c->first_dense ? c->n_layers - c->first_dense : 0;
    uint64_t *xh = base_calloc((size_t)(n_moe * c->n_experts + 1), sizeof *xh, MEM_INDEX);
    if (!hashes || !xh) { rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); goto done; }
    snprintf(tmp, sizeof tmp, "%s/trunk.bin.tmp.%d", dir, (int)getpid());
    if (flags & PACK_MEASURE) res->disk_bw = pack_measure_write_bw(dir, PACK_MEASURE_BYTES);
    if ((rc = layout_blocks(&l, flags & PACK_SMALL_BLOCKS ? PACK_SMALL_BLOCK_BYTES : PACK_BLOCK_BYTES, err, errlen))) goto done;
    if ((rc = write_trunk(&l, ix, tmp, flags, progress, ud, hashes, res, err, errlen))) { unlink(tmp); goto done; }
    res->trunk_bytes = l.total;
    res->write_bw = res->trunk_secs > 0 ? (double)l.total / res->trunk_secs : 0;
    double t0 = base_now();
    if ((rc = hash_experts(c, ix, xh, NULL, flags, progress, ud, &res->expert_bytes_hashed, err, errlen))) { unlink(tmp); goto done; }
    res->expert_secs = base_now() - t0;
    char trunk[2048];
    snprintf(trunk, sizeof trunk, "%s/trunk.bin", dir);
    unlink(path); /* a forced rebuild: the old manifest must not describe the new trunk */
    if (vfs_rename(tmp, trunk)) {
        rc = base_fail(err, errlen, STRATA_EIO, "rename %s: %s", tmp, strerror(errno));
        unlink(tmp); /* a whole trunk's worth of disk otherwise, until the next pack */
        goto done;
    }
    {
        json_t *m = json_object(), *units = json_array(), *xa = json_array(), *ex = json_object();
        char hex[20];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)id);
        json_object_set_new(m, "format", json_string("strata-pack"));
        json_object_set_new(m, "version", json_integer(PACK_VERSION));
        json_object_set_new(m, "model_id", json_string(hex));
        json_object_set_new(m, "source", json_string(real));
        json_object_set_new(m, "shards", stamps);
        stamps = NULL;
        json_object_set_new(m, "align", json_integer(PACK_ALIGN));
        json_object_set_new(m, "n_layers", json_integer(c->n_layers));
        json_object_set_new(m, "trunk_bytes", json_integer((json_int_t)l.total));
        json_object_set_new(m, "embed", region_json(&l.embed, hashes[0]));
        for (int64_t u = 0; u < l.n_units; u++) json_array_append_new(units, region_json(&l.units[u], hashes[u + 1]));
        json_object_set_new(m, "units", units);
        json_object_set_new(ex, "mode", json_string("in_place"));
        json_object_set_new(ex, "n_layers_moe", json_integer(n_moe));
        json_object_set_new(ex, "n_experts", json_integer(c->n_experts));
        for (int64_t i = 0; i < n_moe * c->n_experts; i++) {
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)xh[i]);
            json_array_append_new(xa, json_string(hex));
        }
        json_object_set_new(ex, "xxh3", xa);
        json_object_set_new(m, "experts", ex);
        char *s = json_dumps(m, JSON_COMPACT);
        json_decref(m);
        /* a failed allocation drops a field without a word: never write that */
        if (s && jsonx_build_failed()) { base_free(s); s = NULL; }
        if (!s) { rc = base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory building the manifest", path); goto done; }
        rc = base_write_file_atomic(path, s, strlen(s), err, errlen);
        json_malloc_t jm;
        json_free_t jf;
        json_get_alloc_funcs(&jm, &jf); /* jsonx may have routed jansson through base_alloc */
        jf(s);
    }
done:
    json_decref(stamps);
    base_free(hashes);
    base_free(xh);
    layout_free(&l);
    if (rc) return rc;
pointer:
    if (out_dir) { /* let `strata run MODEL_DIR` find a pack written elsewhere */
        char ptr[4096], rdir[4096], pdir[4096];
        pointer_path(model_dir, ptr, sizeof ptr);
        snprintf(pdir, sizeof pdir, "%s", ptr);
        char *slash = strrchr(pdir, '/');
        if (slash) *slash = 0;
        if (!realpath(dir, rdir)) snprintf(rdir, sizeof rdir, "%s", dir);
        if (base_mkdir_p(pdir, NULL, 0) == 0) base_write_file_atomic(ptr, rdir, strlen(rdir), NULL, 0);
    }
    return STRATA_OK;
}

int pack_build(const char *model_dir, const cfg *c, const st_index *ix, const char *out_dir, int flags,
               pack_progress_fn progress, void *ud, pack_result *res, char *err, size_t errlen) {
    memset(res, 0, sizeof *res);
    char dir[1024], lock[1100];
    if (out_dir) snprintf(dir, sizeof dir, "%s", out_dir);
    else snprintf(dir, sizeof dir, "%s/%s", model_dir, PACK_DIRNAME);
    snprintf(res->dir, sizeof res->dir, "%s", dir);
    uint64_t id;
    int rc = pack_model_id(model_dir, ix, &id, err, errlen);
    if (rc) return rc;
    if ((rc = base_mkdir_p(dir, err, errlen))) return rc;
    /* one writer at a time: two `pack --force` collided on trunk.bin.tmp */
    snprintf(lock, sizeof lock, "%s/" PACK_LOCK, dir);
    int lfd = base_lock(lock, dir, err, errlen);
    if (lfd < 0) return lfd;
    rc = build_locked(model_dir, c, ix, out_dir, dir, id, flags, progress, ud, res, err, errlen);
    base_unlock(lock, lfd);
    return rc;
}

/* ====================================================================== open */

static int parse_region(json_t *o, pack_region *r, uint64_t trunk_bytes, const st_index *ix, const char *mpath,
                        const char *what, char *err, size_t errlen) {
    int64_t off, nb;
    json_t *ts = json_object_get(o, "tensors");
    const char *hx = json_string_value(json_object_get(o, "xxh3"));
    if (!o || jsonx_int(json_object_get(o, "off"), &off) || jsonx_int(json_object_get(o, "nbytes"), &nb) || !hx ||
        !json_is_array(ts) || off < 0 || nb < 0 || (uint64_t)off % PACK_ALIGN || (uint64_t)nb % PACK_ALIGN ||
        (uint64_t)(off + nb) > trunk_bytes)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: bad region (off, nbytes, xxh3 or tensors missing or out of "
                         "the %llu-byte trunk)", mpath, what, (unsigned long long)trunk_bytes);
    r->off = (uint64_t)off;
    r->nbytes = (uint64_t)nb;
    if (hex64(hx, &r->xxh3))
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: xxh3 \"%.40s\" is not 16 hex digits", mpath, what, hx);
    r->n_tensors = (int32_t)json_array_size(ts);
    r->t = base_calloc((size_t)r->n_tensors + 1, sizeof *r->t, MEM_INDEX);
    if (!r->t) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    for (int i = 0; i < r->n_tensors; i++) {
        json_t *t = json_array_get(ts, (size_t)i);
        const char *name = json_string_value(json_object_get(t, "name"));
        int64_t role, toff, tnb;
        const st_tensor *s = name ? st_find(ix, name) : NULL;
        if (!s || jsonx_int(json_object_get(t, "role"), &role) || jsonx_int(json_object_get(t, "off"), &toff) ||
            jsonx_int(json_object_get(t, "nbytes"), &tnb) || role < 0 || role >= R_COUNT || toff < 0 ||
            (uint64_t)tnb != s->nbytes || (uint64_t)(toff + tnb) > r->nbytes || s->ndim > 4)
            return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: tensor %d (%s) does not match the model", mpath, what, i,
                             name ? name : "?");
        pack_tensor *pt = &r->t[i];
        pt->name = s->name;
        pt->role = (int32_t)role;
        pt->dtype = s->dtype;
        pt->ndim = s->ndim;
        for (int d = 0; d < s->ndim; d++) pt->shape[d] = s->shape[d];
        pt->off = (uint64_t)toff;
        pt->nbytes = (uint64_t)tnb;
        /* optional (packs before it lack it): the tensor's own XXH3, for slices */
        const char *th = json_string_value(json_object_get(t, "xxh3"));
        if (th && hex64(th, &pt->xxh3))
            return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: tensor %s: xxh3 \"%.40s\" is not 16 hex digits", mpath, what,
                             name, th);
        pt->has_xxh3 = th != NULL;
        /* optional too: the hashes of its row blocks */
        json_t *bl = json_object_get(t, "blocks"), *br = json_object_get(t, "block_rows");
        if (!bl && !br) continue;
        int64_t rows_b;
        if (!json_is_array(bl) || jsonx_int(br, &rows_b) || rows_b < 1 || s->ndim != 2 || s->shape[0] < 1 ||
            s->nbytes % (uint64_t)s->shape[0] || (int64_t)json_array_size(bl) != (s->shape[0] + rows_b - 1) / rows_b)
            return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: tensor %s: bad blocks (block_rows and one hash per block "
                             "of a 2-D tensor expected)", mpath, what, name);
        pt->blk_rows = rows_b;
        pt->n_blk = (int64_t)json_array_size(bl);
        if (!(pt->blk = base_alloc((size_t)pt->n_blk * sizeof *pt->blk, MEM_INDEX))) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
        for (int64_t k = 0; k < pt->n_blk; k++) {
            const char *bh = json_string_value(json_array_get(bl, (size_t)k));
            if (!bh || hex64(bh, &pt->blk[k]))
                return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: tensor %s: blocks[%lld] is not 16 hex digits", mpath, what,
                                 name, (long long)k);
        }
    }
    return STRATA_OK;
}

static void region_free(pack_region *r) {
    for (int i = 0; r->t && i < r->n_tensors; i++) base_free(r->t[i].blk);
    base_free(r->t);
}

void pack_close(pack *p) {
    if (!p) return;
    region_free(&p->embed);
    if (p->units)
        for (int64_t u = 0; u <= p->n_layers; u++) region_free(&p->units[u]);
    base_free(p->units);
    base_free(p->expert_xxh3);
    base_free(p);
}

/* The manifest's regions and tensors must sit exactly where the model's layout
 * puts them (layout_build is deterministic): an edited offset would otherwise pass
 * the bounds checks and serve another tensor's bytes under this one's name. */
static int check_layout(const pack *p, const cfg *c, const st_index *ix, const char *mpath, char *err, size_t errlen) {
    layout l;
    int rc = layout_build(c, ix, &l, err, errlen);
    if (rc) return rc;
    if (l.total != p->trunk_bytes)
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: trunk_bytes %llu, the model's layout needs %llu; re-run strata pack --force",
                       mpath, (unsigned long long)p->trunk_bytes, (unsigned long long)l.total);
    for (int64_t u = -1; u < l.n_units && !rc; u++) {
        const lregion *lr = u < 0 ? &l.embed : &l.units[u];
        const pack_region *r = u < 0 ? &p->embed : &p->units[u];
        char what[64];
        if (u < 0) snprintf(what, sizeof what, "embed");
        else if (u < c->n_layers) snprintf(what, sizeof what, "layer %lld", (long long)u);
        else snprintf(what, sizeof what, "head");
        if (r->off != lr->off || r->nbytes != lr->nbytes) {
            rc = base_fail(err, errlen, STRATA_EFORMAT,
                           "%s: %s: region at bytes %llu..%llu, the model's layout puts it at %llu..%llu (edited or "
                           "corrupt manifest); re-run strata pack --force",
                           mpath, what, (unsigned long long)r->off, (unsigned long long)(r->off + r->nbytes),
                           (unsigned long long)lr->off, (unsigned long long)(lr->off + lr->nbytes));
            break;
        }
        if (r->n_tensors != lr->n) {
            rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: %d tensors, the model's layout has %d; re-run strata pack --force",
                           mpath, what, r->n_tensors, lr->n);
            break;
        }
        for (int i = 0; i < lr->n && !rc; i++)
            if (strcmp(r->t[i].name, lr->t[i].src->name) || r->t[i].off != lr->t[i].off)
                rc = base_fail(err, errlen, STRATA_EFORMAT,
                               "%s: %s: tensor %d (%s) at region offset %llu, the model's layout puts %s at %llu (edited or "
                               "corrupt manifest); re-run strata pack --force",
                               mpath, what, i, r->t[i].name, (unsigned long long)r->t[i].off, lr->t[i].src->name,
                               (unsigned long long)lr->t[i].off);
    }
    layout_free(&l);
    return rc;
}

int pack_open(pack **out, const char *pack_dir, const char *model_dir, const cfg *c, const st_index *ix,
              char *err, size_t errlen) {
    return pack_open_ex(out, pack_dir, model_dir, c, ix, 0, err, errlen);
}

int pack_open_ex(pack **out, const char *pack_dir, const char *model_dir, const cfg *c, const st_index *ix, int flags,
                 char *err, size_t errlen) {
    *out = NULL;
    json_t *j = NULL;
    uint64_t mid;
    int64_t ver;
    char mpath[1100];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", pack_dir);
    int rc = load_manifest(pack_dir, &j, &mid, &ver, err, errlen);
    if (rc) return rc;
    if (ver != PACK_VERSION) {
        json_decref(j);
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: manifest version %lld is not supported (this strata reads version %d); "
                         "re-run strata pack", mpath, (long long)ver, PACK_VERSION);
    }
    pack *p = base_calloc(1, sizeof *p, MEM_INDEX);
    if (!p) { json_decref(j); return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); }
    snprintf(p->dir, sizeof p->dir, "%s", pack_dir);
    snprintf(p->trunk_path, sizeof p->trunk_path, "%s/trunk.bin", pack_dir);
    p->model_id = mid;
    if (model_dir) {
        uint64_t id;
        if ((rc = pack_model_id(model_dir, ix, &id, err, errlen))) goto fail;
        if (id != mid) {
            rc = base_fail(err, errlen, STRATA_EINVAL,
                           "%s is the pack of another model (id %016llx; %s is %016llx): re-run strata pack", pack_dir,
                           (unsigned long long)mid, model_dir, (unsigned long long)id);
            goto fail;
        }
        /* the shards' data may have changed under unchanged headers */
        if (stamps_stale(json_object_get(j, "shards"), ix, p->stale, sizeof p->stale) && !(flags & PACK_OPEN_STALE_OK)) {
            rc = base_fail(err, errlen, STRATA_EINVAL, "%s is stale: %s; re-run strata pack (it rebuilds a stale pack)",
                           pack_dir, p->stale);
            goto fail;
        }
    }
    int64_t nl, tb, align;
    if (jsonx_int(json_object_get(j, "n_layers"), &nl) || jsonx_int(json_object_get(j, "trunk_bytes"), &tb) ||
        jsonx_int(json_object_get(j, "align"), &align) || nl != c->n_layers || align != PACK_ALIGN || tb < 0) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s/manifest.json: n_layers/align/trunk_bytes do not match the model", pack_dir);
        goto fail;
    }
    p->n_layers = nl;
    p->trunk_bytes = (uint64_t)tb;
    struct stat sb;
    if (stat(p->trunk_path, &sb) || (uint64_t)sb.st_size != p->trunk_bytes) {
        rc = base_fail(err, errlen, STRATA_ECORRUPT, "%s: %s (manifest says %llu bytes): truncated or missing; re-run strata pack",
                       p->trunk_path, stat(p->trunk_path, &sb) ? "missing" : "wrong size", (unsigned long long)p->trunk_bytes);
        goto fail;
    }
    if ((rc = parse_region(json_object_get(j, "embed"), &p->embed, p->trunk_bytes, ix, mpath, "embed", err, errlen))) goto fail;
    json_t *units = json_object_get(j, "units");
    if (!json_is_array(units) || (int64_t)json_array_size(units) != nl + 1) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s/manifest.json: units must have n_layers + 1 entries", pack_dir);
        goto fail;
    }
    p->units = base_calloc((size_t)nl + 1, sizeof *p->units, MEM_INDEX);
    if (!p->units) { rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); goto fail; }
    for (int64_t u = 0; u <= nl; u++) {
        char what[64];
        if (u < nl) snprintf(what, sizeof what, "layer %lld", (long long)u); else snprintf(what, sizeof what, "head");
        if ((rc = parse_region(json_array_get(units, (size_t)u), &p->units[u], p->trunk_bytes, ix, mpath, what, err, errlen))) goto fail;
    }
    if ((rc = check_layout(p, c, ix, mpath, err, errlen))) goto fail;
    json_t *ex = json_object_get(j, "experts"), *xa = json_object_get(ex, "xxh3");
    int64_t n_moe, ne;
    p->n_moe = c->n_layers > c->first_dense ? c->n_layers - c->first_dense : 0;
    p->n_experts = c->n_experts;
    if (jsonx_int(json_object_get(ex, "n_layers_moe"), &n_moe) || jsonx_int(json_object_get(ex, "n_experts"), &ne) ||
        n_moe != p->n_moe || ne != p->n_experts || !json_is_array(xa) || (int64_t)json_array_size(xa) != n_moe * ne) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s/manifest.json: experts do not match the model", pack_dir);
        goto fail;
    }
    p->expert_xxh3 = base_alloc((size_t)(n_moe * ne + 1) * sizeof *p->expert_xxh3, MEM_INDEX);
    if (!p->expert_xxh3) { rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); goto fail; }
    for (int64_t i = 0; i < n_moe * ne; i++) {
        const char *h = json_string_value(json_array_get(xa, (size_t)i));
        if (hex64(h, &p->expert_xxh3[i])) {
            rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: experts.xxh3[%lld] (layer %lld expert %lld) is not 16 hex digits", mpath,
                           (long long)i, (long long)(c->first_dense + i / ne), (long long)(i % ne));
            goto fail;
        }
    }
    json_decref(j);
    *out = p;
    return STRATA_OK;
fail:
    json_decref(j);
    pack_close(p);
    return rc;
}

/* ==================================================================== verify */

static const pack_region *verify_reg(const pack *p, int64_t i) { return i == 0 ? &p->embed : &p->units[i - 1]; }

static const char *trunk_path(const void *p, int i) { (void)i; return ((const pack *)p)->trunk_path; }

/* Releases what tw_pack_region allocated. */
static void tw_pack_free(twalk *w) {
    if (w->t) base_free(w->t[w->n].blk); /* the sentinel entry holds the hashes' storage */
    base_free(w->t);
    w->t = NULL;
}

/* Sets w up to recompute the hashes of r's tensors and blocks (into storage it
 * allocates; tw_pack_free releases it). */
static int tw_pack_region(twalk *w, const pack_region *r, char *err, size_t errlen) {
    tw_pack_free(w);
    int64_t nb = 0;
    for (int i = 0; i < r->n_tensors; i++) nb += r->t[i].n_blk + 1;
    twt *a = base_calloc((size_t)r->n_tensors + 1, sizeof *a, MEM_INDEX);
    uint64_t *h = a ? base_calloc((size_t)nb + 1, sizeof *h, MEM_INDEX) : NULL;
    if (!h) { base_free(a); return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); }
    a[r->n_tensors].blk = h;
    for (int i = 0; i < r->n_tensors; i++) {
        const pack_tensor *t = &r->t[i];
        const uint64_t rb = t->n_blk ? t->nbytes / (uint64_t)t->shape[0] : 0;
        a[i] = (twt){t->off, t->nbytes, (uint64_t)t->blk_rows * rb, h, h + 1};
        h += t->n_blk + 1;
    }
    tw_start(w, a, r->n_tensors);
    return STRATA_OK;
}

/* The recomputed tensor and block hashes of r against the manifest's. */
static int tw_pack_check(const twalk *w, const pack *p, const pack_region *r, const char *what, char *err, size_t errlen) {
    for (int i = 0; i < r->n_tensors; i++) {
        const pack_tensor *t = &r->t[i];
        const twt *x = &w->t[i];
        if (t->has_xxh3 && *x->h != t->xxh3)
            return base_fail(err, errlen, STRATA_ECORRUPT, "%s: tensor %s: checksum mismatch in %s bytes %llu..%llu (expected "
                             "%016llx, got %016llx): the manifest or the pack is corrupt; re-run strata pack --force", what,
                             t->name, p->trunk_path, (unsigned long long)(r->off + t->off),
                             (unsigned long long)(r->off + t->off + t->nbytes), (unsigned long long)t->xxh3,
                             (unsigned long long)*x->h);
        for (int64_t k = 0; k < t->n_blk; k++) {
            if (x->blk[k] == t->blk[k]) continue;
            const uint64_t a = r->off + t->off + (uint64_t)k * x->bb, b = a + x->bb < r->off + t->off + t->nbytes ? a + x->bb : r->off + t->off + t->nbytes;
            return base_fail(err, errlen, STRATA_ECORRUPT, "%s: tensor %s block %lld: checksum mismatch in %s bytes %llu..%llu "
                             "(expected %016llx, got %016llx): the manifest or the pack is corrupt; re-run strata pack --force",
                             what, t->name, (long long)k, p->trunk_path, (unsigned long long)a, (unsigned long long)b,
                             (unsigned long long)t->blk[k], (unsigned long long)x->blk[k]);
        }
    }
    return STRATA_OK;
}

/* The trunk regions (embed, layers, head) are one pass of the source stream over
 * trunk.bin, read with O_DIRECT and SRC_SLOTS reads in flight, each region hashed
 * as its pieces land. Demo pack, cold cache, 8 interleaved runs each: one 16 MB
 * read at a time hashed in between, median 1.65 GB/s; this, median 1.79 GB/s. */
static int verify_trunk(const pack *p, pack_progress_fn progress, void *ud, char *err, size_t errlen) {
    const int64_t nreg = p->n_layers + 2;
    sext *x = base_alloc((size_t)nreg * sizeof *x, MEM_INDEX);
    if (!x) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    for (int64_t i = 0; i < nreg; i++) x[i] = (sext){0, verify_reg(p, i)->off, verify_reg(p, i)->nbytes};
    sstream s;
    int rc = src_open_files(&s, 1, trunk_path, p, x, nreg, PACK_SRC_DIRECT, SRC_CHUNK, err, errlen);
    if (rc) { base_free(x); return rc; }
    twalk tw = {0};
    double t0 = base_now();
    for (int64_t i = 0; i < nreg && !rc; i++) {
        const pack_region *r = verify_reg(p, i);
        char what[64];
        if (i == 0) snprintf(what, sizeof what, "embed");
        else if (i - 1 < p->n_layers) snprintf(what, sizeof what, "layer %lld", (long long)(i - 1));
        else snprintf(what, sizeof what, "head");
        XXH3_state_t h;
        XXH3_64bits_reset(&h);
        /* the tensors' and blocks' own hashes too: a run checks those */
        rc = tw_pack_region(&tw, r, err, errlen);
        for (uint64_t left = r->nbytes; left && !rc;) {
            spiece pc;
            int got = src_next(&s, &pc, err, errlen);
            if (got <= 0 || pc.n > left) {
                char e2[1024];
                snprintf(e2, sizeof e2, "%s", got < 0 ? err : "read plan out of step");
                rc = base_fail(err, errlen, STRATA_ECORRUPT, "%s: unreadable (truncated pack?): %s", what, e2);
                break;
            }
            XXH3_64bits_update(&h, pc.p, pc.n);
            tw_bytes(&tw, pc.p, pc.n);
            left -= pc.n;
        }
        if (rc) break;
        uint64_t digest = XXH3_64bits_digest(&h);
        if (digest != r->xxh3)
            rc = base_fail(err, errlen, STRATA_ECORRUPT,
                           "%s: checksum mismatch in %s bytes %llu..%llu (expected %016llx, got %016llx): the pack is corrupt; re-run strata pack --force",
                           what, p->trunk_path, (unsigned long long)r->off, (unsigned long long)(r->off + r->nbytes),
                           (unsigned long long)r->xxh3, (unsigned long long)digest);
        if (!rc) rc = tw_pack_check(&tw, p, r, what, err, errlen);
        if (progress && i > 0) progress(ud, "trunk", r->off + r->nbytes, p->trunk_bytes, base_now() - t0);
    }
    tw_pack_free(&tw);
    src_close(&s);
    base_free(x);
    return rc;
}

/* A region whose source no longer hashes to the manifest's checksum: finds the
 * first tensor byte where the shards differ from trunk.bin (already verified
 * against the manifest) and names the tensor, the shard and the byte. */
static int source_mismatch(const pack *p, const pack_region *r, const st_index *ix, const char *what, uint64_t got,
                           char *err, size_t errlen) {
    const uint64_t B = 1u << 20;
    uint8_t *a = base_alloc(B, MEM_IO), *b = base_alloc(B, MEM_IO);
    int fd = vfs_open(p->trunk_path, O_RDONLY | O_CLOEXEC, 0);
    int found = 0;
    for (int i = 0; i < r->n_tensors && !found && a && b && fd >= 0; i++) {
        const st_tensor *s = st_find(ix, r->t[i].name);
        for (uint64_t o = 0; s && o < s->nbytes && !found; o += B) {
            uint64_t n = s->nbytes - o < B ? s->nbytes - o : B, k = 0;
            char e2[256];
            if (st_read(ix, s, o, a, n, e2, sizeof e2) || vfs_pread_full(fd, b, n, r->off + r->t[i].off + o)) break;
            if (!memcmp(a, b, n)) continue;
            while (a[k] == b[k]) k++;
            base_fail(err, errlen, STRATA_ECORRUPT,
                      "%s: tensor %s differs from the pack at %s byte %llu (the tensor is bytes %llu..%llu there): the model "
                      "changed after packing; re-run strata pack",
                      what, s->name, st_shard_path(ix, s->shard), (unsigned long long)(s->off + o + k),
                      (unsigned long long)s->off, (unsigned long long)(s->off + s->nbytes));
            found = 1;
        }
    }
    if (fd >= 0) close(fd);
    base_free(a);
    base_free(b);
    if (!found)
        base_fail(err, errlen, STRATA_ECORRUPT,
                  "%s: the model's shards hash to %016llx, the pack to %016llx: the model changed after packing; re-run strata pack",
                  what, (unsigned long long)got, (unsigned long long)r->xxh3);
    return STRATA_ECORRUPT;
}

/* The trunk as the shards would pack now, region by region, against the manifest:
 * trunk.bin can be intact while the model under it changed (same sizes, same
 * headers, other tensor bytes), and then a run from the pack and one from the
 * shards would differ. */
static int verify_source(const pack *p, const cfg *c, const st_index *ix, pack_progress_fn progress, void *ud,
                         char *err, size_t errlen) {
    layout l;
    int rc = layout_build(c, ix, &l, err, errlen);
    if (rc) return rc;
    uint64_t *h = base_calloc((size_t)(l.n_units + 1), sizeof *h, MEM_INDEX);
    pack_result res;
    memset(&res, 0, sizeof res);
    if (!h) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    else rc = write_trunk(&l, ix, NULL, 0, progress, ud, h, &res, err, errlen);
    for (int64_t i = 0; i < l.n_units + 1 && !rc; i++) {
        const pack_region *r = verify_reg(p, i);
        if (h[i] == r->xxh3) continue;
        char what[64];
        if (i == 0) snprintf(what, sizeof what, "embed");
        else if (i - 1 < p->n_layers) snprintf(what, sizeof what, "layer %lld", (long long)(i - 1));
        else snprintf(what, sizeof what, "head");
        rc = source_mismatch(p, r, ix, what, h[i], err, errlen);
    }
    base_free(h);
    layout_free(&l);
    return rc;
}

int pack_verify(const pack *p, const cfg *c, const st_index *ix, pack_progress_fn progress, void *ud,
                char *err, size_t errlen) {
    int rc = verify_trunk(p, progress, ud, err, errlen);
    if (!rc) rc = verify_source(p, c, ix, progress, ud, err, errlen);
    if (rc) return rc;
    uint64_t *xh = base_calloc((size_t)(p->n_moe * p->n_experts + 1), sizeof *xh, MEM_INDEX);
    if (!xh) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    rc = hash_experts(c, ix, xh, p->expert_xxh3, 0, progress, ud, NULL, err, errlen);
    base_free(xh);
    return rc;
}

double pack_measure_write_bw(const char *dir, uint64_t bytes) {
    struct statvfs sv;
    if (statvfs(dir, &sv) == 0 && bytes > (uint64_t)sv.f_bavail * sv.f_frsize / 4)
        bytes = (uint64_t)sv.f_bavail * sv.f_frsize / 4; /* never crowd a nearly full disk */
    bytes -= bytes % OUT_BYTES;
    if (bytes < 4ull * OUT_BYTES) return 0;
    wring w;
    double bw = 0;
    if (wring_init(&w, -1, OUT_BYTES, NULL, 0)) { wring_free(&w); return 0; }
    /* not zeros: a virtual disk may skip or compress zero blocks */
    uint64_t z = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < w.nbuf; i++)
        for (uint64_t k = 0; k < w.bsz / 8; k++) {
            z ^= z << 13; z ^= z >> 7; z ^= z << 17;
            memcpy(w.buf[i] + 8 * k, &z, 8);
        }
    /* timed like write_trunk: open, preallocate, write, fsync */
    double t0 = base_now();
    int fd = wfile_open(dir, 1, bytes, NULL, 0);
    if (fd < 0) { /* no O_TMPFILE here: a named file, unlinked at once */
        char path[2048];
        snprintf(path, sizeof path, "%s/.strata-bw.%d", dir, (int)getpid());
        fd = wfile_open(path, 0, bytes, NULL, 0);
        unlink(path);
    }
    if (fd >= 0) {
        w.fd = fd;
        int rc = 0;
        for (uint64_t o = 0; o < bytes && !rc; o += w.bsz) rc = wring_put(&w, w.bsz);
        if (!wring_drain(&w) && !rc && !vfs_fsync(fd)) bw = (double)bytes / (base_now() - t0);
    }
    wring_free(&w);
    if (fd >= 0) close(fd);
    return bw;
}
