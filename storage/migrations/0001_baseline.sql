-- 0001_baseline: the whole schema: tenants and keys, memories and their change log,
-- sessions, consolidation runs, quotas, and the database role the server runs as.
--
-- Functions live in storage/functions/ (applied by checksum after the migrations), except
-- the two the schema itself refers to: engram_current_tenant (every row-level security
-- policy) and engram_assign_id (the id triggers). Later schema changes are forward-only
-- numbered migrations after this one.
--
-- Conventions: every tenant-owned table carries tenant_id and is keyed by it first, and
-- its ids are numbered per tenant (tenant_counters, tenants.memory_id_last), so the ids
-- a tenant sees reveal nothing about other tenants. Timestamps are timestamptz truncated to
-- milliseconds (the wire unit). Unsigned 64-bit identities from clients (agent_id,
-- clade_id) are stored in bigint as the same 64 bits.
--
-- Errors raised by the functions: EG400 invalid_argument, EG402 cost_limit_exceeded,
-- EG403 permission_denied, EG404 not_found, EG409 conflict, EG410 already exists, EG429
-- quota_exceeded. EG402 and EG429 carry DETAIL 'limit=N usage=M ...', which the server
-- turns into fields of the error.

CREATE EXTENSION IF NOT EXISTS btree_gin;

-- ---- the server's role ------------------------------------------------------------------
--
-- The server connects with the configured DSN (whose user owns the schema and runs the
-- migrations) and then switches to engram_app (SET ROLE, setting pg_role), a role that owns
-- no table and bypasses no policy. Every tenant request sets engram.tenant_id in its
-- transaction; the policies below then show it that tenant's rows only. The few operations
-- that must cross tenants (authentication, administration, maintenance, batched access
-- counts) are SECURITY DEFINER functions with a fixed search_path.
DO $$
BEGIN
    CREATE ROLE engram_app NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- one role serves every database of the cluster
END $$;
DO $$
BEGIN
    EXECUTE format('GRANT engram_app TO %I', current_user);
EXCEPTION WHEN duplicate_object OR insufficient_privilege THEN
    NULL;  -- already granted, or the DSN's user is a superuser that needs no grant
END $$;

-- The tenant a transaction acts for (engram.tenant_id), NULL when none is set.
CREATE FUNCTION engram_current_tenant() RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT NULLIF(current_setting('engram.tenant_id', true), '')::bigint $$;

-- ---- tenants and keys -------------------------------------------------------------------

-- tenants.change_seq numbers every change to a tenant's memories without gaps and in
-- commit order (it is bumped under the tenant row's lock), which is what lets vector
-- indexes follow the database exactly: see memory_changes. memory_id_last is the last
-- memory id handed out in the tenant, moved under the same lock.
CREATE TABLE tenants (
    id              bigserial PRIMARY KEY,
    name            text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 128),
    tier            text NOT NULL CHECK (tier IN ('free', 'standard', 'premium')),
    embed_provider  text NOT NULL DEFAULT 'builtin',
    embed_model     text NOT NULL DEFAULT '',
    embed_dim       integer NOT NULL CHECK (embed_dim BETWEEN 1 AND 4096),
    change_seq      bigint NOT NULL DEFAULT 0,
    memory_count    bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT date_trunc('milliseconds', now()),
    updated_at      timestamptz NOT NULL DEFAULT date_trunc('milliseconds', now()),
    -- the engine of the index's approximate tier: 'native' or 'faiss', NULL: the server's
    -- index_engine setting. A property of the in-memory index only.
    index_engine    text CHECK (index_engine IN ('native', 'faiss')),
    memory_id_last  bigint NOT NULL DEFAULT 0
);

CREATE TABLE api_keys (
    id            bigserial PRIMARY KEY,
    tenant_id     bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name          text NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    key_id        text NOT NULL UNIQUE,      -- the public part of the key, for lookup
    key_hash      bytea NOT NULL,            -- HMAC-SHA-256 of the whole key, server secret
    created_at    timestamptz NOT NULL DEFAULT date_trunc('milliseconds', now()),
    last_used_at  timestamptz,
    revoked_at    timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

-- Queries counted per tenant and UTC day.
CREATE TABLE tenant_usage (
    tenant_id  bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    day        date NOT NULL,
    queries    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day)
);

