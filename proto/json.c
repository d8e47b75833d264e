/* proto/json.c: conversion between MessagePack values and JSON text (RFC 8259). */
#include "json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc.h"

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

/* ---- MessagePack to JSON --------------------------------------------------------------- */

static int put_string(json_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t run = 0;
    int rc;

    if (!rpc_utf8_valid(s, n))
        return JSON_E_UNSUPPORTED;
    if ((rc = ubuf_putc(b, '"')) != 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[7];
        size_t elen = 2;

        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        /* flush the run of plain bytes before this one */
        if ((rc = json_buf_append(b, s + run, i - run)) != 0)
            return rc;
        run = i + 1;
        esc[0] = '\\';
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            elen = 6;
            break;
        }
        if ((rc = json_buf_append(b, esc, elen)) != 0)
            return rc;
    }
    /* msgpack-c may give an empty string a NULL pointer: no arithmetic on it then */
    if (run < n && (rc = json_buf_append(b, s + run, n - run)) != 0)
        return rc;
    return ubuf_putc(b, '"');
}

static int put_base64(json_buf *b, const unsigned char *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char q[4];
    int rc;

    if ((rc = ubuf_putc(b, '"')) != 0)
        return rc;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        size_t left = n - i;
        if (left > 1)
            v |= (uint32_t)p[i + 1] << 8;
        if (left > 2)
            v |= p[i + 2];
        q[0] = tab[(v >> 18) & 63];
        q[1] = tab[(v >> 12) & 63];
        q[2] = left > 1 ? tab[(v >> 6) & 63] : '=';
        q[3] = left > 2 ? tab[v & 63] : '=';
        if ((rc = json_buf_append(b, q, 4)) != 0)
            return rc;
    }
    return ubuf_putc(b, '"');
}

/* Prints a finite double with the fewest of 15, 16 or 17 significant digits that read back
 * to the same value, keeping a ".0" on integral values so that the text reads back as a
 * float rather than an integer. Needs the C locale's decimal point, as the server has. */
static int put_double(json_buf *b, double d, bool single)
{
    char s[40];
    int lo = single ? 6 : 15, hi = single ? 9 : 17;

    if (!isfinite(d))
        return JSON_E_UNSUPPORTED;
    for (int prec = lo; prec <= hi; prec++) {
        snprintf(s, sizeof(s), "%.*g", prec, d);
        if (single ? strtof(s, NULL) == (float)d : strtod(s, NULL) == d)
            break;
    }
    if (strpbrk(s, ".eE") == NULL)
        strcat(s, ".0");
    return ubuf_puts(b, s);
}

static int put_newline(json_buf *b, unsigned flags, unsigned indent)
{
    int rc;

    if (!(flags & JSON_PRETTY))
        return 0;
    if ((rc = ubuf_putc(b, '\n')) != 0)
        return rc;
    for (unsigned i = 0; i < indent; i++)
        if ((rc = json_buf_append(b, "  ", 2)) != 0)
            return rc;
    return 0;
}

static int from_msgpack(const msgpack_object *o, unsigned flags, unsigned depth, unsigned max_depth,
                        json_buf *out)
{
    char num[32];
    int rc = 0;

    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return ubuf_puts(out, "null");
    case MSGPACK_OBJECT_BOOLEAN:
        return ubuf_puts(out, o->via.boolean ? "true" : "false");
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        snprintf(num, sizeof(num), "%" PRIu64, o->via.u64);
        return ubuf_puts(out, num);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        snprintf(num, sizeof(num), "%" PRId64, o->via.i64);
        return ubuf_puts(out, num);
    case MSGPACK_OBJECT_FLOAT32:
        return put_double(out, o->via.f64, true);
    case MSGPACK_OBJECT_FLOAT64:
        return put_double(out, o->via.f64, false);
    case MSGPACK_OBJECT_STR:
        return put_string(out, o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_BIN:
        if (!(flags & JSON_BIN_BASE64))
            return JSON_E_UNSUPPORTED;
        return put_base64(out, (const unsigned char *)o->via.bin.ptr, o->via.bin.size);
    case MSGPACK_OBJECT_ARRAY:
    case MSGPACK_OBJECT_MAP: {
        bool map = o->type == MSGPACK_OBJECT_MAP;
        uint32_t n = map ? o->via.map.size : o->via.array.size;

        if (depth >= max_depth)
            return JSON_E_TOO_DEEP;
        if ((rc = ubuf_putc(out, map ? '{' : '[')) != 0)
            return rc;
        for (uint32_t i = 0; i < n; i++) {
            if (i > 0 && (rc = ubuf_putc(out, ',')) != 0)
                return rc;
            if ((rc = put_newline(out, flags, depth + 1)) != 0)
                return rc;
            if (map) {
                const msgpack_object *k = &o->via.map.ptr[i].key;
                if (k->type != MSGPACK_OBJECT_STR)
                    return JSON_E_UNSUPPORTED;
                if ((rc = put_string(out, k->via.str.ptr, k->via.str.size)) != 0)
                    return rc;
                if ((rc = ubuf_puts(out, (flags & JSON_PRETTY) ? ": " : ":")) != 0)
                    return rc;
                rc = from_msgpack(&o->via.map.ptr[i].val, flags, depth + 1, max_depth, out);
            } else {
                rc = from_msgpack(&o->via.array.ptr[i], flags, depth + 1, max_depth, out);
            }
            if (rc != 0)
                return rc;
        }
        if (n > 0 && (rc = put_newline(out, flags, depth)) != 0)
            return rc;
        return ubuf_putc(out, map ? '}' : ']');
    }
    default: /* ext */
        return JSON_E_UNSUPPORTED;
    }
}

