/*
 * t_kimi_linear.c: the Kimi Linear architecture (src/format/arch_kimi_linear.c):
 * the real config read and refused where its math is not implemented, the
 * published layout of the kimi-linear-* presets, the forward pass's invariants
 * (threads, budgets, packs, batching, speculation) and the router switch.
 * Agreement with the float64 reference: tests/reference/kl_check.sh.
 */
#include <stdlib.h>
#include <string.h>
#include "arch.h"
#include "cfg.h"
#include "infer.h"
#include "schema.h"
#include "test.h"

#define KL_REAL "tests/data/configs/kimi-linear-48b-a3b-instruct.config.json"

TEST(kl_real_config) {
    cfg c, k;
    char err[2048];
    int rc = cfg_load(&c, KL_REAL, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc) return;
    cfg_kimi_linear(&k);
    CHECK(c.arch == ARCH_KIMI_LINEAR && c.plain_res && c.kda_softplus && c.kda_g_lowrank && c.act_silu && c.moe_plain);
    CHECK(c.hidden == 2304 && c.n_layers == 27 && c.q_lora == 0 && c.latent == 2304 && !c.mla_out_gate);
    CHECK(c.n_mla == 7 && c.is_mla[3] && c.is_mla[26] && !c.is_mla[0] && !c.is_mla[25]);
    CHECK(c.kv_norm_eps == 1e-6 && c.routed_scale == 2.446 && c.eos_ids[0] == 163586 && c.max_ctx == 1048576);
    CHECK(memcmp(c.is_mla, k.is_mla, sizeof c.is_mla) == 0 && c.dense_inter == k.dense_inter);
    cfg_census s;
    schema_census(&c, &s);
    CHECK(s.params_total == 49122681728ull); /* the release's count */
    CHECK(s.expert_bytes == 14155776ull);
    CHECK(s.n_kda == 20 && s.n_mla == 7);
    /* the writer round-trips, and writes the release's values (root head_dim 72 =
     * hidden / heads, linear_attn_config's 128) */
    char *js = cfg_to_json(&c);
    CHECK(js && strstr(js, "\"head_dim\": 72,") && strstr(js, "\"head_dim\": 128,"));
    cfg r;
    rc = cfg_parse(&r, (const uint8_t *)js, strlen(js), "written", err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(r.arch == ARCH_KIMI_LINEAR && r.hidden == c.hidden && memcmp(r.is_mla, c.is_mla, sizeof r.is_mla) == 0);
    base_free(js);
    /* K3's fingerprint is unchanged by the layer; the router convention changes Kimi Linear's */
    cfg c2 = c;
    c2.router_hf = 1;
    CHECK(infer_cfg_fingerprint(&c) != infer_cfg_fingerprint(&c2));
}

/* Values whose math is not implemented are refused, naming the file and key. */
TEST(kl_config_refusals) {
    char *js = t_slurp(KL_REAL);
    CHECK(js != NULL);
    if (!js) return;
    static const t_refusal k[] = {
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "'hidden_act' is \"gelu\": not supported"},
        {"\"num_expert_group\": 1", "\"num_expert_group\": 8", "'num_expert_group' is 8: not supported"},
        {"\"mla_use_nope\": true", "\"mla_use_nope\": false", "'mla_use_nope' is false: not supported"},
        {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true", "'tie_word_embeddings' is true"},
        {"\"num_nextn_predict_layers\": 0", "\"num_nextn_predict_layers\": 1", "'num_nextn_predict_layers' is 1"},
        {"\"KimiLinearForCausalLM\"", "\"KimiK3ForConditionalGeneration\"", "name different architectures"},
        {"\"kv_lora_rank\": 512", "\"kv_lora_rank\": null", "'kv_lora_rank' must be an integer, got null"},
    };
    t_config_refusals(js, "kl", k, sizeof k / sizeof k[0]);
    /* q_lora_rank given as an integer: q-LoRA, read as such */
    char *m = t_subst1(js, "\"q_lora_rank\": null", "\"q_lora_rank\": 64");
    cfg c;
    char err[1024];
    CHECK(m && cfg_parse(&c, (const uint8_t *)m, strlen(m), "q", err, sizeof err) == 0 && c.q_lora == 64);
    base_free(m);
    base_free(js);
}

/* A config that gives only kda_layers (Hugging Face's is_kda_layer reads nothing
 * else) or only full_attn_layers has the released layer map, one-based or with
 * kda_layer_index_base 0; both lists given must still agree. */
TEST(kl_config_one_layer_list) {
    char *js = t_slurp(KL_REAL);
    CHECK(js != NULL);
    if (!js) return;
    cfg ref;
    char err[1024];
    cfg_kimi_linear(&ref);
    char *full = strstr(js, "\"full_attn_layers\""), *kda = strstr(js, "\"kda_layers\"");
    char *full_end = full ? strstr(full, "],") : NULL, *kda_end = kda ? strstr(kda, "],") : NULL;
    CHECK(full_end && kda_end);
    if (!full_end || !kda_end) { base_free(js); return; }
    for (int drop = 0; drop < 2; drop++) {
        /* the text without one list (its key through "],") */
        const char *a = drop ? kda : full, *b = (drop ? kda_end : full_end) + 2;
        char *m = base_alloc(strlen(js) + 1, MEM_MISC);
        CHECK(m != NULL);
        if (!m) break;
        snprintf(m, strlen(js) + 1, "%.*s%s", (int)(a - js), js, b);
        cfg c;
        int rc = cfg_parse(&c, (const uint8_t *)m, strlen(m), "one list", err, sizeof err);
        CHECK_MSG(rc == 0, "without %s: %s", drop ? "kda_layers" : "full_attn_layers", err);
        CHECK(rc || (c.n_mla == 7 && memcmp(c.is_mla, ref.is_mla, sizeof c.is_mla) == 0));
        base_free(m);
    }
    /* kda_layers alone, zero-based */
    static const char k0[] = "{\"model_type\": \"kimi_linear\", \"hidden_size\": 64, \"num_hidden_layers\": 4, "
        "\"vocab_size\": 512, \"rms_norm_eps\": 1e-5, \"num_attention_heads\": 4, \"q_lora_rank\": null, "
        "\"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, "
        "\"num_experts\": 8, \"num_experts_per_token\": 2, \"num_shared_experts\": 1, \"moe_intermediate_size\": 32, "
        "\"routed_scaling_factor\": 2.446, \"first_k_dense_replace\": 1, \"intermediate_size\": 128, "
        "\"linear_attn_config\": {\"num_heads\": 4, \"head_dim\": 16, \"short_conv_kernel_size\": 4, "
        "\"kda_layer_index_base\": 0, \"kda_layers\": [0, 2, 3]}}";
    cfg c;
    int rc = cfg_parse(&c, (const uint8_t *)k0, strlen(k0), "k0", err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(rc || (c.n_mla == 1 && c.is_mla[1] && !c.is_mla[0] && !c.is_mla[2] && !c.is_mla[3]));
    /* every layer KDA leaves no MLA layer: refused */
    char *all = t_subst1(k0, "[0, 2, 3]", "[0, 1, 2, 3]");
    CHECK(all && cfg_parse(&c, (const uint8_t *)all, strlen(all), "all", err, sizeof err) != 0 && strstr(err, "full-attention"));
    base_free(all);
    base_free(js);
}

TEST(kl_inspect_plan_real_and_sparse) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s inspect --config %s", t_strata(), KL_REAL);
    t_expect(0, cmd, "27 layers = 20 KDA + 7 MLA", "49,122,681,728", "architecture kimi_linear", NULL);
    snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 8", t_strata(), KL_REAL);
    t_expect(0, cmd, "minimum budget", NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s/kl48 && %s gen-model %s/kl48 --preset kimi-linear-48b --sparse --quiet", t_tmpdir,
             t_strata(), t_tmpdir);
    t_expect(0, cmd, NULL);
    snprintf(cmd, sizeof cmd, "%s inspect %s/kl48", t_strata(), t_tmpdir);
    t_expect(0, cmd, "20 shards, 20,493 tensors", "problems: none", "one expert 14,155,776 bytes", NULL);
    snprintf(cmd, sizeof cmd, "%s plan %s/kl48 --ram-gb 4", t_strata(), t_tmpdir);
    t_expect(0, cmd, "minimum budget", NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s/kl48", t_tmpdir);
    t_run(cmd, NULL);
}

/* The published layout: names, dtypes and shapes the release uses. */
TEST(kl_tiny_layout) {
    const char *m = t_model("kl", "kimi-linear-tiny", 7, 0);
    CHECK(m != NULL);
    if (!m) return;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", m);
    char *js = t_slurp(path);
    CHECK(js && strstr(js, "\"model_type\": \"kimi_linear\"") && strstr(js, "\"q_lora_rank\": null") &&
          !strstr(js, "text_config"));
    base_free(js);
    snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", m);
    char *raw = t_slurp(path), *st = raw ? raw + 8 : NULL; /* the header after its 8-byte length */
    CHECK(st != NULL);
    if (!st) return;
    CHECK(strstr(st, "\"model.layers.0.self_attn.A_log\":{\"dtype\":\"F32\",\"shape\":[1,1,4,1]") != NULL);
    CHECK(strstr(st, "\"model.layers.0.self_attn.dt_bias\":{\"dtype\":\"F32\"") != NULL);
    CHECK(strstr(st, "\"model.layers.1.block_sparse_moe.gate.e_score_correction_bias\":{\"dtype\":\"BF16\"") != NULL);
    CHECK(strstr(st, "\"model.layers.3.self_attn.q_proj.weight\"") && strstr(st, "\"lm_head.weight\"") &&
          strstr(st, "\"model.layers.0.self_attn.g_b_proj.weight\"") && strstr(st, "experts.0.w2.weight"));
    CHECK(!strstr(st, "attn_res") && !strstr(st, "language_model"));
    base_free(raw);
}



/* Resident, budgets below the model, one or two threads, a pack, batched and
 * speculative runs: the same bits. The router switch changes them. */
TEST(kl_forward_invariants) {
    const char *m = t_model("kl", "kimi-linear-tiny", 7, 0);
    const char *mp = t_model("klp", "kimi-linear-tiny", 7, 1);
    CHECK(m && mp);
    if (!m || !mp) return;
    char a[256], b[256];
    CHECK(t_run_logits(m, "--threads 2", "res", 8, a, sizeof a) == 0);
    CHECK(t_run_logits(m, "--threads 1", "t1", 8, b, sizeof b) == 0);
    CHECK(!strcmp(a, b) && t_same_logits("res", "t1"));
    /* the minimum budget, then the smallest budgets above it */
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2 --gen 1 --ram-gb 0.001", t_strata(), m);
    t_run(cmd, &out);
    const char *p = out ? strstr(out, "needs at least ") : NULL;
    double mb = p ? atof(p + 15) : 0;
    base_free(out);
    CHECK(mb > 0);
    const double bud[2] = {mb * 1.02e-3, mb * 1.2e-3};
    for (int i = 0; i < 2 && mb > 0; i++) {
        char ex[128];
        snprintf(ex, sizeof ex, "--threads 2 --ram-gb %.6f", bud[i]);
        CHECK(t_run_logits(m, ex, "bud", 8, b, sizeof b) == 0);
        CHECK_MSG(!strcmp(a, b) && t_same_logits("res", "bud"), "budget %g", bud[i]);
        CHECK(t_run_logits(mp, ex, "pack", 8, b, sizeof b) == 0);
        CHECK_MSG(!strcmp(a, b) && t_same_logits("res", "pack"), "pack, budget %g", bud[i]);
    }
    CHECK(t_run_logits(m, "--threads 2 --chunk 3", "chunk", 8, b, sizeof b) == 0);
    CHECK(!strcmp(a, b) && t_same_logits("res", "chunk"));
    CHECK(t_run_logits(m, "--threads 2 --spec 3", "spec", 8, b, sizeof b) == 0);
    CHECK_MSG(!strcmp(a, b), "spec: %s vs %s", b, a);
    /* batched: the same prompt in three sequences gives the solo ids each */
    const char batch[] = "1,5,9,2,7,3,11,40\n1,5,9,2,7,3,11,40\n1,5,9,2,7,3,11,40\n";
    const char *bf = t_write("kl-batch.txt", batch, strlen(batch));
    snprintf(cmd, sizeof cmd, "%s run %s --batch %s --gen 8 --print-ids --threads 2 2>/dev/null", t_strata(), m, bf);
    CHECK(t_run(cmd, &out) == 0);
    char line[256];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(a, "\n"), a);
    int hits = 0;
    for (const char *q = out; q && line[0] && (q = strstr(q, line)); q++) hits++;
    CHECK_MSG(hits >= 3, "batched: %s", out ? out : "");
    base_free(out);
    /* the HF router convention is another model: other logits */
    CHECK(t_run_logits(m, "--threads 2 --router hf", "hf", 8, b, sizeof b) == 0);
    CHECK(!t_same_logits("res", "hf"));
    CHECK(t_run_logits(m, "--threads 1 --router hf", "hf1", 8, b, sizeof b) == 0);
    CHECK(t_same_logits("hf", "hf1"));
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1 --router biased", t_strata(), m);
    CHECK(t_run(cmd, &out) == 2);
    CHECK_MSG(out && strstr(out, "--router"), "%s", out ? out : "");
    base_free(out);
}

/* The engine against the independent float64 reference (tests/reference/klref.py)
 * on checkpoints written by the reference's own writer (make_kimi_linear.py, the
 * published layout, not strata's generator): both router conventions, f32
 * vectors, zero-based layer lists (kda_layer_index_base 0) and the engine's own
 * tiny preset. kl_check.sh: greedy ids equal, logits within 1e-4 of max|logit|. */
TEST(kl_reference) {
    static const struct { const char *name, *args; } k_models[] = {
        {"klr_plain", "--seed 3"},
        {"klr_f32", "--seed 4 --vec-dtype f32 --shards 2"},
        {"klr_base0", "--seed 5 --index-base 0"},
    };
    char cmd[2048], *out = NULL;
    for (size_t i = 0; i < sizeof k_models / sizeof *k_models; i++) {
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/make_kimi_linear.py %s/%s %s >/dev/null",
                 t_tmpdir, k_models[i].name, k_models[i].args);
        CHECK_MSG(t_run(cmd, &out) == 0, "%s: %s", cmd, out ? out : "");
        base_free(out);
        for (int hf = 0; hf < 2; hf++) {
            snprintf(cmd, sizeof cmd, "bash tests/reference/kl_check.sh %s/%s %s%s", t_tmpdir, k_models[i].name,
                     t_strata(), hf ? " --router hf" : "");
            int rc = t_run(cmd, &out);
            CHECK_MSG(rc == 0 && out && strstr(out, "PASS"), "%s: rc %d: %s", cmd, rc, out ? out : "");
            base_free(out);
        }
    }
    const char *tiny = t_model("klr_tiny", "kimi-linear-tiny", 6, 0);
    CHECK(tiny != NULL);
    if (!tiny) return;
    snprintf(cmd, sizeof cmd, "bash tests/reference/kl_check.sh %s %s", tiny, t_strata());
    int rc = t_run(cmd, &out);
    CHECK_MSG(rc == 0 && out && strstr(out, "PASS"), "%s: rc %d: %s", cmd, rc, out ? out : "");
    base_free(out);
}

