"""Index snapshots and the memory budget, end to end.

A restarted server loads each index from its snapshot and replays the changes committed
after it; a damaged snapshot, one older than the change log, one ahead of the database and
one from another database are all detected and the index is rebuilt from PostgreSQL, so
that it holds exactly the database's ids. Under a small memory budget, indexes are evicted
least recently used and come back from their snapshots with nothing lost.
"""
import glob
import os
import re

from harness import new_database, psql, structured_vectors, vec_bin
from harness import metric as harness_metric
from harness import wait_metric

DIM = 384


def metric(srv, name, labels=None):
    """The value of one sample of /metrics (0 when absent)."""
    return harness_metric(srv, name, labels, default=0.0)


def load_histogram(srv, source):
    """(buckets [(le, cumulative count)], sum, count) of engram_index_load_duration_seconds."""
    status, text = srv.http_get("/metrics")
    assert status == 200
    buckets, total, count = [], None, None
    prefix = "engram_index_load_duration_seconds"
    for line in text.splitlines():
        if line.startswith(f'{prefix}_bucket{{source="{source}",le="'):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
        elif line.startswith(f'{prefix}_sum{{source="{source}"}} '):
            total = float(line.split()[-1])
        elif line.startswith(f'{prefix}_count{{source="{source}"}} '):
            count = float(line.split()[-1])
    return buckets, total, count


def check_load_histogram(srv, source, loads):
    """The histogram of source counts exactly `loads` loads, consistently."""
    buckets, total, count = load_histogram(srv, source)
    assert count == loads and buckets and buckets[-1] == (float("inf"), loads)
    assert [b[0] for b in buckets] == sorted(b[0] for b in buckets)
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))  # cumulative
    assert (total > 0) == (loads > 0)


def snapshot_files(srv, tid):
    return glob.glob(os.path.join(srv.data_dir, "index", "*", f"{tid}.idx"))


def db_ids(dsn, tid):
    out = psql(dsn, f"SELECT id FROM memories WHERE tenant_id = {tid} ORDER BY id")
    return sorted(int(x) for x in out.split()) if out else []


def index_ids(c, n):
    """Every id the index holds: a search whose top_k exceeds the tenant's size (exact below
    index_ann_min), ranked by similarity alone."""
    q = structured_vectors(1, DIM, seed=999)[0]
    res = c.call("memory.search", embedding=vec_bin(q), top_k=n, similarity_weight=1.0)["results"]
    return sorted(r["id"] for r in res)


def store(c, vecs, start=0, tokens=lambda i: [f"g{i % 5}"]):
    mems = [{"content": f"m{start + i}", "type": "fact", "importance": 0.5,
             "embedding": vec_bin(v), "metadata": {"tokens": tokens(start + i)}}
            for i, v in enumerate(vecs)]
    ids = []
    for k in range(0, len(mems), 250):
        ids += c.call("memory.store_batch", memories=mems[k:k + 250])["ids"]
    return ids


def test_restart_loads_the_snapshot_and_replays_later_changes(engramd):
    dsn = new_database("snap")
    srv = engramd(dsn)
    # a second process with its own data directory (and the first one's secret)
    other = engramd(dsn, extra=["--secret-file", srv.data_dir + "/secret.key"], start=False)
    tid, key = srv.create_tenant()
    vecs = structured_vectors(700, DIM, seed=21)
    with srv.client(key=key) as c:
        ids = store(c, vecs)
        assert index_ids(c, 1000) == sorted(ids)  # loads the index
    srv.stop()  # writes the snapshot
    assert len(snapshot_files(srv, tid)) == 1
    other.start()
    with other.client(key=key) as c:
        c.call("memory.delete", ids=ids[:50])
        c.call("memory.update", id=ids[60], metadata={"tokens": ["moved"]})
        new = store(c, structured_vectors(20, DIM, seed=22), start=700,
                    tokens=lambda i: ["fresh"])
    other.stop()
    srv.start()
    with srv.client(key=key) as c:
        assert index_ids(c, 1000) == db_ids(dsn, tid)
        q = vec_bin(vecs[3])
        moved = c.call("memory.search", embedding=q, top_k=10, tokens=["moved"])["results"]
        assert [r["id"] for r in moved] == [ids[60]]
        g1 = c.call("memory.search", embedding=q, top_k=500, tokens=["g1"])["results"]
        assert sorted(r["id"] for r in g1) == sorted(
            ids[i] for i in range(50, 700) if i % 5 == 1 and i != 60)
        fresh = c.call("memory.search", embedding=q, top_k=100, tokens=["fresh"])["results"]
        assert sorted(r["id"] for r in fresh) == sorted(new)
    assert metric(srv, "engram_index_loads_total", 'source="snapshot"') == 1
    assert metric(srv, "engram_index_loads_total", 'source="database"') == 0
    check_load_histogram(srv, "snapshot", 1)
    check_load_histogram(srv, "database", 0)
    assert metric(srv, "engram_index_snapshots_rejected_total") == 0
    # 700 memories: the SQ8 kind, whose float rows are read from the snapshot, mapped
    assert metric(srv, "engram_index_rows_mapped_bytes") >= 670 * DIM * 4
    assert metric(srv, "engram_index_page_ins") >= 0
    # the four searches above re-ranked on float rows (SQ8: exact, no near-tie reading)
    assert metric(srv, "engram_index_searches") >= 4
    assert metric(srv, "engram_index_rows_read") >= 10
    assert 0 <= metric(srv, "engram_index_tie_reads") <= metric(srv, "engram_index_rows_read")
    m = re.search(r"loaded from its snapshot, (\d+) memories, (\d+) changes replayed",
                  srv.log_text())
    assert m, srv.log_text()[-3000:]
    assert (int(m.group(1)), int(m.group(2))) == (670, 50 + 1 + 20)


