/*
 * cmd_pack.c: `strata pack MODEL_DIR [--out DIR] [--force] [--no-measure]` writes
 * the streaming layout (strata_pack_build: src/pack_api.c, src/format/pack.c) and reports its write rate against the disk's
 * write bandwidth measured in the same run; `strata pack --verify [--pack DIR]
 * MODEL_DIR` re-reads it and checks every checksum, trunk.bin and the shards
 * (exit 1 naming the first bad record). A stale pack of the model is rebuilt.
 */
#include <string.h>
#include <sys/stat.h>
#include "cli.h"
#include "strata.h"

static void usage(FILE *f) {
    fprintf(f, "usage: strata pack MODEL_DIR [--out DIR] [--force] [--no-measure]\n"
               "       strata pack --verify [--pack DIR] MODEL_DIR\n\n"
               "Repacks the model's trunk so each layer is one 4096-aligned read (trunk.bin +\n"
               "manifest.json with an XXH3 checksum per layer, per expert). Default location:\n"
               "MODEL_DIR/%s (strata run finds it; with --out elsewhere a pointer is kept\n"
               "under $XDG_CACHE_HOME/strata/packs). Experts stay in place in the shards.\n"
               "Progress goes to stderr, then the trunk's write rate in MB/s and its ratio to\n"
               "the disk's write bandwidth, measured just before packing by writing 1 GiB (at\n"
               "most a quarter of the free space) with O_DIRECT into an unnamed file in the\n"
               "pack's directory (it never outlives the run), and how much of the source came\n"
               "from the page cache: a source read from the same disk shares its bandwidth.\n\n"
               "An up-to-date pack is left alone. A stale pack of this model (its config, index,\n"
               "shard headers, or a shard's size or modification time changed since packing;\n"
               "strata run refuses it) is rebuilt by plain `strata pack`, which says why. A\n"
               "directory holding another model's pack is never overwritten, not even with\n"
               "--force. One writer per pack directory: a second one is refused at once.\n\n"
               "  --out DIR      write the pack there\n"
               "  --force        rebuild even an up-to-date pack (or one with an unreadable manifest)\n"
               "  --no-measure   skip the disk write measurement (no ratio is printed)\n"
               "  --verify       check every checksum of an existing pack: trunk.bin against the\n"
               "                 manifest, and the model's shards (trunk tensors and experts)\n"
               "                 against it, naming the first record that differs\n"
               "  --pack DIR     the pack to verify (default: the one strata run would use)\n",
            STRATA_PACK_DIRNAME);
}

static void progress(void *ud, const char *phase, uint64_t done, uint64_t total, double secs) {
    (void)ud;
    char a[32], b[32];
    fprintf(stderr, "\rpack: %-7s %s / %s  %.2f GB/s   ", phase, strata_fmt_bytes(done, a, sizeof a),
            strata_fmt_bytes(total, b, sizeof b), secs > 0 ? (double)done / secs / 1e9 : 0.0);
    if (done == total) fputc('\n', stderr);
}

int cmd_pack(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *pack_dir = NULL;
    int verify = 0, flags = STRATA_PACK_MEASURE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { usage(stdout); return 0; }
        else if (!strcmp(a, "--out")) { if (!(out = cli_need_arg(argc, argv, &i, "pack"))) return EXIT_USAGE; }
        else if (!strcmp(a, "--pack")) { if (!(pack_dir = cli_need_arg(argc, argv, &i, "pack"))) return EXIT_USAGE; }
        else if (!strcmp(a, "--verify")) verify = 1;
        else if (!strcmp(a, "--force")) flags |= STRATA_PACK_FORCE;
        else if (!strcmp(a, "--no-measure")) flags &= ~STRATA_PACK_MEASURE;
        else if (a[0] == '-') return cli_usage_error("pack", "unknown option %s", a);
        else if (!model) model = a;
        else return cli_usage_error("pack", "unexpected argument %s", a);
    }
    if (!model) return cli_usage_error("pack", "MODEL_DIR is required");
    char err[2048];
    strata_pack_result res;
    if (verify) {
        int rc = strata_pack_verify(model, pack_dir, progress, NULL, &res, err, sizeof err);
        if (rc && !res.started) fprintf(stderr, "strata pack: %s\n", err);
        else if (rc) fprintf(stderr, "\nstrata pack: verify %s: %s\n", res.dir, err);
        else fprintf(stderr, "pack: %s verified: trunk %.2f GB (trunk.bin and the shards) and %lld experts, every checksum matches (%.1f s)\n",
                     res.dir, (double)res.trunk_bytes / 1e9, (long long)res.n_experts, res.secs);
        if (!rc && res.stale[0])
            fprintf(stderr, "pack: note: %s; strata run refuses the pack until `strata pack %s` rebuilds it\n", res.stale, model);
        return rc ? 1 : 0;
    }
    if (strata_pack_build(model, out, flags, progress, NULL, &res, err, sizeof err)) {
        fprintf(stderr, "%sstrata pack: %s\n", res.started ? "\n" : "", err);
        return 1;
    }
    if (res.already) {
        fprintf(stderr, "pack: %s already holds this model's pack, up to date (use --force to rebuild)\n", res.dir);
    } else {
        if (res.stale[0]) fprintf(stderr, "pack: %s was stale (%s): rebuilt\n", res.dir, res.stale);
        fprintf(stderr, "pack: %s: trunk %.0f MB written in %.2f s: %.0f MB/s", res.dir, (double)res.trunk_bytes / 1e6,
                res.trunk_secs, res.write_bw / 1e6);
        if (res.disk_bw > 0)
            fprintf(stderr, " = %.0f%% of the disk's write bandwidth (%.0f MB/s, measured just before)\n",
                    100 * res.write_bw / res.disk_bw, res.disk_bw / 1e6);
        else if (flags & STRATA_PACK_MEASURE)
            fprintf(stderr, " (the disk's write bandwidth could not be measured: no O_DIRECT, or little free space)\n");
        else
            fputc('\n', stderr);
        /* a source on the pack's own disk shares its bandwidth with the writes */
        struct stat sm, sp;
        int same = !stat(model, &sm) && !stat(res.dir, &sp) && sm.st_dev == sp.st_dev;
        fprintf(stderr, "pack: trunk source %.0f MB from the page cache, %.0f MB read from %s disk%s; expert checksums %.0f MB in %.2f s\n",
                (double)res.src_cached_bytes / 1e6, (double)res.src_direct_bytes / 1e6, same ? "the same" : "another",
                same && res.src_direct_bytes ? " (its reads and writes share the bandwidth)" : "",
                (double)res.expert_bytes_hashed / 1e6, res.expert_secs);
    }
    printf("%s\n", res.dir);
    return 0;
}
