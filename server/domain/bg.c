/* server/domain/bg.c: background job threads and the change listener (see bg.h). */
#include "bg.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bg_int.h"
#include "db.h"
#include "pgsync.h"
#include "log.h"

typedef struct job {
    struct job *next;
    void (*fn)(bg_ctx *ctx, void *arg);
    void *arg;
} job;

struct bg_ctx {
    bg *b;
    PGconn *pg;
    PGconn *rpg;           /* a hot standby (pg_read_dsn), see bg_read_conn */
    uint64_t rpg_retry_ms; /* when a failed standby connection may be tried again */
    unsigned idx;
};

typedef struct periodic {
    struct periodic *next;
    unsigned interval_ms;
    uint64_t due_ms;
    bool queued; /* a run is waiting or running: do not pile up runs of a slow task */
    void (*fn)(bg_ctx *ctx, void *arg);
    void *arg;
    bg *b;
} periodic;

/* Tells whether idle connection c was closed by its server while it sat unused: after a
 * failover the old primary's backends say FATAL and close, but libpq only learns it when it
 * next reads. Something readable on an idle connection is such news or a stray notice: one
 * round trip tells which. */
static bool closed_while_idle(PGconn *c)
{
    struct pollfd pfd = {.fd = PQsocket(c), .events = POLLIN};
    if (pfd.fd < 0)
        return true;
    if (poll(&pfd, 1, 0) <= 0)
        return false;
    PGresult *r = PQexec(c, "SELECT 1");
    bool ok = PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return !ok || PQstatus(c) != CONNECTION_OK;
}

PGconn *bg_conn(bg_ctx *ctx, char *err, size_t errlen)
{
    if (ctx->pg && (PQstatus(ctx->pg) != CONNECTION_OK || closed_while_idle(ctx->pg))) {
        PQfinish(ctx->pg);
        ctx->pg = NULL;
    }
    if (!ctx->pg) {
        const config *cfg = &ctx->b->srv->cfg;
        ctx->pg = pgsync_connect(cfg->pg_dsn, cfg->pg_role[0] ? cfg->pg_role : NULL,
                                 (unsigned)cfg->db_queue_timeout_ms, err, errlen);
        /* index loads and catch-ups read one tenant's rows in order: a parallel plan only
         * costs the database cores the workers need */
        PGresult *r = ctx->pg ? PQexec(ctx->pg, "SET max_parallel_workers_per_gather = 0") : NULL;
        PQclear(r);
    }
    return ctx->pg;
}

static uint64_t mono_ms(void);

PGconn *bg_read_conn(bg_ctx *ctx)
{
    const config *cfg = &ctx->b->srv->cfg;
    if (!cfg->pg_read_dsn[0])
        return NULL;
    if (ctx->rpg && PQstatus(ctx->rpg) != CONNECTION_OK) {
        PQfinish(ctx->rpg);
        ctx->rpg = NULL;
    }
    if (!ctx->rpg && mono_ms() >= ctx->rpg_retry_ms) {
        char err[256];
        ctx->rpg = pgsync_connect(cfg->pg_read_dsn, cfg->pg_role[0] ? cfg->pg_role : NULL,
                                  (unsigned)cfg->db_queue_timeout_ms, err, sizeof(err));
        if (!ctx->rpg) {
            /* loads go to the primary meanwhile; do not make each one wait for a dead host */
            ctx->rpg_retry_ms = mono_ms() + (uint64_t)cfg->db_backoff_max_ms;
            log_warn("read replica: index loads use the primary: %s", err);
        } else {
            PQclear(PQexec(ctx->rpg, "SET max_parallel_workers_per_gather = 0"));
        }
    }
    return ctx->rpg;
}

void bg_read_conn_failed(bg_ctx *ctx)
{
    PQfinish(ctx->rpg);
    ctx->rpg = NULL;
}

PGresult *bg_exec(bg_ctx *ctx, const db_stmt_def *s, const char *const *values, size_t nvalues,
                  const char *what)
{
    char err[512];
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    PGresult *r = pg ? pgsync_exec_stmt(pg, s, values, nvalues, err, sizeof(err)) : NULL;
    if (!r) {
        log_warn("%s: %s", what, err);
        if (pg && PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
    }
    return r;
}

void bg_conn_failed(bg_ctx *ctx)
{
    PQfinish(ctx->pg);
    ctx->pg = NULL;
}

int bg_cancelled(bg_ctx *ctx)
{
    pthread_mutex_lock(&ctx->b->mu);
    int s = ctx->b->stopping;
    pthread_mutex_unlock(&ctx->b->mu);
    return s;
}

static void *job_thread(void *arg)
{
    bg_ctx *ctx = arg;
    bg *b = ctx->b;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        while (!b->head && !b->stopping)
            pthread_cond_wait(&b->cv, &b->mu);
        job *j = b->head;
        if (j) {
            b->head = j->next;
            if (!b->head)
                b->tail = NULL;
        }
        pthread_mutex_unlock(&b->mu);
        if (!j)
            break; /* stopping and nothing left */
        j->fn(ctx, j->arg);
        free(j);
    }
    PQfinish(ctx->pg);
    ctx->pg = NULL;
    PQfinish(ctx->rpg);
    ctx->rpg = NULL;
    return NULL;
}

