"""Requests written against seed 003 work as written (issue 14, section 5).

- memory.store takes the seed's `memory_type` for `type` (store_batch items too), and
  memory.search / memory.context its `type_filter` and `min_importance`;
- `min_importance` is the author's importance, `min_composite` the composite;
- memories archived (by consolidation or by memory.archive) stop counting against the tier's
  memory limit, tenant.usage counts them apart, and a restore past the limit is refused,
  exactly, also with two engramd processes racing;
- memory.list order_by composite ranks by the composite computed live (no stored copy);
- memory.delete {filter, dry_run}: one call clears one agent's memory, in batches, confirmed
  by a dry run's count; an empty filter needs all: true.
"""
import concurrent.futures

import numpy as np
import pytest

from harness import RpcError, new_database, psql, server_pair, vec_bin, wait_for
from memmodel import DAY_MS, composite, now_ms

DIM = 16
PREMIUM_LIMIT = 12
LIMITS = ["--premium-max-memories", str(PREMIUM_LIMIT), "--premium-consolidation-hours", "0",
          "--standard-consolidation-hours", "0", "--free-consolidation-hours", "0",
          "--standard-queries-per-day", "0", "--standard-rate-per-s", "100000",
          "--standard-rate-burst", "100000", "--premium-rate-per-s", "100000",
          "--premium-rate-burst", "100000"]


def counts(memories):
    """tenant.usage's memory counts (its byte figures are tested in test_field_limits)."""
    return {k: memories[k] for k in ("stored", "archived", "limit")}


@pytest.fixture(scope="module")
def pair():
    """Two engramd processes on one database: a answers most calls, b checks that what a
    changed reaches another process's index through the change log."""
    dsn = new_database("seed")
    a, b = server_pair(dsn, LIMITS)
    a.dsn_plain = dsn
    yield a, b
    try:
        a.stop()
        b.stop()
    finally:
        a.cleanup()
        b.cleanup()


@pytest.fixture
def srv(pair):
    return pair[0]


def unit(seed):
    v = np.random.default_rng(seed).standard_normal(DIM)
    return v / np.linalg.norm(v)


def live_count_matches(dsn, tid):
    """tenants.memory_count equals the tenant's live (unarchived) rows."""
    got = psql(dsn, f"SELECT t.memory_count = (SELECT count(*) FROM memories m WHERE "
                    f"m.tenant_id = t.id AND m.archived_at IS NULL) FROM tenants t WHERE t.id = {tid}")
    return got == "t"


# ---- seed-named parameters ------------------------------------------------------------------

def test_seed_store_and_search_requests_as_written(srv):
    """MemoryStoreRequest and MemorySearchRequest of seed 003, field for field."""
    _, key = srv.create_tenant(tier="standard")
    with srv.client(key=key) as c:
        # MemoryStoreRequest {content, memory_type, importance, metadata}
        rule = c.call("memory.store", **{
            "content": "Never LP in pools with less than $100K TVL",
            "memory_type": "constraint",
            "importance": 0.95,
            "metadata": {"tokens": ["USDC", "ETH"], "chains": [1], "protocols": ["uniswap"],
                         "strategy_id": "lp-guard"}})["id"]
        fact = c.call("memory.store", content="Morpho USDC vault base APY is 2.3%",
                      memory_type="fact", importance=0.7, metadata={"protocols": ["morpho"]})["id"]
        low = c.call("memory.store", content="USDC pools were quiet on Sunday",
                     memory_type="episode", importance=0.2)["id"]
        # store_batch items take it too, and `type` still works (the same value twice is fine)
        ids = c.call("memory.store_batch", memories=[
            {"content": "prefer the 0.30% fee tier for USDC pairs", "memory_type": "preference",
             "importance": 0.6},
            {"content": "DCA into ETH beat lump sum by 12%", "type": "strategy_outcome",
             "importance": 0.8},
            {"content": "USDC depeg risk is low", "type": "fact", "memory_type": "fact",
             "importance": 0.5}])["ids"]
        got = {m["id"]: m for m in c.call("memory.get", ids=[rule, fact, low] + ids)["memories"]}
        assert [got[i]["type"] for i in [rule, fact, low] + ids] == [
            "constraint", "fact", "episode", "preference", "strategy_outcome", "fact"]
        # MemorySearchRequest {query, top_k, type_filter, min_importance}
        res = c.call("memory.search", **{"query": "USDC pools", "top_k": 10,
                                         "type_filter": ["constraint", "fact", "episode"],
                                         "min_importance": 0.6})["results"]
        assert {r["id"] for r in res} == {rule, fact}
        assert all(r["type"] in ("constraint", "fact") and r["importance"] >= 0.6 for r in res)
        # memory.context takes search's parameters as the seed names them
        ctx = c.call("memory.context", query="USDC pools", top_k=10, type_filter=["constraint"],
                     min_importance=0.9)
        assert ctx["ids"] == [rule] and 'type="constraint" importance="0.95"' in ctx["text"]
        # text and hybrid modes (PostgreSQL's filter) agree
        for mode in ("text", "hybrid"):
            res = c.call("memory.search", query="pools", mode=mode, type_filter=["constraint", "episode"],
                         min_importance=0.6)["results"]
            assert [r["id"] for r in res] == [rule], mode


