/*
 * prefix.c: the prefix cache (see prefix.h).
 *
 * Owns: the RAM arena and its page chains, the index of snapshots in RAM and on
 * disk, the snapshot files. Does not own sequences (infer.c gives their state as
 * regions) or the choice of what to snapshot (api.c: prompt boundaries, the end
 * of a prompt, the end of a generation).
 *
 * Keys: (p, XXH3-64 of ids [0, p)). A lookup walks the prompt once with a
 * streaming XXH3, taking a digest at every position some snapshot holds, so it
 * costs O(prompt + snapshots); the ids themselves are compared before a RAM
 * snapshot is used and as the first region of a file is read, so a hash
 * collision can only cost a miss.
 */
#include "prefix.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include "base.h"
#include "vfs.h"

#define PFX_MAGIC "STRP"
#define PFX_VERSION 1u
#define PFX_HDR 40                /* magic, version, model id, p, body bytes, key */
#define PFX_MAX_RAM 1024          /* snapshots held in RAM at most */
#define PFX_MAX_DISK 4096         /* snapshot files indexed at most */
#define PFX_MAX_PARTS (CFG_MAX_LAYERS + 2)
#define PFX_TMP_AGE_S 600         /* a temporary file this old is a crash's leftover */
#define PFX_DEFAULT_DIR_BYTES (8ull << 30)
#define PFX_LOCK_NAME "strata-prefix.lock" /* flock'd by the process using the directory */

typedef struct pent {             /* a snapshot in RAM */
    int64_t pos;                  /* 0: free */
    uint64_t key, bytes, tick;
    int32_t first, n_pages;       /* page chain */
} pent;

typedef struct dent {             /* a snapshot file */
    int64_t pos;                  /* 0: free */
    uint64_t key, bytes, tick;    /* bytes: the file's size */
} dent;

typedef struct cand {             /* a lookup candidate */
    int64_t pos;
    int32_t idx;                  /* into ram (>= 0) or disk (-1 - i) */
} cand;

struct prefix_cache {
    engine *e;
    uint64_t model_id;
    /* RAM tier */
    uint8_t *arena;
    uint64_t page;                /* bytes per page */
    int32_t n_pages, n_free, free_head;
    int32_t *next;                /* (n_pages) chain links, -1 ends */
    pent ram[PFX_MAX_RAM];
    /* disk tier */
    char dir[2048];
    int lock_fd;                  /* PFX_LOCK_NAME in dir, flock'd while open; -1 none */
    uint64_t dir_bytes, disk_used;
    dent *disk;                   /* (PFX_MAX_DISK) */
    cand *cands;                  /* (PFX_MAX_RAM + PFX_MAX_DISK) lookup scratch */
    session_part parts[PFX_MAX_PARTS];
    XXH3_state_t *xs;
    uint64_t clock;
    prefix_stats st;
    char err[512];
};

static int pfail(prefix_cache *pc, int rc, const char *fmt, ...) ST_PRINTF(3, 4);
static int pfail(prefix_cache *pc, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pc->err, sizeof pc->err, fmt, ap);
    va_end(ap);
    return rc;
}

/* ================================================================= sizes */

static uint64_t page_size(uint64_t ram) {
    uint64_t p = 4096;
    while (p < (1u << 20) && p * 2 * 512 <= ram) p *= 2;
    return p;
}

uint64_t prefix_alloc_bytes(const prefix_opts *o) {
    if (!o->ram_bytes && !o->dir) return 0;
    const uint64_t pg = page_size(o->ram_bytes), n = o->ram_bytes / pg;
    return sizeof(prefix_cache) + n * pg + n * sizeof(int32_t) + (uint64_t)PFX_MAX_DISK * sizeof(dent) +
           (uint64_t)(PFX_MAX_RAM + PFX_MAX_DISK) * sizeof(cand) + 4096 /* XXH3 state */;
}

