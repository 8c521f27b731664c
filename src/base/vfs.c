/*
 * vfs.c: file-system call wrappers with a fault hook (see vfs.h).
 *
 * The hook decides before the call: an injected error replaces the call, a short
 * transfer issues the real call with fewer bytes (so what lands on disk or in
 * memory is exactly what a real short transfer would leave). EINTR, injected or
 * real, is retried here; each attempt is a counted call.
 */
#include "vfs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { OP_OPEN, OP_OPEN_W, OP_READ, OP_WRITE, OP_FSYNC, OP_TRUNC, OP_FALLOC, OP_RENAME, OP_CQE_R, OP_CQE_W };
static const char *k_op_names[] = {"open", "open", "read", "write", "fsync", "ftruncate", "fallocate", "rename",
                                   "read completion", "write completion"};

/* Test state (vfs.h): the armed kind, the call it hits, the calls so far and what
 * was hit. Relaxed atomics: the count only has to give every call one number. */
static _Atomic int g_kind, g_fired_op;
static _Atomic uint64_t g_at, g_calls, g_fired_call;

static const char *k_kind_names[] = {"off", "count", "eio", "enospc", "short", "eintr"};

const char *vfs_fault_name(int kind) {
    return kind >= 0 && kind < (int)(sizeof k_kind_names / sizeof *k_kind_names) ? k_kind_names[kind] : "?";
}

int vfs_fault_parse(const char *spec, int *kind, uint64_t *n) {
    const char *c = spec ? strchr(spec, ':') : NULL;
    if (!c) return -1;
    int k = -1;
    for (int i = VFS_FAULT_COUNT; i <= VFS_FAULT_EINTR; i++)
        if ((size_t)(c - spec) == strlen(k_kind_names[i]) && !strncmp(spec, k_kind_names[i], (size_t)(c - spec))) k = i;
    /* strtoll here, not base_parse_i64: vfs sits below base (base reads files through it). */
    char *end;
    errno = 0;
    long long v = k < 0 || !c[1] ? -1 : strtoll(c + 1, &end, 10);
    if (k < 0 || !c[1] || errno || *end || v < (k == VFS_FAULT_COUNT ? 0 : 1)) return -1;
    *kind = k;
    *n = (uint64_t)v;
    return 0;
}

void vfs_fault_set(int kind, uint64_t n) {
    atomic_store(&g_kind, VFS_FAULT_OFF);
    atomic_store(&g_calls, 0);
    atomic_store(&g_fired_op, 0);
    atomic_store(&g_fired_call, 0);
    atomic_store(&g_at, n);
    atomic_store(&g_kind, kind);
}

uint64_t vfs_fault_calls(void) { return atomic_load(&g_calls); }

int vfs_fault_fired(uint64_t *call, const char **op) {
    int o = atomic_load(&g_fired_op);
    if (!o) return 0;
    if (call) *call = atomic_load(&g_fired_call);
    if (op) *op = k_op_names[o - 1];
    return 1;
}

/* Numbers this call; returns the fault to apply to it: an errno, -1 for a short
 * transfer, 0 for none. */
static int take(int op) {
    int kind = atomic_load_explicit(&g_kind, memory_order_relaxed);
    if (kind == VFS_FAULT_OFF) return 0;
    uint64_t n = atomic_fetch_add(&g_calls, 1) + 1;
    if (kind == VFS_FAULT_COUNT || n != atomic_load(&g_at)) return 0;
    const int rw = op == OP_READ || op == OP_WRITE || op == OP_CQE_R || op == OP_CQE_W;
    const int alloc = op != OP_OPEN && op != OP_READ && op != OP_CQE_R;
    int f = 0;
    switch (kind) {
    case VFS_FAULT_EIO: f = EIO; break;
    case VFS_FAULT_ENOSPC: f = alloc ? ENOSPC : 0; break;
    case VFS_FAULT_SHORT: f = rw ? -1 : 0; break;
    case VFS_FAULT_EINTR: f = EINTR; break;
    default: break;
    }
    if (f) {
        atomic_store(&g_fired_call, n);
        atomic_store(&g_fired_op, op + 1);
    }
    return f;
}

/* Bytes a short transfer of n moves: half, in whole 4096-byte blocks when there
 * are two (O_DIRECT needs them); halved freely on a buffered fd; else all of n. */
static size_t short_len(int fd, size_t n) {
    if (n >= 8192) return (n / 2) & ~(size_t)4095;
    if (n < 2) return n;
    int fl = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
    return fl >= 0 && !(fl & O_DIRECT) ? n / 2 : n;
}

