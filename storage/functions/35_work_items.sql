-- storage/functions/35_work_items.sql: Work items of sessions, and the sessions' audit log
-- (the triggers that write it, and its reading).
--
-- Repeatable: engramd applies this file whole, in one transaction, whenever its checksum
-- differs from the one recorded in schema_functions (see storage/migrate.h). Every
-- definition is CREATE OR REPLACE; a change of a function's arguments or result type
-- needs a DROP FUNCTION IF EXISTS of the old signature above the new definition. The
-- tables and the triggers themselves are in migrations/0004_work_items.sql.
--
-- Work items belong to a top-level session; its sub-agents (single level) read and change
-- them through their own session ids. Status transitions: open, in_progress and blocked
-- may move to any other status; done and cancelled only back to open (reopened).

-- ---- the audit log -------------------------------------------------------------------------

-- engram_audit_write: appends one record to p_session's log and returns its seq. The
-- session's head row stays locked until the transaction ends, so seqs are handed out in
-- commit order: a reader that sees seq n sees every record before it. Runs as the owner
-- (the server's role may only read the log) for the tenant the transaction acts for.
CREATE OR REPLACE FUNCTION engram_audit_write(p_tenant bigint, p_session bigint, p_agent bigint,
                                              p_action text, p_target_type text,
                                              p_target_id bigint, p_detail jsonb)
    RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_seq bigint;
BEGIN
    IF engram_current_tenant() IS NOT NULL AND engram_current_tenant() <> p_tenant THEN
        RAISE EXCEPTION 'audit record for another tenant' USING ERRCODE = 'EG403';
    END IF;
    INSERT INTO session_audit_heads AS h (tenant_id, session_id, last)
        VALUES (p_tenant, p_session, 1)
        ON CONFLICT (tenant_id, session_id) DO UPDATE SET last = h.last + 1
        RETURNING h.last INTO v_seq;
    INSERT INTO session_audit (tenant_id, session_id, seq, at, agent_id, action, target_type,
                               target_id, detail)
        VALUES (p_tenant, p_session, v_seq, engram_session_now(), p_agent, p_action,
                p_target_type, p_target_id, COALESCE(jsonb_strip_nulls(p_detail), '{}'));
    RETURN v_seq;
END $$;

CREATE OR REPLACE FUNCTION engram_audit_json(a session_audit) RETURNS jsonb
    LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'seq', a.seq, 'at', engram_ms(a.at), 'agent_id', engram_session_u64(a.agent_id),
        'action', a.action, 'target_type', a.target_type, 'target_id', a.target_id,
        'detail', a.detail)
$$;

-- engram_session_audit: one page of p_session's log in seq order, after p_cursor (a seq;
-- NULL: from the start) and at or after p_since_ms (NULL: any time). next_cursor is the
-- last seq returned (p_cursor, or 0, when none is): pass it to read on, now or later.
-- more: whether records after the page existed when it was read.
CREATE OR REPLACE FUNCTION engram_session_audit(p_tenant bigint, p_session bigint,
                                                p_since_ms bigint, p_cursor bigint,
                                                p_limit integer)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    s sessions := engram_session_get_row(p_tenant, p_session);
BEGIN
    RETURN (
        WITH page AS (
            SELECT a AS rec, a.seq, row_number() OVER (ORDER BY a.seq) AS rn
            FROM session_audit a
            WHERE a.tenant_id = p_tenant AND a.session_id = s.id
              AND a.seq > COALESCE(p_cursor, 0)
              AND (p_since_ms IS NULL OR engram_ms(a.at) >= p_since_ms)
            ORDER BY a.seq LIMIT p_limit + 1
        )
        SELECT jsonb_build_object(
            'session_id', s.id,
            'records', COALESCE(jsonb_agg(engram_audit_json(p.rec) ORDER BY p.seq)
                                FILTER (WHERE p.rn <= p_limit), '[]'::jsonb),
            'next_cursor', COALESCE(max(p.seq) FILTER (WHERE p.rn <= p_limit), p_cursor, 0),
            'more', COALESCE(max(p.rn) > p_limit, false))
        FROM page p);
END $$;