-- The last id of each kind handed out in a tenant (engram_next_id), for the tables whose
-- ids the id triggers assign. Locked until the transaction ends, so a tenant's ids of one
-- kind are handed out in commit order; a tenant's writes never wait for another's.
CREATE TABLE tenant_counters (
    tenant_id bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    kind      text NOT NULL CHECK (kind IN ('session', 'session_entry', 'session_note',
                                            'session_snap', 'session_checkpoint',
                                            'consolidation_run')),
    last      bigint NOT NULL,
    PRIMARY KEY (tenant_id, kind)
);

-- This database's name for index snapshots: snapshots live under a directory of that name
-- and the database's oid, so a snapshot is never applied to another database that happens
-- to use the same tenant ids (nor to a dump of this one restored elsewhere).
CREATE TABLE engram_instance (
    id  text NOT NULL
);
INSERT INTO engram_instance
    SELECT md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text);

-- ---- memories ---------------------------------------------------------------------------

CREATE TABLE memories (
    tenant_id         bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id                bigint NOT NULL,   -- the tenant's own numbering (tenants.memory_id_last)
    agent_id          bigint NOT NULL DEFAULT 0,
    clade_id          bigint NOT NULL DEFAULT 0,
    scope             text NOT NULL DEFAULT 'agent' CHECK (scope IN ('agent', 'clade', 'tenant')),
    type              text NOT NULL CHECK (type IN ('fact', 'preference', 'episode',
                                                    'strategy_outcome', 'constraint')),
    content           text NOT NULL,
    importance        double precision NOT NULL CHECK (importance >= 0 AND importance <= 1),
    metadata          jsonb NOT NULL DEFAULT '{}',
    -- float32 little-endian; noise to a compressor, so stored out of line without trying
    embedding         bytea NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    last_accessed_at  timestamptz,
    access_count      bigint NOT NULL DEFAULT 0,   -- folded; pending ones in memory_access
    expires_at        timestamptz,
    archived_at       timestamptz,
    version           integer NOT NULL DEFAULT 1,
    seq               bigint NOT NULL,             -- the change number of the last change
    pinned            boolean NOT NULL DEFAULT false,
    archived_reason   text,
    superseded_by     bigint,
    merged_into       bigint,
    content_tsv       tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    composite         double precision,   -- stored by writes and consolidation re-ranks
    composite_at      timestamptz,
    PRIMARY KEY (tenant_id, id)
);
ALTER TABLE memories ALTER COLUMN embedding SET STORAGE EXTERNAL;
CREATE INDEX memories_tenant_created ON memories (tenant_id, created_at, id);
-- full-text search within a tenant, metadata containment within a tenant, expiry purge
CREATE INDEX memories_fts ON memories USING gin (tenant_id, content_tsv);
CREATE INDEX memories_metadata ON memories USING gin (tenant_id, metadata jsonb_path_ops);
CREATE INDEX memories_expiry ON memories (expires_at) WHERE expires_at IS NOT NULL;

-- One row per change to a tenant's memories, numbered by tenants.change_seq. Indexes
-- replay it after a snapshot, and other engramd processes follow it (NOTIFY
-- engram_changes, payload "tenant:seq"). Old changes are pruned by commit time; a snapshot
-- older than the oldest change kept is detected by the gap and rebuilt from the memories.
CREATE TABLE memory_changes (
    tenant_id     bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    seq           bigint NOT NULL,
    memory_id     bigint NOT NULL,
    op            "char" NOT NULL CHECK (op IN ('u', 'd')),
    committed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, seq)
);
CREATE INDEX memory_changes_committed ON memory_changes (committed_at);

-- Earlier states of a memory, one row per change that replaced it (an update, an archive,
-- a restore, a merge or a supersession). The live row is the newest version.
CREATE TABLE memory_versions (
    tenant_id   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    memory_id   bigint NOT NULL,
    version     integer NOT NULL,
    content     text NOT NULL,
    type        text NOT NULL,
    importance  double precision NOT NULL,
    metadata    jsonb NOT NULL,
    expires_at  timestamptz,
    archived_at timestamptz,
    valid_from  timestamptz NOT NULL,  -- when this version became current
    replaced_at timestamptz NOT NULL,  -- when the next one replaced it
    change      text NOT NULL,         -- what replaced it: update, archive, restore, merge, supersede
    detail      jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant_id, memory_id, version),
    FOREIGN KEY (tenant_id, memory_id) REFERENCES memories (tenant_id, id) ON DELETE CASCADE
);

