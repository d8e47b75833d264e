/* server/domain/consolidate.h: consolidation of a tenant's memories, on schedule and on demand.
 *
 * One run, on a background thread with its own database connection:
 *  1. takes the tenant's advisory lock (another engramd, or another run here, holding it
 *     means the tenant is being consolidated: this run does nothing);
 *  2. reads the live memories from one snapshot, with their content (each text is reduced to
 *     a fixed-size signature as it streams in: textrule.h);
 *  3. plans, deterministically for the same data and settings. A cosine alone never archives
 *     (issue 32): two texts that differ in one entity are above any threshold. Without a
 *     model, only evidence in the texts or the metadata does:
 *     - deduplicate: memories of the same type and visibility with the same text (case,
 *       punctuation, number formats and a few empty words aside: textrule.h) and metadata
 *       that agree (attrs and strategy_id equal where both have them, tokens, chains and
 *       protocols sharing an element where both have them) are merged into one survivor
 *       (the highest explicit importance, then the most accessed, then the newest, then the
 *       lowest id), which takes the highest importance, the summed access counts and the
 *       union of the metadata;
 *     - update: a newer fact or preference of the same visibility supersedes the older when
 *       both share metadata.attrs.key, or when its text is the older's but for quantities
 *       (a value update: "2.3% -> 2.5%") and their metadata agree;
 *     - pairs a cosine alone would have merged (consolidate_dedupe_threshold) or superseded
 *       (consolidate_supersede_threshold) are counted in the run's record, not acted on;
 *     - re-rank and prune: what remains live is ranked by its composite importance as of
 *       the run (rescored counts it); under consolidate_prune_threshold and older than
 *       consolidate_prune_grace_days it is archived, except constraints and pinned
 *       memories. The composite is not stored: every read computes it live;
 *  4. applies the plan in steps of about 200 memories changed, each one transaction
 *     (engram_consolidate_apply; writes to the tenant wait at most one step), each decision
 *     guarded by the memory's change number as planned and recorded in the history of every
 *     memory it changes with its rule and reason; then records the run with its counts by
 *     rule (engram_consolidate_finish). Archived memories stop counting against the tier's
 *     memory limit.
 */
#ifndef ENGRAM_SERVER_CONSOLIDATE_H
#define ENGRAM_SERVER_CONSOLIDATE_H

#include <stdint.h>

#include "bg.h"
#include "loader.h"
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

/* What consolidate_plan decided for one memory. */
enum { CONSOLIDATE_LIVE, CONSOLIDATE_MERGED, CONSOLIDATE_SUPERSEDED, CONSOLIDATE_PRUNED };

typedef struct consolidate_fate {
    int64_t id;
    int fate;          /* CONSOLIDATE_* */
    int64_t into;      /* merged into / superseded by: that memory's id; 0 otherwise */
    const char *rule;  /* "same_text", "attrs_key", "values", "prune"; NULL when live */
    double importance; /* live: with what it absorbed (the highest); pruned: its composite */
    int64_t access;    /* live: its access count with those it absorbed */
    char why[400];     /* superseded: the reason recorded in its history; else "" */
} consolidate_fate;

/* What a plan counted by rule (the run's record, settings.rules), and the memories
 * ranked. */
typedef struct consolidate_counts {
    int same_text, attrs_key, values, near_kept, similar_kept, rescored;
} consolidate_counts;

/* consolidate_plan makes the plan of a run (steps 2 and 3 above) over the n live memories
 * rows (as loader_live gives them, vec holding dim floats each) as of now_ms, with s's
 * consolidate_* settings and ranking parameters, without a database: fates[i] (the caller's
 * array of n) is rows[i]'s fate; *counts (may be NULL) what the run would record. The plan
 * depends only on the rows, not their order. Returns 0, -ENOMEM, or -EIO with the reason in
 * err (the similarity search failed). Any thread. */
int consolidate_plan(server *s, const loader_row *rows, size_t n, uint32_t dim, int64_t now_ms,
                     consolidate_fate *fates, consolidate_counts *counts, char *err, size_t errlen);

/* consolidate_start registers the scheduler (every consolidate_check_interval_s, tenants
 * whose tier cadence has elapsed). Returns 0 or -ENOMEM. */
int consolidate_start(server *s);

/* consolidate_set_interval makes the scheduler look every interval_s seconds from now on
 * (consolidate_check_interval_s reloaded on SIGHUP). Returns 0 or -ENOENT before
 * consolidate_start. */
int consolidate_set_interval(server *s, int interval_s);

#endif
