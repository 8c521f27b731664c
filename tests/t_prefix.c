/*
 * t_prefix.c: prefix reuse through strata.h.
 *   prefix_identity: a chat's second turn (its prompt = the first turn's prompt,
 *                    reply and a new message) starts from a snapshot and gives
 *                    the ids and logits bits of a full re-prefill: RAM tier,
 *                    disk tier only, RAM spilling to disk, a reopened model
 *                    finding the files, snapshots mid-prompt, with speculation,
 *                    batched with other sequences, at a budget; the arena is in
 *                    the plan.
 *   prefix_hostile:  snapshot files damaged in every way (flipped bytes,
 *                    truncated, another model's, garbage under a good name, a
 *                    symlink, a directory) are refused and counted, the output
 *                    stays that of a full prefill, other files are never touched,
 *                    the directory stays within its bound.
 *   prefix_seq_api:  strata_seq_prefix_store / _restore over strata_step.
 *   faults_prefix:   file calls of spills and restores failing (vfs faults).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include "strata.h"
#include "test.h"
#include "vfs.h"

#define MAXT 200

typedef struct {
    int32_t ids[MAXT];
    int64_t n, reused;
    uint64_t lhash;
} gout;

static const char *px_model(void) { return t_model("px_tiny", "tiny", 21, 1); }

typedef struct {
    uint64_t ram, prefix_ram, dir_bytes;
    const char *dir;
    int64_t every, rows;
    int spec, max_seqs, plan_only;
} pxcfg;

static strata_model *px_load(const pxcfg *c) {
    char err[4096];
    strata_model *m = NULL;
    if (strata_model_open(&m, px_model(), err, sizeof err)) { fprintf(stderr, "  open: %s\n", err); return NULL; }
    strata_model_opts o = strata_model_opts_default();
    o.ram_bytes = c->ram;
    o.ctx = 256;
    o.rows = c->rows ? c->rows : 16;
    o.n_threads = 2;
    o.max_seqs = c->max_seqs ? c->max_seqs : 2;
    o.spec = c->spec;
    o.prefix_ram = c->prefix_ram;
    o.prefix_dir = c->dir;
    o.prefix_dir_bytes = c->dir_bytes;
    o.prefix_every = c->every;
    o.plan_only = c->plan_only;
    if (strata_model_load(m, &o, err, sizeof err)) {
        fprintf(stderr, "  load: %s\n", err);
        strata_model_close(m);
        return NULL;
    }
    return m;
}

/* Runs generators for prompts[0 .. n) on sequences of m, all in the same steps. */
static int gen_many(strata_model *m, const int32_t *const *prompts, const int64_t *np, int n, int prefix, int spec, gout *out) {
    char err[1024];
    strata_seq *s[4] = {0};
    strata_gen *g[4] = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        strata_gen_opts go = strata_gen_opts_default();
        go.temp = i % 2 ? 0.8 : 0;
        go.seed = 5 + (uint64_t)i;
        go.max_tokens = 12;
        go.stop_at_end = 0;
        go.want_logits = 1;
        go.prefix = prefix;
        go.spec = spec;
        if (strata_seq_create(m, &s[i], err, sizeof err) || strata_gen_create(&g[i], s[i], prompts[i], np[i], &go, 0, err, sizeof err)) {
            fprintf(stderr, "  gen: %s\n", err);
            rc = -1;
        }
    }
    while (!rc) {
        int a = strata_gen_step(m, g, n, NULL, NULL, err, sizeof err);
        if (a < 0) { fprintf(stderr, "  step: %s\n", err); rc = -1; }
        if (a <= 0) break;
    }
    for (int i = 0; i < n; i++) {
        if (!rc) {
            const int32_t *ids = strata_gen_ids(g[i], &out[i].n);
            memcpy(out[i].ids, ids, (size_t)out[i].n * sizeof(int32_t));
            out[i].lhash = strata_gen_logits_hash(g[i]);
            out[i].reused = strata_gen_reused(g[i]);
        }
        strata_gen_free(g[i]);
        strata_seq_free(s[i]);
    }
    return rc;
}

