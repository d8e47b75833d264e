/* server/net/conn.c: client connections: framing, backpressure and deadlines (see conn.h). */
#include "conn.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/sockios.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>

#include "climits.h"
#include "hapi.h"
#include "hooks.h"
#include "log.h"
#include "metrics.h"
#include "req.h"
#include "tls.h"

/* Bytes libevent may buffer from the socket before it stops reading; we drain from there
 * into the connection's own contiguous buffer as messages are processed. Over TLS the
 * connection applies it itself (see update_reading). */
#define READ_HIGH_WATER (256 * 1024)
/* Before auth: unsent answers and requests in progress a connection may have. */
#define PREAUTH_OUTPUT (64 * 1024)
#define PREAUTH_INFLIGHT 8
/* Under the server-wide budget, a connection holding at least this much unsent output that
 * took none of it for STALL_MS is closed. A sender must keep min_send_rate after GRACE_MS. */
#define HOG_OUTPUT (1024 * 1024)
#define STALL_MS 5000
#define GRACE_MS 5000
/* What a request is charged at dispatch, besides its message: msgpack-c's zone for its
 * decoded values (about 24 bytes each). Its answer's reservation comes after (conn_admit). */
#define ZONE_BYTES_PER_VALUE 24
/* The least an answer reserves, and how many requests may be in flight before the
 * connection has seen its first answer (so a pipelined burst waits for one answer's size
 * before hundreds of large answers are asked of the database at once). */
#define ANSWER_RESERVE (32 * 1024)
#define SLOW_START 8

/* What a connection knows of one method's answers. */
typedef struct method_load {
    uint32_t est;     /* its recent answers' size, a decaying maximum (0: none seen yet) */
    uint32_t running; /* its requests admitted and not ended */
} method_load;

struct conn {
    worker *w;
    server *srv;
    struct bufferevent *bev;
    conn *prev, *next;
    unsigned refs;
    bool open;          /* the socket is open */
    bool closing;       /* close once the output is flushed */
    bool read_stopped;  /* drain: no new requests */
    bool paused;        /* backpressure: reading paused */
    bool processing;    /* process_input is on the stack (it must not nest) */
    bool resuming;      /* resume_parked is on the stack (it must not nest) */
    bool held;          /* an identity change (auth) is in flight: dispatch nothing after it */
    unsigned decoding;  /* messages being decoded off the loop: dispatch nothing after them */
    struct ssl_st *ssl; /* the TLS session (the bufferevent owns it); NULL: plain TCP */
    bool tls_up;        /* the handshake has completed */
    bool tls_broken;    /* the session failed: no close_notify may be sent */
    bool client_cert;   /* the peer presented a certificate tls_ca_file verified */
    rpc_scanner *scan;
    uint8_t *in; /* bytes of the message being assembled, and any after it */
    size_t in_len, in_cap;
    uint64_t msg_started_ms; /* when the first byte of an incomplete message arrived; 0: none */
    uint64_t rec_started_ms; /* TLS: since when a record has been arriving with no message
                              * bytes decrypted yet; 0: none */
    uint64_t last_active_ms;
    uint64_t close_deadline_ms;
    uint64_t opened_ms;
    uint64_t out_progress_ms;   /* when the client last took output (or had none) */
    size_t out_bytes;           /* unsent output, as counted into the server-wide total */
    uint64_t addr_key;          /* climits' count of connections from the peer's address */
    size_t charged;             /* bytes the requests in progress are charged (conn.h, budgets) */
    bool budget_wait;           /* the next request did not fit the budgets: it waits */
    size_t ready_len;           /* a framed message at c->in's start that waits for budget ... */
    size_t ready_values;        /* ... and its values, so it is not scanned again */
    req *park_head, *park_tail; /* requests waiting for their answer's reservation (conn_admit) */
    method_load *load;          /* per method index (conn_admit); NULL until the first */
    size_t nload;
    int sndq; /* the socket's unsent bytes (SIOCOUTQ) at the last tick */
    unsigned inflight;
    conn_auth auth;
    hapi *hx; /* HTTP state (a connection of the HTTP port); NULL: MessagePack-RPC */
};

static void process_input(conn *c);

static uint64_t mono_ms(void)
{
    return server_mono_ns() / 1000000u;
}

