/* tests/unit/test_db_citus.c: storage/db's transaction blocks for Citus
 * (db_config.rls_set_local), against a throwaway database (pgtest.h) that stands in for a
 * coordinator: get_shard_id_for_distribution_column is a look-alike of Citus' function.
 *
 * A tenant's job is BEGIN, SET LOCAL engram.tenant_id, the tenant's split fence, its
 * statements, COMMIT. A store group's job (db_opts.tenants, issue 35 item 2) is BEGIN, the
 * fences of all its tenants, the statements (which bind their tenants themselves), COMMIT:
 * every fence is held while the statements run, no tenant is set by the pool, the results
 * are the caller's statements' only, a failing statement rolls the whole group back and the
 * connection stays in service; bad options are refused.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <libpq-fe.h>

#include "check.h"
#include "dbloop.h"
#include "db.h"
#include "pgtest.h"

static const db_stmt_def stmts[] = {
    /* a row of tenant $1, with the engram.tenant_id the transaction has (empty: none) */
    {"ins",
     "INSERT INTO t VALUES ($1::bigint, COALESCE(current_setting('engram.tenant_id', "
     "true), '')) RETURNING id",
     1},
    /* the split fences this transaction holds (shared locks of class 0x456e67) */
    {"fences",
     "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 4550247 "
     "AND mode = 'ShareLock' AND pid = pg_backend_pid()",
     0},
    {"rows", "SELECT count(*) FROM t", 0},
};

typedef struct outcome {
    bool done;
    db_status status;
    char sqlstate[6];
    int nres;
    char first[8][32]; /* the first value of each result */
} outcome;

static void on_result(void *arg, const db_result *r)
{
    outcome *o = arg;
    o->done = true;
    o->status = r->status;
    snprintf(o->sqlstate, sizeof(o->sqlstate), "%s", r->sqlstate ? r->sqlstate : "");
    o->nres = r->status == DB_OK ? r->nres : 0;
    for (int i = 0; i < o->nres && i < 8; i++)
        snprintf(o->first[i], sizeof(o->first[i]), "%s",
                 PQntuples(r->res[i]) > 0 ? PQgetvalue(r->res[i], 0, 0) : "");
    dbloop_answered();
}

static outcome submit(db_pool *p, const db_opts *o, const db_query *qs, int nq)
{
    outcome out = {0};
    dbloop_pending = 1;
    int rc = db_submit_opts(p, o, qs, nq, on_result, &out);
    CHECK_MSG(rc == 0, "db_submit_opts: %d", rc);
    if (rc == 0)
        dbloop_run();
    return out;
}

