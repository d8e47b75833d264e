"""The memory API: record fields, visibility, lifecycle, batch, idempotency, expiry, list."""
import time

import pytest

from harness import Server, new_database, psql, structured_vectors, vec_bin, wait_for
from memmodel import DAY_MS, composite, now_ms


def test_record_fields_round_trip(server, client):
    t = now_ms()
    r = client.call("memory.store", content="LP exits cost 3.2%", type="episode", importance=0.6,
                    agent_id=2**64 - 1, clade_id=9, scope="clade", created_at=t - 3 * DAY_MS,
                    ttl_seconds=3600, pinned=True,
                    metadata={"tokens": ["ETH"], "chains": [1, 2**63], "protocols": ["uniswap"],
                              "strategy_id": "lp-7", "attrs": {"pool": {"fee": 5}, "n": [1, 2]}})
    assert r["created_at"] == t - 3 * DAY_MS
    m = client.call("memory.get", ids=[r["id"]])["memories"][0]
    assert m["agent_id"] == 2**64 - 1 and m["clade_id"] == 9 and m["scope"] == "clade"
    assert m["type"] == "episode" and m["pinned"] is True and m["version"] == 1
    assert m["metadata"]["chains"] == [1, 2**63] and m["metadata"]["attrs"]["pool"] == {"fee": 5}
    assert t + 3590_000 <= m["expires_at"] <= now_ms() + 3600_000
    assert m["access_count"] == 0 and m["last_accessed_at"] is None


@pytest.mark.parametrize("params,needle", [
    ({"metadata": {"color": "red"}}, "unknown field 'metadata.color'"),
    ({"metadata": {"tokens": "ETH"}}, "'metadata.tokens'"),
    ({"metadata": {"chains": [-1]}}, "'metadata.chains'"),
    ({"metadata": {"tokens": ["a\x01b"]}}, "control characters"),
    ({"metadata": {"attrs": [1]}}, "'metadata.attrs'"),
    ({"scope": "agent"}, "agent_id"),
    ({"scope": "clade", "agent_id": 1}, "clade_id"),
    ({"scope": "galaxy"}, "'scope'"),
    ({"created_at": now_ms() + 3600_000}, "future"),
    ({"expires_at": now_ms() - 1}, "expires_at"),
    ({"expires_at": now_ms() + 10000, "ttl_seconds": 5}, "not both"),
])
def test_store_rejects(server, client, params, needle):
    base = {"content": "x", "type": "fact", "importance": 0.5}
    base.update(params)
    err = client.call_err("memory.store", **base)
    assert err["code"] == "invalid_argument" and needle in err["message"], err


def test_visibility_by_scope(server, client):
    v = structured_vectors(1, 384, seed=77)[0]
    e = vec_bin(v)
    ids = {}
    ids["a1"] = client.call("memory.store", content="a1", type="fact", importance=0.5, embedding=e, agent_id=1)["id"]
    ids["a2"] = client.call("memory.store", content="a2", type="fact", importance=0.5, embedding=e, agent_id=2)["id"]
    ids["c1"] = client.call("memory.store", content="c1", type="fact", importance=0.5, embedding=e,
                            agent_id=2, clade_id=10, scope="clade")["id"]
    ids["c2"] = client.call("memory.store", content="c2", type="fact", importance=0.5, embedding=e,
                            agent_id=3, clade_id=11, scope="clade")["id"]
    ids["t"] = client.call("memory.store", content="t", type="fact", importance=0.5, embedding=e)["id"]

    def seen(**kw):
        res = client.call("memory.search", embedding=e, top_k=20, **kw)["results"]
        return {x["content"] for x in res}

    assert seen() == {"a1", "a2", "c1", "c2", "t"}  # no agent: the tenant-wide view
    assert seen(agent_id=1) == {"a1", "t"}
    assert seen(agent_id=1, clade_id=10) == {"a1", "c1", "t"}
    assert seen(agent_id=2, clade_id=11) == {"a2", "c2", "t"}
    assert seen(agent_id=1, clade_id=10, scopes=["clade"]) == {"c1"}
    assert seen(agent_id=1, scopes=["agent", "tenant"]) == {"a1", "t"}
    assert seen(scopes=["tenant"]) == {"t"}
    err = client.call_err("memory.search", embedding=e, clade_id=10)
    assert err["code"] == "invalid_argument" and "agent_id" in err["message"]


