/*
 * stream_test.h: what the streaming suites share (t_stream.c, t_stream_bits.c,
 * t_stream_verify.c); defined in t_stream_util.c.
 */
#ifndef STRATA_STREAM_TEST_H
#define STRATA_STREAM_TEST_H
#include "infer.h"
#include "place.h"
#include "test.h"

const char *tpack_model(const char *name, const char *dir, uint64_t seed); /* t_pack.c */
const char *tpack_fresh(const char *name, const char *dir, uint64_t seed); /* t_pack.c: a copy to damage */

/* A generated model's config, shards, bindings and its resident oracle. */
typedef struct tstream_model {
    cfg c;
    st_index *ix;
    model_layout lay;
    wsrc *res; /* resident oracle */
} tstream_model;

/* Opens dir into m (0), or -1 with the reason on stderr. */
int tstream_model_open(tstream_model *m, const char *dir);
void tstream_model_close(tstream_model *m);
/* The generated model preset (t_pack.c's tpack_model) opened into m: its
 * directory, or NULL (a failed check) when it cannot be made or opened. */
const char *tstream_preset_open(tstream_model *m, const char *preset, const char *dirname, uint64_t seed);
/* Every unit (twice, so streamed units are re-read; in another order when
 * shuffle), every expert, some embedding rows: the stream's views equal the
 * resident oracle's. Returns mismatches. */
int tstream_compare_all(tstream_model *m, wsrc *w, int shuffle);
/* Placement options at the budget ram (0: resident), with a fixed overhead so
 * budgets computed here stay comparable. */
place_opts tstream_opts(uint64_t ram);
/* Plans m at o and opens the streaming source: NULL (a failed check naming the
 * error) when either fails. */
wsrc *tstream_open(tstream_model *m, const char *dir, const place_opts *o, place_plan *p);
/* Three budgets: the floor, a third of the way up to everything, resident (0). */
void tstream_budgets(tstream_model *m, const char *dir, uint64_t b[3]);
/* Greedy decode of n_gen tokens after a fixed prompt through the engine on w:
 * the ids and the last logits; 0 or the failing rc (message on stderr). */
int tstream_decode(tstream_model *m, wsrc *w, int64_t chunk, int32_t *ids_out, int n_gen, float *last_logits);

/* G greedy tokens' ids and last logits: a reference decode's (want, wl) and
 * the one compared with it (got, gl). */
enum { TSTREAM_MAX_G = 8 };
typedef struct tstream_pair {
    int g;
    int32_t want[TSTREAM_MAX_G], got[TSTREAM_MAX_G];
    float *wl, *gl;
} tstream_pair;

/* With m's resident source decoded into the reference half when resident. */
void tstream_pair_init(tstream_pair *d, tstream_model *m, int g, int resident);
void tstream_pair_free(tstream_pair *d);
/* The compared ids and logits bits equal the reference's; what names the case. */
void tstream_pair_check(const tstream_pair *d, const tstream_model *m, const char *what);
/* Decodes on w into the compared half, then tstream_pair_check. */
void tstream_pair_same(tstream_pair *d, tstream_model *m, wsrc *w, int64_t chunk, const char *what);
/* Flips one byte and puts the file's modification time back: damage the pack's
 * stamps cannot see (bit rot, or an editor that keeps mtimes). Twice restores. */
void tstream_flip_keep_mtime(const char *path, uint64_t off);

#endif