/* Ends every parked request without an answer (the connection closed). */
static void drop_parked(conn *c)
{
    req *r = c->park_head;
    c->park_head = c->park_tail = NULL;
    while (r) {
        req *next = req_parked_next(r);
        req_set_parked_next(r, NULL);
        req_abandon(r);
        r = next;
    }
}

static void conn_free(conn *c)
{
    free(c->load);
    climits_buffered(c->srv->limits_cl, -(long long)c->in_cap);
    rpc_scanner_destroy(c->scan);
    hapi_destroy(c->hx);
    free(c->in);
    free(c);
}

/* Counts output into the server-wide total as libevent adds and sends it. */
static void on_output_change(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg)
{
    conn *c = arg;
    long long delta = (long long)info->n_added - (long long)info->n_deleted;
    if (delta) {
        climits_buffered(c->srv->limits_cl, delta);
        c->out_bytes = (size_t)((long long)c->out_bytes + delta);
    }
    if (info->n_deleted || c->out_bytes == 0)
        c->out_progress_ms = mono_ms();
}

void conn_ref(conn *c)
{
    c->refs++;
}

void conn_unref(conn *c)
{
    if (--c->refs == 0)
        conn_free(c);
}

/* Gives back a tenant key's place among its connections (hooks.key_released). */
static void key_released(server *s, int64_t key_id)
{
    if (s->hooks && s->hooks->key_released)
        s->hooks->key_released(s, key_id);
}

bool conn_alive(conn *c)
{
    return c->open && !c->closing;
}

void conn_close(conn *c)
{
    if (!c->open)
        return;
    c->open = false;
    if (c->auth.authenticated && !c->auth.admin)
        key_released(c->srv, c->auth.key_id);
    c->auth.authenticated = false;
    climits_addr_release(c->srv->limits_cl, c->addr_key);
    /* the unsent output goes with the socket */
    evbuffer_remove_cb(bufferevent_get_output(c->bev), on_output_change, c);
    climits_buffered(c->srv->limits_cl, -(long long)c->out_bytes);
    c->out_bytes = 0;
    if (c->ssl && c->tls_up && !c->tls_broken)
        tls_close_notify(c->ssl);
    conn_ref(c); /* the parked requests' ends must not free c under us */
    drop_parked(c);
    conn_unref(c);
    bufferevent_free(c->bev);
    c->bev = NULL;
    worker_conn_removed(c->w, c);
    metrics_connections(-1);
    atomic_fetch_sub(c->hx ? &c->srv->nhttp : &c->srv->nconns, 1);
    conn_unref(c);
}

/* libevent's read watermark suspends a TLS bufferevent in the middle of a record it has
 * decrypted, and resuming waits for the socket to become readable, which it may never do
 * again: over TLS the connection pauses itself instead, between callbacks, when OpenSSL
 * holds nothing decrypted. */
static bool input_full(conn *c)
{
    return c->ssl && evbuffer_get_length(bufferevent_get_input(c->bev)) >= READ_HIGH_WATER;
}

static void update_reading(conn *c)
{
    if (!c->open)
        return;
    bool want = !c->read_stopped && !c->closing && !c->paused && !input_full(c);
    if (want)
        bufferevent_enable(c->bev, EV_READ);
    else
        bufferevent_disable(c->bev, EV_READ);
}

void conn_close_after_flush(conn *c)
{
    if (!c->open || c->closing)
        return;
    c->closing = true;
    c->close_deadline_ms = mono_ms() + 5000;
    update_reading(c);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        conn_close(c);
}

void conn_stop_reading(conn *c)
{
    c->read_stopped = true;
    update_reading(c);
}

size_t conn_output_pending(conn *c)
{
    return c->open ? evbuffer_get_length(bufferevent_get_output(c->bev)) : 0;
}

const conn_auth *conn_get_auth(conn *c)
{
    return &c->auth;
}

void conn_set_auth(conn *c, const conn_auth *a)
{
    const net_hooks *h = c->srv->hooks;
    bool reserved = c->auth.reserved;
    if (c->auth.authenticated && !c->auth.admin)
        key_released(c->srv, c->auth.key_id);
    c->auth = *a;
    c->auth.reserved = reserved;
    if (a->authenticated && !a->admin && !a->claimed && h && h->key_in_use)
        h->key_in_use(c->srv, a->key_id, a->tenant_id, a->tier);
    c->auth.claimed = false;
}

