/* server/methods/msearch.h: the search pipeline of memory.search and memory.context
 * (m_search.c), for memory.prompt (m_prompt.c), which runs it between steps of its own and
 * gets the <agent_memory> block back instead of a response.
 *
 * A method built on it declares SEARCH_PARAMS first in its parameter table (the filter
 * parameters, then P_SE_QUERY .. P_SE_COUNT_ACCESS) and its own parameters from
 * P_SE__END on.
 */
#ifndef ENGRAM_SERVER_MSEARCH_H
#define ENGRAM_SERVER_MSEARCH_H

#include <stdint.h>

#include "ctxblock.h"
#include "memfilter.h"
#include "plimits.h"
#include "req.h"

/* Parameters after the shared filter ones. */
enum {
    P_SE_QUERY = MF__COUNT,
    P_SE_EMBEDDING,
    P_SE_TOP_K,
    P_SE_MODE,
    P_SE_SIMILARITY_WEIGHT,
    P_SE_MIN_SIMILARITY,
    P_SE_COUNT_ACCESS,
    P_SE__END
};

#define SEARCH_PARAMS                                                                              \
    MF_PARAMS, {"query", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE | RPC_P_LIMIT(PLIM_QUERY), 1, 0}, \
        {"embedding", RPC_T_VECTOR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 4096},                        \
        {"top_k", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE | RPC_P_LIMIT(PLIM_TOP_K), 1, 0},       \
        {"mode", RPC_T_STR, RPC_P_NULLABLE, 0, 0},                                                 \
        {"similarity_weight", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1},                      \
        {"min_similarity", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1},                         \
    {                                                                                              \
        "count_access", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0                                           \
    }

/* search_block_fn receives the block the search chose for a caller of search_block: its
 * memories in rank order within the byte cap set with search_block_cap (ctxb_opts
 * max_bytes; b->n may be 0). The memories in it have been counted as accessed. It must end
 * the request (req_done after packing, or req_fail); b is freed after it returns. */
typedef void (*search_block_fn)(req *r, void *ctx, const ctxb_block *b);

/* search_block reads and checks the search parameters of r (SEARCH_PARAMS at their
 * places) for a search whose answer is an <agent_memory> block handed to done(r, ctx, b).
 * Nothing runs yet: search_go starts it. Returns 0, or -EINVAL after failing r (an invalid
 * argument, or out of memory). The search's state becomes r's (req_state): the caller
 * keeps its own in ctx. Worker thread. */
int search_block(req *r, search_block_fn done, void *ctx);

/* search_block_ctx returns the ctx given to search_block (r's state is the search's). */
void *search_block_ctx(req *r);

/* search_block_cap sets the byte cap of the block (ctxb_opts max_bytes; at least 1).
 * Call between search_block and search_go. */
void search_block_cap(req *r, uint64_t max_bytes);

/* search_go admits the search against the tier's daily query limit (it counts as one
 * query) and runs it; the request ends through done, or with an error. */
void search_go(req *r);

#endif
