/* index/vindex.c: one tenant's vector index (see vindex.h): chunked float rows with int8 and
 * sign-bit codes beside them, exact and Hamming-prefiltered searches with exact re-ranking,
 * tombstones, background rebuilds and snapshots.
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
 * SQ8 codes and their bound. A row x (unit length in float) is coded as c = round(x / a),
 * |c| <= 127, a = max|x_j| / 127, and r = x - a c is computed in double at encode time; its
 * norm is stored rounded up (rn). The query q is coded in int16 the same way:
 * q = b qq + s, with |s| computed per query. Then
 *   q.x = a b (qq.c) + a (s.c) + q.r,   |a (s.c)| <= |s| |x - r| <= |s| (1 + rn),
 *   |q.r| <= |q| rn,
 * and qq.c is an exact integer, so sim <= a b (qq.c) + |q| rn + |s| (1 + rn) + 1e-6 (the
 * last term covers float rounding, including that of the exact similarity we compare
 * against). At 768 dimensions rn is about 0.008, so few vectors survive the bound.
 *
 * Exact search (FLAT, SQ8). Blocks of BLK slots: an upper bound of every slot's similarity
 * (FLAT: the float product plus its rounding bound; SQ8: the bound above) turns into an
 * upper bound of its score (slope * ub + bound, or infinity without a declared bound);
 * slots whose bound cannot beat the k-th hit so far are dropped, the rest are sorted by
 * bound and re-ranked exactly (keep, exact similarity, score) until the bound falls below
 * the k-th hit. That is exact: a dropped slot's score is below the k-th score.
 *
 * Sign codes. Bit j of a vector's code is the sign of coordinate j of R (x - c): c the mean
 * of the live vectors when the codes were made, R a fixed orthogonal transform (vk_rotate:
 * sign flips and Walsh-Hadamard blocks). Raw signs carry nothing when all vectors share an
 * orthant (ReLU features) or a dominant direction, and weigh a near-constant coordinate as
 * much as the dominant one; centring and rotating fixes both. The query's code is taken
 * the same way, so the Hamming distance estimates the angle between x - c and q - c.
 *
 * ANN search. Hamming distances of all slots to the query's sign bits (3.4 ns per vector
 * at 768 dims, memory bound), a histogram, then candidates gathered in increasing distance
 * among the kept vectors (keep runs on gathered slots only, so selective filters gather
 * deeper, and a filter that keeps fewer than the budget makes every kept vector a
 * candidate: exact). The first `budget` candidates are re-ranked like the exact search, in
 * batches of 64 in Hamming order. The budget is the depth the calibration measured: it
 * records where the true neighbours of probe queries fall in that order, so the recall at
 * a depth is a measured figure, not a hope. When a sample of 128 slots says the filter keeps fewer
 * than half the budget, the search skips the Hamming pass: keep runs on every slot and the kept
 * ones are bounded with their int8 codes, an exact answer (a 1% filter at 50k x 768: 0.3 ms instead
 * of 1.1 ms for the deep gather).
 *
 * Exact similarity. vk_dot_exact sums exact double products in a fixed order, so a vector's
 * similarity depends only on it and the query: copies tie exactly and break by id.
 */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */

#include "vindex.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash.h"
#include "idmap.h"
#include "vfaiss.h"
#include "vkernel.h"
#include "xxh64.h"

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
    vfaiss *fx;
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

    /* writer state, under wmu */
    size_t tier_retry_at; /* after a failed kind change, retry once live reaches this */
    bool pinned;
    deferred *dfree;
};

/* ---- small helpers ---- */

static void rdlock(vindex *vi)
{
    if (pthread_rwlock_rdlock(&vi->lock))
        abort(); /* only on misuse (deadlock, too many readers): not recoverable */
}

static void wrlock(vindex *vi)
{
    if (pthread_rwlock_wrlock(&vi->lock))
        abort();
}

static void unlock(vindex *vi)
{
    pthread_rwlock_unlock(&vi->lock);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort(); /* small control structures only (STYLE rule 7) */
    return p;
}

/* amalloc returns n bytes aligned to 64 (rounded up to a multiple of 64), or NULL. */
static void *amalloc(size_t n)
{
    size_t r = (n + 63) & ~(size_t)63;
    if (r < n)
        return NULL;
    return aligned_alloc(64, r ? r : 64);
}

static chunk *chunk_of(const vindex *vi, size_t slot)
{
    return vi->chunks[slot >> vi->ch_shift];
}

static size_t off_of(const vindex *vi, size_t slot)
{
    return slot & vi->ch_mask;
}

static bool tomb_at(const chunk *c, size_t off)
{
    return (c->tomb[off / 64] >> (off % 64)) & 1;
}

static void *meta_in(const vindex *vi, const chunk *c, size_t off)
{
    return vi->meta_size ? c->meta + off * vi->meta_size : NULL;
}

static const float *row_in(const vindex *vi, const chunk *c, size_t off)
{
    return c->rows + off * vi->dim;
}

/* inv_norm returns 1 / |v| computed in double, or 0 when v has no direction. */
static double inv_norm(const float *v, size_t dim)
{
    double sq = vk_dot_exact(v, v, dim); /* exact squares, summed in a fixed order */
    if (!(sq > 0.0) || !isfinite(sq))
        return 0.0;
    return 1.0 / sqrt(sq);
}

/* free_later frees p now, or after the pin when the index is pinned. wmu held. */
static void free_later(vindex *vi, void *p)
{
    if (!p)
        return;
    if (!vi->pinned) {
        free(p);
        return;
    }
    deferred *d = xmalloc(sizeof(*d));
    d->p = p;
    d->next = vi->dfree;
    vi->dfree = d;
}

static void unpin(vindex *vi)
{
    vi->pinned = false;
    while (vi->dfree) {
        deferred *d = vi->dfree;
        vi->dfree = d->next;
        free(d->p);
        free(d);
    }
}

/* ---- codes ---- */

/* encode_sq8 codes row x (dim floats) into code (sq_stride bytes, zero padded), *scale and
 * *rn (the rounded-up norm of the coding error). */
static void encode_sq8(const vindex *vi, const float *x, int8_t *code, float *scale, float *rn)
{
    vk_sq8_encode(x, vi->dim, code, scale, rn);
    memset(code + vi->dim, 0, vi->sq_stride - vi->dim);
}

/* encode_bin writes the sign code of x around center: the signs of the rotated x - center
 * (words = (dim + 63) / 64). The rotation spreads the variance of every direction over all
 * bits, and the centre removes what all vectors share, so each bit carries information on
 * any distribution: non-negative features, a dominant common direction, or a spectrum that
 * sits in a few dimensions. Out of memory (dimensions above ENC_STACK only) leaves a zero
 * code: searches stay correct, the calibration sees the lost recall. */
static void encode_bin(const vindex *vi, const float *center, const float *x, uint64_t *bits)
{
    float sbuf[ENC_STACK];
    float *t = vi->dim <= ENC_STACK ? sbuf : malloc(vi->dim * sizeof(float));
    if (!t) {
        memset(bits, 0, vi->words * sizeof(uint64_t));
        return;
    }
    for (size_t j = 0; j < vi->dim; j++)
        t[j] = x[j] - center[j];
    vk_rotate(t, vi->dim, vi->rot);
    vk_sign_bits(t, vi->dim, bits);
    if (t != sbuf)
        free(t);
}

/* center_of computes the mean of the live rows of the n slots in chunks (tombstones per
 * chunk) into a new array. Returns it (malloc'd, the caller owns it), or NULL when out of
 * memory. A caller holds what keeps those rows from changing. */
static float *center_of(const vindex *vi, chunk *const *chunks, size_t nslots,
                        const uint64_t *tomb_override)
{
    float *c = malloc(vi->dim * sizeof(float));
    double *acc = calloc(vi->dim, sizeof(double));
    if (!c || !acc) {
        free(c);
        free(acc);
        return NULL;
    }
    size_t n = 0;
    for (size_t s = 0; s < nslots; s++) {
        const chunk *ch = chunks[s >> vi->ch_shift];
        size_t off = s & vi->ch_mask;
        bool dead = tomb_override ? (tomb_override[s / 64] >> (s % 64)) & 1 : tomb_at(ch, off);
        if (dead)
            continue;
        const float *x = row_in(vi, ch, off);
        for (size_t j = 0; j < vi->dim; j++)
            acc[j] += x[j];
        n++;
    }
    for (size_t j = 0; j < vi->dim; j++)
        c[j] = n ? (float)(acc[j] / (double)n) : 0.0f;
    free(acc);
    return c;
}

/* ---- chunks ---- */

static void chunk_free(chunk *c)
{
    if (!c)
        return;
    free(c->rows);
    free(c->sq);
    free(c->sq_scale);
    free(c->sq_rn);
    free(c->bin);
    free(c->ids);
    free(c->meta);
    free(c->tomb);
    free(c);
}

/* chunk_alloc_codes gives c the code arrays of kind that it lacks. Returns 0 or -ENOMEM
 * (arrays allocated so far stay; they are only used once kind says so). */
static int chunk_alloc_codes(const vindex *vi, chunk *c, int kind)
{
    if (kind >= VINDEX_KIND_SQ8 && !c->sq) {
        int8_t *sq = amalloc(c->cap * vi->sq_stride);
        float *sc = amalloc(c->cap * sizeof(float)), *rn = amalloc(c->cap * sizeof(float));
        if (!sq || !sc || !rn) {
            free(sq);
            free(sc);
            free(rn);
            return -ENOMEM;
        }
        c->sq = sq;
        c->sq_scale = sc;
        c->sq_rn = rn;
    }
    if (kind >= VINDEX_KIND_ANN && !c->bin) {
        c->bin = amalloc(c->cap * vi->words * sizeof(uint64_t));
        if (!c->bin)
            return -ENOMEM;
    }
    return 0;
}

/* chunk_new returns a chunk of cap slots with the arrays of kind, or NULL. */
static chunk *chunk_new(const vindex *vi, size_t cap, int kind)
{
    chunk *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->cap = cap;
    c->rows = amalloc(cap * vi->dim * sizeof(float));
    c->ids = amalloc(cap * sizeof(uint64_t));
    c->tomb = calloc((cap + 63) / 64, sizeof(uint64_t));
    if (vi->meta_size)
        c->meta = amalloc(cap * vi->meta_size);
    if (!c->rows || !c->ids || !c->tomb || (vi->meta_size && !c->meta) ||
        chunk_alloc_codes(vi, c, kind)) {
        chunk_free(c);
        return NULL;
    }
    return c;
}

/* chunk_bytes returns the bytes c holds. */
static size_t chunk_bytes(const vindex *vi, const chunk *c)
{
    size_t per = vi->dim * sizeof(float) + sizeof(uint64_t) + vi->meta_size;
    if (c->sq)
        per += vi->sq_stride + 2 * sizeof(float);
    if (c->bin)
        per += vi->words * sizeof(uint64_t);
    return sizeof(*c) + c->cap * per + (c->cap + 63) / 64 * sizeof(uint64_t);
}

/* copy_slot copies slot data (row, id, meta when with_meta, codes present in both) from
 * (s, so) to (d, dof); the tombstone bit of the destination is left alone. */
static void copy_slot(const vindex *vi, chunk *d, size_t dof, const chunk *s, size_t so,
                      bool with_meta)
{
    memcpy(d->rows + dof * vi->dim, s->rows + so * vi->dim, vi->dim * sizeof(float));
    d->ids[dof] = s->ids[so];
    if (vi->meta_size && with_meta)
        memcpy(d->meta + dof * vi->meta_size, s->meta + so * vi->meta_size, vi->meta_size);
    if (d->sq && s->sq) {
        memcpy(d->sq + dof * vi->sq_stride, s->sq + so * vi->sq_stride, vi->sq_stride);
        d->sq_scale[dof] = s->sq_scale[so];
        d->sq_rn[dof] = s->sq_rn[so];
    }
    if (d->bin && s->bin)
        memcpy(d->bin + dof * vi->words, s->bin + so * vi->words, vi->words * sizeof(uint64_t));
}

/* encode_slot fills the codes c has for slot off from its row, unless have_kind says the
 * source already provided them; sign codes are taken around center (needed when c has
 * them). */
static void encode_slot(const vindex *vi, const float *center, chunk *c, size_t off, int have_kind)
{
    const float *x = row_in(vi, c, off);
    if (c->sq && have_kind < VINDEX_KIND_SQ8)
        encode_sq8(vi, x, c->sq + off * vi->sq_stride, &c->sq_scale[off], &c->sq_rn[off]);
    if (c->bin && have_kind < VINDEX_KIND_ANN)
        encode_bin(vi, center, x, c->bin + off * vi->words);
}

/* ---- creation ---- */

static int resolve_opts(const vindex_opts *in, vindex_opts *o)
{
    if (!in || in->dim == 0 || in->dim > MAX_DIM || in->meta_size > MAX_META ||
        in->compact_percent > 100)
        return -EINVAL;
    *o = *in;
    if (!o->quant_min)
        o->quant_min = DEF_QUANT_MIN;
    if (!o->ann_min)
        o->ann_min = DEF_ANN_MIN;
    if (!o->ann_candidates)
        o->ann_candidates = DEF_ANN_CAND;
    if (!o->ann_max_candidates)
        o->ann_max_candidates = DEF_ANN_MAX;
    if (!o->compact_percent)
        o->compact_percent = DEF_COMPACT_PERCENT;
    if (!o->inline_compact_max)
        o->inline_compact_max = DEF_INLINE_COMPACT;
    if (o->ann_max_candidates < o->ann_candidates)
        o->ann_max_candidates = o->ann_candidates;
    return 0;
}

