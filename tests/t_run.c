/*
 * t_run.c: `strata run` as a program: the stdout contract of --print-ids, the
 * logits dump and JSON report, scalar vs default kernels, and the exit codes of
 * bad inputs (2) and broken model directories (1).
 */
#include <stdlib.h>
#include <string.h>
#include "test.h"

#define PY "/usr/bin/python3"

static const char *run_model(void) {
    static char d[600];
    char p[700], cmd[1200];
    snprintf(d, sizeof d, "%s/run_model", t_tmpdir);
    snprintf(p, sizeof p, "%s/config.json", d);
    if (base_is_file(p)) return d;
    char *out = NULL;
    t_run("./strata gen-model --help", &out);
    int gen = out && !strstr(out, "not implemented");
    base_free(out);
    if (gen) return t_model("run_model", "tiny", -1, 0);
    snprintf(cmd, sizeof cmd, PY " tests/reference/make_tiny.py %s >/dev/null 2>&1", d);
    return t_run(cmd, NULL) == 0 ? d : NULL;
}

static int run(const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "./strata run %s", args);
    return t_run(cmd, out);
}

TEST(run_contract) {
    const char *d = run_model();
    if (!d) { printf("  SKIP: no model\n"); return; }
    char a[2048], *out = NULL;
    /* stdout: exactly one line of 6 ids */
    snprintf(a, sizeof a, "%s --ids 1,2,3 --gen 6 --temp 0 --print-ids --dump-logits %s/d.bin --json %s/r.json 2>/dev/null",
             d, t_tmpdir, t_tmpdir);
    CHECK(run(a, &out) == 0);
    int commas = 0, lines = 0;
    for (char *p = out; p && *p; p++) { commas += *p == ','; lines += *p == '\n'; }
    CHECK_MSG(commas == 5 && lines == 1 && out[strlen(out) - 1] == '\n', "stdout: '%s'", out);
    char dump[700], js[700];
    snprintf(dump, sizeof dump, "%s/d.bin", t_tmpdir);
    snprintf(js, sizeof js, "%s/r.json", t_tmpdir);
    uint8_t *b;
    size_t len;
    CHECK(base_read_file(dump, 1u << 26, &b, &len, NULL, 0) == 0);
    CHECK(len > 0 && len % (6 * sizeof(float)) == 0);
    base_free(b);
    /* the dump is written beside its name and renamed at the end: no leftovers */
    snprintf(a, sizeof a, "ls %s | grep -c partial", t_tmpdir);
    char *ls = NULL;
    t_run(a, &ls);
    CHECK_MSG(ls && atoi(ls) == 0, "leftover partial files: %s", ls ? ls : "?");
    base_free(ls);
    /* an unwritable dump path fails before any weight is read */
    snprintf(a, sizeof a, "%s --ids 1 --dump-logits %s/no/such/dir/d.bin 2>/dev/null", d, t_tmpdir);
    CHECK(run(a, NULL) == 1);
    CHECK(base_read_file(js, 1u << 20, &b, &len, NULL, 0) == 0);
    CHECK(strstr((char *)b, "\"generated_ids\"") && strstr((char *)b, "\"prompt_ids\"") &&
          strstr((char *)b, "\"peak_rss_bytes\"") && strstr((char *)b, "\"mla_cache_bytes_per_pos\"") &&
          strstr((char *)b, "\"decode_s_per_token\""));
    base_free(b);
    /* scalar kernels: same ids and same logits bits */
    char *out2 = NULL;
    snprintf(a, sizeof a, "%s --ids 1,2,3 --gen 6 --temp 0 --print-ids --dump-logits %s/d2.bin --threads 1 2>/dev/null",
             d, t_tmpdir);
    char env[2200];
    snprintf(env, sizeof env, "STRATA_KERNEL=scalar ./strata run %s", a);
    CHECK(t_run(env, &out2) == 0);
    CHECK(out2 && !strcmp(out, out2));
    snprintf(env, sizeof env, "cmp -s %s/d.bin %s/d2.bin", t_tmpdir, t_tmpdir);
    CHECK_MSG(t_run(env, NULL) == 0, "scalar vs default logits differ");
    base_free(out2);
    /* sampling: same seed, same ids; report on stderr only */
    snprintf(a, sizeof a, "%s --ids 5,6 --gen 8 --temp 0.9 --top-k 20 --top-p 0.95 --min-p 0.01 --repeat-penalty 1.1 --seed 3 --print-ids 2>/dev/null", d);
    char *s1 = NULL, *s2 = NULL;
    CHECK(run(a, &s1) == 0 && run(a, &s2) == 0);
    CHECK(s1 && s2 && !strcmp(s1, s2));
    base_free(s1);
    base_free(s2);
    /* without --print-ids and with --ids only, output is still ids (no tokenizer) or text */
    snprintf(a, sizeof a, "%s --ids 5,6 --gen 3 2>&1 >/dev/null", d);
    CHECK(run(a, &s1) == 0);
    CHECK(s1 && strstr(s1, "logits hash") && strstr(s1, "peak RSS"));
    base_free(s1);
    base_free(out);
}

