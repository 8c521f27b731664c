/*
 * t_serve_api.c: `strata serve`'s API surface against the official clients
 * (split from t_serve.c; the helpers are serve_test.h's).
 *   serve_choices: issue 42: logprobs equal the log-softmax of `strata run
 *                  --dump-logits`; n = 3 with seed s equals single requests with
 *                  s, s+1, s+2 (texts and logprobs, bit for bit), streamed
 *                  indexes; aliases, created / system_fingerprint / seed,
 *                  reasoning_tokens, CORS preflight, 415 without --cors,
 *                  x-api-key; POST /v1/messages with @anthropic-ai/sdk
 *                  (tests/serve/anthropic.mjs).
 *   serve_progress: a long prompt's ": prefill" comments, /slots and the
 *                  strata_prefill_* metrics; a hang-up during the prompt frees
 *                  the slot.
 *   serve_tools:   tool calls through the openai and @anthropic-ai/sdk clients
 *                  on K3's, Kimi K2's and DeepSeek-V3's formats.
 *   serve_reasoning_formats: reasoning_content where the model's chat format
 *                  reasons, streamed == not streamed.
 * Every wait is bounded; the server is always killed at the end.
 */
#include <math.h>
#include "serve_test.h"

/* ===== issue 42: logprobs, n, prefill progress, compatibility ===== */

/* The parsed JSON body of an answer (NULL when it is not JSON). */
static json_t *answer(const req_buf *b) {
    const char *t = body_of(b);
    return jsonx_load((const uint8_t *)t, strlen(t), "answer", NULL, 0);
}

/* Completions logprobs == the log-softmax of `strata run --dump-logits` (greedy):
 * the chosen token's value and the top alternative's. */
static void check_logprobs_vs_dump(int port, const char *dir) {
    char cmd[1600], *out = NULL;
    char dump[700];
    snprintf(dump, sizeof dump, "%s/lp.f32", t_tmpdir);
    snprintf(cmd, sizeof cmd, "%s run %s --ids 5,17,42,7 --gen 6 --temp 0 --dump-logits %s --print-ids", t_strata(), dir, dump);
    CHECK_MSG(t_run(cmd, &out) == 0, "run: %s", out);
    base_free(out);
    uint8_t *raw = NULL;
    size_t len = 0;
    CHECK(base_read_file(dump, 1 << 26, &raw, &len, NULL, 0) == 0);
    req_buf b;
    CHECK(post(port, "/v1/completions", KEY, "{\"prompt\":[5,17,42,7],\"max_tokens\":6,\"temperature\":0,\"logprobs\":3}", &b) == 200);
    json_t *j = answer(&b), *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *vals = json_object_get(lp, "token_logprobs");
    const size_t V = 512, steps = raw ? len / (V * sizeof(float)) : 0;
    CHECK(json_array_size(vals) >= 1 && steps >= json_array_size(vals));
    for (size_t i = 0; i < json_array_size(vals) && i < steps; i++) {
        const float *x = (const float *)raw + i * V;
        double mx = -INFINITY, sum = 0;
        size_t am = 0;
        for (size_t v = 0; v < V; v++) if (x[v] > mx) { mx = x[v]; am = v; }
        for (size_t v = 0; v < V; v++) sum += exp((double)x[v] - mx);
        const double want = (double)x[am] - mx - log(sum);
        const double got = json_real_value(json_array_get(vals, i));
        CHECK_MSG(fabs(got - want) <= 1e-6 * (1 + fabs(want)), "step %zu: logprob %.9f, log-softmax of the dump %.9f", i, got, want);
        json_t *top = json_array_get(json_object_get(lp, "top_logprobs"), i);
        CHECK(json_object_size(top) >= 1);
    }
    json_decref(j);
    req_buf_free(&b);
    base_free(raw);
}

/* n = 3 with seed s == three single requests with seeds s, s+1, s+2: texts and
 * every token's logprob, bit for bit; usage counts the prompt once. */