int bg_submit(bg *b, void (*fn)(bg_ctx *ctx, void *arg), void *arg)
{
    job *j = malloc(sizeof(*j));
    if (!j)
        return -ENOMEM;
    j->fn = fn;
    j->arg = arg;
    j->next = NULL;
    pthread_mutex_lock(&b->mu);
    if (b->stopping) {
        pthread_mutex_unlock(&b->mu);
        free(j);
        return -ESHUTDOWN;
    }
    if (b->tail)
        b->tail->next = j;
    else
        b->head = j;
    b->tail = j;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

int bg_listener_ok(bg *b)
{
    return atomic_load(&b->listener_ok);
}

static uint64_t mono_ms(void)
{
    return server_mono_ns() / 1000000u;
}

static void run_periodic(bg_ctx *ctx, void *arg)
{
    periodic *p = arg;
    if (!bg_cancelled(ctx))
        p->fn(ctx, p->arg);
    pthread_mutex_lock(&p->b->mu);
    p->queued = false;
    p->due_ms = mono_ms() + p->interval_ms;
    pthread_mutex_unlock(&p->b->mu);
}

int bg_every(bg *b, unsigned interval_ms, void (*fn)(bg_ctx *ctx, void *arg), void *arg)
{
    periodic *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->interval_ms = interval_ms ? interval_ms : 1;
    p->fn = fn;
    p->arg = arg;
    p->b = b;
    pthread_mutex_lock(&b->mu);
    p->due_ms = mono_ms() + p->interval_ms;
    p->next = b->periodics;
    b->periodics = p;
    pthread_mutex_unlock(&b->mu);
    return 0;
}

int bg_every_set(bg *b, void (*fn)(bg_ctx *ctx, void *arg), void *arg, unsigned interval_ms)
{
    int found = 0;
    pthread_mutex_lock(&b->mu);
    for (periodic *p = b->periodics; p; p = p->next) {
        if (p->fn != fn || p->arg != arg)
            continue;
        p->interval_ms = interval_ms ? interval_ms : 1;
        /* a shorter interval applies at once, not after the old, longer wait */
        uint64_t due = mono_ms() + p->interval_ms;
        if (!p->queued && due < p->due_ms)
            p->due_ms = due;
        found = 1;
    }
    pthread_mutex_unlock(&b->mu);
    return found ? 0 : -ENOENT;
}

/* Wakes every 100 ms and queues the periodic tasks that are due. */
static void *ticker_thread(void *arg)
{
    bg *b = arg;
    while (!bg_stopping(b)) {
        struct pollfd pfd = {.fd = b->wake[0], .events = POLLIN};
        poll(&pfd, 1, 100);
        uint64_t now = mono_ms();
        pthread_mutex_lock(&b->mu);
        periodic *due = NULL;
        for (periodic *p = b->periodics; p; p = p->next)
            if (!p->queued && now >= p->due_ms && !due)
                due = p;
        if (due)
            due->queued = true;
        pthread_mutex_unlock(&b->mu);
        if (due && bg_submit(b, run_periodic, due) < 0) {
            pthread_mutex_lock(&b->mu);
            due->queued = false;
            pthread_mutex_unlock(&b->mu);
        }
    }
    return NULL;
}

bool bg_stopping(bg *b)
{
    pthread_mutex_lock(&b->mu);
    bool s = b->stopping;
    pthread_mutex_unlock(&b->mu);
    return s;
}

bg *bg_create(server *s, unsigned nthreads)
{
    bg *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->srv = s;
    b->wake[0] = b->wake[1] = -1;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->threads = calloc(nthreads, sizeof(*b->threads));
    b->ctxs = calloc(nthreads, sizeof(*b->ctxs));
    if (!b->threads || !b->ctxs || pipe(b->wake) < 0)
        goto fail;
    for (unsigned i = 0; i < nthreads; i++) {
        b->ctxs[i].b = b;
        b->ctxs[i].idx = i;
        if (pthread_create(&b->threads[i], NULL, job_thread, &b->ctxs[i]) != 0)
            goto fail;
        b->nthreads++;
    }
    if (pthread_create(&b->listener, NULL, bg_listener_thread, b) != 0)
        goto fail;
    b->listener_started = true;
    if (pthread_create(&b->ticker, NULL, ticker_thread, b) != 0)
        goto fail;
    b->ticker_started = true;
    return b;
fail:
    bg_destroy(b);
    return NULL;
}

void bg_destroy(bg *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stopping = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    if (b->wake[1] >= 0) {
        ssize_t w = write(b->wake[1], "x", 1);
        (void)w;
    }
    for (unsigned i = 0; i < b->nthreads; i++)
        pthread_join(b->threads[i], NULL);
    if (b->listener_started)
        pthread_join(b->listener, NULL);
    if (b->ticker_started)
        pthread_join(b->ticker, NULL);
    while (b->periodics) {
        periodic *p = b->periodics;
        b->periodics = p->next;
        free(p);
    }
    /* jobs queued after the threads left (none can be: submit refuses once stopping) */
    if (b->wake[0] >= 0)
        close(b->wake[0]);
    if (b->wake[1] >= 0)
        close(b->wake[1]);
    free(b->threads);
    free(b->ctxs);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
