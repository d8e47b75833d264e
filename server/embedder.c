/* server/embedder.c: embedding providers (see embedder.h). */
#include "embedder.h"

#include <stdio.h>
#include <string.h>

#include "embed.h"

void embedder_run(req *r, const char *const *texts, const size_t *lens, float *const *outs,
                  const char *const *whats, size_t n,
                  void (*done)(req *r, rpc_code code, const char *message))
{
    const conn_auth *a = req_auth(r);
    char msg[256];
    if (strcmp(a->provider, "builtin") != 0) {
        snprintf(msg, sizeof(msg), "embedding provider '%s' is not configured", a->provider);
        done(r, RPC_UNAVAILABLE, msg);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int rc = embed_text(texts[i], lens[i], a->dim, outs[i]);
        if (rc == EMBED_E_EMPTY) {
            snprintf(msg, sizeof(msg), "parameter '%s' has no text to embed", whats[i]);
            done(r, RPC_INVALID_ARGUMENT, msg);
            return;
        }
        if (rc != 0) {
            snprintf(msg, sizeof(msg), "the built-in embedder failed (%d)", rc);
            done(r, RPC_INTERNAL, msg);
            return;
        }
    }
    done(r, RPC_OK, NULL);
}
