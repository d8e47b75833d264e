-- 0009_consolidate_plan: a consolidation step's cost no longer grows with the tenant's size.
--
-- engram_consolidate_apply checked and read each merge group's members with joins and
-- "id = ANY (members)" conditions. For a tenant PostgreSQL's statistics had not seen yet
-- (one freshly imported, say: every tenant id is in the column's most-common-values list,
-- so a new one is estimated at one row), those were planned as scans of every memory of the
-- tenant with the ids as a filter: a 50,000-memory consolidation took 56 to 395 s instead
-- of 7 to 20, depending on whether autovacuum had analyzed the table since the import.
-- Each member is now looked up by its key (tenant, id), which is planned as one index probe
-- whatever the statistics say; the survivor's importance, access count and metadata are
-- accumulated from those rows. Same signature, results and locking order as 0005.

CREATE OR REPLACE FUNCTION engram_consolidate_apply(
        p_tenant bigint, p_own bigint[],
        p_survivor bigint[], p_survivor_seq bigint[], p_members text[], p_members_seq text[],
        p_old bigint[], p_old_seq bigint[], p_new bigint[], p_new_seq bigint[],
        p_prune bigint[], p_prune_seq bigint[], p_prune_c double precision[])
    RETURNS TABLE (merged integer, superseded integer, archived integer, skipped integer)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_total bigint;         -- change numbers reserved up front (the most the step can use)
    v_first bigint;
    v_merged integer := 0;
    v_superseded integer := 0;
    v_archived integer := 0;
    v_skipped integer := 0;
    v_seq bigint;
    s memories;
    m memories;
    k integer;
    v_members bigint[];
    v_mseq bigint[];
    v_id bigint;
    v_rows memories[];
    v_imp double precision;
    v_acc bigint;
    v_mds jsonb[];
    v_ok boolean;
    v_own bigint[] := COALESCE(p_own, '{}') || COALESCE(p_survivor, '{}');
    v_now timestamptz := date_trunc('milliseconds', now());
