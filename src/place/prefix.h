/*
 * prefix.h: the prefix cache. A request whose prompt extends one already
 * evaluated (a chat that re-sends its history every turn) starts from a snapshot
 * of that evaluation instead of position 0.
 *
 * A snapshot is a sequence's whole state at one position p (session_parts):
 * token ids [0, p), the KDA conv history and recurrent state at exactly p, and
 * the MLA latent rows [0, p). It is keyed by p and the XXH3-64 of ids [0, p); a
 * lookup hashes the prompt's prefix at every stored position, takes the longest
 * match, checks the ids themselves, and copies the snapshot into the sequence.
 * The engine's state after p tokens does not depend on how they were batched or
 * split into passes, so what follows is bit-identical to a full re-prefill.
 *
 * Two tiers:
 *   RAM   one arena of ram_bytes allocated at open (counted in the model's plan),
 *         split into pages; a snapshot is a chain of pages; least recently used
 *         snapshots leave first. Peak RSS never exceeds the arena, whatever the
 *         sizes that come and go (no heap fragmentation).
 *   disk  an optional directory (bounded by dir_bytes): a snapshot leaving RAM, or
 *         one larger than the arena, is written there, and a lookup reads it back
 *         straight into the sequence. Files are written atomically through vfs
 *         (name.tmp.PID, then rename; no fsync: a file cut short by a crash
 *         fails its size or checksum check) and carry the model identity, the
 *         key and an XXH3-64 of everything; a file that fails any check (another model,
 *         wrong size, other tokens, non-finite values, checksum) is refused with a
 *         logged warning naming it and the reason, and the lookup goes on as a
 *         miss. Files that are not ours (by name) are never touched.
 *
 * File layout (little-endian), name "<model id %016x>-<p>-<key %016x>.strp":
 *   "STRP" magic, u32 version (1), u64 model id, i64 p, u64 body bytes, u64 key,
 *   body (the regions of session_parts in order), u64 XXH3-64 of all before it.
 *
 * Single caller (the model's): no locks. Allocates only at open; stores and
 * lookups copy into preallocated pages or do file I/O.
 */
#ifndef STRATA_PREFIX_H
#define STRATA_PREFIX_H

#include <stddef.h>
#include <stdint.h>
#include "infer.h"

typedef struct prefix_cache prefix_cache;

typedef struct prefix_opts {
    uint64_t ram_bytes;   /* RAM tier arena (0 = disk tier only) */
    const char *dir;      /* disk tier directory (created), NULL = none */
    uint64_t dir_bytes;   /* bound on this model's files in dir (0 = 8 GB) */
    uint64_t model_id;    /* written into and required from files */
} prefix_opts;

/* The STRATA_STATS_PREFIX list of strata.h (meanings there). */
typedef struct prefix_stats {
    STRATA_STATS_PREFIX(STRATA_STAT_MEMBER)
} prefix_stats;

/* Bytes prefix_open allocates for o (the arena plus its tables), for the plan. */
uint64_t prefix_alloc_bytes(const prefix_opts *o);

/* Opens the cache for sequences of engine e. With a directory, creates it, takes
 * its lock (an flock on DIR/strata-prefix.lock, which holds the pid; released by
 * prefix_close or the process's end; held elsewhere: STRATA_EBUSY naming the
 * directory and that pid, before any file is touched) and indexes this model's
 * files already there (a restarted server reuses them), removing the oldest
 * beyond dir_bytes. Close with prefix_close. */
int prefix_open(prefix_cache **out, engine *e, const prefix_opts *o, char *err, size_t errlen);
/* STRATA_EBUSY (err names dir and the holder's pid) when another process holds
 * dir's lock, 0 otherwise (also when dir does not exist yet). A check only: it
 * takes nothing; prefix_open takes the lock. */
int prefix_dir_check(const char *dir, char *err, size_t errlen);
void prefix_close(prefix_cache *pc); /* accepts NULL */

/* Keeps a snapshot of s at its current position (nothing when one with the same
 * key is held, or at position 0). Returns 0, or a negative STRATA_E* when it
 * could not be kept (not fatal: the message is in prefix_errmsg). */
int prefix_store(prefix_cache *pc, session *s);
/* s must be reset. Restores into s the longest held snapshot of a prefix of
 * ids[0, n) and returns its position (0: none). A file that fails its checks is
 * refused (and removed) and the next candidate is tried. */
int64_t prefix_restore(prefix_cache *pc, session *s, const int32_t *ids, int64_t n);

void prefix_get_stats(const prefix_cache *pc, prefix_stats *st);
void prefix_reset_stats(prefix_cache *pc); /* counters only */
const char *prefix_errmsg(const prefix_cache *pc); /* the last problem ("" if none) */

#endif
