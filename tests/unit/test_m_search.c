/* tests/unit/test_m_search.c: server/methods/m_search.c against a fake request and a fake
 * pool (tests/fakes/fake_req.h) with a real index registry: memory.search and
 * memory.context: argument checks, the daily query admission (app.c and qadmit, answered
 * from the fake pool), the query embedded or given, the attrs and text statements, the
 * ranking of each mode (vector by similarity, text by the database's rank, hybrid by
 * reciprocal rank fusion), filters and the lifecycle filter checked after the search, the
 * rows from the row cache or PostgreSQL, accesses counted once, the context block's formats
 * and budget, and an index that cannot load; memory.feedback and memory.provenance
 * (m_feedback.c): arguments, the feedback statement's id lists, counts back into the index,
 * unknown ids, and the sentences scored against the memories' vectors.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access.h"
#include "check.h"
#include "embed.h"
#include "fake_req.h"
#include "pgres.h"
#include "tenants.h"

#define DIM 8
#define NOW_MS INT64_C(1700000000000)

static fr_env env;
/* the rows' times: created (and last changed) 3 hours before this, memory 1 first, then a
 * second apart (fixed, so that rows cached at different moments agree) */
static int64_t base_ms;

/* The tenant's memories: in the index and, when asked, as rows. */
typedef struct mem {
    uint64_t id;
    const char *type;
    const char *content;
    float vec[DIM];
    uint64_t seq;
    bool archived;
} mem;

static mem mems[] = {
    {1, "fact", "the bridge <closed> & \"reopens\" soon", {1, 0, 0, 0, 0, 0, 0, 0}, 11, false},
    {2, "episode", "an episode about gas", {0, 1, 0, 0, 0, 0, 0, 0}, 12, false},
    {3, "fact", "a nearly identical fact", {0.8f, 0.6f, 0, 0, 0, 0, 0, 0}, 13, false},
    {4, "fact", "an archived fact", {0.9f, 0, 0.43589f, 0, 0, 0, 0, 0}, 14, true},
};
#define NMEMS (sizeof(mems) / sizeof(mems[0]))

/* memory.provenance's memory 10, which test_provenance puts into the index itself */
static const mem mem10 = {10, "fact", "The bridge reopens on Monday.", {0}, 30, false};

static const mem *mem_of(uint64_t id)
{
    for (size_t i = 0; i < NMEMS; i++)
        if (mems[i].id == id)
            return &mems[i];
    return id == mem10.id ? &mem10 : NULL;
}

static const char *const memrow_names[22] = {
    "id",      "agent_id", "clade_id", "scope",       "type",    "content",  "imp",     "md",
    "created", "updated",  "acc",      "count",       "expires", "archived", "version", "seq",
    "pinned",  "reason",   "sup_by",   "merged_into", "cited",   "injected"};

/* The change the tenant's index knows memory id at (PostgreSQL's rows are at it), else
 * def. */
static uint64_t index_seq(uint64_t id, uint64_t def)
{
    tenant *t = tenants_get(env.srv.tenants, 7, DIM);
    mem_meta m = {0};
    uint64_t seq = t && vindex_get_meta(tenants_vindex(t), id, &m) == 0 ? m.seq : def;
    tenants_put(t);
    return seq;
}

/* the database's access count answer_rows gives memory row_count_id (0: none; else 0) */
static uint64_t row_count_id;
static const char *row_count = "0";

/* Answers a memory_get job with the rows of the ids it asks for (its "{a,b}" parameter). */
static void answer_rows(fr_job *j)
{
    const char *arr = fr_val(j, 0, 1);
    uint64_t ids[16];
    int n = 0;
    for (const char *p = arr ? arr + 1 : ""; *p && *p != '}' && n < 16;) {
        ids[n++] = strtoull(p, (char **)&p, 10);
        if (*p == ',')
            p++;
    }
    const char *cells[16 * 22];
    char bufs[16][2048];
    for (int i = 0; i < n; i++) {
        const mem *m = mem_of(ids[i]);
        fr_memrow_cells(bufs[i], cells + i * 22, ids[i], m->type, "tenant", m->content, 0.5, "{}",
                        base_ms - 3 * 3600 * 1000 - 10000 + 1000 * (int64_t)ids[i],
                        index_seq(ids[i], m->seq));
        if (ids[i] == row_count_id)
            cells[i * 22 + 11] = row_count;
    }
    fr_answer1(j, pgres_make(22, memrow_names, n, cells));
}

/* Finishes a request that may need its rows from PostgreSQL (the row cache may hold them). */
static void finish_rows(req *r)
{
    if (r->ends)
        return;
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_READ && strcmp(j->q[0].name, "memory_get") == 0 && j->r == r);
    if (j)
        answer_rows(j);
}

static void expect_invalid(const char *method, const char *args, const char *field)
{
    req *r = fr_call(&env, method, args);
    CHECK_MSG(r->code == RPC_INVALID_ARGUMENT && r->ends == 1, "%s %s: code %d (%s)", method, args,
              (int)r->code, r->msg);
    if (field)
        CHECK_MSG(fr_field(r) && strcmp(fr_field(r), field) == 0, "%s %s: field %s, not %s", method,
                  args, fr_field(r) ? fr_field(r) : "(none)", field);
    CHECK_MSG(fr_jobs() == 0, "%s %s sent a job", method, args);
    fr_clear_jobs();
    fr_free(r);
}

