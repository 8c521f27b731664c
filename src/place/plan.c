/*
 * plan.c: the memory plan (see place.h) and the bandwidth probe behind its
 * prediction.
 *
 * Order of the budget, from the public engine's measurements (docs/architecture.md,
 * Budget order:
 * at a fixed total, a GB of trunk removed ~1.17 GB/token of certain traffic, ~70x
 * a GB of expert cache at the margin):
 *   1. the floor: process baseline + the sequences (n_seqs x session) + engine
 *      scratch for the rows of one pass + I/O buffers + an arena holding the
 *      largest trunk unit + one row's experts (top-k slots). The rows per pass
 *      (prefill_chunk) never depend on the budget: a pass whose expert union
 *      exceeds the cache streams it through the cache in a sliding window
 *      (moe.c moe_layer), so a budget only changes how often an expert is
 *      read, never how many rows share a trunk read;
 *   2. an arena of two consecutive streamed units, so the reader thread loads
 *      layer L+1 while L computes (the seed measured 71.75 -> 42.27 s/token);
 *   3. trunk units pinned largest-first, iterated to a fixed point (pinning the
 *      largest shrinks the arena the rest needs: K3's dense layer 0 is 2.37 GB
 *      against 1.29 GB for a MoE layer);
 *   4. the embedding table resident once the whole trunk is pinned (it saves only
 *      a row per token);
 *   5. everything left to the expert cache.
 * Below the whole-unit floor of step 1 (or where it reads fewer bytes per token)
 * streamed units are their small tensors through the arena and their large
 * matrices in row slices (place.h PLACE_SLICE_BYTES): the floor is then the
 * largest unit's small tensors plus four slice buffers.
 * The walk is cyclic, so pinning K of N units saves exactly K/N of the streamed
 * bytes every token; an LRU over layers would save nothing.
 */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "io.h"
#include "membw.h"
#include "pack.h"
#include "place.h"

place_opts place_opts_default(void) {
    return (place_opts){.prefill_chunk = 64, .ctx = 4096, .cache_policy = PLACE_POLICY_LAYER};
}

static const char *const k_policy[] = {"s3fifo", "lru", "lfu", "layer"};

int place_policy_parse(const char *name) {
    for (int i = 0; i < 4; i++) if (!strcmp(name, k_policy[i])) return i;
    return -1;
}

const char *place_policy_name(int policy) { return policy >= 0 && policy < 4 ? k_policy[policy] : "?"; }

/* ================================================================= estimates */

static uint64_t est_session(const cfg *c, int64_t ctx) {
    cfg_census k; /* on the stack: no state shared between plans (two models in one process) */
    schema_census(c, &k);
    return k.kda_state_elems * 4 + (uint64_t)ctx * (k.mla_cache_elems_per_pos * 4 + 4);
}

static uint64_t est_engine(const cfg *c, int64_t T, int n_threads) {
    int64_t P = c->kda_heads * c->kda_head_dim, H = c->hidden;
    int64_t wide = P * 8;
    if (c->dense_inter * 2 > wide) wide = c->dense_inter * 2;
    int64_t moe = c->topk * c->latent * 2 + c->n_shared * c->moe_inter * 2 + c->n_experts + c->moe_inter * 3;
    if (moe > wide) wide = moe;
    int64_t blocks = c->n_layers / (c->attn_res_block ? c->attn_res_block : 1) + 2;
    return (uint64_t)(T * (H * (8 + blocks) + wide) + c->vocab * 2) * 4 + (16u << 20);
}

static uint64_t rss_now(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return res * (uint64_t)sysconf(_SC_PAGESIZE);
}

typedef struct ncount { int64_t n; } ncount;
static int count_fn(void *ud, const tspec *t) { (void)t; ((ncount *)ud)->n++; return 0; }

typedef struct small_acc small_acc;
static uint64_t plan_total(const place_plan *p);
static uint64_t ring_need(const place_plan *p, int pair);
static int small_fn(void *ud, const tspec *t);

/* The floor with streamed units in row slices of sb bytes; sets the slice fields,
 * the small parts and the arena, and returns the plan's total. */
static uint64_t plan_slices(place_plan *p, const cfg *c, uint64_t sb);

/* A unit's arena bytes when sliced: its tensors that stay whole, each bounded as
 * f32 (4 bytes an element) plus an in-place read's alignment; sliced matrices are
 * judged by their bf16 bytes (a wider dtype only makes them larger). */
struct small_acc { uint64_t thr, bytes; int head; };
static int small_fn(void *ud, const tspec *t) {
    small_acc *a = ud;
    if (a->head && t->cls != TC_FINAL && t->cls != TC_LM_HEAD) return 0;
    if (t->kind == TK_MATRIX && place_sliceable_role(t->role) && (uint64_t)t->numel * 2 > a->thr) return 0;
    a->bytes += io_align_up((uint64_t)t->numel * 4) + 3 * IO_ALIGN;
    return 0;
}

/* ==================================================================== ring */

/* Arena bytes the unpinned units need: the largest one (single), or the largest
 * sum of two consecutive ones in the cyclic walk (pair: read-ahead overlaps). */
static uint64_t ring_need(const place_plan *p, int pair) {
    uint64_t best = 0, first = 0, prev = 0;
    int have_prev = 0;
    for (int64_t u = 0; u < p->n_units; u++) {
        if (p->pinned[u]) continue;
        uint64_t b = p->sliced ? p->small_bytes[u] : p->unit_bytes[u];
        if (b > best) best = b;
        if (pair && have_prev && prev + b > best) best = prev + b;
        if (!have_prev) first = b;
        prev = b;
        have_prev = 1;
    }
    if (pair && have_prev && first != 0) {
        /* wrap-around pair (last unpinned, then the first) when there are two */
        int64_t n_un = 0;
        for (int64_t u = 0; u < p->n_units; u++) n_un += !p->pinned[u];
        if (n_un >= 2 && prev + first > best) best = prev + first;
    }
    return best;
}

