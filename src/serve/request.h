/*
 * request.h: `strata serve` request bodies -> validated requests (pure: no model,
 * no I/O, fuzzed by fuzz/fz_req.c).
 *
 * A body is strict JSON (duplicate keys refused, UTF-8 checked by jansson) and
 * must be an object. Every field is either understood, accepted only at its
 * neutral value (n = 1, logprobs false, penalties 0), or refused: an unknown
 * field or a bad value is a 400 whose message and `param` name the field, in the
 * OpenAI error shape. JSON null means "absent" for every optional field (clients
 * send nulls). Limits that need the model (context, vocabulary) are checked by the
 * caller after tokenizing.
 */
#ifndef STRATA_SERVE_REQUEST_H
#define STRATA_SERVE_REQUEST_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "strata.h"

enum { REQ_CHAT = 1, REQ_COMPLETION = 2, REQ_TOKENIZE = 3, REQ_DETOKENIZE = 4 };

#define REQ_MAX_STOP 4          /* OpenAI's limit on stop strings */
#define REQ_MAX_STOP_BYTES 256  /* per stop string */
#define REQ_MAX_MSGS 4096
#define REQ_MAX_TOOLS 128       /* declared tools per request */
#define REQ_MAX_CALLS 128       /* tool calls per assistant message */

/* An error answer: HTTP status and the OpenAI error object fields. */
typedef struct req_error {
    int status;           /* 400, 401, 404, ... */
    char type[32];        /* "invalid_request_error", "server_error", ... */
    char code[48];        /* "invalid_value", "context_length_exceeded", ... ("" = null) */
    char param[64];       /* the field at fault ("" = null) */
    char message[512];
} req_error;


/* Fills e and returns -1 (so `return req_fail(...)` reads well). */
int req_fail(req_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    STRATA_PRINTF(6, 7);

typedef struct req_msg {
    int role;              /* STRATA_CHAT_SYSTEM, _USER, _ASSISTANT, _TOOL */
    const char *content;   /* NUL-terminated (no NUL inside), into the request's JSON or its own copy */
    const char *reasoning; /* assistant reasoning_content, or NULL */
    strata_chat_call *calls; /* assistant tool_calls (n_calls, counted); strings into the JSON */
    const char **call_ids;   /* (n_calls) their ids, counted */
    size_t n_calls;
    size_t call_of;        /* tool: the call its tool_call_id names (strata_chat_msg.call_of) */
} req_msg;

typedef struct request {
    int kind;                 /* REQ_* */
    json_t *root;             /* the parsed body; every string below points into it */
    const char *model;        /* NULL when absent */
    req_msg *msgs;            /* (n_msgs) chat; counted; cap_msgs allocated (zeroed: the
                               * slot being parsed may own calls before it is counted) */
    size_t n_msgs, cap_msgs;
    char **parts;             /* joined content-part strings owned by the request (counted) */
    size_t n_parts;
    const char *text;         /* completion prompt / tokenize content (may hold NUL bytes) */
    size_t text_len;
    int32_t *ids;             /* completion prompt ids / detokenize tokens (counted) */
    size_t n_ids;
    int has_ids;
    int64_t max_tokens;       /* 0 = not given */
    strata_gen_opts go;       /* the sampling fields (temp, top_k, top_p, min_p,
                               * repeat_penalty, seed) as given, else the defaults */
    const char *stop[REQ_MAX_STOP];
    size_t stop_len[REQ_MAX_STOP];
    int n_stop;
    int stream, include_usage;
    int n;                    /* choices (1 ..  REQ_MAX_N) */
    int has_seed;             /* 0: the server draws one (and returns it) */
    int has_temp, has_top_p;  /* 0: the server's defaults (generation_config.json) apply */
    int effort;               /* STRATA_CHAT_THINK_* (chat) */
    strata_chat_tool *tools;  /* (n_tools) declared tools, counted; parameters in parts */
    size_t n_tools;
    int tool_choice;          /* STRATA_CHAT_TOOLS_* */
    const char *tool_choice_name;
    int parallel_tools;       /* parallel_tool_calls (default true) */
    int parse_special;        /* tokenize: special-token text becomes its id */
    strata_grammar *grammar;  /* response_format json_object / json_schema, compiled (owned;
                               * the job takes it), else NULL; chat then renders without
                               * the think channel, so the whole reply is the document */
} request;

#define REQ_DEFAULT_SEED 0      /* go.seed before the server draws one (has_seed 0) */
#define REQ_DEFAULT_EFFORT 2    /* STRATA_CHAT_THINK_HIGH: what "medium", OpenAI's default, maps to */
#define REQ_MAX_N 16            /* choices per request (the server also caps them at --parallel) */
/* OpenAI's / Anthropic's effort names -> STRATA_CHAT_THINK_* (the nearest level
 * K3 has: off, low, high, max), or -1. */
int req_effort(const char *name);

/* Keeps s for the request's lifetime (freed with it); s NULL or no memory: 500. */
int req_own(request *r, char *s, req_error *e);
/* 1 when s is a tool name as OpenAI allows it: [A-Za-z0-9_-]{1,64}. */
int req_tool_name_ok(const char *s);
/* The tools array's shape both APIs check: an array of at most REQ_MAX_TOOLS
 * entries; *n its length. -1 with e set when it is not. */
int req_tools_count(const json_t *v, size_t *n, req_error *e);
/* A strict tool's schema must compile now (a forced call enforces it): 0,
 * STRATA_ENOMEM (e untouched: each API words its own 500), or -1 with e set
 * (param names the field). */
int req_tool_strict_schema(const json_t *schema, size_t i, const char *name, const char *param, req_error *e);
/* The number of the latest call with id among the calls of msgs[0..upto), in
 * order (strata_chat_msg.call_of), or (size_t)-1. */
size_t req_find_call(const request *r, size_t upto, const char *id);

/* Parses and validates body as a request of kind. 0, or -1 with e filled (the
 * request is then empty; request_free is still safe). */
int request_parse(request *r, int kind, const uint8_t *body, size_t len, req_error *e);
void request_free(request *r);

/* A growing byte buffer (counted), always NUL-terminated once anything was
 * added; oom is sticky (appends after a failed growth are dropped). */
typedef struct req_buf {
    char *p;
    size_t n, cap;
    int oom;
} req_buf;
void req_buf_add(req_buf *b, const void *s, size_t n);
void req_buf_addf(req_buf *b, const char *fmt, ...) STRATA_PRINTF(2, 3);
/* Appends s with each byte that is not part of a valid UTF-8 character replaced
 * by U+FFFD, so any model output can go into JSON. */
void req_buf_add_utf8(req_buf *b, const char *s, size_t n);
void req_buf_free(req_buf *b);
/* Length of the longest prefix of s[0..n) that is valid UTF-8 ending on a whole
 * character. */
size_t req_utf8_valid_prefix(const char *s, size_t n);

#endif
