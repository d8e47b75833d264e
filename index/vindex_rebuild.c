/* index/vindex_rebuild.c: the vector index's rebuilds (compaction, kind changes down, a new
 * centre for the sign codes), background maintenance, and vindex_settle (see vindex.h).
 *
 * A rebuild copies the live slots of a frozen view into new storage without holding any
 * lock, measures the recall of its new codes there (vindex_cal.c: the calibration's probes
 * run on the new storage, which nobody else can see yet), then briefly blocks writers to
 * carry over what they changed meanwhile and swaps the storage and its measurement in under
 * the exclusive lock. So new codes never answer a search before they are measured.
 */
#include "vindex.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "vindex_int.h"

bool vi_compaction_due(const vindex *vi)
{
    const vstore *st = &vi->s;
    return st->ntomb >= COMPACT_MIN && st->ntomb * 100 >= st->nslots * vi->o.compact_percent;
}

/* center_stale: the index doubled since its centre was computed; a rebuild recomputes it
 * (the codes stay correct meanwhile, only less informative as the data drifts). */
static bool center_stale(const vindex *vi)
{
    const vstore *st = &vi->s;
    return st->kind == VINDEX_KIND_ANN && st->live >= 2 * st->center_live + 1024;
}

bool vi_rebuild_due(const vindex *vi)
{
    return vi_compaction_due(vi) || vi_kind_for(vi, vi->s.live, vi->s.kind) != vi->s.kind ||
           center_stale(vi);
}

/* A rebuild in progress. */
typedef struct rebuild {
    view v;
    vstore st;     /* the new storage */
    uint32_t *src; /* new slot -> old slot */
    vcal cal;      /* the new codes' measurement */
} rebuild;

static void rebuild_free(const vindex *vi, rebuild *rb)
{
    vi_store_free(vi, &rb->st);
    free(rb->src);
    vi_cal_free(&rb->cal);
    vi_view_free(&rb->v);
}

/* copy_live (no lock; the index is pinned) copies the live slots of the view into the new
 * storage with its id map; an ANN storage gets a new centre from the view's live rows and
 * every code is taken anew around it (and around the origin when an ANN index goes down).
 * Returns 0 or -ENOMEM. */
static int copy_live(const vindex *vi, rebuild *rb)
{
    view *v = &rb->v;
    vstore *st = &rb->st;
    rb->src = malloc((v->nslots + 1) * sizeof(uint32_t));
    if (!rb->src || vm_init(&st->map, v->live))
        return -ENOMEM;
    int have = v->kind;
    if (st->kind >= VINDEX_KIND_ANN) {
        chunk **tab = malloc((v->nchunks ? v->nchunks : 1) * sizeof(chunk *));
        if (!tab)
            return -ENOMEM;
        for (size_t i = 0; i < v->nchunks; i++)
            tab[i] = &v->ch[i];
        st->center = vi_center_of(vi, tab, v->nslots, v->tomb);
        st->center_live = v->live;
        free(tab);
        if (!st->center || !(st->rcenter = vi_rotate_center(vi, st->center, &st->cnorm)))
            return -ENOMEM;
    }
    /* codes taken around another centre (a new one, or the origin after one) are taken anew */
    if (st->kind >= VINDEX_KIND_ANN || v->kind >= VINDEX_KIND_ANN)
        have = VINDEX_KIND_FLAT;
    for (size_t s = 0; s < v->nslots; s++) {
        if (view_tomb(v, s))
            continue;
        rb->src[st->nslots] = (uint32_t)s;
        /* metadata may be changing under writers: copied in carry_over */
        if (vi_store_append(vi, st, &v->ch[s >> vi->ch_shift], s & vi->ch_mask, have, false))
            return -ENOMEM;
        vm_put(vi, st, st_id(vi, st, st->nslots - 1), (uint32_t)(st->nslots - 1));
    }
    st->live = st->nslots;
    return 0;
}

/* carry_kind_up gives the new storage the codes of the kind the index went up to while the
 * copy ran (a rebuild that goes down a kind stays down), around the centre the index took.
 * wmu held. Returns 0 or -ENOMEM. */
static int carry_kind_up(const vindex *vi, rebuild *rb)
{
    vstore *st = &rb->st;
    if (!(vi->s.kind > rb->v.kind && st->kind < vi->s.kind))
        return 0;
    if (vi->s.kind >= VINDEX_KIND_ANN) {
        st->center = malloc(vi->dim * sizeof(float));
        st->rcenter = malloc(vi->dim * sizeof(double));
        if (!st->center || !st->rcenter)
            return -ENOMEM;
        memcpy(st->center, vi->s.center, vi->dim * sizeof(float));
        memcpy(st->rcenter, vi->s.rcenter, vi->dim * sizeof(double));
        st->cnorm = vi->s.cnorm;
        st->center_live = vi->s.center_live;
    }
    /* a new centre: every code is taken again (the storage is private: in place) */
    int have = vi->s.kind >= VINDEX_KIND_ANN ? VINDEX_KIND_FLAT : st->kind;
    for (size_t i = 0; i < st->nchunks; i++) {
        if (vi_chunk_alloc_codes(vi, st->chunks[i], vi->s.kind))
            return -ENOMEM;
        for (size_t off = 0; off < st->chunks[i]->cap; off++) {
            if ((i << vi->ch_shift) + off < st->nslots)
                vi_encode_slot(vi, st->rcenter, st->cnorm, st->chunks[i], off, have);
        }
    }
    st->kind = vi->s.kind;
    vi_cal_free(&rb->cal); /* measured other codes */
    memset(&rb->cal, 0, sizeof(rb->cal));
    return 0;
}

