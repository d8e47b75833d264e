/* server/methods/m_search.c: memory.search and memory.context.
 *
 * One pipeline serves both: parse the filter; if it has an attrs containment, ask
 * PostgreSQL for the matching ids; in text and hybrid modes run the full-text query; wait
 * for the tenant's index; run the exact filtered vector search; fuse; count the accesses;
 * fetch the rows; pack the results or the <agent_memory> block.
 *
 * Ranking. vector: score = w * similarity + (1 - w) * composite. text: PostgreSQL's
 * ts_rank_cd of the query against the content. hybrid: reciprocal rank fusion of the
 * vector and text rankings, score = sum over both lists of 1 / (60 + rank), where rank
 * starts at 1 and a memory missing from a list contributes nothing for it.
 *
 * min_similarity drops every candidate whose cosine similarity is below it before the cut
 * to top_k: in the vector ranking its score is below every passing one (so the index ranks
 * it after every memory that passes), and every mode drops it after ranking.
 *
 * memory.context packs the results that fit the token budget as the <agent_memory> block
 * or as search-result items: ctxblock.h renders them. memory.prompt (m_prompt.c) runs the
 * same pipeline through msearch.h and gets the block back.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "app.h"
#include "ctxblock.h"
#include "reqembed.h"
#include "handlers.h"
#include "log.h"
#include "memfilter.h"
#include "reqfilter.h"
#include "mempack.h"
#include "plimits.h"
#include "rowcache.h"
#include "memrow.h"
#include "msearch.h"
#include "sql.h"
#include "tenants.h"
#include "ubuf.h"

#define RRF_K 60.0
#define HYBRID_MIN_CANDIDATES 50

enum { MODE_VECTOR, MODE_TEXT, MODE_HYBRID };

/* memory.context's parameters after the search ones. */
enum { P_CX_BUDGET_TOKENS = P_SE__END, P_CX_FORMAT, P_CX_ORDER };

static const char *const formats[] = {"xml", "search_results", NULL};
static const char *const orders[] = {"rank", "stable", NULL};
ENUMS(memory_search, {"type_filter", enum_memory_types}, {"scopes", enum_scopes},
      {"mode", enum_search_modes});
ENUMS(memory_context, {"type_filter", enum_memory_types}, {"scopes", enum_scopes},
      {"mode", enum_search_modes}, {"format", formats}, {"order", orders});
PARAMS(memory_search, SEARCH_PARAMS);
PARAMS(memory_context, SEARCH_PARAMS,
       {"budget_tokens", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 1000000},
       {"format", RPC_T_STR, RPC_P_NULLABLE, 0, 0}, {"order", RPC_T_STR, RPC_P_NULLABLE, 0, 0});

typedef struct result {
    uint64_t id;
    double score;
    bool has_sim;
    float similarity;
    double composite;
    mem_meta meta; /* as scored (tags not valid) */
} result;

typedef struct search_state {
    bool context;         /* memory.context, or a block for search_block's caller */
    search_block_fn done; /* search_block: where the block goes */
    void *done_ctx;
    uint64_t max_bytes;  /* search_block: the block's byte cap */
    bool count;          /* the results count as accesses (count_access, default true) */
    bool search_results; /* memory.context format "search_results" */
    bool stable;         /* memory.context order "stable" */
    int mode;
    mem_filter f;
    size_t k;
    size_t ncand; /* candidates per ranking (hybrid needs more than k) */
    double w;
    bool has_min;   /* min_similarity given: results below min_sim are dropped */
    double min_sim; /* compared with the cosine similarity, not the score */
    size_t nbelow;  /* candidates left out below min_sim (the answer's below_min_similarity) */
    uint64_t budget;
    const char *query;
    float *qvec;   /* NULL in text mode without a query vector */
    bool have_vec; /* the request gave the vector (no embedding needed) */
    tenant *t;
    uint64_t *text_ids;
    double *text_rank;
    size_t ntext;
    result *res;
    size_t nres;
    memrow *rows; /* rows[i]: the row of res[i], when have[i] */
    bool *have;
} search_state;