/* vindex_create returns an empty index, or NULL when out of memory or opts are invalid. */
vindex *vindex_create(const vindex_opts *opts)
{
    vindex_opts o;
    if (resolve_opts(opts, &o))
        return NULL;
    vindex *vi = calloc(1, sizeof(*vi));
    if (!vi)
        return NULL;
    vi->o = o;
    vi->dim = o.dim;
    vi->meta_size = o.meta_size;
    vi->sq_stride = (o.dim + 31) / 32 * 32;
    vi->words = (o.dim + 63) / 64;
    /* about 1 MiB of rows per chunk, 64..4096 slots */
    size_t rows = ((size_t)1 << 20) / (o.dim * sizeof(float));
    vi->ch_shift = 6;
    while (vi->ch_shift < 12 && ((size_t)1 << (vi->ch_shift + 1)) <= rows)
        vi->ch_shift++;
    vi->ch_rows = (size_t)1 << vi->ch_shift;
    vi->ch_mask = vi->ch_rows - 1;
    vi->kind = VINDEX_KIND_FLAT;
    vi->rot = malloc(VK_ROT_ROUNDS * o.dim * sizeof(float));
    if (!vi->rot) {
        free(vi);
        return NULL;
    }
    vk_rot_signs(ROT_SEED, o.dim, vi->rot);
    vi->cal_rng = HASH_GOLDEN64;
    vi->cal_est = vi->cal_ann_est = NAN;
    vi->pub_est = vi->pub_ann_est = NAN;

    pthread_rwlockattr_t attr;
    if (pthread_rwlockattr_init(&attr))
        goto fail_vi;
#ifdef __GLIBC__
    /* glibc's default prefers readers: overlapping searches could starve writers */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    int rc = pthread_rwlock_init(&vi->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (rc)
        goto fail_vi;
    if (pthread_mutex_init(&vi->wmu, NULL))
        goto fail_lock;
    if (pthread_mutex_init(&vi->maint_mu, NULL))
        goto fail_wmu;
    if (pthread_mutex_init(&vi->cal_mu, NULL))
        goto fail_maint;
    if (pthread_mutex_init(&vi->pub_mu, NULL)) {
        pthread_mutex_destroy(&vi->cal_mu);
        goto fail_maint;
    }
    vi->map = idmap_create(0);
    if (!vi->map)
        goto fail_all;
    return vi;

fail_all:
    idmap_destroy(vi->map);
    pthread_mutex_destroy(&vi->pub_mu);
    pthread_mutex_destroy(&vi->cal_mu);
fail_maint:
    pthread_mutex_destroy(&vi->maint_mu);
fail_wmu:
    pthread_mutex_destroy(&vi->wmu);
fail_lock:
    pthread_rwlock_destroy(&vi->lock);
fail_vi:
    free(vi->rot);
    free(vi);
    return NULL;
}

static void free_chunks(chunk **chunks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        chunk_free(chunks[i]);
    free(chunks);
}

/* vindex_destroy frees the index; NULL is a no-op. No other thread may use it any more. */
void vindex_destroy(vindex *vi)
{
    if (!vi)
        return;
    free_chunks(vi->chunks, vi->nchunks);
    unpin(vi);
    idmap_destroy(vi->map);
    free(vi->center);
    free(vi->rot);
    free(vi->cal_pos);
    free(vi->cal_spos);
    vfaiss_destroy(vi->fx);
    free(vi->fx_slot);
    pthread_mutex_destroy(&vi->pub_mu);
    pthread_mutex_destroy(&vi->cal_mu);
    pthread_mutex_destroy(&vi->maint_mu);
    pthread_mutex_destroy(&vi->wmu);
    pthread_rwlock_destroy(&vi->lock);
    free(vi);
}

/* vindex_dim returns the dimension (fixed at creation, no lock needed). */
size_t vindex_dim(const vindex *vi)
{
    return vi->dim;
}

/* vindex_count returns the number of live vectors. Shared lock. */
size_t vindex_count(vindex *vi)
{
    rdlock(vi);
    size_t n = vi->live;
    unlock(vi);
    return n;
}

static size_t bytes_locked(const vindex *vi)
{
    size_t b = sizeof(*vi) + vi->tcap * sizeof(chunk *) + idmap_bytes(vi->map);
    for (size_t i = 0; i < vi->nchunks; i++)
        b += chunk_bytes(vi, vi->chunks[i]);
    if (vi->fx)
        b += vfaiss_bytes(vi->fx) + vi->fx_n * sizeof(uint32_t);
    return b;
}

/* vindex_bytes returns the memory held (see vindex.h). Shared lock. */
size_t vindex_bytes(vindex *vi)
{
    rdlock(vi);
    size_t b = bytes_locked(vi);
    unlock(vi);
    return b;
}

/* kind_for returns the kind live vectors call for: up from the thresholds, and down only
 * below half of them (hysteresis, so an index at a threshold does not flip). */
static int kind_for(const vindex *vi, size_t live, int cur)
{
    const vindex_opts *o = &vi->o;
    int k = VINDEX_KIND_FLAT;
    if (live >= o->ann_min && vi->dim < 0xffff) /* Hamming distances and their marker: 16 bits */
        k = VINDEX_KIND_ANN;
    else if (live >= o->quant_min)
        k = VINDEX_KIND_SQ8;
    if (k >= cur)
        return k;
    /* going down: keep cur while live is at least half of its threshold */
    if (cur == VINDEX_KIND_ANN && live >= o->ann_min / 2)
        return VINDEX_KIND_ANN;
    if (cur >= VINDEX_KIND_SQ8 && live >= o->quant_min / 2)
        return k > VINDEX_KIND_SQ8 ? k : VINDEX_KIND_SQ8;
    return k;
}

static bool compaction_due(const vindex *vi)
{
    return vi->ntomb >= COMPACT_MIN && vi->ntomb * 100 >= vi->nslots * vi->o.compact_percent;
}

/* center_stale: the index doubled since its centre was computed; a rebuild recomputes it
 * (the codes stay correct meanwhile, only less informative as the data drifts). */
static bool center_stale(const vindex *vi)
{
    return vi->kind == VINDEX_KIND_ANN && vi->live >= 2 * vi->center_live + 1024;
}

static bool rebuild_due(const vindex *vi)
{
    return compaction_due(vi) || kind_for(vi, vi->live, vi->kind) != vi->kind || center_stale(vi);
}

/* fx_due: the FAISS engine's index is missing, or its tail outgrew an eighth. */
static bool fx_due(const vindex *vi)
{
    if (vi->o.engine != VINDEX_ENGINE_FAISS || vi->kind != VINDEX_KIND_ANN)
        return false;
    size_t tail = vi->nslots - (vi->fx ? vi->fx_upto : 0);
    return !vi->fx_error[0] && (!vi->fx || tail > 1024 + vi->live / 8);
}

static bool maintenance_due(const vindex *vi)
{
    return rebuild_due(vi) || fx_due(vi);
}

/* vindex_get_stats fills *st under the shared lock. */
void vindex_get_stats(vindex *vi, vindex_stats *st)
{
    rdlock(vi);
    st->count = vi->live;
    st->slots = vi->nslots;
    st->tombstones = vi->ntomb;
    st->compactions = vi->nrebuilds;
    st->bytes = bytes_locked(vi);
    st->kind = (enum vindex_kind)vi->kind;
    st->maintenance_due = maintenance_due(vi);
    st->engine = vi->fx ? VINDEX_ENGINE_FAISS : VINDEX_ENGINE_NATIVE;
    unlock(vi);
}

/* vindex_last_error returns NULL: no FAISS calls remain (kept for compatibility). */
const char *vindex_last_error(void)
{
    return NULL;
}

/* ---- writers ---- */

/* ensure_room makes slot nslots writable and the map able to take one more key, publishing
 * any replaced array under a short exclusive lock. wmu held. Returns 0 or -ENOMEM. */
static int ensure_room(vindex *vi)
{
    size_t slot = vi->nslots;
    if (slot >= MAX_SLOTS)
        return -ENOMEM;
    size_t ci = slot >> vi->ch_shift, off = slot & vi->ch_mask;
    chunk **otable = NULL;
    chunk *grown = NULL; /* new chunk 0 arrays, in a chunk struct */
    chunk *added = NULL;
    idmap *nmap = NULL;

    if (ci == vi->nchunks) {
        size_t cap = ci == 0 ? CHUNK0_MIN : vi->ch_rows;
        if (cap > vi->ch_rows)
            cap = vi->ch_rows;
        added = chunk_new(vi, cap, vi->kind);
        if (!added)
            goto nomem;
        if (vi->nchunks == vi->tcap) {
            size_t ncap = vi->tcap ? vi->tcap * 2 : 4;
            chunk **t = malloc(ncap * sizeof(*t));
            if (!t)
                goto nomem;
            if (vi->nchunks)
                memcpy(t, vi->chunks, vi->nchunks * sizeof(*t));
            wrlock(vi);
            otable = vi->chunks;
            vi->chunks = t;
            vi->tcap = ncap;
            unlock(vi);
            free_later(vi, otable);
        }
    } else if (ci == 0 && off == vi->chunks[0]->cap) {
        chunk *c0 = vi->chunks[0];
        grown = chunk_new(vi, c0->cap * 2 > vi->ch_rows ? vi->ch_rows : c0->cap * 2, vi->kind);
        if (!grown)
            goto nomem;
        for (size_t i = 0; i < c0->cap; i++)
            copy_slot(vi, grown, i, c0, i, true);
        memcpy(grown->tomb, c0->tomb, (c0->cap + 63) / 64 * sizeof(uint64_t));
    }
    if (idmap_room(vi->map) == 0) {
        nmap = idmap_clone(vi->map, idmap_count(vi->map) * 2 + 16);
        if (!nmap)
            goto nomem;
    }
    if (added || grown || nmap) {
        idmap *omap = NULL;
        chunk old0;
        wrlock(vi);
        if (added)
            vi->chunks[vi->nchunks++] = added;
        if (grown) {
            old0 = *vi->chunks[0];
            chunk *c0 = vi->chunks[0];
            *c0 = *grown; /* swap the array pointers in place */
            *grown = old0;
        }
        if (nmap) {
            omap = vi->map;
            vi->map = nmap;
        }
        unlock(vi);
        if (grown) {
            /* grown now holds the old arrays */
            free_later(vi, grown->rows);
            free_later(vi, grown->sq);
            free_later(vi, grown->sq_scale);
            free_later(vi, grown->sq_rn);
            free_later(vi, grown->bin);
            free_later(vi, grown->ids);
            free_later(vi, grown->meta);
            free_later(vi, grown->tomb);
            free(grown);
        }
        idmap_destroy(omap);
    }
    return 0;

nomem:
    chunk_free(added);
    chunk_free(grown);
    idmap_destroy(nmap);
    return -ENOMEM;
}

/* tier_up gives every chunk the codes of kind, encodes the published slots, and switches
 * the kind under a short exclusive lock. wmu held; searches continue meanwhile (they do not
 * read the new arrays until the kind says so). Returns 0 or -ENOMEM (kind unchanged). */
static int tier_up(vindex *vi, int kind)
{
    int have = vi->kind;
    size_t n = vi->nchunks;
    /* New arrays go into shadow structs, attached under the lock, so that a failure leaves
     * the published chunks as they were. */
    chunk *shadow = calloc(n ? n : 1, sizeof(*shadow));
    if (!shadow)
        return -ENOMEM;
    float *center = NULL;
    if (kind >= VINDEX_KIND_ANN && have < VINDEX_KIND_ANN) {
        /* writers are excluded (wmu): the published rows are the ones to centre */
        center = center_of(vi, vi->chunks, vi->nslots, NULL);
        if (!center) {
            free(shadow);
            return -ENOMEM;
        }
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        chunk *c = vi->chunks[i];
        shadow[i] = *c;
        if (have < VINDEX_KIND_SQ8)
            shadow[i].sq = NULL, shadow[i].sq_scale = NULL, shadow[i].sq_rn = NULL;
        if (have < VINDEX_KIND_ANN)
            shadow[i].bin = NULL;
        if (chunk_alloc_codes(vi, &shadow[i], kind)) {
            rc = -ENOMEM;
            break;
        }
        size_t base = i << vi->ch_shift;
        size_t used = base < vi->nslots ? vi->nslots - base : 0;
        if (used > c->cap)
            used = c->cap;
        for (size_t off = 0; off < used; off++)
            encode_slot(vi, center, &shadow[i], off, have);
    }
    if (rc) {
        for (size_t i = 0; i < n; i++) {
            if (have < VINDEX_KIND_SQ8 && shadow[i].sq != vi->chunks[i]->sq) {
                free(shadow[i].sq);
                free(shadow[i].sq_scale);
                free(shadow[i].sq_rn);
            }
            if (have < VINDEX_KIND_ANN && shadow[i].bin != vi->chunks[i]->bin)
                free(shadow[i].bin);
        }
        free(shadow);
        free(center);
        return rc;
    }
    wrlock(vi);
    for (size_t i = 0; i < n; i++)
        *vi->chunks[i] = shadow[i];
    vi->kind = kind;
    if (center) {
        vi->center = center; /* there was none below ANN */
        vi->center_live = vi->live;
        vi->code_gen++;
    }
    unlock(vi);
    free(shadow);
    return 0;
}

/* maybe_tier_up switches up when the live count calls for it. wmu held. A failure (memory)
 * is retried after the index grew by an eighth; maintenance also retries. */
static void maybe_tier_up(vindex *vi)
{
    int want = kind_for(vi, vi->live, vi->kind);
    if (want <= vi->kind || vi->live < vi->tier_retry_at)
        return;
    if (tier_up(vi, want) != 0)
        vi->tier_retry_at = vi->live + vi->live / 8 + 1;
}

static void set_tomb(vindex *vi, size_t slot)
{
    chunk *c = chunk_of(vi, slot);
    size_t off = off_of(vi, slot);
    c->tomb[off / 64] |= (uint64_t)1 << (off % 64);
    vi->live--;
    vi->ntomb++;
}

/* put adds or (replace) upserts. Returns 0, 1 (replaced), or an error. */
static int put(vindex *vi, uint64_t id, const float *vec, const void *meta, bool replace)
{
    if (id == UINT64_MAX)
        return -EINVAL;
    double inv = inv_norm(vec, vi->dim);
    if (inv == 0.0)
        return VINDEX_E_ZERO;

    pthread_mutex_lock(&vi->wmu);
    uint64_t old;
    bool exists = idmap_get(vi->map, id, &old);
    int rc;
    if (exists && !replace) {
        rc = VINDEX_E_EXISTS;
        goto out;
    }
    rc = ensure_room(vi);
    if (rc)
        goto out;
    size_t slot = vi->nslots;
    chunk *c = chunk_of(vi, slot);
    size_t off = off_of(vi, slot);
    float *row = c->rows + off * vi->dim;
    for (size_t i = 0; i < vi->dim; i++)
        row[i] = (float)(vec[i] * inv);
    c->ids[off] = id;
    if (vi->meta_size)
        memcpy(c->meta + off * vi->meta_size, meta, vi->meta_size);
    encode_slot(vi, vi->center, c, off, VINDEX_KIND_FLAT);

    wrlock(vi);
    if (exists)
        set_tomb(vi, (size_t)old);
    idmap_put(vi->map, id, slot); /* room ensured: cannot fail */
    vi->nslots++;
    vi->live++;
    unlock(vi);
    rc = exists ? 1 : 0;
    maybe_tier_up(vi);
out:
    pthread_mutex_unlock(&vi->wmu);
    return rc;
}

/* vindex_add adds a normalized copy of vec under id; see vindex.h. */
int vindex_add(vindex *vi, uint64_t id, const float *vec, const void *meta)
{
    return put(vi, id, vec, meta, false);
}

/* vindex_upsert adds or atomically replaces; see vindex.h. */
int vindex_upsert(vindex *vi, uint64_t id, const float *vec, const void *meta)
{
    return put(vi, id, vec, meta, true);
}

static int rebuild(vindex *vi, bool inline_wmu);

/* vindex_remove tombstones id; small indexes compact here when due. */
int vindex_remove(vindex *vi, uint64_t id)
{
    pthread_mutex_lock(&vi->wmu);
    uint64_t slot;
    int rc = VINDEX_E_NOT_FOUND;
    if (idmap_get(vi->map, id, &slot)) {
        wrlock(vi);
        idmap_del(vi->map, id);
        set_tomb(vi, (size_t)slot);
        unlock(vi);
        rc = 0;
        if (compaction_due(vi) && vi->nslots <= vi->o.inline_compact_max &&
            pthread_mutex_trylock(&vi->maint_mu) == 0) {
            rebuild(vi, true); /* on -ENOMEM the tombstones simply stay */
            pthread_mutex_unlock(&vi->maint_mu);
        }
    }
    pthread_mutex_unlock(&vi->wmu);
    return rc;
}

/* vindex_contains tells whether id is live. Shared lock. */
bool vindex_contains(vindex *vi, uint64_t id)
{
    rdlock(vi);
    bool found = idmap_get(vi->map, id, NULL);
    unlock(vi);
    return found;
}

/* vindex_get_meta copies id's metadata into meta_out. Shared lock. */
int vindex_get_meta(vindex *vi, uint64_t id, void *meta_out)
{
    rdlock(vi);
    uint64_t slot;
    int rc = VINDEX_E_NOT_FOUND;
    if (idmap_get(vi->map, id, &slot)) {
        if (vi->meta_size)
            memcpy(meta_out, meta_in(vi, chunk_of(vi, slot), off_of(vi, slot)), vi->meta_size);
        rc = 0;
    }
    unlock(vi);
    return rc;
}

/* vindex_set_meta replaces id's metadata. Writer mutex, then exclusive lock. */
int vindex_set_meta(vindex *vi, uint64_t id, const void *meta)
{
    pthread_mutex_lock(&vi->wmu);
    wrlock(vi);
    uint64_t slot;
    int rc = VINDEX_E_NOT_FOUND;
    if (idmap_get(vi->map, id, &slot)) {
        if (vi->meta_size)
            memcpy(meta_in(vi, chunk_of(vi, slot), off_of(vi, slot)), meta, vi->meta_size);
        rc = 0;
    }
    unlock(vi);
    pthread_mutex_unlock(&vi->wmu);
    return rc;
}

/* vindex_update_meta applies fn to each present id's metadata under one exclusive lock. */
size_t vindex_update_meta(vindex *vi, const uint64_t *ids, size_t n,
                          void (*fn)(void *meta, void *ctx), void *ctx)
{
    size_t found = 0;
    pthread_mutex_lock(&vi->wmu);
    wrlock(vi);
    for (size_t i = 0; i < n; i++) {
        uint64_t slot;
        if (idmap_get(vi->map, ids[i], &slot)) {
            fn(meta_in(vi, chunk_of(vi, slot), off_of(vi, slot)), ctx);
            found++;
        }
    }
    unlock(vi);
    pthread_mutex_unlock(&vi->wmu);
    return found;
}

/* vindex_get_vector copies id's stored normalized vector into out. Shared lock. */
int vindex_get_vector(vindex *vi, uint64_t id, float *out)
{
    rdlock(vi);
    uint64_t slot;
    int rc = VINDEX_E_NOT_FOUND;
    if (idmap_get(vi->map, id, &slot)) {
        memcpy(out, row_in(vi, chunk_of(vi, slot), off_of(vi, slot)), vi->dim * sizeof(float));
        rc = 0;
    }
    unlock(vi);
    return rc;
}

/* vindex_foreach calls fn on every live vector in slot order under the shared lock. */
int vindex_foreach(vindex *vi,
                   int (*fn)(uint64_t id, const float *vec, const void *meta, void *ctx), void *ctx)
{
    int rc = 0;
    rdlock(vi);
    for (size_t s = 0; s < vi->nslots && rc == 0; s++) {
        const chunk *c = chunk_of(vi, s);
        size_t off = off_of(vi, s);
        if (!tomb_at(c, off))
            rc = fn(c->ids[off], row_in(vi, c, off), meta_in(vi, c, off), ctx);
    }
    unlock(vi);
    return rc;
}

/* ---- rebuild (compaction and kind changes) ---- */

/* A frozen view of the storage: chunk structs copied by value (their arrays stay valid
 * while the index is pinned), the tombstones copied. */
typedef struct view {
    chunk *ch; /* nchunks copies */
    size_t nchunks, nslots, live;
    uint64_t *tomb; /* one bit per slot, nslots bits */
    int kind;
    const float *center; /* the sign codes' centre (borrowed; maint_mu keeps it alive) */
} view;

static void view_free(view *v)
{
    free(v->ch);
    free(v->tomb);
    memset(v, 0, sizeof(*v));
}

/* view_take copies the state. wmu held. Returns 0 or -ENOMEM. */
static int view_take(vindex *vi, view *v)
{
    memset(v, 0, sizeof(*v));
    v->nchunks = vi->nchunks;
    v->nslots = vi->nslots;
    v->live = vi->live;
    v->kind = vi->kind;
    v->center = vi->center;
    v->ch = malloc((v->nchunks ? v->nchunks : 1) * sizeof(chunk));
    v->tomb = calloc((v->nslots + 63) / 64 + 1, sizeof(uint64_t));
    if (!v->ch || !v->tomb) {
        view_free(v);
        return -ENOMEM;
    }
    for (size_t i = 0; i < v->nchunks; i++)
        v->ch[i] = *vi->chunks[i];
    for (size_t s = 0; s < v->nslots; s++) {
        if (tomb_at(&v->ch[s >> vi->ch_shift], s & vi->ch_mask))
            v->tomb[s / 64] |= (uint64_t)1 << (s % 64);
    }
    return 0;
}

static bool view_tomb(const view *v, size_t s)
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

static void store_free(store *st)
{
    free_chunks(st->chunks, st->nchunks);
    free(st->center);
    memset(st, 0, sizeof(*st));
}

/* store_append copies slot so of chunk s (whose codes cover have_kind) as the next slot of
 * st, encoding the codes st's kind needs beyond that (sign codes around st->center: pass a
 * have_kind below ANN when s's were taken around another centre). Returns 0 or -ENOMEM. */
static int store_append(const vindex *vi, store *st, const chunk *s, size_t so, int have_kind,
                        bool with_meta)
{
    size_t slot = st->nslots, ci = slot >> vi->ch_shift, off = slot & vi->ch_mask;
    if (ci == 0 && st->nchunks == 1 && off == st->chunks[0]->cap) {
        /* chunk 0 was sized by the hint and more came: double it */
        chunk *o = st->chunks[0];
        chunk *g = chunk_new(vi, o->cap * 2 > vi->ch_rows ? vi->ch_rows : o->cap * 2, st->kind);
        if (!g)
            return -ENOMEM;
        for (size_t i = 0; i < o->cap; i++)
            copy_slot(vi, g, i, o, i, true);
        memcpy(g->tomb, o->tomb, (o->cap + 63) / 64 * sizeof(uint64_t));
        st->chunks[0] = g;
        chunk_free(o);
    }
    if (ci == st->nchunks) {
        if (st->nchunks == st->tcap) {
            size_t ncap = st->tcap ? st->tcap * 2 : 4;
            chunk **t = realloc(st->chunks, ncap * sizeof(*t));
            if (!t)
                return -ENOMEM;
            st->chunks = t;
            st->tcap = ncap;
        }
        size_t cap = vi->ch_rows;
        if (ci == 0) {
            size_t want = CHUNK0_MIN;
            while (want < st->hint && want < vi->ch_rows)
                want *= 2;
            cap = want < cap ? want : cap;
        }
        chunk *c = chunk_new(vi, cap, st->kind);
        if (!c)
            return -ENOMEM;
        st->chunks[st->nchunks++] = c;
    }
    chunk *d = st->chunks[ci];
    copy_slot(vi, d, off, s, so, with_meta);
    encode_slot(vi, st->center, d, off, have_kind);
    st->nslots++;
    return 0;
}

/* rebuild builds compacted storage of the kind the live count calls for and swaps it in.
 * maint_mu held. With inline_wmu, the caller holds wmu throughout (a small index compacting
 * inside vindex_remove); otherwise wmu is taken for the two short phases only, and the
 * changes writers made in between are carried over. Returns 1, or -ENOMEM with the index
 * unchanged. */
static int rebuild(vindex *vi, bool inline_wmu)
{
    view v;
    store st = {0};
    uint32_t *src = NULL; /* new slot -> old slot */
    idmap *nmap = NULL;
    int rc = -ENOMEM;

    if (!inline_wmu)
        pthread_mutex_lock(&vi->wmu);
    if (view_take(vi, &v)) {
        if (!inline_wmu)
            pthread_mutex_unlock(&vi->wmu);
        return -ENOMEM;
    }
    vi->pinned = true;
    st.kind = kind_for(vi, v.live, v.kind);
    st.hint = v.live + v.live / 8;
    if (!inline_wmu)
        pthread_mutex_unlock(&vi->wmu);

    /* Phase 2, no lock: copy the live slots of the view. An ANN store gets a new centre
     * from the view's live rows, and every sign code is taken anew around it. */
    src = malloc((v.nslots + 1) * sizeof(uint32_t));
    if (!src)
        goto relock;
    int have = v.kind;
    if (st.kind >= VINDEX_KIND_ANN) {
        chunk **tab = malloc((v.nchunks ? v.nchunks : 1) * sizeof(chunk *));
        if (!tab)
            goto relock;
        for (size_t i = 0; i < v.nchunks; i++)
            tab[i] = &v.ch[i];
        st.center = center_of(vi, tab, v.nslots, v.tomb);
        free(tab);
        if (!st.center)
            goto relock;
        if (have > VINDEX_KIND_SQ8)
            have = VINDEX_KIND_SQ8;
    }
    for (size_t s = 0; s < v.nslots; s++) {
        if (view_tomb(&v, s))
            continue;
        src[st.nslots] = (uint32_t)s;
        /* metadata may be changing under writers: copied in phase 3 */
        if (store_append(vi, &st, &v.ch[s >> vi->ch_shift], s & vi->ch_mask, have, false))
            goto relock;
    }
    rc = 0;

relock:
    if (!inline_wmu)
        pthread_mutex_lock(&vi->wmu);
    if (rc)
        goto fail;
    rc = -ENOMEM;
    /* Phase 3, writers excluded: carry over what changed since the view. */
    if (vi->nslots > v.nslots) {
        /* st.nslots <= v.nslots: room for every slot added since the view */
        uint32_t *s2 = realloc(src, (vi->nslots + 1) * sizeof(uint32_t));
        if (!s2)
            goto fail;
        src = s2;
    }
    if (vi->kind > v.kind && st.kind < vi->kind) {
        /* the index went up a kind meanwhile: give the new storage those codes too (a
         * rebuild that goes down a kind, st.kind < v.kind, stays down), around the centre
         * the index took */
        if (vi->kind >= VINDEX_KIND_ANN) {
            st.center = malloc(vi->dim * sizeof(float));
            if (!st.center)
                goto fail;
            memcpy(st.center, vi->center, vi->dim * sizeof(float));
        }
        for (size_t i = 0; i < st.nchunks; i++) {
            if (chunk_alloc_codes(vi, st.chunks[i], vi->kind))
                goto fail;
            for (size_t off = 0; off < st.chunks[i]->cap; off++) {
                size_t ns = (i << vi->ch_shift) + off;
                if (ns < st.nslots)
                    encode_slot(vi, st.center, st.chunks[i], off, st.kind);
            }
        }
        st.kind = vi->kind;
    }
    /* slots added meanwhile: their sign codes are around the old centre, unless the store
     * copied that centre just above */
    int added_have = vi->kind;
    if (added_have > VINDEX_KIND_SQ8 && st.center &&
        (!vi->center || memcmp(st.center, vi->center, vi->dim * sizeof(float)) != 0))
        added_have = VINDEX_KIND_SQ8;
    for (size_t s = v.nslots; s < vi->nslots; s++) {
        src[st.nslots] = (uint32_t)s;
        if (store_append(vi, &st, chunk_of(vi, s), off_of(vi, s), added_have, false))
            goto fail;
    }
    /* tombstones and metadata as they are now */
    for (size_t ns = 0; ns < st.nslots; ns++) {
        size_t os = src[ns];
        const chunk *oc = chunk_of(vi, os);
        size_t oo = off_of(vi, os);
        chunk *nc = st.chunks[ns >> vi->ch_shift];
        size_t no = ns & vi->ch_mask;
        if (tomb_at(oc, oo)) {
            nc->tomb[no / 64] |= (uint64_t)1 << (no % 64);
            st.ntomb++;
        } else if (vi->meta_size) {
            memcpy(nc->meta + no * vi->meta_size, oc->meta + oo * vi->meta_size, vi->meta_size);
        }
    }
    nmap = idmap_create(vi->live + vi->live / 4 + 16);
    if (!nmap)
        goto fail;
    for (size_t ns = 0; ns < st.nslots; ns++) {
        const chunk *nc = st.chunks[ns >> vi->ch_shift];
        size_t no = ns & vi->ch_mask;
        if (!tomb_at(nc, no) && idmap_put(nmap, nc->ids[no], ns))
            goto fail;
    }

    /* Phase 4: swap under the exclusive lock. */
    chunk **oldc = vi->chunks;
    size_t oldn = vi->nchunks;
    idmap *omap = vi->map;
    float *ocenter = vi->center;
    wrlock(vi);
    vi->chunks = st.chunks;
    vi->nchunks = st.nchunks;
    vi->tcap = st.tcap;
    vi->nslots = st.nslots;
    vi->ntomb = st.ntomb;
    vi->live = st.nslots - st.ntomb;
    vi->kind = st.kind;
    vi->map = nmap;
    vi->nrebuilds++;
    vi->center = st.kind >= VINDEX_KIND_ANN ? st.center : NULL;
    vi->center_live = vi->live;
    vi->code_gen++;
    vfaiss *ofx = vi->fx; /* its labels name the old slots */
    uint32_t *ofx_slot = vi->fx_slot;
    vi->fx = NULL;
    vi->fx_slot = NULL;
    vi->fx_n = vi->fx_upto = 0;
    vi->fx_error[0] = '\0'; /* a failed FAISS build is tried again on the new storage */
    unlock(vi);
    vfaiss_destroy(ofx);
    free(ofx_slot);
    if (st.kind < VINDEX_KIND_ANN)
        free(st.center);
    unpin(vi);
    free_chunks(oldc, oldn);
    free(ocenter); /* snapshots, the only lock-free readers, are excluded by maint_mu */
    idmap_destroy(omap);
    vi->tier_retry_at = 0;
    if (!inline_wmu)
        pthread_mutex_unlock(&vi->wmu);
    free(src);
    view_free(&v);
    return 1;

fail:
    unpin(vi);
    if (!inline_wmu)
        pthread_mutex_unlock(&vi->wmu);
    store_free(&st);
    idmap_destroy(nmap);
    free(src);
    view_free(&v);
    return -ENOMEM;
}

/* vindex_maintenance rebuilds when due; see vindex.h. */
/* fx_build builds the FAISS engine's index over the live slots of a view, without locks
 * (rows never change once published; maint_mu keeps slots from being renumbered), and
 * publishes it. maint_mu held. Returns 1, -ENOMEM, or VINDEX_E_FAISS (fx_error says why;
 * searches go on with the native codes). */
static int fx_build(vindex *vi)
{
    pthread_mutex_lock(&vi->wmu);
    size_t n = vi->nslots;
    view v;
    int rc = view_take(vi, &v);
    if (rc == 0)
        vi->pinned = true;
    pthread_mutex_unlock(&vi->wmu);
    if (rc)
        return rc;
    enum { BATCH = 1024 };
    vfaiss *fx = NULL;
    uint32_t *slots = malloc((v.live + 1) * sizeof(uint32_t));
    float *buf = malloc((size_t)BATCH * vi->dim * sizeof(float));
    char err[160] = "";
    size_t nl = 0;
    if (!slots || !buf) {
        rc = -ENOMEM;
        goto done;
    }
    int frc =
        vfaiss_create(vi->dim, vi->o.faiss_factory ? vi->o.faiss_factory : "HNSW32,Flat",
                      vi->o.faiss_ef_search ? vi->o.faiss_ef_search : 64, &fx, err, sizeof(err));
    if (frc) {
        rc = frc < 0 ? frc : VINDEX_E_FAISS;
        goto done;
    }
    size_t in = 0;
    for (size_t s = 0; s <= n && rc == 0; s++) {
        bool end = s == n;
        if (!end && !view_tomb(&v, s)) {
            memcpy(buf + in * vi->dim, row_in(vi, &v.ch[s >> vi->ch_shift], s & vi->ch_mask),
                   vi->dim * sizeof(float));
            slots[nl + in++] = (uint32_t)s;
        }
        if (in == BATCH || (end && in)) {
            frc = vfaiss_add(fx, in, buf);
            if (frc) {
                snprintf(err, sizeof(err), "add: %s", frc < 0 ? strerror(-frc) : "FAISS error");
                rc = frc < 0 ? frc : VINDEX_E_FAISS;
            }
            nl += in;
            in = 0;
        }
    }
done:
    free(buf);
    pthread_mutex_lock(&vi->wmu);
    vfaiss *ofx = NULL;
    uint32_t *oslot = NULL;
    if (rc == 0) {
        wrlock(vi);
        ofx = vi->fx;
        oslot = vi->fx_slot;
        vi->fx = fx;
        vi->fx_slot = slots;
        vi->fx_n = nl;
        vi->fx_upto = n;
        vi->code_gen++; /* the candidates change: the recall monitor starts over */
        unlock(vi);
        fx = NULL;
        slots = NULL;
        vi->fx_error[0] = '\0';
    } else {
        wrlock(vi); /* fx_due reads it under the shared lock */
        snprintf(vi->fx_error, sizeof(vi->fx_error), "%s", err[0] ? err : "out of memory");
        unlock(vi);
    }
    unpin(vi);
    pthread_mutex_unlock(&vi->wmu);
    vfaiss_destroy(ofx);
    free(oslot);
    vfaiss_destroy(fx);
    free(slots);
    view_free(&v);
    return rc ? rc : 1;
}

/* vindex_maintenance rebuilds and (FAISS engine) builds the FAISS index when due; see
 * vindex.h. */
int vindex_maintenance(vindex *vi)
{
    pthread_mutex_lock(&vi->maint_mu);
    pthread_mutex_lock(&vi->wmu);
    bool due = rebuild_due(vi);
    pthread_mutex_unlock(&vi->wmu);
    int rc = due ? rebuild(vi, false) : 0;
    if (rc >= 0) {
        pthread_mutex_lock(&vi->wmu);
        bool fdue = fx_due(vi);
        pthread_mutex_unlock(&vi->wmu);
        if (fdue) {
            int frc = fx_build(vi);
            rc = frc < 0 ? frc : frc == 1 ? 1 : rc;
            if (frc > 1)
                rc = frc; /* VINDEX_E_FAISS */
        }
    }
    pthread_mutex_unlock(&vi->maint_mu);
    return rc;
}

/* vindex_engine_error returns why the FAISS engine's index could not be built (empty when
 * it could, or was never tried); see vindex.h. */
void vindex_engine_error(vindex *vi, char *buf, size_t len)
{
    pthread_mutex_lock(&vi->wmu);
    snprintf(buf, len, "%s", vi->fx_error);
    pthread_mutex_unlock(&vi->wmu);
}

/* ---- search ---- */

typedef struct topk {
    vindex_hit *h; /* not owned: the caller's output, k entries */
    size_t n, k;
    size_t entered; /* hits offer took in (ANN patience) */
} topk;

/* better tells whether a ranks before b: higher score, then higher similarity, then lower
 * id. Ids are unique, so two hits are never equal. */
static bool better(const vindex_hit *a, const vindex_hit *b)
{
    if (a->score != b->score)
        return a->score > b->score;
    if (a->similarity != b->similarity)
        return a->similarity > b->similarity;
    return a->id < b->id;
}

/* The heap keeps the worst hit at the root: no child ranks below its parent. */
static void sift_down(vindex_hit *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(&h[w], &h[l]))
            w = l;
        if (r < n && better(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        vindex_hit t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void offer(topk *t, const vindex_hit *hit)
{
    if (t->n < t->k) {
        size_t i = t->n++;
        t->entered++;
        t->h[i] = *hit;
        while (i > 0) {
            size_t p = (i - 1) / 2;
            if (!better(&t->h[p], &t->h[i]))
                break;
            vindex_hit x = t->h[i];
            t->h[i] = t->h[p];
            t->h[p] = x;
            i = p;
        }
    } else if (better(hit, &t->h[0])) {
        t->entered++;
        t->h[0] = *hit;
        sift_down(t->h, t->n, 0);
    }
}

/* sort_best_first turns the heap into an array sorted best first (heap sort). */
static void sort_best_first(topk *t)
{
    for (size_t end = t->n; end > 1; end--) {
        vindex_hit x = t->h[0];
        t->h[0] = t->h[end - 1];
        t->h[end - 1] = x;
        sift_down(t->h, end - 1, 0);
    }
}

typedef struct cand {
    double ubs; /* upper bound of the score */
    double ub;  /* upper bound of the similarity */
    uint32_t slot;
} cand;

/* The prepared query. */
typedef struct qprep {
    const vindex_query *q;
    const float *qn; /* normalized, dim floats */
    int16_t *qq;     /* sq_stride entries */
    uint64_t *bits;  /* words */
    double qs;       /* int16 step: qn ~ qs * qq */
    double qnorm;    /* |qn| */
    double snorm;    /* |qn - qs * qq|, rounded up */
    bool bounded;    /* the query declares a score bound */
} qprep;

typedef struct sctx {
    const vindex *vi;
    const qprep *p;
    topk *t;
    bool kept_checked; /* keep already ran on every candidate */
} sctx;

static double score_ub(const qprep *p, double ub)
{
    const vindex_query *q = p->q;
    if (!q->score)
        return ub;
    return p->bounded ? q->score_slope * ub + q->score_bound : INFINITY;
}

/* cannot_beat tells whether a candidate whose score is at most ubs cannot enter a full
 * top k. The relative 1e-9 covers the rounding of the caller's score function, which may
 * land an ulp above the exact bound. */
static bool cannot_beat(const topk *t, double ubs)
{
    if (t->n < t->k)
        return false;
    double worst = t->h[0].score;
    return ubs < worst - 1e-9 * (1.0 + fabs(worst));
}

/* cand_before tells whether a is re-ranked before b: higher bound, then lower slot. */
static bool cand_before(const cand *a, const cand *b)
{
    if (a->ubs != b->ubs)
        return a->ubs > b->ubs;
    return a->slot < b->slot;
}

/* cand_sift restores the max-heap (by cand_before) below i. */
static void cand_sift(cand *c, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cand_before(&c[l], &c[m]))
            m = l;
        if (r < n && cand_before(&c[r], &c[m]))
            m = r;
        if (m == i)
            return;
        cand t = c[i];
        c[i] = c[m];
        c[m] = t;
        i = m;
    }
}

/* exact_sim returns the similarity of row x to the normalized query: level-independent
 * (vk_dot_exact), clamped to [-1, 1]. */
static float exact_sim(const float *x, const float *qn, size_t dim)
{
    double sim = vk_dot_exact(x, qn, dim);
    return sim > 1.0 ? 1.0f : sim < -1.0 ? -1.0f : (float)sim;
}

/* rerank ranks the n candidates exactly in decreasing order of their bound (a heap: most
 * candidates are never popped) until the bound cannot beat the k-th hit. */
static void rerank(const sctx *sc, cand *c, size_t n)
{
    const vindex *vi = sc->vi;
    const vindex_query *q = sc->p->q;
    topk *t = sc->t;
    for (size_t i = n / 2; i-- > 0;)
        cand_sift(c, n, i);
    while (n > 0) {
        cand top = c[0];
        c[0] = c[--n];
        cand_sift(c, n, 0);
        if (cannot_beat(t, top.ubs))
            break; /* the largest bound left: no other candidate can either */
        const chunk *ch = chunk_of(vi, top.slot);
        size_t off = off_of(vi, top.slot);
        const void *meta = meta_in(vi, ch, off);
        if (!sc->kept_checked && q->keep && !q->keep(meta, q->ctx))
            continue;
        if (q->score && q->score_monotone && t->n == t->k) {
            /* score(ub) bounds the score: the float similarity cannot exceed ub rounded up */
            float fu = top.ub >= 1.0 ? 1.0f : (float)top.ub;
            if ((double)fu < top.ub)
                fu = nextafterf(fu, INFINITY);
            double sub = q->score(fu, meta, q->ctx);
            if (!isnan(sub) && cannot_beat(t, sub))
                continue;
        }
        float sim = exact_sim(row_in(vi, ch, off), sc->p->qn, vi->dim);
        vindex_hit hit = {.id = ch->ids[off], .similarity = sim, .score = sim};
        if (q->score) {
            hit.score = q->score(sim, meta, q->ctx);
            if (isnan(hit.score))
                hit.score = -INFINITY; /* keep the heap's order total */
        }
        offer(t, &hit);
    }
}

/* sq8_ub returns the upper bound of the similarity of slot off of c from its code product. */
static double sq8_ub(const qprep *p, const chunk *c, size_t off, int64_t dot)
{
    double rn = c->sq_rn[off];
    return (double)c->sq_scale[off] * p->qs * (double)dot + p->qnorm * rn +
           p->snorm * (1.00001 + rn) + 1e-6;
}

/* search_exact scans every slot (FLAT: float products; SQ8: code products), see the file
 * comment; with filter_first (SQ8 codes and a keep function), keep runs on every slot first
 * and only kept slots are bounded (sc->kept_checked must be set). Shared lock held. */
static void search_exact(const sctx *sc, bool use_sq8, bool filter_first)
{
    const vindex *vi = sc->vi;
    const qprep *p = sc->p;
    /* float summation error of unit vectors: at most (dim + 1) 2^-24; twice that plus the
     * rounding of the exact similarity */
    double slack = (double)(vi->dim + 8) * 0x1p-23;
    cand cands[BLK];
    int64_t dots[BLK];
    size_t m;
    for (size_t base = 0; base < vi->nslots; base += m) {
        const chunk *c = chunk_of(vi, base);
        size_t off0 = off_of(vi, base);
        m = vi->nslots - base < BLK ? vi->nslots - base : BLK;
        if (m > c->cap - off0)
            m = c->cap - off0; /* blocks never span chunks */
        /* skip a block of tombstones only */
        size_t w0 = off0 / 64, w1 = (off0 + m + 63) / 64;
        bool any = false;
        for (size_t w = w0; w < w1 && !any; w++) {
            uint64_t word = c->tomb[w];
            size_t lo = w * 64 < off0 ? off0 - w * 64 : 0;
            size_t hi = (w + 1) * 64 > off0 + m ? off0 + m - w * 64 : 64;
            uint64_t mask =
                (hi == 64 ? ~(uint64_t)0 : (((uint64_t)1 << hi) - 1)) & ~(((uint64_t)1 << lo) - 1);
            any = (~word & mask) != 0;
        }
        if (!any)
            continue;
        if (use_sq8 && !filter_first)
            vk_sq8_dots(c->sq + off0 * vi->sq_stride, vi->sq_stride, m, p->qq, dots);
        size_t nc = 0;
        for (size_t r = 0; r < m; r++) {
            size_t off = off0 + r;
            if (tomb_at(c, off))
                continue;
            if (filter_first) {
                /* a selective filter: keep first, codes of the kept vectors only */
                if (!p->q->keep(meta_in(vi, c, off), p->q->ctx))
                    continue;
                dots[r] = vk_sq8_dot(c->sq + off * vi->sq_stride, p->qq, vi->sq_stride);
            }
            double ub = use_sq8 ? sq8_ub(p, c, off, dots[r])
                                : (double)vk_dot(row_in(vi, c, off), p->qn, vi->dim) + slack;
            double ubs = score_ub(p, ub);
            if (cannot_beat(sc->t, ubs))
                continue;
            cands[nc].ubs = ubs;
            cands[nc].ub = ub;
            cands[nc].slot = (uint32_t)(base + r);
            nc++;
        }
        rerank(sc, cands, nc);
    }
}

/* ann_budget returns how many candidates an ANN search gathers and bounds: the depth the
 * calibration measured for k = 10, scaled with k; before any measurement, an eighth of the
 * live vectors, at most ann_max_candidates. Always at least ann_candidates and 16 k. Shared
 * lock held. */
static size_t ann_budget(const vindex *vi, size_t k, bool scored)
{
    size_t lo = vi->o.ann_candidates > 16 * k ? vi->o.ann_candidates : 16 * k;
    size_t d = atomic_load_explicit(&vi->depth, memory_order_relaxed);
    size_t sd = scored ? atomic_load_explicit(&vi->sdepth, memory_order_relaxed) : 0;
    if (d && sd > d)
        d = sd; /* a blended ranking reaches deeper into the similarity order */
    size_t b;
    if (d) {
        b = d * ((k + CAL_K - 1) / CAL_K);
    } else {
        size_t hi = vi->o.ann_max_candidates > 16 * k ? vi->o.ann_max_candidates : 16 * k;
        b = vi->live / 8;
        b = b > hi ? hi : b;
    }
    return b < lo ? lo : b;
}

/* search_ann runs the Hamming-prefiltered search; see the file comment. Shared lock held.
 * Returns 0 or -ENOMEM. */
/* The gather of the ANN search: kept slots in increasing Hamming distance, appended to
 * list. */
typedef struct gather {
    const vindex *vi;
    const vindex_query *q;
    const uint16_t *hd; /* distance of every slot (0xffff: tombstone) */
    const uint32_t *hist;
    uint32_t *pos, *found, *list;
    size_t list_cap;
    unsigned maxh;
    size_t nl, examined, kept, cut_done;
    unsigned lo, cut_h; /* the next distance to take; a distance taken in parts so far */
} gather;

/* gather_more appends kept slots to g->list, a range of distances at a time sized by the
 * share of slots keep accepted so far, until it holds at least goal (goal <= list_cap -
 * PIECE) or every distance was taken. A distance holding more slots than the list has
 * room for is taken in parts (cut_h, cut_done: how many of its slots, in slot order,
 * earlier parts took). */
static void gather_more(gather *g, size_t goal)
{
    enum { PIECE = 4096 };
    const vindex *vi = g->vi;
    size_t n = vi->nslots;
    while (g->nl < goal && g->lo <= g->maxh) {
        double sel = g->examined ? (double)(g->kept + 1) / (double)g->examined : 1.0;
        double need = (double)(goal - g->nl) / sel;
        size_t room = g->list_cap - g->nl; /* > PIECE, since nl < goal */
        unsigned lo = g->lo;
        size_t first = g->hist[lo] - (lo == g->cut_h ? g->cut_done : 0);
        unsigned hi = lo;
        size_t cnt = first;
        while (hi < g->maxh && (double)cnt < need && cnt + g->hist[hi + 1] <= room) {
            hi++;
            cnt += g->hist[hi];
        }
        bool cut = cnt > room; /* only when hi == lo */
        if (cut)
            cnt = room;
        size_t acc = g->nl;
        for (unsigned h = lo; h <= hi; h++) {
            g->pos[h] = (uint32_t)acc;
            acc += h == lo ? first : g->hist[h];
        }
        size_t limit = g->nl + cnt, skip = lo == g->cut_h ? g->cut_done : 0;
        for (size_t b = 0; b < n; b += PIECE) {
            size_t m = n - b < PIECE ? n - b : PIECE;
            size_t f = vk_find_range(g->hd + b, m, lo, hi, g->found);
            for (size_t i = 0; i < f; i++) {
                size_t s = b + g->found[i];
                unsigned h = g->hd[s];
                if (h == lo && skip) {
                    skip--; /* taken by an earlier part */
                    continue;
                }
                uint32_t at = g->pos[h];
                if (at >= limit)
                    continue; /* beyond this part of a cut distance */
                g->list[at] = (uint32_t)s;
                g->pos[h]++;
            }
        }
        if (cut) {
            g->cut_done = (lo == g->cut_h ? g->cut_done : 0) + cnt;
            g->cut_h = lo;
        }
        /* keep, compacting in place (order preserved) */
        size_t w = g->nl;
        for (size_t i = g->nl; i < limit; i++) {
            uint32_t s = g->list[i];
            g->examined++;
            if (g->q->keep) {
                const chunk *c = chunk_of(vi, s);
                if (!g->q->keep(meta_in(vi, c, off_of(vi, s)), g->q->ctx))
                    continue;
            }
            g->kept++;
            g->list[w++] = s;
        }
        g->nl = w;
        if (!cut)
            g->lo = hi + 1;
    }
}

static int search_ann(const sctx *sc)
{
    const vindex *vi = sc->vi;
    const vindex_query *q = sc->p->q;
    const vindex_opts *o = &vi->o;
    size_t n = vi->nslots, maxh = vi->words * 64;
    size_t want = ann_budget(vi, q->k, q->score != NULL);
    size_t min_bound = o->ann_candidates > 4 * q->k ? o->ann_candidates : 4 * q->k;
    if (min_bound > want)
        min_bound = want;
    /* The measured depth is for similarity ranking. A score that blends in metadata ranks
     * vectors of lower similarity higher, deeper in code order: such a search goes on past
     * the depth while candidates keep entering the top k, stopping after ANN_PATIENCE in a
     * row that could not, or at the most the ANN path may bound. */
    size_t most = want;
    if (q->score) {
        most = o->ann_max_candidates > want ? o->ann_max_candidates : want;
        if (most > vi->live / 2)
            most = vi->live / 2 > want ? vi->live / 2 : want;
    }
    enum { PIECE = 4096 };
    size_t hist_n = maxh + 2;
    size_t bytes = n * sizeof(uint16_t) + hist_n * 2 * sizeof(uint32_t) + PIECE * sizeof(uint32_t) +
                   (most + PIECE) * sizeof(uint32_t);
    unsigned char *mem = malloc(bytes);
    if (!mem)
        return -ENOMEM;
    uint32_t *hist = (uint32_t *)mem; /* the 32-bit arrays first: alignment */
    uint32_t *pos = hist + hist_n;
    uint32_t *found = pos + hist_n;
    uint32_t *list = found + PIECE;
    size_t list_cap = most + PIECE;
    uint16_t *hd = (uint16_t *)(list + list_cap);

    /* 1. Hamming distances; tombstones get 0xffff (above any distance). */
    memset(hist, 0, hist_n * sizeof(uint32_t));
    for (size_t ci = 0; ci < vi->nchunks; ci++) {
        const chunk *c = vi->chunks[ci];
        size_t base = ci << vi->ch_shift;
        if (base >= n)
            break;
        size_t m = n - base < c->cap ? n - base : c->cap;
        vk_hamming(c->bin, vi->words, m, sc->p->bits, hd + base);
        for (size_t w = 0; w < (m + 63) / 64; w++) {
            uint64_t tw = c->tomb[w];
            while (tw) {
                size_t b = (size_t)__builtin_ctzll(tw);
                tw &= tw - 1;
                if (w * 64 + b < m)
                    hd[base + w * 64 + b] = 0xffff;
            }
        }
    }
    for (size_t s = 0; s < n; s++)
        hist[hd[s] <= maxh ? hd[s] : maxh + 1]++;

    /* 2 and 3. Gather kept candidates in increasing distance (gather_more, a step at a
     * time, so keep runs only on about as many slots as the re-rank consumes), and bound
     * and re-rank them in Hamming order, in batches. */
    gather g = {.vi = vi,
                .q = q,
                .hd = hd,
                .hist = hist,
                .pos = pos,
                .found = found,
                .list = list,
                .list_cap = list_cap,
                .maxh = (unsigned)maxh,
                .cut_h = UINT_MAX};
    size_t step = min_bound > GATHER_STEP ? min_bound : GATHER_STEP;
    gather_more(&g, step < want ? step : want);
    cand cands[ANN_BATCH];
    size_t misses = 0;
    for (size_t b = 0;; b += ANN_BATCH) {
        size_t upto = b < want ? want : most;
        if (b >= want && misses >= ANN_PATIENCE)
            break;
        if (b + ANN_BATCH > g.nl && g.nl < upto && g.lo <= maxh) {
            size_t goal = g.nl + step;
            gather_more(&g, goal < upto ? goal : upto);
        }
        size_t nl = g.nl < upto ? g.nl : upto;
        if (b >= nl)
            break;
        size_t m = nl - b < ANN_BATCH ? nl - b : ANN_BATCH;
        size_t nc = 0;
        for (size_t i = 0; i < m; i++) {
            uint32_t s = list[b + i];
            const chunk *c = chunk_of(vi, s);
            size_t off = off_of(vi, s);
            if (b + i + PREFETCH_AHEAD < nl) {
                /* candidates are scattered: fetch a later one's code while this one's is
                 * summed (the loop is otherwise bound by memory latency) */
                uint32_t ps = list[b + i + PREFETCH_AHEAD];
                const int8_t *pc = chunk_of(vi, ps)->sq + off_of(vi, ps) * vi->sq_stride;
                for (size_t l = 0; l < vi->sq_stride; l += 64)
                    __builtin_prefetch(pc + l);
            }
            int64_t dot = vk_sq8_dot(c->sq + off * vi->sq_stride, sc->p->qq, vi->sq_stride);
            double ub = sq8_ub(sc->p, c, off, dot);
            double ubs = score_ub(sc->p, ub);
            if (cannot_beat(sc->t, ubs))
                continue;
            cands[nc].ubs = ubs;
            cands[nc].ub = ub;
            cands[nc].slot = s;
            nc++;
        }
        size_t before = sc->t->entered;
        rerank(sc, cands, nc);
        misses = sc->t->entered == before ? misses + m : 0;
    }
    free(mem);
    return 0;
}

/* bound_slots bounds the n slots of list with their int8 codes, skipping tombstones and,
 * unless keep already ran, filtered ones, and re-ranks those that could enter the top k,
 * in batches. Shared lock held. */
static void bound_slots(const sctx *sc, const uint32_t *list, size_t n)
{
    const vindex *vi = sc->vi;
    const vindex_query *q = sc->p->q;
    cand cands[ANN_BATCH];
    size_t nc = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = list[i];
        const chunk *c = chunk_of(vi, s);
        size_t off = off_of(vi, s);
        if (tomb_at(c, off))
            continue;
        if (q->keep && !q->keep(meta_in(vi, c, off), q->ctx))
            continue;
        int64_t dot = vk_sq8_dot(c->sq + off * vi->sq_stride, sc->p->qq, vi->sq_stride);
        double ub = sq8_ub(sc->p, c, off, dot);
        double ubs = score_ub(sc->p, ub);
        if (cannot_beat(sc->t, ubs))
            continue;
        cands[nc].ubs = ubs;
        cands[nc].ub = ub;
        cands[nc].slot = s;
        if (++nc == ANN_BATCH) {
            rerank(sc, cands, nc);
            nc = 0;
        }
    }
    rerank(sc, cands, nc);
}

