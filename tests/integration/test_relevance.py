"""min_similarity on memory.search and memory.context (and over HTTP): the server leaves
out every memory whose cosine similarity to the query is below the threshold, in every
mode, before the answer is cut to top_k, so the answer holds the best of those that pass.

The memories are built so that the threshold matters: a few "near" memories (similarity
about 0.9 to the query) that are old and unimportant, and many "far" ones (similarity
about 0) that are new, important and match the query's words more often, so that without
a threshold the composite importance and the text rank put the far ones first."""
import json
import http.client

import numpy as np
import pytest

from harness import vec_bin
from memmodel import DAY_MS, now_ms

DIM = 384
THRESHOLD = 0.5


def unit(v):
    return (v / np.linalg.norm(v)).astype(np.float32)


@pytest.fixture(scope="module")
def corpus(server):
    """A tenant with 8 near and 30 far memories: (key, query vector, near ids, far ids,
    similarity of each id to the query as float32 arithmetic gives it)."""
    _, key = server.create_tenant()
    rng = np.random.default_rng(33)
    q = unit(rng.standard_normal(DIM))
    t0 = now_ms()
    near, far, sims = [], [], {}
    with server.client(key=key) as c:
        for i in range(8):
            v = unit(q + 0.45 * unit(rng.standard_normal(DIM)))
            mid = c.call("memory.store", content=f"falcon note {i}: the near one",
                         embedding=vec_bin(v), type="fact", importance=0.05,
                         created_at=t0 - 400 * DAY_MS)["id"]
            near.append(mid)
            sims[mid] = float(np.dot(v.astype(np.float64), q))
        for i in range(30):
            v = unit(rng.standard_normal(DIM))
            mid = c.call("memory.store", content=f"falcon falcon falcon far {i} falcon",
                         embedding=vec_bin(v), type="fact", importance=1.0,
                         created_at=t0 - 1000)["id"]
            far.append(mid)
            sims[mid] = float(np.dot(v.astype(np.float64), q))
    assert all(sims[i] > 0.8 for i in near) and all(abs(sims[i]) < 0.3 for i in far)
    return key, q, near, far, sims


def check_passing(results, near, threshold):
    for r in results:
        assert r["similarity"] is not None and r["similarity"] >= threshold, r
        assert r["id"] in near, r


@pytest.mark.parametrize("mode", ["vector", "text", "hybrid"])
def test_search_drops_low_matches_before_top_k(server, corpus, mode):
    key, q, near, far, sims = corpus
    args = dict(embedding=vec_bin(q), similarity_weight=0.2, mode=mode)
    if mode != "vector":
        args["query"] = "falcon"
    with server.client(key=key) as c:
        # without a threshold the far memories come first (importance, recency, text rank)
        plain = c.call("memory.search", top_k=5, **args)["results"]
        assert len(plain) == 5 and any(r["id"] in far for r in plain)
        # top_k above the passing count: exactly the near ones, nothing else
        got = c.call("memory.search", top_k=20, min_similarity=THRESHOLD, **args)["results"]
        check_passing(got, near, THRESHOLD)
        assert sorted(r["id"] for r in got) == sorted(near)
        # top_k below it: top_k of them, ranked by score as without a threshold
        got = c.call("memory.search", top_k=5, min_similarity=THRESHOLD, **args)["results"]
        assert len(got) == 5
        check_passing(got, near, THRESHOLD)
        scores = [r["score"] for r in got]
        assert scores == sorted(scores, reverse=True)
        # the threshold is on the similarity, not on the score: scores well below it pass
        if mode != "vector":
            assert all(r["score"] < THRESHOLD for r in got)
        # a threshold between the near similarities: exactly those at or above it
        mid = sorted(sims[i] for i in near)[3]
        got = c.call("memory.search", top_k=20, min_similarity=mid - 1e-6, **args)["results"]
        assert sorted(r["id"] for r in got) == sorted(i for i in near if sims[i] >= mid - 1e-6)
        # nothing passes
        assert c.call("memory.search", top_k=5, min_similarity=0.999, **args)["results"] == []
        # 0 keeps every memory with a non-negative similarity
        got = c.call("memory.search", top_k=50, min_similarity=0, **args)["results"]
        assert got and all(r["similarity"] >= 0 for r in got)


@pytest.mark.parametrize("mode", ["vector", "text", "hybrid"])
def test_search_says_how_many_it_left_out(server, corpus, mode):
    """below_min_similarity: how many of the candidates ranked for the answer fell below the
    threshold (top_k of them in vector mode, max(3 * top_k, 50) per ranking otherwise)."""
    key, q, near, far, sims = corpus
    args = dict(embedding=vec_bin(q), similarity_weight=0.2, mode=mode)
    if mode != "vector":
        args["query"] = "falcon"
    with server.client(key=key) as c:
        assert "below_min_similarity" not in c.call("memory.search", top_k=5, **args)
        r = c.call("memory.search", top_k=20, min_similarity=THRESHOLD, **args)
        assert len(r["results"]) == len(near)
        # vector: the index ranks the 8 near ones, then 12 of the far ones; text and hybrid
        # rank all 38 (each ranking takes 50), the 30 far ones below
        assert r["below_min_similarity"] == (20 - len(near) if mode == "vector" else len(far))
        r = c.call("memory.search", top_k=5, min_similarity=THRESHOLD, **args)
        assert len(r["results"]) == 5
        assert r["below_min_similarity"] == (0 if mode == "vector" else len(far))
        r = c.call("memory.search", top_k=5, min_similarity=0.999, **args)
        assert r["results"] == []
        assert r["below_min_similarity"] == (5 if mode == "vector" else len(near) + len(far))


