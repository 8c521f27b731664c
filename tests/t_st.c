/* t_st.c: safetensors reader: valid shards and directories, every refusal with
 * its message, st_read, allocation failures, and the indexing speed of a K3-sized
 * header. Files are generated here; nothing is read from tests/data. */
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "st.h"
#include "stw.h"
#include "test.h"

/* ---- writers ---- */

/* Writes u64 LE len(hdr) + hdr + data_len bytes of pattern (byte i = i*7+3). */
static const char *wr_shard(const char *name, const char *hdr, size_t data_len) {
    size_t hl = strlen(hdr);
    uint8_t *b = base_alloc(8 + hl + data_len + 1, MEM_MISC);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)(i * 7 + 3);
    const char *p = t_write(name, b, 8 + hl + data_len);
    base_free(b);
    return p;
}

/* Raw file: 8-byte length field `hl` (any value), then `rest`. */
static const char *wr_raw(const char *name, uint64_t hl, const char *rest) {
    uint8_t b[4096];
    size_t n = strlen(rest);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hl >> (8 * i));
    memcpy(b + 8, rest, n);
    return t_write(name, b, 8 + n);
}

static void mkdir_t(const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", t_tmpdir, name);
    base_rm_rf(p);
    CHECK(base_mkdir_p(p, NULL, 0) == 0);
}

static const char *tpath(const char *name) {
    static char p[4][1024];
    static int k;
    char *s = p[k++ % 4];
    snprintf(s, 1024, "%s/%s", t_tmpdir, name);
    return s;
}

/* Expects st_open(path) to fail with rc and a message holding the file name and phrase. */
static void expect_fail(const char *path, int rc_want, const char *file_part, const char *phrase) {
    st_index *ix = (st_index *)1;
    char err[1024] = "";
    int rc = st_open(&ix, path, err, sizeof err);
    CHECK_MSG(rc == rc_want, "%s: rc %d, want %d (%s)", path, rc, rc_want, err);
    CHECK(ix == NULL);
    CHECK_MSG(strstr(err, file_part) != NULL, "'%s' not in '%s'", file_part, err);
    CHECK_MSG(strstr(err, phrase) != NULL, "'%s' not in '%s'", phrase, err);
    if (ix) st_close(ix);
}

/* ---- valid files ---- */

TEST(st_single) {
    /* a: BF16 [2, 3] at 0..12; s: rank-0 F32 at 12..16; z: U8 [0, 5] empty at 16;
     * h: F16 [3] (odd length) at 16..22. Header order differs from offset order. */
    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[16,22]},"
        "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
        "\"z\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[16,16]},"
        "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]},"
        "\"esc\\\"aped\\u00e9\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[24,32]}}";
    const char *p = wr_shard("single.safetensors", hdr, 32);
    st_index *ix;
    char err[512] = "";
    int rc = st_open(&ix, p, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc) return;
    CHECK(st_count(ix) == 5);
    CHECK(st_n_shards(ix) == 1);
    CHECK(!strcmp(st_shard_path(ix, 0), p));
    CHECK(st_shard_fd(ix, 0) >= 0);
    CHECK(st_shard_size(ix, 0) == 8 + strlen(hdr) + 32);
    uint64_t base = 8 + strlen(hdr);
    const st_tensor *a = st_find(ix, "a"), *s = st_find(ix, "s"), *z = st_find(ix, "z");
    const st_tensor *h = st_find(ix, "h"), *e = st_find(ix, "esc\"aped\xc3\xa9");
    CHECK(a && s && z && h && e);
    if (!(a && s && z && h && e)) { st_close(ix); return; }
    CHECK(a->dtype == DT_BF16 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3);
    CHECK(a->off == base && a->nbytes == 12);
    CHECK(s->dtype == DT_F32 && s->ndim == 0 && s->nbytes == 4 && s->off == base + 12);
    CHECK(z->ndim == 2 && z->shape[0] == 0 && z->nbytes == 0);
    CHECK(h->dtype == DT_F16 && h->nbytes == 6);
    CHECK(e->dtype == DT_I64 && e->off == base + 24);
    CHECK(st_find(ix, "b") == NULL);
    CHECK(st_find(ix, "") == NULL);
    CHECK(st_find(ix, "a ") == NULL);
    /* file order: by data offset (z and h tie at 16; the empty one first) */
    CHECK(st_at(ix, 0) == a && st_at(ix, 1) == s && st_at(ix, 2) == z && st_at(ix, 3) == h);
    CHECK(st_at(ix, 4) == e && st_at(ix, 5) == NULL);
    /* st_read: whole tensor, a slice, empty, and out of range */
    uint8_t buf[16];
    CHECK(st_read(ix, h, 0, buf, 6, err, sizeof err) == 0);
    for (int i = 0; i < 6; i++) CHECK(buf[i] == (uint8_t)((16 + i) * 7 + 3));
    CHECK(st_read(ix, a, 5, buf, 7, err, sizeof err) == 0);
    for (int i = 0; i < 7; i++) CHECK(buf[i] == (uint8_t)((5 + i) * 7 + 3));
    CHECK(st_read(ix, z, 0, NULL, 0, err, sizeof err) == 0);
    CHECK(st_read(ix, a, 5, buf, 8, err, sizeof err) == STRATA_EINVAL);
    CHECK(strstr(err, "'a'") && strstr(err, "outside"));
    CHECK(st_read(ix, a, UINT64_MAX, buf, 2, err, sizeof err) == STRATA_EINVAL);
    /* the fd is usable directly */
    CHECK(pread(st_shard_fd(ix, 0), buf, 4, (off_t)s->off) == 4);
    CHECK(buf[0] == (uint8_t)(12 * 7 + 3));
    st_close(ix);
    st_close(NULL);
    CHECK(st_dtype_parse("F8_E4M3") == DT_F8_E4M3 && st_dtype_size(DT_F8_E4M3) == 1);
    CHECK(st_dtype_parse("bf16") == -1 && st_dtype_parse("F64") == -1);
    for (int d = 0; d < DT_COUNT; d++) CHECK(st_dtype_parse(st_dtype_name(d)) == d);
}

