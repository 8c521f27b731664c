/* wblk.c: block checksums of streamed matrices (wblk.h). */
#define XXH_STATIC_LINKING_ONLY
#include <stdio.h>
#include <xxhash.h>
#if defined(__x86_64__) && defined(__linux__)
#include <xxh_x86dispatch.h> /* AVX2 / AVX-512 XXH3 where the CPU has them (same values) */
#endif
#include "base.h"
#include "wblk.h"

void wblk_hash_cold(struct XXH3_state_s *h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t o = 0; o < n; o += WBLK_COLD_STEP) {
        const size_t m = n - o < WBLK_COLD_STEP ? n - o : WBLK_COLD_STEP;
        for (size_t a = o + WBLK_COLD_AHEAD, e = a + WBLK_COLD_STEP; a < e && a < n; a += 64)
            __builtin_prefetch(b + a, 0, 2); /* locality 2: prefetcht1 (L2) on x86 */
        XXH3_64bits_update(h, b + o, m);
    }
}

void wblk_reset(wblk *b, const uint8_t *p) {
    b->p = p;
    for (int64_t k = 0; k < b->n; k++) atomic_store_explicit(&b->done[k], 0, memory_order_relaxed);
    atomic_store_explicit(&b->bad, -1, memory_order_relaxed);
}

static void block(wblk *b, int64_t k) {
    if (atomic_load_explicit(&b->done[k], memory_order_relaxed)) return;
    const int64_t r0 = k * b->R, r1 = r0 + b->R < b->rows ? r0 + b->R : b->rows;
    const uint64_t n = (uint64_t)(r1 - r0) * b->row_bytes;
    const double t0 = base_now();
    const uint64_t got = XXH3_64bits(b->p + (uint64_t)r0 * b->row_bytes, n);
    atomic_fetch_add_explicit(&b->ns, (uint64_t)((base_now() - t0) * 1e9), memory_order_relaxed);
    atomic_fetch_add_explicit(&b->bytes, n, memory_order_relaxed);
    if (got == b->want[k]) {
        atomic_store_explicit(&b->done[k], 1, memory_order_relaxed);
    } else {
        int64_t none = -1;
        atomic_compare_exchange_strong(&b->bad, &none, k);
    }
}

void wblk_rows(wblk *b, int64_t r0, int64_t r1) {
    if (r0 < 0) r0 = 0;
    if (r1 > b->rows) r1 = b->rows;
    for (int64_t k = (r0 + b->R - 1) / b->R; k * b->R < r1; k++) block(b, k);
}

int wblk_check(wblk *b, const char *what, char *err, size_t errlen) {
    for (int64_t k = 0; k < b->n && atomic_load_explicit(&b->bad, memory_order_relaxed) < 0; k++) block(b, k);
    const int64_t k = atomic_load_explicit(&b->bad, memory_order_relaxed);
    if (k < 0) return 0;
    const int64_t r0 = k * b->R, r1 = r0 + b->R < b->rows ? r0 + b->R : b->rows;
    const uint64_t a = b->off + (uint64_t)r0 * b->row_bytes, z = b->off + (uint64_t)r1 * b->row_bytes;
    return base_fail(err, errlen, STRATA_ECORRUPT,
                     "%s: checksum mismatch in %s rows %lld..%lld, %s bytes %llu..%llu (expected %016llx, got %016llx): the "
                     "pack is corrupt or stale; run strata pack --verify",
                     what, b->name, (long long)r0, (long long)r1, b->path, (unsigned long long)a, (unsigned long long)z,
                     (unsigned long long)b->want[k],
                     (unsigned long long)XXH3_64bits(b->p + (uint64_t)r0 * b->row_bytes, (uint64_t)(r1 - r0) * b->row_bytes));
}
