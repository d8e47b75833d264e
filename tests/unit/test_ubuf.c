/* tests/unit/test_ubuf.c: util/ubuf.h: appends, growth, termination, reserve, printf and
 * truncation. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ubuf.h"

static void test_append(void)
{
    ubuf b = {0};
    CHECK(ubuf_append(&b, NULL, 0) == 0);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0); /* nothing allocated */
    CHECK(ubuf_append(&b, "ab", 2) == 0);
    CHECK(b.len == 2 && strcmp(b.data, "ab") == 0 && b.cap >= 3);
    CHECK(ubuf_putc(&b, 'c') == 0 && ubuf_puts(&b, "def") == 0);
    CHECK(b.len == 6 && strcmp(b.data, "abcdef") == 0);
    /* bytes, NUL included, are kept as given */
    CHECK(ubuf_append(&b, "\0x", 2) == 0);
    CHECK(b.len == 8 && memcmp(b.data, "abcdef\0x", 9) == 0);
    ubuf_fini(&b);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);
    ubuf_fini(&b); /* again: a no-op */

    /* growth across many doublings keeps every byte */
    for (size_t i = 0; i < 100000; i++) {
        char c = (char)('a' + i % 26);
        if (ubuf_putc(&b, c) != 0)
            break;
    }
    CHECK(b.len == 100000 && b.cap > b.len && b.data[b.len] == '\0');
    int bad = 0;
    for (size_t i = 0; i < b.len; i++)
        bad += b.data[i] != (char)('a' + i % 26);
    CHECK(bad == 0);
    ubuf_fini(&b);
}

static void test_reserve(void)
{
    ubuf b = {0};
    CHECK(ubuf_reserve(&b, 100) == 0 && b.cap >= 101 && b.len == 0);
    char *before = b.data;
    size_t cap = b.cap;
    for (int i = 0; i < 100; i++)
        ubuf_putc(&b, 'x');
    CHECK(b.data == before && b.cap == cap); /* no reallocation after a reserve */
    CHECK(ubuf_reserve(&b, SIZE_MAX) == -ENOMEM);
    CHECK(ubuf_append(&b, "y", SIZE_MAX - 1) == -ENOMEM);
    CHECK(b.len == 100 && b.data[100] == '\0'); /* unchanged */
    ubuf_fini(&b);
}

static void test_printf(void)
{
    ubuf b = {0};
    CHECK(ubuf_printf(&b, "%d,%s", 42, "x") == 0);
    CHECK(b.len == 4 && strcmp(b.data, "42,x") == 0);
    /* longer than the room left: the second try after growing */
    char big[300];
    memset(big, 'z', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    CHECK(ubuf_printf(&b, "[%s]", big) == 0);
    CHECK(b.len == 4 + 301 && b.data[4] == '[' && b.data[b.len - 1] == ']' && b.data[b.len] == 0);
    CHECK(ubuf_printf(&b, "%s", "") == 0 && b.len == 305);
    ubuf_fini(&b);
    CHECK(ubuf_printf(&b, "%s", "") == 0 && b.len == 0 && b.data && b.data[0] == '\0');
    ubuf_fini(&b);
}

static void test_truncate(void)
{
    ubuf b = {0};
    ubuf_puts(&b, "{1,2,3}");
    ubuf_truncate(&b, b.len - 1);
    CHECK(b.len == 6 && strcmp(b.data, "{1,2,3") == 0);
    ubuf_truncate(&b, 100); /* longer: ignored */
    CHECK(b.len == 6);
    ubuf_puts(&b, ",4}");
    CHECK(strcmp(b.data, "{1,2,3,4}") == 0);
    ubuf_truncate(&b, 0);
    CHECK(b.len == 0 && b.data[0] == '\0' && b.cap > 0);
    ubuf_fini(&b);
}

/* A sink refuses every write after the first that failed, so a packer that ignores return
 * values cannot leave a hole; before that it appends like ubuf_append. */
static void test_sink(void)
{
    ubuf_sink s = {0};
    CHECK(ubuf_sink_write(&s, "ab", 2) == 0);
    CHECK(ubuf_sink_write(&s, "cd", 2) == 0);
    CHECK(s.b.len == 4 && memcmp(s.b.data, "abcd", 5) == 0 && !s.failed);
    CHECK(ubuf_sink_write(&s, "x", SIZE_MAX - 1) == -1); /* cannot grow: fails, sticks */
    CHECK(s.failed && s.b.len == 4);
    CHECK(ubuf_sink_write(&s, "e", 1) == -1);
    CHECK(s.b.len == 4 && memcmp(s.b.data, "abcd", 5) == 0);
    ubuf_fini(&s.b);
}

int main(void)
{
    test_sink();
    test_append();
    test_reserve();
    test_printf();
    test_truncate();
    CHECK_RETURN();
}
