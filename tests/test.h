/*
 * test.h: the test harness. CHECK counts a failure and goes on; a suite is a
 * function declared with TEST(name) in tests/t_*.c and is registered by the
 * Makefile (grep), so no shared table is edited.
 */
#ifndef STRATA_TEST_H
#define STRATA_TEST_H

#include <math.h>
#include <stdio.h>
#include "base.h"

extern int t_checks, t_fails;
extern const char *t_tmpdir; /* per-run scratch directory, removed at exit */

#define TEST(name) void test_##name(void)
#define CHECK(x) do { t_checks++; if (!(x)) { t_fails++; \
    fprintf(stderr, "  FAIL %s:%d: %s\n", __FILE__, __LINE__, #x); } } while (0)
#define CHECK_MSG(x, ...) do { t_checks++; if (!(x)) { t_fails++; \
    fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #x); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_NEAR(a, b, atol, rtol) do { double a_ = (a), b_ = (b); t_checks++; \
    if (!(fabs(a_ - b_) <= (atol) + (rtol) * fabs(b_))) { t_fails++; \
    fprintf(stderr, "  FAIL %s:%d: %s = %.9g vs %s = %.9g\n", __FILE__, __LINE__, #a, a_, #b, b_); } } while (0)

/* Runs `cmd` through /bin/sh; returns its exit status (or -1); stdout and stderr
 * captured into *out (MEM_MISC, caller frees) when out != NULL. */
int t_run(const char *cmd, char **out);
/* Writes bytes to t_tmpdir/name and returns the path (static buffer rotation of 8). */
const char *t_write(const char *name, const void *data, size_t len);
/* Path of the freshly built CLI binary ("./strata"). */
const char *t_strata(void);
/* The generated model t_tmpdir/NAME, made once per run: `strata gen-model`
 * from preset (with --seed when seed >= 0), then `strata pack` when pack.
 * Returns its path (the same buffer for the same name) or NULL, the failing
 * command on stderr. Tests that change a model's files make their own. */
const char *t_model(const char *name, const char *preset, int seed, int pack);

/* Shared by the architecture suites (tests/t_arch_util.c). */
/* The whole file at path, NUL-terminated (MEM_MISC, caller frees), or NULL. */
/* `strata run m --ids 1,5,9,2,7,3,11,40 --gen gen --print-ids EXTRA`: the ids into
 * ids, the logits dump into t_tmpdir/lg.TAG (stderr into lg.TAG.err); the exit
 * code. t_same_logits: the dumps of two tags are byte-identical. */
int t_run_logits(const char *m, const char *extra, const char *tag, int gen, char *ids, size_t n);
int t_same_logits(const char *a, const char *b);
/* Each edit (from -> to) of config text js makes `strata inspect --config` exit 1
 * naming the file and msg (written to t_tmpdir/TAG-refused.json). */
typedef struct t_refusal { const char *from, *to, *msg; } t_refusal;
void t_config_refusals(const char *js, const char *tag, const t_refusal *k, size_t n);
char *t_slurp(const char *path);
/* Runs cmd (t_run): a failed check, naming cmd and showing its output, unless it
 * exits rc and its output contains every string before the NULL. */
void t_expect(int rc, const char *cmd, ...) __attribute__((sentinel));
/* s with the first `from` replaced by `to` (MEM_MISC, caller frees); NULL when
 * from is not in s. */
char *t_subst1(const char *s, const char *from, const char *to);
/* The minimum budget in MB that `strata run DIR ARGS --ram-gb 0.001` names in its
 * refusal ("needs at least N MB"); 0 when it names none. */
double t_min_budget_mb(const char *dir, const char *args);
/* `strata run DIR ARGS --dump-logits` resident, at 1.1x min_mb and at 1.6x with one
 * thread: the ids and logits bits of the budget runs equal the resident run's;
 * with placed, the budget runs also say "placed" (streamed) and the resident one
 * does not. budgets[i] gets each run's option ("" resident), for a reference
 * check after; tag names the scratch files and the failure messages. */
void t_budgets_agree(const char *dir, const char *args, double min_mb, int placed, const char *tag,
                     char budgets[3][64]);

#endif
