/* tests/unit/test_migrate.c: storage/migrate against a throwaway database (pgtest.h).
 *
 * A fresh database is brought to the latest version with every function file recorded; a
 * second run changes nothing; a migration or function file that fails is rolled back whole
 * (its own statements and its record), leaving the version and the checksums where they
 * were while earlier steps stay; a database newer than the code, or numbered before the
 * baseline, is refused and nothing runs; function files see each other's functions in any
 * order and only engram_app may execute them; the advisory lock is free after every return.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "check.h"
#include "migrate.h"
#include "pgsync.h"
#include "pgtest.h"

static PGconn *db;   /* the test's connection, the schema's owner */
static PGconn *peer; /* another session, for the advisory lock */

static long num(const char *sql)
{
    char buf[64];
    return strtol(pgtest_value(db, sql, buf, sizeof(buf)), NULL, 10);
}

static long version(void)
{
    return num("SELECT COALESCE(max(version), 0) FROM schema_migrations");
}

static bool exists(const char *relation)
{
    char sql[160], buf[8];
    snprintf(sql, sizeof(sql), "SELECT to_regclass('%s') IS NOT NULL", relation);
    return strcmp(pgtest_value(db, sql, buf, sizeof(buf)), "t") == 0;
}

static const char *checksum(const char *file, char *buf, size_t len)
{
    char sql[160];
    snprintf(sql, sizeof(sql), "SELECT checksum FROM schema_functions WHERE name = '%s'", file);
    return pgtest_value(db, sql, buf, len);
}

/* Whether another session can take the migrations' advisory lock (and releases it). */
static bool lock_free(void)
{
    char buf[8];
    bool got = strcmp(pgtest_value(peer, "SELECT pg_try_advisory_lock(7420001)", buf, sizeof(buf)),
                      "t") == 0;
    if (got)
        pgtest_exec(peer, "SELECT pg_advisory_unlock(7420001)");
    return got;
}

/* The embedded schema plus up to 4 steps and 4 function files of a test's own. */
static migrate_step steps[256];
static migrate_functions funcs[64];

static migrate_plan plan_with(const migrate_step *more, int nmore, const migrate_functions *fmore,
                              int nfmore)
{
    if (migrate_nsteps + nmore > 256 || migrate_nfunction_files + nfmore > 64)
        abort();
    memcpy(steps, migrate_steps, sizeof(steps[0]) * (size_t)migrate_nsteps);
    if (nmore)
        memcpy(steps + migrate_nsteps, more, sizeof(steps[0]) * (size_t)nmore);
    memcpy(funcs, migrate_function_files, sizeof(funcs[0]) * (size_t)migrate_nfunction_files);
    if (nfmore)
        memcpy(funcs + migrate_nfunction_files, fmore, sizeof(funcs[0]) * (size_t)nfmore);
    return (migrate_plan){
        steps, migrate_nsteps + nmore, funcs, migrate_nfunction_files + nfmore, NULL, NULL};
}

static void test_fresh(void)
{
    char err[512] = "";
    int applied = -1;
    CHECK(migrate_latest() == migrate_steps[migrate_nsteps - 1].version);
    CHECK(migrate_latest() >= 9);
    int rc = migrate_run(db, &applied, err, sizeof(err));
    CHECK_MSG(rc == 0, "%d %s", rc, err);
    CHECK(applied == migrate_nsteps + migrate_nfunction_files);
    CHECK(version() == migrate_latest());
    CHECK(num("SELECT count(*) FROM schema_migrations") == migrate_nsteps);
    CHECK(num("SELECT count(*) FROM schema_functions") == migrate_nfunction_files);
    for (int i = 0; i < migrate_nfunction_files; i++) {
        char buf[80];
        CHECK(strcmp(checksum(migrate_function_files[i].name, buf, sizeof(buf)),
                     migrate_function_files[i].checksum) == 0);
    }
    /* the schema is there: the tables and the functions of every kind of file */
    CHECK(exists("memories") && exists("memory_changes") && exists("tenants"));
    CHECK(num("SELECT count(*) FROM pg_proc WHERE proname IN ('engram_ms', 'engram_ts')") == 2);
    /* functions: engram_app only, no PUBLIC grant */
    CHECK(num("SELECT count(*) FROM pg_proc p WHERE p.proname = 'engram_ms' AND "
              "has_function_privilege('engram_app', p.oid, 'EXECUTE')") == 1);
    CHECK(num("SELECT count(*) FROM pg_proc p, aclexplode(p.proacl) a WHERE "
              "p.pronamespace = 'public'::regnamespace AND a.grantee = 0") == 0);
    CHECK(PQtransactionStatus(db) == PQTRANS_IDLE);
    CHECK(lock_free());
}

