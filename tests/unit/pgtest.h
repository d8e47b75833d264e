/* tests/unit/pgtest.h: a throwaway PostgreSQL database for the unit tests of storage/.
 *
 * ENGRAM_TEST_PG_DSN names a database of the test cluster whose user may CREATE DATABASE
 * (deploy/test starts a throwaway cluster and sets it). pgtest_create makes a new empty database
 * named after the test and the process, pgtest_drop removes it. A missing ENGRAM_TEST_PG_DSN or an
 * unreachable cluster fails the test (exit status 1), never skips it: these tests exist to run.
 */
#ifndef ENGRAM_TESTS_PGTEST_H
#define ENGRAM_TESTS_PGTEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

/* The database pgtest_create made, for pgtest_drop. */
static char pgtest_name[64];

/* Fails the whole test program at once: a database the tests cannot set up tests nothing. */
static void pgtest_die(const char *what, const char *why)
{
    fprintf(stderr, "pgtest: %s: %s\n", what, why ? why : "");
    exit(1);
}

/* Connects to the maintenance database of ENGRAM_TEST_PG_DSN. */
static PGconn *pgtest_admin(void)
{
    const char *dsn = getenv("ENGRAM_TEST_PG_DSN");
    if (!dsn || !*dsn)
        pgtest_die("ENGRAM_TEST_PG_DSN", "must name a PostgreSQL database (deploy/test sets it)");
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK)
        pgtest_die("connecting to ENGRAM_TEST_PG_DSN", PQerrorMessage(c));
    PQclear(PQexec(c, "SET client_min_messages = warning")); /* no "skipping" notices */
    return c;
}

/* Runs sql on c (no parameters) and returns its result; any error ends the program. */
static PGresult *pgtest_query(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        fprintf(stderr, "pgtest: failed: %s\n%s", sql,
                r ? PQresultErrorMessage(r) : PQerrorMessage(c));
        PQclear(r);
        pgtest_die("query", "failed");
    }
    return r;
}

/* pgtest_query with the result dropped. */
static void pgtest_exec(PGconn *c, const char *sql)
{
    PQclear(pgtest_query(c, sql));
}

/* The first column of the first row of sql's result, copied into out ("" when no row). */
static const char *pgtest_value(PGconn *c, const char *sql, char *out, size_t outlen)
{
    PGresult *r = pgtest_query(c, sql);
    snprintf(out, outlen, "%s", PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return out;
}

/* Creates an empty database for the test named tag and writes its DSN (ENGRAM_TEST_PG_DSN
 * with dbname replaced) into dsn. */
static void pgtest_create(const char *tag, char *dsn, size_t dsnlen)
{
    PGconn *admin = pgtest_admin();
    snprintf(pgtest_name, sizeof(pgtest_name), "engram_ut_%s_%ld", tag, (long)getpid());
    char sql[160];
    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s", pgtest_name);
    pgtest_exec(admin, sql);
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", pgtest_name);
    pgtest_exec(admin, sql);
    PQfinish(admin);
    /* the same DSN with another dbname, whatever form it came in (a URI too) */
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(getenv("ENGRAM_TEST_PG_DSN"), &perr);
    if (!opts)
        pgtest_die("parsing ENGRAM_TEST_PG_DSN", perr);
    size_t n = 0;
    dsn[0] = '\0';
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        const char *v = strcmp(o->keyword, "dbname") == 0 ? pgtest_name : o->val;
        if (!v)
            continue;
        n += (size_t)snprintf(dsn + n, n < dsnlen ? dsnlen - n : 0, "%s%s='", n ? " " : "",
                              o->keyword);
        for (const char *p = v; *p && n + 3 < dsnlen; p++) {
            if (*p == '\'' || *p == '\\')
                dsn[n++] = '\\';
            dsn[n++] = *p;
        }
        n += (size_t)snprintf(dsn + n, n < dsnlen ? dsnlen - n : 0, "'");
    }
    PQconninfoFree(opts);
    if (n >= dsnlen)
        pgtest_die("building the test DSN", "too long");
}

/* Drops the database pgtest_create made, with any connection still open to it. */
static void pgtest_drop(void)
{
    if (!pgtest_name[0])
        return;
    PGconn *admin = pgtest_admin();
    char sql[160];
    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", pgtest_name);
    pgtest_exec(admin, sql);
    PQfinish(admin);
    pgtest_name[0] = '\0';
}

#endif
