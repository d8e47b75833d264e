/* server/core/metrics.c: counters, histograms and the Prometheus exposition (see metrics.h). */
#include "metrics.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>

#include "buildinfo.h"
#include "procstat.h"
#include "rowerr.h"

/* Latency bucket upper bounds in microseconds; the last bucket is +Inf. */
static const uint64_t bucket_us[] = {50,     100,     250,     500,     1000,   2500,
                                     5000,   10000,   25000,   50000,   100000, 250000,
                                     500000, 1000000, 2500000, 10000000};
#define NBUCKETS (sizeof(bucket_us) / sizeof(bucket_us[0]) + 1)
#define MAX_WORKERS 256

typedef struct method_stats {
    atomic_uint_fast64_t by_code[RPC_CODE_COUNT];
    atomic_uint_fast64_t buckets[NBUCKETS];
    atomic_uint_fast64_t sum_us;
} method_stats;

typedef struct db_slot {
    atomic_uint connections, ready;
    atomic_size_t queued, inflight;
    atomic_uint_fast64_t reconnects, failures;
    atomic_uint_fast64_t oldest_wait_ms, queue_timeouts, last_timeout_ms;
} db_slot;

static const char *const *method_names;
static size_t nmethods;
static method_stats *stats; /* nmethods + 1: the last is for unknown methods */
static atomic_long open_conns;
static atomic_uint_fast64_t refused, malformed, slow_closed, apply_failures;
static atomic_uint_fast64_t answers_deferred, answers_refused, budget_waits, offloop_decodes;
static atomic_uint_fast64_t write_locks[METRICS_LOCK__COUNT];
static atomic_uint_fast64_t stuck_ms;
static atomic_int_fast64_t stuck_tenant;
static atomic_uint_fast64_t tls_handshake_failures, tls_reloads_ok, tls_reloads_failed;
static atomic_uint_fast64_t config_reloads_ok, config_reloads_failed;
static atomic_uint_fast64_t gc_batches, gc_requests, gc_tenants, qa_reservations;
/* consolidation runs by trigger (0 schedule, 1 on demand) and result (0 ok, 1 busy, 2 failed) */
static atomic_uint_fast64_t cons_runs[2][3], cons_ms, cons_actions[4];
/* extraction runs by trigger and result, their facts by action; dream passes by outcome */
static atomic_uint_fast64_t ext_runs[3][6], ext_facts[4], dream_passes[6];
static db_slot db_slots[MAX_WORKERS];
/* reads that may use a standby: by target (standby, primary), fallbacks by reason; the
 * standby pools' connections and ready ones per worker */
static atomic_uint_fast64_t db_reads[2], db_read_fallbacks[METRICS_FALLBACK__COUNT];
static atomic_uint rdb_connections[MAX_WORKERS], rdb_ready[MAX_WORKERS];

/* One sample of the history (metrics_history_sample). */
typedef struct hist_sample {
    int64_t t_ms;
    uint64_t requests, errors, dur_count, dur_sum_us;
    uint64_t buckets[NBUCKETS]; /* cumulative, summed over methods */
    double index_bytes, index_budget, index_vectors, resident;
} hist_sample;

static pthread_mutex_t hist_mu = PTHREAD_MUTEX_INITIALIZER;
static hist_sample *hist; /* a ring of hist_cap, hist_n used, the next at hist_next */
static size_t hist_cap, hist_n, hist_next;
static unsigned hist_step_s;

int metrics_init(const char *const *names, size_t n)
{
    stats = calloc(n + 1, sizeof(*stats));
    if (!stats)
        return -ENOMEM;
    method_names = names;
    nmethods = n;
    return 0;
}

void metrics_fini(void)
{
    free(stats);
    stats = NULL;
    nmethods = 0;
    pthread_mutex_lock(&hist_mu);
    free(hist);
    hist = NULL;
    hist_cap = hist_n = hist_next = 0;
    pthread_mutex_unlock(&hist_mu);
}

int metrics_history_init(unsigned step_s)
{
    size_t cap = 3600 / (step_s ? step_s : 1) + 1; /* an hour, both ends included */
    hist_sample *h = calloc(cap, sizeof(*h));
    if (!h)
        return -ENOMEM;
    pthread_mutex_lock(&hist_mu);
    free(hist);
    hist = h;
    hist_cap = cap;
    hist_n = hist_next = 0;
    hist_step_s = step_s;
    pthread_mutex_unlock(&hist_mu);
    return 0;
}

