/* tests/unit/test_vindex.c: the vector index against an independent brute force.
 *
 * Data is low-intrinsic-dimension (x = W z + 0.3 noise, z in R^32, rows normalized), as real
 * embeddings are; i.i.d. vectors would make every similarity about 0 and every ranking a
 * coin toss. The reference keeps its own copy of every vector and metadata record and ranks
 * in double precision; the index ranks float similarities from BLAS, so scores are compared
 * position by position within SIM_EPS, and the order of the returned hits is checked exactly
 * on the values the index reports.
 *
 * Built twice: test_vindex (the native engine, every kind, edge cases, threads; links no
 * FAISS) and, with VINDEX_TEST_FAISS, test_vindex_faiss (the same workload through the
 * FAISS engine, linked with engram_vfaiss).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "vindex.h"
#ifdef VINDEX_TEST_FAISS
#include "vfaiss.h"
#endif

#define LATENT 32
#define SIM_EPS 1e-6      /* float similarity vs double cosine */
#define CODE_SIM_EPS 0.01 /* an int8 estimate vs the cosine (ANN searches) */

/* ---- deterministic randomness ---- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next_u64(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double uniform(rng *r)
{
    return (double)(next_u64(r) >> 11) / 9007199254740992.0;
}

static double gauss(rng *r)
{
    double u = uniform(r), v = uniform(r);
    if (u < 1e-300)
        u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ---- structured data ---- */

typedef struct model {
    size_t dim;
    double *w; /* dim x LATENT */
} model;

static model model_make(size_t dim, uint64_t seed)
{
    model m = {dim, malloc(dim * LATENT * sizeof(double))};
    rng r = {seed};
    for (size_t i = 0; i < dim * LATENT; i++)
        m.w[i] = gauss(&r) / sqrt((double)LATENT);
    return m;
}

/* gen_vec writes the vector of seed (the same seed always gives the same vector), scaled by
 * a random factor so that the index has to normalize it. */
static void gen_vec(const model *m, uint64_t seed, float *out)
{
    rng r = {seed * 0x2545f4914f6cdd1dULL + 17};
    double z[LATENT];
    for (int j = 0; j < LATENT; j++)
        z[j] = gauss(&r);
    double scale = 0.1 + 10.0 * uniform(&r);
    for (size_t i = 0; i < m->dim; i++) {
        double x = 0.3 * gauss(&r);
        for (int j = 0; j < LATENT; j++)
            x += m->w[i * LATENT + j] * z[j];
        out[i] = (float)(x * scale);
    }
}

static void normalize_d(const float *v, size_t dim, double *out)
{
    double s = 0;
    for (size_t i = 0; i < dim; i++)
        s += (double)v[i] * v[i];
    s = sqrt(s);
    for (size_t i = 0; i < dim; i++)
        out[i] = v[i] / s;
}

/* ---- metadata, filters and scores ---- */

typedef struct meta {
    uint8_t type;   /* 0..3 */
    uint8_t flag;   /* 0/1 */
    uint16_t level; /* 0..4: value = level / 4, coarse on purpose, to make score ties */
    uint32_t agent; /* 0..7 */
} meta;

static meta gen_meta(rng *r)
{
    meta m;
    memset(&m, 0, sizeof(m));
    m.type = (uint8_t)(next_u64(r) % 4);
    m.flag = (uint8_t)(next_u64(r) % 2);
    m.level = (uint16_t)(next_u64(r) % 5);
    m.agent = (uint32_t)(next_u64(r) % 8);
    return m;
}

typedef struct qctx {
    int filter; /* 0 none, 1 type ==, 2 agent == and flag, 3 type !=, 4 rare conjunction */
    uint8_t type;
    uint32_t agent;
    int scorer; /* 0 similarity, 1 w*sim + (1-w)*value, 2 sim - flag penalty, 3 value only,
                 * 4 sim/2 + value with no bound declared */
    double w;
} qctx;

static bool keep_fn(uint64_t id, const void *mp, void *ctx)
{
    const meta *m = mp;
    const qctx *c = ctx;
    switch (c->filter) {
    case 1:
        return m->type == c->type;
    case 2:
        return m->agent == c->agent && m->flag;
    case 3:
        return m->type != c->type;
    case 4:
        return m->agent == c->agent && m->type == c->type && m->flag && m->level >= 2;
    default:
        return true;
    }
}

static double score_fn(float sim, const void *mp, void *ctx)
{
    const meta *m = mp;
    const qctx *c = ctx;
    switch (c->scorer) {
    case 1:
        return c->w * sim + (1.0 - c->w) * (m->level / 4.0);
    case 2:
        return sim - (m->flag ? 0.2 : 0.0);
    case 3:
        return m->level / 4.0;
    case 4:
        return 0.5 * sim + m->level / 4.0;
    default:
        return sim;
    }
}

static void set_scorer(vindex_query *q, qctx *c)
{
    q->keep = c->filter ? keep_fn : NULL;
    q->ctx = c;
    q->score = c->scorer ? score_fn : NULL;
    switch (c->scorer) {
    case 1:
        q->score_slope = c->w;
        q->score_bound = 1.0 - c->w;
        break;
    case 2:
        q->score_slope = 1.0;
        q->score_bound = 0.0;
        break;
    case 3:
        q->score_slope = 0.0;
        q->score_bound = 1.0;
        break;
    case 4: /* a score without a declared bound: nothing may be skipped */
    default:
        q->score_slope = q->score_bound = 0.0;
    }
}

/* ---- the reference ---- */

