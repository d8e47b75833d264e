-- storage/functions/36_prompt.sql: the session's parts of memory.prompt: its working memory
-- and its transcript tail with the summary, each within its share of the call's budget.
--
-- Repeatable: engramd applies this file whole, in one transaction, whenever its checksum
-- differs from the one recorded in schema_functions (see storage/migrate.h). Every
-- definition is CREATE OR REPLACE; a change of a function's arguments or result type
-- needs a DROP FUNCTION IF EXISTS of the old signature above the new definition.

-- engram_session_summary_top: the newest live compaction summary of p_session's transcript
-- (its own or inherited from the session it was resumed from), or a row of NULLs.
CREATE OR REPLACE FUNCTION engram_session_summary_top(p_tenant bigint, p_session bigint,
                                                      p_upto bigint)
    RETURNS session_entries LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_chain bigint[];
    v_uptos bigint[];
    v_top session_entries;
BEGIN
    SELECT array_agg(c.session_id), array_agg(c.upto) INTO v_chain, v_uptos
        FROM engram_session_chain(p_tenant, p_session, p_upto) c;
    SELECT m.* INTO v_top FROM unnest(v_chain, v_uptos) AS c (session_id, upto)
        JOIN session_entries m ON m.tenant_id = p_tenant AND m.session_id = c.session_id
                               AND m.seq <= c.upto AND m.kind = 'summary'
        WHERE NOT EXISTS (
            SELECT 1 FROM unnest(v_chain, v_uptos) AS d (session_id, upto)
            JOIN session_entries t ON t.tenant_id = p_tenant AND t.session_id = d.session_id
                                   AND t.seq <= d.upto AND t.kind = 'tombstone'
            WHERE t.target_id = m.id)
        ORDER BY m.target_seq DESC LIMIT 1;
    RETURN v_top;
END $$;

