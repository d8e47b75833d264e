/* tests/unit/test_consolidate_plan.c: the consolidation planner (server/domain/consolidate.c,
 * consolidate_plan) on given memories, without a database: the same text merges whatever the
 * cosine (into the best memory: importance, then accesses, then newest, then lowest id;
 * taking the highest importance and the summed accesses) but only within one type and
 * visibility and with agreeing metadata; near vectors of other texts are counted, never
 * merged; a newer fact supersedes an older with the same attrs.key or the same text but for
 * quantities (not episodes, not when metadata disagree), with the reason recorded; low
 * composites older than the grace period are pruned unless pinned or constraints; the plan
 * does not depend on the rows' order. Runs on the server of tests/fakes/fake_req.h for its
 * settings.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "consolidate.h"
#include "fake_req.h"

#define DIM 8
#define NOW INT64_C(1700000000000)
#define DAY INT64_C(86400000)

static fr_env env;

/* A memory for the planner; vectors are unit axes (orthogonal unless told). */
typedef struct spec {
    uint64_t id;
    int type, scope;
    uint64_t owner;
    const char *content;
    double importance;
    int64_t access;
    int64_t age_days;
    int axis;
    const char *tags; /* [tokens, chains, protocols, strategy_id] */
    const char *attrs_json, *attrs_key;
    bool pinned;
} spec;

static float vecs[64][DIM];

static void rows_of(const spec *sp, size_t n, loader_row *rows)
{
    for (size_t i = 0; i < n; i++) {
        memset(vecs[i], 0, sizeof(vecs[i]));
        vecs[i][sp[i].axis % DIM] = 1.0f;
        if (sp[i].axis >= DIM) /* a near neighbour of axis - DIM */
            vecs[i][(sp[i].axis + 1) % DIM] = 0.05f;
        rows[i] = (loader_row){
            .meta =
                {
                    .present = true,
                    .id = sp[i].id,
                    .scope = sp[i].scope,
                    .type = sp[i].type,
                    .agent_id = sp[i].scope == SCOPE_AGENT ? sp[i].owner : 0,
                    .clade_id = sp[i].scope == SCOPE_CLADE ? sp[i].owner : 0,
                    .importance = sp[i].importance,
                    /* newer: lower id */
                    .created_ms = NOW - sp[i].age_days * DAY - (int64_t)sp[i].id,
                    .accessed_ms = MEMROW_NO_TIME,
                    .access_count = sp[i].access,
                    .expires_ms = MEMROW_NO_TIME,
                    .archived_ms = MEMROW_NO_TIME,
                    .seq = 100 + sp[i].id,
                    .pinned = sp[i].pinned,
                    .tags = sp[i].tags,
                    .tags_len = sp[i].tags ? strlen(sp[i].tags) : 0,
                },
            .attrs_key = sp[i].attrs_key,
            .content = sp[i].content,
            .content_len = strlen(sp[i].content),
            .attrs_json = sp[i].attrs_json,
            .vec = vecs[i],
            .dim = DIM,
        };
    }
}

static int plan(const spec *sp, size_t n, consolidate_fate *f, consolidate_counts *c)
{
    loader_row rows[64];
    rows_of(sp, n, rows);
    char err[256] = "";
    int rc = consolidate_plan(&env.srv, rows, n, DIM, NOW, f, c, err, sizeof(err));
    CHECK_MSG(rc == 0, "plan failed: %d %s", rc, err);
    return rc;
}

static const consolidate_fate *fate_of(const consolidate_fate *f, size_t n, int64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (f[i].id == id)
            return &f[i];
    return NULL;
}

#define FATE(id) fate_of(f, n, id)

