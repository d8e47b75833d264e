"""Approximate indexes whose float rows are mapped from their snapshot (issue 34), end to end.

A tenant from index_ann_min memories on answers from its int8 and sign codes and reads float
rows from its snapshot file, mapped, only for near-ties. These tests check that:
- a memory.store_batch that takes an index into the approximate tier answers once the
  index is measured, so the searches after it run at the measured depth, and data that
  defeats the codes is answered exactly from the first search; an index built from
  PostgreSQL is measured before the searches waiting for it run;
- across kill -9, restart and eviction the answers stay right (the same as a brute force
  over the database's vectors, within the codes' error);
- a snapshot whose rows were damaged or cut short while the server was stopped is never
  served: it is refused (checksum, length) and the index is rebuilt from PostgreSQL.
"""
import glob
import os
import subprocess

import numpy as np

from harness import metric, new_database, psql, structured_vectors, vec_bin, wait_log, wait_metric

DIM = 128
N = 2500
ANN_MIN = ["--index-ann-min", "1024"]


def store(c, vecs, batch=500):
    ids = []
    for k in range(0, len(vecs), batch):
        mems = [{"content": f"m{k + i}", "type": "fact", "importance": 0.5,
                 "embedding": vec_bin(v)} for i, v in enumerate(vecs[k:k + batch])]
        ids += c.call("memory.store_batch", memories=mems)["ids"]
    return ids


def data(n, seed, queries=20):
    """n stored vectors and queries from the same distribution (structured_vectors draws its
    latent map from the seed: queries of another seed would be another distribution)."""
    x = structured_vectors(n + queries, DIM, seed=seed)
    return x[:n], x[n:]


def iid_vectors(n, seed):
    x = np.random.default_rng(seed).standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def snapshot_file(srv, tid):
    (path,) = glob.glob(os.path.join(srv.data_dir, "index", "*", f"{tid}.idx"))
    return path


def db_vectors(dsn, tid):
    """ids and vectors of the tenant's memories in PostgreSQL."""
    out = psql(dsn, f"SELECT id, encode(embedding, 'hex') FROM memories "
                    f"WHERE tenant_id = {tid} ORDER BY id")
    ids, vecs = [], []
    for line in out.splitlines():
        i, v = line.split("|")
        ids.append(int(i))
        vecs.append(np.frombuffer(bytes.fromhex(v), dtype="<f4").astype(np.float64))
    vecs = np.array(vecs)
    return ids, vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def check_answers(c, ids, vecs, queries):
    """Searches against a brute force over (ids, vecs): recall@10 at least 0.97, no id the
    database does not hold, every similarity within the codes' error (0.01) of the exact
    cosine, and each stored vector searched for finds itself first."""
    pos = {m: i for i, m in enumerate(ids)}
    found = 0
    for q in queries:
        qn = q / np.linalg.norm(q)
        exact = vecs @ qn
        truth = {ids[i] for i in np.argsort(-exact)[:10]}
        res = c.call("memory.search", embedding=vec_bin(q), top_k=10,
                     similarity_weight=1.0)["results"]
        assert len(res) == 10
        for r in res:
            assert r["id"] in pos, f"id {r['id']} is not in the database"
            assert abs(r["similarity"] - exact[pos[r["id"]]]) <= 0.01, r
        found += len(truth & {r["id"] for r in res})
    assert found / (10 * len(queries)) >= 0.97, found
    for i in (0, len(ids) // 2, len(ids) - 1):
        res = c.call("memory.search", embedding=vec_bin(vecs[i]), top_k=1,
                     similarity_weight=1.0)["results"]
        assert res[0]["id"] == ids[i]


def check_rows_dropped(srv):
    """The mapped rows in RAM (engram_index_rows_resident_bytes, measured by the housekeeping
    each second) fall to a quarter of the mapped bytes or less. On tmpfs the file's pages are
    the file: nothing can drop them, and the check is only that they are counted."""
    fs = subprocess.run(["stat", "-f", "-c", "%T", srv.data_dir], capture_output=True,
                        text=True).stdout.strip()
    mapped = metric(srv, "engram_index_rows_mapped_bytes")
    limit = mapped if fs == "tmpfs" else mapped / 4
    wait_metric(srv, "engram_index_rows_resident_bytes", lambda v: 0 < v <= limit or
                (v == 0 and fs != "tmpfs"), f"at most {limit:.0f} ({fs})", default=0.0)


def index_stats(c):
    return c.call("memory.stats")["index"]


def test_store_batch_answers_once_the_index_is_measured(engramd):
    srv = engramd(new_database("settle"), extra=ANN_MIN)
    tid, key = srv.create_tenant(embedding={"provider": "builtin", "dim": DIM})
    tid2, key2 = srv.create_tenant(embedding={"provider": "builtin", "dim": DIM})
    with srv.client(key=key) as c:
        # load the (empty) index first, so that the batches are applied to it
        c.call("memory.search", embedding=vec_bin(structured_vectors(1, DIM, seed=9)[0]), top_k=1)
        vecs, queries = data(N, 1)
        ids = []
        for k in range(0, N, 500):
            ids += store(c, vecs[k:k + 500])
            idx = index_stats(c)  # right after the answer: no wait for the recall monitor
            if k + 500 >= 1024:
                assert idx["kind"] == "ann", idx
                assert idx["recall_estimate"] is not None and idx["candidate_depth"] > 0, idx
                assert idx["exact_fallback"] is False
        check_answers(c, ids, vecs.astype(np.float64), queries)
    wait_log(srv, f"tenant {tid}: index settled after a bulk build")
    # data that defeats the codes (i.i.d. vectors): exact scans from the first search
    with srv.client(key=key2) as c:
        c.call("memory.search", embedding=vec_bin(iid_vectors(1, 9)[0]), top_k=1)
        vecs = iid_vectors(N, 3)
        ids = store(c, vecs)
        idx = index_stats(c)
        assert idx["kind"] == "ann" and idx["exact_fallback"] is True, idx
        for q in iid_vectors(10, 4):
            exact = vecs.astype(np.float64) @ (q / np.linalg.norm(q))
            res = c.call("memory.search", embedding=vec_bin(q), top_k=10,
                         similarity_weight=1.0)["results"]
            assert [r["id"] for r in res] == [ids[i] for i in np.argsort(-exact)[:10]]


def test_index_built_from_the_database_is_measured_before_it_answers(engramd):
    dsn = new_database("settledb")
    srv = engramd(dsn, extra=ANN_MIN)
    tid, key = srv.create_tenant(embedding={"provider": "builtin", "dim": DIM})
    with srv.client(key=key) as c:
        vecs, queries = data(N, 5)
        ids = store(c, vecs)  # the index is not loaded: only PostgreSQL has them
        assert index_stats(c)["loaded"] is False
        c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=1)  # loads from PostgreSQL
        idx = index_stats(c)
        assert idx["kind"] == "ann" and idx["recall_estimate"] is not None, idx
        assert idx["candidate_depth"] > 0
        check_answers(c, ids, vecs.astype(np.float64), queries)
    assert metric(srv, "engram_index_loads_total", 'source="database"') == 1
    wait_log(srv, f"tenant {tid}: index settled after a bulk build")


