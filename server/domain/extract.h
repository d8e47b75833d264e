/* server/domain/extract.h: memory extraction from a session's transcript (issue 32, item 4;
 * seed 001's "Memory Extraction").
 *
 * One run, on a background thread with its own database connection:
 *  1. claims the session (session_extraction.running_by: one run per session in every
 *     engramd process; a claim older than extract_stale_s is taken over) and reads its own
 *     user and assistant messages after the last extraction (not tombstoned, not inherited
 *     from a session it was resumed from), up to through_entry_id when given, at most
 *     extract_max_entries messages and about extract_max_bytes;
 *  2. asks the tenant's chat model (mcall.h: its model, its tier's daily token cap) for the
 *     durable facts of those messages, in the seed's five categories (preference, project,
 *     pattern, decision, constraint), each with a confidence (0..1) and the ids of the
 *     messages it comes from. The messages go into the prompt as JSON lines between
 *     <transcript> and </transcript>, escaped so that no message can close the block
 *     (prompts.h): what a message says is data. An answer that is not the schema, or that
 *     names an entry outside the transcript, is rejected whole; facts under
 *     extract_min_confidence are dropped;
 *  3. embeds each fact with the tenant's embedding provider and finds the existing memories
 *     closest to it in the tenant's index (at most extract_neighbours, cosine at
 *     extract_floor or above, live, visible to the session's agent). Facts with neighbours
 *     go to the model again in one call, which decides per fact: add, update (the fact
 *     supersedes one of its neighbours) or none (a neighbour already says it). A decision
 *     naming a memory outside the fact's neighbours rejects the whole answer;
 *  4. applies the decisions in one transaction (engram_extract_finish): new facts become
 *     memories of the session's agent (type by category: preference -> preference,
 *     constraint -> constraint, project, pattern, decision -> fact; metadata.category,
 *     metadata.confidence, metadata.provenance {session_id, entry_ids, model, trigger};
 *     importance 0.3 + 0.6 * confidence), superseded memories are archived with the rule,
 *     the reason, the model and the session in their history, the model's tokens are
 *     counted against the tenant's day, and the session's extraction state moves on.
 *
 * Any fault (the model unconfigured, off for the tenant or over its cap; a timeout, 429
 * after its retries, 5xx, a dropped connection; an answer that is not JSON, breaks the
 * schema or names ids outside its candidates; the embedder failing) changes no memory and
 * leaves the extracted position where it was; the reason is recorded on the session
 * (session.get extraction.last_status / last_error).
 */
#ifndef ENGRAM_SERVER_EXTRACT_H
#define ENGRAM_SERVER_EXTRACT_H

#include <stdbool.h>
#include <stdint.h>

#include "bg.h"
#include "server.h"

enum {
    EXTRACT_OK = 0,        /* completed (also when there was nothing new to read) */
    EXTRACT_BUSY = 1,      /* another run holds the session's claim */
    EXTRACT_NOT_FOUND = 2, /* no such session, or the entry is not one of its entries */
    EXTRACT_NO_MODEL = 3,  /* the model cannot be used (model_status says why); recorded */
    EXTRACT_FAULT = 4,     /* the model or the embedder failed; nothing changed; recorded */
    EXTRACT_FAILED = -1,   /* the database failed */
};

#define EXTRACT_IDS_MAX 50

typedef struct extract_result {
    int status; /* EXTRACT_* */
    char error[512];
    /* "used" when the model was asked, else why not: "unconfigured", "off", "cap_reached",
     * "failed", or the failed call's status ("timeout", "rate_limited", "http", "transport",
     * "malformed", "schema", "truncated", "refused", "invalid") */
    const char *model_status;
    int entries;              /* messages read */
    int64_t through_entry_id; /* extracted through this entry after the run (0: none) */
    bool more;                /* messages are left for another run */
    int facts;                /* facts in the model's answer */
    int dropped;              /* under extract_min_confidence */
    int added, updated, unchanged, skipped;
    int64_t memory_ids[EXTRACT_IDS_MAX]; /* the memories stored */
    int nids;
    int calls;
    uint64_t tokens_in, tokens_out;
    double cost_usd;
} extract_result;

/* extract_session runs one extraction of session (through_entry 0: through its last entry)
 * of tenant (dim: its embedding dimension) on a background thread's connection; trigger is
 * "on_demand", "auto" or "dream". Fills out. */
void extract_session(bg_ctx *ctx, server *s, int64_t tenant, uint32_t dim, int64_t session,
                     int64_t through_entry, const char *trigger, extract_result *out);

/* extract_start registers the automatic extraction (every extract_check_interval_s, when a
 * chat model is configured and extract_min_messages is above 0). Returns 0 or -ENOMEM. */
int extract_start(server *s);

#endif
