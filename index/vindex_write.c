/* index/vindex_write.c: the vector index's writes (see vindex.h): adds, upserts, removes,
 * metadata updates and the reads by id, and the kind changes an add brings (up to SQ8, up to
 * ANN). A writer prepares its slot under the writer mutex while searches go on, and
 * publishes under a short exclusive lock; vindex_int.h describes the locking.
 */
#include "vindex.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "vindex_int.h"

/* grow_table gives the chunk table room for one more chunk, publishing the new table under
 * a short exclusive lock. wmu held. Returns 0 or -ENOMEM. */
static int grow_table(vindex *vi)
{
    vstore *st = &vi->s;
    size_t ncap = st->tcap ? st->tcap * 2 : 4;
    chunk **t = malloc(ncap * sizeof(*t));
    if (!t)
        return -ENOMEM;
    if (st->nchunks)
        memcpy(t, st->chunks, st->nchunks * sizeof(*t));
    wrlock(vi);
    chunk **old = st->chunks;
    st->chunks = t;
    st->tcap = ncap;
    unlock(vi);
    vi_free_later(vi, old, 0); /* a pinned reader may hold the old table */
    return 0;
}

/* grow_chunk0 doubles chunk 0 (never mapped: mapped chunks are whole), swapping the array
 * pointers in place under the exclusive lock. wmu held. Returns 0 or -ENOMEM. */
static int grow_chunk0(vindex *vi)
{
    chunk *c0 = vi->s.chunks[0];
    size_t cap = c0->cap * 2 > vi->ch_rows ? vi->ch_rows : c0->cap * 2;
    chunk *grown = vi_chunk_new(vi, cap, vi->s.kind);
    if (!grown)
        return -ENOMEM;
    for (size_t i = 0; i < c0->cap; i++)
        vi_copy_slot(vi, grown, i, c0, i, true);
    memcpy(grown->tomb, c0->tomb, (c0->cap + 63) / 64 * sizeof(uint64_t));
    wrlock(vi);
    chunk old = *c0;
    *c0 = *grown;
    unlock(vi);
    /* old's arrays: a pinned reader may still use them */
    void *arrays[] = {old.rows, old.sq,  old.sq_scale, old.sq_e, old.sq_rn,
                      old.bin,  old.ids, old.meta,     old.tomb};
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++)
        vi_free_later(vi, arrays[i], 0);
    free(grown);
    return 0;
}

/* grow_map rehashes the id map into twice its entries, published under the exclusive lock.
 * wmu held. Returns 0 or -ENOMEM. */
static int grow_map(vindex *vi)
{
    vmap nm;
    if (vm_rehash(vi, &vi->s, &vi->s.map, vi->s.map.count * 2 + 16, &nm))
        return -ENOMEM;
    wrlock(vi);
    vmap old = vi->s.map;
    vi->s.map = nm;
    unlock(vi);
    vm_free(&old); /* only searches and writers read the map, and never unlocked */
    return 0;
}

/* ensure_room makes slot nslots writable and the map able to take one more id. wmu held.
 * Returns 0 or -ENOMEM. */
static int ensure_room(vindex *vi)
{
    vstore *st = &vi->s;
    size_t slot = st->nslots;
    if (slot >= MAX_SLOTS)
        return -ENOMEM;
    size_t ci = slot >> vi->ch_shift, off = slot & vi->ch_mask;
    if (ci == st->nchunks) {
        chunk *added = vi_chunk_new(vi, ci == 0 ? CHUNK0_MIN : vi->ch_rows, st->kind);
        if (!added || (st->nchunks == st->tcap && grow_table(vi))) {
            vi_chunk_free(added);
            return -ENOMEM;
        }
        wrlock(vi);
        st->chunks[st->nchunks++] = added;
        unlock(vi);
    } else if (ci == 0 && off == st->chunks[0]->cap && grow_chunk0(vi)) {
        return -ENOMEM;
    }
    if (vm_room(&st->map) == 0 && grow_map(vi))
        return -ENOMEM;
    return 0;
}

/* free_shadow frees the code arrays tier_up allocated into shadow copies of the chunks. */
static void free_shadow(vindex *vi, chunk *shadow, size_t n, int have)
{
    for (size_t i = 0; i < n; i++) {
        if (have < VINDEX_KIND_SQ8 && shadow[i].sq != vi->s.chunks[i]->sq) {
            free(shadow[i].sq);
            free(shadow[i].sq_scale);
            free(shadow[i].sq_e);
            free(shadow[i].sq_rn);
        }
        if (have < VINDEX_KIND_ANN && shadow[i].bin != vi->s.chunks[i]->bin)
            free(shadow[i].bin);
    }
    free(shadow);
}

/* tier_up gives every chunk the codes of kind, encodes the published slots, and switches
 * the kind under a short exclusive lock. wmu held; searches continue meanwhile (they do not
 * read the new arrays until the kind says so). The change to ANN takes a centre, around
 * which the int8 codes are taken anew too (in new arrays: searches read the old ones until
 * the switch). New sign codes are not measured yet: the index scans exactly until the
 * recall monitor measures them. Returns 0 or -ENOMEM. */
