/* tests/unit/test_link.c: every library links on its own.
 *
 * meson builds this file once per library (test_link_util, test_link_proto,
 * test_link_storage, test_link_index, test_link_vfaiss, test_link_dedupe, test_link_client,
 * test_link_llm and the server's test_link_core, test_link_domain, test_link_net,
 * test_link_methods), each time with link_whole: every object of that one
 * library is linked in with only the library's declared dependencies. A symbol the library
 * uses but some other target defines (engramd's main.c, a tool) fails the build of the test,
 * which is the check: for the server's libraries, a call that runs against their layering
 * (domain or net calling methods, domain calling net, core calling any of them) fails it. The
 * test then uses one function of the library so that running it
 * says something too.
 */
#include <stdint.h>

#include "check.h"

#if defined(LINK_CORE)
#include "server.h"
#elif defined(LINK_DOMAIN)
#include "access.h"
#elif defined(LINK_NET)
#include "hooks.h"
#elif defined(LINK_METHODS)
#include "methods.h"
#elif defined(LINK_STORAGE)
#include "memrow.h"
#elif defined(LINK_INDEX)
#include "vkernel.h"
#elif defined(LINK_PROTO)
#include "json.h"
#elif defined(LINK_UTIL)
#include "idmap.h"
#elif defined(LINK_VFAISS)
#include "vfaiss.h"
#elif defined(LINK_DEDUPE)
#include <stdlib.h>

#include "dedupe.h"
#elif defined(LINK_CLIENT)
#include "client.h"
#elif defined(LINK_LLM)
#include "llm.h"
#endif

int main(void)
{
#if defined(LINK_CORE)
    /* the clocks server.h declares live in the library (they were in main.c) */
    uint64_t a = server_mono_ns(), b = server_mono_ns();
    CHECK(b >= a);
    CHECK(server_now_ms() > INT64_C(1577836800000)); /* after 2020-01-01 */
#elif defined(LINK_DOMAIN)
    access_log *l = access_log_create();
    uint64_t id = 5;
    CHECK(l && access_log_add(l, 1, &id, 1, 1000) == 0 && access_log_count(l) == 1);
    access_log_destroy(l);
#elif defined(LINK_NET)
    const method_def t[2] = {{.name = "a.b"}, {.name = "c"}};
    size_t idx = 9;
    CHECK(hooks_method_find(t, 2, "c", 1, &idx) == &t[1] && idx == 1);
    CHECK(hooks_method_find(t, 2, "a", 1, &idx) == NULL);
#elif defined(LINK_METHODS)
    CHECK(methods_check() == 0);
    size_t idx = 0;
    CHECK(methods_find("ping", 4, &idx) != NULL);
#elif defined(LINK_STORAGE)
    CHECK(memrow_type_parse("fact", 4) == MEM_FACT);
#elif defined(LINK_INDEX)
    const float x[4] = {1, 2, 3, 4}, y[4] = {4, 3, 2, 1};
    CHECK(vk_dot(x, y, 4) == 20.0f);
#elif defined(LINK_PROTO)
    json_buf b = {0};
    CHECK(json_buf_append(&b, "x", 1) == 0 && b.len == 1);
    json_buf_fini(&b);
#elif defined(LINK_UTIL)
    idmap *m = idmap_create(4);
    uint64_t v = 0;
    CHECK(m && idmap_put(m, 7, 70) == 0 && idmap_get(m, 7, &v) && v == 70);
    idmap_destroy(m);
#elif defined(LINK_VFAISS)
    vfaiss *f = NULL;
    char err[256];
    CHECK(vfaiss_create(8, "Flat", 0, &f, err, sizeof(err)) == 0 && vfaiss_dim(f) == 8);
    vfaiss_destroy(f);
#elif defined(LINK_DEDUPE)
    /* two identical unit vectors and one orthogonal: one pair */
    const float vecs[6] = {1, 0, 1, 0, 0, 1};
    dedupe_pair *pairs = NULL;
    size_t n = 0;
    char err[256];
    CHECK(dedupe_pairs(vecs, 3, 2, 0.99f, NULL, &pairs, &n, err, sizeof(err)) == 0 && n == 1);
    free(pairs);
#elif defined(LINK_CLIENT)
    /* nothing listens on loopback port 1: refused, no connection handed out */
    client_conn *c = (client_conn *)&c;
    char err[256];
    CHECK(client_connect("127.0.0.1", 1, 2000, &c, err, sizeof(err)) != 0 && c == NULL);
    client_close(c);
#elif defined(LINK_LLM)
    llm_kind k;
    CHECK(llm_kind_parse("anthropic", &k) == 0 && k == LLM_ANTHROPIC);
#endif
    CHECK_RETURN();
}