void metrics_history_sample(int64_t now_ms, double index_bytes, double index_budget_bytes,
                            double index_vectors)
{
    hist_sample x = {.t_ms = now_ms,
                     .index_bytes = index_bytes,
                     .index_budget = index_budget_bytes,
                     .index_vectors = index_vectors};
    for (size_t i = 0; stats && i <= nmethods; i++) {
        for (int c = 0; c < RPC_CODE_COUNT; c++) {
            uint64_t v = atomic_load_explicit(&stats[i].by_code[c], memory_order_relaxed);
            x.requests += v;
            if (c != RPC_OK)
                x.errors += v;
        }
        uint64_t cum = 0;
        for (size_t b = 0; b < NBUCKETS; b++) {
            cum += atomic_load_explicit(&stats[i].buckets[b], memory_order_relaxed);
            x.buckets[b] += cum;
        }
        x.dur_count += cum;
        x.dur_sum_us += atomic_load_explicit(&stats[i].sum_us, memory_order_relaxed);
    }
    procstat p;
    if (procstat_read(&p) == 0)
        x.resident = (double)p.resident_bytes;
    pthread_mutex_lock(&hist_mu);
    if (hist) {
        hist[hist_next] = x;
        hist_next = (hist_next + 1) % hist_cap;
        if (hist_n < hist_cap)
            hist_n++;
    }
    pthread_mutex_unlock(&hist_mu);
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void metrics_history_render(struct evbuffer *out)
{
    pthread_mutex_lock(&hist_mu);
    evbuffer_add_printf(out, "{\"now\":%lld,\"step_s\":%u,\"le\":[", (long long)wall_ms(),
                        hist_step_s);
    for (size_t b = 0; b + 1 < NBUCKETS; b++)
        evbuffer_add_printf(out, "%g,", (double)bucket_us[b] / 1e6);
    evbuffer_add_printf(out, "\"+Inf\"],\"samples\":[");
    for (size_t k = 0; k < hist_n; k++) {
        const hist_sample *x = &hist[(hist_next + hist_cap - hist_n + k) % hist_cap];
        evbuffer_add_printf(out,
                            "%s{\"t\":%lld,\"requests\":%llu,\"errors\":%llu,"
                            "\"duration_count\":%llu,\"duration_sum\":%.6f,\"buckets\":[",
                            k ? "," : "", (long long)x->t_ms, (unsigned long long)x->requests,
                            (unsigned long long)x->errors, (unsigned long long)x->dur_count,
                            (double)x->dur_sum_us / 1e6);
        for (size_t b = 0; b < NBUCKETS; b++)
            evbuffer_add_printf(out, "%s%llu", b ? "," : "", (unsigned long long)x->buckets[b]);
        evbuffer_add_printf(out,
                            "],\"index_bytes\":%.0f,\"index_budget_bytes\":%.0f,"
                            "\"index_vectors\":%.0f,\"resident_bytes\":%.0f}",
                            x->index_bytes, x->index_budget, x->index_vectors, x->resident);
    }
    evbuffer_add_printf(out, "]}\n");
    pthread_mutex_unlock(&hist_mu);
}

void metrics_request(size_t method, rpc_code code, uint64_t latency_us)
{
    if (!stats)
        return;
    method_stats *m = &stats[method < nmethods ? method : nmethods];
    if ((unsigned)code >= RPC_CODE_COUNT)
        code = RPC_INTERNAL;
    atomic_fetch_add_explicit(&m->by_code[code], 1, memory_order_relaxed);
    size_t b = 0;
    while (b < NBUCKETS - 1 && latency_us > bucket_us[b])
        b++;
    atomic_fetch_add_explicit(&m->buckets[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->sum_us, latency_us, memory_order_relaxed);
}

void metrics_connections(int delta)
{
    atomic_fetch_add_explicit(&open_conns, delta, memory_order_relaxed);
}

void metrics_conn_refused(void)
{
    atomic_fetch_add_explicit(&refused, 1, memory_order_relaxed);
}

void metrics_slow_closed(void)
{
    atomic_fetch_add_explicit(&slow_closed, 1, memory_order_relaxed);
}

void metrics_answer_deferred(void)
{
    atomic_fetch_add_explicit(&answers_deferred, 1, memory_order_relaxed);
}

void metrics_answer_refused(void)
{
    atomic_fetch_add_explicit(&answers_refused, 1, memory_order_relaxed);
}

void metrics_write_lock(metrics_lock_outcome o)
{
    if ((unsigned)o < METRICS_LOCK__COUNT)
        atomic_fetch_add_explicit(&write_locks[o], 1, memory_order_relaxed);
}

void metrics_write_lock_stuck(int64_t tenant)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    atomic_store_explicit(&stuck_tenant, tenant, memory_order_relaxed);
    atomic_store_explicit(&stuck_ms,
                          (uint_fast64_t)ts.tv_sec * 1000u + (uint_fast64_t)ts.tv_nsec / 1000000u,
                          memory_order_relaxed);
}

uint64_t metrics_write_lock_stuck_since(int64_t *tenant)
{
    *tenant = atomic_load_explicit(&stuck_tenant, memory_order_relaxed);
    return atomic_load_explicit(&stuck_ms, memory_order_relaxed);
}

void metrics_budget_wait(void)
{
    atomic_fetch_add_explicit(&budget_waits, 1, memory_order_relaxed);
}

void metrics_decoded_off_loop(void)
{
    atomic_fetch_add_explicit(&offloop_decodes, 1, memory_order_relaxed);
}

void metrics_tls_handshake_failed(void)
{
    atomic_fetch_add_explicit(&tls_handshake_failures, 1, memory_order_relaxed);
}

void metrics_tls_reload(bool ok)
{
    atomic_fetch_add_explicit(ok ? &tls_reloads_ok : &tls_reloads_failed, 1, memory_order_relaxed);
}

void metrics_config_reload(bool ok)
{
    atomic_fetch_add_explicit(ok ? &config_reloads_ok : &config_reloads_failed, 1,
                              memory_order_relaxed);
}

void metrics_query_reservation(void)
{
    atomic_fetch_add_explicit(&qa_reservations, 1, memory_order_relaxed);
}

void metrics_group_commit(size_t requests, size_t tenants)
{
    atomic_fetch_add_explicit(&gc_batches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&gc_requests, requests, memory_order_relaxed);
    atomic_fetch_add_explicit(&gc_tenants, tenants, memory_order_relaxed);
}

void metrics_consolidation(bool scheduled, int status, uint64_t merged, uint64_t superseded,
                           uint64_t archived, uint64_t rescored, uint64_t duration_ms)
{
    int result = status == 0 ? 0 : status > 0 ? 1 : 2;
    atomic_fetch_add_explicit(&cons_runs[scheduled ? 0 : 1][result], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&cons_ms, duration_ms, memory_order_relaxed);
    const uint64_t n[4] = {merged, superseded, archived, rescored};
    for (int i = 0; i < 4; i++)
        atomic_fetch_add_explicit(&cons_actions[i], n[i], memory_order_relaxed);
}

void metrics_extraction(int trigger, int result, uint64_t added, uint64_t updated,
                        uint64_t unchanged, uint64_t dropped)
{
    if (trigger < 0 || trigger > 2 || result < 0 || result > 5)
        return;
    atomic_fetch_add_explicit(&ext_runs[trigger][result], 1, memory_order_relaxed);
    const uint64_t n[4] = {added, updated, unchanged, dropped};
    for (int i = 0; i < 4; i++)
        atomic_fetch_add_explicit(&ext_facts[i], n[i], memory_order_relaxed);
}

void metrics_dream(int outcome)
{
    if (outcome >= 0 && outcome < 6)
        atomic_fetch_add_explicit(&dream_passes[outcome], 1, memory_order_relaxed);
}

void metrics_malformed(void)
{
    atomic_fetch_add_explicit(&malformed, 1, memory_order_relaxed);
}

void metrics_index_apply_failed(void)
{
    atomic_fetch_add_explicit(&apply_failures, 1, memory_order_relaxed);
}

void metrics_db_read_publish(unsigned worker, unsigned connections, unsigned ready)
{
    if (worker >= MAX_WORKERS)
        return;
    atomic_store_explicit(&rdb_connections[worker], connections, memory_order_relaxed);
    atomic_store_explicit(&rdb_ready[worker], ready, memory_order_relaxed);
}

void metrics_db_read(metrics_read_target target)
{
    atomic_fetch_add_explicit(&db_reads[target == METRICS_READ_STANDBY ? 0 : 1], 1,
                              memory_order_relaxed);
}

void metrics_db_read_fallback(metrics_read_fallback reason)
{
    if ((unsigned)reason < METRICS_FALLBACK__COUNT)
        atomic_fetch_add_explicit(&db_read_fallbacks[reason], 1, memory_order_relaxed);
}

void metrics_db_publish(unsigned worker, unsigned connections, unsigned ready, size_t queued,
                        size_t inflight, uint64_t reconnects, uint64_t failures)
{
    if (worker >= MAX_WORKERS)
        return;
    db_slot *s = &db_slots[worker];
    atomic_store_explicit(&s->connections, connections, memory_order_relaxed);
    atomic_store_explicit(&s->ready, ready, memory_order_relaxed);
    atomic_store_explicit(&s->queued, queued, memory_order_relaxed);
    atomic_store_explicit(&s->inflight, inflight, memory_order_relaxed);
    atomic_store_explicit(&s->reconnects, reconnects, memory_order_relaxed);
    atomic_store_explicit(&s->failures, failures, memory_order_relaxed);
}

void metrics_db_wait_publish(unsigned worker, uint64_t oldest_wait_ms, uint64_t queue_timeouts)
{
    if (worker >= MAX_WORKERS)
        return;
    db_slot *s = &db_slots[worker];
    atomic_store_explicit(&s->oldest_wait_ms, oldest_wait_ms, memory_order_relaxed);
    if (atomic_exchange_explicit(&s->queue_timeouts, queue_timeouts, memory_order_relaxed) <
        queue_timeouts) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        atomic_store_explicit(&s->last_timeout_ms,
                              (uint_fast64_t)ts.tv_sec * 1000u +
                                  (uint_fast64_t)ts.tv_nsec / 1000000u,
                              memory_order_relaxed);
    }
}

