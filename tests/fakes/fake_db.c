/* tests/fakes/fake_db.c: storage/db.h's pool answered by the test (see fake_db.h). */
#include "fake_db.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

typedef struct fjob {
    struct fjob *next;
    fake_db_job j;
    char *blob; /* the parameters' copies (db_query_copy) */
    db_cb cb;
    void *arg;
} fjob;

struct db_pool {
    struct event_base *base;
    struct event *ev; /* answers what is queued */
    unsigned connections;
    size_t max_queue;
    fjob *head, *tail;
    size_t nqueued;
    uint64_t failures;
    bool hold;     /* fake_db_hold_pool */
    db_pool *next; /* every live pool, for fake_db_hold(false) */
};

static struct {
    fake_db_answer_fn fn;
    void *ud;
    bool hold;
    int submit_rc;
    bool not_ready;
    uint64_t submitted, answered, seq;
    db_pool *pools;
} fk;

static void kick(db_pool *p)
{
    if (p->head && !fk.hold && !p->hold)
        event_active(p->ev, EV_READ, 0);
}

/* Runs j's callback with status st (and msg), or with an answer from the answerer. */
static void answer(db_pool *p, fjob *f, bool shutting_down)
{
    fake_db_answer a;
    memset(&a, 0, sizeof(a));
    if (shutting_down) {
        a.status = DB_UNAVAILABLE;
        a.message = "shutting down";
    } else if (fk.fn) {
        fk.fn(fk.ud, &f->j, &a);
    }
    PGresult *res[DB_MAX_QUERIES] = {0};
    db_result r = {
        .status = a.status, .sqlstate = a.sqlstate, .message = a.message, .detail = a.detail};
    if (a.status == DB_OK) {
        for (int i = 0; i < f->j.nq; i++)
            res[i] = a.res[i] ? a.res[i] : PQmakeEmptyPGresult(NULL, PGRES_COMMAND_OK);
        r.res = res;
        r.nres = f->j.nq;
    } else {
        for (int i = 0; i < f->j.nq; i++)
            PQclear(a.res[i]);
        if (a.status == DB_ERROR && !r.sqlstate)
            r.sqlstate = "XX000";
        if (!r.message)
            r.message = a.status == DB_ERROR ? "fake error" : "fake database unavailable";
        if (a.status == DB_UNAVAILABLE)
            p->failures++;
    }
    fk.answered++;
    f->cb(f->arg, &r);
    for (int i = 0; i < f->j.nq; i++)
        PQclear(res[i]);
    free(f->blob);
    free(f);
}

static fjob *pop(db_pool *p)
{
    fjob *f = p->head;
    if (f) {
        p->head = f->next;
        if (!p->head)
            p->tail = NULL;
        p->nqueued--;
    }
    return f;
}

/* Answers the jobs queued when it began, in order; a job submitted by a callback waits for
 * the loop's next turn, as a real answer would. */
static void on_answer(evutil_socket_t fd, short what, void *arg)
{
    db_pool *p = arg;
    for (size_t n = p->nqueued; n > 0 && !fk.hold && !p->hold; n--)
        answer(p, pop(p), false);
    kick(p);
}

db_pool *db_pool_create(struct event_base *base, const db_config *cfg)
{
    if (!base || !cfg || !cfg->dsn || cfg->connections == 0 || cfg->max_inflight == 0)
        return NULL;
    db_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->base = base;
    p->connections = cfg->connections;
    p->max_queue = cfg->max_queue ? cfg->max_queue : 100000;
    p->ev = event_new(base, -1, 0, on_answer, p);
    if (!p->ev) {
        free(p);
        return NULL;
    }
    p->next = fk.pools;
    fk.pools = p;
    return p;
}

void db_pool_destroy(db_pool *p)
{
    if (!p)
        return;
    for (db_pool **pp = &fk.pools; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    fjob *f;
    while ((f = pop(p)) != NULL)
        answer(p, f, true);
    event_free(p->ev);
    free(p);
}

int db_submit(db_pool *p, int64_t rls_tenant, const db_query *qs, int nq, db_cb cb, void *arg)
{
    db_opts o = {.rls_tenant = rls_tenant};
    return db_submit_opts(p, &o, qs, nq, cb, arg);
}

int db_submit_opts(db_pool *p, const db_opts *o, const db_query *qs, int nq, db_cb cb, void *arg)
{
    /* the real pool's checks: a test must not pass what engramd would refuse */
    if (!p || !qs || nq < 1 || nq > DB_MAX_QUERIES)
        return -EINVAL;
    for (int i = 0; i < nq; i++) {
        const db_stmt_def *st = qs[i].stmt;
        if (!st || st->nparams < 0 || st->nparams > DB_MAX_PARAMS ||
            qs[i].nvalues != (size_t)st->nparams || (st->nparams > 0 && !qs[i].values))
            return -EINVAL;
        for (int k = 0; k < st->nparams; k++)
            if (qs[i].formats && qs[i].formats[k] == 1 && qs[i].values[k] &&
                (!qs[i].lengths || qs[i].lengths[k] < 0))
                return -EINVAL;
    }
    if (fk.submit_rc)
        return fk.submit_rc;
    if (p->nqueued >= p->max_queue)
        return -EAGAIN;
    fjob *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    if (db_query_copy(qs, nq, f->j.q, &f->blob) < 0) {
        free(f);
        return -ENOMEM;
    }
    f->j.pool = p;
    f->j.rls_tenant = o->rls_tenant;
    f->j.lock_timeout_ms = o->lock_timeout_ms;
    f->j.nq = nq;
    f->j.seq = ++fk.seq;
    f->cb = cb;
    f->arg = arg;
    if (p->tail)
        p->tail->next = f;
    else
        p->head = f;
    p->tail = f;
    p->nqueued++;
    fk.submitted++;
    kick(p);
    return 0;
}

void db_pool_get_stats(db_pool *p, db_pool_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->connections = p->connections;
    st->ready = fk.not_ready ? 0 : p->connections;
    st->queued = p->nqueued;
    st->failures = p->failures;
}

bool db_pool_idle(db_pool *p)
{
    return p->nqueued == 0;
}

bool db_is_own_backend(int pid)
{
    return false;
}

/* ---- the test's controls --------------------------------------------------------------- */

void fake_db_set_answer(fake_db_answer_fn fn, void *ud)
{
    fk.fn = fn;
    fk.ud = ud;
}

void fake_db_hold(bool hold)
{
    fk.hold = hold;
    for (db_pool *p = fk.pools; p; p = p->next)
        kick(p);
}

void fake_db_hold_pool(db_pool *p, bool hold)
{
    p->hold = hold;
    kick(p);
}

void fake_db_set_submit_error(int rc)
{
    fk.submit_rc = rc;
}

void fake_db_set_ready(bool ready)
{
    fk.not_ready = !ready;
}

size_t fake_db_waiting(void)
{
    size_t n = 0;
    for (db_pool *p = fk.pools; p; p = p->next)
        n += p->nqueued;
    return n;
}

uint64_t fake_db_submitted(void)
{
    return fk.submitted;
}

uint64_t fake_db_answered(void)
{
    return fk.answered;
}

void fake_db_reset(void)
{
    fk.fn = NULL;
    fk.ud = NULL;
    fk.submit_rc = 0;
    fk.not_ready = false;
    fk.submitted = fk.answered = 0;
    fake_db_hold(false);
}