static uint64_t plan_slices(place_plan *p, const cfg *c, uint64_t sb) {
    p->sliced = 1;
    p->slice_bytes = sb;
    p->slice_min_bytes = sb / 4;
    p->n_slices = PLACE_N_SLICES;
    p->slice_pool_bytes = (uint64_t)p->n_slices * (sb + 2 * IO_ALIGN);
    for (int64_t u = 0; u < p->n_units; u++) {
        small_acc a = {p->slice_min_bytes, 0, u == c->n_layers};
        if (u < c->n_layers) schema_walk_layer(c, u, c->wf, small_fn, &a);
        else schema_walk_head(c, small_fn, &a);
        p->small_bytes[u] = a.bytes < p->unit_bytes[u] ? a.bytes : p->unit_bytes[u];
    }
    p->ring_bytes = p->ring_min_bytes = ring_need(p, 0);
    return p->total_bytes = plan_total(p);
}

static uint64_t plan_total(const place_plan *p) {
    return p->overhead_bytes + p->index_bytes + p->session_bytes + p->engine_bytes + p->extra_bytes + p->prefix_bytes + p->io_bytes + p->pinned_bytes + p->guess_bytes +
           p->ring_bytes + (p->embed_resident ? p->embed_bytes : 0) + p->cache_bytes + (p->sliced ? p->slice_pool_bytes : 0);
}

/* RAM of one more expert slot, and of a cache of n slots: their bytes and the
 * bookkeeping the streaming source keeps beside them (place_cache_meta_bytes). */
static uint64_t slot_cost(const place_plan *p) { return p->expert_slot_bytes + p->slot_meta_bytes; }
static uint64_t cache_cost(const place_plan *p, int64_t n) {
    return n > 0 ? (uint64_t)n * slot_cost(p) + p->cache_meta_bytes : 0;
}

/* The guesses' router copies (place_plan.guess_u) for the pinned units, given
 * `room` bytes left for the expert cache and them: none where the cache would
 * hold every expert without them (a guess would read nothing) or where they take
 * more than an eighth of the room. Ladder: 36 x 0.46 MB against 3.6 GB of cache
 * at 6.2 GB; K3 pinned whole: 92 x 3.4 MB. */
static void plan_guess(place_plan *p, uint64_t room, int64_t n_expert_all) {
    p->guess_bytes = 0;
    p->n_guess = 0;
    for (int64_t u = 0; u < p->n_units; u++) p->n_guess += p->pinned[u] && p->guess_u[u];
    const uint64_t g = (uint64_t)p->n_guess * p->guess_one_bytes;
    /* room is beyond the cache's floor, which plan_total already counts */
    const int64_t slots = p->min_expert_slots + (slot_cost(p) ? (int64_t)(room / slot_cost(p)) : 0);
    if (g && slots < n_expert_all && g <= room / 8) p->guess_bytes = g;
    else p->n_guess = 0;
}

/* Steps 2-5 under a budget: arena for overlap, pins largest-first to a fixed
 * point, the embedding table, the expert cache (p's floor already set). */
static void plan_fill(place_plan *p, uint64_t budget, int64_t n_expert_all) {
    /* ---- 2-3. arena for overlap, then pins largest-first to a fixed point ---- */
    int64_t order[PLACE_MAX_UNITS];
    for (int64_t u = 0; u < p->n_units; u++) order[u] = u;
    for (int64_t i = 1; i < p->n_units; i++) { /* insertion sort: largest first, ties by index */
        int64_t x = order[i], j = i;
        while (j > 0 && p->unit_bytes[order[j - 1]] < p->unit_bytes[x]) { order[j] = order[j - 1]; j--; }
        order[j] = x;
    }
    int pair = 1;
    p->ring_bytes = ring_need(p, 1);
    if (plan_total(p) > budget) { pair = 0; p->ring_bytes = ring_need(p, 0); }
    for (int pass = 0; pass < 8; pass++) {
        int changed = 0;
        for (int64_t i = 0; i < p->n_units; i++) {
            int64_t u = order[i];
            if (p->pinned[u]) continue;
            p->pinned[u] = 1;
            p->pinned_bytes += p->unit_bytes[u];
            uint64_t save = p->ring_bytes;
            p->ring_bytes = ring_need(p, 1);
            int pair_ok = plan_total(p) <= budget;
            if (!pair_ok) p->ring_bytes = ring_need(p, 0);
            /* never trade away read-ahead overlap for a pin (keeps the arena mode) */
            if (plan_total(p) <= budget && (pair_ok || !pair)) {
                changed = 1;
                pair = pair_ok;
            } else {
                p->pinned[u] = 0;
                p->pinned_bytes -= p->unit_bytes[u];
                p->ring_bytes = save;
            }
        }
        if (!changed) break;
    }
    p->n_pinned = 0;
    for (int64_t u = 0; u < p->n_units; u++) p->n_pinned += p->pinned[u];
    p->ring_min_bytes = ring_need(p, 0);
    if (p->n_pinned == p->n_units) p->ring_bytes = p->ring_min_bytes = 0;
    /* ---- 4. embedding table ---- */
    if (p->n_pinned == p->n_units) {
        p->embed_resident = 1;
        if (plan_total(p) > budget) p->embed_resident = 0;
    }
    /* ---- 5. the expert cache takes the rest, less the guesses' router copies ---- */
    plan_guess(p, budget > plan_total(p) ? budget - plan_total(p) : 0, n_expert_all);
    uint64_t used = plan_total(p);
    int64_t extra = p->expert_slot_bytes && budget > used ? (int64_t)((budget - used) / slot_cost(p)) : 0;
    p->n_expert_slots = p->min_expert_slots + extra;
    if (p->n_expert_slots > n_expert_all) p->n_expert_slots = n_expert_all > p->min_expert_slots ? n_expert_all : p->min_expert_slots;
    p->cache_bytes = cache_cost(p, p->n_expert_slots);
}

