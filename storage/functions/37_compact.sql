-- storage/functions/37_compact.sql: auto-compact (issue 32, item 5; seed 001): when a
-- session's live history passes config.compaction.threshold of its model's context window,
-- a background job (server/domain/autocompact.c) truncates old tool results and has the
-- tenant's chat model summarize the older API rounds. See migrations/0011_auto_compact.sql.
--
-- Repeatable: engramd applies this file whole, in one transaction, whenever its checksum
-- differs from the one recorded in schema_functions (see storage/migrate.h). Every
-- definition is CREATE OR REPLACE; a change of a function's arguments or result type
-- needs a DROP FUNCTION IF EXISTS of the old signature above the new definition.

-- engram_compact_tokens: the token estimate of n bytes of text (4 bytes a token, rounded
-- up; the estimate memory.prompt and the context block use).
CREATE OR REPLACE FUNCTION engram_compact_tokens(n bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT (COALESCE(n, 0) + 3) / 4 $$;

-- engram_model_window: the context window in tokens of model p_model under the setting
-- compact_context_windows ("claude=200000,gpt-4o=128000,*=200000"): the entry whose prefix
-- is the longest prefix of the model's name (case-insensitive), else the "*" entry, else
-- 200000 (the seed's default). PL/pgSQL: every append asks, and its plan stays cached.
CREATE OR REPLACE FUNCTION engram_model_window(p_model text, p_windows text) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_model text := lower(COALESCE(p_model, ''));
    v_entry text;
    v_prefix text;
    v_best integer := -1;
    v_tokens bigint := 200000;
    v_star bigint;
BEGIN
    FOREACH v_entry IN ARRAY string_to_array(COALESCE(p_windows, ''), ',') LOOP
        CONTINUE WHEN position('=' IN v_entry) = 0;
        v_prefix := lower(btrim(split_part(v_entry, '=', 1)));
        IF v_prefix = '*' THEN
            v_star := btrim(split_part(v_entry, '=', 2))::bigint;
        ELSIF starts_with(v_model, v_prefix) AND length(v_prefix) > v_best THEN
            v_best := length(v_prefix);
            v_tokens := btrim(split_part(v_entry, '=', 2))::bigint;
        END IF;
    END LOOP;
    RETURN CASE WHEN v_best >= 0 THEN v_tokens ELSE COALESCE(v_star, 200000) END;
END $$;

-- engram_compact_marks: the summaries and tombstones of p_session's transcript as of p_upto
-- (its own and inherited), read through session_entries_marks without the messages, with
-- whether each is live (no tombstone hides it).
CREATE OR REPLACE FUNCTION engram_compact_marks(p_tenant bigint, p_session bigint, p_upto bigint)
    RETURNS TABLE (id bigint, kind text, target_id bigint, target_seq bigint, bytes bigint,
                   live boolean)
    LANGUAGE sql STABLE AS $$
    WITH m AS MATERIALIZED (
        SELECT e.id, e.kind, e.target_id, e.target_seq, octet_length(e.content) AS bytes
        FROM engram_session_chain(p_tenant, p_session, p_upto) c
        JOIN session_entries e ON e.tenant_id = p_tenant AND e.session_id = c.session_id
                              AND e.seq <= c.upto
        WHERE e.kind IN ('summary', 'tombstone')
    )
    SELECT m.id, m.kind, m.target_id, m.target_seq, m.bytes::bigint,
           NOT EXISTS (SELECT 1 FROM m t WHERE t.kind = 'tombstone' AND t.target_id = m.id)
    FROM m
$$;

-- engram_compact_entries: the live messages after the newest live summary as of p_upto, in
-- order: what auto-compact may truncate or summarize (and, summed, the rest of the history
-- a model is given). session_id tells an inherited entry (a resumed session's) from the
-- session's own. Reads the messages after the summary only (the primary key's range), never
-- the whole transcript: each message is checked against the tombstones by a hash.
CREATE OR REPLACE FUNCTION engram_compact_entries(p_tenant bigint, p_session bigint, p_upto bigint)
    RETURNS TABLE (id bigint, seq bigint, session_id bigint, role text, content text)
    LANGUAGE sql STABLE AS $$
    WITH m AS MATERIALIZED (SELECT * FROM engram_compact_marks(p_tenant, p_session, p_upto)),
    cut AS (SELECT COALESCE(max(m.target_seq) FILTER (WHERE m.kind = 'summary' AND m.live), 0)
                   AS seq FROM m)
    SELECT e.id, e.seq, e.session_id, e.role, e.content
    FROM engram_session_chain(p_tenant, p_session, p_upto) c
    JOIN session_entries e ON e.tenant_id = p_tenant AND e.session_id = c.session_id
                          AND e.seq <= c.upto AND e.seq > (SELECT cut.seq FROM cut)
    WHERE e.kind = 'message'
      AND e.id NOT IN (SELECT m.target_id FROM m WHERE m.kind = 'tombstone')
    ORDER BY e.seq
$$;

-- engram_session_live_bytes: the bytes of the history a model is given as of p_upto: the
-- newest live compaction summary and the live messages after the entry it compacts through.
CREATE OR REPLACE FUNCTION engram_session_live_bytes(p_tenant bigint, p_session bigint,
                                                     p_upto bigint)
    RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT m.bytes FROM engram_compact_marks(p_tenant, p_session, p_upto) m
                     WHERE m.kind = 'summary' AND m.live
                     ORDER BY m.target_seq DESC LIMIT 1), 0)
         + COALESCE((SELECT sum(octet_length(x.content))
                     FROM engram_compact_entries(p_tenant, p_session, p_upto) x), 0)::bigint
