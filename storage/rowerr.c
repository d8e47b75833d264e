/* storage/rowerr.c: counting and logging unparsable rows (see rowerr.h). */
#include "rowerr.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define LOG_INTERVAL_NS 60000000000ull /* one line per table a minute, after the first */
#define MAX_KINDS 64                   /* table and column pairs remembered as logged */

static const char *const names[ROWERR_TABLE_COUNT] = {"memories", "memory_changes", "api_keys",
                                                      "tenants", "other"};

static atomic_uint_least64_t counts[ROWERR_TABLE_COUNT];
static _Atomic(void (*)(const char *, int, const char *)) log_fn;

/* what has been logged, under mu */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    rowerr_table table;
    char column[48];
} kinds[MAX_KINDS];
static size_t nkinds;
static uint64_t last_log_ns[ROWERR_TABLE_COUNT];

const char *rowerr_table_name(rowerr_table t)
{
    return (unsigned)t < ROWERR_TABLE_COUNT ? names[t] : names[ROWERR_OTHER];
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Tells whether this report gets a log line: the first of its table and column, else the
 * first of its table in LOG_INTERVAL_NS. Remembers it. Takes mu. */
static bool should_log(rowerr_table t, const char *column)
{
    bool first = true, log = false;
    uint64_t now = mono_ns();
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nkinds && first; i++)
        if (kinds[i].table == t &&
            strncmp(kinds[i].column, column, sizeof(kinds[i].column) - 1) == 0)
            first = false;
    if (first && nkinds < MAX_KINDS) {
        kinds[nkinds].table = t;
        snprintf(kinds[nkinds].column, sizeof(kinds[nkinds].column), "%s", column);
        nkinds++;
    } else if (first) {
        first = false; /* too many kinds to remember: the per-table interval applies */
    }
    if (first || last_log_ns[t] == 0 || now - last_log_ns[t] >= LOG_INTERVAL_NS) {
        last_log_ns[t] = now;
        log = true;
    }
    pthread_mutex_unlock(&mu);
    return log;
}

void rowerr_note(rowerr_table t, const char *column, const char *problem, const char *file,
                 int line)
{
    if ((unsigned)t >= ROWERR_TABLE_COUNT)
        t = ROWERR_OTHER;
    if (!column)
        column = "?";
    uint64_t n = atomic_fetch_add(&counts[t], 1) + 1;
    void (*fn)(const char *, int, const char *) = atomic_load(&log_fn);
    if (!fn || !should_log(t, column))
        return;
    char msg[256];
    snprintf(msg, sizeof(msg),
             "unparsable row from PostgreSQL: table %s, column %s: %s (%llu such rows of %s "
             "since start; engram_rows_unparsable_total)",
             names[t], column, problem, (unsigned long long)n, names[t]);
    fn(file, line, msg);
}

uint64_t rowerr_count(rowerr_table t)
{
    return (unsigned)t < ROWERR_TABLE_COUNT ? atomic_load(&counts[t]) : 0;
}

void rowerr_set_log(void (*fn)(const char *file, int line, const char *msg))
{
    atomic_store(&log_fn, fn);
}
