/* bench/loadgen.c: the asynchronous load generator (see loadgen.h).
 *
 * Plain non-blocking sockets under libevent `event`s rather than bufferevents: a request is
 * written by a direct write() as soon as it is packed, so its send timestamp is the time it
 * reaches the kernel, not the time a deferred callback gets round to it.
 */
#include "loadgen.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#define READ_CHUNK 65536
#define IN_MAX ((size_t)64 * 1024 * 1024)
#define OP_AUTH (-1)

enum { C_CONNECTING, C_AUTH, C_RUN, C_DONE, C_BROKEN };

typedef struct slot {
    bool busy;
    uint32_t msgid;
    uint64_t t_send;
    loadgen_req req;
} slot;

typedef struct lg_conn lg_conn;

typedef struct lg {
    const loadgen_conf *conf;
    loadgen_result *res;
    struct event_base *base;
    struct event *t_window, *t_end, *t_drain;
    lg_conn *conns;
    msgpack_zone zone;
    size_t authed, active;
    size_t inflight; /* over every connection (for max_inflight) */
    size_t rr;       /* the connection that gets the next free place (max_inflight) */
    size_t cap;      /* fill() sends while inflight is below this (0: no bound) */
    bool running, measuring, stopping;
    uint64_t m_start, m_end; /* window bounds; m_end 0 while open */
    int fatal;               /* 0, or 1 / -errno with err set */
    char *err;
    size_t errlen;
} lg;

struct lg_conn {
    lg *g;
    size_t index;
    int fd;
    int state;
    bool exhausted;
    struct event *rev, *wev;
    uint8_t *in;
    size_t in_len, in_cap;
    rpc_scanner *sc;
    char *out; /* pending output: out[out_off .. out_len) */
    size_t out_off, out_len, out_cap;
    bool out_failed;
    uint32_t next_msgid;
    slot slots[LOADGEN_MAX_DEPTH];
    size_t inflight;
    size_t auth_msgid;
};

uint64_t loadgen_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

const char *loadgen_err_name(int e)
{
    if (e > 0 && e < RPC_CODE_COUNT)
        return rpc_code_name((rpc_code)e);
    if (e == LOADGEN_ERR_CHECK)
        return "check_failed";
    return "other";
}

static void fail(lg *g, int rc, const char *fmt, const char *detail)
{
    if (g->fatal)
        return;
    g->fatal = rc;
    snprintf(g->err, g->errlen, fmt, detail);
    event_base_loopbreak(g->base);
}

/* ---- output ------------------------------------------------------------------------ */

/* msgpack write callback: append to the pending output. Failure is remembered. */
static int out_write(void *data, const char *buf, size_t len)
{
    lg_conn *c = data;
    if (c->out_len + len > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 65536;
        while (cap < c->out_len + len)
            cap *= 2;
        char *p = realloc(c->out, cap);
        if (!p) {
            c->out_failed = true;
            return -1;
        }
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, buf, len);
    c->out_len += len;
    return 0;
}

static void conn_broken(lg_conn *c, const char *why);

/* Writes what is pending; arms the write event while something remains. */
static void flush(lg_conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (n > 0) {
            c->out_off += (size_t)n;
            c->g->res->bytes_out += (uint64_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_add(c->wev, NULL);
            return;
        }
        conn_broken(c, strerror(errno));
        return;
    }
    c->out_off = c->out_len = 0;
    event_del(c->wev);
}

static bool in_window(const lg *g, uint64_t t)
{
    return g->measuring && t >= g->m_start && (g->m_end == 0 || t < g->m_end);
}

