-- storage/functions/25_feedback.sql: provenance feedback: the usefulness term of the
-- composite importance and the feedback write (memory.feedback, memory.provenance).
--
-- Repeatable: engramd applies this file whole, in one transaction, whenever its checksum
-- differs from the one recorded in schema_functions (see storage/migrate.h). Every
-- definition is CREATE OR REPLACE; a change of a function's arguments or result type
-- needs a DROP FUNCTION IF EXISTS of the old signature above the new definition.

-- engram_composite_u: the composite importance with the usefulness term, as the server
-- computes it (server/domain/score.h): (1 - w_u) * base + w_u * (cited + 1) / (injected + 2),
-- base being engram_composite's seed formula. w_u NULL or 0 gives base unchanged.
CREATE OR REPLACE FUNCTION engram_composite_u(base double precision, cited bigint,
                                              injected bigint, w_u double precision)
    RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN w_u IS NULL OR w_u = 0 THEN base
                ELSE (1 - w_u) * base + w_u * (cited + 1.0) / (injected + 2.0) END
$$;

-- engram_memory_feedback: records one round of feedback: every memory among p_injected and
-- p_cited (each id once, a cited one counts as injected too) gets injected_count + 1, and
-- those among p_cited cited_count + 1. Each counts as a change of the memory (a change
-- number, a memory_changes row, a notification), so every process's index follows the
-- counts the composite may use; updated_at and version stay, since content did not change.
-- Ids that do not exist for the tenant (or have expired) are skipped; the caller reports
-- them. Returns the changed memories' new counts and index state, in id order.
CREATE OR REPLACE FUNCTION engram_memory_feedback(p_tenant bigint, p_cited bigint[],
                                                  p_injected bigint[])
    RETURNS TABLE (f_cited boolean, f_cited_count bigint, f_injected_count bigint,
                   m_id bigint, m_seq bigint, m_agent_id bigint, m_clade_id bigint,
                   m_scope text, m_type text, m_importance double precision,
                   m_created_ms bigint, m_accessed_ms bigint, m_access_count bigint,
                   m_expires_ms bigint, m_archived_ms bigint, m_pinned boolean, m_tags text)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    m memories;
    v_ids bigint[];
    v_n bigint;
    v_seq bigint;
BEGIN
    -- the tenant row's lock first: no delete runs between the count and the updates
    PERFORM engram_next_seq(p_tenant, 0);
    SELECT array_agg(DISTINCT x) INTO v_ids
        FROM unnest(COALESCE(p_injected, '{}') || COALESCE(p_cited, '{}')) AS x;
    SELECT count(*) INTO v_n FROM memories x
    WHERE x.tenant_id = p_tenant AND x.id = ANY (v_ids)
      AND (x.expires_at IS NULL OR x.expires_at > now());
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_seq := engram_next_seq(p_tenant, v_n) - v_n;
    FOR m IN SELECT * FROM memories x
             WHERE x.tenant_id = p_tenant AND x.id = ANY (v_ids)
               AND (x.expires_at IS NULL OR x.expires_at > now())
             ORDER BY x.id FOR UPDATE LOOP
        v_seq := v_seq + 1;
        UPDATE memories x SET
            injected_count = x.injected_count + 1,
            cited_count = x.cited_count + CASE WHEN x.id = ANY (p_cited) THEN 1 ELSE 0 END,
            seq = v_seq
        WHERE x.tenant_id = p_tenant AND x.id = m.id
        RETURNING * INTO m;
        INSERT INTO memory_changes VALUES (p_tenant, v_seq, m.id, 'u');
        RETURN QUERY SELECT COALESCE(m.id = ANY (p_cited), false), m.cited_count,
                            m.injected_count, mm.*
                     FROM engram_meta_of(m) AS mm;
    END LOOP;
    PERFORM pg_notify('engram_changes', p_tenant || ':' || v_seq);
END $$;
ALTER FUNCTION engram_memory_feedback(bigint, bigint[], bigint[])
    SET plan_cache_mode = force_generic_plan;
