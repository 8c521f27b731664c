/*
 * place_run.c: one rung of the memory ladder. Plans a RAM budget, opens the
 * streaming source, prefills a fixed prompt and decodes greedily, then prints one
 * result line (and appends it to a CSV): budget, pinned units, decode s/token, GB
 * read per decode token, the I/O floor (disk bytes per token / measured disk
 * bandwidth) and the share of it achieved, peak RSS, the hash of the ids; then
 * the physical limit of the rung, max(disk bytes / disk bandwidth, bytes touched
 * / memory bandwidth) with both bandwidths as measured for the whole run
 * (--disk-bw, --mem-bw from `place_run --bandwidth`), the ratio to it and the
 * prediction hit rate of the reads a layer ahead, and the share of the CPUs' time
 * the hypervisor gave to other guests while it decoded (steal_pct: a slow run on
 * a shared VM is told from a slower engine by it).
 *
 * place_run --bandwidth [--threads N] [DIR]: measures the disk (O_DIRECT 4 MiB
 * reads at depth 16 of a fresh 1 GiB file in DIR, else the cache directory) and
 * the memory read bandwidth with the compute threads (bench/bw.h); the last line
 * printed is "DISK_GBS MEM_GBS".
 *
 * usage: place_run MODEL_DIR (--ram-gb X | --resident) [--gen N] [--prompt-len N]
 *                  [--threads N] [--chunk N] [--policy layer|lfu|s3fifo|lru] [--no-prefetch] [--no-preload] [--no-verify] [--pack DIR] [--seed N (prompt)] [--trace FILE] [--csv FILE]
 */
#include <stdlib.h>
#include <string.h>
#include "infer.h"
#include "kern.h"
#include "membw.h"
#include "place.h"
#include "../bw.h"

/* The --bandwidth mode: disk and memory as `strata plan --measure` measures them
 * (memory with the engine's default threads; --threads N measures with N). */
