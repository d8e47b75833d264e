/* tests/fakes/fake_req.c: the handlers' network layer and the storage pool, faked (see
 * fake_req.h). */
#include "fake_req.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "json.h"
#include "methods.h"
#include "pgres.h"
#include "pgsync.h"
#include "plimits.h"
#include "bg.h"
#include "rowcache.h"
#include "sql.h"
#include "tenancy.h"
#include "tenants.h"
#include "tenants_int.h"
#include "tiers.h"

static void die(const char *what)
{
    fprintf(stderr, "fake_req: %s\n", what);
    abort();
}

/* ---- the pool and its jobs ------------------------------------------------------------- */

struct db_pool {
    int id;
};

static fr_job *jobs_head, *jobs_tail;
static size_t njobs;
static int fail_next;

size_t fr_jobs(void)
{
    return njobs;
}

fr_job *fr_take(void)
{
    fr_job *j = jobs_head;
    if (!j)
        return NULL;
    jobs_head = j->next;
    if (!jobs_head)
        jobs_tail = NULL;
    njobs--;
    j->next = NULL;
    return j;
}

void fr_job_free(fr_job *j)
{
    if (!j)
        return;
    for (int q = 0; q < j->nq; q++)
        for (size_t i = 0; i < j->q[q].nvalues; i++)
            free(j->q[q].values[i]);
    free(j);
}

void fr_clear_jobs(void)
{
    fr_job *j;
    while ((j = fr_take()))
        fr_job_free(j);
}

void fr_submit_fail(int n)
{
    fail_next = n;
}

const char *fr_val(const fr_job *j, int q, size_t i)
{
    if (!j || q < 0 || q >= j->nq || i >= j->q[q].nvalues)
        return NULL;
    return j->q[q].values[i];
}

/* Copies the nq queries qs into a new job (db_submit copies parameters: the callers' arrays
 * do not outlive the call). Checks what the real pool checks: a statement and as many
 * values as it takes. Returns NULL for a job the pool would refuse (-EINVAL). */
static fr_job *job_new(int kind, const db_query *qs, int nq)
{
    if (nq < 1 || nq > DB_MAX_QUERIES)
        return NULL;
    fr_job *j = calloc(1, sizeof(*j));
    if (!j)
        die("out of memory");
    j->kind = kind;
    j->nq = nq;
    for (int q = 0; q < nq; q++) {
        const db_query *s = &qs[q];
        if (!s->stmt || s->nvalues != (size_t)s->stmt->nparams || s->nvalues > DB_MAX_PARAMS) {
            fprintf(stderr, "fake_req: statement %s given %zu values, takes %d\n",
                    s->stmt ? s->stmt->name : "?", s->nvalues, s->stmt ? s->stmt->nparams : -1);
            j->nq = q;
            fr_job_free(j);
            return NULL;
        }
        j->q[q].name = s->stmt->name;
        j->q[q].nvalues = s->nvalues;
        for (size_t i = 0; i < s->nvalues; i++) {
            const char *v = s->values ? s->values[i] : NULL;
            int fmt = s->formats ? s->formats[i] : 0;
            j->q[q].formats[i] = fmt;
            if (!v)
                continue;
            size_t n = fmt == 1 && s->lengths ? (size_t)s->lengths[i] : strlen(v);
            char *c = malloc(n + 1);
            if (!c)
                die("out of memory");
            memcpy(c, v, n);
            c[n] = '\0';
            j->q[q].values[i] = c;
            j->q[q].lengths[i] = (int)n;
        }
    }
    return j;
}

static void job_push(fr_job *j)
{
    if (jobs_tail)
        jobs_tail->next = j;
    else
        jobs_head = j;
    jobs_tail = j;
    njobs++;
}

static void job_run(fr_job *j, const db_result *res)
{
    if (j->rcb)
        j->rcb(j->r, res);
    else if (j->pcb)
        j->pcb(j->arg, res);
}

