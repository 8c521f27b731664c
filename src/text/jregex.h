/*
 * jregex.h: JSON Schema `pattern` and `format` -> a DFA over the UTF-8 bytes of
 * a string's content (for jschema.c's pattern strings, run by jgram.c).
 *
 * The regex subset (ECMA-262 syntax, no flags): literals; escapes \d \w \s \D \W
 * \S, \t \n \r \v \f \0 \cX \xHH \uXXXX and escaped syntax characters; classes
 * [a-z0-9_] and negated [^...]; `.` (any code point but \n \r U+2028 U+2029);
 * groups (...) (?:...) (?<name>...); alternation |; quantifiers * + ? {m} {m,}
 * {m,n} (n <= JRE_MAX_REPEAT; lazy forms accepted, the language is the same).
 * Negated classes and `.` match whole code points (never a surrogate).
 * Anchors: `^` at the start and `$` at the end of the whole pattern or of a
 * top-level alternative. A side without its anchor is searched, as JSON Schema
 * specifies: any code points may come before (after) the match. Refused, by
 * name: lookarounds, backreferences, \b \B, anchors elsewhere, \u{...}.
 *
 * The DFA accepts exactly the well-formed UTF-8 strings the pattern matches
 * (intersected with the code-point length bounds, and with a format), trimmed
 * to the states from which an accepting state can still be reached through
 * bytes a JSON string can carry (raw >= 0x20, or \b \t \n \f \r \" \\ escapes):
 * a generator that follows it never dead-ends. At most JRE_MAX_STATES states.
 */
#ifndef STRATA_JREGEX_H
#define STRATA_JREGEX_H

#include <stddef.h>
#include <stdint.h>

#define JRE_MAX_STATES 4096     /* DFA states of a pattern or a format */
#define JRE_MAX_LEN_STATES 16384 /* ... with the length bounds folded in (count x state) */
#define JRE_MAX_REPEAT 64   /* the largest m or n of {m,n} */
#define JRE_MAX_PATTERN 2048 /* bytes of pattern text */
#define JRE_DEAD 0xFFFF

/* The pattern text of a supported format ("date", "time", "date-time", "uuid",
 * "email", "ipv4"), or NULL. */
const char *jregex_format(const char *name);

/* pattern (may be NULL), format (NULL or a name jregex_format knows), code-point
 * bounds min_len, max_len (-1: none) -> *table (MEM_MISC) of *len uint16: the
 * byte class of each byte (256), then *n_states rows of *n_classes next states
 * (JRE_DEAD: none) and a last entry 1 when the state accepts; state 0 starts.
 * (Bytes no state tells apart share a class: rows stay short.) why gets the
 * reason on failure (-1). */
int jregex_compile(const char *pattern, size_t len, const char *format, int64_t min_len, int64_t max_len, uint16_t **table,
                   size_t *len_out, int32_t *n_states, int32_t *n_classes, char *why, size_t whylen);

/* The pattern of the integers in [lo, hi] as JSON writes them (no leading zeros,
 * no "-0"), |lo|, |hi| < 10^15, into buf: its length, or -1 when it does not fit. */
long jregex_int_range(int64_t lo, int64_t hi, char *buf, size_t cap);

/* The byte a JSON escape letter decodes to (b f n r t " \ /), or -1 (also 'u':
 * pattern strings take no \u escapes). */
int jregex_unescape(uint8_t c);

#endif