/* The expert cache's hit rate under uniform routing, over this process's MoE
 * layers (a pipeline stage holds some): shared by the one-token figures and the
 * n-row step prediction. */
static double plan_hit(const place_plan *p, const cfg *c) {
    const int64_t n_expert_all = p->n_moe * c->n_experts;
    const double hit = n_expert_all ? (double)p->n_expert_slots / (double)n_expert_all : 0;
    return hit > 1 ? 1 : hit;
}

/* Every trunk unit's bytes, pinned or streamed: what a pass touches in memory. */
static uint64_t plan_trunk_all(const place_plan *p) {
    uint64_t t = 0;
    for (int64_t u = 0; u < p->n_units; u++) t += p->unit_bytes[u];
    return t;
}

/* Bytes a decode token reads from disk and touches in memory (batch 1, the
 * expert cache at its uniform-routing hit rate), and the totals they follow. */
static void plan_reads(place_plan *p, const cfg *c) {
    p->streamed_bytes = 0;
    for (int64_t u = 0; u < p->n_units; u++) if (!p->pinned[u]) p->streamed_bytes += p->unit_bytes[u];
    p->total_bytes = plan_total(p);
    p->resident = p->n_pinned == p->n_units && p->embed_resident;
    const double hit = plan_hit(p, c);
    p->expert_hit_uniform = hit;
    uint64_t expert_tok = (uint64_t)p->n_moe * (uint64_t)c->topk * p->expert_bytes;
    const uint64_t emb = p->no_head ? 0 : p->embed_row_bytes; /* the embedding lives with the head */
    p->read_bytes_per_token = p->streamed_bytes + (uint64_t)((double)expert_tok * (1 - hit)) + emb;
    p->touch_bytes_per_token = plan_trunk_all(p) + expert_tok + emb + p->state_touch_bytes;
}

/* ==================================================================== plan */

/* The options the plan carries as they are, this process's layers [lo, hi) and
 * units (absent: held by another process), and the pack to read from. */
static int plan_setup(place_plan *p, const cfg *c, const char *model_dir, const place_opts *o, int64_t *lo_out,
                      int64_t *hi_out, char *err, size_t errlen) {
    p->n_layers = c->n_layers;
    p->n_units = c->n_layers + 1;
    p->ctx = o->ctx > 0 ? o->ctx : 4096;
    p->n_threads = o->n_threads;
    p->cache_policy = o->cache_policy;
    p->verify_reads = o->verify_reads;
    p->no_uring = o->no_uring;
    p->no_readahead = o->no_readahead;
    p->mem_limit = o->mem_limit;
    if (o->trace_path) snprintf(p->trace_path, sizeof p->trace_path, "%s", o->trace_path);
    p->no_prefetch = o->no_prefetch;
    const int64_t lo = o->layer_lo > 0 ? o->layer_lo : 0, hi = o->layer_hi > 0 && o->layer_hi < c->n_layers ? o->layer_hi : c->n_layers;
    if (lo >= hi) return base_fail(err, errlen, STRATA_EINVAL, "plan: empty layer range [%lld, %lld)", (long long)lo, (long long)hi);
    p->no_head = o->no_head;
    for (int64_t u = 0; u < p->n_units; u++)
        p->absent[u] = u < c->n_layers ? (u < lo || u >= hi) : o->no_head != 0;
    p->no_preload = o->no_preload;
    p->progress = o->progress;
    p->progress_ud = o->progress_ud;
    if (model_dir && !(o->pack_dir && !o->pack_dir[0])) {
        if (o->pack_dir) {
            char m[2048];
            snprintf(m, sizeof m, "%s/manifest.json", o->pack_dir);
            if (!base_is_file(m)) return base_fail(err, errlen, STRATA_EINVAL, "plan: --pack %s holds no manifest.json", o->pack_dir);
            snprintf(p->pack_dir, sizeof p->pack_dir, "%s", o->pack_dir);
            p->has_pack = 1;
        } else {
            p->has_pack = pack_find_ex(model_dir, p->pack_dir, sizeof p->pack_dir, p->unverified, sizeof p->unverified) == 1;
            if (!p->has_pack) p->pack_dir[0] = 0;
        }
    }
    *lo_out = lo;
    *hi_out = hi;
    return 0;
}

/* Unit sizes: exact for a pack (64-aligned tensors in a padded run); bounded for
 * in-place reads (each segment is widened to 4096 on both sides). Returns the
 * tensors of the units this process holds. */
static int64_t plan_units(place_plan *p, const cfg *c, const model_layout *lay, const cfg_census *k) {
    int64_t n_tensors_all = 0;
    for (int64_t u = 0; u < p->n_units; u++) {
        ncount n = {0};
        uint64_t bytes;
        if (p->absent[u]) { /* held by another process: pinned at no cost, never read */
            p->unit_bytes[u] = 0;
            p->pinned[u] = 1;
            continue;
        }
        if (u < c->n_layers) {
            schema_walk_layer(c, u, c->wf, count_fn, &n);
            bytes = lay ? lay->layer_bytes[u] : k->layer_bytes_bf16[u];
        } else {
            n.n = 4;
            bytes = lay ? lay->head_bytes : k->embed_bytes_bf16 / 2 + (uint64_t)(3 * c->hidden * 2);
        }
        n_tensors_all += n.n;
        if (p->has_pack) p->unit_bytes[u] = io_align_up(bytes + (uint64_t)n.n * PACK_TENSOR_ALIGN);
        else if (lay && lay->layers_contiguous && u < c->n_layers) p->unit_bytes[u] = io_align_up(bytes) + 2 * IO_ALIGN;
        else p->unit_bytes[u] = io_align_up(bytes) + (uint64_t)n.n * 3 * IO_ALIGN;
    }
    return n_tensors_all;
}

