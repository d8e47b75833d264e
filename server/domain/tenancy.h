/* server/domain/tenancy.h: what the server knows about tenants and keys between database reads.
 *
 * - Revoked keys and deleted tenants: a connection authenticated earlier must fail on its
 *   next request. Revocations and deletions made through this process apply at once; those
 *   made through another engramd arrive by NOTIFY engram_admin within milliseconds, and a
 *   periodic check of every key in use here covers notifications lost while the listener
 *   was reconnecting.
 * - Current tiers: a tier change reaches long-lived connections the same ways.
 * - Request rates: one token bucket per tenant and process, sized by the tier.
 * - Query counts of tiers without a daily limit, batched to PostgreSQL for tenant.usage
 *   (tiers with a limit are admitted one query at a time by the database itself).
 * Every function is thread-safe.
 */
#ifndef ENGRAM_SERVER_TENANCY_H
#define ENGRAM_SERVER_TENANCY_H

#include <stdbool.h>
#include <stdint.h>

#include "bg.h"
#include "server.h"

typedef struct tenancy tenancy;

/* tenancy_create returns the registry for s, or NULL; tenancy_destroy frees it. */
tenancy *tenancy_create(server *s);
void tenancy_destroy(tenancy *t);

/* tenancy_start registers the periodic tasks (key checks, tier refresh, query count
 * flush, idle buckets forgotten) with s->bg. Returns 0 or -ENOMEM. */
int tenancy_start(tenancy *t);

/* tenancy_key_in_use / tenancy_key_released keep the count of connections using a key
 * (auth, connection close), so the periodic check knows which keys to verify. */
void tenancy_key_in_use(tenancy *t, int64_t key_id, int64_t tenant_id, int tier);

/* tenancy_key_claim is tenancy_key_in_use when the tenant has fewer than cap connections in
 * this process (cap <= 0: no limit), in one step (two workers cannot both take the last
 * place). Returns true when counted (release with tenancy_key_released), false when at the
 * cap; *in_use is the tenant's connections before. */
bool tenancy_key_claim(tenancy *t, int64_t key_id, int64_t tenant_id, int tier, int64_t cap,
                       int64_t *in_use);
void tenancy_key_released(tenancy *t, int64_t key_id);

/* tenancy_key_ok tells whether a key (and its tenant) may still make requests. */
bool tenancy_key_ok(tenancy *t, int64_t key_id, int64_t tenant_id);

/* tenancy_tier returns the tenant's current tier, or fallback when unknown (a tenant without
 * connections is not tracked: its next authentication reads the tier). */
int tenancy_tier(tenancy *t, int64_t tenant_id, int fallback);

/* tenancy_revoked / tenancy_deleted / tenancy_tier_changed record an administrative change
 * (made here, or notified). */
void tenancy_revoked(tenancy *t, int64_t key_id);
void tenancy_deleted(tenancy *t, int64_t tenant_id);
void tenancy_tier_changed(tenancy *t, int64_t tenant_id, int tier);

/* tenancy_embedding_changed records that tenant_id embeds with provider at dim from
 * generation gen on: swapped true for a re-embedding's swap (here or notified), false for
 * what the periodic check or an authentication read. When gen is newer than the generation known
 * (for a swap, also when none was known), the tenant's index and snapshot are dropped
 * (tenants_forget: its next use builds it from PostgreSQL's new vectors). */
void tenancy_embedding_changed(tenancy *t, int64_t tenant_id, int64_t gen, const char *provider,
                               uint32_t dim, bool swapped);

/* tenancy_embedding brings a connection's copy of its tenant's model up to date: when the
 * known generation of tenant_id is newer than *gen, sets *gen, *dim and provider (16 bytes,
 * NUL-terminated). Any thread. */
void tenancy_embedding(tenancy *t, int64_t tenant_id, int64_t *gen, uint32_t *dim, char *provider);

/* tenancy_notify parses an engram_admin notification payload ("revoked:<key>",
 * "deleted:<tenant>", "tier:<tenant>:<name>", "engine:<tenant>:<native|faiss|default>",
 * "embedding:<tenant>:<gen>:<provider>:<dim>") and records it (an engine change goes to
 * tenants_engine_changed). */
void tenancy_notify(tenancy *t, const char *payload);

/* tenancy_rate_take takes one request token of the tenant's bucket. Returns true when the
 * request may go on; false with the milliseconds until a token is due in *retry_ms. */
bool tenancy_rate_take(tenancy *t, int64_t tenant_id, int tier, uint64_t *retry_ms);

/* A token bucket: tokens refill at a rate per second up to the burst; a request takes one.
 * A new bucket starts full: {.tokens = burst, .last_ns = now}. */
typedef struct tenancy_bucket {
    double tokens;
    uint64_t last_ns;
    int64_t tenant; /* whose, in tenancy's table (tenancy_bucket_take ignores it) */
} tenancy_bucket;

/* tenancy_bucket_take refills b for the time from b->last_ns to now_ns (monotonic; a now_ns
 * earlier than the last, from a thread that read the clock before another, adds nothing)
 * at rate_per_s, capped at burst, and takes one token. Returns true when there was one;
 * false with the milliseconds until one is due (at least 1) in *retry_ms. The caller
 * serializes calls on one bucket. */
bool tenancy_bucket_take(tenancy_bucket *b, double rate_per_s, double burst, uint64_t now_ns,
                         uint64_t *retry_ms);

/* tenancy_sweep_buckets forgets the buckets of tenants idle long enough that theirs is full
 * again under every tier's limits (a new bucket starts full: nothing changes for them) and
 * gives back the table's spare room, so that a tenant that stopped sending costs nothing
 * here. Returns the number forgotten. Runs every 5 s on a background thread (tenancy_start);
 * any thread. */
size_t tenancy_sweep_buckets(tenancy *t, uint64_t now_ns);

/* tenancy_count_query counts one query of a tenant whose tier has no daily limit. */
void tenancy_count_query(tenancy *t, int64_t tenant_id);

#endif
