/* storage/db.c: the asynchronous PostgreSQL pool (see db.h for the contract). */
#include "db.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "citusmove.h"
#include "pgparams.h"

/* Kinds of statement a job can hold: internal set-up work uses the raw and prepare kinds. */
/* Q_END_TX: "COMMIT" sent after a sync of its own (db_config.rls_set_local): whatever the
 * queries before it did, it ends their transaction block (an aborted one rolls back) */
enum { Q_EXEC_PREPARED, Q_EXEC_RAW, Q_PREPARE, Q_END_TX };

struct db_conn;

typedef struct db_job_query {
    int kind;
    const char *stmt; /* statement name (EXEC_PREPARED, PREPARE) */
    const char *sql;  /* RAW and PREPARE */
    int nparams;
    const char *const *values;
    const int *lengths;
    const int *formats;
    int result_format;
} db_job_query;

typedef struct db_job {
    struct db_job *next;
    db_cb cb;
    void *arg;
    void (*internal_done)(struct db_conn *c, struct db_job *j); /* set-up jobs */
    int nq;                                                     /* queries in q */
    db_job_query *q; /* nq entries, allocated with the job */
    char *blob;      /* owns copies of parameter values (db_query_copy) */
    char rls[64];    /* the RLS query's one value: the tenant id as text; or the whole
                      * SET LOCAL statement (db_config.rls_set_local) */
    const char *rls_val[1];
    char fence[192];   /* Citus: the split fence's statement (citusmove.h) */
    char *fence_many;  /* Citus, several tenants (db_opts.tenants): their fence; owned */
    char lockwait[24]; /* the lock_timeout query's one value: milliseconds as text */
    const char *lockwait_val[1];
    int hidden;    /* set-up queries first in q (RLS, lock_timeout): not the caller's */
    int trailing;  /* queries after the caller's (the lock_timeout's reset, then Q_END_TX
                    * when in a block): not the caller's */
    bool mid_sync; /* the sync before Q_END_TX has been read */
    uint64_t queued_ms;
    uint64_t sent_ms;
    /* result collection */
    int cur;        /* index of the query whose results are arriving */
    bool got_cur;   /* a result for q[cur] has been stored */
    PGresult **res; /* nq entries, allocated with the job */
    bool failed;
    char sqlstate[6];
    char *errmsg;
    char *detail;
} db_job;

enum { C_DOWN, C_CONNECTING, C_SETUP, C_READY };

typedef struct db_conn {
    db_pool *pool;
    PGconn *pg;
    int state;
    struct event *ev_io;    /* persistent read (and write while connecting/flushing) */
    struct event *ev_retry; /* backoff timer */
    bool want_write;
    db_job *head, *tail; /* in flight, in pipeline order */
    size_t ninflight;
    unsigned backoff_ms;
    bool ever_ready;
    uint64_t connect_started_ms; /* when the attempt on the current host began */
    const char *attempt_host;    /* libpq's host and port entry being tried (identity only: */
    const char *attempt_port;    /* a multi-host DSN moves on to the next entry) */
    uint64_t last_rx_ms;         /* when a result last arrived (or the connection came up) */
} db_conn;

struct db_pool {
    struct event_base *base;
    db_config cfg;
    char *dsn;
    pgparams params;      /* dsn with the failover defaults added (pgparams.h) */
    char *role;           /* "SET ROLE ..." or NULL */
    char timeout_sql[64]; /* "SET statement_timeout = ..." */
    db_conn *conns;
    db_job *qhead, *qtail; /* waiting for a connection */
    size_t nqueued;
    db_job *done_head, *done_tail; /* failed jobs whose callbacks are pending */
    struct event *ev_done;
    struct event *ev_tick;
    uint64_t reconnects;
    uint64_t failures;
    bool destroying;
    /* heartbeat: stalled while jobs are in flight and no connection has received anything
     * for stall_ms (idle connections are pinged every heartbeat_ms, so a live server always
     * has something to answer) */
    bool stalled;
    uint64_t last_rx_ms;
    uint64_t stalls;
    uint64_t queue_timeouts; /* jobs failed waiting queue_timeout_ms for a connection */
};

/* Backend process ids of every pool connection of this process (0: free slot), so that a
 * change notification sent by one of them can be told apart (see db_is_own_backend). */
#define OWN_PIDS 512
static _Atomic int own_pids[OWN_PIDS];

static void own_pid_add(int pid)
{
    for (int i = 0; pid > 0 && i < OWN_PIDS; i++) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&own_pids[i], &expect, pid))
            return;
    }
}

static void own_pid_remove(int pid)
{
    for (int i = 0; pid > 0 && i < OWN_PIDS; i++) {
        int expect = pid;
        if (atomic_compare_exchange_strong(&own_pids[i], &expect, 0))
            return;
    }
}

