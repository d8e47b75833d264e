"""Sessions end their lives (issue 14): session.delete (sub-agents, branches, purged from
PostgreSQL), retention by last activity, the live-session cap (also across processes),
transcript pages that never skip or repeat an entry under concurrent appends, the
auto-compaction defaults and keep_recent, checkpoints that restore sub-agents with their
scratchpads and notes, transcript events, and session.context; against the real engramd
and PostgreSQL."""
import re
import threading

import pytest

from harness import Server, new_database, psql, server_pair, wait_for, wait_log, wait_value


def new_session(c, agent_id=1, **config):
    config.setdefault("model", "sonnet")
    return c.call("session.create", agent_id=agent_id, config=config)["session_id"]


def append(c, sid, content, role="user", **kw):
    return c.call("session.append", session_id=sid, role=role, content=content, **kw)["entry_id"]


def texts(c, sid, **kw):
    return [m["content"] for m in c.call("session.messages", session_id=sid, **kw)["messages"]]


def all_pages(c, sid, **kw):
    """Every page of session.messages: (items, as_of of each page)."""
    items, as_of, cursor = [], [], None
    while True:
        page = c.call("session.messages", session_id=sid, cursor=cursor, **kw)
        items += page["messages"]
        as_of.append(page["as_of"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items, as_of


def rows(server, table, tenant_id, ids, column="session_id"):
    idlist = ",".join(str(i) for i in ids)
    return int(psql(server.dsn, f"SELECT count(*) FROM {table} WHERE tenant_id = {tenant_id} "
                                f"AND {column} IN ({idlist})"))


# ---- session.delete -----------------------------------------------------------------------------

def test_delete_removes_everything_from_every_read_and_from_postgres(server, tenant, client):
    tid = tenant[0]
    sid = new_session(client)
    entry = append(client, sid, "secret")
    client.call("session.note.add", session_id=sid, category="decision", key="k", value="v",
                scope="session")
    client.call("session.scratchpad.update", session_id=sid, content="plan")
    kid = client.call("session.spawn", parent_id=sid, task="research",
                      return_format="summary")["session_id"]
    client.call("session.scratchpad.update", session_id=kid, content="kid plan")
    append(client, kid, "kid says")
    ck = client.call("session.checkpoint", session_id=sid, label="a")["checkpoint_id"]
    keep = new_session(client)
    append(client, keep, "kept")

    r = client.call("session.delete", session_id=sid)
    assert r["deleted"] == 2 and sorted(r["session_ids"]) == sorted([sid, kid])
    for method, params in [("session.get", {"session_id": sid}),
                           ("session.get", {"session_id": kid}),
                           ("session.messages", {"session_id": sid}),
                           ("session.notes", {"session_id": sid}),
                           ("session.scratchpad.get", {"session_id": sid}),
                           ("session.checkpoints", {"session_id": sid}),
                           ("session.children", {"session_id": sid}),
                           ("session.context", {"session_id": sid}),
                           ("session.handoff", {"session_id": sid, "mode": "recovery"}),
                           ("session.resume", {"checkpoint_id": ck}),
                           ("session.tombstone", {"entry_id": entry}),
                           ("session.append", {"session_id": kid, "role": "user",
                                               "content": "x"}),
                           ("session.delete", {"session_id": sid})]:
        assert client.call_err(method, **params)["code"] == "not_found", method
    listed = [s["session_id"] for s in client.call("session.list")["sessions"]]
    assert sid not in listed and kid not in listed and keep in listed
    # purged, not flagged
    for table in ("session_entries", "session_notes", "session_scratchpad_snaps",
                  "session_checkpoints"):
        assert rows(server, table, tid, [sid, kid]) == 0, table
    assert rows(server, "sessions", tid, [sid, kid], column="id") == 0
    assert texts(client, keep) == ["kept"]


def test_delete_of_a_source_of_branches_needs_cascade(server, tenant, client):
    tid = tenant[0]
    sid = new_session(client)
    append(client, sid, "inherited")
    kid = client.call("session.spawn", parent_id=sid, task="t",
                      return_format="summary")["session_id"]
    ck = client.call("session.checkpoint", session_id=sid, label="a")["checkpoint_id"]
    r = client.call("session.resume", checkpoint_id=ck)
    branch, branch_kid = r["session_id"], r["children"][0]["session_id"]
    err = client.call_err("session.delete", session_id=sid)
    assert err["code"] == "conflict" and err["dependents"] == 2, err
    assert "cascade" in err["message"]
    # the restored sub-agent inherits the old sub-agent's transcript: same rule
    assert client.call_err("session.delete", session_id=kid)["code"] == "conflict"
    assert texts(client, branch) == ["inherited"]
    r = client.call("session.delete", session_id=sid, cascade=True)
    assert sorted(r["session_ids"]) == sorted([sid, kid, branch, branch_kid])
    assert client.call_err("session.get", session_id=branch)["code"] == "not_found"
    assert rows(server, "session_entries", tid, [sid, kid, branch, branch_kid]) == 0


def test_deleting_a_branch_leaves_its_source(client):
    sid = new_session(client)
    append(client, sid, "a")
    ck = client.call("session.checkpoint", session_id=sid, label="a")["checkpoint_id"]
    branch = client.call("session.resume", checkpoint_id=ck)["session_id"]
    assert client.call("session.delete", session_id=branch)["session_ids"] == [branch]
    assert texts(client, sid) == ["a"]
    # the source's checkpoint still resumes
    assert texts(client, client.call("session.resume", checkpoint_id=ck)["session_id"]) == ["a"]


def test_deleted_sub_agent_is_missing_on_resume(client):
    sid = new_session(client)
    a = client.call("session.spawn", parent_id=sid, task="a", return_format="summary")
    b = client.call("session.spawn", parent_id=sid, task="b", return_format="summary")
    ck = client.call("session.checkpoint", session_id=sid, label="x")["checkpoint_id"]
    client.call("session.delete", session_id=a["session_id"])
    r = client.call("session.resume", checkpoint_id=ck)
    assert r["children_missing"] == [a["session_id"]]
    assert [c["resumed_from"] for c in r["children"]] == [b["session_id"]]


def test_delete_validates(client):
    assert client.call_err("session.delete")["code"] == "invalid_argument"
    assert client.call_err("session.delete", session_id="x")["code"] == "invalid_argument"
    assert client.call_err("session.delete", session_id=1, cascade="yes")["code"] == \
        "invalid_argument"
    assert client.call_err("session.delete", session_id=2**63)["code"] == "not_found"


# ---- retention ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def retention_server():
    srv = Server(new_database("ret"), extra=["--free-session-retention-days", "2",
                                             "--standard-session-retention-days", "0",
                                             "--maintenance-interval-s", "1"]).start()
    yield srv
    try:
        srv.stop()
    finally:
        srv.cleanup()


def age(server, tid, ids, days):
    psql(server.dsn, f"UPDATE sessions SET updated_at = now() - interval '{days} days' "
                     f"WHERE tenant_id = {tid} AND id IN ({','.join(map(str, ids))})")


def test_retention_purges_inactive_sessions_in_the_background(retention_server):
    srv = retention_server
    tid, key = srv.create_tenant(tier="free")
    std_tid, std_key = srv.create_tenant(tier="standard")
    with srv.client(key=key) as c, srv.client(key=std_key) as std:
        old = new_session(c)
        append(c, old, "old")
        old_kid = c.call("session.spawn", parent_id=old, task="t",
                         return_format="summary")["session_id"]
        fresh = new_session(c)
        # an old source whose branch is still active stays with it
        src = new_session(c)
        append(c, src, "src")
        ck = c.call("session.checkpoint", session_id=src, label="k")["checkpoint_id"]
        c.call("session.end", session_id=old)
        branch = c.call("session.resume", checkpoint_id=ck)["session_id"]
        # an old source with an old branch goes with it
        src2 = new_session(c)
        ck2 = c.call("session.checkpoint", session_id=src2, label="k")["checkpoint_id"]
        branch2 = c.call("session.resume", checkpoint_id=ck2)["session_id"]
        # a standard tenant keeps its sessions forever here
        forever = new_session(std)
        age(srv, std_tid, [forever], 400)
        # an old session whose sub-agent was active recently stays
        busy = new_session(c)
        busy_kid = c.call("session.spawn", parent_id=busy, task="t",
                          return_format="summary")["session_id"]

        age(srv, tid, [old, old_kid, src, src2, branch2, busy], 3)
        age(srv, tid, [fresh, branch, busy_kid], 1)

        gone = [old, old_kid, src2, branch2]
        wait_value(lambda: rows(srv, "sessions", tid, gone, column="id"), lambda n: n == 0,
                   "the purge of the four old sessions (rows left)", timeout=30)
        for s in gone:
            assert c.call_err("session.get", session_id=s)["code"] == "not_found"
        for s in (fresh, src, branch, busy, busy_kid):
            c.call("session.get", session_id=s)
        std.call("session.get", session_id=forever)
        assert texts(c, branch) == ["src"]
        # the purge commits, then logs what it did
        wait_log(srv, re.compile(r"purged \d+ sessions past their tier's retention"))


def test_retention_purge_is_batched(retention_server):
    srv = retention_server
    tid, key = srv.create_tenant(tier="free")
    with srv.client(key=key) as c:
        ids = []
        for i in range(7):
            ids.append(new_session(c))
            c.call("session.end", session_id=ids[-1])
    # the function itself: at most p_batch top-level sessions per call (the background
    # purge may take some of them meanwhile: count what is left)
    age(srv, tid, ids, 10)
    n = int(psql(srv.dsn, "SELECT engram_session_purge_retention('{2,0,0}', 3)"))
    assert n <= 3
    wait_value(lambda: rows(srv, "sessions", tid, ids, column="id"), lambda n: n == 0,
               "the purge of all seven sessions (rows left)", timeout=30)


# ---- the live-session cap -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def capped():
    a, b = server_pair(new_database("cap"), extra=["--free-max-live-sessions", "3"])
    yield a, b
    for s in (a, b):
        try:
            s.stop()
        finally:
            s.cleanup()


def test_live_session_cap(capped):
    a, _ = capped
    _, key = a.create_tenant(tier="free")
    with a.client(key=key) as c:
        s = [new_session(c) for _ in range(3)]
        assert c.call("tenant.usage")["sessions"] == {"live": 3, "limit": 3, "retention_days": 30}
        err = c.call_err("session.create", agent_id=1, config={"model": "m"})
        assert err["code"] == "quota_exceeded" and err["limit"] == 3 and err["usage"] == 3
        assert "live sessions" in err["message"]
        # sub-agents are not top-level sessions
        c.call("session.spawn", parent_id=s[0], task="t", return_format="summary")
        # a resume is a new live session
        ck = c.call("session.checkpoint", session_id=s[0], label="k")["checkpoint_id"]
        assert c.call_err("session.resume", checkpoint_id=ck)["code"] == "quota_exceeded"
        c.call("session.end", session_id=s[1])
        c.call("session.resume", checkpoint_id=ck)
        assert c.call_err("session.create", agent_id=1,
                          config={"model": "m"})["code"] == "quota_exceeded"
        c.call("session.delete", session_id=s[2])
        new_session(c)


def test_live_session_cap_is_exact_across_processes(capped):
    a, b = capped
    _, key = a.create_tenant(tier="free")
    results = []
    lock = threading.Lock()

    def creator(srv):
        with srv.client(key=key) as c:
            for _ in range(4):
                err, _ = c.wait(c.send("session.create", {"agent_id": 1,
                                                          "config": {"model": "m"}}))
                assert err is None or err["code"] == "quota_exceeded", err
                with lock:
                    results.append(err is None)

    threads = [threading.Thread(target=creator, args=(srv,)) for srv in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16 and results.count(True) == 3
    with b.client(key=key) as c:
        assert len(c.call("session.list", state="active")["sessions"]) == 3


# ---- transcript pages -----------------------------------------------------------------------------

def test_pages_never_skip_or_repeat_under_concurrent_appends(server, tenant, client):
    sid = new_session(client)
    for i in range(250):
        append(client, sid, f"m{i}")
    stop = threading.Event()
    appended = []

    def writer():
        with server.client(key=tenant[1]) as w:
            i = 0
            while not stop.is_set():
                append(w, sid, f"late{i}")
                appended.append(i)
                i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_for(lambda: len(appended) >= 3, what="three appends by the concurrent writer")
        items, as_of = all_pages(client, sid, limit=40)
    finally:
        stop.set()
        t.join()
    assert len(set(as_of)) == 1  # every page shows the first page's transcript
    seqs = [m["seq"] for m in items]
    assert seqs == sorted(set(seqs))  # in order, no repeats
    assert seqs == list(range(1, as_of[0] + 1))  # and nothing skipped up to that position
    assert [m["content"] for m in items[:250]] == [f"m{i}" for i in range(250)]
    # a new first page sees everything appended since
    items2, _ = all_pages(client, sid, limit=1000)
    assert len(items2) == 250 + len(appended)


def test_pages_with_summary_tail_agent_and_bytes(server, tenant):
    srv = Server(new_database("pg"), extra=["--max-entry-bytes", "2000000"]).start()
    try:
        _, key = srv.create_tenant()
        with srv.client(key=key) as c:
            sid = new_session(c, compaction={"keep_recent": 2})
            ids = [append(c, sid, f"m{i}", agent_id=1 + i % 2) for i in range(12)]
            c.call("session.summarize", session_id=sid, summary="S", through_entry_id=ids[5],
                   messages_compacted=6)
            full = texts(c, sid, limit=1000)
            assert full == ["S"] + [f"m{i}" for i in range(6, 12)]
            items, _ = all_pages(c, sid, limit=2)
            assert [m["content"] for m in items] == full
            items, _ = all_pages(c, sid, limit=2, tail=3)
            assert [m["content"] for m in items] == ["m9", "m10", "m11"]
            items, _ = all_pages(c, sid, limit=1, tail=7)
            assert [m["content"] for m in items] == full
            items, _ = all_pages(c, sid, limit=1, agent_id=2)
            assert [m["content"] for m in items] == ["S", "m7", "m9", "m11"]
            # content bytes per page: 4 MiB, at least one entry
            big = new_session(c)
            for i in range(5):
                append(c, big, str(i) * 1_500_000)
            pages = []
            cursor = None
            while True:
                p = c.call("session.messages", session_id=big, cursor=cursor)
                pages.append(len(p["messages"]))
                cursor = p["next_cursor"]
                if cursor is None:
                    break
            assert pages == [2, 2, 1]
    finally:
        srv.stop()
        srv.cleanup()


def test_messages_arguments(client):
    sid = new_session(client)
    append(client, sid, "a")
    for params in ({"cursor": "x"}, {"cursor": "1"}, {"cursor": "99.1"}, {"cursor": "1.5"},
                   {"limit": 0}, {"limit": 1001}, {"tail": 0},
                   {"include_events": 1}):
        err = client.call_err("session.messages", session_id=sid, **params)
        assert err["code"] == "invalid_argument", (params, err)
    assert client.call("session.messages", session_id=sid, limit=1)["next_cursor"] is None


# ---- compaction settings ---------------------------------------------------------------------------

def test_compaction_defaults_and_keep_recent(client):
    sid = new_session(client, compaction={"threshold": 0.8})
    cfg = client.call("session.get", session_id=sid)["config"]["compaction"]
    assert cfg == {"enabled": True, "threshold": 0.8, "keep_recent": 10,
                   "tool_result_budget": 50000, "max_failures": 3}
    ids = [append(client, sid, f"m{i}") for i in range(12)]
    err = client.call_err("session.summarize", session_id=sid, summary="s",
                          through_entry_id=ids[2], messages_compacted=3)
    assert err["code"] == "conflict" and err["keep_recent"] == 10
    assert err["messages_after"] == 9
    client.call("session.summarize", session_id=sid, summary="s", through_entry_id=ids[1],
                messages_compacted=2)
    # overrides on resume merge key by key
    ck = client.call("session.checkpoint", session_id=sid, label="k")["checkpoint_id"]
    r = client.call("session.resume", checkpoint_id=ck,
                    config_override={"compaction": {"keep_recent": 4}})
    cfg = client.call("session.get", session_id=r["session_id"])["config"]["compaction"]
    assert cfg["keep_recent"] == 4 and cfg["threshold"] == 0.8
    # sub-agents take the parent's settings
    kid = client.call("session.spawn", parent_id=sid, task="t", return_format="summary")
    assert client.call("session.get", session_id=kid["session_id"])["config"]["compaction"][
        "threshold"] == 0.8
    for bad in ({"max_failures": 0}, {"keep_recent": -1}, {"tool_result_budget": "x"}):
        assert client.call_err("session.create", agent_id=1,
                               config={"model": "m", "compaction": bad})["code"] == \
            "invalid_argument"


# ---- checkpoints restore sub-agents whole; events --------------------------------------------------

def test_checkpoint_restores_sub_agents_scratchpads_and_notes(client):
    sid = new_session(client, agent_id=1)
    kid = client.call("session.spawn", parent_id=sid, task="research", agent_id=7,
                      return_format="summary")["session_id"]
    client.call("session.scratchpad.update", session_id=kid, content="kid plan v1")
    client.call("session.note.add", session_id=kid, category="discovery", key="k1", value="one",
                scope="session")
    client.call("session.note.add", session_id=kid, category="decision", key="k2", value="two",
                scope="carry_forward")
    ck = client.call("session.checkpoint", session_id=sid, label="p")["checkpoint_id"]
    # the sub-agent goes on after the checkpoint
    client.call("session.scratchpad.update", session_id=kid, content="kid plan v2")
    client.call("session.note.add", session_id=kid, category="discovery", key="k1",
                value="changed", scope="session")
    client.call("session.note.add", session_id=kid, category="blocker", key="k3", value="later",
                scope="session")
    r = client.call("session.resume", checkpoint_id=ck)
    (restored,) = r["children"]
    assert restored["resumed_from"] == kid and restored["notes"] == 2
    new_kid = restored["session_id"]
    sp = client.call("session.scratchpad.get", session_id=new_kid)
    assert sp["content"] == "kid plan v1" and sp["version"] == 1
    notes = client.call("session.notes", session_id=new_kid)["notes"]
    assert [(n["key"], n["value"], n["scope"]) for n in notes] == [
        ("k1", "one", "session"), ("k2", "two", "carry_forward")]
    # the original goes on untouched
    assert client.call("session.scratchpad.get", session_id=kid)["content"] == "kid plan v2"
    # the restored sub-agent starts with a session_resumed event
    ev = client.call("session.messages", session_id=new_kid, include_events=True)["messages"]
    assert ev[-1]["type"] == "event" and ev[-1]["event"] == "session_resumed"
    assert ev[-1]["data"]["checkpoint_id"] == ck


def test_transcript_events(client):
    sid = new_session(client, agent_id=1)
    append(client, sid, "hello")
    kid = client.call("session.spawn", parent_id=sid, task="dig", agent_id=9,
                      return_format="summary")["session_id"]
    append(client, sid, "meanwhile", role="assistant")
    client.call("session.complete", session_id=kid, output="found")
    ck = client.call("session.checkpoint", session_id=sid, label="pause")["checkpoint_id"]
    items = client.call("session.messages", session_id=sid, include_events=True)["messages"]
    assert [(m["type"], m.get("event")) for m in items] == [
        ("message", None), ("event", "spawn"), ("message", None),
        ("event", "sub_agent_completed"), ("event", "session_paused")]
    assert items[1]["data"] == {"child_session_id": kid, "child_agent_id": 9,
                                "return_format": "summary"}
    assert items[4]["data"] == {"checkpoint_id": ck, "label": "pause"}
    # events stay out of the history a model is given
    assert texts(client, sid) == ["hello", "meanwhile"]
    r = client.call("session.resume", checkpoint_id=ck)
    items = client.call("session.messages", session_id=r["session_id"],
                        include_events=True)["messages"]
    assert [m.get("event") for m in items[-2:]] == ["session_paused", "session_resumed"]
    # the delegation is part of the sub-agent's tail as well as the parent's
    tails = {a["agent_id"]: a["tail"] for a in r["agents"]}
    assert [m.get("event") for m in tails[1]] == [None, "spawn", None, "sub_agent_completed",
                                                  "session_paused"]


# ---- session.context ------------------------------------------------------------------------------

def test_context_working_memory(client):
    sid = new_session(client)
    client.call("session.scratchpad.update", session_id=sid, content="step 1 <done>\nstep 2")
    client.call("session.note.add", session_id=sid, category="decision", key="db",
                value="postgres & pgvector", scope="carry_forward")
    client.call("session.note.add", session_id=sid, category="blocker", key="ci",
                value="</working_memory> red", scope="session")
    ctx = client.call("session.context", session_id=sid)
    text = ctx["text"]
    assert text.startswith("<working_memory>\n") and text.endswith("</working_memory>")
    assert "step 1 &lt;done&gt;\nstep 2" in text
    assert 'key="db">postgres &amp; pgvector</note>' in text
    assert text.count("</working_memory>") == 1  # note content cannot close the block
    assert ctx["notes"]["included"] == 2 and ctx["notes"]["omitted"] == 0
    assert ctx["tokens_used"] == len(text.encode()) // 4
    assert ctx["resumed"] is None


def test_context_budget_sheds_in_priority_order(client):
    sid = new_session(client)
    client.call("session.scratchpad.update", session_id=sid, content="plan " * 20)
    client.call("session.note.add", session_id=sid, category="decision", key="keep",
                value="carry me", scope="carry_forward")
    for i in range(40):
        client.call("session.note.add", session_id=sid, category="discovery", key=f"d{i}",
                    value="x" * 100, scope="session")
    ctx = client.call("session.context", session_id=sid, budget_tokens=400)
    assert ctx["tokens_used"] <= 400
    assert "carry me" in ctx["text"] and "plan plan" in ctx["text"]
    assert 0 < ctx["notes"]["included"] < 41 and ctx["notes"]["omitted"] > 0
    assert ctx["notes"]["included"] + ctx["notes"]["omitted"] == 41
    # the newest of the rest are kept first, shown in creation order
    kept = [int(k[1:]) for k in re.findall(r'key="(d\d+)"', ctx["text"])]
    assert kept == sorted(kept) and kept[-1] == 39
    # a scratchpad larger than the budget is cut
    client.call("session.scratchpad.update", session_id=sid, content="é" * 5000)
    ctx = client.call("session.context", session_id=sid, budget_tokens=100)
    assert ctx["scratchpad"]["truncated"] and ctx["tokens_used"] <= 100
    assert "[truncated]" in ctx["text"]
    assert client.call_err("session.context", session_id=sid,
                           budget_tokens=10)["code"] == "invalid_argument"


def test_context_of_a_resumed_session(client):
    sid = new_session(client, agent_id=1)
    for i in range(5):
        append(client, sid, f"one says {i}", role="assistant", agent_id=1)
        append(client, sid, f"two says {i}", role="assistant", agent_id=2)
    client.call("session.scratchpad.update", session_id=sid, content="the plan")
    ck = client.call("session.checkpoint", session_id=sid, label="p")["checkpoint_id"]
    new = client.call("session.resume", checkpoint_id=ck,
                      config_override={"transcript_replay_depth": 3})["session_id"]
    ctx = client.call("session.context", session_id=new)
    text = ctx["text"]
    assert text.startswith("## Session Context (Resumed)\nThis session was paused")
    assert "### Agent 1\n" in text and "### Agent 2\n" in text
    assert "[assistant] one says 4" in text and "[assistant] one says 1" not in text
    assert "[session_paused]" not in text and "[event] Session paused" in text
    assert text.index("## Session Context") < text.index("<working_memory>")
    assert "the plan" in text
    assert ctx["resumed"]["checkpoint_id"] == ck and ctx["resumed"]["resumed_from"] == sid
    # one agent's view holds only its own tail
    mine = client.call("session.context", session_id=new, agent_id=2)["text"]
    assert "two says 4" in mine and "one says" not in mine and "### Agent 1" not in mine
    agents = client.call("session.context", session_id=new, agent_id=2)["resumed"]["agents"]
    assert agents == [{"agent_id": 2, "items": 3, "omitted": 0}]
