-- 0004_work_items: work items of a session and the sessions' audit log.
--
-- Work items (session.work_item.*) belong to a top-level session: its sub-agents read and
-- change their parent's items, and notes of either may point at one. Their ids are
-- numbered per tenant (kind 'session_work_item'); a session created by session.resume gets
-- the items of the checkpoint it resumes from under the same ids (each checkpoint keeps a
-- copy of its session's items, a few hundred rows at most), so ids an agent wrote down
-- keep naming the same items in the branch.
--
-- The audit log records every change of a session's state, one row per change, numbered
-- by seq within the session in commit order (the session's head row is locked from the
-- number's allocation until commit), so reading it by seq never skips or repeats a record
-- however writers interleave. Rows are written by triggers on the session tables in the
-- transaction of the change (storage/functions/35_work_items.sql) and never changed; they
-- go away with their session (or tenant) only.

ALTER TABLE tenant_counters DROP CONSTRAINT tenant_counters_kind_check;
ALTER TABLE tenant_counters ADD CONSTRAINT tenant_counters_kind_check
    CHECK (kind IN ('session', 'session_entry', 'session_note', 'session_snap',
                    'session_checkpoint', 'consolidation_run', 'session_work_item'));

-- session_id: the top-level session owning the item. updated_by/updated_in: the agent and
-- the session (the owner or one of its sub-agents) of the last change. origin_checkpoint_id:
-- set on the copies session.resume makes.
CREATE TABLE session_work_items (
    tenant_id             bigint NOT NULL,
    session_id            bigint NOT NULL,
    id                    bigint NOT NULL,
    title                 text NOT NULL CHECK (octet_length(title) BETWEEN 1 AND 256),
    description           text CHECK (octet_length(description) BETWEEN 1 AND 16384),
    status                text NOT NULL
                          CHECK (status IN ('open', 'in_progress', 'blocked', 'done',
                                            'cancelled')),
    owner_agent_id        bigint NOT NULL,
    version               bigint NOT NULL DEFAULT 1,
    created_by            bigint NOT NULL,
    updated_by            bigint NOT NULL,
    updated_in            bigint NOT NULL,
    origin_checkpoint_id  bigint,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    status_changed_at     timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, session_id, id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);
CREATE TRIGGER session_work_items_id BEFORE INSERT ON session_work_items
    FOR EACH ROW EXECUTE FUNCTION engram_assign_id('session_work_item');

-- The session's work items as each checkpoint saw them (whole: they are few).
CREATE TABLE session_checkpoint_work_items (
    tenant_id             bigint NOT NULL,
    checkpoint_id         bigint NOT NULL,
    id                    bigint NOT NULL,
    title                 text NOT NULL,
    description           text,
    status                text NOT NULL,
    owner_agent_id        bigint NOT NULL,
    version               bigint NOT NULL,
    created_by            bigint NOT NULL,
    updated_by            bigint NOT NULL,
    updated_in            bigint NOT NULL,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    status_changed_at     timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, checkpoint_id, id),
    FOREIGN KEY (tenant_id, checkpoint_id) REFERENCES session_checkpoints (tenant_id, id)
        ON DELETE CASCADE
);

-- The audit log. agent_id: the agent that made the change (nil when the request named
-- none); target_type/target_id: what changed (an entry, note, work item, checkpoint or
-- session); detail: a few fields about the change, never the content itself.
CREATE TABLE session_audit (
    tenant_id    bigint NOT NULL,
    session_id   bigint NOT NULL,
    seq          bigint NOT NULL,
    at           timestamptz NOT NULL,
    agent_id     bigint,
    action       text NOT NULL CHECK (action ~ '^[a-z][a-z_]{0,31}$'),
    target_type  text CHECK (target_type ~ '^[a-z][a-z_]{0,31}$'),
    target_id    bigint,
    detail       jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant_id, session_id, seq),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);

