/* tests/unit/test_client.c: client/ against a fake server run in a thread of the test.
 *
 * The fake accepts one connection on 127.0.0.1 and plays a scenario: it reads requests
 * with proto/'s scanner and decoder and writes whatever the scenario wants, well-formed or
 * not. Only the main thread checks anything; a scenario that meets the unexpected just
 * hangs up, which the client side then sees as a failure.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "client.h"
#include "rpc.h"

/* ---- the fake server -------------------------------------------------------------------- */

typedef struct srv {
    int fd;
    uint8_t *buf;
    size_t len, cap;
    rpc_scanner *scan;
    msgpack_zone zone;
    rpc_request req;  /* the last request read; valid until the next srv_next */
    char method[256]; /* its method, NUL-terminated */
    const void *arg;  /* the scenario's parameter */
} srv;

typedef void (*scenario_fn)(srv *s);

typedef struct fake {
    int lfd;
    uint16_t port;
    pthread_t th;
    scenario_fn fn;
    const void *arg;
} fake;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Reads the next request into s->req; false on EOF or anything that is not a request. */
static bool srv_next(srv *s)
{
    for (;;) {
        size_t mlen = 0;
        if (s->len > 0) {
            int rc = rpc_scanner_scan(s->scan, s->buf, s->len, &mlen, NULL, 0);
            if (rc == 0) {
                msgpack_zone_clear(&s->zone);
                uint8_t *msg = msgpack_zone_malloc(&s->zone, mlen);
                if (msg == NULL)
                    return false;
                memcpy(msg, s->buf, mlen);
                memmove(s->buf, s->buf + mlen, s->len - mlen);
                s->len -= mlen;
                if (rpc_decode_request(msg, mlen, &s->zone, &s->req, NULL, NULL, 0) != 0)
                    return false;
                snprintf(s->method, sizeof(s->method), "%.*s", (int)s->req.method_len,
                         s->req.method);
                return true;
            }
            if (rc != RPC_E_INCOMPLETE)
                return false;
        }
        if (s->cap - s->len < 4096) {
            size_t cap = s->cap ? s->cap * 2 : 65536;
            uint8_t *p = realloc(s->buf, cap);
            if (p == NULL)
                return false;
            s->buf = p;
            s->cap = cap;
        }
        ssize_t r = recv(s->fd, s->buf + s->len, s->cap - s->len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        s->len += (size_t)r;
    }
}

/* Waits until the client hangs up (or sends something that is not a request). */
static void srv_drain(srv *s)
{
    while (srv_next(s))
        ;
}

static void srv_send(srv *s, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = send(s->fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        b += w;
        n -= (size_t)w;
    }
}

static void pack_reply_head(msgpack_packer *pk, uint32_t msgid)
{
    rpc_pack_result_begin(pk, msgid);
}

/* Packs {"method": method, "msgid": msgid, "params": the request's params or nil} as the
 * result for msgid. */
static void pack_echo(msgpack_packer *pk, uint32_t msgid, const char *method,
                      const msgpack_object *params)
{
    pack_reply_head(pk, msgid);
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_str(pk, "method", method);
    rpc_pack_kv_uint(pk, "msgid", msgid);
    rpc_pack_cstr(pk, "params");
    if (params)
        msgpack_pack_object(pk, *params);
    else
        msgpack_pack_nil(pk);
}

static void srv_reply_sbuf(srv *s, msgpack_sbuffer *sb)
{
    srv_send(s, sb->data, sb->size);
    msgpack_sbuffer_clear(sb);
}

static void *fake_main(void *p)
{
    fake *f = p;
    srv s;
    memset(&s, 0, sizeof(s));
    s.arg = f->arg;
    s.fd = accept(f->lfd, NULL, NULL);
    s.scan = rpc_scanner_create(NULL);
    if (s.fd >= 0 && s.scan && msgpack_zone_init(&s.zone, 4096)) {
        f->fn(&s);
        msgpack_zone_destroy(&s.zone);
    }
    if (s.fd >= 0)
        close(s.fd);
    rpc_scanner_destroy(s.scan);
    free(s.buf);
    return NULL;
}

static void fake_start(fake *f, scenario_fn fn, const void *arg)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    memset(f, 0, sizeof(*f));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    f->fn = fn;
    f->arg = arg;
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(f->lfd, 4) != 0 || getsockname(f->lfd, (struct sockaddr *)&a, &alen) != 0)
        abort();
    f->port = ntohs(a.sin_port);
    if (pthread_create(&f->th, NULL, fake_main, f) != 0)
        abort();
}

