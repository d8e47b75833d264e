"""Failover per node on Citus (meson test citus_ha; docs/scaling.md "Failover per node"):
deploy/citus-ha starts a pg_auto_failover monitor, the coordinator and two workers, each
with a synchronous secondary; engramd runs against the coordinator through a DSN naming
both of its nodes. While 8 clients store to tenants on both workers, the primary of one
worker is killed (kill -9): the monitor promotes its secondary and the coordinator is
pointed at it; then the coordinator's primary is killed: its secondary is promoted and
engramd reconnects to it. Writes resume after each, and no acknowledged write is lost or
stored twice (each store retried with its idempotency key while it fails `unavailable`,
the only error allowed)."""
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

from harness import (BIN, PG_BINDIR, ROOT, Server, free_port_base, psql, store_retrying,
                     structured_vectors, vec_bin, wait_for)

SCRIPT = os.path.join(ROOT, "deploy", "citus-ha")


def test_worker_and_coordinator_primaries_killed_under_writes():
    tmp = tempfile.mkdtemp(prefix="engram-citus-ha-")
    os.chmod(tmp, 0o755)
    env = dict(os.environ, CITUS_HA_DIR=os.path.join(tmp, "c"),
               CITUS_HA_PORT=str(free_port_base(30)), ENGRAM_BIN=BIN, PG_BINDIR=PG_BINDIR)

    def ha(*args, timeout=60):
        return subprocess.run([SCRIPT, *args], env=env, capture_output=True, text=True,
                              timeout=timeout, check=True).stdout.strip()

    srv, ok = None, False
    try:
        ha("start", timeout=600)
        dsn = ha("dsn")
        srv = Server(dsn, extra=["--db-queue-timeout-ms", "20000"])
        srv.start()

        def group_of(tid):
            return int(psql(dsn, "SELECT n.groupid FROM pg_dist_shard_placement p JOIN "
                                 "pg_dist_node n ON n.nodeport = p.nodeport WHERE p.shardid = "
                                 f"get_shard_id_for_distribution_column('tenants', {tid})"))

        by_group = {}
        for _ in range(60):
            tid, key = srv.create_tenant()
            by_group.setdefault(group_of(tid), []).append((tid, key))
            if all(len(by_group.get(g, [])) >= 2 for g in (1, 2)):
                break
        tenants = by_group[1][:2] + by_group[2][:2]
        assert len(tenants) == 4, by_group
        vecs = structured_vectors(8 * 150, 384, seed=51)
        acked = {i: [] for i in range(8)}
        retried, errors = [], []
        done = threading.Event()  # every failover passed and was written through
        abort = threading.Event()  # the test failed before the writers were done
        after = {i: 0 for i in range(8)}  # acknowledged since the last promotion

        def writer(i):
            tid, key = tenants[i % 4]
            try:
                with srv.client(key=key) as c:
                    j = 0
                    # until the main thread has seen 10 stores of each writer acknowledged
                    # after the last failover (however long the promotions take on a loaded
                    # machine); the first 150 have vectors of their own, searched for below
                    while not abort.is_set() and not done.is_set():
                        args = dict(content=f"w{i} n{j}", type="fact", importance=0.5,
                                    embedding=vec_bin(vecs[i * 150 + j % 150]),
                                    idempotency_key=f"w{i}-{j}")
                        # a worker's failover: until the coordinator has synced Citus'
                        # metadata to the promoted worker, stores fail `unavailable` (about
                        # a second here; over 30 s once with another Citus cluster busy
                        # beside it); the coordinator's: until engramd's connections found
                        # the promoted coordinator
                        acked[i].append((store_retrying(c, args, retried, timeout=180), j))
                        after[i] += 1
                        j += 1
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        took = []
        # a worker's primary first, then the coordinator's
        for group in (1, 0):
            old = next(line.split()[0] for line in ha("state").splitlines()
                       if line.split()[1] == str(group) and line.split()[4] == "primary")
            t0 = time.time()
            ha("kill", str(group))

            def promoted():
                rows = [line.split() for line in ha("state").splitlines()]
                # wait_primary: promoted and taking writes, its old primary not back as
                # its secondary yet (that took over two minutes beside other suites)
                new = [r for r in rows if r[1] == str(group) and r[3] == r[4]
                       and r[3] in ("wait_primary", "primary")]
                if not new or new[0][0] == old:
                    return False
                if group == 0:  # the DSN takes the writable coordinator
                    return psql(dsn, "SELECT inet_server_port()") == new[0][2]
                port = psql(dsn, "SELECT nodeport FROM pg_dist_node WHERE groupid = 1 AND "
                                 "noderole = 'primary'")
                return port == new[0][2]

            if not wait_for(promoted, timeout=120, interval=0.5):
                abort.set()
                raise AssertionError(f"group {group} never failed over: {ha('state')}")
            for i in after:
                after[i] = 0
            if not wait_for(lambda: errors or all(n >= 10 for n in after.values()),
                            timeout=300, interval=0.5):
                abort.set()
                raise AssertionError(f"writes did not resume after group {group}'s failover: "
                                     f"{after}, {retried[-3:]}")
            assert not errors, errors
            took.append(f"group {group}: promoted and 10 stores each in {time.time() - t0:.1f} s")
        done.set()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        print(f"stores retried after unavailable: {len(retried)} "
              f"{sorted(set(re.sub(r'[0-9]+', 'N', m) for m in retried))[:4]}; "
              + "; ".join(took))
        for w, (tid, key) in enumerate(tenants):
            want = sorted(m for i in (w, w + 4) for m, _ in acked[i])
            got = sorted(int(x) for x in psql(
                dsn, f"SELECT id FROM memories WHERE tenant_id = {tid}").split())
            assert got == want, f"tenant {tid}: rows {len(got)}, acknowledged {len(want)}"
            assert psql(dsn, f"SELECT memory_count || ' ' || memory_id_last FROM tenants "
                             f"WHERE id = {tid}") == f"{len(want)} {max(want)}"
            with srv.client(key=key) as c:
                for i in (w, w + 4):
                    for mid, j in [a for a in acked[i] if a[1] < 150][::7]:
                        hits = c.call("memory.search", embedding=vec_bin(vecs[i * 150 + j]),
                                      top_k=1, similarity_weight=1.0)["results"]
                        assert hits and hits[0]["id"] == mid
        ok = True
    finally:
        try:
            if srv:
                srv.finish(failed=not ok)  # its log kept when the test failed
        finally:
            subprocess.run([SCRIPT, "stop"], env=env, timeout=120)
            shutil.rmtree(tmp, ignore_errors=True)
