/* server/methods/m_session.c: the session.* methods: sessions, transcripts, working memory,
 * checkpoints and resume, sub-agents, handoff.
 *
 * The handlers validate every argument (nested maps included) and turn it into text
 * parameters of one prepared statement; each statement calls one PL/pgSQL function of
 * functions/30_sessions.sql that does the whole operation in one transaction under the
 * session's row lock and returns the result as one JSON document, which sq (sq.h) turns
 * into the MessagePack result. Rules that need the database's state (cost caps, tier
 * limits, versions, single-level branching) are checked there; their SQLSTATEs map to the
 * client's error codes, and the DETAIL of EG402/EG409/EG429 ("limit=N usage=M") becomes
 * fields of the error map. Handlers run on the request's worker thread and end the request
 * exactly once: through sq_submit, or with req_fail before anything is submitted.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "plimits.h"
#include "json.h"
#include "log.h"
#include "chat.h"
#include "sq.h"
#include "sql_session.h"

/* Fixed caps (documented in docs/protocol.md); transcript text, summaries, tasks, outputs,
 * scratchpads, notes and labels are bounded by settings instead (plimits.h). */
#define MODEL_MAX 256
#define NAME_MAX_BYTES 256
#define TEMPLATE_PARAMS_MAX 64
#define TEMPLATE_VALUE_MAX 4096
#define COST_MAX 1e9
#define TOKENS_MAX 1e12
#define NOTE_KEY_MAX 256
#define METADATA_MAX_BYTES 65536
#define METADATA_MAX_DEPTH 16
#define MAX_NOTES 10000
#define MAX_CHECKPOINTS 1000
#define MAX_CHILDREN 256
#define REPLAY_DEPTH_MAX 1000
#define TAIL_MAX 100000
#define LIST_MAX 1000
#define LIST_DEFAULT 100
#define PAGE_MAX 1000 /* session.messages items per page */
#define PAGE_DEFAULT 100
#define PAGE_BYTES (4 << 20)  /* session.messages content bytes per page (>= 1 item) */
#define CURSOR_MAX 40         /* "upto.after" */
#define CONTEXT_BUDGET_MIN 64 /* session.context: the block's frame must fit */
#define CONTEXT_BUDGET_MAX 1000000
#define CONTEXT_BUDGET_DEFAULT 8000 /* the seed's 5-10K tokens of session context */
#define SUB_MAX_TOKENS 16777216
#define JSON_TOO_BIG SQ_JSON_TOO_BIG

/* ---- statements ------------------------------------------------------------------------ */

/* Submits the sessions statement st with q's parameters (sq_submit). */
static void sq_run(sq *q, sqls_stmt st)
{
    sq_submit(q, sqls_def(st));
}

/* ---- validation helpers ----------------------------------------------------------------- */

static const tier_limits *tier_of(req *r)
{
    int tier = req_auth(r)->tier;
    if (tier < 0 || tier >= TIER_COUNT)
        tier = TIER_FREE;
    return &server_tiers(req_server(r))[tier];
}

/* Checks the map m against schema (n entries) as rpc_bind_params checks parameters, naming
 * each field "prefix.key": unknown and duplicate keys, types, ranges, required fields.
 * Fills out[i] (NULL when absent or nil). Returns true, or false after failing the
 * request. */
static bool check_map(req *r, const msgpack_object *m, const char *prefix, const rpc_param *schema,
                      size_t n, const msgpack_object **out)
{
    char what[320], err[512];
    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    bool seen[16] = {false}; /* every schema here has fewer fields */
    for (uint32_t k = 0; k < m->via.map.size; k++) {
        const msgpack_object_kv *kv = &m->via.map.ptr[k];
        const msgpack_object_str *key = &kv->key.via.str;
        size_t i = 0;
        while (i < n && !rpc_str_eq(&kv->key, schema[i].name))
            i++;
        if (i == n) {
            req_fail(r, RPC_INVALID_ARGUMENT, "unknown parameter '%s.%.*s'", prefix,
                     (int)(key->size > 64 ? 64 : key->size), key->ptr);
            return false;
        }
        snprintf(what, sizeof(what), "%s.%s", prefix, schema[i].name);
        if (seen[i]) {
            req_fail(r, RPC_INVALID_ARGUMENT, "duplicate parameter '%s'", what);
            return false;
        }
        seen[i] = true;
        if (rpc_check_param(&kv->val, &schema[i], what, err, sizeof(err)) != 0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "%s", err);
            return false;
        }
        if (kv->val.type != MSGPACK_OBJECT_NIL) /* nil passed only where nullable */
            out[i] = &kv->val;
    }
    for (size_t i = 0; i < n; i++) {
        if ((schema[i].flags & RPC_P_REQUIRED) && !out[i]) {
            req_fail(r, RPC_INVALID_ARGUMENT, "missing required parameter '%s.%s'", prefix,
                     schema[i].name);
            return false;
        }
    }
    return true;
}

