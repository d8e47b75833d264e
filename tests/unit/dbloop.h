/* tests/unit/dbloop.h: the event loop of the unit tests that drive storage/db's pool
 * (test_db_commit, test_db_citus): dbloop_base runs the pool; a test counts the jobs it
 * waits for in dbloop_pending, each callback calls dbloop_answered, and dbloop_run returns
 * when all answered or after 30 s (the checks after it then fail: nothing hangs a test).
 */
#ifndef ENGRAM_TESTS_DBLOOP_H
#define ENGRAM_TESTS_DBLOOP_H

#include <event2/event.h>

static struct event_base *dbloop_base;
static int dbloop_pending;

/* One awaited job answered: the loop ends when it was the last. */
static void dbloop_answered(void)
{
    if (--dbloop_pending == 0)
        event_base_loopbreak(dbloop_base);
}

static void dbloop_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    event_base_loopbreak(dbloop_base);
}

/* Runs the loop until every awaited job answered, or 30 s passed. */
static void dbloop_run(void)
{
    struct event *deadline = evtimer_new(dbloop_base, dbloop_deadline, NULL);
    struct timeval tv = {30, 0};
    evtimer_add(deadline, &tv);
    event_base_dispatch(dbloop_base);
    event_free(deadline);
}

#endif
