/* server/net/req.c: request lifecycle, dispatch and replies (see req.h). */
#include "req.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hooks.h"
#include "idmap.h"
#include "log.h"
#include "memrow.h"
#include "metrics.h"
#include "offload.h"
#include "sql.h"
#include "worker.h"

#define OUT_FIRST 4096

/* An answer as it is packed: its capacity is what the connection's budgets granted. */
typedef struct outbuf {
    char *data;
    size_t size, cap;
} outbuf;

typedef struct cleanup {
    struct cleanup *next;
    void (*fn)(void *arg);
    void *arg;
} cleanup;

struct req {
    conn *c;
    worker *w;
    server *srv;
    const method_def *m;
    size_t midx; /* index in the method table, SIZE_MAX when unknown */
    uint32_t msgid;
    bool notify;
    bool barrier; /* an M_AUTH request: the connection holds later requests until it ends */
    uint64_t t0_ns;
    conn_auth auth; /* who the connection was when the request arrived */
    uint8_t *msg;
    size_t msg_len, msg_values;
    msgpack_zone zone;
    const msgpack_object *args[METHOD_MAX_PARAMS];
    outbuf out;
    msgpack_packer pk;
    /* budgets (conn.h): what the connection charged for this request, and how much of it
     * the answer may fill before it asks for more */
    size_t charged, answer_room;
    bool force;    /* a write or an auth: its answer is granted whatever the budgets say */
    bool counting; /* the answer did not fit: only its size is counted now (need) */
    bool oom;      /* ... because memory ran out */
    size_t need;
    bool again;        /* running again after its answer did not fit (req_is_again) */
    bool close_after;  /* close the connection once the answer is out (req_close_after) */
    size_t park_bytes; /* parked (conn_admit): the answer room it waits for */
    bool in_load;      /* counted in its method's load on the connection (conn_answer_done) */
    req *park_next;
    void *state;
    void (*next)(req *r); /* where req_continue continues */
    arena mem;            /* the handler's allocations (req_alloc) */
    cleanup *cleanups;
};

server *req_server(req *r)
{
    return r->srv;
}

worker *req_worker(req *r)
{
    return r->w;
}

db_pool *req_db(req *r)
{
    return worker_db(r->w);
}

const conn_auth *req_auth(req *r)
{
    return &r->auth;
}

const char *req_method(req *r)
{
    return r->m ? r->m->name : "unknown";
}

const msgpack_object *req_arg(req *r, size_t i)
{
    return i < METHOD_MAX_PARAMS ? r->args[i] : NULL;
}

bool req_tls_client_cert(req *r)
{
    return conn_tls_client_cert(r->c);
}

void req_set_auth(req *r, const conn_auth *a)
{
    r->auth = *a;
    r->auth.claimed = false;
    if (conn_alive(r->c))
        conn_set_auth(r->c, a);
    else if (a->authenticated && !a->admin && a->claimed && r->srv->hooks->key_released)
        r->srv->hooks->key_released(r->srv, a->key_id); /* it went meanwhile */
}

void *req_state(req *r)
{
    return r->state;
}

void req_set_state(req *r, void *st)
{
    r->state = st;
}

void *req_alloc(req *r, size_t n)
{
    return arena_alloc(&r->mem, n);
}

arena *req_arena(req *r)
{
    return &r->mem;
}

char *req_strdup(req *r, const msgpack_object *o)
{
    if (!o || o->type != MSGPACK_OBJECT_STR)
        return NULL;
    char *s = req_alloc(r, o->via.str.size + 1);
    if (!s)
        return NULL;
    memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = '\0';
    return s;
}