/* Body bytes of a snapshot at pos, and s's regions for it in pc->parts. */
static int parts_of(prefix_cache *pc, session *s, int64_t pos, uint64_t *bytes) {
    int n = session_parts(s, pos, pc->parts, PFX_MAX_PARTS);
    uint64_t b = 0;
    for (int i = 0; i < n; i++) b += pc->parts[i].n;
    *bytes = b;
    return n;
}

/* =============================================================== pages */

typedef struct pcur { prefix_cache *pc; int32_t page; uint64_t off; } pcur;

/* Copies n bytes between the chain at c and p (to_pages: into the chain). */
static void pcur_copy(pcur *c, void *p, uint64_t n, int to_pages) {
    uint8_t *b = p;
    while (n) {
        if (c->off == c->pc->page) { c->page = c->pc->next[c->page]; c->off = 0; }
        uint8_t *pg = c->pc->arena + (uint64_t)c->page * c->pc->page + c->off;
        const uint64_t k = c->pc->page - c->off < n ? c->pc->page - c->off : n;
        if (to_pages) memcpy(pg, b, k);
        else memcpy(b, pg, k);
        b += k;
        c->off += k;
        n -= k;
    }
}

/* 1 when the chain at c holds the n bytes at p next (c advances). */
static int pcur_equal(pcur *c, const void *p, uint64_t n) {
    const uint8_t *b = p;
    while (n) {
        if (c->off == c->pc->page) { c->page = c->pc->next[c->page]; c->off = 0; }
        const uint8_t *pg = c->pc->arena + (uint64_t)c->page * c->pc->page + c->off;
        const uint64_t k = c->pc->page - c->off < n ? c->pc->page - c->off : n;
        if (memcmp(pg, b, k)) return 0;
        b += k;
        c->off += k;
        n -= k;
    }
    return 1;
}

static void ram_free_entry(prefix_cache *pc, pent *x) {
    int32_t p = x->first;
    for (int32_t i = 0; i < x->n_pages; i++) {
        int32_t nx = pc->next[p];
        pc->next[p] = pc->free_head;
        pc->free_head = p;
        pc->n_free++;
        p = nx;
    }
    pc->st.ram_used -= (uint64_t)x->n_pages * pc->page;
    pc->st.n_ram--;
    memset(x, 0, sizeof *x);
}

/* ================================================================ files */

static void file_name(const prefix_cache *pc, int64_t pos, uint64_t key, char *out, size_t n) {
    snprintf(out, n, "%s/%016llx-%lld-%016llx.strp", pc->dir, (unsigned long long)pc->model_id, (long long)pos,
             (unsigned long long)key);
}

static dent *disk_find(prefix_cache *pc, int64_t pos, uint64_t key) {
    for (int i = 0; i < PFX_MAX_DISK; i++)
        if (pc->disk[i].pos == pos && pc->disk[i].key == key) return &pc->disk[i];
    return NULL;
}

static void disk_drop(prefix_cache *pc, dent *d, int unlink_file) {
    if (unlink_file) {
        char path[2200];
        file_name(pc, d->pos, d->key, path, sizeof path);
        unlink(path);
    }
    pc->disk_used -= d->bytes;
    pc->st.n_disk--;
    memset(d, 0, sizeof *d);
}

static dent *disk_oldest(prefix_cache *pc) {
    dent *o = NULL;
    for (int i = 0; i < PFX_MAX_DISK; i++)
        if (pc->disk[i].pos && (!o || pc->disk[i].tick < o->tick)) o = &pc->disk[i];
    return o;
}

/* The byte source of a file's body: a sequence's regions or a RAM chain. */
typedef struct body_src {
    int n_parts;                  /* > 0: pc->parts */
    const pent *x;                /* else this chain */
} body_src;

typedef struct wfile { prefix_cache *pc; int fd; int err_no; uint64_t n; } wfile;

static void wf_put(wfile *w, const void *p, uint64_t n) {
    if (w->err_no || !n) return;
    XXH3_64bits_update(w->pc->xs, p, (size_t)n);
    w->err_no = vfs_write_full(w->fd, p, n);
    w->n += n;
}

