/* t_pack.c: the streaming layout: pack, manifest, verify, refusals, corruption. */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "gen.h"
#include "jsonx.h"
#include "pack.h"
#include "preset.h"
#include "strata.h"
#include "test.h"

/* Generates preset `name` (seed) into t_tmpdir/dir once per run; returns its path. */
const char *tpack_model(const char *name, const char *dir, uint64_t seed);
const char *tpack_model(const char *name, const char *dir, uint64_t seed) {
    static char paths[8][1024];
    static int n;
    char *p = paths[n++ % 8];
    snprintf(p, 1024, "%s/%s", t_tmpdir, dir);
    char cfgp[1100];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", p);
    if (base_is_file(cfgp)) return p;
    cfg c;
    gen_opts o;
    if (preset_get(name, &c, &o)) return NULL;
    o.seed = seed;
    gen_stats st;
    char err[1024];
    if (gen_model(p, &c, &o, &st, err, sizeof err)) { fprintf(stderr, "gen_model: %s\n", err); return NULL; }
    return p;
}

static int load(const char *dir, cfg *c, st_index **ix) {
    char path[1100], err[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (cfg_load(c, path, err, sizeof err)) { fprintf(stderr, "%s\n", err); return -1; }
    if (st_open(ix, dir, err, sizeof err)) { fprintf(stderr, "%s\n", err); return -1; }
    return 0;
}

/* Loads m (load) and packs it: 0, or -1 after a failed check. */
static int load_packed(const char *m, cfg *c, st_index **ix, pack_result *res) {
    char err[2048];
    if (load(m, c, ix)) { CHECK(0); return -1; }
    CHECK_MSG(pack_build(m, c, *ix, NULL, 0, NULL, NULL, res, err, sizeof err) == 0, "%s", err);
    return 0;
}

/* m's pack (pack_find) opened, or NULL after a failed check; its directory in found. */
static pack *open_found(const char *m, const cfg *c, const st_index *ix, char *found, size_t n) {
    char err[2048];
    pack *p = NULL;
    CHECK(pack_find(m, found, n) == 1);
    CHECK_MSG(pack_open(&p, found, m, c, ix, err, sizeof err) == 0, "%s", err);
    return p;
}

static int copy_file(const char *from, const char *to) {
    uint8_t *b;
    size_t n;
    if (base_read_file(from, 1u << 30, &b, &n, NULL, 0)) return -1;
    FILE *f = fopen(to, "wb");
    if (!f) { base_free(b); return -1; }
    fwrite(b, 1, n, f);
    fclose(f);
    base_free(b);
    return 0;
}

static void flip_byte(const char *path, uint64_t off) {
    int fd = open(path, O_RDWR);
    uint8_t b;
    if (pread(fd, &b, 1, (off_t)off) == 1) { b ^= 0x40; if (pwrite(fd, &b, 1, (off_t)off) != 1) {} }
    close(fd);
}

TEST(pack_roundtrip) {
    const char *m = tpack_model("tiny-shards", "pk_shards", 1);
    CHECK(m != NULL);
    if (!m) return;
    cfg c;
    st_index *ix = NULL;
    pack_result res;
    if (load_packed(m, &c, &ix, &res)) return;
    char err[2048], found[1024];
    CHECK(!res.already && res.trunk_bytes > 0);
    pack *p = open_found(m, &c, ix, found, sizeof found);
    if (!p) { st_close(ix); return; }
    CHECK_MSG(pack_verify(p, &c, ix, NULL, NULL, err, sizeof err) == 0, "%s", err);
    /* every tensor of every region holds the shard's bytes */
    uint8_t *tb;
    size_t tn;
    CHECK(base_read_file(p->trunk_path, 1u << 30, &tb, &tn, NULL, 0) == 0);
    CHECK(tn == p->trunk_bytes);
    int bad = 0, n_t = 0;
    for (int64_t u = -1; u <= p->n_layers; u++) {
        const pack_region *r = u < 0 ? &p->embed : &p->units[u];
        CHECK(r->off % 4096 == 0 && r->nbytes % 4096 == 0);
        for (int i = 0; i < r->n_tensors; i++) {
            const st_tensor *s = st_find(ix, r->t[i].name);
            uint8_t *want = base_alloc(s->nbytes, MEM_MISC);
            st_read(ix, s, 0, want, s->nbytes, err, sizeof err);
            if (memcmp(want, tb + r->off + r->t[i].off, s->nbytes)) bad++;
            base_free(want);
            n_t++;
        }
    }
    CHECK(bad == 0 && n_t > 50);
    base_free(tb);
    /* packing again: nothing to do */
    CHECK(pack_build(m, &c, ix, NULL, 0, NULL, NULL, &res, err, sizeof err) == 0 && res.already);
    /* a flipped byte in layer 3's run is named */
    char copy[1200];
    snprintf(copy, sizeof copy, "%s.orig", p->trunk_path);
    copy_file(p->trunk_path, copy);
    flip_byte(p->trunk_path, p->units[3].off + 100);
    CHECK(pack_verify(p, &c, ix, NULL, NULL, err, sizeof err) == STRATA_ECORRUPT);
    CHECK_MSG(strstr(err, "layer 3: checksum mismatch") != NULL, "%s", err);
    /* truncated trunk: refused at open */
    pack *p2 = NULL;
    CHECK(truncate(p->trunk_path, (off_t)(p->trunk_bytes - 4096)) == 0);
    CHECK(pack_open(&p2, found, m, &c, ix, err, sizeof err) == STRATA_ECORRUPT);
    CHECK_MSG(strstr(err, "truncated") != NULL, "%s", err);
    rename(copy, p->trunk_path);
    CHECK(pack_verify(p, &c, ix, NULL, NULL, err, sizeof err) == 0);
    pack_close(p);
    st_close(ix);
}

TEST(pack_refusals) {
    setenv("XDG_CACHE_HOME", t_tmpdir, 1); /* the --out pointer goes under the test's scratch */
    const char *a = tpack_model("tiny", "pk_a", 7), *b = tpack_model("tiny", "pk_b", 8);
    CHECK(a && b);
    if (!a || !b) return;
    cfg ca, cb;
    st_index *ia = NULL, *ib = NULL;
    if (load(a, &ca, &ia) || load(b, &cb, &ib)) { CHECK(0); return; }
    char out[1100], err[2048];
    snprintf(out, sizeof out, "%s/elsewhere.pack", t_tmpdir);
    pack_result res;
    CHECK_MSG(pack_build(a, &ca, ia, out, 0, NULL, NULL, &res, err, sizeof err) == 0, "%s", err);
    /* --out elsewhere: run still finds it through the pointer */
    char found[1024];
    CHECK(pack_find(a, found, sizeof found) == 1 && strstr(found, "elsewhere.pack"));
    /* another model into the same directory: refused, the pack is untouched */
    CHECK(pack_build(b, &cb, ib, out, 0, NULL, NULL, &res, err, sizeof err) == STRATA_EINVAL);
    CHECK_MSG(strstr(err, "another model") != NULL, "%s", err);
    CHECK(pack_build(b, &cb, ib, out, 1, NULL, NULL, &res, err, sizeof err) == STRATA_EINVAL);
    pack *p = NULL;
    CHECK(pack_open(&p, out, b, &cb, ib, err, sizeof err) == STRATA_EINVAL); /* wrong model */
    CHECK(pack_open(&p, out, a, &ca, ia, err, sizeof err) == 0);
    CHECK(pack_verify(p, &ca, ia, NULL, NULL, err, sizeof err) == 0);
    pack_close(p);
    /* a non-empty foreign directory */
    char foreign[1100];
    snprintf(foreign, sizeof foreign, "%s/foreign", t_tmpdir);
    base_mkdir_p(foreign, NULL, 0);
    char fpath[1200];
    snprintf(fpath, sizeof fpath, "%s/notes.txt", foreign);
    t_write("foreign/notes.txt", "x", 1);
    CHECK(pack_build(a, &ca, ia, foreign, 0, NULL, NULL, &res, err, sizeof err) == STRATA_EINVAL);
    st_close(ia);
    st_close(ib);
}

TEST(pack_expert_corrupt) {
    const char *m = tpack_model("tiny", "pk_xc", 3);
    if (!m) { CHECK(0); return; }
    cfg c;
    st_index *ix = NULL;
    pack_result res;
    if (load_packed(m, &c, &ix, &res)) return;
    char err[2048], found[1024];
    pack *p = open_found(m, &c, ix, found, sizeof found);
    /* flip a byte inside layer 2 expert 5's w2 scales (shard data, not its header) */
    char name[200];
    snprintf(name, sizeof name, "language_model.model.layers.2.block_sparse_moe.experts.5.w2.weight_scale");
    const st_tensor *t = st_find(ix, name);
    CHECK(t != NULL);
    if (t && p) {
        flip_byte(st_shard_path(ix, t->shard), t->off + 3);
        CHECK(pack_verify(p, &c, ix, NULL, NULL, err, sizeof err) == STRATA_ECORRUPT);
        CHECK_MSG(strstr(err, "layer 2 expert 5: checksum mismatch") != NULL, "%s", err);
        flip_byte(st_shard_path(ix, t->shard), t->off + 3);
        CHECK(pack_verify(p, &c, ix, NULL, NULL, err, sizeof err) == 0);
    }
    pack_close(p);
    st_close(ix);
}

TEST(pack_cli) {
    const char *m = tpack_model("tiny-mixed", "pk_cli", 5);
    if (!m) { CHECK(0); return; }
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s pack %s", t_strata(), m);
    CHECK(t_run(cmd, &out) == 0);
    base_free(out);
    snprintf(cmd, sizeof cmd, "%s pack --verify %s", t_strata(), m);
    CHECK(t_run(cmd, &out) == 0);
    CHECK(out && strstr(out, "every checksum matches"));
    base_free(out);
    char trunk[1200];
    snprintf(trunk, sizeof trunk, "%s/%s/trunk.bin", m, PACK_DIRNAME);
    flip_byte(trunk, 5000);
    snprintf(cmd, sizeof cmd, "%s pack --verify %s", t_strata(), m);
    CHECK(t_run(cmd, &out) == 1);
    CHECK_MSG(out && strstr(out, "checksum mismatch"), "%s", out ? out : "");
    base_free(out);
    flip_byte(trunk, 5000);
    snprintf(cmd, sizeof cmd, "%s pack --bogus %s", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 2);
}

/* Every byte of trunk.bin outside the manifest's tensors is zero. */
static int padding_is_zero(const pack *p, const uint8_t *tb) {
    uint8_t *mark = base_calloc(p->trunk_bytes, 1, MEM_MISC);
    if (!mark) return 0;
    for (int64_t u = -1; u <= p->n_layers; u++) {
        const pack_region *r = u < 0 ? &p->embed : &p->units[u];
        for (int i = 0; i < r->n_tensors; i++) memset(mark + r->off + r->t[i].off, 1, r->t[i].nbytes);
    }
    int ok = 1;
    for (uint64_t i = 0; i < p->trunk_bytes && ok; i++) ok = mark[i] || !tb[i];
    base_free(mark);
    return ok;
}

/* The output does not depend on how the source is read: O_DIRECT, page cache,
 * both alternating chunk by chunk, with 4 MiB or with tiny reads and writes (every
 * chunk, buffer and extent boundary falls inside these models). Shards of 96 KB
 * (tiny-shards) split regions and experts across files. */
TEST(pack_source_modes) {
    setenv("XDG_CACHE_HOME", t_tmpdir, 1); /* the --out pointers go under the test's scratch */
    static const char *presets[] = {"tiny-shards", "tiny-mixed", "tiny-bf16experts", "tiny-odd"};
    static const int modes[] = {0, PACK_SRC_DIRECT, PACK_SRC_CACHED, PACK_SRC_DIRECT | PACK_SRC_CACHED,
                                PACK_SMALL_IO | PACK_SRC_DIRECT, PACK_SMALL_IO | PACK_SRC_CACHED,
                                PACK_SMALL_IO | PACK_SRC_DIRECT | PACK_SRC_CACHED, PACK_SMALL_IO};
    for (size_t k = 0; k < sizeof presets / sizeof *presets; k++) {
        char dir[64];
        snprintf(dir, sizeof dir, "pk_modes_%zu", k);
        const char *m = tpack_model(presets[k], dir, 11 + k);
        CHECK(m != NULL);
        if (!m) continue;
        cfg c;
        st_index *ix = NULL;
        if (load(m, &c, &ix)) { CHECK(0); continue; }
        char err[2048], out[1200], path[1300];
        uint8_t *ref_t = NULL, *ref_m = NULL;
        size_t ref_tn = 0, ref_mn = 0;
        for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
            snprintf(out, sizeof out, "%s/pk_modes_out_%zu_%zu", t_tmpdir, k, i);
            pack_result res;
            CHECK_MSG(pack_build(m, &c, ix, out, modes[i], NULL, NULL, &res, err, sizeof err) == 0, "%s %x: %s",
                      presets[k], modes[i], err);
            CHECK(res.src_direct_bytes + res.src_cached_bytes > 0);
            if (modes[i] == PACK_SRC_DIRECT) CHECK(res.src_cached_bytes == 0);
            if (modes[i] == PACK_SRC_CACHED) CHECK(res.src_direct_bytes == 0);
            uint8_t *tb, *mb;
            size_t tn, mn;
            snprintf(path, sizeof path, "%s/trunk.bin", out);
            CHECK(base_read_file(path, 1u << 30, &tb, &tn, NULL, 0) == 0);
            snprintf(path, sizeof path, "%s/manifest.json", out);
            CHECK(base_read_file(path, 1u << 30, &mb, &mn, NULL, 0) == 0);
            if (i == 0) {
                pack *p = NULL;
                CHECK_MSG(pack_open(&p, out, m, &c, ix, err, sizeof err) == 0, "%s", err);
                if (p) {
                    CHECK(tn == p->trunk_bytes && padding_is_zero(p, tb));
                    CHECK_MSG(pack_verify(p, &c, ix, NULL, NULL, err, sizeof err) == 0, "%s", err);
                }
                pack_close(p);
                ref_t = tb, ref_tn = tn, ref_m = mb, ref_mn = mn;
                continue;
            }
            CHECK_MSG(tn == ref_tn && memcmp(tb, ref_t, tn) == 0, "%s: trunk.bin differs with flags %x", presets[k], modes[i]);
            CHECK_MSG(mn == ref_mn && memcmp(mb, ref_m, mn) == 0, "%s: manifest differs with flags %x", presets[k], modes[i]);
            base_free(tb);
            base_free(mb);
        }
        base_free(ref_t);
        base_free(ref_m);
        st_close(ix);
    }
}

