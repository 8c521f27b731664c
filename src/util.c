/*
 * util.c: the utilities section of strata.h: the base layer's parsers, clock and
 * file helpers under their public names, so that front ends built on strata.h
 * alone parse and print exactly as the library does.
 */
#include "base.h"
#include "membw.h"
#include "pool.h"
#include "strata.h"

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
