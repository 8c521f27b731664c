/*
 * base.c: errors, budgeted allocator, logging, strict parsers, clocks, files.
 *
 * The allocator prefixes every block with a 32-byte header (size, tag, offset to
 * the raw pointer) so base_free needs no size and aligned blocks share the path.
 * Counters are C11 atomics: one relaxed add per call, cheap next to malloc.
 */
#include "base.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "vfs.h"

/* ======================================================================== errors */

const char *strata_errstr(int rc) {
    switch (rc) {
    case STRATA_OK: return "ok";
    case STRATA_EIO: return "I/O error";
    case STRATA_ENOMEM: return "out of memory";
    case STRATA_EFORMAT: return "format error";
    case STRATA_EBUDGET: return "over the RAM budget";
    case STRATA_EINVAL: return "invalid argument";
    case STRATA_EBUSY: return "busy";
    case STRATA_ECORRUPT: return "checksum mismatch";
    default: return "unknown error";
    }
}

void base_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "strata: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}

int base_vfail(char *err, size_t errlen, int rc, const char *fmt, va_list ap) {
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    return rc;
}

int base_fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    base_vfail(err, errlen, rc, fmt, ap);
    va_end(ap);
    return rc;
}

static void sbuf_vprintf(sbuf *b, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *s = base_realloc(b->s, cap, MEM_MISC);
        if (!s) return; /* keep what we have; messages are best effort */
        b->s = s;
        b->cap = cap;
    }
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    b->len += (size_t)n;
}

void sbuf_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sbuf_vprintf(b, fmt, ap);
    va_end(ap);
}

void sbuf_line(sbuf *b, const char *fmt, ...) {
    va_list ap;
    sbuf_printf(b, "  - ");
    va_start(ap, fmt);
    sbuf_vprintf(b, fmt, ap);
    va_end(ap);
    sbuf_printf(b, "\n");
    b->n++;
}

void sbuf_free(sbuf *b) {
    base_free(b->s);
    memset(b, 0, sizeof *b);
}

/* ===================================================================== allocator */

typedef struct {
    uint64_t size;   /* user bytes */
    uint32_t tag;
    uint32_t magic;
    uint64_t offset; /* bytes from the raw malloc pointer to this header */
    uint64_t pad;
} mem_hdr;
_Static_assert(sizeof(mem_hdr) == 32, "header keeps 32-byte alignment");
#define MEM_MAGIC 0x5354524Du

static _Atomic uint64_t g_used, g_peak, g_limit, g_guard_viol, g_fail_after, g_n_allocs;
static _Atomic uint64_t g_tag_used[MEM_TAG_COUNT];
/* Per thread: a decode loop guards its own thread only, so two models driven
 * from two threads never see each other's guard. */
static _Thread_local int t_guard;

static const char *k_tag_names[MEM_TAG_COUNT] = {
    "misc", "json", "index", "weights", "trunk", "cache", "kv",
    "state", "scratch", "io", "tok", "http"};

const char *base_mem_tag_name(int tag) {
    return (tag >= 0 && tag < MEM_TAG_COUNT) ? k_tag_names[tag] : "?";
}

/* force: an allocation that must not be refused by the test countdown or the
 * limit (base_alloc_unrefused); still counted. */
static int mem_reserve(uint64_t bytes, int tag, int force) {
    if (t_guard) {
        atomic_fetch_add(&g_guard_viol, 1);
#ifndef NDEBUG
        fprintf(stderr, "strata: allocation of %llu bytes (%s) inside the decode guard\n",
                (unsigned long long)bytes, base_mem_tag_name(tag));
        abort();
#endif
    }
    atomic_fetch_add_explicit(&g_n_allocs, 1, memory_order_relaxed);
    uint64_t fa = force ? 0 : atomic_load(&g_fail_after);
    if (fa) {
        if (fa == 1) { atomic_store(&g_fail_after, 0); return 0; }
        atomic_fetch_sub(&g_fail_after, 1);
    }
    uint64_t limit = atomic_load(&g_limit);
    uint64_t used = atomic_fetch_add(&g_used, bytes) + bytes;
    if (limit && used > limit && !force) {
        atomic_fetch_sub(&g_used, bytes);
        return 0;
    }
    atomic_fetch_add(&g_tag_used[tag], bytes);
    uint64_t peak = atomic_load(&g_peak);
    while (used > peak && !atomic_compare_exchange_weak(&g_peak, &peak, used)) {}
    return 1;
}