int json_from_msgpack(const msgpack_object *o, unsigned flags, unsigned max_depth, json_buf *out)
{
    size_t start = out->len;
    int rc = from_msgpack(o, flags, 0, max_depth, out);

    if (rc != 0 && out->data != NULL) {
        out->len = start; /* leave out as it was */
        out->data[start] = '\0';
    }
    return rc;
}

/* ---- JSON to MessagePack --------------------------------------------------------------- *
 *
 * MessagePack writes a container's count before its elements and JSON does not state it,
 * so the text is parsed twice: the first pass checks everything and records the count of
 * every container in the order they open, the second packs. Both passes share one parser
 * with an explicit stack, so hostile nesting cannot exhaust the C stack. */

struct frame {
    bool object;
    size_t slot;    /* index of this container's count in counts */
    uint32_t count; /* elements (pairs for objects) so far */
};

struct parser {
    const char *s;
    size_t len, pos;
    unsigned max_depth;
    msgpack_packer *pk; /* NULL in the checking pass */
    char *err;
    size_t errlen;

    uint32_t *counts; /* per container, in opening order */
    size_t ncounts, capcounts, next;

    struct frame *stack;
    size_t depth, capstack;

    json_buf scratch; /* decoded strings and number text */
};

PRINTF_LIKE(3, 4)
static int syntax(struct parser *p, size_t at, const char *fmt, ...)
{
    char msg[160];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (p->err != NULL && p->errlen > 0)
        snprintf(p->err, p->errlen, "%s at offset %zu", msg, at);
    return JSON_E_SYNTAX;
}

