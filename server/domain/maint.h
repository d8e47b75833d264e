/* server/domain/maint.h: periodic maintenance on background threads.
 *
 * Every maintenance_interval_s: purge expired memories (with change records, so every
 * index drops them), idempotency keys older than a day, expired session checkpoints; fold
 * pending access counts into the memories' rows (memory_access, see migrations/0001_baseline.sql);
 * prune changes older than change_log_retention_hours from the change log. Other capabilities add
 * their own periodic tasks here.
 */
#ifndef ENGRAM_SERVER_MAINT_H
#define ENGRAM_SERVER_MAINT_H

#include "server.h"

/* maint_start registers the periodic tasks with s->bg. Returns 0 or -ENOMEM. */
int maint_start(server *s);

/* maint_set_interval makes the periodic tasks run every interval_s seconds from now on
 * (maintenance_interval_s reloaded on SIGHUP). Returns 0 or -ENOENT before maint_start. */
int maint_set_interval(server *s, int interval_s);

#endif
