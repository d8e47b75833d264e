/* server/methods/handlers.h: every RPC handler and its parameter schema, for methods.c's table.
 *
 * Handlers live in m_*.c by topic. Each declares `h_<name>` and `p_<name>` (its
 * parameters, in the order of the P_* enum its file uses with req_arg).
 */
#ifndef ENGRAM_SERVER_HANDLERS_H
#define ENGRAM_SERVER_HANDLERS_H

#include <stddef.h>

#include "hooks.h"
#include "req.h"
#include "rpc.h"
#include "tiers.h"

#define HANDLER(name)                                                                              \
    void h_##name(req *r);                                                                         \
    extern const rpc_param p_##name[];                                                             \
    extern const size_t np_##name;                                                                 \
    extern const method_enum e_##name[];                                                           \
    extern const size_t ne_##name

/* m_sys.c */
HANDLER(ping);
HANDLER(auth);
HANDLER(methods);

/* m_store.c */
HANDLER(memory_store);
HANDLER(memory_store_batch);

/* m_memory.c */
HANDLER(memory_get);
HANDLER(memory_delete);
HANDLER(memory_update);
HANDLER(memory_archive);
HANDLER(memory_restore);

/* m_memlist.c */
HANDLER(memory_history);
HANDLER(memory_list);
HANDLER(memory_stats);

/* m_search.c */
HANDLER(memory_search);
HANDLER(memory_context);

/* m_prompt.c */
HANDLER(memory_prompt);

/* m_feedback.c */
HANDLER(memory_feedback);
HANDLER(memory_provenance);

/* m_session.c */
HANDLER(session_append);
HANDLER(session_checkpoint);
HANDLER(session_checkpoints);
HANDLER(session_children);
HANDLER(session_complete);
HANDLER(session_create);
HANDLER(session_context);
HANDLER(session_delete);
HANDLER(session_end);
HANDLER(session_get);
HANDLER(session_handoff);
HANDLER(session_list);
HANDLER(session_messages);
HANDLER(session_note_add);
HANDLER(session_notes);
HANDLER(session_resume);
HANDLER(session_scratchpad_get);
HANDLER(session_scratchpad_update);
HANDLER(session_spawn);
HANDLER(session_summarize);
HANDLER(session_task_complete);
HANDLER(session_tombstone);

/* m_work.c */
HANDLER(session_audit);
HANDLER(session_work_item_add);
HANDLER(session_work_item_list);
HANDLER(session_work_item_update);

/* m_extract.c */
HANDLER(session_extract);
HANDLER(tenant_dream);

/* m_consolidate.c */
HANDLER(memory_consolidate);
HANDLER(memory_consolidation_runs);

/* m_admin.c */
HANDLER(admin_tenant_create);
HANDLER(admin_tenant_get);
HANDLER(admin_tenant_list);
HANDLER(admin_tenant_update);
HANDLER(admin_tenant_delete);
HANDLER(admin_key_create);
HANDLER(admin_key_list);
HANDLER(admin_key_revoke);
/* m_move.c */
HANDLER(admin_tenant_move);
HANDLER(tenant_usage);

#define PARAMS(name, ...)                                                                          \
    const rpc_param p_##name[] = {__VA_ARGS__};                                                    \
    const size_t np_##name = sizeof(p_##name) / sizeof(p_##name[0])

/* ENUMS(name, {"param", words}, ...): the parameters of method name that take one of a
 * fixed set of strings (hooks.h method_enum); methods.c lists the method with ME(). */
#define ENUMS(name, ...)                                                                           \
    const method_enum e_##name[] = {__VA_ARGS__};                                                  \
    const size_t ne_##name = sizeof(e_##name) / sizeof(e_##name[0])

/* Word lists several methods share (methods.c). */
extern const char *const enum_memory_types[];  /* fact, preference, ... (memrow.h's order) */
extern const char *const enum_scopes[];        /* agent, clade, tenant */
extern const char *const enum_search_modes[];  /* vector, text, hybrid */
extern const char *const enum_tiers[];         /* free, standard, premium */
extern const char *const enum_index_engines[]; /* native, faiss */

#define NO_PARAMS(name)                                                                            \
    const rpc_param p_##name[] = {{NULL, RPC_T_ANY, 0, 0, 0}};                                     \
    const size_t np_##name = 0

#endif
