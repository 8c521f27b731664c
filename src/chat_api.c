/*
 * chat_api.c: the "chat format" section of strata.h: the Kimi templates (chat.h)
 * and the streaming detokenizer (tok.h) behind public names. A strata_tokenizer
 * is a tok (tok_api.c); the public message, id and follower types are chat.h's
 * under other names, so the calls only cast.
 */
#include <stddef.h>
#include "chat.h"
#include "strata.h"
#include "tok.h"
#include "tools.h"

_Static_assert((int)STRATA_CHAT_SYSTEM == (int)CHAT_SYSTEM && (int)STRATA_CHAT_USER == (int)CHAT_USER &&
                   (int)STRATA_CHAT_ASSISTANT == (int)CHAT_ASSISTANT, "public roles are chat.h's");
_Static_assert((int)STRATA_CHAT_THINK_OFF == (int)CHAT_THINK_OFF && (int)STRATA_CHAT_THINK_LOW == (int)CHAT_THINK_LOW &&
                   (int)STRATA_CHAT_THINK_HIGH == (int)CHAT_THINK_HIGH && (int)STRATA_CHAT_THINK_MAX == (int)CHAT_THINK_MAX,
               "public efforts are chat.h's");
_Static_assert((int)STRATA_CHAT_GEN == (int)CHAT_GEN && (int)STRATA_CHAT_CONTINUE == (int)CHAT_CONTINUE,
               "public render flags are chat.h's");
_Static_assert((int)STRATA_CHAT_CH_NONE == (int)CHAT_CH_NONE && (int)STRATA_CHAT_CH_THINK == (int)CHAT_CH_THINK &&
                   (int)STRATA_CHAT_CH_RESPONSE == (int)CHAT_CH_RESPONSE, "public channels are chat.h's");
_Static_assert(sizeof(strata_chat_msg) == sizeof(chat_msg) && offsetof(strata_chat_msg, role) == offsetof(chat_msg, role) &&
                   offsetof(strata_chat_msg, content) == offsetof(chat_msg, content) &&
                   offsetof(strata_chat_msg, reasoning) == offsetof(chat_msg, reasoning) &&
                   offsetof(strata_chat_msg, calls) == offsetof(chat_msg, calls) &&
                   offsetof(strata_chat_msg, n_calls) == offsetof(chat_msg, n_calls) &&
                   offsetof(strata_chat_msg, call_of) == offsetof(chat_msg, call_of),
               "strata_chat_msg is laid out as chat_msg");
_Static_assert(sizeof(strata_chat_call) == sizeof(chat_call) && offsetof(strata_chat_call, args) == offsetof(chat_call, args),
               "strata_chat_call is laid out as chat_call");
_Static_assert(sizeof(strata_chat_tool) == sizeof(chat_tool) &&
                   offsetof(strata_chat_tool, description) == offsetof(chat_tool, description) &&
                   offsetof(strata_chat_tool, parameters) == offsetof(chat_tool, parameters) &&
                   offsetof(strata_chat_tool, strict) == offsetof(chat_tool, strict),
               "strata_chat_tool is laid out as chat_tool");
_Static_assert(sizeof(strata_chat_tools) == sizeof(chat_tools) && offsetof(strata_chat_tools, n_tools) == offsetof(chat_tools, n_tools) &&
                   offsetof(strata_chat_tools, choice) == offsetof(chat_tools, choice) &&
                   offsetof(strata_chat_tools, choice_name) == offsetof(chat_tools, choice_name) &&
                   offsetof(strata_chat_tools, parallel) == offsetof(chat_tools, parallel),
               "strata_chat_tools is laid out as chat_tools");
_Static_assert((int)STRATA_CHAT_TOOL == (int)CHAT_TOOL && (int)STRATA_CHAT_CH_TOOLS == (int)CHAT_CH_TOOLS &&
                   (int)STRATA_CHAT_FMT_DSV3 == (int)CHAT_FMT_DSV3 && (int)STRATA_CHAT_TOOLS_AUTO == (int)CHAT_TOOLS_AUTO &&
                   (int)STRATA_CHAT_TOOLS_NONE == (int)CHAT_TOOLS_NONE &&
                   (int)STRATA_CHAT_TOOLS_REQUIRED == (int)CHAT_TOOLS_REQUIRED &&
                   (int)STRATA_CHAT_TOOLS_NAMED == (int)CHAT_TOOLS_NAMED, "public tool constants are chat.h's");
_Static_assert((int)STRATA_CHAT_FMT_XTML == (int)CHAT_FMT_XTML && (int)STRATA_CHAT_FMT_K2 == (int)CHAT_FMT_K2 &&
                   (int)STRATA_CHAT_FMT_DSV3 == (int)CHAT_FMT_DSV3 && (int)STRATA_CHAT_FMT_R1 == (int)CHAT_FMT_R1 &&
                   (int)STRATA_CHAT_FMT_V31 == (int)CHAT_FMT_V31 &&
                   (int)STRATA_CHAT_FMT_K2_THINKING == (int)CHAT_FMT_K2_THINKING && (int)STRATA_CHAT_FMT_K25 == (int)CHAT_FMT_K25,
               "public chat formats are chat.h's");