static int bandwidth(const char *dir, int threads) {
    double disk = 0, mem = 0;
    char src[160];
    place_bandwidth(dir ? dir : NULL, 1, &disk, &mem, src, sizeof src);
    if (threads > 0 && threads != pool_default_threads()) mem = membw_probe(threads);
    if (!(mem > 0)) return 1;
    bw_print_load("place_run --bandwidth");
    printf("%.4f %.4f\n", disk / 1e9, mem / 1e9);
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *csv = NULL, *trace = NULL, *pack_dir = NULL;
    double disk_gbs = 0, mem_gbs = 0;
    int bw_only = 0;
    double ram_gb = -1;
    int gen = 8, plen = 16, seed = 0, threads = 0, chunk = 64, policy = PLACE_POLICY_LAYER, no_ra = 0, no_pf = 0, no_pl = 0, no_vf = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--ram-gb")) { ram_gb = atof(v); i++; }
        else if (!strcmp(a, "--resident")) ram_gb = 0;
        else if (!strcmp(a, "--gen")) { gen = atoi(v); i++; }
        else if (!strcmp(a, "--prompt-len")) { plen = atoi(v); i++; }
        else if (!strcmp(a, "--threads")) { threads = atoi(v); i++; }
        else if (!strcmp(a, "--chunk")) { chunk = atoi(v); i++; }
        else if (!strcmp(a, "--policy")) {
            if ((policy = place_policy_parse(v)) < 0) { fprintf(stderr, "place_run: bad --policy %s\n", v); return 2; }
            i++;
        }
        else if (!strcmp(a, "--no-readahead")) no_ra = 1;
        else if (!strcmp(a, "--no-prefetch")) no_pf = 1;
        else if (!strcmp(a, "--no-preload")) no_pl = 1;
        else if (!strcmp(a, "--no-verify")) no_vf = 1;
        else if (!strcmp(a, "--pack")) { pack_dir = v; i++; }
        else if (!strcmp(a, "--csv")) { csv = v; i++; }
        else if (!strcmp(a, "--bandwidth")) bw_only = 1;
        else if (!strcmp(a, "--disk-bw")) { disk_gbs = atof(v); i++; }
        else if (!strcmp(a, "--mem-bw")) { mem_gbs = atof(v); i++; }
        else if (!strcmp(a, "--trace")) { trace = v; i++; }
        else if (!strcmp(a, "--seed")) { seed = atoi(v); i++; }
        else if (!dir) dir = a;
        else { fprintf(stderr, "place_run: unexpected %s\n", a); return 2; }
    }
    if (bw_only) return bandwidth(dir, threads);
    if (!dir || ram_gb < 0 || gen < 1 || plen < 1) {
        fprintf(stderr, "usage: place_run MODEL_DIR (--ram-gb X | --resident) [--gen N] [--prompt-len N] [--csv FILE]\n");
        return 2;
    }
    const char *kname = kern_init(NULL); /* the fastest kernels this CPU has */
    fprintf(stderr, "place_run: kernels %s\n", kname);
    char err[2048], path[2048];
    static cfg c;
    static model_layout lay;
    static place_plan plan;
    st_index *ix = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (cfg_load(&c, path, err, sizeof err) || st_open(&ix, dir, err, sizeof err)) { fprintf(stderr, "place_run: %s\n", err); return 1; }
    sbuf pr = {0};
    if (model_bind_check(&c, ix, &lay, &pr)) { fprintf(stderr, "place_run: %s\n", pr.s ? pr.s : "bind failed"); return 1; }
    sbuf_free(&pr);
    place_opts po = place_opts_default();
    po.ram_bytes = (uint64_t)(ram_gb * 1e9);
    po.ctx = plen + gen + 1;
    po.prefill_chunk = chunk;
    po.n_threads = threads;
    po.cache_policy = policy;
    po.no_readahead = no_ra;
    po.no_prefetch = no_pf;
    po.no_preload = no_pl;
    po.pack_dir = pack_dir;
    if (no_vf) po.verify_reads = PLACE_VERIFY_OFF;
    po.trace_path = trace;
    po.session_bytes = infer_session_bytes;
    po.engine_bytes = infer_engine_bytes;
    int rc = place_plan_compute(&c, &lay, dir, &po, &plan, err, sizeof err);
    if (rc) { fprintf(stderr, "place_run: %s\n", err); return rc == STRATA_EBUDGET ? 2 : 1; }
    place_plan_print(&plan, stderr);
    wsrc *w = NULL;
    double t_open = base_now();
    if (place_open(&w, &c, ix, dir, &plan, err, sizeof err)) { fprintf(stderr, "place_run: %s\n", err); return 1; }
    t_open = base_now() - t_open;
    engine *e = NULL;
    session *s = NULL;
    engine_opts eo = {.n_threads = threads, .prefill_chunk = plan.prefill_chunk};
    if (engine_create(&e, &c, w, &eo, err, sizeof err) || session_create(&s, e, plen + gen + 1, err, sizeof err)) {
        fprintf(stderr, "place_run: %s\n", err);
        return 1;
    }
    int32_t *ids = base_alloc((size_t)(plen + gen) * sizeof *ids, MEM_MISC);
    float *lg = base_alloc((size_t)c.vocab * sizeof(float), MEM_SCRATCH);
    for (int i = 0; i < plen; i++) ids[i] = (int32_t)(((int64_t)(i + 31 * seed) * 7919 + 11) % (c.vocab - 300) + 1);
    double t0 = base_now();
    if (session_eval(s, ids, plen, lg)) { fprintf(stderr, "place_run: %s\n", session_errmsg(s)); return 1; }
    double t_prefill = base_now() - t0;
    place_stats ps;
    place_stats_get(w, &ps);
    place_stats_print(&ps, &plan, stderr);
    place_stats_reset(w);
    uint64_t h = BASE_FNV_INIT;
    double t_dec = 0;
    const double steal0 = bw_steal_s();
    const double w0 = base_now();
    for (int g = 0; g < gen; g++) {
        int32_t best = 0;
        for (int64_t i = 1; i < c.vocab; i++) if (lg[i] > lg[best]) best = (int32_t)i;
        ids[plen + g] = best;
        h = base_fnv1a(&best, sizeof best, h);
        if (g == gen - 1) break;
        double t1 = base_now();
        if (session_eval(s, &best, 1, lg)) { fprintf(stderr, "place_run: %s\n", session_errmsg(s)); return 1; }
        t_dec += base_now() - t1;
    }
    int n_dec = gen - 1;
    const double w1 = base_now();
    const double steal1 = bw_steal_s();
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const double steal_pct = steal0 >= 0 && steal1 >= steal0 && t_dec > 0 && ncpu > 0 ? 100 * (steal1 - steal0) / (t_dec * (double)ncpu) : 0;
    place_stats_get(w, &ps);
    fprintf(stderr, "decode (%d tokens):\n", n_dec);
    place_stats_print(&ps, &plan, stderr);
    /* for bench/ladder/profile.sh: samples taken with perf -k CLOCK_MONOTONIC
     * between these two instants are the decode's */
    fprintf(stderr, "decode window: %.6f %.6f (CLOCK_MONOTONIC s)\n", w0, w1);
    if (steal0 >= 0) fprintf(stderr, "steal: %.2f s of the %ld CPUs' time went to other guests (%.1f%% of the decode)\n", steal1 - steal0, ncpu, steal_pct);
    double spt = n_dec ? t_dec / n_dec : 0;
    uint64_t rd = ps.bytes_trunk + ps.bytes_head + ps.bytes_embed + ps.bytes_experts;
    double gb_tok = n_dec ? (double)rd / n_dec / 1e9 : 0;
    const double disk_bw = disk_gbs > 0 ? disk_gbs * 1e9 : plan.disk_bw, mem_bw = mem_gbs > 0 ? mem_gbs * 1e9 : plan.mem_bw;
    double floor_s = disk_bw > 0 ? gb_tok * 1e9 / disk_bw : 0;
    /* the physical limit: what a token must read from disk, or touch in memory */
    const double touch_gb = (double)plan.touch_bytes_per_token / 1e9, mem_s = mem_bw > 0 ? touch_gb * 1e9 / mem_bw : 0;
    const double limit_s = floor_s > mem_s ? floor_s : mem_s;
    uint64_t rss = base_peak_rss();
    fprintf(stderr, "ids:");
    for (int g = 0; g < gen; g++) fprintf(stderr, " %d", ids[plen + g]);
    fprintf(stderr, "\n");
    char label[32];
    if (ram_gb > 0) snprintf(label, sizeof label, "%g", ram_gb); else snprintf(label, sizeof label, "resident");
    /* budget, pinned, prefill s/token, decode s/token, GB read/token, I/O floor s/token, % of the I/O limit,
     * true expert hit rate, I/O wait share, peak RSS GB, ids hash; GB touched/token, disk GB/s, memory GB/s,
     * the limit s/token, decode / limit, prediction hit rate %, row slices, % of the CPUs' time stolen */
    char line[640];
    snprintf(line, sizeof line, "%s,%lld/%lld,%.4f,%.4f,%.4f,%.4f,%.1f,%.1f,%.1f,%.3f,%016llx,%.4f,%.3f,%.2f,%.4f,%.2f,%.1f,%s,%.1f", label,
             (long long)plan.n_pinned, (long long)plan.n_units, t_prefill / plen, spt, gb_tok, floor_s, spt > 0 ? 100 * floor_s / spt : 0,
             100 * ps.hit_rate, t_dec > 0 ? 100 * ps.wait_s / t_dec : 0, (double)rss / 1e9, (unsigned long long)h, touch_gb,
             disk_bw / 1e9, mem_bw / 1e9, limit_s, limit_s > 0 ? spt / limit_s : 0,
             ps.pred_requests ? 100.0 * (double)ps.pred_hits / (double)ps.pred_requests : 0, plan.sliced ? "sliced" : "whole", steal_pct);
    printf("%s\n", line);
    if (csv) {
        FILE *f = fopen(csv, "a");
        if (f) { fprintf(f, "%s\n", line); fclose(f); }
    }
    if (ram_gb > 0 && (double)rss > ram_gb * 1e9) fprintf(stderr, "place_run: peak RSS %.3f GB OVER the %.3f GB budget\n", (double)rss / 1e9, ram_gb);
    session_free(s);
    engine_free(e);
    w->ops->close(w);
    st_close(ix);
    (void)t_open;
    return 0;
}
