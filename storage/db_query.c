/* storage/db_query.c: copies of a job's statements and parameters (db_query_copy, db.h): the
 * pool keeps one per job, the request layer keeps one to send a read again, and test doubles
 * of the pool (tests/fakes/fake_db.c) use this same copy. Kept apart from the pool so that a
 * program may replace the pool and still have it. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"

int db_query_copy(const db_query *qs, int nq, db_query *out, char **blob)
{
    size_t arrays = 0, bytes = 1;
    for (int i = 0; i < nq; i++) {
        arrays += qs[i].nvalues;
        for (size_t k = 0; k < qs[i].nvalues; k++) {
            if (!qs[i].values[k])
                continue;
            bool bin = qs[i].formats && qs[i].formats[k] == 1;
            bytes += bin ? (size_t)qs[i].lengths[k] : strlen(qs[i].values[k]) + 1;
        }
    }
    /* one block: value pointers, then lengths, then formats, then the bytes */
    *blob = malloc(arrays * (sizeof(char *) + 2 * sizeof(int)) + bytes);
    if (!*blob)
        return -ENOMEM;
    const char **vals = (const char **)(void *)*blob;
    int *lens = (int *)(void *)(vals + arrays);
    int *fmts = lens + arrays;
    char *w = (char *)(fmts + arrays);
    for (int i = 0; i < nq; i++) {
        const db_query *q = &qs[i];
        out[i] = *q;
        out[i].values = vals;
        out[i].lengths = lens;
        out[i].formats = fmts;
        for (size_t k = 0; k < q->nvalues; k++) {
            bool bin = q->formats && q->formats[k] == 1;
            fmts[k] = bin ? 1 : 0;
            lens[k] = bin ? q->lengths[k] : 0; /* libpq reads lengths of binary values only */
            if (!q->values[k]) {
                vals[k] = NULL;
                continue;
            }
            size_t n = bin ? (size_t)q->lengths[k] : strlen(q->values[k]) + 1;
            memcpy(w, q->values[k], n);
            vals[k] = w;
            w += n;
        }
        vals += q->nvalues;
        lens += q->nvalues;
        fmts += q->nvalues;
    }
    return 0;
}
