/*
 * model_open.c: see model_open.h.
 */
#include <string.h>
#include "cli.h"
#include "kern.h"
#include "model_open.h"
#include "pool.h"

/* One model per process: the layout table and the plan are large (per-layer arrays),
 * so they live here rather than on the caller's stack. */
static model_layout g_lay;
static place_plan g_plan;

int mo_flag(int argc, char **argv, int *i, const char *cmd, mo_opts *o) {
    const char *a = argv[*i], *v;
    double d;
    if (!strcmp(a, "--plan")) { o->plan_only = 1; return 0; }
    if (strcmp(a, "--ram-gb") && strcmp(a, "--ram") && strcmp(a, "--pack") && strcmp(a, "--threads")) return -1;
    if (!(v = cli_need_arg(argc, argv, i, cmd))) return EXIT_USAGE;
    if (!strcmp(a, "--pack")) { o->pack_dir = v; return 0; }
    if (!strcmp(a, "--threads")) {
        if (base_parse_i64(v, 1, 256, &o->threads)) return cli_usage_error(cmd, "bad value for %s: '%s' (1..256)", a, v);
        return 0;
    }
    if (!strcmp(a, "--ram-gb")) {
        if (base_parse_f64(v, 0.001, 1e6, &d))
            return cli_usage_error(cmd, "bad value for %s: '%s' (a positive number of GB)", a, v);
        o->ram_bytes = (uint64_t)(d * 1e9);
        o->have_ram = 1;
        return 0;
    }
    if (!strcmp(v, "auto")) {
        o->ram_bytes = base_mem_available();
        if (!o->ram_bytes) return cli_usage_error(cmd, "--ram auto: MemAvailable is unknown here; give a size");
    } else if (base_parse_size(v, &o->ram_bytes) || !o->ram_bytes) {
        return cli_usage_error(cmd, "bad value for %s: '%s' (a size like 24G, or auto)", a, v);
    }
    o->have_ram = 1;
    return 0;
}

int mo_open(mo_model *m, const char *cmd, const char *model_dir) {
    char err[4096], path[4096];
    memset(m, 0, sizeof *m);
    m->cmd = cmd;
    m->dir = model_dir;
    m->lay = &g_lay;
    m->plan = &g_plan;
    m->kname = kern_init(NULL);
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (cfg_load(&m->c, path, err, sizeof err)) { fprintf(stderr, "strata %s: %s\n", cmd, err); return 1; }
    if (st_open(&m->ix, model_dir, err, sizeof err)) { fprintf(stderr, "strata %s: %s\n", cmd, err); return 1; }
    sbuf pb = {0};
    if (model_bind_check(&m->c, m->ix, m->lay, &pb)) {
        fprintf(stderr, "strata %s: %s: the model does not match its config (%d problems):\n%s", cmd, model_dir, pb.n,
                pb.s ? pb.s : "");
        sbuf_free(&pb);
        return 1;
    }
    sbuf_free(&pb);
    return 0;
}

/* What the load line says about where the weights are: "all resident" only when
 * nothing is read twice (every trunk unit pinned, the embedding table resident, a
 * cache slot for every expert); otherwise which parts are pinned, which
 * streamed, and how many experts the cache holds (the rest are read on demand). */
static const char *placement_name(const mo_model *m, char *buf, size_t n) {
    const place_plan *p = m->plan;
    if (!m->placed) return "resident";
    const int64_t n_exp = (m->c.n_layers - m->c.first_dense) * m->c.n_experts;
    if (p->resident && p->n_expert_slots >= n_exp) return "placed: all resident (experts read on first use)";
    char trunk[96];
    if (p->n_pinned == p->n_units) snprintf(trunk, sizeof trunk, "trunk pinned");
    else
        snprintf(trunk, sizeof trunk, "%lld of %lld trunk units pinned, the rest streamed", (long long)p->n_pinned,
                 (long long)p->n_units);
    snprintf(buf, n, "placed: %s%s, experts cached (%lld of %lld)", trunk,
             p->embed_resident ? "" : ", embeddings read by row", (long long)p->n_expert_slots, (long long)n_exp);
    return buf;
}

