/*
 * tools.c: tool calls in the chat formats (see tools.h): the one table per
 * format, the template expander the renderer uses, and the streaming parser
 * that matches the same templates in generated text.
 */
#include "tools.h"

#include <jansson.h>
#include <string.h>
#include "base.h"
#include "jsonx.h"

/* ===== the table ===== */

enum { IDX_NONE = 0, IDX_MESSAGE = 1, IDX_GLOBAL = 2 }; /* how %I counts */

typedef struct tool_fmt {
    const char *declare;     /* %J: the tools as a compact JSON array */
    const char *choice[4];   /* per CHAT_TOOLS_*: the one-shot option (NULL: none) */
    const char *sec_open, *sec_close; /* around the calls of one turn */
    const char *call_head;   /* %N %I; the arguments follow */
    const char *call_tail;
    const char *arg_head;    /* typed arguments (%K %T), NULL: the arguments are JSON text */
    const char *arg_tail;
    const char *json_head, *json_tail; /* typed formats: arguments that cannot be typed */
    const char *res_open, *result, *res_close; /* %N %I %C; open/close around consecutive results */
    int index;               /* IDX_* */
    int index_base;          /* the first call's %I */
} tool_fmt;

#define XTML_OPTION(type, text) \
    "<|open|>message%| role=\"system\" type=\"" type "\"<|sep|>" text "<|close|>message<|sep|><|end_of_msg|>"

static const tool_fmt k_fmts[3] = {
    [CHAT_FMT_XTML] = {
        .declare = XTML_OPTION("tool-declare", "%J"),
        .choice = {NULL, XTML_OPTION("tool-choice", "Do not call any tool in this response."),
                   XTML_OPTION("tool-choice", "Call one or more tools in this response."),
                   XTML_OPTION("tool-choice", "Call the tool `%N` in this response.")},
        .sec_open = "<|open|>tools<|sep|>",
        .sec_close = "<|close|>tools<|sep|>",
        .call_head = "<|open|>call%| tool=\"%N\" index=\"%I\"<|sep|>",
        .call_tail = "<|close|>call<|sep|>",
        .arg_head = "<|open|>argument%| key=\"%K\" type=\"%T\"<|sep|>",
        .arg_tail = "<|close|>argument<|sep|>",
        .json_head = "<|open|>arguments%| type=\"json\"<|sep|>",
        .json_tail = "<|close|>arguments<|sep|>",
        .res_open = "",
        .result = "<|open|>message%| role=\"tool\" tool=\"%N\" index=\"%I\"<|sep|>%C<|close|>message<|sep|><|end_of_msg|>",
        .res_close = "",
        .index = IDX_MESSAGE,
        .index_base = 1,
    },
    [CHAT_FMT_K2] = {
        .declare = "<|im_system|>tool_declare<|im_middle|>%J<|im_end|>",
        .sec_open = "<|tool_calls_section_begin|>",
        .sec_close = "<|tool_calls_section_end|>",
        .call_head = "<|tool_call_begin|>functions.%N:%I<|tool_call_argument_begin|>",
        .call_tail = "<|tool_call_end|>",
        .res_open = "",
        .result = "<|im_system|>tool<|im_middle|>## Return of functions.%N:%I\n%C<|im_end|>",
        .res_close = "",
        .index = IDX_GLOBAL,
        .index_base = 0,
    },
    [CHAT_FMT_DSV3] = {
        .declare = "\n\n## Tools\nYou have access to the following tools (JSON):\n%J\n",
        .sec_open = "<｜tool▁calls▁begin｜>",
        .sec_close = "<｜tool▁calls▁end｜>",
        .call_head = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>%N\n```json\n",
        .call_tail = "\n```<｜tool▁call▁end｜>",
        .res_open = "<｜tool▁outputs▁begin｜>",
        .result = "<｜tool▁output▁begin｜>%C<｜tool▁output▁end｜>",
        .res_close = "<｜tool▁outputs▁end｜>",
        .index = IDX_NONE,
    },
};

/* A format's tool table: its family's. */
static const tool_fmt *fmt_of(int fmt) {
    switch (fmt) {
    case CHAT_FMT_K2: case CHAT_FMT_K2_THINKING: case CHAT_FMT_K25: return &k_fmts[CHAT_FMT_K2];
    case CHAT_FMT_DSV3: case CHAT_FMT_R1: case CHAT_FMT_V31: return &k_fmts[CHAT_FMT_DSV3];
    default: return &k_fmts[CHAT_FMT_XTML];
    }
}

