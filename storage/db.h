/* storage/db.h: an asynchronous PostgreSQL connection pool driven by a libevent loop.
 *
 * One pool belongs to one event_base (one worker thread); nothing here blocks. Each
 * connection runs in libpq pipeline mode, so many jobs share a connection without waiting
 * for each other's round trips. A job is one to DB_MAX_QUERIES prepared statements that run
 * in one transaction (they are sent back to back and closed by one pipeline sync), so a job
 * commits or fails as a whole. Statements are prepared on every connection as it comes up.
 *
 * Failure handling: a lost connection fails its in-flight jobs with DB_UNAVAILABLE and is
 * reopened with exponential backoff; a job that finds no usable connection for
 * queue_timeout_ms, or that runs longer than query_timeout_ms, fails with DB_UNAVAILABLE.
 * A heartbeat pings idle connections every heartbeat_ms; when jobs are in flight and no
 * connection has received anything for stall_ms (a stopped or hung server keeps its
 * sockets open and answers nothing), the pool is stalled: in-flight jobs fail and their
 * connections reconnect, waiting and new jobs fail at once, all with DB_UNAVAILABLE, until
 * any connection receives an answer again.
 * A statement refused because the server is read-only (SQLSTATE 25006: a standby, or a
 * primary demoted by a failover) fails its job with DB_UNAVAILABLE and reconnects.
 *
 * Failover: the DSN may name several hosts (host=a,b port=p,q) with
 * target_session_attrs=read-write, so that each new connection finds the current primary.
 * Unless the DSN sets them, connections get TCP keepalives (idle 5 s, then 3 probes 2 s
 * apart), tcp_user_timeout = queue_timeout_ms and connect_timeout: a primary whose machine
 * vanished without closing its sockets is noticed and a dead first host is skipped. After a
 * failover the in-flight jobs fail (DB_UNAVAILABLE: a write may have committed, so callers
 * retry with an idempotency key), connections come back on the new primary with backoff.
 * A job's callback runs exactly once, on the pool's thread. A write whose callback did not
 * report DB_OK may or may not have committed; callers never acknowledge it.
 */
#ifndef ENGRAM_STORAGE_DB_H
#define ENGRAM_STORAGE_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

struct event_base;

typedef struct db_pool db_pool;

#define DB_MAX_QUERIES 16
#define DB_MAX_PARAMS 24

/* A statement prepared on every connection under its name. */
typedef struct db_stmt_def {
    const char *name;
    const char *sql;
    int nparams;
} db_stmt_def;

typedef struct db_config {
    const char *dsn;           /* libpq connection string (copied) */
    unsigned connections;      /* connections in this pool, >= 1 */
    unsigned max_inflight;     /* jobs in flight per connection before queueing */
    unsigned queue_timeout_ms; /* longest wait for a usable connection */
    unsigned query_timeout_ms; /* longest a job may run once sent */
    unsigned backoff_min_ms;   /* first reconnect delay */
    unsigned backoff_max_ms;   /* reconnect delay cap */
    size_t max_queue;          /* jobs waiting for a connection before refusing */
    unsigned heartbeat_ms;     /* an idle connection is pinged this often (default 1000) */
    unsigned stall_ms;         /* no answer on any connection for this long while jobs wait:
                                * the database is stalled (default 3000), see below */
    const char *role;          /* SET ROLE to this after connecting, or NULL */
    bool rls_set_local;        /* a job's tenant (db_opts.rls_tenant) by a SET LOCAL statement,
                                * not the prepared set_config(): a Citus coordinator passes
                                * SET LOCAL on to the workers, whose row-level security reads
                                * it (citus.propagate_set_commands = local) */
    const db_stmt_def *stmts;  /* prepared on each connection (not copied: static) */
    size_t nstmts;
    /* on_event reports connection state changes (connected, lost, retrying) as text; may be
     * NULL. level: 0 debug, 1 info, 2 warning, 3 error. Runs on the pool's thread. */
    void (*on_event)(void *ud, int level, const char *msg);
    void *ud;
} db_config;

typedef enum db_status {
    DB_OK = 0,
    DB_ERROR,       /* PostgreSQL rejected a statement: sqlstate and message are set */
    DB_UNAVAILABLE, /* no connection, the connection was lost, or the job timed out */
} db_status;

/* What a job's callback receives. Every pointer is owned by the pool and valid only during
 * the callback. */
typedef struct db_result {
    db_status status;
    const char *sqlstate; /* DB_ERROR: the 5-character SQLSTATE */
    const char *message;  /* DB_ERROR and DB_UNAVAILABLE: a human-readable reason */
    const char *detail;   /* DB_ERROR: the error's DETAIL field, or NULL */
    PGresult *const *res; /* DB_OK: one result per query of the job, in order */
    int nres;
} db_result;

typedef void (*db_cb)(void *arg, const db_result *r);

