/* tests/unit/test_provenance.c: server/domain/provenance: sentences, terms and the word
 * overlap of memory.provenance (issue 32, item 7).
 *
 * Hand cases for each part (sentences, terms, the overlap of a verbatim quote, of small
 * edits, of a paraphrase, of unrelated text sharing common words, of a memory of few words,
 * of non-ASCII text, of a response at the size limit, conflicts), then the labelled set
 * tests/data/provenance_pairs.jsonl through the decision memory.provenance takes with the
 * default settings and the built-in embedder: every verbatim, reworded and reformatted use
 * must be found, and precision and recall must stay at or above the floors measured when
 * the set was written (bench/README.md, "Provenance"). PROV_VERBOSE=1 prints every item.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "embed.h"
#include "json.h"
#include "provenance.h"

#ifndef PROV_PAIRS
#error "PROV_PAIRS: the path of tests/data/provenance_pairs.jsonl"
#endif

/* the defaults of provenance_threshold and provenance_overlap_threshold (server/core/config.c) */
#define COS_THRESHOLD 0.8
#define OVERLAP_THRESHOLD 0.5
#define DIM 384
/* precision and recall of the overlap alone and of the server's rule on the labelled set */
#define PRECISION_FLOOR 0.98
#define RECALL_FLOOR 0.80

static prov_overlap score(const char *response, const char *memory)
{
    prov_text *t = NULL;
    prov_overlap o = {0};
    CHECK(prov_text_create(response, strlen(response), &t) == 0);
    if (t)
        CHECK(prov_overlap_score(t, memory, strlen(memory), &o) == 0);
    prov_text_destroy(t);
    return o;
}

static void terms_are(const char *text, const char *want)
{
    char out[400];
    CHECK(prov_terms(text, strlen(text), out, sizeof(out)) == 0);
    CHECK_MSG(strcmp(out, want) == 0, "'%s' has terms '%s', want '%s'", text, out, want);
}

#define FOUND(resp, mem)                                                                           \
    do {                                                                                           \
        prov_overlap o_ = score(resp, mem);                                                        \
        CHECK_MSG(o_.score >= OVERLAP_THRESHOLD && !o_.conflict, "'%s' in '%s': %.3f (%u/%u)%s",   \
                  mem, resp, o_.score, o_.found, o_.total, o_.conflict ? " conflict" : "");        \
    } while (0)
#define NOT_FOUND(resp, mem)                                                                       \
    do {                                                                                           \
        prov_overlap o_ = score(resp, mem);                                                        \
        CHECK_MSG(o_.score < OVERLAP_THRESHOLD || o_.conflict, "'%s' in '%s': %.3f (%u/%u)", mem,  \
                  resp, o_.score, o_.found, o_.total);                                             \
    } while (0)

static void test_sentences(void)
{
    const char *s = "Here is what I found.\nThe price is 2.5 now. So wait!  Shall I? "
                    "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x82ok";
    const char *sent[8];
    size_t len[8];
    size_t n = prov_sentences(s, strlen(s), sent, len, 8);
    CHECK(n == 6);
    const char *want[] = {"Here is what I found.",
                          "The price is 2.5 now.",
                          "So wait!",
                          "Shall I?",
                          "\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x82",
                          "ok"};
    for (size_t k = 0; k < n && k < 6; k++)
        CHECK_MSG(len[k] == strlen(want[k]) && !memcmp(sent[k], want[k], len[k]), "%zu: '%.*s'", k,
                  (int)len[k], sent[k]);
    /* more than max: counted, not stored past max */
    CHECK(prov_sentences("a. b. c. d.", 11, sent, len, 2) == 4);
    CHECK(prov_sentences(" \n\t ", 4, sent, len, 8) == 0);
}

