/* tests/unit/test_pgsync.c: storage/pgparams and storage/pgsync, the blocking PostgreSQL
 * calls, against a throwaway database (pgtest.h).
 *
 * The connection parameters get the failover defaults only where the DSN is silent; a
 * connection comes up with its role set and quiet notices; errors arrive as one line; a
 * tenant transaction binds row-level security and the mode asked for, and leaves nothing
 * behind; a commit of a failed transaction is reported, not taken for success.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "check.h"
#include "pgparams.h"
#include "pgsync.h"
#include "pgtest.h"

/* The value p gives keyword, or NULL when it gives none. */
static const char *param(const pgparams *p, const char *keyword)
{
    for (size_t i = 0; p->keys[i]; i++)
        if (strcmp(p->keys[i], keyword) == 0)
            return p->vals[i];
    return NULL;
}

static void test_params(void)
{
    pgparams p;
    char err[200] = "";
    CHECK(pgparams_init(&p, "host=a,b port=1,2 dbname=x keepalives_idle=9", 500, err,
                        sizeof(err)) == 0);
    const char *v = param(&p, "host");
    CHECK(v && strcmp(v, "a,b") == 0);
    v = param(&p, "keepalives_idle"); /* the DSN's own value stays */
    CHECK(v && strcmp(v, "9") == 0);
    v = param(&p, "keepalives");
    CHECK(v && strcmp(v, "1") == 0);
    v = param(&p, "keepalives_count");
    CHECK(v && strcmp(v, "3") == 0);
    v = param(&p, "tcp_user_timeout"); /* at least a second */
    CHECK(v && strcmp(v, "1000") == 0);
    v = param(&p, "connect_timeout"); /* at least two seconds */
    CHECK(v && strcmp(v, "2") == 0);
    CHECK(param(&p, "sslmode") == NULL); /* nothing else is invented */
    pgparams_fini(&p);
    CHECK(p.keys == NULL && p.opts == NULL);
    pgparams_fini(&p); /* a zeroed struct is a no-op */

    CHECK(pgparams_init(&p, "postgresql://u@h:5/d?connect_timeout=30", 7000, err, sizeof(err)) ==
          0);
    v = param(&p, "connect_timeout");
    CHECK(v && strcmp(v, "30") == 0);
    v = param(&p, "tcp_user_timeout");
    CHECK(v && strcmp(v, "7000") == 0);
    v = param(&p, "user");
    CHECK(v && strcmp(v, "u") == 0);
    pgparams_fini(&p);

    /* another node of the same database: host and port replaced, hostaddr dropped, a
     * keyword the DSN did not give added, an unknown one refused */
    CHECK(pgparams_init(&p, "host=a hostaddr=10.0.0.1 port=5 dbname=x user=u", 1000, err,
                        sizeof(err)) == 0);
    CHECK(pgparams_set(&p, "host", "w1") == 0);
    CHECK(pgparams_set(&p, "hostaddr", NULL) == 0);
    CHECK(pgparams_set(&p, "port", "9701") == 0);
    CHECK(pgparams_set(&p, "sslmode", "disable") == 0);
    CHECK(pgparams_set(&p, "no_such_keyword", "1") == -EINVAL);
    CHECK(pgparams_set(&p, "options", NULL) == 0); /* absent and removed: nothing */
    v = param(&p, "host");
    CHECK(v && strcmp(v, "w1") == 0);
    v = param(&p, "port");
    CHECK(v && strcmp(v, "9701") == 0);
    v = param(&p, "sslmode");
    CHECK(v && strcmp(v, "disable") == 0);
    CHECK(param(&p, "hostaddr") == NULL);
    v = param(&p, "dbname"); /* the rest stays */
    CHECK(v && strcmp(v, "x") == 0);
    v = param(&p, "user");
    CHECK(v && strcmp(v, "u") == 0);
    pgparams_fini(&p);

    err[0] = '\0';
    CHECK(pgparams_init(&p, "this is not a dsn", 1000, err, sizeof(err)) == -EINVAL);
    CHECK(err[0] != '\0' && err[strlen(err) - 1] != '\n');
    CHECK(p.keys == NULL);
}

