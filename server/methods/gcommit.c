/* server/methods/gcommit.c: group commit of one tenant's writes, per worker (see gcommit.h). */
#include "gcommit.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idmap.h"
#include "metrics.h"
#include "worker.h"

typedef struct gc_group {
    int64_t tenant;
    const gc_ops *ops;
    idmap *map; /* the worker's groups, to leave when idle */
    req **q;    /* waiting, in arrival order */
    size_t nq, cq;
} gc_group;

typedef struct gc_job {
    gc_group *g;
    size_t n;
    req *m[]; /* the members, in the statement's order */
} gc_job;

static void group_next(gc_group *g);

/* Sends r alone. */
static void submit_alone(req *r, const gc_ops *ops)
{
    db_query q;
    gc_params p;
    if (ops->build(&r, 1, &q, &p) < 0)
        req_fail(r, RPC_INTERNAL, "out of memory");
    else
        req_submit(r, req_auth(r)->tenant_id, &q, 1, ops->done);
}

static void group_done(void *arg, const db_result *res)
{
    gc_job *j = arg;
    const gc_ops *ops = j->g->ops;
    if (res->status == DB_OK) {
        int off = 0;
        for (size_t i = 0; i < j->n; i++) {
            size_t n = ops->items(j->m[i]);
            ops->finish(j->m[i], res->res[0], off);
            off += (int)n;
        }
    } else if (j->n == 1 || res->status == DB_UNAVAILABLE) {
        for (size_t i = 0; i < j->n; i++)
            ops->fail(j->m[i], res);
    } else {
        /* retried alone: each gets its own outcome (e.g. the quota allows some) */
        for (size_t i = 0; i < j->n; i++)
            submit_alone(j->m[i], ops);
    }
    gc_group *g = j->g;
    free(j);
    group_next(g);
}

/* Sends the waiting requests of g as one job, or leaves g when none wait. */
static void group_next(gc_group *g)
{
    if (g->nq == 0) {
        idmap_del(g->map, (uint64_t)g->tenant);
        free(g->q);
        free(g);
        return;
    }
    size_t n = 0, items = 0;
    while (n < g->nq) {
        size_t k = g->ops->items(g->q[n]);
        if (n > 0 && items + k > g->ops->max_items)
            break;
        items += k;
        n++;
    }
    gc_job *j = malloc(sizeof(*j) + n * sizeof(req *));
    if (!j) {
        for (size_t i = 0; i < n; i++)
            req_fail(g->q[i], RPC_INTERNAL, "out of memory");
        memmove(g->q, g->q + n, (g->nq - n) * sizeof(req *));
        g->nq -= n;
        group_next(g);
        return;
    }
    j->g = g;
    j->n = n;
    memcpy(j->m, g->q, n * sizeof(req *));
    memmove(g->q, g->q + n, (g->nq - n) * sizeof(req *));
    g->nq -= n;
    db_query q;
    gc_params p;
    int rc = g->ops->build(j->m, n, &q, &p);
    if (rc == 0)
        rc = db_submit(req_db(j->m[0]), g->tenant, &q, 1, group_done, j);
    if (rc == 0)
        metrics_group_commit(n);
    if (rc < 0) {
        for (size_t i = 0; i < n; i++) {
            if (rc == -EAGAIN)
                req_fail(j->m[i], RPC_UNAVAILABLE, "database queue full, retry later");
            else if (rc == -ENOMEM)
                req_fail(j->m[i], RPC_INTERNAL, "out of memory");
            else
                req_fail(j->m[i], RPC_UNAVAILABLE, "database unavailable (shutting down)");
        }
        free(j);
        group_next(g); /* the next ones, or leave */
    }
}

void gc_submit(req *r, const gc_ops *ops, bool alone)
{
    int64_t tid = req_auth(r)->tenant_id;
    idmap *groups = worker_store_groups(req_worker(r));
    uint64_t v;
    if (!alone && groups && idmap_get(groups, (uint64_t)tid, &v)) {
        gc_group *g = (gc_group *)(uintptr_t)v;
        if (g->nq == g->cq) {
            size_t cap = g->cq ? g->cq * 2 : 16;
            req **nq = realloc(g->q, cap * sizeof(*nq));
            if (!nq) {
                req_fail(r, RPC_INTERNAL, "out of memory");
                return;
            }
            g->q = nq;
            g->cq = cap;
        }
        g->q[g->nq++] = r;
        return;
    }
    gc_group *g = NULL;
    if (!alone && groups && (g = calloc(1, sizeof(*g))) != NULL) {
        g->tenant = tid;
        g->ops = ops;
        g->map = groups;
        if (idmap_put(groups, (uint64_t)tid, (uint64_t)(uintptr_t)g) < 0) {
            free(g);
            g = NULL;
        }
    }
    if (!g) { /* alone (or no memory for a group) */
        submit_alone(r, ops);
        return;
    }
    g->q = malloc(16 * sizeof(*g->q));
    if (!g->q) {
        idmap_del(groups, (uint64_t)tid);
        free(g);
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    g->cq = 16;
    g->q[0] = r;
    g->nq = 1;
    group_next(g);
}