/* search_fx is the FAISS engine's ANN search: the want best candidates FAISS finds (labels
 * mapped to slots) and every slot of the tail, bounded and re-ranked exactly; keep runs on
 * each (sc->kept_checked is false). Returns 0, -ENOMEM, or 1 when the FAISS search failed
 * or the filter left fewer than k: the caller answers exactly then. Shared lock held. */
static int search_fx(const sctx *sc, size_t want)
{
    const vindex *vi = sc->vi;
    if (want > vi->fx_n)
        want = vi->fx_n;
    int64_t *labels = malloc(want * (sizeof(int64_t) + sizeof(float) + sizeof(uint32_t)) + 1);
    if (!labels)
        return -ENOMEM;
    float *sims = (float *)(labels + want);
    uint32_t *list = (uint32_t *)(sims + want);
    if (vfaiss_search(vi->fx, sc->p->qn, want, labels, sims)) {
        free(labels);
        return 1;
    }
    size_t n = 0;
    for (size_t i = 0; i < want; i++) {
        /* a label whose vector was deleted before a snapshot maps to no slot */
        if (labels[i] >= 0 && (size_t)labels[i] < vi->fx_n && vi->fx_slot[labels[i]] < vi->nslots)
            list[n++] = vi->fx_slot[labels[i]];
    }
    bound_slots(sc, list, n);
    free(labels);
    uint32_t tail[256];
    for (size_t s = vi->fx_upto; s < vi->nslots;) {
        size_t m = 0;
        while (m < 256 && s < vi->nslots)
            tail[m++] = (uint32_t)s++;
        bound_slots(sc, tail, m);
    }
    return sc->t->n < sc->t->k ? 1 : 0;
}

