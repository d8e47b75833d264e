/* storage/sql_work.h: the prepared statements of work items and the sessions' audit log.
 *
 * Each statement calls one PL/pgSQL function of functions/35_work_items.sql and returns one
 * row with one text column: the result as a JSON document (server/methods/m_work.c turns it
 * into MessagePack). The first argument is always the authenticated tenant.
 */
#ifndef ENGRAM_STORAGE_SQL_WORK_H
#define ENGRAM_STORAGE_SQL_WORK_H

#include "db.h"

typedef enum sqlw_stmt {
    SQLW_ADD,    /* (tenant, session, title, description, status, owner, agent, max items) ->
                    work item */
    SQLW_UPDATE, /* (tenant, session, item, title, description, status, owner, expected version,
                    agent) -> work item + {changed} */
    SQLW_LIST,  /* (tenant, session, statuses, owner, cursor, limit) -> {work_items, next_cursor} */
    SQLW_AUDIT, /* (tenant, session, since ms, cursor, limit) -> {records, next_cursor, more} */
    SQLW__COUNT
} sqlw_stmt;

/* The table, for sql.c to gather into the one statement array. */
extern const db_stmt_def sql_work_stmts[SQLW__COUNT];

/* sqlw_def returns statement s of the table (db_query.stmt). */
static inline const db_stmt_def *sqlw_def(sqlw_stmt s)
{
    return &sql_work_stmts[s];
}

#endif
