/*
 * t_cli.c: hostile-user regressions of the command line (issue 38): batch text
 * output, what --force and output paths may replace, FIFOs given as inputs,
 * failed writes to stdout, and conflicting or out-of-range flags.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test.h"

static const char *cli_model(void) { return t_model("cli_model", "tiny", -1, 0); }

/* The text a single run prints for these ids, escaped as --batch prints a line. */
static char *single_text(const char *d, const char *ids) {
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "./strata run %s --ids %s --gen 8 2>/dev/null", d, ids);
    if (t_run(cmd, &o) != 0 || !o) { base_free(o); return NULL; }
    size_t n = strlen(o);
    if (n && o[n - 1] == '\n') o[--n] = 0; /* the run's closing newline */
    char *e = base_alloc(2 * n + 2, MEM_MISC);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (o[i] == '\n') { e[k++] = '\\'; e[k++] = 'n'; }
        else if (o[i] == '\\') { e[k++] = '\\'; e[k++] = '\\'; }
        else e[k++] = o[i];
    }
    e[k] = 0;
    base_free(o);
    return e;
}

TEST(cli_batch_text) {
    const char *d = cli_model();
    if (!d) { printf("  SKIP: no model\n"); return; }
    char tk[700];
    snprintf(tk, sizeof tk, "%s/tiktoken.model", d);
    if (!base_is_file(tk)) { printf("  SKIP: model has no tokenizer\n"); return; }
    const char *b = t_write("cli_batch.txt", "1,2,3\n4,5,6\n", 12);
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "./strata run %s --batch %s --gen 8 2>/dev/null", d, b);
    CHECK(t_run(cmd, &o) == 0);
    char *s1 = single_text(d, "1,2,3"), *s2 = single_text(d, "4,5,6");
    char want[8192];
    snprintf(want, sizeof want, "%s\n%s\n", s1 ? s1 : "?", s2 ? s2 : "?");
    CHECK_MSG(s1 && s2 && strlen(s1) > 0 && o && !strcmp(o, want), "batch '%s' vs single '%s'", o ? o : "", want);
    base_free(o);
    /* --batch-text: each line is text; replies are not empty */
    b = t_write("cli_batch_t.txt", "Hello world\nthe cat\n", 20);
    snprintf(cmd, sizeof cmd, "./strata run %s --batch %s --batch-text --gen 8 2>/dev/null", d, b);
    o = NULL;
    CHECK(t_run(cmd, &o) == 0);
    char *nl = o ? strchr(o, '\n') : NULL;
    CHECK_MSG(o && nl && nl != o && nl[1] && nl[1] != '\n', "batch-text output: '%s'", o ? o : "");
    base_free(o);
    base_free(s1);
    base_free(s2);
}

/* gen-model OUT --force replaces only a model gen-model wrote: a directory of
 * user files, a regular file, a FIFO, a symlink, a model with extra files or a
 * directory whose config.json lacks the generator's record are refused, named. */
TEST(cli_gen_force) {
    char d[700], cmd[4096], *o = NULL;
    snprintf(d, sizeof d, "%s/cli_force", t_tmpdir);
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", d, d);
    CHECK(t_run(cmd, NULL) == 0);
    struct { const char *setup, *what; } k[] = {
        {"mkdir %s/x && echo precious > %s/x/notes.txt", "notes.txt"},
        {"echo precious > %s/x", "regular file"},
        {"mkfifo %s/x", "FIFO"},
        {"mkdir %s/y && ln -s %s/y %s/x", "symbolic link"},
        {"mkdir %s/x && echo '{}' > %s/x/config.json", "strata_generator"},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char setup[2048];
        snprintf(cmd, sizeof cmd, "rm -rf %s/x %s/y", d, d);
        t_run(cmd, NULL);
        snprintf(setup, sizeof setup, k[i].setup, d, d, d);
        CHECK(t_run(setup, NULL) == 0);
        snprintf(cmd, sizeof cmd, "./strata gen-model %s/x --preset tiny --force --quiet 2>&1", d);
        o = NULL;
        int rc = t_run(cmd, &o);
        CHECK_MSG(rc == 1 && o && strstr(o, k[i].what) && strstr(o, "not replaced"), "%s: rc %d: %s", setup, rc, o ? o : "");
        base_free(o);
        /* what was there is still there */
        snprintf(cmd, sizeof cmd, "test -e %s/x -o -L %s/x", d, d);
        CHECK(t_run(cmd, NULL) == 0);
    }
    /* a previous model (with its pack) is replaced; once a user file joins it, it is not */
    snprintf(cmd, sizeof cmd, "rm -rf %s/x %s/y && ./strata gen-model %s/x --preset tiny --quiet >/dev/null 2>&1 && "
             "./strata pack %s/x --no-measure >/dev/null 2>&1 && ./strata gen-model %s/x --preset tiny --seed 3 --force --quiet >/dev/null 2>&1",
             d, d, d, d, d);
    CHECK(t_run(cmd, NULL) == 0);
    snprintf(cmd, sizeof cmd, "echo mine > %s/x/README.md && ./strata gen-model %s/x --preset tiny --force --quiet 2>&1", d, d);
    o = NULL;
    CHECK(t_run(cmd, &o) == 1 && o && strstr(o, "README.md"));
    base_free(o);
    snprintf(cmd, sizeof cmd, "test -f %s/x/README.md", d);
    CHECK(t_run(cmd, NULL) == 0);
}

