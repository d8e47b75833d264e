-- storage/functions/50_consolidation.sql: Consolidation: applying a run's plan, recording
-- runs, scheduling.
--
-- Repeatable: engramd applies this file whole, in one transaction, whenever its checksum
-- differs from the one recorded in schema_functions (see storage/migrate.h). Every
-- definition is CREATE OR REPLACE; a change of a function's arguments or result type
-- needs a DROP FUNCTION IF EXISTS of the old signature above the new definition.

-- The union of two metadata documents: typed lists merged without duplicates (in order of
-- first appearance), strategy_id and attrs keys from a unless absent there.
CREATE OR REPLACE FUNCTION engram_metadata_union(a jsonb, b jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'tokens', (SELECT jsonb_agg(x ORDER BY o) FROM (
            SELECT DISTINCT ON (x) x, o FROM (
                SELECT x, o FROM jsonb_array_elements(COALESCE(a -> 'tokens', '[]')) WITH ORDINALITY AS e (x, o)
                UNION ALL
                SELECT x, o + 100000 FROM jsonb_array_elements(COALESCE(b -> 'tokens', '[]')) WITH ORDINALITY AS f (x, o)) u
            ORDER BY x, o) d),
        'chains', (SELECT jsonb_agg(x ORDER BY o) FROM (
            SELECT DISTINCT ON (x) x, o FROM (
                SELECT x, o FROM jsonb_array_elements(COALESCE(a -> 'chains', '[]')) WITH ORDINALITY AS e (x, o)
                UNION ALL
                SELECT x, o + 100000 FROM jsonb_array_elements(COALESCE(b -> 'chains', '[]')) WITH ORDINALITY AS f (x, o)) u
            ORDER BY x, o) d),
        'protocols', (SELECT jsonb_agg(x ORDER BY o) FROM (
            SELECT DISTINCT ON (x) x, o FROM (
                SELECT x, o FROM jsonb_array_elements(COALESCE(a -> 'protocols', '[]')) WITH ORDINALITY AS e (x, o)
                UNION ALL
                SELECT x, o + 100000 FROM jsonb_array_elements(COALESCE(b -> 'protocols', '[]')) WITH ORDINALITY AS f (x, o)) u
            ORDER BY x, o) d),
        'strategy_id', COALESCE(a -> 'strategy_id', b -> 'strategy_id'),
        'attrs', CASE WHEN a ? 'attrs' OR b ? 'attrs'
                      THEN COALESCE(b -> 'attrs', '{}') || COALESCE(a -> 'attrs', '{}') END))
$$;

-- engram_consolidate_apply: applies one step of a run's plan, atomically. A run applies its
-- plan in steps of a few hundred decisions, each its own transaction, so the tenant's writes
-- wait at most one step for the tenant row's lock; a run cut short (its process died) has
-- applied whole steps only, and the next run plans the rest again. Arrays, parallel within
-- each group:
--   merges:      p_survivor[k] absorbs p_members[k] (a bigint[] as text per cluster);
--                p_survivor_seq / p_members_seq guard them (the seq each had in the plan);
--                p_merge_why[k] is the reason (the rule is 'same_text')
--   supersessions: p_old[k] is superseded by p_new[k] (guards p_old_seq, p_new_seq), by the
--                rule p_old_rule[k] ('attrs_key' or 'values') for the reason p_old_why[k]
--   prunes:      p_prune[k] archived for low composite (guard p_prune_seq, value p_prune_c)
-- Every decision's rule and reason go into the history (memory_versions.detail) of each
-- memory it changes: nothing is merged or superseded without them.
-- p_own lists the memories this run changed in earlier steps (their seq moved on).
-- Returns the step's counts. Each member is looked up by its key (tenant, id), one index
-- probe whatever the statistics say (a join on "id = ANY (members)" was planned as a scan
-- of the tenant for tenants PostgreSQL had not analyzed yet).
-- The signature before the reasons (issue 32) is dropped: an older engramd, whose planner
-- superseded on a cosine alone, then fails its runs (recorded as failed) instead of
-- archiving distinct facts.
DROP FUNCTION IF EXISTS engram_consolidate_apply(bigint, bigint[], bigint[], bigint[], text[],
    text[], bigint[], bigint[], bigint[], bigint[], bigint[], bigint[], double precision[]);
