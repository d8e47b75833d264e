-- storage/functions/40_tenancy.sql: Tenants, API keys, tiers and quotas, and the per-tenant id
-- counters.
--
-- Repeatable: engramd applies this file whole, in one transaction, whenever its checksum
-- differs from the one recorded in schema_functions (see storage/migrate.h). Every
-- definition is CREATE OR REPLACE; a change of a function's arguments or result type
-- needs a DROP FUNCTION IF EXISTS of the old signature above the new definition.

-- The limit of a tier from an array of the three (free, standard, premium); 0: unlimited.
CREATE OR REPLACE FUNCTION engram_tier_limit(p_limits bigint[], p_tier text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NULLIF(p_limits[CASE p_tier WHEN 'free' THEN 1 WHEN 'standard' THEN 2 ELSE 3 END], 0)
$$;

-- engram_tier_byte_limit: the tier's limit of memory bytes (tenants.memory_bytes, migration
-- 0009), carried by the same literal after the memory counts: {free, standard, premium,
-- free bytes, standard bytes, premium bytes}; NULL when unlimited or not given (a server of
-- the previous release sends three limits).
CREATE OR REPLACE FUNCTION engram_tier_byte_limit(p_limits bigint[], p_tier text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NULLIF(p_limits[CASE p_tier WHEN 'free' THEN 4 WHEN 'standard' THEN 5 ELSE 6 END], 0)
$$;

-- engram_query_admit: counts one query of the tenant for today (UTC) if its tier's daily
-- limit allows it. No longer called (engram_query_reserve below admits from blocks); kept
-- while engramd processes of the previous release may still share the database during a
-- rolling upgrade (they ignore the blocks others hold, so the limit is exact again once all
-- run this release). The counter row's lock serializes concurrent admissions, from any number
-- of engramd processes, so exactly the limit is admitted. Returns (admitted, count after,
-- limit or NULL, start of the next UTC day in ms).
CREATE OR REPLACE FUNCTION engram_query_admit(p_tenant bigint, p_limits bigint[])
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

-- engram_query_reserve: one holder's (an engramd worker's) report and next block of the
-- tenant's queries for today (UTC). The holder used p_used of the block it held and returns
-- the rest; it asks for p_want more (0: only the report). Granted only while the day's used
-- queries plus every holder's block stay within the tier's limit (p_limits), under the lock
-- of the day's counter row, so holders in any number of processes never admit more than the
-- limit. A block whose lease ran out (its holder gone without returning it) counts as used:
-- what its holder admitted is unknown, and counting it used can only refuse, never over-
-- admit. A report of a block that expired so is ignored (counted already). Returns (granted,
-- used: the queries reported used today, lim or NULL, resets_ms, others: what other holders
-- hold now). Run with the tenant set.
CREATE OR REPLACE FUNCTION engram_query_reserve(p_tenant bigint, p_limits bigint[], p_holder text,
                                                p_used bigint, p_want bigint, p_lease_ms integer)
    RETURNS TABLE (granted bigint, used bigint, lim bigint, resets_ms bigint, others bigint)
    LANGUAGE plpgsql AS $$
DECLARE
    v_day date := (now() AT TIME ZONE 'UTC')::date;
    v_lim bigint;
    v_used bigint;
    v_held bigint;
    v_gone bigint;
    v_others bigint;
    v_grant bigint;
BEGIN
    SELECT engram_tier_limit(p_limits, t.tier) INTO v_lim FROM tenants t WHERE t.id = p_tenant;
    -- the day's counter row, locked until the end of the transaction
    INSERT INTO tenant_usage AS u (tenant_id, day, queries) VALUES (p_tenant, v_day, 0)
        ON CONFLICT (tenant_id, day) DO UPDATE SET queries = u.queries
        RETURNING u.queries INTO v_used;
    WITH gone AS (
        DELETE FROM tenant_query_blocks b
         WHERE b.tenant_id = p_tenant AND b.day <= v_day AND b.holder <> p_holder
           AND b.expires_at < now()
        RETURNING b.day, b.held)
    SELECT COALESCE(sum(g.held) FILTER (WHERE g.day = v_day), 0) INTO v_gone FROM gone g;
    DELETE FROM tenant_query_blocks b
     WHERE b.tenant_id = p_tenant AND b.day = v_day AND b.holder = p_holder
    RETURNING b.held INTO v_held;
    v_used := v_used + v_gone + least(greatest(p_used, 0), COALESCE(v_held, 0));
    SELECT COALESCE(sum(b.held), 0) INTO v_others FROM tenant_query_blocks b
     WHERE b.tenant_id = p_tenant AND b.day = v_day;
    v_grant := greatest(p_want, 0);
    IF v_lim IS NOT NULL THEN
        v_grant := greatest(least(v_grant, v_lim - v_used - v_others), 0);
    END IF;
    UPDATE tenant_usage u SET queries = v_used WHERE u.tenant_id = p_tenant AND u.day = v_day;
    IF v_grant > 0 THEN
        INSERT INTO tenant_query_blocks (tenant_id, day, holder, held, expires_at)
            VALUES (p_tenant, v_day, p_holder, v_grant,
                    now() + make_interval(secs => p_lease_ms / 1000.0));
    END IF;
    granted := v_grant;
    used := v_used;
    lim := v_lim;
    resets_ms := engram_ms(((v_day + 1)::timestamp) AT TIME ZONE 'UTC');
    others := v_others;
    RETURN NEXT;
