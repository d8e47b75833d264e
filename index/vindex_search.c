/* index/vindex_search.c: the vector index's searches (see vindex.h): the exact scans of the
 * FLAT and SQ8 kinds, the ANN kind's Hamming-prefiltered search (native codes or the FAISS
 * engine) with exact re-ranking, and filters. The storage they read is described in
 * vindex_int.h; the recall calibration, which runs the exact search on its probes, is in
 * vindex_cal.c.
 *
 * SQ8 codes and their bound. The codes are taken in a rotated frame around the storage's
 * centre m (the origin below ANN; vindex_store.c): for a row x (unit length in float),
 * y = R x - R m (R orthogonal: vk_rotate, in double), c = round(y / a), |c| <= 127,
 * a = max|y_j| / 127, and the error r = y - a c is split along u = R m / |R m|: e = r.u is
 * stored (a float) and rn, the norm of r' = r - e u, rounded up. The query is rotated too,
 * R q = b qq + s, qq in int16, |s| computed per query. With alpha = q.m / |m| (= R q . u):
 *   q.x = q.m + R q . y = q.m + a b (qq.c) + a (s.c) + alpha e + R q . r',
 *   |a (s.c)| <= |s| |y - r| <= |s| (1 + |m| + |e| + rn),
 *   |R q . r'| <= |q - alpha u| rn (r' is orthogonal to u up to the rounding of e),
 * and qq.c is an exact integer, so sim <= q.m + a b (qq.c) + alpha e + |q - alpha u| rn +
 * |s| (1 + |m| + |e| + rn) + 1e-6 (the last term covers float rounding, including that of the
 * exact similarity we compare against and the rotation's, under 1e-12). At 768 dimensions
 * rn is about 0.008 (less when the vectors share a direction), so few vectors survive the
 * bound. Queries share the centre's direction as stored vectors do, so |q - alpha u| is
 * small where the centre is large: 0.4 on the text set, whose mean cosine is 0.84.
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
 * a depth is a measured figure, not a hope; codes not measured yet are scanned exactly.
 * When a sample of 128 slots says the filter keeps fewer
 * than half the budget, the search skips the Hamming pass: keep runs on every slot and the kept
 * ones are bounded with their int8 codes, an exact answer (a 1% filter at 50k x 768: 0.3 ms instead
 * of 1.1 ms for the deep gather).
 *
 * Ranking from codes (ANN). The candidates an ANN search bounds are ranked by their int8
 * estimate q.m + a b (qq.c) + alpha e, not by their float rows: the error of that estimate,
 * R q . r' plus the query's rounding, has a rigorous bound (above) but a standard deviation
 * of about |q - alpha u| rn / sqrt(dim) plus the query's part over sqrt(dim), the rounding
 * errors of the rotated coordinates being independent and uniform.
 * Each hit carries the interval of its score within tie_margin such deviations; the k best
 * estimates and as many runners-up are kept, and where intervals overlap across the k-th
 * place the float rows of the hits at the overlap's ends are read (one at a time, the
 * nearest first: resolve_ties) until the k-th place is settled. On the text set this read
 * 1 row a query (tie margin 2; 7 at margin 3 with codes of x itself) where the exact re-rank
 * read 52 (60% of the rows in 300 queries), at recall 0.9987 against 0.9993 (bench/README).
 * A score function that is not monotone gives no interval: such queries, the exact kinds and
 * the exact fallbacks re-rank on the rows.
 *
 * Float rows. The re-rank reads a candidate's float row, from the heap or from the
 * snapshot's mapping; a row not in RAM is read from the file then (a major page fault),
 * which a search counts (vindex_stats.page_ins), as it counts the rows (rows_read).
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
#include "heap.h"
#include "vindex_int.h"
#include "vkernel.h"

/* ---- the top k and the re-rank ---- */

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

/* vi_hit_worse orders a top k's heap: the worst hit at the root, the first to leave. */
bool vi_hit_worse(const void *a, const void *b)
{
    return better(b, a);
}

/* vi_offer adds hit to the top k when it belongs there. */
void vi_offer(topk *t, const vindex_hit *hit)
{
    if (t->n < t->k) {
        t->h[t->n] = *hit;
        heap_push(t->h, t->n, sizeof(vindex_hit), vi_hit_worse);
        t->n++;
        t->entered++;
    } else if (better(hit, &t->h[0])) {
        t->entered++;
        heap_replace_root(t->h, t->n, sizeof(vindex_hit), hit, vi_hit_worse);
    }
}

/* vi_topk_sort turns the heap into an array sorted best first. */
void vi_topk_sort(topk *t)
{
    heap_sort(t->h, t->n, sizeof(vindex_hit), vi_hit_worse);
}