int req_on_free(req *r, void (*fn)(void *arg), void *arg)
{
    cleanup *c = req_alloc(r, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->fn = fn;
    c->arg = arg;
    c->next = r->cleanups;
    r->cleanups = c;
    return 0;
}

static void req_free(req *r)
{
    for (cleanup *c = r->cleanups; c; c = c->next)
        c->fn(c->arg);
    arena_reset(&r->mem);
    free(r->out.data);
    msgpack_zone_destroy(&r->zone);
    free(r->msg);
    free(r);
}

/* The packer's writer: appends to r->out within what the budgets grant (conn.h). An answer
 * that outgrows its room asks the connection for more; when the budgets refuse (or the
 * answer passes max_result_bytes), packing goes on counting bytes only, and req_done decides
 * (refuse it, or run the request again once it fits). Never fails, so the packer goes on. */
static int out_write(void *data, const char *buf, size_t len)
{
    req *r = data;
    if (r->counting) {
        r->need += len;
        return 0;
    }
    size_t want = r->out.size + len;
    if (want > r->out.cap) {
        /* the whole reservation at once (an answer of a size learnt before is copied once),
         * then doubling; never growing by less, which would copy a large answer over and
         * over while the budgets are tight */
        size_t cap = r->out.cap                   ? r->out.cap
                     : r->answer_room > OUT_FIRST ? r->answer_room
                                                  : OUT_FIRST;
        while (cap < want && cap <= SIZE_MAX / 2)
            cap *= 2;
        if (cap < want)
            cap = want;
        size_t limit = (size_t)r->srv->cfg.max_result_bytes;
        bool fits = true;
        if (cap > r->answer_room) {
            if (r->force) {
                conn_charge_force(r->c, cap - r->answer_room);
            } else {
                if (cap > limit)
                    cap = limit > want ? limit : want;
                /* over max_result_bytes, or more than the budgets give: count the rest, and
                 * req_done decides (refuse it, or run again with room for all of it) */
                fits = want <= limit && conn_charge_more(r->c, cap - r->answer_room);
            }
            if (fits) {
                r->charged += cap - r->answer_room;
                r->answer_room = cap;
            }
        }
        char *n = fits ? realloc(r->out.data, cap) : NULL;
        if (!n) {
            r->oom = fits;
            r->counting = true;
            r->need = want;
            free(r->out.data);
            r->out = (outbuf){0};
            return 0;
        }
        r->out.data = n;
        r->out.cap = cap;
    }
    memcpy(r->out.data + r->out.size, buf, len);
    r->out.size = want;
    return 0;
}

/* Starts the response over (a result, or an error after a result was begun). */
static void out_reset(req *r)
{
    r->out.size = 0;
    r->counting = r->oom = false;
    r->need = 0;
}

/* Ends the request: writes the response (unless a notification), records metrics,
 * releases the connection. */
static void req_end(req *r, rpc_code code)
{
    if (r->in_load) {
        conn_answer_done(r->c, r->midx, r->out.size, code == RPC_OK && !r->notify);
        r->in_load = false;
    }
    if (!r->notify && r->out.size)
        conn_write(r->c, r->out.data, r->out.size);
    if (r->close_after)
        conn_close_after_flush(r->c);
    free(r->out.data);
    r->out = (outbuf){0};
    conn_uncharge(r->c, r->charged);
    r->charged = 0;
    uint64_t us = (server_mono_ns() - r->t0_ns) / 1000u;
    metrics_request(r->midx, code, us);
    if (r->barrier) {
        /* a failed auth leaves no identity behind, whatever the connection was before */
        if (code != RPC_OK && conn_alive(r->c)) {
            conn_auth none = {0};
            conn_set_auth(r->c, &none);
        }
        conn_release(r->c);
    }
    worker_req_finished(r->w);
    conn_request_finished(r->c);
    conn_unref(r->c);
    req_free(r);
}

msgpack_packer *req_result(req *r)
{
    out_reset(r);
    rpc_pack_result_begin(&r->pk, r->msgid);
    return &r->pk;
}

/* Empties what a run of the handler left: its cleanups, its arena, its state and its
 * answer; the answer's room goes back to the budgets. */
static void reset_run(req *r)
{
    for (cleanup *c = r->cleanups; c; c = c->next)
        c->fn(c->arg);
    r->cleanups = NULL;
    arena_reset(&r->mem);
    r->state = NULL;
    r->next = NULL;
    free(r->out.data);
    r->out = (outbuf){0};
    conn_uncharge(r->c, r->answer_room);
    r->charged -= r->answer_room;
    r->answer_room = 0;
}

/* Reserves room for r's answer and runs its handler, now or once the room is there. */
static void admit_and_run(req *r, size_t need)
{
    size_t room = conn_answer_reserve(r->c, r->midx, r->srv->hooks->nmethods, need);
    if (r->force) {
        conn_admit_force(r->c, r->midx, room); /* a write or an auth never waits */
    } else if (!conn_admit(r->c, r, r->midx, room, r->charged)) {
        r->park_bytes = room;
        return;
    }
    r->in_load = true;
    r->charged += room;
    r->answer_room = room;
    r->m->fn(r);
}

req *req_parked_next(req *r)
{
    return r->park_next;
}

void req_set_parked_next(req *r, req *next)
{
    r->park_next = next;
}

size_t req_parked_bytes(req *r)
{
    return r->park_bytes;
}

size_t req_method_index(req *r)
{
    return r->midx;
}

size_t req_charged(req *r)
{
    return r->charged;
}

void req_resume(req *r)
{
    size_t room = r->park_bytes;
    r->park_bytes = 0;
    r->in_load = true;
    r->charged += room;
    r->answer_room = room;
    r->m->fn(r);
}

void req_abandon(req *r)
{
    r->notify = true; /* nothing to answer: the connection is gone */
    req_end(r, RPC_UNAVAILABLE);
}

void req_done(req *r)
{
    if (r->counting && !r->notify) {
        size_t limit = (size_t)r->srv->cfg.max_result_bytes;
        if (r->oom) {
            req_fail(r, RPC_INTERNAL, "out of memory packing the answer");
        } else if (r->need > limit) {
            rpc_detail d[2] = {{"limit", RPC_D_UINT, {.u = limit}},
                               {"size", RPC_D_UINT, {.u = r->need}}};
            metrics_answer_refused();
            req_fail_details(r, RPC_RESULT_TOO_LARGE, d, 2,
                             "the answer is %zu bytes, more than max_result_bytes (%zu): ask for "
                             "less (fewer ids, a smaller top_k or page)",
                             r->need, limit);
        } else {
            /* it fits max_result_bytes, not what is left now: run it again once it does */
            size_t need = r->need;
            metrics_answer_deferred();
            conn_answer_done(r->c, r->midx, need, true);
            r->in_load = false;
            reset_run(r);
            r->again = true;
            r->counting = false;
            r->need = 0;
            admit_and_run(r, need);
        }
        return;
    }
    req_end(r, RPC_OK);
}

void req_close_after(req *r)
{
    r->close_after = true;
}

bool req_is_again(req *r)
{
    return r->again;
}

static void fail_v(req *r, rpc_code code, const rpc_detail *d, size_t nd, const char *fmt,
                   va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    out_reset(r);
    /* an error always goes out: it is small, and its request's reservation holds it */
    bool force = r->force;
    r->force = true;
    /* invalid_argument names the parameter in data.field too (the message quotes it) */
    rpc_detail all[9];
    char field[160];
    bool has_field = false;
    for (size_t i = 0; i < nd; i++)
        has_field = has_field || strcmp(d[i].key, "field") == 0;
    if (code == RPC_INVALID_ARGUMENT && !has_field && nd < 8 &&
        rpc_message_field(msg, field, sizeof(field))) {
        for (size_t i = 0; i < nd; i++)
            all[i] = d[i];
        all[nd] = (rpc_detail){"field", RPC_D_STR, {.s = field}};
        d = all;
        nd++;
    }
    rpc_pack_error(&r->pk, r->msgid, code, msg, d, nd);
    r->force = force;
    if (code == RPC_INTERNAL)
        log_error("%s: internal error: %s", req_method(r), msg);
    else
        log_debug("%s: %s: %s", req_method(r), rpc_code_name(code), msg);
    req_end(r, code);
}

void req_fail(req *r, rpc_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(r, code, NULL, 0, fmt, ap);
    va_end(ap);
}

void req_fail_details(req *r, rpc_code code, const rpc_detail *d, size_t nd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(r, code, d, nd, fmt, ap);
    va_end(ap);
}

/* SQLSTATEs our functions raise, and the client codes they mean. */
static const struct {
    const char *sqlstate;
    rpc_code code;
} sqlstate_codes[] = {
    {"EG400", RPC_INVALID_ARGUMENT},
    {"EG403", RPC_PERMISSION_DENIED},
    {"EG404", RPC_NOT_FOUND},
    {"EG409", RPC_CONFLICT},
    {"EG410", RPC_ALREADY_EXISTS},
    {"EG429", RPC_QUOTA_EXCEEDED},
    {"EG402", RPC_COST_LIMIT_EXCEEDED},
    /* a write embedded with the model its tenant left meanwhile (re-embedding): again */
    {"EG412", RPC_UNAVAILABLE},
    /* Citus: the tenant's shard group was split or moved under the statement (a tenant
     * move, storage/citusmove.h): nothing was written; again */
    {"EG503", RPC_UNAVAILABLE},
};

/* Citus raises these when the cluster changes under a request, as internal errors (XX000)
 * when a tenant move overtakes it (a statement routed to a shard that a split or move has
 * just replaced, or a function call delegated to the worker the tenant's shards are
 * leaving, whose statements are then no longer local; a worker that died during the
 * commit, which may or may not have committed), and as 0A000 when a worker's
 * primary failed over: until the coordinator has synced its metadata to the promoted
 * worker it does not delegate calls to it, and a store run on the coordinator sends its
 * inserts by COPY, which row-level security refuses. Transient: nothing was written, but
 * for the commit case.
 * Outside those moments each would be a function that Citus cannot run (docs/scaling.md),
 * so each is logged. */
static bool citus_moved_under(const db_result *res)
{
    if (!res->sqlstate || !res->message)
        return false;
    if (strcmp(res->sqlstate, "0A000") == 0)
        return strstr(res->message, "COPY FROM not supported with row-level security") != NULL;
    if (strcmp(res->sqlstate, "XX000") != 0)
        return false;
    return strstr(res->message, "could not find valid entry for shard") != NULL ||
           strstr(res->message, "cannot execute a distributed query from a query on a shard") !=
               NULL ||
           /* the worker died under the commit: committed or not is unknown, as when the
            * connection to one PostgreSQL breaks there (a retry with the request's
            * idempotency key tells) */
           strstr(res->message, "could not commit transaction for shard") != NULL ||
           /* the coordinator's postmaster died under the request (a failover of the
            * coordinator: test_citus_ha): its backend ends, committed or not unknown */
           strstr(res->message, "postmaster was shut down, exiting") != NULL;
}

void req_fail_db(req *r, const db_result *res)
{
    if (res->status == DB_UNAVAILABLE) {
        req_fail(r, RPC_UNAVAILABLE, "database unavailable: %s",
                 res->message ? res->message : "no connection");
        return;
    }
    for (size_t i = 0; i < sizeof(sqlstate_codes) / sizeof(sqlstate_codes[0]); i++) {
        if (res->sqlstate && strcmp(res->sqlstate, sqlstate_codes[i].sqlstate) == 0) {
            req_fail(r, sqlstate_codes[i].code, "%s", res->message ? res->message : "error");
            return;
        }
    }
    if (res->sqlstate && strcmp(res->sqlstate, "55P03") == 0) {
        req_fail(r, RPC_UNAVAILABLE, "%s", res->message ? res->message : "lock not available");
        return;
    }
    if (citus_moved_under(res)) {
        log_warn("%s: %s (taken for a change of the Citus cluster under the request: "
                 "unavailable)",
                 req_method(r), res->message);
        req_fail(r, RPC_UNAVAILABLE,
                 "the tenant's shard moved or its node failed over under the request, retry "
                 "(%s)",
                 res->message);
        return;
    }
    /* serialization failures and deadlocks are transient: the client may retry */
    if (res->sqlstate &&
        (strcmp(res->sqlstate, "40001") == 0 || strcmp(res->sqlstate, "40P01") == 0 ||
         strncmp(res->sqlstate, "08", 2) == 0 || strcmp(res->sqlstate, "57014") == 0 ||
         strncmp(res->sqlstate, "57P", 3) == 0)) {
        req_fail(r, RPC_UNAVAILABLE, "database busy or unavailable, retry (%s)", res->sqlstate);
        return;
    }
    log_error("%s: database error %s: %s", req_method(r), res->sqlstate ? res->sqlstate : "?",
              res->message ? res->message : "?");
    req_fail(r, RPC_INTERNAL, "internal database error");
}

typedef struct submit_ctx {
    req *r;
    void (*cb)(req *r, const db_result *res);
} submit_ctx;

static void on_job(void *arg, const db_result *res)
{
    submit_ctx *sc = arg;
    req *r = sc->r;
    void (*cb)(req *, const db_result *) = sc->cb;
    free(sc);
    cb(r, res);
}

/* ---- writes: lock waits off the shared pipelines --------------------------------------- *
 *
 * A write of a tenant whose row another transaction holds would wait for it in a pipelined
 * connection that other tenants' statements share, and stall them all. So a write first
 * runs with a short lock_timeout (write_lock_probe_ms) in the worker's pool; when that
 * passes (SQLSTATE 55P03) it runs again on the worker's lane (worker_lane_db: one
 * connection, one job at a time) with write_lock_wait_ms, and the tenant's next writes go
 * there directly until one succeeds or that time has passed. One job of a tenant is on the
 * lane at a time; its others wait in order behind it, and when it fails for the lock they
 * fail with it (they would wait for the same lock): `unavailable`, naming the wait. */

#define LANE_MAX_WAITING 256 /* a tenant's writes waiting for the lane before refusing */

typedef struct lane_job {
    struct lane_job *next;
    req *r;
    int64_t tenant, rls;
    void (*cb)(req *r, const db_result *res);
    int nq;
    db_query qs[DB_MAX_QUERIES];
    char *blob; /* the copied values of qs */
} lane_job;

typedef struct lane_tenant {
    lane_job *head, *tail; /* waiting for the lane, oldest first */
    size_t waiting;
    bool running;           /* one of its jobs is on the lane */
    uint64_t blocked_until; /* monotonic ms: its writes go to the lane until then */
} lane_tenant;

static uint64_t now_mono_ms(void)
{
    return server_mono_ns() / 1000000u;
}

static void lane_job_free(lane_job *j)
{
    if (j) {
        free(j->blob);
        free(j);
    }
}

/* A copy of the job (qs copied) for r, or NULL when out of memory. */
static lane_job *lane_job_new(req *r, int64_t rls, const db_query *qs, int nq,
                              void (*cb)(req *r, const db_result *res))
{
    lane_job *j = calloc(1, sizeof(*j));
    if (!j || db_query_copy(qs, nq, j->qs, &j->blob) < 0) {
        free(j);
        return NULL;
    }
    j->r = r;
    j->tenant = r->auth.tenant_id;
    j->rls = rls;
    j->cb = cb;
    j->nq = nq;
    return j;
}

/* The lane state of tenant t on r's worker (created when create), or NULL. */
static lane_tenant *lane_of(worker *w, int64_t t, bool create)
{
    idmap *m = worker_lanes(w);
    uint64_t v;
    if (!m)
        return NULL;
    if (idmap_get(m, (uint64_t)t, &v))
        return (lane_tenant *)(uintptr_t)v;
    if (!create)
        return NULL;
    lane_tenant *lt = calloc(1, sizeof(*lt));
    if (lt && idmap_put(m, (uint64_t)t, (uint64_t)(uintptr_t)lt) < 0) {
        free(lt);
        lt = NULL;
    }
    return lt;
}

/* Forgets t's lane state when nothing waits and its block is over. */
static void lane_tidy(worker *w, int64_t t, lane_tenant *lt)
{
    if (!lt->head && !lt->running && now_mono_ms() >= lt->blocked_until) {
        idmap_del(worker_lanes(w), (uint64_t)t);
        free(lt);
    }
}

static void lane_pump(worker *w, int64_t t, lane_tenant *lt);

/* Ends job j with res through its callback (which ends the request), freeing j. */
static void lane_finish(lane_job *j, const db_result *res)
{
    void (*cb)(req *, const db_result *) = j->cb;
    req *r = j->r;
    lane_job_free(j);
    cb(r, res);
}

/* Ends job j as failed for want of the database: unavailable with message. */
static void lane_unavailable(lane_job *j, const char *message)
{
    db_result res = {.status = DB_UNAVAILABLE, .message = message};
    lane_finish(j, &res);
}

static void lane_done(void *arg, const db_result *res)
{
    lane_job *j = arg;
    worker *w = j->r->w;
    int64_t t = j->tenant;
    lane_tenant *lt = lane_of(w, t, false);
    server *srv = j->r->srv;
    bool lock_timeout =
        res->status == DB_ERROR && res->sqlstate && strcmp(res->sqlstate, "55P03") == 0;
    if (lt)
        lt->running = false;
    if (lock_timeout) {
        metrics_write_lock(METRICS_LOCK_LANE_TIMEOUT);
        metrics_write_lock_stuck(t);
        log_info("tenant %lld: a write waited %d ms for a lock another transaction holds; "
                 "refused with the writes queued behind it",
                 (long long)t, srv->cfg.write_lock_wait_ms);
        if (lt)
            lt->blocked_until = now_mono_ms() + (uint64_t)srv->cfg.write_lock_wait_ms;
        /* the ones queued behind it would wait for the same lock */
        lane_job *rest = lt ? lt->head : NULL;
        if (lt) {
            lt->head = lt->tail = NULL;
            lt->waiting = 0;
        }
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "this tenant's data is locked by another transaction: the write waited %d ms "
                 "(write_lock_wait_ms) and changed nothing; retry later",
                 srv->cfg.write_lock_wait_ms);
        db_result locked = {.status = DB_ERROR, .sqlstate = "55P03", .message = msg};
        lane_job *all = j;
        j->next = rest;
        while (all) {
            lane_job *next = all->next;
            lane_finish(all, &locked);
            all = next;
        }
    } else {
        if (res->status == DB_OK) {
            metrics_write_lock(METRICS_LOCK_LANE_OK);
            if (lt)
                lt->blocked_until = 0;
        }
        lane_finish(j, res);
    }
    lt = lane_of(w, t, false); /* a callback may have queued more */
    if (lt) {
        lane_pump(w, t, lt);
        lane_tidy(w, t, lt);
    }
}