-- A retried write with the same key returns what the first one returned.
CREATE TABLE idempotency_keys (
    tenant_id    bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key          text NOT NULL,
    fingerprint  bytea NOT NULL,   -- hash of the request, so a reused key with other data is refused
    ids          bigint[] NOT NULL,
    created_ms   bigint[] NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);

-- Access counts land here first: every memory a search returns counts as an access, and
-- adding to this narrow row is much cheaper than rewriting the wide memory row (and its
-- index entries) per read. The maintenance task folds the pending counts into memories
-- every maintenance interval; readers that report access counts add the pending ones (see
-- SQL_MEMROW_COLS, SQL_ACCESS_COUNT and the index loaders). No foreign key to memories: it
-- would make a batch wait for a delete holding the row; counts of deleted memories are
-- dropped by the next fold.
CREATE TABLE memory_access (
    tenant_id         bigint NOT NULL,
    id                bigint NOT NULL,
    access_count      bigint NOT NULL,
    last_accessed_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

-- The state of a memory that an index needs, as every change function returns it (the
-- columns memrow_meta_parse reads). m_tags: the typed metadata fields as a JSON array
-- [tokens, chains, protocols, strategy_id], from which the server derives the tags; NULL
-- from a store (the server derives them from the request).
CREATE TYPE engram_memory_meta AS (
    m_id bigint, m_seq bigint, m_agent_id bigint, m_clade_id bigint, m_scope text,
    m_type text, m_importance double precision, m_created_ms bigint, m_accessed_ms bigint,
    m_access_count bigint, m_expires_ms bigint, m_archived_ms bigint, m_pinned boolean,
    m_tags text);

-- ---- sessions ---------------------------------------------------------------------------
--
-- The transcript is an append-only log numbered by seq within a session. Tombstones and
-- compaction summaries are entries of the log themselves, so the transcript as of any
-- position is fixed forever: a checkpoint records a position and never copies entries. A
-- session created by session.resume inherits the transcript of the session it branched
-- from up to the checkpoint's position (base_session_id, base_seq) and numbers its own
-- entries after it.
--
-- Checkpoints store deltas: the scalar state (costs, counters) whole, the scratchpad only
-- when its version changed since the previous checkpoint of the session, and the set of
-- live notes as ids added and removed since the previous checkpoint.

CREATE TABLE sessions (
    tenant_id             bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id                    bigint NOT NULL,  -- the tenant's own numbering (sessions_id trigger)
    agent_id              bigint NOT NULL,
    parent_id             bigint,           -- sub-agent sessions: the session that spawned it
    state                 text NOT NULL DEFAULT 'active'
                          CHECK (state IN ('active', 'ended', 'completed')),
    config                jsonb NOT NULL,
    max_cost_usdc         numeric CHECK (max_cost_usdc >= 0),
    total_cost_usdc       numeric NOT NULL DEFAULT 0,  -- own appends plus sub-agents'
    children_cost_usdc    numeric NOT NULL DEFAULT 0,  -- the sub-agents' share of it
    -- transcript
    base_session_id       bigint,           -- transcript inherited from this session ...
    base_seq              bigint NOT NULL DEFAULT 0,   -- ... up to this position
    position              bigint NOT NULL DEFAULT 0,   -- seq of the last entry
    entry_count           bigint NOT NULL DEFAULT 0,   -- messages and summaries, inherited too
    entry_bytes           bigint NOT NULL DEFAULT 0,
    compaction_count      bigint NOT NULL DEFAULT 0,
    rounds                bigint NOT NULL DEFAULT 0,   -- assistant messages
    -- working memory
    scratchpad            text NOT NULL DEFAULT '',
    scratchpad_version    bigint NOT NULL DEFAULT 0,
    scratchpad_tokens     bigint NOT NULL DEFAULT 0,
    scratchpad_updated_at timestamptz,
    rev                   bigint NOT NULL DEFAULT 0,   -- bumped by every change to the notes
    -- branches (session.resume)
    branch_type           text CHECK (branch_type IN ('resume', 'sim', 'pre_steer', 'dream')),
    simulation            text CHECK (simulation IN ('sim', 'pre_steer', 'dream')),
    origin_session_id     bigint,
    origin_checkpoint_id  bigint,
    -- sub-agents (session.spawn)
    task                  text,
    return_format         text CHECK (return_format IN ('summary', 'full')),
    max_tokens            bigint,
    output                text,
    completed_at          timestamptz,
    -- lifecycle
    summary               text,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    ended_at              timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, parent_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE,
    FOREIGN KEY (tenant_id, base_session_id) REFERENCES sessions (tenant_id, id)
        ON DELETE CASCADE
);
CREATE INDEX sessions_agent ON sessions (tenant_id, agent_id, id);
CREATE INDEX sessions_parent ON sessions (tenant_id, parent_id, id) WHERE parent_id IS NOT NULL;

-- The transcript. kind 'message' carries role/content; 'summary' carries the summary in
-- content and the entry it compacts through in target_id/target_seq; 'tombstone' names
-- the entry it hides in target_id.
CREATE TABLE session_entries (
    tenant_id           bigint NOT NULL,
    session_id          bigint NOT NULL,
    seq                 bigint NOT NULL,
    id                  bigint NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('message', 'summary', 'tombstone')),
    role                text CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content             text,
    parent_id           bigint,
    tokens              bigint,
    cost_usdc           numeric,
    agent_id            bigint NOT NULL,
    target_id           bigint,
    target_seq          bigint,
    messages_compacted  bigint,
    created_at          timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, session_id, seq),
    UNIQUE (tenant_id, id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);

