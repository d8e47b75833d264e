-- 0001_init: tenants, API keys, memories and the per-tenant change log.
--
-- Conventions: every tenant-owned table carries tenant_id and is keyed by it first.
-- Timestamps are timestamptz truncated to milliseconds (the wire unit). Unsigned 64-bit
-- identities from clients (agent_id, clade_id) are stored in bigint as the same 64 bits.
-- tenants.change_seq numbers every change to a tenant's memories without gaps and in
-- commit order (it is bumped under the tenant row's lock), which is what lets vector
-- indexes follow the database exactly: see memory_changes.

CREATE TABLE tenants (
    id              bigserial PRIMARY KEY,
    name            text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 128),
    tier            text NOT NULL CHECK (tier IN ('free', 'standard', 'premium')),
    embed_provider  text NOT NULL DEFAULT 'builtin',
    embed_model     text NOT NULL DEFAULT '',
    embed_dim       integer NOT NULL CHECK (embed_dim BETWEEN 1 AND 4096),
    change_seq      bigint NOT NULL DEFAULT 0,
    memory_count    bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT date_trunc('milliseconds', now()),
    updated_at      timestamptz NOT NULL DEFAULT date_trunc('milliseconds', now())
);

CREATE TABLE api_keys (
    id            bigserial PRIMARY KEY,
    tenant_id     bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name          text NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    key_id        text NOT NULL UNIQUE,      -- the public part of the key, for lookup
    key_hash      bytea NOT NULL,            -- HMAC-SHA-256 of the whole key, server secret
    created_at    timestamptz NOT NULL DEFAULT date_trunc('milliseconds', now()),
    last_used_at  timestamptz,
    revoked_at    timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE SEQUENCE memory_id_seq;

CREATE TABLE memories (
    tenant_id         bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id                bigint NOT NULL DEFAULT nextval('memory_id_seq'),
    agent_id          bigint NOT NULL DEFAULT 0,
    clade_id          bigint NOT NULL DEFAULT 0,
    scope             text NOT NULL DEFAULT 'agent' CHECK (scope IN ('agent', 'clade', 'tenant')),
    type              text NOT NULL CHECK (type IN ('fact', 'preference', 'episode',
                                                    'strategy_outcome', 'constraint')),
    content           text NOT NULL,
    importance        double precision NOT NULL CHECK (importance >= 0 AND importance <= 1),
    metadata          jsonb NOT NULL DEFAULT '{}',
    embedding         bytea NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    last_accessed_at  timestamptz,
    access_count      bigint NOT NULL DEFAULT 0,
    expires_at        timestamptz,
    archived_at       timestamptz,
    version           integer NOT NULL DEFAULT 1,
    seq               bigint NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX memories_tenant_created ON memories (tenant_id, created_at, id);

-- One row per change to a tenant's memories, numbered by tenants.change_seq. Indexes
-- replay it after a snapshot, and other engramd processes follow it (NOTIFY
-- engram_changes, payload "tenant:seq").
CREATE TABLE memory_changes (
    tenant_id  bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    seq        bigint NOT NULL,
    memory_id  bigint NOT NULL,
    op         "char" NOT NULL CHECK (op IN ('u', 'd')),
    PRIMARY KEY (tenant_id, seq)
);

CREATE FUNCTION engram_ms(t timestamptz) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT (extract(epoch FROM t) * 1000)::bigint $$;

CREATE FUNCTION engram_ts(ms bigint) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT to_timestamp(ms / 1000.0) $$;

-- engram_next_seq: takes the tenant row's lock, reserves n change numbers and returns the
-- last one. Raises EG404 when the tenant does not exist. Callers run it first in their
-- transaction so changes commit in the order of their numbers.
CREATE FUNCTION engram_next_seq(p_tenant bigint, n bigint) RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    s bigint;
BEGIN
    UPDATE tenants SET change_seq = change_seq + n WHERE id = p_tenant RETURNING change_seq INTO s;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant not found' USING ERRCODE = 'EG404';
    END IF;
    RETURN s;
END $$;

-- engram_memory_store: one memory, committed with its change record. p_max_memories is the
-- tenant's limit (NULL: unlimited); the count is checked under the tenant row's lock, so
-- concurrent writers can never pass it. Raises EG429 with DETAIL 'limit=N usage=M'.
CREATE FUNCTION engram_memory_store(
        p_tenant bigint, p_agent bigint, p_clade bigint, p_scope text, p_type text,
        p_content text, p_importance double precision, p_metadata jsonb, p_embedding bytea,
        p_created_ms bigint, p_expires_ms bigint, p_max_memories bigint)
    RETURNS TABLE (id bigint, created_ms bigint, seq bigint)
    LANGUAGE plpgsql AS $$
DECLARE
    v_seq bigint;
    v_count bigint;
    v_id bigint;
    v_created timestamptz;
BEGIN
    v_seq := engram_next_seq(p_tenant, 1);
    SELECT t.memory_count INTO v_count FROM tenants t WHERE t.id = p_tenant;
    IF p_max_memories IS NOT NULL AND v_count + 1 > p_max_memories THEN
        RAISE EXCEPTION 'memory limit reached'
            USING ERRCODE = 'EG429', DETAIL = format('limit=%s usage=%s', p_max_memories, v_count);
    END IF;
    UPDATE tenants SET memory_count = memory_count + 1 WHERE tenants.id = p_tenant;
    v_created := date_trunc('milliseconds', COALESCE(engram_ts(p_created_ms), now()));
    INSERT INTO memories AS m (tenant_id, agent_id, clade_id, scope, type, content, importance,
                               metadata, embedding, created_at, updated_at, expires_at, seq)
        VALUES (p_tenant, p_agent, p_clade, p_scope, p_type, p_content, p_importance,
                COALESCE(p_metadata, '{}'), p_embedding, v_created,
                date_trunc('milliseconds', now()), engram_ts(p_expires_ms), v_seq)
        RETURNING m.id INTO v_id;
    INSERT INTO memory_changes VALUES (p_tenant, v_seq, v_id, 'u');
    PERFORM pg_notify('engram_changes', p_tenant || ':' || v_seq);
    id := v_id;
    created_ms := engram_ms(v_created);
    seq := v_seq;
    RETURN NEXT;
END $$;

-- engram_memory_delete: deletes the tenant's memories among p_ids; returns each deleted id
-- with its change number. Ids that do not exist (or belong to another tenant) are skipped.
CREATE FUNCTION engram_memory_delete(p_tenant bigint, p_ids bigint[])
    RETURNS TABLE (id bigint, seq bigint)
    LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    v_n bigint;
    v_last bigint;
BEGIN
    PERFORM engram_next_seq(p_tenant, 0);  -- take the tenant row's lock first
    WITH d AS (
        DELETE FROM memories m WHERE m.tenant_id = p_tenant AND m.id = ANY (p_ids)
        RETURNING m.id
    )
    SELECT array_agg(d.id ORDER BY d.id) INTO v_ids FROM d;
    v_n := COALESCE(cardinality(v_ids), 0);
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_last := engram_next_seq(p_tenant, v_n);
    UPDATE tenants SET memory_count = memory_count - v_n WHERE tenants.id = p_tenant;
    INSERT INTO memory_changes
        SELECT p_tenant, v_last - v_n + o.n, o.id, 'd' FROM unnest(v_ids) WITH ORDINALITY AS o (id, n);
    PERFORM pg_notify('engram_changes', p_tenant || ':' || v_last);
    RETURN QUERY SELECT o.id, v_last - v_n + o.n FROM unnest(v_ids) WITH ORDINALITY AS o (id, n);
END $$;
