/* server/methods/methods.h: the one sorted table of RPC methods.
 *
 * Each entry names a handler, its parameter schema and what a caller must be. The table
 * drives dispatch, metrics labels, the `methods` introspection call (which the isolation
 * tests walk), and docs/protocol.md is checked against it.
 */
#ifndef ENGRAM_SERVER_METHODS_H
#define ENGRAM_SERVER_METHODS_H

#include <stddef.h>

#include "hooks.h"

extern const method_def *const methods_table;
extern const size_t methods_count;

/* methods_find returns the method named name (n bytes) and its index in *idx, or NULL. */
const method_def *methods_find(const char *name, size_t n, size_t *idx);

/* methods_check verifies the table is sorted and sane (at start); returns 0 or -EINVAL. */
int methods_check(void);

#endif
