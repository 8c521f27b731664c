/*
 * inspect.c: `strata inspect` as a library call (strata.h, "inspect"): what a model
 * is before anything is loaded: the config summary, the layer map, parameter and
 * byte counts by class (from the census, i.e. schema_walk), and for a model
 * directory the checkpoint facts (shards, tensors, layout) and every binding
 * problem, as a human report or one JSON object on the caller's FILE. Numbers are
 * printed both human-friendly and exact ("2.78T parameters (2,779,487,...)") so
 * scripts can grep either.
 */
#include <math.h>
#include <string.h>
#include "arch.h"
#include "cfg.h"
#include "model.h"
#include "st.h"
#include "strata.h"

#define ERRLEN 65536

/* ------------------------------------------------------------ formatting */

/* 2779487214592 -> "2,779,487,214,592". buf >= 32. */
static const char *commas(uint64_t v, char *buf, size_t n) {
    char tmp[32];
    int len = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    size_t k = 0;
    for (int i = 0; i < len && k + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[k++] = ',';
        buf[k++] = tmp[i];
    }
    buf[k] = 0;
    return buf;
}

/* Parameter counts: "2.78T", "105.36B", "33.03M". */
static const char *params_h(uint64_t v, char *buf, size_t n) {
    double x = (double)v;
    if (x >= 1e12) snprintf(buf, n, "%.2fT", x / 1e12);
    else if (x >= 1e9) snprintf(buf, n, "%.2fB", x / 1e9);
    else if (x >= 1e6) snprintf(buf, n, "%.2fM", x / 1e6);
    else if (x >= 1e3) snprintf(buf, n, "%.2fK", x / 1e3);
    else snprintf(buf, n, "%llu", (unsigned long long)v);
    return buf;
}

/* Three decimals for per-layer sizes ("2.341 GB", "0.844 GB"), as the spec
 * quotes them. */
static const char *bytes3(uint64_t v, char *buf, size_t n) {
    double x = (double)v;
    if (x >= 1e12) snprintf(buf, n, "%.3f TB", x / 1e12);
    else if (x >= 1e8) snprintf(buf, n, "%.3f GB", x / 1e9); /* 0.844 GB, as quoted */
    else if (x >= 1e6) snprintf(buf, n, "%.3f MB", x / 1e6);
    else if (x >= 1e3) snprintf(buf, n, "%.3f KB", x / 1e3);
    else snprintf(buf, n, "%llu B", (unsigned long long)v);
    return buf;
}

/* Writes s as a JSON string literal. */
static void json_str(sbuf *b, const char *s) {
    sbuf_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') sbuf_printf(b, "\\%c", *p);
        else if (*p == '\n') sbuf_printf(b, "\\n");
        else if (*p == '\t') sbuf_printf(b, "\\t");
        else if (*p < 0x20) sbuf_printf(b, "\\u%04x", *p);
        else sbuf_printf(b, "%c", *p);
    }
    sbuf_printf(b, "\"");
}

/* Problem text ("  - msg\n" lines, or plain lines) as a JSON array of strings. */
static void json_lines(sbuf *b, const char *text) {
    sbuf_printf(b, "[");
    int first = 1;
    const char *p = text ? text : "";
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        const char *q = p;
        if (n >= 4 && !strncmp(q, "  - ", 4)) { q += 4; n -= 4; }
        if (n) {
            char line[1024];
            snprintf(line, sizeof line, "%.*s", (int)n, q);
            if (!first) sbuf_printf(b, ", ");
            json_str(b, line);
            first = 0;
        }
        p = e ? e + 1 : p + strlen(p);
    }
    sbuf_printf(b, "]");
}

/* Prints text's lines to f, each prefixed. */
static void print_lines(FILE *f, const char *prefix, const char *text) {
    const char *p = text ? text : "";
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n >= 4 && !strncmp(p, "  - ", 4)) { p += 4; n -= 4; }
        if (n) fprintf(f, "%s%.*s\n", prefix, (int)n, p);
        p = e ? e + 1 : p + strlen(p);
    }
}

/* ------------------------------------------------------------ the report */

typedef struct report {
    const char *path;         /* MODEL_DIR or config FILE */
    const char *cfg_path;
    int is_dir;               /* MODEL_DIR given (else --config) */
    int have_cfg, have_ckpt, have_layout, have_scan, have_fscan;
    cfg *c;
    cfg_census *s;
    st_index *ix;
    model_layout *lay;
    model_scan scan;
    model_fscan fscan;
    sbuf problems, warnings;
    int n_problems;
} report;

