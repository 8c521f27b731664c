/*
 * pool.h: one persistent pthread pool. pool_for splits [0, n) into contiguous
 * ranges, one per participating thread (the caller is thread 0). Work items must be
 * independent: a result is computed by exactly one thread in a fixed order, so
 * output bits never depend on the thread count.
 */
#ifndef STRATA_POOL_H
#define STRATA_POOL_H

#include <stdint.h>

typedef struct pool pool;
typedef void (*pool_fn)(void *ctx, int64_t i0, int64_t i1, int tid);

int pool_create(pool **out, int n_threads);  /* n_threads >= 1 (1 = caller only) */
void pool_free(pool *p);                      /* accepts NULL */
int pool_threads(const pool *p);
/* Runs fn over [0, n) in ranges; grain = minimum items per range. Blocks until done.
 * Not reentrant. p may be NULL (runs inline). */
void pool_for(pool *p, int64_t n, int64_t grain, pool_fn fn, void *ctx);
int pool_default_threads(void);               /* physical cores, capped at 64 */

#endif