static void test_connect(const char *dsn)
{
    char err[300] = "", buf[64];
    /* nobody listens there: NULL, with libpq's reason without its trailing newline */
    PGconn *c = pgsync_connect("host=/nonexistent/engram dbname=x", NULL, 2000, err, sizeof(err));
    CHECK(c == NULL);
    CHECK_STR_CONTAINS(err, "/nonexistent/engram");
    CHECK(err[0] != '\0' && err[strlen(err) - 1] != '\n');

    err[0] = '\0';
    c = pgsync_connect("nonsense", NULL, 2000, err, sizeof(err));
    CHECK(c == NULL);
    CHECK(err[0] != '\0');

    /* the same database at another node: the DSN's host replaced (here by a socket
     * directory nobody listens in, then by the DSN's own one, found in PQhost) */
    err[0] = '\0';
    c = pgsync_connect_at(dsn, "/nonexistent/node", NULL, NULL, 2000, err, sizeof(err));
    CHECK(c == NULL);
    CHECK_STR_CONTAINS(err, "/nonexistent/node");
    PGconn *probe = pgsync_connect(dsn, NULL, 5000, err, sizeof(err));
    CHECK_MSG(probe != NULL, "%s", err);
    if (probe) {
        char host[256], port[16], elsewhere[512];
        snprintf(host, sizeof(host), "%s", PQhost(probe));
        snprintf(port, sizeof(port), "%s", PQport(probe));
        snprintf(elsewhere, sizeof(elsewhere), "host=/nonexistent/node port=1 dbname=%s user=%s",
                 PQdb(probe), PQuser(probe));
        PQfinish(probe);
        c = pgsync_connect_at(elsewhere, host, port, NULL, 5000, err, sizeof(err));
        CHECK_MSG(c != NULL, "%s", err);
        if (c)
            CHECK(strcmp(PQhost(c), host) == 0);
        PQfinish(c);
    }

    /* a role of this test's own (roles belong to the cluster: dropped at the end) */
    PGconn *own = pgsync_connect(dsn, NULL, 5000, err, sizeof(err));
    CHECK_MSG(own != NULL, "%s", err);
    if (!own)
        return;
    CHECK(strcmp(pgtest_value(own, "SHOW client_min_messages", buf, sizeof(buf)), "warning") == 0);
    pgtest_exec(own, "DO $$ BEGIN CREATE ROLE ut_pgsync_role NOLOGIN; "
                     "EXCEPTION WHEN duplicate_object THEN NULL; END $$");
    pgtest_exec(own, "GRANT ut_pgsync_role TO CURRENT_USER");

    c = pgsync_connect(dsn, "ut_pgsync_role", 5000, err, sizeof(err));
    CHECK_MSG(c != NULL, "%s", err);
    if (c) {
        CHECK(strcmp(pgtest_value(c, "SELECT current_user", buf, sizeof(buf)), "ut_pgsync_role") ==
              0);
        PQfinish(c);
    }
    /* a role name is an identifier, quoted: not SQL */
    err[0] = '\0';
    c = pgsync_connect(dsn, "x\"; SELECT 1; --", 5000, err, sizeof(err));
    CHECK(c == NULL);
    CHECK_STR_CONTAINS(err, "does not exist");
    PQfinish(own);
}

