/* tests/unit/test_textrule.c: server/domain/textrule: the text rules that let consolidation
 * merge or supersede without a model (issue 32).
 *
 * Hand cases for each part of the rule (tokens, values, quantities and identifiers, the
 * reasons), then the whole labelled set tests/data/consolidation_pairs.jsonl through the
 * rule as the planner applies it (a shared attrs.key first, then the texts): no pair of a
 * distinct entity, a negation or another subject may come out as an update, and no pair but
 * duplicates and paraphrases as the same text. The figures are printed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "json.h"
#include "textrule.h"

#ifndef TEXTRULE_PAIRS
#error "TEXTRULE_PAIRS: the path of tests/data/consolidation_pairs.jsonl"
#endif

static int cmp(const char *a, const char *b, char *why, size_t whylen)
{
    return textrule_compare(a, strlen(a), b, strlen(b), why, whylen);
}

#define SAME(a, b) CHECK_MSG(cmp(a, b, NULL, 0) == TEXTRULE_SAME, "'%s' / '%s'", a, b)
#define OTHER(a, b) CHECK_MSG(cmp(a, b, NULL, 0) == TEXTRULE_OTHER, "'%s' / '%s'", a, b)

/* older -> newer is a value update whose reason is want */
static void values(const char *a, const char *b, const char *want)
{
    char why[200];
    int r = cmp(a, b, why, sizeof(why));
    CHECK_MSG(r == TEXTRULE_VALUES && strcmp(why, want) == 0, "'%s' -> '%s': %d '%s' (want '%s')",
              a, b, r, why, want);
}

static void rendered(const char *text, const char *want)
{
    char out[300];
    CHECK(textrule_render(text, strlen(text), out, sizeof(out)) == 0);
    CHECK_MSG(strcmp(out, want) == 0, "'%s' renders '%s', want '%s'", text, out, want);
}

static void test_issue_cases(void)
{
    /* issue 32: one entity apart is never an update, whatever the cosine */
    OTHER("Morpho USDC vault on Base has 2.3% base APY",
          "Morpho DAI vault on Base has 2.3% base APY");
    OTHER("Agent 7 wallet holds 10 ETH on Arbitrum", "Agent 7 wallet holds 10 ETH on Optimism");
    values("Morpho USDC vault on Base has 2.3% base APY",
           "Morpho USDC vault on Base has 2.5% base APY", "2.3% -> 2.5%");
    values("Agent 7 wallet holds 10 ETH on Arbitrum", "Agent 7 wallet holds 12 ETH on Arbitrum",
           "10 ETH -> 12 ETH");
    /* paraphrases are left alone without a model */
    OTHER("The user likes a dark colour theme", "The user prefers dark mode");
}

static void test_words(void)
{
    /* case, punctuation, spacing, articles and a few empty words do not matter */
    SAME("The user prefers dark mode.", "the user  prefers Dark Mode");
    SAME("User likes jazz", "A user likes jazz!");
    SAME("The vault currently pays 3%", "The vault pays 3%");
    SAME("The user's wallet", "The user\xe2\x80\x99s wallet");
    SAME("dark-mode", "dark mode");
    /* negative contractions are written out */
    SAME("The bridge doesn't support USDT", "The bridge does not support USDT");
    SAME("The user can't eat gluten", "The user cannot eat gluten");
    SAME("X won't run", "X will not run");
    /* a capital A inside a sentence is a name, not an article */
    OTHER("Plan A costs 5 USD", "Plan B costs 5 USD");
    OTHER("Fee tier A", "Fee tier");
    /* negation, antonyms and other words are not values */
    OTHER("X is enabled", "X is not enabled");
    OTHER("X is enabled", "X isn't enabled");
    OTHER("X is enabled", "X is disabled");
    OTHER("The vault has a withdrawal fee of 0.5%", "The vault has no withdrawal fee of 0.5%");
    OTHER("Alice owes Bob 500 USDC", "Bob owes Alice 500 USDC");
    OTHER("Uniswap v2 charges 0.3%", "Uniswap v3 charges 0.3%");
    OTHER("0xabc123 is the address", "0xabc124 is the address");
}

