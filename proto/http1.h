/* proto/http1.h: the head of an HTTP/1.x request (RFC 9112), parsed from a byte buffer.
 *
 * The HTTP port's connections hand their input here; the parser does no I/O and allocates
 * nothing, so it can be fuzzed and unit-tested without a socket. It reads what the server
 * needs (method, target, version, the framing headers, Authorization, If-None-Match, the
 * CORS request headers Origin and Access-Control-Request-Method) and
 * checks the rest only for syntax. Bodies are framed by Content-Length alone: a
 * Transfer-Encoding is reported, never decoded.
 */
#ifndef ENGRAM_PROTO_HTTP1_H
#define ENGRAM_PROTO_HTTP1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Positive result codes (0: the head is complete). Each error names the status to answer
 * with before closing the connection. */
enum {
    HTTP1_E_INCOMPLETE = 1, /* no end of head yet (CRLF CRLF) */
    HTTP1_E_MALFORMED,      /* 400: not an HTTP/1.x request head */
    HTTP1_E_TOO_LARGE,      /* 431: the head passes max_head bytes or HTTP1_MAX_HEADERS lines */
    HTTP1_E_VERSION,        /* 505: HTTP/2 or later, or not HTTP/1.x */
};

#define HTTP1_MAX_HEADERS 100

typedef enum http1_method {
    HTTP1_OTHER = 0,
    HTTP1_GET,
    HTTP1_HEAD,
    HTTP1_POST,
    HTTP1_OPTIONS,
    HTTP1_PATCH,
} http1_method;

/* A parsed head. Pointers reference the buffer given to http1_parse_head. */
typedef struct http1_request {
    http1_method method;
    const char *method_str; /* the request line's method token (not NUL-terminated) */
    size_t method_len;
    const char *path; /* the target up to '?' (origin form, starts with '/'), or "*" */
    size_t path_len;
    const char *query; /* after '?' (without it), or NULL */
    size_t query_len;
    int minor;       /* HTTP/1.0 -> 0, HTTP/1.1 -> 1 */
    bool keep_alive; /* the connection may carry another request after this one */
    bool expect_100; /* Expect: 100-continue */
    bool has_length; /* a Content-Length was given */
    uint64_t content_length;
    bool transfer_encoding;    /* a Transfer-Encoding header was given (not supported) */
    const char *authorization; /* the Authorization value, trimmed, or NULL */
    size_t authorization_len;
    const char *if_none_match; /* the If-None-Match value, trimmed, or NULL */
    size_t if_none_match_len;
    const char *origin; /* the Origin value, trimmed, or NULL (more than one: malformed) */
    size_t origin_len;
    bool cors_preflight; /* an Access-Control-Request-Method header was given */
    size_t head_len;     /* bytes of the head, CRLF CRLF included: the body starts there */
} http1_request;

/* http1_find_end looks for the blank line that ends a head in buf[0..len), resuming at
 * *scanned (0 for a new head; updated so that bytes already searched are not searched
 * again). Returns the head's length, or 0 when it has not ended yet. */
size_t http1_find_end(const uint8_t *buf, size_t len, size_t *scanned);

/* http1_parse_head parses the head at the start of buf (len bytes, at least the whole head
 * when it is complete). A head longer than max_head bytes fails with HTTP1_E_TOO_LARGE as
 * soon as max_head bytes have arrived without its end. Bare LF line ends are accepted as
 * RFC 9112 allows; obsolete line folding, a space before a header's colon, control bytes in
 * a value, conflicting Content-Length values and a Content-Length that is not a decimal
 * number are HTTP1_E_MALFORMED. Returns 0 with out filled, HTTP1_E_INCOMPLETE, or an error
 * with a message in err (NUL-terminated, at most errlen bytes; err may be NULL). */
int http1_parse_head(const uint8_t *buf, size_t len, size_t max_head, http1_request *out, char *err,
                     size_t errlen);

/* http1_query_get finds key in a query string (a=b&c=d, no percent-decoding: the names and
 * values this server reads are plain words). Returns the value's length and sets *val, or
 * -1 when the key is absent. */
long http1_query_get(const char *query, size_t query_len, const char *key, const char **val);

/* http1_origin_listed tells whether origin (n bytes, as a browser sends it in Origin) is
 * one of the entries of list (a NUL-terminated list separated by commas and/or spaces, such
 * as "https://a.example, http://localhost:3000"). Origins compare byte for byte, as the
 * Fetch standard compares them; an empty origin is never listed. */
bool http1_origin_listed(const char *list, const char *origin, size_t n);

/* http1_reason returns the reason phrase of a status code ("OK", "Not Found", ...). */
const char *http1_reason(int status);

#endif
