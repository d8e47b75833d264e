/* tests/unit/test_sql_stmts.c: the statement tables of storage/ (sql.c, sql_session.c,
 * sql_work.c, sql_bg.c) and the parameter-count checks of db.c and pgsync.c.
 *
 * Every statement has a unique name, and its declared parameter count is exactly the
 * highest $N its text uses, with every $1..$N used: a count typed wrong in a table would
 * otherwise surface only as a PostgreSQL error on the first call. A query or a blocking
 * execution passing another number of values than its statement declares is refused before
 * anything is sent.
 */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "check.h"
#include "db.h"
#include "pgsync.h"
#include "sql.h"
#include "sql_bg.h"
#include "sql_session.h"
#include "sql_work.h"

/* The highest $N in sql, and whether each of $1..$N appears (*gaps counts those missing). */
static int max_param(const char *sql, int *gaps)
{
    bool seen[DB_MAX_PARAMS + 2] = {false};
    int max = 0;
    for (const char *p = sql; *p; p++) {
        if (*p != '$' || !isdigit((unsigned char)p[1]))
            continue;
        int n = atoi(p + 1);
        if (n > DB_MAX_PARAMS + 1)
            n = DB_MAX_PARAMS + 1;
        seen[n] = true;
        if (n > max)
            max = n;
    }
    *gaps = 0;
    for (int i = 1; i <= max; i++)
        *gaps += !seen[i];
    return max;
}

static void check_table(const char *what, const db_stmt_def *defs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const db_stmt_def *d = &defs[i];
        CHECK_MSG(d->name && d->sql, "%s[%zu] is empty", what, i);
        if (!d->name || !d->sql)
            continue;
        int gaps;
        int max = max_param(d->sql, &gaps);
        CHECK_MSG(max == d->nparams, "%s: declares %d parameters, its text uses $%d", d->name,
                  d->nparams, max);
        CHECK_MSG(gaps == 0, "%s: %d of $1..$%d unused", d->name, gaps, max);
        CHECK_MSG(d->nparams <= DB_MAX_PARAMS, "%s: %d parameters", d->name, d->nparams);
    }
}

static void test_tables(void)
{
    check_table("sql_stmts", sql_stmts, SQL__COUNT);
    check_table("sql_session_stmts", sql_session_stmts, SQLS__COUNT);
    check_table("sql_work_stmts", sql_work_stmts, SQLW__COUNT);
    check_table("sql_bg_stmts", sql_bg_stmts, SQLB__COUNT);
    /* the statement named by an enum value is that entry */
    CHECK(sql_def(SQL_MEMORY_GET) == &sql_stmts[SQL_MEMORY_GET]);
    CHECK(sqls_def(SQLS_GET) == &sql_session_stmts[SQLS_GET]);
    CHECK(sqlw_def(SQLW_AUDIT) == &sql_work_stmts[SQLW_AUDIT]);
    CHECK(sqlb_def(SQLB_UNLOCK) == &sql_bg_stmts[SQLB_UNLOCK]);
}

/* Prepared statement names share one namespace per connection: the pool prepares all of
 * sql_all() on each. Names of blocking statements must not clash with them either, so one
 * log line or error names one statement. */
static void test_unique_names(void)
{
    CHECK(sql_init() == 0);
    size_t n;
    const db_stmt_def *all = sql_all(&n);
    CHECK(n == SQL__COUNT + SQLS__COUNT + SQLW__COUNT);
    size_t total = n + SQLB__COUNT;
    const char **names = calloc(total, sizeof(*names));
    CHECK(names != NULL);
    if (!names)
        return;
    for (size_t i = 0; i < n; i++)
        names[i] = all[i].name;
    for (size_t i = 0; i < SQLB__COUNT; i++)
        names[n + i] = sql_bg_stmts[i].name;
    for (size_t i = 0; i < total; i++)
        for (size_t k = i + 1; k < total; k++)
            CHECK_MSG(strcmp(names[i], names[k]) != 0, "statement name %s twice", names[i]);
    free(names);
    sql_fini();
}

