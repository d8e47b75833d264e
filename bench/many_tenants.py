"""bench/many_tenants.py: many small tenants in one engramd (issue 34 item 3).

Run by bench/many-tenants.sh against its own engramd and PostgreSQL (see there). Creates
--tenants tenants of --min to --max memories each (uniform, seeded per tenant) of --dim
dimensions through admin.tenant.create: the first --sample one by one with one client (the
public API's time per tenant), the rest from --procs client processes in parallel. Stores
each tenant's memories with one memory.store_batch (--procs processes), waits --idle-wait
seconds (the registry retires tenants that were written but never loaded), searches every
tenant once (--procs processes; its index is built then: a cold search), then runs a
Zipf-distributed mix of --mix searches with one client over the tenants (hot tenants stay
loaded, the tail is evicted under the index budget and comes back from its snapshot: cold
again). Prints, and writes to --out as JSON:
- the time to create and fill the tenants;
- engramd's resident memory (RSS), the allocator's bytes in use (engram_heap_bytes), the
  index bytes and the row cache bytes at the start, after filling (idle: no index loaded),
  after the first searches and after the mix, and the per-tenant cost: the heap's growth
  over tenants less the index bytes and the row cache (what a tenant costs when idle,
  beyond its vectors), and the RSS's;
- p50/p99 of the first searches (cold) and of the mix's searches, split by whether the
  mix's search found the tenant's index loaded (warm; memory.stats asked just before, which
  never loads one) or had to load it (cold);
- CPU seconds of engramd and of PostgreSQL (the postmaster and its children) per phase.
Every figure is printed with the load average beside it: the machine is shared.

Vectors: x = W z + 0.3 e (z in R^32, e noise), L2-normalized, W fixed by --seed: the same
low-intrinsic-dimension data as bench's gaussian set. Queries come from the same
distribution.
"""
import argparse
import json
import multiprocessing
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python"))
from engram_client import Client  # noqa: E402
from proc_stats import cpu_s, load_avg, pg_pids  # noqa: E402


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



# ---- the client processes (--procs): one job is a range of tenants ----------------------

A = None  # the parsed arguments, in each process


def worker_init(a):
    global A
    A = a


