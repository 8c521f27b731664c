/*
 * cmd_gen_model.c: `strata gen-model OUT (--preset NAME | --config FILE) ...`:
 * writes a K3-format model with random weights (include/strata_gen.h, tools/gen/ do the work; this file
 * parses options, prints progress on stderr and the summary on stdout).
 */
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "strata.h"
#include "strata_gen.h"

static const char *k_cmd = "gen-model";

static void usage(FILE *f) {
    fprintf(f,
            "usage: strata gen-model OUT_DIR (--preset NAME | --config FILE) [options]\n"
            "       strata gen-model --list-presets\n\n"
            "Writes a complete model directory in a published layout (K3, Kimi Linear, Kimi\n"
            "K2 or DeepSeek-V3, as the preset or config says) with random, numerically alive\n"
            "weights: config.json, sharded safetensors + index, the tokenizer (tiktoken.model,\n"
            "or DeepSeek's tokenizer.json) and tokenizer_config.json. Same seed, same bytes.\n"
            "Built in OUT_DIR.partial-PID and renamed at the end, so OUT_DIR never holds a\n"
            "half-written model.\n\n"
            "options:\n"
            "  --preset NAME     a named configuration (--list-presets)\n"
            "  --config FILE     a config.json (released nested or flat shape)\n"
            "  --seed N          weight seed (default 0)\n"
            "  --shard-gb X      target shard size in GB (default: the preset's, else 4)\n"
            "  --force           replace a model an earlier gen-model wrote at OUT_DIR (only\n"
            "                    once the new one is complete; anything else there is\n"
            "                    refused); also needed to write the full-size presets\n"
            "  --experts-bf16    plain BF16 expert weights instead of MXFP4\n"
            "  --weights F       override the preset's formats. fp8: every linear but embed,\n"
            "                    lm_head and router gate FP8 e4m3 with a 128x128\n"
            "                    weight_scale_inv grid (DeepSeek-V3, K2-Instruct); int4:\n"
            "                    routed experts INT4 pack-quantized (K2-Thinking); bf16:\n"
            "                    every tensor plain\n"
            "  --scales S        FP8/INT4 scales: random (default) or pow2 (powers of two)\n"
            "  --dequantize      write the FP8/INT4 model's values as plain tensors (BF16\n"
            "                    with --scales pow2, else F32): the same numbers, bit for bit\n"
            "  --trunk-dtype T   bf16 (default), mixed (F32/BF16/F16 per tensor) or f32\n"
            "  --sparse          headers and holes only (zeros): full-size layouts without\n"
            "                    the disk, for indexing and planning tests\n"
            "  --reserved N      special ids at the end of the vocab (default: preset, 256)\n"
            "  --quiet           no progress\n"
            "  --list-presets    print the presets with their sizes\n\n"
            "env (tests only): STRATA_GEN_ABORT_AFTER_BYTES=N exits mid-way (simulated crash),\n"
            "  STRATA_GEN_NO_URING=1 writes with pwrite instead of io_uring\n");
}

typedef struct {
    int tty;
    double last_t;
    int last_pct;
} progress;

static void on_progress(void *ud, uint64_t done, uint64_t total, double secs) {
    progress *p = ud;
    int pct = total ? (int)(100.0 * (double)done / (double)total) : 100;
    int final = done >= total;
    if (p->tty) {
        if (!final && secs - p->last_t < 0.25) return;
    } else if (!final && pct < p->last_pct + 5) {
        return;
    }
    if (final && p->last_pct == 100) return;
    p->last_t = secs;
    p->last_pct = pct;
    double mbs = secs > 0 ? (double)done / secs / 1e6 : 0;
    fprintf(stderr, "%sgen-model: %3d%%  %.2f / %.2f GB  %.0f MB/s%s", p->tty ? "\r" : "", pct,
            (double)done / 1e9, (double)total / 1e9, mbs, p->tty && !final ? "" : "\n");
    fflush(stderr);
}

static int list_presets(void) {
    printf("%-22s %16s %10s %8s %7s  %s\n", "preset", "bytes", "size", "experts", "shards", "description");
    for (size_t i = 0; i < strata_genmodel_preset_count(); i++) {
        const strata_genmodel_preset *pi = strata_genmodel_preset_at(i);
        strata_genmodel_sizes s;
        char err[512], hb[32];
        if (strata_genmodel_preset_sizes(pi->name, &s, err, sizeof err)) {
            printf("%-22s %s\n", pi->name, err);
            continue;
        }
        printf("%-22s %16llu %10s %7.1f%% %7d  %s\n", pi->name, (unsigned long long)s.total,
               strata_fmt_bytes(s.total, hb, sizeof hb), s.total ? 100.0 * (double)s.experts / (double)s.total : 0.0,
               s.n_shards, pi->summary);
    }
    return 0;
}