/* rare_filter estimates from a sample of SAMPLE slots spread over the index whether keep
 * passes fewer than budget / 2 vectors; then scanning every slot's metadata and bounding
 * the kept ones exactly is cheaper than a Hamming pass followed by a deep gather. Shared
 * lock held. */
static double keep_share(const vindex *vi, const vindex_query *q);

static bool rare_filter(const vindex *vi, const vindex_query *q, size_t budget)
{
    return keep_share(vi, q) * (double)vi->live < (double)budget / 2.0;
}

/* keep_share estimates from a sample of SAMPLE slots spread over the index the share of live
 * vectors keep passes, counting one extra pass for noise (1 when too few were live). */
static double keep_share(const vindex *vi, const vindex_query *q)
{
    enum { SAMPLE = 128 };
    size_t n = vi->nslots, seen = 0, kept = 0;
    /* scattered, fixed positions (a regular stride could alias with periodic metadata) */
    for (uint64_t j = 1; j <= 2 * SAMPLE && seen < SAMPLE; j++) {
        size_t s = (size_t)(((j * HASH_GOLDEN64) >> 11) % n);
        const chunk *c = chunk_of(vi, s);
        size_t off = off_of(vi, s);
        if (tomb_at(c, off))
            continue;
        seen++;
        kept += q->keep(meta_in(vi, c, off), q->ctx);
    }
    if (seen < SAMPLE / 2)
        return 1.0;
    double f = (double)(kept + 1) / (double)seen;
    return f < 1.0 ? f : 1.0;
}

