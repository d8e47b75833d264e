/* storage/pgparams.c: a DSN parsed, with the failover defaults added (see pgparams.h). */
#include "pgparams.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pgparams_init(pgparams *p, const char *dsn, unsigned timeout_ms, char *err, size_t errlen)
{
    memset(p, 0, sizeof(*p));
    char *perr = NULL;
    p->opts = PQconninfoParse(dsn, &perr);
    if (!p->opts) {
        snprintf(err, errlen, "%s", perr ? perr : "out of memory");
        size_t n = strlen(err);
        while (n > 0 && err[n - 1] == '\n')
            err[--n] = '\0';
        int rc = perr ? -EINVAL : -ENOMEM;
        PQfreemem(perr);
        return rc;
    }
    snprintf(p->tcp_user_timeout, sizeof(p->tcp_user_timeout), "%u",
             timeout_ms < 1000 ? 1000 : timeout_ms);
    snprintf(p->connect_timeout, sizeof(p->connect_timeout), "%u",
             timeout_ms / 1000 < 2 ? 2 : timeout_ms / 1000);
    const struct {
        const char *key, *val;
    } defaults[] = {
        {"keepalives", "1"},
        {"keepalives_idle", "5"},
        {"keepalives_interval", "2"},
        {"keepalives_count", "3"},
        {"tcp_user_timeout", p->tcp_user_timeout},
        {"connect_timeout", p->connect_timeout},
    };
    size_t n = 0;
    for (PQconninfoOption *o = p->opts; o->keyword; o++)
        n++;
    p->keys = calloc(n + 1, sizeof(*p->keys));
    p->vals = calloc(n + 1, sizeof(*p->vals));
    if (!p->keys || !p->vals) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    size_t k = 0;
    for (PQconninfoOption *o = p->opts; o->keyword; o++) {
        const char *v = o->val;
        for (size_t d = 0; !v && d < sizeof(defaults) / sizeof(defaults[0]); d++)
            if (strcmp(o->keyword, defaults[d].key) == 0)
                v = defaults[d].val;
        if (!v)
            continue;
        p->keys[k] = o->keyword;
        p->vals[k] = v;
        k++;
    }
    return 0;
fail:
    pgparams_fini(p);
    return -ENOMEM;
}

int pgparams_set(pgparams *p, const char *key, const char *val)
{
    size_t n = 0, at = (size_t)-1;
    for (; p->keys[n]; n++)
        if (strcmp(p->keys[n], key) == 0)
            at = n;
    if (at == (size_t)-1) {
        if (!val)
            return 0;
        /* keys has a slot for every keyword libpq knows (pgparams_init), so room is left
         * for one not given yet; the keyword's own string comes from opts */
        for (PQconninfoOption *o = p->opts; o->keyword; o++)
            if (strcmp(o->keyword, key) == 0) {
                p->keys[n] = o->keyword;
                p->vals[n] = val;
                p->keys[n + 1] = NULL;
                p->vals[n + 1] = NULL;
                return 0;
            }
        return -EINVAL;
    }
    if (val) {
        p->vals[at] = val;
        return 0;
    }
    memmove(&p->keys[at], &p->keys[at + 1], (n - at) * sizeof(*p->keys));
    memmove(&p->vals[at], &p->vals[at + 1], (n - at) * sizeof(*p->vals));
    return 0;
}

void pgparams_fini(pgparams *p)
{
    free(p->keys);
    free(p->vals);
    PQconninfoFree(p->opts);
    memset(p, 0, sizeof(*p));
}
