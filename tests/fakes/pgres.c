/* tests/fakes/pgres.c: PGresults built in memory (see pgres.h). */
#include "pgres.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define TEXT_OID 25
#define BYTEA_OID 17

PGresult *pgres_make(int ncols, const char *const *names, int nrows, const char *const *cells)
{
    PGresult *r = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    if (!r)
        return NULL;
    PGresAttDesc *att = calloc((size_t)(ncols > 0 ? ncols : 1), sizeof(*att));
    if (!att)
        goto fail;
    for (int c = 0; c < ncols; c++) {
        bool bin = names[c][0] == '#';
        att[c].name = (char *)(bin ? names[c] + 1 : names[c]);
        att[c].format = bin ? 1 : 0;
        att[c].typid = bin ? BYTEA_OID : TEXT_OID;
        att[c].typlen = -1;
        att[c].atttypmod = -1;
    }
    int ok = PQsetResultAttrs(r, ncols, att);
    free(att);
    if (!ok)
        goto fail;
    for (int row = 0; row < nrows; row++)
        for (int c = 0; c < ncols; c++) {
            const char *v = cells ? cells[row * ncols + c] : NULL;
            if (!PQsetvalue(r, row, c, (char *)v, v ? (int)strlen(v) : -1))
                goto fail;
        }
    return r;
fail:
    PQclear(r);
    return NULL;
}

int pgres_set_bin(PGresult *r, int row, int col, const void *data, int len)
{
    return PQsetvalue(r, row, col, (char *)data, len) ? 0 : -1;
}

PGresult *pgres_command(void)
{
    return PQmakeEmptyPGresult(NULL, PGRES_COMMAND_OK);
}
