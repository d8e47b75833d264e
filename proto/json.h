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

/* Positive result codes (0 success, -ENOMEM when out of memory). */
enum {
    JSON_E_UNSUPPORTED = 1, /* a MessagePack value with no JSON form (ext, non-string key, NaN) */
    JSON_E_SYNTAX,          /* the text is not JSON */
    JSON_E_TOO_DEEP,        /* nesting passes max_depth */
};

/* A growable byte buffer owned by the caller: init with {0}, free with json_buf_fini. */
typedef struct json_buf {
    char *data; /* NUL-terminated when len > 0 */
    size_t len;
    size_t cap;
} json_buf;

/* json_buf_fini frees b's memory and zeroes it. */
void json_buf_fini(json_buf *b);

/* json_buf_append appends n bytes; returns 0 or -ENOMEM. */
int json_buf_append(json_buf *b, const char *s, size_t n);

enum {
    JSON_BIN_BASE64 = 1 << 0, /* encode bin as a base64 string instead of failing */
    JSON_PRETTY = 1 << 1,     /* two-space indentation and newlines (for humans) */
};

/* json_from_msgpack appends the JSON text of o to out. Strings are escaped per RFC 8259
 * (control characters as \u00XX; invalid UTF-8 fails). Floats print with enough digits to
 * round-trip (%.17g, trimmed), integers exactly. Map keys must be strings.
 * Returns 0, -ENOMEM, JSON_E_UNSUPPORTED (bin without JSON_BIN_BASE64, ext, non-string
 * map key, NaN or infinity) or JSON_E_TOO_DEEP (past max_depth). */
int json_from_msgpack(const msgpack_object *o, unsigned flags, unsigned max_depth, json_buf *out);

/* json_to_msgpack parses the JSON text (len bytes, need not be NUL-terminated) and packs the
 * equivalent value with pk: objects as maps, arrays as arrays, integers that fit int64 or
 * uint64 as integers, other numbers as float64, strings (escapes and surrogate pairs
 * decoded to UTF-8), true/false/null. Leading and trailing whitespace is allowed; anything
 * else after the value is a syntax error. Returns 0, -ENOMEM, JSON_E_SYNTAX or
 * JSON_E_TOO_DEEP with a message (with the byte offset) in err. On failure pk may have
 * received a partial value: pack into a scratch buffer when that matters. */
int json_to_msgpack(const char *text, size_t len, unsigned max_depth, msgpack_packer *pk, char *err,
                    size_t errlen);

#endif
