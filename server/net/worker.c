/* server/net/worker.c: worker threads, their mailboxes and shutdown drain (see worker.h). */
#include "worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "access.h"
#include "idmap.h"
#include "climits.h"
#include "conn.h"
#include "embedder.h"
#include "gcommit.h"
#include "log.h"
#include "metrics.h"
#include "qadmit.h"
#include "sql.h"

typedef struct wmsg {
    struct wmsg *next;
    void (*fn)(void *arg);
    void *arg;
} wmsg;

struct worker {
    server *srv;
    unsigned idx;
    pthread_t th;
    bool started;
    struct event_base *base;
    db_pool *db;
    db_pool *rdb;       /* hot standbys (pg_read_dsn), NULL when none: see req_submit_read */
    db_pool *ldb;       /* the lane: two connections, one job each at a time, for writes
                         * that wait for a tenant's lock (worker_lane_db) */
    pthread_mutex_t mu; /* guards the mailbox */
    wmsg *mhead, *mtail;
    struct event *ev_mail;
    struct event *ev_tick;
    conn *conns;
    unsigned nconns;
    unsigned inflight;
    bool draining;
    uint64_t drain_deadline_ms;
    access_log *access;
    idmap *store_groups; /* see worker_store_groups */
    idmap *lanes;        /* see worker_lanes */
    qadmit *qadmit;      /* see worker_qadmit */
    /* when the last access-count write began (the worker's creation until then);
     * flushed_once false until the first, which goes at the first tick with counts, as for
     * a worker that wrote none for access_flush_ms. (last_flush_ms 0 for "never" held the
     * first write back on machines up for less than access_flush_ms: CLOCK_MONOTONIC starts
     * near 0 at boot.) */
    uint64_t last_flush_ms;
    bool flushed_once;
    bool flushing;
};

#define ACCESS_MAX_PENDING 1000000

static uint64_t mono_ms(void)
{
    return server_mono_ns() / 1000000u;
}

static void on_db_event(void *ud, int level, const char *msg)
{
    worker *w = ud;
    switch (level) {
    case 0:
        log_debug("worker %u: %s", w->idx, msg);
        break;
    case 1:
        log_info("worker %u: %s", w->idx, msg);
        break;
    case 2:
        log_warn("worker %u: %s", w->idx, msg);
        break;
    default:
        log_error("worker %u: %s", w->idx, msg);
        break;
    }
}

/* The standby pool's events, told apart from the primary's in the log. */
static void on_rdb_event(void *ud, int level, const char *msg)
{
    char buf[600];
    snprintf(buf, sizeof(buf), "read replica: %s", msg);
    on_db_event(ud, level, buf);
}

static void on_mail(evutil_socket_t fd, short what, void *arg)
{
    worker *w = arg;
    pthread_mutex_lock(&w->mu);
    wmsg *m = w->mhead;
    w->mhead = w->mtail = NULL;
    pthread_mutex_unlock(&w->mu);
    while (m) {
        wmsg *next = m->next;
        m->fn(m->arg);
        free(m);
        m = next;
    }
}

typedef struct flush_ctx {
    worker *w;
    access_entry *e;
    size_t n;
} flush_ctx;

static void on_flushed(void *arg, const db_result *res)
{
    flush_ctx *fc = arg;
    worker *w = fc->w;
    w->flushing = false;
    if (res->status != DB_OK) {
        /* keep them for the next attempt, unless the backlog has grown absurd */
        if (access_log_count(w->access) + fc->n < ACCESS_MAX_PENDING &&
            access_log_merge(w->access, fc->e, fc->n) == 0)
            log_debug("worker %u: access counts not written yet: %s", w->idx,
                      res->message ? res->message : "?");
        else
            log_warn("worker %u: dropped %zu access counts: %s", w->idx, fc->n,
                     res->message ? res->message : "?");
    }
    free(fc->e);
    free(fc);
}