void metrics_db_wait(uint64_t *oldest_wait_ms, uint64_t *last_timeout_ms)
{
    *oldest_wait_ms = *last_timeout_ms = 0;
    for (unsigned i = 0; i < MAX_WORKERS; i++) {
        uint64_t w = atomic_load_explicit(&db_slots[i].oldest_wait_ms, memory_order_relaxed);
        uint64_t t = atomic_load_explicit(&db_slots[i].last_timeout_ms, memory_order_relaxed);
        if (w > *oldest_wait_ms)
            *oldest_wait_ms = w;
        if (t > *last_timeout_ms)
            *last_timeout_ms = t;
    }
}

unsigned metrics_db_ready(void)
{
    unsigned n = 0;
    for (unsigned i = 0; i < MAX_WORKERS; i++)
        n += atomic_load_explicit(&db_slots[i].ready, memory_order_relaxed);
    return n;
}

/* Requests by method and code, errors, and their latency histograms. */
static void render_requests(struct evbuffer *out)
{
    evbuffer_add_printf(out,
                        "# HELP engram_requests_total Requests (MessagePack-RPC and HTTP/JSON, "
                        "including the auth an HTTP bearer key runs once per connection) by "
                        "method and result code.\n# TYPE engram_requests_total counter\n");
    for (size_t i = 0; stats && i <= nmethods; i++) {
        const char *name = i < nmethods ? method_names[i] : "unknown";
        for (int c = 0; c < RPC_CODE_COUNT; c++) {
            uint64_t v = atomic_load_explicit(&stats[i].by_code[c], memory_order_relaxed);
            if (v)
                evbuffer_add_printf(out, "engram_requests_total{method=\"%s\",code=\"%s\"} %llu\n",
                                    name, c == RPC_OK ? "ok" : rpc_code_name((rpc_code)c),
                                    (unsigned long long)v);
        }
    }
    evbuffer_add_printf(out,
                        "# HELP engram_errors_total Requests (RPC and HTTP/JSON) that returned "
                        "an error, by method and code.\n# TYPE engram_errors_total counter\n");
    for (size_t i = 0; stats && i <= nmethods; i++) {
        const char *name = i < nmethods ? method_names[i] : "unknown";
        for (int c = 1; c < RPC_CODE_COUNT; c++) {
            uint64_t v = atomic_load_explicit(&stats[i].by_code[c], memory_order_relaxed);
            if (v)
                evbuffer_add_printf(out, "engram_errors_total{method=\"%s\",code=\"%s\"} %llu\n",
                                    name, rpc_code_name((rpc_code)c), (unsigned long long)v);
        }
    }
    evbuffer_add_printf(out, "# HELP engram_request_duration_seconds Latency (RPC and HTTP/JSON) "
                             "from the message's arrival to its response, by method.\n"
                             "# TYPE engram_request_duration_seconds histogram\n");
    for (size_t i = 0; stats && i <= nmethods; i++) {
        const char *name = i < nmethods ? method_names[i] : "unknown";
        uint64_t cum = 0, counts[NBUCKETS];
        for (size_t b = 0; b < NBUCKETS; b++) {
            counts[b] = atomic_load_explicit(&stats[i].buckets[b], memory_order_relaxed);
            cum += counts[b];
        }
        if (!cum)
            continue;
        cum = 0;
        for (size_t b = 0; b < NBUCKETS; b++) {
            cum += counts[b];
            if (b < NBUCKETS - 1)
                evbuffer_add_printf(
                    out,
                    "engram_request_duration_seconds_bucket{method=\"%s\",le=\"%g\"}"
                    " %llu\n",
                    name, (double)bucket_us[b] / 1e6, (unsigned long long)cum);
            else
                evbuffer_add_printf(
                    out,
                    "engram_request_duration_seconds_bucket{method=\"%s\",le=\"+Inf\"}"
                    " %llu\n",
                    name, (unsigned long long)cum);
        }
        evbuffer_add_printf(out, "engram_request_duration_seconds_sum{method=\"%s\"} %.6f\n", name,
                            (double)atomic_load_explicit(&stats[i].sum_us, memory_order_relaxed) /
                                1e6);
        evbuffer_add_printf(out, "engram_request_duration_seconds_count{method=\"%s\"} %llu\n",
                            name, (unsigned long long)cum);
    }
}

