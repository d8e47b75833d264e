/* server/methods/sq.h: statements that answer with one JSON document (the session and work
 * item methods): building their text parameters, and turning the document into the
 * request's MessagePack result.
 *
 * A handler fills an sq with sq_init and the sq_* adders in the order of the statement's
 * parameters, then sq_submit ends the request exactly once (with the result, or an error).
 * The statement returns one row with one text column (JSON). SQLSTATE EG402/EG409/EG429
 * with a DETAIL of "key=value ..." become error fields (limit, usage, version, ...); other
 * errors go through req_fail_db. All functions run on the request's worker thread; the
 * values live in the request's arena.
 */
#ifndef ENGRAM_SERVER_SQ_H
#define ENGRAM_SERVER_SQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "db.h"
#include "req.h"

#define SQ_JSON_TOO_BIG 100 /* sq_json: the JSON text passes max_bytes */

/* Parameter schemas of ids: required, or optional (nil allowed). */
#define ID_PARAM(name)                                                                             \
    {                                                                                              \
        name, RPC_T_UINT, RPC_P_REQUIRED, 0, 0                                                     \
    }
#define OPT_ID_PARAM(name)                                                                         \
    {                                                                                              \
        name, RPC_T_UINT, RPC_P_NULLABLE, 0, 0                                                     \
    }

/* The text parameters of one statement. The first is always the authenticated tenant: no
 * statement ever takes a tenant from the client. oom: an adder ran out of memory (sq_submit
 * fails the request). */
typedef struct sq {
    req *r;
    const char *v[DB_MAX_PARAMS];
    int n;
    bool oom;
} sq;

/* sq_init empties q and adds the authenticated tenant as its first parameter. */
void sq_init(sq *q, req *r);

/* sq_add adds v (NULL: SQL NULL) as the next parameter; v must outlive the request. */
void sq_add(sq *q, const char *v);

/* sq_i64 adds a signed integer. */
void sq_i64(sq *q, int64_t v);

/* sq_u64 adds an unsigned id (o NULL: SQL NULL) as its 64 bits in a bigint, the way the
 * schema stores them. */
void sq_u64(sq *q, const msgpack_object *o);

/* sq_time adds a RPC_T_TIME value (o NULL: SQL NULL) as milliseconds since the epoch. */
void sq_time(sq *q, const msgpack_object *o);

/* sq_str adds a string (o NULL: SQL NULL). */
void sq_str(sq *q, const msgpack_object *o);

/* sq_num adds a number (o NULL: SQL NULL) as the shortest decimal that reads back as the
 * same double. */
void sq_num(sq *q, const msgpack_object *o);

/* sq_json adds an already validated value (o NULL: SQL NULL) as JSON text nested at most
 * depth levels. Returns 0; SQ_JSON_TOO_BIG when its JSON passes max_bytes; -ENOMEM; or
 * another json_from_msgpack code. Nothing is added when it fails (the caller fails the
 * request). */
int sq_json(sq *q, const msgpack_object *o, unsigned depth, size_t max_bytes);

/* sq_words adds a text[] literal from an array of words already checked against a word
 * list (no quoting is needed), or NULL. */
void sq_words(sq *q, const msgpack_object *o);

/* sq_submit runs statement def with q's parameters for the authenticated tenant and ends
 * the request with its JSON result or its error (or fails it at once when building the
 * parameters ran out of memory). */
void sq_submit(sq *q, const db_stmt_def *def);

/* sq_submit_cb runs statement def with q's parameters for the authenticated tenant and
 * hands its result to cb(r, res) (on the request's worker thread), which ends the request;
 * when building the parameters ran out of memory it fails the request at once instead. */
void sq_submit_cb(sq *q, const db_stmt_def *def, void (*cb)(req *r, const db_result *res));

/* sq_check_word returns true when the string o (NULL: absent) is one of the NULL-terminated
 * words; otherwise it fails the request with invalid_argument naming the parameter and the
 * list and returns false. sq_check_words does the same for every string of the array o
 * (NULL: absent). */
bool sq_check_word(req *r, const msgpack_object *o, const char *name, const char *const *words,
                   const char *list);
bool sq_check_words(req *r, const msgpack_object *o, const char *name, const char *const *words,
                    const char *list);

#endif