/* What does not depend on the budget: the embedding, the experts and their
 * cache's index, the guesses, the recurrent state a token touches, the process
 * and index overhead, the sequences and the I/O buffers. */
static void plan_fixed(place_plan *p, const cfg *c, const model_layout *lay, const place_opts *o, const cfg_census *k,
                       int64_t lo, int64_t hi, int64_t n_tensors_all) {
    uint64_t embed = o->no_head ? 0 : lay ? lay->embed_bytes : (uint64_t)(c->vocab * c->hidden * 2);
    p->embed_row_bytes = c->vocab ? embed / (uint64_t)c->vocab : 0;
    p->embed_bytes = io_align_up(embed);
    int64_t n_moe = 0;
    for (int64_t L = lo; L < hi; L++) n_moe += cfg_is_moe(c, L) ? 1 : 0;
    p->n_moe = n_moe;
    {
        const uint64_t w = (uint64_t)c->n_experts * (uint64_t)c->hidden;
        p->guess_one_bytes = c->hidden % 32 ? 0 : place_guess_bytes(w);
        for (int64_t u = 0; u < c->n_layers; u++)
            p->guess_u[u] = p->guess_one_bytes && !o->no_prefetch && !p->absent[u] && cfg_is_moe(c, u);
    }
    /* a decode row reads and writes its whole recurrent state in every KDA layer
     * (ladder: 2 x 30 MB per token, 2.1% of what the weights add) */
    int64_t n_kda = 0;
    for (int64_t L = lo; L < hi; L++) n_kda += c->is_mla[L] ? 0 : 1;
    const uint64_t kda_layer = k->n_kda > 0 ? k->kda_state_elems / (uint64_t)k->n_kda : 0; /* the census's layout */
    p->state_touch_bytes = 2 * (uint64_t)n_kda * kda_layer * sizeof(float);
    p->n_kda_layers = n_kda;
    p->n_mla_layers = hi - lo - n_kda;
    p->n_owned = 0;
    for (int64_t u = 0; u < p->n_units; u++) p->n_owned += !p->absent[u];
    const int64_t n_expert_all = n_moe * c->n_experts;
    p->expert_bytes = lay ? lay->expert_bytes : k->expert_bytes;
    p->expert_slot_bytes = (lay && !lay->experts_contiguous) ? io_align_up(p->expert_bytes) + 6 * 3 * IO_ALIGN
                                                             : io_align_up(p->expert_bytes) + 2 * IO_ALIGN;
    n_tensors_all += n_expert_all * 6 + 1;
    if (n_moe > 0) { /* the cache's keys span every MoE layer of the model (place_open) */
        const int64_t nl = c->n_layers - c->first_dense, nk = nl * c->n_experts;
        p->cache_meta_bytes = place_cache_meta_bytes(nk, nl, c->n_experts, 0);
        p->slot_meta_bytes = place_cache_meta_bytes(nk, nl, c->n_experts, 1) - p->cache_meta_bytes;
    }
    /* fixed costs: the process as it stands (binary, libc, the index when loaded)
     * plus thread stacks and allocator slack; the tensor index for `--config`; the
     * manifest when a pack is used */
    uint64_t base = rss_now();
    p->overhead_bytes = o->overhead_bytes ? o->overhead_bytes
                                          : base + (uint64_t)(o->n_threads > 0 ? o->n_threads + 3 : 8) * (256u << 10) + (24u << 20);
    p->index_bytes = lay ? 0 : (uint64_t)n_tensors_all * 256;
    if (p->has_pack) {
        p->index_bytes += (uint64_t)n_tensors_all * 48 + (uint64_t)p->n_units * 4096;
        /* the matrices' row-block hashes (pack.h): 8 bytes kept and a flag per block,
         * ~100 more while the manifest's hex strings are parsed (jansson) */
        uint64_t tb = 0;
        for (int64_t u = 0; u < p->n_units; u++) tb += p->unit_bytes[u];
        p->index_bytes += (tb / PACK_BLOCK_BYTES + (uint64_t)p->n_units) * 112;
    }
    p->n_seqs = o->n_seqs > 0 ? o->n_seqs : 1;
    p->seq_bytes = o->seq_bytes ? o->seq_bytes : o->session_bytes ? o->session_bytes(c, p->ctx) : est_session(c, p->ctx);
    p->session_bytes = p->seq_bytes * (uint64_t)p->n_seqs;
    p->extra_bytes = o->extra_bytes;
    p->prefix_bytes = o->prefix_bytes;
    /* I/O: per-ring descriptors, the embedding-row bounce buffer (64 rows), and
     * the read-ahead/verification staging */
    p->io_bytes = (4u << 20) + io_align_up(p->embed_row_bytes * 64) + 4 * IO_ALIGN;
}

/* The floor at the requested rows per pass, whole units or row slices: sets the
 * minimum and, with a budget, which of the two fit (*whole_ok, *sliced_ok; alt:
 * the sliced variant when whole units fit too). Fails when nothing fits. */