/* carry_over brings the new storage up to the published state (wmu held): the slots added
 * since the view, then every slot's tombstone and metadata as they are now. Returns 0 or
 * -ENOMEM. */
static int carry_over(const vindex *vi, rebuild *rb)
{
    vstore *st = &rb->st;
    const vstore *cur = &vi->s;
    if (cur->nslots > rb->v.nslots) {
        /* st->nslots <= v.nslots: room for every slot added since the view */
        uint32_t *s2 = realloc(rb->src, (cur->nslots + 1) * sizeof(uint32_t));
        if (!s2)
            return -ENOMEM;
        rb->src = s2;
    }
    if (carry_kind_up(vi, rb))
        return -ENOMEM;
    /* slots added meanwhile: their codes are around the published centre, unless the
     * storage took that centre just above */
    int added_have = vi_same_center(vi, st, cur) ? cur->kind : VINDEX_KIND_FLAT;
    size_t grow = cur->nslots - rb->v.nslots;
    if (grow && vm_room(&st->map) < grow) {
        vmap nm;
        if (vm_rehash(vi, st, &st->map, st->map.count + grow, &nm))
            return -ENOMEM;
        vm_free(&st->map);
        st->map = nm;
    }
    for (size_t s = rb->v.nslots; s < cur->nslots; s++) {
        rb->src[st->nslots] = (uint32_t)s;
        if (vi_store_append(vi, st, st_chunk(vi, cur, s), off_of(vi, s), added_have, false))
            return -ENOMEM;
        vm_put(vi, st, st_id(vi, st, st->nslots - 1), (uint32_t)(st->nslots - 1));
    }
    /* tombstones and metadata as they are now */
    st->ntomb = 0;
    for (size_t ns = 0; ns < st->nslots; ns++) {
        size_t os = rb->src[ns];
        const chunk *oc = st_chunk(vi, cur, os);
        size_t oo = off_of(vi, os);
        chunk *nc = st_chunk(vi, st, ns);
        size_t no = off_of(vi, ns);
        if (tomb_at(oc, oo)) {
            nc->tomb[no / 64] |= (uint64_t)1 << (no % 64);
            st->ntomb++;
            if (vm_find(vi, st, nc->ids[no]) == (int64_t)ns)
                vm_del(vi, st, nc->ids[no]);
        } else if (vi->meta_size) {
            memcpy(nc->meta + no * vi->meta_size, oc->meta + oo * vi->meta_size, vi->meta_size);
        }
    }
    st->live = st->nslots - st->ntomb;
    return 0;
}

/* swap publishes the new storage and its measurement (wmu held; takes cal_mu and the
 * exclusive lock), and frees the old storage, which no search can reach any more. */
static void swap_in(vindex *vi, rebuild *rb)
{
    vstore old = vi->s;
    pthread_mutex_lock(&vi->cal_mu);
    wrlock(vi);
    vi->s = rb->st;
    if (vi->s.kind < VINDEX_KIND_ANN) {
        free(vi->s.center);
        free(vi->s.rcenter);
        vi->s.center = NULL;
        vi->s.rcenter = NULL;
        vi->s.cnorm = 0.0;
    }
    vi->nrebuilds++;
    vi->code_gen++;
    vindex_eix *ofx = vi->fx; /* its labels name the old slots */
    uint32_t *ofx_slot = vi->fx_slot;
    vi->fx = NULL;
    vi->fx_slot = NULL;
    vi->fx_n = vi->fx_upto = 0;
    vi_fx_clear_error(vi); /* a failed FAISS build is tried again on the new storage */
    vi_cal_install(vi, &rb->cal, vi->code_gen);
    unlock(vi);
    pthread_mutex_unlock(&vi->cal_mu);
    memset(&rb->st, 0, sizeof(rb->st));
    fx_destroy(vi, ofx);
    free(ofx_slot);
    vi_unpin(vi);
    /* the old chunks, centre, map and mapping: snapshots, the only lock-free readers, are
     * excluded by maint_mu */
    vi_store_free(vi, &old);
    vi->tier_retry_at = 0;
}

/* vi_rebuild builds compacted storage of the kind the live count calls for, measures it
 * (target > 0) and swaps it in; see vindex_int.h. */
