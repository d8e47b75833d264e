-- 0011_auto_compact: auto-compact on the server (issue 32, item 5; seed 001).
--
-- When the live history a model is given (the newest live compaction summary and the live
-- messages after it) passes config.compaction.threshold of the context window of the
-- session's model, the append that got it there marks the session due (compact_due); a
-- background job of some engramd process (one at a time per session, across processes: an
-- advisory lock) truncates old tool results over config.compaction.tool_result_budget
-- characters, oldest first, and has the tenant's chat model summarize the older API rounds
-- into a summary entry, keeping the config.compaction.keep_recent newest messages. Its
-- compact_start and compact_end events carry tokens_freed. A failure changes no entry; after
-- config.compaction.max_failures failures in a row auto-compact is off for the session.
ALTER TABLE sessions
    -- bytes of that live history; NULL: not counted yet (the next append counts it)
    ADD COLUMN compact_bytes bigint,
    ADD COLUMN compact_due boolean NOT NULL DEFAULT false,
    ADD COLUMN compact_failures integer NOT NULL DEFAULT 0,  -- in a row
    ADD COLUMN compact_off boolean NOT NULL DEFAULT false,   -- after max_failures of them
    ADD COLUMN compact_runs bigint NOT NULL DEFAULT 0,       -- auto-compactions done
    ADD COLUMN compact_last jsonb;                           -- the last attempt's outcome

-- The sessions a job has to look at (few at any time).
CREATE INDEX sessions_compact_due ON sessions (updated_at) WHERE compact_due;

-- A tool result auto-compact truncated keeps its full text here (content holds the cut
-- text every reader of the transcript sees).
ALTER TABLE session_entries ADD COLUMN original_content text;

ALTER TABLE session_entries DROP CONSTRAINT session_entries_event_check;
ALTER TABLE session_entries ADD CONSTRAINT session_entries_event_check
    CHECK (event IN ('session_paused', 'session_resumed', 'spawn', 'sub_agent_completed',
                     'compact_start', 'compact_end'));
