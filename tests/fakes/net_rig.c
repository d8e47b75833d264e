/* tests/fakes/net_rig.c: one worker of the network layer driven by the caller (see
 * net_rig.h). */
#include "net_rig.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/sockios.h>

#include <event2/event.h>

#include "climits.h"
#include "fake_db.h"
#include "metrics.h"
#include "sql.h"
#include "tiers.h"

#define MAX_CLIENTS 64
/* turns of the loop with nothing new before the rig calls it idle, and the most it runs */
#define QUIET_TURNS 4
#define MAX_TURNS 100000

struct net_rig {
    server srv;
    worker *w;
    const char **names;
    tier_limits tiers[TIER_COUNT];
    int clients[MAX_CLIENTS];
    size_t nclients;
    int sndbuf;
};

net_rig *net_rig_create(const net_hooks *hooks, const char *const *settings,
                        int (*setup)(server *s, void *arg), void *arg)
{
    /* as main does: a client that went makes a write fail, not end the process */
    signal(SIGPIPE, SIG_IGN);
    net_rig *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    server *s = &r->srv;
    const char *argv[64] = {"engramd", "--pg-dsn=fake (tests/fakes/fake_db.c)",
                            "--decode-threads=0", "--workers=1"};
    int argc = 4;
    for (size_t i = 0; settings && settings[i] && argc < 63; i++)
        argv[argc++] = settings[i];
    bool exit_now = false;
    if (config_load(&s->cfg, argc, (char **)argv, stdout, stderr, &exit_now) < 0 || exit_now) {
        fprintf(stderr, "net_rig: the settings do not load\n");
        free(r);
        return NULL;
    }
    rpc_limits_default(&s->limits);
    s->limits.max_message = (size_t)s->cfg.max_message_bytes;
    s->limits.max_depth = (unsigned)s->cfg.max_depth;
    tiers_from_config(&s->cfg, r->tiers);
    atomic_store(&s->tiers, r->tiers);
    s->hooks = hooks;
    r->names = calloc(hooks->nmethods + 1, sizeof(*r->names));
    for (size_t i = 0; r->names && i < hooks->nmethods; i++)
        r->names[i] = hooks->methods[i].name;
    s->limits_cl = climits_create(&s->cfg);
    if (!r->names || !s->limits_cl || metrics_init(r->names, hooks->nmethods) < 0 ||
        sql_init() < 0) {
        fprintf(stderr, "net_rig: out of memory\n");
        goto fail;
    }
    if (setup && setup(s, arg) < 0) {
        fprintf(stderr, "net_rig: the program's setup failed\n");
        goto fail;
    }
    s->nworkers = 1;
    s->workers = &r->w;
    r->w = worker_create(s, 0);
    if (!r->w) {
        fprintf(stderr, "net_rig: worker_create failed\n");
        goto fail;
    }
    atomic_store(&s->ready, true);
    return r;
fail:
    net_rig_destroy(r);
    return NULL;
}

void net_rig_destroy(net_rig *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nclients; i++)
        close(r->clients[i]);
    r->nclients = 0;
    if (r->w) {
        /* the connections see EOF; what they answer on the way out is dropped */
        net_rig_pump(r, NULL, NULL);
        worker_destroy(r->w);
    }
    climits_destroy(r->srv.limits_cl);
    metrics_fini();
    sql_fini();
    config_free(&r->srv.cfg);
    free(r->names);
    free(r);
}

server *net_rig_server(net_rig *r)
{
    return &r->srv;
}

worker *net_rig_worker(net_rig *r)
{
    return r->w;
}

int net_rig_connect(net_rig *r, bool http, bool reserved, conn **c)
{
    int sv[2];
    if (r->nclients == MAX_CLIENTS ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        return -1;
    if (r->sndbuf > 0)
        setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &r->sndbuf, sizeof(r->sndbuf));
    /* counted as worker_accept counts an accepted socket; the connection gives it back */
    atomic_fetch_add(http ? &r->srv.nhttp : &r->srv.nconns, 1);
    conn *sc = conn_create(r->w, sv[0], 0, http, reserved);
    if (!sc) {
        atomic_fetch_sub(http ? &r->srv.nhttp : &r->srv.nconns, 1);
        close(sv[1]);
        return -1;
    }
    if (c)
        *c = sc;
    r->clients[r->nclients++] = sv[1];
    return sv[1];
}