def test_mapped_rows_across_kill_restart_and_damaged_files(engramd):
    dsn = new_database("rowsmap")
    srv = engramd(dsn, extra=ANN_MIN + ["--index-snapshot-interval-s", "1"])
    tid, key = srv.create_tenant(embedding={"provider": "builtin", "dim": DIM})
    vecs, queries = data(N + 300, 7)
    with srv.client(key=key) as c:
        c.call("memory.search", embedding=vec_bin(queries[0]), top_k=1)
        store(c, vecs[:N])
    wait_metric(srv, "engram_index_snapshots_written_total", lambda v: v >= 1, "at least 1",
                default=0.0)
    # the snapshot's rows are mapped: the heap holds the codes only, and the rows the save
    # left in RAM are dropped (searches read a row only for a near-tie)
    wait_metric(srv, "engram_index_rows_mapped_bytes", lambda v: v >= N * DIM * 4,
                "all rows mapped", default=0.0)
    check_rows_dropped(srv)
    with srv.client(key=key) as c:
        check_answers(c, *db_vectors(dsn, tid), queries)
        # changes after the snapshot: on the heap, then in the change log
        c.call("memory.delete", ids=db_vectors(dsn, tid)[0][:40])
        store(c, vecs[N:])
    srv.kill()  # kill -9: no shutdown snapshot; the periodic one plus the change log
    srv.start()
    with srv.client(key=key) as c:
        ids, vecs = db_vectors(dsn, tid)
        assert len(ids) == N - 40 + 300
        check_answers(c, ids, vecs, queries)
        assert index_stats(c)["vectors"] == len(ids)
    assert metric(srv, "engram_index_loads_total", 'source="snapshot"') == 1
    check_rows_dropped(srv)  # the load read every page (its checksum): dropped after it
    srv.stop()  # writes a snapshot of everything

    path = snapshot_file(srv, tid)
    with open(path, "r+b") as f:
        head = f.read(128)
        rows_off = int.from_bytes(head[96:104], "little")
        rows_len = int.from_bytes(head[104:112], "little")
        assert rows_off % 4096 == 0 and rows_len >= len(ids) * DIM * 4
        # one float of a row in the middle (a sign bit: a row that points elsewhere)
        at = rows_off + (len(ids) // 2) * DIM * 4 + 3
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x80]))
    srv.start()
    with srv.client(key=key) as c:
        check_answers(c, ids, vecs, queries)
    assert metric(srv, "engram_index_snapshots_rejected_total") == 1
    assert metric(srv, "engram_index_loads_total", 'source="database"') == 1
    assert "not used: corrupt" in srv.log_text()
    srv.stop()

    # a torn tail: the file cut inside its rows (as a copy or a disk that lost its end)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 4096 - 100)
    srv.start()
    with srv.client(key=key) as c:
        check_answers(c, ids, vecs, queries)
    assert metric(srv, "engram_index_snapshots_rejected_total") == 1
    assert metric(srv, "engram_index_loads_total", 'source="database"') == 1
    srv.stop()

    # a missing file: rebuilt from PostgreSQL too
    os.unlink(path)
    srv.start()
    with srv.client(key=key) as c:
        check_answers(c, ids, vecs, queries)
    assert metric(srv, "engram_index_loads_total", 'source="database"') == 1


