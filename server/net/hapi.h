/* server/net/hapi.h: HTTP/1.1 on a connection of the HTTP port: the JSON API and the GET
 * endpoints.
 *
 * A connection accepted on the HTTP port is an ordinary connection (conn.c: worker thread,
 * TLS, deadlines, backpressure, limits) whose bytes are HTTP instead of MessagePack-RPC.
 * POST /v1/rpc/{method} turns its JSON body into the MessagePack-RPC request
 * [0, msgid, method, [params]] and hands it to req_dispatch like any other message: the same
 * method table, validation, tenancy, quotas and rate limits. The answer comes back through
 * conn_write as a MessagePack-RPC response and leaves as JSON with an HTTP status.
 *
 * The bearer key authenticates each request: when the connection is not already
 * authenticated with that very key, an `auth` request runs first through the same path (a
 * barrier, as on the RPC port), and its identity stays cached on the connection for the
 * next request that carries the same key.
 *
 * Requests on one connection are answered in order, one at a time: a pipelined request
 * waits in the input buffer until the answer before it is written.
 *
 * Everything runs on the connection's worker thread.
 */
#ifndef ENGRAM_SERVER_HAPI_H
#define ENGRAM_SERVER_HAPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"

typedef struct hapi hapi;

/* What the connection's read loop does after hapi_step. */
enum {
    HAPI_AGAIN = 0, /* consumed something: call again */
    HAPI_MORE,      /* a request is incomplete: read more input, then call again */
    HAPI_BUSY,      /* a request is in progress: call again once it finished */
    HAPI_CLOSE,     /* an answer was written; close the connection once it is sent */
};

/* hapi_create returns the HTTP state of connection c, or NULL when out of memory.
 * hapi_destroy frees it (NULL is a no-op). */
hapi *hapi_create(conn *c);
void hapi_destroy(hapi *h);

/* hapi_step handles what it can of the len input bytes at in: a complete request is
 * answered or dispatched. Sets *consumed to the bytes used (they may be dropped by the
 * caller). Returns one of the HAPI_ values above. */
int hapi_step(hapi *h, const uint8_t *in, size_t len, size_t *consumed);

/* hapi_on_response takes the MessagePack-RPC response (len bytes) of a request hapi
 * dispatched (called by conn_write) and writes the HTTP answer. */
void hapi_on_response(hapi *h, const void *data, size_t len);

/* hapi_had_request tells whether a whole request has arrived on the connection yet. */
bool hapi_had_request(hapi *h);

/* hapi_timeout writes 408 for a request that did not arrive in time and returns true (the
 * caller closes after the flush); false when an answer is still due (close at once). */
bool hapi_timeout(hapi *h);

#endif
