/* server/core/plimits.c: the settings behind the method tables' limits (see plimits.h). */
#include "plimits.h"

#include "rpc.h"

static const char *const names[PLIM__COUNT] = {
    [PLIM_NONE] = "",
    [PLIM_CONTENT] = "max_content_bytes",
    [PLIM_METADATA] = "max_metadata_bytes",
    [PLIM_QUERY] = "max_query_bytes",
    [PLIM_ENTRY] = "max_entry_bytes",
    [PLIM_SCRATCHPAD] = "max_scratchpad_bytes",
    [PLIM_NOTE] = "max_note_bytes",
    [PLIM_WORK_ITEM] = "max_work_item_bytes",
    [PLIM_LABEL] = "max_label_bytes",
    [PLIM_MESSAGE] = "max_message_bytes",
    [PLIM_TOP_K] = "max_top_k",
};

void plimits_apply(const config *cfg)
{
    double v[PLIM__COUNT] = {
        [PLIM_CONTENT] = (double)cfg->max_content_bytes,
        [PLIM_METADATA] = (double)cfg->max_metadata_bytes,
        [PLIM_QUERY] = (double)cfg->max_query_bytes,
        [PLIM_ENTRY] = (double)cfg->max_entry_bytes,
        [PLIM_SCRATCHPAD] = (double)cfg->max_scratchpad_bytes,
        [PLIM_NOTE] = (double)cfg->max_note_bytes,
        [PLIM_WORK_ITEM] = (double)cfg->max_work_item_bytes,
        [PLIM_LABEL] = (double)cfg->max_label_bytes,
        [PLIM_MESSAGE] = (double)cfg->max_message_bytes,
        [PLIM_TOP_K] = (double)cfg->max_top_k,
    };
    rpc_limits_set(v, PLIM__COUNT);
}

const char *plimits_setting(unsigned i)
{
    return i < PLIM__COUNT ? names[i] : "";
}