/* rhit_worse orders a code-ranked heap: the worst hit at the root. */
static bool rhit_worse(const void *a, const void *b)
{
    return better(&((const rhit *)b)->h, &((const rhit *)a)->h);
}

/* topk_worst returns the hit a new one must beat to enter t, or NULL while t has room. */
static const vindex_hit *topk_worst(const topk *t)
{
    if (t->r)
        return t->n < t->rk ? NULL : &t->r[0].h;
    return t->n < t->k ? NULL : &t->h[0];
}

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
    const vindex_hit *w = topk_worst(t);
    if (!w)
        return false;
    double worst = w->score;
    return ubs < worst - 1e-9 * (1.0 + fabs(worst));
}

/* cand_first orders the re-rank's heap: higher bound first, then lower slot. */
static bool cand_first(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (a->ubs != b->ubs)
        return a->ubs > b->ubs;
    return a->slot < b->slot;
}

/* exact_sim returns the similarity of row x to the normalized query: level-independent
 * (vk_dot_exact), clamped to [-1, 1]. */
static float exact_sim(const float *x, const float *qn, size_t dim)
{
    double sim = vk_dot_exact(x, qn, dim);
    return sim > 1.0 ? 1.0f : sim < -1.0 ? -1.0f : (float)sim;
}

/* read_row returns the float row of slot off of ch for an exact score, marking its pages as
 * in use when they are mapped (vi_rows_touch: the rows kept in RAM are those searches read;
 * the recall monitor's probes, random by design, mark nothing). */
static const float *read_row(const sctx *sc, const chunk *ch, size_t off)
{
    const float *x = row_in(sc->vi, ch, off);
    if (ch->rows_mapped && sc->st->rows && !sc->probe)
        vi_rows_touch(sc->vi, sc->st->rows, x);
    return x;
}

/* skip_by_bound tells whether a monotone score, evaluated at the candidate's similarity
 * bound, already cannot beat the k-th hit (so its row need not be read). */
static bool skip_by_bound(const sctx *sc, const cand *c, const void *meta)
{
    const vindex_query *q = sc->p->q;
    if (!q->score || !q->score_monotone || !topk_worst(sc->t))
        return false;
    /* score(ub) bounds the score: the float similarity cannot exceed ub rounded up */
    float fu = c->ub >= 1.0 ? 1.0f : (float)c->ub;
    if ((double)fu < c->ub)
        fu = nextafterf(fu, INFINITY);
    double sub = q->score(fu, meta, q->ctx);
    return !isnan(sub) && cannot_beat(sc->t, sub);
}

/* clamp1 clamps a similarity to [-1, 1]. */
static double clamp1(double x)
{
    return x > 1.0 ? 1.0 : x < -1.0 ? -1.0 : x;
}

/* score_of returns the score of similarity sim for meta (sim itself without a score
 * function; -infinity for NaN, which keeps the heaps' order total). */
static double score_of(const vindex_query *q, float sim, const void *meta)
{
    if (!q->score)
        return sim;
    double s = q->score(sim, meta, q->ctx);
    return isnan(s) ? -INFINITY : s;
}

/* rank_by_code offers candidate c (kept) to the code-ranked heap with its estimated
 * similarity and the interval of its score: no float row is read. */
static void rank_by_code(const sctx *sc, const cand *c, uint64_t id, const void *meta)
{
    const vindex_query *q = sc->p->q;
    topk *t = sc->t;
    float sim = (float)clamp1(c->est);
    rhit r = {.h = {.id = id, .similarity = sim, .score = score_of(q, sim, meta)}, .slot = c->slot};
    const vindex_hit *w = topk_worst(t);
    if (w && !better(&r.h, w))
        return;
    /* the score is monotone in the similarity (rank_codes checks): the interval's ends */
    r.lo = q->score ? score_of(q, (float)clamp1(c->est - c->err), meta) : clamp1(c->est - c->err);
    r.hi = q->score ? score_of(q, (float)clamp1(c->est + c->err), meta) : clamp1(c->est + c->err);
    t->entered++;
    if (!w) {
        t->r[t->n] = r;
        heap_push(t->r, t->n, sizeof(rhit), rhit_worse);
        t->n++;
    } else {
        heap_replace_root(t->r, t->n, sizeof(rhit), &r, rhit_worse);
    }
}

/* rerank ranks the n candidates in decreasing order of their bound (a heap: most candidates
 * are never popped) until the bound cannot beat the k-th hit: exactly on their float rows,
 * or by their codes when the top k ranks from codes (sc->t->r). */
