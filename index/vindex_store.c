/* index/vindex_store.c: the vector index's storage (see vindex_int.h): chunks and their
 * arrays, the int8 and sign codes, the centre the sign codes are taken around, storages
 * under construction, frozen views of the published one, and freeing what a pin defers.
 */
#define _GNU_SOURCE

#include "vindex.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* vi_free_later frees p (unmaps unmap_len bytes at p) now, or after the pin when the index
 * is pinned. wmu held. */
void vi_free_later(vindex *vi, void *p, size_t unmap_len)
{
    if (!p)
        return;
    if (!vi->pinned) {
        if (unmap_len)
            munmap(p, unmap_len);
        else
            free(p);
        return;
    }
    deferred *d = xmalloc(sizeof(*d));
    d->p = p;
    d->unmap_len = unmap_len;
    d->next = vi->dfree;
    vi->dfree = d;
}

/* vi_unpin ends a pin and frees what writers deferred meanwhile. wmu held. */
void vi_unpin(vindex *vi)
{
    vi->pinned = false;
    while (vi->dfree) {
        deferred *d = vi->dfree;
        vi->dfree = d->next;
        if (d->unmap_len)
            munmap(d->p, d->unmap_len);
        else
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
 * (words = vi_code_words(dim)). The rotation spreads the variance of every direction over all
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

/* vi_encode_slot fills the codes c has for slot off from its row, unless have_kind says the
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

/* vi_center_of computes the mean of the live rows of the n slots in chunks (tombstones per
 * chunk, or tomb_override's bits) into a new array. Returns it (malloc'd, the caller owns
 * it), or NULL when out of memory. A caller holds what keeps those rows from changing. */
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

/* vi_chunk_free frees c and its arrays (not its rows when they are mapped); NULL is a no-op. */
void vi_chunk_free(chunk *c)
{
    if (!c)
        return;
    if (!c->rows_mapped)
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

/* vi_chunk_alloc_codes gives c the code arrays of kind that it lacks. Returns 0 or -ENOMEM
 * (arrays allocated so far stay; they are only used once kind says so). */
int vi_chunk_alloc_codes(const vindex *vi, chunk *c, int kind)
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

/* vi_chunk_new returns a chunk of cap slots with heap rows and the arrays of kind, or NULL. */
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
        vi_chunk_alloc_codes(vi, c, kind)) {
        vi_chunk_free(c);
        return NULL;
    }
    return c;
}

/* vi_chunk_new_mapped returns a chunk of cap slots whose rows are the mapped rows at rows,
 * with heap arrays for the rest, or NULL. */
chunk *vi_chunk_new_mapped(const vindex *vi, size_t cap, int kind, float *rows)
{
    chunk *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->cap = cap;
    c->rows = rows;
    c->rows_mapped = true;
    c->ids = amalloc(cap * sizeof(uint64_t));
    c->tomb = calloc((cap + 63) / 64, sizeof(uint64_t));
    if (vi->meta_size)
        c->meta = amalloc(cap * vi->meta_size);
    if (!c->ids || !c->tomb || (vi->meta_size && !c->meta) || vi_chunk_alloc_codes(vi, c, kind)) {
        vi_chunk_free(c);
        return NULL;
    }
    return c;
}

/* vi_chunk_bytes returns the heap bytes c holds (mapped rows are not on the heap). */
size_t vi_chunk_bytes(const vindex *vi, const chunk *c)
{
    size_t per = sizeof(uint64_t) + vi->meta_size;
    if (!c->rows_mapped)
        per += vi->dim * sizeof(float);
    if (c->sq)
        per += vi->sq_stride + 2 * sizeof(float);
    if (c->bin)
        per += vi->words * sizeof(uint64_t);
    return sizeof(*c) + c->cap * per + (c->cap + 63) / 64 * sizeof(uint64_t);
}

/* vi_copy_slot copies slot data (row, id, meta when with_meta, codes present in both) from
 * (s, so) to (d, dof); the tombstone bit of the destination is left alone. */
void vi_copy_slot(const vindex *vi, chunk *d, size_t dof, const chunk *s, size_t so, bool with_meta)
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

/* ---- storages ---- */

/* vi_store_free frees a storage (its chunks, centre, map and mapped rows) and zeroes it. */
void vi_store_free(const vindex *vi, vstore *st)
{
    for (size_t i = 0; i < st->nchunks; i++)
        vi_chunk_free(st->chunks[i]);
    free(st->chunks);
    free(st->center);
    vm_free(&st->map);
    vi_rows_unmap(st->rows);
    memset(st, 0, sizeof(*st));
}

/* grow_chunk0 doubles chunk 0 of a storage under construction (sized by the hint, and more
 * came). Returns 0 or -ENOMEM. */
static int grow_chunk0(const vindex *vi, vstore *st)
{
    chunk *o = st->chunks[0];
    chunk *g = vi_chunk_new(vi, o->cap * 2 > vi->ch_rows ? vi->ch_rows : o->cap * 2, st->kind);
    if (!g)
        return -ENOMEM;
    for (size_t i = 0; i < o->cap; i++)
        vi_copy_slot(vi, g, i, o, i, true);
    memcpy(g->tomb, o->tomb, (o->cap + 63) / 64 * sizeof(uint64_t));
    st->chunks[0] = g;
    vi_chunk_free(o);
    return 0;
}

/* add_chunk appends a chunk to a storage under construction. Returns 0 or -ENOMEM. */
static int add_chunk(const vindex *vi, vstore *st)
{
    if (st->nchunks == st->tcap) {
        size_t ncap = st->tcap ? st->tcap * 2 : 4;
        chunk **t = realloc(st->chunks, ncap * sizeof(*t));
        if (!t)
            return -ENOMEM;
        st->chunks = t;
        st->tcap = ncap;
    }
    size_t cap = vi->ch_rows;
    if (st->nchunks == 0) {
        size_t want = CHUNK0_MIN;
        while (want < st->hint && want < vi->ch_rows)
            want *= 2;
        cap = want < cap ? want : cap;
    }
    chunk *c = vi_chunk_new(vi, cap, st->kind);
    if (!c)
        return -ENOMEM;
    st->chunks[st->nchunks++] = c;
    return 0;
}

/* vi_store_append copies slot so of chunk s (whose codes cover have_kind) as the next slot of
 * st, encoding the codes st's kind needs beyond that (sign codes around st->center: pass a
 * have_kind below ANN when s's were taken around another centre). Returns 0 or -ENOMEM. */
int vi_store_append(const vindex *vi, vstore *st, const chunk *s, size_t so, int have_kind,
                    bool with_meta)
{
    size_t slot = st->nslots, ci = slot >> vi->ch_shift, off = slot & vi->ch_mask;
    if (ci == 0 && st->nchunks == 1 && off == st->chunks[0]->cap && grow_chunk0(vi, st))
        return -ENOMEM;
    if (ci == st->nchunks && add_chunk(vi, st))
        return -ENOMEM;
    chunk *d = st->chunks[ci];
    vi_copy_slot(vi, d, off, s, so, with_meta);
    vi_encode_slot(vi, st->center, d, off, have_kind);
    st->nslots++;
    return 0;
}

/* ---- views ---- */

void vi_view_free(view *v)
{
    free(v->ch);
    free(v->tomb);
    memset(v, 0, sizeof(*v));
}

/* vi_view_take copies the published state. wmu held. Returns 0 or -ENOMEM. */
int vi_view_take(vindex *vi, view *v)
{
    const vstore *st = &vi->s;
    memset(v, 0, sizeof(*v));
    v->nchunks = st->nchunks;
    v->nslots = st->nslots;
    v->live = st->live;
    v->kind = st->kind;
    v->center = st->center;
    v->center_live = st->center_live;
    v->ch = malloc((v->nchunks ? v->nchunks : 1) * sizeof(chunk));
    v->tomb = calloc((v->nslots + 63) / 64 + 1, sizeof(uint64_t));
    if (!v->ch || !v->tomb) {
        vi_view_free(v);
        return -ENOMEM;
    }
    for (size_t i = 0; i < v->nchunks; i++)
        v->ch[i] = *st->chunks[i];
    for (size_t s = 0; s < v->nslots; s++) {
        if (tomb_at(&v->ch[s >> vi->ch_shift], s & vi->ch_mask))
            v->tomb[s / 64] |= (uint64_t)1 << (s % 64);
    }
    return 0;
}