/* Writes the snapshot (pos, key, bytes) from src as a file, making room under
 * the bound first. 0 or a negative STRATA_E* (message in pc->err). */
static int disk_put(prefix_cache *pc, int64_t pos, uint64_t key, uint64_t bytes, const body_src *src) {
    const uint64_t fsize = PFX_HDR + bytes + 8;
    if (fsize > pc->dir_bytes)
        return pfail(pc, STRATA_EBUDGET, "prefix cache: a snapshot of %llu bytes exceeds the directory's bound of %llu",
                     (unsigned long long)fsize, (unsigned long long)pc->dir_bytes);
    dent *slot = NULL;
    for (int i = 0; i < PFX_MAX_DISK && !slot; i++)
        if (!pc->disk[i].pos) slot = &pc->disk[i];
    while (pc->disk_used + fsize > pc->dir_bytes || !slot) {
        dent *o = disk_oldest(pc);
        if (!o) break;
        disk_drop(pc, o, 1);
        if (!slot) slot = o;
    }
    char path[2200], tmp[2300];
    file_name(pc, pos, key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = vfs_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return pfail(pc, STRATA_EIO, "prefix cache: %s: %s", tmp, strerror(errno));
    wfile w = {pc, fd, 0, 0};
    XXH3_64bits_reset(pc->xs);
    uint8_t hdr[PFX_HDR];
    const uint32_t ver = PFX_VERSION;
    memcpy(hdr, PFX_MAGIC, 4);
    memcpy(hdr + 4, &ver, 4);
    memcpy(hdr + 8, &pc->model_id, 8);
    memcpy(hdr + 16, &pos, 8);
    memcpy(hdr + 24, &bytes, 8);
    memcpy(hdr + 32, &key, 8);
    wf_put(&w, hdr, PFX_HDR);
    if (src->n_parts > 0) {
        for (int i = 0; i < src->n_parts; i++) wf_put(&w, pc->parts[i].p, pc->parts[i].n);
    } else {
        int32_t p = src->x->first;
        for (uint64_t left = bytes; left; p = pc->next[p]) {
            const uint64_t k = left < pc->page ? left : pc->page;
            wf_put(&w, pc->arena + (uint64_t)p * pc->page, k);
            left -= k;
        }
    }
    uint64_t h = XXH3_64bits_digest(pc->xs);
    if (!w.err_no) w.err_no = vfs_write_full(fd, &h, 8);
    /* no fsync: a file cut short by a crash fails its size or checksum when read
     * (a miss), and the engine thread does not wait for the disk here */
    if (close(fd) && !w.err_no) w.err_no = errno;
    if (!w.err_no && vfs_rename(tmp, path)) w.err_no = errno;
    if (w.err_no) {
        unlink(tmp);
        return pfail(pc, STRATA_EIO, "prefix cache: writing %s: %s", path, strerror(w.err_no));
    }
    if (!slot) { /* the index was full and nothing could leave it: forget the file */
        unlink(path);
        return pfail(pc, STRATA_EBUSY, "prefix cache: the directory index is full");
    }
    *slot = (dent){pos, key, fsize, ++pc->clock};
    pc->disk_used += fsize;
    pc->st.n_disk++;
    pc->st.spills++;
    pc->st.disk_written += fsize;
    return 0;
}

typedef struct rfile { prefix_cache *pc; int fd; uint64_t off; int err_no, eof; } rfile;

static void rf_get(rfile *r, void *p, uint64_t n) {
    if (r->err_no || r->eof || !n) return;
    int e = vfs_pread_full(r->fd, p, n, r->off);
    if (e) { if (e > 0) r->err_no = e; else r->eof = 1; return; }
    XXH3_64bits_update(r->pc->xs, p, (size_t)n);
    r->off += n;
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* Reads the snapshot d into s (reset by the caller) when its file passes every
 * check against ids; 0, or a negative STRATA_E* with pc->err naming the file. */
static int disk_load(prefix_cache *pc, const dent *d, session *s, const int32_t *ids) {
    char path[2200];
    file_name(pc, d->pos, d->key, path, sizeof path);
    uint64_t bytes = 0;
    const int np = parts_of(pc, s, d->pos, &bytes);
    if (np < 0) return pfail(pc, STRATA_EINVAL, "prefix cache: %s: %lld positions exceed the sequence", path, (long long)d->pos);
    int fd = vfs_open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0);
    if (fd < 0) return pfail(pc, STRATA_EIO, "prefix cache: %s: %s", path, strerror(errno));
    int rc = 0;
    struct stat sb;
    rfile r = {pc, fd, 0, 0, 0};
    uint8_t hdr[PFX_HDR];
    uint32_t ver;
    uint64_t mid, body, key, want, h = 0;
    int64_t pos;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) { rc = pfail(pc, STRATA_EFORMAT, "prefix cache: %s: not a regular file", path); goto out; }
    if ((uint64_t)sb.st_size != PFX_HDR + bytes + 8) {
        rc = pfail(pc, STRATA_EFORMAT, "prefix cache: %s: %lld bytes, a snapshot of %lld positions of this model has %llu", path,
                   (long long)sb.st_size, (long long)d->pos, (unsigned long long)(PFX_HDR + bytes + 8));
        goto out;
    }
    XXH3_64bits_reset(pc->xs);
    rf_get(&r, hdr, PFX_HDR);
    if (r.err_no || r.eof) goto io;
    memcpy(&ver, hdr + 4, 4);
    memcpy(&mid, hdr + 8, 8);
    memcpy(&pos, hdr + 16, 8);
    memcpy(&body, hdr + 24, 8);
    memcpy(&key, hdr + 32, 8);
    if (memcmp(hdr, PFX_MAGIC, 4) || ver != PFX_VERSION) { rc = pfail(pc, STRATA_EFORMAT, "prefix cache: %s: not a strata prefix snapshot (version %u)", path, ver); goto out; }
    if (mid != pc->model_id) { rc = pfail(pc, STRATA_EFORMAT, "prefix cache: %s: written for a different model", path); goto out; }
    if (pos != d->pos || key != d->key || body != bytes) { rc = pfail(pc, STRATA_EFORMAT, "prefix cache: %s: its header does not match its name", path); goto out; }
    /* the ids first: a file holding other tokens is refused before the rest is read */
    rf_get(&r, pc->parts[0].p, pc->parts[0].n);
    if (r.err_no || r.eof) goto io;
    if (memcmp(pc->parts[0].p, ids, pc->parts[0].n)) { rc = pfail(pc, STRATA_EFORMAT, "prefix cache: %s: holds other tokens than its key says", path); goto out; }
    for (int i = 1; i < np; i++) {
        rf_get(&r, pc->parts[i].p, pc->parts[i].n);
        if (r.err_no || r.eof) goto io;
        if (!all_finite(pc->parts[i].p, pc->parts[i].n / sizeof(float))) {
            rc = pfail(pc, STRATA_EFORMAT, "prefix cache: %s: non-finite state values", path);
            goto out;
        }
    }
    want = XXH3_64bits_digest(pc->xs);
    if (vfs_pread_full(fd, &h, 8, r.off)) goto io;
    if (h != want) { rc = pfail(pc, STRATA_ECORRUPT, "prefix cache: %s: checksum mismatch", path); goto out; }
    pc->st.disk_read += (uint64_t)sb.st_size;
    goto out;
io:
    rc = r.eof ? pfail(pc, STRATA_EFORMAT, "prefix cache: %s: truncated", path)
               : pfail(pc, STRATA_EIO, "prefix cache: %s: read failed: %s", path, strerror(r.err_no ? r.err_no : EIO));
out:
    close(fd);
    return rc;
}

