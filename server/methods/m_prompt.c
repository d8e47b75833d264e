/* server/methods/m_prompt.c: memory.prompt: what a gateway puts into one turn's prompt,
 * assembled within one token budget (docs/protocol.md, memory.prompt).
 *
 * Three parts, each counted as its text's bytes / 4 tokens (as memory.context and
 * session.context count), filled in this order:
 *   working_memory  the session's <working_memory> block with its open work items
 *   transcript      the session's newest compaction summary and newest messages
 *   agent_memory    the <agent_memory> block of the memories the turn's query finds
 * Each part has a share of the budget (30%, 40%, the rest); what a part leaves of its
 * share flows to the next one, so the agent memory gets all that the other two left.
 *
 * Steps: the arguments are checked (the search's through msearch.h); one statement
 * (storage/functions/36_prompt.sql) renders the two session parts, or fails with
 * not_found for a session the tenant does not have (before the call counts as a query);
 * then the search runs as memory.context's does (admitted as one query, accesses counted)
 * with the bytes left, and hands its block back to prompt_done, which packs the answer.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "json.h"
#include "msearch.h"
#include "sq.h"
#include "sql_session.h"

#define PROMPT_BUDGET_MIN 64
#define PROMPT_BUDGET_MAX 1000000
#define PROMPT_BUDGET_DEFAULT 8000
#define SHARE_WORKING_MEMORY 30 /* percent of the budget */
#define SHARE_TRANSCRIPT 40
#define DOC_DEPTH 8 /* of the statement's JSON answer */

enum { P_PR_SESSION = P_SE__END, P_PR_BUDGET };
ENUMS(memory_prompt, {"type_filter", enum_memory_types}, {"scopes", enum_scopes},
      {"mode", enum_search_modes});
PARAMS(memory_prompt, SEARCH_PARAMS, ID_PARAM("session_id"),
       {"budget_tokens", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, PROMPT_BUDGET_MIN,
        PROMPT_BUDGET_MAX});

typedef struct prompt_state {
    uint64_t budget;      /* tokens */
    msgpack_sbuffer buf;  /* the session parts, as MessagePack */
    msgpack_unpacked doc; /* ... unpacked (its strings point into buf) */
    const msgpack_object *session_id, *wm, *tr, *summary, *messages;
    const msgpack_object *wm_text, *tr_text;
} prompt_state;

static void free_doc(void *arg)
{
    prompt_state *ps = arg;
    msgpack_unpacked_destroy(&ps->doc);
    msgpack_sbuffer_destroy(&ps->buf);
}

/* The value of key in map m, when it has type type; else NULL. */
static const msgpack_object *field(const msgpack_object *m, const char *key,
                                   msgpack_object_type type)
{
    if (!m || m->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object_kv *kv = &m->via.map.ptr[i];
        if (rpc_str_eq(&kv->key, key))
            return kv->val.type == type ? &kv->val : NULL;
    }
    return NULL;
}

/* Unpacks the statement's JSON document into ps. Returns 0, -ENOMEM, or -EINVAL when it
 * is not what 36_prompt.sql returns. */
static int read_doc(req *r, prompt_state *ps, const char *json, size_t len)
{
    msgpack_sbuffer_init(&ps->buf);
    msgpack_unpacked_init(&ps->doc);
    if (req_on_free(r, free_doc, ps) < 0) {
        free_doc(ps);
        return -ENOMEM;
    }
    msgpack_packer pk;
    msgpack_packer_init(&pk, &ps->buf, msgpack_sbuffer_write);
    int rc = json_to_msgpack(json, len, DOC_DEPTH, &pk, NULL, 0);
    if (rc != 0)
        return rc == -ENOMEM ? -ENOMEM : -EINVAL;
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(&ps->doc, ps->buf.data, ps->buf.size, &off);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
        return -ENOMEM;
    if (ur != MSGPACK_UNPACK_SUCCESS)
        return -EINVAL;
    const msgpack_object *d = &ps->doc.data;
    ps->session_id = field(d, "session_id", MSGPACK_OBJECT_POSITIVE_INTEGER);
    ps->wm = field(d, "working_memory", MSGPACK_OBJECT_MAP);
    ps->tr = field(d, "transcript", MSGPACK_OBJECT_MAP);
    ps->summary = field(d, "summary", MSGPACK_OBJECT_STR);
    ps->messages = field(d, "messages", MSGPACK_OBJECT_ARRAY);
    ps->wm_text = field(ps->wm, "text", MSGPACK_OBJECT_STR);
    ps->tr_text = field(ps->tr, "text", MSGPACK_OBJECT_STR);
    if (!ps->session_id || !ps->summary || !ps->messages || !ps->wm_text || !ps->tr_text)
        return -EINVAL;
    return 0;
}

/* Packs the n pieces as one string. */
static void pack_joined(msgpack_packer *pk, const char *const *s, const size_t *len, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += len[i];
    msgpack_pack_str(pk, total);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_str_body(pk, s[i], len[i]);
}