/* Sends t's oldest waiting job to the lane unless one is running. */
static void lane_pump(worker *w, int64_t t, lane_tenant *lt)
{
    while (!lt->running && lt->head) {
        lane_job *j = lt->head;
        lt->head = j->next;
        if (!lt->head)
            lt->tail = NULL;
        lt->waiting--;
        j->next = NULL;
        const config *cfg = &j->r->srv->cfg;
        db_opts o = {.rls_tenant = j->rls, .lock_timeout_ms = (unsigned)cfg->write_lock_wait_ms};
        lt->running = true;
        int rc = db_submit_opts(worker_lane_db(w), &o, j->qs, j->nq, lane_done, j);
        if (rc < 0) {
            lt->running = false;
            lane_unavailable(j, rc == -EAGAIN   ? "database queue full, retry later"
                                : rc == -ENOMEM ? "out of memory"
                                                : "database unavailable (shutting down)");
        }
    }
}

/* Queues j on its tenant's lane (taking it); fails its request when that cannot be. */
static void lane_enqueue(lane_job *j)
{
    worker *w = j->r->w;
    lane_tenant *lt = lane_of(w, j->tenant, true);
    if (!lt) {
        lane_unavailable(j, "out of memory");
        return;
    }
    if (lt->waiting >= LANE_MAX_WAITING) {
        lane_unavailable(j, "too many writes of this tenant wait for a lock another "
                            "transaction holds; retry later");
        return;
    }
    if (lt->tail)
        lt->tail->next = j;
    else
        lt->head = j;
    lt->tail = j;
    lt->waiting++;
    lane_pump(w, j->tenant, lt);
}