static void fake_join(fake *f)
{
    pthread_join(f->th, NULL);
    close(f->lfd);
}

static client_conn *connect_to(const fake *f, int timeout_ms)
{
    client_conn *c = NULL;
    char err[256] = "";
    int rc = client_connect("127.0.0.1", f->port, timeout_ms, &c, err, sizeof(err));
    CHECK_MSG(rc == 0 && c != NULL, "connect: %d %s", rc, err);
    if (c == NULL)
        abort(); /* nothing below can run */
    return c;
}

/* ---- client-side helpers ---------------------------------------------------------------- */

static const msgpack_object *get(const msgpack_object *m, const char *key)
{
    return rpc_map_get(m, key);
}

static bool str_is(const msgpack_object *o, const char *s)
{
    return o != NULL && rpc_str_eq(o, s);
}

static int pack_two_fields(msgpack_packer *pk, void *ud)
{
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_int(pk, "a", 1);
    rpc_pack_kv_str(pk, "s", ud);
    return 0;
}

static int pack_two_maps(msgpack_packer *pk, void *ud)
{
    msgpack_pack_map(pk, 0);
    msgpack_pack_map(pk, 0);
    return 0;
}

static int pack_refuses(msgpack_packer *pk, void *ud)
{
    return -E2BIG;
}

/* ---- round trips, errors, argument checks -------------------------------------------- */

/* Answers ping, auth (key "good"), fail (an error with a detail) and anything else by
 * echoing, until the client hangs up. */
static void sc_basic(srv *s)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    while (srv_next(s)) {
        uint32_t id = s->req.msgid;
        if (strcmp(s->method, "ping") == 0) {
            pack_reply_head(&pk, id);
            rpc_pack_cstr(&pk, "pong");
        } else if (strcmp(s->method, "auth") == 0) {
            if (rpc_str_eq(rpc_map_get(s->req.params, "api_key"), "good")) {
                pack_reply_head(&pk, id);
                msgpack_pack_map(&pk, 1);
                rpc_pack_kv_int(&pk, "tenant_id", 7);
            } else {
                rpc_pack_error(&pk, id, RPC_UNAUTHENTICATED, "invalid API key", NULL, 0);
            }
        } else if (strcmp(s->method, "fail") == 0) {
            rpc_detail d = {.key = "id", .type = RPC_D_UINT, .v.u = 42};
            rpc_pack_error(&pk, id, RPC_NOT_FOUND, "no such memory", &d, 1);
        } else if (strcmp(s->method, "nil") == 0) {
            pack_reply_head(&pk, id);
            msgpack_pack_nil(&pk);
        } else {
            pack_echo(&pk, id, s->method, s->req.params);
        }
        srv_reply_sbuf(s, &sb);
    }
    msgpack_sbuffer_destroy(&sb);
}