/* Two shards of three tensors; names "t<shard>_<i>", each F32 [4]. */
static void wr_two_shards(const char *dir, const char *names0, const char *names1) {
    char hdr[1024], nm[512];
    const char *sets[2] = {names0, names1};
    for (int s = 0; s < 2; s++) {
        char list[3][64];
        sscanf(sets[s], "%63[^,],%63[^,],%63s", list[0], list[1], list[2]);
        snprintf(hdr, sizeof hdr,
                 "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                 "\"%s\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]},"
                 "\"%s\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[32,48]}}",
                 list[0], list[1], list[2]);
        snprintf(nm, sizeof nm, "%s/model-%05d-of-00002.safetensors", dir, s + 1);
        wr_shard(nm, hdr, 48);
    }
}

TEST(st_dir) {
    mkdir_t("dir1");
    wr_two_shards("dir1", "b0,b1,b2", "a0,a1,a2");
    t_write("dir1/config.json", "{}", 2);
    t_write("dir1/._model-00001-of-00002.safetensors", "junk", 4); /* macOS dropping: skipped */
    st_index *ix;
    char err[512] = "";
    int rc = st_open(&ix, tpath("dir1"), err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc) return;
    CHECK(st_n_shards(ix) == 2 && st_count(ix) == 6);
    CHECK(strstr(st_shard_path(ix, 0), "model-00001-of-00002.safetensors") != NULL);
    const char *names[6] = {"b0", "b1", "b2", "a0", "a1", "a2"};
    for (int i = 0; i < 6; i++) {
        const st_tensor *t = st_find(ix, names[i]);
        CHECK(t && t == st_at(ix, (size_t)i) && t->shard == i / 3 && t->nbytes == 16);
        uint8_t b[16];
        CHECK(t && st_read(ix, t, 0, b, 16, err, sizeof err) == 0);
        CHECK(t && b[0] == (uint8_t)((i % 3) * 16 * 7 + 3));
    }
    st_close(ix);

    /* same shards through an index; a stray shard the index does not name is ignored */
    const char *ij =
        "{\"metadata\":{\"total_size\":96},\"weight_map\":{"
        "\"a0\":\"model-00002-of-00002.safetensors\",\"b0\":\"model-00001-of-00002.safetensors\","
        "\"a1\":\"model-00002-of-00002.safetensors\",\"b1\":\"model-00001-of-00002.safetensors\","
        "\"a2\":\"model-00002-of-00002.safetensors\",\"b2\":\"model-00001-of-00002.safetensors\"}}";
    t_write("dir1/model.safetensors.index.json", ij, strlen(ij));
    wr_shard("dir1/zz-stray.safetensors", "{}", 0);
    rc = st_open(&ix, tpath("dir1"), err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc) return;
    CHECK(st_n_shards(ix) == 2 && st_count(ix) == 6);
    for (int i = 0; i < 6; i++) {
        const st_tensor *t = st_find(ix, names[i]);
        CHECK(t && t->shard == i / 3);
    }
    st_close(ix);
    /* shards reached through symlinks (Hugging Face cache layout) */
    mkdir_t("dir2");
    char src[1200], dst[1200];
    for (int s = 1; s <= 2; s++) {
        snprintf(src, sizeof src, "%s/dir1/model-%05d-of-00002.safetensors", t_tmpdir, s);
        snprintf(dst, sizeof dst, "%s/dir2/model-%05d-of-00002.safetensors", t_tmpdir, s);
        CHECK(symlink(src, dst) == 0);
    }
    rc = st_open(&ix, tpath("dir2"), err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc) return;
    CHECK(st_n_shards(ix) == 2 && st_count(ix) == 6);
    st_close(ix);
    /* the index file path itself works too */
    rc = st_open(&ix, tpath("dir1/model.safetensors.index.json"), err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc) return;
    CHECK(st_n_shards(ix) == 2 && st_count(ix) == 6 && st_find(ix, "a2")->shard == 1);
    st_close(ix);
}

/* ---- refusals ---- */

