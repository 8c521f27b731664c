/*
 * chat.c: render Kimi conversations to ids and parse generated replies (chat.h),
 * in K3's XTML or the Kimi K2 / Kimi Linear format.
 *
 * Rendering is a list of segments, each either a control marker (encoded with
 * special tokens allowed) or text (specials disabled). Segment boundaries are
 * also BPE boundaries, so they follow the official encoder exactly: the tag name
 * ("message") and its attributes (' role="user"') are separate segments, and the
 * effort message body is one segment (merges run across "=max").
 */
#include "chat.h"

#include <string.h>
#include "base.h"
#include "tools.h"

static const char k_effort_body[] =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), "
    "supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=%s`.";

static const char *const k_efforts[] = {"off", "low", "high", "max"};
static const char *const k_roles[] = {"system", "user", "assistant", "tool"};

int chat_effort_parse(const char *s) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, k_efforts[i])) return i;
    return -1;
}

const char *chat_effort_name(int effort) { return effort >= 0 && effort < 4 ? k_efforts[effort] : "?"; }
const char *chat_role_name(int role) { return role >= 0 && role < 4 ? k_roles[role] : "?"; }

int chat_role_parse(const char *s) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, k_roles[i])) return i;
    return -1;
}

static const char k_k2_system[] = "You are Kimi, an AI assistant created by Moonshot AI.";

#define DS_BOS "<｜begin▁of▁sentence｜>"
#define DS_EOS "<｜end▁of▁sentence｜>"
#define DS_USER "<｜User｜>"
#define DS_ASSISTANT "<｜Assistant｜>"

/* Which DeepSeek template: markers of the published chat_templates (chat.h). */
static int ds_variant(const tok *t, int32_t think) {
    const char *tm = tok_chat_template(t);
    if (!tm) return think >= 0 ? CHAT_FMT_R1 : CHAT_FMT_DSV3;
    if (strstr(tm, DS_ASSISTANT "</think>")) return CHAT_FMT_V31;
    return strstr(tm, "<think>") ? CHAT_FMT_R1 : CHAT_FMT_DSV3;
}

/* K2.5's template opens <think> in its generation prompt (family-formats.md
 * 2.1); K2-Thinking's ends at <|im_middle|>. Both render images with
 * <|media_start|>..., so "media" alone does not tell them apart. */
static int k25_template(const char *tm) {
    const char *g = tm ? strstr(tm, "add_generation_prompt") : NULL, *n;
    while (g && (n = strstr(g + 1, "add_generation_prompt"))) g = n;
    return g && strstr(g, "<think>");
}

