/* tests/unit/test_m_memory.c: server/methods/m_memory.c and m_memlist.c against a fake
 * request and a fake pool (tests/fakes/fake_req.h): memory.get, memory.delete (by ids, by
 * filter in batches, dry run), memory.update, memory.archive and memory.restore,
 * memory.history, memory.list (orders and cursors) and memory.stats: the arguments each
 * validates, the statements and parameters it sends, the answer it packs from scripted
 * rows, what it changes in a loaded index, and the errors of failed jobs (tier limits as
 * quota_exceeded with their numbers).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "embed.h"
#include "fake_req.h"
#include "pgres.h"
#include "sql.h"
#include "tenants.h"

#define DIM 8
#define NOW_MS INT64_C(1700000000000)

static fr_env env;
static const char *const memrow_names[22] = {
    "id",      "agent_id",    "clade_id", "scope",   "type",     "content",
    "imp",     "metadata",    "created",  "updated", "accessed", "access_count",
    "expires", "archived",    "version",  "seq",     "pinned",   "archived_reason",
    "sup_by",  "merged_into", "cited",    "injected"};

/* Calls method with args as the tenant and expects invalid_argument naming field (NULL: any
 * or none) with no job sent. */
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

static bool val_is(const fr_job *j, int q, size_t i, const char *want)
{
    const char *v = fr_val(j, q, i);
    if (!want)
        return v == NULL;
    return v && strcmp(v, want) == 0;
}

/* Memory rows (SQL_MEMROW_COLS) for ids[0..n) of type fact. */
static PGresult *memrows(const uint64_t *ids, int n)
{
    const char **cells = calloc((size_t)n * 22 + 1, sizeof(*cells));
    char(*bufs)[2048] = calloc((size_t)n + 1, sizeof(*bufs));
    char content[64];
    for (int i = 0; i < n; i++) {
        snprintf(content, sizeof(content), "memory number %llu", (unsigned long long)ids[i]);
        fr_memrow_cells(bufs[i], cells + i * 22, ids[i], "fact", "tenant", content, 0.5, "{}",
                        NOW_MS - 1000 * (int64_t)i, 100 + ids[i]);
    }
    PGresult *r = pgres_make(22, memrow_names, n, cells);
    free(cells);
    free(bufs);
    return r;
}

/* A result of rows of (a, b, meta 14): what the change functions return. */
static PGresult *meta_rows(const char *a, const char *b, const uint64_t *ids, const uint64_t *seqs,
                           int n)
{
    static const char *const names[16] = {
        "a",   "b",       "id",     "seq",   "agent",   "clade",    "scope",  "type",
        "imp", "created", "access", "count", "expires", "archived", "pinned", "tags"};
    const char **cells = calloc((size_t)n * 16 + 1, sizeof(*cells));
    char(*bufs)[512] = calloc((size_t)n + 1, sizeof(*bufs));
    for (int i = 0; i < n; i++) {
        cells[i * 16] = a;
        cells[i * 16 + 1] = b;
        fr_meta_cells(bufs[i], cells + i * 16 + 2, ids[i], seqs[i], "fact", "tenant", 0.5, NOW_MS);
    }
    PGresult *r = pgres_make(16, names, n, cells);
    free(cells);
    free(bufs);
    return r;
}

/* ---- memory.get ------------------------------------------------------------------------ */