/* The write measurement leaves nothing behind in the directory. */
TEST(pack_measure) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/pk_measure", t_tmpdir);
    CHECK(base_mkdir_p(dir, NULL, 0) == 0);
    CHECK(pack_measure_write_bw(dir, 16u << 20) > 0);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    CHECK(n == 0);
}

/* ====================================================== integrity (issue 16) */

/* Swaps bytes [off, off+n) and [off+n, off+2n) of a file in place. */
static void swap_blocks(const char *path, uint64_t off, size_t n) {
    int fd = open(path, O_RDWR);
    uint8_t a[256], b[256];
    if (fd < 0 || n > sizeof a) { if (fd >= 0) close(fd); return; }
    if (pread(fd, a, n, (off_t)off) == (ssize_t)n && pread(fd, b, n, (off_t)(off + n)) == (ssize_t)n) {
        if (pwrite(fd, b, n, (off_t)off) != (ssize_t)n || pwrite(fd, a, n, (off_t)(off + n)) != (ssize_t)n) {}
    }
    close(fd);
}

/* A fresh copy of preset `name` under t_tmpdir/dir (so a test may damage it),
 * made from tpack_model's DIR_src; the path (a rotation of 4 buffers) or NULL.
 * Also for t_ident.c and the streaming suites (stream_test.h). */