/* Connections, budgets, write lock waits, TLS and reloads. */
static void render_connections(struct evbuffer *out)
{
    evbuffer_add_printf(out,
                        "# HELP engram_connections Open client connections (RPC and HTTP).\n"
                        "# TYPE engram_connections gauge\nengram_connections %ld\n"
                        "# HELP engram_connections_refused_total Connections refused at "
                        "max_connections or max_connections_per_address.\n"
                        "# TYPE engram_connections_refused_total counter\n"
                        "engram_connections_refused_total %llu\n"
                        "# HELP engram_connections_closed_slow_total Connections closed for "
                        "not authenticating in time, sending too slowly, or not reading their "
                        "answers while the server's buffers were over budget.\n"
                        "# TYPE engram_connections_closed_slow_total counter\n"
                        "engram_connections_closed_slow_total %llu\n"
                        "# HELP engram_malformed_messages_total Connections closed for a "
                        "malformed or hostile message.\n"
                        "# TYPE engram_malformed_messages_total counter\n"
                        "engram_malformed_messages_total %llu\n",
                        (long)atomic_load(&open_conns), (unsigned long long)atomic_load(&refused),
                        (unsigned long long)atomic_load(&slow_closed),
                        (unsigned long long)atomic_load(&malformed));
    evbuffer_add_printf(out,
                        "# HELP engram_messages_decoded_off_loop_total Large messages "
                        "(256 KiB or 65,536 values and over) decoded and checked on the decode "
                        "threads (decode_threads), not on a worker's event loop.\n"
                        "# TYPE engram_messages_decoded_off_loop_total counter\n"
                        "engram_messages_decoded_off_loop_total %llu\n",
                        (unsigned long long)atomic_load(&offloop_decodes));
    evbuffer_add_printf(out,
                        "# HELP engram_output_budget_waits_total Times a connection stopped "
                        "dispatching because its next request did not fit max_output_bytes or "
                        "max_output_total_bytes (a reader slower than its answers is "
                        "throttled this way).\n"
                        "# TYPE engram_output_budget_waits_total counter\n"
                        "engram_output_budget_waits_total %llu\n"
                        "# HELP engram_answers_deferred_total Answers that did not fit what was "
                        "left of the budgets when packed: their requests ran again once they "
                        "fitted.\n"
                        "# TYPE engram_answers_deferred_total counter\n"
                        "engram_answers_deferred_total %llu\n"
                        "# HELP engram_answers_refused_total Answers over max_result_bytes, "
                        "refused with result_too_large.\n"
                        "# TYPE engram_answers_refused_total counter\n"
                        "engram_answers_refused_total %llu\n",
                        (unsigned long long)atomic_load(&budget_waits),
                        (unsigned long long)atomic_load(&answers_deferred),
                        (unsigned long long)atomic_load(&answers_refused));
    evbuffer_add_printf(
        out,
        "# HELP engram_write_lock_waits_total Writes that met their tenant's row lock held by "
        "another transaction: moved off the shared connection after write_lock_probe_ms "
        "(probe_timeout), then on the worker's lane got the lock (lane_ok) or waited "
        "write_lock_wait_ms in vain (lane_timeout, refused 'unavailable').\n"
        "# TYPE engram_write_lock_waits_total counter\n"
        "engram_write_lock_waits_total{outcome=\"probe_timeout\"} %llu\n"
        "engram_write_lock_waits_total{outcome=\"lane_ok\"} %llu\n"
        "engram_write_lock_waits_total{outcome=\"lane_timeout\"} %llu\n",
        (unsigned long long)atomic_load(&write_locks[METRICS_LOCK_PROBE_TIMEOUT]),
        (unsigned long long)atomic_load(&write_locks[METRICS_LOCK_LANE_OK]),
        (unsigned long long)atomic_load(&write_locks[METRICS_LOCK_LANE_TIMEOUT]));
    evbuffer_add_printf(out,
                        "# HELP engram_tls_handshake_failures_total TLS handshakes on the RPC "
                        "port that did not complete: refused (protocol version, certificate), "
                        "broken, or abandoned (a port probe that connects and closes counts).\n"
                        "# TYPE engram_tls_handshake_failures_total counter\n"
                        "engram_tls_handshake_failures_total %llu\n"
                        "# HELP engram_tls_reloads_total Reloads of the TLS certificate files "
                        "(SIGHUP) by result; a failed one keeps the previous certificate.\n"
                        "# TYPE engram_tls_reloads_total counter\n"
                        "engram_tls_reloads_total{result=\"ok\"} %llu\n"
                        "engram_tls_reloads_total{result=\"failed\"} %llu\n",
                        (unsigned long long)atomic_load(&tls_handshake_failures),
                        (unsigned long long)atomic_load(&tls_reloads_ok),
                        (unsigned long long)atomic_load(&tls_reloads_failed));
    evbuffer_add_printf(out,
                        "# HELP engram_config_reloads_total Reloads of the configuration "
                        "(SIGHUP) by result; a failed one (a file with an error) changes "
                        "nothing.\n"
                        "# TYPE engram_config_reloads_total counter\n"
                        "engram_config_reloads_total{result=\"ok\"} %llu\n"
                        "engram_config_reloads_total{result=\"failed\"} %llu\n",
                        (unsigned long long)atomic_load(&config_reloads_ok),
                        (unsigned long long)atomic_load(&config_reloads_failed));
}

