/*
 * fz_schema.c: JSON schema text -> strata_grammar_json_schema (jschema.c). A
 * refusal must say why. A grammar that compiles must run: the input bytes and
 * a walk that feeds, at each step, the first byte of a pool (rotated by the
 * input) the machine takes, up to 2 KB; a document the walk completes must be
 * JSON that jansson parses (numbers past a double's range aside).
 */
#include <jansson.h>
#include <string.h>
#include "jgram.h"
#include "strata.h"
#include "fuzz.h"

static const char k_pool[] = "{}[]\",:-0123456789.eE+ tnflrusa\\\xc3\xa9\xe2\x82\xac/bz";

FUZZ_ENTRY(schema) {
    char err[1024];
    err[0] = 0;
    strata_grammar *g = NULL;
    if (strata_grammar_json_schema(&g, (const char *)data, size, err, sizeof err)) {
        ST_ASSERT(g == NULL && err[0] != 0);
        return 0;
    }
    ST_ASSERT(g != NULL);
    (void)jgram_check(g, data, size);
    static uint8_t doc[2048];
    const size_t np = sizeof k_pool - 1;
    size_t n = 0, rot = size ? data[size / 2] : 0;
    jg_state s;
    jgram_start(g, &s);
    while (n < sizeof doc && !jgram_can_end(g, &s)) {
        int took = 0;
        for (size_t k = 0; k < np && !took; k++) {
            const uint8_t c = (uint8_t)k_pool[(k + rot + n) % np];
            jg_state t = s;
            if (jgram_feed(g, &t, c) == 0) { s = t; doc[n++] = c; took = 1; }
        }
        if (!took) break; /* a recursive schema at the depth bound, or bytes outside the pool */
    }
    if (jgram_can_end(g, &s)) {
        ST_ASSERT(jgram_check(g, doc, n) == 1);
        json_error_t je;
        json_t *j = json_loadb((const char *)doc, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        ST_ASSERT(j != NULL || strstr(je.text, "overflow") != NULL);
        json_decref(j);
    }
    strata_grammar_free(g);
    return 0;
}
