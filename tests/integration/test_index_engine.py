"""The engine of the approximate index tier, chosen per tenant (index_engine: native or faiss).

Two tenants, one per engine, each large enough for the approximate tier (index_ann_min is
lowered to 512, and the candidate budget to 64 so that the approximate search really runs):
both answer filtered top-K exactly and unfiltered top-K with high recall, forget deleted
memories, report their engine in admin.tenant.get/list and memory.stats, come back from
their own snapshots after a restart and after an eviction, and change engine through
admin.tenant.update (on this server at once, on another one sharing the database by
notification), rebuilding rather than reusing the other engine's snapshot. Whatever the
engine does inside the index, these results must hold.
"""
import os
import re
import subprocess

import numpy as np
import pytest

from harness import (BIN, RpcError, Server, new_database, require_env, structured_vectors, vec_bin,
                     wait_for, wait_log, wait_metric)
from harness import metric as harness_metric

DIM = 128
N = 1200
GROUPS = 60  # memories carry the token g<i % GROUPS>: a filter on one keeps N / GROUPS
ANN = ["--index-ann-min", "512", "--index-ann-max-candidates", "64"]


def metric(srv, name, labels=None):
    return harness_metric(srv, name, labels, default=0.0)


class Data:
    """A tenant's memories as the test knows them: id -> (vector, group)."""

    def __init__(self, key, seed):
        self.key = key
        self.vecs = structured_vectors(N, DIM, seed=seed)
        self.ids = []
        self.live = {}

    def store(self, c):
        mems = [{"content": f"m{i}", "type": "fact", "importance": 0.5,
                 "embedding": vec_bin(v), "metadata": {"tokens": [f"g{i % GROUPS}"]}}
                for i, v in enumerate(self.vecs)]
        for k in range(0, N, 300):
            self.ids += c.call("memory.store_batch", memories=mems[k:k + 300])["ids"]
        self.live = {mid: (self.vecs[i], i % GROUPS) for i, mid in enumerate(self.ids)}

    def delete(self, c, ids):
        assert sorted(c.call("memory.delete", ids=ids)["deleted"]) == sorted(ids)
        for mid in ids:
            del self.live[mid]

    def best(self, q, k, group=None):
        """The exact top k (id, similarity) among the live memories (of one group)."""
        qn = np.asarray(q, np.float64) / np.linalg.norm(q)
        cand = [(float(np.asarray(v, np.float64) @ qn), mid) for mid, (v, g) in self.live.items()
                if group is None or g == group]
        cand.sort(key=lambda x: (-x[0], x[1]))
        return [(mid, s) for s, mid in cand[:k]]


def check_search(c, d, seed, queries=12):
    """Filtered searches (a filter keeping fewer memories than the candidate budget) are
    exact; unfiltered ones return live memories with their similarities (the codes'
    estimates), best first,
    and find most true neighbours (a floor that a broken candidate stage would miss: the
    approximate tier's recall is the subject of bench/, not of this test, and the budget here
    is tiny); deleted memories never come back."""
    qs = structured_vectors(queries, DIM, seed=seed)
    hits = total = 0
    for i, q in enumerate(qs):
        group = (i * 7) % GROUPS
        want = d.best(q, 10, group)
        got = c.call("memory.search", embedding=vec_bin(q), top_k=10, similarity_weight=1.0,
                     tokens=[f"g{group}"])["results"]
        assert len(got) == len(want)
        # the same memories with the same similarities (ties in order aside)
        assert sorted(g["id"] for g in got) == sorted(m for m, _ in want)
        assert [g["similarity"] for g in got] == pytest.approx([s for _, s in want], abs=2e-5)
        want = d.best(q, 10)
        got = c.call("memory.search", embedding=vec_bin(q), top_k=10,
                     similarity_weight=1.0)["results"]
        assert len(got) == 10 and all(g["id"] in d.live for g in got)
        qn = np.asarray(q, np.float64) / np.linalg.norm(q)
        for g in got:
            # ranked from the int8 codes: a hit that was no near-tie reports the codes'
            # estimate of its similarity (within about 0.001 here; 0.01 bounds it)
            v = np.asarray(d.live[g["id"]][0], np.float64)
            assert g["similarity"] == pytest.approx(float(v @ qn), abs=0.01)
        sims = [g["similarity"] for g in got]
        assert sims == sorted(sims, reverse=True)
        hits += len({g["id"] for g in got} & {m for m, _ in want})
        total += 10
    assert hits / total >= 0.6, hits / total


INDEX_FIELDS = ("engine", "loaded", "kind", "vectors")