TEST(run_placed) {
    const char *d = run_model();
    if (!d) { printf("  SKIP: no model\n"); return; }
    char a[2048], cmd[4096], *o1 = NULL, *o2 = NULL, *o3 = NULL;
    snprintf(a, sizeof a, "%s --ids 1,2,3,4 --gen 6 --print-ids --dump-logits %s/pa.bin 2>/dev/null", d, t_tmpdir);
    CHECK(run(a, &o1) == 0);
    /* a budget just above the planner's minimum streams the trunk and experts */
    snprintf(a, sizeof a, "%s --ids 1,2,3,4 --gen 6 --plan --ram-gb 1000 2>/dev/null", d);
    CHECK(run(a, &o3) == 0);
    CHECK(o3 && strstr(o3, "minimum budget"));
    double mn = 0;
    const char *m = o3 ? strstr(o3, "minimum budget") : NULL;
    if (m) sscanf(m, "minimum budget %lf", &mn);
    CHECK(mn > 0);
    snprintf(a, sizeof a, "%s --ids 1,2,3,4 --gen 6 --print-ids --ram-gb %.4f --dump-logits %s/pb.bin 2>/dev/null", d,
             mn * 1.05, t_tmpdir);
    CHECK(run(a, &o2) == 0);
    CHECK(o1 && o2 && !strcmp(o1, o2));
    snprintf(cmd, sizeof cmd, "cmp -s %s/pa.bin %s/pb.bin", t_tmpdir, t_tmpdir);
    CHECK_MSG(t_run(cmd, NULL) == 0, "streamed logits differ from resident");
    /* below the minimum: a clear refusal, exit 2 */
    snprintf(a, sizeof a, "%s --ids 1 --ram-gb %.4f 2>&1", d, mn * 0.5);
    char *o4 = NULL;
    CHECK(run(a, &o4) == 2);
    base_free(o1);
    base_free(o2);
    base_free(o3);
    base_free(o4);
}

