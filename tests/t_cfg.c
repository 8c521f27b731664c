/*
 * t_cfg.c: config reader (both shapes, shadowing, strict types, every problem
 * reported), validation, the K3 preset, the nested writer round trip, census.
 */
#include <string.h>
#include "cfg.h"
#include "schema.h"
#include "test.h"

/* Field-by-field equality (struct padding makes memcmp unreliable). */
static int cfg_same(const cfg *a, const cfg *b) {
#define SAME(f) if (a->f != b->f) { fprintf(stderr, "  cfg field %s differs\n", #f); return 0; }
    SAME(hidden) SAME(n_layers) SAME(vocab) SAME(rms_eps) SAME(kda_heads) SAME(kda_head_dim)
    SAME(conv_k) SAME(gate_lb) SAME(n_heads) SAME(q_lora) SAME(kv_lora) SAME(qk_nope) SAME(qk_rope)
    SAME(v_head) SAME(mla_out_gate) SAME(n_experts) SAME(topk) SAME(n_shared) SAME(latent)
    SAME(moe_inter) SAME(routed_scale) SAME(moe_renorm) SAME(latent_norm) SAME(first_dense)
    SAME(dense_inter) SAME(attn_res_block) SAME(situ_b1) SAME(situ_b2) SAME(n_mla) SAME(bos_id)
    SAME(pad_id) SAME(n_eos) SAME(max_ctx) SAME(mxfp4_experts)
#undef SAME
    for (int64_t i = 0; i < a->n_eos; i++) if (a->eos_ids[i] != b->eos_ids[i]) return 0;
    if (memcmp(a->is_mla, b->is_mla, sizeof a->is_mla)) { fprintf(stderr, "  is_mla differs\n"); return 0; }
    return 1;
}

/* A small model with odd widths (hidden 200, 3 KDA heads of 20). */
static void small_cfg(cfg *c) {
    cfg_k3(c);
    memset(c->is_mla, 0, sizeof c->is_mla);
    c->hidden = 200; c->n_layers = 4; c->vocab = 512; c->rms_eps = 1e-6;
    c->kda_heads = 3; c->kda_head_dim = 20;
    c->n_heads = 2; c->q_lora = 48; c->kv_lora = 32; c->qk_nope = 16; c->qk_rope = 8; c->v_head = 16;
    c->n_experts = 8; c->topk = 2; c->n_shared = 1; c->latent = 96; c->moe_inter = 64;
    c->routed_scale = 1.5; c->moe_renorm = 0; c->dense_inter = 300; c->attn_res_block = 2;
    c->is_mla[1] = c->is_mla[3] = 1; c->n_mla = 2;
    c->bos_id = 0; c->pad_id = -1; c->n_eos = 2; c->eos_ids[0] = 1; c->eos_ids[1] = 2;
    c->max_ctx = 4096; c->mxfp4_experts = 0;
}

static int parse_str(cfg *c, const char *s, const char *what, char *err, size_t n) {
    return cfg_parse(c, (const uint8_t *)s, strlen(s), what, err, n);
}

/* Copy of s with the first occurrence of from replaced by to (MEM_MISC). */
static char *subst(const char *s, const char *from, const char *to) {
    const char *p = strstr(s, from);
    if (!p) { fprintf(stderr, "  subst: '%s' not found\n", from); return base_strdup(s, MEM_MISC); }
    size_t n = strlen(s) - strlen(from) + strlen(to);
    char *o = base_alloc(n + 1, MEM_MISC);
    size_t a = (size_t)(p - s);
    memcpy(o, s, a);
    memcpy(o + a, to, strlen(to));
    strcpy(o + a + strlen(to), p + strlen(from));
    return o;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n + (s[-1] != '\n');
}

/* Parses the small config with one substitution; returns rc and fills err. */
static int parse_mut(const char *from, const char *to, char *err, size_t n) {
    cfg c;
    small_cfg(&c);
    char *js = cfg_to_json(&c);
    char *m = subst(js, from, to);
    int rc = parse_str(&c, m, "mut.json", err, n);
    base_free(m);
    base_free(js);
    return rc;
}

