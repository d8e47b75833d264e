"""bench/many_tenants.py: many small tenants in one engramd (issue 34 item 3).

Run by bench/many-tenants.sh against its own engramd and PostgreSQL (see there). Creates
--tenants tenants of --min to --max memories each (uniform, seeded) of --dim dimensions,
stores each tenant's memories with one memory.store_batch, searches every tenant once (its
index is built then: a cold search), then runs a Zipf-distributed mix of --mix searches
over the tenants (hot tenants stay loaded, the tail is evicted under the index budget and
comes back from its snapshot: cold again). Prints, and writes to --out as JSON:
- the time to create and fill the tenants;
- engramd's resident memory (RSS) and index bytes after filling, after the first searches
  and after the mix, and the per-tenant cost: RSS over tenants, and apart from the index
  bytes (bookkeeping: maps, caches, connections' share);
- p50/p99 of the first searches (cold) and of the mix's searches, split by whether the
  mix's search found the tenant's index loaded (warm; memory.stats asked just before, which
  never loads one) or had to load it (cold);
- CPU seconds of engramd and of PostgreSQL (the postmaster and its children) per phase.

Vectors: x = W z + 0.3 e (z in R^32, e noise), L2-normalized, W fixed by --seed: the same
low-intrinsic-dimension data as bench's gaussian set. Queries come from the same
distribution.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python"))
from engram_client import Client  # noqa: E402


def metrics(port):
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, val = line.rsplit(" ", 1)
        try:
            out[name] = out.get(name, 0.0) + float(val) if "{" in name else float(val)
        except ValueError:
            pass
    return out


def metric_sum(m, prefix):
    return sum(v for k, v in m.items() if k == prefix or k.startswith(prefix + "{"))


def cpu_s(pids):
    """user + system CPU seconds of the processes pids (and the children they reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except OSError:
            pass
    return total / tick


def pg_pids(postmaster):
    out = [postmaster]
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == postmaster:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def pct(xs, p):
    return float(np.percentile(np.asarray(xs), p)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=7630)
    ap.add_argument("--http-port", type=int, default=7631)
    ap.add_argument("--admin-key-file", required=True)
    ap.add_argument("--engramd-pid", type=int, required=True)
    ap.add_argument("--postmaster-pid", type=int, required=True)
    ap.add_argument("--tenants", type=int, default=10000)
    ap.add_argument("--min", type=int, default=20)
    ap.add_argument("--max", type=int, default=200)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--mix", type=int, default=20000)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    w = rng.standard_normal((a.dim, 32)) / np.sqrt(32)

    def vectors(n):
        x = rng.standard_normal((n, 32)) @ w.T + 0.3 * rng.standard_normal((n, a.dim))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    admin_key = open(a.admin_key_file).read().strip()
    report = {"tenants": a.tenants, "memories_min": a.min, "memories_max": a.max, "dim": a.dim}
    eng = [a.engramd_pid]

    def snap(label):
        m = metrics(a.http_port)
        s = {"rss": m.get("engram_process_resident_bytes", 0.0),
             "index_bytes": m.get("engram_index_bytes", 0.0),
             "row_cache_bytes": m.get("engram_row_cache_bytes", 0.0),
             "tenants_known": m.get("engram_index_tenants_known", 0.0),
             "vectors": m.get("engram_index_vectors", 0.0),
             "loads": metric_sum(m, "engram_index_loads_total"),
             "evictions": m.get("engram_index_evictions_total", 0.0),
             "cpu_engramd": cpu_s(eng),
             "cpu_pg": cpu_s(pg_pids(a.postmaster_pid)),
             "t": time.monotonic()}
        report[label] = s
        print(f"{label:<28} RSS {s['rss'] / 2**20:8.1f} MiB  index {s['index_bytes'] / 2**20:8.1f}"
              f" MiB  row cache {s['row_cache_bytes'] / 2**20:.1f} MiB  tenants in the map "
              f"{s['tenants_known']:.0f}  vectors {s['vectors']:.0f}  loads {s['loads']:.0f}  "
              f"evictions "
              f"{s['evictions']:.0f}  cpu engramd {s['cpu_engramd']:.1f} s  postgres "
              f"{s['cpu_pg']:.1f} s", flush=True)
        return s

    s0 = snap("start")
    keys, sizes = [], []
    with Client("127.0.0.1", a.port, api_key=admin_key, timeout=60.0) as adm:
        run = f"{int(time.time())}.{os.getpid()}"
        t0 = time.monotonic()
        for i in range(a.tenants):
            r = adm.call("admin.tenant.create", {"name": f"mt-{run}-{i}", "tier": "premium",
                                                  "embedding": {"dim": a.dim}})
            keys.append(r["api_key"])
        t_create = time.monotonic() - t0
    t0 = time.monotonic()
    stored = 0
    for i, key in enumerate(keys):
        n = int(rng.integers(a.min, a.max + 1))
        sizes.append(n)
        vecs = vectors(n)
        with Client("127.0.0.1", a.port, api_key=key, timeout=60.0) as c:
            c.call("memory.store_batch", {"memories": [
                {"content": f"t{i} m{j}", "type": "fact", "importance": 0.5, "embedding": v}
                for j, v in enumerate(vecs)]})
        stored += n
        if (i + 1) % 1000 == 0:
            print(f"  {i + 1} tenants filled, {stored} memories, "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
    t_fill = time.monotonic() - t0
    report.update(create_s=t_create, fill_s=t_fill, memories=stored)
    print(f"created {a.tenants} tenants in {t_create:.1f} s ({t_create / a.tenants * 1e3:.2f} ms "
          f"each), stored {stored} memories in {t_fill:.1f} s", flush=True)
    s1 = snap("filled")

    # every tenant searched once: its index is built from PostgreSQL (cold)
    clients = [None] * a.tenants
    first = []
    qs = vectors(64)
    for i, key in enumerate(keys):
        c = Client("127.0.0.1", a.port, api_key=key, timeout=60.0)
        t = time.monotonic()
        c.call("memory.search", {"embedding": qs[i % 64], "top_k": 10})
        first.append(time.monotonic() - t)
        c.close()
    s2 = snap("searched once")

    # the Zipf mix: tenant ranks drawn from a Zipf law, mapped to a fixed permutation
    perm = rng.permutation(a.tenants)
    ranks = rng.zipf(a.zipf, size=a.mix * 8)
    ranks = ranks[ranks <= a.tenants][:a.mix] - 1
    warm, cold = [], []
    open_c = {}
    for j, r in enumerate(ranks):
        ti = int(perm[r])
        c = open_c.get(ti)
        if c is None:
            if len(open_c) >= 64:  # a few connections kept, as a gateway would pool them
                open_c.pop(next(iter(open_c))).close()
            c = open_c[ti] = Client("127.0.0.1", a.port, api_key=keys[ti], timeout=60.0)
        # memory.stats never loads an index: it tells whether this search will find it
        # loaded (warm) or has to load it (cold), outside the timed call
        loaded = c.call("memory.stats", {})["index"].get("loaded")
        t = time.monotonic()
        c.call("memory.search", {"embedding": qs[j % 64], "top_k": 10})
        (warm if loaded else cold).append(time.monotonic() - t)
    for c in open_c.values():
        c.close()
    s3 = snap("after the mix")
    distinct = len(set(int(r) for r in ranks))
    report.update(
        first_p50_ms=pct(first, 50) * 1e3, first_p99_ms=pct(first, 99) * 1e3,
        mix_searches=len(ranks), mix_distinct_tenants=distinct,
        mix_loads=s3["loads"] - s2["loads"],
        warm_n=len(warm), warm_p50_ms=pct(warm, 50) * 1e3, warm_p99_ms=pct(warm, 99) * 1e3,
        cold_n=len(cold), cold_p50_ms=pct(cold, 50) * 1e3, cold_p99_ms=pct(cold, 99) * 1e3,
        per_tenant_rss=(s2["rss"] - s0["rss"]) / a.tenants,
        per_tenant_beyond_index=(s2["rss"] - s0["rss"] - s2["index_bytes"]) / a.tenants,
        per_tenant_beyond_index_and_row_cache=(s2["rss"] - s0["rss"] - s2["index_bytes"]
                                               - s2["row_cache_bytes"]) / a.tenants,
        index_bytes_per_vector=s2["index_bytes"] / max(s2["vectors"], 1))
    print(f"first search of each tenant (index built from PostgreSQL): p50 "
          f"{report['first_p50_ms']:.2f} ms  p99 {report['first_p99_ms']:.2f} ms")
    print(f"Zipf({a.zipf}) mix: {len(ranks)} searches over {distinct} tenants, "
          f"{report['mix_loads']:.0f} index loads; 'warm' {len(warm)}: p50 "
          f"{report['warm_p50_ms']:.2f} ms p99 {report['warm_p99_ms']:.2f} ms; 'cold' "
          f"{len(cold)}: p50 {report['cold_p50_ms']:.2f} ms p99 {report['cold_p99_ms']:.2f} ms")
    print(f"per tenant: RSS {report['per_tenant_rss']:.0f} B after the first searches, of "
          f"which {report['per_tenant_beyond_index']:.0f} B beyond the index bytes and "
          f"{report['per_tenant_beyond_index_and_row_cache']:.0f} B beyond the index and the "
          f"row cache; index {report['index_bytes_per_vector']:.0f} B per loaded vector")
    for label, x, y in (("create+fill", s0, s1), ("first searches", s1, s2),
                        ("mix", s2, s3)):
        e, p = y["cpu_engramd"] - x["cpu_engramd"], y["cpu_pg"] - x["cpu_pg"]
        print(f"cpu {label:<15} engramd {e:7.1f} s  postgres {p:7.1f} s  "
              f"(postgres share {p / max(e + p, 1e-9) * 100:.0f} %), wall {y['t'] - x['t']:.1f} s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