static void test_rerun(void)
{
    char err[512] = "", before[64], after[64];
    pgtest_value(db, "SELECT max(applied_at) FROM schema_functions", before, sizeof(before));
    int applied = -1;
    CHECK(migrate_run(db, &applied, err, sizeof(err)) == 0);
    CHECK(applied == 0);
    CHECK(version() == migrate_latest());
    pgtest_value(db, "SELECT max(applied_at) FROM schema_functions", after, sizeof(after));
    CHECK(strcmp(before, after) == 0);
    CHECK(migrate_run(db, NULL, err, sizeof(err)) == 0); /* applied may be NULL */
    CHECK(lock_free());
}

static void test_failing_migration(void)
{
    int latest = migrate_latest();
    char err[512] = "", sql[300];
    /* the step's own statements succeed; its record then collides with the row the step
     * wrote: the whole transaction goes, the table the step made too */
    snprintf(sql, sizeof(sql),
             "CREATE TABLE ut_half (x int); INSERT INTO schema_migrations (version, name) "
             "VALUES (%d, 'squatter')",
             latest + 2);
    migrate_step more[] = {
        {latest + 1, "ut_good", "CREATE TABLE ut_good (x int)"},
        {latest + 2, "ut_fail", sql},
        {latest + 3, "ut_never", "CREATE TABLE ut_never (x int)"},
    };
    migrate_plan p = plan_with(more, 3, NULL, 0);
    int applied = -1;
    int rc = migrate_run_plan(db, &p, &applied, err, sizeof(err));
    CHECK(rc == -EIO);
    char want[64];
    snprintf(want, sizeof(want), "migration %04d_ut_fail failed", latest + 2);
    CHECK_STR_CONTAINS(err, want);
    CHECK_STR_CONTAINS(err, "duplicate key");
    CHECK(applied == 1);            /* ut_good */
    CHECK(version() == latest + 1); /* stays where the last committed step left it */
    CHECK(exists("ut_good"));       /* earlier steps stay */
    CHECK(!exists("ut_half"));      /* the failing step's statements are rolled back */
    CHECK(!exists("ut_never"));     /* and nothing after it ran */
    CHECK(num("SELECT count(*) FROM schema_migrations WHERE name = 'squatter'") == 0);
    CHECK(PQtransactionStatus(db) == PQTRANS_IDLE);
    CHECK(lock_free());

    /* a failing statement of its own: the same */
    migrate_step bad[] = {{latest + 2, "ut_div", "CREATE TABLE ut_half (x int); SELECT 1/0"}};
    p = plan_with((migrate_step[]){more[0], bad[0]}, 2, NULL, 0);
    err[0] = '\0';
    CHECK(migrate_run_plan(db, &p, &applied, err, sizeof(err)) == -EIO);
    CHECK_STR_CONTAINS(err, "division by zero");
    CHECK(applied == 0);
    CHECK(version() == latest + 1);
    CHECK(!exists("ut_half"));
    CHECK(lock_free());
}

static void test_newer_database(void)
{
    /* the database is at latest + 1 (test_failing_migration): this binary knows latest */
    char err[512] = "", before[80], after[80];
    CHECK(version() == migrate_latest() + 1);
    /* a changed function file would run if anything ran */
    migrate_functions changed = migrate_function_files[0];
    changed.checksum = "0000";
    migrate_plan p = plan_with(NULL, 0, NULL, 0);
    funcs[0] = changed;
    checksum(changed.name, before, sizeof(before));
    int applied = -1;
    int rc = migrate_run_plan(db, &p, &applied, err, sizeof(err));
    CHECK(rc == -EPROTONOSUPPORT);
    CHECK_STR_CONTAINS(err, "newer than this engramd knows");
    CHECK(applied == 0);
    CHECK(strcmp(checksum(changed.name, after, sizeof(after)), before) == 0);
    rc = migrate_run(db, &applied, err, sizeof(err));
    CHECK(rc == -EPROTONOSUPPORT);
    CHECK(version() == migrate_latest() + 1);
    CHECK(lock_free());
    /* back to the code's version for the tests after this one */
    pgtest_exec(db, "DROP TABLE ut_good");
    char sql[96];
    snprintf(sql, sizeof(sql), "DELETE FROM schema_migrations WHERE version > %d",
             migrate_latest());
    pgtest_exec(db, sql);
    CHECK(migrate_run(db, &applied, err, sizeof(err)) == 0);
    CHECK(applied == 0);
}

