"""bench/citus_cost.py: the CPU an operation costs on one PostgreSQL and on a Citus cluster
(issue 35 item 6).

Run by bench/citus-cost.sh against an engramd it started (on its own PostgreSQL, or on a
deploy/citus coordinator and two workers). Creates --tenants premium tenants, loads each
one's index (one search), then runs two phases, each from --procs client processes with
one connection each, tenants dealt round robin:
- stores: --stores memory.store calls in all (one memory each, --dim dimensions);
- searches: --searches memory.search calls (top 10, a query vector).
First it measures the CPU each process group uses per second with no requests
(--idle-seconds: engramd's schedulers, and on Citus their queries over every shard plus
Citus' maintenance daemons); then for each phase it prints the wall time, the operations
per second, and the CPU milliseconds per operation beyond that idle rate of engramd and of
every PostgreSQL server named by --node (NAME=POSTMASTER_PID: the postmaster, its live
children and the children it reaped), with the load average before and after: the machine
is shared.

Vectors: x = W z + 0.3 e (z in R^32, e noise), L2-normalized, W fixed by --seed (bench's
gaussian set).
"""
import argparse
import json
import multiprocessing
import os
import sys
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python"))
from engram_client import Client  # noqa: E402
from proc_stats import cpu_s, load_avg, pg_pids  # noqa: E402

A = None  # the parsed arguments, in each process


def snapshot():
    """CPU seconds so far of engramd and of each node."""
    s = {"engramd": cpu_s([A.engramd_pid])}
    for name, pm in A.nodes:
        s[name] = cpu_s(pg_pids(pm))
    return s