int mo_place(mo_model *m, const mo_opts *o, int64_t ctx) {
    char err[4096];
    int rc;
    m->ctx = ctx;
    m->threads = o->threads ? (int)o->threads : pool_default_threads();
    m->chunk = o->chunk ? o->chunk : INFER_DEFAULT_CHUNK;
    /* a budget (or a pack) goes through the planner and the streaming source;
     * otherwise every weight is read into RAM */
    m->placed = o->have_ram || o->pack_dir || o->plan_only;
    if (m->placed) {
        place_opts po = place_opts_default();
        po.ram_bytes = o->have_ram ? o->ram_bytes : 0;
        po.pack_dir = o->pack_dir;
        po.ctx = ctx;
        po.prefill_chunk = m->chunk;
        po.n_threads = m->threads;
        po.session_bytes = infer_session_bytes;
        po.engine_bytes = infer_engine_bytes;
        rc = place_plan_compute(&m->c, m->lay, m->dir, &po, m->plan, err, sizeof err);
        if (rc) {
            fprintf(stderr, "strata %s: %s\n", m->cmd, err);
            return rc == STRATA_EBUDGET ? EXIT_USAGE : 1;
        }
        if (o->plan_only) {
            place_plan_print(m->plan, stdout);
            return MO_PLANNED;
        }
        m->chunk = m->plan->prefill_chunk;
    }
    double t = base_now();
    rc = m->placed ? place_open(&m->w, &m->c, m->ix, m->dir, m->plan, err, sizeof err)
                   : wsrc_resident_open(&m->w, &m->c, m->ix, err, sizeof err);
    if (rc) { fprintf(stderr, "strata %s: %s\n", m->cmd, err); return 1; }
    m->t_load = base_now() - t;
    engine_opts eo = {m->threads, m->chunk};
    if (engine_create(&m->e, &m->c, m->w, &eo, err, sizeof err)) { fprintf(stderr, "strata %s: %s\n", m->cmd, err); return 1; }
    char where[256];
    fprintf(stderr, "strata %s: %lld layers (%lld MLA), vocab %lld, %d threads, kernels %s, ctx %lld, weights %s (%.2f s)\n",
            m->cmd, (long long)m->c.n_layers, (long long)m->c.n_mla, (long long)m->c.vocab, m->threads, m->kname,
            (long long)ctx, placement_name(m, where, sizeof where), m->t_load);
    return 0;
}

void mo_fmt_speed(const mo_model *m, int64_t n_prefill, double t_prefill, int64_t n_decode, double t_decode,
                  uint64_t peak_rss, char *buf, size_t n) {
    double pf = n_prefill ? t_prefill / (double)n_prefill : 0, dc = n_decode ? t_decode / (double)n_decode : 0;
    char b1[32], b2[32];
    snprintf(buf, n,
             "prefill %.4f s/token (%.1f tok/s), decode %.4f s/token (%.2f tok/s); MLA cache %llu B/position; "
             "peak RSS %s (engine %s)",
             pf, pf > 0 ? 1 / pf : 0, dc, dc > 0 ? 1 / dc : 0, (unsigned long long)infer_mla_cache_bytes_per_pos(&m->c),
             base_fmt_bytes(peak_rss, b1, sizeof b1), base_fmt_bytes(base_mem_peak(), b2, sizeof b2));
}

void mo_report(mo_model *m, FILE *f) {
    if (!m->placed || !m->w) return;
    place_stats pst;
    memset(&pst, 0, sizeof pst);
    place_stats_get(m->w, &pst);
    place_stats_print(&pst, m->plan, f);
}

json_t *mo_placement_json(mo_model *m) {
    if (!m->placed || !m->w) return json_pack("{s:s}", "plan", "resident");
    place_stats pst;
    memset(&pst, 0, sizeof pst);
    place_stats_get(m->w, &pst);
    json_t *pl = json_object();
    json_object_set_new(pl, "plan", place_plan_json(m->plan));
    json_object_set_new(pl, "stats", place_stats_json(&pst));
    return pl;
}

void mo_close(mo_model *m) {
    engine_free(m->e);
    m->e = NULL;
    if (m->w) m->w->ops->close(m->w);
    m->w = NULL;
    st_close(m->ix);
    m->ix = NULL;
}
