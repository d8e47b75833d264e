/* index/vindex_int.h: the vector index's internals, shared by the files that implement
 * index/vindex.h and by nothing else. One job per file:
 *   vindex.c          creation, destruction, options, statistics and memory accounting;
 *   vindex_store.c    chunks, codes, frozen views and storages under construction;
 *   vindex_map.c      the id -> slot map;
 *   vindex_rows.c     vectors mapped from a snapshot: mapping, residency, trimming;
 *   vindex_write.c    adds, upserts, removes, metadata, kind changes up;
 *   vindex_rebuild.c  rebuilds (compaction, kind changes down, new centres), maintenance,
 *                     vindex_settle;
 *   vindex_fx.c       the FAISS engine's builds;
 *   vindex_search.c   exact and ANN searches, filters;
 *   vindex_cal.c      the recall calibration (monitor and build time);
 *   vindex_snap.c     saving snapshots (format: vindex.h);
 *   vindex_load.c     loading them.
 *
 * Storage. A storage (vstore) numbers its slots in insertion order; they live in chunks of
 * ch_rows slots (a power of two, about 1 MiB of float rows each); slot s is entry
 * s & ch_mask of chunk s >> ch_shift. Chunk 0 starts small and doubles (copied) up to
 * ch_rows, so a tiny tenant holds little; later chunks are allocated whole. A chunk holds,
 * per slot: the normalized float row, the id, the metadata record, a tombstone bit, and
 * depending on the kind an int8 code with its scale and error norm (SQ8, ANN) and the sign
 * bits (ANN). A map takes a live id to its slot. Rows, ids and codes of a slot never change
 * once published, which lets maintenance and snapshots read them without a lock.
 *
 * Float rows off the heap. From the SQ8 kind on, searches touch a float row only to re-rank
 * a candidate; the rows are then read from the index's last snapshot, mapped (vindex_rows.c):
 * a snapshot stores every slot (tombstones too) in slot order, its rows page-aligned and
 * padded to whole chunks, so after a save or a load the rows of chunk i are at row
 * i * ch_rows of the mapping. Rows added since the snapshot sit on the heap until the next
 * save maps them too. The mapping is private and writable: the slots past the snapshot in
 * its last chunk take new rows copy-on-write. The published vindex is its storage plus
 * locks, options, the recall calibration and the FAISS engine's index.
 *
 * Locking. rwlock: searches and reads shared; publishing a change exclusive. wmu: taken
 * first by every writer (and by maintenance and snapshots for their short phases), so a
 * writer can prepare its slot, grow the map or encode codes for a kind change while
 * readers keep searching, and only publish under the rwlock. maint_mu: one maintenance or
 * snapshot at a time. cal_mu: one calibration at a time. Lock order: maint_mu, wmu, cal_mu,
 * rwlock. While maintenance or a snapshot reads chunk arrays without locks (the index is
 * "pinned"), writers that replace arrays (chunk 0 growth, the chunk table, the map) defer
 * freeing the old ones until the pin is released.
 *
 * Functions shared by those files carry the prefix vi_ (vm_ for the map) and are declared at
 * the end; the small helpers are static inline. Results follow vindex.h: 0, -errno,
 * VINDEX_E_*.
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
#define MAX_SLOTS 0xfffffff0u /* slots are uint32 in search scratch and in the map */

/* vi_code_words is the width of a sign code in 64-bit words, the stride of the codes: one bit
 * per dimension, the bits past dim zero. (Format 4 snapshots widened codes of 5 to 7 words
 * to 8, which made the Hamming pass faster with AVX-512 but not with AVX2, for 16 bytes a
 * 384-d vector; vi_snap_words.) */
static inline size_t vi_code_words(size_t dim)
{
    return (dim + 63) / 64;
}

/* vi_chunk_shift is log2 of the slots per chunk: about 1 MiB of float rows, 64..4096 slots.
 * A snapshot's padding depends on it, so it is a function of dim alone. */
static inline size_t vi_chunk_shift(size_t dim)
{
    size_t rows = ((size_t)1 << 20) / (dim * sizeof(float));
    size_t shift = 6;
    while (shift < 12 && ((size_t)1 << (shift + 1)) <= rows)
        shift++;
    return shift;
}