static int plan_floor(place_plan *p, const cfg *c, const place_opts *o, place_plan *alt, int *whole_ok_out,
                      int *sliced_ok_out, char *err, size_t errlen) {
    int64_t chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 64;
    const uint64_t budget = o->ram_bytes;
    p->budget_bytes = budget;
    /* ---- 1. the floor, at the requested rows per pass ---- */
    p->prefill_chunk = chunk;
    p->engine_bytes = o->engine_bytes ? o->engine_bytes(c, chunk, o->n_threads) : est_engine(c, chunk, o->n_threads);
    p->min_expert_slots = p->n_moe ? (c->topk < c->n_experts ? c->topk : c->n_experts) : 0;
    p->n_expert_slots = p->min_expert_slots;
    p->cache_bytes = cache_cost(p, p->n_expert_slots);
    p->ring_bytes = p->ring_min_bytes = ring_need(p, 0);
    p->total_bytes = p->min_bytes = plan_total(p);
    /* below the whole-unit floor: streamed units in row slices, the largest
     * slices that fit (64, 32, 16, 8 MiB; bench_io --slices on ladder's shards,
     * means of 3 rounds, next slice in flight: 0.78 / 0.75 / 0.72 / 0.73 GB/s,
     * 4 MiB 0.69, 128 MiB 0.82); the minimum is the lower of the two floors */
    const uint64_t whole = p->total_bytes, whole_ring = p->ring_min_bytes;
    const uint64_t sb_max = o->slice_bytes ? io_align_up(o->slice_bytes) : PLACE_SLICE_BYTES;
    const uint64_t sb_min = o->slice_bytes ? sb_max : (8u << 20);
    const uint64_t sliced_floor = plan_slices(p, c, sb_min);
    p->min_bytes = o->force_slices || sliced_floor < whole ? sliced_floor : whole;
    const int whole_ok = budget && whole <= budget && !o->force_slices;
    int sliced_ok = 0;
    if (budget) { /* the largest slices that fit */
        uint64_t sb = sb_max;
        while (plan_slices(p, c, sb) > budget && sb > sb_min) sb /= 2;
        sliced_ok = p->total_bytes <= budget;
        if (sliced_ok && whole_ok) *alt = *p;
    }
    if (!budget || whole_ok || (!sliced_ok && whole <= sliced_floor && !o->force_slices)) {
        p->sliced = 0; /* whole units (the message below names their floor when neither fits) */
        p->ring_bytes = p->ring_min_bytes = whole_ring;
        p->total_bytes = whole;
    }
    *whole_ok_out = whole_ok;
    *sliced_ok_out = sliced_ok;
    if (budget && p->total_bytes > budget) {
        char a[32], b[32];
        return base_fail(err, errlen, STRATA_EBUDGET,
                         "a budget of %s is below the minimum: this model needs at least %s "
                         "(arena %s for the largest layer%s, %lld expert slots, %d x session %s at ctx %lld, "
                         "engine %s for %lld rows per pass)",
                         base_fmt_bytes(budget, a, sizeof a), base_fmt_bytes(p->min_bytes, b, sizeof b),
                         base_fmt_bytes(p->ring_min_bytes, (char[32]){0}, 32),
                         p->sliced ? "'s whole tensors and its matrices in row slices" : "", (long long)p->min_expert_slots,
                         p->n_seqs, base_fmt_bytes(p->seq_bytes, (char[32]){0}, 32), (long long)p->ctx,
                         base_fmt_bytes(p->engine_bytes, (char[32]){0}, 32), (long long)p->prefill_chunk);
    }
    return 0;
}

/* Unbudgeted: everything resident that this machine can hold. */
static void plan_unbudgeted(place_plan *p, int64_t n_expert_all) {
    uint64_t avail = base_mem_available();
    uint64_t cap = avail > (2ull << 30) ? avail - avail / 20 - (1ull << 30) : avail;
    for (int64_t u = 0; u < p->n_units; u++) { p->pinned[u] = 1; p->pinned_bytes += p->unit_bytes[u]; }
    p->n_pinned = p->n_units;
    p->ring_bytes = p->ring_min_bytes = 0;
    p->embed_resident = 1;
    p->total_bytes = plan_total(p);
    plan_guess(p, cap > p->total_bytes ? cap - p->total_bytes : 0, n_expert_all);
    p->total_bytes = plan_total(p);
    uint64_t left = cap > p->total_bytes ? cap - p->total_bytes : 0;
    int64_t extra = p->expert_slot_bytes ? (int64_t)(left / slot_cost(p)) : 0;
    p->n_expert_slots = p->min_expert_slots + extra;
    if (p->n_expert_slots > n_expert_all) p->n_expert_slots = n_expert_all;
    if (p->n_expert_slots < p->min_expert_slots) p->n_expert_slots = p->min_expert_slots;
    p->cache_bytes = cache_cost(p, p->n_expert_slots);
}

int place_plan_compute(const cfg *c, const model_layout *lay, const char *model_dir, const place_opts *o,
                       place_plan *out, char *err, size_t errlen) {
    place_plan *p = out;
    memset(p, 0, sizeof *p);
    place_opts dflt = place_opts_default();
    if (!o) o = &dflt;
    if (c->n_layers + 1 > PLACE_MAX_UNITS) return base_fail(err, errlen, STRATA_EINVAL, "plan: too many layers");
    cfg_census k; /* on the stack: no state shared between plans (two models in one process) */
    schema_census(c, &k);
    int64_t lo = 0, hi = 0;
    int rc = plan_setup(p, c, model_dir, o, &lo, &hi, err, errlen);
    if (rc) return rc;
    plan_fixed(p, c, lay, o, &k, lo, hi, plan_units(p, c, lay, &k));
    const int64_t n_expert_all = p->n_moe * c->n_experts;
    const uint64_t budget = o->ram_bytes;
    int whole_ok, sliced_ok;
    place_plan alt; /* the sliced variant when whole units fit too */
    if ((rc = plan_floor(p, c, o, &alt, &whole_ok, &sliced_ok, err, errlen))) return rc;
    if (!budget) plan_unbudgeted(p, n_expert_all);
    if (budget) {
        /* whole units where they fit; where row slices fit too, the plan of the
         * two that reads fewer bytes per token (slices leave more to pin) */
        const int both = whole_ok && sliced_ok;
        plan_fill(p, budget, n_expert_all);
        plan_reads(p, c);
        if (both) {
            plan_fill(&alt, budget, n_expert_all);
            plan_reads(&alt, c);
            if (alt.read_bytes_per_token < p->read_bytes_per_token) *p = alt;
        }
    } else {
        plan_reads(p, c);
    }
    double disk = 0, mem = 0;
    place_bandwidth(NULL, 0, &disk, &mem, p->bw_source, sizeof p->bw_source);
    p->disk_bw = disk;
    p->mem_bw = mem;
    p->pred_s_per_token = (disk > 0 ? (double)p->read_bytes_per_token / disk : 0) +
                          (mem > 0 ? (double)p->touch_bytes_per_token / mem : 0);
    return STRATA_OK;
}

