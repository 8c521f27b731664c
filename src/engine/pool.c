/*
 * pool.c: one persistent pthread pool. Workers are created once and park on a
 * condition variable; pool_for publishes a job, cuts [0, n) into up to
 * POOL_CHUNKS ranges per thread (longest first, the last ones short: range_end),
 * and every thread (the caller included) claims ranges from a shared counter
 * until none are left. The caller returns when every range is finished; it does
 * not wait for a worker that claimed nothing.
 *
 * Why claiming instead of one fixed range per thread: the machine is shared, and
 * a worker that is runnable but not running (another process holds its core)
 * stalled every fixed split until it ran; now the caller takes its ranges and
 * goes on. Measured on the 2-core VM with another process busy: demo decode with
 * 2 threads was no faster than with 1 and sometimes 1.7x slower (static split),
 * see the commit that introduced this file's claiming.
 *
 * Why spin first: a decode step issues hundreds of pool_for calls, so a wake-up
 * through the kernel on every call would dominate. Workers and the caller spin on
 * C11 atomics for a short while (POOL_SPIN iterations, about 150 us here) before
 * sleeping: long enough to bridge the serial work between two matmuls, short
 * enough not to burn a core through an I/O wait.
 *
 * Jobs live in a ring of POOL_RING slots, so a worker that wakes late never reads
 * a job description that is being rewritten: before reusing a slot the caller
 * marks it invalid and waits until no worker announces it is reading it (a
 * Dekker-style handshake on seq_cst atomics; see slot_reuse). Plain job fields
 * are written before the release of the slot id and read after its acquire, so
 * the pool is data-race free (TSan-clean by construction).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "base.h"
#include "pool.h"

#define POOL_MAX_THREADS 64
#define POOL_SPIN 4096  /* ~38 ns per pause-or-yield iteration on the dev VM */
#define POOL_RING 64    /* job slots; a slot is reused 64 jobs later */
#define POOL_CHUNKS 4   /* ranges per thread a job is cut into (at most) */
#define POOL_IDLE 0u    /* a worker's `reading` when it reads no slot (gen 0 is never a job) */

typedef struct {
    atomic_uint id;     /* generation whose job this slot holds; 0 while rewritten */
    pool_fn fn;
    void *ctx;
    int64_t n;          /* items */
    int nc;             /* ranges */
    int guided;         /* ranges shrink toward the end (range_end) */
    atomic_int next;    /* next range to claim (may run past nc) */
    atomic_int done;    /* ranges finished */
} slot;

typedef struct {
    atomic_uint reading; /* generation whose slot this worker may be reading, or POOL_IDLE */
    char pad[60];
} wstate;

struct pool {
    int n;                  /* threads including the caller */
    pthread_t *th;          /* n - 1 workers */
    wstate *ws;             /* n - 1 worker states */
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* workers wait for a new generation */
    pthread_cond_t cv_done; /* caller waits for its job's last range */
    atomic_uint gen;        /* last published job (and once more for shutdown) */
    atomic_int stop;
    atomic_int busy;        /* a pool_for is running (misuse check) */
    atomic_int sleepers;    /* workers parked on cv_work */
    atomic_int caller_waits; /* the caller is parked on cv_done */
    unsigned last;          /* caller side: last generation published */
    slot ring[POOL_RING];
};

typedef struct { pool *p; int tid; } worker_arg;

/* Set while a thread runs a range of a threaded pool_for: a nested threaded
 * pool_for would deadlock (the workers are busy with the outer call), so it is
 * asserted against. Inline calls (NULL pool, 1 thread, one range) may nest. */
static _Thread_local int t_in_pool;

/* Spin iteration s: a pause, and every 64th a sched_yield so that with more
 * threads than cores (a shared machine, or a test asking for 4 threads on 2 cores)
 * the thread we wait for gets the CPU. Measured on 2 cores: 3 threads with pure
 * pause-spinning took 650 us per empty pool_for, with the yield 6 us. */