static void test_get(void)
{
    expect_invalid("memory.get", "{}", "ids");
    expect_invalid("memory.get", "{\"ids\": []}", "ids");
    expect_invalid("memory.get", "{\"ids\": [1, -2]}", "ids");
    expect_invalid("memory.get", "{\"ids\": \"1\"}", "ids");

    req *r = fr_call(&env, "memory.get", "{\"ids\": [5, 3, 5, 9, 9]}");
    fr_job *j = fr_take();
    /* a read: it may go to a standby, bound to the tenant */
    CHECK(j && j->kind == FR_READ && j->rls == 7 && j->nq == 1);
    CHECK(j && strcmp(j->q[0].name, "memory_get") == 0);
    CHECK(j && val_is(j, 0, 0, "7") && val_is(j, 0, 1, "{5,3,5,9,9}"));
    uint64_t found[] = {5, 3};
    fr_answer1(j, memrows(found, 2));
    CHECK(r->done && r->ends == 1);
    CHECK(fr_len(fr_get(r, "memories")) == 2);
    CHECK(fr_is_int(fr_path(r, "memories.0.id"), 5) && fr_is_int(fr_path(r, "memories.1.id"), 3));
    CHECK(fr_is_str(fr_path(r, "memories.0.content"), "memory number 5"));
    CHECK(fr_is_str(fr_path(r, "memories.1.type"), "fact"));
    /* what was asked and is not there, once, in the order asked */
    const msgpack_object *missing = fr_get(r, "missing");
    CHECK(fr_len(missing) == 1 && fr_is_int(&missing->via.array.ptr[0], 9));
    fr_free(r);

    r = fr_call(&env, "memory.get", "{\"ids\": [1]}");
    fr_answer_error(fr_take(), "40001", "could not serialize", NULL);
    CHECK(r->fail_db && strcmp(r->db_sqlstate, "40001") == 0 && r->ends == 1);
    fr_free(r);
}

/* ---- memory.delete --------------------------------------------------------------------- */

static void test_delete_ids(void)
{
    expect_invalid("memory.delete", "{}", NULL);
    expect_invalid("memory.delete", "{\"ids\": [1], \"filter\": {}}", NULL);
    expect_invalid("memory.delete", "{\"ids\": [1], \"dry_run\": true}", NULL);
    expect_invalid("memory.delete", "{\"ids\": [1], \"all\": true}", NULL);

    /* two memories in the loaded index; the delete takes them out */
    tenant *t = fr_index_loaded(&env, 7, DIM, 0);
    float v[DIM];
    embed_text("alpha", 5, DIM, v);
    mem_meta m = {.created_ms = NOW_MS, .expires_ms = INT64_MAX, .importance = 0.5f};
    tenants_apply_upsert(t, 1, 4, v, &m);
    tenants_apply_upsert(t, 2, 6, v, &m);
    CHECK(vindex_count(tenants_vindex(t)) == 2);

    req *r = fr_call(&env, "memory.delete", "{\"ids\": [4, 6, 8]}");
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_SUBMIT && j->rls == 7);
    CHECK(j && strcmp(j->q[0].name, "memory_delete") == 0);
    CHECK(j && val_is(j, 0, 0, "7") && val_is(j, 0, 1, "{4,6,8}"));
    fr_answer1(j, fr_rows("id|seq", 2, "4|3", "6|4"));
    CHECK(r->done);
    const msgpack_object *d = fr_get(r, "deleted");
    CHECK(fr_len(d) == 2 && fr_is_int(&d->via.array.ptr[0], 4) &&
          fr_is_int(&d->via.array.ptr[1], 6));
    CHECK(vindex_count(tenants_vindex(t)) == 0);
    fr_free(r);
    tenants_put(t);

    r = fr_call(&env, "memory.delete", "{\"ids\": [4]}");
    fr_answer_unavailable(fr_take(), "lost");
    CHECK(r->fail_db && r->db_status == DB_UNAVAILABLE);
    fr_free(r);
}

/* The statement parameters of a delete by filter: [0] tenant, [1..16] the filter, [17] the
 * owning agent, [18] clade, [19] the last id, [20] the batch size, [21] after. */