int chat_ids_init(chat_ids *c, const tok *t, char *err, size_t errlen) {
    static const char *xtml[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
    static const char *k2[] = {"<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>"};
    static const char *ds[] = {DS_BOS, DS_EOS, DS_USER, DS_ASSISTANT};
    memset(c, 0xff, sizeof *c); /* every id -1 */
    int32_t *dx[] = {&c->open, &c->close, &c->sep, &c->eom};
    int32_t *dk[] = {&c->im_system, &c->im_user, &c->im_assistant, &c->im_middle, &c->eom};
    int32_t *dd[] = {&c->bos, &c->eos, &c->im_user, &c->im_assistant};
    const char *missing = NULL, *missing_k2 = NULL, *missing_ds = NULL;
    c->think = tok_special_id(t, "<think>");
    c->think_end = tok_special_id(t, "</think>");
    for (int i = 0; i < 4; i++)
        if ((*dx[i] = tok_special_id(t, xtml[i])) < 0 && !missing) missing = xtml[i];
    c->fmt = CHAT_FMT_XTML;
    if (!missing) goto named;
    c->open = c->close = c->sep = c->eom = -1;
    for (int i = 0; i < 5; i++)
        if ((*dk[i] = tok_special_id(t, k2[i])) < 0 && !missing_k2) missing_k2 = k2[i];
    c->fmt = CHAT_FMT_K2;
    if (!missing_k2) {
        /* a template that never writes <think> is K2-Instruct's (Kimi Linear's
         * and K2's own), whatever specials the vocabulary has */
        const char *tm = tok_chat_template(t);
        if (c->think >= 0 && c->think_end >= 0)
            c->fmt = k25_template(tm) ? CHAT_FMT_K25 : tm && !strstr(tm, "<think>") ? CHAT_FMT_K2 : CHAT_FMT_K2_THINKING;
        goto named;
    }
    c->im_system = c->im_user = c->im_assistant = c->im_middle = c->eom = -1;
    for (int i = 0; i < 4; i++)
        if ((*dd[i] = tok_special_id(t, ds[i])) < 0 && !missing_ds) missing_ds = ds[i];
    if (missing_ds)
        return base_fail(err, errlen, STRATA_EFORMAT,
                         "chat: the tokenizer has neither K3's chat tokens (no %s), Kimi K2's (no %s) nor DeepSeek's "
                         "(no %s); is tokenizer_config.json loaded?", missing, missing_k2, missing_ds);
    c->eom = c->eos;
    c->fmt = ds_variant(t, c->think);
    return STRATA_OK;
named:
    c->eos = tok_special_id(t, "[EOS]");
    c->bos = tok_special_id(t, "[BOS]");
    return STRATA_OK;
}

int chat_fmt_is_ds(int fmt) { return fmt == CHAT_FMT_DSV3 || fmt == CHAT_FMT_R1 || fmt == CHAT_FMT_V31; }

int chat_fmt_is_k2(int fmt) { return fmt == CHAT_FMT_K2 || fmt == CHAT_FMT_K2_THINKING || fmt == CHAT_FMT_K25; }

int chat_fmt_thinking(int fmt, int effort) {
    if (fmt == CHAT_FMT_R1) return 1;
    if (fmt == CHAT_FMT_XTML || fmt == CHAT_FMT_V31 || fmt == CHAT_FMT_K25) return effort != CHAT_THINK_OFF;
    return 0;
}

/* ===== rendering ===== */

typedef struct {
    int fmt;          /* CHAT_FMT_* */
    tok *t;           /* NULL: render text */
    int32_t **ids;
    size_t *n, *cap;
    char *txt;        /* text mode buffer (MEM_TOK) */
    size_t tlen, tcap;
    int rc;
} emitter;

static void seg(emitter *e, const char *s, size_t len, int allow_special) {
    if (e->rc || len == 0) return;
    if (e->t) {
        e->rc = tok_encode_append(e->t, (const uint8_t *)s, len, allow_special, e->ids, e->n, e->cap);
        return;
    }
    if (e->tlen + len + 1 > e->tcap) {
        size_t cap = e->tcap ? e->tcap : 1024;
        while (cap < e->tlen + len + 1) cap *= 2;
        char *nb = base_realloc(e->txt, cap, MEM_TOK);
        if (!nb) { e->rc = STRATA_ENOMEM; return; }
        e->txt = nb;
        e->tcap = cap;
    }
    memcpy(e->txt + e->tlen, s, len);
    e->tlen += len;
    e->txt[e->tlen] = 0;
}

static void ctl(emitter *e, const char *s) { seg(e, s, strlen(s), 1); }
static void txt(emitter *e, const char *s) { seg(e, s, strlen(s), 0); }

static void open_tag(emitter *e, const char *tag, const char *attrs) {
    ctl(e, "<|open|>");
    txt(e, tag);
    if (attrs) txt(e, attrs);
    ctl(e, "<|sep|>");
}

static void close_tag(emitter *e, const char *tag) {
    ctl(e, "<|close|>");
    txt(e, tag);
    ctl(e, "<|sep|>");
}

/* Kimi K2 / Kimi Linear: <|im_ROLE|>ROLE<|im_middle|>CONTENT<|im_end|> per message,
 * the default system message first when the conversation has none. The thinking
 * variants (chat.h) put <think>..</think> before an assistant turn's content.
 * Tool parts come from tools.c's K2 table. */
static void tool_seg(void *ud, const char *s, size_t n, int special) { seg(ud, s, n, special); }

/* The call a tool message answers: its name, its index in its message. */
static const chat_call *answered(const chat_msg *msgs, size_t upto, size_t call_of, size_t *index) {
    size_t g = 0;
    for (size_t i = 0; i < upto; i++) {
        if (msgs[i].role != CHAT_ASSISTANT) continue;
        if (call_of < g + msgs[i].n_calls) { *index = call_of - g; return &msgs[i].calls[call_of - g]; }
        g += msgs[i].n_calls;
    }
    return NULL;
}

/* A tool message (validated by render) and the calls before message i. */
static void render_result(emitter *e, const chat_msg *msgs, size_t n_msgs, size_t i) {
    size_t index = 0;
    const chat_call *c = answered(msgs, i, msgs[i].call_of, &index);
    const int first = i == 0 || msgs[i - 1].role != CHAT_TOOL, last = i + 1 == n_msgs || msgs[i + 1].role != CHAT_TOOL;
    if (!e->rc) e->rc = tools_emit_result(e->fmt, c->name, index, msgs[i].call_of, msgs[i].content, first, last, tool_seg, e);
}

/* Whether tools force a call: the generation prompt opens it (and skips any
 * thinking, as K3's forced calls do). */
static int tools_forced(const chat_tools *tools) {
    return tools && tools->n_tools && (tools->choice == CHAT_TOOLS_REQUIRED || tools->choice == CHAT_TOOLS_NAMED);
}

static void render_k2(emitter *e, const chat_msg *msgs, size_t n_msgs, const chat_tools *tools, int effort, int flags) {
    int thinking_fmt = e->fmt == CHAT_FMT_K2_THINKING || e->fmt == CHAT_FMT_K25;
    size_t last_user = 0; /* turns at or before it drop their reasoning */
    for (size_t i = 0; i < n_msgs; i++)
        if (msgs[i].role == CHAT_USER) last_user = i;
    static const char *const k_markers[] = {"<|im_system|>", "<|im_user|>", "<|im_assistant|>"};
    size_t calls = 0;
    if (!(flags & CHAT_CONTINUE) && !e->rc) e->rc = tools_emit_declare(e->fmt, tools, tool_seg, e);
    if (!(flags & CHAT_CONTINUE) && (n_msgs == 0 || msgs[0].role != CHAT_SYSTEM)) {
        ctl(e, "<|im_system|>");
        txt(e, "system");
        ctl(e, "<|im_middle|>");
        txt(e, k_k2_system);
        ctl(e, "<|im_end|>");
    }
    for (size_t i = 0; i < n_msgs; i++) {
        if (msgs[i].role == CHAT_TOOL) { render_result(e, msgs, n_msgs, i); continue; }
        ctl(e, k_markers[msgs[i].role]);
        txt(e, chat_role_name(msgs[i].role));
        ctl(e, "<|im_middle|>");
        if (thinking_fmt && msgs[i].role == CHAT_ASSISTANT) {
            ctl(e, "<think>");
            if (i > last_user && msgs[i].reasoning) txt(e, msgs[i].reasoning);
            ctl(e, "</think>");
        }
        txt(e, msgs[i].content);
        if (msgs[i].n_calls && !e->rc) e->rc = tools_emit_calls(e->fmt, msgs[i].calls, msgs[i].n_calls, calls, tool_seg, e);
        calls += msgs[i].n_calls;
        ctl(e, "<|im_end|>");
    }
    if (flags & CHAT_GEN) {
        ctl(e, "<|im_assistant|>");
        txt(e, "assistant");
        ctl(e, "<|im_middle|>");
        if (e->fmt == CHAT_FMT_K25) {
            ctl(e, "<think>");
            if (effort == CHAT_THINK_OFF || tools_forced(tools)) ctl(e, "</think>");
        }
        if (!e->rc) e->rc = tools_emit_prefill(e->fmt, tools, calls, tool_seg, e);
    }
}

/* DeepSeek-V3 / R1 / V3.1 (chat.h). The system messages come first, joined by
 * a blank line into one text (so BPE runs across the join, as on the template's
 * string), then the tool declaration; every other cut is an added token, so
 * encoding piece by piece gives the ids of encoding the rendered string. Tool
 * parts come from tools.c's DeepSeek-V3 table. */
static void render_ds(emitter *e, const chat_msg *msgs, size_t n_msgs, const chat_tools *tools, int effort, int flags) {
    size_t calls = 0;
    if (!(flags & CHAT_CONTINUE)) {
        ctl(e, DS_BOS);
        size_t len = 0;
        for (size_t i = 0; i < n_msgs; i++)
            if (msgs[i].role == CHAT_SYSTEM) len += strlen(msgs[i].content) + 2;
        char *sys = len ? base_alloc(len + 1, MEM_TOK) : NULL;
        if (len && !sys) { e->rc = STRATA_ENOMEM; return; }
        size_t o = 0;
        for (size_t i = 0; i < n_msgs; i++) {
            if (msgs[i].role != CHAT_SYSTEM) continue;
            if (o) { memcpy(sys + o, "\n\n", 2); o += 2; }
            size_t l = strlen(msgs[i].content);
            memcpy(sys + o, msgs[i].content, l);
            o += l;
        }
        if (sys) seg(e, sys, o, 0);
        base_free(sys);
        if (!e->rc) e->rc = tools_emit_declare(e->fmt, tools, tool_seg, e);
    }
    for (size_t i = 0; i < n_msgs; i++) {
        const chat_msg *m = &msgs[i];
        if (m->role == CHAT_TOOL) {
            render_result(e, msgs, n_msgs, i);
        } else if (m->role == CHAT_SYSTEM) {
            if (flags & CHAT_CONTINUE) txt(e, m->content); /* a later system turn: its text where it stands */
        } else if (m->role == CHAT_USER) {
            ctl(e, DS_USER);
            txt(e, m->content);
        } else { /* earlier assistant turns keep no reasoning in all three templates */
            ctl(e, DS_ASSISTANT);
            if (e->fmt == CHAT_FMT_V31) ctl(e, "</think>");
            txt(e, m->content);
            if (m->n_calls && !e->rc) e->rc = tools_emit_calls(e->fmt, m->calls, m->n_calls, calls, tool_seg, e);
            calls += m->n_calls;
            ctl(e, DS_EOS);
        }
    }
    if (flags & CHAT_GEN) {
        ctl(e, DS_ASSISTANT);
        if (e->fmt == CHAT_FMT_R1) {
            ctl(e, "<think>");
            txt(e, "\n");
            if (tools_forced(tools)) ctl(e, "</think>");
        } else if (e->fmt == CHAT_FMT_V31) {
            ctl(e, effort != CHAT_THINK_OFF && !tools_forced(tools) ? "<think>" : "</think>");
        }
        if (!e->rc) e->rc = tools_emit_prefill(e->fmt, tools, calls, tool_seg, e);
    }
}

static int forced(const chat_tools *tools) {
    return tools && tools->n_tools && (tools->choice == CHAT_TOOLS_REQUIRED || tools->choice == CHAT_TOOLS_NAMED);
}

/* Tools, calls and results are consistent (the renderer trusts them after). */
static int check_tools(const chat_msg *msgs, size_t n_msgs, const chat_tools *tools, char *err, size_t errlen) {
    for (size_t i = 0; tools && i < tools->n_tools; i++)
        if (!tools->tools[i].name || !tools_name_ok(tools->tools[i].name))
            return base_fail(err, errlen, STRATA_EINVAL, "chat: tool %zu: the name must be 1-64 of A-Z a-z 0-9 _ -", i + 1);
    if (forced(tools) && tools->choice == CHAT_TOOLS_NAMED && (!tools->choice_name || !tools_name_ok(tools->choice_name)))
        return base_fail(err, errlen, STRATA_EINVAL, "chat: tool_choice names no valid tool");
    size_t calls = 0;
    for (size_t i = 0; i < n_msgs; i++) {
        const chat_msg *m = &msgs[i];
        if (m->n_calls && (m->role != CHAT_ASSISTANT || !m->calls))
            return base_fail(err, errlen, STRATA_EINVAL, "chat: message %zu (%s) has tool calls; only assistant turns may",
                             i + 1, chat_role_name(m->role));
        for (size_t k = 0; k < m->n_calls; k++)
            if (!m->calls[k].name || !*m->calls[k].name || strstr(m->calls[k].name, "\"") || strchr(m->calls[k].name, '\n'))
                return base_fail(err, errlen, STRATA_EINVAL, "chat: message %zu: tool call %zu has no usable name", i + 1, k + 1);
        if (m->role == CHAT_TOOL && m->call_of >= calls)
            return base_fail(err, errlen, STRATA_EINVAL, "chat: message %zu (tool) answers call %zu; there are %zu before it",
                             i + 1, m->call_of + 1, calls);
        calls += m->n_calls;
    }
    return STRATA_OK;
}

static int render(emitter *e, const chat_msg *msgs, size_t n_msgs, const chat_tools *tools, int effort, int flags,
                  char *err, size_t errlen) {
    if (effort < CHAT_THINK_OFF || effort > CHAT_THINK_MAX)
        return base_fail(err, errlen, STRATA_EINVAL, "chat: thinking effort must be off, low, high or max");
    for (size_t i = 0; i < n_msgs; i++) {
        if (msgs[i].role < CHAT_SYSTEM || msgs[i].role > CHAT_TOOL || !msgs[i].content)
            return base_fail(err, errlen, STRATA_EINVAL, "chat: message %zu has a bad role or no content", i + 1);
        if (msgs[i].reasoning && msgs[i].role != CHAT_ASSISTANT)
            return base_fail(err, errlen, STRATA_EINVAL, "chat: message %zu (%s) has reasoning; only assistant turns may",
                             i + 1, chat_role_name(msgs[i].role));
    }
    int rc = check_tools(msgs, n_msgs, tools, err, errlen);
    if (rc) return rc;
    if (e->fmt != CHAT_FMT_XTML) {
        if (chat_fmt_is_k2(e->fmt)) render_k2(e, msgs, n_msgs, tools, effort, flags);
        else render_ds(e, msgs, n_msgs, tools, effort, flags);
        if (e->rc) return base_fail(err, errlen, e->rc, "chat: rendering failed: %s", strata_errstr(e->rc));
        return STRATA_OK;
    }
    if (!(flags & CHAT_CONTINUE) && !e->rc) e->rc = tools_emit_declare(e->fmt, tools, tool_seg, e);
    if (effort != CHAT_THINK_OFF && !(flags & CHAT_CONTINUE)) {
        char body[sizeof k_effort_body + 8];
        snprintf(body, sizeof body, k_effort_body, chat_effort_name(effort));
        open_tag(e, "message", " role=\"system\" type=\"thinking-effort\"");
        txt(e, body);
        close_tag(e, "message");
        ctl(e, "<|end_of_msg|>");
    }
    size_t calls = 0;
    for (size_t i = 0; i < n_msgs; i++) {
        const chat_msg *m = &msgs[i];
        char attrs[64];
        if (m->role == CHAT_TOOL) { render_result(e, msgs, n_msgs, i); continue; }
        snprintf(attrs, sizeof attrs, " role=\"%s\"", chat_role_name(m->role));
        open_tag(e, "message", attrs);
        if (m->role == CHAT_ASSISTANT) {
            if (effort != CHAT_THINK_OFF) {
                open_tag(e, "think", NULL);
                txt(e, m->reasoning ? m->reasoning : "");
                close_tag(e, "think");
            }
            open_tag(e, "response", NULL);
            txt(e, m->content);
            close_tag(e, "response");
            if (m->n_calls && !e->rc) e->rc = tools_emit_calls(e->fmt, m->calls, m->n_calls, calls, tool_seg, e);
            calls += m->n_calls;
        } else {
            txt(e, m->content);
        }
        close_tag(e, "message");
        ctl(e, "<|end_of_msg|>");
    }
    if (flags & CHAT_GEN) {
        if (!e->rc) e->rc = tools_emit_choice(e->fmt, tools, tool_seg, e);
        open_tag(e, "message", " role=\"assistant\"");
        open_tag(e, effort != CHAT_THINK_OFF ? "think" : "response", NULL);
        if (forced(tools)) { /* the call opens the tools channel: the channels before it stay empty */
            if (effort != CHAT_THINK_OFF) {
                close_tag(e, "think");
                open_tag(e, "response", NULL);
            }
            close_tag(e, "response");
            if (!e->rc) e->rc = tools_emit_prefill(e->fmt, tools, calls, tool_seg, e);
        }
    }
    if (e->rc) return base_fail(err, errlen, e->rc, "chat: rendering failed: %s", strata_errstr(e->rc));
    return STRATA_OK;
}

int chat_render(tok *t, const chat_msg *msgs, size_t n_msgs, int effort, int flags, int32_t **ids, size_t *n,
                size_t *cap, char *err, size_t errlen) {
    return chat_render_tools(t, msgs, n_msgs, NULL, effort, flags, ids, n, cap, err, errlen);
}

int chat_render_tools(tok *t, const chat_msg *msgs, size_t n_msgs, const chat_tools *tools, int effort, int flags,
                      int32_t **ids, size_t *n, size_t *cap, char *err, size_t errlen) {
    chat_ids c;
    int rc = chat_ids_init(&c, t, err, errlen);
    if (rc) return rc;
    emitter e = {.fmt = c.fmt, .t = t, .ids = ids, .n = n, .cap = cap};
    return render(&e, msgs, n_msgs, tools, effort, flags, err, errlen);
}

int chat_render_text(const chat_msg *msgs, size_t n_msgs, int effort, int flags, char **out, size_t *len, char *err,
                     size_t errlen) {
    return chat_render_text_fmt(CHAT_FMT_XTML, msgs, n_msgs, effort, flags, out, len, err, errlen);
}

int chat_render_text_fmt(int fmt, const chat_msg *msgs, size_t n_msgs, int effort, int flags, char **out, size_t *len,
                         char *err, size_t errlen) {
    return chat_render_text_tools(fmt, msgs, n_msgs, NULL, effort, flags, out, len, err, errlen);
}

int chat_render_text_tools(int fmt, const chat_msg *msgs, size_t n_msgs, const chat_tools *tools, int effort, int flags,
                           char **out, size_t *len, char *err, size_t errlen) {
    emitter e = {.fmt = fmt};
    int rc = render(&e, msgs, n_msgs, tools, effort, flags, err, errlen);
    if (!rc && !e.txt) {
        e.txt = base_alloc(1, MEM_TOK);
        if (!e.txt) rc = base_fail(err, errlen, STRATA_ENOMEM, "chat: out of memory");
        else e.txt[0] = 0;
    }
    if (rc) { base_free(e.txt); *out = NULL; *len = 0; return rc; }
    *out = e.txt;
    *len = e.tlen;
    return STRATA_OK;
}

/* ===== parsing a reply ===== */

typedef struct { char *s; size_t n, cap; } bytes;

static int bytes_add(bytes *b, const uint8_t *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *ns = base_realloc(b->s, cap, MEM_TOK);
        if (!ns) return STRATA_ENOMEM;
        b->s = ns;
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
    return STRATA_OK;
}

static int add_ids(const tok *t, bytes *b, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const uint8_t *p = tok_token_bytes(t, ids[i], &l);
        if (!p) return STRATA_EINVAL;
        int rc = bytes_add(b, p, l);
        if (rc) return rc;
    }
    return STRATA_OK;
}

