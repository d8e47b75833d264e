/* tests/fakes/fake_req.h: the network layer as the method handlers see it, and the storage
 * pool they submit to, both faked, for unit tests of server/methods (and of the domain
 * modules that submit database jobs) without sockets or PostgreSQL.
 *
 * A test links the methods library's objects with this file instead of engram_net: it
 * defines what the handlers call of net/req.h (the request's arguments, arena, state,
 * answer, errors and database submits) and of net/worker.h (the worker's accessors and
 * mailbox), and every function of storage/db.h and storage/pgsync.h (so the archive's db.o
 * and pgsync.o, which would bring a real pool and real connections, are never pulled in;
 * the blocking calls fail as without a database). methods/app.c stays the real one: fr_env_init
 * runs its worker_init on the fake worker, so query admission, access logs and store groups are the
 * server's own.
 *
 * A request is made from a method name and its arguments as JSON (fr_call): the arguments
 * go through the real binder (rpc_bind_params with the method's schema, then
 * hooks_check_enums with its enums, as req.c does) and the handler runs. Every database job it (or
 * a domain module) submits is recorded, in order, with its statements' names and parameter values
 * copied (fr_job); the test answers a job with PGresults (tests/fakes/pgres.h), an error or an
 * outage, which runs the job's callback as the pool would. The request ends as the real one does
 * (req_done with its packed result, req_fail with a code, a message and details) and stays
 * inspectable until fr_free: its result or error map is decoded and rendered as JSON.
 *
 * What this fake does not do, and where it differs from req.c: a write's lock probe and
 * lane (req_submit records FR_SUBMIT whatever the method's flags), the standby read
 * (req_submit_read records FR_READ), answer budgets (req_done never asks to run again;
 * fr_again makes req_is_again true), and req_fail_db's mapping of SQLSTATEs to codes,
 * which is req.c's: the fake records the database result it was handed (fail_db) so that a
 * test checks the handler passed the failure on. The "field" detail of invalid_argument is
 * computed as req.c does (rpc_message_field on the message). Single-threaded except
 * worker_post, which other threads may call (consolidation replies).
 */
#ifndef ENGRAM_TESTS_FAKE_REQ_H
#define ENGRAM_TESTS_FAKE_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>
#include <msgpack.h>

#include "app.h"
#include "arena.h"
#include "db.h"
#include "hooks.h"
#include "req.h"
#include "server.h"
#include "tenants.h"
#include "worker.h"

/* ---- database jobs -------------------------------------------------------------------- */

/* How a job was submitted. */
enum fr_kind {
    FR_SUBMIT, /* req_submit: on the primary, for a request */
    FR_READ,   /* req_submit_read: may run on a standby, for a request */
    FR_LANE,   /* req_submit_lane: the tenant's lane, for a request */
    FR_POOL,   /* db_submit / db_submit_opts on a pool directly (no request) */
};

/* One statement of a job: its prepared name and its parameters as copied at submission. */
typedef struct fr_stmt {
    const char *name;
    size_t nvalues;
    char *values[DB_MAX_PARAMS]; /* NUL-terminated copies; NULL: SQL NULL */
    int lengths[DB_MAX_PARAMS];  /* bytes of each value (binary ones: as given) */
    int formats[DB_MAX_PARAMS];  /* 0 text, 1 binary */
} fr_stmt;

typedef struct fr_job {
    struct fr_job *next;
    int kind;      /* enum fr_kind */
    req *r;        /* the request (not FR_POOL) */
    db_pool *pool; /* FR_POOL: the pool it was submitted to */
    int64_t rls;   /* the tenant for row-level security, or -1 */
    unsigned lock_timeout_ms;
    int nq;
    fr_stmt q[DB_MAX_QUERIES];
    void (*rcb)(req *r, const db_result *res); /* a request's job */
    db_cb pcb;                                 /* a pool job */
    void *arg;
} fr_job;

/* fr_jobs returns how many jobs wait for an answer. fr_take removes and returns the oldest
 * (NULL when none): answer it with one of the calls below, or free it with fr_job_free. */
size_t fr_jobs(void);
fr_job *fr_take(void);
void fr_job_free(fr_job *j);

/* fr_val returns parameter i of statement q of j (NULL: SQL NULL or out of range). */
const char *fr_val(const fr_job *j, int q, size_t i);

/* fr_answer runs j's callback with DB_OK and the nres results res (taken: cleared after the
 * callback), then frees j. fr_answer1 is that with one result. */
void fr_answer(fr_job *j, PGresult **res, int nres);
void fr_answer1(fr_job *j, PGresult *res);

/* fr_answer_error runs j's callback with DB_ERROR (sqlstate, message, detail may be NULL)
 * and frees j; fr_answer_unavailable with DB_UNAVAILABLE. */
void fr_answer_error(fr_job *j, const char *sqlstate, const char *message, const char *detail);
void fr_answer_unavailable(fr_job *j, const char *message);

/* fr_submit_fail makes the next n submits fail as the pool refuses them (-EAGAIN: queue
 * full): db_submit returns it; the request forms fail the request with unavailable. */
void fr_submit_fail(int n);

/* fr_clear_jobs frees every waiting job without answering (their callbacks never run). */
void fr_clear_jobs(void);

/* ---- the worker ------------------------------------------------------------------------ */

/* fr_worker_create makes a worker of s with an event base, a pool, a lane pool and (read
 * true) a standby pool; fr_worker_destroy frees it (after app's worker_fini, see fr_env). */
worker *fr_worker_create(server *s, bool read);
void fr_worker_destroy(worker *w);

/* fr_run_posts runs what was posted to workers (worker_post) until nothing is left;
 * returns how many ran. */
size_t fr_run_posts(void);

