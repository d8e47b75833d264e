"""Monitoring: /metrics passes `promtool check metrics` (HELP and TYPE on every metric)
after traffic of every kind, carries the process_* metrics and engram_build_info, and
deploy/prometheus/alerts.yml passes `promtool check rules`, queries only metrics a live
engramd exports, gives every alert a severity and a runbook in docs/operations.md, and its
expressions fire (and stay quiet) where they should, evaluated by promtool on made-up
series."""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import yaml

from harness import Server, new_database, structured_vectors, vec_bin, wait_for
from tlsutil import client_context, make_pki, tls_flags

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ALERTS = os.path.join(ROOT, "deploy", "prometheus", "alerts.yml")
PROM_CONFIG = os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")
OPERATIONS = os.path.join(ROOT, "docs", "operations.md")


def promtool():
    path = shutil.which("promtool")
    assert path, "promtool is missing (Debian's prometheus package; deploy/lib.sh lists it)"
    return path


@pytest.fixture(scope="module")
def live():
    """An engramd with TLS after requests of every kind (RPC and HTTP, ok and failed,
    unknown methods, sessions, a consolidation, a reload): (server, /metrics text, the
    Unix times just before it started and once it was ready)."""
    d = tempfile.mkdtemp(prefix="engram-mon-")
    pki = make_pki(d)
    srv = Server(new_database("mon"), extra=tls_flags(pki))
    srv.client_tls = client_context(pki["ca"])
    failed = True
    try:
        t0 = time.time()
        srv.start()
        t1 = time.time()
        _, key = srv.create_tenant(tier="premium")
        vecs = structured_vectors(4, 384, seed=7)
        with srv.client(key=key) as c:
            for v in vecs:
                c.call("memory.store", content="monitoring", type="fact", importance=0.5,
                       embedding=vec_bin(v))
            c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=3)
            c.call("memory.context", query="monitoring", budget_tokens=200)
            assert c.call_err("memory.search", query="x", top_k=0)["code"] == "invalid_argument"
            assert c.call_err("no.such.method")["code"] == "unknown_method"
            sid = c.call("session.create", agent_id=1, config={"model": "m"})["session_id"]
            c.call("session.append", session_id=sid, role="user", content="hello")
            c.call("session.context", session_id=sid)
            c.call("memory.consolidate")
        conn = http.client.HTTPSConnection("127.0.0.1", srv.http_port, timeout=30,
                                           context=srv.client_tls)
        conn.request("POST", "/v1/rpc/memory.search", body=json.dumps({"query": "monitoring"}),
                     headers={"Content-Type": "application/json",
                              "Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
        conn.close()
        assert srv.http_get("/readyz")[0] == 200
        srv.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: 'engram_config_reloads_total{result="ok"} 1' in
                 srv.http_get("/metrics")[1], what="the reload counted")
        status, text = srv.http_get("/metrics")
        assert status == 200
        yield srv, text, t0, t1
        failed = False
    finally:
        srv.finish(failed=failed)
        shutil.rmtree(d, ignore_errors=True)


def samples(text):
    """{name{labels}: value} of an exposition."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, val = line.rpartition(" ")
            out[key] = float(val)
    return out


def exported(text):
    """Sample names of an exposition, and the family names of its TYPE lines."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def test_promtool_check_metrics_is_clean(live):
    _, text, _, _ = live
    # labelled series of several kinds exist, so that their lines are checked too
    for want in ('engram_requests_total{method="memory.search",code="ok"}',
                 'engram_errors_total{method="memory.search",code="invalid_argument"}',
                 'engram_errors_total{method="unknown",code="unknown_method"}',
                 'engram_request_duration_seconds_bucket{method="session.append",le="+Inf"}',
                 'engram_consolidation_runs_total{trigger="on_demand",result="ok"}',
                 'engram_port_connections{port="http"}'):
        assert want in text, f"{want} missing from /metrics"
    assert "engram_tls_certificate_expiry_timestamp_seconds" in text
    r = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), \
        f"promtool check metrics ({r.returncode}):\n{r.stdout}{r.stderr}"


