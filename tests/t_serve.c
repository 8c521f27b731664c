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
 * Every wait is bounded; the server is always killed at the end.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "jsonx.h"
#include "serve/request.h"
#include "strata.h"
#include "test.h"

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

/* ===== a server process and a small HTTP client ===== */

typedef struct server {
    pid_t pid;
    int port;
    char log[1024];
} server;

/* Starts ./strata serve DIR ARGS... on a free port; 0 when /health says ready. */
static int server_start(server *s, const char *dir, const char *step_ms, const char *const *args) {
    memset(s, 0, sizeof *s);
    static int k;
    snprintf(s->log, sizeof s->log, "%s/serve%d.log", t_tmpdir, k++);
    const char *argv[32] = {"strata", "serve", dir, "--port", "0", "--host", "127.0.0.1"};
    int n = 7;
    for (int i = 0; args && args[i] && n < 30; i++) argv[n++] = args[i];
    argv[n] = NULL;
    fflush(NULL);
    s->pid = fork();
    if (s->pid < 0) return -1;
    if (s->pid == 0) {
        FILE *f = freopen(s->log, "w", stderr);
        if (!f) _exit(126);
        dup2(2, 1);
        if (step_ms) setenv("STRATA_SERVE_STEP_MS", step_ms, 1);
        execv(t_strata(), (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 200 && !s->port; i++) { /* <= 10 s for the listening line */
        uint8_t *txt = NULL;
        size_t len;
        if (!base_read_file(s->log, 1 << 20, &txt, &len, NULL, 0)) {
            const char *at = strstr((char *)txt, "listening on http://127.0.0.1:");
            if (at) s->port = atoi(at + strlen("listening on http://127.0.0.1:"));
            base_free(txt);
        }
        if (!s->port) usleep(50000);
    }
    return s->port ? 0 : -1;
}

/* SIGTERM, then up to 15 s for the exit; SIGKILL after that. Returns the exit
 * status (or -1 when it had to be killed). */
static int server_stop(server *s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 300; i++) {
        pid_t w = waitpid(s->pid, &st, WNOHANG);
        if (w == s->pid) { s->pid = 0; return WIFEXITED(st) ? WEXITSTATUS(st) : -1; }
        usleep(50000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    return -1;
}

static int sock_open(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return -1; }
    return fd;
}

static int sock_send(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Reads into b until the peer closes, stop appears, or timeout_s passes. 1 when
 * the peer closed, 0 otherwise. */
static int sock_read(int fd, req_buf *b, const char *stop, double timeout_s) {
    const double t_end = base_now() + timeout_s;
    for (;;) {
        if (stop && b->p && strstr(b->p, stop)) return 0;
        double left = t_end - base_now();
        if (left <= 0) return 0;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        char buf[8192];
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0) return 1;
        req_buf_add(b, buf, (size_t)k);
    }
}

/* One request (Connection: close); the response in *out (status line on). Returns
 * the status or -1. */
static int http(int port, const char *method, const char *path, const char *key, const char *body, size_t body_len,
                req_buf *out) {
    memset(out, 0, sizeof *out);
    int fd = sock_open(port);
    if (fd < 0) return -1;
    req_buf rq = {0};
    req_buf_addf(&rq, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, path);
    if (key) req_buf_addf(&rq, "Authorization: Bearer %s\r\n", key);
    if (body) req_buf_addf(&rq, "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    req_buf_add(&rq, "\r\n", 2);
    if (body) req_buf_add(&rq, body, body_len);
    int st = -1;
    if (!sock_send(fd, rq.p, rq.n)) {
        sock_read(fd, out, NULL, 30);
        if (out->p && !strncmp(out->p, "HTTP/1.1 ", 9)) st = atoi(out->p + 9);
    }
    req_buf_free(&rq);
    close(fd);
    return st;
}

static int post(int port, const char *path, const char *key, const char *body, req_buf *out) {
    return http(port, "POST", path, key, body, strlen(body), out);
}

static const char *body_of(const req_buf *b) {
    const char *p = b->p ? strstr(b->p, "\r\n\r\n") : NULL;
    return p ? p + 4 : "";
}

/* An OpenAI error document naming param (NULL: any). */
static int is_error(const req_buf *b, const char *param) {
    char err[256];
    const char *txt = body_of(b);
    json_t *j = jsonx_load((const uint8_t *)txt, strlen(txt), "response", err, sizeof err);
    json_t *e = json_object_get(j, "error");
    int ok = json_is_object(e) && json_is_string(json_object_get(e, "message")) && json_is_string(json_object_get(e, "type")) &&
             json_object_get(e, "code") != NULL;
    if (ok && param) ok = json_is_string(json_object_get(e, "param")) && !strcmp(json_string_value(json_object_get(e, "param")), param);
    json_decref(j);
    return ok;
}

static int wait_health(int port) {
    for (int i = 0; i < 200; i++) {
        req_buf b;
        int st = http(port, "GET", "/health", NULL, NULL, 0, &b);
        req_buf_free(&b);
        if (st == 200) return 0;
        usleep(50000);
    }
    return -1;
}

static const char *serve_model(void) { return t_model("serve_tiny", "tiny", 5, 0); }

/* Prepares tests/serve/node_modules (openai@4, puppeteer-core) once; 0 when ready. */
static int node_ready(void) {
    char *out = NULL;
    int rc = 0;
    if (t_run("node --version && npm --version", &out) != 0) {
        CHECK_MSG(0, "node/npm not found (needed for the openai client tests): %s", out);
        rc = -1;
    } else if (!base_is_dir("tests/serve/node_modules/openai") || !base_is_dir("tests/serve/node_modules/puppeteer-core") ||
               !base_is_dir("tests/serve/node_modules/ajv") || !base_is_dir("tests/serve/node_modules/@anthropic-ai/sdk")) {
        base_free(out);
        out = NULL;
        if (t_run("npm ci --prefix tests/serve --no-audit --no-fund --loglevel=error", &out) != 0) {
            CHECK_MSG(0, "npm ci --prefix tests/serve failed (registry unreachable?): %s", out);
            rc = -1;
        }
    }
    base_free(out);
    return rc;
}

#define KEY "test-key-123"

TEST(serve_http) {
    const char *dir = serve_model();
    CHECK(dir != NULL);
    if (!dir) return;
    server s;
    char cache_dir[600];
    snprintf(cache_dir, sizeof cache_dir, "%s/serve_cache", t_tmpdir);
    const char *const args[] = {"--parallel", "4", "--api-key", KEY, "--ctx", "512", "--max-body", "64K", "--cache-dir", cache_dir, NULL};
    CHECK(server_start(&s, dir, "1", args) == 0);
    if (!s.port || wait_health(s.port)) { CHECK(0); server_stop(&s); return; }
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
        char cmd[512], *out = NULL;
        snprintf(cmd, sizeof cmd, "timeout 240 node tests/serve/client.mjs %d %s serve_tiny", s.port, KEY);
        int rc = t_run(cmd, &out);
        CHECK_MSG(rc == 0 && strstr(out, "ALL OK"), "client.mjs: %s", out);
        base_free(out);
        /* prefix reuse against a fresh server without a prefix cache that speculates */
        server sb;
        static const char *const bargs[] = {"--parallel", "4", "--api-key", KEY, "--ctx", "512", "--no-prefix", "--spec", "3", NULL};
        CHECK(server_start(&sb, dir, NULL, bargs) == 0);
        if (sb.port && !wait_health(sb.port)) {
            out = NULL;
            snprintf(cmd, sizeof cmd, "timeout 120 node tests/serve/prefix.mjs %d %d %s serve_tiny", s.port, sb.port, KEY);
            rc = t_run(cmd, &out);
            CHECK_MSG(rc == 0 && strstr(out, "ALL OK"), "prefix.mjs: %s", out);
            base_free(out);
            /* structured output on both servers (the second speculates) */
            for (int k = 0; k < 2; k++) {
                out = NULL;
                snprintf(cmd, sizeof cmd, "timeout 240 node tests/serve/schema.mjs %d %s serve_tiny", k ? sb.port : s.port, KEY);
                rc = t_run(cmd, &out);
                CHECK_MSG(rc == 0 && strstr(out, "ALL OK"), "schema.mjs (%s): %s", k ? "--spec 3" : "plain", out);
                base_free(out);
            }
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
    CHECK(server_start(&s, dir, "5", args) == 0); /* 5 ms per step: 3000 tokens take 15 s */
    if (!s.port || wait_health(s.port)) { CHECK(0); server_stop(&s); return; }
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
    CHECK(server_start(&s, dir, "5", args) == 0);
    if (!s.port || wait_health(s.port)) { CHECK(0); server_stop(&s); return; }
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
    CHECK(server_start(&s, dir, "15", args) == 0); /* 15 ms per step: a long reply lasts seconds */
    if (!s.port || wait_health(s.port)) { CHECK(0); server_stop(&s); return; }
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
    CHECK(server_start(&s, dot, NULL, args) == 0);
    if (!s.port || wait_health(s.port)) { CHECK(0); server_stop(&s); return; }
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
    CHECK(server_start(&s, dir, NULL, args) == 0);
    if (!s.port || wait_health(s.port)) { CHECK(0); server_stop(&s); return; }
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
    CHECK(server_start(&s, dir, "5", dargs) == 0); /* 5 ms a step: 3000 tokens take 15 s (as serve_limits) */
    if (!s.port || wait_health(s.port)) { CHECK(0); server_stop(&s); return; }
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
    CHECK(server_start(&s, dir, NULL, args) == 0);
    if (!s.port || wait_health(s.port)) { CHECK(0); server_stop(&s); return; }
    check_logprobs_vs_dump(s.port, dir);
    check_n_choices(s.port);
    if (!node_ready()) { /* POST /v1/messages with the official @anthropic-ai/sdk */
        char cmd[512], *out = NULL;
        snprintf(cmd, sizeof cmd, "timeout 120 node tests/serve/anthropic.mjs %d %s kimi-k3", s.port, KEY);
        CHECK_MSG(t_run(cmd, &out) == 0 && strstr(out, "ALL OK"), "anthropic.mjs: %s", out);
        base_free(out);
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
    CHECK(server_start(&s, dir, NULL, args2) == 0);
    if (!s.port || wait_health(s.port)) { CHECK(0); server_stop(&s); return; }
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
    CHECK(server_start(&s, dir, "150", args) == 0);
    if (!s.port || wait_health(s.port)) { CHECK(0); server_stop(&s); return; }
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
        CHECK(server_start(&s, dir, NULL, args) == 0);
        if (s.port && !wait_health(s.port)) {
            char cmd[512], *out = NULL;
            snprintf(cmd, sizeof cmd, "timeout 240 node tests/serve/tools.mjs %d %s %s", s.port, KEY, presets[i][0]);
            int rc = t_run(cmd, &out);
            CHECK_MSG(rc == 0 && strstr(out, "ALL OK"), "tools.mjs on %s: %s", presets[i][1], out);
            base_free(out);
            if (i < 2) { /* tool use on /v1/messages (@anthropic-ai/sdk): K3's XTML and the K2 format */
                out = NULL;
                snprintf(cmd, sizeof cmd, "timeout 240 node tests/serve/anthropic.mjs %d %s %s tools", s.port, KEY, presets[i][0]);
                rc = t_run(cmd, &out);
                CHECK_MSG(rc == 0 && strstr(out, "ALL OK"), "anthropic.mjs tools on %s: %s", presets[i][1], out);
                base_free(out);
            }
        } else {
            CHECK(0);
        }
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
        CHECK(server_start(&s, dir, NULL, args) == 0);
        if (s.port && !wait_health(s.port)) {
            char cmd[512], *out = NULL;
            snprintf(cmd, sizeof cmd, "timeout 120 node tests/serve/reasoning.mjs %d %s %s %s", s.port, KEY, k[i][0], k[i][2]);
            int rc = t_run(cmd, &out);
            CHECK_MSG(rc == 0 && strstr(out, "ALL OK"), "reasoning.mjs on %s: %s", k[i][1], out);
            base_free(out);
            if (i == 2) {
                snprintf(cmd, sizeof cmd, "timeout 240 node tests/serve/tools.mjs %d %s %s", s.port, KEY, k[i][0]);
                rc = t_run(cmd, &out);
                CHECK_MSG(rc == 0 && strstr(out, "ALL OK"), "tools.mjs on %s: %s", k[i][1], out);
                base_free(out);
            }
        } else {
            CHECK(0);
        }
        CHECK(server_stop(&s) == 0);
    }
}
