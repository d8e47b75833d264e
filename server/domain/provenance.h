/* server/domain/provenance.h: the text side of memory.provenance: a response's sentences,
 * and how much of a memory's wording the response contains.
 *
 * A memory counts as cited when the response contains enough of its distinctive wording
 * (the overlap below, at least provenance_overlap_threshold) or when one sentence of the
 * response is close to it in embedding space (the cosine, provenance_threshold); the
 * handler (server/methods/m_feedback.c) combines the two. A cosine of whole sentences misses
 * a verbatim quote inside a longer sentence (a quote scored 0.75 against 0.8 in issue 32);
 * the overlap finds it whatever surrounds it.
 *
 * Terms. A text is read with consolidation's tokenizer (textrule_tokens: ASCII lower-cased,
 * punctuation dropped, negative contractions written out, numbers by value: "1,000" = "1000",
 * "2.30%" = "2.3%", dates as "2024-06-01") and each token becomes terms:
 *  - a word: stop words dropped (English function words and pronouns, and "user": memories
 *    say "the user" where answers say "you"; "no", "not", "never" are kept), then a light
 *    English suffix strip (prefers, preferred, preferring: prefer; cities: city) for ASCII
 *    words; other letters lower-cased where Unicode pairs them one to one (Latin-1, Latin
 *    Extended-A, Greek, Cyrillic); CJK ideographs, kana and hangul are a term each, CJK and
 *    full-width punctuation a separator; a few synonyms of units (dollar: usd, euro: eur,
 *    percent: %);
 *  - a number: its value ("10k" = "10,000" = "10000"; "$48M" = 48000000 with a currency) and
 *    its unit as a second term ("$1,850" and "1850 USD" are both "1850 usd"); a date or a
 *    time: its canonical form.
 * Features. The memory's distinct terms (unigrams) and its distinct pairs of consecutive
 * terms (bigrams). The overlap is the share of those features that occur anywhere in the
 * response's terms: 1 for a verbatim or reordered-clause quote, about 0.8 with one word of
 * eight changed, low for a paraphrase in other words; a memory with no term (only stop
 * words) scores 0 and is left to the cosine. Containment, not similarity: how long the
 * response is does not lower it.
 * Conflict. A number of the memory that the response lacks while the response has another
 * number in its place (after the same word, with the same unit: "holds 10 ETH" / "holds 12
 * ETH", "Agent 7" / "Agent 8", "moved to 2024-03-05" / "moved to 2024-03-07") says the
 * response states a different value: the handler then counts the memory as not cited,
 * whatever the overlap or the cosine.
 *
 * Pure functions of their arguments: any thread.
 */
#ifndef ENGRAM_SERVER_PROVENANCE_H
#define ENGRAM_SERVER_PROVENANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* prov_sentences splits s (n bytes) into sentences: a sentence ends at '.', '!' or '?'
 * followed by whitespace or the end, at a line break, and at the ideographic full stop and
 * the full-width '!' and '?' (U+3002, U+FF01, U+FF1F). Each is trimmed of whitespace; empty
 * ones are dropped. Fills up to max pointers into s (sent[k], len[k] bytes) and returns how
 * many there are (may exceed max: the caller refuses the text then). */
size_t prov_sentences(const char *s, size_t n, const char **sent, size_t *len, size_t max);

/* A response prepared for overlap lookups (opaque). */
typedef struct prov_text prov_text;

/* prov_text_create reads text (len bytes, UTF-8, need not be NUL-terminated; copied from
 * as needed, not kept) into *out, freed with prov_text_destroy (NULL is a no-op). Returns 0
 * or -ENOMEM. Memory and time linear in len. */
int prov_text_create(const char *text, size_t len, prov_text **out);
void prov_text_destroy(prov_text *t);

/* prov_text_terms returns how many terms the text has. */
size_t prov_text_terms(const prov_text *t);

/* How much of a memory a response contains. */
typedef struct prov_overlap {
    double score;                /* found / total, 0 when total is 0 */
    uint32_t found, total;       /* the memory's features found in the response, and all of them */
    uint32_t words_found, words; /* of which distinct terms */
    uint32_t run;  /* the most consecutive terms of the memory whose pairs all occur */
    bool conflict; /* a number of the memory is replaced by another in the response */
    size_t at;     /* byte offset in the response of the first memory feature found (a bigram if
                      any was found, else a word), SIZE_MAX when none was */
} prov_overlap;

/* prov_overlap_score scores memory text mem (len bytes) against response t into *out.
 * Returns 0 or -ENOMEM. */
int prov_overlap_score(const prov_text *t, const char *mem, size_t len, prov_overlap *out);

/* prov_terms writes the terms of text into out (truncated to fit, outlen > 0), separated by
 * spaces, numbers as they are compared, for tests and debugging. Returns 0 or -ENOMEM. */
int prov_terms(const char *text, size_t len, char *out, size_t outlen);

/* prov_selfcheck returns 0 when the module's word lists are sorted and free of duplicates
 * (they are searched by bisection), or the 1-based number of the first that is not. */
int prov_selfcheck(void);

#endif