TEST(st_bad_files) {
    char msg[256];
    t_write("empty.safetensors", "", 0);
    expect_fail(tpath("empty.safetensors"), STRATA_EFORMAT, "empty.safetensors", "too short");
    t_write("four.safetensors", "\x10\0\0\0", 4);
    expect_fail(tpath("four.safetensors"), STRATA_EFORMAT, "four.safetensors", "too short");
    wr_raw("big.safetensors", 1000, "{}");
    expect_fail(tpath("big.safetensors"), STRATA_EFORMAT, "big.safetensors", "header length 1000");
    wr_raw("huge.safetensors", 1ull << 63, "{}");
    expect_fail(tpath("huge.safetensors"), STRATA_EFORMAT, "huge.safetensors", "header length 9223372036854775808");
    wr_raw("max.safetensors", UINT64_MAX, "{}");
    expect_fail(tpath("max.safetensors"), STRATA_EFORMAT, "max.safetensors", "header length");
    wr_raw("hdr7.safetensors", 7, "{}");
    expect_fail(tpath("hdr7.safetensors"), STRATA_EFORMAT, "hdr7.safetensors", "header length 7");
    wr_shard("badjson.safetensors", "{\"a\":{\"dtype\":\"F32\",", 0);
    expect_fail(tpath("badjson.safetensors"), STRATA_EFORMAT, "badjson.safetensors", "invalid JSON");
    wr_shard("zerolen.safetensors", "", 0);
    expect_fail(tpath("zerolen.safetensors"), STRATA_EFORMAT, "zerolen.safetensors", "invalid JSON");
    wr_shard("array.safetensors", "[1,2]", 0);
    expect_fail(tpath("array.safetensors"), STRATA_EFORMAT, "array.safetensors", "header is not a JSON object");
    wr_shard("notobj.safetensors", "{\"a\":3}", 0);
    expect_fail(tpath("notobj.safetensors"), STRATA_EFORMAT, "notobj.safetensors", "'a': entry is not a JSON object");
    expect_fail(tpath("nonexistent.safetensors"), STRATA_EIO, "nonexistent.safetensors", "no such file");

    /* A tensor past EOF, the classic truncated download. */
    wr_shard("pasteof.safetensors",
             "{\"w\":{\"dtype\":\"BF16\",\"shape\":[64,64],\"data_offsets\":[0,8192]}}", 8000);
    expect_fail(tpath("pasteof.safetensors"), STRATA_EFORMAT, "pasteof.safetensors", "tensor 'w': data_offsets [0, 8192] end past EOF");
    wr_shard("overlap.safetensors",
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20);
    expect_fail(tpath("overlap.safetensors"), STRATA_EFORMAT, "overlap.safetensors", "tensor 'y': bytes [12, 20) overlap tensor 'x'");
    /* Identical ranges overlap too; empty ranges never do. */
    wr_shard("overlap2.safetensors",
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"y\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
    expect_fail(tpath("overlap2.safetensors"), STRATA_EFORMAT, "overlap2.safetensors", "overlap");
    wr_shard("size.safetensors",
             "{\"language_model.model.layers.3.self_attn.q_proj.weight\":"
             "{\"dtype\":\"BF16\",\"shape\":[64,64],\"data_offsets\":[0,4096]}}", 8192);
    expect_fail(tpath("size.safetensors"), STRATA_EFORMAT, "size.safetensors",
                "size.safetensors: tensor 'language_model.model.layers.3.self_attn.q_proj.weight': "
                "data_offsets [0, 4096] but shape [64, 64] x BF16 = 8192 bytes");

    /* Each entry field mutated. */
    static const struct { const char *entry, *phrase; } k_bad[] = {
        {"{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}", "shape[0] is negative"},
        {"{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,16]}", "shape[0] is not an integer"},
        {"{\"dtype\":\"F32\",\"shape\":[4.0],\"data_offsets\":[0,16]}", "shape[0] is not an integer"},
        {"{\"dtype\":\"F32\",\"shape\":[2,\"2\"],\"data_offsets\":[0,16]}", "shape[1] is not an integer"},
        {"{\"dtype\":\"F32\",\"shape\":[true],\"data_offsets\":[0,16]}", "shape[0] is not an integer"},
        {"{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}", "shape is not an array"},
        {"{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}", "unknown dtype 'F64'"},
        {"{\"dtype\":\"bf16\",\"shape\":[8],\"data_offsets\":[0,16]}", "unknown dtype 'bf16'"},
        {"{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,16]}", "dtype is not a string"},
        {"{\"shape\":[4],\"data_offsets\":[0,16]}", "missing \"dtype\""},
        {"{\"dtype\":\"F32\",\"data_offsets\":[0,16]}", "missing \"shape\""},
        {"{\"dtype\":\"F32\",\"shape\":[4]}", "missing \"data_offsets\""},
        {"{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16],\"crc\":1}", "unknown key 'crc'"},
        {"{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}", "begin > end"},
        {"{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16,32]}", "data_offsets has more than 2 values"},
        {"{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0.0,16]}", "data_offsets[0] is not an integer"},
        {"{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[-16,0]}", "negative"},
        {"{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}", "shape has more than 8 dims"},
        {"{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}", "element count overflows"},
        {"{\"dtype\":\"I64\",\"shape\":[4294967296,1073741824],\"data_offsets\":[0,1]}", "byte size overflows"},
        {"{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,18446744073709551615]}", "data_offsets[1] is out of range"},
        {"{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[9223372036854775800,9223372036854775807]}", "but shape [4]"},
        {"{\"dtype\":\"U8\",\"shape\":[9223372036854775807],\"data_offsets\":[0,9223372036854775807]}", "past EOF"},
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        char hdr[512];
        snprintf(hdr, sizeof hdr, "{\"ok\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[16,18]},\"w\":%s}",
                 k_bad[i].entry);
        snprintf(msg, sizeof msg, "bad%02zu.safetensors", i);
        wr_shard(msg, hdr, 18);
        expect_fail(tpath(msg), STRATA_EFORMAT, msg, k_bad[i].phrase);
    }
    /* Overflow: shape product 0 in one dim is fine even if others are huge. */
    wr_shard("zerodim.safetensors",
             "{\"w\":{\"dtype\":\"I64\",\"shape\":[9223372036854775807,0,9223372036854775807],"
             "\"data_offsets\":[0,0]}}", 0);
    st_index *ix;
    char err[512];
    CHECK_MSG(st_open(&ix, tpath("zerodim.safetensors"), err, sizeof err) == 0, "%s", err);
    st_close(ix);

    wr_shard("dup.safetensors",
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}", 32);
    expect_fail(tpath("dup.safetensors"), STRATA_EFORMAT, "dup.safetensors", "duplicate");
    wr_shard("meta.safetensors", "{\"__metadata__\":{\"format\":1}}", 0);
    expect_fail(tpath("meta.safetensors"), STRATA_EFORMAT, "meta.safetensors", "__metadata__ value 'format' is not a string");
    wr_shard("meta2.safetensors", "{\"__metadata__\":[]}", 0);
    expect_fail(tpath("meta2.safetensors"), STRATA_EFORMAT, "meta2.safetensors", "__metadata__ is not an object");
    wr_shard("nul.safetensors", "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0);
    expect_fail(tpath("nul.safetensors"), STRATA_EFORMAT, "nul.safetensors", "NUL byte");
    wr_shard("emptyname.safetensors", "{\"\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0);
    expect_fail(tpath("emptyname.safetensors"), STRATA_EFORMAT, "emptyname.safetensors", "empty tensor name");
    /* header claims more bytes than the file holds, but is under the limit */
    uint8_t b8[8 + 2] = {0xff, 0xff, 0xff, 0x05, 0, 0, 0, 0, '{', '}'};
    t_write("over.safetensors", b8, sizeof b8);
    expect_fail(tpath("over.safetensors"), STRATA_EFORMAT, "over.safetensors", "header length");
}

TEST(st_bad_dirs) {
    /* the same tensor name in two shards */
    mkdir_t("dupdir");
    wr_two_shards("dupdir", "a,b,c", "d,b,e");
    expect_fail(tpath("dupdir"), STRATA_EFORMAT, "model-00002-of-00002.safetensors", "tensor 'b': duplicate tensor name, also in");
    expect_fail(tpath("dupdir"), STRATA_EFORMAT, "dupdir/model-00001-of-00002.safetensors", "duplicate");

    mkdir_t("emptydir");
    expect_fail(tpath("emptydir"), STRATA_EIO, "emptydir", "no *.safetensors");

    /* index naming a missing shard */
    mkdir_t("idx1");
    wr_two_shards("idx1", "a,b,c", "d,e,f");
    const char *ij1 = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"z\":\"model-00009.safetensors\"}}";
    t_write("idx1/model.safetensors.index.json", ij1, strlen(ij1));
    expect_fail(tpath("idx1"), STRATA_EIO, "model.safetensors.index.json", "names shard 'model-00009.safetensors' (for tensor 'z')");

    /* index naming a tensor the shard does not hold */
    const char *s1 = "model-00001-of-00002.safetensors", *s2 = "model-00002-of-00002.safetensors";
    char ij[1024];
    snprintf(ij, sizeof ij, "{\"weight_map\":{\"a\":\"%s\",\"b\":\"%s\",\"c\":\"%s\",\"d\":\"%s\",\"e\":\"%s\","
             "\"f\":\"%s\",\"g\":\"%s\"}}", s1, s1, s1, s2, s2, s2, s2);
    t_write("idx1/model.safetensors.index.json", ij, strlen(ij));
    expect_fail(tpath("idx1"), STRATA_EFORMAT, "model.safetensors.index.json", "tensor 'g' in 'model-00002-of-00002.safetensors' but that shard's header does not contain it");
    /* index putting a tensor in the wrong shard */
    snprintf(ij, sizeof ij, "{\"weight_map\":{\"a\":\"%s\",\"b\":\"%s\",\"c\":\"%s\",\"d\":\"%s\",\"e\":\"%s\","
             "\"f\":\"%s\"}}", s1, s1, s2, s2, s2, s2);
    t_write("idx1/model.safetensors.index.json", ij, strlen(ij));
    expect_fail(tpath("idx1"), STRATA_EFORMAT, "model.safetensors.index.json", "tensor 'c' in 'model-00002-of-00002.safetensors' but it is in another shard");
    /* a tensor in a shard but absent from the index */
    snprintf(ij, sizeof ij, "{\"weight_map\":{\"a\":\"%s\",\"b\":\"%s\",\"c\":\"%s\",\"d\":\"%s\",\"e\":\"%s\"}}",
             s1, s1, s1, s2, s2);
    t_write("idx1/model.safetensors.index.json", ij, strlen(ij));
    expect_fail(tpath("idx1"), STRATA_EFORMAT, "model-00002-of-00002.safetensors", "tensor 'f': in the shard header but absent");
    /* malformed index files */
    static const struct { const char *json, *phrase; } k_idx[] = {
        {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", "plain file name"},
        {"{\"weight_map\":{\"a\":\"sub/x.safetensors\"}}", "plain file name"},
        {"{\"weight_map\":{\"a\":\"..\"}}", "plain file name"},
        {"{\"weight_map\":{\"a\":3}}", "plain file name"},
        {"{\"weight_map\":[]}", "weight_map"},
        {"{\"metadata\":{}}", "weight_map"},
        {"{\"metadata\":3,\"weight_map\":{}}", "metadata"},
        {"{\"weight_map\":{}}", "weight_map is empty"},
        {"[]", "not a JSON object"},
        {"{\"weight_map\":{\"a\":\"x\"", "invalid JSON"},
        {"{\"weight_map\":{\"a\":", "plain file name"},
        {"{\"weight_map\":{\"a\":\"x\",}}", "invalid JSON"},
        {"{\"weight_map\":{}} x", "trailing bytes"},
        {"{\"weight_map\":{},\"weight_map\":{}}", "duplicate \"weight_map\""},
        {"{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"a\":\"model-00001-of-00002.safetensors\"}}",
         "tensor 'a': duplicate key in weight_map"},
        {"{\"weight_map\":{\"\":\"x\"}}", "empty name"},
    };
    for (size_t i = 0; i < sizeof k_idx / sizeof k_idx[0]; i++) {
        t_write("idx1/model.safetensors.index.json", k_idx[i].json, strlen(k_idx[i].json));
        expect_fail(tpath("idx1"), STRATA_EFORMAT, "model.safetensors.index.json", k_idx[i].phrase);
    }
}

/* A shard truncated after opening: st_read reports a short read. */
TEST(st_short_read) {
    const char *p = wr_shard("trunc.safetensors",
                             "{\"w\":{\"dtype\":\"U8\",\"shape\":[100],\"data_offsets\":[0,100]}}", 100);
    st_index *ix;
    char err[512] = "";
    CHECK(st_open(&ix, p, err, sizeof err) == 0);
    if (!ix) return;
    CHECK(truncate(p, (off_t)(st_shard_size(ix, 0) - 10)) == 0);
    uint8_t b[100];
    const st_tensor *t = st_find(ix, "w");
    CHECK(st_read(ix, t, 0, b, 89, err, sizeof err) == 0);
    CHECK(st_read(ix, t, 0, b, 100, err, sizeof err) == STRATA_EIO);
    CHECK_MSG(strstr(err, "trunc.safetensors") && strstr(err, "'w'") && strstr(err, "short read"), "%s", err);
    st_close(ix);
}

/* Every allocation failure point of st_open returns ENOMEM and leaks nothing. */
TEST(st_oom) {
    mkdir_t("oomdir");
    wr_two_shards("oomdir", "a,b,c", "d,e,f");
    const char *s1 = "model-00001-of-00002.safetensors", *s2 = "model-00002-of-00002.safetensors";
    char ij[1024];
    snprintf(ij, sizeof ij, "{\"weight_map\":{\"a\":\"%s\",\"b\":\"%s\",\"c\":\"%s\",\"d\":\"%s\",\"e\":\"%s\","
             "\"f\":\"%s\"}}", s1, s1, s1, s2, s2, s2);
    t_write("oomdir/model.safetensors.index.json", ij, strlen(ij));
    uint64_t used0 = base_mem_used();
    int ok = 0, n_fail = 0;
    for (uint64_t k = 1; k < 2000 && !ok; k++) {
        st_index *ix;
        char err[512] = "";
        base_mem_fail_after(k);
        int rc = st_open(&ix, tpath("oomdir"), err, sizeof err);
        base_mem_fail_after(0);
        if (rc == 0) { ok = 1; CHECK(st_count(ix) == 6); st_close(ix); }
        else {
            n_fail++;
            CHECK_MSG(rc == STRATA_ENOMEM, "k=%llu rc=%d %s", (unsigned long long)k, rc, err);
        }
        CHECK(base_mem_used() == used0);
    }
    CHECK(ok && n_fail > 5);
}

/* ---- a K3-sized shard ---- */

/* Header of a K3-like shard: trunk tensors of `layer` then experts e0.. until
 * ~n_tensors names, offsets consecutive. Returns the MEM_MISC JSON and the data size. */
static char *k3_header(int layer, int n_tensors, uint64_t *data_bytes, int *n_out) {
    sbuf b = {0};
    uint64_t off = 0;
    int n = 0;
    sbuf_printf(&b, "{\"__metadata__\":{\"format\":\"pt\"}");
    static const char *trunk[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.g_proj.weight", "self_attn.o_proj.weight", "block_sparse_moe.gate.weight"};
    static const int64_t tshape[][2] = {{7168, 0}, {7168, 0}, {12288, 7168}, {12288, 7168},
        {12288, 7168}, {12288, 7168}, {7168, 12288}, {896, 7168}};
    for (int i = 0; i < 8; i++, n++) {
        uint64_t nb = (uint64_t)tshape[i][0] * (tshape[i][1] ? (uint64_t)tshape[i][1] : 1) * 2;
        if (tshape[i][1])
            sbuf_printf(&b, ",\"language_model.model.layers.%d.%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],"
                        "\"data_offsets\":[%llu,%llu]}", layer, trunk[i], (long long)tshape[i][0],
                        (long long)tshape[i][1], (unsigned long long)off, (unsigned long long)(off + nb));
        else
            sbuf_printf(&b, ",\"language_model.model.layers.%d.%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],"
                        "\"data_offsets\":[%llu,%llu]}", layer, trunk[i], (long long)tshape[i][0],
                        (unsigned long long)off, (unsigned long long)(off + nb));
        off += nb;
    }
    static const char *w[] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                              "w2.weight_scale", "w3.weight_packed", "w3.weight_scale"};
    static const int64_t ws[][2] = {{3072, 1792}, {3072, 112}, {3584, 1536}, {3584, 96}, {3072, 1792}, {3072, 112}};
    for (int e = 0; n < n_tensors; e++)
        for (int k = 0; k < 6 && n < n_tensors; k++, n++) {
            uint64_t nb = (uint64_t)ws[k][0] * (uint64_t)ws[k][1];
            sbuf_printf(&b, ",\"language_model.model.layers.%d.block_sparse_moe.experts.%d.%s\":{\"dtype\":\"U8\","
                        "\"shape\":[%lld,%lld],\"data_offsets\":[%llu,%llu]}", layer, e, w[k],
                        (long long)ws[k][0], (long long)ws[k][1], (unsigned long long)off,
                        (unsigned long long)(off + nb));
            off += nb;
        }
    sbuf_printf(&b, "}");
    *data_bytes = off;
    *n_out = n;
    return b.s;
}

/* Writes a sparse K3-like shard (data region is a hole, via ftruncate). */
static int wr_k3_shard(const char *path, int layer, int n_tensors, size_t *hdr_bytes) {
    uint64_t data;
    int n;
    char *h = k3_header(layer, n_tensors, &data, &n);
    size_t hl = strlen(h);
    *hdr_bytes = hl;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint8_t pre[8];
    for (int i = 0; i < 8; i++) pre[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    int ok = fd >= 0 && write(fd, pre, 8) == 8 && write(fd, h, hl) == (ssize_t)hl &&
             ftruncate(fd, (off_t)(8 + hl + data)) == 0;
    if (fd >= 0) close(fd);
    base_free(h);
    return ok ? n : -1;
}

/* Two 5,200-tensor shards (~800 KB headers, ~15 GB sparse each): indexing must stay
 * far below the 1 s/shard budget. Measured on the dev box: see bench/b_index.c. */
TEST(st_k3_scale) {
    mkdir_t("k3");
    size_t hb = 0;
    int n0 = 0;
    for (int s = 0; s < 2; s++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/k3/model-%05d-of-00096.safetensors", t_tmpdir, s + 1);
        int n = wr_k3_shard(p, s + 1, 5200, &hb);
        CHECK(n == 5200);
        n0 += n;
    }
    st_index *ix;
    char err[512] = "";
    double t0 = base_now();
    int rc = st_open(&ix, tpath("k3"), err, sizeof err);
    double dt = base_now() - t0;
    CHECK_MSG(rc == 0, "%s", err);
    if (rc) return;
    CHECK(st_count(ix) == (size_t)n0);
    printf("     st_open: 2 shards x 5200 tensors, %zu-byte headers: %.1f ms (%.1f ms/shard)\n", hb,
           dt * 1e3, dt * 1e3 / 2);
    CHECK_MSG(dt < 2.0, "st_open took %.3f s", dt);
    /* every tensor is found, and in offset order within each shard */
    int found = 0;
    for (size_t i = 0; i < st_count(ix); i++) {
        const st_tensor *t = st_at(ix, i);
        found += st_find(ix, t->name) == t;
        if (i && st_at(ix, i - 1)->shard == t->shard)
            CHECK(st_at(ix, i - 1)->off + st_at(ix, i - 1)->nbytes == t->off);
    }
    CHECK(found == n0);
    const st_tensor *t = st_find(ix, "language_model.model.layers.2.block_sparse_moe.experts.100.w2.weight_scale");
    CHECK(t && t->shard == 1 && t->dtype == DT_U8 && t->shape[0] == 3584 && t->shape[1] == 96);
    st_close(ix);
}

/* ---- the pure parsers on byte buffers ---- */

/* st_parse_header over "8-byte length + hdr + data_len zero bytes". */
static int parse_buf(const char *hdr, size_t hl, size_t data_len, st_index *ix, char *err, size_t errlen) {
    uint8_t b[1024] = {0};
    if (8 + hl + data_len > sizeof b) return -100;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    return st_parse_header(ix, 0, b, 8 + hl + data_len, 8 + hl + data_len, "buf.safetensors", err, errlen);
}

TEST(st_json_strict) {
    static const struct { const char *hdr; const char *phrase; } k_cases[] = {
        /* accepted (phrase NULL) */
        {"{}", NULL},
        {" \t\r\n{ } \n  ", NULL},
        {"{\"__metadata__\":{}}", NULL},
        {"{\"a\\u00e9\\ud83d\\ude00\\n\\\"\\\\\\/\\b\\f\\r\\t\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]}}", NULL},
        {"{\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", NULL},
        {"{\"w\":{\"data_offsets\":[0,1],\"shape\":[-0],\"dtype\":\"U8\"}}", "data_offsets [0, 1] but shape [0]"},
        /* refused */
        {"", "invalid JSON at byte 8: the header is not a JSON object"},
        {"{", "invalid JSON"},
        {"{,}", "invalid JSON"},
        {"{\"a\":{}", "tensor 'a': missing \"dtype\""},
        {"{\"a\":{\"dtype\":\"U8\"", "tensor 'a': invalid JSON"},
        {"{}}", "trailing bytes"},
        {"{\"a\" {}}", "expected ':'"},
        {"{'a':{}}", "expected a string"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],}}", "tensor 'a': invalid JSON"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,],\"data_offsets\":[0,1]}}", "shape[1] is not an integer"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[01],\"data_offsets\":[0,1]}}", "invalid JSON"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1e0],\"data_offsets\":[0,1]}}", "shape[0] is not an integer"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.],\"data_offsets\":[0,1]}}", "bad number"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,1]}}", "shape[0] is out of range"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-9223372036854775808],\"data_offsets\":[0,1]}}", "shape[0] is negative"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[NaN],\"data_offsets\":[0,1]}}", "shape[0] is not an integer"},
        {"{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "duplicate key 'dtype'"},
        {"{\"a\":{\"dtype\":\"U\\u00008\",\"shape\":[1],\"data_offsets\":[0,1]}}", "unknown dtype"},
        {"{\"a\\ud800\":{}}", "lone high surrogate"},
        {"{\"a\\udc00\":{}}", "lone low surrogate"},
        {"{\"a\\ud800\\u0041\":{}}", "bad surrogate pair"},
        {"{\"a\\x\":{}}", "bad escape"},
        {"{\"a\\u12G4\":{}}", "bad \\u escape"},
        {"{\"a\tb\":{}}", "control character"},
        {"{\"a\xc0\x80\":{}}", "invalid UTF-8"},
        {"{\"a\xed\xa0\x80\":{}}", "invalid UTF-8"},
        {"{\"a\xf4\x90\x80\x80\":{}}", "invalid UTF-8"},
        {"{\"a\xe2\x82\":{}}", "invalid UTF-8"},
        {"{\"a", "unterminated string"},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", "duplicate __metadata__"},
        {"{\"__metadata__\":{\"a\":null}}", "__metadata__ value 'a' is not a string"},
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        st_index *ix = st_index_create();
        char err[512] = "";
        int rc = parse_buf(k_cases[i].hdr, strlen(k_cases[i].hdr), 8, ix, err, sizeof err);
        if (!k_cases[i].phrase) CHECK_MSG(rc == 0, "case %zu: %s", i, err);
        else CHECK_MSG(rc == STRATA_EFORMAT && strstr(err, "buf.safetensors") && strstr(err, k_cases[i].phrase),
                       "case %zu: rc %d '%s' (want '%s')", i, rc, err, k_cases[i].phrase);
        if (!rc) {
            for (size_t k = 0; k < st_count(ix); k++) CHECK(st_find(ix, st_at(ix, k)->name) == st_at(ix, k));
        } else {
            CHECK(st_count(ix) == 0);
        }
        st_close(ix);
    }
    /* A NUL inside the header is a control character, not the end of the string. */
    {
        st_index *ix = st_index_create();
        char err[512] = "";
        static const char h[] = "{\"a\0\":{}}";
        CHECK(parse_buf(h, sizeof h - 1, 0, ix, err, sizeof err) == STRATA_EFORMAT && strstr(err, "control character"));
        st_close(ix);
    }
    /* Failure leaves the index as it was: a good header, then a bad one that
     * would duplicate a name, then a good one again. */
    st_index *ix = st_index_create();
    char err[512] = "";
    const char *first = "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    CHECK(parse_buf(first, strlen(first), 1, ix, err, sizeof err) == 0);
    const char *bad = "{\"y\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                      "\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}";
    CHECK(parse_buf(bad, strlen(bad), 2, ix, err, sizeof err) == STRATA_EFORMAT);
    CHECK_MSG(strstr(err, "tensor 'x': duplicate tensor name, also in an earlier shard"), "%s", err);
    CHECK(st_count(ix) == 1 && st_find(ix, "y") == NULL && st_find(ix, "x") == st_at(ix, 0));
    const char *good = "{\"y\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    CHECK(parse_buf(good, strlen(good), 1, ix, err, sizeof err) == 0);
    CHECK(st_count(ix) == 2 && st_find(ix, "y") == st_at(ix, 1));
    const char *dup = "{\"z\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                      "\"z\\u0020\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]}}";
    CHECK(parse_buf(dup, strlen(dup), 1, ix, err, sizeof err) == 0);
    CHECK(st_find(ix, "z ") != NULL && st_find(ix, "z") != NULL);
    st_close(ix);
}

