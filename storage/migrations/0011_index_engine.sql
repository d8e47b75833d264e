-- 0011_index_engine: each tenant may choose the engine of its index's approximate tier.
--
-- tenants.index_engine is 'native' (the index's own codes) or 'faiss' (a FAISS index), or
-- NULL: the tenant follows the index_engine setting of the server that loads its index. The
-- engine is a property of the in-memory index only (filters, deletes and the exact re-rank
-- are the same either way), so a change needs no data migration: every engramd is told
-- (engram_admin 'engine:<tenant>:<native|faiss|default>'), drops the tenant's loaded index
-- and builds it again with the new engine on its next use.

ALTER TABLE tenants ADD COLUMN index_engine text CHECK (index_engine IN ('native', 'faiss'));

-- The shape of a tenant as admin calls return it, now with the tenant's own choice of
-- engine (JSON null: none; the server turns it into the engine in force, see
-- engram_tenant_engine).
CREATE OR REPLACE FUNCTION engram_tenant_json(t tenants) RETURNS jsonb
    LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'tenant_id', t.id, 'name', t.name, 'tier', t.tier,
        'embedding', jsonb_build_object('provider', t.embed_provider, 'model', t.embed_model,
                                        'dim', t.embed_dim),
        'index_engine', t.index_engine,
        'memories', t.memory_count, 'created_at', engram_ms(t.created_at),
        'updated_at', engram_ms(t.updated_at),
        'keys', (SELECT count(*) FROM api_keys k WHERE k.tenant_id = t.id AND k.revoked_at IS NULL))
$$;

-- A tenant's JSON with the engine in force on the calling server: 'index_engine' is the
-- tenant's choice or, when it has none, p_default (the server's setting), and
-- 'index_engine_default' tells which.
CREATE FUNCTION engram_tenant_engine(j jsonb, p_default text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT j || jsonb_build_object('index_engine', COALESCE(j ->> 'index_engine', p_default),
                                   'index_engine_default', j ->> 'index_engine' IS NULL)
$$;

-- The same for an array of tenants, in order.
CREATE FUNCTION engram_tenants_engine(j jsonb, p_default text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE(jsonb_agg(engram_tenant_engine(e, p_default) ORDER BY o), '[]')
    FROM jsonb_array_elements(j) WITH ORDINALITY AS x (e, o)
$$;

DROP FUNCTION engram_admin_tenant_create(text, text, text, text, integer, text, text, bytea);

-- p_engine: 'native', 'faiss', or NULL (the server's setting).
CREATE FUNCTION engram_admin_tenant_create(p_name text, p_tier text, p_provider text,
                                           p_model text, p_dim integer, p_key_name text,
                                           p_key_id text, p_key_hash bytea, p_engine text)
    RETURNS TABLE (tenant_id bigint, key_row bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO tenants (name, tier, embed_provider, embed_model, embed_dim, index_engine)
        VALUES (p_name, p_tier, p_provider, p_model, p_dim, p_engine) RETURNING id INTO tenant_id;
    INSERT INTO api_keys (tenant_id, name, key_id, key_hash)
        VALUES (tenant_id, p_key_name, p_key_id, p_key_hash) RETURNING id INTO key_row;
    RETURN NEXT;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'a tenant named ''%'' already exists', p_name USING ERRCODE = 'EG410';
END $$;

DROP FUNCTION engram_admin_tenant_update(bigint, text, text, text);

-- p_engine: NULL leaves the engine as it is, 'default' clears the tenant's choice (it
-- follows the server's setting again), 'native' or 'faiss' sets it. Every update naming an
-- engine is announced, changed or not: a server that holds the index with another engine
-- drops it, one that already uses that engine does nothing.
CREATE FUNCTION engram_admin_tenant_update(p_id bigint, p_name text, p_new_name text,
                                           p_tier text, p_engine text) RETURNS jsonb
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    t tenants := engram_admin_find(p_id, p_name);
BEGIN
    UPDATE tenants SET name = COALESCE(p_new_name, name), tier = COALESCE(p_tier, tier),
                       index_engine = CASE WHEN p_engine IS NULL THEN index_engine
                                           WHEN p_engine = 'default' THEN NULL
                                           ELSE p_engine END,
                       updated_at = date_trunc('milliseconds', now())
    WHERE id = t.id RETURNING * INTO t;
    PERFORM pg_notify('engram_admin', 'tier:' || t.id || ':' || t.tier);
    IF p_engine IS NOT NULL THEN
        PERFORM pg_notify('engram_admin',
                          'engine:' || t.id || ':' || COALESCE(t.index_engine, 'default'));
    END IF;
    RETURN engram_tenant_json(t);
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'a tenant named ''%'' already exists', p_new_name USING ERRCODE = 'EG410';
END $$;

REVOKE EXECUTE ON FUNCTION engram_admin_tenant_create(text, text, text, text, integer, text,
                                                      text, bytea, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION engram_admin_tenant_update(bigint, text, text, text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION engram_admin_tenant_create(text, text, text, text, integer, text,
                                                     text, bytea, text) TO engram_app;
GRANT EXECUTE ON FUNCTION engram_admin_tenant_update(bigint, text, text, text, text)
    TO engram_app;
GRANT EXECUTE ON FUNCTION engram_tenant_engine(jsonb, text) TO engram_app;
GRANT EXECUTE ON FUNCTION engram_tenants_engine(jsonb, text) TO engram_app;
