#!/usr/bin/env python3
"""Times one consolidation of a large tenant (the issue's figure: 50,000 memories at 768
dimensions, under 30 s on a 2-core machine).

usage: bench/consolidate_bench.py --port 7420 --admin-key-file var/admin.key
                                  [--memories 50000] [--dim 768] [--dup-rate 0.1]

Loads a fresh premium tenant with structured vectors (x = W z + 0.3 noise, z in R^32,
normalized) of which a fraction are near-duplicates of others (cosine > 0.97) with the same
text (what consolidation merges since issue 32: a cosine alone merges nothing), then calls
memory.consolidate and prints the run's counts and the wall-clock time of the call.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
from rpc import Client  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7420)
    ap.add_argument("--admin-key-file", default="var/admin.key")
    ap.add_argument("--memories", type=int, default=50000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--dup-rate", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    w = rng.standard_normal((a.dim, 32)) / np.sqrt(32)
    n_base = int(a.memories * (1 - a.dup_rate))
    x = rng.standard_normal((n_base, 32)) @ w.T + 0.3 * rng.standard_normal((n_base, a.dim))
    src = rng.integers(0, n_base, a.memories - n_base)
    dups = x[src]
    dups = dups + 0.05 * np.linalg.norm(dups, axis=1, keepdims=True) / np.sqrt(a.dim) * \
        rng.standard_normal(dups.shape)
    x = np.vstack([x, dups])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x = x.astype("<f4")
    admin = Client(a.port, host=a.host, key=open(a.admin_key_file).read().strip(), timeout=600)
    name = f"consolidate-bench-{int(time.time())}"
    key = admin.call("admin.tenant.create", name=name, tier="premium", embedding={"dim": a.dim})["api_key"]
    c = Client(a.port, host=a.host, key=key, timeout=600)
    t0 = time.time()
    def text(i):  # a duplicate says what its original says
        j = i if i < n_base else int(src[i - n_base])
        return f"Pool {j} on chain {j % 7} pays {j % 50 / 10:.1f}% APY to liquidity providers"

    for k in range(0, a.memories, 1000):
        c.call("memory.store_batch", memories=[
            {"content": text(i), "type": "fact", "importance": 0.5, "embedding": x[i].tobytes()}
            for i in range(k, min(a.memories, k + 1000))])
    load = time.time() - t0
    t0 = time.time()
    r = c.call("memory.consolidate")
    took = time.time() - t0
    print(f"tenant {name}: {a.memories} memories x {a.dim} dims loaded in {load:.1f} s")
    print(f"consolidation: {took:.2f} s wall clock (server run {r['duration_ms']} ms): "
          f"merged {r['merged']}, superseded {r['superseded']}, rescored {r['rescored']}, "
          f"archived {r['archived']}")
    with Client(a.port, host=a.host, key=open(a.admin_key_file).read().strip()) as adm:
        adm.call("admin.tenant.delete", name=name)


if __name__ == "__main__":
    main()
