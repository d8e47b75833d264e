-- Online re-embedding of a tenant (migration 0013; server/domain/reembed.c).
--
-- admin.tenant.update {embedding} starts a job (engram_reembed_start); a background job of
-- some engramd process claims it (an advisory lock on its own connection), reads the
-- memories whose side vector is missing or stale (engram_reembed_todo), embeds them with the
-- target model and writes the vectors (engram_reembed_put); when none is left it swaps
-- (engram_reembed_swap): one transaction under the tenant row's lock moves the side vectors
-- into memories, changes the tenant's model and bumps its generation. Every function here is
-- SECURITY DEFINER: the background connection acts for no single tenant.

-- The content hash a side vector is checked against.
CREATE OR REPLACE FUNCTION engram_content_hash(p_content text) RETURNS bytea
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT sha256(convert_to(p_content, 'UTF8'))
$$;

-- The state of a tenant's job as memory.stats and admin.tenant.get show it, NULL when none
-- runs. total counts the tenant's memories (archived included) now; done those whose side
-- vector matches their content.
CREATE OR REPLACE FUNCTION engram_reembed_state(p_tenant bigint) RETURNS jsonb
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT jsonb_build_object(
        'state', CASE WHEN j.retry_at IS NOT NULL AND j.retry_at > now() THEN 'backoff'
                      ELSE 'running' END,
        'provider', j.provider, 'model', j.model, 'dim', j.dim,
        'total', (SELECT count(*) FROM memories m WHERE m.tenant_id = j.tenant_id),
        'done', (SELECT count(*) FROM memory_reembed s JOIN memories m
                   ON m.tenant_id = s.tenant_id AND m.id = s.memory_id
                 WHERE s.tenant_id = j.tenant_id
                   AND s.content_hash = engram_content_hash(m.content)),
        'failures', j.failures, 'last_error', j.last_error,
        'last_error_at', engram_ms(j.last_error_at), 'retry_at', engram_ms(j.retry_at),
        'started_at', engram_ms(j.started_at))
    FROM reembed_jobs j WHERE j.tenant_id = p_tenant
$$;

-- engram_reembed_start: records the target model of tenant p_id (or p_name) and returns the
-- job's state. EG400 when the target is the model the tenant has, EG409 when a job runs.
-- Under the tenant row's lock, so two admins cannot both start one.
CREATE OR REPLACE FUNCTION engram_reembed_start(p_id bigint, p_name text, p_provider text,
                                                p_model text, p_dim integer)
    RETURNS jsonb
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    t tenants := engram_admin_find(p_id, p_name);
BEGIN
    SELECT * INTO t FROM tenants WHERE id = t.id FOR UPDATE;
    IF t.embed_provider = p_provider AND t.embed_model = p_model AND t.embed_dim = p_dim THEN
        RAISE EXCEPTION 'the tenant already embeds with % % (dimension %)', p_provider,
            CASE WHEN p_model = '' THEN '(built in)' ELSE p_model END, p_dim
            USING ERRCODE = 'EG400';
    END IF;
    IF EXISTS (SELECT 1 FROM reembed_jobs j WHERE j.tenant_id = t.id) THEN
        RAISE EXCEPTION 'a re-embedding of this tenant is running; cancel it first '
                        '(admin.tenant.update {embedding: null})' USING ERRCODE = 'EG409';
    END IF;
    DELETE FROM memory_reembed s WHERE s.tenant_id = t.id;  -- a cancelled job's leftovers
    INSERT INTO reembed_jobs (tenant_id, provider, model, dim, from_gen)
        VALUES (t.id, p_provider, p_model, p_dim, t.embed_gen);
    UPDATE tenants SET updated_at = date_trunc('milliseconds', now()) WHERE id = t.id;
    PERFORM pg_notify('engram_admin', 'reembed:' || t.id);
    RETURN engram_reembed_state(t.id);
END $$;