def test_similarity_ranking_alone(server, corpus):
    """similarity_weight 1 ranks by similarity in the index: the threshold cuts its tail."""
    key, q, near, _, _ = corpus
    with server.client(key=key) as c:
        got = c.call("memory.search", embedding=vec_bin(q), top_k=20, similarity_weight=1.0,
                     min_similarity=THRESHOLD)["results"]
    assert sorted(r["id"] for r in got) == sorted(near)
    sims = [r["similarity"] for r in got]
    assert sims == sorted(sims, reverse=True)


def test_context_drops_low_matches(server, corpus):
    key, q, near, far, _ = corpus
    with server.client(key=key) as c:
        plain = c.call("memory.context", embedding=vec_bin(q), top_k=5, similarity_weight=0.2,
                       budget_tokens=100000)
        assert any(i in far for i in plain["ids"])
        got = c.call("memory.context", embedding=vec_bin(q), top_k=20, similarity_weight=0.2,
                     budget_tokens=100000, min_similarity=THRESHOLD)
        assert sorted(got["ids"]) == sorted(near)
        assert got["text"].count("<memory ") == len(near) and "far" not in got["text"]
        hybrid = c.call("memory.context", query="falcon", embedding=vec_bin(q), mode="hybrid",
                        top_k=3, min_similarity=THRESHOLD, format="search_results")
        assert len(hybrid["ids"]) == 3 and set(hybrid["ids"]) <= set(near)
        # an unrelated query: an empty block rather than a budget of unrelated memories
        none = c.call("memory.context", embedding=vec_bin(q), min_similarity=0.999)
        assert none == {"text": "<agent_memory>\n</agent_memory>", "ids": [], "tokens_used": 4}


@pytest.mark.parametrize("method", ["memory.search", "memory.context"])
@pytest.mark.parametrize("bad", [1.5, -0.1, "high", True])
def test_invalid_threshold_is_a_typed_error(server, corpus, method, bad):
    key, q, _, _, _ = corpus
    with server.client(key=key) as c:
        e = c.call_err(method, embedding=vec_bin(q), min_similarity=bad)
    assert e["code"] == "invalid_argument" and e["field"] == "min_similarity", e
    assert "min_similarity" in e["message"]


def post(server, method, params, key):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", f"/v1/rpc/{method}", body=json.dumps(params).encode(),
                     headers={"Content-Type": "application/json",
                              "Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_over_http(server, corpus):
    key, q, near, far, _ = corpus
    vec = [float(x) for x in q]
    status, body = post(server, "memory.search", {"embedding": vec, "top_k": 20,
                                                  "similarity_weight": 0.2,
                                                  "min_similarity": THRESHOLD}, key)
    assert status == 200, body
    assert sorted(r["id"] for r in body["results"]) == sorted(near)
    status, body = post(server, "memory.context", {"embedding": vec, "top_k": 20,
                                                   "min_similarity": THRESHOLD}, key)
    assert status == 200 and sorted(body["ids"]) == sorted(near), body
    status, body = post(server, "memory.search", {"embedding": vec, "min_similarity": 2}, key)
    assert status == 400, body
    assert body["error"]["code"] == "invalid_argument"
    assert body["error"]["field"] == "min_similarity", body
    # the OpenAPI document declares it with its bounds
    status, doc = server.http_get("/v1/openapi.json")
    doc = json.loads(doc)
    for m in ("memory.search", "memory.context"):
        p = doc["paths"][f"/v1/rpc/{m}"]["post"]["requestBody"]["content"]["application/json"][
            "schema"]["properties"]["min_similarity"]
        assert p["minimum"] == 0 and p["maximum"] == 1, p


@pytest.mark.parametrize("engine", ["native", "faiss"])
def test_approximate_tier(engramd, engine):
    """A tenant in the approximate tier (index_ann_min 512): the threshold holds with a
    blended score and with similarity alone, on either engine."""
    from harness import new_database, wait_for
    srv = engramd(new_database("relann"), extra=["--index-ann-min", "512"])
    with srv.admin() as a:
        key = a.call("admin.tenant.create", name=f"rel-{engine}", tier="premium",
                     embedding={"dim": 64}, index_engine=engine)["api_key"]
    rng = np.random.default_rng(5)
    q = unit(rng.standard_normal(64))
    with srv.client(key=key) as c:
        near = []
        for i in range(6):
            v = unit(q + 0.3 * unit(rng.standard_normal(64)))
            near.append(c.call("memory.store", content=f"near {i}", embedding=vec_bin(v),
                               type="fact", importance=0.0)["id"])
        for b in range(2):
            batch = [{"content": f"far {b}-{i}", "type": "fact", "importance": 1.0,
                      "embedding": vec_bin(unit(rng.standard_normal(64)))} for i in range(500)]
            c.call("memory.store_batch", memories=batch)
        c.call("memory.search", embedding=vec_bin(q), top_k=1)  # loads the index
        wait_for(lambda: c.call("memory.stats")["index"]["kind"] == "ann",
                 what="the approximate tier")
        for w in (0.2, 1.0):
            got = c.call("memory.search", embedding=vec_bin(q), top_k=10, similarity_weight=w,
                         min_similarity=THRESHOLD)["results"]
            assert sorted(r["id"] for r in got) == sorted(near), (w, got)
            assert all(r["similarity"] >= THRESHOLD for r in got)
            got = c.call("memory.search", embedding=vec_bin(q), top_k=3, similarity_weight=w,
                         min_similarity=THRESHOLD)["results"]
            assert len(got) == 3 and set(r["id"] for r in got) <= set(near)
