/* fuzz/snap_seeds.c: writes the seed snapshots of fuzz/corpus/vindex_load (run by hand
 * after a format change: snap_seeds DIR). Dimension 4 keeps the files small (rows are
 * padded to whole chunks of 4096 slots from the SQ8 kind on: 64 KiB); the options match
 * the fuzz target's (SQ8 from 4 vectors, ANN from 8).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vindex.h"

#define DIM 4

static int fill(vindex *vi, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        float v[DIM];
        uint64_t meta = i * 3 + 1;
        for (size_t d = 0; d < DIM; d++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            v[d] = (float)((double)(seed >> 40) / (double)(1 << 24) - 0.5);
        }
        if (vindex_add(vi, 100 + i, v, &meta))
            return -1;
    }
    return 0;
}

static int one(const char *dir, const char *name, size_t n, size_t removed, bool measured,
               const char *extra)
{
    vindex_opts o = {.dim = DIM, .meta_size = 8, .quant_min = 4, .ann_min = 8};
    vindex *vi = vindex_create(&o);
    if (!vi || fill(vi, n, n * 977))
        return -1;
    for (size_t i = 0; i < removed; i++)
        vindex_remove(vi, 100 + i * 2);
    if (measured)
        vindex_calibrate(vi, 24, 0.99, NULL);
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int rc = vindex_save_extra(vi, path, n * 10, extra, extra ? strlen(extra) : 0);
    vindex_destroy(vi);
    if (rc)
        fprintf(stderr, "%s: %s\n", path, strerror(-rc));
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    int bad = 0;
    bad |= one(argv[1], "flat", 3, 0, false, NULL) != 0;
    bad |= one(argv[1], "flat_extra", 3, 1, false, "tags") != 0;
    bad |= one(argv[1], "sq8", 6, 1, false, NULL) != 0;
    bad |= one(argv[1], "ann", 40, 0, false, NULL) != 0;
    bad |= one(argv[1], "ann_measured_extra", 40, 3, true, "extra bytes") != 0;
    return bad;
}
