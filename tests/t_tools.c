/*
 * t_tools.c: tool calls in the chat formats (src/text/tools.c): rendered calls
 * parse back to the same calls in every format, fed whole or byte by byte;
 * what is not a well-formed call comes back as content, byte for byte; hostile
 * text (huge arguments, unterminated sections, nested markers) neither fails
 * nor crashes; the golden text of a K3 and a K2 conversation with tools.
 */
#include <stdlib.h>
#include <string.h>
#include "chat.h"
#include "test.h"
#include "tools.h"

static void sink(void *ud, const char *s, size_t n, int special) { sbuf_printf(ud, "%.*s", (int)n, s); }

static const chat_tool k_tools[] = {
    {"get_weather", "Weather of a city", "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}", 0},
    {"get_time", NULL, NULL, 0},
};
static const chat_tools k_auto = {k_tools, 2, CHAT_TOOLS_AUTO, NULL, 1};
static const chat_call k_calls[] = {
    {"get_weather", "{\"city\":\"Paris \\\"16e\\\"\\n\",\"days\":2,\"opts\":{\"units\":[\"C\",null]},\"ok\":true}"},
    {"get_time", "{\"tz\":\"CET\"}"},
};

/* Parses text (in pieces of `step` bytes; 0: whole) and returns the content;
 * the calls stay in *pp (caller closes). */
static char *parse(int fmt, const chat_tools *tools, const char *text, size_t len, size_t step, tools_parser **pp) {
    char err[256];
    tools_parser *p = NULL;
    CHECK_MSG(tools_parser_open(&p, fmt, tools, 0, err, sizeof err) == 0, "%s", err);
    sbuf out = {0};
    const char *c;
    size_t cn;
    for (size_t i = 0; i < len;) {
        size_t k = step && len - i > step ? step : len - i;
        CHECK(tools_parser_push(p, text + i, k, &c, &cn) == 0);
        sbuf_printf(&out, "%.*s", (int)cn, c);
        i += k;
    }
    CHECK(tools_parser_flush(p, &c, &cn) == 0);
    sbuf_printf(&out, "%.*s", (int)cn, c);
    *pp = p;
    if (!out.s) sbuf_printf(&out, "%s", "");
    return out.s;
}

TEST(tools_round_trip) {
    for (int fmt = 0; fmt < 3; fmt++) {
        sbuf t = {0};
        sbuf_printf(&t, "Let me check. ");
        CHECK(tools_emit_calls(fmt, k_calls, 2, 0, sink, &t) == 0);
        for (size_t step = 0; step < 4; step += 1 + 2 * step) {
            tools_parser *p;
            char *content = parse(fmt, &k_auto, t.s, t.len, step, &p);
            CHECK_MSG(!strcmp(content, "Let me check. "), "fmt %d step %zu: content '%s' of %s", fmt, step, content, t.s);
            CHECK_MSG(tools_parser_n_calls(p) == 2, "fmt %d: %zu calls from %s", fmt, tools_parser_n_calls(p), t.s);
            for (size_t i = 0; i < 2 && i < tools_parser_n_calls(p); i++) {
                const chat_call *c = tools_parser_call(p, i);
                CHECK_MSG(!strcmp(c->name, k_calls[i].name) && !strcmp(c->args, k_calls[i].args), "fmt %d call %zu: %s %s", fmt, i,
                          c->name, c->args);
            }
            base_free(content);
            tools_parser_close(p);
        }
        base_free(t.s);
    }
}

