/*
 * cmd_plan.c: `strata plan MODEL_DIR|--config FILE --ram-gb X [--ctx N]` prints the
 * memory plan (place.h) without loading weights. Exit 0 with a plan, 2 when the
 * budget is below the minimum (the minimum is printed), 1 on a bad model.
 */
#include <string.h>
#include "cli.h"
#include "infer.h"
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
               "  --policy P       expert cache policy: s3fifo (default) or lru\n"
               "  --measure        re-measure disk and memory bandwidth now (cached otherwise)\n"
               "  --json           print the plan as JSON\n",
            INFER_DEFAULT_CHUNK);
}

int cmd_plan(int argc, char **argv) {
    const char *model = NULL, *config = NULL, *pack_dir = NULL;
    int json = 0, measure = 0, have_ram = 0;
    place_opts po = place_opts_default();
    po.session_bytes = infer_session_bytes;
    po.engine_bytes = infer_engine_bytes;
    po.prefill_chunk = INFER_DEFAULT_CHUNK;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) { usage(stdout); return 0; }
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
            if (!strcmp(v, "lru")) po.cache_policy = PLACE_POLICY_LRU;
            else if (!strcmp(v, "s3fifo")) po.cache_policy = PLACE_POLICY_S3FIFO;
            else return cli_usage_error("plan", "bad --policy %s", v);
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
