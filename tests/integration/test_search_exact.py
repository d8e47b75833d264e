"""Filtered top-K is exact: compared with brute force over many random filters.

The test keeps its own model of every memory (memmodel.py), including the access counts
each search adds, and ranks by the seed's formulas independently of the server.
"""
import random

import numpy as np
import pytest

from harness import structured_vectors, vec_bin
from memmodel import DAY_MS, Mem, composite, now_ms, rank

TYPES = ["fact", "preference", "episode", "strategy_outcome", "constraint"]
TOKENS = ["ETH", "USDC", "WBTC", "DAI", "ARB", "OP"]
PROTOCOLS = ["uniswap", "morpho", "aave", "curve"]
STRATS = ["dca", "lp", "carry"]


def random_memory(rng, i, t0):
    f = {"type": rng.choice(TYPES), "importance": round(rng.random(), 3),
         "created_at": t0 - rng.randrange(0, 120 * DAY_MS)}
    scope = rng.choice(["agent", "clade", "tenant"])
    f["scope"] = scope
    if scope in ("agent", "clade") or rng.random() < 0.5:
        f["agent_id"] = rng.randrange(1, 5)
    if scope == "clade" or rng.random() < 0.3:
        f["clade_id"] = rng.randrange(1, 3)
    md = {}
    if rng.random() < 0.8:
        md["tokens"] = rng.sample(TOKENS, rng.randrange(1, 3))
    if rng.random() < 0.7:
        md["chains"] = rng.sample([1, 10, 137, 42161], rng.randrange(1, 3))
    if rng.random() < 0.6:
        md["protocols"] = rng.sample(PROTOCOLS, 1)
    if rng.random() < 0.4:
        md["strategy_id"] = rng.choice(STRATS)
    if rng.random() < 0.5:
        md["attrs"] = {"pool": rng.choice(["a", "b", "c"]), "fee": rng.choice([5, 30, 100]),
                       "tags": rng.sample(["x", "y", "z"], rng.randrange(1, 3))}
    f["metadata"] = md
    return f


def random_filter(rng, t0):
    flt = {}
    if rng.random() < 0.35:
        flt["type_filter"] = rng.sample(TYPES, rng.randrange(1, 4))
    if rng.random() < 0.3:
        flt["tokens"] = rng.sample(TOKENS, rng.randrange(1, 3))
    if rng.random() < 0.25:
        flt["chains"] = rng.sample([1, 10, 137, 42161], 1)
    if rng.random() < 0.2:
        flt["protocols"] = rng.sample(PROTOCOLS, rng.randrange(1, 3))
    if rng.random() < 0.15:
        flt["strategy_id"] = rng.choice(STRATS)
    if rng.random() < 0.2:
        flt["attrs"] = rng.choice([{"pool": "a"}, {"fee": 30}, {"tags": ["x"]}, {"pool": "b", "fee": 5}])
    if rng.random() < 0.25:
        flt["created_after"] = t0 - rng.randrange(10, 100) * DAY_MS
    if rng.random() < 0.2:
        flt["created_before"] = t0 - rng.randrange(0, 60) * DAY_MS
    if rng.random() < 0.3:
        flt["agent_id"] = rng.randrange(1, 5)
        if rng.random() < 0.6:
            flt["clade_id"] = rng.randrange(1, 3)
    if rng.random() < 0.25:
        flt["scopes"] = rng.sample(["agent", "clade", "tenant"], rng.randrange(1, 3))
    if rng.random() < 0.2:
        flt["min_composite"] = round(rng.uniform(0.2, 0.6), 2)
    if rng.random() < 0.15:
        flt["min_importance"] = round(rng.uniform(0.1, 0.8), 2)
    return flt


