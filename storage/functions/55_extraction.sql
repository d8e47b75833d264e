-- functions/55_extraction.sql: memory extraction from session transcripts and the auto-dream
-- pass (issue 32, items 4 and 6; migration 0011). The model calls run in engramd
-- (server/domain/extract.c, dream.c); these functions claim the work, hand out the
-- transcript, and apply what a run decided in one transaction.
--
-- A change of signature needs a DROP FUNCTION IF EXISTS of the old signature above the new
-- definition.

-- engram_extract_state: the session's extraction state as session.get shows it.
CREATE OR REPLACE FUNCTION engram_extract_state(p_tenant bigint, p_session bigint)
    RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'through_entry_id', e.through_entry_id,
        'through_position', COALESCE(e.through_seq, s.base_seq),
        'pending_messages', (SELECT count(*) FROM session_entries x
                             WHERE x.tenant_id = s.tenant_id AND x.session_id = s.id
                               AND x.kind = 'message'
                               AND x.seq > COALESCE(e.through_seq, s.base_seq)),
        'runs', COALESCE(e.runs, 0), 'failures', COALESCE(e.failures, 0),
        'facts_added', COALESCE(e.facts_added, 0),
        'facts_updated', COALESCE(e.facts_updated, 0),
        'facts_unchanged', COALESCE(e.facts_unchanged, 0),
        'tokens_in', COALESCE(e.tokens_in, 0), 'tokens_out', COALESCE(e.tokens_out, 0),
        'last_run_at', engram_ms(e.last_run_at), 'last_trigger', e.last_trigger,
        'last_status', e.last_status, 'last_error', e.last_error,
        'running', e.running_by IS NOT NULL,
        'running_since', engram_ms(e.running_since))
    FROM sessions s
    LEFT JOIN session_extraction e ON e.tenant_id = s.tenant_id AND e.session_id = s.id
    WHERE s.tenant_id = p_tenant AND s.id = p_session
$$;

