-- 0012_tenant_ids: a tenant's ids are numbered by the tenant alone.
--
-- Memory, session, transcript entry, note, checkpoint, scratchpad snapshot and
-- consolidation run ids came from
-- server-wide sequences, so the gap between two ids a tenant received told it how much every
-- other tenant had written meanwhile. Each tenant now numbers its own: consecutive stores
-- of one tenant get consecutive ids whatever the other tenants do.
--
-- Memories: tenants.memory_id_last, moved in the UPDATE of the tenant row that every store
-- already makes under the tenant row's lock (no extra lock, no extra write). Session
-- objects and consolidation runs: one counter row per tenant and kind in tenant_counters, taken by a BEFORE INSERT
-- trigger, so a session write does not wait for the tenant row (a store holds it).
--
-- Existing data keeps its ids: clients hold them (in their own stores, in citations, in
-- handoff packages), and renumbering would silently point those at other memories. Every
-- existing tenant's counters start at the server-wide sequence's last value, so no id ever
-- handed out, including those of deleted rows that idempotency records and change logs may
-- still name, is handed out again in the same tenant. A tenant created from now on starts
-- at 1.

ALTER TABLE tenants ADD COLUMN memory_id_last bigint NOT NULL DEFAULT 0;

CREATE TABLE tenant_counters (
    tenant_id bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    kind      text NOT NULL CHECK (kind IN ('session', 'session_entry', 'session_note',
                                            'session_snap', 'session_checkpoint',
                                            'consolidation_run')),
    last      bigint NOT NULL,
    PRIMARY KEY (tenant_id, kind)
);
ALTER TABLE tenant_counters ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON tenant_counters USING (tenant_id = engram_current_tenant());

-- engram_seq_last: the last value a sequence handed out (0 if none).
CREATE FUNCTION engram_seq_last(p_seq regclass) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT s.last_value FROM pg_sequences s
                     WHERE format('%I.%I', s.schemaname, s.sequencename)::regclass = p_seq),
                    0)
$$;

UPDATE tenants SET memory_id_last = engram_seq_last('memory_id_seq');
INSERT INTO tenant_counters (tenant_id, kind, last)
    SELECT t.id, k.kind, engram_seq_last(k.seq)
    FROM tenants t
    CROSS JOIN (VALUES ('session', 'session_id_seq'::regclass),
                       ('session_entry', 'session_entry_id_seq'::regclass),
                       ('session_note', 'session_note_id_seq'::regclass),
                       ('session_snap', 'session_snap_id_seq'::regclass),
                       ('session_checkpoint', 'session_checkpoint_id_seq'::regclass),
                       ('consolidation_run', 'consolidation_runs_id_seq'::regclass))
               AS k (kind, seq);

-- engram_next_id: the tenant's next id of the kind. The counter row stays locked until the
-- transaction ends, so the ids of one tenant and kind are handed out in commit order.
CREATE FUNCTION engram_next_id(p_tenant bigint, p_kind text) RETURNS bigint
    LANGUAGE sql AS $$
    INSERT INTO tenant_counters AS c (tenant_id, kind, last) VALUES (p_tenant, p_kind, 1)
        ON CONFLICT (tenant_id, kind) DO UPDATE SET last = c.last + 1
        RETURNING c.last
$$;

-- engram_assign_id: BEFORE INSERT trigger of the session tables: an id not given is the
-- tenant's next of the kind named by the trigger's argument.
CREATE FUNCTION engram_assign_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS NULL THEN
        NEW.id := engram_next_id(NEW.tenant_id, TG_ARGV[0]);
    END IF;
    RETURN NEW;
END $$;

ALTER TABLE memories ALTER COLUMN id DROP DEFAULT;
ALTER TABLE sessions ALTER COLUMN id DROP DEFAULT;
ALTER TABLE session_entries ALTER COLUMN id DROP DEFAULT;
ALTER TABLE session_notes ALTER COLUMN id DROP DEFAULT;
ALTER TABLE session_scratchpad_snaps ALTER COLUMN id DROP DEFAULT;
ALTER TABLE session_checkpoints ALTER COLUMN id DROP DEFAULT;
ALTER TABLE consolidation_runs ALTER COLUMN id DROP DEFAULT;
CREATE TRIGGER sessions_id BEFORE INSERT ON sessions
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session');
CREATE TRIGGER session_entries_id BEFORE INSERT ON session_entries
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session_entry');
CREATE TRIGGER session_notes_id BEFORE INSERT ON session_notes
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session_note');
CREATE TRIGGER session_scratchpad_snaps_id BEFORE INSERT ON session_scratchpad_snaps
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session_snap');
CREATE TRIGGER session_checkpoints_id BEFORE INSERT ON session_checkpoints
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session_checkpoint');
CREATE TRIGGER consolidation_runs_id BEFORE INSERT ON consolidation_runs
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('consolidation_run');

-- A store takes its ids from the tenant row it already locks and updates. Otherwise the
-- same as 0008.
CREATE OR REPLACE FUNCTION engram_memory_store_batch(
        p_tenant bigint, p_limits bigint[], p_idem text, p_fingerprint bytea, p_dim integer,
        p_agent bigint[], p_clade bigint[], p_scope text[], p_type text[], p_content text[],
        p_importance double precision[], p_metadata text[], p_embeddings bytea,
        p_created_ms bigint[], p_updated_ms bigint[], p_accessed_ms bigint[],
        p_access_count bigint[], p_expires_ms bigint[], p_pinned boolean[])
    RETURNS TABLE (idx integer, replay boolean, r_created_ms bigint, m_id bigint, m_seq bigint,
                   m_agent_id bigint, m_clade_id bigint, m_scope text, m_type text,
                   m_importance double precision, m_created_ms bigint, m_accessed_ms bigint,
                   m_access_count bigint, m_expires_ms bigint, m_archived_ms bigint,
                   m_pinned boolean, m_tags text)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n integer := cardinality(p_content);
    v_last bigint;
    v_base bigint;
    v_count bigint;
    v_tier text;
    v_max bigint;
    v_ids bigint[];
    v_id_last bigint;
    k record;
