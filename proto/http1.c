/* proto/http1.c: HTTP/1.x request heads (see http1.h). */
#include "http1.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

size_t http1_find_end(const uint8_t *buf, size_t len, size_t *scanned)
{
    for (size_t i = *scanned; i < len; i++) {
        if (buf[i] != '\n')
            continue;
        /* a line end followed by an empty line: LF LF or LF CR LF */
        if (i + 1 == len || (i + 2 == len && buf[i + 1] == '\r')) {
            *scanned = i; /* undecided until more bytes arrive */
            return 0;
        }
        if (buf[i + 1] == '\n')
            return i + 2;
        if (buf[i + 1] == '\r' && buf[i + 2] == '\n')
            return i + 3;
    }
    *scanned = len;
    return 0;
}

/* RFC 9110 tchar: the bytes of a token. */
static bool tchar(uint8_t c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool name_is(const uint8_t *s, size_t n, const char *name)
{
    if (strlen(name) != n)
        return false;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c >= 'A' && c <= 'Z')
            c = (uint8_t)(c - 'A' + 'a');
        if (c != (uint8_t)name[i])
            return false;
    }
    return true;
}

/* Whether the comma-separated list v (n bytes) holds token (case-insensitive). */
static bool list_has(const uint8_t *v, size_t n, const char *token)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t s = i;
        while (i < n && v[i] != ',')
            i++;
        size_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e > s && name_is(v + s, e - s, token))
            return true;
    }
    return false;
}

/* The request target tg (tn bytes) into out's path and query: origin form, absolute form
 * (http://host/path: servers must accept it; the authority is ignored) or "*". */
static int parse_target(const uint8_t *tg, size_t tn, http1_request *out, char *err, size_t errlen)
{
    for (const char *scheme = "http://"; scheme; scheme = scheme[4] == ':' ? "https://" : NULL) {
        size_t sn = strlen(scheme);
        if (tn > sn && name_is(tg, sn, scheme)) {
            size_t k = sn;
            while (k < tn && tg[k] != '/' && tg[k] != '?')
                k++;
            tg += k;
            tn -= k;
            if (tn == 0 || tg[0] != '/') { /* http://host or http://host?q: the root */
                static const uint8_t root[] = "/";
                if (tn != 0)
                    return fail(err, errlen, HTTP1_E_MALFORMED, "malformed request target");
                tg = root;
                tn = 1;
            }
            break;
        }
    }
    if (!(tn == 1 && tg[0] == '*') && tg[0] != '/')
        return fail(err, errlen, HTTP1_E_MALFORMED, "malformed request target");
    const uint8_t *q = memchr(tg, '?', tn);
    out->path = (const char *)tg;
    out->path_len = q ? (size_t)(q - tg) : tn;
    if (q) {
        out->query = (const char *)q + 1;
        out->query_len = tn - out->path_len - 1;
    }
    return 0;
}

