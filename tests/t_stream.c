/* t_stream.c: the streaming weight source serves the bytes the shards hold, at
 * every budget, with and without a pack; plan refusals; the expert cache and a
 * process's peak within the budget. Bit identity of decodes: t_stream_bits.c;
 * damaged bytes and checksums: t_stream_verify.c. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "pack.h"
#include "stream_test.h"

static void stream_budgets(const char *preset, const char *dirname, int packed, int no_uring) {
    tstream_model m;
    const char *dir = tstream_preset_open(&m, preset, dirname, 11);
    if (!dir) return;
    char err[2048];
    if (packed) {
        pack_result pr;
        CHECK_MSG(pack_build(dir, &m.c, m.ix, NULL, 0, NULL, NULL, &pr, err, sizeof err) == 0, "%s", err);
    }
    uint64_t b[3];
    tstream_budgets(&m, dir, b);
    for (int i = 0; i < 3; i++) {
        for (int ra = 0; ra < 2; ra++) {
            place_opts o = tstream_opts(b[i]);
            o.pack_dir = packed ? NULL : "";
            o.no_uring = no_uring;
            o.no_readahead = ra;
            o.verify_reads = packed;
            place_plan p;
            wsrc *w = tstream_open(&m, dir, &o, &p);
            if (!w) continue;
            CHECK(p.has_pack == packed);
            if (i == 0) CHECK(p.n_pinned == 0 && !p.embed_resident);
            if (i == 2) CHECK(p.resident);
            int bad = tstream_compare_all(&m, w, i == 1);
            CHECK_MSG(bad == 0, "%s budget %llu packed %d: %d mismatches", preset, (unsigned long long)b[i], packed, bad);
            place_stats st;
            place_stats_get(w, &st);
            /* every request a resident hit, a miss or a read ahead (tstream_compare_all reads two ahead) */
            CHECK_MSG(st.expert_requests > 0 && st.expert_hits + st.expert_misses <= st.expert_requests &&
                          st.expert_requests <= st.expert_hits + st.expert_misses + st.prefetch_used,
                      "requests %llu hits %llu misses %llu read ahead and used %llu", (unsigned long long)st.expert_requests,
                      (unsigned long long)st.expert_hits, (unsigned long long)st.expert_misses, (unsigned long long)st.prefetch_used);
            if (i == 0) CHECK(st.bytes_trunk > 0);
            w->ops->close(w);
        }
    }
    tstream_model_close(&m);
}

TEST(stream_bytes_in_place) { stream_budgets("tiny-shards", "st_shards", 0, 0); }
TEST(stream_bytes_packed) { stream_budgets("tiny", "st_tiny", 1, 0); }
TEST(stream_bytes_pread) { stream_budgets("tiny-bf16experts", "st_bf16x", 0, 1); }
TEST(stream_bytes_mixed_packed) { stream_budgets("tiny-mixed", "st_mixed", 1, 0); }

