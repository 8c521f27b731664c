/*
 * t_faults.c: fault injection (src/vfs.h and the allocation countdown). First the
 * wrappers and the io ring in process; then sweeps of the CLI: the Nth file call
 * fails (eio, enospc), comes back short or is interrupted (short, eintr) in
 * strata gen-model (fresh and --force over a model), pack (fresh and --force over
 * a pack), run (resident and streamed) and chat /save, and the Nth allocation
 * fails in strata run from open to the first token.
 *
 * Every faulty run must end in one of two ways: exit 0 with exactly the output of
 * a run without faults (always so for short and eintr: both are continued), or
 * exit 1-2 with a message naming a file (an allocation: saying out of memory).
 * Never a signal, and never a partial file that a later command accepts: a failed
 * gen-model leaves no model (or the old one), a failed pack leaves runs giving the
 * same ids, a failed /save leaves the old state file byte for byte.
 *
 * Each sweep tries at most FZ_BUDGET values of N (every N with
 * STRATA_TEST_FAULTS=full, which `make faults` sets), plus always the last calls
 * one by one: that is where writers fsync, rename and publish.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "io.h"
#include "jsonx.h"
#include "pack.h"
#include "st.h"
#include "test.h"
#include "vfs.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FZ_SAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FZ_SAN 1
#endif
#endif
#ifdef FZ_SAN
#define FZ_BUDGET 5 /* each run is several times slower under the sanitizers */
#define FZ_TAIL 5
#define FZ_ALLOC_STRIDE 16
#else
#define FZ_BUDGET 28
#define FZ_TAIL 14
#define FZ_ALLOC_STRIDE 4
#endif

static const char *k_kinds[] = {"eio", "enospc", "short", "eintr"};

static int fz_full(void) {
    const char *f = getenv("STRATA_TEST_FAULTS");
    return f && !strcmp(f, "full");
}

/* The Ns to try of n calls: all of them, or about `budget` spread over them
 * (from an offset that differs per salt) and the last FZ_TAIL. Returns how many (ns holds up to cap). */
static int fz_pick(uint64_t n, int budget, int salt, uint64_t *ns, int cap) {
    int k = 0;
    if (budget < 1) budget = 1;
    if (fz_full() || n <= (uint64_t)(budget + FZ_TAIL)) {
        for (uint64_t i = 1; i <= n && k < cap; i++) ns[k++] = i;
        return k;
    }
    const uint64_t head = n - FZ_TAIL, stride = (head + (uint64_t)budget - 1) / (uint64_t)budget;
    for (uint64_t i = 1 + (uint64_t)salt % stride; i <= head && k < cap; i += stride) ns[k++] = i;
    for (uint64_t i = head + 1; i <= n && k < cap; i++) ns[k++] = i;
    return k;
}

typedef struct { int rc; char *out, *err; } fz_res;

static void fz_free(fz_res *r) {
    base_free(r->out);
    base_free(r->err);
    memset(r, 0, sizeof *r);
}

static char *fz_slurp(const char *path) {
    uint8_t *b;
    size_t n;
    if (base_read_file(path, 1u << 26, &b, &n, NULL, 0)) return base_strdup("", MEM_MISC);
    return (char *)b;
}

/* ./strata ARGS with env (e.g. "STRATA_FAULT=eio:3"), stdin from `in` (or
 * /dev/null); stdout and stderr apart. The fault line at exit is cut from err. */
static void fz_run(const char *env, const char *args, const char *in, fz_res *r) {
    char cmd[8192], o[1024], e[1024];
    snprintf(o, sizeof o, "%s/fz.out", t_tmpdir);
    snprintf(e, sizeof e, "%s/fz.err", t_tmpdir);
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s/fz_xdg %s %s %s <%s >%s 2>%s", t_tmpdir, env ? env : "", t_strata(), args,
             in ? in : "/dev/null", o, e);
    r->rc = t_run(cmd, NULL);
    r->out = fz_slurp(o);
    r->err = fz_slurp(e);
    char *f = strstr(r->err, "strata: fault:");
    if (f) *f = 0;
}

