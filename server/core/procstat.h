/* server/core/procstat.h: what the kernel says about this process (/proc/self), for the
 * process_* metrics as the Prometheus client libraries define them (CPU time, memory,
 * descriptors, start time).
 *
 * Reading is a few small file reads and a directory scan; any thread may call it.
 */
#ifndef ENGRAM_SERVER_PROCSTAT_H
#define ENGRAM_SERVER_PROCSTAT_H

#include <stddef.h>
#include <stdint.h>

typedef struct procstat {
    double cpu_seconds;      /* user and system CPU time spent */
    double start_time;       /* when the process started, Unix time in seconds */
    uint64_t virtual_bytes;  /* virtual memory size */
    uint64_t resident_bytes; /* resident set size */
    long open_fds;           /* open file descriptors; -1: unknown */
    long max_fds;            /* the soft RLIMIT_NOFILE; -1: unlimited or unknown */
} procstat;

/* The fields of a /proc/<pid>/stat line that procstat uses, in their kernel units. */
typedef struct procstat_raw {
    uint64_t utime, stime; /* clock ticks */
    uint64_t starttime;    /* clock ticks after boot */
    uint64_t vsize;        /* bytes */
    uint64_t rss;          /* pages */
} procstat_raw;

/* procstat_parse_stat reads the line of len bytes (the contents of /proc/<pid>/stat; the
 * command name in parentheses may itself hold spaces and parentheses) into *out. Returns 0,
 * or -EINVAL when the line is not of that form. */
int procstat_parse_stat(const char *line, size_t len, procstat_raw *out);

/* procstat_read fills *p for this process. Returns 0, or a negative errno when
 * /proc/self/stat cannot be read or parsed (then *p is zero but for the -1 fields). */
int procstat_read(procstat *p);

#endif
