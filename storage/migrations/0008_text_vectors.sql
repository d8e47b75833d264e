-- A memory's text search vector is written by its writers, no longer generated (issue 18).
--
-- As a generated column, content_tsv was computed inside the INSERT, while the store held
-- its tenant row's lock (taken first: ids and change numbers come from that row), so two
-- batches of one tenant computed their vectors one after the other: to_tsvector was a
-- quarter of a 1,000-memory batch's INSERT in a profile (12% of PostgreSQL's CPU against
-- heap_insert's 15% and the index entries' 15%). The writers now compute the vectors of a
-- batch before they take the lock (engram_memory_store_group, engram_memory_store_batch),
-- or in the statement for a store of a few memories (SQL_MEMORY_STORE_SOLO) and for an
-- update of the content (engram_memory_update), always to_tsvector('english', content) as
-- before. Existing rows keep their vectors. NOT NULL: a writer that forgets the vector fails
-- instead of writing a memory that text search never finds.
ALTER TABLE memories ALTER COLUMN content_tsv DROP EXPRESSION;
ALTER TABLE memories ALTER COLUMN content_tsv SET NOT NULL;
