/*
 * pool.h: one persistent pthread pool. pool_for cuts [0, n) into contiguous
 * ranges (a few per thread, each at least `grain` items, shorter toward the end
 * when the job is large enough) that the participating threads claim as they
 * become free (the caller is thread 0). Which thread runs a
 * range is not fixed; work items must be independent, so that each result is
 * computed by exactly one thread in a fixed order and output bits never depend on
 * the thread count or the schedule.
 */
#ifndef STRATA_POOL_H
#define STRATA_POOL_H

#include <stdint.h>

typedef struct pool pool;
typedef void (*pool_fn)(void *ctx, int64_t i0, int64_t i1, int tid);

int pool_create(pool **out, int n_threads);  /* n_threads >= 1 (1 = caller only) */
void pool_free(pool *p);                      /* accepts NULL */
int pool_threads(const pool *p);
/* Runs fn over [0, n) in ranges; grain = minimum items per range. fn's tid is the
 * running thread's (0 .. threads-1: per-thread scratch stays private); one thread
 * may run several ranges. Blocks until every range is done. Not reentrant. p may
 * be NULL (runs inline). */
void pool_for(pool *p, int64_t n, int64_t grain, pool_fn fn, void *ctx);
int pool_default_threads(void);               /* physical cores, capped at 64 */

#endif