/* PostgreSQL's binary form of a one-dimensional bigint[] without NULLs (array_send): a header
 * of ndim, flags, element type, length and lower bound, then each element as a length and
 * its eight bytes, all in network order. */
#define INT8_ARRAY_OID 20u
#define BIN_ARRAY_HEAD 20u
#define BIN_ARRAY_ELEM 12u

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Writes the n values got(e[i]) as a binary bigint[] into a malloc'd buffer (*len its size;
 * the caller frees it), or returns NULL when out of memory. Binary, not a text literal: a
 * worker writes thousands of entries a second, and formatting and parsing them as decimal
 * held its event loop for milliseconds. */
static char *bin_array(size_t n, int64_t (*get)(const access_entry *e), const access_entry *e,
                       int *len)
{
    size_t bytes = BIN_ARRAY_HEAD + n * BIN_ARRAY_ELEM;
    if (n > INT32_MAX / BIN_ARRAY_ELEM - 1)
        return NULL;
    unsigned char *b = malloc(bytes);
    if (!b)
        return NULL;
    put_be32(b, 1);     /* ndim */
    put_be32(b + 4, 0); /* no NULLs */
    put_be32(b + 8, INT8_ARRAY_OID);
    put_be32(b + 12, (uint32_t)n);
    put_be32(b + 16, 1); /* lower bound */
    unsigned char *p = b + BIN_ARRAY_HEAD;
    for (size_t i = 0; i < n; i++, p += BIN_ARRAY_ELEM) {
        uint64_t v = (uint64_t)get(&e[i]);
        put_be32(p, 8);
        put_be32(p + 4, (uint32_t)(v >> 32));
        put_be32(p + 8, (uint32_t)v);
    }
    *len = (int)bytes;
    return (char *)b;
}

static int64_t get_tenant(const access_entry *e)
{
    return e->tenant;
}
static int64_t get_id(const access_entry *e)
{
    return (int64_t)e->id;
}
static int64_t get_count(const access_entry *e)
{
    return (int64_t)e->count;
}
static int64_t get_ms(const access_entry *e)
{
    return e->last_ms;
}

/* Writes the pending access counts in one statement. */
static void flush_access(worker *w)
{
    if (w->flushing || access_log_count(w->access) == 0)
        return;
    flush_ctx *fc = calloc(1, sizeof(*fc));
    if (!fc || access_log_take(w->access, &fc->e, &fc->n) < 0) {
        free(fc);
        return;
    }
    fc->w = w;
    int lens[4] = {0}, fmts[4] = {1, 1, 1, 1};
    char *vals[4] = {
        bin_array(fc->n, get_tenant, fc->e, &lens[0]), bin_array(fc->n, get_id, fc->e, &lens[1]),
        bin_array(fc->n, get_count, fc->e, &lens[2]), bin_array(fc->n, get_ms, fc->e, &lens[3])};
    int rc = -ENOMEM;
    if (vals[0] && vals[1] && vals[2] && vals[3]) {
        db_query q = {.stmt = sql_def(SQL_MEMORY_TOUCH),
                      .nvalues = 4,
                      .values = (const char *const *)vals,
                      .lengths = lens,
                      .formats = fmts};
        rc = db_submit(w->db, -1, &q, 1, on_flushed, fc);
    }
    for (int i = 0; i < 4; i++)
        free(vals[i]);
    if (rc < 0) {
        access_log_merge(w->access, fc->e, fc->n);
        free(fc->e);
        free(fc);
        return;
    }
    w->flushing = true;
    w->flushed_once = true;
    w->last_flush_ms = mono_ms();
}

idmap *worker_store_groups(worker *w)
{
    return w->store_groups;
}

idmap *worker_lanes(worker *w)
{
    return w->lanes;
}

qadmit *worker_qadmit(worker *w)
{
    return w->qadmit;
}

access_log *worker_access(worker *w)
{
    return w->access;
}