void chat_reply_free(chat_reply *r) {
    if (!r) return;
    base_free(r->reasoning);
    base_free(r->content);
    base_free(r->tools);
    memset(r, 0, sizeof *r);
}

enum { P_THINK, P_AFTER_THINK, P_RESPONSE, P_AFTER_RESPONSE, P_CLOSED, P_TOOLS };

/* Whether a reply starts in the think channel: XTML, V3.1 and K2.5 as the
 * caller's prompt chose, R1 always (its prompt opens <think>), K2, K2-Thinking
 * (whose model opens it) and DeepSeek-V3 never. */
static int reply_thinking(int fmt, int thinking) {
    if (fmt == CHAT_FMT_R1) return 1;
    return (fmt == CHAT_FMT_XTML || fmt == CHAT_FMT_V31 || fmt == CHAT_FMT_K25) && thinking;
}

/* The state a <think> / </think> id moves a K2 or DeepSeek reply to, or -1 when
 * id is not one here: </think> ends the reasoning; <think> before any text opens
 * it (K2-Thinking's model opens it itself; R1 may repeat the prompt's). */
static int think_marker(const chat_ids *c, int32_t id, int st, size_t n_text) {
    if (c->fmt == CHAT_FMT_XTML || id < 0) return -1;
    if (id == c->think_end && st == P_THINK) return P_RESPONSE;
    if (id == c->think && n_text == 0 && (st == P_THINK || st == P_RESPONSE)) return P_THINK;
    return -1;
}

