/* server/core/procstat.c: this process's CPU, memory, descriptors and start time from /proc
 * (see procstat.h). */
#include "procstat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Reads one unsigned decimal field at *p (after any spaces) and moves *p past it. Returns 0,
 * or -EINVAL when there is none. */
static int field(const char **p, const char *end, uint64_t *v)
{
    const char *s = *p;
    while (s < end && *s == ' ')
        s++;
    bool neg = s < end && *s == '-'; /* priority and nice may be negative: read as 0 */
    if (neg)
        s++;
    if (s >= end || *s < '0' || *s > '9')
        return -EINVAL;
    uint64_t x = 0;
    while (s < end && *s >= '0' && *s <= '9')
        x = x * 10 + (uint64_t)(*s++ - '0');
    *v = neg ? 0 : x;
    *p = s;
    return 0;
}

int procstat_parse_stat(const char *line, size_t len, procstat_raw *out)
{
    /* "pid (comm) state f4 f5 ...": comm may hold ") ", so the last ')' ends it */
    const char *close = NULL;
    for (size_t i = 0; i < len; i++)
        if (line[i] == ')')
            close = line + i;
    if (!close || (size_t)(close - line) + 3 > len || close[1] != ' ')
        return -EINVAL;
    const char *p = close + 2, *end = line + len;
    /* field 3, the state: one letter */
    if (p >= end || *p == ' ')
        return -EINVAL;
    p++;
    uint64_t f[25] = {0};
    for (int k = 4; k <= 24; k++)
        if (field(&p, end, &f[k]) < 0)
            return -EINVAL;
    out->utime = f[14];
    out->stime = f[15];
    out->starttime = f[22];
    out->vsize = f[23];
    out->rss = f[24];
    return 0;
}

/* The boot time (btime of /proc/stat), Unix seconds; 0 when unknown. */
static uint64_t boot_time(void)
{
    FILE *f = fopen("/proc/stat", "re");
    if (!f)
        return 0;
    char line[256];
    unsigned long long bt = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "btime %llu", &bt) == 1)
            break;
    fclose(f);
    return bt;
}

/* Open descriptors: the entries of /proc/self/fd but the one reading it. */
static long count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    long n = 0;
    int self = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (atoi(e->d_name) != self)
            n++;
    }
    closedir(d);
    return n;
}

int procstat_read(procstat *p)
{
    memset(p, 0, sizeof(*p));
    p->open_fds = count_fds();
    struct rlimit rl;
    p->max_fds =
        getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long)rl.rlim_cur : -1;
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char buf[1024];
    ssize_t n = read(fd, buf, sizeof(buf));
    int err = errno;
    close(fd);
    if (n < 0)
        return -err;
    procstat_raw r;
    if (procstat_parse_stat(buf, (size_t)n, &r) < 0)
        return -EINVAL;
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    if (tick <= 0)
        tick = 100;
    p->cpu_seconds = (double)(r.utime + r.stime) / (double)tick;
    uint64_t bt = boot_time();
    p->start_time = bt ? (double)bt + (double)r.starttime / (double)tick : 0;
    p->virtual_bytes = r.vsize;
    p->resident_bytes = r.rss * (uint64_t)(page > 0 ? page : 4096);
    return 0;
}
