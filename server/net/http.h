/* server/net/http.h: the HTTP side port: GET /healthz and GET /metrics.
 *
 * Served by libevent's evhttp on the main thread's loop. /healthz answers 200 only when
 * start-up has finished (migrations applied, indexes loadable), every worker has a ready
 * database connection and the change listener is connected; otherwise 503 with the
 * reasons. /metrics is the Prometheus text exposition.
 */
#ifndef ENGRAM_SERVER_HTTP_H
#define ENGRAM_SERVER_HTTP_H

#include "server.h"

struct event_base;
typedef struct http_srv http_srv;

/* http_start binds host:port on base. Returns NULL with err on failure. */
http_srv *http_start(server *s, struct event_base *base, const char *host, int port, char *err,
                     size_t errlen);

/* http_stop closes the port. NULL is a no-op. */
void http_stop(http_srv *h);

#endif
