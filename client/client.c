/* client/client.c: blocking MessagePack-RPC client over TCP or TLS (see client.h).
 *
 * The socket is non-blocking and every wait goes through poll with the call's deadline;
 * over TLS, OpenSSL reads and writes it and says which way to wait (io_send, io_recv).
 * Incoming bytes collect in one buffer that the scanner walks; a complete message is
 * routed by its msgid (read straight from its first bytes) against a small hash set of
 * the requests in flight, and only decoded, into the caller's zone, when it is handed
 * out. Responses that arrive for someone else while client_wait waits are copied into a
 * FIFO list.
 */
#include "client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "hash.h"
#include "rpc.h"
#include "ubuf.h"

#define READ_CHUNK ((size_t)64 * 1024) /* initial input buffer, and its size when idle */
#define READ_MIN ((size_t)4096)        /* free space below which the input buffer grows */
#define KEEP_MAX ((size_t)1024 * 1024) /* buffers past this are shrunk once drained */
#define ARG_MAX_DEPTH 1024             /* only to check an argument map is one value */

/* States of a msgid in the set. */
enum { ID_EMPTY = 0, ID_WAITING, ID_BUFFERED, ID_ABANDONED };

typedef struct id_slot {
    uint32_t id;
    uint8_t state;
} id_slot;

/* A response that arrived while client_wait waited for another one. */
typedef struct pending {
    struct pending *next;
    uint32_t msgid;
    size_t len;
    uint8_t bytes[];
} pending;

struct client_conn {
    int fd;
    SSL_CTX *ssl_ctx; /* TLS: the context of this one connection; NULL: plain TCP */
    SSL *ssl;
    char tls_why[256]; /* the last TLS failure, for messages */
    int timeout_ms;
    uint32_t next_id;
    rpc_scanner *scan;    /* frames responses, default limits */
    rpc_scanner *argscan; /* checks that argument bytes are exactly one value */

    uint8_t *in; /* unread input is in[in_off, in_len) */
    size_t in_off, in_len, in_cap;

    ubuf_sink out; /* the outgoing request (ubuf.h) */

    id_slot *ids; /* open addressing, linear probing; cap a power of two or 0 */
    size_t ids_cap, ids_used, n_abandoned;

    pending *head, *tail;

    bool broken;
    char broken_why[CLIENT_MESSAGE_MAX];
};

static const msgpack_object nil_object = {.type = MSGPACK_OBJECT_NIL};

/* ---- errors ------------------------------------------------------------------------- */

static const char *local_code(int rc)
{
    switch (rc) {
    case CLIENT_E_TIMEOUT:
        return "timeout";
    case CLIENT_E_CLOSED:
        return "connection_closed";
    case CLIENT_E_PROTOCOL:
        return "protocol_error";
    case CLIENT_E_CONNECT:
        return "connect_failed";
    case CLIENT_E_TLS:
        return "tls_failed";
    case -ENOMEM:
        return "out_of_memory";
    case -EINVAL:
        return "invalid_call";
    default:
        return "io_error";
    }
}

static void err_clear(client_error *err)
{
    if (err) {
        err->code[0] = '\0';
        err->message[0] = '\0';
        err->object = NULL;
    }
}

/* Fills err for a local failure rc and returns rc. */
static int fail(client_error *err, int rc, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        snprintf(err->code, sizeof(err->code), "%s", local_code(rc));
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof(err->message), fmt, ap);
        va_end(ap);
        err->object = NULL;
    }
    return rc;
}

/* Marks c unusable (the stream cannot be trusted any more), fills err and returns rc. */
static int break_conn(client_conn *c, client_error *err, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->broken_why, sizeof(c->broken_why), fmt, ap);
    va_end(ap);
    c->broken = true;
    return fail(err, rc, "%s", c->broken_why);
}

static int broken_err(const client_conn *c, client_error *err)
{
    return fail(err, CLIENT_E_CLOSED, "connection unusable after an earlier error: %s",
                c->broken_why);
}

/* Copies the string object o (if it is one) into dst as a C string. */
static void copy_str(char *dst, size_t cap, const msgpack_object *o, const char *def)
{
    if (o == NULL || o->type != MSGPACK_OBJECT_STR) {
        snprintf(dst, cap, "%s", def);
        return;
    }
    size_t n = o->via.str.size < cap - 1 ? o->via.str.size : cap - 1;
    if (n > 0)
        memcpy(dst, o->via.str.ptr, n);
    dst[n] = '\0';
}

static void set_server_error(client_error *err, const msgpack_object *e)
{
    if (err == NULL)
        return;
    copy_str(err->code, sizeof(err->code), rpc_map_get(e, "code"), "unknown_error");
    copy_str(err->message, sizeof(err->message), rpc_map_get(e, "message"), "");
    err->object = e;
}

/* ---- time and poll ------------------------------------------------------------------ */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -1 means no deadline. */
static int64_t deadline_of(int timeout_ms)
{
    return timeout_ms > 0 ? now_ms() + timeout_ms : -1;
}

/* Waits for events on fd until deadline: 1 when ready (or in error, which the next socket
 * call reports), 0 on timeout, -errno if poll fails. */