static void test_delete_filter(void)
{
    expect_invalid("memory.delete", "{\"filter\": {}}", NULL); /* an empty filter needs all */
    expect_invalid("memory.delete", "{\"filter\": {\"include_archived\": false}}", NULL);
    expect_invalid("memory.delete", "{\"filter\": {\"type_filter\": [\"fact\"]}, \"all\": true}",
                   NULL);
    expect_invalid("memory.delete", "{\"filter\": {\"colour\": 1}}", "filter.colour");
    expect_invalid("memory.delete", "{\"filter\": {\"min_importance\": 2}}",
                   "filter.min_importance");
    expect_invalid("memory.delete", "{\"filter\": {\"type_filter\": [\"gossip\"]}}", NULL);

    /* everything: batches of 1,000 under the tenant's lock, up to its last id */
    req *r = fr_call(&env, "memory.delete", "{\"filter\": {}, \"all\": true}");
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_SUBMIT && j->rls == 7 && j->nq == 2);
    CHECK(j && strcmp(j->q[0].name, "memory_delete_lock") == 0 && val_is(j, 0, 0, "7"));
    CHECK(j && strcmp(j->q[1].name, "memory_delete_filter") == 0 && j->q[1].nvalues == 22);
    /* archived memories go too (include_archived defaults to true here); no owner; the
     * first batch has no last id and starts at the beginning */
    CHECK(j && val_is(j, 1, 2, "true") && val_is(j, 1, 17, NULL) && val_is(j, 1, 18, NULL));
    CHECK(j && val_is(j, 1, 19, NULL) && val_is(j, 1, 20, "1000") && val_is(j, 1, 21, NULL));
    /* a full batch: another follows, after its last id, up to the id the first saw */
    char **rows = calloc(1000, sizeof(*rows));
    PGresult *batch = pgres_make(2, (const char *const[]){"id", "seq"}, 0, NULL);
    for (int i = 0; i < 1000; i++) {
        char id[16], seq[16];
        snprintf(id, sizeof(id), "%d", 10 + i);
        snprintf(seq, sizeof(seq), "%d", 5000 + i);
        PQsetvalue(batch, i, 0, id, (int)strlen(id));
        PQsetvalue(batch, i, 1, seq, (int)strlen(seq));
    }
    free(rows);
    PGresult *two[2] = {fr_rows("last", 1, "2000"), batch};
    fr_answer(j, two, 2);
    CHECK(r->ends == 0 && fr_jobs() == 1);
    j = fr_take();
    CHECK(j && j->nq == 2 && val_is(j, 1, 19, "2000") && val_is(j, 1, 21, "1009"));
    PGresult *last[2] = {fr_rows("last", 1, "2000"),
                         fr_rows("id|seq", 2, "1500|7000", "1600|7001")};
    fr_answer(j, last, 2);
    CHECK(r->done && fr_is_int(fr_get(r, "count"), 1002) &&
          fr_is_bool(fr_get(r, "dry_run"), false));
    fr_free(r);

    /* a dry run counts what the filter selects: the owner's memories (agent_id selects
     * ownership, not visibility) */
    r = fr_call(&env, "memory.delete",
                "{\"filter\": {\"agent_id\": 5, \"include_archived\": false}, \"dry_run\": true}");
    j = fr_take();
    CHECK(j && j->nq == 1 && strcmp(j->q[0].name, "memory_delete_count") == 0);
    CHECK(j && j->q[0].nvalues == 19);
    CHECK(j && val_is(j, 0, 2, "false") && val_is(j, 0, 3, NULL) && val_is(j, 0, 17, "5"));
    fr_answer1(j, fr_rows("count", 1, "12"));
    CHECK(r->done && fr_is_int(fr_get(r, "count"), 12) && fr_is_bool(fr_get(r, "dry_run"), true));
    fr_free(r);

    /* a batch that fails: earlier ones stay deleted, the error goes to the client */
    r = fr_call(&env, "memory.delete", "{\"filter\": {\"clade_id\": 3}}");
    j = fr_take();
    CHECK(j && val_is(j, 1, 18, "3") && val_is(j, 1, 4, NULL));
    fr_answer_error(j, "55P03", "lock timeout", NULL);
    CHECK(r->fail_db && strcmp(r->db_sqlstate, "55P03") == 0);
    fr_free(r);
}

/* ---- memory.update ---------------------------------------------------------------------- */