static void mem_release(uint64_t bytes, int tag) {
    atomic_fetch_sub(&g_used, bytes);
    atomic_fetch_sub(&g_tag_used[tag], bytes);
}

static void *alloc_aligned(size_t bytes, size_t align, int tag, int force) {
    ST_ASSERT(tag >= 0 && tag < MEM_TAG_COUNT);
    if (align < 32) align = 32;
    ST_ASSERT((align & (align - 1)) == 0 && align <= (1u << 20));
    if (bytes > SIZE_MAX / 2) return NULL;
    if (!mem_reserve(bytes, tag, force)) return NULL;
    size_t total = bytes + sizeof(mem_hdr) + align;
    uint8_t *raw = malloc(total);
    if (!raw) { mem_release(bytes, tag); return NULL; }
    uintptr_t user = ((uintptr_t)raw + sizeof(mem_hdr) + align - 1) & ~(uintptr_t)(align - 1);
    mem_hdr *h = (mem_hdr *)(user - sizeof(mem_hdr));
    h->size = bytes;
    h->tag = (uint32_t)tag;
    h->magic = MEM_MAGIC;
    h->offset = (uint64_t)((uint8_t *)h - raw);
    return (void *)user;
}

void *base_alloc_aligned(size_t bytes, size_t align, int tag) { return alloc_aligned(bytes, align, tag, 0); }
void *base_alloc(size_t bytes, int tag) { return alloc_aligned(bytes, 32, tag, 0); }
void *base_alloc_unrefused(size_t bytes, int tag) { return alloc_aligned(bytes, 32, tag, 1); }

void *base_calloc(size_t n, size_t size, int tag) {
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = base_alloc(n * size, tag);
    if (p) memset(p, 0, n * size);
    return p;
}

static mem_hdr *hdr_of(void *p) {
    mem_hdr *h = (mem_hdr *)((uint8_t *)p - sizeof(mem_hdr));
    ST_ASSERT(h->magic == MEM_MAGIC);
    return h;
}

void base_free(void *p) {
    if (!p) return;
    mem_hdr *h = hdr_of(p);
    mem_release(h->size, (int)h->tag);
    h->magic = 0;
    free((uint8_t *)h - h->offset);
}

void *base_realloc(void *p, size_t bytes, int tag) {
    if (!p) return base_alloc(bytes, tag);
    mem_hdr *h = hdr_of(p);
    void *q = base_alloc(bytes, tag);
    if (!q) return NULL;
    memcpy(q, p, h->size < bytes ? h->size : bytes);
    base_free(p);
    return q;
}

char *base_strdup(const char *s, int tag) {
    size_t n = strlen(s) + 1;
    char *d = base_alloc(n, tag);
    if (d) memcpy(d, s, n);
    return d;
}

void base_mem_set_limit(uint64_t bytes) { atomic_store(&g_limit, bytes); }
uint64_t base_mem_limit(void) { return atomic_load(&g_limit); }
uint64_t base_mem_used(void) { return atomic_load(&g_used); }
uint64_t base_mem_peak(void) { return atomic_load(&g_peak); }
uint64_t base_mem_used_tag(int tag) { return atomic_load(&g_tag_used[tag]); }
void base_mem_guard(int on) { t_guard = on; }
uint64_t base_mem_guard_violations(void) { return atomic_load(&g_guard_viol); }
void base_mem_fail_after(uint64_t n) { atomic_store(&g_fail_after, n); }
uint64_t base_mem_allocs(void) { return atomic_load(&g_n_allocs); }

/* ======================================================================= logging */

static base_log_fn g_log_fn;
static void *g_log_ud;
static int g_log_level = LOG_WARN;

void base_log_set(base_log_fn fn, void *ud) { g_log_fn = fn; g_log_ud = ud; }
void base_log_level(int level) { g_log_level = level; }
int base_log_enabled(int level) { return level <= g_log_level; }

void base_log(int level, const char *fmt, ...) {
    if (level > g_log_level) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_log_fn) { g_log_fn(g_log_ud, level, msg); return; }
    static const char *pfx[] = {"error: ", "warning: ", "", ""};
    fprintf(stderr, "strata: %s%s\n", pfx[level < 0 ? 0 : level > 3 ? 3 : level], msg);
}

