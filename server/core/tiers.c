/* server/core/tiers.c: tier names and limits (see tiers.h). */
#include "tiers.h"

#include <string.h>

static const char *const names[TIER_COUNT] = {"free", "standard", "premium"};

const char *tier_name(int tier)
{
    return (unsigned)tier < TIER_COUNT ? names[tier] : "unknown";
}

int tier_parse(const char *s, size_t n)
{
    for (int i = 0; i < TIER_COUNT; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0)
            return i;
    return -1;
}

void tiers_from_config(const config *cfg, tier_limits out[TIER_COUNT])
{
    for (int i = 0; i < TIER_COUNT; i++) {
        out[i] = (tier_limits){
            .max_memories = cfg->tier_max_memories[i],
            .max_memory_bytes = cfg->tier_max_memory_bytes[i],
            .queries_per_day = cfg->tier_queries_per_day[i],
            .consolidation_hours = cfg->tier_consolidation_hours[i],
            .consolidation_on_demand = i == TIER_PREMIUM,
            .model_tokens_per_day = cfg->tier_model_tokens_per_day[i],
            .checkpoint_ttl_s = cfg->tier_checkpoint_ttl_s[i],
            .rate_per_s = cfg->tier_rate_per_s[i],
            .rate_burst = cfg->tier_rate_burst[i],
            .max_session_entries = cfg->tier_max_session_entries[i],
            .max_session_bytes = cfg->tier_max_session_bytes[i],
            .max_live_sessions = cfg->tier_max_live_sessions[i],
            .max_connections = cfg->tier_max_connections[i],
            .session_retention_days = cfg->tier_session_retention_days[i],
        };
    }
}