/* The ids of the results (search) in *ids; returns how many. */
static long result_ids(const req *r, uint64_t *ids, long max)
{
    const msgpack_object *a = fr_get(r, "results");
    long n = fr_len(a);
    for (long i = 0; i < n && i < max; i++) {
        const msgpack_object *id = rpc_map_get(&a->via.array.ptr[i], "id");
        ids[i] = id ? id->via.u64 : 0;
    }
    return n;
}

static void load_index(void)
{
    tenant *t = fr_index_loaded(&env, 7, DIM, 0);
    for (size_t i = 0; i < NMEMS; i++) {
        mem_meta m = {.created_ms = server_now_ms() - 3600 * 1000,
                      .expires_ms = INT64_MAX,
                      .archived = mems[i].archived,
                      .importance = 0.5f,
                      .type = (uint8_t)memrow_type_parse(mems[i].type, strlen(mems[i].type)),
                      .scope = SCOPE_TENANT};
        tenants_apply_upsert(t, mems[i].seq, mems[i].id, mems[i].vec, &m);
    }
    CHECK(vindex_count(tenants_vindex(t)) == NMEMS);
    tenants_put(t);
}

/* ---- arguments ---------------------------------------------------------------------------- */

static void test_arguments(void)
{
    expect_invalid("memory.search", "{}", "query");
    expect_invalid("memory.search", "{\"query\": \"x\", \"mode\": \"fuzzy\"}", "mode");
    expect_invalid("memory.search", "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], \"mode\": \"text\"}",
                   "query");
    expect_invalid("memory.search",
                   "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], \"mode\": "
                   "\"hybrid\"}",
                   "query");
    expect_invalid("memory.search", "{\"embedding\": [1, 0, 0]}", "embedding");
    expect_invalid("memory.search", "{\"embedding\": [0, 0, 0, 0, 0, 0, 0, 0]}", "embedding");
    expect_invalid("memory.search", "{\"query\": \"x\", \"top_k\": 0}", "top_k");
    expect_invalid("memory.search", "{\"query\": \"x\", \"top_k\": 1000000}", "top_k");
    expect_invalid("memory.search", "{\"query\": \"x\", \"similarity_weight\": 2}",
                   "similarity_weight");
    expect_invalid("memory.search", "{\"query\": \"x\", \"scopes\": [\"planet\"]}", "scopes[0]");
    expect_invalid("memory.search", "{\"query\": \"x\", \"budget_tokens\": 5}", "budget_tokens");
    expect_invalid("memory.context", "{\"query\": \"x\", \"format\": \"html\"}", "format");
    expect_invalid("memory.context", "{\"query\": \"x\", \"order\": \"random\"}", "order");
    expect_invalid("memory.context", "{\"query\": \"x\", \"budget_tokens\": 0}", "budget_tokens");
    /* a query with nothing to embed */
    expect_invalid("memory.search", "{\"query\": \"   \"}", "query");
}

/* ---- admission -------------------------------------------------------------------------- */

static void test_admission(void)
{
    tier_limits *tl = &env.tiers[TIER_STANDARD];
    tl->queries_per_day = 100;
    /* the first query of the day asks the database for a block of the day's quota */
    req *r = fr_call(&env, "memory.search", "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0]}");
    fr_job *j = fr_take();
    CHECK(r->ends == 0 && j && j->kind == FR_POOL && j->rls == 7 && j->nq == 2);
    CHECK(j && strcmp(j->q[0].name, "sync_off") == 0 && strcmp(j->q[1].name, "query_reserve") == 0);
    CHECK(j && fr_val(j, 1, 0) && strcmp(fr_val(j, 1, 0), "7") == 0);
    CHECK(j && fr_val(j, 1, 1) && strcmp(fr_val(j, 1, 1), env.query_limits) == 0);
    /* the day is used up (nobody else holds any): quota_exceeded with the day's numbers */
    PGresult *res[2] = {pgres_command(), fr_rows("granted|used|limit|resets|others", 1,
                                                 "0|100|100|1700086400000|0")};
    fr_answer(j, res, 2);
    CHECK(r->code == RPC_QUOTA_EXCEEDED && r->ends == 1);
    CHECK(fr_is_int(fr_get(r, "limit"), 100) && fr_is_int(fr_get(r, "usage"), 100));
    CHECK(fr_is_int(fr_get(r, "resets_at"), 1700086400000));
    CHECK_STR_CONTAINS(r->msg, "daily query limit of the standard tier");
    CHECK(fr_jobs() == 0);
    fr_free(r);

    /* the reservation job fails: the request fails with its error */
    r = fr_call(&env, "memory.search", "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0]}");
    j = fr_take();
    CHECK(j && j->nq == 2);
    if (j)
        fr_answer_unavailable(j, "no connection");
    CHECK(r->fail_db && r->db_status == DB_UNAVAILABLE);
    fr_free(r);

    /* a block granted: this query and the next go on without asking again */
    r = fr_call(&env, "memory.search", "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], \"top_k\": 1}");
    j = fr_take();
    PGresult *ok[2] = {pgres_command(),
                       fr_rows("granted|used|limit|resets|others", 1, "10|5|100|4102444800000|0")};
    fr_answer(j, ok, 2);
    finish_rows(r);
    CHECK(r->done);
    fr_free(r);
    r = fr_call(&env, "memory.search", "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], \"top_k\": 1}");
    finish_rows(r);
    CHECK(r->done && fr_jobs() == 0);
    fr_free(r);
    tl->queries_per_day = 0; /* unlimited from here on: counted, never asked */
}

/* ---- vector, text and hybrid searches -------------------------------------------------- */