/* Predicted seconds of one decode step of n_rows rows (one per sequence): the
 * streamed trunk once, the union of the rows' experts (rows pick top-k of E at
 * random: E (1 - (1 - k/E)^n) distinct per layer), minus the cache's share,
 * from disk; every byte touched from memory, each row's KDA state included. */
double place_plan_step_seconds(const place_plan *p, const cfg *c, int n_rows) {
    const double E = (double)c->n_experts, k = (double)c->topk;
    const double distinct = E > 0 ? E * (1.0 - pow(1.0 - k / E, n_rows)) : 0;
    const double xb = (double)p->n_moe * distinct * (double)p->expert_bytes;
    const double emb = p->no_head ? 0 : (double)n_rows * (double)p->embed_row_bytes; /* as plan_reads */
    const double rd = (double)p->streamed_bytes + xb * (1 - plan_hit(p, c)) + emb;
    const double tc = (double)plan_trunk_all(p) + xb + (double)n_rows * (double)p->state_touch_bytes;
    return (p->disk_bw > 0 ? rd / p->disk_bw : 0) + (p->mem_bw > 0 ? tc / p->mem_bw : 0);
}

/* ================================================================== output */

static double gb(uint64_t b) { return (double)b / 1e9; }

void place_plan_print(const place_plan *p, FILE *f) {
    fprintf(f, "plan: planned peak %.3f GB, minimum budget %.3f GB%s\n", gb(p->total_bytes), gb(p->min_bytes),
            p->resident ? ", trunk and embeddings resident" : "");
    if (p->budget_bytes) fprintf(f, "  budget            %10.3f GB\n", gb(p->budget_bytes));
    else fprintf(f, "  budget                  none  (resident: what MemAvailable holds)\n");
    if (p->n_owned < p->n_units)
        fprintf(f, "  trunk pinned      %10.3f GB  %lld of the %lld units this rank holds (the others are on other ranks)\n",
                gb(p->pinned_bytes), (long long)(p->n_pinned - (p->n_units - p->n_owned)), (long long)p->n_owned);
    else
        fprintf(f, "  trunk pinned      %10.3f GB  %lld of %lld units (layers + head)\n", gb(p->pinned_bytes),
                (long long)p->n_pinned, (long long)p->n_units);
    fprintf(f, "  stream arena      %10.3f GB  (largest streamed unit %.3f GB%s; streamed %.3f GB per pass)\n",
            gb(p->ring_bytes), gb(p->ring_min_bytes), p->sliced ? " without its sliced matrices" : "", gb(p->streamed_bytes));
    if (p->sliced)
        fprintf(f, "  row slices        %10.3f GB  %d x %.1f MB (streamed matrices over %.1f MB read a slice of rows at a time)\n",
                gb(p->slice_pool_bytes), p->n_slices, (double)p->slice_bytes / 1e6, (double)p->slice_min_bytes / 1e6);
    fprintf(f, "  embeddings        %10.3f GB  %s (row %llu B)\n", gb(p->embed_resident ? p->embed_bytes : 0),
            p->embed_resident ? "resident" : "read by row", (unsigned long long)p->embed_row_bytes);
    fprintf(f, "  expert cache      %10.3f GB  %lld slots of %.2f MB (min %lld), %s\n", gb(p->cache_bytes),
            (long long)p->n_expert_slots, (double)p->expert_slot_bytes / 1e6, (long long)p->min_expert_slots,
            place_policy_name(p->cache_policy));
    if (p->guess_bytes)
        fprintf(f, "  guess routers     %10.3f GB  MXFP4 copies of %lld pinned MoE routers (expert reads a layer ahead)\n",
                gb(p->guess_bytes), (long long)p->n_guess);
    fprintf(f, "  sequences         %10.3f GB  %d x %.3f GB (%s for ctx %lld)\n", gb(p->session_bytes), p->n_seqs,
            gb(p->seq_bytes),
            p->n_kda_layers && p->n_mla_layers ? "KDA state + MLA latent cache"
            : p->n_kda_layers                  ? "KDA state"
                                               : "MLA latent cache",
            (long long)p->ctx);
    fprintf(f, "  engine scratch    %10.3f GB  %lld rows per pass (prefill chunk %lld)\n", gb(p->engine_bytes),
            (long long)p->prefill_chunk, (long long)p->prefill_chunk);
    fprintf(f, "  I/O buffers       %10.3f GB\n", gb(p->io_bytes));
    if (p->extra_bytes) fprintf(f, "  step buffers      %10.3f GB  (logits rows, samplers)\n", gb(p->extra_bytes));
    if (p->prefix_bytes) fprintf(f, "  prefix cache      %10.3f GB  (snapshots of sequences' state)\n", gb(p->prefix_bytes));
    fprintf(f, "  index + manifest  %10.3f GB\n", gb(p->index_bytes));
    fprintf(f, "  process baseline  %10.3f GB  (VmRSS now + thread stacks + allocator slack)\n", gb(p->overhead_bytes));
    if (p->unverified[0]) fprintf(f, "  weights from      the shards, in place, unverified: %s\n", p->unverified);
    else fprintf(f, "  weights from      %s\n", p->has_pack ? p->pack_dir : "the shards, in place (no pack: strata pack makes layers one read)");
    fprintf(f, "  predicted decode  %.3f s/token: reads %.3f GB/token at %.2f GB/s disk + touches %.3f GB/token at %.2f GB/s memory (%s)\n",
            p->pred_s_per_token, gb(p->read_bytes_per_token), p->disk_bw / 1e9, gb(p->touch_bytes_per_token),
            p->mem_bw / 1e9, p->bw_source);
    /* The reads assume uniform routing; routing that favours some experts, as
     * the generated models' does, hits more: ladder at 6.2 GB caches 13.3% of its
     * experts and 90.0% of requests hit, reading 0.053 GB per token against the
     * 0.42 predicted. */
    if (p->n_moe > 0 && p->expert_hit_uniform < 1)
        fprintf(f, "                    (experts read at a %.1f%% cache hit rate, as if routing were uniform; a run's report\n"
                   "                     gives the true rate on its line `experts:`)\n",
                100 * p->expert_hit_uniform);
}