/* Memory extraction from transcripts and auto-dream. */
static void render_extraction(struct evbuffer *out)
{
    evbuffer_add_printf(out, "# HELP engram_extraction_runs_total Memory extraction runs by "
                             "trigger and result (no_model: not configured, off or over the "
                             "daily cap; fault: the model or the embedder failed).\n"
                             "# TYPE engram_extraction_runs_total counter\n");
    static const char *const triggers[3] = {"on_demand", "auto", "dream"};
    static const char *const results[6] = {"ok",       "busy",  "not_found",
                                           "no_model", "fault", "failed"};
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 6; r++)
            evbuffer_add_printf(
                out, "engram_extraction_runs_total{trigger=\"%s\",result=\"%s\"} %llu\n",
                triggers[t], results[r], (unsigned long long)atomic_load(&ext_runs[t][r]));
    evbuffer_add_printf(out, "# HELP engram_extraction_facts_total Facts extraction runs "
                             "added, stored as updates, found known, or dropped under the "
                             "confidence floor.\n"
                             "# TYPE engram_extraction_facts_total counter\n");
    static const char *const actions[4] = {"added", "updated", "unchanged", "dropped"};
    for (int i = 0; i < 4; i++)
        evbuffer_add_printf(out, "engram_extraction_facts_total{action=\"%s\"} %llu\n", actions[i],
                            (unsigned long long)atomic_load(&ext_facts[i]));
    evbuffer_add_printf(out, "# HELP engram_dream_passes_total Auto-dream passes by outcome "
                             "(locked: another pass held the tenant's lock).\n"
                             "# TYPE engram_dream_passes_total counter\n");
    static const char *const outcomes[6] = {"ok",         "partial", "no_model",
                                            "taken_over", "failed",  "locked"};
    for (int i = 0; i < 6; i++)
        evbuffer_add_printf(out, "engram_dream_passes_total{outcome=\"%s\"} %llu\n", outcomes[i],
                            (unsigned long long)atomic_load(&dream_passes[i]));
}