/* The search's block is chosen: the answer. */
static void prompt_done(req *r, void *ctx, const ctxb_block *b)
{
    prompt_state *ps = ctx;
    const msgpack_object_str *wm = &ps->wm_text->via.str, *tr = &ps->tr_text->via.str;
    const msgpack_object_str *sum = &ps->summary->via.str;
    /* an empty choice shows nothing (not an empty block) */
    size_t am_len = b->n ? b->text.len : 0;
    const char *am = b->n ? (const char *)b->text.data : "";
    uint64_t left = ps->budget * 4 - wm->size - tr->size;
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 6);
    rpc_pack_cstr(pk, "session_id");
    msgpack_pack_object(pk, *ps->session_id);
    rpc_pack_kv_uint(pk, "budget_tokens", ps->budget);
    rpc_pack_kv_uint(pk, "tokens_used", am_len / 4 + wm->size / 4 + tr->size / 4);
    const char *text[] = {am, wm->ptr, tr->ptr};
    size_t text_len[] = {am_len, wm->size, tr->size};
    rpc_pack_cstr(pk, "text");
    pack_joined(pk, text, text_len, 3);
    /* the messages: one system message with the blocks and the summary, then the tail */
    const char *sys[] = {am, wm->ptr, sum->ptr};
    size_t sys_len[] = {am_len, wm->size, sum->size};
    bool has_sys = am_len + wm->size + sum->size > 0;
    const msgpack_object_array *msgs = &ps->messages->via.array;
    rpc_pack_cstr(pk, "messages");
    msgpack_pack_array(pk, msgs->size + (has_sys ? 1 : 0));
    if (has_sys) {
        msgpack_pack_map(pk, 2);
        rpc_pack_kv_str(pk, "role", "system");
        rpc_pack_cstr(pk, "content");
        pack_joined(pk, sys, sys_len, 3);
    }
    for (uint32_t i = 0; i < msgs->size; i++)
        msgpack_pack_object(pk, msgs->ptr[i]);
    rpc_pack_cstr(pk, "parts");
    msgpack_pack_map(pk, 3);
    rpc_pack_cstr(pk, "agent_memory");
    msgpack_pack_map(pk, 4);
    rpc_pack_cstr(pk, "text");
    rpc_pack_strn(pk, am, am_len);
    rpc_pack_kv_uint(pk, "tokens_used", am_len / 4);
    rpc_pack_kv_uint(pk, "budget_tokens", left / 4);
    rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, (uint32_t)b->n);
    for (size_t k = 0; k < b->n; k++)
        msgpack_pack_uint64(pk, b->items[k].id);
    rpc_pack_cstr(pk, "working_memory");
    msgpack_pack_object(pk, *ps->wm);
    rpc_pack_cstr(pk, "transcript");
    msgpack_pack_object(pk, *ps->tr);
    req_done(r);
}

/* The session parts are rendered: search with the bytes they left. */
static void session_rows(req *r, const db_result *res)
{
    prompt_state *ps = search_block_ctx(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res); /* not_found for a session the tenant does not have */
        return;
    }
    const PGresult *pr = res->res[res->nres - 1];
    if (PQntuples(pr) != 1 || PQnfields(pr) != 1 || PQgetisnull(pr, 0, 0)) {
        req_fail(r, RPC_INTERNAL, "the prompt statement returned no result");
        return;
    }
    int rc = read_doc(r, ps, PQgetvalue(pr, 0, 0), (size_t)PQgetlength(pr, 0, 0));
    if (rc != 0) {
        req_fail(r, RPC_INTERNAL, "%s",
                 rc == -ENOMEM ? "out of memory" : "the prompt statement's answer is malformed");
        return;
    }
    uint64_t used = ps->wm_text->via.str.size + ps->tr_text->via.str.size;
    if (used > ps->budget * 4) {
        req_fail(r, RPC_INTERNAL, "the session parts passed their budget");
        return;
    }
    search_block_cap(r, ps->budget * 4 - used);
    search_go(r);
}

/* memory.prompt: checks the arguments, then renders the session parts. */
void h_memory_prompt(req *r)
{
    prompt_state *ps = req_alloc(r, sizeof(*ps));
    if (!ps) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(ps, 0, sizeof(*ps));
    if (search_block(r, prompt_done, ps) < 0)
        return;
    ps->budget = rpc_get_uint(req_arg(r, P_PR_BUDGET), PROMPT_BUDGET_DEFAULT);
    uint64_t bytes = ps->budget * 4;
    sq q;
    sq_init(&q, r);
    sq_u64(&q, req_arg(r, P_PR_SESSION));
    sq_i64(&q, (int64_t)(bytes * SHARE_WORKING_MEMORY / 100));
    sq_i64(&q, (int64_t)(bytes * SHARE_TRANSCRIPT / 100));
    sq_u64(&q, req_arg(r, MF_AGENT_ID));
    sq_submit_cb(&q, sqls_def(SQLS_PROMPT), session_rows);
}
