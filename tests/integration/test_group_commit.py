"""Concurrent stores of one tenant are committed together (one transaction for the stores
waiting while another is in flight), and each request still gets exactly its own answer:
its ids, only after the commit, its quota verdict as if it had been alone, and a failure of
its own never fails the others."""
import os
import subprocess
import threading
import time

from harness import (PG_BINDIR, Server, keyed_burst, metric, new_database, psql,
                     structured_vectors, vec_bin, wait_for)


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


def test_stores_of_many_tenants_share_transactions_and_keep_their_own_answers():
    """Stores of different tenants go to PostgreSQL in one transaction (rows of several
    tenants share a transaction id), yet each tenant's ids and change numbers are its own and
    gapless, and a tenant at its quota is refused without failing the others' stores in the
    same transactions."""
    dsn = new_database("groupx")
    srv = Server(dsn, extra=["--free-max-memories", "20", "--free-rate-per-s", "10000",
                             "--free-rate-burst", "10000"]).start()
    try:
        tenants = [srv.create_tenant() for _ in range(6)] + [srv.create_tenant(tier="free")]
        free_tid = tenants[-1][0]
        per_conn = 40
        outcomes = {}
        lock = threading.Lock()

        def client(ti, k):
            tid, key = tenants[ti]
            with srv.client(key=key) as c:
                msgs = [c.send("memory.store", {"content": f"t{tid}-c{k}-{i}", "type": "fact",
                                                "importance": 0.5}) for i in range(per_conn)]
                got = [c.wait(m) for m in msgs]
            with lock:
                for i, (err, res) in enumerate(got):
                    outcomes[(tid, k, i)] = (err, res)

        threads = [threading.Thread(target=client, args=(ti, k))
                   for ti in range(len(tenants)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(outcomes) == len(tenants) * 2 * per_conn
        for tid, _ in tenants:
            mine = {key: v for key, v in outcomes.items() if key[0] == tid}
            ok = {key: res["id"] for key, (err, res) in mine.items() if err is None}
            errs = [err for err, _ in mine.values() if err is not None]
            if tid == free_tid:
                assert len(ok) == 20 and {e["code"] for e in errs} == {"quota_exceeded"}
            else:
                assert not errs, errs[:3]
                assert len(ok) == 2 * per_conn
            # ids are the tenant's own, 1..n without gaps, each naming its request's memory
            assert sorted(ok.values()) == list(range(1, len(ok) + 1))
            rows = dict(line.split("|") for line in psql(
                dsn, f"SELECT id, content FROM memories WHERE tenant_id = {tid}").splitlines())
            assert {int(i): c for i, c in rows.items()} == {
                v: f"t{tid}-c{k}-{i}" for (_, k, i), v in ok.items()}
            # change numbers: gapless from 1, one per memory, as the tenant row says
            seqs = psql(dsn, "SELECT string_agg(c.seq::text, ',' ORDER BY c.seq) FROM "
                             f"memory_changes c JOIN memories m ON m.tenant_id = c.tenant_id "
                             f"AND m.id = c.memory_id AND m.seq = c.seq WHERE c.tenant_id = {tid}")
            assert seqs == ",".join(str(i) for i in range(1, len(ok) + 1))
            assert psql(dsn, f"SELECT change_seq, memory_count, memory_id_last FROM tenants "
                             f"WHERE id = {tid}") == f"{len(ok)}|{len(ok)}|{len(ok)}"
        # (that waiting stores of several tenants share one transaction is shown
        # deterministically by the next test) and the index of each tenant has its memories
        tid, key = tenants[0]
        with srv.client(key=key) as c:
            res = c.call("memory.search", query=f"t{tid}-c1-7", top_k=3)["results"]
            assert res and all(r["content"].startswith(f"t{tid}-") for r in res)
        srv.stop()
    finally:
        srv.cleanup()


def test_waiting_stores_of_several_tenants_go_in_one_transaction():
    """While a worker's job is in flight, the stores that arrive wait, and then go to
    PostgreSQL together in one transaction, whatever their tenants. Made deterministic by
    holding the change log locked: the job of the first tenant's store is the worker's one
    place in flight (it waits for the lock), the stores of four other tenants queue, and all
    ten go in one transaction once the lock is released."""
    dsn = new_database("groupw")
    srv = Server(dsn, workers=1).start()
    blocker = None
    clients = []
    try:
        tenants = [srv.create_tenant() for _ in range(5)]
        vecs = structured_vectors(20, 384, seed=7)
        # connected and authenticated first: authentication reads the database, whose
        # connections are about to wait for the lock (briefly: the pool declares a database
        # that answers nothing for seconds down)
        clients = [srv.client(key=key) for _, key in tenants]
        for c in clients:
            c.call("ping")
        blocker = subprocess.Popen([os.path.join(PG_BINDIR, "psql"), dsn, "-X", "-q"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        # the change log locked (a tenant's row held elsewhere would no longer hold the group
        # up: its stores would go alone to the worker's lane, tests/reliability/
        # test_write_isolation.py)
        blocker.stdin.write("BEGIN;\nLOCK TABLE memory_changes IN SHARE MODE;\n"
                            "\\echo locked\n")
        blocker.stdin.flush()
        while blocker.stdout.readline().strip() != "locked":
            pass
        sent = []
        for i, c in enumerate(clients):
            for k in range(1 if i < 2 else 3):
                sent.append((i, c, c.send("memory.store", {
                    "content": f"w{i}-{k}", "type": "fact", "importance": 0.5,
                    "embedding": vec_bin(vecs[4 * i + k])})))
            if i == 0:
                # the one place in flight waits for the lock
                assert wait_for(lambda: psql(dsn, "SELECT count(*) FROM pg_stat_activity "
                                                  "WHERE wait_event_type = 'Lock' AND "
                                                  "datname = current_database()") == "1",
                                timeout=2)
        # the connections' requests are handled in order: once ping answers, its connection's
        # stores are waiting in the group
        for c in clients[1:]:
            c.call("ping")
        blocker.stdin.write("COMMIT;\n")
        blocker.stdin.close()
        blocker.wait(timeout=30)
        blocker = None
        for i, c, m in sent:
            err, res = c.wait(m)
            assert err is None, err
        held = [str(t) for t, _ in tenants[1:]]
        per_tx = psql(dsn, "SELECT string_agg(n::text, ',') FROM (SELECT count(*) AS n FROM "
                           "memories WHERE tenant_id IN (%s) GROUP BY xmin::text) x"
                      % ",".join(held))
        assert per_tx == "10", per_tx  # one transaction, four tenants
        srv.stop()
    finally:
        if blocker:
            blocker.kill()
        for c in clients:
            c.close()
        srv.cleanup()


def test_a_store_alone_skips_the_group_function_unless_refused():
    """A job of one request goes through one plain statement, not the plpgsql group function
    (PostgreSQL counts the function's calls with track_functions); a request that statement
    refuses (over the tier's limit) goes again through the function, which says why."""
    dsn = new_database("groupsolo")
    psql(dsn, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', "
              "current_database()); END $$")
    srv = Server(dsn, extra=["--free-max-memories", "3"]).start()

    def calls():
        return int(psql(dsn, "SELECT pg_stat_clear_snapshot(); SELECT COALESCE(sum(calls), 0) "
                             "FROM pg_stat_user_functions WHERE funcname = "
                             "'engram_memory_store_group'").splitlines()[-1])

    try:
        _, key = srv.create_tenant(tier="free")
        with srv.client(key=key) as c:
            one = c.call("memory.store", content="alone", type="fact", importance=0.2)["id"]
            ids = c.call("memory.store_batch", memories=[{"content": f"b{i}", "type": "fact",
                                                          "importance": 0.1} for i in range(2)])
            assert c.call("memory.get", ids=[one])["memories"][0]["content"] == "alone"
            assert len(ids["ids"]) == 2
            err, _ = c.wait(c.send("memory.store", {"content": "one too many", "type": "fact",
                                                    "importance": 0.1}))
            assert err is not None and err["code"] == "quota_exceeded", err
            assert (err["limit"], err["usage"], err["requested"]) == (3, 3, 1)
            assert c.call("memory.stats")["total"] == 3
        # backends report their statistics within a second of going idle: once the refusal's
        # call shows, wait two more seconds for any other call to show too
        assert wait_for(lambda: calls() >= 1, timeout=10)
        time.sleep(2)
        assert calls() == 1  # the refusal only: the three writes went by the plain statement
        srv.stop()
    finally:
        srv.cleanup()


def test_every_store_path_writes_the_text_search_vector():
    """content_tsv is written by the writers since migration 0008 (no longer generated):
    the plain statement (a few memories), the group function (a request of more than 16,
    which computes the vectors before it takes the tenant's lock), the batch function (an
    idempotency key) and an update of the content each write to_tsvector('english', content),
    and text search finds what each wrote."""
    dsn = new_database("grouptsv")
    psql(dsn, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', "
              "current_database()); END $$")
    srv = Server(dsn).start()

    def calls():
        return int(psql(dsn, "SELECT pg_stat_clear_snapshot(); SELECT COALESCE(sum(calls), 0) "
                             "FROM pg_stat_user_functions WHERE funcname = "
                             "'engram_memory_store_group'").splitlines()[-1])

    def batch(word, n, **kw):
        return c.call("memory.store_batch", memories=[
            {"content": f"the {word} number {i} was noted", "type": "fact", "importance": 0.3}
            for i in range(n)], **kw)["ids"]

    def found(word):
        return {r["id"] for r in c.call("memory.search", query=word, mode="text",
                                        top_k=100)["results"]}

    try:
        tid, key = srv.create_tenant()
        with srv.client(key=key) as c:
            solo = c.call("memory.store", content="a lonely pelican", type="fact",
                          importance=0.5)["id"]
            small = batch("walrus", 16)  # the plain statement, as one request of 16
            big = batch("narwhal", 17)  # the group function
            idem = batch("ocelot", 3, idempotency_key="tsv-1")  # keyed: the group function
            upd = c.call("memory.store", content="a plain heron", type="fact",
                         importance=0.5)["id"]
            c.call("memory.update", id=upd, content="a changed flamingo")
            c.call("memory.update", id=solo, importance=0.9)  # content, vector unchanged
            assert found("pelican") == {solo}
            assert found("walrus") == set(small)
            assert found("narwhal") == set(big)
            assert found("ocelot") == set(idem)
            assert found("flamingo") == {upd} and found("heron") == set()
        bad = psql(dsn, f"SELECT count(*) FROM memories WHERE tenant_id = {tid} AND "
                        "content_tsv IS DISTINCT FROM to_tsvector('english', content)")
        assert bad.strip() == "0"
        assert psql(dsn, f"SELECT count(*) FROM memories WHERE tenant_id = {tid}").strip() == "38"
        # the request of 17 and the keyed one went through the group function (statistics
        # arrive within a second of the backend going idle)
        assert wait_for(lambda: calls() >= 2, timeout=10)
        time.sleep(2)
        assert calls() == 2
        srv.stop()
    finally:
        srv.cleanup()


def test_keyed_stores_group_replay_and_conflict_as_alone():
    """Stores with idempotency keys (the client libraries give every store one) go through
    the groups: from 4 tenants at once, 12 keyed stores each sent twice in one burst and one
    more under a used key with other content, then the same keys again on new connections.
    A repeat is a replay of the same memory however the groups fell (one key of a tenant is
    never twice in a group: the repeat sees the first's commit), a reused key with other
    content is refused `conflict` alone, every key is recorded once with its memory, and
    no store went through engram_memory_store_batch (the path keyed stores took before)."""
    dsn = new_database("group_keyed")
    srv = Server(dsn).start()
    try:
        tenants = [srv.create_tenant() for _ in range(4)]
        psql(dsn, "SELECT pg_stat_reset()")
        batches = metric(srv, "engram_group_commit_batches_total")
        requests = metric(srv, "engram_group_commit_requests_total")
        ids, errors = {}, []

        def burst(w, key):
            try:
                with srv.client(key=key) as c:
                    ids[w] = keyed_burst(c, [f"t{w} keyed {i}" for i in range(12)],
                                         [f"k-{i}" for i in range(12)])
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=burst, args=(w, k))
                   for w, (_, k) in enumerate(tenants)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        grouped = metric(srv, "engram_group_commit_requests_total") - requests
        assert grouped == 4 * 25, grouped
        assert metric(srv, "engram_group_commit_batches_total") - batches < grouped
        for w, (tid, key) in enumerate(tenants):
            with srv.client(key=key) as c:
                again = [c.call("memory.store", content=f"t{w} keyed {i}", type="fact",
                                importance=0.5, idempotency_key=f"k-{i}") for i in range(12)]
                assert [a["id"] for a in again] == ids[w]
                assert all(a.get("replayed") for a in again)
                got = c.call("memory.get", ids=ids[w])["memories"]
                assert [m["content"] for m in got] == [f"t{w} keyed {i}" for i in range(12)]
                assert c.call("memory.stats")["total"] == 12
            rows = psql(dsn, "SELECT key, ids[1] FROM idempotency_keys WHERE tenant_id = "
                             f"{tid} ORDER BY ids[1]").split()
            assert rows == [f"k-{i}|{ids[w][i]}" for i in range(12)], rows
        time.sleep(1.5)  # function statistics arrive once the backends are idle
        assert psql(dsn, "SELECT pg_stat_clear_snapshot(); SELECT COALESCE(sum(calls), 0) "
                         "FROM pg_stat_user_functions WHERE funcname = "
                         "'engram_memory_store_batch'").splitlines()[-1] == "0"
        srv.stop()
    finally:
        srv.cleanup()
