/* server/net/worker.h: worker threads, each with its own libevent loop and database pool.
 *
 * The main thread accepts connections and hands each to a worker, round robin; from then
 * on the connection and every request on it live on that worker's thread. Other threads
 * reach a worker only through worker_post.
 */
#ifndef ENGRAM_SERVER_WORKER_H
#define ENGRAM_SERVER_WORKER_H

#include <stdbool.h>
#include <sys/socket.h>

#include "db.h"
#include "server.h"

struct event_base;
typedef struct worker worker;
typedef struct conn conn;

/* worker_create prepares worker idx (event base, database pool, mailbox) without starting
 * its thread. Returns NULL when out of memory. */
worker *worker_create(server *s, unsigned idx);

/* worker_start runs the worker's loop on a new thread. Returns 0 or -errno. */
int worker_start(worker *w);

/* worker_drain asks the worker (from any thread) to stop reading new requests, finish what
 * is in flight (waiting at most shutdown_timeout_ms), close its connections and leave its
 * loop. */
void worker_drain(worker *w);

/* worker_join waits for the worker's loop to end (after worker_drain). */
void worker_join(worker *w);

/* worker_destroy finishes leftover work (mailbox, database callbacks) and frees w. Call
 * after every thread that posts to w has stopped. NULL is a no-op. */
void worker_destroy(worker *w);

/* worker_post runs fn(arg) on w's thread soon. Safe from any thread. Returns 0 or -ENOMEM
 * (fn does not run then). */
int worker_post(worker *w, void (*fn)(void *arg), void *arg);

/* worker_poster returns w as a thread others post work to (server.h), for modules that know
 * no worker. */
server_poster worker_poster(worker *w);

/* worker_adopt hands a freshly accepted socket to w (any thread); w owns fd from now on, and
 * the connection releases addr_key (climits_addr_take) when it closes. http: a connection of
 * the HTTP port; reserved: accepted past its port's limit, into the slots kept for the
 * admin (RPC) or the probes (HTTP) (conn_create). */
int worker_adopt(worker *w, int fd, uint64_t addr_key, bool http, bool reserved);

/* Connections the HTTP port accepts past http_max_connections, for the health and metrics
 * endpoints only. */
#define HTTP_PROBE_RESERVE 16

/* worker_accept admits a socket accepted on the RPC port (http false) under max_connections
 * (then admin_reserved_connections more, reserved for the admin key) or the HTTP port under
 * http_max_connections (then HTTP_PROBE_RESERVE more, for the health and metrics endpoints),
 * and max_connections_per_address on both, refusing it (closed, counted) past them, and
 * hands it to the next worker, round robin (*next). Takes ownership of fd. Main thread (the
 * listeners' loop). */
void worker_accept(server *s, int fd, const struct sockaddr *addr, unsigned *next, bool http);

/* Accessors, valid on the worker's thread. */
struct event_base *worker_base(worker *w);
db_pool *worker_db(worker *w);
/* worker_lane_db returns the worker's lane: a pool of two connections that run one job each
 * at a time, for writes that wait for a tenant's row lock (held by a transaction
 * elsewhere), so that no wait sits in a pipeline other tenants share, and a second tenant's
 * wait does not queue behind the first's. */
db_pool *worker_lane_db(worker *w);

/* worker_read_db returns the pool of hot standbys (pg_read_dsn), or NULL when none is set. */
db_pool *worker_read_db(worker *w);
server *worker_server(worker *w);
unsigned worker_index(worker *w);

/* worker_conn_added / worker_conn_removed keep the worker's connection list (conn.c). */
void worker_conn_added(worker *w, conn *c);
void worker_conn_removed(worker *w, conn *c);

/* worker_req_started / worker_req_finished count requests in flight (req.c). */
void worker_req_started(worker *w);
void worker_req_finished(worker *w);

/* worker_lanes returns the map of the tenants whose writes wait for their lock on the
 * worker's lane (req.c); worker thread only. */
struct idmap *worker_lanes(worker *w);

/* worker_app / worker_set_app keep what the hooks keep per worker (hooks.h, worker_init);
 * worker thread only once the worker runs. */
void *worker_app(worker *w);
void worker_set_app(worker *w, void *app);

/* worker_draining tells whether the worker has begun shutting down. */
bool worker_draining(worker *w);

#endif
