/* storage/migrate.c: applies the embedded schema migrations (see migrate.h). */
#include "migrate.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgsync.h"

/* An arbitrary constant naming the advisory lock that serializes migrations. */
#define MIGRATE_LOCK_KEY "7420001"

/* The privileges of every function, after any function file ran: engram_app only. */
#define FUNCTION_GRANTS                                                                            \
    "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC; "                               \
    "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO engram_app"

int migrate_latest(void)
{
    return migrate_nsteps > 0 ? migrate_steps[migrate_nsteps - 1].version : 0;
}

static int plan_latest(const migrate_plan *plan)
{
    return plan->nsteps > 0 ? plan->steps[plan->nsteps - 1].version : 0;
}

/* Runs the nscripts scripts (each one or more statements), then the nparams-parameter
 * statement record, in one transaction. On failure everything is rolled back and err says
 * "<what> failed: <reason>". Returns 0 or -EIO. */
static int apply_in_tx(PGconn *c, const char *what, const char *const *scripts, int nscripts,
                       const char *record, int nparams, const char *const *vals, char *err,
                       size_t errlen)
{
    char msg[512];
    if (pgsync_script(c, "BEGIN", err, errlen) < 0)
        return -EIO;
    for (int i = 0; i < nscripts; i++)
        if (pgsync_script(c, scripts[i], msg, sizeof(msg)) < 0)
            goto fail;
    PGresult *r = pgsync_exec(c, record, nparams, vals, msg, sizeof(msg));
    if (!r)
        goto fail;
    PQclear(r);
    if (pgsync_tx_end(c, true, msg, sizeof(msg)) < 0) {
        snprintf(err, errlen, "%s failed to commit: %s", what, msg);
        return -EIO;
    }
    return 0;
fail:
    snprintf(err, errlen, "%s failed: %s", what, msg);
    pgsync_tx_end(c, false, NULL, 0);
    return -EIO;
}

/* A function file as Citus takes it: Citus refuses to distribute a function defined with
 * "SET search_path FROM CURRENT", so each one names search_path, the value the migrating
 * connection has (what FROM CURRENT would have captured). Returns a malloc'd copy, or NULL
 * when out of memory. */
static char *citus_text(const char *sql, const char *search_path)
{
    static const char from[] = "SET search_path FROM CURRENT";
    size_t nfrom = sizeof(from) - 1, nto = strlen("SET search_path TO ") + strlen(search_path);
    size_t n = 0;
    for (const char *p = strstr(sql, from); p; p = strstr(p + nfrom, from))
        n++;
    char *out = malloc(strlen(sql) + n * (nto > nfrom ? nto - nfrom : 0) + 1);
    if (!out)
        return NULL;
    char *o = out;
    const char *p = sql;
    for (const char *q = strstr(p, from); q; p = q + nfrom, q = strstr(p, from)) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        o += sprintf(o, "SET search_path TO %s", search_path);
    }
    strcpy(o, p);
    return out;
}

/* Runs each function file of plan whose checksum differs from the recorded one, in one
 * transaction per file, and sets *ran to how many ran. On Citus (search_path not NULL: the
 * connection's) the files run as citus_text makes them and their checksums are recorded
 * with a "citus:" prefix, so a database moved onto Citus runs every file again. Returns 0,
 * or -EIO with the reason in err (*ran counts those that committed before). */
static int apply_functions(PGconn *c, const migrate_plan *plan, const char *search_path, int *ran,
                           char *err, size_t errlen)
{
    *ran = 0;
    for (int i = 0; i < plan->nfunctions; i++) {
        const migrate_functions *f = &plan->functions[i];
        const char *nv[] = {f->name};
        char sum[80];
        snprintf(sum, sizeof(sum), "%s%s", search_path ? "citus:" : "", f->checksum);
        PGresult *r = pgsync_exec(c, "SELECT checksum FROM schema_functions WHERE name = $1", 1, nv,
                                  err, errlen);
        if (!r)
            return -EIO;
        bool same = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), sum) == 0;
        PQclear(r);
        if (same)
            continue;
        char what[160];
        snprintf(what, sizeof(what), "functions %s", f->name);
        char *text = search_path ? citus_text(f->sql, search_path) : NULL;
        if (search_path && !text) {
            snprintf(err, errlen, "%s: out of memory", what);
            return -EIO;
        }
        /* bodies are checked when called: files may refer to each other in any order; the
         * grants follow whatever the file defined */
        const char *const scripts[] = {"SET LOCAL check_function_bodies = off",
                                       text ? text : f->sql, FUNCTION_GRANTS};
        const char *vals[] = {f->name, sum};
        int rc = apply_in_tx(c, what, scripts, 3,
                             "INSERT INTO schema_functions (name, checksum) VALUES ($1, $2) "
                             "ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, "
                             "applied_at = EXCLUDED.applied_at",
                             2, vals, err, errlen);
        free(text);
        if (rc < 0)
            return -EIO;
        (*ran)++;
    }
    return 0;
}

