/* jscan.c: reading one large JSON member in place (see jscan.h). */
#include "jscan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int is_ws(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int jscan_peek(jscan *s) {
    while (s->p < s->end && is_ws(*s->p)) s->p++;
    return s->p < s->end ? *s->p : -1;
}

int jscan_expect(jscan *s, char c) {
    if (jscan_peek(s) != (uint8_t)c) {
        static const char *const want[] = {"expected ':'", "expected ','", "expected '{'", "expected '['",
                                           "expected '\"'", "expected ']'", "expected '}'", "unexpected byte"};
        const char *set = ":,{[\"]}";
        const char *at = strchr(set, c);
        s->why = s->p >= s->end ? "unexpected end of text" : want[at ? at - set : 7];
        return -1;
    }
    s->p++;
    return 0;
}

static int hex4(const uint8_t *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/* Length of the valid UTF-8 character at p (at most avail bytes), or 0: no
 * overlong forms, no surrogates, nothing above U+10FFFF (jansson's rules). */
static size_t utf8_len(const uint8_t *p, size_t avail) {
    uint8_t c = p[0];
    size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!n || n > avail) return 0;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1Fu : n == 3 ? c & 0x0Fu : c & 0x07u;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3Fu);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

static void put(uint8_t *out, size_t cap, size_t *o, uint8_t b) {
    if (*o < cap) out[*o] = b;
    (*o)++;
}

