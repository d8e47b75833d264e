/* index/embed.h: the built-in text embedder: deterministic, self-contained, no service.
 *
 * Signed feature hashing of lower-cased word unigrams, word bigrams and character
 * trigrams into dim buckets, sublinear weighting (per bucket, 1 + ln|v| above 1), L2
 * normalization. Texts that share words or spelling land near each other; the same text
 * always gives the same vector on every machine (no floating-point summation order depends
 * on threads or CPU features, no libm call whose last bit may vary). Text with no letter or
 * digit but some other non-space bytes ("!!!") embeds from the trigrams of those bytes.
 * Changing the algorithm changes every stored embedding: tests/unit/test_embed.c pins it.
 */
#ifndef ENGRAM_INDEX_EMBED_H
#define ENGRAM_INDEX_EMBED_H

#include <stddef.h>

enum {
    EMBED_E_EMPTY = 1, /* the text holds nothing to embed (empty or only whitespace) */
};

#define EMBED_MIN_DIM 8
#define EMBED_MAX_DIM 4096
#define EMBED_DEFAULT_DIM 384

/* embed_text writes the dim-dimensional, L2-normalized embedding of text (len bytes of
 * UTF-8, need not be NUL-terminated; any bytes are accepted) into out (caller-owned, dim
 * floats). dim must be within [EMBED_MIN_DIM, EMBED_MAX_DIM]. Returns 0, EMBED_E_EMPTY (out
 * is then all zeros) or -EINVAL for a bad dim (or text NULL with len > 0). Thread-safe;
 * allocates nothing (uses up to 32 KiB of stack); time linear in len. */
int embed_text(const char *text, size_t len, size_t dim, float *out);

#endif
