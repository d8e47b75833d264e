/* server/core/notify.c: sd_notify messages to the service manager (see notify.h). */
#include "notify.h"

#include <stdio.h>
#include <time.h>

#include "log.h"

#ifdef ENGRAM_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

/* Sends msg; a failure is logged at debug level only: the service manager decides what a
 * missing message means (a start timeout), and engramd goes on serving. */
static void emit(const char *msg)
{
    int rc = sd_notify(0, msg);
    if (rc < 0)
        log_debug("sd_notify failed: %d", rc);
}

bool notify_enabled(void)
{
    return true;
}

uint64_t notify_watchdog_usec(void)
{
    uint64_t usec = 0;
    return sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
}
#else
static void emit(const char *msg)
{
    (void)msg;
}

bool notify_enabled(void)
{
    return false;
}

uint64_t notify_watchdog_usec(void)
{
    return 0;
}
#endif

void notify_ready(const char *status)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "READY=1%s%s", status ? "\nSTATUS=" : "", status ? status : "");
    emit(msg);
}

void notify_reloading(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char msg[128];
    snprintf(msg, sizeof(msg),
             "RELOADING=1\nSTATUS=reloading the configuration\nMONOTONIC_USEC=%llu",
             (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000u);
    emit(msg);
}

void notify_stopping(const char *status)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "STOPPING=1%s%s", status ? "\nSTATUS=" : "", status ? status : "");
    emit(msg);
}

void notify_status(const char *status)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "STATUS=%s", status);
    emit(msg);
}

void notify_watchdog(void)
{
    emit("WATCHDOG=1");
}
