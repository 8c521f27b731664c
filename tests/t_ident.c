/* t_ident.c: the model identity (ident.h): it covers every weight byte, agrees
 * between a pack and the shards, and its cache is keyed and checked. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cfg.h"
#include "ident.h"
#include "pack.h"
#include "st.h"
#include "strata.h"
#include "test.h"

const char *tpack_model(const char *name, const char *dir, uint64_t seed); /* t_pack.c */

const char *tpack_fresh(const char *name, const char *dir, uint64_t seed); /* t_pack.c: a copy to damage */

/* The identity strata_model_load gives m (pack_dir as strata_model_opts), or 0. */
static uint64_t load_id(const char *m, const char *pack_dir, char *src, size_t n) {
    strata_model *sm = NULL;
    char err[4096];
    uint64_t id = 0;
    if (strata_model_open(&sm, m, err, sizeof err) == 0) {
        strata_model_opts o = strata_model_opts_default();
        o.pack_dir = pack_dir;
        o.ctx = 16;
        o.n_threads = 1;
        if (strata_model_load(sm, &o, err, sizeof err) == 0) {
            strata_model_info i;
            strata_model_get_info(sm, &i);
            id = i.identity;
            if (src) snprintf(src, n, "%s", i.identity_source);
        } else if (src) {
            snprintf(src, n, "error: %s", err);
        }
    }
    strata_model_close(sm);
    return id;
}

/* Flips the byte at off and puts the mtime back. */
static void flip(const char *path, uint64_t off) {
    struct stat sb;
    if (stat(path, &sb)) return;
    int fd = open(path, O_RDWR);
    uint8_t b;
    if (pread(fd, &b, 1, (off_t)off) == 1) { b ^= 0x10; if (pwrite(fd, &b, 1, (off_t)off) != 1) {} }
    close(fd);
    struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    utimensat(AT_FDCWD, path, ts, 0);
}

/* The shard and offset of a byte in the middle of a weight tensor that is more
 * than 64 KiB from both ends of its shard. */
static int middle_byte(const char *m, char *shard, size_t n, uint64_t *off) {
    cfg c;
    st_index *ix = NULL;
    char path[1100], err[1024];
    snprintf(path, sizeof path, "%s/config.json", m);
    if (cfg_load(&c, path, err, sizeof err) || st_open(&ix, m, err, sizeof err)) return -1;
    int ok = -1;
    for (size_t i = 0; i < st_count(ix) && ok; i++) {
        const st_tensor *t = st_at(ix, i);
        const uint64_t size = st_shard_size(ix, t->shard), at = t->off + t->nbytes / 2;
        if (strstr(t->name, "experts.") && at > (96u << 10) && at + (96u << 10) < size) {
            snprintf(shard, n, "%s", st_shard_path(ix, t->shard));
            *off = at;
            ok = 0;
        }
    }
    st_close(ix);
    return ok;
}

/* Regression (issue 38, item 2): the identity was the config, the tensor table and
 * the first and last 64 KiB of each shard, so a model differing in the middle of
 * its shards (headers and ends kept) had the same id, and its state files, prefix
 * files and pack were accepted for the other. */
TEST(ident_covers_every_byte) {
    const char *m = tpack_fresh("tiny", "id_mid", 41);
    if (!m) { CHECK(0); return; }
    char shard[1100], src[4200];
    uint64_t off = 0;
    CHECK(middle_byte(m, shard, sizeof shard, &off) == 0);
    if (!off) return;
    const uint64_t id0 = load_id(m, NULL, src, sizeof src);
    CHECK_MSG(id0 != 0 && !strcmp(src, "a content hash of the shards"), "%s", src);
    CHECK(load_id(m, NULL, NULL, 0) == id0); /* stable from load to load */
    flip(shard, off);
    const uint64_t id1 = load_id(m, NULL, NULL, 0);
    CHECK_MSG(id1 != 0 && id1 != id0, "a byte in the middle of a shard changed, the identity did not (%016llx)",
              (unsigned long long)id0);
    flip(shard, off);
    CHECK(load_id(m, NULL, NULL, 0) == id0);
    /* packed: the same identity from the manifest's record hashes, at any budget */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure >/dev/null 2>&1", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 0);
    CHECK_MSG(load_id(m, NULL, src, sizeof src) == id0 && !strcmp(src, "the pack's record hashes"), "%s", src);
    CHECK_MSG(load_id(m, "", src, sizeof src) == id0 && !strcmp(src, "a content hash of the shards"), "%s", src);
    /* the shards changed under the pack (mtime kept): read in place they are the
     * other model; through the pack the identity stays the packed one, and every
     * byte that differs from it is a checksum error as it is read (t_pack.c
     * pack_verified_without_budget) */
    flip(shard, off);
    CHECK(load_id(m, "", NULL, 0) == id1);
    CHECK(load_id(m, NULL, NULL, 0) == id0);
    flip(shard, off);
}