static void test_round_trip(void)
{
    fake f;
    msgpack_zone z;
    const msgpack_object *res;
    client_error e;
    int rc;

    fake_start(&f, sc_basic, NULL);
    client_conn *c = connect_to(&f, 5000);
    msgpack_zone_init(&z, 1024);

    rc = client_call(c, "ping", NULL, &z, &res, &e);
    CHECK_MSG(rc == 0, "ping: %d %s: %s", rc, e.code, e.message);
    CHECK(res != NULL && str_is(res, "pong"));

    client_args cb = {.pack = pack_two_fields, .ud = "h\xc3\xa9"};
    rc = client_call(c, "echo", &cb, &z, &res, &e);
    CHECK(rc == 0);
    CHECK(res && str_is(get(res, "method"), "echo"));
    const msgpack_object *params = res ? get(res, "params") : NULL;
    CHECK(params && params->type == MSGPACK_OBJECT_MAP);
    CHECK(rpc_get_int(get(params, "a"), 0) == 1);
    CHECK(str_is(get(params, "s"), "h\xc3\xa9"));

    /* already packed: {"x": [1, 2, 3]} */
    static const uint8_t packed[] = {0x81, 0xa1, 'x', 0x93, 1, 2, 3};
    client_args pa = {.packed = packed, .packed_len = sizeof(packed)};
    rc = client_call(c, "echo", &pa, &z, &res, &e);
    CHECK(rc == 0);
    params = res ? get(res, "params") : NULL;
    const msgpack_object *x = get(params, "x");
    CHECK(x && x->type == MSGPACK_OBJECT_ARRAY && x->via.array.size == 3 &&
          x->via.array.ptr[2].via.u64 == 3);

    /* no arguments: params is [], which the fake echoes as nil; a nil result is an object */
    rc = client_call(c, "echo", NULL, &z, &res, &e);
    CHECK(rc == 0 && res && get(res, "params") && get(res, "params")->type == MSGPACK_OBJECT_NIL);
    rc = client_call(c, "nil", NULL, &z, &res, &e);
    CHECK(rc == 0 && res != NULL && res->type == MSGPACK_OBJECT_NIL);

    /* the server's error surfaces with its code, message and details */
    rc = client_call(c, "fail", NULL, &z, &res, &e);
    CHECK(rc == CLIENT_E_SERVER);
    CHECK(res == NULL);
    CHECK_MSG(strcmp(e.code, "not_found") == 0, "code '%s'", e.code);
    CHECK_MSG(strcmp(e.message, "no such memory") == 0, "message '%s'", e.message);
    CHECK(e.object != NULL && rpc_get_uint(get(e.object, "id"), 0) == 42);

    /* and the connection carries on */
    rc = client_call(c, "ping", NULL, &z, &res, &e);
    CHECK(rc == 0 && str_is(res, "pong"));

    rc = client_auth(c, "good", &e);
    CHECK_MSG(rc == 0, "auth: %d %s: %s", rc, e.code, e.message);
    rc = client_auth(c, "bad", &e);
    CHECK(rc == CLIENT_E_SERVER && strcmp(e.code, "unauthenticated") == 0 && e.object == NULL);
    CHECK_STR_CONTAINS(e.message, "invalid API key");

    /* arguments that are not exactly one map never leave the client */
    static const uint8_t array[] = {0x91, 0x01}, two[] = {0x80, 0x80}, cut[] = {0x81, 0xa1};
    client_args bad1 = {.packed = array, .packed_len = sizeof(array)};
    client_args bad2 = {.packed = two, .packed_len = sizeof(two)};
    client_args bad3 = {.packed = cut, .packed_len = sizeof(cut)};
    client_args bad4 = {.pack = pack_two_maps};
    client_args bad5 = {.pack = pack_refuses};
    client_args both = {.pack = pack_two_fields, .ud = "x", .packed = packed, .packed_len = 7};
    client_args neither = {0};
    CHECK(client_call(c, "echo", &bad1, &z, &res, &e) == -EINVAL);
    CHECK(strcmp(e.code, "invalid_call") == 0);
    CHECK(client_call(c, "echo", &bad2, &z, &res, &e) == -EINVAL);
    CHECK(client_call(c, "echo", &bad3, &z, &res, &e) == -EINVAL);
    CHECK(client_call(c, "echo", &bad4, &z, &res, &e) == -EINVAL);
    CHECK(client_call(c, "echo", &bad5, &z, &res, &e) == -E2BIG);
    CHECK(client_call(c, "echo", &both, &z, &res, &e) == -EINVAL);
    CHECK(client_call(c, "echo", &neither, &z, &res, &e) == -EINVAL);
    CHECK(client_call(c, "", NULL, &z, &res, &e) == -EINVAL);
    CHECK(client_outstanding(c) == 0);

    /* nothing is waiting: recv and wait refuse instead of blocking */
    client_response r;
    CHECK(client_recv(c, &z, &r, &e) == -EINVAL);
    CHECK(client_wait(c, 12345, &z, &res, &e) == -EINVAL);

    rc = client_call(c, "ping", NULL, &z, &res, &e);
    CHECK(rc == 0 && str_is(res, "pong"));

    client_close(c);
    fake_join(&f);
    msgpack_zone_destroy(&z);
}

/* ---- pipelining and out-of-order responses ------------------------------------------ */

#define MANY 1000

