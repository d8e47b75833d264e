/* server/core/log.c: leveled logging to stderr (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "rowerr.h"

static atomic_int current_level = LOG_INFO;
static atomic_int current_format = LOG_TEXT;
static const char *const names[] = {"debug", "info", "warn", "error"};

void log_set_level(log_level level)
{
    atomic_store(&current_level, (int)level);
}

int log_parse_level(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    if (strcmp(s, "warning") == 0)
        return LOG_WARN;
    if (strcmp(s, "off") == 0)
        return LOG_OFF;
    return -1;
}

void log_set_format(log_format format)
{
    atomic_store(&current_format, (int)format);
}

int log_parse_format(const char *s)
{
    if (strcmp(s, "text") == 0)
        return LOG_TEXT;
    if (strcmp(s, "json") == 0)
        return LOG_JSON;
    return -1;
}

int log_enabled(log_level level)
{
    return (int)level >= atomic_load_explicit(&current_level, memory_order_relaxed);
}

/* The length of the UTF-8 sequence at s (n bytes left), or 0 when it is not a valid one
 * (overlong forms, surrogates and code points past U+10FFFF included). */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c < 0x80                ? 1
                 : c >= 0xc2 && c < 0xe0 ? 2
                 : c >= 0xe0 && c < 0xf0 ? 3
                 : c >= 0xf0 && c < 0xf5 ? 4
                                         : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) || (c == 0xf0 && s[1] < 0x90) ||
        (c == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

/* Appends msg (n bytes) to out (cap bytes, *len used) as the inside of a JSON string; stops
 * early, at a character's boundary, when the rest would not fit with room for reserve more
 * bytes. */
static void json_escape(char *out, size_t cap, size_t *len, const char *msg, size_t n,
                        size_t reserve)
{
    const unsigned char *s = (const unsigned char *)msg;
    for (size_t i = 0; i < n;) {
        char esc[8];
        const char *piece = esc;
        size_t plen, step = 1;
        unsigned c = s[i];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c, plen = 2;
        } else if (c == '\n' || c == '\r' || c == '\t') {
            esc[0] = '\\', esc[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't', plen = 2;
        } else if (c < 0x20 || c == 0x7f) {
            plen = (size_t)snprintf(esc, sizeof(esc), "\\u%04x", c);
        } else if (c < 0x80) {
            esc[0] = (char)c, plen = 1;
        } else if ((step = utf8_len(s + i, n - i)) > 0) {
            piece = msg + i, plen = step;
        } else {
            piece = "\\ufffd", plen = 6, step = 1;
        }
        if (*len + plen + reserve > cap)
            return;
        memcpy(out + *len, piece, plen);
        *len += plen;
        i += step;
    }
}

void log_write(log_level level, const char *file, int line, const char *fmt, ...)
{
    char msg[2048], out[8192];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    const char *lname = names[level < 4 ? level : 3];
    char when[80]; /* room for any year and nanosecond the compiler can imagine */
    snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    size_t mlen = m < 0 ? 0 : (size_t)m < sizeof(msg) ? (size_t)m : sizeof(msg) - 1;
    int n;
    size_t len;
    if (atomic_load_explicit(&current_format, memory_order_relaxed) == LOG_JSON) {
        /* file names are the source tree's: nothing in them needs escaping */
        n = snprintf(out, sizeof(out),
                     "{\"time\":\"%s\",\"level\":\"%s\",\"file\":\"%s\",\"line\":%d,"
                     "\"message\":\"",
                     when, lname, base, line);
        if (n < 0 || (size_t)n >= sizeof(out))
            return;
        len = (size_t)n;
        json_escape(out, sizeof(out), &len, msg, mlen, 3);
        memcpy(out + len, "\"}\n", 3);
        len += 3;
    } else {
        n = snprintf(out, sizeof(out), "%s %-5s %s:%d %.*s", when, lname, base, line, (int)mlen,
                     msg);
        if (n < 0)
            return;
        len = (size_t)n < sizeof(out) - 1 ? (size_t)n : sizeof(out) - 2;
        out[len++] = '\n';
    }
    ssize_t w = write(STDERR_FILENO, out, len);
    (void)w;
}

static void libevent_cb(int severity, const char *msg)
{
    log_level l = severity == EVENT_LOG_DEBUG  ? LOG_DEBUG
                  : severity == EVENT_LOG_MSG  ? LOG_INFO
                  : severity == EVENT_LOG_WARN ? LOG_WARN
                                               : LOG_ERROR;
    LOG_AT(l, "libevent: %s", msg);
}

void log_route_libevent(void)
{
    event_set_log_callback(libevent_cb);
}

static void rowerr_cb(const char *file, int line, const char *msg)
{
    if (log_enabled(LOG_WARN))
        log_write(LOG_WARN, file, line, "%s", msg);
}

void log_route_storage(void)
{
    rowerr_set_log(rowerr_cb);
}