static void rerank(sctx *sc, cand *c, size_t n)
{
    const vindex *vi = sc->vi;
    const vindex_query *q = sc->p->q;
    heap_make(c, n, sizeof(cand), cand_first);
    while (n > 0) {
        heap_pop(c, n, sizeof(cand), cand_first);
        cand top = c[--n];
        if (cannot_beat(sc->t, top.ubs))
            break; /* the largest bound left: no other candidate can either */
        const chunk *ch = st_chunk(vi, sc->st, top.slot);
        size_t off = off_of(vi, top.slot);
        const void *meta = meta_in(vi, ch, off);
        if (!sc->kept_checked && q->keep && !q->keep(ch->ids[off], meta, q->ctx))
            continue;
        if (skip_by_bound(sc, &top, meta))
            continue;
        if (sc->t->r) {
            rank_by_code(sc, &top, ch->ids[off], meta);
            continue;
        }
        float sim = exact_sim(read_row(sc, ch, off), sc->p->qn, vi->dim);
        sc->reads++;
        vindex_hit hit = {.id = ch->ids[off], .similarity = sim, .score = score_of(q, sim, meta)};
        vi_offer(sc->t, &hit);
    }
}

/* sq8_ub returns the upper bound of the similarity of slot off of c from its code product. */
static double sq8_ub(const qprep *p, const chunk *c, size_t off, int64_t dot)
{
    double rn = c->sq_rn[off], e = c->sq_e[off];
    return p->qmu + (double)c->sq_scale[off] * p->qs * (double)dot + p->alpha * e + p->qperp * rn +
           p->snorm * (p->ynorm + fabs(e) + rn) + 1e-6;
}

/* sq8_cand returns the candidate of slot s (offset off of c) from its code product: the
 * bounds, and the estimate a (qq.c) qs with its error within the tie margin. The error
 * q.r of the estimate sums dim products of q's coordinates with rounding errors that are
 * independent and uniform in [-a/2, a/2]: its standard deviation is about |q| rn / sqrt(dim),
 * where the rigorous bound above is |q| rn. The query's own rounding (|s|) is kept whole. */
static cand sq8_cand(const qprep *p, const chunk *c, size_t off, int64_t dot, uint32_t s)
{
    double rn = c->sq_rn[off], e = c->sq_e[off];
    double est = p->qmu + (double)c->sq_scale[off] * p->qs * (double)dot + p->alpha * e;
    double qerr = p->snorm * (p->ynorm + fabs(e) + rn); /* the query's int16 rounding */
    double ub = est + p->qperp * rn + qerr + 1e-6;
    double err = p->tie * (p->qperp * rn + qerr) + 1e-7;
    return (cand){.ubs = score_ub(p, ub), .ub = ub, .est = est, .err = err, .slot = s};
}

/* ---- exact search ---- */

/* block_all_dead tells whether slots [off0, off0 + m) of c are all tombstones. */
static bool block_all_dead(const chunk *c, size_t off0, size_t m)
{
    for (size_t w = off0 / 64; w < (off0 + m + 63) / 64; w++) {
        size_t lo = w * 64 < off0 ? off0 - w * 64 : 0;
        size_t hi = (w + 1) * 64 > off0 + m ? off0 + m - w * 64 : 64;
        uint64_t mask =
            (hi == 64 ? ~(uint64_t)0 : (((uint64_t)1 << hi) - 1)) & ~(((uint64_t)1 << lo) - 1);
        if (~c->tomb[w] & mask)
            return false;
    }
    return true;
}

/* vi_search_exact scans every slot (FLAT: float products; SQ8: code products), see the file
 * comment; with filter_first (SQ8 codes and a keep function), keep runs on every slot first
 * and only kept slots are bounded (sc->kept_checked must be set). Shared lock held, or a
 * storage nobody else uses. */
void vi_search_exact(sctx *sc, bool use_sq8, bool filter_first)
{
    const vindex *vi = sc->vi;
    const vstore *st = sc->st;
    const qprep *p = sc->p;
    /* float summation error of unit vectors: at most (dim + 1) 2^-24; twice that plus the
     * rounding of the exact similarity */
    double slack = (double)(vi->dim + 8) * 0x1p-23;
    cand cands[BLK];
    int64_t dots[BLK];
    size_t m;
    for (size_t base = 0; base < st->nslots; base += m) {
        const chunk *c = st_chunk(vi, st, base);
        size_t off0 = off_of(vi, base);
        m = st->nslots - base < BLK ? st->nslots - base : BLK;
        if (m > c->cap - off0)
            m = c->cap - off0; /* blocks never span chunks */
        if (block_all_dead(c, off0, m))
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
                if (!p->q->keep(c->ids[off], meta_in(vi, c, off), p->q->ctx))
                    continue;
                dots[r] = vk_sq8_dot(c->sq + off * vi->sq_stride, p->qq, vi->sq_stride);
            }
            double ub = use_sq8 ? sq8_ub(p, c, off, dots[r])
                                : (double)vk_dot(row_in(vi, c, off), p->qn, vi->dim) + slack;
            double ubs = score_ub(p, ub);
            if (cannot_beat(sc->t, ubs))
                continue;
            cands[nc++] = (cand){.ubs = ubs, .ub = ub, .slot = (uint32_t)(base + r)};
        }
        rerank(sc, cands, nc);
    }
}