static int tier_up(vindex *vi, int kind)
{
    vstore *st = &vi->s;
    int was = st->kind, have = was;
    size_t n = st->nchunks;
    /* new arrays go into shadow structs, attached under the lock, so that a failure leaves
     * the published chunks as they were */
    chunk *shadow = calloc(n ? n : 1, sizeof(*shadow));
    float *center = NULL;
    double *rcenter = st->rcenter, cnorm = st->cnorm;
    if (!shadow)
        return -ENOMEM;
    if (kind >= VINDEX_KIND_ANN && was < VINDEX_KIND_ANN) {
        /* writers are excluded (wmu): the published rows are the ones to centre */
        center = vi_center_of(vi, st->chunks, st->nslots, NULL);
        rcenter = center ? vi_rotate_center(vi, center, &cnorm) : NULL;
        if (!rcenter) {
            free(center);
            free(shadow);
            return -ENOMEM;
        }
        have = VINDEX_KIND_FLAT; /* the int8 codes were taken around the origin */
    }
    for (size_t i = 0; i < n; i++) {
        shadow[i] = *st->chunks[i];
        if (have < VINDEX_KIND_SQ8)
            shadow[i].sq = NULL, shadow[i].sq_scale = NULL, shadow[i].sq_e = NULL,
            shadow[i].sq_rn = NULL;
        if (have < VINDEX_KIND_ANN)
            shadow[i].bin = NULL;
        if (vi_chunk_alloc_codes(vi, &shadow[i], kind)) {
            free_shadow(vi, shadow, n, have);
            free(center);
            if (center)
                free(rcenter);
            return -ENOMEM;
        }
        size_t base = i << vi->ch_shift;
        size_t used = base < st->nslots ? st->nslots - base : 0;
        for (size_t off = 0; off < used && off < shadow[i].cap; off++)
            vi_encode_slot(vi, rcenter, cnorm, &shadow[i], off, have);
    }
    chunk *old = was >= VINDEX_KIND_SQ8 && have < VINDEX_KIND_SQ8 ? malloc(n * sizeof(*old)) : NULL;
    if (was >= VINDEX_KIND_SQ8 && have < VINDEX_KIND_SQ8 && !old && n) {
        free_shadow(vi, shadow, n, have);
        free(center);
        free(rcenter);
        return -ENOMEM;
    }
    wrlock(vi);
    for (size_t i = 0; i < n; i++) {
        if (old)
            old[i] = *st->chunks[i];
        *st->chunks[i] = shadow[i];
    }
    st->kind = kind;
    if (center) {
        st->center = center; /* there was none below ANN */
        st->rcenter = rcenter;
        st->cnorm = cnorm;
        st->center_live = st->live;
        vi->code_gen++;
    }
    unlock(vi);
    /* the int8 arrays taken around the origin: a pinned reader may still use them */
    for (size_t i = 0; old && i < n; i++) {
        vi_free_later(vi, old[i].sq, 0);
        vi_free_later(vi, old[i].sq_scale, 0);
        vi_free_later(vi, old[i].sq_e, 0);
        vi_free_later(vi, old[i].sq_rn, 0);
    }
    free(old);
    free(shadow);
    return 0;
}

/* maybe_tier_up switches up when the live count calls for it. wmu held. A failure (memory)
 * is retried after the index grew by an eighth; maintenance also retries. */
static void maybe_tier_up(vindex *vi)
{
    int want = vi_kind_for(vi, vi->s.live, vi->s.kind);
    if (want <= vi->s.kind || vi->s.live < vi->tier_retry_at)
        return;
    if (tier_up(vi, want) != 0)
        vi->tier_retry_at = vi->s.live + vi->s.live / 8 + 1;
}

