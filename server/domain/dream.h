/* server/domain/dream.h: auto-dream, a background pass per tenant over the session
 * transcripts since its last pass (issue 32, item 6; seed 001's "Auto-Dream").
 *
 * Three gates, cheapest first (engram_dream_due, then again under the tenant's dream_state
 * row lock): the time since the last completed pass (dream_hours, 24 by default), the
 * sessions created since the last pass (dream_min_sessions, 5), and the lock (no other pass
 * holds it, or its holder's lock is older than dream_lock_stale_s, 1 h: its process died
 * and the lock is taken over). The state (last pass, newest session covered, lock holder and
 * time, the last outcome) lives in PostgreSQL (dream_state), so it survives restarts and
 * holds across every engramd process on the database: only one of them dreams for a
 * tenant at a time.
 *
 * The pass runs the seed's four phases:
 *  1. orient: what the tenant's memory holds (live memories by type) and whether its chat
 *     model may be used (mcall: the model, the tier's daily token cap);
 *  2. gather: the sessions created since the last pass (at most dream_max_sessions, oldest
 *     first) and the messages each has not had extracted yet;
 *  3. consolidate: each session's new messages go through extraction's pipeline
 *     (extract.h, trigger "dream"): durable facts, each decided against its nearest
 *     memories (add, update, none), stored with provenance (session and entry ids);
 *  4. prune: a consolidation run of the tenant (consolidate.h, trigger "dream"): duplicates
 *     merged, updates superseded, what has lost its importance archived.
 * The lock is refreshed after every session; a pass whose lock was taken over stops. The
 * newest session covered moves on over the sessions extracted in order; a session whose
 * extraction failed or is claimed by another run stops the pass there (it is dreamt again
 * by the next pass, after 15 minutes), and the outcome is recorded with every phase's
 * figures (tenant.dream).
 */
#ifndef ENGRAM_SERVER_DREAM_H
#define ENGRAM_SERVER_DREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "bg.h"
#include "server.h"

enum {
    DREAM_OK = 0,      /* a pass ran (status "ok", or "partial": see error) */
    DREAM_LOCKED = 1,  /* another pass holds the tenant's lock */
    DREAM_NOT_DUE = 2, /* the time or sessions gate is closed */
    DREAM_FAILED = -1, /* the database failed */
};

typedef struct dream_result {
    int status;
    char status_name[16]; /* the pass's recorded outcome: "ok", "partial", "no_model", ... */
    char error[512];
    bool takeover; /* the lock was taken over from a stale holder */
    int sessions, extracted, failed;
    int facts, added, updated, unchanged;
    int64_t last_session; /* the newest session covered */
    int merged, superseded, archived;
    uint64_t tokens_in, tokens_out;
    double cost_usd;
} dream_result;

/* dream_tenant runs one pass for tenant (dim: its embedding dimension) on a background
 * thread, when the gates pass; force opens the time and sessions gates (never the lock).
 * Fills out. */
void dream_tenant(bg_ctx *ctx, server *s, int64_t tenant_id, uint32_t dim, bool force,
                  dream_result *out);

/* dream_start registers the pass (every dream_check_interval_s, when a chat model is
 * configured and dream_hours is above 0). Returns 0 or -ENOMEM. */
int dream_start(server *s);

#endif
