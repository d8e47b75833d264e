/* server/net/http.c: the HTTP port's listener and its GET endpoints (see http.h). */
#include "http.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "climits.h"
#include "hooks.h"
#include "log.h"
#include "metrics.h"
#include "tls.h"
#include "worker.h"

struct http_srv {
    server *srv;
    struct evconnlistener *listener;
    struct event *ev_relisten;
    unsigned next_worker;
};

/* GET /healthz: start-up finished, not draining, every worker's database connection ready,
 * the change listener connected, the indexes preloaded. Unchanged since before the JSON
 * API; /readyz is the narrower readiness check. */
static int on_healthz(server *s, struct evbuffer *b)
{
    bool started = atomic_load(&s->ready);
    bool draining = atomic_load(&s->draining);
    unsigned ready = metrics_db_ready();
    bool db = ready >= s->nworkers;
    hook_health hh = {0};
    if (s->hooks && s->hooks->health)
        s->hooks->health(s, &hh);
    bool listener = hh.listener, indexes = hh.indexes;
    bool ok = started && !draining && db && listener && indexes;
    evbuffer_add_printf(b,
                        "{\"status\":\"%s\",\"started\":%s,\"draining\":%s,\"database\":\"%s\","
                        "\"db_connections_ready\":%u,\"change_listener\":\"%s\","
                        "\"indexes\":\"%s\"}\n",
                        ok ? "ok" : "unavailable", started ? "true" : "false",
                        draining ? "true" : "false", db ? "up" : "down", ready,
                        listener ? "up" : "down", indexes ? "loaded" : "loading");
    return ok ? 200 : 503;
}

/* How long a write's vain wait for a lock keeps /readyz degraded, and a job that waited
 * db_queue_timeout_ms for a connection keeps it unavailable. */
#define READY_WINDOW_MS 60000
#define SATURATED_WINDOW_MS 10000

/* What /readyz reports, computed once for it and for /metrics. */
typedef struct readiness {
    const char *reason; /* why not ready (503), or NULL */
    bool degraded;      /* ready, but a tenant's writes waited in vain for a lock lately */
    bool db, indexes;
    unsigned db_ready;
    uint64_t oldest_wait_ms, stuck_ago_ms;
    int64_t stuck_tenant;
} readiness;

/* May this process take traffic? Start-up finished, not draining, the indexes loaded, the
 * database reachable (every worker holds a ready connection) and not saturated (no request
 * waited db_queue_timeout_ms for a connection in the last 10 s): else a reason.
 * "degraded" names a tenant whose writes waited write_lock_wait_ms in vain for a lock
 * another transaction holds in the last minute: the process serves everyone else. */
static void get_readiness(server *s, readiness *r)
{
    *r = (readiness){0};
    bool started = atomic_load(&s->ready);
    bool draining = atomic_load(&s->draining);
    r->db_ready = metrics_db_ready();
    r->db = r->db_ready >= s->nworkers;
    hook_health hh = {0};
    if (s->hooks && s->hooks->health)
        s->hooks->health(s, &hh);
    r->indexes = hh.indexes;
    r->reason = !started      ? "starting up"
                : draining    ? "shutting down"
                : !r->db      ? "database unreachable"
                : !r->indexes ? "indexes loading"
                              : NULL;
    /* writes that queue beyond their timeout: the pool is saturated (503); one tenant's
     * writes that waited in vain for a lock held elsewhere: degraded (200, the others are
     * served) */
    uint64_t now = server_mono_ns() / 1000000u, last_timeout = 0;
    metrics_db_wait(&r->oldest_wait_ms, &last_timeout);
    uint64_t qt = (uint64_t)s->cfg.db_queue_timeout_ms;
    bool saturated =
        r->oldest_wait_ms >= qt || (last_timeout && now - last_timeout < SATURATED_WINDOW_MS);
    if (!r->reason && saturated)
        r->reason = "database requests queue beyond db_queue_timeout_ms";
    uint64_t stuck = metrics_write_lock_stuck_since(&r->stuck_tenant);
    r->degraded = !r->reason && stuck && now - stuck < READY_WINDOW_MS;
    r->stuck_ago_ms = stuck ? now - stuck : 0;
}

