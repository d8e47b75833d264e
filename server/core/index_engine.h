/* server/core/index_engine.h: the names of the index engines (vindex.h's VINDEX_ENGINE_*),
 * as settings, tenants' rows and answers spell them. */
#ifndef ENGRAM_SERVER_INDEX_ENGINE_H
#define ENGRAM_SERVER_INDEX_ENGINE_H

#include <stddef.h>

/* index_engine_parse returns the VINDEX_ENGINE_* named by the n bytes at s ("native",
 * "faiss"), or -1. index_engine_name returns the name of an engine. */
int index_engine_parse(const char *s, size_t n);
const char *index_engine_name(int engine);

#endif
