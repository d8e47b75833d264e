/* bench/workload.h: what engram-bench sends and how it checks the answers.
 *
 * A workload is a weighted mix of operations (a pure workload is a mix of one), each
 * request drawn independently on its connection; connection c acts for tenant
 * c mod ntenants. It plugs into the load generator as its next() and done() callbacks.
 *
 *   search       memory.search {embedding, top_k, similarity_weight: 1.0, mode: "vector"}
 *   search_text  memory.search {query: two vocabulary words, top_k, mode: "text"}
 *   context      memory.context {embedding, top_k, similarity_weight: 1.0, budget_tokens}
 *   store        memory.store {content, type, importance, embedding}: one new memory
 *   store_batch  memory.store_batch {memories: [batch new memories]}
 *   ping         ping: no database, no index; the floor of the RPC path
 *   load         memory.store_batch of the prepared batches that load a tenant's data set
 *
 * Recall. Queries are drawn from a pool whose exact top-k over the tenant's loaded memories
 * is known (dataset_truth). A search or context answer names each memory by the "#<i>" in
 * its content; a returned memory is a hit when it is in the true top k, or when its own
 * similarity to the query (recomputed on the client) is within WORKLOAD_TIE_EPS of the
 * k-th true similarity or better: a tie, or a memory stored during the run that belongs in
 * the top k. recall@k = hits / k over all measured answers; an answer shorter than k
 * counts the missing places as misses.
 */
#ifndef ENGRAM_BENCH_WORKLOAD_H
#define ENGRAM_BENCH_WORKLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "dataset.h"
#include "loadgen.h"

#define WORKLOAD_TIE_EPS 1e-5f

enum { WL_SEARCH, WL_SEARCH_TEXT, WL_CONTEXT, WL_STORE, WL_STORE_BATCH, WL_PING, WL_LOAD, WL_NOPS };

/* workload_op_name returns the op's name ("search", ...). */
const char *workload_op_name(int op);

/* workload_op_parse returns the op named by the n bytes at s, or -1. */
int workload_op_parse(const char *s, size_t n);

typedef struct workload workload;

typedef struct workload_conf {
    const dataset *ds;
    uint64_t seed;
    size_t ntenants;
    const uint64_t *tenant_ids; /* ntenants data-set tenant numbers (the t of dataset_*) */
    size_t memories;            /* memories loaded per tenant: new ones are numbered from it */
    size_t top_k;
    size_t batch;         /* memories per store_batch request */
    double mix[WL_NOPS];  /* weights; WL_LOAD's is ignored */
    const float *queries; /* ntenants x nq x dim query vectors, or NULL (no vector ops) */
    size_t nq;
    const dataset_truth *truth; /* ntenants truths, or NULL (recall not computed) */
    bool keep_ids;              /* remember the ids of memories stored, for cleanup */
} workload_conf;

/* Per-op counters of the measured requests, beside the load generator's. */
typedef struct workload_opstats {
    uint64_t recall_hits;  /* search, context: hits summed over answers */
    uint64_t recall_slots; /* answers x k */
    uint64_t results;      /* results returned, summed */
    uint64_t answers;      /* successful answers examined */
    uint64_t memories;     /* store, store_batch, load: memories stored */
} workload_opstats;

/* workload_create returns a workload for conf (copied; the arrays it points to are
 * borrowed and must outlive the workload), or NULL when out of memory. */
workload *workload_create(const workload_conf *conf);

/* workload_destroy frees w with the prepared batches and kept ids; NULL is a no-op. */
void workload_destroy(workload *w);

/* workload_prepare_load packs the store_batch requests that load memories first ..
 * first + n - 1 of tenant slot i (0 .. ntenants - 1) into w, from vectors (n x dim,
 * caller-owned, only read here). While batches remain, next() sends them instead of
 * drawing from the mix (connection c loads tenant slot c mod ntenants); each connection's
 * source runs out when its tenant is loaded. Returns 0, -EINVAL or -ENOMEM. */
int workload_prepare_load(workload *w, size_t i, uint64_t first, size_t n, const float *vectors);

/* workload_prepare_new generates, ahead of the run, the vectors of the next per_tenant
 * memories each tenant's store ops will create, so the client spends no time on them while
 * measuring (past the pool they are generated on the fly). Returns 0 or -ENOMEM. */
int workload_prepare_new(workload *w, size_t per_tenant);

/* workload_reset_stats zeroes the counters and starts a new run: conns connections, each
 * with its own generator seeded from the seed, run and connection. */
int workload_reset_stats(workload *w, size_t conns, uint64_t run);

/* workload_stats returns the counters of op. */
const workload_opstats *workload_stats(const workload *w, int op);

/* workload_next and workload_done are the load generator's callbacks (ud is the
 * workload). */
int workload_next(void *ud, size_t conn, uint32_t msgid, msgpack_packer *pk, loadgen_req *req);
int workload_done(void *ud, size_t conn, const loadgen_req *req, const rpc_response *resp,
                  bool measured);

/* workload_kept_ids returns the ids of memories stored by the store ops so far in tenant
 * slot i (0 .. ntenants - 1) and their count in *n; the array stays w's. */
const uint64_t *workload_kept_ids(const workload *w, size_t i, size_t *n);

/* workload_clear_kept_ids forgets the kept ids (after they were deleted). */
void workload_clear_kept_ids(workload *w);

#endif
