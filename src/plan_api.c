/*
 * plan_api.c: the "plans" section of strata.h: `strata plan` as a library call.
 * The memory plan of a model directory or a config alone under a RAM budget
 * (place.h) without loading weights, the sequences it trades for weights, and
 * for a cluster of ranks the layer split and each rank's plan.
 */
#include <string.h>
#include <jansson.h>
#include "base.h"
#include "cfg.h"
#include "infer.h"
#include "model.h"
#include "place.h"
#include "st.h"
#include "strata.h"

_Static_assert(STRATA_PLAN_DEFAULT_CHUNK == INFER_DEFAULT_CHUNK, "infer.h's default chunk");

/* STRATA_EBUDGET and STRATA_EINVAL mean the budget and the options (strata.h); a
 * failure to read the model is reported with another code. */
static int model_error(int rc) { return rc == STRATA_EBUDGET || rc == STRATA_EINVAL ? STRATA_EFORMAT : rc; }

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
                        double mem, double net, double lat, FILE *out, char *errbuf, size_t errlen) {
    static int64_t lo[256], hi[256];
    static place_plan q;
    char err[2048];
    if (ranks > c->n_layers) {
        return base_fail(errbuf, errlen, STRATA_EINVAL, "%d ranks for %lld layers: at most one rank per layer", ranks,
                         (long long)c->n_layers);
    }
    place_cluster_split(c, lp, ranks, lo, hi);
    fprintf(out, "cluster plan: %d ranks x %.1f GB (%.1f GB in all), disk %.2f GB/s, memory %.2f GB/s, network %.2f GB/s + %.0f us per message\n",
           ranks, (double)po->ram_bytes / 1e9, (double)po->ram_bytes * ranks / 1e9, disk / 1e9, mem / 1e9, net / 1e9, lat * 1e6);
    fprintf(out, "  %4s  %9s  %9s  %11s  %13s  %9s  %12s  %9s  %10s\n", "rank", "layers", "weights GB", "trunk pinned", "expert slots",
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
            fprintf(out, "  %4d  %9s  %9.1f  does not fit: %s\n", r, lay, (double)wb / 1e9, err);
            ok = 0;
            continue;
        }
        const int64_t own = q.n_owned, pinned = q.n_pinned - (q.n_units - q.n_owned);
        char pin[32], xs[32];
        snprintf(pin, sizeof pin, "%lld/%lld", (long long)pinned, (long long)own);
        snprintf(xs, sizeof xs, "%lld/%lld", (long long)q.n_expert_slots, (long long)(q.n_moe * c->n_experts));
        fprintf(out, "  %4d  %9s  %9.1f  %11s  %13s  %9.1f  %12.3f  %9.3f  %10.0f\n", r, lay, (double)wb / 1e9, pin, xs,
               (double)q.total_bytes / 1e9, (double)q.read_bytes_per_token / 1e9, q.pred_s_per_token, hop);
        s_tok += q.pred_s_per_token;
        read_tok += (double)q.read_bytes_per_token;
    }
    if (!ok) {
        fprintf(out, "  the cluster does not fit: give each rank more RAM or add ranks\n");
        if (errlen) errbuf[0] = 0; /* said on out */
        return STRATA_EBUDGET;
    }
    s_tok += net_s;
    fprintf(out, "  predicted decode (one sequence): %.3f s/token = %.2f tokens/s; reads %.3f GB/token from disk in all;\n"
           "  network %.0f B/token in %d messages (%.3f ms/token)\n",
           s_tok, 1 / s_tok, read_tok / 1e9, net_bytes, ranks, net_s * 1e3);
    place_opts one = *po;
    if (!rank_plan(c, lp, model, &one, 0, c->n_layers, 0, disk, mem, &q, err, sizeof err))
        fprintf(out, "  one machine of %.1f GB: %.3f s/token = %.2f tokens/s (reads %.3f GB/token): the cluster is %.2fx\n",
               (double)po->ram_bytes / 1e9, q.pred_s_per_token, 1 / q.pred_s_per_token, (double)q.read_bytes_per_token / 1e9,
               q.pred_s_per_token / s_tok);
    else
        fprintf(out, "  one machine of %.1f GB: does not fit (%s)\n", (double)po->ram_bytes / 1e9, err);
    return 0;
}

strata_plan_opts strata_plan_opts_default(void) {
    strata_plan_opts o;
    memset(&o, 0, sizeof o);
    o.chunk = INFER_DEFAULT_CHUNK;
    o.policy = -1;
    o.net_gbs = 1.25;
    o.lat_us = 50;
    return o;
}

int strata_plan_policy(const char *name) { return place_policy_parse(name); }

/* The sequences table under the plan: every sequence slot (KDA state + MLA cache)
 * is RAM the weights do not get; the step reads the trunk once for all of them. */