bool db_is_own_backend(int pid)
{
    for (int i = 0; pid > 0 && i < OWN_PIDS; i++)
        if (atomic_load_explicit(&own_pids[i], memory_order_relaxed) == pid)
            return true;
    return false;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Whether at least span ms lie between t and now. t may be later than now: a tick reads the
 * clock once, then sends pings stamped with a later reading (unsigned now - t would wrap). */
static bool elapsed(uint64_t now, uint64_t t, uint64_t span)
{
    return now >= t && now - t >= span;
}

static void emit(db_pool *p, int level, const char *fmt, ...)
{
    if (!p->cfg.on_event)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    /* libpq messages end with a newline; logs want one line */
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    p->cfg.on_event(p->cfg.ud, level, buf);
}

/* Allocates a job with room for n queries and their results. */
static db_job *job_alloc(int n)
{
    db_job *j = calloc(1, sizeof(*j) + (size_t)n * (sizeof(db_job_query) + sizeof(PGresult *)));
    if (!j)
        return NULL;
    j->q = (db_job_query *)(void *)(j + 1);
    j->res = (PGresult **)(void *)(j->q + n);
    return j;
}

static void job_free(db_job *j)
{
    if (!j)
        return;
    for (int i = 0; i < j->nq; i++)
        PQclear(j->res[i]);
    free(j->errmsg);
    free(j->detail);
    free(j->blob);
    free(j->fence_many);
    free(j);
}

static void job_set_error(db_job *j, const char *sqlstate, const char *msg, const char *detail)
{
    if (j->failed)
        return;
    j->failed = true;
    snprintf(j->sqlstate, sizeof(j->sqlstate), "%s", sqlstate ? sqlstate : "");
    j->errmsg = strdup(msg ? msg : "unknown error");
    j->detail = detail ? strdup(detail) : NULL;
}

/* Delivers a finished job to its callback and frees it. */
static void job_complete(db_job *j, db_status st)
{
    db_result r = {0};
    char msg[512];
    r.status = st;
    if (st == DB_OK) {
        r.res = j->res;
        r.nres = j->nq;
        /* the set-up queries (RLS, lock_timeout), when present, are hidden from the caller */
        r.res = j->res + j->hidden;
        r.nres = j->nq - j->hidden - j->trailing;
    } else {
        snprintf(msg, sizeof(msg), "%s", j->errmsg ? j->errmsg : "database unavailable");
        size_t n = strlen(msg);
        while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
            msg[--n] = '\0';
        r.message = msg;
        r.sqlstate = j->sqlstate;
        r.detail = j->detail;
    }
    if (j->cb)
        j->cb(j->arg, &r);
    job_free(j);
}

/* Queues a job for a deferred DB_UNAVAILABLE callback (never called back synchronously). */
static void job_defer_fail(db_pool *p, db_job *j, const char *why)
{
    if (!j->failed) {
        j->failed = true;
        j->errmsg = strdup(why);
    }
    j->next = NULL;
    if (p->done_tail)
        p->done_tail->next = j;
    else
        p->done_head = j;
    p->done_tail = j;
    p->failures++;
    event_active(p->ev_done, 0, 0);
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
    db_pool *p = arg;
    db_job *j = p->done_head;
    p->done_head = p->done_tail = NULL;
    while (j) {
        db_job *next = j->next;
        if (j->internal_done)
            job_free(j);
        else
            job_complete(j, DB_UNAVAILABLE);
        j = next;
    }
}

static void conn_schedule_retry(db_conn *c);
static void conn_start(db_conn *c);
static void dispatch(db_pool *p);

/* Closes c, fails everything in flight on it, and schedules a reconnect. */
static void conn_fail(db_conn *c, const char *why)
{
    db_pool *p = c->pool;
    if ((c->state == C_READY || c->state == C_SETUP) && !p->destroying)
        emit(p, 2, "database connection lost: %s", why);
    db_job *j = c->head;
    c->head = c->tail = NULL;
    c->ninflight = 0;
    while (j) {
        db_job *next = j->next;
        job_defer_fail(p, j, why);
        j = next;
    }
    if (c->ev_io) {
        event_free(c->ev_io);
        c->ev_io = NULL;
    }
    if (c->pg) {
        own_pid_remove(PQbackendPID(c->pg));
        PQfinish(c->pg);
        c->pg = NULL;
    }
    c->state = C_DOWN;
    c->want_write = false;
    if (!p->destroying)
        conn_schedule_retry(c);
}

static void conn_update_io(db_conn *c, bool want_write)
{
    if (c->want_write == want_write && event_pending(c->ev_io, EV_READ, NULL))
        return;
    event_del(c->ev_io);
    event_assign(c->ev_io, c->pool->base, PQsocket(c->pg),
                 EV_READ | EV_PERSIST | (want_write ? EV_WRITE : 0), event_get_callback(c->ev_io),
                 c);
    event_add(c->ev_io, NULL);
    c->want_write = want_write;
}

/* Flushes libpq's output buffer; waits for writability when the socket is full. */
static bool conn_flush(db_conn *c)
{
    int r = PQflush(c->pg);
    if (r < 0) {
        conn_fail(c, PQerrorMessage(c->pg));
        return false;
    }
    conn_update_io(c, r == 1);
    return true;
}

/* Sends the queries of j and a sync; appends j to the in-flight list. Returns false when
 * the connection failed (j is then not owned by c: the caller still owns it). */
static bool conn_send(db_conn *c, db_job *j)
{
    for (int i = 0; i < j->nq; i++) {
        db_job_query *q = &j->q[i];
        int ok;
        switch (q->kind) {
        case Q_EXEC_PREPARED:
            ok = PQsendQueryPrepared(c->pg, q->stmt, q->nparams, q->values, q->lengths, q->formats,
                                     q->result_format);
            break;
        case Q_EXEC_RAW:
            ok = PQsendQueryParams(c->pg, q->sql, 0, NULL, NULL, NULL, NULL, 0);
            break;
        case Q_END_TX:
            ok = PQpipelineSync(c->pg) &&
                 PQsendQueryParams(c->pg, "COMMIT", 0, NULL, NULL, NULL, NULL, 0);
            break;
        default:
            ok = PQsendPrepare(c->pg, q->stmt, q->sql, q->nparams, NULL);
            break;
        }
        if (!ok)
            return false;
    }
    if (!PQpipelineSync(c->pg))
        return false;
    j->sent_ms = now_ms();
    j->cur = 0;
    j->got_cur = false;
    j->next = NULL;
    if (c->tail)
        c->tail->next = j;
    else
        c->head = j;
    c->tail = j;
    c->ninflight++;
    return true;
}

static void setup_done(db_conn *c, db_job *j)
{
    db_pool *p = c->pool;
    if (j->failed) {
        emit(p, 3, "database session set-up failed: %s", j->errmsg ? j->errmsg : "?");
        job_free(j);
        conn_fail(c, "session set-up failed");
        return;
    }
    job_free(j);
    c->state = C_READY;
    c->backoff_ms = 0;
    c->last_rx_ms = now_ms();
    if (c->ever_ready)
        p->reconnects++;
    emit(p, 1, "database connection %s", c->ever_ready ? "re-established" : "ready");
    c->ever_ready = true;
    dispatch(p);
}

/* Processes every result libpq has buffered. */
static void conn_read_results(db_conn *c)
{
    while (c->state == C_READY || c->state == C_SETUP) {
        db_job *j = c->head;
        if (!j)
            break;
        if (PQisBusy(c->pg))
            break;
        PGresult *r = PQgetResult(c->pg);
        c->last_rx_ms = c->pool->last_rx_ms = now_ms();
        if (c->pool->stalled) {
            c->pool->stalled = false;
            emit(c->pool, 1, "database answering again");
        }
        if (j->cur < j->nq) {
            if (r == NULL) {
                j->cur++;
                j->got_cur = false;
                continue;
            }
            ExecStatusType st = PQresultStatus(r);
            if (st == PGRES_PIPELINE_SYNC && j->cur == j->nq - 1 && j->q[j->cur].kind == Q_END_TX &&
                !j->mid_sync) {
                /* the sync before Q_END_TX */
                j->mid_sync = true;
                PQclear(r);
                continue;
            }
            if (st == PGRES_FATAL_ERROR) {
                job_set_error(j, PQresultErrorField(r, PG_DIAG_SQLSTATE),
                              PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY),
                              PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL));
                PQclear(r);
            } else if (st == PGRES_PIPELINE_ABORTED || j->got_cur) {
                PQclear(r);
            } else {
                j->res[j->cur] = r;
                j->got_cur = true;
            }
            continue;
        }
        /* every query answered: the next result is the sync */
        if (r == NULL)
            continue;
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_FATAL_ERROR) {
            /* the implicit transaction failed at its commit, which the sync runs (a deferred
             * constraint, a lock the commit takes): the job failed and changed nothing; the
             * connection is sound, and the sync follows */
            job_set_error(j, PQresultErrorField(r, PG_DIAG_SQLSTATE),
                          PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY),
                          PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL));
            PQclear(r);
            continue;
        }
        PQclear(r);
        if (st != PGRES_PIPELINE_SYNC) {
            conn_fail(c, "unexpected result order on database connection");
            return;
        }
        c->head = j->next;
        if (!c->head)
            c->tail = NULL;
        c->ninflight--;
        if (j->internal_done) {
            j->internal_done(c, j);
        } else if (j->failed && strcmp(j->sqlstate, "25006") == 0) {
            /* read_only_sql_transaction: this server takes no writes (a standby, a demoted
             * primary): the job is unavailable, and a new connection finds the primary
             * (target_session_attrs=read-write in the DSN) */
            c->pool->failures++;
            job_complete(j, DB_UNAVAILABLE);
            conn_fail(c, "database is read-only (not the primary); reconnecting");
            return;
        } else {
            job_complete(j, j->failed ? DB_ERROR : DB_OK);
        }
    }
}