static void test_terms(void)
{
    /* stop words, case, punctuation, inflections */
    terms_are("The user prefers dark mode.", "prefer dark mod");
    terms_are("You preferred Dark-Mode!", "prefer dark mod");
    terms_are("Meetings are moving; the meeting moved.", "meet mov meet mov");
    terms_are("He doesn't like cities", "not lik city");
    terms_are("classes running stopped calls", "class run stop call");
    /* numbers by value, units as terms of their own */
    terms_are("$1,850 and 1850 USD and 1,850 dollars", "1850 usd 1850 usd 1850 usd");
    terms_are("10k USDC, 10,000 USDC", "10000 usdc 10000 usdc");
    terms_are("$48M in TVL, 48 million dollars", "48000000 usd tvl 48000000 usd");
    terms_are("$1.2 million, 1.2 million USD, $1,200,000", "1200000 usd 1200000 usd 1200000 usd");
    terms_are("5m away, 5 m", "5 m away 5 m");
    terms_are("2.30% or 2.3 percent", "2.3 % 2.3 %");
    terms_are("Agent 7 holds 10 ETH", "agent 7 hold 10 eth");
    terms_are("on March 5, 2024 at 9:05 pm", "2024-03-05 21:05");
    terms_are("2024-03-05 at 21:05", "2024-03-05 21:05");
    /* non-ASCII: letters lower-cased, CJK one term a character, their punctuation dropped */
    terms_are("Caf\xc3\x89 CR\xc3\x88ME \xd0\x9c\xd0\xbe\xd1\x81\xd0\xba\xd0\xb2\xd0\xb0",
              "caf\xc3\xa9 cr\xc3\xa8me \xd0\xbc\xd0\xbe\xd1\x81\xd0\xba\xd0\xb2\xd0\xb0");
    terms_are("\xe7\x94\xa8\xe6\x88\xb7\xe3\x80\x82\xe5\x96\x9c",
              "\xe7\x94\xa8 \xe6\x88\xb7 \xe5\x96\x9c");
    terms_are("", "");
    terms_are("It is what it is.", "");
    CHECK(prov_selfcheck() == 0);
}

static void test_overlap(void)
{
    const char *mem = "The ETH gas price spikes every weekday at noon UTC.";
    /* verbatim, inside a longer sentence (issue 32: the cosine of that sentence was 0.75) */
    prov_overlap o = score("Sure. From what I know, the ETH gas price spikes every weekday at "
                           "noon UTC, so I would run the swap in the evening.",
                           mem);
    CHECK(o.score == 1.0 && o.found == o.total && o.total > 0 && !o.conflict);
    CHECK(o.at == strlen("Sure. From what I know, the "));
    /* near-verbatim: inflections, a word dropped, case */
    FOUND("ETH gas prices spike every weekday around noon UTC, so wait.", mem);
    FOUND("Agent 7's wallet is holding 10 ETH on Arbitrum.",
          "Agent 7 wallet holds 10 ETH on Arbitrum");
    /* a paraphrase in other words is not found by the words */
    NOT_FOUND("You like a dark colour theme wherever you write code.",
              "The user prefers dark mode in every editor.");
    /* unrelated text sharing common words */
    NOT_FOUND("The short film festival runs every weekend in May at the old cinema.",
              "User likes short answers without bullet points.");
    NOT_FOUND("Porto wine comes from the Douro valley; the user's sister likes it.",
              "The user's sister lives in Porto and works as an architect.");
    NOT_FOUND("The base model of the car has a 2-year warranty.",
              "Morpho USDC vault on Base has 2.3% base APY");
    /* a memory of few words: its one word is enough, and its absence is not */
    FOUND("Since you are vegan, here are three recipes.", "The user is vegan.");
    NOT_FOUND("Here are three recipes with chicken.", "The user is vegan.");
    o = score("Anything at all.", "It is what it is.");
    CHECK(o.total == 0 && o.score == 0 && o.at == SIZE_MAX);
    /* another value in the same place is a conflict, the same value written otherwise not */
    o = score("Agent 7 wallet holds 12 ETH on Arbitrum.",
              "Agent 7 wallet holds 10 ETH on Arbitrum");
    CHECK(o.conflict && o.score > 0.5);
    o = score("Agent 8 wallet holds 10 ETH on Arbitrum.",
              "Agent 7 wallet holds 10 ETH on Arbitrum");
    CHECK(o.conflict);
    o = score("It has 2.5% base APY, up from 2.3% base APY.",
              "Morpho USDC vault on Base has 2.3% base APY");
    CHECK(!o.conflict);
    FOUND("Never bridge more than 10,000 USDC in one transaction.",
          "Never bridge more than 10k USDC in one transaction.");
    FOUND("The passport expires on August 14, 2026.", "The user's passport expires on 2026-08-14.");
    /* a list whose last item the response leaves out is no conflict */
    o = score("The 0.05% and 0.30% tiers suit stable pairs on Uniswap v3.",
              "Uniswap v3 fee tiers are 0.05%, 0.30% and 1%.");
    CHECK(!o.conflict);
}

