/*
 * base.h: what every module uses: error formatting, the budgeted allocator,
 * logging, strict number parsers, clocks, whole-file reads and RSS.
 *
 * Allocation: every heap byte the engine owns goes through base_alloc(bytes, tag).
 * Counters are exact per tag with a high-water mark; when a limit is set
 * (base_mem_set_limit) an allocation that would exceed it returns NULL and the
 * caller reports STRATA_EBUDGET. Thread-safe (atomics).
 */
#ifndef STRATA_BASE_H
#define STRATA_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "strata.h"

/* ---- asserts: programmer errors only, never on input data ---- */
void base_assert_fail(const char *expr, const char *file, int line);
#define ST_ASSERT(x) ((x) ? (void)0 : base_assert_fail(#x, __FILE__, __LINE__))

#if defined(__GNUC__)
#define ST_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ST_PRINTF(a, b)
#endif

/* ---- errors ---- */
/* Writes the formatted message into err (if err && errlen) and returns rc. */
int base_fail(char *err, size_t errlen, int rc, const char *fmt, ...) ST_PRINTF(4, 5);
int base_vfail(char *err, size_t errlen, int rc, const char *fmt, va_list ap);

/* Growing string, for collecting several problems in one pass. */
typedef struct sbuf {
    char *s;    /* NUL-terminated; NULL until the first append */
    size_t len; /* bytes before the NUL */
    size_t cap;
    int n;      /* number of sbuf_line calls (problem count) */
} sbuf;
void sbuf_printf(sbuf *b, const char *fmt, ...) ST_PRINTF(2, 3);
/* Appends one problem line ("  - msg\n") and increments b->n. */
void sbuf_line(sbuf *b, const char *fmt, ...) ST_PRINTF(2, 3);
void sbuf_free(sbuf *b);

/* ---- budgeted allocation ---- */
enum mem_tag {
    MEM_MISC, MEM_JSON, MEM_INDEX, MEM_WEIGHTS, MEM_TRUNK, MEM_CACHE, MEM_KV,
    MEM_STATE, MEM_SCRATCH, MEM_IO, MEM_TOK, MEM_HTTP, MEM_TAG_COUNT
};
void *base_alloc(size_t bytes, int tag);              /* NULL on OOM or over the limit */
void *base_calloc(size_t n, size_t size, int tag);    /* zeroed, overflow-checked */
void *base_realloc(void *p, size_t bytes, int tag);   /* tag must match the original */
void *base_alloc_aligned(size_t bytes, size_t align, int tag); /* align: power of 2 <= 1 MiB */
char *base_strdup(const char *s, int tag);
/* Neither the limit nor the test countdown refuses it (still counted; NULL only
 * when malloc fails): for callers that cannot survive a refusal (jsonx.c). */
void *base_alloc_unrefused(size_t bytes, int tag);
void base_free(void *p);                              /* accepts NULL; any of the above */
void base_mem_set_limit(uint64_t bytes);              /* 0 = no limit */
uint64_t base_mem_limit(void);
uint64_t base_mem_used(void);
uint64_t base_mem_peak(void);
uint64_t base_mem_used_tag(int tag);
const char *base_mem_tag_name(int tag);
/* Decode guard (per thread): while active, any base_alloc on this thread aborts in debug builds (NDEBUG unset)
 * and is counted otherwise (base_mem_guard_violations). */
void base_mem_guard(int on);
uint64_t base_mem_guard_violations(void);
/* Test hook: fail the Nth allocation from now (1 = next); 0 disables. The CLI
 * sets it from STRATA_FAIL_ALLOC=N at start. */
void base_mem_fail_after(uint64_t n);
uint64_t base_mem_allocs(void);                       /* allocations attempted so far */

/* ---- logging: stderr by default; the library never prints to stdout ---- */
enum { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };
typedef void (*base_log_fn)(void *ud, int level, const char *msg);
void base_log_set(base_log_fn fn, void *ud);
void base_log_level(int level);
int base_log_enabled(int level);
void base_log(int level, const char *fmt, ...) ST_PRINTF(2, 3);
#define LOGE(...) base_log(LOG_ERROR, __VA_ARGS__)
#define LOGW(...) base_log(LOG_WARN, __VA_ARGS__)
#define LOGI(...) do { if (base_log_enabled(LOG_INFO)) base_log(LOG_INFO, __VA_ARGS__); } while (0)
#define LOGD(...) do { if (base_log_enabled(LOG_DEBUG)) base_log(LOG_DEBUG, __VA_ARGS__); } while (0)

/* ---- strict parsers (whole string must parse; no atoi) ---- */
int base_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
int base_parse_f64(const char *s, double lo, double hi, double *out);
/* "4096", "512K", "1.5G", "24GB", "2GiB" -> bytes (K/M/G/T are powers of 1024). */
int base_parse_size(const char *s, uint64_t *out);
/* "1,2,3" -> ids; *out allocated with MEM_MISC, caller base_free()s. */
int base_parse_id_list(const char *s, int64_t lo, int64_t hi, int64_t **out, size_t *n);

/* ---- time, files, process ---- */
double base_now(void);                /* monotonic seconds */
uint64_t base_peak_rss(void);         /* bytes, from getrusage */
uint64_t base_mem_available(void);    /* bytes, MemAvailable from /proc/meminfo (0 if unknown) */
/* Reads at most max bytes of a whole file into a MEM_MISC buffer (NUL-terminated). */
int base_read_file(const char *path, size_t max, uint8_t **buf, size_t *len, char *err, size_t errlen);
/* Writes a whole file atomically: path.tmp.PID, fsync, rename. */
int base_write_file_atomic(const char *path, const void *buf, size_t len, char *err, size_t errlen);
int base_mkdir_p(const char *path, char *err, size_t errlen);
/* Temporary files in progress (PATH.tmp.PID, --dump-logits' PATH.partial-PID):
 * registered while they exist so that SIGINT/SIGTERM removes them
 * (base_tmp_cleanup_on_signals, installed by the CLI) before the default action.
 * At most 64 at once (more are not tracked); register returns a slot (-1: none)
 * for unregister. Thread-safe; the handler only calls unlink. */
int base_tmp_register(const char *path);
void base_tmp_unregister(int slot);
/* Installs the handler for SIGINT and SIGTERM where their action is the default. */
void base_tmp_cleanup_on_signals(void);
/* Exclusive advisory lock (flock) of a writer: creates path and locks it without
 * waiting. Returns the fd (>= 0; keep it open while writing), or STRATA_EBUSY with
 * "<what> is being written by another process" when another process holds it, or
 * STRATA_EIO. Release with base_unlock, which removes path first (a locker that
 * opened the removed file notices and retries on the new one). */
int base_lock(const char *path, const char *what, char *err, size_t errlen);
void base_unlock(const char *path, int fd); /* fd < 0: nothing */
int base_rm_rf(const char *path);     /* best effort; 0 on success */
int base_is_dir(const char *path);
int base_is_file(const char *path);
/* Human-readable bytes: "17.55 MB" (decimal units, as docs/architecture.md quotes sizes). buf >= 32. */
const char *base_fmt_bytes(uint64_t bytes, char *buf, size_t n);

/* ---- hashing ---- */
uint64_t base_fnv1a(const void *p, size_t n, uint64_t h); /* h = BASE_FNV_INIT to start */
#define BASE_FNV_INIT 1469598103934665603ULL

#endif