void net_rig_set_sndbuf(net_rig *r, int bytes)
{
    r->sndbuf = bytes;
}

void net_rig_close(net_rig *r, int fd)
{
    for (size_t i = 0; i < r->nclients; i++)
        if (r->clients[i] == fd) {
            r->clients[i] = r->clients[--r->nclients];
            close(fd);
            return;
        }
}

/* What the clients see and the fake database did: the loop made progress when it changed. */
static uint64_t fingerprint(net_rig *r)
{
    uint64_t h = fake_db_submitted() * 1000003u + fake_db_answered();
    for (size_t i = 0; i < r->nclients; i++) {
        int in = 0, out = 0;
        ioctl(r->clients[i], FIONREAD, &in);  /* answers not read yet */
        ioctl(r->clients[i], SIOCOUTQ, &out); /* bytes the server has not read yet */
        h = h * 31 + (uint64_t)in;
        h = h * 31 + (uint64_t)out;
    }
    return h;
}

unsigned net_rig_pump(net_rig *r, net_rig_between between, void *arg)
{
    struct event_base *base = worker_base(r->w);
    uint64_t last = fingerprint(r);
    unsigned quiet = 0, turns = 0;
    while (quiet < QUIET_TURNS && turns < MAX_TURNS) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        turns++;
        bool moved = between && between(arg);
        uint64_t now = fingerprint(r);
        if (moved || now != last) {
            quiet = 0;
            last = now;
        } else {
            quiet++;
        }
    }
    return turns;
}

int net_rig_send(net_rig *r, int fd, const void *data, size_t n)
{
    const char *p = data;
    unsigned stuck = 0;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            stuck = 0;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        /* the socket is full: let the server read (it may have stopped: then give up) */
        net_rig_pump(r, NULL, NULL);
        if (++stuck > 3)
            return -1;
    }
    return 0;
}

long net_rig_read(int fd, void *buf, size_t *len, size_t cap)
{
    long total = 0;
    while (*len < cap) {
        ssize_t n = read(fd, (char *)buf + *len, cap - *len);
        if (n > 0) {
            *len += (size_t)n;
            total += n;
            continue;
        }
        if (n == 0)
            return total ? total : -1;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return total;
        return total ? total : -1; /* ECONNRESET: the server closed with unread input */
    }
    return total;
}

/* ---- decoding answers ------------------------------------------------------------------ */

void rig_reader_init(rig_reader *rd)
{
    memset(rd, 0, sizeof(*rd));
    msgpack_unpacker_init(&rd->up, 64 * 1024);
    msgpack_unpacked_init(&rd->cur);
}

void rig_reader_fini(rig_reader *rd)
{
    msgpack_unpacked_destroy(&rd->cur);
    msgpack_unpacker_destroy(&rd->up);
}