void req_submit_lane(req *r, int64_t rls_tenant, const db_query *qs, int nq,
                     void (*cb)(req *r, const db_result *res))
{
    lane_job *j = lane_job_new(r, rls_tenant, qs, nq, cb);
    if (!j) {
        db_result res = {.status = DB_UNAVAILABLE, .message = "out of memory"};
        cb(r, &res);
        return;
    }
    lane_enqueue(j);
}

void req_tenant_mark_blocked(req *r)
{
    lane_tenant *lt = lane_of(r->w, r->auth.tenant_id, true);
    if (lt)
        lt->blocked_until = now_mono_ms() + (uint64_t)r->srv->cfg.write_lock_wait_ms;
    metrics_write_lock(METRICS_LOCK_PROBE_TIMEOUT);
}

bool req_tenant_blocked(req *r)
{
    lane_tenant *lt = lane_of(r->w, r->auth.tenant_id, false);
    return lt && (lt->head || lt->running || now_mono_ms() < lt->blocked_until);
}

static void probe_done(void *arg, const db_result *res)
{
    lane_job *j = arg;
    if (res->status == DB_ERROR && res->sqlstate && strcmp(res->sqlstate, "55P03") == 0) {
        /* the tenant's lock is held elsewhere: wait for it on the lane, and send its next
         * writes there directly for a while */
        metrics_write_lock(METRICS_LOCK_PROBE_TIMEOUT);
        lane_tenant *lt = lane_of(j->r->w, j->tenant, true);
        if (lt)
            lt->blocked_until = now_mono_ms() + (uint64_t)j->r->srv->cfg.write_lock_wait_ms;
        lane_enqueue(j);
        return;
    }
    lane_finish(j, res);
}