/* The session configuration. model is required in session.create's config and optional
 * in session.resume's config_override; nil removes an optional key in an override. */
enum { C_MODEL, C_SYSTEM_PROMPT, C_TEMPLATE, C_COMPACTION, C_MAX_COST, C_REPLAY_DEPTH, C__N };
static const rpc_param config_schema[C__N] = {
    {"model", RPC_T_STR, RPC_P_RANGE, 1, MODEL_MAX},
    {"system_prompt", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE | RPC_P_LIMIT(PLIM_ENTRY), 0, 0},
    {"template", RPC_T_MAP, RPC_P_NULLABLE, 0, 0},
    {"compaction", RPC_T_MAP, RPC_P_NULLABLE, 0, 0},
    {"max_cost_usdc", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0, COST_MAX},
    {"transcript_replay_depth", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, REPLAY_DEPTH_MAX},
};

enum { T_NAME, T_VERSION, T_PARAMS, T__N };
static const rpc_param template_schema[T__N] = {
    {"name", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, NAME_MAX_BYTES},
    {"version", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, NAME_MAX_BYTES},
    {"params", RPC_T_MAP, RPC_P_NULLABLE | RPC_P_RANGE, 0, TEMPLATE_PARAMS_MAX},
};

/* Auto-compaction settings; absent ones take the seed's defaults (engram_session_config). */
enum { K_ENABLED, K_THRESHOLD, K_KEEP_RECENT, K_TOOL_BUDGET, K_MAX_FAILURES, K__N };
static const rpc_param compaction_schema[K__N] = {
    {"enabled", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0},
    {"threshold", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0.01, 1},
    {"keep_recent", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1000000},
    {"tool_result_budget", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 0, TOKENS_MAX},
    {"max_failures", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 1000},
};

/* Validates a config map (prefix "config" or "config_override"). Returns true, or false
 * after failing the request. */
static bool check_config(req *r, const msgpack_object *cfg, const char *prefix, bool need_model)
{
    const msgpack_object *f[C__N], *t[T__N], *k[K__N];
    rpc_param schema[C__N];
    char what[64], err[512];
    memcpy(schema, config_schema, sizeof(schema));
    if (need_model)
        schema[C_MODEL].flags |= RPC_P_REQUIRED;
    if (!check_map(r, cfg, prefix, schema, C__N, f))
        return false;
    if (f[C_TEMPLATE]) {
        snprintf(what, sizeof(what), "%s.template", prefix);
        if (!check_map(r, f[C_TEMPLATE], what, template_schema, T__N, t))
            return false;
        for (uint32_t i = 0; t[T_PARAMS] && i < t[T_PARAMS]->via.map.size; i++) {
            const msgpack_object_kv *kv = &t[T_PARAMS]->via.map.ptr[i];
            snprintf(what, sizeof(what), "%s.template.params.%.*s", prefix,
                     (int)(kv->key.via.str.size > 32 ? 32 : kv->key.via.str.size),
                     kv->key.via.str.ptr);
            if (kv->key.via.str.size < 1 || kv->key.via.str.size > NAME_MAX_BYTES) {
                req_fail(r, RPC_INVALID_ARGUMENT,
                         "keys of '%s.template.params' must be 1 to %d bytes", prefix,
                         NAME_MAX_BYTES);
                return false;
            }
            if (rpc_check_value(&kv->val, RPC_T_STR, RPC_P_RANGE, 0, TEMPLATE_VALUE_MAX, what, err,
                                sizeof(err)) != 0) {
                req_fail(r, RPC_INVALID_ARGUMENT, "%s", err);
                return false;
            }
        }
    }
    if (f[C_COMPACTION]) {
        snprintf(what, sizeof(what), "%s.compaction", prefix);
        if (!check_map(r, f[C_COMPACTION], what, compaction_schema, K__N, k))
            return false;
    }
    return true;
}