def index_stats(srv, key):
    """memory.stats' index: the fields this test checks (the recall monitor's are in
    test_recall_monitor.py)."""
    with srv.client(key=key) as c:
        idx = c.call("memory.stats")["index"]
    assert set(idx) == set(INDEX_FIELDS) | {"recall_estimate", "candidate_depth",
                                           "exact_fallback", "recall_samples", "engine_in_use",
                                           "blended_depth", "row_cache_warm", "rows_warmed",
                                           "recall_query_samples"}
    return {f: idx[f] for f in INDEX_FIELDS}


def admin(srv, method, **kw):
    with srv.admin() as a:
        return a.call(method, **kw)


def admin_err(srv, method, **kw):
    with srv.admin() as a:
        with pytest.raises(RpcError) as e:
            a.call(method, **kw)
        return e.value


def make_tenant(srv, engine, seed):
    kw = {"index_engine": engine} if engine else {}
    r = admin(srv, "admin.tenant.create", name=f"eng-{engine or 'default'}-{seed}", tier="premium",
              embedding={"dim": DIM}, **kw)
    d = Data(r["api_key"], seed)
    d.tid = r["tenant_id"]
    with srv.client(key=d.key) as c:
        d.store(c)
    return d


@pytest.fixture(scope="module")
def env():
    dsn = new_database("engine")
    srv = Server(dsn, extra=ANN + ["--index-snapshot-interval-s", "1"]).start()
    faiss = make_tenant(srv, "faiss", 11)
    native = make_tenant(srv, "native", 12)
    yield dsn, srv, faiss, native
    try:
        srv.stop()
    finally:
        srv.cleanup()


def test_admin_reports_and_validates_the_engine(env):
    _, srv, faiss, native = env
    got = admin(srv, "admin.tenant.get", tenant_id=faiss.tid)
    assert got["index_engine"] == "faiss" and got["index_engine_default"] is False
    got = admin(srv, "admin.tenant.get", tenant_id=native.tid)
    assert got["index_engine"] == "native" and got["index_engine_default"] is False
    plain = admin(srv, "admin.tenant.create", name="eng-plain", tier="free")
    got = admin(srv, "admin.tenant.get", name="eng-plain")
    assert got["index_engine"] == "native" and got["index_engine_default"] is True
    listed = {t["tenant_id"]: t for t in admin(srv, "admin.tenant.list")["tenants"]}
    assert listed[faiss.tid]["index_engine"] == "faiss"
    assert listed[plain["tenant_id"]]["index_engine_default"] is True
    assert [t["tenant_id"] for t in admin(srv, "admin.tenant.list")["tenants"]] == sorted(listed)
    for bad in ("hnsw", "", "FAISS", "default"):
        e = admin_err(srv, "admin.tenant.create", name="eng-bad", tier="free", index_engine=bad)
        assert e.code == "invalid_argument" and "index_engine" in e.message
    e = admin_err(srv, "admin.tenant.create", name="eng-bad", tier="free", index_engine=1)
    assert e.code == "invalid_argument"
    e = admin_err(srv, "admin.tenant.update", name="eng-plain", index_engine="annoy")
    assert e.code == "invalid_argument" and "index_engine" in e.message
    assert admin_err(srv, "admin.tenant.get", name="eng-bad").code == "not_found"
    # update with the engine alone; "default" clears the choice again
    up = admin(srv, "admin.tenant.update", name="eng-plain", index_engine="faiss")
    assert up["index_engine"] == "faiss" and up["index_engine_default"] is False
    up = admin(srv, "admin.tenant.update", name="eng-plain", index_engine="default")
    assert up["index_engine"] == "native" and up["index_engine_default"] is True
    assert up["tier"] == "free" and up["name"] == "eng-plain"
    admin(srv, "admin.tenant.delete", name="eng-plain")


def engine_in_use(srv, key):
    with srv.client(key=key) as c:
        return c.call("memory.stats")["index"]["engine_in_use"]


def test_both_engines_search_exactly_and_forget_deletes(env):
    _, srv, faiss, native = env
    for d in (faiss, native):  # load both
        with srv.client(key=d.key) as c:
            c.call("memory.search", embedding=vec_bin(d.vecs[0]), top_k=1)
    # the FAISS index is built in the background; the native tenant never has one
    assert wait_for(lambda: engine_in_use(srv, faiss.key) == "faiss", timeout=30)
    assert engine_in_use(srv, native.key) == "native"
    for d, seed in ((faiss, 21), (native, 22)):
        with srv.client(key=d.key) as c:
            check_search(c, d, seed)
            st = c.call("memory.stats")
            assert st["total"] == N
            d.delete(c, d.ids[:150])
            check_search(c, d, seed + 100)
            # a deleted memory is never found, even by its own vector
            for mid in d.ids[:150:30]:
                v = d.vecs[d.ids.index(mid)]
                got = c.call("memory.search", embedding=vec_bin(v), top_k=5,
                             similarity_weight=1.0)["results"]
                assert got and mid not in {g["id"] for g in got}
    assert index_stats(srv, faiss.key) == {"engine": "faiss", "loaded": True, "kind": "ann",
                                           "vectors": N - 150}
    assert index_stats(srv, native.key) == {"engine": "native", "loaded": True, "kind": "ann",
                                            "vectors": N - 150}