static void on_io(evutil_socket_t fd, short what, void *arg);

static void conn_begin_setup(db_conn *c)
{
    db_pool *p = c->pool;
    if (PQsetnonblocking(c->pg, 1) != 0 || PQenterPipelineMode(c->pg) != 1) {
        conn_fail(c, "cannot enter pipeline mode");
        return;
    }
    db_job *j = job_alloc(5 + (int)p->cfg.nstmts);
    if (!j) {
        conn_fail(c, "out of memory");
        return;
    }
    j->internal_done = setup_done;
    j->q[j->nq++] = (db_job_query){.kind = Q_EXEC_RAW, .sql = "SET client_min_messages = warning"};
    /* PostgreSQL cancels a statement we have given up on */
    j->q[j->nq++] = (db_job_query){.kind = Q_EXEC_RAW, .sql = p->timeout_sql};
    if (p->role)
        j->q[j->nq++] = (db_job_query){.kind = Q_EXEC_RAW, .sql = p->role};
    j->q[j->nq++] = (db_job_query){.kind = Q_PREPARE,
                                   .stmt = "__rls",
                                   .sql = "SELECT set_config('engram.tenant_id', $1, true)",
                                   .nparams = 1};
    j->q[j->nq++] = (db_job_query){.kind = Q_PREPARE,
                                   .stmt = "__lockwait",
                                   .sql = "SELECT set_config('lock_timeout', $1, true)",
                                   .nparams = 1};
    for (size_t i = 0; i < p->cfg.nstmts; i++) {
        const db_stmt_def *s = &p->cfg.stmts[i];
        j->q[j->nq++] = (db_job_query){
            .kind = Q_PREPARE, .stmt = s->name, .sql = s->sql, .nparams = s->nparams};
    }
    c->state = C_SETUP;
    if (!conn_send(c, j)) {
        job_free(j);
        conn_fail(c, PQerrorMessage(c->pg));
        return;
    }
    conn_flush(c);
}