/* Adds the validated config map as a JSON parameter. */
static bool add_config(req *r, sq *q, const msgpack_object *cfg)
{
    int rc = sq_json(q, cfg, 4, SIZE_MAX);
    if (rc != 0) {
        req_fail(r, RPC_INTERNAL, "cannot convert the configuration (%d)", rc);
        return false;
    }
    return true;
}

/* work_item_id (an unsigned integer, checked by its parameter's type, or NULL): a JSON
 * number, as notes store it; the function checks that the work item exists. */
static bool add_work_item(req *r, sq *q, const msgpack_object *o)
{
    if (sq_json(q, o, 0, SIZE_MAX) != 0) {
        req_fail(r, RPC_INTERNAL, "cannot convert 'work_item_id'");
        return false;
    }
    return true;
}

static const char *const roles[] = {"system", "user", "assistant", "tool", NULL};
static const char *const states[] = {"active", "ended", "completed", NULL};
static const char *const categories[] = {"decision", "discovery", "blocker",
                                         "context",  "handoff",   NULL};
static const char *const scopes[] = {"current_task", "session", "carry_forward", NULL};
/* "pre-steer" is seed 000's spelling of pre_steer (stored as pre_steer) */
static const char *const branch_types[] = {"resume",    "sim",   "pre_steer",
                                           "pre-steer", "dream", NULL};
static const char *const return_formats[] = {"summary", "full", NULL};
static const char *const modes[] = {"continue", "takeover", "review", "recovery", NULL};

/* Handlers whose only argument is the session id. */
static void session_only(req *r, sqls_stmt st)
{
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, 0));
    sq_run(&q, st);
}

/* ---- session.create, get, list, end -------------------------------------------------- */

enum { P_CR_AGENT, P_CR_CONFIG };
PARAMS(session_create, ID_PARAM("agent_id"),
       {"config", RPC_T_MAP, RPC_P_REQUIRED | RPC_P_LIMIT(PLIM_MESSAGE), 0, 0});

/* session.create: validates config (nested maps included) and creates the session. */
void h_session_create(req *r)
{
    const msgpack_object *cfg = req_arg(r, P_CR_CONFIG);
    if (!check_config(r, cfg, "config", true))
        return;
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_CR_AGENT));
    if (!add_config(r, &q, cfg))
        return;
    sq_i64(&q, tier_of(r)->max_live_sessions);
    sq_run(&q, SQLS_CREATE);
}

PARAMS(session_get, ID_PARAM("session_id"));

/* session.get: the session's state, costs, counters and constraint state. */
void h_session_get(req *r)
{
    session_only(r, SQLS_GET);
}

enum { P_LI_AGENT, P_LI_STATE, P_LI_CURSOR, P_LI_LIMIT };
PARAMS(session_list, OPT_ID_PARAM("agent_id"), {"state", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
       OPT_ID_PARAM("cursor"), {"limit", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, LIST_MAX});

/* session.list: the tenant's sessions, newest first, one page per call. */
void h_session_list(req *r)
{
    const msgpack_object *state = req_arg(r, P_LI_STATE);
    if (!sq_check_word(r, state, "state", states, "active, ended, completed"))
        return;
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_LI_AGENT));
    sq_str(&q, state);
    sq_u64(&q, req_arg(r, P_LI_CURSOR));
    sq_i64(&q, (int64_t)rpc_get_uint(req_arg(r, P_LI_LIMIT), LIST_DEFAULT));
    sq_run(&q, SQLS_LIST);
}

enum { P_EN_SESSION, P_EN_SUMMARY };
PARAMS(session_end, ID_PARAM("session_id"),
       {"summary", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE | RPC_P_LIMIT(PLIM_ENTRY), 0, 0});

/* session.end: ends an active session, keeping an optional summary. */
void h_session_end(req *r)
{
    const msgpack_object *summary = req_arg(r, P_EN_SUMMARY);
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_EN_SESSION));
    sq_str(&q, summary);
    sq_run(&q, SQLS_END);
}

