"""Engram on a Citus cluster (meson suite citus, ENGRAM_TEST_CITUS=1: harness.CitusCluster):
the schema is distributed by tenant, and a store is one local transaction on the worker
holding its tenant, never a two-phase commit across workers."""
import json
import os
import random
import re
import string
import subprocess
import threading
import time

import pytest

from harness import (BIN, CITUS, PG_BINDIR, PG_DSN, citus_cluster, keyed_burst, metric,
                     new_database, psql, running_pair, store_retrying, structured_vectors,
                     vec_bin, wait_for, wait_log, with_dbname)
from rpc import RpcError
from test_result_schemas import result_schema, validator


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
    """Stores of 8 tenants, 4 on each worker, from 8 clients one at a time, then 20 at once
    each, then with idempotency keys (repeats and a conflict among them), go through the
    store groups (issue 35 item 2): groups form, some hold several tenants of one worker,
    none is a two-phase commit, and keyed stores replay and conflict as alone."""
    assert CITUS, "run with ENGRAM_TEST_CITUS=1 (meson suite citus)"
    # records of two-phase commits stay until we look (no recovery sweeps them meanwhile)
    citus_cluster().sql(0, "ALTER SYSTEM SET citus.recover_2pc_interval = -1")
    citus_cluster().sql(0, "SELECT pg_reload_conf()")
    by_worker = {}
    for _ in range(60):
        tid, key = server.create_tenant()
        by_worker.setdefault(_worker_port(server, tid), []).append((tid, key))
        if len(by_worker) == 2 and all(len(v) >= 4 for v in by_worker.values()):
            break
    assert len(by_worker) == 2 and all(len(v) >= 4 for v in by_worker.values()), by_worker
    tenants = [t for v in by_worker.values() for t in v[:4]]
    tenants_all = _coord(server, "SELECT id FROM tenants").split()
    _coord(server, "DELETE FROM pg_dist_transaction")
    vecs = structured_vectors(8 * 30, 384, seed=5)
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

    def piped(i, key):
        """20 stores sent at once, answered in any order: they queue behind each other in
        engramd, where the store groups form."""
        try:
            with server.client(key=key) as c:
                sent = [c.send("memory.store", {"content": f"t{i} p{j}", "type": "fact",
                                                "importance": 0.5}) for j in range(20)]
                for msgid in sent:
                    err, res = c.wait(msgid)
                    assert err is None, err
                    more.setdefault(i, []).append(res["id"])
        except Exception as e:  # reported below
            errors.append(e)

    def keyed(i, key):
        """10 stores with idempotency keys (as the client libraries send), each sent twice in
        one burst, and one more under a used key with other content: the groups take keyed
        stores too, a repeat in the same or the next group is a replay of the same memory, a
        reused key with other content is refused alone (its group's others commit)."""
        try:
            with server.client(key=key) as c:
                keyed_ids[i] = keyed_burst(c, [f"t{i} k{j}" for j in range(10)],
                                           [f"k{i}-{j}" for j in range(10)])
        except Exception as e:  # reported below
            errors.append(e)

    more, keyed_ids = {}, {}
    batches = metric(server, "engram_group_commit_batches_total")
    requests = metric(server, "engram_group_commit_requests_total")
    mixed = metric(server, "engram_group_commit_tenants_total")
    for phase in (writer, piped, keyed):
        threads = [threading.Thread(target=phase, args=(i, k))
                   for i, (_, k) in enumerate(tenants)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
    assert _coord(server, "SELECT count(*) FROM pg_dist_transaction") == "0"
    # the stores went through the store groups, and some groups held several requests (of
    # one worker's tenants: the empty pg_dist_transaction above)
    batches = metric(server, "engram_group_commit_batches_total") - batches
    requests = metric(server, "engram_group_commit_requests_total") - requests
    mixed = metric(server, "engram_group_commit_tenants_total") - mixed
    assert requests >= 8 * 67, (batches, requests)  # each store and store_batch
    assert batches < requests, (batches, requests)
    assert mixed > batches, (batches, mixed)  # some held two tenants (of one worker)
    # engramd places a tenant by PostgreSQL's hashint8 in the shard ranges
    # (storage/citusmap.c): the assumption holds for Citus' own placement of every tenant
    assert _coord(server, "SELECT count(*) FILTER (WHERE hashint8(t.id) BETWEEN "
                          "s.shardminvalue::int AND s.shardmaxvalue::int), count(*) FROM tenants t "
                          "JOIN pg_dist_shard s ON s.shardid = "
                          "get_shard_id_for_distribution_column('tenants', t.id)") == \
        f"{len(tenants_all)}|{len(tenants_all)}"
    # every acknowledged memory is there and found by its own vector
    for i, (tid, key) in enumerate(tenants):
        assert len(more[i]) == 20 and len(set(more[i])) == 20
        with server.client(key=key) as c:
            assert len(c.call("memory.get", ids=more[i])["memories"]) == 20
            got = c.call("memory.get", ids=keyed_ids[i])["memories"]
            assert [m["content"] for m in got] == [f"t{i} k{j}" for j in range(10)]
            # 30 + 20 + 10 memories: no repeat or refused store left a row
            assert c.call("memory.stats")["total"] == 60
        with server.client(key=key) as c:
            got = c.call("memory.get", ids=stored[i])["memories"]
            assert len(got) == 30
            res = c.call("memory.search", embedding=vec_bin(vecs[i * 30]), top_k=5)["results"]
            assert res and res[0]["id"] == stored[i][0]
    # the check can fail: a write to tenants on both workers is a two-phase commit
    a, b = (v[0][0] for v in by_worker.values())
    _coord(server, f"UPDATE tenants SET updated_at = updated_at WHERE id IN ({a}, {b})")
    assert int(_coord(server, "SELECT count(*) FROM pg_dist_transaction")) > 0


def _placement(server, tenant_id):
    """(worker port, whether the tenant's shard holds it alone) of tenant_id."""
    port, alone = _coord(server, "SELECT p.nodeport, s.shardminvalue = s.shardmaxvalue FROM "
                                 "pg_dist_shard_placement p JOIN pg_dist_shard s USING (shardid) "
                                 "WHERE s.shardid = get_shard_id_for_distribution_column("
                                 f"'tenants', {tenant_id})").split("|")
    return int(port), alone == "t"


def _workers(server):
    return [int(p) for p in _coord(server, "SELECT nodeport FROM pg_dist_node WHERE groupid <> 0 "
                                           "ORDER BY nodeid").split()]


def test_tenant_moved_while_eight_clients_store():
    """admin.tenant.move isolates a tenant into its own shard group and moves it to the other
    worker while 8 clients (over two engramd processes) store to it and to other tenants:
    no acknowledged write is lost or duplicated, and both processes' searches find every
    acknowledged memory afterwards."""
    assert CITUS, "run with ENGRAM_TEST_CITUS=1 (meson suite citus)"
    with running_pair("move") as (a, b, _):
        moved, moved_key = a.create_tenant(tier="premium")
        others = [a.create_tenant(tier="premium") for _ in range(2)]
        source, alone = _placement(a, moved)
        assert not alone, "a new tenant shares its shard group"
        target = next(p for p in _workers(a) if p != source)
        # 8 writers: 4 on the moved tenant, 2 on each other tenant, half through each process
        plan = [(moved, moved_key)] * 4 + [others[0]] * 2 + [others[1]] * 2
        vecs = structured_vectors(8 * 60, 384, seed=35)
        acked = {i: [] for i in range(len(plan))}
        errors = []
        retried = []
        done = threading.Event()

        def writer(i, key):
            srv = (a, b)[i % 2]
            try:
                with srv.client(key=key) as c:
                    j = 0
                    # until the move is over, and at least 20 stores each
                    while (not done.is_set() or j < 20) and j < 60:
                        args = dict(content=f"w{i} n{j}", type="fact", importance=0.5,
                                    embedding=vec_bin(vecs[i * 60 + j]),
                                    idempotency_key=f"w{i}-{j}")
                        # the switch at the end of the move: retried, same key
                        acked[i].append((store_retrying(c, args, retried, timeout=20), j))
                        j += 1
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(i, k[1]))
                   for i, k in enumerate(plan)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.5)  # the writers are under way
            with a.admin() as adm:
                res = adm.call("admin.tenant.move", tenant_id=moved, node=f"127.0.0.1:{target}")
        finally:
            done.set()
            for t in threads:
                t.join()
        assert not errors, errors
        print(f"move: {res['duration_ms']} ms; stores retried after unavailable: {len(retried)} "
              f"{sorted(set(retried))[:3]}; acknowledged: {sum(map(len, acked.values()))}")
        # the answers hold the result schema the OpenAPI document declares
        status, body = a.http_get("/v1/openapi.json")
        assert status == 200
        doc = json.loads(body)
        schema = validator(doc, result_schema(doc, "admin.tenant.move"))
        assert not list(schema.iter_errors(res)), res
        assert res["isolated"] is True and res["moved"] is True
        assert res["from"] == f"127.0.0.1:{source}" and res["node"] == f"127.0.0.1:{target}"
        assert _placement(a, moved) == (target, True)
        # the other tenants stayed where they were
        for tid, _ in others:
            assert _placement(a, tid)[0] in _workers(a)
        for i, (tid, key) in enumerate(plan):
            ids = [m for m, _ in acked[i]]
            assert len(ids) >= 20 and len(set(ids)) == len(ids)
        # per tenant: exactly the acknowledged memories, once each (the idempotency keys'
        # retries stored nothing twice)
        by_tenant = {}
        for i, (tid, _) in enumerate(plan):
            by_tenant.setdefault(tid, []).extend(acked[i])
        for tid, key in [(moved, moved_key)] + others:
            want = sorted(m for m, _ in by_tenant[tid])
            got = sorted(int(x) for x in _coord(
                a, f"SELECT id FROM memories WHERE tenant_id = {tid}").split())
            assert got == want, f"tenant {tid}: stored {len(got)}, acknowledged {len(want)}"
            # the tenant's counters agree with its rows (no statement skipped in the switch)
            assert _coord(a, f"SELECT memory_count || ' ' || memory_id_last || ' ' || change_seq "
                             f"FROM tenants WHERE id = {tid}") == \
                f"{len(want)} {max(want)} {len(want)}"
        # both processes' indexes find every acknowledged memory by its own vector
        for srv in (a, b):
            for i, (tid, key) in enumerate(plan):
                with srv.client(key=key) as c:
                    for mid, j in acked[i]:
                        hits = c.call("memory.search", embedding=vec_bin(vecs[i * 60 + j]),
                                      top_k=1, similarity_weight=1.0)["results"]
                        assert hits and hits[0]["id"] == mid, (srv.port, tid, mid)
        # moving it again to where it is changes nothing
        with a.admin() as adm:
            again = adm.call("admin.tenant.move", tenant_id=moved, node=f"127.0.0.1:{target}")
        assert not list(schema.iter_errors(again)), again
        assert again["isolated"] is False and again["moved"] is False
        assert again["shard_id"] == res["shard_id"]


