"""Reads on a hot standby (pg_read_dsn) never observe an older state than the process knows.

A private primary and a streaming hot standby of it (pg_basebackup -R). engramd reads from
the standby while it keeps up; with the standby's replay paused, a memory just stored,
updated or deleted through engramd is read consistently (get, list, search), because each
read that finds the standby behind the tenant's change number goes to the primary; once
replay resumes the reads go to the standby again (engram_db_reads_total{target}). An index
built while the standby lags takes the bulk from the standby and the missing changes from
the primary; with the standby down, reads go to the primary without waiting."""
import os
import time

import pytest

from harness import (PgCluster, PgStandby, Server, metric, psql, structured_vectors, vec_bin,
                     wait_for)

DIM = 64


def reads(srv):
    return (metric(srv, "engram_db_reads_total", 'target="standby"'),
            metric(srv, "engram_db_reads_total", 'target="primary"'))


def standby_ready(srv):
    """Every worker's standby connections are connected and prepared (a read on a worker
    with none goes to the primary)."""
    return 0 < metric(srv, "engram_db_read_pool_connections") == \
        metric(srv, "engram_db_read_pool_ready")


@pytest.fixture(scope="module")
def cluster():
    primary = PgCluster()
    primary.start()
    standby = None
    try:
        dsn = primary.create_db("engram_replicas")
        standby = PgStandby(primary)
        standby.start()
        yield primary, standby, dsn, standby.dsn_for("engram_replicas")
    finally:
        if standby:
            standby.cleanup()
        primary.cleanup()


@pytest.fixture(scope="module")
def srv(cluster):
    _, _, dsn, sdsn = cluster
    s = Server(dsn, extra=["--pg-read-dsn", sdsn, "--embed-dim", str(DIM),
                           "--db-queue-timeout-ms", "1000", "--db-backoff-max-ms", "500"])
    s.start()
    # the standby replays the schema the server just migrated on the primary a moment later:
    # until then its connections' set-up fails and reads go to the primary (as they should);
    # the tests start from a standby every worker is connected to
    wait_for(lambda: standby_ready(s), timeout=30, what="every standby connection ready")
    yield s
    try:
        s.stop()
    finally:
        s.cleanup()


def store(c, vec, content, **kw):
    return c.call("memory.store", content=content, type="fact", importance=0.5,
                  embedding=vec_bin(vec), **kw)["id"]


def top1(c, vec):
    res = c.call("memory.search", embedding=vec_bin(vec), top_k=1, similarity_weight=1.0)["results"]
    return (res[0]["id"], res[0]["content"]) if res else None


def on_standby(sdsn, tid, mid):
    """The memory's content as the standby has it, None when it has no such row."""
    out = psql(sdsn, f"SELECT content FROM memories WHERE tenant_id = {tid} AND id = {mid}")
    return out or None


def test_reads_follow_the_standby_and_fall_back_when_it_lags(cluster, srv):
    primary, standby, _, sdsn = cluster
    tid, key = srv.create_tenant()
    other_tid, other_key = srv.create_tenant()
    vecs = structured_vectors(40, DIM, seed=7)
    with srv.client(key=key) as c, srv.client(key=other_key) as oc:
        ids = [store(c, v, f"m{i}") for i, v in enumerate(vecs[:20])]
        oid = store(oc, vecs[30], "the other tenant's")
        assert wait_for(lambda: standby.caught_up(primary), timeout=30)
        # the standby has replayed every change: reads run there
        s0, p0 = reads(srv)
        assert [m["id"] for m in c.call("memory.get", ids=ids[:3])["memories"]] == ids[:3]
        assert len(c.call("memory.list", limit=100)["memories"]) == 20
        assert top1(c, vecs[5]) == (ids[5], "m5")
        s1, p1 = reads(srv)
        assert s1 - s0 >= 2 and p1 == p0, (s0, p0, s1, p1)

        standby.pause()
        try:
            new = store(c, vecs[20], "stored while the standby is paused")
            c.call("memory.update", id=ids[1], content="updated while paused", embedding=vec_bin(vecs[1]))
            c.call("memory.delete", ids=[ids[2]])
            # the standby really lacks all three changes
            assert on_standby(sdsn, tid, new) is None
            assert on_standby(sdsn, tid, ids[1]) == "m1"
            assert on_standby(sdsn, tid, ids[2]) == "m2"
            behind0 = metric(srv, "engram_db_read_fallbacks_total", 'reason="behind"')
            s0, p0 = reads(srv)
            got = c.call("memory.get", ids=[new, ids[1], ids[2]])["memories"]
            assert [(m["id"], m["content"]) for m in got] == \
                [(new, "stored while the standby is paused"), (ids[1], "updated while paused")]
            listed = {m["id"]: m["content"] for m in c.call("memory.list", limit=100)["memories"]}
            assert listed.get(new) == "stored while the standby is paused"
            assert listed.get(ids[1]) == "updated while paused" and ids[2] not in listed
            assert top1(c, vecs[20]) == (new, "stored while the standby is paused")
            assert top1(c, vecs[1]) == (ids[1], "updated while paused")
            assert ids[2] not in [r["id"] for r in c.call("memory.search", embedding=vec_bin(vecs[2]),
                                                          top_k=5)["results"]]
            text = [r["id"] for r in c.call("memory.search", query="paused", mode="text")["results"]]
            assert new in text and ids[1] in text
            versions = c.call("memory.history", id=ids[1])["versions"]
            assert sorted(v["content"] for v in versions) == ["m1", "updated while paused"]
            s1, p1 = reads(srv)
            behind1 = metric(srv, "engram_db_read_fallbacks_total", 'reason="behind"')
            assert p1 - p0 >= 6 and behind1 - behind0 >= 6, (p0, p1, behind0, behind1)
            # another tenant, unchanged since the pause, still reads from the standby
            s2 = reads(srv)[0]
            assert [m["id"] for m in oc.call("memory.get", ids=[oid])["memories"]] == [oid]
            assert reads(srv)[0] == s2 + 1
        finally:
            standby.resume()
        assert wait_for(lambda: standby.caught_up(primary), timeout=30)
        assert on_standby(sdsn, tid, new) == "stored while the standby is paused"
        s0, p0 = reads(srv)
        got = c.call("memory.get", ids=[new, ids[1]])["memories"]
        assert [m["content"] for m in got] == ["stored while the standby is paused",
                                               "updated while paused"]
        assert len(c.call("memory.list", limit=100)["memories"]) == 20
        s1, p1 = reads(srv)
        assert s1 - s0 == 2 and p1 == p0, (s0, p0, s1, p1)