/* Layer classes for the per-layer summary: attention kind x FFN kind. */
static const char *layer_class_name(int k) {
    static const char *const n[4] = {"KDA + dense", "KDA + MoE", "MLA + dense", "MLA + MoE"};
    return n[k];
}
/* The stored formats the byte counts are of (c->wf: quantization_config, or the
 * headers for a directory): the routed experts' and the trunk's. */
static const char *exp_fmt(const cfg *c) {
    switch (c->wf & SW_EXP_MASK) {
    case SW_EXP_PLAIN: return "BF16";
    case SW_EXP_FP8: return "FP8 e4m3 + 128x128 f32 scales";
    case SW_EXP_INT4: return "INT4 pack-quantized + bf16 group-32 scales";
    default: return c->moe_plain ? "BF16" : "MXFP4";
    }
}
static const char *trunk_fmt(const cfg *c) { return c->wf & SW_TRUNK_FP8 ? "FP8 matrices, bf16 rest" : "bf16"; }

static int layer_class(const cfg *c, int64_t L) { return (c->is_mla[L] ? 2 : 0) + (cfg_is_moe(c, L) ? 1 : 0); }

/* The config summary and the layer map. */
static void print_config(const report *r, FILE *out) {
    const cfg *c = r->c;
    const cfg_census *s = r->s;
    char a[64];
    fprintf(out, "config: %s\n", r->cfg_path);
    fprintf(out, "  hidden %lld, %lld layers, vocab %s, rms_eps %g\n", (long long)c->hidden, (long long)c->n_layers,
           commas((uint64_t)c->vocab, a, sizeof a), c->rms_eps);
    if (c->arch == ARCH_KIMI_LINEAR) /* K3's lines stay as they were */
        fprintf(out, "  architecture kimi_linear: plain pre-norm residual, KDA softplus gate and low-rank output gate, "
                     "MLA without q-LoRA, SiLU experts on the hidden dim (BF16), kv_a_layernorm eps %g, router %s\n",
               c->kv_norm_eps, c->router_hf ? "hf (biased weights)" : "unbiased");
    if (c->no_kda) { /* DeepSeek-V3 and K2: no KDA line */
        fprintf(out, "  architecture %s: every layer MLA with q-LoRA, RoPE theta %g on the %lld-wide slot (interleaved "
                     "pairs, YaRN factor %g, original context %lld, beta %g/%g, mscale %g/%g; softmax scale %.7g), "
                     "plain pre-norm residual, SwiGLU experts on the hidden dim, router groups %lld keep %lld, "
                     "q_a/kv_a_layernorm eps %g\n",
               arch_of(c)->name, c->rope_theta, (long long)c->qk_rope, c->yarn_factor, (long long)c->yarn_orig_ctx,
               c->yarn_beta_fast, c->yarn_beta_slow, c->yarn_mscale, c->yarn_mscale_all_dim, arch_mla_scale(c),
               (long long)c->n_group, (long long)c->topk_group, c->kv_norm_eps);
        if (c->n_mtp)
            fprintf(out, "  MTP: %lld layer(s) after the last (%slayers.%lld.*): skipped, never read (but by --draft mtp)\n", (long long)c->n_mtp,
                   arch_of(c)->pfx, (long long)c->n_layers);
    } else if (c->kda_softplus)
        fprintf(out, "  KDA: %lld heads x %lld, short conv %lld, gate -exp(A_log) softplus (no lower bound)\n",
               (long long)c->kda_heads, (long long)c->kda_head_dim, (long long)c->conv_k);
    else
        fprintf(out, "  KDA: %lld heads x %lld, short conv %lld, gate lower bound %g\n", (long long)c->kda_heads,
               (long long)c->kda_head_dim, (long long)c->conv_k, c->gate_lb);
    fprintf(out, "  MLA: %lld heads, q_lora %lld, kv_lora %lld, qk_nope %lld, qk_rope %lld, v_head %lld, output gate %s\n",
           (long long)c->n_heads, (long long)c->q_lora, (long long)c->kv_lora, (long long)c->qk_nope,
           (long long)c->qk_rope, (long long)c->v_head, c->mla_out_gate ? "on" : "off");
    fprintf(out, "  MoE: %lld experts, top-%lld, %lld shared, latent %lld, expert intermediate %lld, routed scale %g, "
           "renormalize %s, latent norm %s\n",
           (long long)c->n_experts, (long long)c->topk, (long long)c->n_shared, (long long)c->latent,
           (long long)c->moe_inter, c->routed_scale, c->moe_renorm ? "on" : "off", c->latent_norm ? "on" : "off");
    fprintf(out, "  dense: first %lld layer(s), intermediate %s; AttnRes block %lld; SiTU betas %g / %g\n",
           (long long)c->first_dense, commas((uint64_t)c->dense_inter, a, sizeof a), (long long)c->attn_res_block, c->situ_b1, c->situ_b2);
    fprintf(out, "  ids: bos %lld, eos", (long long)c->bos_id);
    if (!c->n_eos) fprintf(out, " none");
    for (int64_t i = 0; i < c->n_eos; i++) fprintf(out, "%s%lld", i ? "," : " ", (long long)c->eos_ids[i]);
    fprintf(out, ", pad %lld; max context %s; experts %s\n", (long long)c->pad_id, commas((uint64_t)c->max_ctx, a, sizeof a),
           c->mxfp4_experts ? "mxfp4 (quantization_config)"
           : (c->wf & SW_EXP_MASK) == SW_EXP_FP8 ? "fp8 (quantization_config)"
           : (c->wf & SW_EXP_MASK) == SW_EXP_INT4 ? "int4 pack-quantized (quantization_config)"
                                                  : "format not declared");

    fprintf(out, "layer map: %lld layers = %lld KDA + %lld MLA; %lld dense + %lld MoE\n", (long long)c->n_layers,
           (long long)s->n_kda, (long long)s->n_mla, (long long)s->n_dense, (long long)s->n_moe);
    fprintf(out, "  MLA layers (0-based):");
    for (int64_t L = 0; L < c->n_layers; L++) if (c->is_mla[L]) fprintf(out, " %lld", (long long)L);
    fprintf(out, "\n");
}

