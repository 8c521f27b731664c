/*
 * jgram.c: the byte machine of a compiled JSON grammar, the vocabulary trie and
 * the per-step token masks (see jgram.h).
 *
 * Each frame is one value being read. feed() hands a byte to the top frame,
 * which consumes it, or pushes a child and hands it on, or (a number or a
 * literal that is complete and cannot take the byte) pops and hands it to its
 * parent. JSON's delimiters never continue a number, so the machine is
 * deterministic: one state per prefix.
 */
#include "jgram.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "base.h"
#include "jregex.h"

enum { F_VAL = 1, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT, F_SEQ, F_KEYED, F_RAW, F_PAT, F_INTR };
/* pattern string sub-states (F_PAT; b = the DFA state): content, after '\\' */
enum { P_NORM, P_ESC };
/* object sub-states: after '{', inside a listed key, before ':', after a value, after ',' */
enum { O_OPEN, O_KEY, O_COLON, O_AFTER, O_NEXT };
enum { A_OPEN, A_AFTER };
/* string sub-states: plain, after '\', \u digits (U2D: the second digit after a
 * 'd', kept below 8 so no surrogate is written), UTF-8 continuations */
enum { S_NORM, S_ESC, S_U1, S_U2, S_U2D, S_U3, S_U4, S_C1, S_C2, S_C3, S_E0, S_ED, S_F0, S_F4 };
/* number sub-states (accepting: N_ZERO, N_INT, N_FRAC, N_EXP) */
enum { N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
#define MAX_INT_DIGITS 15
#define MAX_FRAC_DIGITS 15
#define MAX_EXP_DIGITS 3

enum { R_OK, R_DEAD, R_AGAIN }; /* consumed / no document / hand the byte to the (new) top */

static int is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\t'; }
static int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static int is_hex(uint8_t c) { return is_digit(c) || ((c | 32) >= 'a' && (c | 32) <= 'f'); }

void jgram_free(jgram *g) {
    if (!g) return;
    base_free(g->nodes);
    base_free(g->props);
    base_free(g->lits);
    base_free(g->alts);
    base_free(g->bytes);
    base_free(g->pat);
    base_free(g);
}

/* 1 when a value of node can start with c (choices: any alternative). */
static int first_ok(const jgram *g, int32_t node, uint8_t c, int guard) {
    const jg_node *n = &g->nodes[node];
    switch (n->kind) {
    case JG_OBJ: return c == '{';
    case JG_ARR: return c == '[';
    case JG_STR: case JG_PAT: return c == '"';
    case JG_NUM: case JG_INT: case JG_INTR: return c == '-' || is_digit(c);
    case JG_LIT:
        for (int32_t i = 0; i < n->n; i++)
            if (g->bytes[g->lits[n->lo + i].off] == c) return 1;
        return 0;
    case JG_CHOICE:
        if (guard > 64) return 0;
        for (int32_t i = 0; i < n->n; i++)
            if (first_ok(g, g->alts[n->lo + i], c, guard + 1)) return 1;
        return 0;
    }
    return 0;
}

static int push(jg_state *s, int32_t node) {
    if (s->depth >= JG_MAX_DEPTH) return -1;
    s->f[s->depth++] = (jg_frame){.node = node, .kind = F_VAL};
    return 0;
}

static int ws_step(jg_frame *f, uint8_t c) {
    if (f->ws >= JG_MAX_WS) return R_DEAD;
    f->ws++;
    return R_OK;
}

/* A value starting: the node's kind decides the frame. */
static int step_val(const jgram *g, jg_frame *f, uint8_t c) {
    const int32_t k0 = g->nodes[f->node].kind;
    if (k0 == JG_SEQ || k0 == JG_KEYED || k0 == JG_RAW || (k0 == JG_LIT && g->nodes[f->node].extra == 1)) {
        /* composition parts: exact bytes, no white space before them */
        if (k0 == JG_LIT) { f->kind = F_LIT; f->a = g->nodes[f->node].lo; f->b = 0; return R_AGAIN; }
        f->kind = k0 == JG_SEQ ? F_SEQ : k0 == JG_KEYED ? F_KEYED : F_RAW;
        f->sub = S_NORM;
        f->a = f->b = 0;
        return R_AGAIN;
    }
    if (is_ws(c)) return ws_step(f, c);
    for (int guard = 0; g->nodes[f->node].kind == JG_CHOICE; guard++) {
        const jg_node *n = &g->nodes[f->node];
        int32_t pick = -1;
        for (int32_t i = 0; i < n->n && pick < 0; i++)
            if (first_ok(g, g->alts[n->lo + i], c, 0)) pick = g->alts[n->lo + i];
        if (pick < 0 || guard > 64) return R_DEAD;
        f->node = pick;
    }
    const jg_node *n = &g->nodes[f->node];
    f->ws = 0;
    f->a = f->b = 0;
    f->sub = 0;
    switch (n->kind) {
    case JG_OBJ: if (c != '{') return R_DEAD; f->kind = F_OBJ; f->sub = O_OPEN; return R_OK;
    case JG_ARR: if (c != '[') return R_DEAD; f->kind = F_ARR; f->sub = A_OPEN; return R_OK;
    case JG_STR: if (c != '"') return R_DEAD; f->kind = F_STR; f->sub = S_NORM; return R_OK;
    case JG_PAT: if (c != '"') return R_DEAD; f->kind = F_PAT; f->sub = P_NORM; return R_OK;
    case JG_INTR: f->kind = F_INTR; f->b = 0; return R_AGAIN;
    case JG_NUM: case JG_INT: f->kind = F_NUM; f->sub = N_START; return R_AGAIN;
    case JG_LIT: f->kind = F_LIT; f->a = n->lo; f->b = 0; return R_AGAIN;
    }
    return R_DEAD;
}

/* Listed key bytes: the lowest property j in [i, last allowed] whose key agrees
 * with the bytes so far (those of key j0's first k) and has c next. */
static int key_next(const jgram *g, const jg_node *n, int32_t i, int32_t j0, int32_t k, uint8_t c) {
    const jg_prop *P = g->props + n->lo, *p0 = &P[j0];
    int32_t last = P[i].req_next < n->n ? P[i].req_next : n->n - 1;
    for (int32_t j = j0; j <= last; j++) {
        const jg_prop *p = &P[j];
        if (p->len > k && g->bytes[p->off + k] == c && !memcmp(g->bytes + p->off, g->bytes + p0->off, (size_t)k)) return j;
    }
    return -1;
}

static int step_obj(const jgram *g, jg_state *s, jg_frame *f, uint8_t c) {
    const jg_node *n = &g->nodes[f->node];
    if (f->sub == O_KEY) {
        const int32_t j0 = f->b >> 16, k = f->b & 0xFFFF;
        const int32_t j = key_next(g, n, f->a, j0, k, c);
        if (j < 0) return R_DEAD;
        f->b = (j << 16) | (k + 1);
        if (k + 1 == g->props[n->lo + j].len) { f->sub = O_COLON; f->a = j + 1; }
        return R_OK;
    }
    if (is_ws(c)) return ws_step(f, c);
    f->ws = 0;
    const int listed = n->n > 0;
    /* '}' closes when no required property is left (free-form: always) */
    const int can_close = !listed || g->props[n->lo + (f->a < n->n ? f->a : 0)].req_next == n->n || f->a >= n->n;
    switch (f->sub) {
    case O_OPEN: case O_NEXT:
        if (c == '}' && f->sub == O_OPEN && can_close) { s->depth--; return R_OK; }
        if (c != '"') return R_DEAD;
        if (listed) {
            if (f->a >= n->n) return R_DEAD;
            f->sub = O_KEY;
            f->b = (f->a << 16) | 1; /* every key starts with '"' */
            return R_OK;
        }
        if (n->extra < 0) return R_DEAD;
        /* a free-form key: any string, its frame already past the quote */
        f->sub = O_COLON;
        if (s->depth >= JG_MAX_DEPTH) return R_DEAD;
        s->f[s->depth++] = (jg_frame){.node = -1, .kind = F_STR, .sub = S_NORM};
        return R_OK;
    case O_COLON:
        if (c != ':') return R_DEAD;
        f->sub = O_AFTER;
        return push(s, listed ? g->props[n->lo + (f->b >> 16)].node : n->extra) ? R_DEAD : R_OK;
    case O_AFTER:
        if (c == '}' && can_close) { s->depth--; return R_OK; }
        if (c == ',' && (!listed || f->a < n->n)) { f->sub = O_NEXT; return R_OK; }
        return R_DEAD;
    }
    return R_DEAD;
}

static int step_arr(const jgram *g, jg_state *s, jg_frame *f, uint8_t c) {
    const jg_node *n = &g->nodes[f->node];
    if (is_ws(c)) return ws_step(f, c);
    f->ws = 0;
    if (c == ']' && f->a >= n->min) { s->depth--; return R_OK; }
    if (f->sub == A_OPEN) {
        if (n->max == 0) return R_DEAD;
        f->sub = A_AFTER;
        f->a = 1;
        return push(s, n->lo) ? R_DEAD : R_AGAIN;
    }
    if (c != ',' || (n->max >= 0 && f->a >= n->max)) return R_DEAD;
    f->a++;
    return push(s, n->lo) ? R_DEAD : R_OK;
}

static int step_str(const jgram *g, jg_state *s, jg_frame *f, uint8_t c) {
    const int64_t mn = f->node >= 0 ? g->nodes[f->node].min : 0, mx = f->node >= 0 ? g->nodes[f->node].max : -1;
    switch (f->sub) {
    case S_NORM:
        if (c == '"') {
            if (f->a < mn) return R_DEAD;
            s->depth--;
            return R_OK;
        }
        if (c < 0x20 || (mx >= 0 && f->a >= mx)) return R_DEAD;
        /* counted only when a length is bounded: an unbounded string's states
         * repeat, so its masks come from the cache */
        if (mn > 0 || mx >= 0) f->a++;
        if (c == '\\') f->sub = S_ESC;
        else if (c < 0x80) f->sub = S_NORM;
        else if (c >= 0xC2 && c <= 0xDF) f->sub = S_C1;
        else if (c == 0xE0) f->sub = S_E0;
        else if (c == 0xED) f->sub = S_ED;
        else if (c >= 0xE1 && c <= 0xEF) f->sub = S_C2;
        else if (c == 0xF0) f->sub = S_F0;
        else if (c >= 0xF1 && c <= 0xF3) f->sub = S_C3;
        else if (c == 0xF4) f->sub = S_F4;
        else return R_DEAD;
        return R_OK;
    case S_ESC:
        if (c == 'u') { f->sub = S_U1; return R_OK; }
        if (!strchr("\"\\/bfnrt", c) || !c) return R_DEAD;
        f->sub = S_NORM;
        return R_OK;
    case S_U1: if (!is_hex(c)) return R_DEAD; f->sub = (c | 32) == 'd' ? S_U2D : S_U2; return R_OK;
    case S_U2D: if (c < '0' || c > '7') return R_DEAD; f->sub = S_U3; return R_OK;
    case S_U2: if (!is_hex(c)) return R_DEAD; f->sub = S_U3; return R_OK;
    case S_U3: if (!is_hex(c)) return R_DEAD; f->sub = S_U4; return R_OK;
    case S_U4: if (!is_hex(c)) return R_DEAD; f->sub = S_NORM; return R_OK;
    case S_C1: case S_C2: case S_C3:
        if (c < 0x80 || c > 0xBF) return R_DEAD;
        f->sub = f->sub == S_C1 ? S_NORM : f->sub == S_C2 ? S_C1 : S_C2;
        return R_OK;
    case S_E0: if (c < 0xA0 || c > 0xBF) return R_DEAD; f->sub = S_C1; return R_OK;
    case S_ED: if (c < 0x80 || c > 0x9F) return R_DEAD; f->sub = S_C1; return R_OK;
    case S_F0: if (c < 0x90 || c > 0xBF) return R_DEAD; f->sub = S_C2; return R_OK;
    case S_F4: if (c < 0x80 || c > 0x8F) return R_DEAD; f->sub = S_C2; return R_OK;
    }
    return R_DEAD;
}

/* A pattern string: the content bytes run the node's DFA, escapes by the byte
 * they stand for (no \u: jregex.h); '"' closes in an accepting state. The DFA
 * is trimmed, so every live state can still finish: no dead end. */
static int step_pat(const jgram *g, jg_state *s, jg_frame *f, uint8_t c) {
    const jg_node *n = &g->nodes[f->node];
    const uint16_t *cls = g->pat + n->lo, *row = cls + 256 + (size_t)f->b * (size_t)(n->extra + 1);
    if (f->sub == P_ESC) {
        const int d = jregex_unescape(c);
        if (d < 0 || row[cls[d]] == JRE_DEAD) return R_DEAD;
        f->b = row[cls[d]];
        f->sub = P_NORM;
        return R_OK;
    }
    if (c == '"') {
        if (!row[n->extra]) return R_DEAD;
        s->depth--;
        return R_OK;
    }
    if (c == '\\') {
        static const uint8_t esc[] = "btnfr\"\\/";
        for (size_t i = 0; i + 1 < sizeof esc; i++)
            if (row[cls[jregex_unescape(esc[i])]] != JRE_DEAD) { f->sub = P_ESC; return R_OK; }
        return R_DEAD;
    }
    if (c < 0x20 || row[cls[c]] == JRE_DEAD) return R_DEAD;
    f->b = row[cls[c]];
    return R_OK;
}

/* The DFA row of a pattern or range frame's state. */
static const uint16_t *dfa_row(const jgram *g, const jg_frame *f, const uint16_t **cls) {
    const jg_node *n = &g->nodes[f->node];
    *cls = g->pat + n->lo;
    return *cls + 256 + (size_t)f->b * (size_t)(n->extra + 1);
}

/* An integer in a range: digits while the DFA takes them; a byte it refuses
 * ends the number (handed to the parent) when the DFA accepts. Delimiters never
 * continue a number, so this stays deterministic. */
static int step_intr(const jgram *g, jg_state *s, jg_frame *f, uint8_t c) {
    const uint16_t *cls, *row = dfa_row(g, f, &cls);
    if (row[cls[c]] != JRE_DEAD) { f->b = row[cls[c]]; return R_OK; }
    if (!row[g->nodes[f->node].extra]) return R_DEAD;
    s->depth--;
    return R_AGAIN;
}

static int num_accepting(const jg_frame *f) {
    return f->sub == N_ZERO || f->sub == N_INT || f->sub == N_FRAC || f->sub == N_EXP;
}

/* a = digits of the current part */
static int step_num(const jgram *g, jg_state *s, jg_frame *f, uint8_t c) {
    const int integer = g->nodes[f->node].kind == JG_INT;
    const uint8_t sub = f->sub;
    if (sub == N_START && c == '-') { f->sub = N_MINUS; return R_OK; }
    if (sub == N_START || sub == N_MINUS) {
        if (!is_digit(c)) return R_DEAD;
        f->sub = c == '0' ? N_ZERO : N_INT;
        f->a = 1;
        return R_OK;
    }
    if (is_digit(c)) {
        if (sub == N_INT && f->a < MAX_INT_DIGITS) { f->a++; return R_OK; }
        if ((sub == N_DOT || sub == N_FRAC) && f->a < MAX_FRAC_DIGITS) { f->sub = N_FRAC; f->a = sub == N_DOT ? 1 : f->a + 1; return R_OK; }
        if ((sub == N_E || sub == N_ESIGN || sub == N_EXP) && f->a < MAX_EXP_DIGITS) {
            f->a = sub == N_EXP ? f->a + 1 : 1;
            f->sub = N_EXP;
            return R_OK;
        }
        if (sub == N_INT || sub == N_FRAC || sub == N_EXP || sub == N_ZERO) return R_DEAD; /* too many digits, or 0 then a digit */
        return R_DEAD;
    }
    if (!integer && c == '.' && (sub == N_ZERO || sub == N_INT)) { f->sub = N_DOT; f->a = 0; return R_OK; }
    if (!integer && (c == 'e' || c == 'E') && (sub == N_ZERO || sub == N_INT || sub == N_FRAC)) { f->sub = N_E; f->a = 0; return R_OK; }
    if (sub == N_E && (c == '+' || c == '-')) { f->sub = N_ESIGN; return R_OK; }
    if (!num_accepting(f)) return R_DEAD;
    s->depth--;
    return R_AGAIN;
}

/* The lowest literal of the node from a that agrees with literal a's first k
 * bytes and has c next (c < 0: that ends there), or -1. */
static int32_t lit_next(const jgram *g, const jg_node *n, int32_t a, int32_t k, int c) {
    const jg_lit *l0 = &g->lits[a];
    for (int32_t j = a; j < n->lo + n->n; j++) {
        const jg_lit *l = &g->lits[j];
        if (c < 0 ? l->len != k : (l->len <= k || g->bytes[l->off + k] != c)) continue;
        if (!memcmp(g->bytes + l->off, g->bytes + l0->off, (size_t)k)) return j;
    }
    return -1;
}

static int step_lit(const jgram *g, jg_state *s, jg_frame *f, uint8_t c) {
    const jg_node *n = &g->nodes[f->node];
    const int32_t j = lit_next(g, n, f->a, f->b, c);
    if (j >= 0) { f->a = j; f->b++; return R_OK; }
    if (lit_next(g, n, f->a, f->b, -1) < 0) return R_DEAD;
    s->depth--;
    return R_AGAIN;
}


/* ---- composition ---- */

/* The next child, the last in place of the sequence (so chains of sequences
 * keep the stack flat). */
static int step_seq(const jgram *g, jg_state *s, jg_frame *f) {
    const jg_node *n = &g->nodes[f->node];
    if (f->a >= n->n) { s->depth--; return R_AGAIN; }
    const int32_t kid = g->alts[n->lo + f->a];
    if (f->a == n->n - 1) { *f = (jg_frame){.node = kid, .kind = F_VAL}; return R_AGAIN; }
    f->a++;
    return push(s, kid) ? R_DEAD : R_AGAIN;
}

/* a: the lowest key agreeing with the b bytes so far; a complete key (keys are
 * prefix-free) hands over to its node, in place of this frame. */
static int step_keyed(const jgram *g, jg_state *s, jg_frame *f, uint8_t c) {
    const jg_node *n = &g->nodes[f->node];
    const jg_prop *P = g->props + n->lo, *p0 = &P[f->a];
    const int32_t k = f->b;
    for (int32_t j = f->a; j < n->n; j++) {
        const jg_prop *p = &P[j];
        if (p->len <= k || g->bytes[p->off + k] != c || memcmp(g->bytes + p->off, g->bytes + p0->off, (size_t)k)) continue;
        f->a = j;
        f->b = k + 1;
        if (k + 1 == p->len) {
            if (p->node < 0) s->depth--;
            else *f = (jg_frame){.node = p->node, .kind = F_VAL};
        }
        return R_OK;
    }
    return R_DEAD;
}

/* Raw text: the string machine's UTF-8 and length rules, quotes and
 * backslashes plain, tab/LF/CR allowed; any other byte ends it. */
static int step_raw(const jgram *g, jg_state *s, jg_frame *f, uint8_t c) {
    if (f->sub != S_NORM) return step_str(g, s, f, c);
    const jg_node *n = &g->nodes[f->node];
    const int plain = c == '"' || c == '\\' || c == '\t' || c == '\n' || c == '\r';
    if (c == JG_SPECIAL_LEAD || (c < 0x20 && !plain)) {
        if (f->a < n->min) return R_DEAD;
        s->depth--;
        return R_AGAIN;
    }
    if (!plain) return step_str(g, s, f, c);
    if (n->max >= 0 && f->a >= n->max) return R_DEAD;
    if (n->min > 0 || n->max >= 0) f->a++;
    return R_OK;
}

int jgram_feed(const jgram *g, jg_state *s, uint8_t c) {
    for (int guard = 0; guard < 4 * JG_MAX_DEPTH + 8; guard++) {
        if (s->depth == 0) return -1;
        jg_frame *f = &s->f[s->depth - 1];
        int r = R_DEAD;
        switch (f->kind) {
        case F_VAL: r = step_val(g, f, c); break;
        case F_OBJ: r = step_obj(g, s, f, c); break;
        case F_ARR: r = step_arr(g, s, f, c); break;
        case F_STR: r = step_str(g, s, f, c); break;
        case F_NUM: r = step_num(g, s, f, c); break;
        case F_LIT: r = step_lit(g, s, f, c); break;
        case F_SEQ: r = step_seq(g, s, f); break;
        case F_KEYED: r = step_keyed(g, s, f, c); break;
        case F_RAW: r = step_raw(g, s, f, c); break;
        case F_PAT: r = step_pat(g, s, f, c); break;
        case F_INTR: r = step_intr(g, s, f, c); break;
        }
        if (r == R_OK) return 0;
        if (r == R_DEAD) return -1;
    }
    return -1;
}

void jgram_start(const jgram *g, jg_state *s) {
    s->depth = 1;
    s->pad = 0;
    s->f[0] = (jg_frame){.node = g->root, .kind = F_VAL};
}

int jgram_can_end(const jgram *g, const jg_state *s) {
    if (s->depth == 0) return 1;
    if (s->depth != 1) return 0;
    const jg_frame *f = &s->f[0];
    if (f->kind == F_NUM) return num_accepting(f);
    if (f->kind == F_INTR) { const uint16_t *cls, *row = dfa_row(g, f, &cls); return row[g->nodes[f->node].extra] != 0; }
    if (f->kind == F_LIT) return lit_next(g, &g->nodes[f->node], f->a, f->b, -1) >= 0;
    return 0;
}

int jgram_check(const jgram *g, const uint8_t *p, size_t n) {
    jg_state s;
    jgram_start(g, &s);
    for (size_t i = 0; i < n; i++)
        if (jgram_feed(g, &s, p[i])) return -1;
    return jgram_can_end(g, &s) ? 1 : 0;
}


/* ===== building composed grammars ===== */

const uint8_t jgram_special_mark[1] = {JG_SPECIAL_LEAD};

void jgram_special_bytes(int32_t id, uint8_t out[JG_SPECIAL_LEN]) {
    out[0] = JG_SPECIAL_LEAD;
    out[1] = (uint8_t)(id >> 16);
    out[2] = (uint8_t)(id >> 8);
    out[3] = (uint8_t)id;
}

jgram *jgram_new(void) {
    jgram *g = base_calloc(1, sizeof *g, MEM_MISC);
    if (g) g->root = -1;
    return g;
}

/* Room for need more elements of *p (cap *cap, elem bytes each): 0 or -1. */
static int room(void **p, int64_t *cap, int64_t used, int64_t need, size_t elem) {
    if (used + need <= *cap) return 0;
    int64_t c = *cap ? *cap : 16;
    while (c < used + need) c *= 2;
    if (c > INT32_MAX / 2) return -1;
    void *q = base_realloc(*p, (size_t)c * elem, MEM_MISC);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

#define ROOM(arr, n_, cap_, need) \
    (tmp = (cap_), rc_ = room((void **)&(arr), &tmp, (n_), (need), sizeof *(arr)), (cap_) = (int32_t)tmp, rc_)

static int32_t node_new(jgram *g, int32_t kind) {
    int64_t tmp;
    int rc_;
    if (ROOM(g->nodes, g->n_nodes, g->cap_nodes, 1)) return -1;
    g->nodes[g->n_nodes] = (jg_node){.kind = kind, .extra = -1, .max = -1};
    return g->n_nodes++;
}

static int64_t bytes_add(jgram *g, const uint8_t *p, size_t n) {
    if (g->n_bytes + (int64_t)n > INT32_MAX / 2) return -1;
    if (room((void **)&g->bytes, &g->cap_bytes, g->n_bytes, (int64_t)n, 1)) return -1;
    if (n) memcpy(g->bytes + g->n_bytes, p, n); /* p may be NULL when n is 0 */
    g->n_bytes += (int64_t)n;
    return g->n_bytes - (int64_t)n;
}

int32_t jgram_append(jgram *g, const jgram *src) {
    int64_t tmp;
    int rc_;
    if (ROOM(g->nodes, g->n_nodes, g->cap_nodes, src->n_nodes) || ROOM(g->props, g->n_props, g->cap_props, src->n_props) ||
        ROOM(g->lits, g->n_lits, g->cap_lits, src->n_lits) || ROOM(g->alts, g->n_alts, g->cap_alts, src->n_alts))
        return -1;
    const int32_t dn = g->n_nodes, dp = g->n_props, dl = g->n_lits, da = g->n_alts;
    const int64_t db = bytes_add(g, src->bytes, (size_t)src->n_bytes);
    if (db < 0 || src->root < 0) return -1;
    /* pattern and integer-range DFA tables (JG_PAT, JG_INTR nodes index them) */
    const int64_t dt = g->n_pat;
    if (src->n_pat) {
        if (g->n_pat + src->n_pat > INT32_MAX || room((void **)&g->pat, &g->cap_pat, g->n_pat, src->n_pat, sizeof *g->pat))
            return -1;
        memcpy(g->pat + g->n_pat, src->pat, (size_t)src->n_pat * sizeof *g->pat);
        g->n_pat += src->n_pat;
    }
    for (int32_t i = 0; i < src->n_nodes; i++) {
        jg_node n = src->nodes[i];
        switch (n.kind) {
        case JG_OBJ: case JG_KEYED: n.lo += dp; if (n.extra >= 0) n.extra += dn; break;
        case JG_ARR: n.lo += dn; break;
        case JG_LIT: n.lo += dl; break;
        case JG_CHOICE: case JG_SEQ: n.lo += da; break;
        case JG_ALIAS: n.extra += dn; break;
        case JG_PAT: case JG_INTR: n.lo += (int32_t)dt; break;
        }
        g->nodes[g->n_nodes++] = n;
    }
    for (int32_t i = 0; i < src->n_props; i++) {
        jg_prop p = src->props[i];
        p.off += (int32_t)db;
        if (p.node >= 0) p.node += dn;
        g->props[g->n_props++] = p;
    }
    for (int32_t i = 0; i < src->n_lits; i++) g->lits[g->n_lits++] = (jg_lit){src->lits[i].off + (int32_t)db, src->lits[i].len};
    for (int32_t i = 0; i < src->n_alts; i++) g->alts[g->n_alts++] = src->alts[i] + dn;
    return src->root + dn;
}

int32_t jgram_add_lits(jgram *g, const uint8_t *const *lits, const size_t *lens, int n) {
    int64_t tmp;
    int rc_;
    if (n < 1 || ROOM(g->lits, g->n_lits, g->cap_lits, n)) return -1;
    const int32_t lo = g->n_lits;
    for (int i = 0; i < n; i++) {
        const int64_t off = lens[i] ? bytes_add(g, lits[i], lens[i]) : -1;
        if (off < 0) { g->n_lits = lo; return -1; }
        g->lits[g->n_lits++] = (jg_lit){(int32_t)off, (int32_t)lens[i]};
    }
    const int32_t id = node_new(g, JG_LIT);
    if (id < 0) return -1;
    g->nodes[id].extra = 1; /* exact */
    g->nodes[id].lo = lo;
    g->nodes[id].n = n;
    return id;
}

int32_t jgram_add_lit(jgram *g, const uint8_t *p, size_t n) { return jgram_add_lits(g, &p, &n, 1); }

int32_t jgram_add_seq(jgram *g, const int32_t *kids, int n) {
    int64_t tmp;
    int rc_;
    if (n < 1 || ROOM(g->alts, g->n_alts, g->cap_alts, n)) return -1;
    for (int i = 0; i < n; i++)
        if (kids[i] < 0 || kids[i] >= g->n_nodes) return -1;
    const int32_t id = node_new(g, JG_SEQ);
    if (id < 0) return -1;
    g->nodes[id].lo = g->n_alts;
    g->nodes[id].n = n;
    for (int i = 0; i < n; i++) g->alts[g->n_alts++] = kids[i];
    return id;
}

int32_t jgram_add_keyed(jgram *g, const uint8_t *const *keys, const size_t *lens, const int32_t *nodes, int n) {
    int64_t tmp;
    int rc_;
    if (n < 1 || ROOM(g->props, g->n_props, g->cap_props, n)) return -1;
    for (int i = 0; i < n; i++) {
        if (!lens[i] || nodes[i] >= g->n_nodes) return -1;
        for (int j = 0; j < i; j++) /* prefix-free: the bytes decide */
            if (!memcmp(keys[i], keys[j], lens[i] < lens[j] ? lens[i] : lens[j])) return -1;
    }
    const int32_t lo = g->n_props;
    for (int i = 0; i < n; i++) {
        const int64_t off = bytes_add(g, keys[i], lens[i]);
        if (off < 0) { g->n_props = lo; return -1; }
        g->props[g->n_props++] = (jg_prop){(int32_t)off, (int32_t)lens[i], nodes[i], n};
    }
    const int32_t id = node_new(g, JG_KEYED);
    if (id < 0) return -1;
    g->nodes[id].lo = lo;
    g->nodes[id].n = n;
    return id;
}

int32_t jgram_add_raw(jgram *g, int64_t min, int64_t max) {
    const int32_t id = node_new(g, JG_RAW);
    if (id < 0) return -1;
    g->nodes[id].min = min;
    g->nodes[id].max = max;
    return id;
}

/* ===== the vocabulary trie =====
 *
 * Nodes in depth-first order (the order of the ids' byte strings sorted), each
 * with its byte, its depth and the index just past its subtree, so a walk drops
 * a subtree with one jump. ids[tok[i] .. tok[i+1]) end at node i.
 *
 * The string fast path: inside a string, most of a vocabulary is "plain"
 * content (well-formed UTF-8 from a character boundary to one, no quote, no
 * backslash, no control byte), and whether such an id continues the document
 * depends only on its code points against the string's remaining maxLength. So
 * the vocabulary keeps, per bound k <= PLAIN_CAP, the bitset of plain ids of at
 * most k code points, and a second trie of the other ids (those with quotes,
 * escapes, UTF-8 fragments, or more than PLAIN_CAP code points), the only part
 * walked there. */
#define PLAIN_CAP 32

typedef struct jg_trie {
    uint32_t n_nodes, max_depth;
    uint8_t *byte;
    uint16_t *depth;
    uint32_t *skip;
    uint32_t *tok;   /* (n_nodes + 1) */
    int32_t *ids;
} jg_trie;

struct jg_vocab {
    int32_t n_vocab;
    jg_trie all;         /* every text id */
    jg_trie rest;        /* the ids that are not plain string content */
    size_t words;        /* bitset words */
    uint64_t *plain;     /* (PLAIN_CAP + 1, words) row k: plain ids of at most k code points */
    int64_t n_plain[PLAIN_CAP + 1];
    const uint8_t **tb;  /* (n_vocab) each id's bytes (the tokenizer's, or in sp), NULL: never generated */
    uint8_t *sp;         /* the special tokens' JG_SPECIAL_LEN bytes each */
    uint32_t *tl;        /* (n_vocab) their length */
    uint64_t bytes;
};

typedef struct { const uint8_t *p; size_t n; int32_t id; } vent;

static int vent_cmp(const void *a, const void *b) {
    const vent *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, m);
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static void trie_free(jg_trie *t) {
    base_free(t->byte);
    base_free(t->depth);
    base_free(t->skip);
    base_free(t->tok);
    base_free(t->ids);
}

void jgram_vocab_free(jg_vocab *v) {
    if (!v) return;
    trie_free(&v->all);
    trie_free(&v->rest);
    base_free(v->plain);
    base_free(v->sp);
    base_free(v->tb);
    base_free(v->tl);
    base_free(v);
}

uint64_t jgram_vocab_bytes(const jg_vocab *v) { return v ? v->bytes : 0; }

/* The trie of e[0, ne) (sorted), total bytes long; its size added to *bytes. 0 or -1. */
static int trie_build(jg_trie *t, const vent *e, size_t ne, size_t total, uint64_t *bytes) {
    t->byte = base_alloc(total + 1, MEM_TOK);
    t->depth = base_alloc((total + 1) * sizeof *t->depth, MEM_TOK);
    t->skip = base_alloc((total + 1) * sizeof *t->skip, MEM_TOK);
    t->tok = base_calloc(total + 2, sizeof *t->tok, MEM_TOK);
    t->ids = base_alloc((ne + 1) * sizeof *t->ids, MEM_TOK);
    uint32_t *path = base_alloc(65536 * sizeof *path, MEM_TOK); /* open node at each depth */
    if (!t->byte || !t->depth || !t->skip || !t->tok || !t->ids || !path) { base_free(path); return -1; }
    uint32_t nn = 0, open = 0; /* nodes; depth of the open path */
    size_t prev_n = 0;
    const uint8_t *prev = NULL;
    for (size_t i = 0; i < ne; i++) {
        size_t l = 0;
        while (prev && l < prev_n && l < e[i].n && prev[l] == e[i].p[l]) l++;
        while (open > l) t->skip[path[--open]] = nn; /* close nodes off the shared prefix */
        for (size_t d = l; d < e[i].n; d++) {
            t->byte[nn] = e[i].p[d];
            t->depth[nn] = (uint16_t)(d + 1);
            path[open++] = nn;
            t->tok[nn + 1] = t->tok[nn];
            nn++;
        }
        /* e[i] ends at the last open node: ids are appended in node order */
        t->ids[t->tok[nn]++] = e[i].id;
        if (e[i].n > t->max_depth) t->max_depth = (uint32_t)e[i].n;
        prev = e[i].p;
        prev_n = e[i].n;
    }
    while (open > 0) t->skip[path[--open]] = nn;
    base_free(path);
    t->n_nodes = nn;
    *bytes += total * (1 + sizeof *t->depth + sizeof *t->skip + sizeof *t->tok) + ne * sizeof *t->ids;
    return 0;
}

static int step_str(const jgram *g, jg_state *s, jg_frame *f, uint8_t c);

/* The code points of p when it is plain string content (see above) of at most
 * PLAIN_CAP of them, else -1: the string machine itself decides, on an
 * unbounded string. */
static int plain_cps(const uint8_t *p, size_t n) {
    jg_state s = {.depth = 1};
    s.f[0] = (jg_frame){.node = -1, .kind = F_STR, .sub = S_NORM};
    int cps = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '"' || p[i] == '\\' || step_str(NULL, &s, &s.f[0], p[i]) != R_OK) return -1;
        cps += (p[i] & 0xC0) != 0x80; /* a character starts */
        if (cps > PLAIN_CAP) return -1;
    }
    return s.f[0].sub == S_NORM ? cps : -1;
}

