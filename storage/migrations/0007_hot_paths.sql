-- 0007_hot_paths: cheaper writes on the paths every request takes.
--
-- 1. Access counts land in a narrow table first.
--
-- Every memory a search returns counts as an access. Writing each batch straight into
-- memories rewrote a wide row (and its index entries) per memory read: at a few thousand
-- searches a second that cost PostgreSQL most of a core. Batches now add to
-- memory_access (tenant, id, pending count, latest access), a small upsert, and the
-- maintenance task folds the pending counts into memories every maintenance interval.
-- Readers that report access counts add the pending ones (see SQL_MEMROW_COLS and the
-- index loaders); composite importance computed inside PostgreSQL (memory.list's
-- min_importance, consolidation's re-scoring) lags by at most one fold.
--
-- No foreign key to memories: it would make a batch wait for a delete holding the row.
-- Counts of deleted memories are dropped by the next fold.

CREATE TABLE memory_access (
    tenant_id         bigint NOT NULL,
    id                bigint NOT NULL,
    access_count      bigint NOT NULL,
    last_accessed_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
ALTER TABLE memory_access ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON memory_access USING (tenant_id = engram_current_tenant());

-- engram_memory_touch adds a batch of access counts (the server's, about once a second per
-- worker). Rows are taken in (tenant, id) order, so concurrent batches cannot deadlock.
-- Returns the number of entries.
DROP FUNCTION IF EXISTS engram_memory_touch(bigint[], bigint[], bigint[], bigint[]);
CREATE FUNCTION engram_memory_touch(p_tenant bigint[], p_ids bigint[], p_counts bigint[],
                                    p_at_ms bigint[])
    RETURNS bigint
    LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH t AS (
        INSERT INTO memory_access AS a (tenant_id, id, access_count, last_accessed_at)
        SELECT u.tenant, u.id, u.cnt, date_trunc('milliseconds', engram_ts(u.at))
          FROM unnest(p_tenant, p_ids, p_counts, p_at_ms) AS u (tenant, id, cnt, at)
         ORDER BY u.tenant, u.id
        ON CONFLICT (tenant_id, id) DO UPDATE SET
            access_count = a.access_count + excluded.access_count,
            last_accessed_at = greatest(a.last_accessed_at, excluded.last_accessed_at)
        RETURNING 1)
    SELECT count(*) FROM t
$$;
REVOKE ALL ON FUNCTION engram_memory_touch(bigint[], bigint[], bigint[], bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION engram_memory_touch(bigint[], bigint[], bigint[], bigint[])
    TO engram_app;

-- engram_access_fold moves up to p_limit pending counts into memories and returns how many
-- it moved. Entries a batch is writing at that moment stay for the next fold.
CREATE FUNCTION engram_access_fold(p_limit integer) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH picked AS (
        SELECT tenant_id, id FROM memory_access
         ORDER BY tenant_id, id LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM memory_access a USING picked p
         WHERE a.tenant_id = p.tenant_id AND a.id = p.id
        RETURNING a.tenant_id, a.id, a.access_count, a.last_accessed_at
    ), folded AS (
        UPDATE memories m SET
            access_count = m.access_count + g.access_count,
            last_accessed_at = greatest(m.last_accessed_at, g.last_accessed_at)
          FROM gone g
         WHERE m.tenant_id = g.tenant_id AND m.id = g.id
        RETURNING 1)
    SELECT (SELECT count(*) FROM gone) + 0 * (SELECT count(*) FROM folded)
$$;
REVOKE ALL ON FUNCTION engram_access_fold(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION engram_access_fold(integer) TO engram_app;

-- 2. The per-memory helpers every write returns through were SQL functions that cannot be
-- inlined (subqueries, a composite result), so PostgreSQL parsed and planned their bodies
-- on every call: about a third of a store's database time. As PL/pgSQL functions their
-- plans are cached per connection.
CREATE OR REPLACE FUNCTION engram_tags(md jsonb) RETURNS text[]
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN ARRAY(
        SELECT 't:' || x FROM jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(md -> 'tokens') = 'array' THEN md -> 'tokens' ELSE '[]' END) x
        UNION ALL
        SELECT 'c:' || x FROM jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(md -> 'chains') = 'array' THEN md -> 'chains' ELSE '[]' END) x
        UNION ALL
        SELECT 'p:' || x FROM jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(md -> 'protocols') = 'array' THEN md -> 'protocols' ELSE '[]' END) x
        UNION ALL
        SELECT 's:' || (md ->> 'strategy_id') WHERE md ? 'strategy_id');
END $$;

CREATE OR REPLACE FUNCTION engram_meta_of(m memories) RETURNS engram_memory_meta
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ROW(m.id, m.seq, m.agent_id, m.clade_id, m.scope, m.type, m.importance,
               engram_ms(m.created_at), engram_ms(m.last_accessed_at), m.access_count,
               engram_ms(m.expires_at), engram_ms(m.archived_at), m.pinned,
               array_to_string(engram_tags(m.metadata), chr(31)))::engram_memory_meta;
END $$;

-- 3. A store returns each new memory's index metadata without its tags (NULL), which the
-- server derives from the request's metadata as it does for filters; replays still return
-- them from the row. As in 0004 otherwise.
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
    v_count bigint;
    v_tier text;
    v_max bigint;
    v_ids bigint[];
    k record;
BEGIN
    v_last := engram_next_seq(p_tenant, 0);  -- the tenant row's lock, before anything else
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
                LEFT JOIN memories m ON m.tenant_id = p_tenant AND m.id = o.id
                CROSS JOIN LATERAL engram_meta_of(m) AS mm
                ORDER BY o.i;
            RETURN;
        END IF;
    END IF;
    IF length(p_embeddings) <> n * p_dim * 4 THEN
        RAISE EXCEPTION 'embeddings do not match the dimension' USING ERRCODE = 'EG400';
    END IF;
    SELECT t.memory_count, t.tier INTO v_count, v_tier FROM tenants t WHERE t.id = p_tenant;
    v_max := engram_tier_limit(p_limits, v_tier);
    IF v_max IS NOT NULL AND v_count + n > v_max THEN
        RAISE EXCEPTION 'memory limit reached'
            USING ERRCODE = 'EG429',
                  DETAIL = format('limit=%s usage=%s requested=%s', v_max, v_count, n);
    END IF;
    v_last := engram_next_seq(p_tenant, n);
    UPDATE tenants SET memory_count = memory_count + n WHERE tenants.id = p_tenant;
    SELECT array_agg(nextval('memory_id_seq')) INTO v_ids FROM generate_series(1, n);
    INSERT INTO memories (tenant_id, id, agent_id, clade_id, scope, type, content, importance,
                          metadata, embedding, created_at, updated_at, last_accessed_at,
                          access_count, expires_at, pinned, seq)
        SELECT p_tenant, v_ids[a.i], a.agent, a.clade, a.scope, a.type, a.content, a.imp,
               a.md::jsonb,
               substring(p_embeddings FROM ((a.i - 1) * p_dim * 4 + 1)::integer FOR p_dim * 4),
               date_trunc('milliseconds', COALESCE(engram_ts(a.cr), now())),
               date_trunc('milliseconds', COALESCE(engram_ts(a.up), engram_ts(a.cr), now())),
               date_trunc('milliseconds', engram_ts(a.acc)),
               COALESCE(a.cnt, 0), engram_ts(a.ex), COALESCE(a.pin, false),
               v_last - n + a.i
        FROM unnest(p_agent, p_clade, p_scope, p_type, p_content, p_importance, p_metadata,
                    p_created_ms, p_updated_ms, p_accessed_ms, p_access_count, p_expires_ms,
                    p_pinned)
             WITH ORDINALITY AS a (agent, clade, scope, type, content, imp, md, cr, up, acc, cnt,
                                   ex, pin, i);
    INSERT INTO memory_changes
        SELECT p_tenant, v_last - n + o.i, o.id, 'u' FROM unnest(v_ids) WITH ORDINALITY AS o (id, i);
    IF p_idem IS NOT NULL THEN
        INSERT INTO idempotency_keys (tenant_id, key, fingerprint, ids, created_ms)
            SELECT p_tenant, p_idem, p_fingerprint, v_ids,
                   array_agg(engram_ms(m.created_at) ORDER BY o.i)
            FROM unnest(v_ids) WITH ORDINALITY AS o (id, i)
            JOIN memories m ON m.tenant_id = p_tenant AND m.id = o.id;
    END IF;
    PERFORM pg_notify('engram_changes', p_tenant || ':' || v_last);
    -- tags NULL: the server derives them from the request (engram_tags per row was the
    -- most expensive part of a store)
    RETURN QUERY
        SELECT o.i::integer, false, engram_ms(m.created_at), m.id, m.seq, m.agent_id,
               m.clade_id, m.scope, m.type, m.importance, engram_ms(m.created_at),
               engram_ms(m.last_accessed_at), m.access_count, engram_ms(m.expires_at),
               engram_ms(m.archived_at), m.pinned, NULL::text
        FROM unnest(v_ids) WITH ORDINALITY AS o (id, i)
        JOIN memories m ON m.tenant_id = p_tenant AND m.id = o.id
        ORDER BY o.i;
END $$;

-- 4. Embeddings are float32 noise to a compressor: stored out of line without trying.
ALTER TABLE memories ALTER COLUMN embedding SET STORAGE EXTERNAL;