def test_memory_type_alias_errors_and_idempotency(srv):
    _, key = srv.create_tenant(tier="standard")
    with srv.client(key=key) as c:
        err = c.call_err("memory.store", content="x", type="fact", memory_type="episode", importance=0.5)
        assert err["code"] == "invalid_argument"
        assert "'type'" in err["message"] and "'memory_type'" in err["message"]
        err = c.call_err("memory.store", content="x", importance=0.5)
        assert err["code"] == "invalid_argument" and "missing required parameter 'type'" in err["message"]
        err = c.call_err("memory.store", content="x", memory_type="rumour", importance=0.5)
        assert err["code"] == "invalid_argument" and "'type' must be one of" in err["message"]
        err = c.call_err("memory.store_batch", memories=[
            {"content": "a", "type": "fact", "importance": 0.5},
            {"content": "b", "type": "fact", "memory_type": "preference", "importance": 0.5}])
        assert err["code"] == "invalid_argument"
        assert "memories[1]" in err["message"] and "'memory_type'" in err["message"]
        assert c.call("memory.stats")["total"] == 0
        # `methods` lists memory_type as an alias of type, not as a parameter of its own
        with srv.client() as anon:
            store = next(m for m in anon.call("methods") if m["name"] == "memory.store")
        t = next(p for p in store["params"] if p["name"] == "type")
        assert t["required"] and t["aliases"] == ["memory_type"]
        assert "memory_type" not in {p["name"] for p in store["params"]}
        # a retry under the same idempotency key may use either name: the same request
        first = c.call("memory.store", content="once", memory_type="fact", importance=0.5,
                       idempotency_key="k1")
        again = c.call("memory.store", content="once", type="fact", importance=0.5,
                       idempotency_key="k1")
        assert again["replayed"] and again["id"] == first["id"]
        assert c.call("memory.stats")["total"] == 1


# ---- min_importance and min_composite ----------------------------------------------------------

def test_min_importance_is_the_authors_and_min_composite_the_composite(srv):
    q = unit(1)
    # vector search, list and text search (the index's filter and PostgreSQL's), each on a
    # tenant of its own: every search result counts as an access and lifts its composite
    for how in ("search", "list", "text"):
        _, key = srv.create_tenant(tier="standard", embedding={"dim": DIM})
        t0 = now_ms()
        with srv.client(key=key) as c:
            # old and important: composite 0.3 * e^-10 + 0.4 * 0.9 = 0.36
            old = c.call("memory.store", content="old wisdom", type="fact", importance=0.9,
                         created_at=t0 - 300 * DAY_MS, embedding=vec_bin(q))["id"]
            # new and unimportant: composite 0.3 + 0.4 * 0.2 = 0.38
            new = c.call("memory.store", content="new gossip", type="fact", importance=0.2,
                         embedding=vec_bin(-q))["id"]
            assert composite(t0 - 300 * DAY_MS, 0, 0.9, now_ms()) < 0.37 < composite(t0, 0, 0.2, now_ms())

            def found(**flt):
                if how == "search":
                    res = c.call("memory.search", embedding=vec_bin(q), top_k=10, **flt)["results"]
                elif how == "text":
                    res = c.call("memory.search", query="old wisdom OR new gossip", mode="text",
                                 **flt)["results"]
                else:
                    res = c.call("memory.list", **flt)["memories"]
                return {r["id"] for r in res}

            # the composite first (results count as accesses: at most +0.03 each here)
            assert found(min_composite=0.37) == {new}, how
            assert found(min_importance=0.5, min_composite=0.37) == set(), how
            assert found(min_importance=0.1, min_composite=0.3) == {old, new}, how
            # the author's importance, whatever the age and the reads
            assert found(min_importance=0.5) == {old}, how
            assert found(min_importance=0.9) == {old}, how  # inclusive
            assert found(min_importance=0.2) == {old, new}, how
            assert found(min_importance=0.21) == {old}, how
    # the composite a search reports is the one min_composite filters on
    with srv.client(key=key) as c:
        res = c.call("memory.search", embedding=vec_bin(q), top_k=10, similarity_weight=0.5)["results"]
        at = now_ms()
        for r in res:
            want = composite(r["created_at"], r["access_count"], r["importance"], at)
            assert r["composite"] == pytest.approx(want, abs=1e-3)
            # (PostgreSQL hears of the accesses within about a second: wait for it)
            assert wait_for(lambda: r["id"] in {m["id"] for m in c.call(
                "memory.list", min_composite=round(r["composite"] - 0.005, 3))["memories"]})
        for bad in ({"min_importance": 1.5}, {"min_composite": -0.1}, {"min_composite": "high"}):
            assert c.call_err("memory.search", query="x", **bad)["code"] == "invalid_argument"