/* ---- ANN search ---- */

/* ann_budget returns how many candidates an ANN search gathers and bounds: the depth the
 * calibration measured for k = 10, scaled with k, at least ann_candidates and 16 k; 0 while
 * the codes are not measured (the caller scans exactly). */
static size_t ann_budget(const vindex *vi, size_t k, bool scored)
{
    size_t lo = vi->o.ann_candidates > 16 * k ? vi->o.ann_candidates : 16 * k;
    size_t d = atomic_load_explicit(&vi->depth, memory_order_relaxed);
    size_t sd = scored ? atomic_load_explicit(&vi->sdepth, memory_order_relaxed) : 0;
    if (!d)
        return 0;
    if (sd > d)
        d = sd; /* a blended ranking reaches deeper into the similarity order */
    size_t b = d * ((k + CAL_K - 1) / CAL_K);
    return b < lo ? lo : b;
}

/* The gather of the ANN search: kept slots in increasing Hamming distance, appended to
 * list. */
typedef struct gather {
    const vindex *vi;
    const vstore *st;
    const vindex_query *q;
    const uint16_t *hd; /* distance of every slot (0xffff: tombstone) */
    const uint32_t *hist;
    uint32_t *pos, *found, *list;
    size_t list_cap;
    unsigned maxh;
    size_t nl, examined, kept, cut_done;
    unsigned lo, cut_h; /* the next distance to take; a distance taken in parts so far */
} gather;

enum { PIECE = 4096 };

/* gather_range finds the slots of distances lo..hi (the first cnt of them in slot order,
 * after the part of lo a cut took before) and places them in list from g->nl in increasing
 * distance. Returns the end of what it placed (g->nl + cnt). */
static size_t gather_range(gather *g, unsigned lo, unsigned hi, size_t first, size_t cnt)
{
    size_t acc = g->nl;
    for (unsigned h = lo; h <= hi; h++) {
        g->pos[h] = (uint32_t)acc;
        acc += h == lo ? first : g->hist[h];
    }
    size_t n = g->st->nslots, limit = g->nl + cnt, skip = lo == g->cut_h ? g->cut_done : 0;
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
    return limit;
}

/* gather_keep runs keep on list[g->nl, limit), compacting the kept ones in place (order
 * preserved). */
static void gather_keep(gather *g, size_t limit)
{
    const vindex *vi = g->vi;
    size_t w = g->nl;
    for (size_t i = g->nl; i < limit; i++) {
        uint32_t s = g->list[i];
        g->examined++;
        if (g->q->keep) {
            const chunk *c = st_chunk(vi, g->st, s);
            if (!g->q->keep(c->ids[off_of(vi, s)], meta_in(vi, c, off_of(vi, s)), g->q->ctx))
                continue;
        }
        g->kept++;
        g->list[w++] = s;
    }
    g->nl = w;
}

/* gather_more appends kept slots to g->list, a range of distances at a time sized by the
 * share of slots keep accepted so far, until it holds at least goal (goal <= list_cap -
 * PIECE) or every distance was taken. A distance holding more slots than the list has
 * room for is taken in parts (cut_h, cut_done: how many of its slots, in slot order,
 * earlier parts took). */
static void gather_more(gather *g, size_t goal)
{
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
        size_t limit = gather_range(g, lo, hi, first, cnt);
        if (cut) {
            g->cut_done = (lo == g->cut_h ? g->cut_done : 0) + cnt;
            g->cut_h = lo;
        }
        gather_keep(g, limit);
        if (!cut)
            g->lo = hi + 1;
    }
}

/* hamming_all writes every slot's Hamming distance to the query into hd (tombstones 0xffff,
 * above any distance) and their histogram into hist (maxh + 2 entries). */
