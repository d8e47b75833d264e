/* client/client.h: a small blocking MessagePack-RPC client for engramd.
 *
 * One client_conn is one TCP connection (TCP_NODELAY), plain or TLS 1.3 (OpenSSL; see
 * client_connect_tls), used by one thread at a time. Every
 * call blocks until it is done or its deadline passes; the deadline is the connection's
 * timeout (client_set_timeout) counted from the start of the call, enforced with poll.
 *
 * Requests can be pipelined: client_send writes a request and returns its msgid without
 * waiting; client_recv returns the next response to arrive (the server may answer out of
 * order), client_wait the response to one msgid, buffering the others for later;
 * client_call is client_send followed by client_wait.
 *
 * Responses are framed with proto/'s scanner at its default limits (16 MiB, depth 32, 4 Mi
 * objects), so a hostile server cannot make the client allocate more than about one
 * message's worth of bytes it actually sent: a declared length that cannot fit fails at
 * once, before any of it is read.
 *
 * Results are decoded into a msgpack_zone that the caller owns: the objects (and the
 * message bytes they point into) live until the caller clears or destroys the zone.
 *
 * Return values: 0 on success, a negative errno (-ENOMEM, -EINVAL, or a socket error) or
 * one of the positive CLIENT_E_* codes below. Every failure also fills a client_error
 * (when one is given) with a code string and a message, so a program can print
 * "<code>: <message>" whatever the cause.
 */
#ifndef ENGRAM_CLIENT_CLIENT_H
#define ENGRAM_CLIENT_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

typedef struct client_conn client_conn;

/* Positive result codes. After CLIENT_E_CLOSED or CLIENT_E_PROTOCOL (and after a timeout
 * that cut a request in half) the connection is broken: every later call fails at once with
 * CLIENT_E_CLOSED and the caller should client_close it. */
enum {
    CLIENT_E_SERVER = 1, /* the server answered with an error response: see client_error */
    CLIENT_E_TIMEOUT,    /* the deadline passed; the connection stays usable otherwise */
    CLIENT_E_CLOSED,     /* the server closed the connection, or it is broken */
    CLIENT_E_PROTOCOL,   /* the server sent bytes that are not a valid response */
    CLIENT_E_CONNECT,    /* client_connect: the host could not be resolved or reached */
    CLIENT_E_TLS,        /* TLS failed: a file would not load, the server's certificate was
                          * refused, the handshake or a record failed */
};

/* Codes written to client_error.code for failures that are not the server's:
 *   "timeout", "connection_closed", "protocol_error", "connect_failed", "tls_failed",
 *   "out_of_memory",
 *   "invalid_call" (-EINVAL: the caller's mistake), "io_error" (any other -errno).
 * A server error keeps the server's own code ("not_found", "unauthenticated", ...). */
#define CLIENT_CODE_MAX 64
#define CLIENT_MESSAGE_MAX 512

/* What went wrong. code and message are NUL-terminated copies (truncated to fit); object is
 * the server's whole error map ({code, message, ...details}) for CLIENT_E_SERVER, in the
 * zone given to the call, and NULL otherwise (and for client_auth, which has no zone). */
typedef struct client_error {
    char code[CLIENT_CODE_MAX];
    char message[CLIENT_MESSAGE_MAX];
    const msgpack_object *object;
} client_error;

/* Packs the argument map of a request: exactly one MessagePack map, through pk. Returns 0,
 * or a negative errno that cancels the request (the call then returns it). */
typedef int (*client_pack_fn)(msgpack_packer *pk, void *ud);

/* The arguments of a request, given one of two ways: pack (called with ud while the
 * request is built), or packed, packed_len bytes holding one complete MessagePack map
 * (borrowed for the duration of the call). Setting both, or neither, is -EINVAL; a NULL
 * client_args means no arguments (params is []). Either way the bytes must be exactly one
 * map, else the call fails with -EINVAL before anything is sent. */
typedef struct client_args {
    client_pack_fn pack;
    void *ud;
    const void *packed;
    size_t packed_len;
} client_args;

/* A response from client_recv. result and error point into the caller's zone. */
typedef struct client_response {
    uint32_t msgid;
    const msgpack_object *result; /* never NULL on success (a nil result is a nil object) */
    const msgpack_object *error;  /* the error map for CLIENT_E_SERVER, else NULL */
} client_response;

/* client_connect resolves host (a name or an IPv4/IPv6 literal) and connects to port over
 * TCP, trying each address getaddrinfo gives until one answers, all within timeout_ms
 * (0 or negative: no limit; name resolution itself is not bounded). timeout_ms also
 * becomes the connection's per-call timeout. On success *out owns a new connection (free
 * it with client_close) and 0 is returned. Otherwise *out is NULL and the result is
 * CLIENT_E_CONNECT (refused, unreachable, unknown host), CLIENT_E_TIMEOUT, -ENOMEM or
 * -EINVAL (host or out NULL, port 0), with a message in err (NUL-terminated, at most
 * errlen bytes; err may be NULL). */
