/* server/domain/mcall.h: a tenant's calls to its chat model from background work
 * (consolidation, extraction, compaction, dreaming; issue 32).
 *
 * One mcall per job and tenant: mcall_open reads which model the tenant uses (the server's
 * llm_model, or tenants.chat_model; "none" keeps it off the model) and how many of its
 * tier's daily tokens it used today (UTC); mcall_ask makes one call, blocking on the job
 * thread (never on a worker's loop), refusing once the cap is reached; mcall_record adds
 * the calls made since the last record to the tenant's day (tenant_usage: tenant.usage,
 * /metrics), so the cap holds across jobs and engramd processes.
 *
 * Not thread-safe: one job thread uses an mcall.
 */
#ifndef ENGRAM_SERVER_MCALL_H
#define ENGRAM_SERVER_MCALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "bg.h"
#include "chat.h"
#include "llm.h"
#include "server.h"

typedef struct mcall {
    int64_t tenant;
    char model[CHAT_MODEL_MAX + 1]; /* the model the calls use */
    /* NULL while calls may be made; else why not: "unconfigured" (no provider), "off" (the
     * tenant's chat_model is none), "cap_reached", "failed" (the provider cannot be made) */
    const char *status;
    char reason[300];     /* with status: a sentence for run records and session events */
    int64_t cap;          /* the tier's daily tokens (in + out); 0: unlimited */
    int64_t tokens_today; /* used today before this mcall's calls */
    /* this mcall's calls, and the part not yet recorded */
    int calls, pending_calls;
    uint64_t tokens_in, tokens_out, pending_in, pending_out;
    double cost_usd, pending_cost;
} mcall;

/* mcall_open fills m for tenant: its model and today's tokens, read on c in a read
 * transaction of its own (c must be idle). Returns 0 (then m->status tells whether calls
 * may be made), or -EIO with err. */
int mcall_open(mcall *m, server *s, PGconn *c, int64_t tenant, char *err, size_t errlen);

/* mcall_allowed tells whether another call may be made; when the cap is reached it sets
 * m->status to "cap_reached" and says so in m->reason (counted once in /metrics). */
bool mcall_allowed(mcall *m);

/* mcall_ask makes one call with req and waits for it. Returns 0 with *out filled (out->status
 * is LLM_OK or an LLM_E_*; free it with llm_result_fini) and its tokens counted in m;
 * -EAGAIN when mcall_allowed says no (out untouched); -EINVAL or -ENOMEM (out untouched). */
int mcall_ask(mcall *m, const llm_request *req, llm_result *out);

/* mcall_ask_bg is mcall_ask for a job of bg.h: the call runs on an event base of its own on
 * this thread, and ends (out->status LLM_E_CANCELLED) within about 200 ms once
 * bg_cancelled(ctx) says the server is stopping, so a slow model never holds up a shutdown.
 * Returns as mcall_ask. */
int mcall_ask_bg(mcall *m, bg_ctx *ctx, const llm_request *req, llm_result *out);

/* mcall_record adds the calls not yet recorded to the tenant's day. With own_tx it runs in a
 * write transaction of its own on c (c idle); without, inside the caller's transaction
 * (bound to m->tenant). Returns 0 (also when there is nothing to record) or -EIO with err;
 * on success the pending counts are zeroed. */
int mcall_record(mcall *m, PGconn *c, bool own_tx, char *err, size_t errlen);

#endif