static int gen_one(strata_model *m, const int32_t *p, int64_t n, int prefix, gout *out) {
    return gen_many(m, &p, &n, 1, prefix, 0, out);
}

static int same(const gout *a, const gout *b) {
    return a->n == b->n && a->lhash == b->lhash && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof(int32_t));
}

/* Turn 1: p1 (n1 ids). Turn 2: p1, turn 1's reply but its last id, 5 new ids. */
static int64_t turn2(const int32_t *p1, int64_t n1, const gout *r1, int32_t *p2) {
    memcpy(p2, p1, (size_t)n1 * sizeof(int32_t));
    int64_t n = n1;
    for (int64_t i = 0; i + 1 < r1->n; i++) p2[n++] = r1->ids[i];
    for (int i = 0; i < 5; i++) p2[n++] = 100 + 7 * i;
    return n;
}

static void make_prompt(int32_t *p, int64_t n, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (int32_t)((seed >> 8) % 250) + 3;
    }
}

/* The two-turn check on m: turn 2 restores `want` positions (-1: any > 0) and
 * equals the full prefill of ref (the same model, prefix off). */
static void two_turns(strata_model *m, const char *what, const int32_t *p1, int64_t n1, int64_t want) {
    gout r1, r2, full;
    int32_t p2[MAXT];
    if (gen_one(m, p1, n1, 1, &r1)) { CHECK(0); return; }
    const int64_t n2 = turn2(p1, n1, &r1, p2);
    if (gen_one(m, p2, n2, 0, &full) || gen_one(m, p2, n2, 1, &r2)) { CHECK(0); return; }
    CHECK_MSG(same(&r2, &full), "%s: turn 2 from the snapshot differs from a full prefill", what);
    CHECK_MSG(want < 0 ? r2.reused > 0 : r2.reused == want, "%s: %lld positions reused (want %lld)", what, (long long)r2.reused,
              (long long)want);
}

static int count_files(const char *dir, const char *suffix, uint64_t *bytes) {
    char cmd[1200], *out = NULL;
    snprintf(cmd, sizeof cmd, "ls %s | grep -c '%s$'; du -cb %s/*%s 2>/dev/null | tail -1", dir, suffix, dir, suffix);
    t_run(cmd, &out);
    int n = out ? atoi(out) : 0;
    const char *nl = out ? strchr(out, '\n') : NULL;
    if (bytes) *bytes = nl ? strtoull(nl + 1, NULL, 10) : 0;
    base_free(out);
    return n;
}

