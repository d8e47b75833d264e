-- Archived memories stop counting against the tier's memory limit, and the composite
-- importance is no longer stored.
--
-- tenants.memory_count now counts the tenant's live memories only (archived_at NULL): the
-- memory functions move it on every store, delete, archive, restore and consolidation
-- step, under the tenant row's lock, as before. Here it is recounted once from the rows.
--
-- memories.composite and composite_at were written by consolidation's re-rank and read by
-- nothing: every read (search, memory.list order_by composite, min_composite, the prune)
-- computes the composite as of the request from the row, with the pending access counts.
ALTER TABLE memories DROP COLUMN composite, DROP COLUMN composite_at;

UPDATE tenants t SET memory_count = (SELECT count(*) FROM memories m
                                     WHERE m.tenant_id = t.id AND m.archived_at IS NULL);