def test_access_counts_are_durable_and_raise_the_composite():
    srv = Server(new_database("acc")).start()
    try:
        tid, key = srv.create_tenant()
        with srv.client(key=key) as c:
            v = structured_vectors(2, 384, seed=5)
            a = c.call("memory.store", content="a", type="fact", importance=0.5, embedding=vec_bin(v[0]))["id"]
            c.call("memory.store", content="b", type="fact", importance=0.5, embedding=vec_bin(v[1]))
            comps = []
            for _ in range(3):
                res = c.call("memory.search", embedding=vec_bin(v[0]), top_k=1, similarity_weight=1.0)["results"]
                assert res[0]["id"] == a
                comps.append(res[0]["composite"])
            # each access adds 0.3 / 10 to the composite
            assert comps[1] - comps[0] == pytest.approx(0.03, abs=1e-4)
            assert comps[2] - comps[1] == pytest.approx(0.03, abs=1e-4)
            ctx = c.call("memory.context", embedding=vec_bin(v[0]), top_k=1)
            assert ctx["ids"] == [a]
            # the access log is written about once a second
            assert wait_for(lambda: c.call("memory.get", ids=[a])["memories"][0]["access_count"] >= 4)
            m = c.call("memory.get", ids=[a])["memories"][0]
            assert m["access_count"] == 4 and m["last_accessed_at"] is not None
        srv.restart()  # durable: the index reloads the counts from PostgreSQL
        with srv.client(key=key) as c:
            res = c.call("memory.search", embedding=vec_bin(v[0]), top_k=1, similarity_weight=1.0)["results"]
            assert res[0]["access_count"] == 4
            assert res[0]["composite"] == pytest.approx(comps[2] + 0.06, abs=1e-4)
        srv.stop()
    finally:
        srv.cleanup()


def test_update_reembeds_and_keeps_history(server, client):
    a = client.call("memory.store", content="the vault pays four percent", type="fact", importance=0.5,
                    metadata={"tokens": ["USDC"]})["id"]
    client.call("memory.store", content="an unrelated note about gas fees", type="fact", importance=0.5)
    r = client.call("memory.update", id=a, content="staking rewards doubled overnight", importance=0.9)
    assert r["version"] == 2
    res = client.call("memory.search", query="staking rewards doubled", top_k=1, similarity_weight=1.0)["results"]
    assert res[0]["id"] == a and res[0]["similarity"] > 0.7
    m = client.call("memory.get", ids=[a])["memories"][0]
    assert m["content"] == "staking rewards doubled overnight" and m["importance"] == pytest.approx(0.9)
    client.call("memory.update", id=a, type="constraint", metadata={"tokens": ["DAI"]})
    h = client.call("memory.history", id=a)["versions"]
    assert [x["version"] for x in h] == [1, 2, 3]
    assert h[0]["content"] == "the vault pays four percent" and h[0]["replaced_by"] == "update"
    assert h[0]["metadata"] == {"tokens": ["USDC"]}
    assert h[2]["type"] == "constraint" and h[2]["valid_to"] is None
    assert h[0]["valid_to"] == h[1]["valid_from"]
    # the index follows the metadata change: the token filter sees DAI now
    assert [x["id"] for x in client.call("memory.search", query="staking", tokens=["DAI"])["results"]] == [a]
    assert client.call("memory.search", query="staking", tokens=["USDC"])["results"] == []
    assert client.call_err("memory.update", id=a)["code"] == "invalid_argument"
    assert client.call_err("memory.update", id=987654321, importance=0.1)["code"] == "not_found"
    assert client.call_err("memory.history", id=987654321)["code"] == "not_found"


