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
