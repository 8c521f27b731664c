/* t_stream_bits.c: streaming never changes bits: greedy decodes at every
 * budget, with reads ahead and the warm start on and off, in row slices, through
 * the CLI, and around rolled-back self-draft passes give the resident source's
 * ids and logits bits. */
#include <stdlib.h>
#include <string.h>
#include "pack.h"
#include "stream_test.h"

/* `strata pack DIR && strata plan DIR --json`: the plan's minimum and total
 * bytes; 0, or -1 after a failed check. */
static int cli_plan_bytes(const char *dir, uint64_t *min, uint64_t *total) {
    char cmd[2400], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s pack %s >/dev/null && %s plan %s --ram-gb 50 --json", t_strata(), dir, t_strata(), dir);
    CHECK(t_run(cmd, &out) == 0);
    const char *a = out ? strstr(out, "\"min_bytes\": ") : NULL, *b = out ? strstr(out, "\"total_bytes\": ") : NULL;
    CHECK_MSG(a && b, "%s", out ? out : "");
    *min = a ? strtoull(a + 13, NULL, 10) : 0;
    *total = b ? strtoull(b + 15, NULL, 10) : 0;
    base_free(out);
    return a && b ? 0 : -1;
}

TEST(stream_decode_identical) {
    tstream_model m;
    const char *dir = tstream_preset_open(&m, "tiny", "st_dec", 5);
    if (!dir) return;
    tstream_pair d;
    tstream_pair_init(&d, &m, 6, 1);
    uint64_t b[3];
    char err[1024], what[96];
    for (int packed = 0; packed < 2; packed++) {
        if (packed) {
            pack_result pr;
            CHECK(pack_build(dir, &m.c, m.ix, NULL, 0, NULL, NULL, &pr, err, sizeof err) == 0);
        }
        tstream_budgets(&m, dir, b); /* a pack changes the unit sizes */
        for (int i = 0; i < 3; i++) {
            place_opts o = tstream_opts(b[i]);
            place_plan p;
            wsrc *w = tstream_open(&m, dir, &o, &p);
            if (!w) continue;
            snprintf(what, sizeof what, "budget %llu packed %d", (unsigned long long)b[i], packed);
            tstream_pair_same(&d, &m, w, p.prefill_chunk, what);
            w->ops->close(w);
        }
    }
    tstream_pair_free(&d);
    tstream_model_close(&m);
}

/* `strata run` of dir with and without the switch `off_flag` (a speed option) at
 * the budget ram: the same ids and logits bits; the report has a line starting
 * with `report` only with the option on. Files are t_tmpdir/TAG_{0,1}.{bin,err}. */
static void cli_off_identity(const char *dir, const char *tag, const char *ids, int gen, uint64_t ram,
                             const char *off_flag, const char *report) {
    char cmd[4096], *ia = NULL, *ib = NULL;
    for (int off = 0; off < 2; off++) {
        snprintf(cmd, sizeof cmd, "%s run %s --ids %s --gen %d --print-ids --ram %llu %s --dump-logits %s/%s_%d.bin 2>%s/%s_%d.err",
                 t_strata(), dir, ids, gen, (unsigned long long)ram, off ? off_flag : "", t_tmpdir, tag, off, t_tmpdir, tag, off);
        CHECK_MSG(t_run(cmd, off ? &ib : &ia) == 0, "%s", cmd);
    }
    CHECK_MSG(ia && ib && !strcmp(ia, ib), "ids %s vs %s with %s", ia ? ia : "", ib ? ib : "", off_flag);
    snprintf(cmd, sizeof cmd, "cmp -s %s/%s_0.bin %s/%s_1.bin && grep -q '^%s' %s/%s_0.err && ! grep -q '^%s' %s/%s_1.err", t_tmpdir,
             tag, t_tmpdir, tag, report, t_tmpdir, tag, report, t_tmpdir, tag);
    CHECK_MSG(t_run(cmd, NULL) == 0, "logits bits or reports differ: %s", cmd);
    base_free(ia);
    base_free(ib);
}

/* Expert reads a layer ahead never change bits: greedy decode with prefetch on
 * and off at budgets where the trunk is pinned and the cache has room gives the
 * same ids and logits bits, and the predictions are made and used. */