END $$;

-- engram_query_count: adds counted queries of tenants whose tier has no daily limit (the
-- server batches them: they need no admission).
CREATE OR REPLACE FUNCTION engram_query_count(p_tenants bigint[], p_counts bigint[]) RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    INSERT INTO tenant_usage AS u (tenant_id, day, queries)
        SELECT c.tenant, (now() AT TIME ZONE 'UTC')::date, c.n
        FROM unnest(p_tenants, p_counts) AS c (tenant, n)
        WHERE EXISTS (SELECT 1 FROM tenants t WHERE t.id = c.tenant)
    ON CONFLICT (tenant_id, day) DO UPDATE SET queries = u.queries + EXCLUDED.queries
$$;

-- engram_tenant_usage: what tenant.usage reports (run with the tenant set). memories: the
-- live ones, which count against the tier's limit (tenants.memory_count); archived: the
-- archived ones (kept, restorable, not counted against it); memory_bytes: the text of all of
-- them and their kept versions, which counts against the tier's byte limit; model_*: the
-- chat model's calls, tokens and cost of the UTC day (the tier's daily token cap counts
-- tokens in and out); chat_model: the tenant's override of the server's model (NULL: none);
-- name: the tenant's name.
DROP FUNCTION IF EXISTS engram_tenant_usage(bigint);
CREATE OR REPLACE FUNCTION engram_tenant_usage(p_tenant bigint)
    RETURNS TABLE (tier text, memories bigint, queries_today bigint, storage_bytes bigint,
                   resets_ms bigint, archived bigint, sessions_live bigint, memory_bytes bigint,
                   model_calls bigint, model_tokens_in bigint, model_tokens_out bigint,
                   model_cost_usd double precision, chat_model text, name text)
    LANGUAGE sql STABLE AS $$
    SELECT t.tier, t.memory_count,
           COALESCE(u.queries, 0),
           COALESCE((SELECT sum(pg_column_size(m.*)) FROM memories m WHERE m.tenant_id = t.id), 0)
           + COALESCE((SELECT sum(pg_column_size(e.*)) FROM session_entries e
                       WHERE e.tenant_id = t.id), 0),
           engram_ms((((now() AT TIME ZONE 'UTC')::date + 1)::timestamp) AT TIME ZONE 'UTC'),
           (SELECT count(*) FROM memories m WHERE m.tenant_id = t.id AND m.archived_at IS NOT NULL),
           (SELECT count(*) FROM sessions s
            WHERE s.tenant_id = t.id AND s.state = 'active' AND s.parent_id IS NULL),
           t.memory_bytes,
           COALESCE(u.model_calls, 0), COALESCE(u.model_tokens_in, 0),
           COALESCE(u.model_tokens_out, 0), COALESCE(u.model_cost_usd, 0), t.chat_model, t.name
    FROM tenants t
    LEFT JOIN tenant_usage u ON u.tenant_id = t.id AND u.day = (now() AT TIME ZONE 'UTC')::date
    WHERE t.id = p_tenant
$$;

-- engram_model_state: what a consolidation run needs before it calls the model (run with
-- the tenant set): the tenant's tier, its chat_model override and the tokens its model calls
-- used today (UTC), in and out.
CREATE OR REPLACE FUNCTION engram_model_state(p_tenant bigint)
    RETURNS TABLE (tier text, chat_model text, tokens_today bigint)
    LANGUAGE sql STABLE AS $$
    SELECT t.tier, t.chat_model,
           COALESCE((SELECT u.model_tokens_in + u.model_tokens_out FROM tenant_usage u
                     WHERE u.tenant_id = t.id AND u.day = (now() AT TIME ZONE 'UTC')::date), 0)
    FROM tenants t WHERE t.id = p_tenant
$$;

