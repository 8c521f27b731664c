/*
 * toolgram.h: the grammar of a forced tool call (tool_choice "required" or a
 * named tool): the bytes the format's table (tools.c) puts around a call,
 * composed with each tool's parameters schema compiled by jschema.c, as one
 * jgram (jgram.h's SEQ / KEYED / RAW nodes), applied to the tokens after the
 * prefill that opened the call (tools_emit_prefill).
 *
 * The language (docs/serve.md "Tool calls", strict arguments):
 * - the rest of the opening call head: one of the declared names (REQUIRED)
 *   with the index the renderer writes; NAMED: the prefill already named it;
 * - the arguments: a document of the tool's parameters schema (every forced
 *   call, strict or not; a schema that does not compile or does not describe
 *   an object: strict is an error, otherwise any JSON object). JSON formats
 *   (K2, DeepSeek-V3) write it as JSON text; XTML as typed argument blocks in
 *   schema order (strings raw, the type attribute the value's JSON type), or,
 *   for a free-form object, keys that cannot be typed or a tokenizer without
 *   XTML's markers as special tokens, the one JSON block the parser also reads;
 * - the call tail; then, with REQUIRED and parallel calls, up to
 *   TOOLS_MAX_FORCED_CALLS calls, each another declared name; the section's
 *   close; then only an end id. NAMED forces exactly one call.
 * Control markers that are special tokens must be those ids (JG_SPECIAL_LEAD
 * bytes); the others are their text.
 */
#ifndef STRATA_TOOLGRAM_H
#define STRATA_TOOLGRAM_H

#include <stddef.h>
#include <stdint.h>
#include "jgram.h"
#include "tools.h"

#define TOOLS_MAX_FORCED_CALLS 8

/* The special id of a control marker ("<|open|>", n bytes), or -1. */
typedef int32_t (*tools_special_fn)(void *ud, const char *marker, size_t n);

/* *out: the grammar, or NULL when the choice forces no call. STRATA_EINVAL (a
 * strict tool's schema, naming the tool and the keyword), STRATA_ENOMEM. MEM_MISC. */
int tools_grammar(jgram **out, int fmt, const chat_tools *tools, size_t calls_before, tools_special_fn special, void *ud,
                  char *err, size_t errlen);

#endif
