/* storage/pgsync.c: blocking PostgreSQL calls (see pgsync.h). */
#include "pgsync.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "citusmove.h"
#include "pgparams.h"

/* Copies libpq's message into err as one line. */
static void set_err(char *err, size_t errlen, const char *msg)
{
    if (!err || errlen == 0)
        return;
    snprintf(err, errlen, "%s", msg ? msg : "unknown error");
    size_t n = strlen(err);
    while (n > 0 && (err[n - 1] == '\n' || err[n - 1] == '\r'))
        err[--n] = '\0';
}

PGconn *pgsync_connect(const char *dsn, const char *role, unsigned timeout_ms, char *err,
                       size_t errlen)
{
    return pgsync_connect_at(dsn, NULL, NULL, role, timeout_ms, err, errlen);
}

PGconn *pgsync_connect_at(const char *dsn, const char *host, const char *port, const char *role,
                          unsigned timeout_ms, char *err, size_t errlen)
{
    pgparams pp;
    if (pgparams_init(&pp, dsn, timeout_ms, err, errlen) < 0)
        return NULL;
    if (host && (pgparams_set(&pp, "host", host) < 0 || pgparams_set(&pp, "hostaddr", NULL) < 0 ||
                 pgparams_set(&pp, "port", port) < 0)) {
        set_err(err, errlen, "cannot set the node's host and port");
        pgparams_fini(&pp);
        return NULL;
    }
    PGconn *c = PQconnectdbParams(pp.keys, pp.vals, 0);
    pgparams_fini(&pp);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        set_err(err, errlen, c ? PQerrorMessage(c) : "out of memory");
        goto fail;
    }
    PGresult *r = pgsync_exec(c, "SET client_min_messages = warning", 0, NULL, err, errlen);
    if (!r)
        goto fail;
    PQclear(r);
    if (role) {
        char *id = PQescapeIdentifier(c, role, strlen(role));
        if (!id) {
            set_err(err, errlen, "bad role name");
            goto fail;
        }
        char sql[300];
        int n = snprintf(sql, sizeof(sql), "SET ROLE %s", id);
        PQfreemem(id);
        if (n < 0 || (size_t)n >= sizeof(sql)) {
            set_err(err, errlen, "role name too long");
            goto fail;
        }
        r = pgsync_exec(c, sql, 0, NULL, err, errlen);
        if (!r)
            goto fail;
        PQclear(r);
    }
    return c;
fail:
    PQfinish(c);
    return NULL;
}

PGresult *pgsync_exec(PGconn *c, const char *sql, int nparams, const char *const *values, char *err,
                      size_t errlen)
{
    PGresult *r = PQexecParams(c, sql, nparams, NULL, values, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
        return r;
    set_err(err, errlen, r ? PQresultErrorMessage(r) : PQerrorMessage(c));
    PQclear(r);
    return NULL;
}

PGresult *pgsync_exec_stmt(PGconn *c, const db_stmt_def *s, const char *const *values,
                           size_t nvalues, char *err, size_t errlen)
{
    if (!s || s->nparams < 0 || nvalues != (size_t)s->nparams) {
        if (err && errlen)
            snprintf(err, errlen, "statement %s takes %d parameters, %zu passed", s ? s->name : "?",
                     s ? s->nparams : 0, nvalues);
        return NULL;
    }
    return pgsync_exec(c, s->sql, s->nparams, values, err, errlen);
}

int pgsync_script(PGconn *c, const char *sql, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    int rc = 0;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        set_err(err, errlen, r ? PQresultErrorMessage(r) : PQerrorMessage(c));
        rc = -EIO;
    }
    PQclear(r);
    return rc;
}

/* Set once at start (pgsync_set_citus), read by every thread after. */
static bool citus;

void pgsync_set_citus(bool on)
{
    citus = on;
}

int pgsync_tenant_begin(PGconn *c, int64_t tenant, pgsync_tx_mode mode, char *err, size_t errlen)
{
    static const char *const begin[] = {
        [PGSYNC_TX_WRITE] = "BEGIN",
        [PGSYNC_TX_READ] = "BEGIN READ ONLY",
        [PGSYNC_TX_SNAPSHOT] = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
    };
    if ((unsigned)mode >= sizeof(begin) / sizeof(begin[0])) {
        set_err(err, errlen, "unknown transaction mode");
        return -EIO;
    }
    PGresult *r = pgsync_exec(c, begin[mode], 0, NULL, err, errlen);
    if (!r)
        return -EIO;
    PQclear(r);
    /* SET LOCAL rather than set_config(): on Citus the coordinator passes it on to the
     * workers (citus.propagate_set_commands = local), whose row-level security reads it */
    char set[64];
    snprintf(set, sizeof(set), "SET LOCAL engram.tenant_id = '%lld'", (long long)tenant);
    r = pgsync_exec(c, set, 0, NULL, err, errlen);
    if (r && citus && mode == PGSYNC_TX_WRITE) {
        char fence[192];
        snprintf(fence, sizeof(fence), CMOVE_FENCE_SQL_FMT, CMOVE_FENCE_CLASS, (long long)tenant);
        PQclear(r);
        r = pgsync_exec(c, fence, 0, NULL, err, errlen);
    }
    if (!r) {
        pgsync_tx_end(c, false, NULL, 0);
        return -EIO;
    }
    PQclear(r);
    return 0;
}

int pgsync_tx_end(PGconn *c, bool commit, char *err, size_t errlen)
{
    char e2[256];
    bool own = err && errlen;
    PGresult *r = pgsync_exec(c, commit ? "COMMIT" : "ROLLBACK", 0, NULL, own ? err : e2,
                              own ? errlen : sizeof(e2));
    if (!r && commit) {
        PQclear(pgsync_exec(c, "ROLLBACK", 0, NULL, e2, sizeof(e2)));
        return -EIO;
    }
    /* COMMIT of a transaction that failed answers ROLLBACK, not an error */
    bool rolled_back = r && commit && strcmp(PQcmdStatus(r), "ROLLBACK") == 0;
    PQclear(r);
    if (rolled_back) {
        set_err(err, errlen, "the transaction failed and was rolled back");
        return -EIO;
    }
    return 0;
}

PGresult *pgsync_tenant_exec(PGconn *c, int64_t tenant, pgsync_tx_mode mode, const db_stmt_def *s,
                             const char *const *values, size_t nvalues, char *err, size_t errlen)
{
    if (pgsync_tenant_begin(c, tenant, mode, err, errlen) < 0)
        return NULL;
    PGresult *res = pgsync_exec_stmt(c, s, values, nvalues, err, errlen);
    if (pgsync_tx_end(c, res != NULL, err, errlen) < 0) {
        PQclear(res);
        return NULL;
    }
    return res;
}