# ---- archived memories and the memory limit ----------------------------------------------------

def test_archived_memories_do_not_count_and_restore_rechecks(srv):
    tid, key = srv.create_tenant(tier="premium", embedding={"dim": DIM})
    dsn = srv.dsn_plain
    with srv.client(key=key) as c:
        ids = c.call("memory.store_batch", memories=[
            {"content": f"m{i}", "type": "fact", "importance": 0.5, "embedding": vec_bin(unit(100 + i))}
            for i in range(PREMIUM_LIMIT)])["ids"]
        err = c.call_err("memory.store", content="one more", type="fact", importance=0.5,
                         embedding=vec_bin(unit(99)))
        assert err["code"] == "quota_exceeded" and (err["limit"], err["usage"]) == (PREMIUM_LIMIT, PREMIUM_LIMIT)
        # archived by the user: kept, restorable, counted apart
        assert c.call("memory.archive", ids=ids[:3])["archived"] == ids[:3]
        u = c.call("tenant.usage")["memories"]
        assert counts(u) == {"stored": PREMIUM_LIMIT - 3, "archived": 3, "limit": PREMIUM_LIMIT}
        assert c.call("memory.stats")["total"] == PREMIUM_LIMIT  # still stored
        new = c.call("memory.store_batch", memories=[
            {"content": f"n{i}", "type": "fact", "importance": 0.5, "embedding": vec_bin(unit(200 + i))}
            for i in range(3)])["ids"]
        assert c.call_err("memory.store", content="full", type="fact", importance=0.5,
                          embedding=vec_bin(unit(98)))["code"] == "quota_exceeded"
        # a restore past the limit is refused whole: limit, usage, and how many it would restore
        err = c.call_err("memory.restore", ids=ids[:2])
        assert err["code"] == "quota_exceeded"
        assert (err["limit"], err["usage"], err["requested"]) == (PREMIUM_LIMIT, PREMIUM_LIMIT, 2)
        got = c.call("memory.get", ids=ids[:3])["memories"]
        assert all(m["archived_at"] is not None for m in got)
        # room for one: a restore of two is still refused, one goes
        c.call("memory.delete", ids=[new[0]])
        err = c.call_err("memory.restore", ids=ids[:2])
        assert (err["code"], err["usage"], err["requested"]) == ("quota_exceeded", PREMIUM_LIMIT - 1, 2)
        assert c.call("memory.restore", ids=[ids[0]])["restored"] == [ids[0]]
        assert counts(c.call("tenant.usage")["memories"]) == {"stored": PREMIUM_LIMIT, "archived": 2,
                                                      "limit": PREMIUM_LIMIT}
        # restoring what is live already asks for nothing
        assert c.call("memory.restore", ids=[ids[0]])["restored"] == []
        # deleting an archived memory frees no place (it held none)
        c.call("memory.delete", ids=[ids[1]])
        assert counts(c.call("tenant.usage")["memories"]) == {"stored": PREMIUM_LIMIT, "archived": 1,
                                                      "limit": PREMIUM_LIMIT}
        assert live_count_matches(dsn, tid)


