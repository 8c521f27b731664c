/*
 * chat.h: the chat formats of the Kimi models, chosen by the checkpoint's own
 * tokenizer (its special tokens say which format the model was trained on):
 * Kimi K3's XTML (below) and the Kimi K2 / Kimi Linear format (CHAT_FMT_K2, at
 * the end of this comment).
 *
 * XTML (from the K3 checkpoint's encoding_k3.py):
 *
 * A message renders as
 *   <|open|>message role="ROLE"<|sep|>CONTENT<|close|>message<|sep|><|end_of_msg|>
 * An assistant message wraps its content in channels:
 *   <|open|>think<|sep|>REASONING<|close|>think<|sep|>
 *   <|open|>response<|sep|>CONTENT<|close|>response<|sep|>
 * (the think channel only when thinking is on). With thinking on, a first system
 * message of type "thinking-effort" states the effort (low, high or max; the
 * official encoder refuses "medium"). The generation prompt is
 *   <|open|>message role="assistant"<|sep|><|open|>think<|sep|>
 * or ...<|open|>response<|sep|> with thinking off.
 *
 * Kimi K2 / Kimi Linear (the released chat_template): each message is
 *   <|im_ROLE|>ROLE<|im_middle|>CONTENT<|im_end|>
 * with ROLE system, user or assistant (<|im_system|>, <|im_user|>, <|im_assistant|>),
 * no separator between messages and no [BOS]. A conversation that does not
 * start with a system message gets the default one first: "You are Kimi, an AI
 * assistant created by Moonshot AI." The generation prompt is
 *   <|im_assistant|>assistant<|im_middle|>
 * and the reply ends at <|im_end|> (or [EOS]). These models have no thinking
 * channel: the effort is ignored and earlier turns' reasoning is dropped.
 *
 * Control markers are encoded with special tokens allowed; every text piece
 * (tag names, attributes, user content) with special tokens disabled, so text
 * typed by a user ("<|open|>") can never become a control id.
 */
#ifndef STRATA_CHAT_H
#define STRATA_CHAT_H

#include <stddef.h>
#include <stdint.h>
#include "tok.h"
#include "tools.h"

/* CHAT_TOOL: a tool's result (tools.h says how each format renders it). */
enum chat_role { CHAT_SYSTEM = 0, CHAT_USER = 1, CHAT_ASSISTANT = 2, CHAT_TOOL = 3 };
/* CHAT_THINK_OFF: no effort message, no think channel (reasoning of earlier
 * assistant turns is dropped, as the official encoder does). */
enum chat_effort { CHAT_THINK_OFF = 0, CHAT_THINK_LOW = 1, CHAT_THINK_HIGH = 2, CHAT_THINK_MAX = 3 };

typedef struct chat_msg {
    int role;              /* CHAT_* */
    const char *content;   /* UTF-8 text, NUL-terminated, not NULL */
    const char *reasoning; /* assistant only; NULL renders an empty think channel */
    const chat_call *calls; /* assistant only: its tool calls in order (n_calls) */
    size_t n_calls;
    size_t call_of;        /* CHAT_TOOL: the call it answers, numbered 0, 1, ... over
                            * every call of the earlier assistant messages in order */
} chat_msg;


/* "low" | "high" | "max" | "off" -> CHAT_THINK_*, or -1 ("medium" included). */
int chat_effort_parse(const char *s);
const char *chat_effort_name(int effort);
const char *chat_role_name(int role);
int chat_role_parse(const char *s); /* "system" | "user" | "assistant" | "tool" -> CHAT_*, or -1 */

/* The chat formats (enum chat_fmt) and the tool types are tools.h's. */
/* DeepSeek (family-formats.md 2.2), each message's text as is:
 *   CHAT_FMT_DSV3  <｜begin▁of▁sentence｜>{system}<｜User｜>{q}<｜Assistant｜>{a}<｜end▁of▁sentence｜>
 *                  (system messages joined by a blank line); prompt <｜Assistant｜>.
 *   CHAT_FMT_R1    the same; history turns keep no reasoning; the prompt opens
 *                  it: <｜Assistant｜><think>\n. The model writes REASONING</think>ANSWER.
 *   CHAT_FMT_V31   history assistant turns <｜Assistant｜></think>{a}<｜end▁of▁sentence｜>;
 *                  prompt <｜Assistant｜><think> (effort not off) or
 *                  <｜Assistant｜></think> (off).
 * chat_ids_init tells them apart by tokenizer_config.json's chat_template
 * (tok_chat_template): "<｜Assistant｜></think>" in it -> V31, else "<think>" ->
 * R1, else DSV3; without a template, a <think> token -> R1. Markers are encoded as
 * added tokens, text with special tokens disabled (the non-special <think> and
 * </think> of R1/V3.1 tokenizers still match inside text, as Hugging Face does). */
