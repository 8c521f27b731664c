/*
 * tools.h: tool calls in each chat format, rendered and parsed from ONE table
 * per format (tools.c, k_fmts): the renderer expands its templates and the
 * parser matches the same templates, so a correction is one edit.
 *
 * Template syntax: literal text, where "<|...|>" and "<｜...｜>" are control
 * markers (encoded with special tokens allowed; where the tokenizer lacks one it
 * becomes plain text, and the parser reads text anyway); "%|" ends a BPE segment
 * without adding bytes; placeholders %N tool name, %I call index, %K argument
 * key, %T argument type, %J the declaration JSON, %C content. The text between
 * two markers is one segment (one encode with special tokens disabled), as the
 * official templates encode it, so user text can never become a control id.
 *
 * The formats (docs/serve.md "Tool calls" lists every choice made here):
 * - K3 XTML (tech report appendix F): a system message of type "tool-declare"
 *   first; calls in a tools channel after the response channel, each
 *   <|open|>call tool="NAME" index="I"<|sep|> (I from 1 within the message) with
 *   typed arguments <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>
 *   (strings raw, other JSON values compact; arguments that are not an object
 *   with plain keys go in one <|open|>arguments type="json"<|sep|> block);
 *   results as messages of role "tool" repeating tool and index; tool_choice as a
 *   one-shot system message of type "tool-choice" after the input messages.
 * - Kimi K2 / Kimi Linear: <|im_system|>tool_declare<|im_middle|>JSON<|im_end|>
 *   first; calls functions.NAME:I (I counted from 0 over the conversation) in a
 *   <|tool_calls_section_begin|> ... section; results
 *   <|im_system|>tool<|im_middle|>## Return of functions.NAME:I\nCONTENT<|im_end|>.
 * - DeepSeek-V3: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
 *   ```json fenced arguments; outputs in <｜tool▁outputs▁begin｜>.
 */
#ifndef STRATA_TOOLS_H
#define STRATA_TOOLS_H

#include <stddef.h>

/* The chat formats (chat.h renders their messages and describes each). Tool
 * parts come in three families: XTML, K2's (K2, K2-Thinking, K2.5) and
 * DeepSeek-V3's (V3, R1, V3.1). */
enum chat_fmt { CHAT_FMT_XTML = 0, CHAT_FMT_K2 = 1, CHAT_FMT_DSV3 = 2, CHAT_FMT_R1 = 3, CHAT_FMT_V31 = 4,
                CHAT_FMT_K2_THINKING = 5, CHAT_FMT_K25 = 6 };

/* One tool call of an assistant turn, independent of any API's JSON shape (the
 * OpenAI and Anthropic front ends both fill it). */
typedef struct chat_call {
    const char *name;      /* a declared tool's name */
    const char *args;      /* the arguments as JSON text (an object, normally; any text renders) */
} chat_call;

/* A declared tool: its JSON-schema parameters as JSON text (NULL: none). */
typedef struct chat_tool {
    const char *name;        /* [A-Za-z0-9_-]{1,64} */
    const char *description; /* NULL: none */
    const char *parameters;  /* NULL: none */
    int strict;              /* 1: a forced call's arguments must follow parameters (toolgram.h) */
} chat_tool;

/* tool_choice: AUTO lets the model choose; NONE declares the tools but reads no
 * calls; REQUIRED and NAMED force a call by prefilling its opening. */
enum { CHAT_TOOLS_AUTO = 0, CHAT_TOOLS_NONE = 1, CHAT_TOOLS_REQUIRED = 2, CHAT_TOOLS_NAMED = 3 };
typedef struct chat_tools {
    const chat_tool *tools;  /* (n_tools) */
    size_t n_tools;
    int choice;              /* CHAT_TOOLS_* */
    const char *choice_name; /* NAMED: the tool */
    int parallel;            /* 0: at most one call per turn */
} chat_tools;

#define TOOLS_MAX_NAME 64            /* bytes of a tool name (OpenAI's limit) */
#define TOOLS_MAX_CALL_BYTES (4u << 20) /* one call's text; longer is not a call */