@pytest.mark.parametrize("dim", [384])
def test_filtered_topk_matches_brute_force(server, dim):
    _, key = server.create_tenant()
    rng = random.Random(1234)
    t0 = now_ms()
    n = 700
    vecs = structured_vectors(n, dim, seed=42)
    mems = []
    with server.client(key=key) as c:
        items = [random_memory(rng, i, t0) for i in range(n)]
        for start in range(0, n, 250):
            batch = []
            for i in range(start, min(n, start + 250)):
                it = dict(items[i])
                it.update(content=f"memory {i}", embedding=vec_bin(vecs[i]))
                batch.append(it)
            ids = c.call("memory.store_batch", memories=batch)["ids"]
            for j, mid in enumerate(ids):
                mems.append(Mem(mid, vecs[start + j], **items[start + j]))
        queries = structured_vectors(80, dim, seed=43)
        checked_full = 0
        for qi, q in enumerate(queries):
            flt = random_filter(rng, t0)
            w = rng.choice([1.0, 0.7, 0.5, 0.0])
            k = rng.choice([1, 5, 10, 25])
            at = now_ms()
            ranked, nmatch = rank(mems, q, flt, w, len(mems), at)
            want = ranked[:k]
            got = c.call("memory.search", embedding=vec_bin(q), top_k=k, similarity_weight=w,
                         **flt)["results"]
            # never an under-filled page: exactly min(k, matches) results
            assert len(got) == min(k, nmatch), (flt, len(got), nmatch)
            # every result passes the filter and its numbers are the model's
            by_id = {m.id: m for m in mems}
            for g in got:
                m = by_id[g["id"]]
                sim = float(m.vec @ (np.asarray(q, np.float64) / np.linalg.norm(q)))
                assert g["similarity"] == pytest.approx(sim, abs=2e-5)
                assert g["access_count"] == m.access_count
                assert g["composite"] == pytest.approx(
                    composite(m.created_at, m.access_count, m.importance, at), abs=2e-4)
                assert g["score"] == pytest.approx(w * g["similarity"] + (1 - w) * g["composite"], abs=1e-9)
            # the best k: the scores equal the brute-force top k's (ties may swap ids)
            assert [g["score"] for g in got] == pytest.approx([x[0] for x in want], abs=3e-4), flt
            # and the same ids, wherever no near-tie (within the clock's drift) makes the
            # order a coin toss, including at the boundary of the top k
            span = ranked[:k + 1]
            if all(abs(span[i][0] - span[i + 1][0]) > 1e-3 for i in range(len(span) - 1)):
                assert [g["id"] for g in got] == [x[3].id for x in want], flt
                checked_full += 1
            # every returned memory counted an access
            for g in got:
                by_id[g["id"]].access_count += 1
        assert checked_full >= 40, "too few searches without near-ties to compare ids"


def test_archived_best_matches_give_way_to_the_next_live_ones(server):
    """A search without filters skips the index's per-candidate filter and checks its hits
    (m_search.c): when the best matches are archived, the answer is still the best k live
    memories, every time, and archived ones come back only when asked for."""
    _, key = server.create_tenant()
    n, dim, k = 300, 384, 5
    vecs = structured_vectors(n, dim, seed=44)
    with server.client(key=key) as c:
        ids = c.call("memory.store_batch", memories=[
            {"content": f"m{i}", "type": "fact", "importance": 0.5, "embedding": vec_bin(v)}
            for i, v in enumerate(vecs)])["ids"]
        q = np.asarray(vecs[0], np.float64)
        sims = np.asarray(vecs, np.float64) @ (q / np.linalg.norm(q))
        order = [ids[i] for i in np.argsort(-sims, kind="stable")]

        def top(**kw):
            return [g["id"] for g in c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=k,
                                            similarity_weight=1.0, **kw)["results"]]

        assert top() == order[:k]
        # archive the three best: the next live ones fill the page, in order
        assert c.call("memory.archive", ids=order[:3])["archived"] == order[:3]
        for _ in range(3):
            assert top() == order[3:3 + k]
        assert top(include_archived=True) == order[:k]
        # restored, they are found again
        assert c.call("memory.restore", ids=order[:3])["restored"] == order[:3]
        assert top() == order[:k]
