/* server/net/hooks.c: the method table's lookup (see hooks.h). */
#include "hooks.h"

#include <string.h>

const method_def *hooks_method_find(const method_def *t, size_t count, const char *name, size_t n,
                                    size_t *idx)
{
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const char *m = t[mid].name;
        size_t mlen = strlen(m);
        int c = memcmp(m, name, mlen < n ? mlen : n);
        if (c == 0)
            c = mlen < n ? -1 : mlen > n ? 1 : 0;
        if (c == 0) {
            *idx = mid;
            return &t[mid];
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