static void hamming_all(const sctx *sc, uint16_t *hd, uint32_t *hist, size_t maxh)
{
    const vindex *vi = sc->vi;
    const vstore *st = sc->st;
    size_t n = st->nslots;
    memset(hist, 0, (maxh + 2) * sizeof(uint32_t));
    for (size_t ci = 0; ci < st->nchunks; ci++) {
        const chunk *c = st->chunks[ci];
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
}

/* bound_batch bounds the m candidates list[b..b+m) (of nl gathered) with their int8 codes and
 * re-ranks those that could enter the top k. */
static void bound_batch(sctx *sc, const uint32_t *list, size_t b, size_t m, size_t nl)
{
    const vindex *vi = sc->vi;
    const vstore *st = sc->st;
    cand cands[ANN_BATCH];
    size_t nc = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t s = list[b + i];
        const chunk *c = st_chunk(vi, st, s);
        size_t off = off_of(vi, s);
        if (b + i + PREFETCH_AHEAD < nl) {
            /* candidates are scattered: fetch a later one's code while this one's is
             * summed (the loop is otherwise bound by memory latency) */
            uint32_t ps = list[b + i + PREFETCH_AHEAD];
            const int8_t *pc = st_chunk(vi, st, ps)->sq + off_of(vi, ps) * vi->sq_stride;
            for (size_t l = 0; l < vi->sq_stride; l += 64)
                __builtin_prefetch(pc + l);
        }
        int64_t dot = vk_sq8_dot(c->sq + off * vi->sq_stride, sc->p->qq, vi->sq_stride);
        cand cd = sq8_cand(sc->p, c, off, dot, s);
        if (!cannot_beat(sc->t, cd.ubs))
            cands[nc++] = cd;
    }
    rerank(sc, cands, nc);
}

/* search_ann runs the Hamming-prefiltered search (see the file comment) with want
 * candidates. Shared lock held. Returns 0 or -ENOMEM. */
static int search_ann(sctx *sc, size_t want)
{
    const vindex *vi = sc->vi;
    const vindex_query *q = sc->p->q;
    const vindex_opts *o = &vi->o;
    size_t n = sc->st->nslots, maxh = vi->words * 64, live = sc->st->live;
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
        if (most > live / 2)
            most = live / 2 > want ? live / 2 : want;
    }
    size_t hist_n = maxh + 2;
    size_t bytes = n * sizeof(uint16_t) + hist_n * 2 * sizeof(uint32_t) + PIECE * sizeof(uint32_t) +
                   (most + PIECE) * sizeof(uint32_t);
    unsigned char *mem = malloc(bytes);
    if (!mem)
        return -ENOMEM;
    gather g = {.vi = vi, .st = sc->st, .q = q, .maxh = (unsigned)maxh, .cut_h = UINT_MAX};
    uint32_t *hist = (uint32_t *)mem; /* the 32-bit arrays first: alignment */
    g.hist = hist;
    g.pos = hist + hist_n;
    g.found = g.pos + hist_n;
    g.list = g.found + PIECE;
    g.list_cap = most + PIECE;
    uint16_t *hd = (uint16_t *)(g.list + g.list_cap);
    g.hd = hd;
    hamming_all(sc, hd, hist, maxh);

    /* gather kept candidates in increasing distance (a step at a time, so keep runs only on
     * about as many slots as the re-rank consumes), and bound and re-rank them in Hamming
     * order, in batches */
    size_t step = min_bound > GATHER_STEP ? min_bound : GATHER_STEP;
    gather_more(&g, step < want ? step : want);
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
        size_t before = sc->t->entered;
        bound_batch(sc, g.list, b, m, nl);
        misses = sc->t->entered == before ? misses + m : 0;
    }
    free(mem);
    return 0;
}

/* bound_slots bounds the n slots of list with their int8 codes, skipping tombstones and,
 * unless keep already ran, filtered ones, and re-ranks those that could enter the top k,
 * in batches. Shared lock held. */