/* A Kimi Linear checkpoint larger than its minimum budget (173 MB, written by the
 * reference's writer in the published layout): resident and at two budgets below
 * its size (weights streamed, experts cached; 1.1x and 1.6x the minimum the engine
 * names, which a sanitizer build raises) give the same ids and logits bits, and
 * the streamed run matches the float64 reference. */
TEST(kl_budgets_below_size) {
    char dir[1024], cmd[4096], *out = NULL;
    snprintf(dir, sizeof dir, "%s/klr_medium", t_tmpdir);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/make_kimi_linear.py %s --seed 12 --hidden 192 --layers 5 "
             "--experts 192 --topk 8 --moe-inter 192 --shards 2 >/dev/null", dir);
    CHECK_MSG(t_run(cmd, &out) == 0, "%s", out ? out : "");
    base_free(out);
    const char *args = "--ids 5,6,7,8,9 --gen 12 --print-ids";
    double min_mb = t_min_budget_mb(dir, args);
    CHECK_MSG(min_mb > 1 && min_mb * 1.6 < 172.0, "minimum %.2f MB", min_mb);
    if (!(min_mb > 1)) return;
    char budgets[3][64];
    t_budgets_agree(dir, args, min_mb, 1, "kl", budgets);
    snprintf(cmd, sizeof cmd, "bash tests/reference/kl_check.sh %s %s -- %s", dir, t_strata(), budgets[1]);
    int rc = t_run(cmd, &out);
    CHECK_MSG(rc == 0 && out && strstr(out, "PASS"), "rc %d: %s", rc, out ? out : "");
    base_free(out);
}
