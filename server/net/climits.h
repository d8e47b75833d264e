/* server/net/climits.h: limits that protect the whole process from its clients: connections per
 * source address, buffered output across all connections, and the descriptor limit.
 *
 * Thread-safety: every function may be called from any thread (the address table has its
 * own mutex; the byte total is atomic).
 */
#ifndef ENGRAM_SERVER_CLIMITS_H
#define ENGRAM_SERVER_CLIMITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "config.h"

typedef struct climits climits;

/* climits_create returns the limits of cfg (max_connections_per_address,
 * max_output_total_bytes), or NULL when out of memory. climits_destroy frees it (NULL is a
 * no-op). */
climits *climits_create(const config *cfg);
void climits_destroy(climits *cl);

/* climits_addr_take counts one more connection from the address sa (its IP; the port is
 * ignored) and stores the key to release it with in *key. Returns true, or false (nothing
 * counted) when that address already holds max_connections_per_address connections, or
 * when out of memory. */
bool climits_addr_take(climits *cl, const struct sockaddr *sa, uint64_t *key);
void climits_addr_release(climits *cl, uint64_t key);

/* climits_buffered adds delta (negative: freed) to the bytes buffered for clients across
 * all connections; climits_over tells whether that total exceeds max_output_total_bytes. */
void climits_buffered(climits *cl, long long delta);
bool climits_over(climits *cl);
size_t climits_buffered_total(climits *cl);

/* climits_fit_descriptors raises the soft RLIMIT_NOFILE to the hard limit and lowers
 * cfg->max_connections so that connections leave `reserve` descriptors for PostgreSQL,
 * snapshots, the listeners and logs. Writes what it did into msg (empty when nothing
 * changed). Call once at start, before any thread. Returns the descriptor limit, or a
 * negative errno when it cannot be read (getrlimit). */
long climits_fit_descriptors(config *cfg, long reserve, char *msg, size_t msglen);

#endif
