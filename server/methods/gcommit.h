/* server/methods/gcommit.h: group commit of writes across tenants, per worker.
 *
 * Every commit waits for the disk, so a write alone pays a whole transaction and a flush of
 * the WAL. Instead, per worker, up to GC_MAX_INFLIGHT jobs are in flight; the requests that
 * arrive meanwhile wait and then go to PostgreSQL together, whatever their tenants, as one
 * statement in one transaction (up to a bound on the items they carry). A job never takes a
 * tenant that a job in flight holds: that tenant's writes would only wait for the other
 * transaction's lock of its row, so they make the next group bigger instead. Each request is
 * still answered only after the commit that holds its items. A request that finds a free
 * slot goes at once, alone: it costs nothing extra.
 *
 * The statement answers for each request (in the order the job lists them, sorted by
 * tenant) either its rows, one per item, or a single row whose last three columns (sqlstate,
 * message, detail) say why that request alone was refused (a quota, a tenant gone): one
 * request's refusal never fails another's. If the whole job fails with a database error,
 * each request is retried alone, so every request gets the answer it would have had alone.
 * A job that failed for want of the database (DB_UNAVAILABLE) fails every request in it,
 * unacknowledged, as any write then.
 *
 * Announcements: a statement that writes changes without notifying (ops->seq_col) has them
 * announced after its commit, NOTIFY engram_changes of each tenant's last change number, in
 * one statement per worker at a time, sent 5 ms after the first change it carries (what
 * commits meanwhile goes in the same or the next one). A NOTIFY
 * inside the store's transaction would take PostgreSQL's database-wide notify lock at the
 * commit and hold it until the commit record is on disk, so store transactions would commit
 * one at a time. An announcement that is never sent (the process died after the commit) is
 * made up for by the other processes' change check (change_poll_ms, bg.c).
 *
 * A job of one request of at most ops->solo_max_items items may go through a cheaper
 * statement of its own (ops->solo_stmt), which either does the write or answers nothing, and
 * then the request goes again alone through the group statement.
 *
 * Isolation: a group never waits for a tenant's row that another transaction holds (the
 * statement refuses that tenant's requests with EG503 and they go again alone on the
 * worker's lane, req_submit_lane, waiting at most write_lock_wait_ms); a request of more
 * than GC_LARGE_ITEMS items goes alone (see above); and a group takes each waiting tenant's
 * requests in turn, so one tenant cannot fill every group while others wait.
 *
 * On Citus (issue 35 item 2) the group statement does not run; a group is instead one
 * transaction of ops->build_one's statements, one a request, each delegated by Citus to the
 * worker that holds its tenant, and a group takes only tenants of one worker by the
 * placements engramd knows (server.placements, storage/citusmap.h), so it commits there in
 * one local transaction, never in two phases. A tenant whose placement is unknown goes
 * alone. Its statements announce their own changes (no seq_col notes). A failure of any of
 * them fails the transaction, and then each request is retried alone, as above; a group
 * waits for a tenant's row held elsewhere (no EG503 refusal: the transaction would be lost
 * with it), and at most DB_MAX_QUERIES requests go in one.
 *
 * The kind of write is described by a gc_ops table; memory.store and memory.store_batch
 * without an idempotency key are the users (m_store.c). A worker keeps one group
 * (app_store_groups), so one kind of write per worker goes through it. Worker thread
 * only.
 */
#ifndef ENGRAM_SERVER_GCOMMIT_H
#define ENGRAM_SERVER_GCOMMIT_H

#include <stdbool.h>
#include <stddef.h>

#include "db.h"
#include "idmap.h"
#include "req.h"

/* Jobs of one worker's group in flight at once. One: the stores that arrive while it is in
 * flight make the next group bigger, and the workers' jobs together keep several
 * connections busy. With two per worker (one per database connection), 16 clients over 8
 * tenants stored 4,483 to 4,666 memories/s in groups of 2.0 requests, against 6,774 to
 * 7,457/s in groups of 4.0 with one (bench/README.md, "Writes over a mix of tenants"). */
#define GC_MAX_INFLIGHT 1

/* Room for one statement's parameters, owned by the caller of ops->build, and how the
 * statement must treat a tenant whose row another transaction holds: wait false, wait for
 * it at most write_lock_probe_ms, then refuse its requests (sqlstate EG503) so the others
 * commit; wait true (a request alone on the worker's lane, with a lock_timeout), wait. */
typedef struct gc_params {
    const char *vals[DB_MAX_PARAMS];
    int lens[DB_MAX_PARAMS];
    int fmts[DB_MAX_PARAMS];
    bool wait;
} gc_params;

/* A request of more items than this never rides in a shared group: it goes as a job of its
 * own, one at a time per worker, tenants in turn, so a tenant's large batches cannot hold
 * back other tenants' small stores (each waits at most for one group). */
#define GC_LARGE_ITEMS 64

typedef struct gc_ops {
    size_t max_items; /* the most items one combined statement may carry */
    /* the column of a row's change number (text format), whose tenant is its request's:
     * after a job commits, the last change of each of its tenants is announced to the other
     * processes (NOTIFY engram_changes, SQL_NOTIFY_CHANGES), as the statement does not
     * notify itself; -1 when the statement notifies, or writes no changes */
    int seq_col;
    /* a statement (sql.h) taking build's parameters, for a job of one request, run with
     * engram.tenant_id set to its tenant: cheaper than build's for that case, and answering
     * no rows when it did not do the write (a refusal), after which the request goes again
     * alone through build's statement, which says why; -1 when there is none */
    int solo_stmt;
    /* the most items of a request that goes through solo_stmt; a bigger one goes through
     * build's statement even alone */
    size_t solo_max_items;
    /* items returns how many items (rows) request r writes */
    size_t (*items)(req *r);
    /* key returns r's idempotency key, or NULL (none, or this kind of write takes none): a
     * job never holds two requests of one tenant with one key (the second goes in a later
     * job, where it sees the first's commit), and a keyed request never goes through
     * solo_stmt */
    const char *(*key)(req *r);
    /* build writes into q (parameters in p, text in m[0]'s arena) one statement for the
     * items of the n requests m, in that order (sorted by tenant id; the statement runs
     * without engram.tenant_id: see the result contract above). Returns 0 or -ENOMEM. */
    int (*build)(req *const *m, size_t n, db_query *q, gc_params *p);
    /* on Citus: build_one writes into q (parameters in p, text in r's arena) the statement
     * for r alone, which binds row-level security to r's tenant itself and answers rows as
     * build's for r (a refusal is its error); the job runs it among other tenants'. Returns
     * 0 or -ENOMEM. NULL: the requests never go through the group on Citus (the caller
     * must not gc_submit them there) */
    int (*build_one)(req *r, db_query *q, gc_params *p);
    /* finish completes r from its rows of the result, starting at row off */
    void (*finish)(req *r, const PGresult *pr, int off);
    /* fail ends r for a failed job, or for its refusal row (res->status DB_ERROR with the
     * row's sqlstate, message and detail) */
    void (*fail)(req *r, const db_result *res);
} gc_ops;

/* gc_submit sends r (whose items are ready) through this worker's group. r is answered through
 * ops->finish or ops->fail, or req_fail. */
void gc_submit(req *r, const gc_ops *ops);

/* gc_worker_fini frees the group left in a worker's map groups when the worker is destroyed
 * after a drain that timed out, once its database pools are destroyed (which fails its
 * jobs): announcements still waiting for their timer are dropped, with a warning; the other
 * processes' change check (change_poll_ms) finds those changes. Before the worker's event
 * base is freed. */
void gc_worker_fini(idmap *groups);

#endif
