/* server/domain/bg.h: background threads for work that may block on PostgreSQL.
 *
 * Index loads, change catch-up and maintenance run here, never on a worker. Each thread
 * keeps its own blocking connection, opened on first use and reopened after a failure.
 * A separate listener thread LISTENs for engram_changes notifications, so that indexes
 * follow changes made by other engramd processes sharing the database.
 */
#ifndef ENGRAM_SERVER_BG_H
#define ENGRAM_SERVER_BG_H

#include <stdint.h>

#include <libpq-fe.h>

#include "db.h"

#include "server.h"

typedef struct bg bg;
typedef struct bg_ctx bg_ctx;

/* bg_create starts nthreads job threads and the listener thread. Returns NULL on
 * failure. */
bg *bg_create(server *s, unsigned nthreads);

/* bg_destroy stops accepting jobs, runs every queued job with bg_cancelled true, joins the
 * threads and frees bg. NULL is a no-op. */
void bg_destroy(bg *b);

/* bg_submit queues fn(ctx, arg) for a job thread. Returns 0, or -ENOMEM / -ESHUTDOWN (fn
 * does not run then). */
int bg_submit(bg *b, void (*fn)(bg_ctx *ctx, void *arg), void *arg);

/* bg_conn returns the job thread's database connection, connecting when needed; NULL with
 * the reason in err when the database cannot be reached. Only inside a job. */
PGconn *bg_conn(bg_ctx *ctx, char *err, size_t errlen);

/* bg_exec runs statement s with the nvalues values on the job thread's connection
 * (connecting when needed): the result (PQclear it), or NULL after logging the failure as
 * "<what>: <error>" at warning level and, when the connection broke, dropping it. Only
 * inside a job. */
PGresult *bg_exec(bg_ctx *ctx, const db_stmt_def *s, const char *const *values, size_t nvalues,
                  const char *what);

/* bg_conn_failed tells the thread its connection broke (it is reopened next time). */
void bg_conn_failed(bg_ctx *ctx);

/* bg_read_conn returns the job thread's connection to a hot standby (pg_read_dsn),
 * connecting when needed; NULL when none is configured or it cannot be reached (then not
 * tried again for db_backoff_max_ms: the caller uses bg_conn). Only inside a job.
 * bg_read_conn_failed drops it after an error. */
PGconn *bg_read_conn(bg_ctx *ctx);
void bg_read_conn_failed(bg_ctx *ctx);

/* bg_cancelled tells a job that the server is stopping and it should give up quickly. */
int bg_cancelled(bg_ctx *ctx);

/* bg_listener_ok tells whether the change listener is connected. */
int bg_listener_ok(bg *b);

/* bg_every runs fn(ctx, arg) on a job thread every interval_ms (first run after one
 * interval), until bg_destroy. Call before any other thread uses b. Returns 0 or -ENOMEM. */
int bg_every(bg *b, unsigned interval_ms, void (*fn)(bg_ctx *ctx, void *arg), void *arg);

/* bg_every_set changes the interval of the periodic task registered as fn(arg) (SIGHUP
 * reload); the next run is due at most interval_ms from now. Any thread. Returns 0, or
 * -ENOENT when no such task exists. */
int bg_every_set(bg *b, void (*fn)(bg_ctx *ctx, void *arg), void *arg, unsigned interval_ms);

#endif
