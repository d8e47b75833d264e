/* util/ubuf.h: a growable byte buffer, always NUL-terminated once it holds memory.
 *
 * For text built piece by piece: SQL array literals, JSON (proto/json.h's json_buf is this
 * type), XML context blocks. Initialize with {0}; data stays NULL until the
 * first append. After an append, data[len] is '\0', so data can be used as a C string when
 * the contents hold no NUL of their own.
 *
 * Ownership: the caller owns the ubuf struct; the buffer owns data, freed by ubuf_fini (a
 * caller may also take data and free it itself, then must not call ubuf_fini or reuse b
 * without zeroing it). Thread-safety: none; one thread at a time per buffer.
 * Results: 0, or -ENOMEM when growing fails (the contents are unchanged then). The buffer
 * grows by doubling from 64 bytes.
 */
#ifndef ENGRAM_UTIL_UBUF_H
#define ENGRAM_UTIL_UBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ubuf {
    char *data; /* owned; NUL-terminated when not NULL */
    size_t len; /* bytes held, without the terminating NUL */
    size_t cap; /* bytes allocated */
} ubuf;

#if defined(__GNUC__)
#define UBUF_PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define UBUF_PRINTF_LIKE(f, a)
#endif

/* ubuf_fini frees b's memory and zeroes it (a zeroed buffer is a no-op). */
void ubuf_fini(ubuf *b);

/* ubuf_reserve makes room for n more bytes plus the NUL. Returns 0 or -ENOMEM. */
int ubuf_reserve(ubuf *b, size_t n);

/* ubuf_append appends the n bytes at p (p may be NULL when n is 0: a no-op that allocates
 * nothing). Returns 0 or -ENOMEM. */
int ubuf_append(ubuf *b, const void *p, size_t n);

/* ubuf_putc appends one byte; ubuf_puts appends the C string s. Return 0 or -ENOMEM. */
int ubuf_putc(ubuf *b, char c);
int ubuf_puts(ubuf *b, const char *s);

/* ubuf_printf appends printf-formatted text. Returns 0, -ENOMEM, or -EINVAL when the format
 * fails (an encoding error); the contents are unchanged on failure. */
int ubuf_printf(ubuf *b, const char *fmt, ...) UBUF_PRINTF_LIKE(2, 3);

/* A ubuf as a write sink, e.g. a msgpack_packer's callback: the first failed append is
 * remembered and every later one refused, so a writer that ignores return values cannot
 * leave a buffer with a hole in it. Initialize with {0}; free with ubuf_fini(&s.b). */
typedef struct ubuf_sink {
    ubuf b;
    bool failed;
} ubuf_sink;

/* ubuf_sink_write appends the n bytes at p to the ubuf_sink *sink. Returns 0, or -1 once an
 * append has failed (out of memory). The signature is msgpack's write callback's. */
int ubuf_sink_write(void *sink, const char *p, size_t n);

/* ubuf_truncate shortens the contents to len bytes (len <= b->len; larger is ignored),
 * keeping the memory. */
void ubuf_truncate(ubuf *b, size_t len);

#endif