$$;

-- engram_compact_settings: config.compaction with the seed's defaults also where the client
-- sent a null: enabled, threshold, keep_recent, tool_result_budget, max_failures.
CREATE OR REPLACE FUNCTION engram_compact_settings(p_cfg jsonb,
    OUT enabled boolean, OUT threshold float8, OUT keep_recent bigint,
    OUT tool_result_budget bigint, OUT max_failures integer)
    LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE((c ->> 'enabled')::boolean, true), COALESCE((c ->> 'threshold')::float8, 0.9),
           COALESCE((c ->> 'keep_recent')::bigint, 10),
           COALESCE((c ->> 'tool_result_budget')::bigint, 50000),
           COALESCE((c ->> 'max_failures')::integer, 3)
    FROM (SELECT engram_session_config(p_cfg) -> 'compaction' AS c) x
$$;

-- engram_compact_check: for an append of p_added bytes to session s (the row as locked,
-- before the append moved it): the live history's bytes after it, and whether the session
-- is due for auto-compact: they pass the threshold of its model's window (p_windows:
-- compact_context_windows; NULL: the server has no chat model, nothing is marked), unless
-- auto-compact is disabled for it, or the last attempt, less than a minute ago, could not
-- be made for a reason an append does not change (no model, the tenant's chat_model none,
-- its daily token cap, nothing old enough to summarize): then the next append after that
-- minute tries again, so an agent appending fast does not have its whole transcript read
-- at every append. The append stores both in its own update and never waits for the
-- compaction. PL/pgSQL without SQL-function calls on the common path: it runs at every
-- append.
CREATE OR REPLACE FUNCTION engram_compact_check(s sessions, p_added bigint, p_windows text,
                                                OUT bytes bigint, OUT due boolean)
    LANGUAGE plpgsql AS $$
DECLARE
    c jsonb := s.config -> 'compaction';
