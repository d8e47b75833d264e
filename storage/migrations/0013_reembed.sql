-- 0013_reembed: online re-embedding of a tenant (issue 33, item 4; admin.tenant.update
-- {embedding}).
--
-- tenants.embed_gen numbers the tenant's embedding models: every swap to a new model bumps
-- it under the tenant row's lock. A write whose vectors were computed under generation G
-- passes G, and the statement refuses it (EG412) when the tenant has moved on, so no vector
-- of the old model lands after the swap (storage/functions/20_memory.sql).
ALTER TABLE tenants ADD COLUMN embed_gen bigint NOT NULL DEFAULT 0;

-- reembed_jobs: a tenant's re-embedding in progress (at most one): the target model, the
-- progress (done counts vectors written to the side table, failures the provider's failed
-- batches), the last error and when the job may try the provider again (retry_at, its
-- backoff after a failure: backoff_ms). cursor is the highest memory id written: the job
-- goes through the memories in id order from there, and starts again from 0 when the swap
-- finds a memory whose vector went stale behind it. The job is worked on by one engramd at a time (a
-- session-level advisory lock, server/domain/reembed.c); a process that dies drops its lock
-- with its connection, and the next one resumes from what memory_reembed holds.
CREATE TABLE reembed_jobs (
    tenant_id     bigint PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    provider      text NOT NULL,
    model         text NOT NULL,
    dim           integer NOT NULL CHECK (dim BETWEEN 1 AND 4096),
    from_gen      bigint NOT NULL,       -- the generation the job started from
    started_at    timestamptz NOT NULL DEFAULT date_trunc('milliseconds', now()),
    done          bigint NOT NULL DEFAULT 0,
    failures      bigint NOT NULL DEFAULT 0,
    last_error    text,
    last_error_at timestamptz,
    retry_at      timestamptz,
    backoff_ms    integer NOT NULL DEFAULT 0,
    cursor        bigint NOT NULL DEFAULT 0
);
ALTER TABLE reembed_jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON reembed_jobs USING (tenant_id = engram_current_tenant());
GRANT SELECT ON reembed_jobs TO engram_app;

-- memory_reembed: the side table, one vector of the target model per memory, with the
-- SHA-256 of the content it was computed from. A memory deleted takes its side vector with
-- it (the foreign key); a memory whose content changes loses it (engram_reembed_stale) and
-- the job computes it again; the swap takes only vectors whose hash matches the content.
CREATE TABLE memory_reembed (
    tenant_id     bigint NOT NULL,
    memory_id     bigint NOT NULL,
    content_hash  bytea NOT NULL,
    embedding     bytea NOT NULL,
    PRIMARY KEY (tenant_id, memory_id),
    FOREIGN KEY (tenant_id, memory_id) REFERENCES memories (tenant_id, id) ON DELETE CASCADE
);
ALTER TABLE memory_reembed ALTER COLUMN embedding SET STORAGE EXTERNAL;
-- written and read only by the SECURITY DEFINER functions of 39_reembed.sql (and the foreign
-- key's cascade): engram_app has no grant; the policy is the second line all tables have
ALTER TABLE memory_reembed ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON memory_reembed USING (tenant_id = engram_current_tenant());

CREATE FUNCTION engram_reembed_stale() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM memory_reembed s WHERE s.tenant_id = NEW.tenant_id AND s.memory_id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_reembed_stale AFTER UPDATE OF content ON memories
    FOR EACH ROW WHEN (OLD.content IS DISTINCT FROM NEW.content)
    EXECUTE FUNCTION engram_reembed_stale();
