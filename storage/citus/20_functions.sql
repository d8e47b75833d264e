-- storage/citus/20_functions.sql: the functions on a Citus cluster (docs/scaling.md), run
-- by migrate.c after the function files whenever the database has the citus extension.
-- Idempotent, one transaction.
--
-- Every function of the schema is propagated to the workers (a function created before the
-- tables it refers to were distributed exists on the coordinator only), and every function
-- with a bigint argument p_tenant is distributed with p_tenant as its distribution argument,
-- co-located with tenants, delegated even inside a transaction block (engramd sets
-- engram.tenant_id and calls the function in one transaction).

-- Tenant names: Citus keeps no unique constraint on tenants.name (10_tables.sql), so the
-- two admin functions that set a name check it themselves, under a transaction-level
-- advisory lock on the coordinator (where they run: they have no p_tenant), and raise the
-- unique_violation their handlers already turn into EG410. A function file that changes
-- the lines patched here fails this block, on Citus only, rather than losing the check.
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_admin_tenant_create'::regproc);
    IF strpos(def, 'engram: unique tenant name') = 0 THEN
        fixed := replace(def, E'BEGIN\n    INSERT INTO tenants (name,', E'BEGIN\n' ||
            E'    -- engram: unique tenant name (storage/citus/20_functions.sql)\n' ||
            E'    PERFORM pg_advisory_xact_lock(7420002);\n' ||
            E'    IF EXISTS (SELECT 1 FROM tenants x WHERE x.name = p_name) THEN\n' ||
            E'        RAISE unique_violation;\n' ||
            E'    END IF;\n' ||
            E'    INSERT INTO tenants (name,');
        IF fixed = def THEN
            RAISE EXCEPTION 'engram_admin_tenant_create changed: patch its name check';
        END IF;
        EXECUTE fixed;
    END IF;
    def := pg_get_functiondef('engram_admin_tenant_update'::regproc);
    IF strpos(def, 'engram: unique tenant name') = 0 THEN
        fixed := replace(def, E'\n    UPDATE tenants SET name =', E'\n' ||
            E'    -- engram: unique tenant name (storage/citus/20_functions.sql)\n' ||
            E'    PERFORM pg_advisory_xact_lock(7420002);\n' ||
            E'    IF p_new_name IS NOT NULL AND EXISTS (SELECT 1 FROM tenants x\n' ||
            E'        WHERE x.name = p_new_name AND x.id <> t.id) THEN\n' ||
            E'        RAISE unique_violation;\n' ||
            E'    END IF;\n' ||
            E'    UPDATE tenants SET name =');
        IF fixed = def THEN
            RAISE EXCEPTION 'engram_admin_tenant_update changed: patch its name check';
        END IF;
        EXECUTE fixed;
    END IF;
END $$;

