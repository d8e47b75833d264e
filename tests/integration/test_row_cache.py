"""The row cache never serves an old version of a memory: every change of a memory's fields,
made through this process or another one, is what the next search returns; and searches work
the same with the cache turned off."""

from harness import Server, new_database, structured_vectors, vec_bin, wait_for, wait_log
from harness import metric as harness_metric

DIM = 384


def metric(srv, name, labels=None):
    return harness_metric(srv, name, labels, default=0.0)


def top(c, vec, **kw):
    res = c.call("memory.search", embedding=vec_bin(vec), top_k=1, similarity_weight=1.0, **kw)
    return res["results"][0]


def test_cached_rows_follow_every_change():
    dsn = new_database("rowcache")
    a = Server(dsn).start()
    b = Server(dsn, extra=["--secret-file", a.data_dir + "/secret.key"])
    try:
        b.start()
        _, key = a.create_tenant()
        vecs = structured_vectors(20, DIM, seed=61)
        with a.client(key=key) as c:
            ids = c.call("memory.store_batch", memories=[
                {"content": f"v1 {i}", "type": "fact", "importance": 0.5, "embedding": vec_bin(v),
                 "metadata": {"tokens": ["x"]}} for i, v in enumerate(vecs)])["ids"]
            assert top(c, vecs[3])["content"] == "v1 3"
            misses = metric(a, "engram_row_cache_lookups_total", 'result="miss"')
            hits = metric(a, "engram_row_cache_lookups_total", 'result="hit"')
            for _ in range(5):
                assert top(c, vecs[3])["content"] == "v1 3"
            assert metric(a, "engram_row_cache_lookups_total", 'result="hit"') == hits + 5
            assert metric(a, "engram_row_cache_lookups_total", 'result="miss"') == misses

            # through this process: content, importance, metadata, archive and restore
            c.call("memory.update", id=ids[3], content="v2 3", importance=0.9,
                   metadata={"tokens": ["y"]}, embedding=vec_bin(vecs[3]))
            got = top(c, vecs[3])
            assert (got["content"], got["importance"], got["metadata"], got["version"]) == (
                "v2 3", 0.9, {"tokens": ["y"]}, 2)
            c.call("memory.archive", ids=[ids[3]])
            got = top(c, vecs[3], include_archived=True)
            assert got["id"] == ids[3] and got["archived_at"] is not None
            c.call("memory.restore", ids=[ids[3]])
            assert top(c, vecs[3])["archived_at"] is None

            # through the other process: this one's index follows the change log, and the
            # row it returns is the new one, never the cached old one
            with b.client(key=key) as cb:
                cb.call("memory.update", id=ids[5], content="changed elsewhere",
                        embedding=vec_bin(vecs[5]))
            assert wait_for(lambda: top(c, vecs[5])["content"] == "changed elsewhere", timeout=10), \
                "the other process's update never showed"
            # a deleted memory is never served from the cache
            assert top(c, vecs[7])["id"] == ids[7]  # cached now
            with b.client(key=key) as cb:
                cb.call("memory.delete", ids=[ids[7]])
            def without_deleted():
                res = c.call("memory.search", embedding=vec_bin(vecs[7]), top_k=3,
                             similarity_weight=1.0)["results"]
                return None if ids[7] in [r["id"] for r in res] else (res,)

            got = wait_for(without_deleted, timeout=10)
            assert got, "the other process's delete never showed"
            res = got[0]
            assert len(res) == 3
        a.stop()
        b.stop()
    finally:
        a.cleanup()
        b.cleanup()


def test_searches_without_the_cache():
    dsn = new_database("nocache")
    srv = Server(dsn, extra=["--row-cache-mb", "0"]).start()
    try:
        _, key = srv.create_tenant()
        vecs = structured_vectors(10, DIM, seed=62)
        with srv.client(key=key) as c:
            ids = [c.call("memory.store", content=f"n{i}", type="fact", importance=0.5,
                          embedding=vec_bin(v))["id"] for i, v in enumerate(vecs)]
            for i in range(10):
                assert top(c, vecs[i])["id"] == ids[i]
            ctx = c.call("memory.context", embedding=vec_bin(vecs[2]), top_k=3)
            assert ctx["ids"][0] == ids[2] and "n2" in ctx["text"]
        assert metric(srv, "engram_row_cache_lookups_total", 'result="hit"') == 0
        assert metric(srv, "engram_row_cache_entries") == 0
        srv.stop()
    finally:
        srv.cleanup()


def index_stats(c):
    return c.call("memory.stats")["index"]


def store_rows(c, vecs, prefix, pad=""):
    """Stores one fact per vector, content "<prefix> <i><pad>"; returns their ids."""
    return c.call("memory.store_batch", memories=[
        {"content": f"{prefix} {i}{pad}", "type": "fact", "importance": 0.5,
         "embedding": vec_bin(v)} for i, v in enumerate(vecs)])["ids"]


def warm_state(c, state):
    """memory.stats' index once its row cache warming is in state (None after 30 s)."""
    return wait_for(lambda: (lambda s: s if s["row_cache_warm"] == state else None)(
        index_stats(c)), timeout=30)