/* A tenant's write: see above. */
static void write_submit(req *r, int64_t rls_tenant, const db_query *qs, int nq,
                         void (*cb)(req *r, const db_result *res))
{
    lane_job *j = lane_job_new(r, rls_tenant, qs, nq, cb);
    if (!j) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    if (req_tenant_blocked(r)) {
        lane_enqueue(j);
        return;
    }
    db_opts o = {.rls_tenant = rls_tenant,
                 .lock_timeout_ms = (unsigned)r->srv->cfg.write_lock_probe_ms};
    int rc = db_submit_opts(req_db(r), &o, j->qs, j->nq, probe_done, j);
    if (rc < 0) {
        lane_job_free(j);
        if (rc == -EAGAIN)
            req_fail(r, RPC_UNAVAILABLE, "database queue full, retry later");
        else if (rc == -ENOMEM)
            req_fail(r, RPC_INTERNAL, "out of memory");
        else
            req_fail(r, RPC_UNAVAILABLE, "database unavailable (shutting down)");
    }
}

static int lane_free_one(uint64_t key, uint64_t value, void *ctx)
{
    free((lane_tenant *)(uintptr_t)value);
    return 0;
}

void req_lanes_fini(idmap *lanes)
{
    if (!lanes)
        return;
    /* the pools are destroyed: every job ended; what is left is blocked tenants' marks */
    idmap_foreach(lanes, lane_free_one, NULL);
    idmap_clear(lanes);
}