static void test_update(void)
{
    expect_invalid("memory.update", "{\"id\": 5}", NULL);
    expect_invalid("memory.update", "{\"content\": \"x\"}", "id");
    expect_invalid("memory.update", "{\"id\": 5, \"type\": \"gossip\"}", "type");
    expect_invalid("memory.update", "{\"id\": 5, \"importance\": 1.5}", "importance");
    expect_invalid("memory.update", "{\"id\": 5, \"expires_at\": 1, \"ttl_seconds\": 60}", NULL);
    expect_invalid("memory.update", "{\"id\": 5, \"expires_at\": 1000}", "expires_at");
    expect_invalid("memory.update", "{\"id\": 5, \"embedding\": [1, 2, 3]}", "embedding");
    expect_invalid("memory.update", "{\"id\": 5, \"embedding\": [0, 0, 0, 0, 0, 0, 0, 0]}",
                   "embedding");
    expect_invalid("memory.update", "{\"id\": 5, \"metadata\": {\"tokens\": \"ETH\"}}", NULL);
    expect_invalid("memory.update", "{\"id\": 5, \"content\": \"   \"}", "content");

    /* new content: embedded (the builtin provider, inline), the vector sent in binary */
    tenant *t = fr_index_loaded(&env, 7, DIM, 10);
    float old[DIM];
    embed_text("old text", 8, DIM, old);
    mem_meta m = {.created_ms = NOW_MS, .expires_ms = INT64_MAX, .importance = 0.5f};
    tenants_apply_upsert(t, 11, 5, old, &m);
    req *r = fr_call(&env, "memory.update",
                     "{\"id\": 5, \"content\": \"the bridge is closed\", \"pinned\": true, "
                     "\"metadata\": {\"tokens\": [\"ETH\"]}}");
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_SUBMIT && j->rls == 7 && strcmp(j->q[0].name, "memory_update") == 0);
    CHECK(j && j->q[0].nvalues == 12 && val_is(j, 0, 11, "3"));
    /* tenant, id, content, type, importance, metadata, vector, expires, clear expiry,
     * pinned, the tiers' memory limits, the embedding generation of the vector */
    CHECK(j && val_is(j, 0, 0, "7") && val_is(j, 0, 1, "5") &&
          val_is(j, 0, 2, "the bridge is closed"));
    CHECK(j && val_is(j, 0, 3, NULL) && val_is(j, 0, 4, NULL));
    CHECK(j && val_is(j, 0, 5, "{\"tokens\":[\"ETH\"]}"));
    CHECK(j && val_is(j, 0, 7, NULL) && val_is(j, 0, 8, "false") && val_is(j, 0, 9, "true"));
    CHECK(j && val_is(j, 0, 10, env.memory_limits));
    float want[DIM];
    embed_text("the bridge is closed", 20, DIM, want);
    CHECK(j && j->q[0].formats[6] == 1 && j->q[0].lengths[6] == DIM * 4);
    CHECK(j && fr_val(j, 0, 6) && memcmp(fr_val(j, 0, 6), want, sizeof(want)) == 0);
    uint64_t id = 5, seq = 12;
    fr_answer1(j, meta_rows("3", "1700000005000", &id, &seq, 1));
    CHECK(r->done && fr_is_int(fr_get(r, "id"), 5) && fr_is_int(fr_get(r, "version"), 3));
    CHECK(fr_is_int(fr_get(r, "updated_at"), 1700000005000));
    /* the index has the new vector, as of change 12 */
    float got[DIM];
    CHECK(vindex_get_vector(tenants_vindex(t), 5, got) == 0 && fabsf(got[0] - want[0]) < 1e-6f &&
          fabsf(got[DIM - 1] - want[DIM - 1]) < 1e-6f);
    mem_meta gm;
    CHECK(vindex_get_meta(tenants_vindex(t), 5, &gm) == 0 && gm.seq == 12);
    fr_free(r);
    tenants_put(t);

    /* metadata only: no vector; expires_at 0 clears the expiry; ttl_seconds from now */
    r = fr_call(&env, "memory.update", "{\"id\": 5, \"importance\": 0.25, \"expires_at\": 0}");
    j = fr_take();
    CHECK(j && val_is(j, 0, 4, "0.25") && val_is(j, 0, 6, NULL) && val_is(j, 0, 7, NULL) &&
          val_is(j, 0, 8, "true"));
    fr_job_free(j);
    fr_free(r);
    int64_t before = server_now_ms();
    r = fr_call(&env, "memory.update", "{\"id\": 5, \"ttl_seconds\": 60, \"type\": \"episode\"}");
    j = fr_take();
    CHECK(j && val_is(j, 0, 3, "episode"));
    long long exp = j && fr_val(j, 0, 7) ? atoll(fr_val(j, 0, 7)) : 0;
    CHECK(exp >= before + 60000 && exp <= server_now_ms() + 60000);
    /* the tier's byte limit: quota_exceeded with the numbers of the DETAIL */
    fr_answer_error(j, "EG429", "memory byte limit of the tier reached",
                    "limit=1000 usage=990 requested=40");
    CHECK(r->code == RPC_QUOTA_EXCEEDED && !r->fail_db);
    CHECK(fr_is_int(fr_get(r, "limit"), 1000) && fr_is_int(fr_get(r, "usage"), 990));
    CHECK(fr_is_int(fr_get(r, "requested"), 40));
    CHECK(fr_is_str(fr_get(r, "quota"), "memory_bytes"));
    fr_free(r);

    /* a given vector is not embedded: sent as given */
    r = fr_call(&env, "memory.update", "{\"id\": 5, \"embedding\": [1, 0, 0, 0, 0, 0, 0, 2]}");
    j = fr_take();
    float given[DIM] = {1, 0, 0, 0, 0, 0, 0, 2};
    CHECK(j && fr_val(j, 0, 6) && memcmp(fr_val(j, 0, 6), given, sizeof(given)) == 0);
    fr_answer_error(j, "EG404", "memory 5 not found", NULL);
    CHECK(r->fail_db && strcmp(r->db_sqlstate, "EG404") == 0);
    fr_free(r);
}

