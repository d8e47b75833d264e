/* server/methods/reqembed.c: a request's texts embedded (see reqembed.h). */
#include "reqembed.h"

#include "embedder.h"
#include "worker.h"

typedef struct re_call {
    req *r;
    void (*done)(req *r, rpc_code code, const char *message);
} re_call;

static void on_embedded(void *arg, rpc_code code, const char *message)
{
    re_call *c = arg;
    c->done(c->r, code, message);
}

void re_embed(req *r, const char *const *texts, const size_t *lens, float *const *outs,
              const char *const *whats, size_t n,
              void (*done)(req *r, rpc_code code, const char *message))
{
    re_call *c = req_alloc(r, sizeof(*c)); /* lives as long as r */
    if (!c) {
        done(r, RPC_INTERNAL, "out of memory");
        return;
    }
    c->r = r;
    c->done = done;
    const conn_auth *a = req_auth(r);
    worker *w = req_worker(r);
    embedder_ctx ctx = {
        .provider = a->provider, .dim = a->dim, .base = worker_base(w), .slot = worker_index(w)};
    embedder_run(&ctx, texts, lens, outs, whats, n, on_embedded, c);
}
