/* jcur.c: the strict JSON cursor (see jcur.h). */
#include "jcur.h"

#include <string.h>
#include "base.h"

#define JCUR_MAX_DEPTH 64

int jcur_syntax(jcur *c, const char *ctx, const char *why) {
    const char *kind = c->ctx_kind ? c->ctx_kind : "";
    if (!ctx)
        return base_fail(c->err, c->errlen, STRATA_EFORMAT, "%s: invalid JSON at byte %zu: %s", c->what,
                         (size_t)(c->p - c->base), why);
    return base_fail(c->err, c->errlen, STRATA_EFORMAT, "%s: %s%s'%s': invalid JSON at byte %zu: %s", c->what, kind,
                     *kind ? " " : "", ctx, (size_t)(c->p - c->base), why);
}

static int jstr_add(jcur *c, jstr *s, const void *src, size_t n) {
    if (s->cap - s->len < n + 1) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap - s->len < n + 1) cap *= 2;
        char *ns = base_realloc(s->s, cap, c->tag);
        if (!ns) return base_fail(c->err, c->errlen, STRATA_ENOMEM, "%s: out of memory at byte %zu",
                                  c->what, (size_t)(c->p - c->base));
        s->s = ns;
        s->cap = cap;
    }
    memcpy(s->s + s->len, src, n);
    s->len += n;
    s->s[s->len] = 0;
    return 0;
}

static int hexval(uint8_t h) {
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    if (h >= 'A' && h <= 'F') return h - 'A' + 10;
    return -1;
}

static int jc_hex4(jcur *c, uint32_t *u) {
    if (c->end - c->p < 4) return -1;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(c->p[i]);
        if (h < 0) return -1;
        v = v << 4 | (uint32_t)h;
    }
    c->p += 4;
    *u = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at p (2..4 bytes), or 0 (overlong, surrogate,
 * > U+10FFFF, truncated or bad continuation). */
