/* server/net/console.h: the web console's files, served on the HTTP port under /console.
 *
 * The files (server/console/: HTML, CSS, JavaScript) are embedded into engramd at build time
 * by server/console/gen_console.py, so nothing is read from disk or fetched at run time. The
 * console talks to engramd only through the HTTP port's own API (POST /v1/rpc/..., GET
 * /metrics) from the same origin. The HTTP connection code (hapi.c) asks console_find about
 * every GET path and writes the answer with the headers below.
 */
#ifndef ENGRAM_SERVER_CONSOLE_H
#define ENGRAM_SERVER_CONSOLE_H

#include <stdbool.h>
#include <stddef.h>

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

/* Cache-Control of console answers: kept by the browser but revalidated on every use (a new
 * engramd build may carry new files; an unchanged one costs a 304 without a body). */
#define CONSOLE_CACHE_CONTROL "no-cache"

/* console_find looks up a request path (n bytes, without the query). Returns 0 when the
 * path is not the console's (neither /console nor under /console/), 200 with *f set to the
 * embedded file it names (/console and /console/ name index.html), or 404 (*f NULL) for a
 * console path that names no file. Any thread. */
int console_find(const char *path, size_t n, const console_file **f);

/* console_headers returns the header lines every console answer carries besides
 * Content-Type, Content-Length, Cache-Control and ETag, each ended by CRLF: the
 * Content-Security-Policy and the other browser protections. A static string. */
const char *console_headers(void);

/* console_not_modified tells whether an If-None-Match value (n bytes; NULL: none) names f's
 * ETag (or is "*"), so the answer is 304 Not Modified. */
bool console_not_modified(const console_file *f, const char *inm, size_t n);

#endif
