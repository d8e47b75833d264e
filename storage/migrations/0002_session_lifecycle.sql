-- 0002: sessions end their lives (issue 14): transcript events, retention by last activity,
-- the live-session cap, session.delete, and transcript pages that never read a whole
-- transcript.

-- Events are entries the server writes into a transcript: session_paused (a checkpoint of
-- an active session), session_resumed (the first entry of a session resumed from a
-- checkpoint, and of each restored sub-agent), spawn and sub_agent_completed (in the
-- parent's transcript, naming the sub-agent in data). They take a position like every
-- entry, so they sit in order among the messages, but they count against no transcript
-- limit: the limits they come from (checkpoints, sub-agents) bound them. content holds a
-- line of text for a model, data the event's fields.
ALTER TABLE session_entries DROP CONSTRAINT session_entries_kind_check;
ALTER TABLE session_entries ADD CONSTRAINT session_entries_kind_check
    CHECK (kind IN ('message', 'summary', 'tombstone', 'event'));
ALTER TABLE session_entries ADD COLUMN event text
    CHECK (event IN ('session_paused', 'session_resumed', 'spawn', 'sub_agent_completed'));
ALTER TABLE session_entries ADD COLUMN data jsonb;
ALTER TABLE session_entries ADD CONSTRAINT session_entries_event_kind
    CHECK ((kind = 'event') = (event IS NOT NULL));

-- Summaries and tombstones, found without reading a transcript's messages (pages of
-- session.messages, the compaction cut).
CREATE INDEX session_entries_marks ON session_entries (tenant_id, session_id, seq)
    WHERE kind IN ('summary', 'tombstone');

-- Retention: each tenant's top-level sessions by last activity (updated_at moves with
-- every change of a session).
CREATE INDEX sessions_activity ON sessions (tenant_id, updated_at) WHERE parent_id IS NULL;

-- The live-session cap counts a tenant's active top-level sessions.
CREATE INDEX sessions_live ON sessions (tenant_id) WHERE state = 'active' AND parent_id IS NULL;

-- Sessions resumed from a checkpoint inherit their source's transcript: deleting a source
-- finds its dependents through this index (the foreign key's cascade uses it too).
CREATE INDEX sessions_base ON sessions (tenant_id, base_session_id)
    WHERE base_session_id IS NOT NULL;
