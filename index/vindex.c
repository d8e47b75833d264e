/* index/vindex.c: one tenant's vector index (see vindex.h): vectors in FAISS, ids, metadata
 * and tombstones in slot arrays beside it, exact filtered search.
 *
 * Layout. Vector number i of the FAISS index (its "slot") belongs to ids[i], its metadata is
 * meta[i * meta_size], and bit i of tomb says whether it was removed. An idmap takes a live
 * id to its slot. Vectors are stored L2-normalized, so inner product is cosine similarity.
 *
 * Kinds. The FAISS index is an IndexFlatIP for now (kind FLAT): it is the vector storage,
 * so FAISS serialization can write snapshots of it, and search scans it exactly. The search
 * is dispatched on vi->kind so that a large index can later become an HNSW graph (FAISS
 * "HNSW32,Flat") whose candidates are re-ranked exactly, stopping once
 * score_slope * similarity + score_bound cannot beat the k-th best score. The flat scan
 * already uses that bound to skip candidates without calling keep or score.
 *
 * Flat search. Similarities come from cblas_sgemv over the FAISS storage
 * (faiss_IndexFlat_xb, row-major slots x dim) in blocks of BLOCK rows into a stack buffer;
 * one pass per block skips tombstones and candidates that cannot make the top k, applies
 * keep, recomputes the similarity of the survivors exactly (see exact_sim: BLAS kernels
 * round differently depending on a row's position, so two copies of one vector could
 * otherwise get different similarities, and a vector's similarity could change when
 * compaction moves it), applies score, and keeps the best k in a bounded heap built in
 * the caller's output array. Up to 1024 dimensions a search allocates nothing.
 *
 * Removal and compaction. Removing sets the tombstone bit and drops the id from the map.
 * When tombstones reach a quarter of the slots (and at least COMPACT_MIN), the index is
 * compacted in place under the exclusive lock: live rows move down inside the FAISS
 * storage, the slot arrays follow, the map is updated (replacing values never allocates),
 * and the freed tail is cut from FAISS with remove_ids over a slot range. Nothing is
 * allocated besides the small range selector, so compaction cannot run out of memory
 * halfway; the FAISS storage keeps its capacity for later adds (std::vector semantics).
 *
 * Locking. One rwlock: searches and reads shared, writers exclusive. On glibc the lock
 * prefers writers, otherwise a steady stream of overlapping searches could starve adds and
 * removes indefinitely (glibc's default kind prefers readers).
 */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np; see the locking note above */

#include "vindex.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <faiss/c_api/IndexFlat_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/impl/AuxIndexStructures_c.h>

#include "idmap.h"

#define MAX_DIM 65536
#define MAX_META (1u << 20)
#define BLOCK 1024     /* rows per sgemv call: 4 KiB of similarities on the stack */
#define QBUF 1024      /* query dims normalized on the stack; larger ones are allocated */
#define COMPACT_MIN 64 /* never compact for fewer tombstones than this */
#define MIN_SLOT_CAP 16

enum vindex_kind {
    KIND_FLAT, /* IndexFlatIP, exact scan */
};

struct vindex {
    pthread_rwlock_t lock;
    size_t dim;
    size_t meta_size;
    enum vindex_kind kind;

    FaissIndex *fx;     /* owned; nslots vectors */
    size_t fx_cap_rows; /* estimated capacity of the FAISS storage, for vindex_bytes */

    size_t nslots;       /* slots in use, live or tombstoned (= FAISS ntotal) */
    size_t cap;          /* slots the arrays below hold */
    size_t live;         /* live vectors */
    size_t ntomb;        /* tombstoned slots */
    size_t ncompactions; /* compactions done, for vindex_stats */
    uint64_t *ids;       /* owned; cap entries */
    unsigned char *meta; /* owned; cap * meta_size bytes, NULL when meta_size is 0 */
    uint64_t *tomb;      /* owned; bitmap of cap bits */
    idmap *map;          /* owned; live id -> slot */
    float *tmp;          /* owned; dim floats of scratch for writers (exclusive lock) */
};

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

static bool is_tomb(const vindex *vi, size_t slot)
{
    return (vi->tomb[slot / 64] >> (slot % 64)) & 1;
}

static void *meta_at(const vindex *vi, size_t slot)
{
    return vi->meta_size ? vi->meta + slot * vi->meta_size : NULL;
}

/* rows returns the FAISS storage: nslots rows of dim floats. Valid until the next writer. */
static float *rows(const vindex *vi)
{
    float *xb = NULL;
    faiss_IndexFlat_xb(vi->fx, &xb, NULL);
    return xb;
}