int vfs_open(const char *path, int flags, mode_t mode) {
    const int op = flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC) ? OP_OPEN_W : OP_OPEN;
    const int ro = !(flags & (O_WRONLY | O_RDWR | O_CREAT)) && !(flags & O_PATH);
    for (;;) {
        int f = take(op), fd;
        if (f > 0) { errno = f; fd = -1; }
        else fd = open(path, ro ? flags | O_NONBLOCK : flags, mode);
        if (fd < 0 && errno == EINTR) continue;
        if (fd >= 0 && ro) {
            /* a reader of a FIFO would wait for a writer forever: refuse what is
             * not a file or a directory (vfs.h) */
            struct stat st;
            if (fstat(fd, &st) || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) {
                int e = S_ISREG(st.st_mode) || S_ISDIR(st.st_mode) ? errno : VFS_ENOTREG;
                close(fd);
                errno = e;
                return -1;
            }
            if (!(flags & O_NONBLOCK)) {
                int fl = fcntl(fd, F_GETFL);
                if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
            }
        }
        return fd;
    }
}

ssize_t vfs_read(int fd, void *buf, size_t n) {
    for (;;) {
        int f = take(OP_READ);
        ssize_t r;
        if (f > 0) { errno = f; r = -1; }
        else r = read(fd, buf, f < 0 ? short_len(fd, n) : n);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

ssize_t vfs_pread(int fd, void *buf, size_t n, uint64_t off) {
    for (;;) {
        int f = take(OP_READ);
        ssize_t r;
        if (f > 0) { errno = f; r = -1; }
        else r = pread(fd, buf, f < 0 ? short_len(fd, n) : n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

ssize_t vfs_write(int fd, const void *buf, size_t n) {
    for (;;) {
        int f = take(OP_WRITE);
        ssize_t r;
        if (f > 0) { errno = f; r = -1; }
        else r = write(fd, buf, f < 0 ? short_len(fd, n) : n);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

ssize_t vfs_pwrite(int fd, const void *buf, size_t n, uint64_t off) {
    for (;;) {
        int f = take(OP_WRITE);
        ssize_t r;
        if (f > 0) { errno = f; r = -1; }
        else r = pwrite(fd, buf, f < 0 ? short_len(fd, n) : n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

/* A call that is all or nothing (fsync, rename, ...): 1 with errno set when the
 * fault replaces it. Short does not apply. */
static int fails(int op) {
    int f = take(op);
    if (f > 0) errno = f;
    return f > 0;
}

int vfs_fsync(int fd) {
    for (;;) {
        int r = fails(OP_FSYNC) ? -1 : fsync(fd);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

int vfs_ftruncate(int fd, uint64_t size) {
    for (;;) {
        int r = fails(OP_TRUNC) ? -1 : ftruncate(fd, (off_t)size);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

int vfs_fallocate(int fd, uint64_t size) {
    for (;;) {
        int r = fails(OP_FALLOC) ? -1 : fallocate(fd, 0, 0, (off_t)size);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

int vfs_rename(const char *from, const char *to) {
    for (;;) {
        int r = fails(OP_RENAME) ? -1 : rename(from, to);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

int vfs_rename_exchange(const char *a, const char *b) {
    for (;;) {
        int r = fails(OP_RENAME) ? -1 : renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

int vfs_cqe(int res, uint64_t len, int write) {
    int f = take(write ? OP_CQE_W : OP_CQE_R);
    if (f > 0) return -f;
    /* a short completion claims part of what landed; the ring reads or writes the
     * rest again, as after a real one */
    if (f < 0 && res >= 8192 && (uint64_t)res <= len) return (int)(((unsigned)res / 2) & ~4095u);
    return res;
}

int vfs_pread_full(int fd, void *buf, uint64_t n, uint64_t off) {
    uint8_t *p = buf;
    while (n) {
        /* Linux caps one transfer at 0x7ffff000 bytes: at most 1 GiB at a time */
        size_t k = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = vfs_pread(fd, p, k, off);
        if (r < 0) return errno ? errno : EIO;
        if (r == 0) return -1;
        p += r;
        off += (uint64_t)r;
        n -= (uint64_t)r;
    }
    return 0;
}

int vfs_pwrite_full(int fd, const void *buf, uint64_t n, uint64_t off) {
    const uint8_t *p = buf;
    while (n) {
        size_t k = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = vfs_pwrite(fd, p, k, off);
        if (r < 0) return errno ? errno : EIO;
        if (r == 0) return ENOSPC; /* no progress: the disk is full */
        p += r;
        off += (uint64_t)r;
        n -= (uint64_t)r;
    }
    return 0;
}

int vfs_write_full(int fd, const void *buf, uint64_t n) {
    const uint8_t *p = buf;
    while (n) {
        size_t k = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = vfs_write(fd, p, k);
        if (r < 0) return errno ? errno : EIO;
        if (r == 0) return ENOSPC;
        p += r;
        n -= (uint64_t)r;
    }
    return 0;
}