int tools_name_ok(const char *name) {
    size_t n = 0;
    for (; name[n]; n++) {
        const char c = name[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return n >= 1 && n <= TOOLS_MAX_NAME;
}

/* ===== growing strings ===== */

typedef struct { char *s; size_t n, cap; int oom; } sbuf_t;

static void sb_add(sbuf_t *b, const void *p, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->n + n + 1) cap *= 2;
        char *ns = base_realloc(b->s, cap, MEM_TOK);
        if (!ns) { b->oom = 1; return; }
        b->s = ns;
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void sb_str(sbuf_t *b, const char *s) { sb_add(b, s, strlen(s)); }
static void sb_byte(sbuf_t *b, char c) { sb_add(b, &c, 1); }

/* s as a JSON string, escaped as jansson's compact dump does (control
 * characters, quote and backslash; UTF-8 as is). */
static void sb_json_str(sbuf_t *b, const char *s, size_t n) {
    sb_byte(b, '"');
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                        : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        char u[8];
        if (!esc && c < 0x20) { snprintf(u, sizeof u, "\\u%04X", c); esc = u; }
        if (esc) sb_str(b, esc);
        else sb_byte(b, (char)c);
    }
    sb_byte(b, '"');
}

/* ===== the expander ===== */

typedef struct {
    tools_seg_fn seg;
    void *ud;
    sbuf_t text;          /* plain text of the current segment */
    const char *name, *key, *type, *json, *content;
    size_t index;
} expander;

static void ex_flush(expander *x) {
    if (x->text.n) x->seg(x->ud, x->text.s, x->text.n, 0);
    x->text.n = 0;
}

/* Length of the control marker at s ("<|...|>" or "<｜...｜>"), or 0. */
static size_t marker_len(const char *s) {
    static const char fw_open[] = "<\xEF\xBD\x9C", fw_close[] = "\xEF\xBD\x9C>";
    const char *end = NULL;
    if (!strncmp(s, "<|", 2)) { end = strstr(s + 2, "|>"); return end ? (size_t)(end + 2 - s) : 0; }
    if (!strncmp(s, fw_open, 4)) { end = strstr(s + 4, fw_close); return end ? (size_t)(end + 4 - s) : 0; }
    return 0;
}

/* Expands tpl up to (not including) the placeholder stop ('\0': the whole). */
static void expand(expander *x, const char *tpl, char stop) {
    for (const char *p = tpl; *p;) {
        size_t m = marker_len(p);
        if (m) {
            ex_flush(x);
            x->seg(x->ud, p, m, 1);
            p += m;
            continue;
        }
        if (*p != '%') { sb_byte(&x->text, *p++); continue; }
        const char c = p[1];
        if (c == stop) return;
        p += 2;
        char num[24];
        switch (c) {
        case '|': ex_flush(x); break;
        case 'N': sb_str(&x->text, x->name ? x->name : ""); break;
        case 'K': sb_str(&x->text, x->key ? x->key : ""); break;
        case 'T': sb_str(&x->text, x->type ? x->type : ""); break;
        case 'J': sb_str(&x->text, x->json ? x->json : ""); break;
        case 'C': sb_str(&x->text, x->content ? x->content : ""); break;
        case 'I': snprintf(num, sizeof num, "%zu", x->index); sb_str(&x->text, num); break;
        default: sb_byte(&x->text, '%'); sb_byte(&x->text, c); break;
        }
    }
}

static int ex_end(expander *x) {
    ex_flush(x);
    const int oom = x->text.oom;
    base_free(x->text.s);
    return oom ? STRATA_ENOMEM : STRATA_OK;
}

int tools_emit_declare(int fmt, const chat_tools *tools, tools_seg_fn seg, void *ud) {
    if (!tools || !tools->n_tools) return STRATA_OK;
    sbuf_t j = {0};
    sb_byte(&j, '[');
    for (size_t i = 0; i < tools->n_tools; i++) {
        const chat_tool *t = &tools->tools[i];
        if (i) sb_byte(&j, ',');
        sb_str(&j, "{\"type\":\"function\",\"function\":{\"name\":");
        sb_json_str(&j, t->name, strlen(t->name));
        if (t->description) {
            sb_str(&j, ",\"description\":");
            sb_json_str(&j, t->description, strlen(t->description));
        }
        if (t->parameters) {
            sb_str(&j, ",\"parameters\":");
            sb_str(&j, t->parameters);
        }
        sb_str(&j, "}}");
    }
    sb_byte(&j, ']');
    expander x = {.seg = seg, .ud = ud, .json = j.s};
    if (!j.oom) expand(&x, fmt_of(fmt)->declare, 0);
    int rc = ex_end(&x);
    if (j.oom) rc = STRATA_ENOMEM;
    base_free(j.s);
    return rc;
}

int tools_emit_choice(int fmt, const chat_tools *tools, tools_seg_fn seg, void *ud) {
    if (!tools || !tools->n_tools || tools->choice < 0 || tools->choice > 3) return STRATA_OK;
    const char *tpl = fmt_of(fmt)->choice[tools->choice];
    if (!tpl) return STRATA_OK;
    expander x = {.seg = seg, .ud = ud, .name = tools->choice_name};
    expand(&x, tpl, 0);
    return ex_end(&x);
}

/* XTML: a JSON object whose keys are plain text can be typed. */
static int typeable(const json_t *o) {
    if (!json_is_object(o)) return 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        if (!*k || strchr(k, '"') || strstr(k, "<|") || strlen(k) > 256) return 0;
        for (const char *c = k; *c; c++)
            if ((unsigned char)*c < 0x20) return 0;
    }
    return 1;
}

