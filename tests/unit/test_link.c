/* tests/unit/test_link.c: every library links on its own.
 *
 * meson builds this file once per library (test_link_proto, test_link_storage,
 * test_link_index, test_link_server), each time with link_whole: every object of that one
 * library is linked in with only the library's declared dependencies. A symbol the library
 * uses but some other target defines (engramd's main.c, a tool) fails the build of the test,
 * which is the check. The test then uses one function of the library so that running it
 * says something too.
 */
#include <stdint.h>

#include "check.h"

#if defined(LINK_SERVER)
#include "server.h"
#elif defined(LINK_STORAGE)
#include "memrow.h"
#elif defined(LINK_INDEX)
#include "vkernel.h"
#elif defined(LINK_PROTO)
#include "json.h"
#endif

int main(void)
{
#if defined(LINK_SERVER)
    /* the clocks server.h declares live in the library (they were in main.c) */
    uint64_t a = server_mono_ns(), b = server_mono_ns();
    CHECK(b >= a);
    CHECK(server_now_ms() > INT64_C(1577836800000)); /* after 2020-01-01 */
#elif defined(LINK_STORAGE)
    CHECK(memrow_type_parse("fact", 4) == MEM_FACT);
#elif defined(LINK_INDEX)
    const float x[4] = {1, 2, 3, 4}, y[4] = {4, 3, 2, 1};
    CHECK(vk_dot(x, y, 4) == 20.0f);
#elif defined(LINK_PROTO)
    json_buf b = {0};
    CHECK(json_buf_append(&b, "x", 1) == 0 && b.len == 1);
    json_buf_fini(&b);
#endif
    CHECK_RETURN();
}
