/* server/core/plimits.h: the byte limits of the method tables that operators set.
 *
 * A parameter names one with RPC_P_LIMIT(PLIM_x) in its flags (proto/rpc.h): the binder
 * checks it before the handler runs, the OpenAPI document shows its value, and the error
 * names the parameter and the limit. Each is a setting (server/core/config.c).
 */
#ifndef ENGRAM_SERVER_PLIMITS_H
#define ENGRAM_SERVER_PLIMITS_H

#include "config.h"

enum {
    PLIM_NONE = 0,
    PLIM_CONTENT,    /* max_content_bytes: a memory's content */
    PLIM_METADATA,   /* max_metadata_bytes: a memory's or a checkpoint's metadata, filters */
    PLIM_QUERY,      /* max_query_bytes: a search's query text */
    PLIM_ENTRY,      /* max_entry_bytes: transcript entries, summaries, tasks, system prompts */
    PLIM_SCRATCHPAD, /* max_scratchpad_bytes */
    PLIM_NOTE,       /* max_note_bytes: a note's value */
    PLIM_WORK_ITEM,  /* max_work_item_bytes: a work item's description */
    PLIM_LABEL,      /* max_label_bytes: a checkpoint's label */
    PLIM_MESSAGE,    /* max_message_bytes: a whole request (a batch, a session's config) */
    PLIM_TOP_K,      /* max_top_k: the most results of one search */
    PLIM__COUNT
};

/* plimits_apply makes the values of cfg the limits the binder checks (rpc_limits_set).
 * Call once at start, before any worker runs. */
void plimits_apply(const config *cfg);

/* plimits_setting returns the name of the setting of limit i ("" for none). */
const char *plimits_setting(unsigned i);

#endif
