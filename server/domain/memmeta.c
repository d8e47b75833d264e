/* server/domain/memmeta.c: a memory's index metadata from its row (see memmeta.h). */
#include "memmeta.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "memfilter.h"

static uint32_t clamp_u32(int64_t v)
{
    return v < 0 ? 0 : v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

int mem_meta_from_db(mem_meta *m, const memrow_meta *row)
{
    memset(m, 0, sizeof(*m));
    m->agent_id = row->agent_id;
    m->clade_id = row->clade_id;
    m->seq = row->seq;
    m->created_ms = row->created_ms;
    m->access = mem_access_word(row->accessed_ms == MEMROW_NO_TIME ? 0 : row->accessed_ms,
                                row->access_count < 0 ? 0 : (uint64_t)row->access_count);
    m->expires_ms = row->expires_ms == MEMROW_NO_TIME ? INT64_MAX : row->expires_ms;
    m->archived = row->archived_ms != MEMROW_NO_TIME;
    m->importance = (float)row->importance;
    m->cited = clamp_u32(row->cited_count);
    m->injected = clamp_u32(row->injected_count);
    m->type = (uint8_t)row->type;
    m->scope = (uint8_t)row->scope & 0xf;
    m->pinned = row->pinned;
    /* tags: derived here by the one rule (memfilter.h); none from a store, whose tags come
     * from the request */
    if (row->tags_len > 0) {
        uint64_t *tags = NULL;
        uint32_t n = 0;
        int rc = mf_tags_from_json(row->tags, row->tags_len, &tags, &n);
        if (rc < 0)
            return rc;
        if (n > UINT16_MAX) { /* not a row a store wrote (mf_check_metadata) */
            free(tags);
            return -EINVAL;
        }
        m->tags = tags;
        m->ntags = (uint16_t)n;
    }
    return 0;
}