-- engram_reembed_cancel: drops tenant p_id's job and its side vectors. Returns whether one
-- ran.
CREATE OR REPLACE FUNCTION engram_reembed_cancel(p_id bigint, p_name text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    t tenants := engram_admin_find(p_id, p_name);
BEGIN
    PERFORM 1 FROM tenants WHERE id = t.id FOR UPDATE;
    DELETE FROM memory_reembed s WHERE s.tenant_id = t.id;
    DELETE FROM reembed_jobs j WHERE j.tenant_id = t.id;
    RETURN FOUND;
END $$;

-- The tenants with a job whose provider may be tried now (retry_at passed), oldest first.
CREATE OR REPLACE FUNCTION engram_reembed_due(p_limit integer)
    RETURNS TABLE (tenant_id bigint, provider text, model text, dim integer)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT j.tenant_id, j.provider, j.model, j.dim FROM reembed_jobs j
    WHERE j.retry_at IS NULL OR j.retry_at <= now()
    ORDER BY j.started_at, j.tenant_id LIMIT p_limit
$$;

-- engram_reembed_todo: up to p_limit memories of the tenant (archived included) after the
-- job's cursor that have no side vector of their current content, in id order, with the
-- content's hash. From the cursor on, so that a batch reads about p_limit rows, not every
-- memory done before it.
CREATE OR REPLACE FUNCTION engram_reembed_todo(p_tenant bigint, p_limit integer)
    RETURNS TABLE (id bigint, content text, content_hash bytea)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT m.id, m.content, engram_content_hash(m.content) FROM memories m
    LEFT JOIN memory_reembed s ON s.tenant_id = m.tenant_id AND s.memory_id = m.id
    WHERE m.tenant_id = p_tenant
      -- no job (cancelled, swapped): NULL, no row
      AND m.id > (SELECT j.cursor FROM reembed_jobs j WHERE j.tenant_id = p_tenant)
      AND (s.memory_id IS NULL OR s.content_hash <> engram_content_hash(m.content))
    ORDER BY m.id LIMIT p_limit
$$;

-- engram_reembed_put: writes side vectors (p_embeddings back to back, p_dim float32 each)
-- for memories p_ids computed from contents hashing to p_hashes. A memory deleted or changed
-- since it was read is skipped (the next todo finds a changed one again). Clears the job's
-- backoff. Returns the vectors written; 0 when the job is gone (cancelled, swapped) or its
-- dimension is not p_dim.
CREATE OR REPLACE FUNCTION engram_reembed_put(p_tenant bigint, p_dim integer, p_ids bigint[],
                                              p_hashes bytea[], p_embeddings bytea)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    n bigint;
BEGIN
    IF length(p_embeddings) <> cardinality(p_ids)::bigint * p_dim * 4 THEN
        RAISE EXCEPTION 'embeddings do not match the dimension' USING ERRCODE = 'EG400';
    END IF;
    -- the job's row first: a cancel or a swap (which lock the tenant row, then delete it)
    -- either ran before (nothing is written) or waits for this transaction
    PERFORM 1 FROM reembed_jobs j WHERE j.tenant_id = p_tenant AND j.dim = p_dim FOR SHARE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    INSERT INTO memory_reembed AS s (tenant_id, memory_id, content_hash, embedding)
        SELECT p_tenant, u.id, u.h,
               substring(p_embeddings FROM ((u.i - 1) * p_dim * 4 + 1)::integer FOR p_dim * 4)
        FROM unnest(p_ids, p_hashes) WITH ORDINALITY AS u (id, h, i)
        JOIN memories m ON m.tenant_id = p_tenant AND m.id = u.id
        WHERE engram_content_hash(m.content) = u.h
    ON CONFLICT (tenant_id, memory_id) DO UPDATE
        SET content_hash = EXCLUDED.content_hash, embedding = EXCLUDED.embedding;
    GET DIAGNOSTICS n = ROW_COUNT;
    -- the cursor passes the batch whatever was skipped: a changed memory is found again
    -- when the swap sends the job round once more
    UPDATE reembed_jobs SET done = done + n, retry_at = NULL, backoff_ms = 0,
                            cursor = GREATEST(cursor, (SELECT max(u) FROM unnest(p_ids) AS u))
        WHERE tenant_id = p_tenant;
    RETURN n;
END $$;

-- engram_reembed_fail: records a failed batch (the provider's error) and when to try again:
-- the backoff doubles from p_min_ms up to p_max_ms. Returns the backoff in ms.
CREATE OR REPLACE FUNCTION engram_reembed_fail(p_tenant bigint, p_error text, p_min_ms integer,
                                               p_max_ms integer)
    RETURNS integer
    LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    UPDATE reembed_jobs SET failures = failures + 1, last_error = left(p_error, 500),
        last_error_at = date_trunc('milliseconds', now()),
        backoff_ms = LEAST(p_max_ms, GREATEST(p_min_ms, backoff_ms * 2)),
        retry_at = date_trunc('milliseconds', now()) + make_interval(
            secs => LEAST(p_max_ms, GREATEST(p_min_ms, backoff_ms * 2)) / 1000.0)
    WHERE tenant_id = p_tenant
    RETURNING backoff_ms
$$;

-- engram_reembed_swap: when every memory of the tenant has a side vector of its current
-- content, moves them into memories (one change number each, so that indexes and snapshots
-- that replay the change log read the new vectors), sets the tenant's model, bumps its
-- generation, drops the job and announces it (engram_admin 'embedding:<tenant>:<gen>:
-- <provider>:<dim>', engram_changes). All under the tenant row's lock: a store embedded
-- under the old generation that commits later is refused (EG412). Returns the new
-- generation, or NULL when vectors are missing (the job goes round again from the first
-- memory: its cursor back at 0) or no job runs.
CREATE OR REPLACE FUNCTION engram_reembed_swap(p_tenant bigint) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    j reembed_jobs;
    v_n bigint;
    v_last bigint;
    v_gen bigint;
BEGIN
    PERFORM 1 FROM tenants WHERE id = p_tenant FOR UPDATE;
    SELECT * INTO j FROM reembed_jobs WHERE tenant_id = p_tenant;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM memories m
               LEFT JOIN memory_reembed s ON s.tenant_id = m.tenant_id AND s.memory_id = m.id
               WHERE m.tenant_id = p_tenant
                 AND (s.memory_id IS NULL
                      OR s.content_hash <> engram_content_hash(m.content))) THEN
        UPDATE reembed_jobs SET cursor = 0 WHERE tenant_id = p_tenant;
        RETURN NULL;
    END IF;
    SELECT count(*) INTO v_n FROM memories m WHERE m.tenant_id = p_tenant;
    UPDATE tenants SET change_seq = change_seq + v_n, embed_provider = j.provider,
                       embed_model = j.model, embed_dim = j.dim, embed_gen = embed_gen + 1,
                       updated_at = date_trunc('milliseconds', now())
        WHERE id = p_tenant RETURNING change_seq, embed_gen INTO v_last, v_gen;
    WITH o AS (
        SELECT m.id, v_last - v_n + row_number() OVER (ORDER BY m.id) AS seq
        FROM memories m WHERE m.tenant_id = p_tenant
    ), u AS (
        UPDATE memories m SET embedding = s.embedding, seq = o.seq
        FROM o, memory_reembed s
        WHERE m.tenant_id = p_tenant AND m.id = o.id AND s.tenant_id = p_tenant
          AND s.memory_id = o.id
        RETURNING m.id, m.seq
    )
    INSERT INTO memory_changes (tenant_id, seq, memory_id, op)
        SELECT p_tenant, u.seq, u.id, 'u' FROM u;
    DELETE FROM memory_reembed s WHERE s.tenant_id = p_tenant;
    DELETE FROM reembed_jobs WHERE tenant_id = p_tenant;
    PERFORM pg_notify('engram_admin', 'embedding:' || p_tenant || ':' || v_gen || ':'
                                      || j.provider || ':' || j.dim);
    IF v_n > 0 THEN
        PERFORM pg_notify('engram_changes', p_tenant || ':' || v_last);
    END IF;
    RETURN v_gen;
END $$;

-- The current model and generation of the tenants p_tenants (long-lived connections learn
-- of a swap whose notification they missed: tenancy.c).
CREATE OR REPLACE FUNCTION engram_tenant_embeddings(p_tenants bigint[])
    RETURNS TABLE (tenant_id bigint, embed_gen bigint, embed_provider text, embed_dim integer)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT t.id, t.embed_gen, t.embed_provider, t.embed_dim FROM tenants t
    WHERE t.id = ANY (p_tenants)
$$;
