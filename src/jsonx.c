/* jsonx.c: strict JSON loading on jansson (see jsonx.h). */
#include "jsonx.h"

#include <math.h>
#include <pthread.h>
#include "base.h"

/* jansson's lexer does not always propagate a failed allocation (it can drop a byte
 * and go on), so a parse during which any allocation failed is refused here. */
static _Thread_local int g_alloc_failed;
static void *jx_malloc(size_t n) {
    void *p = base_alloc(n, MEM_JSON);
    if (!p) g_alloc_failed = 1;
    return p;
}
static void jx_free(void *p) { base_free(p); }
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void jx_init(void) { json_set_alloc_funcs(jx_malloc, jx_free); }

json_t *jsonx_load(const uint8_t *buf, size_t len, const char *what, char *err, size_t errlen) {
    pthread_once(&g_once, jx_init);
    json_error_t e;
    g_alloc_failed = 0;
    json_t *j = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
    if (j && g_alloc_failed) {
        json_decref(j);
        base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory while parsing JSON", what);
        return NULL;
    }
    if (!j) base_fail(err, errlen, STRATA_EFORMAT, "%s: invalid JSON at line %d column %d: %s",
                      what, e.line, e.column, e.text);
    return j;
}

int jsonx_int(const json_t *j, int64_t *out) {
    if (json_is_integer(j)) { *out = (int64_t)json_integer_value(j); return 0; }
    if (json_is_real(j)) {
        double v = json_real_value(j);
        if (!isfinite(v) || v != floor(v) || fabs(v) > 9.0e15) return -1;
        *out = (int64_t)v;
        return 0;
    }
    return -1;
}

int jsonx_num(const json_t *j, double *out) {
    if (json_is_integer(j)) { *out = (double)json_integer_value(j); return 0; }
    if (json_is_real(j)) { *out = json_real_value(j); return 0; }
    return -1;
}