/* ---- memory.archive and memory.restore ---------------------------------------------------- */

static void test_archive(void)
{
    expect_invalid("memory.archive", "{}", "ids");
    expect_invalid("memory.archive", "{\"ids\": [1], \"reason\": \"\"}", "reason");
    expect_invalid("memory.restore", "{\"ids\": []}", "ids");

    req *r = fr_call(&env, "memory.archive", "{\"ids\": [2, 3], \"reason\": \"stale\"}");
    fr_job *j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "memory_archive") == 0 && j->rls == 7);
    CHECK(j && val_is(j, 0, 1, "{2,3}") && val_is(j, 0, 2, "true") && val_is(j, 0, 3, "stale"));
    CHECK(j && val_is(j, 0, 4, env.memory_limits));
    uint64_t ids[] = {2, 3}, seqs[] = {20, 21};
    fr_answer1(j, meta_rows("0", "0", ids, seqs, 2));
    const msgpack_object *a = fr_get(r, "archived");
    CHECK(r->done && fr_len(a) == 2 && fr_is_int(&a->via.array.ptr[1], 3));
    fr_free(r);

    r = fr_call(&env, "memory.archive", "{\"ids\": [2]}");
    j = fr_take();
    CHECK(j && val_is(j, 0, 3, "manual"));
    fr_job_free(j);
    fr_free(r);

    /* a restore counts against the live memory limit */
    r = fr_call(&env, "memory.restore", "{\"ids\": [2, 3]}");
    j = fr_take();
    CHECK(j && val_is(j, 0, 2, "false") && val_is(j, 0, 3, NULL));
    fr_answer_error(j, "EG429", "memory limit of the tier reached",
                    "limit=100 usage=99 requested=2");
    CHECK(r->code == RPC_QUOTA_EXCEEDED);
    CHECK(fr_is_int(fr_get(r, "limit"), 100) && fr_is_int(fr_get(r, "usage"), 99));
    CHECK(fr_is_int(fr_get(r, "requested"), 2) && fr_is_str(fr_get(r, "quota"), "memories"));
    fr_free(r);

    r = fr_call(&env, "memory.restore", "{\"ids\": [2]}");
    j = fr_take();
    fr_answer1(j, meta_rows("0", "0", ids, seqs, 1));
    a = fr_get(r, "restored");
    CHECK(r->done && fr_len(a) == 1 && fr_is_int(&a->via.array.ptr[0], 2));
    fr_free(r);
}

