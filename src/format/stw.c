/*
 * stw.c: safetensors writer (see stw.h). Owns header layout and the sequential,
 * fsync'd file writes; knows nothing about models or what the bytes mean.
 */
#include "stw.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "base.h"
#include "vfs.h"

static const struct { const char *name; size_t size; } k_dtypes[DT_COUNT] = {
    [DT_F32] = {"F32", 4}, [DT_F16] = {"F16", 2}, [DT_BF16] = {"BF16", 2},
    [DT_U8] = {"U8", 1}, [DT_I8] = {"I8", 1}, [DT_I32] = {"I32", 4},
    [DT_I64] = {"I64", 8}, [DT_F8_E4M3] = {"F8_E4M3", 1}};

const char *stw_dtype_name(int dtype) {
    return (dtype >= 0 && dtype < DT_COUNT) ? k_dtypes[dtype].name : "?";
}

size_t stw_dtype_size(int dtype) {
    return (dtype >= 0 && dtype < DT_COUNT) ? k_dtypes[dtype].size : 0;
}

/* ------------------------------------------------------------- header builder */

/* A growing byte buffer; `bad` is sticky after an allocation failure so callers
 * check once at the end. */
typedef struct {
    char *p;
    size_t len, cap;
    int bad;
} jbuf;

static void jb_reserve(jbuf *b, size_t more) {
    if (b->bad || b->len + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *p = base_realloc(b->p, cap, MEM_MISC);
    if (!p) { b->bad = 1; return; }
    b->p = p;
    b->cap = cap;
}

static void jb_put(jbuf *b, const char *s, size_t n) {
    jb_reserve(b, n);
    if (b->bad) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void jb_str(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }

static void jb_u64(jbuf *b, uint64_t v) {
    char t[24];
    int n = snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    jb_put(b, t, (size_t)n);
}

/* JSON string with the escapes the format needs (quotes, backslash, controls). */
static void jb_qstr(jbuf *b, const char *s) {
    jb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') { char e[2] = {'\\', (char)*p}; jb_put(b, e, 2); }
        else if (*p < 0x20) { char e[8]; snprintf(e, sizeof e, "\\u%04x", *p); jb_put(b, e, 6); }
        else jb_put(b, (const char *)p, 1);
    }
    jb_put(b, "\"", 1);
}

uint8_t *stw_header(const stw_entry *e, size_t n, const char *const *meta, size_t n_meta,
                    size_t align, size_t *out_len, uint64_t *data_bytes, char *err, size_t errlen) {
    jbuf b = {0};
    uint64_t off = 0;
    if (align < 8) align = 8;
    jb_put(&b, "\0\0\0\0\0\0\0\0{", 9);
    if (n_meta) {
        jb_str(&b, "\"__metadata__\":{");
        for (size_t i = 0; i < n_meta; i++) {
            if (i) jb_put(&b, ",", 1);
            jb_qstr(&b, meta[2 * i]);
            jb_put(&b, ":", 1);
            jb_qstr(&b, meta[2 * i + 1]);
        }
        jb_put(&b, "}", 1);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < e[i].ndim; d++) numel *= (uint64_t)e[i].shape[d];
        size_t es = stw_dtype_size(e[i].dtype);
        if (!es || e[i].ndim < 1 || e[i].ndim > 4 || numel * es != e[i].nbytes) {
            base_fail(err, errlen, STRATA_EINVAL, "stw: tensor '%s': %llu bytes do not match dtype %s and shape",
                      e[i].name, (unsigned long long)e[i].nbytes, stw_dtype_name(e[i].dtype));
            base_free(b.p);
            return NULL;
        }
        if (i || n_meta) jb_put(&b, ",", 1);
        jb_qstr(&b, e[i].name);
        jb_str(&b, ":{\"dtype\":\"");
        jb_str(&b, stw_dtype_name(e[i].dtype));
        jb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < e[i].ndim; d++) {
            if (d) jb_put(&b, ",", 1);
            jb_u64(&b, (uint64_t)e[i].shape[d]);
        }
        jb_str(&b, "],\"data_offsets\":[");
        jb_u64(&b, off);
        jb_put(&b, ",", 1);
        off += e[i].nbytes;
        jb_u64(&b, off);
        jb_str(&b, "]}");
    }
    jb_put(&b, "}", 1);
    /* Pad with spaces (valid JSON whitespace) so the data start is aligned. */
    size_t total = (b.len + align - 1) / align * align;
    jb_reserve(&b, total - b.len);
    if (b.bad) {
        base_free(b.p);
        base_fail(err, errlen, STRATA_ENOMEM, "stw: out of memory building a header of %zu tensors", n);
        return NULL;
    }
    memset(b.p + b.len, ' ', total - b.len);
    uint64_t hl = total - 8;
    for (int i = 0; i < 8; i++) b.p[i] = (char)((hl >> (8 * i)) & 0xFF);
    *out_len = total;
    *data_bytes = off;
    return (uint8_t *)b.p;
}

