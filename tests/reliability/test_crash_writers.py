"""kill -9 of engramd under 64 idempotent writers, ten cycles.

Each writer stores memories with an idempotency key of its own and a vector of its own. An
answer is an acknowledgement; a connection lost before the answer leaves the write unknown,
and the writer sends the same call again (same key) once the server is back. After the last
cycle: every acknowledged memory is present, found by its own vector as the top hit right
after a restart, and no key was stored twice. Prints its figures (docs/reliability.md).
"""
import threading
import time

import numpy as np

from harness import Server, new_database, psql, vec_bin
from rpc import Client, RpcError

WRITERS = 64
CYCLES = 10
DIM = 64
RUN_S = 1.5


def vector(w, i):
    v = np.random.default_rng(w * 1_000_003 + i).standard_normal(DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


class Writer(threading.Thread):
    def __init__(self, srv, key, w, stop):
        super().__init__(daemon=True)
        self.srv, self.key, self.w, self.stop = srv, key, w, stop
        self.acked = {}  # i -> id
        self.retries = 0
        self.i = 0

    def run(self):
        c = None
        while not self.stop.is_set():
            try:
                if c is None:
                    c = Client(self.srv.port, timeout=10, key=self.key)
                r = c.call("memory.store", content=f"w{self.w}-{self.i}", type="fact",
                           importance=0.5, embedding=vec_bin(vector(self.w, self.i)),
                           idempotency_key=f"w{self.w}-{self.i}")
                self.acked[self.i] = r["id"]
                self.i += 1  # the next memory only once this one is acknowledged
            except (OSError, ConnectionError, RpcError):
                # killed server, refused connection or 'unavailable' while it starts: the
                # same call (same key) again
                self.retries += 1
                if c is not None:
                    try:
                        c.close()
                    except OSError:
                        pass
                c = None
                time.sleep(0.05)  # a client's pause before it retries
        if c is not None:
            c.close()


def test_kill9_under_writers_loses_nothing():
    dsn = new_database("crash")
    srv = Server(dsn)
    try:
        srv.start()
        tid, key = srv.create_tenant(embedding={"provider": "builtin", "dim": DIM})
        stop = threading.Event()
        writers = [Writer(srv, key, w, stop) for w in range(WRITERS)]
        for t in writers:
            t.start()
        longest_down = 0.0
        for cycle in range(CYCLES):
            time.sleep(RUN_S)  # wall clock: the writers run for a while before each kill
            srv.kill()  # SIGKILL: no shutdown path
            t0 = time.time()
            srv.start()
            longest_down = max(longest_down, time.time() - t0)
        time.sleep(RUN_S)  # and after the last restart
        stop.set()
        for t in writers:
            t.join(30)
        acked = {(w.w, i): mid for w in writers for i, mid in w.acked.items()}
        retries = sum(w.retries for w in writers)
        srv.kill()
        srv.start()  # the check runs right after a restart
        with srv.client(key=key) as c:
            ids = list(acked.values())
            present = set()
            for k in range(0, len(ids), 1000):
                got = c.call("memory.get", ids=ids[k:k + 1000])["memories"]
                present |= {m["id"] for m in got}
            lost = len(set(ids) - present)
            unsearchable = 0
            for (w, i), mid in list(acked.items())[::7]:
                res = c.call("memory.search", embedding=vec_bin(vector(w, i)), top_k=1,
                             similarity_weight=1.0)["results"]
                unsearchable += not res or res[0]["id"] != mid
        dup = psql(dsn, "SELECT count(*) FROM (SELECT content FROM memories WHERE tenant_id = "
                        f"{tid} GROUP BY content HAVING count(*) > 1) d").strip()
        total = psql(dsn, f"SELECT count(*) FROM memories WHERE tenant_id = {tid}").strip()
        print(f"kill -9 x {CYCLES} under {WRITERS} writers: {len(acked)} acknowledged, "
              f"{total} stored, {retries} retried after a lost answer, lost {lost}, "
              f"stored twice {dup}, not top-1 by own vector {unsearchable} of "
              f"{len(acked) // 7 + 1} checked; longest restart {longest_down:.2f} s")
        assert len(acked) > WRITERS * CYCLES  # every writer got through every cycle
        assert lost == 0
        assert int(dup) == 0
        assert unsearchable == 0
        # stored: the acknowledged ones plus at most one unknown in flight per writer at the end
        assert len(acked) <= int(total) <= len(acked) + WRITERS
        srv.stop()
    finally:
        srv.cleanup()