def test_tenant_move_refuses_bad_arguments(server):
    assert CITUS, "run with ENGRAM_TEST_CITUS=1 (meson suite citus)"
    tid, _ = server.create_tenant()
    with server.admin() as adm:
        for node in ["nohost", ":5432", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000",
                     "127.0.0.1:54x"]:
            with pytest.raises(RpcError) as e:
                adm.call("admin.tenant.move", tenant_id=tid, node=node)
            assert e.value.code == "invalid_argument", node
        # not a worker of this cluster (the coordinator is not one either)
        coord = citus_cluster().port
        for node in ["127.0.0.1:1", f"127.0.0.1:{coord}"]:
            with pytest.raises(RpcError) as e:
                adm.call("admin.tenant.move", tenant_id=tid, node=node)
            assert e.value.code == "invalid_argument" and "not an active primary worker" in \
                e.value.message
        worker = _workers(server)[0]
        with pytest.raises(RpcError) as e:
            adm.call("admin.tenant.move", tenant_id=987654321, node=f"127.0.0.1:{worker}")
        assert e.value.code == "not_found"
        # sharing its shard group, a tenant moves only isolated
        port, alone = _placement(server, tid)
        assert not alone
        other = next(p for p in _workers(server) if p != port)
        with pytest.raises(RpcError) as e:
            adm.call("admin.tenant.move", tenant_id=tid, node=f"127.0.0.1:{other}",
                     isolate=False)
        assert e.value.code == "invalid_argument" and "shares its shard group" in e.value.message
        assert _placement(server, tid) == (port, False)


