/* server/core/tiers.h: the three tiers and their limits.
 *
 * Every limit is a setting (free_max_memories, standard_queries_per_day, ...; see
 * config.c), so operators can change them; the defaults are the seed's table.
 */
#ifndef ENGRAM_SERVER_TIERS_H
#define ENGRAM_SERVER_TIERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

enum { TIER_FREE = 0, TIER_STANDARD, TIER_PREMIUM, TIER_COUNT };

typedef struct tier_limits {
    int64_t max_memories;         /* 0: unlimited */
    int64_t max_memory_bytes;     /* 0: unlimited (tenants.memory_bytes) */
    int64_t queries_per_day;      /* 0: unlimited */
    int consolidation_hours;      /* scheduled cadence; 0: never */
    bool consolidation_on_demand; /* may call memory.consolidate */
    int64_t model_tokens_per_day; /* chat model tokens in and out per UTC day; 0: unlimited */
    int checkpoint_ttl_s;
    double rate_per_s; /* 0: unlimited */
    double rate_burst;
    int64_t max_session_entries;
    int64_t max_session_bytes;
    int64_t max_live_sessions;  /* active top-level sessions; 0: unlimited */
    int64_t max_connections;    /* a tenant's connections to one process; 0: unlimited */
    int session_retention_days; /* after the last activity; 0: forever */
} tier_limits;

/* tier_name returns "free", "standard" or "premium" ("unknown" otherwise). */
const char *tier_name(int tier);

/* tier_parse maps a name of n bytes to its tier, or -1. */
int tier_parse(const char *s, size_t n);

/* tiers_from_config fills out[TIER_COUNT] from cfg. */
void tiers_from_config(const config *cfg, tier_limits out[TIER_COUNT]);

#endif
