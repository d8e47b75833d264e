/* server/domain/ctxblock.h: the context block of memory.context: which memories fit a token
 * budget, and their text.
 *
 * Rows come in rank order. Entries are taken in that order up to the first that does not
 * fit the budget. Format xml: the <agent_memory> block, one
 * <memory type=".." importance="0.80" age="3d"> element per memory (content escaped), each
 * counted as its bytes / 4 tokens, plus CTXB_TAG_TOKENS for the enclosing tags. Format
 * search_results: items {source "engram://<tenant>/<type>/<id>", title "[TYPE] memory <id>",
 * content}, each counted as (bytes of source + title + content) / 4. Order stable lists the
 * chosen entries by their last change, oldest first (ties by id), so a block repeated across
 * calls keeps a long unchanged prefix for prompt caches.
 */
#ifndef ENGRAM_SERVER_CTXBLOCK_H
#define ENGRAM_SERVER_CTXBLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memrow.h"
#include "ubuf.h"

#define CTXB_TAG_TOKENS 4 /* the seed's allowance for <agent_memory></agent_memory> */

typedef struct ctxb_opts {
    bool search_results; /* format search_results, else xml */
    bool stable;         /* order stable, else rank order */
    uint64_t budget;     /* tokens */
    /* max_bytes (xml format): when not 0, entries are chosen while the whole block with a
     * newline after its closing tag fits max_bytes, that newline is part of text, and
     * tokens_used is text's bytes / 4 (memory.prompt's count); budget is ignored then */
    uint64_t max_bytes;
    int64_t now_ms;    /* for the ages */
    int64_t tenant_id; /* for the sources */
} ctxb_opts;

/* One chosen memory. */
typedef struct ctxb_item {
    size_t idx; /* into the rows given */
    uint64_t id;
    int64_t updated_ms;
    ubuf text;       /* its xml element (xml format) */
    char source[96]; /* search_results format */
    char title[64];
} ctxb_item;

typedef struct ctxb_block {
    ctxb_item *items; /* owned; n of them, in the order to show */
    size_t n;
    ubuf text; /* the whole <agent_memory> block (xml format) */
    uint64_t tokens_used;
} ctxb_block;

/* ctxb_build chooses among rows[0..nrows) (rank order; a row whose have[i] is false is
 * skipped: gone since the search) and renders them into *out. Returns 0 or -ENOMEM (out
 * holds nothing then). Free with ctxb_fini. */
int ctxb_build(const memrow *rows, const bool *have, size_t nrows, const ctxb_opts *o,
               ctxb_block *out);
void ctxb_fini(ctxb_block *b);

/* ctxb_age formats the seed's age display of age_ms: minutes under an hour, hours under a
 * day, days under a week, weeks under 30 days, months (30 days) under a year (365 days),
 * then years ("45m", "3h", "2d", "1w", "4mo", "2y"). */
void ctxb_age(int64_t age_ms, char *out, size_t n);

/* ctxb_xml_escape appends s (n bytes) escaped for XML text and attributes. Returns 0 or
 * -ENOMEM. */
int ctxb_xml_escape(ubuf *b, const char *s, size_t n);

#endif