/* prepare fills p for q; buffers are the caller's. Returns 0 or VINDEX_E_ZERO. */
static int prepare(const vindex *vi, const vindex_query *q, float *qn, int16_t *qq, uint64_t *bits,
                   qprep *p)
{
    size_t dim = vi->dim;
    double inv = inv_norm(q->vec, dim);
    if (inv == 0.0)
        return VINDEX_E_ZERO;
    double n2 = 0.0;
    float m = 0.0f;
    for (size_t i = 0; i < dim; i++) {
        qn[i] = (float)(q->vec[i] * inv);
        n2 += (double)qn[i] * qn[i];
        if (fabsf(qn[i]) > m)
            m = fabsf(qn[i]);
    }
    p->q = q;
    p->qn = qn;
    p->qq = qq;
    p->bits = bits;
    p->qnorm = sqrt(n2) * (1.0 + 1e-12);
    p->bounded = q->score_slope != 0.0 || q->score_bound != 0.0;
    p->qs = m > 0.0f ? (double)m / 32767.0 : 1.0;
    p->snorm = 0.0;
    return 0;
}

/* prepare_codes fills the int16 query (kind SQ8 and up) and the sign bits (ANN), using
 * scratch (dim floats). Any rounding works: the bound uses the exact remainder. Shared
 * lock held (the centre). */
