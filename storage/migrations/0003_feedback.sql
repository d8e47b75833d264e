-- 0003_feedback: provenance feedback (memory.feedback, memory.provenance): per memory, how
-- many times a gateway injected it into a prompt (injected_count) and how many of those
-- times the model's answer cited it (cited_count). Both only grow. A cited memory counts as
-- injected too, so cited_count never exceeds injected_count. The composite importance may
-- take a usefulness term from them (setting score_w_usefulness, storage/functions/
-- 25_feedback.sql); adding columns with constant defaults rewrites no row.
ALTER TABLE memories
    ADD COLUMN cited_count bigint NOT NULL DEFAULT 0,
    ADD COLUMN injected_count bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT memories_feedback_counts
        CHECK (cited_count >= 0 AND injected_count >= cited_count);