static void release_tenant(void *arg)
{
    search_state *st = arg;
    tenants_put(st->t);
    st->t = NULL;
}

static void free_attr_ids(void *arg)
{
    idmap_destroy(arg);
}

static bool keep_cb(uint64_t id, const void *meta, void *ctx)
{
    const search_state *st = ctx;
    return mf_keep(&st->f, id, meta);
}

/* Whether every hit passes the request's filter, by the index's metadata as it is now (a
 * hit deleted meanwhile does not). */
static bool hits_kept(const search_state *st, vindex *vi, const vindex_hit *hits, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        mem_meta m;
        if (vindex_get_meta(vi, hits[i].id, &m) != 0 || !mf_keep(&st->f, hits[i].id, &m))
            return false;
    }
    return true;
}

static double score_cb(float sim, const void *meta, void *ctx)
{
    const search_state *st = ctx;
    const mem_meta *m = meta;
    /* Below min_similarity: a score under every passing one (those are >= 0), still ordered
     * by similarity so the index's search stops as a similarity search would (at -infinity
     * they would all tie and keep entering its top k); dropped after the search. Still
     * monotone in the similarity and within the bound score_slope * sim + score_bound. */
    if (st->has_min && (double)sim < st->min_sim)
        return (double)sim - 10.0;
    double c = score_composite(st->f.sp, m->created_ms, mem_meta_access_count(m), m->cited,
                               m->injected, m->importance, st->f.now_ms);
    return score_blend(st->w, sim, c);
}

/* ---- the last steps: rows, then the response ------------------------------------------ */

/* Counts one access to each of the n memories: the index now, PostgreSQL in a batch. */
static void count_access(req *r, search_state *st, const uint64_t *ids, size_t n)
{
    if (req_is_again(r) || !st->count)
        return; /* counted when it ran the first time (its answer waited for budget), or
                 * a look that must not change the ranking (count_access false) */
    tenants_touch(st->t, ids, n, st->f.now_ms);
    access_log_add(app_access(req_worker(r)), req_auth(r)->tenant_id, ids, n, st->f.now_ms);
}

static void pack_context(req *r, search_state *st)
{
    ctxb_opts o = {.search_results = st->search_results,
                   .stable = st->stable,
                   .budget = st->budget,
                   .max_bytes = st->max_bytes,
                   .now_ms = st->f.now_ms,
                   .tenant_id = req_auth(r)->tenant_id};
    ctxb_block b;
    uint64_t *ids = req_alloc(r, (st->nres + 1) * sizeof(*ids));
    if (!ids || ctxb_build(st->rows, st->have, st->nres, &o, &b) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    size_t n = b.n;
    for (size_t k = 0; k < n; k++)
        ids[k] = b.items[k].id;
    if (n)
        count_access(r, st, ids, n);
    if (st->done) {
        st->done(r, st->done_ctx, &b);
        ctxb_fini(&b);
        return;
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 3);
    if (st->search_results) {
        rpc_pack_cstr(pk, "items");
        msgpack_pack_array(pk, (uint32_t)n);
        for (size_t k = 0; k < n; k++) {
            const memrow *m = &st->rows[b.items[k].idx];
            msgpack_pack_map(pk, 3);
            rpc_pack_kv_str(pk, "source", b.items[k].source);
            rpc_pack_kv_str(pk, "title", b.items[k].title);
            rpc_pack_cstr(pk, "content");
            rpc_pack_strn(pk, m->content, m->content_len);
        }
    } else {
        rpc_pack_cstr(pk, "text");
        rpc_pack_strn(pk, (const char *)b.text.data, b.text.len);
    }
    rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t k = 0; k < n; k++)
        msgpack_pack_uint64(pk, ids[k]);
    rpc_pack_kv_uint(pk, "tokens_used", b.tokens_used);
    ctxb_fini(&b);
    req_done(r);
}

/* Packs the response from the rows of the results (a result without one was deleted
 * since the search and is left out). */