#define DEF_QUANT_MIN 512
#define DEF_ANN_MIN 4096
#ifndef DEF_ANN_CAND /* overridable for parameter sweeps */
#define DEF_ANN_CAND 256
#endif
#ifndef DEF_ANN_MAX
#define DEF_ANN_MAX 16384
#endif
#define DEF_RECALL_TARGET 0.99
/* the near-tie margin of the code ranking, in standard deviations of an int8 estimate's
 * error (vindex_opts.tie_margin) */
#ifndef DEF_TIE_MARGIN
#define DEF_TIE_MARGIN 2.0
#endif
#define ROT_SEED 0x656e6772616d5254ULL /* the sign-code rotation: the same for every index */
#define ENC_STACK 4096                 /* dims encoded with a stack buffer; larger: heap */
#define CAL_RING 2048                  /* true-neighbour positions the calibration keeps */
#define CAL_MIN 200                    /* positions needed before the depth is trusted */
#define CAL_K 10                       /* the calibration's k */
#define CAL_BUILD_PROBES 24            /* probes a build measures (240 positions) */
#define QS_CAP 256                     /* recent queries kept as probes (FAISS) */
#define QS_EVERY 4                     /* every this many searches offers its query */
#define DEF_COMPACT_PERCENT 25
#define DEF_INLINE_COMPACT 4096
#define PAGE 4096 /* the snapshot's row section is aligned to this (mmap offsets) */

/* ---- the snapshot format (vindex.h; vindex_snap.c writes it, vindex_load.c reads it) ---- */
#define SNAP_MAGIC "ENGVIDX"
#define SNAP_VERSION 5
/* format 4: the same layout, its int8 codes of the unrotated row around the origin and its
 * sign codes rotated in float: loaded with every code taken anew (vindex_load.c) */
#define SNAP_VERSION_OLD_CODES 4
#define SNAP_HEADER 128
#define SNAP_BOM 0x01020304u
#define SNAP_CK_OFF 56

/* vi_snap_words is the sign codes' width in a snapshot of format version. */
static inline size_t vi_snap_words(uint32_t version, size_t dim)
{
    size_t w = vi_code_words(dim);
    return version == SNAP_VERSION_OLD_CODES && w > 4 && w < 8 ? 8 : w;
}

/* The sections' sizes, from the header's numbers. */
typedef struct snap_layout {
    uint64_t ids, tombs, meta, sq8, ann;     /* bytes of each section */
    uint64_t cal, fx;                        /* from the header */
    uint64_t body_end;                       /* where the FAISS section ends */
    uint64_t rows_off, rows_len, rows_slots; /* rows_slots: slots the rows hold (padded) */
    uint64_t extra, total;                   /* total: the file's length */
} snap_layout;

/* vi_snap_layout computes the layout of a snapshot of format version of slots slots of dim,
 * meta_size and kind, with cal_len, fx_len and extra_len bytes in those sections. Returns
 * false when a size overflows. Rows are page-aligned and padded to whole chunks from the
 * SQ8 kind on. */
bool vi_snap_layout(uint32_t version, uint64_t dim, uint64_t meta_size, uint64_t slots,
                    uint32_t kind, uint64_t cal_len, uint64_t fx_len, uint64_t extra_len,
                    snap_layout *l);

typedef struct chunk {
    float *rows;         /* cap * dim: heap, or in the storage's mapped rows (rows_mapped) */
    int8_t *sq;          /* cap * sq_stride, NULL below SQ8 */
    float *sq_scale;     /* cap: the code's step a */
    float *sq_e;         /* cap: the coding error's part along the centre (vindex_store.c) */
    float *sq_rn;        /* cap: the norm of the rest of the coding error, rounded up */
    uint64_t *bin;       /* cap * words, NULL below ANN */
    uint64_t *ids;       /* cap */
    unsigned char *meta; /* cap * meta_size, NULL when meta_size is 0 */
    uint64_t *tomb;      /* (cap + 63) / 64 words */
    size_t cap;
    bool rows_mapped; /* rows point into a mapping: not freed with the chunk */
} chunk;