def test_index_built_from_a_lagging_standby_takes_the_rest_from_the_primary(cluster, srv):
    primary, standby, dsn, sdsn = cluster
    _, key = srv.create_tenant()
    vecs = structured_vectors(30, DIM, seed=11)
    with srv.client(key=key) as c:
        ids = [store(c, v, f"v{i}") for i, v in enumerate(vecs[:25])]
        assert wait_for(lambda: standby.caught_up(primary), timeout=30)
        standby.pause()
        try:
            late = store(c, vecs[25], "after the pause")
            c.call("memory.delete", ids=[ids[0]])
            # a second process, no snapshot: its index load reads the standby, then the
            # primary's change log from where the standby stands
            b = Server(dsn, extra=["--pg-read-dsn", sdsn, "--embed-dim", str(DIM),
                                   "--secret-file", os.path.join(srv.data_dir, "secret.key"),
                                   "--admin-key-file", srv.admin_key_file])
            b.admin_key_file = srv.admin_key_file
            b.start()
            try:
                with b.client(key=key) as cb:
                    assert top1(cb, vecs[25]) == (late, "after the pause")
                    assert ids[0] not in [r["id"] for r in cb.call(
                        "memory.search", embedding=vec_bin(vecs[0]), top_k=3)["results"]]
                    assert top1(cb, vecs[7]) == (ids[7], "v7")
                log = b.log_text()
                assert "index built from the read replica, 25 memories, 2 changes then from " \
                       "the primary" in log, log[-3000:]
            finally:
                b.stop()
                b.cleanup()
        finally:
            standby.resume()


def test_reads_go_to_the_primary_while_the_standby_is_down(cluster, srv):
    primary, standby, _, _ = cluster
    _, key = srv.create_tenant()
    with srv.client(key=key) as c:
        mid = store(c, structured_vectors(1, DIM, seed=3)[0], "while the standby is down")
        standby.stop()
        try:
            # once the pool has noticed, reads do not wait for the standby at all
            assert wait_for(lambda: metric(srv, "engram_db_read_pool_ready") == 0, timeout=30)
            un0 = metric(srv, "engram_db_read_fallbacks_total", 'reason="unavailable"')
            for _ in range(5):
                got = c.call("memory.get", ids=[mid])["memories"]
                assert [m["content"] for m in got] == ["while the standby is down"]
            assert metric(srv, "engram_db_read_fallbacks_total", 'reason="unavailable"') - un0 == 5
        finally:
            standby.start()
        wait_for(lambda: standby_ready(srv), timeout=30, what="every standby connection ready")
        assert wait_for(lambda: standby.caught_up(primary), timeout=30)
        s0 = reads(srv)[0]
        assert c.call("memory.get", ids=[mid])["memories"][0]["content"] == "while the standby is down"
        assert reads(srv)[0] == s0 + 1


def test_a_tenant_out_of_the_index_registry_keeps_its_change_floor(cluster, srv):
    """A tenant written to and never loaded leaves the index registry after 15 s unused
    (engram_index_tenants_retired_total); what the process knows of its changes stays
    (engram_index_change_floors), so a read while the standby lags still goes to the
    primary and sees the write."""
    primary, standby, _, sdsn = cluster
    tid, key = srv.create_tenant()
    vecs = structured_vectors(2, DIM, seed=11)
    with srv.client(key=key) as c:
        first = store(c, vecs[0], "before the pause")
        assert wait_for(lambda: standby.caught_up(primary), timeout=30)
        standby.pause()
        try:
            retired0 = metric(srv, "engram_index_tenants_retired_total")
            new = store(c, vecs[1], "stored while the standby is paused")
            t_store = time.monotonic()
            assert on_standby(sdsn, tid, new) is None
            # retired 15 s after its last use (the store), by the housekeeping's next round
            assert wait_for(lambda: time.monotonic() - t_store > 17
                            and metric(srv, "engram_index_tenants_retired_total") > retired0,
                            timeout=60, interval=0.5)
            assert metric(srv, "engram_index_change_floors") >= 1
            behind0 = metric(srv, "engram_db_read_fallbacks_total", 'reason="behind"')
            got = c.call("memory.get", ids=[first, new])["memories"]
            assert [(m["id"], m["content"]) for m in got] == \
                [(first, "before the pause"), (new, "stored while the standby is paused")]
            assert metric(srv, "engram_db_read_fallbacks_total", 'reason="behind"') > behind0
        finally:
            standby.resume()