/* On a database with the citus extension, sets *path to the connection's search_path
 * (malloc'd); elsewhere to NULL. Returns 0 or -EIO with err set. */
static int citus_search_path(PGconn *c, char **path, char *err, size_t errlen)
{
    *path = NULL;
    PGresult *r = pgsync_exec(c,
                              "SELECT current_setting('search_path') FROM pg_extension "
                              "WHERE extname = 'citus'",
                              0, NULL, err, errlen);
    if (!r)
        return -EIO;
    if (PQntuples(r) == 1) {
        *path = strdup(PQgetvalue(r, 0, 0));
        if (!*path) {
            PQclear(r);
            snprintf(err, errlen, "out of memory");
            return -EIO;
        }
    }
    PQclear(r);
    return 0;
}

/* Creates the bookkeeping tables when missing and reads the database's schema version into
 * *current. Returns 0, -EIO, or -EPROTONOSUPPORT when the database was created before the
 * baseline; err says why. */
static int read_version(PGconn *c, int *current, char *err, size_t errlen)
{
    if (pgsync_script(c,
                      "CREATE TABLE IF NOT EXISTS schema_migrations ("
                      " version integer PRIMARY KEY, name text NOT NULL,"
                      " applied_at timestamptz NOT NULL DEFAULT now());"
                      "CREATE TABLE IF NOT EXISTS schema_functions ("
                      " name text PRIMARY KEY, checksum text NOT NULL,"
                      " applied_at timestamptz NOT NULL DEFAULT now())",
                      err, errlen) < 0)
        return -EIO;
    PGresult *r = pgsync_exec(c,
                              "SELECT COALESCE(max(version), 0), "
                              "COALESCE((SELECT name FROM schema_migrations WHERE version = 1),"
                              " 'baseline') FROM schema_migrations",
                              0, NULL, err, errlen);
    if (!r)
        return -EIO;
    char *end = NULL;
    long v = PQntuples(r) == 1 ? strtol(PQgetvalue(r, 0, 0), &end, 10) : -1;
    bool ok = end && end != PQgetvalue(r, 0, 0) && *end == '\0' && v >= 0 && v <= INT_MAX;
    bool pre_baseline = ok && strcmp(PQgetvalue(r, 0, 1), "baseline") != 0;
    PQclear(r);
    if (!ok) {
        snprintf(err, errlen, "schema_migrations holds no readable version");
        return -EIO;
    }
    if (pre_baseline) {
        snprintf(err, errlen,
                 "this database was created with the schema numbering that preceded the "
                 "baseline (its migration 1 is not 'baseline'); nothing was released with it: "
                 "create a new database");
        return -EPROTONOSUPPORT;
    }
    *current = (int)v;
    return 0;
}

/* Applies the migrations of plan newer than the database's version, then its function
 * files, then on Citus its Citus file; the caller holds the advisory lock. Returns as
 * migrate_run_plan, with the count in *n. */
static int run_locked(PGconn *c, const migrate_plan *plan, int *n, char *err, size_t errlen)
{
    int current = 0;
    int rc = read_version(c, &current, err, errlen);
    if (rc < 0)
        return rc;
    if (current > plan_latest(plan)) {
        snprintf(err, errlen,
                 "database schema version %d is newer than this engramd knows (%d): upgrade "
                 "engramd",
                 current, plan_latest(plan));
        return -EPROTONOSUPPORT;
    }
    for (int i = 0; i < plan->nsteps; i++) {
        const migrate_step *s = &plan->steps[i];
        if (s->version <= current)
            continue;
        char what[160], ver[16];
        snprintf(what, sizeof(what), "migration %04d_%s", s->version, s->name);
        snprintf(ver, sizeof(ver), "%d", s->version);
        const char *vals[] = {ver, s->name};
        if (apply_in_tx(c, what, &s->sql, 1,
                        "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", 2, vals,
                        err, errlen) < 0)
            return -EIO;
        (*n)++;
    }
    /* on Citus: the tables distributed before the functions are defined (a function is
     * created on the workers too only when what it refers to is distributed already), the
     * functions distributed after */
    char *path = NULL;
    if (plan->citus_tables && citus_search_path(c, &path, err, errlen) < 0)
        return -EIO;
    if (path && apply_in_tx(c, "the Citus tables (storage/citus/10_tables.sql)",
                            &plan->citus_tables, 1, "SELECT 1", 0, NULL, err, errlen) < 0) {
        free(path);
        return -EIO;
    }
    int nf = 0;
    rc = apply_functions(c, plan, path, &nf, err, errlen);
    *n += nf;
    if (rc == 0 && path)
        rc = apply_in_tx(c, "the Citus functions (storage/citus/20_functions.sql)",
                         &plan->citus_functions, 1, "SELECT 1", 0, NULL, err, errlen);
    free(path);
    return rc;
}