/* GET /readyz: get_readiness as JSON; 503 with the first reason when not ready, 200 when
 * ready or degraded. */
static int on_readyz(server *s, struct evbuffer *b)
{
    readiness r;
    get_readiness(s, &r);
    evbuffer_add_printf(b, "{\"status\":\"%s\",",
                        r.reason     ? "unavailable"
                        : r.degraded ? "degraded"
                                     : "ready");
    if (r.reason)
        evbuffer_add_printf(b, "\"reason\":\"%s\",", r.reason);
    if (r.degraded)
        evbuffer_add_printf(b,
                            "\"reason\":\"writes of tenant %lld waited write_lock_wait_ms for a "
                            "lock another transaction holds, %llu s ago\",",
                            (long long)r.stuck_tenant, (unsigned long long)(r.stuck_ago_ms / 1000));
    evbuffer_add_printf(b,
                        "\"database\":\"%s\",\"db_connections_ready\":%u,\"db_oldest_wait_ms\":"
                        "%llu,\"indexes\":\"%s\"}\n",
                        r.db ? "up" : "down", r.db_ready, (unsigned long long)r.oldest_wait_ms,
                        r.indexes ? "loaded" : "loading");
    return r.reason ? 503 : 200;
}

/* GET /livez: the process is alive; answered by a worker's event loop, so an answer at all
 * means that loop runs. */
static int on_livez(server *s, struct evbuffer *b)
{
    (void)s;
    evbuffer_add_printf(b, "{\"status\":\"alive\"}\n");
    return 200;
}

/* GET /metrics: metrics_render, readiness as /readyz sees it, the ports' connections
 * against their limits, the TLS certificate's expiry, the bytes buffered for clients, and
 * the hooks' own (indexes, row cache). */
static int on_metrics(server *s, struct evbuffer *b)
{
    readiness r;
    get_readiness(s, &r);
    const metrics_gauge g[] = {
        {"engram_ready",
         "1 when /readyz answers 200 (ready, or degraded for one tenant's writes), 0 when it "
         "answers 503.",
         r.reason ? 0 : 1},
        {"engram_write_lock_degraded",
         "1 while /readyz says degraded: a tenant's writes waited write_lock_wait_ms in vain "
         "for a lock another transaction holds, in the last minute.",
         r.degraded ? 1 : 0},
    };
    metrics_render(b, g, sizeof(g) / sizeof(g[0]));
    evbuffer_add_printf(
        b,
        "# HELP engram_port_connections Open connections by port (counted at accept; the "
        "slots reserved past the limit for the admin key or the probes count too).\n"
        "# TYPE engram_port_connections gauge\n"
        "engram_port_connections{port=\"rpc\"} %d\nengram_port_connections{port=\"http\"} %d\n"
        "# HELP engram_port_connections_max Connections a port accepts before refusing new "
        "ones: max_connections (lowered to fit the descriptor limit) and "
        "http_max_connections.\n"
        "# TYPE engram_port_connections_max gauge\n"
        "engram_port_connections_max{port=\"rpc\"} %d\n"
        "engram_port_connections_max{port=\"http\"} %d\n",
        atomic_load(&s->nconns), atomic_load(&s->nhttp), s->cfg.max_connections,
        s->cfg.http_max_connections);
    if (s->tls)
        evbuffer_add_printf(b,
                            "# HELP engram_tls_certificate_expiry_timestamp_seconds When the "
                            "certificate served to new connections expires (Unix time).\n"
                            "# TYPE engram_tls_certificate_expiry_timestamp_seconds gauge\n"
                            "engram_tls_certificate_expiry_timestamp_seconds %lld\n",
                            (long long)tls_not_after(s->tls));
    evbuffer_add_printf(b,
                        "# HELP engram_client_buffered_bytes Bytes held for clients across all "
                        "connections: unsent answers, answers being packed, requests in "
                        "progress and incoming messages (max_output_total_bytes and its "
                        "eighth for idle connections bound it).\n"
                        "# TYPE engram_client_buffered_bytes gauge\n"
                        "engram_client_buffered_bytes %zu\n",
                        s->limits_cl ? climits_buffered_total(s->limits_cl) : 0);
    if (s->hooks && s->hooks->metrics)
        s->hooks->metrics(s, b);
    return 200;
}

