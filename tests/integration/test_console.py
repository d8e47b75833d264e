"""The web console (/console) in a real browser: headless Chromium over the DevTools protocol
(browser.py) against the real engramd and PostgreSQL.

Data is stored through the HTTP/JSON API (POST /v1/rpc/{method}), the API the console itself
calls. The browser then logs in, finds a memory, opens its history, reads a session's
transcript, notes, checkpoints, sub-agents, work items, audit log and handoff package,
watches the operations charts, and logs in as the admin. Memory and transcript content
written as HTML (an <img onerror>, a <script>) must appear as text and never run.

Screenshots: ENGRAM_CONSOLE_SHOTS names the directory to write them to (the README's are
docs/console/, refreshed with ENGRAM_CONSOLE_SHOTS=$PWD/docs/console); by default they go
to a temporary directory, and the test checks that each is a PNG of the page.
"""
import json
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from browser import Browser
from fixtures import _failures, _keep_path
from harness import Server, new_database, wait_for

XSS_IMG = '<img src=x onerror="window.__xss = 1; document.title = \'pwned\'">'
XSS_SCRIPT = '<script>window.__xss = 2</script><b>bold?</b>'
MEMORY_XSS = f"Tool output quoted verbatim: {XSS_IMG} and {XSS_SCRIPT}"
TRANSCRIPT_XSS = f"Page said {XSS_SCRIPT} {XSS_IMG}"


@pytest.fixture(scope="module")
def server(request):
    """As the shared fixture's engramd (fixtures.py), sampling the last hour's figures every
    second, so that the operations charts have a history to start from."""
    srv = Server(new_database("m"), extra=["--metrics-history-step-s", "1"])
    failed_before = _failures(request)
    try:
        srv.start()
    except BaseException:
        srv.finish(failed=True)
        raise
    yield srv
    srv.finish(failed=_failures(request) > failed_before,
               keep_as=_keep_path(request, srv, "module"))