/* Calls (and allocations) of one clean run; its stdout in *out. */
static uint64_t fz_count(const char *args, const char *in, uint64_t *allocs, char **out) {
    fz_res r;
    fz_run("STRATA_FAULT=count:0", args, in, &r);
    char e[1024];
    snprintf(e, sizeof e, "%s/fz.err", t_tmpdir);
    char *full = fz_slurp(e), *f = strstr(full, "strata: fault: ");
    unsigned long long n = 0, a = 0;
    if (!f || sscanf(f, "strata: fault: %llu calls; %llu allocations", &n, &a) != 2) n = a = 0;
    CHECK_MSG(r.rc == 0 && n > 0, "count run of '%s': exit %d: %s", args, r.rc, full);
    base_free(full);
    if (allocs) *allocs = a;
    if (out) *out = r.out; else base_free(r.out);
    base_free(r.err);
    return n;
}

/* The outcome contract (see the file comment). name: what a failure must mention. */
static void fz_check(const char *what, const char *spec, const fz_res *r, const char *ref_out, const char *name) {
    CHECK_MSG(r->rc >= 0 && r->rc < 128, "%s %s: exit %d (a signal?): %s", what, spec, r->rc, r->err);
    const int must_pass = !strncmp(spec, "STRATA_FAULT=short", 18) || !strncmp(spec, "STRATA_FAULT=eintr", 18);
    if (must_pass) CHECK_MSG(r->rc == 0, "%s %s: a %s must be continued, exit %d: %s", what, spec, spec + 13, r->rc, r->err);
    if (r->rc == 0)
        CHECK_MSG(!strcmp(r->out, ref_out), "%s %s: exit 0 with other output: '%s' vs '%s'", what, spec, r->out, ref_out);
    else if (r->rc > 0 && r->rc < 128)
        CHECK_MSG(strstr(r->err, name), "%s %s: exit %d without naming %s: %s", what, spec, r->rc, name, r->err);
}

static int fz_same_tree(const char *a, const char *b) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "diff -r -q %s %s >/dev/null 2>&1", a, b);
    return t_run(cmd, NULL) == 0;
}

/* Entries of dir whose name contains part. */
static int fz_leftovers(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strstr(e->d_name, part) != NULL;
    closedir(d);
    return n;
}

static int fz_same_file(const char *a, const char *b) {
    uint8_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same = !base_read_file(a, 1u << 28, &x, &nx, NULL, 0) && !base_read_file(b, 1u << 28, &y, &ny, NULL, 0) && nx == ny &&
               !memcmp(x, y, nx);
    base_free(x);
    base_free(y);
    return same;
}

/* A --ram-gb just above the planner's minimum for m (streams the trunk and the
 * experts); the minimum moves with the build (sanitizers), so it is asked for. */
static double fz_stream_gb(const char *m) {
    char a[2048];
    snprintf(a, sizeof a, "run %s --ids 1 --plan --ram-gb 1000", m);
    fz_res r;
    fz_run(NULL, a, NULL, &r);
    double mn = 0;
    const char *p = strstr(r.out, "minimum budget");
    if (!p) p = strstr(r.err, "minimum budget");
    if (p) sscanf(p, "minimum budget %lf", &mn);
    CHECK_MSG(mn > 0, "no minimum budget: %s %s", r.out, r.err);
    fz_free(&r);
    return mn * 1.02;
}

static const char *fz_model(const char *name) {
    static char d[8][1024];
    static int k;
    char *p = d[k++ % 8], cmd[4096];
    snprintf(p, 1024, "%s/%s", t_tmpdir, name);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/fz_xdg && %s gen-model %s --preset tiny >/dev/null 2>&1", t_tmpdir, t_strata(), p);
    return t_run(cmd, NULL) == 0 ? p : NULL;
}

/* fz_model(name) packed (--no-measure), *gb the budget that streams it; NULL
 * after a failed check. */
static const char *fz_packed(const char *name, double *gb) {
    const char *m = fz_model(name);
    CHECK(m != NULL);
    if (!m) return NULL;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s pack %s --no-measure >/dev/null 2>&1", t_strata(), m);
    CHECK(t_run(cmd, NULL) == 0);
    *gb = fz_stream_gb(m);
    return m;
}

/* ====================================================================== in process */

/* The wrappers: parsing, EINTR and short transfers continued, errors surfacing
 * with the file's name, the atomic writer leaving the old file at every call. */
