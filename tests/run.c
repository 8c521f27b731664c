/*
 * run.c: the test runner. `test_runner [--list] [FILTER...]` runs every suite
 * whose name contains a filter, then replays each fuzz corpus (fuzz/corpus/T/ files)
 * through its entry point. Ends with the summary line "N passed, N failed".
 */
#include <dirent.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "test.h"

int t_checks, t_fails;
const char *t_tmpdir;

#define T(name) void test_##name(void);
#define F(name) int fz_##name(const uint8_t *data, size_t size);
#include "tests_list.h"
#undef T
#undef F

typedef struct { const char *name; void (*fn)(void); } suite;
typedef struct { const char *name; int (*fn)(const uint8_t *, size_t); } fuzz_target;
static const suite k_suites[] = {
#define T(name) {#name, test_##name},
#define F(name)
#include "tests_list.h"
#undef T
#undef F
    {NULL, NULL}};
static const fuzz_target k_fuzz[] = {
#define T(name)
#define F(name) {#name, fz_##name},
#include "tests_list.h"
#undef T
#undef F
    {NULL, NULL}};

int t_run(const char *cmd, char **out) {
    char full[8192];
    snprintf(full, sizeof full, "(%s) 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    sbuf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk - 1, p)) > 0) { chunk[n] = 0; sbuf_printf(&b, "%s", chunk); }
    int st = pclose(p);
    if (out) *out = b.s ? b.s : base_strdup("", MEM_MISC);
    else sbuf_free(&b);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char *t_write(const char *name, const void *data, size_t len) {
    static char paths[8][1024];
    static int k;
    char *p = paths[k++ % 8];
    snprintf(p, 1024, "%s/%s", t_tmpdir, name);
    FILE *f = fopen(p, "wb");
    if (f) { if (len) fwrite(data, 1, len, f); fclose(f); }
    return p;
}

const char *t_strata(void) { return "./strata"; }

const char *t_model(const char *name, const char *preset, int seed, int pack) {
    static struct { char name[64], dir[512]; } made[64];
    static int n_made;
    int i = 0;
    while (i < n_made && strcmp(made[i].name, name)) i++;
    if (i == n_made) {
        if (n_made == 64 || strlen(name) >= sizeof made[0].name) return NULL;
        n_made++;
        snprintf(made[i].name, sizeof made[i].name, "%s", name);
        snprintf(made[i].dir, sizeof made[i].dir, "%s/%s", t_tmpdir, name);
    }
    const char *d = made[i].dir;
    char probe[700], cmd[2048] = "";
    snprintf(probe, sizeof probe, "%s/config.json", d);
    if (!base_is_file(probe)) {
        char sd[32] = "";
        if (seed >= 0) snprintf(sd, sizeof sd, " --seed %d", seed);
        snprintf(cmd, sizeof cmd, "%s gen-model %s --preset %s%s >/dev/null 2>&1", t_strata(), d, preset, sd);
    }
    snprintf(probe, sizeof probe, "%s/strata.pack/manifest.json", d);
    if (pack && (cmd[0] || !base_is_file(probe))) {
        size_t k = strlen(cmd);
        snprintf(cmd + k, sizeof cmd - k, "%s%s pack %s >/dev/null 2>&1", k ? " && " : "", t_strata(), d);
    }
    if (cmd[0] && t_run(cmd, NULL) != 0) {
        fprintf(stderr, "  cannot make a model: %s\n", cmd);
        return NULL;
    }
    return d;
}

static int selected(const char *name, int argc, char **argv) {
    int any = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') continue;
        any = 1;
        if (strstr(name, argv[i])) return 1;
    }
    return !any;
}

static void replay(const fuzz_target *ft, int *passed, int *failed) {
    char dir[512];
    snprintf(dir, sizeof dir, "fuzz/corpus/%s", ft->name);
    DIR *d = opendir(dir);
    int n = 0, before = t_fails;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            uint8_t *buf; size_t len;
            if (base_read_file(path, 1 << 24, &buf, &len, NULL, 0)) continue;
            ft->fn(buf, len);
            base_free(buf);
            n++;
        }
        closedir(d);
    }
    printf("fuzz-replay %-20s %d inputs\n", ft->name, n);
    if (t_fails == before) (*passed)++; else (*failed)++;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) if (!strcmp(argv[i], "--list")) {
        for (const suite *s = k_suites; s->name; s++) printf("%s\n", s->name);
        for (const fuzz_target *f = k_fuzz; f->name; f++) printf("fuzz_%s\n", f->name);
        return 0;
    }
    char tmpl[] = "/tmp/strata-test-XXXXXX";
    t_tmpdir = mkdtemp(tmpl);
    if (!t_tmpdir) { perror("mkdtemp"); return 1; }
    int passed = 0, failed = 0;
    for (const suite *s = k_suites; s->name; s++) {
        if (!selected(s->name, argc, argv)) continue;
        int before = t_fails;
        double t0 = base_now();
        s->fn();
        int ok = t_fails == before;
        printf("%-4s %-32s %.2fs\n", ok ? "ok" : "FAIL", s->name, base_now() - t0);
        fflush(stdout);
        if (ok) passed++; else failed++;
    }
    for (const fuzz_target *f = k_fuzz; f->name; f++) {
        char nm[128];
        snprintf(nm, sizeof nm, "fuzz_%s", f->name);
        if (selected(nm, argc, argv)) replay(f, &passed, &failed);
    }
    base_rm_rf(t_tmpdir);
    printf("%d checks, %d check failures\n", t_checks, t_fails);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