static void test_non_ascii(void)
{
    /* Chinese: characters and their pairs; a sentence quoted inside another */
    const char *zh = "\xe7\x94\xa8\xe6\x88\xb7\xe5\x96\x9c\xe6\xac\xa2\xe6\xb7\xb1\xe8\x89\xb2"
                     "\xe6\xa8\xa1\xe5\xbc\x8f\xe3\x80\x82"; /* 用户喜欢深色模式。 */
    FOUND("\xe6\x88\x91\xe8\xae\xb0\xe5\xbe\x97\xe7\x94\xa8\xe6\x88\xb7\xe5\x96\x9c\xe6\xac\xa2"
          "\xe6\xb7\xb1\xe8\x89\xb2\xe6\xa8\xa1\xe5\xbc\x8f\xef\xbc\x8c\xe6\x89\x80\xe4\xbb\xa5"
          "\xe5\xb7\xb2\xe5\x88\x87\xe6\x8d\xa2\xe3\x80\x82",
          zh); /* 我记得用户喜欢深色模式，所以已切换。 */
    NOT_FOUND("\xe6\x98\x8e\xe5\xa4\xa9\xe4\xb8\x8b\xe9\x9b\xa8\xe3\x80\x82", zh); /* 明天下雨。 */
    /* accented Latin and Cyrillic, in another case */
    FOUND("Ihr Lieblingscaf\xc3\xa9 ist das CAF\xc3\x89 M\xc3\x9cLLER am Markt.",
          "Das Lieblingscaf\xc3\xa9: Caf\xc3\xa9 M\xc3\xbcller am Markt");
    FOUND("\xd0\x9f\xd0\x9e\xd0\x9b\xd0\xac\xd0\x97\xd0\x9e\xd0\x92\xd0\x90\xd0\xa2\xd0\x95\xd0\x9b"
          "\xd0\xac \xd0\x96\xd0\x98\xd0\x92\xd0\x81\xd0\xa2 \xd0\x92 \xd0\x9a\xd0\x90\xd0\x97"
          "\xd0\x90\xd0\x9d\xd0\x98",
          "\xd0\x9f\xd0\xbe\xd0\xbb\xd1\x8c\xd0\xb7\xd0\xbe\xd0\xb2\xd0\xb0\xd1\x82\xd0\xb5\xd0\xbb"
          "\xd1\x8c \xd0\xb6\xd0\xb8\xd0\xb2\xd1\x91\xd1\x82 \xd0\xb2 \xd0\x9a\xd0\xb0\xd0\xb7\xd0"
          "\xb0\xd0\xbd\xd0\xb8"); /* ПОЛЬЗОВАТЕЛЬ ЖИВЁТ В КАЗАНИ / Пользователь живёт в Казани */
    /* where a quote starts, in bytes, after CJK text in the same token */
    prov_overlap q = score("\xe4\xbd\xa0\xe5\xa5\xbd\xe3\x80\x82Uniswap v3 fee tiers are 0.05%.",
                           "Uniswap v3 fee tiers are 0.05%");
    CHECK(q.score == 1.0 && q.at == 9);
    /* invalid UTF-8 is read, not refused */
    prov_overlap o = score("abc \xff\xfe def", "\xff\xfe def");
    CHECK(o.total > 0);
}