static void skip_ws(struct parser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static int hex4(struct parser *p, size_t at, unsigned *v)
{
    *v = 0;
    for (size_t i = 0; i < 4; i++) {
        char c;
        unsigned d;
        if (at + i >= p->len)
            return syntax(p, at + i, "truncated \\u escape");
        c = p->s[at + i];
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else
            return syntax(p, at + i, "invalid hex digit in \\u escape");
        *v = (*v << 4) | d;
    }
    return 0;
}

static size_t utf8_put(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Parses the string whose opening quote is at p->pos. In the packing pass the decoded
 * bytes are packed as a str (map keys too). */
static int parse_string(struct parser *p)
{
    size_t start = p->pos, run;
    int rc;

    p->pos++;
    p->scratch.len = 0;
    run = p->pos;
    for (;;) {
        unsigned char c;
        size_t at = p->pos;

        if (p->pos >= p->len)
            return syntax(p, start, "unterminated string");
        c = (unsigned char)p->s[p->pos];
        if (c == '"')
            break;
        if (c < 0x20)
            return syntax(p, at, "control character 0x%02x in string", c);
        if (c >= 0x80) {
            /* the longest valid sequence that starts here */
            size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
            if (n > p->len - at || !rpc_utf8_valid(p->s + at, n))
                return syntax(p, at, "invalid UTF-8 in string");
            p->pos += n;
            continue;
        }
        if (c != '\\') {
            p->pos++;
            continue;
        }
        /* an escape: flush the plain run before it */
        if (p->pk != NULL && (rc = json_buf_append(&p->scratch, p->s + run, at - run)) != 0)
            return rc;
        if (at + 1 >= p->len)
            return syntax(p, start, "unterminated string");
        {
            char out[4];
            size_t olen = 1;
            char e = p->s[at + 1];
            unsigned cp, lo;

            p->pos = at + 2;
            switch (e) {
            case '"':
            case '\\':
            case '/':
                out[0] = e;
                break;
            case 'b':
                out[0] = '\b';
                break;
            case 'f':
                out[0] = '\f';
                break;
            case 'n':
                out[0] = '\n';
                break;
            case 'r':
                out[0] = '\r';
                break;
            case 't':
                out[0] = '\t';
                break;
            case 'u':
                if ((rc = hex4(p, at + 2, &cp)) != 0)
                    return rc;
                p->pos = at + 6;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return syntax(p, at, "lone low surrogate \\u%04x", cp);
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                        return syntax(p, at, "lone high surrogate \\u%04x", cp);
                    if ((rc = hex4(p, p->pos + 2, &lo)) != 0)
                        return rc;
                    if (lo < 0xdc00 || lo > 0xdfff)
                        return syntax(p, at, "high surrogate \\u%04x not followed by a low one",
                                      cp);
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    p->pos += 6;
                }
                olen = utf8_put(out, cp);
                break;
            default:
                return syntax(p, at, "invalid escape \\%c",
                              (unsigned char)e >= 0x20 && (unsigned char)e < 0x7f ? e : '?');
            }
            if (p->pk != NULL && (rc = json_buf_append(&p->scratch, out, olen)) != 0)
                return rc;
            run = p->pos;
        }
    }
    /* p->pos is at the closing quote */
    if (p->pk != NULL) {
        const char *body;
        size_t n;
        if (p->scratch.len == 0) {
            body = p->s + run; /* no escapes before the last run: pack straight from text */
            n = p->pos - run;
        } else {
            if ((rc = json_buf_append(&p->scratch, p->s + run, p->pos - run)) != 0)
                return rc;
            body = p->scratch.data;
            n = p->scratch.len;
        }
        if (n > UINT32_MAX)
            return syntax(p, start, "string too long");
        if (msgpack_pack_str(p->pk, n) != 0 || (n > 0 && msgpack_pack_str_body(p->pk, body, n)))
            return -ENOMEM;
    }
    p->pos++;
    return 0;
}

/* Parses the number at p->pos: integers that fit int64 or uint64 pack as integers, the
 * rest as float64 (past float64's range is an error). */
static int parse_number(struct parser *p)
{
    size_t start = p->pos, i = p->pos;
    bool neg = false, is_float = false, overflow = false;
    uint64_t mag = 0;
    int rc;

    if (p->s[i] == '-') {
        neg = true;
        i++;
    }
    if (i >= p->len || p->s[i] < '0' || p->s[i] > '9')
        return syntax(p, start, "invalid number");
    if (p->s[i] == '0') {
        i++;
        if (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            return syntax(p, start, "leading zeros are not allowed");
    } else {
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') {
            unsigned d = (unsigned)(p->s[i] - '0');
            if (mag > (UINT64_MAX - d) / 10)
                overflow = true;
            else
                mag = mag * 10 + d;
            i++;
        }
    }
    if (i < p->len && p->s[i] == '.') {
        is_float = true;
        i++;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9')
            return syntax(p, i, "expected a digit after the decimal point");
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        is_float = true;
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-'))
            i++;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9')
            return syntax(p, i, "expected a digit in the exponent");
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
    }
    p->pos = i;
    if (!is_float && !overflow && (!neg || mag <= (uint64_t)INT64_MAX + 1)) {
        if (p->pk == NULL)
            return 0;
        if (!neg)
            rc = msgpack_pack_uint64(p->pk, mag);
        else if (mag == (uint64_t)INT64_MAX + 1)
            rc = msgpack_pack_int64(p->pk, INT64_MIN);
        else
            rc = msgpack_pack_int64(p->pk, -(int64_t)mag);
        return rc != 0 ? -ENOMEM : 0;
    }
    {
        /* strtod wants a terminated string: copy the token */
        double d;
        p->scratch.len = 0;
        if ((rc = json_buf_append(&p->scratch, p->s + start, i - start)) != 0)
            return rc;
        d = strtod(p->scratch.data, NULL);
        if (!isfinite(d))
            return syntax(p, start, "number out of range");
        if (p->pk != NULL && msgpack_pack_double(p->pk, d) != 0)
            return -ENOMEM;
    }
    return 0;
}

static int literal(struct parser *p, const char *word)
{
    size_t n = strlen(word);
    int rc = 0;

    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return syntax(p, p->pos, "invalid literal");
    p->pos += n;
    if (p->pk == NULL)
        return 0;
    if (word[0] == 't')
        rc = msgpack_pack_true(p->pk);
    else if (word[0] == 'f')
        rc = msgpack_pack_false(p->pk);
    else
        rc = msgpack_pack_nil(p->pk);
    return rc != 0 ? -ENOMEM : 0;
}

/* Opens an array or object at p->pos. */
static int open_container(struct parser *p, bool object)
{
    struct frame *f;
    int rc;

    if (p->depth >= p->max_depth) {
        if (p->err != NULL && p->errlen > 0)
            snprintf(p->err, p->errlen, "nesting deeper than %u at offset %zu", p->max_depth,
                     p->pos);
        return JSON_E_TOO_DEEP;
    }
    if (p->depth == p->capstack) {
        size_t cap = p->capstack ? 2 * p->capstack : 16;
        struct frame *ns = realloc(p->stack, cap * sizeof(*ns));
        if (ns == NULL)
            return -ENOMEM;
        p->stack = ns;
        p->capstack = cap;
    }
    f = &p->stack[p->depth++];
    f->object = object;
    f->count = 0;
    if (p->pk == NULL) {
        if (p->ncounts == p->capcounts) {
            size_t cap = p->capcounts ? 2 * p->capcounts : 64;
            uint32_t *nc = realloc(p->counts, cap * sizeof(*nc));
            if (nc == NULL)
                return -ENOMEM;
            p->counts = nc;
            p->capcounts = cap;
        }
        f->slot = p->ncounts;
        p->counts[p->ncounts++] = 0;
    } else {
        uint32_t n = p->counts[p->next++];
        rc = object ? msgpack_pack_map(p->pk, n) : msgpack_pack_array(p->pk, n);
        if (rc != 0)
            return -ENOMEM;
    }
    p->pos++;
    return 0;
}

/* Parses an object key and its colon, leaving p->pos at the value. */
static int object_key(struct parser *p)
{
    int rc;

    skip_ws(p);
    if (p->pos >= p->len || p->s[p->pos] != '"')
        return syntax(p, p->pos, "expected a string key");
    if ((rc = parse_string(p)) != 0)
        return rc;
    skip_ws(p);
    if (p->pos >= p->len || p->s[p->pos] != ':')
        return syntax(p, p->pos, "expected ':'");
    p->pos++;
    return 0;
}

static int parse_text(struct parser *p)
{
    int rc;

    p->pos = 0;
    p->depth = 0;
    p->next = 0;
    for (;;) {
        struct frame *f;
        char c;

        /* a value */
        skip_ws(p);
        if (p->pos >= p->len)
            return syntax(p, p->pos, "unexpected end of input, expected a value");
        c = p->s[p->pos];
        if (c == '{' || c == '[') {
            if ((rc = open_container(p, c == '{')) != 0)
                return rc;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == (c == '{' ? '}' : ']')) {
                p->pos++;
                p->depth--; /* empty: its count stays 0 */
            } else {
                if (c == '{' && (rc = object_key(p)) != 0)
                    return rc;
                continue; /* parse the first element */
            }
        } else if (c == '"') {
            if ((rc = parse_string(p)) != 0)
                return rc;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if ((rc = parse_number(p)) != 0)
                return rc;
        } else if (c == 't' || c == 'f' || c == 'n') {
            if ((rc = literal(p, c == 't' ? "true" : c == 'f' ? "false" : "null")) != 0)
                return rc;
        } else {
            return syntax(p, p->pos, "expected a value");
        }

        /* after a value: close containers or move to the next element */
        for (;;) {
            if (p->depth == 0) {
                skip_ws(p);
                if (p->pos != p->len)
                    return syntax(p, p->pos, "unexpected data after the value");
                return 0;
            }
            f = &p->stack[p->depth - 1];
            if (f->count == UINT32_MAX)
                return syntax(p, p->pos, "too many elements");
            f->count++;
            skip_ws(p);
            if (p->pos >= p->len)
                return syntax(p, p->pos, "unexpected end of input, expected ',' or '%c'",
                              f->object ? '}' : ']');
            c = p->s[p->pos];
            if (c == ',') {
                p->pos++;
                if (f->object && (rc = object_key(p)) != 0)
                    return rc;
                break; /* the next element */
            }
            if (c != (f->object ? '}' : ']'))
                return syntax(p, p->pos, "expected ',' or '%c'", f->object ? '}' : ']');
            p->pos++;
            if (p->pk == NULL)
                p->counts[f->slot] = f->count;
            p->depth--;
        }
    }
}

int json_to_msgpack(const char *text, size_t len, unsigned max_depth, msgpack_packer *pk, char *err,
                    size_t errlen)
{
    struct parser p;
    int rc;

    memset(&p, 0, sizeof(p));
    p.s = text;
    p.len = len;
    p.max_depth = max_depth;
    p.err = err;
    p.errlen = errlen;
    if (err != NULL && errlen > 0)
        err[0] = '\0';

    rc = parse_text(&p); /* check everything, count containers */
    if (rc == 0 && pk != NULL) {
        p.pk = pk;
        rc = parse_text(&p); /* pack; the text is known to be valid */
    }
    if (rc == -ENOMEM && err != NULL && errlen > 0)
        snprintf(err, errlen, "out of memory");
    free(p.counts);
    free(p.stack);
    json_buf_fini(&p.scratch);
    return rc;
}