BEGIN
    -- The tenant row's lock, held to the commit, and one block of change numbers for the whole
    -- step: updating the tenant row once per change would make a large step quadratic (every
    -- update of one row in one transaction walks the versions before it). What the step does
    -- not use is given back at the end, so the numbers stay gapless.
    v_total := COALESCE(cardinality(p_survivor), 0) + COALESCE(cardinality(p_old), 0)
               + COALESCE(cardinality(p_prune), 0)
               + COALESCE((SELECT sum(cardinality(x::bigint[])) FROM unnest(p_members) x), 0);
    v_first := engram_next_seq(p_tenant, v_total) - v_total + 1;
    v_seq := v_first - 1;
    -- merges
    FOR k IN 1 .. COALESCE(cardinality(p_survivor), 0) LOOP
        v_members := p_members[k]::bigint[];
        v_mseq := p_members_seq[k]::bigint[];
        SELECT * INTO s FROM memories WHERE tenant_id = p_tenant AND id = p_survivor[k]
            AND (seq = p_survivor_seq[k] OR id = ANY (v_own)) AND archived_at IS NULL FOR UPDATE;
        v_ok := FOUND;
        IF v_ok THEN
            -- every member must be as the plan saw it (each looked up by its key)
            SELECT count(*) = cardinality(v_members) INTO v_ok
            FROM unnest(v_members, v_mseq) AS u (id, seq)
            WHERE (SELECT x.seq FROM memories x WHERE x.tenant_id = p_tenant AND x.id = u.id
                   AND x.archived_at IS NULL) = u.seq;
        END IF;
        IF NOT v_ok THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
        END IF;
        PERFORM engram_keep_version(s, 'merge', jsonb_build_object('merged', to_jsonb(v_members)));
        -- the members, locked in id order, one key lookup each
        v_rows := '{}';
        v_imp := s.importance;
        v_acc := 0;
        v_mds := '{}';
        FOREACH v_id IN ARRAY ARRAY(SELECT x FROM unnest(v_members) x ORDER BY x) LOOP
            SELECT * INTO m FROM memories WHERE tenant_id = p_tenant AND id = v_id FOR UPDATE;
            CONTINUE WHEN NOT FOUND;
            v_rows := v_rows || m;
            v_imp := greatest(v_imp, m.importance);
            v_acc := v_acc + m.access_count;
            v_mds := v_mds || m.metadata;
        END LOOP;
        v_seq := v_seq + 1;
        UPDATE memories x SET
            importance = v_imp, access_count = x.access_count + v_acc,
            metadata = engram_metadata_union_all(x.metadata, v_mds),
            updated_at = v_now, version = x.version + 1, seq = v_seq
        WHERE x.tenant_id = p_tenant AND x.id = s.id;
        INSERT INTO memory_changes VALUES (p_tenant, v_seq, s.id, 'u');
        FOREACH m IN ARRAY v_rows LOOP
            PERFORM engram_keep_version(m, 'archive',
                                        jsonb_build_object('reason', 'merged', 'into', s.id));
            v_seq := v_seq + 1;
            UPDATE memories SET archived_at = v_now, archived_reason = 'merged', merged_into = s.id,
                                updated_at = v_now, version = version + 1, seq = v_seq
            WHERE tenant_id = p_tenant AND id = m.id;
            INSERT INTO memory_changes VALUES (p_tenant, v_seq, m.id, 'u');
            v_merged := v_merged + 1;
        END LOOP;
    END LOOP;
    -- supersessions
    FOR k IN 1 .. COALESCE(cardinality(p_old), 0) LOOP
        SELECT * INTO m FROM memories WHERE tenant_id = p_tenant AND id = p_old[k]
            AND (seq = p_old_seq[k] OR id = ANY (v_own)) AND archived_at IS NULL FOR UPDATE;
        v_ok := FOUND AND EXISTS (SELECT 1 FROM memories y WHERE y.tenant_id = p_tenant
                                  AND y.id = p_new[k] AND y.archived_at IS NULL
                                  AND (y.seq = p_new_seq[k] OR y.id = ANY (v_own)));
        IF NOT v_ok THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
        END IF;
        PERFORM engram_keep_version(m, 'supersede', jsonb_build_object('superseded_by', p_new[k]));
        v_seq := v_seq + 1;
        UPDATE memories SET archived_at = v_now, archived_reason = 'superseded',
                            superseded_by = p_new[k], updated_at = v_now,
                            version = version + 1, seq = v_seq
        WHERE tenant_id = p_tenant AND id = m.id;
        INSERT INTO memory_changes VALUES (p_tenant, v_seq, m.id, 'u');
        v_superseded := v_superseded + 1;
    END LOOP;
    -- prunes
    FOR k IN 1 .. COALESCE(cardinality(p_prune), 0) LOOP
        SELECT * INTO m FROM memories WHERE tenant_id = p_tenant AND id = p_prune[k]
            AND (seq = p_prune_seq[k] OR id = ANY (v_own)) AND archived_at IS NULL
            AND NOT pinned AND type <> 'constraint' FOR UPDATE;
        IF NOT FOUND THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
        END IF;
        PERFORM engram_keep_version(m, 'archive', jsonb_build_object(
            'reason', 'pruned', 'composite', p_prune_c[k]));
        v_seq := v_seq + 1;
        UPDATE memories SET archived_at = v_now, archived_reason = 'pruned', updated_at = v_now,
                            version = version + 1, seq = v_seq
        WHERE tenant_id = p_tenant AND id = m.id;
        INSERT INTO memory_changes VALUES (p_tenant, v_seq, m.id, 'u');
        v_archived := v_archived + 1;
    END LOOP;
    IF v_seq < v_first + v_total - 1 THEN
        UPDATE tenants SET change_seq = change_seq - (v_first + v_total - 1 - v_seq)
        WHERE id = p_tenant;
    END IF;
    IF v_seq >= v_first THEN
        PERFORM pg_notify('engram_changes', p_tenant || ':' || v_seq);
    END IF;
    merged := v_merged;
    superseded := v_superseded;
    archived := v_archived;
    skipped := v_skipped;
    RETURN NEXT;
END $$;