static void test_values(void)
{
    /* numbers by value and unit */
    SAME("It costs $1,850.00", "It costs $1850");
    SAME("APY is 2.30%", "APY is 2.3 %");
    SAME("APY is 5 percent", "APY is 5%");
    SAME("It weighs 82 kg", "It weighs 82KG");
    SAME("The trip is on April 3rd", "The trip is on 3 April");
    SAME("Check-in opens at 3pm", "Check-in opens at 15:00");
    SAME("Due 2024-11-02", "Due November 2, 2024");
    /* the unit is an entity: not an update */
    OTHER("Agent 7 wallet holds 10 ETH", "Agent 7 wallet holds 10 BTC");
    OTHER("The hotel costs 180 EUR", "The hotel costs 180 USD");
    OTHER("Price is \xe2\x82\xac"
          "300",
          "Price is \xc2\xa3"
          "300");
    OTHER("The limit is 512 MiB", "The limit is 1 GiB");
    /* quantities change */
    values("Price is $1,850", "Price is $1,920", "$1,850 -> $1,920");
    values("The user is 34 years old", "The user is 35 years old", "34 years -> 35 years");
    values("Blood pressure is 130/85", "Blood pressure is 125/80", "130 -> 125, 85 -> 80");
    values("Deadline: 2024-06-01", "Deadline: 2024-06-15", "2024-06-01 -> 2024-06-15");
    values("The meeting is on March 5 at 10:00", "The meeting is on March 12 at 11:30am",
           "March 5 -> March 12, 10:00 -> 11:30am");
    values("The thermostat is set to 21\xc2\xb0"
           "C",
           "The thermostat is set to 19\xc2\xb0"
           "C",
           "21\xc2\xb0"
           "C -> 19\xc2\xb0"
           "C");
    values("Standup is on Monday", "Standup is on Tuesday", "Monday -> Tuesday");
    /* after a verb the lists do not know a number is an identifier: an update missed, never
     * a distinct fact archived */
    OTHER("The vault has earned 5 ETH", "The vault has earned 7 ETH");
    values("The user's preferred length is 30 minutes", "The user's preferred length is 25 minutes",
           "30 minutes -> 25 minutes");
    /* the same values are not an update */
    CHECK(cmp("APY is 2.3%", "APY is 2.30%", NULL, 0) == TEXTRULE_SAME);
}

static void test_identifiers(void)
{
    /* a number after a word that names things by number */
    OTHER("Agent 7 wallet holds 10 ETH", "Agent 8 wallet holds 10 ETH");
    OTHER("Room 204 is booked", "Room 305 is booked");
    OTHER("Sprint 14 ends on Friday", "Sprint 15 ends on Friday");
    OTHER("Order #123 shipped", "Order #124 shipped");
    /* after any other word that does not introduce an amount */
    OTHER("Build 512 failed", "Build 513 failed");
    OTHER("Python 3.11 added tomllib", "Python 3.12 added tomllib");
    OTHER("Top 10 holders own 45%", "Top 20 holders own 45%");
    OTHER("The user's 5 km best is 24 minutes", "The user's 10 km best is 24 minutes");
    /* joined to a word by a hyphen */
    OTHER("The 7-day APY is 4.2%", "The 30-day APY is 4.2%");
    /* years and dates that qualify a statement */
    OTHER("Revenue in 2023 was $5M", "Revenue in 2024 was $5M");
    OTHER("Revenue in 2023 was $5M", "Revenue in 2024 was $6M");
    OTHER("On Monday the user ran 5 km", "On Tuesday the user ran 5 km");
    OTHER("The user ran 5 km on Monday", "The user ran 5 km on Tuesday");
    OTHER("Blood test on 2024-03-01 showed 3.4", "Blood test on 2024-06-01 showed 3.4");
    /* amounts of events add up: two purchases, not a newer value */
    OTHER("Alice bought 10 ETH at $3,000", "Alice bought 5 ETH at $3,000");
    OTHER("Alice bought 10 ETH at $3,000", "Alice bought 10 ETH at $3,100");
    OTHER("The agent swapped 3 ETH", "The agent swapped 4 ETH");
    values("Revenue in 2023 was $5M", "Revenue in 2023 was $5.4M", "$5M -> $5.4M");
    rendered("Agent 7's wallet holds 10 ETH on Arbitrum",
             "agent [7] wallet holds <num:eth> on arbitrum");
    rendered("Revenue in 2023 was $5M", "revenue in [2023] was <num:$m>");
    rendered("The meeting is on March 5, at 10:00", "meeting is on <date> at <time>");
    rendered("Team size: 12", "team size = <num>");
    rendered("Team size 12", "team size [12]");
}

