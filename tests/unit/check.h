/* tests/unit/check.h: the minimal assertion macros every unit test uses.
 *
 * CHECK records a failure with file:line and keeps going; CHECK_RETURN ends the test
 * program with the number of failures as its status (0 passes), for meson test.
 */
#ifndef ENGRAM_TESTS_CHECK_H
#define ENGRAM_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failures;
static int check_count;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        check_count++;                                                                             \
        if (!(cond)) {                                                                             \
            check_failures++;                                                                      \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        check_count++;                                                                             \
        if (!(cond)) {                                                                             \
            check_failures++;                                                                      \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                            \
    CHECK_MSG(strstr((hay), (needle)) != NULL, "'%s' does not contain '%s'", (hay), (needle))

#define CHECK_RETURN()                                                                             \
    do {                                                                                           \
        fprintf(stderr, "%d checks, %d failed\n", check_count, check_failures);                    \
        return check_failures ? 1 : 0;                                                             \
    } while (0)

#endif
