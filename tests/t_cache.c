/* t_cache.c: expert cache leases and policies; io ring reads. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cache.h"
#include "io.h"
#include "test.h"

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

/* Random pin/publish/fail/unpin against a model of the leases: a leased slot is
 * never evicted (its key stays mapped to it), the slot count never grows. */
static void random_ops(int policy) {
    cache *c = NULL;
    enum { NK = 200, NS = 24, NOPS = 20000 };
    CHECK(cache_create(&c, NK, NS, 4096, policy, 4, 1, NULL, 0) == 0);
    if (!c) return;
    int held_slot[64], held_key[64], n_held = 0;
    uint64_t s = 0x9e3779b97f4a7c15ULL ^ (uint64_t)policy;
    int bad = 0;
    for (int op = 0; op < NOPS && !bad; op++) {
        uint64_t r = rng_next(&s);
        if (n_held < 40 && (r % 3 != 0 || n_held == 0)) {
            int64_t key = (int64_t)((rng_next(&s) % 1000) < 700 ? rng_next(&s) % 30 : rng_next(&s) % NK);
            int kind;
            if (rng_next(&s) % 8 == 0) { /* a read ahead: its own lease until it lands */
                int pf = cache_prefetch(c, key);
                if (pf >= 0) {
                    if (cache_key(c, pf) != key || cache_state(c, pf) != 1) { bad = 4; break; }
                    memset(cache_data(c, pf), (int)(key & 0xff), 4096);
                    cache_publish(c, pf);
                    cache_unpin(c, pf);
                    if (cache_find(c, key) != pf) { bad = 5; break; }
                } else if (cache_find(c, key) < 0 && cache_n_pinned(c) < NS) {
                    bad = 6; /* refused with a victim available */
                    break;
                }
                continue;
            }
            int sl = cache_pin(c, key, &kind);
            if (sl == STRATA_EBUDGET) { CHECK_MSG(cache_n_pinned(c) == NS, "policy %d pinned %lld", policy, (long long)cache_n_pinned(c)); continue; }
            if (sl < 0 || cache_key(c, sl) != key) { bad = 1; break; }
            if (kind == CACHE_MISS) {
                uint8_t *d = cache_data(c, sl);
                memset(d, (int)(key & 0xff), 4096);
                if (rng_next(&s) % 50 == 0) cache_fail(c, sl); else cache_publish(c, sl);
            } else if (kind == CACHE_HIT) {
                if (cache_data(c, sl)[17] != (uint8_t)(key & 0xff)) bad = 2;
            }
            held_slot[n_held] = sl;
            held_key[n_held++] = (int)key;
        } else {
            int j = (int)(rng_next(&s) % (uint64_t)n_held);
            /* the lease kept the slot: same key (unless its read failed) */
            if (cache_state(c, held_slot[j]) != 0 && cache_key(c, held_slot[j]) != held_key[j]) bad = 3;
            cache_unpin(c, held_slot[j]);
            held_slot[j] = held_slot[n_held - 1];
            held_key[j] = held_key[--n_held];
        }
        if (op % 97 == 0 && cache_check(c)) bad = 10 + cache_check(c);
    }
    CHECK_MSG(!bad, "policy %d: invariant %d", policy, bad);
    CHECK(cache_check(c) == 0);
    while (n_held) cache_unpin(c, held_slot[--n_held]);
    CHECK(cache_n_pinned(c) == 0 && cache_check(c) == 0);
    cache_stats st;
    cache_get_stats(c, &st);
    CHECK(st.requests == st.hits + st.misses + st.inflight_joins);
    cache_free(c);
}

TEST(cache_leases) {
    random_ops(CACHE_LRU);
    random_ops(CACHE_S3FIFO);
    random_ops(CACHE_LFU);
    random_ops(CACHE_LAYER);
    /* Exactly full: every slot leased -> EBUDGET, then one unpin frees a victim. */
    cache *c = NULL;
    CHECK(cache_create(&c, 100, 4, 4096, CACHE_S3FIFO, 1, 0, NULL, 0) == 0);
    int kind, sl[4];
    for (int i = 0; i < 4; i++) { sl[i] = cache_pin(c, i, &kind); CHECK(kind == CACHE_MISS); cache_publish(c, sl[i]); }
    CHECK(cache_pin(c, 50, &kind) == STRATA_EBUDGET);
    cache_unpin(c, sl[2]);
    int v = cache_pin(c, 50, &kind);
    CHECK(v == sl[2] && kind == CACHE_MISS);
    CHECK(cache_check(c) == 0);
    /* keys held per layer: an eviction gives one back, a failed read too */
    CHECK(cache_layer_held(c, 0) == 4 && cache_layer_held(c, 1) == 0 && cache_layer_held(c, -1) == 0);
    cache_fail(c, v);
    CHECK(cache_layer_held(c, 0) == 3 && cache_check(c) == 0);
    cache_free(c);
}

/* cache_seed: a prior count. A key read ahead and seeded with 2 outlives one
 * requested once (LFU, LAYER); LRU ignores the seed and evicts the older. */
TEST(cache_seed_prior) {
    const int pol[3] = {CACHE_LFU, CACHE_LAYER, CACHE_LRU};
    for (int p = 0; p < 3; p++) {
        cache *c = NULL;
        CHECK(cache_create(&c, 16, 2, 64, pol[p], 1, 0, NULL, 0) == 0);
        if (!c) continue;
        int kind;
        const int a = cache_prefetch(c, 3); /* the warm start's read: no request */
        CHECK(a >= 0);
        cache_seed(c, 3, 2);
        cache_publish(c, a);
        cache_unpin(c, a);
        const int b = cache_pin(c, 5, &kind);
        CHECK(b >= 0 && kind == CACHE_MISS);
        cache_publish(c, b);
        cache_unpin(c, b);
        const int v = cache_pin(c, 7, &kind); /* a third key: one of the two goes */
        CHECK(v >= 0 && kind == CACHE_MISS);
        CHECK_MSG(pol[p] == CACHE_LRU ? cache_find(c, 3) < 0 && cache_find(c, 5) == b : cache_find(c, 3) == a && cache_find(c, 5) < 0,
                  "policy %d", pol[p]);
        cache_publish(c, v);
        cache_unpin(c, v);
        CHECK(cache_check(c) == 0);
        cache_free(c);
    }
}