static void test_huge(void)
{
    /* a response at the size limit (65536 bytes) with the memory at its end */
    const char *mem = "Invoices over 5,000 EUR need approval from the CFO.";
    size_t cap = 65536;
    char *r = malloc(cap + 1);
    size_t n = 0;
    for (int k = 0; n + 40 + strlen(mem) < cap; k++)
        n += (size_t)snprintf(r + n, cap - n, "Entry %d lists item w%dx. ", k, k);
    memcpy(r + n, mem, strlen(mem));
    n += strlen(mem);
    r[n] = '\0';
    prov_text *t = NULL;
    CHECK(prov_text_create(r, n, &t) == 0);
    prov_overlap o = {0};
    if (t) {
        CHECK(prov_text_terms(t) > 5000);
        CHECK(prov_overlap_score(t, mem, strlen(mem), &o) == 0);
        CHECK(o.score == 1.0 && o.at == n - strlen(mem));
        /* and a memory of 64 KiB against a short response */
        CHECK(prov_overlap_score(t, r, n, &o) == 0 && o.score == 1.0);
    }
    prov_text_destroy(t);
    t = NULL;
    CHECK(prov_text_create(mem, strlen(mem), &t) == 0);
    if (t)
        CHECK(prov_overlap_score(t, r, n, &o) == 0 && o.score < 0.1);
    prov_text_destroy(t);
    free(r);
}

/* ---- the labelled set ------------------------------------------------------------------- */

/* The best cosine between text mem and the sentences of response, as memory.provenance
 * computes it with the built-in embedder (the memory's stored vector is its text's). */
static double best_cosine(const char *response, const char *mem)
{
    static float mv[DIM], sv[DIM];
    const char *sent[256];
    size_t len[256];
    size_t n = prov_sentences(response, strlen(response), sent, len, 256);
    double best = -2;
    if (embed_text(mem, strlen(mem), DIM, mv) != 0)
        return best;
    for (size_t k = 0; k < n && k < 256; k++) {
        if (embed_text(sent[k], len[k], DIM, sv) != 0)
            continue;
        double dot = 0;
        for (size_t d = 0; d < DIM; d++)
            dot += (double)mv[d] * sv[d];
        best = dot > best ? dot : best;
    }
    return best;
}

/* The string value of key in the msgpack map o, or NULL; *n its length. */
static const char *get(const msgpack_object *o, const char *key, size_t *n)
{
    for (uint32_t i = 0; o->type == MSGPACK_OBJECT_MAP && i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
            !memcmp(kv->key.via.str.ptr, key, strlen(key)) && kv->val.type == MSGPACK_OBJECT_STR) {
            *n = kv->val.via.str.size;
            return kv->val.via.str.ptr;
        }
    }
    return NULL;
}

static int get_bool(const msgpack_object *o, const char *key)
{
    for (uint32_t i = 0; o->type == MSGPACK_OBJECT_MAP && i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
            !memcmp(kv->key.via.str.ptr, key, strlen(key)) &&
            kv->val.type == MSGPACK_OBJECT_BOOLEAN)
            return kv->val.via.boolean;
    }
    return -1;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static const char *const cats[] = {"verbatim",      "light_rewording", "numbers_reformatted",
                                   "partial_quote", "paraphrase",      "different_fact",
                                   "unrelated",     "different_value"};
#define NCAT 8

/* Counts of one way of deciding: per category, the items it called cited. */
typedef struct tally {
    int cited[NCAT];
} tally;

typedef struct pr {
    int tp, fp, fn, tn;
} pr;

static pr measure(const tally *t, const int *total, const bool *truth)
{
    pr p = {0};
    for (int c = 0; c < NCAT; c++) {
        if (truth[c]) {
            p.tp += t->cited[c];
            p.fn += total[c] - t->cited[c];
        } else {
            p.fp += t->cited[c];
            p.tn += total[c] - t->cited[c];
        }
    }
    return p;
}

static double ratio(int a, int b)
{
    return b ? (double)a / b : 0.0;
}

