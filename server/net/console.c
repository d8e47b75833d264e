/* server/net/console.c: the embedded web console under /console (see console.h). */
#include "console.h"

#include <string.h>

/* Everything the console loads comes from this origin: no inline script or style, no
 * plugins, no framing, no other site to send data to. Memory content is rendered as text
 * (console.js); this policy is the second line: an injected tag could neither run nor load
 * anything. */
static const char headers[] =
    "Content-Security-Policy: default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'\r\n"
    "Referrer-Policy: no-referrer\r\n"
    "X-Frame-Options: DENY\r\n"
    "Cross-Origin-Opener-Policy: same-origin\r\n"
    "Cross-Origin-Resource-Policy: same-origin\r\n";

int console_find(const char *path, size_t n, const console_file **f)
{
    static const char prefix[] = "/console";
    const size_t plen = sizeof(prefix) - 1;
    *f = NULL;
    if (!path || n < plen || memcmp(path, prefix, plen) != 0 || (n > plen && path[plen] != '/'))
        return 0;
    const char *name = "index.html";
    size_t nlen = strlen(name);
    if (n > plen + 1) {
        name = path + plen + 1;
        nlen = n - plen - 1;
    }
    for (int i = 0; i < console_nfiles; i++) {
        if (strlen(console_files[i].name) == nlen &&
            memcmp(console_files[i].name, name, nlen) == 0) {
            *f = &console_files[i];
            return 200;
        }
    }
    return 404;
}

const char *console_headers(void)
{
    return headers;
}

bool console_not_modified(const console_file *f, const char *inm, size_t n)
{
    if (!f || !inm)
        return false;
    if (n == 1 && inm[0] == '*')
        return true;
    /* a list of entity tags, weak ones (W/"...") match too (RFC 9110 13.1.2) */
    size_t elen = strlen(f->etag);
    for (size_t i = 0; i + elen <= n; i++)
        if (memcmp(inm + i, f->etag, elen) == 0)
            return true;
    return false;
}
