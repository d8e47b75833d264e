/* server/methods.c: the sorted method table (see methods.h). */
#include "methods.h"

#include <string.h>

#include "handlers.h"
#include "log.h"

#define M(wire, h, flags)                                                                          \
    {                                                                                              \
        wire, h_##h, p_##h, 0, flags                                                               \
    }

/* Sorted by name (strcmp order); methods_check verifies it and fills in the parameter
 * counts (their sizes live in the handlers' files). */
static method_def table[] = {
    M("admin.tenant.create", admin_tenant_create, M_ADMIN),
    M("auth", auth, M_PUBLIC),
    M("memory.delete", memory_delete, M_TENANT | M_WRITE),
    M("memory.get", memory_get, M_TENANT),
    M("memory.search", memory_search, M_TENANT | M_QUERY),
    M("memory.store", memory_store, M_TENANT | M_WRITE),
    M("methods", methods, M_PUBLIC),
    M("ping", ping, M_PUBLIC),
    M("session.append", session_append, M_TENANT | M_WRITE),
    M("session.checkpoint", session_checkpoint, M_TENANT | M_WRITE),
    M("session.checkpoints", session_checkpoints, M_TENANT),
    M("session.children", session_children, M_TENANT),
    M("session.complete", session_complete, M_TENANT | M_WRITE),
    M("session.create", session_create, M_TENANT | M_WRITE),
    M("session.end", session_end, M_TENANT | M_WRITE),
    M("session.get", session_get, M_TENANT),
    M("session.handoff", session_handoff, M_TENANT),
    M("session.list", session_list, M_TENANT),
    M("session.messages", session_messages, M_TENANT),
    M("session.note.add", session_note_add, M_TENANT | M_WRITE),
    M("session.notes", session_notes, M_TENANT),
    M("session.resume", session_resume, M_TENANT | M_WRITE),
    M("session.scratchpad.get", session_scratchpad_get, M_TENANT),
    M("session.scratchpad.update", session_scratchpad_update, M_TENANT | M_WRITE),
    M("session.spawn", session_spawn, M_TENANT | M_WRITE),
    M("session.summarize", session_summarize, M_TENANT | M_WRITE),
    M("session.task.complete", session_task_complete, M_TENANT | M_WRITE),
    M("session.tombstone", session_tombstone, M_TENANT | M_WRITE),
};

static const size_t *const counts[] = {
    &np_admin_tenant_create,
    &np_auth,
    &np_memory_delete,
    &np_memory_get,
    &np_memory_search,
    &np_memory_store,
    &np_methods,
    &np_ping,
    &np_session_append,
    &np_session_checkpoint,
    &np_session_checkpoints,
    &np_session_children,
    &np_session_complete,
    &np_session_create,
    &np_session_end,
    &np_session_get,
    &np_session_handoff,
    &np_session_list,
    &np_session_messages,
    &np_session_note_add,
    &np_session_notes,
    &np_session_resume,
    &np_session_scratchpad_get,
    &np_session_scratchpad_update,
    &np_session_spawn,
    &np_session_summarize,
    &np_session_task_complete,
    &np_session_tombstone,
};

const method_def *const methods_table = table;
const size_t methods_count = sizeof(table) / sizeof(table[0]);

int methods_check(void)
{
    _Static_assert(sizeof(counts) / sizeof(counts[0]) == sizeof(table) / sizeof(table[0]),
                   "every method needs its parameter count");
    for (size_t i = 0; i < methods_count; i++) {
        table[i].nparams = *counts[i];
        if (table[i].nparams > METHOD_MAX_PARAMS) {
            log_error("method %s has too many parameters", table[i].name);
            return -1;
        }
        if (i > 0 && strcmp(table[i - 1].name, table[i].name) >= 0) {
            log_error("method table not sorted at %s", table[i].name);
            return -1;
        }
    }
    return 0;
}

const method_def *methods_find(const char *name, size_t n, size_t *idx)
{
    size_t lo = 0, hi = methods_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const char *m = table[mid].name;
        size_t mlen = strlen(m);
        int c = memcmp(m, name, mlen < n ? mlen : n);
        if (c == 0)
            c = mlen < n ? -1 : mlen > n ? 1 : 0;
        if (c == 0) {
            *idx = mid;
            return &table[mid];
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