void fr_answer(fr_job *j, PGresult **res, int nres)
{
    db_result r = {.status = DB_OK, .res = res, .nres = nres};
    job_run(j, &r);
    for (int i = 0; i < nres; i++)
        PQclear(res[i]);
    fr_job_free(j);
}

void fr_answer1(fr_job *j, PGresult *res)
{
    PGresult *one[1] = {res};
    fr_answer(j, one, 1);
}

void fr_answer_error(fr_job *j, const char *sqlstate, const char *message, const char *detail)
{
    db_result r = {.status = DB_ERROR, .sqlstate = sqlstate, .message = message, .detail = detail};
    job_run(j, &r);
    fr_job_free(j);
}

void fr_answer_unavailable(fr_job *j, const char *message)
{
    db_result r = {.status = DB_UNAVAILABLE, .message = message};
    job_run(j, &r);
    fr_job_free(j);
}

/* storage/db.h, all of it: the archive's db.o must never be pulled in next to these. */

int db_submit_opts(db_pool *p, const db_opts *o, const db_query *qs, int nq, db_cb cb, void *arg)
{
    if (!p || !cb)
        return -EINVAL;
    if (fail_next > 0) {
        fail_next--;
        return -EAGAIN;
    }
    fr_job *j = job_new(FR_POOL, qs, nq);
    if (!j)
        return -EINVAL;
    j->pool = p;
    j->rls = o ? o->rls_tenant : -1;
    j->lock_timeout_ms = o ? o->lock_timeout_ms : 0;
    j->pcb = cb;
    j->arg = arg;
    job_push(j);
    return 0;
}

int db_submit(db_pool *p, int64_t rls_tenant, const db_query *qs, int nq, db_cb cb, void *arg)
{
    db_opts o = {.rls_tenant = rls_tenant};
    return db_submit_opts(p, &o, qs, nq, cb, arg);
}

db_pool *db_pool_create(struct event_base *base, const db_config *cfg)
{
    (void)base;
    (void)cfg;
    return calloc(1, sizeof(db_pool));
}

void db_pool_destroy(db_pool *p)
{
    free(p);
}

int db_query_copy(const db_query *qs, int nq, db_query *out, char **blob)
{
    (void)qs;
    (void)nq;
    (void)out;
    *blob = NULL;
    return -ENOMEM; /* nothing here copies queries (req.c's standby reads are not linked) */
}

void db_pool_get_stats(db_pool *p, db_pool_stats *st)
{
    (void)p;
    memset(st, 0, sizeof(*st));
}

bool db_pool_idle(db_pool *p)
{
    (void)p;
    return njobs == 0;
}

/* storage/pgsync.h: the blocking calls of the background threads and the loaders, all
 * defined here so that pgsync.o (a real connection) is never linked: every one fails as a
 * server without its database would. */

PGconn *pgsync_connect(const char *dsn, const char *role, unsigned timeout_ms, char *err,
                       size_t errlen)
{
    (void)dsn;
    (void)role;
    (void)timeout_ms;
    snprintf(err, errlen, "no database in this test");
    return NULL;
}

PGconn *pgsync_connect_at(const char *dsn, const char *host, const char *port, const char *role,
                          unsigned timeout_ms, char *err, size_t errlen)
{
    (void)host;
    (void)port;
    return pgsync_connect(dsn, role, timeout_ms, err, errlen);
}

PGresult *pgsync_exec(PGconn *c, const char *sql, int nparams, const char *const *values, char *err,
                      size_t errlen)
{
    (void)c;
    (void)sql;
    (void)nparams;
    (void)values;
    snprintf(err, errlen, "no database in this test");
    return NULL;
}

PGresult *pgsync_exec_stmt(PGconn *c, const db_stmt_def *s, const char *const *values,
                           size_t nvalues, char *err, size_t errlen)
{
    (void)c;
    (void)s;
    (void)values;
    (void)nvalues;
    snprintf(err, errlen, "no database in this test");
    return NULL;
}