/* ------------------------------------------------------------------ file I/O */

int stw_file_create(stw_file *f, const char *path, char *err, size_t errlen) {
    f->written = 0;
    f->direct = 0;
    f->fd = -1;
    if (snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: path too long", path);
    f->fd = vfs_open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno));
    return STRATA_OK;
}

int stw_file_direct(stw_file *f, int on) {
    int fl = fcntl(f->fd, F_GETFL);
    if (fl < 0) return f->direct = 0;
    if (fcntl(f->fd, F_SETFL, on ? fl | O_DIRECT : fl & ~O_DIRECT)) on = 0;
    return f->direct = on;
}

int stw_file_write(stw_file *f, const void *p, size_t n, char *err, size_t errlen) {
    const uint8_t *c = p;
    if (f->direct && ((uintptr_t)c % STW_DIRECT_ALIGN || n % STW_DIRECT_ALIGN || f->written % STW_DIRECT_ALIGN))
        stw_file_direct(f, 0);
    while (n) {
        ssize_t w = vfs_write(f->fd, c, n);
        if (w < 0 && errno == EINVAL && f->direct) { stw_file_direct(f, 0); continue; }
        if (w <= 0)
            return base_fail(err, errlen, STRATA_EIO, "%s: write failed at byte %llu: %s", f->path,
                             (unsigned long long)f->written, w < 0 ? strerror(errno) : "no progress");
        c += w;
        n -= (size_t)w;
        f->written += (uint64_t)w;
    }
    return STRATA_OK;
}

int stw_file_finish(stw_file *f, uint64_t final_size, char *err, size_t errlen) {
    int rc = STRATA_OK;
    if (final_size > f->written && vfs_ftruncate(f->fd, final_size))
        rc = base_fail(err, errlen, STRATA_EIO, "%s: cannot extend to %llu bytes: %s", f->path,
                       (unsigned long long)final_size, strerror(errno));
    if (!rc && vfs_fsync(f->fd)) rc = base_fail(err, errlen, STRATA_EIO, "%s: fsync: %s", f->path, strerror(errno));
    if (close(f->fd) && !rc) rc = base_fail(err, errlen, STRATA_EIO, "%s: close: %s", f->path, strerror(errno));
    f->fd = -1;
    return rc;
}

void stw_file_abort(stw_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    unlink(f->path);
}

int stw_save(const char *path, const stw_entry *e, size_t n, const void *const *data,
             const char *const *meta, size_t n_meta, size_t align, char *err, size_t errlen) {
    size_t hlen;
    uint64_t dbytes;
    uint8_t *h = stw_header(e, n, meta, n_meta, align, &hlen, &dbytes, err, errlen);
    if (!h) return STRATA_EINVAL;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    stw_file f;
    int rc = stw_file_create(&f, tmp, err, errlen);
    if (rc) { base_free(h); return rc; }
    rc = stw_file_write(&f, h, hlen, err, errlen);
    for (size_t i = 0; i < n && !rc; i++) rc = stw_file_write(&f, data[i], e[i].nbytes, err, errlen);
    base_free(h);
    if (rc) { stw_file_abort(&f); return rc; }
    rc = stw_file_finish(&f, 0, err, errlen);
    if (!rc && vfs_rename(tmp, path)) rc = base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno));
    if (rc) unlink(tmp);
    return rc;
}
