/* server/methods/memops.h: what the memory methods (m_store.c, m_memory.c, m_memlist.c)
 * share: metadata checks, the errors of a failed write, index updates from returned rows,
 * statements over a list of ids. */
#ifndef ENGRAM_SERVER_MEMOPS_H
#define ENGRAM_SERVER_MEMOPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>
#include <msgpack.h>

#include "db.h"
#include "req.h"
#include "rpc.h"
#include "sql.h"

/* mo_metadata_json checks a metadata map (what prefixes the parameter's name in messages) and
 * sets *out to its JSON text, allocated in r's arena. Returns RPC_OK, or
 * RPC_INVALID_ARGUMENT / RPC_INTERNAL with the reason in err. */
rpc_code mo_metadata_json(req *r, const msgpack_object *md, const char *what, char **out, char *err,
                          size_t errlen);

/* mo_write_fail ends r for a failed job that stores, updates, archives or restores memories: a tier
 * limit (EG429, detail "limit=L usage=U requested=N") becomes quota_exceeded with limit, usage,
 * requested and quota ("memories": the live memory count, requested memories;
 * "memory_bytes": the bytes of text the memories and their kept versions hold, requested
 * bytes); anything else as req_fail_db. requested: the memories asked for (a detail's
 * requested is used when present). */
void mo_write_fail(req *r, const db_result *res, int64_t requested);

/* mo_apply_meta_rows applies every meta row (14 columns from col) of pr to the tenant's index, with
 * vec for all of them (NULL: metadata only). */
void mo_apply_meta_rows(req *r, const PGresult *pr, int col, const float *vec);

/* mo_submit_ids submits one statement taking (tenant, ids[]) with the request's ids argument; a
 * read (read true) may run on a standby (req_submit_read). */
void mo_submit_ids(req *r, size_t param, sql_stmt stmt, bool read,
                   void (*cb)(req *, const db_result *));

#endif
