/*
 * t_serve_anth.c: POST /v1/messages bodies -> requests (anth_parse), without a
 * server: tool_use / tool_result blocks land on the same representation the
 * OpenAI path fills (calls with their ids, tool messages with call_of), the
 * tool_choice shapes map onto auto / required / named / none, and refusals
 * name the field. The HTTP side (answers, events, the SDK) is
 * tests/serve/anthropic.mjs, run by t_serve.c.
 */
#include <string.h>
#include "serve/anthropic.h"
#include "test.h"

static int parse(request *r, const char *body, req_error *e) {
    return anth_parse(r, (const uint8_t *)body, strlen(body), e);
}

#define TOOLS "\"tools\":[{\"name\":\"get_weather\",\"description\":\"w\",\"input_schema\":{\"type\":\"object\"}," \
              "\"cache_control\":{\"type\":\"ephemeral\"}},{\"name\":\"get_time\",\"type\":\"custom\",\"input_schema\":{\"type\":\"object\"}}]"

TEST(serve_anth_tools) {
    request r;
    req_error e;
    /* a loop's history: two calls, their results (one an error, one as text
     * blocks) and a user text after them */
    const char *body = "{\"max_tokens\":9," TOOLS ",\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},"
                       "\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},"
                       "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Let me look.\"},"
                       "{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\",\"n\":[1, 2]}},"
                       "{\"type\":\"tool_use\",\"id\":\"toolu_b\",\"name\":\"get_time\",\"input\":{}}]},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_b\",\"content\":\"14:05\"},"
                       "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_a\",\"is_error\":true,"
                       "\"content\":[{\"type\":\"text\",\"text\":\"no \"},{\"type\":\"text\",\"text\":\"city\"}]},"
                       "{\"type\":\"text\",\"text\":\"And?\"}]}]}";
    CHECK_MSG(parse(&r, body, &e) == 0, "%s", e.message);
    CHECK(r.n_tools == 2 && !strcmp(r.tools[0].name, "get_weather") && !strcmp(r.tools[0].description, "w") &&
          !strcmp(r.tools[1].parameters, "{\"type\":\"object\"}") && !r.tools[0].strict);
    CHECK(r.tool_choice == STRATA_CHAT_TOOLS_REQUIRED && r.parallel_tools == 0);
    CHECK(r.n_msgs == 6);
    if (r.n_msgs == 6) {
        CHECK(r.msgs[0].role == STRATA_CHAT_SYSTEM && !strcmp(r.msgs[0].content, "S"));
        const req_msg *a = &r.msgs[2], *t1 = &r.msgs[3], *t2 = &r.msgs[4], *u = &r.msgs[5];
        CHECK(a->role == STRATA_CHAT_ASSISTANT && !strcmp(a->content, "Let me look.") && a->n_calls == 2);
        CHECK(a->n_calls == 2 && !strcmp(a->calls[0].name, "get_weather") && !strcmp(a->calls[0].args, "{\"city\":\"Paris\",\"n\":[1,2]}") &&
              !strcmp(a->call_ids[1], "toolu_b") && !strcmp(a->calls[1].args, "{}"));
        CHECK(t1->role == STRATA_CHAT_TOOL && t1->call_of == 1 && !strcmp(t1->content, "14:05"));
        CHECK(t2->role == STRATA_CHAT_TOOL && t2->call_of == 0 && !strcmp(t2->content, "Error: no city"));
        CHECK(u->role == STRATA_CHAT_USER && !strcmp(u->content, "And?"));
    }
    request_free(&r);

    /* results only: no empty user turn after them; named choice */
    body = "{\"max_tokens\":9," TOOLS ",\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_time\"},\"messages\":["
           "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"x\",\"name\":\"get_time\",\"input\":{}}]},"
           "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"x\"}]}]}";
    CHECK_MSG(parse(&r, body, &e) == 0, "%s", e.message);
    CHECK(r.n_msgs == 2 && r.msgs[1].role == STRATA_CHAT_TOOL && !strcmp(r.msgs[1].content, "") && r.tool_choice == STRATA_CHAT_TOOLS_NAMED &&
          !strcmp(r.tool_choice_name, "get_time") && r.parallel_tools == 1);
    request_free(&r);
    CHECK(parse(&r, "{\"max_tokens\":9," TOOLS ",\"tool_choice\":{\"type\":\"none\"},\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", &e) == 0 &&
          r.tool_choice == STRATA_CHAT_TOOLS_NONE);
    request_free(&r);
    CHECK(parse(&r, "{\"max_tokens\":9,\"tools\":[],\"tool_choice\":{\"type\":\"auto\"},\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", &e) == 0 &&
          r.tool_choice == STRATA_CHAT_TOOLS_AUTO && r.n_tools == 0);
    request_free(&r);

    /* refusals: each names its field, in Anthropic's error type */
    static const struct { const char *body, *param, *says; } bad[] = {
        {"{\"max_tokens\":9,\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "tool_choice", "needs 'tools'"},
        {"{\"max_tokens\":9," TOOLS ",\"tool_choice\":{\"type\":\"tool\",\"name\":\"nope\"},\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
         "tool_choice", "does not declare"},
        {"{\"max_tokens\":9," TOOLS ",\"tool_choice\":{\"type\":\"tool\"},\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "tool_choice", "needs a 'name'"},
        {"{\"max_tokens\":9," TOOLS ",\"tool_choice\":\"any\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "tool_choice", "must be"},
        {"{\"max_tokens\":9,\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}],\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "tools",
         "not supported"},
        {"{\"max_tokens\":9,\"tools\":[{\"name\":\"f\"}],\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "tools.input_schema", "no 'input_schema'"},
        {"{\"max_tokens\":9,\"tools\":[{\"name\":\"f g\",\"input_schema\":{}}],\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "tools.name", "1-64"},
        {"{\"max_tokens\":9,\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\",\"if\":{}},\"strict\":true}],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "tools.input_schema", "(strict)"},
        {"{\"max_tokens\":9,\"tools\":[{\"name\":\"f\",\"input_schema\":{},\"x\":1}],\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
         "tools", "unknown field 'x'"},
        {"{\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"x\",\"content\":\"r\"}]}]}",
         "messages.content", "names no tool_use"},
        {"{\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"x\",\"name\":\"f\",\"input\":{}}]}]}",
         "messages.content", "belong to assistant"},
        {"{\"max_tokens\":9,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"x\",\"name\":\"f\",\"input\":[]}]}]}",
         "messages.content", "'input' object"},
        {"{\"max_tokens\":9,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"x\",\"name\":\"f\",\"input\":{}}]},"
         "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"x\",\"content\":[{\"type\":\"image\"}]}]}]}",
         "messages.content", "text only"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(parse(&r, bad[i].body, &e) != 0 && e.status == 400 && !strcmp(e.param, bad[i].param) && strstr(e.message, bad[i].says),
                  "case %zu: %d %s: %s", i, e.status, e.param, e.message);
        request_free(&r);
    }
}