int jgram_vocab_build(jg_vocab **out, int32_t n_vocab, const uint8_t *(*bytes)(void *ud, int32_t id, size_t *len), void *ud,
                      char *err, size_t errlen) {
    *out = NULL;
    const size_t nv = (size_t)(n_vocab > 0 ? n_vocab : 1);
    vent *e = base_alloc(nv * sizeof *e, MEM_TOK), *r = base_alloc(nv * sizeof *r, MEM_TOK);
    jg_vocab *v = base_calloc(1, sizeof *v, MEM_TOK);
    int rc = 0;
    if (!e || !r || !v) goto oom;
    v->n_vocab = n_vocab;
    v->words = (nv + 63) / 64;
    v->plain = base_calloc((PLAIN_CAP + 1) * v->words, sizeof *v->plain, MEM_TOK);
    v->tb = base_calloc(nv, sizeof *v->tb, MEM_TOK);
    v->tl = base_calloc(nv, sizeof *v->tl, MEM_TOK);
    if (!v->plain || !v->tb || !v->tl) goto oom;
    size_t ne = 0, nr = 0, total = 0, rtotal = 0, n_sp = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        size_t len = 0;
        n_sp += bytes(ud, id, &len) == jgram_special_mark;
    }
    if (n_sp && !(v->sp = base_alloc(n_sp * JG_SPECIAL_LEN, MEM_TOK))) goto oom;
    n_sp = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        size_t len = 0;
        const uint8_t *p = bytes(ud, id, &len);
        const int sp = p == jgram_special_mark;
        if (sp) { /* its own bytes: see jgram_special_bytes */
            uint8_t *q = v->sp + n_sp++ * JG_SPECIAL_LEN;
            jgram_special_bytes(id, q);
            p = q;
            len = JG_SPECIAL_LEN;
        }
        /* text with the special lead byte (a byte-level BPE's raw 0xFF token) is
         * never UTF-8, so no grammar takes it; left out, it cannot spell a special */
        if (!p || len == 0 || len > 65535 || (!sp && memchr(p, JG_SPECIAL_LEAD, len)))
            continue;
        e[ne++] = (vent){p, len, id};
        total += len;
        v->tb[id] = p;
        v->tl[id] = (uint32_t)len;
        const int cps = plain_cps(p, len);
        if (cps < 0) {
            r[nr++] = (vent){p, len, id};
            rtotal += len;
            continue;
        }
        for (int k = cps; k <= PLAIN_CAP; k++) { /* an id of cps code points fits every bound from cps up */
            v->plain[(size_t)k * v->words + ((size_t)id >> 6)] |= 1ULL << (id & 63);
            v->n_plain[k]++;
        }
    }
    qsort(e, ne, sizeof *e, vent_cmp);
    qsort(r, nr, sizeof *r, vent_cmp);
    v->bytes = (PLAIN_CAP + 1) * v->words * sizeof *v->plain + (uint64_t)nv * (sizeof *v->tb + sizeof *v->tl) + n_sp * JG_SPECIAL_LEN;
    if (trie_build(&v->all, e, ne, total, &v->bytes) || trie_build(&v->rest, r, nr, rtotal, &v->bytes)) goto oom;
    goto done;
