/* server/domain/reembed.h: online re-embedding of a tenant (admin.tenant.update {embedding}).
 *
 * An admin names a new embedding model for a tenant; PostgreSQL records the job
 * (reembed_jobs, storage/functions/39_reembed.sql). Every reembed_interval_ms a background
 * job thread of each engramd looks for jobs that may run; it works on a tenant only while it
 * holds that tenant's session-level advisory lock on its own connection, so one process of a
 * fleet at a time does (a process that dies releases it with its connection). It reads the
 * memories (archived included) whose side vector is missing or was computed from other
 * content, embeds them with the target model in batches of reembed_batch, and writes the
 * vectors with the content's hash into memory_reembed; the live embeddings are not touched.
 * A provider failure (an error status such as 429 or 5xx, a timeout, a wrong dimension, after
 * the provider's own retries: openai_retries) is recorded in the job (failures, last_error) and
 * the job pauses reembed_retry_min_ms, doubling per failure in a row up to
 * reembed_retry_max_ms. When no memory lacks a vector, one transaction under the tenant row's
 * lock swaps (engram_reembed_swap): every process drops the tenant's index and its snapshot
 * (tenancy_embedding_changed, by NOTIFY engram_admin) and connections embed with the new model
 * from their next request. Each tenant gets at most about 2 s (and a batch) of a thread per
 * look, so jobs of several tenants and other background work take turns.
 */
#ifndef ENGRAM_SERVER_REEMBED_H
#define ENGRAM_SERVER_REEMBED_H

#include <stdint.h>

#include "server.h"

/* reembed_start registers the periodic look for jobs with s->bg. Returns 0 or -ENOMEM. */
int reembed_start(server *s);

/* Counters since start, for /metrics. */
typedef struct reembed_metrics {
    uint64_t vectors;  /* side vectors written */
    uint64_t failures; /* batches the provider failed */
    uint64_t swaps;    /* swaps done by this process */
} reembed_metrics;

/* reembed_get_metrics fills *m. Any thread. */
void reembed_get_metrics(reembed_metrics *m);

#endif