def test_damaged_snapshot_is_rebuilt_from_the_database(engramd):
    dsn = new_database("snapbad")
    srv = engramd(dsn, extra=["--index-snapshot-interval-s", "1"])
    tid, key = srv.create_tenant()
    with srv.client(key=key) as c:
        store(c, structured_vectors(300, DIM, seed=23))
        assert len(index_ids(c, 1000)) == 300
    srv.stop()
    (path,) = snapshot_files(srv, tid)
    with open(path, "r+b") as f:
        # one bit of one stored id (the ids follow the 128-byte header): an index that
        # trusted the file would return an id the database does not have
        f.seek(128 + 8 * 5 + 1)
        b = f.read(1)
        f.seek(128 + 8 * 5 + 1)
        f.write(bytes([b[0] ^ 0x10]))
    srv.start()
    with srv.client(key=key) as c:
        assert index_ids(c, 1000) == db_ids(dsn, tid)
    assert metric(srv, "engram_index_snapshots_rejected_total") == 1
    assert metric(srv, "engram_index_loads_total", 'source="database"') == 1
    assert metric(srv, "engram_index_loads_total", 'source="snapshot"') == 0
    check_load_histogram(srv, "database", 1)
    check_load_histogram(srv, "snapshot", 0)
    assert "not used: corrupt" in srv.log_text()
    # the rebuilt index is snapshotted again, and the next start uses it
    wait_metric(srv, "engram_index_snapshots_written_total", lambda v: v >= 1, "at least 1",
                default=0.0)
    srv.restart()
    with srv.client(key=key) as c:
        assert index_ids(c, 1000) == db_ids(dsn, tid)
    assert metric(srv, "engram_index_loads_total", 'source="snapshot"') == 1
    srv.stop()
    # a snapshot of an earlier format (the version field of a format 3 file, as every
    # release before issue 34 wrote): refused as another format, never read; rebuilt
    with open(path, "r+b") as f:
        f.seek(8)
        f.write((3).to_bytes(4, "little"))
    srv.start()
    with srv.client(key=key) as c:
        assert index_ids(c, 1000) == db_ids(dsn, tid)
    assert metric(srv, "engram_index_snapshots_rejected_total") == 1
    assert metric(srv, "engram_index_loads_total", 'source="database"') == 1
    assert "not used: written for another dimension or format" in srv.log_text()


def test_snapshot_older_than_the_change_log_is_rebuilt(engramd):
    dsn = new_database("snapold")
    srv = engramd(dsn)
    other = engramd(dsn, extra=["--secret-file", srv.data_dir + "/secret.key"], start=False)
    tid, key = srv.create_tenant()
    with srv.client(key=key) as c:
        ids = store(c, structured_vectors(200, DIM, seed=24))
        assert len(index_ids(c, 1000)) == 200
    srv.stop()
    other.start()
    with other.client(key=key) as c:
        c.call("memory.delete", ids=ids[:30])
    other.stop()
    # the change log forgets everything older than an hour
    psql(dsn, "UPDATE memory_changes SET committed_at = now() - interval '2 hours'")
    assert int(psql(dsn, "SELECT engram_prune_changes(1, 100000)")) > 0
    assert psql(dsn, f"SELECT count(*) FROM memory_changes WHERE tenant_id = {tid}") == "0"
    srv.start()
    with srv.client(key=key) as c:
        got = index_ids(c, 1000)
    assert got == db_ids(dsn, tid) and len(got) == 170
    assert metric(srv, "engram_index_snapshots_rejected_total") == 1
    assert "no longer in the change log" in srv.log_text()