static int poll_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int ms = -1;
        if (deadline >= 0) {
            int64_t left = deadline - now_ms();
            ms = left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
        }
        int r = poll(&p, 1, ms);
        if (r > 0)
            return 1;
        if (r == 0) {
            if (deadline >= 0 && now_ms() < deadline)
                continue; /* woke early (rounding): wait out the rest */
            return 0;
        }
        if (errno != EINTR)
            return -errno;
    }
}

/* ---- socket I/O, plain or TLS -------------------------------------------------------- */

/* What io_send and io_recv return besides a byte count (and 0, end of stream). */
enum {
    IO_AGAIN = -1,  /* would block: poll for *want */
    IO_CLOSED = -2, /* the peer closed or reset the connection (io_send) */
    IO_TLS = -3,    /* TLS failed: c->tls_why says why; the stream is unusable */
    IO_ERRNO = -4,  /* a socket error: *e */
};

/* OpenSSL's reason for the oldest error in the thread's queue, into buf; empties it. */
static void ssl_reason(char *buf, size_t n, const char *none)
{
    unsigned long e = ERR_get_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    if (r)
        snprintf(buf, n, "%s", r);
    else if (e)
        ERR_error_string_n(e, buf, n);
    else
        snprintf(buf, n, "%s", none);
    ERR_clear_error();
}

/* Maps a failed SSL_read/SSL_write/SSL_connect result r. */
static ssize_t ssl_failure(client_conn *c, int r, short *want, int *e)
{
    int se = SSL_get_error(c->ssl, r);
    switch (se) {
    case SSL_ERROR_WANT_READ:
        *want = POLLIN;
        return IO_AGAIN;
    case SSL_ERROR_WANT_WRITE:
        *want = POLLOUT;
        return IO_AGAIN;
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    case SSL_ERROR_SYSCALL:
        *e = errno;
        ERR_clear_error();
        if (*e == 0)
            return 0; /* EOF with nothing to say */
        return IO_ERRNO;
    default:
        ssl_reason(c->tls_why, sizeof(c->tls_why), "TLS failed");
        return IO_TLS;
    }
}

/* Sends up to n bytes: the count sent, or IO_AGAIN, IO_CLOSED, IO_TLS, IO_ERRNO. */
static ssize_t io_send(client_conn *c, const uint8_t *p, size_t n, short *want, int *e)
{
    *want = POLLOUT;
    for (;;) {
        if (c->ssl) {
            ERR_clear_error();
            int r = SSL_write(c->ssl, p, n > INT_MAX ? INT_MAX : (int)n);
            if (r > 0)
                return r;
            ssize_t f = ssl_failure(c, r, want, e);
            if (f == IO_ERRNO && *e == EINTR)
                continue;
            if (f == 0 || (f == IO_ERRNO && (*e == EPIPE || *e == ECONNRESET)))
                return IO_CLOSED;
            return f;
        }
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0)
            return w;
        *e = w < 0 ? errno : EIO;
        if (*e == EINTR)
            continue;
        if (*e == EAGAIN || *e == EWOULDBLOCK)
            return IO_AGAIN;
        if (*e == EPIPE || *e == ECONNRESET)
            return IO_CLOSED;
        return IO_ERRNO;
    }
}

/* Receives up to n bytes: the count, 0 at the end of the stream, or IO_AGAIN, IO_TLS,
 * IO_ERRNO. */
static ssize_t io_recv(client_conn *c, uint8_t *p, size_t n, short *want, int *e)
{
    *want = POLLIN;
    for (;;) {
        if (c->ssl) {
            ERR_clear_error();
            int r = SSL_read(c->ssl, p, n > INT_MAX ? INT_MAX : (int)n);
            if (r > 0)
                return r;
            ssize_t f = ssl_failure(c, r, want, e);
            if (f == IO_ERRNO && *e == EINTR)
                continue;
            return f;
        }
        ssize_t r = recv(c->fd, p, n, 0);
        if (r >= 0)
            return r;
        *e = errno;
        if (*e == EINTR)
            continue;
        if (*e == EAGAIN || *e == EWOULDBLOCK)
            return IO_AGAIN;
        return IO_ERRNO;
    }
}

/* ---- the set of msgids awaiting a response ------------------------------------------ */

static size_t id_home(uint32_t id, size_t mask)
{
    return (size_t)hash_mix64(id) & mask;
}

static id_slot *ids_find(const client_conn *c, uint32_t id)
{
    if (c->ids_cap == 0)
        return NULL;
    size_t mask = c->ids_cap - 1;
    for (size_t i = id_home(id, mask);; i = (i + 1) & mask) {
        if (c->ids[i].state == ID_EMPTY)
            return NULL;
        if (c->ids[i].id == id)
            return &c->ids[i];
    }
}

static void ids_insert(id_slot *slots, size_t cap, uint32_t id, uint8_t state)
{
    size_t mask = cap - 1, i = id_home(id, mask);
    while (slots[i].state != ID_EMPTY)
        i = (i + 1) & mask;
    slots[i].id = id;
    slots[i].state = state;
}

/* Makes room for one more msgid, so that recording a request once it is written cannot
 * fail. Returns 0 or -ENOMEM. */