static const char *arg_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE: case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    case JSON_ARRAY: return "array";
    default: return "object";
    }
}

/* The arguments of one XTML call: typed blocks, or the JSON fallback block. */
static void expand_typed(expander *x, const tool_fmt *f, const char *args) {
    char err[64];
    json_t *o = NULL;
    if (jsonx_parse(&o, (const uint8_t *)args, strlen(args), "arguments", err, sizeof err) || !typeable(o)) {
        expand(x, f->json_head, 0);
        sb_str(&x->text, args);
        expand(x, f->json_tail, 0);
        json_decref(o);
        return;
    }
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        x->key = k;
        x->type = arg_type(v);
        expand(x, f->arg_head, 0);
        if (json_is_string(v)) {
            sb_add(&x->text, json_string_value(v), json_string_length(v));
        } else {
            char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!d) x->text.oom = 1;
            else sb_str(&x->text, d);
            base_free(d);
        }
        expand(x, f->arg_tail, 0);
    }
    x->key = x->type = NULL;
    json_decref(o);
}

int tools_emit_calls(int fmt, const chat_call *calls, size_t n, size_t first, tools_seg_fn seg, void *ud) {
    if (!n) return STRATA_OK;
    const tool_fmt *f = fmt_of(fmt);
    expander x = {.seg = seg, .ud = ud};
    expand(&x, f->sec_open, 0);
    for (size_t i = 0; i < n; i++) {
        x.name = calls[i].name;
        x.index = f->index == IDX_GLOBAL ? first + i : i + (size_t)f->index_base;
        expand(&x, f->call_head, 0);
        const char *args = calls[i].args ? calls[i].args : "{}";
        if (f->arg_head) expand_typed(&x, f, args);
        else sb_str(&x.text, args);
        expand(&x, f->call_tail, 0);
    }
    expand(&x, f->sec_close, 0);
    return ex_end(&x);
}

int tools_emit_result(int fmt, const char *name, size_t index, size_t global, const char *content, int first, int last,
                      tools_seg_fn seg, void *ud) {
    const tool_fmt *f = fmt_of(fmt);
    expander x = {.seg = seg, .ud = ud, .name = name, .content = content};
    x.index = f->index == IDX_GLOBAL ? global : index + (size_t)f->index_base;
    if (first) expand(&x, f->res_open, 0);
    expand(&x, f->result, 0);
    if (last) expand(&x, f->res_close, 0);
    return ex_end(&x);
}