-- engram_extract_begin: claims the session's extraction for p_holder and returns what the
-- run reads: {agent_id, state, through_seq, entries: [{id, seq, role, content,
-- created_at}], more}. The entries are the session's own messages (user and assistant; not
-- tombstoned; not inherited from the session it was resumed from) after through_seq, up to
-- p_through_entry when given (an entry of this session), at most p_max_entries and about
-- p_max_bytes of content (more: true when entries are left for another run). A claim
-- younger than p_stale_s held by another run is {error: busy}; an older one is taken over
-- (its process died); an unknown session or entry is {error: not_found}. Commit before
-- calling the model: the claim must be seen by others.
CREATE OR REPLACE FUNCTION engram_extract_begin(p_tenant bigint, p_session bigint,
        p_through_entry bigint, p_holder text, p_stale_s integer, p_max_entries integer,
        p_max_bytes bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions;
    e session_extraction;
    v_from bigint;
    v_to bigint;
    v_entries jsonb;
    v_last bigint;
    v_more boolean;
BEGIN
    SELECT * INTO s FROM sessions WHERE tenant_id = p_tenant AND id = p_session;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('error', 'not_found',
                                  'message', format('session %s not found', p_session));
    END IF;
    INSERT INTO session_extraction (tenant_id, session_id, through_seq)
        VALUES (p_tenant, p_session, s.base_seq) ON CONFLICT DO NOTHING;
    SELECT * INTO e FROM session_extraction
        WHERE tenant_id = p_tenant AND session_id = p_session FOR UPDATE;
    IF e.running_by IS NOT NULL AND e.running_by <> p_holder
       AND e.running_since > now() - make_interval(secs => p_stale_s) THEN
        RETURN jsonb_build_object('error', 'busy', 'message',
            format('an extraction of session %s is running (since %s)', p_session,
                   e.running_since));
    END IF;
    v_from := greatest(e.through_seq, s.base_seq);
    v_to := s.position;
    IF p_through_entry IS NOT NULL THEN
        SELECT x.seq INTO v_to FROM session_entries x
            WHERE x.tenant_id = p_tenant AND x.session_id = p_session AND x.id = p_through_entry;
        IF NOT FOUND THEN
            RETURN jsonb_build_object('error', 'not_found', 'message',
                format('entry %s is not an entry of session %s', p_through_entry, p_session));
        END IF;
    END IF;
    WITH cand AS (
        SELECT x.id, x.seq, x.role, x.content, x.created_at,
               sum(octet_length(x.content)) OVER (ORDER BY x.seq) AS run_bytes,
               row_number() OVER (ORDER BY x.seq) AS rn
        FROM session_entries x
        WHERE x.tenant_id = p_tenant AND x.session_id = p_session AND x.kind = 'message'
          AND x.role IN ('user', 'assistant') AND x.seq > v_from AND x.seq <= v_to
          AND NOT EXISTS (SELECT 1 FROM session_entries t
                          WHERE t.tenant_id = p_tenant AND t.session_id = p_session
                            AND t.kind = 'tombstone' AND t.target_id = x.id)
    ), taken AS (
        SELECT * FROM cand WHERE rn <= p_max_entries AND (rn = 1 OR run_bytes <= p_max_bytes)
    )
    SELECT COALESCE(jsonb_agg(jsonb_build_object('id', t.id, 'seq', t.seq, 'role', t.role,
                                                 'content', t.content,
                                                 'created_at', engram_ms(t.created_at))
                              ORDER BY t.seq), '[]'),
           max(t.seq),
           EXISTS (SELECT 1 FROM cand c WHERE c.seq > COALESCE(max(t.seq), v_to))
        INTO v_entries, v_last, v_more
    FROM taken t;
    UPDATE session_extraction SET running_by = p_holder, running_since = now()
        WHERE tenant_id = p_tenant AND session_id = p_session;
    RETURN jsonb_build_object('agent_id', s.agent_id, 'state', s.state,
                              'embed_provider', (SELECT t.embed_provider FROM tenants t
                                                 WHERE t.id = p_tenant),
                              -- the generation of that model: the facts' store is refused
                              -- after a re-embedding's swap (engram_embed_gen_check)
                              'embed_gen', (SELECT t.embed_gen FROM tenants t
                                            WHERE t.id = p_tenant),
                              'through_seq', v_from,
                              -- with nothing to read, the run may still move past entries
                              -- that are not messages (events, tombstones)
                              'last_seq', CASE WHEN v_more THEN v_last ELSE v_to END,
                              'entries', v_entries, 'more', v_more);
END $$;

-- engram_extract_fail: a run that changed no memory (a fault, the cap, the model off):
-- records why and releases the claim when it is still p_holder's.
CREATE OR REPLACE FUNCTION engram_extract_fail(p_tenant bigint, p_session bigint, p_holder text,
        p_trigger text, p_status text, p_error text, p_tokens_in bigint, p_tokens_out bigint,
        p_result jsonb)
    RETURNS void LANGUAGE sql AS $$
    UPDATE session_extraction SET
        failures = failures + 1, last_run_at = now(), last_trigger = p_trigger,
        last_status = p_status, last_error = p_error, last_result = p_result,
        tokens_in = tokens_in + p_tokens_in, tokens_out = tokens_out + p_tokens_out,
        running_by = CASE WHEN running_by = p_holder THEN NULL ELSE running_by END,
        running_since = CASE WHEN running_by = p_holder THEN NULL ELSE running_since END
    WHERE tenant_id = p_tenant AND session_id = p_session
$$;

-- engram_extract_finish: applies a run, all or nothing, if p_holder still holds the claim
-- (else {error: busy}: the claim went stale and another run took it; this one changes
-- nothing).
-- The new facts (parallel arrays; p_embeddings back to back, p_dim float32 each) are stored
-- as memories of the session's agent (engram_memory_store_batch: the tier's limits hold).
-- Each update (p_sup_fact: the 1-based index of the new fact; p_sup_old, p_sup_seq: the
-- memory it supersedes and its change number when the run read it; p_sup_why: the model's
-- reason) archives the older memory as superseded by the new one, with the rule, the reason,
-- the model and the session in its history; an older memory that changed since it was read
-- is left alone (counted skipped). Then the session's state moves to p_last_seq.
-- Returns {added, updated, skipped, memory_ids}.
DROP FUNCTION IF EXISTS engram_extract_finish(bigint, bigint, text, text, bigint[], integer,
    bigint, bigint, text[], text[], double precision[], text[], bytea, integer[], bigint[],
    bigint[], text[], text, integer, bigint, bigint, jsonb);