oom:
    rc = base_fail(err, errlen, STRATA_ENOMEM, "grammar: out of memory for the vocabulary trie");
done:
    base_free(e);
    base_free(r);
    if (rc) { jgram_vocab_free(v); return rc; }
    *out = v;
    return 0;
}

/* ===== matchers ===== */

#define CACHE_SLOTS 16

struct jg_matcher {
    const jgram *g;
    const jg_vocab *v;
    jg_state st;
    jg_state *walk;           /* (max_depth + 1) the walk's state at each trie depth */
    int32_t end[16];
    int n_end;
    size_t words;             /* bitset words */
    uint64_t *cmask;          /* (CACHE_SLOTS, words) */
    jg_state *ckey;           /* (CACHE_SLOTS) */
    uint64_t chash[CACHE_SLOTS], cused[CACHE_SLOTS];
    int64_t cnt[CACHE_SLOTS];
    int n_cache;
    uint64_t *emask;          /* (words) the end ids alone */
    int forced;               /* the document cannot go on: an end id ends it */
    int fast;                 /* the string fast path (jgram_matcher_set_fast) */
    uint64_t clock;
    int64_t n_masks, n_cached;
};

static size_t state_len(const jg_state *s) { return offsetof(jg_state, f) + (size_t)s->depth * sizeof(jg_frame); }
static void state_copy(jg_state *d, const jg_state *s) { memcpy(d, s, state_len(s)); }