/* Reads what fd holds into the unpacker. */
static void fill(rig_reader *rd, int fd)
{
    for (;;) {
        if (!msgpack_unpacker_reserve_buffer(&rd->up, 64 * 1024))
            return;
        ssize_t n = read(fd, msgpack_unpacker_buffer(&rd->up), 64 * 1024);
        if (n > 0) {
            msgpack_unpacker_buffer_consumed(&rd->up, (size_t)n);
            rd->received += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            rd->eof = true;
        return;
    }
}

static bool key_is(const msgpack_object *k, const char *s)
{
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(s) &&
           memcmp(k->via.str.ptr, s, k->via.str.size) == 0;
}

int rig_reader_next(rig_reader *rd, int fd, rig_got *g)
{
    memset(g, 0, sizeof(*g));
    int rc = msgpack_unpacker_next(&rd->up, &rd->cur);
    if (rc == MSGPACK_UNPACK_CONTINUE) {
        fill(rd, fd);
        rc = msgpack_unpacker_next(&rd->up, &rd->cur);
    }
    if (rc == MSGPACK_UNPACK_CONTINUE)
        return 0;
    if (rc != MSGPACK_UNPACK_SUCCESS)
        return -1;
    const msgpack_object *o = &rd->cur.data;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 4 ||
        o->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        o->via.array.ptr[0].via.u64 != 1 ||
        o->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return -1;
    g->msgid = (uint32_t)o->via.array.ptr[1].via.u64;
    const msgpack_object *err = &o->via.array.ptr[2];
    const msgpack_object *val = err->type == MSGPACK_OBJECT_NIL ? &o->via.array.ptr[3] : err;
    msgpack_object_print_buffer(g->text, sizeof(g->text), *val);
    if (val->type == MSGPACK_OBJECT_BIN)
        g->bin = val->via.bin.size;
    if (err->type == MSGPACK_OBJECT_NIL)
        return 1;
    if (err->type != MSGPACK_OBJECT_MAP)
        return -1;
    g->error = true;
    g->code = -1;
    for (uint32_t i = 0; i < err->via.map.size; i++) {
        const msgpack_object_kv *kv = &err->via.map.ptr[i];
        if (key_is(&kv->key, "code") && kv->val.type == MSGPACK_OBJECT_STR) {
            for (int c = 0; c < RPC_CODE_COUNT; c++)
                if (key_is(&kv->val, rpc_code_name((rpc_code)c)))
                    g->code = c;
        } else if (key_is(&kv->key, "message") && kv->val.type == MSGPACK_OBJECT_STR) {
            size_t n = kv->val.via.str.size < sizeof(g->message) - 1 ? kv->val.via.str.size
                                                                     : sizeof(g->message) - 1;
            memcpy(g->message, kv->val.via.str.ptr, n);
            g->message[n] = '\0';
        }
    }
    return 1;
}

int net_rig_collect(net_rig *r, int fd, rig_reader *rd, rig_got *got, size_t max)
{
    net_rig_pump(r, NULL, NULL);
    size_t n = 0;
    while (n < max) {
        int rc = rig_reader_next(rd, fd, &got[n]);
        if (rc < 0)
            return -1;
        if (rc == 0)
            break;
        n++;
    }
    return (int)n;
}

int net_rig_collect_all(net_rig *r, int fd, rig_reader *rd, rig_got *got, size_t want)
{
    size_t total = 0;
    for (int quiet = 0; total < want && quiet < QUIET_TURNS;) {
        size_t before = rd->received;
        int n = net_rig_collect(r, fd, rd, got + total, want - total);
        if (n < 0)
            return -1;
        total += (size_t)n;
        quiet = n > 0 || rd->received != before ? 0 : quiet + 1;
    }
    return (int)total;
}

/* ---- packing requests ------------------------------------------------------------------ */

typedef struct wbuf {
    char *p;
    size_t len, cap;
} wbuf;

static int wbuf_write(void *data, const char *buf, size_t len)
{
    wbuf *b = data;
    if (b->len + len > b->cap)
        return -1;
    memcpy(b->p + b->len, buf, len);
    b->len += len;
    return 0;
}

size_t rig_pack_request(char *buf, size_t cap, bool notify, uint32_t msgid, const char *method,
                        const void *params, size_t params_len)
{
    wbuf b = {buf, 0, cap};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b, wbuf_write);
    msgpack_pack_array(&pk, notify ? 3 : 4);
    msgpack_pack_uint32(&pk, notify ? 2 : 0);
    if (!notify)
        msgpack_pack_uint32(&pk, msgid);
    rpc_pack_cstr(&pk, method);
    msgpack_pack_array(&pk, params ? 1 : 0);
    if (params)
        wbuf_write(&b, params, params_len);
    return b.len;
}