TEST(prefix_identity) {
    if (!px_model()) { CHECK(0); return; }
    int32_t p1[40];
    make_prompt(p1, 40, 3);
    strata_stats st;

    /* RAM tier: turn 2 starts from turn 1's final state (40 + 12 - 1 = 51 positions) */
    strata_model *m = px_load(&(pxcfg){.prefix_ram = 8u << 20});
    if (!m) { CHECK(0); return; }
    two_turns(m, "ram", p1, 40, 51);
    strata_model_get_stats(m, &st);
    CHECK(st.prefix_hits >= 1 && st.prefix_tokens >= 51 && st.prefix_disk_hits == 0 && st.prefix_ram_used > 0);
    /* an unrelated prompt: a miss, same output as without the cache */
    {
        int32_t q[30];
        make_prompt(q, 30, 99);
        gout a, b;
        CHECK(gen_one(m, q, 30, 1, &a) == 0 && gen_one(m, q, 30, 0, &b) == 0 && same(&a, &b) && a.reused == 0);
        /* the same prompt again: its end (30) is one past what may be restored
         * (the last token's logits are needed), and there is no boundary below */
        CHECK(gen_one(m, q, 30, 1, &a) == 0 && same(&a, &b) && a.reused == 0);
        /* one token more: the 30 restored */
        int32_t q2[31];
        memcpy(q2, q, sizeof q);
        q2[30] = 7;
        CHECK(gen_one(m, q2, 31, 1, &a) == 0 && gen_one(m, q2, 31, 0, &b) == 0 && same(&a, &b) && a.reused == 30);
    }
    /* a prompt diverging mid-way restores the last boundary before the divergence
     * (every 256 by default: none here) or the end of an earlier prompt */
    {
        int32_t q[60];
        memcpy(q, p1, sizeof p1);
        make_prompt(q + 40, 20, 5);
        gout a, b;
        CHECK(gen_one(m, q, 60, 1, &a) == 0 && gen_one(m, q, 60, 0, &b) == 0 && same(&a, &b) && a.reused == 40);
    }
    /* batched: a restored sequence stepped with a fresh one; each as without the cache */
    {
        int32_t q[30], p2[MAXT];
        make_prompt(q, 30, 77);
        gout r1, solo, both[2], plain[2];
        CHECK(gen_one(m, p1, 40, 0, &r1) == 0);
        const int64_t n2 = turn2(p1, 40, &r1, p2);
        const int32_t *ps[2] = {p2, q};
        const int64_t ns[2] = {n2, 30};
        CHECK(gen_one(m, p2, n2, 0, &solo) == 0);
        CHECK(gen_many(m, ps, ns, 2, 1, 0, both) == 0 && gen_many(m, ps, ns, 2, 0, 0, plain) == 0);
        CHECK(both[0].reused == 51 && same(&both[0], &solo) && same(&both[0], &plain[0]) && same(&both[1], &plain[1]));
    }
    strata_model_close(m);

    /* snapshots every 8 positions, rows of 5 (a run ends at each boundary): a
     * prompt sharing 29 tokens with an earlier one restores 24 */
    m = px_load(&(pxcfg){.prefix_ram = 8u << 20, .every = 8, .rows = 5});
    if (!m) { CHECK(0); return; }
    {
        int32_t q[50];
        memcpy(q, p1, 29 * sizeof(int32_t));
        make_prompt(q + 29, 21, 8);
        gout a, b, c;
        CHECK(gen_one(m, p1, 40, 1, &a) == 0);
        CHECK(gen_one(m, q, 50, 1, &b) == 0 && gen_one(m, q, 50, 0, &c) == 0 && same(&b, &c));
        CHECK_MSG(b.reused == 24, "boundary reuse %lld", (long long)b.reused);
    }
    two_turns(m, "every 8, rows 5", p1, 40, 51);
    strata_model_close(m);

    /* disk tier only (no RAM for snapshots), then a new model on the same files */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/pxdisk", t_tmpdir);
    m = px_load(&(pxcfg){.dir = dir});
    if (!m) { CHECK(0); return; }
    two_turns(m, "disk", p1, 40, 51);
    strata_model_get_stats(m, &st);
    CHECK(st.prefix_disk_hits >= 1 && st.prefix_spills >= 2 && st.prefix_disk_written > 0 && st.prefix_disk_read > 0 && st.prefix_ram_bytes == 0);
    strata_model_close(m);
    CHECK(count_files(dir, ".strp", NULL) >= 2);
    m = px_load(&(pxcfg){.dir = dir, .prefix_ram = 1u << 20});
    if (!m) { CHECK(0); return; }
    {
        gout r1, r2, full;
        int32_t p2[MAXT];
        CHECK(gen_one(m, p1, 40, 0, &r1) == 0);
        const int64_t n2 = turn2(p1, 40, &r1, p2);
        CHECK(gen_one(m, p2, n2, 0, &full) == 0 && gen_one(m, p2, n2, 1, &r2) == 0);
        CHECK_MSG(same(&r2, &full) && r2.reused == 51, "reopened: reused %lld", (long long)r2.reused);
        strata_model_get_stats(m, &st);
        CHECK(st.prefix_disk_hits == 1);
    }
    strata_model_close(m);

    /* a RAM tier holding one snapshot spills the older ones to disk */
    char dir2[600];
    snprintf(dir2, sizeof dir2, "%s/pxspill", t_tmpdir);
    m = px_load(&(pxcfg){.dir = dir2, .prefix_ram = 96u << 10});
    if (!m) { CHECK(0); return; }
    {
        int32_t q[3][31];
        gout a[3], b;
        for (int i = 0; i < 3; i++) {
            make_prompt(q[i], 31, 200 + (uint32_t)i);
            CHECK(gen_one(m, q[i], 30, 1, &a[i]) == 0 && gen_one(m, q[i], 31, 0, &a[i]) == 0);
        }
        for (int i = 0; i < 3; i++) CHECK(gen_one(m, q[i], 31, 1, &b) == 0 && same(&b, &a[i]) && b.reused == 30);
        strata_model_get_stats(m, &st);
        CHECK_MSG(st.prefix_spills >= 2 && st.prefix_disk_hits >= 2 && st.prefix_ram_used <= st.prefix_ram_bytes,
                  "spills %llu disk hits %llu", (unsigned long long)st.prefix_spills, (unsigned long long)st.prefix_disk_hits);
    }
    strata_model_close(m);

    /* speculation (n-gram drafts) after a restored prefix */
    m = px_load(&(pxcfg){.prefix_ram = 8u << 20, .spec = 3});
    if (!m) { CHECK(0); return; }
    {
        int32_t rep[48];
        for (int i = 0; i < 48; i++) rep[i] = p1[i % 12]; /* repeats: drafts are proposed */
        gout r1, r2, full;
        int32_t p2[MAXT];
        const int32_t *pp = rep;
        int64_t nn = 48;
        CHECK(gen_many(m, &pp, &nn, 1, 1, 3, &r1) == 0);
        const int64_t n2 = turn2(rep, 48, &r1, p2);
        pp = p2;
        nn = n2;
        CHECK(gen_many(m, &pp, &nn, 1, 0, 0, &full) == 0 && gen_many(m, &pp, &nn, 1, 1, 3, &r2) == 0);
        CHECK(same(&r2, &full) && r2.reused == 48 + 11);
    }
    strata_model_close(m);

    /* at a budget: the arena is in the plan; auto sizing fits the budget */
    {
        strata_model *a = px_load(&(pxcfg){.ram = 1ull << 40});
        strata_model *b = px_load(&(pxcfg){.ram = 1ull << 40, .prefix_ram = 4u << 20});
        strata_model_info ia, ib;
        if (a && b) {
            strata_model_get_info(a, &ia);
            strata_model_get_info(b, &ib);
            CHECK_MSG(ib.plan_bytes >= ia.plan_bytes + (4u << 20), "plan %llu vs %llu", (unsigned long long)ib.plan_bytes,
                      (unsigned long long)ia.plan_bytes);
            /* the minimum counts the process as it stands (its RSS), which the
             * two models above have grown: take it again with them closed, from
             * a plan alone (under ASan freed memory stays resident) */
            strata_model_close(a);
            strata_model_close(b);
            a = px_load(&(pxcfg){.ram = 1ull << 40, .plan_only = 1});
            CHECK(a != NULL);
            if (a) strata_model_get_info(a, &ia);
            const uint64_t budget = ia.min_bytes + (24u << 20);
            b = px_load(&(pxcfg){.ram = budget, .prefix_ram = STRATA_PREFIX_AUTO});
            CHECK(b != NULL);
            if (b) {
                strata_model_get_stats(b, &st);
                strata_model_get_info(b, &ib);
                CHECK_MSG(st.prefix_ram_bytes > 0 && st.prefix_ram_bytes <= (6u << 20) && ib.plan_bytes <= budget,
                          "auto %llu plan %llu budget %llu", (unsigned long long)st.prefix_ram_bytes,
                          (unsigned long long)ib.plan_bytes, (unsigned long long)budget);
                two_turns(b, "budget", p1, 40, 51);
            }
            /* with a directory, auto gives snapshots no RAM at a budget: files only */
            strata_model_close(b);
            char adir[600];
            snprintf(adir, sizeof adir, "%s/pxauto", t_tmpdir);
            b = px_load(&(pxcfg){.ram = budget, .prefix_ram = STRATA_PREFIX_AUTO, .dir = adir});
            CHECK(b != NULL);
            if (b) {
                two_turns(b, "budget + dir", p1, 40, 51);
                strata_model_get_stats(b, &st);
                CHECK(st.prefix_ram_bytes == 0 && st.prefix_disk_hits == 1);
            }
        } else {
            CHECK(0);
        }
        strata_model_close(a);
        strata_model_close(b);
    }
}