enum { P_DE_SESSION, P_DE_CASCADE };
PARAMS(session_delete, ID_PARAM("session_id"), {"cascade", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

/* session.delete: removes a session, its sub-agents and everything they own from
 * PostgreSQL; sessions resumed from it go too only with cascade. */
void h_session_delete(req *r)
{
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_DE_SESSION));
    sq_add(&q, rpc_get_bool(req_arg(r, P_DE_CASCADE), false) ? "true" : "false");
    sq_run(&q, SQLS_DELETE);
}

/* ---- transcript ------------------------------------------------------------------------- */

enum { P_AP_SESSION, P_AP_ROLE, P_AP_CONTENT, P_AP_PARENT, P_AP_TOKENS, P_AP_COST, P_AP_AGENT };
PARAMS(session_append, ID_PARAM("session_id"), {"role", RPC_T_STR, RPC_P_REQUIRED, 0, 0},
       {"content", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE | RPC_P_LIMIT(PLIM_ENTRY), 0, 0},
       OPT_ID_PARAM("parent_id"),
       {"tokens", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 0, TOKENS_MAX},
       {"cost_usdc", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0, COST_MAX},
       OPT_ID_PARAM("agent_id"));

/* session.append: one transcript message, checked against the cost caps and the tier's
 * transcript limits in the same transaction that stores it. */
void h_session_append(req *r)
{
    const msgpack_object *content = req_arg(r, P_AP_CONTENT);
    if (!sq_check_word(r, req_arg(r, P_AP_ROLE), "role", roles, "system, user, assistant, tool"))
        return;
    const tier_limits *tl = tier_of(r);
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_AP_SESSION));
    sq_str(&q, req_arg(r, P_AP_ROLE));
    sq_str(&q, content);
    sq_u64(&q, req_arg(r, P_AP_PARENT));
    sq_u64(&q, req_arg(r, P_AP_TOKENS));
    sq_num(&q, req_arg(r, P_AP_COST));
    sq_u64(&q, req_arg(r, P_AP_AGENT));
    sq_i64(&q, tl->max_session_entries);
    sq_i64(&q, tl->max_session_bytes);
    /* auto-compact's trigger (autocompact.h): none without a chat model */
    sq_add(&q, chat_available() ? req_server(r)->cfg.compact_context_windows : NULL);
    sq_run(&q, SQLS_APPEND);
}

enum { P_TO_ENTRY, P_TO_SESSION };
PARAMS(session_tombstone, ID_PARAM("entry_id"), OPT_ID_PARAM("session_id"));

/* session.tombstone: hides an entry from the session's transcript from now on. */
void h_session_tombstone(req *r)
{
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_TO_SESSION));
    sq_u64(&q, req_arg(r, P_TO_ENTRY));
    sq_run(&q, SQLS_TOMBSTONE);
}

enum { P_SU_SESSION, P_SU_SUMMARY, P_SU_THROUGH, P_SU_COMPACTED };
PARAMS(session_summarize, OPT_ID_PARAM("session_id"),
       {"summary", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE | RPC_P_LIMIT(PLIM_ENTRY), 1, 0},
       ID_PARAM("through_entry_id"),
       {"messages_compacted", RPC_T_UINT, RPC_P_REQUIRED | RPC_P_RANGE, 0, TOKENS_MAX});

/* session.summarize: records a compaction summary standing in for earlier entries. */
void h_session_summarize(req *r)
{
    const msgpack_object *summary = req_arg(r, P_SU_SUMMARY);
    const tier_limits *tl = tier_of(r);
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_SU_SESSION));
    sq_str(&q, summary);
    sq_u64(&q, req_arg(r, P_SU_THROUGH));
    sq_u64(&q, req_arg(r, P_SU_COMPACTED));
    sq_i64(&q, tl->max_session_entries);
    sq_i64(&q, tl->max_session_bytes);
    sq_run(&q, SQLS_SUMMARIZE);
}

