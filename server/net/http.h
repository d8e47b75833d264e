/* server/net/http.h: the HTTP port: its listener and its GET endpoints.
 *
 * The port binds next to the RPC port (listen_host, http_port) and speaks TLS whenever the
 * RPC port does. Its connections are ordinary connections of the workers (conn.c, hapi.c)
 * under the limits the RPC port uses, counted against the same max_connections and
 * max_connections_per_address. Paths:
 *
 *   POST /v1/rpc/{method}   the JSON API (hapi.c)
 *   GET  /v1/openapi.json   its OpenAPI 3.1 description (openapi.c)
 *   GET  /healthz           every dependency up: start-up done, each worker's database
 *                           connection ready, the change listener connected, indexes loaded
 *   GET  /readyz            may take traffic: started, not draining, database reachable,
 *                           indexes loaded; 503 with a JSON reason otherwise
 *   GET  /livez             the process's event loops run (always 200)
 *   GET  /metrics           the Prometheus text exposition
 */
#ifndef ENGRAM_SERVER_HTTP_H
#define ENGRAM_SERVER_HTTP_H

#include <stddef.h>

#include "server.h"

struct event_base;
struct evbuffer;
typedef struct http_srv http_srv;

/* http_start binds host:port on base (the main thread's loop, which accepts; workers serve).
 * Returns NULL with err on failure. */
http_srv *http_start(server *s, struct event_base *base, const char *host, int port, char *err,
                     size_t errlen);

/* http_stop_accepting stops taking new connections (shutdown); NULL is a no-op. */
void http_stop_accepting(http_srv *h);

/* http_stop closes the port. NULL is a no-op. */
void http_stop(http_srv *h);

/* http_get answers a GET of path (n bytes, no query) into body with its content type in
 * *ctype. Returns the HTTP status, or 0 when no endpoint has that path. Any thread. */
int http_get(server *s, const char *path, size_t n, struct evbuffer *body, const char **ctype);

#endif
