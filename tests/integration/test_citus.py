"""Engram on a Citus cluster (meson suite citus, ENGRAM_TEST_CITUS=1: harness.CitusCluster):
the schema is distributed by tenant, and a store is one local transaction on the worker
holding its tenant, never a two-phase commit across workers."""
import re
import threading


from harness import CITUS, citus_cluster, structured_vectors, vec_bin


def _db(server):
    return re.search(r"\bdbname=(\S+)", server.dsn).group(1)


def _coord(server, sql):
    return citus_cluster().sql(0, sql, dbname=_db(server))


def _worker_port(server, tenant_id):
    return int(_coord(server, "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = "
                              f"get_shard_id_for_distribution_column('tenants', {tenant_id})"))


def test_schema_is_distributed_by_tenant(server):
    assert CITUS, "run with ENGRAM_TEST_CITUS=1 (meson suite citus)"
    server.create_tenant()  # engramd has migrated by now
    kinds = dict(line.split("|") for line in _coord(
        server, "SELECT logicalrelid::text, partmethod FROM pg_dist_partition").splitlines())
    assert kinds["tenants"] == "h" and kinds["memories"] == "h"
    assert kinds["engram_instance"] == "n"  # a reference table
    # every table with tenant_id is co-located with tenants
    assert _coord(server, "SELECT count(DISTINCT colocationid) FROM pg_dist_partition "
                          "WHERE partmethod = 'h'") == "1"
    # the store function runs where the tenant lives, by p_tenant
    assert _coord(server, "SELECT distribution_argument_index FROM pg_dist_object "
                          "WHERE objid = 'engram_memory_store_batch'::regproc") == "0"


def test_stores_never_span_two_workers(server):
    assert CITUS, "run with ENGRAM_TEST_CITUS=1 (meson suite citus)"
    # records of two-phase commits stay until we look (no recovery sweeps them meanwhile)
    citus_cluster().sql(0, "ALTER SYSTEM SET citus.recover_2pc_interval = -1")
    citus_cluster().sql(0, "SELECT pg_reload_conf()")
    by_worker = {}
    for _ in range(40):
        tid, key = server.create_tenant()
        by_worker.setdefault(_worker_port(server, tid), []).append((tid, key))
        if len(by_worker) == 2 and all(len(v) >= 2 for v in by_worker.values()):
            break
    assert len(by_worker) == 2, f"tenants on one worker only: {by_worker}"
    tenants = [t for v in by_worker.values() for t in v[:2]]
    _coord(server, "DELETE FROM pg_dist_transaction")
    vecs = structured_vectors(4 * 30, 384, seed=5)
    stored = {}
    errors = []

    def writer(i, key):
        try:
            with server.client(key=key) as c:
                ids = []
                for j in range(25):
                    ids.append(c.call("memory.store", content=f"t{i} m{j}", type="fact",
                                      importance=0.5, embedding=vec_bin(vecs[i * 30 + j]))["id"])
                ids += c.call("memory.store_batch", memories=[
                    {"content": f"t{i} b{j}", "type": "fact", "importance": 0.5,
                     "embedding": vec_bin(vecs[i * 30 + 25 + j])} for j in range(5)])["ids"]
                stored[i] = ids
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i, k)) for i, (_, k) in enumerate(tenants)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert _coord(server, "SELECT count(*) FROM pg_dist_transaction") == "0"
    # every acknowledged memory is there and found by its own vector
    for i, (tid, key) in enumerate(tenants):
        assert len(stored[i]) == 30
        with server.client(key=key) as c:
            got = c.call("memory.get", ids=stored[i])["memories"]
            assert len(got) == 30
            res = c.call("memory.search", embedding=vec_bin(vecs[i * 30]), top_k=5)["results"]
            assert res and res[0]["id"] == stored[i][0]
    # the check can fail: a write to tenants on both workers is a two-phase commit
    a, b = (v[0][0] for v in by_worker.values())
    _coord(server, f"UPDATE tenants SET updated_at = updated_at WHERE id IN ({a}, {b})")
    assert int(_coord(server, "SELECT count(*) FROM pg_dist_transaction")) > 0