-- Citus cannot plan a statement of a LANGUAGE sql function that takes parameters ("could
-- not create distributed plan ... parameters in SQL functions"). Every SQL function that
-- names a distributed or reference table is defined again as PL/pgSQL with the same
-- signature, volatility, security and settings: RETURN QUERY for a set, the result INTO a
-- variable for a scalar, the statements as they are for void. Column names win over
-- same-named OUT parameters, as they did in SQL. Runs at every start, after the function
-- files have defined them as SQL again.
DO $$
DECLARE
    f record;
    pat text;
    body text;
    def text;
BEGIN
    SELECT '\m(' || string_agg(logicalrelid::regclass::text, '|') || ')\M' INTO pat
      FROM pg_dist_partition;
    FOR f IN
        SELECT p.oid, p.prosrc, p.proretset, p.prorettype, pg_get_functiondef(p.oid) AS def,
               (SELECT count(*) FROM unnest(p.proargmodes) m WHERE m IN ('o', 't', 'b')) AS nout
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'public' AND p.prolang = (SELECT oid FROM pg_language
                                                      WHERE lanname = 'sql')
           AND p.prosrc ~ pat
    LOOP
        body := regexp_replace(f.prosrc, ';\s*$', '');
        IF f.proretset THEN
            body := 'BEGIN RETURN QUERY ' || body || '; END';
        ELSIF f.prorettype = 'void'::regtype THEN
            body := 'BEGIN ' || body || '; END';
        ELSIF f.nout > 1 THEN
            -- a composite of OUT parameters: they are the variables
            body := 'BEGIN ' || body || ' INTO ' ||
                    (SELECT string_agg(quote_ident(a.n), ', ' ORDER BY a.i)
                       FROM pg_proc p,
                            unnest(p.proargnames, p.proargmodes) WITH ORDINALITY AS a (n, m, i)
                      WHERE p.oid = f.oid AND a.m IN ('o', 'b')) || '; RETURN; END';
        ELSE
            body := 'DECLARE engram_result ' || format_type(f.prorettype, NULL) ||
                    '; BEGIN ' || body || ' INTO engram_result; RETURN engram_result; END';
        END IF;
        body := E'#variable_conflict use_column\n' || body;
        -- the header pg_get_functiondef printed, the language and the body replaced
        def := substr(f.def, 1, strpos(f.def, 'AS $function$') - 1);
        def := regexp_replace(def, 'LANGUAGE sql', 'LANGUAGE plpgsql');
        EXECUTE def || ' AS ' || quote_literal(body);
    END LOOP;
END $$;

-- Session transcripts: engram_session_chain (a distributed function) in the FROM of a query
-- that joins session_entries went down to the tenant's shard with the query, and ran its own
-- distributed query there ("cannot execute a distributed query from a query on a shard").
-- Its callers (PL/pgSQL by the block above) read the chain into two arrays first, in a
-- statement of its own (as engram_session_messages does on one node), and join
-- unnest(chain, uptos) instead. engram_compact_entries reads its marks the same way (the
-- cut and the tombstoned ids) before its query; engram_session_items builds its JSON from
-- its own CTE of live entries instead of joining session_entries again. Every replaced
-- text must be found: a function file that changes them fails this block, on Citus only.
DO $$
DECLARE
    f text;
    def text;
    fixed text;
    r text[];
    c_chain constant text := 'engram_session_chain(p_tenant, p_session, p_upto) c';
BEGIN
    FOREACH f IN ARRAY ARRAY['engram_session_log', 'engram_session_find_entry',
                             'engram_compact_marks', 'engram_compact_entries'] LOOP
        def := pg_get_functiondef(f::regproc);
        CONTINUE WHEN strpos(def, 'engram: chain read first') > 0; -- patched at an earlier start
        IF strpos(def, c_chain) = 0 OR strpos(def, E'#variable_conflict use_column\n') = 0 THEN
            RAISE EXCEPTION '% changed: patch its session chain', f;
        END IF;
        fixed := replace(def, c_chain, 'unnest(engram_chain, engram_uptos) AS c (session_id, upto)');
        fixed := replace(fixed, E'#variable_conflict use_column\n',
            E'#variable_conflict use_column\n' ||
            E'-- engram: chain read first (storage/citus/20_functions.sql)\n' ||
            E'DECLARE engram_chain bigint[]; engram_uptos bigint[];\n');
        fixed := regexp_replace(fixed, '\mBEGIN\M',
            E'BEGIN\n    SELECT array_agg(c.session_id), array_agg(c.upto)\n' ||
            E'      INTO engram_chain, engram_uptos\n' ||
            E'      FROM engram_session_chain(p_tenant, p_session, p_upto) c;\n');
        IF f = 'engram_compact_entries' THEN
            FOREACH r SLICE 1 IN ARRAY ARRAY[
                [E'WITH m AS MATERIALIZED (SELECT * FROM engram_compact_marks(p_tenant, p_session, p_upto)),\n' ||
                 E'    cut AS (SELECT COALESCE(max(m.target_seq) FILTER (WHERE m.kind = ''summary'' AND m.live), 0)\n' ||
                 E'                   AS seq FROM m)\n',
                 ''],
                ['e.seq > (SELECT cut.seq FROM cut)', 'e.seq > engram_cut'],
                [E'e.id NOT IN (SELECT m.target_id FROM m WHERE m.kind = ''tombstone'')',
                 'e.id <> ALL (engram_dead)'],
                [E'DECLARE engram_chain bigint[]; engram_uptos bigint[];\n',
                 E'DECLARE engram_chain bigint[]; engram_uptos bigint[];\n' ||
                 E'    engram_cut bigint; engram_dead bigint[];\n'],
                [E'FROM engram_session_chain(p_tenant, p_session, p_upto) c;\n',
                 E'FROM engram_session_chain(p_tenant, p_session, p_upto) c;\n' ||
                 E'    SELECT COALESCE(max(m.target_seq) FILTER (WHERE m.kind = ''summary'' AND m.live), 0),\n' ||
                 E'           COALESCE(array_agg(m.target_id) FILTER (WHERE m.kind = ''tombstone''), ''{}'')\n' ||
                 E'      INTO engram_cut, engram_dead\n' ||
                 E'      FROM engram_compact_marks(p_tenant, p_session, p_upto) m;\n']] LOOP
                IF strpos(fixed, r[1]) = 0 THEN
                    RAISE EXCEPTION 'engram_compact_entries changed: patch its marks';
                END IF;
                fixed := replace(fixed, r[1], r[2]);
            END LOOP;
        END IF;
        EXECUTE fixed;
    END LOOP;

    def := pg_get_functiondef('engram_session_items'::regproc);
    IF strpos(def, 'engram: items from live') = 0 THEN
        fixed := replace(replace(def,
            'FROM picked p JOIN session_entries e ON e.tenant_id = p_tenant AND e.id = p.id',
            E'-- engram: items from live (storage/citus/20_functions.sql)\n' ||
            E'    FROM picked p JOIN live e ON e.id = p.id'),
            'engram_session_entry_json(e) ORDER BY p.pos',
            'engram_session_entry_json(e::session_entries) ORDER BY p.pos');
        IF strpos(fixed, 'engram: items from live') = 0
           OR strpos(fixed, 'engram_session_entry_json(e::session_entries)') = 0 THEN
            RAISE EXCEPTION 'engram_session_items changed: patch its entries join';
        END IF;
        EXECUTE fixed;
    END IF;
END $$;

-- Whole rows as arguments: a query that goes down to a shard passes the shard's row
-- (session_notes_102676) where the function takes the table's type ("function
-- engram_session_note_json(session_notes_102676) does not exist"). The row is built
-- from its columns and cast to the table's type instead, in every function that passes one.
DO $$
DECLARE
    f record;
    fixed text;
    r text[];
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure AS oid, pg_get_functiondef(p.oid) AS def
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'public'
           AND (p.prosrc LIKE '%engram_session_note_json(n)%'
                OR p.prosrc LIKE '%engram_session_entry_json(x)%'
                OR p.prosrc LIKE '%engram_work_item_json(w)%')
    LOOP
        fixed := f.def;
        FOREACH r SLICE 1 IN ARRAY ARRAY[
            ['engram_session_note_json(n)', 'engram_session_note_json(ROW(n.*)::session_notes)'],
            ['engram_session_entry_json(x)', 'engram_session_entry_json(ROW(x.*)::session_entries)'],
            ['engram_work_item_json(w)', 'engram_work_item_json(ROW(w.*)::session_work_items)']]
        LOOP
            fixed := replace(fixed, r[1], r[2]);
        END LOOP;
        EXECUTE fixed;
    END LOOP;
END $$;

-- engram_session_json (PL/pgSQL by the block above): its four counts are read before its
-- query, each a query of its own routed to the tenant's shard: as subqueries of one
-- statement Citus refused it ("Distributed queries with outer joins and pseudoconstant
-- quals are not supported in PG15 and PG16").
DO $$
DECLARE
    def text;
    fixed text;
    r text[];
    v_decl text := '';
    i integer := 0;
BEGIN
    def := pg_get_functiondef('engram_session_json'::regproc);
    IF strpos(def, 'engram: counts read first') > 0 THEN
        RETURN; -- patched at an earlier start
    END IF;
    fixed := def;
    FOREACH r SLICE 1 IN ARRAY ARRAY[
        [E'(SELECT count(*) FROM session_notes n\n' ||
         E'                       WHERE n.tenant_id = s.tenant_id AND n.session_id = s.id\n' ||
         E'                         AND n.dead_rev IS NULL)'],
        [E'(SELECT count(*) FROM session_checkpoints k\n' ||
         E'                             WHERE k.tenant_id = s.tenant_id AND k.session_id = s.id\n' ||
         E'                               AND k.expires_at > now())'],
        [E'(SELECT count(*) FROM sessions c\n' ||
         E'                        WHERE c.tenant_id = s.tenant_id AND c.parent_id = s.id)'],
        [E'(SELECT count(*) FROM sessions c\n' ||
         E'                            WHERE c.tenant_id = s.tenant_id AND c.parent_id = s.id\n' ||
         E'                              AND c.state = ''active'')']]
    LOOP
        i := i + 1;
        IF strpos(fixed, r[1]) = 0 THEN
            RAISE EXCEPTION 'engram_session_json changed: patch its counts';
        END IF;
        fixed := replace(fixed, r[1], 'engram_count' || i);
        v_decl := v_decl || format(E'    engram_count%s bigint := %s;\n', i, r[1]);
    END LOOP;
    IF strpos(fixed, 'DECLARE engram_result jsonb;') = 0 THEN
        RAISE EXCEPTION 'engram_session_json changed: patch its counts';
    END IF;
    fixed := replace(fixed, 'DECLARE engram_result jsonb;',
        E'-- engram: counts read first (storage/citus/20_functions.sql)\n' ||
        E'DECLARE engram_result jsonb;\n' || v_decl);
    EXECUTE fixed;
END $$;

-- engram_extract_state (PL/pgSQL by the block above): its LEFT JOIN to session_extraction
-- is one Citus 13 on PostgreSQL 15 refuses ("outer joins and pseudoconstant quals", as in
-- engram_tenant_usage below). The extraction row is read first into a variable named as the
-- join's alias was (a row of NULLs when there is none, as the outer join gave).
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_extract_state'::regproc);
    IF strpos(def, 'engram: extraction row read first') > 0 THEN
        RETURN; -- patched at an earlier start
    END IF;
    fixed := replace(replace(def,
        E'\n    LEFT JOIN session_extraction e ON e.tenant_id = s.tenant_id AND e.session_id = s.id', ''),
        'DECLARE engram_result jsonb; BEGIN',
        E'DECLARE engram_result jsonb;\n' ||
        E'    e session_extraction;\n' ||
        E'BEGIN\n' ||
        E'    -- engram: extraction row read first (storage/citus/20_functions.sql)\n' ||
        E'    SELECT * INTO e FROM session_extraction x\n' ||
        E'     WHERE x.tenant_id = p_tenant AND x.session_id = p_session;');
    IF strpos(fixed, 'LEFT JOIN session_extraction') > 0
       OR strpos(fixed, 'engram: extraction row read first') = 0 THEN
        RAISE EXCEPTION 'engram_extract_state changed: patch its join';
    END IF;
    EXECUTE fixed;
END $$;

-- engram_session_children: a 'full' child's transcript (engram_session_history) was read
-- inside the query over sessions, which went down to the tenant's shard with the call in
-- it ("cannot execute a distributed query from a query on a shard"). The children are read
-- one by one instead, each JSON built outside any query on a table.
-- engram_session_handoff: engram_work_item_counts, called in the statement whose
-- subqueries count the session's notes and checkpoints, is added to the metrics in a
-- statement of its own; engram_work_item_handoff and the audit tail, called in the
-- statement that reads the carry-forward notes and blockers, likewise; the live summaries
-- the events list (engram_session_live) are read into an array first.
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_session_children'::regproc);
    IF strpos(def, 'engram: children one by one') = 0 THEN
        fixed := replace(replace(def,
            E'    RETURN jsonb_build_object(''session_id'', s.id, ''children'', COALESCE((\n' ||
        E'        SELECT jsonb_agg(jsonb_build_object(\n' ||
        E'                   ''session_id'', c.id, ''agent_id'', engram_session_u64(c.agent_id),\n' ||
        E'                   ''task'', c.task, ''model'', c.config ->> ''model'', ''state'', c.state,\n' ||
        E'                   ''return_format'', c.return_format, ''max_tokens'', c.max_tokens,\n' ||
        E'                   ''output'', c.output, ''total_cost_usdc'', c.total_cost_usdc,\n' ||
        E'                   ''entry_count'', c.entry_count, ''created_at'', engram_ms(c.created_at),\n' ||
        E'                   ''completed_at'', engram_ms(c.completed_at))\n' ||
        E'               || CASE WHEN c.return_format = ''full'' AND c.state = ''completed'' THEN\n' ||
        E'                      jsonb_build_object(''messages'', engram_session_history(\n' ||
        E'                          p_tenant, c.id, c.position, NULL, NULL))\n' ||
        E'                  ELSE ''{}''::jsonb END\n' ||
        E'               ORDER BY c.id)\n' ||
        E'        FROM sessions c WHERE c.tenant_id = p_tenant AND c.parent_id = s.id), ''[]''::jsonb));\n',
            E'    -- engram: children one by one (storage/citus/20_functions.sql)\n' ||
        E'    FOR c IN SELECT x.* FROM sessions x WHERE x.tenant_id = p_tenant AND x.parent_id = s.id\n' ||
        E'              ORDER BY x.id LOOP\n' ||
        E'        v_children := v_children || jsonb_build_array(jsonb_build_object(\n' ||
        E'                   ''session_id'', c.id, ''agent_id'', engram_session_u64(c.agent_id),\n' ||
        E'                   ''task'', c.task, ''model'', c.config ->> ''model'', ''state'', c.state,\n' ||
        E'                   ''return_format'', c.return_format, ''max_tokens'', c.max_tokens,\n' ||
        E'                   ''output'', c.output, ''total_cost_usdc'', c.total_cost_usdc,\n' ||
        E'                   ''entry_count'', c.entry_count, ''created_at'', engram_ms(c.created_at),\n' ||
        E'                   ''completed_at'', engram_ms(c.completed_at))\n' ||
        E'               || CASE WHEN c.return_format = ''full'' AND c.state = ''completed'' THEN\n' ||
        E'                      jsonb_build_object(''messages'', engram_session_history(\n' ||
        E'                          p_tenant, c.id, c.position, NULL, NULL))\n' ||
        E'                  ELSE ''{}''::jsonb END);\n' ||
        E'    END LOOP;\n' ||
        E'    RETURN jsonb_build_object(''session_id'', s.id, ''children'', v_children);\n'),
            E'DECLARE\n    s sessions := engram_session_get_row(p_tenant, p_session);\n',
            E'DECLARE\n    s sessions := engram_session_get_row(p_tenant, p_session);\n' ||
            E'    v_children jsonb := ''[]'';\n    c sessions;\n');
        IF strpos(fixed, 'engram: children one by one') = 0
           OR strpos(fixed, 'v_children jsonb') = 0 THEN
            RAISE EXCEPTION 'engram_session_children changed: patch its children';
        END IF;
        EXECUTE fixed;
    END IF;
    def := pg_get_functiondef('engram_session_handoff'::regproc);
    IF strpos(def, 'engram: work item sections apart') = 0 THEN
        -- the work items and the audit tail likewise, apart from the notes' subqueries
        fixed := replace(def,
            E'''[]''::jsonb))\n            || engram_work_item_handoff(p_tenant, s, p_mode = ''takeover'')\n',
            E'''[]''::jsonb));\n' ||
            E'        -- engram: work item sections apart (storage/citus/20_functions.sql)\n' ||
            E'        v := v || engram_work_item_handoff(p_tenant, s, p_mode = ''takeover'')\n');
        IF fixed = def THEN
            RAISE EXCEPTION 'engram_session_handoff changed: patch its work item sections';
        END IF;
        EXECUTE fixed;
        def := pg_get_functiondef('engram_session_handoff'::regproc);
    END IF;
    IF strpos(def, 'engram: summaries read first') = 0 THEN
        -- the compaction events: the live summaries are read before the events' query
        fixed := replace(replace(replace(def,
            E'                    FROM engram_session_live(p_tenant, s.id, s.position) l\n' ||
            E'                    WHERE l.kind = ''summary''\n',
            E'                    FROM unnest(engram_summaries) l\n'),
            E'        v := v || jsonb_build_object(''events'', COALESCE((\n',
            E'        -- engram: summaries read first (storage/citus/20_functions.sql)\n' ||
            E'        engram_summaries := ARRAY(SELECT l FROM engram_session_live(p_tenant, s.id,\n' ||
            E'                                  s.position) l WHERE l.kind = ''summary'');\n' ||
            E'        v := v || jsonb_build_object(''events'', COALESCE((\n'),
            E'    v_events bigint;\n',
            E'    v_events bigint;\n    engram_summaries session_entries[];\n');
        IF strpos(fixed, 'FROM unnest(engram_summaries) l') = 0
           OR strpos(fixed, 'engram: summaries read first') = 0
           OR strpos(fixed, 'engram_summaries session_entries[]') = 0 THEN
            RAISE EXCEPTION 'engram_session_handoff changed: patch its compaction events';
        END IF;
        EXECUTE fixed;
        def := pg_get_functiondef('engram_session_handoff'::regproc);
    END IF;
    IF strpos(def, 'engram: work item counts apart') = 0 THEN
        fixed := replace(def,
            E'\n            || engram_work_item_counts(p_tenant, COALESCE(s.parent_id, s.id)));\n',
            E');\n' ||
            E'    -- engram: work item counts apart (storage/citus/20_functions.sql)\n' ||
            E'    v := v || jsonb_build_object(''metrics'', (v -> ''metrics'')\n' ||
            E'        || engram_work_item_counts(p_tenant, COALESCE(s.parent_id, s.id)));\n');
        IF fixed = def THEN
            RAISE EXCEPTION 'engram_session_handoff changed: patch its work item counts';
        END IF;
        EXECUTE fixed;
    END IF;
