/* index/vindex.c: one tenant's vector index (see vindex.h): creation and destruction, the
 * options, statistics and memory accounting. vindex_int.h lists the files that do the rest.
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
#include "vindex_int.h"
#include "vkernel.h"

/* ---- the rotation, one per dimension for the whole process ----
 *
 * Every index of a dimension uses the same rotation (ROT_SEED), VK_ROT_ROUNDS * dim floats:
 * 4.6 KB at 384 dimensions, as much as a few dozen vectors of a small tenant, so it is made
 * once and shared. Never freed (a process sees few dimensions); immutable once made. */

typedef struct rot_entry {
    size_t dim;
    float *signs;
    struct rot_entry *next;
} rot_entry;

static pthread_mutex_t rot_mu = PTHREAD_MUTEX_INITIALIZER;
static rot_entry *rots;

static const float *rot_for(size_t dim)
{
    pthread_mutex_lock(&rot_mu);
    rot_entry *e = rots;
    while (e && e->dim != dim)
        e = e->next;
    if (!e) {
        e = malloc(sizeof(*e));
        float *signs = e ? malloc(VK_ROT_ROUNDS * dim * sizeof(float)) : NULL;
        if (!signs) {
            free(e);
            pthread_mutex_unlock(&rot_mu);
            return NULL;
        }
        vk_rot_signs(ROT_SEED, dim, signs);
        *e = (rot_entry){.dim = dim, .signs = signs, .next = rots};
        rots = e;
    }
    pthread_mutex_unlock(&rot_mu);
    return e->signs;
}

/* ---- creation ---- */

int vi_resolve_opts(const vindex_opts *in, vindex_opts *o)
{
    if (!in || in->dim == 0 || in->dim > MAX_DIM || in->meta_size > MAX_META ||
        in->compact_percent > 100 || in->recall_target < 0 || in->recall_target >= 1 ||
        isnan(in->recall_target) || isnan(in->tie_margin) || in->tie_margin > 1e6)
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
    if (o->recall_target == 0)
        o->recall_target = DEF_RECALL_TARGET;
    if (o->tie_margin == 0)
        o->tie_margin = DEF_TIE_MARGIN;
    return 0;
}