static inline void spin_wait(int s) {
    if ((s & 63) == 63) { sched_yield(); return; }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Start of range k of slot j (k = nc: the end). Guided: range k has 2 (nc - k)
 * - 1 parts in nc^2, so the first ranges are the longest and the last one is
 * 1/nc^2 of the job: the thread that finishes first waits for at most a short
 * range. Equal ranges left one thread idle for about a range at the end of
 * each job: ladder-shaped bf16 jobs (2-25 MB, 5 per layer) through the pool on
 * the 2-core Xeon VM, interleaved rounds: the two threads' ends 32-67 us apart
 * per job (a range is ~40 us), one thread busy 88-95% of the time; guided: 6-16
 * us, both 97-99%, 22.8-27.2 against 21.2-24.7 GB/s. Ladder at 16 GB, 7
 * interleaved pairs of 120 tokens: 0.1265 against 0.1387 s/token (bench/RESULTS.md, xeon3). */
static int64_t range_end(const slot *j, int k) {
    if (!j->guided) return j->n * k / j->nc;
    /* n - floor(n r^2 / q^2) without overflow (0 at k = 0, n at k = nc):
     * n = a q^2 + b with b < q^2 <= 2^16 */
    const int64_t r2 = (int64_t)(j->nc - k) * (j->nc - k), q2 = (int64_t)j->nc * j->nc;
    const int64_t a = j->n / q2, b = j->n % q2;
    return j->n - (a * r2 + b * r2 / q2);
}

/* Claims and runs ranges of slot j until none are left. */
static void run_ranges(pool *p, slot *j, int tid) {
    int k;
    while ((k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->nc) {
        const int64_t i0 = range_end(j, k), i1 = range_end(j, k + 1);
        t_in_pool = 1;
        if (i1 > i0) j->fn(j->ctx, i0, i1, tid);
        t_in_pool = 0;
        if (atomic_fetch_add_explicit(&j->done, 1, memory_order_seq_cst) + 1 == j->nc &&
            atomic_load_explicit(&p->caller_waits, memory_order_seq_cst)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker_main(void *arg) {
    pool *p = ((worker_arg *)arg)->p;
    const int tid = ((worker_arg *)arg)->tid;
    wstate *me = &p->ws[tid - 1];
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int s = 0; g == seen && s < POOL_SPIN; s++) {
            spin_wait(s);
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add_explicit(&p->sleepers, 1, memory_order_seq_cst);
            while ((g = atomic_load_explicit(&p->gen, memory_order_seq_cst)) == seen)
                pthread_cond_wait(&p->cv_work, &p->mu);
            atomic_fetch_sub_explicit(&p->sleepers, 1, memory_order_seq_cst);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g; /* older generations are finished: the caller waited for them */
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        /* announce, then check the slot still holds generation g (slot_reuse) */
        slot *j = &p->ring[g % POOL_RING];
        atomic_store_explicit(&me->reading, g, memory_order_seq_cst);
        if (atomic_load_explicit(&j->id, memory_order_seq_cst) == g) run_ranges(p, j, tid);
        atomic_store_explicit(&me->reading, POOL_IDLE, memory_order_release);
    }
}

/* Makes slot j (last used by generation old) writable: marks it invalid, then
 * waits until no worker announces reading `old`. A worker that announces after
 * our check sees the invalid id (both sides seq_cst) and leaves the slot alone.
 * Waits only when a worker stalled inside a job POOL_RING jobs ago. */
static void slot_reuse(pool *p, slot *j, unsigned old) {
    atomic_store_explicit(&j->id, 0u, memory_order_seq_cst);
    if (old == 0) return;
    for (int w = 0; w < p->n - 1; w++)
        for (int s = 0; atomic_load_explicit(&p->ws[w].reading, memory_order_seq_cst) == old; s++)
            spin_wait(s);
}

int pool_create(pool **out, int n_threads) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > POOL_MAX_THREADS) n_threads = POOL_MAX_THREADS;
    pool *p = base_calloc(1, sizeof *p, MEM_MISC);
    if (!p) return STRATA_ENOMEM;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->busy, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_waits, 0);
    for (int i = 0; i < POOL_RING; i++) {
        atomic_init(&p->ring[i].id, 0u);
        atomic_init(&p->ring[i].next, 0);
        atomic_init(&p->ring[i].done, 0);
    }
    if (n_threads > 1) {
        /* one block: thread handles, worker states, then the argument records */
        size_t nw = (size_t)n_threads - 1;
        p->ws = base_alloc_aligned(nw * (sizeof(wstate) + sizeof(pthread_t) + sizeof(worker_arg)), 64, MEM_MISC);
        if (!p->ws) { p->n = 1; pool_free(p); return STRATA_ENOMEM; }
        p->th = (pthread_t *)(p->ws + nw);
        worker_arg *args = (worker_arg *)(p->th + nw);
        for (size_t i = 0; i < nw; i++) atomic_init(&p->ws[i].reading, POOL_IDLE);
        for (size_t i = 0; i < nw; i++) {
            args[i] = (worker_arg){p, (int)i + 1};
            if (pthread_create(&p->th[i], NULL, worker_main, &args[i]) != 0) {
                p->n = (int)i + 1; /* join the ones that started */
                pool_free(p);
                return STRATA_ENOMEM;
            }
        }
    }
    *out = p;
    return 0;
}

void pool_free(pool *p) {
    if (!p) return;
    if (p->n > 1 && p->th) {
        pthread_mutex_lock(&p->mu);
        atomic_store_explicit(&p->stop, 1, memory_order_release);
        atomic_fetch_add_explicit(&p->gen, 1, memory_order_seq_cst);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n - 1; i++) pthread_join(p->th[i], NULL);
    }
    base_free(p->ws);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    base_free(p);
}