BEGIN
    -- the tenant row's lock, before anything else
    SELECT t.change_seq, t.memory_count, t.tier INTO v_last, v_count, v_tier
        FROM tenants t WHERE t.id = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant not found' USING ERRCODE = 'EG404';
    END IF;
    IF p_idem IS NOT NULL THEN
        SELECT * INTO k FROM idempotency_keys i WHERE i.tenant_id = p_tenant AND i.key = p_idem;
        IF FOUND THEN
            IF k.fingerprint <> p_fingerprint THEN
                RAISE EXCEPTION 'idempotency_key was used before for a different request'
                    USING ERRCODE = 'EG409';
            END IF;
            RETURN QUERY
                SELECT o.i::integer, true, k.created_ms[o.i], mm.*
                FROM unnest(k.ids) WITH ORDINALITY AS o (id, i)
                CROSS JOIN LATERAL engram_meta_of(
                    (SELECT m FROM memories m WHERE m.tenant_id = p_tenant AND m.id = o.id))
                    AS mm
                ORDER BY o.i;
            RETURN;
        END IF;
    END IF;
    IF length(p_embeddings) <> n * p_dim * 4 THEN
        RAISE EXCEPTION 'embeddings do not match the dimension' USING ERRCODE = 'EG400';
    END IF;
    v_max := engram_tier_limit(p_limits, v_tier);
    IF v_max IS NOT NULL AND v_count + n > v_max THEN
        RAISE EXCEPTION 'memory limit reached'
            USING ERRCODE = 'EG429',
                  DETAIL = format('limit=%s usage=%s requested=%s', v_max, v_count, n);
    END IF;
    UPDATE tenants SET change_seq = change_seq + n, memory_count = memory_count + n,
                       memory_id_last = memory_id_last + n
        WHERE tenants.id = p_tenant RETURNING change_seq, memory_id_last INTO v_last, v_id_last;
    v_base := v_last - n;
    SELECT array_agg(v_id_last - n + g) INTO v_ids FROM generate_series(1, n) AS g;
    -- tags NULL: the server derives them from the request (see 0007)
    RETURN QUERY
        WITH ins AS (
            INSERT INTO memories (tenant_id, id, agent_id, clade_id, scope, type, content,
                                  importance, metadata, embedding, created_at, updated_at,
                                  last_accessed_at, access_count, expires_at, pinned, seq)
                SELECT p_tenant, v_ids[a.i], a.agent, a.clade, a.scope, a.type, a.content, a.imp,
                       a.md::jsonb,
                       substring(p_embeddings FROM ((a.i - 1) * p_dim * 4 + 1)::integer
                                 FOR p_dim * 4),
                       date_trunc('milliseconds', COALESCE(engram_ts(a.cr), now())),
                       date_trunc('milliseconds', COALESCE(engram_ts(a.up), engram_ts(a.cr), now())),
                       date_trunc('milliseconds', engram_ts(a.acc)),
                       COALESCE(a.cnt, 0), engram_ts(a.ex), COALESCE(a.pin, false),
                       v_base + a.i
                FROM unnest(p_agent, p_clade, p_scope, p_type, p_content, p_importance,
                            p_metadata, p_created_ms, p_updated_ms, p_accessed_ms,
                            p_access_count, p_expires_ms, p_pinned)
                     WITH ORDINALITY AS a (agent, clade, scope, type, content, imp, md, cr, up,
                                           acc, cnt, ex, pin, i)
                RETURNING *)
        SELECT (m.seq - v_base)::integer, false, engram_ms(m.created_at), m.id, m.seq,
               m.agent_id, m.clade_id, m.scope, m.type, m.importance, engram_ms(m.created_at),
               engram_ms(m.last_accessed_at), m.access_count, engram_ms(m.expires_at),
               engram_ms(m.archived_at), m.pinned, NULL::text
        FROM ins m
        ORDER BY m.seq;
    INSERT INTO memory_changes
        SELECT p_tenant, v_base + o.i, o.id, 'u' FROM unnest(v_ids) WITH ORDINALITY AS o (id, i);
    IF p_idem IS NOT NULL THEN
        INSERT INTO idempotency_keys (tenant_id, key, fingerprint, ids, created_ms)
            SELECT p_tenant, p_idem, p_fingerprint, v_ids,
                   array_agg(engram_ms(date_trunc('milliseconds', COALESCE(engram_ts(c.cr), now())))
                             ORDER BY c.i)
            FROM unnest(p_created_ms) WITH ORDINALITY AS c (cr, i);
    END IF;
    PERFORM pg_notify('engram_changes', p_tenant || ':' || v_last);
END $$;

ALTER FUNCTION engram_memory_store_batch(bigint, bigint[], text, bytea, integer, bigint[],
    bigint[], text[], text[], text[], double precision[], text[], bytea, bigint[], bigint[],
    bigint[], bigint[], bigint[], boolean[])
    SET plan_cache_mode = force_generic_plan;

-- The note's id now comes from the tenant's counter. Otherwise the same as 0003.
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


DROP FUNCTION engram_seq_last(regclass);
DROP SEQUENCE memory_id_seq, session_id_seq, session_entry_id_seq, session_note_id_seq,
              session_snap_id_seq, session_checkpoint_id_seq, consolidation_runs_id_seq;
