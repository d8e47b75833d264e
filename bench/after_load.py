"""bench/after_load.py: the first searches after a bulk load (issue 34 target 2).

Run by bench/after-load.sh against its own engramd and PostgreSQL (see there). Creates one
tenant of --dim dimensions, stores --n memories with memory.store_batch (1,000 a call, as
fast as the server takes them), then at once runs --first searches (top 10, similarity_weight 1, count_access false, one client,
each query new) and measures their latency and recall@10 against an exact numpy scan; then
waits --settle seconds (the recall monitor's time) and runs --first more searches of other
new queries: the settled figures. Prints both, their ratio (the target: the first p50
within 1.2x of the settled one, recall >= 0.99), the float rows searches read per search
(engram_index_rows_read, of them near-ties: engram_index_tie_reads) and writes --out JSON.

Vectors: x = W z + 0.3 e (z in R^32, e noise), L2-normalized, W fixed by --seed: bench's
gaussian set's low intrinsic dimension. Queries come from the same distribution.
"""
import argparse
import json
import os
import sys
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python"))
from engram_client import Client  # noqa: E402


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, val = line.rsplit(" ", 1)
        try:
            out[name] = float(val)
        except ValueError:
            pass
    return out


def pct(xs, p):
    return float(np.percentile(np.asarray(xs) * 1e3, p))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--admin-key-file", required=True)
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--first", type=int, default=1000)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument("--out")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    w = rng.standard_normal((a.dim, 32))

    def vectors(n):
        x = rng.standard_normal((n, 32)) @ w.T + 0.3 * rng.standard_normal((n, a.dim))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    base = vectors(a.n)
    qs = vectors(2 * a.first)
    # exact top 10 by inner product (the vectors are normalized: cosine)
    truth = []
    for i in range(0, len(qs), 250):
        s = qs[i:i + 250] @ base.T
        truth.extend(np.argpartition(-s, 10, axis=1)[:, :10])
    admin_key = open(a.admin_key_file).read().strip()
    with Client("127.0.0.1", a.port, api_key=admin_key, timeout=120.0) as adm:
        key = adm.call("admin.tenant.create", {"name": f"al-{int(time.time())}-{os.getpid()}",
                                               "tier": "premium",
                                               "embedding": {"dim": a.dim}})["api_key"]
    c = Client("127.0.0.1", a.port, api_key=key, timeout=300.0)
    c.call("memory.search", {"embedding": qs[0].tobytes(), "top_k": 1})  # the index loaded
    pos = {}
    t0 = time.monotonic()
    for i in range(0, a.n, 1000):
        r = c.call("memory.store_batch", {"memories": [
            {"content": f"m{i + j}", "type": "fact", "importance": 0.5,
             "embedding": base[i + j].tobytes()} for j in range(min(1000, a.n - i))]})
        for j, mid in enumerate(r["ids"]):
            pos[mid] = i + j
    t_load = time.monotonic() - t0

    def phase(q0):
        m0 = metrics(a.http_port)
        lat, rec = [], []
        for qi in range(q0, q0 + a.first):
            t = time.monotonic()
            res = c.call("memory.search", {"embedding": qs[qi].tobytes(), "top_k": 10,
                                           "similarity_weight": 1.0, "count_access": False})
            lat.append(time.monotonic() - t)
            got = {pos.get(h["id"], -1) for h in res["results"]}
            rec.append(len(got & set(truth[qi].tolist())) / 10)
        m1 = metrics(a.http_port)
        d = {k: m1.get(k, 0) - m0.get(k, 0) for k in
             ("engram_index_rows_read", "engram_index_tie_reads", "engram_index_searches",
              'engram_row_cache_lookups_total{result="miss"}', "engram_index_page_ins",
              "engram_index_snapshots_written_total")}
        ns = max(d["engram_index_searches"], 1)
        return {"p50_ms": pct(lat, 50), "p90_ms": pct(lat, 90), "p99_ms": pct(lat, 99),
                "seconds": sum(lat), "recall": float(np.mean(rec)),
                "rows_read_per_search": d["engram_index_rows_read"] / ns,
                "tie_reads_per_search": d["engram_index_tie_reads"] / ns,
                "row_cache_misses": d['engram_row_cache_lookups_total{result="miss"}'],
                "page_ins": d["engram_index_page_ins"],
                "snapshots_written": d["engram_index_snapshots_written_total"],
                "load_average": open("/proc/loadavg").read().split()[0],
                "p50_by_100_ms": [pct(lat[i:i + 100], 50) for i in range(0, len(lat), 100)],
                "recall_estimate_min": m1.get(
                    'engram_index_recall_estimate{kind="ann",stat="min"}', float("nan"))}

    first = phase(0)
    time.sleep(a.settle)
    settled = phase(a.first)
    c.close()
    rep = {"n": a.n, "dim": a.dim, "searches": a.first, "load_s": t_load, "first": first,
           "settled": settled, "ratio_p50": first["p50_ms"] / settled["p50_ms"]}
    print(f"store_batch load of {a.n} x {a.dim}: {t_load:.1f} s")
    for name, p in (("first", first), ("settled", settled)):
        print(f"{name:8s} {a.first} searches: p50 {p['p50_ms']:.3f} ms  p90 {p['p90_ms']:.3f}  "
              f"p99 {p['p99_ms']:.3f}  recall@10 {p['recall']:.4f}  rows read a search "
              f"{p['rows_read_per_search']:.1f} (near-ties {p['tie_reads_per_search']:.1f})  "
              f"monitor's min estimate {p['recall_estimate_min']:.4f}  row cache misses "
              f"{p['row_cache_misses']:.0f}  page-ins {p['page_ins']:.0f}  snapshots written "
              f"{p['snapshots_written']:.0f}  load average {p['load_average']}")
        print("         p50 of each 100: " + " ".join(f"{x:.2f}" for x in p["p50_by_100_ms"]))
    print(f"first p50 / settled p50: {rep['ratio_p50']:.2f} (target <= 1.2, recall >= 0.99)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