/* Reads n requests, then echoes them in the order given by order[] (indices). */
static bool srv_batch(srv *s, size_t n, const size_t *order)
{
    uint32_t ids[MANY];
    char methods[MANY][16];
    msgpack_sbuffer sb;
    msgpack_packer pk;
    for (size_t i = 0; i < n; i++) {
        if (!srv_next(s))
            return false;
        ids[i] = s->req.msgid;
        snprintf(methods[i], sizeof(methods[i]), "%.15s", s->method);
    }
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    for (size_t i = 0; i < n; i++) {
        size_t k = order ? order[i] : n - 1 - i; /* NULL: reversed */
        pack_echo(&pk, ids[k], methods[k], NULL);
    }
    srv_reply_sbuf(s, &sb); /* all in one write: the client must split them */
    msgpack_sbuffer_destroy(&sb);
    return true;
}

static void sc_reorder(srv *s)
{
    static const size_t o1[] = {2, 0, 1}, o2[] = {0, 1};
    if (srv_batch(s, 3, o1) && srv_batch(s, 2, o2) && srv_batch(s, MANY, NULL))
        srv_drain(s);
}

static uint64_t echo_id(const msgpack_object *res)
{
    return rpc_get_uint(get(res, "msgid"), UINT64_MAX);
}

static void test_out_of_order(void)
{
    fake f;
    msgpack_zone z;
    const msgpack_object *res;
    client_response r;
    client_error e;
    uint32_t a, b, cc, ids[MANY];
    int rc;

    fake_start(&f, sc_reorder, NULL);
    client_conn *c = connect_to(&f, 10000);
    msgpack_zone_init(&z, 1024);

    /* three in flight, answered c, a, b */
    CHECK(client_send(c, "m0", NULL, &a, &e) == 0);
    CHECK(client_send(c, "m1", NULL, &b, &e) == 0);
    CHECK(client_send(c, "m2", NULL, &cc, &e) == 0);
    CHECK(a != b && b != cc && a != cc);
    CHECK(client_outstanding(c) == 3);
    rc = client_wait(c, b, &z, &res, &e);
    CHECK_MSG(rc == 0, "wait: %d %s: %s", rc, e.code, e.message);
    CHECK(echo_id(res) == b && str_is(get(res, "method"), "m1"));
    CHECK(client_outstanding(c) == 2);
    /* the two buffered while waiting come back in arrival order */
    rc = client_recv(c, &z, &r, &e);
    CHECK(rc == 0 && r.msgid == cc && echo_id(r.result) == cc && r.error == NULL);
    CHECK(str_is(get(r.result, "method"), "m2"));
    rc = client_recv(c, &z, &r, &e);
    CHECK(rc == 0 && r.msgid == a && str_is(get(r.result, "method"), "m0"));
    CHECK(client_outstanding(c) == 0);

    /* a call while an earlier request is in flight: the earlier answer, arriving first,
     * is kept for its own wait */
    CHECK(client_send(c, "x", NULL, &a, &e) == 0);
    rc = client_call(c, "y", NULL, &z, &res, &e);
    CHECK(rc == 0 && str_is(get(res, "method"), "y"));
    CHECK(client_outstanding(c) == 1);
    rc = client_wait(c, a, &z, &res, &e);
    CHECK(rc == 0 && echo_id(res) == a && str_is(get(res, "method"), "x"));

    /* many in flight, answered in reverse, collected in order */
    for (size_t i = 0; i < MANY; i++) {
        char m[16];
        snprintf(m, sizeof(m), "n%zu", i);
        rc = client_send(c, m, NULL, &ids[i], &e);
        if (rc != 0) {
            CHECK_MSG(rc == 0, "send %zu: %d %s", i, rc, e.message);
            break;
        }
    }
    CHECK(client_outstanding(c) == MANY);
    size_t good = 0;
    for (size_t i = 0; i < MANY; i++) {
        char m[16];
        snprintf(m, sizeof(m), "n%zu", i);
        msgpack_zone_clear(&z);
        rc = client_wait(c, ids[i], &z, &res, &e);
        if (rc == 0 && echo_id(res) == ids[i] && str_is(get(res, "method"), m))
            good++;
        if (i == 0)
            CHECK(client_outstanding(c) == MANY - 1);
    }
    CHECK_MSG(good == MANY, "%zu of %d matched", good, MANY);
    CHECK(client_outstanding(c) == 0);
    CHECK(client_wait(c, ids[0], &z, &res, &e) == -EINVAL); /* already collected */

    client_close(c);
    fake_join(&f);
    msgpack_zone_destroy(&z);
}

