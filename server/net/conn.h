/* server/net/conn.h: one client connection: reading, framing, backpressure, writing.
 *
 * A connection lives on one worker thread. Complete messages are handed to req_dispatch;
 * responses come back through conn_write, possibly out of order. A connection is
 * reference-counted: each request in flight holds a reference, so a request that finishes
 * after its client went away finds a closed connection and drops its response.
 */
#ifndef ENGRAM_SERVER_CONN_H
#define ENGRAM_SERVER_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker.h"

struct req;

/* Who a connection is authenticated as. A connection starts unauthenticated. */
typedef struct conn_auth {
    bool authenticated;
    bool admin;
    int64_t tenant_id;
    int64_t key_id;
    int tier; /* tier_id */
    uint32_t dim;
    char provider[16];
    int64_t embed_gen; /* tenants.embed_gen of dim and provider: the model's generation (a
                        * re-embedding moves a tenant to the next one; hooks.tenant_admit
                        * brings a connection authenticated before up to date) */
    bool claimed;      /* the key's place is counted already (tenancy_key_claim): conn_set_auth
                        * does not count it again */
    bool reserved;     /* accepted into the slots kept for the admin (admin_reserved_connections):
                        * only the admin key may authenticate on it */
} conn_auth;

/* conn_create wraps fd (taking ownership) on worker w; the connection releases addr_key (see
 * climits_addr_take) when it closes. http: the connection speaks HTTP/1.1 (the HTTP port,
 * hapi.h) instead of MessagePack-RPC. reserved: accepted past its port's connection limit,
 * into the slots kept for the admin (only the admin key may authenticate on it) or for the
 * probes (it serves the health and metrics endpoints only). Returns NULL (fd closed, key
 * not released) on failure. */
conn *conn_create(worker *w, int fd, uint64_t addr_key, bool http, bool reserved);

/* conn_ref / conn_unref manage the references requests hold. */
void conn_ref(conn *c);
void conn_unref(conn *c);

/* conn_alive tells whether the socket is still open (responses can still be sent). */
bool conn_alive(conn *c);

/* conn_write appends a response to the output; dropped when the connection is closed. On an
 * HTTP connection the response (a MessagePack-RPC message) goes to hapi_on_response, which
 * writes its HTTP form with conn_send. */
void conn_write(conn *c, const void *data, size_t len);

/* conn_send appends len bytes to the output as they are (closes the connection when out of
 * memory; dropped when it is closed). */
void conn_send(conn *c, const void *data, size_t len);

/* conn_dispatch hands one complete MessagePack-RPC message of c to req_dispatch, counting
 * it in flight and charging it to the budgets (hapi.c; conn.c's own loop does the same).
 * Returns req_dispatch's result. */
int conn_dispatch(conn *c, const uint8_t *msg, size_t len);

/* Budgets. Everything a connection's requests hold while in progress (their messages, their
 * decoded values, their answers as they are packed) is charged to the connection, against
 * max_output_bytes together with its unsent output, and to the process, against
 * max_output_total_bytes (climits). A request is charged its message, its values and a
 * reservation for its answer when it is dispatched; until that fits, the connection
 * dispatches nothing more and reads nothing more.
 *
 * conn_charge_more charges bytes more to a request's answer as it grows: returns true, or
 * false (nothing charged) when either budget would pass its limit. conn_charge_force
 * charges them whatever the budgets say (a write's answer must go out: its change is
 * committed). conn_uncharge gives bytes back (also on a closed connection). Worker thread
 * only. */
bool conn_charge_more(conn *c, size_t bytes);
void conn_charge_force(conn *c, size_t bytes);
void conn_uncharge(conn *c, size_t bytes);

/* Answers' reservations, learnt per method (midx: an index in a method table of nmethods
 * entries; SIZE_MAX for none) and connection.
 *
 * conn_answer_reserve returns the room to reserve for the answer of a request of method
 * midx about to run on c: at least need, at least the size of that method's recent answers
 * on c (a decaying maximum) and 32 KiB, at most max_result_bytes.
 *
 * conn_admit charges bytes for request r's answer before its handler runs. own: what r was
 * charged already (its message), which does not stop an otherwise idle connection from
 * having it. Returns true when charged: the caller runs r. Otherwise r is parked, after any
 * request parked before it, and the connection reads nothing more; once the budgets hold
 * bytes for it, or the connection closes, the connection calls req_resume(r) or
 * req_abandon(r). Until c has seen one answer of a method, only 8 requests of it run at once
 * (a pipelined burst waits for one answer's size before hundreds of large answers are asked
 * of the database). conn_admit_force charges and counts a request that never waits (a write,
 * an auth).
 *
 * conn_answer_done tells c that an admitted request of midx ended; measured: its answer was
 * packed, bytes long (learnt for the next reservations). Worker thread only. */
size_t conn_answer_reserve(conn *c, size_t midx, size_t nmethods, size_t need);
bool conn_admit(conn *c, struct req *r, size_t midx, size_t bytes, size_t own);
void conn_admit_force(conn *c, size_t midx, size_t bytes);
void conn_answer_done(conn *c, size_t midx, size_t bytes, bool measured);

/* conn_server returns the server c belongs to. */
server *conn_server(conn *c);

/* conn_request_finished tells c that one of its requests completed (resumes reading if
 * it was paused at the in-flight limit). */
void conn_request_finished(conn *c);

/* conn_close closes the socket now (unsent output is dropped). */
void conn_close(conn *c);

/* conn_close_after_flush stops reading and closes once the output is sent. */
void conn_close_after_flush(conn *c);

/* conn_stop_reading stops reading requests (shutdown drain). */
void conn_stop_reading(conn *c);

/* conn_tick enforces the message deadline and idle timeout; now is monotonic ms. */
void conn_tick(conn *c, uint64_t now_ms);

/* conn_output_pending returns the unsent output bytes. */
size_t conn_output_pending(conn *c);

/* conn_get_auth / conn_set_auth read and change who the connection is. */
const conn_auth *conn_get_auth(conn *c);
void conn_set_auth(conn *c, const conn_auth *a);

/* conn_hold makes c dispatch no further request until conn_release: requests that follow
 * an identity change (auth) in the stream must run as the identity it establishes, whatever
 * the pipelining. conn_release dispatches the messages that waited. Worker thread only. */
void conn_hold(conn *c);
void conn_release(conn *c);

/* conn_hold_decode makes c dispatch no further message while one is decoded off the loop
 * (req.c), so that messages keep their order around an identity change; conn_release_decode
 * ends that and dispatches what waited. Worker thread only. */
void conn_hold_decode(conn *c);
void conn_release_decode(conn *c);

/* conn_tls_client_cert tells whether c is a TLS connection whose client presented a
 * certificate that tls_ca_file verified (see tls_admin_require_client_cert). */
bool conn_tls_client_cert(conn *c);

/* conn_worker returns the worker that owns c. */
worker *conn_worker(conn *c);

/* conn_next iterates a worker's list (worker.c owns the list head). */
conn *conn_next(conn *c);
void conn_link(conn **head, conn *c);
void conn_unlink(conn **head, conn *c);

#endif