-- engram_model_usage_add: counts model calls against the tenant's day (UTC): calls, tokens
-- in and out, cost in USD, as the provider reported them. Returns the day's tokens after.
CREATE OR REPLACE FUNCTION engram_model_usage_add(p_tenant bigint, p_calls bigint,
                                                  p_in bigint, p_out bigint,
                                                  p_cost double precision)
    RETURNS bigint
    LANGUAGE sql AS $$
    INSERT INTO tenant_usage AS u (tenant_id, day, queries, model_calls, model_tokens_in,
                                   model_tokens_out, model_cost_usd)
        VALUES (p_tenant, (now() AT TIME ZONE 'UTC')::date, 0, p_calls, p_in, p_out, p_cost)
        ON CONFLICT (tenant_id, day) DO UPDATE SET
            model_calls = u.model_calls + p_calls,
            model_tokens_in = u.model_tokens_in + p_in,
            model_tokens_out = u.model_tokens_out + p_out,
            model_cost_usd = u.model_cost_usd + p_cost
        RETURNING u.model_tokens_in + u.model_tokens_out
$$;

-- Authentication: the key row for a public key id (revoked keys are not found).
DROP FUNCTION IF EXISTS engram_auth_lookup(text);
CREATE OR REPLACE FUNCTION engram_auth_lookup(p_key_id text)
    RETURNS TABLE (key_id bigint, tenant_id bigint, key_hash bytea, tier text, name text,
                   embed_dim integer, embed_provider text, embed_gen bigint)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT k.id, k.tenant_id, k.key_hash, t.tier, t.name, t.embed_dim, t.embed_provider,
           t.embed_gen
    FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
    WHERE k.key_id = p_key_id AND k.revoked_at IS NULL
$$;

-- Marks a key as used now (at authentication).
CREATE OR REPLACE FUNCTION engram_key_touch(p_key bigint) RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    UPDATE api_keys SET last_used_at = date_trunc('milliseconds', now()) WHERE id = p_key
$$;

-- Which of these key rows still authenticate (exist and are not revoked).
CREATE OR REPLACE FUNCTION engram_keys_valid(p_keys bigint[]) RETURNS SETOF bigint
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT k.id FROM api_keys k WHERE k.id = ANY (p_keys) AND k.revoked_at IS NULL
$$;

-- Every tenant's current tier (so long-lived connections learn of tier changes).
CREATE OR REPLACE FUNCTION engram_tenant_tiers(p_tenants bigint[])
    RETURNS TABLE (tenant_id bigint, tier text)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT t.id, t.tier FROM tenants t WHERE t.id = ANY (p_tenants)
$$;

-- Every tenant, for the index preload.
CREATE OR REPLACE FUNCTION engram_tenant_dims() RETURNS TABLE (tenant_id bigint, embed_dim integer)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT t.id, t.embed_dim FROM tenants t ORDER BY t.id
$$;

-- The shape of a tenant as admin calls return it, now with the tenant's own choice of
-- engine (JSON null: none; the server turns it into the engine in force, see
-- engram_tenant_engine).
CREATE OR REPLACE FUNCTION engram_tenant_json(t tenants) RETURNS jsonb
    LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'tenant_id', t.id, 'name', t.name, 'tier', t.tier,
        'embedding', jsonb_build_object('provider', t.embed_provider, 'model', t.embed_model,
                                        'dim', t.embed_dim, 'generation', t.embed_gen),
        'reembed', engram_reembed_state(t.id),
        'index_engine', t.index_engine,
        'chat_model', t.chat_model,
        'memories', t.memory_count, 'created_at', engram_ms(t.created_at),
        'updated_at', engram_ms(t.updated_at),
        'keys', (SELECT count(*) FROM api_keys k WHERE k.tenant_id = t.id AND k.revoked_at IS NULL))
$$;

-- Finds a tenant by id or (when p_id is NULL) by name.
CREATE OR REPLACE FUNCTION engram_admin_find(p_id bigint, p_name text) RETURNS tenants
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

CREATE OR REPLACE FUNCTION engram_admin_tenant_get(p_id bigint, p_name text) RETURNS jsonb
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT engram_tenant_json(engram_admin_find(p_id, p_name))
$$;

-- Tenants in id order after p_after, at most p_limit, as one JSON document.
CREATE OR REPLACE FUNCTION engram_admin_tenant_list(p_after bigint, p_limit integer) RETURNS jsonb
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT COALESCE(jsonb_agg(engram_tenant_json(t) ORDER BY t.id), '[]')
    FROM (SELECT * FROM tenants WHERE id > COALESCE(p_after, 0) ORDER BY id LIMIT p_limit) t
$$;

