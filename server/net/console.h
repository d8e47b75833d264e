/* server/net/console.h: the web console's files, served on the HTTP port under /console.
 *
 * The files (server/console/: HTML, CSS, JavaScript) are embedded into engramd at build time
 * by server/console/gen_console.py, so nothing is read from disk or fetched at run time. The
 * console talks to engramd only through the HTTP port's own API (/v1/rpc/..., /metrics) from
 * the same origin.
 */
#ifndef ENGRAM_SERVER_CONSOLE_H
#define ENGRAM_SERVER_CONSOLE_H

#include <stdbool.h>
#include <stddef.h>

struct evbuffer;
struct evhttp_request;

/* One embedded file (console_data.c, generated). */
typedef struct console_file {
    const char *name;  /* file name: served at /console/<name> */
    const char *ctype; /* Content-Type */
    const char *etag;  /* quoted strong ETag: a hash of the content */
    const char *data;
    size_t len;
} console_file;

extern const console_file console_files[];
extern const int console_nfiles;

/* console_find looks up a request path (n bytes, without the query). Returns 0 when the
 * path is not the console's (neither /console nor under /console/), 200 with *f set to the
 * embedded file it names (/console and /console/ name index.html), or 404 for a console
 * path that names no file. */
int console_find(const char *path, size_t n, const console_file **f);

/* console_headers appends to out the header lines every console answer carries, each ended
 * by CRLF: the Content-Security-Policy and the other browser protections, Cache-Control,
 * and f's ETag (when f is not NULL). Not Content-Type or Content-Length. Returns 0, or -1
 * when out of memory. */
int console_headers(const console_file *f, struct evbuffer *out);

/* console_serve answers rq when its path is /console or under /console/ and returns true;
 * otherwise it returns false and leaves rq alone. GET and HEAD get the file (304 when
 * If-None-Match carries its ETag) with a strict Content-Security-Policy; other methods 405;
 * unknown files 404. Main thread (the HTTP port's loop). */
bool console_serve(struct evhttp_request *rq);

#endif