static void test_exec(PGconn *c)
{
    char err[300] = "";
    const char *vals[] = {"40", NULL};
    PGresult *r = pgsync_exec(c, "SELECT $1::int + 2, $2::text IS NULL", 2, vals, err, sizeof(err));
    CHECK_MSG(r != NULL, "%s", err);
    if (r) {
        CHECK(strcmp(PQgetvalue(r, 0, 0), "42") == 0);
        CHECK(strcmp(PQgetvalue(r, 0, 1), "t") == 0);
        PQclear(r);
    }
    r = pgsync_exec(c, "SELECT * FROM no_such_table", 0, NULL, err, sizeof(err));
    CHECK(r == NULL);
    CHECK_STR_CONTAINS(err, "no_such_table");
    CHECK(err[strlen(err) - 1] != '\n');

    /* a statement of a table: the count is checked before anything is sent */
    static const db_stmt_def two = {"ut_two", "SELECT $1::int * $2::int", 2};
    const char *one[] = {"3"};
    r = PGSYNC_EXEC(c, &two, one, err, sizeof(err));
    CHECK(r == NULL);
    CHECK_STR_CONTAINS(err, "ut_two takes 2 parameters, 1 passed");
    const char *both[] = {"3", "5"};
    r = PGSYNC_EXEC(c, &two, both, err, sizeof(err));
    CHECK_MSG(r != NULL, "%s", err);
    if (r) {
        CHECK(strcmp(PQgetvalue(r, 0, 0), "15") == 0);
        PQclear(r);
    }

    /* a script: several statements in one implicit transaction */
    CHECK(pgsync_script(c, "CREATE TABLE ut_s (x int); INSERT INTO ut_s VALUES (1), (2)", err,
                        sizeof(err)) == 0);
    char buf[32];
    CHECK(strcmp(pgtest_value(c, "SELECT sum(x) FROM ut_s", buf, sizeof(buf)), "3") == 0);
    CHECK(pgsync_script(c, "INSERT INTO ut_s VALUES (10); SELECT 1/0", err, sizeof(err)) == -EIO);
    CHECK_STR_CONTAINS(err, "division by zero");
    /* the first statement went with the second */
    CHECK(strcmp(pgtest_value(c, "SELECT sum(x) FROM ut_s", buf, sizeof(buf)), "3") == 0);
}

/* On Citus a write transaction takes the split fence (citusmove.h): a shared advisory lock
 * on (CMOVE_FENCE_CLASS, the tenant's shard of tenants); read transactions do not. Citus'
 * shard lookup is played here by a function of the same name. */
static void test_citus_fence(PGconn *c)
{
    char err[300] = "", buf[64];
    pgtest_exec(c, "CREATE TABLE IF NOT EXISTS tenants (id bigint)");
    pgtest_exec(c, "CREATE FUNCTION get_shard_id_for_distribution_column(regclass, bigint) "
                   "RETURNS bigint LANGUAGE sql AS 'SELECT 102008 + $2 % 4'");
    static const char held[] = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND "
                               "pid = pg_backend_pid() AND mode = 'ShareLock' AND objsubid = 2 "
                               "AND classid = 4550247 AND objid = 102009";
    pgsync_set_citus(true);
    CHECK_MSG(pgsync_tenant_begin(c, 5, PGSYNC_TX_WRITE, err, sizeof(err)) == 0, "%s", err);
    CHECK(strcmp(pgtest_value(c, held, buf, sizeof(buf)), "1") == 0);
    CHECK(pgsync_tx_end(c, true, NULL, 0) == 0);
    CHECK(strcmp(pgtest_value(c, held, buf, sizeof(buf)), "0") == 0); /* gone with it */
    CHECK(pgsync_tenant_begin(c, 5, PGSYNC_TX_READ, err, sizeof(err)) == 0);
    CHECK(strcmp(pgtest_value(c, held, buf, sizeof(buf)), "0") == 0);
    CHECK(pgsync_tx_end(c, false, NULL, 0) == 0);
    pgsync_set_citus(false);
    CHECK(pgsync_tenant_begin(c, 5, PGSYNC_TX_WRITE, err, sizeof(err)) == 0);
    CHECK(strcmp(pgtest_value(c, held, buf, sizeof(buf)), "0") == 0);
    CHECK(pgsync_tx_end(c, false, NULL, 0) == 0);
}

