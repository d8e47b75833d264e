"""A fleet: three engramd processes on one database, HAProxy (TCP mode) in front.

Any process serves any tenant. Administrative changes (key revocations, tier changes) and
memory changes (deletes, consolidation) made through one process reach the others within
the bounds docs/scaling.md states, measured here:

- NOTIFY_BOUND_S: a change announced by NOTIFY (engram_admin for keys and tiers,
  engram_changes for memories): PostgreSQL delivers it to every listener at commit, the
  listener applies an admin change at once and queues an index catch-up for a memory change.
- CHECK_BOUND_S: a revocation whose notification never arrived (made in SQL behind
  engramd's back here; in production, sent while a listener was reconnecting) is found by
  the periodic check of the keys in use (every 5 s, tenancy.c CHECK_INTERVAL_MS).

And with a small index_memory_mb each process evicts its least recently used tenants
instead of holding every tenant the balancer happened to send it."""
import time

import numpy as np
import pytest

from harness import (HAProxy, metric, new_database, psql, server_fleet, structured_vectors,
                     vec_bin, wait_for, wait_metric)

DIM = 16
NOTIFY_BOUND_S = 1.0
CHECK_BOUND_S = 5.0 + 1.0  # the check interval, plus a round of the background queue
LIMITS = ["--free-rate-per-s", "1", "--free-rate-burst", "3", "--premium-consolidation-hours", "0",
          "--free-consolidation-hours", "0", "--standard-consolidation-hours", "0"]


def until(pred, bound, what, since):
    """Waits for pred(); returns the seconds from since (time.monotonic() when the change
    was made) until it held, failing past 3x bound (so that a slow propagation is reported
    with its time, then checked against bound)."""
    ok = wait_for(pred, timeout=bound * 3, interval=0.01)
    took = time.monotonic() - since
    assert ok, f"{what}: not within {bound * 3:.1f} s"
    print(f"{what}: {took * 1000:.0f} ms (bound {bound:.1f} s)")  # shown with pytest -s
    return took


@pytest.fixture(scope="module")
def fleet():
    dsn = new_database("fleet")
    procs = server_fleet(dsn, 3, LIMITS)
    lb = None
    try:
        lb = HAProxy(procs).start()
        yield procs, lb, dsn
    finally:
        if lb:
            lb.cleanup()
        try:
            for p in procs:
                p.stop()
        finally:
            for p in procs:
                p.cleanup()


def store(c, vec, content, **kw):
    return c.call("memory.store", content=content, type="fact", importance=0.5,
                  embedding=vec_bin(vec), **kw)["id"]


def found(c, vec, k=5):
    return [r["id"] for r in c.call("memory.search", embedding=vec_bin(vec), top_k=k,
                                    similarity_weight=1.0)["results"]]


def test_haproxy_spreads_clients_over_every_process(fleet):
    procs, lb, _ = fleet
    _, key = procs[0].create_tenant(tier="premium", embedding={"dim": DIM})
    before = [metric(p, "engram_requests_total") for p in procs]
    vecs = structured_vectors(12, DIM, seed=5)
    ids = []
    for i, v in enumerate(vecs):  # a connection each: round robin over the three
        with lb.client(key=key) as c:
            ids.append(store(c, v, f"via haproxy {i}"))
    t0 = time.monotonic()
    after = [metric(p, "engram_requests_total") for p in procs]
    assert all(a - b >= 4 for a, b in zip(after, before)), (before, after)
    # whichever process a client lands on finds the memories, whoever stored them: the
    # newest within the bound, then every one
    for i in range(3):
        with lb.client(key=key) as c:
            assert until(lambda: all(found(c, vecs[j], 1) == [ids[j]] for j in (9, 10, 11)),
                         NOTIFY_BOUND_S, f"stores through client {i}", t0) <= NOTIFY_BOUND_S
            assert all(found(c, v, 1) == [ids[j]] for j, v in enumerate(vecs))


