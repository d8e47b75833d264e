/* index/vindex_search.c: the vector index's searches (see vindex.h): the exact scans of the
 * FLAT and SQ8 kinds, the ANN kind's Hamming-prefiltered search (native codes or the FAISS
 * engine) with exact re-ranking, filters, and the recall monitor (vindex_calibrate). The
 * storage they read is described in vindex_int.h.
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
#include "vindex.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "idmap.h"
#include "vindex_int.h"
#include "vkernel.h"

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
    if (vi->o.faiss_engine->search(vi->fx, sc->p->qn, want, labels, sims)) {
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
    memset(bits, 0, vi->words * sizeof(uint64_t)); /* the words past dim (vi_code_words) */
    vk_sign_bits(scratch, dim, bits);
}

/* offer_query copies every QS_EVERY-th query of the FAISS engine (qn: dim floats,
 * normalized) into the ring of queries the calibration takes its probes from. Never waits:
 * when the ring is busy (a calibration popping, another search copying) the query is
 * skipped, and a ring that cannot be allocated stays off. */
static void offer_query(vindex *vi, const float *qn)
{
    if (atomic_fetch_add_explicit(&vi->qs_tick, 1, memory_order_relaxed) % QS_EVERY != 0)
        return;
    if (pthread_mutex_trylock(&vi->qs_mu))
        return;
    if (!vi->qs_buf)
        vi->qs_buf = malloc(QS_CAP * vi->dim * sizeof(float));
    if (vi->qs_buf) {
        memcpy(vi->qs_buf + vi->qs_head * vi->dim, qn, vi->dim * sizeof(float));
        vi->qs_head = (vi->qs_head + 1) % QS_CAP;
        if (vi->qs_n < QS_CAP)
            vi->qs_n++;
    }
    pthread_mutex_unlock(&vi->qs_mu);
}

/* take_query moves the newest unused query of the ring into out (dim floats). Returns
 * true when there was one. */
static bool take_query(vindex *vi, float *out)
{
    bool got = false;
    pthread_mutex_lock(&vi->qs_mu);
    if (vi->qs_n > 0) {
        vi->qs_head = (vi->qs_head + QS_CAP - 1) % QS_CAP;
        vi->qs_n--;
        memcpy(out, vi->qs_buf + vi->qs_head * vi->dim, vi->dim * sizeof(float));
        got = true;
    }
    pthread_mutex_unlock(&vi->qs_mu);
    return got;
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
    if (vi->fx)
        offer_query(vi, qn); /* whichever path answers: exact ones too, or the monitor of an
                              * index that fell back to exact scans would see only probes */
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
        bool ok = vi->o.faiss_engine->search(vi->fx, qn, want, labels, sims) == 0;
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
    if (!vi->cal_pos || !vi->cal_spos || !vi->cal_real) {
        if (!vi->cal_pos)
            vi->cal_pos = malloc(CAL_RING * sizeof(uint32_t));
        if (!vi->cal_spos)
            vi->cal_spos = malloc(CAL_RING * sizeof(uint32_t));
        if (!vi->cal_real)
            vi->cal_real = calloc(CAL_RING, 1);
        if (!vi->cal_pos || !vi->cal_spos || !vi->cal_real) {
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
            vi->cal_n = vi->cal_head = vi->cal_probes = vi->cal_qn = 0;
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
                vi->cal_n = vi->cal_head = vi->cal_qn = 0;
            }
        }
        uint32_t pos[CAL_K], spos[CAL_K];
        int nsp = 0;
        /* the FAISS engine prefers a recent real query; otherwise a synthetic probe */
        bool real = fxm && take_query(vi, probe);
        if (!real)
            make_probe(vi, vi->cal_probes++, probe);
        int np = probe_positions(vi, probe, pos, fxd, fxm ? NULL : shape, spos, &nsp);
        unlock(vi);
        if (np < 0) {
            rc = np;
            goto done;
        }
        for (int j = 0; j < np; j++) {
            if (vi->cal_n == CAL_RING)
                vi->cal_qn -= vi->cal_real[vi->cal_head];
            vi->cal_pos[vi->cal_head] = pos[j];
            vi->cal_real[vi->cal_head] = real;
            vi->cal_qn += real;
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
        out->query_samples = vi->cal_qn;
        out->exact_fallback = atomic_load(&vi->exact_fb) != 0;
        out->was_below = was_below;
        out->scored_depth = atomic_load(&vi->sdepth);
    }
    pthread_mutex_lock(&vi->pub_mu);
    vi->pub_est = vi->cal_est;
    vi->pub_ann_est = vi->cal_ann_est;
    vi->pub_samples = vi->cal_n;
    vi->pub_qsamples = vi->cal_qn;
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
    size_t samples = vi->pub_samples, qsamples = vi->pub_qsamples;
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
    out->query_samples = fresh ? qsamples : 0;
    out->exact_fallback = atomic_load(&vi->exact_fb) != 0;
    out->was_below = false;
    out->scored_depth = atomic_load(&vi->sdepth);
}
