"""One failover under load on deploy/ha's formation: used by test_failover.py (which asserts
on the outcome) and bench/failover.sh (which reports the unavailability window).

run() starts deploy/ha (pg_auto_failover monitor, primary, synchronous secondary, two
engramd on the multi-host DSN, HAProxy in front), runs writer threads through HAProxy that
store memories with idempotency keys and retry each one on 'unavailable' or a lost
connection until it is acknowledged, kills the primary (deploy/ha/kill-primary: SIGKILL to
its keeper and postmaster), lets pg_auto_failover promote the secondary, and collects what
the checks need. stop() stops and removes the formation. Formation and Load (the writers)
also serve longer scripts: a rejoin of the lost node and a switchover back
(test_failover.py).

Run directly (python3 failover_run.py ENGRAMD [RUNS]) it prints one line per failover.
"""
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

from harness import free_port_base
from rpc import Client, RpcError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HA = os.path.join(ROOT, "deploy", "ha")
PG_BINDIR = os.environ.get("ENGRAM_TEST_PG_BINDIR", "/usr/lib/postgresql/15/bin")

# engramd's database timeouts in this run: a request waits at most this long for the
# database (queue) or for an answer (query), so no write may hang longer than their sum
QUEUE_TIMEOUT_MS = 2000
QUERY_TIMEOUT_MS = 5000
# and no cap on a tenant's memories or rate: the writers store for as long as the
# formation's scripts take. In a CI run beside the citus suite deploy/ha/start took 110 s
# and all four writers ended on an error other than 'unavailable' during it (their last
# attempts, printed now); the premium tier's 50,000 memories is the limit such a long run
# passes (its 5,000 requests/s the one it might)
ENGRAMD_ARGS = (f"--db-queue-timeout-ms {QUEUE_TIMEOUT_MS} --db-query-timeout-ms "
                f"{QUERY_TIMEOUT_MS} --db-backoff-max-ms 500 --premium-max-memories 0 "
                "--premium-rate-per-s 0 "
                "--log-level info")


def read_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            env[k] = v.strip("'")
    return env