static void test_transactions(PGconn *c, const char *dsn)
{
    char err[300] = "", buf[64];
    pgtest_exec(c, "CREATE TABLE ut_t (x int)");

    /* a snapshot: repeatable read, read-only, the tenant bound for this transaction */
    CHECK(pgsync_tenant_begin(c, 77, PGSYNC_TX_SNAPSHOT, err, sizeof(err)) == 0);
    CHECK(PQtransactionStatus(c) == PQTRANS_INTRANS);
    CHECK(strcmp(pgtest_value(c, "SHOW transaction_isolation", buf, sizeof(buf)),
                 "repeatable read") == 0);
    CHECK(strcmp(pgtest_value(c, "SHOW transaction_read_only", buf, sizeof(buf)), "on") == 0);
    CHECK(strcmp(pgtest_value(c, "SELECT current_setting('engram.tenant_id')", buf, sizeof(buf)),
                 "77") == 0);
    CHECK(pgsync_tx_end(c, false, NULL, 0) == 0);
    CHECK(PQtransactionStatus(c) == PQTRANS_IDLE);
    /* the binding ended with the transaction */
    CHECK(strcmp(
              pgtest_value(c, "SELECT current_setting('engram.tenant_id', true)", buf, sizeof(buf)),
              "") == 0);

    /* read-only: a write fails, and the commit of the failed transaction says so */
    CHECK(pgsync_tenant_begin(c, 1, PGSYNC_TX_READ, err, sizeof(err)) == 0);
    CHECK(strcmp(pgtest_value(c, "SHOW transaction_isolation", buf, sizeof(buf)),
                 "read committed") == 0);
    PGresult *r = pgsync_exec(c, "INSERT INTO ut_t VALUES (1)", 0, NULL, err, sizeof(err));
    CHECK(r == NULL);
    CHECK_STR_CONTAINS(err, "read-only");
    err[0] = '\0';
    CHECK(pgsync_tx_end(c, true, err, sizeof(err)) == -EIO);
    CHECK_STR_CONTAINS(err, "rolled back");
    CHECK(PQtransactionStatus(c) == PQTRANS_IDLE);

    /* a write commits */
    CHECK(pgsync_tenant_begin(c, 1, PGSYNC_TX_WRITE, err, sizeof(err)) == 0);
    r = pgsync_exec(c, "INSERT INTO ut_t VALUES (5)", 0, NULL, err, sizeof(err));
    CHECK_MSG(r != NULL, "%s", err);
    PQclear(r);
    CHECK(pgsync_tx_end(c, true, err, sizeof(err)) == 0);
    /* ... and a rolled back one does not */
    CHECK(pgsync_tenant_begin(c, 1, PGSYNC_TX_WRITE, err, sizeof(err)) == 0);
    PQclear(pgsync_exec(c, "INSERT INTO ut_t VALUES (6)", 0, NULL, err, sizeof(err)));
    CHECK(pgsync_tx_end(c, false, NULL, 0) == 0);
    CHECK(strcmp(pgtest_value(c, "SELECT sum(x) FROM ut_t", buf, sizeof(buf)), "5") == 0);

    /* a broken connection: -EIO, nothing left open */
    PGconn *other = pgsync_connect(dsn, NULL, 5000, err, sizeof(err));
    CHECK_MSG(other != NULL, "%s", err);
    if (!other)
        return;
    char sql[96];
    snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%d)", PQbackendPID(other));
    pgtest_exec(c, sql);
    err[0] = '\0';
    CHECK(pgsync_tenant_begin(other, 1, PGSYNC_TX_READ, err, sizeof(err)) == -EIO);
    CHECK(err[0] != '\0');
    CHECK(pgsync_tx_end(other, true, err, sizeof(err)) == -EIO);
    PQfinish(other);
}

int main(void)
{
    test_params();
    char dsn[512];
    pgtest_create("pgsync", dsn, sizeof(dsn));
    test_connect(dsn);
    char err[300] = "";
    PGconn *c = pgsync_connect(dsn, NULL, 5000, err, sizeof(err));
    CHECK_MSG(c != NULL, "%s", err);
    if (c) {
        test_exec(c);
        test_transactions(c, dsn);
        test_citus_fence(c);
        PQfinish(c);
    }
    pgtest_drop();
    PGconn *admin = pgtest_admin();
    PQclear(PQexec(admin, "DROP ROLE IF EXISTS ut_pgsync_role"));
    PQfinish(admin);
    CHECK_RETURN();
}