TEST(stream_prefetch_identity) {
    tstream_model m;
    const char *dir = tstream_preset_open(&m, "tiny", "st_pf", 6);
    if (!dir) return;
    tstream_pair d;
    tstream_pair_init(&d, &m, 8, 0);
    uint64_t b[3];
    tstream_budgets(&m, dir, b);
    char what[96];
    uint64_t pred = 0, reads = 0;
    int64_t copies = 0;
    /* the third holds every expert (the warm start reads them all): there the
     * guesses find everything in RAM, and most of them are skipped */
    const uint64_t budgets[3] = {b[1], b[1] + (b[1] - b[0]), 1ull << 40};
    for (int i = 0; i < 3; i++)
        for (int off = 1; off >= 0; off--) {
            place_opts o = tstream_opts(budgets[i]);
            o.no_prefetch = off;
            place_plan p;
            wsrc *w = tstream_open(&m, dir, &o, &p);
            if (!w) continue;
            CHECK(tstream_decode(&m, w, p.prefill_chunk, off ? d.want : d.got, d.g, off ? d.wl : d.gl) == 0);
            place_stats st;
            place_stats_get(w, &st);
            if (off) {
                CHECK(st.pred_layers == 0 && st.prefetch_reads == 0);
            } else {
                snprintf(what, sizeof what, "budget %llu with prefetch", (unsigned long long)budgets[i]);
                tstream_pair_check(&d, &m, what);
                CHECK(st.pred_hits <= st.pred_requests && st.prefetch_used <= st.prefetch_reads);
                /* the guesses' router copies: one per pinned MoE unit where planned, lent */
                CHECK(st.guess_copies == p.n_guess && (p.n_guess == 0) == (st.guess_lends == 0 || i == 2));
                copies += st.guess_copies;
                if (i == 2) CHECK_MSG(st.prefetch_reads == 0 && st.pred_skipped > st.pred_layers,
                                      "everything in RAM: %llu read ahead, %llu guesses skipped, %llu layers predicted",
                                      (unsigned long long)st.prefetch_reads, (unsigned long long)st.pred_skipped,
                                      (unsigned long long)st.pred_layers);
                pred += st.pred_layers;
                reads += st.prefetch_reads;
                printf("    budget %llu: %llu slots, %llu layers predicted, %.1f%% of requests predicted, %llu read ahead, %llu used\n",
                       (unsigned long long)budgets[i], (unsigned long long)p.n_expert_slots, (unsigned long long)st.pred_layers,
                       st.pred_requests ? 100.0 * (double)st.pred_hits / (double)st.pred_requests : 0.0,
                       (unsigned long long)st.prefetch_reads, (unsigned long long)st.prefetch_used);
            }
            w->ops->close(w);
        }
    CHECK(pred > 0 && reads > 0 && copies > 0);
    tstream_pair_free(&d);
    tstream_model_close(&m);
    /* the CLI: --no-prefetch gives the same ids and logits bits; the run report
     * says what was predicted */
    uint64_t lo, hi;
    cli_plan_bytes(dir, &lo, &hi);
    const uint64_t ram = lo + (hi > lo ? (hi - lo) / 2 : 0) + (4u << 20);
    cli_off_identity(dir, "st_pf", "1,2,3,4,5,6,7", 6, ram, "--no-prefetch", "prefetch: ");
}

/* The warm start never changes bits: decode with and without it at a budget that
 * holds a part of the experts and at one that holds them all gives the same ids
 * and logits bits; with every expert preloaded no expert is read afterwards, and
 * the partial preload fills the cache with each layer's share. */
static void preload_progress(void *ud, uint64_t done, uint64_t total) {
    uint64_t *last = ud;
    if (done < last[0] || done > total) last[2]++; /* never backwards, never past the total */
    last[0] = done;
    last[1] = total;
}

