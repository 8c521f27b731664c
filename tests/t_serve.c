/*
 * t_serve.c: `strata serve`.
 *   serve_request: the request parser on valid and hostile bodies (status and
 *                  the field named), UTF-8 cleaning.
 *   serve_http:    a server on a generated tiny model (loopback, free port):
 *                  raw HTTP for malformed inputs, 401, 413, shapes of every
 *                  endpoint, metrics; the official openai npm client
 *                  (tests/serve/client.mjs: chat/completions, streams, stop
 *                  strings, usage, typed errors, concurrent == solo) against a
 *                  server with a prefix cache (RAM and --cache-dir); then
 *                  tests/serve/prefix.mjs against it and a fresh server without
 *                  one that speculates (--spec 3): second turns equal the fresh
 *                  server's answers, speculating streams equal plain ones;
 *                  tests/serve/schema.mjs on both (structured output: ajv
 *                  validates every json_schema answer, concurrent == solo);
 *                  SIGTERM exits 0.
 *   serve_page:    the web page in headless chromium (tests/serve/page.mjs):
 *                  a message streams a reply, Stop ends it and frees the
 *                  sequence, failed turns (401, over the context) are taken
 *                  back; skipped with the reason when no browser starts.
 *   serve_hostile: issue 38's probe: 405 Allow, JSON 431, empty body, two
 *                  Content-Lengths, the model id of DIR/., a budget below the
 *                  minimum (exit 2), a second server on a held --cache-dir.
 *   serve_slow_clients: 200 trickling connections lock nobody out; the
 *                  request deadline (408); 503 beyond --max-conns.
 *   serve_limits:  --parallel 1 --queue 0 with slowed steps: 429 + Retry-After
 *                  while the slot is busy, a dropped stream frees its slot at
 *                  once, a partial request times out without holding the slot,
 *                  SIGTERM with a stream in flight.
 *   The issue-42 suites (serve_choices, serve_progress) and the tool and
 *   reasoning formats (serve_tools, serve_reasoning_formats) are t_serve_api.c's;
 *   the server and client helpers both use are serve_test.h's.
 * Every wait is bounded; the server is always killed at the end.
 */
#include <errno.h>
#include <math.h>
#include <time.h>
#include "serve_test.h"

/* ===== the parser ===== */

static int parse_status(int kind, const char *body, const char *want_param) {
    request r;
    req_error e;
    int rc = request_parse(&r, kind, (const uint8_t *)body, strlen(body), &e);
    request_free(&r);
    if (rc == 0) return 200;
    if (want_param && strcmp(e.param, want_param)) {
        fprintf(stderr, "  param '%s' (want '%s') for %s: %s\n", e.param, want_param, body, e.message);
        return -1;
    }
    CHECK(e.message[0] != 0 && e.type[0] != 0);
    return e.status;
}