int jgram_matcher_create(jg_matcher **out, const jgram *g, const jg_vocab *v, const int32_t *end_ids, int n_end, char *err,
                         size_t errlen) {
    *out = NULL;
    if (n_end < 1 || n_end > 16) return base_fail(err, errlen, STRATA_EINVAL, "grammar: 1 to 16 end ids are needed, not %d", n_end);
    jg_matcher *m = base_calloc(1, sizeof *m, MEM_STATE);
    if (!m) return base_fail(err, errlen, STRATA_ENOMEM, "grammar: out of memory");
    m->g = g;
    m->v = v;
    m->n_end = n_end;
    memcpy(m->end, end_ids, (size_t)n_end * sizeof *end_ids);
    for (int k = 0; k < n_end; k++)
        if (end_ids[k] < 0 || end_ids[k] >= v->n_vocab) {
            base_free(m);
            return base_fail(err, errlen, STRATA_EINVAL, "grammar: end id %d outside the vocabulary", end_ids[k]);
        }
    m->words = ((size_t)v->n_vocab + 63) / 64;
    m->walk = base_alloc((v->all.max_depth + 1) * sizeof *m->walk, MEM_STATE);
    m->fast = 1;
    m->cmask = base_alloc(CACHE_SLOTS * m->words * sizeof *m->cmask, MEM_STATE);
    m->ckey = base_alloc(CACHE_SLOTS * sizeof *m->ckey, MEM_STATE);
    m->emask = base_calloc(m->words, sizeof *m->emask, MEM_STATE);
    if (!m->walk || !m->cmask || !m->ckey || !m->emask) {
        jgram_matcher_free(m);
        return base_fail(err, errlen, STRATA_ENOMEM, "grammar: out of memory");
    }
    for (int k = 0; k < n_end; k++) m->emask[end_ids[k] >> 6] |= 1ULL << (end_ids[k] & 63);
    jgram_start(g, &m->st);
    *out = m;
    return 0;
}