-- The last seq handed out in each session's audit log; its row lock orders the writers.
CREATE TABLE session_audit_heads (
    tenant_id   bigint NOT NULL,
    session_id  bigint NOT NULL,
    last        bigint NOT NULL,
    PRIMARY KEY (tenant_id, session_id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);

-- Append-only, for the schema's owner too: no row is ever changed. (Deletes come from the
-- cascades above, and from the owner's maintenance only.)
CREATE FUNCTION engram_audit_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the session audit log is append-only' USING ERRCODE = 'EG403';
END $$;
CREATE TRIGGER session_audit_immutable BEFORE UPDATE ON session_audit
    FOR EACH ROW EXECUTE FUNCTION engram_audit_immutable();
CREATE TRIGGER session_audit_no_truncate BEFORE TRUNCATE ON session_audit
    FOR EACH STATEMENT EXECUTE FUNCTION engram_audit_immutable();

-- ---- the audit triggers --------------------------------------------------------------------
--
-- The bodies are repeatable definitions in storage/functions/35_work_items.sql (applied
-- right after the migrations, before the server serves anything); these stubs only let
-- the triggers be created here.
CREATE FUNCTION engram_audit_on_session_insert() RETURNS trigger
    LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE FUNCTION engram_audit_on_session_update() RETURNS trigger
    LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE FUNCTION engram_audit_on_entry() RETURNS trigger
    LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE FUNCTION engram_audit_on_note_insert() RETURNS trigger
    LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE FUNCTION engram_audit_on_note_update() RETURNS trigger
    LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE FUNCTION engram_audit_on_checkpoint() RETURNS trigger
    LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE FUNCTION engram_audit_on_work_item() RETURNS trigger
    LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;

CREATE TRIGGER sessions_audit_insert AFTER INSERT ON sessions
    FOR EACH ROW EXECUTE FUNCTION engram_audit_on_session_insert();
CREATE TRIGGER sessions_audit_update AFTER UPDATE OF state, scratchpad_version ON sessions
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          OR OLD.scratchpad_version IS DISTINCT FROM NEW.scratchpad_version)
    EXECUTE FUNCTION engram_audit_on_session_update();
CREATE TRIGGER session_entries_audit AFTER INSERT ON session_entries
    FOR EACH ROW EXECUTE FUNCTION engram_audit_on_entry();
-- created_rev 0: a copy session.resume makes, not a note added
CREATE TRIGGER session_notes_audit_insert AFTER INSERT ON session_notes
    FOR EACH ROW WHEN (NEW.created_rev > 0) EXECUTE FUNCTION engram_audit_on_note_insert();
-- per statement: session.task.complete clears many notes in one change
CREATE TRIGGER session_notes_audit_update AFTER UPDATE ON session_notes
    REFERENCING OLD TABLE AS old_notes NEW TABLE AS new_notes
    FOR EACH STATEMENT EXECUTE FUNCTION engram_audit_on_note_update();
CREATE TRIGGER session_checkpoints_audit AFTER INSERT ON session_checkpoints
    FOR EACH ROW EXECUTE FUNCTION engram_audit_on_checkpoint();
CREATE TRIGGER session_work_items_audit AFTER INSERT OR UPDATE ON session_work_items
    FOR EACH ROW EXECUTE FUNCTION engram_audit_on_work_item();

-- ---- row-level security and privileges ------------------------------------------------------
ALTER TABLE session_work_items ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_checkpoint_work_items ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_audit ENABLE ROW LEVEL SECURITY;
ALTER TABLE session_audit_heads ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_rows ON session_work_items USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON session_checkpoint_work_items
    USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON session_audit USING (tenant_id = engram_current_tenant());
CREATE POLICY tenant_rows ON session_audit_heads USING (tenant_id = engram_current_tenant());

GRANT SELECT, INSERT, UPDATE, DELETE ON session_work_items, session_checkpoint_work_items
    TO engram_app;
-- the server's role reads the log; only engram_audit_write (SECURITY DEFINER) writes it
REVOKE ALL ON session_audit, session_audit_heads FROM engram_app;
GRANT SELECT ON session_audit TO engram_app;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO engram_app;
