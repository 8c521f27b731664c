/* t_pool.c: the persistent pool: coverage of [0, n) exactly once, many tiny calls,
 * stalled workers, results independent of the thread count, clean shutdown. */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>
#include "kern.h"
#include "pool.h"
#include "test.h"

typedef struct { int *hits; int bad; int nthreads; int64_t last_i1[64]; } cover_ctx;

static void cover_fn(void *vctx, int64_t i0, int64_t i1, int tid) {
    cover_ctx *c = vctx;
    if (tid < 0 || tid >= c->nthreads || i0 >= i1) c->bad = 1; /* benign: only set to 1 */
    for (int64_t i = i0; i < i1; i++) c->hits[i]++;
    c->last_i1[tid] = i1;
}

TEST(pool_cover) {
    int d = pool_default_threads();
    CHECK(d >= 1 && d <= 64);
    for (int nt = 1; nt <= 5; nt++) {
        pool *p = NULL;
        CHECK(pool_create(&p, nt) == 0 && p);
        CHECK(pool_threads(p) == nt);
        static const int64_t ns[] = {1, 2, 3, 7, 64, 1001, 10007};
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int64_t grain = 1; grain <= 300; grain *= 17) {
                int64_t n = ns[k];
                cover_ctx c = {.nthreads = nt};
                c.hits = base_calloc((size_t)n, sizeof(int), MEM_MISC);
                pool_for(p, n, grain, cover_fn, &c);
                int ok = !c.bad;
                for (int64_t i = 0; i < n; i++) ok &= c.hits[i] == 1;
                CHECK_MSG(ok, "nt=%d n=%lld grain=%lld", nt, (long long)n, (long long)grain);
                base_free(c.hits);
            }
        pool_free(p);
    }
    cover_ctx c = {.nthreads = 1};
    c.hits = base_calloc(10, sizeof(int), MEM_MISC);
    pool_for(NULL, 10, 1, cover_fn, &c); /* inline */
    CHECK(!c.bad && c.hits[0] == 1 && c.hits[9] == 1 && c.last_i1[0] == 10);
    base_free(c.hits);
    pool_free(NULL);
}

typedef struct { atomic_llong sum; } sum_ctx;
static void sum_fn(void *vctx, int64_t i0, int64_t i1, int tid) {
    sum_ctx *c = vctx;
    long long s = 0;
    for (int64_t i = i0; i < i1; i++) s += i + 1;
    atomic_fetch_add(&c->sum, s);
}

TEST(pool_many_calls) {
    pool *p = NULL;
    CHECK(pool_create(&p, 3) == 0);
    sum_ctx c;
    atomic_init(&c.sum, 0);
    long long want = 0;
    for (int k = 0; k < 10000; k++) {
        int64_t n = 1 + k % 7;
        pool_for(p, n, 1, sum_fn, &c);
        want += n * (n + 1) / 2;
    }
    CHECK(atomic_load(&c.sum) == want);
    pool_free(p);
    for (int k = 0; k < 20; k++) { /* create/free churn, with and without work */
        CHECK(pool_create(&p, 2 + k % 3) == 0);
        if (k & 1) pool_for(p, 100, 1, sum_fn, &c);
        pool_free(p);
    }
}

typedef struct { const float *W, *X; float *Y; int64_t cols; } mv_ctx;
static void mv_fn(void *vctx, int64_t i0, int64_t i1, int tid) {
    mv_ctx *c = vctx;
    for (int64_t r = i0; r < i1; r++) c->Y[r] = K.dot(c->W + r * c->cols, c->X, c->cols);
}