/* The request line buf[0..le) ("METHOD target HTTP/1.x") into out. */
static int parse_request_line(const uint8_t *buf, size_t le, http1_request *out, char *err,
                              size_t errlen)
{
    size_t p = 0;
    while (p < le && tchar(buf[p]))
        p++;
    if (p == 0 || p >= le || buf[p] != ' ')
        return fail(err, errlen, HTTP1_E_MALFORMED, "malformed request line");
    out->method_str = (const char *)buf;
    out->method_len = p;
    if (p == 3 && memcmp(buf, "GET", 3) == 0)
        out->method = HTTP1_GET;
    else if (p == 4 && memcmp(buf, "HEAD", 4) == 0)
        out->method = HTTP1_HEAD;
    else if (p == 4 && memcmp(buf, "POST", 4) == 0)
        out->method = HTTP1_POST;
    else if (p == 5 && memcmp(buf, "PATCH", 5) == 0)
        out->method = HTTP1_PATCH;
    else if (p == 7 && memcmp(buf, "OPTIONS", 7) == 0)
        out->method = HTTP1_OPTIONS;
    size_t t = ++p;
    while (p < le && buf[p] > 0x20 && buf[p] < 0x7f)
        p++;
    if (p == t || p >= le || buf[p] != ' ')
        return fail(err, errlen, HTTP1_E_MALFORMED, "malformed request target");
    size_t tend = p++;
    const uint8_t *v = buf + p;
    size_t vn = le - p;
    if (vn < 5 || memcmp(v, "HTTP/", 5) != 0)
        return fail(err, errlen, HTTP1_E_MALFORMED, "malformed HTTP version");
    if (vn != 8 || v[6] != '.' || v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9')
        return fail(err, errlen, v[5] >= '2' && v[5] <= '9' ? HTTP1_E_VERSION : HTTP1_E_MALFORMED,
                    "unsupported HTTP version");
    if (v[5] != '1')
        return fail(err, errlen, HTTP1_E_VERSION, "unsupported HTTP version");
    out->minor = v[7] == '0' ? 0 : 1;
    return parse_target(buf + t, tend - t, out, err, errlen);
}

/* What the header fields said about the connection. */
typedef struct fields_seen {
    bool close, keep, host;
} fields_seen;

/* One header field (name: val) into out and *seen. */
static int parse_field(const uint8_t *name, size_t name_len, const uint8_t *val, size_t val_len,
                       http1_request *out, fields_seen *seen, char *err, size_t errlen)
{
    if (name_is(name, name_len, "content-length")) {
        uint64_t cl = 0;
        if (val_len == 0 || val_len > 19)
            return fail(err, errlen, HTTP1_E_MALFORMED, "malformed Content-Length");
        for (size_t k = 0; k < val_len; k++) {
            if (val[k] < '0' || val[k] > '9')
                return fail(err, errlen, HTTP1_E_MALFORMED, "malformed Content-Length");
            cl = cl * 10 + (uint64_t)(val[k] - '0');
        }
        if (out->has_length && out->content_length != cl)
            return fail(err, errlen, HTTP1_E_MALFORMED, "conflicting Content-Length");
        out->has_length = true;
        out->content_length = cl;
    } else if (name_is(name, name_len, "transfer-encoding")) {
        out->transfer_encoding = true;
    } else if (name_is(name, name_len, "connection")) {
        seen->close = seen->close || list_has(val, val_len, "close");
        seen->keep = seen->keep || list_has(val, val_len, "keep-alive");
    } else if (name_is(name, name_len, "expect")) {
        out->expect_100 = list_has(val, val_len, "100-continue");
    } else if (name_is(name, name_len, "authorization")) {
        if (out->authorization)
            return fail(err, errlen, HTTP1_E_MALFORMED, "more than one Authorization");
        out->authorization = (const char *)val;
        out->authorization_len = val_len;
    } else if (name_is(name, name_len, "if-none-match")) {
        out->if_none_match = (const char *)val; /* the last one given */
        out->if_none_match_len = val_len;
    } else if (name_is(name, name_len, "origin")) {
        if (out->origin)
            return fail(err, errlen, HTTP1_E_MALFORMED, "more than one Origin");
        out->origin = (const char *)val;
        out->origin_len = val_len;
    } else if (name_is(name, name_len, "access-control-request-method")) {
        out->cors_preflight = true;
    } else if (name_is(name, name_len, "host")) {
        if (seen->host)
            return fail(err, errlen, HTTP1_E_MALFORMED, "more than one Host");
        seen->host = true;
    }
    return 0;
}

/* The header field lines of buf from p up to the empty line before end. */
static int parse_fields(const uint8_t *buf, size_t p, size_t end, http1_request *out,
                        fields_seen *seen, char *err, size_t errlen)
{
    unsigned nheaders = 0;
    while (p < end) {
        size_t eol = p;
        while (buf[eol] != '\n')
            eol++;
        size_t le = eol > p && buf[eol - 1] == '\r' ? eol - 1 : eol;
        size_t next = eol + 1;
        if (le == p)
            break; /* the empty line */
        if (++nheaders > HTTP1_MAX_HEADERS)
            return fail(err, errlen, HTTP1_E_TOO_LARGE, "more than %d header fields",
                        HTTP1_MAX_HEADERS);
        if (buf[p] == ' ' || buf[p] == '\t')
            return fail(err, errlen, HTTP1_E_MALFORMED, "obsolete line folding");
        size_t n = p;
        while (n < le && tchar(buf[n]))
            n++;
        if (n == p || n >= le || buf[n] != ':')
            return fail(err, errlen, HTTP1_E_MALFORMED, "malformed header field");
        size_t vs = n + 1, ve = le;
        while (vs < ve && (buf[vs] == ' ' || buf[vs] == '\t'))
            vs++;
        while (ve > vs && (buf[ve - 1] == ' ' || buf[ve - 1] == '\t'))
            ve--;
        for (size_t k = vs; k < ve; k++)
            if ((buf[k] < 0x20 && buf[k] != '\t') || buf[k] == 0x7f)
                return fail(err, errlen, HTTP1_E_MALFORMED, "control character in a header");
        int rc = parse_field(buf + p, n - p, buf + vs, ve - vs, out, seen, err, errlen);
        if (rc != 0)
            return rc;
        p = next;
    }
    return 0;
}

int http1_parse_head(const uint8_t *buf, size_t len, size_t max_head, http1_request *out, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof(*out));
    size_t scanned = 0;
    size_t end = http1_find_end(buf, len, &scanned);
    if (end == 0)
        return len >= max_head
                   ? fail(err, errlen, HTTP1_E_TOO_LARGE, "request head passes %zu bytes", max_head)
                   : HTTP1_E_INCOMPLETE;
    if (end > max_head)
        return fail(err, errlen, HTTP1_E_TOO_LARGE, "request head passes %zu bytes", max_head);
    out->head_len = end;
    size_t eol = 0;
    while (buf[eol] != '\n')
        eol++;
    size_t le = eol > 0 && buf[eol - 1] == '\r' ? eol - 1 : eol;
    int rc = parse_request_line(buf, le, out, err, errlen);
    fields_seen seen = {0};
    if (rc == 0)
        rc = parse_fields(buf, eol + 1, end, out, &seen, err, errlen);
    if (rc != 0)
        return rc;
    if (out->minor == 1 && !seen.host)
        return fail(err, errlen, HTTP1_E_MALFORMED, "missing Host header");
    out->keep_alive = out->minor == 1 ? !seen.close : seen.keep && !seen.close;
    return 0;
}

long http1_query_get(const char *query, size_t query_len, const char *key, const char **val)
{
    size_t kn = strlen(key), i = 0;
    while (query && i < query_len) {
        size_t s = i;
        while (i < query_len && query[i] != '&')
            i++;
        const char *eq = memchr(query + s, '=', i - s);
        size_t name_len = eq ? (size_t)(eq - (query + s)) : i - s;
        if (name_len == kn && memcmp(query + s, key, kn) == 0) {
            *val = eq ? eq + 1 : query + i;
            return eq ? (long)(query + i - (eq + 1)) : 0;
        }
        i++;
    }
    return -1;
}

const char *http1_reason(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 204:
        return "No Content";
    case 304:
        return "Not Modified";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 402:
        return "Payment Required";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 411:
        return "Length Required";
    case 413:
        return "Content Too Large";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    }
    return "Unknown";
}

bool http1_origin_listed(const char *list, const char *origin, size_t n)
{
    if (n == 0)
        return false;
    const char *p = list;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\t')
            p++;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ' && *e != '\t')
            e++;
        if ((size_t)(e - p) == n && memcmp(p, origin, n) == 0)
            return true;
        p = e;
    }
    return false;
}