def test_every_family_has_help_and_type(live):
    _, text, _, _ = live
    helps, types, families = set(), {}, set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert help_text.strip(), f"{name}: empty HELP"
            assert name not in helps, f"{name}: HELP twice"
            helps.add(name)
        elif line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert name not in types, f"{name}: TYPE twice"
            types[name] = kind
        elif line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            families.add(base if types.get(base) == "histogram" else name)
    assert families, "no samples"
    for f in families:
        assert f in types, f"{f}: no TYPE line"
        assert f in helps, f"{f}: no HELP line"


def test_process_and_build_metrics(live):
    _, text, t0, t1 = live
    s = samples(text)
    # the process's start, as the kernel counts it (clock ticks): between the test's clock
    # before the start and once it answered
    assert t0 - 1 <= s["process_start_time_seconds"] <= t1 + 1, (s["process_start_time_seconds"],
                                                                 t0, t1)
    assert s["process_cpu_seconds_total"] > 0
    assert 0 < s["process_open_fds"] <= s["process_max_fds"]
    assert s["process_resident_memory_bytes"] > 10 * 2**20
    assert s["process_virtual_memory_bytes"] >= s["process_resident_memory_bytes"]
    assert s["engram_process_resident_bytes"] == s["process_resident_memory_bytes"]
    # the allocator's figures: some heap in use (the method table, the pools), and under ASan
    # (its own allocator) possibly none, but never more than the address space
    assert 0 <= s["engram_heap_bytes"] <= s["process_virtual_memory_bytes"]
    assert s["engram_heap_free_bytes"] >= 0
    with open(os.path.join(ROOT, "meson.build")) as f:
        version = re.search(r"version:\s*'([^']+)'", f.read()).group(1)
    info = [k for k in s if k.startswith("engram_build_info{")]
    assert len(info) == 1 and s[info[0]] == 1, info
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info[0]))
    assert labels["version"] == version
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode == 0:
        # a git checkout: the commit it was built from (this test's engramd was built from
        # the tree the test runs in)
        assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?", labels.get("commit", "")), labels
        assert head.stdout.strip().startswith(labels["commit"][:12])
    else:
        assert "commit" not in labels, labels
    assert s["engram_ready"] == 1
    assert s['engram_port_connections_max{port="rpc"}'] > 0
    assert s['engram_port_connections_max{port="http"}'] > 0
    assert s["engram_index_recall_target"] == pytest.approx(0.99)


# ---- alerts.yml ----------------------------------------------------------------------------

PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                "group_right", "offset", "bool"}
# metrics that Prometheus makes itself, not engramd
PROMETHEUS_OWN = {"up"}


def load_alerts():
    with open(ALERTS) as f:
        doc = yaml.safe_load(f)
    return [r for g in doc["groups"] for r in g["rules"]]