static void search_finish(req *r, search_state *st)
{
    if (st->context) {
        pack_context(r, st);
        return;
    }
    uint32_t n = 0;
    for (size_t i = 0; i < st->nres; i++)
        n += st->have[i];
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, st->has_min ? 2 : 1);
    if (st->has_min)
        rpc_pack_kv_uint(pk, "below_min_similarity", st->nbelow);
    rpc_pack_cstr(pk, "results");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < st->nres; i++) {
        if (!st->have[i])
            continue;
        const result *x = &st->res[i];
        /* the index's count saturates (MEM_ACCESS_COUNT_MAX): past it the row's is truer */
        uint64_t count = mem_meta_access_count(&x->meta);
        if (count == MEM_ACCESS_COUNT_MAX && st->rows[i].access_count > (int64_t)count)
            count = (uint64_t)st->rows[i].access_count;
        mp_fresh fresh = {
            .set = true, .access_count = count, .last_access_ms = mem_meta_last_access(&x->meta)};
        mp_pack_memory(pk, &st->rows[i], &fresh, 3);
        if (x->has_sim)
            rpc_pack_kv_num(pk, "similarity", x->similarity);
        else
            rpc_pack_kv_nil(pk, "similarity");
        rpc_pack_kv_num(pk, "composite", x->composite);
        rpc_pack_kv_num(pk, "score", x->score);
    }
    req_done(r);
}

static void *req_arena_alloc(void *ctx, size_t n)
{
    return req_alloc(ctx, n);
}

/* The rows the cache did not have: rows come back in the order of the ids asked, which is
 * the results' order; they go into the cache too. */
static void search_rows(req *r, const db_result *res)
{
    search_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    rowcache *rc = req_server(r)->rows;
    int64_t tid_owner = req_auth(r)->tenant_id;
    int nrows = PQntuples(pr), row = 0;
    for (size_t i = 0; i < st->nres && row < nrows; i++) {
        if (st->have[i])
            continue;
        memrow m;
        if (memrow_parse(pr, row, 0, &m) != 0) {
            req_fail(r, RPC_INTERNAL, "malformed memory row");
            return;
        }
        if (m.id != st->res[i].id)
            continue; /* deleted since the search */
        row++;
        st->rows[i] = m; /* points into pr, which outlives search_finish below */
        st->have[i] = true;
        rc_put(rc, tid_owner, &m);
    }
    search_finish(r, st);
}

/* Fills each result's similarity, metadata and composite from the index. */
static void describe(search_state *st, vindex *vi)
{
    size_t dim = vindex_dim(vi);
    float *v = st->qvec ? malloc(dim * sizeof(float)) : NULL;
    double qn = 0;
    for (size_t k = 0; st->qvec && k < dim; k++)
        qn += (double)st->qvec[k] * st->qvec[k];
    qn = sqrt(qn);
    for (size_t i = 0; i < st->nres; i++) {
        result *x = &st->res[i];
        if (vindex_get_meta(vi, x->id, &x->meta) == 0) {
            x->meta.tags = NULL;
            x->meta.ntags = 0;
            x->composite =
                score_composite(st->f.sp, x->meta.created_ms, mem_meta_access_count(&x->meta),
                                x->meta.cited, x->meta.injected, x->meta.importance, st->f.now_ms);
        }
        if (!x->has_sim && v && qn > 0 && vindex_get_vector(vi, x->id, v) == 0) {
            double dot = 0;
            for (size_t k = 0; k < dim; k++)
                dot += (double)v[k] * st->qvec[k];
            x->similarity = (float)(dot / qn);
            x->has_sim = true;
        }
    }
    free(v);
}

