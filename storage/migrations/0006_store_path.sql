-- Less work per stored memory (issue 18).
--
-- Measured with pg_walinspect over 200 single stores (768 dimensions): every memory also
-- cost a row lock record on its tenant (54 bytes a store) and two foreign-key checks (one SPI
-- query each, run as an after-row trigger). (A BRIN index in place of the change log's
-- commit-time B-tree was tried: it writes a record per insert too, as the newest time widens
-- its range every time, so the B-tree stays.)
--
-- memories and memory_changes no longer reference tenants. Every function that writes them
-- first locks (and moves the counters of) the tenant's row in the same transaction, so the
-- tenant exists until the rows commit: the check was redundant, and its FOR KEY SHARE lock
-- wrote a WAL record per memory. engram_admin_tenant_delete deletes the tenant's memories
-- and changes itself, after the tenant row (whose lock keeps new stores out: they find the
-- tenant gone, EG404), as the cascade did.
ALTER TABLE memories DROP CONSTRAINT memories_tenant_id_fkey;
ALTER TABLE memory_changes DROP CONSTRAINT memory_changes_tenant_id_fkey;

-- An embedding stays in the row while the row fits a page: a 768-dimension embedding (3 KiB)
-- was stored out of line, two TOAST chunks, each a heap tuple and a TOAST index entry, and
-- toast_save_datum was an eighth of a store's PostgreSQL CPU. Embeddings too large for the
-- row (over about 1,900 dimensions) still go out of line. Only new rows are affected. The
-- rows are wider (scans that skip the embedding read more pages), and the index loads read
-- the embeddings from the row instead of the TOAST table.
ALTER TABLE memories SET (toast_tuple_target = 8160);