-- engram_audit_tail: the last p_n significant records of p_session's log, oldest first:
-- every action but append and handoff. p_takeover leaves out what a takeover never hands
-- over (records of current_task notes).
CREATE OR REPLACE FUNCTION engram_audit_tail(p_tenant bigint, p_session bigint, p_n integer,
                                             p_takeover boolean)
    RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT COALESCE(jsonb_agg(engram_audit_json(t) ORDER BY t.seq), '[]'::jsonb) FROM (
        SELECT a.* FROM session_audit a
        WHERE a.tenant_id = p_tenant AND a.session_id = p_session
          AND a.action NOT IN ('append', 'handoff')
          AND NOT (p_takeover AND a.detail ->> 'scope' IS NOT DISTINCT FROM 'current_task')
        ORDER BY a.seq DESC LIMIT p_n) t
$$;

-- ---- the triggers that write it ----------------------------------------------------------
--
-- Each runs in the transaction of the change, after the function that made it took the
-- session's lock. Agents are the session's unless the change names one.

CREATE OR REPLACE FUNCTION engram_audit_session_agent(p_tenant bigint, p_session bigint)
    RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT s.agent_id FROM sessions s WHERE s.tenant_id = p_tenant AND s.id = p_session
$$;

-- A new session: create (a top-level session), create in a sub-agent plus spawn in its
-- parent, or resume (a session made from a checkpoint, which also gets the checkpoint's
-- work items under their ids; a restored sub-agent's parent records a spawn).
CREATE OR REPLACE FUNCTION engram_audit_on_session_insert() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
    v_parent_agent bigint;
BEGIN
    IF NEW.parent_id IS NOT NULL THEN
        v_parent_agent := engram_audit_session_agent(NEW.tenant_id, NEW.parent_id);
    END IF;
    IF NEW.origin_checkpoint_id IS NOT NULL AND NEW.parent_id IS NULL THEN
        INSERT INTO session_work_items (tenant_id, session_id, id, title, description, status,
                                        owner_agent_id, version, created_by, updated_by,
                                        updated_in, origin_checkpoint_id, created_at,
                                        updated_at, status_changed_at)
            SELECT w.tenant_id, NEW.id, w.id, w.title, w.description, w.status,
                   w.owner_agent_id, w.version, w.created_by, w.updated_by, w.updated_in,
                   NEW.origin_checkpoint_id, w.created_at, w.updated_at, w.status_changed_at
            FROM session_checkpoint_work_items w
            WHERE w.tenant_id = NEW.tenant_id AND w.checkpoint_id = NEW.origin_checkpoint_id
            ORDER BY w.id;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        PERFORM engram_audit_write(NEW.tenant_id, NEW.id, NEW.agent_id, 'resume', 'checkpoint',
                                   NEW.origin_checkpoint_id, jsonb_build_object(
                                       'resumed_from', NEW.origin_session_id,
                                       'branch_type', NEW.branch_type,
                                       'position', NEW.base_seq, 'work_items', v_n));
    ELSIF NEW.origin_checkpoint_id IS NOT NULL THEN
        PERFORM engram_audit_write(NEW.tenant_id, NEW.id, NEW.agent_id, 'resume', 'checkpoint',
                                   NEW.origin_checkpoint_id, jsonb_build_object(
                                       'resumed_from', NEW.origin_session_id,
                                       'branch_type', NEW.branch_type,
                                       'position', NEW.base_seq, 'parent_id', NEW.parent_id));
        PERFORM engram_audit_write(NEW.tenant_id, NEW.parent_id, v_parent_agent, 'spawn',
                                   'session', NEW.id, jsonb_build_object(
                                       'agent_id', engram_session_u64(NEW.agent_id),
                                       'resumed_from', NEW.origin_session_id));
    ELSIF NEW.parent_id IS NOT NULL THEN
        PERFORM engram_audit_write(NEW.tenant_id, NEW.id, NEW.agent_id, 'create', 'session',
                                   NEW.id, jsonb_build_object(
                                       'parent_id', NEW.parent_id,
                                       'model', NEW.config ->> 'model'));
        PERFORM engram_audit_write(NEW.tenant_id, NEW.parent_id, v_parent_agent, 'spawn',
                                   'session', NEW.id, jsonb_build_object(
                                       'agent_id', engram_session_u64(NEW.agent_id),
                                       'model', NEW.config ->> 'model',
                                       'return_format', NEW.return_format,
                                       'task_bytes', octet_length(NEW.task)));
    ELSE
        PERFORM engram_audit_write(NEW.tenant_id, NEW.id, NEW.agent_id, 'create', 'session',
                                   NEW.id, jsonb_build_object('model', NEW.config ->> 'model'));
    END IF;
    RETURN NULL;
END $$;

-- A session's scratchpad or state changed: scratchpad_update; end; complete (a sub-agent)
-- plus child_complete in its parent; any other state change is state_change.
CREATE OR REPLACE FUNCTION engram_audit_on_session_update() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.scratchpad_version IS DISTINCT FROM NEW.scratchpad_version THEN
        PERFORM engram_audit_write(NEW.tenant_id, NEW.id, NEW.agent_id, 'scratchpad_update',
                                   'session', NEW.id, jsonb_build_object(
                                       'version', NEW.scratchpad_version,
                                       'token_count', NEW.scratchpad_tokens,
                                       'bytes', octet_length(NEW.scratchpad)));
    END IF;
    IF OLD.state IS DISTINCT FROM NEW.state THEN
        IF NEW.state = 'ended' THEN
            PERFORM engram_audit_write(NEW.tenant_id, NEW.id, NEW.agent_id, 'end', 'session',
                                       NEW.id, jsonb_build_object(
                                           'summary_bytes', octet_length(NEW.summary)));
        ELSIF NEW.state = 'completed' THEN
            PERFORM engram_audit_write(NEW.tenant_id, NEW.id, NEW.agent_id, 'complete',
                                       'session', NEW.id, jsonb_build_object(
                                           'output_bytes', octet_length(NEW.output)));
            IF NEW.parent_id IS NOT NULL THEN
                PERFORM engram_audit_write(
                    NEW.tenant_id, NEW.parent_id,
                    engram_audit_session_agent(NEW.tenant_id, NEW.parent_id), 'child_complete',
                    'session', NEW.id, jsonb_build_object(
                        'agent_id', engram_session_u64(NEW.agent_id),
                        'output_bytes', octet_length(NEW.output)));
            END IF;
        ELSE
            PERFORM engram_audit_write(NEW.tenant_id, NEW.id, NEW.agent_id, 'state_change',
                                       'session', NEW.id,
                                       jsonb_build_object('from', OLD.state, 'to', NEW.state));
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- A transcript entry: append (a message), summarize, tombstone (target: the hidden entry);
-- an entry of another kind is recorded under its kind, except events (session_paused,
-- session_resumed, spawn, sub_agent_completed): the checkpoint, resume, spawn or complete
-- that wrote one has its own record.
CREATE OR REPLACE FUNCTION engram_audit_on_entry() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'message' THEN
        PERFORM engram_audit_write(NEW.tenant_id, NEW.session_id, NEW.agent_id, 'append',
                                   'entry', NEW.id, jsonb_build_object(
                                       'seq', NEW.seq, 'role', NEW.role,
                                       'bytes', octet_length(NEW.content),
                                       'tokens', NEW.tokens, 'cost_usdc', NEW.cost_usdc));
    ELSIF NEW.kind = 'summary' THEN
        PERFORM engram_audit_write(NEW.tenant_id, NEW.session_id, NEW.agent_id, 'summarize',
                                   'entry', NEW.id, jsonb_build_object(
                                       'seq', NEW.seq, 'through_entry_id', NEW.target_id,
                                       'messages_compacted', NEW.messages_compacted,
                                       'bytes', octet_length(NEW.content)));
    ELSIF NEW.kind = 'tombstone' THEN
        PERFORM engram_audit_write(NEW.tenant_id, NEW.session_id, NEW.agent_id, 'tombstone',
                                   'entry', NEW.target_id, jsonb_build_object(
                                       'seq', NEW.seq, 'tombstone_id', NEW.id));
    ELSIF NEW.kind <> 'event' THEN
        PERFORM engram_audit_write(NEW.tenant_id, NEW.session_id, NEW.agent_id, NEW.kind,
                                   'entry', NEW.id, jsonb_build_object('seq', NEW.seq));
    END IF;
    RETURN NULL;
END $$;

-- A note added (its key, never its value).
CREATE OR REPLACE FUNCTION engram_audit_on_note_insert() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM engram_audit_write(NEW.tenant_id, NEW.session_id, NEW.agent_id, 'note_add', 'note',
                               NEW.id, jsonb_build_object(
                                   'category', NEW.category, 'key', NEW.key,
                                   'scope', NEW.scope, 'work_item_id', NEW.work_item_id,
                                   'supersedes', NEW.supersedes));
    RETURN NULL;
END $$;

-- Notes changed by one statement: the notes cleared (session.task.complete) make one
-- task_complete record per session. A supersession is part of the note_add record.
CREATE OR REPLACE FUNCTION engram_audit_on_note_update() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT n.tenant_id, n.session_id, count(*) AS cleared,
                    (array_agg(n.id ORDER BY n.id))[1:100] AS ids,
                    jsonb_agg(DISTINCT n.work_item_id)
                        FILTER (WHERE n.work_item_id IS NOT NULL) AS items
             FROM new_notes n
             JOIN old_notes o ON o.tenant_id = n.tenant_id AND o.id = n.id
             WHERE n.cleared_at IS NOT NULL AND o.cleared_at IS NULL
             GROUP BY n.tenant_id, n.session_id ORDER BY n.tenant_id, n.session_id LOOP
        PERFORM engram_audit_write(r.tenant_id, r.session_id,
                                   engram_audit_session_agent(r.tenant_id, r.session_id),
                                   'task_complete', NULL, NULL, jsonb_build_object(
                                       'cleared', r.cleared, 'note_ids', to_jsonb(r.ids),
                                       'work_item_ids', r.items));
    END LOOP;
    RETURN NULL;
END $$;

-- A checkpoint: its copy of the session's work items, and the record.
CREATE OR REPLACE FUNCTION engram_audit_on_checkpoint() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    INSERT INTO session_checkpoint_work_items (tenant_id, checkpoint_id, id, title, description,
                                               status, owner_agent_id, version, created_by,
                                               updated_by, updated_in, created_at, updated_at,
                                               status_changed_at)
        SELECT w.tenant_id, NEW.id, w.id, w.title, w.description, w.status, w.owner_agent_id,
               w.version, w.created_by, w.updated_by, w.updated_in, w.created_at,
               w.updated_at, w.status_changed_at
        FROM session_work_items w
        WHERE w.tenant_id = NEW.tenant_id AND w.session_id = NEW.session_id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM engram_audit_write(NEW.tenant_id, NEW.session_id,
                               engram_audit_session_agent(NEW.tenant_id, NEW.session_id),
                               'checkpoint', 'checkpoint', NEW.id, jsonb_build_object(
                                   'label', NEW.label, 'position', NEW.position,
                                   'work_items', v_n));
    RETURN NULL;
END $$;

-- A work item added or changed: recorded in the owning session and, when the change came
-- through a sub-agent, in the sub-agent's session too. Copies made by resume are part of
-- its resume record.
CREATE OR REPLACE FUNCTION engram_audit_on_work_item() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    v_action text;
    v_detail jsonb;
    v_changed text[] := '{}';
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.origin_checkpoint_id IS NOT NULL THEN
            RETURN NULL;
        END IF;
        v_action := 'work_item_add';
        v_detail := jsonb_build_object(
            'title', NEW.title, 'status', NEW.status,
            'owner_agent_id', engram_session_u64(NEW.owner_agent_id),
            'description_bytes', octet_length(NEW.description));
    ELSE
        v_action := 'work_item_update';
        IF NEW.title IS DISTINCT FROM OLD.title THEN
            v_changed := v_changed || 'title'::text;
        END IF;
        IF NEW.description IS DISTINCT FROM OLD.description THEN
            v_changed := v_changed || 'description'::text;
        END IF;
        IF NEW.status IS DISTINCT FROM OLD.status THEN
            v_changed := v_changed || 'status'::text;
        END IF;
        IF NEW.owner_agent_id IS DISTINCT FROM OLD.owner_agent_id THEN
            v_changed := v_changed || 'owner_agent_id'::text;
        END IF;
        v_detail := jsonb_build_object(
            'version', NEW.version, 'changed', to_jsonb(v_changed),
            'title', CASE WHEN NEW.title IS DISTINCT FROM OLD.title THEN NEW.title END,
            'status_from', CASE WHEN NEW.status IS DISTINCT FROM OLD.status THEN OLD.status END,
            'status_to', CASE WHEN NEW.status IS DISTINCT FROM OLD.status THEN NEW.status END,
            'owner_from', CASE WHEN NEW.owner_agent_id IS DISTINCT FROM OLD.owner_agent_id
                               THEN engram_session_u64(OLD.owner_agent_id) END,
            'owner_to', CASE WHEN NEW.owner_agent_id IS DISTINCT FROM OLD.owner_agent_id
                             THEN engram_session_u64(NEW.owner_agent_id) END);
    END IF;
    IF NEW.updated_in <> NEW.session_id THEN
        PERFORM engram_audit_write(NEW.tenant_id, NEW.session_id, NEW.updated_by, v_action,
                                   'work_item', NEW.id,
                                   v_detail || jsonb_build_object('via_session_id',
                                                                  NEW.updated_in));
        PERFORM engram_audit_write(NEW.tenant_id, NEW.updated_in, NEW.updated_by, v_action,
                                   'work_item', NEW.id,
                                   v_detail || jsonb_build_object('owner_session_id',
                                                                  NEW.session_id));
    ELSE
        PERFORM engram_audit_write(NEW.tenant_id, NEW.session_id, NEW.updated_by, v_action,
                                   'work_item', NEW.id, v_detail);
    END IF;
    RETURN NULL;
END $$;

-- ---- work items ------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION engram_work_item_json(w session_work_items) RETURNS jsonb
    LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'work_item_id', w.id, 'session_id', w.session_id, 'title', w.title,
        'description', w.description, 'status', w.status,
        'owner_agent_id', engram_session_u64(w.owner_agent_id), 'version', w.version,
        'created_by', engram_session_u64(w.created_by),
        'updated_by', engram_session_u64(w.updated_by),
        'created_at', engram_ms(w.created_at), 'updated_at', engram_ms(w.updated_at),
        'status_changed_at', engram_ms(w.status_changed_at))
