/*
 * cmd_plan.c: `strata plan MODEL_DIR|--config FILE --ram-gb X [--ctx N]` prints the
 * memory plan (place.h) without loading weights. Exit 0 with a plan, 2 when the
 * budget is below the minimum (the minimum is printed), 1 on a bad model.
 */
#include <string.h>
#include "cli.h"
#include "infer.h"
#include "model_open.h"
#include "place.h"

static void usage(FILE *f) {
    fprintf(f, "usage: strata plan MODEL_DIR|--config FILE (--ram-gb X | --ram SIZE|auto) [options]\n\n"
               "Prints where every byte goes under a RAM budget (peak RSS of the process):\n"
               "pinned trunk layers, stream arena, expert cache, embeddings, session, scratch,\n"
               "and the predicted decode s/token from this machine's disk and memory bandwidth.\n\n"
               "  --ram-gb X       budget in GB (10^9 bytes)\n"
               "  --ram SIZE|auto  budget as a size (24G = GiB) or auto = MemAvailable\n"
               "  --ctx N          context positions each sequence holds (default 4096)\n"
               "  --seqs N         sequences held at once (default 1); the plan also shows the\n"
               "                   trade between sequence slots and weights for 1..16 sequences\n"
               "  --chunk N        prefill chunk (default %d)\n"
               "  --threads N      compute threads\n"
               "  --pack DIR       use this pack (default: the model's own, if any)\n"
               "  --policy P       expert cache policy: layer (default), lfu, s3fifo or lru\n"
               "  --measure        re-measure disk and memory bandwidth now (memory read with the engine's\n"
               "                   default thread count; cached in ~/.cache/strata/bw.json otherwise)\n"
               "  --json           print the plan as JSON\n"
               "\ncluster (strata-mpi: one model over N machines as pipeline stages):\n"
               "  --ranks N        plan N ranks of --ram-gb each: the layer split, each rank's plan\n"
               "                   and the predicted decode tokens/s with the network's share\n"
               "  --disk-gbs X     disk read bandwidth in GB/s (default: measured or cached)\n"
               "  --mem-gbs X      memory read bandwidth in GB/s (default: measured or cached)\n"
               "  --net-gbs X      network bandwidth between ranks in GB/s (default: measured when run as\n"
               "                   mpirun -np M strata-mpi plan ..., M >= 2; else 1.25, 10 GbE)\n"
               "  --net-lat-us X   one message's latency in microseconds (default: measured, else 50)\n",
            INFER_DEFAULT_CHUNK);
}

/* One rank's plan: its layers, their experts and sequence state, under its own
 * budget (the head and the embedding on rank 0). */
static int rank_plan(const cfg *c, const model_layout *lp, const char *model, const place_opts *po, int64_t lo, int64_t hi,
                     int rank, double disk, double mem, place_plan *out, char *err, size_t errlen) {
    place_opts o = *po;
    o.layer_lo = lo;
    o.layer_hi = hi;
    o.no_head = rank > 0;
    o.seq_bytes = infer_session_bytes_range(c, o.ctx > 0 ? o.ctx : 4096, lo, hi);
    int rc = place_plan_compute(c, lp, model, &o, out, err, errlen);
    if (rc) return rc;
    out->disk_bw = disk;
    out->mem_bw = mem;
    out->pred_s_per_token = (double)out->read_bytes_per_token / disk + (double)out->touch_bytes_per_token / mem;
    return 0;
}

/* strata plan --ranks N: pipeline stages over N machines of the same budget.
 * A decode token visits every stage in turn (one sequence: no overlap), so its
 * time is the sum of the stages' (each one's reads at the disk's bandwidth and
 * touches at memory's, as the single-machine plan predicts) plus one message
 * per hop: the residual stream after the stage's last layer (Block AttnRes:
 * the closed blocks and the partial, hidden floats each) and a header. */