/* Notices and the server's own messages outside a query (a backend that is terminated, or
 * whose postmaster died, says so before it closes the socket) go to the pool's log, not to
 * stderr as libpq's default processor would print them. */
static void on_notice(void *arg, const char *message)
{
    emit(arg, 1, "database says: %s", message);
}

static void conn_poll_connect(db_conn *c)
{
    PostgresPollingStatusType st = PQconnectPoll(c->pg);
    switch (st) {
    case PGRES_POLLING_OK:
        PQsetNoticeProcessor(c->pg, on_notice, c->pool);
        own_pid_add(PQbackendPID(c->pg));
        conn_begin_setup(c);
        return;
    case PGRES_POLLING_FAILED:
        if (c->pool->cfg.on_event && (!c->ever_ready || c->backoff_ms == 0))
            emit(c->pool, 2, "database connection failed: %s", PQerrorMessage(c->pg));
        conn_fail(c, PQerrorMessage(c->pg));
        return;
    default:
        /* a multi-host DSN moved on to its next host: that host gets its own time (on_tick) */
        if (PQhost(c->pg) != c->attempt_host || PQport(c->pg) != c->attempt_port) {
            c->attempt_host = PQhost(c->pg);
            c->attempt_port = PQport(c->pg);
            c->connect_started_ms = now_ms();
        }
        /* the socket may change between attempts (several hosts, IPv4/IPv6) */
        event_del(c->ev_io);
        event_assign(c->ev_io, c->pool->base, PQsocket(c->pg),
                     (st == PGRES_POLLING_WRITING ? EV_WRITE : EV_READ), on_io, c);
        event_add(c->ev_io, NULL);
        return;
    }
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
    db_conn *c = arg;
    if (c->state == C_CONNECTING) {
        conn_poll_connect(c);
        return;
    }
    if (what & EV_WRITE) {
        if (!conn_flush(c))
            return;
    }
    if (what & EV_READ) {
        if (!PQconsumeInput(c->pg)) {
            conn_fail(c, PQerrorMessage(c->pg));
            return;
        }
        conn_read_results(c);
        if (c->state == C_DOWN)
            return;
        if (PQstatus(c->pg) == CONNECTION_BAD) {
            conn_fail(c, PQerrorMessage(c->pg));
            return;
        }
        /* notices and stray notifications are simply dropped here */
        PGnotify *n;
        while ((n = PQnotifies(c->pg)) != NULL)
            PQfreemem(n);
    }
}