/* ---- memory.history --------------------------------------------------------------------- */

static void test_history(void)
{
    expect_invalid("memory.history", "{}", "id");
    req *r = fr_call(&env, "memory.history", "{\"id\": 5}");
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_READ && j->nq == 2);
    CHECK(j && strcmp(j->q[0].name, "memory_get") == 0 && val_is(j, 0, 1, "{5}"));
    CHECK(j && strcmp(j->q[1].name, "memory_history") == 0 && val_is(j, 1, 1, "5"));
    uint64_t id = 5;
    PGresult *res[2] = {memrows(&id, 1),
                        fr_rows("v|content|type|imp|md|from|to|change|detail|exp|arch", 1,
                                "1|first words|fact|0.3|{}|100|200|update|{\"by\": \"x\"}|\\N|"
                                "\\N")};
    fr_answer(j, res, 2);
    CHECK(r->done && fr_is_int(fr_get(r, "id"), 5));
    const msgpack_object *v = fr_get(r, "versions");
    CHECK(fr_len(v) == 2);
    CHECK(fr_is_str(fr_path(r, "versions.0.content"), "first words"));
    CHECK(fr_is_str(fr_path(r, "versions.0.replaced_by"), "update"));
    CHECK(fr_is_str(fr_path(r, "versions.0.detail.by"), "x"));
    CHECK(fr_is_int(fr_path(r, "versions.0.valid_to"), 200));
    CHECK(fr_is_nil(fr_path(r, "versions.0.expires_at")));
    /* the current version last, open-ended */
    CHECK(fr_is_str(fr_path(r, "versions.1.content"), "memory number 5"));
    CHECK(fr_is_nil(fr_path(r, "versions.1.valid_to")));
    CHECK(fr_is_int(fr_path(r, "versions.1.version"), 1));
    fr_free(r);

    r = fr_call(&env, "memory.history", "{\"id\": 6}");
    PGresult *none[2] = {memrows(NULL, 0), fr_rows("v", 0)};
    fr_answer(fr_take(), none, 2);
    CHECK(r->code == RPC_NOT_FOUND);
    CHECK_STR_CONTAINS(r->msg, "6");
    fr_free(r);
}

/* ---- memory.list ---------------------------------------------------------------------- */

/* memory.list's rows: a sort key and a signed id, then the memory. */
static PGresult *list_rows(const uint64_t *ids, int n)
{
    const char *names[24] = {"key", "sid"};
    memcpy(names + 2, memrow_names, sizeof(memrow_names));
    const char **cells = calloc((size_t)n * 24 + 1, sizeof(*cells));
    char(*bufs)[2048] = calloc((size_t)n + 1, sizeof(*bufs));
    char(*keys)[2][32] = calloc((size_t)n + 1, sizeof(*keys));
    for (int i = 0; i < n; i++) {
        snprintf(keys[i][0], 32, "%lld", (long long)(NOW_MS - i));
        snprintf(keys[i][1], 32, "%llu", (unsigned long long)ids[i]);
        cells[i * 24] = keys[i][0];
        cells[i * 24 + 1] = keys[i][1];
        fr_memrow_cells(bufs[i], cells + i * 24 + 2, ids[i], "episode", "agent", "listed", 0.4,
                        "{}", NOW_MS - i, 1);
    }
    PGresult *r = pgres_make(24, names, n, cells);
    free(cells);
    free(bufs);
    free(keys);
    return r;
}