TEST(faults_vfs) {
    int kind;
    uint64_t n;
    CHECK(vfs_fault_parse("eio:3", &kind, &n) == 0 && kind == VFS_FAULT_EIO && n == 3);
    CHECK(vfs_fault_parse("count:0", &kind, &n) == 0 && kind == VFS_FAULT_COUNT);
    CHECK(vfs_fault_parse("eio:0", &kind, &n) != 0 && vfs_fault_parse("bogus:1", &kind, &n) != 0 &&
          vfs_fault_parse("eio", &kind, &n) != 0 && vfs_fault_parse("short:x", &kind, &n) != 0);
    char path[1024], err[1024];
    snprintf(path, sizeof path, "%s/fz_vfs.bin", t_tmpdir);
    static uint8_t a[40000], b[40000];
    for (size_t i = 0; i < sizeof a; i++) { a[i] = (uint8_t)(i * 7 + 1); b[i] = (uint8_t)(i * 13 + 5); }
    CHECK(base_write_file_atomic(path, a, sizeof a, err, sizeof err) == 0);
    vfs_fault_set(VFS_FAULT_COUNT, 0);
    CHECK(base_write_file_atomic(path, a, sizeof a, err, sizeof err) == 0);
    const uint64_t calls = vfs_fault_calls(); /* open, write, fsync, rename */
    CHECK_MSG(calls == 4, "%llu calls", (unsigned long long)calls);
    for (int k = VFS_FAULT_EIO; k <= VFS_FAULT_EINTR; k++)
        for (uint64_t i = 1; i <= calls; i++) {
            vfs_fault_set(k, i);
            int rc = base_write_file_atomic(path, b, sizeof b, err, sizeof err);
            const char *op = NULL;
            int fired = vfs_fault_fired(NULL, &op);
            vfs_fault_set(VFS_FAULT_OFF, 0);
            uint8_t *got;
            size_t len;
            CHECK(base_read_file(path, 1u << 20, &got, &len, NULL, 0) == 0);
            if (rc) {
                CHECK_MSG(fired && (k == VFS_FAULT_EIO || k == VFS_FAULT_ENOSPC) && strstr(err, path),
                          "%s:%llu: %s", vfs_fault_name(k), (unsigned long long)i, err);
                CHECK(len == sizeof a && !memcmp(got, a, len)); /* the old file, whole */
            } else {
                CHECK(len == sizeof b && !memcmp(got, b, len));
                CHECK(base_write_file_atomic(path, a, sizeof a, err, sizeof err) == 0);
            }
            base_free(got);
            CHECK_MSG(fz_leftovers(t_tmpdir, "fz_vfs.bin.tmp") == 0, "%s:%llu left a temp file", vfs_fault_name(k),
                      (unsigned long long)i);
        }
    /* reads: an error names the file, short and eintr give the same bytes */
    for (int k = VFS_FAULT_EIO; k <= VFS_FAULT_EINTR; k++)
        for (uint64_t i = 1; i <= 3; i++) {
            uint8_t *got = NULL;
            size_t len = 0;
            vfs_fault_set(k, i);
            int rc = base_read_file(path, 1u << 20, &got, &len, err, sizeof err);
            vfs_fault_set(VFS_FAULT_OFF, 0);
            if (k == VFS_FAULT_EIO && i <= 2) CHECK_MSG(rc && strstr(err, path), "eio:%llu: %s", (unsigned long long)i, err);
            else CHECK(rc == 0 && len == sizeof a && !memcmp(got, a, len));
            base_free(got);
        }
    /* a short write of a buffered fd: the wrapper moves half, vfs_write_full the rest */
    int fd = vfs_open(path, O_WRONLY | O_TRUNC, 0);
    CHECK(fd >= 0);
    vfs_fault_set(VFS_FAULT_SHORT, 1);
    ssize_t w = vfs_write(fd, b, 3000);
    CHECK(w > 0 && w < 3000);
    vfs_fault_set(VFS_FAULT_SHORT, 1);
    CHECK(vfs_write_full(fd, b, sizeof b) == 0);
    vfs_fault_set(VFS_FAULT_OFF, 0);
    close(fd);
}

/* The io ring: a failed completion fails its request with the file's name, a
 * short or interrupted one is read again; on the ring and on the pread path. */
