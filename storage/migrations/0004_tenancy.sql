-- 0004_tenancy: the server's own database role, row-level security on every tenant-owned
-- table, tier quotas enforced in the database, key administration, tenant deletion.
--
-- The server connects with the configured DSN (whose user owns the schema and runs these
-- migrations) and then switches to engram_app (SET ROLE, setting pg_role), a role that owns
-- no table and bypasses no policy. Every tenant request sets engram.tenant_id in its
-- transaction; the policies below then show it that tenant's rows only. The few operations
-- that must cross tenants (authentication, administration, maintenance, batched access
-- counts) are SECURITY DEFINER functions with a fixed search_path.

DO $$
BEGIN
    CREATE ROLE engram_app NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- one role serves every database of the cluster
END $$;

DO $$
BEGIN
    EXECUTE format('GRANT engram_app TO %I', current_user);
EXCEPTION WHEN duplicate_object OR insufficient_privilege THEN
    NULL;  -- already granted, or the DSN's user is a superuser that needs no grant
END $$;

CREATE FUNCTION engram_current_tenant() RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT NULLIF(current_setting('engram.tenant_id', true), '')::bigint $$;

-- Queries counted per tenant and UTC day.
CREATE TABLE tenant_usage (
    tenant_id  bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    day        date NOT NULL,
    queries    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day)
);

ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
ALTER TABLE api_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE memories ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_changes ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_versions ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_usage ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON tenants USING (id = engram_current_tenant());
CREATE POLICY tenant_rows ON api_keys USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON memories USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON memory_changes USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON memory_versions USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON idempotency_keys USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON tenant_usage USING (tenant_id = engram_current_tenant());

GRANT USAGE ON SCHEMA public TO engram_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO engram_app;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO engram_app;
REVOKE ALL ON schema_migrations FROM engram_app;
ALTER DEFAULT PRIVILEGES GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO engram_app;
ALTER DEFAULT PRIVILEGES GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO engram_app;

