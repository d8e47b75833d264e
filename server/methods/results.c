/* server/methods/results.c: the result schemas of the methods (see results.h). */
#include "results.h"

#include <errno.h>
#include <string.h>

/* JSON Schema fragments as C string literals (concatenated at compile time) */
#define T(t) "{\"type\":\"" t "\"}"
#define TN(t) "{\"type\":[\"" t "\",\"null\"]}"
#define INT T("integer")
#define INTN TN("integer")
#define NUM T("number")
#define NUMN TN("number")
#define STR T("string")
#define STRN TN("string")
#define BOOL T("boolean")
#define OBJ T("object")
#define OBJN TN("object")
#define ARR(items) "{\"type\":\"array\",\"items\":" items "}"
#define REF(n) "{\"$ref\":\"#/components/schemas/" n "\"}"
#define Q(n) "\"" n "\""
#define P(n, s) "\"" n "\":" s
/* an object whose listed properties are all required */
#define OBJECT(req, props) "{\"type\":\"object\",\"required\":[" req "],\"properties\":{" props "}}"
#define CURSOR P("next_cursor", "{\"type\":[\"string\",\"integer\",\"null\"]}")
#define ENUM(list) "{\"type\":\"string\",\"enum\":[" list "]}"

#define MEMORY_TYPES                                                                               \
    ENUM(Q("fact") "," Q("preference") "," Q("episode") "," Q("strategy_outcome") "," Q(           \
        "constraint"))
#define SCOPES ENUM(Q("agent") "," Q("clade") "," Q("tenant"))
#define OBJECTN(req, props)                                                                        \
    "{\"type\":[\"object\",\"null\"],\"required\":[" req "],\"properties\":{" props "}}"

const result_schema results_components[] = {
    {"Memory",
     OBJECT(Q("id") "," Q("agent_id") "," Q("clade_id") "," Q("scope") "," Q("type") "," Q(
                "conten"
                "t") "," Q("importance") "," Q("metadata") "," Q("created_at") "," Q("updated_at") "," Q("pinn"
                                                                                                         "ed") "," Q("version"),
            P("id", INT) "," P("agent_id", INT) "," P("clade_id", INT) "," P("scope", SCOPES) "," P("type", MEMORY_TYPES) "," P("content", STR) "," P(
                "importance",
                NUM) "," P("metadata",
                           OBJ) "," P("created_at",
                                      INT) "," P("updated_at",
                                                 INT) "," P("last_accessed_at",
                                                            INTN) "," P("access_count",
                                                                        INT) "," P("expires_at",
                                                                                   INTN) "," P("arc"
                                                                                               "hiv"
                                                                                               "ed_"
                                                                                               "at",
                                                                                               INTN) "," P("archived_reason",
                                                                                                           STRN) "," P("superseded_by",
                                                                                                                       INTN) "," P("merged_into",
                                                                                                                                   INTN) "," P("pinned",
                                                                                                                                               BOOL) "," P("version",
                                                                                                                                                           INT))},
    {"SearchHit",
     "{\"allOf\":[" REF("Memory") "," OBJECT(
         Q("score"), P("score", NUM) "," P("similarity", NUM) "," P("composite", NUM)) "]}"},
    {"SessionSummary",
     OBJECT(Q("session_id") "," Q("state") "," Q("agent_id") "," Q("created_at"),
            P("session_id", INT) "," P("state", STR) "," P("agent_id", INT) "," P(
                "parent_id", INTN) "," P("created_at",
                                         INT) "," P("updated_at",
                                                    INT) "," P("model", STRN) "," P("entry_count",
                                                                                    INT))},
    {"WorkItem",
     OBJECT(Q("work_item_id") "," Q("session_id") "," Q("title") "," Q("status") "," Q("version"),
            P("work_item_id", INT) "," P("session_id", INT) "," P("title", STR) "," P(
                "status", STR) "," P("version",
                                     INT) "," P("description",
                                                STRN) "," P("owner_agent_id",
                                                            INTN) "," P("created_at",
                                                                        INT) "," P("updated_at",
                                                                                   INT))},
    {"Tenant",
     OBJECT(
         Q("tenant_id") "," Q("name") "," Q("tier") "," Q("embedding") "," Q("created_at"),
         P("tenant_id", INT) "," P("name", STR) "," P("tier", STR) "," P(
             "embedding",
             OBJECT(Q("provider") "," Q("dim"),
                    P("provider", STR) "," P("dim", INT) "," P("model", STR) "," P(
                        "generation",
                        INT))) "," P("reembed",
                                     REF("Reembed")) "," P("keys",
                                                           INT) "," P("memories",
                                                                      INT) "," P("created_at",
                                                                                 INT) "," P("update"
                                                                                            "d_at",
                                                                                            INT))},
    /* a tenant's re-embedding in progress (engram_reembed_state), null when none runs */
    {"Reembed",
     OBJECTN(
         Q("state") "," Q("provider") "," Q("dim") "," Q("total") "," Q("done") "," Q(
             "failures") "," Q("started_at"),
         P("state", ENUM(Q("running") "," Q("backoff"))) "," P("provider", STR) "," P("model", STR) "," P(
             "dim",
             INT) "," P("total",
                        INT) "," P("done",
                                   INT) "," P("failures",
                                              INT) "," P("last_error",
                                                         STRN) "," P("last_error_at",
                                                                     INTN) "," P("retry_at",
                                                                                 INTN) "," P("start"
                                                                                             "ed_"
                                                                                             "at",
                                                                                             INT))},
    {"Scratchpad", OBJECT(Q("session_id") "," Q("content") "," Q("version"),
                          P("session_id", INT) "," P("content", STR) "," P("version", INT) "," P(
                              "token_count", INT) "," P("last_updated_at", INTN))},
};
const size_t results_components_count = sizeof(results_components) / sizeof(results_components[0]);

