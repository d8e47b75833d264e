/* proto/rpc.h: MessagePack-RPC framing, bounded decoding, parameter binding and encoding.
 *
 * Everything here works on byte buffers and msgpack-c objects; nothing does I/O, so the
 * whole module can be fuzzed and unit-tested without a socket. The wire format is the
 * public MessagePack-RPC spec:
 *
 *   request      [0, msgid, method, params]
 *   response     [1, msgid, error, result]
 *   notification [2, method, params]
 *
 * messages back to back on the stream, no other framing. Engram's params is a one-element
 * array holding a map of named arguments (an empty array means no arguments). error is nil
 * or a map {code, message, ...details}.
 *
 * One header, one file per job: rpc_scan.c (framing), rpc_decode.c (decoding), rpc_bind.c
 * (parameter binding and the typed readers), rpc_pack.c (encoding), rpc.c (codes, limits,
 * UTF-8, and the helpers they share through rpc_internal.h).
 */
#ifndef ENGRAM_PROTO_RPC_H
#define ENGRAM_PROTO_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

enum {
    RPC_KIND_REQUEST = 0,
    RPC_KIND_RESPONSE = 1,
    RPC_KIND_NOTIFY = 2,
};

/* Positive result codes of this module (0 is success, negative is -errno). */
enum {
    RPC_E_INCOMPLETE = 1, /* more bytes are needed to finish the message */
    RPC_E_MALFORMED,      /* not valid MessagePack, or not a valid RPC message */
    RPC_E_TOO_LARGE,      /* the message passes limits.max_message bytes */
    RPC_E_TOO_DEEP,       /* nesting passes limits.max_depth */
    RPC_E_TOO_MANY,       /* more than limits.max_objects objects in one message */
    RPC_E_INVALID,        /* parameters do not match the method's schema */
};

/* The stable error codes sent to clients in error.code. Order is not part of the protocol;
 * the strings are. */
typedef enum rpc_code {
    RPC_OK = 0,
    RPC_INVALID_ARGUMENT,
    RPC_MALFORMED_REQUEST,
    RPC_UNKNOWN_METHOD,
    RPC_UNAUTHENTICATED,
    RPC_PERMISSION_DENIED,
    RPC_NOT_FOUND,
    RPC_ALREADY_EXISTS,
    RPC_CONFLICT,
    RPC_QUOTA_EXCEEDED,
    RPC_RATE_LIMITED,
    RPC_COST_LIMIT_EXCEEDED,
    RPC_UNAVAILABLE,
    RPC_INTERNAL,
    RPC_RESULT_TOO_LARGE, /* the answer would pass max_result_bytes: ask for less */
    RPC_CODE_COUNT
} rpc_code;

/* rpc_code_name returns the wire string of code ("invalid_argument", ...); never NULL. */
const char *rpc_code_name(rpc_code code);

/* Limits applied before anything is allocated from a client's declared lengths.
 *
 * Depth counts every array and map, empty ones included: [[]] is depth 2. The decoder
 * (msgpack-c's fixed unpack stack) cannot go past 32, so a max_depth above 32 only moves
 * the failure from the scanner to rpc_decode_*. Memory: msgpack-c spends 24 bytes of zone
 * per object, so a message at max_objects costs about 24 * max_objects bytes of zone
 * (96 MiB at the defaults) on top of the message itself. */
typedef struct rpc_limits {
    size_t max_message; /* bytes in one message; default 16 MiB */
    unsigned max_depth; /* nesting depth of arrays and maps; default 32 */
    size_t max_objects; /* msgpack objects (every value counts, a map entry 2) in one message */
} rpc_limits;

/* rpc_limits_default fills lim with the defaults: 16 MiB, depth 32, 4 Mi objects. */
void rpc_limits_default(rpc_limits *lim);

/* rpc_utf8_valid tells whether the n bytes at s are valid UTF-8 (RFC 3629: no overlong
 * forms, no UTF-16 surrogates, nothing past U+10FFFF). U+0000 is valid here. */
bool rpc_utf8_valid(const char *s, size_t n);

/* ---- framing ---------------------------------------------------------------------- */

typedef struct rpc_scanner rpc_scanner;

/* rpc_scanner_create returns a scanner bound to a copy of lim (NULL: the defaults), or NULL
 * when out of memory. Free with rpc_scanner_destroy. A scanner finds where one message ends
 * in a byte stream without allocating anything sized by the input: its only memory is one
 * struct with a stack of lim->max_depth counters. One scanner serves one stream and is not
 * thread-safe; scanners are independent. */