/* A FIFO given where a file is read is refused at once, named, instead of
 * waiting forever for a writer: --prompt-file, --batch, chat /load, the model's
 * config.json and tokenizer_config.json, the pack pointer under XDG_CACHE_HOME. */
TEST(cli_fifo_inputs) {
    const char *d = cli_model();
    if (!d) { printf("  SKIP: no model\n"); return; }
    char f[700], m[700], x[700], cmd[8192], *o = NULL;
    snprintf(f, sizeof f, "%s/cli_fifo", t_tmpdir);
    snprintf(cmd, sizeof cmd, "rm -f %s && mkfifo %s", f, f);
    CHECK(t_run(cmd, NULL) == 0);
    /* timeout: 124 would be the hang this guards against */
    snprintf(cmd, sizeof cmd, "timeout 20 ./strata run %s --prompt-file %s 2>&1", d, f);
    int rc = t_run(cmd, &o);
    CHECK_MSG(rc == 2 && o && strstr(o, f) && strstr(o, "not a regular file"), "--prompt-file FIFO: %d %s", rc, o ? o : "");
    base_free(o);
    snprintf(cmd, sizeof cmd, "timeout 20 ./strata run %s --batch %s 2>&1", d, f);
    o = NULL;
    rc = t_run(cmd, &o);
    CHECK_MSG(rc == 2 && o && strstr(o, f) && strstr(o, "not a regular file"), "--batch FIFO: %d %s", rc, o ? o : "");
    base_free(o);
    snprintf(cmd, sizeof cmd, "printf '/load %s\\n' | timeout 20 ./strata chat %s --gen 2 2>&1", f, d);
    o = NULL;
    rc = t_run(cmd, &o);
    CHECK_MSG(rc == 1 && o && strstr(o, f) && strstr(o, "not a regular file"), "chat /load FIFO: %d %s", rc, o ? o : "");
    base_free(o);
    /* the model's own files as FIFOs */
    const char *names[] = {"config.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(m, sizeof m, "%s/cli_fifo_model", t_tmpdir);
        snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && rm %s/%s && mkfifo %s/%s", m, d, m, m, names[i], m, names[i]);
        CHECK(t_run(cmd, NULL) == 0);
        /* chat reads both (run reads tokenizer_config.json only when it is a file) */
        snprintf(cmd, sizeof cmd, "echo hi | timeout 20 ./strata chat %s --gen 1 2>&1", m);
        o = NULL;
        rc = t_run(cmd, &o);
        CHECK_MSG(rc == 1 && o && strstr(o, names[i]), "%s FIFO: %d %s", names[i], rc, o ? o : "");
        base_free(o);
    }
    /* the pointer to a pack kept elsewhere */
    snprintf(m, sizeof m, "%s/cli_fifo_model", t_tmpdir);
    snprintf(x, sizeof x, "%s/cli_xdg", t_tmpdir);
    snprintf(cmd, sizeof cmd, "rm -rf %s %s && cp -r %s %s && XDG_CACHE_HOME=%s ./strata pack %s --out %s/pk --no-measure >/dev/null 2>&1 && "
             "p=$(ls %s/strata/packs/* | head -1) && rm $p && mkfifo $p", m, x, d, m, x, m, x, x);
    CHECK(t_run(cmd, NULL) == 0);
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s timeout 20 ./strata run %s --ids 1 --gen 1 >/dev/null 2>&1", x, m);
    rc = t_run(cmd, NULL);
    CHECK_MSG(rc != 124, "pack pointer FIFO: %d", rc);
}