void jgram_matcher_free(jg_matcher *m) {
    if (!m) return;
    base_free(m->walk);
    base_free(m->cmask);
    base_free(m->ckey);
    base_free(m->emask);
    base_free(m);
}

/* The walk: the ids of every trie node whose path the machine accepts from
 * m->st, added to mask; their number. */
static int64_t walk_trie(jg_matcher *m, const jg_trie *t, uint64_t *mask) {
    int64_t n = 0;
    state_copy(&m->walk[0], &m->st);
    for (uint32_t i = 0; i < t->n_nodes;) {
        const uint32_t d = t->depth[i];
        jg_state *cs = &m->walk[d];
        state_copy(cs, &m->walk[d - 1]);
        if (jgram_feed(m->g, cs, t->byte[i])) { i = t->skip[i]; continue; }
        for (uint32_t k = t->tok[i]; k < t->tok[i + 1]; k++) {
            const int32_t id = t->ids[k];
            mask[id >> 6] |= 1ULL << (id & 63);
            n++;
        }
        i++;
    }
    return n;
}

/* The mask of m->st into mask: inside a string, the plain ids that fit its
 * remaining length (one row copied) and a walk of the rest; elsewhere (and in
 * an escape, where plain bytes such as "n" or hex digits continue it) a walk of
 * the whole trie. The two agree id for id (tests/t_gram.c gram_mask). */