static void prepare_codes(const vindex *vi, qprep *p, int kind, float *scratch)
{
    size_t dim = vi->dim;
    const float *qn = p->qn;
    int16_t *qq = p->qq;
    uint64_t *bits = p->bits;
    if (kind < VINDEX_KIND_SQ8)
        return;
    double s2 = 0.0, inv = 1.0 / p->qs;
    for (size_t i = 0; i < dim; i++) {
        double x = (double)qn[i] * inv;
        long v = (long)(x >= 0 ? x + 0.5 : x - 0.5);
        v = v > 32767 ? 32767 : v < -32767 ? -32767 : v;
        qq[i] = (int16_t)v;
        double r = (double)qn[i] - p->qs * (double)v;
        s2 += r * r;
    }
    for (size_t i = dim; i < vi->sq_stride; i++)
        qq[i] = 0;
    p->snorm = sqrt(s2) * (1.0 + 1e-9) + 1e-300;
    if (kind < VINDEX_KIND_ANN)
        return;
    /* the stored codes' definition, around the same centre */
    for (size_t j = 0; j < dim; j++)
        scratch[j] = qn[j] - vi->center[j];
    vk_rotate(scratch, dim, vi->rot);
    vk_sign_bits(scratch, dim, bits);
}

/* vindex_search writes the best q->k hits into out, best first; see vindex.h. */
int vindex_search(vindex *vi, const vindex_query *q, vindex_hit *out, size_t *n)
{
    *n = 0;
    size_t dim = vi->dim;
    float qbuf[QBUF], rbuf[QBUF];
    int16_t qqbuf[QBUF];
    uint64_t bbuf[QBUF / 64];
    float *qn = qbuf, *rot = rbuf;
    int16_t *qq = qqbuf;
    uint64_t *bits = bbuf;
    void *heap = NULL;
    if (vi->sq_stride > QBUF) {
        heap = malloc(2 * dim * sizeof(float) + vi->sq_stride * sizeof(int16_t) +
                      vi->words * sizeof(uint64_t));
        if (!heap)
            return -ENOMEM;
        bits = heap;
        qn = (float *)(bits + vi->words);
        rot = qn + dim;
        qq = (int16_t *)(rot + dim);
    }
    qprep p = {0};
    if (prepare(vi, q, qn, qq, bits, &p) || q->k == 0) {
        free(heap);
        return q->k == 0 && p.qn ? 0 : VINDEX_E_ZERO;
    }

    topk t = {.h = out, .n = 0, .k = q->k};
    sctx sc = {.vi = vi, .p = &p, .t = &t, .kept_checked = false};
    int rc = 0;
    rdlock(vi);
    prepare_codes(vi, &p, vi->kind, rot);
    size_t want = ann_budget(vi, q->k, q->score != NULL);
    bool fb = atomic_load_explicit(&vi->exact_fb, memory_order_relaxed) != 0;
    if (vi->kind == VINDEX_KIND_ANN && vi->live > 2 * want && !fb) {
        sc.kept_checked = true;
        /* a filter keeping under a tenth of the vectors (or fewer than half the budget) is
         * answered exactly, filter first: cheaper than gathering that deep (1% of 58,077 x
         * 384: 0.13 ms against 1.1 ms), and exact */
        double share = q->keep ? keep_share(vi, q) : 1.0;
        if (q->keep && (share < 0.1 || share * (double)vi->live < (double)want / 2.0)) {
            search_exact(&sc, true, true);
        } else if (vi->fx) {
            /* FAISS knows nothing of the filter: ask for as many more candidates as it
             * rejects, or scan exactly when that is more than the ANN path may take */
            size_t limit =
                vi->o.ann_max_candidates < vi->live / 2 ? vi->o.ann_max_candidates : vi->live / 2;
            double f = share;
            size_t need = (size_t)((double)want / f);
            /* a blended score ranks lower similarities higher: a deeper candidate list (the
             * native path goes on while candidates keep entering the top k instead) */
            if (q->score)
                need *= 4;
            sc.kept_checked = false;
            rc = need > limit && need > want ? 1 : search_fx(&sc, need);
            if (rc == 1) {
                /* too selective a filter, FAISS failed, or the filter kept fewer than k of
                 * its candidates: exact, the filter first when it is selective */
                t.n = 0;
                rc = 0;
                sc.kept_checked = q->keep && f < 0.25;
                search_exact(&sc, true, sc.kept_checked);
            }
        } else {
            rc = search_ann(&sc);
        }
    } else {
        /* on an ANN index with k large against it, or where the calibration found no depth
         * that reaches the recall target, the codes are scanned exactly */
        /* with codes, a filter keeping under a quarter of the vectors runs first: a keep
         * call costs less than a code product */
        bool sq8 = vi->kind >= VINDEX_KIND_SQ8;
        bool first = sq8 && q->keep && vi->live >= 1024 && rare_filter(vi, q, vi->live / 2);
        sc.kept_checked = first;
        search_exact(&sc, sq8, first);
    }
    unlock(vi);
    free(heap);
    if (rc)
        return rc;
    sort_best_first(&t);
    *n = t.n;
    return 0;
}

/* ---- recall calibration ---- */

static uint64_t cal_next(vindex *vi)
{
    return hash_splitmix64(&vi->cal_rng);
}