/* The index's access count of memory id of tenant 7. */
static uint32_t index_accesses(uint64_t id)
{
    tenant *t = tenants_get(env.srv.tenants, 7, DIM);
    mem_meta m;
    uint32_t n = vindex_get_meta(tenants_vindex(t), id, &m) == 0 ? mem_meta_access_count(&m) : 0;
    tenants_put(t);
    return n;
}

/* Empties the worker's access log; returns the count logged for memory id (0: none) and
 * how many memories were logged in *n. */
static uint64_t take_accesses(uint64_t id, size_t *n)
{
    access_entry *e;
    size_t ne = 0;
    uint64_t count = 0;
    CHECK(access_log_take(app_access(env.w), &e, &ne) == 0);
    for (size_t i = 0; i < ne; i++) {
        CHECK(e[i].tenant == 7);
        if (e[i].id == id)
            count = e[i].count;
    }
    free(e);
    if (n)
        *n = ne;
    return count;
}

static void test_vector(void)
{
    take_accesses(0, NULL);
    uint32_t before1 = index_accesses(1), before3 = index_accesses(3);
    req *r = fr_call(&env, "memory.search",
                     "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], "
                     "\"top_k\": 2, \"similarity_weight\": 1}");
    /* no statement before the index: the rows it found (or the cache's) */
    finish_rows(r);
    CHECK(r->done && r->ends == 1);
    uint64_t ids[8];
    CHECK(result_ids(r, ids, 8) == 2 && ids[0] == 1 && ids[1] == 3);
    CHECK(fabs(fr_num(fr_path(r, "results.0.similarity")) - 1.0) < 1e-5);
    CHECK(fabs(fr_num(fr_path(r, "results.1.similarity")) - 0.8) < 1e-5);
    CHECK(fabs(fr_num(fr_path(r, "results.0.score")) - 1.0) < 1e-5); /* weight 1: similarity */
    CHECK(fr_is_str(fr_path(r, "results.0.content"), mems[0].content));
    double c0 = fr_num(fr_path(r, "results.0.composite"));
    CHECK(c0 > 0 && c0 <= 1);
    /* the access count reported is the one the ranking used; every memory returned is an
     * access: in the index at once, for PostgreSQL in the worker's log */
    CHECK(fr_is_int(fr_path(r, "results.0.access_count"), before1));
    CHECK(fr_is_int(fr_path(r, "results.1.access_count"), before3));
    CHECK(index_accesses(1) == before1 + 1 && index_accesses(3) == before3 + 1);
    size_t nlogged;
    CHECK(take_accesses(1, &nlogged) == 1 && nlogged == 2);
    fr_free(r);
    /* a second search of the same memories: each logged once more, one entry each */
    r = fr_call(&env, "memory.search",
                "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], "
                "\"top_k\": 2, \"similarity_weight\": 1}");
    finish_rows(r);
    CHECK(fr_is_int(fr_path(r, "results.0.access_count"), before1 + 1));
    fr_free(r);
    r = fr_call(&env, "memory.search",
                "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], "
                "\"top_k\": 2, \"similarity_weight\": 1}");
    finish_rows(r);
    fr_free(r);
    CHECK(take_accesses(3, &nlogged) == 2 && nlogged == 2);

    /* the archived memory 4 (cosine 0.9) is not returned: the search's lifecycle check
     * after the fact finds it and searches again with the filter */
    r = fr_call(&env, "memory.search",
                "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], "
                "\"top_k\": 3, \"similarity_weight\": 1}");
    finish_rows(r);
    CHECK(result_ids(r, ids, 8) == 3 && ids[0] == 1 && ids[1] == 3 && ids[2] == 2);
    fr_free(r);
    /* ... unless archived memories are asked for */
    r = fr_call(&env, "memory.search",
                "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], \"top_k\": 2, "
                "\"similarity_weight\": 1, \"include_archived\": true}");
    finish_rows(r);
    CHECK(result_ids(r, ids, 8) == 2 && ids[0] == 1 && ids[1] == 4);
    fr_free(r);
    /* a type filter */
    r = fr_call(&env, "memory.search",
                "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], \"type_filter\": [\"episode\"]}");
    finish_rows(r);
    CHECK(result_ids(r, ids, 8) == 1 && ids[0] == 2);
    fr_free(r);

    /* attrs: the matching ids come from PostgreSQL first */
    r = fr_call(&env, "memory.search",
                "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], \"attrs\": {\"pool\": \"eth-usdc\"}}");
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_READ && strcmp(j->q[0].name, "memory_attrs_ids") == 0);
    CHECK(j && fr_val(j, 0, 1) && strstr(fr_val(j, 0, 1), "eth-usdc"));
    fr_answer1(j, fr_rows("id", 2, "3", "2"));
    finish_rows(r);
    CHECK(result_ids(r, ids, 8) == 2 && ids[0] == 3 && ids[1] == 2);
    fr_free(r);

    /* a request run again (its answer waited for budget) counts no access again */
    env.again = true;
    size_t logged = access_log_count(app_access(env.w));
    tenant *t = tenants_get(env.srv.tenants, 7, DIM);
    mem_meta before;
    vindex_get_meta(tenants_vindex(t), 2, &before);
    r = fr_call(&env, "memory.search",
                "{\"embedding\": [0, 1, 0, 0, 0, 0, 0, 0], \"type_filter\": [\"episode\"]}");
    finish_rows(r);
    mem_meta after;
    vindex_get_meta(tenants_vindex(t), 2, &after);
    CHECK(r->done && access_log_count(app_access(env.w)) == logged);
    CHECK(mem_meta_access_count(&after) == mem_meta_access_count(&before));
    fr_free(r);
    tenants_put(t);
    env.again = false;
}

