"""Memory methods through the blocking client against a live engramd."""
from array import array

import numpy as np
import pytest

from engram_client import (Conflict, InvalidArgument, NotFound, PermissionDenied,
                           Unauthenticated)
from engram_client.errors import EngramError

V = [0.1, 0.9, 0.2, 0.0, 0.3, 0.0, 0.5, 0.1]


def test_ping_and_auth(server, key):
    with server.client(key) as c:
        assert c.ping() == "pong"
        assert c.tenant.usage()["tier"] == "premium"
    with server.client(None) as c:
        r = c.auth(api_key=key)
        assert r["tier"] == "premium" and "tenant_id" in r
        assert c.memory.stats()["total"] == 0


def test_bad_key_is_unauthenticated(server):
    with server.client("egk_not_a_key") as c:
        with pytest.raises(Unauthenticated) as e:
            c.memory.stats()
        assert e.value.code == "unauthenticated"
        assert "egk_not_a_key" not in str(e.value)


def test_store_get_update_history_delete(client):
    r = client.memory.store(content="Alice prefers tea over coffee", type="preference",
                            importance=0.7, embedding=V,
                            metadata={"tokens": ["alice"], "attrs": {"k": 1}}, agent_id=7)
    assert r["replayed"] is False
    mid = r["id"]
    got = client.memory.get([mid])["memories"]
    assert len(got) == 1 and got[0]["content"] == "Alice prefers tea over coffee"
    assert got[0]["metadata"]["tokens"] == ["alice"] and got[0]["agent_id"] == 7
    u = client.memory.update(mid, content="Alice prefers green tea", importance=0.9)
    assert u["version"] == 2
    h = client.memory.history(mid)
    assert [v["content"] for v in h["versions"]] == ["Alice prefers tea over coffee",
                                                     "Alice prefers green tea"]
    assert client.memory.delete([mid])["deleted"] == [mid]
    gone = client.memory.get([mid])
    assert gone["memories"] == [] and gone["missing"] == [mid]  # which ids were not there
    with pytest.raises(NotFound):
        client.memory.history(mid)


def test_embedding_forms_are_equivalent(client):
    forms = [V, tuple(V), array("f", V), np.array(V, dtype=np.float32),
             np.array(V, dtype=np.float64), np.array(V, dtype=">f4"),
             np.asarray(V, dtype="<f4").tobytes()]
    ids = [client.memory.store(content=f"form {i}", type="fact", importance=0.5, embedding=f)["id"]
           for i, f in enumerate(forms)]
    page = client.memory.list(include_embedding=True, order="asc")
    assert [m["id"] for m in page["memories"]] == ids
    for m in page["memories"]:
        e = m["embedding"]
        assert isinstance(e, np.ndarray) and e.dtype == np.float32
        assert np.allclose(e, np.array(V, dtype=np.float32))
    hits = client.memory.search(embedding=np.array(V, dtype=np.float32), top_k=3)["results"]
    assert len(hits) == 3 and hits[0]["similarity"] == pytest.approx(1.0, abs=1e-5)


def test_numpy_array_is_sent_without_a_copy(monkeypatch):
    from engram_client import _wire
    a = np.array(V, dtype=np.float32)
    mv = _wire.embedding_bytes(a)
    assert isinstance(mv, memoryview) and mv.obj is not None
    assert np.shares_memory(np.frombuffer(mv, dtype=np.float32), a)
    f = array("f", V)
    mv2 = _wire.embedding_bytes(f)
    assert isinstance(mv2, memoryview) and bytes(mv2) == f.tobytes()


def test_embeddings_as_array_without_numpy(server, key):
    with server.client(key, numpy_embeddings=False) as c:
        c.memory.store(content="x", type="fact", importance=0.5, embedding=V)
        e = c.memory.list(include_embedding=True)["memories"][0]["embedding"]
        assert isinstance(e, array) and e.typecode == "f"
        assert list(e) == pytest.approx(V, abs=1e-6)


def test_search_text_and_context(server):
    key = server.tenant()  # builtin embedder, default dimension
    with server.client(key) as c:
        c.memory.store_batch(memories=[
            {"content": "Never LP in pools with less than $100K TVL", "type": "constraint",
             "importance": 0.95},
            {"content": "The user lives in Lisbon", "type": "fact", "importance": 0.5},
        ])
        hits = c.memory.search(query="Lisbon", mode="text", top_k=5)["results"]
        assert [h["content"] for h in hits] == ["The user lives in Lisbon"]
        ctx = c.memory.context(query="liquidity pools TVL", budget_tokens=200)
        assert ctx["text"].startswith("<agent_memory>") and ctx["ids"]
        assert "$100K" in ctx["text"]
        assert c.memory.stats()["total"] == 2


def test_errors_are_typed(client, server):
    with pytest.raises(InvalidArgument) as e:
        client.memory.store(content="x", type="not-a-type", importance=0.5)
    assert "type" in e.value.message
    with pytest.raises(InvalidArgument):
        client.memory.store(content="x", type="fact", importance=0.5, embedding=[1.0,
                            2.0])  # wrong dimension
    with pytest.raises(PermissionDenied):
        client.admin.tenant.list()
    with pytest.raises(EngramError) as e:
        client.call("no.such.method")
    assert e.value.code == "unknown_method"
    sid = client.session.create(agent_id=1, config={"model": "m"})["session_id"]
    client.session.scratchpad.update(sid, content="v1")
    with pytest.raises(Conflict) as e:
        client.session.scratchpad.update(sid, content="v2", expected_version=0)
    assert e.value.data["version"] == 1


def test_idempotency_key_replays(client):
    a = client.memory.store(content="once", type="fact", importance=0.5, embedding=V,
                            idempotency_key="k-1")
    b = client.memory.store(content="once", type="fact", importance=0.5, embedding=V,
                            idempotency_key="k-1")
    assert a["id"] == b["id"] and b["replayed"] is True
    with pytest.raises(Conflict):
        client.memory.store(content="other", type="fact", importance=0.5, embedding=V,
                            idempotency_key="k-1")
    # keys generated by the client differ per call: two calls store two memories
    client.memory.store(content="twice", type="fact", importance=0.5, embedding=V)
    client.memory.store(content="twice", type="fact", importance=0.5, embedding=V)
    assert client.memory.stats()["total"] == 3


def test_admin_namespace(server):
    with server.admin() as a:
        name = "py-admin-" + str(id(a))
        r = a.admin.tenant.create(name=name, tier="standard")
        t = a.admin.tenant.get(name=name)
        assert t["tenant_id"] == r["tenant_id"] and t["tier"] == "standard"
        k = a.admin.key.create(name="second", tenant_id=r["tenant_id"])
        assert any(x["key_id"] == k["key_id"] for x in a.admin.key.list(tenant=name)["keys"])
        a.admin.key.revoke(k["key_id"])
        assert a.admin.tenant.update(name=name, tier="premium")["tier"] == "premium"
        assert a.admin.tenant.delete(tenant_id=r["tenant_id"])["deleted"] is True
