/* tests/unit/test_m_store.c: server/methods/m_store.c and the worker's group commit it goes
 * through (gcommit.c), against a fake request and a fake pool (tests/fakes/fake_req.h):
 * memory.store and memory.store_batch: every field's validation (types, aliases, scopes and
 * their owners, times, expiry, vectors, metadata, nested items named by their place), the
 * embedding of texts without a vector, the statement a store takes (alone: the cheap solo
 * statement, then the group function when it answers nothing; in a group with other
 * tenants' stores, sorted by tenant; a large batch on its own; with an idempotency key, the
 * batch function and the request's fingerprint), the answers, the index updates, one
 * request's refusal never failing another's, a tenant whose row is held elsewhere sent to
 * its lane, whole-job failures, and the change announcement after the commit.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "check.h"
#include "embed.h"
#include "fake_req.h"
#include "pgres.h"
#include "tenants.h"

#define DIM 8
#define NOW_MS INT64_C(1700000000000)

static fr_env env;

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

static bool val_is(const fr_job *j, size_t i, const char *want)
{
    const char *v = fr_val(j, 0, i);
    if (!want)
        return v == NULL;
    return v && strcmp(v, want) == 0;
}

/* The rows a store statement answers (20 columns: idx, replay, created, the 14 meta
 * columns, err state, message, detail): one per memory ids[k] (seq seqs[k]) of tenant
 * order, replayed or not; tags NULL (a new memory). */
static const char *const store_cols[20] = {"idx",    "replay",   "created", "id",       "seq",
                                           "agent",  "clade",    "scope",   "type",     "imp",
                                           "cr",     "accessed", "count",   "expires",  "arch",
                                           "pinned", "tags",     "estate",  "emessage", "edetail"};

static void store_row(PGresult *r, int row, uint64_t id, uint64_t seq, bool replay)
{
    char b[64];
    const char *cells[20] = {NULL};
    char meta[512];
    fr_meta_cells(meta, cells + 3, id, seq, "fact", "tenant", 0.5, NOW_MS);
    cells[1] = replay ? "t" : "f";
    snprintf(b, sizeof(b), "%lld", (long long)NOW_MS + (int64_t)id);
    cells[2] = b;
    for (int c = 0; c < 20; c++)
        PQsetvalue(r, row, c, (char *)cells[c], cells[c] ? (int)strlen(cells[c]) : -1);
}

/* A refusal row: sqlstate, message, detail in the last three columns. */
static void refusal_row(PGresult *r, int row, const char *state, const char *msg,
                        const char *detail)
{
    for (int c = 0; c < 17; c++)
        PQsetvalue(r, row, c, NULL, -1);
    PQsetvalue(r, row, 17, (char *)state, (int)strlen(state));
    PQsetvalue(r, row, 18, (char *)msg, (int)strlen(msg));
    PQsetvalue(r, row, 19, (char *)detail, detail ? (int)strlen(detail) : -1);
}

static PGresult *store_result(void)
{
    return pgres_make(20, store_cols, 0, NULL);
}

/* Runs the worker's loop until its due timers ran (the announcement waits 5 ms). */
static void run_timers(void)
{
    nanosleep(&(struct timespec){0, 12000000}, NULL);
    event_base_loop(worker_base(env.w), EVLOOP_NONBLOCK);
}

/* Runs the due timers and answers every announcement they sent (the group leaves once
 * nothing is in flight). */
static void drain_notes(void)
{
    run_timers();
    fr_job *j;
    while ((j = fr_take())) {
        CHECK(j->kind == FR_POOL && strcmp(j->q[0].name, "notify_changes") == 0);
        fr_answer1(j, fr_rows("count", 1, "1"));
    }
}

/* Answers the announcement job that follows a commit and checks what it says. */
static void expect_notify(const char *want)
{
    run_timers();
    fr_job *j = fr_take();
    CHECK(j && j->kind == FR_POOL && strcmp(j->q[0].name, "notify_changes") == 0);
    CHECK_MSG(j && val_is(j, 0, want), "notify %s, not %s", j ? fr_val(j, 0, 0) : "(none)", want);
    if (j)
        fr_answer1(j, fr_rows("count", 1, "1"));
}

/* ---- validation -------------------------------------------------------------------------- */