/* The id -> slot map of a storage's live slots: open addressing with linear probing over
 * uint32 entries (slot + 1; 0 is empty). An entry holds no key: the key is the id stored in
 * the slot's chunk, so the map costs 4 bytes an entry (under 8 a live vector) where a map of
 * key and value pairs cost 16 (32 to 45 a vector at its load). cap is not a power of two:
 * the home of a key is hash * cap >> 64. */
typedef struct vmap {
    uint32_t *tab; /* cap entries */
    size_t cap, count;
} vmap;

/* A snapshot's float rows, mapped (vindex_rows.c). */
typedef struct vrows {
    void *base;              /* the mapping */
    size_t len;              /* its length */
    size_t slots;            /* rows mapped: whole chunks */
    _Atomic size_t resident; /* bytes in RAM at the last measurement (vi_rows_measure) */
    /* one bit a page of the mapping, set by a search that read a row on it (vi_rows_touch)
     * and cleared by vi_rows_keep: which pages in RAM searches still use (words of 64) */
    _Atomic uint64_t *touched;
    size_t pages;
    size_t cow_page; /* the first page that may hold rows written after the snapshot (the
                      * last chunk's slots past it, copy-on-write: anonymous pages, never
                      * dropped by vi_rows_keep); set by whoever maps r (vi_rows_cow_from) */
    /* the file, to drop its cached pages (vi_rows_trim): its path when mapped, its identity
     * (a later file renamed over the path is left alone) and the rows' offset in it */
    char *path;
    uint64_t dev, ino, off;
} vrows;

/* A storage: the published one of an index, or one under construction (rebuilds, loads). */
typedef struct vstore {
    chunk **chunks; /* table of nchunks (capacity tcap) */
    size_t nchunks, tcap;
    size_t nslots, live, ntomb;
    int kind;
    /* The codes are taken around center (dim floats, NULL below ANN: the origin), computed
     * from the live vectors by the kind change to ANN and by every rebuild that stays there;
     * center_live is the live count then. rcenter is the centre rotated (vk_rotate, dim
     * doubles; NULL with center) and cnorm its norm (0 without one): codes and queries are
     * taken in the rotated frame (vindex_search.c, "SQ8 codes"). */
    float *center;
    double *rcenter;
    double cnorm; /* |rcenter| */
    size_t center_live;
    vmap map;
    vrows *rows; /* the chunks below rows->slots read their rows here; NULL: all on heap */
    size_t hint; /* under construction: expected slots (sizes chunk 0) */
} vstore;

/* The recall calibration's samples and what they say (vindex_cal.c). */
typedef struct vcal {
    uint32_t *pos;       /* ring of CAL_RING true-neighbour positions */
    uint32_t *spos;      /* the same for the blended ranking (vindex_calibrate_scored) */
    unsigned char *real; /* FAISS engine: which of pos came from a real query */
    size_t n, head, sn, shead, qn;
    size_t probes;   /* probes made (the next one's kind: even perturbed, odd midpoint) */
    size_t fx_depth; /* FAISS engine: the depth the ring's samples were taken at */
    uint64_t gen;    /* the code generation the samples are of */
    /* the stored vectors the last probes ran on (code generation, slots, tombstones) and the
     * probes run since they last changed: vindex_recall_steady */
    uint64_t data_gen;
    size_t data_slots, data_tombs, since;
    uint64_t rng;
    double est, ann_est;
    /* decided from the samples */
    size_t depth, sdepth;
    bool exact_fb, measured;
} vcal;

typedef struct deferred {
    void *p;
    size_t unmap_len; /* 0: free(p); else munmap(p, unmap_len) */
    struct deferred *next;
} deferred;

struct vindex {
    pthread_rwlock_t lock;
    pthread_mutex_t wmu;
    pthread_mutex_t maint_mu;
    vindex_opts o; /* resolved: every default filled in */
    size_t dim, meta_size, sq_stride, words;
    size_t ch_shift, ch_rows, ch_mask;
    const float *rot; /* VK_ROT_ROUNDS * dim signs of the rotation (shared, immutable) */