int pgsync_script(PGconn *c, const char *sql, char *err, size_t errlen)
{
    (void)c;
    (void)sql;
    snprintf(err, errlen, "no database in this test");
    return -EIO;
}

int pgsync_tenant_begin(PGconn *c, int64_t tenant_id, pgsync_tx_mode mode, char *err, size_t errlen)
{
    (void)c;
    (void)tenant_id;
    (void)mode;
    snprintf(err, errlen, "no database in this test");
    return -EIO;
}

int pgsync_tx_end(PGconn *c, bool commit, char *err, size_t errlen)
{
    (void)c;
    (void)commit;
    if (err && errlen)
        snprintf(err, errlen, "no database in this test");
    return -EIO;
}

PGresult *pgsync_tenant_exec(PGconn *c, int64_t tenant_id, pgsync_tx_mode mode,
                             const db_stmt_def *s, const char *const *values, size_t nvalues,
                             char *err, size_t errlen)
{
    (void)c;
    (void)tenant_id;
    (void)mode;
    (void)s;
    (void)values;
    (void)nvalues;
    snprintf(err, errlen, "no database in this test");
    return NULL;
}

bool db_is_own_backend(int pid)
{
    (void)pid;
    return false;
}

/* ---- the worker ------------------------------------------------------------------------- */

struct worker {
    server *srv;
    struct event_base *base;
    db_pool *db, *lane, *read;
    void *app;
};

typedef struct post {
    struct post *next;
    void (*fn)(void *arg);
    void *arg;
} post;

static pthread_mutex_t posts_mu = PTHREAD_MUTEX_INITIALIZER;
static post *posts_head, *posts_tail;
static int64_t blocked_tenant = -1;
static int blocked_marks;

worker *fr_worker_create(server *s, bool read)
{
    worker *w = calloc(1, sizeof(*w));
    if (!w)
        die("out of memory");
    w->srv = s;
    w->base = event_base_new();
    w->db = db_pool_create(w->base, NULL);
    w->lane = db_pool_create(w->base, NULL);
    w->read = read ? db_pool_create(w->base, NULL) : NULL;
    if (!w->base || !w->db || !w->lane || (read && !w->read))
        die("cannot create the worker");
    return w;
}

void fr_worker_destroy(worker *w)
{
    if (!w)
        return;
    db_pool_destroy(w->db);
    db_pool_destroy(w->lane);
    db_pool_destroy(w->read);
    event_base_free(w->base);
    free(w);
}