static void test_text_and_hybrid(void)
{
    req *r = fr_call(&env, "memory.search",
                     "{\"query\": \"gas bridge\", \"mode\": \"text\", "
                     "\"top_k\": 5}");
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_READ && strcmp(j->q[0].name, "memory_text_search") == 0);
    CHECK(j && j->q[0].nvalues == 19);
    CHECK(j && fr_val(j, 0, 17) && strcmp(fr_val(j, 0, 17), "gas bridge") == 0);
    CHECK(j && fr_val(j, 0, 18) && strcmp(fr_val(j, 0, 18), "5") == 0);
    fr_answer1(j, fr_rows("id|rank", 2, "2|0.9", "1|0.25"));
    finish_rows(r);
    uint64_t ids[8];
    CHECK(result_ids(r, ids, 8) == 2 && ids[0] == 2 && ids[1] == 1);
    CHECK(fabs(fr_num(fr_path(r, "results.0.score")) - 0.9) < 1e-9);
    /* the similarity comes from the index (the query is embedded too) */
    CHECK(!fr_is_nil(fr_path(r, "results.0.similarity")));
    fr_free(r);

    /* hybrid: reciprocal rank fusion; candidates: at least 50 per ranking */
    r = fr_call(&env, "memory.search",
                "{\"query\": \"bridge\", \"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], \"mode\": "
                "\"hybrid\", \"top_k\": 2, \"similarity_weight\": 1}");
    j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "memory_text_search") == 0 && fr_val(j, 0, 18) &&
          strcmp(fr_val(j, 0, 18), "50") == 0);
    /* vector ranking 1, 3, 2 (4 archived); text ranking 2, 1 */
    fr_answer1(j, fr_rows("id|rank", 2, "2|0.9", "1|0.25"));
    finish_rows(r);
    CHECK(result_ids(r, ids, 8) == 2 && ids[0] == 1 && ids[1] == 2);
    CHECK(fabs(fr_num(fr_path(r, "results.0.score")) - (1.0 / 61 + 1.0 / 62)) < 1e-12);
    CHECK(fabs(fr_num(fr_path(r, "results.1.score")) - (1.0 / 63 + 1.0 / 61)) < 1e-12);
    fr_free(r);

    /* the filter reaches the text statement's parameters $2..$17 */
    r = fr_call(&env, "memory.search",
                "{\"query\": \"gas\", \"mode\": \"text\", \"type_filter\": [\"episode\", "
                "\"fact\"], \"include_archived\": true, \"agent_id\": 5, \"scopes\": "
                "[\"agent\"], \"created_after\": 1000, \"created_before\": 2000, "
                "\"min_importance\": 0.25, \"min_composite\": 0.5, \"strategy_id\": \"s1\", "
                "\"tokens\": [\"ETH\"], \"chains\": [1], \"protocols\": [\"uni\"]}");
    j = fr_take();
    static const char *const want[19] = {"7",
                                         "{\"episode\",\"fact\"}",
                                         "true",
                                         "5",
                                         NULL,
                                         "{\"agent\"}",
                                         "1000",
                                         "2000",
                                         "{\"{\\\"tokens\\\":[\\\"ETH\\\"]}\"}",
                                         "{\"{\\\"chains\\\":[1]}\"}",
                                         "{\"{\\\"protocols\\\":[\\\"uni\\\"]}\"}",
                                         "{\"strategy_id\":\"s1\"}",
                                         NULL,
                                         "0.5",
                                         NULL, /* now */
                                         NULL, /* the score weights */
                                         "0.25",
                                         "gas",
                                         "10"};
    CHECK(j && j->q[0].nvalues == 19);
    for (int i = 0; j && i < 19; i++) {
        const char *v = fr_val(j, 0, i);
        if (i == 14 || i == 15)
            continue;
        CHECK_MSG(want[i] ? v && strcmp(v, want[i]) == 0 : v == NULL, "$%d is %s, not %s", i + 1,
                  v ? v : "NULL", want[i] ? want[i] : "NULL");
    }
    /* the composite is evaluated as of now, with the server's weights */
    CHECK(j && fr_val(j, 0, 14) && llabs(atoll(fr_val(j, 0, 14)) - server_now_ms()) < 600000);
    CHECK(j && fr_val(j, 0, 15) && strncmp(fr_val(j, 0, 15), "{0.29999999999999999,", 21) == 0);
    fr_answer1(j, fr_rows("id|rank", 0));
    fr_free(r);

    r = fr_call(&env, "memory.search", "{\"query\": \"x\", \"mode\": \"text\"}");
    fr_answer_error(fr_take(), "57014", "canceling statement", NULL);
    CHECK(r->fail_db && strcmp(r->db_sqlstate, "57014") == 0);
    fr_free(r);
}

/* ---- memory.context ----------------------------------------------------------------------- */