TEST(serve_request) {
    const int C = REQ_CHAT, P = REQ_COMPLETION;
    CHECK(parse_status(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", NULL) == 200);
    CHECK(parse_status(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                          "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"r\"}],"
                          "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":-1,\"min_p\":0.1,\"seed\":-5,\"stop\":[\"a\",\"b\"],\"n\":1,"
                          "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_completion_tokens\":9,"
                          "\"frequency_penalty\":0,\"logprobs\":false,\"user\":\"u\",\"reasoning_effort\":\"none\",\"max_tokens\":null}", NULL) == 200);
    /* what clients send by default (issue 42, item 7): accepted */
    CHECK(parse_status(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":\"text\"},\"tools\":[],"
                          "\"tool_choice\":\"none\",\"parallel_tool_calls\":true,\"store\":false,\"metadata\":{\"a\":\"b\"},\"user\":\"u\","
                          "\"reasoning_effort\":\"medium\",\"n\":3,\"logprobs\":true,\"top_logprobs\":20}", NULL) == 200);
    CHECK(parse_status(P, "{\"prompt\":\"x\",\"logprobs\":5,\"n\":2}", NULL) == 200);
    {
        request r;
        req_error e;
        const char *b0 = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"minimal\",\"logprobs\":true,\"top_logprobs\":3}";
        CHECK(request_parse(&r, C, (const uint8_t *)b0, strlen(b0), &e) == 0 && r.effort == STRATA_CHAT_THINK_LOW && r.go.logprobs == 1 &&
              r.go.top_logprobs == 3 && !r.has_seed && r.n == 1);
        request_free(&r);
        CHECK(req_effort("medium") == STRATA_CHAT_THINK_HIGH && req_effort("none") == STRATA_CHAT_THINK_OFF && req_effort("max") == STRATA_CHAT_THINK_MAX);
    }
    {
        request r;
        req_error e;
        const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":7,\"max_completion_tokens\":5,"
                        "\"stop\":\"END\",\"seed\":3,\"reasoning_effort\":\"low\"}";
        CHECK(request_parse(&r, C, (const uint8_t *)b, strlen(b), &e) == 0);
        CHECK(r.max_tokens == 5 && r.n_stop == 1 && r.stop_len[0] == 3 && r.go.seed == 3 && r.effort == 1 && r.n_msgs == 1);
        request_free(&r);
        b = "{\"prompt\":[[1,2,3]]}";
        CHECK(request_parse(&r, P, (const uint8_t *)b, strlen(b), &e) == 0);
        CHECK(r.has_ids && r.n_ids == 3 && r.ids[2] == 3);
        request_free(&r);
        b = "{\"prompt\":\"a\\u0000b\"}";
        CHECK(request_parse(&r, P, (const uint8_t *)b, strlen(b), &e) == 0);
        CHECK(r.text_len == 3 && r.effort == REQ_DEFAULT_EFFORT && r.go.seed == REQ_DEFAULT_SEED);
        request_free(&r);
    }
    /* refusals, each naming its field */
    static const struct { int kind; const char *body, *param; int status; } bad[] = {
        {REQ_CHAT, "{\"messages\":[]}", "messages", 400},
        {REQ_CHAT, "{}", "messages", 400},
        {REQ_CHAT, "[1]", "", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}", "temperature", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", "temperature", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":0}", "top_p", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", "max_tokens", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", "max_tokens", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":true}", "max_tokens", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":17}", "n", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":21,\"logprobs\":true}", "top_logprobs", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "top_logprobs", 400},
        {REQ_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":6}", "logprobs", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}", "response_format", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"presence_penalty\":0.5}", "presence_penalty", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", "logprobs", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}", "stop", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{\"include_usage\":true}}", "stream_options", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"extreme\"}", "reasoning_effort", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{}]}", "tools", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temprature\":1}", "temprature", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages.tool_call_id", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", "messages.role", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"a b\"}}]}]}",
         "messages.tool_calls.function.name", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[],\"tool_choice\":\"required\"}", "tool_choice", 400},
        {REQ_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages.role", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", "messages.content", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages.content", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"reasoning_content\":\"r\"}]}", "messages.reasoning_content", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":99999999999999999999999}", "", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1e999}", "", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"a\":1,\"a\":2}", "", 400},
        {REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", "", 400},
        {REQ_COMPLETION, "{\"prompt\":[1,-2]}", "prompt", 400},
        {REQ_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt", 400},
        {REQ_COMPLETION, "{\"prompt\":{}}", "prompt", 400},
        {REQ_COMPLETION, "{\"prompt\":\"x\",\"echo\":true}", "echo", 400},
        {REQ_COMPLETION, "{\"prompt\":\"x\",\"suffix\":\"y\"}", "suffix", 400},
        {REQ_COMPLETION, "{\"prompt\":\"x\",\"messages\":[]}", "messages", 400},
        {REQ_TOKENIZE, "{\"content\":1}", "content", 400},
        {REQ_DETOKENIZE, "{\"tokens\":[1,\"a\"]}", "tokens", 400},
        {REQ_DETOKENIZE, "{}", "tokens", 400},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(parse_status(bad[i].kind, bad[i].body, bad[i].param) == bad[i].status, "case %zu: %s", i, bad[i].body);
    /* deep nesting and a body that is not JSON at all */
    size_t depth = 100000;
    char *deep = base_alloc(2 * depth + 1, MEM_MISC);
    memset(deep, '[', depth);
    memset(deep + depth, ']', depth);
    deep[2 * depth] = 0;
    CHECK(parse_status(REQ_CHAT, deep, "") == 400);
    base_free(deep);
    CHECK(parse_status(REQ_CHAT, "", "") == 400);
    {
        /* an empty body says so (jansson alone: "line -1 column -1"); the
         * repetition_penalty range says what it takes */
        request r;
        req_error e;
        CHECK(request_parse(&r, REQ_CHAT, (const uint8_t *)" \r\n", 3, &e) != 0 && strstr(e.message, "empty request body") &&
              !strstr(e.message, "-1"));
        request_free(&r);
        const char *b0 = "{\"prompt\":\"x\",\"repetition_penalty\":0}";
        CHECK(request_parse(&r, P, (const uint8_t *)b0, strlen(b0), &e) != 0 && !strcmp(e.param, "repetition_penalty") &&
              strstr(e.message, "(0, 100]"));
        request_free(&r);
        b0 = "{\"prompt\":\"x\",\"repetition_penalty\":100}";
        CHECK(request_parse(&r, P, (const uint8_t *)b0, strlen(b0), &e) == 0 && r.go.repeat_penalty == 100);
        request_free(&r);
        b0 = "{\"prompt\":\"x\",\"repetition_penalty\":100.5}";
        CHECK(request_parse(&r, P, (const uint8_t *)b0, strlen(b0), &e) != 0 && strstr(e.message, "(0, 100]"));
        request_free(&r);
    }
    CHECK(parse_status(REQ_CHAT, "{\"messages\":", "") == 400);

    /* UTF-8 cleaning: valid text unchanged, each bad byte -> U+FFFD */
    req_buf b = {0};
    req_buf_add_utf8(&b, "a\xc3\xa9z\xff\xe2\x82", 7);
    CHECK(b.n == strlen("a\xc3\xa9z\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd") && !memcmp(b.p, "a\xc3\xa9z\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", b.n));
    req_buf_free(&b);
    req_buf_add_utf8(&b, "\xed\xa0\x80\xf4\x90\x80\x80\xc0\xaf", 9); /* surrogate, > U+10FFFF, overlong */
    CHECK(b.n == 9 * 3);
    req_buf_free(&b);
    CHECK(req_utf8_valid_prefix("ab\xe2\x82", 4) == 2);
}

TEST(serve_http) {
    const char *dir = serve_model();
    CHECK(dir != NULL);
    if (!dir) return;
    server s;
    char cache_dir[600];
    snprintf(cache_dir, sizeof cache_dir, "%s/serve_cache", t_tmpdir);
    const char *const args[] = {"--parallel", "4", "--api-key", KEY, "--ctx", "512", "--max-body", "64K", "--cache-dir", cache_dir, NULL};
    if (server_up(&s, dir, "1", args)) return;
    req_buf b;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4}";

    /* auth */
    CHECK(post(s.port, "/v1/chat/completions", NULL, chat, &b) == 401 && is_error(&b, NULL) && strstr(b.p, "WWW-Authenticate"));
    req_buf_free(&b);
    CHECK(post(s.port, "/v1/chat/completions", "wrong", chat, &b) == 401 && is_error(&b, NULL));
    req_buf_free(&b);
    CHECK(http(s.port, "GET", "/v1/models", "test-key-12", NULL, 0, &b) == 401);
    req_buf_free(&b);
    /* hostile bodies: 400 each, and the server goes on */
    static const char *const bad[] = {
        "{", "nope", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", "{\"messages\":1e999999}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":123456789012345678901234567890}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":600}", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":5}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(post(s.port, "/v1/chat/completions", KEY, bad[i], &b) == 400 && is_error(&b, NULL), "%s -> %s", bad[i], b.p ? b.p : "");
        req_buf_free(&b);
    }
    {
        size_t depth = 20000;
        char *deep = base_alloc(depth * 2 + 1, MEM_MISC);
        memset(deep, '[', depth);
        memset(deep + depth, ']', depth);
        deep[2 * depth] = 0;
        CHECK(post(s.port, "/v1/completions", KEY, deep, &b) == 400 && is_error(&b, NULL));
        req_buf_free(&b);
        base_free(deep);
    }
    /* the context limit names the field */
    CHECK(post(s.port, "/v1/chat/completions", KEY, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":500}", &b) == 400 &&
          is_error(&b, "max_tokens") && strstr(b.p, "context_length_exceeded"));
    req_buf_free(&b);
    /* body limit (64K here): 413 from Content-Length, and a chunked body over it closes the connection */
    {
        size_t n = 70000;
        char *big = base_alloc(n + 1, MEM_MISC);
        memset(big, ' ', n);
        big[n] = 0;
        big[0] = '{';
        big[n - 1] = '}';
        CHECK(post(s.port, "/v1/chat/completions", KEY, big, &b) == 413 && is_error(&b, NULL));
        req_buf_free(&b);
        base_free(big);
    }
    CHECK(post(s.port, "/v1/nothing", KEY, "{}", &b) == 404 && is_error(&b, NULL));
    req_buf_free(&b);
    CHECK(http(s.port, "GET", "/v1/chat/completions", KEY, NULL, 0, &b) == 405 && is_error(&b, NULL));
    req_buf_free(&b);
    CHECK(http(s.port, "GET", "/v1/models/serve_tiny", KEY, NULL, 0, &b) == 200 && strstr(b.p, "\"id\":\"serve_tiny\""));
    req_buf_free(&b);
    CHECK(http(s.port, "GET", "/v1/models/other", KEY, NULL, 0, &b) == 404 && is_error(&b, "model"));
    req_buf_free(&b);
    /* tokenize <-> detokenize */
    CHECK(post(s.port, "/tokenize", KEY, "{\"content\":\"hello world\"}", &b) == 200);
    {
        const char *t = body_of(&b);
        json_t *j = jsonx_load((const uint8_t *)t, strlen(t), "tokenize", NULL, 0);
        json_t *ids = json_object_get(j, "tokens");
        CHECK(json_is_array(ids) && json_array_size(ids) > 0 && json_integer_value(json_object_get(j, "count")) == (json_int_t)json_array_size(ids));
        char *txt = ids ? json_dumps(ids, JSON_COMPACT) : NULL;
        req_buf rq = {0}, b2;
        req_buf_addf(&rq, "{\"tokens\":%s}", txt ? txt : "[]");
        CHECK(post(s.port, "/detokenize", KEY, rq.p, &b2) == 200 && strstr(body_of(&b2), "{\"content\":\"hello world\"}"));
        req_buf_free(&b2);
        req_buf_free(&rq);
        base_free(txt);
        json_decref(j);
    }
    req_buf_free(&b);
    CHECK(post(s.port, "/detokenize", KEY, "{\"tokens\":[1,99999]}", &b) == 400 && is_error(&b, "tokens"));
    req_buf_free(&b);
    /* a raw stream ends with [DONE] and carries the usage when asked */
    CHECK(post(s.port, "/v1/completions", KEY, "{\"prompt\":\"abc\",\"max_tokens\":6,\"stream\":true,\"stream_options\":{\"include_usage\":true}}", &b) == 200);
    CHECK(b.p && strstr(b.p, "text/event-stream") && strstr(b.p, "\"completion_tokens\":6") && strstr(b.p, "data: [DONE]\n\n"));
    req_buf_free(&b);

    /* the official client */
    if (!node_ready()) {
        node_all_ok("timeout 240 node tests/serve/client.mjs %d %s serve_tiny", s.port, KEY);
        /* prefix reuse against a fresh server without a prefix cache that speculates */
        server sb;
        static const char *const bargs[] = {"--parallel", "4", "--api-key", KEY, "--ctx", "512", "--no-prefix", "--spec", "3", NULL};
        CHECK(server_start(&sb, dir, NULL, bargs) == 0);
        if (sb.port && !wait_health(sb.port)) {
            node_all_ok("timeout 120 node tests/serve/prefix.mjs %d %d %s serve_tiny", s.port, sb.port, KEY);
            /* structured output on both servers (the second speculates: its port is the second) */
            for (int k = 0; k < 2; k++)
                node_all_ok("timeout 240 node tests/serve/schema.mjs %d %s serve_tiny", k ? sb.port : s.port, KEY);
        } else {
            CHECK(0);
        }
        CHECK(server_stop(&sb) == 0);
    }
    /* the page, health and metrics (no key needed) */
    CHECK(http(s.port, "GET", "/", NULL, NULL, 0, &b) == 200 && strstr(b.p, "<html") && strstr(b.p, "text/html"));
    {
        /* the page's script at least parses (no browser here) */
        const char *a = b.p ? strstr(b.p, "<script>") : NULL, *z = a ? strstr(a, "</script>") : NULL;
        CHECK(a && z);
        if (a && z) {
            const char *path = t_write("page.js", a + 8, (size_t)(z - a - 8));
            char cmd[1200], *out = NULL;
            snprintf(cmd, sizeof cmd, "node --check %s", path);
            CHECK_MSG(t_run(cmd, &out) == 0, "page script: %s", out);
            base_free(out);
        }
    }
    req_buf_free(&b);
    CHECK(http(s.port, "GET", "/health", NULL, NULL, 0, &b) == 200 && strstr(body_of(&b), "\"ok\""));
    req_buf_free(&b);
    CHECK(http(s.port, "GET", "/metrics", NULL, NULL, 0, &b) == 200);
    static const char *const names[] = {"strata_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}",
                                        "strata_requests_total{endpoint=\"/v1/chat/completions\",status=\"401\"}",
                                        "strata_completion_tokens_total", "strata_queue_length 0", "strata_active_sequences 0",
                                        "strata_step_rows_bucket{le=\"+Inf\"}", "strata_read_bytes_total{what=\"experts\"}",
                                        "strata_expert_hit_rate", "strata_time_to_first_token_seconds_count",
                                        "strata_inter_token_latency_seconds_bucket", "strata_prefix_hits_total{tier=\"ram\"}",
                                        "strata_prefix_tokens_reused_total", "strata_prefix_bytes{tier=\"disk\"}",
                                        "strata_spec_drafted_tokens_total"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) CHECK_MSG(b.p && strstr(b.p, names[i]), "metrics lack %s", names[i]);
    req_buf_free(&b);
    CHECK(server_stop(&s) == 0);
}

