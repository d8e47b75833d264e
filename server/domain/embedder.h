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
#include <stdint.h>

#include "config.h"
#include "rpc.h"

struct event_base;

/* Who embeds, and where: the tenant's provider and dimension, and the caller's event loop
 * with its slot among the loops (a worker's index: that loop's connections to the provider
 * are kept per slot, at most 256 slots). */
typedef struct embedder_ctx {
    const char *provider;
    uint32_t dim;
    struct event_base *base;
    unsigned slot;
} embedder_ctx;

typedef void (*embedder_done)(void *arg, rpc_code code, const char *message);

/* embedder_run embeds the n texts (texts[i], lens[i] bytes) into outs[i] (dim floats each)
 * with ctx's provider, on ctx's loop, then calls
 * done(arg, code, message): code RPC_OK, or RPC_INVALID_ARGUMENT (a text has nothing to
 * embed; message names it using what: "content", "memories[3].content"), or
 * RPC_UNAVAILABLE (the provider failed). whats[i] names text i in messages. done may run
 * before embedder_run returns. The arrays themselves are copied; the texts and the output
 * vectors they point to must live until done runs (the request's arena or message). Runs on
 * ctx's loop's thread. */
void embedder_run(const embedder_ctx *ctx, const char *const *texts, const size_t *lens,
                  float *const *outs, const char *const *whats, size_t n, embedder_done done,
                  void *arg);

/* embedder_run_sync is embedder_run for a thread that may block (background work): it runs
 * the embedding on an event base of its own, with one of 16 slots kept for such callers
 * (their connections are closed when it returns), and waits. Returns RPC_OK, or the code
 * embedder_run would give with the message in err (RPC_UNAVAILABLE also when every slot is
 * busy). Any thread but a worker's. */
int embedder_run_sync(const char *provider, uint32_t dim, const char *const *texts,
                      const size_t *lens, float *const *outs, const char *const *whats, size_t n,
                      char *err, size_t errlen);

/* embedder_init reads the providers' settings (openai_*) at start, before workers run; cfg
 * must live until embedder_fini.
 * Returns 0, or with err -EINVAL for a bad URL, -EIO when TLS cannot be set up, -ENOMEM. */
int embedder_init(const config *cfg, char *err, size_t errlen);

/* embedder_fini releases what embedder_init set up. */
void embedder_fini(void);

/* embedder_available tells whether a provider of that name can serve requests here. */
bool embedder_available(const char *provider);

/* embedder_worker_fini closes the provider connections of slot idx (at shutdown, after its
 * loop ended). */
void embedder_worker_fini(unsigned idx);

#endif