def test_memories_archived_by_consolidation_do_not_count(srv):
    tid, key = srv.create_tenant(tier="premium", embedding={"dim": DIM})
    base = unit(7)
    with srv.client(key=key) as c:
        # one fact stored three times (merged into one) and nine distinct memories: the limit
        dup = [c.call("memory.store", content="fee tier A", type="fact", importance=0.5 + i / 10,
                      embedding=vec_bin(base + 0.01 * unit(50 + i)))["id"] for i in range(3)]
        for i in range(PREMIUM_LIMIT - 3):
            c.call("memory.store", content=f"distinct {i}", type="episode", importance=0.5,
                   embedding=vec_bin(unit(300 + i)))
        assert c.call_err("memory.store", content="x", type="fact", importance=0.5,
                          embedding=vec_bin(unit(1)))["code"] == "quota_exceeded"
        r = c.call("memory.consolidate")
        assert r["status"] == "completed" and r["merged"] == 2
        assert counts(c.call("tenant.usage")["memories"]) == {"stored": PREMIUM_LIMIT - 2, "archived": 2,
                                                      "limit": PREMIUM_LIMIT}
        assert live_count_matches(srv.dsn_plain, tid)
        # their places are free again
        for i in range(2):
            c.call("memory.store", content=f"room {i}", type="fact", importance=0.5,
                   embedding=vec_bin(unit(400 + i)))
        merged = [m["id"] for m in c.call("memory.get", ids=dup)["memories"] if m["archived_at"]]
        assert len(merged) == 2
        err = c.call_err("memory.restore", ids=merged[:1])
        assert err["code"] == "quota_exceeded" and err["requested"] == 1
        assert live_count_matches(srv.dsn_plain, tid)


def test_restore_and_store_race_for_the_limit_across_processes(pair):
    a, b = pair
    dsn = a.dsn_plain
    for rnd in range(3):
        tid, key = a.create_tenant(tier="premium", embedding={"dim": DIM})
        with a.client(key=key) as c:
            ids = c.call("memory.store_batch", memories=[
                {"content": f"r{i}", "type": "fact", "importance": 0.5,
                 "embedding": vec_bin(unit(500 + i))} for i in range(PREMIUM_LIMIT)])["ids"]
            c.call("memory.archive", ids=ids[:6])

        def one(i):
            with (a if i % 2 else b).client(key=key) as w:
                try:
                    if i < 6:
                        return "restored" if w.call("memory.restore", ids=[ids[i]])["restored"] else "none"
                    w.call("memory.store", content=f"race {rnd}.{i}", type="fact", importance=0.5,
                           embedding=vec_bin(unit(600 + i)))
                    return "stored"
                except RpcError as e:
                    return e.code

        with concurrent.futures.ThreadPoolExecutor(max_workers=32) as ex:
            out = list(ex.map(one, range(30)))
        assert set(out) <= {"restored", "stored", "quota_exceeded"}, out
        assert out.count("restored") + out.count("stored") == 6, out
        live = psql(dsn, f"SELECT count(*) FROM memories WHERE tenant_id = {tid} AND archived_at IS NULL")
        assert int(live) == PREMIUM_LIMIT
        assert live_count_matches(dsn, tid)


# ---- memory.list order_by composite ---------------------------------------------------------