static void test_merge(void)
{
    /* young memories with high importance: nothing pruned here */
    const spec sp[] = {
        /* the same text, case and punctuation aside: one cluster; 3 wins on importance */
        {1, MEM_FACT, SCOPE_TENANT, 0, "The bridge is closed.", 0.5, 4, 1, 0, NULL, NULL, NULL, 0},
        {2, MEM_FACT, SCOPE_TENANT, 0, "the BRIDGE is closed", 0.6, 1, 1, 1, NULL, NULL, NULL, 0},
        {3, MEM_FACT, SCOPE_TENANT, 0, "The bridge is  closed!", 0.9, 2, 1, 2, NULL, NULL, NULL, 0},
        /* the same text, another type or another agent's: apart */
        {4, MEM_EPISODE, SCOPE_TENANT, 0, "The bridge is closed.", 0.5, 0, 1, 3, NULL, NULL, NULL,
         0},
        {5, MEM_FACT, SCOPE_AGENT, 9, "The bridge is closed.", 0.5, 0, 1, 4, NULL, NULL, NULL, 0},
        {6, MEM_FACT, SCOPE_AGENT, 10, "The bridge is closed.", 0.5, 0, 1, 5, NULL, NULL, NULL, 0},
        /* the same text about other tokens: not the same memory */
        {7, MEM_FACT, SCOPE_TENANT, 0, "Price moved 5% today", 0.5, 0, 1, 3,
         "[[\"ETH\"], null, null, null]", NULL, NULL, 0},
        {8, MEM_FACT, SCOPE_TENANT, 0, "Price moved 5% today", 0.5, 0, 1, 4,
         "[[\"USDC\"], null, null, null]", NULL, NULL, 0},
        /* ... and where one side has none, or they share one: merged */
        {9, MEM_FACT, SCOPE_TENANT, 0, "Price moved 5% today", 0.5, 0, 1, 5, NULL, NULL, NULL, 0},
        /* near-identical vectors, other texts: counted, left alone */
        {10, MEM_EPISODE, SCOPE_CLADE, 3, "Met Alice at the cafe", 0.5, 0, 1, 1, NULL, NULL, NULL,
         0},
        {11, MEM_EPISODE, SCOPE_CLADE, 3, "Met Bob at the station", 0.5, 0, 1, DIM + 1, NULL, NULL,
         NULL, 0},
    };
    size_t n = sizeof(sp) / sizeof(sp[0]);
    consolidate_fate f[16];
    consolidate_counts c;
    if (plan(sp, n, f, &c) != 0)
        return;
    CHECK(FATE(3)->fate == CONSOLIDATE_LIVE && FATE(3)->importance == 0.9 && FATE(3)->access == 7);
    CHECK(FATE(1)->fate == CONSOLIDATE_MERGED && FATE(1)->into == 3 &&
          strcmp(FATE(1)->rule, "same_text") == 0);
    CHECK(FATE(2)->fate == CONSOLIDATE_MERGED && FATE(2)->into == 3);
    CHECK(FATE(4)->fate == CONSOLIDATE_LIVE && FATE(5)->fate == CONSOLIDATE_LIVE &&
          FATE(6)->fate == CONSOLIDATE_LIVE);
    /* 7 (ETH) and 8 (USDC) contradict each other; 9 (no tokens) joins the first, by id */
    CHECK(FATE(7)->fate == CONSOLIDATE_LIVE && FATE(8)->fate == CONSOLIDATE_LIVE);
    CHECK(FATE(9)->fate == CONSOLIDATE_MERGED && FATE(9)->into == 7);
    CHECK(FATE(10)->fate == CONSOLIDATE_LIVE && FATE(11)->fate == CONSOLIDATE_LIVE);
    CHECK(c.same_text == 3 && c.near_kept == 1 && c.attrs_key == 0 && c.values == 0);
    CHECK(c.rescored == (int)n - 3);
    for (size_t i = 0; i < n; i++)
        CHECK(f[i].why[0] == '\0');

    /* the survivor's order: equal importance, then the most accessed, then the newest */
    const spec tie[] = {
        {21, MEM_FACT, SCOPE_TENANT, 0, "Tie text", 0.5, 3, 5, 0, NULL, NULL, NULL, 0},
        {22, MEM_FACT, SCOPE_TENANT, 0, "tie text", 0.5, 3, 2, 1, NULL, NULL, NULL, 0},
        {23, MEM_FACT, SCOPE_TENANT, 0, "TIE TEXT", 0.5, 1, 1, 2, NULL, NULL, NULL, 0},
    };
    n = 3;
    if (plan(tie, n, f, NULL) == 0) {
        CHECK(FATE(22)->fate == CONSOLIDATE_LIVE && FATE(22)->access == 7);
        CHECK(FATE(21)->into == 22 && FATE(23)->into == 22);
    }
}

