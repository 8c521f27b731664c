/*
 * membw.h: the memory read-bandwidth probe. The planner's prediction (plan.c,
 * `strata plan --measure`) and the benchmarks' ratios (bench/bw.h) use the same
 * one, so a predicted s/token and a measured ratio divide by the same figure.
 * It reads the way the decode kernels do: four streams a quarter of the range
 * apart, each prefetched 1 KB ahead, the widest loads the CPU has, summed over
 * a pool's threads.
 */
#ifndef STRATA_MEMBW_H
#define STRATA_MEMBW_H

#include <stddef.h>
#include <stdint.h>
#include "pool.h"

/* Best-of-reps GB/s of reading the whole buffer (bytes a multiple of 128, buf
 * 64-byte aligned) with the pool's threads. */
double bw_read(pool *p, const uint64_t *buf, size_t bytes, int reps);

/* bw_read over a fresh 512 MB buffer (MEM_IO, freed before return) with
 * n_threads threads (<= 0: pool_default_threads()), best of 5, in bytes/s; 0 when
 * the buffer or the pool cannot be had. Never call it inside a budget: the
 * buffer is not part of any plan. */
double membw_probe(int n_threads);

#endif