static void test_function_files(void)
{
    char err[512] = "", buf[80];
    /* 97 calls a function of 98: bodies are not checked when created (a SQL function's
     * would be, and fail) */
    migrate_functions mine[] = {
        {"97_ut_a.sql", "a1",
         "CREATE OR REPLACE FUNCTION ut_a() RETURNS int LANGUAGE sql AS 'SELECT ut_b() + 1'"},
        {"98_ut_b.sql", "b1",
         "CREATE OR REPLACE FUNCTION ut_b() RETURNS int LANGUAGE sql AS "
         "'SELECT 7'"},
    };
    migrate_plan p = plan_with(NULL, 0, mine, 2);
    int applied = -1;
    int rc = migrate_run_plan(db, &p, &applied, err, sizeof(err));
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(applied == 2);
    CHECK(num("SELECT ut_a()") == 8);
    CHECK(strcmp(checksum("97_ut_a.sql", buf, sizeof(buf)), "a1") == 0);
    CHECK(num("SELECT count(*) FROM pg_proc p WHERE p.proname = 'ut_b' AND "
              "has_function_privilege('engram_app', p.oid, 'EXECUTE')") == 1);
    CHECK(num("SELECT count(*) FROM pg_proc p, aclexplode(p.proacl) a WHERE "
              "p.proname IN ('ut_a', 'ut_b') AND a.grantee = 0") == 0);
    /* unchanged: nothing runs */
    CHECK(migrate_run_plan(db, &p, &applied, err, sizeof(err)) == 0);
    CHECK(applied == 0);

    /* a changed file runs again, alone */
    mine[1].checksum = "b2";
    mine[1].sql = "CREATE OR REPLACE FUNCTION ut_b() RETURNS int LANGUAGE sql AS 'SELECT 70'";
    p = plan_with(NULL, 0, mine, 2);
    CHECK(migrate_run_plan(db, &p, &applied, err, sizeof(err)) == 0);
    CHECK(applied == 1);
    CHECK(num("SELECT ut_a()") == 71);
    CHECK(strcmp(checksum("98_ut_b.sql", buf, sizeof(buf)), "b2") == 0);

    /* a failing file is rolled back: its functions and its checksum stay as they were */
    mine[1].checksum = "b3";
    mine[1].sql = "CREATE OR REPLACE FUNCTION ut_b() RETURNS int LANGUAGE sql AS 'SELECT 700';"
                  "SELECT 1/0";
    p = plan_with(NULL, 0, mine, 2);
    err[0] = '\0';
    CHECK(migrate_run_plan(db, &p, &applied, err, sizeof(err)) == -EIO);
    CHECK(applied == 0);
    CHECK_STR_CONTAINS(err, "functions 98_ut_b.sql failed");
    CHECK(num("SELECT ut_a()") == 71);
    CHECK(strcmp(checksum("98_ut_b.sql", buf, sizeof(buf)), "b2") == 0);
    CHECK(PQtransactionStatus(db) == PQTRANS_IDLE);
    CHECK(lock_free());
}

static void test_pre_baseline(void)
{
    char err[512] = "";
    pgtest_exec(db, "UPDATE schema_migrations SET name = 'init' WHERE version = 1");
    int applied = -1;
    CHECK(migrate_run(db, &applied, err, sizeof(err)) == -EPROTONOSUPPORT);
    CHECK_STR_CONTAINS(err, "preceded the baseline");
    CHECK(applied == 0);
    CHECK(lock_free());
}

static void test_broken_connection(const char *dsn)
{
    char err[512] = "", sql[80];
    PGconn *c = pgsync_connect(dsn, NULL, 5000, err, sizeof(err));
    CHECK_MSG(c != NULL, "%s", err);
    if (!c)
        return;
    snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%d)", PQbackendPID(c));
    pgtest_exec(db, sql);
    err[0] = '\0';
    int applied = -1;
    CHECK(migrate_run(c, &applied, err, sizeof(err)) == -EIO);
    CHECK(err[0] != '\0');
    CHECK(applied == 0);
    PQfinish(c);
}

int main(void)
{
    char dsn[512], err[300] = "";
    pgtest_create("migrate", dsn, sizeof(dsn));
    db = pgsync_connect(dsn, NULL, 5000, err, sizeof(err));
    peer = pgsync_connect(dsn, NULL, 5000, err, sizeof(err));
    if (!db || !peer)
        pgtest_die("connecting to the test database", err);
    test_fresh();
    test_rerun();
    test_failing_migration();
    test_newer_database();
    test_function_files();
    test_broken_connection(dsn);
    test_pre_baseline();
    PQfinish(peer);
    PQfinish(db);
    pgtest_drop();
    CHECK_RETURN();
}