CREATE OR REPLACE FUNCTION engram_consolidate_apply(
        p_tenant bigint, p_own bigint[],
        p_survivor bigint[], p_survivor_seq bigint[], p_members text[], p_members_seq text[],
        p_merge_why text[],
        p_old bigint[], p_old_seq bigint[], p_new bigint[], p_new_seq bigint[],
        p_old_rule text[], p_old_why text[],
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
    v_bytes bigint := 0; -- what the kept versions and the merged metadata add (memory_bytes)
    v_nb integer;
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
        v_bytes := v_bytes + engram_keep_version(s, 'merge', jsonb_build_object(
            'merged', to_jsonb(v_members), 'rule', 'same_text', 'why', p_merge_why[k]));
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
        WHERE x.tenant_id = p_tenant AND x.id = s.id
        RETURNING x.bytes INTO v_nb;
        v_bytes := v_bytes + v_nb - s.bytes;
        INSERT INTO memory_changes VALUES (p_tenant, v_seq, s.id, 'u');
        FOREACH m IN ARRAY v_rows LOOP
            v_bytes := v_bytes + engram_keep_version(m, 'archive', jsonb_build_object(
                'reason', 'merged', 'into', s.id, 'rule', 'same_text', 'why', p_merge_why[k]));
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
        v_bytes := v_bytes + engram_keep_version(m, 'supersede', jsonb_build_object(
            'superseded_by', p_new[k], 'rule', p_old_rule[k], 'why', p_old_why[k]));
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
        v_bytes := v_bytes + engram_keep_version(m, 'archive', jsonb_build_object(
            'reason', 'pruned', 'composite', p_prune_c[k]));
        v_seq := v_seq + 1;
        UPDATE memories SET archived_at = v_now, archived_reason = 'pruned', updated_at = v_now,
                            version = version + 1, seq = v_seq
        WHERE tenant_id = p_tenant AND id = m.id;
        INSERT INTO memory_changes VALUES (p_tenant, v_seq, m.id, 'u');
        v_archived := v_archived + 1;
    END LOOP;
    -- change numbers the step did not use go back; the memories it archived stop counting
    -- against the tier's memory limit (tenants.memory_count counts live memories)
    UPDATE tenants SET change_seq = change_seq - (v_first + v_total - 1 - v_seq),
                       memory_count = memory_count - (v_merged + v_superseded + v_archived),
                       memory_bytes = memory_bytes + v_bytes
    WHERE id = p_tenant;
    IF v_seq >= v_first THEN
        PERFORM pg_notify('engram_changes', p_tenant || ':' || v_seq);
    END IF;
    merged := v_merged;
    superseded := v_superseded;
    archived := v_archived;
    skipped := v_skipped;
    RETURN NEXT;
END $$;
ALTER FUNCTION engram_consolidate_apply(bigint, bigint[], bigint[], bigint[], text[], text[],
    text[], bigint[], bigint[], bigint[], bigint[], text[], text[], bigint[], bigint[],
    double precision[])
    SET plan_cache_mode = force_generic_plan;

-- engram_consolidate_finish: a run's last step: records the run with its counts (p_rescored:
-- the memories the run ranked by their composite importance to decide prunes) and its
-- settings, which carry what it planned by rule (settings.rules, see consolidate.c). The
-- composite is not stored: every read computes it as of the request (memory.list
-- order_by composite, min_composite, search), so a stored copy would only go stale.
DROP FUNCTION IF EXISTS engram_consolidate_finish(bigint, text, bigint, bigint, double precision[],
                                                  jsonb, integer, integer, integer, integer);