static void test_validation(void)
{
    const char *s = "memory.store";
    expect_invalid(s, "{\"type\": \"fact\", \"importance\": 0.5}", "content");
    expect_invalid(s, "{\"content\": \"\", \"type\": \"fact\", \"importance\": 0.5}", "content");
    expect_invalid(s, "{\"content\": \"x\", \"importance\": 0.5}", "type");
    expect_invalid(s, "{\"content\": \"x\", \"type\": \"fact\"}", "importance");
    expect_invalid(s, "{\"content\": \"x\", \"type\": \"gossip\", \"importance\": 0.5}", "type");
    expect_invalid(s, "{\"content\": \"x\", \"type\": \"fact\", \"importance\": -0.1}",
                   "importance");
    /* the alias names the same parameter: both given must agree */
    expect_invalid(s,
                   "{\"content\": \"x\", \"type\": \"fact\", \"memory_type\": \"episode\", "
                   "\"importance\": 0.5}",
                   NULL);
    expect_invalid(
        s, "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, \"scope\": \"agent\"}",
        "agent_id");
    expect_invalid(
        s, "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, \"scope\": \"clade\"}",
        "clade_id");
    expect_invalid(
        s, "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, \"scope\": \"world\"}",
        "scope");
    expect_invalid(s,
                   "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, "
                   "\"created_at\": 99999999999999}",
                   "created_at");
    expect_invalid(s,
                   "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, "
                   "\"last_accessed_at\": 99999999999999}",
                   "last_accessed_at");
    expect_invalid(s,
                   "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, "
                   "\"expires_at\": 1000}",
                   "expires_at");
    expect_invalid(s,
                   "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, "
                   "\"expires_at\": 99999999999999, \"ttl_seconds\": 5}",
                   NULL);
    expect_invalid(s,
                   "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, "
                   "\"embedding\": [1, 2]}",
                   "embedding");
    expect_invalid(s,
                   "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, "
                   "\"embedding\": [0, 0, 0, 0, 0, 0, 0, 0]}",
                   "embedding");
    expect_invalid(s,
                   "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, "
                   "\"metadata\": {\"chains\": [\"one\"]}}",
                   NULL);
    expect_invalid(s,
                   "{\"content\": \"x\", \"type\": \"fact\", \"importance\": 0.5, "
                   "\"idempotency_key\": \"\"}",
                   "idempotency_key");
    /* nothing to embed: the provider's refusal names the field */
    expect_invalid(s, "{\"content\": \"  \\n \", \"type\": \"fact\", \"importance\": 0.5}",
                   "content");

    const char *b = "memory.store_batch";
    expect_invalid(b, "{\"memories\": []}", "memories");
    expect_invalid(
        b, "{\"memories\": [{\"content\": \"a\", \"type\": \"fact\", \"importance\": 1}, 3]}",
        "memories[1]");
    expect_invalid(b, "{\"memories\": [{\"type\": \"fact\", \"importance\": 1}]}",
                   "memories[0].content");
    expect_invalid(b,
                   "{\"memories\": [{\"content\": \"a\", \"type\": \"fact\", \"importance\": 1}, "
                   "{\"content\": \"b\", \"type\": \"fact\", \"importance\": 1, \"colour\": 2}]}",
                   "memories[1].colour");
    expect_invalid(b,
                   "{\"memories\": [{\"content\": \"a\", \"type\": \"fact\", \"importance\": 1}, "
                   "{\"content\": \"b\", \"type\": \"rumour\", \"importance\": 1}]}",
                   "memories[1].type");
    expect_invalid(b,
                   "{\"memories\": [{\"content\": \"a\", \"type\": \"fact\", \"importance\": 1, "
                   "\"scope\": \"clade\"}]}",
                   "memories[0].clade_id");
    expect_invalid(b,
                   "{\"memories\": [{\"content\": \"a\", \"type\": \"fact\", \"importance\": 1}, "
                   "{\"content\": \"b\", \"type\": \"fact\", \"importance\": 1, \"embedding\": "
                   "[1]}]}",
                   "memories[1].embedding");
    expect_invalid(b,
                   "{\"memories\": [{\"content\": \"a\", \"type\": \"fact\", \"importance\": 1}, "
                   "{\"content\": \" \", \"type\": \"fact\", \"importance\": 1}]}",
                   "memories[1].content");
}

/* ---- alone: the solo statement, then the group function ------------------------------------ */