/* Kimi K2 thinking variants (family-formats.md 2.1), the K2 format with <think>:
 *   CHAT_FMT_K2_THINKING  assistant turns before the last user message render
 *                  <think></think>CONTENT (reasoning dropped), those after it
 *                  <think>REASONING</think>CONTENT; the prompt ends at <|im_middle|>
 *                  and the model opens <think> itself.
 *   CHAT_FMT_K25   the same history; the prompt ends <think> (effort not off) or
 *                  <think></think> (off).
 * Chosen when a K2 tokenizer has <think> and </think>: K2.5 when its chat_template
 * (tokenizer_config.json's, else chat_template.jinja) writes <think> after its
 * last add_generation_prompt, K2 when it never writes <think>, else (no
 * template, or <think> in its history) K2-Thinking. */

/* The control ids of a tokenizer and the format they define. eom ends a
 * message (<|end_of_msg|>, <|im_end|> or <｜end▁of▁sentence｜>); the markers of
 * the other formats are -1. DeepSeek's <｜User｜> / <｜Assistant｜> are im_user /
 * im_assistant. */
typedef struct chat_ids {
    int fmt;                                 /* CHAT_FMT_* */
    int32_t open, close, sep, eom, eos, bos; /* bos/eos -1 when absent */
    int32_t im_system, im_user, im_assistant, im_middle; /* CHAT_FMT_K2, DeepSeek (user, assistant) */
    int32_t think, think_end;                /* <think>, </think>; -1 when absent */
} chat_ids;
/* XTML when <|open|>, <|close|>, <|sep|> and <|end_of_msg|> are special tokens
 * of t; else K2 when <|im_system|>, <|im_user|>, <|im_assistant|>, <|im_middle|>
 * and <|im_end|> are; else DeepSeek when <｜begin▁of▁sentence｜>,
 * <｜end▁of▁sentence｜>, <｜User｜> and <｜Assistant｜> are; else STRATA_EFORMAT
 * naming what is missing. */
int chat_ids_init(chat_ids *c, const tok *t, char *err, size_t errlen);

/* 1 for the DeepSeek formats; 1 for K2 and its thinking variants. */
int chat_fmt_is_ds(int fmt);
int chat_fmt_is_k2(int fmt);
/* Whether the generation prompt of fmt opens the reasoning at this effort (the
 * thinking argument of chat_parse_reply / chat_follow_open): XTML, V3.1 and K2.5
 * when effort is not off, R1 always, K2, K2-Thinking (its model opens <think>
 * itself) and DeepSeek-V3 never. */
int chat_fmt_thinking(int fmt, int effort);

/* Render flags. CHAT_GEN appends the generation prompt. CHAT_CONTINUE renders a
 * continuation of a conversation already rendered (no thinking-effort message):
 * a REPL with retained state appends each new user turn this way. */
enum { CHAT_GEN = 1, CHAT_CONTINUE = 2 };

/* Appends the ids of msgs (and the generation prompt with CHAT_GEN) to *ids / *n /
 * *cap (caller-owned MEM_TOK array, may be reallocated; see tok_encode_append).
 * Errors: STRATA_EINVAL for a bad role/effort or reasoning on a non-assistant
 * message, STRATA_EFORMAT if t lacks the control tokens, ENOMEM/EBUDGET. */
int chat_render(tok *t, const chat_msg *msgs, size_t n_msgs, int effort, int flags,
                int32_t **ids, size_t *n, size_t *cap, char *err, size_t errlen);
/* The same with declared tools (NULL or n_tools 0: none): the declaration
 * before the messages, the tool_choice option after them, and with CHAT_GEN and a
 * forced choice the opening of the call after the generation prompt
 * (tools_prefill). */
