/* server/methods/methods.c: the sorted method table (see methods.h). */
#include "methods.h"

#include <errno.h>
#include <string.h>

#include "handlers.h"
#include "index_engine.h"
#include "log.h"
#include "memrow.h"
#include "tiers.h"

#define M(wire, h, flags)                                                                          \
    {                                                                                              \
        wire, h_##h, p_##h, 0, flags, &np_##h, NULL, NULL                                          \
    }
/* a method with parameters that take one of a fixed set of strings (its file's ENUMS) */
#define ME(wire, h, flags)                                                                         \
    {                                                                                              \
        wire, h_##h, p_##h, 0, flags, &np_##h, e_##h, &ne_##h                                      \
    }

const char *const enum_memory_types[] = {"fact",       "preference", "episode", "strategy_outcome",
                                         "constraint", NULL};
const char *const enum_scopes[] = {"agent", "clade", "tenant", NULL};
const char *const enum_search_modes[] = {"vector", "text", "hybrid", NULL};
const char *const enum_tiers[] = {"free", "standard", "premium", NULL};
const char *const enum_index_engines[] = {"native", "faiss", NULL};

/* Sorted by name (strcmp order); methods_check verifies it and fills in the parameter
 * counts (their sizes live in the handlers' files). */
static method_def table[] = {
    M("admin.key.create", admin_key_create, M_ADMIN),
    M("admin.key.list", admin_key_list, M_ADMIN),
    M("admin.key.revoke", admin_key_revoke, M_ADMIN),
    ME("admin.tenant.create", admin_tenant_create, M_ADMIN),
    M("admin.tenant.delete", admin_tenant_delete, M_ADMIN),
    M("admin.tenant.get", admin_tenant_get, M_ADMIN),
    M("admin.tenant.list", admin_tenant_list, M_ADMIN),
    M("admin.tenant.move", admin_tenant_move, M_ADMIN),
    ME("admin.tenant.update", admin_tenant_update, M_ADMIN),
    M("auth", auth, M_PUBLIC | M_AUTH),
    M("memory.archive", memory_archive, M_TENANT | M_WRITE),
    M("memory.consolidate", memory_consolidate, M_TENANT | M_WRITE),
    M("memory.consolidation.runs", memory_consolidation_runs, M_TENANT),
    ME("memory.context", memory_context, M_TENANT | M_QUERY),
    M("memory.delete", memory_delete, M_TENANT | M_WRITE),
    M("memory.feedback", memory_feedback, M_TENANT | M_WRITE),
    M("memory.get", memory_get, M_TENANT),
    M("memory.history", memory_history, M_TENANT),
    ME("memory.list", memory_list, M_TENANT),
    ME("memory.prompt", memory_prompt, M_TENANT | M_QUERY),
    M("memory.provenance", memory_provenance, M_TENANT | M_QUERY | M_WRITE),
    M("memory.restore", memory_restore, M_TENANT | M_WRITE),
    ME("memory.search", memory_search, M_TENANT | M_QUERY),
    M("memory.stats", memory_stats, M_TENANT),
    ME("memory.store", memory_store, M_TENANT | M_WRITE),
    M("memory.store_batch", memory_store_batch, M_TENANT | M_WRITE),
    ME("memory.update", memory_update, M_TENANT | M_WRITE),
    M("methods", methods, M_PUBLIC),
    M("ping", ping, M_PUBLIC),
    ME("session.append", session_append, M_TENANT | M_WRITE),
    M("session.audit", session_audit, M_TENANT),
    M("session.checkpoint", session_checkpoint, M_TENANT | M_WRITE),
    M("session.checkpoints", session_checkpoints, M_TENANT),
    M("session.children", session_children, M_TENANT),
    M("session.complete", session_complete, M_TENANT | M_WRITE),
    M("session.context", session_context, M_TENANT),
    M("session.create", session_create, M_TENANT | M_WRITE),
    M("session.delete", session_delete, M_TENANT | M_WRITE),
    M("session.end", session_end, M_TENANT | M_WRITE),
    M("session.extract", session_extract, M_TENANT | M_WRITE),
    M("session.get", session_get, M_TENANT),
    ME("session.handoff", session_handoff, M_TENANT),
    ME("session.list", session_list, M_TENANT),
    M("session.messages", session_messages, M_TENANT),
    ME("session.note.add", session_note_add, M_TENANT | M_WRITE),
    ME("session.notes", session_notes, M_TENANT),
    ME("session.resume", session_resume, M_TENANT | M_WRITE),
    M("session.scratchpad.get", session_scratchpad_get, M_TENANT),
    M("session.scratchpad.update", session_scratchpad_update, M_TENANT | M_WRITE),
    ME("session.spawn", session_spawn, M_TENANT | M_WRITE),
    M("session.summarize", session_summarize, M_TENANT | M_WRITE),
    M("session.task.complete", session_task_complete, M_TENANT | M_WRITE),
    M("session.tombstone", session_tombstone, M_TENANT | M_WRITE),
    ME("session.work_item.add", session_work_item_add, M_TENANT | M_WRITE),
    ME("session.work_item.list", session_work_item_list, M_TENANT),
    ME("session.work_item.update", session_work_item_update, M_TENANT | M_WRITE),
    M("tenant.dream", tenant_dream, M_TENANT | M_WRITE),
    M("tenant.usage", tenant_usage, M_TENANT),
};

