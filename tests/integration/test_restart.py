"""Every acknowledged memory survives a restart of engramd."""
from harness import Server, new_database, structured_vectors, vec_bin


def test_acknowledged_memories_survive_restart():
    srv = Server(new_database("restart")).start()
    try:
        _, key = srv.create_tenant()
        vecs = structured_vectors(200, 384, seed=9)
        ids = []
        with srv.client(key=key) as c:
            for i, v in enumerate(vecs):
                ids.append(c.call("memory.store", content=f"r{i}", type="fact", importance=0.5,
                                  embedding=vec_bin(v))["id"])
            c.call("memory.delete", ids=ids[:10])
        srv.restart()
        with srv.client(key=key) as c:
            assert len(c.call("memory.get", ids=ids[10:])["memories"]) == 190
            assert c.call("memory.get", ids=ids[:10])["memories"] == []
            for i in range(10, 200, 7):
                res = c.call("memory.search", embedding=vec_bin(vecs[i]), top_k=1, similarity_weight=1.0)["results"]
                assert res[0]["id"] == ids[i]
            for i in range(10):
                res = c.call("memory.search", embedding=vec_bin(vecs[i]), top_k=3, similarity_weight=1.0)["results"]
                assert res and ids[i] not in [r["id"] for r in res]
        srv.stop()
    finally:
        srv.cleanup()


def test_killed_server_loses_nothing_acknowledged():
    srv = Server(new_database("kill")).start()
    try:
        _, key = srv.create_tenant()
        vecs = structured_vectors(100, 384, seed=10)
        with srv.client(key=key) as c:
            ids = [c.call("memory.store", content=f"k{i}", type="fact", importance=0.5,
                          embedding=vec_bin(v))["id"] for i, v in enumerate(vecs)]
        srv.kill()  # SIGKILL: no shutdown path at all
        srv.start()
        with srv.client(key=key) as c:
            assert len(c.call("memory.get", ids=ids)["memories"]) == 100
            res = c.call("memory.search", embedding=vec_bin(vecs[42]), top_k=1, similarity_weight=1.0)["results"]
            assert res[0]["id"] == ids[42]
        srv.stop()
    finally:
        srv.cleanup()
