-- 0012_extraction: memory extraction from session transcripts and auto-dream (issue 32,
-- items 4 and 6; seed 001).
--
-- session_extraction: per session, how far its transcript has been extracted into memories
-- (through_seq: the session's own entries up to that position were read by a run that
-- completed), the counts of what runs did, the last run's outcome (last_status 'ok' or why
-- not: the fault, the cap, the model off) and the claim of a run in progress (running_by,
-- running_since: another run of the same session waits until the claim is released, or is
-- older than extract_stale_s: a process that died mid-run). A row exists once a run was
-- tried; a session without one has extracted nothing.
CREATE TABLE session_extraction (
    tenant_id        bigint NOT NULL,
    session_id       bigint NOT NULL,
    through_seq      bigint NOT NULL DEFAULT 0,
    through_entry_id bigint,
    runs             bigint NOT NULL DEFAULT 0,  -- completed runs
    failures         bigint NOT NULL DEFAULT 0,  -- runs that changed nothing (last_error)
    facts_added      bigint NOT NULL DEFAULT 0,
    facts_updated    bigint NOT NULL DEFAULT 0,  -- a fact that superseded an older memory
    facts_unchanged  bigint NOT NULL DEFAULT 0,  -- facts the memories already held
    tokens_in        bigint NOT NULL DEFAULT 0,
    tokens_out       bigint NOT NULL DEFAULT 0,
    last_run_at      timestamptz,
    last_trigger     text CHECK (last_trigger IN ('on_demand', 'auto', 'dream')),
    last_status      text,
    last_error       text,
    last_result      jsonb,
    running_by       text,
    running_since    timestamptz,
    PRIMARY KEY (tenant_id, session_id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);
ALTER TABLE session_extraction ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON session_extraction USING (tenant_id = engram_current_tenant());
GRANT SELECT, INSERT, UPDATE, DELETE ON session_extraction TO engram_app;

-- dream_state: per tenant, the auto-dream pass (seed 001's three gates): when the last pass
-- completed and the newest session passes have covered (sessions with a higher id are new),
-- and the lock of a pass in progress (lock_holder, lock_at: a pass holding it for less than
-- dream_lock_stale_s keeps every other engramd process out; an older one is taken over).
CREATE TABLE dream_state (
    tenant_id        bigint PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    last_run_at      timestamptz,                -- the last pass that completed
    last_attempt_at  timestamptz,                -- the last pass, whatever its outcome
    last_session_id  bigint NOT NULL DEFAULT 0,
    runs             bigint NOT NULL DEFAULT 0,
    last_status      text,
    last_error       text,
    last_result      jsonb,
    lock_holder      text,
    lock_at          timestamptz,
    takeovers        bigint NOT NULL DEFAULT 0
);
ALTER TABLE dream_state ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON dream_state USING (tenant_id = engram_current_tenant());
GRANT SELECT, INSERT, UPDATE, DELETE ON dream_state TO engram_app;

-- A dream's prune phase is a consolidation run of its own, recorded with trigger 'dream'.
ALTER TABLE consolidation_runs DROP CONSTRAINT consolidation_runs_trigger_check;
ALTER TABLE consolidation_runs ADD CONSTRAINT consolidation_runs_trigger_check
    CHECK (trigger IN ('schedule', 'on_demand', 'dream'));