const char *tpack_fresh(const char *name, const char *dir, uint64_t seed);
const char *tpack_fresh(const char *name, const char *dir, uint64_t seed) {
    static char paths[4][1024];
    static int k;
    char src[64];
    snprintf(src, sizeof src, "%s_src", dir);
    const char *m = tpack_model(name, src, seed);
    if (!m) return NULL;
    char *p = paths[k++ % 4], cmd[3000];
    snprintf(p, 1024, "%s/%s", t_tmpdir, dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", p, m, p);
    return t_run(cmd, NULL) == 0 ? p : NULL;
}

/* min_bytes of the plan of m (strata plan --json): the streaming floor. */
static uint64_t plan_min(const char *m) {
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s plan %s --ram-gb 50 --json 2>/dev/null", t_strata(), m);
    uint64_t min = 0;
    if (t_run(cmd, &out) == 0 && out) {
        const char *a = strstr(out, "\"min_bytes\": ");
        if (a) min = strtoull(a + 13, NULL, 10);
    }
    base_free(out);
    return min;
}

/* strata run of m with ram ("" = resident); returns the exit code, output in *out. */
static int run_ids(const char *m, const char *ram, char **out) {
    char cmd[2048];
    /* a successful run: the ids alone (the report goes to stderr) */
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2,3,4,5 --gen 6 --print-ids %s", t_strata(), m, ram);
    return t_run(cmd, out);
}

static int run_ids_ok(const char *m, const char *ram, char **out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2,3,4,5 --gen 6 --print-ids %s 2>/dev/null", t_strata(), m, ram);
    return t_run(cmd, out);
}

/* The last line of s (the ids of --print-ids; stderr lines come before it). */
static const char *last_line(char *s) {
    if (!s) return "";
    size_t n = strlen(s);
    while (n && s[n - 1] == '\n') s[--n] = 0;
    const char *l = strrchr(s, '\n');
    return l ? l + 1 : s;
}

/* Regression (issue 16, items 1 and 4): two 128-byte blocks of a trunk tensor
 * swapped inside a shard after packing (same size, same header). Before: the
 * resident run and the run from the pack gave different ids, pack --verify said
 * every checksum matches and pack said the pack is already there. Now verify names
 * the tensor and the shard byte, every run from the pack refuses it as stale, the
 * resident run refuses it too (issue 38), `--pack ''` reads the shards, and plain
 * `strata pack` rebuilds the stale pack, after which every run gives those ids. */
TEST(pack_stale_shard_data) {
    const char *m = tpack_fresh("tiny", "pk_stale", 31);
    if (!m) { CHECK(0); return; }
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 0);
    uint64_t min = plan_min(m);
    CHECK(min > 0);
    char stream_ram[64], pinned_ram[64];
    snprintf(stream_ram, sizeof stream_ram, "--ram %llu", (unsigned long long)(min + (4u << 20)));
    snprintf(pinned_ram, sizeof pinned_ram, "--ram-gb 8");
    cfg c;
    st_index *ix = NULL;
    if (load(m, &c, &ix)) { CHECK(0); return; }
    /* the largest tensor of layer 1 (a trunk tensor, packed into trunk.bin) */
    const st_tensor *t = NULL;
    char pfx[64];
    snprintf(pfx, sizeof pfx, "language_model.model.layers.1.");
    for (size_t i = 0; i < st_count(ix); i++) {
        const st_tensor *s = st_at(ix, i);
        if (!strncmp(s->name, pfx, strlen(pfx)) && !strstr(s->name, "experts.") && (!t || s->nbytes > t->nbytes)) t = s;
    }
    CHECK(t && t->nbytes >= 512);
    if (!t) { st_close(ix); return; }
    char shard[1100], tname[256];
    snprintf(shard, sizeof shard, "%s", st_shard_path(ix, t->shard));
    snprintf(tname, sizeof tname, "%s", t->name);
    uint64_t at = t->off + 128;
    st_close(ix);
    usleep(20000); /* a later mtime than the pack's stamp on any clock granularity */
    swap_blocks(shard, at, 128);
    snprintf(cmd, sizeof cmd, "%s pack --verify %s", t_strata(), m);
    CHECK(t_run(cmd, &out) == 1);
    CHECK_MSG(out && strstr(out, tname) && strstr(out, "differs from the pack at") && strstr(out, shard), "%s", out ? out : "");
    base_free(out);
    CHECK(run_ids(m, stream_ram, &out) == 1);
    CHECK_MSG(out && strstr(out, "is stale") && strstr(out, "was modified after packing"), "%s", out ? out : "");
    base_free(out);
    CHECK(run_ids(m, pinned_ram, &out) == 1);
    CHECK_MSG(out && strstr(out, "is stale"), "%s", out ? out : "");
    base_free(out);
    /* without a budget too (issue 38 item 3: it read the shards and never looked at the pack) */
    CHECK(run_ids(m, "", &out) == 1);
    CHECK_MSG(out && strstr(out, "is stale") && strstr(out, "was modified after packing"), "%s", out ? out : "");
    base_free(out);
    char *res = NULL;
    CHECK(run_ids_ok(m, "--pack ''", &res) == 0); /* in place from the shards, asked for */
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure", t_strata(), m);
    CHECK(t_run(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "was stale") && strstr(out, "rebuilt"), "%s", out ? out : "");
    base_free(out);
    CHECK(t_run(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "up to date"), "%s", out ? out : "");
    base_free(out);
    const char *want = last_line(res);
    for (int i = 0; i < 2; i++) {
        CHECK(run_ids_ok(m, i ? pinned_ram : stream_ram, &out) == 0);
        CHECK_MSG(!strcmp(last_line(out), want), "budget %d: %s vs resident %s", i, last_line(out), want);
        base_free(out);
    }
    snprintf(cmd, sizeof cmd, "%s pack --verify %s", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 0);
    base_free(res);
}

