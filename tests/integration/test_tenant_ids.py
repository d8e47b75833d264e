"""A tenant's ids are numbered by that tenant alone.

The ids one tenant receives must tell it nothing about what other tenants write: consecutive
stores of one tenant get consecutive ids whatever the others do, of memories and of every
session object. Two tenants hold the same ids, and everything keyed by an id (access counts,
row cache, index) keeps them apart.
"""
from harness import structured_vectors, vec_bin, wait_for

VECS = structured_vectors(16, 384, seed=1201)


def mem(i, tag):
    return {"content": f"{tag} {i}", "type": "fact", "importance": 0.5,
            "embedding": vec_bin(VECS[i % len(VECS)])}


def test_each_tenant_numbers_its_own_ids(server):
    _, ka = server.create_tenant()
    _, kb = server.create_tenant()
    with server.client(key=ka) as a, server.client(key=kb) as b:
        a1 = a.call("memory.store", **mem(0, "a"))["id"]
        assert a1 == 1
        b_ids = b.call("memory.store_batch", memories=[mem(i, "b") for i in range(7)])["ids"]
        assert b_ids == list(range(1, 8))
        assert a.call("memory.store", **mem(1, "a"))["id"] == a1 + 1
        assert a.call("memory.store_batch", memories=[mem(i, "a") for i in range(3)])["ids"] == \
            [a1 + 2, a1 + 3, a1 + 4]

        def session_ids(c):
            sid = c.call("session.create", agent_id=1, config={"model": "m"})["session_id"]
            entry = c.call("session.append", session_id=sid, role="user", content="x")["entry_id"]
            note = c.call("session.note.add", session_id=sid, category="decision", key="k",
                          value="v", scope="session")["note_id"]
            cp = c.call("session.checkpoint", session_id=sid, label="l")["checkpoint_id"]
            return sid, entry, note, cp

        first = session_ids(a)
        for _ in range(3):
            session_ids(b)
        second = session_ids(a)
        # A's numbering moved by exactly A's own writes: one session, note and checkpoint,
        # and as many entries as the first round made (its append, then the checkpoint's
        # session_paused event)
        assert (first[0], first[1], first[2], first[3]) == (1, 1, 1, 1)
        assert second == (2, 3, 2, 2)


def test_equal_ids_in_two_tenants_stay_apart(server):
    _, ka = server.create_tenant()
    _, kb = server.create_tenant()
    with server.client(key=ka) as a, server.client(key=kb) as b:
        ids_a = a.call("memory.store_batch", memories=[mem(i, "A") for i in range(3)])["ids"]
        ids_b = b.call("memory.store_batch", memories=[mem(i, "B") for i in range(3)])["ids"]
        assert ids_a == ids_b
        for _ in range(3):
            res = a.call("memory.search", embedding=vec_bin(VECS[0]), top_k=1,
                         similarity_weight=1.0)["results"]
            assert res[0]["id"] == ids_a[0] and res[0]["content"] == "A 0"
        # A's accesses are counted on A's memory only, never on B's memory of the same id
        assert wait_for(lambda: a.call("memory.get", ids=[ids_a[0]])["memories"][0]
                        ["access_count"] == 3)
        got = b.call("memory.get", ids=ids_b)["memories"]
        assert [m["content"] for m in got] == ["B 0", "B 1", "B 2"]
        assert [m["access_count"] for m in got] == [0, 0, 0]
        # an update in B leaves A's memory of the same id alone
        b.call("memory.update", id=ids_b[1], content="B 1 changed")
        assert a.call("memory.get", ids=[ids_a[1]])["memories"][0]["content"] == "A 1"
        assert b.call("memory.get", ids=[ids_b[1]])["memories"][0]["content"] == "B 1 changed"


def test_a_tenant_created_later_starts_at_one(server):
    _, key = server.create_tenant()
    with server.client(key=key) as c:
        assert c.call("memory.store", **mem(3, "fresh"))["id"] == 1
        assert c.call("session.create", agent_id=1, config={"model": "m"})["session_id"] == 1
        assert c.call("memory.consolidate")["run_id"] == 1
