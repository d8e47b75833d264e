/* index/vindex_int.h: the vector index's internals, shared by the files that implement
 * index/vindex.h and by nothing else:
 *   vindex.c         storage and writes: slots and chunks, codes, add/upsert/remove,
 *                    metadata, kind changes, rebuilds (compaction), maintenance;
 *   vindex_search.c  exact and ANN search, filters, the recall monitor (calibration);
 *   vindex_snap.c    snapshots: save and load, format versions.
 *
 * Storage. Slots are numbered in insertion order and live in chunks of ch_rows slots (a
 * power of two, about 1 MiB of rows each); slot s is entry s & ch_mask of chunk
 * s >> ch_shift. Chunk 0 starts small and doubles (copied) up to ch_rows, so a tiny tenant
 * holds little; later chunks are allocated whole. A chunk holds, per slot: the normalized
 * float row, the id, the metadata record, a tombstone bit, and depending on the kind an
 * int8 code with its scale and error norm (SQ8, ANN) and dim sign bits (ANN). An idmap takes
 * a live id to its slot. Rows, ids and codes of a slot never change once published, which
 * lets maintenance and snapshots read them without a lock.
 *
 * Locking. rwlock: searches and reads shared; publishing a change exclusive. wmu: taken
 * first by every writer (and by maintenance and snapshots for their short phases), so a
 * writer can prepare its slot, grow the map or encode codes for a kind change while
 * readers keep searching, and only publish under the rwlock. maint_mu: one maintenance or
 * snapshot at a time. Lock order: maint_mu, wmu, rwlock. While maintenance or a snapshot
 * reads chunk arrays without locks (the index is "pinned"), writers that replace arrays
 * (chunk 0 growth, the chunk table) defer freeing the old ones until the pin is released.
 *
 * Functions shared by those files carry the prefix vi_ and are declared at the end; the
 * small helpers are static inline. Results follow vindex.h: 0, -errno, VINDEX_E_*.
 */
#ifndef ENGRAM_INDEX_VINDEX_INT_H
#define ENGRAM_INDEX_VINDEX_INT_H

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "idmap.h"
#include "vindex.h"
#include "vkernel.h"

#define MAX_DIM 65536
#define MAX_META (1u << 20)
#define BLK 256          /* slots per block of the exact search */
#define ANN_BATCH 64     /* candidates per batch of the ANN search */
#define PREFETCH_AHEAD 6 /* the ANN search fetches the int8 code this many candidates ahead */
/* a scored ANN search past its depth stops after this many candidates in a row (whole
 * batches) entered no top k */
#define ANN_PATIENCE 128
#define GATHER_STEP 512       /* candidates the ANN search gathers at a time (at least) */
#define QBUF 1024             /* query dims prepared on the stack; larger ones are allocated */
#define COMPACT_MIN 64        /* never compact for fewer tombstones than this */
#define CHUNK0_MIN 16         /* first capacity of chunk 0 */
#define MAX_SLOTS 0xfffffff0u /* slots are uint32 in search scratch */

/* vi_code_words is the width of a sign code in 64-bit words, the stride of the codes: one bit
 * per dimension, except that codes of 5 to 7 words are widened to 8 (zero words at the end,
 * in the stored codes and in queries' alike, so distances do not change): a 64-byte code is
 * one aligned 512-bit load where a 48-byte one (384 dimensions) straddled cache lines and
 * needed a masked load, and the Hamming pass over 50,000 of them took 50 to 57 us at 8 words
 * against 75 to 89 at 6. Snapshots hold codes of either width (vindex_snap.c). */
static inline size_t vi_code_words(size_t dim)
{
    size_t w = (dim + 63) / 64;
    return w > 4 && w < 8 ? 8 : w;
}

#define DEF_QUANT_MIN 512
#define DEF_ANN_MIN 4096
#ifndef DEF_ANN_CAND /* overridable for parameter sweeps */
#define DEF_ANN_CAND 256
#endif
#ifndef DEF_ANN_MAX
#define DEF_ANN_MAX 16384
#endif
#define ROT_SEED 0x656e6772616d5254ULL /* the sign-code rotation: the same for every index */
#define ENC_STACK 4096                 /* dims encoded with a stack buffer; larger: heap */
#define CAL_RING 2048                  /* true-neighbour positions the calibration keeps */
#define CAL_MIN 200                    /* positions needed before the depth is trusted */
#define CAL_K 10                       /* the calibration's k */
#define QS_CAP 256                     /* recent queries kept as probes (FAISS) */
#define QS_EVERY 4                     /* every this many searches offers its query */
#define DEF_COMPACT_PERCENT 25
#define DEF_INLINE_COMPACT 4096