/* "<16 hex>-<digits>-<16 hex>.strp" -> fields; 0 when the name is not that. */
static int parse_name(const char *nm, uint64_t *mid, int64_t *pos, uint64_t *key, int *tmp) {
    size_t n = strlen(nm);
    if (n < 16 + 1 + 1 + 1 + 16 + 5 || n > 80) return 0;
    for (int i = 0; i < 16; i++) if (!strchr("0123456789abcdef", nm[i]) || !nm[i]) return 0;
    if (nm[16] != '-') return 0;
    size_t i = 17;
    int64_t p = 0;
    while (nm[i] >= '0' && nm[i] <= '9' && i < 17 + 12) p = p * 10 + (nm[i++] - '0');
    if (i == 17 || nm[i] != '-') return 0;
    i++;
    for (int k = 0; k < 16; k++) if (!nm[i + k] || !strchr("0123456789abcdef", nm[i + k])) return 0;
    if (strncmp(nm + i + 16, ".strp", 5)) return 0;
    *tmp = nm[i + 21] != 0;
    if (*tmp && strncmp(nm + i + 21, ".tmp.", 5)) return 0;
    if (!*tmp && nm[i + 21]) return 0;
    char h[17];
    memcpy(h, nm, 16);
    h[16] = 0;
    *mid = strtoull(h, NULL, 16);
    memcpy(h, nm + i, 16);
    *key = strtoull(h, NULL, 16);
    *pos = p;
    return p > 0;
}