CREATE OR REPLACE FUNCTION engram_consolidate_finish(
        p_tenant bigint, p_trigger text, p_started_ms bigint, p_merged integer,
        p_superseded integer, p_rescored integer, p_archived integer, p_skipped integer,
        p_settings jsonb)
    RETURNS TABLE (run_id bigint, rescored integer)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO consolidation_runs (tenant_id, trigger, status, started_at, finished_at, merged,
                                    superseded, rescored, archived, skipped, settings)
        VALUES (p_tenant, p_trigger, 'completed', engram_ts(p_started_ms), clock_timestamp(),
                p_merged, p_superseded, p_rescored, p_archived, p_skipped, p_settings)
        RETURNING consolidation_runs.id INTO run_id;
    rescored := p_rescored;
    RETURN NEXT;
END $$;

-- The union of a survivor's metadata with its merged members' (folded in id order).
CREATE OR REPLACE FUNCTION engram_metadata_union_all(a jsonb, others jsonb[]) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    r jsonb := a;
    o jsonb;
BEGIN
    FOREACH o IN ARRAY COALESCE(others, '{}') LOOP
        r := engram_metadata_union(r, o);
    END LOOP;
    RETURN r;
END $$;

-- Records a run that failed (its changes were rolled back).
CREATE OR REPLACE FUNCTION engram_consolidate_failed(p_tenant bigint, p_trigger text, p_started_ms bigint,
                                          p_error text) RETURNS bigint
    LANGUAGE sql AS $$
    INSERT INTO consolidation_runs (tenant_id, trigger, status, started_at, finished_at, error)
        VALUES (p_tenant, p_trigger, 'failed', engram_ts(p_started_ms), clock_timestamp(), p_error)
        RETURNING id
$$;

-- Tenants whose scheduled consolidation is due: p_hours holds the cadence of the three
-- tiers (0: never); due when the last completed run (or, before the first, the tenant's
-- creation) lies longer ago than that.
CREATE OR REPLACE FUNCTION engram_consolidation_due(p_hours integer[])
    RETURNS TABLE (tenant_id bigint, embed_dim integer)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT t.id, t.embed_dim FROM tenants t
    CROSS JOIN LATERAL (SELECT p_hours[CASE t.tier WHEN 'free' THEN 1 WHEN 'standard' THEN 2
                                       ELSE 3 END] AS h) c
    WHERE c.h > 0 AND t.memory_count > 0
      AND t.created_at < now() - make_interval(hours => c.h)
      AND NOT EXISTS (SELECT 1 FROM consolidation_runs r WHERE r.tenant_id = t.id
                      AND ((r.status = 'completed'
                            AND r.finished_at > now() - make_interval(hours => c.h))
                        OR (r.status = 'failed'  -- a failing tenant is retried after a pause
                            AND r.finished_at > now() - interval '15 minutes')))
    ORDER BY t.id
$$;