/* faiss_rc maps a failed FAISS call to -ENOMEM (std::bad_alloc) or VINDEX_E_FAISS. */
static int faiss_rc(void)
{
    const char *msg = faiss_get_last_error();
    return msg && strstr(msg, "bad_alloc") ? -ENOMEM : VINDEX_E_FAISS;
}

/* inv_norm returns 1 / |v| computed in double, or 0 when v has no direction (zero length,
 * or a NaN or infinite component). */
static double inv_norm(const float *v, size_t dim)
{
    double sq = 0.0;
    for (size_t i = 0; i < dim; i++)
        sq += (double)v[i] * v[i];
    if (!(sq > 0.0) || !isfinite(sq))
        return 0.0;
    return 1.0 / sqrt(sq);
}

/* vindex_create returns an empty index, or NULL when out of memory, when FAISS fails, or
 * when opts are invalid (dim 0 or above 65536, meta_size above 1 MiB). */
vindex *vindex_create(const vindex_opts *opts)
{
    if (!opts || opts->dim == 0 || opts->dim > MAX_DIM || opts->meta_size > MAX_META)
        return NULL;
    vindex *vi = calloc(1, sizeof(*vi));
    if (!vi)
        return NULL;
    vi->dim = opts->dim;
    vi->meta_size = opts->meta_size;
    vi->kind = KIND_FLAT;

    pthread_rwlockattr_t attr;
    if (pthread_rwlockattr_init(&attr))
        goto fail_vi;
#ifdef __GLIBC__
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    int rc = pthread_rwlock_init(&vi->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (rc)
        goto fail_vi;

    vi->tmp = malloc(vi->dim * sizeof(float));
    if (!vi->tmp)
        goto fail_lock;
    vi->map = idmap_create(0);
    if (!vi->map)
        goto fail_tmp;
    if (faiss_IndexFlatIP_new_with(&vi->fx, (idx_t)vi->dim))
        goto fail_map;
    return vi;

fail_map:
    idmap_destroy(vi->map);
fail_tmp:
    free(vi->tmp);
fail_lock:
    pthread_rwlock_destroy(&vi->lock);
fail_vi:
    free(vi);
    return NULL;
}

/* vindex_destroy frees the index and everything it holds; NULL is a no-op. No other thread
 * may use the index any more. */
void vindex_destroy(vindex *vi)
{
    if (!vi)
        return;
    faiss_Index_free(vi->fx);
    idmap_destroy(vi->map);
    free(vi->tmp);
    free(vi->tomb);
    free(vi->meta);
    free(vi->ids);
    pthread_rwlock_destroy(&vi->lock);
    free(vi);
}

/* vindex_dim returns the dimension (fixed at creation, no lock needed). */
size_t vindex_dim(const vindex *vi)
{
    return vi->dim;
}

/* vindex_count returns the number of live vectors. */
size_t vindex_count(vindex *vi)
{
    rdlock(vi);
    size_t n = vi->live;
    unlock(vi);
    return n;
}

static size_t bytes_locked(const vindex *vi)
{
    return sizeof(*vi) + vi->dim * sizeof(float) + vi->fx_cap_rows * vi->dim * sizeof(float) +
           vi->cap * (sizeof(uint64_t) + vi->meta_size) + (vi->cap + 63) / 64 * sizeof(uint64_t) +
           idmap_bytes(vi->map);
}

/* vindex_bytes returns the memory held: slot arrays and map exactly, the FAISS storage as
 * its estimated capacity (libstdc++ vector growth), not counting allocator overhead. */
size_t vindex_bytes(vindex *vi)
{
    rdlock(vi);
    size_t b = bytes_locked(vi);
    unlock(vi);
    return b;
}

/* vindex_get_stats fills *st under the shared lock. */
void vindex_get_stats(vindex *vi, vindex_stats *st)
{
    rdlock(vi);
    st->count = vi->live;
    st->slots = vi->nslots;
    st->tombstones = vi->ntomb;
    st->compactions = vi->ncompactions;
    st->bytes = bytes_locked(vi);
    unlock(vi);
}

/* vindex_last_error returns the text of the last FAISS error raised on the calling thread
 * (valid until the next FAISS call on it), or NULL. */
const char *vindex_last_error(void)
{
    return faiss_get_last_error();
}

/* reserve makes room for one more slot. Returns 0 or -ENOMEM; the arrays that did grow
 * stay grown, which is harmless because cap only changes once all of them did. */
static int reserve(vindex *vi)
{
    if (vi->nslots < vi->cap)
        return 0;
    size_t ncap = vi->cap ? vi->cap * 2 : MIN_SLOT_CAP;
    if (ncap > SIZE_MAX / sizeof(uint64_t) || (vi->meta_size && ncap > SIZE_MAX / vi->meta_size))
        return -ENOMEM;
    uint64_t *ids = realloc(vi->ids, ncap * sizeof(*ids));
    if (!ids)
        return -ENOMEM;
    vi->ids = ids;
    if (vi->meta_size) {
        unsigned char *meta = realloc(vi->meta, ncap * vi->meta_size);
        if (!meta)
            return -ENOMEM;
        vi->meta = meta;
    }
    size_t owords = (vi->cap + 63) / 64, nwords = (ncap + 63) / 64;
    uint64_t *tomb = realloc(vi->tomb, nwords * sizeof(*tomb));
    if (!tomb)
        return -ENOMEM;
    memset(tomb + owords, 0, (nwords - owords) * sizeof(*tomb));
    vi->tomb = tomb;
    vi->cap = ncap;
    return 0;
}

/* vindex_add adds a normalized copy of vec under id with a copy of meta. Returns 0,
 * VINDEX_E_EXISTS, VINDEX_E_ZERO (zero length or a NaN/infinite component), -EINVAL for the
 * reserved id UINT64_MAX, -ENOMEM, or VINDEX_E_FAISS; on any error the index is unchanged.
 * Takes the exclusive lock. */
int vindex_add(vindex *vi, uint64_t id, const float *vec, const void *meta)
{
    if (id == UINT64_MAX)
        return -EINVAL;
    double inv = inv_norm(vec, vi->dim);
    if (inv == 0.0)
        return VINDEX_E_ZERO;

    wrlock(vi);
    int rc;
    if (idmap_get(vi->map, id, NULL)) {
        rc = VINDEX_E_EXISTS;
        goto out;
    }
    rc = reserve(vi);
    if (rc)
        goto out;
    size_t slot = vi->nslots;
    rc = idmap_put(vi->map, id, slot);
    if (rc)
        goto out;
    for (size_t i = 0; i < vi->dim; i++)
        vi->tmp[i] = (float)(vec[i] * inv);
    if (faiss_Index_add(vi->fx, 1, vi->tmp)) {
        rc = faiss_rc();
        idmap_del(vi->map, id);
        goto out;
    }
    if (vi->nslots + 1 > vi->fx_cap_rows) { /* libstdc++: max(2 * size, new size) */
        size_t twice = 2 * vi->nslots;
        vi->fx_cap_rows = twice > vi->nslots + 1 ? twice : vi->nslots + 1;
    }
    vi->ids[slot] = id;
    if (vi->meta_size)
        memcpy(meta_at(vi, slot), meta, vi->meta_size);
    vi->tomb[slot / 64] &= ~((uint64_t)1 << (slot % 64));
    vi->nslots++;
    vi->live++;
    rc = 0;
out:
    unlock(vi);
    return rc;
}

/* compact drops the tombstoned slots in place; see the file comment. Exclusive lock held.
 * When FAISS refuses to cut the tail, the cut rows stay behind as tombstones, so the index
 * stays consistent either way. */
static void compact(vindex *vi)
{
    FaissIDSelectorRange *sel = NULL;
    if (faiss_IDSelectorRange_new(&sel, (idx_t)vi->live, (idx_t)vi->nslots))
        return; /* nothing moved yet: try again at the next removal */
    float *xb = rows(vi);
    size_t dim = vi->dim, j = 0;
    for (size_t i = 0; i < vi->nslots; i++) {
        if (is_tomb(vi, i))
            continue;
        if (i != j) {
            memcpy(xb + j * dim, xb + i * dim, dim * sizeof(float));
            vi->ids[j] = vi->ids[i];
            if (vi->meta_size)
                memcpy(meta_at(vi, j), meta_at(vi, i), vi->meta_size);
            idmap_put(vi->map, vi->ids[j], j); /* present key: cannot fail */
        }
        j++;
    }
    memset(vi->tomb, 0, (vi->nslots + 63) / 64 * sizeof(uint64_t));
    size_t removed = 0;
    if (faiss_Index_remove_ids(vi->fx, (const FaissIDSelector *)sel, &removed) == 0 &&
        removed == vi->nslots - j) {
        vi->nslots = j;
        vi->ntomb = 0;
        vi->ncompactions++;
    } else {
        for (size_t i = j; i < vi->nslots; i++)
            vi->tomb[i / 64] |= (uint64_t)1 << (i % 64);
        vi->ntomb = vi->nslots - j;
    }
    faiss_IDSelectorRange_free(sel);
}

/* vindex_remove tombstones id, compacting when tombstones pass a quarter of the slots.
 * Returns 0 or VINDEX_E_NOT_FOUND. Takes the exclusive lock. */
int vindex_remove(vindex *vi, uint64_t id)
{
    wrlock(vi);
    uint64_t slot;
    int rc = VINDEX_E_NOT_FOUND;
    if (idmap_get(vi->map, id, &slot)) {
        idmap_del(vi->map, id);
        vi->tomb[slot / 64] |= (uint64_t)1 << (slot % 64);
        vi->live--;
        vi->ntomb++;
        if (vi->ntomb >= COMPACT_MIN && vi->ntomb * 4 >= vi->nslots)
            compact(vi);
        rc = 0;
    }
    unlock(vi);
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

/* vindex_get_meta copies id's metadata into meta_out. Returns 0 or VINDEX_E_NOT_FOUND. */
int vindex_get_meta(vindex *vi, uint64_t id, void *meta_out)
{
    rdlock(vi);
    uint64_t slot;
    int rc = VINDEX_E_NOT_FOUND;
    if (idmap_get(vi->map, id, &slot)) {
        if (vi->meta_size)
            memcpy(meta_out, meta_at(vi, slot), vi->meta_size);
        rc = 0;
    }
    unlock(vi);
    return rc;
}

/* vindex_set_meta replaces id's metadata. Returns 0 or VINDEX_E_NOT_FOUND. */
int vindex_set_meta(vindex *vi, uint64_t id, const void *meta)
{
    wrlock(vi);
    uint64_t slot;
    int rc = VINDEX_E_NOT_FOUND;
    if (idmap_get(vi->map, id, &slot)) {
        if (vi->meta_size)
            memcpy(meta_at(vi, slot), meta, vi->meta_size);
        rc = 0;
    }
    unlock(vi);
    return rc;
}

/* vindex_update_meta applies fn to the metadata of each present id under one exclusive
 * lock; returns how many ids were present. */
size_t vindex_update_meta(vindex *vi, const uint64_t *ids, size_t n,
                          void (*fn)(void *meta, void *ctx), void *ctx)
{
    size_t found = 0;
    wrlock(vi);
    for (size_t i = 0; i < n; i++) {
        uint64_t slot;
        if (idmap_get(vi->map, ids[i], &slot)) {
            fn(meta_at(vi, slot), ctx);
            found++;
        }
    }
    unlock(vi);
    return found;
}

/* vindex_get_vector copies id's stored normalized vector into out. Returns 0 or
 * VINDEX_E_NOT_FOUND. */
int vindex_get_vector(vindex *vi, uint64_t id, float *out)
{
    rdlock(vi);
    uint64_t slot;
    int rc = VINDEX_E_NOT_FOUND;
    if (idmap_get(vi->map, id, &slot)) {
        memcpy(out, rows(vi) + slot * vi->dim, vi->dim * sizeof(float));
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
    const float *xb = rows(vi);
    for (size_t i = 0; i < vi->nslots && rc == 0; i++) {
        if (!is_tomb(vi, i))
            rc = fn(vi->ids[i], xb + i * vi->dim, meta_at(vi, i), ctx);
    }
    unlock(vi);
    return rc;
}

/* ---- bounded top-k heap in the caller's output array ---- */

typedef struct topk {
    vindex_hit *h; /* not owned: the caller's output, k entries */
    size_t n, k;
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

/* exact_sim returns the similarity of row x to the query: the products of the floats are
 * exact in double and summed in a fixed order (four interleaved partial sums), so the
 * result depends only on the two vectors, not on the CPU, the BLAS kernel or where the row
 * sits in the storage; an FMA contraction would not change it either, since the products
 * are exact. */
static float exact_sim(const float *x, const float *qv, size_t dim)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= dim; i += 4) {
        s0 += (double)x[i] * qv[i];
        s1 += (double)x[i + 1] * qv[i + 1];
        s2 += (double)x[i + 2] * qv[i + 2];
        s3 += (double)x[i + 3] * qv[i + 3];
    }
    for (; i < dim; i++)
        s0 += (double)x[i] * qv[i];
    double sim = (s0 + s1) + (s2 + s3);
    return sim > 1.0 ? 1.0f : sim < -1.0 ? -1.0f : (float)sim;
}

typedef struct scan {
    const vindex *vi;
    const vindex_query *q;
    const float *qn; /* q->vec normalized */
    double slack;    /* bound on |BLAS similarity - exact similarity| */
    bool bounded;    /* the query declares a score bound (slope or bound non-zero) */
    topk *t;
} scan;

/* consider ranks the candidate in slot, whose similarity BLAS estimated as approx
 * (tombstones already skipped). The estimate only decides whether the candidate can still
 * make the top k; its similarity is then recomputed exactly (exact_sim), so that equal
 * vectors get equal similarities and ties fall to the id as documented. */
static void consider(const scan *sc, size_t slot, float approx)
{
    const vindex_query *q = sc->q;
    topk *t = sc->t;
    if (t->n == t->k) {
        /* Upper bound of the score this candidate can reach; when it cannot beat the worst
         * hit kept, skip it without calling keep or score. The slack covers the BLAS
         * rounding, and a relative 1e-9 the rounding in the caller's score function, which
         * may land an ulp above the exact bound. */
        double worst = t->h[0].score, sim_ub = (double)approx + sc->slack;
        double ub = sim_ub;
        if (q->score)
            ub = sc->bounded ? q->score_slope * sim_ub + q->score_bound : INFINITY;
        if (ub < worst - 1e-9 * (1.0 + fabs(worst)))
            return;
    }
    const vindex *vi = sc->vi;
    const void *meta = meta_at(vi, slot);
    if (q->keep && !q->keep(meta, q->ctx))
        return;
    float sim = exact_sim(rows(vi) + slot * vi->dim, sc->qn, vi->dim);
    vindex_hit hit = {.id = vi->ids[slot], .similarity = sim, .score = sim};
    if (q->score) {
        hit.score = q->score(sim, meta, q->ctx);
        if (isnan(hit.score))
            hit.score = -INFINITY; /* keep the heap's order total */
    }
    offer(t, &hit);
}

/* search_flat scans every slot exactly; qn is the normalized query. Shared lock held. */
static int search_flat(const vindex *vi, const vindex_query *q, const float *qn, topk *t)
{
    /* Float summation of dim products of unit vectors errs by at most about dim * 2^-24
     * (recursive summation; OpenBLAS's blocked sums do better); twice that plus the
     * rounding of the result is a safe margin, and costs only a few extra exact
     * recomputations near the k-th score. */
    scan sc = {
        vi, q, qn, (double)(vi->dim + 4) * 0x1p-23, q->score_slope != 0.0 || q->score_bound != 0.0,
        t};
    float sims[BLOCK];
    const float *xb = rows(vi);
    size_t dim = vi->dim;
    for (size_t b = 0; b < vi->nslots; b += BLOCK) {
        size_t m = vi->nslots - b < BLOCK ? vi->nslots - b : BLOCK;
        /* Skip the product for a block of tombstones only (BLOCK is a multiple of 64 and
         * bits past nslots are clear, so a partial last word never reads as all set). */
        size_t w = b / 64, w1 = (b + m + 63) / 64;
        while (w < w1 && vi->tomb[w] == UINT64_MAX)
            w++;
        if (w == w1)
            continue;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)m, (blasint)dim, 1.0f, xb + b * dim,
                    (blasint)dim, qn, 1, 0.0f, sims, 1);
        for (size_t r = 0; r < m; r++) {
            if (!is_tomb(vi, b + r))
                consider(&sc, b + r, sims[r]);
        }
    }
    return 0;
}