/* --json and --dump-logits: a FIFO, a device and /dev/stdout are written
 * directly, never renamed over; nothing inside the model directory (its files,
 * its pack, new names) is written. */
TEST(cli_out_paths) {
    const char *d = t_model("cli_packed", "tiny", -1, 1);
    if (!d) { printf("  SKIP: no model\n"); return; }
    char f[700], cmd[8192], *o = NULL;
    snprintf(f, sizeof f, "%s/cli_json_fifo", t_tmpdir);
    snprintf(cmd, sizeof cmd, "rm -f %s && mkfifo %s && (timeout 30 cat %s > %s.out 2>/dev/null </dev/null &) && timeout 20 ./strata run %s --ids 1,2 --gen 2 --json %s "
             ">/dev/null 2>&1 && sleep 0.2 && test -p %s && grep -q generated_ids %s.out", f, f, f, f, d, f, f, f);
    CHECK_MSG(t_run(cmd, NULL) == 0, "--json FIFO");
    /* a device and /dev/stdout: private copies (a pre-fix binary renamed over them,
     * which would damage the machine's own /dev as root) */
    char full[700], so[700];
    snprintf(full, sizeof full, "%s/cli_full", t_tmpdir);
    snprintf(so, sizeof so, "%s/cli_stdout", t_tmpdir);
    snprintf(cmd, sizeof cmd, "rm -f %s && mknod -m 666 %s c 1 7 2>/dev/null", full, full);
    if (t_run(cmd, NULL) == 0) {
        snprintf(cmd, sizeof cmd, "./strata run %s --ids 1,2 --gen 2 --json %s 2>&1", d, full);
        CHECK(t_run(cmd, &o) == 1 && o && strstr(o, full) && strstr(o, "No space left"));
        base_free(o);
        snprintf(cmd, sizeof cmd, "test -c %s", full);
        CHECK(t_run(cmd, NULL) == 0);
    } else printf("  (no mknod: the device case is skipped)\n");
    /* stdout into a pipe and into a file: the report follows the ids */
    snprintf(cmd, sizeof cmd, "rm -f %s && ln -s /proc/self/fd/1 %s", so, so);
    CHECK(t_run(cmd, NULL) == 0);
    snprintf(cmd, sizeof cmd, "./strata run %s --ids 1,2 --gen 2 --print-ids --json %s 2>/dev/null | cat", d, so);
    o = NULL;
    CHECK(t_run(cmd, &o) == 0 && o && strstr(o, "\"generated_ids\"") && o[0] != '{');
    base_free(o);
    snprintf(cmd, sizeof cmd, "./strata run %s --ids 1,2 --gen 2 --print-ids --json %s 2>/dev/null > %s/cli_so && cat %s/cli_so",
             d, so, t_tmpdir, t_tmpdir);
    o = NULL;
    CHECK(t_run(cmd, &o) == 0 && o && strstr(o, "\"generated_ids\"") && o[0] != '{');
    base_free(o);
    snprintf(cmd, sizeof cmd, "test -L %s", so);
    CHECK(t_run(cmd, NULL) == 0);
    /* the model directory: its pack's trunk, a shard, a new name */
    const char *in[] = {"strata.pack/trunk.bin", "strata.pack/new.bin", "config.json", "new.json"};
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 2; k++) {
            snprintf(cmd, sizeof cmd, "cp %s/strata.pack/trunk.bin %s/cli_trunk && ./strata run %s --ids 1 --gen 1 %s %s/%s 2>&1", d,
                     t_tmpdir, d, k ? "--json" : "--dump-logits", d, in[i]);
            o = NULL;
            int rc = t_run(cmd, &o);
            CHECK_MSG(rc == 1 && o && (strstr(o, "inside the model directory") || strstr(o, "model's own files")),
                      "%s %s: %d %s", k ? "--json" : "--dump-logits", in[i], rc, o ? o : "");
            base_free(o);
            snprintf(cmd, sizeof cmd, "cmp -s %s/strata.pack/trunk.bin %s/cli_trunk && test ! -e %s/new.json && test ! -e %s/strata.pack/new.bin",
                     d, t_tmpdir, d, d);
            CHECK(t_run(cmd, NULL) == 0);
        }
    }
}

/* Output that does not reach stdout is a failure (exit 1, the reason on stderr),
 * for every command. */