/* A segment sink: special 1 = control marker text, 0 = plain text. */
typedef void (*tools_seg_fn)(void *ud, const char *s, size_t n, int special);

/* 1 when name is [A-Za-z0-9_-]{1,64}. */
int tools_name_ok(const char *name);

/* Each returns STRATA_OK or STRATA_ENOMEM (from building the text). */
/* The declaration of every tool (a global option: before the input messages). */
int tools_emit_declare(int fmt, const chat_tools *tools, tools_seg_fn seg, void *ud);
/* tool_choice as a one-shot option after the input messages (XTML only; AUTO
 * renders nothing). */
int tools_emit_choice(int fmt, const chat_tools *tools, tools_seg_fn seg, void *ud);
/* The calls of one assistant turn; first: the conversation-wide number of its
 * first call (K2's index). */
int tools_emit_calls(int fmt, const chat_call *calls, size_t n, size_t first, tools_seg_fn seg, void *ud);
/* One tool result answering call `index` of its message (from 0) / `global`
 * (over the conversation); DSV3 groups consecutive results: first/last say
 * whether this one opens/closes the group. */
int tools_emit_result(int fmt, const char *name, size_t index, size_t global, const char *content, int first, int last,
                      tools_seg_fn seg, void *ud);
/* The forced opening of a call after the generation prompt (REQUIRED: up to the
 * name; NAMED: up to the arguments); nothing for AUTO and NONE. global: the
 * number of calls before it in the conversation. */
int tools_emit_prefill(int fmt, const chat_tools *tools, size_t global, tools_seg_fn seg, void *ud);

/* ---- the parts of a call, for the forced-call grammar (toolgram.h) ---- */
enum { TOOLS_SEC_OPEN, TOOLS_SEC_CLOSE, TOOLS_CALL_HEAD, TOOLS_CALL_HEAD_NAME /* call_head from the name on */,
       TOOLS_CALL_TAIL, TOOLS_ARG_HEAD, TOOLS_ARG_TAIL, TOOLS_JSON_HEAD, TOOLS_JSON_TAIL };
/* One part expanded (name, index, key, type fill its placeholders); STRATA_EINVAL
 * when the format has no such part (typed arguments outside XTML). */
int tools_expand_part(int fmt, int part, const char *name, size_t index, const char *key, const char *type,
                      tools_seg_fn seg, void *ud);
/* %I of the k-th call (from 0) of a turn after calls_before calls. */
size_t tools_call_index(int fmt, size_t calls_before, size_t k);
/* 1: arguments as typed blocks (XTML), 0: as JSON text. */
int tools_typed(int fmt);

/* ---- parsing generated text ----
 * A streaming parser over the reply's text (the response and tools channels,
 * control markers spelled as text). Text outside a call section is content
 * (a tail that may start a section is held back until it is known). A call is
 * handed out once it is complete and well formed (a declared name, arguments
 * that parse as a JSON object); anything else, a truncated section included,
 * comes back as content at the end. With a forced choice (tools_parser_open's
 * prefill), a first call cut short is handed out when its name is a declared
 * tool, its arguments as written; an undeclared name is content (never
 * relabelled: the forced-call grammar, toolgram.h, writes declared names). */
typedef struct tools_parser tools_parser;
/* tools: copied (names only). calls_before: the calls in the history (K2's
 * index of the prefill). MEM_TOK. */
int tools_parser_open(tools_parser **out, int fmt, const chat_tools *tools, size_t calls_before, char *err,
                      size_t errlen);
/* Feeds text; *content / *n: content ready to show (valid until the next call).
 * STRATA_OK or STRATA_ENOMEM. */
int tools_parser_push(tools_parser *p, const char *s, size_t n, const char **content, size_t *content_n);
/* The end of the turn: whatever is held comes out as content (or as the forced
 * call). */
int tools_parser_flush(tools_parser *p, const char **content, size_t *content_n);
size_t tools_parser_n_calls(const tools_parser *p);
const chat_call *tools_parser_call(const tools_parser *p, size_t i);
/* 1 when no more calls are wanted (parallel off and one call handed out). */
int tools_parser_done(const tools_parser *p);
void tools_parser_close(tools_parser *p);

#endif
