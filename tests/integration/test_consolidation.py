"""Consolidation: hand-built data sets whose merges, supersessions and prunes are known in
advance; tiers and on-demand runs; determinism; racing writers; two processes."""
import concurrent.futures
import threading
import time

import numpy as np
import pytest

from harness import Server, new_database, psql, vec_bin, wait_for
from memmodel import DAY_MS, now_ms

DIM = 16


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def basis(seed, n):
    """n mutually far-apart unit vectors."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((DIM, DIM)))
    return [q[:, i] for i in range(n)]


def near(v, sim, seed):
    """A unit vector at exactly cosine `sim` from v."""
    r = np.random.default_rng(seed).standard_normal(DIM)
    r -= (r @ v) * v
    r /= np.linalg.norm(r)
    return unit(sim * v + np.sqrt(1 - sim * sim) * r)


def dataset(c, t0):
    """Stores the hand-built set; returns {label: id}."""
    b = basis(7, 12)
    specs = {
        # one fact said three times (case, punctuation and spacing aside): one cluster, the
        # survivor is the most important; their tokens share ETH, so their metadata agree
        "dup1": dict(content="Fee tier A pays 0.05%.", type="fact", importance=0.3, emb=near(b[0], 0.99, 1),
                     access_count=2, metadata={"tokens": ["ETH"], "attrs": {"pool": "a"}}),
        "dup2": dict(content="fee tier A pays 0.05%", type="fact", importance=0.8, emb=near(b[0], 0.99, 2),
                     access_count=3, metadata={"tokens": ["USDC", "ETH"], "chains": [1]}),
        "dup3": dict(content="Fee tier A  pays 0.05 % !", type="fact", importance=0.5, emb=near(b[0], 0.99, 3),
                     metadata={"tokens": ["ETH"], "protocols": ["uniswap"]}),
        # the same text, but another type, or another agent's private memory: never merged
        "other_type": dict(content="Fee tier A pays 0.05%.", type="episode", importance=0.9, emb=near(b[0], 0.99, 4)),
        "other_agent": dict(content="Fee tier A pays 0.05%.", type="fact", importance=0.9, emb=near(b[0], 0.99, 5),
                            agent_id=9),
        # a newer fact whose text differs in a quantity only updates the older (issue 32: the
        # text is the evidence; the cosine, 0.9 here, is not)
        "old_apy": dict(content="The vault APY is 2.3%", type="fact", importance=0.5, emb=b[1],
                        created_at=t0 - 5 * DAY_MS),
        "new_apy": dict(content="The vault APY is 2.5%", type="fact", importance=0.5, emb=near(b[1], 0.9, 6),
                        created_at=t0 - DAY_MS),
        # as similar, but about another vault: a distinct fact, never superseded (before issue
        # 32 a cosine of 0.85 was enough)
        "usdc_vault": dict(content="The USDC vault APY is 2.3%", type="fact", importance=0.5, emb=b[10],
                           created_at=t0 - 5 * DAY_MS),
        "dai_vault": dict(content="The DAI vault APY is 2.3%", type="fact", importance=0.5, emb=near(b[10], 0.9, 10),
                          created_at=t0 - DAY_MS),
        # not similar, but the same attrs.key: the newer preference supersedes
        "old_pref": dict(content="prefer 0.05% tier", type="preference", importance=0.6, emb=b[2],
                         created_at=t0 - 9 * DAY_MS, metadata={"attrs": {"key": "fee-tier"}}),
        "new_pref": dict(content="prefer 0.30% tier", type="preference", importance=0.6, emb=b[3],
                         created_at=t0 - 2 * DAY_MS, metadata={"attrs": {"key": "fee-tier"}}),
        # similar episodes are never superseded (only facts and preferences update)
        "ep_old": dict(content="crash one", type="episode", importance=0.6, emb=b[4], created_at=t0 - 3 * DAY_MS),
        "ep_new": dict(content="crash two", type="episode", importance=0.6, emb=near(b[4], 0.9, 7),
                       created_at=t0 - DAY_MS),
        # old and unimportant: pruned; the same as a constraint or pinned: kept
        "trivia": dict(content="old trivia", type="episode", importance=0.05, emb=b[5], created_at=t0 - 200 * DAY_MS),
        "old_rule": dict(content="old rule", type="constraint", importance=0.05, emb=b[6], created_at=t0 - 200 * DAY_MS),
        "pinned": dict(content="old pinned", type="episode", importance=0.05, emb=b[7], created_at=t0 - 200 * DAY_MS,
                       pinned=True),
        # unimportant but young: within the grace period
        "young": dict(content="young trivia", type="episode", importance=0.0, emb=b[8], created_at=t0 - 2 * DAY_MS),
        # important old: composite above the threshold
        "classic": dict(content="classic insight", type="fact", importance=0.9, emb=b[9], created_at=t0 - 300 * DAY_MS),
    }
    ids = {}
    for label, s in specs.items():
        s = dict(s)
        ids[label] = c.call("memory.store", embedding=vec_bin(s.pop("emb")), **s)["id"]
    return ids


@pytest.fixture(scope="module")
def srv():
    dsn = new_database("cons")
    # scheduled runs for the standard tier only, so they never race the on-demand runs of the
    # premium tenants the other tests use
    s = Server(dsn, extra=["--consolidate-check-interval-s", "1", "--premium-consolidation-hours", "0",
                           "--standard-consolidation-hours", "1", "--free-consolidation-hours", "0"]).start()
    s.dsn_plain = dsn
    yield s
    try:
        s.stop()
    finally:
        s.cleanup()


def test_known_merges_supersessions_and_prunes(srv):
    tid, key = srv.create_tenant(tier="premium", embedding={"dim": DIM})
    t0 = now_ms()
    with srv.client(key=key) as c:
        ids = dataset(c, t0)
        r = c.call("memory.consolidate")
        assert r["status"] == "completed"
        assert (r["merged"], r["superseded"], r["archived"], r["skipped"]) == (2, 2, 1, 0)
        live = len(ids) - 5
        # re-rank: what merges and supersessions left live is ranked (the prune among them)
        assert r["rescored"] == live + r["archived"]
        got = {m["id"]: m for m in c.call("memory.get", ids=list(ids.values()))["memories"]}
        m = {label: got[i] for label, i in ids.items()}
        # the cluster: dup2 survives with the highest importance, summed access counts and
        # the union of the metadata; the others point at it
        assert m["dup2"]["archived_at"] is None
        assert m["dup2"]["importance"] == pytest.approx(0.8) and m["dup2"]["access_count"] == 5
        assert m["dup2"]["metadata"] == {"tokens": ["USDC", "ETH"], "chains": [1], "protocols": ["uniswap"],
                                         "attrs": {"pool": "a"}}
        for d in ("dup1", "dup3"):
            assert m[d]["archived_reason"] == "merged" and m[d]["merged_into"] == ids["dup2"]
        assert m["other_type"]["archived_at"] is None and m["other_agent"]["archived_at"] is None
        assert m["old_apy"]["archived_reason"] == "superseded" and m["old_apy"]["superseded_by"] == ids["new_apy"]
        assert m["old_pref"]["superseded_by"] == ids["new_pref"]
        assert m["new_apy"]["archived_at"] is None and m["new_pref"]["archived_at"] is None
        assert m["usdc_vault"]["archived_at"] is None and m["dai_vault"]["archived_at"] is None
        assert m["ep_old"]["archived_at"] is None and m["ep_new"]["archived_at"] is None
        assert m["trivia"]["archived_reason"] == "pruned"
        for keep in ("old_rule", "pinned", "young", "classic"):
            assert m[keep]["archived_at"] is None, keep
        # memory.history records the merge and the supersessions, each with its rule and reason
        h = c.call("memory.history", id=ids["dup2"])["versions"]
        assert h[0]["replaced_by"] == "merge" and sorted(h[0]["detail"]["merged"]) == sorted([ids["dup1"], ids["dup3"]])
        assert h[0]["detail"]["rule"] == "same_text"
        h = c.call("memory.history", id=ids["old_apy"])["versions"]
        assert h[0]["replaced_by"] == "supersede" and h[0]["detail"] == {
            "superseded_by": ids["new_apy"], "rule": "values", "why": "the same text but for values: 2.3% -> 2.5%"}
        assert c.call("memory.history", id=ids["old_pref"])["versions"][0]["detail"] == {
            "superseded_by": ids["new_pref"], "rule": "attrs_key", "why": "same attrs.key 'fee-tier'"}
        d = c.call("memory.history", id=ids["dup1"])["versions"][0]["detail"]
        assert (d["reason"], d["into"], d["rule"]) == ("merged", ids["dup2"], "same_text")
        assert d["why"].startswith("the same text once case, punctuation") and "cosine 0.9" in d["why"]
        # the index follows: archived memories are gone from searches (once the change log
        # has been applied), back with include_archived
        q = vec_bin(near(basis(7, 12)[0], 0.99, 9))
        assert wait_for(lambda: (found := {x["id"] for x in c.call("memory.search", embedding=q, top_k=10)["results"]})
                        and not found & {ids["dup1"], ids["dup3"]}, timeout=10), \
            "the index still returns merged memories"
        res = c.call("memory.search", embedding=q, top_k=10, include_archived=True)["results"]
        assert {ids["dup1"], ids["dup3"]} <= {x["id"] for x in res}
        # the composite is not stored (every read computes it live): no column for it
        assert psql(srv.dsn_plain, "SELECT count(*) FROM information_schema.columns WHERE "
                                   "table_name = 'memories' AND column_name LIKE 'composite%'") == "0"
        # the archived ones no longer count against the tier's limit
        u = c.call("tenant.usage")["memories"]
        assert (u["stored"], u["archived"]) == (live, 5)
        # the run is listed
        runs = c.call("memory.consolidation.runs")["runs"]
        assert runs[0]["run_id"] == r["run_id"] and runs[0]["trigger"] == "on_demand"
        assert (runs[0]["merged"], runs[0]["superseded"], runs[0]["archived"]) == (2, 2, 1)
        # with what it planned by rule, and the similar pairs it left alone: the two vaults
        # (cosine 0.9, at least consolidate_supersede_threshold)
        rules = runs[0]["settings"]["rules"]
        assert rules == {"model": None, "merged_same_text": 2, "superseded_attrs_key": 1,
                         "superseded_values": 1, "near_pairs_kept": 0, "similar_pairs_kept": 1}
        # a second run finds nothing more to do
        r2 = c.call("memory.consolidate")
        assert (r2["merged"], r2["superseded"], r2["archived"]) == (0, 0, 0)
        # restore after prune
        assert c.call("memory.restore", ids=[ids["trivia"]])["restored"] == [ids["trivia"]]
        assert c.call("memory.get", ids=[ids["trivia"]])["memories"][0]["archived_at"] is None
        hits = c.call("memory.search", embedding=vec_bin(basis(7, 12)[5]), top_k=1, similarity_weight=1.0)["results"]
        assert hits[0]["id"] == ids["trivia"]


def test_text_rules_need_agreeing_metadata(srv):
    """The same text, or a change of values only, archives nothing when the metadata say the
    memories are about different things (issue 32): tokens, chains or protocols that share
    nothing, attrs or strategy_id that differ. And neither rule needs a cosine."""
    _, key = srv.create_tenant(tier="premium", embedding={"dim": DIM})
    b = basis(11, 8)
    t0 = now_ms()
    specs = {
        # the same text about USDC, DAI, and USDC and ETH
        "usdc": dict(content="The vault APY is 2.3%", emb=b[0], metadata={"tokens": ["USDC"]}),
        "dai": dict(content="The vault APY is 2.3%", emb=near(b[0], 0.99, 1), metadata={"tokens": ["DAI"]}),
        "usdc_eth": dict(content="the vault APY is 2.30 %", emb=near(b[0], 0.99, 2),
                         metadata={"tokens": ["USDC", "ETH"]}),
        # newer gas prices, at cosine 0 from each other: chain 10's is not chain 1's update
        "gas1": dict(content="Gas is 20 gwei", emb=b[1], metadata={"chains": [1]}, created_at=t0 - 3 * DAY_MS),
        "gas10": dict(content="Gas is 25 gwei", emb=b[2], metadata={"chains": [10]}, created_at=t0 - 2 * DAY_MS),
        "gas1_new": dict(content="Gas is 30 gwei", emb=b[3], metadata={"chains": [1]}, created_at=t0 - DAY_MS),
        # the same text of two pools
        "pool_a": dict(content="Fee tier is 0.05%", emb=b[4], metadata={"attrs": {"pool": "a"}}),
        "pool_b": dict(content="Fee tier is 0.05%", emb=b[4], metadata={"attrs": {"pool": "b"}}),
        # ETH+BTC, nothing, SOL: the one without tokens agrees with either, but the cluster it
        # joins (ETH, BTC) does not take SOL
        "eth_btc": dict(content="Limit is 5 ETH", emb=b[5], metadata={"tokens": ["ETH", "BTC"]}),
        "none": dict(content="Limit is 5 ETH", emb=b[5]),
        "sol": dict(content="Limit is 5 ETH", emb=b[5], metadata={"tokens": ["SOL"]}),
    }
    with srv.client(key=key) as c:
        ids = {}
        for label, sp in specs.items():
            sp = dict(sp)
            ids[label] = c.call("memory.store", type="fact", importance=0.5, embedding=vec_bin(sp.pop("emb")),
                                **sp)["id"]
        r = c.call("memory.consolidate")
        got = {m["id"]: m for m in c.call("memory.get", ids=list(ids.values()))["memories"]}
        m = {label: got[i] for label, i in ids.items()}
        assert {m["usdc"]["merged_into"], m["usdc_eth"]["merged_into"]} == {None, ids["usdc"]} or \
            {m["usdc"]["merged_into"], m["usdc_eth"]["merged_into"]} == {None, ids["usdc_eth"]}
        assert m["dai"]["archived_at"] is None
        assert m["gas1"]["superseded_by"] == ids["gas1_new"]
        assert m["gas10"]["archived_at"] is None and m["gas1_new"]["archived_at"] is None
        assert m["pool_a"]["archived_at"] is None and m["pool_b"]["archived_at"] is None
        assert m["none"]["merged_into"] == ids["eth_btc"] or m["eth_btc"]["merged_into"] == ids["none"]
        assert m["sol"]["archived_at"] is None
        assert (r["merged"], r["superseded"]) == (2, 1)
        d = c.call("memory.history", id=ids["gas1"])["versions"][0]["detail"]
        assert d == {"superseded_by": ids["gas1_new"], "rule": "values",
                     "why": "the same text but for values: 20 gwei -> 30 gwei"}


def test_runs_are_deterministic(srv):
    t0 = now_ms() - 1000
    outcomes = []
    for _ in range(2):
        _, key = srv.create_tenant(tier="premium", embedding={"dim": DIM})
        with srv.client(key=key) as c:
            ids = dataset(c, t0)
            c.call("memory.consolidate")
            got = {m["id"]: m for m in c.call("memory.get", ids=list(ids.values()))["memories"]}
            inv = {v: k for k, v in ids.items()}
            outcomes.append({label: (got[i]["archived_reason"], inv.get(got[i]["merged_into"]),
                                     inv.get(got[i]["superseded_by"]), got[i]["importance"],
                                     got[i]["access_count"], got[i]["metadata"])
                             for label, i in ids.items()})
    assert outcomes[0] == outcomes[1]


def test_on_demand_is_premium_only(srv):
    for tier in ("free", "standard"):
        _, key = srv.create_tenant(tier=tier)
        with srv.client(key=key) as c:
            err = c.call_err("memory.consolidate")
            assert err["code"] == "permission_denied" and "premium" in err["message"] and tier in err["message"]


def test_scheduled_by_tier(srv):
    std_id, std = srv.create_tenant(tier="standard", embedding={"dim": DIM})
    free_id, free = srv.create_tenant(tier="free", embedding={"dim": DIM})
    b = basis(3, 2)
    for key in (std, free):
        with srv.client(key=key) as c:
            c.call("memory.store", content="a", type="fact", importance=0.5, embedding=vec_bin(near(b[0], 0.99, 1)))
            c.call("memory.store", content="A.", type="fact", importance=0.6, embedding=vec_bin(near(b[0], 0.99, 2)))
    with srv.client(key=std) as c:
        # wall clock: the scheduler checks every second and a tenant is first due one cadence
        # after its creation, so two checks pass without a run
        time.sleep(2.5)
        assert c.call("memory.consolidation.runs")["runs"] == []
        psql(srv.dsn_plain, f"UPDATE tenants SET created_at = now() - interval '2 hours' "
                            f"WHERE id IN ({std_id}, {free_id})")
        assert wait_for(lambda: c.call("memory.consolidation.runs")["runs"], timeout=20, interval=0.2), \
            "the standard tenant was never consolidated on schedule"
        run = c.call("memory.consolidation.runs")["runs"][0]
        assert run["trigger"] == "schedule" and run["merged"] == 1
        # wall clock: two more checks pass; the cadence is 1 hour, so no second scheduled run
        time.sleep(2.5)
        assert len(c.call("memory.consolidation.runs")["runs"]) == 1
    with srv.client(key=free) as c:
        assert c.call("memory.consolidation.runs")["runs"] == []  # cadence 0: never


def test_run_racing_with_stores_loses_nothing(srv):
    _, key = srv.create_tenant(tier="premium", embedding={"dim": 64})
    rng = np.random.default_rng(5)
    centers = rng.standard_normal((300, 64))
    with srv.client(key=key) as c:
        items = []
        for i in range(6000):
            v = unit(centers[i % 300] + 0.05 * rng.standard_normal(64))  # clusters of 20 duplicates
            items.append({"content": f"seed cluster {i % 300}", "type": "fact", "importance": 0.5,
                          "embedding": vec_bin(v)})
        for k in range(0, len(items), 1000):
            c.call("memory.store_batch", memories=items[k:k + 1000])
    stored = []
    stop, started = threading.Event(), threading.Event()

    def writer():
        # duplicates of the seed clusters (the same text, near vectors): what the run merges,
        # but stored after its plan was made, so it must leave them alone
        with srv.client(key=key) as w:
            i = 0
            while not stop.is_set() or i < 50:
                v = unit(centers[i % 300] + 0.05 * rng.standard_normal(64))
                stored.append(w.call("memory.store", content=f"seed cluster {i % 300}", type="fact",
                                     importance=0.5, embedding=vec_bin(v))["id"])
                started.set()
                i += 1

    th = threading.Thread(target=writer)
    th.start()
    try:
        assert started.wait(30)
        before = len(stored)
        # a run over 6,000 memories takes seconds, and minutes under ThreadSanitizer (build-tsan)
        with srv.client(key=key, timeout=600) as c:
            r = c.call("memory.consolidate")
        during = len(stored) - before
    finally:
        stop.set()
        th.join()
    assert r["merged"] > 0
    assert during > 0, "no store overlapped the run"
    with srv.client(key=key) as c:
        got = c.call("memory.get", ids=stored[:1000])["memories"]
        assert len(got) == len(stored[:1000]) and all(m["archived_at"] is None for m in got)
        assert c.call("memory.stats")["total"] == 6000 + len(stored)


def test_two_processes_never_consolidate_one_tenant_at_once():
    dsn = new_database("cons2")
    a = Server(dsn).start()
    b = Server(dsn, extra=["--secret-file", a.data_dir + "/secret.key", "--admin-key-file", a.admin_key_file])
    b.admin_key_file = a.admin_key_file
    b.start()
    try:
        tid, key = a.create_tenant(tier="premium", embedding={"dim": 64})
        rng = np.random.default_rng(8)
        with a.client(key=key) as c:
            for k in range(10):
                c.call("memory.store_batch", memories=[
                    {"content": f"m{k}-{i}", "type": "fact", "importance": 0.5,
                     "embedding": vec_bin(unit(rng.standard_normal(64)))} for i in range(1000)])

        def run(srv):
            with srv.client(key=key) as c:
                e, res = c.wait(c.send("memory.consolidate", {}))
                return e["code"] if e else "completed"

        with concurrent.futures.ThreadPoolExecutor(max_workers=6) as ex:
            outcomes = list(ex.map(run, [a, b, a, b, a, b]))
        assert set(outcomes) <= {"completed", "conflict"} and "completed" in outcomes
        rows = psql(dsn, f"SELECT engram_ms(started_at), engram_ms(finished_at) FROM consolidation_runs "
                         f"WHERE tenant_id = {tid} ORDER BY started_at").splitlines()
        spans = [tuple(map(int, r.split("|"))) for r in rows]
        assert len(spans) == outcomes.count("completed")
        for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
            assert s2 >= e1, f"two runs overlapped: {spans}"
        a.stop()
        b.stop()
    finally:
        a.cleanup()
        b.cleanup()