/* Indexes this model's files in the directory (oldest first out). */
static void disk_scan(prefix_cache *pc) {
    DIR *dd = opendir(pc->dir);
    if (!dd) return;
    struct dirent *de;
    uint64_t max_t = 0;
    const time_t now = time(NULL);
    while ((de = readdir(dd))) {
        uint64_t mid, key;
        int64_t pos;
        int tmp;
        if (!parse_name(de->d_name, &mid, &pos, &key, &tmp) || mid != pc->model_id) continue;
        char path[2400];
        snprintf(path, sizeof path, "%s/%s", pc->dir, de->d_name);
        struct stat sb;
        if (lstat(path, &sb) || !S_ISREG(sb.st_mode)) continue;
        if (tmp) { /* an interrupted write (ours, by name): old ones are removed */
            if (now - sb.st_mtime > PFX_TMP_AGE_S) unlink(path);
            continue;
        }
        if ((uint64_t)sb.st_size < PFX_HDR + 8 || disk_find(pc, pos, key)) continue;
        dent *slot = NULL;
        for (int i = 0; i < PFX_MAX_DISK && !slot; i++)
            if (!pc->disk[i].pos) slot = &pc->disk[i];
        if (!slot) {
            dent *o = disk_oldest(pc);
            if (o && o->tick < (uint64_t)sb.st_mtime) { disk_drop(pc, o, 1); slot = o; }
            else { unlink(path); continue; }
        }
        *slot = (dent){pos, key, (uint64_t)sb.st_size, (uint64_t)sb.st_mtime};
        if ((uint64_t)sb.st_mtime > max_t) max_t = (uint64_t)sb.st_mtime;
        pc->disk_used += (uint64_t)sb.st_size;
        pc->st.n_disk++;
    }
    closedir(dd);
    while (pc->disk_used > pc->dir_bytes) disk_drop(pc, disk_oldest(pc), 1);
    pc->clock = max_t + 1;
}

/* ================================================================ lock */

/* The pid a holder wrote into the lock file ("" when unknown). */
static void lock_holder(int fd, char *pid, size_t n) {
    char b[32];
    ssize_t k = pread(fd, b, sizeof b - 1, 0);
    size_t m = 0;
    while (k > 0 && m < (size_t)k && m + 1 < n && b[m] >= '0' && b[m] <= '9') { pid[m] = b[m]; m++; }
    pid[m] = 0;
}

static int busy(const char *dir, const char *path, int fd, char *err, size_t errlen) {
    char pid[24];
    lock_holder(fd, pid, sizeof pid);
    return base_fail(err, errlen, STRATA_EBUSY,
                     "prefix cache: directory %s is in use by another strata process (%s%s%s holds %s); two processes "
                     "sharing one directory would trim and delete each other's snapshot files: give each its own directory",
                     dir, pid[0] ? "pid " : "", pid, pid[0] ? "" : "it", path);
}