CREATE OR REPLACE FUNCTION engram_extract_finish(p_tenant bigint, p_session bigint,
        p_holder text, p_trigger text, p_limits bigint[], p_dim integer, p_last_seq bigint,
        p_agent bigint, p_type text[], p_content text[], p_importance double precision[],
        p_metadata text[], p_embeddings bytea, p_sup_fact integer[], p_sup_old bigint[],
        p_sup_seq bigint[], p_sup_why text[], p_model text, p_unchanged integer,
        p_tokens_in bigint, p_tokens_out bigint, p_result jsonb, p_gen bigint DEFAULT NULL)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    e session_extraction;
    n integer := COALESCE(cardinality(p_content), 0);
    v_ids bigint[] := '{}';
    v_updated integer := 0;
    v_skipped integer := 0;
    v_bytes bigint := 0;
    v_seq bigint;
    v_through_id bigint;
    o memories;
    k integer;
BEGIN
    SELECT * INTO e FROM session_extraction
        WHERE tenant_id = p_tenant AND session_id = p_session FOR UPDATE;
    IF NOT FOUND OR e.running_by IS DISTINCT FROM p_holder THEN
        RETURN jsonb_build_object('error', 'busy', 'message',
            format('the extraction claim of session %s was taken over', p_session));
    END IF;
    IF n > 0 THEN
        SELECT array_agg(b.m_id ORDER BY b.idx) INTO v_ids
        FROM engram_memory_store_batch(p_tenant, p_limits, NULL, NULL, p_dim,
                array_fill(p_agent, ARRAY[n]), array_fill(0::bigint, ARRAY[n]),
                array_fill('agent'::text, ARRAY[n]), p_type, p_content, p_importance,
                p_metadata, p_embeddings, array_fill(NULL::bigint, ARRAY[n]),
                array_fill(NULL::bigint, ARRAY[n]), array_fill(NULL::bigint, ARRAY[n]),
                array_fill(NULL::bigint, ARRAY[n]), array_fill(NULL::bigint, ARRAY[n]),
                array_fill(NULL::boolean, ARRAY[n]), p_gen) AS b;
    END IF;
    FOR k IN 1 .. COALESCE(cardinality(p_sup_fact), 0) LOOP
        SELECT * INTO o FROM memories
            WHERE tenant_id = p_tenant AND id = p_sup_old[k] AND archived_at IS NULL
              AND seq = p_sup_seq[k]
            FOR UPDATE;
        IF NOT FOUND OR p_sup_fact[k] < 1 OR p_sup_fact[k] > n THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
        END IF;
        v_bytes := v_bytes + engram_keep_version(o, 'supersede', jsonb_build_object(
            'rule', 'extraction_update', 'why', p_sup_why[k], 'model', p_model,
            'session_id', p_session, 'superseded_by', v_ids[p_sup_fact[k]]));
        v_seq := engram_next_seq(p_tenant, 1);
        UPDATE memories SET archived_at = date_trunc('milliseconds', now()),
                            archived_reason = 'superseded', superseded_by = v_ids[p_sup_fact[k]],
                            updated_at = date_trunc('milliseconds', now()),
                            version = version + 1, seq = v_seq
            WHERE tenant_id = p_tenant AND id = o.id;
        INSERT INTO memory_changes VALUES (p_tenant, v_seq, o.id, 'u');
        UPDATE tenants SET memory_count = memory_count - 1, memory_bytes = memory_bytes + v_bytes
            WHERE id = p_tenant;
        v_bytes := 0;
        v_updated := v_updated + 1;
    END LOOP;
    IF v_updated > 0 THEN
        PERFORM pg_notify('engram_changes', p_tenant || ':' || v_seq);
    END IF;
    SELECT x.id INTO v_through_id FROM session_entries x
        WHERE x.tenant_id = p_tenant AND x.session_id = p_session AND x.seq <= p_last_seq
        ORDER BY x.seq DESC LIMIT 1;
    UPDATE session_extraction SET
        through_seq = greatest(through_seq, p_last_seq),
        through_entry_id = COALESCE(v_through_id, through_entry_id),
        runs = runs + 1, facts_added = facts_added + n - v_updated,
        facts_updated = facts_updated + v_updated,
        facts_unchanged = facts_unchanged + p_unchanged,
        tokens_in = tokens_in + p_tokens_in, tokens_out = tokens_out + p_tokens_out,
        last_run_at = now(), last_trigger = p_trigger, last_status = 'ok', last_error = NULL,
        last_result = p_result, running_by = NULL, running_since = NULL
    WHERE tenant_id = p_tenant AND session_id = p_session;
    RETURN jsonb_build_object('added', n - v_updated, 'updated', v_updated,
                              'skipped', v_skipped, 'memory_ids', to_jsonb(v_ids));