size_t rig_map(char *buf, size_t cap, const char *spec, ...)
{
    wbuf b = {buf, 0, cap};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b, wbuf_write);
    uint32_t n = 0;
    for (const char *s = spec; *s; s++)
        n += *s == ':';
    msgpack_pack_map(&pk, n);
    va_list ap;
    va_start(ap, spec);
    const char *s = spec;
    while (*s) {
        while (*s == ' ')
            s++;
        const char *colon = strchr(s, ':');
        if (!colon)
            break;
        rpc_pack_strn(&pk, s, (size_t)(colon - s));
        switch (colon[1]) {
        case 'i':
            msgpack_pack_int64(&pk, va_arg(ap, int64_t));
            break;
        case 'u':
            msgpack_pack_uint64(&pk, va_arg(ap, uint64_t));
            break;
        case 's':
            rpc_pack_cstr(&pk, va_arg(ap, const char *));
            break;
        case 'b':
            if (va_arg(ap, int))
                msgpack_pack_true(&pk);
            else
                msgpack_pack_false(&pk);
            break;
        case 'r': {
            const void *raw = va_arg(ap, const void *);
            size_t len = va_arg(ap, size_t);
            wbuf_write(&b, raw, len);
            break;
        }
        default:
            msgpack_pack_nil(&pk);
            break;
        }
        s = colon + 2;
    }
    va_end(ap);
    return b.len;
}

/* ---- reading HTTP answers -------------------------------------------------------------- */

void rig_http_init(rig_http *h)
{
    memset(h, 0, sizeof(*h));
}

void rig_http_fini(rig_http *h)
{
    free(h->buf);
    memset(h, 0, sizeof(*h));
}

/* Reads what fd holds into h. */
static void http_fill(rig_http *h, int fd)
{
    for (;;) {
        if (h->cap - h->len < 65536) {
            size_t cap = h->cap ? h->cap * 2 : 131072;
            char *n = realloc(h->buf, cap);
            if (!n)
                return;
            h->buf = n;
            h->cap = cap;
        }
        ssize_t n = read(fd, h->buf + h->len, h->cap - h->len);
        if (n > 0) {
            h->len += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            h->eof = true;
        return;
    }
}

bool rig_http_header(const rig_http_got *g, const char *name, char *val, size_t n)
{
    size_t nl = strlen(name);
    for (const char *line = strstr(g->head, "\r\n"); line; line = strstr(line + 2, "\r\n")) {
        const char *k = line + 2;
        if (strncasecmp(k, name, nl) != 0 || k[nl] != ':')
            continue;
        const char *v = k + nl + 1;
        while (*v == ' ')
            v++;
        const char *end = strstr(v, "\r\n");
        size_t len = end ? (size_t)(end - v) : strlen(v);
        if (len >= n)
            len = n - 1;
        memcpy(val, v, len);
        val[len] = '\0';
        return true;
    }
    return false;
}

int rig_http_next(rig_http *h, int fd, bool head_only, rig_http_got *g)
{
    memset(g, 0, sizeof(*g));
    http_fill(h, fd);
    size_t head_len = 0;
    for (size_t i = 0; i + 4 <= h->len && !head_len; i++)
        if (memcmp(h->buf + i, "\r\n\r\n", 4) == 0)
            head_len = i + 4;
    if (!head_len)
        return 0;
    if (head_len < 12 || memcmp(h->buf, "HTTP/1.1 ", 9) != 0)
        return -1;
    size_t keep = head_len - 2 < sizeof(g->head) - 1 ? head_len - 2 : sizeof(g->head) - 1;
    memcpy(g->head, h->buf, keep);
    g->head[keep] = '\0';
    g->status = atoi(g->head + 9);
    char cl[32];
    bool bodiless = head_only || g->status < 200 || g->status == 204 || g->status == 304;
    if (!bodiless && rig_http_header(g, "Content-Length", cl, sizeof(cl)))
        g->body_len = strtoull(cl, NULL, 10);
    if (h->len - head_len < g->body_len)
        return 0;
    size_t bl = g->body_len < sizeof(g->body) - 1 ? g->body_len : sizeof(g->body) - 1;
    memcpy(g->body, h->buf + head_len, bl);
    g->body[bl] = '\0';
    size_t used = head_len + g->body_len;
    memmove(h->buf, h->buf + used, h->len - used);
    h->len -= used;
    return 1;
}

int net_rig_http_collect(net_rig *r, int fd, rig_http *h, bool head_only, rig_http_got *g,
                         size_t max)
{
    net_rig_pump(r, NULL, NULL);
    size_t n = 0;
    while (n < max) {
        int rc = rig_http_next(h, fd, head_only, &g[n]);
        if (rc < 0)
            return -1;
        if (rc == 0)
            break;
        n++;
    }
    return (int)n;
}