-- Structured notes. A note is live until superseded (a newer note with the same key) or
-- cleared (session.task.complete); created_rev and dead_rev are the session's rev at those
-- moments, which is what checkpoint deltas are computed from.
CREATE TABLE session_notes (
    tenant_id      bigint NOT NULL,
    id             bigint NOT NULL,
    session_id     bigint NOT NULL,
    agent_id       bigint NOT NULL,
    category       text NOT NULL
                   CHECK (category IN ('decision', 'discovery', 'blocker', 'context', 'handoff')),
    key            text NOT NULL,
    value          text NOT NULL,
    scope          text NOT NULL CHECK (scope IN ('current_task', 'session', 'carry_forward')),
    work_item_id   jsonb,               -- as the client gave it: a number or a string
    supersedes     bigint,
    superseded_by  bigint,
    cleared_at     timestamptz,
    created_rev    bigint NOT NULL,
    dead_rev       bigint,
    created_at     timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX session_notes_session ON session_notes (tenant_id, session_id, id);
CREATE UNIQUE INDEX session_notes_live_key ON session_notes (tenant_id, session_id, key)
    WHERE dead_rev IS NULL;

-- Scratchpad contents kept for checkpoints; each is owned by exactly one checkpoint.
CREATE TABLE session_scratchpad_snaps (
    tenant_id    bigint NOT NULL,
    id           bigint NOT NULL,
    session_id   bigint NOT NULL,
    version      bigint NOT NULL,
    content      text NOT NULL,
    token_count  bigint NOT NULL,
    updated_at   timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);

CREATE TABLE session_checkpoints (
    tenant_id        bigint NOT NULL,
    id               bigint NOT NULL,
    session_id       bigint NOT NULL,
    label            text NOT NULL,
    metadata         jsonb NOT NULL DEFAULT '{}',
    position         bigint NOT NULL,   -- transcript position
    rev              bigint NOT NULL,   -- the session's rev (notes) at the checkpoint
    counters         jsonb NOT NULL,    -- costs, counters, constraint state, whole
    scratchpad_snap  bigint,            -- NULL: unchanged since the previous checkpoint
    notes_added      bigint[] NOT NULL DEFAULT '{}',
    notes_removed    bigint[] NOT NULL DEFAULT '{}',
    children         jsonb NOT NULL DEFAULT '[]',  -- active sub-agents and their positions
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE,
    FOREIGN KEY (tenant_id, scratchpad_snap) REFERENCES session_scratchpad_snaps (tenant_id, id)
);
CREATE INDEX session_checkpoints_session ON session_checkpoints (tenant_id, session_id, id);
CREATE INDEX session_checkpoints_expiry ON session_checkpoints (expires_at);

-- ---- consolidation ----------------------------------------------------------------------
--
-- A run reads the tenant's live memories, plans (in the server) which memories merge,
-- which supersede which, and which are pruned, then applies the plan in steps of a few
-- hundred decisions, each one transaction (engram_consolidate_apply), and finishes by
-- storing every composite importance and recording the run (engram_consolidate_finish).
-- Every decision is guarded by the memory's change number as the plan saw it: a memory
-- changed by a concurrent write is left alone.
CREATE TABLE consolidation_runs (
    tenant_id    bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id           bigint NOT NULL,
    trigger      text NOT NULL CHECK (trigger IN ('schedule', 'on_demand')),
    status       text NOT NULL CHECK (status IN ('completed', 'failed')),
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL,
    merged       integer NOT NULL DEFAULT 0,   -- memories merged into a survivor
    superseded   integer NOT NULL DEFAULT 0,
    rescored     integer NOT NULL DEFAULT 0,
    archived     integer NOT NULL DEFAULT 0,   -- pruned (archived for low importance)
    skipped      integer NOT NULL DEFAULT 0,   -- decisions dropped: the memory changed meanwhile
    error        text,
    settings     jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX consolidation_runs_recent ON consolidation_runs (tenant_id, finished_at DESC);

-- ---- ids numbered per tenant -------------------------------------------------------------

-- engram_assign_id: BEFORE INSERT trigger: an id not given is the tenant's next of the kind
-- named by the trigger's argument (engram_next_id, storage/functions/40_tenancy.sql).
CREATE FUNCTION engram_assign_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS NULL THEN
        NEW.id := engram_next_id(NEW.tenant_id, TG_ARGV[0]);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER sessions_id BEFORE INSERT ON sessions
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session');
CREATE TRIGGER session_entries_id BEFORE INSERT ON session_entries
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session_entry');
CREATE TRIGGER session_notes_id BEFORE INSERT ON session_notes
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session_note');
CREATE TRIGGER session_scratchpad_snaps_id BEFORE INSERT ON session_scratchpad_snaps
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session_snap');
CREATE TRIGGER session_checkpoints_id BEFORE INSERT ON session_checkpoints
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session_checkpoint');
CREATE TRIGGER consolidation_runs_id BEFORE INSERT ON consolidation_runs
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('consolidation_run');

-- ---- row-level security and privileges ----------------------------------------------------
--
-- With engram.tenant_id set (the server sets it for every tenant request), a role that is
-- neither superuser nor owner sees only that tenant's rows.
ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
ALTER TABLE api_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_usage ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_counters ENABLE ROW LEVEL SECURITY;
ALTER TABLE memories ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_changes ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_versions ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_access ENABLE ROW LEVEL SECURITY;
ALTER TABLE sessions ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_entries ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_notes ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_scratchpad_snaps ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_checkpoints ENABLE ROW LEVEL SECURITY;
ALTER TABLE consolidation_runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON tenants USING (id = engram_current_tenant());
CREATE POLICY tenant_rows ON api_keys USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON tenant_usage USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON tenant_counters USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON memories USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON memory_changes USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON memory_versions USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON idempotency_keys USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON memory_access USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON sessions USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON session_entries USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON session_notes USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON session_scratchpad_snaps USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON session_checkpoints USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON consolidation_runs USING (tenant_id = engram_current_tenant());

GRANT USAGE ON SCHEMA public TO engram_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO engram_app;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO engram_app;
REVOKE ALL ON schema_migrations, schema_functions FROM engram_app;
REVOKE INSERT, UPDATE, DELETE ON engram_instance FROM engram_app;
ALTER DEFAULT PRIVILEGES GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO engram_app;
ALTER DEFAULT PRIVILEGES GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO engram_app;
-- functions: engram_app only (storage/functions/ repeats these after every change)
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO engram_app;
ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO engram_app;