int worker_post(worker *w, void (*fn)(void *arg), void *arg)
{
    (void)w;
    post *p = malloc(sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->fn = fn;
    p->arg = arg;
    p->next = NULL;
    pthread_mutex_lock(&posts_mu);
    if (posts_tail)
        posts_tail->next = p;
    else
        posts_head = p;
    posts_tail = p;
    pthread_mutex_unlock(&posts_mu);
    return 0;
}

static int post_to(void *target, void (*fn)(void *arg), void *arg)
{
    return worker_post(target, fn, arg);
}

server_poster worker_poster(worker *w)
{
    return (server_poster){.post = post_to, .target = w};
}

size_t fr_run_posts(void)
{
    size_t n = 0;
    for (;;) {
        pthread_mutex_lock(&posts_mu);
        post *p = posts_head;
        if (p) {
            posts_head = p->next;
            if (!posts_head)
                posts_tail = NULL;
        }
        pthread_mutex_unlock(&posts_mu);
        if (!p)
            return n;
        p->fn(p->arg);
        free(p);
        n++;
    }
}

struct event_base *worker_base(worker *w)
{
    return w->base;
}

db_pool *worker_db(worker *w)
{
    return w->db;
}

db_pool *worker_lane_db(worker *w)
{
    return w->lane;
}

db_pool *worker_read_db(worker *w)
{
    return w->read;
}

server *worker_server(worker *w)
{
    return w->srv;
}

unsigned worker_index(worker *w)
{
    (void)w;
    return 0;
}

void *worker_app(worker *w)
{
    return w->app;
}

void worker_set_app(worker *w, void *app)
{
    w->app = app;
}

void fr_set_blocked(int64_t tenant_id)
{
    blocked_tenant = tenant_id;
}

int fr_blocked_marks(void)
{
    return blocked_marks;
}

/* ---- the request: net/req.h ------------------------------------------------------------- */

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

bool req_tls_client_cert(req *r)
{
    return r->tls_client_cert;
}

const msgpack_object *req_arg(req *r, size_t i)
{
    return i < METHOD_MAX_PARAMS ? r->args[i] : NULL;
}

void req_set_auth(req *r, const conn_auth *a)
{
    r->auth = *a;
    r->auth.claimed = false;
    r->new_auth = *a;
    r->set_auth++;
}

void *req_alloc(req *r, size_t n)
{
    return arena_alloc(&r->mem, n);
}

arena *req_arena(req *r)
{
    return &r->mem;
}

int req_on_free(req *r, void (*fn)(void *arg), void *arg)
{
    fr_cleanup *c = req_alloc(r, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->fn = fn;
    c->arg = arg;
    c->next = r->cleanups;
    r->cleanups = c;
    return 0;
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

void *req_state(req *r)
{
    return r->state;
}

void req_set_state(req *r, void *st)
{
    r->state = st;
}

void req_close_after(req *r)
{
    r->close_after = true;
}

bool req_is_again(req *r)
{
    return r->again;
}

msgpack_packer *req_result(req *r)
{
    msgpack_sbuffer_clear(&r->out);
    return &r->pk;
}

/* Decodes what was packed into out (one object) and renders it as JSON. */
static void decode_out(req *r, bool error)
{
    msgpack_unpacked_destroy(&r->out_u);
    msgpack_unpacked_init(&r->out_u);
    size_t off = 0;
    if (msgpack_unpack_next(&r->out_u, r->out.data, r->out.size, &off) != MSGPACK_UNPACK_SUCCESS ||
        off != r->out.size) {
        fprintf(stderr, "fake_req: %s packed %zu bytes that are not one object\n", req_method(r),
                r->out.size);
        r->result = r->error = NULL;
        return;
    }
    const msgpack_object *o = &r->out_u.data;
    if (error) /* [1, msgid, error, nil] */
        o = o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 4 ? &o->via.array.ptr[2] : NULL;
    if (error)
        r->error = o;
    else
        r->result = o;
    free(r->json);
    r->json = NULL;
    json_buf jb = {0};
    if (o && json_from_msgpack(o, JSON_BIN_BASE64, 64, &jb) == 0) {
        r->json = malloc(jb.len + 1);
        if (r->json)
            memcpy(r->json, jb.data, jb.len + 1);
    }
    json_buf_fini(&jb);
}

void req_done(req *r)
{
    r->ends++;
    r->done = true;
    r->code = RPC_OK;
    decode_out(r, false);
}

static void fail_v(req *r, rpc_code code, const rpc_detail *d, size_t nd, const char *fmt,
                   va_list ap)
{
    r->ends++;
    r->done = false;
    r->code = code;
    vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
    /* invalid_argument names the parameter in data.field too, as req.c does */
    rpc_detail all[9];
    char field[160];
    bool has_field = false;
    for (size_t i = 0; i < nd; i++)
        has_field = has_field || strcmp(d[i].key, "field") == 0;
    if (code == RPC_INVALID_ARGUMENT && !has_field && nd < 8 &&
        rpc_message_field(r->msg, field, sizeof(field))) {
        for (size_t i = 0; i < nd; i++)
            all[i] = d[i];
        all[nd] = (rpc_detail){"field", RPC_D_STR, {.s = field}};
        d = all;
        nd++;
    }
    msgpack_sbuffer_clear(&r->out);
    rpc_pack_error(&r->pk, 1, code, r->msg, d, nd);
    decode_out(r, true);
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

void req_fail_db(req *r, const db_result *res)
{
    r->ends++;
    r->done = false;
    r->fail_db = true;
    r->code = RPC_CODE_COUNT; /* req.c maps it: not this fake's business */
    r->db_status = res->status;
    snprintf(r->db_sqlstate, sizeof(r->db_sqlstate), "%s", res->sqlstate ? res->sqlstate : "");
    snprintf(r->db_message, sizeof(r->db_message), "%s", res->message ? res->message : "");
    snprintf(r->msg, sizeof(r->msg), "%s", r->db_message);
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

/* A request's job: recorded, or refused as the pool would (the request fails then). */
static void req_job(int kind, req *r, int64_t rls, const db_query *qs, int nq,
                    void (*cb)(req *r, const db_result *res))
{
    if (fail_next > 0) {
        fail_next--;
        req_fail(r, RPC_UNAVAILABLE, "database queue full, retry later");
        return;
    }
    fr_job *j = job_new(kind, qs, nq);
    if (!j) {
        req_fail(r, RPC_INTERNAL, "fake_req: the pool refused the job (bad arguments)");
        return;
    }
    j->r = r;
    j->rls = rls;
    j->rcb = cb;
    job_push(j);
}

void req_submit(req *r, int64_t rls_tenant, const db_query *qs, int nq,
                void (*cb)(req *r, const db_result *res))
{
    req_job(FR_SUBMIT, r, rls_tenant, qs, nq, cb);
}

void req_submit_read(req *r, const db_query *qs, int nq, void (*cb)(req *r, const db_result *res))
{
    req_job(FR_READ, r, r->auth.tenant_id, qs, nq, cb);
}

void req_submit_lane(req *r, int64_t rls_tenant, const db_query *qs, int nq,
                     void (*cb)(req *r, const db_result *res))
{
    req_job(FR_LANE, r, rls_tenant, qs, nq, cb);
}

bool req_tenant_blocked(req *r)
{
    return blocked_tenant >= 0 && r->auth.tenant_id == blocked_tenant;
}

void req_tenant_mark_blocked(req *r)
{
    (void)r;
    blocked_marks++;
}

/* ---- the environment ---------------------------------------------------------------------- */

int fr_env_init(fr_env *e, void (*tweak)(config *cfg), bool with_bg)
{
    memset(e, 0, sizeof(*e));
    server *s = &e->srv;
    /* a DSN is required; nothing connects to it (db_connect_blocking is faked) */
    char *argv[] = {"engramd", "--pg-dsn", "host=/nonexistent-engram-unit-test", NULL};
    bool exit_now = false;
    FILE *devnull = fopen("/dev/null", "w");
    int rc = config_load(&s->cfg, 3, argv, devnull, stderr, &exit_now);
    if (devnull)
        fclose(devnull);
    if (rc != 0)
        return -1;
    if (tweak)
        tweak(&s->cfg);
    plimits_apply(&s->cfg);
    if (methods_check() < 0 || sql_init() < 0)
        return -1;
    rpc_limits_default(&s->limits);
    s->limits.max_message = (size_t)s->cfg.max_message_bytes;
    s->limits.max_depth = (unsigned)s->cfg.max_depth;
    s->score = (score_params){.w_recency = s->cfg.score_w_recency,
                              .w_access = s->cfg.score_w_access,
                              .w_explicit = s->cfg.score_w_explicit,
                              .recency_days = s->cfg.score_recency_days,
                              .access_saturation = s->cfg.score_access_saturation,
                              .w_usefulness = s->cfg.score_w_usefulness};
    tiers_from_config(&s->cfg, e->tiers);
    snprintf(e->memory_limits, sizeof(e->memory_limits), "{%lld,%lld,%lld,%lld,%lld,%lld}",
             (long long)e->tiers[0].max_memories, (long long)e->tiers[1].max_memories,
             (long long)e->tiers[2].max_memories, (long long)e->tiers[0].max_memory_bytes,
             (long long)e->tiers[1].max_memory_bytes, (long long)e->tiers[2].max_memory_bytes);
    snprintf(e->query_limits, sizeof(e->query_limits), "{%lld,%lld,%lld}",
             (long long)e->tiers[0].queries_per_day, (long long)e->tiers[1].queries_per_day,
             (long long)e->tiers[2].queries_per_day);
    atomic_store(&s->tiers, e->tiers);
    atomic_store(&s->memory_limits, e->memory_limits);
    atomic_store(&s->query_limits, e->query_limits);
    s->hooks = app_hooks();
    s->tenants = tenants_create(s);
    s->tenancy = tenancy_create(s);
    s->rows = rc_create((size_t)1 << 20);
    if (with_bg)
        s->bg = bg_create(s, 1);
    if (!s->tenants || !s->tenancy || !s->rows || (with_bg && !s->bg))
        return -1;
    e->w = fr_worker_create(s, false);
    if (s->hooks->worker_init(e->w) < 0)
        return -1;
    e->tenant = (conn_auth){.authenticated = true,
                            .tenant_id = 7,
                            .key_id = 70,
                            .tier = TIER_STANDARD,
                            .dim = 8,
                            .provider = "builtin",
                            .embed_gen = 3};
    return 0;
}

void fr_env_fini(fr_env *e)
{
    server *s = &e->srv;
    fr_clear_jobs();
    fr_run_posts();
    if (e->w) {
        s->hooks->worker_fini(e->w);
        fr_worker_destroy(e->w);
    }
    bg_destroy(s->bg);
    rc_destroy(s->rows);
    tenancy_destroy(s->tenancy);
    tenants_destroy(s->tenants);
    sql_fini();
    config_free(&s->cfg);
    memset(e, 0, sizeof(*e));
}

tenant *fr_index_loaded(fr_env *e, int64_t tenant_id, uint32_t dim, uint64_t applied)
{
    tenant *t = tenants_get(e->srv.tenants, tenant_id, dim);
    if (!t)
        return NULL;
    pthread_mutex_lock(&t->mu);
    if (t->state != T_READY) {
        t->engine = VINDEX_ENGINE_NATIVE;
        vindex_opts vo;
        tn_index_opts(t, &vo);
        t->vi = vindex_create(&vo);
        t->applied = applied;
        t->state = t->vi ? T_READY : T_UNLOADED;
    }
    bool ok = t->state == T_READY;
    pthread_mutex_unlock(&t->mu);
    if (!ok) {
        tenants_put(t);
        return NULL;
    }
    return t;
}

req *fr_call_as(fr_env *e, const conn_auth *a, const char *method, const char *args)
{
    req *r = calloc(1, sizeof(*r));
    if (!r)
        die("out of memory");
    r->srv = &e->srv;
    r->w = e->w;
    r->auth = *a;
    r->tls_client_cert = e->tls_client_cert;
    r->again = e->again;
    msgpack_sbuffer_init(&r->params);
    msgpack_unpacked_init(&r->params_u);
    msgpack_sbuffer_init(&r->out);
    msgpack_packer_init(&r->pk, &r->out, msgpack_sbuffer_write);
    msgpack_unpacked_init(&r->out_u);
    size_t idx;
    r->m = hooks_method_find(e->srv.hooks->methods, e->srv.hooks->nmethods, method, strlen(method),
                             &idx);
    if (!r->m) {
        fprintf(stderr, "fake_req: no method %s\n", method);
        abort();
    }
    const msgpack_object *params = NULL;
    if (args) {
        msgpack_packer pk;
        msgpack_packer_init(&pk, &r->params, msgpack_sbuffer_write);
        char err[256];
        if (json_to_msgpack(args, strlen(args), 64, &pk, err, sizeof(err)) != 0 ||
            msgpack_unpack_next(&r->params_u, r->params.data, r->params.size, NULL) !=
                MSGPACK_UNPACK_SUCCESS) {
            fprintf(stderr, "fake_req: bad test arguments %s: %s\n", args, err);
            abort();
        }
        params = &r->params_u.data;
    }
    char err[256];
    if (rpc_bind_params(params, r->m->params, r->m->nparams, r->args, err, sizeof(err)) != 0 ||
        hooks_check_enums(r->m, r->args, err, sizeof(err)) != 0) {
        /* as req.c: an auth's binding failure reveals nothing; others name the parameter */
        r->bind_failed = true;
        if (r->m->flags & M_AUTH)
            req_fail(r, RPC_UNAUTHENTICATED, "invalid API key");
        else
            req_fail(r, RPC_INVALID_ARGUMENT, "%s", err);
        return r;
    }
    r->m->fn(r);
    return r;
}

req *fr_call(fr_env *e, const char *method, const char *args)
{
    return fr_call_as(e, &e->tenant, method, args);
}

void fr_free(req *r)
{
    if (!r)
        return;
    for (fr_cleanup *c = r->cleanups; c; c = c->next)
        c->fn(c->arg);
    arena_reset(&r->mem);
    msgpack_unpacked_destroy(&r->out_u);
    msgpack_sbuffer_destroy(&r->out);
    msgpack_unpacked_destroy(&r->params_u);
    msgpack_sbuffer_destroy(&r->params);
    free(r->json);
    free(r);
}

/* ---- reading answers ---------------------------------------------------------------------- */

const msgpack_object *fr_get(const req *r, const char *key)
{
    return rpc_map_get(r->done ? r->result : r->error, key);
}

const msgpack_object *fr_path(const req *r, const char *path)
{
    const msgpack_object *o = r->done ? r->result : r->error;
    char part[128];
    while (o && *path) {
        size_t n = strcspn(path, ".");
        if (n >= sizeof(part))
            return NULL;
        memcpy(part, path, n);
        part[n] = '\0';
        path += n + (path[n] == '.');
        if (o->type == MSGPACK_OBJECT_ARRAY) {
            char *end;
            unsigned long i = strtoul(part, &end, 10);
            o = *end == '\0' && i < o->via.array.size ? &o->via.array.ptr[i] : NULL;
        } else {
            o = rpc_map_get(o, part);
        }
    }
    return o;
}

const char *fr_field(const req *r)
{
    static char buf[160];
    const msgpack_object *f = r->done ? NULL : rpc_map_get(r->error, "field");
    if (!f || f->type != MSGPACK_OBJECT_STR)
        return NULL;
    snprintf(buf, sizeof(buf), "%.*s", (int)f->via.str.size, f->via.str.ptr);
    return buf;
}

bool fr_is_str(const msgpack_object *o, const char *s)
{
    return o && o->type == MSGPACK_OBJECT_STR && rpc_str_eq(o, s);
}

bool fr_is_int(const msgpack_object *o, int64_t v)
{
    if (!o)
        return false;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return v >= 0 && o->via.u64 == (uint64_t)v;
    return o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 == v;
}

bool fr_is_nil(const msgpack_object *o)
{
    return o && o->type == MSGPACK_OBJECT_NIL;
}

bool fr_is_bool(const msgpack_object *o, bool v)
{
    return o && o->type == MSGPACK_OBJECT_BOOLEAN && o->via.boolean == v;
}

double fr_num(const msgpack_object *o)
{
    if (!o)
        return NAN;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return (double)o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return (double)o->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return o->via.f64;
    default:
        return NAN;
    }
}

long fr_len(const msgpack_object *o)
{
    if (o && o->type == MSGPACK_OBJECT_ARRAY)
        return (long)o->via.array.size;
    if (o && o->type == MSGPACK_OBJECT_MAP)
        return (long)o->via.map.size;
    return -1;
}

/* ---- results ------------------------------------------------------------------------------ */

/* Splits s at '|' into at most max pieces (copies in *store, freed by the caller); "\N" is
 * NULL. Returns the count. */
static int split(const char *s, char **store, const char **out, int max)
{
    char *c = strdup(s);
    if (!c)
        die("out of memory");
    *store = c;
    int n = 0;
    for (char *p = c;; n++) {
        if (n == max)
            die("too many cells in a test row");
        char *bar = strchr(p, '|');
        if (bar)
            *bar = '\0';
        out[n] = strcmp(p, "\\N") == 0 ? NULL : p;
        if (!bar)
            return n + 1;
        p = bar + 1;
    }
}

PGresult *fr_rows(const char *names, int nrows, ...)
{
    char *nstore;
    const char *nm[64];
    int ncols = split(names, &nstore, nm, 64);
    const char **cells = calloc((size_t)(nrows * ncols + 1), sizeof(*cells));
    char **stores = calloc((size_t)nrows + 1, sizeof(*stores));
    if (!cells || !stores)
        die("out of memory");
    va_list ap;
    va_start(ap, nrows);
    for (int i = 0; i < nrows; i++) {
        const char *row = va_arg(ap, const char *);
        if (split(row, &stores[i], cells + i * ncols, ncols) != ncols) {
            fprintf(stderr, "fake_req: row '%s' has not %d cells\n", row, ncols);
            abort();
        }
    }
    va_end(ap);
    PGresult *r = pgres_make(ncols, nm, nrows, cells);
    for (int i = 0; i < nrows; i++)
        free(stores[i]);
    free(stores);
    free(cells);
    free(nstore);
    if (!r)
        die("out of memory");
    return r;
}

void fr_memrow_cells(char buf[2048], const char *cells[22], uint64_t id, const char *type,
                     const char *scope, const char *content, double importance,
                     const char *metadata, int64_t created_ms, uint64_t seq)
{
    /* id, agent, clade, scope, type, content, importance, metadata, created, updated,
     * accessed, access_count, expires, archived, version, seq, pinned, archived_reason,
     * superseded_by, merged_into, cited, injected */
    char *p = buf;
    size_t left = 2048;
#define PUT(i, ...)                                                                                \
    do {                                                                                           \
        int w = snprintf(p, left, __VA_ARGS__);                                                    \
        cells[i] = p;                                                                              \
        p += w + 1;                                                                                \
        left -= (size_t)w + 1;                                                                     \
    } while (0)
    PUT(0, "%llu", (unsigned long long)id);
    PUT(1, "0");
    PUT(2, "0");
    PUT(3, "%s", scope);
    PUT(4, "%s", type);
    PUT(5, "%s", content);
    PUT(6, "%.17g", importance);
    PUT(7, "%s", metadata);
    PUT(8, "%lld", (long long)created_ms);
    PUT(9, "%lld", (long long)created_ms);
    cells[10] = NULL;
    PUT(11, "0");
    cells[12] = NULL;
    cells[13] = NULL;
    PUT(14, "1");
    PUT(15, "%llu", (unsigned long long)seq);
    PUT(16, "f");
    cells[17] = NULL;
    cells[18] = NULL;
    cells[19] = NULL;
    PUT(20, "0");
    PUT(21, "0");
}

void fr_meta_cells(char buf[512], const char *cells[14], uint64_t id, uint64_t seq,
                   const char *type, const char *scope, double importance, int64_t created_ms)
{
    char *p = buf;
    size_t left = 512;
    /* id, seq, agent, clade, scope, type, importance, created, accessed, access_count,
     * expires, archived, pinned, tags */
    PUT(0, "%llu", (unsigned long long)id);
    PUT(1, "%llu", (unsigned long long)seq);
    PUT(2, "0");
    PUT(3, "0");
    PUT(4, "%s", scope);
    PUT(5, "%s", type);
    PUT(6, "%.17g", importance);
    PUT(7, "%lld", (long long)created_ms);
    cells[8] = NULL;
    PUT(9, "0");
    cells[10] = NULL;
    cells[11] = NULL;
    PUT(12, "f");
    cells[13] = NULL;
#undef PUT
}
