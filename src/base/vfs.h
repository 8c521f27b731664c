/*
 * vfs.h: the one door every file read, write, fsync and rename of the library goes
 * through, so tests can make the Nth of them fail (SQLite's test VFS, test_vfs.c).
 *
 * The wrappers are thin: each is the system call plus (1) EINTR retried inside, so
 * no caller ever sees it, and (2) the fault hook. Short reads and writes are passed
 * up like the kernel's; the *_full helpers loop over them.
 *
 * Fault injection (tests and CI only; the CLI reads STRATA_FAULT=kind:N once at
 * start): every wrapped call is numbered from 1 in the order it starts (all
 * threads share the count) and the Nth one gets the fault, once:
 *   eio     fails with EIO (any call)
 *   enospc  fails with ENOSPC (calls that may allocate disk: write, pwrite, fsync,
 *           ftruncate, fallocate, rename, open for writing, write completions;
 *           a read at call N runs normally)
 *   short   a read or write moves about half its bytes (4096-multiples, so an
 *           O_DIRECT continuation stays aligned; calls too small to halve run whole)
 *   eintr   the call is interrupted: the wrapper retries it (io_uring completions
 *           come back as -EINTR to the ring's own retry path)
 *   count   nothing fails; the calls are only counted
 * vfs_fault_* is process-wide test state (an atomic counter): off, the wrappers
 * cost one relaxed load.
 */
#ifndef STRATA_VFS_H
#define STRATA_VFS_H

#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <sys/types.h>

enum vfs_fault { VFS_FAULT_OFF, VFS_FAULT_COUNT, VFS_FAULT_EIO, VFS_FAULT_ENOSPC, VFS_FAULT_SHORT, VFS_FAULT_EINTR };

/* "eio:12", "count:0", ... -> kind and N (N >= 1 except for count). 0 or -1. */
int vfs_fault_parse(const char *spec, int *kind, uint64_t *n);
/* Arms kind at call n counted from now (the count restarts); VFS_FAULT_OFF disarms. */
void vfs_fault_set(int kind, uint64_t n);
uint64_t vfs_fault_calls(void);   /* calls counted since vfs_fault_set */
/* 1 once the fault was injected: *call = its number, *op = the call ("pwrite"). */
int vfs_fault_fired(uint64_t *call, const char **op);
const char *vfs_fault_name(int kind);

/* The wrappers: the system call's contract (-1 and errno), EINTR never returned. */
/* A read-only open (no O_WRONLY/O_RDWR/O_CREAT) never blocks: it opens with
 * O_NONBLOCK and accepts only a regular file or a directory; anything else (a
 * FIFO, which would wait for a writer forever, a device, a socket) fails with
 * errno VFS_ENOTREG. O_NONBLOCK is cleared again unless the caller asked for it. */
#define VFS_ENOTREG EINVAL
int vfs_open(const char *path, int flags, mode_t mode);
ssize_t vfs_read(int fd, void *buf, size_t n);
ssize_t vfs_pread(int fd, void *buf, size_t n, uint64_t off);
ssize_t vfs_write(int fd, const void *buf, size_t n);
ssize_t vfs_pwrite(int fd, const void *buf, size_t n, uint64_t off);
int vfs_fsync(int fd);
int vfs_ftruncate(int fd, uint64_t size);
int vfs_fallocate(int fd, uint64_t size);          /* mode 0, from offset 0 */
int vfs_rename(const char *from, const char *to);
int vfs_rename_exchange(const char *a, const char *b); /* renameat2 RENAME_EXCHANGE */

/* An io_uring completion's result (bytes or -errno) for a read (write = 0) or a
 * write of len bytes, as the ring should see it. */
int vfs_cqe(int res, uint64_t len, int write);

/* Loops: 0, an errno (> 0), or -1 when a read meets end of file first. */
int vfs_pread_full(int fd, void *buf, uint64_t n, uint64_t off);
int vfs_pwrite_full(int fd, const void *buf, uint64_t n, uint64_t off);
int vfs_write_full(int fd, const void *buf, uint64_t n);

#endif
