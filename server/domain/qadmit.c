/* server/domain/qadmit.c: query admission from reserved blocks of the daily quota (see
 * qadmit.h). */
#include "qadmit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idmap.h"
#include "memrow.h"
#include "metrics.h"
#include "rowerr.h"
#include "server.h"
#include "sql.h"

#define WANT_MIN 8
#define WANT_MAX 256
#define FORGET_MS (10 * QA_IDLE_MS)

typedef struct waiter {
    void *arg;
    qa_cb cb;
} waiter;

typedef struct qa_block {
    qadmit *q;
    int64_t tenant;
    int64_t avail;     /* held, not used */
    int64_t used;      /* used since the last report */
    int64_t want;      /* the next block's size */
    int64_t resets_ms; /* wall clock: the end of the block's day (0: none yet) */
    uint64_t got_ms;   /* monotonic: when the block was granted */
    uint64_t last_ms;  /* monotonic: last admission asked for */
    uint64_t retry_ms; /* monotonic: re-ask for the waiters then (0: not scheduled) */
    uint64_t wait_since_ms;
    bool busy;     /* a reservation job in flight */
    int64_t asked; /* what that job asked for */
    char limits[80];
    waiter *w; /* waiting, in arrival order */
    size_t nw, cw;
} qa_block;

struct qadmit {
    db_pool *db;
    char *holder;
    idmap *blocks; /* tenant -> qa_block */
    uint64_t reservations;
};

static uint64_t mono_ms(void)
{
    return server_mono_ns() / 1000000u;
}

qadmit *qadmit_create(db_pool *db, const char *holder)
{
    qadmit *q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    q->db = db;
    q->holder = strdup(holder);
    q->blocks = idmap_create(16);
    if (!q->holder || !q->blocks) {
        qadmit_destroy(q);
        return NULL;
    }
    return q;
}

static int free_block(uint64_t key, uint64_t value, void *ctx)
{
    (void)key;
    (void)ctx;
    qa_block *b = (qa_block *)(uintptr_t)value;
    db_result gone = {.status = DB_UNAVAILABLE, .message = "shutting down"};
    qa_verdict v = {.err = &gone};
    for (size_t i = 0; i < b->nw; i++)
        b->w[i].cb(b->w[i].arg, &v);
    free(b->w);
    free(b);
    return 0;
}

void qadmit_destroy(qadmit *q)
{
    if (!q)
        return;
    if (q->blocks)
        idmap_foreach(q->blocks, free_block, NULL);
    idmap_destroy(q->blocks);
    free(q->holder);
    free(q);
}

uint64_t qadmit_reservations(const qadmit *q)
{
    return q->reservations;
}

static void on_reserved(void *arg, const db_result *res);

/* Fails every waiter of b with res. */
static void fail_waiters(qa_block *b, const db_result *res)
{
    waiter *w = b->w;
    size_t n = b->nw;
    b->w = NULL;
    b->nw = b->cw = 0;
    b->retry_ms = 0;
    qa_verdict v = {.err = res};
    for (size_t i = 0; i < n; i++)
        w[i].cb(w[i].arg, &v);
    free(w);
}

/* Reports b's use, returns the rest of its block and asks for want more (0: none). The
 * block is surrendered as the job is sent: what it held is the database's to account. */
static void reserve(qa_block *b, int64_t want)
{
    char tid[24], used[24], wants[24], lease[16];
    snprintf(tid, sizeof(tid), "%lld", (long long)b->tenant);
    snprintf(used, sizeof(used), "%lld", (long long)b->used);
    snprintf(wants, sizeof(wants), "%lld", (long long)want);
    snprintf(lease, sizeof(lease), "%d", QA_LEASE_MS);
    const char *vals[] = {tid, b->limits, b->q->holder, used, wants, lease};
    /* the counter's commit need not wait for the disk: see docs (quotas) */
    db_query qs[2] = {{.stmt = sql_def(SQL_SYNC_OFF)},
                      {.stmt = sql_def(SQL_QUERY_RESERVE), DB_VALUES(vals)}};
    int rc = db_submit(b->q->db, b->tenant, qs, 2, on_reserved, b);
    if (rc < 0) {
        db_result res = {.status = DB_UNAVAILABLE,
                         .message = rc == -EAGAIN   ? "database queue full, retry later"
                                    : rc == -ENOMEM ? "out of memory"
                                                    : "database unavailable"};
        fail_waiters(b, &res);
        return;
    }
    b->avail = 0;
    b->used = 0;
    b->busy = true;
    b->asked = want;
    b->q->reservations++;
    metrics_query_reservation();
}

