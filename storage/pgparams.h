/* storage/pgparams.h: libpq connection parameters with the failover defaults added.
 *
 * The pool (db.c) and the blocking connections (pgsync.c) connect with the same DSN and need
 * the same protection against a primary that vanished without closing its sockets, so both
 * build their keyword arrays here.
 */
#ifndef ENGRAM_STORAGE_PGPARAMS_H
#define ENGRAM_STORAGE_PGPARAMS_H

#include <stddef.h>

#include <libpq-fe.h>

/* A DSN parsed into the keyword and value arrays of PQconnectdbParams and
 * PQconnectStartParams. keys and vals end with NULL and point into opts or into this
 * struct's own strings: the struct must stay where it is while they are used. */
typedef struct pgparams {
    PQconninfoOption *opts;
    const char **keys;
    const char **vals;
    char tcp_user_timeout[16];
    char connect_timeout[16];
} pgparams;

/* pgparams_init parses dsn (a key=value string or a URI, one host or several) into p and
 * adds, for each of these the DSN leaves unset:
 *   keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3: an idle
 *     connection to a host that vanished (power loss, a network partition: no RST ever
 *     arrives) is found dead in about 11 s instead of the kernel's two hours;
 *   tcp_user_timeout=timeout_ms (at least 1000): data, and on Linux a connection attempt's
 *     SYN, unacknowledged that long closes the socket, so a dead first host of a multi-host
 *     DSN costs one timeout before libpq tries the next;
 *   connect_timeout=timeout_ms in seconds (at least 2): the same bound per host for blocking
 *     connections (libpq applies it per host; the pool bounds each host's attempt itself).
 * They only apply to TCP; a Unix socket path ignores them. p is memory the caller owns.
 * Returns 0 (release with pgparams_fini), or -EINVAL when dsn does not parse (err says why)
 * or -ENOMEM; p is then zeroed and needs no pgparams_fini. Any thread. */
int pgparams_init(pgparams *p, const char *dsn, unsigned timeout_ms, char *err, size_t errlen);

/* pgparams_set sets key to val in p (replacing the DSN's value or adding it), or removes
 * key when val is NULL. key must be a libpq keyword (a static string such as "host"); val
 * must outlive p's use. Returns 0, or -EINVAL for a keyword libpq does not know. */
int pgparams_set(pgparams *p, const char *key, const char *val);

/* pgparams_fini frees what pgparams_init allocated and zeroes p; a zeroed p is a no-op. */
void pgparams_fini(pgparams *p);

#endif