/* The end of the tag that starts at ids[i] (a marker, text ids, <|sep|>): the
 * index of its <|sep|>, n when cut off, or that of the special id that breaks it. */
static size_t tag_end(const tok *t, const chat_ids *c, const int32_t *ids, size_t n, size_t i) {
    size_t j = i + 1;
    while (j < n && ids[j] != c->sep && !tok_is_special(t, ids[j])) j++;
    return j;
}

/* One id of K3's tools channel (the state is P_TOOLS): everything up to
 * <|close|>tools<|sep|> is text for the tool-call parser, markers spelled out
 * as the follower hands them over; that closing tag ends the channel. Returns
 * the ids used. */
static int reply_tools(const tok *t, const chat_ids *c, const int32_t *ids, size_t n, size_t i, bytes *tools, bytes *tag, int *st,
                       size_t *used) {
    size_t j = ids[i] == c->close ? tag_end(t, c, ids, n, i) : n;
    int rc;
    tag->n = 0;
    if (j < n && ids[j] == c->sep && !(rc = add_ids(t, tag, ids + i + 1, j - i - 1)) && !(rc = bytes_add(tag, NULL, 0)) &&
        !strcmp(tag->s, "tools")) {
        *st = P_AFTER_RESPONSE;
        *used = j + 1 - i;
        return add_ids(t, tools, ids + i, j + 1 - i);
    }
    *used = 1;
    return add_ids(t, tools, ids + i, 1);
}

