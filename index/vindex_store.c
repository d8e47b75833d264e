/* index/vindex_store.c: the vector index's storage (see vindex_int.h): chunks and their
 * arrays, the int8 and sign codes, the centre the sign codes are taken around, storages
 * under construction, frozen views of the published one, and freeing what a pin defers.
 */
#define _GNU_SOURCE

#include "vindex.h"

#include <errno.h>
#include <math.h>
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

/* The codes of a row x (unit length) are taken in the rotated frame, around the centre c of
 * the storage (the origin below ANN): y = R x - R c in double (vk_rotate; R c is the
 * storage's rcenter). The int8 code quantizes y with its own step a, so neither a component
 * all vectors share (the text set's mean cosine is 0.84) nor a few large coordinates eat
 * its range. The sign code is the signs of y: it spreads the variance of every direction
 * over all bits, and the centre removes what all vectors share, so each bit carries
 * information on any distribution (non-negative features, a dominant common direction, or
 * a spectrum that sits in a few dimensions).
 *
 * The coding error r = y - a c is split along u = R c / |R c|: e = r . u is kept (a float),
 * and rn bounds the norm of the rest, r - e u. Queries share the centre's direction as the
 * vectors do (on the text set q . u is about 0.9), and that part of a query's product with
 * r is then known exactly (alpha e): what is left of the estimate's error is the product of
 * the query's part across u (|q - alpha u|, about 0.4 on the text set) with r - e u.
 * vindex_search.c, "SQ8 codes", gives the bound. */

/* encode_row writes the codes c holds for slot off (int8 unless have_kind has it, sign bits
 * unless have_kind has them) from row x. Out of memory (dimensions above ENC_STACK only)
 * leaves a zero sign code and an int8 code whose error norm bounds any unit row's distance
 * to any centre: searches stay correct, the calibration sees the lost recall. */
static void encode_row(const vindex *vi, const double *rcenter, double cnorm, const float *x,
                       chunk *c, size_t off, int have_kind)
{
    bool sq = c->sq && have_kind < VINDEX_KIND_SQ8, bin = c->bin && have_kind < VINDEX_KIND_ANN;
    if (!sq && !bin)
        return;
    double sbuf[ENC_STACK];
    double *y = vi->dim <= ENC_STACK ? sbuf : malloc(vi->dim * sizeof(double));
    uint64_t *bits = bin ? c->bin + off * vi->words : NULL;
    if (bits)
        memset(bits, 0, vi->words * sizeof(uint64_t)); /* the words past dim (vi_code_words) */
    if (!y) {
        if (sq) {
            memset(c->sq + off * vi->sq_stride, 0, vi->sq_stride);
            c->sq_scale[off] = 1.0f;
            c->sq_e[off] = 0.0f;
            c->sq_rn[off] = 4.0f; /* >= |y| for any unit row and centre */
        }
        return;
    }
    for (size_t j = 0; j < vi->dim; j++)
        y[j] = (double)x[j];
    vk_rotate(y, vi->dim, vi->rot);
    if (rcenter) {
        for (size_t j = 0; j < vi->dim; j++)
            y[j] -= rcenter[j];
    }
    if (bits) {
        for (size_t j = 0; j < vi->dim; j++)
            bits[j / 64] |= (uint64_t)(y[j] > 0.0) << (j % 64);
    }
    if (sq) {
        int8_t *code = c->sq + off * vi->sq_stride;
        vk_sq8_encode_d(y, vi->dim, code, &c->sq_scale[off]); /* y is now the error r */
        memset(code + vi->dim, 0, vi->sq_stride - vi->dim);
        double e = 0.0, s2 = 0.0;
        if (rcenter && cnorm > 0.0) {
            for (size_t j = 0; j < vi->dim; j++)
                e += y[j] * rcenter[j];
            e /= cnorm;
        }
        float ef = (float)e;
        for (size_t j = 0; j < vi->dim; j++) {
            double d = y[j] - (rcenter && cnorm > 0.0 ? (double)ef * (rcenter[j] / cnorm) : 0.0);
            s2 += d * d;
        }
        /* rounded up, with slack for the rotation's rounding (vkernel.h) */
        c->sq_e[off] = ef;
        c->sq_rn[off] = nextafterf((float)(sqrt(s2) * (1.0 + 1e-9) + VK_ROT_SLACK), INFINITY);
    }
    if (y != sbuf)
        free(y);
}

/* vi_encode_slot fills the codes c has for slot off from its row, unless have_kind says the
 * source already provided them (taken around the same centre). */
void vi_encode_slot(const vindex *vi, const double *rcenter, double cnorm, chunk *c, size_t off,
                    int have_kind)
{
    encode_row(vi, rcenter, cnorm, row_in(vi, c, off), c, off, have_kind);
}

/* vi_rotate_center returns center rotated and its norm rounded up (see vindex_int.h). */
double *vi_rotate_center(const vindex *vi, const float *center, double *norm)
{
    double *r = malloc(vi->dim * sizeof(double));
    if (!r)
        return NULL;
    for (size_t j = 0; j < vi->dim; j++)
        r[j] = (double)center[j];
    vk_rotate(r, vi->dim, vi->rot);
    double n2 = 0.0;
    for (size_t j = 0; j < vi->dim; j++)
        n2 += r[j] * r[j];
    *norm = sqrt(n2);
    return r;
}

/* vi_same_center: both without a centre, or both with equal ones. */
bool vi_same_center(const vindex *vi, const vstore *a, const vstore *b)
{
    if (!a->center || !b->center)
        return !a->center && !b->center;
    return memcmp(a->center, b->center, vi->dim * sizeof(float)) == 0;
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
    free(c->sq_e);
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
        float *e = amalloc(c->cap * sizeof(float));
        if (!sq || !sc || !rn || !e) {
            free(sq);
            free(sc);
            free(rn);
            free(e);
            return -ENOMEM;
        }
        c->sq = sq;
        c->sq_scale = sc;
        c->sq_e = e;
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
        per += vi->sq_stride + 3 * sizeof(float);
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
        d->sq_e[dof] = s->sq_e[so];
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
    free(st->rcenter);
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
 * st, encoding the codes st's kind needs beyond that (around st's centre: pass
 * VINDEX_KIND_FLAT when s's were taken around another one). Returns 0 or -ENOMEM. */
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
    vi_encode_slot(vi, st->rcenter, st->cnorm, d, off, have_kind);
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