TEST(faults_io_ring) {
    char path[1024], err[1024];
    snprintf(path, sizeof path, "%s/fz_ring.bin", t_tmpdir);
    const uint64_t size = 1u << 20;
    uint8_t *src = base_alloc(size, MEM_MISC), *dst = base_alloc_aligned(size, IO_ALIGN, MEM_MISC);
    for (uint64_t i = 0; i < size; i++) src[i] = (uint8_t)(i * 31 + (i >> 9));
    CHECK(base_write_file_atomic(path, src, size, err, sizeof err) == 0);
    for (int no_uring = 0; no_uring < 2; no_uring++) {
        io_file f;
        CHECK(io_file_open(&f, path, err, sizeof err) == 0);
        io_ring *r = NULL;
        CHECK(io_ring_create(&r, 4, 64 << 10, no_uring, err, sizeof err) == 0);
        if (!r) { io_file_close(&f); continue; }
        vfs_fault_set(VFS_FAULT_COUNT, 0);
        io_req q = {.f = &f, .off = 0, .len = size, .dst = dst}, *d;
        io_submit(r, &q);
        while (io_reap(r, 1, &d) == 1) {}
        const uint64_t calls = vfs_fault_calls();
        CHECK(q.rc == 0 && calls >= 16);
        for (int k = VFS_FAULT_EIO; k <= VFS_FAULT_EINTR; k++) {
            if (k == VFS_FAULT_ENOSPC) continue; /* reads only */
            for (uint64_t i = 1; i <= calls; i += fz_full() ? 1 : 3) {
                memset(dst, 0, size);
                vfs_fault_set(k, i);
                io_submit(r, &q);
                while (io_reap(r, 1, &d) == 1) {}
                vfs_fault_set(VFS_FAULT_OFF, 0);
                if (k == VFS_FAULT_EIO) {
                    CHECK_MSG(q.rc != 0, "eio:%llu (uring %d): read succeeded", (unsigned long long)i, !no_uring);
                    io_req_errstr(&q, err, sizeof err);
                    CHECK_MSG(strstr(err, path), "%s", err);
                } else {
                    CHECK_MSG(q.rc == 0 && !memcmp(dst, src, size), "%s:%llu (uring %d): rc %d",
                              vfs_fault_name(k), (unsigned long long)i, !no_uring, q.rc);
                }
            }
        }
        io_ring_free(r);
        io_file_close(&f);
    }
    base_free(src);
    base_free(dst);
}

const char *tpack_model(const char *name, const char *dir, uint64_t seed);

/* pack_build with 8 KiB reads and 12 KiB writes (many buffers in flight): every
 * failure names the file, leaves no manifest, and a build that passes writes the
 * reference pack byte for byte. */
TEST(faults_pack_small_io) {
    setenv("XDG_CACHE_HOME", t_tmpdir, 1);
    const char *m = tpack_model("tiny", "fz_pk_small", 3);
    CHECK(m != NULL);
    if (!m) return;
    cfg c;
    st_index *ix = NULL;
    char path[1200], err[2048], out[1100], ref[1100];
    snprintf(path, sizeof path, "%s/config.json", m);
    if (cfg_load(&c, path, err, sizeof err) || st_open(&ix, m, err, sizeof err)) { CHECK_MSG(0, "%s", err); return; }
    snprintf(ref, sizeof ref, "%s/fz_pk_ref", t_tmpdir);
    snprintf(out, sizeof out, "%s/fz_pk_out", t_tmpdir);
    pack_result res;
    CHECK(pack_build(m, &c, ix, ref, PACK_SMALL_IO, NULL, NULL, &res, err, sizeof err) == 0);
    vfs_fault_set(VFS_FAULT_COUNT, 0);
    CHECK(pack_build(m, &c, ix, out, PACK_SMALL_IO, NULL, NULL, &res, err, sizeof err) == 0);
    const uint64_t calls = vfs_fault_calls();
    vfs_fault_set(VFS_FAULT_OFF, 0);
    static uint64_t ns[8192];
    for (int k = VFS_FAULT_EIO; k <= VFS_FAULT_EINTR; k++) {
        int nn = fz_pick(calls, FZ_BUDGET, k, ns, 8192);
        for (int j = 0; j < nn; j++) {
            base_rm_rf(out);
            vfs_fault_set(k, ns[j]);
            int rc = pack_build(m, &c, ix, out, PACK_SMALL_IO, NULL, NULL, &res, err, sizeof err);
            vfs_fault_set(VFS_FAULT_OFF, 0);
            snprintf(path, sizeof path, "%s/manifest.json", out);
            if (rc) {
                CHECK_MSG(k == VFS_FAULT_EIO || k == VFS_FAULT_ENOSPC, "%s:%llu: %s", vfs_fault_name(k),
                          (unsigned long long)ns[j], err);
                CHECK_MSG(strstr(err, m) || strstr(err, out), "%s:%llu: names no file: %s", vfs_fault_name(k),
                          (unsigned long long)ns[j], err);
                CHECK_MSG(!base_is_file(path), "%s:%llu: a manifest was left", vfs_fault_name(k), (unsigned long long)ns[j]);
            } else {
                char a[1300], b[1300];
                int same = 1;
                for (int f = 0; f < 2; f++) {
                    snprintf(a, sizeof a, "%s/%s", ref, f ? "manifest.json" : "trunk.bin");
                    snprintf(b, sizeof b, "%s/%s", out, f ? "manifest.json" : "trunk.bin");
                    same &= fz_same_file(a, b);
                }
                CHECK_MSG(same, "%s:%llu: the pack differs", vfs_fault_name(k), (unsigned long long)ns[j]);
            }
            CHECK(fz_leftovers(out, "tmp") == 0);
        }
    }
    st_close(ix);
}

