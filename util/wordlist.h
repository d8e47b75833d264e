/* util/wordlist.h: sorted lists of words (C string arrays), searched by bisection.
 *
 * Text rules keep their word lists (stop words, units, month names) as sorted static
 * arrays; these two functions search one and check, in a self-test, that it is sorted.
 * Pure functions: any thread.
 */
#ifndef ENGRAM_UTIL_WORDLIST_H
#define ENGRAM_UTIL_WORDLIST_H

#include <stdbool.h>
#include <stddef.h>

/* WORDLIST(a) expands to the array a and its length, for the functions below. */
#define WORDLIST(a) a, sizeof(a) / sizeof(a[0])

/* wordlist_find returns the index of w (NUL-terminated) in list (n words sorted by strcmp),
 * or -1. */
int wordlist_find(const char *w, const char *const *list, size_t n);

/* wordlist_sorted tells whether list's n words are strictly increasing by strcmp (sorted,
 * no duplicates). */
bool wordlist_sorted(const char *const *list, size_t n);

#endif