def test_evicted_approximate_indexes_come_back_from_their_mapped_snapshots(engramd):
    dsn = new_database("rowsevict")
    # a budget that holds one tenant's index (1.1 MiB with its metadata and the rows in use)
    # but not four: the one just searched stays while the others are evicted (at 1 MiB it
    # could be evicted between its search and its memory.stats)
    srv = engramd(dsn, extra=ANN_MIN + ["--index-memory-mb", "2"])
    tenants = []
    for t in range(4):
        tid, key = srv.create_tenant(embedding={"provider": "builtin", "dim": DIM})
        vecs, queries = data(N + 10, 60 + t, queries=10)
        with srv.client(key=key) as c:
            c.call("memory.search", embedding=vec_bin(queries[0]), top_k=1)
            store(c, vecs[:N])
        tenants.append((tid, key, vecs, queries))
    wait_metric(srv, "engram_index_evictions_total", lambda v: v >= 2, "at least 2",
                default=0.0)
    for rnd in range(2):
        for tid, key, vecs, queries in tenants:
            with srv.client(key=key) as c:
                if rnd == 1:  # a write to an evicted index is not lost
                    store(c, vecs[N:])
                ids, dbv = db_vectors(dsn, tid)
                check_answers(c, ids, dbv, queries)
                assert index_stats(c)["vectors"] == len(ids)
    assert metric(srv, "engram_index_loads_total", 'source="snapshot"') >= 2
    assert metric(srv, "engram_index_snapshots_rejected_total") == 0


def test_rows_in_ram_are_held_to_index_rows_ram_percent(engramd):
    """index_rows_ram_percent: past it, the housekeeping drops the mapped rows' pages from
    RAM (those no search read in the last second first); the answers stay right and the
    rows read back are page-ins. Every candidate is re-ranked on its row here (tie margin
    0), so the searches read far more pages than the 3 % allowed."""
    dsn = new_database("rowscap")
    srv = engramd(dsn, extra=ANN_MIN + ["--index-snapshot-interval-s", "1",
                                        "--index-rows-ram-percent", "3",
                                        "--index-tie-margin", "0"])
    tid, key = srv.create_tenant(embedding={"provider": "builtin", "dim": DIM})
    vecs, queries = data(N, 11, queries=300)  # queries of the data's distribution, not stored
    with srv.client(key=key) as c:
        c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=1)
        store(c, vecs)
    mapped = wait_metric(srv, "engram_index_rows_mapped_bytes", lambda v: v >= N * DIM * 4,
                         "all rows mapped", default=0.0)
    cap = mapped * 0.03
    fs = subprocess.run(["stat", "-f", "-c", "%T", srv.data_dir], capture_output=True,
                        text=True).stdout.strip()
    ids, dbv = db_vectors(dsn, tid)
    with srv.client(key=key) as c:
        for rnd in range(3):
            check_answers(c, ids, dbv, queries[rnd * 100:(rnd + 1) * 100])
            read = metric(srv, "engram_index_rows_read")
            assert read > N // 4 * (rnd + 1), read  # many rows a search: pages beyond the cap
        dropped = wait_metric(srv, "engram_index_rows_dropped_bytes_total", lambda v: v > cap,
                              f"more than the cap ({cap:.0f})", default=0.0)
        if fs != "tmpfs":  # on tmpfs a file's pages are the file: asked to go, they stay
            wait_metric(srv, "engram_index_rows_resident_bytes", lambda v: v <= cap,
                        f"at most {cap:.0f}")
            assert metric(srv, "engram_index_page_ins") > 0
        check_answers(c, ids, dbv, queries[:100])  # the rows read back: the same answers
    assert metric(srv, "engram_index_rows_dropped_bytes_total") >= dropped
