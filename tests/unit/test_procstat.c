/* tests/unit/test_procstat.c: server/core/procstat: the /proc/<pid>/stat line (command names
 * with spaces and parentheses, negative fields, cut lines) and this process's own figures. */
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "procstat.h"

/* A line as Linux 6.1 writes it, fields 1-24 and a few after (values made up). */
#define TAIL                                                                                       \
    " S 1 100 100 0 -1 4194560 2817 0 0 0 1234 567 0 0 20 -5 9 0 884211 1073741824 2560 "          \
    "18446744073709551615 1 1 0 0 0 0 0 4096 17922 0 0 0 17 1 0 0 0 0 0\n"

static void test_parse(void)
{
    procstat_raw r;
    const char *plain = "4242 (engramd)" TAIL;
    CHECK(procstat_parse_stat(plain, strlen(plain), &r) == 0);
    CHECK(r.utime == 1234 && r.stime == 567);
    CHECK(r.starttime == 884211);
    CHECK(r.vsize == 1073741824u && r.rss == 2560);

    /* the command name is the process's to choose: the last ')' ends it */
    const char *odd = "4242 (a) S 1 (b) c)" TAIL;
    memset(&r, 0, sizeof(r));
    CHECK(procstat_parse_stat(odd, strlen(odd), &r) == 0);
    CHECK(r.utime == 1234 && r.rss == 2560);

    /* not a stat line, or cut before field 24 */
    const char *bad[] = {"",
                         "4242 engramd S 1",
                         "4242 (engramd)",
                         "4242 (engramd) ",
                         "4242 (engramd) S 1 100 100 0 -1 4194560 2817 0 0 0 1234 567 0 0",
                         "4242 (engramd) S x 100"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK_MSG(procstat_parse_stat(bad[i], strlen(bad[i]), &r) < 0, "accepted '%s'", bad[i]);
    /* the length bounds the line: a cut copy of a good line is refused */
    CHECK(procstat_parse_stat(plain, 40, &r) < 0);
}

static void test_self(void)
{
    procstat p;
    CHECK(procstat_read(&p) == 0);
    CHECK(p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes);
    CHECK(p.cpu_seconds >= 0);
    CHECK(p.start_time > 1e9); /* after 2001: a Unix time, not ticks since boot */
    /* a descriptor opened shows in the count */
    long before = p.open_fds;
    int fds[2];
    CHECK(pipe(fds) == 0);
    CHECK(procstat_read(&p) == 0);
    CHECK_MSG(p.open_fds == before + 2, "%ld open, %ld before a pipe", p.open_fds, before);
    CHECK(p.max_fds == -1 || p.max_fds >= p.open_fds);
    close(fds[0]);
    close(fds[1]);
}

int main(void)
{
    test_parse();
    test_self();
    CHECK_RETURN();
}