/* ====================================================================== the CLI */

/* gen-model: a failure leaves no model (fresh) or the old one (--force over a
 * model of another seed); a run that passes wrote the reference model. */
TEST(faults_gen_model) {
    char dir[1024], ref[1100], out[1100], old[1100], args[4096], spec[64];
    snprintf(dir, sizeof dir, "%s/fz_gen", t_tmpdir);
    snprintf(ref, sizeof ref, "%s/ref", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(old, sizeof old, "%s/old", dir);
    snprintf(args, sizeof args, "mkdir -p %s %s/fz_xdg && %s gen-model %s --preset tiny >/dev/null 2>&1 && "
             "%s gen-model %s --preset tiny --seed 7 >/dev/null 2>&1", dir, t_tmpdir, t_strata(), ref, t_strata(), old);
    CHECK(t_run(args, NULL) == 0);
    static uint64_t ns[4096];
    for (int force = 0; force < 2; force++) {
        snprintf(args, sizeof args, "gen-model %s --preset tiny%s", out, force ? " --force" : "");
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf %s%s%s", out, force ? " && cp -r " : "", force ? old : "");
        if (force) snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " %s", out);
        t_run(cmd, NULL);
        uint64_t n = fz_count(args, NULL, NULL, NULL);
        for (size_t k = 0; k < 4; k++) {
            if (force && k >= 2) break; /* short and eintr pass: covered fresh */
            /* short and eintr must pass wherever they land: fewer of them */
            int nn = fz_pick(n, k < 2 ? FZ_BUDGET / 2 : FZ_BUDGET / 6, (int)k, ns, 4096);
            for (int j = 0; j < nn; j++) {
                t_run(cmd, NULL);
                snprintf(spec, sizeof spec, "STRATA_FAULT=%s:%llu", k_kinds[k], (unsigned long long)ns[j]);
                fz_res r;
                fz_run(spec, args, NULL, &r);
                fz_check("gen-model", spec, &r, r.out, dir); /* stdout: timings; the tree is compared */
                if (r.rc == 0) {
                    CHECK_MSG(fz_same_tree(ref, out), "gen-model %s: passed but wrote another model", spec);
                } else if (force) {
                    CHECK_MSG(fz_same_tree(old, out), "gen-model --force %s: the old model was not kept", spec);
                } else if (base_is_dir(out)) {
                    fz_res i;
                    char ia[1200];
                    snprintf(ia, sizeof ia, "inspect %s", out);
                    fz_run(NULL, ia, NULL, &i);
                    CHECK_MSG(i.rc != 0, "gen-model %s: failed, and inspect accepts what it left", spec);
                    fz_free(&i);
                }
                CHECK_MSG(fz_leftovers(dir, "partial") == 0, "gen-model %s: partial directories left", spec);
                fz_free(&r);
            }
        }
    }
}

/* pack: after every failure `strata run` gives the reference ids (from the
 * shards or the old pack, never from a broken one); a pack that passes verifies. */
