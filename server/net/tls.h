/* server/net/tls.h: TLS for the RPC and HTTP ports: the server's certificate, reloadable.
 *
 * A tls_ctx holds the current OpenSSL context (TLS 1.3 only) built from tls_cert_file,
 * tls_key_file and, when set, tls_ca_file. tls_reload builds a new context from the same
 * files and swaps it in: connections opened afterwards use the new one, connections already
 * open keep the one they started with (each session holds a reference to its context), and
 * a reload that fails leaves the current context in place.
 *
 * Thread-safety: tls_session_new may be called from any thread at any time, concurrently
 * with tls_reload (a mutex guards the swap). tls_create, tls_reload and tls_destroy are for
 * the main thread. The functions taking a session work on that session only and belong to
 * the thread that owns it.
 */
#ifndef ENGRAM_SERVER_TLS_H
#define ENGRAM_SERVER_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct ssl_st;
typedef struct tls_ctx tls_ctx;

/* tls_create builds the context cfg describes. Returns 0 with *out NULL when TLS is off
 * (tls_cert_file empty), 0 with *out a new context (free with tls_destroy), or a negative
 * errno (-EIO a file that cannot be read, -ENOMEM, -EINVAL otherwise) with err naming the setting
 * and what is wrong: a file that cannot be read, a key that does not match the certificate, an
 * encrypted key, an expired certificate. Writes warnings (a certificate not valid yet or close to
 * expiry, a key file others can read) into warn, empty when there are none. Never puts key material
 * in either. */
int tls_create(const config *cfg, tls_ctx **out, char *err, size_t errlen, char *warn,
               size_t warnlen);

/* tls_destroy drops the context; sessions still open keep theirs alive. NULL is a no-op. */
void tls_destroy(tls_ctx *t);

/* tls_reload re-reads the files the context was created from into a new context and
 * makes it current. Returns 0 (warn as for tls_create), or -EINVAL with err; the current
 * context stays then. */
int tls_reload(tls_ctx *t, char *err, size_t errlen, char *warn, size_t warnlen);

/* tls_session_new returns a new server-side session on the current context, or NULL when
 * out of memory. The caller owns it (bufferevent_openssl_socket_new takes it over with
 * BEV_OPT_CLOSE_ON_FREE). Any thread. */
struct ssl_st *tls_session_new(tls_ctx *t);

/* tls_not_after returns the expiry of the current certificate in seconds since the Unix
 * epoch. Any thread. */
int64_t tls_not_after(tls_ctx *t);

/* tls_client_verified tells whether the peer of an established session presented a
 * certificate that tls_ca_file verified. */
bool tls_client_verified(struct ssl_st *ssl);

/* tls_client_subject writes the subject of the peer's certificate (one line, for logs)
 * into buf, or "" when there is none. */
void tls_client_subject(struct ssl_st *ssl, char *buf, size_t n);

/* tls_partial_record tells whether the session holds bytes of a record that has not fully
 * arrived (or decrypted bytes not read yet): the client is in the middle of sending. */
bool tls_partial_record(struct ssl_st *ssl);

/* tls_close_notify sends the close_notify alert of an established session, best effort
 * (never blocks): the peer then sees a clean end of the stream. */
void tls_close_notify(struct ssl_st *ssl);

/* tls_error_text writes OpenSSL's text for the packed error code e (from
 * bufferevent_get_openssl_error or ERR_get_error) into buf. */
void tls_error_text(unsigned long e, char *buf, size_t n);

#endif