static double cal_gauss(vindex *vi)
{
    double u = ((double)(cal_next(vi) >> 11) + 0.5) / 9007199254740992.0;
    double w = ((double)(cal_next(vi) >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

/* random_live returns a random live slot (shared lock held, live > 0). */
static size_t random_live(vindex *vi)
{
    for (;;) {
        size_t s = (size_t)(cal_next(vi) % vi->nslots);
        if (!tomb_at(chunk_of(vi, s), off_of(vi, s)))
            return s;
    }
}

/* make_probe writes probe number i into out (dim floats): a query that is not a stored
 * vector but lies where queries do. Even probes are a stored vector plus Gaussian noise of
 * a quarter, half or all of its distance to the centre (a paraphrase of a memory); odd ones
 * the midpoint of a stored vector and a random neighbour-in-code of it (a question between
 * two memories). cal_mu and the shared lock held. */
static void make_probe(vindex *vi, size_t i, float *out)
{
    size_t dim = vi->dim;
    size_t a = random_live(vi);
    const float *x = row_in(vi, chunk_of(vi, a), off_of(vi, a));
    if (i % 2 == 0) {
        static const double scale[] = {0.25, 0.5, 1.0};
        double r2 = 0.0, e2 = 0.0;
        for (size_t j = 0; j < dim; j++) {
            double d = (double)x[j] - vi->center[j];
            r2 += d * d;
        }
        for (size_t j = 0; j < dim; j++) {
            out[j] = (float)cal_gauss(vi);
            e2 += (double)out[j] * out[j];
        }
        double f = scale[(i / 2) % 3] * sqrt(r2) / (sqrt(e2) + 1e-30);
        for (size_t j = 0; j < dim; j++)
            out[j] = x[j] + (float)(f * out[j]);
    } else {
        /* a second stored vector close in code to the first: the best of a few random ones */
        const uint64_t *ca = chunk_of(vi, a)->bin + off_of(vi, a) * vi->words;
        size_t best = random_live(vi);
        unsigned bd = UINT_MAX;
        for (int t = 0; t < 64; t++) {
            size_t b = random_live(vi);
            if (b == a)
                continue;
            const uint64_t *cb = chunk_of(vi, b)->bin + off_of(vi, b) * vi->words;
            unsigned d = 0;
            for (size_t w = 0; w < vi->words; w++)
                d += (unsigned)__builtin_popcountll(ca[w] ^ cb[w]);
            if (d < bd) {
                bd = d;
                best = b;
            }
        }
        const float *y = row_in(vi, chunk_of(vi, best), off_of(vi, best));
        for (size_t j = 0; j < dim; j++)
            out[j] = 0.5f * (x[j] + y[j]);
    }
}

/* probe_positions runs one probe: the exact top CAL_K of the probe (the int8 scan) and, for
 * each of them, its position in the order the ANN search gathers candidates (Hamming
 * distance, then slot), written to pos. With fx_depth (the FAISS engine), the position is
 * its rank among the fx_depth candidates FAISS returns, 0 in the tail, and UINT32_MAX when
 * the search would miss it. Returns the number written, or -ENOMEM. cal_mu and the shared
 * lock held. */
static int probe_positions(vindex *vi, const float *probe, uint32_t *pos, size_t fx_depth,
                           const vindex_query *shape, uint32_t *spos, int *nspos)
{
    size_t dim = vi->dim, n = vi->nslots;
    size_t scratch = 2 * dim * sizeof(float) + vi->sq_stride * sizeof(int16_t) +
                     vi->words * sizeof(uint64_t) + n * sizeof(uint16_t);
    unsigned char *mem = malloc(scratch);
    if (!mem)
        return -ENOMEM;
    uint64_t *bits = (uint64_t *)mem;
    float *qn = (float *)(bits + vi->words);
    float *rot = qn + dim;
    int16_t *qq = (int16_t *)(rot + dim);
    uint16_t *hd = (uint16_t *)(qq + vi->sq_stride);
    vindex_query q = {.vec = probe, .k = CAL_K};
    qprep p = {0};
    if (prepare(vi, &q, qn, qq, bits, &p)) {
        free(mem);
        return 0;
    }
    prepare_codes(vi, &p, VINDEX_KIND_ANN, rot);
    vindex_hit hits[CAL_K];
    topk t = {.h = hits, .n = 0, .k = CAL_K};
    sctx sc = {.vi = vi, .p = &p, .t = &t, .kept_checked = false};
    search_exact(&sc, true, false);
    size_t slot[2 * CAL_K];
    unsigned h[2 * CAL_K];
    size_t nh = 0;
    for (size_t i = 0; i < t.n; i++) {
        uint64_t sv;
        if (idmap_get(vi->map, hits[i].id, &sv))
            slot[nh++] = (size_t)sv;
    }
    if (fx_depth) {
        size_t want = fx_depth < vi->fx_n ? fx_depth : vi->fx_n;
        int64_t *labels = malloc(want * (sizeof(int64_t) + sizeof(float)) + 1);
        if (!labels) {
            free(mem);
            return -ENOMEM;
        }
        float *sims = (float *)(labels + want);
        bool ok = vfaiss_search(vi->fx, qn, want, labels, sims) == 0;
        for (size_t i = 0; i < nh; i++) {
            pos[i] = slot[i] >= vi->fx_upto ? 0 : UINT32_MAX;
            for (size_t j = 0; ok && pos[i] && j < want; j++)
                if (labels[j] >= 0 && (size_t)labels[j] < vi->fx_n &&
                    vi->fx_slot[labels[j]] == slot[i])
                    pos[i] = (uint32_t)j;
        }
        free(labels);
        free(mem);
        return (int)nh;
    }
    for (size_t ci = 0; ci < vi->nchunks; ci++) {
        const chunk *c = vi->chunks[ci];
        size_t base = ci << vi->ch_shift;
        if (base >= n)
            break;
        size_t m = n - base < c->cap ? n - base : c->cap;
        vk_hamming(c->bin, vi->words, m, bits, hd + base);
    }
    /* with a blended score: its exact top CAL_K too, placed in the same order */
    size_t ns = 0;
    if (shape && shape->score) {
        vindex_query sq = *shape;
        sq.vec = probe;
        sq.k = CAL_K;
        sq.keep = NULL;
        qprep sp = p;
        sp.q = &sq;
        sp.bounded = sq.score_slope != 0.0 || sq.score_bound != 0.0;
        topk st = {.h = hits, .n = 0, .k = CAL_K};
        sctx ssc = {.vi = vi, .p = &sp, .t = &st, .kept_checked = false};
        search_exact(&ssc, true, false);
        for (size_t i = 0; i < st.n; i++) {
            uint64_t sv;
            if (idmap_get(vi->map, hits[i].id, &sv))
                slot[nh + ns++] = (size_t)sv;
        }
    }
    uint32_t before[2 * CAL_K] = {0};
    for (size_t i = 0; i < nh + ns; i++)
        h[i] = hd[slot[i]];
    for (size_t s = 0; s < n; s++) {
        if (tomb_at(chunk_of(vi, s), off_of(vi, s)))
            continue;
        unsigned d = hd[s];
        for (size_t i = 0; i < nh + ns; i++)
            before[i] += d < h[i] || (d == h[i] && s < slot[i]);
    }
    for (size_t i = 0; i < nh; i++)
        pos[i] = before[i];
    for (size_t i = 0; i < ns; i++)
        spos[i] = before[nh + i];
    *nspos = (int)ns;
    free(mem);
    return (int)nh;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* depth_for returns the depth whose recall on the n sorted positions reaches goal, with a
 * quarter added for the sampling error, at least minimum. */
static size_t depth_for(const uint32_t *sorted, size_t n, double goal, size_t minimum)
{
    size_t idx = (size_t)ceil(goal * (double)n);
    idx = idx == 0 ? 0 : idx > n ? n - 1 : idx - 1;
    size_t d = (size_t)sorted[idx] + 1;
    d += d / 4 + 16;
    return d < minimum ? minimum : d;
}

/* vindex_calibrate measures the ANN search's recall and sets its depth; see vindex.h. */
int vindex_calibrate(vindex *vi, size_t probes, double target, vindex_recall *out)
{
    return vindex_calibrate_scored(vi, probes, target, NULL, out);
}

/* vindex_calibrate_scored is vindex_calibrate that also measures a blended ranking; see
 * vindex.h. */
int vindex_calibrate_scored(vindex *vi, size_t probes, double target, const vindex_query *shape,
                            vindex_recall *out)
{
    int rc = 0;
    float *probe = malloc(vi->dim * sizeof(float));
    uint32_t *sorted = malloc(CAL_RING * sizeof(uint32_t));
    if (!probe || !sorted) {
        free(probe);
        free(sorted);
        return -ENOMEM;
    }
    size_t live = 0, limit = 0;
    bool ann = false, was_below = false, fxm = false;
    pthread_mutex_lock(&vi->cal_mu);
    if (!vi->cal_pos || !vi->cal_spos) {
        if (!vi->cal_pos)
            vi->cal_pos = malloc(CAL_RING * sizeof(uint32_t));
        if (!vi->cal_spos)
            vi->cal_spos = malloc(CAL_RING * sizeof(uint32_t));
        if (!vi->cal_pos || !vi->cal_spos) {
            rc = -ENOMEM;
            goto done;
        }
    }
    for (size_t i = 0; i < probes; i++) {
        rdlock(vi);
        ann = vi->kind == VINDEX_KIND_ANN && vi->live > 0;
        live = vi->live;
        if (vi->cal_gen != vi->code_gen || !ann) {
            /* new codes: what was measured on the old ones says nothing */
            vi->cal_gen = vi->code_gen;
            vi->cal_n = vi->cal_head = vi->cal_probes = 0;
            vi->cal_sn = vi->cal_shead = 0;
        }
        if (!ann) {
            unlock(vi);
            break;
        }
        /* the FAISS engine is measured at the depth in use (its candidate list is not a
         * prefix of a deeper one); the ring starts over when that depth changes */
        fxm = vi->fx != NULL;
        size_t fxd = 0;
        if (fxm) {
            fxd = atomic_load(&vi->depth);
            fxd = fxd ? fxd : vi->o.ann_candidates;
            if (fxd != vi->cal_fx_depth) {
                vi->cal_fx_depth = fxd;
                vi->cal_n = vi->cal_head = 0;
            }
        }
        uint32_t pos[CAL_K], spos[CAL_K];
        int nsp = 0;
        make_probe(vi, vi->cal_probes, probe);
        int np = probe_positions(vi, probe, pos, fxd, fxm ? NULL : shape, spos, &nsp);
        unlock(vi);
        if (np < 0) {
            rc = np;
            goto done;
        }
        vi->cal_probes++;
        for (int j = 0; j < np; j++) {
            vi->cal_pos[vi->cal_head] = pos[j];
            vi->cal_head = (vi->cal_head + 1) % CAL_RING;
            if (vi->cal_n < CAL_RING)
                vi->cal_n++;
        }
        for (int j = 0; j < nsp; j++) {
            vi->cal_spos[vi->cal_shead] = spos[j];
            vi->cal_shead = (vi->cal_shead + 1) % CAL_RING;
            if (vi->cal_sn < CAL_RING)
                vi->cal_sn++;
        }
    }
    /* the most the ANN path may bound before an exact scan of the int8 codes is cheaper */
    limit = vi->o.ann_max_candidates;
    if (limit > live / 2)
        limit = live / 2;
    double goal = target + (1.0 - target) / 2.0;
    if (!ann) {
        atomic_store(&vi->depth, 0);
        atomic_store(&vi->exact_fb, 0);
        vi->cal_est = vi->cal_ann_est = NAN;
    } else if (fxm && vi->cal_n >= CAL_MIN) {
        size_t hit = 0, cur = vi->cal_fx_depth;
        for (size_t i = 0; i < vi->cal_n; i++)
            hit += vi->cal_pos[i] != UINT32_MAX;
        double est = (double)hit / (double)vi->cal_n;
        bool fb = false;
        vi->cal_ann_est = est;
        if (est < goal) {
            /* deeper: twice the candidates, measured anew; exact past the limit */
            was_below = est < target && !atomic_load(&vi->exact_fb);
            if (cur * 2 <= limit) {
                atomic_store(&vi->depth, cur * 2);
            } else {
                fb = true;
                atomic_store(&vi->depth, limit > cur ? limit : cur);
            }
        } else {
            atomic_store(&vi->depth, cur);
        }
        atomic_store(&vi->exact_fb, fb ? 1 : 0);
        vi->cal_est = fb ? 1.0 : est;
    } else if (!fxm && vi->cal_n >= CAL_MIN) {
        size_t n = vi->cal_n;
        memcpy(sorted, vi->cal_pos, n * sizeof(uint32_t));
        qsort(sorted, n, sizeof(uint32_t), cmp_u32);
        /* the recall the depth in use reached on these samples */
        size_t cur = atomic_load(&vi->depth);
        if (cur == 0) {
            cur = live / 8 > vi->o.ann_max_candidates ? vi->o.ann_max_candidates : live / 8;
            cur = cur < vi->o.ann_candidates ? vi->o.ann_candidates : cur;
        }
        bool cur_fb = atomic_load(&vi->exact_fb) != 0;
        size_t hit = 0;
        while (hit < n && sorted[hit] < cur)
            hit++;
        was_below = !cur_fb && (double)hit / (double)n < target;
        /* the depth that keeps half the allowed misses in reserve: the goal's quantile,
         * plus a quarter for the sampling error */
        size_t d = depth_for(sorted, n, goal, vi->o.ann_candidates);
        bool fb = d > limit;
        size_t use = fb ? limit : d;
        hit = 0;
        while (hit < n && sorted[hit] < use)
            hit++;
        vi->cal_ann_est = (double)hit / (double)n;
        vi->cal_est = fb ? 1.0 : vi->cal_ann_est;
        atomic_store(&vi->depth, use);
        atomic_store(&vi->exact_fb, fb ? 1 : 0);
        if (vi->cal_sn >= CAL_MIN) {
            /* a blended ranking: its own depth, capped where the scan is cheaper (searches
             * with a score also go on while candidates keep entering their top k) */
            memcpy(sorted, vi->cal_spos, vi->cal_sn * sizeof(uint32_t));
            qsort(sorted, vi->cal_sn, sizeof(uint32_t), cmp_u32);
            size_t sd = depth_for(sorted, vi->cal_sn, goal, vi->o.ann_candidates);
            atomic_store(&vi->sdepth, sd > limit ? limit : sd);
        }
    }
done:
    if (out) {
        out->estimate = vi->kind == VINDEX_KIND_ANN ? vi->cal_est : 1.0;
        out->ann_estimate = vi->cal_ann_est;
        out->depth = atomic_load(&vi->depth);
        out->samples = vi->cal_n;
        out->exact_fallback = atomic_load(&vi->exact_fb) != 0;
        out->was_below = was_below;
        out->scored_depth = atomic_load(&vi->sdepth);
    }
    pthread_mutex_lock(&vi->pub_mu);
    vi->pub_est = vi->cal_est;
    vi->pub_ann_est = vi->cal_ann_est;
    vi->pub_samples = vi->cal_n;
    vi->pub_gen = vi->cal_gen;
    pthread_mutex_unlock(&vi->pub_mu);
    pthread_mutex_unlock(&vi->cal_mu);
    free(probe);
    free(sorted);
    return rc;
}

/* vindex_get_recall reads what the last calibration found; see vindex.h. */
void vindex_get_recall(vindex *vi, vindex_recall *out)
{
    pthread_mutex_lock(&vi->pub_mu);
    double est = vi->pub_est, ann_est = vi->pub_ann_est;
    size_t samples = vi->pub_samples;
    uint64_t gen = vi->pub_gen;
    pthread_mutex_unlock(&vi->pub_mu);
    rdlock(vi);
    bool ann = vi->kind == VINDEX_KIND_ANN;
    bool fresh = gen == vi->code_gen;
    unlock(vi);
    out->estimate = !ann ? 1.0 : fresh ? est : NAN;
    out->ann_estimate = ann && fresh ? ann_est : NAN;
    out->depth = atomic_load(&vi->depth);
    out->samples = fresh ? samples : 0;
    out->exact_fallback = atomic_load(&vi->exact_fb) != 0;
    out->was_below = false;
    out->scored_depth = atomic_load(&vi->sdepth);
}

/* ---- snapshots ---- */

#define SNAP_MAGIC "ENGVIDX"
#define SNAP_VERSION 3 /* 3: the sign codes' centre follows them; 2 is read (codes redone) */
#define SNAP_HEADER 88
#define SNAP_BOM 0x01020304u
#define CK_OFF 56

static uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian hosts only (the snapshot format is little-endian) */
}

static uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* A buffered writer that hashes what it writes. */
typedef struct wbuf {
    int fd;
    unsigned char *buf;
    size_t n, cap;
    xxh64_state h;
    int err; /* first -errno */
} wbuf;

static void wflush(wbuf *w)
{
    size_t done = 0;
    while (done < w->n && !w->err) {
        ssize_t r = write(w->fd, w->buf + done, w->n - done);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            w->err = -errno;
        } else {
            done += (size_t)r;
        }
    }
    w->n = 0;
}

static void wput(wbuf *w, const void *data, size_t len)
{
    const unsigned char *p = data;
    xxh64_update(&w->h, p, len);
    while (len > 0 && !w->err) {
        size_t take = w->cap - w->n < len ? w->cap - w->n : len;
        memcpy(w->buf + w->n, p, take);
        w->n += take;
        p += take;
        len -= take;
        if (w->n == w->cap)
            wflush(w);
    }
}

static void put_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

/* fsync_dir fsyncs the directory holding path. Returns 0 or -errno. */
static int fsync_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = strdup(".");
    } else if (slash == path) {
        dir = strdup("/");
    } else {
        dir = strndup(path, (size_t)(slash - path));
    }
    if (!dir)
        return -ENOMEM;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

/* vindex_save_extra writes a snapshot atomically; see vindex.h. */
int vindex_save_extra(vindex *vi, const char *path, uint64_t seq, const void *extra,
                      size_t extra_len)
{
    view v;
    unsigned char *metas = NULL;
    int rc;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp)
        return -ENOMEM;
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);

    pthread_mutex_lock(&vi->maint_mu);
    pthread_mutex_lock(&vi->wmu);
    rc = view_take(vi, &v);
    if (rc == 0 && vi->meta_size && v.live) {
        metas = malloc(v.live * vi->meta_size);
        if (!metas) {
            rc = -ENOMEM;
            view_free(&v);
        } else {
            size_t j = 0;
            for (size_t s = 0; s < v.nslots; s++) {
                if (!view_tomb(&v, s)) {
                    memcpy(metas + j * vi->meta_size,
                           meta_in(vi, &v.ch[s >> vi->ch_shift], s & vi->ch_mask), vi->meta_size);
                    j++;
                }
            }
        }
    }
    if (rc == 0)
        vi->pinned = true;
    pthread_mutex_unlock(&vi->wmu);
    if (rc) {
        pthread_mutex_unlock(&vi->maint_mu);
        free(tmp);
        return rc;
    }

    wbuf w = {.fd = -1, .cap = 1 << 20};
    w.buf = malloc(w.cap);
    if (!w.buf) {
        rc = -ENOMEM;
        goto done;
    }
    w.fd = mkostemp(tmp, O_CLOEXEC);
    if (w.fd < 0) {
        rc = -errno;
        goto done;
    }
    xxh64_init(&w.h, 0);
    unsigned char hdr[SNAP_HEADER];
    memset(hdr, 0, sizeof(hdr));
    memcpy(hdr, SNAP_MAGIC, 8);
    put_u32(hdr + 8, SNAP_VERSION);
    put_u32(hdr + 12, SNAP_HEADER);
    put_u64(hdr + 16, vi->dim);
    put_u64(hdr + 24, vi->meta_size);
    put_u64(hdr + 32, v.live);
    put_u64(hdr + 40, seq);
    put_u32(hdr + 48, (uint32_t)v.kind);
    put_u32(hdr + 52, SNAP_BOM);
    put_u64(hdr + 64, vi->sq_stride);
    put_u64(hdr + 72, vi->words);
    put_u64(hdr + 80, extra_len);
    wput(&w, hdr, sizeof(hdr)); /* checksum field zero while hashed */

    /* sections; each walks the live slots of the view */
    for (int sec = 0; sec < 7 && !w.err; sec++) {
        if (sec == 1) {
            if (metas)
                wput(&w, metas, v.live * vi->meta_size);
            continue;
        }
        if (sec >= 3 && sec <= 5 && v.kind < VINDEX_KIND_SQ8)
            continue;
        if (sec == 6 && v.kind < VINDEX_KIND_ANN)
            continue;
        for (size_t s = 0; s < v.nslots && !w.err; s++) {
            if (view_tomb(&v, s))
                continue;
            const chunk *c = &v.ch[s >> vi->ch_shift];
            size_t off = s & vi->ch_mask;
            switch (sec) {
            case 0:
                wput(&w, &c->ids[off], sizeof(uint64_t));
                break;
            case 2:
                wput(&w, row_in(vi, c, off), vi->dim * sizeof(float));
                break;
            case 3:
                wput(&w, &c->sq_scale[off], sizeof(float));
                break;
            case 4:
                wput(&w, &c->sq_rn[off], sizeof(float));
                break;
            case 5:
                wput(&w, c->sq + off * vi->sq_stride, vi->sq_stride);
                break;
            case 6:
                wput(&w, c->bin + off * vi->words, vi->words * sizeof(uint64_t));
                break;
            }
        }
    }
    if (v.kind >= VINDEX_KIND_ANN && !w.err) {
        unsigned char cl[8];
        put_u64(cl, vi->center_live);
        wput(&w, v.center, vi->dim * sizeof(float));
        wput(&w, cl, 8);
        /* the FAISS engine's index (maint_mu keeps it as it is), its labels mapped to the
         * snapshot's slots: u64 bytes, u64 labels, the bytes, u32 slot per label (UINT32_MAX:
         * deleted), u64 where the tail starts; zeros without one */
        void *fxb = NULL;
        size_t fxlen = 0;
        uint32_t *newof = NULL;
        if (vi->fx) {
            newof = malloc((v.nslots + 1) * sizeof(uint32_t));
            if (!newof || vfaiss_serialize(vi->fx, &fxb, &fxlen) != 0) {
                free(newof);
                newof = NULL;
                fxb = NULL;
                fxlen = 0; /* saved without it: the next maintenance builds it again */
            }
        }
        unsigned char fh[16];
        put_u64(fh, fxlen);
        put_u64(fh + 8, fxlen ? vi->fx_n : 0);
        wput(&w, fh, 16);
        size_t upto = 0;
        if (fxlen) {
            wput(&w, fxb, fxlen);
            uint32_t j = 0;
            for (size_t s = 0; s < v.nslots; s++) {
                newof[s] = view_tomb(&v, s) ? UINT32_MAX : j++;
                if (s < vi->fx_upto && newof[s] != UINT32_MAX)
                    upto++;
            }
            for (size_t l = 0; l < vi->fx_n && !w.err; l++) {
                uint32_t ns = vi->fx_slot[l] < v.nslots ? newof[vi->fx_slot[l]] : UINT32_MAX;
                unsigned char b4[4];
                put_u32(b4, ns);
                wput(&w, b4, 4);
            }
        }
        put_u64(fh, upto);
        wput(&w, fh, 8);
        free(fxb);
        free(newof);
    }
    if (extra_len)
        wput(&w, extra, extra_len);
    wflush(&w);
    rc = w.err;
    if (rc == 0) {
        unsigned char ck[8];
        put_u64(ck, xxh64_digest(&w.h));
        if (pwrite(w.fd, ck, 8, CK_OFF) != 8)
            rc = errno ? -errno : -EIO;
    }
    if (rc == 0 && fsync(w.fd))
        rc = -errno;
    if (close(w.fd) && rc == 0)
        rc = -errno;
    w.fd = -1;
    if (rc == 0 && rename(tmp, path))
        rc = -errno;
    if (rc == 0)
        rc = fsync_dir(path);
    else
        unlink(tmp);

