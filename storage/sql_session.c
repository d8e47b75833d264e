/* storage/sql_session.c: the sessions statements (see sql_session.h). */
#include "sql_session.h"

#define FN(name, args) "SELECT engram_session_" name "(" args ")::text"

const db_stmt_def sql_session_stmts[SQLS__COUNT] = {
    [SQLS_CREATE] = {"session_create",
                     FN("create", "$1::bigint, $2::bigint, $3::jsonb, $4::bigint"), 4},
    [SQLS_GET] = {"session_get", FN("get", "$1::bigint, $2::bigint"), 2},
    [SQLS_LIST] = {"session_list",
                   FN("list", "$1::bigint, $2::bigint, $3::text, $4::bigint, $5::integer"), 5},
    [SQLS_END] = {"session_end", FN("end", "$1::bigint, $2::bigint, $3::text"), 3},
    [SQLS_DELETE] = {"session_delete", FN("delete", "$1::bigint, $2::bigint, $3::boolean"), 3},
    [SQLS_APPEND] = {"session_append",
                     FN("append", "$1::bigint, $2::bigint, $3::text, $4::text, $5::bigint, "
                                  "$6::bigint, $7::numeric, $8::bigint, $9::bigint, $10::bigint, "
                                  "$11::text"),
                     11},
    [SQLS_TOMBSTONE] = {"session_tombstone", FN("tombstone", "$1::bigint, $2::bigint, $3::bigint"),
                        3},
    [SQLS_SUMMARIZE] =
        {"session_summarize",
         FN("summarize",
            "$1::bigint, $2::bigint, $3::text, $4::bigint, $5::bigint, $6::bigint, $7::bigint"),
         7},
    [SQLS_MESSAGES] = {"session_messages",
                       FN("messages", "$1::bigint, $2::bigint, $3::bigint, $4::bigint, $5::text, "
                                      "$6::bigint, $7::bigint, $8::boolean"),
                       8},
    [SQLS_CONTEXT] = {"session_context",
                      FN("context", "$1::bigint, $2::bigint, $3::bigint, $4::bigint"), 4},
    [SQLS_SCRATCHPAD_GET] = {"session_scratchpad_get",
                             FN("scratchpad_get", "$1::bigint, $2::bigint"), 2},
    [SQLS_SCRATCHPAD_UPDATE] = {"session_scratchpad_update",
                                FN("scratchpad_update",
                                   "$1::bigint, $2::bigint, $3::text, $4::bigint, $5::bigint"),
                                5},
    [SQLS_NOTE_ADD] = {"session_note_add",
                       FN("note_add", "$1::bigint, $2::bigint, $3::text, $4::text, $5::text, "
                                      "$6::text, $7::jsonb, $8::bigint, $9::bigint"),
                       9},
    [SQLS_NOTES] = {"session_notes",
                    FN("notes",
                       "$1::bigint, $2::bigint, $3::text[], $4::text[], $5::bigint, $6::bigint"),
                    6},
    [SQLS_TASK_COMPLETE] = {"session_task_complete",
                            FN("task_complete", "$1::bigint, $2::bigint, $3::jsonb"), 3},
    [SQLS_CHECKPOINT] = {"session_checkpoint",
                         FN("checkpoint",
                            "$1::bigint, $2::bigint, $3::text, $4::jsonb, $5::bigint, $6::bigint"),
                         6},
    [SQLS_CHECKPOINTS] = {"session_checkpoints", FN("checkpoints", "$1::bigint, $2::bigint"), 2},
    [SQLS_RESUME] = {"session_resume",
                     FN("resume",
                        "$1::bigint, $2::bigint, $3::jsonb, $4::text, $5::bigint, $6::bigint"),
                     6},
    [SQLS_SPAWN] = {"session_spawn",
                    FN("spawn", "$1::bigint, $2::bigint, $3::text, $4::text, $5::text, $6::bigint, "
                                "$7::text, $8::bigint, $9::bigint, $10::bigint, $11::bigint"),
                    11},
    [SQLS_COMPLETE] = {"session_complete", FN("complete", "$1::bigint, $2::bigint, $3::text"), 3},
    [SQLS_CHILDREN] = {"session_children", FN("children", "$1::bigint, $2::bigint"), 2},
    [SQLS_HANDOFF] = {"session_handoff",
                      FN("handoff", "$1::bigint, $2::bigint, $3::text, $4::bigint"), 4},
    [SQLS_PROMPT] = {"session_prompt",
                     FN("prompt", "$1::bigint, $2::bigint, $3::bigint, $4::bigint, $5::bigint"), 5},
};