static void check_n_choices(int port) {
    const char *base = "\"messages\":[{\"role\":\"user\",\"content\":\"tell me\"}],\"max_tokens\":8,\"temperature\":1,"
                       "\"reasoning_effort\":\"none\",\"logprobs\":true";
    char body[512];
    req_buf b;
    snprintf(body, sizeof body, "{%s,\"n\":3,\"seed\":41}", base);
    CHECK(post(port, "/v1/chat/completions", KEY, body, &b) == 200);
    json_t *all = answer(&b);
    req_buf_free(&b);
    json_t *ch = json_object_get(all, "choices");
    CHECK(json_array_size(ch) == 3 && json_integer_value(json_object_get(all, "seed")) == 41);
    int64_t completion = 0;
    for (int k = 0; k < 3; k++) {
        snprintf(body, sizeof body, "{%s,\"seed\":%d}", base, 41 + k);
        CHECK(post(port, "/v1/chat/completions", KEY, body, &b) == 200);
        json_t *one = answer(&b), *c1 = json_array_get(json_object_get(one, "choices"), 0), *cn = json_array_get(ch, (size_t)k);
        CHECK(json_integer_value(json_object_get(cn, "index")) == k);
        char *a = json_dumps(json_object_get(c1, "logprobs"), JSON_COMPACT), *z = json_dumps(json_object_get(cn, "logprobs"), JSON_COMPACT);
        CHECK_MSG(a && z && !strcmp(a, z), "choice %d differs from the single request with seed %d", k, 41 + k);
        CHECK(json_equal(json_object_get(c1, "message"), json_object_get(cn, "message")));
        completion += json_integer_value(json_object_get(json_object_get(one, "usage"), "completion_tokens"));
        CHECK(json_integer_value(json_object_get(json_object_get(one, "usage"), "prompt_tokens")) ==
              json_integer_value(json_object_get(json_object_get(all, "usage"), "prompt_tokens")));
        base_free(a);
        base_free(z);
        json_decref(one);
        req_buf_free(&b);
    }
    CHECK(json_integer_value(json_object_get(json_object_get(all, "usage"), "completion_tokens")) == completion);
    json_decref(all);
    /* streamed: every chunk's choice carries its index, each index finishes */
    snprintf(body, sizeof body, "{%s,\"n\":2,\"seed\":41,\"stream\":true}", base);
    CHECK(post(port, "/v1/chat/completions", KEY, body, &b) == 200);
    CHECK(b.p && strstr(b.p, "\"index\":1,\"delta\"") && strstr(b.p, "data: [DONE]"));
    int fin = 0;
    for (const char *p = b.p; p && (p = strstr(p, "\"finish_reason\":\"")); p++) fin++;
    CHECK(fin == 2);
    req_buf_free(&b);
}