/* Holds the first request until one named "x" comes, answering everything else at once;
 * then answers the held one and x, in that order. */
static void sc_hold(srv *s)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    if (!srv_next(s))
        return;
    uint32_t held = s->req.msgid;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    while (srv_next(s)) {
        if (strcmp(s->method, "x") == 0) {
            pack_echo(&pk, held, "hold", NULL);
            pack_echo(&pk, s->req.msgid, "x", NULL);
            srv_reply_sbuf(s, &sb);
            srv_drain(s);
            break;
        }
        pack_echo(&pk, s->req.msgid, s->method, NULL);
        srv_reply_sbuf(s, &sb);
    }
    msgpack_sbuffer_destroy(&sb);
}

/* A request left waiting while later msgids come and go, so that a later one lands on the
 * same home slot of the client's msgid set (white box: msgids are sequential and the set
 * starts with 16 slots) and removing the first must keep the second findable. */
static void test_long_waiter(void)
{
    fake f;
    msgpack_zone z;
    const msgpack_object *res;
    client_response r;
    client_error e;
    uint32_t hold, id, x;
    int rc;

    fake_start(&f, sc_hold, NULL);
    client_conn *c = connect_to(&f, 5000);
    msgpack_zone_init(&z, 1024);
    CHECK(client_send(c, "hold", NULL, &hold, &e) == 0);
    do {
        rc = client_send(c, "filler", NULL, &id, &e);
        if (rc == 0)
            rc = client_wait(c, id, &z, &res, &e);
        CHECK_MSG(rc == 0, "filler: %d %s", rc, e.message);
    } while (rc == 0 && (id + 1 - hold) % 16 != 0);
    CHECK(client_send(c, "x", NULL, &x, &e) == 0);
    CHECK(client_outstanding(c) == 2);
    rc = client_recv(c, &z, &r, &e);
    CHECK_MSG(rc == 0 && r.msgid == hold, "%d %s", rc, e.message);
    rc = client_recv(c, &z, &r, &e);
    CHECK_MSG(rc == 0 && r.msgid == x && str_is(get(r.result, "method"), "x"), "%d %s", rc,
              e.message);
    CHECK(client_outstanding(c) == 0);
    client_close(c);
    fake_join(&f);
    msgpack_zone_destroy(&z);
}

/* ---- responses in pieces ------------------------------------------------------------- */

#define BLOB 20000

static void sc_split(srv *s)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char *blob = malloc(BLOB);
    if (blob == NULL || !srv_next(s)) {
        free(blob);
        return;
    }
    for (size_t i = 0; i < BLOB; i++)
        blob[i] = (char)('a' + i % 26);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_reply_head(&pk, s->req.msgid);
    msgpack_pack_map(&pk, 2);
    rpc_pack_cstr(&pk, "blob");
    rpc_pack_strn(&pk, blob, BLOB);
    rpc_pack_kv_num(&pk, "pi", 3.25);
    /* 1 to 7 bytes per write, with pauses so the client sees the pieces */
    size_t off = 0, step = 1, writes = 0;
    while (off < sb.size) {
        size_t n = sb.size - off < step ? sb.size - off : step;
        srv_send(s, sb.data + off, n);
        off += n;
        step = step % 7 + 1;
        if (++writes % 400 == 0 || off < 16)
            sleep_ms(1);
    }
    msgpack_sbuffer_destroy(&sb);
    free(blob);
    srv_drain(s);
}

static void test_split(void)
{
    fake f;
    msgpack_zone z;
    const msgpack_object *res;
    client_error e;

    fake_start(&f, sc_split, NULL);
    client_conn *c = connect_to(&f, 10000);
    msgpack_zone_init(&z, 1024);
    int rc = client_call(c, "blob", NULL, &z, &res, &e);
    CHECK_MSG(rc == 0, "%d %s: %s", rc, e.code, e.message);
    const msgpack_object *blob = get(res, "blob");
    CHECK(blob && blob->type == MSGPACK_OBJECT_STR && blob->via.str.size == BLOB);
    if (blob && blob->type == MSGPACK_OBJECT_STR && blob->via.str.size == BLOB) {
        bool same = true;
        for (size_t i = 0; i < BLOB; i++)
            same = same && blob->via.str.ptr[i] == (char)('a' + i % 26);
        CHECK(same);
    }
    CHECK(rpc_get_num(get(res, "pi"), 0) == 3.25);
    client_close(c);
    fake_join(&f);
    msgpack_zone_destroy(&z);
}