def _worker_dsn(dsn, port):
    return re.sub(r"\bport=\d+", f"port={port}", dsn)


def test_engramd_connected_to_a_worker(engramd):
    """Queries from any node: an engramd connected to a worker serves tenants of every
    worker, and its writes and another engramd's (on the coordinator) reach each other's
    loaded indexes by their announcements alone (change checks an hour apart): the listener
    of each follows the cluster's other nodes, the coordinator's admin announcements
    included. A worker whose coordinator has not applied the schema refuses to start."""
    assert CITUS, "run with ENGRAM_TEST_CITUS=1 (meson suite citus)"
    dsn = new_database("anynode")
    # nothing applied yet: an engramd on a worker does not migrate, and says where to
    bare = engramd(_worker_dsn(dsn, citus_cluster().port + 1), start=False)
    proc = subprocess.run([BIN, "--pg-dsn", bare.dsn, "--rpc-port", str(bare.port),
                           "--http-port", str(bare.http_port), "--data-dir", bare.data_dir],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "start this engramd against the coordinator first" in proc.stderr, proc.stderr
    slow = ["--change-poll-ms", "3600000"]
    a = engramd(dsn, extra=slow)
    b = engramd(_worker_dsn(dsn, citus_cluster().port + 1),
                extra=slow + ["--secret-file", a.data_dir + "/secret.key",
                              "--admin-key-file", a.admin_key_file])
    b.admin_key_file = a.admin_key_file
    assert "the database is a Citus worker" in b.log_text()
    # each follows the cluster's other nodes: the coordinator's engramd both workers, the
    # worker's engramd the coordinator (admin announcements) and the other worker
    port = citus_cluster().port
    for srv, own, others in ((a, port, (port + 1, port + 2)), (b, port + 1, (port, port + 2))):
        for p in others:
            wait_log(srv, re.compile(rf"following Citus node 127\.0\.0\.1:{p}$", re.M))
        assert not re.search(rf"following Citus node 127\.0\.0\.1:{own}$", srv.log_text(), re.M)
    # tenants on both workers
    tenants = {}
    for _ in range(40):
        tid, key = a.create_tenant()
        tenants.setdefault(_worker_port(a, tid), (tid, key))
        if len(tenants) == 2:
            break
    assert len(tenants) == 2, tenants
    vecs = structured_vectors(40, 384, seed=77)
    for n, (tid, key) in enumerate(tenants.values()):
        v = vecs[n * 20:(n + 1) * 20]
        with a.client(key=key) as ca, b.client(key=key) as cb:
            ca.call("memory.search", query="warm up")  # both indexes loaded before the writes
            cb.call("memory.search", query="warm up")
            through_b = [cb.call("memory.store", content=f"b{i}", type="fact", importance=0.5,
                                 embedding=vec_bin(v[i]))["id"] for i in range(10)]
            through_a = ca.call("memory.store_batch", memories=[
                {"content": f"a{i}", "type": "fact", "importance": 0.5,
                 "embedding": vec_bin(v[10 + i])} for i in range(10)])["ids"]

            def top1(c, vec):
                return [r["id"] for r in c.call("memory.search", embedding=vec_bin(vec), top_k=1,
                                                similarity_weight=1.0)["results"]]

            for i, mid in enumerate(through_b):
                assert wait_for(lambda: top1(ca, v[i]) == [mid], timeout=10), \
                    "the coordinator's engramd never learnt of a store through the worker's"
            for i, mid in enumerate(through_a):
                assert wait_for(lambda: top1(cb, v[10 + i]) == [mid], timeout=10), \
                    "the worker's engramd never learnt of a store through the coordinator's"
            sid = cb.call("session.create", agent_id=1, config={"model": "sonnet"})["session_id"]
            cb.call("session.append", session_id=sid, role="user", content="hello")
            assert ca.call("session.get", session_id=sid)["entry_count"] == 1
    # an admin change made on the coordinator reaches the worker's engramd
    tid, key = next(iter(tenants.values()))
    with a.admin() as adm:
        k2 = adm.call("admin.key.create", tenant_id=tid, name="second")
    with b.client(key=k2["api_key"]) as cb2:
        cb2.call("memory.stats")
        with a.admin() as adm:
            adm.call("admin.key.revoke", key_id=k2["key_id"])
        e = wait_for(lambda: cb2.wait(cb2.send("memory.stats", {}))[0], timeout=10)
        assert e is not None and e["code"] == "unauthenticated", \
            "the revocation never reached the worker's engramd"


def test_single_node_database_moves_onto_citus(engramd, tmp_path):
    """The migration path of docs/scaling.md: a single PostgreSQL's database, dumped with
    pg_dump and restored into a coordinator's database (citus extension, workers
    registered), is distributed by the first engramd started on it (its rows copied into
    the shards, the coordinator's local copies emptied), and serves what it held: keys,
    memories found by search, sessions, and new stores numbered after the old."""
    assert CITUS, "run with ENGRAM_TEST_CITUS=1 (meson suite citus)"
    name = "engram_single_" + "".join(random.choices(string.ascii_lowercase, k=8))
    psql(PG_DSN, f"CREATE DATABASE {name}")
    single = engramd(with_dbname(PG_DSN, name))
    vecs = structured_vectors(3 * 30, 384, seed=91)
    held = []
    for t in range(3):
        tid, key = single.create_tenant()
        with single.client(key=key) as c:
            ids = c.call("memory.store_batch", memories=[
                {"content": f"t{t} m{i}", "type": "fact", "importance": 0.5,
                 "embedding": vec_bin(vecs[t * 30 + i])} for i in range(30)])["ids"]
            sid = c.call("session.create", agent_id=1, config={"model": "sonnet"})["session_id"]
            c.call("session.append", session_id=sid, role="user", content="hello")
        held.append((tid, key, ids, sid))
    single.stop()
    dump = tmp_path / "dump.sql"
    with open(dump, "w") as f:
        subprocess.run([os.path.join(PG_BINDIR, "pg_dump"), with_dbname(PG_DSN, name)],
                       stdout=f, check=True, timeout=300)
    dsn = citus_cluster().add_database(name)
    # the roles are the cluster's, not the dump's (pg_dumpall --globals-only elsewhere)
    psql(dsn, "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = "
              "'engram_app') THEN CREATE ROLE engram_app; END IF; END $$")
    out = subprocess.run([os.path.join(PG_BINDIR, "psql"), dsn, "-v", "ON_ERROR_STOP=1", "-q",
                          "-f", str(dump)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    moved = engramd(dsn, extra=["--secret-file", single.data_dir + "/secret.key"])
    assert "the database is a Citus coordinator" in moved.log_text()
    db = _db(moved)
    assert citus_cluster().sql(0, "SELECT count(*) FROM pg_dist_partition WHERE "
                                  "logicalrelid = 'memories'::regclass", dbname=db) == "1"
    # the rows live in the shards; the coordinator's local copy is empty
    assert citus_cluster().sql(0, "SELECT pg_relation_size('memories')", dbname=db) == "0"
    for t, (tid, key, ids, sid) in enumerate(held):
        with moved.client(key=key) as c:
            for i, mid in enumerate(ids):
                hits = c.call("memory.search", embedding=vec_bin(vecs[t * 30 + i]), top_k=1,
                              similarity_weight=1.0)["results"]
                assert hits and hits[0]["id"] == mid
            assert c.call("session.get", session_id=sid)["entry_count"] == 1
            new = c.call("memory.store", content="after the move", type="fact", importance=0.5,
                         embedding=vec_bin(vecs[t * 30]))["id"]
            assert new == max(ids) + 1
