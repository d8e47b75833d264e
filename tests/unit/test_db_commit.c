/* tests/unit/test_db_commit.c: storage/db's pipelined jobs whose commit, not a statement,
 * meets an error or a lock, against a throwaway database (pgtest.h).
 *
 * A job's transaction commits at the pipeline's sync. A commit can fail after every
 * statement succeeded (a deferred constraint), and it can wait for a lock (a deferred
 * trigger here; in production the lock of the whole database a transaction that notifies
 * takes at its commit). The first is the job's error and leaves the connection in service;
 * the second waits however long the lock is held, whatever lock_timeout the job's
 * statements ran under. Until issue 34's 100,000-tenant run both dropped the connection
 * ("unexpected result order") and failed every job in flight on it.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <libpq-fe.h>

#include "check.h"
#include "dbloop.h"
#include "db.h"
#include "pgtest.h"

static const db_stmt_def stmts[] = {
    {"ins_u", "INSERT INTO u VALUES ($1::int), ($1::int)", 1},
    {"ins_w", "INSERT INTO w VALUES ($1::int)", 1},
    {"count_w", "SELECT count(*) FROM w", 0},
};

typedef struct outcome {
    bool done;
    db_status status;
    char sqlstate[6];
    char value[32];
} outcome;

static void on_result(void *arg, const db_result *r)
{
    outcome *o = arg;
    o->done = true;
    o->status = r->status;
    snprintf(o->sqlstate, sizeof(o->sqlstate), "%s", r->sqlstate ? r->sqlstate : "");
    if (r->status == DB_OK && r->nres == 1 && PQntuples(r->res[0]) == 1)
        snprintf(o->value, sizeof(o->value), "%s", PQgetvalue(r->res[0], 0, 0));
    dbloop_answered();
}

static PGconn *gate_holder;

static void release_gate(evutil_socket_t fd, short what, void *arg)
{
    PQclear(PQexec(gate_holder, "COMMIT"));
}

int main(void)
{
    char dsn[1024];
    pgtest_create("db_commit", dsn, sizeof(dsn));
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK)
        pgtest_die("connecting", PQerrorMessage(c));
    pgtest_exec(c, "SET client_min_messages = warning");
    pgtest_exec(c, "CREATE TABLE u (x int UNIQUE DEFERRABLE INITIALLY DEFERRED)");
    pgtest_exec(c, "CREATE TABLE w (x int)");
    pgtest_exec(c, "CREATE TABLE gate (x int)");
    pgtest_exec(c, "CREATE FUNCTION lock_gate() RETURNS trigger LANGUAGE plpgsql AS "
                   "$$ BEGIN LOCK TABLE gate IN ACCESS EXCLUSIVE MODE; RETURN NULL; END $$");
    pgtest_exec(c, "CREATE CONSTRAINT TRIGGER w_gate AFTER INSERT ON w DEFERRABLE INITIALLY "
                   "DEFERRED FOR EACH ROW EXECUTE FUNCTION lock_gate()");

    dbloop_base = event_base_new();
    db_config cfg = {.dsn = dsn,
                     .connections = 1,
                     .max_inflight = 8,
                     .queue_timeout_ms = 20000,
                     .query_timeout_ms = 20000,
                     .backoff_min_ms = 50,
                     .backoff_max_ms = 500,
                     .max_queue = 64,
                     .stmts = stmts,
                     .nstmts = sizeof(stmts) / sizeof(stmts[0])};
    db_pool *p = db_pool_create(dbloop_base, &cfg);
    CHECK(p != NULL);
    if (!p)
        goto out;

    /* 1. a commit that fails (the deferred unique check), with a job pipelined behind it on
     * the same connection: the first fails with the commit's error, the second is answered,
     * and the connection stays */
    const char *one[] = {"1"};
    db_query dup = {.stmt = &stmts[0], DB_VALUES(one)};
    db_query count = {.stmt = &stmts[2]};
    outcome o1 = {0}, o2 = {0};
    dbloop_pending = 2;
    CHECK(db_submit(p, -1, &dup, 1, on_result, &o1) == 0);
    CHECK(db_submit(p, -1, &count, 1, on_result, &o2) == 0);
    dbloop_run();
    CHECK_MSG(o1.done && o1.status == DB_ERROR && strcmp(o1.sqlstate, "23505") == 0,
              "failed commit: done %d status %d sqlstate %s", o1.done, o1.status, o1.sqlstate);
    CHECK_MSG(o2.done && o2.status == DB_OK && strcmp(o2.value, "0") == 0,
              "the job behind it: done %d status %d value %s", o2.done, o2.status, o2.value);
    db_pool_stats st;
    db_pool_get_stats(p, &st);
    CHECK_MSG(st.reconnects == 0 && st.failures == 0, "reconnects %llu failures %llu",
              (unsigned long long)st.reconnects, (unsigned long long)st.failures);
    char v[32];
    CHECK_MSG(strcmp(pgtest_value(c, "SELECT count(*) FROM u", v, sizeof(v)), "0") == 0,
              "the failed commit left %s rows", v);

    /* 2. a commit that waits 300 ms for a lock another session holds, after statements that
     * ran under a 50 ms lock_timeout: it waits, and commits */
    gate_holder = PQconnectdb(dsn);
    CHECK(PQstatus(gate_holder) == CONNECTION_OK);
    pgtest_exec(gate_holder, "BEGIN");
    pgtest_exec(gate_holder, "LOCK TABLE gate IN ACCESS EXCLUSIVE MODE");
    struct event *rel = evtimer_new(dbloop_base, release_gate, NULL);
    struct timeval in300 = {0, 300000};
    evtimer_add(rel, &in300);
    db_opts opts = {.rls_tenant = -1, .lock_timeout_ms = 50};
    db_query ins = {.stmt = &stmts[1], DB_VALUES(one)};
    outcome o3 = {0}, o4 = {0};
    dbloop_pending = 1;
    CHECK(db_submit_opts(p, &opts, &ins, 1, on_result, &o3) == 0);
    dbloop_run();
    CHECK_MSG(o3.done && o3.status == DB_OK, "commit behind a lock: done %d status %d sqlstate %s",
              o3.done, o3.status, o3.sqlstate);
    dbloop_pending = 1;
    CHECK(db_submit(p, -1, &count, 1, on_result, &o4) == 0);
    dbloop_run();
    CHECK_MSG(o4.done && strcmp(o4.value, "1") == 0, "rows committed: %s", o4.value);
    db_pool_get_stats(p, &st);
    CHECK_MSG(st.reconnects == 0 && st.failures == 0, "reconnects %llu failures %llu",
              (unsigned long long)st.reconnects, (unsigned long long)st.failures);
    event_free(rel);
    PQfinish(gate_holder);
    db_pool_destroy(p);
out:
    event_base_free(dbloop_base);
    PQfinish(c);
    pgtest_drop();
    CHECK_RETURN();
}
