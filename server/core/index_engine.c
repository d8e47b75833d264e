/* server/core/index_engine.c: the names of the index engines (see index_engine.h). */
#include "index_engine.h"

#include <string.h>

#include "vindex.h"

int index_engine_parse(const char *s, size_t n)
{
    if (n == 6 && memcmp(s, "native", 6) == 0)
        return VINDEX_ENGINE_NATIVE;
    if (n == 5 && memcmp(s, "faiss", 5) == 0)
        return VINDEX_ENGINE_FAISS;
    return -1;
}

const char *index_engine_name(int engine)
{
    return engine == VINDEX_ENGINE_FAISS ? "faiss" : "native";
}