static int64_t walk_mask(jg_matcher *m, uint64_t *mask) {
    const jg_vocab *v = m->v;
    const jg_frame *f = &m->st.f[m->st.depth > 0 ? m->st.depth - 1 : 0];
    int64_t n = 0;
    int fast = m->fast && m->st.depth > 0 && f->kind == F_STR && f->sub != S_ESC && (f->sub < S_U1 || f->sub > S_U4);
    if (fast && f->sub == S_NORM) {
        /* plain ids of at most (maxLength - characters so far) code points */
        const int64_t mx = f->node >= 0 ? m->g->nodes[f->node].max : -1;
        const int64_t k = mx < 0 || mx - f->a > PLAIN_CAP ? PLAIN_CAP : mx - f->a;
        memcpy(mask, v->plain + (size_t)k * v->words, m->words * sizeof *mask);
        n = v->n_plain[k];
    } else {
        /* mid-character no plain id continues (each starts at a character) */
        memset(mask, 0, m->words * sizeof *mask);
    }
    n += walk_trie(m, fast ? &v->rest : &v->all, mask);
    if (jgram_can_end(m->g, &m->st))
        for (int k = 0; k < m->n_end; k++) {
            const int32_t id = m->end[k];
            if (id < 0 || id >= v->n_vocab || (mask[id >> 6] >> (id & 63) & 1)) continue;
            mask[id >> 6] |= 1ULL << (id & 63);
            n++;
        }
    return n;
}