static int ids_reserve(client_conn *c)
{
    if ((c->ids_used + 1) * 2 <= c->ids_cap)
        return 0;
    size_t cap = c->ids_cap ? c->ids_cap * 2 : 16;
    if (cap > SIZE_MAX / sizeof(id_slot))
        return -ENOMEM;
    id_slot *slots = calloc(cap, sizeof(id_slot));
    if (slots == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < c->ids_cap; i++)
        if (c->ids[i].state != ID_EMPTY)
            ids_insert(slots, cap, c->ids[i].id, c->ids[i].state);
    free(c->ids);
    c->ids = slots;
    c->ids_cap = cap;
    return 0;
}

/* Removes slot s, shifting later entries of its probe run back (no tombstones). Pointers
 * to other slots are invalid afterwards. */
static void ids_remove(client_conn *c, id_slot *s)
{
    size_t mask = c->ids_cap - 1, i = (size_t)(s - c->ids), j = i;
    if (s->state == ID_ABANDONED)
        c->n_abandoned--;
    for (;;) {
        j = (j + 1) & mask;
        if (c->ids[j].state == ID_EMPTY)
            break;
        size_t k = id_home(c->ids[j].id, mask);
        /* entry j may move to the hole at i unless its home lies cyclically in (i, j] */
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            c->ids[i] = c->ids[j];
            i = j;
        }
    }
    c->ids[i].state = ID_EMPTY;
    c->ids_used--;
}

/* ---- connecting ---------------------------------------------------------------------- */

static void set_msg(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Connects one address within deadline: the socket, or -1 with *rc and why set. */
static int connect_one(const struct addrinfo *ai, int64_t deadline, int *rc, char *why,
                       size_t whylen)
{
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    int e = 0;
    if (fd < 0) {
        e = errno;
        goto fail;
    }
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 ||
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
        e = errno;
        goto fail;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            e = errno;
            goto fail;
        }
        int p = poll_fd(fd, POLLOUT, deadline);
        if (p == 0) {
            close(fd);
            *rc = CLIENT_E_TIMEOUT;
            snprintf(why, whylen, "connection timed out");
            return -1;
        }
        if (p < 0) {
            e = -p;
            goto fail;
        }
        socklen_t len = sizeof(e);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
            e = errno;
        if (e != 0)
            goto fail;
    }
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) {
        e = errno;
        goto fail;
    }
    return fd;

fail:
    if (fd >= 0)
        close(fd);
    *rc = CLIENT_E_CONNECT;
    snprintf(why, whylen, "%s", strerror(e));
    return -1;
}

/* The private key must never wait for a passphrase on a terminal: an encrypted key fails. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    return 0;
}

/* Checks that a file can be opened, for a message that names it. */
static bool readable(const char *what, const char *path, char *why, size_t n)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(why, n, "cannot read the %s %s: %s", what, path, strerror(errno));
        return false;
    }
    fclose(f);
    return true;
}

/* The context of one TLS connection: TLS 1.3, the server verified against t->ca_file (or
 * the system's store), the client certificate loaded when given. NULL with why. */
static SSL_CTX *tls_context(const client_tls *t, char *why, size_t n)
{
    char r[256];
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        ssl_reason(r, sizeof(r), "out of memory");
        snprintf(why, n, "cannot create a TLS context: %s", r);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    /* responses delimit themselves: a stream cut short shows as an incomplete response */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (t->ca_file) {
        if (!readable("CA file", t->ca_file, why, n))
            goto fail;
        if (SSL_CTX_load_verify_locations(ctx, t->ca_file, NULL) != 1) {
            ssl_reason(r, sizeof(r), "no certificate in it");
            snprintf(why, n, "cannot load the CA file %s: %s", t->ca_file, r);
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        ssl_reason(r, sizeof(r), "unknown error");
        snprintf(why, n, "cannot load the system's CA certificates: %s", r);
        goto fail;
    }
    if (t->key_file && !t->cert_file) {
        snprintf(why, n, "a client key needs its certificate");
        goto fail;
    }
    if (t->cert_file) {
        const char *key = t->key_file ? t->key_file : t->cert_file;
        if (!readable("client certificate", t->cert_file, why, n) ||
            !readable("client key", key, why, n))
            goto fail;
        if (SSL_CTX_use_certificate_chain_file(ctx, t->cert_file) != 1) {
            ssl_reason(r, sizeof(r), "no certificate in it");
            snprintf(why, n, "cannot load the client certificate %s: %s", t->cert_file, r);
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
            ssl_reason(r, sizeof(r), "no key in it");
            snprintf(why, n, "cannot load the client key %s (encrypted keys are not supported): %s",
                     key, r);
            goto fail;
        }
        if (SSL_CTX_check_private_key(ctx) != 1) {
            ERR_clear_error();
            snprintf(why, n, "the client key %s is not the key of the certificate %s", key,
                     t->cert_file);
            goto fail;
        }
    }
    return ctx;

fail:
    SSL_CTX_free(ctx);
    return NULL;
}

/* OpenSSL's own socket BIO writes with write(2): on a connection the server has closed that
 * raises SIGPIPE, which kills a program that did not ignore it. A library must not decide
 * that for its caller, so the TLS session sits on this BIO, which sends with MSG_NOSIGNAL
 * like the plain path. The BIO's data is the descriptor. */
static int bio_nosig_write(BIO *b, const char *buf, int len)
{
    BIO_clear_retry_flags(b);
    ssize_t w = send((int)(intptr_t)BIO_get_data(b), buf, (size_t)len, MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)w;
}

static int bio_nosig_read(BIO *b, char *buf, int len)
{
    BIO_clear_retry_flags(b);
    ssize_t r = recv((int)(intptr_t)BIO_get_data(b), buf, (size_t)len, 0);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_read(b);
    return (int)r;
}

static long bio_nosig_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    return cmd == BIO_CTRL_FLUSH ? 1 : 0; /* nothing is buffered here */
}