json_t *place_plan_json(const place_plan *p) {
    json_t *j = json_object(), *pins = json_array();
    for (int64_t u = 0; u < p->n_units; u++) if (p->pinned[u]) json_array_append_new(pins, json_integer(u));
#define I(k, v) json_object_set_new(j, k, json_integer((json_int_t)(v)))
    I("budget_bytes", p->budget_bytes);
    I("total_bytes", p->total_bytes);
    I("min_bytes", p->min_bytes);
    I("n_units", p->n_units);
    I("n_pinned", p->n_pinned);
    json_object_set_new(j, "pinned_units", pins);
    I("pinned_bytes", p->pinned_bytes);
    I("ring_bytes", p->ring_bytes);
    I("streamed_bytes", p->streamed_bytes);
    json_object_set_new(j, "sliced", json_boolean(p->sliced));
    I("slice_bytes", p->sliced ? p->slice_bytes : 0);
    I("n_slices", p->sliced ? p->n_slices : 0);
    json_object_set_new(j, "embed_resident", json_boolean(p->embed_resident));
    I("embed_bytes", p->embed_resident ? p->embed_bytes : 0);
    I("n_expert_slots", p->n_expert_slots);
    I("expert_slot_bytes", p->expert_slot_bytes);
    I("slot_meta_bytes", p->slot_meta_bytes);
    I("cache_bytes", p->cache_bytes);
    I("guess_bytes", p->guess_bytes);
    I("session_bytes", p->session_bytes);
    I("seq_bytes", p->seq_bytes);
    I("n_seqs", p->n_seqs);
    I("engine_bytes", p->engine_bytes);
    I("io_bytes", p->io_bytes);
    I("prefix_bytes", p->prefix_bytes);
    I("index_bytes", p->index_bytes);
    I("overhead_bytes", p->overhead_bytes);
    I("ctx", p->ctx);
    I("prefill_chunk", p->prefill_chunk);
    I("read_bytes_per_token", p->read_bytes_per_token);
    I("touch_bytes_per_token", p->touch_bytes_per_token);
    I("state_touch_bytes", p->state_touch_bytes);
#undef I
    json_object_set_new(j, "pack_dir", json_string(p->has_pack ? p->pack_dir : ""));
    json_object_set_new(j, "resident", json_boolean(p->resident));
    json_object_set_new(j, "disk_bw", json_real(p->disk_bw));
    json_object_set_new(j, "mem_bw", json_real(p->mem_bw));
    json_object_set_new(j, "bw_source", json_string(p->bw_source));
    json_object_set_new(j, "pred_s_per_token", json_real(p->pred_s_per_token));
    json_object_set_new(j, "expert_hit_uniform", json_real(p->expert_hit_uniform));
    return j;
}

/* =============================================================== bandwidths */

static void cache_dir(char *out, size_t n) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(out, n, "%s/strata", xdg);
    else snprintf(out, n, "%s/.cache/strata", home && *home ? home : "/tmp");
}

/* O_DIRECT reads of 4 MiB at depth 16 from a 1 GiB file written (O_DIRECT) just
 * before: the page cache never holds it, so the device serves every byte. */
static double measure_disk(const char *dir) {
    char path[2048];
    snprintf(path, sizeof path, "%s/.strata-bw-read.%d", dir, (int)getpid());
    const uint64_t total = 1ull << 30, bsz = 16u << 20;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) return 0;
    uint8_t *buf = base_alloc_aligned(bsz * 4, 1u << 20, MEM_IO);
    double bw = 0;
    if (buf) {
        memset(buf, 0x33, bsz * 4);
        uint64_t w = 0;
        while (w < total && pwrite(fd, buf, bsz, (off_t)w) == (ssize_t)bsz) w += bsz;
        fsync(fd);
        if (w == total) {
            io_file f;
            io_ring *r = NULL;
            if (!io_file_open(&f, path, NULL, 0) && !io_ring_create(&r, 16, 4u << 20, 0, NULL, 0)) {
                io_req q[4];
                double t0 = base_now();
                uint64_t off = 0, got = 0;
                int inflight = 0;
                for (int i = 0; i < 4 && off < total; i++, off += bsz) {
                    q[i] = (io_req){.f = &f, .off = off, .len = bsz, .dst = buf + (uint64_t)i * bsz, .ud = (void *)(intptr_t)i};
                    io_submit(r, &q[i]);
                    inflight++;
                }
                io_req *d;
                while (inflight && io_reap(r, 1, &d) == 1) {
                    inflight--;
                    if (d->rc) break;
                    got += d->got;
                    if (off < total) {
                        d->off = off;
                        off += bsz;
                        io_submit(r, d);
                        inflight++;
                    }
                }
                double dt = base_now() - t0;
                if (got == total && dt > 0) bw = (double)total / dt;
            }
            io_ring_free(r);
            io_file_close(&f);
        }
    }
    close(fd);
    unlink(path);
    base_free(buf);
    return bw;
}

/* bw.json's "mem_probe": 2 is membw_probe (the engine's threads, the kernels'
 * access pattern); a file without it holds the one-thread sum before it. */
#define BW_MEM_PROBE "2"