def test_faiss_recall_monitor_measures_the_tenants_own_queries(env):
    """The recall monitor of a faiss index takes its probes from copies of the tenant's
    recent queries (every fourth search's) before it makes synthetic ones; a native index's
    monitor never does."""
    _, srv, faiss, native = env

    def query_samples(d):
        with srv.client(key=d.key) as c:
            return c.call("memory.stats")["index"]["recall_query_samples"]

    assert engine_in_use(srv, faiss.key) == "faiss"
    for d, seed in ((faiss, 61), (native, 62)):
        with srv.client(key=d.key) as c:
            for q in structured_vectors(200, DIM, seed=seed):
                got = c.call("memory.search", embedding=vec_bin(q), top_k=10,
                             similarity_weight=1.0)["results"]
                assert len(got) == 10
    assert wait_for(lambda: query_samples(faiss) > 0, timeout=60)
    with srv.client(key=native.key) as c:
        idx = c.call("memory.stats")["index"]
    assert idx["recall_samples"] > 0 and idx["recall_query_samples"] == 0


def test_restart_loads_each_engine_from_its_own_snapshot(env):
    _, srv, faiss, native = env
    srv.restart()  # the snapshots are written at shutdown, and preloaded at start
    for d, seed in ((faiss, 31), (native, 32)):
        with srv.client(key=d.key) as c:
            check_search(c, d, seed)
    # the FAISS index came back with the snapshot
    assert engine_in_use(srv, faiss.key) == "faiss"
    assert index_stats(srv, faiss.key)["engine"] == "faiss"
    assert index_stats(srv, native.key)["engine"] == "native"
    assert metric(srv, "engram_index_loads_total", 'source="snapshot"') == 2
    assert metric(srv, "engram_index_loads_total", 'source="database"') == 0
    assert metric(srv, "engram_index_snapshots_rejected_total") == 0
    log = srv.log_text()
    assert re.search(rf"tenant {faiss.tid}: index loaded from its snapshot, {N - 150} memories, "
                     r"\d+ changes replayed, change \d+, faiss engine", log), log[-3000:]
    assert re.search(rf"tenant {native.tid}: index loaded from its snapshot, {N - 150} memories, "
                     r"\d+ changes replayed, change \d+, native engine", log), log[-3000:]


def test_switching_engine_rebuilds_with_the_new_one(env):
    dsn, srv, faiss, native = env
    # a second server on the same database holds the faiss tenant's index too
    other = Server(dsn, extra=ANN + ["--secret-file", srv.data_dir + "/secret.key"])
    try:
        other.start()
        with other.client(key=faiss.key) as c:
            check_search(c, faiss, 41)
        assert index_stats(other, faiss.key)["engine"] == "faiss"
        db_loads = metric(srv, "engram_index_loads_total", 'source="database"')
        up = admin(srv, "admin.tenant.update", tenant_id=faiss.tid, index_engine="native")
        assert up["index_engine"] == "native"
        # here the loaded index is dropped at once, or by the housekeeping within a second
        # when it held the index at that moment
        assert wait_for(lambda: index_stats(srv, faiss.key)["loaded"] is False, timeout=30)
        assert index_stats(srv, faiss.key)["engine"] == "native"
        # the index leaves the map, then the line is written
        wait_log(srv, f"tenant {faiss.tid}: index dropped: its engine changed from faiss to "
                      "native")
        # and the other server drops its own when the notification arrives
        assert wait_for(lambda: index_stats(other, faiss.key)["loaded"] is False, timeout=30)
        with other.client(key=faiss.key) as c:
            check_search(c, faiss, 42)
        assert index_stats(other, faiss.key)["engine"] == "native"
        other.stop()
        # the next use builds it anew from the database: the faiss snapshot is not used
        with srv.client(key=faiss.key) as c:
            check_search(c, faiss, 43)
            c.call("memory.delete", ids=[faiss.ids[200]])
            del faiss.live[faiss.ids[200]]
        assert index_stats(srv, faiss.key) == {"engine": "native", "loaded": True, "kind": "ann",
                                               "vectors": N - 151}
        assert metric(srv, "engram_index_loads_total", 'source="database"') == db_loads + 1
        assert metric(srv, "engram_index_snapshots_rejected_total") >= 1
        assert re.search(rf"tenant {faiss.tid}: snapshot \S+ not used: written by the faiss "
                         r"engine; rebuilding from the database", srv.log_text())
        # its new snapshot (written at the latest at shutdown) serves the next start, which
        # preloads both tenants; then back to faiss the same way
        srv.restart()
        with srv.client(key=faiss.key) as c:
            check_search(c, faiss, 44)
        assert index_stats(srv, faiss.key)["engine"] == "native"
        assert metric(srv, "engram_index_loads_total", 'source="snapshot"') == 2
        assert metric(srv, "engram_index_snapshots_rejected_total") == 0
        admin(srv, "admin.tenant.update", tenant_id=faiss.tid, index_engine="faiss")
        with srv.client(key=faiss.key) as c:
            check_search(c, faiss, 45)
        assert index_stats(srv, faiss.key)["engine"] == "faiss"
    finally:
        other.cleanup()


