/* tests/fakes/pgres.h: PGresults built in memory, for tests that answer a module's database
 * jobs without PostgreSQL (libpq's PQmakeEmptyPGresult, PQsetResultAttrs, PQsetvalue).
 *
 * A result has named text columns (format 0, type text) unless a column is marked binary
 * (a name starting with '#': format 1, type bytea; the '#' is not part of the name). Cells
 * are given row by row; NULL is SQL NULL. A text cell's length is its strlen; a binary cell
 * is given with pgres_set_bin after the result is made.
 */
#ifndef ENGRAM_TESTS_PGRES_H
#define ENGRAM_TESTS_PGRES_H

#include <stddef.h>

#include <libpq-fe.h>

/* pgres_make returns a PGRES_TUPLES_OK result of ncols columns named names[] and nrows rows
 * of cells[row * ncols + col], or NULL when out of memory. Free with PQclear. */
PGresult *pgres_make(int ncols, const char *const *names, int nrows, const char *const *cells);

/* pgres_set_bin stores len bytes as the cell (row, col). Returns 0 or -1. */
int pgres_set_bin(PGresult *r, int row, int col, const void *data, int len);

/* pgres_command returns a PGRES_COMMAND_OK result (a statement that returns no rows). */
PGresult *pgres_command(void);

#endif
