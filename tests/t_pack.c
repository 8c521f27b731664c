/* t_pack.c: the streaming layout: pack, manifest, verify, refusals, corruption. */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "gen.h"
#include "pack.h"
#include "preset.h"
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
    if (load(m, &c, &ix)) { CHECK(0); return; }
    char err[2048];
    pack_result res;
    CHECK(pack_build(m, &c, ix, NULL, 0, NULL, NULL, &res, err, sizeof err) == 0);
    CHECK(!res.already && res.trunk_bytes > 0);
    char found[1024];
    CHECK(pack_find(m, found, sizeof found) == 1);
    pack *p = NULL;
    CHECK_MSG(pack_open(&p, found, m, &c, ix, err, sizeof err) == 0, "%s", err);
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
    if (load(m, &c, &ix)) { CHECK(0); return; }
    char err[2048];
    pack_result res;
    CHECK(pack_build(m, &c, ix, NULL, 0, NULL, NULL, &res, err, sizeof err) == 0);
    pack *p = NULL;
    char found[1024];
    CHECK(pack_find(m, found, sizeof found));
    CHECK(pack_open(&p, found, m, &c, ix, err, sizeof err) == 0);
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