typedef struct entry {
    uint64_t id;
    bool live;
    float *vec; /* as given to vindex_add */
    double *nd; /* normalized in double */
    meta m;
} entry;

typedef struct ref {
    size_t dim, n; /* n entries, live or not */
    entry *e;
} ref;

static uint64_t id_of(size_t key)
{
    return ((uint64_t)key * 0x9e3779b97f4a7c15ULL) >> 8; /* scattered, never UINT64_MAX */
}

static ref ref_make(size_t dim, size_t n)
{
    ref r = {dim, n, calloc(n, sizeof(entry))};
    for (size_t i = 0; i < n; i++) {
        r.e[i].id = id_of(i);
        r.e[i].vec = malloc(dim * sizeof(float));
        r.e[i].nd = malloc(dim * sizeof(double));
    }
    return r;
}

static void ref_free(ref *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->e[i].vec);
        free(r->e[i].nd);
    }
    free(r->e);
}

static size_t ref_live(const ref *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += r->e[i].live;
    return n;
}

static entry *ref_find(ref *r, uint64_t id)
{
    for (size_t i = 0; i < r->n; i++) {
        if (r->e[i].id == id)
            return &r->e[i];
    }
    return NULL;
}

typedef struct cand {
    double score, sim;
    uint64_t id;
} cand;

static int cand_cmp(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->sim != b->sim)
        return a->sim > b->sim ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* When check_exact is false (an ANN index answering approximately), check_search verifies
 * everything but the ranks against the brute force: the count (never under-filled), each
 * hit's numbers, the order, and adds to the recall counters. */
static bool check_exact = true;
static size_t recall_hits, recall_want;

/* check_search runs q on vi and compares with the brute force over r. Returns the number of
 * hits, or -1 when the search failed. */
static long check_search(vindex *vi, ref *r, const vindex_query *q, const char *what)
{
    size_t dim = r->dim;
    double *qn = malloc(dim * sizeof(double));
    cand *all = malloc((r->n + 1) * sizeof(cand));
    vindex_hit *hits = malloc((q->k + 1) * sizeof(vindex_hit));
    normalize_d(q->vec, dim, qn);

    size_t nb = 0;
    for (size_t i = 0; i < r->n; i++) {
        entry *e = &r->e[i];
        if (!e->live || (q->keep && !q->keep(e->id, &e->m, q->ctx)))
            continue;
        double s = 0;
        for (size_t j = 0; j < dim; j++)
            s += qn[j] * e->nd[j];
        all[nb].sim = s;
        all[nb].score = q->score ? q->score((float)s, &e->m, q->ctx) : s;
        all[nb].id = e->id;
        nb++;
    }
    qsort(all, nb, sizeof(cand), cand_cmp);

    size_t n = 12345;
    int rc = vindex_search(vi, q, hits, &n);
    CHECK_MSG(rc == 0, "%s: search rc %d", what, rc);
    if (rc) {
        free(qn);
        free(all);
        free(hits);
        return -1;
    }
    size_t want = q->k < nb ? q->k : nb;
    CHECK_MSG(n == want, "%s: %zu hits, want %zu (k %zu, %zu pass)", what, n, want, q->k, nb);

    int bad_rank = 0, bad_hit = 0, bad_order = 0;
    size_t found = 0; /* hits whose exact score reaches the true k-th best */
    for (size_t i = 0; i < n && i < want; i++) {
        /* Exactness: the i-th score is the true i-th best score. */
        if (check_exact && fabs(hits[i].score - all[i].score) > SIM_EPS)
            bad_rank++;
        /* The hit is a real candidate and its numbers are its own. */
        entry *e = ref_find(r, hits[i].id);
        if (!e || !e->live || (q->keep && !q->keep(e->id, &e->m, q->ctx))) {
            bad_hit++;
            continue;
        }
        double s = 0;
        for (size_t j = 0; j < dim; j++)
            s += qn[j] * e->nd[j];
        double sc = q->score ? q->score(hits[i].similarity, &e->m, q->ctx) : hits[i].similarity;
        found +=
            (q->score ? q->score((float)s, &e->m, q->ctx) : s) >= all[want - 1].score - SIM_EPS;
        /* an ANN search reports the int8 estimate of a hit it ranked from its code (within
         * the codes' error, under 0.01 here) */
        if (fabs(s - hits[i].similarity) > (check_exact ? SIM_EPS : CODE_SIM_EPS) ||
            sc != hits[i].score)
            bad_hit++;
        for (size_t j = 0; j < i; j++) {
            if (hits[j].id == hits[i].id)
                bad_hit++;
        }
        /* Order on the reported values: score desc, similarity desc, id asc. */
        if (i > 0) {
            const vindex_hit *a = &hits[i - 1], *b = &hits[i];
            bool ok = a->score > b->score ||
                      (a->score == b->score && (a->similarity > b->similarity ||
                                                (a->similarity == b->similarity && a->id < b->id)));
            if (!ok)
                bad_order++;
        }
    }
    if (!check_exact) {
        /* recall: the hits whose score reaches the true k-th best */
        recall_hits += found;
        recall_want += want;
    }
    CHECK_MSG(bad_rank == 0, "%s: %d ranks differ from brute force", what, bad_rank);
    CHECK_MSG(bad_hit == 0, "%s: %d hits wrong", what, bad_hit);
    CHECK_MSG(bad_order == 0, "%s: %d hits out of order", what, bad_order);
    free(qn);
    free(all);
    free(hits);
    return (long)n;
}

/* ---- state checks ---- */