void req_submit(req *r, int64_t rls_tenant, const db_query *qs, int nq,
                void (*cb)(req *r, const db_result *res))
{
    if (rls_tenant >= 0 && r->m && (r->m->flags & M_WRITE)) {
        write_submit(r, rls_tenant, qs, nq, cb);
        return;
    }
    submit_ctx *sc = malloc(sizeof(*sc));
    if (!sc) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    sc->r = r;
    sc->cb = cb;
    int rc = db_submit(req_db(r), rls_tenant, qs, nq, on_job, sc);
    if (rc < 0) {
        free(sc);
        if (rc == -EAGAIN)
            req_fail(r, RPC_UNAVAILABLE, "database queue full, retry later");
        else if (rc == -ENOMEM)
            req_fail(r, RPC_INTERNAL, "out of memory");
        else
            req_fail(r, RPC_UNAVAILABLE, "database unavailable (shutting down)");
    }
}

/* A read sent to a standby, with a copy of its queries for a second try on the primary
 * (db_submit copies parameters, but the callers' arrays do not outlive the call). */
typedef struct read_ctx {
    req *r;
    void (*cb)(req *r, const db_result *res);
    uint64_t floor;
    int nq;
    db_query qs[DB_MAX_QUERIES];
    char *blob; /* the copied value pointers, lengths, formats and bytes */
} read_ctx;

static void read_ctx_free(read_ctx *rc)
{
    if (rc) {
        free(rc->blob);
        free(rc);
    }
}

/* Copies qs into a new read_ctx. Returns NULL when out of memory. */
static read_ctx *read_ctx_copy(const db_query *qs, int nq)
{
    read_ctx *rc = calloc(1, sizeof(*rc));
    if (!rc || db_query_copy(qs, nq, rc->qs, &rc->blob) < 0) {
        free(rc);
        return NULL;
    }
    rc->nq = nq;
    return rc;
}

static void on_read_job(void *arg, const db_result *res)
{
    read_ctx *rc = arg;
    req *r = rc->r;
    metrics_read_fallback why = METRICS_FALLBACK_UNAVAILABLE;
    if (res->status == DB_OK && res->nres == rc->nq + 1) {
        const PGresult *fr = res->res[0];
        int64_t seq = -1;
        if (PQntuples(fr) == 1 && !memrow_parse_i64(PQgetvalue(fr, 0, 0), &seq))
            seq = -1;
        if (seq >= 0 && (uint64_t)seq >= rc->floor) {
            metrics_db_read(METRICS_READ_STANDBY);
            db_result shifted = *res;
            shifted.res = res->res + 1;
            shifted.nres = res->nres - 1;
            void (*cb)(req *, const db_result *) = rc->cb;
            read_ctx_free(rc);
            cb(r, &shifted);
            return;
        }
        why = METRICS_FALLBACK_BEHIND;
        log_debug("%s: standby at change %lld of tenant %lld, %llu needed: reading the primary",
                  req_method(r), (long long)seq, (long long)r->auth.tenant_id,
                  (unsigned long long)rc->floor);
    } else if (res->status != DB_OK) {
        log_debug("%s: standby read failed (%s): reading the primary", req_method(r),
                  res->message ? res->message : "?");
    }
    metrics_db_read_fallback(why);
    metrics_db_read(METRICS_READ_PRIMARY);
    req_submit(r, r->auth.tenant_id, rc->qs, rc->nq, rc->cb);
    read_ctx_free(rc);
}