-- The limit of a tier from an array of the three (free, standard, premium); 0: unlimited.
CREATE FUNCTION engram_tier_limit(p_limits bigint[], p_tier text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NULLIF(p_limits[CASE p_tier WHEN 'free' THEN 1 WHEN 'standard' THEN 2 ELSE 3 END], 0)
$$;

-- ---- memory quota: the tier is read under the tenant row's lock --------------------------

DROP FUNCTION engram_memory_store_batch(bigint, bigint, text, bytea, integer, bigint[],
    bigint[], text[], text[], text[], double precision[], text[], bytea, bigint[], bigint[],
    bigint[], bigint[], bigint[], boolean[]);

-- engram_memory_store_batch: as in 0002, but the memory limit comes from p_limits (the three
-- tiers' limits, 0 unlimited) and the tenant's tier as it is now, read under the lock, so a
-- tier change applies to the very next write. Raises EG429 'limit=N usage=M requested=K'.
CREATE FUNCTION engram_memory_store_batch(
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
    RETURN QUERY
        SELECT o.i::integer, false, engram_ms(m.created_at), mm.*
        FROM unnest(v_ids) WITH ORDINALITY AS o (id, i)
        JOIN memories m ON m.tenant_id = p_tenant AND m.id = o.id
        CROSS JOIN LATERAL engram_meta_of(m) AS mm
        ORDER BY o.i;
END $$;

-- ---- the daily query quota -----------------------------------------------------------

-- engram_query_admit: counts one query of the tenant for today (UTC) if its tier's daily
-- limit allows it. The counter row's lock serializes concurrent admissions, from any number
-- of engramd processes, so exactly the limit is admitted. Returns (admitted, count after,
-- limit or NULL, start of the next UTC day in ms).
CREATE FUNCTION engram_query_admit(p_tenant bigint, p_limits bigint[])
    RETURNS TABLE (admitted boolean, used bigint, lim bigint, resets_ms bigint)
    LANGUAGE plpgsql AS $$
DECLARE
    v_day date := (now() AT TIME ZONE 'UTC')::date;
    v_lim bigint;
    v_used bigint;
BEGIN
    SELECT engram_tier_limit(p_limits, t.tier) INTO v_lim FROM tenants t WHERE t.id = p_tenant;
    resets_ms := engram_ms(((v_day + 1)::timestamp) AT TIME ZONE 'UTC');
    lim := v_lim;
    INSERT INTO tenant_usage AS u (tenant_id, day, queries) VALUES (p_tenant, v_day, 1)
        ON CONFLICT (tenant_id, day) DO UPDATE SET queries = u.queries + 1
        WHERE v_lim IS NULL OR u.queries < v_lim
        RETURNING u.queries INTO v_used;
    IF v_used IS NULL THEN
        admitted := false;
        SELECT u.queries INTO used FROM tenant_usage u WHERE u.tenant_id = p_tenant AND u.day = v_day;
    ELSE
        admitted := true;
        used := v_used;
    END IF;
    RETURN NEXT;
END $$;

-- engram_query_count: adds counted queries of tenants whose tier has no daily limit (the
-- server batches them: they need no admission).
CREATE FUNCTION engram_query_count(p_tenants bigint[], p_counts bigint[]) RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    INSERT INTO tenant_usage AS u (tenant_id, day, queries)
        SELECT c.tenant, (now() AT TIME ZONE 'UTC')::date, c.n
        FROM unnest(p_tenants, p_counts) AS c (tenant, n)
        WHERE EXISTS (SELECT 1 FROM tenants t WHERE t.id = c.tenant)
    ON CONFLICT (tenant_id, day) DO UPDATE SET queries = u.queries + EXCLUDED.queries
$$;

-- engram_tenant_usage: what tenant.usage reports (run with the tenant set).
CREATE FUNCTION engram_tenant_usage(p_tenant bigint)
    RETURNS TABLE (tier text, memories bigint, queries_today bigint, storage_bytes bigint,
                   resets_ms bigint)
    LANGUAGE sql STABLE AS $$
    SELECT t.tier, t.memory_count,
           COALESCE((SELECT u.queries FROM tenant_usage u WHERE u.tenant_id = t.id
                     AND u.day = (now() AT TIME ZONE 'UTC')::date), 0),
           COALESCE((SELECT sum(pg_column_size(m.*)) FROM memories m WHERE m.tenant_id = t.id), 0)
           + COALESCE((SELECT sum(pg_column_size(e.*)) FROM session_entries e
                       WHERE e.tenant_id = t.id), 0),
           engram_ms((((now() AT TIME ZONE 'UTC')::date + 1)::timestamp) AT TIME ZONE 'UTC')
    FROM tenants t WHERE t.id = p_tenant
$$;

-- ---- cross-tenant operations, as the schema owner ---------------------------------------

-- Authentication: the key row for a public key id (revoked keys are not found).
CREATE FUNCTION engram_auth_lookup(p_key_id text)
    RETURNS TABLE (key_id bigint, tenant_id bigint, key_hash bytea, tier text, name text,
                   embed_dim integer, embed_provider text)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT k.id, k.tenant_id, k.key_hash, t.tier, t.name, t.embed_dim, t.embed_provider
    FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
    WHERE k.key_id = p_key_id AND k.revoked_at IS NULL
$$;

-- Marks a key as used now (at authentication).
CREATE FUNCTION engram_key_touch(p_key bigint) RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    UPDATE api_keys SET last_used_at = date_trunc('milliseconds', now()) WHERE id = p_key
$$;

-- Which of these key rows still authenticate (exist and are not revoked).
CREATE FUNCTION engram_keys_valid(p_keys bigint[]) RETURNS SETOF bigint
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT k.id FROM api_keys k WHERE k.id = ANY (p_keys) AND k.revoked_at IS NULL
$$;

-- Every tenant's current tier (so long-lived connections learn of tier changes).
CREATE FUNCTION engram_tenant_tiers(p_tenants bigint[])
    RETURNS TABLE (tenant_id bigint, tier text)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT t.id, t.tier FROM tenants t WHERE t.id = ANY (p_tenants)
$$;

-- Every tenant, for the index preload.
CREATE FUNCTION engram_tenant_dims() RETURNS TABLE (tenant_id bigint, embed_dim integer)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT t.id, t.embed_dim FROM tenants t ORDER BY t.id
$$;

ALTER FUNCTION engram_memory_touch(bigint[], bigint[], bigint[], bigint[])
    SECURITY DEFINER SET search_path FROM CURRENT;
ALTER FUNCTION engram_purge_expired(integer, integer) SECURITY DEFINER SET search_path FROM CURRENT;

-- The shape of a tenant as admin calls return it.
CREATE FUNCTION engram_tenant_json(t tenants) RETURNS jsonb
    LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'tenant_id', t.id, 'name', t.name, 'tier', t.tier,
        'embedding', jsonb_build_object('provider', t.embed_provider, 'model', t.embed_model,
                                        'dim', t.embed_dim),
        'memories', t.memory_count, 'created_at', engram_ms(t.created_at),
        'updated_at', engram_ms(t.updated_at),
        'keys', (SELECT count(*) FROM api_keys k WHERE k.tenant_id = t.id AND k.revoked_at IS NULL))
$$;

-- Administration. Every function raises EG404 for a tenant or key that does not exist and
-- EG410 for a name already taken.
CREATE FUNCTION engram_admin_tenant_create(p_name text, p_tier text, p_provider text,
                                           p_model text, p_dim integer, p_key_name text,
                                           p_key_id text, p_key_hash bytea)
    RETURNS TABLE (tenant_id bigint, key_row bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO tenants (name, tier, embed_provider, embed_model, embed_dim)
        VALUES (p_name, p_tier, p_provider, p_model, p_dim) RETURNING id INTO tenant_id;
    INSERT INTO api_keys (tenant_id, name, key_id, key_hash)
        VALUES (tenant_id, p_key_name, p_key_id, p_key_hash) RETURNING id INTO key_row;
    RETURN NEXT;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'a tenant named ''%'' already exists', p_name USING ERRCODE = 'EG410';
END $$;

-- Finds a tenant by id or (when p_id is NULL) by name.
CREATE FUNCTION engram_admin_find(p_id bigint, p_name text) RETURNS tenants
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    t tenants;
BEGIN
    SELECT * INTO t FROM tenants WHERE (p_id IS NOT NULL AND id = p_id)
                                    OR (p_id IS NULL AND name = p_name);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant % not found', COALESCE(p_id::text, quote_literal(p_name))
            USING ERRCODE = 'EG404';
    END IF;
    RETURN t;
END $$;

CREATE FUNCTION engram_admin_tenant_get(p_id bigint, p_name text) RETURNS jsonb
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT engram_tenant_json(engram_admin_find(p_id, p_name))
$$;

-- Tenants in id order after p_after, at most p_limit, as one JSON document.
CREATE FUNCTION engram_admin_tenant_list(p_after bigint, p_limit integer) RETURNS jsonb
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT COALESCE(jsonb_agg(engram_tenant_json(t) ORDER BY t.id), '[]')
    FROM (SELECT * FROM tenants WHERE id > COALESCE(p_after, 0) ORDER BY id LIMIT p_limit) t
$$;

CREATE FUNCTION engram_admin_tenant_update(p_id bigint, p_name text, p_new_name text,
                                           p_tier text) RETURNS jsonb
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    t tenants := engram_admin_find(p_id, p_name);
BEGIN
    UPDATE tenants SET name = COALESCE(p_new_name, name), tier = COALESCE(p_tier, tier),
                       updated_at = date_trunc('milliseconds', now())
    WHERE id = t.id RETURNING * INTO t;
    PERFORM pg_notify('engram_admin', 'tier:' || t.id || ':' || t.tier);
    RETURN engram_tenant_json(t);
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'a tenant named ''%'' already exists', p_new_name USING ERRCODE = 'EG410';
END $$;

-- Deletes the tenant and, by cascade, every row it owns, in one transaction.
CREATE FUNCTION engram_admin_tenant_delete(p_id bigint, p_name text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    t tenants := engram_admin_find(p_id, p_name);
BEGIN
    DELETE FROM tenants WHERE id = t.id;
    PERFORM pg_notify('engram_admin', 'deleted:' || t.id);
    RETURN t.id;
END $$;

CREATE FUNCTION engram_admin_key_create(p_id bigint, p_name text, p_key_name text,
                                        p_key_id text, p_key_hash bytea)
    RETURNS TABLE (tenant_id bigint, key_row bigint, created_ms bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    t tenants := engram_admin_find(p_id, p_name);
BEGIN
    tenant_id := t.id;
    INSERT INTO api_keys (tenant_id, name, key_id, key_hash)
        VALUES (t.id, p_key_name, p_key_id, p_key_hash)
        RETURNING id, engram_ms(created_at) INTO key_row, created_ms;
    RETURN NEXT;
END $$;

CREATE FUNCTION engram_admin_key_list(p_id bigint, p_name text) RETURNS jsonb
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT COALESCE(jsonb_agg(jsonb_build_object(
               'key_id', k.id, 'name', k.name, 'prefix', 'egk_' || k.key_id,
               'created_at', engram_ms(k.created_at), 'last_used_at', engram_ms(k.last_used_at),
               'revoked_at', engram_ms(k.revoked_at)) ORDER BY k.id), '[]')
    FROM api_keys k WHERE k.tenant_id = (engram_admin_find(p_id, p_name)).id
$$;

-- Revokes a key (by its row id). Raises EG404 when it does not exist or is revoked already.
CREATE FUNCTION engram_admin_key_revoke(p_key bigint) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_tenant bigint;
BEGIN
    UPDATE api_keys SET revoked_at = date_trunc('milliseconds', now())
    WHERE id = p_key AND revoked_at IS NULL RETURNING tenant_id INTO v_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'key % not found (or already revoked)', p_key USING ERRCODE = 'EG404';
    END IF;
    PERFORM pg_notify('engram_admin', 'revoked:' || p_key);
    RETURN v_tenant;
END $$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO engram_app;
ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO engram_app;