typedef struct chunk {
    float *rows;         /* cap * dim */
    int8_t *sq;          /* cap * sq_stride, NULL below SQ8 */
    float *sq_scale;     /* cap */
    float *sq_rn;        /* cap */
    uint64_t *bin;       /* cap * words, NULL below ANN */
    uint64_t *ids;       /* cap */
    unsigned char *meta; /* cap * meta_size, NULL when meta_size is 0 */
    uint64_t *tomb;      /* (cap + 63) / 64 words */
    size_t cap;
} chunk;

typedef struct deferred {
    void *p;
    struct deferred *next;
} deferred;

struct vindex {
    pthread_rwlock_t lock;
    pthread_mutex_t wmu;
    pthread_mutex_t maint_mu;
    vindex_opts o; /* resolved: every default filled in */
    size_t dim, meta_size, sq_stride, words;
    size_t ch_shift, ch_rows, ch_mask;

    /* published state: written under wmu + exclusive lock, read under either */
    int kind;
    chunk **chunks; /* table of nchunks (capacity tcap) */
    size_t nchunks, tcap;
    size_t nslots, live, ntomb;
    idmap *map;
    size_t nrebuilds;

    /* The sign codes are taken around center (dim floats, NULL below ANN), computed from
     * the live vectors by the kind change to ANN and by every rebuild that stays there;
     * center_live is the live count then. Published with the chunks (wmu + exclusive
     * lock); code_gen changes with them, so a calibration knows its samples are stale. */
    float *center;
    size_t center_live;
    uint64_t code_gen;
    float *rot; /* VK_ROT_ROUNDS * dim signs of the rotation (immutable) */

    /* The FAISS engine (o.engine FAISS, kind ANN): fx indexes, as of its build, the slots
     * fx_slot lists (label -> slot, fx_n labels); slots from fx_upto on, added since, are
     * the tail, which every search bounds exactly. vindex_maintenance builds it in the
     * background when missing or when the tail grew past an eighth of the index; a rebuild
     * (which renumbers slots) drops it. Published under wmu + the exclusive lock; until the
     * first build, searches use the native codes. fx_error: the last build's failure. */
    vindex_eix *fx; /* of the engine o.faiss_engine */
    uint32_t *fx_slot;
    size_t fx_n, fx_upto;
    char fx_error[160];

    /* The measured candidate depth (vindex_calibrate): 0 until measured; exact_fb set when
     * no depth within the limits reaches the target, so searches scan exactly. */
    _Atomic size_t depth;
    _Atomic int exact_fb;
    pthread_mutex_t cal_mu; /* one calibration at a time; guards the cal_* fields */
    uint32_t *cal_pos;      /* ring of CAL_RING true-neighbour positions */
    size_t cal_n, cal_head, cal_probes;
    uint64_t cal_gen, cal_rng;
    double cal_est, cal_ann_est;
    /* what the last calibration found, for readers (vindex_get_recall: /metrics and
     * memory.stats, on worker threads) that must not wait for a calibration in progress,
     * which holds cal_mu for all its probes */
    pthread_mutex_t pub_mu;
    double pub_est, pub_ann_est;
    size_t pub_samples;
    uint64_t pub_gen;
    size_t cal_fx_depth; /* FAISS engine: the depth the ring's samples were taken at */
    /* the same for a blended ranking (vindex_calibrate_scored): the positions of the top
     * CAL_K by the caller's score, and the depth searches with a score use */
    uint32_t *cal_spos;
    size_t cal_sn, cal_shead;
    _Atomic size_t sdepth;
    /* FAISS engine: which of the ring's positions came from a real query (1) rather than a
     * synthetic probe (0), parallel to cal_pos, and how many did (cal_qn) */
    unsigned char *cal_real;
    size_t cal_qn;
    size_t pub_qsamples;

    /* FAISS engine: recent search queries for the calibration to use as probes (an HNSW
     * graph's recall depends on where queries land, which synthetic probes only guess).
     * Every QS_EVERY-th search copies its normalized query in (trylock: a search never
     * waits for it); qs_n unused ones sit below qs_head, newest last; a full ring
     * overwrites its oldest. qs_buf (QS_CAP * dim floats) is allocated at the first copy. */
    pthread_mutex_t qs_mu;
    float *qs_buf;
    size_t qs_head, qs_n;
    _Atomic uint64_t qs_tick;