static void bound_slots(sctx *sc, const uint32_t *list, size_t n)
{
    const vindex *vi = sc->vi;
    const vstore *st = sc->st;
    const vindex_query *q = sc->p->q;
    cand cands[ANN_BATCH];
    size_t nc = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = list[i];
        const chunk *c = st_chunk(vi, st, s);
        size_t off = off_of(vi, s);
        if (tomb_at(c, off))
            continue;
        if (q->keep && !q->keep(c->ids[off], meta_in(vi, c, off), q->ctx))
            continue;
        int64_t dot = vk_sq8_dot(c->sq + off * vi->sq_stride, sc->p->qq, vi->sq_stride);
        cand cd = sq8_cand(sc->p, c, off, dot, s);
        if (cannot_beat(sc->t, cd.ubs))
            continue;
        cands[nc++] = cd;
        if (nc == ANN_BATCH) {
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
static int search_fx(sctx *sc, size_t want)
{
    const vindex *vi = sc->vi;
    size_t nslots = sc->st->nslots;
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
        if (labels[i] >= 0 && (size_t)labels[i] < vi->fx_n && vi->fx_slot[labels[i]] < nslots)
            list[n++] = vi->fx_slot[labels[i]];
    }
    bound_slots(sc, list, n);
    free(labels);
    uint32_t tail[256];
    for (size_t s = vi->fx_upto; s < nslots;) {
        size_t m = 0;
        while (m < 256 && s < nslots)
            tail[m++] = (uint32_t)s++;
        bound_slots(sc, tail, m);
    }
    return sc->t->n < sc->t->k ? 1 : 0;
}

/* keep_share estimates from a sample of SAMPLE slots spread over the index the share of live
 * vectors keep passes, counting one extra pass for noise (1 when too few were live). */
static double keep_share(const vindex *vi, const vstore *st, const vindex_query *q)
{
    enum { SAMPLE = 128 };
    size_t n = st->nslots, seen = 0, kept = 0;
    /* scattered, fixed positions (a regular stride could alias with periodic metadata) */
    for (uint64_t j = 1; j <= 2 * SAMPLE && seen < SAMPLE; j++) {
        size_t s = (size_t)(((j * HASH_GOLDEN64) >> 11) % n);
        const chunk *c = st_chunk(vi, st, s);
        size_t off = off_of(vi, s);
        if (tomb_at(c, off))
            continue;
        seen++;
        kept += q->keep(c->ids[off], meta_in(vi, c, off), q->ctx);
    }
    if (seen < SAMPLE / 2)
        return 1.0;
    double f = (double)(kept + 1) / (double)seen;
    return f < 1.0 ? f : 1.0;
}

/* ---- queries ---- */

/* vi_prepare fills p for q; buffers are the caller's. Returns 0 or VINDEX_E_ZERO. */
int vi_prepare(const vindex *vi, const vindex_query *q, float *qn, int16_t *qq, uint64_t *bits,
               qprep *p)
{
    size_t dim = vi->dim;
    double inv = inv_norm(q->vec, dim);
    if (inv == 0.0)
        return VINDEX_E_ZERO;
    double n2 = 0.0;
    for (size_t i = 0; i < dim; i++) {
        qn[i] = (float)(q->vec[i] * inv);
        n2 += (double)qn[i] * qn[i];
    }
    p->q = q;
    p->qn = qn;
    p->qq = qq;
    p->bits = bits;
    p->qnorm = sqrt(n2) * (1.0 + 1e-12);
    p->bounded = q->score_slope != 0.0 || q->score_bound != 0.0;
    p->qs = 1.0;
    p->snorm = 0.0;
    p->qmu = 0.0;
    p->alpha = 0.0;
    p->qperp = p->qnorm;
    p->ynorm = 1.00001;
    return 0;
}

/* vi_prepare_codes fills the int16 query (kind SQ8 and up) and the sign bits (ANN) in st's
 * frame: the query rotated in double (scratch, dim doubles), coded in int16, and its
 * product with the centre. Any rounding of the int16 code works: the bound uses the exact
 * remainder. */
void vi_prepare_codes(const vindex *vi, const vstore *st, qprep *p, int kind, double *scratch)
{
    size_t dim = vi->dim;
    const float *qn = p->qn;
    if (kind < VINDEX_KIND_SQ8)
        return;
    double *qr = scratch, m = 0.0;
    for (size_t i = 0; i < dim; i++)
        qr[i] = (double)qn[i];
    vk_rotate(qr, dim, vi->rot);
    for (size_t i = 0; i < dim; i++)
        m = fabs(qr[i]) > m ? fabs(qr[i]) : m;
    p->qs = m > 0.0 ? m / 32767.0 : 1.0;
    double s2 = 0.0, inv = 1.0 / p->qs;
    for (size_t i = 0; i < dim; i++) {
        double x = qr[i] * inv;
        long v = (long)(x >= 0 ? x + 0.5 : x - 0.5);
        v = v > 32767 ? 32767 : v < -32767 ? -32767 : v;
        p->qq[i] = (int16_t)v;
        double r = qr[i] - p->qs * (double)v;
        s2 += r * r;
    }
    for (size_t i = dim; i < vi->sq_stride; i++)
        p->qq[i] = 0;
    p->snorm = sqrt(s2) * (1.0 + 1e-9) + VK_ROT_SLACK;
    /* the codes are of R x - R c: the centre's part of the product is exact */
    p->qmu = st->center ? vk_dot_exact(qn, st->center, dim) : 0.0;
    p->ynorm = (1.0 + st->cnorm) * 1.00001;
    /* the query's part along the centre's direction, and the norm of the rest (rounded up:
     * the difference of squares loses up to about 1e-8 where the query is the direction) */
    p->alpha = st->cnorm > 0.0 ? p->qmu / st->cnorm : 0.0;
    double perp2 = p->qnorm * p->qnorm - p->alpha * p->alpha;
    p->qperp = sqrt(perp2 > 0.0 ? perp2 : 0.0) * (1.0 + 1e-9) + 1e-7;
    if (kind < VINDEX_KIND_ANN)
        return;
    /* the stored codes' definition: the signs of R q - R c */
    memset(p->bits, 0, vi->words * sizeof(uint64_t)); /* the words past dim (vi_code_words) */
    for (size_t j = 0; j < dim; j++)
        p->bits[j / 64] |= (uint64_t)(qr[j] - st->rcenter[j] > 0.0) << (j % 64);
}

/* search_faiss answers through the FAISS engine's candidates (share: the filter's estimated
 * share), or exactly when the filter is too selective for them. Shared lock held. */
static int search_faiss(sctx *sc, size_t want, double share)
{
    const vindex *vi = sc->vi;
    const vindex_query *q = sc->p->q;
    size_t live = sc->st->live;
    /* FAISS knows nothing of the filter: ask for as many more candidates as it rejects, or
     * scan exactly when that is more than the ANN path may take */
    size_t limit = vi->o.ann_max_candidates < live / 2 ? vi->o.ann_max_candidates : live / 2;
    size_t need = (size_t)((double)want / share);
    /* a blended score ranks lower similarities higher: a deeper candidate list (the native
     * path goes on while candidates keep entering the top k instead) */
    if (q->score)
        need *= 4;
    sc->kept_checked = false;
    int rc = need > limit && need > want ? 1 : search_fx(sc, need);
    if (rc == 1) {
        /* too selective a filter, FAISS failed, or the filter kept fewer than k of its
         * candidates: exact, the filter first when it is selective */
        sc->t->n = 0;
        sc->t->r = NULL; /* exact: ranked on the rows */
        rc = 0;
        sc->kept_checked = q->keep && share < 0.25;
        vi_search_exact(sc, true, sc->kept_checked);
    }
    return rc;
}

enum { RSTACK = 64 }; /* code-ranked hits a search keeps on its stack */

/* rank_codes tells whether an ANN search of q ranks its candidates from their codes (the
 * tie margin is not negative, and a score function is monotone: the ends of an estimate's
 * interval bound its score). */
static bool rank_codes(const vindex *vi, const vindex_query *q)
{
    return vi->o.tie_margin >= 0 && (!q->score || q->score_monotone);
}

/* sort_best sorts the n code-ranked hits best first (insertion: n is small, and after a
 * re-score the order is nearly kept). */
static void sort_best(rhit *r, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        rhit x = r[i];
        size_t j = i;
        for (; j > 0 && better(&x.h, &r[j - 1].h); j--)
            r[j] = r[j - 1];
        r[j] = x;
    }
}