BEGIN
    bytes := CASE WHEN s.compact_bytes IS NULL
                  THEN engram_session_live_bytes(s.tenant_id, s.id, s.position) + p_added
                  ELSE s.compact_bytes + p_added END;
    due := s.compact_due;
    IF due OR p_windows IS NULL OR s.compact_off
       OR NOT COALESCE((c ->> 'enabled')::boolean, true) THEN
        RETURN;
    END IF;
    IF (bytes + 3) / 4 <= COALESCE((c ->> 'threshold')::float8, 0.9)
                          * engram_model_window(s.config ->> 'model', p_windows) THEN
        RETURN;
    END IF;
    due := NOT COALESCE(s.compact_last ->> 'status' IN ('unconfigured', 'off', 'cap_reached',
                                                        'failed', 'nothing_to_compact')
                        AND (s.compact_last ->> 'at')::bigint
                            > engram_ms(engram_session_now()) - 60000, false);
END $$;

-- engram_compact_due: up to p_limit sessions of any tenant marked due, the least recently
-- active first. SECURITY DEFINER: the job looks across tenants (then works on each inside
-- its tenant's transactions).
CREATE OR REPLACE FUNCTION engram_compact_due(p_limit integer)
    RETURNS TABLE (tenant_id bigint, session_id bigint)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT s.tenant_id, s.id FROM sessions s WHERE s.compact_due
    ORDER BY s.updated_at LIMIT p_limit
$$;

-- engram_compact_state: what the job needs of a session before it asks the model: its
-- settings, its model's window, the live history's exact size and the summary in place.
CREATE OR REPLACE FUNCTION engram_compact_state(p_tenant bigint, p_session bigint, p_windows text)
    RETURNS TABLE (state text, due boolean, disabled boolean, upto bigint, model text,
                   context_window bigint, enabled boolean, threshold float8, keep_recent bigint,
                   tool_result_budget bigint, live_bytes bigint, summary text,
                   summary_seq bigint)
    LANGUAGE sql STABLE AS $$
    SELECT s.state, s.compact_due, s.compact_off, s.position, s.config ->> 'model',
           engram_model_window(s.config ->> 'model', p_windows), k.enabled, k.threshold,
           k.keep_recent, k.tool_result_budget,
           engram_session_live_bytes(p_tenant, p_session, s.position), t.content, t.target_seq
    FROM sessions s
    CROSS JOIN LATERAL engram_compact_settings(s.config) k
    LEFT JOIN LATERAL engram_session_summary_top(p_tenant, p_session, s.position) t ON true
    WHERE s.tenant_id = p_tenant AND s.id = p_session
$$;

-- engram_compact_finish: writes one auto-compaction in one transaction: a compact_start
-- event, the truncation of the tool results p_trunc (the session's own, still longer than
-- p_budget characters: content keeps the first p_budget characters and a note, the full
-- text moves to original_content), the summary standing in for the transcript through
-- p_through (NULL: none; engram_session_summarize, which keeps config.compaction.keep_recent),
-- and a compact_end event with tokens_freed (the live history's estimate before minus
-- after). p_data goes into both events (model, window, threshold, the model's tokens).
-- Clears the session's due mark and its failures. EG409 when auto-compact is off for the
-- session or another summary got there first.
CREATE OR REPLACE FUNCTION engram_compact_finish(p_tenant bigint, p_session bigint,
                                                 p_through bigint, p_summary text,
                                                 p_compacted bigint, p_trunc bigint[],
                                                 p_budget bigint, p_data jsonb,
                                                 p_max_entries bigint, p_max_bytes bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    v_now timestamptz := engram_session_now();
    v_before bigint;
    v_after bigint;
    v_trunc bigint;
    v_sum jsonb;
    v_end jsonb;
BEGIN
    PERFORM engram_session_require_active(s);
    IF s.compact_off THEN
        RAISE EXCEPTION 'auto-compact is off for session %', s.id USING ERRCODE = 'EG409';
    END IF;
    v_before := engram_session_live_bytes(p_tenant, s.id, s.position);
    PERFORM engram_session_event(s, 'compact_start', s.agent_id, 'auto-compact started',
                                 p_data || jsonb_build_object(
                                     'trigger', 'auto',
                                     'tokens_before', engram_compact_tokens(v_before)),
                                 v_now);
    UPDATE sessions SET position = position + 1 WHERE tenant_id = p_tenant AND id = s.id;
    WITH t AS (
        UPDATE session_entries e
            SET original_content = e.content,
                content = left(e.content, p_budget::integer)
                          || format(E'\n[auto-compact: %s of this tool result''s %s characters cut]',
                                    char_length(e.content) - p_budget, char_length(e.content))
            WHERE e.tenant_id = p_tenant AND e.session_id = s.id AND e.id = ANY (p_trunc)
              AND e.kind = 'message' AND e.role = 'tool' AND e.original_content IS NULL
              AND char_length(e.content) > p_budget
            RETURNING e.id)
    SELECT count(*) INTO v_trunc FROM t;
    IF p_through IS NOT NULL THEN
        v_sum := engram_session_summarize(p_tenant, s.id, p_summary, p_through, p_compacted,
                                          p_max_entries, p_max_bytes);
    END IF;
    s := engram_session_get_row(p_tenant, s.id);
    v_after := engram_session_live_bytes(p_tenant, s.id, s.position);
    v_end := jsonb_build_object(
        'trigger', 'auto',
        'tokens_before', engram_compact_tokens(v_before),
        'tokens_after', engram_compact_tokens(v_after),
        'tokens_freed', engram_compact_tokens(v_before) - engram_compact_tokens(v_after),
        'summary_entry_id', v_sum -> 'entry_id',
        'messages_compacted', CASE WHEN p_through IS NOT NULL THEN p_compacted ELSE 0 END,
        'tool_results_truncated', v_trunc);
    PERFORM engram_session_event(s, 'compact_end', s.agent_id,
                                 format('auto-compact freed about %s tokens',
                                        v_end ->> 'tokens_freed'),
                                 p_data || v_end, v_now);
    UPDATE sessions
        SET position = position + 1, updated_at = v_now, compact_bytes = v_after,
            compact_due = false, compact_failures = 0, compact_runs = compact_runs + 1,
            compact_last = jsonb_build_object('status', 'ok', 'reason', NULL,
                                              'at', engram_ms(v_now), 'counted', false)
                           || v_end
        WHERE tenant_id = p_tenant AND id = s.id;
    RETURN v_end;
END $$;

-- engram_compact_failed: an attempt that wrote nothing. p_counted: a failure of the
-- compaction itself (the model's call failed or its answer was unusable), counted in a row
-- until config.compaction.max_failures turns auto-compact off for the session; not counted:
-- it could not be tried (no model, the tenant's daily token cap, nothing old enough to
-- summarize, under the threshold after an exact count). The due mark is cleared either way:
-- the next append over the threshold sets it again. p_bytes (not NULL) is the live
-- history's exact size. Returns the session's auto_compact view.
CREATE OR REPLACE FUNCTION engram_compact_failed(p_tenant bigint, p_session bigint, p_status text,
                                                 p_reason text, p_counted boolean,
                                                 p_bytes bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    k record := engram_compact_settings(s.config);
    v_fail integer := s.compact_failures + CASE WHEN p_counted THEN 1 ELSE 0 END;
    v_off boolean := s.compact_off OR (p_counted AND v_fail >= k.max_failures);
BEGIN
    UPDATE sessions
        SET compact_due = false, compact_failures = v_fail, compact_off = v_off,
            compact_bytes = COALESCE(p_bytes, compact_bytes),
            compact_last = jsonb_build_object('status', p_status, 'reason', p_reason,
                                              'at', engram_ms(engram_session_now()),
                                              'counted', p_counted, 'failures', v_fail,
                                              'off', v_off)
        WHERE tenant_id = p_tenant AND id = s.id;
    RETURN jsonb_build_object('failures', v_fail, 'off', v_off);
END $$;
