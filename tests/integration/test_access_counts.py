"""Access counts are durable about a second after the read, are folded into the memories'
rows by the maintenance task, and survive a crash of the server: every reader (memory.get
through any process, a restarted index) sees them throughout."""

import threading
import time

from harness import Server, metric, new_database, psql, structured_vectors, vec_bin, wait_for


def store_facts(c, vecs, tag):
    """Stores one fact per vector through client c; returns their ids in order."""
    return [c.call("memory.store", content=f"{tag}{i}", type="fact", importance=0.5,
                   embedding=vec_bin(v))["id"] for i, v in enumerate(vecs)]


def search(c, vec, top_k=1):
    """The results of a similarity search for vec through client c (each counts an access
    of every memory it returns)."""
    return c.call("memory.search", embedding=vec_bin(vec), top_k=top_k,
                  similarity_weight=1.0)["results"]


def counted(dsn, tid, mid):
    """A memory's access count as the database has it: its row's plus the pending one."""
    return int(psql(dsn, f"SELECT m.access_count + COALESCE((SELECT a.access_count FROM "
                         f"memory_access a WHERE a.tenant_id = m.tenant_id AND a.id = m.id), 0)"
                         f" FROM memories m WHERE m.tenant_id = {tid} AND m.id = {mid}"))


def test_access_counts_land_fold_and_survive_a_crash():
    dsn = new_database("access")
    srv = Server(dsn, extra=["--maintenance-interval-s", "2", "--access-fold-idle-s", "0"])
    other = Server(dsn, extra=["--secret-file", srv.data_dir + "/secret.key"])
    try:
        srv.start()
        other.start()
        tid, key = srv.create_tenant()
        vecs = structured_vectors(5, 384, seed=71)
        with srv.client(key=key) as c:
            ids = store_facts(c, vecs, "a")
            for _ in range(3):
                res = search(c, vecs[0])
                assert res[0]["id"] == ids[0]

        def total():
            return counted(dsn, tid, ids[0])

        # durable in the database within about a second of the reads
        assert wait_for(lambda: total() == 3)
        # every process reports them, folded or not
        with other.client(key=key) as c:
            got = c.call("memory.get", ids=[ids[0]])["memories"][0]
            assert got["access_count"] == 3 and got["last_accessed_at"] is not None
        # and the maintenance task folds them into the row
        assert wait_for(lambda: psql(dsn, f"SELECT access_count FROM memories WHERE tenant_id = {tid} "
                                                 f"AND id = {ids[0]}") == "3")
        assert psql(dsn, "SELECT count(*) FROM memory_access") == "0"
        with srv.client(key=key) as c:
            search(c, vecs[0])
        assert wait_for(lambda: total() == 4)
        srv.kill()  # a crash: the index restarts from the database and its snapshot state
        srv.start()
        with srv.client(key=key) as c:
            res = search(c, vecs[0])
            assert res[0]["id"] == ids[0] and res[0]["access_count"] == 4
        with other.client(key=key) as c:
            assert wait_for(lambda: c.call("memory.get", ids=[ids[0]])["memories"][0]["access_count"] == 5)
        srv.stop()
        other.stop()
    finally:
        srv.cleanup()
        other.cleanup()


