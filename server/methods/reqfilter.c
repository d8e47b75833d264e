/* server/methods/reqfilter.c: a request's filter parameters (see reqfilter.h). */
#include "reqfilter.h"

#include <errno.h>

int rf_parse_args(req *r, const msgpack_object *const *args, const char *what, mem_filter *f)
{
    server *s = req_server(r);
    char err[256];
    int rc =
        mf_parse_args(req_arena(r), &s->score, server_now_ms(), args, what, f, err, sizeof(err));
    if (rc == -EINVAL)
        req_fail(r, RPC_INVALID_ARGUMENT, "%s", err);
    else if (rc < 0)
        req_fail(r, RPC_INTERNAL, "out of memory");
    return rc < 0 ? -EINVAL : 0;
}

int rf_parse(req *r, size_t base, mem_filter *f)
{
    const msgpack_object *args[MF__COUNT];
    for (size_t i = 0; i < MF__COUNT; i++)
        args[i] = req_arg(r, base + i);
    return rf_parse_args(r, args, "", f);
}