/* Sends requests until the connection's slots are full or its source is exhausted. */
static void fill(lg_conn *c)
{
    lg *g = c->g;
    const loadgen_conf *cf = g->conf;
    if (c->state != C_RUN || g->stopping || !g->running)
        return;
    size_t newslots[LOADGEN_MAX_DEPTH], nnew = 0;
    msgpack_packer pk;
    msgpack_packer_init(&pk, c, out_write);
    while (!c->exhausted && c->inflight < cf->depth && (!g->cap || g->inflight < g->cap)) {
        size_t s = 0;
        while (c->slots[s].busy)
            s++;
        slot *sl = &c->slots[s];
        uint32_t msgid = c->next_msgid++;
        size_t mark = c->out_len;
        int rc = cf->next(cf->ud, c->index, msgid, &pk, &sl->req);
        if (rc < 0 || c->out_failed) {
            fail(g, rc < 0 ? rc : -ENOMEM, "the workload could not build a request: %s",
                 strerror(rc < 0 ? -rc : ENOMEM));
            return;
        }
        if (rc == 0) {
            c->out_len = mark;
            c->exhausted = true;
            break;
        }
        sl->busy = true;
        sl->msgid = msgid;
        c->inflight++;
        g->inflight++;
        newslots[nnew++] = s;
    }
    if (nnew) {
        uint64_t now = loadgen_now_ns();
        for (size_t i = 0; i < nnew; i++) {
            slot *sl = &c->slots[newslots[i]];
            sl->t_send = now;
            if (in_window(g, now))
                g->res->ops[sl->req.op].sent++;
        }
        flush(c);
    }
}

/* With max_inflight: hands the free places to the connections in turn, one request each,
 * from where the last turn stopped. */
static void fill_turns(lg *g)
{
    const loadgen_conf *cf = g->conf;
    size_t n = cf->conns, tried = 0;
    while (g->inflight < cf->max_inflight && tried < n && !g->fatal) {
        lg_conn *c = &g->conns[g->rr];
        g->rr = (g->rr + 1) % n;
        tried++;
        if (c->state != C_RUN || c->exhausted || c->inflight >= cf->depth)
            continue;
        size_t before = g->inflight;
        g->cap = before + 1; /* one request from this connection */
        fill(c);
        g->cap = cf->max_inflight;
        if (g->inflight > before)
            tried = 0;
    }
}

/* ---- completion -------------------------------------------------------------------- */

static void check_finished(lg *g)
{
    if (g->active == 0)
        event_base_loopbreak(g->base);
}

/* A connection that will send nothing more and has nothing in flight is done. */
static void maybe_done(lg_conn *c)
{
    lg *g = c->g;
    if (c->state != C_RUN || c->inflight > 0)
        return;
    if (!(g->stopping || c->exhausted))
        return;
    c->state = C_DONE;
    g->active--;
    if (g->conf->duration_s <= 0 && g->active == 0 && g->measuring && g->m_end == 0) {
        g->m_end = loadgen_now_ns();
        if (g->conf->window)
            g->conf->window(g->conf->ud, false);
    }
    check_finished(g);
}

static void conn_broken(lg_conn *c, const char *why)
{
    lg *g = c->g;
    if (c->state == C_BROKEN || c->state == C_DONE)
        return;
    int was = c->state;
    c->state = C_BROKEN;
    event_del(c->rev);
    event_del(c->wev);
    g->res->conn_errors++;
    for (size_t s = 0; s < LOADGEN_MAX_DEPTH; s++) {
        if (c->slots[s].busy && in_window(g, c->slots[s].t_send))
            g->res->unanswered++;
        c->slots[s].busy = false;
    }
    g->inflight -= c->inflight;
    c->inflight = 0;
    if (was != C_RUN) {
        fail(g, 1, "connection failed before the run: %s", why);
        return;
    }
    fprintf(stderr, "engram-bench: connection %zu broke: %s\n", c->index, why);
    g->active--;
    if (g->active == 0 && !g->stopping && g->conf->duration_s > 0)
        fail(g, 1, "every connection broke: %s", why);
    check_finished(g);
}

static void start_run(lg *g);

/* The error code of an error response, as an error class. */
static int err_class(const msgpack_object *error)
{
    const msgpack_object *code = rpc_map_get(error, "code");
    if (!code || code->type != MSGPACK_OBJECT_STR)
        return LOADGEN_ERR_OTHER;
    for (int e = 1; e < RPC_CODE_COUNT; e++)
        if (rpc_str_eq(code, rpc_code_name((rpc_code)e)))
            return e;
    return LOADGEN_ERR_OTHER;
}

