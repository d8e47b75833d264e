/* tests/fakes/net_rig.h: one worker of the real network layer (engram_net) on the calling
 * thread, with clients on socketpairs and its database pools answered by tests/fakes/fake_db,
 * for the network layer's unit tests and the whole-server fuzzer.
 *
 * The worker's thread is never started: the rig runs the worker's event loop itself
 * (net_rig_pump) until nothing more happens, so a test or a fuzz input runs the same way
 * every time, and asserts on what the client can read, not on time. Connections are made
 * with conn_create on one end of a socketpair; the test holds the other end.
 */
#ifndef ENGRAM_TESTS_NET_RIG_H
#define ENGRAM_TESTS_NET_RIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "conn.h"
#include "hooks.h"
#include "server.h"
#include "worker.h"

typedef struct net_rig net_rig;

/* net_rig_create loads the settings (argv-style "--name=value", NULL-terminated; settings may
 * be NULL), after the rig's own (pg_dsn, no decode threads, one worker), sets up the
 * server's limits, tiers, metrics and statements as main does, hands the network layer
 * hooks and creates worker 0 (hooks->worker_init runs). setup, when not NULL, runs before
 * the worker is created, with the server, for what a program's hooks need of it. Returns
 * NULL after printing why. Ignores SIGPIPE, as engramd does. */
net_rig *net_rig_create(const net_hooks *hooks, const char *const *settings,
                        int (*setup)(server *s, void *arg), void *arg);

/* net_rig_destroy closes the clients still open, destroys the worker (hooks->worker_fini)
 * and frees the rest. NULL is a no-op. */
void net_rig_destroy(net_rig *r);

server *net_rig_server(net_rig *r);
worker *net_rig_worker(net_rig *r);

/* net_rig_connect makes a connection of the worker (http: the HTTP port's; reserved: into
 * the reserved slots) and returns the client's end (non-blocking), or -1. *c (when not NULL)
 * is the server's side, valid while it is open. */
int net_rig_connect(net_rig *r, bool http, bool reserved, conn **c);

/* net_rig_set_sndbuf makes the server's side of later connections buffer at most about bytes
 * in the kernel (SO_SNDBUF), so that answers a client does not read stay in the server's
 * output, where its budgets count them; 0 leaves the system's default. */
void net_rig_set_sndbuf(net_rig *r, int bytes);

/* net_rig_close closes a client's end (the server sees EOF at its next read). */
void net_rig_close(net_rig *r, int fd);

/* net_rig_pump runs the worker's loop until nothing more happens: no client has bytes the
 * server has not read, no database job waits to be answered (fake_db, unless held), and
 * neither these nor the bytes clients could read changed for a few turns of the loop.
 * between, when not NULL, runs at every turn (and may report progress: true). Returns the
 * turns run. */
typedef bool (*net_rig_between)(void *arg);
unsigned net_rig_pump(net_rig *r, net_rig_between between, void *arg);

/* net_rig_send writes n bytes to the client fd, pumping the loop while the socket is full.
 * Returns 0, or -1 when the server closed the connection first. */
int net_rig_send(net_rig *r, int fd, const void *data, size_t n);

/* net_rig_read appends to buf (*len bytes of cap) what the client can read now. Returns the
 * bytes read, or -1 at EOF (the server closed the connection) with nothing read. */
long net_rig_read(int fd, void *buf, size_t *len, size_t cap);

/* One answer a client read: a MessagePack-RPC response, decoded. */
typedef struct rig_got {
    uint32_t msgid;
    bool error;
    int code;          /* the error's code (rpc_code) when error, -1 when unknown */
    char message[256]; /* the error's message */
    char text[512];    /* the result, or the error map, as msgpack_object_print_buffer prints
                        * it: {"key"=>"value", "n"=>1} */
    size_t bin;        /* the result's length when it is a bin */
} rig_got;

/* A client's decoder of answers. */
typedef struct rig_reader {
    msgpack_unpacker up;
    msgpack_unpacked cur;
    bool eof;        /* the server closed the connection */
    size_t received; /* bytes read so far */
} rig_reader;

void rig_reader_init(rig_reader *rd);
void rig_reader_fini(rig_reader *rd);

/* rig_reader_next reads what fd holds and decodes the next answer into *g. Returns 1, 0 when
 * no whole answer is there, -1 when what arrived is not a response (a test failure). Sets
 * rd->eof when the server closed the connection. */
int rig_reader_next(rig_reader *rd, int fd, rig_got *g);

/* net_rig_collect pumps the loop, then decodes every whole answer fd holds into got (at most
 * max). Returns how many, or -1 when what arrived is not a response. */
int net_rig_collect(net_rig *r, int fd, rig_reader *rd, rig_got *got, size_t max);

/* net_rig_collect_all reads want answers, pumping and reading as long as bytes arrive (a
 * client reading a large answer as the server writes it). Returns how many arrived, or -1
 * when what arrived is not a response. */
int net_rig_collect_all(net_rig *r, int fd, rig_reader *rd, rig_got *got, size_t want);

/* rig_pack_request packs a request (or a notification, when notify) of method with params,
 * a map given as MessagePack bytes (NULL: no params), into buf (cap bytes). Returns its
 * length. */
size_t rig_pack_request(char *buf, size_t cap, bool notify, uint32_t msgid, const char *method,
                        const void *params, size_t params_len);

/* rig_map builds a params map from a printf-like spec: each key is followed by a type
 * letter: 'i' int64, 'u' uint64, 's' string, 'b' bool, 'n' nil, 'r' raw MessagePack bytes
 * (pointer and length). Returns its length in buf. */
size_t rig_map(char *buf, size_t cap, const char *spec, ...);

/* ---- the HTTP port ---------------------------------------------------------------------- */

/* One HTTP answer a client read. */
typedef struct rig_http_got {
    int status;
    char head[2048];  /* the status line and the headers, NUL-terminated (cut to fit) */
    char body[32768]; /* the body, NUL-terminated (cut to fit) */
    size_t body_len;  /* its Content-Length (0 for 1xx, 304, and a HEAD's answer) */
} rig_http_got;

/* A client's reader of HTTP answers. */
typedef struct rig_http {
    char *buf;
    size_t len, cap;
    bool eof; /* the server closed the connection */
} rig_http;

void rig_http_init(rig_http *h);
void rig_http_fini(rig_http *h);

/* rig_http_next reads what fd holds and parses the next whole answer into *g (head_only:
 * the answer of a HEAD request, which has no body whatever its Content-Length). Returns 1,
 * 0 when no whole answer is there, -1 when what arrived is not an HTTP/1.1 answer. */
int rig_http_next(rig_http *h, int fd, bool head_only, rig_http_got *g);

/* net_rig_http_collect pumps the loop, then parses up to max whole answers fd holds.
 * Returns how many, or -1. */
int net_rig_http_collect(net_rig *r, int fd, rig_http *h, bool head_only, rig_http_got *g,
                         size_t max);

/* rig_http_header copies the value of header name (case-insensitive) of g into val (n
 * bytes) and returns true, or returns false when g has none. */
bool rig_http_header(const rig_http_got *g, const char *name, char *val, size_t n);

#endif