/* 1 when c is connected to a Citus worker (the citus extension, not the coordinator), 0
 * when not, -EIO on failure. */
static int citus_worker(PGconn *c, char *err, size_t errlen)
{
    /* the function exists only with the extension: asked apart */
    PGresult *r =
        pgsync_exec(c, "SELECT 1 FROM pg_extension WHERE extname = 'citus'", 0, NULL, err, errlen);
    if (!r)
        return -EIO;
    int has = PQntuples(r) == 1;
    PQclear(r);
    if (!has)
        return 0;
    r = pgsync_exec(c, "SELECT NOT citus_is_coordinator()", 0, NULL, err, errlen);
    if (!r)
        return -EIO;
    int yes = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return yes;
}

/* On a Citus worker nothing is applied (DDL runs through the coordinator, which distributes
 * it): the schema the coordinator applied must be the one this engramd was built with, its
 * version and every function file's checksum (schema_migrations and schema_functions are
 * reference tables on Citus, storage/citus/10_tables.sql, so a worker reads them). Returns
 * 0, or -EAGAIN (older: migrate through the coordinator first) or -EPROTONOSUPPORT
 * (newer) or -EIO, with the reason in err. */
static int check_on_worker(PGconn *c, const migrate_plan *plan, char *err, size_t errlen)
{
    /* no schema_migrations here: the coordinator has applied nothing yet, or an engramd
     * before reference tables kept it on the coordinator alone */
    PGresult *r =
        pgsync_exec(c, "SELECT to_regclass('schema_migrations') IS NOT NULL", 0, NULL, err, errlen);
    if (!r)
        return -EIO;
    bool known = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    long v = -1;
    if (known) {
        r = pgsync_exec(c, "SELECT COALESCE(max(version), 0) FROM schema_migrations", 0, NULL, err,
                        errlen);
        if (!r)
            return -EIO;
        v = strtol(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
    }
    if (v > plan_latest(plan)) {
        snprintf(err, errlen,
                 "database schema version %ld is newer than this engramd knows (%d): upgrade "
                 "engramd",
                 v, plan_latest(plan));
        return -EPROTONOSUPPORT;
    }
    bool same = v == plan_latest(plan);
    for (int i = 0; same && i < plan->nfunctions; i++) {
        const migrate_functions *f = &plan->functions[i];
        char sum[80];
        snprintf(sum, sizeof(sum), "citus:%s", f->checksum);
        const char *nv[] = {f->name};
        r = pgsync_exec(c, "SELECT checksum FROM schema_functions WHERE name = $1", 1, nv, err,
                        errlen);
        if (!r)
            return -EIO;
        same = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), sum) == 0;
        PQclear(r);
    }
    if (!same) {
        snprintf(err, errlen,
                 "this is a Citus worker and the schema its coordinator applied is not this "
                 "engramd's (version %ld of %d, or other functions): start this engramd against "
                 "the coordinator first (or run engramd migrate there), then here",
                 v, plan_latest(plan));
        return -EAGAIN;
    }
    return 0;
}

int migrate_run_plan(PGconn *c, const migrate_plan *plan, int *applied, char *err, size_t errlen)
{
    int n = 0;
    char msg[512];
    if (applied)
        *applied = 0;
    if (plan->citus_tables) {
        int worker = citus_worker(c, err, errlen);
        if (worker < 0)
            return -EIO;
        if (worker)
            return check_on_worker(c, plan, err, errlen);
    }
    if (pgsync_script(c, "SELECT pg_advisory_lock(" MIGRATE_LOCK_KEY ")", err, errlen) < 0)
        return -EIO;
    int rc = run_locked(c, plan, &n, err, errlen);
    pgsync_script(c, "SELECT pg_advisory_unlock(" MIGRATE_LOCK_KEY ")", msg, sizeof(msg));
    if (applied)
        *applied = n;
    return rc;
}

int migrate_citus(PGconn *c, char *err, size_t errlen)
{
    char *path = NULL;
    if (citus_search_path(c, &path, err, errlen) < 0)
        return -EIO;
    int yes = path != NULL;
    free(path);
    if (!yes)
        return 0;
    int worker = citus_worker(c, err, errlen);
    return worker < 0 ? worker : worker ? 2 : 1;
}

int migrate_run(PGconn *c, int *applied, char *err, size_t errlen)
{
    const migrate_plan plan = {
        .steps = migrate_steps,
        .nsteps = migrate_nsteps,
        .functions = migrate_function_files,
        .nfunctions = migrate_nfunction_files,
        .citus_tables = migrate_citus_tables,
        .citus_functions = migrate_citus_functions,
    };
    return migrate_run_plan(c, &plan, applied, err, errlen);
}