TEST(serve_choices) {
    const char *dir = serve_model();
    CHECK(dir != NULL);
    if (!dir) return;
    server s;
    const char *const args[] = {"--parallel", "4", "--api-key", KEY, "--ctx", "512", "--alias", "kimi-k3", "--cors", "https://app.example",
                                NULL};
    if (server_up(&s, dir, NULL, args)) return;
    check_logprobs_vs_dump(s.port, dir);
    check_n_choices(s.port);
    if (!node_ready()) { /* POST /v1/messages with the official @anthropic-ai/sdk */
        node_all_ok("timeout 120 node tests/serve/anthropic.mjs %d %s kimi-k3", s.port, KEY);
    }
    req_buf b;
    /* aliases: listed, named in answers, accepted */
    CHECK(http(s.port, "GET", "/v1/models", KEY, NULL, 0, &b) == 200 && strstr(b.p, "\"id\":\"kimi-k3\"") && strstr(b.p, "\"id\":\"serve_tiny\""));
    req_buf_free(&b);
    CHECK(post(s.port, "/v1/chat/completions", KEY, "{\"model\":\"kimi-k3\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2}", &b) == 200);
    {
        json_t *j = answer(&b);
        CHECK(!strcmp(json_string_value(json_object_get(j, "model")) ? json_string_value(json_object_get(j, "model")) : "", "kimi-k3"));
        CHECK(json_integer_value(json_object_get(j, "created")) > 0 && json_is_string(json_object_get(j, "system_fingerprint")) &&
              json_is_integer(json_object_get(j, "seed")));
        CHECK(json_is_integer(json_object_get(json_object_get(json_object_get(j, "usage"), "completion_tokens_details"), "reasoning_tokens")));
        json_decref(j);
    }
    CHECK(strstr(b.p, "Access-Control-Allow-Origin: https://app.example") != NULL);
    req_buf_free(&b);
    /* a preflight */
    CHECK(http(s.port, "OPTIONS", "/v1/chat/completions", NULL, NULL, 0, &b) == 204 && strstr(b.p, "Access-Control-Allow-Methods") &&
          strstr(b.p, "Access-Control-Allow-Headers"));
    req_buf_free(&b);
    CHECK(server_stop(&s) == 0);

    /* without --cors: a form post is refused; x-api-key is a key too */
    const char *const args2[] = {"--parallel", "2", "--api-key", KEY, "--ctx", "512", NULL};
    if (server_up(&s, dir, NULL, args2)) return;
    {
        int fd = sock_open(s.port);
        const char *body = "{\"prompt\":\"x\",\"max_tokens\":1}";
        char rq[512];
        snprintf(rq, sizeof rq, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-api-key: %s\r\n"
                                "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %zu\r\n\r\n%s", KEY, strlen(body), body);
        memset(&b, 0, sizeof b);
        CHECK(fd >= 0 && sock_send(fd, rq, strlen(rq)) == 0);
        sock_read(fd, &b, NULL, 20);
        CHECK(b.p && !strncmp(b.p, "HTTP/1.1 415", 12) && is_error(&b, NULL));
        req_buf_free(&b);
        if (fd >= 0) close(fd);
        fd = sock_open(s.port);
        snprintf(rq, sizeof rq, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-api-key: %s\r\n"
                                "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", KEY, strlen(body), body);
        CHECK(fd >= 0 && sock_send(fd, rq, strlen(rq)) == 0);
        sock_read(fd, &b, NULL, 20);
        CHECK(b.p && !strncmp(b.p, "HTTP/1.1 200", 12));
        req_buf_free(&b);
        if (fd >= 0) close(fd);
    }
    CHECK(server_stop(&s) == 0);
}

/* A streaming request with a long prompt (8 passes of 64 rows, slowed) gets
 * ": prefill DONE/TOTAL" comments; /slots and /metrics show its progress; a
 * client that hangs up during the prompt frees its slot. */
TEST(serve_progress) {
    const char *dir = serve_model();
    CHECK(dir != NULL);
    if (!dir) return;
    server s;
    const char *const args[] = {"--parallel", "1", "--api-key", KEY, "--ctx", "512", "--progress-interval", "0.1", "--no-prefix", NULL};
    if (server_up(&s, dir, "150", args)) return;
    req_buf body = {0};
    req_buf_add(&body, "{\"prompt\":[", 11);
    for (int i = 0; i < 480; i++) req_buf_addf(&body, "%s%d", i ? "," : "", 1 + i % 300);
    req_buf_add(&body, "],\"max_tokens\":2,\"stream\":true}", 31);
    for (int round = 0; round < 2; round++) {
        int fd = sock_open(s.port);
        req_buf rq = {0}, got = {0}, b;
        req_buf_addf(&rq, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                          "Content-Length: %zu\r\n\r\n", KEY, body.n);
        req_buf_add(&rq, body.p, body.n);
        CHECK(fd >= 0 && sock_send(fd, rq.p, rq.n) == 0);
        sock_read(fd, &got, ": prefill ", 20);
        CHECK_MSG(got.p && strstr(got.p, ": prefill ") && strstr(got.p, "/480\n\n"), "no progress comment: %s", got.p ? got.p : "");
        CHECK(http(s.port, "GET", "/slots", KEY, NULL, 0, &b) == 200 && strstr(b.p, "\"state\":\"prefill\"") &&
              strstr(b.p, "\"prompt_tokens\":480"));
        req_buf_free(&b);
        CHECK(http(s.port, "GET", "/metrics", NULL, NULL, 0, &b) == 200 && strstr(b.p, "strata_prefill_tokens{of=\"total\"} 480"));
        req_buf_free(&b);
        if (round == 0) {
            sock_read(fd, &got, "data: [DONE]", 30); /* the whole answer */
            CHECK(got.p && strstr(got.p, "data: [DONE]"));
        } else {
            close(fd); /* hang up during the prompt: the slot is free at the next pass */
            fd = -1;
            int freed = 0;
            for (int i = 0; i < 200 && !freed; i++) {
                CHECK(http(s.port, "GET", "/slots", KEY, NULL, 0, &b) == 200);
                freed = b.p && strstr(b.p, "\"slots\":[]") != NULL;
                req_buf_free(&b);
                if (!freed) usleep(50000);
            }
            CHECK_MSG(freed, "the cancelled request still holds its slot");
            CHECK(http(s.port, "GET", "/metrics", NULL, NULL, 0, &b) == 200 && strstr(b.p, "status=\"499\""));
            req_buf_free(&b);
        }
        if (fd >= 0) close(fd);
        req_buf_free(&rq);
        req_buf_free(&got);
    }
    req_buf_free(&body);
    CHECK(server_stop(&s) == 0);
}