/* Parameters and bytes by class, caches and states per position. */
static void print_sizes(const report *r, FILE *out) {
    const cfg *c = r->c;
    const cfg_census *s = r->s;
    char a[64], b[64], d[64], e[64];
    fprintf(out, "parameters: %s parameters (%s)\n", params_h(s->params_total, a, sizeof a), commas(s->params_total, b, sizeof b));
    fprintf(out, "  active per token: %s (%s; trunk + embeddings + %lld x %lld routed experts)\n",
           params_h(s->params_active, a, sizeof a), commas(s->params_active, b, sizeof b), (long long)c->topk,
           (long long)s->n_moe);
    fprintf(out, "  trunk %s (%s), embeddings + head %s (%s)\n", params_h(s->params_trunk, a, sizeof a),
           commas(s->params_trunk, b, sizeof b), params_h(s->params_embed, d, sizeof d),
           commas(s->params_embed, e, sizeof e));
    fprintf(out, "  routed experts %s (%s)\n", params_h(s->params_experts, a, sizeof a), commas(s->params_experts, b, sizeof b));
    fprintf(out, "bytes:\n");
    if (s->n_expert_total) {
        char f[64];
        fprintf(out, "  experts: %s experts x %s bytes = %s (%s bytes, %s)\n", commas(s->n_expert_total, a, sizeof a),
               commas(s->expert_bytes, b, sizeof b), bytes3(s->experts_bytes, d, sizeof d),
               commas(s->experts_bytes, f, sizeof f), exp_fmt(c));
        /* Release notes multiply the per-expert size rounded to 0.01 MB (K3: 17.55 MB x
         * 82,432 = 1.447 TB against the exact 1.446 TB); show that figure too when the
         * rounding moves the third decimal, so both quotes can be found here. */
        double mb = floor((double)s->expert_bytes / 1e4 + 0.5) / 100.0;
        double tb_rounded = mb * (double)s->n_expert_total / 1e6;
        if (s->experts_bytes >= 1000000000000ull &&
            floor(tb_rounded * 1000 + 0.5) != floor((double)s->experts_bytes / 1e9 + 0.5))
            fprintf(out, "  (= %.3f TB at the rounded %.2f MB per expert, as release notes quote it)\n", tb_rounded, mb);
        uint64_t pe = s->params_experts / s->n_expert_total;
        fprintf(out, "  one expert: %s bytes (%s), %s parameters (%s)\n", commas(s->expert_bytes, a, sizeof a),
               base_fmt_bytes(s->expert_bytes, b, sizeof b), params_h(pe, d, sizeof d), commas(pe, f, sizeof f));
    } else {
        fprintf(out, "  experts: none (no MoE layer)\n");
    }
    fprintf(out, "  trunk + embeddings (%s): %s (trunk %s, embeddings %s)\n", trunk_fmt(c),
           base_fmt_bytes(s->trunk_bytes_bf16 + s->embed_bytes_bf16, a, sizeof a),
           base_fmt_bytes(s->trunk_bytes_bf16, b, sizeof b), base_fmt_bytes(s->embed_bytes_bf16, d, sizeof d));
    /* Per-layer trunk: one line per layer class, with the layers' size range. */
    for (int k = 0; k < 4; k++) {
        int64_t n = 0, first = -1;
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int64_t L = 0; L < c->n_layers; L++) {
            if (layer_class(c, L) != k) continue;
            if (first < 0) first = L;
            n++;
            uint64_t v = s->layer_bytes_bf16[L];
            if (v < lo) lo = v;
            if (v > hi) hi = v;
        }
        if (!n) continue;
        if (lo == hi)
            fprintf(out, "  trunk per layer (%s), %s: %lld layer%s x %s (first: layer %lld)\n", trunk_fmt(c), layer_class_name(k),
                   (long long)n, n > 1 ? "s" : "", bytes3(lo, a, sizeof a), (long long)first);
        else
            fprintf(out, "  trunk per layer (%s), %s: %lld layers, %s .. %s\n", trunk_fmt(c), layer_class_name(k), (long long)n,
                   bytes3(lo, a, sizeof a), bytes3(hi, b, sizeof b));
    }
    uint64_t big = 0;
    int64_t bigL = 0;
    for (int64_t L = 0; L < c->n_layers; L++) if (s->layer_bytes_bf16[L] > big) { big = s->layer_bytes_bf16[L]; bigL = L; }
    fprintf(out, "  largest layer: layer %lld = %s (%s)\n", (long long)bigL, bytes3(big, a, sizeof a), trunk_fmt(c));
    fprintf(out, "  MLA cache per position: %lld x (%lld + %lld) = %s elements (%s bf16)\n", (long long)s->n_mla,
           (long long)c->kv_lora, (long long)c->qk_rope, commas(s->mla_cache_elems_per_pos, a, sizeof a),
           base_fmt_bytes(s->mla_cache_elems_per_pos * 2, b, sizeof b));
    fprintf(out, "  KDA state: %lld x (%lld x %lld x %lld + 3 x %lld x %lld) = %s elements (%s fp32)\n", (long long)s->n_kda,
           (long long)c->kda_heads, (long long)c->kda_head_dim, (long long)c->kda_head_dim,
           (long long)(c->kda_heads * c->kda_head_dim), (long long)(c->conv_k - 1),
           commas(s->kda_state_elems, d, sizeof d), base_fmt_bytes(s->kda_state_elems * 4, e, sizeof e));
}

