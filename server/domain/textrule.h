/* server/domain/textrule.h: the text rules that let consolidation merge or supersede
 * memories without a language model.
 *
 * A cosine similarity says two texts look alike, not that they are about the same thing:
 * "Morpho USDC vault on Base has 2.3% base APY" and "Morpho DAI vault on Base has 2.3% base
 * APY" are above 0.85 under any embedder. Consolidation therefore archives a memory only
 * on evidence in the texts (or a shared metadata.attrs.key, which consolidate.c checks):
 *
 *  - the same text (merge, with the cosine at consolidate_dedupe_threshold as well): the two
 *    token sequences are identical once case, punctuation, whitespace, possessive 's and the
 *    words a, an, the, now, currently and still are set aside, every number compared by its
 *    value and unit ("1,000" = "1000", "2.30%" = "2.3%");
 *  - a value update (supersede): the two token sequences are identical except in values
 *    that are quantities, and at least one quantity differs. Values are numbers (with their
 *    currency, percent or unit: "$1,850", "2.3%", "5km"), dates ("2024-06-01", "March 5",
 *    "5/3/2024", "Monday", a year) and times ("10:30", "8pm"). A value is a quantity when
 *    its place in the sentence says it measures something:
 *      numbers: not after an identifier word (agent 7, room 204, sprint 14, pool 3, ...) nor
 *      '#'; and with a unit of their own (%, a currency, a suffix), or followed by a unit
 *      word (10 ETH, 5 km, 12 engineers), or after a verb or preposition that introduces an
 *      amount (is, has, holds, costs, weighs, at, of, to, about, ...), after ':' or '=', or
 *      first in the text;
 *      dates and times: after a copula or a scheduling verb (is, was, due, scheduled,
 *      moved, expires, ends, ...), directly or through one preposition ("is on March 5",
 *      "moved to 10:30", "deadline: 2024-06-01").
 *    Every other value is an identifier and must be equal in both texts: "Agent 7" is not
 *    an older "Agent 8", "Revenue in 2023" not an older "Revenue in 2024", "On Monday the
 *    user ran 5 km" not an older "On Tuesday ...". Words are never values: "10 ETH" and
 *    "10 BTC", "enabled" and "not enabled", "Arbitrum" and "Optimism" differ in a word, so
 *    they are neither the same text nor a value update.
 * Everything else (paraphrases included) is left alone. tests/data/consolidation_pairs.jsonl
 * is the labelled set that measures these rules (tests/unit/test_textrule.c,
 * tests/integration/test_consolidation_pairs.py; figures in bench/README.md).
 *
 * Text is UTF-8; ASCII letters are lower-cased, other bytes compared as they are. Pure
 * functions of their arguments: any thread.
 */
#ifndef ENGRAM_SERVER_TEXTRULE_H
#define ENGRAM_SERVER_TEXTRULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Quantities whose values a signature keeps one by one (for the reasons). */
#define TEXTRULE_SLOTS 8
/* Bytes of the quantities' original text a signature keeps for the reasons. */
#define TEXTRULE_VALS 96

/* What the rules need of one text, computed once (about 150 bytes whatever its length). */
typedef struct textrule_sig {
    uint64_t text[2];    /* the normalized text: equal when the texts are the same */
    uint64_t subject[2]; /* the normalized text with every quantity replaced by its unit */
    uint64_t quant;      /* the quantities' values, in order */
    uint32_t qhash[TEXTRULE_SLOTS]; /* each of the first quantities' value */
    uint16_t nquant;                /* quantities in the text */
    char vals[TEXTRULE_VALS];       /* the first quantities as written, separated by '\x1f' */
} textrule_sig;

/* Results of textrule_compare. */
enum {
    TEXTRULE_OTHER = 0,  /* neither rule applies: nothing may be archived on the texts */
    TEXTRULE_SAME = 1,   /* the same text (a merge, if the cosine agrees) */
    TEXTRULE_VALUES = 2, /* the same text but for quantities, at least one changed */
};

/* textrule_sign computes the signature of text (len bytes, need not be NUL-terminated).
 * Returns 0 or -ENOMEM (scratch proportional to len). */
int textrule_sign(const char *text, size_t len, textrule_sig *out);

/* textrule_same says whether the signatures are of the same text. */
bool textrule_same(const textrule_sig *a, const textrule_sig *b);

/* textrule_values says whether newer updates older's quantities: the same subject, at
 * least one quantity, and different values. */
bool textrule_values(const textrule_sig *older, const textrule_sig *newer);

/* textrule_explain writes into out (outlen > 0; truncated to fit) the quantities that differ
 * between older and newer as "old -> new" pairs ("2.3% -> 2.5%, 10 -> 12"), as written in
 * each text. */
void textrule_explain(const textrule_sig *older, const textrule_sig *newer, char *out,
                      size_t outlen);

/* textrule_compare signs both texts and says which rule relates them: TEXTRULE_SAME,
 * TEXTRULE_VALUES (with the changed quantities in why, if why is not NULL) or TEXTRULE_OTHER;
 * -ENOMEM when out of memory. For tests and tools; the planner signs each memory once. */
int textrule_compare(const char *older, size_t olen, const char *newer, size_t nlen, char *why,
                     size_t whylen);

/* textrule_render writes text's normalized form into out (truncated to fit): its words,
 * identifiers as values ("#7"), quantities as "<unit>" placeholders ("<%>", "<num>",
 * "<date>"), separated by spaces; what the subject signature hashes. Returns 0 or -ENOMEM.
 * For tests and debugging. */
int textrule_render(const char *text, size_t len, char *out, size_t outlen);

/* Kinds of textrule_token. */
enum { TEXTRULE_TOK_WORD, TEXTRULE_TOK_NUM, TEXTRULE_TOK_DATE, TEXTRULE_TOK_TIME, TEXTRULE_TOK_ID };

/* One token of a text as the rules read it (textrule_tokens): a word lower-cased (negative
 * contractions written out, a possessive 's dropped), or a value in its canonical form
 * ("1850", "$1850", "2.3%", "10eth", "2024-06-01", "03-05", "monday", "10:30", "#7") with
 * its unit part ("$", "%", "eth"; "" for none). The filler words (a, an, the, now,
 * currently, still) are not tokens. */
typedef struct textrule_token {
    int kind;         /* TEXTRULE_TOK_* */
    bool quantity;    /* a value the rules take for a quantity (see above), not an identifier */
    const char *text; /* len bytes, not NUL-terminated */
    size_t len;
    const char *unit;   /* NUL-terminated */
    size_t off, srclen; /* where the token is in the text */
} textrule_token;

/* textrule_tokens calls fn(arg, token) for each token of text (len bytes) in order; the
 * token's strings live until fn returns. Stops when fn returns non-zero and returns that
 * value; otherwise returns 0, or -ENOMEM (scratch proportional to len). */
int textrule_tokens(const char *text, size_t len, int (*fn)(void *arg, const textrule_token *t),
                    void *arg);

/* textrule_selfcheck returns 0 when the rules' word lists are sorted and free of
 * duplicates (they are searched by bisection), or the 1-based number of the first list that
 * is not. */
int textrule_selfcheck(void);

#endif