const uint64_t *jgram_matcher_mask(jg_matcher *m, int64_t *n_allowed) {
    const size_t len = state_len(&m->st);
    const uint64_t h = base_fnv1a(&m->st, len, BASE_FNV_INIT);
    m->n_masks++;
    m->clock++;
    for (int i = 0; i < m->n_cache; i++)
        if (m->chash[i] == h && state_len(&m->ckey[i]) == len && !memcmp(&m->ckey[i], &m->st, len)) {
            m->cused[i] = m->clock;
            m->n_cached++;
            *n_allowed = m->cnt[i];
            return m->cmask + (size_t)i * m->words;
        }
    int slot = 0;
    if (m->n_cache < CACHE_SLOTS) slot = m->n_cache++;
    else
        for (int i = 1; i < CACHE_SLOTS; i++)
            if (m->cused[i] < m->cused[slot]) slot = i;
    uint64_t *mask = m->cmask + (size_t)slot * m->words;
    m->cnt[slot] = walk_mask(m, mask);
    state_copy(&m->ckey[slot], &m->st);
    m->chash[slot] = h;
    m->cused[slot] = m->clock;
    *n_allowed = m->cnt[slot];
    return mask;
}

int jgram_matcher_accept(jg_matcher *m, int32_t id) {
    for (int k = 0; k < m->n_end; k++)
        if (m->end[k] == id) {
            if (!m->forced && !jgram_can_end(m->g, &m->st)) return -1;
            m->st.depth = 0;
            return 0;
        }
    const jg_vocab *v = m->v;
    if (id < 0 || id >= v->n_vocab || !v->tb[id]) return -1;
    jg_state s;
    state_copy(&s, &m->st);
    for (uint32_t i = 0; i < v->tl[id]; i++)
        if (jgram_feed(m->g, &s, v->tb[id][i])) return -1;
    state_copy(&m->st, &s);
    return 0;
}

void jgram_matcher_end_only(jg_matcher *m, const uint64_t **mask) {
    m->forced = 1;
    *mask = m->emask;
}

void jgram_matcher_set_fast(jg_matcher *m, int on) {
    m->fast = on;
    m->n_cache = 0; /* masks of the other path are not reused: each is computed anew */
}

void jgram_matcher_stats(const jg_matcher *m, int64_t *masks, int64_t *cached) {
    *masks = m->n_masks;
    *cached = m->n_cached;
}