/* resolve_ties turns the code-ranked heap of sc into the final top k (sc->t->h). The k-th
 * place is settled when the lowest lower end among the first k is above the highest upper
 * end among the runners-up; until then the float row of one of those two is read (the hit
 * of the first k first) and the hit re-scored exactly (its interval a point), and the hits
 * sorted again. So only near-ties across the k-th place are read, the nearest first, and a
 * hit that needs no row keeps its estimated similarity. Shared lock held. */
static void resolve_ties(sctx *sc)
{
    const vindex *vi = sc->vi;
    const vindex_query *q = sc->p->q;
    topk *t = sc->t;
    rhit *r = t->r;
    size_t n = t->n, k = t->k < n ? t->k : n;
    heap_sort(r, n, sizeof(rhit), rhit_worse); /* best first */
    while (n > k) {
        size_t in = 0, out = k;
        for (size_t i = 1; i < k; i++)
            in = r[i].lo < r[in].lo ? i : in;
        for (size_t i = k + 1; i < n; i++)
            out = r[i].hi > r[out].hi ? i : out;
        if (r[in].lo > r[out].hi)
            break; /* settled */
        bool in_exact = r[in].lo == r[in].hi, out_exact = r[out].lo == r[out].hi;
        if (in_exact && out_exact)
            break; /* both exact: their order is the sort's */
        size_t i = in_exact ? out : in;
        const chunk *ch = st_chunk(vi, sc->st, r[i].slot);
        size_t off = off_of(vi, r[i].slot);
        float sim = exact_sim(read_row(sc, ch, off), sc->p->qn, vi->dim);
        r[i].h.similarity = sim;
        r[i].h.score = r[i].lo = r[i].hi = score_of(q, sim, meta_in(vi, ch, off));
        sc->reads++;
        sc->tie_reads++;
        sort_best(r, n);
    }
    /* the caller sorts h: an array sorted worst first is a valid heap */
    for (size_t i = 0; i < k; i++)
        t->h[k - 1 - i] = r[i].h;
    t->n = k;
    t->r = NULL;
}

/* dispatch chooses how the prepared query is answered and answers it. Shared lock held.
 * Returns 0 or -ENOMEM. */