/* Replays a synthetic routing trace (skewed per-layer popularity, 8 of 64 experts
 * per layer, 30% of each token's choices repeated from the previous token) through
 * every policy at a few sizes, printing the true hit rate of each. */
TEST(cache_policy_trace) {
    enum { NL = 8, NE = 64, K = 8, NTOK = 400 };
    uint64_t s = 12345;
    static int32_t trace[NTOK][NL][K];
    for (int t = 0; t < NTOK; t++)
        for (int l = 0; l < NL; l++) {
            int n = 0;
            while (n < K) {
                int32_t e;
                if (t > 0 && rng_next(&s) % 10 < 3) e = trace[t - 1][l][rng_next(&s) % K];
                else { double u = (double)(rng_next(&s) % 1000000) / 1e6; e = (int32_t)(NE * u * u); }
                int dup = 0;
                for (int j = 0; j < n; j++) dup |= trace[t][l][j] == e;
                if (!dup) trace[t][l][n++] = e;
            }
        }
    int sizes[] = {K + 1, NL * NE / 8, NL * NE / 4, NL * NE / 2};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        double hr[4];
        for (int pol = 0; pol < 4; pol++) {
            cache *c = NULL;
            CHECK(cache_create(&c, NL * NE, sizes[si], 0, pol, NL, 0, NULL, 0) == 0);
            if (!c) return;
            for (int t = 0; t < NTOK; t++)
                for (int l = 0; l < NL; l++) {
                    int sl[K], kind;
                    for (int j = 0; j < K; j++) {
                        sl[j] = cache_pin(c, l * NE + trace[t][l][j], &kind);
                        CHECK(sl[j] >= 0);
                        if (kind == CACHE_MISS) cache_publish(c, sl[j]);
                    }
                    for (int j = 0; j < K; j++) cache_unpin(c, sl[j]);
                }
            cache_stats st;
            cache_get_stats(c, &st);
            hr[pol] = (double)st.hits / (double)st.requests;
            CHECK(cache_check(c) == 0);
            cache_free(c);
        }
        printf("    cache trace: %4d slots (%4.1f%% of pool): true hit S3-FIFO %5.1f%%  LRU %5.1f%%  LFU %5.1f%%  LAYER %5.1f%%\n",
               sizes[si], 100.0 * sizes[si] / (NL * NE), 100 * hr[0], 100 * hr[1], 100 * hr[2], 100 * hr[3]);
    }
}

TEST(io_ring_reads) {
    /* A file whose size is not a multiple of 4096: aligned reads past EOF succeed
     * when `need` is covered, fail when it is not. */
    enum { N = 3 * 1024 * 1024 + 777 };
    uint8_t *data = base_alloc(N, MEM_MISC);
    for (size_t i = 0; i < N; i++) data[i] = (uint8_t)(i * 131 + (i >> 13));
    char path[1024];
    snprintf(path, sizeof path, "%s/io.bin", t_tmpdir);
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, N, f);
    fclose(f);
    for (int no_uring = 0; no_uring < 2; no_uring++) {
        io_file fl;
        char err[512];
        CHECK(io_file_open(&fl, path, err, sizeof err) == 0);
        io_ring *r = NULL;
        CHECK(io_ring_create(&r, 4, 64 * 1024, no_uring, err, sizeof err) == 0);
        uint8_t *buf = base_alloc_aligned(io_align_up(N) + IO_ALIGN, IO_ALIGN, MEM_IO);
        io_req q[3];
        memset(q, 0, sizeof q);
        q[0] = (io_req){.f = &fl, .off = 0, .len = io_align_up(N), .need = N, .dst = buf};
        q[1] = (io_req){.f = &fl, .off = 4096, .len = 8192, .dst = buf + io_align_up(N) - 8192};
        io_submit(r, &q[0]);
        CHECK(io_reap(r, 1, &(io_req *){0}) == 1);
        CHECK(q[0].rc == 0 && memcmp(buf, data, N) == 0);
        io_submit(r, &q[1]);
        io_req *d;
        CHECK(io_reap(r, 1, &d) == 1 && d == &q[1] && d->rc == 0);
        CHECK(memcmp(q[1].dst, data + 4096, 8192) == 0);
        /* need beyond EOF: error */
        q[2] = (io_req){.f = &fl, .off = io_align_down(N), .len = 8192, .need = 8192, .dst = buf};
        io_submit(r, &q[2]);
        CHECK(io_reap(r, 1, &d) == 1 && d->rc == STRATA_EIO);
        io_req_errstr(d, err, sizeof err);
        CHECK(strstr(err, "short read") != NULL);
        /* unaligned helper */
        uint8_t small[100];
        uint8_t *bounce = base_alloc_aligned(3 * IO_ALIGN, IO_ALIGN, MEM_IO);
        CHECK(io_read_at(r, &fl, 5000, 100, small, bounce, err, sizeof err) == 0);
        CHECK(memcmp(small, data + 5000, 100) == 0);
        CHECK(io_pending(r) == 0);
        base_free(bounce);
        base_free(buf);
        io_ring_free(r);
        io_file_close(&fl);
    }
    base_free(data);
}