def api(server, key, method, /, **params):
    """One call of the HTTP/JSON API; the result, or raises AssertionError with the error."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}/v1/rpc/{method}",
        data=json.dumps(params).encode(), method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{method}: HTTP {e.code}: {e.read().decode()}") from None


def http(server, path, headers=None, method="GET"):
    req = urllib.request.Request(f"http://127.0.0.1:{server.http_port}{path}",
                                 headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def seed(call):
    """Stores what the console shows, through call(method, **params). Returns the ids."""
    ids = {}
    store = lambda **kw: call("memory.store", **kw)["id"]  # noqa: E731
    ids["xss"] = store(content=MEMORY_XSS, type="episode", importance=0.4, agent_id=7,
                       metadata={"tokens": ["<b>tok</b>"], "attrs": {"html": XSS_IMG}})
    ids["pref"] = store(content="The user prefers concise answers with code first.",
                        type="preference", importance=0.8, agent_id=7,
                        metadata={"strategy_id": "style", "attrs": {"key": "answer-style"}})
    ids["constraint"] = store(content="Never LP in pools with less than $100K TVL.",
                              type="constraint", importance=0.95,
                              metadata={"tokens": ["ETH", "USDC"], "protocols": ["uniswap"]})
    # two identical facts: consolidation merges them (cosine 1 >= 0.95)
    ids["dup_a"] = store(content="The staging database runs PostgreSQL 15 on port 5433.",
                         type="fact", importance=0.6, agent_id=7)
    ids["dup_b"] = store(content="The staging database runs PostgreSQL 15 on port 5433.",
                         type="fact", importance=0.7, agent_id=7)
    # a fact and a newer one with the same attrs.key: the newer supersedes the older
    ids["old_fact"] = store(content="The deploy window is Tuesday 14:00 UTC.", type="fact",
                            importance=0.5, agent_id=7, metadata={"attrs": {"key": "deploy"}})
    time.sleep(0.05)
    ids["new_fact"] = store(content="The deploy window moved to Thursday 09:00 UTC.",
                            type="fact", importance=0.5, agent_id=7,
                            metadata={"attrs": {"key": "deploy"}})
    # one memory with a longer history: updated, archived, restored
    ids["edited"] = store(content="Swap fees on the ETH/USDC pool are 0.3%.", type="fact",
                          importance=0.5, metadata={"tokens": ["ETH", "USDC"]})
    call("memory.update", id=ids["edited"], content="Swap fees on the ETH/USDC pool are 0.05%.",
         importance=0.7)
    call("memory.archive", ids=[ids["edited"]], reason="checking the fee tier")
    call("memory.restore", ids=[ids["edited"]])
    for i in range(6):
        store(content=f"Episode {i}: rebalanced the portfolio towards stablecoins.",
              type="episode", importance=0.2 + i / 10, agent_id=8, scope="agent")
    run = call("memory.consolidate")
    ids["run"] = run

    s = call("session.create", agent_id=7,
             config={"model": "claude-sonnet", "compaction": {"keep_recent": 2}})
    sid = ids["session"] = s["session_id"]
    e1 = call("session.append", session_id=sid, role="system",
              content="You are a trading assistant.")["entry_id"]
    call("session.append", session_id=sid, role="user", content="Rebalance towards USDC.",
         tokens=12)
    e3 = call("session.append", session_id=sid, role="assistant",
              content="Checking pool liquidity first.", tokens=20, cost_usdc=0.002)["entry_id"]
    bad = call("session.append", session_id=sid, role="tool", content=TRANSCRIPT_XSS)["entry_id"]
    call("session.append", session_id=sid, role="assistant",
         content="Pool TVL is $2.1M: above the limit. Proceeding.", cost_usdc=0.003)
    # keep_recent 2: two live messages follow the compacted ones
    call("session.summarize", session_id=sid, through_entry_id=e3, messages_compacted=3,
         summary="The user asked to rebalance towards USDC; liquidity was checked.")
    call("session.append", session_id=sid, role="user", content="Go ahead.")
    wrong = call("session.append", session_id=sid, role="assistant",
                 content="(an answer the user retracted)")["entry_id"]
    call("session.tombstone", entry_id=wrong)
    ids["tombstoned"] = wrong
    ids["xss_entry"] = bad
    del e1
    call("session.scratchpad.update", session_id=sid,
         content=f"# Plan\n1. check TVL\n2. swap 40% to USDC\n\n{XSS_SCRIPT}")
    w = call("session.work_item.add", session_id=sid, title="Swap 40% to USDC",
             status="in_progress")
    call("session.work_item.add", session_id=sid, title="Report the new allocation")
    call("session.note.add", session_id=sid, category="decision", key="venue",
         value="Use the Uniswap v3 0.05% pool.", scope="carry_forward")
    call("session.note.add", session_id=sid, category="blocker", key="approval",
         value=f"Waiting for approval {XSS_IMG}", scope="current_task",
         work_item_id=w["work_item_id"])
    call("session.checkpoint", session_id=sid, label="before swap")
    child = call("session.spawn", parent_id=sid, task="Find the best USDC route.",
                 return_format="summary", agent_id=9)
    ids["child"] = child["session_id"]
    call("session.append", session_id=child["session_id"], role="assistant",
         content="Route: ETH -> USDC directly.")
    call("session.complete", session_id=child["session_id"], output="Direct route, 0.05% pool.")
    call("session.work_item.update", session_id=sid, work_item_id=w["work_item_id"],
         status="done")
    call("session.checkpoint", session_id=sid, label="after swap")
    return ids


SHOTS = os.environ.get("ENGRAM_CONSOLE_SHOTS", "")


@pytest.fixture(scope="module")
def shots():
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        yield SHOTS
    else:
        with tempfile.TemporaryDirectory(prefix="engram-console-shots-") as d:
            yield d


@pytest.fixture(scope="module")
def world(server):
    tid, key = server.create_tenant(name="acme-trading", tier="premium")
    ids = seed(lambda method, /, **p: api(server, key, method, **p))
    return {"key": key, "tenant_id": tid, "ids": ids}


def shot(b, shots, name):
    path = b.screenshot(os.path.join(shots, name))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 10000, f"{name} looks empty"


def text(b, selector):
    return b.js(f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent || ''")


def no_injection(b):
    """No tag from memory content became an element, and none of its script ran."""
    assert b.js("window.__xss === undefined"), "script from stored content ran"
    assert b.js("document.title !== 'pwned'")
    assert b.js("document.querySelectorAll('main img, main script, main b').length") == 0


def test_console_files_served(server):
    status, headers, body = http(server, "/console")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    csp = headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Cache-Control"] == "no-cache"
    assert b"<script" in body and b"/console/console.js" in body
    # no inline script: every <script> loads a file of this origin
    assert body.count(b"<script") == body.count(b'<script src="/console/')
    assert http(server, "/console/")[2] == body
    for name, ctype in [("console.js", "text/javascript; charset=utf-8"),
                        ("metrics.js", "text/javascript; charset=utf-8"),
                        ("console.css", "text/css; charset=utf-8"),
                        ("icon.svg", "image/svg+xml")]:
        status, headers, body = http(server, "/console/" + name)
        assert status == 200 and headers["Content-Type"] == ctype, name
        src = os.path.join(os.path.dirname(__file__), "../../server/console", name)
        with open(src, "rb") as f:
            assert body == f.read(), f"{name} differs from server/console/{name}"
        etag = headers["ETag"]
        assert http(server, "/console/" + name, {"If-None-Match": etag})[0] == 304
    status, headers, body = http(server, "/console/console.js", method="HEAD")
    assert status == 200 and body == b""
    for path in ("/console/nope.js", "/console/a/b", "/console/../metrics",
                 "/console/%2e%2e/metrics"):
        assert http(server, path)[0] == 404, path
    assert http(server, "/consolex")[0] == 404


def test_console_in_browser(server, world, shots):
    key, ids = world["key"], world["ids"]
    base = f"http://127.0.0.1:{server.http_port}/console"
    # some traffic for the operations charts
    for _ in range(20):
        api(server, key, "memory.search", query="staging database port", top_k=3)

    with Browser() as b:
        # -- login ----------------------------------------------------------------------
        b.goto(base)
        b.wait("!!document.querySelector('#login-key')", what="the login form")
        shot(b, shots, "login.png")
        b.type("#login-key", "egk_wrong")
        b.press_enter()
        b.wait("document.getElementById('error').textContent.includes('unauthenticated')",
               what="a wrong key refused")
        b.type("#login-key", key)
        b.press_enter()
        b.wait("document.querySelectorAll('#memory-list tbody tr').length > 5",
               what="the memory list")
        # the header names the tenant, not only its id
        assert "acme-trading" in text(b, "#who") and f"({world['tenant_id']})" in text(b, "#who")
        # the key is in session storage, never in the URL
        assert key not in b.js("location.href")
        assert key in b.js("sessionStorage.getItem('engram.console')")
        assert b.js("document.cookie") == ""

        # the metrics page's parser and quantiles (metrics.js), on known input
        parsed = b.js("EngramMetrics.parse('# HELP a x\\n# TYPE a counter\\n"
                      "a{m=\"x\\\\\"y\",le=\"+Inf\"} 3\\nb 1e-3\\n')")
        assert parsed == [{"name": "a", "labels": {"m": 'x"y', "le": "+Inf"}, "value": 3},
                          {"name": "b", "labels": {}, "value": 0.001}], parsed
        before = "[[0.001, 0], [0.01, 0], [Infinity, 0]]"
        after = "[[0.001, 4], [0.01, 8], [Infinity, 8]]"
        assert b.js(f"EngramMetrics.quantile(0.5, {before}, {after})") == pytest.approx(0.001)
        assert b.js(f"EngramMetrics.quantile(0.99, {before}, {after})") == \
            pytest.approx(0.001 + 0.009 * (7.92 - 4) / 4)
        assert b.js(f"EngramMetrics.quantile(0.5, {before}, {before})") is None
        # the server's history as chart points: two samples 10 s apart, 50 requests (5 of
        # them errors) between them, all in the 1 ms bucket
        hist = {"now": 0, "step_s": 10, "le": [0.001, "+Inf"], "samples": [
            {"t": 0, "requests": 100, "errors": 1, "duration_count": 100, "duration_sum": 0.05,
             "buckets": [100, 100], "index_bytes": 5, "index_budget_bytes": 9,
             "index_vectors": 2, "resident_bytes": 7},
            {"t": 10000, "requests": 150, "errors": 6, "duration_count": 150,
             "duration_sum": 0.075, "buckets": [150, 150], "index_bytes": 6,
             "index_budget_bytes": 9, "index_vectors": 3, "resident_bytes": 8}]}
        pts = b.js(f"EngramMetrics.fromHistory({json.dumps(hist)})")
        assert len(pts) == 1, pts
        p = pts[0]
        assert p["t"] == 10000 and p["qps"] == 5 and p["eps"] == 0.5
        assert p["mean"] == pytest.approx(0.5) and 0 < p["p99"] <= 1
        assert (p["indexBytes"], p["budgetBytes"], p["rssBytes"]) == (6, 9, 8)

        # -- memories: list, escaping, filter ------------------------------------------------
        row = f"#memory-list tr[data-id='{ids['xss']}'] td.content"
        b.wait(f"!!document.querySelector(\"{row}\")", what="the XSS memory's row")
        assert text(b, row) == MEMORY_XSS
        no_injection(b)
        b.js("document.getElementById('f-type').value = 'constraint';"
             "document.getElementById('f-type').dispatchEvent(new Event('change'))")
        b.click("#filter-apply")
        b.wait("document.querySelectorAll('#memory-list tbody tr').length === 1",
               what="the type filter")
        assert ids["constraint"] == int(b.js(
            "document.querySelector('#memory-list tbody tr').dataset.id"))
        b.js("document.getElementById('f-type').value = '';"
             "document.getElementById('f-type').dispatchEvent(new Event('change'));"
             "document.getElementById('f-archived').click()")
        b.click("#filter-apply")
        b.wait(f"!!document.querySelector(\"#memory-list tr.archived[data-id='{ids['dup_a']}']\")"
               f" || !!document.querySelector(\"#memory-list tr.archived[data-id='{ids['dup_b']}']\")",
               what="archived (merged) memories with include_archived")

        # -- search: similarity, composite, score --------------------------------------------
        def accesses():
            # the index's counts, as the ranking uses them, read without counting one
            r = api(server, key, "memory.search", query="which port does the staging database use",
                    top_k=5, count_access=False)["results"]
            return {m["id"]: m["access_count"] for m in r}
        before = accesses()
        b.type("#search-query", "which port does the staging database use")
        b.click("#search-submit")
        b.wait("document.querySelectorAll('#search-results tbody tr').length > 0",
               what="search results")
        # the console's searches count no access: debugging leaves the ranking as it was
        assert accesses() == before
        heads = b.js("[...document.querySelectorAll('#search-results th')].map(t => t.textContent)")
        for col in ("similarity", "composite", "score"):
            assert col in heads
        first = b.js("[...document.querySelectorAll('#search-results tbody tr')[0].children]"
                     ".map(t => t.textContent)")
        assert "staging database" in " ".join(first)
        sim, comp, score = (float(first[heads.index(c)]) for c in ("similarity", "composite",
                                                                    "score"))
        assert 0 < sim <= 1.0001 and 0 <= comp <= 1, first
        # the default blend: similarity_weight 0.7 (rounded as shown: 3 and 4 decimals)
        assert abs(score - (0.7 * sim + 0.3 * comp)) < 0.002, first
        # a minimum similarity above every match leaves nothing; one below the best keeps it
        sims = b.js("[...document.querySelectorAll('#search-results tbody tr')].map(r => "
                    f"Number(r.children[{heads.index('similarity')}].textContent))")
        b.type("#search-min-similarity", "0.999")
        b.click("#search-submit")
        b.wait("document.querySelector('#search-results h2').textContent === "
               "'Search: 0 results'", what="no result above min_similarity 0.999")
        t = round(max(sims) - 0.002, 3)  # shown with 3 decimals: the best one passes
        b.type("#search-min-similarity", f"{t:.3f}")
        b.click("#search-submit")
        b.wait("document.querySelectorAll('#search-results tbody tr').length > 0",
               what="the results at or above min_similarity")
        kept = b.js("[...document.querySelectorAll('#search-results tbody tr')].map(r => "
                    f"Number(r.children[{heads.index('similarity')}].textContent))")
        assert 1 <= len(kept) <= len(sims) and all(x >= t - 0.0005 for x in kept), (t, kept)
        assert len(kept) == sum(1 for x in sims if x >= t + 0.0005) or \
            len(kept) <= sum(1 for x in sims if x >= t - 0.0005), (t, sims, kept)
        b.js("document.getElementById('search-min-similarity').value = ''")
        shot(b, shots, "memories.png")

        # -- a memory's record and history ---------------------------------------------------
        b.goto(f"{base}#/memory/{ids['edited']}")
        b.wait("document.querySelectorAll('#memory-history .timeline > li').length >= 4",
               what="the history of the edited memory")
        hist = b.js("[...document.querySelectorAll('#memory-history .timeline > li')]"
                    ".map(l => l.textContent)")
        assert "ended by update" in hist[0] and "0.3%" in hist[0]
        assert "ended by archive" in hist[1] and "checking the fee tier" in hist[1]
        assert "ended by restore" in hist[2]
        assert "current" in hist[-1] and "0.05%" in hist[-1]
        shot(b, shots, "memory-history.png")

        # the merge survivor names what it merged; the merged one points at it
        merged = b.js(f"""(async () => {{
            const r = await fetch('/v1/rpc/memory.get', {{method: 'POST',
              headers: {{Authorization: 'Bearer ' + {json.dumps(key)}}},
              body: JSON.stringify({{ids: [{ids['dup_a']}, {ids['dup_b']}]}})}});
            return (await r.json()).memories.map(m => [m.id, m.merged_into]); }})()""")
        loser, survivor = next(([i, m] for i, m in merged if m), (None, None))
        assert loser, f"consolidation merged nothing: {merged}, run {ids['run']}"
        b.goto(f"{base}#/memory/{loser}")
        b.wait("!!document.querySelector('#memory-record a[href^=\"#/memory/\"]')",
               what="the merged memory's link to its survivor")
        b.click("#memory-record a[href^='#/memory/']")
        b.wait(f"document.querySelector('main h1')?.textContent.startsWith('Memory {survivor}')"
               " && document.querySelectorAll('#memory-history .timeline > li').length >= 2",
               what="the survivor's history")
        assert "ended by merge" in text(b, "#memory-history")

        # the XSS memory's page: content as text, nothing injected
        b.goto(f"{base}#/memory/{ids['xss']}")
        b.wait("!!document.querySelector('#memory-content')", what="the XSS memory's page")
        assert text(b, "#memory-content") == MEMORY_XSS
        assert XSS_IMG in text(b, "#memory-record")  # metadata attrs, also as text
        no_injection(b)

        # -- sessions ------------------------------------------------------------------------
        sid = ids["session"]
        b.goto(f"{base}#/sessions")
        b.wait(f"!!document.querySelector(\"#session-list tr[data-id='{sid}']\")",
               what="the session list")
        b.click(f"#session-list tr[data-id='{sid}']")
        b.wait("document.querySelectorAll('#transcript .entry').length >= 5",
               what="the transcript")
        tr = b.js("[...document.querySelectorAll('#transcript .entry')]"
                  ".map(e => [e.className, e.textContent])")
        kinds = [c for c, _ in tr]
        assert kinds[0] == "entry summary" and "compacts 3 messages" in tr[0][1]
        assert any("tombstone" in c and f"entry {ids['tombstoned']} tombstoned" in t
                   for c, t in tr)
        assert not any("retracted" in t for _, t in tr), "a tombstoned entry was shown"
        # the session's extraction state (no model here: nothing extracted)
        card = b.js("document.querySelector('.card').textContent")
        assert "memory extraction" in card and "nothing extracted yet" in card
        assert any(c == "entry event" and "spawn" in t for c, t in tr)
        assert text(b, f"#transcript [data-entry='{ids['xss_entry']}'] .body") == TRANSCRIPT_XSS
        no_injection(b)
        shot(b, shots, "session-transcript.png")

        def tab(name, ready, what):
            b.click(f".tabs a[data-tab='{name}']")
            b.wait(f"document.querySelector('#session-pane')?.dataset.tab === '{name}' && "
                   f"({ready})", what=what)

        tab("scratchpad", "!!document.querySelector('#scratchpad')", "the scratchpad")
        assert XSS_SCRIPT in text(b, "#scratchpad")
        no_injection(b)
        tab("notes", "document.querySelectorAll('#session-pane tbody tr').length === 2",
            "the notes")
        assert XSS_IMG in text(b, "#session-pane")
        no_injection(b)
        tab("checkpoints", "document.querySelectorAll('#checkpoints > li').length === 4",
            "the checkpoint timeline")
        cps = text(b, "#checkpoints")
        assert "before swap" in cps and "after swap" in cps
        shot(b, shots, "session-checkpoints.png")
        tab("children", f"!!document.querySelector(\"#session-pane tr[data-id='{ids['child']}']\")",
            "the sub-agents")
        assert "Direct route" in text(b, "#session-pane")
        tab("work", "document.querySelectorAll('#session-pane tbody tr').length === 2",
            "the work items")
        assert "done" in text(b, "#session-pane")
        tab("audit", "document.querySelectorAll('#audit tbody tr').length > 10", "the audit log")
        actions = b.js("[...document.querySelectorAll('#audit tbody tr td:nth-child(4)')]"
                       ".map(t => t.textContent)")
        for a in ("create", "append", "tombstone", "summarize", "note_add", "checkpoint",
                  "spawn", "work_item_update"):
            assert a in actions, a
        tab("handoff", "!!document.querySelector('#handoff-get')", "the handoff form")
        b.js("document.getElementById('handoff-mode').value = 'recovery'")
        b.click("#handoff-get")
        b.wait("!!document.querySelector('#handoff [data-section=\"scratchpad\"]')",
               what="the recovery handoff package")
        for section in ("metrics", "carry_forward", "blockers", "tasks_done", "audit", "notes",
                        "checkpoint"):
            assert b.js(f"!!document.querySelector('#handoff [data-section=\"{section}\"]')"), \
                section
        assert "Use the Uniswap v3" in text(b, "#handoff")
        no_injection(b)
        shot(b, shots, "session-handoff.png")

        # -- operations ----------------------------------------------------------------------
        # the charts start from the last hour the server kept (GET /metrics/history), not
        # empty: with samples in it, the page derives points from them before it scrapes
        wait_for(lambda: len(json.loads(http(server, "/metrics/history")[2])["samples"]) >= 4,
                 what="four samples of the history")
        b.goto(f"{base}#/operations")
        b.wait("!!document.querySelector('#charts').dataset.historyPoints",
               what="the history loaded into the charts")
        assert int(b.js("document.querySelector('#charts').dataset.historyPoints")) >= 3
        b.wait("!!document.querySelector('#usage')", what="the usage panel")
        usage = text(b, "#usage")
        assert "tier premium" in usage and "Memories" in usage
        run = ids["run"]
        b.wait(f"!!document.querySelector(\"tr[data-run='{run['run_id']}']\")",
               what="the consolidation run")
        cells = b.js(f"[...document.querySelector(\"tr[data-run='{run['run_id']}']\").children]"
                     ".map(t => t.textContent)")
        assert cells[2] == "completed" and cells[5] == str(run["merged"])
        assert cells[6] == str(run["superseded"])
        # traffic between scrapes, then a QPS line with points and a latency line; the
        # traffic goes on until the legend shows it (a CI run read 0 there twice: the
        # chart's last point was still a quiet one)
        quiet = threading.Event()

        def traffic():
            while not quiet.is_set():
                api(server, key, "memory.search", query="deploy window", top_k=2)
                time.sleep(0.3)

        pump = threading.Thread(target=traffic, daemon=True)
        pump.start()
        try:
            deadline = time.time() + 30
            while time.time() < deadline and not b.js(
                    "document.querySelectorAll('#chart-qps path[data-series=qps]').length &&"
                    "document.querySelector('#chart-qps path[data-series=qps]')"
                    ".getAttribute('d').split('L').length >= 4"):
                time.sleep(0.3)
            d = b.js("document.querySelector('#chart-qps path[data-series=qps]')"
                     ".getAttribute('d')")
            assert d.count("L") >= 3, d
            assert b.js("!!document.querySelector('#chart-latency path[data-series=p50]')")
            assert b.js("!!document.querySelector('#chart-memory path[data-series=rssBytes]')")
            # the legend shows the last point: the server's history fills the chart at once
            # (its last step may be a quiet one), the live scrapes' points come every 3 s
            def qps(legend):
                try:
                    return float(legend.split(": ")[1].replace(",", ""))
                except (IndexError, ValueError):  # "–": no point yet
                    return 0.0

            legend = text(b, "#chart-qps .legend span")
            while time.time() < deadline + 30 and not qps(legend) > 0:
                time.sleep(0.5)
                legend = text(b, "#chart-qps .legend span")
            assert legend.startswith("requests/s: ") and qps(legend) > 0, legend
        finally:
            quiet.set()
            pump.join(timeout=10)
        shot(b, shots, "operations.png")

        # -- logout ---------------------------------------------------------------------------
        b.click("#logout")
        b.wait("!!document.querySelector('#login-key')", what="the login page after logout")
        assert b.js("sessionStorage.getItem('engram.console')") is None

        # -- the admin: pick a tenant ---------------------------------------------------------
        b.type("#login-key", server.admin_key())
        b.press_enter()
        b.wait(f"!!document.querySelector(\"button[data-open='{world['tenant_id']}']\")",
               what="the tenant list")
        shot(b, shots, "tenants.png")
        b.click(f"button[data-open='{world['tenant_id']}']")
        b.wait("document.querySelectorAll('#memory-list tbody tr').length > 5",
               what="the tenant's memories, opened by the admin")
        assert "acme-trading" in text(b, "#who")
        keys = api(server, server.admin_key(), "admin.key.list",
                   tenant_id=world["tenant_id"])["keys"]
        console_keys = [k for k in keys if k["name"].startswith("console ")]
        assert len(console_keys) == 1 and console_keys[0]["revoked_at"] is None
        b.click("#logout")
        b.wait("!!document.querySelector('#login-key')", what="the login page")
        keys = api(server, server.admin_key(), "admin.key.list",
                   tenant_id=world["tenant_id"])["keys"]
        assert [k["revoked_at"] is not None for k in keys
                if k["name"].startswith("console ")] == [True], "logout left the key live"

        # CSP violations and script errors are reported as errors (the wrong key's 401
        # too: Chromium logs a failed fetch); nothing else may be
        problems = [p for p in b.problems() if "401 (Unauthorized)" not in p]
        assert problems == [], problems