static void test_context(void)
{
    take_accesses(0, NULL);
    req *r = fr_call(&env, "memory.context",
                     "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], "
                     "\"top_k\": 2, \"similarity_weight\": 1}");
    finish_rows(r);
    CHECK(r->done);
    const msgpack_object *text = fr_get(r, "text");
    char block[2048] = "";
    if (text && text->type == MSGPACK_OBJECT_STR)
        snprintf(block, sizeof(block), "%.*s", (int)text->via.str.size, text->via.str.ptr);
    CHECK(strncmp(block, "<agent_memory>\n", 15) == 0);
    CHECK_STR_CONTAINS(block, "the bridge &lt;closed&gt; &amp; &quot;reopens&quot; soon");
    CHECK_STR_CONTAINS(block, "<memory type=\"fact\" importance=\"0.50\" age=\"3h\">");
    const msgpack_object *ids = fr_get(r, "ids");
    CHECK(fr_len(ids) == 2 && fr_is_int(&ids->via.array.ptr[0], 1));
    /* tokens: the tags' 4 and each element's bytes / 4 */
    uint64_t used = (uint64_t)fr_num(fr_get(r, "tokens_used"));
    CHECK(used > 4 && used < strlen(block) / 4 + 4);
    /* the entries shown are the accesses */
    size_t nlogged;
    CHECK(take_accesses(3, &nlogged) == 1 && nlogged == 2);
    fr_free(r);

    /* a budget for one: only the first that fits, counted alone */
    r = fr_call(&env, "memory.context",
                "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], "
                "\"top_k\": 3, \"similarity_weight\": 1, "
                "\"budget_tokens\": 40}");
    finish_rows(r);
    /* memory 1's element is 121 bytes (30 tokens) with the tags' 4: 34; memory 3's 22 more
     * would pass 40 */
    ids = fr_get(r, "ids");
    CHECK(fr_len(ids) == 1 && fr_is_int(&ids->via.array.ptr[0], 1));
    CHECK(fr_is_int(fr_get(r, "tokens_used"), 34));
    CHECK(take_accesses(1, &nlogged) == 1 && nlogged == 1);
    fr_free(r);
    /* a budget that not even the first fits: an empty block, nothing counted */
    take_accesses(0, NULL);
    r = fr_call(&env, "memory.context",
                "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], "
                "\"top_k\": 3, \"similarity_weight\": 1, "
                "\"budget_tokens\": 20}");
    finish_rows(r);
    CHECK(r->done && fr_len(fr_get(r, "ids")) == 0 && fr_is_int(fr_get(r, "tokens_used"), 4));
    CHECK(fr_is_str(fr_get(r, "text"), "<agent_memory>\n</agent_memory>"));
    CHECK(access_log_count(app_access(env.w)) == 0);
    fr_free(r);

    /* search results: source and title per item, in a stable order (oldest change first:
     * 1 changed before 3, though 3 ranks first) */
    r = fr_call(&env, "memory.context",
                "{\"embedding\": [0.8, 0.6, 0, 0, 0, 0, 0, 0], "
                "\"top_k\": 2, \"similarity_weight\": 1, \"format\": "
                "\"search_results\", \"order\": \"stable\"}");
    finish_rows(r);
    CHECK(r->done && fr_len(fr_get(r, "items")) == 2);
    CHECK(fr_is_str(fr_path(r, "items.0.source"), "engram://7/fact/1"));
    CHECK(fr_is_str(fr_path(r, "items.0.title"), "[FACT] memory 1"));
    CHECK(fr_is_str(fr_path(r, "items.0.content"), mems[0].content));
    CHECK(fr_is_str(fr_path(r, "items.1.source"), "engram://7/fact/3"));
    CHECK(fr_is_str(fr_path(r, "items.1.title"), "[FACT] memory 3"));
    fr_free(r);
    /* in rank order: 3 first */
    r = fr_call(&env, "memory.context",
                "{\"embedding\": [0.8, 0.6, 0, 0, 0, 0, 0, 0], "
                "\"top_k\": 2, \"similarity_weight\": 1, \"format\": "
                "\"search_results\"}");
    finish_rows(r);
    CHECK(fr_is_str(fr_path(r, "items.0.source"), "engram://7/fact/3"));
    CHECK(fr_is_str(fr_path(r, "items.1.source"), "engram://7/fact/1"));
    CHECK(fr_get(r, "text") == NULL);
    fr_free(r);
}

/* ---- memory.feedback and memory.provenance ------------------------------------------------ */

/* What engram_memory_feedback returns: (cited, cited_count, injected_count, meta 14). */
static PGresult *feedback_rows(int n, const uint64_t *ids, const bool *cited, const int64_t *counts,
                               const uint64_t *seqs)
{
    static const char *const names[17] = {
        "f_cited",      "f_cited_count", "f_injected_count", "m_id",         "m_seq",
        "m_agent_id",   "m_clade_id",    "m_scope",          "m_type",       "m_importance",
        "m_created_ms", "m_accessed_ms", "m_access_count",   "m_expires_ms", "m_archived_ms",
        "m_pinned",     "m_tags"};
    const char *cells[8 * 17];
    char bufs[8][512], nums[8][2][24];
    for (int i = 0; i < n; i++) {
        snprintf(nums[i][0], 24, "%lld", (long long)counts[2 * i]);
        snprintf(nums[i][1], 24, "%lld", (long long)counts[2 * i + 1]);
        cells[i * 17] = cited[i] ? "t" : "f";
        cells[i * 17 + 1] = nums[i][0];
        cells[i * 17 + 2] = nums[i][1];
        const mem *m = mem_of(ids[i]);
        fr_meta_cells(bufs[i], cells + i * 17 + 3, ids[i], seqs[i], m ? m->type : "fact", "tenant",
                      0.5, server_now_ms() - 3600 * 1000);
    }
    return pgres_make(17, names, n, cells);
}

static void index_counts(uint64_t id, uint32_t *cited, uint32_t *injected)
{
    tenant *t = tenants_get(env.srv.tenants, 7, DIM);
    mem_meta m = {0};
    CHECK(vindex_get_meta(tenants_vindex(t), id, &m) == 0);
    *cited = m.cited;
    *injected = m.injected;
    tenants_put(t);
}