/* The checkpoint: shards, layout facts, scans, warnings and problems. */
static void print_checkpoint(const report *r, FILE *out) {
    const cfg *c = r->c;
    const cfg_census *s = r->s;
    char a[64], b[64], d[64], e[64];
    if (r->have_ckpt) {
        uint64_t tot = 0;
        for (int i = 0; i < st_n_shards(r->ix); i++) tot += st_shard_size(r->ix, i);
        fprintf(out, "checkpoint: %s\n  %d shard%s, %s tensors, %s (%s bytes)\n", r->path, st_n_shards(r->ix),
               st_n_shards(r->ix) == 1 ? "" : "s", commas(st_count(r->ix), a, sizeof a), base_fmt_bytes(tot, b, sizeof b),
               commas(tot, d, sizeof d));
    }
    if (r->have_layout) {
        const model_layout *l = r->lay;
        const int ef = l->wf & SW_EXP_MASK;
        fprintf(out, "  experts stored as %s\n",
                ef == SW_EXP_PLAIN ? "plain weights" : ef == SW_EXP_FP8 ? "FP8 e4m3 (weight + weight_scale_inv, 128x128 blocks)"
                : ef == SW_EXP_INT4 ? "INT4 pack-quantized (weight_packed + weight_scale + weight_shape, group 32)"
                : "MXFP4 (weight_packed + weight_scale)");
        if (l->wf & SW_TRUNK_FP8)
            fprintf(out, "  trunk matrices stored as FP8 e4m3 (weight + weight_scale_inv), router gate and vectors plain\n");
        if (s->n_expert_total) {
            fprintf(out, "  experts contiguous: %s (%lld of %s not one gap-free run in one shard)\n",
                   l->experts_contiguous ? "yes" : "no", (long long)l->n_expert_noncontig,
                   commas(s->n_expert_total, a, sizeof a));
            if (l->n_expert_parts) {
                fprintf(out, "  expert tensor order on disk:");
                static const char *const k_sfx[] = {[TK_FP8_SCALE] = "_scale_inv", [TK_I4_PACKED] = "_packed",
                                                     [TK_I4_SCALE] = "_scale", [TK_I4_SHAPE] = "_shape"};
                for (int i = 0; i < l->n_expert_parts; i++) {
                    const int k = l->expert_kinds[i];
                    fprintf(out, " %s%s", schema_role_name(l->expert_roles[i]) + 7,
                            k >= TK_FP8_SCALE && k <= TK_I4_SHAPE ? k_sfx[k] : "");
                }
                fprintf(out, "%s\n", l->expert_order_uniform ? " (all experts)" : " (expert 0; others differ)");
            }
        }
        fprintf(out, "  layer trunks contiguous: %s (%lld of %lld not one gap-free run in one shard)\n",
               l->layers_contiguous ? "yes" : "no", (long long)l->n_layer_noncontig, (long long)c->n_layers);
        char f[64];
        fprintf(out, "  as stored: trunk %s, experts %s, one expert %s bytes, embeddings %s, head %s\n",
               base_fmt_bytes(l->trunk_bytes, a, sizeof a), bytes3(l->experts_bytes, b, sizeof b),
               commas(l->expert_bytes, d, sizeof d), base_fmt_bytes(l->embed_bytes, e, sizeof e),
               base_fmt_bytes(l->head_bytes, f, sizeof f));
        uint64_t big2 = 0;
        for (int64_t L = 0; L < c->n_layers; L++) if (l->layer_bytes[L] > big2) big2 = l->layer_bytes[L];
        fprintf(out, "  largest layer trunk as stored: %s\n", bytes3(big2, a, sizeof a));
        if (r->warnings.n) {
            fprintf(out, "  warnings:");
            if (l->n_unused)
                fprintf(out, " %lld checkpoint tensors not used by the model (%s)", (long long)l->n_unused,
                       base_fmt_bytes(l->unused_bytes, a, sizeof a));
            fprintf(out, "\n");
            print_lines(out, "    ", r->warnings.s);
        }
    }
    if (r->have_fscan)
        fprintf(out, "  float scan: %s tensors, %s read, %lld with non-finite values (%lld values)\n",
               commas((uint64_t)r->fscan.n_tensors, a, sizeof a), base_fmt_bytes(r->fscan.bytes, b, sizeof b),
               (long long)r->fscan.n_bad_tensors, (long long)r->fscan.n_nonfinite);
    if (r->have_scan)
        fprintf(out, "  scale scan: %s experts, %s scale bytes read, %lld experts with scale 255 (%lld bytes)\n",
               commas((uint64_t)r->scan.n_experts, a, sizeof a), base_fmt_bytes(r->scan.scale_bytes, b, sizeof b),
               (long long)r->scan.n_bad_experts, (long long)r->scan.n_bad_groups);
    if (!r->n_problems) fprintf(out, "problems: none\n");
    else {
        fprintf(out, "problems: %d\n", r->n_problems);
        print_lines(out, "  - ", r->problems.s);
    }
}