/* Takes the directory's lock for pc (the file is created; it stays). Another
 * process (or another open cache in this one) holding it: STRATA_EBUSY naming
 * the directory and the holder's pid. The lock goes with the descriptor, so a
 * process that dies releases it. */
static int dir_lock(prefix_cache *pc, char *err, size_t errlen) {
    char path[2200];
    snprintf(path, sizeof path, "%s/" PFX_LOCK_NAME, pc->dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return base_fail(err, errlen, STRATA_EIO, "prefix cache: cannot open %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int rc = errno == EWOULDBLOCK ? busy(pc->dir, path, fd, err, errlen)
                                      : base_fail(err, errlen, STRATA_EIO, "prefix cache: cannot lock %s: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    char pid[24];
    const int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)n, 0) != n) { /* the pid is for messages only */ }
    pc->lock_fd = fd;
    return 0;
}

int prefix_dir_check(const char *dir, char *err, size_t errlen) {
    char path[2200];
    if (snprintf(path, sizeof path, "%s/" PFX_LOCK_NAME, dir) >= (int)sizeof path) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return 0; /* no lock file: nobody holds it */
    int rc = 0;
    if (flock(fd, LOCK_SH | LOCK_NB)) rc = errno == EWOULDBLOCK ? busy(dir, path, fd, err, errlen) : 0;
    close(fd); /* releases a shared lock taken here */
    return rc;
}

/* ============================================================ open/close */

int prefix_open(prefix_cache **out, engine *e, const prefix_opts *o, char *err, size_t errlen) {
    *out = NULL;
    prefix_cache *pc = base_calloc(1, sizeof *pc, MEM_CACHE);
    if (!pc) return base_fail(err, errlen, STRATA_ENOMEM, "prefix cache: out of memory");
    pc->e = e;
    pc->model_id = o->model_id;
    pc->page = page_size(o->ram_bytes);
    pc->n_pages = (int32_t)(o->ram_bytes / pc->page);
    pc->free_head = -1;
    pc->lock_fd = -1;
    pc->st.ram_bytes = (uint64_t)pc->n_pages * pc->page;
    int rc = 0;
    pc->xs = XXH3_createState();
    pc->disk = base_calloc(PFX_MAX_DISK, sizeof *pc->disk, MEM_CACHE);
    pc->cands = base_alloc((PFX_MAX_RAM + PFX_MAX_DISK) * sizeof *pc->cands, MEM_CACHE);
    if (!pc->xs || !pc->disk || !pc->cands) { rc = base_fail(err, errlen, STRATA_ENOMEM, "prefix cache: out of memory"); goto fail; }
    if (pc->n_pages) {
        pc->arena = base_alloc((size_t)pc->n_pages * pc->page, MEM_CACHE);
        pc->next = base_alloc((size_t)pc->n_pages * sizeof *pc->next, MEM_CACHE);
        if (!pc->arena || !pc->next) {
            rc = base_fail(err, errlen, STRATA_ENOMEM, "prefix cache: cannot allocate %llu bytes of RAM for snapshots",
                           (unsigned long long)o->ram_bytes);
            goto fail;
        }
        for (int32_t i = pc->n_pages - 1; i >= 0; i--) { pc->next[i] = pc->free_head; pc->free_head = i; }
        pc->n_free = pc->n_pages;
    }
    if (o->dir) {
        if (snprintf(pc->dir, sizeof pc->dir, "%s", o->dir) >= (int)sizeof pc->dir) {
            rc = base_fail(err, errlen, STRATA_EINVAL, "prefix cache: directory path too long");
            goto fail;
        }
        if ((rc = base_mkdir_p(o->dir, err, errlen))) goto fail;
        if ((rc = dir_lock(pc, err, errlen))) goto fail; /* before the scan, which trims and deletes */
        pc->dir_bytes = o->dir_bytes ? o->dir_bytes : PFX_DEFAULT_DIR_BYTES;
        pc->st.dir_bytes = pc->dir_bytes;
        disk_scan(pc);
    }
    pc->clock++;
    *out = pc;
    return 0;
fail:
    prefix_close(pc);
    return rc;
}

