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
 * The rung is strata_bench_place_run (include/strata_bench.h, src/bench.c): it
 * drives the planner, the streaming source and the engine directly, beneath
 * strata_model_opts (cache policy, readahead, the request trace); this program
 * parses, prints the line and appends it to the CSV.
 *
 * usage: place_run MODEL_DIR (--ram-gb X | --resident) [--gen N] [--prompt-len N]
 *                  [--threads N] [--chunk N] [--policy layer|lfu|s3fifo|lru] [--no-prefetch] [--no-preload] [--no-verify] [--pack DIR] [--seed N (prompt)] [--trace FILE] [--csv FILE]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "strata_bench.h"
#include "../bw.h"

/* The --bandwidth mode: disk and memory as `strata plan --measure` measures them
 * (memory with the engine's default threads; --threads N measures with N). */
static int bandwidth(const char *dir, int threads) {
    double disk = 0, mem = 0;
    if (strata_bench_bandwidth(dir, threads, &disk, &mem)) return 1;
    bw_print_load("place_run --bandwidth");
    printf("%.4f %.4f\n", disk / 1e9, mem / 1e9);
    return 0;
}

int main(int argc, char **argv) {
    strata_bench_place_opts o = strata_bench_place_opts_default();
    const char *csv = NULL;
    int bw_only = 0;
    o.ram_gb = -1;
    o.policy = strata_plan_policy("layer");
    o.steal_s = bw_steal_s;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--ram-gb")) { o.ram_gb = atof(v); i++; }
        else if (!strcmp(a, "--resident")) o.ram_gb = 0;
        else if (!strcmp(a, "--gen")) { o.gen = atoi(v); i++; }
        else if (!strcmp(a, "--prompt-len")) { o.prompt_len = atoi(v); i++; }
        else if (!strcmp(a, "--threads")) { o.threads = atoi(v); i++; }
        else if (!strcmp(a, "--chunk")) { o.chunk = atoi(v); i++; }
        else if (!strcmp(a, "--policy")) {
            if ((o.policy = strata_plan_policy(v)) < 0) { fprintf(stderr, "place_run: bad --policy %s\n", v); return 2; }
            i++;
        }
        else if (!strcmp(a, "--no-readahead")) o.no_readahead = 1;
        else if (!strcmp(a, "--no-prefetch")) o.no_prefetch = 1;
        else if (!strcmp(a, "--no-preload")) o.no_preload = 1;
        else if (!strcmp(a, "--no-verify")) o.no_verify = 1;
        else if (!strcmp(a, "--pack")) { o.pack_dir = v; i++; }
        else if (!strcmp(a, "--csv")) { csv = v; i++; }
        else if (!strcmp(a, "--bandwidth")) bw_only = 1;
        else if (!strcmp(a, "--disk-bw")) { o.disk_gbs = atof(v); i++; }
        else if (!strcmp(a, "--mem-bw")) { o.mem_gbs = atof(v); i++; }
        else if (!strcmp(a, "--trace")) { o.trace = v; i++; }
        else if (!strcmp(a, "--seed")) { o.seed = atoi(v); i++; }
        else if (!o.model_dir) o.model_dir = a;
        else { fprintf(stderr, "place_run: unexpected %s\n", a); return 2; }
    }
    if (bw_only) return bandwidth(o.model_dir, o.threads);
    if (!o.model_dir || o.ram_gb < 0 || o.gen < 1 || o.prompt_len < 1) {
        fprintf(stderr, "usage: place_run MODEL_DIR (--ram-gb X | --resident) [--gen N] [--prompt-len N] [--csv FILE]\n");
        return 2;
    }
    char err[2048];
    strata_bench_place_result res;
    int rc = strata_bench_place_run(&o, stderr, &res, err, sizeof err);
    if (rc) { fprintf(stderr, "place_run: %s\n", err); return rc == STRATA_EBUDGET ? 2 : 1; }
    printf("%s\n", res.line);
    if (csv) {
        FILE *f = fopen(csv, "a");
        if (f) { fprintf(f, "%s\n", res.line); fclose(f); }
    }
    if (o.ram_gb > 0 && (double)res.peak_rss > o.ram_gb * 1e9)
        fprintf(stderr, "place_run: peak RSS %.3f GB OVER the %.3f GB budget\n", (double)res.peak_rss / 1e9, o.ram_gb);
    return 0;
}