static void test_store_alone(void)
{
    tenant *t = fr_index_loaded(&env, 7, DIM, 0);
    req *r =
        fr_call(&env, "memory.store",
                "{\"content\": \"gas is \\\"cheap\\\" on L2\", \"memory_type\": \"preference\", "
                "\"importance\": 0.75, \"agent_id\": 12, \"metadata\": {\"tokens\": "
                "[\"ETH\"]}, \"pinned\": true, \"ttl_seconds\": 3600}");
    CHECK(r->ends == 0 && fr_jobs() == 1);
    fr_job *j = fr_take();
    /* one request alone, of few memories: the solo statement, for its tenant */
    CHECK(j && j->kind == FR_POOL && j->rls == 7);
    CHECK(j && strcmp(j->q[0].name, "memory_store_solo") == 0 && j->q[0].nvalues == 19);
    /* tenants, counts, dims, limits, agents, clades, scopes, types, contents, importances,
     * metadata, vectors, created, updated, accessed, access counts, expiry, pinned, the
     * embedding generations */
    CHECK(j && val_is(j, 18, "{3}"));
    CHECK(j && val_is(j, 0, "{7}") && val_is(j, 1, "{1}") && val_is(j, 2, "{8}"));
    CHECK(j && val_is(j, 3, env.memory_limits));
    CHECK(j && val_is(j, 4, "{12}") && val_is(j, 5, "{0}") && val_is(j, 6, "{\"agent\"}"));
    CHECK(j && val_is(j, 7, "{\"preference\"}"));
    CHECK(j && val_is(j, 8, "{\"gas is \\\"cheap\\\" on L2\"}"));
    CHECK(j && val_is(j, 9, "{0.75}"));
    CHECK(j && val_is(j, 10, "{\"{\\\"tokens\\\":[\\\"ETH\\\"]}\"}"));
    CHECK(j && val_is(j, 12, "{NULL}") && val_is(j, 13, "{NULL}") && val_is(j, 14, "{NULL}"));
    CHECK(j && val_is(j, 15, "{NULL}") && val_is(j, 17, "{t}"));
    long long exp = j && fr_val(j, 0, 16) ? atoll(fr_val(j, 0, 16) + 1) : 0;
    CHECK(exp > server_now_ms() + 3590000 && exp <= server_now_ms() + 3600000);
    /* the vector: the builtin embedding of the content, binary */
    float want[DIM];
    const char *text = "gas is \"cheap\" on L2";
    embed_text(text, strlen(text), DIM, want);
    CHECK(j && j->q[0].formats[11] == 1 && j->q[0].lengths[11] == DIM * 4);
    CHECK(j && fr_val(j, 0, 11) && memcmp(fr_val(j, 0, 11), want, sizeof(want)) == 0);
    PGresult *res = store_result();
    store_row(res, 0, 501, 31, false);
    fr_answer1(j, res);
    CHECK(r->done && r->ends == 1);
    CHECK(fr_is_int(fr_get(r, "id"), 501) && fr_is_int(fr_get(r, "created_at"), NOW_MS + 501));
    CHECK(fr_is_bool(fr_get(r, "replayed"), false));
    /* the index has it, with the tags derived from the request's metadata */
    float got[DIM];
    mem_meta m;
    CHECK(vindex_get_vector(tenants_vindex(t), 501, got) == 0 && fabsf(got[3] - want[3]) < 1e-6f);
    CHECK(vindex_get_meta(tenants_vindex(t), 501, &m) == 0 && m.seq == 31 && m.ntags == 1);
    fr_free(r);
    /* then the change is announced to the other processes, 5 ms later */
    CHECK(fr_jobs() == 0);
    expect_notify("{7:31}");
    tenants_put(t);

    /* the solo statement answers nothing when it did not store (a limit): the group
     * function says why, alone, with the probe of a held row */
    r = fr_call(&env, "memory.store",
                "{\"content\": \"one more\", \"type\": \"fact\", "
                "\"importance\": 0.5}");
    j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "memory_store_solo") == 0);
    fr_answer1(j, store_result());
    CHECK(r->ends == 0);
    j = fr_take();
    CHECK(j && j->kind == FR_POOL && j->rls == -1);
    CHECK(j && strcmp(j->q[0].name, "memory_store_group") == 0 && j->q[0].nvalues == 22);
    CHECK(j && !fr_val(j, 0, 20) && !fr_val(j, 0, 21)); /* no idempotency key: NULL arrays */
    char probe[16];
    snprintf(probe, sizeof(probe), "%d", env.srv.cfg.write_lock_probe_ms);
    CHECK(j && val_is(j, 0, "{7}") && val_is(j, 3, env.memory_limits) && val_is(j, 19, probe));
    res = store_result();
    refusal_row(res, 0, "EG429", "memory limit of the tenant's tier reached",
                "limit=10 usage=10 requested=1");
    fr_answer1(j, res);
    CHECK(r->code == RPC_QUOTA_EXCEEDED && r->ends == 1);
    CHECK(fr_is_int(fr_get(r, "limit"), 10) && fr_is_int(fr_get(r, "usage"), 10));
    CHECK(fr_is_int(fr_get(r, "requested"), 1) && fr_is_str(fr_get(r, "quota"), "memories"));
    CHECK(fr_jobs() == 0); /* nothing to announce */
    fr_free(r);
}

