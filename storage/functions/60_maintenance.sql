-- storage/functions/60_maintenance.sql: Maintenance of the change log.
--
-- Repeatable: engramd applies this file whole, in one transaction, whenever its checksum
-- differs from the one recorded in schema_functions (see storage/migrate.h). Every
-- definition is CREATE OR REPLACE; a change of a function's arguments or result type
-- needs a DROP FUNCTION IF EXISTS of the old signature above the new definition.

-- engram_prune_changes: deletes up to p_limit changes older than p_hours, oldest first, and
-- returns how many it deleted. Cross-tenant, so SECURITY DEFINER.
CREATE OR REPLACE FUNCTION engram_prune_changes(p_hours double precision, p_limit integer)
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