/* GET /metrics/history: the last hour of the figures the web console charts. */
static int on_history(server *s, struct evbuffer *b)
{
    (void)s;
    metrics_history_render(b);
    return 200;
}

static int on_openapi(server *s, struct evbuffer *b)
{
    if (!s->hooks || !s->hooks->openapi)
        return 404;
    return s->hooks->openapi(s, b) == 0 ? 200 : 500;
}

/* The GET endpoints, by exact path. */
static const struct {
    const char *path;
    int (*fn)(server *s, struct evbuffer *b);
    const char *ctype;
} routes[] = {
    {"/healthz", on_healthz, "application/json"},
    {"/livez", on_livez, "application/json"},
    {"/metrics", on_metrics, "text/plain; version=0.0.4"},
    {"/metrics/history", on_history, "application/json"},
    {"/readyz", on_readyz, "application/json"},
    {"/v1/openapi.json", on_openapi, "application/json"},
};

int http_get(server *s, const char *path, size_t n, struct evbuffer *body, const char **ctype)
{
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strlen(routes[i].path) == n && memcmp(routes[i].path, path, n) == 0) {
            *ctype = routes[i].ctype;
            return routes[i].fn(s, body);
        }
    }
    return 0;
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *addr, int len,
                      void *arg)
{
    http_srv *h = arg;
    worker_accept(h->srv, fd, addr, &h->next_worker, true);
}

static void on_relisten(evutil_socket_t fd, short what, void *arg)
{
    http_srv *h = arg;
    if (h->listener && !atomic_load(&h->srv->draining))
        evconnlistener_enable(h->listener);
}

/* On EMFILE/ENFILE the listener would spin on the pending connection: pause it briefly. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    http_srv *h = arg;
    log_warn("HTTP port: accept failed: %s; pausing for 100 ms", strerror(EVUTIL_SOCKET_ERROR()));
    evconnlistener_disable(l);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    evtimer_add(h->ev_relisten, &tv);
}

http_srv *http_start(server *s, struct event_base *base, const char *host, int port, char *err,
                     size_t errlen)
{
    struct sockaddr_storage ss;
    int sslen = sizeof(ss);
    char hostport[300];
    snprintf(hostport, sizeof(hostport), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    if (evutil_parse_sockaddr_port(hostport, (struct sockaddr *)&ss, &sslen) < 0) {
        snprintf(err, errlen, "listen_host '%s' is not an IP address", host);
        return NULL;
    }
    http_srv *h = calloc(1, sizeof(*h));
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->srv = s;
    h->ev_relisten = evtimer_new(base, on_relisten, h);
    h->listener =
        evconnlistener_new_bind(base, on_accept, h, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 1024,
                                (struct sockaddr *)&ss, sslen);
    if (!h->listener || !h->ev_relisten) {
        snprintf(err, errlen, "cannot bind HTTP port %s: %s", hostport, strerror(errno));
        http_stop(h);
        return NULL;
    }
    evconnlistener_set_error_cb(h->listener, on_accept_error);
    return h;
}

void http_stop_accepting(http_srv *h)
{
    if (h && h->listener)
        evconnlistener_disable(h->listener);
}

void http_stop(http_srv *h)
{
    if (!h)
        return;
    if (h->listener)
        evconnlistener_free(h->listener);
    if (h->ev_relisten)
        event_free(h->ev_relisten);
    free(h);
}