static void test_supersede(void)
{
    const spec sp[] = {
        /* a value update: older 2.3%, newer 2.5%; a third older still */
        {1, MEM_FACT, SCOPE_TENANT, 0, "Morpho USDC vault on Base has 2.3% base APY", 0.7, 0, 3, 0,
         NULL, NULL, NULL, 0},
        {2, MEM_FACT, SCOPE_TENANT, 0, "Morpho USDC vault on Base has 2.5% base APY", 0.7, 0, 1, 1,
         NULL, NULL, NULL, 0},
        {3, MEM_FACT, SCOPE_TENANT, 0, "Morpho USDC vault on Base has 2.1% base APY", 0.7, 0, 5, 2,
         NULL, NULL, NULL, 0},
        /* an identifier differs: not an update */
        {4, MEM_FACT, SCOPE_TENANT, 0, "Agent 7 wallet holds 10 ETH", 0.7, 0, 3, 3, NULL, NULL,
         NULL, 0},
        {5, MEM_FACT, SCOPE_TENANT, 0, "Agent 8 wallet holds 10 ETH", 0.7, 0, 1, 4, NULL, NULL,
         NULL, 0},
        /* episodes are never updated */
        {6, MEM_EPISODE, SCOPE_TENANT, 0, "Pool 9 on Base has 4.1% APY", 0.7, 0, 3, 5, NULL, NULL,
         NULL, 0},
        {7, MEM_EPISODE, SCOPE_TENANT, 0, "Pool 9 on Base has 4.4% APY", 0.7, 0, 1, 6, NULL, NULL,
         NULL, 0},
        /* the same attrs.key, whatever the texts */
        {8, MEM_PREFERENCE, SCOPE_AGENT, 4, "Prefers dark mode", 0.7, 0, 9, 0, NULL,
         "{\"key\": \"ui.theme\"}", "ui.theme", 0},
        {9, MEM_PREFERENCE, SCOPE_AGENT, 4, "Wants the light theme now", 0.7, 0, 2, 1, NULL,
         "{\"key\": \"ui.theme\"}", "ui.theme", 0},
        /* a value update whose metadata disagree (strategy): left alone */
        {10, MEM_FACT, SCOPE_CLADE, 2, "Pool 3 TVL is $48M", 0.7, 0, 3, 2,
         "[null, null, null, \"s1\"]", NULL, NULL, 0},
        {11, MEM_FACT, SCOPE_CLADE, 2, "Pool 3 TVL is $51M", 0.7, 0, 1, 3,
         "[null, null, null, \"s2\"]", NULL, NULL, 0},
    };
    size_t n = sizeof(sp) / sizeof(sp[0]);
    consolidate_fate f[16];
    consolidate_counts c;
    if (plan(sp, n, f, &c) != 0)
        return;
    /* each older one points at the newest */
    CHECK(FATE(2)->fate == CONSOLIDATE_LIVE);
    CHECK(FATE(1)->fate == CONSOLIDATE_SUPERSEDED && FATE(1)->into == 2 &&
          strcmp(FATE(1)->rule, "values") == 0);
    CHECK(FATE(3)->fate == CONSOLIDATE_SUPERSEDED && FATE(3)->into == 2);
    CHECK_STR_CONTAINS(FATE(1)->why, "the same text but for values");
    CHECK_STR_CONTAINS(FATE(1)->why, "2.3%");
    CHECK_STR_CONTAINS(FATE(1)->why, "2.5%");
    CHECK(FATE(4)->fate == CONSOLIDATE_LIVE && FATE(5)->fate == CONSOLIDATE_LIVE);
    CHECK(FATE(6)->fate == CONSOLIDATE_LIVE && FATE(7)->fate == CONSOLIDATE_LIVE);
    CHECK(FATE(8)->fate == CONSOLIDATE_SUPERSEDED && FATE(8)->into == 9 &&
          strcmp(FATE(8)->rule, "attrs_key") == 0);
    CHECK(strcmp(FATE(8)->why, "same attrs.key 'ui.theme'") == 0);
    CHECK(FATE(10)->fate == CONSOLIDATE_LIVE && FATE(11)->fate == CONSOLIDATE_LIVE);
    CHECK(c.values == 2 && c.attrs_key == 1 && c.same_text == 0);
}

