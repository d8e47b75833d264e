"""The client's method list is the server's: every method, every parameter, the same
required ones; and the generated code is what clients/gen.py writes from methods.json."""
import inspect
import json
import os
import subprocess
import sys

import engram_client
from engram_client import AsyncClient, Client
from engram_client._api import METHOD_PARAMS

CLIENTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve(root, name):
    obj = root
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def public_methods(root, prefix=""):
    """Every callable reachable through the namespaces, as dotted method names."""
    out = set()
    for attr in dir(root):
        if attr.startswith("_") or attr in ("pipeline", "call", "close", "connect",
                                            "with_options"):
            continue
        v = getattr(root, attr)
        if callable(v) and inspect.ismethod(v):
            out.add(prefix + attr)
        elif type(v).__module__ == "engram_client._api":
            out |= public_methods(v, prefix + attr + ".")
    return out


def live_methods(server):
    with Client(server.host, server.port) as c:  # `methods` needs no authentication
        return c.methods()


def test_snapshot_matches_live_server(server):
    live = sorted(live_methods(server), key=lambda m: m["name"])
    with open(os.path.join(CLIENTS, "methods.json")) as f:
        snap = json.load(f)
    assert [m["name"] for m in live] == [m["name"] for m in snap], \
        "the server's methods differ from clients/methods.json: run clients/gen.py --snapshot"
    for a, b in zip(live, snap):
        assert sorted(a["flags"]) == sorted(b["flags"]), a["name"]
        assert a["params"] == b["params"], a["name"]
        assert a.get("result") == b.get("result"), \
            f"{a['name']}: the result schema differs from clients/methods.json: run gen.py --fetch"


def test_generated_code_is_current():
    r = subprocess.run([sys.executable, os.path.join(CLIENTS, "gen.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# The argument style (README, "Methods"): the identifiers of what a call acts on may be
# given by position, everything else is keyword-only.
TARGETS = {
    "memory.get": ["ids"], "memory.archive": ["ids"], "memory.restore": ["ids"],
    "memory.delete": ["ids"], "memory.history": ["id"], "memory.update": ["id"],
    "admin.key.revoke": ["key_id"], "session.spawn": ["parent_id"],
    "session.resume": ["checkpoint_id"],
    "session.work_item.update": ["session_id", "work_item_id"],
    "memory.prompt": ["session_id"],
}


def positional(m):
    if m["name"] in TARGETS:
        return TARGETS[m["name"]]
    has_session = any(p["name"] == "session_id" for p in m["params"])
    return ["session_id"] if m["name"].startswith("session.") and has_session else []


def check_client_surface(root, live):
    names = {m["name"] for m in live}
    assert public_methods(root) == names
    for m in live:
        fn = resolve(root, m["name"])
        assert fn is not None, f"client lacks {m['name']}"
        params = list(inspect.signature(fn).parameters.values())
        assert sorted(p.name for p in params) == sorted(p["name"] for p in m["params"]), \
            m["name"]
        pos = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert pos == positional(m), m["name"]
        for p in params:
            assert p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY), (m["name"], p.name)
            spec = next(x for x in m["params"] if x["name"] == p.name)
            assert (p.default is inspect.Parameter.empty) == spec["required"], \
                (m["name"], p.name)


def test_sync_client_has_every_server_method(server):
    live = live_methods(server)
    c = Client(server.host, server.port)
    check_client_surface(c, live)
    check_client_surface(c.pipeline, live)
    assert set(METHOD_PARAMS) == {m["name"] for m in live}


def test_async_client_has_every_server_method(server):
    live = live_methods(server)
    a = AsyncClient(server.host, server.port)
    check_client_surface(a, live)
    for m in live:
        assert inspect.iscoroutinefunction(resolve(a, m["name"])), m["name"]


def test_every_error_code_has_a_class():
    doc = open(os.path.join(CLIENTS, "..", "docs", "protocol.md")).read()
    table = doc.split("## Errors", 1)[1].split("## Authentication", 1)[0]
    codes = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    assert codes == set(engram_client.errors.ERROR_CLASSES)
