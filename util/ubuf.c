/* util/ubuf.c: a growable byte buffer (see ubuf.h). */
#include "ubuf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ubuf_fini frees b's memory and zeroes it. */
void ubuf_fini(ubuf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

/* ubuf_reserve makes room for n more bytes plus the terminating NUL; 0 or -ENOMEM. */
int ubuf_reserve(ubuf *b, size_t n)
{
    if (n > SIZE_MAX - b->len - 1)
        return -ENOMEM;
    size_t need = b->len + n + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap < 64 ? 64 : b->cap;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (p == NULL)
        return -ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

/* ubuf_append appends n bytes; 0 or -ENOMEM (contents unchanged). */
int ubuf_append(ubuf *b, const void *p, size_t n)
{
    if (n == 0)
        return 0;
    if (ubuf_reserve(b, n) != 0)
        return -ENOMEM;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

/* ubuf_putc appends one byte. */
int ubuf_putc(ubuf *b, char c)
{
    return ubuf_append(b, &c, 1);
}

/* ubuf_puts appends a C string. */
int ubuf_puts(ubuf *b, const char *s)
{
    return ubuf_append(b, s, strlen(s));
}

/* ubuf_printf appends formatted text: one vsnprintf into the free room, a second after
 * growing when it did not fit. */
int ubuf_printf(ubuf *b, const char *fmt, ...)
{
    va_list ap;
    char dummy;
    size_t room = b->cap > b->len ? b->cap - b->len : 0;
    va_start(ap, fmt);
    int n = vsnprintf(room ? b->data + b->len : &dummy, room ? room : 1, fmt, ap);
    va_end(ap);
    if (n < 0) {
        if (b->data)
            b->data[b->len] = '\0';
        return -EINVAL;
    }
    if ((size_t)n >= room) {
        if (ubuf_reserve(b, (size_t)n) != 0) {
            if (b->data)
                b->data[b->len] = '\0'; /* the first try may have written past len */
            return -ENOMEM;
        }
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
    return 0;
}

/* ubuf_truncate shortens the contents to len bytes. */
void ubuf_truncate(ubuf *b, size_t len)
{
    if (len >= b->len)
        return;
    b->len = len;
    b->data[len] = '\0';
}

int ubuf_sink_write(void *sink, const char *p, size_t n)
{
    ubuf_sink *s = sink;
    if (s->failed)
        return -1;
    if (ubuf_append(&s->b, p, n) < 0) {
        s->failed = true;
        return -1;
    }
    return 0;
}