/* ---- groups ------------------------------------------------------------------------------- */

static void test_group(void)
{
    conn_auth t9 = env.tenant, t3 = env.tenant;
    t9.tenant_id = 9;
    t3.tenant_id = 3;
    /* the first store goes at once (a free slot); the others wait for it */
    req *a = fr_call(&env, "memory.store",
                     "{\"content\": \"a\", \"type\": \"fact\", "
                     "\"importance\": 0.5}");
    req *b = fr_call_as(&env, &t9, "memory.store",
                        "{\"content\": \"b\", \"type\": \"fact\", "
                        "\"importance\": 0.5}");
    req *c = fr_call_as(&env, &t3, "memory.store_batch",
                        "{\"memories\": [{\"content\": \"c1\", \"type\": \"fact\", "
                        "\"importance\": 0.5}, {\"content\": \"c2\", \"type\": \"episode\", "
                        "\"importance\": 0.25, \"embedding\": [1, 0, 0, 0, 0, 0, 0, 0]}]}");
    req *d = fr_call(&env, "memory.store",
                     "{\"content\": \"d\", \"type\": \"fact\", "
                     "\"importance\": 0.5}");
    CHECK(fr_jobs() == 1);
    fr_job *j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "memory_store_solo") == 0 && val_is(j, 0, "{7}"));
    PGresult *res = store_result();
    store_row(res, 0, 600, 40, false);
    fr_answer1(j, res);
    CHECK(a->done && fr_is_int(fr_get(a, "id"), 600));
    /* the three waiting went together, by tenant (3, 7, 9), each tenant's in arrival order */
    CHECK(fr_jobs() == 1);
    j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "memory_store_group") == 0 && j->rls == -1);
    CHECK(j && val_is(j, 0, "{3,7,9}") && val_is(j, 1, "{2,1,1}") && val_is(j, 2, "{8,8,8}"));
    CHECK(j && val_is(j, 8, "{\"c1\",\"c2\",\"d\",\"b\"}"));
    CHECK(j && val_is(j, 7, "{\"fact\",\"episode\",\"fact\",\"fact\"}"));
    CHECK(j && j->q[0].lengths[11] == 4 * DIM * 4);
    float given[DIM] = {1, 0, 0, 0, 0, 0, 0, 0};
    CHECK(j && fr_val(j, 0, 11) && memcmp(fr_val(j, 0, 11) + DIM * 4, given, sizeof(given)) == 0);
    /* tenant 3's rows, tenant 7 refused (its own error), tenant 9's row */
    res = store_result();
    store_row(res, 0, 700, 50, false);
    store_row(res, 1, 701, 51, false);
    refusal_row(res, 2, "EG404", "tenant 7 not found", NULL);
    store_row(res, 3, 900, 60, true);
    fr_answer1(j, res);
    CHECK(c->done && fr_len(fr_get(c, "ids")) == 2 && fr_is_int(fr_path(c, "ids.1"), 701));
    CHECK(fr_is_int(fr_path(c, "created_at.0"), NOW_MS + 700));
    CHECK(fr_is_bool(fr_get(c, "replayed"), false));
    CHECK(d->fail_db && strcmp(d->db_sqlstate, "EG404") == 0 && d->ends == 1);
    CHECK(b->done && fr_is_int(fr_get(b, "id"), 900) && fr_is_bool(fr_get(b, "replayed"), true));
    /* announcements: tenant 7's first store and tenant 3's last change (9's was a replay:
     * rows replayed still carry their change) */
    run_timers();
    j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "notify_changes") == 0);
    const char *v = j ? fr_val(j, 0, 0) : NULL;
    CHECK(v && strstr(v, "7:40") && strstr(v, "3:51") && strstr(v, "9:60"));
    if (j)
        fr_answer1(j, fr_rows("count", 1, "3"));
    fr_free(a);
    fr_free(b);
    fr_free(c);
    fr_free(d);
}

