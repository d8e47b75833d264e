/* fuzz/no_faiss.c: the fuzz build has no FAISS (meson.build, -Dfuzz=true), but settings
 * (server/core/config.c) try index_faiss_factory once at start-up. This stand-in accepts any
 * factory: the server fuzzer never builds an index. */
#include <stddef.h>

#include "vfaiss.h"

int vfaiss_create(size_t dim, const char *factory, int ef_search, vfaiss **out, char *err,
                  size_t errlen)
{
    *out = NULL;
    return 0;
}

void vfaiss_destroy(vfaiss *f) {}