static void test_labelled_set(void)
{
    FILE *f = fopen(PROV_PAIRS, "r");
    CHECK_MSG(f != NULL, "cannot open %s", PROV_PAIRS);
    if (!f)
        return;
    bool verbose = getenv("PROV_VERBOSE") != NULL;
    bool truth[NCAT] = {true, true, true, true, true, false, false, false};
    int total[NCAT] = {0}, n = 0, holdout = 0;
    /* overlap alone, cosine alone, either (the server's rule); all items, then the holdout */
    tally ov = {0}, cos = {0}, both = {0}, ho_both = {0};
    int ho_total[NCAT] = {0};
    char line[16384];
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
        size_t il = 0, cl = 0, ml = 0, al = 0, bl = 0;
        const char *id = get(&u.data, "id", &il), *cat = get(&u.data, "category", &cl);
        const char *mem = get(&u.data, "memory", &ml), *ans = get(&u.data, "answer", &al);
        const char *batch = get(&u.data, "batch", &bl);
        int label = get_bool(&u.data, "cited");
        int c = 0;
        while (cat && c < NCAT && (strlen(cats[c]) != cl || memcmp(cats[c], cat, cl) != 0))
            c++;
        CHECK_MSG(id && cat && mem && ans && label >= 0 && c < NCAT, "line %d is malformed", n + 1);
        if (id && cat && mem && ans && label >= 0 && c < NCAT) {
            CHECK_MSG(label == truth[c], "%.*s: cited %d in category %s", (int)il, id, label,
                      cats[c]);
            char *m = dup_n(mem, ml), *a = dup_n(ans, al);
            prov_overlap o = score(a, m);
            double cs = best_cosine(a, m);
            bool by_ov = o.score >= OVERLAP_THRESHOLD, by_cos = cs > COS_THRESHOLD;
            bool cited = (by_ov || by_cos) && !o.conflict;
            total[c]++;
            ov.cited[c] += by_ov && !o.conflict;
            cos.cited[c] += by_cos;
            both.cited[c] += cited;
            if (batch && bl == 7 && !memcmp(batch, "holdout", 7)) {
                holdout++;
                ho_total[c]++;
                ho_both.cited[c] += cited;
            }
            /* what the server must never miss */
            if (c <= 2)
                CHECK_MSG(cited, "%.*s not found: overlap %.3f (%u/%u)%s, cosine %.3f", (int)il, id,
                          o.score, o.found, o.total, o.conflict ? " conflict" : "", cs);
            if (verbose)
                fprintf(
                    stderr, "%-22.*s %-5s ov %.3f (%2u/%2u) w %2u/%2u run %2u%s cos %.3f -> %s\n",
                    (int)il, id, label ? "cited" : "no", o.score, o.found, o.total, o.words_found,
                    o.words, o.run, o.conflict ? " C" : "  ", cs, cited == label ? "ok" : "WRONG");
            free(m);
            free(a);
            n++;
        }
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
    fclose(f);
    CHECK(n >= 200);
    fprintf(stderr, "labelled set: %d items (%d held out); cited by overlap / cosine / either:\n",
            n, holdout);
    for (int c = 0; c < NCAT; c++)
        fprintf(stderr, "  %-20s %3d items (%s): %3d / %3d / %3d\n", cats[c], total[c],
                truth[c] ? "cited" : "not cited", ov.cited[c], cos.cited[c], both.cited[c]);
    const tally *ways[] = {&ov, &cos, &both};
    const char *names[] = {"overlap", "cosine", "either"};
    pr res[3];
    for (int w = 0; w < 3; w++) {
        res[w] = measure(ways[w], total, truth);
        fprintf(stderr, "  %-8s precision %.3f (%d/%d) recall %.3f (%d/%d)\n", names[w],
                ratio(res[w].tp, res[w].tp + res[w].fp), res[w].tp, res[w].tp + res[w].fp,
                ratio(res[w].tp, res[w].tp + res[w].fn), res[w].tp, res[w].tp + res[w].fn);
    }
    /* the floors: what the set measured when it was written (bench/README.md) */
    for (int w = 0; w < 3; w += 2) {
        CHECK_MSG(ratio(res[w].tp, res[w].tp + res[w].fp) >= PRECISION_FLOOR, "%s precision",
                  names[w]);
        CHECK_MSG(ratio(res[w].tp, res[w].tp + res[w].fn) >= RECALL_FLOOR, "%s recall", names[w]);
    }
    pr ho = measure(&ho_both, ho_total, truth);
    fprintf(stderr, "  held out, either: precision %.3f (%d/%d) recall %.3f (%d/%d)\n",
            ratio(ho.tp, ho.tp + ho.fp), ho.tp, ho.tp + ho.fp, ratio(ho.tp, ho.tp + ho.fn), ho.tp,
            ho.tp + ho.fn);
}

int main(void)
{
    test_sentences();
    test_terms();
    test_overlap();
    test_non_ascii();
    test_huge();
    test_labelled_set();
    CHECK_RETURN();
}
