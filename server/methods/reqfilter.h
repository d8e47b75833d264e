/* server/methods/reqfilter.h: a request's filter parameters read into a mem_filter
 * (memfilter.h), failing the request when they are wrong. */
#ifndef ENGRAM_SERVER_REQFILTER_H
#define ENGRAM_SERVER_REQFILTER_H

#include <stddef.h>

#include "memfilter.h"
#include "req.h"

/* rf_parse reads the MF__COUNT filter arguments of r starting at parameter index base into
 * f (allocations in r's arena). Returns 0, or -EINVAL after failing the request with
 * invalid_argument (internal when out of memory): r is gone then. */
int rf_parse(req *r, size_t base, mem_filter *f);

/* rf_parse_args is rf_parse for filter arguments bound elsewhere (args[0..MF__COUNT), for
 * example from a map parameter with rpc_bind_params); what prefixes parameter names in
 * messages ("" or "filter."). Same results. */
int rf_parse_args(req *r, const msgpack_object *const *args, const char *what, mem_filter *f);

#endif