static void conn_start(db_conn *c)
{
    db_pool *p = c->pool;
    c->pg = p->params.keys ? PQconnectStartParams(p->params.keys, p->params.vals, 0)
                           : PQconnectStart(p->dsn);
    if (!c->pg) {
        conn_schedule_retry(c);
        return;
    }
    if (PQstatus(c->pg) == CONNECTION_BAD) {
        emit(p, 2, "database connection failed: %s", PQerrorMessage(c->pg));
        PQfinish(c->pg);
        c->pg = NULL;
        conn_schedule_retry(c);
        return;
    }
    c->state = C_CONNECTING;
    c->connect_started_ms = now_ms();
    c->attempt_host = PQhost(c->pg);
    c->attempt_port = PQport(c->pg);
    c->ev_io = event_new(p->base, PQsocket(c->pg), EV_WRITE, on_io, c);
    if (!c->ev_io) {
        conn_fail(c, "out of memory");
        return;
    }
    event_add(c->ev_io, NULL);
    c->want_write = false;
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    conn_start(arg);
}

static void conn_schedule_retry(db_conn *c)
{
    db_pool *p = c->pool;
    unsigned d = c->backoff_ms ? c->backoff_ms * 2 : p->cfg.backoff_min_ms;
    if (d > p->cfg.backoff_max_ms)
        d = p->cfg.backoff_max_ms;
    c->backoff_ms = d;
    struct timeval tv = {.tv_sec = d / 1000, .tv_usec = (d % 1000) * 1000};
    evtimer_add(c->ev_retry, &tv);
}

/* Moves waiting jobs onto ready connections with room. */
static void dispatch(db_pool *p)
{
    while (p->qhead) {
        db_conn *best = NULL;
        for (unsigned i = 0; i < p->cfg.connections; i++) {
            db_conn *c = &p->conns[i];
            if (c->state != C_READY || c->ninflight >= p->cfg.max_inflight)
                continue;
            if (!best || c->ninflight < best->ninflight)
                best = c;
        }
        if (!best)
            return;
        db_job *j = p->qhead;
        p->qhead = j->next;
        if (!p->qhead)
            p->qtail = NULL;
        p->nqueued--;
        if (!conn_send(best, j)) {
            /* put it back at the front and drop the connection */
            j->next = p->qhead;
            p->qhead = j;
            if (!p->qtail)
                p->qtail = j;
            p->nqueued++;
            conn_fail(best, PQerrorMessage(best->pg));
            continue;
        }
        if (!conn_flush(best))
            continue;
    }
}

static void ping_done(db_conn *c, db_job *j)
{
    job_free(j);
}

/* heartbeat pings idle ready connections whose last answer is heartbeat_ms old, and
 * declares the database stalled when jobs are in flight and nothing at all arrived on any
 * connection for stall_ms: a hung server (stopped, swapping, its disk gone) then fails
 * requests with DB_UNAVAILABLE in seconds rather than at the statement timeout. */