#define IDS_OF(key) OBJECT(Q(key), P(key, ARR(INT)))

/* Sorted by name (strcmp order) for the binary search. */
static const result_schema table[] = {
    {"admin.key.create",
     OBJECT(Q("tenant_id") "," Q("key_id") "," Q("name") "," Q("api_key") "," Q("created_at"),
            P("tenant_id", INT) "," P("key_id", INT) "," P("name", STR) "," P("api_key", STR) "," P(
                "created_at", INT))},
    {"admin.key.list",
     OBJECT(
         Q("keys"),
         P("keys", ARR(OBJECT(Q("key_id") "," Q("name") "," Q("prefix") "," Q("created_at"),
                              P("key_id", INT) "," P("name", STR) "," P("prefix", STR) "," P(
                                  "created_at", INT) "," P("revoked_at", INTN) "," P("last_used_at",
                                                                                     INTN)))))},
    {"admin.key.revoke", OBJECT(Q("key_id") "," Q("tenant_id") "," Q("revoked"),
                                P("key_id", INT) "," P("tenant_id", INT) "," P("revoked", BOOL))},
    {"admin.tenant.create", OBJECT(Q("tenant_id") "," Q("api_key") "," Q("key_id"),
                                   P("tenant_id", INT) "," P("api_key", STR) "," P("key_id", INT))},
    {"admin.tenant.delete",
     OBJECT(Q("tenant_id") "," Q("deleted"), P("tenant_id", INT) "," P("deleted", BOOL))},
    {"admin.tenant.get", REF("Tenant")},
    {"admin.tenant.list", OBJECT(Q("tenants"), P("tenants", ARR(REF("Tenant"))) "," CURSOR)},
    {"admin.tenant.move",
     OBJECT(Q("tenant_id") "," Q("shard_id") "," Q("from") "," Q("node") "," Q("isolated") "," Q(
                "moved") "," Q("duration_ms"),
            P("tenant_id", INT) "," P("shard_id", INT) "," P("from", STR) "," P("node", STR) "," P(
                "isolated", BOOL) "," P("moved", BOOL) "," P("duration_ms", INT))},
    {"admin.tenant.update", REF("Tenant")},
    {"memory.archive", IDS_OF("archived")},
    {"memory.consolidate",
     OBJECT(
         Q("run_id") "," Q("status"),
         P("run_id", INT) "," P("status", STR) "," P("merged", INT) "," P("superseded", INT) "," P(
             "rescored", INT) "," P("archived", INT) "," P("skipped",
                                                           INT) "," P("flagged",
                                                                      INT) "," P("duration_ms",
                                                                                 INT) "," P("model",
                                                                                            STRN))},
    {"memory.consolidation.runs", OBJECT(Q("runs"), P("runs", ARR(OBJ)) "," CURSOR)},
    {"memory.context", OBJECT(Q("text") "," Q("ids") "," Q("tokens_used"),
                              P("text", STR) "," P("ids", ARR(INT)) "," P("tokens_used", INT))},
    {"memory.delete", IDS_OF("deleted")},
    {"memory.feedback",
     OBJECT(
         Q("memories") "," Q("unknown"),
         P("memories", ARR(OBJECT(Q("id") "," Q("cited_count") "," Q("injected_count"),
                                  P("id", INT) "," P("cited", BOOL) "," P("cited_count", INT) "," P(
                                      "injected_count", INT)))) "," P("unknown", ARR(INT)))},
    {"memory.get", OBJECT(Q("memories"), P("memories", ARR(REF("Memory"))))},
    {"memory.history",
     OBJECT(Q("id") "," Q("versions"),
            P("id", INT) "," P(
                "versions",
                ARR(OBJECT(
                    Q("version") "," Q("content") "," Q("type") "," Q("valid_from"),
                    P("version", INT) "," P("content", STR) "," P("type", MEMORY_TYPES) "," P(
                        "importance", NUM) "," P("valid_from", INT) "," P("valid_to", INTN)))))},
    {"memory.list", OBJECT(Q("memories"), P("memories", ARR(REF("Memory"))) "," CURSOR)},
    {"memory.prompt",
     OBJECT(Q("session_id") "," Q("budget_tokens") "," Q("tokens_used") "," Q("text") "," Q(
                "messages"),
            P("session_id", INT) "," P("budget_tokens", INT) "," P("tokens_used", INT) "," P(
                "text", STR) "," P("messages",
                                   ARR(OBJECT(Q("role") "," Q("content"),
                                              P("role", STR) "," P("content", STR)))) "," P("parts",
                                                                                            OBJ))},
    {"memory.provenance",
     OBJECT(
         Q("memories") "," Q("unknown"),
         P("memories",
           ARR(OBJECT(
               Q("id") "," Q("cited") "," Q("match"),
               P("id", INT) "," P("cited", BOOL) "," P("match", STR) "," P("similarity", NUM) "," P(
                   "overlap", NUM) "," P("conflict", BOOL)))) "," P("unknown",
                                                                    ARR(INT)) "," P("sentences",
                                                                                    INT))},
    {"memory.restore", IDS_OF("restored")},
    {"memory.search",
     OBJECT(Q("results"), P("results", ARR(REF("SearchHit"))) "," P("below_min_similarity", INT))},
    {"memory.stats",
     OBJECT(
         Q("total") "," Q("archived") "," Q("by_type") "," Q("by_scope") "," Q("storage_bytes"),
         P("total", INT) "," P("archived", INT) "," P("by_type", OBJ) "," P("by_scope", OBJ) "," P(
             "oldest_at", INTN) "," P("newest_at",
                                      INTN) "," P("storage_bytes",
                                                  INT) "," P("index", OBJ) "," P("reembed",
                                                                                 REF("Reembed")))},
    {"memory.store", OBJECT(Q("id") "," Q("created_at") "," Q("replayed"),
                            P("id", INT) "," P("created_at", INT) "," P("replayed", BOOL))},
    {"memory.store_batch",
     OBJECT(Q("ids") "," Q("created_at") "," Q("replayed"),
            P("ids", ARR(INT)) "," P("created_at", ARR(INT)) "," P("replayed", BOOL))},
    {"memory.update", OBJECT(Q("id") "," Q("version") "," Q("updated_at"),
                             P("id", INT) "," P("version", INT) "," P("updated_at", INT))},
    {"methods",
     ARR(OBJECT(
         Q("name") "," Q("flags") "," Q("params"),
         P("name", STR) "," P("flags", ARR(STR)) "," P(
             "params",
             ARR(OBJECT(Q("name") "," Q("type") "," Q("required"),
                        P("name", STR) "," P("type", STR) "," P("required", BOOL) "," P(
                            "aliases", ARR(STR)) "," P("enum", ARR(STR))))) "," P("result", OBJ)))},
    {"ping", "{\"const\":\"pong\"}"},
    {"session.append", OBJECT(Q("seq") "," Q("entry_id") "," Q("total_cost_usdc"),
                              P("seq", INT) "," P("entry_id", INT) "," P("total_cost_usdc", NUM))},
    {"session.audit",
     OBJECT(Q("records") "," Q("more"),
            P("records", ARR(OBJECT(Q("seq") "," Q("at") "," Q("action"),
                                    P("seq", INT) "," P("at", INT) "," P("action", STR) "," P(
                                        "agent_id", INTN) "," P("detail", OBJ)))) "," P("more",
                                                                                        BOOL))},
    {"session.checkpoint",
     OBJECT(Q("checkpoint_id") "," Q("session_id") "," Q("position") "," Q("created_at"),
            P("checkpoint_id", INT) "," P("session_id", INT) "," P("position", INT) "," P(
                "created_at", INT) "," P("expires_at", INTN) "," P("delta", OBJ))},
    {"session.checkpoints", OBJECT(Q("session_id") "," Q("checkpoints"),
                                   P("session_id", INT) "," P("checkpoints", ARR(OBJ)))},
    {"session.children",
     OBJECT(Q("session_id") "," Q("children"), P("session_id", INT) "," P("children", ARR(OBJ)))},
    {"session.complete",
     OBJECT(Q("session_id") "," Q("state") "," Q("parent_id") "," Q("completed_at"),
            P("session_id", INT) "," P("state", STR) "," P("parent_id", INT) "," P("completed_at",
                                                                                   INT))},
    {"session.context",
     OBJECT(Q("session_id") "," Q("text") "," Q("tokens_used") "," Q("budget_tokens"),
            P("session_id", INT) "," P("text", STR) "," P("tokens_used", INT) "," P(
                "budget_tokens", INT) "," P("notes", OBJ) "," P("scratchpad", OBJ) "," P("resumed",
                                                                                         OBJN))},
    {"session.create", OBJECT(Q("session_id") "," Q("created_at") "," Q("config"),
                              P("session_id", INT) "," P("created_at", INT) "," P("config", OBJ))},
    {"session.delete",
     OBJECT(Q("session_id") "," Q("deleted") "," Q("session_ids"),
            P("session_id", INT) "," P("deleted", INT) "," P("session_ids", ARR(INT)))},
    {"session.end", OBJECT(Q("session_id") "," Q("state") "," Q("ended_at"),
                           P("session_id", INT) "," P("state", STR) "," P("ended_at", INT))},
    {"session.extract",
     OBJECT(
         Q("session_id") "," Q("status") "," Q("added") "," Q("model"),
         P("session_id", INT) "," P("status", STR) "," P("reason", STRN) "," P("entries", INT) "," P("more", BOOL) "," P(
             "facts",
             INT) "," P("dropped",
                        INT) "," P("added",
                                   INT) "," P("updated",
                                              INT) "," P("unchanged",
                                                         INT) "," P("skipped",
                                                                    INT) "," P("memory_ids",
                                                                               ARR(INT)) "," P("cos"
                                                                                               "t_"
                                                                                               "us"
                                                                                               "d",
                                                                                               NUM) "," P("trigger",
                                                                                                          STR) "," P("model",
                                                                                                                     OBJ))},
    {"session.get",
     "{\"allOf\":[" REF("SessionSummary") "," OBJECT(
         Q("config") "," Q("position") "," Q("constraints") "," Q("extraction"),
         P("config", OBJ) "," P("position", INT) "," P("constraints", OBJ) "," P(
             "summary", STRN) "," P("ended_at", INTN) "," P("auto_compact", OBJ) "," P("extraction",
                                                                                       OBJ)) "]}"},
    {"session.handoff",
     OBJECT(
         Q("session_id") "," Q("mode") "," Q("state") "," Q("generated_at") "," Q("metrics"),
         P("session_id", INT) "," P("mode", STR) "," P("state", STR) "," P("agent_id", INT) "," P("model", STRN) "," P("summary", STRN) "," P(
             "generated_at",
             INT) "," P("metrics",
                        OBJ) "," P("scratchpad",
                                   REF("Scratchpad")) "," P("decisions",
                                                            ARR(OBJ)) "," P("blockers",
                                                                            ARR(OBJ)) "," P("carry_"
                                                                                            "forwar"
                                                                                            "d",
                                                                                            ARR(OBJ)) "," P("work_items",
                                                                                                            ARR(REF(
                                                                                                                "WorkItem"))) "," P("events",
                                                                                                                                    ARR(OBJ)) "," P("audit",
                                                                                                                                                    ARR(OBJ)))},
    {"session.list", OBJECT(Q("sessions"), P("sessions", ARR(REF("SessionSummary"))) "," CURSOR)},
    {"session.messages",
     OBJECT(
         Q("session_id") "," Q("messages") "," Q("position"),
         P("session_id", INT) "," P("position", INT) "," P("as_of", INT) "," CURSOR "," P(
             "messages",
             ARR(OBJECT(
                 Q("seq") "," Q("entry_id") "," Q("role") "," Q("type") "," Q("created_at"),
                 P("seq", INT) "," P("entry_id", INT) "," P("role", STRN) "," P("type", STR) "," P(
                     "content", "{}") "," P("agent_id", INTN) "," P("created_at", INT)))))},
    {"session.note.add",
     OBJECT(Q("note_id") "," Q("created_at"),
            P("note_id", INT) "," P("created_at", INT) "," P("superseded", "{}"))},
    {"session.notes",
     OBJECT(Q("session_id") "," Q("notes"), P("session_id", INT) "," P("notes", ARR(OBJ)))},
    {"session.resume",
     OBJECT(Q("session_id") "," Q("resumed_from") "," Q("checkpoint_id") "," Q("agents"),
            P("session_id", INT) "," P("resumed_from", INT) "," P("checkpoint_id", INT) "," P(
                "branch_type",
                STR) "," P("agents", ARR(OBJ)) "," P("children", ARR(OBJ)) "," P("restored", OBJ))},
    {"session.scratchpad.get", REF("Scratchpad")},
    {"session.scratchpad.update", REF("Scratchpad")},
    {"session.spawn", OBJECT(Q("session_id") "," Q("parent_id") "," Q("agent_id"),
                             P("session_id", INT) "," P("parent_id", INT) "," P("agent_id", INT))},
    {"session.summarize",
     OBJECT(Q("session_id") "," Q("entry_id") "," Q("compaction_count"),
            P("session_id", INT) "," P("entry_id", INT) "," P("compaction_count", INT))},
    {"session.task.complete",
     OBJECT(Q("session_id") "," Q("cleared"), P("session_id", INT) "," P("cleared", INT))},
    {"session.tombstone",
     OBJECT(Q("entry_id") "," Q("session_id") "," Q("tombstone_id"),
            P("entry_id", INT) "," P("session_id", INT) "," P("tombstone_id", INT))},
    {"session.work_item.add", REF("WorkItem")},
    {"session.work_item.list",
     OBJECT(Q("session_id") "," Q("work_items"),
            P("session_id", INT) "," P("work_items", ARR(REF("WorkItem"))) "," CURSOR)},
    {"session.work_item.update", REF("WorkItem")},
    {"tenant.dream", OBJECT(Q("enabled") "," Q("hours") "," Q("state") "," Q("pass"),
                            P("enabled", BOOL) "," P("hours", NUM) "," P("min_sessions", INT) "," P(
                                "lock_stale_s", INT) "," P("state", OBJ) "," P("pass", OBJN))},
    {"tenant.usage",
     OBJECT(
         Q("tenant_id") "," Q("name") "," Q("tier") "," Q("memories") "," Q("queries") "," Q(
             "sessions"),
         P("tenant_id", INT) "," P("name", STR) "," P("tier", STR) "," P(
             "memories",
             OBJECT(
                 Q("stored") "," Q("archived") "," Q("bytes"),
                 P("stored", INT) "," P("archived", INT) "," P("limit", INTN) "," P(
                     "bytes",
                     INT) "," P("bytes_limit",
                                INTN))) "," P("queries",
                                              OBJ) "," P("sessions",
                                                         OBJ) "," P("storage_bytes",
                                                                    INT) "," P("rate",
                                                                               OBJ) "," P("model",
                                                                                          OBJ))},
};

