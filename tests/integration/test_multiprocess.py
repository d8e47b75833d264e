"""Two engramd processes sharing one PostgreSQL: writes made through one are found through
the other, administrative changes reach both. (Quota races on two processes are in
tests/reliability/test_quota_races.py.)"""
import pytest

from harness import psql, running_pair, structured_vectors, vec_bin, wait_for

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


def test_store_groups_announce_their_changes_after_the_commit():
    """engram_memory_store_group sends no NOTIFY (it would make commits wait for one another);
    the server announces each group's changes after its commit. With the change check an
    hour apart, B can only learn of A's stores from those announcements."""
    with running_pair("announce", ["--change-poll-ms", "3600000"]) as (a, b, _):
        _, key = a.create_tenant(tier="premium")
        vecs = structured_vectors(12, 384, seed=321)
        with a.client(key=key) as ca, b.client(key=key) as cb:
            ca.call("memory.search", query="warm up")
            cb.call("memory.search", query="warm up")
            one = ca.call("memory.store", content="single", type="fact", importance=0.5,
                          embedding=vec_bin(vecs[0]))["id"]
            ids = ca.call("memory.store_batch", memories=[
                {"content": f"b{i}", "type": "fact", "importance": 0.5, "embedding": vec_bin(v)}
                for i, v in enumerate(vecs[1:])])["ids"]

            def top1(v):
                return [r["id"] for r in cb.call("memory.search", embedding=vec_bin(v), top_k=1,
                                                 similarity_weight=1.0)["results"]]

            assert wait_for(lambda: top1(vecs[0]) == [one], timeout=10), \
                "B never learnt of A's memory.store"
            assert wait_for(lambda: top1(vecs[11]) == [ids[10]], timeout=10), \
                "B never learnt of A's memory.store_batch"


def test_a_change_never_announced_arrives_by_the_change_check():
    """A change committed without a NOTIFY (as when a process dies between a group's commit
    and its announcement; here the group function called directly, which never notifies)
    reaches the other processes' loaded indexes by their periodic change check."""
    with running_pair("unannounced", ["--change-poll-ms", "300"]) as (a, b, dsn):
        tid, key = a.create_tenant(tier="premium")
        vecs = structured_vectors(2, 384, seed=322)
        with b.client(key=key) as cb:
            first = cb.call("memory.store", content="first", type="fact", importance=0.5,
                            embedding=vec_bin(vecs[0]))["id"]
            # B's index is loaded (and holds its own write) before the change below
            assert [r["id"] for r in cb.call("memory.search", embedding=vec_bin(vecs[0]),
                                             top_k=1)["results"]] == [first]
            emb = "\\x" + vec_bin(vecs[1]).hex()
            mid = psql(dsn, f"SELECT m_id FROM engram_memory_store_group(ARRAY[{tid}]::bigint[], "
                            f"ARRAY[1], ARRAY[384], ARRAY[0,0,0]::bigint[], ARRAY[0]::bigint[], "
                            f"ARRAY[0]::bigint[], ARRAY['agent'], ARRAY['fact'], "
                            f"ARRAY['written behind the servers'' backs'], ARRAY[0.5]::float8[], "
                            f"ARRAY['{{}}'], '{emb}'::bytea, ARRAY[NULL]::bigint[], "
                            f"ARRAY[NULL]::bigint[], ARRAY[NULL]::bigint[], ARRAY[0]::bigint[], "
                            f"ARRAY[NULL]::bigint[], ARRAY[false])")
            assert mid.isdigit()

            def top1():
                return [r["id"] for r in cb.call("memory.search", embedding=vec_bin(vecs[1]),
                                                 top_k=1, similarity_weight=1.0)["results"]]

            assert wait_for(lambda: top1() == [int(mid)], timeout=10), \
                "the unannounced change never reached the loaded index"
