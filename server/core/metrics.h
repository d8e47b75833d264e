/* server/core/metrics.h: process-wide counters and histograms, rendered for Prometheus.
 *
 * Every recording function is lock-free (relaxed atomics) and may be called from any
 * thread. Methods are identified by their index in the method table.
 */
#ifndef ENGRAM_SERVER_METRICS_H
#define ENGRAM_SERVER_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc.h"

struct evbuffer;

/* metrics_init prepares counters for n methods named by names (static strings). Call once
 * before any worker starts. Returns 0 or -ENOMEM. */
int metrics_init(const char *const *names, size_t n);

/* metrics_fini frees the counters and the history. */
void metrics_fini(void);

/* metrics_request records one finished request of method (an index, or SIZE_MAX for an
 * unknown method) with its result code and latency in microseconds. */
void metrics_request(size_t method, rpc_code code, uint64_t latency_us);

/* metrics_connections adds delta to the open-connection gauge; metrics_conn_refused counts
 * a connection refused at the limit; metrics_malformed counts a connection closed for a
 * malformed message. */
void metrics_connections(int delta);
void metrics_conn_refused(void);
void metrics_malformed(void);
/* metrics_slow_closed counts a connection closed for slowness (auth deadline, send rate,
 * unread output over the server-wide budget). */
void metrics_slow_closed(void);
/* Output budgets (conn.h): metrics_budget_wait counts a connection that stopped dispatching
 * for budget, metrics_answer_deferred an answer that did not fit and whose request runs
 * again, metrics_answer_refused one over max_result_bytes. */
void metrics_budget_wait(void);

/* metrics_decoded_off_loop counts a message decoded on the decode threads (offload.h). */
void metrics_decoded_off_loop(void);

/* Writes that met a lock another transaction holds (req.c): a probe that timed out (the
 * write moved to the lane), a lane write that got its lock, one that waited
 * write_lock_wait_ms in vain. metrics_write_lock_stuck remembers the tenant and time of the
 * last of those, for /readyz (metrics_write_lock_stuck_since). */
typedef enum {
    METRICS_LOCK_PROBE_TIMEOUT,
    METRICS_LOCK_LANE_OK,
    METRICS_LOCK_LANE_TIMEOUT,
    METRICS_LOCK__COUNT
} metrics_lock_outcome;
void metrics_write_lock(metrics_lock_outcome o);
void metrics_write_lock_stuck(int64_t tenant);
/* metrics_write_lock_stuck_since returns the monotonic ms of the last write that waited in
 * vain (0: none) and its tenant in *tenant. */
uint64_t metrics_write_lock_stuck_since(int64_t *tenant);
void metrics_answer_deferred(void);
void metrics_answer_refused(void);
/* metrics_tls_handshake_failed counts a TLS handshake on the RPC port that did not complete
 * (refused, broken, or abandoned); metrics_tls_reload counts a reload of the certificate
 * files by its outcome. */
void metrics_tls_handshake_failed(void);
void metrics_tls_reload(bool ok);
/* metrics_query_reservation counts one query-block reservation job (qadmit.h). */
void metrics_query_reservation(void);

/* metrics_group_commit counts one group commit of requests writes of tenants tenants. */
void metrics_group_commit(size_t requests, size_t tenants);

/* metrics_consolidation counts one consolidation run (status as consolidate_result's: 0
 * completed, 1 busy, -1 failed) with what it did and how long it took. */
void metrics_consolidation(bool scheduled, int status, uint64_t merged, uint64_t superseded,
                           uint64_t archived, uint64_t rescored, uint64_t duration_ms);

/* metrics_extraction counts one memory extraction run (extract.h): trigger 0 on_demand, 1
 * auto, 2 dream; result 0 ok, 1 busy, 2 not_found, 3 no_model, 4 fault, 5 failed; and its
 * facts: added, updated, unchanged, dropped. */
void metrics_extraction(int trigger, int result, uint64_t added, uint64_t updated,
                        uint64_t unchanged, uint64_t dropped);

/* metrics_dream counts one auto-dream attempt (dream.h) by outcome: 0 ok, 1 partial, 2
 * no_model, 3 taken_over, 4 failed, 5 locked (another pass held the lock). */
