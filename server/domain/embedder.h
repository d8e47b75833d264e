/* server/domain/embedder.h: turns texts into vectors with the tenant's embedding provider.
 *
 * The built-in provider (index/embed.h) runs inline on the worker; an HTTP provider runs
 * asynchronously on the worker's event loop. Either way the result arrives through the
 * done callback on the worker's thread, and a failure stores nothing: the caller fails
 * its request with the code given.
 */
#ifndef ENGRAM_SERVER_EMBEDDER_H
#define ENGRAM_SERVER_EMBEDDER_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"
#include "req.h"

/* embedder_run embeds the n texts (texts[i], lens[i] bytes) into outs[i] (dim floats each)
 * with the provider of r's tenant, then calls
 * done(r, code, message): code RPC_OK, or RPC_INVALID_ARGUMENT (a text has nothing to
 * embed; message names it using what: "content", "memories[3].content"), or
 * RPC_UNAVAILABLE (the provider failed). whats[i] names text i in messages. done may run
 * before embedder_run returns. The arrays themselves are copied; the texts and the output
 * vectors they point to must live until done runs (the request's arena or message). */
void embedder_run(req *r, const char *const *texts, const size_t *lens, float *const *outs,
                  const char *const *whats, size_t n,
                  void (*done)(req *r, rpc_code code, const char *message));

/* embedder_init reads the providers' settings (openai_*) at start, before workers run.
 * Returns 0, or with err -EINVAL for a bad URL, -EIO when TLS cannot be set up, -ENOMEM. */
int embedder_init(const config *cfg, char *err, size_t errlen);

/* embedder_fini releases what embedder_init set up. */
void embedder_fini(void);

/* embedder_available tells whether a provider of that name can serve requests here. */
bool embedder_available(const char *provider);

/* embedder_worker_fini closes worker idx's provider connections (at shutdown, after the
 * worker's loop ended). */
void embedder_worker_fini(unsigned idx);

#endif
