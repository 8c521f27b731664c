/*
 * cmd_pack.c: `strata pack MODEL_DIR [--out DIR] [--force]` writes the streaming
 * layout (pack.h); `strata pack --verify [--pack DIR] MODEL_DIR` re-reads it and
 * checks every checksum (exit 1 naming the first bad record).
 */
#include <string.h>
#include "cli.h"
#include "pack.h"

static void usage(FILE *f) {
    fprintf(f, "usage: strata pack MODEL_DIR [--out DIR] [--force]\n"
               "       strata pack --verify [--pack DIR] MODEL_DIR\n\n"
               "Repacks the model's trunk so each layer is one 4096-aligned read (trunk.bin +\n"
               "manifest.json with an XXH3 checksum per layer, per expert). Default location:\n"
               "MODEL_DIR/%s (strata run finds it; with --out elsewhere a pointer is kept\n"
               "under $XDG_CACHE_HOME/strata/packs). Experts stay in place in the shards.\n\n"
               "  --out DIR    write the pack there\n"
               "  --force      rebuild an existing pack of the same model\n"
               "  --verify     check every checksum of an existing pack\n"
               "  --pack DIR   the pack to verify (default: the one strata run would use)\n",
            PACK_DIRNAME);
}

static void progress(void *ud, const char *phase, uint64_t done, uint64_t total, double secs) {
    (void)ud;
    char a[32], b[32];
    fprintf(stderr, "\rpack: %-7s %s / %s  %.2f GB/s   ", phase, base_fmt_bytes(done, a, sizeof a),
            base_fmt_bytes(total, b, sizeof b), secs > 0 ? (double)done / secs / 1e9 : 0.0);
    if (done == total) fputc('\n', stderr);
}

int cmd_pack(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *pack_dir = NULL;
    int verify = 0, force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { usage(stdout); return 0; }
        else if (!strcmp(a, "--out")) { if (!(out = cli_need_arg(argc, argv, &i, "pack"))) return EXIT_USAGE; }
        else if (!strcmp(a, "--pack")) { if (!(pack_dir = cli_need_arg(argc, argv, &i, "pack"))) return EXIT_USAGE; }
        else if (!strcmp(a, "--verify")) verify = 1;
        else if (!strcmp(a, "--force")) force = 1;
        else if (a[0] == '-') return cli_usage_error("pack", "unknown option %s", a);
        else if (!model) model = a;
        else return cli_usage_error("pack", "unexpected argument %s", a);
    }
    if (!model) return cli_usage_error("pack", "MODEL_DIR is required");
    char err[2048], path[2048];
    cfg c;
    snprintf(path, sizeof path, "%s/config.json", model);
    if (cfg_load(&c, path, err, sizeof err)) { fprintf(stderr, "strata pack: %s\n", err); return 1; }
    st_index *ix = NULL;
    if (st_open(&ix, model, err, sizeof err)) { fprintf(stderr, "strata pack: %s\n", err); return 1; }
    int rc = 0;
    if (verify) {
        char found[1024];
        if (!pack_dir) {
            if (!pack_find(model, found, sizeof found)) {
                fprintf(stderr, "strata pack: no pack found for %s (run strata pack %s)\n", model, model);
                st_close(ix);
                return 1;
            }
            pack_dir = found;
        }
        pack *p = NULL;
        double t0 = base_now();
        rc = pack_open(&p, pack_dir, model, &c, ix, err, sizeof err);
        if (!rc) rc = pack_verify(p, &c, ix, progress, NULL, err, sizeof err);
        if (rc) fprintf(stderr, "\nstrata pack: verify %s: %s\n", pack_dir, err);
        else fprintf(stderr, "pack: %s verified: trunk %.2f GB and %lld experts, every checksum matches (%.1f s)\n", pack_dir,
                     (double)p->trunk_bytes / 1e9, (long long)(p->n_moe * p->n_experts), base_now() - t0);
        pack_close(p);
        st_close(ix);
        return rc ? 1 : 0;
    }
    pack_result res;
    rc = pack_build(model, &c, ix, out, force, progress, NULL, &res, err, sizeof err);
    if (rc) {
        fprintf(stderr, "\nstrata pack: %s\n", err);
        st_close(ix);
        return 1;
    }
    if (res.already) {
        fprintf(stderr, "pack: %s already holds this model's pack (use --force to rebuild)\n", res.dir);
    } else {
        /* The write target: how close the copy came to the disk's own write speed.
         * Measured after the pack (1 GB, O_DIRECT, fsync) so it does not warm anything. */
        double disk = res.trunk_bytes >= (1ull << 30) ? pack_measure_write_bw(res.dir, 1ull << 30) : 0;
        fprintf(stderr, "pack: %s: trunk %.3f GB in %.2f s = %.2f GB/s", res.dir, (double)res.trunk_bytes / 1e9,
                res.trunk_secs, res.write_bw / 1e9);
        if (disk > 0) fprintf(stderr, " (disk write %.2f GB/s measured now: %.0f%%)", disk / 1e9, 100 * res.write_bw / disk);
        fprintf(stderr, "; expert checksums %.2f GB in %.2f s\n", (double)res.expert_bytes_hashed / 1e9, res.expert_secs);
    }
    printf("%s\n", res.dir);
    st_close(ix);
    return 0;
}