int pool_threads(const pool *p) { return p ? p->n : 1; }

void pool_for(pool *p, int64_t n, int64_t grain, pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t want = (n + grain - 1) / grain;
    if (!p || p->n == 1 || want <= 1) { fn(ctx, 0, n, 0); return; }
    ST_ASSERT(!t_in_pool); /* pool_for from inside a threaded pool_for callback */
    ST_ASSERT(atomic_exchange(&p->busy, 1) == 0); /* two threads driving one pool */
    const unsigned g = ++p->last;
    ST_ASSERT(g != 0); /* 2^32 jobs: POOL_IDLE and the invalid id would be ambiguous */
    slot *j = &p->ring[g % POOL_RING];
    slot_reuse(p, j, g > POOL_RING ? g - POOL_RING : 0);
    j->fn = fn;
    j->ctx = ctx;
    j->n = n;
    j->nc = want < (int64_t)p->n * POOL_CHUNKS ? (int)want : p->n * POOL_CHUNKS;
    /* two or more ranges per thread, and the last (1/nc^2 of n) still grain items */
    j->guided = j->nc >= 2 * p->n && n / ((int64_t)j->nc * j->nc) >= grain;
    atomic_store_explicit(&j->next, 0, memory_order_relaxed);
    atomic_store_explicit(&j->done, 0, memory_order_relaxed);
    atomic_store_explicit(&j->id, g, memory_order_seq_cst);
    atomic_store_explicit(&p->gen, g, memory_order_seq_cst);
    if (atomic_load_explicit(&p->sleepers, memory_order_seq_cst) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
    }
    run_ranges(p, j, 0);
    int s = 0;
    for (; s < POOL_SPIN; s++) {
        if (atomic_load_explicit(&j->done, memory_order_acquire) == j->nc) break;
        spin_wait(s);
    }
    if (s == POOL_SPIN) {
        pthread_mutex_lock(&p->mu);
        atomic_store_explicit(&p->caller_waits, 1, memory_order_seq_cst);
        while (atomic_load_explicit(&j->done, memory_order_seq_cst) != j->nc) pthread_cond_wait(&p->cv_done, &p->mu);
        atomic_store_explicit(&p->caller_waits, 0, memory_order_relaxed);
        pthread_mutex_unlock(&p->mu);
    }
    atomic_store_explicit(&p->busy, 0, memory_order_release);
}

/* Physical cores: distinct (package, core) pairs in sysfs topology; falls back to
 * the online CPU count when sysfs is unreadable. */
int pool_default_threads(void) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    int n = 0;
    enum { MAXC = 1024 };
    long local[MAXC];
    for (long c = 0; c < online && c < MAXC; c++) {
        char path[128];
        long pkg = -1, core = -1;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/physical_package_id", c);
        FILE *f = fopen(path, "r");
        if (f) { if (fscanf(f, "%ld", &pkg) != 1) pkg = -1; fclose(f); }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/core_id", c);
        f = fopen(path, "r");
        if (f) { if (fscanf(f, "%ld", &core) != 1) core = -1; fclose(f); }
        if (pkg < 0 || core < 0) { n = 0; break; }
        long key = pkg * 100000 + core;
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= local[j] == key;
        if (!dup) local[n++] = key;
    }
    if (n == 0) n = (int)online;
    if (n > POOL_MAX_THREADS) n = POOL_MAX_THREADS;
    return n;
}
