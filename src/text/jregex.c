/*
 * jregex.c: pattern text -> syntax tree -> byte NFA (Thompson, built backwards
 * from the accepting state) -> DFA by subset construction over byte classes ->
 * products with a format and a code-point length counter -> trimmed to the
 * states that can still finish (see jregex.h).
 *
 * Code-point sets become UTF-8 byte-range sequences (a range splits where its
 * encodings differ in length or in a non-final byte's full span), so the DFA
 * reads bytes and accepts only well-formed UTF-8.
 */
#include "jregex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base.h"

#define MAX_X 8192      /* syntax nodes */
#define MAX_R 65536     /* code-point ranges, all sets */
#define MAX_NFA 131072  /* NFA states */
#define MAX_POOL (1 << 24) /* NFA ids over all DFA state sets */
/* Subset construction steps (NFA states visited by closures and scanned per
 * DFA state and byte class). The state and pool bounds alone let a short
 * pattern cost seconds: (\S{1,64}){1,20} has 140 states but took 0.8 s at -O2
 * (10 s under ASan) to build. Formats, integer ranges and the test patterns
 * take under 15M steps; 32M is about 0.5 s at -O2. */
#define MAX_WORK (1 << 25)
#define MAX_NEST 64
#define CP_MAX 0x10FFFF

typedef struct { uint32_t lo, hi; } cpr;
enum { X_SET, X_CAT, X_ALT, X_REP, X_BOL, X_EOL };
/* SET: ranges r[lo, lo+n); CAT (children in reverse order) / ALT: first child lo,
 * n of them, linked by next; REP: child lo, min, max (-1: unbounded) */
typedef struct { int32_t kind, lo, n, next, min, max; } xnode;

typedef struct {
    const uint8_t *p, *end;
    xnode *x; int32_t nx;
    cpr *r; int32_t nr;
    char *why; size_t whylen;
    int bad, nest;
} px;

static int bad(px *c, const char *fmt, ...) ST_PRINTF(2, 3);
static int bad(px *c, const char *fmt, ...) {
    if (c->bad) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, c->whylen, fmt, ap);
    va_end(ap);
    c->bad = 1;
    return -1;
}

static int32_t node(px *c, int kind) {
    if (c->nx >= MAX_X) return bad(c, "more than %d parts", MAX_X);
    c->x[c->nx] = (xnode){.kind = kind, .lo = -1, .next = -1, .max = -1};
    return c->nx++;
}

/* ===== code-point sets ===== */

static int add_range(px *c, uint32_t lo, uint32_t hi) {
    if (c->nr >= MAX_R) return bad(c, "its character classes are too large");
    c->r[c->nr++] = (cpr){lo, hi};
    return 0;
}