TEST(stream_preload_identity) {
    tstream_model m;
    const char *dir = tstream_preset_open(&m, "tiny", "st_pl", 8);
    if (!dir) return;
    tstream_pair d;
    tstream_pair_init(&d, &m, 6, 0);
    char err[1024], what[96];
    const int64_t n_exp = (m.c.n_layers - m.c.first_dense) * m.c.n_experts;
    place_plan full;
    place_opts fo = tstream_opts(1ull << 40);
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &fo, &full, err, sizeof err) == 0);
    /* the whole trunk pinned, a third of the experts cached; and everything */
    const uint64_t budgets[2] = {full.total_bytes - (uint64_t)(2 * n_exp / 3) * full.expert_slot_bytes, 1ull << 40};
    for (int i = 0; i < 2; i++)
        for (int off = 1; off >= 0; off--) {
            place_opts o = tstream_opts(budgets[i]);
            o.no_preload = off;
            uint64_t prog[3] = {0, 0, 0};
            o.progress = preload_progress;
            o.progress_ud = prog;
            place_plan p;
            wsrc *w = tstream_open(&m, dir, &o, &p);
            if (!w) continue;
            place_stats st;
            place_stats_get(w, &st);
            if (off) {
                CHECK(st.preload_bytes == 0 && prog[1] == 0);
            } else {
                CHECK(p.n_pinned == p.n_units);
                CHECK(st.preload_bytes > 0 && prog[1] > 0 && prog[0] == prog[1] && prog[2] == 0);
                CHECK_MSG(st.preload_experts == (p.n_expert_slots < n_exp ? p.n_expert_slots : n_exp), "%lld experts preloaded, %lld slots",
                          (long long)st.preload_experts, (long long)p.n_expert_slots);
            }
            place_stats_reset(w);
            CHECK(tstream_decode(&m, w, p.prefill_chunk, off ? d.want : d.got, d.g, off ? d.wl : d.gl) == 0);
            place_stats_get(w, &st);
            if (!off) {
                snprintf(what, sizeof what, "budget %llu with the warm start", (unsigned long long)budgets[i]);
                tstream_pair_check(&d, &m, what);
                if (p.n_expert_slots >= n_exp) CHECK(st.bytes_experts == 0 && st.bytes_trunk == 0 && st.expert_misses == 0);
                CHECK(st.preload_bytes > 0); /* kept across a stats reset */
            }
            w->ops->close(w);
        }
    tstream_pair_free(&d);
    tstream_model_close(&m);
    /* the CLI at a budget that holds everything: --no-preload gives the same ids and
     * logits bits; the report names the warm start */
    uint64_t lo, all;
    cli_plan_bytes(dir, &lo, &all);
    const uint64_t ram = all + (8u << 20);
    cli_off_identity(dir, "st_pl", "5,6,7", 5, ram, "--no-preload", "preload: ");
}

/* strata run at three budgets from the floor to resident, packed: the same ids and
 * the same logits bits as the resident source, peak RSS (/usr/bin/time) within each
 * budget. */
TEST(stream_run_cli) {
    const char *m = tpack_model("tiny-blocks", "st_cli", 4);
    if (!m) { CHECK(0); return; }
    uint64_t min, all;
    if (cli_plan_bytes(m, &min, &all)) return;
    char cmd[4096];
    uint64_t budgets[3] = {min + (4u << 20), min + (4u << 20) + (all > min ? (all - min) / 2 : 0), 0};
    char ref[1100];
    snprintf(ref, sizeof ref, "%s/st_cli_res.bin", t_tmpdir);
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2,3,4,5,6,7 --gen 5 --print-ids --dump-logits %s 2>/dev/null", t_strata(), m, ref);
    char *want = NULL;
    CHECK(t_run(cmd, &want) == 0);
    int have_time = base_is_file("/usr/bin/time");
    for (int i = 0; i < 3; i++) {
        char lg[1100], ram[64];
        snprintf(lg, sizeof lg, "%s/st_cli_%d.bin", t_tmpdir, i);
        if (budgets[i]) snprintf(ram, sizeof ram, "--ram %llu", (unsigned long long)budgets[i]);
        else snprintf(ram, sizeof ram, "--ram auto");
        if (have_time) {
            snprintf(cmd, sizeof cmd, "/usr/bin/time -f 'rss_kb %%M' -o %s.rss %s run %s --ids 1,2,3,4,5,6,7 --gen 5 --print-ids %s --dump-logits %s 2>%s.err",
                     lg, t_strata(), m, ram, lg, lg);
        } else {
            snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2,3,4,5,6,7 --gen 5 --print-ids %s --dump-logits %s 2>%s.err", t_strata(), m, ram, lg, lg);
        }
        char *got = NULL;
        CHECK_MSG(t_run(cmd, &got) == 0, "%s", cmd);
        CHECK_MSG(want && got && !strcmp(want, got), "budget %llu: ids %s vs %s", (unsigned long long)budgets[i], got ? got : "",
                  want ? want : "");
        base_free(got);
        snprintf(cmd, sizeof cmd, "cmp -s %s %s", ref, lg);
        CHECK_MSG(t_run(cmd, NULL) == 0, "budget %llu: logits bits differ", (unsigned long long)budgets[i]);
        if (have_time && budgets[i]) {
            char rp[1200];
            snprintf(rp, sizeof rp, "%s.rss", lg);
            uint8_t *rb;
            size_t rn;
            if (!base_read_file(rp, 4096, &rb, &rn, NULL, 0)) {
                const char *k = strstr((char *)rb, "rss_kb ");
                uint64_t kb = k ? strtoull(k + 7, NULL, 10) : 0;
                CHECK_MSG(kb > 0 && kb * 1024 <= budgets[i], "peak RSS %llu KB over %llu B", (unsigned long long)kb,
                          (unsigned long long)budgets[i]);
                base_free(rb);
            }
        }
    }
    base_free(want);
}