static void on_response(lg_conn *c, const rpc_response *r, uint64_t t_recv)
{
    lg *g = c->g;
    const loadgen_conf *cf = g->conf;
    if (c->state == C_AUTH) {
        if (r->msgid != c->auth_msgid) {
            conn_broken(c, "response to a request never sent");
            return;
        }
        if (r->error) {
            const msgpack_object *m = rpc_map_get(r->error, "message");
            char msg[200] = "auth failed";
            if (m && m->type == MSGPACK_OBJECT_STR)
                snprintf(msg, sizeof(msg), "%.*s", (int)m->via.str.size, m->via.str.ptr);
            fail(g, 1, "auth failed: %s", msg);
            return;
        }
        c->state = C_RUN;
        if (++g->authed == cf->conns)
            start_run(g);
        return;
    }
    size_t s = 0;
    while (s < LOADGEN_MAX_DEPTH && !(c->slots[s].busy && c->slots[s].msgid == r->msgid))
        s++;
    if (s == LOADGEN_MAX_DEPTH) {
        conn_broken(c, "response to a request never sent");
        return;
    }
    slot *sl = &c->slots[s];
    bool measured = in_window(g, sl->t_send);
    int rc = cf->done(cf->ud, c->index, &sl->req, r, measured);
    loadgen_opstats *st = &g->res->ops[sl->req.op];
    if (measured) {
        if (r->error) {
            int e = err_class(r->error);
            st->errors++;
            st->err_by[e]++;
        } else if (rc != 0) {
            st->errors++;
            st->err_by[LOADGEN_ERR_CHECK]++;
        } else {
            st->ok++;
            hist_record(st->lat, t_recv - sl->t_send);
        }
    }
    if (!r->error && rc == 0 && in_window(g, t_recv))
        st->done_in_window++;
    sl->busy = false;
    c->inflight--;
    g->inflight--;
}

/* ---- events ------------------------------------------------------------------------ */

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    lg_conn *c = arg;
    lg *g = c->g;
    if (c->in_cap - c->in_len < READ_CHUNK) {
        size_t cap = c->in_cap ? c->in_cap * 2 : 2 * READ_CHUNK;
        if (cap > IN_MAX + READ_CHUNK) {
            conn_broken(c, "response larger than 64 MiB");
            return;
        }
        uint8_t *p = realloc(c->in, cap);
        if (!p) {
            conn_broken(c, "out of memory");
            return;
        }
        c->in = p;
        c->in_cap = cap;
    }
    ssize_t n = read(fd, c->in + c->in_len, c->in_cap - c->in_len);
    uint64_t t_recv = loadgen_now_ns();
    if (n == 0) {
        conn_broken(c, "the server closed the connection");
        return;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            conn_broken(c, strerror(errno));
        return;
    }
    g->res->bytes_in += (uint64_t)n;
    c->in_len += (size_t)n;
    size_t off = 0;
    while (off < c->in_len && (c->state == C_AUTH || c->state == C_RUN)) {
        size_t mlen = 0;
        char err[160];
        int rc = rpc_scanner_scan(c->sc, c->in + off, c->in_len - off, &mlen, err, sizeof(err));
        if (rc == RPC_E_INCOMPLETE)
            break;
        if (rc != 0) {
            conn_broken(c, err);
            return;
        }
        rpc_response r;
        rc = rpc_decode_response(c->in + off, mlen, &g->zone, &r, err, sizeof(err));
        if (rc != 0) {
            msgpack_zone_clear(&g->zone);
            conn_broken(c, rc == -ENOMEM ? "out of memory" : err);
            return;
        }
        on_response(c, &r, t_recv);
        msgpack_zone_clear(&g->zone);
        off += mlen;
        if (g->fatal)
            return;
    }
    if (off > 0) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    if (g->conf->max_inflight)
        fill_turns(g);
    else
        fill(c);
    maybe_done(c);
}