static int cpr_cmp(const void *a, const void *b) {
    const cpr *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Sorts and merges r[lo, nr) in place (the pool's tail): the new count. */
static int32_t normalize(px *c, int32_t lo) {
    int32_t n = c->nr - lo, k = 0;
    cpr *r = c->r + lo;
    qsort(r, (size_t)n, sizeof *r, cpr_cmp);
    for (int32_t i = 0; i < n; i++) {
        if (k > 0 && r[i].lo <= r[k - 1].hi + 1) { if (r[i].hi > r[k - 1].hi) r[k - 1].hi = r[i].hi; }
        else r[k++] = r[i];
    }
    c->nr = lo + k;
    return k;
}

/* Replaces the normalized r[lo, nr) by its complement in [0, CP_MAX]. */
static int complement(px *c, int32_t lo) {
    int32_t n = c->nr - lo;
    cpr tmp[64];
    cpr *src = n <= 64 ? tmp : base_alloc((size_t)n * sizeof *src, MEM_MISC);
    if (!src) return bad(c, "out of memory");
    memcpy(src, c->r + lo, (size_t)n * sizeof *src);
    c->nr = lo;
    uint32_t at = 0;
    int rc = 0;
    for (int32_t i = 0; i < n && !rc; i++) {
        if (src[i].lo > at) rc = add_range(c, at, src[i].lo - 1);
        at = src[i].hi + 1;
    }
    if (!rc && at <= CP_MAX) rc = add_range(c, at, CP_MAX);
    if (src != tmp) base_free(src);
    return rc;
}

/* \d \w \s (upper case: negated), '.' as 'n' (all but line terminators) into the pool. */
static int add_named(px *c, int letter) {
    static const uint32_t d[] = {'0', '9'}, w[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'},
                          s[] = {9, 13, ' ', ' ', 0xA0, 0xA0, 0x1680, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029,
                                 0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF},
                          n[] = {'\n', '\n', '\r', '\r', 0x2028, 0x2029};
    const int low = letter | 32;
    const uint32_t *t = low == 'd' ? d : low == 'w' ? w : low == 's' ? s : n;
    const int cnt = low == 'd' ? 1 : low == 'w' ? 4 : low == 's' ? 10 : 3;
    const int neg = letter != low || letter == 'n';
    const int32_t lo = c->nr;
    for (int i = 0; i < cnt; i++)
        if (add_range(c, t[2 * i], t[2 * i + 1])) return -1;
    if (!neg) return 0;
    normalize(c, lo);
    return complement(c, lo);
}

/* ===== the parser ===== */

static int peek(px *c) { return c->p < c->end ? *c->p : -1; }

/* Next code point of the pattern text (well-formed UTF-8: jansson checked it). */
static uint32_t next_cp(px *c) {
    const uint8_t b = *c->p++;
    int k = b < 0x80 ? 0 : b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
    uint32_t cp = k == 0 ? b : k == 1 ? b & 0x1F : k == 2 ? b & 0x0F : b & 0x07;
    while (k-- > 0 && c->p < c->end) cp = cp << 6 | (*c->p++ & 0x3F);
    return cp;
}

static int hex_n(px *c, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        int h = peek(c);
        if (h >= '0' && h <= '9') h -= '0';
        else if ((h | 32) >= 'a' && (h | 32) <= 'f') h = (h | 32) - 'a' + 10;
        else return -1;
        v = v << 4 | (uint32_t)h;
        c->p++;
    }
    *out = v;
    return 0;
}

/* After a backslash: a single code point into *cp (0), a named set added to the
 * pool (1), or -1. in_class: \b is backspace there, and '-' a literal. */
static int escape(px *c, int in_class, uint32_t *cp) {
    if (c->p >= c->end) return bad(c, "a '\\' ends it");
    const int e = *c->p++;
    switch (e) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': return add_named(c, e) ? -1 : 1;
    case 't': *cp = 9; return 0;
    case 'n': *cp = 10; return 0;
    case 'v': *cp = 11; return 0;
    case 'f': *cp = 12; return 0;
    case 'r': *cp = 13; return 0;
    case 'b': if (in_class) { *cp = 8; return 0; } return bad(c, "word boundaries (\\b) are not supported");
    case 'B': return bad(c, "word boundaries (\\B) are not supported");
    case 'c': {
        const int l = peek(c);
        if ((l | 32) < 'a' || (l | 32) > 'z') return bad(c, "'\\c' must be followed by a letter");
        c->p++;
        *cp = (uint32_t)(l & 31);
        return 0;
    }
    case 'x': if (hex_n(c, 2, cp)) return bad(c, "'\\x' needs two hex digits"); return 0;
    case 'u': {
        if (peek(c) == '{') return bad(c, "'\\u{...}' (the u flag) is not supported");
        if (hex_n(c, 4, cp)) return bad(c, "'\\u' needs four hex digits");
        if (*cp >= 0xD800 && *cp <= 0xDBFF && c->end - c->p >= 6 && c->p[0] == '\\' && c->p[1] == 'u') {
            const uint8_t *save = c->p;
            uint32_t lo;
            c->p += 2;
            if (!hex_n(c, 4, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) { *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00); return 0; }
            c->p = save;
        }
        if (*cp >= 0xD800 && *cp <= 0xDFFF) return bad(c, "a lone surrogate '\\u%04X' matches no UTF-8 text", (unsigned)*cp);
        return 0;
    }
    case '0':
        if (peek(c) >= '0' && peek(c) <= '9') return bad(c, "octal escapes are not supported");
        *cp = 0;
        return 0;
    case 'k': return bad(c, "backreferences (\\k<name>) are not supported");
    case 'p': case 'P': return bad(c, "Unicode property escapes (\\%c) are not supported", e);
    }
    if (e >= '1' && e <= '9') return bad(c, "backreferences (\\%c) are not supported", e);
    if ((e | 32) >= 'a' && (e | 32) <= 'z') return bad(c, "unknown escape '\\%c'", e);
    c->p--;
    *cp = next_cp(c);
    return 0;
}

static int32_t set_node(px *c, int32_t lo) {
    const int32_t n = normalize(c, lo);
    const int32_t id = node(c, X_SET);
    if (id < 0) return -1;
    c->x[id].lo = lo;
    c->x[id].n = n;
    return id;
}

/* After '[': a class up to its ']'. */
static int32_t parse_class(px *c) {
    const int neg = peek(c) == '^';
    if (neg) c->p++;
    const int32_t lo = c->nr;
    for (;;) {
        if (c->p >= c->end) return bad(c, "a '[' is not closed");
        if (*c->p == ']') { c->p++; break; }
        uint32_t a, b;
        int ka = 0, kb;
        if (*c->p == '\\') { c->p++; if ((ka = escape(c, 1, &a)) < 0) return -1; }
        else a = next_cp(c);
        if (ka == 0 && peek(c) == '-' && c->end - c->p >= 2 && c->p[1] != ']') {
            c->p++;
            if (*c->p == '\\') { c->p++; if ((kb = escape(c, 1, &b)) < 0) return -1; }
            else { b = next_cp(c); kb = 0; }
            if (kb == 1) { if (add_range(c, a, a) || add_range(c, '-', '-')) return -1; continue; } /* [a-\d]: '-' literal */
            if (a > b) return bad(c, "the class range is out of order");
            if (add_range(c, a, b)) return -1;
            continue;
        }
        if (ka == 0 && add_range(c, a, a)) return -1;
    }
    if (neg) {
        normalize(c, lo);
        if (complement(c, lo)) return -1;
    }
    return set_node(c, lo);
}

static int32_t parse_alt(px *c);

/* {m}, {m,}, {m,n} at c->p (after '{'): 1 parsed, 0 not a quantifier (a literal '{'). */
static int braces(px *c, int32_t *mn, int32_t *mx) {
    const uint8_t *q = c->p;
    int64_t a = 0, b = -1;
    int digits = 0;
    while (q < c->end && *q >= '0' && *q <= '9') { if (a < 1000000) a = a * 10 + (*q - '0'); q++; digits++; }
    if (!digits) return 0;
    if (q < c->end && *q == ',') {
        q++;
        if (q < c->end && *q >= '0' && *q <= '9') {
            b = 0;
            while (q < c->end && *q >= '0' && *q <= '9') { if (b < 1000000) b = b * 10 + (*q - '0'); q++; }
        }
    } else b = a;
    if (q >= c->end || *q != '}') return 0;
    c->p = q + 1;
    if (a > JRE_MAX_REPEAT || b > JRE_MAX_REPEAT) return bad(c, "repeat counts above %d are not supported", JRE_MAX_REPEAT);
    if (b >= 0 && a > b) return bad(c, "the repeat {%lld,%lld} is out of order", (long long)a, (long long)b);
    *mn = (int32_t)a;
    *mx = (int32_t)b;
    return 1;
}

static int32_t parse_atom(px *c) {
    const int ch = *c->p;
    uint32_t cp;
    switch (ch) {
    case '(': {
        c->p++;
        if (peek(c) == '?') {
            c->p++;
            const int k = peek(c);
            if (k == ':') c->p++;
            else if (k == '=' || k == '!') return bad(c, "lookahead '(?%c' is not supported", k);
            else if (k == '<' && c->p + 1 < c->end && (c->p[1] == '=' || c->p[1] == '!'))
                return bad(c, "lookbehind '(?<%c' is not supported", c->p[1]);
            else if (k == '<') {
                while (c->p < c->end && *c->p != '>') c->p++;
                if (c->p >= c->end) return bad(c, "a group name is not closed");
                c->p++;
            } else return bad(c, "'(?%c' is not supported", k > 0x20 && k < 0x7F ? k : '?');
        }
        if (++c->nest > MAX_NEST) return bad(c, "groups nest deeper than %d", MAX_NEST);
        const int32_t id = parse_alt(c);
        c->nest--;
        if (id < 0) return -1;
        if (peek(c) != ')') return bad(c, "a '(' is not closed");
        c->p++;
        return id;
    }
    case '[': c->p++; return parse_class(c);
    case '.': c->p++; { const int32_t lo = c->nr; return add_named(c, 'n') ? -1 : set_node(c, lo); }
    case '^': c->p++; return node(c, X_BOL);
    case '$': c->p++; return node(c, X_EOL);
    case '\\': {
        c->p++;
        const int32_t lo = c->nr;
        const int k = escape(c, 0, &cp);
        if (k < 0) return -1;
        if (k == 0 && add_range(c, cp, cp)) return -1;
        return set_node(c, lo);
    }
    case '*': case '+': case '?': return bad(c, "'%c' has nothing to repeat", ch);
    case ')': return bad(c, "an unmatched ')'");
    }
    if (ch == '{') {
        int32_t a, b;
        const uint8_t *save = ++c->p;
        const int q = braces(c, &a, &b);
        if (q < 0) return -1;
        if (q) return bad(c, "a repeat has nothing to repeat");
        c->p = save - 1;
    }
    const int32_t lo = c->nr;
    cp = next_cp(c);
    if (add_range(c, cp, cp)) return -1;
    return set_node(c, lo);
}

/* A sequence up to '|', ')' or the end: a CAT node (children reversed). */
static int32_t parse_cat(px *c) {
    const int32_t cat = node(c, X_CAT);
    if (cat < 0) return -1;
    while (c->p < c->end && *c->p != '|' && *c->p != ')') {
        int32_t a = parse_atom(c);
        if (a < 0) return -1;
        for (;;) { /* quantifiers */
            int32_t mn, mx;
            const int q = peek(c);
            if (q == '*') { mn = 0; mx = -1; c->p++; }
            else if (q == '+') { mn = 1; mx = -1; c->p++; }
            else if (q == '?') { mn = 0; mx = 1; c->p++; }
            else if (q == '{') {
                c->p++;
                const int k = braces(c, &mn, &mx);
                if (k < 0) return -1;
                if (!k) { c->p--; break; }
            } else break;
            if (peek(c) == '?') c->p++; /* lazy: the same language */
            if (c->x[a].kind == X_REP) return bad(c, "a quantifier follows a quantifier");
            const int32_t r = node(c, X_REP);
            if (r < 0) return -1;
            c->x[r].lo = a;
            c->x[r].min = mn;
            c->x[r].max = mx;
            a = r;
        }
        c->x[a].next = c->x[cat].lo; /* prepend: reversed */
        c->x[cat].lo = a;
        c->x[cat].n++;
    }
    return cat;
}

static int32_t parse_alt(px *c) {
    const int32_t alt = node(c, X_ALT);
    if (alt < 0) return -1;
    int32_t last = -1;
    for (;;) {
        const int32_t k = parse_cat(c);
        if (k < 0) return -1;
        if (last < 0) c->x[alt].lo = k;
        else c->x[last].next = k;
        last = k;
        c->x[alt].n++;
        if (peek(c) != '|') return alt;
        c->p++;
    }
}

/* 1 when the tree under id holds an anchor. */
static int has_anchor(const px *c, int32_t id, int depth) {
    const xnode *x = &c->x[id];
    if (x->kind == X_BOL || x->kind == X_EOL || depth > 2 * MAX_NEST + 8) return 1;
    if (x->kind == X_REP) return has_anchor(c, x->lo, depth + 1);
    if (x->kind == X_CAT || x->kind == X_ALT)
        for (int32_t k = x->lo; k >= 0; k = c->x[k].next)
            if (has_anchor(c, k, depth + 1)) return 1;
    return 0;
}

/* Each top-level alternative: a leading '^' and a trailing '$' dropped. The
 * alternatives are then grouped by the anchors they had, and a group gets one
 * "any code points" loop on each side without an anchor (search): "a|b" becomes
 * (?:any)*(?:a|b)(?:any)*. One loop pair per alternative would be the same
 * language, but every copy is live at once, so each DFA state set grows with
 * the alternation: 50 unanchored words needed more than 4096 states, and 250
 * empty alternatives took 4 s to compile (fz_schema). */
static int unanchor(px *c, int32_t root) {
    int32_t grp[4] = {-1, -1, -1, -1}, tail[4] = {-1, -1, -1, -1}; /* ALT by start | end << 1 */
    for (int32_t a = c->x[root].lo, after; a >= 0; a = after) {
        after = c->x[a].next;
        xnode *cat = &c->x[a];
        int32_t head = cat->lo; /* the last element (reversed) */
        int end_anchor = head >= 0 && c->x[head].kind == X_EOL;
        if (end_anchor) { head = c->x[head].next; cat->n--; }
        int32_t first = head, before = -1;
        while (first >= 0 && c->x[first].next >= 0) { before = first; first = c->x[first].next; }
        int start_anchor = first >= 0 && c->x[first].kind == X_BOL;
        if (start_anchor) {
            if (before >= 0) c->x[before].next = -1;
            else head = -1;
            cat->n--;
        }
        cat->lo = head;
        for (int32_t k = head; k >= 0; k = c->x[k].next)
            if (has_anchor(c, k, 0)) return bad(c, "'^' and '$' are supported only at the start and the end of the pattern or of a top-level alternative");
        const int g = start_anchor | end_anchor << 1;
        if (grp[g] < 0) {
            if ((grp[g] = node(c, X_ALT)) < 0) return -1;
            c->x[grp[g]].lo = a;
        } else {
            c->x[tail[g]].next = a;
        }
        c->x[a].next = -1;
        tail[g] = a;
        c->x[grp[g]].n++;
    }
    int32_t any = -1, prev = -1;
    c->x[root].lo = -1;
    c->x[root].n = 0;
    for (int g = 0; g < 4; g++) {
        if (grp[g] < 0) continue;
        const int32_t cat = node(c, X_CAT);
        if (cat < 0) return -1;
        /* children in reverse order: the end loop, the group, the start loop */
        int32_t part[3] = {-1, grp[g], -1};
        for (int side = 0; side < 2; side++) {
            if (g >> side & 1) continue;
            if (any < 0) {
                const int32_t lo = c->nr;
                if (add_range(c, 0, CP_MAX) || (any = set_node(c, lo)) < 0) return -1;
            }
            const int32_t r = node(c, X_REP);
            if (r < 0) return -1;
            c->x[r].lo = any;
            c->x[r].min = 0;
            c->x[r].max = -1;
            part[side ? 0 : 2] = r;
        }
        for (int k = 2; k >= 0; k--) {
            if (part[k] < 0) continue;
            c->x[part[k]].next = c->x[cat].lo;
            c->x[cat].lo = part[k];
            c->x[cat].n++;
        }
        if (prev < 0) c->x[root].lo = cat;
        else c->x[prev].next = cat;
        prev = cat;
        c->x[root].n++;
    }
    return 0;
}

/* ===== the NFA ===== */

enum { N_RANGE, N_SPLIT, N_MATCH };
typedef struct { uint8_t kind, lo, hi; int32_t out, out1; } nst;

typedef struct {
    px *c;
    nst *s;
    int32_t n;
} nfa;

static int32_t nst_new(nfa *a, int kind, int lo, int hi, int32_t out, int32_t out1) {
    if (a->n >= MAX_NFA) return bad(a->c, "it is too large to compile (nested repeats)");
    a->s[a->n] = (nst){(uint8_t)kind, (uint8_t)lo, (uint8_t)hi, out, out1};
    return a->n++;
}

static int utf8_enc(uint32_t cp, uint8_t *b) {
    if (cp < 0x80) { b[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { b[0] = (uint8_t)(0xC0 | cp >> 6); b[1] = (uint8_t)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) { b[0] = (uint8_t)(0xE0 | cp >> 12); b[1] = (uint8_t)(0x80 | (cp >> 6 & 63)); b[2] = (uint8_t)(0x80 | (cp & 63)); return 3; }
    b[0] = (uint8_t)(0xF0 | cp >> 18); b[1] = (uint8_t)(0x80 | (cp >> 12 & 63));
    b[2] = (uint8_t)(0x80 | (cp >> 6 & 63)); b[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}

/* Code points [lo, hi] (no surrogates) as byte-range chains into next, each
 * joined to *alt by a split: the start of the union so far. */
static int utf8_emit(nfa *a, uint32_t lo, uint32_t hi, int32_t next, int32_t *alt) {
    static const uint32_t edge[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= edge[i] && hi > edge[i]) return utf8_emit(a, lo, edge[i], next, alt) || utf8_emit(a, edge[i] + 1, hi, next, alt);
    uint8_t bl[4], bh[4];
    const int n = utf8_enc(lo, bl);
    for (int i = 1; i < n; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) == (hi & ~m)) continue;
        if (lo & m) return utf8_emit(a, lo, lo | m, next, alt) || utf8_emit(a, (lo | m) + 1, hi, next, alt);
        if ((hi & m) != m) return utf8_emit(a, lo, (hi & ~m) - 1, next, alt) || utf8_emit(a, hi & ~m, hi, next, alt);
    }
    utf8_enc(hi, bh);
    int32_t s = next;
    for (int k = n - 1; k >= 0; k--)
        if ((s = nst_new(a, N_RANGE, bl[k], bh[k], s, -1)) < 0) return -1;
    if (*alt >= 0 && (s = nst_new(a, N_SPLIT, 0, 0, s, *alt)) < 0) return -1;
    *alt = s;
    return 0;
}

/* The NFA of x followed by next: its start (built backwards), or -1. */
static int32_t emit(nfa *a, int32_t id, int32_t next, int depth) {
    const xnode *x = &a->c->x[id];
    if (depth > 4 * MAX_NEST + 16) return bad(a->c, "it nests too deep");
    switch (x->kind) {
    case X_SET: {
        int32_t alt = -1;
        for (int32_t i = 0; i < x->n; i++) {
            const cpr r = a->c->r[x->lo + i];
            if (r.lo < 0xD800 && utf8_emit(a, r.lo, r.hi < 0xD800 ? r.hi : 0xD7FF, next, &alt)) return -1;
            if (r.hi > 0xDFFF && utf8_emit(a, r.lo > 0xDFFF ? r.lo : 0xE000, r.hi, next, &alt)) return -1;
        }
        return alt >= 0 ? alt : nst_new(a, N_RANGE, 1, 0, next, -1); /* the empty class: never matches */
    }
    case X_CAT:
        for (int32_t k = x->lo; k >= 0; k = a->c->x[k].next)
            if ((next = emit(a, k, next, depth + 1)) < 0) return -1;
        return next;
    case X_ALT: {
        int32_t s = -1;
        for (int32_t k = x->lo; k >= 0; k = a->c->x[k].next) {
            const int32_t b = emit(a, k, next, depth + 1);
            if (b < 0) return -1;
            if ((s = s < 0 ? b : nst_new(a, N_SPLIT, 0, 0, b, s)) < 0) return -1;
        }
        return s;
    }
    case X_REP: {
        int32_t tail = next;
        if (x->max < 0) {
            const int32_t loop = nst_new(a, N_SPLIT, 0, 0, -1, next);
            if (loop < 0) return -1;
            const int32_t body = emit(a, x->lo, loop, depth + 1);
            if (body < 0) return -1;
            a->s[loop].out = body;
            tail = loop;
        } else {
            for (int32_t i = 0; i < x->max - x->min; i++) {
                const int32_t b = emit(a, x->lo, tail, depth + 1);
                if (b < 0 || (tail = nst_new(a, N_SPLIT, 0, 0, b, tail)) < 0) return -1;
            }
        }
        for (int32_t i = 0; i < x->min; i++)
            if ((tail = emit(a, x->lo, tail, depth + 1)) < 0) return -1;
        return tail;
    }
    }
    return bad(a->c, "an anchor in the middle");
}

/* ===== DFAs ===== */

typedef struct { int32_t n; int32_t *t; uint8_t *acc; } dfa; /* t: (n, 256), -1 dead */

static void dfa_free(dfa *d) { base_free(d->t); base_free(d->acc); d->t = NULL; d->acc = NULL; d->n = 0; }

static int dfa_grow(dfa *d, int32_t *cap, int32_t need) {
    if (need <= *cap) return 0;
    int32_t nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    int32_t *t = base_realloc(d->t, (size_t)nc * 256 * sizeof *t, MEM_MISC);
    if (!t) return -1;
    d->t = t;
    uint8_t *acc = base_realloc(d->acc, (size_t)nc, MEM_MISC);
    if (!acc) return -1;
    d->acc = acc;
    *cap = nc;
    return 0;
}

typedef struct {
    int32_t *pool; int64_t npool, cap;
    int64_t *off; int32_t *len; uint64_t *hash;
    int32_t *slot; int32_t nslot;
} sets;

static int32_t set_find(sets *S, const int32_t *v, int32_t n, int32_t count, uint64_t *h_out) {
    const uint64_t h = base_fnv1a(v, (size_t)n * sizeof *v, BASE_FNV_INIT);
    *h_out = h;
    for (uint32_t i = (uint32_t)h & (uint32_t)(S->nslot - 1);; i = (i + 1) & (uint32_t)(S->nslot - 1)) {
        const int32_t k = S->slot[i];
        if (k < 0) return -1 - (int32_t)i;
        if (k < count && S->hash[k] == h && S->len[k] == n && !memcmp(S->pool + S->off[k], v, (size_t)n * sizeof *v)) return k;
    }
}

static int int_cmp(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Adds the closure of seed (the NFA states reached by splits) to out[*n];
 * *work counts the states it visits. */
static void closure(const nfa *a, int32_t seed, uint32_t *mark, uint32_t gen, int32_t *stack, int32_t *out, int32_t *n,
                    int64_t *work) {
    int32_t sp = 0;
    stack[sp++] = seed;
    while (sp > 0) {
        const int32_t s = stack[--sp];
        ++*work;
        if (s < 0 || mark[s] == gen) continue;
        mark[s] = gen;
        if (a->s[s].kind == N_SPLIT) { stack[sp++] = a->s[s].out; stack[sp++] = a->s[s].out1; }
        else out[(*n)++] = s;
    }
}

/* Subset construction over the byte classes of the NFA's ranges. */
static int subset(nfa *a, int32_t start, dfa *d) {
    px *c = a->c;
    int rc = -1;
    int32_t cap = 0;
    sets S = {0};
    S.nslot = 2 * JRE_MAX_STATES;
    uint8_t cls[256];
    int ncls = 0, rep[256];
    {
        uint8_t cut[257] = {0};
        for (int32_t i = 0; i < a->n; i++)
            if (a->s[i].kind == N_RANGE && a->s[i].lo <= a->s[i].hi) { cut[a->s[i].lo] = 1; cut[a->s[i].hi + 1] = 1; }
        for (int b = 0; b < 256; b++) {
            if (b == 0 || cut[b]) rep[ncls++] = b;
            cls[b] = (uint8_t)(ncls - 1);
        }
    }
    uint32_t *mark = base_calloc((size_t)a->n, sizeof *mark, MEM_MISC);
    int32_t *stack = base_alloc((size_t)a->n * 2 * sizeof *stack + 8, MEM_MISC);
    int32_t *tmp = base_alloc((size_t)a->n * sizeof *tmp + 8, MEM_MISC);
    S.cap = a->n > (1 << 16) ? a->n : 1 << 16; /* grows as sets come: most patterns need little */
    S.pool = base_alloc((size_t)S.cap * sizeof *S.pool, MEM_MISC);
    S.off = base_alloc(JRE_MAX_STATES * sizeof *S.off, MEM_MISC);
    S.len = base_alloc(JRE_MAX_STATES * sizeof *S.len, MEM_MISC);
    S.hash = base_alloc(JRE_MAX_STATES * sizeof *S.hash, MEM_MISC);
    S.slot = base_alloc((size_t)S.nslot * sizeof *S.slot, MEM_MISC);
    if (!mark || !stack || !tmp || !S.pool || !S.off || !S.len || !S.hash || !S.slot) { bad(c, "out of memory"); goto out; }
    memset(S.slot, 0xFF, (size_t)S.nslot * sizeof *S.slot);
    uint32_t gen = 1;
    int32_t n = 0, count = 0;
    int64_t work = 0;
    uint64_t h;
    closure(a, start, mark, gen++, stack, tmp, &n, &work);
    qsort(tmp, (size_t)n, sizeof *tmp, int_cmp);
    int32_t where = set_find(&S, tmp, n, 0, &h);
    S.slot[-1 - where] = 0;
    memcpy(S.pool, tmp, (size_t)n * sizeof *tmp);
    S.off[0] = 0; S.len[0] = n; S.hash[0] = h; S.npool = n;
    count = 1;
    for (int32_t i = 0; i < count; i++) {
        if (dfa_grow(d, &cap, i + 1)) { bad(c, "out of memory"); goto out; }
        int32_t row[256];
        d->acc[i] = 0;
        for (int32_t k = 0; k < S.len[i]; k++) d->acc[i] |= a->s[S.pool[S.off[i] + k]].kind == N_MATCH;
        for (int k = 0; k < ncls; k++) {
            const int b = rep[k];
            n = 0;
            for (int32_t j = 0; j < S.len[i]; j++) {
                const nst *s = &a->s[S.pool[S.off[i] + j]];
                if (s->kind == N_RANGE && s->lo <= b && b <= s->hi) closure(a, s->out, mark, gen, stack, tmp, &n, &work);
            }
            gen++;
            work += S.len[i];
            if (work > MAX_WORK) { bad(c, "it is too large to compile (its automaton takes more than %d steps to build)", MAX_WORK); goto out; }
            if (n == 0) { row[k] = -1; continue; }
            qsort(tmp, (size_t)n, sizeof *tmp, int_cmp);
            int32_t t = set_find(&S, tmp, n, count, &h);
            if (t < 0) {
                if (count >= JRE_MAX_STATES) { bad(c, "it needs more than %d automaton states", JRE_MAX_STATES); goto out; }
                if (S.npool + n > MAX_POOL) { bad(c, "it is too large to compile"); goto out; }
                if (S.npool + n > S.cap) {
                    int64_t nc = S.cap;
                    while (nc < S.npool + n) nc *= 2;
                    int32_t *np = base_realloc(S.pool, (size_t)nc * sizeof *np, MEM_MISC);
                    if (!np) { bad(c, "out of memory"); goto out; }
                    S.pool = np;
                    S.cap = nc;
                }
                S.slot[-1 - t] = count;
                memcpy(S.pool + S.npool, tmp, (size_t)n * sizeof *tmp);
                S.off[count] = S.npool; S.len[count] = n; S.hash[count] = h;
                S.npool += n;
                t = count++;
            }
            row[k] = t;
        }
        for (int b = 0; b < 256; b++) d->t[(size_t)i * 256 + b] = row[cls[b]];
    }
    d->n = count;
    rc = 0;
out:
    base_free(mark); base_free(stack); base_free(tmp);
    base_free(S.pool); base_free(S.off); base_free(S.len); base_free(S.hash); base_free(S.slot);
    return rc;
}

/* pattern text -> DFA (search semantics where an anchor is missing). */
static int compile_one(const char *pat, size_t len, dfa *d, char *why, size_t whylen) {
    px c = {.p = (const uint8_t *)pat, .end = (const uint8_t *)pat + len, .why = why, .whylen = whylen};
    nfa a = {.c = &c};
    int rc = -1;
    c.x = base_alloc(MAX_X * sizeof *c.x, MEM_MISC);
    c.r = base_alloc(MAX_R * sizeof *c.r, MEM_MISC);
    a.s = base_alloc(MAX_NFA * sizeof *a.s, MEM_MISC);
    if (!c.x || !c.r || !a.s) { bad(&c, "out of memory"); goto out; }
    const int32_t root = parse_alt(&c);
    if (root < 0) goto out;
    if (c.p < c.end) { bad(&c, "an unmatched ')'"); goto out; }
    if (unanchor(&c, root)) goto out;
    const int32_t match = nst_new(&a, N_MATCH, 0, 0, -1, -1);
    const int32_t start = match < 0 ? -1 : emit(&a, root, match, 0);
    if (start < 0) goto out;
    rc = subset(&a, start, d);
out:
    base_free(c.x); base_free(c.r); base_free(a.s);
    return rc;
}

/* Intersection of x with y, or (y NULL) with "between min and max code points"
 * (a counter: lead bytes count, max -1 unbounded). */
static int product(const dfa *x, const dfa *y, int64_t min, int64_t max, dfa *out, char *why, size_t whylen) {
    const int64_t cap_cnt = max >= 0 ? max : min; /* unbounded: counts past min are all alike */
    const int32_t limit = y ? JRE_MAX_STATES : JRE_MAX_LEN_STATES, nslot = 4 * limit;
    uint64_t *key = base_alloc((size_t)limit * sizeof *key, MEM_MISC);
    int32_t *slot = base_alloc((size_t)nslot * sizeof *slot, MEM_MISC);
    int32_t cap = 0, count = 1;
    int rc = -1;
    if (!key || !slot) { snprintf(why, whylen, "out of memory"); goto out; }
    memset(slot, 0xFF, (size_t)nslot * sizeof *slot);
    key[0] = 0;
    slot[base_fnv1a(&key[0], 8, BASE_FNV_INIT) & (uint64_t)(nslot - 1)] = 0;
    for (int32_t i = 0; i < count; i++) {
        if (dfa_grow(out, &cap, i + 1)) { snprintf(why, whylen, "out of memory"); goto out; }
        const int32_t sa = (int32_t)(key[i] >> 32);
        const int64_t sb = (int64_t)(key[i] & 0xFFFFFFFF);
        out->acc[i] = x->acc[sa] && (y ? y->acc[sb] : sb >= min);
        for (int b = 0; b < 256; b++) {
            int32_t *dst = &out->t[(size_t)i * 256 + b];
            const int32_t ta = x->t[(size_t)sa * 256 + b];
            int64_t tb;
            if (y) tb = y->t[(size_t)sb * 256 + b];
            else {
                tb = sb + ((b & 0xC0) != 0x80);
                if (tb > cap_cnt) tb = max >= 0 ? -1 : cap_cnt;
            }
            if (ta < 0 || tb < 0) { *dst = -1; continue; }
            const uint64_t k = (uint64_t)ta << 32 | (uint64_t)tb;
            uint32_t h = (uint32_t)base_fnv1a(&k, 8, BASE_FNV_INIT) & (uint32_t)(nslot - 1);
            while (slot[h] >= 0 && key[slot[h]] != k) h = (h + 1) & (uint32_t)(nslot - 1);
            if (slot[h] < 0) {
                if (count >= limit) {
                    snprintf(why, whylen, "it needs more than %d automaton states%s", limit, y ? "" : " with minLength/maxLength");
                    goto out;
                }
                key[count] = k;
                slot[h] = count++;
            }
            *dst = slot[h];
        }
    }
    out->n = count;
    rc = 0;
out:
    base_free(key);
    base_free(slot);
    return rc;
}

/* The bytes a JSON string's content can carry: raw from 0x20, or escaped. */
static int carried(int b) { return b >= 0x20 || b == 8 || b == 9 || b == 10 || b == 12 || b == 13; }

/* Keeps the states reachable from 0 that can reach an accepting state through
 * carried bytes, renumbered (0 stays the start), as the table of jregex.h. */
static int trim(const dfa *d, uint16_t **table, size_t *len_out, int32_t *n_states, int32_t *n_classes, char *why, size_t whylen) {
    const int32_t n = d->n;
    int32_t *live = base_calloc((size_t)n, sizeof *live, MEM_MISC), *q = base_alloc((size_t)n * sizeof *q, MEM_MISC);
    int32_t *rstart = base_calloc((size_t)n + 1, sizeof *rstart, MEM_MISC);
    int32_t *redge = base_alloc((size_t)n * 256 * sizeof *redge + 4, MEM_MISC);
    int rc = -1;
    if (!live || !q || !rstart || !redge) { snprintf(why, whylen, "out of memory"); goto out; }
    /* reverse edges by counting sort */
    for (int64_t e = 0; e < (int64_t)n * 256; e++)
        if (d->t[e] >= 0 && carried((int)(e & 255))) rstart[d->t[e] + 1]++;
    for (int32_t i = 0; i < n; i++) rstart[i + 1] += rstart[i];
    {
        int32_t *fill = q; /* borrowed as the fill cursor */
        memcpy(fill, rstart, (size_t)n * sizeof *fill);
        for (int64_t e = 0; e < (int64_t)n * 256; e++)
            if (d->t[e] >= 0 && carried((int)(e & 255))) redge[fill[d->t[e]]++] = (int32_t)(e >> 8);
    }
    int32_t qh = 0, qt = 0;
    for (int32_t i = 0; i < n; i++) if (d->acc[i]) { live[i] = 1; q[qt++] = i; }
    while (qh < qt) {
        const int32_t s = q[qh++];
        for (int32_t k = rstart[s]; k < rstart[s + 1]; k++)
            if (!live[redge[k]]) { live[redge[k]] = 1; q[qt++] = redge[k]; }
    }
    if (!live[0]) { snprintf(why, whylen, "no string that JSON text can carry matches it"); goto out; }
    /* forward from 0 through live states: the new numbering (live[] = id + 1) */
    int32_t *id = rstart; /* reused: n + 1 entries */
    for (int32_t i = 0; i < n; i++) id[i] = -1;
    qh = qt = 0;
    id[0] = 0;
    q[qt++] = 0;
    while (qh < qt) {
        const int32_t s = q[qh++];
        for (int b = 0; b < 256; b++) {
            const int32_t t = d->t[(size_t)s * 256 + b];
            if (t >= 0 && carried(b) && live[t] && id[t] < 0) { id[t] = qt; q[qt++] = t; }
        }
    }
    /* the new transitions, column by column (redge reused: qt * 256 entries) */
    for (int32_t i = 0; i < qt; i++)
        for (int b = 0; b < 256; b++) {
            const int32_t t = d->t[(size_t)q[i] * 256 + b];
            redge[(size_t)b * qt + i] = t >= 0 && carried(b) && live[t] ? id[t] : -1;
        }
    /* byte classes: equal columns */
    int cls[256], rep[256], ncls = 0;
    for (int b = 0; b < 256; b++) {
        cls[b] = -1;
        for (int k = 0; k < ncls && cls[b] < 0; k++)
            if (!memcmp(redge + (size_t)b * qt, redge + (size_t)rep[k] * qt, (size_t)qt * sizeof *redge)) cls[b] = k;
        if (cls[b] < 0) { rep[ncls] = b; cls[b] = ncls++; }
    }
    const size_t len = 256 + (size_t)qt * (size_t)(ncls + 1);
    uint16_t *r = base_alloc(len * sizeof *r, MEM_MISC);
    if (!r) { snprintf(why, whylen, "out of memory"); goto out; }
    for (int b = 0; b < 256; b++) r[b] = (uint16_t)cls[b];
    for (int32_t i = 0; i < qt; i++) {
        uint16_t *row = r + 256 + (size_t)i * (size_t)(ncls + 1);
        for (int k = 0; k < ncls; k++) {
            const int32_t t = redge[(size_t)rep[k] * qt + i];
            row[k] = t < 0 ? JRE_DEAD : (uint16_t)t;
        }
        row[ncls] = d->acc[q[i]];
    }
    *table = r;
    *len_out = len;
    *n_states = qt;
    *n_classes = ncls;
    rc = 0;
out:
    base_free(live); base_free(q); base_free(rstart); base_free(redge);
    return rc;
}

/* ===== formats: fixed patterns ===== */

/* Days per month are checked, February 29 only in leap years (Gregorian). */
#define F_DATE "(?:\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|1\\d|2[0-8]))" \
               "|(?:\\d\\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
/* RFC 3339 full-time: seconds 00-59 (no leap second), at most 9 fraction digits, Z or an offset */
#define F_TIME "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,9})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
#define F_LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define F_OCTET "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"

static const char *const k_formats[][2] = {
    {"date", "^" F_DATE "$"},
    {"time", "^" F_TIME "$"},
    {"date-time", "^" F_DATE "T" F_TIME "$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"email", "^[A-Za-z0-9_%+-]+(?:\\.[A-Za-z0-9_%+-]+)*@(?:" F_LABEL "\\.)+" F_LABEL "$"},
    {"ipv4", "^(?:" F_OCTET "\\.){3}" F_OCTET "$"},
};

const char *jregex_format(const char *name) {
    for (size_t i = 0; i < sizeof k_formats / sizeof *k_formats; i++)
        if (!strcmp(name, k_formats[i][0])) return k_formats[i][1];
    return NULL;
}

/* ===== integer ranges: the classic split into digit-class runs ===== */

typedef struct { char *p; size_t n, cap; int over; } sout;

static void sput(sout *o, const char *s, size_t n) {
    if (o->n + n >= o->cap) { o->over = 1; return; }
    memcpy(o->p + o->n, s, n);
    o->n += n;
    o->p[o->n] = 0;
}

/* Digit strings lo..hi of the same length n (lo <= hi). */
static void range_same(sout *o, const char *lo, const char *hi, int n) {
    while (n > 0 && *lo == *hi) { sput(o, lo, 1); lo++; hi++; n--; }
    if (n == 0) return;
    int all0 = 1, all9 = 1;
    for (int i = 1; i < n; i++) { all0 &= lo[i] == '0'; all9 &= hi[i] == '9'; }
    char from = all0 ? lo[0] : (char)(lo[0] + 1), to = all9 ? hi[0] : (char)(hi[0] - 1), buf[48], nines[16], zeros[16];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    int alts = 0;
    sput(o, "(?:", 3);
    if (!all0) { sput(o, lo, 1); range_same(o, lo + 1, nines, n - 1); alts++; }
    if (from <= to) {
        if (alts++) sput(o, "|", 1);
        sput(o, buf, (size_t)snprintf(buf, sizeof buf, "[%c-%c]", from, to));
        if (n > 1) sput(o, buf, (size_t)snprintf(buf, sizeof buf, "\\d{%d}", n - 1));
    }
    if (!all9) { if (alts++) sput(o, "|", 1); sput(o, hi, 1); range_same(o, zeros, hi + 1, n - 1); }
    sput(o, ")", 1);
}

/* Non-negative lo..hi: one run per digit count. */
static void range_pos(sout *o, uint64_t lo, uint64_t hi) {
    uint64_t p = 1;
    int first = 1;
    for (int d = 1; d <= 16 && lo <= hi; d++, p *= 10) {
        const uint64_t top = p * 10 - 1;
        if (lo > top) continue;
        const uint64_t a = lo, b = hi < top ? hi : top;
        char sa[24], sb[24];
        snprintf(sa, sizeof sa, "%0*llu", d, (unsigned long long)a);
        snprintf(sb, sizeof sb, "%0*llu", d, (unsigned long long)b);
        if (!first) sput(o, "|", 1);
        first = 0;
        range_same(o, sa, sb, d);
        lo = b + 1;
    }
}

long jregex_int_range(int64_t lo, int64_t hi, char *buf, size_t cap) {
    sout o = {buf, 0, cap, 0};
    if (cap) buf[0] = 0;
    sput(&o, "^(?:", 4);
    int any = 0;
    if (lo < 0) { /* -(|min(hi,-1)| .. |lo|) */
        sput(&o, "-(?:", 4);
        range_pos(&o, (uint64_t)(hi < 0 ? -hi : 1), (uint64_t)-lo);
        sput(&o, ")", 1);
        any = 1;
    }
    if (hi >= 0) {
        if (any) sput(&o, "|", 1);
        range_pos(&o, (uint64_t)(lo > 0 ? lo : 0), (uint64_t)hi);
    }
    sput(&o, ")$", 2);
    return o.over ? -1 : (long)o.n;
}

int jregex_unescape(uint8_t c) {
    switch (c) {
    case 'b': return 8;
    case 't': return 9;
    case 'n': return 10;
    case 'f': return 12;
    case 'r': return 13;
    case '"': case '\\': case '/': return c;
    }
    return -1;
}

int jregex_compile(const char *pattern, size_t len, const char *format, int64_t min_len, int64_t max_len, uint16_t **table,
                   size_t *len_out, int32_t *n_states, int32_t *n_classes, char *why, size_t whylen) {
    dfa a = {0}, b = {0}, t = {0};
    int rc = -1;
    *table = NULL;
    *len_out = 0;
    *n_states = *n_classes = 0;
    if (pattern && len > JRE_MAX_PATTERN) { snprintf(why, whylen, "longer than %d bytes", JRE_MAX_PATTERN); return -1; }
    if (pattern && compile_one(pattern, len, &a, why, whylen)) goto out;
    if (format) {
        const char *f = jregex_format(format);
        dfa *into = pattern ? &b : &a;
        if (!f) { snprintf(why, whylen, "unknown format"); goto out; }
        if (compile_one(f, strlen(f), into, why, whylen)) goto out;
        if (pattern) {
            if (product(&a, &b, 0, -1, &t, why, whylen)) goto out;
            dfa_free(&a);
            a = t;
            t = (dfa){0};
        }
    }
    if (min_len > 0 || max_len >= 0) {
        if (min_len > JRE_MAX_LEN_STATES || max_len > 1000000) { snprintf(why, whylen, "length bounds this large are not supported with it"); goto out; }
        if (product(&a, NULL, min_len, max_len, &t, why, whylen)) goto out;
        dfa_free(&a);
        a = t;
        t = (dfa){0};
    }
    rc = trim(&a, table, len_out, n_states, n_classes, why, whylen);
out:
    dfa_free(&a);
    dfa_free(&b);
    dfa_free(&t);
    return rc;
}