    /* writer state, under wmu */
    size_t tier_retry_at; /* after a failed kind change, retry once live reaches this */
    bool pinned;
    deferred *dfree;
};

/* ---- small helpers (static inline: every file gets its own copy) ---- */

static inline void rdlock(vindex *vi)
{
    if (pthread_rwlock_rdlock(&vi->lock))
        abort(); /* only on misuse (deadlock, too many readers): not recoverable */
}

static inline void wrlock(vindex *vi)
{
    if (pthread_rwlock_wrlock(&vi->lock))
        abort();
}

static inline void unlock(vindex *vi)
{
    pthread_rwlock_unlock(&vi->lock);
}

static inline chunk *chunk_of(const vindex *vi, size_t slot)
{
    return vi->chunks[slot >> vi->ch_shift];
}

static inline size_t off_of(const vindex *vi, size_t slot)
{
    return slot & vi->ch_mask;
}

static inline bool tomb_at(const chunk *c, size_t off)
{
    return (c->tomb[off / 64] >> (off % 64)) & 1;
}

static inline void *meta_in(const vindex *vi, const chunk *c, size_t off)
{
    return vi->meta_size ? c->meta + off * vi->meta_size : NULL;
}

static inline const float *row_in(const vindex *vi, const chunk *c, size_t off)
{
    return c->rows + off * vi->dim;
}

/* inv_norm returns 1 / |v| computed in double, or 0 when v has no direction. */
static inline double inv_norm(const float *v, size_t dim)
{
    double sq = vk_dot_exact(v, v, dim); /* exact squares, summed in a fixed order */
    if (!(sq > 0.0) || !isfinite(sq))
        return 0.0;
    return 1.0 / sqrt(sq);
}

/* fx_destroy frees x, an index of vi's FAISS engine; NULL is a no-op. */
static inline void fx_destroy(const vindex *vi, vindex_eix *x)
{
    if (x)
        vi->o.faiss_engine->destroy(x);
}

/* ---- frozen views and storage under construction (rebuilds, snapshots) ---- */

/* A frozen view of the storage: chunk structs copied by value (their arrays stay valid
 * while the index is pinned), the tombstones copied. */
typedef struct view {
    chunk *ch; /* nchunks copies */
    size_t nchunks, nslots, live;
    uint64_t *tomb; /* one bit per slot, nslots bits */
    int kind;
    const float *center; /* the sign codes' centre (borrowed; maint_mu keeps it alive) */
} view;

static inline bool view_tomb(const view *v, size_t s)
{
    return (v->tomb[s / 64] >> (s % 64)) & 1;
}

/* A storage under construction. */
typedef struct store {
    chunk **chunks;
    size_t nchunks, tcap, nslots, ntomb;
    size_t hint; /* expected slots: sizes chunk 0 of a small index */
    int kind;
    float *center; /* the sign codes' centre (owned), when kind is ANN */
} store;

/* ---- shared by the vindex files (defined in vindex.c) ---- */

/* vi_resolve_opts copies in to o with every default filled in. Returns 0 or -EINVAL. */
int vi_resolve_opts(const vindex_opts *in, vindex_opts *o);

/* vi_kind_for returns the kind live vectors call for, given the current kind cur. */
int vi_kind_for(const vindex *vi, size_t live, int cur);

/* vi_center_of returns the mean of the live rows of nslots slots (malloc'd) or NULL. */
float *vi_center_of(const vindex *vi, chunk *const *chunks, size_t nslots,
                    const uint64_t *tomb_override);

/* vi_chunk_new returns a chunk of cap slots with the arrays of kind, or NULL. */
chunk *vi_chunk_new(const vindex *vi, size_t cap, int kind);

/* vi_encode_slot fills the codes c has for slot off beyond have_kind. */
void vi_encode_slot(const vindex *vi, const float *center, chunk *c, size_t off, int have_kind);

/* vi_view_take copies the state into v (wmu held; 0 or -ENOMEM); vi_view_free frees it. */
int vi_view_take(vindex *vi, view *v);
void vi_view_free(view *v);

/* vi_store_free frees a storage under construction. */
void vi_store_free(store *st);

/* vi_unpin ends a pin: frees what writers deferred meanwhile. wmu held. */
void vi_unpin(vindex *vi);

#endif