rpc_scanner *rpc_scanner_create(const rpc_limits *lim);

/* rpc_scanner_destroy frees s; NULL is a no-op. */
void rpc_scanner_destroy(rpc_scanner *s);

/* rpc_scanner_reset forgets any partial scan; the next call starts a new message. */
void rpc_scanner_reset(rpc_scanner *s);

/* rpc_scanner_scan looks for the end of the message that starts at buf[0]. It checks the
 * structure only (every type byte, lengths, counts, depth); ext values pass here and are
 * left for the binder to refuse.
 *
 * buf holds len bytes; across calls for the same message buf must start with the same
 * bytes and len may only grow: the scan resumes where it stopped, so a message that
 * arrives in many pieces costs linear time overall.
 *
 * Returns 0 and sets *msg_len to the message's length when it is complete (the scanner
 * is then reset for the next message, which starts at buf[*msg_len]); RPC_E_INCOMPLETE
 * when more bytes are needed; RPC_E_MALFORMED, RPC_E_TOO_LARGE, RPC_E_TOO_DEEP or
 * RPC_E_TOO_MANY with a message in err (NUL-terminated, at most errlen bytes; err may be
 * NULL) when the stream cannot be a valid message within the limits. A declared string,
 * binary, ext, array or map length that cannot fit in what remains of max_message fails at
 * once with RPC_E_TOO_LARGE, before the bytes arrive (an element needs at least one byte, a
 * map entry two), and a declared count that would pass max_objects fails at once with
 * RPC_E_TOO_MANY. Reserved byte 0xc1 is malformed. After an error the stream cannot be
 * resynchronised: drop the connection (the scanner is reset). */
int rpc_scanner_scan(rpc_scanner *s, const uint8_t *buf, size_t len, size_t *msg_len, char *err,
                     size_t errlen);

/* rpc_scanner_last_objects returns how many MessagePack values the message that the last
 * successful rpc_scanner_scan delimited holds (every value counts, a map entry 2): what
 * decoding it costs (msgpack-c spends about 24 bytes of zone per value). 0 before any. */
size_t rpc_scanner_last_objects(const rpc_scanner *s);

/* ---- decoding ---------------------------------------------------------------------- */

/* A decoded request or notification. Pointers reference the zone and the message bytes
 * given to rpc_decode_request: both must outlive this struct and every object reached
 * from it (msgpack_unpack references str, bin and ext bodies in the input instead of
 * copying them; arrays and maps live in the zone). */
typedef struct rpc_request {
    int kind;           /* RPC_KIND_REQUEST or RPC_KIND_NOTIFY */
    uint32_t msgid;     /* 0 for notifications */
    const char *method; /* not NUL-terminated */
    size_t method_len;
    const msgpack_object *params; /* the argument map, or NULL when params is [] */
} rpc_request;

/* A decoded response (used by clients). */
typedef struct rpc_response {
    uint32_t msgid;
    const msgpack_object *error;  /* NULL when the error is nil */
    const msgpack_object *result; /* NULL when the result is nil */
} rpc_response;

/* rpc_decode_request decodes one complete message of len bytes (as delimited by
 * rpc_scanner_scan) into out, unpacking with msgpack-c into zone (not NULL; the caller owns
 * it and frees or clears it once done with out).
 *
 * The bytes are checked structurally again before msgpack-c sees them (every declared
 * count and length must fit in len, depth at most 32), so even bytes that never went
 * through a scanner cannot make msgpack-c allocate from a forged count.
 *
 * Returns 0 on success; RPC_E_MALFORMED with a message in err when the bytes are not a
 * request or notification of the shape above (not exactly one MessagePack value, wrong
 * array length, kind 1 or unknown kind, msgid not a uint32, method not a string of 1 to 255
 * bytes of valid UTF-8, params not [] or [map], a key of that map that is not a string);
 * -ENOMEM when the zone cannot grow; -EINVAL when zone is NULL. *msgid_known (may be NULL)
 * is set to true whenever a msgid could be read, from the bytes themselves, out->msgid
 * then holding it: the message is an array of at least two elements starting with 0 and a
 * uint32. This holds also when the rest is malformed (even when it is not valid
 * MessagePack), so the caller can send an error response before closing the connection.
 * Strings and binaries in the objects point into msg: keep msg alive with the zone. */