TEST(faults_pack) {
    const char *m = fz_model("fz_pack_m");
    CHECK(m != NULL);
    if (!m) return;
    char args[2048], run_args[2048], cmd[4400], spec[64], ver[2048];
    snprintf(run_args, sizeof run_args, "run %s --ids 1,2,3 --gen 4 --print-ids --ram-gb %.5f", m, fz_stream_gb(m));
    snprintf(ver, sizeof ver, "pack --verify %s", m);
    fz_res r0;
    fz_run(NULL, run_args, NULL, &r0);
    CHECK(r0.rc == 0 && strlen(r0.out) > 2);
    static uint64_t ns[4096];
    for (int force = 0; force < 2; force++) {
        snprintf(args, sizeof args, "pack %s --no-measure%s", m, force ? " --force" : "");
        if (force) snprintf(cmd, sizeof cmd, "rm -rf %s/strata.pack && %s pack %s --no-measure >/dev/null 2>&1", m, t_strata(), m);
        else snprintf(cmd, sizeof cmd, "rm -rf %s/strata.pack", m);
        t_run(cmd, NULL);
        uint64_t n = fz_count(args, NULL, NULL, NULL);
        for (size_t k = 0; k < 4; k++) {
            if (force && k >= 1) break; /* over an old pack: eio stands for the rest */
            /* short and eintr must pass wherever they land: fewer of them */
            int nn = fz_pick(n, k < 2 ? FZ_BUDGET / 3 : FZ_BUDGET / 6, (int)k, ns, 4096);
            for (int j = 0; j < nn; j++) {
                t_run(cmd, NULL);
                snprintf(spec, sizeof spec, "STRATA_FAULT=%s:%llu", k_kinds[k], (unsigned long long)ns[j]);
                fz_res r, a, v;
                fz_run(spec, args, NULL, &r);
                /* the pack prints its directory on stdout: compare through it */
                fz_check("pack", spec, &r, r.rc == 0 ? r.out : "", m);
                fz_run(NULL, run_args, NULL, &a);
                CHECK_MSG(a.rc == 0 && !strcmp(a.out, r0.out), "pack %s (exit %d): then run: exit %d '%s' vs '%s': %s", spec,
                          r.rc, a.rc, a.out, r0.out, a.err);
                if (r.rc == 0) {
                    fz_run(NULL, ver, NULL, &v);
                    CHECK_MSG(v.rc == 0, "pack %s passed, verify: %s", spec, v.err);
                    fz_free(&v);
                }
                char pd[1100];
                snprintf(pd, sizeof pd, "%s/strata.pack", m);
                if (base_is_dir(pd) && fz_leftovers(pd, "tmp")) {
                    char ls[1300], *o = NULL;
                    snprintf(ls, sizeof ls, "ls -la %s", pd);
                    t_run(ls, &o);
                    CHECK_MSG(0, "pack %s: temp files left: %s\n%s", spec, o, r.err);
                    base_free(o);
                }
                fz_free(&r);
                fz_free(&a);
            }
        }
    }
    fz_free(&r0);
}

/* run, resident (from the shards) and streamed (from a pack, at a budget that
 * streams the trunk and experts): same ids or a clean failure. */
TEST(faults_run) {
    double gb;
    const char *m = fz_packed("fz_run_m", &gb);
    if (!m) return;
    char spec[64];
    static uint64_t ns[4096];
    for (int s = 0; s < 2; s++) {
        char args[2048];
        snprintf(args, sizeof args, "run %s --ids 1,2,3 --gen 4 --print-ids", m);
        if (s) snprintf(args + strlen(args), sizeof args - strlen(args), " --ram-gb %.5f", gb);
        char *ref = NULL;
        uint64_t n = fz_count(args, NULL, NULL, &ref);
        for (size_t k = 0; k < 4 && ref; k++) {
            if (k == 1) continue; /* enospc: nothing here may allocate disk */
            int nn = fz_pick(n, FZ_BUDGET, (int)k + s, ns, 4096);
            for (int j = 0; j < nn; j++) {
                snprintf(spec, sizeof spec, "STRATA_FAULT=%s:%llu", k_kinds[k], (unsigned long long)ns[j]);
                fz_res r;
                fz_run(spec, args, NULL, &r);
                fz_check(s ? "run (streamed)" : "run (resident)", spec, &r, ref, m);
                fz_free(&r);
            }
        }
        base_free(ref);
    }
}

/* run --dump-logits over an older dump: afterwards the file is the old one or
 * the new one, byte for byte, never a partial dump, and no temp file is left;
 * exit 0 only with the new one. */
