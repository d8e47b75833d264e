/* tests/unit/test_pgres.c: the in-memory PGresults other tests answer with (tests/fakes). */
#include <string.h>

#include "check.h"
#include "pgres.h"

int main(void)
{
    const char *names[] = {"id", "content", "#vec"};
    const char *cells[] = {"1", "hello", NULL, "2", NULL, NULL};
    PGresult *r = pgres_make(3, names, 2, cells);
    CHECK(r && PQresultStatus(r) == PGRES_TUPLES_OK);
    CHECK(PQntuples(r) == 2 && PQnfields(r) == 3);
    CHECK(strcmp(PQgetvalue(r, 0, 1), "hello") == 0 && PQgetlength(r, 0, 1) == 5);
    CHECK(strcmp(PQfname(r, 2), "vec") == 0 && PQfformat(r, 2) == 1 && PQfformat(r, 0) == 0);
    CHECK(PQgetisnull(r, 1, 1) && !PQgetisnull(r, 0, 0));
    const float v[2] = {1, 2};
    CHECK(pgres_set_bin(r, 0, 2, v, sizeof(v)) == 0 && PQgetlength(r, 0, 2) == 8);
    CHECK(memcmp(PQgetvalue(r, 0, 2), v, sizeof(v)) == 0);
    PQclear(r);
    PGresult *c = pgres_command();
    CHECK(c && PQresultStatus(c) == PGRES_COMMAND_OK && PQntuples(c) == 0);
    PQclear(c);
    CHECK_RETURN();
}