/* Group commit, query admission and consolidation. */
static void render_writes(struct evbuffer *out)
{
    evbuffer_add_printf(out,
                        "# HELP engram_group_commit_batches_total Transactions that committed "
                        "a group of writes of any tenants (memory.store and the like).\n"
                        "# TYPE engram_group_commit_batches_total counter\n"
                        "engram_group_commit_batches_total %llu\n"
                        "# HELP engram_group_commit_requests_total Write requests committed in "
                        "those groups (divided by the batches: the mean group size).\n"
                        "# TYPE engram_group_commit_requests_total counter\n"
                        "engram_group_commit_requests_total %llu\n"
                        "# HELP engram_group_commit_tenants_total Tenants in those groups, each "
                        "counted once a group (above the batches: groups held several "
                        "tenants).\n"
                        "# TYPE engram_group_commit_tenants_total counter\n"
                        "engram_group_commit_tenants_total %llu\n"
                        "# HELP engram_query_reservations_total Database round trips of query "
                        "admission: blocks of a daily query limit reserved or given back.\n"
                        "# TYPE engram_query_reservations_total counter\n"
                        "engram_query_reservations_total %llu\n",
                        (unsigned long long)atomic_load(&gc_batches),
                        (unsigned long long)atomic_load(&gc_requests),
                        (unsigned long long)atomic_load(&gc_tenants),
                        (unsigned long long)atomic_load(&qa_reservations));
    evbuffer_add_printf(out, "# HELP engram_consolidation_runs_total Consolidation runs by "
                             "trigger and result (busy: another run held the tenant).\n"
                             "# TYPE engram_consolidation_runs_total counter\n");
    static const char *const triggers[2] = {"schedule", "on_demand"};
    static const char *const results[3] = {"ok", "busy", "failed"};
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < 3; r++)
            evbuffer_add_printf(
                out, "engram_consolidation_runs_total{trigger=\"%s\",result=\"%s\"} %llu\n",
                triggers[t], results[r], (unsigned long long)atomic_load(&cons_runs[t][r]));
    evbuffer_add_printf(out,
                        "# HELP engram_consolidation_seconds_total Time consolidation runs "
                        "took.\n# TYPE engram_consolidation_seconds_total counter\n"
                        "engram_consolidation_seconds_total %.3f\n"
                        "# HELP engram_consolidation_memories_total Memories consolidation "
                        "merged, superseded, archived (pruned) or rescored.\n"
                        "# TYPE engram_consolidation_memories_total counter\n",
                        (double)atomic_load(&cons_ms) / 1e3);
    static const char *const actions[4] = {"merged", "superseded", "archived", "rescored"};
    for (int i = 0; i < 4; i++)
        evbuffer_add_printf(out, "engram_consolidation_memories_total{action=\"%s\"} %llu\n",
                            actions[i], (unsigned long long)atomic_load(&cons_actions[i]));
    render_extraction(out);
}

