/* proto/rpc_internal.h: what the files behind proto/rpc.h share with each other.
 *
 * Only proto/rpc*.c include this; everything else uses rpc.h. The names carry the module's
 * prefix because they cross files, but they are no part of the module's interface.
 */
#ifndef ENGRAM_PROTO_RPC_INTERNAL_H
#define ENGRAM_PROTO_RPC_INTERNAL_H

#include <float.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc.h"

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

_Static_assert(sizeof(float) == sizeof(uint32_t), "float must be 32 bits");
_Static_assert(FLT_MANT_DIG == 24 && FLT_MAX_EXP == 128, "float must be IEEE 754 binary32");

/* rpc_set_err formats a message into err (at most errlen bytes, NUL-terminated); err NULL
 * or errlen 0 is a no-op. (rpc.c) */
PRINTF_LIKE(3, 4)
void rpc_set_err(char *err, size_t errlen, const char *fmt, ...);

/* rpc_obj_type_name names o's type for messages ("integer", "map", ...); never NULL. (rpc.c) */
const char *rpc_obj_type_name(const msgpack_object *o);

/* rpc_be_read reads an n-byte (n <= 8) big-endian unsigned integer at p. (rpc.c) */
uint64_t rpc_be_read(const uint8_t *p, unsigned n);

/* Where a scan stopped. The invariants between calls: every value before pos has been
 * accounted for; stack[d] is how many values container d still owes; need is the sum of
 * the stack (each owed value takes at least one byte and counts as at least one object),
 * so pos + need never passes max_message and objects + need never passes max_objects. */
struct rpc_scan_state {
    uint64_t pos;     /* next header; may pass len while a payload is still arriving */
    uint64_t objects; /* values seen so far */
    uint64_t need;    /* values still owed by the open containers */
    unsigned depth;   /* open containers */
    bool started;     /* the top-level value's header has been read */
    uint64_t last;    /* values of the last message completed (kept by the reset after it) */
};

/* rpc_scan_state_reset starts st over at a new message. (rpc_scan.c) */
void rpc_scan_state_reset(struct rpc_scan_state *st);

/* rpc_scan_run is the scanner proper, shared by rpc_scanner and rpc_decode_*'s own
 * structural check: it resumes the scan st of buf (len bytes) and returns as
 * rpc_scanner_scan does, except that st is not reset after an error. stack has
 * lim->max_depth entries. Work per call is proportional to the headers read in that call
 * plus one re-read of a header that was cut short (at most 9 bytes). (rpc_scan.c) */
int rpc_scan_run(struct rpc_scan_state *st, uint64_t *stack, const rpc_limits *lim,
                 const uint8_t *buf, size_t len, size_t *msg_len, char *err, size_t errlen);

#endif