void prefix_close(prefix_cache *pc) {
    if (!pc) return;
    if (pc->xs) XXH3_freeState(pc->xs);
    if (pc->lock_fd >= 0) close(pc->lock_fd);
    base_free(pc->arena);
    base_free(pc->next);
    base_free(pc->disk);
    base_free(pc->cands);
    base_free(pc);
}

/* ================================================================ store */

/* Makes room for n_pages pages and a free entry, spilling what leaves to disk.
 * Returns the entry, or NULL when the arena is too small. */
static pent *ram_make_room(prefix_cache *pc, int32_t n_pages) {
    if (n_pages > pc->n_pages) return NULL;
    for (;;) {
        pent *free_e = NULL, *lru = NULL;
        for (int i = 0; i < PFX_MAX_RAM; i++) {
            pent *x = &pc->ram[i];
            if (!x->pos) { if (!free_e) free_e = x; }
            else if (!lru || x->tick < lru->tick) lru = x;
        }
        if (free_e && pc->n_free >= n_pages) return free_e;
        if (!lru) return NULL;
        /* a snapshot is in one tier only (a store finds it in either first) */
        if (pc->dir[0]) {
            body_src src = {0, lru};
            int rc = disk_put(pc, lru->pos, lru->key, lru->bytes, &src);
            if (rc) pc->st.failed++;
            if (rc == STRATA_EIO) LOGW("%s", pc->err);
        }
        ram_free_entry(pc, lru);
    }
}

int prefix_store(prefix_cache *pc, session *s) {
    const int64_t pos = session_pos(s);
    if (pos <= 0) return 0;
    const uint64_t key = XXH3_64bits(session_tokens(s), (size_t)pos * sizeof(int32_t));
    for (int i = 0; i < PFX_MAX_RAM; i++)
        if (pc->ram[i].pos == pos && pc->ram[i].key == key) { pc->ram[i].tick = ++pc->clock; return 0; }
    dent *d = pc->dir[0] ? disk_find(pc, pos, key) : NULL;
    if (d) { d->tick = ++pc->clock; return 0; }
    uint64_t bytes = 0;
    const int np = parts_of(pc, s, pos, &bytes);
    if (np < 0) return pfail(pc, STRATA_EINVAL, "prefix cache: bad position %lld", (long long)pos);
    const uint64_t need = (bytes + pc->page - 1) / pc->page;
    pent *x = need <= (uint64_t)pc->n_pages ? ram_make_room(pc, (int32_t)need) : NULL;
    if (x) {
        /* the chain: pages off the free list, then the regions copied in */
        x->first = pc->free_head;
        int32_t p = pc->free_head;
        for (uint64_t i = 1; i < need; i++) p = pc->next[p];
        pc->free_head = pc->next[p];
        pc->next[p] = -1;
        pc->n_free -= (int32_t)need;
        *x = (pent){pos, key, bytes, ++pc->clock, x->first, (int32_t)need};
        pcur c = {pc, x->first, 0};
        for (int i = 0; i < np; i++) pcur_copy(&c, pc->parts[i].p, pc->parts[i].n, 1);
        pc->st.ram_used += need * pc->page;
        pc->st.n_ram++;
        pc->st.stores++;
        return 0;
    }
    if (!pc->dir[0]) {
        pc->st.failed++;
        return pfail(pc, STRATA_EBUDGET, "prefix cache: a snapshot of %llu bytes does not fit in %llu bytes of RAM",
                     (unsigned long long)bytes, (unsigned long long)pc->st.ram_bytes);
    }
    /* too large for the arena: straight from the sequence to disk */
    body_src src = {np, NULL};
    int rc = disk_put(pc, pos, key, bytes, &src);
    if (rc) {
        pc->st.failed++;
        if (rc == STRATA_EIO) LOGW("%s", pc->err);
        return rc;
    }
    pc->st.stores++;
    return 0;
}

