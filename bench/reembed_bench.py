#!/usr/bin/env python3
"""bench/reembed_bench.py: how long an online re-embedding of one tenant takes, and what
searches see meanwhile.

Starts an engramd (ENGRAM_BIN, a release build) on a new database of the cluster named by
ENGRAM_TEST_PG_DSN (the integration tests' harness), stores N memories of real text (Debian's
package descriptions, apt-cache dumpavail) in a tenant on the built-in embedder at 384
dimensions, then changes it to the built-in embedder at 256 (admin.tenant.update
{embedding}) and times the job to its swap, with one client searching all along (p50/p99 of
those searches, and how many failed). The built-in embedder costs little, so the time is the
job's own: reading, hashing, writing the side table, and the swap.

usage: ENGRAM_BIN=build-rel/server/engramd ENGRAM_TEST_PG_DSN=... \\
       python3 bench/reembed_bench.py [N] [BATCH]
"""
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
from harness import Server, new_database  # noqa: E402


def sentences(n):
    out = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True).stdout
    seen, texts = set(), []
    for line in out.splitlines():
        if line.startswith("Description:"):
            t = line[12:].strip()
            if len(t) > 20 and t not in seen:
                seen.add(t)
                texts.append(t)
    while len(texts) < n:
        texts += [t + f" ({len(texts)})" for t in texts[: n - len(texts)]]
    return texts[:n]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    batch = sys.argv[2] if len(sys.argv) > 2 else "64"
    texts = sentences(n)
    srv = Server(new_database("rebench"), extra=["--reembed-batch", batch,
                                                  "--reembed-interval-ms", "100"]).start()
    try:
        tid, key = srv.create_tenant()
        with srv.client(key=key) as c:
            for i in range(0, n, 500):
                c.call("memory.store_batch", memories=[
                    {"content": t, "type": "fact", "importance": 0.5} for t in texts[i:i + 500]])
            c.call("memory.search", query=texts[0], top_k=10)
        lat, failed, stop = [], [0], threading.Event()

        def searcher():
            with srv.client(key=key) as c:
                k = 0
                while not stop.is_set():
                    t0 = time.perf_counter()
                    try:
                        c.call("memory.search", query=texts[k % n], top_k=10)
                        lat.append(time.perf_counter() - t0)
                    except Exception:
                        failed[0] += 1
                    k += 7
        th = threading.Thread(target=searcher)
        th.start()
        t0 = time.perf_counter()
        with srv.admin() as a:
            a.call("admin.tenant.update", tenant_id=tid, embedding={"provider": "builtin",
                                                                    "dim": 256})
            while a.call("admin.tenant.get", tenant_id=tid)["embedding"]["generation"] != 1:
                time.sleep(0.05)
        took = time.perf_counter() - t0
        stop.set()
        th.join()
        lat.sort()
        p = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3) if lat else (lambda q: 0)
        print(f"{n} memories, batch {batch}: re-embedded and swapped in {took:.1f} s "
              f"({n / took:.0f} memories/s); {len(lat)} searches meanwhile, p50 {p(0.5):.2f} ms, "
              f"p99 {p(0.99):.2f} ms, {failed[0]} failed; load {os.getloadavg()[0]:.1f}")
        with srv.client(key=key) as c:
            r = c.call("memory.search", query=texts[5], top_k=1, similarity_weight=1.0)
            print("after the swap, a memory's own text finds it:", r["results"][0]["similarity"])
    finally:
        srv.stop()
        srv.cleanup()


if __name__ == "__main__":
    main()
