/* server/methods/gcommit.c: group commit of writes across tenants, per worker (see
 * gcommit.h). */
#include "gcommit.h"

#include <event2/event.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "citusmap.h"
#include "idmap.h"
#include "log.h"
#include "memrow.h"
#include "metrics.h"
#include "server.h"
#include "sql.h"
#include "worker.h"

/* The worker's one group lives in its store-group map under this key. */
#define GROUP_KEY 0

/* Large requests' jobs in flight in the whole process, at most LARGE_SLOTS: each writes
 * megabytes of WAL, which every other commit then waits to flush behind it, so they go one
 * at a time (tenants in turns); a worker whose large request finds the slot taken looks
 * again every LARGE_RETRY_MS. */
#define LARGE_SLOTS 1
#define LARGE_RETRY_MS 2
static atomic_int large_slots;

/* Announcements wait this long for more, so one NOTIFY carries the changes of several jobs:
 * each NOTIFY wakes every listening backend and process, and sent after every job it cost
 * a one-client store 0.09 ms of its 0.55 (bench/README.md). */
#define NOTE_DELAY_MS 5

typedef struct gc_group {
    const gc_ops *ops;
    idmap *map;      /* the worker's groups, to leave when idle */
    worker *w;       /* the worker it belongs to */
    req **q;         /* waiting, in arrival order */
    size_t nq, cq;   /* waiting, room */
    size_t inflight; /* group jobs sent and not yet answered */
    req **large;     /* requests of more than GC_LARGE_ITEMS items, waiting, in order */
    size_t nlarge, clarge;
    bool large_busy;           /* a large request's job is in flight */
    int64_t large_last;        /* the tenant of the last large job (tenants take turns) */
    struct event *large_timer; /* armed: a large request waits for the process's slot */
    bool large_armed;
    size_t lane; /* requests sent alone to their tenant's lane, not yet answered */
    idmap *busy; /* tenant -> its requests in those jobs */
    /* change announcements (ops->seq_col): tenant -> the last change number committed and
     * not yet announced; one NOTIFY statement in flight at a time (noting), and what
     * commits meanwhile goes in the next one */
    idmap *notes;
    bool noting;
    struct event *note_timer; /* armed: notes wait for NOTE_DELAY_MS */
    bool note_armed;
    struct cmap *placements; /* on Citus: the tenants' nodes (groups of one node); else NULL */
} gc_group;

typedef struct gc_job {
    gc_group *g;
    bool alone; /* a retry of one request: its failure is its own */
    bool solo;  /* one request through ops->solo_stmt */
    bool large; /* one request of more than GC_LARGE_ITEMS items, outside the group */
    bool citus; /* ops->build_one's statements, one a request, in one transaction */
    size_t n;
    req *m[]; /* the members, in the statement's order */
} gc_job;

/* Frees g (its timer cancelled) and takes it out of its worker's map (g->map, NULL when it
 * never went in). Nothing may refer to g any more: no job or NOTIFY in flight. */
static void group_free(gc_group *g)
{
    if (g->map)
        idmap_del(g->map, GROUP_KEY);
    idmap_destroy(g->busy);
    idmap_destroy(g->notes);
    if (g->note_timer)
        event_free(g->note_timer);
    if (g->large_timer)
        event_free(g->large_timer);
    free(g->q);
    free(g->large);
    free(g);
}

static void group_next(gc_group *g);

static void fail_submit(req *r, int rc)
{
    if (rc == -EAGAIN)
        req_fail(r, RPC_UNAVAILABLE, "database queue full, retry later");
    else if (rc == -ENOMEM)
        req_fail(r, RPC_INTERNAL, "out of memory");
    else
        req_fail(r, RPC_UNAVAILABLE, "database unavailable (shutting down)");
}

/* Whether row i of pr is a request's refusal (the last three columns: sqlstate, message,
 * detail). */
static bool refusal_row(const PGresult *pr, int i)
{
    int nf = PQnfields(pr);
    return nf >= 3 && i < PQntuples(pr) && !PQgetisnull(pr, i, nf - 3);
}

static void job_done(void *arg, const db_result *res);