def test_archive_and_restore(server, client):
    e = vec_bin(structured_vectors(1, 384, seed=8)[0])
    a = client.call("memory.store", content="archived soon", type="fact", importance=0.5, embedding=e)["id"]
    assert client.call("memory.archive", ids=[a], reason="stale")["archived"] == [a]
    assert client.call("memory.archive", ids=[a])["archived"] == []  # already archived
    assert a not in [x["id"] for x in client.call("memory.search", embedding=e, top_k=5)["results"]]
    res = client.call("memory.search", embedding=e, top_k=5, include_archived=True)["results"]
    assert a in [x["id"] for x in res]
    m = client.call("memory.get", ids=[a])["memories"][0]
    assert m["archived_at"] is not None and m["archived_reason"] == "stale"
    assert client.call("memory.restore", ids=[a])["restored"] == [a]
    assert a in [x["id"] for x in client.call("memory.search", embedding=e, top_k=5)["results"]]
    assert [v["replaced_by"] for v in client.call("memory.history", id=a)["versions"]][:2] == ["archive", "restore"]


def test_store_batch_all_or_nothing(server, tenant):
    with server.client(key=tenant[1]) as c:
        before = c.call("memory.stats")["total"]
        good = [{"content": f"b{i}", "type": "fact", "importance": 0.5} for i in range(1000)]
        r = c.call("memory.store_batch", memories=good)
        assert len(r["ids"]) == 1000 and len(set(r["ids"])) == 1000
        assert c.call("memory.stats")["total"] == before + 1000
        bad = [dict(x) for x in good[:10]]
        bad[7]["importance"] = 2
        err = c.call_err("memory.store_batch", memories=bad)
        assert err["code"] == "invalid_argument" and "memories[7]" in err["message"]
        bad = [dict(x) for x in good[:10]]
        bad[3]["embedding"] = b"\x00\x00\x80\x3f" * 5
        err = c.call_err("memory.store_batch", memories=bad)
        assert err["code"] == "invalid_argument" and "memories[3].embedding" in err["message"]
        assert c.call("memory.stats")["total"] == before + 1000
        err = c.call_err("memory.store_batch", memories=good + good[:1])
        assert err["code"] == "invalid_argument" and "memories" in err["message"]
        assert c.call("memory.stats")["total"] == before + 1000


def test_idempotency_keys(server, client):
    r1 = client.call("memory.store", content="once", type="fact", importance=0.5, idempotency_key="op-1")
    r2 = client.call("memory.store", content="once", type="fact", importance=0.5, idempotency_key="op-1")
    assert r1["id"] == r2["id"] and r1["created_at"] == r2["created_at"]
    assert r1["replayed"] is False and r2["replayed"] is True
    err = client.call_err("memory.store", content="other", type="fact", importance=0.5, idempotency_key="op-1")
    assert err["code"] == "conflict"
    b1 = client.call("memory.store_batch", memories=[{"content": "x", "type": "fact", "importance": 0.1}] * 3,
                     idempotency_key="op-2")
    b2 = client.call("memory.store_batch", memories=[{"content": "x", "type": "fact", "importance": 0.1}] * 3,
                     idempotency_key="op-2")
    assert b1["ids"] == b2["ids"] and b2["replayed"]
    res = client.call("memory.list", limit=1000)["memories"]
    assert sum(1 for m in res if m["content"] == "once") == 1
    assert sum(1 for m in res if m["content"] == "x") == 3


