/* storage/rowerr.h: rows PostgreSQL returned that the server could not read.
 *
 * A value that does not parse (text where a number belongs, an unknown memory type, a
 * binary column of the wrong size) must not turn into a silent 0 or nil. The readers of
 * results report it here: each report is counted by table, for /metrics
 * (engram_rows_unparsable_total{table=...}), and logged through the hook the server
 * installs: the first report of each table and column at once, after that at most one line
 * per table a minute, with the count so far. Messages name the table, the column and what
 * was wrong, never the value (it may be a memory's content or a key's hash).
 *
 * Thread-safety: every function may be called from any thread.
 */
#ifndef ENGRAM_STORAGE_ROWERR_H
#define ENGRAM_STORAGE_ROWERR_H

#include <stdint.h>

typedef enum rowerr_table {
    ROWERR_MEMORIES = 0,   /* memory rows, their index metadata, index loads */
    ROWERR_MEMORY_CHANGES, /* the change log read by catch-ups and snapshot replays */
    ROWERR_API_KEYS,       /* authentication and key checks */
    ROWERR_TENANTS,        /* tenants' tiers, dimensions and counters */
    ROWERR_OTHER,          /* any other statement's result (ids, counts, times) */
    ROWERR_TABLE_COUNT
} rowerr_table;

/* rowerr_table_name returns the label of t ("memories", ...; "other" when out of range). */
const char *rowerr_table_name(rowerr_table t);

/* rowerr_note counts one unparsable row of table t and logs it as rowerr.h describes.
 * column names the column (PQfname, or a name the reader knows); problem says what was wrong
 * ("not an integer"); file and line are the reader's (rowerr_report passes them). */
void rowerr_note(rowerr_table t, const char *column, const char *problem, const char *file,
                 int line);
#define rowerr_report(t, column, problem) rowerr_note((t), (column), (problem), __FILE__, __LINE__)

/* rowerr_count returns the rows of table t reported so far. */
uint64_t rowerr_count(rowerr_table t);

/* rowerr_set_log installs fn to write the log lines (file:line of the reader, the message
 * without a trailing newline); NULL (the default) writes nothing. Call once at start. */
void rowerr_set_log(void (*fn)(const char *file, int line, const char *msg));

#endif
