/*
 * util.c: the utilities section of strata.h: the base layer's parsers, clock and
 * file helpers under their public names, so that front ends built on strata.h
 * alone parse and print exactly as the library does.
 */
#include <stdlib.h>
#include <stdarg.h>
#include "base.h"
#include "jsonx.h"
#include "membw.h"
#include "pool.h"
#include "prefix.h"
#include "strata.h"
#include "vfs.h"

int strata_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) { return base_parse_i64(s, lo, hi, out); }
int strata_parse_f64(const char *s, double lo, double hi, double *out) { return base_parse_f64(s, lo, hi, out); }
int strata_parse_size(const char *s, uint64_t *out) { return base_parse_size(s, out); }
const char *strata_fmt_bytes(uint64_t bytes, char *buf, size_t n) { return base_fmt_bytes(bytes, buf, n); }
double strata_now(void) { return base_now(); }
uint64_t strata_mem_available(void) { return base_mem_available(); }
uint64_t strata_peak_rss(void) { return base_peak_rss(); }
int strata_is_dir(const char *path) { return base_is_dir(path); }
int strata_is_file(const char *path) { return base_is_file(path); }
int strata_default_threads(void) { return pool_default_threads(); }

int strata_read_file(const char *path, size_t max, uint8_t **buf, size_t *len, char *err, size_t errlen) {
    return base_read_file(path, max, buf, len, err, errlen);
}

/* ---------------------------------------------------------- benchmark hooks */

struct strata_membw {
    pool *p;
    uint64_t *buf;
    size_t bytes;
};

int strata_membw_open(strata_membw **out, int threads, size_t bytes) {
    strata_membw *b = base_calloc(1, sizeof *b, MEM_MISC);
    *out = NULL;
    if (!b) return STRATA_ENOMEM;
    b->bytes = bytes;
    b->buf = base_alloc_aligned(bytes, 4096, MEM_SCRATCH);
    if (!b->buf || pool_create(&b->p, threads)) {
        strata_membw_close(b);
        return STRATA_ENOMEM;
    }
    for (size_t i = 0; i < bytes / 8; i++) b->buf[i] = i;
    *out = b;
    return STRATA_OK;
}

double strata_membw_read(strata_membw *b, int passes) { return bw_read(b->p, b->buf, b->bytes, passes); }

void strata_membw_close(strata_membw *b) {
    if (!b) return;
    pool_free(b->p);
    base_free(b->buf);
    base_free(b);
}

/* ------------------------------------------------- front ends: memory, files */

int strata_parse_id_list(const char *s, int64_t lo, int64_t hi, int64_t **out, size_t *n) {
    return base_parse_id_list(s, lo, hi, out, n);
}
uint64_t strata_fnv1a(const void *p, size_t n, uint64_t h) { return base_fnv1a(p, n, h); }

/* A front end's blocks are MEM_MISC, as they were when app/ called base_alloc. */
void *strata_alloc(size_t bytes) { return base_alloc(bytes, MEM_MISC); }
void *strata_calloc(size_t n, size_t size) { return base_calloc(n, size, MEM_MISC); }
void *strata_realloc(void *p, size_t bytes) { return base_realloc(p, bytes, MEM_MISC); }
uint64_t strata_mem_peak(void) { return base_mem_peak(); }
uint64_t strata_mem_guard_violations(void) { return base_mem_guard_violations(); }

int strata_file_open(const char *path, int flags, unsigned mode) { return vfs_open(path, flags, (mode_t)mode); }
int strata_file_write_full(int fd, const void *buf, uint64_t n) { return vfs_write_full(fd, buf, n); }
int strata_file_fsync(int fd) { return vfs_fsync(fd); }
int strata_file_rename(const char *from, const char *to) { return vfs_rename(from, to); }
int strata_write_file_atomic(const char *path, const void *buf, size_t len, char *err, size_t errlen) {
    return base_write_file_atomic(path, buf, len, err, errlen);
}
int strata_tmp_register(const char *path) { return base_tmp_register(path); }
void strata_tmp_unregister(int slot) { base_tmp_unregister(slot); }
void strata_tmp_cleanup_on_signals(void) { base_tmp_cleanup_on_signals(); }

/* ------------------------------------------------------ fault injection */

/* Read once by strata_faults_from_env, before any command runs. */
static int g_fault_kind, g_fault_armed;

int strata_faults_from_env(char *err, size_t errlen) {
    const char *f = getenv("STRATA_FAULT"), *a = getenv("STRATA_FAIL_ALLOC");
    if (f && *f) {
        uint64_t n;
        if (vfs_fault_parse(f, &g_fault_kind, &n))
            return base_fail(err, errlen, STRATA_EINVAL,
                             "STRATA_FAULT='%s': expected eio:N, enospc:N, short:N, eintr:N or count:0", f);
        vfs_fault_set(g_fault_kind, n);
        g_fault_armed = 1;
    }
    if (a && *a) {
        int64_t n;
        if (base_parse_i64(a, 1, INT64_MAX, &n))
            return base_fail(err, errlen, STRATA_EINVAL, "STRATA_FAIL_ALLOC='%s': expected a count >= 1", a);
        base_mem_fail_after((uint64_t)n);
    }
    return STRATA_OK;
}

void strata_fault_report(FILE *f) {
    if (!g_fault_armed) return;
    uint64_t call;
    const char *op;
    if (vfs_fault_fired(&call, &op))
        fprintf(f, "strata: fault: %s injected into call %llu (%s) of %llu; %llu allocations\n",
                vfs_fault_name(g_fault_kind), (unsigned long long)call, op, (unsigned long long)vfs_fault_calls(),
                (unsigned long long)base_mem_allocs());
    else
        fprintf(f, "strata: fault: %llu calls%s; %llu allocations\n", (unsigned long long)vfs_fault_calls(),
                g_fault_kind == VFS_FAULT_COUNT ? "" : ", nothing injected", (unsigned long long)base_mem_allocs());
}

int strata_prefix_dir_check(const char *dir, char *err, size_t errlen) { return prefix_dir_check(dir, err, errlen); }

/* ------------------------------------------------------------------ JSON */

void strata_json_init(void) { json_decref(jsonx_load((const uint8_t *)"{}", 2, "init", NULL, 0)); }
int strata_json_parse(struct json_t **out, const void *buf, size_t len, const char *what, char *err, size_t errlen) {
    return jsonx_parse(out, buf, len, what, err, errlen);
}
int strata_json_int(const struct json_t *j, int64_t *out) { return jsonx_int(j, out); }
int strata_json_num(const struct json_t *j, double *out) { return jsonx_num(j, out); }

int strata_fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    base_vfail(err, errlen, rc, fmt, ap);
    va_end(ap);
    return rc;
}