static int cluster_plan(const cfg *c, const model_layout *lp, const char *model, const place_opts *po, int ranks, double disk,
                        double mem, double net, double lat) {
    static int64_t lo[256], hi[256];
    static place_plan q;
    char err[2048];
    if (ranks > c->n_layers) {
        fprintf(stderr, "strata plan: %d ranks for %lld layers: at most one rank per layer\n", ranks, (long long)c->n_layers);
        return EXIT_USAGE;
    }
    place_cluster_split(c, lp, ranks, lo, hi);
    printf("cluster plan: %d ranks x %.1f GB (%.1f GB in all), disk %.2f GB/s, memory %.2f GB/s, network %.2f GB/s + %.0f us per message\n",
           ranks, (double)po->ram_bytes / 1e9, (double)po->ram_bytes * ranks / 1e9, disk / 1e9, mem / 1e9, net / 1e9, lat * 1e6);
    printf("  %4s  %9s  %9s  %11s  %13s  %9s  %12s  %9s  %10s\n", "rank", "layers", "weights GB", "trunk pinned", "expert slots",
           "plan GB", "read GB/tok", "s/token", "net B/tok");
    double s_tok = 0, read_tok = 0, net_bytes = 0, net_s = 0;
    int ok = 1;
    for (int r = 0; r < ranks; r++) {
        const uint64_t wb = place_stage_bytes(c, lp, lo[r], hi[r], r == 0);
        char lay[32];
        snprintf(lay, sizeof lay, "%lld-%lld", (long long)lo[r], (long long)hi[r] - 1);
        /* the hop after this stage: to the next stage, the last one back to rank 0 */
        const int64_t L = r + 1 < ranks ? hi[r] : c->n_layers;
        const double hop = (double)(infer_blocks_before(c, L) + 1) * (double)c->hidden * 4 + 64 + 12;
        net_bytes += hop;
        net_s += lat + hop / net;
        if (rank_plan(c, lp, model, po, lo[r], hi[r], r, disk, mem, &q, err, sizeof err)) {
            printf("  %4d  %9s  %9.1f  does not fit: %s\n", r, lay, (double)wb / 1e9, err);
            ok = 0;
            continue;
        }
        const int64_t own = q.n_owned, pinned = q.n_pinned - (q.n_units - q.n_owned);
        char pin[32], xs[32];
        snprintf(pin, sizeof pin, "%lld/%lld", (long long)pinned, (long long)own);
        snprintf(xs, sizeof xs, "%lld/%lld", (long long)q.n_expert_slots, (long long)(q.n_moe * c->n_experts));
        printf("  %4d  %9s  %9.1f  %11s  %13s  %9.1f  %12.3f  %9.3f  %10.0f\n", r, lay, (double)wb / 1e9, pin, xs,
               (double)q.total_bytes / 1e9, (double)q.read_bytes_per_token / 1e9, q.pred_s_per_token, hop);
        s_tok += q.pred_s_per_token;
        read_tok += (double)q.read_bytes_per_token;
    }
    if (!ok) {
        printf("  the cluster does not fit: give each rank more RAM or add ranks\n");
        return 2;
    }
    s_tok += net_s;
    printf("  predicted decode (one sequence): %.3f s/token = %.2f tokens/s; reads %.3f GB/token from disk in all;\n"
           "  network %.0f B/token in %d messages (%.3f ms/token)\n",
           s_tok, 1 / s_tok, read_tok / 1e9, net_bytes, ranks, net_s * 1e3);
    place_opts one = *po;
    if (!rank_plan(c, lp, model, &one, 0, c->n_layers, 0, disk, mem, &q, err, sizeof err))
        printf("  one machine of %.1f GB: %.3f s/token = %.2f tokens/s (reads %.3f GB/token): the cluster is %.2fx\n",
               (double)po->ram_bytes / 1e9, q.pred_s_per_token, 1 / q.pred_s_per_token, (double)q.read_bytes_per_token / 1e9,
               q.pred_s_per_token / s_tok);
    else
        printf("  one machine of %.1f GB: does not fit (%s)\n", (double)po->ram_bytes / 1e9, err);
    return 0;
}