def tenant_vectors(i, n=None):
    """Tenant i's memories (their count drawn from [min, max] when n is None), seeded by
    (seed, i): the same whichever process stores them."""
    rng = np.random.default_rng([A.seed, i])
    w = np.random.default_rng(A.seed).standard_normal((A.dim, 32)) / np.sqrt(32)
    if n is None:
        n = int(rng.integers(A.min, A.max + 1))
    x = rng.standard_normal((n, 32)) @ w.T + 0.3 * rng.standard_normal((n, A.dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def create_range(job):
    run, lo, hi = job
    keys = []
    with Client("127.0.0.1", A.port, api_key=A.admin_key, timeout=60.0) as adm:
        for i in range(lo, hi):
            r = adm.call("admin.tenant.create", {"name": f"mt-{run}-{i}", "tier": "premium",
                                                  "embedding": {"dim": A.dim}})
            keys.append(r["api_key"])
    return lo, keys


def fill_range(job):
    lo, keys, until = job
    sizes = []
    for k, key in enumerate(keys):
        if time.time() >= until:
            break  # --fill-seconds is up: the rest stay empty
        i = lo + k
        vecs = tenant_vectors(i)
        with Client("127.0.0.1", A.port, api_key=key, timeout=120.0) as c:
            c.call("memory.store_batch", {"memories": [
                {"content": f"t{i} m{j}", "type": "fact", "importance": 0.5, "embedding": v}
                for j, v in enumerate(vecs)]})
        sizes.append(len(vecs))
    return lo, sizes


def search_range(job):
    idx, keys, qs, until = job
    lat = []
    for k, key in zip(idx, keys):
        if time.time() >= until:
            break  # --search-seconds is up
        with Client("127.0.0.1", A.port, api_key=key, timeout=120.0) as c:
            t = time.monotonic()
            c.call("memory.search", {"embedding": qs[k % len(qs)], "top_k": 10})
            lat.append(time.monotonic() - t)
    return lat


def chunks(lo, hi, size):
    return [(a, min(a + size, hi)) for a in range(lo, hi, size)]


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
    ap.add_argument("--procs", type=int, default=4,
                    help="client processes creating, filling and first-searching tenants")
    ap.add_argument("--sample", type=int, default=1000,
                    help="tenants created first one by one with one client")
    ap.add_argument("--idle-wait", type=float, default=25.0,
                    help="seconds between filling and the idle measurement")
    ap.add_argument("--fill-seconds", type=float, default=0,
                    help="stop filling after this long (0: fill every tenant); the others "
                         "stay empty, and the searches go to the filled ones")
    ap.add_argument("--search-seconds", type=float, default=0,
                    help="stop the first searches after this long (0: search every one)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.admin_key = open(a.admin_key_file).read().strip()
    worker_init(a)
    rng = np.random.default_rng(a.seed)
    report = {"tenants": a.tenants, "memories_min": a.min, "memories_max": a.max, "dim": a.dim,
              "procs": a.procs}
    eng = [a.engramd_pid]

    def snap(label):
        m = metrics(a.http_port)
        s = {"rss": m.get("engram_process_resident_bytes", 0.0),
             "heap": m.get("engram_heap_bytes", 0.0),
             "heap_free": m.get("engram_heap_free_bytes", 0.0),
             "index_bytes": m.get("engram_index_bytes", 0.0),
             "row_cache_bytes": m.get("engram_row_cache_bytes", 0.0),
             "tenants_known": m.get("engram_index_tenants_known", 0.0),
             "retired": m.get("engram_index_tenants_retired_total", 0.0),
             "vectors": m.get("engram_index_vectors", 0.0),
             "loads": metric_sum(m, "engram_index_loads_total"),
             "evictions": m.get("engram_index_evictions_total", 0.0),
             "cpu_engramd": cpu_s(eng),
             "cpu_pg": cpu_s(pg_pids(a.postmaster_pid)),
             "load": load_avg(),
             "t": time.monotonic()}
        report[label] = s
        print(f"{label:<16} RSS {s['rss'] / 2**20:7.1f} MiB  heap {s['heap'] / 2**20:7.1f} MiB "
              f"(free {s['heap_free'] / 2**20:.1f})  index {s['index_bytes'] / 2**20:7.1f} MiB  "
              f"row cache {s['row_cache_bytes'] / 2**20:.1f} MiB  registry "
              f"{s['tenants_known']:.0f} (retired {s['retired']:.0f})  vectors "
              f"{s['vectors']:.0f}  loads {s['loads']:.0f}  evictions {s['evictions']:.0f}  "
              f"cpu engramd {s['cpu_engramd']:.1f} s  postgres {s['cpu_pg']:.1f} s  "
              f"load {s['load']}", flush=True)
        return s

    def per_tenant(x, y):
        """bytes a tenant costs beyond its index and row cache, between snapshots x and y"""
        d = (y["heap"] - x["heap"] - (y["index_bytes"] - x["index_bytes"])
             - (y["row_cache_bytes"] - x["row_cache_bytes"]))
        return d / a.tenants

    s0 = snap("start")
    run = f"{int(time.time())}.{os.getpid()}"
    sample = min(a.sample, a.tenants)
    pool = multiprocessing.get_context("fork").Pool(a.procs, worker_init, (a,))
    keys = [None] * a.tenants
    t0 = time.monotonic()
    keys[:sample] = create_range((run, 0, sample))[1]
    t_sample = time.monotonic() - t0
    print(f"created {sample} tenants one by one with one client: {t_sample:.1f} s, "
          f"{t_sample / max(sample, 1) * 1e3:.2f} ms each (load {load_avg()})", flush=True)
    t1 = time.monotonic()
    done = 0
    for lo, ks in pool.imap_unordered(create_range, [(run, lo, hi) for lo, hi in
                                                     chunks(sample, a.tenants, 500)]):
        keys[lo:lo + len(ks)] = ks
        done += len(ks)
        if done % 10000 < 500:
            print(f"  {sample + done} tenants created, {time.monotonic() - t1:.0f} s "
                  f"(load {load_avg()})", flush=True)
    t_par = time.monotonic() - t1
    t_create = time.monotonic() - t0
    rest = a.tenants - sample
    print(f"created {rest} tenants with {a.procs} clients in {t_par:.1f} s "
          f"({rest / max(t_par, 1e-9):.0f} a second); all {a.tenants} in {t_create:.1f} s "
          f"(load {load_avg()})", flush=True)
    t0 = time.monotonic()
    stored = 0
    until = time.time() + (a.fill_seconds or 1e9)
    jobs = [(lo, keys[lo:hi], until) for lo, hi in chunks(0, a.tenants, 100)]
    filled = []
    for k, (lo, sz) in enumerate(pool.imap(fill_range, jobs)):
        stored += sum(sz)
        filled.extend(range(lo, lo + len(sz)))
        if (k + 1) % 100 == 0:
            el = time.monotonic() - t0
            print(f"  {(k + 1) * 100} tenants filled, {stored} memories, {el:.0f} s, "
                  f"{stored / el:.0f} memories/s (load {load_avg()})", flush=True)
    t_fill = time.monotonic() - t0
    nf = len(filled)
    report.update(filled_tenants=nf)
    print(f"filled {nf} of {a.tenants} tenants" + (" (--fill-seconds was up: the others are "
          "empty, and the searches below go to the filled ones)" if nf < a.tenants else ""),
          flush=True)
    report.update(create_sample_ms=t_sample / max(sample, 1) * 1e3, create_sample=sample,
                  create_parallel_s=t_par, create_parallel_per_s=rest / max(t_par, 1e-9),
                  create_s=t_create, fill_s=t_fill, memories=stored)
    print(f"stored {stored} memories in {t_fill:.1f} s ({stored / t_fill:.0f} a second, "
          f"{a.procs} clients; load {load_avg()})", flush=True)
    s1 = snap("filled")
    # a tenant written to and never loaded stays in the index registry until it has been
    # unused for a while (TENANT_RETIRE_NS): the idle state is measured after that
    time.sleep(a.idle_wait)
    s1i = snap("idle")

    # every tenant searched once: its index is built from PostgreSQL (cold)
    qs = tenant_vectors(a.tenants, 64)  # queries: the data's distribution, no tenant's rows
    t0 = time.monotonic()
    first = []
    until = time.time() + (a.search_seconds or 1e9)
    jobs = [(filled[lo:hi], [keys[i] for i in filled[lo:hi]], qs, until)
            for lo, hi in chunks(0, nf, 100)]
    for k, lat in enumerate(pool.imap_unordered(search_range, jobs)):
        first.extend(lat)
        if (k + 1) % 100 == 0:
            print(f"  {len(first)} tenants searched once, {time.monotonic() - t0:.0f} s "
                  f"(load {load_avg()})", flush=True)
    pool.close()
    pool.join()
    s2 = snap("searched once")
    time.sleep(a.idle_wait)
    s2i = snap("searched, idle")

    # the Zipf mix: tenant ranks drawn from a Zipf law, mapped to a fixed permutation
    perm = [filled[i] for i in rng.permutation(nf)]
    ranks = rng.zipf(a.zipf, size=a.mix * 8)
    ranks = ranks[ranks <= nf][:a.mix] - 1
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
        idle_per_tenant=per_tenant(s0, s1i), idle_rss_per_tenant=(s1i["rss"] - s0["rss"]) / a.tenants,
        used_per_tenant=per_tenant(s0, s2i),
        used_rss_per_tenant=(s2i["rss"] - s0["rss"] - s2i["index_bytes"]
                             - s2i["row_cache_bytes"]) / a.tenants,
        mix_per_tenant=per_tenant(s0, s3),
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
    print(f"idle cost per tenant beyond its index and row cache (heap growth / tenants): "
          f"{report['idle_per_tenant']:.0f} B after filling (no index loaded; RSS "
          f"{report['idle_rss_per_tenant']:.0f} B), {report['used_per_tenant']:.0f} B once each "
          f"was searched and evicted (RSS less index and row cache "
          f"{report['used_rss_per_tenant']:.0f} B), {report['mix_per_tenant']:.0f} B after the mix")
    report.update(first_searched=len(first))
    print(f"first search of {len(first)} tenants (index built from PostgreSQL, {a.procs} "
          f"clients): p50 "
          f"{report['first_p50_ms']:.2f} ms  p99 {report['first_p99_ms']:.2f} ms")
    print(f"Zipf({a.zipf}) mix: {len(ranks)} searches over {distinct} tenants, "
          f"{report['mix_loads']:.0f} index loads; 'warm' {len(warm)}: p50 "
          f"{report['warm_p50_ms']:.2f} ms p99 {report['warm_p99_ms']:.2f} ms; 'cold' "
          f"{len(cold)}: p50 {report['cold_p50_ms']:.2f} ms p99 {report['cold_p99_ms']:.2f} ms")
    print(f"per tenant: RSS {report['per_tenant_rss']:.0f} B after the first searches, of "
          f"which {report['per_tenant_beyond_index']:.0f} B beyond the index bytes and "
          f"{report['per_tenant_beyond_index_and_row_cache']:.0f} B beyond the index and the "
          f"row cache; index {report['index_bytes_per_vector']:.0f} B per loaded vector")
    for label, x, y in (("create+fill", s0, s1), ("first searches", s1i, s2),
                        ("mix", s2i, s3)):
        e, p = y["cpu_engramd"] - x["cpu_engramd"], y["cpu_pg"] - x["cpu_pg"]
        print(f"cpu {label:<15} engramd {e:7.1f} s  postgres {p:7.1f} s  "
              f"(postgres share {p / max(e + p, 1e-9) * 100:.0f} %), wall {y['t'] - x['t']:.1f} s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
