/*
 * t_stats.c: the counters defined once (strata.h's STRATA_STATS_* lists): the
 * table covers strata_stats exactly, and the --json report's keys and the
 * /metrics series that tests, bench scripts and users read keep their names.
 */
#include <jansson.h>
#include <string.h>
#include "strata.h"
#include "test.h"
#include "serve/metrics.h"

TEST(stats_fields_table) {
    int n = 0;
    const strata_stat_field *f = strata_stats_fields(&n);
    CHECK(f && n > 40);
    /* every member once: the sizes add up to the struct, no two share an offset */
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        bytes += f[i].type == STRATA_STAT_f64 ? sizeof(double) : sizeof(uint64_t);
        for (int k = 0; k < i; k++) {
            CHECK_MSG(f[k].offset != f[i].offset, "%s and %s share an offset", f[k].name, f[i].name);
            CHECK_MSG(strcmp(f[k].name, f[i].name), "%s twice", f[i].name);
            if (f[i].json && f[k].json && f[i].section && f[k].section && !strcmp(f[i].section, f[k].section))
                CHECK_MSG(strcmp(f[i].json, f[k].json), "key %s twice in %s", f[i].json, f[i].section);
            if (f[i].metric && f[k].metric && !strcmp(f[i].metric, f[k].metric))
                CHECK_MSG(strcmp(f[i].labels, f[k].labels), "series %s{%s} twice", f[i].metric, f[i].labels);
        }
        CHECK_MSG(!f[i].json || f[i].section, "%s: a report key without an object", f[i].name);
        if (f[i].metric) {
            int first = 1;
            for (int k = 0; k < i; k++) first &= !(f[k].metric && !strcmp(f[k].metric, f[i].metric));
            CHECK_MSG(!strncmp(f[i].metric, "strata_", 7) && f[i].labels, "%s", f[i].metric);
            CHECK_MSG(!first || (f[i].help && f[i].help[0]), "%s: the first series of a name has no HELP", f[i].metric);
        }
    }
    CHECK_MSG(bytes == sizeof(strata_stats), "the table covers %zu of %zu bytes", bytes, sizeof(strata_stats));
    /* names and offsets agree, and a value reads back through the table */
    strata_stats s;
    memset(&s, 0, sizeof s);
    s.bytes_experts = 12345;
    s.hit_rate = 0.25;
    s.prefix_n_disk = -3;
    int seen = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(f[i].name, "bytes_experts")) seen += strata_stat_value(&s, &f[i]) == 12345.0;
        if (!strcmp(f[i].name, "hit_rate")) seen += strata_stat_value(&s, &f[i]) == 0.25;
        if (!strcmp(f[i].name, "prefix_n_disk")) seen += strata_stat_value(&s, &f[i]) == -3.0;
    }
    CHECK(seen == 3);
}

/* The keys of one object of the report, space-separated, in order. */
static void keys_of(json_t *o, char *out, size_t n) {
    out[0] = 0;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        size_t l = strlen(out);
        snprintf(out + l, n - l, "%s%s", l ? " " : "", k);
    }
}

TEST(stats_report_json_keys) {
    const char *dir = t_model("stats_tiny", "tiny", 5, 0);
    char err[4096], pdir[1024];
    snprintf(pdir, sizeof pdir, "%s/stats_prefix", t_tmpdir);
    strata_model *m = NULL;
    if (!dir || strata_model_open(&m, dir, err, sizeof err)) { CHECK_MSG(0, "open: %s", err); return; }
    strata_model_opts o = strata_model_opts_default();
    o.ram_bytes = (uint64_t)1 << 30; /* placed (not resident) with room beside whatever the process holds */
    o.ctx = 64;
    o.rows = 16;
    o.n_threads = 1;
    o.max_seqs = 1;
    o.prefix_ram = 1u << 20;
    o.prefix_dir = pdir;
    if (strata_model_load(m, &o, err, sizeof err)) { CHECK_MSG(0, "load: %s", err); strata_model_close(m); return; }
    char *txt = strata_model_report_json(m);
    json_t *j = txt ? json_loads(txt, 0, NULL) : NULL;
    CHECK(j != NULL);
    char got[4096];
    /* the names before the counters were defined once: bench scripts and users read them */
    keys_of(json_object_get(j, "stats"), got, sizeof got);
    CHECK_MSG(!strcmp(got, "bytes_trunk bytes_head bytes_embed bytes_experts n_reads read_s wait_s bw layer_gets "
                           "layer_gets_pinned expert_requests expert_hits expert_misses expert_evictions hit_rate peak_rss "
                           "verify_bytes verify_s pred_layers pred_requests pred_hits pred_ids pred_skipped guess_copies "
                           "guess_lends preload_bytes preload_s preload_experts prefetch_reads prefetch_used"),
              "stats keys: %s", got);
    keys_of(json_object_get(j, "prefix"), got, sizeof got);
    CHECK_MSG(!strcmp(got, "lookups hits disk_hits tokens_reused stores spills rejected disk_read_bytes disk_written_bytes "
                           "ram_used_bytes ram_bytes disk_used_bytes dir_bytes"),
              "prefix keys: %s", got);
    CHECK(json_is_real(json_object_get(json_object_get(j, "stats"), "bw")) &&
          json_is_integer(json_object_get(json_object_get(j, "stats"), "peak_rss")) &&
          json_integer_value(json_object_get(json_object_get(j, "prefix"), "ram_bytes")) == 1 << 20);
    json_decref(j);
    strata_free(txt);
    strata_model_close(m);
}