-- engram_consolidate_model_apply: applies one step of the decisions a chat model made on a
-- run's candidate groups (issue 32), atomically. Arrays, parallel:
--   p_kind[k]   'same' (p_other merges into p_keep; p_text, when not NULL, becomes the
--               survivor's text: the model's merged text), 'newer' (p_other is superseded by
--               p_keep, the memory with the newer information; p_text, when not NULL, is
--               p_keep's text with relative dates made absolute) or 'contradiction' (both
--               stay; each is flagged with the other in metadata.contradicts);
--   p_keep_seq, p_other_seq guard them (the seq each had when the run read it);
--   p_why[k]    the model's reason. p_model names the model for the history.
-- A rewritten text keeps the memory's embedding: the text means what the vector was
-- computed from (a merge of two texts the model judged the same, a date made absolute).
-- Every decision goes into the history (memory_versions.detail: rule model_<kind>, why,
-- model) of each memory it changes. p_own lists memories this run changed in earlier steps.
-- Returns the step's counts and the ids it changed that stay live (for p_own of the next).
CREATE OR REPLACE FUNCTION engram_consolidate_model_apply(
        p_tenant bigint, p_own bigint[], p_kind text[], p_keep bigint[], p_keep_seq bigint[],
        p_other bigint[], p_other_seq bigint[], p_text text[], p_why text[], p_model text)
    RETURNS TABLE (merged integer, superseded integer, flagged integer, rewritten integer,
                   skipped integer, changed bigint[])
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_n integer := COALESCE(cardinality(p_kind), 0);
    v_total bigint := 2 * COALESCE(cardinality(p_kind), 0);
    v_first bigint;
    v_seq bigint;
    v_own bigint[] := COALESCE(p_own, '{}');
    v_changed bigint[] := '{}';
    k integer;
    a memories;
    b memories;
    x memories;
    y memories;
    v_merged integer := 0;
    v_superseded integer := 0;
    v_flagged integer := 0;
    v_rewritten integer := 0;
    v_skipped integer := 0;
    v_now timestamptz := date_trunc('milliseconds', now());
    v_bytes bigint := 0;
    v_nb integer;
    v_detail jsonb;
    v_pass integer;