TEST(tools_golden) {
    chat_call one[] = {{"get_time", "{\"tz\":\"CET\"}"}};
    chat_msg m[] = {{.role = CHAT_USER, .content = "Time?"},
                    {.role = CHAT_ASSISTANT, .content = "", .calls = one, .n_calls = 1},
                    {.role = CHAT_TOOL, .content = "14:05", .call_of = 0}};
    const chat_tools req = {k_tools + 1, 1, CHAT_TOOLS_REQUIRED, NULL, 1};
    char *out, err[256];
    size_t len;
    CHECK_MSG(chat_render_text_tools(CHAT_FMT_XTML, m, 3, &req, CHAT_THINK_OFF, CHAT_GEN, &out, &len, err, sizeof err) == 0, "%s", err);
    const char *want_xtml =
        "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|>[{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]"
        "<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"user\"<|sep|>Time?<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|><|close|>response<|sep|>"
        "<|open|>tools<|sep|><|open|>call tool=\"get_time\" index=\"1\"<|sep|>"
        "<|open|>argument key=\"tz\" type=\"string\"<|sep|>CET<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
        "<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"get_time\" index=\"1\"<|sep|>14:05<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"system\" type=\"tool-choice\"<|sep|>Call one or more tools in this response."
        "<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|><|close|>response<|sep|>"
        "<|open|>tools<|sep|><|open|>call tool=\"";
    CHECK_MSG(out && !strcmp(out, want_xtml), "\n got: %s\nwant: %s", out, want_xtml);
    base_free(out);
    const chat_tools named = {k_tools + 1, 1, CHAT_TOOLS_NAMED, "get_time", 1};
    CHECK(chat_render_text_tools(CHAT_FMT_K2, m, 3, &named, CHAT_THINK_OFF, CHAT_GEN, &out, &len, err, sizeof err) == 0);
    const char *want_k2 =
        "<|im_system|>tool_declare<|im_middle|>[{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]<|im_end|>"
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
        "<|im_user|>user<|im_middle|>Time?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
        "<|tool_call_argument_begin|>{\"tz\":\"CET\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_time:0\n14:05<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:1"
        "<|tool_call_argument_begin|>";
    CHECK_MSG(out && !strcmp(out, want_k2), "\n got: %s\nwant: %s", out, want_k2);
    base_free(out);
    /* a result for a call that does not exist, calls on a user turn */
    chat_msg bad[] = {{.role = CHAT_USER, .content = "x"}, {.role = CHAT_TOOL, .content = "r", .call_of = 0}};
    CHECK(chat_render_text_tools(CHAT_FMT_K2, bad, 2, &k_auto, 0, 0, &out, &len, err, sizeof err) == STRATA_EINVAL && strstr(err, "answers call"));
    chat_msg bad2[] = {{.role = CHAT_USER, .content = "x", .calls = one, .n_calls = 1}};
    CHECK(chat_render_text_tools(CHAT_FMT_XTML, bad2, 1, &k_auto, 0, 0, &out, &len, err, sizeof err) == STRATA_EINVAL);
}