TEST(stream_plan_refusal) {
    cfg c;
    cfg_k3(&c);
    place_opts o = tstream_opts(4000000000ull);
    o.ctx = 4096;
    o.prefill_chunk = 64;
    static place_plan p;
    char err[1024];
    /* the real K3 at 4 GB: a valid plan, peak within the budget */
    CHECK_MSG(place_plan_compute(&c, NULL, NULL, &o, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.total_bytes <= 4000000000ull && p.min_bytes < 4000000000ull);
    CHECK(p.ring_bytes >= p.ring_min_bytes && p.n_expert_slots >= c.topk);
    CHECK(p.prefill_chunk == 64); /* never lowered: unions stream through the cache */
    CHECK(p.pred_s_per_token > 0);
    /* issue 17: at 2 GB, every streamed unit in row slices (K3's lm_head is 2.35
     * GB): a valid plan, the sequence's state for the whole context inside it */
    o.ram_bytes = 2000000000ull;
    CHECK_MSG(place_plan_compute(&c, NULL, NULL, &o, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.sliced && p.total_bytes <= 2000000000ull && p.ring_bytes < 1000000000ull && p.seq_bytes > 500000000ull);
    CHECK(p.prefill_chunk == 64 && p.n_expert_slots >= c.topk && p.pred_s_per_token > 0);
    /* below the floor: refused, the minimum named */
    o.ram_bytes = 1000000000ull;
    CHECK(place_plan_compute(&c, NULL, NULL, &o, &p, err, sizeof err) == STRATA_EBUDGET);
    CHECK(strstr(err, "needs at least") != NULL);
    CHECK(p.min_bytes > 1000000000ull && p.min_bytes < 4000000000ull);
    /* more RAM pins more layers, largest first */
    o.ram_bytes = 24000000000ull;
    CHECK(place_plan_compute(&c, NULL, NULL, &o, &p, err, sizeof err) == 0);
    CHECK(p.n_pinned > 0 && p.pinned[0]); /* layer 0 (dense, the largest) first */
    CHECK(p.total_bytes <= 24000000000ull);
    /* CLI: exit 2 with the minimum; exit 0 with a plan */
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s plan --config /dev/null --ram-gb 1", t_strata());
    CHECK(t_run(cmd, NULL) == 1); /* not a config */
    const char *cj = t_write("k3.json", "", 0);
    char *js = cfg_to_json(&c);
    cj = t_write("k3.json", js, strlen(js));
    base_free(js);
    snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 1", t_strata(), cj);
    CHECK(t_run(cmd, &out) == 2);
    CHECK_MSG(out && strstr(out, "needs at least"), "%s", out ? out : "");
    base_free(out);
    snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 4", t_strata(), cj);
    CHECK(t_run(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "predicted decode"), "%s", out ? out : "");
    base_free(out);
}

/* The plan counts every byte the streaming source allocates for its expert cache
 * (the slots and, per slot, the read and binding records and the cache's
 * tables): at ladder's 16 GB rung 7,990 slots carried 38 MB the plan did not
 * count, and the peak went 8 MB over the budget. */
TEST(stream_cache_counted) {
    tstream_model m;
    const char *dir = tstream_preset_open(&m, "tiny", "st_cc", 9);
    if (!dir) return;
    char err[512];
    place_opts o = tstream_opts(1ull << 40);
    place_plan p;
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == 0);
    const uint64_t budgets[2] = {p.total_bytes, p.min_bytes + (p.total_bytes - p.min_bytes) / 2};
    for (int i = 0; i < 2; i++) {
        o.ram_bytes = budgets[i];
        const uint64_t before = base_mem_used_tag(MEM_CACHE);
        wsrc *w = tstream_open(&m, dir, &o, &p);
        if (!w) continue;
        const uint64_t used = base_mem_used_tag(MEM_CACHE) - before;
        CHECK(p.n_expert_slots > p.min_expert_slots && p.slot_meta_bytes > 0);
        CHECK_MSG(used <= p.cache_bytes && used + p.cache_bytes / 50 >= p.cache_bytes,
                  "budget %llu: %lld slots, the cache allocated %llu bytes, the plan counted %llu", (unsigned long long)budgets[i],
                  (long long)p.n_expert_slots, (unsigned long long)used, (unsigned long long)p.cache_bytes);
        w->ops->close(w);
    }
    tstream_model_close(&m);
}

/* A child process decodes at a budget computed in the child (its own baseline
 * RSS): its peak RSS stays within the budget, and its ids equal the resident run's. */
TEST(stream_child_rss) {
    const char *dir = tpack_model("tiny", "st_rss", 9);
    if (!dir) { CHECK(0); return; }
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        tstream_model m;
        uint64_t out[2] = {0, 0};
        if (tstream_model_open(&m, dir) == 0) {
            int32_t want[4], got[4];
            float *l = base_alloc((size_t)m.c.vocab * sizeof(float), MEM_MISC);
            tstream_decode(&m, m.res, 4, want, 4, l);
            place_opts o = tstream_opts(1ull << 40);
            o.overhead_bytes = 0; /* measure this process */
            place_plan p;
            char err[512];
            place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err);
            o.ram_bytes = p.min_bytes + (p.total_bytes - p.min_bytes) / 4;
            wsrc *w = NULL;
            if (!place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) &&
                !place_open(&w, &m.c, m.ix, dir, &p, err, sizeof err) && !tstream_decode(&m, w, p.prefill_chunk, got, 4, l) &&
                !memcmp(want, got, sizeof want))
                out[0] = o.ram_bytes;
            if (w) w->ops->close(w);
            out[1] = base_peak_rss();
        }
        if (write(fds[1], out, sizeof out) != sizeof out) _exit(3);
        _exit(0);
    }
    close(fds[1]);
    uint64_t got[2] = {0, 0};
    CHECK(read(fds[0], got, sizeof got) == sizeof got);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK_MSG(WIFEXITED(st) && got[0] > 0, "child failed");
    /* the child's getrusage(RUSAGE_SELF) peak: RUSAGE_CHILDREN in this runner would
     * also cover every earlier child (CLI runs of other suites) */
    CHECK_MSG(got[1] <= got[0], "peak RSS %llu over the budget %llu", (unsigned long long)got[1], (unsigned long long)got[0]);
}
