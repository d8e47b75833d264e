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