const method_def *const methods_table = table;
const size_t methods_count = sizeof(table) / sizeof(table[0]);

/* Each enum names a string (or string array) parameter of its method that is no alias. */
static int check_enums(const method_def *m)
{
    size_t n = m->nenums ? *m->nenums : 0;
    for (size_t e = 0; e < n; e++) {
        const rpc_param *p = NULL;
        for (size_t k = 0; k < m->nparams && !p; k++)
            if (strcmp(m->params[k].name, m->enums[e].param) == 0)
                p = &m->params[k];
        if (!p || (p->flags & RPC_P_ALIAS) ||
            (p->type != RPC_T_STR && p->type != RPC_T_STR_ARRAY) || !m->enums[e].words[0]) {
            log_error("method %s: enum of '%s' names no string parameter", m->name,
                      m->enums[e].param);
            return -EINVAL;
        }
    }
    /* the shared lists are the parsers' words, in their order */
    for (int t = 0; enum_memory_types[t]; t++)
        if (memrow_type_parse(enum_memory_types[t], strlen(enum_memory_types[t])) != t)
            return -EINVAL;
    for (int t = 0; enum_scopes[t]; t++)
        if (memrow_scope_parse(enum_scopes[t], strlen(enum_scopes[t])) != t)
            return -EINVAL;
    for (int t = 0; enum_tiers[t]; t++)
        if (tier_parse(enum_tiers[t], strlen(enum_tiers[t])) < 0)
            return -EINVAL;
    for (int t = 0; enum_index_engines[t]; t++)
        if (index_engine_parse(enum_index_engines[t], strlen(enum_index_engines[t])) < 0)
            return -EINVAL;
    return 0;
}

int methods_check(void)
{
    for (size_t i = 0; i < methods_count; i++) {
        table[i].nparams = *table[i].count;
        if (table[i].nparams > METHOD_MAX_PARAMS) {
            log_error("method %s has too many parameters", table[i].name);
            return -EINVAL;
        }
        if (i > 0 && strcmp(table[i - 1].name, table[i].name) >= 0) {
            log_error("method table not sorted at %s", table[i].name);
            return -EINVAL;
        }
        if (check_enums(&table[i]) < 0)
            return -EINVAL;
    }
    return 0;
}

const method_def *methods_find(const char *name, size_t n, size_t *idx)
{
    return hooks_method_find(table, methods_count, name, n, idx);
}