TEST(run_text) {
    const char *d = run_model();
    char tk[700];
    if (!d) { printf("  SKIP: no model\n"); return; }
    snprintf(tk, sizeof tk, "%s/tiktoken.model", d);
    if (!base_is_file(tk)) { printf("  SKIP: model has no tokenizer\n"); return; }
    char a[2048], *o1 = NULL, *o2 = NULL;
    snprintf(a, sizeof a, "%s --prompt 'Hello world, this is a test' --gen 5 --json %s/t.json 2>/dev/null", d, t_tmpdir);
    CHECK(run(a, &o1) == 0);
    const char *pf = t_write("prompt.txt", "Hello world, this is a test", 27);
    snprintf(a, sizeof a, "%s --prompt-file %s --gen 5 2>/dev/null", d, pf);
    CHECK(run(a, &o2) == 0);
    CHECK(o1 && o2 && !strcmp(o1, o2)); /* same text either way */
    uint8_t *b;
    size_t len;
    char js[700];
    snprintf(js, sizeof js, "%s/t.json", t_tmpdir);
    CHECK(base_read_file(js, 1u << 20, &b, &len, NULL, 0) == 0 && strstr((char *)b, "\"prompt_ids\": ["));
    base_free(b);
    const char *ef = t_write("empty.txt", "", 0);
    snprintf(a, sizeof a, "%s --prompt-file %s >/dev/null 2>&1", d, ef);
    CHECK(run(a, NULL) == 2);
    snprintf(a, sizeof a, "%s --prompt '' >/dev/null 2>&1", d);
    CHECK(run(a, NULL) == 2);
    snprintf(a, sizeof a, "%s --prompt-file %s/nope.txt >/dev/null 2>&1", d, t_tmpdir);
    CHECK(run(a, NULL) == 2);
    base_free(o1);
    base_free(o2);
}

TEST(run_errors) {
    const char *d = run_model();
    if (!d) { printf("  SKIP: no model\n"); return; }
    char a[2048];
    struct { const char *args; int rc; } k[] = {
        {"--ids 1,2,999999 --gen 2", 2},
        {"--ids '' --gen 2", 2},
        {"--ids 1,,2", 2},
        {"--ids -1", 2},
        {"--ids 1,2 --gen 0", 2},
        {"--ids 1,2,3,4 --ctx 3", 2},
        {"--ids 1 --bogus", 2},
        {"--ids 1 --gen", 2},
        {"--ids 1 --temp -1", 2},
        {"--ids 1 --top-p 0", 2},
        {"--ids 1 --prompt hi", 2},
        {"", 2},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        snprintf(a, sizeof a, "%s %s >/dev/null 2>&1", d, k[i].args);
        int rc = run(a, NULL);
        CHECK_MSG(rc == k[i].rc, "'%s' -> %d, expected %d", k[i].args, rc, k[i].rc);
    }
    CHECK(run("--ids 1 >/dev/null 2>&1", NULL) == 2);          /* no model dir */
    CHECK(run("--help >/dev/null 2>&1", NULL) == 0);
    /* a text prompt needs the tokenizer (absent from this model unless the generator wrote one) */
    char tk[700];
    snprintf(tk, sizeof tk, "%s/tiktoken.model", d);
    if (!base_is_file(tk)) {
        char *o = NULL;
        snprintf(a, sizeof a, "%s --prompt hello 2>&1", d);
        CHECK(run(a, &o) == 2);
        CHECK(o && strstr(o, "tokenizer"));
        base_free(o);
    }
    /* broken model directories: exit 1 with the reader's message */
    char bad[600], cmd[4096];
    snprintf(bad, sizeof bad, "%s/broken", t_tmpdir);
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", bad, d, bad);
    CHECK(t_run(cmd, NULL) == 0);
    snprintf(cmd, sizeof cmd, "%s/config.json", bad);
    FILE *f = fopen(cmd, "w");
    if (f) { fputs("{\"hidden_size\": 8}", f); fclose(f); }
    snprintf(a, sizeof a, "%s --ids 1 2>/dev/null", bad);
    CHECK(run(a, NULL) == 1);
    snprintf(a, sizeof a, "%s/nonexistent --ids 1 2>/dev/null", t_tmpdir);
    CHECK(run(a, NULL) == 1);
    /* a truncated shard */
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && for f in %s/*.safetensors; do truncate -s 1000 $f; break; done",
             bad, d, bad, bad);
    CHECK(t_run(cmd, NULL) == 0);
    char *o = NULL;
    snprintf(a, sizeof a, "%s --ids 1 2>&1", bad);
    CHECK(run(a, &o) == 1);
    CHECK(o && strlen(o) > 10);
    base_free(o);
}