    /* published state: written under wmu + exclusive lock, read under either */
    vstore s;
    size_t nrebuilds;
    uint64_t code_gen; /* changes with the codes (kind up, rebuild, FAISS build) */

    /* The FAISS engine (o.engine FAISS, kind ANN): fx indexes, as of its build, the slots
     * fx_slot lists (label -> slot, fx_n labels); slots from fx_upto on, added since, are
     * the tail, which every search bounds exactly. vindex_maintenance builds it in the
     * background when missing or when the tail grew past an eighth of the index; a rebuild
     * (which renumbers slots) drops it. Published under wmu + the exclusive lock; until the
     * first build, searches use the native codes. fx_error: the last build's failure
     * (malloc'd, NULL: none). */
    vindex_eix *fx; /* of the engine o.faiss_engine */
    uint32_t *fx_slot;
    size_t fx_n, fx_upto;
    char *fx_error;

    /* The candidate depth the calibration measured (copied from cal), read by searches
     * without a lock: 0 until measured (an ANN index scans exactly until then); exact_fb set
     * when no depth within the limits reaches the target, so searches scan exactly. */
    _Atomic size_t depth, sdepth;
    _Atomic int exact_fb;
    pthread_mutex_t cal_mu; /* one calibration at a time; guards cal */
    vcal cal;
    /* what the last calibration found, for readers (vindex_get_recall: /metrics and
     * memory.stats, on worker threads) that must not wait for a calibration in progress */
    pthread_mutex_t pub_mu;
    double pub_est, pub_ann_est;
    size_t pub_samples, pub_qsamples;
    uint64_t pub_gen;

    /* FAISS engine: recent search queries for the calibration to use as probes (an HNSW
     * graph's recall depends on where queries land, which synthetic probes only guess).
     * Every QS_EVERY-th search copies its normalized query in (trylock: a search never
     * waits for it); qs_n unused ones sit below qs_head, newest last; a full ring
     * overwrites its oldest. qs_buf (QS_CAP * dim floats) is allocated at the first copy. */
    pthread_mutex_t qs_mu;
    float *qs_buf;
    size_t qs_head, qs_n;
    _Atomic uint64_t qs_tick;