int chat_parse_reply(const tok *t, const int32_t *ids, size_t n, int thinking, chat_reply *out, char *err,
                     size_t errlen) {
    memset(out, 0, sizeof *out);
    chat_ids c;
    int rc = chat_ids_init(&c, t, err, errlen);
    if (rc) return rc;
    bytes think = {0}, resp = {0}, tag = {0}, tools = {0};
    const int in_tools = thinking == 2 && c.fmt == CHAT_FMT_XTML; /* a forced call's prefill opened the channel */
    thinking = !in_tools && reply_thinking(c.fmt, thinking);
    int st = in_tools ? P_TOOLS : thinking ? P_THINK : P_RESPONSE, has_tools = in_tools;
    size_t i = 0;
    while (i < n) {
        int32_t id = ids[i];
        if (id == c.eos || id == c.eom) {
            out->ended = 1;
            i++;
            break;
        }
        if (st == P_TOOLS) {
            size_t used;
            if ((rc = reply_tools(t, &c, ids, n, i, &tools, &tag, &st, &used))) {
                rc = base_fail(err, errlen, rc, "chat reply: id %d at %zu is not in the vocabulary (or out of memory)", id, i);
                goto fail;
            }
            i += used;
            continue;
        }
        int next = think_marker(&c, id, st, think.n + resp.n);
        if (next >= 0) {
            thinking |= next == P_THINK;
            st = next;
            i++;
            continue;
        }
        if (id == c.open || id == c.close) {
            /* a tag: marker, text ids, <|sep|> */
            size_t j = tag_end(t, &c, ids, n, i);
            if (j == n) { i = n; break; } /* cut off inside the tag */
            if (ids[j] != c.sep) {
                rc = base_fail(err, errlen, STRATA_EFORMAT, "chat reply: id %d inside a tag at %zu", ids[j], j);
                goto fail;
            }
            tag.n = 0;
            if ((rc = add_ids(t, &tag, ids + i + 1, j - i - 1)) || (rc = bytes_add(&tag, NULL, 0))) goto fail;
            int is_open = id == c.open;
            next = -1;
            if (!is_open && st == P_THINK && !strcmp(tag.s, "think")) next = P_AFTER_THINK;
            else if (is_open && st == P_AFTER_THINK && !strcmp(tag.s, "response")) next = P_RESPONSE;
            else if (!is_open && st == P_RESPONSE && !strcmp(tag.s, "response")) next = P_AFTER_RESPONSE;
            else if (!is_open && st == P_AFTER_RESPONSE && !strcmp(tag.s, "message")) next = P_CLOSED;
            else if (is_open && (st == P_AFTER_RESPONSE || st == P_AFTER_THINK) && !strcmp(tag.s, "tools")) next = P_TOOLS;
            if (next < 0) {
                rc = base_fail(err, errlen, STRATA_EFORMAT, "chat reply: unexpected %s%.40s%s at id %zu",
                               is_open ? "<|open|>" : "<|close|>", tag.s, "<|sep|>", i);
                goto fail;
            }
            if (next == P_TOOLS && (rc = add_ids(t, &tools, ids + i, j + 1 - i))) goto fail; /* the parser reads the opening too */
            has_tools |= next == P_TOOLS;
            st = next;
            i = j + 1;
            continue;
        }
        if (tok_is_special(t, id)) {
            rc = base_fail(err, errlen, STRATA_EFORMAT, "chat reply: stray control id %d at %zu", id, i);
            goto fail;
        }
        if (st != P_THINK && st != P_RESPONSE) {
            rc = base_fail(err, errlen, STRATA_EFORMAT, "chat reply: text outside a channel at id %zu", i);
            goto fail;
        }
        if ((rc = add_ids(t, st == P_THINK ? &think : &resp, ids + i, 1))) {
            rc = base_fail(err, errlen, rc, "chat reply: id %d at %zu is not in the vocabulary", id, i);
            goto fail;
        }
        i++;
    }
    if ((rc = bytes_add(&resp, NULL, 0)) || (thinking && (rc = bytes_add(&think, NULL, 0))) ||
        (has_tools && (rc = bytes_add(&tools, NULL, 0)))) {
        rc = base_fail(err, errlen, rc, "chat reply: out of memory");
        goto fail;
    }
    base_free(tag.s);
    out->reasoning = thinking ? think.s : NULL;
    out->reasoning_len = thinking ? think.n : 0;
    if (!thinking) base_free(think.s);
    out->content = resp.s;
    out->content_len = resp.n;
    out->tools = has_tools ? tools.s : NULL;
    out->tools_len = has_tools ? tools.n : 0;
    if (!has_tools) base_free(tools.s);
    out->closed = st == P_CLOSED || (c.fmt != CHAT_FMT_XTML && out->ended); /* K2, DeepSeek: the end id closes */
    out->n_used = i;
    return STRATA_OK;
fail:
    base_free(think.s);
    base_free(resp.s);
    base_free(tag.s);
    base_free(tools.s);
    return rc;
}

