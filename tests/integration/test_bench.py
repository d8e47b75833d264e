"""engram-bench against the real server: a smoke test of the benchmark harness.

Runs the load generator for a second or two on tiny data sets and checks behaviour only:
it completes, the JSON report has its fields, the counts add up, recall is exactly 1.0 on
a 200-memory data set (the server's search is exact at that size), --reuse finds the
loaded tenant and puts it back as it was, a sweep draws its charts. Latency and throughput
figures are never asserted: they depend on the machine.
"""
import json
import os
import subprocess
import tempfile

import pytest

from harness import Server, new_database, psql

BENCH = os.environ.get("ENGRAM_BENCH", "")
OPS = ["search", "search_text", "context", "store", "store_batch", "ping", "load"]


@pytest.fixture(scope="module")
def server():
    # no rate limit: a benchmark must not measure the tier's request budget
    srv = Server(new_database("b"), extra=["--premium-rate-per-s", "0"]).start()
    yield srv
    try:
        srv.stop()
    finally:
        srv.cleanup()


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="engram-bench-it-") as d:
        yield d


def bench(server, workdir, *args, check=True, timeout=180):
    assert BENCH and os.access(BENCH, os.X_OK), "ENGRAM_BENCH must name the engram-bench binary"
    cmd = [BENCH, "--port", str(server.port), "--http-port", str(server.http_port),
           "--admin-key-file", server.admin_key_file, "--state-file",
           os.path.join(workdir, "state"), "--quiet"] + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, (cmd, r.returncode, r.stdout, r.stderr)
    return r


def load_json(path):
    with open(path) as f:
        return json.load(f)


def check_counts(run):
    """Every request sent in the window is answered or counted unanswered, once."""
    ops = run["ops"]
    assert ops and set(ops) <= set(OPS)
    assert run["requests"] == sum(o["sent"] for o in ops.values())
    assert run["ok"] == sum(o["ok"] for o in ops.values())
    assert run["errors"] == sum(o["errors"] for o in ops.values())
    assert run["requests"] == run["ok"] + run["errors"] + run["unanswered"]
    assert run["latency_ms"]["count"] == run["ok"]
    for o in ops.values():
        assert o["requests"] == o["ok"] + o["errors"]
        assert o["latency_ms"]["count"] == o["ok"]
        assert sum(o["error_codes"].values()) == o["errors"]
        lat = o["latency_ms"]
        if o["ok"]:
            assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p999"] \
                <= lat["max"]


def memory_total(server, key):
    with server.client(key=key) as c:
        return c.call("memory.stats")["total"]


def state_key(workdir, name):
    with open(os.path.join(workdir, "state")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0] == name:
                return parts[1]
    raise AssertionError(f"{name} not in the state file")


def test_search_exact_recall(server, workdir):
    out = os.path.join(workdir, "search.json")
    r = bench(server, workdir, "--workload", "search", "--memories", "200", "--dim", "64",
              "--queries", "50", "--connections", "2", "--depth", "2", "--duration", "1.5",
              "--warmup", "0.3", "--reuse", "--json-out", out)
    assert "recall@10" in r.stdout and "search" in r.stdout
    d = load_json(out)
    assert d["tool"] == "engram-bench"
    assert d["config"]["memories"] == 200 and d["config"]["dim"] == 64
    assert d["config"]["mix"] == {"search": 1}
    load = d["load"]
    assert load["tenants_loaded"] == 1 and load["memories"] == 200 and load["verified"]
    assert load["errors"] == 0 and load["batches"] == 1 and load["memories_per_s"] > 0
    assert len(d["runs"]) == 1
    run = d["runs"][0]
    assert run["connections"] == 2 and run["depth"] == 2
    check_counts(run)
    assert run["errors"] == 0 and run["unanswered"] == 0 and run["ok"] > 0
    s = run["ops"]["search"]
    assert s["answers"] == s["ok"] and s["results"] == 10 * s["ok"]
    assert s["recall_slots"] == 10 * s["ok"]
    assert s["recall_hits"] == s["recall_slots"]
    assert s["recall_at_k"] == 1.0 and run["recall_at_k"] == 1.0
    assert s["throughput_rps"] > 0 and run["throughput_rps"] > 0
    assert run["server"]["resident_bytes"] > 0
    assert run["server"]["mean_latency_ms"]["memory.search"] > 0
    assert d["server_resident_bytes"] > 0
    assert d["server"]["index_vectors"] >= 200