def vectors(n, seed):
    w = np.random.default_rng(A.seed).standard_normal((A.dim, 32))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 32)) @ w.T + 0.3 * rng.standard_normal((n, A.dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def run_part(job):
    """One client process: n operations of kind over its tenants (keys), round robin."""
    kind, proc, keys, n = job
    vecs = vectors(n, 1000 + proc)
    conns = [Client("127.0.0.1", A.port, api_key=k, timeout=120.0) for k in keys]
    try:
        for i in range(n):
            c = conns[i % len(conns)]
            if kind == "store":
                c.call("memory.store", {"content": f"p{proc} m{i}", "type": "fact",
                                        "importance": 0.5, "embedding": vecs[i]})
            else:
                c.call("memory.search", {"embedding": vecs[i], "top_k": 10})
    finally:
        for c in conns:
            c.close()
    return n


def idle(seconds):
    """CPU milliseconds per second of each process group with no requests: the servers'
    own background work (engramd's schedulers, Citus' maintenance daemons)."""
    before, t0 = snapshot(), time.monotonic()
    time.sleep(seconds)
    wall, after = time.monotonic() - t0, snapshot()
    rate = {k: (after[k] - before[k]) * 1000.0 / wall for k in after}
    print("idle: CPU ms per second: " + ", ".join(f"{k} {v:.1f}" for k, v in rate.items()),
          flush=True)
    return rate


def groups():
    """(transactions, requests) of engramd's store groups so far (its /metrics), or None
    without --http-port."""
    if not A.http_port:
        return None
    with urllib.request.urlopen(f"http://127.0.0.1:{A.http_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    got = {}
    for line in text.splitlines():
        for name in ("engram_group_commit_batches_total", "engram_group_commit_requests_total"):
            if line.startswith(name + " "):
                got[name] = float(line.split()[-1])
    return (got.get("engram_group_commit_batches_total", 0.0),
            got.get("engram_group_commit_requests_total", 0.0))


def phase(pool, kind, keys, total, idle_rate):
    """Runs total operations; CPU per operation is what the phase used beyond the idle
    rate over its wall time and the settling after it."""
    per = total // A.procs
    jobs = [(kind, p, keys[p::A.procs] or keys, per) for p in range(A.procs)]
    before, load0, g0, t0 = snapshot(), load_avg(), groups(), time.monotonic()
    done = sum(pool.map(run_part, jobs))
    wall = time.monotonic() - t0
    g1 = groups()
    # what the phase left running (autovacuum's analyses of the shards written, flushes)
    # counts towards it: until the servers are back near their idle rate, at most 60 s
    settle_s = 0.0
    while settle_s < 60:
        a, t1 = snapshot(), time.monotonic()
        time.sleep(1.0)
        b, dt = snapshot(), time.monotonic() - t1
        settle_s += dt
        busy = sum((b[k] - a[k]) * 1000.0 / dt for k in b)
        if busy <= 2 * sum(idle_rate.values()) + 20:
            break
    after = snapshot()
    wall_all = wall + settle_s
    gross = {k: (after[k] - before[k]) * 1000.0 / done for k in after}
    cpu = {k: max(0.0, ((after[k] - before[k]) * 1000.0 - idle_rate[k] * wall_all) / done)
           for k in after}
    row = {"phase": kind, "ops": done, "wall_s": round(wall, 2), "settle_s": round(settle_s, 1),
           "ops_per_s": round(done / wall),
           "cpu_ms_per_op": {k: round(v, 3) for k, v in cpu.items()},
           "gross_cpu_ms_per_op": {k: round(v, 3) for k, v in gross.items()},
           "pg_cpu_ms_per_op": round(sum(v for k, v in cpu.items() if k != "engramd"), 3),
           "load_before": load0, "load_after": load_avg()}
    if g0 and g1 and g1[0] > g0[0]:
        row["group_transactions"] = int(g1[0] - g0[0])
        row["group_requests"] = int(g1[1] - g0[1])
        print(f"{kind}: store groups: {row['group_requests']} requests in "
              f"{row['group_transactions']} transactions "
              f"({row['group_requests'] / row['group_transactions']:.2f} a transaction)",
              flush=True)
    nodes = ", ".join(f"{k} {v:.3f}" for k, v in cpu.items() if k != "engramd")
    print(f"{kind}: {done} in {wall:.1f} s ({done / wall:.0f}/s), settled {settle_s:.0f} s "
          f"after; CPU ms per op beyond idle: "
          f"engramd {cpu['engramd']:.3f}, PostgreSQL {row['pg_cpu_ms_per_op']:.3f} ({nodes}); "
          f"with idle: PostgreSQL "
          f"{sum(v for k, v in gross.items() if k != 'engramd'):.3f}; load {load0} -> "
          f"{row['load_after']}", flush=True)
    return row


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--admin-key-file", required=True)
    ap.add_argument("--engramd-pid", type=int, required=True)
    ap.add_argument("--node", action="append", required=True, help="NAME=POSTMASTER_PID")
    ap.add_argument("--label", default="")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--stores", type=int, default=4000)
    ap.add_argument("--searches", type=int, default=8000)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--http-port", type=int, default=0,
                    help="engramd's HTTP port: report its store groups per phase")
    ap.add_argument("--out", required=True)
    A = ap.parse_args()
    A.nodes = [(n.split("=")[0], int(n.split("=")[1])) for n in A.node]
    A.admin_key = open(A.admin_key_file).read().strip()
    keys = []
    with Client("127.0.0.1", A.port, api_key=A.admin_key, timeout=60.0) as adm:
        for i in range(A.tenants):
            keys.append(adm.call("admin.tenant.create", {
                "name": f"cost-{os.getpid()}-{i}", "tier": "premium",
                "embedding": {"dim": A.dim}})["api_key"])
    for k in keys:  # every index loaded before the phases
        with Client("127.0.0.1", A.port, api_key=k, timeout=60.0) as c:
            c.call("memory.search", {"embedding": vectors(1, 5)[0], "top_k": 1})
    rate = idle(A.idle_seconds)
    with multiprocessing.Pool(A.procs) as pool:
        rows = [phase(pool, "store", keys, A.stores, rate),
                phase(pool, "search", keys, A.searches, rate)]
    with open(A.out, "w") as f:
        json.dump({"label": A.label, "tenants": A.tenants, "procs": A.procs, "dim": A.dim,
                   "idle_cpu_ms_per_s": {k: round(v, 2) for k, v in rate.items()},
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