def test_snapshot_ahead_of_the_database_is_rebuilt(engramd):
    dsn = new_database("snapahead")
    srv = engramd(dsn)
    tid, key = srv.create_tenant()
    with srv.client(key=key) as c:
        ids = store(c, structured_vectors(120, DIM, seed=25))
        assert len(index_ids(c, 1000)) == 120
    srv.stop()
    # as if the database were restored from a backup taken before the last changes
    psql(dsn, f"DELETE FROM memories WHERE tenant_id = {tid} AND id >= {ids[100]};"
              f"UPDATE tenants SET change_seq = change_seq - 1 WHERE id = {tid}")
    srv.start()
    with srv.client(key=key) as c:
        got = index_ids(c, 1000)
    assert got == db_ids(dsn, tid) and len(got) == 100
    assert metric(srv, "engram_index_snapshots_rejected_total") == 1
    assert "only reaches" in srv.log_text()


def test_snapshots_of_another_database_are_never_used(engramd):
    dsn1, dsn2 = new_database("snapdb1"), new_database("snapdb2")
    first = engramd(dsn1)
    tid1, key1 = first.create_tenant(name="same-name")
    with first.client(key=key1) as c:
        store(c, structured_vectors(80, DIM, seed=26))
        assert len(index_ids(c, 1000)) == 80
    first.stop()
    assert len(snapshot_files(first, tid1)) == 1
    # the same data directory, another database whose first tenant has the same id
    second = engramd(dsn2, data_dir=first.data_dir)
    tid2, key2 = second.create_tenant(name="same-name")
    assert tid2 == tid1
    with second.client(key=key2) as c:
        store(c, structured_vectors(30, DIM, seed=27))
        assert index_ids(c, 1000) == db_ids(dsn2, tid2)
    assert metric(second, "engram_index_loads_total", 'source="snapshot"') == 0
    second.stop()
    assert len(glob.glob(os.path.join(first.data_dir, "index", "*"))) == 2


def test_killed_server_restarts_from_its_periodic_snapshot(engramd):
    dsn = new_database("snapkill")
    srv = engramd(dsn, extra=["--index-snapshot-interval-s", "1"])
    tid, key = srv.create_tenant()
    with srv.client(key=key) as c:
        ids = store(c, structured_vectors(150, DIM, seed=28))
        assert len(index_ids(c, 1000)) == 150
    wait_metric(srv, "engram_index_snapshots_written_total", lambda v: v >= 1, "at least 1",
                default=0.0)
    with srv.client(key=key) as c:
        ids += store(c, structured_vectors(40, DIM, seed=29), start=150)
        c.call("memory.delete", ids=ids[:5])
    srv.kill()  # no shutdown snapshot: the periodic one plus the change log
    srv.start()
    with srv.client(key=key) as c:
        got = index_ids(c, 1000)
    assert got == db_ids(dsn, tid) and len(got) == 185
    assert metric(srv, "engram_index_loads_total", 'source="snapshot"') == 1


def test_least_recently_used_indexes_are_evicted_under_the_budget(engramd):
    dsn = new_database("evict")
    srv = engramd(dsn, extra=["--index-memory-mb", "1"])
    tenants = []
    for t in range(6):
        tid, key = srv.create_tenant()
        vecs = structured_vectors(150, DIM, seed=40 + t)
        with srv.client(key=key) as c:
            ids = store(c, vecs)
            assert index_ids(c, 1000) == sorted(ids)
        tenants.append((tid, key, vecs, ids))
    wait_metric(srv, "engram_index_evictions_total", lambda v: v >= 3, "at least 3",
                default=0.0)
    wait_metric(srv, "engram_index_bytes", lambda v: v <= 1 << 20, "within the 1 MiB budget",
                default=0.0)
    # every tenant still answers exactly, evicted ones from their snapshots
    for rnd in range(2):
        for tid, key, vecs, ids in tenants:
            with srv.client(key=key) as c:
                if rnd == 1:  # a write to an evicted index is not lost either
                    ids.append(c.call("memory.store", content="late", type="fact",
                                      importance=0.5, embedding=vec_bin(vecs[0]))["id"])
                for i in (0, 77, 149):
                    res = c.call("memory.search", embedding=vec_bin(vecs[i]), top_k=1,
                                 similarity_weight=1.0)["results"]
                    assert res[0]["id"] in ((ids[i], ids[-1]) if i == 0 and rnd else (ids[i],))
                assert index_ids(c, 1000) == db_ids(dsn, tid)
    assert metric(srv, "engram_index_loads_total", 'source="snapshot"') >= 3
    assert metric(srv, "engram_index_snapshots_rejected_total") == 0