/* Writes n bytes at off of path (a flipped byte, or garbage). */
static void poke(const char *path, long off, const void *p, size_t n) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, off, off < 0 ? SEEK_END : SEEK_SET);
    fwrite(p, 1, n, f);
    fclose(f);
}

/* The library's warnings, captured (the refusals must name file and reason). */
static char g_log[16384];
static void cap_log(void *ud, int level, const char *msg) {
    (void)ud;
    (void)level;
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof g_log - n, "%s\n", msg);
}

TEST(prefix_hostile) {
    if (!px_model()) { CHECK(0); return; }
    char dir[600], cmd[2400], *out = NULL;
    snprintf(dir, sizeof dir, "%s/pxhostile", t_tmpdir);
    int32_t p1[40];
    make_prompt(p1, 40, 3);
    gout r1, full, r2;
    int32_t p2[MAXT];
    strata_model *m = px_load(&(pxcfg){.dir = dir});
    if (!m) { CHECK(0); return; }
    CHECK(gen_one(m, p1, 40, 1, &r1) == 0); /* files at 40 (prompt) and 51 (end) */
    const int64_t n2 = turn2(p1, 40, &r1, p2);
    CHECK(gen_one(m, p2, n2, 0, &full) == 0);
    strata_model_close(m);
    /* a file of somebody else's with our suffix, and one under a name that is not ours */
    const char *foreign = "precious bytes";
    snprintf(cmd, sizeof cmd, "cd %s && printf '%s' > notes.strp && printf '%s' > 0000000000000000-5-0000000000000000.strp && ls", dir,
             foreign, foreign);
    t_run(cmd, &out);
    base_free(out);

    /* each damage in turn: the file at 51 refused, the one at 40 used instead */
    static const char *const kinds[] = {"flip-body", "flip-header", "truncate", "trailer", "garbage", "symlink", "directory", "nan"};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        /* recreate the snapshots */
        snprintf(cmd, sizeof cmd, "rm -rf %s/*-51-*.strp", dir);
        t_run(cmd, NULL);
        m = px_load(&(pxcfg){.dir = dir});
        if (!m) { CHECK(0); return; }
        CHECK(gen_one(m, p1, 40, 1, &r1) == 0);
        strata_model_close(m);
        out = NULL;
        snprintf(cmd, sizeof cmd, "ls %s/*-51-*.strp", dir);
        t_run(cmd, &out);
        char path[1024] = {0};
        if (out) sscanf(out, "%1023s", path);
        base_free(out);
        CHECK_MSG(path[0] && base_is_file(path), "no snapshot at 51 (%s)", kinds[k]);
        if (!path[0]) continue;
        const char *kd = kinds[k];
        if (!strcmp(kd, "flip-body")) poke(path, 4000, "\x5a\x5a", 2);
        else if (!strcmp(kd, "flip-header")) poke(path, 9, "\x01", 1);
        else if (!strcmp(kd, "truncate")) { CHECK(truncate(path, 1000) == 0); }
        else if (!strcmp(kd, "trailer")) poke(path, -3, "\x00", 1);
        else if (!strcmp(kd, "garbage")) { /* the right size, not a snapshot */
            struct stat sb;
            FILE *f = stat(path, &sb) ? NULL : fopen(path, "wb");
            for (off_t i = 0; f && i < sb.st_size; i++) fputc('x', f);
            if (f) fclose(f);
        }
        else if (!strcmp(kd, "symlink")) { unlink(path); CHECK(symlink("/dev/zero", path) == 0); }
        else if (!strcmp(kd, "directory")) { unlink(path); CHECK(mkdir(path, 0755) == 0); }
        else if (!strcmp(kd, "nan")) {
            /* non-finite state under a valid checksum is refused too */
            uint8_t *buf = NULL;
            size_t len = 0;
            if (!base_read_file(path, 1 << 26, &buf, &len, NULL, 0) && len > 40 + 51 * 4 + 72) {
                memcpy(buf + 40 + 51 * 4 + 64, "\x00\x00\xc0\x7f", 4);
                const uint64_t h = XXH3_64bits(buf, len - 8);
                memcpy(buf + len - 8, &h, 8);
                FILE *f = fopen(path, "wb");
                if (f) { fwrite(buf, 1, len, f); fclose(f); }
            }
            base_free(buf);
        }
        m = px_load(&(pxcfg){.dir = dir});
        if (!m) { CHECK(0); return; }
        g_log[0] = 0;
        base_log_set(cap_log, NULL);
        CHECK(gen_one(m, p2, n2, 1, &r2) == 0);
        base_log_set(NULL, NULL);
        CHECK_MSG(same(&r2, &full), "%s: output differs from a full prefill", kd);
        strata_stats st;
        strata_model_get_stats(m, &st);
        const int refusable = strcmp(kd, "symlink") && strcmp(kd, "directory"); /* not even indexed */
        CHECK_MSG(r2.reused == 40, "%s: reused %lld (want the prompt's 40)", kd, (long long)r2.reused);
        CHECK_MSG(!refusable || st.prefix_rejected == 1, "%s: %llu refused", kd, (unsigned long long)st.prefix_rejected);
        static const char *const why[] = {"checksum mismatch", "different model", "bytes, a snapshot of 51 positions", "checksum mismatch",
                                          "not a strata prefix snapshot", "", "", "non-finite"};
        CHECK_MSG(!refusable || (strstr(g_log, path) && strstr(g_log, why[k]) && strstr(g_log, "a miss")), "%s: logged '%s'", kd, g_log);
        strata_model_close(m);
        if (!strcmp(kd, "directory")) rmdir(path);
        if (!strcmp(kd, "symlink")) unlink(path);
    }
    /* random damage: a pristine file at 51, then 1-8 random bytes of it changed
     * (or the file cut) each round; refused or, when the bytes happened not to
     * matter, used: the output is that of a full prefill either way */
    {
        snprintf(cmd, sizeof cmd, "rm -rf %s/*-51-*.strp", dir);
        t_run(cmd, NULL);
        m = px_load(&(pxcfg){.dir = dir});
        if (m) { CHECK(gen_one(m, p1, 40, 1, &r1) == 0); strata_model_close(m); }
        out = NULL;
        snprintf(cmd, sizeof cmd, "ls %s/*-51-*.strp", dir);
        t_run(cmd, &out);
        char path[1024] = {0};
        if (out) sscanf(out, "%1023s", path);
        base_free(out);
        uint8_t *good = NULL;
        size_t len = 0;
        CHECK(path[0] && !base_read_file(path, 1 << 26, &good, &len, NULL, 0));
        uint64_t rng = 99;
        for (int round = 0; good && round < 8; round++) {
            uint8_t *b = base_alloc(len, MEM_MISC);
            memcpy(b, good, len);
            size_t n = len;
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            if (round % 4 == 3) n = (size_t)(rng >> 33) % len; /* cut */
            for (int k = 0, nk = 1 + (int)((rng >> 20) % 8); k < nk && round % 4 != 3; k++) {
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                b[(rng >> 33) % len] ^= (uint8_t)(1 + (rng >> 13) % 255);
            }
            FILE *f = fopen(path, "wb");
            if (f) { fwrite(b, 1, n, f); fclose(f); }
            base_free(b);
            m = px_load(&(pxcfg){.dir = dir});
            if (!m) { CHECK(0); break; }
            base_log_set(cap_log, NULL);
            CHECK(gen_one(m, p2, n2, 1, &r2) == 0);
            base_log_set(NULL, NULL);
            g_log[0] = 0;
            CHECK_MSG(same(&r2, &full) && (r2.reused == 40 || r2.reused == 51), "random damage round %d: reused %lld", round,
                      (long long)r2.reused);
            strata_model_close(m);
        }
        base_free(good);
    }
    /* what is not ours is never removed */
    snprintf(cmd, sizeof cmd, "%s/notes.strp", dir);
    CHECK(base_is_file(cmd));
    snprintf(cmd, sizeof cmd, "%s/0000000000000000-5-0000000000000000.strp", dir);
    CHECK(base_is_file(cmd));

    /* the bound: three prompts' snapshots into room for about two files */
    char dir2[600];
    snprintf(dir2, sizeof dir2, "%s/pxbound", t_tmpdir);
    m = px_load(&(pxcfg){.dir = dir2});
    uint64_t two = 0;
    if (m) {
        int32_t q[30];
        make_prompt(q, 30, 1);
        CHECK(gen_one(m, q, 30, 1, &r1) == 0); /* files at 30 and 41 */
        strata_model_close(m);
        CHECK(count_files(dir2, ".strp", &two) == 2);
    }
    const uint64_t bound = two + two / 3;
    m = px_load(&(pxcfg){.dir = dir2, .dir_bytes = bound});
    if (m) {
        for (uint32_t i = 0; i < 3; i++) {
            int32_t q[30];
            make_prompt(q, 30, 10 + i);
            CHECK(gen_one(m, q, 30, 1, &r1) == 0);
        }
        strata_model_close(m);
        uint64_t bytes = 0;
        const int n = count_files(dir2, ".strp", &bytes);
        CHECK_MSG(n >= 1 && bytes <= bound, "%d files, %llu bytes over a bound of %llu", n, (unsigned long long)bytes,
                  (unsigned long long)bound);
    } else {
        CHECK(0);
    }
}

