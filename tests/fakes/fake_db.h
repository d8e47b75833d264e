/* tests/fakes/fake_db.h: storage/db.h's pool without PostgreSQL, answered by the test, for
 * unit tests and fuzzers of the code that submits database jobs (the network layer, the
 * handlers, the whole request path).
 *
 * fake_db.c defines every function of db.h except db_query_copy (storage/db_query.c, the
 * real one), so a program that compiles it in (tests/meson.build: fakes_db_dep, its sources
 * go into each program, ahead of the archives) links no storage/db.c: a worker's pools are
 * fakes, whatever its DSN. The blocking calls (storage/pgsync.h) are not faked: nothing on a
 * worker's loop may use them.
 *
 * A job is answered as the real pool answers: its callback runs exactly once, later, on the
 * pool's event loop, never inside db_submit; jobs of one pool are answered in the order
 * they were submitted. What the answer is, the test decides when the job is answered
 * (fake_db_set_answer). Jobs wait unanswered while the fake is held (fake_db_hold), as a
 * slow database's would. Single-threaded: every pool and every call on one thread.
 */
#ifndef ENGRAM_TESTS_FAKE_DB_H
#define ENGRAM_TESTS_FAKE_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "db.h"

/* One job as it is answered: the pool it went to, the options it was submitted with and its
 * statements with copies of their parameters (valid while it is answered). */
typedef struct fake_db_job {
    db_pool *pool;
    int64_t rls_tenant;       /* -1: none */
    unsigned lock_timeout_ms; /* db_submit_opts' lock_timeout; 0: none */
    int nq;
    db_query q[DB_MAX_QUERIES];
    uint64_t seq; /* the job's number, from 1, in the order of submission (all pools) */
} fake_db_job;

/* An answer. status DB_OK: res[i] is query i's result, which the fake takes (PQclear after
 * the callback); a NULL res[i] becomes an empty command result. DB_ERROR: sqlstate (5
 * characters), message and detail. DB_UNAVAILABLE: message. The strings must live until
 * the callback returns (static, or the answerer's own). */
typedef struct fake_db_answer {
    db_status status;
    const char *sqlstate;
    const char *message;
    const char *detail;
    PGresult *res[DB_MAX_QUERIES];
} fake_db_answer;

/* fake_db_answer_fn fills out (zeroed: DB_OK with empty results) for job j. */
typedef void (*fake_db_answer_fn)(void *ud, const fake_db_job *j, fake_db_answer *out);

/* fake_db_set_answer makes fn(ud, ...) answer every job from now on; NULL answers each
 * query with an empty command result (no rows). */
void fake_db_set_answer(fake_db_answer_fn fn, void *ud);

/* fake_db_hold(true) keeps jobs waiting, unanswered; fake_db_hold(false) answers them on
 * their loops' next turn. */
void fake_db_hold(bool hold);

/* fake_db_hold_pool is fake_db_hold for the jobs of pool p alone. */
void fake_db_hold_pool(db_pool *p, bool hold);

/* fake_db_set_submit_error makes db_submit and db_submit_opts return rc (-EAGAIN: the queue
 * is full; -ENOMEM) without queueing the job; 0 accepts jobs again. */
void fake_db_set_submit_error(int rc);

/* fake_db_set_ready sets what db_pool_get_stats reports: every connection ready (the
 * default) or none. */
void fake_db_set_ready(bool ready);

/* fake_db_waiting returns the jobs submitted to any pool and not yet answered. */
size_t fake_db_waiting(void);

/* fake_db_submitted / fake_db_answered count jobs since the start or the last reset. */
uint64_t fake_db_submitted(void);
uint64_t fake_db_answered(void);

/* fake_db_reset restores the defaults above (no answerer, not held, submits accepted,
 * ready) and the counts; jobs waiting stay (their pools answer them). */
void fake_db_reset(void);

#endif
