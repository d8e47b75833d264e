-- storage/functions/20_memory.sql: The memory API: stores, updates, archives, deletes,
-- history, expiry, access counts and the composite importance.
--
-- Repeatable: engramd applies this file whole, in one transaction, whenever its checksum
-- differs from the one recorded in schema_functions (see storage/migrate.h). Every
-- definition is CREATE OR REPLACE; a change of a function's arguments or result type
-- needs a DROP FUNCTION IF EXISTS of the old signature above the new definition.

-- The composite importance as the server computes it (weights passed in).
CREATE OR REPLACE FUNCTION engram_composite(created timestamptz, access_count bigint,
                                 importance double precision, as_of timestamptz,
                                 w_recency double precision, w_access double precision,
                                 w_explicit double precision, recency_days double precision,
                                 saturation double precision) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT w_recency * exp(-greatest(extract(epoch FROM as_of - created), 0) / 86400.0 / recency_days)
         + w_access * least(access_count / saturation, 1.0)
         + w_explicit * importance
$$;

-- engram_meta_of: the index state of memory m (engram_memory_meta). Its tags column is the
-- typed metadata fields as a JSON array [tokens, chains, protocols, strategy_id], the same
-- the index loader reads: the server derives tags from it by the one rule it uses for
-- stores and loads too (server/domain/memfilter.c).
CREATE OR REPLACE FUNCTION engram_meta_of(m memories) RETURNS engram_memory_meta
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ROW(m.id, m.seq, m.agent_id, m.clade_id, m.scope, m.type, m.importance,
               engram_ms(m.created_at), engram_ms(m.last_accessed_at), m.access_count,
               engram_ms(m.expires_at), engram_ms(m.archived_at), m.pinned,
               jsonb_build_array(m.metadata -> 'tokens', m.metadata -> 'chains',
                                 m.metadata -> 'protocols', m.metadata -> 'strategy_id')::text
              )::engram_memory_meta;
END $$;

-- Records the current state of memory m as a version replaced by `change`, and returns the
-- version's bytes, which the caller adds to tenants.memory_bytes (migration 0009).
DROP FUNCTION IF EXISTS engram_keep_version(memories, text, jsonb);
CREATE OR REPLACE FUNCTION engram_keep_version(m memories, p_change text, p_detail jsonb)
    RETURNS integer
    LANGUAGE sql AS $$
    INSERT INTO memory_versions (tenant_id, memory_id, version, content, type, importance,
                                 metadata, expires_at, archived_at, valid_from, replaced_at,
                                 change, detail)
        VALUES (m.tenant_id, m.id, m.version, m.content, m.type, m.importance, m.metadata,
                m.expires_at, m.archived_at, m.updated_at, date_trunc('milliseconds', now()),
                p_change, COALESCE(p_detail, '{}'))
        RETURNING bytes
$$;

-- engram_byte_check: raises EG429 when adding p_add bytes to the tenant's memory bytes would
-- pass its tier's byte limit (p_limits, see engram_tier_byte_limit). Call with the tenant
-- row's lock held.
CREATE OR REPLACE FUNCTION engram_byte_check(p_tenant bigint, p_limits bigint[], p_add bigint)
    RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    v_bytes bigint;
    v_max bigint;
BEGIN
    SELECT t.memory_bytes, engram_tier_byte_limit(p_limits, t.tier) INTO v_bytes, v_max
        FROM tenants t WHERE t.id = p_tenant;
    IF v_max IS NOT NULL AND p_add > 0 AND v_bytes + p_add > v_max THEN
        RAISE EXCEPTION 'memory byte limit reached'
            USING ERRCODE = 'EG429',
                  DETAIL = format('limit=%s usage=%s requested=%s', v_max, v_bytes, p_add);
    END IF;
END $$;

-- The refusal of a write whose vectors were computed with the tenant's previous embedding
-- model (EG412, the client's unavailable: sent again, it is embedded with the new one).
CREATE OR REPLACE FUNCTION engram_embed_gen_message() RETURNS text
    LANGUAGE sql IMMUTABLE AS $$
    SELECT 'the tenant''s embedding model changed while this write was embedded; retry'::text
$$;

-- Raises EG412 when p_gen is set and is not tenant p_tenant's embedding generation (the
-- caller holds the tenant row's lock).
CREATE OR REPLACE FUNCTION engram_embed_gen_check(p_tenant bigint, p_gen bigint) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF p_gen IS NOT NULL AND p_gen <> (SELECT t.embed_gen FROM tenants t WHERE t.id = p_tenant)
    THEN
        RAISE EXCEPTION '%', engram_embed_gen_message() USING ERRCODE = 'EG412';
    END IF;
END $$;

-- engram_memory_update: changes the given fields of one memory (NULL: unchanged), keeping
-- the previous version. p_clear_expiry removes an expiry. Raises EG404 when the memory does
-- not exist for this tenant, EG429 when the kept version and the new text would pass the
-- tier's byte limit (p_limits; the memory's bytes grow by its new size: the old text stays
-- as the version). A new p_embedding computed under the tenant's embedding generation p_gen
-- is refused with EG412 when the tenant moved to another model since (migration 0013).
DROP FUNCTION IF EXISTS engram_memory_update(bigint, bigint, text, text, double precision, text,
                                            bytea, bigint, boolean, boolean);
DROP FUNCTION IF EXISTS engram_memory_update(bigint, bigint, text, text, double precision, text,
                                            bytea, bigint, boolean, boolean, bigint[]);