TEST(prefix_seq_api) {
    if (!px_model()) { CHECK(0); return; }
    char err[1024];
    strata_model *m = px_load(&(pxcfg){.prefix_ram = 4u << 20, .max_seqs = 2});
    strata_model *plain = px_load(&(pxcfg){0});
    if (!m || !plain) { CHECK(0); strata_model_close(m); strata_model_close(plain); return; }
    strata_seq *a = NULL, *b = NULL, *c = NULL;
    CHECK(strata_seq_create(m, &a, err, sizeof err) == 0 && strata_seq_create(m, &b, err, sizeof err) == 0);
    CHECK(strata_seq_create(plain, &c, err, sizeof err) == 0);
    CHECK(strata_seq_prefix_store(c, err, sizeof err) == STRATA_EINVAL);
    strata_model_info info;
    strata_model_get_info(m, &info);
    const size_t V = (size_t)info.vocab;
    float *la = base_alloc(V * sizeof(float), MEM_MISC), *lb = base_alloc(V * sizeof(float), MEM_MISC);
    int32_t p[20];
    make_prompt(p, 20, 4);
    strata_row rows[20];
    for (int i = 0; i < 20; i++) rows[i] = (strata_row){a, p[i], 0};
    rows[19].logits = 1;
    CHECK(strata_step(m, rows, 13, NULL, err, sizeof err) == 0);
    CHECK(strata_seq_prefix_store(a, err, sizeof err) == 0);
    CHECK(strata_step(m, rows + 13, 7, la, err, sizeof err) == 0);
    /* b from the snapshot at 13, then the 7 other tokens */
    CHECK(strata_seq_prefix_restore(b, p, 12, err, sizeof err) == 0 && strata_seq_pos(b) == 0);
    CHECK(strata_seq_prefix_restore(b, p, 19, err, sizeof err) == 13 && strata_seq_pos(b) == 13);
    CHECK(!memcmp(strata_seq_tokens(b), p, 13 * sizeof(int32_t)));
    for (int i = 13; i < 20; i++) rows[i].seq = b;
    CHECK(strata_step(m, rows + 13, 7, lb, err, sizeof err) == 0);
    CHECK_MSG(!memcmp(la, lb, V * sizeof(float)), "logits after a restored prefix differ");
    base_free(la);
    base_free(lb);
    strata_seq_free(a);
    strata_seq_free(b);
    strata_seq_free(c);
    strata_model_close(m);
    strata_model_close(plain);
}