/* A group never holds one idempotency key of a tenant twice: the repeat waits for the next
 * job, where it sees the first one's commit (the function refuses such a call: its requests
 * would then all go alone). The same key of another tenant, and another key of the same
 * tenant, ride along. */
static void test_group_keys(void)
{
    conn_auth t9 = env.tenant;
    t9.tenant_id = 9;
    const char *x = "{\"content\": \"k\", \"type\": \"fact\", \"importance\": 0.5, "
                    "\"idempotency_key\": \"x\"}";
    req *a = fr_call(&env, "memory.store",
                     "{\"content\": \"a\", \"type\": \"fact\", \"importance\": 0.5}");
    req *k1 = fr_call(&env, "memory.store", x);
    req *k2 = fr_call(&env, "memory.store", x);
    req *k3 = fr_call_as(&env, &t9, "memory.store", x);
    req *k4 = fr_call(&env, "memory.store",
                      "{\"content\": \"k\", \"type\": \"fact\", \"importance\": 0.5, "
                      "\"idempotency_key\": \"y\"}");
    fr_job *j = fr_take(); /* a, alone: the slot was free */
    PGresult *res = store_result();
    store_row(res, 0, 600, 40, false);
    fr_answer1(j, res);
    CHECK(a->done);
    /* tenant 7's x and y and tenant 9's x; tenant 7's second x waits */
    j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "memory_store_group") == 0 && val_is(j, 0, "{7,7,9}"));
    CHECK(j && val_is(j, 20, "{\"x\",\"y\",\"x\"}"));
    CHECK(fr_jobs() == 0 && !k2->done);
    res = store_result();
    store_row(res, 0, 601, 41, false);
    store_row(res, 1, 602, 42, false);
    store_row(res, 2, 900, 60, false);
    fr_answer1(j, res);
    CHECK(k1->done && fr_is_int(fr_get(k1, "id"), 601));
    CHECK(k4->done && fr_is_int(fr_get(k4, "id"), 602));
    CHECK(k3->done && fr_is_int(fr_get(k3, "id"), 900));
    /* then the repeat, alone in its job, replays the first one's memory */
    j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "memory_store_group") == 0 && val_is(j, 0, "{7}"));
    CHECK(j && val_is(j, 20, "{\"x\"}"));
    res = store_result();
    store_row(res, 0, 601, 41, true);
    fr_answer1(j, res);
    CHECK(k2->done && fr_is_int(fr_get(k2, "id"), 601) && fr_is_bool(fr_get(k2, "replayed"), true));
    drain_notes();
    fr_free(a);
    fr_free(k1);
    fr_free(k2);
    fr_free(k3);
    fr_free(k4);
}

