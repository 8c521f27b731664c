/* t_base.c: the allocator's accounting and limit, strict parsers. */
#include <string.h>
#include "test.h"

TEST(base_alloc) {
    uint64_t u0 = base_mem_used();
    void *p = base_alloc(1000, MEM_SCRATCH);
    CHECK(p != NULL);
    CHECK(base_mem_used() == u0 + 1000);
    void *q = base_alloc_aligned(5000, 4096, MEM_IO);
    CHECK(q && ((uintptr_t)q & 4095) == 0);
    base_free(p);
    base_free(q);
    CHECK(base_mem_used() == u0);
    base_mem_set_limit(u0 + 100);
    CHECK(base_alloc(200, MEM_MISC) == NULL);
    base_mem_set_limit(0);
    base_mem_fail_after(1);
    CHECK(base_alloc(8, MEM_MISC) == NULL);
    p = base_alloc(8, MEM_MISC);
    CHECK(p != NULL);
    base_free(p);
}

TEST(base_parse) {
    int64_t v;
    double d;
    uint64_t s;
    CHECK(base_parse_i64("42", 0, 100, &v) == 0 && v == 42);
    CHECK(base_parse_i64("42x", 0, 100, &v) != 0);
    CHECK(base_parse_i64("", 0, 100, &v) != 0);
    CHECK(base_parse_i64("101", 0, 100, &v) != 0);
    CHECK(base_parse_f64("0.5", 0, 1, &d) == 0 && d == 0.5);
    CHECK(base_parse_f64("nan", 0, 1, &d) != 0);
    CHECK(base_parse_size("24G", &s) == 0 && s == 24ull << 30);
    CHECK(base_parse_size("1.5GiB", &s) == 0 && s == 3ull << 29);
    CHECK(base_parse_size("12Q", &s) != 0);
    int64_t *ids; size_t n;
    CHECK(base_parse_id_list("1,2, 3", 0, 10, &ids, &n) == 0 && n == 3 && ids[2] == 3);
    base_free(ids);
    CHECK(base_parse_id_list("1,,2", 0, 10, &ids, &n) != 0);
    CHECK(base_parse_id_list("1,11", 0, 10, &ids, &n) != 0);
}
