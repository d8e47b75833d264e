/* fuzz/vindex_load.c: a libFuzzer target for the vector index's snapshot parser
 * (index/vindex_load.c), which reads files from disk that a crash, a full disk or another
 * program may have left in any state.
 *
 * The input is a snapshot file, written to a temporary file and loaded with options taken
 * from its own header (dim and meta_size, when plausible), so that inputs get past the
 * dimension check; the kind thresholds are small (SQ8 from 4 vectors, ANN from 8), so small
 * inputs reach the code sections and the mapped rows. When the input's first byte is odd,
 * its checksum field is recomputed first, so that mutated sections reach the checks that
 * run only after the checksum matched (tombstones, ids, codes computed, the map built).
 * A load must return 0 with an index that answers, or a typed refusal with no index;
 * invariants abort() with a message, and ASan and UBSan catch the rest.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vindex.h"
#include "xxh64.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define HEADER 128
#define CK_OFF 56

static char path[256];

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* spit writes the input to path, its checksum recomputed when fix. false on I/O failure. */
static bool spit(const uint8_t *data, size_t size, bool fix)
{
    uint8_t *b = malloc(size ? size : 1);
    if (!b)
        return false;
    memcpy(b, data, size);
    if (fix && size >= HEADER) {
        memset(b + CK_OFF, 0, 8);
        uint64_t ck = xxh64(b, size, 0);
        memcpy(b + CK_OFF, &ck, 8);
    }
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(b, 1, size, f) == size;
    if (f && fclose(f))
        ok = false;
    free(b);
    return ok;
}

static int count_one(uint64_t id, const float *vec, const void *meta, void *ctx)
{
    (void)id;
    (void)vec;
    (void)meta;
    (*(size_t *)ctx)++;
    return 0;
}

/* exercise checks that a loaded index is usable: stats, a walk and a search agree. */
static void exercise(vindex *vi, size_t dim)
{
    vindex_stats st;
    vindex_get_stats(vi, &st);
    REQUIRE(st.count + st.tombstones == st.slots);
    size_t walked = 0;
    REQUIRE(vindex_foreach(vi, count_one, &walked) == 0);
    REQUIRE(walked == st.count);
    float q[64];
    for (size_t i = 0; i < dim; i++)
        q[i] = (float)((i * 7) % 5) - 2.0f + 0.5f;
    vindex_hit hits[5];
    size_t n = 99;
    vindex_query qq = {.vec = q, .k = 5};
    int rc = vindex_search(vi, &qq, hits, &n);
    REQUIRE(rc == 0 || rc == VINDEX_E_ZERO);
    if (rc == 0)
        REQUIRE(n == (st.count < 5 ? st.count : 5));
    (void)vindex_bytes(vi);
    (void)vindex_resident(vi);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!path[0]) {
        const char *dir = getenv("TMPDIR");
        snprintf(path, sizeof(path), "%s/vindex_load_fuzz.%ld", dir && *dir ? dir : "/tmp",
                 (long)getpid());
    }
    /* the options the file's header asks for, within what a search here can query */
    uint64_t dim = size >= 32 ? rd64(data + 16) : 8, msz = size >= 32 ? rd64(data + 24) : 0;
    if (dim == 0 || dim > 64)
        dim = 8;
    if (msz > 256)
        msz = 0;
    if (!spit(data, size, size > 0 && (data[0] & 1)))
        return 0;
    vindex_opts o = {.dim = dim, .meta_size = msz, .quant_min = 4, .ann_min = 8};
    vindex *vi = NULL;
    uint64_t seq = 12345;
    void *extra = NULL;
    size_t xlen = 77;
    int rc = vindex_load_extra(path, &o, &vi, &seq, &extra, &xlen);
    /* a typed refusal, or -errno (out of memory, a mapping refused) */
    REQUIRE(rc <= 0 || rc == VINDEX_E_CORRUPT || rc == VINDEX_E_MISMATCH);
    if (rc == 0) {
        REQUIRE(vi != NULL);
        REQUIRE((extra == NULL) == (xlen == 0));
        exercise(vi, (size_t)dim);
        vindex_destroy(vi);
    } else {
        REQUIRE(vi == NULL && extra == NULL && xlen == 0);
    }
    free(extra);
    unlink(path);
    return 0;
}