/* ======================================================================= parsers */

int base_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return STRATA_EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) return STRATA_EINVAL;
    *out = v;
    return STRATA_OK;
}

int base_parse_f64(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return STRATA_EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v) || v < lo || v > hi) return STRATA_EINVAL;
    *out = v;
    return STRATA_OK;
}

int base_parse_size(const char *s, uint64_t *out) {
    if (!s || !*s) return STRATA_EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) return STRATA_EINVAL;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mul > 1 && *end == 'i') end++;
    if ((*end == 'B' || *end == 'b')) end++;
    if (*end) return STRATA_EINVAL;
    double b = v * mul;
    if (b >= 18e18) return STRATA_EINVAL;
    *out = (uint64_t)b;
    return STRATA_OK;
}

int base_parse_id_list(const char *s, int64_t lo, int64_t hi, int64_t **out, size_t *n) {
    *out = NULL;
    *n = 0;
    if (!s || !*s) return STRATA_EINVAL;
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += (*p == ',');
    int64_t *ids = base_alloc(cap * sizeof *ids, MEM_MISC);
    if (!ids) return STRATA_ENOMEM;
    size_t k = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        if (!(*p >= '0' && *p <= '9') && *p != '-') goto bad;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || v < lo || v > hi) goto bad;
        ids[k++] = v;
        p = end;
        while (*p == ' ') p++;
        if (*p == 0) break;
        if (*p != ',') goto bad;
        p++;
    }
    *out = ids;
    *n = k;
    return STRATA_OK;
bad:
    base_free(ids);
    return STRATA_EINVAL;
}

/* ================================================================ time and files */

double base_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t base_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru)) return 0;
    return (uint64_t)ru.ru_maxrss * 1024u;
}

uint64_t base_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long v;
        if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) { kb = v; break; }
    }
    fclose(f);
    return kb * 1024u;
}

int base_read_file(const char *path, size_t max, uint8_t **buf, size_t *len, char *err, size_t errlen) {
    *buf = NULL;
    *len = 0;
    int rc = STRATA_EIO;
    uint8_t *b = NULL;
    int fd = vfs_open(path, O_RDONLY | O_CLOEXEC, 0); /* never blocks on a FIFO (vfs.h) */
    struct stat st;
    if (fd < 0 && errno == VFS_ENOTREG && stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return base_fail(err, errlen, STRATA_EIO, "%s: not a regular file", path);
    if (fd < 0) return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno));
    if (fstat(fd, &st)) { rc = base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno)); goto fail; }
    if (!S_ISREG(st.st_mode)) { rc = base_fail(err, errlen, STRATA_EIO, "%s: not a regular file", path); goto fail; }
    if ((uint64_t)st.st_size > max) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: file is %lld bytes, more than the %zu allowed",
                       path, (long long)st.st_size, max);
        goto fail;
    }
    size_t n = (size_t)st.st_size;
    b = base_alloc(n + 1, MEM_MISC);
    if (!b) { rc = base_fail(err, errlen, STRATA_ENOMEM, "%s: cannot allocate %zu bytes", path, n); goto fail; }
    int e = vfs_pread_full(fd, b, n, 0);
    if (e) { rc = base_fail(err, errlen, STRATA_EIO, "%s: %s", path, e > 0 ? strerror(e) : "short read"); goto fail; }
    b[n] = 0;
    close(fd);
    *buf = b;
    *len = n;
    return STRATA_OK;
fail:
    base_free(b);
    close(fd);
    return rc;
}

/* ============================================== temporary files and signals */

#define TMP_SLOTS 64
static char g_tmp_path[TMP_SLOTS][4200];
static _Atomic int g_tmp_used[TMP_SLOTS]; /* 0 free, 1 being written, 2 live */

int base_tmp_register(const char *path) {
    if (strlen(path) >= sizeof g_tmp_path[0]) return -1;
    for (int i = 0; i < TMP_SLOTS; i++) {
        int z = 0;
        if (!atomic_compare_exchange_strong(&g_tmp_used[i], &z, 1)) continue;
        memcpy(g_tmp_path[i], path, strlen(path) + 1);
        atomic_store(&g_tmp_used[i], 2);
        return i;
    }
    return -1;
}

void base_tmp_unregister(int slot) {
    if (slot >= 0 && slot < TMP_SLOTS) atomic_store(&g_tmp_used[slot], 0);
}