static void test_group_failures(void)
{
    conn_auth t9 = env.tenant;
    t9.tenant_id = 9;
    /* a whole group that fails with a database error: each request again, alone */
    req *a = fr_call(&env, "memory.store",
                     "{\"content\": \"a\", \"type\": \"fact\", "
                     "\"importance\": 0.5}");
    req *b = fr_call_as(&env, &t9, "memory.store",
                        "{\"content\": \"b\", \"type\": \"fact\", "
                        "\"importance\": 0.5}");
    req *c = fr_call(&env, "memory.store",
                     "{\"content\": \"c\", \"type\": \"fact\", "
                     "\"importance\": 0.5}");
    fr_job *j = fr_take(); /* a, alone */
    PGresult *res = store_result();
    store_row(res, 0, 1, 1, false);
    fr_answer1(j, res);
    j = fr_take(); /* b and c together */
    CHECK(j && val_is(j, 0, "{7,9}"));
    fr_answer_error(j, "40P01", "deadlock detected", NULL);
    CHECK(b->ends == 0 && c->ends == 0 && fr_jobs() == 2);
    /* again, one each, by the group function (never the solo statement: its answer is the
     * request's own) */
    fr_job *j1 = fr_take(), *j2 = fr_take();
    CHECK(j1 && strcmp(j1->q[0].name, "memory_store_group") == 0 && val_is(j1, 0, "{7}"));
    CHECK(j2 && strcmp(j2->q[0].name, "memory_store_group") == 0 && val_is(j2, 0, "{9}"));
    res = store_result();
    store_row(res, 0, 2, 2, false);
    fr_answer1(j1, res);
    fr_answer_error(j2, "40P01", "deadlock detected", NULL);
    CHECK(c->done && fr_is_int(fr_get(c, "id"), 2));
    CHECK(b->fail_db && strcmp(b->db_sqlstate, "40P01") == 0);
    fr_free(a);
    fr_free(b);
    fr_free(c);
    drain_notes();

    /* the database gone: every request of the job fails, none acknowledged */
    a = fr_call(&env, "memory.store",
                "{\"content\": \"a\", \"type\": \"fact\", "
                "\"importance\": 0.5}");
    fr_answer_unavailable(fr_take(), "connection lost");
    CHECK(a->fail_db && a->db_status == DB_UNAVAILABLE);
    fr_free(a);

    /* a tenant whose row another transaction holds (EG503): alone on its lane, where it
     * waits (no probe), and its next stores go there directly */
    a = fr_call(&env, "memory.store",
                "{\"content\": \"a\", \"type\": \"fact\", "
                "\"importance\": 0.5}");
    b = fr_call_as(&env, &t9, "memory.store",
                   "{\"content\": \"b\", \"type\": \"fact\", "
                   "\"importance\": 0.5}");
    c = fr_call(&env, "memory.store",
                "{\"content\": \"c\", \"type\": \"fact\", "
                "\"importance\": 0.5}");
    j = fr_take();
    res = store_result();
    store_row(res, 0, 3, 3, false);
    fr_answer1(j, res);
    j = fr_take();
    int marks = fr_blocked_marks();
    res = store_result();
    refusal_row(res, 0, "EG503", "tenant row held", NULL);
    store_row(res, 1, 4, 4, false);
    fr_answer1(j, res);
    CHECK(b->done && c->ends == 0);
    CHECK(fr_blocked_marks() == marks + 1);
    j = fr_take();
    CHECK(j && j->kind == FR_LANE && j->r == c && j->rls == -1);
    CHECK(j && strcmp(j->q[0].name, "memory_store_group") == 0 && val_is(j, 19, NULL));
    res = store_result();
    store_row(res, 0, 5, 5, false);
    fr_answer1(j, res);
    CHECK(c->done && fr_is_int(fr_get(c, "id"), 5));
    fr_free(a);
    fr_free(b);
    fr_free(c);
    drain_notes();
    /* while the tenant is marked blocked, its stores go to the lane at once */
    fr_set_blocked(7);
    a = fr_call(&env, "memory.store",
                "{\"content\": \"a\", \"type\": \"fact\", "
                "\"importance\": 0.5}");
    j = fr_take();
    CHECK(j && j->kind == FR_LANE && val_is(j, 19, NULL));
    fr_answer_error(j, "55P03", "waited write_lock_wait_ms", NULL);
    CHECK(a->fail_db && strcmp(a->db_sqlstate, "55P03") == 0);
    fr_free(a);
    fr_set_blocked(-1);
}

/* ---- large batches and idempotency keys ---------------------------------------------------- */

