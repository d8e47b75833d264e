-- 0009_inline_embeddings: embeddings stay in the memory's row.
--
-- A 768-dimension embedding is 3,072 bytes, over PostgreSQL's default TOAST threshold
-- (about 2 KB per row), so every embedding went to the TOAST table as two chunks: a store
-- wrote three heap tuples and two TOAST index entries, and an index build from the database
-- fetched each embedding through the TOAST index (5,000 memories: 29 of the query's 43 ms).
-- With a target of 8,160 bytes, rows up to that size keep their embedding inline (up to
-- 1,536 dimensions with a short content); larger rows are still moved out of line,
-- largest columns first. Existing rows keep their out-of-line embeddings until rewritten.
ALTER TABLE memories SET (toast_tuple_target = 8160);
