/*
 * jsonx.h: strict JSON loading on top of jansson. Allocations are routed through
 * base_alloc(MEM_JSON) so JSON trees count against the RAM budget; duplicate keys
 * are rejected; errors carry the file name, line and column.
 */
#ifndef STRATA_JSONX_H
#define STRATA_JSONX_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Parses len bytes (no NUL needed). Returns a new reference (json_decref it) or
 * NULL with "what: line L column C: reason" in err. */
json_t *jsonx_load(const uint8_t *buf, size_t len, const char *what, char *err, size_t errlen);
/* The same with the reason: STRATA_OK, STRATA_ENOMEM or STRATA_EFORMAT (*out NULL). */
int jsonx_parse(json_t **out, const uint8_t *buf, size_t len, const char *what, char *err, size_t errlen);
/* Building a tree on this thread: a failed allocation makes jansson drop what it
 * was adding (json_object_set_new of NULL) without a word, so a builder calls
 * jsonx_build_begin first and refuses its result when jsonx_build_failed says an
 * allocation failed since. */
void jsonx_build_begin(void);
int jsonx_build_failed(void);
/* Exact integer value of j: JSON integer, or a real with no fractional part that
 * fits; returns 0 on success. Rejects fractions, booleans, strings. */
int jsonx_int(const json_t *j, int64_t *out);
/* The same rule for a real read elsewhere (jcur.h): 0 with *out when v has no
 * fractional part and |v| <= 9e15. */
int jsonx_real_int(double v, int64_t *out);
/* Numeric value (integer or real) as double; 0 on success. */
int jsonx_num(const json_t *j, double *out);

#endif
