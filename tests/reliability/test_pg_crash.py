"""PostgreSQL killed (-9) and stopped (SIGSTOP) under 16 idempotent writers.

While writers store, the postmaster is killed with SIGKILL and started again, then the
whole cluster is frozen with SIGSTOP for 6 s and thawed. engramd is never restarted. The
test records the longest a request took, the error codes clients got, how long writes took
to succeed again, and checks that every acknowledged memory is present and none stored
twice. Prints its figures (docs/reliability.md).
"""
import os
import signal
import threading
import time

import numpy as np

from harness import psql, vec_bin, wait_for
from rpc import Client, RpcError

WRITERS = 16
DIM = 32


class Writer(threading.Thread):
    def __init__(self, srv, key, w, stop):
        super().__init__(daemon=True)
        self.srv, self.key, self.w, self.stop = srv, key, w, stop
        self.acked = {}
        self.errors = {}
        self.longest = 0.0
        self.last_ok = 0.0
        self.i = 0

    def run(self):
        c = None
        while not self.stop.is_set():
            t0 = time.time()
            try:
                if c is None:
                    c = Client(self.srv.port, timeout=30, key=self.key)
                v = np.random.default_rng(self.w * 7919 + self.i).standard_normal(DIM)
                r = c.call("memory.store", content=f"p{self.w}-{self.i}", type="fact",
                           importance=0.5, embedding=vec_bin(v / np.linalg.norm(v)),
                           idempotency_key=f"p{self.w}-{self.i}")
                self.acked[self.i] = r["id"]
                self.i += 1
                self.last_ok = time.time()
            except RpcError as e:
                self.errors[e.code] = self.errors.get(e.code, 0) + 1
                time.sleep(0.05)  # a client's pause before it retries
            except (OSError, ConnectionError):
                self.errors["connection"] = self.errors.get("connection", 0) + 1
                c = None
                time.sleep(0.05)  # a client's pause before it retries
            self.longest = max(self.longest, time.time() - t0)
        if c is not None:
            c.close()


def wait_writes_resume(writers, since, limit):
    assert wait_for(lambda: all(w.last_ok > since for w in writers), timeout=limit), \
        f"writes did not resume within {limit} s"
    return time.time() - since


def test_postgres_killed_and_frozen_under_writers(pg, engramd):
    dsn = pg.create_db("engram_pgcrash")
    srv = engramd(dsn, extra=["--db-backoff-max-ms", "500"])
    tid, key = srv.create_tenant(embedding={"provider": "builtin", "dim": DIM})
    stop = threading.Event()
    writers = [Writer(srv, key, w, stop) for w in range(WRITERS)]
    try:
        for t in writers:
            t.start()
        time.sleep(2)  # wall clock: the writers run before the crash

        # kill -9 of the postmaster: its backends exit, the cluster restarts from its WAL
        procs = pg.pids()  # the postmaster first, then its children
        t_kill = time.time()
        os.kill(procs[0], signal.SIGKILL)
        # the backends notice their postmaster is gone and exit; whatever is left goes too,
        # or the new postmaster would find their shared memory still in use
        wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in procs[1:]), timeout=5,
                 interval=0.1)
        for p in procs[1:]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # gone and reaped, the postmaster too: a new postmaster refuses to start while the
        # pid in postmaster.pid still exists (a zombie counts)
        wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in procs), timeout=5)
        pg.start()
        kill_recovery = wait_writes_resume(writers, time.time(), 60)
        kill_window = time.time() - t_kill

        time.sleep(2)  # wall clock: the writers run again before the stall
        # SIGSTOP of the whole cluster for 6 s (thawed by the fixture should the test fail)
        pg.freeze()
        time.sleep(6)  # wall clock: the stall's length
        pg.thaw()
        t_thaw = time.time()
        stop_recovery = wait_writes_resume(writers, t_thaw, 60)
        time.sleep(1)  # wall clock: the writers run after the stall
    finally:
        # the writers end before the server and the cluster do, however the test ends
        stop.set()
        for t in writers:
            t.join(60)

    acked = [mid for w in writers for mid in w.acked.values()]
    errors = {}
    for w in writers:
        for code, n in w.errors.items():
            errors[code] = errors.get(code, 0) + n
    longest = max(w.longest for w in writers)
    with srv.client(key=key) as c:
        present = set()
        for k in range(0, len(acked), 1000):
            present |= {m["id"] for m in c.call("memory.get", ids=acked[k:k + 1000])["memories"]}
    lost = len(set(acked) - present)
    dup = psql(dsn, "SELECT count(*) FROM (SELECT content FROM memories WHERE tenant_id = "
                    f"{tid} GROUP BY content HAVING count(*) > 1) d").strip()
    print(f"postgres kill -9 and SIGSTOP under {WRITERS} writers: {len(acked)} acknowledged, "
          f"lost {lost}, stored twice {dup}; errors {errors}; longest request "
          f"{longest:.2f} s; writes resumed {kill_recovery:.2f} s after the restart "
          f"(window {kill_window:.2f} s) and {stop_recovery:.2f} s after the thaw")
    assert lost == 0 and int(dup) == 0
    assert set(errors) <= {"unavailable", "connection"}, errors
    assert errors.get("unavailable", 0) > 0  # clients were told, not left hanging
    # no request hung for the whole freeze: the heartbeat failed them within seconds
    assert longest < 6, longest
