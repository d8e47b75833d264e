/* server/net/tls.c: the server's TLS context, its checks and its reload (see tls.h). */
#include "tls.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

/* A certificate this close to its expiry is worth a warning at every (re)load. */
#define EXPIRY_WARN_DAYS 14

struct tls_ctx {
    pthread_mutex_t mu; /* guards cur and not_after */
    SSL_CTX *cur;
    int64_t not_after;
    char *cert_file, *key_file, *ca_file; /* ca_file NULL: no client certificates */
};

/* Appends a formatted note to buf (warnings pile up, separated by "; "). */
static void add_note(char *buf, size_t n, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used + 3 >= n)
        return;
    if (used) {
        memcpy(buf + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, n - used, fmt, ap);
    va_end(ap);
}

/* OpenSSL's reason for the oldest error in the thread's queue; empties the queue. */
static void openssl_reason(char *buf, size_t n)
{
    unsigned long e = ERR_get_error();
    if (e)
        tls_error_text(e, buf, n);
    else
        snprintf(buf, n, "no detail from OpenSSL");
    ERR_clear_error();
}

void tls_error_text(unsigned long e, char *buf, size_t n)
{
    const char *reason = ERR_reason_error_string(e);
    const char *lib = ERR_lib_error_string(e);
    if (reason)
        snprintf(buf, n, "%s%s%s", lib ? lib : "", lib ? ": " : "", reason);
    else
        ERR_error_string_n(e, buf, n);
}

/* The private key must never wait for a passphrase on a terminal: an encrypted key fails. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    return 0;
}

/* Checks that setting's file can be opened, for a message that names the file. */
static int check_readable(const char *setting, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot read %s %s: %s", setting, path, strerror(errno));
        return -EIO;
    }
    fclose(f);
    return 0;
}

/* Formats an ASN1 time as OpenSSL prints it ("Jan  2 03:04:05 2030 GMT"). */
static void format_time(const ASN1_TIME *t, char *buf, size_t n)
{
    BIO *b = BIO_new(BIO_s_mem());
    buf[0] = '\0';
    if (!b)
        return;
    if (ASN1_TIME_print(b, t) == 1) {
        int got = BIO_read(b, buf, (int)n - 1);
        buf[got > 0 ? got : 0] = '\0';
    }
    BIO_free(b);
}

/* Builds a context from the three files: TLS 1.3 only, the certificate chain and its key
 * (checked against each other and against the clock), client certificates asked for when
 * ca is set. Returns the context with *not_after, or NULL with err. */
static SSL_CTX *build(const char *cert, const char *key, const char *ca, int64_t *not_after,
                      char *err, size_t errlen, char *warn, size_t warnlen)
{
    char why[256], when[64];
    SSL_CTX *ctx = NULL;
    EVP_PKEY *pkey = NULL;
    STACK_OF(X509_NAME) *names = NULL;

    if (check_readable("tls_cert_file", cert, err, errlen) < 0 ||
        check_readable("tls_key_file", key, err, errlen) < 0 ||
        (ca && check_readable("tls_ca_file", ca, err, errlen) < 0))
        return NULL;
    ERR_clear_error();
    ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        openssl_reason(why, sizeof(why));
        snprintf(err, errlen, "cannot create a TLS context: %s", why);
        goto fail;
    }
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1) {
        snprintf(err, errlen, "this OpenSSL cannot do TLS 1.3");
        goto fail;
    }
    /* an idle connection keeps no read and write buffers (about 34 KiB each otherwise) */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    /* a client that hangs up without close_notify ends the stream like a plain EOF: every
     * message delimits itself, so a cut shows as an incomplete message, never as a short
     * valid one */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        openssl_reason(why, sizeof(why));
        snprintf(err, errlen, "tls_cert_file %s holds no usable PEM certificate: %s", cert, why);
        goto fail;
    }
    /* the key read apart from the context, so that a wrong key and an unreadable one get
     * their own messages */
    BIO *kb = BIO_new_file(key, "r");
    pkey = kb ? PEM_read_bio_PrivateKey(kb, NULL, no_passphrase, NULL) : NULL;
    BIO_free(kb);
    if (!pkey) {
        openssl_reason(why, sizeof(why));
        snprintf(err, errlen,
                 "tls_key_file %s holds no usable PEM private key (encrypted keys are not "
                 "supported): %s",
                 key, why);
        goto fail;
    }
    X509 *x = SSL_CTX_get0_certificate(ctx);
    if (X509_check_private_key(x, pkey) != 1 || SSL_CTX_use_PrivateKey(ctx, pkey) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(err, errlen,
                 "tls_key_file %s is not the key of the certificate in tls_cert_file %s", key,
                 cert);
        goto fail;
    }
    EVP_PKEY_free(pkey); /* the context holds its own reference */
    pkey = NULL;
    const ASN1_TIME *na = X509_get0_notAfter(x), *nb = X509_get0_notBefore(x);
    format_time(na, when, sizeof(when));
    if (X509_cmp_current_time(na) <= 0) {
        snprintf(err, errlen,
                 "the certificate in tls_cert_file %s expired on %s: clients would refuse it", cert,
                 when);
        goto fail;
    }
    int days = 0, secs = 0;
    if (ASN1_TIME_diff(&days, &secs, NULL, na) != 1) {
        snprintf(err, errlen, "the certificate in tls_cert_file %s has an unreadable expiry", cert);
        goto fail;
    }
    *not_after = (int64_t)time(NULL) + (int64_t)days * 86400 + secs;
    if (days < EXPIRY_WARN_DAYS)
        add_note(warn, warnlen, "the certificate in tls_cert_file %s expires on %s", cert, when);
    if (X509_cmp_current_time(nb) > 0) {
        format_time(nb, when, sizeof(when));
        add_note(warn, warnlen,
                 "the certificate in tls_cert_file %s is not valid before %s: clients will "
                 "refuse it until then",
                 cert, when);
    }
    if (ca) {
        if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
            openssl_reason(why, sizeof(why));
            snprintf(err, errlen, "tls_ca_file %s holds no usable PEM certificate: %s", ca, why);
            goto fail;
        }
        /* the CertificateRequest names these CAs, so a client can pick its certificate */
        names = SSL_load_client_CA_file(ca);
        if (!names) {
            ERR_clear_error();
            snprintf(err, errlen, "tls_ca_file %s holds no CA certificate", ca);
            goto fail;
        }
        SSL_CTX_set_client_CA_list(ctx, names); /* takes names */
        /* asked for, not required: a client without a certificate gets in (and may not be
         * admin under tls_admin_require_client_cert); one whose certificate does not verify
         * fails the handshake */
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        /* resumed sessions keep their verified peer; OpenSSL refuses to resume without an id
         * context once peers are verified */
        static const unsigned char sid[] = "engramd";
        SSL_CTX_set_session_id_context(ctx, sid, sizeof(sid) - 1);
    }
    struct stat st;
    if (stat(key, &st) == 0 && (st.st_mode & 077))
        add_note(warn, warnlen, "tls_key_file %s can be read by other users (mode %03o)", key,
                 (unsigned)(st.st_mode & 0777));
    return ctx;

