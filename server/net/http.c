/* server/net/http.c: the HTTP port's listener and its GET endpoints (see http.h). */
#include "http.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "bg.h"
#include "climits.h"
#include "log.h"
#include "metrics.h"
#include "openapi.h"
#include "rowcache.h"
#include "tenants.h"
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
    bool listener = s->bg && bg_listener_ok(s->bg);
    bool indexes = s->tenants && tenants_preloaded(s->tenants);
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

/* GET /readyz: may this process take traffic? Start-up finished, not draining, the indexes
 * loaded, the database reachable (every worker holds a ready connection) and not saturated
 * (no request waited db_queue_timeout_ms for a connection in the last 10 s): else 503,
 * naming the first reason. "degraded" (200) names a tenant whose writes waited
 * write_lock_wait_ms in vain for a lock another transaction holds in the last minute: the
 * process serves everyone else. */
static int on_readyz(server *s, struct evbuffer *b)
{
    bool started = atomic_load(&s->ready);
    bool draining = atomic_load(&s->draining);
    unsigned ready = metrics_db_ready();
    bool db = ready >= s->nworkers;
    bool indexes = s->tenants && tenants_preloaded(s->tenants);
    const char *reason = !started   ? "starting up"
                         : draining ? "shutting down"
                         : !db      ? "database unreachable"
                         : !indexes ? "indexes loading"
                                    : NULL;
    /* writes that queue beyond their timeout: the pool is saturated (503); one tenant's
     * writes that waited in vain for a lock held elsewhere: degraded (200, the others are
     * served) */
    uint64_t now = server_mono_ns() / 1000000u, oldest = 0, last_timeout = 0;
    metrics_db_wait(&oldest, &last_timeout);
    uint64_t qt = (uint64_t)s->cfg.db_queue_timeout_ms;
    bool saturated = oldest >= qt || (last_timeout && now - last_timeout < SATURATED_WINDOW_MS);
    if (!reason && saturated)
        reason = "database requests queue beyond db_queue_timeout_ms";
    int64_t stuck_tenant = 0;
    uint64_t stuck = metrics_write_lock_stuck_since(&stuck_tenant);
    bool degraded = !reason && stuck && now - stuck < READY_WINDOW_MS;
    evbuffer_add_printf(b, "{\"status\":\"%s\",",
                        reason     ? "unavailable"
                        : degraded ? "degraded"
                                   : "ready");
    if (reason)
        evbuffer_add_printf(b, "\"reason\":\"%s\",", reason);
    if (degraded)
        evbuffer_add_printf(b,
                            "\"reason\":\"writes of tenant %lld waited write_lock_wait_ms for a "
                            "lock another transaction holds, %llu s ago\",",
                            (long long)stuck_tenant, (unsigned long long)((now - stuck) / 1000));
    evbuffer_add_printf(b,
                        "\"database\":\"%s\",\"db_connections_ready\":%u,\"db_oldest_wait_ms\":"
                        "%llu,\"indexes\":\"%s\"}\n",
                        db ? "up" : "down", ready, (unsigned long long)oldest,
                        indexes ? "loaded" : "loading");
    return reason ? 503 : 200;
}

/* GET /livez: the process is alive; answered by a worker's event loop, so an answer at all
 * means that loop runs. */
static int on_livez(server *s, struct evbuffer *b)
{
    (void)s;
    evbuffer_add_printf(b, "{\"status\":\"alive\"}\n");
    return 200;
}

