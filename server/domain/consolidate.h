/* server/domain/consolidate.h: consolidation of a tenant's memories, on schedule and on demand.
 *
 * One run, on a background thread with its own database connection:
 *  1. takes the tenant's advisory lock (another engramd, or another run here, holding it
 *     means the tenant is being consolidated: this run does nothing);
 *  2. reads the live memories from one snapshot;
 *  3. plans, deterministically for the same data and settings:
 *     - deduplicate: memories of the same type and visibility whose cosine similarity reaches
 *       consolidate_dedupe_threshold are merged into one survivor (the highest explicit
 *       importance, then the most accessed, then the newest, then the lowest id), which takes
 *       the highest importance, the summed access counts and the union of the metadata;
 *     - update: a newer fact or preference of the same visibility that is similar at
 *       consolidate_supersede_threshold, or shares metadata.attrs.key, supersedes the older;
 *     - re-rank and prune: what remains live is ranked by its composite importance as of
 *       the run (rescored counts it); under consolidate_prune_threshold and older than
 *       consolidate_prune_grace_days it is archived, except constraints and pinned
 *       memories. The composite is not stored: every read computes it live;
 *  4. applies the plan in steps of CONSOLIDATE_STEP decisions, each one transaction
 *     (engram_consolidate_apply; writes to the tenant wait at most one step), each decision
 *     guarded by the memory's change number as planned; then records the run
 *     (engram_consolidate_finish). Archived memories stop counting against the tier's
 *     memory limit.
 */
#ifndef ENGRAM_SERVER_CONSOLIDATE_H
#define ENGRAM_SERVER_CONSOLIDATE_H

#include <stdint.h>

#include "bg.h"
#include "server.h"

typedef struct consolidate_result {
    int status; /* 0 completed, 1 busy (another run holds the tenant), -1 failed */
    int64_t run_id;
    int merged, superseded, rescored, archived, skipped;
    int64_t duration_ms;
    char error[512];
} consolidate_result;

/* consolidate_tenant runs one consolidation of tenant (dim: its embedding dimension) on a
 * background thread's connection; trigger is "schedule" or "on_demand". Fills out. */
void consolidate_tenant(bg_ctx *ctx, server *s, int64_t tenant, uint32_t dim, const char *trigger,
                        consolidate_result *out);

/* consolidate_start registers the scheduler (every consolidate_check_interval_s, tenants
 * whose tier cadence has elapsed). Returns 0 or -ENOMEM. */
int consolidate_start(server *s);

/* consolidate_set_interval makes the scheduler look every interval_s seconds from now on
 * (consolidate_check_interval_s reloaded on SIGHUP). Returns 0 or -ENOENT before
 * consolidate_start. */
int consolidate_set_interval(server *s, int interval_s);

#endif