def test_expiry_hides_then_purges():
    dbdsn = new_database("ttl")
    srv = Server(dbdsn, extra=["--maintenance-interval-s", "1"]).start()
    try:
        tid, key = srv.create_tenant()
        with srv.client(key=key) as c:
            e = vec_bin(structured_vectors(1, 384, seed=3)[0])
            a = c.call("memory.store", content="short lived", type="fact", importance=0.5, embedding=e,
                       ttl_seconds=1)["id"]
            b = c.call("memory.store", content="long lived", type="fact", importance=0.5, embedding=e)["id"]
            assert {x["id"] for x in c.call("memory.search", embedding=e)["results"]} == {a, b}
            time.sleep(1.3)  # wall clock: the 1 s TTL runs out
            assert [x["id"] for x in c.call("memory.search", embedding=e)["results"]] == [b]
            assert c.call("memory.get", ids=[a])["memories"] == []
            listed = [m["id"] for m in c.call("memory.list")["memories"]]
            assert listed and a not in listed
            # the purge deletes the row within a few maintenance intervals
            assert wait_for(lambda: psql(dbdsn, f"SELECT count(*) FROM memories WHERE tenant_id = {tid} "
                                                f"AND id = {a}") == "0", timeout=10, interval=0.3), \
                "expired memory not purged"
            assert c.call("memory.stats")["total"] == 1
        srv.stop()
    finally:
        srv.cleanup()


def test_list_pages_are_stable_and_complete(server, tenant):
    t0 = now_ms()
    with server.client(key=tenant[1]) as c:
        items = [{"content": f"l{i}", "type": "fact" if i % 3 else "episode",
                  "importance": ((i * 37) % 100) / 100, "created_at": t0 - i * 60000} for i in range(230)]
        ids = c.call("memory.store_batch", memories=items)["ids"]
        byid = dict(zip(ids, items))
        for order_by, order in [("created_at", "desc"), ("created_at", "asc"), ("importance", "desc"),
                                ("composite", "desc"), ("importance", "asc")]:
            got, cursor = [], None
            while True:
                kw = {"order_by": order_by, "order": order, "limit": 37}
                if cursor:
                    kw["cursor"] = cursor
                page = c.call("memory.list", **kw)
                got += [m["id"] for m in page["memories"]]
                cursor = page["next_cursor"]
                if not cursor:
                    break
            assert sorted(got) == sorted(ids), (order_by, order)  # complete, no duplicates
            sign = -1 if order == "desc" else 1
            if order_by == "created_at":
                key = lambda i: (sign * byid[i]["created_at"], sign * i)
            elif order_by == "importance":
                key = lambda i: (sign * byid[i]["importance"], sign * i)
            else:
                key = lambda i: (sign * composite(byid[i]["created_at"], 0, byid[i]["importance"], t0), sign * i)
            if order_by != "composite":
                assert got == sorted(ids, key=key), (order_by, order)
            else:
                comps = [composite(byid[i]["created_at"], 0, byid[i]["importance"], t0) for i in got]
                assert all(comps[i] >= comps[i + 1] - 1e-6 for i in range(len(comps) - 1))
        # filters apply to listings; a cursor of another ordering is refused
        eps = c.call("memory.list", type_filter=["episode"], limit=1000)["memories"]
        assert {m["id"] for m in eps} == {i for i in ids if byid[i]["type"] == "episode"}
        page = c.call("memory.list", order_by="importance", limit=5)
        err = c.call_err("memory.list", order_by="created_at", cursor=page["next_cursor"])
        assert err["code"] == "invalid_argument" and "cursor" in err["message"]
        assert c.call_err("memory.list", cursor="garbage")["code"] == "invalid_argument"
        with_emb = c.call("memory.list", limit=3, include_embedding=True)["memories"]
        assert with_emb and all(len(m["embedding"]) == 384 * 4 for m in with_emb)


def test_stats(server, tenant):
    t0 = now_ms()
    with server.client(key=tenant[1]) as c:
        c.call("memory.store", content="s1", type="fact", importance=0.5, created_at=t0 - 5000)
        c.call("memory.store", content="s2", type="constraint", importance=0.5, agent_id=3)
        c.call("memory.store", content="s3", type="constraint", importance=0.5, agent_id=3, clade_id=1, scope="clade")
        a = c.call("memory.store", content="s4", type="episode", importance=0.5)["id"]
        c.call("memory.archive", ids=[a])
        s = c.call("memory.stats")
        assert s["total"] == 4 and s["archived"] == 1
        assert s["by_type"] == {"fact": 1, "preference": 0, "episode": 1, "strategy_outcome": 0, "constraint": 2}
        assert s["by_scope"] == {"agent": 1, "clade": 1, "tenant": 2}
        assert s["oldest_at"] == t0 - 5000 and s["newest_at"] >= t0
        assert s["storage_bytes"] > 4 * 384 * 4