/* Counts the n requests m in (delta 1) or out of (-1) the jobs in flight, per tenant. */
static void mark_busy(gc_group *g, req *const *m, size_t n, int delta)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t t = (uint64_t)req_auth(m[i])->tenant_id, v = 0;
        if (!idmap_get(g->busy, t, &v) && delta < 0)
            continue; /* never remembered (no room) */
        v += (uint64_t)(int64_t)delta;
        if (v == 0)
            idmap_del(g->busy, t);
        else
            idmap_put(g->busy, t, v); /* no room: the tenant may go in a second job (correct) */
    }
}

static bool tenant_busy(const gc_group *g, req *r)
{
    uint64_t v = 0;
    return idmap_get(g->busy, (uint64_t)req_auth(r)->tenant_id, &v) && v > 0;
}

/* On Citus: submits j's requests as one transaction of ops->build_one's statements (their
 * tenants' split fences first: db_opts.tenants). Returns 0 or a negative errno. */
static int citus_submit(gc_job *j)
{
    size_t n = j->n;
    if (n > DB_MAX_QUERIES)
        return -EINVAL; /* pick_group never makes one */
    gc_params *p = calloc(n, sizeof(*p));
    int rc = p ? 0 : -ENOMEM;
    db_query qs[DB_MAX_QUERIES];
    int64_t tenants[DB_MAX_QUERIES];
    for (size_t i = 0; rc == 0 && i < n; i++) {
        p[i].wait = true;
        rc = j->g->ops->build_one(j->m[i], &qs[i], &p[i]);
        tenants[i] = req_auth(j->m[i])->tenant_id;
    }
    if (rc == 0) {
        db_opts o = {.rls_tenant = -1, .tenants = tenants, .ntenants = (int)n};
        rc = db_submit_opts(req_db(j->m[0]), &o, qs, (int)n, job_done, j); /* copies all */
    }
    free(p);
    return rc;
}

/* Sends the n requests m as one job of g (large: one request of more than GC_LARGE_ITEMS
 * items, outside the group's slot); on failure to submit, fails them. */
static void job_send(gc_group *g, req *const *m, size_t n, bool alone, bool large)
{
    gc_job *j = malloc(sizeof(*j) + n * sizeof(req *));
    if (!j) {
        for (size_t i = 0; i < n; i++)
            req_fail(m[i], RPC_INTERNAL, "out of memory");
        return;
    }
    j->g = g;
    j->alone = alone;
    j->large = large;
    j->citus = g->placements != NULL;
    j->solo = n == 1 && !alone && !large && !j->citus && g->ops->solo_stmt >= 0 &&
              g->ops->items(m[0]) <= g->ops->solo_max_items && !(g->ops->key && g->ops->key(m[0]));
    j->n = n;
    memcpy(j->m, m, n * sizeof(req *));
    int rc;
    if (j->citus) {
        rc = citus_submit(j);
    } else {
        db_query q;
        gc_params p = {.wait = false}; /* a tenant held elsewhere is refused, never waited for */
        rc = g->ops->build(j->m, n, &q, &p);
        int64_t rls = -1;
        if (rc == 0 && j->solo) {
            const db_stmt_def *st = sql_def((sql_stmt)g->ops->solo_stmt);
            q.stmt = st;
            q.nvalues = (size_t)st->nparams; /* the group statement's first parameters */
            rls = req_auth(j->m[0])->tenant_id;
        }
        if (rc == 0)
            rc = db_submit(req_db(j->m[0]), rls, &q, 1, job_done, j);
    }
    if (rc < 0) {
        for (size_t i = 0; i < n; i++)
            fail_submit(j->m[i], rc);
        free(j);
        return;
    }
    size_t tenants = n > 0;
    for (size_t i = 1; i < n; i++) /* sorted by tenant */
        tenants += req_auth(j->m[i])->tenant_id != req_auth(j->m[i - 1])->tenant_id;
    metrics_group_commit(n, tenants);
    mark_busy(g, j->m, n, 1);
    if (large)
        g->large_busy = true; /* the process's slot was taken by large_next */
    else
        g->inflight++;
}

/* A request alone on its tenant's lane (req_submit_lane): its tenant's row was held by
 * another transaction when its group ran. The statement waits for it (gc_params.wait),
 * within the lane's lock_timeout. */
static void lane_done(req *r, const db_result *res);