static void print_human(const report *r, FILE *out) {
    print_config(r, out);
    print_sizes(r, out);
    print_checkpoint(r, out);
}

static void json_u64_array(sbuf *b, const uint64_t *v, int64_t n) {
    sbuf_printf(b, "[");
    for (int64_t i = 0; i < n; i++) sbuf_printf(b, "%s%llu", i ? ", " : "", (unsigned long long)v[i]);
    sbuf_printf(b, "]");
}

/* One JSON object on out; the same facts as the human report. */
static void print_json(const report *r, FILE *out) {
    sbuf b = {0};
    sbuf_printf(&b, "{\n  \"ok\": %s,\n  \"kind\": \"%s\",\n  \"path\": ", r->n_problems ? "false" : "true",
                r->is_dir ? "model_dir" : "config");
    json_str(&b, r->path);
    if (r->cfg_path) { sbuf_printf(&b, ",\n  \"config_path\": "); json_str(&b, r->cfg_path); }
    if (r->have_cfg) {
        const cfg *c = r->c;
        const cfg_census *s = r->s;
        sbuf_printf(&b, ",\n  \"config\": {\"hidden\": %lld, \"n_layers\": %lld, \"vocab\": %lld, \"rms_eps\": %.17g, "
                        "\"kda_heads\": %lld, \"kda_head_dim\": %lld, \"conv_k\": %lld, \"gate_lb\": %.17g, "
                        "\"n_heads\": %lld, \"q_lora\": %lld, \"kv_lora\": %lld, \"qk_nope\": %lld, \"qk_rope\": %lld, "
                        "\"v_head\": %lld, \"mla_out_gate\": %s, \"n_experts\": %lld, \"topk\": %lld, \"n_shared\": %lld, "
                        "\"latent\": %lld, \"moe_inter\": %lld, \"routed_scale\": %.17g, \"moe_renorm\": %s, "
                        "\"latent_norm\": %s, \"first_dense\": %lld, \"dense_inter\": %lld, \"attn_res_block\": %lld, "
                        "\"situ_b1\": %.17g, \"situ_b2\": %.17g, \"bos_id\": %lld, \"pad_id\": %lld, \"eos_ids\": [",
                    (long long)c->hidden, (long long)c->n_layers, (long long)c->vocab, c->rms_eps, (long long)c->kda_heads,
                    (long long)c->kda_head_dim, (long long)c->conv_k, c->gate_lb, (long long)c->n_heads,
                    (long long)c->q_lora, (long long)c->kv_lora, (long long)c->qk_nope, (long long)c->qk_rope,
                    (long long)c->v_head, c->mla_out_gate ? "true" : "false", (long long)c->n_experts,
                    (long long)c->topk, (long long)c->n_shared, (long long)c->latent, (long long)c->moe_inter,
                    c->routed_scale, c->moe_renorm ? "true" : "false", c->latent_norm ? "true" : "false",
                    (long long)c->first_dense, (long long)c->dense_inter, (long long)c->attn_res_block, c->situ_b1,
                    c->situ_b2, (long long)c->bos_id, (long long)c->pad_id);
        for (int64_t i = 0; i < c->n_eos; i++) sbuf_printf(&b, "%s%lld", i ? ", " : "", (long long)c->eos_ids[i]);
        sbuf_printf(&b, "], \"max_ctx\": %lld, \"mxfp4_experts\": %s}", (long long)c->max_ctx,
                    c->mxfp4_experts ? "true" : "false");
        sbuf_printf(&b, ",\n  \"layers\": {\"n_kda\": %lld, \"n_mla\": %lld, \"n_dense\": %lld, \"n_moe\": %lld, \"mla\": [",
                    (long long)s->n_kda, (long long)s->n_mla, (long long)s->n_dense, (long long)s->n_moe);
        int first = 1;
        for (int64_t L = 0; L < c->n_layers; L++)
            if (c->is_mla[L]) { sbuf_printf(&b, "%s%lld", first ? "" : ", ", (long long)L); first = 0; }
        sbuf_printf(&b, "]}");
        sbuf_printf(&b, ",\n  \"census\": {\"params_total\": %llu, \"params_active\": %llu, \"params_trunk\": %llu, "
                        "\"params_embed\": %llu, \"params_experts\": %llu, \"n_expert_total\": %llu, \"expert_bytes\": %llu, "
                        "\"experts_bytes\": %llu, \"trunk_bytes_bf16\": %llu, \"embed_bytes_bf16\": %llu, "
                        "\"mla_cache_elems_per_pos\": %llu, \"kda_state_elems\": %llu, \"layer_bytes_bf16\": ",
                    (unsigned long long)s->params_total, (unsigned long long)s->params_active,
                    (unsigned long long)s->params_trunk, (unsigned long long)s->params_embed,
                    (unsigned long long)s->params_experts, (unsigned long long)s->n_expert_total,
                    (unsigned long long)s->expert_bytes, (unsigned long long)s->experts_bytes,
                    (unsigned long long)s->trunk_bytes_bf16, (unsigned long long)s->embed_bytes_bf16,
                    (unsigned long long)s->mla_cache_elems_per_pos, (unsigned long long)s->kda_state_elems);
        json_u64_array(&b, s->layer_bytes_bf16, c->n_layers);
        sbuf_printf(&b, "}");
    }
    if (r->have_ckpt) {
        uint64_t tot = 0;
        for (int i = 0; i < st_n_shards(r->ix); i++) tot += st_shard_size(r->ix, i);
        sbuf_printf(&b, ",\n  \"checkpoint\": {\"n_shards\": %d, \"n_tensors\": %zu, \"bytes\": %llu}",
                    st_n_shards(r->ix), st_count(r->ix), (unsigned long long)tot);
    }
    if (r->have_layout) {
        const model_layout *l = r->lay;
        sbuf_printf(&b, ",\n  \"layout\": {\"experts_bf16\": %s, \"experts_contiguous\": %s, \"layers_contiguous\": %s, "
                        "\"n_expert_noncontig\": %lld, \"n_layer_noncontig\": %lld, \"expert_bytes\": %llu, "
                        "\"experts_bytes\": %llu, \"trunk_bytes\": %llu, \"embed_bytes\": %llu, \"head_bytes\": %llu, "
                        "\"expert_order_uniform\": %s, \"expert_order\": [",
                    l->experts_bf16 ? "true" : "false", l->experts_contiguous ? "true" : "false",
                    l->layers_contiguous ? "true" : "false", (long long)l->n_expert_noncontig,
                    (long long)l->n_layer_noncontig, (unsigned long long)l->expert_bytes,
                    (unsigned long long)l->experts_bytes, (unsigned long long)l->trunk_bytes,
                    (unsigned long long)l->embed_bytes, (unsigned long long)l->head_bytes,
                    l->expert_order_uniform ? "true" : "false");
        for (int i = 0; i < l->n_expert_parts; i++) {
            if (i) sbuf_printf(&b, ", ");
            json_str(&b, schema_role_name(l->expert_order[i]));
        }
        sbuf_printf(&b, "], \"n_unused\": %lld, \"unused_bytes\": %llu, \"layer_bytes\": ", (long long)l->n_unused,
                    (unsigned long long)l->unused_bytes);
        json_u64_array(&b, l->layer_bytes, r->c->n_layers);
        sbuf_printf(&b, "}");
    }
    if (r->have_scan)
        sbuf_printf(&b, ",\n  \"scan\": {\"n_experts\": %lld, \"n_bad_experts\": %lld, \"n_bad_bytes\": %lld, "
                        "\"scale_bytes\": %llu}",
                    (long long)r->scan.n_experts, (long long)r->scan.n_bad_experts, (long long)r->scan.n_bad_groups,
                    (unsigned long long)r->scan.scale_bytes);
    if (r->have_fscan)
        sbuf_printf(&b, ",\n  \"float_scan\": {\"n_tensors\": %lld, \"n_bad_tensors\": %lld, \"n_nonfinite\": %lld, \"bytes\": %llu}",
                    (long long)r->fscan.n_tensors, (long long)r->fscan.n_bad_tensors, (long long)r->fscan.n_nonfinite,
                    (unsigned long long)r->fscan.bytes);
    sbuf_printf(&b, ",\n  \"problems\": ");
    json_lines(&b, r->problems.s);
    sbuf_printf(&b, ",\n  \"warnings\": ");
    json_lines(&b, r->warnings.s);
    sbuf_printf(&b, "\n}\n");
    fputs(b.s, out);
    sbuf_free(&b);
}