int tools_emit_prefill(int fmt, const chat_tools *tools, size_t global, tools_seg_fn seg, void *ud) {
    if (!tools || !tools->n_tools || (tools->choice != CHAT_TOOLS_REQUIRED && tools->choice != CHAT_TOOLS_NAMED))
        return STRATA_OK;
    const tool_fmt *f = fmt_of(fmt);
    expander x = {.seg = seg, .ud = ud, .name = tools->choice_name};
    x.index = f->index == IDX_GLOBAL ? global : (size_t)f->index_base;
    expand(&x, f->sec_open, 0);
    expand(&x, f->call_head, tools->choice == CHAT_TOOLS_NAMED ? 0 : 'N');
    return ex_end(&x);
}

/* ===== parts, for the forced-call grammar (toolgram.c) ===== */

int tools_expand_part(int fmt, int part, const char *name, size_t index, const char *key, const char *type,
                      tools_seg_fn seg, void *ud) {
    const tool_fmt *f = fmt_of(fmt);
    const char *tpl = NULL;
    switch (part) {
    case TOOLS_SEC_OPEN: tpl = f->sec_open; break;
    case TOOLS_SEC_CLOSE: tpl = f->sec_close; break;
    case TOOLS_CALL_HEAD: tpl = f->call_head; break;
    case TOOLS_CALL_HEAD_NAME: tpl = f->call_head ? strstr(f->call_head, "%N") : NULL; break;
    case TOOLS_CALL_TAIL: tpl = f->call_tail; break;
    case TOOLS_ARG_HEAD: tpl = f->arg_head; break;
    case TOOLS_ARG_TAIL: tpl = f->arg_tail; break;
    case TOOLS_JSON_HEAD: tpl = f->json_head; break;
    case TOOLS_JSON_TAIL: tpl = f->json_tail; break;
    }
    if (!tpl) return STRATA_EINVAL;
    expander x = {.seg = seg, .ud = ud, .name = name, .key = key, .type = type, .index = index};
    expand(&x, tpl, 0);
    return ex_end(&x);
}

size_t tools_call_index(int fmt, size_t calls_before, size_t k) {
    const tool_fmt *f = fmt_of(fmt);
    return f->index == IDX_GLOBAL ? calls_before + k : k + (size_t)f->index_base;
}

int tools_typed(int fmt) { return fmt_of(fmt)->arg_head != NULL; }

/* ===== the parser ===== */

/* What the parser expects next. */
enum {
    S_TEXT,     /* content, watching for sec_open */
    S_SECTION,  /* a call or the end of the section */
    S_HEAD,     /* inside call_head (tpl/ti) */
    S_ARGS,     /* JSON arguments up to call_tail */
    S_TYPED,    /* XTML: an argument or the end of the call */
    S_ARGHEAD,  /* inside arg_head */
    S_VALUE,    /* an argument's value up to arg_tail */
    S_JSONARGS, /* XTML fallback block up to json_tail */
    S_AFTER_JSON, /* XTML: call_tail after the fallback block */
};

struct tools_parser {
    const tool_fmt *f;
    char *tpl[8];            /* the templates without "%|": sec_open, sec_close, call_head, call_tail,
                              * arg_head, arg_tail, json_head, json_tail */
    char **names;            /* (n_names) declared tools */
    size_t n_names;
    int forced, forced_open; /* a forced choice / its call not handed out yet */
    size_t pre_n;            /* bytes of unit from the forced call's prefill */
    int parallel;
    int st;
    const char *cur;         /* the template being matched (S_HEAD, S_ARGHEAD) */
    size_t ti;               /* position in cur */
    const char *term;        /* the terminator of a value (S_ARGS, S_VALUE, S_JSONARGS, S_TEXT) */
    size_t tm;               /* bytes of term matched */
    sbuf_t unit;             /* the text of the section or call being parsed (content if it fails) */
    sbuf_t field;            /* a placeholder's bytes, or the alternatives' prefix */
    sbuf_t name, key, type, value;
    sbuf_t args;             /* the arguments as JSON text */
    int n_args;
    sbuf_t out;              /* content handed back by one push */
    chat_call *calls;        /* (n_calls) handed out; strings owned */
    size_t n_calls, cap_calls;
    int oom;
};

enum { T_SEC_OPEN, T_SEC_CLOSE, T_CALL_HEAD, T_CALL_TAIL, T_ARG_HEAD, T_ARG_TAIL, T_JSON_HEAD, T_JSON_TAIL };

