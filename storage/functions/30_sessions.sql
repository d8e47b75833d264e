-- storage/functions/30_sessions.sql: Sessions: transcripts, scratchpad, notes, checkpoints,
-- sub-agents, handoff.
--
-- Repeatable: engramd applies this file whole, in one transaction, whenever its checksum
-- differs from the one recorded in schema_functions (see storage/migrate.h). Every
-- definition is CREATE OR REPLACE; a change of a function's arguments or result type
-- needs a DROP FUNCTION IF EXISTS of the old signature above the new definition.

-- The 64 bits of a client's unsigned id, stored in bigint, as the unsigned number.
CREATE OR REPLACE FUNCTION engram_session_u64(v bigint) RETURNS numeric
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN v < 0 THEN v::numeric + 18446744073709551616 ELSE v::numeric END $$;

-- The wall clock in ms precision. clock_timestamp, not now(): rows are stamped after the
-- session lock is taken, so times never run backwards against seq and id order.
CREATE OR REPLACE FUNCTION engram_session_now() RETURNS timestamptz
    LANGUAGE sql VOLATILE
    AS $$ SELECT date_trunc('milliseconds', clock_timestamp()) $$;

CREATE OR REPLACE FUNCTION engram_session_arr_minus(a bigint[], b bigint[]) RETURNS bigint[]
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT COALESCE(array_agg(x ORDER BY x), '{}') FROM unnest(a) x WHERE x <> ALL (b) $$;

CREATE OR REPLACE FUNCTION engram_session_arr_union(a bigint[], b bigint[]) RETURNS bigint[]
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT COALESCE(array_agg(DISTINCT x ORDER BY x), '{}')
          FROM unnest(a || b) x $$;

-- engram_session_get_row: the session, or EG404.
CREATE OR REPLACE FUNCTION engram_session_get_row(p_tenant bigint, p_session bigint) RETURNS sessions
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    s sessions;
BEGIN
    SELECT * INTO s FROM sessions WHERE tenant_id = p_tenant AND id = p_session;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'session % not found', p_session USING ERRCODE = 'EG404';
    END IF;
    RETURN s;
END $$;

-- engram_session_lock: locks the session for a change and returns it; a sub-agent's
-- parent is locked first (every writer takes them in that order), or EG404.
CREATE OR REPLACE FUNCTION engram_session_lock(p_tenant bigint, p_session bigint) RETURNS sessions
    LANGUAGE plpgsql AS $$
DECLARE
    s sessions;
    v_parent bigint;
BEGIN
    SELECT parent_id INTO v_parent FROM sessions WHERE tenant_id = p_tenant AND id = p_session;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'session % not found', p_session USING ERRCODE = 'EG404';
    END IF;
    IF v_parent IS NOT NULL THEN
        PERFORM 1 FROM sessions WHERE tenant_id = p_tenant AND id = v_parent FOR UPDATE;
    END IF;
    SELECT * INTO s FROM sessions WHERE tenant_id = p_tenant AND id = p_session FOR UPDATE;
    RETURN s;
END $$;

CREATE OR REPLACE FUNCTION engram_session_require_active(s sessions) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF s.state <> 'active' THEN
        RAISE EXCEPTION 'session % is %', s.id, s.state USING ERRCODE = 'EG409';
    END IF;
END $$;

-- engram_session_check_size: raises EG429 when adding n entries of nbytes would pass the
-- tier's transcript limits.
CREATE OR REPLACE FUNCTION engram_session_check_size(s sessions, n bigint, nbytes bigint,
                                          p_max_entries bigint, p_max_bytes bigint)
    RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF s.entry_count + n > p_max_entries THEN
        RAISE EXCEPTION 'session % has reached its limit of % transcript entries',
                        s.id, p_max_entries
            USING ERRCODE = 'EG429',
                  DETAIL = format('limit=%s usage=%s', p_max_entries, s.entry_count);
    END IF;
    IF s.entry_bytes + nbytes > p_max_bytes THEN
        RAISE EXCEPTION 'session % would pass its limit of % transcript bytes',
                        s.id, p_max_bytes
            USING ERRCODE = 'EG429',
                  DETAIL = format('limit=%s usage=%s requested=%s', p_max_bytes, s.entry_bytes,
                                  nbytes);
    END IF;
END $$;

-- engram_session_chain: the sessions whose entries make up p_session's transcript as of
-- position p_upto, each with the last seq that belongs to it.
CREATE OR REPLACE FUNCTION engram_session_chain(p_tenant bigint, p_session bigint, p_upto bigint)
    RETURNS TABLE (session_id bigint, upto bigint)
    LANGUAGE sql STABLE AS $$
    WITH RECURSIVE c (session_id, upto, base, base_seq) AS (
        SELECT s.id, p_upto, s.base_session_id, s.base_seq
        FROM sessions s WHERE s.tenant_id = p_tenant AND s.id = p_session
        UNION ALL
        SELECT s.id, LEAST(c.upto, c.base_seq), s.base_session_id, s.base_seq
        FROM c JOIN sessions s ON s.tenant_id = p_tenant AND s.id = c.base
    )
    SELECT c.session_id, c.upto FROM c
$$;

-- engram_session_log: every entry of the transcript as of p_upto, tombstones included.
CREATE OR REPLACE FUNCTION engram_session_log(p_tenant bigint, p_session bigint, p_upto bigint)
    RETURNS SETOF session_entries
    LANGUAGE sql STABLE AS $$
    SELECT e.* FROM engram_session_chain(p_tenant, p_session, p_upto) c
    JOIN session_entries e
      ON e.tenant_id = p_tenant AND e.session_id = c.session_id AND e.seq <= c.upto
$$;

-- engram_session_live: the messages and summaries no tombstone hides, as of p_upto.
CREATE OR REPLACE FUNCTION engram_session_live(p_tenant bigint, p_session bigint, p_upto bigint)
    RETURNS SETOF session_entries
    LANGUAGE sql STABLE AS $$
    WITH l AS MATERIALIZED (SELECT * FROM engram_session_log(p_tenant, p_session, p_upto))
    SELECT l.* FROM l
    WHERE l.kind <> 'tombstone'
      -- NOT IN over a subquery runs as one hashed lookup; a NOT EXISTS here was planned as a
      -- nested loop over the CTE (estimated at one row): quadratic in the transcript's length
      AND l.id NOT IN (SELECT t.target_id FROM l t
                       WHERE t.kind = 'tombstone' AND t.target_id IS NOT NULL)
$$;

CREATE OR REPLACE FUNCTION engram_session_entry_json(e session_entries) RETURNS jsonb
    LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'entry_id', e.id, 'seq', e.seq, 'type', e.kind, 'role', e.role,
        'content', e.content, 'parent_id', e.parent_id, 'tokens', e.tokens,
        'cost_usdc', e.cost_usdc, 'agent_id', engram_session_u64(e.agent_id),
        'created_at', engram_ms(e.created_at),
        'through_entry_id', CASE WHEN e.kind = 'summary' THEN e.target_id END,
        'messages_compacted', e.messages_compacted)
    || CASE WHEN e.kind = 'event' THEN jsonb_build_object('event', e.event, 'data', e.data)
            ELSE '{}'::jsonb END
    -- a tool result auto-compact cut: how long it was (its full text stays stored)
    || CASE WHEN e.original_content IS NOT NULL
            THEN jsonb_build_object('truncated_from_chars', char_length(e.original_content))
            ELSE '{}'::jsonb END
$$;

-- engram_session_config: a session's configuration with the seed's auto-compaction
-- defaults filled in where the client gave none: trigger at 90% of the context window,
-- keep the 10 most recent messages, truncate tool results above 50,000 characters, and
-- stop auto-compacting after 3 failures in a row.
CREATE OR REPLACE FUNCTION engram_session_config(p_cfg jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE AS $$
    SELECT p_cfg || jsonb_build_object('compaction',
        jsonb_build_object('enabled', true, 'threshold', 0.9, 'keep_recent', 10,
                           'tool_result_budget', 50000, 'max_failures', 3)
        || CASE WHEN jsonb_typeof(p_cfg -> 'compaction') = 'object' THEN p_cfg -> 'compaction'
                ELSE '{}'::jsonb END)
$$;

-- engram_session_event: appends event p_event to session s's transcript at the next
-- position (the caller holds the session's lock and moves sessions.position itself).
-- Returns the entry's id.
CREATE OR REPLACE FUNCTION engram_session_event(s sessions, p_event text, p_agent bigint,
                                                p_content text, p_data jsonb, p_now timestamptz)
    RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO session_entries (tenant_id, session_id, seq, kind, event, content, data,
                                 agent_id, created_at)
        VALUES (s.tenant_id, s.id, s.position + 1, 'event', p_event, p_content, p_data,
                p_agent, p_now)
        RETURNING id INTO v_id;
    RETURN v_id;
END $$;

-- engram_session_items: the transcript as of p_upto as a model (p_events false) or an agent
-- picking up its work (p_events true) is given it: tombstoned entries left out, the latest
-- live compaction summary in place of everything up to the entry it compacts through, then
-- the live messages (and, with p_events, events) after that point in order. p_agent (NULL:
-- all) keeps only that agent's messages and events, and the events naming it as the
-- sub-agent (a delegation to it, its completion); the summary stays. p_tail (NULL: all)
-- keeps the last p_tail items. Returns a JSON array.
CREATE OR REPLACE FUNCTION engram_session_items(p_tenant bigint, p_session bigint, p_upto bigint,
                                                p_agent bigint, p_tail bigint, p_events boolean)
    RETURNS jsonb
    LANGUAGE sql STABLE AS $$
    WITH live AS MATERIALIZED (SELECT * FROM engram_session_live(p_tenant, p_session, p_upto)),
    top AS (
        SELECT l.id, l.target_seq FROM live l WHERE l.kind = 'summary'
        ORDER BY l.target_seq DESC LIMIT 1
    ),
    shown AS (
        SELECT l.id, l.target_seq AS pos FROM live l JOIN top ON top.id = l.id
        UNION ALL
        SELECT l.id, l.seq FROM live l
        WHERE (l.kind = 'message' OR (p_events AND l.kind = 'event'))
          AND l.seq > COALESCE((SELECT top.target_seq FROM top), 0)
          AND (p_agent IS NULL OR l.agent_id = p_agent
               OR (l.kind = 'event'
                   AND (l.data ->> 'child_agent_id')::numeric = engram_session_u64(p_agent)))
    ),
    picked AS (SELECT * FROM shown ORDER BY pos DESC LIMIT p_tail)
    SELECT COALESCE(jsonb_agg(engram_session_entry_json(e) ORDER BY p.pos), '[]'::jsonb)
    FROM picked p JOIN session_entries e ON e.tenant_id = p_tenant AND e.id = p.id
$$;

-- engram_session_history: the history a model is given (engram_session_items without
-- events).
CREATE OR REPLACE FUNCTION engram_session_history(p_tenant bigint, p_session bigint, p_upto bigint,
                                       p_agent bigint, p_tail bigint)
    RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$ SELECT engram_session_items(p_tenant, p_session, p_upto, p_agent, p_tail, false) $$;

-- engram_session_tail: what an agent needs to pick up its work: engram_session_items with
-- the events that involve it.
CREATE OR REPLACE FUNCTION engram_session_tail(p_tenant bigint, p_session bigint, p_upto bigint,
                                               p_agent bigint, p_tail bigint)
    RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$ SELECT engram_session_items(p_tenant, p_session, p_upto, p_agent, p_tail, true) $$;

-- engram_session_agents: the agents that took part in p_session's transcript as of p_upto:
-- authors of its live messages, and the sub-agents its events name
-- (child_agent_id: a delegation to them, their completion), each with the position of its
-- last item there, most recently active first, at most 64.
CREATE OR REPLACE FUNCTION engram_session_agents(p_tenant bigint, p_session bigint, p_upto bigint)
    RETURNS TABLE (agent_id bigint, last_seq bigint)
    LANGUAGE sql STABLE AS $$
    WITH live AS MATERIALIZED (SELECT * FROM engram_session_live(p_tenant, p_session, p_upto)),
    who AS (
        SELECT l.agent_id, l.seq FROM live l WHERE l.kind = 'message'
        UNION ALL
        SELECT CASE WHEN v.u >= 9223372036854775808 THEN (v.u - 18446744073709551616)::bigint
                    ELSE v.u::bigint END, l.seq
        FROM live l CROSS JOIN LATERAL (SELECT (l.data ->> 'child_agent_id')::numeric AS u) v
        WHERE l.kind = 'event' AND v.u IS NOT NULL
    )
    SELECT w.agent_id, max(w.seq) FROM who w GROUP BY w.agent_id
    ORDER BY max(w.seq) DESC LIMIT 64
$$;

-- engram_session_find_entry: entry p_entry if it is part of p_session's transcript as of
-- p_upto (its own or inherited), else a row of NULLs.
CREATE OR REPLACE FUNCTION engram_session_find_entry(p_tenant bigint, p_session bigint, p_upto bigint,
                                          p_entry bigint)
    RETURNS session_entries
    LANGUAGE sql STABLE AS $$
    SELECT e.* FROM session_entries e
    JOIN engram_session_chain(p_tenant, p_session, p_upto) c
      ON c.session_id = e.session_id AND e.seq <= c.upto
    WHERE e.tenant_id = p_tenant AND e.id = p_entry
$$;

CREATE OR REPLACE FUNCTION engram_session_note_json(n session_notes) RETURNS jsonb
    LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'note_id', n.id, 'category', n.category, 'key', n.key, 'value', n.value,
        'scope', n.scope, 'work_item_id', n.work_item_id,
        'agent_id', engram_session_u64(n.agent_id), 'created_at', engram_ms(n.created_at),
        'supersedes', n.supersedes)
$$;

-- engram_session_json: the public view of a session (session.get).
CREATE OR REPLACE FUNCTION engram_session_json(s sessions) RETURNS jsonb
    LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'session_id', s.id, 'agent_id', engram_session_u64(s.agent_id),
        'parent_id', s.parent_id, 'state', s.state, 'config', engram_session_config(s.config),
        'model', s.config ->> 'model', 'branch_type', s.branch_type,
        'simulation', s.simulation,
        'resumed_from', CASE WHEN s.origin_checkpoint_id IS NOT NULL THEN
            jsonb_build_object('session_id', s.origin_session_id,
                               'checkpoint_id', s.origin_checkpoint_id,
                               'position', s.base_seq) END,
        'created_at', engram_ms(s.created_at), 'updated_at', engram_ms(s.updated_at),
        'ended_at', engram_ms(s.ended_at), 'summary', s.summary)
    || jsonb_build_object(
        'total_cost_usdc', s.total_cost_usdc,
        'own_cost_usdc', s.total_cost_usdc - s.children_cost_usdc,
        'children_cost_usdc', s.children_cost_usdc, 'max_cost_usdc', s.max_cost_usdc,
        'position', s.position, 'entry_count', s.entry_count, 'entry_bytes', s.entry_bytes,
        'compaction_count', s.compaction_count, 'rounds', s.rounds,
        'scratchpad_version', s.scratchpad_version,
        'note_count', (SELECT count(*) FROM session_notes n
                       WHERE n.tenant_id = s.tenant_id AND n.session_id = s.id
                         AND n.dead_rev IS NULL),
        'checkpoint_count', (SELECT count(*) FROM session_checkpoints k
                             WHERE k.tenant_id = s.tenant_id AND k.session_id = s.id
                               AND k.expires_at > now()),
        'child_count', (SELECT count(*) FROM sessions c
                        WHERE c.tenant_id = s.tenant_id AND c.parent_id = s.id),
        'active_children', (SELECT count(*) FROM sessions c
                            WHERE c.tenant_id = s.tenant_id AND c.parent_id = s.id
                              AND c.state = 'active'))
    || jsonb_build_object(
        'constraints', jsonb_build_object(
            'budget_spent_usdc', s.total_cost_usdc,
            'budget_limit_usdc', s.max_cost_usdc,
            'budget_remaining_usdc', CASE WHEN s.max_cost_usdc IS NOT NULL
                                     THEN GREATEST(s.max_cost_usdc - s.total_cost_usdc, 0) END,
            'rounds', s.rounds,
            'elapsed_ms', engram_ms(COALESCE(s.ended_at, engram_session_now()))
                          - engram_ms(s.created_at)),
        'task', s.task, 'return_format', s.return_format, 'max_tokens', s.max_tokens,
        'output', s.output, 'completed_at', engram_ms(s.completed_at))
    || jsonb_build_object(
        'auto_compact', jsonb_build_object(
            'enabled', COALESCE((engram_session_config(s.config) -> 'compaction' ->> 'enabled')::boolean,
                                true) AND NOT s.compact_off,
            'off_after_failures', s.compact_off, 'due', s.compact_due,
            'failures', s.compact_failures, 'compactions', s.compact_runs,
            'live_tokens', (s.compact_bytes + 3) / 4, 'last', s.compact_last))