def test_list_order_by_composite_is_live(srv):
    _, key = srv.create_tenant(tier="premium", embedding={"dim": DIM})
    t0 = now_ms()
    specs = [(0.9, 200), (0.1, 0), (0.5, 10), (0.7, 60), (0.3, 3)]  # (importance, age in days)
    with srv.client(key=key) as c:
        ids = c.call("memory.store_batch", memories=[
            {"content": f"c{i}", "type": "episode", "importance": imp, "created_at": t0 - age * DAY_MS,
             "embedding": vec_bin(unit(700 + i)), "pinned": True}
            for i, (imp, age) in enumerate(specs)])["ids"]
        comp = {i: composite(t0 - age * DAY_MS, 0, imp, t0) for i, (imp, age) in zip(ids, specs)}
        want = sorted(ids, key=lambda i: -comp[i])
        got = [m["id"] for m in c.call("memory.list", order_by="composite")["memories"]]
        assert got == want
        got = [m["id"] for m in c.call("memory.list", order_by="composite", order="asc")["memories"]]
        assert got == want[::-1]
        # pages of two continue the same ranking
        page = c.call("memory.list", order_by="composite", limit=2)
        rest = c.call("memory.list", order_by="composite", limit=10, cursor=page["next_cursor"])
        assert [m["id"] for m in page["memories"] + rest["memories"]] == want
        # a consolidation leaves nothing stored that the listing reads: the same order after it
        assert c.call("memory.consolidate")["rescored"] == len(ids)
        assert [m["id"] for m in c.call("memory.list", order_by="composite")["memories"]] == want
        # and accesses lift a memory at once, as they lift its search score
        last = want[-1]
        for _ in range(10):
            c.call("memory.search", embedding=vec_bin(unit(700 + ids.index(last))), top_k=1,
                   similarity_weight=1.0)
        assert comp[last] + 0.3 > max(comp.values())
        assert wait_for(lambda: c.call("memory.list", order_by="composite")["memories"][0]["id"] == last,
                        timeout=10)
        err = c.call_err("memory.list", order_by="usefulness")
        assert err["code"] == "invalid_argument" and "composite" in err["message"]


# ---- memory.delete by filter -----------------------------------------------------------------

def test_delete_one_agents_memory_in_one_call(pair):
    a, b = pair
    tid, key = a.create_tenant(tier="standard", embedding={"dim": DIM})
    rng = np.random.default_rng(5)
    vecs = rng.standard_normal((2600, DIM)).astype(np.float32)

    def batch(c, lo, hi, **kw):
        return c.call("memory.store_batch", memories=[
            {"content": f"memory {i}", "type": ["fact", "episode"][i % 2], "importance": 0.5,
             "embedding": vec_bin(vecs[i]), **kw} for i in range(lo, hi)])["ids"]

    with a.client(key=key) as c:
        # agent 3: 2100 memories (three batches of the delete), 4 of them archived, plus one
        # it wrote for the whole tenant; agent 4: 300; shared tenant memories: 100
        mine = batch(c, 0, 1000, agent_id=3) + batch(c, 1000, 2000, agent_id=3) + batch(c, 2000, 2100, agent_id=3)
        c.call("memory.archive", ids=mine[:4])
        authored = c.call("memory.store", content="agent 3 for everyone", type="fact", importance=0.5,
                          agent_id=3, scope="tenant", embedding=vec_bin(vecs[2599]))["id"]
        theirs = batch(c, 2100, 2400, agent_id=4)
        shared = batch(c, 2400, 2500)
        total = c.call("memory.stats")["total"]
        assert total == 2100 + 1 + 300 + 100
        # the dry run counts and deletes nothing
        dry = c.call("memory.delete", filter={"agent_id": 3}, dry_run=True)
        assert dry == {"count": 2101, "dry_run": True}
        assert c.call("memory.stats")["total"] == total
        # both processes find agent 3's memories before
        q = vec_bin(vecs[10])
        for srv in (a, b):
            with srv.client(key=key) as s:
                assert wait_for(lambda: s.call("memory.search", embedding=q, top_k=1, agent_id=3,
                                               similarity_weight=1.0)["results"][0]["id"] == mine[10])
        done = c.call("memory.delete", filter={"agent_id": 3})
        assert done == {"count": dry["count"], "dry_run": False}
        assert c.call("memory.get", ids=mine[:50] + [authored]) == {
            "memories": [], "missing": mine[:50] + [authored]}
        assert psql(a.dsn_plain, f"SELECT count(*) FROM memories WHERE tenant_id = {tid} AND agent_id = 3") == "0"
        # search no longer finds them, here and (through the change log) on the other process
        for srv in (a, b):
            with srv.client(key=key) as s:
                assert wait_for(lambda: not s.call("memory.search", embedding=q, top_k=10, agent_id=3,
                                                   scopes=["agent"], include_archived=True)["results"],
                                timeout=10), "agent 3's memories still found"
                res = s.call("memory.search", embedding=q, top_k=20, include_archived=True)["results"]
                assert not {r["id"] for r in res} & set(mine)
        # another agent's and the shared memories are untouched
        assert len(c.call("memory.get", ids=theirs)["memories"]) == 300
        assert len(c.call("memory.get", ids=shared)["memories"]) == 100
        hit = c.call("memory.search", embedding=vec_bin(vecs[2200]), top_k=1, agent_id=4,
                     similarity_weight=1.0)["results"]
        assert hit[0]["id"] == theirs[100]
        assert c.call("tenant.usage")["memories"]["stored"] == 400
        assert c.call("tenant.usage")["memories"]["archived"] == 0
        assert live_count_matches(a.dsn_plain, tid)
        # again: nothing left to delete
        assert c.call("memory.delete", filter={"agent_id": 3}) == {"count": 0, "dry_run": False}


