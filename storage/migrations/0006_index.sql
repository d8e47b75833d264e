-- 0006_index: what index snapshots need from the database.
--
-- engram_instance names this database: snapshots live under a directory of that name and
-- the database's oid, so a snapshot is never applied to another database that happens to
-- use the same tenant ids (nor to a dump of this one restored elsewhere). memory_changes gains the commit time of each change so that old changes can be
-- pruned; a snapshot older than the oldest change kept is detected by the gap in the log
-- and rebuilt from the memories.

CREATE TABLE engram_instance (
    id  text NOT NULL
);
INSERT INTO engram_instance
    SELECT md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text);
GRANT SELECT ON engram_instance TO engram_app;
REVOKE INSERT, UPDATE, DELETE ON engram_instance FROM engram_app;

ALTER TABLE memory_changes ADD COLUMN committed_at timestamptz NOT NULL DEFAULT now();

-- engram_prune_changes: deletes up to p_limit changes older than p_hours, oldest first, and
-- returns how many it deleted. Cross-tenant, so SECURITY DEFINER.
CREATE FUNCTION engram_prune_changes(p_hours double precision, p_limit integer)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    n bigint;
BEGIN
    DELETE FROM memory_changes c
     USING (SELECT tenant_id, seq FROM memory_changes
             WHERE committed_at < now() - make_interval(secs => p_hours * 3600)
             ORDER BY committed_at LIMIT p_limit) old
     WHERE c.tenant_id = old.tenant_id AND c.seq = old.seq;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
REVOKE ALL ON FUNCTION engram_prune_changes(double precision, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION engram_prune_changes(double precision, integer) TO engram_app;

-- Pruning scans by age.
CREATE INDEX memory_changes_committed ON memory_changes (committed_at);

-- engram_memory_touch never waits for a row lock: it skips the memories a writer holds at
-- that moment and returns them (the server adds their counts to its next batch). Waiting,
-- it could deadlock with a delete or a consolidation step locking the same rows in
-- another order, and the victim could be the client's write.
DROP FUNCTION engram_memory_touch(bigint[], bigint[], bigint[], bigint[]);
CREATE FUNCTION engram_memory_touch(p_tenant bigint[], p_ids bigint[], p_counts bigint[],
                                    p_at_ms bigint[])
    RETURNS TABLE (o_tenant bigint, o_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT m.tenant_id, m.id FROM memories m
          JOIN unnest(p_tenant, p_ids) AS u (tenant, id) ON m.tenant_id = u.tenant AND m.id = u.id
         ORDER BY m.tenant_id, m.id
           FOR UPDATE OF m SKIP LOCKED
    ), done AS (
        UPDATE memories m SET
            access_count = m.access_count + u.cnt,
            last_accessed_at = greatest(m.last_accessed_at,
                                        date_trunc('milliseconds', engram_ts(u.at)))
          FROM locked l, unnest(p_tenant, p_ids, p_counts, p_at_ms) AS u (tenant, id, cnt, at)
         WHERE m.tenant_id = l.tenant_id AND m.id = l.id AND u.tenant = l.tenant_id AND u.id = l.id
        RETURNING m.tenant_id, m.id
    )
    SELECT u.tenant, u.id FROM unnest(p_tenant, p_ids) AS u (tenant, id)
     WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.tenant_id = u.tenant AND d.id = u.id)
       AND EXISTS (SELECT 1 FROM memories m WHERE m.tenant_id = u.tenant AND m.id = u.id);
END $$;
REVOKE ALL ON FUNCTION engram_memory_touch(bigint[], bigint[], bigint[], bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION engram_memory_touch(bigint[], bigint[], bigint[], bigint[])
    TO engram_app;