int cmd_gen_model(int argc, char **argv) {
    const char *out = NULL, *preset = NULL, *config = NULL, *trunk = NULL;
    int64_t seed = 0, reserved = 0;
    int have_seed = 0, force = 0, ebf16 = 0, sparse = 0, quiet = 0, weights = 0, pow2 = 0, dequant = 0;
    double shard_gb = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) { usage(stdout); return 0; }
        if (!strcmp(a, "--list-presets")) return list_presets();
        if (!strcmp(a, "--preset")) { if (!(preset = cli_need_arg(argc, argv, &i, k_cmd))) return EXIT_USAGE; }
        else if (!strcmp(a, "--config")) { if (!(config = cli_need_arg(argc, argv, &i, k_cmd))) return EXIT_USAGE; }
        else if (!strcmp(a, "--seed")) {
            if (!(v = cli_need_arg(argc, argv, &i, k_cmd))) return EXIT_USAGE;
            if (strata_parse_i64(v, 0, INT64_MAX, &seed)) return cli_usage_error(k_cmd, "bad --seed '%s'", v);
            have_seed = 1;
        } else if (!strcmp(a, "--shard-gb")) {
            if (!(v = cli_need_arg(argc, argv, &i, k_cmd))) return EXIT_USAGE;
            if (strata_parse_f64(v, 1e-6, 1e6, &shard_gb)) return cli_usage_error(k_cmd, "bad --shard-gb '%s'", v);
        } else if (!strcmp(a, "--reserved")) {
            if (!(v = cli_need_arg(argc, argv, &i, k_cmd))) return EXIT_USAGE;
            if (strata_parse_i64(v, 6, 1 << 20, &reserved)) return cli_usage_error(k_cmd, "bad --reserved '%s'", v);
        } else if (!strcmp(a, "--trunk-dtype")) {
            if (!(trunk = cli_need_arg(argc, argv, &i, k_cmd))) return EXIT_USAGE;
            if (strcmp(trunk, "bf16") && strcmp(trunk, "mixed") && strcmp(trunk, "f32"))
                return cli_usage_error(k_cmd, "--trunk-dtype must be bf16, mixed or f32");
        } else if (!strcmp(a, "--force")) force = 1;
        else if (!strcmp(a, "--experts-bf16")) ebf16 = 1;
        else if (!strcmp(a, "--weights")) {
            if (!(v = cli_need_arg(argc, argv, &i, k_cmd))) return EXIT_USAGE;
            if (!strcmp(v, "fp8")) weights = STRATA_GENMODEL_W_FP8;
            else if (!strcmp(v, "int4")) weights = STRATA_GENMODEL_W_INT4;
            else if (!strcmp(v, "bf16")) weights = STRATA_GENMODEL_W_BF16;
            else return cli_usage_error(k_cmd, "--weights must be fp8, int4 or bf16");
        } else if (!strcmp(a, "--scales")) {
            if (!(v = cli_need_arg(argc, argv, &i, k_cmd))) return EXIT_USAGE;
            if (strcmp(v, "pow2") && strcmp(v, "random")) return cli_usage_error(k_cmd, "--scales must be pow2 or random");
            pow2 = !strcmp(v, "pow2");
        } else if (!strcmp(a, "--dequantize")) dequant = 1;
        else if (!strcmp(a, "--sparse")) sparse = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (a[0] == '-' && a[1]) return cli_usage_error(k_cmd, "unknown option %s", a);
        else if (!out) out = a;
        else return cli_usage_error(k_cmd, "unexpected argument '%s'", a);
    }
    if (!out) return cli_usage_error(k_cmd, "missing OUT_DIR");
    if (!!preset == !!config) return cli_usage_error(k_cmd, "give exactly one of --preset NAME or --config FILE");

    strata_genmodel_opts o = {.preset = preset, .config = config, .trunk_dtype = -1};
    char err[4096];
    if (preset) {
        const strata_genmodel_preset *pi = strata_genmodel_preset_find(preset);
        if (!pi) return cli_usage_error(k_cmd, "unknown preset '%s' (strata gen-model --list-presets)", preset);
        if (pi->big && !force && !sparse) {
            fprintf(stderr, "strata gen-model: preset '%s' is %s; pass --force to really write it, or --sparse\n",
                    preset, "larger than any test disk");
            return 1;
        }
    }
    o.have_seed = have_seed;
    if (have_seed) o.seed = (uint64_t)seed;
    if (shard_gb > 0) o.shard_bytes = (uint64_t)(shard_gb * 1e9);
    if (reserved) o.n_reserved = reserved;
    if (ebf16) o.experts_bf16 = 1;
    if ((pow2 || dequant) && (weights == STRATA_GENMODEL_W_BF16 || (!weights && !preset)))
        return cli_usage_error(k_cmd, "--scales and --dequantize go with --weights fp8|int4 or a quantised preset");
    o.weights = weights;
    o.scales_pow2 = pow2;
    o.dequantize = dequant;
    if (trunk) o.trunk_dtype = !strcmp(trunk, "mixed") ? STRATA_GENMODEL_TRUNK_MIXED : !strcmp(trunk, "f32") ? STRATA_GENMODEL_TRUNK_F32 : STRATA_GENMODEL_TRUNK_BF16;
    o.force = force;
    o.sparse = sparse;
    progress pr = {isatty(2), -1, -100};
    if (!quiet) {
        o.progress = on_progress;
        o.progress_ud = &pr;
    }
    strata_genmodel_stats st;
    int rc = strata_genmodel_write(out, &o, &st, err, sizeof err);
    if (rc) { fprintf(stderr, "strata gen-model: %s\n", err); return 1; }
    char hb[32];
    if (sparse) {
        printf("wrote %s: %s (sparse: headers and holes) in %d shard%s, %llu tensors, %.2f s\n", out,
               strata_fmt_bytes(st.total_bytes, hb, sizeof hb), st.n_shards, st.n_shards == 1 ? "" : "s",
               (unsigned long long)st.n_tensors, st.secs);
        return 0;
    }
    printf("wrote %s: %s in %d shard%s, %llu tensors, %.2f s, %.0f MB/s "
           "(prepare %.2f s, write %.2f s, waiting for the generators %.2f s, fsync %.2f s)\n",
           out, strata_fmt_bytes(st.total_bytes, hb, sizeof hb), st.n_shards, st.n_shards == 1 ? "" : "s",
           (unsigned long long)st.n_tensors, st.secs, st.mb_per_s, st.prep_secs, st.io_secs, st.gen_wait_secs,
           st.sync_secs);
    return 0;
}