/* vindex_search writes the best q->k hits into out, best first; see vindex.h. Returns 0,
 * VINDEX_E_ZERO for a query vector without direction (zero, NaN or infinite), or -ENOMEM
 * when dim > QBUF and the normalized query cannot be allocated. The query is normalized
 * first so that BLAS works on unit vectors whatever the caller's scale (tiny components
 * would underflow in float products). Shared lock; keep and score run under it. */
int vindex_search(vindex *vi, const vindex_query *q, vindex_hit *out, size_t *n)
{
    *n = 0;
    size_t dim = vi->dim;
    double inv = inv_norm(q->vec, dim);
    if (inv == 0.0)
        return VINDEX_E_ZERO;
    if (q->k == 0)
        return 0;
    float qbuf[QBUF], *qn = qbuf;
    if (dim > QBUF) {
        qn = malloc(dim * sizeof(float));
        if (!qn)
            return -ENOMEM;
    }
    for (size_t i = 0; i < dim; i++)
        qn[i] = (float)(q->vec[i] * inv);

    topk t = {.h = out, .n = 0, .k = q->k};
    int rc;
    rdlock(vi);
    switch (vi->kind) {
    case KIND_FLAT:
    default:
        rc = search_flat(vi, q, qn, &t);
        break;
    }
    unlock(vi);
    if (qn != qbuf)
        free(qn);
    if (rc)
        return rc;
    sort_best_first(&t);
    *n = t.n;
    return 0;
}