/* The workers' database pools and the standby reads. */
static void render_db(struct evbuffer *out)
{
    unsigned conns = 0, ready = 0;
    size_t queued = 0, inflight = 0;
    uint64_t reconnects = 0, failures = 0;
    for (unsigned i = 0; i < MAX_WORKERS; i++) {
        conns += atomic_load_explicit(&db_slots[i].connections, memory_order_relaxed);
        ready += atomic_load_explicit(&db_slots[i].ready, memory_order_relaxed);
        queued += atomic_load_explicit(&db_slots[i].queued, memory_order_relaxed);
        inflight += atomic_load_explicit(&db_slots[i].inflight, memory_order_relaxed);
        reconnects += atomic_load_explicit(&db_slots[i].reconnects, memory_order_relaxed);
        failures += atomic_load_explicit(&db_slots[i].failures, memory_order_relaxed);
    }
    evbuffer_add_printf(
        out,
        "# HELP engram_db_pool_connections Database connections configured in worker pools.\n"
        "# TYPE engram_db_pool_connections gauge\nengram_db_pool_connections %u\n"
        "# HELP engram_db_pool_ready Database connections connected and prepared.\n"
        "# TYPE engram_db_pool_ready gauge\nengram_db_pool_ready %u\n"
        "# HELP engram_db_pool_queued Database jobs waiting for a connection.\n"
        "# TYPE engram_db_pool_queued gauge\nengram_db_pool_queued %zu\n"
        "# HELP engram_db_pool_inflight Database jobs sent and not yet answered.\n"
        "# TYPE engram_db_pool_inflight gauge\nengram_db_pool_inflight %zu\n"
        "# HELP engram_db_reconnects_total Database connections re-established after a loss.\n"
        "# TYPE engram_db_reconnects_total counter\nengram_db_reconnects_total %llu\n"
        "# HELP engram_db_unavailable_total Database jobs failed as unavailable.\n"
        "# TYPE engram_db_unavailable_total counter\nengram_db_unavailable_total %llu\n",
        conns, ready, queued, inflight, (unsigned long long)reconnects,
        (unsigned long long)failures);
    uint64_t oldest = 0, timeouts = 0, last_timeout = 0;
    metrics_db_wait(&oldest, &last_timeout);
    for (unsigned i = 0; i < MAX_WORKERS; i++)
        timeouts += atomic_load_explicit(&db_slots[i].queue_timeouts, memory_order_relaxed);
    evbuffer_add_printf(
        out,
        "# HELP engram_db_pool_oldest_wait_seconds How long the oldest database job still "
        "waiting for a connection has waited (the longest over the workers).\n"
        "# TYPE engram_db_pool_oldest_wait_seconds gauge\n"
        "engram_db_pool_oldest_wait_seconds %.3f\n"
        "# HELP engram_db_queue_timeouts_total Database jobs failed for waiting "
        "db_queue_timeout_ms for a connection (the pool is saturated).\n"
        "# TYPE engram_db_queue_timeouts_total counter\nengram_db_queue_timeouts_total %llu\n",
        (double)oldest / 1e3, (unsigned long long)timeouts);
    unsigned rconns = 0, rready = 0;
    for (unsigned i = 0; i < MAX_WORKERS; i++) {
        rconns += atomic_load_explicit(&rdb_connections[i], memory_order_relaxed);
        rready += atomic_load_explicit(&rdb_ready[i], memory_order_relaxed);
    }
    evbuffer_add_printf(
        out,
        "# HELP engram_db_read_pool_connections Standby (pg_read_dsn) connections configured in "
        "worker pools.\n"
        "# TYPE engram_db_read_pool_connections gauge\nengram_db_read_pool_connections %u\n"
        "# HELP engram_db_read_pool_ready Standby connections connected and prepared.\n"
        "# TYPE engram_db_read_pool_ready gauge\nengram_db_read_pool_ready %u\n"
        "# HELP engram_db_reads_total Reads that may use a standby, by where they ran.\n"
        "# TYPE engram_db_reads_total counter\n"
        "engram_db_reads_total{target=\"standby\"} %llu\n"
        "engram_db_reads_total{target=\"primary\"} %llu\n"
        "# HELP engram_db_read_fallbacks_total Reads sent to the primary instead of a standby: "
        "the standby had not replayed what the process knows (behind), or none was usable "
        "(unavailable).\n"
        "# TYPE engram_db_read_fallbacks_total counter\n"
        "engram_db_read_fallbacks_total{reason=\"behind\"} %llu\n"
        "engram_db_read_fallbacks_total{reason=\"unavailable\"} %llu\n",
        rconns, rready, (unsigned long long)atomic_load(&db_reads[0]),
        (unsigned long long)atomic_load(&db_reads[1]),
        (unsigned long long)atomic_load(&db_read_fallbacks[METRICS_FALLBACK_BEHIND]),
        (unsigned long long)atomic_load(&db_read_fallbacks[METRICS_FALLBACK_UNAVAILABLE]));
}

