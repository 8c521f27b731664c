/*
 * api_report.c: what a loaded model reports through the public API: its info
 * (strata_model_get_info: shapes, budget and plan, placement line, identity),
 * the I/O, draft and prefix counters (strata_model_get_stats / _reset_stats),
 * and the plan and run reports, as text and as the --json document. Reads the
 * model's objects (api_int.h); changes nothing but the counters it resets.
 */
#include <string.h>
#include <jansson.h>
#include "api_int.h"
#include "arch.h"
#include "ident.h"
#include "jsonx.h"
#include "schema.h"

/* What the load line says about where the weights are: "all resident" only when
 * nothing is read twice; otherwise what is pinned, streamed and cached. */
static void placement_name(const strata_model *m, char *buf, size_t n) {
    const place_plan *p = &m->plan;
    if (!m->placed) { snprintf(buf, n, "resident"); return; }
    const int64_t n_exp = p->n_moe * m->c.n_experts; /* this process's MoE layers */
    if (p->resident && p->n_expert_slots >= n_exp) {
        snprintf(buf, n, "placed: all resident (%s)", p->no_preload ? "experts read on first use" : "read at load");
        return;
    }
    char trunk[96];
    const int64_t absent = p->n_owned ? p->n_units - p->n_owned : 0; /* a pipeline stage's other units */
    if (p->n_pinned == p->n_units) snprintf(trunk, sizeof trunk, "trunk pinned");
    else
        snprintf(trunk, sizeof trunk, "%lld of %lld trunk units pinned, the rest streamed", (long long)(p->n_pinned - absent),
                 (long long)(p->n_units - absent));
    snprintf(buf, n, "placed: %s%s, experts cached (%lld of %lld)", trunk, p->embed_resident || p->no_head ? "" : ", embeddings read by row",
             (long long)p->n_expert_slots, (long long)n_exp);
}

void strata_model_get_info(const strata_model *m, strata_model_info *o) {
    memset(o, 0, sizeof *o);
    o->n_layers = cfg_main_layers(&m->c);
    o->n_mla = m->c.n_mla - m->c.mtp;
    o->mtp = m->c.mtp;
    o->vocab = m->c.vocab;
    o->hidden = m->c.hidden;
    o->model_max_ctx = m->c.max_ctx;
    o->ctx = m->ctx;
    o->rows = m->rows;
    o->max_seqs = m->max_seqs;
    o->n_threads = m->threads;
    o->placed = m->placed;
    o->has_tokenizer = m->tk != NULL;
    o->kernel = m->kname ? m->kname : "";
    o->arch = arch_of(&m->c)->name;
    o->router_hf_ok = !m->c.no_kda;
    o->load_s = m->t_load;
    o->mla_cache_bytes_per_pos = infer_mla_cache_bytes_per_pos(&m->c);
    o->seq_bytes = m->ctx ? infer_session_bytes(&m->c, m->ctx) : 0;
    o->engine_bytes = m->rows ? infer_engine_bytes(&m->c, m->rows, m->threads) : 0;
    if (m->placed) {
        o->budget_bytes = m->plan.budget_bytes;
        o->plan_bytes = m->plan.total_bytes;
        o->min_bytes = m->plan.min_bytes;
        o->streamed_bytes = m->plan.streamed_bytes;
        o->n_expert_slots = m->plan.n_expert_slots;
        o->disk_bw = m->plan.disk_bw;
        o->mem_bw = m->plan.mem_bw;
    }
    o->expert_bytes = m->lay.expert_bytes;
    for (int64_t L = 0; L < m->c.n_layers; L++) {
        o->trunk_bytes += m->lay.layer_bytes[L];
        o->n_moe_layers += cfg_is_moe(&m->c, L) ? 1 : 0;
    }
    o->head_bytes = m->lay.head_bytes;
    o->embed_row_bytes = m->c.vocab ? m->lay.embed_bytes / (uint64_t)m->c.vocab : 0;
    cfg_census k;
    schema_census(&m->c, &k);
    o->state_touch_bytes = 2 * k.kda_state_elems * sizeof(float);
    o->topk = m->c.topk;
    placement_name(m, o->placement, sizeof o->placement);
    snprintf(o->weights_unverified, sizeof o->weights_unverified, "%s", m->unverified);
    o->identity = m->model_id;
    o->identity_source = m->id_source == IDENT_FROM_PACK ? "the pack's record hashes"
                         : m->id_source == IDENT_FROM_CACHE ? "the cached content hash"
                         : m->id_source == IDENT_HASHED ? "a content hash of the shards" : "";
}

