/* server/core/notify.h: telling the service manager what engramd is doing (sd_notify).
 *
 * Under systemd with Type=notify, NOTIFY_SOCKET names a datagram socket: engramd sends
 * READY=1 once it serves with its indexes loaded, RELOADING=1 then READY=1 around a SIGHUP
 * reload, STOPPING=1 when shutdown begins, STATUS= lines, and WATCHDOG=1 pings when the unit
 * sets WatchdogSec. Without NOTIFY_SOCKET (or a build without libsystemd) every function
 * does nothing. Callable from any thread.
 */
#ifndef ENGRAM_SERVER_NOTIFY_H
#define ENGRAM_SERVER_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* notify_ready sends READY=1 with status as STATUS= (NULL: none). */
void notify_ready(const char *status);

/* notify_reloading sends RELOADING=1 with the monotonic time (MONOTONIC_USEC=), as
 * systemd's Type=notify-reload expects; notify_ready ends the reload. */
void notify_reloading(void);

/* notify_stopping sends STOPPING=1 with status as STATUS= (NULL: none). */
void notify_stopping(const char *status);

/* notify_status sends STATUS=status alone. */
void notify_status(const char *status);

/* notify_watchdog_usec returns the watchdog interval the service manager asked this process
 * for (WatchdogSec=), in microseconds, or 0 when there is none. */
uint64_t notify_watchdog_usec(void);

/* notify_watchdog sends WATCHDOG=1. */
void notify_watchdog(void);

/* notify_enabled tells whether engramd was built with libsystemd. */
bool notify_enabled(void);

#endif