TEST(faults_run_dump) {
    const char *m = fz_model("fz_dump_m");
    CHECK(m != NULL);
    if (!m) return;
    char dp[1100], oldp[1100], newp[1100], args[2048], cmd[8192], spec[64];
    snprintf(dp, sizeof dp, "%s/fz.dump", t_tmpdir);
    snprintf(oldp, sizeof oldp, "%s/fz.dump.old", t_tmpdir);
    snprintf(newp, sizeof newp, "%s/fz.dump.new", t_tmpdir);
    snprintf(cmd, sizeof cmd, "%s run %s --ids 7 --gen 2 --print-ids --dump-logits %s >/dev/null 2>&1 && "
             "%s run %s --ids 1,2,3 --gen 4 --print-ids --dump-logits %s >/dev/null 2>&1", t_strata(), m, oldp, t_strata(), m, newp);
    CHECK(t_run(cmd, NULL) == 0);
    snprintf(args, sizeof args, "run %s --ids 1,2,3 --gen 4 --print-ids --dump-logits %s", m, dp);
    snprintf(cmd, sizeof cmd, "cp %s %s", oldp, dp);
    t_run(cmd, NULL);
    char *ref = NULL;
    uint64_t n = fz_count(args, NULL, NULL, &ref);
    static uint64_t ns[4096];
    for (size_t k = 0; k < 4 && ref; k++) {
        int cnt = fz_pick(n, FZ_BUDGET / 4, (int)k, ns, 4096);
        for (int j = 0; j < cnt; j++) {
            t_run(cmd, NULL);
            snprintf(spec, sizeof spec, "STRATA_FAULT=%s:%llu", k_kinds[k], (unsigned long long)ns[j]);
            fz_res r;
            fz_run(spec, args, NULL, &r);
            fz_check("run --dump-logits", spec, &r, ref, t_tmpdir);
            const int is_old = fz_same_file(dp, oldp), is_new = fz_same_file(dp, newp);
            CHECK_MSG(is_old || is_new, "run %s: the dump is neither the old nor the new one", spec);
            if (r.rc == 0) CHECK_MSG(is_new, "run %s: exit 0 without the new dump", spec);
            CHECK_MSG(fz_leftovers(t_tmpdir, "fz.dump.partial") == 0, "run %s: a partial dump was left", spec);
            fz_free(&r);
        }
    }
    base_free(ref);
}

/* chat /save over an older state file: the file afterwards is the old one or the
 * new one, byte for byte, with no temp file beside it; exit 1 when the save
 * failed. The sweep covers the whole session, the /save calls one by one. */
TEST(faults_chat_save) {
    const char *m = fz_model("fz_chat_m");
    CHECK(m != NULL);
    if (!m) return;
    char st[1100], oldp[1100], newp[1100], in[1100], args[2048], cmd[8192], spec[64];
    snprintf(st, sizeof st, "%s/fz_chat.state", t_tmpdir);
    snprintf(oldp, sizeof oldp, "%s/fz_chat.old", t_tmpdir);
    snprintf(newp, sizeof newp, "%s/fz_chat.new", t_tmpdir);
    snprintf(args, sizeof args, "chat %s --gen 4 --threads 1 --think off", m);
    snprintf(cmd, sizeof cmd, "printf 'Hello there\\n/save %s\\n' | %s %s >/dev/null 2>&1 && "
             "printf 'Hi\\n/save %s\\n' | %s %s >/dev/null 2>&1", oldp, t_strata(), args, newp, t_strata(), args);
    CHECK(t_run(cmd, NULL) == 0);
    char line[1200];
    snprintf(line, sizeof line, "Hi\n/save %s\n", st);
    snprintf(in, sizeof in, "%s", t_write("fz_chat.in", line, strlen(line)));
    uint8_t *ob = NULL, *nb = NULL, *got = NULL;
    size_t on = 0, nn_ = 0, gn = 0;
    CHECK(base_read_file(oldp, 1u << 26, &ob, &on, NULL, 0) == 0 && base_read_file(newp, 1u << 26, &nb, &nn_, NULL, 0) == 0);
    snprintf(cmd, sizeof cmd, "cp %s %s", oldp, st);
    t_run(cmd, NULL);
    char *ref = NULL;
    uint64_t n = fz_count(args, in, NULL, &ref);
    static uint64_t ns[4096];
    for (size_t k = 0; k < 4 && ref && ob && nb; k++) {
        int cnt = fz_pick(n, FZ_BUDGET, (int)k, ns, 4096);
        for (int j = 0; j < cnt; j++) {
            t_run(cmd, NULL);
            snprintf(spec, sizeof spec, "STRATA_FAULT=%s:%llu", k_kinds[k], (unsigned long long)ns[j]);
            fz_res r;
            fz_run(spec, args, in, &r);
            fz_check("chat /save", spec, &r, ref, t_tmpdir);
            got = NULL;
            CHECK(base_read_file(st, 1u << 26, &got, &gn, NULL, 0) == 0);
            const int is_old = got && gn == on && !memcmp(got, ob, on), is_new = got && gn == nn_ && !memcmp(got, nb, gn);
            CHECK_MSG(is_old || is_new, "chat %s: the state file is neither the old nor the new one", spec);
            if (r.rc == 0) CHECK_MSG(is_new, "chat %s: exit 0 without the new state", spec);
            CHECK_MSG(fz_leftovers(t_tmpdir, "fz_chat.state.tmp") == 0, "chat %s: a temp state file was left", spec);
            base_free(got);
            fz_free(&r);
        }
    }
    base_free(ref);
    base_free(ob);
    base_free(nb);
}

