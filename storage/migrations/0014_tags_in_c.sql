-- 0014_tags_in_c: a memory's tags are derived by one rule, in the server.
--
-- Tags (t:token, c:chain, p:protocol, s:strategy) were derived from the metadata twice: in
-- C for stores and index loads (server/memfilter.c) and by engram_tags here for the rows
-- that updates, archives and restores return. engram_meta_of now returns the same JSON array
-- of the typed fields that the index loader reads, and the server derives the tags from it
-- with the rule it uses everywhere else.

CREATE OR REPLACE FUNCTION engram_meta_of(m memories) RETURNS engram_memory_meta
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ROW(m.id, m.seq, m.agent_id, m.clade_id, m.scope, m.type, m.importance,
               engram_ms(m.created_at), engram_ms(m.last_accessed_at), m.access_count,
               engram_ms(m.expires_at), engram_ms(m.archived_at), m.pinned,
               jsonb_build_array(m.metadata -> 'tokens', m.metadata -> 'chains',
                                 m.metadata -> 'protocols', m.metadata -> 'strategy_id')::text
              )::engram_memory_meta;
END $$;

DROP FUNCTION engram_tags(jsonb);