static char *strip_breaks(const char *s) {
    if (!s) return NULL;
    char *o = base_alloc(strlen(s) + 1, MEM_TOK);
    if (!o) return NULL;
    size_t n = 0;
    for (; *s; s++) {
        if (s[0] == '%' && s[1] == '|') { s++; continue; }
        o[n++] = *s;
    }
    o[n] = 0;
    return o;
}

void tools_parser_close(tools_parser *p) {
    if (!p) return;
    for (int i = 0; i < 8; i++) base_free(p->tpl[i]);
    for (size_t i = 0; i < p->n_names; i++) base_free(p->names[i]);
    base_free(p->names);
    for (size_t i = 0; i < p->n_calls; i++) {
        base_free((char *)p->calls[i].name);
        base_free((char *)p->calls[i].args);
    }
    base_free(p->calls);
    sbuf_t *bs[] = {&p->unit, &p->field, &p->name, &p->key, &p->type, &p->value, &p->args, &p->out};
    for (size_t i = 0; i < sizeof bs / sizeof *bs; i++) base_free(bs[i]->s);
    base_free(p);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *d = base_alloc(n + 1, MEM_TOK);
    if (d) memcpy(d, s, n + 1);
    return d;
}

static int feed(tools_parser *p, const char *s, size_t n);

int tools_parser_open(tools_parser **out, int fmt, const chat_tools *tools, size_t calls_before, char *err,
                      size_t errlen) {
    *out = NULL;
    tools_parser *p = base_calloc(1, sizeof *p, MEM_TOK);
    if (!p) return base_fail(err, errlen, STRATA_ENOMEM, "tools: out of memory");
    p->f = fmt_of(fmt);
    const char *src[8] = {p->f->sec_open, p->f->sec_close, p->f->call_head, p->f->call_tail,
                          p->f->arg_head, p->f->arg_tail, p->f->json_head, p->f->json_tail};
    int bad = 0;
    for (int i = 0; i < 8; i++)
        if (src[i] && !(p->tpl[i] = strip_breaks(src[i]))) bad = 1;
    const size_t nt = tools ? tools->n_tools : 0;
    if (nt && !(p->names = base_calloc(nt, sizeof *p->names, MEM_TOK))) bad = 1;
    for (size_t i = 0; !bad && i < nt; i++, p->n_names++)
        if (!(p->names[i] = dup_str(tools->tools[i].name))) bad = 1;
    p->parallel = !tools || tools->parallel;
    p->st = S_TEXT;
    p->term = p->tpl[T_SEC_OPEN];
    if (!bad && tools && nt && (tools->choice == CHAT_TOOLS_REQUIRED || tools->choice == CHAT_TOOLS_NAMED)) {
        /* start where the prefill left the model */
        sbuf_t pre = {0};
        const tool_fmt *f = p->f;
        sb_str(&pre, p->tpl[T_SEC_OPEN]);
        const char *h = p->tpl[T_CALL_HEAD];
        const char *ph = strstr(h, "%N");
        sb_add(&pre, h, (size_t)(ph - h));
        if (tools->choice == CHAT_TOOLS_NAMED) {
            char num[24];
            sb_str(&pre, tools->choice_name);
            const char *pi = strstr(ph, "%I");
            if (pi) {
                sb_add(&pre, ph + 2, (size_t)(pi - ph - 2));
                snprintf(num, sizeof num, "%zu", f->index == IDX_GLOBAL ? calls_before : (size_t)f->index_base);
                sb_str(&pre, num);
                sb_str(&pre, pi + 2);
            } else {
                sb_str(&pre, ph + 2);
            }
        }
        p->forced = p->forced_open = 1;
        if (pre.oom || feed(p, pre.s, pre.n)) bad = 1;
        p->out.n = 0;
        p->pre_n = p->unit.n;
        base_free(pre.s);
    }
    if (bad || p->oom) {
        tools_parser_close(p);
        return base_fail(err, errlen, STRATA_ENOMEM, "tools: out of memory");
    }
    *out = p;
    return STRATA_OK;
}

/* ---- handing out ---- */

static int declared(const tools_parser *p, const char *name) {
    for (size_t i = 0; i < p->n_names; i++)
        if (!strcmp(p->names[i], name)) return 1;
    return 0;
}