static void finish_drain(worker *w)
{
    conn *c = w->conns;
    while (c) {
        conn *next = conn_next(c);
        conn_close(c);
        c = next;
    }
    event_base_loopexit(w->base, NULL);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    worker *w = arg;
    uint64_t now = mono_ms();
    for (conn *c = w->conns, *next; c; c = next) {
        next = conn_next(c);
        conn_tick(c, now);
    }
    if (!w->flushed_once || now - w->last_flush_ms >= (uint64_t)w->srv->cfg.access_flush_ms ||
        w->draining)
        flush_access(w);
    db_pool_stats st;
    if (w->qadmit)
        qadmit_tick(w->qadmit, w->draining);
    db_pool_get_stats(w->db, &st);
    /* a stalled database (connected, answering nothing) counts as no ready connection, so
     * /healthz and /readyz report it down within the pool's stall time */
    metrics_db_publish(w->idx, st.connections, st.stalled ? 0 : st.ready, st.queued, st.inflight,
                       st.reconnects, st.failures);
    {
        db_pool_stats ls;
        db_pool_get_stats(w->ldb, &ls);
        metrics_db_wait_publish(
            w->idx, st.oldest_wait_ms > ls.oldest_wait_ms ? st.oldest_wait_ms : ls.oldest_wait_ms,
            st.queue_timeouts + ls.queue_timeouts);
    }
    if (w->rdb) {
        db_pool_get_stats(w->rdb, &st);
        metrics_db_read_publish(w->idx, st.connections, st.stalled ? 0 : st.ready);
    }
    if (w->draining) {
        bool flushed = true;
        for (conn *c = w->conns; c; c = conn_next(c))
            if (conn_output_pending(c))
                flushed = false;
        /* the store group leaves once its stores ended and its changes were announced */
        bool db_done = !w->flushing && access_log_count(w->access) == 0 && db_pool_idle(w->db) &&
                       db_pool_idle(w->ldb) && (!w->rdb || db_pool_idle(w->rdb)) &&
                       idmap_count(w->store_groups) == 0;
        if ((w->inflight == 0 && flushed && db_done) || now >= w->drain_deadline_ms) {
            if (w->inflight)
                log_warn("worker %u: shutdown timeout with %u requests in flight", w->idx,
                         w->inflight);
            finish_drain(w);
        }
    }
}

