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

int log_enabled(log_level level)
{
    return (int)level >= atomic_load_explicit(&current_level, memory_order_relaxed);
}

void log_write(log_level level, const char *file, int line, const char *fmt, ...)
{
    char buf[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s:%d ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, names[level < 4 ? level : 3], base, line);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(buf) - 2)
        len = sizeof(buf) - 2;
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
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