static int cmp_result(const void *a, const void *b)
{
    const result *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Reciprocal rank fusion of the vector hits and the text ids into st->res. */
static int fuse(req *r, search_state *st, const vindex_hit *hits, size_t nhits)
{
    size_t cap = nhits + st->ntext;
    result *all = req_alloc(r, (cap + 1) * sizeof(*all));
    idmap *pos = idmap_create(cap + 1);
    if (!all || !pos) {
        idmap_destroy(pos);
        return -ENOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < nhits; i++) {
        memset(&all[n], 0, sizeof(all[n]));
        all[n].id = hits[i].id;
        all[n].score = 1.0 / (RRF_K + (double)(i + 1));
        all[n].has_sim = true;
        all[n].similarity = hits[i].similarity;
        idmap_put(pos, hits[i].id, n);
        n++;
    }
    for (size_t i = 0; i < st->ntext; i++) {
        uint64_t p;
        double add = 1.0 / (RRF_K + (double)(i + 1));
        if (idmap_get(pos, st->text_ids[i], &p)) {
            all[p].score += add;
            continue;
        }
        memset(&all[n], 0, sizeof(all[n]));
        all[n].id = st->text_ids[i];
        all[n].score = add;
        idmap_put(pos, st->text_ids[i], n);
        n++;
    }
    idmap_destroy(pos);
    qsort(all, n, sizeof(*all), cmp_result);
    st->res = all;
    st->nres = n; /* search_run cuts to top_k */
    return 0;
}

/* Drops the results whose similarity is below min_similarity (or unknown: a text match the
 * index does not hold yet), keeping the order of the rest. */
static void drop_below(search_state *st)
{
    size_t n = 0;
    for (size_t i = 0; i < st->nres; i++) {
        const result *x = &st->res[i];
        if (x->has_sim && (double)x->similarity >= st->min_sim)
            st->res[n++] = *x;
    }
    st->nbelow = st->nres - n;
    st->nres = n;
}

/* The index is loaded: rank, count the accesses, fetch the rows. */
/* Runs the vector search of st into hits (st->ncand of them, allocated here; *nhits found).
 * Returns 0, or -1 after failing the request. */
static int search_vectors(req *r, search_state *st, vindex *vi, vindex_hit **hitsp, size_t *nhitsp)
{
    size_t nhits = 0;
    vindex_hit *hits = req_alloc(r, st->ncand * sizeof(*hits));
    if (!hits) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return -1;
    }
    vindex_query q = {.vec = st->qvec,
                      .k = st->ncand,
                      .keep = keep_cb,
                      .score = score_cb,
                      .score_slope = st->w,
                      .score_bound = 1.0 - st->w,
                      .score_monotone = true,
                      .ctx = st};
    if (st->w >= 1.0) {
        /* similarity alone: the index ranks by it directly, at the depth its recall
         * monitor measured for exactly that ranking */
        q.score = NULL;
        q.score_slope = q.score_bound = 0.0;
        q.score_monotone = false;
    }
    /* A filter that excludes only archived and expired memories is checked on the hits
     * afterwards instead of on every candidate (reading each candidate's metadata, and a
     * sample of 128 to size the filter, took 6 to 8% of a search's CPU): most tenants'
     * best matches are all live. When one is not, the search runs again with the
     * filter, and the tenant's searches filter up front for TENANT_NONLIVE_MS. */
    bool after = mf_lifecycle_only(&st->f) && !tenants_nonlive_recent(st->t, st->f.now_ms);
    if (after)
        q.keep = NULL;
    int rc = vindex_search(vi, &q, hits, &nhits);
    if (rc == 0 && after && !hits_kept(st, vi, hits, nhits)) {
        tenants_nonlive_seen(st->t, st->f.now_ms);
        q.keep = keep_cb;
        nhits = 0;
        rc = vindex_search(vi, &q, hits, &nhits);
    }
    if (rc != 0) {
        req_fail(r, rc == -ENOMEM ? RPC_INTERNAL : RPC_INVALID_ARGUMENT, "search failed (%d)", rc);
        return -1;
    }
    *hitsp = hits;
    *nhitsp = nhits;
    return 0;
}

/* Fills st->res from the vector hits, the text matches or both (by mode). Returns 0, or -1
 * after failing the request. */
static int search_results(req *r, search_state *st, vindex_hit *hits, size_t nhits)
{
    if (st->mode == MODE_VECTOR) {
        st->res = req_alloc(r, (nhits + 1) * sizeof(*st->res));
        if (!st->res) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < nhits; i++) {
            memset(&st->res[i], 0, sizeof(st->res[i]));
            st->res[i].id = hits[i].id;
            st->res[i].score = hits[i].score;
            st->res[i].has_sim = true;
            st->res[i].similarity = hits[i].similarity;
        }
        st->nres = nhits;
    } else if (st->mode == MODE_TEXT) {
        st->res = req_alloc(r, (st->ntext + 1) * sizeof(*st->res));
        if (!st->res) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < st->ntext; i++) {
            memset(&st->res[i], 0, sizeof(st->res[i]));
            st->res[i].id = st->text_ids[i];
            st->res[i].score = st->text_rank[i];
        }
        st->nres = st->ntext;
    } else if (fuse(r, st, hits, nhits) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return -1;
    }
    return 0;
}

