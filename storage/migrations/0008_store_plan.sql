-- 0008_store_plan: a store's cost no longer grows with the tenant's size.
--
-- engram_memory_store_batch read its new rows back with
--   unnest(v_ids) o JOIN memories m ON m.tenant_id = p_tenant AND m.id = o.id
-- and PostgreSQL, estimating one row for a tenant its statistics had not seen yet, planned
-- that as a scan of every memory of the tenant with the id as a join filter: a store into
-- a tenant of 17,000 memories read 1,077 pages and took 8 ms instead of 0.1. The rows now
-- come back from the INSERT itself (RETURNING), and the idempotency record takes its
-- creation times from the same expression the INSERT used (now() is fixed for the
-- transaction). Replays look each memory up by its primary key (a scalar subquery per id,
-- which is always an index lookup on both key columns).
--
-- The tenant row is also written once per store instead of three times: it is locked and
-- read with SELECT ... FOR UPDATE, then the change number and the memory count move in one
-- UPDATE. Same signature and results as 0007.

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
    UPDATE tenants SET change_seq = change_seq + n, memory_count = memory_count + n
        WHERE tenants.id = p_tenant RETURNING change_seq INTO v_last;
    v_base := v_last - n;
    SELECT array_agg(nextval('memory_id_seq')) INTO v_ids FROM generate_series(1, n);
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

-- Its statements take parameters, so PostgreSQL planned most of them again on every call
-- (custom plans): about a quarter of a store's database time. Their generic plans are the
-- same index lookups and inserts.
ALTER FUNCTION engram_memory_store_batch(bigint, bigint[], text, bytea, integer, bigint[],
    bigint[], text[], text[], text[], double precision[], text[], bytea, bigint[], bigint[],
    bigint[], bigint[], bigint[], boolean[])
    SET plan_cache_mode = force_generic_plan;

-- engram_ms was declared IMMUTABLE over a STABLE body (extract of epoch from timestamptz is
-- STABLE in PostgreSQL), which keeps PostgreSQL from inlining it: every call, in every
-- query that reports a time, ran its body as a separate SQL function, parsed again once
-- per statement. Declared STABLE it is inlined into the calling query.
CREATE OR REPLACE FUNCTION engram_ms(t timestamptz) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT (extract(epoch FROM t) * 1000)::bigint $$;
