/*
 * chat_api.c: the "chat format" section of strata.h: the Kimi templates (chat.h)
 * and the streaming detokenizer (tok.h) behind public names. A strata_tokenizer
 * is a tok (tok_api.c); the public message, id and follower types are chat.h's
 * under other names, so the calls only cast.
 */
#include <stddef.h>
#include "chat.h"
#include "strata.h"
#include "tok.h"

_Static_assert((int)STRATA_CHAT_SYSTEM == (int)CHAT_SYSTEM && (int)STRATA_CHAT_USER == (int)CHAT_USER &&
                   (int)STRATA_CHAT_ASSISTANT == (int)CHAT_ASSISTANT, "public roles are chat.h's");
_Static_assert((int)STRATA_CHAT_THINK_OFF == (int)CHAT_THINK_OFF && (int)STRATA_CHAT_THINK_LOW == (int)CHAT_THINK_LOW &&
                   (int)STRATA_CHAT_THINK_HIGH == (int)CHAT_THINK_HIGH && (int)STRATA_CHAT_THINK_MAX == (int)CHAT_THINK_MAX,
               "public efforts are chat.h's");
_Static_assert((int)STRATA_CHAT_GEN == (int)CHAT_GEN && (int)STRATA_CHAT_CONTINUE == (int)CHAT_CONTINUE,
               "public render flags are chat.h's");
_Static_assert((int)STRATA_CHAT_CH_NONE == (int)CHAT_CH_NONE && (int)STRATA_CHAT_CH_THINK == (int)CHAT_CH_THINK &&
                   (int)STRATA_CHAT_CH_RESPONSE == (int)CHAT_CH_RESPONSE, "public channels are chat.h's");
_Static_assert(sizeof(strata_chat_msg) == sizeof(chat_msg) && offsetof(strata_chat_msg, role) == offsetof(chat_msg, role) &&
                   offsetof(strata_chat_msg, content) == offsetof(chat_msg, content) &&
                   offsetof(strata_chat_msg, reasoning) == offsetof(chat_msg, reasoning),
               "strata_chat_msg is laid out as chat_msg");
_Static_assert((int)STRATA_CHAT_FMT_XTML == (int)CHAT_FMT_XTML && (int)STRATA_CHAT_FMT_K2 == (int)CHAT_FMT_K2 &&
                   (int)STRATA_CHAT_FMT_DSV3 == (int)CHAT_FMT_DSV3 && (int)STRATA_CHAT_FMT_R1 == (int)CHAT_FMT_R1 &&
                   (int)STRATA_CHAT_FMT_V31 == (int)CHAT_FMT_V31 &&
                   (int)STRATA_CHAT_FMT_K2_THINKING == (int)CHAT_FMT_K2_THINKING && (int)STRATA_CHAT_FMT_K25 == (int)CHAT_FMT_K25,
               "public chat formats are chat.h's");
_Static_assert(sizeof(strata_chat_ids) == sizeof(chat_ids) && offsetof(strata_chat_ids, fmt) == offsetof(chat_ids, fmt) &&
                   offsetof(strata_chat_ids, eom) == offsetof(chat_ids, eom) &&
                   offsetof(strata_chat_ids, im_middle) == offsetof(chat_ids, im_middle) &&
                   offsetof(strata_chat_ids, eos) == offsetof(chat_ids, eos) &&
                   offsetof(strata_chat_ids, bos) == offsetof(chat_ids, bos) &&
                   offsetof(strata_chat_ids, think_end) == offsetof(chat_ids, think_end),
               "strata_chat_ids is laid out as chat_ids");

static tok *T(strata_tokenizer *t) { return (tok *)t; }
static const tok *CT(const strata_tokenizer *t) { return (const tok *)t; }

int strata_chat_effort_parse(const char *s) { return chat_effort_parse(s); }
const char *strata_chat_effort_name(int effort) { return chat_effort_name(effort); }
int strata_chat_role_parse(const char *s) { return chat_role_parse(s); }

int strata_chat_ids_get(const strata_tokenizer *t, strata_chat_ids *out, char *err, size_t errlen) {
    return chat_ids_init((chat_ids *)out, CT(t), err, errlen);
}

int strata_chat_render(strata_tokenizer *t, const strata_chat_msg *msgs, size_t n_msgs, int effort, int flags,
                       int32_t **ids, size_t *n, size_t *cap, char *err, size_t errlen) {
    return chat_render(T(t), (const chat_msg *)msgs, n_msgs, effort, flags, ids, n, cap, err, errlen);
}

/* A strata_chat_follow is a chat_follow. */
int strata_chat_follow_open(strata_chat_follow **out, const strata_tokenizer *t, int thinking, char *err,
                            size_t errlen) {
    return chat_follow_open((chat_follow **)out, CT(t), thinking, err, errlen);
}
int strata_chat_follow_push(strata_chat_follow *f, int32_t id, int *channel, const uint8_t **p, size_t *n) {
    return chat_follow_push((chat_follow *)f, id, channel, p, n);
}
void strata_chat_follow_flush(strata_chat_follow *f, int *channel, const uint8_t **p, size_t *n) {
    chat_follow_flush((chat_follow *)f, channel, p, n);
}
void strata_chat_follow_close(strata_chat_follow *f) { chat_follow_close((chat_follow *)f); }

/* A strata_detok is a tok_stream. */
int strata_detok_open(strata_detok **out, const strata_tokenizer *t) { return tok_stream_open((tok_stream **)out, CT(t)); }
int strata_detok_push(strata_detok *s, int32_t id, const uint8_t **p, size_t *n) {
    return tok_stream_push((tok_stream *)s, id, p, n);
}
void strata_detok_flush(strata_detok *s, const uint8_t **p, size_t *n) { tok_stream_flush((tok_stream *)s, p, n); }
void strata_detok_close(strata_detok *s) { tok_stream_close((tok_stream *)s); }