static void test_reasons(void)
{
    /* more quantities than a signature keeps one by one */
    char why[300];
    const char
        *a = "b is 1, c is 2, d is 3, e is 4, f is 5, g is 6, h is 7, j is 8, k is 9, m is 10",
        *b = "b is 1, c is 2, d is 3, e is 4, f is 5, g is 6, h is 7, j is 8, k is 9, m is 11";
    CHECK(cmp(a, b, why, sizeof(why)) == TEXTRULE_VALUES);
    CHECK_STR_CONTAINS(why, "values after the 8th");
    /* long values are shown cut, never inside a UTF-8 sequence */
    CHECK(cmp("is 123456789012345678901234567890 x", "is 1 x", why, sizeof(why)) >= 0);
    textrule_sig s;
    CHECK(textrule_sign("", 0, &s) == 0 && s.nquant == 0);
    /* a small buffer: truncated, terminated */
    char tiny[8];
    CHECK(cmp("Price is $1,850", "Price is $1,920", tiny, sizeof(tiny)) == TEXTRULE_VALUES);
    CHECK(strlen(tiny) < sizeof(tiny));
    CHECK(textrule_selfcheck() == 0);
}

/* ---- the labelled set ------------------------------------------------------------------- */

/* The string value of key in the msgpack map o, NUL-terminated into out, or NULL. */
static const char *get(const msgpack_object *o, const char *key, char *out, size_t outlen)
{
    for (uint32_t i = 0; o->type == MSGPACK_OBJECT_MAP && i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
            !memcmp(kv->key.via.str.ptr, key, strlen(key)) && kv->val.type == MSGPACK_OBJECT_STR &&
            kv->val.via.str.size < outlen) {
            memcpy(out, kv->val.via.str.ptr, kv->val.via.str.size);
            out[kv->val.via.str.size] = '\0';
            return out;
        }
    }
    return NULL;
}

static void test_labelled_set(void)
{
    FILE *f = fopen(TEXTRULE_PAIRS, "r");
    CHECK_MSG(f != NULL, "cannot open %s", TEXTRULE_PAIRS);
    if (!f)
        return;
    static const char *const labels[] = {"update",   "duplicate",         "distinct_entity",
                                         "negation", "different_subject", "paraphrase"};
    int total[6] = {0}, sup[6] = {0}, same[6] = {0}, n = 0;
    char line[8192];
    while (fgets(line, sizeof(line), f)) {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        char err[100];
        if (json_to_msgpack(line, strlen(line), 4, &pk, err, sizeof(err)) != 0) {
            CHECK_MSG(0, "line %d: %s", n + 1, err);
            msgpack_sbuffer_destroy(&sb);
            continue;
        }
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        msgpack_unpack_next(&u, sb.data, sb.size, NULL);
        char id[64], label[32], older[2048], newer[2048], k0[200], k1[200], k2[200];
        const char *okey = get(&u.data, "older_key", k0, sizeof(k0));
        const char *nkey = get(&u.data, "newer_key", k1, sizeof(k1));
        const char *key = get(&u.data, "attrs_key", k2, sizeof(k2));
        okey = okey ? okey : key;
        nkey = nkey ? nkey : key;
        if (get(&u.data, "id", id, sizeof(id)) && get(&u.data, "label", label, sizeof(label)) &&
            get(&u.data, "older", older, sizeof(older)) &&
            get(&u.data, "newer", newer, sizeof(newer))) {
            int l = 0;
            while (l < 6 && strcmp(labels[l], label) != 0)
                l++;
            CHECK_MSG(l < 6, "%s: label %s", id, label);
            int r = cmp(older, newer, NULL, 0);
            /* as the planner: a shared attrs.key supersedes; different keys forbid the text
             * rules; otherwise the texts decide */
            bool superseded = (okey && nkey) ? strcmp(okey, nkey) == 0 : r == TEXTRULE_VALUES;
            bool merged = !(okey && nkey && strcmp(okey, nkey) != 0) && r == TEXTRULE_SAME;
            if (l < 6) {
                total[l]++;
                sup[l] += superseded;
                same[l] += merged;
                CHECK_MSG(!superseded || l == 0 || l == 1 || l == 5, "%s: %s -> %s superseded", id,
                          older, newer);
                CHECK_MSG(!merged || l == 1 || l == 5, "%s: %s / %s merged", id, older, newer);
            }
            n++;
        } else {
            CHECK_MSG(0, "line %d lacks id, label, older or newer", n + 1);
        }
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
    fclose(f);
    CHECK(n >= 300);
    fprintf(stderr, "labelled set: %d pairs; the rule alone (cosines aside):\n", n);
    for (int l = 0; l < 6; l++)
        fprintf(stderr, "  %-18s %3d pairs: %3d superseded, %3d same text\n", labels[l], total[l],
                sup[l], same[l]);
    fprintf(stderr, "  recall of updates %.3f, of duplicates %.3f\n",
            total[0] ? (double)sup[0] / total[0] : 0.0,
            total[1] ? (double)same[1] / total[1] : 0.0);
}

int main(void)
{
    test_issue_cases();
    test_words();
    test_values();
    test_identifiers();
    test_reasons();
    test_labelled_set();
    CHECK_RETURN();
}