enum { P_ME_SESSION, P_ME_TAIL, P_ME_AGENT, P_ME_CURSOR, P_ME_LIMIT, P_ME_EVENTS };
PARAMS(session_messages, ID_PARAM("session_id"),
       {"tail", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, TAIL_MAX}, OPT_ID_PARAM("agent_id"),
       {"cursor", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, CURSOR_MAX},
       {"limit", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, PAGE_MAX},
       {"include_events", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

/* session.messages: one page of the history with tombstones applied and the summary in
 * place; next_cursor continues it as of the first page's transcript position (tail picks
 * the first page's start, so later pages may repeat it or leave it out). */
void h_session_messages(req *r)
{
    const msgpack_object *cursor = req_arg(r, P_ME_CURSOR);
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_ME_SESSION));
    sq_u64(&q, req_arg(r, P_ME_TAIL));
    sq_u64(&q, req_arg(r, P_ME_AGENT));
    sq_str(&q, cursor);
    sq_i64(&q, (int64_t)rpc_get_uint(req_arg(r, P_ME_LIMIT), PAGE_DEFAULT));
    sq_i64(&q, PAGE_BYTES);
    sq_add(&q, rpc_get_bool(req_arg(r, P_ME_EVENTS), false) ? "true" : "false");
    sq_run(&q, SQLS_MESSAGES);
}

enum { P_CX_SESSION, P_CX_BUDGET, P_CX_AGENT };
PARAMS(session_context, ID_PARAM("session_id"),
       {"budget_tokens", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, CONTEXT_BUDGET_MIN,
        CONTEXT_BUDGET_MAX},
       OPT_ID_PARAM("agent_id"));

/* session.context: the <working_memory> block and, for a resumed session, the resumed
 * session context with the agents' tails, within a token budget. */
void h_session_context(req *r)
{
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_CX_SESSION));
    sq_i64(&q, (int64_t)rpc_get_uint(req_arg(r, P_CX_BUDGET), CONTEXT_BUDGET_DEFAULT));
    sq_u64(&q, req_arg(r, P_CX_AGENT));
    sq_run(&q, SQLS_CONTEXT);
}

/* ---- working memory --------------------------------------------------------------------- */

PARAMS(session_scratchpad_get, ID_PARAM("session_id"));

/* session.scratchpad.get: the scratchpad document and its version. */
void h_session_scratchpad_get(req *r)
{
    session_only(r, SQLS_SCRATCHPAD_GET);
}

enum { P_SP_SESSION, P_SP_CONTENT, P_SP_EXPECTED, P_SP_TOKENS };
PARAMS(session_scratchpad_update, ID_PARAM("session_id"),
       {"content", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE | RPC_P_LIMIT(PLIM_SCRATCHPAD), 0, 0},
       OPT_ID_PARAM("expected_version"),
       {"token_count", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 0, TOKENS_MAX});

/* session.scratchpad.update: replaces the scratchpad (optimistic concurrency). */
void h_session_scratchpad_update(req *r)
{
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_SP_SESSION));
    sq_str(&q, req_arg(r, P_SP_CONTENT));
    sq_u64(&q, req_arg(r, P_SP_EXPECTED));
    sq_u64(&q, req_arg(r, P_SP_TOKENS));
    sq_run(&q, SQLS_SCRATCHPAD_UPDATE);
}

enum {
    P_NA_SESSION,
    P_NA_CATEGORY,
    P_NA_KEY,
    P_NA_VALUE,
    P_NA_SCOPE,
    P_NA_WORK,
    P_NA_WORK_SEED, /* related_work_item_id, seed 004's name: binds to P_NA_WORK */
    P_NA_AGENT
};
PARAMS(session_note_add, ID_PARAM("session_id"), {"category", RPC_T_STR, RPC_P_REQUIRED, 0, 0},
       {"key", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, NOTE_KEY_MAX},
       {"value", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE | RPC_P_LIMIT(PLIM_NOTE), 1, 0},
       {"scope", RPC_T_STR, RPC_P_REQUIRED, 0, 0}, OPT_ID_PARAM("work_item_id"),
       {"related_work_item_id", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_ALIAS, 0, 0},
       OPT_ID_PARAM("agent_id"));

static const char category_list[] = "decision, discovery, blocker, context, handoff";
static const char scope_list[] = "current_task, session, carry_forward";

/* session.note.add: a structured note; a live note with the same key is superseded. */
void h_session_note_add(req *r)
{
    if (!sq_check_word(r, req_arg(r, P_NA_CATEGORY), "category", categories, category_list) ||
        !sq_check_word(r, req_arg(r, P_NA_SCOPE), "scope", scopes, scope_list))
        return;
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_NA_SESSION));
    sq_str(&q, req_arg(r, P_NA_CATEGORY));
    sq_str(&q, req_arg(r, P_NA_KEY));
    sq_str(&q, req_arg(r, P_NA_VALUE));
    sq_str(&q, req_arg(r, P_NA_SCOPE));
    if (!add_work_item(r, &q, req_arg(r, P_NA_WORK)))
        return;
    sq_u64(&q, req_arg(r, P_NA_AGENT));
    sq_i64(&q, MAX_NOTES);
    sq_run(&q, SQLS_NOTE_ADD);
}