static void test_feedback(void)
{
    expect_invalid("memory.feedback", "{}", "cited");
    expect_invalid("memory.feedback", "{\"cited\": [], \"injected\": null}", "cited");
    expect_invalid("memory.feedback", "{\"cited\": [1, -2]}", "cited");
    expect_invalid("memory.feedback", "{\"injected\": \"1\"}", "injected");
    char big[8192] = "{\"injected\": [";
    for (int i = 0; i < 1001; i++)
        snprintf(big + strlen(big), sizeof(big) - strlen(big), "%s%d", i ? "," : "", i + 1);
    strcat(big, "]}");
    expect_invalid("memory.feedback", big, "injected");

    /* each id once, in the order first named; a cited id counts as injected */
    req *r = fr_call(&env, "memory.feedback", "{\"cited\": [1, 1], \"injected\": [2, 1, 999]}");
    fr_job *j = fr_take();
    CHECK(r->ends == 0 && j && j->kind == FR_SUBMIT && j->rls == 7);
    CHECK(j && strcmp(j->q[0].name, "memory_feedback") == 0 && j->q[0].nvalues == 3);
    CHECK(j && fr_val(j, 0, 0) && strcmp(fr_val(j, 0, 0), "7") == 0);
    CHECK(j && fr_val(j, 0, 1) && strcmp(fr_val(j, 0, 1), "{1}") == 0);
    CHECK(j && fr_val(j, 0, 2) && strcmp(fr_val(j, 0, 2), "{1,2,999}") == 0);
    /* 999 is not the tenant's: the database returns 1 and 2 only */
    uint64_t ids[2] = {1, 2}, seqs[2] = {21, 22};
    bool cited[2] = {true, false};
    int64_t counts[4] = {3, 5, 0, 1};
    fr_answer1(j, feedback_rows(2, ids, cited, counts, seqs));
    CHECK(r->done && r->ends == 1);
    CHECK(fr_len(fr_get(r, "memories")) == 2);
    CHECK(fr_is_int(fr_path(r, "memories.0.id"), 1) &&
          fr_is_bool(fr_path(r, "memories.0.cited"), true));
    CHECK(fr_is_int(fr_path(r, "memories.0.cited_count"), 3) &&
          fr_is_int(fr_path(r, "memories.0.injected_count"), 5));
    CHECK(fr_is_int(fr_path(r, "memories.1.id"), 2) &&
          fr_is_bool(fr_path(r, "memories.1.cited"), false));
    CHECK(fr_is_int(fr_path(r, "memories.1.injected_count"), 1));
    CHECK(fr_len(fr_get(r, "unknown")) == 1 && fr_is_int(fr_path(r, "unknown.0"), 999));
    CHECK(fr_get(r, "sentences") == NULL);
    /* the new counts are in the index at once (the composite may use them) */
    uint32_t c, inj;
    index_counts(1, &c, &inj);
    CHECK(c == 3 && inj == 5);
    index_counts(2, &c, &inj);
    CHECK(c == 0 && inj == 1);
    fr_free(r);

    /* only injected: an empty cited list is sent; a failed write fails the request */
    r = fr_call(&env, "memory.feedback", "{\"injected\": [3]}");
    j = fr_take();
    CHECK(j && fr_val(j, 0, 1) && strcmp(fr_val(j, 0, 1), "{}") == 0);
    CHECK(j && fr_val(j, 0, 2) && strcmp(fr_val(j, 0, 2), "{3}") == 0);
    fr_answer_error(j, "40001", "could not serialize access", NULL);
    CHECK(r->fail_db && r->db_status == DB_ERROR && strcmp(r->db_sqlstate, "40001") == 0);
    fr_free(r);
}