void req_submit_read(req *r, const db_query *qs, int nq, void (*cb)(req *r, const db_result *res))
{
    db_pool *rdb = worker_read_db(r->w);
    if (!rdb || nq < 1 || nq >= DB_MAX_QUERIES) {
        if (rdb)
            metrics_db_read(METRICS_READ_PRIMARY);
        req_submit(r, r->auth.tenant_id, qs, nq, cb);
        return;
    }
    db_pool_stats ps;
    db_pool_get_stats(rdb, &ps);
    read_ctx *rc = NULL;
    if (ps.ready == 0 || ps.stalled || !(rc = read_ctx_copy(qs, nq))) {
        /* no standby to ask (or no memory for the copy): do not wait for one */
        metrics_db_read_fallback(METRICS_FALLBACK_UNAVAILABLE);
        metrics_db_read(METRICS_READ_PRIMARY);
        req_submit(r, r->auth.tenant_id, qs, nq, cb);
        return;
    }
    rc->r = r;
    rc->cb = cb;
    rc->floor =
        r->srv->hooks->read_floor ? r->srv->hooks->read_floor(r->srv, r->auth.tenant_id) : 0;
    char tid[24];
    snprintf(tid, sizeof(tid), "%lld", (long long)r->auth.tenant_id);
    const char *fv[] = {tid};
    db_query all[DB_MAX_QUERIES];
    all[0] = (db_query){.stmt = sql_def(SQL_READ_FLOOR), DB_VALUES(fv)};
    for (int i = 0; i < nq; i++)
        all[i + 1] = rc->qs[i];
    int rcode = db_submit(rdb, r->auth.tenant_id, all, nq + 1, on_read_job, rc);
    if (rcode < 0) {
        metrics_db_read_fallback(METRICS_FALLBACK_UNAVAILABLE);
        metrics_db_read(METRICS_READ_PRIMARY);
        req_submit(r, r->auth.tenant_id, rc->qs, rc->nq, cb);
        read_ctx_free(rc);
    }
}

void req_set_next(req *r, void (*next)(req *r))
{
    r->next = next;
}

void req_continue(req *r)
{
    void (*next)(req * r) = r->next;
    r->next = NULL;
    next(r);
}

/* A new request of c for a copy of the message msg (len bytes, `values` values), charged
 * `charged` bytes. NULL when out of memory (the charge is given back). */
static req *req_new(conn *c, const uint8_t *msg, size_t len, size_t values, size_t charged)
{
    req *r = calloc(1, sizeof(*r));
    uint8_t *copy = malloc(len ? len : 1);
    if (!r || !copy) {
        free(r);
        free(copy);
        conn_uncharge(c, charged);
        return NULL;
    }
    memcpy(copy, msg, len);
    r->t0_ns = server_mono_ns();
    r->c = c;
    r->w = conn_worker(c);
    r->srv = worker_server(r->w);
    r->midx = SIZE_MAX;
    r->auth = *conn_get_auth(c);
    r->charged = charged;
    r->msg = copy;
    r->msg_len = len;
    r->msg_values = values;
    msgpack_packer_init(&r->pk, r, out_write);
    msgpack_zone_init(&r->zone, 2048);
    conn_ref(c);
    worker_req_started(r->w);
    return r;
}

static int dispatch(req *r);

int req_dispatch(conn *c, const uint8_t *msg, size_t len, size_t values, size_t charged)
{
    req *r = req_new(c, msg, len, values, charged);
    if (!r) {
        conn_request_finished(c);
        return -ENOMEM;
    }
    return dispatch(r);
}

/* Messages at least this large, or of this many values, are decoded and bound off the
 * worker's loop (offload.h): a million-value message took tens of milliseconds, and every
 * other client of the worker waited that long. */
#define DECODE_OFF_BYTES (256 * 1024)
#define DECODE_OFF_VALUES 65536

/* What decoding and binding a message found (decode_step), for the worker (dispatch_rest). */
typedef struct decoded {
    int rc; /* rpc_decode_request's */
    bool msgid_known;
    rpc_request rq;
    const method_def *m; /* NULL: unknown method */
    size_t idx;
    int bind_rc;
    char err[256]; /* the decoder's or the binder's message */
} decoded;

/* Decodes r's message, finds its method and binds its parameters into r->args: pure work on
 * r's own memory (message, zone), so it may run on any thread while the worker leaves r
 * alone. */
static void decode_step(req *r, decoded *d)
{
    memset(d, 0, sizeof(*d));
    d->rc = rpc_decode_request(r->msg, r->msg_len, &r->zone, &d->rq, &d->msgid_known, d->err,
                               sizeof(d->err));
    if (d->rc != 0)
        return;
    const net_hooks *h = r->srv->hooks;
    d->m = hooks_method_find(h->methods, h->nmethods, d->rq.method, d->rq.method_len, &d->idx);
    if (d->m)
        d->bind_rc = rpc_bind_params(d->rq.params, d->m->params, d->m->nparams, r->args, d->err,
                                     sizeof(d->err));
    if (d->m && d->bind_rc == 0)
        d->bind_rc = hooks_check_enums(d->m, r->args, d->err, sizeof(d->err));
}