$$;

-- engram_session_check_live: raises EG429 when the tenant already has p_max_live active
-- top-level sessions (0: no cap). The tenant's session-id counter row is locked first, the
-- row every new session's id comes from anyway, so concurrent creations in any number of
-- processes are counted one after another and the cap holds exactly.
CREATE OR REPLACE FUNCTION engram_session_check_live(p_tenant bigint, p_max_live bigint)
    RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    IF p_max_live IS NULL OR p_max_live <= 0 THEN
        RETURN;
    END IF;
    INSERT INTO tenant_counters AS c (tenant_id, kind, last) VALUES (p_tenant, 'session', 0)
        ON CONFLICT (tenant_id, kind) DO UPDATE SET last = c.last;
    SELECT count(*) INTO v_n FROM sessions
        WHERE tenant_id = p_tenant AND state = 'active' AND parent_id IS NULL;
    IF v_n + 1 > p_max_live THEN
        RAISE EXCEPTION 'the tenant has reached its limit of % live sessions', p_max_live
            USING ERRCODE = 'EG429', DETAIL = format('limit=%s usage=%s', p_max_live, v_n);
    END IF;
END $$;

DROP FUNCTION IF EXISTS engram_session_create(bigint, bigint, jsonb);
CREATE OR REPLACE FUNCTION engram_session_create(p_tenant bigint, p_agent bigint, p_config jsonb,
                                                 p_max_live bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_cfg jsonb := engram_session_config(jsonb_strip_nulls(p_config));
    v_now timestamptz;
    v_id bigint;
BEGIN
    PERFORM engram_session_check_live(p_tenant, p_max_live);
    v_now := engram_session_now();
    INSERT INTO sessions (tenant_id, agent_id, config, max_cost_usdc, created_at, updated_at)
        VALUES (p_tenant, p_agent, v_cfg, (v_cfg ->> 'max_cost_usdc')::numeric, v_now, v_now)
        RETURNING id INTO v_id;
    RETURN jsonb_build_object('session_id', v_id, 'created_at', engram_ms(v_now),
                              'config', v_cfg);
END $$;

CREATE OR REPLACE FUNCTION engram_session_get(p_tenant bigint, p_session bigint) RETURNS jsonb
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN engram_session_json(engram_session_get_row(p_tenant, p_session))
        || jsonb_build_object('extraction', engram_extract_state(p_tenant, p_session));
END $$;

-- engram_session_list: newest first, p_limit per page; p_cursor is the next_cursor of the
-- previous page (nil on the last page).
CREATE OR REPLACE FUNCTION engram_session_list(p_tenant bigint, p_agent bigint, p_state text,
                                    p_cursor bigint, p_limit integer)
    RETURNS jsonb LANGUAGE sql STABLE AS $$
    WITH page AS (
        SELECT s.*, row_number() OVER (ORDER BY s.id DESC) AS rn FROM sessions s
        WHERE s.tenant_id = p_tenant
          AND (p_agent IS NULL OR s.agent_id = p_agent)
          AND (p_state IS NULL OR s.state = p_state)
          AND (p_cursor IS NULL OR s.id < p_cursor)
        ORDER BY s.id DESC LIMIT p_limit + 1
    )
    SELECT jsonb_build_object(
        'sessions', COALESCE(jsonb_agg(jsonb_build_object(
               'session_id', p.id, 'agent_id', engram_session_u64(p.agent_id),
               'parent_id', p.parent_id, 'state', p.state, 'model', p.config ->> 'model',
               'branch_type', p.branch_type, 'created_at', engram_ms(p.created_at),
               'updated_at', engram_ms(p.updated_at), 'total_cost_usdc', p.total_cost_usdc,
               'entry_count', p.entry_count) ORDER BY p.id DESC)
            FILTER (WHERE p.rn <= p_limit), '[]'::jsonb),
        'next_cursor', CASE WHEN max(p.rn) > p_limit
                            THEN min(p.id) FILTER (WHERE p.rn <= p_limit) END)
    FROM page p
$$;

CREATE OR REPLACE FUNCTION engram_session_end(p_tenant bigint, p_session bigint, p_summary text)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    v_now timestamptz := engram_session_now();
BEGIN
    PERFORM engram_session_require_active(s);
    UPDATE sessions SET state = 'ended', summary = p_summary, ended_at = v_now, updated_at = v_now
        WHERE tenant_id = p_tenant AND id = p_session;
    RETURN jsonb_build_object('session_id', p_session, 'state', 'ended',
                              'ended_at', engram_ms(v_now));
END $$;

-- engram_session_append: one message. The cost is checked against the session's cap and,
-- for a sub-agent, its parent's (which also pays it), under both locks: concurrent appends
-- can never pass a cap, and a rejected append stores nothing. An append that takes the live
-- history past config.compaction.threshold of the window of the session's model (p_windows:
-- the setting compact_context_windows) marks the session due for auto-compact
-- (37_compact.sql); the compaction runs in the background, never in this transaction.
DROP FUNCTION IF EXISTS engram_session_append(bigint, bigint, text, text, bigint, bigint, numeric,
                                              bigint, bigint, bigint);
CREATE OR REPLACE FUNCTION engram_session_append(p_tenant bigint, p_session bigint, p_role text,
                                      p_content text, p_parent bigint, p_tokens bigint,
                                      p_cost numeric, p_agent bigint, p_max_entries bigint,
                                      p_max_bytes bigint, p_windows text)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    p sessions;
    v_cost numeric := COALESCE(p_cost, 0);
    v_bytes bigint := octet_length(p_content);
    v_now timestamptz := engram_session_now();
    v_id bigint;
    v_ac record;
BEGIN
    PERFORM engram_session_require_active(s);
    PERFORM engram_session_check_size(s, 1, v_bytes, p_max_entries, p_max_bytes);
    IF s.max_cost_usdc IS NOT NULL AND s.total_cost_usdc + v_cost > s.max_cost_usdc THEN
        RAISE EXCEPTION 'cost % would take session % past its cap of % USDC (spent %)',
                        v_cost, s.id, s.max_cost_usdc, s.total_cost_usdc
            USING ERRCODE = 'EG402',
                  DETAIL = format('limit=%s usage=%s cost=%s session_id=%s', s.max_cost_usdc,
                                  s.total_cost_usdc, v_cost, s.id);
    END IF;
    IF s.parent_id IS NOT NULL THEN
        SELECT * INTO p FROM sessions WHERE tenant_id = p_tenant AND id = s.parent_id;
        IF p.max_cost_usdc IS NOT NULL AND p.total_cost_usdc + v_cost > p.max_cost_usdc THEN
            RAISE EXCEPTION 'cost % would take parent session % past its cap of % USDC (spent %)',
                            v_cost, p.id, p.max_cost_usdc, p.total_cost_usdc
                USING ERRCODE = 'EG402',
                      DETAIL = format('limit=%s usage=%s cost=%s session_id=%s',
                                      p.max_cost_usdc, p.total_cost_usdc, v_cost, p.id);
        END IF;
    END IF;
    IF p_parent IS NOT NULL
       AND (engram_session_find_entry(p_tenant, s.id, s.position, p_parent)).id IS NULL THEN
        RAISE EXCEPTION 'parent_id % is not an entry of session %', p_parent, s.id
            USING ERRCODE = 'EG400';
    END IF;
    INSERT INTO session_entries (tenant_id, session_id, seq, kind, role, content, parent_id,
                                 tokens, cost_usdc, agent_id, created_at)
        VALUES (p_tenant, s.id, s.position + 1, 'message', p_role, p_content, p_parent,
                p_tokens, p_cost, COALESCE(p_agent, s.agent_id), v_now)
        RETURNING id INTO v_id;
    v_ac := engram_compact_check(s, v_bytes, p_windows);  -- 37_compact.sql
    UPDATE sessions
        SET position = position + 1, entry_count = entry_count + 1,
            entry_bytes = entry_bytes + v_bytes, total_cost_usdc = total_cost_usdc + v_cost,
            rounds = rounds + CASE WHEN p_role = 'assistant' THEN 1 ELSE 0 END,
            updated_at = v_now, compact_bytes = v_ac.bytes, compact_due = v_ac.due
        WHERE tenant_id = p_tenant AND id = s.id;
    IF s.parent_id IS NOT NULL AND v_cost <> 0 THEN
        UPDATE sessions
            SET total_cost_usdc = total_cost_usdc + v_cost,
                children_cost_usdc = children_cost_usdc + v_cost, updated_at = v_now
            WHERE tenant_id = p_tenant AND id = s.parent_id;
    END IF;
    RETURN jsonb_build_object('entry_id', v_id, 'seq', s.position + 1,
                              'total_cost_usdc', s.total_cost_usdc + v_cost);
