-- 0002_memory_api: the full memory record (visibility, pinning, archive, supersession),
-- versions, idempotency keys, full-text search, batch writes, updates, access counts.

CREATE EXTENSION IF NOT EXISTS btree_gin;

ALTER TABLE memories
    ADD COLUMN pinned          boolean NOT NULL DEFAULT false,
    ADD COLUMN archived_reason text,
    ADD COLUMN superseded_by   bigint,
    ADD COLUMN merged_into     bigint,
    ADD COLUMN content_tsv     tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED;

-- full-text search within a tenant, metadata containment within a tenant, expiry purge
CREATE INDEX memories_fts ON memories USING gin (tenant_id, content_tsv);
CREATE INDEX memories_metadata ON memories USING gin (tenant_id, metadata jsonb_path_ops);
CREATE INDEX memories_expiry ON memories (expires_at) WHERE expires_at IS NOT NULL;

-- Earlier states of a memory, one row per change that replaced it (an update, an archive,
-- a restore, a merge or a supersession). The live row is the newest version.
CREATE TABLE memory_versions (
    tenant_id   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    memory_id   bigint NOT NULL,
    version     integer NOT NULL,
    content     text NOT NULL,
    type        text NOT NULL,
    importance  double precision NOT NULL,
    metadata    jsonb NOT NULL,
    expires_at  timestamptz,
    archived_at timestamptz,
    valid_from  timestamptz NOT NULL,  -- when this version became current
    replaced_at timestamptz NOT NULL,  -- when the next one replaced it
    change      text NOT NULL,         -- what replaced it: update, archive, restore, merge, supersede
    detail      jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant_id, memory_id, version),
    FOREIGN KEY (tenant_id, memory_id) REFERENCES memories (tenant_id, id) ON DELETE CASCADE
);

-- A retried write with the same key returns what the first one returned.
CREATE TABLE idempotency_keys (
    tenant_id    bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key          text NOT NULL,
    fingerprint  bytea NOT NULL,   -- hash of the request, so a reused key with other data is refused
    ids          bigint[] NOT NULL,
    created_ms   bigint[] NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);

-- The typed metadata fields as tags: what indexes filter on in memory. One definition,
-- used by loaders; the server derives the same strings from requests.
CREATE FUNCTION engram_tags(md jsonb) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY(
        SELECT 't:' || x FROM jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(md -> 'tokens') = 'array' THEN md -> 'tokens' ELSE '[]' END) x
        UNION ALL
        SELECT 'c:' || x FROM jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(md -> 'chains') = 'array' THEN md -> 'chains' ELSE '[]' END) x
        UNION ALL
        SELECT 'p:' || x FROM jsonb_array_elements_text(
            CASE WHEN jsonb_typeof(md -> 'protocols') = 'array' THEN md -> 'protocols' ELSE '[]' END) x
        UNION ALL
        SELECT 's:' || (md ->> 'strategy_id') WHERE md ? 'strategy_id')
$$;

-- The composite importance as the server computes it (weights passed in).
CREATE FUNCTION engram_composite(created timestamptz, access_count bigint,
                                 importance double precision, as_of timestamptz,
                                 w_recency double precision, w_access double precision,
                                 w_explicit double precision, recency_days double precision,
                                 saturation double precision) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT w_recency * exp(-greatest(extract(epoch FROM as_of - created), 0) / 86400.0 / recency_days)
         + w_access * least(access_count / saturation, 1.0)
         + w_explicit * importance
$$;

-- The state of a memory that an index needs, as every change function returns it (the
-- columns memrow_meta_parse reads). Tags are joined by U+001F, which tags cannot contain.
CREATE TYPE engram_memory_meta AS (
    m_id bigint, m_seq bigint, m_agent_id bigint, m_clade_id bigint, m_scope text,
    m_type text, m_importance double precision, m_created_ms bigint, m_accessed_ms bigint,
    m_access_count bigint, m_expires_ms bigint, m_archived_ms bigint, m_pinned boolean,
    m_tags text);