/* The allocation countdown over strata run from open to the first token (--gen
 * 1), resident and streamed: exit 0 with the same id (an allocation whose failure
 * has a fallback: JIT compile, a read-ahead) or a failure saying out of memory. */
TEST(faults_alloc_run) {
    double gb;
    const char *m = fz_packed("fz_alloc_m", &gb);
    if (!m) return;
    char spec[64];
    static uint64_t ns[16384];
    for (int s = 0; s < 2; s++) {
        char args[2048], *ref = NULL;
        uint64_t allocs = 0;
        snprintf(args, sizeof args, "run %s --ids 1,2,3 --gen 1 --print-ids", m);
        if (s) snprintf(args + strlen(args), sizeof args - strlen(args), " --ram-gb %.5f", gb);
        fz_count(args, NULL, &allocs, &ref);
        CHECK(allocs > 100);
        /* the parsers' allocations come first and are where jansson broke: denser */
        int cnt = 0;
        for (uint64_t i = 1 + (uint64_t)s; i <= allocs && i <= 320; i += fz_full() ? 1 : FZ_ALLOC_STRIDE) ns[cnt++] = i;
        if (allocs > 320) {
            const int more = fz_pick(allocs - 320, FZ_BUDGET * 2, s, ns + cnt, 16384 - cnt);
            for (int j = cnt; j < cnt + more; j++) ns[j] += 320;
            cnt += more;
        }
        for (int j = 0; j < cnt; j++) {
            snprintf(spec, sizeof spec, "STRATA_FAIL_ALLOC=%llu", (unsigned long long)ns[j]);
            fz_res r;
            fz_run(spec, args, NULL, &r);
            CHECK_MSG(r.rc >= 0 && r.rc < 128, "run %s: exit %d (a signal?): %s", spec, r.rc, r.err);
            if (r.rc == 0) CHECK_MSG(!strcmp(r.out, ref), "run %s: exit 0 with '%s' vs '%s'", spec, r.out, ref);
            else CHECK_MSG(strstr(r.err, "out of memory") || strstr(r.err, "cannot allocate"),
                           "run %s: exit %d without saying out of memory: %s", spec, r.rc, r.err);
            fz_free(&r);
        }
        base_free(ref);
    }
}

/* jansson 2.14 wrote through a failed buffer when an allocation failed inside
 * json_loadb (SEGV, the STRATA_FAIL_ALLOC sweep of run at config.json): every
 * allocation of a parse fails once in turn; each parse ends with the tree or
 * ENOMEM, never a crash, and a tree only when nothing failed. */
TEST(faults_alloc_json) {
    char path[1100];
    const char *m = fz_model("fz_json_m");
    CHECK(m != NULL);
    if (!m) return;
    static const char *files[] = {"config.json", "tokenizer_config.json"};
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        snprintf(path, sizeof path, "%s/%s", m, files[f]);
        uint8_t *buf;
        size_t len;
        if (base_read_file(path, 1u << 24, &buf, &len, NULL, 0)) { CHECK(0); continue; }
        const uint64_t a0 = base_mem_allocs();
        json_t *j = jsonx_load(buf, len, path, NULL, 0);
        const uint64_t n = base_mem_allocs() - a0;
        CHECK(j != NULL && n > 10);
        json_decref(j);
        for (uint64_t i = 1; i <= n + 1; i++) {
            char err[1200] = "";
            json_t *k = NULL;
            base_mem_fail_after(i);
            int rc = jsonx_parse(&k, buf, len, path, err, sizeof err);
            base_mem_fail_after(0);
            if (i <= n) CHECK_MSG(rc == STRATA_ENOMEM && !k && strstr(err, "out of memory"), "%s, allocation %llu: rc %d %s",
                                  files[f], (unsigned long long)i, rc, err);
            else CHECK(rc == 0 && k);
            json_decref(k);
        }
        base_free(buf);
    }
}
