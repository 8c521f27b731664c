/* jsonx.c: strict JSON loading on jansson (see jsonx.h). */
#include "jsonx.h"

#include <math.h>
#include <pthread.h>
#include "base.h"

/* jansson allocates through base_alloc (MEM_JSON). Its 2.14 parser does not
 * survive a failed allocation: it can drop a byte and go on, or write through a
 * failed buffer (SEGV inside json_loadb, found by the STRATA_FAIL_ALLOC sweep of
 * strata run). So while parsing, an allocation base_alloc refuses is made anyway
 * (base_alloc_unrefused) and the parse is thrown away as ENOMEM; while building a
 * tree it fails and is recorded (jsonx_build_failed). Blocks stay base_alloc
 * blocks either way: json_dumps text is released with base_free. */
static _Thread_local int t_failed, t_parsing;
static void *jx_malloc(size_t n) {
    void *p = base_alloc(n, MEM_JSON);
    if (!p) {
        t_failed = 1;
        if (t_parsing) p = base_alloc_unrefused(n, MEM_JSON);
    }
    return p;
}
static void jx_free(void *p) { base_free(p); }
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void jx_init(void) { json_set_alloc_funcs(jx_malloc, jx_free); }

int jsonx_parse(json_t **out, const uint8_t *buf, size_t len, const char *what, char *err, size_t errlen) {
    pthread_once(&g_once, jx_init);
    json_error_t e;
    t_failed = 0;
    t_parsing = 1;
    json_t *j = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
    t_parsing = 0;
    *out = NULL;
    if (t_failed) {
        json_decref(j);
        return base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory while parsing JSON", what);
    }
    if (!j) return base_fail(err, errlen, STRATA_EFORMAT, "%s: invalid JSON at line %d column %d: %s",
                             what, e.line, e.column, e.text);
    *out = j;
    return STRATA_OK;
}

json_t *jsonx_load(const uint8_t *buf, size_t len, const char *what, char *err, size_t errlen) {
    json_t *j;
    jsonx_parse(&j, buf, len, what, err, errlen);
    return j;
}

void jsonx_build_begin(void) {
    pthread_once(&g_once, jx_init);
    t_failed = 0;
}

int jsonx_build_failed(void) { return t_failed; }

int jsonx_real_int(double v, int64_t *out) {
    if (!isfinite(v) || v != floor(v) || fabs(v) > 9.0e15) return -1;
    *out = (int64_t)v;
    return 0;
}

int jsonx_int(const json_t *j, int64_t *out) {
    if (json_is_integer(j)) { *out = (int64_t)json_integer_value(j); return 0; }
    if (json_is_real(j)) return jsonx_real_int(json_real_value(j), out);
    return -1;
}

int jsonx_num(const json_t *j, double *out) {
    if (json_is_integer(j)) { *out = (double)json_integer_value(j); return 0; }
    if (json_is_real(j)) { *out = json_real_value(j); return 0; }
    return -1;
}