enum { P_NO_SESSION, P_NO_SCOPES, P_NO_CATEGORIES, P_NO_SINCE, P_NO_AGENT };
PARAMS(session_notes, ID_PARAM("session_id"),
       {"scopes", RPC_T_STR_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 1, 3},
       {"categories", RPC_T_STR_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 1, 5},
       {"since", RPC_T_TIME, RPC_P_NULLABLE | RPC_P_RANGE, 0, 9.2e18}, OPT_ID_PARAM("agent_id"));

/* session.notes: live notes in creation order, filtered by scope, category, time, agent. */
void h_session_notes(req *r)
{
    const msgpack_object *sc = req_arg(r, P_NO_SCOPES), *ca = req_arg(r, P_NO_CATEGORIES);
    if (!sq_check_words(r, sc, "scopes", scopes, scope_list) ||
        !sq_check_words(r, ca, "categories", categories, category_list))
        return;
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_NO_SESSION));
    sq_words(&q, sc);
    sq_words(&q, ca);
    sq_time(&q, req_arg(r, P_NO_SINCE));
    sq_u64(&q, req_arg(r, P_NO_AGENT));
    sq_run(&q, SQLS_NOTES);
}

enum { P_TC_SESSION, P_TC_WORK };
PARAMS(session_task_complete, ID_PARAM("session_id"), OPT_ID_PARAM("work_item_id"));

/* session.task.complete: clears the current task's notes. */
void h_session_task_complete(req *r)
{
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_TC_SESSION));
    if (!add_work_item(r, &q, req_arg(r, P_TC_WORK)))
        return;
    sq_run(&q, SQLS_TASK_COMPLETE);
}

/* ---- checkpoints and resume ------------------------------------------------------------- */

enum { P_CP_SESSION, P_CP_LABEL, P_CP_METADATA };
PARAMS(session_checkpoint, ID_PARAM("session_id"),
       {"label", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE | RPC_P_LIMIT(PLIM_LABEL), 1, 0},
       {"metadata", RPC_T_MAP, RPC_P_NULLABLE | RPC_P_LIMIT(PLIM_METADATA), 0, 0});

/* session.checkpoint: records the session's state as a delta against the previous
 * checkpoint; it lives for the tier's checkpoint_ttl_s. */
void h_session_checkpoint(req *r)
{
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_CP_SESSION));
    sq_str(&q, req_arg(r, P_CP_LABEL));
    int rc = sq_json(&q, req_arg(r, P_CP_METADATA), METADATA_MAX_DEPTH, METADATA_MAX_BYTES);
    if (rc != 0) {
        req_fail(r, rc == -ENOMEM ? RPC_INTERNAL : RPC_INVALID_ARGUMENT, "parameter 'metadata' %s",
                 rc == -ENOMEM           ? "cannot be stored: out of memory"
                 : rc == JSON_E_TOO_DEEP ? "is nested too deeply (at most 16 levels)"
                 : rc == JSON_TOO_BIG    ? "is larger than 65536 bytes as JSON"
                                         : "must hold only strings, numbers, booleans, nil, "
                                           "arrays and maps with string keys");
        return;
    }
    sq_i64(&q, tier_of(r)->checkpoint_ttl_s);
    sq_i64(&q, MAX_CHECKPOINTS);
    sq_run(&q, SQLS_CHECKPOINT);
}

PARAMS(session_checkpoints, ID_PARAM("session_id"));

/* session.checkpoints: the session's unexpired checkpoints. */
void h_session_checkpoints(req *r)
{
    session_only(r, SQLS_CHECKPOINTS);
}

enum { P_RE_CHECKPOINT, P_RE_OVERRIDE, P_RE_BRANCH, P_RE_SESSION };
PARAMS(session_resume, ID_PARAM("checkpoint_id"),
       {"config_override", RPC_T_MAP, RPC_P_NULLABLE | RPC_P_LIMIT(PLIM_MESSAGE), 0, 0},
       {"branch_type", RPC_T_STR, RPC_P_NULLABLE, 0, 0}, OPT_ID_PARAM("session_id"));