int rpc_decode_request(const uint8_t *msg, size_t len, msgpack_zone *zone, rpc_request *out,
                       bool *msgid_known, char *err, size_t errlen);

/* rpc_peek_msgid reads the msgid of a request straight from the first bytes of buf (len
 * bytes), so an error response can name it even when the rest of the message is
 * malformed, incomplete or hostile: the bytes must start an array of at least two elements
 * whose first is 0 and whose second is a uint32. Returns true and sets *id when so. */
bool rpc_peek_msgid(const uint8_t *buf, size_t len, uint32_t *id);

/* rpc_decode_response decodes a complete response message, as rpc_decode_request does for
 * requests: [1, msgid (uint32), error (nil or a map), result (anything)]. Returns 0,
 * RPC_E_MALFORMED with err, -ENOMEM or -EINVAL as rpc_decode_request does. The same
 * lifetime rules apply. */
int rpc_decode_response(const uint8_t *msg, size_t len, msgpack_zone *zone, rpc_response *out,
                        char *err, size_t errlen);

/* ---- parameter binding --------------------------------------------------------------- */

typedef enum rpc_type {
    RPC_T_ANY = 0, /* any value but ext; every string in it (keys too) checked as RPC_T_STR */
    RPC_T_BOOL,
    RPC_T_UINT,       /* non-negative integer that fits uint64 */
    RPC_T_INT,        /* integer that fits int64 */
    RPC_T_NUM,        /* integer or float; min/max apply */
    RPC_T_STR,        /* UTF-8 string without U+0000; min/max bound its length in bytes */
    RPC_T_BIN,        /* binary; min/max bound its length */
    RPC_T_ARRAY,      /* min/max bound its element count; strings inside checked as for ANY */
    RPC_T_MAP,        /* min/max bound its entry count; keys must be strings; as ARRAY inside */
    RPC_T_VECTOR,     /* bin of little-endian float32 or array of numbers; min/max: dimension */
    RPC_T_STR_ARRAY,  /* array of strings (each as RPC_T_STR); min/max bound the count */
    RPC_T_UINT_ARRAY, /* array of non-negative integers; min/max bound the element count */
    RPC_T_TIME,       /* a time: milliseconds since the epoch (non-negative integer; min/max
                       * apply), or an RFC 3339 string (2026-02-24T10:00:00Z; fractions of a
                       * second and offsets allowed) of a time at or after the epoch */
} rpc_type;

enum {
    RPC_P_REQUIRED = 1 << 0, /* absence is invalid_argument */
    RPC_P_NULLABLE = 1 << 1, /* nil is accepted and treated as absent */
    RPC_P_RANGE = 1 << 2,    /* min and max apply (else the value is unbounded); use
                              * -INFINITY or INFINITY for a one-sided bound */
    RPC_P_ALIAS = 1 << 3,    /* another name of the nearest entry before it without this
                              * flag (a seed's name for it): its value binds to that entry's
                              * out[], its own out[] stays NULL */
};

/* RPC_P_LIMIT(i) in a parameter's flags names limit i (1 .. RPC_LIMITS_MAX - 1), set at
 * start (rpc_limits_set: an operator's setting): for a string or a binary it is the longest
 * length, for a map, an array or any value the most bytes of the value's MessagePack
 * encoding (rpc_value_bytes), for each string of a RPC_T_STR_ARRAY its longest length, for
 * a number or a vector the maximum (max is then ignored). Without one, a string without
 * RPC_P_RANGE (an enum, a name) is at most RPC_STR_MAX_DEFAULT bytes, each string of a
 * RPC_T_STR_ARRAY too, and a map, an array or any value at most RPC_VALUE_MAX_DEFAULT
 * bytes: every value a client sizes has a byte limit. */
#define RPC_P_LIMIT(i) ((unsigned)(i) << 8)
#define RPC_P_LIMIT_OF(flags) ((flags) >> 8)

/* One named parameter of a method. Tables of these are static and sorted by nothing in
 * particular; lookups are linear (methods have a handful of parameters). */
typedef struct rpc_param {
    const char *name;
    rpc_type type;
    unsigned flags;
    double min, max;
} rpc_param;

#define RPC_STR_MAX_DEFAULT 256
#define RPC_VALUE_MAX_DEFAULT 65536
#define RPC_LIMITS_MAX 32

