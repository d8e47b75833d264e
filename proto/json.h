/* proto/json.h: conversion between MessagePack values and JSON text.
 *
 * Metadata travels as MessagePack on the wire and is stored as PostgreSQL jsonb; the CLI
 * prints JSON and export/import use JSON Lines. Both directions are bounded (depth, size)
 * and do no I/O.
 */
#ifndef ENGRAM_PROTO_JSON_H
#define ENGRAM_PROTO_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include <msgpack.h>

#include "ubuf.h"

/* Positive result codes (0 success, -ENOMEM when out of memory). */
enum {
    JSON_E_UNSUPPORTED = 1, /* a MessagePack value with no JSON form (ext, non-string key, NaN) */
    JSON_E_SYNTAX,          /* the text is not JSON */
    JSON_E_TOO_DEEP,        /* nesting passes max_depth */
};

/* The output buffer of json_from_msgpack: util's growable buffer (ubuf.h), owned by the
 * caller: init with {0}, free with json_buf_fini. json_buf_fini and json_buf_append are the
 * ubuf functions under the names JSON callers have always used. */
typedef ubuf json_buf;

/* json_buf_fini frees b's memory and zeroes it. */
static inline void json_buf_fini(json_buf *b)
{
    ubuf_fini(b);
}

/* json_buf_append appends n bytes; returns 0 or -ENOMEM. */
static inline int json_buf_append(json_buf *b, const char *s, size_t n)
{
    return ubuf_append(b, s, n);
}

enum {
    JSON_BIN_BASE64 = 1 << 0, /* encode bin as a base64 string instead of failing */
    JSON_PRETTY = 1 << 1,     /* two-space indentation and newlines (for humans) */
};

/* json_from_msgpack appends the JSON text of o to out. Strings are escaped per RFC 8259
 * (", \\ and control characters; \b \f \n \r \t by name, the others as \u00XX; '/' and
 * non-ASCII are left as they are; invalid UTF-8 fails). Floats print with the fewest of 15,
 * 16 or 17 significant digits (6 to 9 for float32) that read back to the same value, with
 * ".0" added to integral ones so they read back as floats; integers print exactly (uint64
 * and int64 extremes included). Map keys must be strings. bin becomes a standard base64
 * string (with padding) under JSON_BIN_BASE64. Depth counts arrays and maps: max_depth 0
 * allows scalars only. Printing assumes the C locale's decimal point, as the server runs.
 * Returns 0, -ENOMEM, JSON_E_UNSUPPORTED (bin without JSON_BIN_BASE64, ext, non-string
 * map key, NaN or infinity, invalid UTF-8) or JSON_E_TOO_DEEP (past max_depth); on
 * failure out is left as it was on entry. Recursion is bounded by max_depth. */
int json_from_msgpack(const msgpack_object *o, unsigned flags, unsigned max_depth, json_buf *out);

/* json_to_msgpack parses the JSON text (len bytes, need not be NUL-terminated) and packs the
 * equivalent value with pk: objects as maps (duplicate keys kept as they come), arrays as
 * arrays, integers (no fraction or exponent) that fit int64 or uint64 as integers ("-0" is
 * 0), other numbers as float64 (one past float64's range is a syntax error), strings
 * (escapes and surrogate pairs decoded to UTF-8; lone surrogates, raw control characters
 * and invalid UTF-8 are errors), true/false/null. Leading zeros, NaN, Infinity, trailing
 * commas and a byte-order mark are errors. Leading and trailing whitespace is allowed;
 * anything else after the value is a syntax error. Depth is counted as in
 * json_from_msgpack; the parser keeps its own stack, so deep input cannot exhaust the C
 * stack.
 *
 * The text is parsed twice (MessagePack needs each container's count first): once to
 * check it all and count, then to pack, so a syntax error never reaches pk. pk NULL only
 * checks. Returns 0, -ENOMEM, JSON_E_SYNTAX or JSON_E_TOO_DEEP with a message ending "at
 * offset N" (N the byte offset) in err (may be NULL). On -ENOMEM pk may have received a
 * partial value (and a failing pk write callback is reported as -ENOMEM). */
int json_to_msgpack(const char *text, size_t len, unsigned max_depth, msgpack_packer *pk, char *err,
                    size_t errlen);

#endif
