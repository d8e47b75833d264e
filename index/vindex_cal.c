/* index/vindex_cal.c: the recall calibration of the ANN kind (see vindex.h, "recall"): probe
 * queries, where their true neighbours fall in the candidate order, the depth that reaches
 * the target, and the state that carries it: in the index (the monitor, vindex_calibrate),
 * in a rebuild before its swap and in a settling build (vi_cal_build), and in snapshots
 * (vi_cal_encode, vi_cal_decode).
 *
 * A probe is answered exactly by the int8 scan (vi_search_exact); the position of each of
 * its CAL_K true neighbours in the order the ANN search gathers candidates (Hamming
 * distance, then slot) is recorded in a ring of the last CAL_RING. The depth whose recall on
 * those positions reaches target + (1 - target) / 2, plus a quarter for the sampling error,
 * is the one searches use; past ann_max_candidates (or half the live vectors) the index scans
 * exactly. The FAISS engine's candidates are no prefix of a deeper list: it is measured at
 * the depth in use, which doubles until the target holds.
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
#include "vindex_int.h"
#include "vkernel.h"

/* ---- probes ---- */

static uint64_t cal_next(vcal *c)
{
    return hash_splitmix64(&c->rng);
}

static double cal_gauss(vcal *c)
{
    double u = ((double)(cal_next(c) >> 11) + 0.5) / 9007199254740992.0;
    double w = ((double)(cal_next(c) >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

/* random_live returns a random live slot of st (live > 0). */
static size_t random_live(const vindex *vi, const vstore *st, vcal *c)
{
    for (;;) {
        size_t s = (size_t)(cal_next(c) % st->nslots);
        if (!st_tomb(vi, st, s))
            return s;
    }
}

/* make_probe writes the next probe into out (dim floats): a query that is not a stored vector
 * but lies where queries do. Even probes are a stored vector plus Gaussian noise of a
 * quarter, half or all of its distance to the centre (a paraphrase of a memory); odd ones
 * the midpoint of a stored vector and a random neighbour-in-code of it (a question between
 * two memories). */
static void make_probe(const vindex *vi, const vstore *st, vcal *c, float *out)
{
    size_t dim = vi->dim, i = c->probes++;
    size_t a = random_live(vi, st, c);
    const float *x = row_in(vi, st_chunk(vi, st, a), off_of(vi, a));
    if (i % 2 == 0) {
        static const double scale[] = {0.25, 0.5, 1.0};
        double r2 = 0.0, e2 = 0.0;
        for (size_t j = 0; j < dim; j++) {
            double d = (double)x[j] - st->center[j];
            r2 += d * d;
        }
        for (size_t j = 0; j < dim; j++) {
            out[j] = (float)cal_gauss(c);
            e2 += (double)out[j] * out[j];
        }
        double f = scale[(i / 2) % 3] * sqrt(r2) / (sqrt(e2) + 1e-30);
        for (size_t j = 0; j < dim; j++)
            out[j] = x[j] + (float)(f * out[j]);
        return;
    }
    /* a second stored vector close in code to the first: the best of a few random ones */
    const uint64_t *ca = st_chunk(vi, st, a)->bin + off_of(vi, a) * vi->words;
    size_t best = random_live(vi, st, c);
    unsigned bd = UINT_MAX;
    for (int t = 0; t < 64; t++) {
        size_t b = random_live(vi, st, c);
        if (b == a)
            continue;
        const uint64_t *cb = st_chunk(vi, st, b)->bin + off_of(vi, b) * vi->words;
        unsigned d = 0;
        for (size_t w = 0; w < vi->words; w++)
            d += (unsigned)__builtin_popcountll(ca[w] ^ cb[w]);
        if (d < bd) {
            bd = d;
            best = b;
        }
    }
    const float *y = row_in(vi, st_chunk(vi, st, best), off_of(vi, best));
    for (size_t j = 0; j < dim; j++)
        out[j] = 0.5f * (x[j] + y[j]);
}

/* exact_slots answers the prepared probe exactly over st (with shape's score when given) and
 * writes the slots of its top CAL_K into slots. Returns how many. */
static size_t exact_slots(const vindex *vi, const vstore *st, const qprep *p,
                          const vindex_query *shape, size_t *slots)
{
    vindex_hit hits[CAL_K];
    vindex_query sq = {.vec = p->q->vec, .k = CAL_K};
    qprep sp = *p;
    if (shape && shape->score) {
        sq = *shape;
        sq.vec = p->q->vec;
        sq.k = CAL_K;
        sq.keep = NULL;
        sp.bounded = sq.score_slope != 0.0 || sq.score_bound != 0.0;
    }
    sp.q = &sq;
    topk t = {.h = hits, .n = 0, .k = CAL_K};
    sctx sc = {.vi = vi, .st = st, .p = &sp, .t = &t, .kept_checked = false, .probe = true};
    vi_search_exact(&sc, true, false);
    size_t n = 0;
    for (size_t i = 0; i < t.n; i++) {
        int64_t sv = vm_find(vi, st, hits[i].id);
        if (sv >= 0)
            slots[n++] = (size_t)sv;
    }
    return n;
}

/* fx_positions writes for each of the n slots its rank among the fx_depth candidates the
 * FAISS engine returns for qn, 0 in the tail, UINT32_MAX when the search would miss it.
 * Published storage, shared lock held. Returns 0 or -ENOMEM. */
static int fx_positions(const vindex *vi, const float *qn, const size_t *slot, size_t n,
                        size_t fx_depth, uint32_t *pos)
{
    size_t want = fx_depth < vi->fx_n ? fx_depth : vi->fx_n;
    int64_t *labels = malloc(want * (sizeof(int64_t) + sizeof(float)) + 1);
    if (!labels)
        return -ENOMEM;
    float *sims = (float *)(labels + want);
    bool ok = vi->o.faiss_engine->search(vi->fx, qn, want, labels, sims) == 0;
    for (size_t i = 0; i < n; i++) {
        pos[i] = slot[i] >= vi->fx_upto ? 0 : UINT32_MAX;
        for (size_t j = 0; ok && pos[i] && j < want; j++)
            if (labels[j] >= 0 && (size_t)labels[j] < vi->fx_n && vi->fx_slot[labels[j]] == slot[i])
                pos[i] = (uint32_t)j;
    }
    free(labels);
    return 0;
}

/* code_positions writes for each of the n slots its position in the order the ANN search
 * gathers (Hamming distance hd, then slot) among st's live slots. */
static void code_positions(const vindex *vi, const vstore *st, const uint16_t *hd,
                           const size_t *slot, size_t n, uint32_t *pos)
{
    unsigned h[2 * CAL_K];
    for (size_t i = 0; i < n; i++) {
        h[i] = hd[slot[i]];
        pos[i] = 0;
    }
    for (size_t s = 0; s < st->nslots; s++) {
        if (st_tomb(vi, st, s))
            continue;
        unsigned d = hd[s];
        for (size_t i = 0; i < n; i++)
            pos[i] += d < h[i] || (d == h[i] && s < slot[i]);
    }
}

/* probe_positions runs one probe over st: the positions of its exact top CAL_K in the
 * candidate order go to pos (with fx_depth, the FAISS engine's ranks; see fx_positions),
 * and with a blended shape those of its top CAL_K by that score to spos (*nspos of them).
 * Returns the number written to pos, or -ENOMEM. */
static int probe_positions(const vindex *vi, const vstore *st, const float *probe, uint32_t *pos,
                           size_t fx_depth, const vindex_query *shape, uint32_t *spos, int *nspos)
{
    size_t dim = vi->dim, n = st->nslots;
    size_t scratch = dim * sizeof(double) + vi->words * sizeof(uint64_t) + dim * sizeof(float) +
                     vi->sq_stride * sizeof(int16_t) + n * sizeof(uint16_t);
    unsigned char *mem = malloc(scratch);
    if (!mem)
        return -ENOMEM;
    double *rot = (double *)mem;
    uint64_t *bits = (uint64_t *)(rot + dim);
    float *qn = (float *)(bits + vi->words);
    int16_t *qq = (int16_t *)(qn + dim);
    uint16_t *hd = (uint16_t *)(qq + vi->sq_stride);
    vindex_query q = {.vec = probe, .k = CAL_K};
    qprep p = {0};
    *nspos = 0;
    if (vi_prepare(vi, &q, qn, qq, bits, &p)) {
        free(mem);
        return 0;
    }
    vi_prepare_codes(vi, st, &p, VINDEX_KIND_ANN, rot);
    size_t slot[2 * CAL_K];
    size_t nh = exact_slots(vi, st, &p, NULL, slot);
    int rc = (int)nh;
    if (fx_depth) {
        if (fx_positions(vi, qn, slot, nh, fx_depth, pos))
            rc = -ENOMEM;
        free(mem);
        return rc;
    }
    size_t ns = shape && shape->score ? exact_slots(vi, st, &p, shape, slot + nh) : 0;
    for (size_t ci = 0; ci < st->nchunks; ci++) {
        const chunk *c = st->chunks[ci];
        size_t base = ci << vi->ch_shift;
        if (base >= n)
            break;
        vk_hamming(c->bin, vi->words, n - base < c->cap ? n - base : c->cap, bits, hd + base);
    }
    uint32_t all[2 * CAL_K];
    code_positions(vi, st, hd, slot, nh + ns, all);
    memcpy(pos, all, nh * sizeof(uint32_t));
    memcpy(spos, all + nh, ns * sizeof(uint32_t));
    *nspos = (int)ns;
    free(mem);
    return rc;
}

/* ---- the ring and the decision ---- */

void vi_cal_free(vcal *c)
{
    free(c->pos);
    free(c->spos);
    free(c->real);
    memset(c, 0, sizeof(*c));
    c->est = c->ann_est = NAN;
}

/* cal_alloc gives c its rings. Returns 0 or -ENOMEM. */
static int cal_alloc(vcal *c)
{
    if (!c->pos)
        c->pos = malloc(CAL_RING * sizeof(uint32_t));
    if (!c->spos)
        c->spos = malloc(CAL_RING * sizeof(uint32_t));
    if (!c->real)
        c->real = calloc(CAL_RING, 1);
    return c->pos && c->spos && c->real ? 0 : -ENOMEM;
}

/* cal_account records the bytes of vi's rings for vi_heap_bytes. cal_mu held. */
static void cal_account(vindex *vi)
{
    size_t b = vi->cal.pos ? CAL_RING * (2 * sizeof(uint32_t) + 1) : 0;
    atomic_store_explicit(&vi->cal_bytes, b, memory_order_relaxed);
}

/* cal_reset drops the samples (new codes, or a FAISS depth change). */
static void cal_reset(vcal *c)
{
    c->n = c->head = c->qn = c->sn = c->shead = 0;
    c->since = 0;
    c->measured = false;
}

/* same_data tells whether the last probes ran on the stored vectors as they are now (code
 * generation, slots, tombstones: every add, remove and rebuild changes one). Caller holds
 * cal_mu and the index's lock. */
static bool same_data(const vindex *vi, const vcal *c)
{
    return c->data_gen == vi->code_gen && c->data_slots == vi->s.nslots &&
           c->data_tombs == vi->s.ntomb;
}

/* cal_record appends one probe's positions to the rings. */
static void cal_record(vcal *c, const uint32_t *pos, int np, bool real, const uint32_t *spos,
                       int nsp)
{
    for (int j = 0; j < np; j++) {
        if (c->n == CAL_RING)
            c->qn -= c->real[c->head];
        c->pos[c->head] = pos[j];
        c->real[c->head] = real;
        c->qn += real;
        c->head = (c->head + 1) % CAL_RING;
        if (c->n < CAL_RING)
            c->n++;
    }
    for (int j = 0; j < nsp; j++) {
        c->spos[c->shead] = spos[j];
        c->shead = (c->shead + 1) % CAL_RING;
        if (c->sn < CAL_RING)
            c->sn++;
    }
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

/* the most the ANN path may bound before an exact scan of the int8 codes is cheaper */
static size_t depth_limit(const vindex *vi, size_t live)
{
    return vi->o.ann_max_candidates < live / 2 ? vi->o.ann_max_candidates : live / 2;
}

/* decide_native sets c's depth from its samples (n >= CAL_MIN) for target; cur and cur_fb
 * are what searches use now (cur 0: not measured). sorted: CAL_RING entries of scratch.
 * Returns whether cur measured below the target. */
static bool decide_native(const vindex *vi, vcal *c, double target, size_t live, size_t cur,
                          bool cur_fb, uint32_t *sorted)
{
    double goal = target + (1.0 - target) / 2.0;
    size_t n = c->n, limit = depth_limit(vi, live);
    memcpy(sorted, c->pos, n * sizeof(uint32_t));
    qsort(sorted, n, sizeof(uint32_t), cmp_u32);
    size_t hit = 0;
    while (hit < n && sorted[hit] < cur)
        hit++;
    bool was_below = cur && !cur_fb && (double)hit / (double)n < target;
    /* the depth that keeps half the allowed misses in reserve: the goal's quantile, plus a
     * quarter for the sampling error */
    size_t d = depth_for(sorted, n, goal, vi->o.ann_candidates);
    c->exact_fb = d > limit;
    c->depth = c->exact_fb ? limit : d;
    hit = 0;
    while (hit < n && sorted[hit] < c->depth)
        hit++;
    c->ann_est = (double)hit / (double)n;
    c->est = c->exact_fb ? 1.0 : c->ann_est;
    c->measured = true;
    if (c->sn >= CAL_MIN) {
        /* a blended ranking: its own depth, capped where the scan is cheaper (searches with
         * a score also go on while candidates keep entering their top k) */
        memcpy(sorted, c->spos, c->sn * sizeof(uint32_t));
        qsort(sorted, c->sn, sizeof(uint32_t), cmp_u32);
        size_t sd = depth_for(sorted, c->sn, goal, vi->o.ann_candidates);
        c->sdepth = sd > limit ? limit : sd;
    }
    return was_below;
}

/* decide_fx sets the FAISS engine's depth from c's samples, taken at c->fx_depth: kept when
 * they reach the goal, else doubled (measured anew), else exact scans past the limit.
 * Returns whether the depth in use measured below the target. */
static bool decide_fx(const vindex *vi, vcal *c, double target, size_t live, bool cur_fb)
{
    double goal = target + (1.0 - target) / 2.0;
    size_t hit = 0, cur = c->fx_depth, limit = depth_limit(vi, live);
    for (size_t i = 0; i < c->n; i++)
        hit += c->pos[i] != UINT32_MAX;
    double est = (double)hit / (double)c->n;
    bool was_below = false;
    c->ann_est = est;
    c->exact_fb = false;
    c->depth = cur;
    if (est < goal) {
        was_below = est < target && !cur_fb;
        if (cur * 2 <= limit) {
            c->depth = cur * 2;
        } else {
            c->exact_fb = true;
            c->depth = limit > cur ? limit : cur;
        }
    }
    c->est = c->exact_fb ? 1.0 : est;
    c->measured = true;
    return was_below;
}

/* publish makes c's decision the one searches use. */
static void publish_depth(vindex *vi, const vcal *c)
{
    atomic_store(&vi->depth, c->measured ? c->depth : 0);
    atomic_store(&vi->sdepth, c->measured ? c->sdepth : 0);
    atomic_store(&vi->exact_fb, c->measured && c->exact_fb ? 1 : 0);
}

/* publish_readers copies what the calibration found for vindex_get_recall. cal_mu held. */
static void publish_readers(vindex *vi)
{
    pthread_mutex_lock(&vi->pub_mu);
    vi->pub_est = vi->cal.measured ? vi->cal.est : NAN;
    vi->pub_ann_est = vi->cal.measured ? vi->cal.ann_est : NAN;
    vi->pub_samples = vi->cal.n;
    vi->pub_qsamples = vi->cal.qn;
    vi->pub_gen = vi->cal.gen;
    pthread_mutex_unlock(&vi->pub_mu);
}

/* vi_cal_build measures st's codes with CAL_BUILD_PROBES synthetic probes into c (fresh) and
 * decides the depth. Returns 0 or -ENOMEM (c then holds no decision). */
int vi_cal_build(vindex *vi, const vstore *st, vcal *c, double target, const vindex_query *shape)
{
    memset(c, 0, sizeof(*c));
    c->rng = HASH_GOLDEN64 ^ hash_mix64(st->nslots);
    c->est = c->ann_est = NAN;
    float *probe = malloc(vi->dim * sizeof(float));
    uint32_t *sorted = malloc(CAL_RING * sizeof(uint32_t));
    int rc = probe && sorted ? cal_alloc(c) : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < CAL_BUILD_PROBES; i++) {
        uint32_t pos[CAL_K], spos[CAL_K];
        int nsp = 0;
        make_probe(vi, st, c, probe);
        int np = probe_positions(vi, st, probe, pos, 0, shape, spos, &nsp);
        if (np < 0)
            rc = np;
        else
            cal_record(c, pos, np, false, spos, nsp);
    }
    if (rc == 0 && c->n >= CAL_MIN)
        decide_native(vi, c, target, st->live, 0, false, sorted);
    free(probe);
    free(sorted);
    return rc;
}

/* vi_cal_install makes c the index's calibration of code generation gen and publishes it;
 * c is emptied. cal_mu held (and wmu with the exclusive lock when the codes change with
 * it). */
void vi_cal_install(vindex *vi, vcal *c, uint64_t gen)
{
    vi_cal_free(&vi->cal);
    vi->cal = *c;
    vi->cal.gen = gen;
    if (!vi->cal.rng)
        vi->cal.rng = HASH_GOLDEN64;
    memset(c, 0, sizeof(*c));
    cal_account(vi);
    publish_depth(vi, &vi->cal);
    publish_readers(vi);
}

/* ---- the monitor ---- */

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

/* vi_offer_query copies every QS_EVERY-th query of the FAISS engine (qn: dim floats,
 * normalized) into the ring of queries the calibration takes its probes from. Never waits:
 * when the ring is busy (a calibration popping, another search copying) the query is
 * skipped, and a ring that cannot be allocated stays off. */
void vi_offer_query(vindex *vi, const float *qn)
{
    if (atomic_fetch_add_explicit(&vi->qs_tick, 1, memory_order_relaxed) % QS_EVERY != 0)
        return;
    if (pthread_mutex_trylock(&vi->qs_mu))
        return;
    if (!vi->qs_buf) {
        vi->qs_buf = malloc(QS_CAP * vi->dim * sizeof(float));
        if (vi->qs_buf)
            atomic_store_explicit(&vi->qs_bytes, QS_CAP * vi->dim * sizeof(float),
                                  memory_order_relaxed);
    }
    if (vi->qs_buf) {
        memcpy(vi->qs_buf + vi->qs_head * vi->dim, qn, vi->dim * sizeof(float));
        vi->qs_head = (vi->qs_head + 1) % QS_CAP;
        if (vi->qs_n < QS_CAP)
            vi->qs_n++;
    }
    pthread_mutex_unlock(&vi->qs_mu);
}

/* one_probe runs the next probe of the published index into vi->cal (cal_mu held; takes
 * the shared lock). *ann: the index is approximate; *fxm: the FAISS engine is measured;
 * *live: its live count. Returns 0, or -ENOMEM. */
static int one_probe(vindex *vi, float *probe, const vindex_query *shape, bool *ann, bool *fxm,
                     size_t *live)
{
    vcal *c = &vi->cal;
    rdlock(vi);
    *ann = vi->s.kind == VINDEX_KIND_ANN && vi->s.live > 0;
    *live = vi->s.live;
    if (c->gen != vi->code_gen || !*ann) {
        /* new codes: what was measured on the old ones says nothing */
        c->gen = vi->code_gen;
        cal_reset(c);
        c->probes = 0;
    }
    if (!*ann) {
        unlock(vi);
        return 0;
    }
    /* the FAISS engine is measured at the depth in use (its candidate list is not a prefix
     * of a deeper one); the ring starts over when that depth changes */
    *fxm = vi->fx != NULL;
    size_t fxd = 0;
    if (*fxm) {
        fxd = atomic_load(&vi->depth);
        fxd = fxd ? fxd : vi->o.ann_candidates;
        if (fxd != c->fx_depth) {
            c->fx_depth = fxd;
            cal_reset(c);
        }
    }
    uint32_t pos[CAL_K], spos[CAL_K];
    int nsp = 0;
    /* the FAISS engine prefers a recent real query; otherwise a synthetic probe */
    bool real = *fxm && take_query(vi, probe);
    if (!real)
        make_probe(vi, &vi->s, c, probe);
    int np = probe_positions(vi, &vi->s, probe, pos, fxd, *fxm ? NULL : shape, spos, &nsp);
    unlock(vi);
    if (np < 0)
        return np;
    cal_record(c, pos, np, real, spos, nsp);
    return 0;
}

/* vindex_calibrate measures the ANN search's recall and sets its depth; see vindex.h. */
int vindex_calibrate(vindex *vi, size_t probes, double target, vindex_recall *out)
{
    return vindex_calibrate_scored(vi, probes, target, NULL, out);
}

#if CAL_K * VINDEX_STEADY_PROBES < CAL_RING
#error "VINDEX_STEADY_PROBES must fill the calibration ring"
#endif

bool vindex_recall_steady(vindex *vi)
{
    pthread_mutex_lock(&vi->cal_mu);
    vcal *c = &vi->cal;
    rdlock(vi);
    bool steady = c->measured && same_data(vi, c) && c->since >= VINDEX_STEADY_PROBES;
    unlock(vi);
    pthread_mutex_unlock(&vi->cal_mu);
    return steady;
}

/* vindex_calibrate_scored is vindex_calibrate that also measures a blended ranking; see
 * vindex.h. */
int vindex_calibrate_scored(vindex *vi, size_t probes, double target, const vindex_query *shape,
                            vindex_recall *out)
{
    float *probe = malloc(vi->dim * sizeof(float));
    uint32_t *sorted = malloc(CAL_RING * sizeof(uint32_t));
    size_t live = 0;
    bool ann = false, fxm = false, was_below = false;
    int rc = probe && sorted ? 0 : -ENOMEM;
    pthread_mutex_lock(&vi->cal_mu);
    vcal *c = &vi->cal;
    if (rc == 0)
        rc = cal_alloc(c);
    cal_account(vi);
    rdlock(vi); /* as the probes will find it (a call without probes only decides) */
    ann = vi->s.kind == VINDEX_KIND_ANN && vi->s.live > 0;
    fxm = vi->fx != NULL;
    live = vi->s.live;
    bool fresh = c->gen == vi->code_gen;
    if (!same_data(vi, c)) {
        c->data_gen = vi->code_gen;
        c->data_slots = vi->s.nslots;
        c->data_tombs = vi->s.ntomb;
        c->since = 0;
    }
    unlock(vi);
    if (!fresh)
        cal_reset(c); /* the decision below must not use samples of other codes */
    for (size_t i = 0; rc == 0 && i < probes; i++) {
        rc = one_probe(vi, probe, shape, &ann, &fxm, &live);
        if (!ann)
            break;
        c->since++;
    }
    bool cur_fb = atomic_load(&vi->exact_fb) != 0;
    if (rc == 0 && !ann) {
        c->measured = false;
        c->est = c->ann_est = NAN;
        publish_depth(vi, c);
    } else if (rc == 0 && c->n >= CAL_MIN) {
        was_below =
            fxm ? decide_fx(vi, c, target, live, cur_fb)
                : decide_native(vi, c, target, live, atomic_load(&vi->depth), cur_fb, sorted);
        publish_depth(vi, c);
    }
    if (out) {
        rdlock(vi);
        bool kind_ann = vi->s.kind == VINDEX_KIND_ANN;
        unlock(vi);
        out->estimate = !kind_ann ? 1.0 : c->measured ? c->est : NAN;
        out->ann_estimate = c->measured ? c->ann_est : NAN;
        out->depth = atomic_load(&vi->depth);
        out->samples = c->n;
        out->query_samples = c->qn;
        out->exact_fallback = atomic_load(&vi->exact_fb) != 0;
        out->was_below = was_below;
        out->scored_depth = atomic_load(&vi->sdepth);
    }
    publish_readers(vi);
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
    bool ann = vi->s.kind == VINDEX_KIND_ANN;
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

/* ---- in snapshots ----
 *
 * u32 version (1), u32 flags (1: exact fallback, 2: measured), u64 depth, u64 scored depth,
 * f64 estimate, f64 ANN estimate, u64 probes made, u64 FAISS depth, u64 generator state,
 * u64 n, u64 head, u64 scored n, u64 scored head, u64 real-query samples, then n u32
 * positions, n u8 real-query flags, scored n u32 positions (ring slots 0 .. n - 1). */

#define CAL_HEAD 104

static void put64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

size_t vi_cal_size(const vcal *c)
{
    return CAL_HEAD + c->n * (sizeof(uint32_t) + 1) + c->sn * sizeof(uint32_t);
}

void vi_cal_encode(const vcal *c, unsigned char *out)
{
    uint32_t head[2] = {1, (c->exact_fb ? 1u : 0u) | (c->measured ? 2u : 0u)};
    double est[2] = {c->est, c->ann_est};
    uint64_t w[] = {c->depth, c->sdepth, 0,       0,     c->probes, c->fx_depth,
                    c->rng,   c->n,      c->head, c->sn, c->shead,  c->qn};
    memcpy(out, head, 8);
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
        put64(out + 8 + 8 * i, w[i]);
    memcpy(out + 24, est, 16); /* the two zeros of w */
    unsigned char *p = out + CAL_HEAD;
    memcpy(p, c->pos, c->n * sizeof(uint32_t));
    p += c->n * sizeof(uint32_t);
    memcpy(p, c->real, c->n);
    p += c->n;
    memcpy(p, c->spos, c->sn * sizeof(uint32_t));
}

/* ring_ok: a ring of n samples with its next slot at head. */
static bool ring_ok(uint64_t n, uint64_t head)
{
    return n <= CAL_RING && head < CAL_RING && (n == CAL_RING || head == n);
}

int vi_cal_decode(const unsigned char *in, size_t len, vcal *c)
{
    memset(c, 0, sizeof(*c));
    c->est = c->ann_est = NAN;
    uint32_t head[2];
    if (len < CAL_HEAD)
        return VINDEX_E_CORRUPT;
    memcpy(head, in, 8);
    uint64_t n = get64(in + 64), h = get64(in + 72), sn = get64(in + 80), sh = get64(in + 88),
             qn = get64(in + 96);
    if (head[0] != 1 || head[1] > 3 || !ring_ok(n, h) || !ring_ok(sn, sh) || qn > n ||
        len != CAL_HEAD + n * 5 + sn * 4 || get64(in + 8) > MAX_SLOTS ||
        get64(in + 16) > MAX_SLOTS || get64(in + 48) > MAX_SLOTS)
        return VINDEX_E_CORRUPT;
    double est[2];
    memcpy(est, in + 24, 16);
    if (!(isnan(est[0]) || (est[0] >= 0 && est[0] <= 1)) ||
        !(isnan(est[1]) || (est[1] >= 0 && est[1] <= 1)))
        return VINDEX_E_CORRUPT;
    if (cal_alloc(c)) {
        vi_cal_free(c);
        return -ENOMEM;
    }
    const unsigned char *p = in + CAL_HEAD;
    memcpy(c->pos, p, n * sizeof(uint32_t));
    memcpy(c->real, p + n * 4, n);
    memcpy(c->spos, p + n * 5, sn * sizeof(uint32_t));
    size_t reals = 0;
    for (size_t i = 0; i < n; i++)
        reals += c->real[i] != 0;
    if (reals != qn) {
        vi_cal_free(c);
        return VINDEX_E_CORRUPT;
    }
    c->exact_fb = head[1] & 1;
    c->measured = (head[1] & 2) != 0;
    c->depth = get64(in + 8);
    c->sdepth = get64(in + 16);
    c->est = est[0];
    c->ann_est = est[1];
    c->probes = get64(in + 40);
    c->fx_depth = get64(in + 48);
    c->rng = get64(in + 56);
    c->n = n;
    c->head = h;
    c->sn = sn;
    c->shead = sh;
    c->qn = qn;
    return 0;
}