static void heartbeat(db_pool *p, uint64_t now)
{
    bool inflight = false;
    for (unsigned i = 0; i < p->cfg.connections; i++) {
        db_conn *c = &p->conns[i];
        if (c->state != C_READY)
            continue;
        if (c->head) {
            inflight = true;
            continue;
        }
        if (!elapsed(now, c->last_rx_ms, p->cfg.heartbeat_ms))
            continue;
        db_job *j = job_alloc(1);
        if (!j)
            continue;
        j->internal_done = ping_done;
        j->q[j->nq++] = (db_job_query){.kind = Q_EXEC_RAW, .sql = "SELECT 1"};
        if (!conn_send(c, j)) {
            job_free(j);
            conn_fail(c, PQerrorMessage(c->pg));
            continue;
        }
        c->last_rx_ms = now; /* measured from the ping on */
        conn_flush(c);
        inflight = true;
    }
    uint64_t quiet = now >= p->last_rx_ms ? now - p->last_rx_ms : 0;
    if (!inflight || quiet < p->cfg.stall_ms || p->stalled)
        return;
    bool oldest_waits = false;
    for (unsigned i = 0; i < p->cfg.connections; i++) {
        db_conn *c = &p->conns[i];
        if (c->state == C_READY && c->head && elapsed(now, c->head->sent_ms, p->cfg.stall_ms))
            oldest_waits = true;
    }
    if (!oldest_waits)
        return;
    p->stalled = true;
    p->stalls++;
    emit(p, 2, "database not responding: no answer for %llu ms; failing its requests",
         (unsigned long long)quiet);
    /* what is in flight fails now (a write may or may not have committed: unavailable), the
     * connections reconnect, and what waits for one fails below */
    for (unsigned i = 0; i < p->cfg.connections; i++) {
        db_conn *c = &p->conns[i];
        if ((c->state == C_READY || c->state == C_SETUP) && c->head)
            conn_fail(c, "database not responding");
    }
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    db_pool *p = arg;
    uint64_t now = now_ms();
    heartbeat(p, now);
    /* jobs that waited too long for a connection */
    db_job **pp = &p->qhead;
    db_job *last = NULL;
    while (*pp) {
        db_job *j = *pp;
        if (p->stalled || elapsed(now, j->queued_ms, p->cfg.queue_timeout_ms)) {
            *pp = j->next;
            p->nqueued--;
            if (!p->stalled)
                p->queue_timeouts++;
            job_defer_fail(p, j,
                           p->stalled ? "database not responding"
                                      : "database unavailable: no connection");
        } else {
            last = j;
            pp = &j->next;
        }
    }
    p->qtail = last;
    /* connections whose oldest job has run too long are presumed stuck */
    for (unsigned i = 0; i < p->cfg.connections; i++) {
        db_conn *c = &p->conns[i];
        if ((c->state == C_READY || c->state == C_SETUP) && c->head &&
            elapsed(now, c->head->sent_ms, (uint64_t)p->cfg.query_timeout_ms + 1000))
            conn_fail(c, "database did not answer in time");
        /* a server that accepts the socket but never answers must not hold us forever (each
         * host of a multi-host DSN gets this long: conn_poll_connect restarts the clock) */
        else if (c->state == C_CONNECTING &&
                 elapsed(now, c->connect_started_ms, (uint64_t)p->cfg.queue_timeout_ms + 1000))
            conn_fail(c, "database connection attempt timed out");
    }
}

db_pool *db_pool_create(struct event_base *base, const db_config *cfg)
{
    if (!base || !cfg || !cfg->dsn || cfg->connections == 0 || cfg->max_inflight == 0)
        return NULL;
    db_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->base = base;
    p->cfg = *cfg;
    if (!p->cfg.backoff_min_ms)
        p->cfg.backoff_min_ms = 100;
    if (p->cfg.backoff_max_ms < p->cfg.backoff_min_ms)
        p->cfg.backoff_max_ms = p->cfg.backoff_min_ms;
    if (!p->cfg.queue_timeout_ms)
        p->cfg.queue_timeout_ms = 2000;
    if (!p->cfg.query_timeout_ms)
        p->cfg.query_timeout_ms = 10000;
    if (!p->cfg.max_queue)
        p->cfg.max_queue = 100000;
    if (!p->cfg.heartbeat_ms)
        p->cfg.heartbeat_ms = 1000;
    if (!p->cfg.stall_ms)
        p->cfg.stall_ms = 3000;
    p->last_rx_ms = now_ms();
    snprintf(p->timeout_sql, sizeof(p->timeout_sql), "SET statement_timeout = %u",
             p->cfg.query_timeout_ms);
    p->dsn = strdup(cfg->dsn);
    if (!p->dsn)
        goto fail;
    char perr[256];
    int prc = pgparams_init(&p->params, cfg->dsn, p->cfg.queue_timeout_ms, perr, sizeof(perr));
    if (prc == -ENOMEM)
        goto fail;
    /* a DSN that does not parse is tried as it is: the connection attempts report why */
    if (cfg->role) {
        /* quote the role as an identifier; it comes from our configuration */
        size_t n = strlen(cfg->role);
        p->role = malloc(n * 2 + 16);
        if (!p->role)
            goto fail;
        char *o = p->role + sprintf(p->role, "SET ROLE \"");
        for (size_t i = 0; i < n; i++) {
            if (cfg->role[i] == '"')
                *o++ = '"';
            *o++ = cfg->role[i];
        }
        *o++ = '"';
        *o = '\0';
    }
    p->conns = calloc(cfg->connections, sizeof(*p->conns));
    p->ev_done = event_new(base, -1, 0, on_done, p);
    p->ev_tick = event_new(base, -1, EV_PERSIST, on_tick, p);
    if (!p->conns || !p->ev_done || !p->ev_tick)
        goto fail;
    struct timeval tick = {.tv_sec = 0, .tv_usec = 100000};
    event_add(p->ev_tick, &tick);
    for (unsigned i = 0; i < cfg->connections; i++) {
        db_conn *c = &p->conns[i];
        c->pool = p;
        c->ev_retry = evtimer_new(base, on_retry, c);
        if (!c->ev_retry)
            goto fail;
    }
    for (unsigned i = 0; i < cfg->connections; i++)
        conn_start(&p->conns[i]);
    return p;
fail:
    db_pool_destroy(p);
    return NULL;
}