static void add_call(tools_parser *p, const char *name, const char *args) {
    if (p->n_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
        chat_call *nc = base_realloc(p->calls, cap * sizeof *nc, MEM_TOK);
        if (!nc) { p->oom = 1; return; }
        p->calls = nc;
        p->cap_calls = cap;
    }
    char *a = dup_str(name), *b = dup_str(args);
    if (!a || !b) { base_free(a); base_free(b); p->oom = 1; return; }
    p->calls[p->n_calls++] = (chat_call){a, b};
}

static int is_object(const char *s, size_t n) {
    char err[64];
    json_t *o = NULL;
    int ok = !jsonx_parse(&o, (const uint8_t *)s, n, "arguments", err, sizeof err) && json_is_object(o);
    json_decref(o);
    return ok;
}

static void reset_call(tools_parser *p) {
    p->name.n = p->key.n = p->type.n = p->value.n = p->args.n = p->field.n = 0;
    p->n_args = 0;
    p->tm = 0;
}

/* The arguments as JSON: typed formats build an object from their blocks. */
static const char *call_args(tools_parser *p) {
    if (!p->f->arg_head) return p->args.s ? p->args.s : "";
    if (p->n_args < 0) return p->args.s ? p->args.s : ""; /* the fallback block: its JSON as written */
    sbuf_t *a = &p->args;
    if (!p->n_args) { a->n = 0; sb_str(a, "{}"); return a->s; }
    sb_byte(a, '}');
    return a->s;
}

/* A call is complete: hand it out if well formed (1), else 0. */
static int finish_call(tools_parser *p) {
    const char *args = call_args(p);
    const char *name = p->name.s ? p->name.s : "";
    if (p->oom || p->args.oom || p->name.oom) return 0;
    if (!declared(p, name) || !is_object(args, strlen(args))) return 0;
    add_call(p, name, args);
    p->forced_open = 0;
    return 1;
}

/* A forced call cut short (max_tokens) with its name written: handed out with
 * the arguments as far as the model wrote them (finish_reason "length" says
 * so). A name that is not a declared tool is never relabelled: a forced call's
 * grammar (toolgram.h) writes only declared names, so that text is content. */
static int finish_forced(tools_parser *p) {
    const char *name = p->name.s ? p->name.s : "";
    if (p->st == S_HEAD || !declared(p, name)) return 0;
    if (p->f->arg_head && p->n_args > 0) sb_byte(&p->args, '}');
    else if (p->f->arg_head && p->n_args == 0) { p->args.n = 0; sb_str(&p->args, "{}"); }
    add_call(p, name, p->args.s ? p->args.s : "");
    p->forced_open = 0;
    return 1;
}

/* The unit's text as content: what the model wrote (a forced call's prefill is
 * the prompt's, not the reply's). */
static void unit_content(tools_parser *p) {
    const size_t skip = p->forced_open ? (p->pre_n < p->unit.n ? p->pre_n : p->unit.n) : 0;
    sb_add(&p->out, p->unit.s + skip, p->unit.n - skip);
    p->forced_open = 0;
}

/* What was parsed is not a call: its text becomes content. */
static void fail_unit(tools_parser *p) {
    if (!(p->forced_open && finish_forced(p))) unit_content(p);
    p->unit.n = 0;
    reset_call(p);
    p->st = S_TEXT;
    p->term = p->tpl[T_SEC_OPEN];
}

/* ---- matching ---- */

/* The longest proper suffix of t[0..m) that is a prefix of t. */
static size_t fallback(const char *t, size_t m) {
    for (size_t k = m - 1; k > 0; k--)
        if (!memcmp(t + m - k, t, k)) return k;
    return 0;
}

/* One byte of a value ended by p->term: 1 when the terminator completed, else
 * 0 with the bytes that cannot start it added to dst. */
static int term_byte(tools_parser *p, sbuf_t *dst, char c) {
    const char *t = p->term;
    for (;;) {
        if (c == t[p->tm]) {
            p->tm++;
            if (!t[p->tm]) { p->tm = 0; return 1; }
            return 0;
        }
        if (!p->tm) { sb_byte(dst, c); return 0; }
        const size_t k = fallback(t, p->tm);
        sb_add(dst, t, p->tm - k);
        p->tm = k;
    }
}