CREATE OR REPLACE FUNCTION engram_memory_update(
        p_tenant bigint, p_id bigint, p_content text, p_type text, p_importance double precision,
        p_metadata text, p_embedding bytea, p_expires_ms bigint, p_clear_expiry boolean,
        p_pinned boolean, p_limits bigint[], p_gen bigint DEFAULT NULL)
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
    v_new bigint;
BEGIN
    PERFORM engram_next_seq(p_tenant, 0);
    PERFORM engram_embed_gen_check(p_tenant, CASE WHEN p_embedding IS NOT NULL THEN p_gen END);
    SELECT * INTO m FROM memories WHERE tenant_id = p_tenant AND id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'memory % not found', p_id USING ERRCODE = 'EG404';
    END IF;
    v_new := octet_length(COALESCE(p_content, m.content))
             + octet_length(COALESCE(p_metadata::jsonb, m.metadata)::text);
    PERFORM engram_byte_check(p_tenant, p_limits, v_new);
    -- the old text becomes the version (its bytes stay counted), the new text is added
    PERFORM engram_keep_version(m, 'update', '{}');
    UPDATE tenants SET memory_bytes = memory_bytes + v_new WHERE id = p_tenant;
    v_seq := engram_next_seq(p_tenant, 1);
    UPDATE memories SET
        content = COALESCE(p_content, content),
        content_tsv = CASE WHEN p_content IS NULL THEN content_tsv
                           ELSE to_tsvector('english', p_content) END,
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
-- p_ids, with a version row and one block of change numbers per call; returns the changed
-- memories' new state. Archived memories do not count against the tier's memory limit
-- (p_limits: free, standard, premium; 0 unlimited): an archive gives its memories' places
-- back, and a restore that would pass the limit is refused whole (EG429), checked under the
-- tenant row's lock like a store.
DROP FUNCTION IF EXISTS engram_memory_set_archived(bigint, bigint[], boolean, text);
CREATE OR REPLACE FUNCTION engram_memory_set_archived(p_tenant bigint, p_ids bigint[],
                                                      p_archive boolean, p_reason text,
                                                      p_limits bigint[])
    RETURNS SETOF engram_memory_meta
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    m memories;
    v_n bigint;
    v_done bigint := 0;
    v_seq bigint;
    v_count bigint;
    v_max bigint;
    v_add bigint;
BEGIN
    PERFORM engram_next_seq(p_tenant, 0);
    SELECT count(*), COALESCE(sum(bytes), 0) INTO v_n, v_add FROM memories
    WHERE tenant_id = p_tenant AND id = ANY (p_ids) AND (archived_at IS NULL) = p_archive;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    -- each memory's text is kept once more, as the version this change replaces
    PERFORM engram_byte_check(p_tenant, p_limits, v_add);
    IF NOT p_archive THEN
        SELECT t.memory_count, engram_tier_limit(p_limits, t.tier) INTO v_count, v_max
            FROM tenants t WHERE t.id = p_tenant;
        IF v_max IS NOT NULL AND v_count + v_n > v_max THEN
            RAISE EXCEPTION 'memory limit reached'
                USING ERRCODE = 'EG429',
                      DETAIL = format('limit=%s usage=%s requested=%s', v_max, v_count, v_n);
        END IF;
    END IF;
    v_seq := engram_next_seq(p_tenant, v_n) - v_n;
    FOR m IN SELECT * FROM memories
             WHERE tenant_id = p_tenant AND id = ANY (p_ids)
               AND (archived_at IS NULL) = p_archive
             ORDER BY id FOR UPDATE LOOP
        PERFORM engram_keep_version(m, CASE WHEN p_archive THEN 'archive' ELSE 'restore' END,
                                    jsonb_build_object('reason', p_reason));
        v_seq := v_seq + 1;
        v_done := v_done + 1;
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
    UPDATE tenants SET memory_count = memory_count + CASE WHEN p_archive THEN -v_done
                                                          ELSE v_done END,
                       memory_bytes = memory_bytes + v_add
        WHERE tenants.id = p_tenant;
    PERFORM pg_notify('engram_changes', p_tenant || ':' || v_seq);
END $$;
ALTER FUNCTION engram_memory_set_archived(bigint, bigint[], boolean, text, bigint[])
    SET plan_cache_mode = force_generic_plan;

-- engram_purge_expired: deletes up to p_limit expired memories (with change records, so
-- indexes drop them) and idempotency keys older than p_idem_age_s. Returns the number of
-- memories deleted.
CREATE OR REPLACE FUNCTION engram_purge_expired(p_limit integer, p_idem_age_s integer) RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    t bigint;
    total bigint := 0;
    v_ids bigint[];
BEGIN
    DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => p_idem_age_s);
    -- tenants in id order: the tenant rows are locked in the order the group store takes
    -- them (engram_memory_store_group), so neither waits for the other in a cycle
    FOR t IN SELECT DISTINCT tenant_id FROM memories
             WHERE expires_at IS NOT NULL AND expires_at <= now() ORDER BY tenant_id LOOP
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
ALTER FUNCTION engram_purge_expired(integer, integer) SECURITY DEFINER SET search_path FROM CURRENT;

-- engram_memory_store_batch: stores n memories in one transaction, all or nothing, and
-- returns each one's index state (tags NULL: the server derives them from the request).
-- Arrays are parallel, one element per memory; p_embeddings holds the n embeddings back to
-- back (p_dim float32 each). The tier's memory limit (p_limits: free, standard, premium;
-- 0 unlimited) is checked under the tenant row's lock, so concurrent writers in any
-- number of processes never pass it (EG429). With p_idem, a retry with the same key and
-- fingerprint returns the first call's memories (replay true); another request under the
-- same key is EG409. Ids and change numbers come from the tenant row, moved in one UPDATE.
-- The rows come back from the INSERT itself (RETURNING): reading them back by id was
-- planned as a scan of the tenant for a tenant PostgreSQL had no statistics on yet.
-- p_gen: the tenant's embedding generation the vectors were computed under; EG412 when the
-- tenant has moved to another model since, or when p_dim is not the tenant's dimension
-- (checked under the lock; migration 0013).
DROP FUNCTION IF EXISTS engram_memory_store_batch(bigint, bigint[], text, bytea, integer,
    bigint[], bigint[], text[], text[], text[], double precision[], text[], bytea, bigint[],
    bigint[], bigint[], bigint[], bigint[], boolean[]);
