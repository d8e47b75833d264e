/* tests/fakes/fake_hooks.h: the hooks the network layer gets from main (net/hooks.h), filled
 * with a method table of a few test methods instead of engramd's, for the network layer's
 * unit tests (tests/unit/test_net_*.c).
 *
 * The methods, sorted by name:
 *   admin.only  M_ADMIN           answers "admin"
 *   auth        M_PUBLIC|M_AUTH   {api_key}: "admin" makes the connection the admin; "tenant:N"
 *                                 tenant N (key id N * 10, tier standard); "db:tenant:N" the
 *                                 same once a database job answers (DB_OK; else its error);
 *                                 anything else fails unauthenticated
 *   big         M_PUBLIC          {bytes, fill}: answers a bin of that many bytes of fill
 *   echo        M_PUBLIC          {value}: answers value
 *   later       M_PUBLIC          {tag}: answers tag when the test says so (fake_hooks_release)
 *   query       M_TENANT|M_QUERY  answers {tenant, tier} of the request's identity
 *   store       M_TENANT|M_WRITE  {n}: a database job (req_submit, the tenant's row-level
 *                                 security): answers {written: n} or the job's error
 *   whoami      M_PUBLIC          answers {authenticated, admin, tenant} of the request
 *
 * Every hook is counted in fake_hooks_get(); tenant_admit answers what the test set there.
 * Single-threaded, as the tests are.
 */
#ifndef ENGRAM_TESTS_FAKE_HOOKS_H
#define ENGRAM_TESTS_FAKE_HOOKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "db.h"
#include "hooks.h"

/* What the hooks saw, and what tenant_admit answers. */
typedef struct fake_hooks_state {
    unsigned worker_inits, worker_finis, worker_ticks;
    long keys_in_use; /* key_in_use calls minus key_released calls */
    unsigned admits;  /* tenant_admit calls */
    unsigned calls;   /* handler runs of every method (a request run again counts again) */
    unsigned echoes;  /* echo runs, notifications included */
    unsigned auths;   /* auth runs (the HTTP port runs one per new bearer key) */
    hook_admit admit; /* tenant_admit's answer (HOOK_ADMIT_OK by default) */
    uint64_t retry_ms;
    int admit_tier; /* >= 0: tenant_admit sets the request's tier to it */
} fake_hooks_state;

/* fake_hooks returns the hooks (a static table); fake_hooks_get their state. */
const net_hooks *fake_hooks(void);
fake_hooks_state *fake_hooks_get(void);

/* fake_hooks_reset zeroes the state (admit_tier -1). Requests of `later` still waiting are
 * kept (release them, or close their connection). */
void fake_hooks_reset(void);

/* fake_hooks_release answers up to n waiting `later` requests, oldest first (or newest
 * first), and returns how many it answered. fake_hooks_waiting counts those waiting. */
size_t fake_hooks_release(size_t n, bool newest_first);
size_t fake_hooks_waiting(void);

/* The statement the database-backed methods send (one text parameter). */
extern const db_stmt_def fake_hooks_stmt;

#endif
