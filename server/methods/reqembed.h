/* server/methods/reqembed.h: a request's texts embedded with its tenant's provider
 * (embedder.h), on its worker's loop. */
#ifndef ENGRAM_SERVER_REQEMBED_H
#define ENGRAM_SERVER_REQEMBED_H

#include <stddef.h>

#include "req.h"

/* re_embed is embedder_run for the tenant of r, on r's worker: done(r, code, message) runs
 * once, maybe before re_embed returns; when out of memory it runs with RPC_INTERNAL. The
 * texts and outputs must live until then (r's arena or message). */
void re_embed(req *r, const char *const *texts, const size_t *lens, float *const *outs,
              const char *const *whats, size_t n,
              void (*done)(req *r, rpc_code code, const char *message));

#endif
