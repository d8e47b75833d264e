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

/* The share of max_output_total_bytes kept, beyond it, for connections that hold nothing
 * (no unsent output, no request in progress): 1/CLIMITS_RESERVE_DIV of the budget. A
 * client that pipelines large answers without reading them can take the budget itself, not
 * this reserve, so the small requests of every other client still go through. */
#define CLIMITS_RESERVE_DIV 8

/* climits_try_charge adds bytes to the total when the total stays within
 * max_output_total_bytes (plus the reserve above when reserve is true; no limit when the
 * budget is 0) and returns true; otherwise it changes nothing and returns false. The check
 * and the addition are one atomic step, so concurrent workers cannot both pass the last
 * byte. Give the bytes back with climits_buffered(cl, -bytes). */
bool climits_try_charge(climits *cl, size_t bytes, bool reserve);

/* climits_pressed tells whether the total is over the budget, or the budget refused a
 * charge in the last CLIMITS_PRESSURE_MS (someone waits for it); now_ms is monotonic
 * (CLOCK_MONOTONIC). */
#define CLIMITS_PRESSURE_MS 2000
bool climits_pressed(climits *cl, uint64_t now_ms);

/* climits_budget returns max_output_total_bytes (0: no limit). */
size_t climits_budget(climits *cl);

/* climits_fit_descriptors raises the soft RLIMIT_NOFILE to the hard limit and lowers
 * cfg->max_connections so that connections leave `reserve` descriptors for PostgreSQL,
 * snapshots, the listeners and logs. Writes what it did into msg (empty when nothing
 * changed). Call once at start, before any thread. Returns the descriptor limit, or a
 * negative errno when it cannot be read (getrlimit). */
long climits_fit_descriptors(config *cfg, long reserve, char *msg, size_t msglen);

#endif