/* Regression (issue 16, items 2 and 4): `run` never checked the pack's checksums
 * (a flipped byte of trunk.bin gave other ids, exit 0), and after the model changed
 * `pack` and `pack --force` both refused to replace the stale pack. */
TEST(pack_run_verifies) {
    const char *m = tpack_fresh("tiny-blocks", "pk_runv", 33);
    if (!m) { CHECK(0); return; }
    char cmd[2048], *out = NULL, *want = NULL;
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 0);
    uint64_t min = plan_min(m);
    char stream_ram[64];
    snprintf(stream_ram, sizeof stream_ram, "--ram %llu", (unsigned long long)(min + (4u << 20)));
    CHECK(run_ids_ok(m, "", &want) == 0);
    cfg c;
    st_index *ix = NULL;
    if (load(m, &c, &ix)) { CHECK(0); base_free(want); return; }
    char found[1024], err[2048];
    pack *p = NULL;
    CHECK(pack_find(m, found, sizeof found) && pack_open(&p, found, m, &c, ix, err, sizeof err) == 0);
    if (!p) { st_close(ix); base_free(want); return; }
    /* one byte in layer 2's run, then one in the embedding table: every budget that
     * reads the pack fails naming trunk.bin and the byte range; the fixed file runs */
    const uint64_t spots[2] = {p->units[2].off + 100, p->embed.off + 7};
    for (int k = 0; k < 2; k++) {
        flip_byte(p->trunk_path, spots[k]);
        for (int i = 0; i < 2; i++) {
            CHECK(run_ids(m, i ? "--ram-gb 8" : stream_ram, &out) == 1);
            CHECK_MSG(out && strstr(out, "checksum mismatch in") && strstr(out, "trunk.bin bytes"), "spot %d budget %d: %s", k, i,
                      out ? out : "");
            base_free(out);
        }
        flip_byte(p->trunk_path, spots[k]);
    }
    CHECK(run_ids_ok(m, stream_ram, &out) == 0);
    CHECK(!strcmp(last_line(out), last_line(want)));
    base_free(out);
    pack_close(p);
    st_close(ix);
    /* the model changes (config.json here; a shard's size does the same): run says
     * re-run strata pack, and pack, then pack --force, both replace the pack */
    char cj[1100];
    snprintf(cj, sizeof cj, "%s/config.json", m);
    FILE *f = fopen(cj, "a");
    if (f) { fputc('\n', f); fclose(f); }
    CHECK(run_ids(m, stream_ram, &out) == 1);
    CHECK_MSG(out && strstr(out, "re-run strata pack"), "%s", out ? out : "");
    base_free(out);
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure", t_strata(), m);
    CHECK(t_run(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "was stale (the model's config"), "%s", out ? out : "");
    base_free(out);
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure --force", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 0);
    CHECK(run_ids_ok(m, stream_ram, &out) == 0);
    CHECK(!strcmp(last_line(out), last_line(want)));
    base_free(out);
    base_free(want);
}

