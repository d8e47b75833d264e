-- storage/functions/10_core.sql: Time conversions and the change numbering every write shares.
--
-- Repeatable: engramd applies this file whole, in one transaction, whenever its checksum
-- differs from the one recorded in schema_functions (see storage/migrate.h). Every
-- definition is CREATE OR REPLACE; a change of a function's arguments or result type
-- needs a DROP FUNCTION IF EXISTS of the old signature above the new definition.

-- engram_ms / engram_ts: timestamptz to and from milliseconds since the epoch (the wire
-- unit). engram_ms is STABLE, as its body is (extract of epoch from timestamptz): declared
-- IMMUTABLE it would not be inlined, and every query that reports a time would run it as a
-- separate SQL function call per row.
CREATE OR REPLACE FUNCTION engram_ms(t timestamptz) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT (extract(epoch FROM t) * 1000)::bigint $$;

CREATE OR REPLACE FUNCTION engram_ts(ms bigint) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT to_timestamp(ms / 1000.0) $$;

-- engram_next_seq: takes the tenant row's lock, reserves n change numbers and returns the
-- last one. Raises EG404 when the tenant does not exist. Callers run it first in their
-- transaction so changes commit in the order of their numbers.
CREATE OR REPLACE FUNCTION engram_next_seq(p_tenant bigint, n bigint) RETURNS bigint
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

-- engram_memory_delete: deletes the tenant's memories among p_ids; returns each deleted id
-- with its change number. Ids that do not exist (or belong to another tenant) are skipped.
-- tenants.memory_count counts live memories only: archived ones deleted leave it alone.
-- tenants.memory_bytes gives back the bytes of the memories and of their kept versions
-- (which go with them).
CREATE OR REPLACE FUNCTION engram_memory_delete(p_tenant bigint, p_ids bigint[])
    RETURNS TABLE (id bigint, seq bigint)
    LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    v_n bigint;
    v_live bigint;
    v_last bigint;
    v_bytes bigint;
    v_vbytes bigint;
BEGIN
    PERFORM engram_next_seq(p_tenant, 0);  -- take the tenant row's lock first
    -- the versions go with their memories (ON DELETE CASCADE); every writer of versions holds
    -- this lock, so none is added in between
    SELECT COALESCE(sum(v.bytes), 0) INTO v_vbytes FROM memory_versions v
    WHERE v.tenant_id = p_tenant AND v.memory_id = ANY (p_ids);
    WITH d AS (
        DELETE FROM memories m WHERE m.tenant_id = p_tenant AND m.id = ANY (p_ids)
        RETURNING m.id, m.archived_at IS NULL AS live, m.bytes
    )
    SELECT array_agg(d.id ORDER BY d.id), count(*) FILTER (WHERE d.live),
           COALESCE(sum(d.bytes), 0)
        INTO v_ids, v_live, v_bytes
    FROM d;
    v_n := COALESCE(cardinality(v_ids), 0);
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_last := engram_next_seq(p_tenant, v_n);
    UPDATE tenants SET memory_count = memory_count - v_live,
                       memory_bytes = memory_bytes - v_bytes - v_vbytes
        WHERE tenants.id = p_tenant;
    INSERT INTO memory_changes
        SELECT p_tenant, v_last - v_n + o.n, o.id, 'd' FROM unnest(v_ids) WITH ORDINALITY AS o (id, n);
    PERFORM pg_notify('engram_changes', p_tenant || ':' || v_last);
    RETURN QUERY SELECT o.id, v_last - v_n + o.n FROM unnest(v_ids) WITH ORDINALITY AS o (id, n);
END $$;
ALTER FUNCTION engram_memory_delete(bigint, bigint[]) SET plan_cache_mode = force_generic_plan;

-- engram_change_seqs: the last change number of each of the tenants p_ids (those that
-- exist), for the servers' periodic change check (server/domain/bg.c): a change committed
-- without a NOTIFY (store groups announce theirs after the commit; a server that died in
-- between sent none) reaches the other servers' indexes by it. SECURITY DEFINER because the
-- check covers every loaded tenant and row-level security shows a connection one tenant's
-- row at most; it returns nothing but ids and change numbers.
CREATE OR REPLACE FUNCTION engram_change_seqs(p_ids bigint[])
    RETURNS TABLE (id bigint, change_seq bigint)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT t.id, t.change_seq FROM tenants t WHERE t.id = ANY(p_ids)
$$;