def metric_names(expr):
    """The metric names a PromQL expression selects: identifiers that are neither functions
    (followed by '(') nor keywords, outside strings, label matchers, label lists and
    ranges."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\boffset\s+-?\w+", "", e)
    names = set()
    for m in re.finditer(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)", e):
        rest = e[m.end():].lstrip()
        call = rest.startswith("(") or re.match(r"(by|without)\b", rest)  # sum by (..) (..)
        if not call and m.group(1) not in PROMQL_WORDS:
            names.add(m.group(1))
    return names


def test_metric_names_of_promql():
    assert metric_names('sum by (job, le) (rate(a_b_total{x="y(z)"}[5m])) / c') == {
        "a_b_total", "c"}
    assert metric_names("x offset 6h - y and on (job) (time() - z > 6 * 3600)") == {
        "x", "y", "z"}


def test_promtool_check_rules_and_config():
    r = subprocess.run([promtool(), "check", "rules", ALERTS], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([promtool(), "check", "config", PROM_CONFIG], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def headings_anchors(path):
    """GitHub's anchors of a Markdown file's headings, with the text under each (up to
    the next heading)."""
    anchors = {}
    current = None
    in_code = False
    with open(path) as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            m = None if in_code else re.match(r"#{1,6}\s+(.*)", line)
            if m:
                slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
                current = slug
                anchors[current] = ""
            elif current is not None:
                anchors[current] += line
    return anchors


def test_every_alert_has_a_severity_and_a_runbook():
    rules = load_alerts()
    anchors = headings_anchors(OPERATIONS)
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), "an alert name twice"
    for r in rules:
        name = r["alert"]
        assert r["labels"]["severity"] in ("page", "ticket"), name
        for k in ("summary", "description", "runbook_url"):
            assert r["annotations"].get(k), f"{name}: no {k}"
        url = r["annotations"]["runbook_url"]
        m = re.fullmatch(r"docs/operations\.md#([\w-]+)", url)
        assert m, f"{name}: runbook_url {url} is not a section of docs/operations.md"
        assert m.group(1) == name.lower(), f"{name}: runbook_url {url} is another alert's"
        text = anchors.get(m.group(1))
        assert text is not None, f"{name}: docs/operations.md has no section #{m.group(1)}"
        for part in ("Means", "Check", "Do"):
            assert f"**{part}" in text, f"{name}: its runbook has no '{part}' part"
    # what the operations item of issue 33 asks to be covered
    for want in ("EngramDown", "EngramNotReady", "EngramDatabaseUnreachable",
                 "EngramDatabasePoolSaturated", "EngramErrorRatioHigh", "EngramLatencyP99High",
                 "EngramWriteLockStuck", "EngramOutputBudgetPressure",
                 "EngramConnectionsNearMax", "EngramRecallBelowTarget",
                 "EngramConsolidationFailing", "EngramMemoryGrowth"):
        assert want in names, f"no alert {want}"
    assert {"page", "ticket"} == {r["labels"]["severity"] for r in rules}


def test_alert_expressions_use_exported_metrics(live):
    _, text, _, _ = live
    have = exported(text)
    missing = []
    for r in load_alerts():
        names = metric_names(r["expr"])
        assert names, f"{r['alert']}: no metric in {r['expr']}"
        for n in names - PROMETHEUS_OWN:
            if n not in have:
                missing.append(f"{r['alert']}: {n}")
    assert not missing, "alert expressions name metrics engramd does not export:\n" + \
        "\n".join(missing)


# Made-up series for promtool (1-minute steps, `job` and `instance` like a scrape's) and what
# each alert's expression must give at a time: fires (the labels of the sample it returns),
# or stays quiet (None). The expressions come from alerts.yml itself.
SERIES = {
    "EngramConnectionsNearMax": [
        ('engram_port_connections{port="rpc"}', "9000x20"),
        ('engram_port_connections_max{port="rpc"}', "10000x20"),
        ('engram_port_connections{port="http"}', "10x20"),
        ('engram_port_connections_max{port="http"}', "1024x20"),
    ],
    "EngramRecallBelowTarget": [
        ('engram_index_recall_estimate{kind="ann",stat="min"}', "0.95x40"),
        ('engram_index_recall_estimate{kind="flat",stat="min"}', "1x40"),
        ("engram_index_recall_target", "0.99x40"),
    ],
    "EngramErrorRatioHigh": [
        ('engram_requests_total{method="memory.search",code="ok"}', "0+950x20"),
        ('engram_requests_total{method="memory.search",code="internal"}', "0+50x20"),
        ('engram_errors_total{method="memory.search",code="internal"}', "0+50x20"),
        ('engram_errors_total{method="memory.search",code="invalid_argument"}', "0+500x20"),
    ],
    "EngramMemoryGrowth": [
        # grows 300 MiB an hour outside the indexes: 1.8 GiB in 6 hours
        ("process_resident_memory_bytes", "1073741824+5242880x600"),
        ("engram_index_bytes", "536870912x600"),
        ("engram_row_cache_bytes", "104857600x600"),
        ("process_start_time_seconds", "0x600"),
    ],
}
QUIET = {
    "EngramConnectionsNearMax": [
        ('engram_port_connections{port="rpc"}', "7000x20"),
        ('engram_port_connections_max{port="rpc"}', "10000x20"),
    ],
    "EngramRecallBelowTarget": [
        ('engram_index_recall_estimate{kind="ann",stat="min"}', "0.985x40"),
        ("engram_index_recall_target", "0.99x40"),
    ],
    "EngramErrorRatioHigh": [
        # client mistakes are not server errors
        ('engram_requests_total{method="memory.search",code="ok"}', "0+500x20"),
        ('engram_requests_total{method="memory.search",code="invalid_argument"}', "0+500x20"),
        ('engram_errors_total{method="memory.search",code="invalid_argument"}', "0+500x20"),
    ],
    "EngramMemoryGrowth": [
        # the same growth, all of it in the indexes
        ("process_resident_memory_bytes", "1073741824+5242880x600"),
        ("engram_index_bytes", "536870912+5242880x600"),
        ("engram_row_cache_bytes", "104857600x600"),
        ("process_start_time_seconds", "0x600"),
    ],
}
AT = {"EngramConnectionsNearMax": ("15m", '{instance="e1:7421",job="engram",port="rpc"}'),
      "EngramRecallBelowTarget": ("30m", '{instance="e1:7421",job="engram"}'),
      "EngramErrorRatioHigh": ("15m", '{instance="e1:7421",job="engram"}'),
      "EngramMemoryGrowth": ("8h", '{instance="e1:7421",job="engram"}')}


def with_target(series):
    name, _, rest = series.partition("{")
    labels = 'instance="e1:7421",job="engram"' + ("," + rest.rstrip("}") if rest else "")
    return name + "{" + labels + "}"


def test_alert_expressions_fire_where_they_should():
    exprs = {r["alert"]: r["expr"] for r in load_alerts()}
    tests = []
    for name, (at, labels) in AT.items():
        for series, fires in ((SERIES[name], True), (QUIET[name], False)):
            # the value is not compared (promtool wants it exact): `> bool 0` of a firing
            # expression is 1, and an expression that returns nothing gives no sample
            case = {"interval": "1m",
                    "input_series": [{"series": with_target(s), "values": v}
                                     for s, v in series],
                    "promql_expr_test": [{
                        "expr": f"({exprs[name]}) > bool -Inf",
                        "eval_time": at,
                        "exp_samples": [{"labels": labels, "value": 1}] if fires else []}]}
            tests.append(case)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "alerts_test.yml")
        with open(path, "w") as f:
            yaml.safe_dump({"rule_files": [], "tests": tests}, f)
        r = subprocess.run([promtool(), "test", "rules", path], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


# ---- GET /metrics/history ------------------------------------------------------------------

def test_history_keeps_samples_of_the_counters():
    """/metrics/history: samples every metrics_history_step_s, oldest first, whose totals
    follow /metrics (requests, errors, the latency histogram summed over methods)."""
    srv = Server(new_database("hist"), extra=["--metrics-history-step-s", "1"])
    failed = True
    try:
        srv.start()
        _, key = srv.create_tenant()
        with srv.client(key=key) as c:
            for _ in range(5):
                c.call("memory.search", query="history", top_k=1)
            assert c.call_err("memory.search", query="x", top_k=0)["code"] == "invalid_argument"
        s = samples(srv.http_get("/metrics")[1])
        requests = sum(v for k, v in s.items() if k.startswith("engram_requests_total{"))
        errors = sum(v for k, v in s.items() if k.startswith("engram_errors_total{"))

        def history():
            status, body = srv.http_get("/metrics/history")
            assert status == 200
            return json.loads(body)

        # a sample taken after the requests above holds them all
        h = wait_for(lambda: (lambda h: h if h["samples"][-1]["requests"] >= requests else None)(
            history()), what="a sample with the requests made")
        assert h["step_s"] == 1
        assert h["le"][-1] == "+Inf" and len(h["le"]) == len(
            [k for k in s if k.startswith('engram_request_duration_seconds_bucket{method="auth"')])
        ts = [x["t"] for x in h["samples"]]
        assert ts == sorted(ts) and len(set(ts)) == len(ts)
        last = h["samples"][-1]
        assert last["errors"] >= errors >= 1
        assert last["buckets"][-1] == last["duration_count"] >= requests
        assert all(a <= b for a, b in zip(last["buckets"], last["buckets"][1:]))
        assert last["resident_bytes"] > 0 and last["index_budget_bytes"] > 0
        assert abs(h["now"] - time.time() * 1000) < 60000
        failed = False
    finally:
        srv.finish(failed=failed)