$$;

-- Whether a work item may move from status p_from to p_to (the same status: yes).
CREATE OR REPLACE FUNCTION engram_work_item_transition_ok(p_from text, p_to text)
    RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_from = p_to OR p_from IN ('open', 'in_progress', 'blocked')
           OR (p_from IN ('done', 'cancelled') AND p_to = 'open')
$$;

-- engram_work_item_lock: locks p_session (and its parent first) for a change of work
-- items; both must be active (EG409). Returns the locked session; its work items are
-- those of COALESCE(parent_id, id).
CREATE OR REPLACE FUNCTION engram_work_item_lock(p_tenant bigint, p_session bigint)
    RETURNS sessions LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_session_lock(p_tenant, p_session);
    v_state text;
BEGIN
    PERFORM engram_session_require_active(s);
    IF s.parent_id IS NOT NULL THEN
        SELECT state INTO v_state FROM sessions WHERE tenant_id = p_tenant AND id = s.parent_id;
        IF v_state <> 'active' THEN
            RAISE EXCEPTION 'session % owning the work items of sub-agent % is %', s.parent_id,
                            s.id, v_state
                USING ERRCODE = 'EG409';
        END IF;
    END IF;
    RETURN s;
END $$;

-- engram_work_item_require: raises EG404 unless p_item (a note's work_item_id, JSON) is a
-- work item of the session p_root. Used by engram_session_note_add.
CREATE OR REPLACE FUNCTION engram_work_item_require(p_tenant bigint, p_root bigint, p_item jsonb)
    RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    v numeric;
BEGIN
    IF jsonb_typeof(p_item) = 'number' THEN
        v := (p_item)::numeric;
    END IF;
    IF v IS NULL OR v <> trunc(v) OR v < 1 OR v > 9223372036854775807
       OR NOT EXISTS (SELECT 1 FROM session_work_items w
                      WHERE w.tenant_id = p_tenant AND w.session_id = p_root
                        AND w.id = v::bigint) THEN
        RAISE EXCEPTION 'work item % not found in session %', p_item, p_root
            USING ERRCODE = 'EG404';
    END IF;
END $$;

-- engram_work_item_add: a new work item of the session (a sub-agent's: of its parent).
-- p_status: open (NULL), in_progress or blocked. p_owner NULL: the acting agent, which is
-- p_agent or the session's agent. At most p_max_items items per session (EG429).
CREATE OR REPLACE FUNCTION engram_work_item_add(p_tenant bigint, p_session bigint, p_title text,
                                                p_description text, p_status text,
                                                p_owner bigint, p_agent bigint,
                                                p_max_items bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_work_item_lock(p_tenant, p_session);
    v_root bigint := COALESCE(s.parent_id, s.id);
    v_agent bigint := COALESCE(p_agent, s.agent_id);
    v_status text := COALESCE(p_status, 'open');
    v_now timestamptz := engram_session_now();
    v_n bigint;
    w session_work_items;
BEGIN
    IF v_status NOT IN ('open', 'in_progress', 'blocked') THEN
        RAISE EXCEPTION 'a new work item is open, in_progress or blocked, not %', v_status
            USING ERRCODE = 'EG400';
    END IF;
    SELECT count(*) INTO v_n FROM session_work_items
        WHERE tenant_id = p_tenant AND session_id = v_root;
    IF v_n + 1 > p_max_items THEN
        RAISE EXCEPTION 'session % has reached its limit of % work items', v_root, p_max_items
            USING ERRCODE = 'EG429', DETAIL = format('limit=%s usage=%s', p_max_items, v_n);
    END IF;
    INSERT INTO session_work_items (tenant_id, session_id, title, description, status,
                                    owner_agent_id, created_by, updated_by, updated_in,
                                    created_at, updated_at, status_changed_at)
        VALUES (p_tenant, v_root, p_title, NULLIF(p_description, ''), v_status,
                COALESCE(p_owner, v_agent), v_agent, v_agent, s.id, v_now, v_now, v_now)
        RETURNING * INTO w;
    UPDATE sessions SET updated_at = v_now WHERE tenant_id = p_tenant AND id = s.id;
    RETURN engram_work_item_json(w);
END $$;

-- engram_work_item_update: changes the fields given (NULL: unchanged; p_description ''
-- removes the description). p_expected (NULL: any) must be the item's version (EG409), and
-- a status change must be a legal transition (EG409). A call that changes nothing returns
-- the item as it is, with changed false, and records nothing.
CREATE OR REPLACE FUNCTION engram_work_item_update(p_tenant bigint, p_session bigint,
                                                   p_item bigint, p_title text,
                                                   p_description text, p_status text,
                                                   p_owner bigint, p_expected bigint,
                                                   p_agent bigint)
    RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s sessions := engram_work_item_lock(p_tenant, p_session);
    v_root bigint := COALESCE(s.parent_id, s.id);
    v_now timestamptz := engram_session_now();
    w session_work_items;
    v_title text;
    v_desc text;
    v_status text;
    v_owner bigint;
BEGIN
    SELECT * INTO w FROM session_work_items
        WHERE tenant_id = p_tenant AND session_id = v_root AND id = p_item FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'work item % not found in session %', p_item, v_root
            USING ERRCODE = 'EG404';
    END IF;
    IF p_expected IS NOT NULL AND p_expected <> w.version THEN
        RAISE EXCEPTION 'work item % is at version %, not %', w.id, w.version, p_expected
            USING ERRCODE = 'EG409',
                  DETAIL = format('version=%s expected_version=%s', w.version, p_expected);
    END IF;
    v_title := COALESCE(p_title, w.title);
    v_desc := CASE WHEN p_description IS NULL THEN w.description
                   ELSE NULLIF(p_description, '') END;
    v_status := COALESCE(p_status, w.status);
    v_owner := COALESCE(p_owner, w.owner_agent_id);
    IF NOT engram_work_item_transition_ok(w.status, v_status) THEN
        RAISE EXCEPTION 'work item % cannot go from % to %', w.id, w.status, v_status
            USING ERRCODE = 'EG409',
                  DETAIL = format('status=%s requested=%s', w.status, v_status);
    END IF;
    IF v_title = w.title AND v_desc IS NOT DISTINCT FROM w.description
       AND v_status = w.status AND v_owner = w.owner_agent_id THEN
        RETURN engram_work_item_json(w) || jsonb_build_object('changed', false);
    END IF;
    UPDATE session_work_items
        SET title = v_title, description = v_desc, status = v_status, owner_agent_id = v_owner,
            version = version + 1, updated_by = COALESCE(p_agent, s.agent_id),
            updated_in = s.id, updated_at = v_now,
            status_changed_at = CASE WHEN v_status <> w.status THEN v_now
                                     ELSE status_changed_at END
        WHERE tenant_id = p_tenant AND session_id = v_root AND id = w.id
        RETURNING * INTO w;
    UPDATE sessions SET updated_at = v_now WHERE tenant_id = p_tenant AND id = s.id;
    RETURN engram_work_item_json(w) || jsonb_build_object('changed', true);
END $$;

-- engram_work_item_list: the work items of the session (a sub-agent's: of its parent) in
-- id order, filtered (NULL: no filter), p_limit per page; p_cursor is the next_cursor of
-- the previous page (nil on the last page).
CREATE OR REPLACE FUNCTION engram_work_item_list(p_tenant bigint, p_session bigint,
                                                 p_statuses text[], p_owner bigint,
                                                 p_cursor bigint, p_limit integer)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    s sessions := engram_session_get_row(p_tenant, p_session);
    v_root bigint := COALESCE(s.parent_id, s.id);
BEGIN
    RETURN (
        WITH page AS (
            SELECT w AS rec, w.id, row_number() OVER (ORDER BY w.id) AS rn
            FROM session_work_items w
            WHERE w.tenant_id = p_tenant AND w.session_id = v_root
              AND (p_statuses IS NULL OR w.status = ANY (p_statuses))
              AND (p_owner IS NULL OR w.owner_agent_id = p_owner)
              AND (p_cursor IS NULL OR w.id > p_cursor)
            ORDER BY w.id LIMIT p_limit + 1
        )
        SELECT jsonb_build_object(
            'session_id', s.id, 'owner_session_id', v_root,
            'work_items', COALESCE(jsonb_agg(engram_work_item_json(p.rec) ORDER BY p.id)
                                   FILTER (WHERE p.rn <= p_limit), '[]'::jsonb),
            'next_cursor', CASE WHEN max(p.rn) > p_limit
                                THEN max(p.id) FILTER (WHERE p.rn <= p_limit) END)
        FROM page p);
END $$;

-- ---- the handoff package's work item sections -----------------------------------------------

-- engram_work_item_counts: {tasks_done, tasks_remaining (open, in_progress, blocked),
-- tasks_cancelled} of the session p_root.
CREATE OR REPLACE FUNCTION engram_work_item_counts(p_tenant bigint, p_root bigint)
    RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'tasks_done', count(*) FILTER (WHERE w.status = 'done'),
        'tasks_remaining', count(*) FILTER (WHERE w.status IN ('open', 'in_progress',
                                                                'blocked')),
        'tasks_cancelled', count(*) FILTER (WHERE w.status = 'cancelled'))
    FROM session_work_items w WHERE w.tenant_id = p_tenant AND w.session_id = p_root
$$;

-- engram_work_item_handoff: the handoff sections of p_session's work items (those of
-- COALESCE(parent, session)): work_items, the open ones (open, in_progress, blocked) each
-- with the live notes of p_session that point at it (no current_task notes for a
-- takeover), and tasks_done, the done ones, most recently finished last (at most 100).
CREATE OR REPLACE FUNCTION engram_work_item_handoff(p_tenant bigint, s sessions, p_takeover boolean)
    RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'work_items', COALESCE((
            SELECT jsonb_agg(engram_work_item_json(w) || jsonb_build_object('notes', COALESCE((
                       SELECT jsonb_agg(engram_session_note_json(n) ORDER BY n.id)
                       FROM session_notes n
                       WHERE n.tenant_id = p_tenant AND n.session_id = s.id
                         AND n.dead_rev IS NULL AND n.work_item_id = to_jsonb(w.id)
                         AND NOT (p_takeover AND n.scope = 'current_task')), '[]'::jsonb))
                   ORDER BY w.id)
            FROM session_work_items w
            WHERE w.tenant_id = p_tenant AND w.session_id = COALESCE(s.parent_id, s.id)
              AND w.status IN ('open', 'in_progress', 'blocked')), '[]'::jsonb),
        'tasks_done', COALESCE((
            SELECT jsonb_agg(jsonb_build_object(
                       'work_item_id', d.id, 'title', d.title,
                       'owner_agent_id', engram_session_u64(d.owner_agent_id),
                       'done_at', engram_ms(d.status_changed_at))
                   ORDER BY d.status_changed_at, d.id)
            FROM (SELECT * FROM session_work_items w
                  WHERE w.tenant_id = p_tenant AND w.session_id = COALESCE(s.parent_id, s.id)
                    AND w.status = 'done'
                  ORDER BY w.status_changed_at DESC, w.id DESC LIMIT 100) d), '[]'::jsonb))
$$;