/* ---- hostile and malformed responses --------------------------------------------------- */

typedef struct bytes_arg {
    const char *name;
    const uint8_t *p;
    size_t n;
} bytes_arg;

/* Answers the first request with the given bytes, then waits for the client to go. */
static void sc_bytes(srv *s)
{
    const bytes_arg *b = s->arg;
    if (!srv_next(s))
        return;
    srv_send(s, b->p, b->n);
    srv_drain(s);
}

static void test_hostile(void)
{
    /* the first request on a connection is msgid 1 */
    static const uint8_t arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t bin32[] = {0x94, 0x01, 0x01, 0xc0, 0xc6, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t str32[] = {0x94, 0x01, 0x01, 0xc0, 0xdb, 0x7f, 0xff, 0xff, 0xff};
    static const uint8_t reserved[] = {0xc1};
    static const uint8_t unknown_id[] = {0x94, 0x01, 0xcd, 0x12, 0x34, 0xc0, 0xc0};
    static const uint8_t request[] = {0x94, 0x00, 0x01, 0xa1, 'x', 0x90};
    static const uint8_t short_resp[] = {0x93, 0x01, 0x01, 0xc0};
    static const uint8_t error_str[] = {0x94, 0x01, 0x01, 0xa3, 'b', 'a', 'd', 0xc0};
    static const uint8_t neg_id[] = {0x94, 0x01, 0xff, 0xc0, 0xc0};
    uint8_t deep[48];
    memset(deep, 0x91, sizeof(deep) - 1);
    deep[sizeof(deep) - 1] = 0xc0;
    const bytes_arg cases[] = {
        {"array32 of 4 Gi elements", arr32, sizeof(arr32)},
        {"map32 of 4 Gi entries", map32, sizeof(map32)},
        {"bin32 of 4 GiB in a response", bin32, sizeof(bin32)},
        {"str32 of 2 GiB in a response", str32, sizeof(str32)},
        {"reserved byte 0xc1", reserved, sizeof(reserved)},
        {"response to a msgid never sent", unknown_id, sizeof(unknown_id)},
        {"a request from the server", request, sizeof(request)},
        {"response of 3 elements", short_resp, sizeof(short_resp)},
        {"error that is a string", error_str, sizeof(error_str)},
        {"negative msgid", neg_id, sizeof(neg_id)},
        {"47 nested arrays", deep, sizeof(deep)},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fake f;
        msgpack_zone z;
        const msgpack_object *res;
        client_error e;
        fake_start(&f, sc_bytes, &cases[i]);
        client_conn *c = connect_to(&f, 5000);
        msgpack_zone_init(&z, 1024);
        int64_t t0 = mono_ms();
        int rc = client_call(c, "ping", NULL, &z, &res, &e);
        int64_t took = mono_ms() - t0;
        /* refused from the header alone: no waiting for (or allocating) the declared bytes,
         * which never come; the connection stays open, so waiting would time out */
        CHECK_MSG(rc == CLIENT_E_PROTOCOL, "%s: %d %s: %s", cases[i].name, rc, e.code, e.message);
        CHECK_MSG(strcmp(e.code, "protocol_error") == 0, "%s: code %s", cases[i].name, e.code);
        CHECK_MSG(took < 2000, "%s: took %lld ms", cases[i].name, (long long)took);
        /* and the connection is no longer used */
        rc = client_call(c, "ping", NULL, &z, &res, &e);
        CHECK_MSG(rc == CLIENT_E_CLOSED, "%s: then %d", cases[i].name, rc);
        CHECK_STR_CONTAINS(e.message, "earlier error");
        client_close(c);
        fake_join(&f);
        msgpack_zone_destroy(&z);
    }
}

/* Odd but valid: a notification to skip, msgids in signed and 64-bit encodings. */
static void sc_odd(srv *s)
{
    static const uint8_t note[] = {0x93, 0x02, 0xa5, 'h', 'e', 'l', 'l', 'o', 0x90};
    uint8_t r1[] = {0x94, 0x01, 0xd0, 0x00, 0xc0, 0xa2, 'o', 'k'};
    uint8_t r2[] = {0x94, 0x01, 0xcf, 0, 0, 0, 0, 0, 0, 0, 0x00, 0xc0, 0xc3};
    if (!srv_next(s))
        return;
    r1[3] = (uint8_t)s->req.msgid; /* small ids in tests */
    srv_send(s, note, sizeof(note));
    srv_send(s, r1, sizeof(r1));
    if (!srv_next(s))
        return;
    r2[10] = (uint8_t)s->req.msgid;
    srv_send(s, r2, sizeof(r2));
    srv_drain(s);
}

static void test_odd_encodings(void)
{
    fake f;
    msgpack_zone z;
    const msgpack_object *res;
    client_error e;
    fake_start(&f, sc_odd, NULL);
    client_conn *c = connect_to(&f, 5000);
    msgpack_zone_init(&z, 1024);
    int rc = client_call(c, "a", NULL, &z, &res, &e);
    CHECK_MSG(rc == 0 && str_is(res, "ok"), "%d %s", rc, e.message);
    rc = client_call(c, "b", NULL, &z, &res, &e);
    CHECK_MSG(rc == 0 && res && res->type == MSGPACK_OBJECT_BOOLEAN && res->via.boolean, "%d %s",
              rc, e.message);
    client_close(c);
    fake_join(&f);
    msgpack_zone_destroy(&z);
}

/* ---- the server going away ------------------------------------------------------------- */

static void sc_close_mid(srv *s)
{
    static const uint8_t head[] = {0x94, 0x01, 0x01, 0xc0, 0xa5, 'p', 'o'};
    if (srv_next(s))
        srv_send(s, head, sizeof(head));
    /* fake_main closes the socket */
}

static void sc_close_at_once(srv *s)
{
    srv_next(s);
}

static void test_close(void)
{
    const scenario_fn fns[] = {sc_close_mid, sc_close_at_once};
    const char *const want[] = {"in the middle of a response", "closed the connection"};
    for (size_t i = 0; i < 2; i++) {
        fake f;
        msgpack_zone z;
        const msgpack_object *res;
        client_error e;
        fake_start(&f, fns[i], NULL);
        client_conn *c = connect_to(&f, 5000);
        msgpack_zone_init(&z, 1024);
        int rc = client_call(c, "ping", NULL, &z, &res, &e);
        CHECK_MSG(rc == CLIENT_E_CLOSED, "case %zu: %d %s", i, rc, e.message);
        CHECK(strcmp(e.code, "connection_closed") == 0);
        CHECK_STR_CONTAINS(e.message, want[i]);
        fake_join(&f); /* the server side is gone for sure now */
        rc = client_call(c, "ping", NULL, &z, &res, &e);
        CHECK(rc == CLIENT_E_CLOSED);
        client_close(c);
        msgpack_zone_destroy(&z);
    }
}

/* ---- timeouts ------------------------------------------------------------------------ */

/* Answers the first request 500 ms late, the second at once; then reads a third and
 * never answers it. */
static void sc_slow(srv *s)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (srv_next(s)) {
        uint32_t id = s->req.msgid;
        sleep_ms(500);
        pack_reply_head(&pk, id);
        rpc_pack_cstr(&pk, "late");
        srv_reply_sbuf(s, &sb);
        if (srv_next(s)) {
            pack_reply_head(&pk, s->req.msgid);
            rpc_pack_cstr(&pk, "fresh");
            srv_reply_sbuf(s, &sb);
            srv_drain(s);
        }
    }
    msgpack_sbuffer_destroy(&sb);
}