static void send_auth(lg_conn *c)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, c, out_write);
    c->auth_msgid = c->next_msgid;
    rpc_pack_request_begin(&pk, c->next_msgid++, "auth", true);
    msgpack_pack_map(&pk, 1);
    rpc_pack_kv_str(&pk, "api_key", c->g->conf->keys[c->index]);
    if (c->out_failed) {
        fail(c->g, -ENOMEM, "%s", "out of memory");
        return;
    }
    c->state = C_AUTH;
    flush(c);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    lg_conn *c = arg;
    if (c->state == C_CONNECTING) {
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
            conn_broken(c, strerror(soerr ? soerr : errno));
            return;
        }
        event_del(c->wev);
        send_auth(c);
        return;
    }
    flush(c);
}

static struct timeval tv_of(double s)
{
    struct timeval tv = {(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)};
    return tv;
}

static void on_window_open(evutil_socket_t fd, short what, void *arg)
{
    lg *g = arg;
    if (g->conf->window)
        g->conf->window(g->conf->ud, true);
    g->m_start = loadgen_now_ns();
    g->measuring = true;
    /* the window closes duration_s after it opened, however late the loop got here (a
     * busy machine delayed the opening timer by 0.3 s and the window was that much short).
     * The timer counts from the loop's cached time, taken before this round's callbacks:
     * refreshed first, or a long round makes the window that much short (1.16 s of 1.5 in a
     * CI-equivalent run) */
    if (g->conf->duration_s > 0) {
        event_base_update_cache_time(g->base);
        struct timeval te = tv_of(g->conf->duration_s);
        evtimer_add(g->t_end, &te);
    }
}

static void on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    lg *g = arg;
    for (size_t i = 0; i < g->conf->conns; i++) {
        lg_conn *c = &g->conns[i];
        for (size_t s = 0; s < LOADGEN_MAX_DEPTH; s++)
            if (c->slots[s].busy && in_window(g, c->slots[s].t_send))
                g->res->unanswered++;
    }
    fprintf(stderr, "engram-bench: %llu requests still unanswered after the drain timeout\n",
            (unsigned long long)g->res->unanswered);
    event_base_loopbreak(g->base);
}

static void on_window_close(evutil_socket_t fd, short what, void *arg)
{
    lg *g = arg;
    g->m_end = loadgen_now_ns();
    g->stopping = true;
    if (g->conf->window)
        g->conf->window(g->conf->ud, false);
    double dt = g->conf->drain_timeout_s > 0 ? g->conf->drain_timeout_s : 30.0;
    struct timeval tv = {(time_t)dt, (suseconds_t)((dt - (double)(time_t)dt) * 1e6)};
    evtimer_add(g->t_drain, &tv);
    for (size_t i = 0; i < g->conf->conns; i++)
        maybe_done(&g->conns[i]);
}

static void start_run(lg *g)
{
    const loadgen_conf *cf = g->conf;
    g->running = true;
    g->active = cf->conns;
    g->cap = cf->max_inflight;
    if (cf->duration_s > 0) {
        double w = cf->warmup_s > 0 ? cf->warmup_s : 0;
        struct timeval tw = tv_of(w);
        if (w > 0)
            evtimer_add(g->t_window, &tw); /* it arms the window's end */
        else
            on_window_open(-1, 0, g);
    } else {
        on_window_open(-1, 0, g);
    }
    if (cf->max_inflight)
        fill_turns(g);
    for (size_t i = 0; i < cf->conns && !g->fatal; i++) {
        if (!cf->max_inflight)
            fill(&g->conns[i]);
        maybe_done(&g->conns[i]);
    }
}

/* ---- setup ------------------------------------------------------------------------- */

static int open_socket(const struct addrinfo *ai, int *out)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return -e;
    }
    *out = fd;
    return 0;
}