def test_other_tenant_sees_nothing_of_the_lifecycle(server, client):
    a = client.call("memory.store", content="mine", type="fact", importance=0.5)["id"]
    _, other = server.create_tenant()
    with server.client(key=other) as o:
        assert o.call_err("memory.update", id=a, importance=0.1)["code"] == "not_found"
        assert o.call_err("memory.history", id=a)["code"] == "not_found"
        assert o.call("memory.archive", ids=[a])["archived"] == []
        assert o.call("memory.restore", ids=[a])["restored"] == []
        assert o.call("memory.list")["memories"] == []
        assert o.call("memory.stats")["total"] == 0
    assert client.call("memory.get", ids=[a])["memories"][0]["importance"] == pytest.approx(0.5)


def test_list_by_composite_counts_pending_accesses():
    """memory.list order_by=composite ranks with the same access counts search does,
    including accesses not folded into their rows yet (the maintenance fold is an hour
    away here)."""
    from harness import psql, wait_for
    dbdsn = new_database("comp")
    srv = Server(dbdsn, extra=["--maintenance-interval-s", "3600"]).start()
    try:
        tid, key = srv.create_tenant()
        t0 = now_ms() - DAY_MS
        vecs = structured_vectors(3, 384, seed=77)
        with srv.client(key=key) as c:
            ids = c.call("memory.store_batch", memories=[
                {"content": f"c{i}", "type": "fact", "importance": 0.5, "created_at": t0,
                 "embedding": vec_bin(v)} for i, v in enumerate(vecs)])["ids"]
            for _ in range(4):
                res = c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=1,
                             similarity_weight=1.0)["results"]
                assert res[0]["id"] == ids[0]
            assert wait_for(lambda: c.call("memory.get", ids=[ids[0]])["memories"][0]
                            ["access_count"] == 4)
            # pending, not folded: the row itself still says 0
            assert psql(dbdsn, f"SELECT access_count FROM memories WHERE tenant_id = {tid} "
                               f"AND id = {ids[0]}") == "0"
            got = [m["id"] for m in c.call("memory.list", order_by="composite")["memories"]]
            # equal but for the accesses: the accessed memory ranks first, the others by id
            assert got == [ids[0], ids[2], ids[1]]
            r = c.call("memory.list", order_by="composite", min_composite=
                       composite(t0, 4, 0.5, now_ms()) - 0.01)["memories"]
            assert [m["id"] for m in r] == [ids[0]]
        srv.stop()
    finally:
        srv.cleanup()


def test_get_names_the_missing_ids(server, client):
    a = client.call("memory.store", content="here", type="fact", importance=0.5)["id"]
    b = client.call("memory.store", content="gone", type="fact", importance=0.5)["id"]
    client.call("memory.delete", ids=[b])
    got = client.call("memory.get", ids=[b, a, 999999, b, a])
    assert [m["id"] for m in got["memories"]] == [a]
    assert got["missing"] == [b, 999999]  # in the order asked, once each
    assert client.call("memory.get", ids=[a])["missing"] == []


def test_invalid_argument_names_the_field(server, client):
    for params, field in ((dict(content="x", type="fact", importance=2), "importance"),
                          (dict(content="x", type="fact", importance=0.5, colour=1), "colour"),
                          (dict(type="fact", importance=0.5), "content")):
        e = client.call_err("memory.store", **params)
        assert e["code"] == "invalid_argument" and e["field"] == field, e
    e = client.call_err("memory.store_batch", memories=[
        {"content": "ok", "type": "fact", "importance": 0.5},
        {"content": "x", "type": "fact", "importance": 7}])
    assert e["field"] == "memories[1].importance", e