/* Tool calls through the official client (tests/serve/tools.mjs) on K3's XTML
 * (tiny), the Kimi K2 format (kimi-linear-tiny) and DeepSeek-V3's: the tool
 * loop streamed and not, forced calls valid by ajv (alone and 4 concurrent ==
 * solo), a named choice, parallel calls, garbage as content, refusals. On K3
 * and Kimi Linear also /v1/messages tool use with @anthropic-ai/sdk
 * (anthropic.mjs tools: the loop, tool_use / tool_result blocks, streamed ==
 * not). */
TEST(serve_tools) {
    static const char *const presets[][2] = {{"serve_tools_k3", "tiny"}, {"serve_tools_kl", "kimi-linear-tiny"},
                                             {"serve_tools_ds", "deepseek-v3-tiny"}};
    if (node_ready()) return;
    for (int i = 0; i < 3; i++) {
        const char *dir = t_model(presets[i][0], presets[i][1], 5, 0);
        CHECK(dir != NULL);
        if (!dir) continue;
        server s;
        static const char *const args[] = {"--parallel", "2", "--api-key", KEY, "--ctx", "2048", NULL};
        if (server_up(&s, dir, NULL, args)) continue;
        node_all_ok("timeout 240 node tests/serve/tools.mjs %d %s %s", s.port, KEY, presets[i][0]);
        if (i < 2) /* tool use on /v1/messages (@anthropic-ai/sdk): K3's XTML and the K2 format */
            node_all_ok("timeout 240 node tests/serve/anthropic.mjs %d %s %s tools", s.port, KEY, presets[i][0]);
        CHECK(server_stop(&s) == 0);
    }
}

/* The chat format comes from the model's tokenizer (DeepSeek's tokenizer.json,
 * Kimi's tiktoken with K2-Thinking's <think>): reasoning_content exactly where
 * the format reasons (R1 and K2-Thinking whatever the effort, DeepSeek-V3
 * never), streamed == not streamed (tests/serve/reasoning.mjs); a tool loop
 * through the K2 tool format on K2-Thinking's layout (tests/serve/tools.mjs). */
TEST(serve_reasoning_formats) {
    static const char *const k[][3] = {{"serve_fmt_r1", "deepseek-r1-tiny", "always"},
                                       {"serve_fmt_v3", "deepseek-v3-tiny", "never"},
                                       {"serve_fmt_k2t", "kimi-k2-thinking-tiny", "always"}};
    if (node_ready()) return;
    for (int i = 0; i < 3; i++) {
        const char *dir = t_model(k[i][0], k[i][1], 5, 0);
        CHECK(dir != NULL);
        if (!dir) continue;
        server s;
        static const char *const args[] = {"--parallel", "2", "--api-key", KEY, "--ctx", "2048", NULL};
        if (server_up(&s, dir, NULL, args)) continue;
        node_all_ok("timeout 120 node tests/serve/reasoning.mjs %d %s %s %s", s.port, KEY, k[i][0], k[i][2]);
        if (i == 2) node_all_ok("timeout 240 node tests/serve/tools.mjs %d %s %s", s.port, KEY, k[i][0]);
        CHECK(server_stop(&s) == 0);
    }
}