def test_eviction_brings_each_engine_back_from_its_snapshot(env):
    dsn, srv, faiss, native = env
    srv.stop()
    small = Server(dsn, extra=ANN + ["--index-memory-mb", "1"], data_dir=srv.data_dir)
    try:
        small.start()
        for rnd in range(2):
            for d, seed in ((faiss, 51), (native, 52)):
                with small.client(key=d.key) as c:
                    check_search(c, d, seed + 10 * rnd)
                # the one loaded last stays, the other goes over the budget
                assert index_stats(small, d.key)["engine"] == ("faiss" if d is faiss else "native")
                assert wait_for(lambda: not index_stats(
                    small, (native if d is faiss else faiss).key)["loaded"], timeout=30)
        # an evicted index still reports the engine it will load with
        assert index_stats(small, faiss.key) == {"engine": "faiss", "loaded": False, "kind": None,
                                                 "vectors": None}
        # an eviction is counted just after the index leaves the map ("loaded" False above)
        wait_metric(small, "engram_index_evictions_total", lambda v: v >= 3, "at least 3",
                    default=0.0)
        assert metric(small, "engram_index_loads_total", 'source="snapshot"') >= 3
        assert metric(small, "engram_index_snapshots_rejected_total") == 0
        small.stop()
    finally:
        small.cleanup()
        srv.start()


def test_the_server_setting_is_the_default_engine(env):
    dsn, srv, faiss, native = env
    srv.stop()
    # another default engine, and another FAISS factory: the faiss tenant's snapshot (of
    # HNSW32,Flat) is not used, the native tenant's is
    alt = Server(dsn, extra=ANN + ["--index-engine", "faiss", "--index-faiss-ef-search", "128",
                                   "--index-faiss-factory", "HNSW16,Flat"],
                 data_dir=srv.data_dir)
    try:
        alt.start()
        with alt.client(key=faiss.key) as c:
            check_search(c, faiss, 63)
        log = alt.log_text()
        assert re.search(rf"tenant {faiss.tid}: snapshot \S+ not used: written by the faiss "
                         r"engine with another factory", log), log[-3000:]
        assert re.search(rf"tenant {native.tid}: index loaded from its snapshot", log)
        r = admin(alt, "admin.tenant.create", name="eng-follows", tier="premium",
                  embedding={"dim": DIM})
        got = admin(alt, "admin.tenant.get", tenant_id=r["tenant_id"])
        assert got["index_engine"] == "faiss" and got["index_engine_default"] is True
        d = Data(r["api_key"], 61)
        with alt.client(key=d.key) as c:
            d.store(c)
            check_search(c, d, 62)
        assert index_stats(alt, d.key)["engine"] == "faiss"
        # a tenant's own choice still wins
        assert index_stats(alt, native.key)["engine"] == "native"
        alt.stop()
    finally:
        alt.cleanup()
        srv.start()


def run_bin(args):
    require_env()
    e = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") or k == "ENGRAM_BIN"}
    return subprocess.run([BIN] + args, capture_output=True, text=True, env=e, timeout=60)


def test_settings_are_validated_at_start():
    r = run_bin(["--pg-dsn", "x", "--index-engine", "hnsw"])
    assert r.returncode == 2 and "index_engine" in r.stderr and "native or faiss" in r.stderr
    r = run_bin(["--pg-dsn", "x", "--index-faiss-factory", "HNSW32,Bogus"])
    assert r.returncode == 2 and "index_faiss_factory" in r.stderr and "HNSW32,Bogus" in r.stderr
    r = run_bin(["--pg-dsn", "x", "--index-faiss-factory", "IVF64,Flat"])
    assert r.returncode == 2 and "training" in r.stderr
    r = run_bin(["--pg-dsn", "x", "--index-faiss-ef-search", "0"])
    assert r.returncode == 2 and "index_faiss_ef_search" in r.stderr
