/* fuzz/provenance.c: a libFuzzer target for the text side of memory.provenance
 * (server/domain/provenance.c), which reads a client's response (up to 64 KiB) and every
 * injected memory's content, bytes of any kind, on a worker.
 *
 * Each input is two texts split at the first 0xFF byte: a response and a memory (empty when
 * there is none). The response is split into sentences and read; the memory is scored
 * against it and the response against itself; both render their terms. Invariants abort()
 * with a message when broken (sentences lie inside the response, trimmed and non-empty; a
 * score is found / total within 0..1; a quote's offset lies inside the response exactly when
 * something was found; a text contains all of its own wording and contradicts none of it;
 * outputs are terminated within their buffers), and ASan and UBSan catch the rest.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "provenance.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static bool space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static void check_score(const prov_overlap *o, size_t rlen)
{
    REQUIRE(o->found <= o->total && o->words_found <= o->words && o->words <= o->total);
    REQUIRE(o->words_found <= o->found && (o->run > 0) == (o->words_found > 0));
    REQUIRE(o->score >= 0 && o->score <= 1);
    REQUIRE(o->total ? o->score == (double)o->found / o->total : o->score == 0);
    REQUIRE((o->found == 0) == (o->at == SIZE_MAX));
    REQUIRE(o->at == SIZE_MAX || o->at < rlen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *cut = memchr(data, 0xFF, size);
    size_t rlen = cut ? (size_t)(cut - data) : size;
    const char *resp = (const char *)data, *mem = cut ? (const char *)cut + 1 : "";
    size_t mlen = cut ? size - rlen - 1 : 0;

    const char *sent[16];
    size_t len[16];
    size_t n = prov_sentences(resp, rlen, sent, len, 16);
    for (size_t k = 0; k < n && k < 16; k++) {
        REQUIRE(sent[k] >= resp && sent[k] + len[k] <= resp + rlen && len[k] > 0);
        REQUIRE(!space(sent[k][0]) && !space(sent[k][len[k] - 1]));
        REQUIRE(k == 0 || sent[k] >= sent[k - 1] + len[k - 1]);
    }

    prov_text *t = NULL;
    if (prov_text_create(resp, rlen, &t) < 0)
        return 0;
    prov_overlap o;
    if (prov_overlap_score(t, mem, mlen, &o) == 0)
        check_score(&o, rlen);
    if (prov_overlap_score(t, resp, rlen, &o) == 0) {
        check_score(&o, rlen);
        REQUIRE(o.found == o.total && !o.conflict);
        REQUIRE(o.total == 0 || o.score == 1.0);
    }
    prov_text_destroy(t);
    char out[256];
    REQUIRE(prov_terms(mem, mlen, out, sizeof(out)) == 0);
    REQUIRE(memchr(out, '\0', sizeof(out)) != NULL);
    REQUIRE(prov_selfcheck() == 0);
    return 0;
}