static int on_metrics(server *s, struct evbuffer *b)
{
    tenants_metrics tm = {0};
    if (s->tenants)
        tenants_stats(s->tenants, &tm);
    uint64_t rc_entries, rc_bytes, rc_hits, rc_misses;
    rc_stats(s->rows, &rc_entries, &rc_bytes, &rc_hits, &rc_misses);
    /* resident memory from /proc/self/statm (second field, in pages) */
    double rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long size, res;
        if (fscanf(f, "%lu %lu", &size, &res) == 2)
            rss = (double)res * (double)sysconf(_SC_PAGESIZE);
        fclose(f);
    }
    const char *names[] = {"engram_indexes_loaded",
                           "engram_index_vectors",
                           "engram_index_bytes",
                           "engram_index_budget_bytes",
                           "engram_index_tenants_known",
                           "engram_indexes_flat",
                           "engram_indexes_sq8",
                           "engram_indexes_ann",
                           "engram_process_resident_bytes",
                           "engram_index_rows_mapped_bytes",
                           "engram_index_rows_resident_bytes",
                           "engram_index_page_ins"};
    double vals[] = {(double)tm.loaded,      (double)tm.vectors,       (double)tm.bytes,
                     (double)tm.budget,      (double)tm.known,         (double)tm.by_kind[0],
                     (double)tm.by_kind[1],  (double)tm.by_kind[2],    rss,
                     (double)tm.rows_mapped, (double)tm.rows_resident, (double)tm.page_ins};
    metrics_render(b, names, vals, sizeof(vals) / sizeof(vals[0]));
    if (s->tls)
        evbuffer_add_printf(b,
                            "# HELP engram_tls_certificate_expiry_timestamp_seconds When the "
                            "certificate served to new connections expires (Unix time).\n"
                            "# TYPE engram_tls_certificate_expiry_timestamp_seconds gauge\n"
                            "engram_tls_certificate_expiry_timestamp_seconds %lld\n",
                            (long long)tls_not_after(s->tls));
    evbuffer_add_printf(
        b,
        "# HELP engram_index_loads_total Index loads by source: a snapshot plus the changes "
        "after it, or every memory in the database.\n"
        "# TYPE engram_index_loads_total counter\n"
        "engram_index_loads_total{source=\"snapshot\"} %llu\n"
        "engram_index_loads_total{source=\"database\"} %llu\n"
        "# HELP engram_index_snapshots_rejected_total Snapshots found unusable (corrupt, "
        "stale or older than the change log) and rebuilt from the database.\n"
        "# TYPE engram_index_snapshots_rejected_total counter\n"
        "engram_index_snapshots_rejected_total %llu\n"
        "# HELP engram_index_snapshots_written_total Index snapshots written.\n"
        "# TYPE engram_index_snapshots_written_total counter\n"
        "engram_index_snapshots_written_total %llu\n"
        "# HELP engram_index_evictions_total Indexes unloaded to stay within the memory "
        "budget.\n# TYPE engram_index_evictions_total counter\n"
        "engram_index_evictions_total %llu\n"
        "# HELP engram_index_rebuilds_total Background index rebuilds (deleted vectors "
        "dropped, structure changed).\n# TYPE engram_index_rebuilds_total counter\n"
        "engram_index_rebuilds_total %llu\n"
        "# HELP engram_row_cache_entries Memory rows cached for search results.\n"
        "# TYPE engram_row_cache_entries gauge\nengram_row_cache_entries %llu\n"
        "# HELP engram_row_cache_bytes Bytes of cached memory rows.\n"
        "# TYPE engram_row_cache_bytes gauge\nengram_row_cache_bytes %llu\n"
        "# HELP engram_row_cache_lookups_total Row cache lookups by result.\n"
        "# TYPE engram_row_cache_lookups_total counter\n"
        "engram_row_cache_lookups_total{result=\"hit\"} %llu\n"
        "engram_row_cache_lookups_total{result=\"miss\"} %llu\n"
        "# HELP engram_row_cache_prewarmed_rows_total Rows read into the row cache after index "
        "loads (row_cache_prewarm_percent).\n"
        "# TYPE engram_row_cache_prewarmed_rows_total counter\n"
        "engram_row_cache_prewarmed_rows_total %llu\n",
        (unsigned long long)tm.snapshot_loads, (unsigned long long)tm.database_loads,
        (unsigned long long)tm.snapshots_rejected, (unsigned long long)tm.snapshots_written,
        (unsigned long long)tm.evictions, (unsigned long long)tm.rebuilds,
        (unsigned long long)rc_entries, (unsigned long long)rc_bytes, (unsigned long long)rc_hits,
        (unsigned long long)rc_misses, (unsigned long long)tm.rows_warmed);
    evbuffer_add_printf(b,
                        "# HELP engram_client_buffered_bytes Bytes held for clients across all "
                        "connections: unsent answers, answers being packed, requests in "
                        "progress and incoming messages (max_output_total_bytes and its "
                        "eighth for idle connections bound it).\n"
                        "# TYPE engram_client_buffered_bytes gauge\n"
                        "engram_client_buffered_bytes %zu\n",
                        s->limits_cl ? climits_buffered_total(s->limits_cl) : 0);
    evbuffer_add_printf(
        b, "# HELP engram_index_recall_estimate Recall@10 of searches as the recall monitor "
           "measures it, over the loaded indexes of a kind (exact kinds are 1): the lowest and "
           "the mean.\n# TYPE engram_index_recall_estimate gauge\n"
           "engram_index_recall_estimate{kind=\"flat\",stat=\"min\"} 1\n"
           "engram_index_recall_estimate{kind=\"sq8\",stat=\"min\"} 1\n");
    if (tm.recall_measured)
        evbuffer_add_printf(b,
                            "engram_index_recall_estimate{kind=\"ann\",stat=\"min\"} %.4f\n"
                            "engram_index_recall_estimate{kind=\"ann\",stat=\"mean\"} %.4f\n",
                            tm.recall_min, tm.recall_sum / (double)tm.recall_measured);
    evbuffer_add_printf(
        b,
        "# HELP engram_index_recall_measured Approximate indexes with a recall estimate.\n"
        "# TYPE engram_index_recall_measured gauge\nengram_index_recall_measured %llu\n"
        "# HELP engram_index_exact_fallbacks Approximate indexes searching exactly because no "
        "candidate depth reached the recall target.\n"
        "# TYPE engram_index_exact_fallbacks gauge\nengram_index_exact_fallbacks %llu\n"
        "# HELP engram_index_recall_probes_total Probe queries the recall monitor ran.\n"
        "# TYPE engram_index_recall_probes_total counter\nengram_index_recall_probes_total %llu\n"
        "# HELP engram_index_recall_probe_seconds_total Time the recall monitor spent.\n"
        "# TYPE engram_index_recall_probe_seconds_total counter\n"
        "engram_index_recall_probe_seconds_total %.6f\n",
        (unsigned long long)tm.recall_measured, (unsigned long long)tm.exact_fallbacks,
        (unsigned long long)tm.recall_probes, (double)tm.recall_probe_ns / 1e9);
    static const char *const sources[2] = {"snapshot", "database"};
    evbuffer_add_printf(b, "# HELP engram_index_load_duration_seconds Time from a tenant's first "
                           "use (or the start-up preload) to its index being ready, by source.\n"
                           "# TYPE engram_index_load_duration_seconds histogram\n");
    for (int src = 0; src < 2; src++) {
        uint64_t cum = 0;
        for (size_t i = 0; i < TENANTS_LOAD_BUCKETS; i++) {
            cum += tm.load_hist[src][i];
            if (i < TENANTS_LOAD_BUCKETS - 1)
                evbuffer_add_printf(
                    b, "engram_index_load_duration_seconds_bucket{source=\"%s\",le=\"%g\"} %llu\n",
                    sources[src], tenants_load_bounds_s[i], (unsigned long long)cum);
            else
                evbuffer_add_printf(
                    b,
                    "engram_index_load_duration_seconds_bucket{source=\"%s\",le=\"+Inf\"} %llu\n",
                    sources[src], (unsigned long long)cum);
        }
        evbuffer_add_printf(b,
                            "engram_index_load_duration_seconds_sum{source=\"%s\"} %.6f\n"
                            "engram_index_load_duration_seconds_count{source=\"%s\"} %llu\n",
                            sources[src], (double)tm.load_us[src] / 1e6, sources[src],
                            (unsigned long long)cum);
    }
    return 200;
}

static int on_openapi(server *s, struct evbuffer *b)
{
    return openapi_render(s, b) == 0 ? 200 : 500;
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
