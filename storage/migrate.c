/* storage/migrate.c: applies the embedded schema migrations (see migrate.h). */
#include "migrate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"

/* An arbitrary constant naming the advisory lock that serializes migrations. */
#define MIGRATE_LOCK_KEY "7420001"

int migrate_latest(void)
{
    return migrate_nsteps > 0 ? migrate_steps[migrate_nsteps - 1].version : 0;
}

static int exec_simple(PGconn *c, const char *sql, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        snprintf(err, errlen, "%s", r ? PQresultErrorMessage(r) : PQerrorMessage(c));
        size_t n = strlen(err);
        while (n > 0 && err[n - 1] == '\n')
            err[--n] = '\0';
        PQclear(r);
        return -1;
    }
    PQclear(r);
    return 0;
}

int migrate_run(PGconn *c, int *applied, char *err, size_t errlen)
{
    int n = 0, current = 0, rc = -1;
    char msg[512];
    if (applied)
        *applied = 0;
    if (exec_simple(c, "SELECT pg_advisory_lock(" MIGRATE_LOCK_KEY ")", err, errlen) < 0)
        return -1;
    if (exec_simple(c,
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())",
                    err, errlen) < 0)
        goto out;
    PGresult *r = db_exec_blocking(c, "SELECT COALESCE(max(version), 0) FROM schema_migrations", 0,
                                   NULL, err, errlen);
    if (!r)
        goto out;
    current = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    if (current > migrate_latest()) {
        snprintf(err, errlen,
                 "database schema version %d is newer than this engramd knows (%d): upgrade "
                 "engramd",
                 current, migrate_latest());
        goto out;
    }
    for (int i = 0; i < migrate_nsteps; i++) {
        const migrate_step *s = &migrate_steps[i];
        if (s->version <= current)
            continue;
        if (exec_simple(c, "BEGIN", err, errlen) < 0)
            goto out;
        if (exec_simple(c, s->sql, msg, sizeof(msg)) < 0) {
            snprintf(err, errlen, "migration %04d_%s failed: %s", s->version, s->name, msg);
            exec_simple(c, "ROLLBACK", msg, sizeof(msg));
            goto out;
        }
        char ver[16];
        snprintf(ver, sizeof(ver), "%d", s->version);
        const char *vals[] = {ver, s->name};
        r = db_exec_blocking(c, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", 2,
                             vals, err, errlen);
        if (!r) {
            exec_simple(c, "ROLLBACK", msg, sizeof(msg));
            goto out;
        }
        PQclear(r);
        if (exec_simple(c, "COMMIT", err, errlen) < 0)
            goto out;
        n++;
    }
    rc = 0;
out:
    exec_simple(c, "SELECT pg_advisory_unlock(" MIGRATE_LOCK_KEY ")", msg, sizeof(msg));
    if (applied)
        *applied = n;
    return rc;
}