/* Checks and runs r once decode_step has filled d (see req_dispatch); on the worker. */
static int dispatch_rest(req *r, decoded *d)
{
    conn *c = r->c;
    if (d->rc != 0) {
        if (d->msgid_known) {
            r->msgid = d->rq.msgid;
            req_fail(r, RPC_MALFORMED_REQUEST, "%s", d->err);
        } else {
            r->notify = true; /* nothing can be answered */
            req_end(r, RPC_MALFORMED_REQUEST);
        }
        return -EBADMSG;
    }
    rpc_request rq = d->rq;
    r->msgid = rq.msgid;
    r->notify = rq.kind == RPC_KIND_NOTIFY;
    const method_def *m = d->m;
    if (!m) {
        req_fail(r, RPC_UNKNOWN_METHOD, "unknown method '%.*s'",
                 (int)(rq.method_len > 64 ? 64 : rq.method_len), rq.method);
        return 0;
    }
    r->m = m;
    r->midx = d->idx;
    r->force = (m->flags & (M_WRITE | M_AUTH)) != 0;
    if (m->flags & M_AUTH) {
        r->barrier = true;
        conn_hold(c);
    }
    if (!(m->flags & M_PUBLIC) && !r->auth.authenticated) {
        req_fail(r, RPC_UNAUTHENTICATED, "not authenticated: call auth with an API key first");
        return 0;
    }
    if ((m->flags & M_ADMIN) && !r->auth.admin) {
        req_fail(r, RPC_PERMISSION_DENIED, "%s needs an admin connection", m->name);
        return 0;
    }
    if ((m->flags & M_TENANT) && r->auth.admin) {
        req_fail(r, RPC_PERMISSION_DENIED,
                 "%s needs a tenant connection; the admin key has no tenant", m->name);
        return 0;
    }
    const net_hooks *h = r->srv->hooks;
    if (!(m->flags & M_PUBLIC) && r->auth.authenticated && !r->auth.admin && h->tenant_admit) {
        uint64_t retry_ms = 0;
        hook_admit ha =
            h->tenant_admit(r->srv, r->auth.key_id, r->auth.tenant_id, &r->auth.tier, &retry_ms);
        /* a key revoked (or a tenant deleted) after this connection authenticated */
        if (ha == HOOK_ADMIT_REVOKED) {
            conn_auth none = {0};
            req_set_auth(r, &none);
            req_fail(r, RPC_UNAUTHENTICATED, "the API key was revoked or its tenant deleted");
            return 0;
        }
        if (ha == HOOK_ADMIT_RATE_LIMITED) {
            rpc_detail dd[1] = {{"retry_after_ms", RPC_D_UINT, {.u = retry_ms}}};
            req_fail_details(r, RPC_RATE_LIMITED, dd, 1,
                             "request rate of the %s tier exceeded; retry in %llu ms",
                             tier_name(r->auth.tier), (unsigned long long)retry_ms);
            return 0;
        }
        /* the request's copy only: every request of the connection asks again (a lookup) */
        if (h->tenant_embedding)
            h->tenant_embedding(r->srv, r->auth.tenant_id, &r->auth.embed_gen, &r->auth.dim,
                                r->auth.provider);
    }
    if (d->bind_rc != 0) {
        if (m->flags & M_AUTH) /* one answer whatever is wrong with a key: it reveals nothing */
            req_fail(r, RPC_UNAUTHENTICATED, "invalid API key");
        else
            req_fail(r, RPC_INVALID_ARGUMENT, "%s", d->err);
        return 0;
    }
    admit_and_run(r, 0);
    return 0;
}

/* A large message's decode, off the loop: the request and where it stands. */
typedef struct offdecode {
    req *r;
    decoded d;
} offdecode;

static void off_work(void *arg)
{
    offdecode *o = arg;
    decode_step(o->r, &o->d);
}

static void off_done(void *arg)
{
    offdecode *o = arg;
    req *r = o->r;
    conn *c = r->c;
    conn_ref(c);
    if (dispatch_rest(r, &o->d) < 0)
        conn_close_after_flush(c); /* malformed: as conn.c does for a message it dispatched */
    free(o);
    /* the connection held its later messages while this one was decoded (an auth among
     * them must run as the identity before it); it goes on, unless an auth holds it now */
    conn_release_decode(c);
    conn_unref(c);
}

/* Decodes, checks and runs r (see req_dispatch). */
static int dispatch(req *r)
{
    offload *off = r->srv->offload;
    if (off && (r->msg_len >= DECODE_OFF_BYTES || r->msg_values >= DECODE_OFF_VALUES)) {
        offdecode *o = malloc(sizeof(*o));
        if (o) {
            o->r = r;
            conn_hold_decode(r->c);
            if (offload_run(off, r->w, off_work, off_done, o) == 0) {
                metrics_decoded_off_loop();
                return 0;
            }
            conn_release_decode(r->c);
            free(o);
        }
    }
    decoded d;
    decode_step(r, &d);
    return dispatch_rest(r, &d);
}