int vi_rebuild(vindex *vi, bool inline_wmu, double target, const vindex_query *shape)
{
    rebuild rb = {0};
    if (!inline_wmu)
        pthread_mutex_lock(&vi->wmu);
    if (vi_view_take(vi, &rb.v)) {
        if (!inline_wmu)
            pthread_mutex_unlock(&vi->wmu);
        return -ENOMEM;
    }
    vi->pinned = true;
    rb.st.kind = vi_kind_for(vi, rb.v.live, rb.v.kind);
    rb.st.hint = rb.v.live + rb.v.live / 8;
    if (!inline_wmu)
        pthread_mutex_unlock(&vi->wmu);

    int rc = copy_live(vi, &rb);
    if (rc == 0 && target > 0 && rb.st.kind == VINDEX_KIND_ANN && rb.st.live > 0 &&
        vi_cal_build(vi, &rb.st, &rb.cal, target, shape) < 0) {
        vi_cal_free(&rb.cal); /* unmeasured: exact scans until the monitor measures */
        memset(&rb.cal, 0, sizeof(rb.cal));
    }

    if (!inline_wmu)
        pthread_mutex_lock(&vi->wmu);
    if (rc == 0)
        rc = carry_over(vi, &rb);
    if (rc == 0)
        swap_in(vi, &rb);
    else
        vi_unpin(vi);
    if (!inline_wmu)
        pthread_mutex_unlock(&vi->wmu);
    rebuild_free(vi, &rb);
    return rc == 0 ? 1 : -ENOMEM;
}

/* maintain does the maintenance that is due (maint_mu held): a rebuild measured for target
 * and shape, then the FAISS engine's build. */
static int maintain(vindex *vi, double target, const vindex_query *shape)
{
    pthread_mutex_lock(&vi->wmu);
    bool due = vi_rebuild_due(vi);
    pthread_mutex_unlock(&vi->wmu);
    int rc = due ? vi_rebuild(vi, false, target, shape) : 0;
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&vi->wmu);
    bool fdue = vi_fx_due(vi);
    pthread_mutex_unlock(&vi->wmu);
    if (!fdue)
        return rc;
    int frc = vi_fx_build(vi);
    if (frc < 0 || frc > 1)
        return frc; /* -ENOMEM or VINDEX_E_FAISS */
    /* the engine's candidates are new: measured before the monitor's next round */
    vindex_calibrate_scored(vi, CAL_BUILD_PROBES, target, NULL, NULL);
    return 1;
}

/* vindex_maintenance rebuilds and (FAISS engine) builds the FAISS index when due; see
 * vindex.h. */
int vindex_maintenance(vindex *vi)
{
    return vindex_maintenance_scored(vi, vi->o.recall_target, NULL);
}

int vindex_maintenance_scored(vindex *vi, double target, const vindex_query *shape)
{
    pthread_mutex_lock(&vi->maint_mu);
    int rc = maintain(vi, target, shape);
    pthread_mutex_unlock(&vi->maint_mu);
    return rc;
}

/* unmeasured tells whether the index is of the ANN kind with codes no calibration covers. */
static bool unmeasured(vindex *vi)
{
    rdlock(vi);
    bool ann = vi->s.kind == VINDEX_KIND_ANN && vi->s.live > 0;
    uint64_t gen = vi->code_gen;
    unlock(vi);
    if (!ann)
        return false;
    pthread_mutex_lock(&vi->cal_mu);
    bool measured = vi->cal.measured && vi->cal.gen == gen;
    pthread_mutex_unlock(&vi->cal_mu);
    return !measured;
}

/* vindex_settle_due: codes to measure or a stale centre; see vindex.h. It reads the
 * published state and what the last calibration published for readers (pub_mu), never
 * cal_mu, which a calibration holds for all its probes: a worker thread asks this after
 * every store_batch. */
bool vindex_settle_due(vindex *vi)
{
    rdlock(vi);
    bool stale = center_stale(vi);
    bool ann = vi->s.kind == VINDEX_KIND_ANN && vi->s.live > 0;
    uint64_t gen = vi->code_gen;
    unlock(vi);
    if (stale)
        return true;
    if (!ann)
        return false;
    pthread_mutex_lock(&vi->pub_mu);
    bool measured = vi->pub_gen == gen && !isnan(vi->pub_est);
    pthread_mutex_unlock(&vi->pub_mu);
    return !measured;
}

/* vindex_settle finishes a bulk build: a rebuild when due, a measurement when missing; see
 * vindex.h. */
int vindex_settle(vindex *vi, double target, const vindex_query *shape)
{
    pthread_mutex_lock(&vi->maint_mu);
    pthread_mutex_lock(&vi->wmu);
    bool due = vi_rebuild_due(vi);
    pthread_mutex_unlock(&vi->wmu);
    int rc = due ? vi_rebuild(vi, false, target, shape) : 0;
    pthread_mutex_unlock(&vi->maint_mu);
    if (rc < 0)
        return rc;
    if (!unmeasured(vi))
        return rc;
    int crc = vindex_calibrate_scored(vi, CAL_BUILD_PROBES, target, shape, NULL);
    return crc < 0 ? crc : 1;
}