TEST(pool_deterministic) {
    enum { R = 301, C = 77 };
    float *W = base_alloc(sizeof(float) * R * C, MEM_MISC), X[C], Y1[R], Y[R];
    uint32_t s = 12345;
    for (int i = 0; i < R * C; i++) { s = s * 1664525u + 1013904223u; W[i] = (float)(int32_t)s * 0x1p-31f; }
    for (int i = 0; i < C; i++) X[i] = (float)(i % 13) - 6.5f;
    mv_ctx c = {W, X, Y1, C};
    pool_for(NULL, R, 1, mv_fn, &c);
    for (int nt = 1; nt <= 4; nt++) {
        pool *p;
        CHECK(pool_create(&p, nt) == 0);
        c.Y = Y;
        memset(Y, 0, sizeof Y);
        pool_for(p, R, 8, mv_fn, &c);
        CHECK(memcmp(Y, Y1, sizeof Y) == 0);
        pool_free(p);
    }
    base_free(W);
}

/* Large jobs are cut into ranges that shrink toward the end, so the thread that
 * finishes first waits for at most a short one; small jobs (the last range would
 * fall under grain) keep equal ranges. */
typedef struct { atomic_int n; int64_t a[256], b[256]; } rng_ctx;
static void rng_fn(void *vctx, int64_t i0, int64_t i1, int tid) {
    rng_ctx *c = vctx;
    const int k = atomic_fetch_add(&c->n, 1);
    if (k < 256) { c->a[k] = i0; c->b[k] = i1; }
}

TEST(pool_ranges_shrink) {
    for (int nt = 2; nt <= 4; nt++) {
        pool *p = NULL;
        CHECK(pool_create(&p, nt) == 0);
        for (int big = 0; big < 2; big++) {
            const int64_t n = big ? 1000000 : 1000, grain = 100;
            rng_ctx c;
            atomic_init(&c.n, 0);
            pool_for(p, n, grain, rng_fn, &c);
            const int m = atomic_load(&c.n);
            int64_t first = 0, last = 0, covered = 0, lo = n;
            for (int k = 0; k < m; k++) {
                covered += c.b[k] - c.a[k];
                if (c.a[k] == 0) first = c.b[k];
                if (c.b[k] == n) last = n - c.a[k];
                if (c.b[k] - c.a[k] < lo) lo = c.b[k] - c.a[k];
            }
            const int want = n / grain < 4 * nt ? (int)(n / grain) : 4 * nt; /* POOL_CHUNKS per thread */
            CHECK_MSG(covered == n && m == want, "nt=%d n=%lld: %d ranges", nt, (long long)n, m);
            CHECK_MSG(lo >= grain, "nt=%d n=%lld: a range of %lld < grain", nt, (long long)n, (long long)lo);
            if (big) CHECK_MSG(last * 8 < first, "nt=%d: first range %lld, last %lld", nt, (long long)first, (long long)last);
            else CHECK_MSG(first == last, "nt=%d small job: first range %lld, last %lld", nt, (long long)first, (long long)last);
        }
        pool_free(p);
    }
}

/* Workers that stall (sleep inside a range) while the caller runs on through many
 * jobs: ranges are still covered exactly once, and job slots are reused only
 * when no worker can still be reading them (thousands of jobs, 64 slots). */
typedef struct { atomic_llong sum; atomic_int calls; } stall_ctx;
static void stall_fn(void *vctx, int64_t i0, int64_t i1, int tid) {
    stall_ctx *c = vctx;
    long long s = 0;
    for (int64_t i = i0; i < i1; i++) s += i + 1;
    atomic_fetch_add(&c->sum, s);
    if (tid != 0 && atomic_fetch_add(&c->calls, 1) % 97 == 0) usleep(200);
}

TEST(pool_stalled_workers) {
    for (int nt = 2; nt <= 4; nt++) {
        pool *p = NULL;
        CHECK(pool_create(&p, nt) == 0);
        stall_ctx c;
        atomic_init(&c.sum, 0);
        atomic_init(&c.calls, 0);
        long long want = 0;
        for (int k = 0; k < 3000; k++) {
            int64_t n = 1 + k % 61;
            pool_for(p, n, 1, stall_fn, &c);
            want += n * (n + 1) / 2;
            CHECK(atomic_load(&c.sum) == want); /* every range done when pool_for returns */
        }
        pool_free(p);
    }
}