_Static_assert(sizeof(strata_chat_ids) == sizeof(chat_ids) && offsetof(strata_chat_ids, fmt) == offsetof(chat_ids, fmt) &&
                   offsetof(strata_chat_ids, eom) == offsetof(chat_ids, eom) &&
                   offsetof(strata_chat_ids, im_middle) == offsetof(chat_ids, im_middle) &&
                   offsetof(strata_chat_ids, eos) == offsetof(chat_ids, eos) &&
                   offsetof(strata_chat_ids, bos) == offsetof(chat_ids, bos) &&
                   offsetof(strata_chat_ids, think_end) == offsetof(chat_ids, think_end),
               "strata_chat_ids is laid out as chat_ids");

static tok *T(strata_tokenizer *t) { return (tok *)t; }
static const tok *CT(const strata_tokenizer *t) { return (const tok *)t; }

int strata_chat_effort_parse(const char *s) { return chat_effort_parse(s); }
const char *strata_chat_effort_name(int effort) { return chat_effort_name(effort); }
int strata_chat_role_parse(const char *s) { return chat_role_parse(s); }

int strata_chat_ids_get(const strata_tokenizer *t, strata_chat_ids *out, char *err, size_t errlen) {
    return chat_ids_init((chat_ids *)out, CT(t), err, errlen);
}

int strata_chat_render(strata_tokenizer *t, const strata_chat_msg *msgs, size_t n_msgs, int effort, int flags,
                       int32_t **ids, size_t *n, size_t *cap, char *err, size_t errlen) {
    return chat_render(T(t), (const chat_msg *)msgs, n_msgs, effort, flags, ids, n, cap, err, errlen);
}

int strata_chat_render_tools(strata_tokenizer *t, const strata_chat_msg *msgs, size_t n_msgs,
                             const strata_chat_tools *tools, int effort, int flags, int32_t **ids, size_t *n,
                             size_t *cap, char *err, size_t errlen) {
    return chat_render_tools(T(t), (const chat_msg *)msgs, n_msgs, (const chat_tools *)tools, effort, flags, ids, n, cap,
                             err, errlen);
}

/* A strata_tool_parser is a tools_parser. */
int strata_tool_parser_open(strata_tool_parser **out, int fmt, const strata_chat_tools *tools, size_t calls_before,
                            char *err, size_t errlen) {
    return tools_parser_open((tools_parser **)out, fmt, (const chat_tools *)tools, calls_before, err, errlen);
}
int strata_tool_parser_push(strata_tool_parser *p, const char *s, size_t n, const char **content, size_t *content_n) {
    return tools_parser_push((tools_parser *)p, s, n, content, content_n);
}
int strata_tool_parser_flush(strata_tool_parser *p, const char **content, size_t *content_n) {
    return tools_parser_flush((tools_parser *)p, content, content_n);
}
size_t strata_tool_parser_n_calls(const strata_tool_parser *p) { return tools_parser_n_calls((const tools_parser *)p); }
const strata_chat_call *strata_tool_parser_call(const strata_tool_parser *p, size_t i) {
    return (const strata_chat_call *)tools_parser_call((const tools_parser *)p, i);
}
int strata_tool_parser_done(const strata_tool_parser *p) { return tools_parser_done((const tools_parser *)p); }
void strata_tool_parser_close(strata_tool_parser *p) { tools_parser_close((tools_parser *)p); }

int strata_chat_fmt_starts_thinking(int fmt, int effort) { return chat_fmt_thinking(fmt, effort); }
const char *strata_chat_fmt_name(int fmt) {
    static const char *const k[] = {"Kimi K3 (XTML)", "Kimi K2", "DeepSeek-V3", "DeepSeek-R1", "DeepSeek-V3.1",
                                    "Kimi K2-Thinking", "Kimi K2.5"};
    return fmt >= 0 && fmt < (int)(sizeof k / sizeof *k) ? k[fmt] : "unknown";
}
int strata_chat_fmt_reasons(int fmt, int effort) {
    return fmt == STRATA_CHAT_FMT_K2_THINKING || chat_fmt_thinking(fmt, effort);
}

/* A strata_chat_follow is a chat_follow. */
int strata_chat_follow_open(strata_chat_follow **out, const strata_tokenizer *t, int thinking, char *err,
                            size_t errlen) {
    return chat_follow_open((chat_follow **)out, CT(t), thinking, err, errlen);
}
int strata_chat_follow_push(strata_chat_follow *f, int32_t id, int *channel, const uint8_t **p, size_t *n) {
    return chat_follow_push((chat_follow *)f, id, channel, p, n);
}
void strata_chat_follow_flush(strata_chat_follow *f, int *channel, const uint8_t **p, size_t *n) {
    chat_follow_flush((chat_follow *)f, channel, p, n);
}
void strata_chat_follow_close(strata_chat_follow *f) { chat_follow_close((chat_follow *)f); }

/* A strata_detok is a tok_stream. */
int strata_detok_open(strata_detok **out, const strata_tokenizer *t) { return tok_stream_open((tok_stream **)out, CT(t)); }
int strata_detok_push(strata_detok *s, int32_t id, const uint8_t **p, size_t *n) {
    return tok_stream_push((tok_stream *)s, id, p, n);
}
void strata_detok_flush(strata_detok *s, const uint8_t **p, size_t *n) { tok_stream_flush((tok_stream *)s, p, n); }
void strata_detok_close(strata_detok *s) { tok_stream_close((tok_stream *)s); }