TEST(cli_stdout_full) {
    const char *d = cli_model();
    if (!d) { printf("  SKIP: no model\n"); return; }
    if (t_run("test -c /dev/full", NULL) != 0) { printf("  SKIP: no /dev/full\n"); return; }
    char cmd[4096], *o = NULL;
    const char *k[] = {"run %s --ids 1,2 --gen 3 --print-ids", "run %s --ids 1,2 --gen 3", "inspect %s", "plan %s --ram-gb 1",
                       "version"};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char a[1024];
        snprintf(a, sizeof a, k[i], d);
        snprintf(cmd, sizeof cmd, "./strata %s 2>&1 >/dev/full", a);
        o = NULL;
        int rc = t_run(cmd, &o);
        CHECK_MSG(rc == 1 && o && strstr(o, "writing to stdout failed: No space left on device"), "%s: %d %s", a, rc, o ? o : "");
        base_free(o);
    }
    snprintf(cmd, sizeof cmd, "echo hi | ./strata chat %s --gen 3 2>&1 >/dev/full", d);
    o = NULL;
    CHECK(t_run(cmd, &o) == 1 && o && strstr(o, "writing to stdout failed"));
    base_free(o);
    /* and a working stdout still gives 0 */
    snprintf(cmd, sizeof cmd, "./strata run %s --ids 1,2 --gen 3 --print-ids 2>/dev/null | cat >/dev/null", d);
    CHECK(t_run(cmd, NULL) == 0);
}

/* Conflicting or out-of-range flags are usage errors (2) naming them; a refused
 * chat line makes a scripted chat fail; /save names the user's path. */
TEST(cli_flags_and_messages) {
    const char *d = cli_model();
    if (!d) { printf("  SKIP: no model\n"); return; }
    char cmd[4096], *o = NULL;
    struct { const char *cmd, *want; } k[] = {
        {"run %s --ids 1 --ctx 4294967296", "[1, 16777216]"},
        {"run %s --ids 1 --ctx 1099511627776", "[1, 16777216]"},
        {"chat %s --ctx 4294967296", "[1, 16777216]"},
        {"run %s --ids 1 --ram-gb 1 --ram 1G", "--ram-gb and --ram"},
        {"chat %s --ram 1G --ram-gb 1", "--ram and --ram-gb"},
        {"plan %s --ram-gb 1 --ram 1G", "--ram-gb and --ram"},
        {"run %s --ids 1 --stop-eos --ignore-eos", "--stop-eos and --ignore-eos"},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char a[1024];
        snprintf(a, sizeof a, k[i].cmd, d);
        snprintf(cmd, sizeof cmd, "./strata %s </dev/null 2>&1", a);
        t_expect(2, cmd, k[i].want, NULL);
    }
    snprintf(cmd, sizeof cmd, "./strata run %s --ids 1,2,3,4,5 --ctx 3 2>&1", d);
    o = NULL;
    CHECK(t_run(cmd, &o) == 2 && o && strstr(o, "the prompt has 5 tokens"));
    base_free(o);
    /* a line the context cannot take: said, the chat goes on, the exit is 1 */
    char *big = base_alloc(20000, MEM_MISC);
    for (int i = 0; i < 19998; i++) big[i] = i % 6 == 5 ? ' ' : 'a' + i % 5;
    big[19998] = '\n';
    const char *in = t_write("cli_chat_in.txt", big, 19999);
    base_free(big);
    snprintf(cmd, sizeof cmd, "(cat %s; echo hi) | ./strata chat %s --gen 2 --ctx 400 2>&1", in, d);
    o = NULL;
    int rc = t_run(cmd, &o);
    CHECK_MSG(rc == 1 && o && strstr(o, "context is full") && strstr(o, "1 turns") && strstr(o, "1 input lines were refused"),
              "%d %s", rc, o ? o : "");
    base_free(o);
    snprintf(cmd, sizeof cmd, "printf '/save %s/no/such/dir/s.bin\\n' | ./strata chat %s --gen 2 2>&1", t_tmpdir, d);
    o = NULL;
    CHECK(t_run(cmd, &o) == 1 && o && strstr(o, "/no/such/dir/s.bin: No such file") && !strstr(o, ".tmp."));
    base_free(o);
}