void metrics_dream(int outcome);

/* metrics_config_reload counts a reload of the configuration (SIGHUP) by its outcome. */
void metrics_config_reload(bool ok);

/* metrics_index_apply_failed counts a change an index could not take (it stays unapplied
 * and is read again from the change log). */
void metrics_index_apply_failed(void);

/* Database pool state, summed over workers. Each worker publishes its own slot. */
void metrics_db_publish(unsigned worker, unsigned connections, unsigned ready, size_t queued,
                        size_t inflight, uint64_t reconnects, uint64_t failures);

/* metrics_db_wait_publish records how long the oldest job waiting for a connection of
 * worker's pools (main and lane) has waited and how many failed for waiting
 * db_queue_timeout_ms; metrics_db_wait reads the longest wait over all workers and the
 * monotonic ms of the last such failure (0: none), for /readyz. */
void metrics_db_wait_publish(unsigned worker, uint64_t oldest_wait_ms, uint64_t queue_timeouts);
void metrics_db_wait(uint64_t *oldest_wait_ms, uint64_t *last_timeout_ms);

/* metrics_db_read_publish records worker's standby pool (pg_read_dsn): connections configured
 * and ready. */
void metrics_db_read_publish(unsigned worker, unsigned connections, unsigned ready);

/* Where a read that may use a standby ran (engram_db_reads_total{target}), and why one went
 * to the primary instead (engram_db_read_fallbacks_total{reason}). */
typedef enum metrics_read_target { METRICS_READ_STANDBY, METRICS_READ_PRIMARY } metrics_read_target;
typedef enum metrics_read_fallback {
    METRICS_FALLBACK_BEHIND,      /* the standby had not replayed the changes the process knows */
    METRICS_FALLBACK_UNAVAILABLE, /* no standby connection ready, or its job failed */
    METRICS_FALLBACK__COUNT
} metrics_read_fallback;
void metrics_db_read(metrics_read_target target);
void metrics_db_read_fallback(metrics_read_fallback reason);

/* A gauge a caller of metrics_render adds: a valid metric name, its HELP text (one line, no
 * backslash) and its value. */
typedef struct metrics_gauge {
    const char *name, *help;
    double value;
} metrics_gauge;

/* metrics_render appends the Prometheus text exposition (version 0.0.4) of everything to
 * out: the process (process_*: CPU, memory, descriptors, start time, as the Prometheus
 * client libraries define them), engram_build_info, this module's counters, plus the n
 * gauges the caller passes. Every metric has its HELP and TYPE lines. */
void metrics_render(struct evbuffer *out, const metrics_gauge *gauges, size_t n);

/* metrics_render_gauges appends n gauges to out, each with its HELP and TYPE lines. */
void metrics_render_gauges(struct evbuffer *out, const metrics_gauge *gauges, size_t n);

/* The last hour of a few figures, kept for the web console's charts (GET /metrics/history):
 * request and error totals, the latency histogram summed over methods, the indexes' bytes
 * against their budget, their vectors, the resident size.
 * metrics_history_init sizes the ring for an hour at step_s seconds a sample; call it once
 * before metrics_history_sample. Returns 0 or -ENOMEM.
 * metrics_history_sample records one sample at now_ms (Unix ms) with the index figures the
 * caller has (main thread, every step_s).
 * metrics_history_render appends the ring, oldest first, as JSON: {"now" (Unix ms, when
 * rendered), "step_s", "le" (the
 * buckets' bounds in seconds, the last "+Inf"), "samples": [{"t" (Unix ms), "requests",
 * "errors", "duration_count", "duration_sum" (seconds), "buckets" (cumulative counts by
 * "le"), "index_bytes", "index_budget_bytes", "index_vectors", "resident_bytes"}]}. Any
 * thread. */
int metrics_history_init(unsigned step_s);
void metrics_history_sample(int64_t now_ms, double index_bytes, double index_budget_bytes,
                            double index_vectors);
void metrics_history_render(struct evbuffer *out);

/* metrics_db_ready returns the number of ready database connections over all workers. */
unsigned metrics_db_ready(void);

#endif