static int count_entries(void *ud, const char *tensor, const char *file) {
    (void)tensor;
    (void)file;
    return ++*(int *)ud == 3 ? STRATA_EINVAL : 0;
}

TEST(st_index_json) {
    int n = 0;
    char err[256] = "";
    const char *j = "{\"weight_map\":{\"a\":\"f.safetensors\",\"b\":\"f.safetensors\",\"c\":\"g\",\"d\":\"g\"}}";
    CHECK(st_parse_index_json((const uint8_t *)j, strlen(j), "ix.json", count_entries, &n, err, sizeof err) == STRATA_EINVAL);
    CHECK(n == 3 && strstr(err, "ix.json") && strstr(err, "tensor 'c'"));
    n = 0;
    char deep[400];
    snprintf(deep, sizeof deep, "{\"metadata\":{\"x\":%.66s%.66s},\"weight_map\":{}}",
             "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
             "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]");
    CHECK(st_parse_index_json((const uint8_t *)deep, strlen(deep), "ix.json", count_entries, &n, err, sizeof err) == STRATA_EFORMAT);
    CHECK(strstr(err, "nesting deeper than 64"));
    const char *skip = "{\"extra\":[1,-2.5e3,true,false,null,\"s\",{\"k\":{}}],\"metadata\":{\"total_size\":1},"
                       "\"weight_map\":{\"a\":\"m.safetensors\"}}";
    CHECK(st_parse_index_json((const uint8_t *)skip, strlen(skip), "ix.json", count_entries, &n, err, sizeof err) == 0);
    CHECK(n == 1);
    CHECK(st_parse_index_json(NULL, 0, "ix.json", count_entries, &n, err, sizeof err) == STRATA_EFORMAT);
}