def test_a_memory_read_recently_keeps_its_count_pending():
    """A memory read within access_fold_idle_s keeps its count in memory_access (its row is
    not rewritten at every maintenance); readers report it all the same; once unread for
    that long, the count is folded into the row."""
    dsn = new_database("accessidle")
    srv = Server(dsn, extra=["--maintenance-interval-s", "1", "--access-fold-idle-s", "3600"])
    later = Server(dsn, extra=["--maintenance-interval-s", "1", "--access-fold-idle-s", "2",
                               "--secret-file", srv.data_dir + "/secret.key"])
    try:
        srv.start()
        tid, key = srv.create_tenant()
        vecs = structured_vectors(3, 384, seed=72)
        with srv.client(key=key) as c:
            ids = store_facts(c, vecs, "b")
            search(c, vecs[0])
            assert wait_for(lambda: psql(dsn, f"SELECT access_count FROM memory_access WHERE "
                                              f"tenant_id = {tid} AND id = {ids[0]}") == "1")
            # maintenance runs every second: at least two ran, and none folded the count of a
            # memory read less than an hour ago
            time.sleep(2.5)
            assert psql(dsn, f"SELECT access_count FROM memories WHERE tenant_id = {tid} "
                             f"AND id = {ids[0]}") == "0"
            assert psql(dsn, "SELECT count(*) FROM memory_access") == "1"
            assert c.call("memory.get", ids=[ids[0]])["memories"][0]["access_count"] == 1
        srv.stop()
        # a process whose idle time has passed for that memory folds it into the row
        later.start()
        assert wait_for(lambda: psql(dsn, f"SELECT access_count FROM memories WHERE tenant_id = "
                                          f"{tid} AND id = {ids[0]}") == "1", timeout=20)
        assert psql(dsn, "SELECT count(*) FROM memory_access") == "0"
        with later.client(key=key) as c:
            assert c.call("memory.get", ids=[ids[0]])["memories"][0]["access_count"] == 1
        later.stop()
    finally:
        srv.cleanup()
        later.cleanup()


def test_pending_counts_add_up_across_batches():
    """A batch adds to the pending counts that earlier batches left (the row is updated in
    place), inserts the ones that have none yet, and carries the time of the last read
    (a 64-bit millisecond count, sent as a binary array) forward."""
    dsn = new_database("accessadd")
    srv = Server(dsn, extra=["--access-fold-idle-s", "3600"])
    try:
        srv.start()
        tid, key = srv.create_tenant()
        vecs = structured_vectors(3, 384, seed=74)

        def pending(mid):
            return psql(dsn, f"SELECT access_count, (extract(epoch FROM now() - last_accessed_at)"
                             f" < 60)::text FROM memory_access WHERE tenant_id = {tid} AND "
                             f"id = {mid}").split("|")

        with srv.client(key=key) as c:
            ids = store_facts(c, vecs, "d")
            assert search(c, vecs[0])[0]["id"] == ids[0]
            assert wait_for(lambda: pending(ids[0]) == ["1", "true"])
            first = psql(dsn, f"SELECT last_accessed_at FROM memory_access WHERE tenant_id = "
                              f"{tid} AND id = {ids[0]}")
            time.sleep(0.05)
            for _ in range(2):
                assert search(c, vecs[0])[0]["id"] == ids[0]
            assert search(c, vecs[1])[0]["id"] == ids[1]
            assert wait_for(lambda: pending(ids[0])[0] == "3" and pending(ids[1]) == ["1", "true"])
            assert pending(ids[0]) == ["3", "true"]
            assert psql(dsn, f"SELECT last_accessed_at > '{first}' FROM memory_access WHERE "
                             f"tenant_id = {tid} AND id = {ids[0]}") == "t"
            assert psql(dsn, "SELECT count(*) FROM memory_access") == "2"
            assert c.call("memory.get", ids=[ids[0]])["memories"][0]["access_count"] == 3
        srv.stop()
    finally:
        srv.cleanup()


def test_a_worker_writes_counts_at_most_once_per_flush_interval_and_at_shutdown():
    """access_flush_ms bounds how often a worker writes its counts: a worker that has
    written nothing for that long writes at its next tick, then keeps what follows for the
    interval (ten minutes here); a clean shutdown writes what is pending."""
    dsn = new_database("accessflush")
    srv = Server(dsn, extra=["--access-flush-ms", "600000", "--access-fold-idle-s", "3600"])
    try:
        srv.start()
        tid, key = srv.create_tenant()
        vecs = structured_vectors(3, 384, seed=75)

        def pending():
            return psql(dsn, f"SELECT COALESCE(sum(access_count), 0) FROM memory_access "
                             f"WHERE tenant_id = {tid}")

        with srv.client(key=key) as c:  # one connection: one worker
            ids = store_facts(c, vecs, "e")
            assert search(c, vecs[0])[0]["id"] == ids[0]
            assert wait_for(lambda: pending() == "1")
            assert search(c, vecs[0])[0]["id"] == ids[0]
            time.sleep(2.5)  # two and a half of the old one-second intervals
            assert pending() == "1"
        srv.stop()  # the drain writes the pending counts
        assert pending() == "2" and counted(dsn, tid, ids[0]) == 2
    finally:
        srv.cleanup()


