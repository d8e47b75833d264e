#!/usr/bin/env python3
"""Precision and recall of memory.provenance on the labelled set
tests/data/provenance_pairs.jsonl (issue 32, item 7), measured through a running engramd.

usage: bench/provenance_bench.py --port 7420 --admin-key-file var/admin.key
       bench/provenance_bench.py --spawn   (starts its own engramd on a throwaway database,
                                            as the integration tests do: ENGRAM_BIN and
                                            ENGRAM_TEST_PG_DSN must be set)

Stores each item's memory in a fresh premium tenant (the tenant's embedder: built-in unless
the server says otherwise), calls memory.provenance with the item's answer, and prints per
category how many were cited by the overlap alone (overlap >= provenance_overlap_threshold,
no conflict), by the cosine alone (similarity > provenance_threshold) and by the server's
rule (its `cited`), then precision and recall of each, over all items and over the held-out
batch. The thresholds are the server's settings (--overlap and --cosine only change how the
"alone" columns are computed, to read other operating points off the same run).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
from rpc import Client  # noqa: E402

PAIRS = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "provenance_pairs.jsonl")
CATEGORIES = ["verbatim", "light_rewording", "numbers_reformatted", "partial_quote",
              "paraphrase", "different_fact", "unrelated", "different_value"]


def measure(rows, decide):
    tp = sum(1 for r in rows if r["cited"] and decide(r))
    fp = sum(1 for r in rows if not r["cited"] and decide(r))
    fn = sum(1 for r in rows if r["cited"] and not decide(r))
    p = tp / (tp + fp) if tp + fp else 0.0
    rc = tp / (tp + fn) if tp + fn else 0.0
    return f"precision {p:.3f} ({tp}/{tp + fp}) recall {rc:.3f} ({tp}/{tp + fn})"


def run(port, host, admin_key, a):
    items = [json.loads(line) for line in open(a.pairs)]
    name = f"provenance-bench-{int(time.time())}"
    with Client(port, host=host, key=admin_key) as adm:
        key = adm.call("admin.tenant.create", name=name, tier="premium")["api_key"]
    try:
        with Client(port, host=host, key=key, timeout=120) as c:
            for it in items:
                mid = c.call("memory.store", content=it["memory"], type="fact",
                             importance=0.5)["id"]
                m = c.call("memory.provenance", response=it["answer"],
                           injected=[mid])["memories"][0]
                it["server"] = m
    finally:
        with Client(port, host=host, key=admin_key) as adm:
            adm.call("admin.tenant.delete", name=name)

    def ov(r):
        m = r["server"]
        return m["overlap"] is not None and m["overlap"] >= a.overlap and not m["conflict"]

    def cos(r):
        return r["server"]["similarity"] is not None and r["server"]["similarity"] > a.cosine

    def rule(r):
        return r["server"]["cited"]

    held = [r for r in items if r.get("batch") == "holdout"]
    print(f"{len(items)} items ({len(held)} held out); overlap >= {a.overlap}, cosine > {a.cosine}")
    print(f"{'category':<20} {'items':>5} {'label':<9} {'overlap':>7} {'cosine':>6} {'server':>6}")
    for cat in CATEGORIES:
        rs = [r for r in items if r["category"] == cat]
        if not rs:
            continue
        print(f"{cat:<20} {len(rs):>5} {'cited' if rs[0]['cited'] else 'not':<9} "
              f"{sum(map(ov, rs)):>7} {sum(map(cos, rs)):>6} {sum(map(rule, rs)):>6}")
    for label, fn in (("overlap alone", ov), ("cosine alone", cos), ("server (either)", rule)):
        print(f"{label:<16} {measure(items, fn)}")
    if held:
        print(f"{'held out, server':<16} {measure(held, rule)}")
    must = [r["id"] for r in items
            if r["category"] in CATEGORIES[:3] and not rule(r)]
    print("verbatim, reworded and reformatted uses missed:", ", ".join(must) or "none")
    conflicts = sum(1 for r in items if r["server"]["conflict"])
    print(f"conflicts reported: {conflicts} "
          f"({sum(1 for r in items if r['server']['conflict'] and r['cited'])} on cited items)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7420)
    ap.add_argument("--admin-key-file", default="var/admin.key")
    ap.add_argument("--spawn", action="store_true", help="start an engramd of its own")
    ap.add_argument("--pairs", default=PAIRS)
    ap.add_argument("--overlap", type=float, default=0.5)
    ap.add_argument("--cosine", type=float, default=0.8)
    a = ap.parse_args()
    if not a.spawn:
        run(a.port, a.host, open(a.admin_key_file).read().strip(), a)
        return
    from harness import Server, new_database  # noqa: E402 (needs ENGRAM_BIN, the PG DSN)
    srv = Server(new_database("pvbench")).start()
    try:
        run(srv.port, "127.0.0.1", open(srv.admin_key_file).read().strip(), a)
    finally:
        srv.stop()
        srv.cleanup()


if __name__ == "__main__":
    main()