/* Length of the literal start of a template (up to its first placeholder). */
static size_t lit_len(const char *t) {
    const char *q = strchr(t, '%');
    return q ? (size_t)(q - t) : strlen(t);
}

/* Choosing between alternatives by their literal starts: 1 + the index of the
 * one field now spells, 0 when more bytes are needed, -1 when none can match. */
static int choose(const tools_parser *p, const int *alts, int n_alts) {
    int any = 0;
    for (int i = 0; i < n_alts; i++) {
        const char *t = p->tpl[alts[i]];
        const size_t L = lit_len(t);
        const size_t k = p->field.n < L ? p->field.n : L;
        if (memcmp(p->field.s, t, k)) continue;
        if (p->field.n >= L) return i + 1;
        any = 1;
    }
    return any ? 0 : -1;
}

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* One byte inside a template with placeholders (call_head, arg_head): 1 when
 * the template completed, 0 to go on, -1 on a mismatch. */
static int tpl_byte(tools_parser *p, char c) {
    const char *t = p->cur;
    if (t[p->ti] == '%') {
        const char ph = t[p->ti + 1], end = t[p->ti + 2];
        sbuf_t *dst = ph == 'N' ? &p->name : ph == 'K' ? &p->key : ph == 'T' ? &p->type : &p->field;
        if (c != end) {
            const size_t lim = ph == 'N' ? TOOLS_MAX_NAME : ph == 'I' ? 9 : ph == 'K' ? 256 : 16;
            if (dst->n >= lim || (unsigned char)c < 0x20 || (ph == 'I' && (c < '0' || c > '9'))) return -1;
            sb_byte(dst, c);
            return 0;
        }
        if (!dst->n) sb_add(dst, "", 0);
        p->ti += 3; /* the placeholder and its terminator */
    } else if (c == t[p->ti]) {
        p->ti++;
    } else {
        return -1;
    }
    return t[p->ti] ? 0 : 1;
}

/* Starts an argument in the typed object: `,"key":` */
static void open_arg(tools_parser *p) {
    sb_byte(&p->args, p->n_args++ ? ',' : '{');
    sb_json_str(&p->args, p->key.s ? p->key.s : "", p->key.n);
    sb_byte(&p->args, ':');
}

static void close_arg(tools_parser *p) {
    if (p->type.s && !strcmp(p->type.s, "string")) {
        sb_json_str(&p->args, p->value.s ? p->value.s : "", p->value.n);
    } else {
        size_t a = 0, b = p->value.n; /* compact values: trim white space */
        while (a < b && is_space(p->value.s[a])) a++;
        while (b > a && is_space(p->value.s[b - 1])) b--;
        sb_add(&p->args, p->value.s + a, b - a);
    }
    p->key.n = p->type.n = p->value.n = 0;
}

/* The byte c in state S_SECTION or S_TYPED (alternatives). */
static void alt_byte(tools_parser *p, char c) {
    if (!p->field.n && is_space(c)) return;
    sb_byte(&p->field, c);
    int sec = p->st == S_SECTION;
    const int a_sec[] = {T_CALL_HEAD, T_SEC_CLOSE}, a_typed[] = {T_ARG_HEAD, T_CALL_TAIL, T_JSON_HEAD};
    const int r = sec ? choose(p, a_sec, 2) : choose(p, a_typed, p->n_args ? 2 : 3);
    if (r == 0) return;
    if (r < 0) { fail_unit(p); return; }
    const int which = sec ? a_sec[r - 1] : a_typed[r - 1];
    const size_t L = lit_len(p->tpl[which]);
    p->field.n = 0;
    switch (which) {
    case T_CALL_HEAD:
        if (!p->parallel && p->n_calls) { fail_unit(p); return; }
        reset_call(p);
        p->cur = p->tpl[T_CALL_HEAD];
        p->ti = L;
        p->st = S_HEAD;
        break;
    case T_SEC_CLOSE:
        p->unit.n = 0;
        p->st = S_TEXT;
        p->term = p->tpl[T_SEC_OPEN];
        break;
    case T_ARG_HEAD:
        p->cur = p->tpl[T_ARG_HEAD];
        p->ti = L;
        p->st = S_ARGHEAD;
        break;
    case T_JSON_HEAD:
        p->n_args = -1;
        p->args.n = 0;
        p->st = S_JSONARGS;
        p->term = p->tpl[T_JSON_TAIL];
        break;
    default: /* T_CALL_TAIL */
        if (!finish_call(p)) { fail_unit(p); return; }
        p->unit.n = 0;
        p->st = S_SECTION;
        break;
    }
}

