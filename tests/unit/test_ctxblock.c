/* tests/unit/test_ctxblock.c: ctxblock's choice of memories and its text, in both counts:
 * memory.context's (4 tokens for the tags, each entry its bytes / 4) and memory.prompt's
 * byte cap (max_bytes: the whole block with its closing newline fits, tokens_used is its
 * bytes / 4). */
#include <stdbool.h>
#include <string.h>

#include "check.h"
#include "ctxblock.h"

#define NOW 1000000000000LL

static memrow row(uint64_t id, const char *content)
{
    memrow m;
    memset(&m, 0, sizeof(m));
    m.id = id;
    m.type = MEM_FACT;
    m.content = content;
    m.content_len = strlen(content);
    m.importance = 0.5;
    m.created_ms = NOW - 60000; /* age "1m" */
    m.updated_ms = NOW - (int64_t)id;
    return m;
}

/* The bytes of one entry of content n bytes long (no escapes). */
static size_t entry_bytes(size_t n)
{
    return strlen("  <memory type=\"fact\" importance=\"0.50\" age=\"1m\">\n    ") + n +
           strlen("\n  </memory>\n");
}

static void test_byte_cap(void)
{
    const char *c = "0123456789012345678901234567890123456789"; /* 40 bytes */
    memrow rows[3] = {row(1, c), row(2, c), row(3, c)};
    bool have[3] = {true, true, true};
    size_t e = entry_bytes(40), frame = strlen("<agent_memory>\n</agent_memory>\n");
    /* exactly two entries fit, the third would pass by one byte */
    ctxb_opts o = {.max_bytes = frame + 3 * e - 1, .now_ms = NOW, .budget = 1};
    ctxb_block b;
    CHECK(ctxb_build(rows, have, 3, &o, &b) == 0);
    CHECK(b.n == 2 && b.items[0].id == 1 && b.items[1].id == 2);
    CHECK(b.text.len == frame + 2 * e);
    CHECK(b.tokens_used == b.text.len / 4);
    CHECK(b.text.len > 0 && b.text.data[b.text.len - 1] == '\n');
    CHECK(memcmp(b.text.data, "<agent_memory>\n", 15) == 0);
    ctxb_fini(&b);
    /* at the exact size all three fit */
    o.max_bytes = frame + 3 * e;
    CHECK(ctxb_build(rows, have, 3, &o, &b) == 0);
    CHECK(b.n == 3 && b.text.len == o.max_bytes && b.tokens_used == o.max_bytes / 4);
    ctxb_fini(&b);
    /* a gone row is skipped; too small a cap for any entry chooses none */
    have[0] = false;
    o.max_bytes = frame + e;
    CHECK(ctxb_build(rows, have, 3, &o, &b) == 0);
    CHECK(b.n == 1 && b.items[0].id == 2);
    ctxb_fini(&b);
    o.max_bytes = frame + e - 1;
    CHECK(ctxb_build(rows, have, 3, &o, &b) == 0);
    CHECK(b.n == 0 && b.text.len == frame);
    ctxb_fini(&b);
}

static void test_token_budget_unchanged(void)
{
    /* memory.context's count: 4 tokens for the tags, entries by bytes / 4, no newline */
    memrow rows[2] = {row(1, "first & <one>"), row(2, "second")};
    bool have[2] = {true, true};
    size_t e1 = entry_bytes(strlen("first &amp; &lt;one&gt;"));
    ctxb_opts o = {.budget = 4 + e1 / 4, .now_ms = NOW};
    ctxb_block b;
    CHECK(ctxb_build(rows, have, 2, &o, &b) == 0);
    CHECK(b.n == 1 && b.tokens_used == 4 + e1 / 4);
    CHECK(b.text.len == strlen("<agent_memory>\n</agent_memory>") + e1);
    CHECK(b.text.data[b.text.len - 1] == '>');
    CHECK_STR_CONTAINS(b.text.data, "first &amp; &lt;one&gt;");
    ctxb_fini(&b);
}

int main(void)
{
    test_byte_cap();
    test_token_budget_unchanged();
    CHECK_RETURN();
}