/* Round trip through the independent writer (stw.c): whatever it writes, the
 * reader accepts, with the same names, shapes, dtypes and bytes. */
TEST(st_stw_roundtrip) {
    static const char *names[] = {"language_model.model.embed_tokens.weight", "q\"uote\\back\xc3\xa9",
                                  "experts.0.w1.weight_packed", "scalar", "f8", "ctl\x01\x1f"};
    stw_entry e[6] = {
        {names[0], DT_BF16, 2, {3, 5, 0, 0}, 30},
        {names[1], DT_F16, 1, {7, 0, 0, 0}, 14},
        {names[2], DT_U8, 2, {4, 3, 0, 0}, 12},
        {names[3], DT_F32, 1, {1, 0, 0, 0}, 4},
        {names[4], DT_F8_E4M3, 3, {2, 2, 2, 0}, 8},
        {names[5], DT_I64, 1, {2, 0, 0, 0}, 16},
    };
    uint8_t bytes[6][32];
    const void *data[6];
    for (int i = 0; i < 6; i++) {
        for (int k = 0; k < 32; k++) bytes[i][k] = (uint8_t)(i * 31 + k);
        data[i] = bytes[i];
    }
    const char *meta[] = {"format", "pt", "note", "x\"y"};
    static const size_t aligns[] = {8, 4096};
    for (int a = 0; a < 2; a++) {
        char err[512] = "", name[64];
        snprintf(name, sizeof name, "rt%d.safetensors", a);
        const char *p = tpath(name);
        int rc = stw_save(p, e, 6, data, meta, 2, aligns[a], err, sizeof err);
        CHECK_MSG(rc == 0, "%s", err);
        if (rc) continue;
        st_index *ix;
        rc = st_open(&ix, p, err, sizeof err);
        CHECK_MSG(rc == 0, "%s", err);
        if (rc) continue;
        CHECK(st_count(ix) == 6);
        for (int i = 0; i < 6; i++) {
            const st_tensor *t = st_find(ix, names[i]);
            CHECK_MSG(t != NULL, "%s", names[i]);
            if (!t) continue;
            CHECK(t->dtype == e[i].dtype && t->ndim == e[i].ndim && t->nbytes == e[i].nbytes);
            for (int d = 0; d < t->ndim; d++) CHECK(t->shape[d] == e[i].shape[d]);
            uint8_t got[32];
            CHECK(st_read(ix, t, 0, got, t->nbytes, err, sizeof err) == 0);
            CHECK(!memcmp(got, bytes[i], (size_t)t->nbytes));
            if (i == 0) CHECK(t->off % aligns[a] == 0);
        }
        st_close(ix);
    }
}
