/*
 * st_json.c: model.safetensors.index.json's weight_map, read strictly with the
 * JSON cursor (jcur.h) and streamed to a callback (see st.h). Apart from st.c
 * because it is a second file format, not the shard headers.
 */
#include "st.h"

#include <string.h>
#include "base.h"
#include "jcur.h"

/* ===== index json ===== */

/* Shard names must stay inside the model directory. */
static int plain_name(const char *s, size_t len) {
    if (len == 0 || strlen(s) != len || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
    return strchr(s, '/') == NULL;
}

int st_parse_index_json(const uint8_t *buf, size_t len, const char *what,
                        int (*fn)(void *ud, const char *tensor, const char *file), void *ud,
                        char *err, size_t errlen) {
    if (!what) what = "model.safetensors.index.json";
    jcur c = {.p = buf, .end = buf + len, .base = buf, .what = what, .err = err, .errlen = errlen,
              .tag = MEM_INDEX, .ctx_kind = "tensor"};
    jstr key = {0}, val = {0};
    int rc, seen_map = 0;
    if (!buf || !jcur_eat(&c, '{')) { rc = jcur_syntax(&c, NULL, "not a JSON object"); goto done; }
    if (!jcur_eat(&c, '}')) {
        do {
            if ((rc = jcur_str(&c, &key, NULL))) goto done;
            if (!jcur_eat(&c, ':')) { rc = jcur_syntax(&c, NULL, "expected ':'"); goto done; }
            if (!strcmp(key.s, "metadata") && key.len == 8) {
                jcur_ws(&c);
                if (c.p >= c.end || *c.p != '{') {
                    rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: \"metadata\" is not an object", what);
                    goto done;
                }
                if ((rc = jcur_skip(&c, NULL))) goto done;
                continue;
            }
            if (strcmp(key.s, "weight_map") || key.len != 10) {
                if ((rc = jcur_skip(&c, NULL))) goto done; /* other top-level keys mean nothing here */
                continue;
            }
            if (seen_map++) {
                rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: duplicate \"weight_map\"", what);
                goto done;
            }
            if (!jcur_eat(&c, '{')) {
                rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: \"weight_map\" is not an object", what);
                goto done;
            }
            if (jcur_eat(&c, '}')) continue;
            do {
                if ((rc = jcur_str(&c, &key, NULL))) goto done;
                if (!jcur_eat(&c, ':')) { rc = jcur_syntax(&c, key.s, "expected ':'"); goto done; }
                if (key.len == 0 || strlen(key.s) != key.len) {
                    rc = base_fail(err, errlen, STRATA_EFORMAT,
                                   "%s: weight_map: tensor '%s': empty name or NUL byte", what, key.s);
                    goto done;
                }
                jcur_ws(&c);
                int is_str = c.p < c.end && *c.p == '"';
                if (is_str && (rc = jcur_str(&c, &val, key.s))) goto done;
                if (!is_str || !plain_name(val.s, val.len)) {
                    rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: weight_map: tensor '%s': shard must be "
                                   "a plain file name (string, no '/')", what, key.s);
                    goto done;
                }
                if ((rc = fn(ud, key.s, val.s))) {
                    base_fail(err, errlen, rc, "%s: weight_map: tensor '%s': %s", what, key.s, strata_errstr(rc));
                    goto done;
                }
            } while (jcur_eat(&c, ','));
            if (!jcur_eat(&c, '}')) { rc = jcur_syntax(&c, NULL, "expected ',' or '}'"); goto done; }
        } while (jcur_eat(&c, ','));
        if (!jcur_eat(&c, '}')) { rc = jcur_syntax(&c, NULL, "expected ',' or '}'"); goto done; }
    }
    if ((rc = jcur_finish(&c))) goto done;
    if (!seen_map) rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: \"weight_map\" is missing", what);
done:
    base_free(key.s);
    base_free(val.s);
    base_free(c.tmp.s);
    return rc;
}