def test_delete_by_type_metadata_time_and_scope(srv):
    _, key = srv.create_tenant(tier="standard", embedding={"dim": DIM})
    t0 = now_ms()
    with srv.client(key=key) as c:
        def store(i, **kw):
            return c.call("memory.store", content=f"d{i}", importance=0.5, embedding=vec_bin(unit(800 + i)),
                          **kw)["id"]

        ep_old = store(0, type="episode", agent_id=1, created_at=t0 - 10 * DAY_MS)
        ep_new = store(1, type="episode", agent_id=1)
        fact_eth = store(2, type="fact", agent_id=1, metadata={"tokens": ["ETH"]})
        fact_btc = store(3, type="fact", agent_id=2, metadata={"tokens": ["BTC"]}, clade_id=9, scope="clade")
        shared = store(4, type="fact", metadata={"tokens": ["ETH"], "attrs": {"desk": "rates"}})
        left = {ep_old, ep_new, fact_eth, fact_btc, shared}

        def gone(flt, want, **kw):
            dry = c.call("memory.delete", filter=flt, dry_run=True, **kw)["count"]
            assert dry == len(want), flt
            assert c.call("memory.delete", filter=flt, **kw)["count"] == dry
            left.difference_update(want)
            got = {m["id"] for m in c.call("memory.get", ids=sorted(want | left))["memories"]}
            assert got == left, flt

        gone({"type_filter": ["episode"], "created_before": t0 - DAY_MS}, {ep_old})
        gone({"attrs": {"desk": "rates"}}, {shared})
        gone({"clade_id": 9}, {fact_btc})
        gone({"agent_id": 1, "tokens": ["ETH"], "scopes": ["agent"]}, {fact_eth})
        # include_archived false keeps archived ones
        c.call("memory.archive", ids=[ep_new])
        gone({"agent_id": 1, "include_archived": False}, set())
        gone({"agent_id": 1}, {ep_new})
        assert left == set()


def test_delete_refuses_empty_filters_and_mixed_forms(srv):
    _, key = srv.create_tenant(tier="standard", embedding={"dim": DIM})
    with srv.client(key=key) as c:
        ids = c.call("memory.store_batch", memories=[
            {"content": f"e{i}", "type": "fact", "importance": 0.5, "embedding": vec_bin(unit(900 + i))}
            for i in range(5)])["ids"]
        c.call("memory.archive", ids=ids[:1])
        for params, what in [
                ({"filter": {}}, "all"),
                ({"filter": {}, "dry_run": True}, "all"),
                ({"filter": {"include_archived": False}}, "all"),
                ({"filter": {"agent_id": 1}, "all": True}, "empty"),
                ({}, "'ids' or 'filter'"),
                ({"ids": ids, "filter": {"agent_id": 1}}, "not both"),
                ({"ids": ids, "dry_run": True}, "'filter'"),
                ({"ids": ids, "all": True}, "'filter'"),
                ({"filter": {"colour": "red"}}, "colour"),
                ({"filter": {"type_filter": ["rumour"]}}, "filter.type_filter"),
                ({"filter": {"agent_id": "three"}}, "agent_id"),
                ({"filter": [1]}, "filter")]:
            err = c.call_err("memory.delete", **params)
            assert err["code"] == "invalid_argument", params
            assert what in err["message"], (params, err["message"])
        assert c.call("memory.stats")["total"] == 5
        # all: true with an empty filter is the explicit "everything"
        assert c.call("memory.delete", filter={}, all=True, dry_run=True) == {"count": 5, "dry_run": True}
        assert c.call("memory.delete", filter={}, all=True) == {"count": 5, "dry_run": False}
        assert c.call("memory.stats")["total"] == 0
        assert counts(c.call("tenant.usage")["memories"]) == {"stored": 0, "archived": 0, "limit": 5000}
