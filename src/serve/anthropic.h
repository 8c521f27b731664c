/*
 * anthropic.h: POST /v1/messages, Anthropic's Messages API, on the same
 * request and job as the OpenAI endpoints (same engine path, same limits).
 *
 * A body becomes a `request` of kind REQ_CHAT: `system` (a string or text
 * blocks) is the first message, each message's content (a string or a list of
 * blocks) is parsed by a table of block types (text; thinking and tool_use on
 * assistant turns; tool_result on user turns, each a tool message answering
 * the tool_use of that id), `thinking` maps to the effort, `tools` and
 * `tool_choice` to the OpenAI path's (same renderer, forced-call grammar and
 * streaming parser). Answers and stream events are built here from the job's
 * text and calls (tool_use blocks, stop_reason "tool_use"); the HTTP side only
 * moves the bytes.
 */
#ifndef STRATA_SERVE_ANTHROPIC_H
#define STRATA_SERVE_ANTHROPIC_H

#include <jansson.h>
#include "request.h"
#include "sched.h"

/* Parses and validates a Messages body. 0, or -1 with e filled (request_free is
 * still safe). */
int anth_parse(request *r, const uint8_t *body, size_t len, req_error *e);
/* {"type":"error","error":{"type","message"}}: Anthropic's error shape of e. */
json_t *anth_error_json(const req_error *e);
/* The whole answer of a finished job (its mutex held or the job done). */
json_t *anth_message_json(const job *j, const char *id, const char *model);

/* A stream's progress through its events. */
typedef struct anth_stream {
    int started;            /* message_start sent */
    int block;              /* index of the open content block, -1 none */
    int block_kind;         /* 1 thinking, 2 text, 3 tool_use */
    int n_blocks;
    size_t sent_reasoning, sent_content, sent_calls;
    int done;               /* message_stop sent */
} anth_stream;
/* Appends the events of j's new text to out (j's mutex held): message_start
 * first, content blocks as the channels change, then at the end message_delta
 * (stop_reason, usage) and message_stop, or an error event for a failed job. */
void anth_stream_events(anth_stream *a, const job *j, const char *id, const char *model, req_buf *out);

#endif
