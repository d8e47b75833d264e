/* server/net/hooks.c: the method table's lookup (see hooks.h). */
#include "hooks.h"

#include <stdio.h>
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

const char *const *hooks_param_enum(const method_def *m, size_t k)
{
    size_t n = m->nenums ? *m->nenums : 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(m->enums[i].param, m->params[k].name) == 0)
            return m->enums[i].words;
    return NULL;
}

static bool one_of(const msgpack_object *o, const char *const *words)
{
    for (size_t i = 0; words[i]; i++)
        if (rpc_str_eq(o, words[i]))
            return true;
    return false;
}

int hooks_enum_message(const char *what, const char *const *words, char *err, size_t errlen)
{
    int n = snprintf(err, errlen, "parameter '%s' must be one of ", what);
    for (size_t w = 0; words[w] && n >= 0 && (size_t)n < errlen; w++)
        n += snprintf(err + n, errlen - (size_t)n, "%s%s", w ? ", " : "", words[w]);
    return RPC_E_INVALID;
}

/* The message for parameter name (its element i when i >= 0). */
static int refuse(const char *name, long i, const char *const *words, char *err, size_t errlen)
{
    char what[96];
    if (i < 0)
        snprintf(what, sizeof(what), "%s", name);
    else
        snprintf(what, sizeof(what), "%s[%ld]", name, i);
    return hooks_enum_message(what, words, err, errlen);
}

int hooks_check_enums(const method_def *m, const msgpack_object *const *args, char *err,
                      size_t errlen)
{
    if (!m->nenums)
        return 0;
    for (size_t k = 0; k < m->nparams; k++) {
        const msgpack_object *o = args[k];
        const char *const *words = o ? hooks_param_enum(m, k) : NULL;
        if (!words)
            continue;
        if (o->type == MSGPACK_OBJECT_STR) {
            if (!one_of(o, words))
                return refuse(m->params[k].name, -1, words, err, errlen);
        } else if (o->type == MSGPACK_OBJECT_ARRAY) {
            for (uint32_t i = 0; i < o->via.array.size; i++)
                if (!one_of(&o->via.array.ptr[i], words))
                    return refuse(m->params[k].name, (long)i, words, err, errlen);
        }
    }
    return 0;
}