TEST(cfg_k3_roundtrip) {
    cfg a, b;
    char err[4096];
    cfg_k3(&a);
    CHECK(cfg_validate(&a, "k3", err, sizeof err) == 0);
    CHECK(a.n_mla == 24 && a.is_mla[3] && a.is_mla[91] && a.is_mla[92] && !a.is_mla[0] && !a.is_mla[90]);
    char *js = cfg_to_json(&a);
    CHECK(js != NULL);
    int rc = parse_str(&b, js, "k3-written.json", err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(cfg_same(&a, &b));
    CHECK(strstr(js, "\"kda_layers\"") && strstr(js, "\"quantization_config\"") && strstr(js, "1e-05"));
    base_free(js);
    /* Small odd model round-trips too, with a list of eos ids and a context. */
    small_cfg(&a);
    CHECK_MSG(cfg_validate(&a, "small", err, sizeof err) == 0, "%s", err);
    js = cfg_to_json(&a);
    rc = parse_str(&b, js, "small.json", err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(cfg_same(&a, &b));
    base_free(js);
}

TEST(cfg_shapes_and_shadowing) {
    cfg f, n, s;
    char err[4096];
    small_cfg(&s);
    /* flat: kda_num_heads/kda_head_dim beat generic num_heads/head_dim (999). */
    int rc = cfg_load(&f, "tests/data/configs/flat-small.json", err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    /* nested: text_config has head_dim 64 / num_heads 7, linear_attn_config wins. */
    rc = cfg_load(&n, "tests/data/configs/nested-small.json", err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(f.kda_heads == 3 && f.kda_head_dim == 20);
    CHECK(n.kda_heads == 3 && n.kda_head_dim == 20);
    CHECK(cfg_same(&f, &n));
    CHECK(cfg_same(&f, &s));
    CHECK(f.moe_renorm == 0 && f.latent_norm == 1 && f.mla_out_gate == 1);
    /* Generic head_dim in text_config, different from linear_attn_config's. */
    cfg k;
    cfg_k3(&k);
    char *js = cfg_to_json(&k);
    char *m = subst(js, "\"vocab_size\": 163840,", "\"vocab_size\": 163840, \"head_dim\": 64, \"num_heads\": 8,");
    rc = parse_str(&n, m, "shadow.json", err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(n.kda_head_dim == 128 && n.kda_heads == 96);
    base_free(m);
    base_free(js);
}

TEST(cfg_missing_keys_all_reported) {
    cfg c;
    char err[8192];
    small_cfg(&c);
    char *js = cfg_to_json(&c);
    char *a = subst(js, "\"hidden_size\"", "\"hidden_sizeX\"");
    char *b = subst(a, "\"q_lora_rank\"", "\"q_lora_rankX\"");
    char *d = subst(b, "\"head_dim\"", "\"head_dimX\"");
    char *e = subst(d, "\"activation_situ_linear_beta\"", "\"situ_linear_betaX\"");
    int rc = parse_str(&c, e, "cfgdir/config.json", err, sizeof err);
    CHECK(rc == STRATA_EFORMAT);
    CHECK(strstr(err, "cfgdir/config.json: missing required key 'text_config.hidden_size'") != NULL);
    CHECK(strstr(err, "'text_config.q_lora_rank'") != NULL);
    CHECK(strstr(err, "'text_config.linear_attn_config.head_dim'") != NULL);
    CHECK(strstr(err, "'text_config.activation_situ_linear_beta'") != NULL);
    CHECK_MSG(count_lines(err) == 4, "%s", err);
    base_free(a); base_free(b); base_free(d); base_free(e); base_free(js);
    /* Not even JSON, or an empty object: one line each key, still all of them. */
    rc = parse_str(&c, "{}", "empty.json", err, sizeof err);
    CHECK(rc == STRATA_EFORMAT && count_lines(err) == 26);
    /* Every line names the file. */
    for (const char *q = err; *q; ) {
        CHECK(!strncmp(q, "empty.json: missing required key '", strlen("empty.json: missing required key '")));
        const char *nl = strchr(q, '\n');
        q = nl ? nl + 1 : q + strlen(q);
    }
    rc = parse_str(&c, "{\"a\":1,}", "bad.json", err, sizeof err);
    CHECK(rc == STRATA_EFORMAT && strstr(err, "bad.json") && strstr(err, "line 1"));
    rc = parse_str(&c, "[1]", "arr.json", err, sizeof err);
    CHECK(rc == STRATA_EFORMAT && strstr(err, "top level must be an object"));
}

TEST(cfg_wrong_types) {
    char err[4096];
    CHECK(parse_mut("\"hidden_size\": 200", "\"hidden_size\": 200.5", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "mut.json: 'text_config.hidden_size' must be an integer, got 200.5"), "%s", err);
    CHECK(parse_mut("\"hidden_size\": 200", "\"hidden_size\": \"200\"", err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "must be an integer, got the string \"200\""));
    CHECK(parse_mut("\"num_experts\": 8", "\"num_experts\": true", err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "'text_config.num_experts' must be an integer, got true"));
    CHECK(parse_mut("\"hidden_size\": 200", "\"hidden_size\": 200.0", err, sizeof err) == STRATA_EFORMAT);
    /* issue 16: the value as written, not "got 200" */
    CHECK_MSG(strstr(err, "'text_config.hidden_size' must be an integer, got 200.0"), "%s", err);
    CHECK(parse_mut("\"hidden_size\": 200", "\"hidden_size\": 64e0", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "must be an integer, got 64.0"), "%s", err);
    CHECK(parse_mut("\"hidden_size\": 200", "\"hidden_size\": 1e300", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "must be an integer, got 1e+300"), "%s", err);
    CHECK(parse_mut("\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": \"1e-6\"", err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "must be a number"));
    CHECK(parse_mut("\"moe_renormalize\": false", "\"moe_renormalize\": 0", err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "must be true or false"));
    CHECK(parse_mut("\"eos_token_id\": [1, 2]", "\"eos_token_id\": [1, \"x\"]", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"eos_token_id\": [1, 2]", "\"eos_token_id\": [1,2,3,4,5,6,7,8,9]", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"eos_token_id\": [1, 2]", "\"eos_token_id\": 600", err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "eos_token_id"));
    CHECK(parse_mut("\"full_attn_layers\": [", "\"full_attn_layers\": [1.5, ", err, sizeof err) == STRATA_EFORMAT);
    /* Optional keys with null mean "not set". */
    CHECK(parse_mut("\"bos_token_id\": 0", "\"bos_token_id\": null", err, sizeof err) == 0);
    /* A single eos id is accepted as an integer. */
    CHECK(parse_mut("\"eos_token_id\": [1, 2]", "\"eos_token_id\": 3", err, sizeof err) == 0);
}

/* Regression (issue 16): a finite but absurd routed_scaling_factor (1e308 turns
 * every routed output into inf) was accepted; the refusal names the key. */
TEST(cfg_routed_scale_bounds) {
    char err[4096];
    CHECK(parse_mut("\"routed_scaling_factor\": 1.5", "\"routed_scaling_factor\": 1e308", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "'routed_scaling_factor' = 1e+308 is absurd"), "%s", err);
    CHECK(parse_mut("\"routed_scaling_factor\": 1.5", "\"routed_scaling_factor\": 2000000", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"routed_scaling_factor\": 1.5", "\"routed_scaling_factor\": -1", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "routed_scaling_factor"), "%s", err);
    CHECK(parse_mut("\"routed_scaling_factor\": 1.5", "\"routed_scaling_factor\": 1000000", err, sizeof err) == 0);
    CHECK(parse_mut("\"routed_scaling_factor\": 1.5", "\"routed_scaling_factor\": 2.827", err, sizeof err) == 0);
}

TEST(cfg_structural_refusals) {
    char err[4096];
    /* The one-based list: 0 and n+1 are both out of range. */
    CHECK(parse_mut("\"full_attn_layers\": [\n        2", "\"full_attn_layers\": [0, 5,\n        2", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "entry 0 is out of range 1..4 (the list is one-based)") &&
              strstr(err, "entry 5 is out of range 1..4"), "%s", err);
    CHECK(strstr(err, "mut.json: "));
    CHECK(parse_mut("\"full_attn_layers\": [\n        2", "\"full_attn_layers\": [2,\n        2", err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "twice"));
    /* Every layer full-attention: no KDA left (kda_layers dropped to isolate it). */
    CHECK(parse_mut("\"full_attn_layers\": [\n        2", "\"full_attn_layers\": [1, 3,\n        2", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "no KDA layer is left"), "%s", err);
    CHECK(parse_mut("\"full_attn_layers\": [\n        2,\n        4\n      ]", "\"full_attn_layers\": []", err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "empty"));
    /* kda_layers must be the complement. */
    CHECK(parse_mut("\"kda_layers\": [\n        1", "\"kda_layers\": [\n        2", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "disagree on layer 1") && strstr(err, "disagree on layer 2"), "%s", err);
    CHECK(parse_mut("\"num_experts_per_token\": 2", "\"num_experts_per_token\": 9", err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "'num_experts_per_token' = 9 must be in 1..8"));
    CHECK(parse_mut("\"num_experts_per_token\": 2", "\"num_experts_per_token\": 0", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"routed_expert_hidden_size\": 96", "\"routed_expert_hidden_size\": 100", err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "multiple of 32"));
    CHECK(parse_mut("\"moe_intermediate_size\": 64", "\"moe_intermediate_size\": 48", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"gate_lower_bound\": -5.0", "\"gate_lower_bound\": 0.5", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 0", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"activation_situ_beta\": 4.0", "\"activation_situ_beta\": -1", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 5", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 4", err, sizeof err) == 0);
    CHECK(parse_mut("\"attn_res_block_size\": 2", "\"attn_res_block_size\": 0", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"short_conv_kernel_size\": 4", "\"short_conv_kernel_size\": 0", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"num_shared_experts\": 1", "\"num_shared_experts\": -1", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"num_shared_experts\": 1", "\"num_shared_experts\": 0", err, sizeof err) == 0);
    CHECK(parse_mut("\"num_hidden_layers\": 4", "\"num_hidden_layers\": 0", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"num_hidden_layers\": 4", "\"num_hidden_layers\": 5000", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"hidden_size\": 200", "\"hidden_size\": 0", err, sizeof err) == STRATA_EFORMAT);
    CHECK(parse_mut("\"vocab_size\": 512", "\"vocab_size\": 2", err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "bos_token_id") == NULL && strstr(err, "eos_token_id"));
    /* Gigantic but individually legal widths: refused as a whole, no overflow. */
    cfg c;
    small_cfg(&c);
    c.n_experts = 16000000; c.moe_inter = 16777216;
    CHECK(cfg_validate(&c, "huge", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "parameters"), "%s", err);
    /* Several structural problems at once, each on its own line. */
    small_cfg(&c);
    c.topk = 99; c.latent = 33; c.gate_lb = 1;
    CHECK(cfg_validate(&c, "preset", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(count_lines(err) == 3, "%s", err);
    /* Odd widths are fine: hidden 200, 3 KDA heads of 20. */
    small_cfg(&c);
    CHECK(cfg_validate(&c, "small", err, sizeof err) == 0);
}

TEST(cfg_census_k3) {
    cfg c;
    cfg_census s;
    cfg_k3(&c);
    double t0 = base_now();
    schema_census(&c, &s);
    CHECK(base_now() - t0 < 1.0);
    CHECK(s.n_kda == 69 && s.n_mla == 24 && s.n_dense == 1 && s.n_moe == 92);
    CHECK(s.n_expert_total == 82432);
    CHECK(s.expert_bytes == 17547264);
    /* 1,446,456,066,048 B. docs/architecture.md's "1.447 TB" is 82,432 x the rounded 17.55 MB;
     * the exact product is 1.4465 TB. */
    CHECK(s.experts_bytes == UINT64_C(82432) * 17547264);
    CHECK_NEAR((double)s.experts_bytes / 1e12, 1.4465, 0.0001, 0);
    /* docs/architecture.md, Shape of the model: always-active 56,743,648,000 = 113.49 GB bf16. */
    CHECK(s.params_trunk + s.params_embed == UINT64_C(56743648000));
    CHECK_NEAR((double)(s.trunk_bytes_bf16 + s.embed_bytes_bf16) / 1e9, 113.49, 0.005, 0);
    /* All-bf16 trunk is 108.79 GB; docs/architecture.md's 108.81 GB is the packed trunk as
     * stored (F32 vectors and 4 KB-aligned runs), which bind measures. */
    CHECK_NEAR((double)s.trunk_bytes_bf16 / 1e9, 108.79, 0.005, 0);
    CHECK_NEAR((double)s.embed_bytes_bf16 / 1e9, 4.70, 0.005, 0);
    CHECK_NEAR((double)s.params_total / 1e12, 2.78, 0.005, 0);
    CHECK_NEAR((double)s.params_total / 1e9, 2779.5, 0.05, 0);
    CHECK(s.params_experts == UINT64_C(82432) * 33030144);
    CHECK_NEAR((double)s.layer_bytes_bf16[0] / 1e9, 2.341, 0.0005, 0);
    CHECK_NEAR((double)s.layer_bytes_bf16[1] / 1e9, 1.267, 0.0005, 0);  /* KDA + MoE */
    CHECK_NEAR((double)s.layer_bytes_bf16[3] / 1e9, 0.844, 0.0005, 0);  /* MLA + MoE */
    CHECK(s.params_active > UINT64_C(104000000000) && s.params_active < UINT64_C(105500000000));
    CHECK(s.mla_cache_elems_per_pos == 24 * (512 + 64));
    CHECK(s.kda_state_elems == UINT64_C(69) * (96 * 128 * 128 + 3 * 12288 * 3));
    /* Per-block counts (the public engine's census): MoE trunk 189,927,808 and the six
     * layer vectors 43,008 exactly; KDA attention is the public engine's 443,740,384 plus
     * 32 because A_log is stored with 128 entries (96 used); MLA is the table's
     * 232,195,584 plus the 512-entry kv_a_layernorm it left out. These reproduce
     * docs/architecture.md's always-active total 56,743,648,000 exactly (checked above). */
    uint64_t kda_attn = s.layer_bytes_bf16[1] / 2 - 189927808 - 43008;
    CHECK(kda_attn == 443740384 + 32);
    uint64_t mla_attn = s.layer_bytes_bf16[3] / 2 - 189927808 - 43008;
    CHECK(mla_attn == 232195584 + 512);
}

TEST(cfg_err_truncation) {
    cfg c;
    char small[200];
    /* 26 missing keys do not fit in 200 bytes: whole lines, then a marker. */
    CHECK(parse_str(&c, "{}", "empty.json", small, sizeof small) == STRATA_EFORMAT);
    CHECK(strlen(small) < sizeof small);
    CHECK_MSG(strstr(small, "\n(more problems not shown)") != NULL, "%s", small);
    CHECK(!strncmp(small, "empty.json: missing required key", 32));
    char tiny[8];
    CHECK(parse_str(&c, "{}", "empty.json", tiny, sizeof tiny) == STRATA_EFORMAT && !strcmp(tiny, "empty.j"));
    /* A long list of bad entries is capped. */
    sbuf b = {0};
    sbuf_printf(&b, "{\"full_attn_layers\": [");
    for (int i = 0; i < 5000; i++) sbuf_printf(&b, "%s\"x\"", i ? "," : "");
    sbuf_printf(&b, "]}");
    char *err = base_alloc(1 << 20, MEM_MISC);
    CHECK(parse_str(&c, b.s, "long.json", err, 1 << 20) == STRATA_EFORMAT);
    CHECK(count_lines(err) < 40);
    base_free(err);
    sbuf_free(&b);
}

/* Parses K3's written config with one substitution (it carries the
 * quantization_config block the small one lacks). */
static int parse_k3_mut(const char *from, const char *to, char *err, size_t n) {
    cfg c;
    cfg_k3(&c);
    char *js = cfg_to_json(&c);
    char *m = subst(js, from, to);
    int rc = parse_str(&c, m, "k3mut/config.json", err, n);
    base_free(m);
    base_free(js);
    return rc;
}

/* Regression (issue 38 item 11): keys that select math the engine does not
 * implement were read past, so the K3 math ran on another model's config and
 * gave wrong output with exit 0. Each is refused, naming file, key and value;
 * the values the engine implements, nulls, and keys that do not change the
 * math stay accepted. */
TEST(cfg_unimplemented_keys_refused) {
    char err[4096];
    static const struct { const char *from, *to, *want; } bad[] = {
        {"\"moe_router_activation_func\": \"sigmoid\"", "\"moe_router_activation_func\": \"softmax\"",
         "k3mut/config.json: 'text_config.moe_router_activation_func' is \"softmax\": not supported, "
         "this engine implements only \"sigmoid\""},
        {"\"moe_router_activation_func\": \"sigmoid\"", "\"moe_router_activation_func\": \"bogus\"",
         "'text_config.moe_router_activation_func' is \"bogus\""},
        {"\"moe_router_activation_func\": \"sigmoid\"", "\"moe_router_activation_func\": 1",
         "'text_config.moe_router_activation_func' is 1"},
        {"\"num_expert_group\": 1", "\"num_expert_group\": 8", "'text_config.num_expert_group' is 8"},
        {"\"num_expert_group\": 1", "\"num_expert_group\": 1.0", "'text_config.num_expert_group' is 1.0"},
        {"\"topk_group\": 1", "\"topk_group\": 4", "'text_config.topk_group' is 4"},
        {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true",
         "'text_config.tie_word_embeddings' is true: not supported, this engine implements only false"},
        {"\"mla_use_nope\": true", "\"mla_use_nope\": false", "'text_config.mla_use_nope' is false"},
        {"\"format\": \"mxfp4\"", "\"format\": \"pack-quantized\"",
         "'quantization_config.format' is \"pack-quantized\", which needs 'quant_method' \"compressed-tensors\""},
        {"\"format\": \"mxfp4\"", "\"format\": \"mxfp4\", \"quant_method\": \"compressed-tensors\"",
         "'quantization_config.quant_method' is \"compressed-tensors\": only its \"pack-quantized\" format"},
        {"\"format\": \"mxfp4\"", "\"format\": \"nvfp4\"",
         "'quantization_config.format' is \"nvfp4\": not supported"},
        {"\"scale_format\": \"e8m0\"", "\"scale_format\": \"bf16\"", "'quantization_config.scale_format' is \"bf16\""},
        {"\"model_type\": \"kimi_k3\",", "\"model_type\": \"kimi_k3\", \"tie_word_embeddings\": true,",
         "k3mut/config.json: 'tie_word_embeddings' is true"}, /* root of the nested shape */
        {"\"topk_group\": 1,", "\"topk_group\": 1, \"moe_layer_freq\": 2,", "'text_config.moe_layer_freq' is 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = parse_k3_mut(bad[i].from, bad[i].to, err, sizeof err);
        CHECK_MSG(rc == STRATA_EFORMAT && strstr(err, bad[i].want) && count_lines(err) == 1, "case %zu: rc %d: %s",
                  i, rc, err);
    }
    /* All of them at once: every one reported, one line each. */
    cfg c;
    cfg_k3(&c);
    char *js = cfg_to_json(&c);
    char *a = subst(js, "\"sigmoid\"", "\"softmax\"");
    char *b = subst(a, "\"topk_group\": 1", "\"topk_group\": 2");
    char *d = subst(b, "\"mla_use_nope\": true", "\"mla_use_nope\": false");
    CHECK(parse_str(&c, d, "all.json", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(count_lines(err) == 3 && strstr(err, "softmax") && strstr(err, "topk_group") && strstr(err, "mla_use_nope"),
              "%s", err);
    base_free(a); base_free(b); base_free(d); base_free(js);
    /* Quantization config under text_config is checked too. */
    cfg_k3(&c);
    c.mxfp4_experts = 0;
    js = cfg_to_json(&c);
    a = subst(js, "\"model_type\": \"kimi_k3_text\",",
              "\"model_type\": \"kimi_k3_text\", \"quantization_config\": {\"format\": \"fp8\"},");
    CHECK(parse_str(&c, a, "tq.json", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "tq.json: 'text_config.quantization_config.format' is \"fp8\""), "%s", err);
    base_free(a); base_free(js);
    /* Flat shape: the keys at the root. */
    CHECK(parse_mut("\"moe_router_activation_func\": \"sigmoid\"", "\"moe_router_activation_func\": \"softmax\"",
                    err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "'text_config.moe_router_activation_func' is \"softmax\""), "%s", err);
    const char *flat = "{\"num_expert_group\": 8, \"hidden_size\": 200}";
    CHECK(parse_str(&c, flat, "flat.json", err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "flat.json: 'num_expert_group' is 8: not supported"), "%s", err);

    /* Accepted: the values the engine implements (the writer emits them all),
     * null ("not set"), "MXFP4" in any case, the MXFP4 quant_method, and keys
     * that do not change the math. */
    CHECK(parse_k3_mut("\"topk_group\": 1", "\"topk_group\": null", err, sizeof err) == 0);
    CHECK(parse_k3_mut("\"tie_word_embeddings\": false", "\"tie_word_embeddings\": null", err, sizeof err) == 0);
    CHECK(parse_k3_mut("\"format\": \"mxfp4\"", "\"format\": \"MXFP4\", \"quant_method\": \"mxfp4\"", err,
                       sizeof err) == 0);
    CHECK_MSG(parse_k3_mut("\"model_type\": \"kimi_k3\",",
                           "\"model_type\": \"kimi_k3\", \"transformers_version\": \"4.57.1\", \"use_cache\": true, "
                           "\"tie_word_embeddings\": false, \"moe_layer_freq\": 1, \"use_grouped_topk\": true,",
                           err, sizeof err) == 0, "%s", err);
    CHECK(parse_k3_mut("\"torch_dtype\": \"bfloat16\",\n    \"linear", "\"torch_dtype\": \"float32\",\n    \"linear",
                       err, sizeof err) == 0);
    CHECK(parse_k3_mut("\"num_nextn_predict_layers\": 0", "\"num_nextn_predict_layers\": 1", err, sizeof err) == 0);
}

/* The released K3 config.json (a copy of shared/spec/k3-config.json) reads as
 * the built-in K3 values, so the refusals above do not touch it. */
TEST(cfg_k3_released_config) {
    cfg a, b;
    char err[4096];
    cfg_k3(&a);
    int rc = cfg_load(&b, "tests/data/configs/k3-config.json", err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(rc == 0 && cfg_same(&a, &b));
}

/* The CLI commands that read a config without weights apply the same refusal:
 * `inspect --config`, `plan --config`, and `run` on a model directory. */
TEST(cfg_unimplemented_keys_cli) {
    cfg c;
    cfg_k3(&c);
    char *js = cfg_to_json(&c);
    char *m = subst(js, "\"sigmoid\"", "\"softmax\"");
    const char *path = t_write("softmax.json", m, strlen(m));
    base_free(m);
    base_free(js);
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s inspect --config %s", t_strata(), path);
    CHECK(t_run(cmd, &out) == 1);
    CHECK_MSG(out && strstr(out, path) && strstr(out, "'text_config.moe_router_activation_func' is \"softmax\""), "%s",
              out ? out : "");
    base_free(out);
    snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 8", t_strata(), path);
    CHECK(t_run(cmd, &out) == 1);
    CHECK_MSG(out && strstr(out, path) && strstr(out, "moe_router_activation_func' is \"softmax\""), "%s",
              out ? out : "");
    base_free(out);
    const char *tiny = t_model("tiny", "tiny", -1, 0);
    CHECK(tiny != NULL);
    if (!tiny) return;
    snprintf(cmd, sizeof cmd,
             "rm -rf %s/cfg-tie && cp -r %s %s/cfg-tie && "
             "sed -i 's/\"tie_word_embeddings\": false/\"tie_word_embeddings\": true/' %s/cfg-tie/config.json",
             t_tmpdir, tiny, t_tmpdir, t_tmpdir);
    CHECK(t_run(cmd, NULL) == 0);
    snprintf(cmd, sizeof cmd, "%s run %s/cfg-tie --ids 1,2 --gen 2", t_strata(), t_tmpdir);
    CHECK(t_run(cmd, &out) == 1);
    CHECK_MSG(out && strstr(out, "cfg-tie/config.json: 'text_config.tie_word_embeddings' is true: not supported"),
              "%s", out ? out : "");
    base_free(out);
}