static void test_timeout(void)
{
    fake f;
    msgpack_zone z;
    const msgpack_object *res;
    client_response r;
    client_error e;
    uint32_t id;

    fake_start(&f, sc_slow, NULL);
    client_conn *c = connect_to(&f, 5000);
    msgpack_zone_init(&z, 1024);

    client_set_timeout(c, 150);
    int64_t t0 = mono_ms();
    int rc = client_call(c, "slow", NULL, &z, &res, &e);
    int64_t took = mono_ms() - t0;
    CHECK_MSG(rc == CLIENT_E_TIMEOUT, "%d %s", rc, e.message);
    CHECK(strcmp(e.code, "timeout") == 0);
    CHECK_MSG(took >= 140 && took < 1500, "took %lld ms", (long long)took);
    CHECK(client_outstanding(c) == 0); /* abandoned */

    /* the late answer to the abandoned call is dropped, not mistaken for this one */
    client_set_timeout(c, 5000);
    rc = client_call(c, "next", NULL, &z, &res, &e);
    CHECK_MSG(rc == 0 && str_is(res, "fresh"), "%d %s", rc, e.message);

    /* a recv or wait that times out leaves the request waiting */
    client_set_timeout(c, 100);
    CHECK(client_send(c, "never", NULL, &id, &e) == 0);
    rc = client_recv(c, &z, &r, &e);
    CHECK_MSG(rc == CLIENT_E_TIMEOUT, "%d %s", rc, e.message);
    CHECK(client_outstanding(c) == 1);
    rc = client_wait(c, id, &z, &res, &e);
    CHECK(rc == CLIENT_E_TIMEOUT);
    CHECK(client_outstanding(c) == 1);

    client_close(c);
    fake_join(&f);
    msgpack_zone_destroy(&z);
}