def test_concurrent_searches_of_one_tenant_count_every_access():
    """Searches of one tenant on both workers bump the index's counts together, with the
    searches going on (no exclusive lock): none is lost, and the index's count is the
    database's."""
    dsn = new_database("access_conc")
    srv = Server(dsn, extra=["--workers", "2"])
    try:
        srv.start()
        tid, key = srv.create_tenant()
        vecs = structured_vectors(40, 384, seed=73)
        with srv.client(key=key) as c:
            ids = store_facts(c, vecs, "c")
        errors = []

        def reader():
            try:
                with srv.client(key=key) as c:
                    for _ in range(30):
                        res = search(c, vecs[0], top_k=3)
                        assert res[0]["id"] == ids[0]
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=reader) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        # 6 x 30 searches, each one access of ids[0]: the next search reports them all
        with srv.client(key=key) as c:
            res = search(c, vecs[0])
            assert res[0]["id"] == ids[0] and res[0]["access_count"] == 180
        # CI runs that waited out here (178 of 181 once) found a lost-update race in
        # engram_memory_touch, fixed in 07f5077; the message says whether a count was lost
        # or written twice
        assert wait_for(lambda: counted(dsn, tid, ids[0]) == 181, timeout=30), \
            f"the database counts {counted(dsn, tid, ids[0])} accesses, not 181"
        srv.stop()
    finally:
        srv.cleanup()


def test_reads_alone_write_no_snapshot_and_a_restart_keeps_their_counts():
    """Access counts are not changes of the index: searches alone never cause a snapshot to
    be written again, and an index restored from its snapshot reads the counts back from
    the database."""
    dsn = new_database("accsnap")
    srv = Server(dsn, extra=["--index-snapshot-interval-s", "1"])
    try:
        srv.start()
        tid, key = srv.create_tenant()
        vecs = structured_vectors(20, 384, seed=73)
        with srv.client(key=key) as c:
            ids = store_facts(c, vecs, "s")
            search(c, vecs[0])
        # the index built from the database is snapshotted once
        assert wait_for(lambda: metric(srv, "engram_index_snapshots_written_total") == 1)
        with srv.client(key=key) as c:
            for _ in range(30):
                res = search(c, vecs[0])
                assert res[0]["id"] == ids[0]
        assert wait_for(lambda: counted(dsn, tid, ids[0]) == 31)
        time.sleep(3)  # three snapshot intervals: reads alone write none
        assert metric(srv, "engram_index_snapshots_written_total") == 1
        srv.restart()
        assert metric(srv, "engram_index_loads_total", 'source="snapshot"') == 1
        with srv.client(key=key) as c:
            res = search(c, vecs[0])
            assert res[0]["id"] == ids[0] and res[0]["access_count"] == 31
        srv.stop()
    finally:
        srv.cleanup()


def test_count_access_false_counts_nothing(server):
    """memory.search and memory.context with count_access false count no access, in the
    index or in PostgreSQL; the default counts one per result."""
    tid, key = server.create_tenant()
    vecs = structured_vectors(3, 384, seed=73)
    with server.client(key=key) as c:
        ids = store_facts(c, vecs, "n")
        for _ in range(3):
            r = c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=1,
                       similarity_weight=1.0, count_access=False)["results"]
            assert r[0]["id"] == ids[0] and r[0]["access_count"] == 0
            ctx = c.call("memory.context", embedding=vec_bin(vecs[0]), top_k=1,
                         similarity_weight=1.0, count_access=False)
            assert ctx["ids"] == [ids[0]]
        # the default: the next search sees the one before it
        search(c, vecs[0])
        r = c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=1,
                   similarity_weight=1.0, count_access=False)["results"]
        assert r[0]["access_count"] == 1
    # PostgreSQL gets the one counted access: had the six looks counted, it would never
    # read 1
    assert wait_for(lambda: counted(server.dsn, tid, ids[0]) == 1)