int chat_render_tools(tok *t, const chat_msg *msgs, size_t n_msgs, const chat_tools *tools, int effort, int flags,
                      int32_t **ids, size_t *n, size_t *cap, char *err, size_t errlen);
/* The same conversation as text (control markers spelled out) in the XTML
 * format (chat_render_text_fmt: in fmt). *out is MEM_TOK, NUL-terminated, caller
 * base_free()s it. */
int chat_render_text_fmt(int fmt, const chat_msg *msgs, size_t n_msgs, int effort, int flags,
                         char **out, size_t *len, char *err, size_t errlen);
int chat_render_text(const chat_msg *msgs, size_t n_msgs, int effort, int flags,
                     char **out, size_t *len, char *err, size_t errlen);
int chat_render_text_tools(int fmt, const chat_msg *msgs, size_t n_msgs, const chat_tools *tools, int effort, int flags,
                           char **out, size_t *len, char *err, size_t errlen);

/* A generated assistant turn, parsed. Strings are MEM_TOK, NUL-terminated; free
 * with chat_reply_free. */
typedef struct chat_reply {
    char *reasoning;      /* think channel text; NULL when thinking was off */
    size_t reasoning_len;
    char *content;        /* response channel text (never NULL after success) */
    size_t content_len;
    char *tools;          /* XTML's tools channel as text, markers spelled out, from
                           * <|open|>tools<|sep|> to <|close|>tools<|sep|> as far as
                           * written (with a prefilled channel, from where the prefill
                           * left it): what tools_parser_push reads; NULL: no channel */
    size_t tools_len;
    int closed;           /* 1: </response></message> closure was seen */
    int ended;            /* 1: an end id ([EOS] or <|end_of_msg|>) was seen */
    size_t n_used;        /* ids consumed, up to and including the end id */
} chat_reply;

/* Parses ids generated after the generation prompt (thinking selects which
 * prompt was used; 2: a forced call's prefill opened XTML's tools channel, as
 * chat_follow_open). Stops at the first [EOS] or <|end_of_msg|> (the released
 * model ends turns with [EOS], the template writes <|end_of_msg|>: both are
 * accepted). A turn that ends early (end id before the closure) or is cut off
 * (no end id) still parses, with closed/ended telling which. XTML's tools
 * channel (after the response or the think channel) is taken whole as text,
 * its control ids included, into tools. STRATA_EFORMAT for an out-of-order
 * channel tag or a stray control id outside the tools channel, with a message. */
int chat_parse_reply(const tok *t, const int32_t *ids, size_t n, int thinking, chat_reply *out,
                     char *err, size_t errlen);
void chat_reply_free(chat_reply *r);

/* Following a reply while it is generated (the REPL): the same state machine as
 * chat_parse_reply, one id at a time, with streaming UTF-8 decode. */
enum { CHAT_CH_NONE = 0, CHAT_CH_THINK = 1, CHAT_CH_RESPONSE = 2, CHAT_CH_TOOLS = 3 };
typedef struct chat_follow chat_follow;
/* thinking: whether the generation prompt opened the think channel; 2: it
 * opened the tools channel (a forced call's prefill, XTML). The tools channel's
 * text comes out with its tags spelled ("<|open|>call tool=...<|sep|>"),
 * from its opening tag to its closing one, for the tool-call parser (tools.h).
 * MEM_TOK. */
int chat_follow_open(chat_follow **out, const tok *t, int thinking, char *err, size_t errlen);
/* Feeds one generated id. *channel and *p / *n give text to show (valid until the
 * next call; may be empty). Returns 1 when the turn has ended (an end id), 0 to go
 * on, STRATA_EFORMAT when the reply breaks the format (the caller may stop or keep
 * going; the id is then shown as text in the current channel). */
int chat_follow_push(chat_follow *f, int32_t id, int *channel, const uint8_t **p, size_t *n);
/* Bytes still held by the UTF-8 decoder at the end of a turn. */
void chat_follow_flush(chat_follow *f, int *channel, const uint8_t **p, size_t *n);
int chat_follow_closed(const chat_follow *f); /* 1: </response></message> seen */
void chat_follow_close(chat_follow *f);

#endif