/* init_locks initializes the index's locks; on failure none is left initialized. */
static int init_locks(vindex *vi)
{
    pthread_rwlockattr_t attr;
    if (pthread_rwlockattr_init(&attr))
        return -ENOMEM;
#ifdef __GLIBC__
    /* glibc's default prefers readers: overlapping searches could starve writers */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    int rc = pthread_rwlock_init(&vi->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (rc)
        return -ENOMEM;
    pthread_mutex_t *mus[] = {&vi->wmu, &vi->maint_mu, &vi->cal_mu, &vi->pub_mu, &vi->qs_mu};
    size_t n = 0;
    while (n < sizeof(mus) / sizeof(mus[0]) && pthread_mutex_init(mus[n], NULL) == 0)
        n++;
    if (n == sizeof(mus) / sizeof(mus[0]))
        return 0;
    while (n-- > 0)
        pthread_mutex_destroy(mus[n]);
    pthread_rwlock_destroy(&vi->lock);
    return -ENOMEM;
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
    vi->ch_shift = vi_chunk_shift(o.dim);
    vi->ch_rows = (size_t)1 << vi->ch_shift;
    vi->ch_mask = vi->ch_rows - 1;
    vi->s.kind = VINDEX_KIND_FLAT;
    vi->rot = rot_for(o.dim);
    vi->cal.rng = HASH_GOLDEN64;
    vi->cal.est = vi->cal.ann_est = NAN;
    vi->pub_est = vi->pub_ann_est = NAN;
    if (!vi->rot || init_locks(vi)) {
        free(vi);
        return NULL;
    }
    if (vm_init(&vi->s.map, 0)) {
        vindex_destroy(vi);
        return NULL;
    }
    return vi;
}

/* vindex_destroy frees the index; NULL is a no-op. No other thread may use it any more. */
void vindex_destroy(vindex *vi)
{
    if (!vi)
        return;
    vi_store_free(vi, &vi->s);
    vi_unpin(vi);
    vi_cal_free(&vi->cal);
    free(vi->qs_buf);
    fx_destroy(vi, vi->fx);
    free(vi->fx_slot);
    vi_fx_clear_error(vi);
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
    size_t n = vi->s.live;
    unlock(vi);
    return n;
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

/* ---- accounting ---- */

/* vi_rows_on_heap returns the bytes of float rows on the heap that a save would map: none
 * below SQ8 (a FLAT search reads every row) or with heap_rows. */
size_t vi_rows_on_heap(const vindex *vi, const vstore *st)
{
    if (st->kind < VINDEX_KIND_SQ8 || vi->o.heap_rows)
        return 0;
    size_t b = 0;
    for (size_t i = 0; i < st->nchunks; i++) {
        if (!st->chunks[i]->rows_mapped)
            b += st->chunks[i]->cap * vi->dim * sizeof(float);
    }
    return b;
}

/* vi_heap_bytes returns the heap bytes of the index (shared lock or wmu held). */
size_t vi_heap_bytes(const vindex *vi)
{
    const vstore *st = &vi->s;
    size_t b = sizeof(*vi) + st->tcap * sizeof(chunk *) + vm_bytes(&st->map);
    for (size_t i = 0; i < st->nchunks; i++)
        b += vi_chunk_bytes(vi, st->chunks[i]);
    if (st->center)
        b += vi->dim * (sizeof(float) + sizeof(double)); /* and its rotation */
    if (st->rows)
        b += sizeof(vrows);
    if (vi->fx)
        b += vi->o.faiss_engine->bytes(vi->fx) + vi->fx_n * sizeof(uint32_t);
    b += atomic_load_explicit(&vi->cal_bytes, memory_order_relaxed);
    b += atomic_load_explicit(&vi->qs_bytes, memory_order_relaxed);
    return b;
}

static size_t rows_resident(const vindex *vi)
{
    return vi->s.rows ? atomic_load_explicit(&vi->s.rows->resident, memory_order_relaxed) : 0;
}

/* vindex_bytes returns the resident bytes (see vindex.h). Shared lock. */
size_t vindex_bytes(vindex *vi)
{
    rdlock(vi);
    size_t b = vi_heap_bytes(vi) + rows_resident(vi);
    unlock(vi);
    return b;
}

/* vindex_resident measures the mapped rows in RAM and returns vindex_bytes. Shared lock (the
 * mapping cannot go while it is held). */
size_t vindex_resident(vindex *vi)
{
    rdlock(vi);
    size_t b = vi_heap_bytes(vi) + vi_rows_measure(vi->s.rows);
    unlock(vi);
    return b;
}

/* vindex_rows_keep holds the mapped rows in RAM to percent of them; see vindex.h. */
size_t vindex_rows_keep(vindex *vi, double percent, size_t *dropped)
{
    rdlock(vi);
    /* the ANN kind reads a row for a near-tie only; the others re-rank on rows: kept */
    size_t rows = vi->s.kind == VINDEX_KIND_ANN && percent < 100
                      ? vi_rows_keep(vi->s.rows, percent, dropped)
                      : vi_rows_measure(vi->s.rows);
    size_t b = vi_heap_bytes(vi) + rows;
    unlock(vi);
    return b;
}

/* vindex_trim drops the mapped rows' pages and returns the resident bytes after. */
size_t vindex_trim(vindex *vi)
{
    rdlock(vi);
    vi_rows_trim(vi->s.rows);
    size_t b = vi_heap_bytes(vi) + vi_rows_measure(vi->s.rows);
    unlock(vi);
    return b;
}

/* vindex_get_stats fills *st under the shared lock. */
void vindex_get_stats(vindex *vi, vindex_stats *st)
{
    rdlock(vi);
    const vstore *s = &vi->s;
    st->count = s->live;
    st->slots = s->nslots;
    st->tombstones = s->ntomb;
    st->compactions = vi->nrebuilds;
    st->heap_bytes = vi_heap_bytes(vi);
    st->rows_heap = vi_rows_on_heap(vi, s);
    st->rows_mapped = s->rows ? s->rows->len : 0;
    st->rows_resident = rows_resident(vi);
    st->bytes = st->heap_bytes + st->rows_resident;
    st->kind = (enum vindex_kind)s->kind;
    st->maintenance_due = vi_rebuild_due(vi) || vi_fx_due(vi);
    st->engine = vi->fx ? VINDEX_ENGINE_FAISS : VINDEX_ENGINE_NATIVE;
    st->page_ins = atomic_load_explicit(&vi->page_ins, memory_order_relaxed);
    st->rows_read = atomic_load_explicit(&vi->rows_read, memory_order_relaxed);
    st->tie_reads = atomic_load_explicit(&vi->tie_reads, memory_order_relaxed);
    st->searches = atomic_load_explicit(&vi->searches, memory_order_relaxed);
    unlock(vi);
}

/* vindex_last_error returns NULL: no FAISS calls remain (kept for compatibility). */
const char *vindex_last_error(void)
{
    return NULL;
}

/* vindex_engine_error returns why the FAISS engine's index could not be built (empty when
 * it could, or was never tried); see vindex.h. */
void vindex_engine_error(vindex *vi, char *buf, size_t len)
{
    pthread_mutex_lock(&vi->wmu);
    snprintf(buf, len, "%s", vi->fx_error ? vi->fx_error : "");
    pthread_mutex_unlock(&vi->wmu);
}