TEST(serve_limits) {
    const char *dir = serve_model();
    CHECK(dir != NULL);
    if (!dir) return;
    server s;
    static const char *const args[] = {"--parallel", "1", "--queue", "0", "--ctx", "4096", "--timeout", "1", "--grace", "1", NULL};
    if (server_up(&s, dir, "5", args)) return; /* 5 ms per step: 3000 tokens take 15 s */
    const char *longreq = "{\"prompt\":\"abc\",\"max_tokens\":3000,\"stream\":true}";
    req_buf b = {0}, rq = {0};
    req_buf_addf(&rq, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s", strlen(longreq), longreq);

    /* a partial request: the slot stays free, and the server drops it after --timeout */
    int slow = sock_open(s.port);
    CHECK(slow >= 0 && sock_send(slow, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro", 68) == 0);

    /* a stream holds the one slot: the next request gets 429 + Retry-After */
    int fd = sock_open(s.port);
    CHECK(fd >= 0 && sock_send(fd, rq.p, rq.n) == 0);
    CHECK(sock_read(fd, &b, "\"text\"", 10) == 0 && b.p && strstr(b.p, "\"text\""));
    req_buf_free(&b);
    req_buf r2;
    CHECK(post(s.port, "/v1/completions", NULL, "{\"prompt\":\"x\",\"max_tokens\":2}", &r2) == 429 && is_error(&r2, NULL) &&
          strstr(r2.p, "Retry-After: 1"));
    req_buf_free(&r2);
    /* the client hangs up: its sequence is freed at the next step, the next request is served at once */
    close(fd);
    double t0 = base_now();
    int st = 0;
    for (int i = 0; i < 100 && (st = post(s.port, "/v1/completions", NULL, "{\"prompt\":\"x\",\"max_tokens\":2}", &r2)) == 429; i++) {
        req_buf_free(&r2);
        usleep(10000);
    }
    CHECK_MSG(st == 200 && base_now() - t0 < 2.0, "after the hang-up: %d in %.2f s", st, base_now() - t0);
    req_buf_free(&r2);
    /* a non-streaming request whose client leaves is cancelled too */
    {
        const char *nb = "{\"prompt\":\"abc\",\"max_tokens\":3000}";
        req_buf q = {0};
        req_buf_addf(&q, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s", strlen(nb), nb);
        int f2 = sock_open(s.port);
        f2 = sock_open(s.port); /* now: --request-timeout 1 runs from its connect */
        CHECK(f2 >= 0 && sock_send(f2, q.p, q.n) == 0);
        usleep(200000);
        close(f2);
        req_buf_free(&q);
        t0 = base_now();
        for (int i = 0; i < 100 && (st = post(s.port, "/v1/completions", NULL, "{\"prompt\":\"x\",\"max_tokens\":2}", &r2)) == 429; i++) {
            req_buf_free(&r2);
            usleep(10000);
        }
        CHECK_MSG(st == 200 && base_now() - t0 < 2.0, "after a non-stream hang-up: %d in %.2f s", st, base_now() - t0);
        req_buf_free(&r2);
    }
    /* the partial request was dropped by the timeout */
    req_buf sb = {0};
    CHECK(slow >= 0 && sock_read(slow, &sb, NULL, 5) == 1);
    req_buf_free(&sb);
    if (slow >= 0) close(slow);
    CHECK(http(s.port, "GET", "/metrics", NULL, NULL, 0, &b) == 200 && b.p && strstr(b.p, "strata_requests_rejected_total{reason=\"queue_full\"} ") &&
          strstr(b.p, "status=\"499\"") && strstr(b.p, "strata_active_sequences 0"));
    req_buf_free(&b);

    /* SIGTERM with a stream in flight: it is cut off after --grace, exit 0 */
    fd = sock_open(s.port);
    CHECK(fd >= 0 && sock_send(fd, rq.p, rq.n) == 0);
    CHECK(sock_read(fd, &b, "\"text\"", 10) == 0);
    t0 = base_now();
    CHECK(server_stop(&s) == 0);
    CHECK(base_now() - t0 < 8);
    CHECK(sock_read(fd, &b, NULL, 5) == 1 && strstr(b.p, "data: [DONE]"));
    req_buf_free(&b);
    close(fd);
    req_buf_free(&rq);

    /* the same with a non-streamed request: its whole answer (200 when it ended
     * within the grace, else 503 with an error object) goes out before the
     * connections close */
    if (server_up(&s, dir, "5", args)) return;
    const char *plain = "{\"prompt\":\"abc\",\"max_tokens\":3000}";
    req_buf_addf(&rq, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s", strlen(plain), plain);
    fd = sock_open(s.port);
    CHECK(fd >= 0 && sock_send(fd, rq.p, rq.n) == 0);
    for (int i = 0; i < 250; i++) { /* until it runs */
        int on = http(s.port, "GET", "/metrics", NULL, NULL, 0, &b) == 200 && b.p && strstr(b.p, "strata_active_sequences 1");
        req_buf_free(&b);
        if (on) break;
        usleep(20000);
    }
    CHECK(server_stop(&s) == 0);
    const int rr = sock_read(fd, &b, NULL, 5);
    const char *body = b.p ? strstr(b.p, "\r\n\r\n{") : NULL;
    const int whole = body && b.p[b.n - 1] == '}' &&
                      ((!strncmp(b.p, "HTTP/1.1 200", 12) && strstr(body, "\"choices\"") && strstr(body, "\"usage\"")) ||
                       (!strncmp(b.p, "HTTP/1.1 503", 12) && strstr(body, "\"error\"")));
    CHECK_MSG(rr == 1 && whole, "closed %d: %.300s", rr, b.p ? b.p : "(nothing)");
    req_buf_free(&b);
    close(fd);
    req_buf_free(&rq);
}

/* The page in a real browser. A browser that cannot start here (not installed,
 * no way to run in this sandbox) skips the suite with the reason; anything the
 * page does wrong fails it. */
TEST(serve_page) {
    const char *dir = serve_model();
    CHECK(dir != NULL);
    if (!dir || node_ready()) return;
    server s;
    static const char *const args[] = {"--parallel", "2", "--api-key", KEY, "--ctx", "512", NULL};
    if (server_up(&s, dir, "15", args)) return; /* 15 ms per step: a long reply lasts seconds */
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "timeout 120 node tests/serve/page.mjs %d %s serve_tiny", s.port, KEY);
    int rc = t_run(cmd, &out);
    const char *skip = out ? strstr(out, "SKIP: ") : NULL;
    if (skip && rc == 0) {
        const char *nl = strchr(skip, '\n');
        printf("     serve_page skipped: %.*s\n", (int)(nl ? nl - skip - 6 : (long)strlen(skip + 6)), skip + 6);
    } else {
        CHECK_MSG(rc == 0 && strstr(out, "ALL OK"), "page.mjs: %s", out ? out : "");
    }
    base_free(out);
    CHECK(server_stop(&s) == 0);
}

/* Issue 38's hostile probe of the HTTP side and the command: 405 names what is
 * allowed, 431 and an empty body answer JSON that says so, Content-Length
 * headers that disagree are refused, `strata serve DIR/.` is named after DIR,
 * a budget below the minimum exits 2, and a second server on a --cache-dir
 * another one holds is refused (exit 2, naming the directory and the pid)
 * before it touches a file; the library refuses it too (STRATA_EBUSY). */
TEST(serve_hostile) {
    const char *dir = serve_model();
    CHECK(dir != NULL);
    if (!dir) return;
    char dot[700], cache_dir[600], cmd[2400], *out = NULL;
    snprintf(dot, sizeof dot, "%s/.", dir);
    snprintf(cache_dir, sizeof cache_dir, "%s/serve_cache_lock", t_tmpdir);
    server s;
    const char *const args[] = {"--parallel", "2", "--ctx", "256", "--cache-dir", cache_dir, NULL};
    if (server_up(&s, dot, NULL, args)) return;
    req_buf b;

    /* 405 with Allow */
    CHECK(http(s.port, "DELETE", "/health", NULL, NULL, 0, &b) == 405 && is_error(&b, NULL) && strstr(b.p, "\r\nAllow: GET, HEAD\r\n"));
    req_buf_free(&b);
    CHECK(http(s.port, "GET", "/v1/completions", NULL, NULL, 0, &b) == 405 && is_error(&b, NULL) && strstr(b.p, "\r\nAllow: POST\r\n"));
    req_buf_free(&b);
    /* 431 as JSON */
    for (size_t n = 40000; n <= 90000; n += 50000) {
        req_buf rq = {0};
        req_buf_addf(&rq, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: ");
        for (size_t i = 0; i < n; i++) req_buf_add(&rq, "a", 1);
        req_buf_add(&rq, "\r\n\r\n", 4);
        int fd = sock_open(s.port);
        memset(&b, 0, sizeof b);
        CHECK(fd >= 0 && sock_send(fd, rq.p, rq.n) == 0);
        if (fd >= 0) { sock_read(fd, &b, NULL, 10); close(fd); }
        CHECK_MSG(b.p && !strncmp(b.p, "HTTP/1.1 431", 12) && strstr(b.p, "application/json") && is_error(&b, NULL) &&
                  strstr(b.p, "headers_too_large"), "%zu: %.300s", n, b.p ? b.p : "(nothing)");
        req_buf_free(&b);
        req_buf_free(&rq);
    }
    /* an empty body */
    CHECK(http(s.port, "POST", "/v1/completions", NULL, "", 0, &b) == 400 && is_error(&b, NULL) && strstr(b.p, "empty request body") &&
          !strstr(b.p, "line -1"));
    req_buf_free(&b);
    /* Content-Length twice: the same value is one header, different values are refused */
    {
        static const char *const two[] = {
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}",
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 31\r\nContent-Length: 31\r\n\r\n"
            "{\"prompt\":\"ab\",\"max_tokens\":1} ",
        };
        for (int i = 0; i < 2; i++) {
            int fd = sock_open(s.port);
            memset(&b, 0, sizeof b);
            CHECK(fd >= 0 && sock_send(fd, two[i], strlen(two[i])) == 0);
            if (fd >= 0) { sock_read(fd, &b, NULL, 10); close(fd); }
            if (i == 0) CHECK_MSG(b.p && !strncmp(b.p, "HTTP/1.1 400", 12) && is_error(&b, NULL) && strstr(b.p, "Content-Length"), "%.300s", b.p ? b.p : "");
            else CHECK_MSG(b.p && !strncmp(b.p, "HTTP/1.1 200", 12), "%.300s", b.p ? b.p : "");
            req_buf_free(&b);
        }
    }
    /* the model id of DIR/. is DIR's name */
    CHECK(http(s.port, "GET", "/v1/models", NULL, NULL, 0, &b) == 200 && strstr(b.p, "\"id\":\"serve_tiny\""));
    req_buf_free(&b);

    /* a second server on the same --cache-dir: refused before it listens */
    snprintf(cmd, sizeof cmd, "timeout 30 %s serve %s --port 0 --cache-dir %s 2>&1", t_strata(), dir, cache_dir);
    int rc = t_run(cmd, &out);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %d", (int)s.pid);
    CHECK_MSG(rc == 2 && out && strstr(out, cache_dir) && strstr(out, pid) && strstr(out, "in use") && !strstr(out, "listening"),
              "rc %d: %s", rc, out ? out : "");
    base_free(out);
    out = NULL;
    /* and the library refuses a second holder too, before it trims a file */
    {
        char err[4096];
        strata_model *m = NULL;
        CHECK(strata_model_open(&m, dir, err, sizeof err) == 0);
        strata_model_opts o = strata_model_opts_default();
        o.ctx = 64;
        o.max_seqs = 1;
        o.n_threads = 1;
        o.prefix_dir = cache_dir;
        CHECK_MSG(m && strata_model_load(m, &o, err, sizeof err) == STRATA_EBUSY && strstr(err, pid), "%s", err);
        strata_model_close(m);
    }
    CHECK(server_stop(&s) == 0);
    /* the lock went with the server: the directory is free again */
    {
        char err[4096];
        strata_model *m = NULL;
        CHECK(strata_model_open(&m, dir, err, sizeof err) == 0);
        strata_model_opts o = strata_model_opts_default();
        o.ctx = 64;
        o.max_seqs = 1;
        o.n_threads = 1;
        o.prefix_dir = cache_dir;
        CHECK_MSG(m && strata_model_load(m, &o, err, sizeof err) == 0, "%s", err);
        strata_model_close(m);
    }

    /* a budget below the minimum: 2, as run and chat */
    snprintf(cmd, sizeof cmd, "timeout 60 %s serve %s --port 0 --ram-gb 0.001 2>&1", t_strata(), dir);
    rc = t_run(cmd, &out);
    CHECK_MSG(rc == 2 && out && strstr(out, "below the minimum"), "rc %d: %s", rc, out ? out : "");
    base_free(out);
}

/* Issue 38: slow clients cannot lock anyone out. 200 connections that trickle
 * their headers a byte at a time (never silent for --timeout) from one address:
 * GET /health and a completion still answer at once (the address's oldest
 * trickling connections are replaced, answered 503 JSON); a request that
 * trickles past --request-timeout gets 408 and is closed; requests beyond
 * --max-conns get 503 JSON while /health still answers. */
TEST(serve_slow_clients) {
    const char *dir = serve_model();
    CHECK(dir != NULL);
    if (!dir) return;
    server s;
    static const char *const args[] = {"--parallel", "2", "--ctx", "256", NULL};
    if (server_up(&s, dir, NULL, args)) return;
    enum { N = 200 };
    int fds[N];
    int opened = 0;
    for (int i = 0; i < N; i++) {
        fds[i] = sock_open(s.port);
        if (fds[i] >= 0 && sock_send(fds[i], "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ", 49) == 0) opened++;
    }
    /* the address's oldest ones were replaced as the later ones came: told
     * why (503, JSON) and closed */
    usleep(300000);
    int told = 0;
    for (int i = 0; i < N; i++) {
        if (fds[i] < 0) continue;
        req_buf r = {0};
        sock_read(fds[i], &r, "}}", 0.005);
        if (r.p && !strncmp(r.p, "HTTP/1.1 503", 12) && strstr(r.p, "server_busy") && is_error(&r, NULL)) {
            told++;
            close(fds[i]);
            fds[i] = -1;
        }
        req_buf_free(&r);
    }
    CHECK_MSG(told >= N - 40, "%d of %d trickling connections replaced with a 503", told, N);
    for (int round = 0; round < 3; round++) { /* the rest trickle: a byte each, every 0.2 s */
        usleep(200000);
        for (int i = 0; i < N; i++)
            if (fds[i] >= 0 && send(fds[i], "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) { close(fds[i]); fds[i] = -1; }
    }
    req_buf b;
    double t0 = base_now();
    int st = http(s.port, "GET", "/health", NULL, NULL, 0, &b);
    const double t_health = base_now() - t0;
    CHECK_MSG(st == 200 && t_health < 3.0, "/health under %d trickling connections: %d in %.2f s", opened, st, t_health);
    req_buf_free(&b);
    t0 = base_now();
    st = post(s.port, "/v1/completions", NULL, "{\"prompt\":\"ab\",\"max_tokens\":2}", &b);
    const double t_compl = base_now() - t0;
    CHECK_MSG(st == 200 && strstr(body_of(&b), "\"choices\""), "a completion under trickling connections: %d in %.2f s", st, t_compl);
    req_buf_free(&b);
    printf("     %d trickling connections: /health %.3f s, a completion %.3f s\n", opened, t_health, t_compl);
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0) close(fds[i]);
    CHECK(server_stop(&s) == 0);

    /* the whole-request deadline: a connection that is never silent still ends */
    static const char *const dargs[] = {"--parallel", "1", "--queue", "1", "--ctx", "4096", "--request-timeout", "1",
                                        "--max-conns", "2", NULL};
    if (server_up(&s, dir, "5", dargs)) return; /* 5 ms a step: 3000 tokens take 15 s (as serve_limits) */
    int fd = sock_open(s.port);
    CHECK(fd >= 0 && sock_send(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ", 49) == 0);
    t0 = base_now();
    req_buf r = {0};
    int closed = 0;
    while (fd >= 0 && !closed && base_now() - t0 < 10) {
        if (send(fd, "a", 1, MSG_NOSIGNAL) != 1) break;
        closed = sock_read(fd, &r, NULL, 0.2);
    }
    if (fd >= 0) { sock_read(fd, &r, NULL, 1); close(fd); }
    const double t_dead = base_now() - t0;
    CHECK_MSG(r.p && !strncmp(r.p, "HTTP/1.1 408", 12) && is_error(&r, NULL) && t_dead < 6, "after %.2f s: %.200s", t_dead,
              r.p ? r.p : "(nothing)");
    req_buf_free(&r);

    /* --max-conns 2: two streams (one running, one queued) fill it; a third
     * request gets 503 JSON, /health still answers */
    const char *longreq = "{\"prompt\":\"abc\",\"max_tokens\":3000,\"stream\":true}";
    req_buf rq = {0};
    req_buf_addf(&rq, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s", strlen(longreq), longreq);
    int f1 = sock_open(s.port), f2 = -1;
    CHECK(f1 >= 0 && sock_send(f1, rq.p, rq.n) == 0);
    r = (req_buf){0};
    CHECK(f1 >= 0 && sock_read(f1, &r, "\"text\"", 10) == 0); /* f1 runs */
    req_buf_free(&r);
    /* the second, a chat stream, is queued: its role chunk comes at once
     * (no other connection is opened before: one beyond --max-conns would
     * replace f2 while it is still sending its request, as it should) */
    {
        const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"abc\"}],\"max_tokens\":3000,\"stream\":true}";
        req_buf q = {0};
        req_buf_addf(&q, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s", strlen(chat), chat);
        f2 = sock_open(s.port); /* now: --request-timeout 1 runs from its connect */
        CHECK(f2 >= 0 && sock_send(f2, q.p, q.n) == 0);
        req_buf_free(&q);
        r = (req_buf){0};
        CHECK_MSG(f2 >= 0 && sock_read(f2, &r, "\"role\"", 10) == 0 && r.p && strstr(r.p, "\"role\""), "%.200s", r.p ? r.p : "(nothing)");
        req_buf_free(&r);
    }
    st = post(s.port, "/v1/completions", NULL, "{\"prompt\":\"ab\",\"max_tokens\":2}", &b);
    CHECK_MSG(st == 503 && is_error(&b, NULL) && strstr(b.p, "server_busy") && strstr(b.p, "Retry-After: 1"), "%d: %.300s", st,
              b.p ? b.p : "");
    req_buf_free(&b);
    CHECK(http(s.port, "GET", "/health", NULL, NULL, 0, &b) == 200);
    req_buf_free(&b);
    if (f1 >= 0) close(f1);
    if (f2 >= 0) close(f2);
    req_buf_free(&rq);
    CHECK(server_stop(&s) == 0);
}