void db_pool_destroy(db_pool *p)
{
    if (!p)
        return;
    p->destroying = true;
    if (p->conns) {
        for (unsigned i = 0; i < p->cfg.connections; i++) {
            db_conn *c = &p->conns[i];
            if (c->state != C_DOWN || c->pg)
                conn_fail(c, "shutting down");
            if (c->ev_retry)
                event_free(c->ev_retry);
        }
    }
    while (p->qhead) {
        db_job *j = p->qhead;
        p->qhead = j->next;
        job_defer_fail(p, j, "shutting down");
    }
    /* deliver the failures now: the loop may never run again */
    if (p->ev_done)
        on_done(-1, 0, p);
    if (p->ev_done)
        event_free(p->ev_done);
    if (p->ev_tick)
        event_free(p->ev_tick);
    free(p->conns);
    free(p->role);
    pgparams_fini(&p->params);
    free(p->dsn);
    free(p);
}

/* Builds the job for nq caller queries (after the RLS query when o->rls_tenant >= 0 and the
 * lock_timeout query when o->lock_timeout_ms > 0, and before that timeout's reset), copying
 * every parameter into one allocation owned by the job. Returns NULL when out of memory. */
static db_job *job_build(const db_pool *p, const db_opts *o, const db_query *qs, int nq)
{
    static const int text_fmt[1] = {0};
    static const char *const no_wait[1] = {"0"};
    /* Citus: BEGIN, SET LOCAL (the coordinator passes it on to the workers only inside a
     * transaction block), the split fence (citusmove.h), the queries, a sync, COMMIT; for
     * several tenants (o->tenants) BEGIN, their fence, the queries, a sync, COMMIT */
    bool many = o->ntenants > 0 && p->cfg.rls_set_local;
    bool block = (o->rls_tenant >= 0 || many) && p->cfg.rls_set_local;
    int base = (o->rls_tenant >= 0 ? 1 : 0) + (o->lock_timeout_ms > 0 ? 1 : 0) + 2 * block;
    int trailing = (o->lock_timeout_ms > 0 ? 1 : 0) + block;
    db_job *j = job_alloc(base + nq + trailing);
    db_query copy[DB_MAX_QUERIES];
    if (!j || db_query_copy(qs, nq, copy, &j->blob) < 0) {
        free(j);
        return NULL;
    }
    int k = 0;
    if (many) {
        char *ids = malloc((size_t)o->ntenants * 21 + 1), *sql = NULL;
        size_t n = 0;
        for (int i = 0; ids && i < o->ntenants; i++)
            n += (size_t)sprintf(ids + n, "%s%lld", i ? "," : "", (long long)o->tenants[i]);
        if (ids) {
            size_t len = strlen(CMOVE_FENCE_MANY_SQL_FMT) + 16 + n;
            if ((sql = malloc(len)) != NULL)
                snprintf(sql, len, CMOVE_FENCE_MANY_SQL_FMT, CMOVE_FENCE_CLASS, ids);
        }
        free(ids);
        if (!sql) {
            job_free(j);
            return NULL;
        }
        j->fence_many = sql;
        j->q[k++] = (db_job_query){.kind = Q_EXEC_RAW, .sql = "BEGIN"};
        j->q[k++] = (db_job_query){.kind = Q_EXEC_RAW, .sql = j->fence_many};
    } else if (block) {
        snprintf(j->rls, sizeof(j->rls), "SET LOCAL engram.tenant_id = '%lld'",
                 (long long)o->rls_tenant);
        snprintf(j->fence, sizeof(j->fence), CMOVE_FENCE_SQL_FMT, CMOVE_FENCE_CLASS,
                 (long long)o->rls_tenant);
        j->q[k++] = (db_job_query){.kind = Q_EXEC_RAW, .sql = "BEGIN"};
        j->q[k++] = (db_job_query){.kind = Q_EXEC_RAW, .sql = j->rls};
        j->q[k++] = (db_job_query){.kind = Q_EXEC_RAW, .sql = j->fence};
    } else if (o->rls_tenant >= 0) {
        snprintf(j->rls, sizeof(j->rls), "%lld", (long long)o->rls_tenant);
        j->rls_val[0] = j->rls;
        j->q[k++] = (db_job_query){.kind = Q_EXEC_PREPARED,
                                   .stmt = "__rls",
                                   .nparams = 1,
                                   .values = j->rls_val,
                                   .lengths = text_fmt,
                                   .formats = text_fmt};
    }
    if (o->lock_timeout_ms > 0) {
        snprintf(j->lockwait, sizeof(j->lockwait), "%u", o->lock_timeout_ms);
        j->lockwait_val[0] = j->lockwait;
        j->q[k++] = (db_job_query){.kind = Q_EXEC_PREPARED,
                                   .stmt = "__lockwait",
                                   .nparams = 1,
                                   .values = j->lockwait_val,
                                   .lengths = text_fmt,
                                   .formats = text_fmt};
    }
    j->hidden = base;
    for (int i = 0; i < nq; i++)
        j->q[base + i] = (db_job_query){.kind = Q_EXEC_PREPARED,
                                        .stmt = copy[i].stmt->name,
                                        .nparams = copy[i].stmt->nparams,
                                        .values = copy[i].values,
                                        .lengths = copy[i].lengths,
                                        .formats = copy[i].formats,
                                        .result_format = copy[i].result_format};
    j->nq = base + nq;
    if (o->lock_timeout_ms > 0) {
        /* the timeout is for the caller's statements (a tenant's row lock). The commit takes
         * locks of its own: a transaction that notifies takes one of the whole database and
         * holds it while its commit record is flushed, so under concurrent writers a commit
         * waits for others' fsyncs; under the statements' timeout (write_lock_probe_ms: 50)
         * such commits failed after every statement had succeeded */
        j->q[j->nq++] = (db_job_query){.kind = Q_EXEC_PREPARED,
                                       .stmt = "__lockwait",
                                       .nparams = 1,
                                       .values = no_wait,
                                       .lengths = text_fmt,
                                       .formats = text_fmt};
    }
    if (block)
        j->q[j->nq++] = (db_job_query){.kind = Q_END_TX};
    j->trailing = trailing;
    return j;
}