/* session.resume: a new session holding exactly the state of a checkpoint. */
void h_session_resume(req *r)
{
    const msgpack_object *override = req_arg(r, P_RE_OVERRIDE);
    const msgpack_object *branch = req_arg(r, P_RE_BRANCH);
    if (!sq_check_word(r, branch, "branch_type", branch_types,
                       "resume, sim, pre_steer (or pre-steer), dream"))
        return;
    if (override && !check_config(r, override, "config_override", false))
        return;
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_RE_CHECKPOINT));
    if (override && !add_config(r, &q, override))
        return;
    if (!override)
        sq_add(&q, NULL);
    if (!branch)
        sq_add(&q, "resume");
    else if (rpc_str_eq(branch, "pre-steer"))
        sq_add(&q, "pre_steer");
    else
        sq_str(&q, branch);
    sq_i64(&q, tier_of(r)->max_live_sessions);
    sq_u64(&q, req_arg(r, P_RE_SESSION));
    sq_run(&q, SQLS_RESUME);
}

/* ---- sub-agents ------------------------------------------------------------------------- */

enum { P_SW_PARENT, P_SW_TASK, P_SW_MODEL, P_SW_CONTEXT, P_SW_MAX_TOKENS, P_SW_FORMAT, P_SW_AGENT };
PARAMS(session_spawn, ID_PARAM("parent_id"),
       {"task", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE | RPC_P_LIMIT(PLIM_ENTRY), 1, 0},
       {"model", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, MODEL_MAX},
       {"context", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE | RPC_P_LIMIT(PLIM_ENTRY), 0, 0},
       {"max_tokens", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, SUB_MAX_TOKENS},
       {"return_format", RPC_T_STR, RPC_P_REQUIRED, 0, 0}, OPT_ID_PARAM("agent_id"));

/* session.spawn: a sub-agent session under a parent, holding only the given context. */
void h_session_spawn(req *r)
{
    if (!sq_check_word(r, req_arg(r, P_SW_FORMAT), "return_format", return_formats,
                       "summary, full"))
        return;
    const tier_limits *tl = tier_of(r);
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_SW_PARENT));
    sq_str(&q, req_arg(r, P_SW_TASK));
    sq_str(&q, req_arg(r, P_SW_MODEL));
    sq_str(&q, req_arg(r, P_SW_CONTEXT));
    sq_u64(&q, req_arg(r, P_SW_MAX_TOKENS));
    sq_str(&q, req_arg(r, P_SW_FORMAT));
    sq_u64(&q, req_arg(r, P_SW_AGENT));
    sq_i64(&q, MAX_CHILDREN);
    sq_i64(&q, tl->max_session_entries);
    sq_i64(&q, tl->max_session_bytes);
    sq_run(&q, SQLS_SPAWN);
}

enum { P_CO_SESSION, P_CO_OUTPUT };
PARAMS(session_complete, ID_PARAM("session_id"),
       {"output", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE | RPC_P_LIMIT(PLIM_ENTRY), 0, 0});

/* session.complete: records a sub-agent's output and completes it. */
void h_session_complete(req *r)
{
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_CO_SESSION));
    sq_str(&q, req_arg(r, P_CO_OUTPUT));
    sq_run(&q, SQLS_COMPLETE);
}

PARAMS(session_children, ID_PARAM("session_id"));

/* session.children: the sub-agents of a session with their outputs. */
void h_session_children(req *r)
{
    session_only(r, SQLS_CHILDREN);
}

/* ---- handoff ------------------------------------------------------------------------------ */

enum { P_HO_SESSION, P_HO_MODE, P_HO_AGENT };
PARAMS(session_handoff, ID_PARAM("session_id"), {"mode", RPC_T_STR, RPC_P_REQUIRED, 0, 0},
       OPT_ID_PARAM("agent_id"));

/* session.handoff: the handoff package the mode selects; the handoff (and the agent asking,
 * when named) is recorded in the session's audit log. */
void h_session_handoff(req *r)
{
    if (!sq_check_word(r, req_arg(r, P_HO_MODE), "mode", modes,
                       "continue, takeover, review, recovery"))
        return;
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_HO_SESSION));
    sq_str(&q, req_arg(r, P_HO_MODE));
    sq_u64(&q, req_arg(r, P_HO_AGENT));
    sq_run(&q, SQLS_HANDOFF);
}