void strata_model_print_plan(const strata_model *m, FILE *f) {
    if (m->placed) place_plan_print(&m->plan, f);
}

void strata_model_get_stats(strata_model *m, strata_stats *o) {
    memset(o, 0, sizeof *o);
    place_stats s;
    memset(&s, 0, sizeof s);
    if (m->placed && m->w) place_stats_get(m->w, &s);
#define CP(t, n, json, metric, col) o->n = s.n;
    STRATA_STATS_IO(CP)
#undef CP
    o->peak_rss = base_peak_rss();
    if (m->e) {
        engine_draft_stats d;
        engine_draft_stats_get(m->e, &d);
        o->draft_passes = d.passes;
        o->draft_layers = d.layers;
        o->draft_layers_run = d.layers - d.layers_skipped;
        o->draft_experts = d.experts;
        o->draft_experts_used = d.experts - d.experts_dropped;
    }
    if (m->px) {
        prefix_stats p;
        prefix_get_stats(m->px, &p);
#define CP(t, n, json, metric, col) o->prefix_##n = p.n;
        STRATA_STATS_PREFIX(CP)
#undef CP
    }
}

void strata_model_reset_stats(strata_model *m) {
    if (m->placed && m->w) place_stats_reset(m->w);
    if (m->e) engine_draft_stats_reset(m->e);
    if (m->px) prefix_reset_stats(m->px);
}

/* The prefix cache's line of the run report. */
static void prefix_report(strata_model *m, FILE *f) {
    prefix_stats p;
    prefix_get_stats(m->px, &p);
    fprintf(f, "prefix cache: %llu lookups, %llu hits (%llu from disk), %llu prompt tokens reused; %llu snapshots stored, "
               "RAM %.3f of %.3f GB (%lld held)",
            (unsigned long long)p.lookups, (unsigned long long)p.hits, (unsigned long long)p.disk_hits,
            (unsigned long long)p.tokens, (unsigned long long)p.stores, (double)p.ram_used / 1e9, (double)p.ram_bytes / 1e9,
            (long long)p.n_ram);
    if (p.dir_bytes)
        fprintf(f, ", disk %.3f of %.3f GB (%lld files; %.3f GB written, %.3f GB read, %llu refused)", (double)p.disk_used / 1e9,
                (double)p.dir_bytes / 1e9, (long long)p.n_disk, (double)p.disk_written / 1e9, (double)p.disk_read / 1e9,
                (unsigned long long)p.rejected);
    fputc('\n', f);
}

void strata_model_print_report(strata_model *m, FILE *f) {
    if (m->px) prefix_report(m, f);
    if (!m->placed || !m->w) return;
    place_stats s;
    memset(&s, 0, sizeof s);
    place_stats_get(m->w, &s);
    place_stats_print(&s, &m->plan, f);
}

/* The counters of one object of the --json report ("stats", "prefix"), in the
 * order of strata.h's lists. */
static json_t *stats_json(const strata_stats *s, const char *section) {
    json_t *j = json_object();
    int n;
    const strata_stat_field *f = strata_stats_fields(&n);
    for (int i = 0; j && i < n; i++) {
        if (!f[i].json || !f[i].section || strcmp(f[i].section, section)) continue;
        const char *p = (const char *)s + f[i].offset;
        json_t *v;
        if (f[i].type == STRATA_STAT_f64) { double d; memcpy(&d, p, sizeof d); v = json_real(d); }
        else if (f[i].type == STRATA_STAT_i64) { int64_t d; memcpy(&d, p, sizeof d); v = json_integer((json_int_t)d); }
        else { uint64_t d; memcpy(&d, p, sizeof d); v = json_integer((json_int_t)d); }
        json_object_set_new(j, f[i].json, v);
    }
    return j;
}

char *strata_model_report_json(strata_model *m) {
    /* jsonx routes jansson through base_alloc once it has loaded anything: make
     * sure of that, so the text is released with base_free */
    json_decref(jsonx_load((const uint8_t *)"{}", 2, "init", NULL, 0));
    strata_stats st;
    strata_model_get_stats(m, &st);
    json_t *j;
    if (!m->placed || !m->w) {
        j = json_pack("{s:s}", "plan", "resident");
    } else {
        j = json_object();
        json_object_set_new(j, "plan", place_plan_json(&m->plan));
        json_object_set_new(j, "stats", stats_json(&st, "stats"));
    }
    if (j && m->px) json_object_set_new(j, "prefix", stats_json(&st, "prefix"));
    char *txt = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    json_decref(j);
    return txt;
}
