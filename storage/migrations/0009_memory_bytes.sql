-- A byte quota per tenant beside the memory count (issue 30: a free tenant's 100 memories
-- could hold about 1.4 GB in metadata).
--
-- memories.bytes and memory_versions.bytes are the text a row holds: its content and its
-- metadata as jsonb prints it, in bytes, computed by PostgreSQL itself so no writer can get
-- it wrong. tenants.memory_bytes is their sum over the tenant's memories, live and archived,
-- and the earlier versions kept of them (memory.history): what the tenant's memories take,
-- moved by every writer under the tenant row's lock, as memory_count is. Stores, updates,
-- archives and restores are refused (EG429) when they would pass the tier's byte limit;
-- consolidation keeps versions without a check (it is the server's own work) and delete
-- frees a memory's bytes with its versions'.
--
-- Adding a stored generated column rewrites both tables once (about as long as a VACUUM
-- FULL of them; docs/operations.md, upgrading).
ALTER TABLE memories
    ADD COLUMN bytes integer NOT NULL
        GENERATED ALWAYS AS (octet_length(content) + octet_length(metadata::text)) STORED;
ALTER TABLE memory_versions
    ADD COLUMN bytes integer NOT NULL
        GENERATED ALWAYS AS (octet_length(content) + octet_length(metadata::text)) STORED;
ALTER TABLE tenants ADD COLUMN memory_bytes bigint NOT NULL DEFAULT 0;
UPDATE tenants t SET memory_bytes =
    COALESCE((SELECT sum(m.bytes) FROM memories m WHERE m.tenant_id = t.id), 0)
    + COALESCE((SELECT sum(v.bytes) FROM memory_versions v WHERE v.tenant_id = t.id), 0);
