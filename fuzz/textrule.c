/* fuzz/textrule.c: a libFuzzer target for consolidation's text rules (server/domain/textrule.c),
 * which read every memory's content, client bytes of any kind, on the consolidation thread.
 *
 * Each input is two texts split at the first 0xFF byte (the second empty when there is
 * none). Both are signed, compared both ways, explained and rendered; invariants abort()
 * with a message when broken (a text is the same as itself and never its own update; the
 * same text is never a value update; the rules are symmetric where they must be; outputs
 * are terminated within their buffers), and ASan and UBSan catch the rest.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "textrule.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *cut = memchr(data, 0xFF, size);
    size_t alen = cut ? (size_t)(cut - data) : size;
    const char *a = (const char *)data, *b = cut ? (const char *)cut + 1 : "";
    size_t blen = cut ? size - alen - 1 : 0;
    textrule_sig sa, sb, sa2;
    if (textrule_sign(a, alen, &sa) < 0 || textrule_sign(b, blen, &sb) < 0 ||
        textrule_sign(a, alen, &sa2) < 0)
        return 0;
    REQUIRE(memcmp(&sa, &sa2, sizeof(sa)) == 0); /* deterministic */
    REQUIRE(textrule_same(&sa, &sa) && !textrule_values(&sa, &sa));
    REQUIRE(textrule_same(&sa, &sb) == textrule_same(&sb, &sa));
    REQUIRE(textrule_values(&sa, &sb) == textrule_values(&sb, &sa));
    REQUIRE(!(textrule_same(&sa, &sb) && textrule_values(&sa, &sb)));
    REQUIRE(memchr(sa.vals, '\0', sizeof(sa.vals)) != NULL);
    char why[64], out[256];
    textrule_explain(&sa, &sb, why, sizeof(why));
    REQUIRE(memchr(why, '\0', sizeof(why)) != NULL);
    int r = textrule_compare(a, alen, b, blen, why, sizeof(why));
    REQUIRE(r == TEXTRULE_SAME || r == TEXTRULE_VALUES || r == TEXTRULE_OTHER);
    REQUIRE((r == TEXTRULE_SAME) == textrule_same(&sa, &sb));
    REQUIRE(textrule_render(a, alen, out, sizeof(out)) == 0);
    REQUIRE(memchr(out, '\0', sizeof(out)) != NULL);
    return 0;
}