static void on_reserved(void *arg, const db_result *res)
{
    qa_block *b = arg;
    b->busy = false;
    if (res->status != DB_OK) {
        fail_waiters(b, res);
        return;
    }
    const PGresult *pr = res->res[1];
    if (PQntuples(pr) != 1) {
        db_result bad = {.status = DB_ERROR,
                         .sqlstate = "XX000",
                         .message = "query reservation returned nothing"};
        fail_waiters(b, &bad);
        return;
    }
    int64_t granted = memrow_i64_of(pr, 0, 0, 0, ROWERR_TENANTS);
    int64_t used = memrow_i64_of(pr, 0, 1, 0, ROWERR_TENANTS);
    int64_t lim = PQgetisnull(pr, 0, 2) ? -1 : memrow_i64_of(pr, 0, 2, 0, ROWERR_TENANTS);
    int64_t resets = memrow_i64_of(pr, 0, 3, 0, ROWERR_TENANTS);
    int64_t others = memrow_i64_of(pr, 0, 4, 0, ROWERR_TENANTS);
    uint64_t now = mono_ms();
    /* a busy tenant gets bigger blocks: fewer round trips */
    if (granted >= b->want && b->got_ms && now - b->got_ms < QA_IDLE_MS)
        b->want = b->want * 2 > WANT_MAX ? WANT_MAX : b->want * 2;
    b->avail = granted;
    b->got_ms = now;
    b->resets_ms = resets;
    /* decide for every waiter first: a verdict's callback may bring new requests */
    waiter *w = b->w;
    size_t n = b->nw;
    b->w = NULL;
    b->nw = b->cw = 0;
    size_t admit = (size_t)(b->avail < (int64_t)n ? b->avail : (int64_t)n);
    b->avail -= (int64_t)admit;
    b->used += (int64_t)admit;
    size_t rest = n - admit, refuse = 0;
    if (rest > 0) {
        /* the database had all we asked for (a report, or a block smaller than the queue):
         * ask again at once; it had less while others hold some: they use it or give it
         * back, ask again soon; it had less and nobody holds any: the day is used up */
        bool again = granted >= b->asked;
        bool wait = !again && others > 0 && now - b->wait_since_ms < QA_LEASE_MS + 1000;
        if (again || wait) {
            b->w = malloc(rest * sizeof(*b->w));
            if (b->w) {
                memcpy(b->w, w + admit, rest * sizeof(*b->w));
                b->nw = b->cw = rest;
            } else {
                refuse = rest;
            }
        } else {
            refuse = rest;
        }
        if (b->nw && wait)
            b->retry_ms = now + QA_RETRY_MS;
        if (b->nw && again)
            reserve(b, (int64_t)rest > b->want ? (int64_t)rest : b->want);
    }
    if (!b->nw)
        b->wait_since_ms = 0;
    qa_verdict yes = {.admitted = true};
    for (size_t i = 0; i < admit; i++)
        w[i].cb(w[i].arg, &yes);
    /* no quota left anywhere: every one of the day's queries was used (ours included) */
    qa_verdict no = {.admitted = false, .used = used + granted, .limit = lim, .resets_ms = resets};
    for (size_t i = n - refuse; i < n; i++)
        w[i].cb(w[i].arg, &no);
    free(w);
}