/* The file calls of a store (spill) and a restore failing in turn (EIO, ENOSPC,
 * short transfers, EINTR): turn 2 still equals a full prefill, nothing crashes,
 * and a failed write leaves no file behind that a later lookup would use. */
TEST(faults_prefix) {
    if (!px_model()) { CHECK(0); return; }
    static const int kinds[] = {VFS_FAULT_EIO, VFS_FAULT_ENOSPC, VFS_FAULT_SHORT, VFS_FAULT_EINTR};
    char dir[600];
    snprintf(dir, sizeof dir, "%s/pxfault", t_tmpdir);
    strata_model *m = px_load(&(pxcfg){.dir = dir});
    if (!m) { CHECK(0); return; }
    base_log_set(cap_log, NULL); /* the expected warnings */
    uint64_t calls = 0;
    uint32_t seed = 1000;
    /* every 8th call from a per-kind offset (~48 calls: 6 per kind); every call
     * with STRATA_TEST_FAULTS=full (make faults) */
    const char *full_env = getenv("STRATA_TEST_FAULTS");
    const uint64_t stride = full_env && !strcmp(full_env, "full") ? 1 : 8;
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        for (uint64_t n = calls ? 1 + (stride > 1 ? k * 2 : 0) : 1; n <= (calls ? calls : 1); n += calls ? stride : 1) {
            /* a new conversation each time: the faults hit its own files */
            int32_t p1[40], p2[MAXT];
            make_prompt(p1, 40, seed++);
            gout r1, full, a, b;
            if (gen_one(m, p1, 40, 0, &r1)) { CHECK(0); break; }
            const int64_t n2 = turn2(p1, 40, &r1, p2);
            if (gen_one(m, p2, n2, 0, &full)) { CHECK(0); break; }
            vfs_fault_set(calls ? kinds[k] : VFS_FAULT_COUNT, calls ? n : 0);
            const int ra = gen_one(m, p1, 40, 1, &a), rb = gen_one(m, p2, n2, 1, &b);
            if (!calls) calls = vfs_fault_calls();
            vfs_fault_set(VFS_FAULT_OFF, 0);
            CHECK_MSG(ra == 0 && rb == 0 && same(&b, &full), "fault %s at call %llu: turn 2 differs", vfs_fault_name(kinds[k]),
                      (unsigned long long)n);
            g_log[0] = 0;
        }
    }
    base_log_set(NULL, NULL);
    strata_model_close(m);
    CHECK_MSG(calls >= 8, "%llu calls", (unsigned long long)calls); /* files written (open, writes, rename), one read */
}
