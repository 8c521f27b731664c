/*
 * serve_test.h: what the `strata serve` suites share (t_serve.c, t_serve_api.c):
 * a server process on a free loopback port, a small HTTP client, the generated
 * model they serve and the npm clients' setup. Header-only (static inline), so a
 * suite file that uses part of it builds without unused-function warnings.
 */
#ifndef STRATA_SERVE_TEST_H
#define STRATA_SERVE_TEST_H
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "jsonx.h"
#include "serve/request.h"
#include "strata.h"
#include "test.h"

typedef struct server {
    pid_t pid;
    int port;
    char log[1024];
} server;

/* Starts ./strata serve DIR ARGS... on a free port; 0 when /health says ready. */
static inline int server_start(server *s, const char *dir, const char *step_ms, const char *const *args) {
    memset(s, 0, sizeof *s);
    /* a fresh, empty log per server: a counter here would be one per suite file
     * (static inline), and a reused name could show an earlier server's port */
    snprintf(s->log, sizeof s->log, "%s/serveXXXXXX.log", t_tmpdir);
    const int lfd = mkstemps(s->log, 4);
    if (lfd < 0) return -1;
    close(lfd);
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
static inline int server_stop(server *s) {
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

static inline int sock_open(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return -1; }
    return fd;
}

static inline int sock_send(int fd, const void *p, size_t n) {
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
static inline int sock_read(int fd, req_buf *b, const char *stop, double timeout_s) {
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
static inline int http(int port, const char *method, const char *path, const char *key, const char *body, size_t body_len,
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

static inline int post(int port, const char *path, const char *key, const char *body, req_buf *out) {
    return http(port, "POST", path, key, body, strlen(body), out);
}

static inline const char *body_of(const req_buf *b) {
    const char *p = b->p ? strstr(b->p, "\r\n\r\n") : NULL;
    return p ? p + 4 : "";
}

/* An OpenAI error document naming param (NULL: any). */
static inline int is_error(const req_buf *b, const char *param) {
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

static inline int wait_health(int port) {
    for (int i = 0; i < 200; i++) {
        req_buf b;
        int st = http(port, "GET", "/health", NULL, NULL, 0, &b);
        req_buf_free(&b);
        if (st == 200) return 0;
        usleep(50000);
    }
    return -1;
}

static inline const char *serve_model(void) { return t_model("serve_tiny", "tiny", 5, 0); }

/* Prepares tests/serve/node_modules (openai@4, puppeteer-core) once; 0 when ready. */
static inline int node_ready(void) {
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

/* Runs a node client of tests/serve/ given as a printf format: it must exit
 * 0 and print ALL OK; a failure shows the command and its output. */
static inline void node_all_ok(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void node_all_ok(const char *fmt, ...) {
    char cmd[1024], *out = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    const int rc = t_run(cmd, &out);
    CHECK_MSG(rc == 0 && out && strstr(out, "ALL OK"), "%s: %s", cmd, out ? out : "");
    base_free(out);
}

/* server_start, then /health: 0 when the server answers; otherwise the failure
 * is counted, the server stopped, and -1 (the suite returns). */
static inline int server_up(server *s, const char *dir, const char *step_ms, const char *const *args) {
    CHECK(server_start(s, dir, step_ms, args) == 0);
    if (!s->port || wait_health(s->port)) { CHECK(0); server_stop(s); return -1; }
    return 0;
}
#endif