static void lane_send(gc_group *g, req *r)
{
    db_query q;
    gc_params p = {.wait = true};
    if (g->ops->build(&r, 1, &q, &p) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    g->lane++; /* keeps g until lane_done */
    req_submit_lane(r, -1, &q, 1, lane_done);
}

typedef struct note_lit {
    char *p;
    size_t len;
} note_lit;

static int note_add(uint64_t key, uint64_t value, void *ctx)
{
    note_lit *l = ctx;
    l->len += (size_t)sprintf(l->p + l->len, "%s%lld:%llu", l->len > 1 ? "," : "",
                              (long long)(int64_t)key, (unsigned long long)value);
    return 0;
}

static void notified(void *arg, const db_result *res);

/* Sends g's pending announcements as one NOTIFY statement (the array literal
 * {tenant:seq,...}). A failure is logged: the other processes' change check still finds
 * the changes (change_poll_ms). */
static void notes_send(gc_group *g)
{
    size_t n = idmap_count(g->notes);
    if (n == 0)
        return;
    note_lit l = {.p = malloc(n * 42 + 3)}; /* "-9223372036854775808:18446744073709551615," */
    if (!l.p) {
        log_warn("change notification not sent: out of memory");
        idmap_clear(g->notes);
        return;
    }
    l.p[l.len++] = '{';
    idmap_foreach(g->notes, note_add, &l);
    l.p[l.len++] = '}';
    l.p[l.len] = '\0';
    idmap_clear(g->notes);
    const char *vals[1] = {l.p};
    db_query q = {.stmt = sql_def(SQL_NOTIFY_CHANGES), .nvalues = 1, .values = vals};
    /* on the worker's pool, whose connections this process's listener ignores */
    int rc = db_submit(worker_db(g->w), -1, &q, 1, notified, g);
    free(l.p);
    if (rc < 0)
        log_warn("change notification not sent: %s", strerror(-rc));
    else
        g->noting = true;
}

/* Arms g's announcement timer unless a NOTIFY is in flight (its answer arms it) or the
 * timer is armed; without a timer the notes go at once. */
static void notes_arm(gc_group *g)
{
    if (g->noting || g->note_armed || idmap_count(g->notes) == 0)
        return;
    struct timeval tv = {0, NOTE_DELAY_MS * 1000};
    if (g->note_timer && event_add(g->note_timer, &tv) == 0)
        g->note_armed = true;
    else
        notes_send(g);
}

static void notes_due(evutil_socket_t fd, short what, void *arg)
{
    gc_group *g = arg;
    g->note_armed = false;
    notes_send(g);
    group_next(g); /* leaves g when nothing else is left */
}

static void notified(void *arg, const db_result *res)
{
    gc_group *g = arg;
    g->noting = false;
    if (res->status != DB_OK)
        log_warn("change notification not sent: %s", res->message ? res->message : "no reason");
    notes_arm(g);
    group_next(g); /* leaves g when nothing else is left */
}

/* Notes change seq of tenant t for announcement (the highest of a tenant's stands). */
static void note_change(gc_group *g, int64_t t, int64_t seq)
{
    uint64_t had = 0;
    if (seq < 0 || (idmap_get(g->notes, (uint64_t)t, &had) && had >= (uint64_t)seq))
        return;
    if (idmap_put(g->notes, (uint64_t)t, (uint64_t)seq) < 0)
        log_warn("change notification of tenant %lld not sent: out of memory", (long long)t);
}

static gc_group *group_of(worker *w)
{
    uint64_t v;
    idmap *groups = app_store_groups(w);
    return groups && idmap_get(groups, GROUP_KEY, &v) ? (gc_group *)(uintptr_t)v : NULL;
}

static void lane_done(req *r, const db_result *res)
{
    gc_group *g = group_of(req_worker(r)); /* kept while g->lane > 0 */
    const gc_ops *ops = g->ops;
    g->lane--;
    if (res->status == DB_OK && refusal_row(res->res[0], 0)) {
        const PGresult *pr = res->res[0];
        int nf = PQnfields(pr);
        db_result one = {
            .status = DB_ERROR,
            .sqlstate = PQgetvalue(pr, 0, nf - 3),
            .message = PQgetvalue(pr, 0, nf - 2),
            .detail = PQgetisnull(pr, 0, nf - 1) ? NULL : PQgetvalue(pr, 0, nf - 1),
        };
        ops->fail(r, &one);
    } else if (res->status == DB_OK) {
        const PGresult *pr = res->res[0];
        int n = (int)ops->items(r);
        if (ops->seq_col >= 0 && n > 0 && n <= PQntuples(pr))
            note_change(g, req_auth(r)->tenant_id, memrow_i64(pr, n - 1, ops->seq_col, -1));
        ops->finish(r, pr, 0);
        notes_arm(g);
    } else {
        ops->fail(r, res);
    }
    group_next(g);
}

static void job_done(void *arg, const db_result *res)
{
    gc_job *j = arg;
    gc_group *g = j->g;
    const gc_ops *ops = g->ops;
    if (j->large) {
        g->large_busy = false;
        atomic_fetch_sub(&large_slots, 1);
    } else {
        g->inflight--;
    }
    mark_busy(g, j->m, j->n, -1); /* before any request ends */
    if (j->citus && res->status == DB_OK) {
        /* each request's rows are its statement's; the statements announced the changes */
        for (size_t i = 0; i < j->n; i++)
            ops->finish(j->m[i], res->res[i], 0);
        free(j);
        group_next(g);
        return;
    }
    if (j->solo && res->status == DB_OK && PQntuples(res->res[0]) == 0) {
        job_send(g, j->m, 1, true, false); /* refused: the group statement says why */
        free(j);
        group_next(g);
        return;
    }
    if (res->status == DB_OK) {
        const PGresult *pr = res->res[0];
        int off = 0;
        for (size_t i = 0; i < j->n; i++) {
            if (refusal_row(pr, off) &&
                strcmp(PQgetvalue(pr, off, PQnfields(pr) - 3), "EG503") == 0) {
                /* its tenant's row is held by another transaction: alone, on the lane, and
                 * its next stores go there directly for a while */
                off++;
                req_tenant_mark_blocked(j->m[i]);
                lane_send(g, j->m[i]);
                continue;
            }
            if (refusal_row(pr, off)) {
                int nf = PQnfields(pr);
                db_result one = {
                    .status = DB_ERROR,
                    .sqlstate = PQgetvalue(pr, off, nf - 3),
                    .message = PQgetvalue(pr, off, nf - 2),
                    .detail = PQgetisnull(pr, off, nf - 1) ? NULL : PQgetvalue(pr, off, nf - 1),
                };
                ops->fail(j->m[i], &one);
                off++;
                continue;
            }
            int n = (int)ops->items(j->m[i]); /* finish ends the request */
            if (ops->seq_col >= 0 && n > 0 && off + n <= PQntuples(pr)) /* its last row */
                note_change(g, req_auth(j->m[i])->tenant_id,
                            memrow_i64(pr, off + n - 1, ops->seq_col, -1));
            ops->finish(j->m[i], pr, off);
            off += n;
        }
        notes_arm(g);
    } else if (j->alone || j->n == 1 || res->status == DB_UNAVAILABLE) {
        for (size_t i = 0; i < j->n; i++)
            ops->fail(j->m[i], res);
    } else {
        /* retried alone: each gets its own outcome */
        for (size_t i = 0; i < j->n; i++)
            job_send(g, &j->m[i], 1, true, false);
    }
    free(j);
    group_next(g);
}

typedef struct member {
    int64_t tenant;
    size_t at; /* arrival order */
    req *r;
} member;

static int by_tenant(const void *a, const void *b)
{
    const member *x = a, *y = b;
    if (x->tenant != y->tenant)
        return x->tenant < y->tenant ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at ? 1 : 0;
}

/* Sorts the n requests m by tenant, keeping arrival order within a tenant: concurrent
 * groups then lock tenant rows in one order (no deadlock), and one tenant's requests get
 * what they would have had alone one after the other. Returns 0 or -ENOMEM. */
static int sort_by_tenant(req **m, size_t n)
{
    if (n < 2)
        return 0;
    member *t = malloc(n * sizeof(*t));
    if (!t)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        t[i] = (member){req_auth(m[i])->tenant_id, i, m[i]};
    qsort(t, n, sizeof(*t), by_tenant);
    for (size_t i = 0; i < n; i++)
        m[i] = t[i].r;
    free(t);
    return 0;
}

/* Sends the next large request (one at a time): the oldest of a tenant other than the last
 * large job's, when there is one, so tenants take turns. */
static void large_due(evutil_socket_t fd, short what, void *arg)
{
    gc_group *g = arg;
    g->large_armed = false;
    group_next(g);
}

static void large_next(gc_group *g)
{
    if (g->large_busy || g->nlarge == 0)
        return;
    int taken = atomic_load(&large_slots);
    do {
        if (taken >= LARGE_SLOTS) {
            struct timeval tv = {0, LARGE_RETRY_MS * 1000};
            if (!g->large_armed && g->large_timer && event_add(g->large_timer, &tv) == 0)
                g->large_armed = true;
            return;
        }
    } while (!atomic_compare_exchange_weak(&large_slots, &taken, taken + 1));
    size_t pick = 0;
    for (size_t i = 0; i < g->nlarge; i++) {
        if (req_auth(g->large[i])->tenant_id != g->large_last && !tenant_busy(g, g->large[i])) {
            pick = i;
            break;
        }
    }
    req *r = g->large[pick];
    memmove(g->large + pick, g->large + pick + 1, (g->nlarge - pick - 1) * sizeof(req *));
    g->nlarge--;
    g->large_last = req_auth(r)->tenant_id;
    job_send(g, &r, 1, false, true);
    if (!g->large_busy) /* it could not be sent (and was failed): the slot goes back */
        atomic_fetch_sub(&large_slots, 1);
}

/* Whether one of the n requests m has r's tenant and idempotency key. */
static bool key_taken(const gc_group *g, req *const *m, size_t n, req *r)
{
    const char *key = g->ops->key ? g->ops->key(r) : NULL;
    if (!key)
        return false;
    for (size_t i = 0; i < n; i++) {
        const char *other = g->ops->key(m[i]);
        if (other && req_auth(m[i])->tenant_id == req_auth(r)->tenant_id && strcmp(other, key) == 0)
            return true;
    }
    return false;
}

/* Picks up to max_items items of the waiting requests into m (n of them) for one group job,
 * in turns: first at most an even share of items per waiting tenant (its requests in their
 * order), then, while there is room, the rest in arrival order. Requests of a tenant that a
 * job in flight holds stay. Returns the count picked; g->q keeps the others, in order. */
static size_t pick_group(gc_group *g, req **m)
{
    size_t max = g->ops->max_items, tenants = 0;
    idmap *taken = idmap_create(16); /* tenant -> items taken so far */
    idmap *seen = idmap_create(16);
    if (!taken || !seen) {
        idmap_destroy(taken);
        idmap_destroy(seen);
        return 0;
    }
    for (size_t i = 0; i < g->nq; i++) {
        uint64_t t = (uint64_t)req_auth(g->q[i])->tenant_id, v;
        if (!idmap_get(seen, t, &v) && idmap_put(seen, t, 1) == 0)
            tenants++;
    }
    size_t share = tenants > 1 ? max / tenants : max;
    if (share == 0)
        share = 1;
    bool *in = calloc(g->nq + 1, sizeof(*in));
    size_t n = 0, items = 0;
    /* on Citus: the node of the first request that may go; only its node's requests join
     * it, at most DB_MAX_QUERIES (one statement each), and one of a tenant whose node is
     * unknown goes alone */
    int node = -1;
    bool one_node = g->placements != NULL;
    for (size_t i = 0; one_node && i < g->nq; i++) {
        if (tenant_busy(g, g->q[i]))
            continue;
        node = cmap_node(g->placements, req_auth(g->q[i])->tenant_id);
        if (node < 0)
            max = g->ops->items(g->q[i]); /* that request alone */
        break;
    }
    for (int pass = 0; in && pass < 2; pass++) {
        for (size_t i = 0; i < g->nq && items < max && (!one_node || n < DB_MAX_QUERIES); i++) {
            req *r = g->q[i];
            if (in[i] || tenant_busy(g, r))
                continue;
            if (one_node &&
                (node < 0 ? n > 0 : cmap_node(g->placements, req_auth(r)->tenant_id) != node))
                continue;
            uint64_t t = (uint64_t)req_auth(r)->tenant_id, had = 0;
            size_t k = g->ops->items(r);
            if (n > 0 && items + k > max)
                continue;
            if (key_taken(g, m, n, r))
                continue; /* the next job: it sees this one's commit */
            idmap_get(taken, t, &had);
            if (pass == 0 && had > 0 && had + k > share)
                continue; /* its turn is over for now: the next pass */
            idmap_put(taken, t, had + k);
            in[i] = true;
            m[n++] = r;
            items += k;
        }
    }
    size_t keep = 0;
    for (size_t i = 0; i < g->nq; i++)
        if (!in || !in[i])
            g->q[keep++] = g->q[i];
    g->nq = keep;
    free(in);
    idmap_destroy(taken);
    idmap_destroy(seen);
    return n;
}

/* Sends waiting requests of g while a slot is free, or leaves g when nothing is left. A
 * second job in flight takes only tenants the first does not hold: a tenant's transactions
 * would wait for each other's row lock anyway, and its requests make a bigger group for the
 * next job instead. Large requests go one at a time beside the group (large_next). */
static void group_next(gc_group *g)
{
    large_next(g);
    while (g->nq > 0 && g->inflight < GC_MAX_INFLIGHT) {
        req **m = malloc(g->nq * sizeof(req *));
        if (!m) {
            req_fail(g->q[0], RPC_INTERNAL, "out of memory");
            memmove(g->q, g->q + 1, (g->nq - 1) * sizeof(req *));
            g->nq--;
            continue;
        }
        size_t n = pick_group(g, m);
        if (n == 0) {
            free(m);
            break;
        }
        if (sort_by_tenant(m, n) < 0) {
            for (size_t x = 0; x < n; x++)
                req_fail(m[x], RPC_INTERNAL, "out of memory");
        } else {
            job_send(g, m, n, false, false);
        }
        free(m);
    }
    if (g->nq == 0 && g->inflight == 0 && g->nlarge == 0 && !g->large_busy && g->lane == 0 &&
        !g->noting && !g->note_armed && !g->large_armed)
        group_free(g);
}

/* Adds r to the list *list (n entries, room *cap). Returns 0 or -ENOMEM. */
static int list_add(req ***list, size_t *n, size_t *cap, req *r)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        req **l = realloc(*list, c * sizeof(*l));
        if (!l)
            return -ENOMEM;
        *list = l;
        *cap = c;
    }
    (*list)[(*n)++] = r;
    return 0;
}