def test_revocations_reach_every_process(fleet):
    procs, _, dsn = fleet
    tid, key = procs[0].create_tenant(tier="premium", embedding={"dim": DIM})
    with procs[0].admin() as adm:
        k2 = adm.call("admin.key.create", tenant_id=tid, name="revoked by rpc")
        k3 = adm.call("admin.key.create", tenant_id=tid, name="revoked behind our back")
    conns2 = [p.client(key=k2["api_key"]) for p in procs]
    conns3 = [p.client(key=k3["api_key"]) for p in procs]
    try:
        for c in conns2 + conns3:  # authenticated, long-lived connections on each process
            assert c.call("memory.stats")["total"] >= 0

        def refused(c):
            e = c.wait(c.send("memory.stats", {}))[0]
            return e is not None and e["code"] == "unauthenticated"

        with procs[0].admin() as adm:
            adm.call("admin.key.revoke", key_id=k2["key_id"])
        t0 = time.monotonic()
        took = [until(lambda c=c: refused(c), NOTIFY_BOUND_S, f"revocation on process {i}", t0)
                for i, c in enumerate(conns2)]
        assert max(took) <= NOTIFY_BOUND_S, took
        # no notification at all: the periodic check of keys in use finds it
        psql(dsn, f"UPDATE api_keys SET revoked_at = now() WHERE id = {k3['key_id']}")
        t0 = time.monotonic()
        took = [until(lambda c=c: refused(c), CHECK_BOUND_S, f"silent revocation on process {i}", t0)
                for i, c in enumerate(conns3)]
        assert max(took) <= CHECK_BOUND_S, took
        # and a new connection with either key is refused by every process at once
        for p in procs:
            for k in (k2, k3):
                with p.client() as c:
                    assert c.call_err("auth", api_key=k["api_key"])["code"] == "unauthenticated"
    finally:
        for c in conns2 + conns3:
            c.close()


def test_tier_changes_reach_every_process(fleet):
    procs, _, _ = fleet
    tid, key = procs[0].create_tenant(tier="premium", embedding={"dim": DIM})
    conns = [p.client(key=key) for p in procs]
    try:
        for c in conns:  # premium: 5,000 requests per second, a burst goes through
            for _ in range(6):
                c.call("ping")
                assert c.call("memory.stats")["total"] == 0

        def limited(c):
            """The free tier's burst of 3 at 1/s: a quick burst of 6 meets rate_limited."""
            codes = [c.wait(c.send("memory.stats", {}))[0] for _ in range(6)]
            return any(e is not None and e["code"] == "rate_limited" for e in codes)

        with procs[1].admin() as adm:
            adm.call("admin.tenant.update", tenant_id=tid, tier="free")
        t0 = time.monotonic()
        took = [until(lambda c=c: limited(c), NOTIFY_BOUND_S, f"tier change on process {i}", t0)
                for i, c in enumerate(conns)]
        assert max(took) <= NOTIFY_BOUND_S, took
    finally:
        for c in conns:
            c.close()


def test_deletes_reach_every_process(fleet):
    procs, lb, _ = fleet
    _, key = procs[0].create_tenant(tier="premium", embedding={"dim": DIM})
    vecs = structured_vectors(20, DIM, seed=9)
    with lb.client(key=key) as c:
        ids = c.call("memory.store_batch", memories=[
            {"content": f"d{i}", "type": "fact", "importance": 0.5, "embedding": vec_bin(v)}
            for i, v in enumerate(vecs)])["ids"]
    conns = [p.client(key=key) for p in procs]
    try:
        # every index loaded and every row cached: only the index can hide a deleted memory
        for c in conns:
            assert wait_for(lambda c=c: all(found(c, v, 1) == [ids[i]] for i, v in enumerate(vecs)),
                            timeout=10)
        gone = ids[:5]
        conns[2].call("memory.delete", ids=gone)
        t0 = time.monotonic()
        took = [until(lambda c=c: not any(g in found(c, vecs[i], 3) for i, g in enumerate(gone)),
                      NOTIFY_BOUND_S, f"delete on process {i}", t0)
                for i, c in enumerate(conns)]
        assert max(took) <= NOTIFY_BOUND_S, took
        for c in conns:
            assert found(c, vecs[7], 1) == [ids[7]]
    finally:
        for c in conns:
            c.close()


