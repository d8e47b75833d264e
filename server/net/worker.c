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

#include "climits.h"
#include "conn.h"
#include "hooks.h"
#include "idmap.h"
#include "log.h"
#include "metrics.h"
#include "req.h"
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
    idmap *lanes; /* see worker_lanes */
    void *app;    /* what the hooks keep per worker (worker_app) */
    bool app_up;  /* hooks.worker_init ran: worker_fini runs */
};

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

idmap *worker_lanes(worker *w)
{
    return w->lanes;
}

void *worker_app(worker *w)
{
    return w->app;
}

void worker_set_app(worker *w, void *app)
{
    w->app = app;
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
    const net_hooks *h = w->srv->hooks;
    if (h && h->worker_tick && w->app_up)
        h->worker_tick(w, now, w->draining);
    db_pool_stats st;
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
        /* the hooks' work (writes of counts, store groups) ends before the pools go */
        bool db_done = db_pool_idle(w->db) && db_pool_idle(w->ldb) &&
                       (!w->rdb || db_pool_idle(w->rdb)) &&
                       (!h || !h->worker_idle || !w->app_up || h->worker_idle(w));
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
    w->lanes = idmap_create(16);
    if (!w->lanes) {
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
        .rls_set_local = s->on_citus,
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
    if (s->hooks && s->hooks->worker_init) {
        w->app_up = true; /* worker_fini runs whatever worker_init did */
        if (s->hooks->worker_init(w) < 0)
            goto fail;
    }
    return w;
fail:
    db_pool_destroy(w->rdb);
    db_pool_destroy(w->ldb);
    db_pool_destroy(w->db);
    if (w->app_up && s->hooks->worker_fini)
        s->hooks->worker_fini(w);
    if (w->ev_mail)
        event_free(w->ev_mail);
    if (w->ev_tick)
        event_free(w->ev_tick);
    if (w->base)
        event_base_free(w->base);
    pthread_mutex_destroy(&w->mu);
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
    db_pool_destroy(w->db); /* its callbacks reach the hooks' state: freed after it */
    w->db = NULL;
    on_mail(-1, 0, w);
    if (w->app_up && w->srv->hooks->worker_fini)
        w->srv->hooks->worker_fini(w);
    event_free(w->ev_mail);
    event_free(w->ev_tick);
    event_base_free(w->base);
    pthread_mutex_destroy(&w->mu);
    req_lanes_fini(w->lanes); /* tenants marked blocked; their jobs ended with the pools */
    idmap_destroy(w->lanes);
    free(w);
}

static int post_to(void *target, void (*fn)(void *arg), void *arg)
{
    return worker_post(target, fn, arg);
}

server_poster worker_poster(worker *w)
{
    return (server_poster){.post = post_to, .target = w};
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