/* Each of these is returned as content, byte for byte, and hands out no call. */
TEST(tools_malformed_is_content) {
    static const char *const bad[][2] = {
        {"1", "x<|tool_calls_section_begin|><|tool_call_begin|>functions.rm_rf:0<|tool_call_argument_begin|>{}<|tool_call_end|>"},
        {"1", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{\"a\":<|tool_call_end|>"},
        {"1", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>[1]<|tool_call_end|>"},
        {"1", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{\"a\":1"},
        {"1", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_<|tool_call_begin|>time:0"},
        {"1", "<|tool_calls_section_begin|><|tool_calls_section_begin|>"},
        {"1", "<|tool_calls_sec"},
        {"0", "<|open|>tools<|sep|><|open|>call tool=\"get_time\" index=\"1\"<|sep|><|open|>argument key=\"n\" type=\"integer\"<|sep|>12x"
              "<|close|>argument<|sep|><|close|>call<|sep|>"},
        {"0", "<|open|>tools<|sep|><|open|>call tool=\"get_time\" index=\"1\"<|sep|>free text<|close|>call<|sep|>"},
        {"0", "<|open|>tools<|sep|><|open|>call tool=\"get_time\" index=\"one\"<|sep|>"},
        {"0", "<|open|>tools<|sep|><|open|>call tool=\"get_time\" index=\"1\"<|sep|><|open|>argument key=\"a\" type=\"string\"<|sep|>"
              "<|open|>tools<|sep|><|close|>call<|sep|>"},
        {"2", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n``<｜tool▁call▁end｜>"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        for (size_t step = 0; step < 2; step++) {
            tools_parser *p;
            const char *t = bad[i][1];
            char *content = parse(atoi(bad[i][0]), &k_auto, t, strlen(t), step, &p);
            CHECK_MSG(!strcmp(content, t) && tools_parser_n_calls(p) == 0, "case %zu step %zu: %zu calls, content '%s'", i, step,
                      tools_parser_n_calls(p), content);
            base_free(content);
            tools_parser_close(p);
        }
}

TEST(tools_hostile) {
    /* huge arguments: over the bound, the whole text comes back as content */
    const size_t big = TOOLS_MAX_CALL_BYTES + 1000;
    const char *head = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{\"a\":\"";
    char *t = base_alloc(strlen(head) + big + 64, MEM_MISC);
    strcpy(t, head);
    memset(t + strlen(head), 'x', big);
    strcpy(t + strlen(head) + big, "\"}<|tool_call_end|><|tool_calls_section_end|>");
    tools_parser *p;
    char *content = parse(CHAT_FMT_K2, &k_auto, t, strlen(t), 4096, &p);
    CHECK(tools_parser_n_calls(p) == 0 && !strcmp(content, t));
    base_free(content);
    tools_parser_close(p);
    /* just under the bound it is a call */
    t[strlen(head) + 1000] = 0;
    strcat(t, "\"}<|tool_call_end|>");
    content = parse(CHAT_FMT_K2, &k_auto, t, strlen(t), 0, &p);
    CHECK(tools_parser_n_calls(p) == 1 && !strcmp(content, "") && strlen(tools_parser_call(p, 0)->args) == 1008);
    base_free(content);
    tools_parser_close(p);
    base_free(t);
    /* a parallel-off parser takes one call; the second is content */
    chat_tools one = k_auto;
    one.parallel = 0;
    sbuf s = {0};
    CHECK(tools_emit_calls(CHAT_FMT_XTML, k_calls, 2, 0, sink, &s) == 0);
    content = parse(CHAT_FMT_XTML, &one, s.s, s.len, 1, &p);
    CHECK(tools_parser_n_calls(p) == 1 && tools_parser_done(p) && strstr(content, "get_time"));
    base_free(content);
    tools_parser_close(p);
    base_free(s.s);
}

/* A forced choice yields its call when the model wrote a declared name; any
 * other name is never relabelled (the forced-call grammar writes only declared
 * names): that text is content, without the prefill, which is the prompt's. */
TEST(tools_forced) {
    const chat_tools req = {k_tools, 2, CHAT_TOOLS_REQUIRED, NULL, 1}, named = {k_tools, 2, CHAT_TOOLS_NAMED, "get_time", 1};
    static const char *const garbage[] = {"", "get_w", "zz\x01<|open|>", "get_time\" index=\"1\"<|sep|><|open|>argument key=\"tz\" type=\"string\"<|sep|>UTC"};
    for (int fmt = 0; fmt < 2; fmt++)
        for (size_t i = 0; i < sizeof garbage / sizeof *garbage; i++)
            for (int k = 0; k < 2; k++) {
                tools_parser *p;
                char *content = parse(fmt, k ? &named : &req, garbage[i], strlen(garbage[i]), 1, &p);
                const chat_call *c = tools_parser_call(p, 0);
                /* named: the prefill wrote the name; required: only case 3 (XTML) names a tool */
                const int want = k || (fmt == 0 && i == 3);
                CHECK_MSG((int)tools_parser_n_calls(p) == want, "fmt %d case %zu named %d: %zu calls", fmt, i, k, tools_parser_n_calls(p));
                if (c) CHECK(!strcmp(c->name, k ? "get_time" : "get_time"));
                if (c && fmt == 0 && !k && i == 3) CHECK_MSG(!strcmp(c->args, "{\"tz\":\"UTC\"}"), "%s", c->args);
                if (!want) CHECK_MSG(!strcmp(content, garbage[i]), "fmt %d case %zu: content '%s'", fmt, i, content);
                base_free(content);
                tools_parser_close(p);
            }
}