/* Rewrites manifest.json of pack dir `d` through fn, tries pack_open, restores. */
typedef void (*mf_edit)(json_t *j);
static int open_edited(const char *d, const char *m, const cfg *c, const st_index *ix, mf_edit fn, char *err, size_t errlen) {
    char path[1200];
    snprintf(path, sizeof path, "%s/manifest.json", d);
    uint8_t *orig;
    size_t n;
    if (base_read_file(path, 1u << 30, &orig, &n, NULL, 0)) return -100;
    json_t *j = jsonx_load(orig, n, path, NULL, 0);
    fn(j);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    t_write("edited.json", s, strlen(s));
    json_malloc_t jm;
    json_free_t jf;
    json_get_alloc_funcs(&jm, &jf); /* jsonx may route jansson through base_alloc */
    jf(s);
    char from[1100];
    snprintf(from, sizeof from, "%s/edited.json", t_tmpdir);
    rename(from, path);
    pack *p = NULL;
    int rc = pack_open(&p, d, m, c, ix, err, errlen);
    pack_close(p);
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(orig, 1, n, f); fclose(f); }
    base_free(orig);
    return rc;
}
static void ed_version3(json_t *j) { json_object_set_new(j, "version", json_integer(3)); }
static void ed_version0(json_t *j) { json_object_set_new(j, "version", json_integer(0)); }
static void ed_no_version(json_t *j) { json_object_del(j, "version"); }
static void ed_model_id(json_t *j) { json_object_set_new(j, "model_id", json_string("12zz")); }
static void ed_region_hash(json_t *j) {
    json_object_set_new(json_array_get(json_object_get(j, "units"), 2), "xxh3", json_string("deadbeef"));
}
static void ed_expert_hash(json_t *j) {
    json_array_set_new(json_object_get(json_object_get(j, "experts"), "xxh3"), 1, json_string("0x0000000000000000"));
}
static void ed_region_off(json_t *j) { /* layer 2's record pointed at layer 3's bytes */
    json_t *u = json_object_get(j, "units");
    json_object_set(json_array_get(u, 2), "off", json_object_get(json_array_get(u, 3), "off"));
}
static void ed_tensor_off(json_t *j) {
    json_t *t = json_array_get(json_object_get(json_array_get(json_object_get(j, "units"), 1), "tensors"), 1);
    json_object_set_new(t, "off", json_integer(json_integer_value(json_object_get(t, "off")) + 64));
}