-- engram_session_prompt_transcript: the <transcript> part of memory.prompt within p_cap bytes:
-- the newest live compaction summary, then the newest live messages after it (p_agent:
-- only that agent's; the summary stays), in transcript order. Content is XML-escaped
-- (engram_session_xml). What fits: the summary may take up to half of the part (what
-- the messages leave, beyond that); messages are taken newest first up to the first that
-- does not fit (the tail has no gaps); a summary longer than what is left is cut at the
-- end and marked [truncated], and dropped when not even that fits. Nothing to show: the
-- empty text. Returns {text, summary, messages, info}: summary is the <summary> element
-- (or ''), messages a JSON array of {role, content} as stored, info what was included.
CREATE OR REPLACE FUNCTION engram_session_prompt_transcript(p_tenant bigint, s sessions,
                                                            p_cap bigint, p_agent bigint)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    c_open constant text := E'<transcript>\n';
    c_close constant text := E'</transcript>\n';
    c_cut constant text := E'\n[truncated]';
    v_avail bigint := p_cap - octet_length(c_open) - octet_length(c_close);
    v_top session_entries;
    v_sum text := '';
    v_sum_full bigint := 0;
    v_sum_cut boolean := false;
    v_msg_cap bigint;
    v_n bigint;
    v_page jsonb;
    v_lines text[] := '{}';
    v_msgs jsonb := '[]';
    v_ids bigint[] := '{}';
    v_used bigint := 0;
    v_fetched integer := 0;
    v_line text;
    v_lo integer;
    v_hi integer;
    v_mid integer;
    m record;
BEGIN
    IF v_avail <= 0 THEN
        v_avail := 0;
    END IF;
    v_top := engram_session_summary_top(p_tenant, s.id, s.position);
    IF v_top.id IS NOT NULL THEN
        v_sum := '<summary>' || engram_session_xml(v_top.content) || E'</summary>\n';
        v_sum_full := octet_length(v_sum);
    END IF;
    -- messages, newest first, within what the summary leaves of the part (it keeps half)
    v_msg_cap := v_avail - LEAST(v_sum_full, v_avail / 2);
    -- no more than v_msg_cap / 32 can fit (a message line is at least 32 bytes): ask for one
    -- more, to know whether older ones were left out
    v_n := LEAST(v_msg_cap / 32 + 1, 100000);
    IF v_n >= 1 THEN
        v_page := engram_session_messages(p_tenant, s.id, v_n, p_agent, NULL, v_n + 1,
                                          4611686018427387904, false);
        FOR m IN SELECT x ->> 'role' AS role, x ->> 'content' AS content,
                        (x ->> 'entry_id')::bigint AS id
                 FROM jsonb_array_elements(v_page -> 'messages') WITH ORDINALITY AS t (x, ord)
                 WHERE x ->> 'type' = 'message'
                 ORDER BY t.ord DESC LOOP
            v_fetched := v_fetched + 1;
            IF cardinality(v_ids) = v_fetched - 1 THEN
                v_line := format(E'<message role="%s">%s</message>\n', m.role,
                                 engram_session_xml(COALESCE(m.content, '')));
                IF v_used + octet_length(v_line) <= v_msg_cap THEN
                    v_used := v_used + octet_length(v_line);
                    v_lines := v_line || v_lines;
                    v_ids := m.id || v_ids;
                    v_msgs := jsonb_build_array(jsonb_build_object(
                                  'role', m.role, 'content', COALESCE(m.content, ''))) || v_msgs;
                END IF;
            END IF;
        END LOOP;
    END IF;
    -- the summary in what the messages left
    IF v_top.id IS NOT NULL AND v_sum_full > v_avail - v_used THEN
        v_sum_cut := true;
        IF v_avail - v_used < octet_length('<summary></summary>' || c_cut || E'\n') THEN
            v_sum := '';
        ELSE
            -- the longest prefix (in characters) of the content that fits, escaped
            v_lo := 0;
            v_hi := length(v_top.content);
            WHILE v_lo < v_hi LOOP
                v_mid := (v_lo + v_hi + 1) / 2;
                IF octet_length('<summary>' || engram_session_xml(left(v_top.content, v_mid))
                                || c_cut || E'</summary>\n') <= v_avail - v_used THEN
                    v_lo := v_mid;
                ELSE
                    v_hi := v_mid - 1;
                END IF;
            END LOOP;
            v_sum := '<summary>' || engram_session_xml(left(v_top.content, v_lo)) || c_cut
                     || E'</summary>\n';
        END IF;
    END IF;
    RETURN jsonb_build_object(
        'text', CASE WHEN v_sum = '' AND cardinality(v_ids) = 0 THEN ''
                     ELSE c_open || v_sum || array_to_string(v_lines, '') || c_close END,
        'summary', v_sum,
        'messages', v_msgs,
        'info', jsonb_build_object(
            'summary', CASE WHEN v_top.id IS NOT NULL THEN jsonb_build_object(
                                'entry_id', v_top.id, 'through_entry_id', v_top.target_id,
                                'included', v_sum <> '', 'truncated', v_sum_cut) END,
            'messages', jsonb_build_object('included', cardinality(v_ids),
                                           'entry_ids', to_jsonb(v_ids),
                                           'more', cardinality(v_ids) < v_fetched)));
END $$;

-- engram_session_prompt: the session's parts of memory.prompt, or EG404 for a session the
-- tenant does not have:
--   working_memory: engram_session_wm with the open work items, followed by a newline
--   (nothing when the session has no scratchpad, notes or open work items), within
--   p_wm_cap bytes;
--   transcript: engram_session_prompt_transcript within p_tr_share bytes plus what the
--   working memory left of its cap; p_agent (NULL: all) keeps only that agent's messages.
-- Each part is {text, tokens_used (its bytes / 4), budget_tokens (its cap / 4), ...what it
-- holds}. Returns {session_id, working_memory, transcript, summary (the transcript's
-- <summary> element, or ''), messages (the transcript's messages, [{role, content}])}.
CREATE OR REPLACE FUNCTION engram_session_prompt(p_tenant bigint, p_session bigint,
                                                 p_wm_cap bigint, p_tr_share bigint,
                                                 p_agent bigint)
    RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    s sessions := engram_session_get_row(p_tenant, p_session);
    v_wm jsonb := engram_session_wm(p_tenant, s, p_wm_cap - 1, true, false);
    v_wm_text text;
    v_tr_cap bigint;
    v_tr jsonb;
BEGIN
    v_wm_text := CASE WHEN (s.scratchpad = '' AND jsonb_array_length(v_wm -> 'note_ids') = 0
                            AND jsonb_array_length(v_wm -> 'work_item_ids') = 0)
                           OR octet_length(v_wm ->> 'text') >= p_wm_cap THEN ''
                      ELSE (v_wm ->> 'text') || E'\n' END;
    v_tr_cap := p_tr_share + p_wm_cap - octet_length(v_wm_text);
    v_tr := engram_session_prompt_transcript(p_tenant, s, v_tr_cap, p_agent);
    RETURN jsonb_build_object(
        'session_id', s.id,
        'working_memory', jsonb_build_object(
            'text', v_wm_text, 'tokens_used', octet_length(v_wm_text) / 4,
            'budget_tokens', p_wm_cap / 4,
            'scratchpad', jsonb_build_object('version', s.scratchpad_version,
                                             'included', s.scratchpad <> '' AND v_wm_text <> '',
                                             'truncated', (v_wm ->> 'pad_cut')::boolean),
            'notes', jsonb_build_object('included', jsonb_array_length(v_wm -> 'note_ids'),
                                        'omitted', (v_wm ->> 'notes_total')::bigint
                                                   - jsonb_array_length(v_wm -> 'note_ids'),
                                        'note_ids', v_wm -> 'note_ids'),
            'work_items', jsonb_build_object(
                'included', jsonb_array_length(v_wm -> 'work_item_ids'),
                'omitted', (v_wm ->> 'work_items_total')::bigint
                           - jsonb_array_length(v_wm -> 'work_item_ids'),
                'work_item_ids', v_wm -> 'work_item_ids')),
        'transcript', jsonb_build_object(
            'text', v_tr ->> 'text', 'tokens_used', octet_length(v_tr ->> 'text') / 4,
            'budget_tokens', v_tr_cap / 4)
            || (v_tr -> 'info'),
        'summary', v_tr ->> 'summary',
        'messages', v_tr -> 'messages');
END $$;