END $$;

-- engram_extract_due: sessions whose automatic extraction gates pass (docs/operations.md):
-- at least p_min_messages new messages and p_min_tokens new tokens (an entry's tokens as
-- appended, else its bytes / 4) since the last extraction, and the session idle for
-- p_idle_s or no longer active; not claimed by a run younger than p_stale_s; not failed in
-- the last p_retry_s. At most p_limit, the longest idle first.
CREATE OR REPLACE FUNCTION engram_extract_due(p_min_messages integer, p_min_tokens bigint,
        p_idle_s integer, p_stale_s integer, p_retry_s integer, p_limit integer)
    RETURNS TABLE (tenant_id bigint, session_id bigint, embed_dim integer)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT s.tenant_id, s.id, t.embed_dim
    FROM sessions s
    JOIN tenants t ON t.id = s.tenant_id
    LEFT JOIN session_extraction e ON e.tenant_id = s.tenant_id AND e.session_id = s.id
    CROSS JOIN LATERAL (
        SELECT count(*) AS msgs,
               COALESCE(sum(COALESCE(x.tokens, octet_length(x.content) / 4)), 0) AS toks
        FROM session_entries x
        WHERE x.tenant_id = s.tenant_id AND x.session_id = s.id AND x.kind = 'message'
          AND x.seq > COALESCE(e.through_seq, s.base_seq)) n
    WHERE s.position >= COALESCE(e.through_seq, s.base_seq) + p_min_messages
      AND (s.state <> 'active' OR s.updated_at < now() - make_interval(secs => p_idle_s))
      AND (e.running_by IS NULL OR e.running_since < now() - make_interval(secs => p_stale_s))
      AND (e.last_status IS NULL OR e.last_status = 'ok'
           OR e.last_run_at < now() - make_interval(secs => p_retry_s))
      AND n.msgs >= p_min_messages AND n.toks >= p_min_tokens
    ORDER BY s.updated_at
    LIMIT p_limit
$$;

-- ---- auto-dream ----------------------------------------------------------------------------

-- engram_dream_state: the tenant's dream state (tenant.dream), with the new sessions since
-- the last pass.
CREATE OR REPLACE FUNCTION engram_dream_state(p_tenant bigint) RETURNS jsonb
    LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'last_run_at', engram_ms(d.last_run_at), 'runs', COALESCE(d.runs, 0),
        'last_attempt_at', engram_ms(d.last_attempt_at),
        'last_session_id', COALESCE(d.last_session_id, 0),
        'new_sessions', (SELECT count(*) FROM sessions s WHERE s.tenant_id = p_tenant
                           AND s.id > COALESCE(d.last_session_id, 0)),
        'last_status', d.last_status, 'last_error', d.last_error,
        'last_result', d.last_result,
        'lock_holder', d.lock_holder, 'lock_at', engram_ms(d.lock_at),
        'takeovers', COALESCE(d.takeovers, 0))
    FROM (SELECT p_tenant AS id) t
    LEFT JOIN dream_state d ON d.tenant_id = t.id
$$;

