/*
 * t_arch_util.c: helpers the architecture suites share (t_deepseek.c,
 * t_kimi_linear.c, t_dsref.c): reading and editing config text, and the
 * budgets-below-size check, runs whose ids and logits dumps are compared, and
 * CLI runs whose exit code and output are checked (t_expect, also t_cli.c).
 * No TEST here; declared in test.h.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"

char *t_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = base_alloc((size_t)n + 1, MEM_MISC);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { base_free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

char *t_subst1(const char *s, const char *from, const char *to) {
    const char *p = strstr(s, from);
    if (!p) return NULL;
    size_t a = (size_t)(p - s), n = strlen(s) - strlen(from) + strlen(to);
    char *r = base_alloc(n + 1, MEM_MISC);
    memcpy(r, s, a);
    strcpy(r + a, to);
    strcat(r, p + strlen(from));
    return r;
}

double t_min_budget_mb(const char *dir, const char *args) {
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s %s --ram-gb 0.001", t_strata(), dir, args);
    t_run(cmd, &out);
    const char *at = out ? strstr(out, "needs at least ") : NULL;
    double min_mb = at ? atof(at + strlen("needs at least ")) : 0;
    base_free(out);
    return min_mb;
}

void t_budgets_agree(const char *dir, const char *args, double min_mb, int placed, const char *tag,
                     char budgets[3][64]) {
    char cmd[4096], *out = NULL, *first = NULL;
    budgets[0][0] = 0;
    snprintf(budgets[1], 64, "--ram-gb %.4f", min_mb * 1.1e-3);
    snprintf(budgets[2], 64, "--ram-gb %.4f", min_mb * 1.6e-3);
    for (int i = 0; i < 3; i++) {
        /* with placed, the first output line counts the stderr lines saying "placed" */
        if (placed)
            snprintf(cmd, sizeof cmd, "%s run %s %s --threads %d --dump-logits %s/%s_b.lg %s 2>&1 >%s/%s_b.ids | grep -c 'placed'; "
                     "cat %s/%s_b.ids; md5sum < %s/%s_b.lg", t_strata(), dir, args, i == 2 ? 1 : 2, t_tmpdir, tag, budgets[i],
                     t_tmpdir, tag, t_tmpdir, tag, t_tmpdir, tag);
        else
            snprintf(cmd, sizeof cmd, "%s run %s %s --threads %d --dump-logits %s/%s_b.lg %s >%s/%s_b.ids 2>/dev/null; "
                     "cat %s/%s_b.ids; md5sum < %s/%s_b.lg", t_strata(), dir, args, i == 2 ? 1 : 2, t_tmpdir, tag, budgets[i],
                     t_tmpdir, tag, t_tmpdir, tag, t_tmpdir, tag);
        t_run(cmd, &out);
        /* the budget runs stream (their load line says "placed"), the resident one does not */
        if (placed) CHECK_MSG(out && out[0] == (i ? '1' : '0'), "%s %s: %s", tag, budgets[i], out ? out : "");
        if (i == 0) { first = out; continue; }
        CHECK_MSG(first && out && !strcmp(first + placed, out + placed), "%s %s: %s vs resident %s", tag, budgets[i],
                  out ? out : "", first ? first : "");
        base_free(out);
    }
    base_free(first);
}

int t_run_logits(const char *m, const char *extra, const char *tag, int gen, char *ids, size_t n) {
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1,5,9,2,7,3,11,40 --gen %d --print-ids --dump-logits %s/lg.%s %s 2>%s/lg.%s.err",
             t_strata(), m, gen, t_tmpdir, tag, extra, t_tmpdir, tag);
    int rc = t_run(cmd, &out);
    snprintf(ids, n, "%s", out ? out : "");
    base_free(out);
    return rc;
}

int t_same_logits(const char *a, const char *b) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cmp -s %s/lg.%s %s/lg.%s", t_tmpdir, a, t_tmpdir, b);
    return t_run(cmd, NULL) == 0;
}

void t_config_refusals(const char *js, const char *tag, const t_refusal *k, size_t n) {
    char name[64];
    snprintf(name, sizeof name, "%s-refused.json", tag);
    for (size_t i = 0; i < n; i++) {
        char *m = t_subst1(js, k[i].from, k[i].to);
        CHECK_MSG(m != NULL, "%s", k[i].from);
        if (!m) continue;
        const char *path = t_write(name, m, strlen(m));
        base_free(m);
        char cmd[2048], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s inspect --config %s", t_strata(), path);
        CHECK(t_run(cmd, &out) == 1);
        CHECK_MSG(out && strstr(out, path) && strstr(out, k[i].msg), "%s: %s", k[i].to, out ? out : "");
        base_free(out);
    }
}

void t_expect(int rc, const char *cmd, ...) {
    char *out = NULL;
    const int got = t_run(cmd, &out);
    int ok = got == rc && out;
    va_list ap;
    va_start(ap, cmd);
    for (const char *s; ok && (s = va_arg(ap, const char *));) ok = strstr(out, s) != NULL;
    va_end(ap);
    CHECK_MSG(ok, "%s: exit %d (want %d):\n%s", cmd, got, rc, out ? out : "");
    base_free(out);
}