static int bio_nosig_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

/* The method of those BIOs: made once per process (a BIO type index is a process-wide
 * resource), kept until exit. */
static BIO_METHOD *bio_nosig;
static pthread_once_t bio_nosig_once = PTHREAD_ONCE_INIT;

static void bio_nosig_init(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "engram socket");
    if (m && BIO_meth_set_write(m, bio_nosig_write) == 1 &&
        BIO_meth_set_read(m, bio_nosig_read) == 1 && BIO_meth_set_ctrl(m, bio_nosig_ctrl) == 1 &&
        BIO_meth_set_create(m, bio_nosig_create) == 1)
        bio_nosig = m;
    else
        BIO_meth_free(m);
}

/* Puts c->ssl on a no-SIGPIPE BIO over c->fd. Returns false when out of memory. */
static bool tls_attach_socket(client_conn *c)
{
    if (pthread_once(&bio_nosig_once, bio_nosig_init) != 0 || bio_nosig == NULL)
        return false;
    BIO *b = BIO_new(bio_nosig);
    if (b == NULL)
        return false;
    BIO_set_data(b, (void *)(intptr_t)c->fd);
    SSL_set_bio(c->ssl, b, b); /* c->ssl owns b */
    return true;
}

/* Runs the TLS handshake on c's connected socket within deadline, checking the server's
 * certificate against name (a DNS name or an IP literal). Returns 0, CLIENT_E_TIMEOUT,
 * CLIENT_E_TLS or -ENOMEM, with why. */
static int tls_handshake(client_conn *c, const char *name, int64_t deadline, char *why, size_t n)
{
    unsigned char addr[16];
    c->ssl = SSL_new(c->ssl_ctx);
    if (c->ssl == NULL || !tls_attach_socket(c)) {
        ERR_clear_error();
        snprintf(why, n, "out of memory");
        return -ENOMEM;
    }
    if (inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1) {
        if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), name) != 1)
            goto nomem;
    } else if (SSL_set_tlsext_host_name(c->ssl, name) != 1 || SSL_set1_host(c->ssl, name) != 1) {
        goto nomem;
    }
    for (;;) {
        short want;
        int e = 0;
        ERR_clear_error();
        int r = SSL_connect(c->ssl);
        if (r == 1)
            return 0;
        ssize_t f = ssl_failure(c, r, &want, &e);
        if (f == IO_AGAIN) {
            int p = poll_fd(c->fd, want, deadline);
            if (p == 0) {
                snprintf(why, n, "the TLS handshake timed out");
                return CLIENT_E_TIMEOUT;
            }
            if (p < 0) {
                snprintf(why, n, "poll: %s", strerror(-p));
                return CLIENT_E_TLS;
            }
            continue;
        }
        if (f == IO_ERRNO && e == EINTR)
            continue;
        long v = SSL_get_verify_result(c->ssl);
        if (v != X509_V_OK)
            snprintf(why, n, "the server's certificate was refused: %s",
                     X509_verify_cert_error_string(v));
        else if (f == IO_TLS)
            snprintf(why, n, "%s", c->tls_why);
        else if (f == IO_ERRNO && e != ECONNRESET)
            snprintf(why, n, "%s", strerror(e));
        else
            snprintf(why, n,
                     "the server closed the connection during the TLS handshake (is it "
                     "serving TLS on this port?)");
        c->broken = true; /* no close_notify after a failed handshake */
        return CLIENT_E_TLS;
    }

nomem:
    ERR_clear_error();
    snprintf(why, n, "cannot set the name to verify '%s'", name);
    return CLIENT_E_TLS;
}

int client_connect(const char *host, uint16_t port, int timeout_ms, client_conn **out, char *err,
                   size_t errlen)
{
    return client_connect_tls(host, port, timeout_ms, NULL, out, err, errlen);
}