/* rpc_limits_set makes limits[i] (bytes, or the maximum for numbers) the value of limit i
 * for i in 1 .. n - 1 (limits[0] is not used; a limit never set is unbounded). Call once
 * at start, before any thread binds parameters: the table is read without locks. */
void rpc_limits_set(const double *limits, size_t n);

/* rpc_limit_value returns the value of limit i (INFINITY when not set or i is 0). */
double rpc_limit_value(unsigned i);

/* rpc_param_max returns the effective maximum of p as the binder applies it: its limit's
 * value, else max when RPC_P_RANGE, else the defaults above for strings and containers
 * (INFINITY otherwise). For containers it is a number of bytes, beside min/max counts. */
double rpc_param_max(const rpc_param *p);

/* rpc_value_bytes returns the size of o's MessagePack encoding (what a client sent). */
size_t rpc_value_bytes(const msgpack_object *o);

/* rpc_message_field copies into out (n bytes, NUL-terminated, cut to fit) the parameter a
 * validation message names: its first single-quoted word, as every message of
 * rpc_bind_params, rpc_check_value and rpc_check_param has it ("parameter 'top_k' must be
 * ...", "unknown parameter 'colour'", "missing required parameter 'content'"), after the
 * place of a nested item when the message starts with one ("memories[3]: parameter
 * 'content' ..." names memories[3].content). Returns false (out empty) when msg quotes
 * none. */
bool rpc_message_field(const char *msg, char *out, size_t n);

/* rpc_check_param validates o against p exactly as rpc_bind_params does (limits and
 * defaults included), naming it what. Returns 0 or RPC_E_INVALID with err. */
int rpc_check_param(const msgpack_object *o, const rpc_param *p, const char *what, char *err,
                    size_t errlen);

/* rpc_bind_params matches the argument map params (NULL means no arguments) against the
 * schema of n entries and sets out[i] to the value of schema[i], or NULL when absent (or
 * nil and RPC_P_NULLABLE). out[i] points into params. A nil value without RPC_P_NULLABLE
 * is a type error unless the type is RPC_T_ANY.
 *
 * A parameter given under its name and an alias (RPC_P_ALIAS) must have equal values.
 *
 * Returns 0, or RPC_E_INVALID with a message naming the parameter in err (out[] all NULL)
 * for: a key that is not in the schema ("unknown parameter 'x'", the name shown with
 * unprintable bytes escaped), a key that is not a string, a duplicate key ("duplicate
 * parameter 'x'"), a parameter given under two names with different values ("parameters
 * 'type' and 'memory_type' name the same parameter and differ"), a missing required
 * parameter ("missing required parameter 'x'"), a
 * value of the wrong type ("parameter 'top_k' must be an unsigned integer, not string"), a
 * value out of range ("parameter 'top_k' must be between 1 and 1000"), a vector whose
 * binary length is not a multiple of 4, that is empty, or that holds a NaN, an infinity or
 * a number outside float32's range, a string that is not valid UTF-8 ("parameter 'content'
 * is not valid UTF-8") or holds U+0000, an ext value (the scanner accepts ext as valid
 * MessagePack; here it is refused wherever it appears). */
int rpc_bind_params(const msgpack_object *params, const rpc_param *schema, size_t n,
                    const msgpack_object **out, char *err, size_t errlen);

/* Typed readers for values that rpc_bind_params has already checked. Each returns def
 * when o is NULL (or, defensively, of a type the reader does not take). */
uint64_t rpc_get_uint(const msgpack_object *o, uint64_t def);
int64_t rpc_get_int(const msgpack_object *o, int64_t def);
double rpc_get_num(const msgpack_object *o, double def);
bool rpc_get_bool(const msgpack_object *o, bool def);

/* rpc_get_time returns a RPC_T_TIME value in milliseconds since the epoch (an RFC 3339
 * string's fraction cut to milliseconds), or def for NULL or a value it does not take. */
int64_t rpc_get_time(const msgpack_object *o, int64_t def);

/* rpc_time_parse reads an RFC 3339 date-time (YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM),
 * 't', 'z' and a space for 'T' accepted) of n bytes into milliseconds since the epoch.
 * Returns 0, or -EINVAL for anything else (a date that does not exist, a leap second). */
int rpc_time_parse(const char *s, size_t n, int64_t *ms);