static void print_seqs(const cfg *c, const model_layout *lp, const char *model, const place_opts *po, double disk_bw,
                       double mem_bw, FILE *out) {
    fprintf(out, "sequences at this budget (one decode row each per step):\n");
    fprintf(out, "  %4s  %10s  %7s  %12s  %12s  %14s\n", "seqs", "state GB", "pinned", "expert slots", "s/step", "tokens/s (sum)");
    static const int k_n[] = {1, 2, 4, 8, 16};
    static place_plan q;
    for (size_t i = 0; i < sizeof k_n / sizeof k_n[0]; i++) {
        place_opts qo = *po;
        qo.n_seqs = k_n[i];
        char e2[2048];
        if (place_plan_compute(c, lp, model, &qo, &q, e2, sizeof e2)) {
            fprintf(out, "  %4d  %10s  (does not fit: needs %.3f GB)\n", k_n[i], "-", (double)q.min_bytes / 1e9);
            continue;
        }
        if (disk_bw > 0) q.disk_bw = disk_bw; /* --disk-gbs / --mem-gbs, as the plan above */
        if (mem_bw > 0) q.mem_bw = mem_bw;
        const double st = place_plan_step_seconds(&q, c, k_n[i]);
        fprintf(out, "  %4d  %10.3f  %7lld  %12lld  %12.3f  %14.3f\n", k_n[i], (double)q.session_bytes / 1e9, (long long)q.n_pinned,
                (long long)q.n_expert_slots, st, st > 0 ? k_n[i] / st : 0);
    }
}

int strata_plan(const strata_plan_opts *o, FILE *out, char *err, size_t errlen) {
    const char *model = o->model_dir;
    if (!model == !o->config || !o->ram_bytes)
        return base_fail(err, errlen, STRATA_EINVAL, "give a model directory or a config file, and a positive budget");
    place_opts po = place_opts_default();
    po.session_bytes = infer_session_bytes;
    po.engine_bytes = infer_engine_bytes;
    po.prefill_chunk = o->chunk;
    po.ram_bytes = o->ram_bytes;
    if (o->ctx) po.ctx = o->ctx;
    po.n_threads = o->threads;
    if (o->seqs) po.n_seqs = o->seqs;
    if (o->policy >= 0) po.cache_policy = o->policy;
    po.pack_dir = o->pack_dir;
    char path[2048];
    static cfg c;
    static model_layout lay;
    st_index *ix = NULL;
    const model_layout *lp = NULL;
    int rc;
    snprintf(path, sizeof path, "%s/config.json", model ? model : "");
    if ((rc = cfg_load(&c, model ? path : o->config, err, errlen))) return model_error(rc);
    if (model) {
        if ((rc = st_open(&ix, model, err, errlen))) return model_error(rc);
        sbuf problems = {0};
        if (model_bind_check(&c, ix, &lay, &problems)) {
            size_t n = problems.len;
            if (n && problems.s[n - 1] == '\n') n--; /* the caller ends the line */
            base_fail(err, errlen, STRATA_EFORMAT, "%s does not match its config:\n%.*s", model, (int)n,
                      problems.s ? problems.s : "");
            sbuf_free(&problems);
            st_close(ix);
            return STRATA_EFORMAT;
        }
        sbuf_free(&problems);
        lp = &lay;
        c.wf = lay.wf; /* the headers decide the formats (bytes as stored) */
    }
    if (o->measure) {
        double d, m;
        char src[160];
        place_bandwidth(model ? model : NULL, 1, &d, &m, src, sizeof src);
    }
    if (o->ranks) {
        double d = 0, m = 0, net_gbs = o->net_gbs, lat_us = o->lat_us;
        place_bandwidth(NULL, 0, &d, &m, NULL, 0);
        if (o->disk_gbs > 0) d = o->disk_gbs * 1e9;
        if (o->mem_gbs > 0) m = o->mem_gbs * 1e9;
        if ((!o->net_given || !o->lat_given) && o->measure_net && o->net_ranks >= 2) {
            double nb = 0, nl = 0;
            if ((rc = o->measure_net(o->net_ud, &nb, &nl, err, errlen))) {
                st_close(ix);
                return model_error(rc);
            }
            if (!o->net_given && nb > 0) net_gbs = nb / 1e9;
            if (!o->lat_given) lat_us = nl * 1e6;
            fprintf(out, "network measured between %d ranks: %.2f GB/s, %.1f us per message\n", o->net_ranks, nb / 1e9,
                    nl * 1e6);
        }
        rc = cluster_plan(&c, lp, model, &po, o->ranks, d, m, net_gbs * 1e9, lat_us * 1e-6, out, err, errlen);
        st_close(ix);
        return rc;
    }
    static place_plan plan;
    rc = place_plan_compute(&c, lp, model, &po, &plan, err, errlen);
    st_close(ix);
    if (rc) return rc == STRATA_EBUDGET ? rc : model_error(rc);
    if (o->disk_gbs > 0 || o->mem_gbs > 0) { /* a prediction for another machine: the same model, given bandwidths */
        if (o->disk_gbs > 0) plan.disk_bw = o->disk_gbs * 1e9;
        if (o->mem_gbs > 0) plan.mem_bw = o->mem_gbs * 1e9;
        snprintf(plan.bw_source, sizeof plan.bw_source, "given%s", o->disk_gbs > 0 && o->mem_gbs > 0 ? "" : " in part");
        plan.pred_s_per_token = (plan.disk_bw > 0 ? (double)plan.read_bytes_per_token / plan.disk_bw : 0) +
                                (plan.mem_bw > 0 ? (double)plan.touch_bytes_per_token / plan.mem_bw : 0);
    }
    if (o->json) {
        json_t *j = place_plan_json(&plan);
        char *s = json_dumps(j, JSON_INDENT(2));
        if (s) fprintf(out, "%s\n", s);
        json_malloc_t jm;
        json_free_t jf;
        json_get_alloc_funcs(&jm, &jf);
        if (s) jf(s);
        json_decref(j);
    } else {
        place_plan_print(&plan, out);
        print_seqs(&c, lp, model, &po, o->disk_gbs * 1e9, o->mem_gbs * 1e9, out);
    }
    return STRATA_OK;
}