worker *worker_create(server *s, unsigned idx)
{
    worker *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->srv = s;
    w->idx = idx;
    pthread_mutex_init(&w->mu, NULL);
    w->last_flush_ms = mono_ms();
    w->access = access_log_create();
    w->store_groups = idmap_create(16);
    w->lanes = idmap_create(16);
    if (!w->access || !w->store_groups || !w->lanes) {
        access_log_destroy(w->access);
        idmap_destroy(w->store_groups);
        idmap_destroy(w->lanes);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    w->base = event_base_new();
    if (!w->base)
        goto fail;
    w->ev_mail = event_new(w->base, -1, EV_PERSIST, on_mail, w);
    w->ev_tick = event_new(w->base, -1, EV_PERSIST, on_tick, w);
    if (!w->ev_mail || !w->ev_tick)
        goto fail;
    event_add(w->ev_mail, NULL);
    struct timeval tick = {.tv_sec = 0, .tv_usec = 100000};
    event_add(w->ev_tick, &tick);
    const config *cfg = &s->cfg;
    size_t nstmts;
    const db_stmt_def *stmts = sql_all(&nstmts);
    db_config dc = {
        .dsn = cfg->pg_dsn,
        .connections = (unsigned)cfg->pg_pool_size,
        .max_inflight = 128,
        .queue_timeout_ms = (unsigned)cfg->db_queue_timeout_ms,
        .query_timeout_ms = (unsigned)cfg->db_query_timeout_ms,
        .backoff_min_ms = 50,
        .backoff_max_ms = (unsigned)cfg->db_backoff_max_ms,
        .max_queue = 65536,
        .role = cfg->pg_role[0] ? cfg->pg_role : NULL,
        .stmts = stmts,
        .nstmts = nstmts,
        .on_event = on_db_event,
        .ud = w,
    };
    w->db = db_pool_create(w->base, &dc);
    if (!w->db)
        goto fail;
    /* the lane: what may wait (a tenant's lock held elsewhere, a large batch) waits here, not
     * in a pipeline other tenants' statements share */
    dc.connections = 2; /* a second tenant's wait never queues behind the first's */
    dc.max_inflight = 1;
    w->ldb = db_pool_create(w->base, &dc);
    if (!w->ldb)
        goto fail;
    dc.max_inflight = 128;
    if (cfg->pg_read_dsn[0]) {
        /* the same statements and role: a standby runs the read-only ones */
        dc.dsn = cfg->pg_read_dsn;
        dc.connections = (unsigned)cfg->pg_read_pool_size;
        dc.on_event = on_rdb_event;
        w->rdb = db_pool_create(w->base, &dc);
        if (!w->rdb)
            goto fail;
    }
    /* the holder of query blocks: this worker of this process, unique among the processes
     * sharing the database (host, pid and start time) */
    char host[64] = "", holder[160];
    gethostname(host, sizeof(host) - 1);
    snprintf(holder, sizeof(holder), "%s/%ld/%llu/%u", host, (long)getpid(),
             (unsigned long long)server_mono_ns(), idx);
    w->qadmit = qadmit_create(w->db, holder);
    if (!w->qadmit)
        goto fail;
    return w;
fail:
    db_pool_destroy(w->rdb);
    db_pool_destroy(w->ldb);
    db_pool_destroy(w->db);
    qadmit_destroy(w->qadmit);
    if (w->ev_mail)
        event_free(w->ev_mail);
    if (w->ev_tick)
        event_free(w->ev_tick);
    if (w->base)
        event_base_free(w->base);
    pthread_mutex_destroy(&w->mu);
    access_log_destroy(w->access);
    idmap_destroy(w->store_groups); /* empty: every store ended before the drain finished */
    idmap_destroy(w->lanes);
    free(w);
    return NULL;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    event_base_dispatch(w->base);
    return NULL;
}

int worker_start(worker *w)
{
    int rc = pthread_create(&w->th, NULL, worker_main, w);
    if (rc != 0)
        return -rc;
    w->started = true;
    return 0;
}

static void do_drain(void *arg)
{
    worker *w = arg;
    if (w->draining)
        return;
    w->draining = true;
    w->drain_deadline_ms = mono_ms() + (uint64_t)w->srv->cfg.shutdown_timeout_ms;
    for (conn *c = w->conns; c; c = conn_next(c))
        conn_stop_reading(c);
}

void worker_drain(worker *w)
{
    if (worker_post(w, do_drain, w) < 0)
        event_base_loopexit(w->base, NULL);
}

void worker_join(worker *w)
{
    if (w && w->started) {
        pthread_join(w->th, NULL);
        w->started = false;
    }
}

void worker_destroy(worker *w)
{
    if (!w)
        return;
    worker_join(w);
    /* finish what other threads posted before they stopped, then fail whatever still waits
     * on the database: the pool runs those callbacks as it is destroyed */
    on_mail(-1, 0, w);
    for (conn *c = w->conns, *next; c; c = next) {
        next = conn_next(c);
        conn_close(c);
    }
    db_pool_destroy(w->rdb);
    w->rdb = NULL;
    db_pool_destroy(w->ldb);
    w->ldb = NULL;
    db_pool_destroy(w->db); /* its failed reservations reach w->qadmit: destroyed after it */
    w->db = NULL;
    on_mail(-1, 0, w);
    qadmit_destroy(w->qadmit);
    gc_worker_fini(w->store_groups); /* a drain that timed out can leave announcements */
    embedder_worker_fini(w->idx);
    event_free(w->ev_mail);
    event_free(w->ev_tick);
    event_base_free(w->base);
    pthread_mutex_destroy(&w->mu);
    access_log_destroy(w->access);
    idmap_destroy(w->store_groups);
    req_lanes_fini(w->lanes); /* tenants marked blocked; their jobs ended with the pools */
    idmap_destroy(w->lanes);
    free(w);
}

int worker_post(worker *w, void (*fn)(void *arg), void *arg)
{
    wmsg *m = malloc(sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->fn = fn;
    m->arg = arg;
    m->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->mtail)
        w->mtail->next = m;
    else
        w->mhead = m;
    w->mtail = m;
    pthread_mutex_unlock(&w->mu);
    event_active(w->ev_mail, EV_READ, 0);
    return 0;
}

typedef struct adopt_msg {
    worker *w;
    int fd;
    uint64_t addr_key;
    bool http, reserved;
} adopt_msg;

/* Gives back the place of an accepted socket that never became a connection. */
static void unaccept(server *s, bool http, uint64_t addr_key)
{
    atomic_fetch_sub(http ? &s->nhttp : &s->nconns, 1);
    climits_addr_release(s->limits_cl, addr_key);
}

static void do_adopt(void *arg)
{
    adopt_msg *a = arg;
    if (a->w->draining) {
        close(a->fd);
        unaccept(a->w->srv, a->http, a->addr_key);
    } else if (!conn_create(a->w, a->fd, a->addr_key, a->http, a->reserved)) {
        log_warn("worker %u: cannot set up a connection (out of memory)", a->w->idx);
        unaccept(a->w->srv, a->http, a->addr_key);
    }
    free(a);
}

int worker_adopt(worker *w, int fd, uint64_t addr_key, bool http, bool reserved)
{
    adopt_msg *a = malloc(sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->w = w;
    a->fd = fd;
    a->addr_key = addr_key;
    a->http = http;
    a->reserved = reserved;
    int rc = worker_post(w, do_adopt, a);
    if (rc < 0)
        free(a);
    return rc;
}

void worker_accept(server *s, int fd, const struct sockaddr *addr, unsigned *next, bool http)
{
    uint64_t key;
    atomic_int *count = http ? &s->nhttp : &s->nconns;
    int limit = http ? s->cfg.http_max_connections : s->cfg.max_connections;
    int reserve = http ? HTTP_PROBE_RESERVE : s->cfg.admin_reserved_connections;
    int n = atomic_fetch_add(count, 1);
    if (n >= limit + reserve) {
        atomic_fetch_sub(count, 1);
        metrics_conn_refused();
        close(fd);
        return;
    }
    if (!climits_addr_take(s->limits_cl, addr, &key)) {
        /* one address holding its share: the others' slots stay free */
        atomic_fetch_sub(count, 1);
        metrics_conn_refused();
        close(fd);
        return;
    }
    worker *w = s->workers[(*next)++ % s->nworkers];
    if (worker_adopt(w, fd, key, http, n >= limit) < 0) {
        unaccept(s, http, key);
        close(fd);
    }
}

struct event_base *worker_base(worker *w)
{
    return w->base;
}

db_pool *worker_db(worker *w)
{
    return w->db;
}

db_pool *worker_lane_db(worker *w)
{
    return w->ldb;
}

db_pool *worker_read_db(worker *w)
{
    return w->rdb;
}

server *worker_server(worker *w)
{
    return w->srv;
}

unsigned worker_index(worker *w)
{
    return w->idx;
}

void worker_conn_added(worker *w, conn *c)
{
    conn_link(&w->conns, c);
    w->nconns++;
}

void worker_conn_removed(worker *w, conn *c)
{
    conn_unlink(&w->conns, c);
    w->nconns--;
}

void worker_req_started(worker *w)
{
    w->inflight++;
}

void worker_req_finished(worker *w)
{
    w->inflight--;
}

bool worker_draining(worker *w)
{
    return w->draining;
}