/* Regression (issue 16, items 2 and 3): manifest version 2 or 0 was accepted, a
 * malformed hash read as 0, and a record's offset could point anywhere in bounds. */
TEST(pack_manifest_checked) {
    const char *m = tpack_fresh("tiny", "pk_mf", 35);
    if (!m) { CHECK(0); return; }
    cfg c;
    st_index *ix = NULL;
    pack_result res;
    if (load_packed(m, &c, &ix, &res)) return;
    char err[2048], d[1100];
    snprintf(d, sizeof d, "%s/%s", m, PACK_DIRNAME);
    static const struct { mf_edit fn; const char *want; } cases[] = {
        {ed_version3, "manifest version 3 is not supported"},
        {ed_version0, "manifest version 0 is not supported"},
        {ed_no_version, "version an integer"},
        {ed_model_id, "model_id must be 16 hex digits"},
        {ed_region_hash, "layer 2: xxh3 \"deadbeef\" is not 16 hex digits"},
        {ed_expert_hash, "experts.xxh3[1] (layer"},
        {ed_region_off, "layer 2: region at bytes"},
        {ed_tensor_off, "edited or corrupt manifest"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = open_edited(d, m, &c, ix, cases[i].fn, err, sizeof err);
        CHECK_MSG(rc == STRATA_EFORMAT && strstr(err, "manifest.json") && strstr(err, cases[i].want), "case %zu: rc %d: %s", i,
                  rc, err);
    }
    pack *p = NULL;
    CHECK_MSG(pack_open(&p, d, m, &c, ix, err, sizeof err) == 0, "%s", err); /* restored */
    pack_close(p);
    st_close(ix);
}

/* Regression (issue 16, item 6): two `pack --force` at once collided on
 * trunk.bin.tmp. One writer per pack directory (a lock file in it), temporary
 * names unique per process, leftovers of dead writers removed. */
TEST(pack_concurrent_writers) {
    const char *m = tpack_fresh("tiny", "pk_conc", 37);
    if (!m) { CHECK(0); return; }
    char cmd[4096], *out = NULL, dir[1100], lock[1200], err[512], junk[1200];
    snprintf(dir, sizeof dir, "%s/%s", m, PACK_DIRNAME);
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 0);
    snprintf(lock, sizeof lock, "%s/.strata-pack.lock", dir);
    int fd = base_lock(lock, "test", err, sizeof err);
    CHECK_MSG(fd >= 0, "%s", err);
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure --force", t_strata(), m);
    CHECK(t_run(cmd, &out) == 1);
    CHECK_MSG(out && strstr(out, "is being written by another process"), "%s", out ? out : "");
    base_free(out);
    base_unlock(lock, fd);
    snprintf(junk, sizeof junk, "%s/trunk.bin.tmp.999999", dir); /* a dead writer's */
    t_write("junk", "x", 1);
    snprintf(cmd, sizeof cmd, "mv %s/junk %s", t_tmpdir, junk);
    CHECK(t_run(cmd, NULL) == 0);
    snprintf(cmd, sizeof cmd, "(%s pack %s --no-measure --force; echo rc=$?) & (%s pack %s --no-measure --force; echo rc=$?) & wait",
             t_strata(), m, t_strata(), m);
    CHECK(t_run(cmd, &out) == 0);
    int ok = 0, busy = 0;
    for (const char *p = out; p && (p = strstr(p, "rc=")); p += 3) ok += p[3] == '0';
    for (const char *p = out; p && (p = strstr(p, "being written by another process")); p++) busy++;
    CHECK_MSG(ok >= 1 && ok + busy == 2, "%d ok, %d busy:\n%s", ok, busy, out ? out : "");
    base_free(out);
    snprintf(cmd, sizeof cmd, "%s pack --verify %s", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 0);
    DIR *dd = opendir(dir);
    struct dirent *e;
    int left = 0;
    while (dd && (e = readdir(dd))) left += !strncmp(e->d_name, "trunk.bin.tmp", 13) || !strcmp(e->d_name, ".strata-pack.lock");
    if (dd) closedir(dd);
    CHECK(left == 0);
}