static void test_connect_refused(void)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    client_conn *c = (client_conn *)&a; /* must be reset to NULL */
    char err[256] = "";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) != 0)
        abort();
    close(fd); /* nothing listens there now */
    int rc = client_connect("127.0.0.1", ntohs(a.sin_port), 2000, &c, err, sizeof(err));
    CHECK_MSG(rc == CLIENT_E_CONNECT, "%d %s", rc, err);
    CHECK(c == NULL);
    CHECK_STR_CONTAINS(err, "127.0.0.1");
    CHECK(client_connect(NULL, 1, 100, &c, err, sizeof(err)) == -EINVAL);
    CHECK(client_connect("127.0.0.1", 0, 100, &c, err, sizeof(err)) == -EINVAL);
    client_close(NULL);
}

/* Reads and ignores everything until the client hangs up: a server that never answers. */
static void sc_silent(srv *s)
{
    char buf[4096];
    while (recv(s->fd, buf, sizeof(buf), 0) > 0)
        ;
}

/* Hangs up on the first bytes: a plain server that does not understand a ClientHello. */
static void sc_hang_up(srv *s)
{
    char buf[4096];
    (void)recv(s->fd, buf, sizeof(buf), 0);
}

static void test_tls_failures(void)
{
    client_conn *c = NULL;
    char err[512] = "";
    fake f;
    /* files are checked before any connection is tried: port 1 is never reached */
    client_tls bad_ca = {.ca_file = "/nonexistent/engram-ca.pem"};
    int rc = client_connect_tls("127.0.0.1", 1, 1000, &bad_ca, &c, err, sizeof(err));
    CHECK_MSG(rc == CLIENT_E_TLS, "%d %s", rc, err);
    CHECK(c == NULL);
    CHECK_STR_CONTAINS(err, "/nonexistent/engram-ca.pem");
    client_tls key_only = {.key_file = "/nonexistent/engram.key"};
    rc = client_connect_tls("127.0.0.1", 1, 1000, &key_only, &c, err, sizeof(err));
    CHECK_MSG(rc == CLIENT_E_TLS && c == NULL, "%d %s", rc, err);
    CHECK_STR_CONTAINS(err, "certificate");

    /* a server that is not speaking TLS hangs up on the ClientHello */
    client_tls sys = {0};
    fake_start(&f, sc_hang_up, NULL);
    rc = client_connect_tls("127.0.0.1", f.port, 5000, &sys, &c, err, sizeof(err));
    CHECK_MSG(rc == CLIENT_E_TLS && c == NULL, "%d %s", rc, err);
    CHECK_STR_CONTAINS(err, "handshake");
    fake_join(&f);

    /* one that never answers: the handshake ends at the connection's deadline (without
     * one this call would never return) */
    fake_start(&f, sc_silent, NULL);
    rc = client_connect_tls("127.0.0.1", f.port, 300, &sys, &c, err, sizeof(err));
    CHECK_MSG(rc == CLIENT_E_TIMEOUT && c == NULL, "%d %s", rc, err);
    fake_join(&f);
}

int main(void)
{
    test_round_trip();
    test_out_of_order();
    test_long_waiter();
    test_split();
    test_hostile();
    test_odd_encodings();
    test_close();
    test_timeout();
    test_connect_refused();
    test_tls_failures();
    CHECK_RETURN();
}
