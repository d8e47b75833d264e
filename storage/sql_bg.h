/* storage/sql_bg.h: the statements of background work (consolidation, maintenance, quota
 * accounting, change notifications, start-up).
 *
 * They run on the background threads' own connections with pgsync_exec_stmt (PGSYNC_EXEC),
 * not on the pool, so they are not prepared. The parameter counts here are checked against the
 * values every caller passes.
 */
#ifndef ENGRAM_STORAGE_SQL_BG_H
#define ENGRAM_STORAGE_SQL_BG_H

#include "db.h"

typedef enum sqlb_stmt {
    SQLB_LISTEN_CHANGES,          /* () follow engram_changes ("tenant:seq") */
    SQLB_LISTEN_ADMIN,            /* () follow engram_admin (tenant, key and engine changes) */
    SQLB_CHANGE_SEQS,             /* (tenant ids[]) -> id, change_seq */
    SQLB_CITUS_WORKERS,           /* () -> host, port of a Citus cluster's active primaries
                                   * other than the one connected to (the coordinator's
                                   * workers; a worker's coordinator and other workers) */
    SQLB_TRY_LOCK,                /* (key) -> locked: a session-level advisory lock */
    SQLB_UNLOCK,                  /* (key) -> released */
    SQLB_CONSOLIDATE_APPLY,       /* (tenant, own ids[], survivor ids[], ..., reasons) -> merged,
                                   * superseded, archived, skipped (50_consolidation.sql) */
    SQLB_CONSOLIDATE_FINISH,      /* (tenant, trigger, started ms, counts, settings) -> run id */
    SQLB_CONSOLIDATE_FAILED,      /* (tenant, trigger, started ms, error) -> run id */
    SQLB_CONSOLIDATION_DUE,       /* (cadence hours[3]) -> tenant, dim of tenants due */
    SQLB_PURGE_EXPIRED,           /* (limit, batch) -> memories deleted */
    SQLB_SESSION_PURGE,           /* () -> checkpoints removed */
    SQLB_SESSION_RETENTION,       /* (days[3], batch) -> sessions deleted past retention */
    SQLB_ACCESS_FOLD,             /* (limit) -> access counts folded into their rows */
    SQLB_PRUNE_CHANGES,           /* (hours, limit) -> change records pruned */
    SQLB_KEYS_VALID,              /* (key rows[]) -> the rows still valid */
    SQLB_TENANT_TIERS,            /* (tenants[]) -> tenant, tier */
    SQLB_QUERY_COUNT,             /* (tenants[], counts[]) count queries admitted without a check */
    SQLB_TENANT_DIMS,             /* () -> tenant, embedding dimension */
    SQLB_MODEL_STATE,             /* (tenant) -> tier, chat_model, model tokens used today */
    SQLB_MODEL_USAGE_ADD,         /* (tenant, calls, tokens in, out, cost) -> tokens today */
    SQLB_CONSOLIDATE_TEXTS,       /* (tenant, ids[]) -> id, content of the live ones, in id order */
    SQLB_JUDGED_GET,              /* (tenant) -> a, b, ha, hb: pairs a model judged, text hashes */
    SQLB_JUDGED_PUT,              /* (tenant, a[], b[], ha[], hb[]) remember judged pairs */
    SQLB_CONSOLIDATE_MODEL_APPLY, /* (tenant, own ids[], kinds[], keep[], keep seq[], other[],
                                   * other seq[], texts[], reasons[], model) -> merged,
                                   * superseded, flagged, rewritten, skipped, changed ids[] */
    SQLB_COMPACT_DUE,             /* (limit) -> tenant, session: sessions due for auto-compact */
    SQLB_COMPACT_LOCK,            /* (tenant, session) -> locked: one compaction per session */
    SQLB_COMPACT_UNLOCK,          /* (tenant, session) -> released */
    SQLB_COMPACT_STATE,           /* (tenant, session, windows) -> state, due, off, position,
                                   * model, window, enabled, threshold, keep_recent, budget,
                                   * live bytes, summary, summary seq (37_compact.sql) */
    SQLB_COMPACT_ENTRIES,         /* (tenant, session, upto) -> id, seq, session, role, content */
    SQLB_COMPACT_FINISH,          /* (tenant, session, through, summary, compacted, truncated
                                   * ids[], budget, data, max entries, max bytes) -> jsonb */
    SQLB_COMPACT_FAILED,          /* (tenant, session, status, reason, counted, bytes) -> jsonb */
    SQLB_EXTRACT_BEGIN,     /* (tenant, session, through entry, holder, stale s, max entries, max
                               bytes) -> the claim and the transcript as JSON (55_extraction.sql) */
    SQLB_EXTRACT_FAIL,      /* (tenant, session, holder, trigger, status, error, tokens in, out,
                               result) records a run that changed nothing */
    SQLB_EXTRACT_FINISH,    /* (tenant, session, holder, trigger, limits, dim, last seq, agent,
                               types[], contents[], importances[], metadata[], embeddings, sup
                               facts[], sup old[], sup seq[], sup why[], model, unchanged, tokens
                               in, out, result) -> {added, updated, skipped, memory_ids} */
    SQLB_EXTRACT_DUE,       /* (min messages, min tokens, idle s, stale s, retry s, limit) ->
                               tenant, session, dim */
    SQLB_EXTRACT_MEMS,      /* (tenant, ids[]) -> id, seq, content of the live ones */
    SQLB_DREAM_DUE,         /* (hours, min sessions, stale s, limit) -> tenant, dim */
    SQLB_DREAM_LOCK,        /* (tenant, holder, hours, min sessions, stale s, force, max sessions)
                               -> {locked, sessions, ...} */
    SQLB_DREAM_UNLOCK,      /* (tenant, holder, status, error, last session, result) -> held */
    SQLB_DREAM_ORIENT,      /* (tenant) -> type, live memories of it */
    SQLB_DREAM_TOUCH,       /* (tenant, holder) -> a row while holder still holds the lock */
    SQLB_TENANT_EMBEDDINGS, /* (tenants[]) -> tenant, generation, provider, dim */
    SQLB_REEMBED_DUE,       /* (limit) -> tenant, provider, model, dim of jobs that may run now */
    SQLB_REEMBED_TODO,      /* (tenant, limit) -> id, content, content hash (39_reembed.sql) */
    SQLB_REEMBED_PUT,       /* (tenant, dim, ids[], hashes[], embeddings) -> vectors written */
    SQLB_REEMBED_FAIL,      /* (tenant, error, min ms, max ms) -> backoff ms */
    SQLB_REEMBED_SWAP,      /* (tenant) -> new generation, NULL when not ready */
    SQLB__COUNT
} sqlb_stmt;

extern const db_stmt_def sql_bg_stmts[SQLB__COUNT];

/* sqlb_def returns statement s of the table. */
static inline const db_stmt_def *sqlb_def(sqlb_stmt s)
{
    return &sql_bg_stmts[s];
}

#endif