BEGIN
    v_first := engram_next_seq(p_tenant, v_total) - v_total + 1;
    v_seq := v_first - 1;
    FOR k IN 1 .. v_n LOOP
        -- both rows locked in id order, then checked: live and as the run read them
        PERFORM 1 FROM memories WHERE tenant_id = p_tenant AND id IN (p_keep[k], p_other[k])
            ORDER BY id FOR UPDATE;
        SELECT * INTO a FROM memories WHERE tenant_id = p_tenant AND id = p_keep[k]
            AND archived_at IS NULL AND (seq = p_keep_seq[k] OR id = ANY (v_own));
        IF FOUND THEN
            SELECT * INTO b FROM memories WHERE tenant_id = p_tenant AND id = p_other[k]
                AND archived_at IS NULL AND (seq = p_other_seq[k] OR id = ANY (v_own));
        END IF;
        IF NOT FOUND OR p_keep[k] = p_other[k]
           OR p_kind[k] NOT IN ('same', 'newer', 'contradiction') THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
        END IF;
        v_detail := jsonb_build_object('rule', 'model_' || p_kind[k], 'why', p_why[k],
                                       'model', p_model);
        IF p_kind[k] = 'same' THEN
            v_bytes := v_bytes + engram_keep_version(a, 'merge', v_detail
                || jsonb_build_object('merged', jsonb_build_array(b.id),
                                      'text', CASE WHEN p_text[k] IS NULL THEN 'survivor'
                                                   ELSE 'merged' END));
            v_seq := v_seq + 1;
            UPDATE memories m SET
                importance = greatest(m.importance, b.importance),
                access_count = m.access_count + b.access_count,
                metadata = engram_metadata_union(m.metadata, b.metadata),
                content = COALESCE(p_text[k], m.content),
                content_tsv = CASE WHEN p_text[k] IS NULL THEN m.content_tsv
                                   ELSE to_tsvector('english', p_text[k]) END,
                updated_at = v_now, version = m.version + 1, seq = v_seq
            WHERE m.tenant_id = p_tenant AND m.id = a.id
            RETURNING m.bytes INTO v_nb;
            v_bytes := v_bytes + v_nb - a.bytes;
            INSERT INTO memory_changes VALUES (p_tenant, v_seq, a.id, 'u');
            v_bytes := v_bytes + engram_keep_version(b, 'archive', v_detail
                || jsonb_build_object('reason', 'merged', 'into', a.id));
            v_seq := v_seq + 1;
            UPDATE memories SET archived_at = v_now, archived_reason = 'merged',
                                merged_into = a.id, updated_at = v_now,
                                version = version + 1, seq = v_seq
            WHERE tenant_id = p_tenant AND id = b.id;
            INSERT INTO memory_changes VALUES (p_tenant, v_seq, b.id, 'u');
            v_merged := v_merged + 1;
            IF p_text[k] IS NOT NULL THEN
                v_rewritten := v_rewritten + 1;
            END IF;
            v_changed := v_changed || a.id;
        ELSIF p_kind[k] = 'newer' THEN
            v_bytes := v_bytes + engram_keep_version(b, 'supersede', v_detail
                || jsonb_build_object('superseded_by', a.id));
            v_seq := v_seq + 1;
            UPDATE memories SET archived_at = v_now, archived_reason = 'superseded',
                                superseded_by = a.id, updated_at = v_now,
                                version = version + 1, seq = v_seq
            WHERE tenant_id = p_tenant AND id = b.id;
            INSERT INTO memory_changes VALUES (p_tenant, v_seq, b.id, 'u');
            v_superseded := v_superseded + 1;
            IF p_text[k] IS NOT NULL AND p_text[k] <> a.content THEN
                v_bytes := v_bytes + engram_keep_version(a, 'update', v_detail
                    || jsonb_build_object('rewrite', 'relative dates made absolute',
                                          'superseded', b.id));
                v_seq := v_seq + 1;
                UPDATE memories m SET content = p_text[k],
                                      content_tsv = to_tsvector('english', p_text[k]),
                                      updated_at = v_now, version = m.version + 1, seq = v_seq
                WHERE m.tenant_id = p_tenant AND m.id = a.id
                RETURNING m.bytes INTO v_nb;
                v_bytes := v_bytes + v_nb - a.bytes;
                INSERT INTO memory_changes VALUES (p_tenant, v_seq, a.id, 'u');
                v_rewritten := v_rewritten + 1;
                v_changed := v_changed || a.id;
            END IF;
        ELSE
            -- a contradiction: both stay, each flagged with the other
            FOR v_pass IN 1 .. 2 LOOP
                IF v_pass = 1 THEN
                    x := a;
                    y := b;
                ELSE
                    x := b;
                    y := a;
                END IF;
                v_bytes := v_bytes + engram_keep_version(x, 'flag', v_detail
                    || jsonb_build_object('contradicts', y.id));
                v_seq := v_seq + 1;
                UPDATE memories m SET
                    metadata = jsonb_set(m.metadata, '{contradicts}',
                        (SELECT COALESCE(jsonb_agg(DISTINCT e ORDER BY e), '[]')
                         FROM jsonb_array_elements(
                             CASE WHEN jsonb_typeof(m.metadata -> 'contradicts') = 'array'
                                  THEN m.metadata -> 'contradicts' ELSE '[]' END
                             || to_jsonb(y.id)) AS e)),
                    updated_at = v_now, version = m.version + 1, seq = v_seq
                WHERE m.tenant_id = p_tenant AND m.id = x.id
                RETURNING m.bytes INTO v_nb;
                v_bytes := v_bytes + v_nb - x.bytes;
                INSERT INTO memory_changes VALUES (p_tenant, v_seq, x.id, 'u');
            END LOOP;
            v_flagged := v_flagged + 1;
            v_changed := v_changed || a.id || b.id;
        END IF;
        v_own := v_own || v_changed;
    END LOOP;
    UPDATE tenants SET change_seq = change_seq - (v_first + v_total - 1 - v_seq),
                       memory_count = memory_count - (v_merged + v_superseded),
                       memory_bytes = memory_bytes + v_bytes
    WHERE id = p_tenant;
    IF v_seq >= v_first THEN
        PERFORM pg_notify('engram_changes', p_tenant || ':' || v_seq);
    END IF;
    merged := v_merged;
    superseded := v_superseded;
    flagged := v_flagged;
    rewritten := v_rewritten;
    skipped := v_skipped;
    changed := v_changed;
    RETURN NEXT;
END $$;