int cmd_plan(int argc, char **argv) {
    const char *model = NULL, *config = NULL, *pack_dir = NULL;
    int json = 0, measure = 0, have_ram = 0, ranks = 0, net_given = 0, lat_given = 0;
    double disk_gbs = 0, mem_gbs = 0, net_gbs = 1.25, lat_us = 50;
    place_opts po = place_opts_default();
    po.session_bytes = infer_session_bytes;
    po.engine_bytes = infer_engine_bytes;
    po.prefill_chunk = INFER_DEFAULT_CHUNK;
    const char *ram_flag = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) { usage(stdout); return 0; }
        if (!strcmp(a, "--ram-gb") || !strcmp(a, "--ram")) {
            if (ram_flag && strcmp(ram_flag, a)) return cli_usage_error("plan", "%s and %s exclude each other (one budget)", ram_flag, a);
            ram_flag = a;
        }
        if (!strcmp(a, "--config")) { if (!(config = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE; }
        else if (!strcmp(a, "--pack")) { if (!(pack_dir = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE; }
        else if (!strcmp(a, "--ram-gb")) {
            double gbv;
            if (!(v = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE;
            if (base_parse_f64(v, 0.001, 1e6, &gbv)) return cli_usage_error("plan", "bad --ram-gb %s", v);
            po.ram_bytes = (uint64_t)(gbv * 1e9);
            have_ram = 1;
        } else if (!strcmp(a, "--ram")) {
            if (!(v = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE;
            if (!strcmp(v, "auto")) po.ram_bytes = base_mem_available();
            else if (base_parse_size(v, &po.ram_bytes)) return cli_usage_error("plan", "bad --ram %s", v);
            have_ram = 1;
        } else if (!strcmp(a, "--ctx") || !strcmp(a, "--chunk") || !strcmp(a, "--threads") || !strcmp(a, "--seqs")) {
            int64_t n;
            if (!(v = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE;
            if (base_parse_i64(v, 1, 1ll << 30, &n)) return cli_usage_error("plan", "bad %s %s", a, v);
            if (!strcmp(a, "--ctx")) po.ctx = n;
            else if (!strcmp(a, "--chunk")) po.prefill_chunk = n;
            else if (!strcmp(a, "--seqs")) {
                if (n > 4096) return cli_usage_error("plan", "bad --seqs %s (1..4096)", v);
                po.n_seqs = (int)n;
            }
            else po.n_threads = (int)n;
        } else if (!strcmp(a, "--policy")) {
            if (!(v = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE;
            if ((po.cache_policy = place_policy_parse(v)) < 0) return cli_usage_error("plan", "bad --policy %s (layer, lfu, s3fifo, lru)", v);
        } else if (!strcmp(a, "--ranks")) {
            int64_t n;
            if (!(v = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE;
            if (base_parse_i64(v, 1, 256, &n)) return cli_usage_error("plan", "bad --ranks %s (1..256)", v);
            ranks = (int)n;
        } else if (!strcmp(a, "--disk-gbs") || !strcmp(a, "--mem-gbs") || !strcmp(a, "--net-gbs") || !strcmp(a, "--net-lat-us")) {
            double d;
            if (!(v = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE;
            if (base_parse_f64(v, 1e-3, 1e7, &d)) return cli_usage_error("plan", "bad %s %s", a, v);
            if (!strcmp(a, "--disk-gbs")) disk_gbs = d;
            else if (!strcmp(a, "--mem-gbs")) mem_gbs = d;
            else if (!strcmp(a, "--net-gbs")) { net_gbs = d; net_given = 1; }
            else { lat_us = d; lat_given = 1; }
        } else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--measure")) measure = 1;
        else if (a[0] == '-') return cli_usage_error("plan", "unknown option %s", a);
        else if (!model) model = a;
        else return cli_usage_error("plan", "unexpected argument %s", a);
    }
    if (!model == !config) return cli_usage_error("plan", "give MODEL_DIR or --config FILE");
    if (!have_ram) return cli_usage_error("plan", "--ram-gb X or --ram SIZE|auto is required");
    if (!po.ram_bytes) return cli_usage_error("plan", "the budget must be positive");
    po.pack_dir = pack_dir;
    char err[2048], path[2048];
    static cfg c;
    static model_layout lay;
    st_index *ix = NULL;
    const model_layout *lp = NULL;
    snprintf(path, sizeof path, "%s/config.json", model ? model : "");
    if (cfg_load(&c, model ? path : config, err, sizeof err)) { fprintf(stderr, "strata plan: %s\n", err); return 1; }
    if (model) {
        if (st_open(&ix, model, err, sizeof err)) { fprintf(stderr, "strata plan: %s\n", err); return 1; }
        sbuf problems = {0};
        if (model_bind_check(&c, ix, &lay, &problems)) {
            fprintf(stderr, "strata plan: %s does not match its config:\n%s", model, problems.s ? problems.s : "");
            sbuf_free(&problems);
            st_close(ix);
            return 1;
        }
        sbuf_free(&problems);
        lp = &lay;
    }
    if (measure) {
        double d, m;
        char src[160];
        place_bandwidth(model ? model : NULL, 1, &d, &m, src, sizeof src);
    }
    if (ranks) {
        double d = 0, m = 0;
        place_bandwidth(NULL, 0, &d, &m, NULL, 0);
        if (disk_gbs > 0) d = disk_gbs * 1e9;
        if (mem_gbs > 0) m = mem_gbs * 1e9;
        if ((!net_given || !lat_given) && mo_cluster.measure_net && mo_cluster.size >= 2) {
            double nb = 0, nl = 0;
            if (mo_cluster.measure_net(mo_cluster.cl, &nb, &nl, err, sizeof err)) {
                fprintf(stderr, "strata plan: %s\n", err);
                st_close(ix);
                return 1;
            }
            if (!net_given && nb > 0) net_gbs = nb / 1e9;
            if (!lat_given) lat_us = nl * 1e6;
            printf("network measured between %d ranks: %.2f GB/s, %.1f us per message\n", mo_cluster.size, nb / 1e9, nl * 1e6);
        }
        int crc = cluster_plan(&c, lp, model, &po, ranks, d, m, net_gbs * 1e9, lat_us * 1e-6);
        st_close(ix);
        return crc;
    }
    static place_plan plan;
    int rc = place_plan_compute(&c, lp, model, &po, &plan, err, sizeof err);
    st_close(ix);
    if (rc == STRATA_EBUDGET) {
        fprintf(stderr, "strata plan: %s\n", err);
        return 2;
    }
    if (rc) { fprintf(stderr, "strata plan: %s\n", err); return 1; }
    if (json) {
        json_t *j = place_plan_json(&plan);
        char *s = json_dumps(j, JSON_INDENT(2));
        if (s) printf("%s\n", s);
        json_malloc_t jm;
        json_free_t jf;
        json_get_alloc_funcs(&jm, &jf);
        if (s) jf(s);
        json_decref(j);
    } else {
        place_plan_print(&plan, stdout);
        /* the trade: every sequence slot (KDA state + MLA cache) is RAM the
         * weights do not get; the step reads the trunk once for all of them */
        printf("sequences at this budget (one decode row each per step):\n");
        printf("  %4s  %10s  %7s  %12s  %12s  %14s\n", "seqs", "state GB", "pinned", "expert slots", "s/step", "tokens/s (sum)");
        static const int k_n[] = {1, 2, 4, 8, 16};
        static place_plan q;
        for (size_t i = 0; i < sizeof k_n / sizeof k_n[0]; i++) {
            place_opts qo = po;
            qo.n_seqs = k_n[i];
            char e2[2048];
            if (place_plan_compute(&c, lp, model, &qo, &q, e2, sizeof e2)) {
                printf("  %4d  %10s  (does not fit: needs %.3f GB)\n", k_n[i], "-", (double)q.min_bytes / 1e9);
                continue;
            }
            const double st = place_plan_step_seconds(&q, &c, k_n[i]);
            printf("  %4d  %10.3f  %7lld  %12lld  %12.3f  %14.3f\n", k_n[i], (double)q.session_bytes / 1e9, (long long)q.n_pinned,
                   (long long)q.n_expert_slots, st, st > 0 ? k_n[i] / st : 0);
        }
    }
    return 0;
}