void gc_submit(req *r, const gc_ops *ops)
{
    idmap *groups = app_store_groups(req_worker(r));
    uint64_t v;
    gc_group *g = NULL;
    if (groups && idmap_get(groups, GROUP_KEY, &v)) {
        g = (gc_group *)(uintptr_t)v;
    } else if (groups && (g = calloc(1, sizeof(*g))) != NULL) {
        g->ops = ops;
        g->map = groups;
        g->w = req_worker(r);
        g->placements = ops->build_one ? req_server(r)->placements : NULL;
        g->busy = idmap_create(16);
        g->notes = idmap_create(16);
        g->note_timer = evtimer_new(worker_base(g->w), notes_due, g);
        g->large_timer = evtimer_new(worker_base(g->w), large_due, g);
        if (!g->busy || !g->notes || !g->note_timer || !g->large_timer ||
            idmap_put(groups, GROUP_KEY, (uint64_t)(uintptr_t)g) < 0) {
            g->map = NULL; /* not in it */
            group_free(g);
            g = NULL;
        }
    }
    if (!g) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    if (req_tenant_blocked(r)) {
        /* its tenant's row was held elsewhere lately: no group waits for it */
        lane_send(g, r);
        group_next(g);
        return;
    }
    int rc = ops->items(r) > GC_LARGE_ITEMS ? list_add(&g->large, &g->nlarge, &g->clarge, r)
                                            : list_add(&g->q, &g->nq, &g->cq, r);
    if (rc < 0)
        req_fail(r, RPC_INTERNAL, "out of memory");
    group_next(g); /* leaves g when nothing is left */
}

void gc_worker_fini(idmap *groups)
{
    uint64_t v;
    if (!groups || !idmap_get(groups, GROUP_KEY, &v))
        return;
    gc_group *g = (gc_group *)(uintptr_t)v;
    if (g->nq || g->inflight || g->noting || g->nlarge || g->large_busy || g->lane) {
        /* cannot happen once the pools are destroyed; kept, not freed under its users */
        log_warn("store group left with %zu waiting, %zu jobs in flight", g->nq + g->nlarge,
                 g->inflight + g->large_busy + g->lane);
        return;
    }
    if (idmap_count(g->notes))
        log_warn("shutdown: %zu tenants' last changes not announced (the other processes' "
                 "change check finds them)",
                 idmap_count(g->notes));
    group_free(g);
}