void qadmit_admit(qadmit *q, int64_t tenant, const char *limits, qa_cb cb, void *arg)
{
    uint64_t v;
    qa_block *b = NULL;
    if (idmap_get(q->blocks, (uint64_t)tenant, &v)) {
        b = (qa_block *)(uintptr_t)v;
    } else if ((b = calloc(1, sizeof(*b))) != NULL) {
        b->q = q;
        b->tenant = tenant;
        b->want = WANT_MIN;
        if (idmap_put(q->blocks, (uint64_t)tenant, (uint64_t)(uintptr_t)b) < 0) {
            free(b);
            b = NULL;
        }
    }
    if (!b) {
        db_result oom = {.status = DB_UNAVAILABLE, .message = "out of memory"};
        qa_verdict no = {.err = &oom};
        cb(arg, &no);
        return;
    }
    snprintf(b->limits, sizeof(b->limits), "%s", limits);
    uint64_t now = mono_ms();
    b->last_ms = now;
    if (b->resets_ms && server_now_ms() >= b->resets_ms) {
        /* yesterday's block: nothing of it counts today */
        b->avail = 0;
        b->used = 0;
    }
    if (b->nw == 0 && b->avail > 0) {
        b->avail--;
        b->used++;
        qa_verdict yes = {.admitted = true};
        cb(arg, &yes);
        return;
    }
    if (b->nw == b->cw) {
        size_t cap = b->cw ? b->cw * 2 : 8;
        waiter *nw = realloc(b->w, cap * sizeof(*nw));
        if (!nw) {
            db_result oom = {.status = DB_UNAVAILABLE, .message = "out of memory"};
            qa_verdict no = {.err = &oom};
            cb(arg, &no);
            return;
        }
        b->w = nw;
        b->cw = cap;
    }
    b->w[b->nw++] = (waiter){arg, cb};
    if (b->nw == 1)
        b->wait_since_ms = now;
    if (!b->busy && !b->retry_ms)
        reserve(b, b->want);
}

enum { ACT_RETRY, ACT_RELEASE, ACT_FORGET };

typedef struct tick_ctx {
    uint64_t now;
    bool draining;
    struct {
        qa_block *b;
        int act;
    } a[128];
    size_t n;
} tick_ctx;

/* Picks what tick does with each block; done after the walk, as a job's failure runs
 * callbacks that may add blocks. */
static int tick_block(uint64_t key, uint64_t value, void *arg)
{
    (void)key;
    tick_ctx *t = arg;
    qa_block *b = (qa_block *)(uintptr_t)value;
    int act = -1;
    if (b->busy || t->n == sizeof(t->a) / sizeof(t->a[0]))
        return 0;
    if (b->nw > 0) {
        if (b->retry_ms && t->now >= b->retry_ms)
            act = ACT_RETRY;
    } else if (b->avail > 0 || b->used > 0) {
        if (t->draining || t->now - b->last_ms >= QA_IDLE_MS ||
            t->now - b->got_ms >= QA_LEASE_MS / 2)
            act = ACT_RELEASE;
    } else if (t->now - b->last_ms >= FORGET_MS) {
        act = ACT_FORGET;
    }
    if (act >= 0) {
        t->a[t->n].b = b;
        t->a[t->n++].act = act;
    }
    return 0;
}

void qadmit_tick(qadmit *q, bool draining)
{
    tick_ctx t = {.now = mono_ms(), .draining = draining};
    idmap_foreach(q->blocks, tick_block, &t);
    for (size_t i = 0; i < t.n; i++) {
        qa_block *b = t.a[i].b;
        switch (t.a[i].act) {
        case ACT_RETRY:
            b->retry_ms = 0;
            reserve(b, b->want);
            break;
        case ACT_RELEASE:
            if (t.now - b->last_ms >= QA_IDLE_MS)
                b->want = WANT_MIN;
            reserve(b, 0);
            break;
        default:
            idmap_del(q->blocks, (uint64_t)b->tenant);
            free(b->w);
            free(b);
            break;
        }
    }
}