def test_tenants_never_loaded_leave_the_registry(engramd):
    """A store to a tenant whose index is not loaded puts the tenant in the index registry
    without loading it; unused for TENANT_RETIRE_NS (15 s) it is retired from it, so that an
    idle tenant costs the process nothing (bench/README, many tenants). A loaded index is not
    retired (only evicted under the budget), and a retired tenant's next search builds its
    index with every memory, those stored before and after the retirement."""
    dsn = new_database("retire")
    srv = engramd(dsn)
    stored = []
    for t in range(3):
        tid, key = srv.create_tenant()
        vecs = structured_vectors(40, DIM, seed=70 + t)
        with srv.client(key=key) as c:
            ids = store(c, vecs)
            assert c.call("memory.stats")["index"].get("loaded") is False
        stored.append((tid, key, vecs, ids))
    tid, key = srv.create_tenant()
    with srv.client(key=key) as c:
        loaded_ids = store(c, structured_vectors(40, DIM, seed=80))
        assert index_ids(c, 100) == sorted(loaded_ids)  # loaded by the search
    assert metric(srv, "engram_index_tenants_known") == 4
    wait_metric(srv, "engram_index_tenants_retired_total", lambda v: v == 3, "3", default=0.0,
                timeout=45.0)
    assert metric(srv, "engram_index_tenants_known") == 1  # the loaded one stays
    for n, (tid, key, vecs, ids) in enumerate(stored):
        with srv.client(key=key) as c:
            if n == 0:  # a write after the retirement, before the first load
                ids.append(c.call("memory.store", content="late", type="fact", importance=0.5,
                                  embedding=vec_bin(vecs[1]))["id"])
            assert index_ids(c, 100) == sorted(ids) == db_ids(dsn, tid)
            res = c.call("memory.search", embedding=vec_bin(vecs[7]), top_k=1,
                         similarity_weight=1.0)["results"]
            assert res[0]["id"] == ids[7]
    assert metric(srv, "engram_index_tenants_known") == 4
    assert metric(srv, "engram_index_change_floors") == 0  # no pg_read_dsn: none kept


def test_typed_metadata_filters_after_a_rebuild_from_the_database(engramd):
    """Tags come three ways: from a store's request, from an update's row and, when an index
    is built from PostgreSQL, from the metadata fields the loader selects. Filters on every
    typed field give the same memories through each."""
    dsn = new_database("tagsdb")
    srv = engramd(dsn)
    tid, key = srv.create_tenant()
    vecs = structured_vectors(120, DIM, seed=31)

    def md(i):
        return {"tokens": [f"t{i % 3}", "ETH"], "chains": [i % 4, 8453],
                "protocols": [f"p{i % 5}"], "strategy_id": f"s{i % 2}",
                "attrs": {"key": f"k{i}"}}

    with srv.client(key=key) as c:
        ids = c.call("memory.store_batch", memories=[
            {"content": f"m {i}", "type": "fact", "importance": 0.5, "embedding": vec_bin(v),
             "metadata": md(i)} for i, v in enumerate(vecs)])["ids"]
    want = {i: md(i) for i in range(120)}
    filters = [("tokens", ["t1"]), ("tokens", ["ETH"]), ("chains", [2]), ("chains", [99]),
               ("chains", [8453]), ("protocols", ["p3"]), ("protocols", ["moved"]),
               ("strategy_id", "s1"), ("strategy_id", "moved")]

    def expected(field, value):
        if field == "strategy_id":
            return sorted(ids[i] for i, m in want.items() if m.get(field) == value)
        return sorted(ids[i] for i, m in want.items() if set(m.get(field, [])) & set(value))

    def check():
        with srv.client(key=key) as c:
            for field, value in filters:
                got = c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=200,
                             **{field: value})["results"]
                assert sorted(r["id"] for r in got) == expected(field, value), (field, value)

    check()  # the index built on first use, from the database
    assert metric(srv, "engram_index_loads_total", 'source="database"') == 1
    # one memory moves to other values through an update of the loaded index
    moved = {"chains": [99], "protocols": ["moved"], "strategy_id": "moved"}
    with srv.client(key=key) as c:
        c.call("memory.update", id=ids[7], metadata=moved)
    want[7] = moved
    check()
    srv.stop()
    for path in snapshot_files(srv, tid):
        os.unlink(path)  # the next start builds it from the database again
    srv.start()
    check()
    assert metric(srv, "engram_index_loads_total", 'source="database"') == 1