/* ===== following a reply as it is generated ===== */

#define FOLLOW_TAG_MAX 32 /* ids of one tag name; longer is not a tag */

struct chat_follow {
    const tok *t;
    chat_ids c;
    int st;                          /* P_* */
    int32_t tag[FOLLOW_TAG_MAX + 2]; /* the marker, the tag name ids, one more */
    int n_tag;                       /* 0: not inside a tag */
    int closed, ended;
    size_t n_text;                   /* text ids seen (a <think> after text is text) */
    tok_stream *ts;
    bytes out;                       /* text handed back when a broken tag is replayed */
};

int chat_follow_open(chat_follow **out, const tok *t, int thinking, char *err, size_t errlen) {
    *out = NULL;
    chat_follow *f = base_calloc(1, sizeof *f, MEM_TOK);
    if (!f) return base_fail(err, errlen, STRATA_ENOMEM, "chat: out of memory");
    int rc = chat_ids_init(&f->c, t, err, errlen);
    if (!rc && tok_stream_open(&f->ts, t)) rc = base_fail(err, errlen, STRATA_ENOMEM, "chat: out of memory");
    if (rc) { chat_follow_close(f); return rc; }
    f->t = t;
    f->st = thinking == 2 && f->c.fmt == CHAT_FMT_XTML ? P_TOOLS : reply_thinking(f->c.fmt, thinking) ? P_THINK : P_RESPONSE;
    *out = f;
    return STRATA_OK;
}