/* Index apply failures and rows that did not parse. */
static void render_rows(struct evbuffer *out)
{
    evbuffer_add_printf(out,
                        "# HELP engram_index_apply_failures_total Changes an index could not "
                        "take (out of memory), read again from the change log.\n"
                        "# TYPE engram_index_apply_failures_total counter\n"
                        "engram_index_apply_failures_total %llu\n",
                        (unsigned long long)atomic_load(&apply_failures));
    evbuffer_add_printf(out, "# HELP engram_rows_unparsable_total Rows read from PostgreSQL with a "
                             "value that does not parse (each also logged), by table.\n"
                             "# TYPE engram_rows_unparsable_total counter\n");
    for (int t = 0; t < ROWERR_TABLE_COUNT; t++)
        evbuffer_add_printf(out, "engram_rows_unparsable_total{table=\"%s\"} %llu\n",
                            rowerr_table_name((rowerr_table)t),
                            (unsigned long long)rowerr_count((rowerr_table)t));
}

/* The process_* metrics of the Prometheus client libraries, from /proc/self (procstat.h),
 * and engram_process_resident_bytes (the same resident size, under the name the dashboard
 * and the benchmarks have read since before process_*). */
static void render_process(struct evbuffer *out)
{
    procstat p;
    if (procstat_read(&p) == 0) {
        evbuffer_add_printf(
            out,
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n"
            "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
            "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %llu\n"
            "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
            "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n"
            "# HELP process_start_time_seconds Start time of the process since unix epoch in "
            "seconds.\n"
            "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.2f\n"
            "# HELP engram_process_resident_bytes Resident memory size in bytes (the same as "
            "process_resident_memory_bytes).\n"
            "# TYPE engram_process_resident_bytes gauge\nengram_process_resident_bytes %llu\n",
            p.cpu_seconds, (unsigned long long)p.resident_bytes,
            (unsigned long long)p.virtual_bytes, p.start_time,
            (unsigned long long)p.resident_bytes);
    }
    if (p.open_fds >= 0)
        evbuffer_add_printf(out,
                            "# HELP process_open_fds Number of open file descriptors.\n"
                            "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n",
                            p.open_fds);
    if (p.max_fds >= 0)
        evbuffer_add_printf(out,
                            "# HELP process_max_fds Maximum number of open file descriptors.\n"
                            "# TYPE process_max_fds gauge\nprocess_max_fds %ld\n",
                            p.max_fds);
}

/* engram_heap_bytes and engram_heap_free_bytes: what the C allocator has handed out and what
 * it holds free (glibc's mallinfo2: every arena, mmapped blocks included). Resident memory
 * minus the first is the code, the stacks, the mapped files and what the allocator keeps;
 * the per-tenant cost of bench/many-tenants.sh is read from the first. mallinfo2 takes each
 * arena's lock for a walk of its free lists: a scrape's cost, not a request's. */
static void render_heap(struct evbuffer *out)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 mi = mallinfo2();
    evbuffer_add_printf(out,
                        "# HELP engram_heap_bytes Bytes the C allocator has handed out and not "
                        "had back (malloc'd blocks, mmapped ones included).\n"
                        "# TYPE engram_heap_bytes gauge\nengram_heap_bytes %llu\n"
                        "# HELP engram_heap_free_bytes Bytes the C allocator holds free in its "
                        "arenas (resident or not).\n"
                        "# TYPE engram_heap_free_bytes gauge\nengram_heap_free_bytes %llu\n",
                        (unsigned long long)(mi.uordblks + mi.hblkhd),
                        (unsigned long long)mi.fordblks);
#else
    (void)out;
#endif
}

/* engram_build_info: 1, with the version and (when built from a git checkout) the commit. */
static void render_build(struct evbuffer *out)
{
    evbuffer_add_printf(out,
                        "# HELP engram_build_info The version engramd was built from (and the "
                        "git commit, when built from a checkout); the value is always 1.\n"
                        "# TYPE engram_build_info gauge\nengram_build_info{version=\"%s\"",
                        buildinfo_version);
    if (buildinfo_commit[0])
        evbuffer_add_printf(out, ",commit=\"%s\"", buildinfo_commit);
    evbuffer_add_printf(out, "} 1\n");
}

void metrics_render(struct evbuffer *out, const metrics_gauge *gauges, size_t n)
{
    render_process(out);
    render_heap(out);
    render_build(out);
    render_requests(out);
    render_connections(out);
    render_writes(out);
    render_db(out);
    render_rows(out);
    metrics_render_gauges(out, gauges, n);
}

void metrics_render_gauges(struct evbuffer *out, const metrics_gauge *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", g[i].name, g[i].help,
                            g[i].name, g[i].name, g[i].value);
}
