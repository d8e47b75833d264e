/* storage/sql_bg.c: the statements of background work (see sql_bg.h). */
#include "sql_bg.h"

const db_stmt_def sql_bg_stmts[SQLB__COUNT] = {
    [SQLB_LISTEN_CHANGES] = {"listen_changes", "LISTEN engram_changes", 0},
    [SQLB_LISTEN_ADMIN] = {"listen_admin", "LISTEN engram_admin", 0},
    [SQLB_CHANGE_SEQS] = {"change_seqs",
                          "SELECT id, change_seq FROM engram_change_seqs($1::bigint[])", 1},
    [SQLB_CITUS_WORKERS] = {"citus_workers",
                            "SELECT nodename, nodeport::text FROM pg_dist_node WHERE isactive "
                            "AND noderole = 'primary' AND groupid <> (SELECT groupid FROM "
                            "pg_dist_local_group) ORDER BY nodeid",
                            0},
    [SQLB_TRY_LOCK] = {"try_lock", "SELECT pg_try_advisory_lock($1::bigint)", 1},
    [SQLB_UNLOCK] = {"unlock", "SELECT pg_advisory_unlock($1::bigint)", 1},
    [SQLB_CONSOLIDATE_APPLY] = {"consolidate_apply",
                                "SELECT * FROM engram_consolidate_apply($1, $2::bigint[], "
                                "$3::bigint[], $4::bigint[], $5::text[], $6::text[], "
                                "$7::text[], $8::bigint[], $9::bigint[], $10::bigint[], "
                                "$11::bigint[], $12::text[], $13::text[], $14::bigint[], "
                                "$15::bigint[], $16::float8[])",
                                16},
    [SQLB_CONSOLIDATE_FINISH] = {"consolidate_finish",
                                 "SELECT * FROM engram_consolidate_finish($1, $2, $3, $4, "
                                 "$5, $6, $7, $8, $9::jsonb)",
                                 9},
    [SQLB_CONSOLIDATE_FAILED] = {"consolidate_failed",
                                 "SELECT engram_consolidate_failed($1, $2, $3, $4)", 4},
    [SQLB_CONSOLIDATION_DUE] = {"consolidation_due",
                                "SELECT * FROM engram_consolidation_due($1::integer[])", 1},
    [SQLB_PURGE_EXPIRED] = {"purge_expired", "SELECT engram_purge_expired($1, $2)", 2},
    [SQLB_SESSION_PURGE] = {"session_purge", "SELECT engram_session_purge_expired()", 0},
    [SQLB_SESSION_RETENTION] = {"session_retention",
                                "SELECT engram_session_purge_retention($1::integer[], $2)", 2},
    [SQLB_ACCESS_FOLD] = {"access_fold", "SELECT engram_access_fold($1, $2)", 2},
    [SQLB_PRUNE_CHANGES] = {"prune_changes", "SELECT engram_prune_changes($1, $2)", 2},
    [SQLB_KEYS_VALID] = {"keys_valid", "SELECT engram_keys_valid($1::bigint[])", 1},
    [SQLB_TENANT_TIERS] = {"tenant_tiers",
                           "SELECT tenant_id, tier FROM engram_tenant_tiers($1::bigint[])", 1},
    [SQLB_QUERY_COUNT] = {"query_count", "SELECT engram_query_count($1::bigint[], $2::bigint[])",
                          2},
    [SQLB_TENANT_DIMS] = {"tenant_dims", "SELECT * FROM engram_tenant_dims()", 0},
    [SQLB_MODEL_STATE] = {"model_state", "SELECT * FROM engram_model_state($1)", 1},
    [SQLB_MODEL_USAGE_ADD] = {"model_usage_add",
                              "SELECT engram_model_usage_add($1, $2, $3, $4, $5)", 5},
    [SQLB_CONSOLIDATE_TEXTS] = {"consolidate_texts",
                                "SELECT id, content FROM memories WHERE tenant_id = $1 "
                                "AND id = ANY ($2::bigint[]) AND archived_at IS NULL ORDER BY id",
                                2},
    [SQLB_JUDGED_GET] = {"judged_get",
                         "SELECT a, b, ha, hb FROM consolidation_judged WHERE tenant_id = $1", 1},
    [SQLB_JUDGED_PUT] = {"judged_put",
                         "INSERT INTO consolidation_judged AS j (tenant_id, a, b, ha, hb) "
                         "SELECT $1, x.a, x.b, x.ha, x.hb FROM unnest($2::bigint[], "
                         "$3::bigint[], $4::bigint[], $5::bigint[]) AS x (a, b, ha, hb) "
                         "ON CONFLICT (tenant_id, a, b) DO UPDATE SET ha = EXCLUDED.ha, "
                         "hb = EXCLUDED.hb, judged_at = now()",
                         5},
    [SQLB_CONSOLIDATE_MODEL_APPLY] = {"consolidate_model_apply",
                                      "SELECT merged, superseded, flagged, rewritten, skipped, "
                                      "changed::text FROM engram_consolidate_model_apply($1, "
                                      "$2::bigint[], $3::text[], $4::bigint[], $5::bigint[], "
                                      "$6::bigint[], $7::bigint[], $8::text[], $9::text[], $10)",
                                      10},
    [SQLB_COMPACT_DUE] = {"compact_due", "SELECT * FROM engram_compact_due($1)", 1},
    [SQLB_COMPACT_LOCK] = {"compact_lock",
                           "SELECT pg_try_advisory_lock(hashtextextended('engram.compact.' || "
                           "$1::bigint || '.' || $2::bigint, 0))",
                           2},
    [SQLB_COMPACT_UNLOCK] = {"compact_unlock",
                             "SELECT pg_advisory_unlock(hashtextextended('engram.compact.' || "
                             "$1::bigint || '.' || $2::bigint, 0))",
                             2},
    [SQLB_COMPACT_STATE] = {"compact_state", "SELECT * FROM engram_compact_state($1, $2, $3)", 3},
    [SQLB_COMPACT_ENTRIES] = {"compact_entries", "SELECT * FROM engram_compact_entries($1, $2, $3)",
                              3},
    [SQLB_COMPACT_FINISH] = {"compact_finish",
                             "SELECT engram_compact_finish($1, $2, $3, $4, $5, $6::bigint[], $7, "
                             "$8::jsonb, $9, $10)",
                             10},
    [SQLB_COMPACT_FAILED] = {"compact_failed",
                             "SELECT engram_compact_failed($1, $2, $3, $4, $5::boolean, $6)", 6},
    [SQLB_EXTRACT_BEGIN] = {"extract_begin",
                            "SELECT engram_extract_begin($1, $2, $3, $4, $5, $6, $7)::text", 7},
    [SQLB_EXTRACT_FAIL] = {"extract_fail",
                           "SELECT engram_extract_fail($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb)",
                           9},
    [SQLB_EXTRACT_FINISH] = {"extract_finish",
                             "SELECT engram_extract_finish($1, $2, $3, $4, $5::bigint[], $6, $7, "
                             "$8, $9::text[], $10::text[], $11::float8[], $12::text[], "
                             "$13::bytea, $14::integer[], $15::bigint[], $16::bigint[], "
                             "$17::text[], $18, $19, $20, $21, $22::jsonb, $23)::text",
                             23},
    [SQLB_EXTRACT_DUE] = {"extract_due", "SELECT * FROM engram_extract_due($1, $2, $3, $4, $5, $6)",
                          6},
    [SQLB_EXTRACT_MEMS] = {"extract_mems",
                           "SELECT id, seq, content FROM memories WHERE tenant_id = $1 "
                           "AND id = ANY ($2::bigint[]) AND archived_at IS NULL ORDER BY id",
                           2},
    [SQLB_DREAM_DUE] = {"dream_due", "SELECT * FROM engram_dream_due($1, $2, $3, $4)", 4},
    [SQLB_DREAM_LOCK] = {"dream_lock", "SELECT engram_dream_lock($1, $2, $3, $4, $5, $6, $7)::text",
                         7},
    [SQLB_DREAM_UNLOCK] = {"dream_unlock",
                           "SELECT engram_dream_unlock($1, $2, $3, $4, $5, $6::jsonb)", 6},
    [SQLB_DREAM_ORIENT] = {"dream_orient",
                           "SELECT type, count(*) FROM memories WHERE tenant_id = $1 "
                           "AND archived_at IS NULL GROUP BY type ORDER BY type",
                           1},
    [SQLB_DREAM_TOUCH] = {"dream_touch",
                          "UPDATE dream_state SET lock_at = now() WHERE tenant_id = $1 "
                          "AND lock_holder = $2 RETURNING 1",
                          2},
    [SQLB_TENANT_EMBEDDINGS] = {"tenant_embeddings",
                                "SELECT * FROM engram_tenant_embeddings($1::bigint[])", 1},
    [SQLB_REEMBED_DUE] = {"reembed_due", "SELECT * FROM engram_reembed_due($1)", 1},
    [SQLB_REEMBED_TODO] = {"reembed_todo", "SELECT * FROM engram_reembed_todo($1, $2)", 2},
    [SQLB_REEMBED_PUT] = {"reembed_put",
                          "SELECT engram_reembed_put($1, $2, $3::bigint[], $4::bytea[], $5)", 5},
    [SQLB_REEMBED_FAIL] = {"reembed_fail", "SELECT engram_reembed_fail($1, $2, $3, $4)", 4},
    [SQLB_REEMBED_SWAP] = {"reembed_swap", "SELECT engram_reembed_swap($1)", 1},
};