def test_a_loaded_index_reads_its_live_rows_into_the_cache():
    """After a restart the preloaded tenant's live rows are in the row cache before any
    search: searches of them make no database round trip, archived rows are not read, and a
    row changed after warming is served at its new version."""
    dsn = new_database("rowwarm")
    srv = Server(dsn).start()
    try:
        _, key = srv.create_tenant()
        vecs = structured_vectors(300, DIM, seed=63)
        with srv.client(key=key) as c:
            ids = store_rows(c, vecs, "warm")
            c.call("memory.archive", ids=ids[:20])
            assert top(c, vecs[30])["id"] == ids[30]  # loads the index
        srv.restart()  # the snapshot written at shutdown is preloaded
        with srv.client(key=key) as c:
            idx = warm_state(c, "done")
            assert idx, index_stats(c)
            assert idx["rows_warmed"] == 280
            assert metric(srv, "engram_row_cache_prewarmed_rows_total") == 280
            assert metric(srv, "engram_row_cache_entries") == 280
            hits = metric(srv, "engram_row_cache_lookups_total", 'result="hit"')
            misses = metric(srv, "engram_row_cache_lookups_total", 'result="miss"')
            for i in range(20, 60):
                assert top(c, vecs[i])["content"] == f"warm {i}"
            assert metric(srv, "engram_row_cache_lookups_total", 'result="miss"') == misses
            assert metric(srv, "engram_row_cache_lookups_total", 'result="hit"') == hits + 40
            # archived rows were not read: asking for one is a miss
            got = top(c, vecs[3], include_archived=True)
            assert got["id"] == ids[3] and got["archived_at"] is not None
            assert metric(srv, "engram_row_cache_lookups_total", 'result="miss"') == misses + 1
            # a row changed after warming: the new version, never the warmed one
            c.call("memory.update", id=ids[50], content="changed", embedding=vec_bin(vecs[50]))
            assert top(c, vecs[50])["content"] == "changed"
        srv.stop()
    finally:
        srv.cleanup()


def test_warming_stops_at_its_share_of_the_cache_and_can_be_turned_off():
    dsn = new_database("rowwarmfull")
    # 1 MiB of cache, warming up to 5% of it (51 KiB): about 130 rows of this size
    srv = Server(dsn, extra=["--row-cache-mb", "1", "--row-cache-prewarm-percent", "5"]).start()
    try:
        _, key = srv.create_tenant()
        vecs = structured_vectors(1000, DIM, seed=64)
        with srv.client(key=key) as c:
            store_rows(c, vecs, "row", pad=" " + "x" * 200)
            top(c, vecs[0])  # loads the index, snapshotted at shutdown
        srv.restart()
        with srv.client(key=key) as c:
            idx = warm_state(c, "cache_full")
            assert idx, index_stats(c)
            assert 0 < idx["rows_warmed"] < 1000
            held = metric(srv, "engram_row_cache_bytes")
            # it stops within one check (64 rows of about 400 bytes) past the share
            share = (1 << 20) // 100 * 5
            assert share <= held < share + 64 * 1024, held
        srv.extra = ["--row-cache-mb", "1", "--row-cache-prewarm-percent", "0"]
        srv.restart()
        with srv.client(key=key) as c:
            idx = wait_for(lambda: (lambda s: s if s["loaded"] else None)(index_stats(c)),
                           timeout=30)
            assert idx and idx["row_cache_warm"] == "off" and idx["rows_warmed"] == 0
            assert metric(srv, "engram_row_cache_entries") == 0
            assert metric(srv, "engram_row_cache_prewarmed_rows_total") == 0
        srv.stop()
    finally:
        srv.cleanup()


def test_failed_warming_leaves_searches_reading_rows_as_they_need_them():
    """engramd built for tests (any build but release) honours ENGRAM_FAULT_ROWS_WARM=N: the
    next N pages of row cache warming fail. A failed warming is reported (state failed, a
    warning naming the tenant), reads nothing, and searches still return the right rows,
    read from the database as they are needed; the next load warms again."""
    dsn = new_database("rowwarmfail")
    srv = Server(dsn).start()
    try:
        tid, key = srv.create_tenant()
        vecs = structured_vectors(200, DIM, seed=65)
        with srv.client(key=key) as c:
            ids = store_rows(c, vecs, "fail")
            assert top(c, vecs[0])["id"] == ids[0]  # loads the index
        srv.env["ENGRAM_FAULT_ROWS_WARM"] = "1"
        srv.restart()
        assert "fault injection: the next 1 pages of row cache warming fail" in srv.log_text()
        with srv.client(key=key) as c:
            idx = warm_state(c, "failed")
            assert idx, index_stats(c)
            assert idx["rows_warmed"] == 0
            assert metric(srv, "engram_row_cache_entries") == 0
            # the state says failed before the warning is written
            wait_log(srv, f"tenant {tid}: reading its rows into the row cache failed after 0 "
                          "rows: fault injection")
            misses = metric(srv, "engram_row_cache_lookups_total", 'result="miss"')
            for i in range(10, 30):
                got = top(c, vecs[i])
                assert got["id"] == ids[i] and got["content"] == f"fail {i}"
            assert metric(srv, "engram_row_cache_lookups_total", 'result="miss"') >= misses + 20
        del srv.env["ENGRAM_FAULT_ROWS_WARM"]
        srv.restart()
        with srv.client(key=key) as c:
            idx = warm_state(c, "done")
            assert idx and idx["rows_warmed"] == 200, index_stats(c)
        srv.stop()
    finally:
        srv.cleanup()