static void search_run(req *r)
{
    search_state *st = req_state(r);
    vindex *vi = tenants_vindex(st->t);
    vindex_hit *hits = NULL;
    size_t nhits = 0;
    if (st->mode != MODE_TEXT && search_vectors(r, st, vi, &hits, &nhits) < 0)
        return;
    if (search_results(r, st, hits, nhits) < 0)
        return;
    /* min_similarity applies to every candidate before the cut to top_k, so the answer
     * holds the best of those that pass */
    if (st->has_min) {
        describe(st, vi);
        drop_below(st);
    }
    if (st->nres > st->k)
        st->nres = st->k;
    if (!st->has_min)
        describe(st, vi);
    uint64_t *ids = req_alloc(r, (st->nres + 1) * sizeof(*ids));
    st->rows = req_alloc(r, (st->nres + 1) * sizeof(*st->rows));
    st->have = req_alloc(r, st->nres + 1);
    if (!ids || !st->rows || !st->have) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    for (size_t i = 0; i < st->nres; i++)
        ids[i] = st->res[i].id;
    /* every memory returned counts as an access (a context block's: once it is known which
     * entries fit, see pack_context) */
    if (st->nres && !st->context)
        count_access(r, st, ids, st->nres);
    /* rows from the cache at the version the index knows; the rest from PostgreSQL */
    rowcache *rc = req_server(r)->rows;
    int64_t tid_owner = req_auth(r)->tenant_id;
    size_t nmiss = 0;
    for (size_t i = 0; i < st->nres; i++) {
        st->have[i] = rc_get(rc, tid_owner, st->res[i].id, st->res[i].meta.seq, &st->rows[i],
                             req_arena_alloc, r);
        if (!st->have[i])
            ids[nmiss++] = st->res[i].id;
    }
    if (nmiss == 0) {
        search_finish(r, st);
        return;
    }
    char *arr = mp_ids_literal(r, ids, nmiss);
    const char *tid = mp_tenant_param(r);
    if (!arr || !tid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    const char *vals[] = {tid, arr};
    db_query q = {.stmt = sql_def(SQL_MEMORY_GET), DB_VALUES(vals)};
    req_submit_read(r, &q, 1, search_rows);
}

static void index_ready(void *arg, int status, const char *err)
{
    req *r = arg;
    if (status != 0) {
        req_fail(r, RPC_UNAVAILABLE, "%s", err ? err : "index unavailable");
        return;
    }
    search_run(r);
}

/* Waits for the tenant's index (loading it if needed), then runs the search. */
static void search_index(req *r)
{
    search_state *st = req_state(r);
    const conn_auth *a = req_auth(r);
    st->t = tenants_get(req_server(r)->tenants, a->tenant_id, a->dim);
    if (st->t && !tenants_dim_is(st->t, a->dim)) {
        /* the query was embedded with the model the tenant left a moment ago */
        tenants_put(st->t);
        st->t = NULL;
        req_fail(r, RPC_UNAVAILABLE, "%s", MODEL_CHANGED);
        return;
    }
    if (!st->t || req_on_free(r, release_tenant, st) < 0) {
        tenants_put(st->t);
        st->t = NULL;
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    int rc = tenants_when_ready(st->t, worker_poster(req_worker(r)), index_ready, r);
    if (rc == 1)
        search_run(r);
    else if (rc < 0)
        req_fail(r, RPC_INTERNAL, "out of memory");
}

static void text_rows(req *r, const db_result *res)
{
    search_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    size_t n = (size_t)PQntuples(pr);
    st->text_ids = req_alloc(r, (n + 1) * sizeof(*st->text_ids));
    st->text_rank = req_alloc(r, (n + 1) * sizeof(*st->text_rank));
    if (!st->text_ids || !st->text_rank) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        st->text_ids[i] = (uint64_t)memrow_i64(pr, (int)i, 0, 0);
        st->text_rank[i] = memrow_f64_of(pr, (int)i, 1, 0, ROWERR_OTHER);
    }
    st->ntext = n;
    search_index(r);
}

static void search_text(req *r)
{
    search_state *st = req_state(r);
    const char *vals[1 + SQL_FILTER_NPARAMS + 2];
    char *limit = req_alloc(r, 16);
    vals[0] = mp_tenant_param(r);
    if (!limit || !vals[0] || mf_sql_params(req_arena(r), &st->f, vals + 1) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    snprintf(limit, 16, "%zu", st->ncand);
    vals[1 + SQL_FILTER_NPARAMS] = st->query;
    vals[2 + SQL_FILTER_NPARAMS] = limit;
    db_query q = {.stmt = sql_def(SQL_MEMORY_TEXT_SEARCH), DB_VALUES(vals)};
    req_submit_read(r, &q, 1, text_rows);
}

static void attrs_rows(req *r, const db_result *res)
{
    search_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int n = PQntuples(pr);
    idmap *ids = idmap_create((size_t)n + 1);
    if (!ids || req_on_free(r, free_attr_ids, ids) < 0) {
        idmap_destroy(ids);
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    for (int i = 0; i < n; i++) {
        if (idmap_put(ids, (uint64_t)memrow_i64(pr, i, 0, 0), 1) < 0) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
    }
    st->f.attr_ids = ids;
    if (st->mode == MODE_VECTOR)
        search_index(r);
    else
        search_text(r);
}

/* After the query vector is known: the PostgreSQL steps, then the index. */
static void search_start(req *r, rpc_code code, const char *message)
{
    search_state *st = req_state(r);
    if (code != RPC_OK) {
        req_fail(r, code, "%s", message ? message : "embedding failed");
        return;
    }
    if (st->f.attrs_json && st->mode != MODE_TEXT) {
        const char *tid = mp_tenant_param(r);
        if (!tid) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
        const char *vals[] = {tid, st->f.attrs_json};
        db_query q = {.stmt = sql_def(SQL_MEMORY_ATTRS_IDS), DB_VALUES(vals)};
        req_submit_read(r, &q, 1, attrs_rows);
        return;
    }
    if (st->mode == MODE_VECTOR)
        search_index(r);
    else
        search_text(r);
}

/* Admitted: embed the query text unless a vector came with it, then go on. */
static void search_admitted(req *r)
{
    search_state *st = req_state(r);
    if (st->have_vec) {
        search_start(r, RPC_OK, NULL);
        return;
    }
    const char *texts[1] = {st->query};
    size_t lens[1] = {strlen(st->query)};
    float *outs[1] = {st->qvec};
    const char *whats[1] = {"query"};
    re_embed(r, texts, lens, outs, whats, 1, search_start);
}

/* Reads memory.context's format and order. Returns 0, or -EINVAL after failing r. */
static int context_shape(req *r, search_state *st)
{
    const msgpack_object *format = req_arg(r, P_CX_FORMAT);
    const msgpack_object *order = req_arg(r, P_CX_ORDER);
    /* the dispatcher checked both against the table's words (ENUMS above) */
    st->search_results = format && rpc_str_eq(format, "search_results");
    st->stable = order && rpc_str_eq(order, "stable");
    return 0;
}

/* Reads and checks the arguments into a new search state (r's). Returns 0, or -EINVAL
 * after failing r. */
static int search_parse(req *r, bool context)
{
    server *s = req_server(r);
    const conn_auth *a = req_auth(r);
    search_state *st = req_alloc(r, sizeof(*st));
    if (!st) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return -EINVAL;
    }
    memset(st, 0, sizeof(*st));
    req_set_state(r, st);
    if (rf_parse(r, 0, &st->f) < 0)
        return -EINVAL;
    st->context = context;
    const msgpack_object *query = req_arg(r, P_SE_QUERY);
    const msgpack_object *embedding = req_arg(r, P_SE_EMBEDDING);
    const msgpack_object *mode = req_arg(r, P_SE_MODE);
    st->mode = MODE_VECTOR;
    if (mode) { /* one of enum_search_modes: the dispatcher checked it */
        if (rpc_str_eq(mode, "text"))
            st->mode = MODE_TEXT;
        else if (rpc_str_eq(mode, "hybrid"))
            st->mode = MODE_HYBRID;
    }
    if (st->mode != MODE_VECTOR && !query) {
        /* the parameter first: the error's data.field is the first quoted name */
        req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'query' is required in mode %s",
                 st->mode == MODE_TEXT ? "text" : "hybrid");
        return -EINVAL;
    }
    if (!query && !embedding) {
        req_fail(r, RPC_INVALID_ARGUMENT, "%s needs 'query' or 'embedding'", req_method(r));
        return -EINVAL;
    }
    uint64_t k = rpc_get_uint(req_arg(r, P_SE_TOP_K), 10); /* at most max_top_k (the binder) */
    if (k > (uint64_t)s->cfg.max_top_k)
        k = (uint64_t)s->cfg.max_top_k; /* the default of 10 over a smaller max_top_k */
    st->k = (size_t)k;
    st->ncand = st->k;
    const msgpack_object *min_sim = req_arg(r, P_SE_MIN_SIMILARITY);
    st->has_min = min_sim != NULL;
    st->min_sim = rpc_get_num(min_sim, 0.0);
    /* hybrid, and text with a threshold (matches below it leave room for more) */
    if (st->mode == MODE_HYBRID || (st->mode == MODE_TEXT && st->has_min)) {
        st->ncand = st->k * 3 > HYBRID_MIN_CANDIDATES ? st->k * 3 : HYBRID_MIN_CANDIDATES;
        if (st->ncand > (size_t)s->cfg.max_top_k * 3)
            st->ncand = (size_t)s->cfg.max_top_k * 3;
    }
    st->w = rpc_get_num(req_arg(r, P_SE_SIMILARITY_WEIGHT), s->cfg.similarity_weight);
    st->count = rpc_get_bool(req_arg(r, P_SE_COUNT_ACCESS), true);
    st->budget = context ? rpc_get_uint(req_arg(r, P_CX_BUDGET_TOKENS), 3000) : 0;
    if (context && context_shape(r, st) < 0)
        return -EINVAL;
    if (query && !(st->query = req_strdup(r, query))) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return -EINVAL;
    }
    st->qvec = req_alloc(r, a->dim * sizeof(float));
    if (!st->qvec) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return -EINVAL;
    }
    char err[300];
    if (embedding) {
        if (rpc_get_vector(embedding, "embedding", st->qvec, a->dim, err, sizeof(err)) != 0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "%s (this tenant's dimension is %u)", err, a->dim);
            return -EINVAL;
        }
        double norm = 0;
        for (size_t i = 0; i < a->dim; i++)
            norm += (double)st->qvec[i] * st->qvec[i];
        if (norm == 0.0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'embedding' is a zero vector");
            return -EINVAL;
        }
        st->have_vec = true;
    }
    return 0;
}

void h_memory_search(req *r)
{
    /* once the arguments are valid the call counts against the daily query limit */
    if (search_parse(r, false) == 0)
        app_admit_query(r, search_admitted);
}

void h_memory_context(req *r)
{
    if (search_parse(r, true) == 0)
        app_admit_query(r, search_admitted);
}

int search_block(req *r, search_block_fn done, void *ctx)
{
    if (search_parse(r, false) < 0)
        return -EINVAL;
    search_state *st = req_state(r);
    st->context = true;
    st->done = done;
    st->done_ctx = ctx;
    st->max_bytes = 1;
    return 0;
}

void *search_block_ctx(req *r)
{
    search_state *st = req_state(r);
    return st->done_ctx;
}

void search_block_cap(req *r, uint64_t max_bytes)
{
    search_state *st = req_state(r);
    st->max_bytes = max_bytes ? max_bytes : 1;
}

void search_go(req *r)
{
    app_admit_query(r, search_admitted);
}