/* Row slices never change bits: greedy decode with every streamed unit's matrices
 * read a few rows at a time (4 KiB slices: many slices per matrix, gate and up
 * interleaved) gives the resident source's ids and logits bits, packed (every
 * slice's matrix checked against its own checksum) and in place, through
 * io_uring and pread, at the sliced floor and above it (some units pinned); a
 * flipped byte in a sliced matrix is named by its own checksum. */
static void sliced_case(const char *preset, const char *dirname, int packed, int no_uring) {
    tstream_model m;
    const char *dir = tstream_preset_open(&m, preset, dirname, 12);
    if (!dir) return;
    char err[2048], what[160];
    if (packed) {
        pack_result pr;
        CHECK_MSG(pack_build(dir, &m.c, m.ix, NULL, PACK_FORCE, NULL, NULL, &pr, err, sizeof err) == 0, "%s", err);
    }
    tstream_pair d;
    tstream_pair_init(&d, &m, 5, 1);
    place_opts o = tstream_opts(1ull << 40);
    o.pack_dir = packed ? NULL : "";
    place_plan whole, p;
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &whole, err, sizeof err) == 0);
    o.force_slices = 1;
    o.slice_bytes = 4096;
    o.ram_bytes = 1; /* below any floor: the error names the sliced minimum */
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == STRATA_EBUDGET);
    const uint64_t floor = p.min_bytes; /* on tiny, slices and alignment outweigh its small units */
    const uint64_t budgets[2] = {floor, floor + whole.pinned_bytes / 2}; /* about half the trunk pinned */
    for (int i = 0; i < 2; i++) {
        o.ram_bytes = budgets[i];
        o.no_uring = no_uring;
        o.verify_reads = packed;
        wsrc *w = tstream_open(&m, dir, &o, &p);
        if (!w) continue;
        CHECK_MSG(p.sliced && p.n_pinned < p.n_units && (i == 0 || p.n_pinned > 0), "%s budget %llu: sliced %d, %lld of %lld units pinned", preset,
                  (unsigned long long)budgets[i], p.sliced, (long long)p.n_pinned, (long long)p.n_units);
        if (i == 0) CHECK(p.n_pinned == 0);
        snprintf(what, sizeof what, "%s budget %llu in row slices", preset, (unsigned long long)budgets[i]);
        tstream_pair_same(&d, &m, w, p.prefill_chunk, what);
        place_stats st;
        place_stats_get(w, &st);
        CHECK(st.bytes_trunk > 0 && st.bytes_head > 0);
        w->ops->close(w);
    }
    if (packed) { /* a flipped byte inside a sliced matrix: named, never computed with */
        pack *pk = NULL;
        CHECK(pack_open(&pk, p.pack_dir, dir, &m.c, m.ix, err, sizeof err) == 0);
        const pack_region *r = pk ? &pk->units[m.c.n_layers] : NULL; /* the head: lm_head is sliced */
        int k = -1;
        for (int j = 0; r && j < r->n_tensors; j++) if (r->t[j].role == R_LM_HEAD) k = j;
        CHECK(k >= 0);
        if (k >= 0) {
            tstream_flip_keep_mtime(pk->trunk_path, r->off + r->t[k].off + r->t[k].nbytes - 7);
            o.ram_bytes = floor;
            wsrc *w = tstream_open(&m, dir, &o, &p);
            int rc = w ? tstream_decode(&m, w, p.prefill_chunk, d.got, 1, d.gl) : 0;
            CHECK(rc == STRATA_ECORRUPT);
            CHECK_MSG(w && strstr(w->ops->errmsg(w), "checksum mismatch") && strstr(w->ops->errmsg(w), "lm_head"), "%s",
                      w ? w->ops->errmsg(w) : "");
            if (w) w->ops->close(w);
            tstream_flip_keep_mtime(pk->trunk_path, r->off + r->t[k].off + r->t[k].nbytes - 7); /* back */
        }
        pack_close(pk);
    }
    tstream_pair_free(&d);
    tstream_model_close(&m);
}