static void test_list(void)
{
    expect_invalid("memory.list", "{\"order_by\": \"size\"}", "order_by");
    expect_invalid("memory.list", "{\"order\": \"up\"}", "order");
    expect_invalid("memory.list", "{\"limit\": 0}", "limit");
    expect_invalid("memory.list", "{\"cursor\": \"v2:x\"}", "cursor");
    expect_invalid("memory.list", "{\"scopes\": [\"galaxy\"]}", NULL);

    req *r = fr_call(&env, "memory.list", NULL);
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_READ && strcmp(j->q[0].name, "memory_list") == 0);
    CHECK(j && j->q[0].nvalues == 22);
    /* tenant, the filter ($2..$17; archived ones not included), then order, sign, cursor
     * key, cursor id, limit */
    CHECK(j && val_is(j, 0, 0, "7") && val_is(j, 0, 2, "false"));
    CHECK(j && val_is(j, 0, 17, "created_at") && val_is(j, 0, 18, "1"));
    CHECK(j && val_is(j, 0, 19, NULL) && val_is(j, 0, 20, NULL) && val_is(j, 0, 21, "100"));
    uint64_t ids[] = {31, 30};
    fr_answer1(j, list_rows(ids, 2));
    CHECK(r->done && fr_len(fr_get(r, "memories")) == 2);
    CHECK(fr_is_int(fr_path(r, "memories.1.id"), 30));
    CHECK(fr_is_str(fr_path(r, "memories.0.scope"), "agent"));
    CHECK(fr_is_nil(fr_get(r, "next_cursor"))); /* fewer than the limit */
    fr_free(r);

    /* a full page: a cursor that the next call takes back, with the first page's time */
    r = fr_call(&env, "memory.list",
                "{\"order_by\": \"importance\", \"order\": \"asc\", \"limit\": 2, "
                "\"type_filter\": [\"episode\"], \"include_embedding\": false}");
    j = fr_take();
    CHECK(j && val_is(j, 0, 17, "importance") && val_is(j, 0, 18, "-1") && val_is(j, 0, 21, "2"));
    CHECK(j && fr_val(j, 0, 1) != NULL); /* the types */
    char asof[32] = "";
    if (j && fr_val(j, 0, 14))
        snprintf(asof, sizeof(asof), "%s", fr_val(j, 0, 14));
    fr_answer1(j, list_rows(ids, 2));
    const msgpack_object *cur = fr_get(r, "next_cursor");
    char want[200], cursor[200] = "";
    snprintf(want, sizeof(want), "v1:importance:-1:%s:%lld:30", asof, (long long)(NOW_MS - 1));
    CHECK(cur && cur->type == MSGPACK_OBJECT_STR);
    if (cur && cur->type == MSGPACK_OBJECT_STR)
        snprintf(cursor, sizeof(cursor), "%.*s", (int)cur->via.str.size, cur->via.str.ptr);
    CHECK_MSG(strcmp(cursor, want) == 0, "cursor %s, not %s", cursor, want);
    fr_free(r);
    char args[400];
    snprintf(args, sizeof(args),
             "{\"order_by\": \"importance\", \"order\": \"asc\", \"limit\": 2, \"cursor\": "
             "\"%s\", \"include_embedding\": true}",
             cursor);
    r = fr_call(&env, "memory.list", args);
    j = fr_take();
    char key[40];
    snprintf(key, sizeof(key), "%lld", (long long)(NOW_MS - 1));
    CHECK(j && strcmp(j->q[0].name, "memory_list_emb") == 0);
    CHECK(j && val_is(j, 0, 14, asof) && val_is(j, 0, 19, key) && val_is(j, 0, 20, "30"));
    fr_job_free(j);
    fr_free(r);
    /* a cursor of another order is refused */
    snprintf(args, sizeof(args), "{\"order_by\": \"composite\", \"cursor\": \"%s\"}", cursor);
    expect_invalid("memory.list", args, "cursor");

    r = fr_call(&env, "memory.list", NULL);
    fr_answer_unavailable(fr_take(), "x");
    CHECK(r->fail_db);
    fr_free(r);
}

/* ---- memory.stats ----------------------------------------------------------------------- */