CREATE FUNCTION engram_meta_of(m memories) RETURNS engram_memory_meta
    LANGUAGE sql STABLE AS $$
    SELECT ROW(m.id, m.seq, m.agent_id, m.clade_id, m.scope, m.type, m.importance,
               engram_ms(m.created_at), engram_ms(m.last_accessed_at), m.access_count,
               engram_ms(m.expires_at), engram_ms(m.archived_at), m.pinned,
               array_to_string(engram_tags(m.metadata), chr(31)))::engram_memory_meta
$$;

DROP FUNCTION engram_memory_store(bigint, bigint, bigint, text, text, text, double precision,
                                  jsonb, bytea, bigint, bigint, bigint);

-- engram_memory_store_batch: stores n memories in one transaction, all or nothing. Arrays
-- are parallel (one element per memory); p_embeddings holds the n vectors back to back
-- (p_dim float32 each). p_max_memories (NULL: unlimited) is checked under the tenant
-- row's lock. With p_idem set, a retry returns the first call's ids and stores nothing;
-- the same key with a different p_fingerprint is EG409. Returns one row per memory, in
-- order; replay is true when the rows come from an earlier call.
CREATE FUNCTION engram_memory_store_batch(
        p_tenant bigint, p_max_memories bigint, p_idem text, p_fingerprint bytea, p_dim integer,
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
    SELECT t.memory_count INTO v_count FROM tenants t WHERE t.id = p_tenant;
    IF p_max_memories IS NOT NULL AND v_count + n > p_max_memories THEN
        RAISE EXCEPTION 'memory limit reached'
            USING ERRCODE = 'EG429',
                  DETAIL = format('limit=%s usage=%s requested=%s', p_max_memories, v_count, n);
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
    RETURN QUERY
        SELECT o.i::integer, false, engram_ms(m.created_at), mm.*
        FROM unnest(v_ids) WITH ORDINALITY AS o (id, i)
        JOIN memories m ON m.tenant_id = p_tenant AND m.id = o.id
        CROSS JOIN LATERAL engram_meta_of(m) AS mm
        ORDER BY o.i;
END $$;

-- Records the current state of memory m as a version replaced by `change`.
CREATE FUNCTION engram_keep_version(m memories, p_change text, p_detail jsonb) RETURNS void
    LANGUAGE sql AS $$
    INSERT INTO memory_versions (tenant_id, memory_id, version, content, type, importance,
                                 metadata, expires_at, archived_at, valid_from, replaced_at,
                                 change, detail)
        VALUES (m.tenant_id, m.id, m.version, m.content, m.type, m.importance, m.metadata,
                m.expires_at, m.archived_at, m.updated_at, date_trunc('milliseconds', now()),
                p_change, COALESCE(p_detail, '{}'))
$$;

-- engram_memory_update: changes the given fields of one memory (NULL: unchanged), keeping
-- the previous version. p_clear_expiry removes an expiry. Raises EG404 when the memory does
-- not exist for this tenant.
CREATE FUNCTION engram_memory_update(
        p_tenant bigint, p_id bigint, p_content text, p_type text, p_importance double precision,
        p_metadata text, p_embedding bytea, p_expires_ms bigint, p_clear_expiry boolean,
        p_pinned boolean)
    RETURNS TABLE (r_version integer, r_updated_ms bigint, m_id bigint, m_seq bigint,
                   m_agent_id bigint, m_clade_id bigint, m_scope text, m_type text,
                   m_importance double precision, m_created_ms bigint, m_accessed_ms bigint,
                   m_access_count bigint, m_expires_ms bigint, m_archived_ms bigint,
                   m_pinned boolean, m_tags text)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    m memories;
    v_seq bigint;
BEGIN
    PERFORM engram_next_seq(p_tenant, 0);
    SELECT * INTO m FROM memories WHERE tenant_id = p_tenant AND id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'memory % not found', p_id USING ERRCODE = 'EG404';
    END IF;
    PERFORM engram_keep_version(m, 'update', '{}');
    v_seq := engram_next_seq(p_tenant, 1);
    UPDATE memories SET
        content = COALESCE(p_content, content),
        type = COALESCE(p_type, type),
        importance = COALESCE(p_importance, importance),
        metadata = COALESCE(p_metadata::jsonb, metadata),
        embedding = COALESCE(p_embedding, embedding),
        expires_at = CASE WHEN p_clear_expiry THEN NULL
                          ELSE COALESCE(engram_ts(p_expires_ms), expires_at) END,
        pinned = COALESCE(p_pinned, pinned),
        updated_at = date_trunc('milliseconds', now()),
        version = version + 1,
        seq = v_seq
    WHERE tenant_id = p_tenant AND id = p_id
    RETURNING * INTO m;
    INSERT INTO memory_changes VALUES (p_tenant, v_seq, p_id, 'u');
    PERFORM pg_notify('engram_changes', p_tenant || ':' || v_seq);
    RETURN QUERY SELECT m.version, engram_ms(m.updated_at), mm.* FROM engram_meta_of(m) AS mm;
END $$;

-- engram_memory_set_archived: archives (p_archive) or restores the tenant's memories among
-- p_ids, keeping versions; ids already in that state or missing are skipped. Returns the
-- changed memories' new state.
CREATE FUNCTION engram_memory_set_archived(p_tenant bigint, p_ids bigint[], p_archive boolean,
                                           p_reason text)
    RETURNS SETOF engram_memory_meta
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    m memories;
    v_seq bigint;
BEGIN
    PERFORM engram_next_seq(p_tenant, 0);
    FOR m IN SELECT * FROM memories
             WHERE tenant_id = p_tenant AND id = ANY (p_ids)
               AND (archived_at IS NULL) = p_archive
             ORDER BY id FOR UPDATE LOOP
        PERFORM engram_keep_version(m, CASE WHEN p_archive THEN 'archive' ELSE 'restore' END,
                                    jsonb_build_object('reason', p_reason));
        v_seq := engram_next_seq(p_tenant, 1);
        UPDATE memories SET
            archived_at = CASE WHEN p_archive THEN date_trunc('milliseconds', now()) END,
            archived_reason = CASE WHEN p_archive THEN p_reason END,
            superseded_by = CASE WHEN p_archive THEN superseded_by END,
            merged_into = CASE WHEN p_archive THEN merged_into END,
            updated_at = date_trunc('milliseconds', now()),
            version = version + 1,
            seq = v_seq
        WHERE tenant_id = p_tenant AND id = m.id
        RETURNING * INTO m;
        INSERT INTO memory_changes VALUES (p_tenant, v_seq, m.id, 'u');
        RETURN NEXT engram_meta_of(m);
    END LOOP;
    IF v_seq IS NOT NULL THEN
        PERFORM pg_notify('engram_changes', p_tenant || ':' || v_seq);
    END IF;
END $$;

-- engram_memory_touch: adds access counts (batched by the server) without a change
-- number: reads are not changes to index structure.
CREATE FUNCTION engram_memory_touch(p_tenant bigint[], p_ids bigint[], p_counts bigint[],
                                    p_at_ms bigint[]) RETURNS bigint
    LANGUAGE sql AS $$
    WITH t AS (
        UPDATE memories m SET
            access_count = m.access_count + u.cnt,
            last_accessed_at = greatest(m.last_accessed_at,
                                        date_trunc('milliseconds', engram_ts(u.at)))
        FROM unnest(p_tenant, p_ids, p_counts, p_at_ms) AS u (tenant, id, cnt, at)
        WHERE m.tenant_id = u.tenant AND m.id = u.id
        RETURNING 1)
    SELECT count(*) FROM t
$$;

-- engram_purge_expired: deletes up to p_limit expired memories (with change records, so
-- indexes drop them) and idempotency keys older than p_idem_age_s. Returns the number of
-- memories deleted.
CREATE FUNCTION engram_purge_expired(p_limit integer, p_idem_age_s integer) RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    t bigint;
    total bigint := 0;
    v_ids bigint[];
BEGIN
    DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => p_idem_age_s);
    FOR t IN SELECT DISTINCT tenant_id FROM memories
             WHERE expires_at IS NOT NULL AND expires_at <= now() LOOP
        SELECT array_agg(id) INTO v_ids FROM (
            SELECT id FROM memories
            WHERE tenant_id = t AND expires_at IS NOT NULL AND expires_at <= now()
            ORDER BY id LIMIT p_limit - total) s;
        IF v_ids IS NOT NULL THEN
            total := total + (SELECT count(*) FROM engram_memory_delete(t, v_ids));
        END IF;
        EXIT WHEN total >= p_limit;
    END LOOP;
    RETURN total;
END $$;
