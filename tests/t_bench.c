/*
 * t_bench.c: the benchmark cores behind bench/ (include/strata_bench.h,
 * src/bench.c, src/bench_gram.c): each prints the tables its program always printed to the
 * caller's FILE, and refuses bad input with a code and a message that names
 * the file, never an exit.
 */
#include <stdlib.h>
#include <string.h>
#include "strata.h"
#include "strata_bench.h"
#include "test.h"

/* The text written to f (rewound), NUL-terminated; release with free. */
static char *slurp(FILE *f) {
    long n = ftell(f);
    char *s = calloc((size_t)(n > 0 ? n : 0) + 1, 1);
    rewind(f);
    if (s && n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    return s;
}

static int count_char(const char *s, char c) {
    int n = 0;
    for (; *s; s++) n += *s == c;
    return n;
}

TEST(bench_index) {
    char err[512];
    FILE *f = tmpfile();
    strata_bench_index_opts o = {.n_shards = 2, .per_shard = 64};
    CHECK_MSG(strata_bench_index(&o, f, err, sizeof err) == STRATA_OK, "%s", err);
    char *s = slurp(f);
    fclose(f);
    CHECK_MSG(s && strstr(s, "b_index: 2 shards x 64 tensors, ") && strstr(s, "\n  st_open scan:  wall ") &&
                  strstr(s, "\n  st_open index: wall ") && strstr(s, "\n  st_find:       ") &&
                  strstr(s, "ns/lookup over 128 tensors\n") && strstr(s, "\n  index RAM:     "),
              "%s", s ? s : "");
    free(s);
    o.n_shards = 97;
    CHECK(strata_bench_index(&o, stdout, err, sizeof err) == STRATA_EINVAL && strstr(err, "1..96"));
    o.n_shards = 1;
    o.per_shard = 7;
    CHECK(strata_bench_index(&o, stdout, err, sizeof err) == STRATA_EINVAL);
}

/* Two layers (5 and 6 in the trace: counted from 0 at the first) of 4 experts:
 * layer 5 asks {0, 1}, layer 6 {2}, then layer 5 {0, 1} and layer 6 {2, 3}. */
TEST(bench_cache_replay) {
    const int32_t tr[] = {5, 0, 5, 1, 6, 2, 5, 0, 5, 1, 6, 2, 6, 3};
    const char *path = t_write("replay.trace", tr, sizeof tr);
    const int64_t slots[] = {8, 2};
    strata_bench_replay_opts o = {.trace = path, .n_experts = 4, .slots = slots, .n_slots = 2, .csv = 1};
    char err[512];
    FILE *f = tmpfile();
    CHECK_MSG(strata_bench_cache_replay(&o, f, err, sizeof err) == STRATA_OK, "%s", err);
    char *s = slurp(f);
    fclose(f);
    /* 8 slots hold every key: each policy and MIN hit all but the 4 first requests
     * of 7 (the ceiling); 8 slots of 2 x 4 keys are 100% */
    const char *want = "slots,pct_of_experts,s3fifo,lru,lfu,layer,belady,ceiling\n"
                       "8,100.0,0.4286,0.4286,0.4286,0.4286,0.4286,0.4286\n2,25.0,";
    CHECK_MSG(s && !strncmp(s, want, strlen(want)), "%s", s ? s : "");
    CHECK(s && count_char(s, '\n') == 3);
    free(s);
    o.csv = 0;
    f = tmpfile();
    CHECK_MSG(strata_bench_cache_replay(&o, f, err, sizeof err) == STRATA_OK, "%s", err);
    s = slurp(f);
    fclose(f);
    CHECK_MSG(s && strstr(s, "trace: 7 requests over 2 layers x 4 experts, ceiling 42.86%\n") &&
                  strstr(s, "   slots  % keys   S3-FIFO       LRU       LFU     LAYER       MIN\n") &&
                  strstr(s, "\n       8  100.0%    42.86%    42.86%    42.86%    42.86%    42.86%\n"),
              "%s", s ? s : "");
    free(s);
    /* refusals: an expert id beyond N_EXPERTS, a missing file, no sizes */
    o.n_experts = 3;
    CHECK_MSG(strata_bench_cache_replay(&o, stdout, err, sizeof err) == STRATA_EFORMAT && strstr(err, path) &&
                  strstr(err, "expert 3"), "%s", err);
    o.n_experts = 4;
    o.trace = "/nonexistent/strata-trace";
    CHECK_MSG(strata_bench_cache_replay(&o, stdout, err, sizeof err) != STRATA_OK && strstr(err, "/nonexistent/strata-trace"),
              "%s", err);
    o.trace = path;
    o.n_slots = 0;
    CHECK(strata_bench_cache_replay(&o, stdout, err, sizeof err) == STRATA_EINVAL);
}

/* bench_io on a tiny model: the expert table, then the trunk-like reads, which
 * need shards of 64 MB, are refused with the shard's name (the program used to
 * print rows of reads past the end of the file). */
TEST(bench_io_small_model) {
    const char *dir = t_model("benchio", "tiny", -1, 0);
    CHECK(dir != NULL);
    if (!dir) return;
    char err[2048];
    FILE *f = tmpfile();
    strata_bench_io_opts o = {.model_dir = dir, .n = 8};
    int rc = strata_bench_io(&o, f, err, sizeof err);
    CHECK_MSG(rc == STRATA_EINVAL && strstr(err, ".safetensors: the trunk-like reads need shards over 64 MB"), "%d %s", rc, err);
    char *s = slurp(f);
    fclose(f);
    CHECK_MSG(s && strstr(s, "experts: ") && strstr(s, "read                                depth       GB/s\n") &&
                  strstr(s, "expert, in place (enclosing range)     32 ") && strstr(s, "expert, aligned (repacked)             32 "),
              "%s", s ? s : "");
    CHECK(s && count_char(s, '\n') == 12);
    free(s);
    o.slices = 1;
    CHECK_MSG(strata_bench_io(&o, stdout, err, sizeof err) == STRATA_EINVAL && strstr(err, "over 512 MB"), "%s", err);
    o.model_dir = "/nonexistent/strata-model";
    CHECK_MSG(strata_bench_io(&o, stdout, err, sizeof err) != STRATA_OK && strstr(err, "/nonexistent/strata-model"), "%s", err);
}

/* The field of a CSV line (0-based), copied into buf. */
static const char *field(const char *line, int k, char *buf, size_t n) {
    for (int i = 0; i < k && line; i++) line = (line = strchr(line, ',')) ? line + 1 : NULL;
    size_t len = line ? strcspn(line, ",") : 0;
    if (len >= n) len = n - 1;
    memcpy(buf, line ? line : "", len);
    buf[len] = 0;
    return buf;
}

/* One ladder rung on a tiny model: the 19-field line run.sh reads, the same ids
 * hash at every budget and thread count, the budget refused below the minimum. */
TEST(bench_place_run) {
    const char *dir = t_model("benchplace", "tiny", -1, 1);
    CHECK(dir != NULL);
    if (!dir) return;
    char err[2048], a[64], b[64];
    strata_bench_place_opts o = strata_bench_place_opts_default();
    o.model_dir = dir;
    o.ram_gb = 1;
    o.gen = 4;
    o.prompt_len = 8;
    strata_bench_place_result r1, r2, r3;
    FILE *log = tmpfile();
    CHECK_MSG(strata_bench_place_run(&o, log, &r1, err, sizeof err) == STRATA_OK, "%s", err);
    char *s = slurp(log);
    fclose(log);
    CHECK_MSG(s && strstr(s, "place_run: kernels ") && strstr(s, "plan: ") && strstr(s, "decode (3 tokens):\n") &&
                  strstr(s, "decode window: ") && strstr(s, "\nids: ") && !strstr(s, "steal:"),
              "%s", s ? s : "");
    free(s);
    CHECK_MSG(count_char(r1.line, ',') == 18 && !strncmp(r1.line, "1,", 2) && r1.peak_rss > 0, "%s", r1.line);
    CHECK_MSG(!strcmp(field(r1.line, 17, a, sizeof a), "whole") || !strcmp(a, "sliced"), "%s", r1.line);
    o.ram_gb = 0;
    o.threads = 1;
    FILE *null = fopen("/dev/null", "w");
    CHECK(null != NULL);
    if (!null) return;
    CHECK_MSG(strata_bench_place_run(&o, null, &r2, err, sizeof err) == STRATA_OK, "%s", err);
    CHECK_MSG(!strncmp(r2.line, "resident,", 9), "%s", r2.line);
    CHECK_MSG(!strcmp(field(r1.line, 10, a, sizeof a), field(r2.line, 10, b, sizeof b)), "%s vs %s", r1.line, r2.line);
    o.ram_gb = 0.5;
    o.threads = 2;
    o.no_preload = 1;
    o.policy = strata_plan_policy("lru");
    CHECK_MSG(strata_bench_place_run(&o, null, &r3, err, sizeof err) == STRATA_OK, "%s", err);
    CHECK_MSG(!strcmp(a, field(r3.line, 10, b, sizeof b)), "%s vs %s", r1.line, r3.line);
    o.ram_gb = 0.001;
    CHECK_MSG(strata_bench_place_run(&o, null, &r3, err, sizeof err) == STRATA_EBUDGET && strstr(err, "below the minimum"),
              "%s", err);
    o.gen = 0;
    CHECK(strata_bench_place_run(&o, null, &r3, err, sizeof err) == STRATA_EINVAL);
    fclose(null);
}

/* The mask bench on the tiny model's vocabulary: both paths choose the same ids
 * (else STRATA_ECORRUPT); a missing tokenizer is an error naming the file. */
TEST(bench_grammar_masks) {
    const char *dir = t_model("bench_gram_tiny", "tiny", -1, 0);
    CHECK(dir != NULL);
    if (!dir) return;
    char err[512];
    FILE *f = tmpfile();
    strata_bench_gmask_opts o = {.model_dir = dir, .schema = NULL, .steps = 300};
    CHECK_MSG(strata_bench_grammar_masks(&o, f, err, sizeof err) == STRATA_OK, "%s", err);
    char *s = slurp(f);
    fclose(f);
    CHECK_MSG(s && strstr(s, "whole-trie walk  300 masks") && strstr(s, "string fast path 300 masks") && strstr(s, "same ids"), "%s",
              s ? s : "");
    free(s);
    o.model_dir = t_tmpdir;
    f = tmpfile();
    CHECK(strata_bench_grammar_masks(&o, f, err, sizeof err) != STRATA_OK && strstr(err, "tiktoken.model"));
    fclose(f);
}