static void test_prune(void)
{
    /* defaults: prune under 0.15, after 30 days */
    const spec sp[] = {
        {1, MEM_FACT, SCOPE_TENANT, 0, "old and unimportant", 0.0, 0, 400, 0, NULL, NULL, NULL, 0},
        {2, MEM_FACT, SCOPE_TENANT, 0, "old, unimportant, pinned", 0.0, 0, 400, 1, NULL, NULL, NULL,
         1},
        {3, MEM_CONSTRAINT, SCOPE_TENANT, 0, "never trade on Sundays", 0.0, 0, 400, 2, NULL, NULL,
         NULL, 0},
        {4, MEM_FACT, SCOPE_TENANT, 0, "young and unimportant", 0.0, 0, 29, 3, NULL, NULL, NULL, 0},
        {5, MEM_FACT, SCOPE_TENANT, 0, "old but important", 1.0, 0, 400, 4, NULL, NULL, NULL, 0},
        /* old, unimportant alone, but merged with an important copy: the survivor keeps the
         * highest importance and stays */
        {6, MEM_FACT, SCOPE_TENANT, 0, "a merged memory", 0.0, 0, 400, 5, NULL, NULL, NULL, 0},
        {7, MEM_FACT, SCOPE_TENANT, 0, "A merged memory.", 0.9, 0, 401, 6, NULL, NULL, NULL, 0},
    };
    size_t n = sizeof(sp) / sizeof(sp[0]);
    consolidate_fate f[16];
    consolidate_counts c;
    if (plan(sp, n, f, &c) != 0)
        return;
    CHECK(FATE(1)->fate == CONSOLIDATE_PRUNED && strcmp(FATE(1)->rule, "prune") == 0);
    CHECK(FATE(1)->importance < env.srv.cfg.consolidate_prune_threshold); /* its composite */
    CHECK(FATE(2)->fate == CONSOLIDATE_LIVE && FATE(3)->fate == CONSOLIDATE_LIVE);
    CHECK(FATE(4)->fate == CONSOLIDATE_LIVE && FATE(5)->fate == CONSOLIDATE_LIVE);
    CHECK(FATE(7)->fate == CONSOLIDATE_LIVE && FATE(6)->fate == CONSOLIDATE_MERGED &&
          FATE(6)->into == 7);
    CHECK(c.rescored == 6);
}

static void test_order_free(void)
{
    /* a mix of every rule, planned in two orders: the same fates */
    const spec sp[] = {
        {1, MEM_FACT, SCOPE_TENANT, 0, "Same words here", 0.5, 1, 40, 0, NULL, NULL, NULL, 0},
        {2, MEM_FACT, SCOPE_TENANT, 0, "same words here.", 0.5, 1, 40, 1, NULL, NULL, NULL, 0},
        {3, MEM_FACT, SCOPE_TENANT, 0, "Gas averages 25 gwei", 0.5, 0, 40, 2, NULL, NULL, NULL, 0},
        {4, MEM_FACT, SCOPE_TENANT, 0, "Gas averages 18 gwei", 0.5, 0, 39, 3, NULL, NULL, NULL, 0},
        {5, MEM_FACT, SCOPE_TENANT, 0, "Gas averages 30 gwei", 0.5, 0, 38, 4, NULL, NULL, NULL, 0},
        {6, MEM_FACT, SCOPE_TENANT, 0, "forgotten", 0.0, 0, 90, 5, NULL, NULL, NULL, 0},
        {7, MEM_FACT, SCOPE_TENANT, 0, "SAME WORDS HERE", 0.5, 1, 40, 6, NULL, NULL, NULL, 0},
    };
    size_t n = sizeof(sp) / sizeof(sp[0]);
    spec rev[7];
    for (size_t i = 0; i < n; i++)
        rev[i] = sp[n - 1 - i];
    consolidate_fate f[16], g[16];
    if (plan(sp, n, f, NULL) != 0 || plan(rev, n, g, NULL) != 0)
        return;
    for (size_t i = 0; i < n; i++) {
        const consolidate_fate *a = &f[i], *b = fate_of(g, n, a->id);
        CHECK_MSG(b && a->fate == b->fate && a->into == b->into && strcmp(a->why, b->why) == 0,
                  "memory %lld: fate %d into %lld, reversed %d into %lld", (long long)a->id,
                  a->fate, (long long)a->into, b ? b->fate : -1, b ? (long long)b->into : -1);
    }
    /* 1, 2, 7 merged (into the newest: 1, created last within the same day); 3 and 4
     * superseded by 5; 6 pruned */
    CHECK(FATE(1)->fate == CONSOLIDATE_LIVE && FATE(2)->into == 1 && FATE(7)->into == 1);
    CHECK(FATE(3)->into == 5 && FATE(4)->into == 5 && FATE(3)->fate == CONSOLIDATE_SUPERSEDED);
    CHECK(FATE(6)->fate == CONSOLIDATE_PRUNED);
    /* nothing to plan */
    CHECK(consolidate_plan(&env.srv, NULL, 0, DIM, NOW, f, NULL, NULL, 0) == 0);
}

int main(void)
{
    if (fr_env_init(&env, NULL, false) < 0) {
        fprintf(stderr, "cannot set up the test server\n");
        return 1;
    }
    test_merge();
    test_supersede();
    test_prune();
    test_order_free();
    fr_env_fini(&env);
    CHECK_RETURN();
}