typedef struct fe {
    ref *r;
    size_t seen;
    int bad;
} fe;

static int foreach_fn(uint64_t id, const float *vec, const void *mp, void *ctx)
{
    fe *f = ctx;
    f->seen++;
    entry *e = ref_find(f->r, id);
    if (!e || !e->live || memcmp(mp, &e->m, sizeof(meta)) != 0) {
        f->bad++;
        return 0;
    }
    for (size_t j = 0; j < f->r->dim; j++) {
        if (fabs(vec[j] - e->nd[j]) > 1e-6) {
            f->bad++;
            break;
        }
    }
    return 0;
}

#ifndef VINDEX_TEST_FAISS
static int stop_fn(uint64_t id, const float *vec, const void *mp, void *ctx)
{
    int *calls = ctx;
    return ++*calls == 5 ? -7 : 0;
}
#endif

static void check_state(vindex *vi, ref *r)
{
    size_t live = ref_live(r);
    CHECK(vindex_count(vi) == live);
    vindex_stats st;
    vindex_get_stats(vi, &st);
    CHECK(st.count == live);
    CHECK(st.slots == live + st.tombstones);
    CHECK(st.tombstones < 64 || st.tombstones * 4 < st.slots);
    CHECK(st.bytes == vindex_bytes(vi));
    CHECK(st.bytes >= st.slots * (r->dim * sizeof(float) + sizeof(meta)));

    fe f = {r, 0, 0};
    CHECK(vindex_foreach(vi, foreach_fn, &f) == 0);
    CHECK(f.seen == live);
    CHECK(f.bad == 0);

    float *v = malloc(r->dim * sizeof(float));
    int bad = 0;
    for (size_t i = 0; i < r->n; i++) {
        entry *e = &r->e[i];
        meta m;
        bool has = vindex_contains(vi, e->id);
        if (has != e->live) {
            bad++;
            continue;
        }
        int rc = vindex_get_meta(vi, e->id, &m);
        if (rc != (e->live ? 0 : VINDEX_E_NOT_FOUND) || (e->live && memcmp(&m, &e->m, sizeof(m))))
            bad++;
        rc = vindex_get_vector(vi, e->id, v);
        if (rc != (e->live ? 0 : VINDEX_E_NOT_FOUND)) {
            bad++;
        } else if (e->live) {
            double nn = 0;
            for (size_t j = 0; j < r->dim; j++) {
                nn += (double)v[j] * v[j];
                if (fabs(v[j] - e->nd[j]) > 1e-6)
                    bad++;
            }
            if (fabs(nn - 1.0) > 1e-5)
                bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d lookups disagree with the reference", bad);
    free(v);
}

/* ---- the randomized workload ---- */

static void bump_level(uint64_t id, void *mp, void *ctx)
{
    meta *m = mp;
    m->level = (uint16_t)((m->level + 1) % 5);
    (*(int *)ctx)++;
}

static void random_query(rng *rg, const model *md, ref *r, float *qv, qctx *c, vindex_query *q)
{
    uint64_t pick = next_u64(rg) % 10;
    size_t start = next_u64(rg) % r->n, i = 0;
    while (i < r->n && !r->e[(start + i) % r->n].live)
        i++;
    if (pick < 2 && i < r->n) { /* a stored vector itself */
        memcpy(qv, r->e[(start + i) % r->n].vec, r->dim * sizeof(float));
    } else {
        gen_vec(md, next_u64(rg) | (1ULL << 62), qv);
    }
    memset(c, 0, sizeof(*c));
    c->filter = (int)(next_u64(rg) % 5);
    c->type = (uint8_t)(next_u64(rg) % 4);
    c->agent = (uint32_t)(next_u64(rg) % 8);
    c->scorer = (int)(next_u64(rg) % 5);
    c->w = 0.3 + 0.7 * uniform(rg);
    memset(q, 0, sizeof(*q));
    q->vec = qv;
    static const size_t ks[] = {1, 2, 5, 10, 10, 50, 100, 1000, 100000};
    q->k = ks[next_u64(rg) % (sizeof(ks) / sizeof(ks[0]))];
    set_scorer(q, c);
}

static void test_workload(size_t dim, size_t nkeys, size_t initial, int rounds, int queries,
                          uint64_t seed, const vindex_opts *base, const char *label)
{
    model md = model_make(dim, seed);
    ref r = ref_make(dim, nkeys);
    rng rg = {seed ^ 0xabcdef};
    vindex_opts o = {.dim = dim, .meta_size = sizeof(meta)};
    if (base) {
        o = *base;
        o.dim = dim;
        o.meta_size = sizeof(meta);
    }
    bool maint = o.inline_compact_max == 1; /* compaction left to vindex_maintenance */
    vindex *vi = vindex_create(&o);
    CHECK(vi != NULL);
    if (!vi)
        goto out;
    CHECK(vindex_dim(vi) == dim);

    size_t gen = 0; /* vector generation: a re-added id gets a new vector */
    for (size_t i = 0; i < initial; i++) {
        entry *e = &r.e[i];
        gen_vec(&md, i + nkeys * gen, e->vec);
        normalize_d(e->vec, dim, e->nd);
        e->m = gen_meta(&rg);
        CHECK(vindex_add(vi, e->id, e->vec, &e->m) == 0);
        e->live = true;
    }
    check_state(vi, &r);

    float *qv = malloc(dim * sizeof(float));
    size_t total_hits = 0, queries_run = 0;
    for (int round = 0; round < rounds; round++) {
        gen++;
        /* A burst of removals, sometimes big enough to force a compaction. */
        size_t nrem = next_u64(&rg) % 3 == 0 ? nkeys / 3 : nkeys / 30;
        for (size_t j = 0; j < nrem; j++) {
            entry *e = &r.e[next_u64(&rg) % nkeys];
            int rc = vindex_remove(vi, e->id);
            CHECK(rc == (e->live ? 0 : VINDEX_E_NOT_FOUND));
            e->live = false;
        }
        /* Adds: new ids and re-adds of removed ones with a new vector; duplicates refused. */
        size_t nadd = nkeys / 4;
        for (size_t j = 0; j < nadd; j++) {
            size_t key = next_u64(&rg) % nkeys;
            entry *e = &r.e[key];
            if (e->live) {
                float *tmp = malloc(dim * sizeof(float));
                gen_vec(&md, key + nkeys * gen + 7, tmp);
                CHECK(vindex_add(vi, e->id, tmp, &e->m) == VINDEX_E_EXISTS);
                free(tmp);
                continue;
            }
            gen_vec(&md, key + nkeys * gen, e->vec);
            normalize_d(e->vec, dim, e->nd);
            e->m = gen_meta(&rg);
            /* upserts of new ids behave as adds */
            CHECK(((j % 3) ? vindex_add(vi, e->id, e->vec, &e->m)
                           : vindex_upsert(vi, e->id, e->vec, &e->m)) == 0);
            e->live = true;
        }
        /* Updates: a live id gets a new vector and metadata in one step. */
        for (size_t j = 0; j < nkeys / 40; j++) {
            size_t key = next_u64(&rg) % nkeys;
            entry *e = &r.e[key];
            if (!e->live)
                continue;
            gen_vec(&md, key + nkeys * gen + 3, e->vec);
            normalize_d(e->vec, dim, e->nd);
            e->m = gen_meta(&rg);
            CHECK(vindex_upsert(vi, e->id, e->vec, &e->m) == 1);
        }
        if (maint) {
            vindex_stats ms;
            vindex_get_stats(vi, &ms);
            if (ms.maintenance_due)
                CHECK(vindex_maintenance(vi) == 1);
            vindex_get_stats(vi, &ms);
            CHECK(!ms.maintenance_due);
            CHECK(vindex_maintenance(vi) == 0);
        }
        /* Metadata changes, one at a time and batched (with some absent ids). */
        for (size_t j = 0; j < nkeys / 20; j++) {
            entry *e = &r.e[next_u64(&rg) % nkeys];
            meta m = gen_meta(&rg);
            CHECK(vindex_set_meta(vi, e->id, &m) == (e->live ? 0 : VINDEX_E_NOT_FOUND));
            if (e->live)
                e->m = m;
        }
        uint64_t batch[64];
        size_t present = 0;
        for (size_t j = 0; j < 64; j++) {
            entry *e = &r.e[next_u64(&rg) % nkeys];
            bool dup = false;
            for (size_t t = 0; t < j; t++)
                dup |= batch[t] == e->id;
            batch[j] = dup ? UINT64_MAX - 1 : e->id; /* UINT64_MAX - 1 is never an id */
            if (!dup && e->live) {
                present++;
                e->m.level = (uint16_t)((e->m.level + 1) % 5);
            }
        }
        int calls = 0;
        CHECK(vindex_update_meta(vi, batch, 64, bump_level, &calls) == present);
        CHECK((size_t)calls == present);

        for (int t = 0; t < queries; t++) {
            qctx c;
            vindex_query q;
            random_query(&rg, &md, &r, qv, &c, &q);
            char what[96];
            snprintf(what, sizeof(what), "%s dim %zu round %d query %d (filter %d scorer %d k %zu)",
                     label, dim, round, t, c.filter, c.scorer, q.k);
            q.score_monotone = t % 2; /* every scorer here is monotone in the similarity */
            long n = check_search(vi, &r, &q, what);
            if (n > 0)
                total_hits += (size_t)n;
            queries_run++;
        }
        check_state(vi, &r);
    }
    vindex_stats st;
    vindex_get_stats(vi, &st);
    fprintf(stderr, "%s dim %zu: %zu queries, %zu hits, %zu live, %zu compactions, kind %d\n",
            label, dim, queries_run, total_hits, st.count, st.compactions, (int)st.kind);
    if (base && base->quant_min == 1)
        CHECK(st.kind >= VINDEX_KIND_SQ8);
    if (base && base->ann_min == 1)
        CHECK(st.kind == VINDEX_KIND_ANN);
    CHECK(st.compactions > 0);
    free(qv);
out:
    vindex_destroy(vi);
    ref_free(&r);
    free(md.w);
}

#ifndef VINDEX_TEST_FAISS

/* ---- edge cases ---- */

static void test_edges(void)
{
    enum { D = 384 };
    CHECK(vindex_create(&(vindex_opts){.dim = 0}) == NULL);
    CHECK(vindex_create(&(vindex_opts){.dim = 65537}) == NULL);
    vindex_destroy(NULL);

    vindex *vi = vindex_create(&(vindex_opts){.dim = D, .meta_size = sizeof(meta)});
    CHECK(vi != NULL);
    if (!vi)
        return;
    model md = model_make(D, 5);
    static float v[D], w[D], zero[D], q[D];
    meta m = {.type = 1, .flag = 1, .level = 3, .agent = 2}, m2;
    vindex_hit hits[8];
    size_t n = 99;

    /* Empty index. */
    CHECK(vindex_count(vi) == 0);
    gen_vec(&md, 1, q);
    vindex_query qq = {.vec = q, .k = 5};
    CHECK(vindex_search(vi, &qq, hits, &n) == 0 && n == 0);

    /* Zero and non-finite vectors have no direction. */
    CHECK(vindex_add(vi, 1, zero, &m) == VINDEX_E_ZERO);
    memcpy(w, q, sizeof(w));
    w[7] = NAN;
    CHECK(vindex_add(vi, 1, w, &m) == VINDEX_E_ZERO);
    w[7] = INFINITY;
    CHECK(vindex_add(vi, 1, w, &m) == VINDEX_E_ZERO);
    CHECK(vindex_count(vi) == 0);
    CHECK(vindex_add(vi, UINT64_MAX, q, &m) == -EINVAL);

    /* Add, duplicate id, lookups. */
    gen_vec(&md, 2, v);
    CHECK(vindex_add(vi, 10, v, &m) == 0);
    gen_vec(&md, 3, w);
    CHECK(vindex_add(vi, 10, w, &m) == VINDEX_E_EXISTS);
    float got[D];
    CHECK(vindex_get_vector(vi, 10, got) == 0);
    double dvw = 0, nv = 0;
    for (int i = 0; i < D; i++) {
        dvw += (double)got[i] * v[i];
        nv += (double)v[i] * v[i];
    }
    CHECK(fabs(dvw / sqrt(nv) - 1.0) < 1e-6); /* still the first vector, normalized */
    CHECK(vindex_get_meta(vi, 10, &m2) == 0 && memcmp(&m, &m2, sizeof(m)) == 0);
    CHECK(vindex_get_meta(vi, 11, &m2) == VINDEX_E_NOT_FOUND);
    CHECK(vindex_get_vector(vi, 11, got) == VINDEX_E_NOT_FOUND);
    CHECK(vindex_set_meta(vi, 11, &m) == VINDEX_E_NOT_FOUND);
    m2.level = 4;
    CHECK(vindex_set_meta(vi, 10, &m2) == 0);
    CHECK(vindex_get_meta(vi, 10, &m) == 0 && m.level == 4);
    CHECK(vindex_contains(vi, 10) && !vindex_contains(vi, 11));
    CHECK(vindex_remove(vi, 11) == VINDEX_E_NOT_FOUND);

    /* Query edge cases: zero query, k = 0, a query not normalized. */
    qq.vec = zero;
    CHECK(vindex_search(vi, &qq, hits, &n) == VINDEX_E_ZERO);
    qq.vec = q;
    qq.k = 0;
    n = 99;
    CHECK(vindex_search(vi, &qq, hits, &n) == 0 && n == 0);
    qq.vec = v;
    qq.k = 8;
    CHECK(vindex_search(vi, &qq, hits, &n) == 0 && n == 1);
    CHECK(hits[0].id == 10 && fabs(hits[0].similarity - 1.0) < 1e-6 &&
          hits[0].score == hits[0].similarity);

    /* Duplicates: one vector under several ids, in different places of the storage (and
     * so of the BLAS kernel's blocking); equal similarity, ties broken by id. */
    meta other = {.type = 2, .agent = 5};
    for (uint64_t id = 100; id < 2200; id++) {
        gen_vec(&md, id, w);
        CHECK(vindex_add(vi, id, w, &other) == 0);
    }
    CHECK(vindex_add(vi, 5000, v, &m) == 0); /* after 10 */
    CHECK(vindex_add(vi, 7, v, &m) == 0);    /* lowest id, last slot */
    qq.k = 3;
    CHECK(vindex_search(vi, &qq, hits, &n) == 0 && n == 3);
    CHECK(hits[0].id == 7 && hits[1].id == 10 && hits[2].id == 5000);
    CHECK(hits[0].similarity == hits[1].similarity && hits[1].similarity == hits[2].similarity);
    fprintf(stderr, "duplicate similarities: %.9g %.9g %.9g\n", hits[0].similarity,
            hits[1].similarity, hits[2].similarity);
    qq.k = 1;
    CHECK(vindex_search(vi, &qq, hits, &n) == 0 && n == 1 && hits[0].id == 7);

    /* k larger than the matches. */
    qctx c = {.filter = 4, .type = 1, .agent = 2};
    qq.k = 8;
    qq.keep = keep_fn;
    qq.ctx = &c;
    CHECK(vindex_search(vi, &qq, hits, &n) == 0 && n == 3); /* ids 7, 10, 5000 only */
    c.agent = 3;
    CHECK(vindex_search(vi, &qq, hits, &n) == 0 && n == 0);

    /* foreach stops early with fn's value. */
    int calls = 0;
    CHECK(vindex_foreach(vi, stop_fn, &calls) == -7 && calls == 5);

    /* Removing everything, then adding again. */
    for (uint64_t id = 100; id < 2200; id++)
        CHECK(vindex_remove(vi, id) == 0);
    CHECK(vindex_remove(vi, 10) == 0);
    CHECK(vindex_remove(vi, 10) == VINDEX_E_NOT_FOUND);
    CHECK(vindex_count(vi) == 2);
    vindex_stats st;
    vindex_get_stats(vi, &st);
    CHECK(st.compactions > 0 && st.slots < 100);
    qq.keep = NULL;
    qq.k = 8;
    CHECK(vindex_search(vi, &qq, hits, &n) == 0 && n == 2);
    CHECK(hits[0].id == 7 && hits[1].id == 5000);
    CHECK(vindex_add(vi, 10, v, &m) == 0);
    CHECK(vindex_search(vi, &qq, hits, &n) == 0 && n == 3 && hits[1].id == 10);
    vindex_destroy(vi);

    /* meta_size 0: metadata pointers are NULL, meta arguments ignored. */
    vi = vindex_create(&(vindex_opts){.dim = 8});
    CHECK(vi != NULL);
    float a[8] = {1, 0, 0, 0, 0, 0, 0, 0}, b[8] = {1, 1, 0, 0, 0, 0, 0, 0};
    CHECK(vindex_add(vi, 1, a, NULL) == 0);
    CHECK(vindex_add(vi, 2, b, NULL) == 0);
    CHECK(vindex_get_meta(vi, 1, NULL) == 0);
    CHECK(vindex_set_meta(vi, 2, NULL) == 0);
    qq = (vindex_query){.vec = b, .k = 2};
    CHECK(vindex_search(vi, &qq, hits, &n) == 0 && n == 2 && hits[0].id == 2 && hits[1].id == 1 &&
          fabs(hits[1].similarity - sqrt(0.5)) < 1e-6);
    vindex_destroy(vi);
    free(md.w);
}

/* ---- concurrency: 2 searchers, 1 writer ---- */

enum { MT_DIM = 384, MT_KEYS = 3000 };

typedef struct mt {
    vindex *vi;
    model *md;
    ref *r;
    int done; /* set by the writer when it finishes; under mu */
    pthread_mutex_t mu;
    int searches, bad;
} mt;

static bool mt_done(mt *s)
{
    pthread_mutex_lock(&s->mu);
    bool d = s->done;
    pthread_mutex_unlock(&s->mu);
    return d;
}

static void *mt_writer(void *arg)
{
    mt *s = arg;
    rng rg = {99};
    float *v = malloc(MT_DIM * sizeof(float));
    for (int op = 0; op < 6000; op++) {
        size_t key = next_u64(&rg) % MT_KEYS;
        entry *e = &s->r->e[key];
        if (key < 100) /* keep at least 100 vectors live at all times */
            continue;
        if (e->live) {
            if (vindex_remove(s->vi, e->id) == 0)
                e->live = false;
            else
                s->bad++;
        } else {
            gen_vec(s->md, key, v); /* a key always has the same vector */
            meta m = gen_meta(&rg);
            if (vindex_add(s->vi, e->id, v, &m) == 0) {
                e->live = true;
                e->m = m;
            } else {
                s->bad++;
            }
        }
    }
    free(v);
    pthread_mutex_lock(&s->mu);
    s->done = 1;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void *mt_searcher(void *arg)
{
    mt *s = arg;
    rng rg = {(uint64_t)(uintptr_t)&rg};
    float *q = malloc(MT_DIM * sizeof(float)), *v = malloc(MT_DIM * sizeof(float));
    double *qn = malloc(MT_DIM * sizeof(double)), *vn = malloc(MT_DIM * sizeof(double));
    vindex_hit hits[10];
    int searches = 0, bad = 0;
    while (!mt_done(s) || searches < 10) {
        gen_vec(s->md, next_u64(&rg) | (1ULL << 62), q);
        normalize_d(q, MT_DIM, qn);
        vindex_query qq = {.vec = q, .k = 10};
        size_t n = 0;
        if (vindex_search(s->vi, &qq, hits, &n) != 0 || n != 10) {
            bad++;
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            /* Each hit's similarity is that of its key's fixed vector. */
            size_t key = MT_KEYS;
            for (size_t k = 0; k < MT_KEYS; k++) {
                if (id_of(k) == hits[i].id) {
                    key = k;
                    break;
                }
            }
            if (key == MT_KEYS) {
                bad++;
                continue;
            }
            gen_vec(s->md, key, v);
            normalize_d(v, MT_DIM, vn);
            double d = 0;
            for (size_t j = 0; j < MT_DIM; j++)
                d += qn[j] * vn[j];
            if (fabs(d - hits[i].similarity) > SIM_EPS)
                bad++;
            if (i > 0 && hits[i].score > hits[i - 1].score)
                bad++;
        }
        searches++;
    }
    pthread_mutex_lock(&s->mu);
    s->searches += searches;
    s->bad += bad;
    pthread_mutex_unlock(&s->mu);
    free(q);
    free(v);
    free(qn);
    free(vn);
    return NULL;
}

static void test_threads(void)
{
    model md = model_make(MT_DIM, 1234);
    ref r = ref_make(MT_DIM, MT_KEYS);
    rng rg = {4321};
    vindex *vi = vindex_create(&(vindex_opts){.dim = MT_DIM, .meta_size = sizeof(meta)});
    CHECK(vi != NULL);
    if (!vi)
        goto out;
    for (size_t k = 0; k < MT_KEYS; k++) {
        entry *e = &r.e[k];
        gen_vec(&md, k, e->vec);
        normalize_d(e->vec, MT_DIM, e->nd);
        if (k % 2 == 0 || k < 100) {
            e->m = gen_meta(&rg);
            CHECK(vindex_add(vi, e->id, e->vec, &e->m) == 0);
            e->live = true;
        }
    }
    mt s = {.vi = vi, .md = &md, .r = &r};
    pthread_mutex_init(&s.mu, NULL);
    pthread_t w, a, b;
    CHECK(pthread_create(&a, NULL, mt_searcher, &s) == 0);
    CHECK(pthread_create(&b, NULL, mt_searcher, &s) == 0);
    CHECK(pthread_create(&w, NULL, mt_writer, &s) == 0);
    pthread_join(w, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    pthread_mutex_destroy(&s.mu);
    vindex_stats st;
    vindex_get_stats(vi, &st);
    fprintf(stderr, "threads: %d searches during 6000 writes, %zu compactions\n", s.searches,
            st.compactions);
    CHECK(s.bad == 0);
    CHECK(s.searches >= 20);

    /* The final state against brute force. */
    check_state(vi, &r);
    float q[MT_DIM];
    for (int t = 0; t < 30; t++) {
        gen_vec(&md, 77777 + (uint64_t)t, q);
        qctx c = {.filter = t % 5,
                  .type = (uint8_t)(t % 4),
                  .agent = (uint32_t)(t % 8),
                  .scorer = t % 5,
                  .w = 0.6};
        vindex_query qq = {.vec = q, .k = (size_t)(1 + t * 7)};
        set_scorer(&qq, &c);
        check_search(vi, &r, &qq, "after threads");
    }
out:
    vindex_destroy(vi);
    ref_free(&r);
    free(md.w);
}

/* vindex_touch_meta: the atomic range must be 8-byte words inside the metadata; a touch
 * changes the stored words of present ids only, get_meta and the score callback see them at
 * once, the rest of the metadata is as written, and a rebuild (maintenance after removes)
 * carries the touched words over. */
typedef struct tmeta {
    uint32_t group, pad;
    uint64_t hits; /* the atomic range */
} tmeta;

static void touch_hits(uint64_t id, void *m, void *ctx)
{
    tmeta *t = m;
    vindex_meta_word_store(&t->hits, vindex_meta_word(&t->hits) + *(const uint64_t *)ctx);
}

static double hits_score(float sim, const void *m, void *ctx)
{
    (void)ctx;
    return sim + 0.001 * (double)vindex_meta_word(&((const tmeta *)m)->hits);
}

static void test_touch_meta(void)
{
    enum { D = 32, N = 700 };
    vindex_opts bad = {
        .dim = D, .meta_size = sizeof(tmeta), .meta_atomic_off = 4, .meta_atomic_len = 8};
    CHECK(vindex_create(&bad) == NULL); /* not word-aligned */
    bad.meta_atomic_off = 8;
    bad.meta_atomic_len = 16;
    CHECK(vindex_create(&bad) == NULL); /* past the end */
    bad.meta_size = 12;
    bad.meta_atomic_off = 0;
    bad.meta_atomic_len = 8;
    CHECK(vindex_create(&bad) == NULL); /* metadata not a multiple of 8 */

    vindex_opts o = {.dim = D,
                     .meta_size = sizeof(tmeta),
                     .meta_atomic_off = 8,
                     .meta_atomic_len = 8,
                     .inline_compact_max = 1};
    vindex *vi = vindex_create(&o);
    CHECK(vi != NULL);
    if (!vi)
        return;
    model md = model_make(D, 11);
    static float v[D];
    for (uint64_t id = 0; id < N; id++) {
        gen_vec(&md, 300 + id, v);
        tmeta m = {.group = (uint32_t)id % 5, .pad = 77};
        CHECK(vindex_add(vi, id, v, &m) == 0);
    }
    uint64_t ids[3] = {5, 6, N + 5}, one = 1, two = 2;
    CHECK(vindex_touch_meta(vi, ids, 3, touch_hits, &one) == 2);
    CHECK(vindex_touch_meta(vi, ids, 1, touch_hits, &two) == 1);
    tmeta got;
    CHECK(vindex_get_meta(vi, 5, &got) == 0 && got.hits == 3 && got.group == 0 && got.pad == 77);
    CHECK(vindex_get_meta(vi, 6, &got) == 0 && got.hits == 1 && got.group == 1);
    CHECK(vindex_get_meta(vi, 7, &got) == 0 && got.hits == 0);

    /* the score callback sees the touched words: 6's own vector finds it with its bonus */
    for (int i = 0; i < 1000; i++)
        CHECK(vindex_touch_meta(vi, &ids[1], 1, touch_hits, &one) == 1);
    gen_vec(&md, 300 + 6, v);
    vindex_hit h[2];
    size_t n = 0;
    vindex_query q = {
        .vec = v, .k = 2, .score = hits_score, .score_slope = 1.0, .score_bound = 1.1};
    CHECK(vindex_search(vi, &q, h, &n) == 0 && n == 2 && h[0].id == 6);
    CHECK(h[0].score > 1.9); /* 1 + 0.001 * 1001 */

    /* removes, then a rebuild: the touched words move with their vectors */
    for (uint64_t id = 100; id < 400; id++)
        CHECK(vindex_remove(vi, id) == 0);
    (void)vindex_maintenance(vi);
    vindex_stats st;
    vindex_get_stats(vi, &st);
    CHECK(st.tombstones == 0 && st.count == N - 300);
    CHECK(vindex_get_meta(vi, 5, &got) == 0 && got.hits == 3 && got.pad == 77);
    CHECK(vindex_get_meta(vi, 6, &got) == 0 && got.hits == 1001);
    vindex_destroy(vi);
    free(md.w);
}

/* A rebuild goes down a kind once the live count falls below half its threshold, and then
 * has nothing more to do (it used to go back up in the same rebuild, so maintenance stayed
 * due and rebuilt on every call). */
static void test_kind_down(void)
{
    enum { D = 64 };
    vindex *vi = vindex_create(&(vindex_opts){.dim = D, .inline_compact_max = 1});
    CHECK(vi != NULL);
    if (!vi)
        return;
    model md = model_make(D, 9);
    static float v[D];
    for (uint64_t id = 0; id < 600; id++) {
        gen_vec(&md, 100 + id, v);
        CHECK(vindex_add(vi, id, v, NULL) == 0);
    }
    vindex_stats st;
    vindex_get_stats(vi, &st);
    CHECK(st.kind == VINDEX_KIND_SQ8); /* 600 >= quant_min 512 */
    for (uint64_t id = 200; id < 600; id++)
        CHECK(vindex_remove(vi, id) == 0);
    vindex_get_stats(vi, &st);
    CHECK(st.maintenance_due);
    CHECK(vindex_maintenance(vi) == 1);
    vindex_get_stats(vi, &st);
    CHECK(st.kind == VINDEX_KIND_FLAT); /* 200 < 512 / 2 */
    CHECK(st.count == 200 && st.tombstones == 0);
    CHECK(!st.maintenance_due);
    CHECK(vindex_maintenance(vi) == 0);
    /* still answers exactly: the nearest of the remaining ids to its own vector is itself */
    gen_vec(&md, 100 + 17, v);
    vindex_hit hits[1];
    size_t n = 0;
    CHECK(vindex_search(vi, &(vindex_query){.vec = v, .k = 1}, hits, &n) == 0 && n == 1 &&
          hits[0].id == 17);
    vindex_destroy(vi);
    free(md.w);
}

#endif /* !VINDEX_TEST_FAISS */

/* With the argument "threads" only the concurrent test runs (the ThreadSanitizer build runs
 * just that). */
int main(int argc, char **argv)
{
#ifndef VINDEX_TEST_FAISS
    if (argc > 1 && strcmp(argv[1], "threads") == 0) {
        test_threads();
        CHECK_RETURN();
    }
#else
    (void)argc;
    (void)argv;
#endif
#ifndef VINDEX_TEST_FAISS
    test_edges();
    test_kind_down();
    test_touch_meta();
    /* default options: FLAT below 512 live vectors, SQ8 above */
    test_workload(384, 3000, 2500, 12, 60, 1, NULL, "default");
    test_workload(768, 1500, 1200, 6, 40, 2, NULL, "default");
    test_workload(16, 400, 300, 20, 50, 3, NULL, "default"); /* small dim: many near-ties */
    /* every kind forced, compaction in place or by maintenance */
    vindex_opts flat = {.quant_min = SIZE_MAX, .ann_min = SIZE_MAX};
    vindex_opts sq8 = {.quant_min = 1, .ann_min = SIZE_MAX, .inline_compact_max = 1};
    test_workload(384, 2000, 1500, 6, 40, 4, &flat, "flat");
    test_workload(384, 2000, 1500, 6, 40, 5, &sq8, "sq8");
    test_workload(33, 600, 500, 10, 50, 6, &sq8, "sq8"); /* dims not a multiple of 32 */
    test_workload(100, 600, 500, 10, 50, 7, &flat, "flat");
    /* An ANN index whose candidate budget exceeds half the count: the ANN path only runs
     * when the live count exceeds twice the budget, so these searches scan the codes
     * exactly; then with a budget of 64 the ANN path itself, approximately */
    vindex_opts ann_exact = {
        .quant_min = 1, .ann_min = 1, .ann_candidates = 1 << 20, .inline_compact_max = 1};
    test_workload(256, 2000, 1500, 6, 40, 8, &ann_exact, "ann-exact");
    vindex_opts ann = {.quant_min = 1,
                       .ann_min = 1,
                       .ann_candidates = 32,
                       .ann_max_candidates = 64,
                       .inline_compact_max = 1};
    check_exact = false;
    test_workload(256, 3000, 2500, 6, 40, 9, &ann, "ann");
    test_workload(70, 3000, 2500, 6, 40, 10, &ann, "ann"); /* words not a multiple of 4 */
    check_exact = true;
#else
    vindex_opts ann_exact = {
        .quant_min = 1, .ann_min = 1, .ann_candidates = 1 << 20, .inline_compact_max = 1};
    vindex_opts ann = {.quant_min = 1,
                       .ann_min = 1,
                       .ann_candidates = 32,
                       .ann_max_candidates = 64,
                       .inline_compact_max = 1};
    /* the FAISS engine, through the same workload: exact where the budget covers the index,
     * approximate (HNSW candidates plus the exact tail) otherwise */
    vindex_opts fx = ann;
    fx.engine = VINDEX_ENGINE_FAISS;
    fx.faiss_factory = "HNSW32,Flat";
    fx.faiss_ef_search = 64;
    fx.faiss_engine = vfaiss_engine();
    check_exact = false;
    test_workload(256, 3000, 2500, 6, 40, 11, &fx, "faiss");
    check_exact = true;
    vindex_opts fx_exact = ann_exact;
    fx_exact.engine = VINDEX_ENGINE_FAISS;
    fx_exact.faiss_factory = "HNSW32,Flat";
    fx_exact.faiss_engine = vfaiss_engine();
    test_workload(128, 2000, 1500, 4, 40, 12, &fx_exact, "faiss-exact");
#endif
    double recall = recall_want ? (double)recall_hits / (double)recall_want : 0.0;
    fprintf(stderr, "ann recall over the workloads: %.4f (%zu of %zu)\n", recall, recall_hits,
            recall_want);
    CHECK(recall_want > 1000 && recall >= 0.9);
#ifndef VINDEX_TEST_FAISS
    test_threads();
#endif
    CHECK_RETURN();
}