-- Deletes the tenant and every row it owns, in one transaction: by cascade, and the
-- memories and change log (which reference no tenant, see migration 0006) explicitly, after
-- the tenant row, whose lock keeps new stores out.
CREATE OR REPLACE FUNCTION engram_admin_tenant_delete(p_id bigint, p_name text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    t tenants := engram_admin_find(p_id, p_name);
BEGIN
    DELETE FROM tenants WHERE id = t.id;
    DELETE FROM memories WHERE tenant_id = t.id;
    DELETE FROM memory_changes WHERE tenant_id = t.id;
    PERFORM pg_notify('engram_admin', 'deleted:' || t.id);
    RETURN t.id;
END $$;

CREATE OR REPLACE FUNCTION engram_admin_key_create(p_id bigint, p_name text, p_key_name text,
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

CREATE OR REPLACE FUNCTION engram_admin_key_list(p_id bigint, p_name text) RETURNS jsonb
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT COALESCE(jsonb_agg(jsonb_build_object(
               'key_id', k.id, 'name', k.name, 'prefix', 'egk_' || k.key_id,
               'created_at', engram_ms(k.created_at), 'last_used_at', engram_ms(k.last_used_at),
               'revoked_at', engram_ms(k.revoked_at)) ORDER BY k.id), '[]')
    FROM api_keys k WHERE k.tenant_id = (engram_admin_find(p_id, p_name)).id
$$;

-- Revokes a key (by its row id). Raises EG404 when it does not exist or is revoked already.
CREATE OR REPLACE FUNCTION engram_admin_key_revoke(p_key bigint) RETURNS bigint
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

-- A tenant's JSON with the engine in force on the calling server: 'index_engine' is the
-- tenant's choice or, when it has none, p_default (the server's setting), and
-- 'index_engine_default' tells which.
CREATE OR REPLACE FUNCTION engram_tenant_engine(j jsonb, p_default text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT j || jsonb_build_object('index_engine', COALESCE(j ->> 'index_engine', p_default),
                                   'index_engine_default', j ->> 'index_engine' IS NULL)
$$;

-- The same for an array of tenants, in order.
CREATE OR REPLACE FUNCTION engram_tenants_engine(j jsonb, p_default text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE(jsonb_agg(engram_tenant_engine(e, p_default) ORDER BY o), '[]')
    FROM jsonb_array_elements(j) WITH ORDINALITY AS x (e, o)
$$;

-- p_engine: 'native', 'faiss', or NULL (the server's setting).
CREATE OR REPLACE FUNCTION engram_admin_tenant_create(p_name text, p_tier text, p_provider text,
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

-- p_engine: NULL leaves the engine as it is, 'default' clears the tenant's choice (it
-- follows the server's setting again), 'native' or 'faiss' sets it. Every update naming an
-- engine is announced, changed or not: a server that holds the index with another engine
-- drops it, one that already uses that engine does nothing.
DROP FUNCTION IF EXISTS engram_admin_tenant_update(bigint, text, text, text, text);
-- p_chat_model: NULL leaves it, 'default' clears the tenant's override (the server's model),
-- 'none' keeps the tenant off the model, another value names the model (the server checks
-- it: admin.tenant.update).
-- p_embed_provider (with p_embed_model, p_embed_dim; the server validated them) starts a
-- re-embedding to that model (engram_reembed_start: EG400 the same model, EG409 one runs);
-- p_cancel_reembed drops the one running first. Either fails the whole update.
DROP FUNCTION IF EXISTS engram_admin_tenant_update(bigint, text, text, text, text, text);
CREATE OR REPLACE FUNCTION engram_admin_tenant_update(p_id bigint, p_name text, p_new_name text,
                                           p_tier text, p_engine text, p_chat_model text,
                                           p_embed_provider text DEFAULT NULL,
                                           p_embed_model text DEFAULT NULL,
                                           p_embed_dim integer DEFAULT NULL,
                                           p_cancel_reembed boolean DEFAULT false)
    RETURNS jsonb
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    t tenants := engram_admin_find(p_id, p_name);
BEGIN
    IF p_cancel_reembed THEN
        PERFORM engram_reembed_cancel(t.id, NULL);
    END IF;
    IF p_embed_provider IS NOT NULL THEN
        PERFORM engram_reembed_start(t.id, NULL, p_embed_provider, p_embed_model, p_embed_dim);
    END IF;
    UPDATE tenants SET name = COALESCE(p_new_name, name), tier = COALESCE(p_tier, tier),
                       index_engine = CASE WHEN p_engine IS NULL THEN index_engine
                                           WHEN p_engine = 'default' THEN NULL
                                           ELSE p_engine END,
                       chat_model = CASE WHEN p_chat_model IS NULL THEN chat_model
                                         WHEN p_chat_model = 'default' THEN NULL
                                         ELSE p_chat_model END,
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

-- engram_next_id: the tenant's next id of the kind. The counter row stays locked until the
-- transaction ends, so the ids of one tenant and kind are handed out in commit order.
CREATE OR REPLACE FUNCTION engram_next_id(p_tenant bigint, p_kind text) RETURNS bigint
    LANGUAGE sql AS $$
    INSERT INTO tenant_counters AS c (tenant_id, kind, last) VALUES (p_tenant, p_kind, 1)
        ON CONFLICT (tenant_id, kind) DO UPDATE SET last = c.last + 1
        RETURNING c.last
$$;