static void put_cp(uint8_t *out, size_t cap, size_t *o, uint32_t cp) {
    if (cp < 0x80) put(out, cap, o, (uint8_t)cp);
    else if (cp < 0x800) {
        put(out, cap, o, (uint8_t)(0xC0 | cp >> 6));
        put(out, cap, o, (uint8_t)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        put(out, cap, o, (uint8_t)(0xE0 | cp >> 12));
        put(out, cap, o, (uint8_t)(0x80 | (cp >> 6 & 0x3F)));
        put(out, cap, o, (uint8_t)(0x80 | (cp & 0x3F)));
    } else {
        put(out, cap, o, (uint8_t)(0xF0 | cp >> 18));
        put(out, cap, o, (uint8_t)(0x80 | (cp >> 12 & 0x3F)));
        put(out, cap, o, (uint8_t)(0x80 | (cp >> 6 & 0x3F)));
        put(out, cap, o, (uint8_t)(0x80 | (cp & 0x3F)));
    }
}

static int fail(jscan *s, const uint8_t *at, const char *why) {
    s->p = at;
    s->why = why;
    return -1;
}

int jscan_string(jscan *s, uint8_t *out, size_t cap, size_t *n) {
    if (jscan_expect(s, '"')) return -1;
    const uint8_t *p = s->p, *e = s->end;
    size_t o = 0;
    while (p < e && *p != '"') {
        if (*p < 0x20) return fail(s, p, "control character in a string");
        if (*p != '\\') {
            size_t k = utf8_len(p, (size_t)(e - p));
            if (!k) return fail(s, p, "invalid UTF-8 in a string");
            for (size_t i = 0; i < k; i++) put(out, cap, &o, p[i]);
            p += k;
            continue;
        }
        if (e - p < 2) return fail(s, p, "unexpected end of text in a string");
        const uint8_t c = p[1];
        const char *simple = strchr("\"\\/bfnrt", c);
        if (c && simple) {
            static const uint8_t to[] = {'"', '\\', '/', '\b', '\f', '\n', '\r', '\t'};
            put(out, cap, &o, to[simple - "\"\\/bfnrt"]);
            p += 2;
            continue;
        }
        uint32_t cp, lo;
        if (c != 'u' || e - p < 6 || hex4(p + 2, &cp)) return fail(s, p, "invalid escape in a string");
        if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(s, p, "invalid Unicode escape (a lone low surrogate)");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (e - p < 12 || p[6] != '\\' || p[7] != 'u' || hex4(p + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                return fail(s, p, "invalid Unicode escape (a high surrogate without its low half)");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
        }
        put_cp(out, cap, &o, cp);
        p += 6;
    }
    if (p >= e) return fail(s, p, "unexpected end of text in a string");
    s->p = p + 1;
    *n = o;
    return 0;
}

int jscan_int(jscan *s, int64_t *v) {
    jscan_peek(s);
    const uint8_t *p = s->p, *e = s->end, *start = p;
    int neg = p < e && *p == '-';
    p += neg;
    if (p >= e || *p < '0' || *p > '9') return fail(s, start, "expected a number");
    int64_t acc = 0, big = 0;
    if (*p == '0') p++;
    else
        for (; p < e && *p >= '0' && *p <= '9'; p++) {
            if (acc > 900000000000000000ll / 10) big = 1;
            else acc = acc * 10 + (*p - '0');
        }
    int real = 0;
    if (p < e && *p == '.') {
        real = 1;
        if (++p >= e || *p < '0' || *p > '9') return fail(s, p, "invalid number");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        real = 1;
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return fail(s, p, "invalid number");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && ((*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == '+' || (*p | 0x20) == 'e' ||
                  (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
        return fail(s, p, "invalid number");
    s->p = p;
    if (!real) {
        if (big || acc > 9000000000000000ll) return 1;
        *v = neg ? -acc : acc;
        return 0;
    }
    char buf[512];
    size_t len = (size_t)(p - start);
    if (len >= sizeof buf) return 1;
    memcpy(buf, start, len);
    buf[len] = 0;
    double d = strtod(buf, NULL);
    if (!isfinite(d) || d != floor(d) || fabs(d) > 9.0e15) return 1;
    *v = (int64_t)d;
    return 0;
}

/* Lenient: brackets of either kind nest, anything between them but strings is
 * passed over; strings end at the first unescaped quote. */
int jscan_skip(jscan *s) {
    int c = jscan_peek(s);
    if (c < 0) return fail(s, s->p, "unexpected end of text");
    const uint8_t *p = s->p, *e = s->end;
    if (c != '{' && c != '[' && c != '"') { /* a number or a literal */
        while (p < e && !is_ws(*p) && !strchr(",:]}[{\"", *p)) p++;
        if (p == s->p) return fail(s, p, "unexpected byte");
        s->p = p;
        return 0;
    }
    size_t depth = 0;
    do {
        if (*p == '"') {
            for (p++; p < e && *p != '"'; p++)
                if (*p == '\\') p++;
            if (p >= e) return fail(s, e, "unexpected end of text in a string");
        } else if (*p == '{' || *p == '[') depth++;
        else if (*p == '}' || *p == ']') depth--;
        p++;
    } while (depth && p < e);
    if (depth) return fail(s, e, "unexpected end of text");
    s->p = p;
    return 0;
}

void jscan_where(const jscan *s, int *line, int *col) {
    int l = 1, c = 1;
    for (const uint8_t *q = s->doc; q < s->p && q < s->end; q++) {
        if (*q == '\n') { l++; c = 1; }
        else if ((*q & 0xC0) != 0x80) c++;
    }
    *line = l;
    *col = c;
}

int jscan_member(const uint8_t *b, size_t len, const char *key, size_t *off, size_t *n) {
    jscan s = {.p = b, .end = b + len, .doc = b};
    const size_t klen = strlen(key);
    uint8_t name[64];
    if (jscan_expect(&s, '{')) return -1;
    if (jscan_peek(&s) == '}') return -1;
    for (;;) {
        size_t nl;
        if (jscan_string(&s, name, sizeof name, &nl) || jscan_expect(&s, ':')) return -1;
        jscan_peek(&s);
        const uint8_t *v = s.p;
        if (jscan_skip(&s)) return -1;
        if (nl == klen && !memcmp(name, key, klen)) {
            *off = (size_t)(v - b);
            *n = (size_t)(s.p - v);
            return 0;
        }
        int c = jscan_peek(&s);
        if (c != ',') return -1;
        s.p++;
    }
}

void jscan_blank(uint8_t *b, size_t n) {
    if (n < 2) return;
    uint8_t close = b[0] == '{' ? '}' : ']';
    int put_close = 1;
    for (size_t i = 1; i < n; i++) {
        if (b[i] == '\n') continue;
        b[i] = put_close ? close : ' ';
        put_close = 0;
    }
}
