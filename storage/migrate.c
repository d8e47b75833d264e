/* storage/migrate.c: applies the embedded schema migrations (see migrate.h). */
#include "migrate.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgsync.h"

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
        return -EIO;
    }
    PQclear(r);
    return 0;
}

/* The privileges of every function, after any function file ran: engram_app only. */
#define FUNCTION_GRANTS                                                                            \
    "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC; "                               \
    "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO engram_app"

/* Runs each function file whose checksum differs from the recorded one, in one transaction
 * per file. Returns how many ran, or -1 with the reason in err. */
static int apply_functions(PGconn *c, char *err, size_t errlen)
{
    int n = 0;
    char msg[512];
    for (int i = 0; i < migrate_nfunction_files; i++) {
        const migrate_functions *f = &migrate_function_files[i];
        const char *nv[] = {f->name};
        PGresult *r = pgsync_exec(c, "SELECT checksum FROM schema_functions WHERE name = $1", 1, nv,
                                  err, errlen);
        if (!r)
            return -EIO;
        bool same = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), f->checksum) == 0;
        PQclear(r);
        if (same)
            continue;
        if (exec_simple(c, "BEGIN", err, errlen) < 0)
            return -EIO;
        /* bodies are checked when called: files may refer to each other in any order */
        if (exec_simple(c, "SET LOCAL check_function_bodies = off", msg, sizeof(msg)) < 0 ||
            exec_simple(c, f->sql, msg, sizeof(msg)) < 0 ||
            exec_simple(c, FUNCTION_GRANTS, msg, sizeof(msg)) < 0) {
            snprintf(err, errlen, "functions %s failed: %s", f->name, msg);
            exec_simple(c, "ROLLBACK", msg, sizeof(msg));
            return -EIO;
        }
        const char *vals[] = {f->name, f->checksum};
        r = pgsync_exec(c,
                        "INSERT INTO schema_functions (name, checksum) VALUES ($1, $2) "
                        "ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, "
                        "applied_at = now()",
                        2, vals, err, errlen);
        if (!r) {
            exec_simple(c, "ROLLBACK", msg, sizeof(msg));
            return -EIO;
        }
        PQclear(r);
        if (exec_simple(c, "COMMIT", err, errlen) < 0)
            return -EIO;
        n++;
    }
    return n;
}

int migrate_run(PGconn *c, int *applied, char *err, size_t errlen)
{
    int n = 0, current = 0, rc = -EIO;
    char msg[512];
    if (applied)
        *applied = 0;
    if (exec_simple(c, "SELECT pg_advisory_lock(" MIGRATE_LOCK_KEY ")", err, errlen) < 0)
        return -EIO;
    if (exec_simple(c,
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())",
                    err, errlen) < 0)
        goto out;
    if (exec_simple(c,
                    "CREATE TABLE IF NOT EXISTS schema_functions ("
                    " name text PRIMARY KEY, checksum text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())",
                    err, errlen) < 0)
        goto out;
    PGresult *r = pgsync_exec(c,
                              "SELECT COALESCE(max(version), 0), "
                              "COALESCE((SELECT name FROM schema_migrations WHERE version = 1),"
                              " 'baseline') FROM schema_migrations",
                              0, NULL, err, errlen);
    if (!r)
        goto out;
    current = atoi(PQgetvalue(r, 0, 0));
    bool pre_baseline = strcmp(PQgetvalue(r, 0, 1), "baseline") != 0;
    PQclear(r);
    if (pre_baseline) {
        snprintf(err, errlen,
                 "this database was created with the schema numbering that preceded the "
                 "baseline (its migration 1 is not 'baseline'); nothing was released with it: "
                 "create a new database");
        rc = -EPROTONOSUPPORT;
        goto out;
    }
    if (current > migrate_latest()) {
        snprintf(err, errlen,
                 "database schema version %d is newer than this engramd knows (%d): upgrade "
                 "engramd",
                 current, migrate_latest());
        rc = -EPROTONOSUPPORT;
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
        r = pgsync_exec(c, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", 2, vals,
                        err, errlen);
        if (!r) {
            exec_simple(c, "ROLLBACK", msg, sizeof(msg));
            goto out;
        }
        PQclear(r);
        if (exec_simple(c, "COMMIT", err, errlen) < 0)
            goto out;
        n++;
    }
    int nf = apply_functions(c, err, errlen);
    if (nf < 0)
        goto out;
    n += nf;
    rc = 0;
out:
    exec_simple(c, "SELECT pg_advisory_unlock(" MIGRATE_LOCK_KEY ")", msg, sizeof(msg));
    if (applied)
        *applied = n;
    return rc;
}