/* fr_set_blocked makes req_tenant_blocked true for tenant (or false for -1). */
void fr_set_blocked(int64_t tenant_id);

/* fr_blocked_marks returns how many times req_tenant_mark_blocked was called. */
int fr_blocked_marks(void);

/* ---- a request ------------------------------------------------------------------------- */

typedef struct fr_cleanup {
    struct fr_cleanup *next;
    void (*fn)(void *arg);
    void *arg;
} fr_cleanup;

struct req {
    server *srv;
    worker *w;
    const method_def *m;
    conn_auth auth;
    const msgpack_object *args[METHOD_MAX_PARAMS];
    msgpack_sbuffer params; /* the arguments as MessagePack (json_to_msgpack) */
    msgpack_unpacked params_u;
    arena mem;
    void *state;
    void (*next)(req *r);
    fr_cleanup *cleanups;
    bool again;           /* req_is_again */
    bool tls_client_cert; /* req_tls_client_cert */
    bool close_after;     /* req_close_after was called */
    int set_auth;         /* times req_set_auth was called */
    conn_auth new_auth;   /* what it set */
    /* the outcome */
    bool bind_failed; /* the binder refused the arguments: the handler did not run */
    int ends;         /* req_done and req_fail* calls: exactly one is right */
    bool done;        /* ended by req_done */
    rpc_code code;    /* RPC_OK, or the failure's code (RPC_CODE_COUNT for req_fail_db) */
    char msg[1024];
    bool fail_db; /* ended by req_fail_db: what it was handed */
    db_status db_status;
    char db_sqlstate[8];
    char db_message[256];
    msgpack_sbuffer out; /* the result or the error response */
    msgpack_packer pk;
    msgpack_unpacked out_u;
    const msgpack_object *result; /* the packed result, decoded (done) */
    const msgpack_object *error;  /* the error map, decoded (req_fail / req_fail_details) */
    char *json;                   /* result or error map as JSON text (malloc'd) */
};

/* fr_env: one server, one worker with the real app hooks set up, a tenant identity. */
typedef struct fr_env {
    server srv;
    worker *w;
    tier_limits tiers[TIER_COUNT];
    char memory_limits[160], query_limits[80];
    conn_auth tenant; /* the identity of fr_call's requests (fr_call_as for another) */
    /* what the next requests see: req_tls_client_cert, req_is_again */
    bool tls_client_cert, again;
} fr_env;

/* fr_env_init loads the default settings (config_load with no arguments) then calls
 * tweak(cfg) when not NULL, publishes tiers and limits as main does, creates the tenancy,
 * the index registry (no background threads unless with_bg), the row cache and a worker
 * (app worker_init run). The tenant identity: tenant 7, key 70, tier standard, dim 8,
 * provider builtin. Returns 0 or -1. */
int fr_env_init(fr_env *e, void (*tweak)(config *cfg), bool with_bg);
void fr_env_fini(fr_env *e);

/* fr_index_loaded makes tenant's index loaded (the native engine) and empty, with every
 * change up to applied in it, as if a load had found no memory (through the registry's
 * internals, tenants_int.h); changes then go in with tenants_apply_upsert. Returns the
 * tenant with a reference (tenants_put it), or NULL. */
tenant *fr_index_loaded(fr_env *e, int64_t tenant_id, uint32_t dim, uint64_t applied);

/* fr_call runs method (by name) with the JSON object args (NULL: no arguments) as e's
 * tenant; fr_call_as as identity a. Returns the request (fr_free it), never NULL (aborts
 * on a bad test). */
req *fr_call(fr_env *e, const char *method, const char *args);
req *fr_call_as(fr_env *e, const conn_auth *a, const char *method, const char *args);

/* fr_free runs the request's cleanups and frees it. */
void fr_free(req *r);

/* fr_get returns field key of the result (done) or error map (failed), NULL when absent;
 * fr_path walks nested maps by "a.b.c" and arrays by index ("memories.0.id"). */
const msgpack_object *fr_get(const req *r, const char *key);
const msgpack_object *fr_path(const req *r, const char *path);

/* fr_field returns the error's "field" detail (NULL when none). */
const char *fr_field(const req *r);

/* Readers of a value found with fr_get/fr_path: true when o is of that type and value. */
bool fr_is_str(const msgpack_object *o, const char *s);
bool fr_is_int(const msgpack_object *o, int64_t v);
bool fr_is_nil(const msgpack_object *o);
bool fr_is_bool(const msgpack_object *o, bool v);
/* fr_num returns o as a double (NAN when not a number). */
double fr_num(const msgpack_object *o);
/* fr_len returns the element count of an array or map (-1 otherwise). */
long fr_len(const msgpack_object *o);

/* ---- results --------------------------------------------------------------------------- */

/* fr_rows builds a text result of ncols columns and nrows rows from a '|'-separated
 * description: names "a|b|c", then each row "1|x|\N" (\N: NULL). Aborts on a bad test. */
PGresult *fr_rows(const char *names, int nrows, ...);

/* fr_memrow_cells fills the 22 cells of SQL_MEMROW_COLS for one memory (text), in a static
 * buffer of the caller: cells[22] pointing into buf (2048 bytes). */
void fr_memrow_cells(char buf[2048], const char *cells[22], uint64_t id, const char *type,
                     const char *scope, const char *content, double importance,
                     const char *metadata, int64_t created_ms, uint64_t seq);
/* The 14 meta columns of a memory (MEMROW_META_NCOLS), likewise (buf of 512 bytes). */
void fr_meta_cells(char buf[512], const char *cells[14], uint64_t id, uint64_t seq,
                   const char *type, const char *scope, double importance, int64_t created_ms);

#endif