int main(void)
{
    char dsn[1024];
    pgtest_create("db_citus", dsn, sizeof(dsn));
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK)
        pgtest_die("connecting", PQerrorMessage(c));
    pgtest_exec(c, "CREATE TABLE t (id bigint CHECK (id > 0), bound text)");
    pgtest_exec(c, "CREATE FUNCTION get_shard_id_for_distribution_column(regclass, bigint) "
                   "RETURNS bigint LANGUAGE sql AS 'SELECT 102000 + $2'");
    pgtest_exec(c, "CREATE TABLE tenants (id bigint)");

    dbloop_base = event_base_new();
    db_config cfg = {.dsn = dsn,
                     .connections = 1,
                     .max_inflight = 4,
                     .queue_timeout_ms = 20000,
                     .query_timeout_ms = 20000,
                     .backoff_min_ms = 50,
                     .backoff_max_ms = 500,
                     .max_queue = 64,
                     .rls_set_local = true,
                     .stmts = stmts,
                     .nstmts = sizeof(stmts) / sizeof(stmts[0])};
    db_pool *p = db_pool_create(dbloop_base, &cfg);
    CHECK(p != NULL);
    if (!p)
        goto out;
    const char *t5[] = {"5"}, *t6[] = {"6"}, *t7[] = {"7"}, *bad[] = {"-1"};
    db_query q5 = {.stmt = &stmts[0], DB_VALUES(t5)}, q6 = {.stmt = &stmts[0], DB_VALUES(t6)},
             q7 = {.stmt = &stmts[0], DB_VALUES(t7)}, qbad = {.stmt = &stmts[0], DB_VALUES(bad)},
             fences = {.stmt = &stmts[1]}, rows = {.stmt = &stmts[2]};

    /* 1. one tenant's job: its tenant set, its one fence */
    db_opts one = {.rls_tenant = 5};
    db_query j1[] = {q5, fences};
    outcome o = submit(p, &one, j1, 2);
    CHECK_MSG(o.status == DB_OK && o.nres == 2 && strcmp(o.first[1], "1") == 0,
              "tenant job: status %d nres %d fences %s", o.status, o.nres, o.first[1]);
    char v[64];
    CHECK(strcmp(pgtest_value(c, "SELECT bound FROM t WHERE id = 5", v, sizeof(v)), "5") == 0);

    /* 2. a group of three tenants: three fences held, no tenant set by the pool, the
     * results the caller's four statements' */
    int64_t three[] = {5, 6, 7};
    db_opts group = {.rls_tenant = -1, .tenants = three, .ntenants = 3};
    db_query j2[] = {q5, q6, q7, fences};
    o = submit(p, &group, j2, 4);
    CHECK_MSG(o.status == DB_OK && o.nres == 4, "group: status %d sqlstate %s nres %d", o.status,
              o.sqlstate, o.nres);
    CHECK(strcmp(o.first[0], "5") == 0 && strcmp(o.first[1], "6") == 0 &&
          strcmp(o.first[2], "7") == 0);
    CHECK_MSG(strcmp(o.first[3], "3") == 0, "fences held: %s", o.first[3]);
    CHECK(strcmp(pgtest_value(c, "SELECT count(*) FROM t WHERE bound = ''", v, sizeof(v)), "3") ==
          0);

    /* 3. a group whose second statement fails: nothing of it commits, the error is the
     * job's, the connection stays (the next job runs on it) */
    db_query j3[] = {q6, qbad, q7};
    o = submit(p, &group, j3, 3);
    CHECK_MSG(o.status == DB_ERROR && strcmp(o.sqlstate, "23514") == 0,
              "failed group: status %d sqlstate %s", o.status, o.sqlstate);
    o = submit(p, &(db_opts){.rls_tenant = -1}, &rows, 1);
    CHECK_MSG(o.status == DB_OK && strcmp(o.first[0], "4") == 0, "rows after the failure: %s",
              o.first[0]);
    db_pool_stats st;
    db_pool_get_stats(p, &st);
    CHECK_MSG(st.reconnects == 0 && st.failures == 0, "reconnects %llu failures %llu",
              (unsigned long long)st.reconnects, (unsigned long long)st.failures);

    /* 4. refused: a group with a tenant set too, with a lock_timeout, with no tenants array,
     * with more tenants than a job has statements */
    int64_t many[DB_MAX_QUERIES + 1] = {0};
    db_opts refused[] = {
        {.rls_tenant = 5, .tenants = three, .ntenants = 3},
        {.rls_tenant = -1, .lock_timeout_ms = 50, .tenants = three, .ntenants = 3},
        {.rls_tenant = -1, .tenants = NULL, .ntenants = 2},
        {.rls_tenant = -1, .tenants = many, .ntenants = DB_MAX_QUERIES + 1},
        {.rls_tenant = -1, .tenants = three, .ntenants = -1},
    };
    outcome never = {0};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        CHECK_MSG(db_submit_opts(p, &refused[i], &rows, 1, on_result, &never) == -EINVAL,
                  "options %zu accepted", i);
    CHECK(!never.done);
    db_pool_destroy(p);
out:
    event_base_free(dbloop_base);
    PQfinish(c);
    pgtest_drop();
    CHECK_RETURN();
}
