/* server/core/log.h: the one logging function: leveled, thread-safe, file:line on every line.
 *
 * The level is checked before anything is formatted. Lines go to stderr (one write(2) per
 * line, so lines from threads never interleave). Never pass secrets, embeddings or memory
 * content at info level or above.
 */
#ifndef ENGRAM_SERVER_LOG_H
#define ENGRAM_SERVER_LOG_H

typedef enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF } log_level;

/* log_set_level sets the threshold; log_parse_level maps "debug".."error" to a level or -1. */
void log_set_level(log_level level);
int log_parse_level(const char *s);

/* The form of a line. LOG_TEXT: "2024-05-01T12:00:00.123Z info  file.c:42 message".
 * LOG_JSON: one JSON object per line, {"time":"2024-05-01T12:00:00.123Z","level":"info",
 * "file":"file.c","line":42,"message":"..."}: the message escaped (control characters,
 * quotes, backslashes; bytes that are not UTF-8 become U+FFFD), so that every line parses. */
typedef enum log_format { LOG_TEXT = 0, LOG_JSON } log_format;

/* log_set_format sets the form of the lines written from now on; log_parse_format maps
 * "text" and "json" to a format, anything else to -1. */
void log_set_format(log_format format);
int log_parse_format(const char *s);

/* log_enabled tells whether level would be written. */
int log_enabled(log_level level);

/* log_write formats and writes one line; use the LOG_* macros instead. */
void log_write(log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* log_route_libevent sends libevent's own messages through log_write. */
void log_route_libevent(void);

/* log_route_storage sends storage's reports of unparsable rows (storage/rowerr.h) through
 * log_write at warn level. */
void log_route_storage(void);

#define LOG_AT(lvl, ...)                                                                           \
    do {                                                                                           \
        if (log_enabled(lvl))                                                                      \
            log_write(lvl, __FILE__, __LINE__, __VA_ARGS__);                                       \
    } while (0)
#define log_debug(...) LOG_AT(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) LOG_AT(LOG_INFO, __VA_ARGS__)
#define log_warn(...) LOG_AT(LOG_WARN, __VA_ARGS__)
#define log_error(...) LOG_AT(LOG_ERROR, __VA_ARGS__)

#endif
