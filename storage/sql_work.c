/* storage/sql_work.c: the work item and audit log statements (see sql_work.h). */
#include "sql_work.h"

const db_stmt_def sql_work_stmts[SQLW__COUNT] = {
    [SQLW_ADD] = {"work_item_add",
                  "SELECT engram_work_item_add($1::bigint, $2::bigint, $3::text, $4::text, "
                  "$5::text, $6::bigint, $7::bigint, $8::bigint)::text",
                  8},
    [SQLW_UPDATE] = {"work_item_update",
                     "SELECT engram_work_item_update($1::bigint, $2::bigint, $3::bigint, "
                     "$4::text, $5::text, $6::text, $7::bigint, $8::bigint, $9::bigint)::text",
                     9},
    [SQLW_LIST] = {"work_item_list",
                   "SELECT engram_work_item_list($1::bigint, $2::bigint, $3::text[], "
                   "$4::bigint, $5::bigint, $6::integer)::text",
                   6},
    [SQLW_AUDIT] = {"session_audit",
                    "SELECT engram_session_audit($1::bigint, $2::bigint, $3::bigint, "
                    "$4::bigint, $5::integer)::text",
                    5},
};