static void tmp_on_signal(int sig) {
    for (int i = 0; i < TMP_SLOTS; i++)
        if (atomic_load(&g_tmp_used[i]) == 2) unlink(g_tmp_path[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

void base_tmp_cleanup_on_signals(void) {
    const int sigs[] = {SIGINT, SIGTERM};
    for (int k = 0; k < 2; k++) {
        struct sigaction old, sa;
        if (sigaction(sigs[k], NULL, &old) || old.sa_handler != SIG_DFL) continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = tmp_on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(sigs[k], &sa, NULL);
    }
}

int base_write_file_atomic(const char *path, const void *buf, size_t len, char *err, size_t errlen) {
    char tmp[4096];
    struct stat sb;
    /* the rename would replace a FIFO, a device or a directory's name with a file */
    if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISLNK(sb.st_mode))
        return base_fail(err, errlen, STRATA_EINVAL, "%s: exists and is not a regular file; not replaced", path);
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: path too long", path);
    const int slot = base_tmp_register(tmp);
    int fd = vfs_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e0 = errno;
        base_tmp_unregister(slot);
        return base_fail(err, errlen, STRATA_EIO, "%s: %s", tmp, strerror(e0));
    }
    int e = vfs_write_full(fd, buf, len);
    if (e) goto fail;
    if (vfs_fsync(fd)) goto fail_errno;
    if (close(fd)) { fd = -1; goto fail_errno; }
    fd = -1;
    if (vfs_rename(tmp, path)) goto fail_errno;
    base_tmp_unregister(slot);
    return STRATA_OK;
fail_errno:
    e = errno;
fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
    base_tmp_unregister(slot);
    return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(e));
}

int base_mkdir_p(const char *path, char *err, size_t errlen) {
    char tmp[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp) return base_fail(err, errlen, STRATA_EINVAL, "bad directory path");
    memcpy(tmp, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (tmp[i] == '/' || tmp[i] == 0) {
            char c = tmp[i];
            tmp[i] = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST)
                return base_fail(err, errlen, STRATA_EIO, "%s: %s", tmp, strerror(errno));
            tmp[i] = c;
        }
    }
    if (!base_is_dir(path)) return base_fail(err, errlen, STRATA_EIO, "%s: not a directory", path);
    return STRATA_OK;
}

int base_lock(const char *path, const char *what, char *err, size_t errlen) {
    for (int tries = 0; tries < 100; tries++) {
        int fd = vfs_open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return base_fail(err, errlen, STRATA_EIO, "%s: cannot create the lock file: %s", path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB)) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK)
                return base_fail(err, errlen, STRATA_EBUSY, "%s is being written by another process (it holds %s)", what, path);
            return base_fail(err, errlen, STRATA_EIO, "%s: lock: %s", path, strerror(e));
        }
        /* The holder before us may have unlocked and removed the file between our
         * open and flock: then we hold a lock nobody else can see. */
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) return fd;
        close(fd);
    }
    return base_fail(err, errlen, STRATA_EBUSY, "%s is being written by another process (%s keeps changing)", what, path);
}

void base_unlock(const char *path, int fd) {
    if (fd < 0) return;
    unlink(path); /* while still locked: see base_lock */
    close(fd);
}

int base_rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st)) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    int rc = 0;
    char sub[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) { rc = -1; continue; }
        if (base_rm_rf(sub)) rc = -1;
    }
    closedir(d);
    if (rmdir(path)) rc = -1;
    return rc;
}

int base_is_dir(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISDIR(st.st_mode);
}

int base_is_file(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISREG(st.st_mode);
}

const char *base_fmt_bytes(uint64_t b, char *buf, size_t n) {
    double v = (double)b;
    if (v >= 1e12) snprintf(buf, n, "%.3f TB", v / 1e12);
    else if (v >= 1e9) snprintf(buf, n, "%.2f GB", v / 1e9);
    else if (v >= 1e6) snprintf(buf, n, "%.2f MB", v / 1e6);
    else if (v >= 1e3) snprintf(buf, n, "%.2f KB", v / 1e3);
    else snprintf(buf, n, "%llu B", (unsigned long long)b);
    return buf;
}

uint64_t base_fnv1a(const void *p, size_t n, uint64_t h) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ULL; }
    return h;
}