def test_reuse_and_mixed_cleanup(server, workdir):
    # the tenant of test_search_exact_recall, found again by name and key
    out = os.path.join(workdir, "mixed.json")
    bench(server, workdir, "--workload", "mixed", "--mix", "search=60,store=20,context=10,"
          "search_text=5,store_batch=5,ping=5", "--batch-size", "10", "--memories", "200", "--dim",
          "64", "--queries", "50", "--connections", "2", "--duration", "1.5", "--warmup", "0.2",
          "--reuse", "--json-out", out)
    d = load_json(out)
    assert d["load"]["tenants_loaded"] == 0 and d["load"]["tenants_reused"] == 1
    run = d["runs"][0]
    check_counts(run)
    assert run["errors"] == 0
    ops = run["ops"]
    for op in ("search", "store", "context", "search_text", "store_batch", "ping"):
        assert ops[op]["ok"] > 0, op
    assert ops["store"]["memories"] == ops["store"]["ok"]
    assert ops["store_batch"]["memories"] == 10 * ops["store_batch"]["ok"]
    assert ops["context"]["recall_slots"] == 10 * ops["context"]["ok"]
    # stored memories that outrank loaded ones count as hits: recall stays defined
    assert 0.9 <= run["recall_at_k"] <= 1.0
    # the memories the run stored were deleted again: the data set is as loaded
    key = state_key(workdir, "bench-v2-s1-n200-d64-0")
    assert memory_total(server, key) == 200


def test_sweep_and_charts(server, workdir):
    out = os.path.join(workdir, "sweep.json")
    prefix = os.path.join(workdir, "sweep")
    bench(server, workdir, "--workload", "search", "--memories", "200", "--dim", "64",
          "--queries", "20", "--sweep-concurrency", "1,3", "--duration", "0.7", "--warmup",
          "0.1", "--reuse", "--json-out", out, "--plot-prefix", prefix)
    d = load_json(out)
    assert [r["connections"] for r in d["runs"]] == [1, 3]
    for run in d["runs"]:
        check_counts(run)
        assert run["recall_at_k"] == 1.0
    for name in ("latency", "throughput"):
        with open(f"{prefix}-{name}.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_fresh_tenants_store_batch_and_probe(server, workdir):
    # without --reuse every run gets new tenants; two tenants, connections split over them
    out = os.path.join(workdir, "batch.json")
    bench(server, workdir, "--workload", "store_batch", "--tenants", "2", "--memories", "30",
          "--dim", "16", "--batch-size", "7", "--connections", "2", "--duration", "1",
          "--warmup", "0", "--json-out", out)
    d = load_json(out)
    assert d["load"]["tenants_loaded"] == 2 and d["load"]["memories"] == 60
    assert d["load"]["batches"] == 2 * 5  # ceil(30 / 7) per tenant
    run = d["runs"][0]
    check_counts(run)
    sb = run["ops"]["store_batch"]
    assert sb["ok"] > 0 and sb["memories"] == 7 * sb["ok"] and sb["memories_per_s"] > 0
    # the readiness probe of the restart measurement, on a server that is up
    r = bench(server, workdir, "--probe-ready", "20", "--memories", "200", "--dim", "64")
    p = json.loads(r.stdout)
    assert 0 < p["healthz_unix_ns"] <= p["first_search_unix_ns"]


def test_usage_errors(server, workdir):
    for args in (["--workload", "nonsense"], ["--mix", "search=1"],
                 ["--workload", "mixed"], ["--depth", "0"], ["--sweep-concurrency", "1,x"],
                 ["--workload", "mixed", "--mix", "search=1,flying=2"], ["stray"]):
        r = bench(server, workdir, *args, check=False)
        assert r.returncode == 2, (args, r.stderr)
    r = bench(server, workdir, "--help", check=False)
    assert r.returncode == 0 and "--sweep-concurrency" in r.stdout
    # a wrong admin key is a clean failure, not a crash
    bad = os.path.join(workdir, "bad.key")
    with open(bad, "w") as f:
        f.write("not-a-key\n")
    r = bench(server, workdir, "--admin-key-file", bad, "--memories", "10", "--dim", "8",
              "--duration", "0.2", check=False)
    assert r.returncode == 1 and "unauthenticated" in r.stderr


def test_inflight_spreads_a_few_clients_over_many_tenants(server, workdir):
    """--inflight: 12 connections (one per tenant), at most 3 requests in flight over all of
    them; every tenant gets stores, and the window's stores span the wall-clock window the
    report gives (window_unix_ns, which run-targets.sh matches with its WAL samples)."""
    out = os.path.join(workdir, "inflight.json")
    bench(server, workdir, "--workload", "store", "--tenants", "12", "--connections", "12",
          "--inflight", "3", "--memories", "20", "--dim", "16", "--duration", "1.5",
          "--warmup", "0.3", "--tenant-prefix", "fl", "--json-out", out)
    d = load_json(out)
    assert d["config"]["inflight"] == 3
    run = d["runs"][0]
    check_counts(run)
    assert run["ops"]["store"]["ok"] > 12
    t0, t1 = run["window_unix_ns"]
    assert 1.2e9 < t1 - t0 < 3e9
    # every tenant stored something: ids past the 20 loaded (the run deletes what it stored,
    # so look at the counters)
    counts = psql(server.dsn, "SELECT memory_id_last FROM tenants WHERE name LIKE 'fl%' "
                                    "ORDER BY name").split()
    assert len(counts) == 12 and all(int(c) > 20 for c in counts), counts