END $$;

-- engram_next_id (PL/pgSQL by the block above) hands out a tenant's ids from
-- tenant_counters. While a tenant move splits the tenant's shard group
-- (storage/citusmove.h), a statement on a worker may be routed by metadata the split has
-- just replaced, and the counter's INSERT ... RETURNING then returns no row: the id would be
-- NULL and the insert fail on a constraint, reported as an internal error. It raises EG503
-- (the server answers `unavailable`: nothing was written, retry) instead.
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_next_id'::regproc);
    IF strpos(def, 'EG503') = 0 THEN
        fixed := replace(def, ' INTO engram_result; RETURN engram_result; END',
            ' INTO engram_result; IF engram_result IS NULL THEN RAISE EXCEPTION ' ||
            '''no counter row for tenant %: its shard group is being split or moved'', ' ||
            'p_tenant USING ERRCODE = ''EG503''; END IF; RETURN engram_result; END');
        IF fixed = def THEN
            RAISE EXCEPTION 'engram_next_id changed: patch its missing-row check';
        END IF;
        EXECUTE fixed;
    END IF;
END $$;

-- engram_session_handoff runs as the owner on Citus. Its last statement records the handoff
-- with engram_audit_write (SECURITY DEFINER: the server's role may only read the log), and
-- on the coordinator the owner's connections and the server role's connections may not
-- both touch the tenant's placements in one transaction ("cannot perform query on
-- placements that were modified in this transaction by a different user"); as the owner
-- the whole call uses the owner's. Its tenant stays bound: every query names p_tenant, and
-- engram_audit_write raises EG403 (the call rolls back, nothing returned) when p_tenant is
-- not the tenant the transaction acts for.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER',
                   'engram_session_handoff'::regproc::regprocedure);
END $$;

-- engram_admin_key_list (PL/pgSQL by the block above): the tenant's row is found before
-- the query, not inside it: engram_admin_find in the WHERE clause went down to the shard
-- with the query and ran its own distributed query there ("cannot execute a distributed
-- query from a query on a shard").
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_admin_key_list'::regproc);
    fixed := replace(replace(def, 'WHERE k.tenant_id = (engram_admin_find(p_id, p_name)).id',
                             'WHERE k.tenant_id = engram_tenant'),
                     E'DECLARE engram_result jsonb;',
                     E'DECLARE engram_result jsonb;\n' ||
                     E'    engram_tenant bigint := (engram_admin_find(p_id, p_name)).id;');
    IF strpos(def, 'engram_tenant bigint :=') > 0 THEN
        RETURN; -- patched at an earlier start
    END IF;
    IF fixed = def OR strpos(fixed, 'engram_admin_find(p_id, p_name)).id;') = 0 THEN
        RAISE EXCEPTION 'engram_admin_key_list changed: patch its tenant lookup';
    END IF;
    EXECUTE fixed;
END $$;

-- engram_tenant_usage (PL/pgSQL by the block above): Citus 13 on PostgreSQL 15 plans no
-- outer join whose planner-derived quals are pseudoconstant ("Distributed queries with
-- outer joins and pseudoconstant quals are not supported"): the LEFT JOIN to today's
-- tenant_usage row, with t.id = p_tenant, is one. Today's row (unique by tenant and day)
-- is read as an aggregate instead: one row always, NULLs when there is none, as before.
-- (engramd calls it in FROM, so it runs on the coordinator, not delegated.)
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_tenant_usage'::regproc);
    IF strpos(def, 'engram: usage without outer join') > 0 THEN
        RETURN; -- patched at an earlier start
    END IF;
    fixed := replace(def,
        E'LEFT JOIN tenant_usage u ON u.tenant_id = t.id AND u.day = (now() AT TIME ZONE ''UTC'')::date',
        E'-- engram: usage without outer join (storage/citus/20_functions.sql)\n' ||
        E'    CROSS JOIN (SELECT max(x.queries) AS queries, max(x.model_calls) AS model_calls,\n' ||
        E'                       max(x.model_tokens_in) AS model_tokens_in,\n' ||
        E'                       max(x.model_tokens_out) AS model_tokens_out,\n' ||
        E'                       max(x.model_cost_usd) AS model_cost_usd\n' ||
        E'                  FROM tenant_usage x\n' ||
        E'                 WHERE x.tenant_id = p_tenant\n' ||
        E'                   AND x.day = (now() AT TIME ZONE ''UTC'')::date) u');
    IF fixed = def THEN
        RAISE EXCEPTION 'engram_tenant_usage changed: patch its join';
    END IF;
    -- the subqueries name the tenant by the argument: routed to its shard (correlated on
    -- t.id, the statement went to every worker, and with engramd's SET LOCAL in the block
    -- Citus failed it: "the backend has already been assigned a transaction id")
    fixed := replace(fixed, '.tenant_id = t.id', '.tenant_id = p_tenant');
    EXECUTE fixed;
END $$;

-- engram_tenant_json (PL/pgSQL by the block above): the re-embedding's state and the key
-- count are computed before the JSON is built: inside its query, which reads api_keys of
-- one tenant and so went down to that tenant's shard, engram_reembed_state ran its own
-- distributed query on the worker ("cannot execute a distributed query from a query on a
-- shard").
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_tenant_json'::regproc);
    IF strpos(def, 'engram_keys bigint :=') > 0 THEN
        RETURN; -- patched at an earlier start
    END IF;
    fixed := replace(replace(replace(def,
        $s$'reembed', engram_reembed_state(t.id),$s$, $s$'reembed', engram_reembed,$s$),
        $s$'keys', (SELECT count(*) FROM api_keys k WHERE k.tenant_id = t.id AND k.revoked_at IS NULL))$s$,
        $s$'keys', engram_keys)$s$),
        'DECLARE engram_result jsonb;',
        E'DECLARE engram_result jsonb;\n' ||
        E'    engram_reembed jsonb := engram_reembed_state(t.id);\n' ||
        E'    engram_keys bigint := (SELECT count(*) FROM api_keys k\n' ||
        E'                            WHERE k.tenant_id = t.id AND k.revoked_at IS NULL);');
    IF strpos(fixed, 'engram_reembed_state(t.id),') > 0 OR strpos(fixed, 'engram_keys)') = 0
       OR strpos(fixed, 'engram_keys bigint :=') = 0 THEN
        RAISE EXCEPTION 'engram_tenant_json changed: patch its reembed state and key count';
    END IF;
    EXECUTE fixed;
END $$;

-- engram_admin_find: by name, the single-node query (id = p_id OR name = p_name, each
-- guarded by p_id IS NULL) found no tenant on Citus ("tenant 'acme' not found" for a
-- tenant that exists): the shards are pruned on id = NULL. Each lookup is its own query.
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_admin_find'::regproc);
    IF strpos(def, 'engram: one lookup a query') > 0 THEN
        RETURN; -- patched at an earlier start
    END IF;
    fixed := replace(def,
        E'SELECT * INTO t FROM tenants WHERE (p_id IS NOT NULL AND id = p_id)\n' ||
        E'                                    OR (p_id IS NULL AND name = p_name);',
        E'-- engram: one lookup a query (storage/citus/20_functions.sql)\n' ||
        E'    IF p_id IS NOT NULL THEN\n' ||
        E'        SELECT * INTO t FROM tenants WHERE id = p_id;\n' ||
        E'    ELSE\n' ||
        E'        SELECT * INTO t FROM tenants WHERE name = p_name;\n' ||
        E'    END IF;');
    IF fixed = def THEN
        RAISE EXCEPTION 'engram_admin_find changed: patch its lookup';
    END IF;
    EXECUTE fixed;
END $$;

-- engram_admin_key_create: Citus allows no STABLE function (engram_ms) in the RETURNING
-- clause of a distributed INSERT ("non-IMMUTABLE functions are not allowed in the
-- RETURNING clause"); the creation time is read back from the new row instead.
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_admin_key_create'::regproc);
    IF strpos(def, 'engram: created_ms read back') = 0 THEN
        fixed := replace(def, E'RETURNING id, engram_ms(created_at) INTO key_row, created_ms;',
            E'RETURNING id INTO key_row;\n' ||
            E'    -- engram: created_ms read back (storage/citus/20_functions.sql)\n' ||
            E'    SELECT engram_ms(k.created_at) INTO created_ms FROM api_keys k\n' ||
            E'     WHERE k.tenant_id = t.id AND k.id = key_row;');
        IF fixed = def THEN
            RAISE EXCEPTION 'engram_admin_key_create changed: patch its RETURNING';
        END IF;
        EXECUTE fixed;
    END IF;
END $$;

-- engram_memory_set_archived: Citus allows no non-IMMUTABLE function inside CASE of a
-- distributed statement; the archive time is now() plus an interval that is NULL when
-- restoring (the same value, and NULL as before).
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_memory_set_archived'::regproc);
    fixed := replace(def, E'archived_at = CASE WHEN p_archive THEN date_trunc(''milliseconds'', now()) END',
        E'archived_at = date_trunc(''milliseconds'', now()) + CASE WHEN p_archive THEN interval ''0'' END');
    IF fixed = def AND strpos(def, E'+ CASE WHEN p_archive THEN interval ''0'' END') = 0 THEN
        RAISE EXCEPTION 'engram_memory_set_archived changed: patch its archived_at';
    END IF;
    IF fixed <> def THEN
        EXECUTE fixed;
    END IF;
END $$;

-- engram_dream_unlock: the same for the pass's time, now() inside CASE ("non-IMMUTABLE
-- functions are not allowed in CASE or COALESCE statements"): now() is read into a variable
-- first (the transaction's time either way).
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_dream_unlock'::regproc);
    IF strpos(def, 'engram: time read first') > 0 THEN
        RETURN; -- patched at an earlier start
    END IF;
    fixed := replace(replace(def,
        'last_run_at = CASE WHEN p_status = ''ok'' THEN now() ELSE last_run_at END',
        'last_run_at = CASE WHEN p_status = ''ok'' THEN engram_now ELSE last_run_at END'),
        E'BEGIN\n    UPDATE dream_state SET',
        E'-- engram: time read first (storage/citus/20_functions.sql)\n' ||
        E'DECLARE\n    engram_now timestamptz := now();\n' ||
        E'BEGIN\n    UPDATE dream_state SET');
    IF strpos(fixed, 'THEN engram_now ELSE') = 0
       OR strpos(fixed, 'engram: time read first') = 0 THEN
        RAISE EXCEPTION 'engram_dream_unlock changed: patch its last_run_at';
    END IF;
    EXECUTE fixed;
END $$;

-- engram_memory_store_batch: an idempotent replay passed the whole memories row to
-- engram_meta_of; in the query sent to the shard that row is of the shard's type
-- ("function engram_meta_of(memories_102209) does not exist"). The row is built from its
-- columns and cast to memories, as the session functions' rows above.
DO $$
DECLARE
    def text;
    fixed text;
BEGIN
    def := pg_get_functiondef('engram_memory_store_batch'::regproc);
    IF strpos(def, '(SELECT ROW(m.*)::memories FROM memories m') > 0 THEN
        RETURN; -- patched at an earlier start
    END IF;
    fixed := replace(def,
        E'CROSS JOIN LATERAL engram_meta_of(\n' ||
        E'                    (SELECT m FROM memories m WHERE m.tenant_id = p_tenant AND m.id = o.id))',
        E'CROSS JOIN LATERAL engram_meta_of(\n' ||
        E'                    (SELECT ROW(m.*)::memories FROM memories m WHERE m.tenant_id = p_tenant AND m.id = o.id))');
    IF fixed = def THEN
        RAISE EXCEPTION 'engram_memory_store_batch changed: patch its idempotent replay';
    END IF;
    EXECUTE fixed;
END $$;

-- The background writers that take several tenants' rows in one call (the access-count
-- flush, the query counts of unlimited tiers) run on the coordinator. Citus plans neither
-- single-node statement (an UPDATE ... FROM unnest() calling the STABLE timestamptz +
-- interval on a column; an INSERT ... SELECT from unnest() with a correlated EXISTS), so on
-- Citus they write tenant by tenant, each statement routed to one tenant's shard, in tenant
-- order as before. One call still commits once (a two-phase commit when its tenants live on
-- two workers: these are counters flushed in the background, not stores).
-- engram_memory_touch writes each tenant's counts with one INSERT ... SELECT from the
-- arrays (Citus evaluates the SELECT on the coordinator and sends the rows to the tenant's
-- shard), the same id's entries summed first (ON CONFLICT may touch a row once per
-- statement): one statement per tenant and flush where it wrote one per memory read.
CREATE OR REPLACE FUNCTION engram_memory_touch(p_tenant bigint[], p_ids bigint[],
                                               p_counts bigint[], p_at_ms bigint[])
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET plan_cache_mode = force_custom_plan AS $f$
DECLARE
    t bigint;
BEGIN
    FOR t IN SELECT DISTINCT u.tenant FROM unnest(p_tenant) AS u (tenant) ORDER BY 1 LOOP
        INSERT INTO memory_access AS a (tenant_id, id, access_count, last_accessed_at)
            SELECT t, u.id, sum(u.cnt),
                   max('epoch'::timestamptz + u.at * interval '1 millisecond')
              FROM unnest(p_tenant, p_ids, p_counts, p_at_ms) AS u (tenant, id, cnt, at)
             WHERE u.tenant = t
             GROUP BY u.id
             ORDER BY u.id
            ON CONFLICT (tenant_id, id) DO UPDATE SET
                access_count = a.access_count + excluded.access_count,
                last_accessed_at = greatest(a.last_accessed_at, excluded.last_accessed_at);
    END LOOP;
    RETURN cardinality(p_ids);
END $f$;

CREATE OR REPLACE FUNCTION engram_query_count(p_tenants bigint[], p_counts bigint[])
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER AS $f$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.tenant, c.n FROM unnest(p_tenants, p_counts) AS c (tenant, n)
              ORDER BY c.tenant
    LOOP
        IF EXISTS (SELECT 1 FROM tenants t WHERE t.id = r.tenant) THEN
            INSERT INTO tenant_usage AS u (tenant_id, day, queries)
                VALUES (r.tenant, (now() AT TIME ZONE 'UTC')::date, r.n)
                ON CONFLICT (tenant_id, day) DO UPDATE SET queries = u.queries + EXCLUDED.queries;
        END IF;
    END LOOP;
END $f$;

-- engram_key_touch: "WHERE id = p_key" alone names no tenant, so Citus sent the UPDATE to
-- every shard of api_keys and committed each authentication's touch in two phases on both
-- workers (seen in pg_dist_transaction). The key's tenant is read first (a read on every
-- shard commits in one phase), then the one row is updated on its tenant's worker.
CREATE OR REPLACE FUNCTION engram_key_touch(p_key bigint) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER AS $f$
DECLARE
    v_tenant bigint;
BEGIN
    SELECT k.tenant_id INTO v_tenant FROM api_keys k WHERE k.id = p_key;
    IF FOUND THEN
        UPDATE api_keys SET last_used_at = date_trunc('milliseconds', now())
         WHERE tenant_id = v_tenant AND id = p_key;
    END IF;
END $f$;

-- engram_access_fold (the background fold of idle access counts into memories) selected
-- FOR UPDATE SKIP LOCKED across tenants, which Citus refuses ("could not run distributed
-- query with FOR UPDATE/SHARE commands"). On Citus it takes one tenant at a time, in
-- tenant order as before, the same statement with the tenant named (routed to its shard),
-- until p_limit counts are moved. A fold that touches tenants on both workers commits in
-- two phases (background counters, not stores). The single-node definition it replaces is
-- checked first: a function file that changes it fails the Citus migration.
DO $$
DECLARE
    def text := pg_get_functiondef('engram_access_fold(integer, integer)'::regprocedure);
BEGIN
    IF strpos(def, 'engram: one tenant at a time') = 0
       AND (strpos(def, 'FOR UPDATE SKIP LOCKED') = 0
            OR strpos(def, 'DELETE FROM memory_access a USING picked p') = 0
            OR strpos(def, 'ORDER BY tenant_id, id LIMIT p_limit') = 0) THEN
        RAISE EXCEPTION 'engram_access_fold changed: redo its Citus version';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION engram_access_fold(p_limit integer, p_idle_s integer)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER AS $f$
DECLARE
    -- engram: one tenant at a time (storage/citus/20_functions.sql)
    v_tenant bigint;
    v_done bigint := 0;
    v_n bigint;
BEGIN
    FOR v_tenant IN SELECT DISTINCT a.tenant_id FROM memory_access a
                     WHERE a.last_accessed_at <= now() - make_interval(secs => p_idle_s)
                     ORDER BY a.tenant_id
    LOOP
        EXIT WHEN v_done >= p_limit;
        WITH picked AS (
            SELECT x.tenant_id, x.id FROM memory_access x
             WHERE x.tenant_id = v_tenant
               AND x.last_accessed_at <= now() - make_interval(secs => p_idle_s)
             ORDER BY x.id LIMIT p_limit - v_done
               FOR UPDATE SKIP LOCKED
        ), gone AS (
            DELETE FROM memory_access a USING picked p
             WHERE a.tenant_id = v_tenant AND a.tenant_id = p.tenant_id AND a.id = p.id
            RETURNING a.tenant_id, a.id, a.access_count, a.last_accessed_at
        ), folded AS (
            UPDATE memories m SET
                access_count = m.access_count + g.access_count,
                last_accessed_at = greatest(m.last_accessed_at, g.last_accessed_at)
              FROM gone g
             WHERE m.tenant_id = v_tenant AND m.tenant_id = g.tenant_id AND m.id = g.id
            RETURNING 1)
        SELECT (SELECT count(*) FROM gone) + 0 * (SELECT count(*) FROM folded) INTO v_n;
        v_done := v_done + v_n;
    END LOOP;
    RETURN v_done;
END $f$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION engram_memory_touch(bigint[], bigint[], bigint[], bigint[]) '
                   'SET search_path = %s', current_setting('search_path'));
    EXECUTE format('ALTER FUNCTION engram_query_count(bigint[], bigint[]) SET search_path = %s',
                   current_setting('search_path'));
    EXECUTE format('ALTER FUNCTION engram_key_touch(bigint) SET search_path = %s',
                   current_setting('search_path'));
    EXECUTE format('ALTER FUNCTION engram_access_fold(integer, integer) SET search_path = %s',
                   current_setting('search_path'));
END $$;

-- Generic plans: the single-node files give the hot writers plan_cache_mode =
-- force_generic_plan (planned once per connection). Citus cannot build a distributed plan
-- for a statement whose parameters stay unresolved: the INSERT ... SELECT in a modifying CTE
-- of engram_memory_store_batch failed with "could not create distributed plan ... parameters
-- in SQL functions" under a generic plan and plans and runs with the values bound (checked
-- in psql, the same call, the setting alone changed). On Citus those functions plan each
-- call with its values (force_custom_plan, not auto: auto tries a generic plan after five
-- calls).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'public'
           AND 'plan_cache_mode=force_generic_plan' = ANY (p.proconfig)
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_custom_plan', f);
    END LOOP;
END $$;

-- engram_memory_store_as: engram_memory_store_batch for a store group (issue 35 item 2,
-- server/methods/gcommit.h): engramd sends the stores of several tenants whose rows live on
-- one worker as one transaction of calls to this function, each delegated by p_tenant to
-- that worker, so the group commits there in one local transaction (no two-phase commit).
-- The coordinator would pass a SET LOCAL of engram.tenant_id on to the worker as a round
-- trip of its own per tenant, so the call binds row-level security to its tenant itself,
-- on the worker, for the statements of engram_memory_store_batch that follow (the same
-- tenant: Citus lets a delegated call touch only its own tenant's shards). It does so with
-- SET LOCAL, not set_config(): when Citus runs the call on the coordinator instead (a
-- promoted worker whose metadata is not synced yet), the coordinator passes the SET on to
-- the worker's connection, so the tenant's row is seen there and the store fails as the
-- one-tenant path does in that state ("COPY ... row-level security": unavailable, retried)
-- rather than as "tenant not found" (seen in test_citus_ha with set_config()).
CREATE OR REPLACE FUNCTION engram_memory_store_as(
        p_tenant bigint, p_limits bigint[], p_idem text, p_fingerprint bytea, p_dim integer,
        p_agent bigint[], p_clade bigint[], p_scope text[], p_type text[], p_content text[],
        p_importance double precision[], p_metadata text[], p_embeddings bytea,
        p_created_ms bigint[], p_updated_ms bigint[], p_accessed_ms bigint[],
        p_access_count bigint[], p_expires_ms bigint[], p_pinned boolean[],
        p_gen bigint DEFAULT NULL)
    RETURNS TABLE (idx integer, replay boolean, r_created_ms bigint, m_id bigint, m_seq bigint,
                   m_agent_id bigint, m_clade_id bigint, m_scope text, m_type text,
                   m_importance double precision, m_created_ms bigint, m_accessed_ms bigint,
                   m_access_count bigint, m_expires_ms bigint, m_archived_ms bigint,
                   m_pinned boolean, m_tags text)
    LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('SET LOCAL engram.tenant_id = %L', p_tenant::text);
    RETURN QUERY SELECT * FROM engram_memory_store_batch(
        p_tenant, p_limits, p_idem, p_fingerprint, p_dim, p_agent, p_clade, p_scope, p_type,
        p_content, p_importance, p_metadata, p_embeddings, p_created_ms, p_updated_ms,
        p_accessed_ms, p_access_count, p_expires_ms, p_pinned, p_gen);
END $$;

-- Functions whose rows are one tenant's: run on the node holding that tenant.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'public' AND p.prokind = 'f'
           AND p.proargnames IS NOT NULL
           AND array_position(p.proargnames, 'p_tenant') IS NOT NULL
           AND (CASE WHEN p.proallargtypes IS NULL
                     THEN p.proargtypes[array_position(p.proargnames, 'p_tenant') - 1]
                     ELSE p.proallargtypes[array_position(p.proargnames, 'p_tenant')]
                END) = 'bigint'::regtype
           AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                            WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid
                              AND o.distribution_argument_index IS NOT NULL)
    LOOP
        PERFORM create_distributed_function(f, 'p_tenant'::text, 'tenants'::text, true);
    END LOOP;
END $$;

-- The rest: on every node as they are (helpers the delegated functions call, trigger
-- functions, the row-level security function).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'public'
           AND NOT EXISTS (SELECT 1 FROM pg_depend d
                            WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                              AND d.deptype = 'e')
           AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                            WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid)
    LOOP
        PERFORM create_distributed_function(f);
    END LOOP;
END $$;