static void test_provenance(void)
{
    expect_invalid("memory.provenance", "{}", "response");
    expect_invalid("memory.provenance", "{\"response\": \"A sentence.\"}", "injected");
    expect_invalid("memory.provenance", "{\"response\": \"A sentence.\", \"injected\": []}",
                   "injected");
    expect_invalid("memory.provenance", "{\"response\": \" \\n\\t \\n\", \"injected\": [1]}",
                   "response");
    char many[4096] = "{\"injected\": [1], \"response\": \"";
    for (int i = 0; i < 257; i++)
        strcat(many, "A. ");
    strcat(many, "\"}");
    expect_invalid("memory.provenance", many, "response");

    /* memory 10's vector is the built-in embedding of the response's first sentence */
    const char *s0 = "The bridge reopens on Monday.", *s1 = "Gas prices fell sharply!",
               *s2 = "what about tolls?";
    float v10[DIM], e[3][DIM];
    CHECK(embed_text(s0, strlen(s0), DIM, v10) == 0);
    CHECK(embed_text(s0, strlen(s0), DIM, e[0]) == 0);
    CHECK(embed_text(s1, strlen(s1), DIM, e[1]) == 0);
    CHECK(embed_text(s2, strlen(s2), DIM, e[2]) == 0);
    tenant *t = tenants_get(env.srv.tenants, 7, DIM);
    mem_meta m = {.created_ms = server_now_ms() - 3600 * 1000,
                  .expires_ms = INT64_MAX,
                  .importance = 0.5f,
                  .type = MEM_FACT,
                  .scope = SCOPE_TENANT};
    tenants_apply_upsert(t, 30, 10, v10, &m);
    tenants_put(t);
    /* memory 2 is the unit vector e2: its cosine with sentence k is e[k][1] */
    int best2 = 0;
    for (int k = 1; k < 3; k++)
        if (e[k][1] > e[best2][1])
            best2 = k;
    bool cited2 = e[best2][1] > env.srv.cfg.provenance_threshold;

    const char *call = "{\"response\": \"  The bridge reopens on Monday.  Gas prices fell "
                       "sharply!\\nwhat about tolls?\", \"injected\": [10, 2, 10, 999]}";
    req *r = fr_call(&env, "memory.provenance", call);
    /* the texts the row cache lacks come from PostgreSQL first (10's at least: new) */
    fr_job *j = fr_take();
    CHECK(r->ends == 0 && j && j->kind == FR_READ && strcmp(j->q[0].name, "memory_get") == 0);
    CHECK(j && fr_val(j, 0, 1) && strstr(fr_val(j, 0, 1), "10") && !strstr(fr_val(j, 0, 1), "999"));
    if (j)
        answer_rows(j);
    j = fr_take();
    CHECK(r->ends == 0 && j && strcmp(j->q[0].name, "memory_feedback") == 0);
    /* 999 is not in the index: not recorded; 10 matched its sentence exactly: cited */
    CHECK(j && fr_val(j, 0, 1) && strcmp(fr_val(j, 0, 1), cited2 ? "{10,2}" : "{10}") == 0);
    CHECK(j && fr_val(j, 0, 2) && strcmp(fr_val(j, 0, 2), "{10,2}") == 0);
    uint64_t ids[2] = {10, 2}, seqs[2] = {31, 32};
    bool cited[2] = {true, cited2};
    int64_t counts[4] = {1, 1, cited2 ? 1 : 0, 2};
    fr_answer1(j, feedback_rows(2, ids, cited, counts, seqs));
    CHECK(r->done && fr_is_int(fr_get(r, "sentences"), 3));
    CHECK(fr_len(fr_get(r, "memories")) == 2);
    CHECK(fr_is_int(fr_path(r, "memories.0.id"), 10) &&
          fr_is_bool(fr_path(r, "memories.0.cited"), true));
    CHECK(fabs(fr_num(fr_path(r, "memories.0.similarity")) - 1.0) < 1e-5);
    CHECK(fr_is_int(fr_path(r, "memories.0.sentence"), 0));
    CHECK(fr_is_str(fr_path(r, "memories.0.matched_text"), s0)); /* trimmed */
    CHECK(fr_is_int(fr_path(r, "memories.1.id"), 2) &&
          fr_is_bool(fr_path(r, "memories.1.cited"), cited2));
    CHECK(fr_is_int(fr_path(r, "memories.1.sentence"), best2));
    CHECK(fabs(fr_num(fr_path(r, "memories.1.similarity")) - e[best2][1]) < 1e-5);
    const char *const sents[3] = {s0, s1, s2};
    CHECK(fr_is_str(fr_path(r, "memories.1.matched_text"), sents[best2]));
    CHECK(fr_len(fr_get(r, "unknown")) == 1 && fr_is_int(fr_path(r, "unknown.0"), 999));
    /* the evidence: 10 is its first sentence word for word (overlap 1, cosine 1); 2 ("an
     * episode about gas") shares one word of two and no pair with the response (1/3) */
    CHECK(fr_is_str(fr_path(r, "memories.0.match"), "both"));
    CHECK(fr_num(fr_path(r, "memories.0.overlap")) == 1.0);
    CHECK(fr_is_bool(fr_path(r, "memories.0.conflict"), false));
    CHECK(fabs(fr_num(fr_path(r, "memories.1.overlap")) - 1.0 / 3) < 1e-6);
    CHECK(cited2 ? fr_is_str(fr_path(r, "memories.1.match"), "cosine")
                 : fr_is_nil(fr_path(r, "memories.1.match")));
    fr_free(r);

    /* again: the texts come from the row cache when it holds them at the change the index
     * knows; the feedback was a change (31, 32), so here they are read again, as are rows of
     * that change (cached) */
    for (int pass = 0; pass < 2; pass++) {
        r = fr_call(&env, "memory.provenance", call);
        j = fr_take();
        bool read = j && j->kind == FR_READ && strcmp(j->q[0].name, "memory_get") == 0;
        CHECK(read == (pass == 0));
        if (read) {
            answer_rows(j);
            j = fr_take();
        }
        CHECK(r->ends == 0 && j && strcmp(j->q[0].name, "memory_feedback") == 0);
        int64_t counts2[4] = {2, 2, cited2 ? 2 : 0, 3};
        /* (a fake's liberty: this feedback reports the same change numbers, so the rows
         * read above stay current for the second pass) */
        fr_answer1(j, feedback_rows(2, ids, cited, counts2, seqs));
        CHECK(r->done && fr_is_str(fr_path(r, "memories.0.match"), "both"));
        CHECK(fabs(fr_num(fr_path(r, "memories.1.overlap")) - 1.0 / 3) < 1e-6);
        fr_free(r);
    }

    /* a memory the index holds but PostgreSQL no longer has (deleted meanwhile): no text, no
     * overlap, its cosine alone decides; a failed read fails the request */
    t = tenants_get(env.srv.tenants, 7, DIM);
    tenants_apply_upsert(t, 33, 11, v10, &m);
    tenants_put(t);
    r = fr_call(&env, "memory.provenance",
                "{\"response\": \"The bridge reopens on Monday.\", \"injected\": [11]}");
    j = fr_take();
    CHECK(j && j->kind == FR_READ && strcmp(j->q[0].name, "memory_get") == 0);
    fr_answer1(j, pgres_make(22, memrow_names, 0, NULL));
    j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "memory_feedback") == 0);
    uint64_t id11 = 11, seq11 = 34;
    bool yes = true;
    int64_t c11[2] = {1, 1};
    fr_answer1(j, feedback_rows(1, &id11, &yes, c11, &seq11));
    CHECK(r->done && fr_is_bool(fr_path(r, "memories.0.cited"), true));
    CHECK(fr_is_str(fr_path(r, "memories.0.match"), "cosine"));
    CHECK(fr_is_nil(fr_path(r, "memories.0.overlap")));
    fr_free(r);
    r = fr_call(&env, "memory.provenance", "{\"response\": \"Another text.\", \"injected\": [11]}");
    j = fr_take();
    CHECK(j && j->kind == FR_READ);
    fr_answer_error(j, "57014", "canceling statement due to statement timeout", NULL);
    CHECK(r->fail_db && r->ends == 1 && fr_jobs() == 0);
    fr_free(r);

    /* nothing the index knows: answered without a write, every id unknown */
    r = fr_call(&env, "memory.provenance",
                "{\"response\": \"Hello there.\", \"injected\": [998, 999]}");
    CHECK(r->done && fr_jobs() == 0);
    CHECK(fr_len(fr_get(r, "memories")) == 0 && fr_len(fr_get(r, "unknown")) == 2);
    CHECK(fr_is_int(fr_get(r, "sentences"), 1));
    fr_free(r);

    /* sentence ends: '.', '!', '?' before whitespace, line breaks, the ideographic full stop
     * and the full-width marks; "3.5" is not an end */
    r = fr_call(&env, "memory.provenance",
                "{\"response\": \"Rates rose 3.5 points. Why?Really\\n\\n"
                "\xe6\x97\xa5\xe6\x9c\xac\xe3\x80\x82\xe6\x9c\xac\xef\xbc\x81"
                "end\", "
                "\"injected\": [999]}");
    CHECK_MSG(r->done && fr_is_int(fr_get(r, "sentences"), 5), "%s", r->json ? r->json : "");
    fr_free(r);
}