static void test_stats(void)
{
    expect_invalid("memory.stats", "{\"x\": 1}", "x");
    conn_auth other = env.tenant;
    other.tenant_id = 99; /* no index loaded in this process */
    req *r = fr_call_as(&env, &other, "memory.stats", NULL);
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_READ && j->nq == 3 && j->rls == 99);
    CHECK(j && strcmp(j->q[2].name, "reembed_state") == 0 && val_is(j, 2, 0, "99"));
    CHECK(j && strcmp(j->q[0].name, "memory_stats") == 0 && val_is(j, 0, 0, "99"));
    CHECK(j && strcmp(j->q[1].name, "tenant_index_engine") == 0);
    PGresult *res[2] = {fr_rows("type|scope|n|archived|lo|hi|bytes", 3,
                                "fact|tenant|3|1|100|200|50", "episode|agent|2|0|50|300|25",
                                "fact|agent|1|0|400|400|5"),
                        fr_rows("engine", 1, "faiss")};
    fr_answer(j, res, 2);
    CHECK(r->done);
    CHECK(fr_is_int(fr_get(r, "total"), 6) && fr_is_int(fr_get(r, "archived"), 1));
    CHECK(fr_is_int(fr_path(r, "by_type.fact"), 4) && fr_is_int(fr_path(r, "by_type.episode"), 2));
    CHECK(fr_is_int(fr_path(r, "by_type.constraint"), 0));
    CHECK(fr_is_int(fr_path(r, "by_scope.tenant"), 3) &&
          fr_is_int(fr_path(r, "by_scope.agent"), 3));
    CHECK(fr_is_int(fr_get(r, "oldest_at"), 50) && fr_is_int(fr_get(r, "newest_at"), 400));
    CHECK(fr_is_int(fr_get(r, "storage_bytes"), 80));
    /* not loaded here: the engine its next load will use, the rest nil */
    CHECK(fr_is_str(fr_path(r, "index.engine"), "faiss"));
    CHECK(fr_is_bool(fr_path(r, "index.loaded"), false));
    CHECK(fr_is_nil(fr_path(r, "index.vectors")) && fr_is_nil(fr_path(r, "index.kind")));
    fr_free(r);

    /* no memories; the engine unset: the server's */
    r = fr_call_as(&env, &other, "memory.stats", NULL);
    PGresult *empty[2] = {fr_rows("type|scope|n|archived|lo|hi|bytes", 0),
                          fr_rows("engine", 1, "\\N")};
    fr_answer(fr_take(), empty, 2);
    CHECK(fr_is_int(fr_get(r, "total"), 0) && fr_is_nil(fr_get(r, "oldest_at")));
    CHECK(fr_is_str(fr_path(r, "index.engine"), env.srv.cfg.index_engine));
    fr_free(r);

    /* tenant 7's index is loaded (test_update put memory 5 in it) */
    r = fr_call(&env, "memory.stats", NULL);
    PGresult *res7[2] = {fr_rows("type|scope|n|archived|lo|hi|bytes", 0),
                         fr_rows("engine", 1, "faiss")};
    fr_answer(fr_take(), res7, 2);
    CHECK(fr_is_bool(fr_path(r, "index.loaded"), true));
    CHECK(fr_is_str(fr_path(r, "index.engine"), "native")); /* as loaded, not as configured */
    CHECK(fr_is_int(fr_path(r, "index.vectors"), 1));
    CHECK(fr_is_str(fr_path(r, "index.kind"), "flat"));
    fr_free(r);
}

int main(void)
{
    /* background threads: a metadata change of a memory the index has no vector for
     * schedules a catch-up (which finds no database here) */
    if (fr_env_init(&env, NULL, true) < 0) {
        fprintf(stderr, "cannot set up the test server\n");
        return 1;
    }
    test_get();
    test_delete_ids();
    test_delete_filter();
    test_update();
    test_archive();
    test_history();
    test_list();
    test_stats();
    CHECK(fr_jobs() == 0);
    fr_env_fini(&env);
    CHECK_RETURN();
}