void chat_follow_close(chat_follow *f) {
    if (!f) return;
    tok_stream_close(f->ts);
    base_free(f->out.s);
    base_free(f);
}

int chat_follow_closed(const chat_follow *f) { return f->closed; }

static int follow_channel(const chat_follow *f) {
    return f->st == P_THINK ? CHAT_CH_THINK : f->st == P_RESPONSE ? CHAT_CH_RESPONSE : f->st == P_TOOLS ? CHAT_CH_TOOLS
                                                                                                       : CHAT_CH_NONE;
}

/* A tag that turned out not to be one: its ids are shown as text (specials as
 * their markers) so nothing the model wrote is silently dropped. */
static void follow_replay(chat_follow *f, const uint8_t **p, size_t *n) {
    f->out.n = 0;
    for (int i = 0; i < f->n_tag; i++) {
        const uint8_t *q;
        size_t qn;
        if (tok_stream_push(f->ts, f->tag[i], &q, &qn) == 0 && bytes_add(&f->out, q, qn)) break;
    }
    f->n_tag = 0;
    *p = (const uint8_t *)f->out.s;
    *n = f->out.n;
}

int chat_follow_push(chat_follow *f, int32_t id, int *channel, const uint8_t **p, size_t *n) {
    static const uint8_t empty[1];
    *p = empty;
    *n = 0;
    *channel = follow_channel(f);
    if (f->ended) return 1;
    if (f->n_tag) { /* inside a tag: collect up to <|sep|> */
        if (id != f->c.sep) {
            if (f->n_tag > FOLLOW_TAG_MAX || tok_is_special(f->t, id)) {
                f->tag[f->n_tag++] = id;
                follow_replay(f, p, n);
                return f->st == P_TOOLS ? 0 : STRATA_EFORMAT; /* the tools channel is text for its parser */
            }
            f->tag[f->n_tag++] = id;
            return 0;
        }
        bytes name = {0};
        int rc = add_ids(f->t, &name, f->tag + 1, (size_t)f->n_tag - 1);
        if (!rc) rc = bytes_add(&name, NULL, 0);
        int is_open = f->tag[0] == f->c.open, next = -1;
        if (!rc) {
            if (!is_open && f->st == P_THINK && !strcmp(name.s, "think")) next = P_AFTER_THINK;
            else if (is_open && f->st == P_AFTER_THINK && !strcmp(name.s, "response")) next = P_RESPONSE;
            else if (!is_open && f->st == P_RESPONSE && !strcmp(name.s, "response")) next = P_AFTER_RESPONSE;
            else if (!is_open && f->st == P_AFTER_RESPONSE && !strcmp(name.s, "message")) next = P_CLOSED;
            else if (is_open && (f->st == P_AFTER_RESPONSE || f->st == P_AFTER_THINK) && !strcmp(name.s, "tools"))
                next = P_TOOLS;
            else if (!is_open && f->st == P_TOOLS && !strcmp(name.s, "tools")) next = P_AFTER_RESPONSE;
        }
        base_free(name.s);
        const int tools_tag = next == P_TOOLS || f->st == P_TOOLS;
        if (next < 0 || tools_tag) { /* a tag of the tools channel (or not a tag): its text */
            const int was = f->st;
            f->tag[f->n_tag++] = id;
            if (next == P_TOOLS) f->st = P_TOOLS;
            *channel = follow_channel(f);
            follow_replay(f, p, n);
            if (next >= 0) f->st = next;
            return next >= 0 || was == P_TOOLS ? 0 : STRATA_EFORMAT;
        }
        f->n_tag = 0;
        f->st = next;
        f->closed = next == P_CLOSED;
        *channel = follow_channel(f);
        return 0;
    }
    if (id == f->c.eos || id == f->c.eom) {
        f->ended = 1;
        f->closed |= f->c.fmt != CHAT_FMT_XTML; /* K2, DeepSeek: the end id closes the turn */
        return 1;
    }
    int next = think_marker(&f->c, id, f->st, f->n_text);
    if (next >= 0) {
        f->st = next;
        *channel = follow_channel(f);
        return 0;
    }
    if (id == f->c.open || id == f->c.close) {
        f->tag[0] = id;
        f->n_tag = 1;
        return 0;
    }
    if (tok_stream_push(f->ts, id, p, n)) return STRATA_EINVAL;
    f->n_text++;
    if (f->st == P_TOOLS) return 0;
    return tok_is_special(f->t, id) || (f->st != P_THINK && f->st != P_RESPONSE) ? STRATA_EFORMAT : 0;
}

void chat_follow_flush(chat_follow *f, int *channel, const uint8_t **p, size_t *n) {
    *channel = follow_channel(f);
    tok_stream_flush(f->ts, p, n);
}