/* On Citus memory_get names the tenant by value (routed to its shard): the same name and
 * parameters, the InitPlan gone; the single-node text stays until then. */
static void test_citus_forms(void)
{
    CHECK(sql_init() == 0);
    size_t n;
    const db_stmt_def *all = sql_all(&n);
    const db_stmt_def *get = NULL;
    for (size_t i = 0; i < n; i++)
        if (strcmp(all[i].name, "memory_get") == 0)
            get = &all[i];
    CHECK(get != NULL);
    if (!get)
        return;
    CHECK(strstr(get->sql, "(SELECT $1::bigint)") != NULL);
    CHECK(sql_use_citus() == 0);
    CHECK(strstr(get->sql, "(SELECT $1") == NULL);
    CHECK(strstr(get->sql, "m.tenant_id = $1::bigint") != NULL);
    CHECK(get->nparams == sql_def(SQL_MEMORY_GET)->nparams);
    CHECK(strcmp(sql_def(SQL_MEMORY_GET)->sql, get->sql) != 0); /* the table itself unchanged */
    sql_fini();
}

static void count_cb(void *arg, const db_result *r)
{
    CHECK(r->status == DB_UNAVAILABLE);
    (*(int *)arg)++;
}

static void test_counts_checked(void)
{
    /* blocking execution: refused before the connection is touched (NULL here) */
    char err[200] = "";
    const char *one[] = {"1"};
    PGresult *r = pgsync_exec_stmt(NULL, sql_def(SQL_MEMORY_GET), one, 1, err, sizeof(err));
    CHECK(r == NULL);
    CHECK_STR_CONTAINS(err, "memory_get takes 2 parameters, 1 passed");
    const char *fold[] = {"1", "0"};
    r = PGSYNC_EXEC(NULL, sqlb_def(SQLB_ACCESS_FOLD), fold, err, sizeof(err));
    CHECK(r == NULL); /* the count matched: it failed only for want of a connection */
    CHECK_MSG(strstr(err, "takes") == NULL, "%s", err);

    /* a pool job: a wrong count is -EINVAL before anything is queued; the right count is
     * queued (the pool has no connection yet: its DSN names no server, and the loop never
     * runs) and failed with DB_UNAVAILABLE when the pool is destroyed */
    struct event_base *base = event_base_new();
    CHECK(base != NULL);
    CHECK(sql_init() == 0);
    size_t n;
    const db_stmt_def *all = sql_all(&n);
    db_config cfg = {.dsn = "host=/nonexistent-engram-test connect_timeout=1",
                     .connections = 1,
                     .max_inflight = 1,
                     .queue_timeout_ms = 1000,
                     .query_timeout_ms = 1000,
                     .backoff_min_ms = 1000,
                     .backoff_max_ms = 1000,
                     .max_queue = 8,
                     .stmts = all,
                     .nstmts = n};
    db_pool *pool = base ? db_pool_create(base, &cfg) : NULL;
    CHECK(pool != NULL);
    const char *two[] = {"1", "{1}"};
    db_query ok = {.stmt = sql_def(SQL_MEMORY_GET), DB_VALUES(two)};
    CHECK(ok.nvalues == 2);
    db_query bad = {.stmt = sql_def(SQL_MEMORY_GET), DB_VALUES(one)};
    CHECK(bad.nvalues == 1);
    int calls = 0;
    if (pool) {
        CHECK(db_submit(pool, 1, &bad, 1, count_cb, &calls) == -EINVAL);
        db_query pair[2] = {ok, bad};
        CHECK(db_submit(pool, 1, pair, 2, count_cb, &calls) == -EINVAL);
        CHECK(db_submit(pool, 1, &ok, 1, count_cb, &calls) == 0);
        db_pool_destroy(pool);
    }
    CHECK(calls == 1); /* only the well-formed job was ever queued */
    sql_fini();
    if (base)
        event_base_free(base);
}

int main(void)
{
    test_tables();
    test_unique_names();
    test_citus_forms();
    test_counts_checked();
    CHECK_RETURN();
}