-- engram_dream_due: tenants whose three gates pass, cheapest first: the time since the last
-- pass (p_hours), the sessions created since (p_min_sessions), and no lock younger than
-- p_stale_s. At most p_limit.
CREATE OR REPLACE FUNCTION engram_dream_due(p_hours double precision, p_min_sessions integer,
        p_stale_s integer, p_limit integer)
    RETURNS TABLE (tenant_id bigint, embed_dim integer)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT t.id, t.embed_dim FROM tenants t
    LEFT JOIN dream_state d ON d.tenant_id = t.id
    WHERE (d.last_run_at IS NULL OR d.last_run_at < now() - make_interval(secs => p_hours * 3600))
      AND (SELECT count(*) FROM sessions s WHERE s.tenant_id = t.id
             AND s.id > COALESCE(d.last_session_id, 0)) >= p_min_sessions
      AND (d.lock_holder IS NULL OR d.lock_at < now() - make_interval(secs => p_stale_s))
      -- a pass that failed is retried after a pause
      AND (d.last_status IS NULL OR d.last_status = 'ok'
           OR d.last_attempt_at < now() - interval '15 minutes')
    ORDER BY d.last_run_at NULLS FIRST, t.id
    LIMIT p_limit
$$;

-- engram_dream_lock: takes the tenant's dream lock for p_holder when the gates still pass
-- (checked again under the row's lock: two processes that both saw the tenant due cannot
-- both take it). Returns {locked, takeover, last_session_id, sessions: [ids of the sessions
-- since the last pass, oldest first]} (p_force: take it whatever the time and sessions
-- gates say, still never from a live holder).
CREATE OR REPLACE FUNCTION engram_dream_lock(p_tenant bigint, p_holder text, p_hours double precision,
        p_min_sessions integer, p_stale_s integer, p_force boolean, p_max_sessions integer)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    d dream_state;
    v_new bigint;
    v_takeover boolean;
BEGIN
    INSERT INTO dream_state (tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    SELECT * INTO d FROM dream_state WHERE tenant_id = p_tenant FOR UPDATE;
    IF d.lock_holder IS NOT NULL AND d.lock_holder <> p_holder
       AND d.lock_at > now() - make_interval(secs => p_stale_s) THEN
        RETURN jsonb_build_object('locked', false, 'why', 'locked',
                                  'holder', d.lock_holder, 'lock_at', engram_ms(d.lock_at));
    END IF;
    SELECT count(*) INTO v_new FROM sessions s
        WHERE s.tenant_id = p_tenant AND s.id > d.last_session_id;
    IF NOT p_force AND ((d.last_run_at IS NOT NULL
                         AND d.last_run_at > now() - make_interval(secs => p_hours * 3600))
                        OR v_new < p_min_sessions) THEN
        RETURN jsonb_build_object('locked', false, 'why', 'not_due');
    END IF;
    v_takeover := d.lock_holder IS NOT NULL AND d.lock_holder <> p_holder;
    UPDATE dream_state SET lock_holder = p_holder, lock_at = now(),
                           takeovers = takeovers + CASE WHEN v_takeover THEN 1 ELSE 0 END
        WHERE tenant_id = p_tenant;
    RETURN jsonb_build_object(
        'locked', true, 'takeover', v_takeover, 'last_session_id', d.last_session_id,
        'sessions', COALESCE((SELECT jsonb_agg(x.id ORDER BY x.id) FROM (
            SELECT s.id FROM sessions s WHERE s.tenant_id = p_tenant AND s.id > d.last_session_id
            ORDER BY s.id LIMIT p_max_sessions) x), '[]'));
END $$;

-- engram_dream_unlock: ends a pass of p_holder: the newest session it covered (every session
-- up to p_last_session was extracted) moves on; on success (p_status 'ok') the time gate
-- restarts too; either way the outcome is recorded and the lock released. A pass whose lock
-- was taken over (another holder now) records nothing. Returns whether it still held the
-- lock.
CREATE OR REPLACE FUNCTION engram_dream_unlock(p_tenant bigint, p_holder text, p_status text,
        p_error text, p_last_session bigint, p_result jsonb)
    RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE dream_state SET
        last_run_at = CASE WHEN p_status = 'ok' THEN now() ELSE last_run_at END,
        last_attempt_at = now(),
        last_session_id = greatest(last_session_id, COALESCE(p_last_session, 0)),
        runs = runs + CASE WHEN p_status = 'ok' THEN 1 ELSE 0 END,
        last_status = p_status, last_error = p_error, last_result = p_result,
        lock_holder = NULL, lock_at = NULL
    WHERE tenant_id = p_tenant AND lock_holder = p_holder;
    RETURN FOUND;
END $$;