TEST(stats_metrics_series) {
    metrics *mt = metrics_create();
    if (!mt) { CHECK(0); return; }
    strata_stats s;
    memset(&s, 0, sizeof s);
    s.bytes_trunk = 1, s.bytes_head = 2, s.bytes_embed = 3, s.bytes_experts = 4, s.expert_requests = 5, s.expert_hits = 6;
    s.hit_rate = 0.5, s.peak_rss = 7, s.prefix_lookups = 8, s.prefix_hits = 9, s.prefix_ram_hits = 6, s.prefix_disk_hits = 3;
    s.prefix_tokens = 10, s.prefix_stores = 11, s.prefix_rejected = 12, s.prefix_disk_read = 13, s.prefix_disk_written = 14;
    s.prefix_ram_used = 15, s.prefix_disk_used = 16, s.prefix_ram_bytes = 17, s.prefix_dir_bytes = 18;
    metrics_model(mt, &s);
    req_buf b = {0};
    metrics_render(mt, &b);
    /* the model's block exactly as /metrics has always written it */
    const char *want =
        "# HELP strata_read_bytes_total Bytes read from disk, by what.\n"
        "# TYPE strata_read_bytes_total counter\n"
        "strata_read_bytes_total{what=\"trunk\"} 1\nstrata_read_bytes_total{what=\"head\"} 2\n"
        "strata_read_bytes_total{what=\"embed\"} 3\nstrata_read_bytes_total{what=\"experts\"} 4\n"
        "# HELP strata_expert_requests_total Expert lookups in the expert cache.\n"
        "# TYPE strata_expert_requests_total counter\nstrata_expert_requests_total 5\n"
        "# HELP strata_expert_hits_total Expert lookups served from the cache.\n"
        "# TYPE strata_expert_hits_total counter\nstrata_expert_hits_total 6\n"
        "# HELP strata_expert_hit_rate Expert cache hit rate since start.\n"
        "# TYPE strata_expert_hit_rate gauge\nstrata_expert_hit_rate 0.500000\n"
        "# HELP strata_peak_rss_bytes Peak resident set size.\n"
        "# TYPE strata_peak_rss_bytes gauge\nstrata_peak_rss_bytes 7\n"
        "# HELP strata_prefix_lookups_total Requests that looked for a cached prefix of their prompt.\n"
        "# TYPE strata_prefix_lookups_total counter\nstrata_prefix_lookups_total 8\n"
        "# HELP strata_prefix_hits_total Requests that started from a cached prefix, by where it was.\n"
        "# TYPE strata_prefix_hits_total counter\n"
        "strata_prefix_hits_total{tier=\"ram\"} 6\nstrata_prefix_hits_total{tier=\"disk\"} 3\n"
        "# HELP strata_prefix_tokens_reused_total Prompt tokens restored from the prefix cache instead of evaluated.\n"
        "# TYPE strata_prefix_tokens_reused_total counter\nstrata_prefix_tokens_reused_total 10\n"
        "# HELP strata_prefix_snapshots_stored_total Snapshots of sequences kept by the prefix cache.\n"
        "# TYPE strata_prefix_snapshots_stored_total counter\nstrata_prefix_snapshots_stored_total 11\n"
        "# HELP strata_prefix_files_refused_total Snapshot files refused on reading (damaged, another model's).\n"
        "# TYPE strata_prefix_files_refused_total counter\nstrata_prefix_files_refused_total 12\n"
        "# HELP strata_prefix_disk_bytes_total Bytes of snapshot files, by direction.\n"
        "# TYPE strata_prefix_disk_bytes_total counter\n"
        "strata_prefix_disk_bytes_total{op=\"read\"} 13\nstrata_prefix_disk_bytes_total{op=\"written\"} 14\n"
        "# HELP strata_prefix_bytes Bytes the prefix cache holds now, by tier.\n"
        "# TYPE strata_prefix_bytes gauge\nstrata_prefix_bytes{tier=\"ram\"} 15\nstrata_prefix_bytes{tier=\"disk\"} 16\n"
        "# HELP strata_prefix_capacity_bytes Bounds of the prefix cache, by tier.\n"
        "# TYPE strata_prefix_capacity_bytes gauge\n"
        "strata_prefix_capacity_bytes{tier=\"ram\"} 17\nstrata_prefix_capacity_bytes{tier=\"disk\"} 18\n"
        "# HELP strata_spec_drafted_tokens_total ";
    const char *at = b.p ? strstr(b.p, "# HELP strata_read_bytes_total") : NULL;
    CHECK_MSG(at && !strncmp(at, want, strlen(want)), "the model's series:\n%.3000s", at ? at : "(none)");
    req_buf_free(&b);
    metrics_free(mt);
}
