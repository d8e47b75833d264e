/* storage/citusmap.h: which Citus node holds each tenant, as engramd learns it.
 *
 * Group commit on Citus (issue 35 item 2, server/methods/gcommit.h) puts in one transaction
 * only the stores of tenants whose rows live on one node, so that no group pays a two-phase
 * commit. The placement of a tenant is computed here, with no query per tenant: Citus
 * places a row of `tenants` (and of every table co-located with it) by the hash of its
 * bigint tenant id (PostgreSQL's hashint8) in the hash range of one shard, and the shard's
 * placement names the node group that holds it. cmap_load reads the ranges and groups of
 * `tenants` (a few dozen rows, more after tenant isolations) and replaces the map at once;
 * cmap_node answers from the map in memory.
 *
 * A map that is out of date (a move committed since the last load) never makes a write wrong
 * or lost: Citus routes every statement by its own metadata. It only lets one group hold
 * tenants of two nodes until the next load, and that group then commits in two phases.
 *
 * Thread safety: cmap_load and cmap_node may be called from any threads at once (a mutex
 * guards the swap and the lookups).
 */
#ifndef ENGRAM_STORAGE_CITUSMAP_H
#define ENGRAM_STORAGE_CITUSMAP_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

typedef struct cmap cmap;

/* cmap_create returns an empty map (cmap_node answers -1 until a load), or NULL when out of
 * memory. Free with cmap_destroy. */
cmap *cmap_create(void);
void cmap_destroy(cmap *m);

/* cmap_load reads the shard ranges and node groups of `tenants` through c (a coordinator or
 * a worker with Citus' metadata; no transaction block needed) and replaces m's map. Returns
 * the count of ranges loaded (> 0), or -EIO with the reason in err (the map is kept then),
 * -ENOMEM. */
int cmap_load(cmap *m, PGconn *c, char *err, size_t errlen);

/* cmap_node returns the node group (pg_dist_placement.groupid, >= 0) that holds tenant's
 * rows by the last load, or -1 when m is NULL, was never loaded, or has no range for it. */
int cmap_node(cmap *m, int64_t tenant);

/* cmap_loads returns how many loads have replaced m's map (for metrics and tests). */
uint64_t cmap_loads(cmap *m);

/* cmap_hashint8 is PostgreSQL's hashint8 (the hash Citus places a bigint by), as the signed
 * 32-bit value Citus compares with shardminvalue and shardmaxvalue. */
int32_t cmap_hashint8(int64_t v);

#endif