int loadgen_run(const loadgen_conf *conf, loadgen_result *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof(*res));
    if (!conf->conns || !conf->depth || conf->depth > LOADGEN_MAX_DEPTH || !conf->nops ||
        conf->nops > LOADGEN_MAX_OPS || !conf->next || !conf->done || !conf->keys) {
        snprintf(err, errlen, "invalid load generator configuration");
        return -EINVAL;
    }
    int rc = -ENOMEM;
    lg g;
    memset(&g, 0, sizeof(g));
    g.conf = conf;
    g.res = res;
    g.err = err;
    g.errlen = errlen;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)conf->port);
    msgpack_zone_init(&g.zone, 65536);
    for (size_t o = 0; o < conf->nops; o++)
        if (!(res->ops[o].lat = hist_create()))
            goto out;
    int gai = getaddrinfo(conf->host, port, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", conf->host, gai_strerror(gai));
        rc = 1;
        goto out;
    }
    g.base = event_base_new();
    g.conns = calloc(conf->conns, sizeof(*g.conns));
    if (!g.base || !g.conns)
        goto out;
    g.t_window = evtimer_new(g.base, on_window_open, &g);
    g.t_end = evtimer_new(g.base, on_window_close, &g);
    g.t_drain = evtimer_new(g.base, on_drain_timeout, &g);
    if (!g.t_window || !g.t_end || !g.t_drain)
        goto out;
    for (size_t i = 0; i < conf->conns; i++) {
        lg_conn *c = &g.conns[i];
        c->g = &g;
        c->index = i;
        c->fd = -1;
        c->next_msgid = 1;
    }
    for (size_t i = 0; i < conf->conns; i++) {
        lg_conn *c = &g.conns[i];
        if (!(c->sc = rpc_scanner_create(NULL)))
            goto out;
        int orc = open_socket(ai, &c->fd);
        if (orc != 0) {
            snprintf(err, errlen, "cannot connect to %s:%u: %s", conf->host, (unsigned)conf->port,
                     strerror(-orc));
            rc = 1;
            goto out;
        }
        c->rev = event_new(g.base, c->fd, EV_READ | EV_PERSIST, on_read, c);
        c->wev = event_new(g.base, c->fd, EV_WRITE | EV_PERSIST, on_write, c);
        if (!c->rev || !c->wev)
            goto out;
        c->state = C_CONNECTING;
        event_add(c->rev, NULL);
        event_add(c->wev, NULL);
    }
    event_base_dispatch(g.base);
    if (g.fatal) {
        rc = g.fatal;
        goto out;
    }
    if (!g.running) {
        snprintf(err, errlen, "the run never started");
        rc = 1;
        goto out;
    }
    if (g.m_end == 0)
        g.m_end = loadgen_now_ns();
    res->window_s = (double)(g.m_end - g.m_start) / 1e9;
    {
        /* the window in wall-clock time, for matching it with samples taken elsewhere */
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        uint64_t now_rt = (uint64_t)rt.tv_sec * 1000000000ULL + (uint64_t)rt.tv_nsec;
        uint64_t now_mono = loadgen_now_ns();
        res->window_unix_ns[0] = now_rt - (now_mono - g.m_start);
        res->window_unix_ns[1] = now_rt - (now_mono - g.m_end);
    }
    rc = 0;
out:
    if (rc == -ENOMEM && err[0] == '\0')
        snprintf(err, errlen, "out of memory");
    if (g.conns) {
        for (size_t i = 0; i < conf->conns; i++) {
            lg_conn *c = &g.conns[i];
            if (c->rev)
                event_free(c->rev);
            if (c->wev)
                event_free(c->wev);
            if (c->fd >= 0)
                close(c->fd);
            rpc_scanner_destroy(c->sc);
            free(c->in);
            free(c->out);
        }
        free(g.conns);
    }
    if (g.t_window)
        event_free(g.t_window);
    if (g.t_end)
        event_free(g.t_end);
    if (g.t_drain)
        event_free(g.t_drain);
    if (g.base)
        event_base_free(g.base);
    if (ai)
        freeaddrinfo(ai);
    msgpack_zone_destroy(&g.zone);
    if (rc != 0)
        loadgen_result_fini(res);
    return rc;
}

void loadgen_result_fini(loadgen_result *res)
{
    for (size_t o = 0; o < LOADGEN_MAX_OPS; o++) {
        hist_destroy(res->ops[o].lat);
        res->ops[o].lat = NULL;
    }
}