static void set_tomb(vindex *vi, size_t slot)
{
    chunk *c = st_chunk(vi, &vi->s, slot);
    size_t off = off_of(vi, slot);
    c->tomb[off / 64] |= (uint64_t)1 << (off % 64);
    vi->s.live--;
    vi->s.ntomb++;
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
    vstore *st = &vi->s;
    int64_t old = vm_find(vi, st, id);
    int rc = old >= 0 && !replace ? VINDEX_E_EXISTS : ensure_room(vi);
    if (rc)
        goto out;
    size_t slot = st->nslots;
    chunk *c = st_chunk(vi, st, slot);
    size_t off = off_of(vi, slot);
    float *row = c->rows + off * vi->dim; /* the heap, or a mapping's copy-on-write chunk */
    for (size_t i = 0; i < vi->dim; i++)
        row[i] = (float)(vec[i] * inv);
    c->ids[off] = id;
    if (vi->meta_size)
        memcpy(c->meta + off * vi->meta_size, meta, vi->meta_size);
    vi_encode_slot(vi, st->rcenter, st->cnorm, c, off, VINDEX_KIND_FLAT);

    wrlock(vi);
    if (old >= 0)
        set_tomb(vi, (size_t)old);
    vm_put(vi, st, id, (uint32_t)slot); /* room ensured: cannot fail */
    st->nslots++;
    st->live++;
    unlock(vi);
    rc = old >= 0 ? 1 : 0;
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

/* vindex_remove tombstones id; small indexes compact here when due (not measured: the
 * monitor measures the new codes, and such an index scans exactly until then). */
int vindex_remove(vindex *vi, uint64_t id)
{
    pthread_mutex_lock(&vi->wmu);
    int64_t slot = vm_find(vi, &vi->s, id);
    int rc = VINDEX_E_NOT_FOUND;
    if (slot >= 0) {
        wrlock(vi);
        vm_del(vi, &vi->s, id);
        set_tomb(vi, (size_t)slot);
        unlock(vi);
        rc = 0;
        if (vi_compaction_due(vi) && vi->s.nslots <= vi->o.inline_compact_max &&
            pthread_mutex_trylock(&vi->maint_mu) == 0) {
            vi_rebuild(vi, true, 0.0, NULL); /* on -ENOMEM the tombstones simply stay */
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
    bool found = vm_find(vi, &vi->s, id) >= 0;
    unlock(vi);
    return found;
}

/* vindex_get_meta copies id's metadata into meta_out, the atomic range a word at a time
 * (vindex_touch_meta may be writing it). Shared lock. */
int vindex_get_meta(vindex *vi, uint64_t id, void *meta_out)
{
    rdlock(vi);
    int64_t slot = vm_find(vi, &vi->s, id);
    int rc = VINDEX_E_NOT_FOUND;
    if (slot >= 0) {
        const unsigned char *m = meta_in(vi, st_chunk(vi, &vi->s, slot), off_of(vi, slot));
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
    int64_t slot = vm_find(vi, &vi->s, id);
    int rc = VINDEX_E_NOT_FOUND;
    if (slot >= 0) {
        if (vi->meta_size)
            memcpy(meta_in(vi, st_chunk(vi, &vi->s, slot), off_of(vi, slot)), meta, vi->meta_size);
        rc = 0;
    }
    unlock(vi);
    pthread_mutex_unlock(&vi->wmu);
    return rc;
}

/* apply_meta calls fn on the metadata of each present id of ids; returns how many. */
static size_t apply_meta(vindex *vi, const uint64_t *ids, size_t n,
                         void (*fn)(uint64_t id, void *meta, void *ctx), void *ctx)
{
    size_t found = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t slot = vm_find(vi, &vi->s, ids[i]);
        if (slot >= 0) {
            fn(ids[i], meta_in(vi, st_chunk(vi, &vi->s, slot), off_of(vi, slot)), ctx);
            found++;
        }
    }
    return found;
}

/* vindex_update_meta applies fn to each present id's metadata under one exclusive lock. */
size_t vindex_update_meta(vindex *vi, const uint64_t *ids, size_t n,
                          void (*fn)(uint64_t id, void *meta, void *ctx), void *ctx)
{
    pthread_mutex_lock(&vi->wmu);
    wrlock(vi);
    size_t found = apply_meta(vi, ids, n, fn, ctx);
    unlock(vi);
    pthread_mutex_unlock(&vi->wmu);
    return found;
}

/* vindex_touch_meta applies fn to each present id's metadata under the writer mutex alone:
 * everything that moves slots or writes metadata otherwise holds it, so the map and the
 * chunks stay put, and searches under the shared lock read the atomic range atomically. */
size_t vindex_touch_meta(vindex *vi, const uint64_t *ids, size_t n,
                         void (*fn)(uint64_t id, void *meta, void *ctx), void *ctx)
{
    if (!vi->o.meta_atomic_len)
        return vindex_update_meta(vi, ids, n, fn, ctx);
    pthread_mutex_lock(&vi->wmu);
    size_t found = apply_meta(vi, ids, n, fn, ctx);
    pthread_mutex_unlock(&vi->wmu);
    return found;
}

/* vindex_get_vector copies id's stored normalized vector into out. Shared lock. */
int vindex_get_vector(vindex *vi, uint64_t id, float *out)
{
    rdlock(vi);
    int64_t slot = vm_find(vi, &vi->s, id);
    int rc = VINDEX_E_NOT_FOUND;
    if (slot >= 0) {
        memcpy(out, row_in(vi, st_chunk(vi, &vi->s, slot), off_of(vi, slot)),
               vi->dim * sizeof(float));
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
    const vstore *st = &vi->s;
    for (size_t s = 0; s < st->nslots && rc == 0; s++) {
        const chunk *c = st_chunk(vi, st, s);
        size_t off = off_of(vi, s);
        if (!tomb_at(c, off))
            rc = fn(c->ids[off], row_in(vi, c, off), meta_in(vi, c, off), ctx);
    }
    unlock(vi);
    return rc;
}