CREATE OR REPLACE FUNCTION engram_memory_store_batch(
        p_tenant bigint, p_limits bigint[], p_idem text, p_fingerprint bytea, p_dim integer,
        p_agent bigint[], p_clade bigint[], p_scope text[], p_type text[], p_content text[],
        p_importance double precision[], p_metadata text[], p_embeddings bytea,
        p_created_ms bigint[], p_updated_ms bigint[], p_accessed_ms bigint[],
        p_access_count bigint[], p_expires_ms bigint[], p_pinned boolean[],
        p_gen bigint DEFAULT NULL)
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
    v_tsv tsvector[];
    v_md jsonb[];
    v_bytes bigint;
    v_gen bigint;
    v_dim integer;
    k record;
BEGIN
    -- the text search vectors, the metadata and the bytes (memories.bytes) before the lock
    -- (migration 0008); a replay below computed them for nothing
    v_tsv := ARRAY(SELECT to_tsvector('english', c.t)
                   FROM unnest(p_content) WITH ORDINALITY AS c (t, i) ORDER BY c.i);
    v_md := p_metadata::jsonb[];
    SELECT COALESCE(sum(octet_length(u.c) + octet_length(u.md::text)), 0) INTO v_bytes
        FROM unnest(p_content, v_md) AS u (c, md);
    -- the tenant row's lock, before anything else
    SELECT t.change_seq, t.memory_count, t.tier, t.embed_gen, t.embed_dim
        INTO v_last, v_count, v_tier, v_gen, v_dim
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
    -- vectors of another dimension than the tenant's (a caller that passes no generation,
    -- such as extraction, across a re-embedding's swap) are as stale
    IF (p_gen IS NOT NULL AND p_gen <> v_gen) OR p_dim <> v_dim THEN
        RAISE EXCEPTION '%', engram_embed_gen_message() USING ERRCODE = 'EG412';
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
    PERFORM engram_byte_check(p_tenant, p_limits, v_bytes);
    UPDATE tenants SET change_seq = change_seq + n, memory_count = memory_count + n,
                       memory_bytes = memory_bytes + v_bytes,
                       memory_id_last = memory_id_last + n
        WHERE tenants.id = p_tenant RETURNING change_seq, memory_id_last INTO v_last, v_id_last;
    v_base := v_last - n;
    SELECT array_agg(v_id_last - n + g) INTO v_ids FROM generate_series(1, n) AS g;
    -- tags NULL: the server derives them from the request
    RETURN QUERY
        WITH ins AS (
            INSERT INTO memories (tenant_id, id, agent_id, clade_id, scope, type, content,
                                  content_tsv, importance, metadata, embedding, created_at,
                                  updated_at, last_accessed_at, access_count, expires_at,
                                  pinned, seq)
                SELECT p_tenant, v_ids[a.i], a.agent, a.clade, a.scope, a.type, a.content,
                       a.tsv, a.imp, a.md,
                       substring(p_embeddings FROM ((a.i - 1) * p_dim * 4 + 1)::integer
                                 FOR p_dim * 4),
                       date_trunc('milliseconds', COALESCE(engram_ts(a.cr), now())),
                       date_trunc('milliseconds', COALESCE(engram_ts(a.up), engram_ts(a.cr), now())),
                       date_trunc('milliseconds', engram_ts(a.acc)),
                       COALESCE(a.cnt, 0), engram_ts(a.ex), COALESCE(a.pin, false),
                       v_base + a.i
                FROM unnest(p_agent, p_clade, p_scope, p_type, p_content, p_importance,
                            v_md, p_created_ms, p_updated_ms, p_accessed_ms,
                            p_access_count, p_expires_ms, p_pinned, v_tsv)
                     WITH ORDINALITY AS a (agent, clade, scope, type, content, imp, md, cr, up,
                                           acc, cnt, ex, pin, tsv, i)
                RETURNING tenant_id, id, seq, agent_id, clade_id, scope, type, importance,
                          created_at, last_accessed_at, access_count, expires_at, archived_at,
                          pinned)
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
    bigint[], bigint[], bigint[], boolean[], bigint)
    SET plan_cache_mode = force_generic_plan;