/* One statement of a job. Parameter memory is copied at submission. */
typedef struct db_query {
    const db_stmt_def *stmt;   /* a statement of db_config.stmts (prepared under its name) */
    size_t nvalues;            /* the values passed: must equal stmt->nparams (checked) */
    const char *const *values; /* NULL entries are SQL NULL */
    const int *lengths;        /* for binary parameters; may be NULL when all are text */
    const int *formats;        /* 0 text, 1 binary; may be NULL when all are text */
    int result_format;         /* 0 text, 1 binary */
} db_query;

/* DB_ARRAY_LEN is the element count of an array (a pointer does not compile). */
#define DB_ARRAY_LEN(a)                                                                            \
    (sizeof(a) / sizeof((a)[0]) +                                                                  \
     0 * sizeof(struct {                                                                           \
         int not_an_array : __builtin_types_compatible_p(__typeof__(a), __typeof__(&(a)[0])) ? -1  \
                                                                                             : 1;  \
     }))

/* DB_VALUES(v) sets a db_query's values and nvalues from the array v: the count the statement
 * table expects is then checked against the array the caller really has. */
#define DB_VALUES(v) .values = (v), .nvalues = DB_ARRAY_LEN(v)

/* db_pool_create starts a pool on base and begins connecting at once; jobs submitted before
 * a connection is up wait (up to queue_timeout_ms). Returns NULL when out of memory or the
 * configuration is invalid. Call from base's thread. */
db_pool *db_pool_create(struct event_base *base, const db_config *cfg);

/* db_pool_destroy closes every connection, fails waiting and in-flight jobs with
 * DB_UNAVAILABLE ("shutting down") and frees the pool. NULL is a no-op. */
void db_pool_destroy(db_pool *p);

/* db_query_copy copies the nq queries qs into out (the same statements), with their values,
 * lengths and formats in one new allocation returned in *blob, which the caller frees: the
 * copies live as long as it. Returns 0 or -ENOMEM. (storage/db_query.c: a program that
 * replaces the pool, as tests/fakes/fake_db.c does, keeps this one.) */
int db_query_copy(const db_query *qs, int nq, db_query *out, char **blob);

/* db_submit queues a job of nq queries (1..DB_MAX_QUERIES) that run in one transaction. When
 * rls_tenant >= 0 the transaction first sets the setting engram.tenant_id to it (for
 * row-level security). cb(arg, result) runs exactly once, later, on the pool's thread; never
 * from inside db_submit. Returns 0, -EINVAL for bad arguments, -ENOMEM, or -EAGAIN when the
 * wait queue is full (cb does not run then). */
int db_submit(db_pool *p, int64_t rls_tenant, const db_query *qs, int nq, db_cb cb, void *arg);

/* Options of db_submit_opts. */
typedef struct db_opts {
    int64_t rls_tenant;       /* >= 0: set engram.tenant_id to it first (as db_submit) */
    unsigned lock_timeout_ms; /* > 0: the transaction's lock_timeout: a statement that waits
                               * longer for a lock fails with SQLSTATE 55P03 */
    /* Citus only (db_config.rls_set_local), with rls_tenant -1 and no lock_timeout_ms: the
     * ntenants (1..DB_MAX_QUERIES) tenants whose rows the job's statements write, each
     * statement binding row-level security to its own tenant (a store group,
     * server/methods/gcommit.h): the job runs in a transaction block that first takes the
     * split fence (citusmove.h) of each of them. Not owned; copied at submission. Ignored
     * on a pool without rls_set_local. */
    const int64_t *tenants;
    int ntenants;
} db_opts;

/* db_submit_opts is db_submit with options. */
int db_submit_opts(db_pool *p, const db_opts *o, const db_query *qs, int nq, db_cb cb, void *arg);

/* State for health checks and metrics. */
typedef struct db_pool_stats {
    unsigned connections;    /* configured */
    unsigned ready;          /* connected and prepared */
    size_t queued;           /* jobs waiting for a connection */
    size_t inflight;         /* jobs sent and not yet answered */
    uint64_t reconnects;     /* connections re-established after a loss */
    uint64_t failures;       /* jobs failed with DB_UNAVAILABLE */
    bool stalled;            /* the database stopped answering (see db_config.stall_ms) */
    uint64_t stalls;         /* times it did */
    uint64_t oldest_wait_ms; /* how long the oldest queued job has waited (0: none) */
    uint64_t queue_timeouts; /* jobs failed for waiting queue_timeout_ms for a connection */
} db_pool_stats;

/* db_pool_get_stats fills st; call from the pool's thread. */
void db_pool_get_stats(db_pool *p, db_pool_stats *st);

/* db_pool_idle tells whether no job is queued or in flight (for graceful shutdown). */
bool db_pool_idle(db_pool *p);

/* db_is_own_backend tells whether pid is the backend of one of this process's pool
 * connections (a change notification it sent describes a write this process applied
 * itself). Any thread. */
bool db_is_own_backend(int pid);

#endif
