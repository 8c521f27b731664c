/*
 * jscan.h: reading one large JSON member in place, without a tree.
 *
 * jansson builds ~25 bytes of tree per byte of a tokenizer.json's vocabulary
 * and merges (DeepSeek-V3's 4.9 MB file: 138 MB peak RSS, 0.5 s), and that
 * peak is what a run at its minimum budget has to fit. So a reader finds the
 * byte span of such a member (jscan_member), reads it with the cursor below
 * (strings and numbers checked as jansson checks them: UTF-8, escapes,
 * surrogates, the number grammar), and hands jansson a copy of the document
 * with the span blanked (jscan_blank: `{}` or `[]`, newlines kept, so the
 * positions jansson reports stay those of the file).
 */
#ifndef STRATA_JSCAN_H
#define STRATA_JSCAN_H

#include <stddef.h>
#include <stdint.h>

/* Finds the first member named key (compared after unescaping) of the object
 * that starts at b[0] (after whitespace); its value is b[*off, *off + *n).
 * Returns 0, or -1 when there is none or the text does not scan as JSON
 * (the caller's parser then reports what is wrong). Lenient: it only needs the
 * value's end, its content is checked by whoever reads it. */
int jscan_member(const uint8_t *b, size_t len, const char *key, size_t *off, size_t *n);

/* Turns the value b[0, n) (an object or array) into an empty one of the same
 * kind, padded with spaces; newlines are kept. */
void jscan_blank(uint8_t *b, size_t n);

/* A cursor over JSON text; why says what was wrong at p. */
typedef struct jscan {
    const uint8_t *p, *end;
    const uint8_t *doc; /* the whole document, for line and column */
    const char *why;
} jscan;

/* Skips whitespace; returns the next byte or -1 at the end. */
int jscan_peek(jscan *s);
/* Expects byte c (after whitespace); returns 0, or -1 with why. */
int jscan_expect(jscan *s, char c);
/* Reads a string at p (after whitespace): writes up to cap decoded bytes to out
 * and the full decoded length to *n. Returns 0, or -1 with why. */
int jscan_string(jscan *s, uint8_t *out, size_t cap, size_t *n);
/* Reads a number: 0 with *v when it is an integer (or a real with no
 * fractional part) within +-9e15, 1 when it is some other number, -1 with why
 * when it is not a number. */
int jscan_int(jscan *s, int64_t *v);
/* Skips one value without checking its content; 0, or -1 with why. */
int jscan_skip(jscan *s);
/* 1-based line and column of p in doc. */
void jscan_where(const jscan *s, int *line, int *col);

#endif