/* ---- an index that cannot load ------------------------------------------------------------ */

static void set_access(uint64_t id, void *meta, void *ctx)
{
    mem_meta_set_access(meta, server_now_ms(), *(const uint64_t *)ctx);
}

/* A result's access_count is the index's (the one ranking used) unless the index's count is
 * saturated (MEM_ACCESS_COUNT_MAX): then the database row's, when higher. */
static void test_saturated_access_count(void)
{
    tenant *t = tenants_get(env.srv.tenants, 7, DIM);
    /* memory 1 at a new change (its row is not cached at it), its count saturated */
    mem_meta m = {.seq = index_seq(1, 0) + 100,
                  .created_ms = server_now_ms() - 3600 * 1000,
                  .access = mem_access_word(server_now_ms(), UINT64_MAX),
                  .expires_ms = INT64_MAX,
                  .importance = 0.5f,
                  .type = MEM_FACT,
                  .scope = SCOPE_TENANT};
    tenants_apply_upsert(t, m.seq, 1, mems[0].vec, &m);
    CHECK(index_accesses(1) == MEM_ACCESS_COUNT_MAX);
    row_count_id = 1;
    row_count = "5000000";
    const char *q = "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, 0], \"top_k\": 1, "
                    "\"similarity_weight\": 1, \"count_access\": false}";
    req *r = fr_call(&env, "memory.search", q);
    finish_rows(r);
    CHECK(r->done && fr_is_int(fr_path(r, "results.0.id"), 1));
    CHECK(fr_is_int(fr_path(r, "results.0.access_count"), 5000000));
    fr_free(r);
    /* below the saturation the index's count stands, the row's higher one (cached) not */
    uint64_t id = 1, seven = 7;
    CHECK(vindex_update_meta(tenants_vindex(t), &id, 1, set_access, &seven) == 1);
    r = fr_call(&env, "memory.search", q);
    finish_rows(r);
    CHECK(r->done && fr_is_int(fr_path(r, "results.0.access_count"), 7));
    fr_free(r);
    row_count_id = 0;
    tenants_put(t);
}

static void test_index_unavailable(void)
{
    conn_auth other = env.tenant;
    other.tenant_id = 8; /* not loaded: a background load, which finds no database */
    req *r = fr_call_as(&env, &other, "memory.search",
                        "{\"embedding\": [1, 0, 0, 0, 0, 0, 0, "
                        "0]}");
    for (int i = 0; i < 500 && r->ends == 0; i++) {
        nanosleep(&(struct timespec){0, 4000000}, NULL);
        fr_run_posts();
    }
    CHECK(r->code == RPC_UNAVAILABLE && r->ends == 1);
    CHECK_STR_CONTAINS(r->msg, "index unavailable");
    fr_free(r);
}

int main(void)
{
    if (fr_env_init(&env, NULL, true) < 0) {
        fprintf(stderr, "cannot set up the test server\n");
        return 1;
    }
    env.tiers[TIER_STANDARD].queries_per_day = 0;
    base_ms = server_now_ms();
    load_index();
    test_arguments();
    test_admission();
    test_vector();
    test_text_and_hybrid();
    test_context();
    test_feedback();
    test_provenance();
    test_saturated_access_count();
    test_index_unavailable();
    CHECK(fr_jobs() == 0);
    fr_env_fini(&env);
    CHECK_RETURN();
}
