/*
 * jschema.h: JSON schema (a subset) -> a byte grammar (jgram.h).
 *
 * Supported: type (a name or a list), properties, required, additionalProperties,
 * enum, const, items, minItems, maxItems, minLength, maxLength, pattern and
 * format on strings (jregex.h: one DFA with the length bounds), minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum on integers (a DFA over the digits), anyOf / oneOf
 * (alternatives that differ in their first byte: different JSON types), local
 * $ref ("#", "#/$defs/NAME", any "#/..." pointer; recursion allowed), and the
 * annotations title, description, default, examples, $schema, $id, $comment,
 * $defs, definitions, deprecated, readOnly, writeOnly (ignored). Every other
 * keyword is refused by name (minimum, uniqueItems, ...), as are unsatisfiable
 * or hostile schemas (a required property not listed, min > max, nesting deeper
 * than the matcher's stack, $ref cycles with no value between, more than 4096
 * enum values or properties in one place, more than 1 MiB of keys and literals).
 * Errors say "json schema at #/properties/x: why".
 */
#ifndef STRATA_JSCHEMA_H
#define STRATA_JSCHEMA_H

#include <jansson.h>
#include <stddef.h>
#include "jgram.h"

/* schema: a JSON schema tree (object or boolean). MEM_MISC. */
int jschema_compile(jgram **out, const json_t *schema, char *err, size_t errlen);
/* Any JSON object ({"type": "json_object"} of the OpenAI API). */
int jschema_json_object(jgram **out, char *err, size_t errlen);
/* Compact JSON text of v into buf (cap bytes): its length, or -1 when it does not
 * fit. Strings escape only '"', '\\' and control bytes. */
long jschema_dump(const json_t *v, char *buf, size_t cap);

#endif