/* Runs cmd with stderr into *err_out and stdout into *out; returns the exit code. */
static int run_split(const char *cmd, char **out, char **err_out) {
    char full[4000], ep[1100];
    snprintf(ep, sizeof ep, "%s/split.err", t_tmpdir);
    snprintf(full, sizeof full, "%s 2>%s", cmd, ep);
    int rc = t_run(full, out);
    uint8_t *b = NULL;
    size_t n = 0;
    *err_out = base_alloc(1, MEM_MISC);
    if (*err_out) **err_out = 0;
    if (!base_read_file(ep, 1u << 24, &b, &n, NULL, 0)) {
        char *e = base_alloc(n + 1, MEM_MISC);
        if (e) { memcpy(e, b, n); e[n] = 0; base_free(*err_out); *err_out = e; }
        base_free(b);
    }
    return rc;
}

/* Flips n bytes at off and puts the file's mtime back: a change the shard stamps
 * cannot see, only the checksums. */
static void flip_keep_mtime(const char *path, uint64_t off, int n) {
    struct stat sb;
    if (stat(path, &sb)) return;
    for (int i = 0; i < n; i++) flip_byte(path, off + (uint64_t)i);
    struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    utimensat(AT_FDCWD, path, ts, 0);
}

/* Regression (issue 38, item 3): without --ram-gb/--pack, run read the shards and
 * never opened the pack: 16 flipped expert bytes gave exit 0 and other ids, a
 * stale pack went unnoticed, and a strata.pack without its manifest (or a pack
 * pointer to one) fell back to unverified reads without a word. */