static void test_large_and_idempotent(void)
{
    /* 70 memories: more than a group takes, a job of their own */
    char *args = malloc(70 * 64 + 64);
    size_t n = (size_t)sprintf(args, "{\"memories\": [");
    for (int i = 0; i < 70; i++)
        n += (size_t)sprintf(args + n,
                             "%s{\"content\": \"item %d\", \"type\": \"fact\", "
                             "\"importance\": 0.5}",
                             i ? ", " : "", i);
    sprintf(args + n, "]}");
    req *r = fr_call(&env, "memory.store_batch", args);
    fr_job *j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "memory_store_group") == 0 && val_is(j, 1, "{70}"));
    CHECK(j && j->q[0].lengths[11] == 70 * DIM * 4);
    PGresult *res = store_result();
    for (int i = 0; i < 70; i++)
        store_row(res, i, 1000 + (uint64_t)i, 2000 + (uint64_t)i, false);
    fr_answer1(j, res);
    CHECK(r->done && fr_len(fr_get(r, "ids")) == 70 && fr_is_int(fr_path(r, "ids.69"), 1069));
    fr_free(r);
    drain_notes();

    /* an idempotency key: the group statement (never the solo one), the key and the
     * fingerprint of the arguments in hex (the same whichever name the type had) */
    char fp[2][80] = {"", ""};
    const char *variants[2] = {
        "{\"content\": \"k\", \"type\": \"fact\", \"importance\": 0.5, \"idempotency_key\": "
        "\"op-1\"}",
        "{\"content\": \"k\", \"memory_type\": \"fact\", \"importance\": 0.5, "
        "\"idempotency_key\": \"op-1\"}"};
    for (int v = 0; v < 2; v++) {
        r = fr_call(&env, "memory.store", variants[v]);
        j = fr_take();
        CHECK(j && j->kind == FR_POOL && j->rls == -1);
        CHECK(j && strcmp(j->q[0].name, "memory_store_group") == 0 && j->q[0].nvalues == 22);
        CHECK(j && val_is(j, 0, "{7}") && val_is(j, 18, "{3}")); /* the embedding generation */
        CHECK(j && val_is(j, 3, env.memory_limits) && val_is(j, 20, "{\"op-1\"}"));
        CHECK(j && val_is(j, 8, "{\"k\"}"));
        CHECK(j && j->q[0].formats[11] == 1 && j->q[0].lengths[11] == DIM * 4);
        if (j && fr_val(j, 0, 21))
            snprintf(fp[v], sizeof(fp[v]), "%s", fr_val(j, 0, 21));
        res = store_result();
        store_row(res, 0, 77, 7, true);
        fr_answer1(j, res);
        CHECK(r->done && fr_is_int(fr_get(r, "id"), 77) && fr_is_bool(fr_get(r, "replayed"), true));
        fr_free(r);
        drain_notes();
    }
    /* {"<64 hex digits>"} */
    CHECK(strlen(fp[0]) == 68 && strncmp(fp[0], "{\"", 2) == 0 && strcmp(fp[0], fp[1]) == 0);
    CHECK(strspn(fp[0] + 2, "0123456789abcdef") == 64);
    /* other arguments, another fingerprint */
    r = fr_call(&env, "memory.store",
                "{\"content\": \"k\", \"type\": \"fact\", \"importance\": "
                "0.6, \"idempotency_key\": \"op-1\"}");
    j = fr_take();
    CHECK(j && fr_val(j, 0, 21) && strcmp(fr_val(j, 0, 21), fp[0]) != 0);
    /* the key reused with other arguments: the statement refuses it (conflict) */
    res = store_result();
    refusal_row(res, 0, "EG409", "idempotency_key was used before for a different request", NULL);
    fr_answer1(j, res);
    CHECK(r->fail_db && strcmp(r->db_sqlstate, "EG409") == 0);
    fr_free(r);
    /* a batch's key fingerprints its memories */
    r = fr_call(&env, "memory.store_batch",
                "{\"memories\": [{\"content\": \"k\", \"type\": \"fact\", \"importance\": 0.5}], "
                "\"idempotency_key\": \"op-2\"}");
    j = fr_take();
    CHECK(j && strcmp(j->q[0].name, "memory_store_group") == 0 && val_is(j, 20, "{\"op-2\"}"));
    CHECK(j && fr_val(j, 0, 21) && strlen(fr_val(j, 0, 21)) == 68 &&
          strcmp(fr_val(j, 0, 21), fp[0]) != 0);
    /* a batch over the tier's limit: the numbers of the DETAIL, requested its size */
    res = store_result();
    refusal_row(res, 0, "EG429", "memory limit of the tenant's tier reached",
                "limit=5 usage=5 requested=1");
    fr_answer1(j, res);
    CHECK(r->code == RPC_QUOTA_EXCEEDED && fr_is_int(fr_get(r, "requested"), 1));
    CHECK(fr_is_int(fr_get(r, "limit"), 5) && fr_is_str(fr_get(r, "quota"), "memories"));
    fr_free(r);
    free(args);
    CHECK(fr_jobs() == 0);
}

int main(void)
{
    if (fr_env_init(&env, NULL, true) < 0) {
        fprintf(stderr, "cannot set up the test server\n");
        return 1;
    }
    test_validation();
    test_store_alone();
    test_group();
    test_group_keys();
    test_group_failures();
    test_large_and_idempotent();
    fr_env_fini(&env);
    CHECK_RETURN();
}