static void parse_byte(tools_parser *p, char c) {
    if (p->st != S_TEXT) {
        sb_byte(&p->unit, c);
        if (p->unit.n > TOOLS_MAX_CALL_BYTES) { fail_unit(p); return; }
    }
    switch (p->st) {
    case S_TEXT:
        if (term_byte(p, &p->out, c)) {
            p->unit.n = 0;
            sb_str(&p->unit, p->tpl[T_SEC_OPEN]);
            p->field.n = 0;
            p->st = S_SECTION;
        }
        break;
    case S_SECTION:
    case S_TYPED:
        alt_byte(p, c);
        break;
    case S_HEAD: {
        const int r = tpl_byte(p, c);
        if (r < 0) fail_unit(p);
        else if (r > 0) {
            if (p->f->arg_head) { p->st = S_TYPED; p->field.n = 0; }
            else { p->st = S_ARGS; p->term = p->tpl[T_CALL_TAIL]; p->tm = 0; }
        }
        break;
    }
    case S_ARGS:
        if (term_byte(p, &p->args, c)) {
            if (!finish_call(p)) { fail_unit(p); return; }
            p->unit.n = 0;
            p->st = S_SECTION;
            p->field.n = 0;
        }
        break;
    case S_ARGHEAD: {
        const int r = tpl_byte(p, c);
        if (r < 0) fail_unit(p);
        else if (r > 0) {
            open_arg(p);
            p->st = S_VALUE;
            p->term = p->tpl[T_ARG_TAIL];
            p->tm = 0;
        }
        break;
    }
    case S_VALUE:
        if (term_byte(p, &p->value, c)) {
            close_arg(p);
            p->st = S_TYPED;
            p->field.n = 0;
        }
        break;
    case S_JSONARGS:
        if (term_byte(p, &p->args, c)) { p->st = S_AFTER_JSON; p->field.n = 0; p->cur = p->tpl[T_CALL_TAIL]; p->ti = 0; }
        break;
    default: /* S_AFTER_JSON: the call's end */
        if (!p->ti && is_space(c)) break;
        if (c != p->cur[p->ti]) { fail_unit(p); break; }
        if (!p->cur[++p->ti]) {
            if (!finish_call(p)) { fail_unit(p); break; }
            p->unit.n = 0;
            p->st = S_SECTION;
            p->field.n = 0;
        }
        break;
    }
}

static int feed(tools_parser *p, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) parse_byte(p, s[i]);
    return p->oom || p->out.oom || p->unit.oom || p->args.oom ? STRATA_ENOMEM : STRATA_OK;
}

int tools_parser_push(tools_parser *p, const char *s, size_t n, const char **content, size_t *content_n) {
    p->out.n = 0;
    int rc = feed(p, s, n);
    *content = p->out.s ? p->out.s : "";
    *content_n = p->out.n;
    return rc;
}

int tools_parser_flush(tools_parser *p, const char **content, size_t *content_n) {
    p->out.n = 0;
    if (p->st == S_TEXT) {
        sb_add(&p->out, p->term, p->tm); /* a held start of sec_open */
        p->tm = 0;
    } else {
        if (p->forced_open && p->st == S_VALUE) close_arg(p);
        if (!(p->forced_open && finish_forced(p))) unit_content(p);
    }
    p->unit.n = 0;
    p->st = S_TEXT;
    p->term = p->tpl[T_SEC_OPEN];
    *content = p->out.s ? p->out.s : "";
    *content_n = p->out.n;
    return p->oom || p->out.oom ? STRATA_ENOMEM : STRATA_OK;
}

size_t tools_parser_n_calls(const tools_parser *p) { return p->n_calls; }
const chat_call *tools_parser_call(const tools_parser *p, size_t i) { return i < p->n_calls ? &p->calls[i] : NULL; }
int tools_parser_done(const tools_parser *p) { return !p->parallel && p->n_calls > 0; }