int db_submit(db_pool *p, int64_t rls_tenant, const db_query *qs, int nq, db_cb cb, void *arg)
{
    db_opts o = {.rls_tenant = rls_tenant};
    return db_submit_opts(p, &o, qs, nq, cb, arg);
}

int db_submit_opts(db_pool *p, const db_opts *o, const db_query *qs, int nq, db_cb cb, void *arg)
{
    if (!p || !qs || nq < 1 || nq > DB_MAX_QUERIES || p->destroying)
        return -EINVAL;
    if (o->ntenants < 0 || o->ntenants > DB_MAX_QUERIES || (o->ntenants > 0 && !o->tenants) ||
        (o->ntenants > 0 && (o->rls_tenant >= 0 || o->lock_timeout_ms > 0)))
        return -EINVAL;
    for (int i = 0; i < nq; i++) {
        const db_stmt_def *st = qs[i].stmt;
        if (!st || st->nparams < 0 || st->nparams > DB_MAX_PARAMS ||
            qs[i].nvalues != (size_t)st->nparams || (st->nparams > 0 && !qs[i].values))
            return -EINVAL;
        for (int k = 0; k < st->nparams; k++)
            if (qs[i].formats && qs[i].formats[k] == 1 && qs[i].values[k] &&
                (!qs[i].lengths || qs[i].lengths[k] < 0))
                return -EINVAL;
    }
    if (p->nqueued >= p->cfg.max_queue)
        return -EAGAIN;
    db_job *j = job_build(p, o, qs, nq);
    if (!j)
        return -ENOMEM;
    j->cb = cb;
    j->arg = arg;
    j->queued_ms = now_ms();
    if (p->stalled) {
        job_defer_fail(p, j, "database not responding");
        return 0;
    }
    if (p->qtail)
        p->qtail->next = j;
    else
        p->qhead = j;
    p->qtail = j;
    p->nqueued++;
    dispatch(p);
    return 0;
}

void db_pool_get_stats(db_pool *p, db_pool_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->connections = p->cfg.connections;
    for (unsigned i = 0; i < p->cfg.connections; i++) {
        if (p->conns[i].state == C_READY)
            st->ready++;
        st->inflight += p->conns[i].ninflight;
    }
    st->queued = p->nqueued;
    st->reconnects = p->reconnects;
    st->failures = p->failures;
    st->stalled = p->stalled;
    st->stalls = p->stalls;
    st->queue_timeouts = p->queue_timeouts;
    if (p->qhead) {
        uint64_t now = now_ms();
        st->oldest_wait_ms = now > p->qhead->queued_ms ? now - p->qhead->queued_ms : 0;
    }
}

bool db_pool_idle(db_pool *p)
{
    if (p->nqueued || p->done_head)
        return false;
    for (unsigned i = 0; i < p->cfg.connections; i++)
        if (p->conns[i].state == C_READY && p->conns[i].ninflight)
            return false;
    return true;
}
