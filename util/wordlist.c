/* util/wordlist.c: sorted word lists (see wordlist.h). */
#include "wordlist.h"

#include <stdlib.h>
#include <string.h>

static int cmp_word(const void *k, const void *e)
{
    return strcmp((const char *)k, *(const char *const *)e);
}

int wordlist_find(const char *w, const char *const *list, size_t n)
{
    const char *const *hit = bsearch(w, list, n, sizeof(*list), cmp_word);
    return hit ? (int)(hit - list) : -1;
}

bool wordlist_sorted(const char *const *list, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (strcmp(list[i - 1], list[i]) >= 0)
            return false;
    return true;
}
