/* server/methods/gcommit.h: group commit of one tenant's writes, per worker.
 *
 * A tenant's writes commit one at a time (they take the tenant's row lock to number their
 * changes), so concurrent writes of one tenant would queue in PostgreSQL, each paying a
 * whole transaction. Instead, per worker and tenant, while one job is in flight the next
 * requests wait, and then go to PostgreSQL together as one statement and one transaction
 * (up to a bound on the items they carry). Each request is still answered only after the
 * commit that holds its items. A request alone costs nothing extra. If a combined job
 * fails with a database error (a quota reached by the sum, say), each request is retried
 * alone, so every request gets the answer it would have had alone.
 *
 * The kind of write is described by a gc_ops table; memory.store and memory.store_batch
 * are the users (m_memory.c). A worker keeps one group per tenant (worker_store_groups),
 * so one kind of write per worker goes through it. Worker thread only.
 */
#ifndef ENGRAM_SERVER_GCOMMIT_H
#define ENGRAM_SERVER_GCOMMIT_H

#include <stdbool.h>
#include <stddef.h>

#include "db.h"
#include "req.h"

/* Room for one statement's parameters, owned by the caller of ops->build. */
typedef struct gc_params {
    const char *vals[DB_MAX_PARAMS];
    int lens[DB_MAX_PARAMS];
    int fmts[DB_MAX_PARAMS];
} gc_params;

typedef struct gc_ops {
    size_t max_items; /* the most items one combined statement may carry */
    /* items returns how many items (rows) request r writes */
    size_t (*items)(req *r);
    /* build writes into q (parameters in p, text in m[0]'s arena) one statement for the
     * items of the n requests m, in that order. Returns 0 or -ENOMEM. */
    int (*build)(req *const *m, size_t n, db_query *q, gc_params *p);
    /* finish completes r from its rows of the result, starting at row off */
    void (*finish)(req *r, const PGresult *pr, int off);
    /* fail ends r for a failed job */
    void (*fail)(req *r, const db_result *res);
    /* done is the req_submit callback of a request sent alone (finish or fail on its own) */
    void (*done)(req *r, const db_result *res);
} gc_ops;

/* gc_submit sends r (whose items are ready) through its tenant's group on this worker, or
 * alone when alone is true (e.g. an idempotent retry must not share its transaction) or no
 * group can be made. r is answered through ops->finish or ops->fail, or req_fail. */
void gc_submit(req *r, const gc_ops *ops, bool alone);

#endif
