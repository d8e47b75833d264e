/* server/methods/m_work.c: the session.work_item.* methods (work items of a session) and
 * session.audit (the session's audit log).
 *
 * A work item belongs to a top-level session; its sub-agents read and change their
 * parent's items through their own session ids. Each handler validates its arguments and
 * runs one statement of storage/sql_work.h (functions/35_work_items.sql), which does the
 * whole operation in one transaction under the session's row lock (the parent's first for
 * a sub-agent) and answers with one JSON document (sq.h). Changes are recorded in the
 * audit log by triggers in the same transaction. Handlers run on the request's worker
 * thread and end the request exactly once.
 */
#include <stdint.h>

#include "handlers.h"
#include "plimits.h"
#include "sq.h"
#include "sql_work.h"

/* Fixed caps (documented in docs/protocol.md). */
#define TITLE_MAX 256
#define MAX_WORK_ITEMS 1000
#define LIST_MAX 1000
#define LIST_DEFAULT 100

/* a cursor is an id or a seq: within bigint */
#define CURSOR_PARAM                                                                               \
    {                                                                                              \
        "cursor", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 9.2e18                              \
    }

static const char *const statuses[] = {"open", "in_progress", "blocked", "done", "cancelled", NULL};
/* the statuses a new work item may start in */
static const char *const new_statuses[] = {"open", "in_progress", "blocked", NULL};

/* ---- session.work_item.add ------------------------------------------------------------------ */

enum { P_WA_SESSION, P_WA_TITLE, P_WA_DESCRIPTION, P_WA_STATUS, P_WA_OWNER, P_WA_AGENT };
ENUMS(session_work_item_add, {"status", new_statuses});
PARAMS(session_work_item_add, ID_PARAM("session_id"),
       {"title", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, TITLE_MAX},
       {"description", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE | RPC_P_LIMIT(PLIM_WORK_ITEM), 0, 0},
       {"status", RPC_T_STR, RPC_P_NULLABLE, 0, 0}, OPT_ID_PARAM("owner_agent_id"),
       OPT_ID_PARAM("agent_id"));

/* session.work_item.add: a new work item of the session (a sub-agent's: of its parent). */
void h_session_work_item_add(req *r)
{
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_WA_SESSION));
    sq_str(&q, req_arg(r, P_WA_TITLE));
    sq_str(&q, req_arg(r, P_WA_DESCRIPTION));
    sq_str(&q, req_arg(r, P_WA_STATUS));
    sq_u64(&q, req_arg(r, P_WA_OWNER));
    sq_u64(&q, req_arg(r, P_WA_AGENT));
    sq_i64(&q, MAX_WORK_ITEMS);
    sq_submit(&q, sqlw_def(SQLW_ADD));
}

/* ---- session.work_item.update --------------------------------------------------------------- */

enum {
    P_WU_SESSION,
    P_WU_ITEM,
    P_WU_TITLE,
    P_WU_DESCRIPTION,
    P_WU_STATUS,
    P_WU_OWNER,
    P_WU_EXPECTED,
    P_WU_AGENT
};
ENUMS(session_work_item_update, {"status", statuses});
PARAMS(session_work_item_update, ID_PARAM("session_id"), ID_PARAM("work_item_id"),
       {"title", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, TITLE_MAX},
       {"description", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE | RPC_P_LIMIT(PLIM_WORK_ITEM), 0, 0},
       {"status", RPC_T_STR, RPC_P_NULLABLE, 0, 0}, OPT_ID_PARAM("owner_agent_id"),
       OPT_ID_PARAM("expected_version"), OPT_ID_PARAM("agent_id"));

/* session.work_item.update: changes the fields given; a status change must be a legal
 * transition, and expected_version (optional) the item's version. */
void h_session_work_item_update(req *r)
{
    const msgpack_object *status = req_arg(r, P_WU_STATUS);
    if (!req_arg(r, P_WU_TITLE) && !req_arg(r, P_WU_DESCRIPTION) && !status &&
        !req_arg(r, P_WU_OWNER)) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "nothing to update: give title, description, status or owner_agent_id");
        return;
    }
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_WU_SESSION));
    sq_u64(&q, req_arg(r, P_WU_ITEM));
    sq_str(&q, req_arg(r, P_WU_TITLE));
    sq_str(&q, req_arg(r, P_WU_DESCRIPTION));
    sq_str(&q, status);
    sq_u64(&q, req_arg(r, P_WU_OWNER));
    sq_u64(&q, req_arg(r, P_WU_EXPECTED));
    sq_u64(&q, req_arg(r, P_WU_AGENT));
    sq_submit(&q, sqlw_def(SQLW_UPDATE));
}

/* ---- session.work_item.list ----------------------------------------------------------------- */

enum { P_WL_SESSION, P_WL_STATUSES, P_WL_OWNER, P_WL_CURSOR, P_WL_LIMIT };
ENUMS(session_work_item_list, {"statuses", statuses});
PARAMS(session_work_item_list, ID_PARAM("session_id"),
       {"statuses", RPC_T_STR_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 1, 5},
       OPT_ID_PARAM("owner_agent_id"), CURSOR_PARAM,
       {"limit", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, LIST_MAX});

/* session.work_item.list: the session's work items in id order, one page per call. */
void h_session_work_item_list(req *r)
{
    const msgpack_object *st = req_arg(r, P_WL_STATUSES);
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_WL_SESSION));
    sq_words(&q, st);
    sq_u64(&q, req_arg(r, P_WL_OWNER));
    sq_u64(&q, req_arg(r, P_WL_CURSOR));
    sq_i64(&q, (int64_t)rpc_get_uint(req_arg(r, P_WL_LIMIT), LIST_DEFAULT));
    sq_submit(&q, sqlw_def(SQLW_LIST));
}

/* ---- session.audit -------------------------------------------------------------------------- */

enum { P_AU_SESSION, P_AU_SINCE, P_AU_CURSOR, P_AU_LIMIT };
PARAMS(session_audit, ID_PARAM("session_id"),
       {"since", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 9.2e18}, CURSOR_PARAM,
       {"limit", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, LIST_MAX});

/* session.audit: one page of the session's audit log in seq order, after cursor. */
void h_session_audit(req *r)
{
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_AU_SESSION));
    sq_u64(&q, req_arg(r, P_AU_SINCE));
    sq_u64(&q, req_arg(r, P_AU_CURSOR));
    sq_i64(&q, (int64_t)rpc_get_uint(req_arg(r, P_AU_LIMIT), LIST_DEFAULT));
    sq_submit(&q, sqlw_def(SQLW_AUDIT));
}
