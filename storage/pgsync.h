/* storage/pgsync.h: blocking PostgreSQL calls, for start-up and background threads only.
 *
 * The migrations at start, the index loaders (loader.h) and the background threads
 * (maintenance, consolidation, change catch-up) hold a connection of their own and wait for
 * each answer. Nothing here may run on a worker's event loop: that is the pool's job (db.h).
 * A PGconn is used by one thread at a time; the functions keep no state of their own, so
 * any thread may call them on a connection it holds.
 *
 * Errors: a NULL result or a negative errno, with libpq's message in err, without its
 * trailing newline (it may hold several lines: a statement's LINE and caret, a connection
 * attempt per host). err may be NULL only where a function says so.
 */
#ifndef ENGRAM_STORAGE_PGSYNC_H
#define ENGRAM_STORAGE_PGSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "db.h" /* db_stmt_def, DB_ARRAY_LEN: the statement tables serve both */

/* pgsync_connect opens a connection with dsn (failover defaults added, see pgparams.h),
 * waiting at most about timeout_ms per host, sets client_min_messages to warning and, when
 * role is not NULL, SET ROLE role. Returns the connection, which the caller owns (PQfinish),
 * or NULL with the reason in err. */
PGconn *pgsync_connect(const char *dsn, const char *role, unsigned timeout_ms, char *err,
                       size_t errlen);

/* pgsync_connect_at is pgsync_connect to another node of the same database: dsn's
 * credentials, database and options with host and port replaced (hostaddr dropped; port
 * NULL: the default port). host NULL: dsn as it is. A Citus coordinator's workers are
 * reached this way. */
PGconn *pgsync_connect_at(const char *dsn, const char *host, const char *port, const char *role,
                          unsigned timeout_ms, char *err, size_t errlen);

/* pgsync_exec runs one statement sql with nparams text parameters (values; NULL entries are
 * SQL NULL) and checks for PGRES_COMMAND_OK or PGRES_TUPLES_OK. Returns the result (the
 * caller frees it with PQclear) or NULL with the error in err. */
PGresult *pgsync_exec(PGconn *c, const char *sql, int nparams, const char *const *values, char *err,
                      size_t errlen);

/* pgsync_exec_stmt is pgsync_exec of statement s (sent unprepared) with the nvalues values.
 * nvalues must equal s->nparams: otherwise (a bug in the caller) it returns NULL with
 * "statement X takes N parameters" in err before touching c. */
PGresult *pgsync_exec_stmt(PGconn *c, const db_stmt_def *s, const char *const *values,
                           size_t nvalues, char *err, size_t errlen);

/* PGSYNC_EXEC(c, s, v, err, errlen) is pgsync_exec_stmt with the array v's own length. */
#define PGSYNC_EXEC(c, s, v, err, errlen)                                                          \
    pgsync_exec_stmt((c), (s), (v), DB_ARRAY_LEN(v), (err), (errlen))

/* pgsync_script runs sql, which may hold several statements and no parameters (a migration
 * file), as one simple query: PostgreSQL runs it in one implicit transaction unless it holds
 * its own BEGIN/COMMIT. Returns 0, or -EIO with the first error in err. */
int pgsync_script(PGconn *c, const char *sql, char *err, size_t errlen);

/* The transaction of background work on one tenant's rows. */
typedef enum pgsync_tx_mode {
    PGSYNC_TX_WRITE,    /* read committed, read-write */
    PGSYNC_TX_READ,     /* read committed, read-only */
    PGSYNC_TX_SNAPSHOT, /* repeatable read, read-only: one consistent view */
} pgsync_tx_mode;

/* pgsync_set_citus tells pgsync that the database is a Citus cluster: from then on
 * pgsync_tenant_begin's write transactions take the split fence (citusmove.h). Call once at
 * start, before any other thread uses pgsync. */
void pgsync_set_citus(bool on);

/* pgsync_tenant_begin starts a transaction of the given mode on c and binds row-level
 * security to tenant (engram.tenant_id, for this transaction only). Returns 0, or -EIO with
 * the reason in err (nothing is left open then). */
int pgsync_tenant_begin(PGconn *c, int64_t tenant, pgsync_tx_mode mode, char *err, size_t errlen);

/* pgsync_tenant_exec runs statement s with its values in a transaction of its own (mode),
 * bound to tenant, committed when the statement succeeded and rolled back otherwise. Returns
 * the result (the caller frees it with PQclear) or NULL with the reason in err; c must be
 * idle. */
PGresult *pgsync_tenant_exec(PGconn *c, int64_t tenant, pgsync_tx_mode mode, const db_stmt_def *s,
                             const char *const *values, size_t nvalues, char *err, size_t errlen);

/* pgsync_tx_end commits (commit true) or rolls back the transaction c has open. Returns 0,
 * or -EIO with the reason in err when the commit failed (the transaction is rolled back
 * then, also when it had failed before: COMMIT answers ROLLBACK). A rollback's own failure
 * is not reported: the connection is then unusable anyway, and the caller learns it from its
 * next statement or PQstatus. err may be NULL (errlen 0). */
int pgsync_tx_end(PGconn *c, bool commit, char *err, size_t errlen);

#endif
