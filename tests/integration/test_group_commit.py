"""Concurrent stores of one tenant are committed together (one transaction for the stores
waiting while another is in flight), and each request still gets exactly its own answer:
its ids, only after the commit, its quota verdict as if it had been alone, and a failure of
its own never fails the others."""
import threading

from harness import Server, new_database, psql, structured_vectors, vec_bin


def test_pipelined_stores_all_land_with_their_own_ids():
    dsn = new_database("group")
    srv = Server(dsn).start()
    try:
        tid, key = srv.create_tenant()
        vecs = structured_vectors(400, 384, seed=81)
        results = {}

        def client(k):
            with srv.client(key=key) as c:
                ids = [c.send("memory.store", {"content": f"g{k}-{i}", "type": "fact",
                                               "importance": 0.5,
                                               "embedding": vec_bin(vecs[k * 100 + i])})
                       for i in range(100)]
                for i, m in enumerate(ids):
                    err, res = c.wait(m)
                    assert err is None, err
                    results[(k, i)] = res["id"]

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 400 and len(set(results.values())) == 400
        # every id names the memory its request stored, and the index has it
        rows = dict(line.split("|") for line in
                    psql(dsn, f"SELECT id, content FROM memories WHERE tenant_id = {tid}").splitlines())
        assert {int(i): c for i, c in rows.items()} == {
            v: f"g{k}-{i}" for (k, i), v in results.items()}
        with srv.client(key=key) as c:
            for (k, i) in [(0, 0), (1, 50), (2, 99), (3, 17)]:
                res = c.call("memory.search", embedding=vec_bin(vecs[k * 100 + i]), top_k=1,
                             similarity_weight=1.0)["results"]
                assert res[0]["id"] == results[(k, i)]
        srv.stop()
    finally:
        srv.cleanup()


def test_a_quota_reached_by_the_group_is_judged_per_request():
    dsn = new_database("groupq")
    srv = Server(dsn, extra=["--free-max-memories", "50", "--free-rate-per-s", "10000",
                             "--free-rate-burst", "10000"]).start()
    try:
        _, key = srv.create_tenant(tier="free")
        with srv.client(key=key) as c:
            c.call("memory.store_batch", memories=[{"content": f"b{i}", "type": "fact",
                                                    "importance": 0.1} for i in range(40)])
            # 30 single stores pipelined: the ones queued behind the first go to the
            # database together, over the limit as a whole; retried alone, exactly 10 fit
            msgs = [c.send("memory.store", {"content": f"s{i}", "type": "fact", "importance": 0.1})
                    for i in range(30)]
            outcomes = [c.wait(m) for m in msgs]
            ok = [r for e, r in outcomes if e is None]
            errs = [e for e, r in outcomes if e is not None]
            assert len(ok) == 10 and len(errs) == 20
            assert {e["code"] for e in errs} == {"quota_exceeded"}
            assert c.call("memory.stats")["total"] == 50
        srv.stop()
    finally:
        srv.cleanup()