done:
    if (w.fd >= 0) {
        close(w.fd);
        unlink(tmp);
    }
    free(w.buf);
    pthread_mutex_lock(&vi->wmu);
    unpin(vi);
    pthread_mutex_unlock(&vi->wmu);
    pthread_mutex_unlock(&vi->maint_mu);
    view_free(&v);
    free(metas);
    free(tmp);
    return rc;
}

int vindex_save(vindex *vi, const char *path, uint64_t seq)
{
    return vindex_save_extra(vi, path, seq, NULL, 0);
}

/* A reader that hashes what it reads and reports short files. */
typedef struct rbuf {
    int fd;
    xxh64_state h;
    int err; /* first error: VINDEX_E_CORRUPT on a short read, or -errno */
} rbuf;

static void rget(rbuf *r, void *dst, size_t len)
{
    unsigned char *p = dst;
    size_t done = 0;
    while (done < len && !r->err) {
        ssize_t n = read(r->fd, p + done, len - done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            r->err = -errno;
        } else if (n == 0) {
            r->err = VINDEX_E_CORRUPT;
        } else {
            done += (size_t)n;
        }
    }
    if (!r->err)
        xxh64_update(&r->h, p, len);
}

/* rskip reads and hashes len bytes nobody keeps. */
static void rskip(rbuf *r, size_t len, unsigned char *scratch, size_t scap)
{
    while (len > 0 && !r->err) {
        size_t take = len < scap ? len : scap;
        rget(r, scratch, take);
        len -= take;
    }
}

/* mul_ok stores a * b in *out unless it overflows. */
static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a && b > UINT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

/* vindex_load_extra reads a snapshot; see vindex.h. */
int vindex_load_extra(const char *path, const vindex_opts *opts, vindex **out, uint64_t *seq,
                      void **extra, size_t *extra_len)
{
    *out = NULL;
    if (extra) {
        *extra = NULL;
        *extra_len = 0;
    }
    unsigned char *xbuf = NULL;
    vindex_opts ro;
    if (resolve_opts(opts, &ro))
        return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? VINDEX_E_NOT_FOUND : -errno;
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    vindex *vi = NULL;
    unsigned char *scratch = NULL;
    rbuf r = {.fd = fd};
    xxh64_init(&r.h, 0);
    int rc;
    struct stat sb;
    if (fstat(fd, &sb)) {
        rc = -errno;
        goto fail;
    }
    unsigned char hdr[SNAP_HEADER];
    rget(&r, hdr, sizeof(hdr));
    if (r.err) {
        rc = r.err;
        goto fail;
    }
    uint64_t want_ck = rd64(hdr + CK_OFF);
    /* the checksum covers the header with its own field zero: rehash the header */
    memset(hdr + CK_OFF, 0, 8);
    xxh64_init(&r.h, 0);
    xxh64_update(&r.h, hdr, sizeof(hdr));
    uint64_t dim = rd64(hdr + 16), msz = rd64(hdr + 24), count = rd64(hdr + 32);
    uint32_t kind = rd32(hdr + 48), version = rd32(hdr + 8);
    if (memcmp(hdr, SNAP_MAGIC, 8) != 0 || version < 2 || version > SNAP_VERSION ||
        rd32(hdr + 12) != SNAP_HEADER || rd32(hdr + 52) != SNAP_BOM || kind > VINDEX_KIND_ANN ||
        dim == 0 || dim > MAX_DIM || msz > MAX_META || rd64(hdr + 64) != (dim + 31) / 32 * 32 ||
        rd64(hdr + 72) != (dim + 63) / 64 || count >= MAX_SLOTS) {
        rc = VINDEX_E_CORRUPT;
        goto fail;
    }
    /* expected length: every section's size from count */
    uint64_t per = 8 + msz + dim * 4;
    if (kind >= VINDEX_KIND_SQ8)
        per += 8 + (dim + 31) / 32 * 32;
    if (kind >= VINDEX_KIND_ANN)
        per += (dim + 63) / 64 * 8;
    uint64_t body, xlen = rd64(hdr + 80);
    /* version 3, ANN: the centre, then the FAISS engine's section, whose two lengths are
     * read ahead here to check the file's length (they are hashed in order later) */
    uint64_t tail = 0, fxlen = 0, fxlab = 0;
    if (version >= 3 && kind >= VINDEX_KIND_ANN) {
        unsigned char fh[16];
        uint64_t at;
        if (!mul_ok(count, per, &body) || body > (uint64_t)sb.st_size ||
            (at = SNAP_HEADER + body + dim * 4 + 8) + 16 > (uint64_t)sb.st_size ||
            pread(fd, fh, 16, (off_t)at) != 16) {
            rc = VINDEX_E_CORRUPT;
            goto fail;
        }
        fxlen = rd64(fh);
        fxlab = rd64(fh + 8);
        if (fxlen > (uint64_t)sb.st_size || fxlab > count * 4 + 1024) {
            rc = VINDEX_E_CORRUPT;
            goto fail;
        }
        tail = dim * 4 + 8 + 16 + fxlen + fxlab * 4 + 8;
    }
    if (!mul_ok(count, per, &body) || body > UINT64_MAX - SNAP_HEADER - xlen - tail ||
        xlen > (uint64_t)sb.st_size || (uint64_t)sb.st_size != SNAP_HEADER + body + tail + xlen) {
        rc = VINDEX_E_CORRUPT;
        goto fail;
    }
    if (dim != ro.dim || msz != ro.meta_size) {
        /* intact? only a good checksum says so; a mismatch is reported either way, since
         * neither a corrupt nor a foreign file can be used */
        rc = VINDEX_E_MISMATCH;
        goto fail;
    }
    vi = vindex_create(&ro);
    scratch = malloc(1 << 16);
    if (!vi || !scratch) {
        rc = -ENOMEM;
        goto fail;
    }
    /* the kind to build: what the options call for, but at most what the file has plus
     * encoding (codes the file lacks are computed after the checksum) */
    int target = kind_for(vi, (size_t)count, VINDEX_KIND_FLAT);
    store st = {0};
    st.kind = target;
    size_t nch = count ? ((size_t)count + vi->ch_rows - 1) >> vi->ch_shift : 0;
    st.chunks = calloc(nch ? nch : 1, sizeof(chunk *));
    if (!st.chunks) {
        rc = -ENOMEM;
        goto fail;
    }
    st.tcap = nch ? nch : 1;
    for (size_t i = 0; i < nch; i++) {
        size_t cap = vi->ch_rows;
        if (nch == 1) {
            cap = CHUNK0_MIN;
            while (cap < count)
                cap *= 2;
        }
        st.chunks[i] = chunk_new(vi, cap, target);
        if (!st.chunks[i]) {
            store_free(&st);
            rc = -ENOMEM;
            goto fail;
        }
        st.nchunks++;
    }
    st.nslots = (size_t)count;
    /* sections, chunk by chunk (a chunk's slots are contiguous in each section) */
    for (int sec = 0; sec < 7 && !r.err; sec++) {
        if (sec >= 3 && sec <= 5 && kind < VINDEX_KIND_SQ8)
            continue;
        if (sec == 6 && kind < VINDEX_KIND_ANN)
            continue;
        for (size_t i = 0; i < nch && !r.err; i++) {
            chunk *c = st.chunks[i];
            size_t base = i << vi->ch_shift;
            size_t m = (size_t)count - base < c->cap ? (size_t)count - base : c->cap;
            switch (sec) {
            case 0:
                rget(&r, c->ids, m * sizeof(uint64_t));
                break;
            case 1:
                if (vi->meta_size)
                    rget(&r, c->meta, m * vi->meta_size);
                break;
            case 2:
                rget(&r, c->rows, m * vi->dim * sizeof(float));
                break;
            case 3:
                if (c->sq)
                    rget(&r, c->sq_scale, m * sizeof(float));
                else
                    rskip(&r, m * sizeof(float), scratch, 1 << 16);
                break;
            case 4:
                if (c->sq)
                    rget(&r, c->sq_rn, m * sizeof(float));
                else
                    rskip(&r, m * sizeof(float), scratch, 1 << 16);
                break;
            case 5:
                if (c->sq)
                    rget(&r, c->sq, m * vi->sq_stride);
                else
                    rskip(&r, m * vi->sq_stride, scratch, 1 << 16);
                break;
            case 6:
                if (c->bin)
                    rget(&r, c->bin, m * vi->words * sizeof(uint64_t));
                else
                    rskip(&r, m * vi->words * sizeof(uint64_t), scratch, 1 << 16);
                break;
            }
        }
    }
    /* codes the file has and may be used: a version 2 file's sign codes are raw signs */
    int usable = (int)kind;
    if (version < 3 && usable > VINDEX_KIND_SQ8)
        usable = VINDEX_KIND_SQ8;
    vfaiss *fx = NULL;
    uint32_t *fx_slot = NULL;
    uint64_t fx_upto = 0;
    if (!r.err && tail) {
        float *fc = malloc((size_t)dim * sizeof(float));
        unsigned char cl[16];
        if (!fc) {
            r.err = -ENOMEM;
        } else {
            rget(&r, fc, (size_t)dim * sizeof(float));
            rget(&r, cl, 8);
            if (target >= VINDEX_KIND_ANN) {
                st.center = fc;
                vi->center_live = (size_t)rd64(cl);
            } else {
                free(fc);
            }
        }
        rget(&r, cl, 16); /* the FAISS lengths, read ahead above */
        bool want_fx = fxlen && target >= VINDEX_KIND_ANN && ro.engine == VINDEX_ENGINE_FAISS;
        if (!r.err && want_fx) {
            unsigned char *fb = malloc((size_t)fxlen);
            fx_slot = malloc((size_t)fxlab * sizeof(uint32_t) + 1);
            if (!fb || !fx_slot) {
                r.err = -ENOMEM;
            } else {
                rget(&r, fb, (size_t)fxlen);
                for (uint64_t l = 0; l < fxlab && !r.err; l++) {
                    rget(&r, cl, 4);
                    fx_slot[l] = rd32(cl);
                    if (fx_slot[l] != UINT32_MAX && fx_slot[l] >= count)
                        r.err = VINDEX_E_CORRUPT;
                }
            }
            rget(&r, cl, 8);
            fx_upto = rd64(cl);
            if (!r.err && fx_upto > count)
                r.err = VINDEX_E_CORRUPT;
            if (!r.err &&
                vfaiss_deserialize(fb, (size_t)fxlen, ro.faiss_ef_search, &fx, NULL, 0) != 0)
                fx = NULL; /* unusable: the next maintenance builds it again */
            if (fx && vfaiss_count(fx) != fxlab) {
                vfaiss_destroy(fx);
                fx = NULL;
            }
            free(fb);
        } else if (!r.err) {
            rskip(&r, (size_t)fxlen + (size_t)fxlab * 4, scratch, 1 << 16);
            rget(&r, cl, 8);
        }
    }
    if (!r.err && target >= VINDEX_KIND_ANN && usable < VINDEX_KIND_ANN) {
        /* after the checksum the rows are trusted; computing first is harmless either way */
        st.center = center_of(vi, st.chunks, st.nslots, NULL);
        vi->center_live = st.nslots;
        if (!st.center)
            r.err = -ENOMEM;
    }
    if (!r.err && xlen) {
        xbuf = malloc((size_t)xlen);
        if (!xbuf)
            r.err = -ENOMEM;
        else
            rget(&r, xbuf, (size_t)xlen);
    }
    if (!r.err) {
        /* nothing may follow */
        unsigned char trailing;
        ssize_t x = read(fd, &trailing, 1);
        if (x != 0)
            r.err = x > 0 ? VINDEX_E_CORRUPT : -errno;
    }
    if (!r.err && xxh64_digest(&r.h) != want_ck)
        r.err = VINDEX_E_CORRUPT;
    if (r.err) {
        store_free(&st);
        vfaiss_destroy(fx);
        free(fx_slot);
        rc = r.err;
        goto fail;
    }
    /* verified: codes the file lacks, then the map (duplicate or reserved ids: corrupt) */
    idmap *map = idmap_create((size_t)count + (size_t)count / 4 + 16);
    if (!map) {
        store_free(&st);
        vfaiss_destroy(fx);
        free(fx_slot);
        rc = -ENOMEM;
        goto fail;
    }
    rc = 0;
    for (size_t s = 0; s < st.nslots && rc == 0; s++) {
        chunk *c = st.chunks[s >> vi->ch_shift];
        size_t off = s & vi->ch_mask;
        if (target > usable)
            encode_slot(vi, st.center, c, off, usable);
        uint64_t id = c->ids[off];
        if (id == UINT64_MAX || idmap_get(map, id, NULL))
            rc = VINDEX_E_CORRUPT;
        else if (idmap_put(map, id, s))
            rc = -ENOMEM;
    }
    if (rc) {
        idmap_destroy(map);
        store_free(&st);
        vfaiss_destroy(fx);
        free(fx_slot);
        goto fail;
    }
    idmap_destroy(vi->map);
    vi->map = map;
    vi->chunks = st.chunks;
    vi->nchunks = st.nchunks;
    vi->tcap = st.tcap;
    vi->nslots = st.nslots;
    vi->live = st.nslots;
    vi->ntomb = 0;
    vi->kind = target;
    vi->center = st.center; /* NULL below ANN */
    if (fx) {
        vi->fx = fx;
        vi->fx_slot = fx_slot;
        vi->fx_n = (size_t)fxlab;
        vi->fx_upto = (size_t)fx_upto;
        fx_slot = NULL;
    }
    free(fx_slot);
    *seq = rd64(hdr + 40);
    *out = vi;
    if (extra) {
        *extra = xbuf; /* the caller's now */
        *extra_len = (size_t)xlen;
    } else {
        free(xbuf);
    }
    free(scratch);
    close(fd);
    return 0;

fail:
    vindex_destroy(vi);
    free(xbuf);
    free(scratch);
    close(fd);
    return rc;
}

int vindex_load(const char *path, const vindex_opts *opts, vindex **out, uint64_t *seq)
{
    return vindex_load_extra(path, opts, out, seq, NULL, NULL);
}