def unit(v):
    return v / np.linalg.norm(v)


def test_consolidation_results_reach_every_process(fleet):
    procs, _, _ = fleet
    _, key = procs[0].create_tenant(tier="premium", embedding={"dim": DIM})
    q, _ = np.linalg.qr(np.random.default_rng(3).standard_normal((DIM, DIM)))
    rng = np.random.default_rng(4)
    base = q[:, 0]
    dups = []
    for i in range(3):  # cosine about 0.99 to base: one cluster, merged into one
        r = rng.standard_normal(DIM)
        r -= (r @ base) * base
        dups.append(unit(0.99 * base + np.sqrt(1 - 0.99 ** 2) * unit(r)))
    conns = [p.client(key=key) for p in procs]
    try:
        dup_ids = [conns[0].call("memory.store", content="fee tier A", type="fact",
                                 importance=0.3 + 0.2 * i, embedding=vec_bin(v))["id"]
                   for i, v in enumerate(dups)]
        other = [store(conns[0], q[:, k], f"far {k}") for k in range(1, 5)]
        for c in conns:
            assert wait_for(lambda c=c: sorted(found(c, base, 3)) == sorted(dup_ids), timeout=10)
        r = conns[0].call("memory.consolidate")
        t0 = time.monotonic()
        assert r["status"] == "completed" and r["merged"] == 2, r
        survivor = dup_ids[2]  # the most important of the cluster
        took = [until(lambda c=c: found(c, base, 3)[:1] == [survivor] and
                      not set(dup_ids[:2]) & set(found(c, base, 7)),
                      NOTIFY_BOUND_S, f"consolidation on process {i}", t0)
                for i, c in enumerate(conns)]
        assert max(took) <= NOTIFY_BOUND_S, took
        for c in conns:
            assert found(c, q[:, 2], 1) == [other[1]]
    finally:
        for c in conns:
            c.close()


def test_a_small_index_budget_evicts_least_recently_used_tenants(fleet):
    """Each process holds only what fits its index_memory_mb; a tenant it evicted comes back
    from its snapshot on the next request. (Own processes: the fleet's budget is the
    default.)"""
    procs, _, dsn = fleet
    small = server_fleet(dsn, 2, LIMITS + ["--index-memory-mb", "1"])
    try:
        tenants = []
        for t in range(5):  # 1000 x 128 floats: about 0.6 MiB of index each
            _, key = small[0].create_tenant(tier="premium", embedding={"dim": 128})
            vecs = structured_vectors(1000, 128, seed=20 + t)
            with small[t % 2].client(key=key) as c:
                ids = c.call("memory.store_batch", memories=[
                    {"content": f"t{t}-{i}", "type": "fact", "importance": 0.5,
                     "embedding": vec_bin(v)} for i, v in enumerate(vecs)])["ids"]
            tenants.append((key, vecs, ids))
        for rnd in range(2):  # every process serves every tenant, twice
            for key, vecs, ids in tenants:
                for p in small:
                    with p.client(key=key) as c:
                        assert found(c, vecs[123], 1) == [ids[123]]
            # the budget check (once a second) evicts down to the budget: at most one of the
            # five indexes (0.8 MiB each) stays, so the next round brings at least four back
            # from their snapshots, written before the eviction
            for p in small:
                assert wait_for(lambda p=p: metric(p, "engram_index_bytes") <= 1 << 20,
                                timeout=10), metric(p, "engram_index_bytes")
        for p in small:
            # the last eviction is counted just after its index left (index_bytes above)
            wait_metric(p, "engram_index_evictions_total", lambda v: v >= 8, "at least 8")
            assert metric(p, "engram_index_loads_total", 'source="snapshot"') >= 4
    finally:
        try:
            for p in small:
                p.stop()
        finally:
            for p in small:
                p.cleanup()