    _Atomic uint64_t page_ins;  /* major faults while searches read mapped rows */
    _Atomic uint64_t rows_read; /* float rows searches' re-ranks read */
    _Atomic uint64_t tie_reads; /* of them, those resolve_ties read */
    _Atomic uint64_t searches;  /* vindex_search calls that reached dispatch */
    /* the heap bytes of cal's rings and of qs_buf, for vi_heap_bytes, which holds neither
     * cal_mu nor qs_mu (set by whoever allocates them) */
    _Atomic size_t cal_bytes, qs_bytes;

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

static inline chunk *st_chunk(const vindex *vi, const vstore *st, size_t slot)
{
    return st->chunks[slot >> vi->ch_shift];
}

static inline size_t off_of(const vindex *vi, size_t slot)
{
    return slot & vi->ch_mask;
}

static inline bool tomb_at(const chunk *c, size_t off)
{
    return (c->tomb[off / 64] >> (off % 64)) & 1;
}

static inline bool st_tomb(const vindex *vi, const vstore *st, size_t slot)
{
    return tomb_at(st_chunk(vi, st, slot), off_of(vi, slot));
}

static inline uint64_t st_id(const vindex *vi, const vstore *st, size_t slot)
{
    return st_chunk(vi, st, slot)->ids[off_of(vi, slot)];
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

/* ---- frozen views (rebuilds, snapshots, FAISS builds) ---- */

/* A frozen view of the published storage: chunk structs copied by value (their arrays stay
 * valid while the index is pinned), the tombstones copied. */
typedef struct view {
    chunk *ch; /* nchunks copies */
    size_t nchunks, nslots, live;
    uint64_t *tomb; /* one bit per slot, nslots bits */
    int kind;
    const float *center; /* the sign codes' centre (borrowed; maint_mu keeps it alive) */
    size_t center_live;
} view;

static inline bool view_tomb(const view *v, size_t s)
{
    return (v->tomb[s / 64] >> (s % 64)) & 1;
}

/* ---- searches, shared with the calibration (vindex_search.c) ---- */

/* A hit ranked from its int8 code (the ANN search, vindex_search.c): h holds the estimated
 * similarity and score, [lo, hi] the interval its exact score lies in with the tie margin's
 * confidence, slot where to read its row when it is a near-tie. */
typedef struct rhit {
    vindex_hit h;
    double lo, hi;
    uint32_t slot;
} rhit;

/* The best hits so far: a heap whose root is the worst (util/heap.h). With r set (the ANN
 * search ranking from codes), the heap is r, of rk >= k entries: the k best estimates and
 * the runners-up that near-ties are decided among; h receives the final k. */
typedef struct topk {
    vindex_hit *h; /* not owned: k entries */
    size_t n, k;
    size_t entered; /* hits offer took in (ANN patience) */
    rhit *r;        /* not owned: rk entries, or NULL (exact re-rank into h) */
    size_t rk;
} topk;

typedef struct cand {
    double ubs; /* upper bound of the score */
    double ub;  /* upper bound of the similarity */
    double est; /* the int8 estimate of the similarity (0 without codes) */
    double err; /* its error within the tie margin's confidence */
    uint32_t slot;
} cand;

/* A prepared query. */
typedef struct qprep {
    const vindex_query *q;
    const float *qn; /* normalized, dim floats */
    int16_t *qq;     /* sq_stride entries */
    uint64_t *bits;  /* words */
    double qs;       /* int16 step: R qn ~ qs * qq (R: the rotation) */
    double qnorm;    /* |qn| */
    double snorm;    /* |R qn - qs * qq|, rounded up (with the rotation's slack) */
    double qmu;      /* qn . centre (0 without one) */
    double alpha;    /* qn . u, u the centre's direction (0 without a centre) */
    double qperp;    /* |qn - alpha u|, rounded up */
    double ynorm;    /* a bound of |R (x - centre)| for a stored unit x: 1 + |centre| */
    double tie;      /* tie margin / sqrt(dim): an estimate's error is at most tie |q| rn */
    bool bounded;    /* the query declares a score bound */
} qprep;

typedef struct sctx {
    const vindex *vi;
    const vstore *st;
    const qprep *p;
    topk *t;
    bool kept_checked; /* keep already ran on every candidate */
    bool probe;        /* the recall monitor's: the rows it reads are not marked in use */
    size_t reads;      /* float rows the re-rank read */
    size_t tie_reads;  /* of them, read by resolve_ties */
    rhit *rfree;       /* a code-ranked heap the search allocated (freed by vindex_search) */
} sctx;

/* ---- shared by the vindex files ---- */

/* vindex.c */
/* vi_resolve_opts copies in to o with every default filled in. Returns 0 or -EINVAL. */
int vi_resolve_opts(const vindex_opts *in, vindex_opts *o);
/* vi_kind_for returns the kind live vectors call for, given the current kind cur. */
int vi_kind_for(const vindex *vi, size_t live, int cur);
/* vi_heap_bytes returns what the storage and the index hold on the heap (shared lock or
 * wmu held); vi_rows_on_heap the bytes of float rows there that a snapshot could map. */
size_t vi_heap_bytes(const vindex *vi);
size_t vi_rows_on_heap(const vindex *vi, const vstore *st);

/* vindex_store.c */
chunk *vi_chunk_new(const vindex *vi, size_t cap, int kind);
/* vi_chunk_new_mapped is vi_chunk_new whose rows are the mapped rows at rows. */
chunk *vi_chunk_new_mapped(const vindex *vi, size_t cap, int kind, float *rows);
void vi_chunk_free(chunk *c);
int vi_chunk_alloc_codes(const vindex *vi, chunk *c, int kind);
size_t vi_chunk_bytes(const vindex *vi, const chunk *c); /* heap bytes */
void vi_copy_slot(const vindex *vi, chunk *d, size_t dof, const chunk *s, size_t so,
                  bool with_meta);
/* vi_encode_slot fills the codes c has for slot off beyond have_kind, around the rotated
 * centre rcenter of norm cnorm (NULL: the origin). Both codes depend on the centre: a caller whose
 * source codes were taken around another one passes VINDEX_KIND_FLAT. */
void vi_encode_slot(const vindex *vi, const double *rcenter, double cnorm, chunk *c, size_t off,
                    int have_kind);
/* vi_rotate_center returns center rotated (dim doubles, malloc'd, the caller owns it) and
 * its norm in *norm, or NULL when out of memory. */
double *vi_rotate_center(const vindex *vi, const float *center, double *norm);
/* vi_same_center tells whether storages a and b take their codes around the same centre. */
bool vi_same_center(const vindex *vi, const vstore *a, const vstore *b);
/* vi_center_of returns the mean of the live rows of nslots slots (malloc'd) or NULL. */
float *vi_center_of(const vindex *vi, chunk *const *chunks, size_t nslots,
                    const uint64_t *tomb_override);
/* vi_store_append copies slot so of chunk s (codes valid up to have_kind) as st's next slot,
 * encoding what st's kind needs beyond. The map is not touched. 0 or -ENOMEM. */
int vi_store_append(const vindex *vi, vstore *st, const chunk *s, size_t so, int have_kind,
                    bool with_meta);
/* vi_store_free frees a storage: chunks, centre, map, mapped rows. */
void vi_store_free(const vindex *vi, vstore *st);
/* vi_view_take copies the published state into v (wmu held; 0 or -ENOMEM). */
int vi_view_take(vindex *vi, view *v);
void vi_view_free(view *v);
/* vi_free_later frees p (or unmaps it when unmap_len) now, or after the pin. wmu held. */
void vi_free_later(vindex *vi, void *p, size_t unmap_len);
/* vi_unpin ends a pin: frees what writers deferred meanwhile. wmu held. */
void vi_unpin(vindex *vi);

/* vindex_map.c */
/* vm_init sizes m for hint entries; vm_free frees it. 0 or -ENOMEM. */
int vm_init(vmap *m, size_t hint);
void vm_free(vmap *m);
/* vm_find returns the slot of id in st, or -1. */
int64_t vm_find(const vindex *vi, const vstore *st, uint64_t id);
/* vm_put maps id to slot (st's ids[slot] is id already), replacing id's entry if any;
 * never allocates: vm_room must be positive when id is new. */
void vm_put(const vindex *vi, vstore *st, uint64_t id, uint32_t slot);
/* vm_del removes id's entry; true when there was one. */
bool vm_del(const vindex *vi, vstore *st, uint64_t id);
/* vm_room returns how many new ids fit before the map must grow. */
size_t vm_room(const vmap *m);
/* vm_rehash builds into out a map of every entry of m sized for hint entries (st's ids are
 * read, not changed). 0 or -ENOMEM. */
int vm_rehash(const vindex *vi, const vstore *st, const vmap *m, size_t hint, vmap *out);
size_t vm_bytes(const vmap *m);

/* vindex_rows.c */
/* vi_rows_map maps the rows of slots slots (a multiple of ch_rows) stored in fd from off (a
 * multiple of PAGE): read-only but for the last chunk, which takes new rows copy-on-write.
 * NULL on failure (errno set). */
vrows *vi_rows_map(const vindex *vi, int fd, uint64_t off, size_t slots, const char *path);
/* vi_rows_unmap unmaps r now (nobody may read it any more); NULL is a no-op. */
void vi_rows_unmap(vrows *r);
/* vi_rows_at returns the row of slot s in r. */
float *vi_rows_at(const vindex *vi, const vrows *r, size_t s);
/* vi_rows_attach makes the chunks of st below r->slots read their rows from r, which holds
 * the rows of slots [0, saved) of st: the rows of later slots in r's last chunk are copied
 * into r first, and the heap rows the chunks had are freed. For the published storage the
 * caller holds wmu, not pinned, and this takes the exclusive lock for the switch. Returns
 * false (st unchanged; unmap r) when st's chunks do not fit r (a chunk 0 smaller than a
 * chunk); else true, and *old is the mapping st had (unmap it: no chunk reads it any more). */
bool vi_rows_attach(vindex *vi, vstore *st, vrows *r, size_t saved, bool published, vrows **old);
/* vi_rows_measure returns the bytes of r in RAM now (mincore) and stores them in
 * r->resident; vi_rows_trim asks the kernel to drop r's pages (MADV_PAGEOUT, then
 * POSIX_FADV_DONTNEED on its file for the pages reclaim could not free at once). */
size_t vi_rows_measure(vrows *r);
void vi_rows_trim(vrows *r);
/* vi_rows_keep holds r's pages in RAM to percent of them (see vindex_rows_keep), adds the bytes
 * it dropped to *dropped and returns the bytes in RAM after; vi_rows_touch marks the pages of the
 * row at row (dim floats) as read by a search. Any thread, under the index's shared lock. */
size_t vi_rows_keep(vrows *r, double percent, size_t *dropped);
/* vi_rows_cow_from records that r's rows from slot s on may be written (copy-on-write). */
void vi_rows_cow_from(const vindex *vi, vrows *r, size_t s);
void vi_rows_touch(const vindex *vi, vrows *r, const float *row);
/* vi_faults returns the calling thread's major page faults so far. */
uint64_t vi_faults(void);

/* vindex_search.c */
bool vi_hit_worse(const void *a, const void *b); /* heap order of a top k */
void vi_offer(topk *t, const vindex_hit *hit);
void vi_topk_sort(topk *t);
/* vi_prepare normalizes q into qn and fills p; 0 or VINDEX_E_ZERO. */
int vi_prepare(const vindex *vi, const vindex_query *q, float *qn, int16_t *qq, uint64_t *bits,
               qprep *p);
/* vi_prepare_codes fills the int16 query (SQ8 and up) and the sign bits (ANN), in st's
 * rotated frame around st's centre, using scratch (dim doubles). */
void vi_prepare_codes(const vindex *vi, const vstore *st, qprep *p, int kind, double *scratch);
/* vi_search_exact scans every slot of sc->st exactly (see vindex_search.c). */
void vi_search_exact(sctx *sc, bool use_sq8, bool filter_first);

/* vindex_cal.c */
/* vi_cal_free frees a calibration's rings (allocated at its first probe) and zeroes it. */
void vi_cal_free(vcal *c);
/* vi_offer_query copies every QS_EVERY-th query (FAISS engine) into the probe ring; never
 * waits. Shared lock held. */
void vi_offer_query(vindex *vi, const float *qn);
/* The calibration in a snapshot: vi_cal_size bytes, written by vi_cal_encode; vi_cal_decode
 * reads len bytes into c (fresh) and returns 0 or VINDEX_E_CORRUPT (or -ENOMEM). */
size_t vi_cal_size(const vcal *c);
void vi_cal_encode(const vcal *c, unsigned char *out);
int vi_cal_decode(const unsigned char *in, size_t len, vcal *c);
/* vi_cal_build measures the codes of st (a storage nobody else uses yet, or the published
 * one under the caller's locks) with CAL_BUILD_PROBES probes into c (fresh), and decides the
 * depth for target (shape: a blended ranking, or NULL). 0 or -ENOMEM. */
int vi_cal_build(vindex *vi, const vstore *st, vcal *c, double target, const vindex_query *shape);
/* vi_cal_install makes c the index's calibration (of code generation gen) and publishes its
 * depth; c is emptied. cal_mu held. */
void vi_cal_install(vindex *vi, vcal *c, uint64_t gen);

/* vindex_rebuild.c */
/* vi_rebuild builds compacted storage of the kind the live count calls for, measures its
 * codes (target, shape) and swaps it in. maint_mu held; with inline_wmu the caller holds
 * wmu throughout. Returns 1 or -ENOMEM (unchanged). */
int vi_rebuild(vindex *vi, bool inline_wmu, double target, const vindex_query *shape);
bool vi_rebuild_due(const vindex *vi);
bool vi_compaction_due(const vindex *vi);

/* vindex_fx.c */
bool vi_fx_due(const vindex *vi);
/* vi_fx_build builds and publishes the FAISS engine's index. maint_mu held. 1, -ENOMEM or
 * VINDEX_E_FAISS. */
int vi_fx_build(vindex *vi);
void vi_fx_set_error(vindex *vi, const char *msg); /* wmu held */
void vi_fx_clear_error(vindex *vi);                /* wmu and the exclusive lock held */

#endif