fail:
    EVP_PKEY_free(pkey);
    SSL_CTX_free(ctx);
    ERR_clear_error();
    return NULL;
}

static char *dup_or_null(const char *s)
{
    if (!s || !s[0])
        return NULL;
    char *d = strdup(s);
    if (!d)
        abort(); /* a path at start-up: small, and nothing can run without it */
    return d;
}

int tls_create(const config *cfg, tls_ctx **out, char *err, size_t errlen, char *warn,
               size_t warnlen)
{
    *out = NULL;
    warn[0] = '\0';
    if (!cfg->tls_cert_file[0])
        return 0;
    tls_ctx *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->cert_file = dup_or_null(cfg->tls_cert_file);
    t->key_file = dup_or_null(cfg->tls_key_file);
    t->ca_file = dup_or_null(cfg->tls_ca_file);
    t->cur =
        build(t->cert_file, t->key_file, t->ca_file, &t->not_after, err, errlen, warn, warnlen);
    if (!t->cur)
        goto fail;
    *out = t;
    return 0;

fail:
    tls_destroy(t);
    return -EINVAL;
}

void tls_destroy(tls_ctx *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->cur);
    pthread_mutex_destroy(&t->mu);
    free(t->cert_file);
    free(t->key_file);
    free(t->ca_file);
    free(t);
}

int tls_reload(tls_ctx *t, char *err, size_t errlen, char *warn, size_t warnlen)
{
    int64_t not_after = 0;
    warn[0] = '\0';
    SSL_CTX *ctx =
        build(t->cert_file, t->key_file, t->ca_file, &not_after, err, errlen, warn, warnlen);
    if (!ctx)
        return -EINVAL;
    pthread_mutex_lock(&t->mu);
    SSL_CTX *old = t->cur;
    t->cur = ctx;
    t->not_after = not_after;
    pthread_mutex_unlock(&t->mu);
    /* sessions made from the old context hold their own references */
    SSL_CTX_free(old);
    return 0;
}

struct ssl_st *tls_session_new(tls_ctx *t)
{
    pthread_mutex_lock(&t->mu);
    SSL_CTX *ctx = t->cur;
    SSL_CTX_up_ref(ctx); /* a reload may swap and free cur as soon as the lock is let go */
    pthread_mutex_unlock(&t->mu);
    SSL *ssl = SSL_new(ctx);
    SSL_CTX_free(ctx);
    if (!ssl)
        ERR_clear_error();
    return ssl;
}

int64_t tls_not_after(tls_ctx *t)
{
    pthread_mutex_lock(&t->mu);
    int64_t v = t->not_after;
    pthread_mutex_unlock(&t->mu);
    return v;
}

bool tls_client_verified(struct ssl_st *ssl)
{
    /* with SSL_VERIFY_PEER a certificate that does not verify fails the handshake, so one
     * that is here verified; the result is checked all the same */
    return SSL_get0_peer_certificate(ssl) != NULL && SSL_get_verify_result(ssl) == X509_V_OK;
}

void tls_client_subject(struct ssl_st *ssl, char *buf, size_t n)
{
    X509 *p = SSL_get0_peer_certificate(ssl);
    if (n == 0)
        return;
    buf[0] = '\0';
    if (p && !X509_NAME_oneline(X509_get_subject_name(p), buf, n > INT_MAX ? INT_MAX : (int)n))
        buf[0] = '\0';
}

bool tls_partial_record(struct ssl_st *ssl)
{
    return SSL_has_pending(ssl) == 1;
}

void tls_close_notify(struct ssl_st *ssl)
{
    if (SSL_is_init_finished(ssl) && !(SSL_get_shutdown(ssl) & SSL_SENT_SHUTDOWN))
        SSL_shutdown(ssl); /* non-blocking socket: sent now or never */
    ERR_clear_error();
}