int client_connect(const char *host, uint16_t port, int timeout_ms, client_conn **out, char *err,
                   size_t errlen);

/* TLS settings of client_connect_tls. The strings are only read during the call. */
typedef struct client_tls {
    const char *ca_file;     /* PEM CA certificates the server's certificate must chain to;
                              * NULL: the system's store */
    const char *cert_file;   /* PEM client certificate (chain) to present; NULL: none */
    const char *key_file;    /* its PEM private key (unencrypted); NULL: in cert_file */
    const char *server_name; /* the name or IP address the server's certificate must carry;
                              * NULL: host as given to client_connect_tls */
} client_tls;

/* client_connect_tls is client_connect over TLS when tls is not NULL (client_connect is
 * client_connect_tls with tls NULL). TLS 1.3 only; the server's certificate must chain to
 * tls->ca_file and carry the host's name (DNS) or address (IP literal); the handshake is
 * bounded by timeout_ms with the connection. Fails as client_connect does, plus
 * CLIENT_E_TLS: a file that does not load (checked before connecting), a certificate
 * refused (the message says why: expired, unknown CA, wrong name) or a handshake the
 * server broke off. */
int client_connect_tls(const char *host, uint16_t port, int timeout_ms, const client_tls *tls,
                       client_conn **out, char *err, size_t errlen);

/* client_close closes the socket (after TLS's close_notify, best effort) and frees c with
 * every buffered response. NULL is a no-op. */
void client_close(client_conn *c);

/* client_set_timeout sets the per-call deadline of c in milliseconds (0 or negative: wait
 * for ever). Each of client_send, client_recv, client_wait and client_call gets the whole
 * of it. */
void client_set_timeout(client_conn *c, int timeout_ms);

/* client_send packs [0, msgid, method, params] with a fresh msgid and writes it all.
 * Returns 0 and sets *msgid (may be NULL) when the request is on the wire; its response
 * must then be collected with client_recv or client_wait. Fails with -EINVAL (c or
 * method NULL or empty, args not exactly one map), -ENOMEM, whatever args->pack returned,
 * CLIENT_E_TIMEOUT (the socket would not take the request in time: if part of it was
 * written, the connection is broken), CLIENT_E_CLOSED or another -errno, filling err
 * (may be NULL). The packed request is kept only until the write completes. */
int client_send(client_conn *c, const char *method, const client_args *args, uint32_t *msgid,
                client_error *err);

/* client_recv returns the next response to any request still waiting: first those that
 * client_wait buffered, in arrival order, then whatever the server sends next (responses
 * to abandoned calls, see client_call, are skipped). zone (caller-owned, initialised) gets
 * the decoded objects and the message bytes they point into.
 *
 * Returns 0 with out filled; CLIENT_E_SERVER when the response is an error, out->msgid and
 * out->error then filled too and err holding its code and message; -EINVAL when nothing is
 * waiting for a response (or an argument is NULL); CLIENT_E_TIMEOUT, CLIENT_E_CLOSED,
 * CLIENT_E_PROTOCOL (a malformed message, one past the scanner's limits, or a response to a
 * msgid never sent), -ENOMEM or another -errno otherwise, with err filled. */
int client_recv(client_conn *c, msgpack_zone *zone, client_response *out, client_error *err);

/* client_wait waits for the response to msgid (from client_send), buffering responses to
 * other requests for later client_recv or client_wait calls. On success *result is the
 * result in zone (never NULL: a nil result is a nil object). Returns 0, CLIENT_E_SERVER
 * (err->object is the error map in zone), -EINVAL when msgid is not waiting for a
 * response, or the failures of client_recv. On CLIENT_E_TIMEOUT msgid is still waiting and
 * may be waited for again. Buffered responses are kept in a list searched linearly. */
int client_wait(client_conn *c, uint32_t msgid, msgpack_zone *zone, const msgpack_object **result,
                client_error *err);

/* client_call sends method with args and waits for its response, all within one timeout.
 * Returns as client_wait does, plus the failures of client_send. When the wait fails
 * without a response (a timeout), the request is abandoned: its response, should it come
 * later, is dropped, so the connection can carry on with other calls. */
int client_call(client_conn *c, const char *method, const client_args *args, msgpack_zone *zone,
                const msgpack_object **result, client_error *err);

/* client_auth calls auth {api_key} and discards the result. api_key is only read; the
 * packed request is wiped from the client's buffer once written. Returns 0 or the failures
 * of client_call (CLIENT_E_SERVER with code "unauthenticated" for a bad key). err->object
 * is always NULL here. */
int client_auth(client_conn *c, const char *api_key, client_error *err);

/* client_outstanding returns how many requests are waiting for a response (sent and not
 * yet returned, buffered ones included, abandoned ones not). */
size_t client_outstanding(const client_conn *c);

#endif