int client_connect_tls(const char *host, uint16_t port, int timeout_ms, const client_tls *tls,
                       client_conn **out, char *err, size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    char portstr[8], why[CLIENT_MESSAGE_MAX - 64] = "no address";
    const char *lb, *rb;
    client_conn *c = NULL;
    SSL_CTX *ssl_ctx = NULL;
    int fd = -1, rc = CLIENT_E_CONNECT;

    if (out)
        *out = NULL;
    if (host == NULL || out == NULL || port == 0) {
        set_msg(err, errlen, "client_connect: host, port and out are required");
        return -EINVAL;
    }
    /* the files first: a wrong path needs no network to be reported */
    if (tls) {
        char tw[CLIENT_MESSAGE_MAX];
        ssl_ctx = tls_context(tls, tw, sizeof(tw));
        if (ssl_ctx == NULL) {
            set_msg(err, errlen, "TLS: %s", tw);
            return CLIENT_E_TLS;
        }
    }
    /* brackets around IPv6 literals in messages */
    lb = strchr(host, ':') ? "[" : "";
    rb = *lb ? "]" : "";
    snprintf(portstr, sizeof(portstr), "%u", (unsigned)port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int64_t deadline = deadline_of(timeout_ms);
    int g = getaddrinfo(host, portstr, &hints, &res);
    if (g != 0) {
        if (g == EAI_MEMORY) {
            set_msg(err, errlen, "out of memory resolving %s", host);
            return -ENOMEM;
        }
        set_msg(err, errlen, "cannot resolve %s: %s", host,
                g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        SSL_CTX_free(ssl_ctx);
        return CLIENT_E_CONNECT;
    }
    for (const struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        fd = connect_one(ai, deadline, &rc, why, sizeof(why));
        if (fd < 0 && rc == CLIENT_E_TIMEOUT)
            break; /* the deadline is spent for every address */
    }
    freeaddrinfo(res);
    if (fd < 0) {
        set_msg(err, errlen, "cannot connect to %s%s%s:%u: %s", lb, host, rb, (unsigned)port, why);
        SSL_CTX_free(ssl_ctx);
        return rc;
    }

    c = calloc(1, sizeof(*c));
    if (c == NULL)
        goto nomem;
    c->fd = fd;
    fd = -1;
    c->ssl_ctx = ssl_ctx;
    ssl_ctx = NULL;
    c->timeout_ms = timeout_ms;
    c->next_id = 1;
    c->scan = rpc_scanner_create(NULL);
    rpc_limits arglim = {
        .max_message = SIZE_MAX, .max_depth = ARG_MAX_DEPTH, .max_objects = SIZE_MAX};
    c->argscan = rpc_scanner_create(&arglim);
    c->in = malloc(READ_CHUNK);
    if (c->scan == NULL || c->argscan == NULL || c->in == NULL)
        goto nomem;
    c->in_cap = READ_CHUNK;
    if (c->ssl_ctx) {
        rc = tls_handshake(c, tls->server_name ? tls->server_name : host, deadline, why,
                           sizeof(why));
        if (rc != 0) {
            set_msg(err, errlen, "TLS with %s%s%s:%u: %s", lb, host, rb, (unsigned)port, why);
            client_close(c);
            return rc;
        }
    }
    *out = c;
    return 0;

nomem:
    if (fd >= 0)
        close(fd);
    SSL_CTX_free(ssl_ctx);
    client_close(c);
    set_msg(err, errlen, "out of memory");
    return -ENOMEM;
}

void client_close(client_conn *c)
{
    if (c == NULL)
        return;
    if (c->ssl) {
        /* close_notify, best effort (the socket does not block), unless the stream broke */
        if (!c->broken && SSL_is_init_finished(c->ssl))
            SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
        ERR_clear_error();
    }
    SSL_CTX_free(c->ssl_ctx);
    if (c->fd >= 0)
        close(c->fd);
    rpc_scanner_destroy(c->scan);
    rpc_scanner_destroy(c->argscan);
    free(c->in);
    ubuf_fini(&c->out.b);
    free(c->ids);
    for (pending *p = c->head, *next; p != NULL; p = next) {
        next = p->next;
        free(p);
    }
    free(c);
}

void client_set_timeout(client_conn *c, int timeout_ms)
{
    if (c)
        c->timeout_ms = timeout_ms;
}

size_t client_outstanding(const client_conn *c)
{
    return c ? c->ids_used - c->n_abandoned : 0;
}

/* ---- sending --------------------------------------------------------------------------- */

/* Tells whether the n bytes at p are exactly one MessagePack map. */
static bool one_map(client_conn *c, const uint8_t *p, size_t n)
{
    size_t mlen = 0;
    if (n == 0 || !((p[0] >= 0x80 && p[0] <= 0x8f) || p[0] == 0xde || p[0] == 0xdf))
        return false;
    rpc_scanner_reset(c->argscan);
    int rc = rpc_scanner_scan(c->argscan, p, n, &mlen, NULL, 0);
    rpc_scanner_reset(c->argscan);
    return rc == 0 && mlen == n;
}

static int write_all(client_conn *c, const uint8_t *p, size_t n, int64_t deadline,
                     client_error *err)
{
    size_t done = 0;
    while (done < n) {
        short want;
        int e = 0;
        ssize_t w = io_send(c, p + done, n - done, &want, &e);
        if (w > 0) {
            done += (size_t)w;
            continue;
        }
        if (w == IO_AGAIN) {
            int r = poll_fd(c->fd, want, deadline);
            /* over TLS, OpenSSL may hold part of a record already: a write it began must be
             * finished, so even a timeout before the first byte breaks the connection */
            if (r == 0 && done == 0 && c->ssl == NULL)
                return fail(err, CLIENT_E_TIMEOUT, "timed out sending a request");
            if (r == 0)
                return break_conn(c, err, CLIENT_E_TIMEOUT,
                                  "timed out in the middle of sending a request");
            if (r < 0)
                return break_conn(c, err, r, "poll: %s", strerror(-r));
            continue;
        }
        if (w == IO_CLOSED)
            return break_conn(c, err, CLIENT_E_CLOSED, "the server closed the connection");
        if (w == IO_TLS)
            return break_conn(c, err, CLIENT_E_TLS, "TLS: %s", c->tls_why);
        return break_conn(c, err, -e, "send: %s", strerror(e));
    }
    return 0;
}

/* Builds and writes one request; on success records its msgid as waiting. wipe clears
 * the packed bytes once written (they hold a secret). */
static int send_request(client_conn *c, const char *method, const client_args *args,
                        int64_t deadline, bool wipe, uint32_t *msgid, client_error *err)
{
    msgpack_packer pk;
    uint32_t id;
    int rc;

    if (c->broken)
        return broken_err(c, err);
    if (method == NULL || method[0] == '\0')
        return fail(err, -EINVAL, "the method name must not be empty");
    if (args && (args->pack != NULL) == (args->packed != NULL))
        return fail(err, -EINVAL, "give the arguments either as a pack callback or packed");
    if (ids_reserve(c) != 0)
        return fail(err, -ENOMEM, "out of memory");
    do
        id = c->next_id++;
    while (ids_find(c, id) != NULL); /* only after 2^32 requests, with one still unanswered */

    ubuf_truncate(&c->out.b, 0);
    c->out.failed = false;
    msgpack_packer_init(&pk, &c->out, ubuf_sink_write);
    rpc_pack_request_begin(&pk, id, method, args != NULL);
    if (args) {
        size_t at = c->out.b.len;
        if (args->pack) {
            rc = args->pack(&pk, args->ud);
            if (rc != 0 && !c->out.failed) {
                rc = rc < 0 ? rc : -EINVAL;
                fail(err, rc, "packing the arguments of %s failed: %s", method, strerror(-rc));
                goto out;
            }
        } else {
            ubuf_sink_write(&c->out, (const char *)args->packed, args->packed_len);
        }
        if (!c->out.failed && !one_map(c, (const uint8_t *)c->out.b.data + at, c->out.b.len - at)) {
            rc = fail(err, -EINVAL, "the arguments of %s must be exactly one MessagePack map",
                      method);
            goto out;
        }
    }
    if (c->out.failed) {
        rc = fail(err, -ENOMEM, "out of memory packing a request");
        goto out;
    }
    rc = write_all(c, (const uint8_t *)c->out.b.data, c->out.b.len, deadline, err);
    if (rc == 0) {
        ids_insert(c->ids, c->ids_cap, id, ID_WAITING);
        c->ids_used++;
        if (msgid)
            *msgid = id;
    }

out:
    if (wipe && c->out.b.data) {
        /* volatile so the wipe is not optimised away */
        volatile char *v = c->out.b.data;
        for (size_t i = 0; i < c->out.b.len; i++)
            v[i] = 0;
    }
    if (c->out.b.cap > KEEP_MAX)
        ubuf_fini(&c->out.b);
    ubuf_truncate(&c->out.b, 0);
    return rc;
}

int client_send(client_conn *c, const char *method, const client_args *args, uint32_t *msgid,
                client_error *err)
{
    err_clear(err);
    if (c == NULL)
        return fail(err, -EINVAL, "no connection");
    return send_request(c, method, args, deadline_of(c->timeout_ms), false, msgid, err);
}

/* ---- receiving ------------------------------------------------------------------------- */

/* Reads more input (at least one byte) within deadline. */
static int fill(client_conn *c, int64_t deadline, client_error *err)
{
    if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->in_len == 0 && c->in_cap > KEEP_MAX) {
        uint8_t *small = realloc(c->in, READ_CHUNK);
        if (small) {
            c->in = small;
            c->in_cap = READ_CHUNK;
        }
    }
    if (c->in_cap - c->in_len < READ_MIN) {
        /* The scanner fails a message past 16 MiB as soon as its bytes (or a declared
         * length) say so, so this stays near one message's size. */
        size_t cap = c->in_cap * 2;
        uint8_t *p = cap > c->in_cap ? realloc(c->in, cap) : NULL;
        if (p == NULL)
            return fail(err, -ENOMEM, "out of memory reading a response");
        c->in = p;
        c->in_cap = cap;
    }
    for (;;) {
        short want;
        int e = 0;
        ssize_t r = io_recv(c, c->in + c->in_len, c->in_cap - c->in_len, &want, &e);
        if (r > 0) {
            c->in_len += (size_t)r;
            return 0;
        }
        if (r == 0)
            return break_conn(c, err, CLIENT_E_CLOSED,
                              c->in_len > 0
                                  ? "the server closed the connection in the middle of a response"
                                  : "the server closed the connection");
        if (r == IO_TLS)
            return break_conn(c, err, CLIENT_E_TLS, "TLS: %s", c->tls_why);
        if (r == IO_AGAIN) {
            int p = poll_fd(c->fd, want, deadline);
            if (p == 0)
                return fail(err, CLIENT_E_TIMEOUT, "no response within %d ms", c->timeout_ms);
            if (p < 0)
                return break_conn(c, err, p, "poll: %s", strerror(-p));
            continue;
        }
        if (e == ECONNRESET)
            return break_conn(c, err, CLIENT_E_CLOSED, "the server reset the connection");
        return break_conn(c, err, -e, "recv: %s", strerror(e));
    }
}

/* Delimits the next complete message: *msg points into the input buffer and stays valid
 * until the next call. */
static int next_message(client_conn *c, int64_t deadline, const uint8_t **msg, size_t *len,
                        client_error *err)
{
    char why[160];
    for (;;) {
        size_t avail = c->in_len - c->in_off, mlen = 0;
        if (avail > 0) {
            int rc = rpc_scanner_scan(c->scan, c->in + c->in_off, avail, &mlen, why, sizeof(why));
            if (rc == 0) {
                *msg = c->in + c->in_off;
                *len = mlen;
                c->in_off += mlen;
                return 0;
            }
            if (rc != RPC_E_INCOMPLETE)
                return break_conn(c, err, CLIENT_E_PROTOCOL, "bad response from the server: %s",
                                  why);
        }
        int rc = fill(c, deadline, err);
        if (rc != 0)
            return rc;
    }
}

/* Reads the msgid of a response from its first bytes: [1, msgid, ...] with msgid any
 * MessagePack integer encoding of a value in uint32's range (as msgpack-c would decode). */
static bool peek_response_id(const uint8_t *m, size_t len, uint32_t *id)
{
    uint64_t v = 0;
    size_t w;
    if (len < 3 || m[0] != 0x94 || m[1] != 0x01)
        return false;
    uint8_t b = m[2];
    if (b <= 0x7f) {
        *id = b;
        return true;
    }
    if (b >= 0xcc && b <= 0xcf)
        w = (size_t)1 << (b - 0xcc);
    else if (b >= 0xd0 && b <= 0xd3)
        w = (size_t)1 << (b - 0xd0);
    else
        return false;
    if (len - 3 < w)
        return false;
    for (size_t i = 0; i < w; i++)
        v = v << 8 | m[3 + i];
    if (b >= 0xd0 && (m[3] & 0x80))
        return false; /* negative */
    if (v > UINT32_MAX)
        return false;
    *id = (uint32_t)v;
    return true;
}

enum { ROUTE_DELIVER = 0, ROUTE_SKIP = -1 };

/* Decides what to do with a complete message: ROUTE_DELIVER with *slot its msgid's entry
 * (waiting), ROUTE_SKIP (a notification, or the answer to an abandoned call, now
 * forgotten), or a failure. */
static int route(client_conn *c, const uint8_t *m, size_t len, id_slot **slot, client_error *err)
{
    uint32_t id;
    if (!peek_response_id(m, len, &id)) {
        if (len >= 2 && m[0] == 0x93 && m[1] == 0x02)
            return ROUTE_SKIP; /* notification: none defined yet, so ignored */
        char why[160] = "not a response";
        msgpack_zone z;
        rpc_response r;
        if (msgpack_zone_init(&z, 1024)) {
            rpc_decode_response(m, len, &z, &r, why, sizeof(why));
            msgpack_zone_destroy(&z);
        }
        return break_conn(c, err, CLIENT_E_PROTOCOL, "bad response from the server: %s", why);
    }
    id_slot *s = ids_find(c, id);
    if (s == NULL || s->state == ID_BUFFERED)
        return break_conn(c, err, CLIENT_E_PROTOCOL,
                          "the server answered msgid %u, which awaits no response", id);
    if (s->state == ID_ABANDONED) {
        ids_remove(c, s);
        return ROUTE_SKIP;
    }
    *slot = s;
    return ROUTE_DELIVER;
}

/* Copies the message into zone and decodes it into out. */
static int deliver(client_conn *c, const uint8_t *m, size_t len, msgpack_zone *zone,
                   client_response *out, client_error *err)
{
    char why[160];
    rpc_response r;
    uint8_t *copy = msgpack_zone_malloc_no_align(zone, len);
    if (copy == NULL)
        return fail(err, -ENOMEM, "out of memory for a response of %zu bytes", len);
    memcpy(copy, m, len);
    int rc = rpc_decode_response(copy, len, zone, &r, why, sizeof(why));
    if (rc == -ENOMEM)
        return fail(err, -ENOMEM, "out of memory decoding a response of %zu bytes", len);
    if (rc != 0)
        return break_conn(c, err, CLIENT_E_PROTOCOL, "bad response from the server: %s", why);
    out->msgid = r.msgid;
    if (r.error) {
        out->result = NULL;
        out->error = r.error;
        set_server_error(err, r.error);
        return CLIENT_E_SERVER;
    }
    out->result = r.result ? r.result : &nil_object;
    out->error = NULL;
    return 0;
}

int client_recv(client_conn *c, msgpack_zone *zone, client_response *out, client_error *err)
{
    err_clear(err);
    if (out)
        memset(out, 0, sizeof(*out));
    if (c == NULL || zone == NULL || out == NULL)
        return fail(err, -EINVAL, "client_recv: connection, zone and out are required");
    if (c->broken)
        return broken_err(c, err);
    if (c->head) {
        pending *p = c->head;
        c->head = p->next;
        if (c->head == NULL)
            c->tail = NULL;
        id_slot *s = ids_find(c, p->msgid);
        if (s)
            ids_remove(c, s);
        int rc = deliver(c, p->bytes, p->len, zone, out, err);
        free(p);
        return rc;
    }
    if (client_outstanding(c) == 0)
        return fail(err, -EINVAL, "no request is waiting for a response");
    int64_t deadline = deadline_of(c->timeout_ms);
    for (;;) {
        const uint8_t *m;
        size_t len;
        id_slot *s = NULL;
        int rc = next_message(c, deadline, &m, &len, err);
        if (rc != 0)
            return rc;
        rc = route(c, m, len, &s, err);
        if (rc == ROUTE_SKIP)
            continue;
        if (rc != ROUTE_DELIVER)
            return rc;
        ids_remove(c, s);
        return deliver(c, m, len, zone, out, err);
    }
}

/* client_wait with an absolute deadline (shared with the send in client_call). */
static int wait_for(client_conn *c, uint32_t msgid, msgpack_zone *zone,
                    const msgpack_object **result, int64_t deadline, client_error *err)
{
    client_response r;
    int rc;

    if (c->broken)
        return broken_err(c, err);
    id_slot *s = ids_find(c, msgid);
    if (s == NULL || s->state == ID_ABANDONED)
        return fail(err, -EINVAL, "msgid %u awaits no response", msgid);
    if (s->state == ID_BUFFERED) {
        pending **pp = &c->head, *prev = NULL;
        while (*pp && (*pp)->msgid != msgid) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        pending *p = *pp;
        if (p == NULL) /* cannot happen: buffered ids are in the list */
            return break_conn(c, err, -EINVAL, "internal error: lost response %u", msgid);
        *pp = p->next;
        if (c->tail == p)
            c->tail = prev;
        ids_remove(c, s);
        rc = deliver(c, p->bytes, p->len, zone, &r, err);
        free(p);
        goto out;
    }
    for (;;) {
        const uint8_t *m;
        size_t len;
        rc = next_message(c, deadline, &m, &len, err);
        if (rc != 0)
            return rc;
        rc = route(c, m, len, &s, err);
        if (rc == ROUTE_SKIP)
            continue;
        if (rc != ROUTE_DELIVER)
            return rc;
        if (s->id == msgid) {
            ids_remove(c, s);
            rc = deliver(c, m, len, zone, &r, err);
            goto out;
        }
        pending *p = malloc(sizeof(*p) + len);
        if (p == NULL) /* the response would be lost: the stream is no good any more */
            return break_conn(c, err, -ENOMEM, "out of memory buffering a response");
        p->next = NULL;
        p->msgid = s->id;
        p->len = len;
        memcpy(p->bytes, m, len);
        if (c->tail)
            c->tail->next = p;
        else
            c->head = p;
        c->tail = p;
        s->state = ID_BUFFERED;
    }

out:
    if (rc == 0)
        *result = r.result;
    return rc;
}

int client_wait(client_conn *c, uint32_t msgid, msgpack_zone *zone, const msgpack_object **result,
                client_error *err)
{
    err_clear(err);
    if (result)
        *result = NULL;
    if (c == NULL || zone == NULL || result == NULL)
        return fail(err, -EINVAL, "client_wait: connection, zone and result are required");
    return wait_for(c, msgid, zone, result, deadline_of(c->timeout_ms), err);
}

static int call(client_conn *c, const char *method, const client_args *args, msgpack_zone *zone,
                const msgpack_object **result, bool wipe, client_error *err)
{
    int64_t deadline = deadline_of(c->timeout_ms);
    uint32_t id;
    int rc = send_request(c, method, args, deadline, wipe, &id, err);
    if (rc != 0)
        return rc;
    rc = wait_for(c, id, zone, result, deadline, err);
    if (rc != 0 && rc != CLIENT_E_SERVER) {
        id_slot *s = ids_find(c, id);
        if (s && s->state == ID_WAITING) {
            s->state = ID_ABANDONED;
            c->n_abandoned++;
        }
    }
    return rc;
}

int client_call(client_conn *c, const char *method, const client_args *args, msgpack_zone *zone,
                const msgpack_object **result, client_error *err)
{
    err_clear(err);
    if (result)
        *result = NULL;
    if (c == NULL || zone == NULL || result == NULL)
        return fail(err, -EINVAL, "client_call: connection, zone and result are required");
    return call(c, method, args, zone, result, false, err);
}

static int pack_auth(msgpack_packer *pk, void *ud)
{
    msgpack_pack_map(pk, 1);
    rpc_pack_kv_str(pk, "api_key", ud);
    return 0;
}

int client_auth(client_conn *c, const char *api_key, client_error *err)
{
    msgpack_zone zone;
    const msgpack_object *res;
    err_clear(err);
    if (c == NULL || api_key == NULL)
        return fail(err, -EINVAL, "client_auth: connection and key are required");
    if (!msgpack_zone_init(&zone, 1024))
        return fail(err, -ENOMEM, "out of memory");
    /* the cast drops const only to pass the key through ud; pack_auth only reads it */
    client_args args = {.pack = pack_auth, .ud = (void *)(uintptr_t)api_key};
    int rc = call(c, "auth", &args, &zone, &res, true, err);
    if (err)
        err->object = NULL; /* it pointed into the zone about to go */
    msgpack_zone_destroy(&zone);
    return rc;
}
