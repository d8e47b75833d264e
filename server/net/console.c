/* server/net/console.c: serves the embedded web console under /console (see console.h). */
#include "console.h"

#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>

/* The headers of every console answer. Everything the console loads comes from this origin:
 * no inline script or style, no plugins, no framing, no other site to send data to. Memory
 * content is rendered as text (console.js); this policy is the second line: an injected tag
 * could neither run nor load anything. Files are kept by the browser but revalidated on
 * every use (Cache-Control: no-cache with an ETag): a new engramd build may carry new files,
 * and an unchanged file costs a 304 without a body. */
static const struct {
    const char *name, *value;
} headers[] = {
    {"Content-Security-Policy",
     "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
     "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
     "frame-ancestors 'none'"},
    {"X-Content-Type-Options", "nosniff"},
    {"Referrer-Policy", "no-referrer"},
    {"X-Frame-Options", "DENY"},
    {"Cross-Origin-Opener-Policy", "same-origin"},
    {"Cross-Origin-Resource-Policy", "same-origin"},
    {"Cache-Control", "no-cache"},
};
#define NHEADERS (sizeof(headers) / sizeof(headers[0]))

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

int console_headers(const console_file *f, struct evbuffer *out)
{
    for (size_t i = 0; i < NHEADERS; i++)
        if (evbuffer_add_printf(out, "%s: %s\r\n", headers[i].name, headers[i].value) < 0)
            return -1;
    if (f && evbuffer_add_printf(out, "ETag: %s\r\n", f->etag) < 0)
        return -1;
    return 0;
}

bool console_serve(struct evhttp_request *rq)
{
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(rq);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    const console_file *f;
    int status = console_find(path, path ? strlen(path) : 0, &f);
    if (status == 0)
        return false;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(rq);
    struct evkeyvalq *out = evhttp_request_get_output_headers(rq);
    if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
        evhttp_add_header(out, "Allow", "GET, HEAD");
        evhttp_send_error(rq, 405, "the console is read with GET");
        return true;
    }
    if (!f) {
        evhttp_send_error(rq, 404, "no such console file");
        return true;
    }
    for (size_t i = 0; i < NHEADERS; i++)
        evhttp_add_header(out, headers[i].name, headers[i].value);
    evhttp_add_header(out, "ETag", f->etag);
    const char *inm = evhttp_find_header(evhttp_request_get_input_headers(rq), "If-None-Match");
    if (inm && strstr(inm, f->etag)) {
        evhttp_send_reply(rq, 304, "Not Modified", NULL);
        return true;
    }
    struct evbuffer *b = evbuffer_new();
    if (!b || evbuffer_add_reference(b, f->data, f->len, NULL, NULL) != 0) {
        if (b)
            evbuffer_free(b);
        evhttp_send_error(rq, 500, "out of memory");
        return true;
    }
    evhttp_add_header(out, "Content-Type", f->ctype);
    evhttp_send_reply(rq, 200, "OK", b);
    evbuffer_free(b);
    return true;
}
