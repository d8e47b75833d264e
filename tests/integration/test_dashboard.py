"""deploy/grafana/engram.json queries only metrics engramd exports: every metric name in
every panel's PromQL appears in a live /metrics (an engramd with TLS, after requests of
several kinds, an error, a consolidation and a reload)."""
import json
import os
import re
import signal
import tempfile

from harness import Server, new_database, structured_vectors, vec_bin, wait_for
from tlsutil import client_context, make_pki, tls_flags

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "engram.json")


def dashboard_exprs():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    out = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                out.append((p["title"], t["expr"]))
    walk(dash["panels"])
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            out.append((f"variable {v['name']}", q["query"]))
    return out


def balanced(expr):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    in_str = False
    for ch in expr:
        if ch == '"':
            in_str = not in_str
        elif in_str:
            continue
        elif ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack and not in_str


def exported(text):
    """Sample names of a Prometheus exposition, with the base names of histograms."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def test_dashboard_is_well_formed():
    exprs = dashboard_exprs()
    assert len(exprs) > 30
    for title, e in exprs:
        assert balanced(e), f"{title}: unbalanced PromQL: {e}"
        assert re.search(r"\bengram_\w+", e), f"{title}: queries no engram metric: {e}"


def test_every_metric_on_the_dashboard_is_exported():
    d = tempfile.mkdtemp(prefix="engram-dash-")
    pki = make_pki(d)
    srv = Server(new_database("dash"), extra=tls_flags(pki))
    srv.client_tls = client_context(pki["ca"])
    try:
        srv.start()
        _, key = srv.create_tenant(tier="premium")
        vecs = structured_vectors(4, 384, seed=5)
        with srv.client(key=key) as c:
            for v in vecs:
                c.call("memory.store", content="dashboard", type="fact", importance=0.5,
                       embedding=vec_bin(v))
            c.call("memory.search", embedding=vec_bin(vecs[0]), top_k=3)
            c.call("memory.search", embedding=vec_bin(vecs[1]), top_k=3)
            assert c.call_err("memory.search", query="x", top_k=0)["code"] == "invalid_argument"
            c.call("memory.consolidate")
        srv.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: 'engram_config_reloads_total{result="ok"} 1' in
                        srv.http_get("/metrics")[1])
        status, text = srv.http_get("/metrics")
        assert status == 200
        have = exported(text)
        missing = []
        for title, e in dashboard_exprs():
            for name in re.findall(r"\bengram_\w+", e):
                if name not in have:
                    missing.append(f"{title}: {name}")
        assert not missing, "metrics on the dashboard that engramd does not export:\n" + \
            "\n".join(missing)
        srv.stop()
    finally:
        srv.cleanup()