/* The identity's content hash is cached by shard stamps; the cache file is checked
 * field by field and a pack whose record hashes disagree with it is refused. */
TEST(ident_cache) {
    const char *m = tpack_fresh("tiny", "id_cache", 43);
    if (!m) { CHECK(0); return; }
    char xdg[1100], *old_xdg = getenv("XDG_CACHE_HOME") ? base_strdup(getenv("XDG_CACHE_HOME"), MEM_MISC) : NULL;
    snprintf(xdg, sizeof xdg, "%s/id_xdg", t_tmpdir);
    setenv("XDG_CACHE_HOME", xdg, 1);
    setenv("STRATA_IDENT_CACHE_MIN", "0", 1);
    cfg c;
    st_index *ix = NULL;
    char path[1100], err[4096], cpath[4200];
    snprintf(path, sizeof path, "%s/config.json", m);
    CHECK(cfg_load(&c, path, err, sizeof err) == 0 && st_open(&ix, m, err, sizeof err) == 0);
    ident_cache_path(m, cpath, sizeof cpath);
    CHECK(strstr(cpath, xdg) == cpath);
    ident_result r0, r;
    CHECK(ident_model(m, &c, ix, NULL, NULL, &r0, err, sizeof err) == 0 && r0.source == IDENT_HASHED && r0.bytes_hashed > 0);
    CHECK(base_is_file(cpath));
    CHECK(ident_model(m, &c, ix, NULL, NULL, &r, err, sizeof err) == 0 && r.source == IDENT_FROM_CACHE && r.id == r0.id);
    /* a malformed cache file is recomputed and rewritten */
    FILE *f = fopen(cpath, "w");
    if (f) { fputs("{\"format\": \"strata-identity\", \"version\": 1, \"content\": 7}", f); fclose(f); }
    CHECK(ident_model(m, &c, ix, NULL, NULL, &r, err, sizeof err) == 0 && r.source == IDENT_HASHED && r.id == r0.id);
    CHECK(ident_model(m, &c, ix, NULL, NULL, &r, err, sizeof err) == 0 && r.source == IDENT_FROM_CACHE && r.id == r0.id);
    /* a shard touched (another mtime): hashed again */
    usleep(20000);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "touch %s", st_shard_path(ix, 0));
    CHECK(t_run(cmd, NULL) == 0);
    CHECK(ident_model(m, &c, ix, NULL, NULL, &r, err, sizeof err) == 0 && r.source == IDENT_HASHED && r.id == r0.id);
    /* a pack: its record hashes give the same identity, without a read */
    pack_result pr;
    CHECK(pack_build(m, &c, ix, NULL, 0, NULL, NULL, &pr, err, sizeof err) == 0);
    pack *p = NULL;
    char found[1024];
    CHECK(pack_find(m, found, sizeof found) == 1 && pack_open(&p, found, m, &c, ix, err, sizeof err) == 0);
    if (p) {
        CHECK(ident_model(m, &c, ix, p, NULL, &r, err, sizeof err) == 0 && r.source == IDENT_FROM_PACK && r.id == r0.id);
        /* the cache (same stamps) says the shards hold other bytes than the pack's records */
        uint8_t *b;
        size_t n;
        if (base_read_file(cpath, 1 << 20, &b, &n, NULL, 0) == 0) {
            char *s = base_alloc(n + 1, MEM_MISC);
            memcpy(s, b, n);
            s[n] = 0;
            char *q = strstr(s, "\"content\":\"");
            CHECK(q != NULL);
            if (q) q[11] = q[11] == '0' ? '1' : '0';
            f = fopen(cpath, "w");
            if (f) { fputs(s, f); fclose(f); }
            base_free(s);
            base_free(b);
        }
        CHECK(ident_model(m, &c, ix, p, NULL, &r, err, sizeof err) == STRATA_EINVAL);
        CHECK_MSG(strstr(err, "is not this model's pack") && strstr(err, found), "%s", err);
    }
    pack_close(p);
    st_close(ix);
    unsetenv("STRATA_IDENT_CACHE_MIN");
    if (old_xdg) setenv("XDG_CACHE_HOME", old_xdg, 1);
    else unsetenv("XDG_CACHE_HOME");
    base_free(old_xdg);
}