/* ============================================================== restore */

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx); /* at a tie RAM (idx >= 0) last: tried first */
}

int64_t prefix_restore(prefix_cache *pc, session *s, const int32_t *ids, int64_t n) {
    pc->st.lookups++;
    const int64_t cap = n < session_max_ctx(s) ? n : session_max_ctx(s);
    int nc = 0;
    for (int i = 0; i < PFX_MAX_RAM; i++)
        if (pc->ram[i].pos && pc->ram[i].pos <= cap) pc->cands[nc++] = (cand){pc->ram[i].pos, i};
    for (int i = 0; pc->dir[0] && i < PFX_MAX_DISK; i++)
        if (pc->disk[i].pos && pc->disk[i].pos <= cap) pc->cands[nc++] = (cand){pc->disk[i].pos, -1 - i};
    if (!nc) return 0;
    qsort(pc->cands, (size_t)nc, sizeof *pc->cands, cand_cmp);
    /* one pass of the streaming hash over the prompt; a candidate whose key
     * differs from the digest at its position is dropped (pos = 0) */
    XXH3_64bits_reset(pc->xs);
    int64_t at = 0;
    uint64_t dig = 0;
    for (int k = 0; k < nc; k++) {
        cand *c = &pc->cands[k];
        if (c->pos != at) {
            XXH3_64bits_update(pc->xs, ids + at, (size_t)(c->pos - at) * sizeof(int32_t));
            at = c->pos;
            dig = XXH3_64bits_digest(pc->xs);
        }
        const uint64_t key = c->idx >= 0 ? pc->ram[c->idx].key : pc->disk[-1 - c->idx].key;
        if (key != dig) c->pos = 0;
    }
    int disk_fail = 0;
    for (int k = nc - 1; k >= 0 && disk_fail < 3; k--) {
        const cand *c = &pc->cands[k];
        if (!c->pos) continue;
        if (c->idx >= 0) {
            pent *x = &pc->ram[c->idx];
            pcur cu = {pc, x->first, 0};
            if (!pcur_equal(&cu, ids, (uint64_t)x->pos * sizeof(int32_t))) continue; /* a hash collision */
            uint64_t bytes;
            const int np = parts_of(pc, s, x->pos, &bytes);
            if (np < 0 || bytes != x->bytes) continue;
            pcur c2 = {pc, x->first, 0};
            for (int i = 0; i < np; i++) pcur_copy(&c2, pc->parts[i].p, pc->parts[i].n, 0);
            x->tick = ++pc->clock;
        } else {
            dent *d = &pc->disk[-1 - c->idx];
            int rc = disk_load(pc, d, s, ids);
            if (rc) {
                session_reset(s);
                pc->st.rejected++;
                disk_fail++;
                LOGW("%s; not used (a miss), removed", pc->err);
                disk_drop(pc, d, rc != STRATA_EIO);
                continue;
            }
            d->tick = ++pc->clock;
            pc->st.disk_hits++;
        }
        session_restored(s, c->pos);
        pc->st.hits++;
        pc->st.tokens += (uint64_t)c->pos;
        return c->pos;
    }
    return 0;
}

/* ================================================================ stats */

void prefix_get_stats(const prefix_cache *pc, prefix_stats *st) {
    *st = pc->st;
    st->disk_used = pc->disk_used;
    st->ram_hits = st->hits - st->disk_hits;
}

void prefix_reset_stats(prefix_cache *pc) {
    const prefix_stats k = pc->st;
    memset(&pc->st, 0, sizeof pc->st);
    pc->st.ram_used = k.ram_used;
    pc->st.ram_bytes = k.ram_bytes;
    pc->st.dir_bytes = k.dir_bytes;
    pc->st.n_ram = k.n_ram;
    pc->st.n_disk = k.n_disk;
}

const char *prefix_errmsg(const prefix_cache *pc) { return pc->err; }