const char *results_find(const char *name)
{
    size_t lo = 0, hi = sizeof(table) / sizeof(table[0]);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, table[mid].name);
        if (c == 0)
            return table[mid].schema;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

#define REF_HEAD "{\"$ref\":\"#/components/schemas/"

static int expand(const char *schema, ubuf *out, int depth)
{
    const char *at = schema;
    for (;;) {
        const char *ref = strstr(at, REF_HEAD);
        int rc = ubuf_append(out, at, ref ? (size_t)(ref - at) : strlen(at));
        if (rc < 0 || !ref)
            return rc;
        const char *name = ref + strlen(REF_HEAD);
        const char *end = strchr(name, '"');
        if (!end || strncmp(end, "\"}", 2) != 0 || depth >= 4)
            return -EINVAL;
        const char *comp = NULL;
        for (size_t i = 0; i < results_components_count && !comp; i++)
            if (strlen(results_components[i].name) == (size_t)(end - name) &&
                strncmp(results_components[i].name, name, (size_t)(end - name)) == 0)
                comp = results_components[i].schema;
        if (!comp || comp[0] != '{')
            return -EINVAL;
        rc = ubuf_printf(out, "{\"title\":\"%.*s\",", (int)(end - name), name);
        if (rc < 0 || (rc = expand(comp + 1, out, depth + 1)) < 0)
            return rc;
        at = end + 2;
    }
}

int results_expand(const char *schema, ubuf *out)
{
    return expand(schema, out, 0);
}
