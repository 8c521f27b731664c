/*
 * cmd_plan.c: `strata plan MODEL_DIR|--config FILE --ram-gb X [--ctx N]` prints the
 * memory plan (strata_plan: src/plan_api.c) without loading weights. Exit 0 with a plan, 2 when the
 * budget is below the minimum (the minimum is printed), 1 on a bad model.
 */
#include <string.h>
#include "cli.h"
#include "model_open.h"
#include "opts.h"
#include "strata.h"

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
               "  --disk-gbs X     disk read bandwidth in GB/s for the prediction (default: measured\n"
               "                   or cached)\n"
               "  --mem-gbs X      memory read bandwidth in GB/s (default: measured or cached)\n"
               "\ncluster (strata-mpi: one model over N machines as pipeline stages):\n"
               "  --ranks N        plan N ranks of --ram-gb each: the layer split, each rank's plan\n"
               "                   and the predicted decode tokens/s with the network's share\n"
               "  --net-gbs X      network bandwidth between ranks in GB/s (default: measured when run as\n"
               "                   mpirun -np M strata-mpi plan ..., M >= 2; else 1.25, 10 GbE)\n"
               "  --net-lat-us X   one message's latency in microseconds (default: measured, else 50)\n",
            STRATA_PLAN_DEFAULT_CHUNK);
}

/* strata-mpi: the network between the ranks of the running cluster. */
static int measure_net(void *ud, double *bw, double *lat, char *err, size_t errlen) {
    (void)ud;
    return mo_cluster.measure_net(mo_cluster.cl, bw, lat, err, errlen);
}

int cmd_plan(int argc, char **argv) {
    const char *model = NULL, *config = NULL;
    int json = 0, measure = 0, ranks = 0, net_given = 0, lat_given = 0;
    double disk_gbs = 0, mem_gbs = 0, net_gbs = 1.25, lat_us = 50;
    strata_plan_opts po = strata_plan_opts_default();
    app_opts ao;
    opts_init(&ao, OPT_PLAN, 0);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) { usage(stdout); return 0; }
        int f = opts_take(argc, argv, &i, &ao, opts_shared, opts_n_shared, &ao);
        if (f > 0) return f;
        if (f == 0) continue;
        if (!strcmp(a, "--config")) { if (!(config = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE; }
        else if (!strcmp(a, "--seqs")) {
            int64_t n;
            if (!(v = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE;
            if (strata_parse_i64(v, 1, 4096, &n)) return cli_usage_error("plan", "bad --seqs %s (1..4096)", v);
            po.seqs = (int)n;
        } else if (!strcmp(a, "--policy")) {
            if (!(v = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE;
            if ((po.policy = strata_plan_policy(v)) < 0) return cli_usage_error("plan", "bad --policy %s (layer, lfu, s3fifo, lru)", v);
        } else if (!strcmp(a, "--ranks")) {
            int64_t n;
            if (!(v = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE;
            if (strata_parse_i64(v, 1, 256, &n)) return cli_usage_error("plan", "bad --ranks %s (1..256)", v);
            ranks = (int)n;
        } else if (!strcmp(a, "--disk-gbs") || !strcmp(a, "--mem-gbs") || !strcmp(a, "--net-gbs") || !strcmp(a, "--net-lat-us")) {
            double d;
            if (!(v = cli_need_arg(argc, argv, &i, "plan"))) return EXIT_USAGE;
            if (strata_parse_f64(v, 1e-3, 1e7, &d)) return cli_usage_error("plan", "bad %s %s", a, v);
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
    if (!ao.have_ram) return cli_usage_error("plan", "--ram-gb X or --ram SIZE|auto is required");
    po.ram_bytes = ao.ram_bytes;
    po.pack_dir = ao.pack_dir;
    if (ao.ctx) po.ctx = ao.ctx;
    if (ao.chunk) po.chunk = ao.chunk;
    if (ao.threads) po.threads = (int)ao.threads;
    po.model_dir = model;
    po.config = config;
    po.json = json;
    po.measure = measure;
    po.ranks = ranks;
    po.disk_gbs = disk_gbs;
    po.mem_gbs = mem_gbs;
    po.net_gbs = net_gbs;
    po.lat_us = lat_us;
    po.net_given = net_given;
    po.lat_given = lat_given;
    if (mo_cluster.measure_net) {
        po.measure_net = measure_net;
        po.net_ranks = mo_cluster.size;
    }
    static char err[65536];
    int rc = strata_plan(&po, stdout, err, sizeof err);
    if (rc && err[0]) fprintf(stderr, "strata plan: %s\n", err);
    return !rc ? 0 : rc == STRATA_EBUDGET || rc == STRATA_EINVAL ? 2 : 1;
}
