/* server/domain/ctxblock.c: the context block of memory.context (see ctxblock.h). */
#include "ctxblock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ctxb_xml_escape(ubuf *b, const char *s, size_t n)
{
    int rc = 0;
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        const char *rep = NULL;
        switch (s[i]) {
        case '&':
            rep = "&amp;";
            break;
        case '<':
            rep = "&lt;";
            break;
        case '>':
            rep = "&gt;";
            break;
        case '"':
            rep = "&quot;";
            break;
        case '\'':
            rep = "&apos;";
            break;
        default:
            continue;
        }
        rc |= ubuf_append(b, s + start, i - start);
        rc |= ubuf_append(b, rep, strlen(rep));
        start = i + 1;
    }
    rc |= ubuf_append(b, s + start, n - start);
    return rc < 0 ? -ENOMEM : 0;
}

void ctxb_age(int64_t age_ms, char *out, size_t n)
{
    int64_t min = age_ms > 0 ? age_ms / 60000 : 0;
    int64_t h = min / 60, d = h / 24;
    if (min < 60)
        snprintf(out, n, "%lldm", (long long)min);
    else if (h < 24)
        snprintf(out, n, "%lldh", (long long)h);
    else if (d < 7)
        snprintf(out, n, "%lldd", (long long)d);
    else if (d < 30)
        snprintf(out, n, "%lldw", (long long)(d / 7));
    else if (d < 365)
        snprintf(out, n, "%lldmo", (long long)(d / 30));
    else
        snprintf(out, n, "%lldy", (long long)(d / 365));
}

static int cmp_stable(const void *a, const void *b)
{
    const ctxb_item *x = a, *y = b;
    if (x->updated_ms != y->updated_ms)
        return x->updated_ms < y->updated_ms ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Fills e for row m and returns its tokens (bytes / 4), or -ENOMEM. */
static int64_t item_make(const ctxb_opts *o, const memrow *m, ctxb_item *e)
{
    e->id = m->id;
    e->updated_ms = m->updated_ms;
    if (o->search_results) {
        char type[32];
        const char *tn = memrow_type_name(m->type);
        size_t k = 0;
        for (; tn[k] && k < sizeof(type) - 1; k++)
            type[k] = tn[k] >= 'a' && tn[k] <= 'z' ? (char)(tn[k] - 'a' + 'A') : tn[k];
        type[k] = '\0';
        int sl = snprintf(e->source, sizeof(e->source), "engram://%lld/%s/%llu",
                          (long long)o->tenant_id, tn, (unsigned long long)m->id);
        int tl = snprintf(e->title, sizeof(e->title), "[%s] memory %llu", type,
                          (unsigned long long)m->id);
        return (int64_t)(((size_t)sl + (size_t)tl + m->content_len) / 4);
    }
    char head[160], age[24];
    ctxb_age(o->now_ms - m->created_ms, age, sizeof(age));
    int hl =
        snprintf(head, sizeof(head), "  <memory type=\"%s\" importance=\"%.2f\" age=\"%s\">\n    ",
                 memrow_type_name(m->type), m->importance, age);
    int rc = ubuf_append(&e->text, head, (size_t)hl);
    rc |= ctxb_xml_escape(&e->text, m->content, m->content_len);
    rc |= ubuf_append(&e->text, "\n  </memory>\n", 13);
    if (rc < 0)
        return -ENOMEM;
    return (int64_t)(e->text.len / 4);
}

void ctxb_fini(ctxb_block *b)
{
    for (size_t k = 0; b->items && k < b->n; k++)
        ubuf_fini(&b->items[k].text);
    free(b->items);
    ubuf_fini(&b->text);
    memset(b, 0, sizeof(*b));
}

int ctxb_build(const memrow *rows, const bool *have, size_t nrows, const ctxb_opts *o,
               ctxb_block *out)
{
    memset(out, 0, sizeof(*out));
    bool exact = o->max_bytes && !o->search_results;
    size_t bytes = 31; /* exact: "<agent_memory>\n", "</agent_memory>\n" */
    out->tokens_used = o->search_results ? 0 : CTXB_TAG_TOKENS;
    out->items = calloc(nrows + 1, sizeof(*out->items));
    if (!out->items)
        return -ENOMEM;
    /* which entries fit: in rank order, up to the first that does not */
    for (size_t i = 0; i < nrows; i++) {
        if (!have[i])
            continue; /* gone since the search */
        ctxb_item *e = &out->items[out->n];
        e->idx = i;
        int64_t tokens = item_make(o, &rows[i], e);
        if (tokens < 0)
            goto oom;
        if (exact ? bytes + e->text.len > o->max_bytes
                  : out->tokens_used + (uint64_t)tokens > o->budget) {
            ubuf_fini(&e->text);
            break;
        }
        out->tokens_used += (uint64_t)tokens;
        bytes += e->text.len;
        out->n++;
    }
    if (o->stable)
        qsort(out->items, out->n, sizeof(*out->items), cmp_stable);
    if (!o->search_results) {
        int rc = ubuf_append(&out->text, "<agent_memory>\n", 15);
        for (size_t k = 0; k < out->n; k++)
            rc |= ubuf_append(&out->text, out->items[k].text.data, out->items[k].text.len);
        rc |= ubuf_append(&out->text, "</agent_memory>\n", exact ? 16 : 15);
        if (rc < 0)
            goto oom;
        if (exact)
            out->tokens_used = out->text.len / 4;
    }
    return 0;
oom:
    out->n++; /* the entry being made holds text too */
    ctxb_fini(out);
    return -ENOMEM;
}