int place_bandwidth(const char *dir, int force, double *disk_bw, double *mem_bw, char *source, size_t srclen) {
    char cdir[1800], path[2048];
    cache_dir(cdir, sizeof cdir);
    snprintf(path, sizeof path, "%s/bw.json", cdir);
    *disk_bw = 2e9; /* the machine's documented figure until measured */
    *mem_bw = 10e9;
    if (!force) {
        uint8_t *buf;
        size_t len;
        if (!base_read_file(path, 1 << 16, &buf, &len, NULL, 0)) {
            double d = 0, m = 0;
            const char *sd = strstr((char *)buf, "\"disk_bw\":"), *sm = strstr((char *)buf, "\"mem_bw\":");
            const int cur = strstr((char *)buf, "\"mem_probe\": " BW_MEM_PROBE) != NULL;
            if (sd) d = strtod(sd + 10, NULL);
            if (sm) m = strtod(sm + 9, NULL);
            base_free(buf);
            if (d > 0 && m > 0) {
                *disk_bw = d;
                *mem_bw = m;
                if (source)
                    snprintf(source, srclen, "cached %.150s%s", path,
                             cur ? "" : ", memory by the old one-thread probe (low): strata plan --measure");
                return STRATA_OK;
            }
        }
        if (!dir) {
            if (source) snprintf(source, srclen, "default 2 GB/s disk, 10 GB/s memory: run strata plan --measure");
            return STRATA_OK;
        }
    }
    if (!dir) {
        base_mkdir_p(cdir, NULL, 0);
        dir = cdir;
    }
    double m = membw_probe(0), d = measure_disk(dir);
    if (m > 0) *mem_bw = m;
    if (d > 0) *disk_bw = d;
    if (source) snprintf(source, srclen, "measured now%s", d > 0 ? "" : " (disk test failed: default disk)");
    if (d > 0 && m > 0 && base_mkdir_p(cdir, NULL, 0) == 0) {
        char js[256];
        int n = snprintf(js, sizeof js,
                         "{\"disk_bw\": %.0f, \"mem_bw\": %.0f, \"mem_probe\": " BW_MEM_PROBE ", \"mem_threads\": %d, "
                         "\"read_size\": 4194304, \"depth\": 16}\n", d, m, pool_default_threads());
        base_write_file_atomic(path, js, (size_t)n, NULL, 0);
    }
    return STRATA_OK;
}

/* ============================================================ cluster split */

static uint64_t layer_weight_bytes(const cfg *c, const model_layout *lay, const cfg_census *k, int64_t L) {
    uint64_t b = lay ? lay->layer_bytes[L] : k->layer_bytes_bf16[L];
    if (cfg_is_moe(c, L)) b += (uint64_t)c->n_experts * (lay ? lay->expert_bytes : k->expert_bytes);
    return b;
}

uint64_t place_stage_bytes(const cfg *c, const model_layout *lay, int64_t lo, int64_t hi, int head) {
    cfg_census k;
    schema_census(c, &k);
    uint64_t b = head ? (lay ? lay->head_bytes + lay->embed_bytes : k.embed_bytes_bf16) : 0;
    for (int64_t L = lo; L < hi && L < c->n_layers; L++) b += layer_weight_bytes(c, lay, &k, L);
    return b;
}

/* Contiguous split minimising the largest stage (rank 0's counts the head and
 * the embedding): best[r][j] is the smallest largest stage when layers 0..j-1
 * form stages 0..r-1; ties keep the earliest cut. O(ranks x layers^2). */
uint64_t place_cluster_split(const cfg *c, const model_layout *lay, int n_ranks, int64_t *lo, int64_t *hi) {
    enum { NL = CFG_MAX_LAYERS + 1 };
    const int64_t n = c->n_layers;
    if (n_ranks < 1) n_ranks = 1;
    if (n_ranks > n) n_ranks = (int)n;
    cfg_census k;
    schema_census(c, &k);
    uint64_t pre[NL];         /* pre[j]: bytes of layers 0..j-1 */
    pre[0] = 0;
    for (int64_t L = 0; L < n; L++) pre[L + 1] = pre[L] + layer_weight_bytes(c, lay, &k, L);
    const uint64_t head = lay ? lay->head_bytes + lay->embed_bytes : k.embed_bytes_bf16;
    static const uint64_t INF = UINT64_MAX;
    uint64_t *best = base_alloc((size_t)(n_ranks + 1) * NL * sizeof *best, MEM_MISC);
    int16_t *cut = base_alloc((size_t)(n_ranks + 1) * NL * sizeof *cut, MEM_MISC);
    if (!best || !cut) { /* even split by layers: still a valid plan */
        base_free(best);
        base_free(cut);
        for (int r = 0; r < n_ranks; r++) { lo[r] = n * r / n_ranks; hi[r] = n * (r + 1) / n_ranks; }
        return place_stage_bytes(c, lay, lo[0], hi[0], 1);
    }
#define B(r, j) best[(size_t)(r) * NL + (size_t)(j)]
#define C(r, j) cut[(size_t)(r) * NL + (size_t)(j)]
    for (int64_t j = 0; j <= n; j++) B(1, j) = j ? head + pre[j] : INF;
    for (int r = 2; r <= n_ranks; r++)
        for (int64_t j = 0; j <= n; j++) {
            B(r, j) = INF;
            for (int64_t i = r - 1; i < j; i++) { /* stage r-1 = layers i..j-1 */
                if (B(r - 1, i) == INF) continue;
                const uint64_t s = pre[j] - pre[i], m = B(r - 1, i) > s ? B(r - 1, i) : s;
                if (m < B(r, j)) { B(r, j) = m; C(r, j) = (int16_t)i; }
            }
        }
    const uint64_t worst = B(n_ranks, n);
    int64_t j = n;
    for (int r = n_ranks; r >= 1; r--) {
        hi[r - 1] = j;
        lo[r - 1] = r == 1 ? 0 : C(r, j);
        j = lo[r - 1];
    }
#undef B
#undef C
    base_free(best);
    base_free(cut);
    return worst;
}
