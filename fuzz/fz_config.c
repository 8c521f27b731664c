/*
 * fz_config.c: config.json bytes -> cfg_parse. A config that parses must also
 * validate, survive the census, and round-trip through cfg_to_json unchanged.
 */
#include <string.h>
#include "cfg.h"
#include "schema.h"
#include "fuzz.h"

FUZZ_ENTRY(config) {
    static cfg c, d;           /* static: 4 KB layer maps, keep the stack small */
    static cfg_census s;
    char err[2048];
    if (cfg_parse(&c, data, size, "fuzz.json", err, sizeof err)) {
        ST_ASSERT(err[0] != 0); /* a refusal always says why */
        return 0;
    }
    ST_ASSERT(cfg_validate(&c, "fuzz", err, sizeof err) == 0);
    schema_census(&c, &s);
    ST_ASSERT(s.params_total >= s.params_trunk && s.n_kda + s.n_mla == c.n_layers);
    char *a = cfg_to_json(&c);
    ST_ASSERT(a != NULL);
    int rc = cfg_parse(&d, (const uint8_t *)a, strlen(a), "fuzz-roundtrip.json", err, sizeof err);
    ST_ASSERT(rc == 0);
    char *b = cfg_to_json(&d);
    ST_ASSERT(b != NULL && strcmp(a, b) == 0);
    base_free(a);
    base_free(b);
    return 0;
}
