"""Two engramd processes sharing one PostgreSQL: writes made through one are found through
the other, administrative changes reach both. (Quota races on two processes are in
tests/reliability/test_quota_races.py.)"""
import pytest

from harness import running_pair, structured_vectors, vec_bin, wait_for

LIMITS = ["--free-max-memories", "40", "--free-queries-per-day", "25",
          "--free-rate-per-s", "1000", "--free-rate-burst", "1000"]


@pytest.fixture(scope="module")
def pair():
    with running_pair("pair", LIMITS) as p:
        yield p


def test_writes_through_one_are_found_through_the_other(pair):
    a, b, _ = pair
    _, key = a.create_tenant(tier="premium")
    vecs = structured_vectors(60, 384, seed=123)
    with a.client(key=key) as ca, b.client(key=key) as cb:
        # both indexes are loaded before the writes, so B must follow A's change log
        ca.call("memory.search", query="warm up")
        cb.call("memory.search", query="warm up")
        ids = ca.call("memory.store_batch", memories=[{"content": f"x{i}", "type": "fact", "importance": 0.5,
                                                       "embedding": vec_bin(v)} for i, v in enumerate(vecs)])["ids"]

        def top1(c):
            return c.call("memory.search", embedding=vec_bin(vecs[17]), top_k=1, similarity_weight=1.0)["results"]

        assert wait_for(lambda: (res := top1(cb)) and res[0]["id"] == ids[17], timeout=10), \
            "B never saw A's write"
        cb.call("memory.delete", ids=[ids[17]])
        assert wait_for(lambda: (res := top1(ca)) and res[0]["id"] != ids[17], timeout=10), \
            "A still finds a memory deleted through B"
        cb.call("memory.update", id=ids[3], metadata={"tokens": ["MOVED"]})
        assert wait_for(lambda: [r["id"] for r in ca.call("memory.search", embedding=vec_bin(vecs[3]),
                                                          tokens=["MOVED"])["results"]] == [ids[3]],
                        timeout=10), "A never saw B's update"


def test_admin_changes_reach_the_other_process(pair):
    a, b, _ = pair
    tid, key = a.create_tenant(tier="premium")
    with b.admin() as adm:
        k2 = adm.call("admin.key.create", tenant_id=tid, name="second")
    cb = b.client(key=key)
    cb2 = b.client(key=k2["api_key"])
    try:
        cb.call("memory.store", content="x", type="fact", importance=0.1)
        with a.admin() as adm:
            adm.call("admin.key.revoke", key_id=k2["key_id"])
            adm.call("admin.tenant.update", tenant_id=tid, tier="free")

        def refused(c):
            """memory.stats' error through c, None while it still succeeds."""
            return c.wait(c.send("memory.stats", {}))[0]

        e = wait_for(lambda: refused(cb2), timeout=10)
        assert e is not None, "the revocation never reached the other process"
        assert e["code"] == "unauthenticated"
        assert wait_for(lambda: cb.call("tenant.usage")["tier"] == "free", timeout=10)
        with a.admin() as adm:
            adm.call("admin.tenant.delete", tenant_id=tid)
        e = wait_for(lambda: refused(cb), timeout=10)
        assert e is not None, "the deletion never reached the other process"
        assert e["code"] == "unauthenticated"
    finally:
        cb.close()
        cb2.close()
