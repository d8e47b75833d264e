/* server/net/req.h: one request's life, and the API method handlers use.
 *
 * A request owns a copy of its message, the decoded objects, an arena for the handler's
 * allocations and the response buffer. A handler validates, does its work (possibly
 * asynchronously: database jobs, index loads) and ends the request exactly once, with
 * req_done after packing a result into req_result, or with req_fail. Everything runs on
 * the owning worker's thread.
 */
#ifndef ENGRAM_SERVER_REQ_H
#define ENGRAM_SERVER_REQ_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "arena.h"
#include "conn.h"
#include "db.h"
#include "rpc.h"
#include "server.h"

typedef struct req req;

/* req_dispatch handles one complete message of len bytes from c (copied; `values`
 * MessagePack values): decoding, method lookup, authentication and permission checks,
 * parameter binding, the reservation for its answer (conn_admit: the request may wait for
 * it), then the handler. The connection has charged the request `charged` bytes for its
 * message (conn.h, budgets); the request gives back everything it was charged when it
 * ends. Returns 0; -EBADMSG when the message was malformed and the connection must be
 * closed (an error response has been written when a msgid could be read); -ENOMEM when
 * no request could be allocated (the connection is closed too). */
int req_dispatch(conn *c, const uint8_t *msg, size_t len, size_t values, size_t charged);

/* For the connection's queue of requests waiting for their answer's reservation (conn_admit):
 * the link, the bytes r waits for, what it was charged already; req_resume runs r once its
 * reservation is charged, req_abandon ends it without an answer (its connection closed). */
req *req_parked_next(req *r);
void req_set_parked_next(req *r, req *next);
size_t req_parked_bytes(req *r);
size_t req_charged(req *r);
size_t req_method_index(req *r);
void req_resume(req *r);
void req_abandon(req *r);

/* req_close_after makes r's connection close once r's answer is sent (call before ending
 * r). */
void req_close_after(req *r);

/* req_is_again tells whether r runs a second time (its first answer did not fit what was
 * left of the budgets, and it waited): handlers that count something per request
 * (accesses) count it once. */
bool req_is_again(req *r);

/* Accessors. */
server *req_server(req *r);
worker *req_worker(req *r);
db_pool *req_db(req *r);
const conn_auth *req_auth(req *r);
const char *req_method(req *r);

/* req_tls_client_cert tells whether the request's connection presented a TLS client
 * certificate that tls_ca_file verified. */
bool req_tls_client_cert(req *r);

/* req_arg returns the bound value of the method's i-th parameter, or NULL when absent. */
const msgpack_object *req_arg(req *r, size_t i);

/* req_set_auth changes who the request's connection is (auth). */
void req_set_auth(req *r, const conn_auth *a);

/* req_alloc returns n bytes that live as long as the request, or NULL when out of memory
 * (the caller fails the request with RPC_INTERNAL or RPC_INVALID_ARGUMENT). */
void *req_alloc(req *r, size_t n);

/* req_arena returns the arena req_alloc allocates from, for modules that take an arena. */
arena *req_arena(req *r);

/* req_on_free registers fn(arg) to run when the request ends (after its response is
 * written), last registered first: for references and buffers a handler holds across
 * asynchronous steps. Returns 0 or -ENOMEM (fn will not run: release now and fail). */
int req_on_free(req *r, void (*fn)(void *arg), void *arg);

/* req_strdup copies a msgpack string into the arena, NUL-terminated. */
char *req_strdup(req *r, const msgpack_object *o);

/* req_state / req_set_state keep one pointer of handler state across async steps. */
void *req_state(req *r);
void req_set_state(req *r, void *st);

/* req_result begins the success response and returns the packer for exactly one object. */
msgpack_packer *req_result(req *r);

/* req_done sends the packed result and ends the request. An answer that did not fit the
 * connection's budgets is not sent: over max_result_bytes the request fails with
 * result_too_large (limit, size); otherwise the handler runs again from the start once that
 * much fits (its cleanups run and its arena is emptied first; a write's answer always fits:
 * its change is committed). */
void req_done(req *r);

/* req_fail ends the request with an error (the printf-style message goes to the client:
 * never put secrets in it). */
void req_fail(req *r, rpc_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* req_fail_details is req_fail with extra fields in the error map. */
void req_fail_details(req *r, rpc_code code, const rpc_detail *d, size_t nd, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* req_fail_db ends the request for a failed database job: DB_UNAVAILABLE becomes
 * unavailable; SQLSTATEs of the EGxxx class map to their codes; anything else is
 * internal (logged, not shown to the client). */
void req_fail_db(req *r, const db_result *res);

/* req_set_next keeps one continuation of the handler across an asynchronous step that
 * knows only the request (an admission); req_continue runs it (once). */
void req_set_next(req *r, void (*next)(req *r));
void req_continue(req *r);

/* req_submit runs a database job for the request; cb(r, res) runs later on this thread.
 * When the job cannot even be queued the request fails with unavailable and cb never
 * runs. rls_tenant: the tenant for row-level security, or -1. */
void req_submit(req *r, int64_t rls_tenant, const db_query *qs, int nq,
                void (*cb)(req *r, const db_result *res));

/* A write (a method flagged M_WRITE) with rls_tenant >= 0 goes through req_submit with a
 * short lock_timeout (write_lock_probe_ms) and, when its tenant's row is held by another
 * transaction, again on the worker's lane with write_lock_wait_ms (req.c): no write waits
 * for a lock in a pipeline other tenants share, and one tenant's stuck lock costs the others
 * at most one probe. A write that waited write_lock_wait_ms fails with unavailable.
 *
 * req_submit_lane sends a job to the lane of r's tenant directly (one job of a tenant at a
 * time, in order): for writes known to meet a held lock (a store group's refusal). cb always
 * runs (once, later), with the job's result; a write that waited write_lock_wait_ms in vain
 * reports DB_ERROR with SQLSTATE 55P03 and a message for the client (req_fail_db answers it
 * unavailable), and so do its tenant's writes queued behind it. */
void req_submit_lane(req *r, int64_t rls_tenant, const db_query *qs, int nq,
                     void (*cb)(req *r, const db_result *res));

/* req_tenant_blocked tells whether r's tenant's writes go to the lane now (its lock was held
 * elsewhere lately, or one of its writes is there); req_tenant_mark_blocked says its lock
 * was found held (a store group's probe timed out): its writes go to the lane until one
 * succeeds there or write_lock_wait_ms has passed. */
bool req_tenant_blocked(req *r);
void req_tenant_mark_blocked(req *r);

/* req_lanes_fini frees what a worker's lane map holds (worker_lanes), once its pools are
 * destroyed. */
struct idmap;
void req_lanes_fini(struct idmap *lanes);

/* req_submit_read runs a read-only job of the request's tenant (row-level security bound to
 * it), on a hot standby when pg_read_dsn is set and the standby is consistent with this
 * process, else on the primary; cb(r, res) sees the results of qs only, as with req_submit.
 *
 * The standby runs SQL_READ_FLOOR first, in the same transaction: the tenant's change
 * number as the standby has replayed it. The answer is used only when that number reaches
 * tenants_read_floor (every change this process's index holds, wrote or was told of); each
 * later statement of the job sees a snapshot at least as new, so it misses none of them.
 * Otherwise, when no standby connection is ready, or when the standby's job fails (a
 * recovery conflict, a lost connection), the same job runs again on the primary
 * (engram_db_read_fallbacks_total counts why). At most DB_MAX_QUERIES - 1 queries. */
void req_submit_read(req *r, const db_query *qs, int nq, void (*cb)(req *r, const db_result *res));

#endif