static int dispatch(sctx *sc)
{
    const vindex *vi = sc->vi;
    const vstore *st = sc->st;
    const vindex_query *q = sc->p->q;
    size_t want = ann_budget(vi, q->k, q->score != NULL);
    bool fb = atomic_load_explicit(&vi->exact_fb, memory_order_relaxed) != 0;
    rhit *r = sc->t->r; /* only the ANN path ranks from codes */
    sc->t->r = NULL;
    if (st->kind == VINDEX_KIND_ANN && want && st->live > 2 * want && !fb) {
        sc->kept_checked = true;
        /* a filter keeping under a tenth of the vectors (or fewer than half the budget) is
         * answered exactly, filter first: cheaper than gathering that deep (1% of 58,077 x
         * 384: 0.13 ms against 1.1 ms), and exact */
        double share = q->keep ? keep_share(vi, st, q) : 1.0;
        if (q->keep && (share < 0.1 || share * (double)st->live < (double)want / 2.0)) {
            vi_search_exact(sc, true, true);
            return 0;
        }
        if (r && rank_codes(vi, q)) {
            if (sc->t->rk > RSTACK) {
                r = sc->rfree = malloc(sc->t->rk * sizeof(rhit));
                if (!r)
                    return -ENOMEM;
            }
            sc->t->r = r;
        }
        return vi->fx ? search_faiss(sc, want, share) : search_ann(sc, want);
    }
    /* on an ANN index with k large against it, with codes not measured yet, or where the
     * calibration found no depth that reaches the recall target, the codes are scanned
     * exactly; with codes, a filter keeping under a quarter of the vectors runs first (a
     * keep call costs less than a code product) */
    bool sq8 = st->kind >= VINDEX_KIND_SQ8;
    bool first = sq8 && q->keep && st->live >= 1024 &&
                 keep_share(vi, st, q) * (double)st->live < (double)(st->live / 2) / 2.0;
    sc->kept_checked = first;
    vi_search_exact(sc, sq8, first);
    return 0;
}

/* vindex_search writes the best q->k hits into out, best first; see vindex.h. */
int vindex_search(vindex *vi, const vindex_query *q, vindex_hit *out, size_t *n)
{
    *n = 0;
    size_t dim = vi->dim;
    float qbuf[QBUF];
    double rbuf[QBUF];
    int16_t qqbuf[QBUF];
    uint64_t bbuf[QBUF / 64];
    float *qn = qbuf;
    double *rot = rbuf;
    int16_t *qq = qqbuf;
    uint64_t *bits = bbuf;
    void *heap = NULL;
    if (vi->sq_stride > QBUF) {
        heap = malloc(dim * sizeof(double) + vi->words * sizeof(uint64_t) + dim * sizeof(float) +
                      vi->sq_stride * sizeof(int16_t));
        if (!heap)
            return -ENOMEM;
        rot = heap;
        bits = (uint64_t *)(rot + dim);
        qn = (float *)(bits + vi->words);
        qq = (int16_t *)(qn + dim);
    }
    qprep p = {0};
    if (vi_prepare(vi, q, qn, qq, bits, &p) || q->k == 0) {
        free(heap);
        return q->k == 0 && p.qn ? 0 : VINDEX_E_ZERO;
    }
    /* an ANN search ranks from codes into r: the k best and as many runners-up (16 at
     * least), among which near-ties at the k-th place are decided */
    rhit hbuf[RSTACK]; /* dispatch allocates a larger one */
    size_t rk = q->k < (SIZE_MAX / sizeof(rhit) - 16) / 2 ? 2 * q->k + 16 : 0;
    p.tie = vi->o.tie_margin / sqrt((double)dim);
    topk t = {.h = out, .n = 0, .k = q->k, .r = rk ? hbuf : NULL, .rk = rk};
    rdlock(vi);
    sctx sc = {.vi = vi, .st = &vi->s, .p = &p, .t = &t, .kept_checked = false};
    /* rows read from the mapping may have to come from the file: counted */
    uint64_t faults = vi->s.rows ? vi_faults() : 0;
    if (vi->fx)
        vi_offer_query(vi, qn); /* whichever path answers: exact ones too, or the monitor of
                                 * an index that fell back to exact scans would see only
                                 * probes */
    vi_prepare_codes(vi, &vi->s, &p, vi->s.kind, rot);
    int rc = dispatch(&sc);
    if (t.r && rc == 0)
        resolve_ties(&sc);
    if (sc.reads)
        atomic_fetch_add_explicit(&vi->rows_read, sc.reads, memory_order_relaxed);
    if (sc.tie_reads)
        atomic_fetch_add_explicit(&vi->tie_reads, sc.tie_reads, memory_order_relaxed);
    atomic_fetch_add_explicit(&vi->searches, 1, memory_order_relaxed);
    if (vi->s.rows) {
        uint64_t d = vi_faults() - faults;
        if (d)
            atomic_fetch_add_explicit(&vi->page_ins, d, memory_order_relaxed);
    }
    unlock(vi);
    free(heap);
    free(sc.rfree);
    if (rc)
        return rc;
    vi_topk_sort(&t);
    *n = t.n;
    return 0;
}
