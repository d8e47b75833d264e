/* bench/scrape.c: blocking HTTP GET and Prometheus text reading (see scrape.h). */
#include "scrape.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BODY_MAX ((size_t)16 * 1024 * 1024)

const char *const scrape_methods[8] = {
    "memory.search", "memory.context", "memory.store", "memory.store_batch",
    "memory.delete", "auth",           "ping",         "memory.stats"};

static long long ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is ready for events or the deadline passes. */
static int wait_fd(int fd, short events, long long deadline)
{
    for (;;) {
        long long left = deadline - ms_now();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -errno;
    }
}

int scrape_get(const char *host, uint16_t port, const char *path, int timeout_ms, int *status,
               char **body)
{
    *body = NULL;
    long long deadline = ms_now() + timeout_ms;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    char ports[8];
    snprintf(ports, sizeof(ports), "%u", (unsigned)port);
    if (getaddrinfo(host, ports, &hints, &ai) != 0)
        return -EHOSTUNREACH;
    int rc = 0;
    char *buf = NULL;
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            rc = -errno;
            goto out;
        }
        if ((rc = wait_fd(fd, POLLOUT, deadline)) != 0)
            goto out;
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr) {
            rc = -soerr;
            goto out;
        }
    }
    char req[512];
    int rl = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host);
    for (int off = 0; off < rl;) {
        ssize_t n = write(fd, req + off, (size_t)(rl - off));
        if (n > 0) {
            off += (int)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if ((rc = wait_fd(fd, POLLOUT, deadline)) != 0)
                goto out;
        } else {
            rc = -errno;
            goto out;
        }
    }
    size_t len = 0, cap = 16384;
    if (!(buf = malloc(cap))) {
        rc = -ENOMEM;
        goto out;
    }
    for (;;) {
        if (cap - len < 4096) {
            if (cap >= BODY_MAX) {
                rc = -EPROTO;
                goto out;
            }
            char *p = realloc(buf, cap * 2);
            if (!p) {
                rc = -ENOMEM;
                goto out;
            }
            buf = p;
            cap *= 2;
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n > 0) {
            len += (size_t)n;
        } else if (n == 0) {
            break;
        } else if (errno == EAGAIN || errno == EINTR) {
            if ((rc = wait_fd(fd, POLLIN, deadline)) != 0)
                goto out;
        } else {
            rc = -errno;
            goto out;
        }
    }
    buf[len] = '\0';
    int code = 0;
    char *hdr_end = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/%*d.%*d %d", &code) != 1 || !hdr_end) {
        rc = -EPROTO;
        goto out;
    }
    hdr_end += 4;
    size_t blen = len - (size_t)(hdr_end - buf);
    memmove(buf, hdr_end, blen + 1);
    *status = code;
    *body = buf;
    buf = NULL;
out:
    free(buf);
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return rc;
}

bool scrape_value(const char *body, const char *name, const char *labels, double *v)
{
    size_t nl = strlen(name), ll = labels ? strlen(labels) : 0;
    for (const char *line = body; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (line[0] != '#' && len > nl && memcmp(line, name, nl) == 0) {
            const char *p = line + nl;
            bool match = false;
            if (!labels && *p == ' ') {
                match = true;
                p++;
            } else if (labels && *p == '{' && len > nl + ll + 2 && memcmp(p + 1, labels, ll) == 0 &&
                       p[1 + ll] == '}' && p[2 + ll] == ' ') {
                match = true;
                p += ll + 3;
            }
            if (match) {
                char *e;
                double d = strtod(p, &e);
                if (e != p) {
                    *v = d;
                    return true;
                }
            }
        }
        line = end ? end + 1 : NULL;
    }
    return false;
}

void scrape_metrics(const char *host, uint16_t port, scrape_sample *out)
{
    memset(out, 0, sizeof(*out));
    int status = 0;
    char *body = NULL;
    if (scrape_get(host, port, "/metrics", 5000, &status, &body) != 0 || status != 200) {
        free(body);
        return;
    }
    out->ok = scrape_value(body, "engram_process_resident_bytes", NULL, &out->resident_bytes);
    scrape_value(body, "engram_index_vectors", NULL, &out->index_vectors);
    scrape_value(body, "engram_index_bytes", NULL, &out->index_bytes);
    for (size_t i = 0; i < 8; i++) {
        char lab[96];
        snprintf(lab, sizeof(lab), "method=\"%s\"", scrape_methods[i]);
        scrape_value(body, "engram_request_duration_seconds_sum", lab, &out->sum_s[i]);
        scrape_value(body, "engram_request_duration_seconds_count", lab, &out->count[i]);
    }
    free(body);
}
