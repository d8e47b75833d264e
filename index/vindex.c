/* index/vindex.c: one tenant's vector index (see vindex.h), storage and writes: chunked
 * float rows with int8 and sign-bit codes beside them, adds, upserts, removes and metadata
 * updates, kind changes, rebuilds (compaction) and background maintenance, including the
 * FAISS engine's builds. vindex_int.h describes the storage and the locking; searches are
 * in vindex_search.c, snapshots in vindex_snap.c.
 */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */

#include "vindex.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "idmap.h"
#include "vindex_int.h"
#include "vkernel.h"

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

void vi_unpin(vindex *vi)
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
    memset(bits, 0, vi->words * sizeof(uint64_t)); /* the words past dim (vi_code_words) */
    vk_sign_bits(t, vi->dim, bits);
    if (t != sbuf)
        free(t);
}

/* center_of computes the mean of the live rows of the n slots in chunks (tombstones per
 * chunk) into a new array. Returns it (malloc'd, the caller owns it), or NULL when out of
 * memory. A caller holds what keeps those rows from changing. */
float *vi_center_of(const vindex *vi, chunk *const *chunks, size_t nslots,
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
chunk *vi_chunk_new(const vindex *vi, size_t cap, int kind)
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
void vi_encode_slot(const vindex *vi, const float *center, chunk *c, size_t off, int have_kind)
{
    const float *x = row_in(vi, c, off);
    if (c->sq && have_kind < VINDEX_KIND_SQ8)
        encode_sq8(vi, x, c->sq + off * vi->sq_stride, &c->sq_scale[off], &c->sq_rn[off]);
    if (c->bin && have_kind < VINDEX_KIND_ANN)
        encode_bin(vi, center, x, c->bin + off * vi->words);
}

/* ---- creation ---- */

int vi_resolve_opts(const vindex_opts *in, vindex_opts *o)
{
    if (!in || in->dim == 0 || in->dim > MAX_DIM || in->meta_size > MAX_META ||
        in->compact_percent > 100)
        return -EINVAL;
    if (in->meta_atomic_len && (in->meta_atomic_off % 8 || in->meta_atomic_len % 8 ||
                                in->meta_size % 8 || in->meta_atomic_off > in->meta_size ||
                                in->meta_atomic_len > in->meta_size - in->meta_atomic_off))
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
    if (vi_resolve_opts(opts, &o))
        return NULL;
    vindex *vi = calloc(1, sizeof(*vi));
    if (!vi)
        return NULL;
    vi->o = o;
    vi->dim = o.dim;
    vi->meta_size = o.meta_size;
    vi->sq_stride = (o.dim + 31) / 32 * 32;
    vi->words = vi_code_words(o.dim);
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
    if (pthread_mutex_init(&vi->qs_mu, NULL)) {
        pthread_mutex_destroy(&vi->pub_mu);
        pthread_mutex_destroy(&vi->cal_mu);
        goto fail_maint;
    }
    vi->map = idmap_create(0);
    if (!vi->map)
        goto fail_all;
    return vi;

fail_all:
    idmap_destroy(vi->map);
    pthread_mutex_destroy(&vi->qs_mu);
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
    vi_unpin(vi);
    idmap_destroy(vi->map);
    free(vi->center);
    free(vi->rot);
    free(vi->cal_pos);
    free(vi->cal_spos);
    free(vi->cal_real);
    free(vi->qs_buf);
    fx_destroy(vi, vi->fx);
    free(vi->fx_slot);
    pthread_mutex_destroy(&vi->qs_mu);
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
        b += vi->o.faiss_engine->bytes(vi->fx) + vi->fx_n * sizeof(uint32_t);
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
int vi_kind_for(const vindex *vi, size_t live, int cur)
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
    return compaction_due(vi) || vi_kind_for(vi, vi->live, vi->kind) != vi->kind ||
           center_stale(vi);
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
        added = vi_chunk_new(vi, cap, vi->kind);
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
        grown = vi_chunk_new(vi, c0->cap * 2 > vi->ch_rows ? vi->ch_rows : c0->cap * 2, vi->kind);
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
        center = vi_center_of(vi, vi->chunks, vi->nslots, NULL);
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
            vi_encode_slot(vi, center, &shadow[i], off, have);
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
    int want = vi_kind_for(vi, vi->live, vi->kind);
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
    vi_encode_slot(vi, vi->center, c, off, VINDEX_KIND_FLAT);

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

/* vindex_get_meta copies id's metadata into meta_out, the atomic range a word at a time
 * (vindex_touch_meta may be writing it). Shared lock. */
int vindex_get_meta(vindex *vi, uint64_t id, void *meta_out)
{
    rdlock(vi);
    uint64_t slot;
    int rc = VINDEX_E_NOT_FOUND;
    if (idmap_get(vi->map, id, &slot)) {
        const unsigned char *m = meta_in(vi, chunk_of(vi, slot), off_of(vi, slot));
        unsigned char *out = meta_out;
        size_t a = vi->o.meta_atomic_off, na = vi->o.meta_atomic_len;
        if (na) {
            memcpy(out, m, a);
            for (size_t w = 0; w < na; w += 8) {
                uint64_t v = vindex_meta_word((const uint64_t *)(const void *)(m + a + w));
                memcpy(out + a + w, &v, 8);
            }
            memcpy(out + a + na, m + a + na, vi->meta_size - a - na);
        } else if (vi->meta_size) {
            memcpy(out, m, vi->meta_size);
        }
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

/* vindex_touch_meta applies fn to each present id's metadata under the writer mutex alone:
 * everything that moves slots or writes metadata otherwise holds it, so the map and the
 * chunks stay put, and searches under the shared lock read the atomic range atomically. */
size_t vindex_touch_meta(vindex *vi, const uint64_t *ids, size_t n,
                         void (*fn)(void *meta, void *ctx), void *ctx)
{
    size_t found = 0;
    if (!vi->o.meta_atomic_len)
        return vindex_update_meta(vi, ids, n, fn, ctx);
    pthread_mutex_lock(&vi->wmu);
    for (size_t i = 0; i < n; i++) {
        uint64_t slot;
        if (idmap_get(vi->map, ids[i], &slot)) {
            fn(meta_in(vi, chunk_of(vi, slot), off_of(vi, slot)), ctx);
            found++;
        }
    }
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

void vi_view_free(view *v)
{
    free(v->ch);
    free(v->tomb);
    memset(v, 0, sizeof(*v));
}

/* view_take copies the state. wmu held. Returns 0 or -ENOMEM. */
int vi_view_take(vindex *vi, view *v)
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
        vi_view_free(v);
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

void vi_store_free(store *st)
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
        chunk *g = vi_chunk_new(vi, o->cap * 2 > vi->ch_rows ? vi->ch_rows : o->cap * 2, st->kind);
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
        chunk *c = vi_chunk_new(vi, cap, st->kind);
        if (!c)
            return -ENOMEM;
        st->chunks[st->nchunks++] = c;
    }
    chunk *d = st->chunks[ci];
    copy_slot(vi, d, off, s, so, with_meta);
    vi_encode_slot(vi, st->center, d, off, have_kind);
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
    if (vi_view_take(vi, &v)) {
        if (!inline_wmu)
            pthread_mutex_unlock(&vi->wmu);
        return -ENOMEM;
    }
    vi->pinned = true;
    st.kind = vi_kind_for(vi, v.live, v.kind);
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
        st.center = vi_center_of(vi, tab, v.nslots, v.tomb);
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
                    vi_encode_slot(vi, st.center, st.chunks[i], off, st.kind);
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
    vindex_eix *ofx = vi->fx; /* its labels name the old slots */
    uint32_t *ofx_slot = vi->fx_slot;
    vi->fx = NULL;
    vi->fx_slot = NULL;
    vi->fx_n = vi->fx_upto = 0;
    vi->fx_error[0] = '\0'; /* a failed FAISS build is tried again on the new storage */
    unlock(vi);
    fx_destroy(vi, ofx);
    free(ofx_slot);
    if (st.kind < VINDEX_KIND_ANN)
        free(st.center);
    vi_unpin(vi);
    free_chunks(oldc, oldn);
    free(ocenter); /* snapshots, the only lock-free readers, are excluded by maint_mu */
    idmap_destroy(omap);
    vi->tier_retry_at = 0;
    if (!inline_wmu)
        pthread_mutex_unlock(&vi->wmu);
    free(src);
    vi_view_free(&v);
    return 1;

fail:
    vi_unpin(vi);
    if (!inline_wmu)
        pthread_mutex_unlock(&vi->wmu);
    vi_store_free(&st);
    idmap_destroy(nmap);
    free(src);
    vi_view_free(&v);
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
    int rc = vi_view_take(vi, &v);
    if (rc == 0)
        vi->pinned = true;
    pthread_mutex_unlock(&vi->wmu);
    if (rc)
        return rc;
    enum { BATCH = 1024 };
    const vindex_engine_ops *eng = vi->o.faiss_engine;
    vindex_eix *fx = NULL;
    uint32_t *slots = malloc((v.live + 1) * sizeof(uint32_t));
    float *buf = malloc((size_t)BATCH * vi->dim * sizeof(float));
    char err[160] = "";
    size_t nl = 0;
    if (!slots || !buf) {
        rc = -ENOMEM;
        goto done;
    }
    if (!eng) {
        snprintf(err, sizeof(err), "no FAISS engine: this program does not link one");
        rc = VINDEX_E_FAISS;
        goto done;
    }
    int frc =
        eng->create(vi->dim, vi->o.faiss_factory ? vi->o.faiss_factory : "HNSW32,Flat",
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
            frc = eng->add(fx, in, buf);
            if (frc) {
                snprintf(err, sizeof(err), "add: %s%s", frc < 0 ? strerror(-frc) : eng->name,
                         frc < 0 ? "" : " error");
                rc = frc < 0 ? frc : VINDEX_E_FAISS;
            }
            nl += in;
            in = 0;
        }
    }
done:
    free(buf);
    pthread_mutex_lock(&vi->wmu);
    vindex_eix *ofx = NULL;
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
    vi_unpin(vi);
    pthread_mutex_unlock(&vi->wmu);
    fx_destroy(vi, ofx);
    free(oslot);
    fx_destroy(vi, fx);
    free(slots);
    vi_view_free(&v);
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