END $$;

-- engram_session_tombstone: hides an entry of the session's transcript from now on (the
-- entry stays, so checkpoints taken before still see it). p_session NULL: the session the
-- entry was appended to. Tombstoning twice returns the first tombstone.
CREATE OR REPLACE FUNCTION engram_session_tombstone(p_tenant bigint, p_session bigint, p_entry bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_session bigint := p_session;
    s sessions;
    e session_entries;
    v_id bigint;
    v_now timestamptz;
BEGIN
    IF v_session IS NULL THEN
        SELECT x.session_id INTO v_session FROM session_entries x
            WHERE x.tenant_id = p_tenant AND x.id = p_entry;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'entry % not found', p_entry USING ERRCODE = 'EG404';
        END IF;
    END IF;
    s := engram_session_lock(p_tenant, v_session);
    e := engram_session_find_entry(p_tenant, s.id, s.position, p_entry);
    IF e.id IS NULL THEN
        RAISE EXCEPTION 'entry % not found in session %', p_entry, s.id USING ERRCODE = 'EG404';
    END IF;
    IF e.kind = 'tombstone' THEN
        RAISE EXCEPTION 'entry % is a tombstone', p_entry USING ERRCODE = 'EG400';
    END IF;
    SELECT l.id INTO v_id FROM engram_session_log(p_tenant, s.id, s.position) l
        WHERE l.kind = 'tombstone' AND l.target_id = p_entry LIMIT 1;
    IF v_id IS NOT NULL THEN
        RETURN jsonb_build_object('entry_id', p_entry, 'tombstone_id', v_id, 'session_id', s.id);
    END IF;
    v_now := engram_session_now();
    INSERT INTO session_entries (tenant_id, session_id, seq, kind, agent_id, target_id,
                                 target_seq, created_at)
        VALUES (p_tenant, s.id, s.position + 1, 'tombstone', s.agent_id, p_entry, e.seq, v_now)
        RETURNING id INTO v_id;
    -- the live history's size is counted again at the next append (auto-compact)
    UPDATE sessions SET position = position + 1, updated_at = v_now, compact_bytes = NULL
        WHERE tenant_id = p_tenant AND id = s.id;
    RETURN jsonb_build_object('entry_id', p_entry, 'tombstone_id', v_id, 'session_id', s.id);
END $$;

-- engram_session_summarize: records a compaction summary standing in for the transcript up
-- to and including p_through. It must reach past the live summary in place now (EG409).
CREATE OR REPLACE FUNCTION engram_session_summarize(p_tenant bigint, p_session bigint, p_summary text,
                                         p_through bigint, p_compacted bigint,
                                         p_max_entries bigint, p_max_bytes bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_session bigint := p_session;
    s sessions;
    e session_entries;
    v_cut bigint;
    v_keep bigint;
    v_after bigint;
    v_id bigint;
    v_now timestamptz;
BEGIN
    IF v_session IS NULL THEN
        SELECT x.session_id INTO v_session FROM session_entries x
            WHERE x.tenant_id = p_tenant AND x.id = p_through;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'entry % not found', p_through USING ERRCODE = 'EG404';
        END IF;
    END IF;
    s := engram_session_lock(p_tenant, v_session);
    PERFORM engram_session_require_active(s);
    e := engram_session_find_entry(p_tenant, s.id, s.position, p_through);
    IF e.id IS NULL THEN
        RAISE EXCEPTION 'entry % not found in session %', p_through, s.id
            USING ERRCODE = 'EG404';
    END IF;
    IF e.kind <> 'message' THEN
        RAISE EXCEPTION 'through_entry_id % is a %, not a message', p_through, e.kind
            USING ERRCODE = 'EG400';
    END IF;
    SELECT max(l.target_seq) INTO v_cut FROM engram_session_live(p_tenant, s.id, s.position) l
        WHERE l.kind = 'summary';
    IF v_cut IS NOT NULL AND e.seq <= v_cut THEN
        RAISE EXCEPTION 'a summary already compacts the transcript through entry % or later',
                        p_through
            USING ERRCODE = 'EG409';
    END IF;
    -- the most recent messages always stay (config.compaction.keep_recent)
    v_keep := (engram_session_config(s.config) -> 'compaction' ->> 'keep_recent')::bigint;
    SELECT count(*) INTO v_after FROM engram_session_live(p_tenant, s.id, s.position) l
        WHERE l.kind = 'message' AND l.seq > e.seq;
    IF v_after < v_keep THEN
        RAISE EXCEPTION 'the summary would cover some of the % most recent messages the session keeps (config.compaction.keep_recent): only % follow entry %',
                        v_keep, v_after, p_through
            USING ERRCODE = 'EG409',
                  DETAIL = format('keep_recent=%s messages_after=%s', v_keep, v_after);
    END IF;
    PERFORM engram_session_check_size(s, 1, octet_length(p_summary), p_max_entries, p_max_bytes);
    v_now := engram_session_now();
    INSERT INTO session_entries (tenant_id, session_id, seq, kind, content, agent_id, target_id,
                                 target_seq, messages_compacted, created_at)
        VALUES (p_tenant, s.id, s.position + 1, 'summary', p_summary, s.agent_id, p_through,
                e.seq, p_compacted, v_now)
        RETURNING id INTO v_id;
    UPDATE sessions
        SET position = position + 1, entry_count = entry_count + 1,
            entry_bytes = entry_bytes + octet_length(p_summary),
            compaction_count = compaction_count + 1, updated_at = v_now,
            compact_bytes = NULL  -- counted again when needed (auto-compact)
        WHERE tenant_id = p_tenant AND id = s.id;
    RETURN jsonb_build_object('entry_id', v_id, 'session_id', s.id,
                              'compaction_count', s.compaction_count + 1);
END $$;

-- engram_session_messages: one page of the history engram_session_history describes, as
-- of transcript position p_upto (NULL: the session's position now; later pages pass the
-- first page's, so a page sequence shows one fixed transcript however many entries are
-- appended meanwhile: nothing is skipped or repeated). Items are in position order (a
-- compaction summary sits at the position it compacts through); p_after is the position of
-- the last item of the previous page (NULL: the first page). p_tail keeps only the last
-- p_tail items, p_agent only that agent's messages (the summary stays), p_events adds the
-- transcript's events. A page ends after p_limit items or once p_max_bytes of content are
-- exceeded (always at least one item); next_cursor is NULL on the last page. Reads only the
-- page's entries plus the summaries and tombstones (session_entries_marks), never the
-- whole transcript.
DROP FUNCTION IF EXISTS engram_session_messages(bigint, bigint, bigint, bigint);
CREATE OR REPLACE FUNCTION engram_session_messages(p_tenant bigint, p_session bigint, p_tail bigint,
                                                   p_agent bigint, p_cursor text,
                                                   p_limit bigint, p_max_bytes bigint,
                                                   p_events boolean)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    s sessions := engram_session_get_row(p_tenant, p_session);
    v_upto bigint := s.position;
    v_after bigint := 0;
    v_dead bigint[];
    v_top session_entries;
    v_cut bigint;
    v_ids bigint[] := '{}';
    v_items jsonb;
    v_n bigint := 0;
    v_bytes bigint := 0;
    v_last bigint;
    v_more boolean := false;
    v_chain bigint[];
    v_uptos bigint[];
    e record;
    i integer;
BEGIN
    IF p_cursor IS NOT NULL THEN
        IF p_cursor !~ '^[0-9]{1,18}\.[0-9]{1,18}$' THEN
            RAISE EXCEPTION 'cursor is not a cursor of session.messages' USING ERRCODE = 'EG400';
        END IF;
        v_upto := split_part(p_cursor, '.', 1)::bigint;
        v_after := split_part(p_cursor, '.', 2)::bigint;
        IF v_upto > s.position OR v_after > v_upto THEN
            RAISE EXCEPTION 'cursor is not a cursor of session %', s.id USING ERRCODE = 'EG400';
        END IF;
    END IF;
    SELECT array_agg(c.session_id ORDER BY c.upto), array_agg(c.upto ORDER BY c.upto)
        INTO v_chain, v_uptos FROM engram_session_chain(p_tenant, s.id, v_upto) c;
    SELECT COALESCE(array_agg(t.target_id), '{}') INTO v_dead
        FROM unnest(v_chain, v_uptos) AS c (session_id, upto)
        JOIN session_entries t ON t.tenant_id = p_tenant AND t.session_id = c.session_id
                               AND t.seq <= c.upto AND t.kind = 'tombstone';
    SELECT m.* INTO v_top FROM unnest(v_chain, v_uptos) AS c (session_id, upto)
        JOIN session_entries m ON m.tenant_id = p_tenant AND m.session_id = c.session_id
                               AND m.seq <= c.upto AND m.kind = 'summary'
        WHERE m.id <> ALL (v_dead)
        ORDER BY m.target_seq DESC LIMIT 1;
    v_cut := COALESCE(v_top.target_seq, 0);
    IF p_cursor IS NULL AND p_tail IS NOT NULL THEN
        -- the first page starts at the p_tail-th last item
        v_after := NULL;
        FOR i IN REVERSE cardinality(v_chain) .. 1 LOOP
            SELECT x.seq - 1 INTO v_after FROM session_entries x
                WHERE x.tenant_id = p_tenant AND x.session_id = v_chain[i]
                  AND x.seq <= v_uptos[i] AND x.seq > v_cut
                  AND (x.kind = 'message' OR (p_events AND x.kind = 'event'))
                  AND (p_agent IS NULL OR x.agent_id = p_agent) AND x.id <> ALL (v_dead)
                ORDER BY x.seq DESC OFFSET p_tail - 1 - v_n LIMIT 1;
            EXIT WHEN v_after IS NOT NULL;
            SELECT v_n + count(*) INTO v_n FROM session_entries x
                WHERE x.tenant_id = p_tenant AND x.session_id = v_chain[i]
                  AND x.seq <= v_uptos[i] AND x.seq > v_cut
                  AND (x.kind = 'message' OR (p_events AND x.kind = 'event'))
                  AND (p_agent IS NULL OR x.agent_id = p_agent) AND x.id <> ALL (v_dead);
        END LOOP;
        -- fewer than p_tail messages: all of them, and the summary (if any)
        v_after := COALESCE(v_after, 0);
        v_n := 0;
    END IF;
    IF v_top.id IS NOT NULL AND v_cut > v_after THEN
        v_ids := v_ids || v_top.id;
        v_n := 1;
        v_bytes := octet_length(v_top.content);
        v_last := v_cut;
    END IF;
    <<chain>>
    FOR i IN 1 .. cardinality(v_chain) LOOP
        FOR e IN SELECT x.id, x.seq, COALESCE(octet_length(x.content), 0) AS nbytes
                 FROM session_entries x
                 WHERE x.tenant_id = p_tenant AND x.session_id = v_chain[i]
                   AND x.seq <= v_uptos[i] AND x.seq > GREATEST(v_after, v_cut)
                   AND (x.kind = 'message' OR (p_events AND x.kind = 'event'))
                   AND (p_agent IS NULL OR x.agent_id = p_agent) AND x.id <> ALL (v_dead)
                 ORDER BY x.seq LOOP
            IF v_n >= p_limit OR (v_n > 0 AND v_bytes + e.nbytes > p_max_bytes) THEN
                v_more := true;
                EXIT chain;
            END IF;
            v_ids := v_ids || e.id;
            v_n := v_n + 1;
            v_bytes := v_bytes + e.nbytes;
            v_last := e.seq;
        END LOOP;
    END LOOP;
    SELECT COALESCE(jsonb_agg(engram_session_entry_json(x)
                              ORDER BY CASE WHEN x.kind = 'summary' THEN x.target_seq
                                            ELSE x.seq END), '[]'::jsonb)
        INTO v_items FROM session_entries x WHERE x.tenant_id = p_tenant AND x.id = ANY (v_ids);
    RETURN jsonb_build_object(
        'session_id', s.id, 'position', s.position, 'as_of', v_upto,
        'compaction_count', s.compaction_count, 'messages', v_items,
        'next_cursor', CASE WHEN v_more THEN format('%s.%s', v_upto, v_last) END);
END $$;

CREATE OR REPLACE FUNCTION engram_session_scratchpad_json(s sessions) RETURNS jsonb
    LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('session_id', s.id, 'content', s.scratchpad,
                              'version', s.scratchpad_version,
                              'last_updated_at', engram_ms(s.scratchpad_updated_at),
                              'token_count', s.scratchpad_tokens)
$$;

CREATE OR REPLACE FUNCTION engram_session_scratchpad_get(p_tenant bigint, p_session bigint)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN engram_session_scratchpad_json(engram_session_get_row(p_tenant, p_session));
END $$;

-- engram_session_scratchpad_update: replaces the scratchpad. p_expected (NULL: any) must be
-- the current version or EG409. p_tokens NULL estimates one token per four characters.
CREATE OR REPLACE FUNCTION engram_session_scratchpad_update(p_tenant bigint, p_session bigint,
                                                 p_content text, p_expected bigint,
                                                 p_tokens bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    v_now timestamptz := engram_session_now();
BEGIN
    PERFORM engram_session_require_active(s);
    IF p_expected IS NOT NULL AND p_expected <> s.scratchpad_version THEN
        RAISE EXCEPTION 'scratchpad of session % is at version %, not %', s.id,
                        s.scratchpad_version, p_expected
            USING ERRCODE = 'EG409',
                  DETAIL = format('version=%s expected_version=%s', s.scratchpad_version,
                                  p_expected);
    END IF;
    UPDATE sessions
        SET scratchpad = p_content, scratchpad_version = scratchpad_version + 1,
            scratchpad_tokens = COALESCE(p_tokens, ceil(char_length(p_content) / 4.0)::bigint),
            scratchpad_updated_at = v_now, updated_at = v_now
        WHERE tenant_id = p_tenant AND id = s.id
        RETURNING * INTO s;
    RETURN engram_session_scratchpad_json(s);
END $$;

-- engram_session_note_add: adds a note (superseding the live note with the same key) and
-- bumps the session's rev. The note's id is the tenant's next (engram_next_id).
CREATE OR REPLACE FUNCTION engram_session_note_add(p_tenant bigint, p_session bigint, p_category text,
                                        p_key text, p_value text, p_scope text,
                                        p_work_item jsonb, p_agent bigint, p_max_notes bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    v_now timestamptz := engram_session_now();
    v_n bigint;
    v_id bigint;
    v_old bigint;
BEGIN
    PERFORM engram_session_require_active(s);
    IF p_work_item IS NOT NULL THEN  -- a work item of the session (a sub-agent's: its parent's)
        PERFORM engram_work_item_require(p_tenant, COALESCE(s.parent_id, s.id), p_work_item);
    END IF;
    SELECT count(*) INTO v_n FROM session_notes
        WHERE tenant_id = p_tenant AND session_id = s.id;
    IF v_n + 1 > p_max_notes THEN
        RAISE EXCEPTION 'session % has reached its limit of % notes', s.id, p_max_notes
            USING ERRCODE = 'EG429', DETAIL = format('limit=%s usage=%s', p_max_notes, v_n);
    END IF;
    v_id := engram_next_id(p_tenant, 'session_note');
    UPDATE session_notes
        SET superseded_by = v_id, dead_rev = s.rev + 1
        WHERE tenant_id = p_tenant AND session_id = s.id AND key = p_key AND dead_rev IS NULL
        RETURNING id INTO v_old;
    INSERT INTO session_notes (tenant_id, id, session_id, agent_id, category, key, value, scope,
                               work_item_id, supersedes, created_rev, created_at)
        VALUES (p_tenant, v_id, s.id, COALESCE(p_agent, s.agent_id), p_category, p_key, p_value,
                p_scope, p_work_item, v_old, s.rev + 1, v_now);
    UPDATE sessions SET rev = rev + 1, updated_at = v_now
        WHERE tenant_id = p_tenant AND id = s.id;
    RETURN jsonb_build_object('note_id', v_id, 'superseded', v_old, 'created_at',
                              engram_ms(v_now));
END $$;

-- engram_session_notes: live notes in creation order, filtered (NULL: no filter).
CREATE OR REPLACE FUNCTION engram_session_notes(p_tenant bigint, p_session bigint, p_scopes text[],
                                     p_categories text[], p_since_ms bigint, p_agent bigint)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    s sessions := engram_session_get_row(p_tenant, p_session);
BEGIN
    RETURN jsonb_build_object('session_id', s.id, 'notes', COALESCE((
        SELECT jsonb_agg(engram_session_note_json(n) ORDER BY n.id) FROM session_notes n
        WHERE n.tenant_id = p_tenant AND n.session_id = s.id AND n.dead_rev IS NULL
          AND (p_scopes IS NULL OR n.scope = ANY (p_scopes))
          AND (p_categories IS NULL OR n.category = ANY (p_categories))
          AND (p_since_ms IS NULL OR engram_ms(n.created_at) >= p_since_ms)
          AND (p_agent IS NULL OR n.agent_id = p_agent)), '[]'::jsonb));
END $$;

-- engram_session_task_complete: clears the live current_task notes (of one work item when
-- p_work_item is not NULL).
CREATE OR REPLACE FUNCTION engram_session_task_complete(p_tenant bigint, p_session bigint,
                                             p_work_item jsonb)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    v_now timestamptz := engram_session_now();
    v_n bigint;
BEGIN
    PERFORM engram_session_require_active(s);
    UPDATE session_notes SET dead_rev = s.rev + 1, cleared_at = v_now
        WHERE tenant_id = p_tenant AND session_id = s.id AND dead_rev IS NULL
          AND scope = 'current_task' AND (p_work_item IS NULL OR work_item_id = p_work_item);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n > 0 THEN
        UPDATE sessions SET rev = rev + 1, updated_at = v_now
            WHERE tenant_id = p_tenant AND id = s.id;
    END IF;
    RETURN jsonb_build_object('session_id', s.id, 'cleared', v_n);
END $$;

-- engram_session_checkpoint: records the session's state as a delta against its previous
-- checkpoint (expired or not: the chain stays complete until the purge folds it):
--   position          the transcript position (entries are never copied)
--   counters          costs, counters and constraint state, whole (a few numbers)
--   scratchpad_snap   a copy of the scratchpad only when its version changed
--   notes_added/_removed  note ids that became live / stopped being live
--   children          the active sub-agents, whole (at most a few): each one's position and
--                     counters, a copy of its scratchpad (scratchpad_snap, when it has one)
--                     and the ids of its live notes (notes rows are never changed, only
--                     marked dead, so the ids restore their content)
-- A checkpoint of an active session is its pause: a session_paused event goes into the
-- transcript first, so the checkpoint's position includes it.
CREATE OR REPLACE FUNCTION engram_session_checkpoint(p_tenant bigint, p_session bigint, p_label text,
                                          p_metadata jsonb, p_ttl_s bigint,
                                          p_max_checkpoints bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    prev session_checkpoints;
    v_now timestamptz := engram_session_now();
    v_prev_rev bigint := -1;
    v_prev_version bigint := 0;
    v_snap bigint;
    v_added bigint[];
    v_removed bigint[];
    v_children jsonb := '[]';
    v_n bigint;
    v_id bigint;
    c sessions;
    v_child_snap bigint;
BEGIN
    IF s.parent_id IS NOT NULL THEN
        RAISE EXCEPTION 'session % is a sub-agent session: checkpoint its parent session %',
                        s.id, s.parent_id
            USING ERRCODE = 'EG400';
    END IF;
    SELECT count(*) INTO v_n FROM session_checkpoints
        WHERE tenant_id = p_tenant AND session_id = s.id AND expires_at > now();
    IF v_n + 1 > p_max_checkpoints THEN
        RAISE EXCEPTION 'session % has reached its limit of % live checkpoints', s.id,
                        p_max_checkpoints
            USING ERRCODE = 'EG429', DETAIL = format('limit=%s usage=%s', p_max_checkpoints, v_n);
    END IF;
    v_id := engram_next_id(p_tenant, 'session_checkpoint');
    IF s.state = 'active' THEN
        PERFORM engram_session_event(s, 'session_paused', s.agent_id,
                                     format('Session paused at checkpoint %s (%s).', v_id, p_label),
                                     jsonb_build_object('checkpoint_id', v_id, 'label', p_label),
                                     v_now);
        UPDATE sessions SET position = position + 1 WHERE tenant_id = p_tenant AND id = s.id
            RETURNING * INTO s;
    END IF;
    SELECT * INTO prev FROM session_checkpoints
        WHERE tenant_id = p_tenant AND session_id = s.id ORDER BY id DESC LIMIT 1;
    IF FOUND THEN
        v_prev_rev := prev.rev;
        v_prev_version := (prev.counters ->> 'scratchpad_version')::bigint;
    END IF;
    IF s.scratchpad_version <> v_prev_version THEN
        INSERT INTO session_scratchpad_snaps (tenant_id, session_id, version, content,
                                              token_count, updated_at)
            VALUES (p_tenant, s.id, s.scratchpad_version, s.scratchpad, s.scratchpad_tokens,
                    s.scratchpad_updated_at)
            RETURNING id INTO v_snap;
    END IF;
    SELECT COALESCE(array_agg(n.id ORDER BY n.id), '{}') INTO v_added FROM session_notes n
        WHERE n.tenant_id = p_tenant AND n.session_id = s.id AND n.dead_rev IS NULL
          AND n.created_rev > v_prev_rev;
    SELECT COALESCE(array_agg(n.id ORDER BY n.id), '{}') INTO v_removed FROM session_notes n
        WHERE n.tenant_id = p_tenant AND n.session_id = s.id AND n.created_rev <= v_prev_rev
          AND n.dead_rev > v_prev_rev;
    FOR c IN SELECT * FROM sessions x
             WHERE x.tenant_id = p_tenant AND x.parent_id = s.id AND x.state = 'active'
             ORDER BY x.id LOOP
        v_child_snap := NULL;
        IF c.scratchpad_version > 0 THEN
            INSERT INTO session_scratchpad_snaps (tenant_id, session_id, version, content,
                                                  token_count, updated_at)
                VALUES (p_tenant, c.id, c.scratchpad_version, c.scratchpad, c.scratchpad_tokens,
                        c.scratchpad_updated_at)
                RETURNING id INTO v_child_snap;
        END IF;
        v_children := v_children || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
            'session_id', c.id, 'agent_id', c.agent_id, 'position', c.position,
            'total_cost_usdc', c.total_cost_usdc, 'entry_count', c.entry_count,
            'entry_bytes', c.entry_bytes, 'rounds', c.rounds,
            'compaction_count', c.compaction_count, 'scratchpad_snap', v_child_snap,
            'notes', (SELECT COALESCE(jsonb_agg(n.id ORDER BY n.id), '[]') FROM session_notes n
                      WHERE n.tenant_id = p_tenant AND n.session_id = c.id
                        AND n.dead_rev IS NULL))));
    END LOOP;
    INSERT INTO session_checkpoints (tenant_id, id, session_id, label, metadata, position, rev,
                                     counters, scratchpad_snap, notes_added, notes_removed,
                                     children, created_at, expires_at)
        VALUES (p_tenant, v_id, s.id, p_label, COALESCE(p_metadata, '{}'), s.position, s.rev,
                jsonb_build_object(
                    'total_cost_usdc', s.total_cost_usdc,
                    'children_cost_usdc', s.children_cost_usdc,
                    'entry_count', s.entry_count, 'entry_bytes', s.entry_bytes,
                    'compaction_count', s.compaction_count, 'rounds', s.rounds,
                    'elapsed_ms', engram_ms(v_now) - engram_ms(s.created_at),
                    'scratchpad_version', s.scratchpad_version),
                v_snap, v_added, v_removed, v_children, v_now,
                v_now + make_interval(secs => p_ttl_s));
    UPDATE sessions SET updated_at = v_now WHERE tenant_id = p_tenant AND id = s.id;
    RETURN jsonb_build_object(
        'checkpoint_id', v_id, 'session_id', s.id, 'position', s.position,
        'created_at', engram_ms(v_now),
        'expires_at', engram_ms(v_now + make_interval(secs => p_ttl_s)),
        'delta', jsonb_build_object('scratchpad', v_snap IS NOT NULL,
                                    'notes_added', cardinality(v_added),
                                    'notes_removed', cardinality(v_removed),
                                    'entries', s.position - COALESCE(prev.position, s.base_seq)));
END $$;

CREATE OR REPLACE FUNCTION engram_session_checkpoints(p_tenant bigint, p_session bigint)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    s sessions := engram_session_get_row(p_tenant, p_session);
BEGIN
    RETURN jsonb_build_object('session_id', s.id, 'checkpoints', COALESCE((
        SELECT jsonb_agg(jsonb_build_object(
                   'checkpoint_id', k.id, 'label', k.label, 'metadata', k.metadata,
                   'position', k.position, 'total_cost_usdc', k.counters -> 'total_cost_usdc',
                   'created_at', engram_ms(k.created_at),
                   'expires_at', engram_ms(k.expires_at)) ORDER BY k.id)
        FROM session_checkpoints k
        WHERE k.tenant_id = p_tenant AND k.session_id = s.id AND k.expires_at > now()),
        '[]'::jsonb));
END $$;

-- engram_session_resume: a new session holding exactly the state of checkpoint p_checkpoint:
-- the transcript up to its position (inherited, not copied), the scratchpad and live notes
-- folded from the checkpoint chain, costs and counters (budget spent carries over; elapsed
-- time restarts with the new session), and one new sub-agent session per sub-agent active
-- at the checkpoint, each inheriting that sub-agent's transcript up to its position.
-- p_branch is resume, sim, pre_steer or dream; a session in a simulation lineage cannot
-- start another simulation branch (EG403). p_override is merged over the source's config
-- (null values remove keys; config.compaction merges key by key). Each restored sub-agent
-- gets its scratchpad and live notes as the checkpoint captured them; a sub-agent deleted
-- since is left out and named in children_missing. The new session, and each restored
-- sub-agent, starts with a session_resumed event after the inherited transcript. The new
-- session counts against the tier's live-session cap (p_max_live, 0: none). Returns the new
-- ids and every agent's conversation tail (its messages and the events involving it).
DROP FUNCTION IF EXISTS engram_session_resume(bigint, bigint, jsonb, text);
DROP FUNCTION IF EXISTS engram_session_resume(bigint, bigint, jsonb, text, bigint);
CREATE OR REPLACE FUNCTION engram_session_resume(p_tenant bigint, p_checkpoint bigint, p_override jsonb,
                                                 p_branch text, p_max_live bigint,
                                                 p_session bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    k session_checkpoints;
    src sessions;
    v_source bigint;
    v_cfg jsonb;
    v_sim text;
    v_now timestamptz := engram_session_now();
    v_id bigint;
    v_snap session_scratchpad_snaps;
    v_depth bigint;
    v_notes bigint;
    v_agents jsonb;
    v_children jsonb := '[]';
    ch jsonb;
    old sessions;
    v_child bigint;
    v_row sessions;
    v_csnap session_scratchpad_snaps;
    v_missing jsonb := '[]';
BEGIN
    -- an unknown checkpoint is not_found whatever the quota: nothing would be created
    SELECT session_id INTO v_source FROM session_checkpoints
        WHERE tenant_id = p_tenant AND id = p_checkpoint AND expires_at > now()
          AND (p_session IS NULL OR session_id = p_session);
    IF NOT FOUND THEN
        IF p_session IS NOT NULL THEN
            RAISE EXCEPTION 'checkpoint % of session % not found', p_checkpoint, p_session
                USING ERRCODE = 'EG404';
        END IF;
        RAISE EXCEPTION 'checkpoint % not found', p_checkpoint USING ERRCODE = 'EG404';
    END IF;
    PERFORM engram_session_check_live(p_tenant, p_max_live);
    -- the purge folds checkpoints under the session's lock: hold it shared while reading
    SELECT * INTO src FROM sessions WHERE tenant_id = p_tenant AND id = v_source FOR SHARE;
    SELECT * INTO k FROM session_checkpoints
        WHERE tenant_id = p_tenant AND id = p_checkpoint AND expires_at > now();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint % not found', p_checkpoint USING ERRCODE = 'EG404';
    END IF;
    IF p_branch <> 'resume' AND src.simulation IS NOT NULL THEN
        RAISE EXCEPTION 'session % is a % simulation branch: simulation branches are single-level',
                        src.id, src.simulation
            USING ERRCODE = 'EG403';
    END IF;
    v_sim := CASE WHEN p_branch = 'resume' THEN src.simulation ELSE p_branch END;
    v_cfg := src.config || COALESCE(p_override, '{}');
    IF jsonb_typeof(p_override -> 'compaction') = 'object'
       AND jsonb_typeof(src.config -> 'compaction') = 'object' THEN
        v_cfg := jsonb_set(v_cfg, '{compaction}',
                           (src.config -> 'compaction') || (p_override -> 'compaction'));
    END IF;
    v_cfg := engram_session_config(jsonb_strip_nulls(v_cfg));
    SELECT sn.* INTO v_snap FROM session_checkpoints c
        JOIN session_scratchpad_snaps sn ON sn.tenant_id = c.tenant_id AND sn.id = c.scratchpad_snap
        WHERE c.tenant_id = p_tenant AND c.session_id = src.id AND c.id <= k.id
        ORDER BY c.id DESC LIMIT 1;
    INSERT INTO sessions (tenant_id, agent_id, config, max_cost_usdc, total_cost_usdc,
                          children_cost_usdc, base_session_id, base_seq, position, entry_count,
                          entry_bytes, compaction_count, rounds, scratchpad, scratchpad_version,
                          scratchpad_tokens, scratchpad_updated_at, branch_type, simulation,
                          origin_session_id, origin_checkpoint_id, created_at, updated_at)
        VALUES (p_tenant, src.agent_id, v_cfg, (v_cfg ->> 'max_cost_usdc')::numeric,
                (k.counters ->> 'total_cost_usdc')::numeric,
                (k.counters ->> 'children_cost_usdc')::numeric, src.id, k.position, k.position,
                (k.counters ->> 'entry_count')::bigint, (k.counters ->> 'entry_bytes')::bigint,
                (k.counters ->> 'compaction_count')::bigint, (k.counters ->> 'rounds')::bigint,
                COALESCE(v_snap.content, ''), COALESCE(v_snap.version, 0),
                COALESCE(v_snap.token_count, 0), v_snap.updated_at, p_branch, v_sim, src.id,
                k.id, v_now, v_now)
        RETURNING * INTO v_row;
    v_id := v_row.id;
    PERFORM engram_session_event(v_row, 'session_resumed', src.agent_id,
                                 format('Session resumed from checkpoint %s (%s) of session %s.',
                                        k.id, k.label, src.id),
                                 jsonb_build_object('checkpoint_id', k.id, 'label', k.label,
                                                    'resumed_from', src.id),
                                 v_now);
    UPDATE sessions SET position = position + 1 WHERE tenant_id = p_tenant AND id = v_id;
    -- notes: a note is live at k when the last checkpoint up to k that mentions it added it
    INSERT INTO session_notes (tenant_id, session_id, agent_id, category, key, value, scope,
                               work_item_id, created_rev, created_at)
        SELECT n.tenant_id, v_id, n.agent_id, n.category, n.key, n.value, n.scope,
               n.work_item_id, 0, n.created_at
        FROM session_notes n
        WHERE n.tenant_id = p_tenant AND n.id IN (
            SELECT o.note FROM (
                SELECT DISTINCT ON (x.note) x.note, x.op FROM (
                    SELECT unnest(c.notes_added) AS note, 'a' AS op, c.id FROM session_checkpoints c
                    WHERE c.tenant_id = p_tenant AND c.session_id = src.id AND c.id <= k.id
                    UNION ALL
                    SELECT unnest(c.notes_removed), 'r', c.id FROM session_checkpoints c
                    WHERE c.tenant_id = p_tenant AND c.session_id = src.id AND c.id <= k.id
                ) x ORDER BY x.note, x.id DESC
            ) o WHERE o.op = 'a')
        ORDER BY n.id;
    GET DIAGNOSTICS v_notes = ROW_COUNT;
    v_depth := COALESCE((v_cfg ->> 'transcript_replay_depth')::bigint, 50);
    -- sub-agents active at the checkpoint come back as sub-agents of the new session
    FOR ch IN SELECT * FROM jsonb_array_elements(k.children) LOOP
        SELECT * INTO old FROM sessions
            WHERE tenant_id = p_tenant AND id = (ch ->> 'session_id')::bigint;
        IF NOT FOUND THEN
            v_missing := v_missing || jsonb_build_array((ch ->> 'session_id')::bigint);
            CONTINUE;
        END IF;
        v_csnap := NULL;
        IF ch ? 'scratchpad_snap' THEN
            SELECT * INTO v_csnap FROM session_scratchpad_snaps
                WHERE tenant_id = p_tenant AND id = (ch ->> 'scratchpad_snap')::bigint;
        END IF;
        INSERT INTO sessions (tenant_id, agent_id, parent_id, config, total_cost_usdc,
                              base_session_id, base_seq, position, entry_count, entry_bytes,
                              compaction_count, rounds, scratchpad, scratchpad_version,
                              scratchpad_tokens, scratchpad_updated_at, branch_type, simulation,
                              origin_session_id, origin_checkpoint_id, task, return_format,
                              max_tokens, created_at, updated_at)
            VALUES (p_tenant, old.agent_id, v_id, old.config,
                    (ch ->> 'total_cost_usdc')::numeric, old.id, (ch ->> 'position')::bigint,
                    (ch ->> 'position')::bigint, (ch ->> 'entry_count')::bigint,
                    (ch ->> 'entry_bytes')::bigint, (ch ->> 'compaction_count')::bigint,
                    (ch ->> 'rounds')::bigint, COALESCE(v_csnap.content, ''),
                    COALESCE(v_csnap.version, 0), COALESCE(v_csnap.token_count, 0),
                    v_csnap.updated_at, p_branch, v_sim, old.id, k.id, old.task,
                    old.return_format, old.max_tokens, v_now, v_now)
            RETURNING * INTO v_row;
        v_child := v_row.id;
        INSERT INTO session_notes (tenant_id, session_id, agent_id, category, key, value, scope,
                                   work_item_id, created_rev, created_at)
            SELECT n.tenant_id, v_child, n.agent_id, n.category, n.key, n.value, n.scope,
                   n.work_item_id, 0, n.created_at
            FROM session_notes n
            WHERE n.tenant_id = p_tenant AND n.session_id = old.id
              AND n.id IN (SELECT x::bigint FROM jsonb_array_elements_text(
                               COALESCE(ch -> 'notes', '[]')) x)
            ORDER BY n.id;
        PERFORM engram_session_event(v_row, 'session_resumed', old.agent_id,
                                     format('Session resumed from checkpoint %s (%s) of session %s.',
                                            k.id, k.label, src.id),
                                     jsonb_build_object('checkpoint_id', k.id, 'label', k.label,
                                                        'resumed_from', old.id),
                                     v_now);
        UPDATE sessions SET position = position + 1 WHERE tenant_id = p_tenant AND id = v_child;
        v_children := v_children || jsonb_build_array(jsonb_build_object(
            'session_id', v_child, 'resumed_from', old.id,
            'agent_id', engram_session_u64(old.agent_id), 'task', old.task,
            'scratchpad_version', COALESCE(v_csnap.version, 0),
            'notes', jsonb_array_length(COALESCE(ch -> 'notes', '[]')),
            'tail', engram_session_tail(p_tenant, v_child, (ch ->> 'position')::bigint, NULL,
                                        v_depth)));
    END LOOP;
    -- each agent that took part, most recently active first, with its conversation tail
    SELECT COALESCE(jsonb_agg(jsonb_build_object(
               'agent_id', engram_session_u64(a.agent_id),
               'tail', engram_session_tail(p_tenant, v_id, k.position, a.agent_id, v_depth))
               ORDER BY a.last_seq DESC), '[]')
        INTO v_agents
        FROM engram_session_agents(p_tenant, v_id, k.position) a;
    RETURN jsonb_build_object(
        'session_id', v_id, 'checkpoint_id', k.id, 'resumed_from', src.id,
        'branch_type', p_branch, 'simulation', v_sim,
        'restored', jsonb_build_object(
            'position', k.position, 'label', k.label, 'metadata', k.metadata,
            'total_cost_usdc', (k.counters -> 'total_cost_usdc'),
            'entry_count', k.counters -> 'entry_count',
            'compaction_count', k.counters -> 'compaction_count',
            'rounds', k.counters -> 'rounds',
            'elapsed_ms_at_checkpoint', k.counters -> 'elapsed_ms',
            'scratchpad_version', COALESCE(v_snap.version, 0), 'notes', v_notes,
            'checkpointed_at', engram_ms(k.created_at)),
        'agents', v_agents, 'children', v_children, 'children_missing', v_missing);
END $$;

-- engram_session_purge_expired: removes every expired checkpoint and the scratchpad copies
-- only it referenced; returns how many checkpoints were removed. A checkpoint with a
-- successor in its session first folds its delta into the successor, so the successor
-- still restores the full state. Runs as the owner (no tenant is set): call it from the
-- maintenance scheduler.
CREATE OR REPLACE FUNCTION engram_session_purge_expired() RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    ss record;
    k session_checkpoints;
    nx session_checkpoints;
    v_id bigint;
    v_n bigint := 0;
BEGIN
    FOR ss IN SELECT DISTINCT c.tenant_id, c.session_id FROM session_checkpoints c
              WHERE c.expires_at <= now() ORDER BY 1, 2 LOOP
        -- the same lock checkpoint and resume take: the chain changes under no reader
        PERFORM 1 FROM sessions WHERE tenant_id = ss.tenant_id AND id = ss.session_id
            FOR UPDATE;
        FOR v_id IN SELECT c.id FROM session_checkpoints c
                    WHERE c.tenant_id = ss.tenant_id AND c.session_id = ss.session_id
                      AND c.expires_at <= now() ORDER BY c.id LOOP
            -- read it now: folding its predecessor may have changed it since the loop began
            SELECT * INTO k FROM session_checkpoints c
                WHERE c.tenant_id = ss.tenant_id AND c.id = v_id;
            SELECT * INTO nx FROM session_checkpoints c
                WHERE c.tenant_id = ss.tenant_id AND c.session_id = ss.session_id AND c.id > k.id
                ORDER BY c.id LIMIT 1;
            IF FOUND THEN
                UPDATE session_checkpoints c
                    SET scratchpad_snap = COALESCE(nx.scratchpad_snap, k.scratchpad_snap),
                        notes_added = engram_session_arr_union(
                            engram_session_arr_minus(k.notes_added, nx.notes_removed),
                            nx.notes_added),
                        notes_removed = engram_session_arr_union(
                            k.notes_removed,
                            engram_session_arr_minus(nx.notes_removed, k.notes_added))
                    WHERE c.tenant_id = nx.tenant_id AND c.id = nx.id;
            END IF;
            DELETE FROM session_checkpoints c WHERE c.tenant_id = k.tenant_id AND c.id = k.id;
            -- the sub-agents' scratchpad copies are whole per checkpoint: only k held them
            DELETE FROM session_scratchpad_snaps sn
                WHERE sn.tenant_id = k.tenant_id
                  AND sn.id IN (SELECT (ch ->> 'scratchpad_snap')::bigint
                                FROM jsonb_array_elements(k.children) ch
                                WHERE ch ? 'scratchpad_snap');
            IF k.scratchpad_snap IS NOT NULL
               AND (nx.id IS NULL OR nx.scratchpad_snap IS NOT NULL) THEN
                DELETE FROM session_scratchpad_snaps sn
                    WHERE sn.tenant_id = k.tenant_id AND sn.id = k.scratchpad_snap;
            END IF;
            v_n := v_n + 1;
        END LOOP;
    END LOOP;
    RETURN v_n;
END $$;

-- engram_session_spawn: a sub-agent session under p_parent whose transcript starts with the
-- given context (a system message) and the task (a user message), nothing else.
CREATE OR REPLACE FUNCTION engram_session_spawn(p_tenant bigint, p_parent bigint, p_task text,
                                     p_model text, p_context text, p_max_tokens bigint,
                                     p_return_format text, p_agent bigint, p_max_children bigint,
                                     p_max_entries bigint, p_max_bytes bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    p sessions := engram_session_lock(p_tenant, p_parent);
    v_now timestamptz := engram_session_now();
    v_n bigint;
    v_id bigint;
    v_agent bigint := COALESCE(p_agent, p.agent_id);
    v_entries bigint := CASE WHEN p_context IS NULL THEN 1 ELSE 2 END;
    v_bytes bigint := octet_length(p_task) + COALESCE(octet_length(p_context), 0);
    v_cfg jsonb;
BEGIN
    IF p.parent_id IS NOT NULL THEN
        RAISE EXCEPTION 'session % is a sub-agent session: sub-agents cannot spawn', p.id
            USING ERRCODE = 'EG403';
    END IF;
    PERFORM engram_session_require_active(p);
    SELECT count(*) INTO v_n FROM sessions WHERE tenant_id = p_tenant AND parent_id = p.id;
    IF v_n + 1 > p_max_children THEN
        RAISE EXCEPTION 'session % has reached its limit of % sub-agents', p.id, p_max_children
            USING ERRCODE = 'EG429', DETAIL = format('limit=%s usage=%s', p_max_children, v_n);
    END IF;
    IF v_entries > p_max_entries OR v_bytes > p_max_bytes THEN
        RAISE EXCEPTION 'the sub-agent''s task and context pass the transcript limits'
            USING ERRCODE = 'EG429',
                  DETAIL = format('limit=%s usage=0 requested=%s', p_max_bytes, v_bytes);
    END IF;
    v_cfg := engram_session_config(jsonb_strip_nulls(jsonb_build_object(
        'model', COALESCE(p_model, p.config ->> 'model'), 'max_tokens', p_max_tokens,
        'compaction', p.config -> 'compaction')));
    INSERT INTO sessions (tenant_id, agent_id, parent_id, config, task, return_format,
                          max_tokens, simulation, position, entry_count, entry_bytes,
                          created_at, updated_at)
        VALUES (p_tenant, v_agent, p.id, v_cfg, p_task, p_return_format, p_max_tokens,
                p.simulation, v_entries, v_entries, v_bytes, v_now, v_now)
        RETURNING id INTO v_id;
    IF p_context IS NOT NULL THEN
        INSERT INTO session_entries (tenant_id, session_id, seq, kind, role, content, agent_id,
                                     created_at)
            VALUES (p_tenant, v_id, 1, 'message', 'system', p_context, v_agent, v_now);
    END IF;
    INSERT INTO session_entries (tenant_id, session_id, seq, kind, role, content, agent_id,
                                 created_at)
        VALUES (p_tenant, v_id, v_entries, 'message', 'user', p_task, v_agent, v_now);
    -- the delegation, in the parent's transcript (tails of both agents show it)
    PERFORM engram_session_event(p, 'spawn', p.agent_id,
                                 format('Delegated to sub-agent %s (session %s): %s',
                                        engram_session_u64(v_agent), v_id, left(p_task, 200)),
                                 jsonb_build_object('child_session_id', v_id,
                                                    'child_agent_id', engram_session_u64(v_agent),
                                                    'return_format', p_return_format),
                                 v_now);
    UPDATE sessions SET position = position + 1, updated_at = v_now
        WHERE tenant_id = p_tenant AND id = p.id;
    RETURN jsonb_build_object('session_id', v_id, 'parent_id', p.id,
                              'agent_id', engram_session_u64(v_agent));
END $$;

CREATE OR REPLACE FUNCTION engram_session_complete(p_tenant bigint, p_session bigint, p_output text)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    p sessions;
    v_now timestamptz := engram_session_now();
BEGIN
    IF s.parent_id IS NULL THEN
        RAISE EXCEPTION 'session % is not a sub-agent session (use session.end)', s.id
            USING ERRCODE = 'EG400';
    END IF;
    PERFORM engram_session_require_active(s);
    UPDATE sessions
        SET state = 'completed', output = p_output, completed_at = v_now, ended_at = v_now,
            updated_at = v_now
        WHERE tenant_id = p_tenant AND id = s.id;
    -- the parent's transcript records the completion while the parent is active
    SELECT * INTO p FROM sessions WHERE tenant_id = p_tenant AND id = s.parent_id;
    IF p.state = 'active' THEN
        PERFORM engram_session_event(p, 'sub_agent_completed', p.agent_id,
                                     format('Sub-agent %s (session %s) completed.',
                                            engram_session_u64(s.agent_id), s.id),
                                     jsonb_build_object('child_session_id', s.id,
                                                        'child_agent_id',
                                                        engram_session_u64(s.agent_id)),
                                     v_now);
        UPDATE sessions SET position = position + 1 WHERE tenant_id = p_tenant AND id = p.id;
    END IF;
    UPDATE sessions SET updated_at = v_now WHERE tenant_id = p_tenant AND id = s.parent_id;
    RETURN jsonb_build_object('session_id', s.id, 'parent_id', s.parent_id,
                              'state', 'completed', 'completed_at', engram_ms(v_now));
END $$;

-- engram_session_children: the sub-agents of p_session in spawn order; a completed
-- sub-agent spawned with return_format 'full' also brings its transcript.
CREATE OR REPLACE FUNCTION engram_session_children(p_tenant bigint, p_session bigint)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    s sessions := engram_session_get_row(p_tenant, p_session);
BEGIN
    RETURN jsonb_build_object('session_id', s.id, 'children', COALESCE((
        SELECT jsonb_agg(jsonb_build_object(
                   'session_id', c.id, 'agent_id', engram_session_u64(c.agent_id),
                   'task', c.task, 'model', c.config ->> 'model', 'state', c.state,
                   'return_format', c.return_format, 'max_tokens', c.max_tokens,
                   'output', c.output, 'total_cost_usdc', c.total_cost_usdc,
                   'entry_count', c.entry_count, 'created_at', engram_ms(c.created_at),
                   'completed_at', engram_ms(c.completed_at))
               || CASE WHEN c.return_format = 'full' AND c.state = 'completed' THEN
                      jsonb_build_object('messages', engram_session_history(
                          p_tenant, c.id, c.position, NULL, NULL))
                  ELSE '{}'::jsonb END
               ORDER BY c.id)
        FROM sessions c WHERE c.tenant_id = p_tenant AND c.parent_id = s.id), '[]'::jsonb));
END $$;

-- engram_session_handoff: the package another agent (or a human, or a recovering process)
-- needs to pick the session up. p_mode selects the sections:
--   continue  summary, carry_forward, blockers, work_items, tasks_done, decisions,
--             scratchpad, events(20), audit(20)
--   takeover  carry_forward, blockers, work_items, tasks_done, decisions, audit(20), none of
--             them holding a current_task note (nor the audit its records)
--   review    summary, decisions
--   recovery  everything of continue, all live notes, events(100), audit(100), the latest
--             checkpoint and the active sub-agents
-- metrics are always included. The handoff is recorded in the audit log (p_agent: the
-- agent asking, NULL: not known).
DROP FUNCTION IF EXISTS engram_session_handoff(bigint, bigint, text);
CREATE OR REPLACE FUNCTION engram_session_handoff(p_tenant bigint, p_session bigint, p_mode text,
                                                  p_agent bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_get_row(p_tenant, p_session);
    v_now timestamptz := engram_session_now();
    v jsonb;
    v_summary text;
    v_events bigint;
BEGIN
    v := jsonb_build_object(
        'session_id', s.id, 'mode', p_mode, 'state', s.state,
        'agent_id', engram_session_u64(s.agent_id), 'model', s.config ->> 'model',
        'generated_at', engram_ms(v_now),
        'metrics', jsonb_build_object(
            'duration_ms', engram_ms(COALESCE(s.ended_at, v_now)) - engram_ms(s.created_at),
            'entries', s.entry_count, 'bytes', s.entry_bytes, 'cost_usdc', s.total_cost_usdc,
            'checkpoints', (SELECT count(*) FROM session_checkpoints k
                            WHERE k.tenant_id = p_tenant AND k.session_id = s.id
                              AND k.expires_at > now()),
            'compactions', s.compaction_count, 'rounds', s.rounds,
            'notes', (SELECT count(*) FROM session_notes n
                      WHERE n.tenant_id = p_tenant AND n.session_id = s.id
                        AND n.dead_rev IS NULL),
            'children', (SELECT count(*) FROM sessions c
                         WHERE c.tenant_id = p_tenant AND c.parent_id = s.id))
            || engram_work_item_counts(p_tenant, COALESCE(s.parent_id, s.id)));
    IF p_mode IN ('continue', 'review', 'recovery') THEN
        v_summary := s.summary;
        IF v_summary IS NULL THEN
            SELECT l.content INTO v_summary FROM engram_session_live(p_tenant, s.id, s.position) l
                WHERE l.kind = 'summary' ORDER BY l.target_seq DESC LIMIT 1;
        END IF;
        v := v || jsonb_build_object('summary', v_summary);
    END IF;
    IF p_mode IN ('continue', 'takeover', 'recovery') THEN
        v := v || jsonb_build_object(
            'carry_forward', COALESCE((
                SELECT jsonb_agg(engram_session_note_json(n) ORDER BY n.id) FROM session_notes n
                WHERE n.tenant_id = p_tenant AND n.session_id = s.id AND n.dead_rev IS NULL
                  AND (n.scope = 'carry_forward' OR n.category = 'handoff')
                  AND (p_mode <> 'takeover' OR n.scope <> 'current_task')), '[]'::jsonb),
            'blockers', COALESCE((
                SELECT jsonb_agg(engram_session_note_json(n) ORDER BY n.id) FROM session_notes n
                WHERE n.tenant_id = p_tenant AND n.session_id = s.id AND n.dead_rev IS NULL
                  AND n.category = 'blocker'
                  AND (p_mode <> 'takeover' OR n.scope <> 'current_task')), '[]'::jsonb))
            || engram_work_item_handoff(p_tenant, s, p_mode = 'takeover')
            || jsonb_build_object('audit', engram_audit_tail(
                   p_tenant, s.id, CASE p_mode WHEN 'recovery' THEN 100 ELSE 20 END,
                   p_mode = 'takeover'));
    END IF;
    v := v || jsonb_build_object('decisions', COALESCE((
        SELECT jsonb_agg(engram_session_note_json(n) ORDER BY n.id) FROM session_notes n
        WHERE n.tenant_id = p_tenant AND n.session_id = s.id AND n.dead_rev IS NULL
          AND n.category = 'decision'
          AND (p_mode <> 'takeover' OR n.scope <> 'current_task')), '[]'::jsonb));
    IF p_mode IN ('continue', 'recovery') THEN
        v := v || jsonb_build_object('scratchpad', engram_session_scratchpad_json(s));
        v_events := CASE p_mode WHEN 'continue' THEN 20 ELSE 100 END;
        v := v || jsonb_build_object('events', COALESCE((
            SELECT jsonb_agg(ev.e ORDER BY ev.at, ev.ord) FROM (
                SELECT * FROM (
                    SELECT n.created_at AS at, 1 AS ord, jsonb_build_object(
                               'type', 'note', 'at', engram_ms(n.created_at), 'note_id', n.id,
                               'category', n.category, 'key', n.key, 'value', n.value,
                               'scope', n.scope, 'live', n.dead_rev IS NULL) AS e
                    FROM session_notes n
                    WHERE n.tenant_id = p_tenant AND n.session_id = s.id
                      AND n.category <> 'context'
                    UNION ALL
                    SELECT l.created_at, 2, jsonb_build_object(
                               'type', 'compaction', 'at', engram_ms(l.created_at),
                               'entry_id', l.id, 'through_entry_id', l.target_id,
                               'messages_compacted', l.messages_compacted)
                    FROM engram_session_live(p_tenant, s.id, s.position) l
                    WHERE l.kind = 'summary'
                    UNION ALL
                    SELECT k.created_at, 3, jsonb_build_object(
                               'type', 'checkpoint', 'at', engram_ms(k.created_at),
                               'checkpoint_id', k.id, 'label', k.label)
                    FROM session_checkpoints k
                    WHERE k.tenant_id = p_tenant AND k.session_id = s.id
                      AND k.expires_at > now()
                    UNION ALL
                    SELECT c.created_at, 4, jsonb_build_object(
                               'type', 'spawn', 'at', engram_ms(c.created_at),
                               'session_id', c.id, 'task', c.task)
                    FROM sessions c WHERE c.tenant_id = p_tenant AND c.parent_id = s.id
                    UNION ALL
                    SELECT c.completed_at, 5, jsonb_build_object(
                               'type', 'sub_agent_completed', 'at', engram_ms(c.completed_at),
                               'session_id', c.id, 'output', c.output)
                    FROM sessions c
                    WHERE c.tenant_id = p_tenant AND c.parent_id = s.id
                      AND c.completed_at IS NOT NULL
                    UNION ALL
                    SELECT s.ended_at, 6, jsonb_build_object(
                               'type', 'ended', 'at', engram_ms(s.ended_at))
                    WHERE s.ended_at IS NOT NULL
                ) all_ev ORDER BY all_ev.at DESC, all_ev.ord DESC LIMIT v_events
            ) ev), '[]'::jsonb));
    END IF;
    IF p_mode = 'recovery' THEN
        v := v || jsonb_build_object(
            'notes', COALESCE((
                SELECT jsonb_agg(engram_session_note_json(n) ORDER BY n.id) FROM session_notes n
                WHERE n.tenant_id = p_tenant AND n.session_id = s.id AND n.dead_rev IS NULL),
                '[]'::jsonb),
            'checkpoint', (
                SELECT jsonb_build_object('checkpoint_id', k.id, 'label', k.label,
                                          'position', k.position,
                                          'created_at', engram_ms(k.created_at),
                                          'expires_at', engram_ms(k.expires_at))
                FROM session_checkpoints k
                WHERE k.tenant_id = p_tenant AND k.session_id = s.id AND k.expires_at > now()
                ORDER BY k.id DESC LIMIT 1),
            'children', COALESCE((
                SELECT jsonb_agg(jsonb_build_object('session_id', c.id, 'task', c.task,
                                                    'agent_id', engram_session_u64(c.agent_id),
                                                    'entry_count', c.entry_count,
                                                    'total_cost_usdc', c.total_cost_usdc)
                                 ORDER BY c.id)
                FROM sessions c
                WHERE c.tenant_id = p_tenant AND c.parent_id = s.id AND c.state = 'active'),
                '[]'::jsonb));
    END IF;
    PERFORM engram_audit_write(p_tenant, s.id, p_agent, 'handoff', 'session', s.id,
                               jsonb_build_object('mode', p_mode));
    RETURN v;
END $$;

-- ---- deletion and retention ---------------------------------------------------------------

-- engram_session_closure: p_roots with their sub-agents and, when p_branches, the sessions
-- resumed from any of them (which inherit part of their transcripts), transitively.
CREATE OR REPLACE FUNCTION engram_session_closure(p_tenant bigint, p_roots bigint[],
                                                  p_branches boolean)
    RETURNS bigint[] LANGUAGE sql STABLE AS $$
    WITH RECURSIVE d (id) AS (
        SELECT x.id FROM sessions x WHERE x.tenant_id = p_tenant AND x.id = ANY (p_roots)
        UNION
        SELECT x.id FROM sessions x JOIN d ON x.tenant_id = p_tenant
            AND (x.parent_id = d.id OR (p_branches AND x.base_session_id = d.id))
    )
    SELECT COALESCE(array_agg(d.id ORDER BY d.id), '{}') FROM d
$$;

-- engram_session_delete: deletes session p_session from PostgreSQL with everything it owns
-- (transcript, notes, scratchpad copies, checkpoints, and whatever else references the
-- session with ON DELETE CASCADE) and its sub-agents. Sessions resumed from it or from its
-- sub-agents inherit part of its transcript: without p_cascade the delete is refused
-- (EG409) while any exist; with it they go too, with their own sub-agents and branches.
-- Every session is locked in id order (a parent before its sub-agents, as every writer
-- locks them), so a concurrent writer either finishes first or finds the session gone.
CREATE OR REPLACE FUNCTION engram_session_delete(p_tenant bigint, p_session bigint,
                                                 p_cascade boolean)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    v_ids bigint[];
    v_dep bigint[];
    v_n bigint;
BEGIN
    v_ids := engram_session_closure(p_tenant, ARRAY[s.id], p_cascade);
    IF NOT p_cascade THEN
        SELECT array_agg(d.id ORDER BY d.id) INTO v_dep FROM sessions d
            WHERE d.tenant_id = p_tenant AND d.base_session_id = ANY (v_ids)
              AND d.id <> ALL (v_ids);
        IF v_dep IS NOT NULL THEN
            RAISE EXCEPTION 'session % has % session(s) resumed from it that inherit its transcript (%); delete them first or pass cascade: true',
                            s.id, cardinality(v_dep), array_to_string(v_dep[1:10], ', ')
                USING ERRCODE = 'EG409', DETAIL = format('dependents=%s', cardinality(v_dep));
        END IF;
    END IF;
    PERFORM 1 FROM sessions WHERE tenant_id = p_tenant AND id = ANY (v_ids) ORDER BY id
        FOR UPDATE;
    DELETE FROM sessions WHERE tenant_id = p_tenant AND id = ANY (v_ids);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN jsonb_build_object('session_id', s.id, 'deleted', v_n, 'session_ids', to_jsonb(v_ids));
END $$;

-- engram_session_purge_retention: deletes the sessions past their tier's retention. A
-- top-level session is expired when it, its sub-agents and every session resumed from
-- them (transitively) have all been inactive (updated_at) for the retention of its
-- tenant's tier; it then goes with all of them, as engram_session_delete with cascade
-- would. p_days: the retention in days of free, standard and premium (0: forever). At most
-- p_batch expired sessions per call, looking at no more than 20 * p_batch candidates;
-- returns how many sessions (sub-agents and branches included) were deleted. Runs as the
-- owner (no tenant is set): the maintenance scheduler calls it until it returns 0.
CREATE OR REPLACE FUNCTION engram_session_purge_retention(p_days integer[], p_batch integer)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    t record;
    r record;
    v_days integer;
    v_cut timestamptz;
    v_ids bigint[];
    v_roots integer := 0;
    v_seen integer := 0;
    v_n bigint := 0;
    v_d bigint;
BEGIN
    <<tenants>>
    FOR t IN SELECT x.id, x.tier FROM tenants x ORDER BY x.id LOOP
        v_days := p_days[CASE t.tier WHEN 'free' THEN 1 WHEN 'standard' THEN 2 ELSE 3 END];
        CONTINUE WHEN v_days IS NULL OR v_days <= 0;
        v_cut := now() - make_interval(days => v_days);
        FOR r IN SELECT x.id FROM sessions x
                 WHERE x.tenant_id = t.id AND x.parent_id IS NULL AND x.updated_at < v_cut
                 ORDER BY x.updated_at, x.id LOOP
            EXIT tenants WHEN v_roots >= p_batch OR v_seen >= 20 * p_batch;
            v_seen := v_seen + 1;
            v_ids := engram_session_closure(t.id, ARRAY[r.id], true);
            CONTINUE WHEN cardinality(v_ids) = 0; -- deleted with an earlier one
            PERFORM 1 FROM sessions WHERE tenant_id = t.id AND id = ANY (v_ids) ORDER BY id
                FOR UPDATE;
            CONTINUE WHEN EXISTS (SELECT 1 FROM sessions x
                                  WHERE x.tenant_id = t.id AND x.id = ANY (v_ids)
                                    AND x.updated_at >= v_cut);
            DELETE FROM sessions WHERE tenant_id = t.id AND id = ANY (v_ids);
            GET DIAGNOSTICS v_d = ROW_COUNT;
            v_n := v_n + v_d;
            v_roots := v_roots + 1;
        END LOOP;
    END LOOP;
    RETURN v_n;
END $$;

-- ---- session.context -------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION engram_session_xml(p text) RETURNS text
    LANGUAGE sql IMMUTABLE AS $$
    SELECT replace(replace(replace(p, '&', '&amp;'), '<', '&lt;'), '>', '&gt;')
$$;

-- engram_session_wm: the <working_memory> block of session s within p_cap bytes (a token
-- is 4 bytes of text, as memory.context counts), for session.context and memory.prompt:
-- the scratchpad, then the live notes, then (p_work_items) the open work items of the
-- session (a sub-agent's: its parent's) by title. Under the cap, what is kept first: the
-- with p_keep_cf (session.context) the carry_forward notes, always (seed 004: they are
-- never dropped, even past p_cap); then the scratchpad in what they leave (cut at the end,
-- marked [truncated], if it does not fit), then the other notes in the order carry_forward,
-- blockers, current_task, decisions, the rest (newest first within each), then work items
-- in id order; a note or work item that does not fit is left out and the next one tried.
-- Notes are shown in creation order whatever was dropped. Returns {text, pad_cut, note_ids,
-- notes_total, work_item_ids, work_items_total}; text is the whole block, at most p_cap
-- bytes when p_cap holds its frame (and, with p_keep_cf, the carry_forward notes).
DROP FUNCTION IF EXISTS engram_session_wm(bigint, sessions, bigint, boolean);
CREATE OR REPLACE FUNCTION engram_session_wm(p_tenant bigint, s sessions, p_cap bigint,
                                             p_work_items boolean, p_keep_cf boolean)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    c_open constant text := E'<working_memory>\n';
    c_close constant text := '</working_memory>';
    c_items constant text := E'<work_items>\n</work_items>\n';
    v_bytes bigint;
    v_pad text := '';
    v_pad_cut boolean := false;
    v_keep bigint[] := '{}';
    v_notes_total bigint;
    v_cf bigint;
    v_items bigint[] := '{}';
    v_items_text text := '';
    v_items_total bigint := 0;
    v_add bigint;
    v_text text;
    n record;
    w record;
    v_lo integer;
    v_hi integer;
    v_mid integer;
BEGIN
    v_bytes := octet_length(c_open) + octet_length(c_close);
    -- carry-forward notes are never dropped (seed 004: "relevant beyond this session"): their
    -- room is taken first, even past p_cap, and the scratchpad gets what is left
    SELECT COALESCE(sum(octet_length(format(E'<note id="%s" category="%s" scope="%s" key="%s">%s</note>\n',
                                            x.id, x.category, x.scope,
                                            replace(engram_session_xml(x.key), '"', '&quot;'),
                                            engram_session_xml(x.value)))) + 17, 0)
        INTO v_cf FROM session_notes x
        WHERE x.tenant_id = p_tenant AND x.session_id = s.id AND x.dead_rev IS NULL
          AND x.scope = 'carry_forward' AND p_keep_cf;
    -- the scratchpad
    IF s.scratchpad <> '' THEN
        v_pad := engram_session_xml(s.scratchpad) || E'\n';
        IF v_bytes + v_cf + octet_length(v_pad) > p_cap THEN
            -- the longest prefix (in characters) that fits, found by bisection
            v_lo := 0;
            v_hi := length(v_pad);
            WHILE v_lo < v_hi LOOP
                v_mid := (v_lo + v_hi + 1) / 2;
                IF octet_length(left(v_pad, v_mid)) <= p_cap - v_cf - v_bytes - 13 THEN
                    v_lo := v_mid;
                ELSE
                    v_hi := v_mid - 1;
                END IF;
            END LOOP;
            v_pad := left(v_pad, v_lo) || E'\n[truncated]\n';
            v_pad_cut := true;
        END IF;
        v_bytes := v_bytes + octet_length(v_pad);
    END IF;
    -- the live notes by priority
    SELECT count(*) INTO v_notes_total FROM session_notes x
        WHERE x.tenant_id = p_tenant AND x.session_id = s.id AND x.dead_rev IS NULL;
    FOR n IN SELECT x.id, x.scope, format(E'<note id="%s" category="%s" scope="%s" key="%s">%s</note>\n',
                                 x.id, x.category, x.scope,
                                 replace(engram_session_xml(x.key), '"', '&quot;'),
                                 engram_session_xml(x.value)) AS line
             FROM session_notes x
             WHERE x.tenant_id = p_tenant AND x.session_id = s.id AND x.dead_rev IS NULL
             ORDER BY CASE WHEN x.scope = 'carry_forward' THEN 0
                           WHEN x.category = 'blocker' THEN 1
                           WHEN x.scope = 'current_task' THEN 2
                           WHEN x.category = 'decision' THEN 3 ELSE 4 END, x.id DESC LOOP
        IF (p_keep_cf AND n.scope = 'carry_forward') OR v_bytes + octet_length(n.line) + 17 <= p_cap THEN
            v_keep := v_keep || n.id;
            v_bytes := v_bytes + octet_length(n.line);
        END IF;
    END LOOP;
    IF cardinality(v_keep) > 0 THEN
        v_bytes := v_bytes + octet_length(E'<notes>\n</notes>\n');
    END IF;
    -- the open work items
    IF p_work_items THEN
        FOR w IN SELECT x.id, format(E'<work_item id="%s" status="%s" owner_agent_id="%s">%s</work_item>\n',
                                     x.id, x.status, engram_session_u64(x.owner_agent_id),
                                     engram_session_xml(x.title)) AS line
                 FROM session_work_items x
                 WHERE x.tenant_id = p_tenant AND x.session_id = COALESCE(s.parent_id, s.id)
                   AND x.status IN ('open', 'in_progress', 'blocked')
                 ORDER BY x.id LOOP
            v_items_total := v_items_total + 1;
            -- the first one brings the <work_items> element
            v_add := octet_length(w.line);
            IF cardinality(v_items) = 0 THEN
                v_add := v_add + octet_length(c_items);
            END IF;
            IF v_bytes + v_add <= p_cap THEN
                v_bytes := v_bytes + v_add;
                v_items := v_items || w.id;
                v_items_text := v_items_text || w.line;
            END IF;
        END LOOP;
    END IF;
    v_text := c_open || v_pad;
    IF cardinality(v_keep) > 0 THEN
        v_text := v_text || E'<notes>\n' || (
            SELECT string_agg(format(E'<note id="%s" category="%s" scope="%s" key="%s">%s</note>\n',
                                     x.id, x.category, x.scope,
                                     replace(engram_session_xml(x.key), '"', '&quot;'),
                                     engram_session_xml(x.value)), '' ORDER BY x.id)
            FROM session_notes x WHERE x.tenant_id = p_tenant AND x.id = ANY (v_keep))
            || E'</notes>\n';
    END IF;
    IF cardinality(v_items) > 0 THEN
        v_text := v_text || E'<work_items>\n' || v_items_text || E'</work_items>\n';
    END IF;
    v_text := v_text || c_close;
    RETURN jsonb_build_object(
        'text', v_text, 'pad_cut', v_pad_cut,
        'note_ids', (SELECT COALESCE(jsonb_agg(x ORDER BY x), '[]') FROM unnest(v_keep) x),
        'notes_total', v_notes_total,
        'work_item_ids', to_jsonb(v_items), 'work_items_total', v_items_total);
END $$;

-- engram_session_context: what a gateway injects for the session, within p_budget tokens
-- (a token is 4 bytes of text, as memory.context counts):
--   for a session resumed from a checkpoint, the seed's resumed-session context: each
--   agent's conversation tail as of the checkpoint (p_agent: that agent's only), at most
--   config.transcript_replay_depth items each;
--   then the <working_memory> block: the scratchpad, then the live notes
--   (engram_session_wm, without work items).
-- Under the budget, what is kept first: the working memory as engram_session_wm keeps it,
-- then the tails' items newest first. Tail items are shown in transcript order whatever
-- was dropped.
CREATE OR REPLACE FUNCTION engram_session_context(p_tenant bigint, p_session bigint,
                                                  p_budget bigint, p_agent bigint)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    s sessions := engram_session_get_row(p_tenant, p_session);
    c_head constant text := E'## Session Context (Resumed)\nThis session was paused and has now resumed. Below is a summary of recent activity you were involved in before the pause.\n';
    v_bytes bigint;
    v_cap bigint := p_budget * 4;
    v_wm jsonb;
    v_resumed boolean := s.origin_checkpoint_id IS NOT NULL;
    v_depth bigint := COALESCE((s.config ->> 'transcript_replay_depth')::bigint, 50);
    v_text text;
    v_line text;
    v_section text := '';
    v_agent_info jsonb := '[]';
    a record;
    it record;
    v_lines text[];
    v_kept integer;
    v_all integer;
BEGIN
    v_wm := engram_session_wm(p_tenant, s, v_cap, false, true);
    v_bytes := octet_length(v_wm ->> 'text');
    -- the resumed-session context
    IF v_resumed THEN
        v_bytes := v_bytes + octet_length(c_head) + 1;
        FOR a IN SELECT y.agent_id FROM engram_session_agents(p_tenant, s.id, s.base_seq) y
                 WHERE p_agent IS NULL OR y.agent_id = p_agent
                 ORDER BY y.last_seq DESC LOOP
            v_lines := '{}';
            v_all := 0;
            v_kept := 0;
            v_line := format(E'### Agent %s\n', engram_session_u64(a.agent_id));
            IF v_bytes + octet_length(v_line) > v_cap THEN
                EXIT;
            END IF;
            v_bytes := v_bytes + octet_length(v_line);
            FOR it IN SELECT format(E'[%s] %s\n',
                                    CASE x ->> 'type' WHEN 'message' THEN x ->> 'role'
                                         ELSE x ->> 'type' END,
                                    x ->> 'content') AS line
                      FROM jsonb_array_elements(engram_session_tail(p_tenant, s.id, s.base_seq,
                                                                    a.agent_id, v_depth))
                           WITH ORDINALITY AS t (x, ord)
                      ORDER BY t.ord DESC LOOP
                v_all := v_all + 1;
                IF v_kept = v_all - 1 AND v_bytes + octet_length(it.line) <= v_cap THEN
                    v_lines := it.line || v_lines;
                    v_bytes := v_bytes + octet_length(it.line);
                    v_kept := v_kept + 1;
                END IF;
            END LOOP;
            v_section := v_section || v_line || array_to_string(v_lines, '');
            v_agent_info := v_agent_info || jsonb_build_array(jsonb_build_object(
                'agent_id', engram_session_u64(a.agent_id), 'items', v_kept,
                'omitted', v_all - v_kept));
        END LOOP;
    END IF;
    v_text := '';
    IF v_resumed THEN
        v_text := c_head || v_section || E'\n';
    END IF;
    v_text := v_text || (v_wm ->> 'text');
    RETURN jsonb_build_object(
        'session_id', s.id, 'text', v_text, 'tokens_used', octet_length(v_text) / 4,
        'budget_tokens', p_budget,
        'scratchpad', jsonb_build_object('version', s.scratchpad_version,
                                         'included', s.scratchpad <> '',
                                         'truncated', (v_wm ->> 'pad_cut')::boolean),
        'notes', jsonb_build_object('included', jsonb_array_length(v_wm -> 'note_ids'),
                                    'omitted', (v_wm ->> 'notes_total')::bigint
                                               - jsonb_array_length(v_wm -> 'note_ids'),
                                    'note_ids', v_wm -> 'note_ids'),
        'resumed', CASE WHEN v_resumed THEN jsonb_build_object(
                            'checkpoint_id', s.origin_checkpoint_id,
                            'resumed_from', s.origin_session_id, 'position', s.base_seq,
                            'agents', v_agent_info) END);
END $$;