void conn_hold(conn *c)
{
    c->held = true;
}

void conn_release(conn *c)
{
    if (!c->held)
        return;
    c->held = false;
    /* messages that arrived behind the barrier wait in c->in; dispatch them now, unless
     * the barrier ended inside process_input's own loop, which simply continues */
    if (c->open)
        process_input(c);
}

void conn_hold_decode(conn *c)
{
    c->decoding++;
}

void conn_release_decode(conn *c)
{
    if (c->decoding && --c->decoding == 0 && c->open)
        process_input(c);
}

bool conn_tls_client_cert(conn *c)
{
    return c->client_cert;
}

worker *conn_worker(conn *c)
{
    return c->w;
}

conn *conn_next(conn *c)
{
    return c->next;
}

void conn_link(conn **head, conn *c)
{
    c->prev = NULL;
    c->next = *head;
    if (*head)
        (*head)->prev = c;
    *head = c;
}

void conn_unlink(conn **head, conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        *head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

/* Reading pauses while too many requests are in flight or too much output is unsent: a
 * client that pipelines without reading responses cannot grow our memory. */
static void check_backpressure(conn *c)
{
    if (!c->open)
        return;
    size_t out = evbuffer_get_length(bufferevent_get_output(c->bev));
    bool authed = c->auth.authenticated;
    size_t max_out = authed ? (size_t)c->srv->cfg.max_output_bytes : PREAUTH_OUTPUT;
    unsigned max_in = authed ? (unsigned)c->srv->cfg.max_inflight_per_conn : PREAUTH_INFLIGHT;
    /* over the server-wide budget, nobody with unsent output is read */
    bool over = c->inflight >= max_in || out > max_out || c->budget_wait || c->park_head ||
                (out > 0 && climits_over(c->srv->limits_cl));
    if (over != c->paused) {
        c->paused = over;
        update_reading(c);
    }
}

/* The connection's own budget: max_output_bytes once authenticated. */
static size_t own_budget(const conn *c)
{
    return c->auth.authenticated ? (size_t)c->srv->cfg.max_output_bytes : PREAUTH_OUTPUT;
}

/* What dispatching a message of len bytes and `values` values costs before its answer. */
static size_t input_cost(size_t len, size_t values)
{
    return len + values * ZONE_BYTES_PER_VALUE;
}

/* Charges bytes to c and to the process when both budgets hold them beside what they hold.
 * A connection that holds nothing else (beside `own`, what the asking request was charged
 * already) may always have one request, and draws on the process's reserve for idle
 * connections (climits.h), so one client's unread answers never starve another's small
 * requests. Returns true when charged. */
static bool try_charge(conn *c, size_t bytes, size_t own)
{
    bool idle = c->charged == own && c->out_bytes == 0;
    if (!idle && c->out_bytes + c->charged + bytes > own_budget(c))
        return false;
    if (!climits_try_charge(c->srv->limits_cl, bytes, idle))
        return false;
    c->charged += bytes;
    return true;
}

bool conn_charge_more(conn *c, size_t bytes)
{
    if (c->out_bytes + c->charged + bytes > own_budget(c))
        return false;
    if (!climits_try_charge(c->srv->limits_cl, bytes, false))
        return false;
    c->charged += bytes;
    return true;
}

void conn_charge_force(conn *c, size_t bytes)
{
    climits_buffered(c->srv->limits_cl, (long long)bytes);
    c->charged += bytes;
}

void conn_uncharge(conn *c, size_t bytes)
{
    if (bytes > c->charged)
        bytes = c->charged;
    climits_buffered(c->srv->limits_cl, -(long long)bytes);
    c->charged -= bytes;
}

/* The load of method midx on c (allocated at the first use, for nmethods methods), or
 * NULL when out of memory or midx is not a method (no learning then). */
static method_load *load_of(conn *c, size_t midx, size_t nmethods)
{
    if (!c->load && nmethods > 0) {
        c->load = calloc(nmethods, sizeof(*c->load));
        c->nload = c->load ? nmethods : 0;
    }
    return midx < c->nload ? &c->load[midx] : NULL;
}

size_t conn_answer_reserve(conn *c, size_t midx, size_t nmethods, size_t need)
{
    size_t limit = (size_t)c->srv->cfg.max_result_bytes;
    const method_load *ml = load_of(c, midx, nmethods);
    size_t r = ml && ml->est > need ? ml->est : need;
    if (r < ANSWER_RESERVE)
        r = ANSWER_RESERVE;
    return r < limit ? r : limit;
}

/* Whether a request of method ml must wait for one of its method's answers first. */
static bool slow_start(const method_load *ml)
{
    return ml && ml->est == 0 && ml->running >= SLOW_START;
}

bool conn_admit(conn *c, struct req *r, size_t midx, size_t bytes, size_t own)
{
    method_load *ml = load_of(c, midx, 0);
    /* first come, first served: nothing passes a request that waits */
    if (!c->park_head && !slow_start(ml) && try_charge(c, bytes, own)) {
        if (ml)
            ml->running++;
        return true;
    }
    req_set_parked_next(r, NULL);
    if (c->park_tail)
        req_set_parked_next(c->park_tail, r);
    else
        c->park_head = r;
    c->park_tail = r;
    metrics_budget_wait();
    check_backpressure(c); /* reads nothing more until it runs */
    return false;
}

void conn_admit_force(conn *c, size_t midx, size_t bytes)
{
    method_load *ml = load_of(c, midx, 0);
    conn_charge_force(c, bytes);
    if (ml)
        ml->running++;
}

void conn_answer_done(conn *c, size_t midx, size_t bytes, bool measured)
{
    method_load *ml = load_of(c, midx, 0);
    if (!ml)
        return;
    if (ml->running)
        ml->running--;
    if (measured) {
        /* a decaying maximum: one large answer raises it at once, small ones wear it down */
        uint32_t b = bytes > UINT32_MAX ? UINT32_MAX : (uint32_t)bytes;
        uint32_t decayed = ml->est - ml->est / 8;
        ml->est = b > decayed ? b : decayed;
        if (ml->est == 0)
            ml->est = 1; /* seen */
    }
}

/* Starts the parked requests whose reservations now fit, oldest first. */
static void resume_parked(conn *c)
{
    if (c->resuming)
        return; /* a resumed request ended at once: the loop below goes on */
    c->resuming = true;
    conn_ref(c);
    while (c->open && c->park_head) {
        req *r = c->park_head;
        method_load *ml = load_of(c, req_method_index(r), 0);
        if (slow_start(ml) || !try_charge(c, req_parked_bytes(r), req_charged(r)))
            break;
        c->park_head = req_parked_next(r);
        if (!c->park_head)
            c->park_tail = NULL;
        req_set_parked_next(r, NULL);
        if (ml)
            ml->running++;
        req_resume(r);
    }
    c->resuming = false;
    conn_unref(c);
}

/* Budget was freed: parked requests start if they fit now, and the next attempt to dispatch
 * checks the budgets again. */
static void budget_changed(conn *c)
{
    resume_parked(c);
    if (c->budget_wait)
        c->budget_wait = false;
    check_backpressure(c);
}

void conn_write(conn *c, const void *data, size_t len)
{
    if (!c->open)
        return;
    if (c->hx) {
        hapi_on_response(c->hx, data, len);
        return;
    }
    conn_send(c, data, len);
}

void conn_send(conn *c, const void *data, size_t len)
{
    if (!c->open)
        return;
    if (evbuffer_add(bufferevent_get_output(c->bev), data, len) < 0) {
        log_warn("connection: cannot buffer a response (out of memory); closing");
        conn_close(c);
        return;
    }
    check_backpressure(c);
}

void conn_request_finished(conn *c)
{
    if (c->inflight)
        c->inflight--;
    if (!c->open)
        return;
    bool was_paused = c->paused;
    budget_changed(c);
    check_backpressure(c);
    /* HTTP answers one request at a time: the next one may be waiting in the buffer */
    if (c->hx && !c->paused) {
        process_input(c);
        return;
    }
    /* complete messages may be waiting in our buffer from before the pause */
    if (was_paused && !c->paused)
        process_input(c);
}

/* Moves up to what libevent has buffered into c->in, keeping the partial message at the
 * front. Returns the number of bytes moved, or -ENOMEM (-EIO when libevent refuses). */
static long pull_input(conn *c, size_t consumed)
{
    if (consumed) {
        memmove(c->in, c->in + consumed, c->in_len - consumed);
        c->in_len -= consumed;
    }
    struct evbuffer *input = bufferevent_get_input(c->bev);
    size_t avail = evbuffer_get_length(input);
    if (avail == 0)
        return 0;
    size_t limit = (size_t)c->srv->cfg.max_message_bytes + 65536;
    size_t room = c->in_len < limit ? limit - c->in_len : 0;
    size_t take = avail < room ? avail : room;
    if (take == 0)
        return 0;
    if (c->in_len + take > c->in_cap) {
        size_t cap = c->in_cap ? c->in_cap : 16384;
        while (cap < c->in_len + take)
            cap *= 2;
        uint8_t *n = realloc(c->in, cap);
        if (!n)
            return -ENOMEM;
        climits_buffered(c->srv->limits_cl, (long long)cap - (long long)c->in_cap);
        c->in = n;
        c->in_cap = cap;
    }
    int got = evbuffer_remove(input, c->in + c->in_len, take);
    if (got < 0)
        return -EIO;
    c->in_len += (size_t)got;
    return got;
}

/* What one step of process_input says: go on, or stop until something changes. */
enum { STEP_GO, STEP_STOP };

/* Reads more input after the consumed *off bytes (dropped). STEP_GO when bytes came,
 * STEP_STOP when none are there yet (the message deadline starts) or the read failed (the
 * connection is closed; what names the unit in the log). */
static int refill(conn *c, size_t *off, const char *what)
{
    long got = pull_input(c, *off);
    *off = 0;
    if (got < 0) {
        log_warn("connection: cannot read a %s (%s); closing", what, strerror((int)-got));
        conn_close(c);
        return STEP_STOP;
    }
    if (got == 0) {
        if (c->in_len > 0 && c->msg_started_ms == 0)
            c->msg_started_ms = mono_ms();
        return STEP_STOP;
    }
    return STEP_GO;
}

/* One step of an HTTP connection: hapi reads what it can of c->in from *off. */
static int step_http(conn *c, size_t *off)
{
    size_t used = 0;
    /* c->in is NULL until the first bytes arrive (a write or a release may come first):
     * no offset may be added to it then */
    const uint8_t *in = c->in ? c->in + *off : NULL;
    int st = hapi_step(c->hx, in, c->in_len - *off, &used);
    *off += used;
    if (used)
        c->msg_started_ms = 0;
    if (st == HAPI_AGAIN)
        return STEP_GO;
    if (st == HAPI_BUSY)
        return STEP_STOP;
    if (st == HAPI_CLOSE) {
        conn_close_after_flush(c);
        return STEP_STOP;
    }
    return refill(c, off, "request");
}

/* A malformed or hostile message at *off (err says why): tells the client when a msgid is
 * readable, then closes. */
static int refuse_malformed(conn *c, size_t off, const char *err)
{
    uint32_t msgid;
    if (rpc_peek_msgid(c->in + off, c->in_len - off, &msgid)) {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        rpc_pack_error(&pk, msgid, RPC_MALFORMED_REQUEST, err, NULL, 0);
        conn_write(c, sb.data, sb.size);
        msgpack_sbuffer_destroy(&sb);
    }
    log_debug("connection: closing after a malformed message: %s", err);
    metrics_malformed();
    conn_close_after_flush(c);
    return STEP_STOP;
}

/* Dispatches the framed message of mlen bytes and `values` values at *off once its cost is
 * charged; else it waits at the front of c->in until answers are read or requests end. */
static int dispatch_framed(conn *c, size_t *off, size_t mlen, size_t values)
{
    size_t cost = input_cost(mlen, values);
    if (!try_charge(c, cost, 0)) {
        if (*off) {
            memmove(c->in, c->in + *off, c->in_len - *off);
            c->in_len -= *off;
            *off = 0;
        }
        c->ready_len = mlen;
        c->ready_values = values;
        c->budget_wait = true;
        metrics_budget_wait();
        check_backpressure(c);
        return STEP_STOP;
    }
    c->ready_len = 0;
    c->inflight++;
    c->last_active_ms = mono_ms();
    c->msg_started_ms = 0;
    int d = req_dispatch(c, c->in + *off, mlen, values, cost);
    *off += mlen;
    if (d < 0) {
        metrics_malformed();
        conn_close_after_flush(c);
        return STEP_STOP;
    }
    return STEP_GO;
}

/* One step of an RPC connection: frames the next message of c->in from *off (or the one
 * that waited for budget) and dispatches it, or reads more. */
static int step_rpc(conn *c, size_t *off)
{
    size_t mlen = 0, values = 0;
    char err[256];
    int rc = RPC_E_INCOMPLETE;
    if (*off == 0 && c->ready_len) {
        /* framed before, and waiting for budget since */
        mlen = c->ready_len;
        values = c->ready_values;
        rc = 0;
    } else if (*off < c->in_len) {
        rc = rpc_scanner_scan(c->scan, c->in + *off, c->in_len - *off, &mlen, err, sizeof(err));
        values = rpc_scanner_last_objects(c->scan);
    }
    if (rc == 0)
        return dispatch_framed(c, off, mlen, values);
    if (rc == RPC_E_INCOMPLETE)
        return refill(c, off, "message");
    return refuse_malformed(c, *off, err);
}

/* Finds and dispatches every complete message, pulling input as needed, until input runs
 * out, the connection pauses, or it is closed. */
static void process_input(conn *c)
{
    size_t off = 0;
    if (c->processing)
        return; /* a request finished synchronously inside the loop below */
    c->processing = true;
    conn_ref(c);
    resume_parked(c);
    while (c->open && !c->closing && !c->read_stopped && !c->held && !c->decoding &&
           !c->budget_wait && !c->park_head) {
        unsigned max_in =
            c->auth.authenticated ? (unsigned)c->srv->cfg.max_inflight_per_conn : PREAUTH_INFLIGHT;
        if (c->inflight >= max_in) {
            check_backpressure(c);
            break;
        }
        /* unsent output over a budget: the messages already read wait too, or one read of
         * small requests with large answers would pass any budget many times over */
        if (c->paused)
            break;
        if ((c->hx ? step_http(c, &off) : step_rpc(c, &off)) == STEP_STOP)
            break;
    }
    if (c->open && off) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    if (c->ssl)
        update_reading(c); /* the input may have filled up or drained (input_full) */
    c->processing = false;
    conn_unref(c);
}

int conn_dispatch(conn *c, const uint8_t *msg, size_t len)
{
    /* HTTP: one request at a time, built here from JSON, whose values the scanner counts;
     * charged whatever the budgets say, since HTTP has no pipelining to hold back (its
     * answer still waits for budget like any other: conn_charge_more) */
    size_t mlen = 0, values = len;
    if (rpc_scanner_scan(c->scan, msg, len, &mlen, NULL, 0) == 0 && mlen == len)
        values = rpc_scanner_last_objects(c->scan);
    rpc_scanner_reset(c->scan);
    size_t cost = input_cost(len, values);
    conn_charge_force(c, cost);
    c->inflight++;
    c->last_active_ms = mono_ms();
    return req_dispatch(c, msg, len, values, cost);
}

server *conn_server(conn *c)
{
    return c->srv;
}

static void on_read(struct bufferevent *bev, void *arg)
{
    process_input(arg);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    conn *c = arg;
    if (c->closing) {
        if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
            conn_close(c);
        return;
    }
    bool was_paused = c->paused;
    budget_changed(c);
    check_backpressure(c);
    if (was_paused && !c->paused)
        process_input(c);
}

/* The handshake completed: note whether the client proved who it is. */
static void tls_established(conn *c)
{
    c->tls_up = true;
    c->client_cert = tls_client_verified(c->ssl);
    if (c->client_cert && log_enabled(LOG_DEBUG)) {
        char subject[256];
        tls_client_subject(c->ssl, subject, sizeof(subject));
        log_debug("connection: TLS client certificate %s", subject);
    }
}

/* The first of OpenSSL's reasons for a failed session, or the socket's error. */
static void tls_failure_text(conn *c, char *buf, size_t n)
{
    unsigned long e, first = 0;
    /* popped newest first; libevent adds SSL_get_error's small code (SSL_ERROR_SSL, ...)
     * among OpenSSL's packed reasons, which are all larger */
    while ((e = bufferevent_get_openssl_error(c->bev)) != 0)
        if (e > 0xff)
            first = e;
    if (first)
        tls_error_text(first, buf, n);
    else if (EVUTIL_SOCKET_ERROR())
        snprintf(buf, n, "%s", strerror(EVUTIL_SOCKET_ERROR()));
    else
        snprintf(buf, n, "the client closed the connection");
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    conn *c = arg;
    if ((what & BEV_EVENT_CONNECTED) && c->ssl) {
        tls_established(c);
        return;
    }
    if (c->ssl && (what & BEV_EVENT_ERROR))
        c->tls_broken = true;
    if (c->ssl && !c->tls_up && (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))) {
        char why[256];
        tls_failure_text(c, why, sizeof(why));
        log_debug("connection: TLS handshake failed: %s", why);
        metrics_tls_handshake_failed();
        conn_close(c);
        return;
    }
    if (what & BEV_EVENT_ERROR) {
        if (c->ssl) {
            char why[256];
            tls_failure_text(c, why, sizeof(why));
            log_debug("connection: TLS error: %s", why);
        } else {
            log_debug("connection: socket error: %s", strerror(EVUTIL_SOCKET_ERROR()));
        }
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        conn_close(c);
}

void conn_tick(conn *c, uint64_t now)
{
    if (!c->open)
        return;
    const config *cfg = &c->srv->cfg;
    if (c->closing && now >= c->close_deadline_ms) {
        conn_close(c);
        return;
    }
    /* a TLS handshake must finish by the auth deadline below, or within frame_timeout_ms
     * when there is none */
    if (c->ssl && !c->tls_up && cfg->auth_timeout_s == 0 &&
        now - c->opened_ms > (uint64_t)cfg->frame_timeout_ms) {
        log_debug("connection: TLS handshake not completed within %d ms; closing",
                  cfg->frame_timeout_ms);
        metrics_tls_handshake_failed();
        metrics_slow_closed();
        conn_close(c);
        return;
    }
    /* a TLS record that is still arriving delivers no byte of the message inside it until
     * its last byte is in: count it as a message started, or a client trickling one record
     * would escape both checks below */
    if (c->ssl && c->tls_up && c->msg_started_ms == 0 && c->in_len == 0) {
        /* only while the connection reads: a record waits half-read when we stopped */
        bool reading = !c->paused && !c->held && !c->read_stopped && !c->closing && !input_full(c);
        if (reading && tls_partial_record(c->ssl)) {
            if (c->rec_started_ms == 0)
                c->rec_started_ms = now;
        } else {
            c->rec_started_ms = 0;
        }
    } else {
        c->rec_started_ms = 0;
    }
    uint64_t started = c->msg_started_ms ? c->msg_started_ms : c->rec_started_ms;
    /* bufferevent timeouts reset on every byte; a message must finish by an absolute
     * deadline however slowly it trickles in */
    if (started && now - started > (uint64_t)cfg->frame_timeout_ms) {
        log_debug("connection: message not completed within %d ms; closing", cfg->frame_timeout_ms);
        metrics_slow_closed();
        if (c->hx && (!c->ssl || c->tls_up) && hapi_timeout(c->hx)) {
            /* 408 went out: close once it is sent */
            c->msg_started_ms = c->rec_started_ms = 0;
            conn_close_after_flush(c);
            return;
        }
        conn_close(c);
        return;
    }
    /* a sender trickling bytes holds a slot for nothing: after a grace period it must keep
     * min_send_rate for the message it is sending */
    if (started && cfg->min_send_rate > 0 && now - started > GRACE_MS) {
        size_t got = c->in_len + evbuffer_get_length(bufferevent_get_input(c->bev));
        double rate = (double)got * 1000.0 / (double)(now - started);
        if (rate < (double)cfg->min_send_rate) {
            log_debug("connection: sending %.0f bytes/s, below %d; closing", rate,
                      cfg->min_send_rate);
            metrics_slow_closed();
            conn_close(c);
            return;
        }
    }
    /* an HTTP connection authenticates each request (its bearer key), not the connection:
     * it has the same time to deliver its first request instead */
    if ((c->hx ? !hapi_had_request(c->hx) : !c->auth.authenticated) && cfg->auth_timeout_s > 0 &&
        now - c->opened_ms > (uint64_t)cfg->auth_timeout_s * 1000u) {
        log_debug("connection: not authenticated (HTTP: no request) within %d s; closing",
                  cfg->auth_timeout_s);
        if (c->ssl && !c->tls_up)
            metrics_tls_handshake_failed();
        metrics_slow_closed();
        conn_close(c);
        return;
    }
    /* A client reading slowly takes bytes from the kernel's send queue long before libevent
     * can write more into it (loopback queues hold megabytes): that is progress too, so a
     * slow reader is throttled by the budgets, never taken for a stalled one. */
    if (c->out_bytes > 0) {
        int q = 0;
        if (ioctl(bufferevent_getfd(c->bev), SIOCOUTQ, &q) == 0) {
            if (q < c->sndq)
                c->out_progress_ms = now;
            c->sndq = q;
        }
    }
    /* over the server-wide budget: a client that takes none of a large output goes */
    if (c->out_bytes >= HOG_OUTPUT && now - c->out_progress_ms > STALL_MS &&
        climits_pressed(c->srv->limits_cl, now)) {
        log_info("connection: %zu bytes of answers unread for %d s while the server's "
                 "buffers are over budget; closing",
                 c->out_bytes, STALL_MS / 1000);
        metrics_slow_closed();
        conn_close(c);
        return;
    }
    /* when the budget frees up, connections paused by it read again, starting with the
     * messages that waited in their buffer */
    if ((c->paused || c->park_head || c->budget_wait) && !climits_over(c->srv->limits_cl)) {
        budget_changed(c);
        check_backpressure(c);
        if (!c->paused)
            process_input(c);
    }
    if (cfg->idle_timeout_s > 0 && c->inflight == 0 && c->in_len == 0 &&
        now - c->last_active_ms > (uint64_t)cfg->idle_timeout_s * 1000u) {
        log_debug("connection: idle for %d s; closing", cfg->idle_timeout_s);
        conn_close(c);
    }
}

conn *conn_create(worker *w, int fd, uint64_t addr_key, bool http, bool reserved)
{
    conn *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return NULL;
    }
    c->w = w;
    c->srv = worker_server(w);
    c->addr_key = addr_key;
    c->auth.reserved = reserved;
    c->refs = 1; /* the open socket's reference */
    c->scan = rpc_scanner_create(&c->srv->limits);
    int one = 1;
    if (http && !(c->hx = hapi_create(c)))
        goto fail;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    evutil_make_socket_nonblocking(fd);
    if (!c->scan)
        goto fail;
    if (c->srv->tls) {
        c->ssl = tls_session_new(c->srv->tls);
        if (!c->ssl)
            goto fail;
        /* the bufferevent owns the session and the socket from here, even when it fails:
         * libevent frees both on most of its failure paths and we cannot tell which */
        c->bev = bufferevent_openssl_socket_new(worker_base(w), fd, c->ssl,
                                                BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
        if (!c->bev) {
            rpc_scanner_destroy(c->scan);
            hapi_destroy(c->hx);
            free(c);
            return NULL;
        }
        /* a peer that closes without close_notify ends the stream like any other EOF: every
         * message is self-delimiting, so a truncation shows as an incomplete message */
        bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
    } else {
        c->bev = bufferevent_socket_new(worker_base(w), fd, BEV_OPT_CLOSE_ON_FREE);
        if (!c->bev)
            goto fail;
    }
    c->open = true;
    c->last_active_ms = c->opened_ms = c->out_progress_ms = mono_ms();
    evbuffer_add_cb(bufferevent_get_output(c->bev), on_output_change, c);
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    if (!c->ssl)
        bufferevent_setwatermark(c->bev, EV_READ, 0, READ_HIGH_WATER);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    worker_conn_added(w, c);
    metrics_connections(1);
    return c;

fail:
    close(fd);
    rpc_scanner_destroy(c->scan);
    hapi_destroy(c->hx);
    free(c);
    return NULL;
}
