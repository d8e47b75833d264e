/* storage/sql_session.h: the prepared statements of the sessions capability.
 *
 * Each statement calls one PL/pgSQL function of functions/30_sessions.sql (SQLS_PROMPT:
 * 36_prompt.sql) and returns one row with one text column: the result as a JSON document
 * (server/methods/m_session.c turns it into MessagePack). The first argument is always the
 * authenticated tenant.
 */
#ifndef ENGRAM_STORAGE_SQL_SESSION_H
#define ENGRAM_STORAGE_SQL_SESSION_H

#include "db.h"

typedef enum sqls_stmt {
    SQLS_CREATE, /* (tenant, agent, config, max live sessions) -> {session_id, created_at,
                    config} */
    SQLS_GET,    /* (tenant, session) -> session */
    SQLS_LIST,   /* (tenant, agent, state, cursor, limit) -> {sessions, next_cursor} */
    SQLS_END,    /* (tenant, session, summary) -> {session_id, state, ended_at} */
    SQLS_DELETE, /* (tenant, session, cascade) -> {session_id, deleted, session_ids} */
    SQLS_APPEND, /* (tenant, session, role, content, parent, tokens, cost, agent, max entries, max
                    bytes, compact_context_windows) -> {entry_id, seq, total_cost_usdc} */
    SQLS_TOMBSTONE, /* (tenant, session or NULL, entry) -> {entry_id, tombstone_id, session_id} */
    SQLS_SUMMARIZE, /* (tenant, session or NULL, summary, through, compacted, max entries, max
                       bytes) -> {entry_id, session_id, compaction_count} */
    SQLS_MESSAGES,  /* (tenant, session, tail, agent, cursor, limit, max bytes, events) ->
                       {session_id, position, as_of, messages, next_cursor} */
    SQLS_CONTEXT,   /* (tenant, session, budget tokens, agent) -> {text, tokens_used, ...} */
    SQLS_SCRATCHPAD_GET,    /* (tenant, session) -> scratchpad */
    SQLS_SCRATCHPAD_UPDATE, /* (tenant, session, content, expected version, tokens) -> scratchpad */
    SQLS_NOTE_ADD, /* (tenant, session, category, key, value, scope, work item, agent, max notes) ->
                      {note_id, superseded} */
    SQLS_NOTES,    /* (tenant, session, scopes, categories, since ms, agent) -> {notes} */
    SQLS_TASK_COMPLETE, /* (tenant, session, work item) -> {cleared} */
    SQLS_CHECKPOINT,    /* (tenant, session, label, metadata, ttl s, max checkpoints) ->
                           {checkpoint_id, ...} */
    SQLS_CHECKPOINTS,   /* (tenant, session) -> {checkpoints} */
    SQLS_RESUME,        /* (tenant, checkpoint, config override, branch type, max live sessions,
                           the checkpoint's session or NULL) -> {session_id, ...} */
    SQLS_SPAWN,    /* (tenant, parent, task, model, context, max tokens, return format, agent, max
                      children, max entries, max bytes) -> {session_id} */
    SQLS_COMPLETE, /* (tenant, session, output) -> {session_id, state, completed_at} */
    SQLS_CHILDREN, /* (tenant, session) -> {children} */
    SQLS_HANDOFF,  /* (tenant, session, mode, agent) -> package */
    SQLS_PROMPT,   /* (tenant, session, working memory cap bytes, transcript share bytes, agent)
                      -> {session_id, working_memory, transcript, summary, messages}
                      (functions/36_prompt.sql) */
    SQLS__COUNT
} sqls_stmt;

/* The table, for sql.c to gather into the one statement array. */
extern const db_stmt_def sql_session_stmts[SQLS__COUNT];

/* sqls_def returns statement s of the table (db_query.stmt, pgsync_exec_stmt). */
static inline const db_stmt_def *sqls_def(sqls_stmt s)
{
    return &sql_session_stmts[s];
}

#endif