/* rpc_get_str returns a NUL-terminated copy of the string o in memory from alloc(ud, n)
 * (the caller owns it and frees it as alloc requires), or NULL when o is NULL, not a
 * string, or the allocation fails. */
char *rpc_get_str(const msgpack_object *o, void *(*alloc)(void *ud, size_t n), void *ud);

/* rpc_str_eq tells whether the string object o equals the C string s. */
bool rpc_str_eq(const msgpack_object *o, const char *s);

/* rpc_map_get returns the value for key in map m, or NULL; m may be NULL. */
const msgpack_object *rpc_map_get(const msgpack_object *m, const char *key);

/* rpc_vector_dim returns the dimension of a vector value (bin or array) checked by
 * rpc_bind_params; 0 for NULL or another type. */
size_t rpc_vector_dim(const msgpack_object *o);

/* rpc_get_vector writes the dim floats of the vector o into out (caller-owned, dim
 * floats). A bin is read as little-endian float32 whatever the host's byte order. Returns
 * 0, or RPC_E_INVALID when o is NULL or not a vector, the dimension differs, or a value is
 * not a finite float32, with a message naming param in err; out is then partly written. */
int rpc_get_vector(const msgpack_object *o, const char *param, float *out, size_t dim, char *err,
                   size_t errlen);

/* rpc_check_value validates one value against a type and range exactly as rpc_bind_params
 * does for a parameter, naming it what in messages ("memories[3].importance"). Used for
 * nested structures. Only RPC_P_NULLABLE (nil passes) and RPC_P_RANGE of flags matter; a
 * NULL o is "missing parameter 'what'". Returns 0 or RPC_E_INVALID with err. */
int rpc_check_value(const msgpack_object *o, rpc_type type, unsigned flags, double min, double max,
                    const char *what, char *err, size_t errlen);

/* ---- encoding ------------------------------------------------------------------------ *
 *
 * The packers return void: msgpack-c reports a failed write only through each call's
 * return value, and these helpers drop it. Use a write callback that cannot fail (a
 * buffer that aborts on OOM) or that remembers its own failure, and check that before
 * sending. */

/* A key and value added to an error map beside code and message. */
typedef struct rpc_detail {
    const char *key;
    enum { RPC_D_INT, RPC_D_UINT, RPC_D_NUM, RPC_D_STR } type;
    union {
        int64_t i;
        uint64_t u;
        double d;
        const char *s;
    } v;
} rpc_detail;

/* rpc_pack_result_begin packs the head of a success response, [1, msgid, nil, ...]: the
 * caller packs exactly one result object after it. */
void rpc_pack_result_begin(msgpack_packer *pk, uint32_t msgid);

/* rpc_pack_error packs a whole error response [1, msgid, {code, message, details...}, nil]:
 * code is rpc_code_name(code), message NULL packs "", each detail's key must not be NULL
 * and a RPC_D_STR detail with s NULL packs nil. */
void rpc_pack_error(msgpack_packer *pk, uint32_t msgid, rpc_code code, const char *message,
                    const rpc_detail *details, size_t ndetails);

/* rpc_pack_request_begin packs [0, msgid, method, [ ... : the caller packs exactly one
 * argument map after it (or calls with has_args false for an empty params array). */
void rpc_pack_request_begin(msgpack_packer *pk, uint32_t msgid, const char *method, bool has_args);

/* Helpers for packing maps of named fields. */
void rpc_pack_cstr(msgpack_packer *pk, const char *s); /* s NULL packs nil */
void rpc_pack_strn(msgpack_packer *pk, const char *s, size_t n);
void rpc_pack_kv_str(msgpack_packer *pk, const char *key, const char *s); /* s NULL: nil */
void rpc_pack_kv_uint(msgpack_packer *pk, const char *key, uint64_t v);
void rpc_pack_kv_int(msgpack_packer *pk, const char *key, int64_t v);
void rpc_pack_kv_num(msgpack_packer *pk, const char *key, double v);
void rpc_pack_kv_bool(msgpack_packer *pk, const char *key, bool v);
void rpc_pack_kv_nil(msgpack_packer *pk, const char *key);
/* rpc_pack_vector packs a float vector as bin of little-endian float32 (nil when dim * 4
 * would not fit a bin's 32-bit length). */
void rpc_pack_vector(msgpack_packer *pk, const float *v, size_t dim);

#endif