/* SIGINT/SIGTERM mid-run leave no *.partial-PID file behind. */
TEST(cli_signal_cleanup) {
    const char *d = cli_model();
    if (!d) { printf("  SKIP: no model\n"); return; }
    char cmd[4096];
    for (int k = 0; k < 2; k++) {
        /* env --default-signal: a background job of a shell without job control
         * starts with SIGINT ignored */
        snprintf(cmd, sizeof cmd, "rm -f %s/cli_sig*; env --default-signal=INT ./strata run %s --ids 1 --gen 4000 --ctx 4096 --threads 1 "
                 "--dump-logits %s/cli_sig.bin >/dev/null 2>&1 & P=$!; for i in $(seq 100); do ls %s/cli_sig.bin.partial-* "
                 ">/dev/null 2>&1 && break; sleep 0.05; done; ls %s/cli_sig.bin.partial-* >/dev/null 2>&1 || exit 3; "
                 "kill -%s $P; wait $P; rc=$?; ls %s/cli_sig* >/dev/null 2>&1 && exit 4; test $rc -ge 128",
                 t_tmpdir, d, t_tmpdir, t_tmpdir, t_tmpdir, k ? "TERM" : "INT", t_tmpdir);
        int rc = t_run(cmd, NULL);
        CHECK_MSG(rc == 0, "SIG%s: %d (3: no partial file seen, 4: left behind)", k ? "TERM" : "INT", rc);
    }
}

/* issue 39: one option table. The values the CLI and the server share have one
 * range (strata_param): --temp and "temperature" are [0, 2], --repeat-penalty and
 * "repetition_penalty" (0, 100]; every command that takes a shared flag parses it
 * the same way (serve --ctx like run's, plan --threads like run's, serve's budget
 * flags exclusive like run's). */
TEST(cli_option_table) {
    char err[256];
    CHECK(strata_param_check(STRATA_PARAM_TEMP, 2, err, sizeof err) == STRATA_OK);
    CHECK(strata_param_check(STRATA_PARAM_TEMP, 2.5, err, sizeof err) == STRATA_EINVAL && strstr(err, "'temperature' must be in [0, 2]"));
    CHECK(strata_param_check(STRATA_PARAM_TOP_P, 0, err, sizeof err) == STRATA_EINVAL && strstr(err, "(0, 1]"));
    CHECK(strata_param_check(STRATA_PARAM_CTX, 1, err, sizeof err) == STRATA_OK);
    CHECK(strata_param_check(STRATA_PARAM_CTX, (1 << 24) + 1, err, sizeof err) == STRATA_EINVAL);
    CHECK(strata_param_check(STRATA_PARAM_SPEC, 1.5, err, sizeof err) == STRATA_EINVAL);
    CHECK(strata_param(STRATA_PARAM_COUNT) == NULL);
    double v = 0;
    CHECK(strata_param_parse(STRATA_PARAM_REPEAT_PENALTY, "100", &v) == 0 && v == 100);
    CHECK(strata_param_parse(STRATA_PARAM_REPEAT_PENALTY, "0", &v) != 0);
    const char *d = cli_model();
    if (!d) { printf("  SKIP: no model\n"); return; }
    char cmd[4096];
    struct { const char *cmd, *want; int rc; } k[] = {
        {"run %s --ids 1 --temp 3", "(a number in [0, 2])", 2},
        {"chat %s --temp 2.01", "(a number in [0, 2])", 2},
        {"run %s --ids 1 --repeat-penalty 200", "(in (0, 100])", 2},
        {"serve %s --ctx 0", "(an integer in [1, 16777216])", 2},
        {"serve %s --ctx 16777217", "(an integer in [1, 16777216])", 2},
        {"serve %s --ram-gb 1 --ram 1G --plan", "--ram-gb and --ram exclude each other", 2},
        {"serve %s --spec 17", "(an integer in [0, 16])", 2},
        {"serve %s --temp 1", "unknown option '--temp'", 2},
        {"plan %s --ram-gb 1 --threads 300", "bad value for --threads: '300' (1..256)", 2},
        {"plan %s --ram 0", "bad value for --ram: '0'", 2},
        {"serve %s --ctx 1 --plan", "plan:", 0},
        {"run %s --ids 1 --temp 2 --gen 2 --print-ids", "", 0},
        {"run --help", "--temp T             temperature in [0, 2]", 0},
        {"chat --help", "--no-preload", 0},
        {"serve --help", "--plan               print the memory plan", 0},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char a[1024];
        snprintf(a, sizeof a, k[i].cmd, d);
        snprintf(cmd, sizeof cmd, "./strata %s </dev/null 2>&1", a);
        t_expect(k[i].rc, cmd, k[i].want, NULL);
    }
}

/* docs/cli.md holds every command's --help and the preset list verbatim
 * (tools/cli_doc.sh writes them): the reference cannot drift from the binary. */
TEST(cli_doc_in_sync) {
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "bash tools/cli_doc.sh --check %s", t_strata());
    CHECK_MSG(t_run(cmd, &out) == 0, "%s", out ? out : "");
    base_free(out);
}