typedef struct scan_ctx {
    const strata_inspect_opts *o;
    const char *what;
} scan_ctx;

static void scan_progress(void *ud, int64_t done, int64_t total) {
    const scan_ctx *s = ud;
    s->o->progress(s->o->progress_ud, s->what, done, total);
}

/* The problems text as the caller gets it: one problem per line, without the
 * "  - " list marks, no empty lines. */
static char *problem_lines(const char *text) {
    sbuf b = {0};
    const char *p = text ? text : "";
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n >= 4 && !strncmp(p, "  - ", 4)) { p += 4; n -= 4; }
        if (n) sbuf_printf(&b, "%.*s\n", (int)n, p);
        p = e ? e + 1 : p + strlen(p);
    }
    char *s = base_strdup(b.s ? b.s : "", MEM_MISC);
    sbuf_free(&b);
    return s;
}

int strata_inspect(const strata_inspect_opts *o, FILE *out, strata_inspect_result *res, char *errbuf,
                   size_t errlen) {
    memset(res, 0, sizeof *res);
    if (!o->model_dir == !o->config || (o->scan && !o->model_dir))
        return base_fail(errbuf, errlen, STRATA_EINVAL, "give a model directory or a config file (--scan: a directory)");
    int rc = STRATA_OK;
    report r;
    memset(&r, 0, sizeof r);
    char cfgpath[4096];
    char *err = base_alloc(ERRLEN, MEM_MISC);
    r.c = base_alloc(sizeof *r.c, MEM_MISC);
    r.s = base_alloc(sizeof *r.s, MEM_MISC);
    r.lay = base_alloc(sizeof *r.lay, MEM_MISC);
    if (!err || !r.c || !r.s || !r.lay) {
        rc = base_fail(errbuf, errlen, STRATA_ENOMEM, "out of memory");
        goto done;
    }
    err[0] = 0;
    if (o->model_dir) {
        r.path = o->model_dir;
        r.is_dir = 1;
        if (!base_is_dir(o->model_dir)) {
            sbuf_line(&r.problems, "%s: not a directory", o->model_dir);
            goto report;
        }
        snprintf(cfgpath, sizeof cfgpath, "%s/config.json", o->model_dir);
    } else {
        r.path = o->config;
        snprintf(cfgpath, sizeof cfgpath, "%s", o->config);
    }
    r.cfg_path = cfgpath;
    /* No fallback to built-in K3 values: a model without its config is broken. */
    if (cfg_load(r.c, cfgpath, err, ERRLEN)) {
        const char *p = err;
        while (*p) { /* one problem per line */
            const char *e = strchr(p, '\n');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            sbuf_line(&r.problems, "%.*s", (int)n, p);
            p = e ? e + 1 : p + n;
        }
        goto report;
    }
    r.have_cfg = 1;
    schema_census(r.c, r.s);
    if (o->model_dir) {
        if (st_open(&r.ix, o->model_dir, err, ERRLEN)) {
            sbuf_line(&r.problems, "%s", err);
            goto report;
        }
        r.have_ckpt = 1;
        model_bind_check_ex(r.c, r.ix, r.lay, &r.problems, &r.warnings);
        r.have_layout = 1;
        if (r.lay->wf != r.c->wf) { /* the headers decide: bytes as stored (FP8, INT4) */
            r.c->wf = r.lay->wf;
            schema_census(r.c, r.s);
        }
        if (o->scan) {
            scan_ctx fs = {o, "float tensors"}, ss = {o, "expert scales"};
            if (model_scan_floats(r.ix, &r.fscan, &r.problems, o->progress ? scan_progress : NULL, &fs, err, ERRLEN))
                sbuf_line(&r.problems, "float scan: %s", err);
            else
                r.have_fscan = 1;
            if ((r.lay->wf & SW_EXP_MASK) != SW_EXP_MXFP4 || r.s->n_expert_total == 0) {
                sbuf_line(&r.warnings, "--scan: no MXFP4 experts to scan");
            } else if (model_scan_scales(r.c, r.ix, &r.scan, &r.problems, o->progress ? scan_progress : NULL, &ss,
                                         err, ERRLEN)) {
                sbuf_line(&r.problems, "scale scan: %s", err);
            } else {
                r.have_scan = 1;
            }
        }
    }
report:
    r.n_problems = r.problems.n;
    if (o->json) print_json(&r, out);
    else if (r.have_cfg) print_human(&r, out);
    res->n_problems = r.n_problems;
    res->listed = !o->json && r.have_cfg;
    if (!(res->problems = problem_lines(r.problems.s))) rc = base_fail(errbuf, errlen, STRATA_ENOMEM, "out of memory");
done:
    st_close(r.ix);
    sbuf_free(&r.problems);
    sbuf_free(&r.warnings);
    base_free(r.lay);
    base_free(r.s);
    base_free(r.c);
    base_free(err);
    return rc;
}