TEST(pack_verified_without_budget) {
    const char *m = tpack_fresh("tiny", "pk_nobudget", 37);
    if (!m) { CHECK(0); return; }
    char cmd[3000], *out = NULL, *want = NULL;
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 0);
    CHECK(run_ids_ok(m, "", &want) == 0);
    cfg c;
    st_index *ix = NULL;
    if (load(m, &c, &ix)) { CHECK(0); base_free(want); return; }
    char name[200], shard[1100];
    snprintf(name, sizeof name, "language_model.model.layers.2.block_sparse_moe.experts.5.w2.weight_packed");
    const st_tensor *t = st_find(ix, name);
    CHECK(t && t->nbytes > 32);
    if (!t) { st_close(ix); base_free(want); return; }
    snprintf(shard, sizeof shard, "%s", st_shard_path(ix, t->shard));
    const uint64_t at = t->off + t->nbytes / 2;
    st_close(ix);
    /* 16 flipped expert bytes, mtime kept: a checksum error at every budget, none without */
    flip_keep_mtime(shard, at, 16);
    const char *modes[3] = {"", "--ram-gb 8", "--threads 1"};
    for (int i = 0; i < 3; i++) {
        CHECK(run_ids(m, modes[i], &out) == 1);
        CHECK_MSG(out && strstr(out, "layer 2 expert 5") && strstr(out, "checksum mismatch"), "'%s': %s", modes[i], out ? out : "");
        base_free(out);
    }
    flip_keep_mtime(shard, at, 16);
    CHECK(run_ids_ok(m, "", &out) == 0);
    CHECK_MSG(!strcmp(last_line(out), last_line(want)), "%s vs %s", last_line(out), last_line(want));
    base_free(out);
    /* the shard touched (a stale pack): refused without a budget as with one */
    usleep(20000);
    snprintf(cmd, sizeof cmd, "touch %s", shard);
    CHECK(t_run(cmd, NULL) == 0);
    CHECK(run_ids(m, "", &out) == 1);
    CHECK_MSG(out && strstr(out, "is stale") && strstr(out, "re-run strata pack"), "%s", out ? out : "");
    base_free(out);
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 0);
    /* the manifest gone (an interrupted pack): stated, at every budget and in the plan */
    snprintf(cmd, sizeof cmd, "mv %s/strata.pack/manifest.json %s/manifest.away", m, t_tmpdir);
    CHECK(t_run(cmd, NULL) == 0);
    char *eo = NULL;
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2,3,4,5 --gen 6 --print-ids %s", t_strata(), m, modes[i]);
        CHECK(run_split(cmd, &out, &eo) == 0);
        CHECK_MSG(eo && strstr(eo, "weights unverified: ") && strstr(eo, "holds no manifest.json"), "'%s': %s", modes[i],
                  eo ? eo : "");
        CHECK_MSG(!strcmp(last_line(out), last_line(want)), "%s vs %s", last_line(out), last_line(want));
        base_free(out);
        base_free(eo);
    }
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2 --ram-gb 8 --plan", t_strata(), m);
    CHECK(t_run(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "unverified: "), "%s", out ? out : "");
    base_free(out);
    snprintf(cmd, sizeof cmd, "mv %s/manifest.away %s/strata.pack/manifest.json", t_tmpdir, m);
    CHECK(t_run(cmd, NULL) == 0);
    CHECK(run_ids(m, "", &out) == 0);
    CHECK_MSG(out && !strstr(out, "unverified"), "%s", out ? out : "");
    base_free(out);
    /* a pack written elsewhere, found through its pointer, then its manifest gone */
    const char *m2 = tpack_fresh("tiny", "pk_nobudget2", 37);
    if (!m2) { CHECK(0); base_free(want); return; }
    char env[1200];
    snprintf(env, sizeof env, "XDG_CACHE_HOME=%s/xdg_nb", t_tmpdir);
    snprintf(cmd, sizeof cmd, "%s %s pack %s --out %s/pk_nb_out --no-measure", env, t_strata(), m2, t_tmpdir);
    CHECK(t_run(cmd, NULL) == 0);
    snprintf(cmd, sizeof cmd, "%s %s run %s --ids 1,2,3,4,5 --gen 6 --print-ids", env, t_strata(), m2);
    CHECK(t_run(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "placed: all resident") && !strstr(out, "unverified"), "%s", out ? out : "");
    base_free(out);
    snprintf(cmd, sizeof cmd, "rm %s/pk_nb_out/manifest.json && %s %s run %s --ids 1,2,3,4,5 --gen 6 --print-ids", t_tmpdir, env,
             t_strata(), m2);
    CHECK(run_split(cmd, &out, &eo) == 0);
    CHECK_MSG(eo && strstr(eo, "weights unverified: the pack pointer") && strstr(eo, "pk_nb_out"), "%s", eo ? eo : "");
    CHECK_MSG(!strcmp(last_line(out), last_line(want)), "%s vs %s", last_line(out), last_line(want));
    base_free(out);
    base_free(eo);
    base_free(want);
}

/* strata_pack_build / strata_pack_verify (strata.h): the pack strata pack writes,
 * left alone when up to date, verified; errors before packing began say so
 * (res.started 0), which is how the CLI words them. */
TEST(pack_api_build_verify) {
    const char *dir = t_model("packapi", "tiny", -1, 0);
    CHECK(dir != NULL);
    if (!dir) return;
    char out[1024], err[2048];
    snprintf(out, sizeof out, "%s/packapi-pack", t_tmpdir);
    strata_pack_result r;
    CHECK_MSG(strata_pack_verify(dir, NULL, NULL, NULL, &r, err, sizeof err) != 0 && !r.started &&
                  strstr(err, "no pack found"), "%s", err);
    CHECK_MSG(strata_pack_build(dir, out, 0, NULL, NULL, &r, err, sizeof err) == 0, "%s", err);
    CHECK(r.started && !r.already && !strcmp(r.dir, out) && r.trunk_bytes > 0 && r.disk_bw == 0);
    CHECK_MSG(strata_pack_build(dir, out, 0, NULL, NULL, &r, err, sizeof err) == 0 && r.already, "%s", err);
    CHECK_MSG(strata_pack_verify(dir, out, NULL, NULL, &r, err, sizeof err) == 0, "%s", err);
    CHECK(r.started && !strcmp(r.dir, out) && r.n_experts == 7 * 16 && r.trunk_bytes > 0 && !r.stale[0]);
    CHECK_MSG(strata_pack_build("/nonexistent", NULL, 0, NULL, NULL, &r, err, sizeof err) != 0 && !r.started &&
                  strstr(err, "/nonexistent"), "%s", err);
}