TEST(stream_sliced_identity) {
    sliced_case("tiny", "st_sl", 1, 0);
    sliced_case("tiny-shards", "st_sl_shards", 0, 0);
    sliced_case("tiny-mixed", "st_sl_mixed", 1, 1);
    sliced_case("tiny-blocks", "st_sl_blocks", 0, 1);
}

/* A self-draft pass (engine_draft_step: pinned layers only, cached experts
 * only) inside a speculation that is rolled back leaves no trace: decoding with
 * three draft passes before every token gives the resident run's ids and logits
 * bits. The placement pins the head and every other layer, so the drafts skip
 * the streamed layers and drop the experts not in the cache. */
TEST(stream_draft_leaves_no_trace) {
    tstream_model m;
    const char *dir = tstream_preset_open(&m, "tiny", "st_draft", 5);
    if (!dir) return;
    enum { G = 6 };
    int32_t want[G], got[G];
    const int64_t V = m.c.vocab;
    float *wl = base_alloc((size_t)V * sizeof(float), MEM_MISC), *lg = base_alloc((size_t)V * sizeof(float), MEM_MISC);
    CHECK(tstream_decode(&m, m.res, 4, want, G, wl) == 0);
    uint64_t b[3];
    tstream_budgets(&m, dir, b);
    char err[1024];
    place_opts o = tstream_opts(b[1]);
    place_plan p;
    if (place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err)) { CHECK_MSG(0, "%s", err); return; }
    /* pin the head and the even layers, stream the odd ones */
    uint64_t largest = 0;
    p.n_pinned = 0;
    p.pinned_bytes = p.streamed_bytes = 0;
    for (int64_t u = 0; u < p.n_units; u++) {
        p.pinned[u] = u == p.n_layers || u % 2 == 0;
        if (p.pinned[u]) { p.n_pinned++; p.pinned_bytes += p.unit_bytes[u]; }
        else { p.streamed_bytes += p.unit_bytes[u]; if (p.unit_bytes[u] > largest) largest = p.unit_bytes[u]; }
    }
    p.ring_min_bytes = largest;
    if (p.ring_bytes < 2 * largest) p.ring_bytes = 2 * largest;
    p.resident = 0;
    p.budget_bytes = 0;
    wsrc *w = NULL;
    if (place_open(&w, &m.c, m.ix, dir, &p, err, sizeof err)) { CHECK_MSG(0, "%s", err); return; }
    engine *e = NULL;
    session *s = NULL;
    engine_opts eo = {.n_threads = 2, .prefill_chunk = p.prefill_chunk, .spec_rows = 4};
    CHECK_MSG(engine_create(&e, &m.c, w, &eo, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(e && session_create(&s, e, 64, err, sizeof err) == 0, "%s", err);
    if (!e || !s) return;
    CHECK(engine_can_draft(e) == 0 || engine_can_draft(e) == 1);
    int32_t prompt[7] = {1, 17, 42, 99, 3, 250, 8};
    int rc = session_eval(s, prompt, 7, lg);
    CHECK(engine_can_draft(e) == 1); /* the pinned units are in RAM once a pass has run */
    for (int g = 0; g < G && !rc; g++) {
        int32_t best = 0;
        for (int64_t i = 1; i < V; i++) if (lg[i] > lg[best]) best = (int32_t)i;
        got[g] = best;
        /* three draft passes, then roll back */
        CHECK(session_spec_begin(s) == 0);
        int32_t t = best;
        for (int k = 0; k < 3; k++) {
            infer_row r = {s, t, 1};
            CHECK_MSG(engine_draft_step(e, &r, 1, lg) == 0, "%s", engine_errmsg(e));
            t = 0;
            for (int64_t i = 1; i < V; i++) if (lg[i] > lg[t]) t = (int32_t)i;
        }
        CHECK(session_spec_end(s, 0) == 0);
        rc = session_eval(s, &best, 1, lg);
    }
    CHECK_MSG(rc == 0, "%s", session_errmsg(s));
    CHECK_MSG(!memcmp(want, got, sizeof want), "ids differ after draft passes");
    CHECK_MSG(!memcmp(wl, lg, (size_t)V * sizeof(float)), "logits bits differ after draft passes");
    engine_draft_stats ds;
    engine_draft_stats_get(e, &ds);
    CHECK(ds.passes == 3 * G);
    CHECK_MSG(ds.layers_skipped > 0 && ds.layers_skipped < ds.layers, "%lld of %lld layers skipped", (long long)ds.layers_skipped,
              (long long)ds.layers);
    CHECK(ds.experts > 0);
    /* with every layer pinned and the token's experts in the cache, a draft pass
     * is the model itself: the same logits bits as the pass that loaded them */
    {
        place_opts oa = tstream_opts(1ull << 40);
        place_plan pa;
        wsrc *wa = NULL;
        engine *ea = NULL;
        session *sa = NULL;
        float *la = base_alloc((size_t)V * sizeof(float), MEM_MISC), *lb = base_alloc((size_t)V * sizeof(float), MEM_MISC);
        wa = tstream_open(&m, dir, &oa, &pa);
        CHECK(wa && engine_create(&ea, &m.c, wa, &eo, err, sizeof err) == 0);
        CHECK(ea && session_create(&sa, ea, 64, err, sizeof err) == 0);
        if (sa) {
            CHECK(session_eval(sa, prompt, 7, la) == 0);
            for (int32_t tok = 5; tok < 8; tok++) {
                infer_row r = {sa, tok, 1};
                engine_draft_stats d0, d1;
                CHECK(session_spec_begin(sa) == 0 && engine_step(ea, &r, 1, la) == 0 && session_spec_end(sa, 0) == 0);
                engine_draft_stats_get(ea, &d0);
                CHECK(session_spec_begin(sa) == 0);
                CHECK_MSG(engine_draft_step(ea, &r, 1, lb) == 0, "%s", engine_errmsg(ea));
                CHECK(session_spec_end(sa, 0) == 0);
                engine_draft_stats_get(ea, &d1);
                CHECK(d1.layers_skipped == d0.layers_skipped && d1.experts_dropped == d0.experts_dropped && d1.experts > d0.experts);
                CHECK_MSG(!memcmp(la, lb, (size_t)V * sizeof(float)), "token %d: a draft with nothing missing differs", tok);
                CHECK(session_eval(sa, &tok, 1, la) == 0);
            }
        }
        session_free(sa);
        engine_free(ea);
        if (wa) wa->ops->close(wa);
        base_free(la);
        base_free(lb);
    }
    /* a draft pass outside a speculation is refused; a resident source cannot draft */
    infer_row r = {s, 1, 1};
    CHECK(engine_draft_step(e, &r, 1, lg) != 0);
    session_free(s);
    engine_free(e);
    w->ops->close(w);
    engine *er = NULL;
    CHECK(engine_create(&er, &m.c, m.res, &eo, err, sizeof err) == 0);
    if (er) CHECK(engine_can_draft(er) == 0);
    engine_free(er);
    base_free(wl);
    base_free(lg);
    tstream_model_close(&m);
}
