/* bench/loadgen.h: an asynchronous MessagePack-RPC load generator on one libevent loop.
 *
 * One thread drives many TCP connections (TCP_NODELAY), each authenticated with its own
 * API key and keeping up to `depth` requests in flight (pipelining; responses are matched
 * by msgid, so they may come back in any order). What to send is the workload's business:
 * the engine asks the caller's next() to pack each request and hands each response to
 * done(). The engine owns the sockets, the clock and the statistics.
 *
 * Timing. A request's latency runs from just before the write() that puts it on the wire
 * (CLOCK_MONOTONIC, taken after it was packed) to just after the read() that brought in the
 * last byte of its response (taken before the response is decoded). Packing and decoding
 * are therefore outside the measured interval, but a busy client delays both its writes
 * and its reads: on a shared machine the client's own CPU time still shows up as latency
 * when the server is waiting for the client.
 *
 * Phases. Connections are opened and authenticated first (not timed). Then every
 * connection starts sending; after warmup_s the measurement window opens, after another
 * duration_s it closes. A request counts (latency histogram, ok/error counts) when it was
 * sent inside the window, whenever its response arrives; throughput counts responses that
 * arrive inside the window. After the window nothing new is sent and the engine waits (up
 * to drain_timeout_s) for the requests in flight. With duration_s 0 the run has no clock:
 * the window opens at once and closes when next() has returned "no more" on every
 * connection and every response is in (loading a data set).
 *
 * The engine is closed-loop: a connection sends a new request only when one of its depth
 * slots is free, so the offered load adapts to the server's speed.
 */
#ifndef ENGRAM_BENCH_LOADGEN_H
#define ENGRAM_BENCH_LOADGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "hist.h"
#include "rpc.h"

#define LOADGEN_MAX_OPS 8
#define LOADGEN_MAX_DEPTH 256

/* Error classes counted per op: the protocol's codes (index = rpc_code), then these. */
enum {
    LOADGEN_ERR_CHECK = RPC_CODE_COUNT, /* done() found the response inconsistent */
    LOADGEN_ERR_OTHER,                  /* an error code the engine does not know */
    LOADGEN_NERR
};

/* What next() fills in for one request. */
typedef struct loadgen_req {
    int op;       /* the workload's op number, 0 .. LOADGEN_MAX_OPS - 1 */
    uint64_t tag; /* anything; given back to done() */
} loadgen_req;

/* next packs one whole request [0, msgid, method, [args]] through pk (rpc_pack_request_begin
 * and the argument map) for connection conn and fills *req. Returns 1 when it packed one, 0
 * when this connection has nothing more to send (the run then ends for it once its
 * requests are answered), or a negative errno that aborts the run. Called on the loop's
 * thread. */
typedef int (*loadgen_next_fn)(void *ud, size_t conn, uint32_t msgid, msgpack_packer *pk,
                               loadgen_req *req);

/* done sees every response: req as next() filled it, resp decoded (its objects live until
 * done returns), measured true when the request counts. Returns 0 when the response is as
 * expected, or a positive value to count it as LOADGEN_ERR_CHECK (an error response is
 * counted by its code whatever done returns). */
typedef int (*loadgen_done_fn)(void *ud, size_t conn, const loadgen_req *req,
                               const rpc_response *resp, bool measured);

/* window is called as the measurement window opens (start true) and closes. */
typedef void (*loadgen_window_fn)(void *ud, bool start);

typedef struct loadgen_conf {
    const char *host; /* an IPv4 or IPv6 address or a name */
    uint16_t port;
    size_t conns;            /* 1 or more */
    size_t depth;            /* 1 .. LOADGEN_MAX_DEPTH requests in flight per connection */
    size_t max_inflight;     /* 0, or at most this many requests in flight over all the
                              * connections: each freed place goes to the next connection in
                              * turn (many tenants' connections, a few clients' load) */
    const char *const *keys; /* conns API keys, keys[c] for connection c (only read) */
    double warmup_s;         /* ignored when duration_s is 0 */
    double duration_s;       /* 0: run until next() is exhausted on every connection */
    double drain_timeout_s;  /* longest wait for answers after the window (default 30) */
    size_t nops;             /* ops the workload uses */
    loadgen_next_fn next;
    loadgen_done_fn done;
    loadgen_window_fn window; /* may be NULL */
    void *ud;
} loadgen_conf;

/* Counts of one op in the window. */
typedef struct loadgen_opstats {
    hist *lat;       /* latency of successful requests sent in the window */
    uint64_t sent;   /* requests sent in the window */
    uint64_t ok;     /* of those, answered successfully */
    uint64_t errors; /* of those, answered with an error or failing done's check */
    uint64_t err_by[LOADGEN_NERR];
    uint64_t done_in_window; /* successful responses that arrived in the window */
} loadgen_opstats;

typedef struct loadgen_result {
    double window_s;            /* length of the measurement window */
    uint64_t window_unix_ns[2]; /* its start and end, wall clock (ns since the epoch) */
    loadgen_opstats ops[LOADGEN_MAX_OPS];
    uint64_t unanswered;          /* requests sent in the window and never answered (drain timeout
                                   * or a broken connection) */
    uint64_t conn_errors;         /* connections that broke during the run */
    uint64_t bytes_out, bytes_in; /* over the whole run */
} loadgen_result;

/* loadgen_run opens the connections, authenticates them, runs the load as described above
 * and fills *res (caller-owned; release with loadgen_result_fini). Returns 0 when the run
 * completed (even with error responses or broken connections, which res counts), or a
 * negative errno, or 1 with a message in err when it could not run at all: a connection
 * could not be opened, an auth call failed, every connection broke, or next() failed. */
int loadgen_run(const loadgen_conf *conf, loadgen_result *res, char *err, size_t errlen);

/* loadgen_result_fini frees the histograms of res; a zeroed res is fine. */
void loadgen_result_fini(loadgen_result *res);

/* loadgen_err_name returns the name of an error class: the protocol's code string,
 * "check_failed" or "other". */
const char *loadgen_err_name(int e);

/* loadgen_now_ns returns CLOCK_MONOTONIC in nanoseconds. */
uint64_t loadgen_now_ns(void);

#endif