static size_t utf8_len(const uint8_t *p, const uint8_t *end) {
    uint8_t b = p[0];
    size_t n;
    uint32_t min, cp;
    if (b >= 0xc2 && b <= 0xdf) { n = 2; min = 0x80; cp = b & 0x1f; }
    else if (b >= 0xe0 && b <= 0xef) { n = 3; min = 0x800; cp = b & 0x0f; }
    else if (b >= 0xf0 && b <= 0xf4) { n = 4; min = 0x10000; cp = b & 0x07; }
    else return 0;
    if ((size_t)(end - p) < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

int jcur_str(jcur *c, jstr *s, const char *ctx) {
    jcur_ws(c);
    if (c->p >= c->end || *c->p != '"') return jcur_syntax(c, ctx, "expected a string");
    c->p++;
    s->len = 0;
    if (jstr_add(c, s, "", 0)) return STRATA_ENOMEM;
    for (;;) {
        const uint8_t *q = c->p;
        while (q < c->end && *q != '"' && *q != '\\' && *q >= 0x20 && *q < 0x80) q++;
        if (q > c->p && jstr_add(c, s, c->p, (size_t)(q - c->p))) return STRATA_ENOMEM;
        c->p = q;
        if (q >= c->end) return jcur_syntax(c, ctx, "unterminated string");
        if (*q == '"') { c->p++; return 0; }
        if (*q < 0x20) return jcur_syntax(c, ctx, "control character in a string");
        if (*q >= 0x80) {
            size_t n = utf8_len(q, c->end);
            if (!n) return jcur_syntax(c, ctx, "invalid UTF-8 in a string");
            if (jstr_add(c, s, q, n)) return STRATA_ENOMEM;
            c->p += n;
            continue;
        }
        /* backslash escape */
        c->p++;
        if (c->p >= c->end) return jcur_syntax(c, ctx, "unterminated string");
        uint8_t e = *c->p++;
        char out[4];
        size_t n = 1;
        switch (e) {
        case '"': out[0] = '"'; break;
        case '\\': out[0] = '\\'; break;
        case '/': out[0] = '/'; break;
        case 'b': out[0] = '\b'; break;
        case 'f': out[0] = '\f'; break;
        case 'n': out[0] = '\n'; break;
        case 'r': out[0] = '\r'; break;
        case 't': out[0] = '\t'; break;
        case 'u': {
            uint32_t u, lo;
            if (jc_hex4(c, &u)) return jcur_syntax(c, ctx, "bad \\u escape");
            if (u >= 0xdc00 && u <= 0xdfff) return jcur_syntax(c, ctx, "lone low surrogate in \\u escape");
            if (u >= 0xd800 && u <= 0xdbff) {
                if (c->end - c->p < 2 || c->p[0] != '\\' || c->p[1] != 'u')
                    return jcur_syntax(c, ctx, "lone high surrogate in \\u escape");
                c->p += 2;
                if (jc_hex4(c, &lo) || lo < 0xdc00 || lo > 0xdfff)
                    return jcur_syntax(c, ctx, "bad surrogate pair in \\u escape");
                u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (u < 0x80) out[0] = (char)u;
            else if (u < 0x800) { out[0] = (char)(0xc0 | u >> 6); out[1] = (char)(0x80 | (u & 0x3f)); n = 2; }
            else if (u < 0x10000) {
                out[0] = (char)(0xe0 | u >> 12); out[1] = (char)(0x80 | ((u >> 6) & 0x3f));
                out[2] = (char)(0x80 | (u & 0x3f)); n = 3;
            } else {
                out[0] = (char)(0xf0 | u >> 18); out[1] = (char)(0x80 | ((u >> 12) & 0x3f));
                out[2] = (char)(0x80 | ((u >> 6) & 0x3f)); out[3] = (char)(0x80 | (u & 0x3f)); n = 4;
            }
            break;
        }
        default: return jcur_syntax(c, ctx, "bad escape in a string");
        }
        if (jstr_add(c, s, out, n)) return STRATA_ENOMEM;
    }
}

int jcur_num(jcur *c, int64_t *v, int *kind, const char *ctx) {
    jcur_ws(c);
    const uint8_t *p = c->p, *end = c->end;
    int neg = 0, big = 0, real = 0;
    uint64_t mag = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    if (p >= end || *p < '0' || *p > '9') return jcur_syntax(c, ctx, "expected a number");
    if (*p == '0') {
        p++;
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            unsigned d = (unsigned)(*p++ - '0');
            if (mag > (UINT64_MAX - d) / 10) big = 1;
            else mag = mag * 10 + d;
        }
    }
    if (p < end && *p == '.') {
        real = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9') { c->p = p; return jcur_syntax(c, ctx, "bad number"); }
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        real = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') { c->p = p; return jcur_syntax(c, ctx, "bad number"); }
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    c->p = p;
    if (real) { *kind = JN_REAL; return 0; }
    if (big || mag > (uint64_t)INT64_MAX + (uint64_t)neg) { *kind = JN_RANGE; return 0; }
    *kind = JN_INT;
    *v = neg ? (mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    return 0;
}

static int jc_lit(jcur *c, const char *lit, const char *ctx) {
    size_t n = strlen(lit);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, lit, n)) return jcur_syntax(c, ctx, "invalid literal");
    c->p += n;
    return 0;
}

/* Skips any JSON value (depth-limited so hostile nesting cannot exhaust the stack). */
static int skip_at(jcur *c, int depth, const char *ctx) {
    if (depth > JCUR_MAX_DEPTH) return jcur_syntax(c, ctx, "nesting deeper than 64");
    jcur_ws(c);
    if (c->p >= c->end) return jcur_syntax(c, ctx, "expected a value");
    int64_t v;
    int kind, rc;
    switch (*c->p) {
    case '"': return jcur_str(c, &c->tmp, ctx);
    case 't': return jc_lit(c, "true", ctx);
    case 'f': return jc_lit(c, "false", ctx);
    case 'n': return jc_lit(c, "null", ctx);
    case '{':
        c->p++;
        if (jcur_eat(c, '}')) return 0;
        do {
            if ((rc = jcur_str(c, &c->tmp, ctx))) return rc;
            if (!jcur_eat(c, ':')) return jcur_syntax(c, ctx, "expected ':'");
            if ((rc = skip_at(c, depth + 1, ctx))) return rc;
        } while (jcur_eat(c, ','));
        return jcur_eat(c, '}') ? 0 : jcur_syntax(c, ctx, "expected ',' or '}'");
    case '[':
        c->p++;
        if (jcur_eat(c, ']')) return 0;
        do {
            if ((rc = skip_at(c, depth + 1, ctx))) return rc;
        } while (jcur_eat(c, ','));
        return jcur_eat(c, ']') ? 0 : jcur_syntax(c, ctx, "expected ',' or ']'");
    default: return jcur_num(c, &v, &kind, ctx);
    }
}

int jcur_finish(jcur *c) {
    jcur_ws(c);
    return c->p == c->end ? 0 : jcur_syntax(c, NULL, "trailing bytes after the top-level object");
}

int jcur_skip(jcur *c, const char *ctx) { return skip_at(c, 0, ctx); }

int jcur_member(jcur *c, const char *key, const uint8_t **val, size_t *n) {
    const size_t klen = strlen(key);
    int rc;
    if (!jcur_eat(c, '{')) return jcur_syntax(c, NULL, "expected '{'");
    if (jcur_eat(c, '}')) return 1;
    do {
        if ((rc = jcur_str(c, &c->tmp, NULL))) return rc;
        const int hit = c->tmp.len == klen && !memcmp(c->tmp.s, key, klen);
        if (!jcur_eat(c, ':')) return jcur_syntax(c, NULL, "expected ':'");
        jcur_ws(c);
        const uint8_t *v = c->p;
        if ((rc = jcur_skip(c, NULL))) return rc;
        if (hit) {
            *val = v;
            *n = (size_t)(c->p - v);
            return 0;
        }
    } while (jcur_eat(c, ','));
    return jcur_eat(c, '}') ? 1 : jcur_syntax(c, NULL, "expected ',' or '}'");
}

void jcur_blank(uint8_t *b, size_t n) {
    if (n < 2) return;
    const uint8_t close = b[0] == '{' ? '}' : ']';
    int put_close = 1;
    for (size_t i = 1; i < n; i++) {
        if (b[i] == '\n') continue;
        b[i] = put_close ? close : ' ';
        put_close = 0;
    }
}