-- engram_memory_store_group: the stores of several requests, of any tenants, in one
-- transaction (the server's group commit, server/methods/gcommit.h). Request s (a segment)
-- is p_counts[s] memories of tenant p_tenants[s], whose embeddings have p_dims[s] float32
-- each; the per-memory arrays hold every segment's memories back to back, in segment
-- order, as do the embeddings. Segments come in tenant order (checked), so concurrent
-- groups take the tenant rows' locks in one order and never deadlock.
--
-- Each segment gets exactly what engram_memory_store_batch would give it alone, run in the
-- segments' order: the tier's memory limit (p_limits) is checked per segment, under the
-- tenant row's lock, counting what the earlier segments of the tenant took; a refused
-- segment (EG429, or EG404 for a tenant that is gone) does not fail the others: it yields
-- one row with err_state, err_message and err_detail set. Ids and change numbers come from
-- the tenant row as for engram_memory_store_batch, one UPDATE per tenant in the common
-- case (every segment fits) and no separate row lock. Rows come back in segment order, a
-- segment's memories in its own order (idx NULL; tags NULL, as for store_batch).
--
-- Unlike the other writers it sends no NOTIFY engram_changes: the server announces the
-- group's changes after the commit (SQL_NOTIFY_CHANGES, server/methods/gcommit.c). A
-- transaction that notifies takes one lock of the whole database at its commit and holds it
-- until its commit record is on disk, so notifying store groups committed one at a time:
-- 5,072 to 5,553 stores/s from 16 clients over 100 tenants with the NOTIFY here, 6,840 to
-- 7,253 without (bench/README.md). A change whose announcement is lost (the server died
-- between the commit and the NOTIFY) still reaches the other processes: each one compares
-- its loaded tenants' change numbers with PostgreSQL's every change_poll_ms.
--
-- Why SECURITY DEFINER is safe here: a group holds rows of several tenants, so no single
-- engram.tenant_id can cover its INSERT. The function writes only rows whose tenant_id is
-- the tenant of their own segment, locks and updates only those tenants' rows, reads
-- nothing of any other tenant, and returns each row to the segment that sent it. The server
-- passes as p_tenants[s] the tenant its connection authenticated as (conn_auth), the very
-- value it would otherwise have set as engram.tenant_id for that store: the trust placed in
-- the server is unchanged, and every other statement still runs under row-level security.
--
-- A tenant whose row another transaction holds is waited for at most p_probe_ms (another
-- group holds it for milliseconds; a long transaction of the tenant's own, or an operator's
-- SELECT ... FOR UPDATE, for as long as it likes): then its segments are refused with
-- EG503 ('tenant busy'), so the other tenants of the group commit, and the server sends the
-- refused requests again alone with p_probe_ms NULL (wait), on a connection of their own
-- with a lock_timeout (server/methods/gcommit.c, write_lock_wait_ms).
--
-- p_gens[s]: the tenant's embedding generation segment s's vectors were computed under; a
-- segment whose tenant has moved to another model since is refused with EG412 (migration
-- 0013). NULL: not checked.
--
-- p_idems[s], p_fingerprints[s] (hex): segment s's idempotency key and request fingerprint,
-- NULL for none. A keyed segment is what engram_memory_store_batch makes of it alone: under
-- the tenant row's lock, a key stored before with the same fingerprint replays that
-- request's memories (replay true, their rows as they are now, no count taken), with
-- another fingerprint it is refused with EG409; otherwise the segment is stored and its key
-- recorded with it. A tenant's run that holds a keyed segment takes the one-at-a-time path
-- below. One key of a tenant twice in one call is an error of the whole call (EG400): the
-- server never groups them (the second would have to see the first's commit).
DROP FUNCTION IF EXISTS engram_memory_store_group(bigint[], integer[], integer[], bigint[],
    bigint[], bigint[], text[], text[], text[], double precision[], text[], bytea, bigint[],
    bigint[], bigint[], bigint[], bigint[], boolean[]);
DROP FUNCTION IF EXISTS engram_memory_store_group(bigint[], integer[], integer[], bigint[],
    bigint[], bigint[], text[], text[], text[], double precision[], text[], bytea, bigint[],
    bigint[], bigint[], bigint[], bigint[], boolean[], integer);
CREATE OR REPLACE FUNCTION engram_memory_store_group(
        p_tenants bigint[], p_counts integer[], p_dims integer[], p_limits bigint[],
        p_agent bigint[], p_clade bigint[], p_scope text[], p_type text[], p_content text[],
        p_importance double precision[], p_metadata text[], p_embeddings bytea,
        p_created_ms bigint[], p_updated_ms bigint[], p_accessed_ms bigint[],
        p_access_count bigint[], p_expires_ms bigint[], p_pinned boolean[],
        p_gens bigint[], p_probe_ms integer, p_idems text[], p_fingerprints text[])
    RETURNS TABLE (idx integer, replay boolean, r_created_ms bigint, m_id bigint, m_seq bigint,
                   m_agent_id bigint, m_clade_id bigint, m_scope text, m_type text,
                   m_importance double precision, m_created_ms bigint, m_accessed_ms bigint,
                   m_access_count bigint, m_expires_ms bigint, m_archived_ms bigint,
                   m_pinned boolean, m_tags text, err_state text, err_message text,
                   err_detail text)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    ns integer := cardinality(p_tenants);
    v_seg integer[] := '{}';   -- the segment of each memory
    v_first integer[] := '{}'; -- a segment's first memory (1-based)
    v_eoff bigint[] := '{}';   -- the byte offset of its first embedding
    v_seq0 bigint[] := '{}';   -- the change number before its first memory; NULL: refused
    v_id0 bigint[] := '{}';    -- the id before its first memory
    v_key bigint[] := '{}';    -- a refused segment's place among the rows (see below)
    v_state text[] := '{}';
    v_msg text[] := '{}';
    v_detail text[] := '{}';
    s integer;
    q integer;
    r integer;
    k integer := 1;
    e bigint := 0;
    v_total bigint;
    v_last bigint;
    v_idl bigint;
    v_count bigint;
    v_max bigint;
    v_took bigint;
    v_tsv tsvector[];
    v_md jsonb[];
    v_sb bigint[];      -- each segment's bytes (memories.bytes of its memories)
    v_tb bigint;
    v_bytes bigint;
    v_bmax bigint;
    v_btook bigint;
    v_busy boolean;
    v_gen bigint;
    v_lt text := current_setting('lock_timeout');
    v_keyed boolean;    -- the run holds a keyed segment
    v_fp bytea;
    v_kids bigint[];    -- a replayed key's memory ids and creation times
    v_kcr bigint[];
    -- the replayed memories' rows, gathered here so the final statement joins no table
    -- (Citus could not plan it with a join: the function must still plan there)
    v_rseg integer[] := '{}';
    v_ridx integer[] := '{}';
    v_rcr bigint[] := '{}';
    v_rmeta engram_memory_meta[] := '{}';
BEGIN
    IF cardinality(p_counts) <> ns OR cardinality(p_dims) <> ns OR ns = 0 THEN
        RAISE EXCEPTION 'segments do not match' USING ERRCODE = 'EG400';
    END IF;
    IF p_idems IS NOT NULL AND (cardinality(p_idems) <> ns
                                OR cardinality(p_fingerprints) IS DISTINCT FROM ns) THEN
        RAISE EXCEPTION 'segments do not match' USING ERRCODE = 'EG400';
    END IF;
    IF p_idems IS NOT NULL
       AND EXISTS (SELECT 1 FROM unnest(p_tenants, p_idems) AS u (t, k) WHERE u.k IS NOT NULL
                   GROUP BY u.t, u.k HAVING count(*) > 1) THEN
        RAISE EXCEPTION 'one idempotency key twice in one group' USING ERRCODE = 'EG400';
    END IF;
    FOR s IN 1 .. ns LOOP
        IF s > 1 AND p_tenants[s] < p_tenants[s - 1] THEN
            RAISE EXCEPTION 'segments must come in tenant order' USING ERRCODE = 'EG400';
        END IF;
        v_first[s] := k;
        v_eoff[s] := e;
        FOR q IN k .. k + p_counts[s] - 1 LOOP
            v_seg[q] := s;
        END LOOP;
        k := k + p_counts[s];
        e := e + p_counts[s]::bigint * p_dims[s] * 4;
    END LOOP;
    IF k - 1 <> cardinality(p_content) OR e <> length(p_embeddings) THEN
        RAISE EXCEPTION 'embeddings do not match the dimension' USING ERRCODE = 'EG400';
    END IF;
    -- The text search vectors and the metadata before any tenant row's lock (migration
    -- 0008): the lock is held to the commit, and another batch of the tenant waits for it.
    -- A refused segment's were computed for nothing.
    v_tsv := ARRAY(SELECT to_tsvector('english', c.t)
                   FROM unnest(p_content) WITH ORDINALITY AS c (t, i) ORDER BY c.i);
    v_md := p_metadata::jsonb[];
    v_sb := ARRAY(SELECT COALESCE(sum(octet_length(u.c) + octet_length(u.md::text)), 0)
                  FROM generate_series(1, ns) AS g (s)
                  LEFT JOIN unnest(p_content, v_md) WITH ORDINALITY AS u (c, md, i)
                         ON v_seg[u.i] = g.s
                  GROUP BY g.s ORDER BY g.s);
    s := 1;
    WHILE s <= ns LOOP
        -- the run s .. r of one tenant's segments
        r := s;
        v_total := p_counts[s];
        v_tb := v_sb[s];
        WHILE r < ns AND p_tenants[r + 1] = p_tenants[s] LOOP
            r := r + 1;
            v_total := v_total + p_counts[r];
            v_tb := v_tb + v_sb[r];
        END LOOP;
        v_keyed := p_idems IS NOT NULL
                   AND EXISTS (SELECT 1 FROM unnest(p_idems[s:r]) AS k WHERE k IS NOT NULL);
        -- the common case, every segment fits: one UPDATE takes the lock and the numbers (a
        -- row another transaction holds is skipped here when p_probe_ms is set: see above);
        -- a run with a keyed segment goes one at a time below (the lock taken there)
        UPDATE tenants t SET change_seq = t.change_seq + v_total,
                             memory_count = t.memory_count + v_total,
                             memory_bytes = t.memory_bytes + v_tb,
                             memory_id_last = t.memory_id_last + v_total
         WHERE t.id = p_tenants[s]
           AND (p_probe_ms IS NULL OR t.id IN (SELECT x.id FROM tenants x
                                               WHERE x.id = p_tenants[s]
                                               FOR UPDATE SKIP LOCKED))
           AND (engram_tier_limit(p_limits, t.tier) IS NULL
                OR t.memory_count + v_total <= engram_tier_limit(p_limits, t.tier))
           AND (engram_tier_byte_limit(p_limits, t.tier) IS NULL
                OR t.memory_bytes + v_tb <= engram_tier_byte_limit(p_limits, t.tier))
           AND (p_gens IS NULL OR t.embed_gen = ALL (p_gens[s:r]))
           AND NOT v_keyed
        RETURNING t.change_seq - v_total, t.memory_id_last - v_total INTO v_last, v_idl;
        v_busy := false;
        IF FOUND THEN
            FOR q IN s .. r LOOP
                v_seq0[q] := v_last;
                v_id0[q] := v_idl;
                v_last := v_last + p_counts[q];
                v_idl := v_idl + p_counts[q];
            END LOOP;
        ELSE
            -- held by another transaction? wait for it at most p_probe_ms (a subtransaction,
            -- entered only then; its lock_timeout goes with it)
            v_busy := p_probe_ms IS NOT NULL
                      AND NOT EXISTS (SELECT 1 FROM tenants x WHERE x.id = p_tenants[s]
                                      FOR UPDATE SKIP LOCKED)
                      AND EXISTS (SELECT 1 FROM tenants x WHERE x.id = p_tenants[s]);
            IF v_busy AND p_probe_ms > 0 THEN
                BEGIN
                    PERFORM set_config('lock_timeout', p_probe_ms || 'ms', true);
                    PERFORM 1 FROM tenants x WHERE x.id = p_tenants[s] FOR UPDATE;
                    PERFORM set_config('lock_timeout', v_lt, true);
                    v_busy := false;
                EXCEPTION WHEN lock_not_available THEN
                    v_busy := true;
                END;
            END IF;
        END IF;
        IF v_busy THEN
            -- another transaction holds the tenant's row: its requests go again alone
            FOR q IN s .. r LOOP
                v_state[q] := 'EG503';
                v_msg[q] := 'tenant busy';
                v_key[q] := q; -- after nothing of the tenant: the segments' own order
            END LOOP;
            v_total := 0;
        ELSIF v_seq0[s] IS NULL THEN
            -- some segment does not fit (or the tenant is gone): one at a time, in order
            -- (the row is ours: the UPDATE's SKIP LOCKED or the wait above took it)
            SELECT t.change_seq, t.memory_id_last, t.memory_count,
                   engram_tier_limit(p_limits, t.tier), t.memory_bytes,
                   engram_tier_byte_limit(p_limits, t.tier), t.embed_gen
                INTO v_last, v_idl, v_count, v_max, v_bytes, v_bmax, v_gen
                FROM tenants t WHERE t.id = p_tenants[s] FOR UPDATE;
            v_took := 0;
            v_btook := 0;
            FOR q IN s .. r LOOP
                v_fp := NULL;
                IF v_last IS NOT NULL AND p_idems IS NOT NULL AND p_idems[q] IS NOT NULL THEN
                    SELECT i.fingerprint, i.ids, i.created_ms INTO v_fp, v_kids, v_kcr
                      FROM idempotency_keys i
                     WHERE i.tenant_id = p_tenants[s] AND i.key = p_idems[q];
                END IF;
                IF v_last IS NULL THEN
                    v_state[q] := 'EG404';
                    v_msg[q] := 'tenant not found';
                ELSIF v_fp IS NOT NULL AND v_fp <> decode(p_fingerprints[q], 'hex') THEN
                    v_state[q] := 'EG409';
                    v_msg[q] := 'idempotency_key was used before for a different request';
                ELSIF v_fp IS NOT NULL THEN
                    -- the key's request again: its memories, as they are now (a deleted one
                    -- as a row without them, as engram_memory_store_batch answers)
                    v_key[q] := v_last + v_took;
                    v_rseg := v_rseg || array_fill(q, ARRAY[cardinality(v_kids)]);
                    v_ridx := v_ridx || ARRAY(SELECT g FROM generate_series(1, cardinality(v_kids))
                                                   AS g ORDER BY g);
                    v_rcr := v_rcr || v_kcr;
                    v_rmeta := v_rmeta || ARRAY(
                        SELECT engram_meta_of((SELECT ROW(m.*)::memories FROM memories m
                                               WHERE m.tenant_id = p_tenants[s] AND m.id = o.id))
                        FROM unnest(v_kids) WITH ORDINALITY AS o (id, i) ORDER BY o.i);
                    CONTINUE;
                ELSIF p_gens IS NOT NULL AND p_gens[q] <> v_gen THEN
                    v_state[q] := 'EG412';
                    v_msg[q] := engram_embed_gen_message();
                ELSIF v_max IS NOT NULL AND v_count + v_took + p_counts[q] > v_max THEN
                    v_state[q] := 'EG429';
                    v_msg[q] := 'memory limit reached';
                    v_detail[q] := format('limit=%s usage=%s requested=%s', v_max,
                                          v_count + v_took, p_counts[q]);
                ELSIF v_bmax IS NOT NULL AND v_sb[q] > 0
                      AND v_bytes + v_btook + v_sb[q] > v_bmax THEN
                    v_state[q] := 'EG429';
                    v_msg[q] := 'memory byte limit reached';
                    v_detail[q] := format('limit=%s usage=%s requested=%s', v_bmax,
                                          v_bytes + v_btook, v_sb[q]);
                ELSE
                    v_seq0[q] := v_last + v_took;
                    v_id0[q] := v_idl + v_took;
                    v_took := v_took + p_counts[q];
                    v_btook := v_btook + v_sb[q];
                    CONTINUE;
                END IF;
                -- sorts after the rows of the segments before it, before those after it
                v_key[q] := COALESCE(v_last, 0) + v_took;
            END LOOP;
            IF v_took > 0 THEN
                UPDATE tenants t SET change_seq = t.change_seq + v_took,
                                     memory_count = t.memory_count + v_took,
                                     memory_bytes = t.memory_bytes + v_btook,
                                     memory_id_last = t.memory_id_last + v_took
                 WHERE t.id = p_tenants[s];
            END IF;
            v_total := v_took;
        END IF;
        s := r + 1;
    END LOOP;
    -- one INSERT for every admitted memory, the change log in the same statement; rows in
    -- (tenant, change number) order are the segments' order (see above)
    RETURN QUERY
        WITH ins AS (
            INSERT INTO memories (tenant_id, id, agent_id, clade_id, scope, type, content,
                                  content_tsv, importance, metadata, embedding, created_at,
                                  updated_at, last_accessed_at, access_count, expires_at,
                                  pinned, seq)
                SELECT p_tenants[a.g], v_id0[a.g] + a.i - v_first[a.g] + 1, a.agent, a.clade,
                       a.scope, a.type, a.content, a.tsv, a.imp, a.md,
                       substring(p_embeddings
                                 FROM (v_eoff[a.g] + (a.i - v_first[a.g]) * p_dims[a.g] * 4
                                       + 1)::integer
                                 FOR p_dims[a.g] * 4),
                       date_trunc('milliseconds', COALESCE(engram_ts(a.cr), now())),
                       date_trunc('milliseconds', COALESCE(engram_ts(a.up), engram_ts(a.cr), now())),
                       date_trunc('milliseconds', engram_ts(a.acc)),
                       COALESCE(a.cnt, 0), engram_ts(a.ex), COALESCE(a.pin, false),
                       v_seq0[a.g] + a.i - v_first[a.g] + 1
                FROM (SELECT u.*, v_seg[u.i] AS g
                      FROM unnest(p_agent, p_clade, p_scope, p_type, p_content, p_importance,
                                  v_md, p_created_ms, p_updated_ms, p_accessed_ms,
                                  p_access_count, p_expires_ms, p_pinned, v_tsv)
                           WITH ORDINALITY AS u (agent, clade, scope, type, content, imp, md,
                                                 cr, up, acc, cnt, ex, pin, tsv, i)) a
                WHERE v_seq0[a.g] IS NOT NULL
                -- not the content and embedding: copied into the CTE's store for nothing
                RETURNING tenant_id, id, seq, agent_id, clade_id, scope, type, importance,
                          created_at, last_accessed_at, access_count, expires_at, archived_at,
                          pinned),
        ch AS (
            INSERT INTO memory_changes (tenant_id, seq, memory_id, op)
                SELECT m.tenant_id, m.seq, m.id, 'u' FROM ins m),
        -- the keys of the keyed segments stored now, with their ids and creation times (as
        -- engram_memory_store_batch records them)
        kz AS (
            INSERT INTO idempotency_keys (tenant_id, key, fingerprint, ids, created_ms)
                SELECT p_tenants[g.s], p_idems[g.s], decode(p_fingerprints[g.s], 'hex'),
                       ARRAY(SELECT v_id0[g.s] + x FROM generate_series(1, p_counts[g.s]) AS x
                             ORDER BY x),
                       ARRAY(SELECT engram_ms(date_trunc('milliseconds', COALESCE(
                                        engram_ts(p_created_ms[v_first[g.s] + x - 1]), now())))
                             FROM generate_series(1, p_counts[g.s]) AS x ORDER BY x)
                FROM generate_series(1, ns) AS g (s)
                WHERE p_idems IS NOT NULL AND p_idems[g.s] IS NOT NULL
                  AND v_seq0[g.s] IS NOT NULL)
        SELECT x.idx, x.replay, x.r_created_ms, x.m_id, x.m_seq, x.m_agent_id, x.m_clade_id,
               x.m_scope, x.m_type, x.m_importance, x.m_created_ms, x.m_accessed_ms,
               x.m_access_count, x.m_expires_ms, x.m_archived_ms, x.m_pinned, x.m_tags,
               x.err_state, x.err_message, x.err_detail
        FROM (
            SELECT m.tenant_id AS t, 2 * m.seq AS o, 0 AS sg, NULL::integer AS idx,
                   false AS replay,
                   engram_ms(m.created_at) AS r_created_ms, m.id AS m_id, m.seq AS m_seq,
                   m.agent_id AS m_agent_id, m.clade_id AS m_clade_id, m.scope AS m_scope,
                   m.type AS m_type, m.importance AS m_importance,
                   engram_ms(m.created_at) AS m_created_ms,
                   engram_ms(m.last_accessed_at) AS m_accessed_ms,
                   m.access_count AS m_access_count, engram_ms(m.expires_at) AS m_expires_ms,
                   engram_ms(m.archived_at) AS m_archived_ms, m.pinned AS m_pinned,
                   NULL::text AS m_tags, NULL::text AS err_state, NULL::text AS err_message,
                   NULL::text AS err_detail
            FROM ins m
            UNION ALL
            -- refusals and replays sort after the rows of the tenant's segments before them
            -- and before those after (several in a row: in segment order, sg)
            SELECT p_tenants[f.s], 2 * v_key[f.s] + 1, f.s, NULL, NULL, NULL, NULL, NULL, NULL,
                   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                   v_state[f.s], v_msg[f.s], v_detail[f.s]
            FROM generate_series(1, ns) AS f (s)
            WHERE v_state[f.s] IS NOT NULL
            UNION ALL
            -- (unnest spreads the composite array's columns: m_id .. m_tags)
            SELECT p_tenants[r.s], 2 * v_key[r.s] + 1, r.s, r.i, true, r.cr, r.m_id, r.m_seq,
                   r.m_agent_id, r.m_clade_id, r.m_scope, r.m_type, r.m_importance,
                   r.m_created_ms, r.m_accessed_ms, r.m_access_count, r.m_expires_ms,
                   r.m_archived_ms, r.m_pinned, r.m_tags, NULL, NULL, NULL
            FROM unnest(v_rseg, v_ridx, v_rcr, v_rmeta) AS r (s, i, cr)) x
        ORDER BY x.t, x.o, x.sg, x.idx;
END $$;
ALTER FUNCTION engram_memory_store_group(bigint[], integer[], integer[], bigint[], bigint[],
    bigint[], text[], text[], text[], double precision[], text[], bytea, bigint[], bigint[],
    bigint[], bigint[], bigint[], boolean[], bigint[], integer, text[], text[])
    SET plan_cache_mode = force_generic_plan;
-- The form of the previous release (no keys), for its processes while a fleet is upgraded
-- one process at a time: their statement calls it with twenty arguments (the keyed form
-- takes no defaults, so a call names one form or the other).
CREATE OR REPLACE FUNCTION engram_memory_store_group(
        p_tenants bigint[], p_counts integer[], p_dims integer[], p_limits bigint[],
        p_agent bigint[], p_clade bigint[], p_scope text[], p_type text[], p_content text[],
        p_importance double precision[], p_metadata text[], p_embeddings bytea,
        p_created_ms bigint[], p_updated_ms bigint[], p_accessed_ms bigint[],
        p_access_count bigint[], p_expires_ms bigint[], p_pinned boolean[],
        p_gens bigint[] DEFAULT NULL, p_probe_ms integer DEFAULT NULL)
    RETURNS TABLE (idx integer, replay boolean, r_created_ms bigint, m_id bigint, m_seq bigint,
                   m_agent_id bigint, m_clade_id bigint, m_scope text, m_type text,
                   m_importance double precision, m_created_ms bigint, m_accessed_ms bigint,
                   m_access_count bigint, m_expires_ms bigint, m_archived_ms bigint,
                   m_pinned boolean, m_tags text, err_state text, err_message text,
                   err_detail text)
    LANGUAGE sql AS $$
    SELECT * FROM engram_memory_store_group(p_tenants, p_counts, p_dims, p_limits, p_agent,
        p_clade, p_scope, p_type, p_content, p_importance, p_metadata, p_embeddings,
        p_created_ms, p_updated_ms, p_accessed_ms, p_access_count, p_expires_ms, p_pinned,
        p_gens, p_probe_ms, NULL::text[], NULL::text[])
$$;
-- No JIT: the generic plan of the final statement is costed for a thousand segments (the
-- planner's guess for generate_series and unnest over parameters), over jit_above_cost
-- since the keys' CTE came, and compiling it took about 20 ms of every call (0.65 ms
-- without, measured in psql; 23 to 18 ms of PostgreSQL CPU a store in bench/citus-cost.sh).
ALTER FUNCTION engram_memory_store_group(bigint[], integer[], integer[], bigint[], bigint[],
    bigint[], text[], text[], text[], double precision[], text[], bytea, bigint[], bigint[],
    bigint[], bigint[], bigint[], boolean[], bigint[], integer, text[], text[])
    SET jit = off;

-- engram_memory_touch adds a batch of access counts (the server's, about once a second per
-- worker) to memory_access. Returns the number of entries.
--
-- The rows mostly exist already (a memory read now was usually read a second ago, and a
-- row stays until the maintenance folds it, 10 minutes after the last read), so they are
-- updated in place first, and only when some were missing does an INSERT ... ON CONFLICT
-- add the rest (it locks each row it finds before updating it: one more WAL record and
-- buffer change per row). 8,500 existing entries took 61 to 99 ms through INSERT ... ON
-- CONFLICT alone, with the times converted through numeric division per row. The entries
-- come sorted by (tenant, id), so two batches lock the rows they share in one order
-- whichever drives the join, the sorted input or the table's scan order; should a batch
-- still fail (a deadlock between processes), the server keeps its counts for the next
-- one. A row that the maintenance folds away meanwhile is not updated, and its count is
-- inserted again. The insert takes exactly the entries the update did not reach (it
-- returns the ones it did): filtering on the rows the insert's own snapshot sees lost the
-- counts of a row another worker inserted between the two statements (test_access_counts:
-- 178 of 181 accesses written).
CREATE OR REPLACE FUNCTION engram_memory_touch(p_tenant bigint[], p_ids bigint[], p_counts bigint[],
                                    p_at_ms bigint[])
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_t bigint[];
    v_i bigint[];
BEGIN
    WITH done AS (
        UPDATE memory_access a SET
            access_count = a.access_count + u.cnt,
            last_accessed_at = greatest(a.last_accessed_at,
                                        'epoch'::timestamptz + u.at * interval '1 millisecond')
          FROM unnest(p_tenant, p_ids, p_counts, p_at_ms) AS u (tenant, id, cnt, at)
         WHERE a.tenant_id = u.tenant AND a.id = u.id
        RETURNING a.tenant_id, a.id)
    SELECT array_agg(done.tenant_id), array_agg(done.id) INTO v_t, v_i FROM done;
    IF coalesce(cardinality(v_i), 0) < cardinality(p_ids) THEN
        INSERT INTO memory_access AS a (tenant_id, id, access_count, last_accessed_at)
        SELECT u.tenant, u.id, u.cnt, 'epoch'::timestamptz + u.at * interval '1 millisecond'
          FROM unnest(p_tenant, p_ids, p_counts, p_at_ms) AS u (tenant, id, cnt, at)
         WHERE NOT EXISTS (SELECT 1 FROM unnest(v_t, v_i) AS d (tenant, id)
                            WHERE d.tenant = u.tenant AND d.id = u.id)
         ORDER BY u.tenant, u.id
        ON CONFLICT (tenant_id, id) DO UPDATE SET
            access_count = a.access_count + excluded.access_count,
            last_accessed_at = greatest(a.last_accessed_at, excluded.last_accessed_at);
    END IF;
    RETURN cardinality(p_ids);
END $$;

-- engram_access_fold moves up to p_limit pending counts into memories and returns how many
-- it moved: those of memories last read p_idle_s seconds ago or earlier (a memory read all
-- the time keeps its count here, in a narrow row, instead of having its whole row, embedding
-- and index entries included, rewritten at every fold; every reader adds the pending count).
-- Entries a batch is writing at that moment stay for the next fold.
DROP FUNCTION IF EXISTS engram_access_fold(integer);
CREATE OR REPLACE FUNCTION engram_access_fold(p_limit integer, p_idle_s integer)
    RETURNS bigint
    LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH picked AS (
        SELECT tenant_id, id FROM memory_access
         WHERE last_accessed_at <= now() - make_interval(secs => p_idle_s)
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
