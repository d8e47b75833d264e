"""Foundation: store, search, get, delete against the real engramd and PostgreSQL."""
import numpy as np
import pytest

from harness import structured_vectors, vec_bin


def test_ping_needs_no_auth(server):
    with server.client() as c:
        assert c.call("ping") == "pong"


def test_calls_before_auth_are_rejected(server):
    with server.client() as c:
        for method, params in [("memory.store", {"content": "x", "type": "fact", "importance": 0.5}),
                               ("memory.search", {"query": "x"}),
                               ("memory.get", {"ids": [1]}),
                               ("memory.delete", {"ids": [1]})]:
            err = c.call_err(method, **params)
            assert err["code"] == "unauthenticated", (method, err)


def test_bad_keys_are_rejected_alike(server, tenant):
    _, key = tenant
    with server.client() as c:
        for bad in ["nope", key[:-1] + ("a" if key[-1] != "a" else "b"), "egk_" + "a" * 12 + "_" + "b" * 40]:
            err = c.call_err("auth", api_key=bad)
            assert err["code"] == "unauthenticated"
            assert err["message"] == "invalid API key"
        # still unauthenticated after failures
        assert c.call_err("memory.get", ids=[1])["code"] == "unauthenticated"


def test_auth_returns_tenant(server, tenant):
    tid, key = tenant
    with server.client() as c:
        r = c.call("auth", api_key=key)
        assert r["tenant_id"] == tid and r["tier"] == "premium"


def test_thousand_vectors_each_found_first(server, client):
    vecs = structured_vectors(1000, 384, seed=7)
    ids = []
    for i, v in enumerate(vecs):
        r = client.call("memory.store", content=f"memory {i}", type="fact", importance=0.5,
                        embedding=vec_bin(v))
        assert isinstance(r["id"], int) and r["created_at"] > 0
        ids.append(r["id"])
    assert len(set(ids)) == 1000
    rng = np.random.default_rng(3)
    for i in rng.choice(1000, size=60, replace=False):
        # similarity alone: access counts from earlier searches must not reorder
        res = client.call("memory.search", embedding=vec_bin(vecs[i]), top_k=5,
                          similarity_weight=1.0)["results"]
        assert res[0]["id"] == ids[i], f"stored vector {i} not found first"
        assert res[0]["content"] == f"memory {i}"
        assert res[0]["similarity"] == pytest.approx(1.0, abs=1e-5)
        sims = [x["similarity"] for x in res]
        assert sims == sorted(sims, reverse=True)
        assert [x["score"] for x in res] == pytest.approx(sims)
    # an array of numbers works as well as a bin
    res = client.call("memory.search", embedding=[float(x) for x in vecs[5]], top_k=1,
                      similarity_weight=1.0)["results"]
    assert res[0]["id"] == ids[5]


def test_text_store_and_search_with_builtin_embedder(server, client):
    texts = ["Never LP in pools with less than $100K TVL",
             "Morpho USDC vault base APY is 2.3 percent",
             "DCA into ETH over 30 days beat lump sum by 12 percent",
             "Prefer the 0.30% fee tier for stablecoin pairs"]
    ids = [client.call("memory.store", content=t, type="fact", importance=0.5)["id"] for t in texts]
    res = client.call("memory.search", query="which fee tier for stablecoin pairs?", top_k=4)
    assert res["results"][0]["id"] == ids[3]
    res = client.call("memory.search", query="Morpho vault APY", top_k=1)
    assert res["results"][0]["id"] == ids[1]


def test_get_and_delete(server, client):
    a = client.call("memory.store", content="alpha", type="preference", importance=0.9,
                    metadata={"tokens": ["ETH"], "chains": [1, 10], "attrs": {"k": "v", "n": 2.5}})
    b = client.call("memory.store", content="beta", type="episode", importance=0.1)
    got = client.call("memory.get", ids=[b["id"], a["id"], 999999999])["memories"]
    assert [m["id"] for m in got] == [b["id"], a["id"]]
    assert got[1]["content"] == "alpha" and got[1]["type"] == "preference"
    assert got[1]["importance"] == pytest.approx(0.9)
    assert got[1]["metadata"] == {"tokens": ["ETH"], "chains": [1, 10], "attrs": {"k": "v", "n": 2.5}}
    assert got[1]["created_at"] == a["created_at"]
    r = client.call("memory.delete", ids=[a["id"], 123456789])
    assert r["deleted"] == [a["id"]]
    assert client.call("memory.get", ids=[a["id"]])["memories"] == []
    res = client.call("memory.search", query="alpha", top_k=10)["results"]
    assert a["id"] not in [x["id"] for x in res]
    assert client.call("memory.delete", ids=[a["id"]])["deleted"] == []


@pytest.mark.parametrize("params,needle", [
    ({"type": "fact", "importance": 0.5}, "missing required parameter 'content'"),
    ({"content": "x", "type": "fact", "importance": 1.5}, "'importance'"),
    ({"content": "x", "type": "gossip", "importance": 0.5}, "'type'"),
    ({"content": "x", "type": "fact", "importance": 0.5, "colour": "red"}, "unknown parameter 'colour'"),
    ({"content": 7, "type": "fact", "importance": 0.5}, "'content'"),
    ({"content": "x", "type": "fact", "importance": 0.5, "embedding": b"\x00\x00\x80\x3f" * 3}, "dimension"),
    ({"content": "x", "type": "fact", "importance": 0.5, "embedding": [0.0] * 384}, "zero vector"),
    ({"content": "x", "type": "fact", "importance": 0.5, "embedding": b"\x00" * 7}, "'embedding'"),
    ({"content": "x", "type": "fact", "importance": 0.5, "metadata": [1, 2]}, "'metadata'"),
])
def test_store_validation(server, client, params, needle):
    err = client.call_err("memory.store", **params)
    assert err["code"] == "invalid_argument"
    assert needle in err["message"], err


def test_search_validation(server, client):
    assert client.call_err("memory.search")["code"] == "invalid_argument"
    err = client.call_err("memory.search", query="x", top_k=0)
    assert err["code"] == "invalid_argument" and "top_k" in err["message"]
    err = client.call_err("memory.search", query="x", top_k=5000)
    assert err["code"] == "invalid_argument" and "top_k" in err["message"]
    err = client.call_err("memory.get", ids=[])
    assert err["code"] == "invalid_argument" and "ids" in err["message"]


def test_unknown_method(server, client):
    err = client.call_err("memory.frobnicate")
    assert err["code"] == "unknown_method"


def test_admin_methods_need_admin(server, client):
    err = client.call_err("admin.tenant.create", name="x", tier="free")
    assert err["code"] == "permission_denied"
