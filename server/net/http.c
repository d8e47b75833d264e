/* server/net/http.c: /healthz and /metrics (see http.h). */
#include "http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "bg.h"
#include "climits.h"
#include "console.h"
#include "metrics.h"
#include "rowcache.h"
#include "tenants.h"
#include "tls.h"

struct http_srv {
    server *srv;
    struct evhttp *http;
};

static void reply(struct evhttp_request *rq, int code, const char *reason, const char *ctype,
                  struct evbuffer *body)
{
    evhttp_add_header(evhttp_request_get_output_headers(rq), "Content-Type", ctype);
    evhttp_send_reply(rq, code, reason, body);
}

/* With TLS on, every connection gets a TLS bufferevent (make_bev); evhttp falls back to a
 * plain one only when that could not be made (out of memory). Such a connection is
 * answered nothing but an error: the port never serves plain HTTP. */
static bool refuse_plain(http_srv *h, struct evhttp_request *rq)
{
    if (!h->srv->tls)
        return false;
    struct evhttp_connection *ec = evhttp_request_get_connection(rq);
    struct bufferevent *bev = ec ? evhttp_connection_get_bufferevent(ec) : NULL;
    if (bev && bufferevent_openssl_get_ssl(bev))
        return false;
    evhttp_send_error(rq, 503, "TLS session unavailable");
    return true;
}

/* Every connection's bufferevent is made here and owns its socket (BEV_OPT_CLOSE_ON_FREE),
 * so libevent removes the socket's events before it closes the socket. With evhttp's own
 * bufferevent, evhttp closes the socket first and the deferred removal then calls epoll_ctl
 * on the closed descriptor number, which another thread (a snapshot file, the stray-file
 * sweep) may already have reused; ThreadSanitizer reports that as a race. With TLS on, the
 * bufferevent is a TLS one. */
static struct bufferevent *make_bev(struct event_base *base, void *arg)
{
    http_srv *h = arg;
    if (!h->srv->tls)
        return bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    struct ssl_st *ssl = tls_session_new(h->srv->tls);
    if (!ssl)
        return NULL;
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    if (bev)
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

static void on_healthz(struct evhttp_request *rq, void *arg)
{
    http_srv *h = arg;
    server *s = h->srv;
    if (refuse_plain(h, rq))
        return;
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        evhttp_send_error(rq, 500, "out of memory");
        return;
    }
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
    reply(rq, ok ? 200 : 503, ok ? "OK" : "Service Unavailable", "application/json", b);
    evbuffer_free(b);
}

static void on_metrics(struct evhttp_request *rq, void *arg)
{
    http_srv *h = arg;
    if (refuse_plain(h, rq))
        return;
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        evhttp_send_error(rq, 500, "out of memory");
        return;
    }
    tenants_metrics tm = {0};
    if (h->srv->tenants)
        tenants_stats(h->srv->tenants, &tm);
    uint64_t rc_entries, rc_bytes, rc_hits, rc_misses;
    rc_stats(h->srv->rows, &rc_entries, &rc_bytes, &rc_hits, &rc_misses);
    /* resident memory from /proc/self/statm (second field, in pages) */
    double rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long size, res;
        if (fscanf(f, "%lu %lu", &size, &res) == 2)
            rss = (double)res * (double)sysconf(_SC_PAGESIZE);
        fclose(f);
    }
    const char *names[] = {
        "engram_indexes_loaded",     "engram_index_vectors",       "engram_index_bytes",
        "engram_index_budget_bytes", "engram_index_tenants_known", "engram_indexes_flat",
        "engram_indexes_sq8",        "engram_indexes_ann",         "engram_process_resident_bytes"};
    double vals[] = {(double)tm.loaded,     (double)tm.vectors,    (double)tm.bytes,
                     (double)tm.budget,     (double)tm.known,      (double)tm.by_kind[0],
                     (double)tm.by_kind[1], (double)tm.by_kind[2], rss};
    metrics_render(b, names, vals, sizeof(vals) / sizeof(vals[0]));
    if (h->srv->tls)
        evbuffer_add_printf(b,
                            "# HELP engram_tls_certificate_expiry_timestamp_seconds When the "
                            "certificate served to new connections expires (Unix time).\n"
                            "# TYPE engram_tls_certificate_expiry_timestamp_seconds gauge\n"
                            "engram_tls_certificate_expiry_timestamp_seconds %lld\n",
                            (long long)tls_not_after(h->srv->tls));
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
        "engram_row_cache_lookups_total{result=\"miss\"} %llu\n",
        (unsigned long long)tm.snapshot_loads, (unsigned long long)tm.database_loads,
        (unsigned long long)tm.snapshots_rejected, (unsigned long long)tm.snapshots_written,
        (unsigned long long)tm.evictions, (unsigned long long)tm.rebuilds,
        (unsigned long long)rc_entries, (unsigned long long)rc_bytes, (unsigned long long)rc_hits,
        (unsigned long long)rc_misses);
    evbuffer_add_printf(b,
                        "# HELP engram_client_buffered_bytes Unsent answers and incoming "
                        "messages buffered across all connections (max_output_total_bytes "
                        "bounds it).\n# TYPE engram_client_buffered_bytes gauge\n"
                        "engram_client_buffered_bytes %zu\n",
                        h->srv->limits_cl ? climits_buffered_total(h->srv->limits_cl) : 0);
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
    reply(rq, 200, "OK", "text/plain; version=0.0.4", b);
    evbuffer_free(b);
}

static void on_other(struct evhttp_request *rq, void *arg)
{
    if (refuse_plain(arg, rq))
        return;
    if (console_serve(rq))
        return;
    evhttp_send_error(rq, 404, "not found: try /healthz or /metrics");
}

http_srv *http_start(server *s, struct event_base *base, const char *host, int port, char *err,
                     size_t errlen)
{
    http_srv *h = calloc(1, sizeof(*h));
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->srv = s;
    h->http = evhttp_new(base);
    if (!h->http) {
        snprintf(err, errlen, "out of memory");
        free(h);
        return NULL;
    }
    evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_max_headers_size(h->http, 16384);
    evhttp_set_max_body_size(h->http, 0);
    evhttp_set_timeout(h->http, 10);
    evhttp_set_cb(h->http, "/healthz", on_healthz, h);
    evhttp_set_cb(h->http, "/readyz", on_healthz, h); /* the same checks, by the usual name */
    evhttp_set_cb(h->http, "/metrics", on_metrics, h);
    evhttp_set_gencb(h->http, on_other, h);
    evhttp_set_bevcb(h->http, make_bev, h);
    if (!evhttp_bind_socket_with_handle(h->http, host, (ev_uint16_t)port)) {
        snprintf(err, errlen, "cannot bind HTTP port %s:%d", host, port);
        evhttp_free(h->http);
        free(h);
        return NULL;
    }
    return h;
}

void http_stop(http_srv *h)
{
    if (!h)
        return;
    evhttp_free(h->http);
    free(h);
}