class Formation:
    """deploy/ha started in a temporary directory on free ports."""

    def __init__(self, engramd):
        self.dir = tempfile.mkdtemp(prefix="engram-ha-")
        self.env = dict(os.environ)
        self.env.update({"ENGRAM_BIN": engramd, "HA_PORT_BASE": str(free_port_base()),
                         "ENGRAM_HA_ARGS": ENGRAMD_ARGS, "HA_DIR": self.dir})
        self.ports = None

    def start(self):
        out = subprocess.run([os.path.join(HA, "start")], env=self.env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, f"deploy/ha/start failed:\n{out.stderr[-4000:]}"
        self.ports = read_env(os.path.join(self.dir, "ha.env"))
        with open(self.ports["HA_ADMIN_KEY_FILE"]) as f:
            self.admin_key = f.read().strip()
        return self

    def kill_primary(self):
        out = subprocess.run([os.path.join(HA, "kill-primary")], env=self.env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"deploy/ha/kill-primary failed:\n{out.stderr}"
        return int(out.stdout.strip())

    def script(self, name, *args, timeout=600):
        """Runs deploy/ha/NAME ARGS on this formation; asserts it succeeded; returns
        (stdout, seconds taken)."""
        t = time.time()
        out = subprocess.run([os.path.join(HA, name), *args], env=self.env,
                             capture_output=True, text=True, timeout=timeout)
        took = time.time() - t
        assert out.returncode == 0, \
            f"deploy/ha/{name} {' '.join(args)} failed after {took:.0f} s:\n{out.stderr[-4000:]}"
        return out.stdout, took

    def node_of(self, port):
        """The node name (node1, node2) of a PostgreSQL port."""
        return "node%d" % (self.ports["HA_NODE_PORTS"].split().index(str(port)) + 1)

    def roles(self):
        """{node name: reported state} where the monitor assigned that same state."""
        return {n: rep for n, _, rep, goal in self.state() if rep == goal}

    def events(self, n=60):
        """The monitor's last n events (time, node, reported, assigned, why), for failure
        messages: what the formation did, failovers the test did not ask for included."""
        out = subprocess.run([os.path.join(PG_BINDIR, "psql"), self.ports["HA_MONITOR_URI"],
                              "-tAq", "-F", " | ", "-c",
                              "SELECT * FROM (SELECT eventid, eventtime::time(1), nodename, "
                              "reportedstate, goalstate, description FROM pgautofailover.event "
                              f"ORDER BY eventid DESC LIMIT {int(n)}) e ORDER BY eventid"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout

    def state(self):
        out = subprocess.run([os.path.join(PG_BINDIR, "psql"), self.ports["HA_MONITOR_URI"],
                              "-tAq", "-F", " ", "-c",
                              "SELECT nodename, nodeport, reportedstate, goalstate "
                              "FROM pgautofailover.node ORDER BY nodeid"],
                             capture_output=True, text=True, timeout=30)
        return [line.split() for line in out.stdout.splitlines() if line.strip()]

    def primary_port(self):
        """The port of the node that accepts writes now (libpq's own choice)."""
        ports = self.ports["HA_NODE_PORTS"].split()
        dsn = (f"host=127.0.0.1,127.0.0.1 port={ports[0]},{ports[1]} dbname=engram "
               "user=postgres target_session_attrs=read-write connect_timeout=3")
        return int(self.sql_dsn(dsn, "SELECT inet_server_port()"))

    def sql_dsn(self, dsn, sql):
        out = subprocess.run([os.path.join(PG_BINDIR, "psql"), dsn, "-v", "ON_ERROR_STOP=1",
                              "-tAqc", sql], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"psql failed: {out.stderr}"
        return out.stdout.strip()

    def sql(self, port, sql):
        return self.sql_dsn(f"host=127.0.0.1 port={port} dbname=engram user=postgres", sql)

    def log(self, name):
        try:
            with open(os.path.join(self.dir, name), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def diagnosis(self, load=None, lines=40):
        """What a failure message needs: the monitor's state and events, the writers' last
        attempts, the tail of each engramd's and HAProxy's log."""
        parts = [f"state: {self.state()}", "monitor events:\n" + self.events(30)]
        if load:
            parts.append("writers:\n" + load.report())
            parts.append(f"writers' unexpected errors: {load.unexpected()[:8]}")
        for name in ("engramd-a.log", "engramd-b.log", "haproxy.log"):
            parts.append(f"{name}:\n" + "\n".join(self.log(name).splitlines()[-lines:]))
        return "\n".join(parts)

    def stop(self, clean=True):
        args = [os.path.join(HA, "stop")] + (["--clean"] if clean else [])
        subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=300)


class Writer(threading.Thread):
    """Stores memories through HAProxy, each with its own idempotency key, retrying one until
    it is acknowledged: on 'unavailable' on the same connection, on a lost connection on a new
    one. Records every attempt (start, end, outcome)."""

    def __init__(self, port, key, wid, stop):
        super().__init__(daemon=True)
        self.port, self.key, self.wid, self.stop_ev = port, key, wid, stop
        self.acked = []     # (idempotency key, id, content, replayed)
        self.attempts = []  # (t_start, t_end, "ok" | "unavailable" | "conn")
        self.unexpected = []
        self.client = None

    def connect(self):
        if self.client:
            try:
                self.client.close()
            except OSError:
                pass
            self.client = None
        try:
            self.client = Client(self.port, timeout=30, key=self.key)
        except (OSError, ConnectionError, RpcError):
            self.client = None

    def run(self):
        i = 0
        while not self.stop_ev.is_set():
            idem = f"w{self.wid}-{i}"
            content = f"failover writer {self.wid} memory {i} " + \
                " ".join(random.choice(WORDS) for _ in range(6))
            while not self.stop_ev.is_set():
                if not self.client:
                    self.connect()
                    if not self.client:
                        now = time.time()
                        self.attempts.append((now, now, "conn"))
                        time.sleep(0.1)
                        continue
                t0 = time.time()
                try:
                    r = self.client.call("memory.store", content=content, type="fact",
                                         importance=0.5, idempotency_key=idem)
                except RpcError as e:
                    self.attempts.append((t0, time.time(), "unavailable"))
                    if e.code != "unavailable":
                        self.unexpected.append(f"{idem}: {e}")
                        return
                    time.sleep(0.05)
                    continue
                except (OSError, ConnectionError):
                    self.attempts.append((t0, time.time(), "conn"))
                    self.connect()
                    time.sleep(0.05)
                    continue
                self.attempts.append((t0, time.time(), "ok"))
                self.acked.append((idem, r["id"], content, bool(r.get("replayed"))))
                break
            i += 1


class Load:
    """Writer threads storing through HAProxy (see Writer) from start() to stop()."""

    def __init__(self, formation, api_key, writers=4, prefix="w"):
        self.stop_ev = threading.Event()
        self.ws = [Writer(int(formation.ports["HA_RPC_PORT"]), api_key, f"{prefix}{w}",
                          self.stop_ev) for w in range(writers)]

    def start(self):
        for w in self.ws:
            w.start()
        return self

    def stop(self):
        self.stop_ev.set()
        for w in self.ws:
            w.join(timeout=60)
        for w in self.ws:
            if w.client:
                w.client.close()

    def acked(self):
        return [a for w in self.ws for a in w.acked]

    def attempts(self):
        return [a for w in self.ws for a in w.attempts]

    def unexpected(self):
        return [u for w in self.ws for u in w.unexpected]

    def stuck(self):
        return [w.wid for w in self.ws if w.is_alive()]

    def report(self, n=4):
        """Each writer's last n attempts (seconds ago, duration, outcome) and whether it is
        alive, for failure messages."""
        now = time.time()
        lines = []
        for w in self.ws:
            last = [f"{now - s:.1f}s ago {e - s:.2f}s {o}" for s, e, o in list(w.attempts)[-n:]]
            lines.append(f"{w.wid} ({'alive' if w.is_alive() else 'ended'}): {last}")
        return "\n".join(lines)

    def acked_since(self, t):
        """How many writes that started at or after t were acknowledged."""
        return sum(1 for w in self.ws for s, _, o in list(w.attempts) if o == "ok" and s >= t)


WORDS = ("harbor lantern copper meadow quartz falcon ember glacier orchard velvet cobalt "
         "thistle summit canyon willow saffron beacon marble tundra juniper").split()


def unavailability(attempts, kill_t):
    """The failover's unavailability window over every writer's attempts: from the first
    failed write after the kill to the first acknowledged write that started after the
    failures began and ended the longest stretch without any acknowledgement. (Backends
    of a killed postmaster live on for a moment, so a write may still succeed after the first
    failure; the window is the real gap, not that straggler.) Returns (first failure, first
    success after it) or Nones."""
    fails = sorted(s for s, _, o in attempts if o != "ok" and s >= kill_t - 1.0)
    if not fails:
        return None, None
    oks = sorted(e for s, e, o in attempts if o == "ok" and e >= fails[0])
    if not oks:
        return fails[0], None
    # the longest gap between consecutive acknowledgements from the first failure on
    edges = [fails[0]] + oks
    gap = max(range(1, len(edges)), key=lambda i: edges[i] - edges[i - 1])
    in_gap = [f for f in fails if edges[gap - 1] <= f <= edges[gap]]
    return (in_gap[0] if in_gap else edges[gap - 1]), edges[gap]


def run(engramd, writers=4, before_s=4.0, after_s=4.0, limit_s=120.0):
    """Starts the formation, writes, fails the primary over, writes on until writes resumed
    and after_s more seconds passed (at most limit_s after the kill), stops the writers.
    Returns (formation, result dict); the caller checks and stops the formation."""
    f = Formation(engramd).start()
    res = {"formation": f}
    with Client(int(f.ports["HA_RPC_PORT"]), key=f.admin_key) as a:
        t = a.call("admin.tenant.create", name=f"failover-{random.randrange(1 << 30)}",
                   tier="premium")
    res["tenant_id"], res["api_key"] = t["tenant_id"], t["api_key"]
    stop = threading.Event()
    ws = [Writer(int(f.ports["HA_RPC_PORT"]), t["api_key"], w, stop) for w in range(writers)]
    for w in ws:
        w.start()
    time.sleep(before_s)
    res["old_primary"] = f.primary_port()
    res["acked_before_kill"] = sum(len(w.acked) for w in ws)
    kill_t = time.time()
    res["killed_port"] = f.kill_primary()
    # writes go on until a node other than the killed one accepts writes, a write that started
    # after that was acknowledged, and after_s more seconds passed
    promoted_t = resumed = None
    while time.time() - kill_t < limit_s and not any(w.unexpected for w in ws):
        time.sleep(0.5)
        if promoted_t is None:
            try:
                if f.primary_port() != res["killed_port"]:
                    promoted_t = time.time()
            except AssertionError:
                pass
            continue
        if resumed is None:
            if any(o == "ok" and s >= promoted_t for w in ws for s, _, o in w.attempts):
                resumed = time.time()
            continue
        if time.time() - resumed >= after_s:
            break
    res["promoted_after_s"] = promoted_t - kill_t if promoted_t else None
    stop.set()
    for w in ws:
        w.join(timeout=60)
    attempts = [a for w in ws for a in w.attempts]
    first_fail, first_ok = unavailability(attempts, kill_t)
    res.update({
        "kill_t": kill_t,
        "first_fail": first_fail,
        "first_ok": first_ok,
        "window_s": (first_ok - first_fail) if first_fail and first_ok else None,
        "acked": [a for w in ws for a in w.acked],
        "unexpected": [u for w in ws for u in w.unexpected],
        "attempts": attempts,
        "longest_attempt_s": max(e - s for s, e, _ in attempts),
        "failed_attempts": sum(1 for _, _, o in attempts if o != "ok"),
        "stuck_writers": [w.wid for w in ws if w.is_alive()],
        "acked_after_resume": sum(1 for s, _, o in attempts
                                  if o == "ok" and first_ok and s >= first_ok),
    })
    for w in ws:
        if w.client:
            w.client.close()
    return f, res


def main():
    engramd = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for n in range(runs):
        f, r = run(engramd)
        try:
            promoted = f.primary_port()
        finally:
            f.stop()
        w, p = r["window_s"], r["promoted_after_s"]
        print(f"run {n + 1}: writers 4, acknowledged {len(r['acked'])} "
              f"({sum(1 for a in r['acked'] if a[3])} replayed), primary {r['killed_port']} "
              f"killed, {promoted} promoted, unavailability window "
              f"{'%.2f s' % w if w is not None else 'not measured'} (a new primary took "
              f"writes {'%.1f s' % p if p is not None else 'never'} after the kill, polled "
              f"every 0.5 s), "
              f"longest request {r['longest_attempt_s']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
