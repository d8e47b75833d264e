/* server/methods/app.h: the server as the network layer sees it: the hooks main hands to it
 * (net/hooks.h), and what the methods keep per worker.
 *
 * app_hooks ties the layers together: the method table (methods.h), each worker's access
 * log and its writer, query admission and store group (created by worker_init, ticked,
 * awaited by the drain, freed by worker_fini), connection counts and tenant admission
 * (tenancy.h), the read floor (tenants.h), and the HTTP port's health, index metrics and
 * OpenAPI document.
 */
#ifndef ENGRAM_SERVER_APP_H
#define ENGRAM_SERVER_APP_H

#include "access.h"
#include "hooks.h"
#include "idmap.h"
#include "req.h"
#include "worker.h"

/* app_hooks returns the hooks of engramd, for main to set server.hooks to before any
 * worker exists (main thread, once). */
const net_hooks *app_hooks(void);

/* app_metrics appends the index and row cache metrics to /metrics (hooks.metrics; any
 * thread). */
void app_metrics(server *s, struct evbuffer *b);

/* app_access returns worker w's access count log (access.h); worker thread only. */
access_log *app_access(worker *w);

/* app_store_groups returns the map that holds worker w's store group while stores are
 * waiting or in flight (gcommit.h); worker thread only. */
idmap *app_store_groups(worker *w);

/* app_admit_query admits one query (a method flagged M_QUERY) against the daily limit of
 * the tenant's tier, then continues with next(r); over the limit it fails the request with
 * quota_exceeded (limit, usage, resets_at). Tiers without a limit are counted in batches
 * and go straight on; a request run again (req_is_again) was counted the first time. Call
 * after validating the arguments, so bad calls cost nothing. */
void app_admit_query(req *r, void (*next)(req *r));

#endif
