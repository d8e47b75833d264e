/* server/domain/qadmit.h: admission of queries against a tier's daily limit, from blocks of the
 * day's quota reserved in PostgreSQL by each worker.
 *
 * A worker reserves a block of a tenant's queries for today (engram_query_reserve, under
 * the day's counter row lock) and admits from it with no database round trip; the database
 * grants a block only while the queries used plus every holder's block stay within the
 * limit, so processes and workers together never admit more than the limit. When a block
 * is used up the worker reports it and asks for the next (blocks grow while a tenant is
 * busy); a block idle for QA_IDLE_MS or older than half its lease is reported and its rest
 * returned on the worker's tick, and at shutdown. A request that finds no quota while
 * other holders still hold some waits (re-asking every QA_RETRY_MS) until they use or return
 * it, so the last query of the day is refused only when every one of the limit's queries
 * was used: exactly the limit is admitted. A block whose holder vanished expires after
 * QA_LEASE_MS and then counts as used. A failed reservation job fails the requests waiting
 * for it (a database error) and gives up the block (counted used until it expires).
 *
 * One qadmit per worker; worker thread only.
 */
#ifndef ENGRAM_SERVER_QADMIT_H
#define ENGRAM_SERVER_QADMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "db.h"

#define QA_LEASE_MS 10000
#define QA_IDLE_MS 1000
#define QA_RETRY_MS 50

typedef struct qadmit qadmit;

/* The verdict on one query: err set (a failed database job: status and message) or
 * admitted, or refused with the day's numbers. */
typedef struct qa_verdict {
    const db_result *err;
    bool admitted;
    int64_t used, limit, resets_ms;
} qa_verdict;

typedef void (*qa_cb)(void *arg, const qa_verdict *v);

/* qadmit_create makes the admission state of one worker whose pool is db; holder names the
 * worker uniquely among every process sharing the database (copied). NULL when out of
 * memory. */
qadmit *qadmit_create(db_pool *db, const char *holder);

/* qadmit_destroy frees q; requests still waiting fail unavailable. NULL is a no-op. */
void qadmit_destroy(qadmit *q);

/* qadmit_admit decides on one query of tenant against the limits literal ("{free,
 * standard,premium}", copied); cb(arg, verdict) runs once, maybe before this returns. */
void qadmit_admit(qadmit *q, int64_t tenant, const char *limits, qa_cb cb, void *arg);

/* qadmit_tick returns idle and old blocks and re-asks for waiting requests; call every
 * 100 ms or so. With draining, every block is returned and none is asked for. */
void qadmit_tick(qadmit *q, bool draining);

/* qadmit_reservations counts the reservation jobs sent (for metrics and tests). */
uint64_t qadmit_reservations(const qadmit *q);

#endif
