-- 0013_composite_inputs: the composite importance counts every access, everywhere.
--
-- Search ranks with the access count folded into the row plus the accesses still pending in
-- memory_access (0007), and memory.get reports that sum; the composites a consolidation run
-- stores, and those memory.list orders by (storage/sql.c), used the folded count alone, so
-- the same memory had two composites until the next fold. Both now take the sum. Same
-- signature and results as 0005.

CREATE OR REPLACE FUNCTION engram_consolidate_finish(
        p_tenant bigint, p_trigger text, p_started_ms bigint, p_as_of_ms bigint,
        p_w double precision[], p_settings jsonb, p_merged integer, p_superseded integer,
        p_archived integer, p_skipped integer)
    RETURNS TABLE (run_id bigint, rescored integer)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    UPDATE memories x SET
        composite = engram_composite(x.created_at,
                                     x.access_count + COALESCE((SELECT a.access_count
                                                                FROM memory_access a
                                                                WHERE a.tenant_id = x.tenant_id
                                                                  AND a.id = x.id), 0),
                                     x.importance,
                                     engram_ts(p_as_of_ms), p_w[1], p_w[2], p_w[3], p_w[4], p_w[5]),
        composite_at = engram_ts(p_as_of_ms)
    WHERE x.tenant_id = p_tenant AND x.archived_at IS NULL
      AND (x.expires_at IS NULL OR x.expires_at > now());
    GET DIAGNOSTICS rescored = ROW_COUNT;
    INSERT INTO consolidation_runs (tenant_id, trigger, status, started_at, finished_at, merged,
                                    superseded, rescored, archived, skipped, settings)
        VALUES (p_tenant, p_trigger, 'completed', engram_ts(p_started_ms), clock_timestamp(),
                p_merged, p_superseded, rescored, p_archived, p_skipped, p_settings)
        RETURNING consolidation_runs.id INTO run_id;
    RETURN NEXT;
END $$;
