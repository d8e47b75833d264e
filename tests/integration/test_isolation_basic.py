"""Two tenants never see each other's memories."""
from harness import structured_vectors, vec_bin


def test_tenants_are_isolated(server):
    _, ka = server.create_tenant()
    _, kb = server.create_tenant()
    vecs = structured_vectors(20, 384, seed=11)
    with server.client(key=ka) as a, server.client(key=kb) as b:
        ida = [a.call("memory.store", content=f"a{i}", type="fact", importance=0.5,
                      embedding=vec_bin(v))["id"] for i, v in enumerate(vecs[:10])]
        idb = [b.call("memory.store", content=f"b{i}", type="fact", importance=0.5,
                      embedding=vec_bin(v))["id"] for i, v in enumerate(vecs[10:])]
        # searching with A's exact vectors from B finds only B's memories
        for v in vecs[:10]:
            res = b.call("memory.search", embedding=vec_bin(v), top_k=20)["results"]
            assert res and {r["id"] for r in res} <= set(idb)
            assert all(r["content"].startswith("b") for r in res)
        # ids are numbered per tenant: both tenants hold ids 1..10 and each reads its own
        assert ida == idb == list(range(ida[0], ida[0] + 10))
        got = b.call("memory.get", ids=ida)["memories"]
        assert sorted(m["content"] for m in got) == sorted(f"b{i}" for i in range(10))
        assert b.call("memory.delete", ids=ida[:5])["deleted"] == ida[:5]
        # B's delete removed B's memories only
        got = a.call("memory.get", ids=ida)["memories"]
        assert sorted(m["content"] for m in got) == sorted(f"a{i}" for i in range(10))
        assert len(b.call("memory.get", ids=idb)["memories"]) == 5
        res = a.call("memory.search", query="b1", top_k=20)["results"]
        assert res and {r["id"] for r in res} <= set(ida)
