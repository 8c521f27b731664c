/*
 * fz_pattern.c: input bytes -> a `pattern` (jregex.c through jschema.c): the first
 * byte picks a format to intersect with (or none) and length bounds, the rest is
 * the regex text (bytes >= 0x80 folded to ASCII when they are not UTF-8). A
 * refusal must say why. A grammar that compiles must never dead-end: walking
 * from its start, at every step some byte continues the string (tried in an
 * order the input rotates), up to 1 KB or its close; a closed string must be a
 * document the grammar accepts and JSON that jansson parses.
 */
#include <jansson.h>
#include <string.h>
#include "jgram.h"
#include "strata.h"
#include "fuzz.h"

FUZZ_ENTRY(pattern) {
    static const char *const k_fmt[] = {NULL, "date", "time", "date-time", "uuid", "email", "ipv4", NULL};
    if (size < 1 || size > 4096) return 0;
    const uint8_t opt = data[0];
    json_t *p = json_stringn((const char *)data + 1, size - 1);
    if (!p) {
        char tmp[4096];
        for (size_t i = 1; i < size; i++) tmp[i - 1] = (char)(data[i] & 0x7F);
        p = json_stringn(tmp, size - 1);
    }
    if (!p) return 0;
    json_t *s = json_object();
    json_object_set_new(s, "type", json_string("string"));
    json_object_set_new(s, "pattern", p);
    if (k_fmt[opt & 7]) json_object_set_new(s, "format", json_string(k_fmt[opt & 7]));
    if (opt & 8) json_object_set_new(s, "minLength", json_integer(opt >> 6));
    if (opt & 16) json_object_set_new(s, "maxLength", json_integer(2 + (opt >> 5)));
    char err[1024];
    err[0] = 0;
    strata_grammar *g = NULL;
    if (strata_grammar_json_schema_tree(&g, s, err, sizeof err)) {
        ST_ASSERT(g == NULL && err[0] != 0);
        json_decref(s);
        return 0;
    }
    json_decref(s);
    ST_ASSERT(g != NULL);
    static uint8_t doc[1024];
    size_t n = 0;
    jg_state st;
    jgram_start(g, &st);
    while (n < sizeof doc && !jgram_can_end(g, &st)) {
        int took = 0;
        for (int k = 0; k < 256 && !took; k++) {
            const uint8_t c = (uint8_t)(k + data[n % size] + n);
            jg_state t = st;
            if (jgram_feed(g, &t, c) == 0) { st = t; doc[n++] = c; took = 1; }
        }
        ST_ASSERT(took); /* the DFA is trimmed: a live state always goes on */
    }
    if (jgram_can_end(g, &st)) {
        ST_ASSERT(jgram_check(g, doc, n) == 1);
        json_error_t je;
        json_t *j = json_loadb((const char *)doc, n, JSON_DECODE_ANY, &je);
        ST_ASSERT(j != NULL && json_is_string(j));
        json_decref(j);
    }
    strata_grammar_free(g);
    return 0;
}
