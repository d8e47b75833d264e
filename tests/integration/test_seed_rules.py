"""Behaviours the seeds (../shared/seeds) state as rules, each test quoting its rule, against
the real engramd and PostgreSQL: carry-forward notes survive any budget (seed 004), a resumed
session's tails keep the compaction summary and an agent's delegations (seed 002), the
seeds' own names for parameters, the seeds' REST paths over the same methods (seeds 000, 003,
004), and the error order of session.resume."""
import datetime
import http.client
import json


def new_session(c, agent_id=1, **config):
    config.setdefault("model", "sonnet")
    return c.call("session.create", agent_id=agent_id, config=config)["session_id"]


def note(c, sid, key, value="v", category="decision", scope="session", **kw):
    return c.call("session.note.add", session_id=sid, category=category, key=key, value=value,
                  scope=scope, **kw)


# ---- seed 004 ---------------------------------------------------------------------------------

def test_carry_forward_notes_survive_any_budget(client):
    """Seed 004, 2.3: `carry_forward` is "Relevant beyond this session": "Included in session
    handoff package for next session/agent". A context cut to its budget drops the scratchpad's
    tail and other notes first, never a carry-forward note."""
    sid = new_session(client)
    client.call("session.scratchpad.update", session_id=sid, content="plan step. " * 4000)
    for i in range(5):
        note(client, sid, f"s{i}", "a session-scoped finding " * 10, scope="session")
    cf = [note(client, sid, f"cf{i}", f"keep me {i} " * 20, scope="carry_forward")["note_id"]
          for i in range(3)]
    ctx = client.call("session.context", session_id=sid, budget_tokens=64)
    assert set(cf) <= set(ctx["notes"]["note_ids"]), ctx["notes"]
    for i in range(3):
        assert f'key="cf{i}"' in ctx["text"]
    assert ctx["scratchpad"]["truncated"] or not ctx["scratchpad"]["included"]
    assert ctx["notes"]["omitted"] >= 1  # the session-scoped ones went first


def test_seed_names_for_note_parameters(client):
    """Seed 004, 2.2: a scratchpad entry has `related_work_item_id (FK -> work_items,
    nullable)`; 2.5: read back with `&since=2026-02-24T10:00:00Z (optional time filter)`."""
    sid = new_session(client)
    w = client.call("session.work_item.add", session_id=sid, title="W-1")["work_item_id"]
    note(client, sid, "linked", "x", related_work_item_id=w)
    got = client.call("session.notes", session_id=sid)["notes"]
    assert [(x["key"], x["work_item_id"]) for x in got] == [("linked", w)]
    err = client.call_err("session.note.add", session_id=sid, category="decision", key="k",
                          value="v", scope="session", work_item_id=w, related_work_item_id=w + 1)
    assert err["code"] == "invalid_argument"
    first = client.call("session.notes", session_id=sid)["notes"]
    cut = datetime.datetime.fromtimestamp(first[0]["created_at"] / 1000 + 0.001,
                                          datetime.timezone.utc)
    later = note(client, sid, "later", "y")
    iso = cut.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    got = client.call("session.notes", session_id=sid, since=iso)["notes"]
    assert [x["note_id"] for x in got] == [later["note_id"]]
    assert client.call("session.notes", session_id=sid, since="2026-02-24T10:00:00Z")["notes"]
    err = client.call_err("session.notes", session_id=sid, since="yesterday")
    assert err["code"] == "invalid_argument" and "since" in err["message"]


# ---- seed 000 / 002 ---------------------------------------------------------------------------

def test_pre_steer_is_the_seeds_spelling(client):
    """Seed 000: "pre-steer - Parallel simulation before owner intervention"."""
    sid = new_session(client)
    ck = client.call("session.checkpoint", session_id=sid, label="cp")["checkpoint_id"]
    r = client.call("session.resume", checkpoint_id=ck, branch_type="pre-steer")
    s = client.call("session.get", session_id=r["session_id"])
    assert s["branch_type"] == "pre_steer"


def test_resumed_tails_keep_the_compaction_summary(client):
    """Seed 002: a resumed session gets "a summary of recent activity you were involved in
    before the pause"; seed 001: summaries are entries of the transcript that stand in for
    what they compact. An agent's tail after a compaction starts with that summary."""
    sid = new_session(client)
    ids = [client.call("session.append", session_id=sid, role="assistant", agent_id=1,
                       content=f"step {i}")["entry_id"] for i in range(14)]
    client.call("session.summarize", session_id=sid, summary="steps 0-3 priced the pool",
                through_entry_id=ids[3], messages_compacted=4)
    ck = client.call("session.checkpoint", session_id=sid, label="cp")["checkpoint_id"]
    r = client.call("session.resume", checkpoint_id=ck)
    ctx = client.call("session.context", session_id=r["session_id"], budget_tokens=8000)
    assert "[summary] steps 0-3 priced the pool" in ctx["text"], ctx["text"]
    assert ctx["text"].index("[summary]") < ctx["text"].index("step 13")


def test_spawning_agent_sees_its_delegations(client):
    """Seed 002: each agent's tail is "recent activity you were involved in"; seed 000: the
    parent "receives only the child's final output". An agent that only delegated still has
    its delegation (and the child's output) in its own tail after a resume."""
    sid = new_session(client, agent_id=1)
    client.call("session.append", session_id=sid, role="user", content="go", agent_id=1)
    child = client.call("session.spawn", parent_id=sid, task="price the pool", agent_id=7,
                        return_format="summary")
    client.call("session.complete", session_id=child["session_id"], output="APY 2.3%")
    ck = client.call("session.checkpoint", session_id=sid, label="cp")["checkpoint_id"]
    r = client.call("session.resume", checkpoint_id=ck)
    ctx = client.call("session.context", session_id=r["session_id"], agent_id=7)
    agents = ctx["resumed"]["agents"]
    assert [a["agent_id"] for a in agents] == [7], agents
    assert agents[0]["items"] >= 1
    assert "price the pool" in ctx["text"]


def test_resume_of_an_unknown_checkpoint_is_not_found_even_at_the_session_cap(server):
    """Seed 000: resume "creates new session" from a checkpoint; a checkpoint that does not
    exist is `not_found` whatever the tenant's quota, since nothing would be created."""
    _, key = server.create_tenant(tier="free")
    with server.client(key=key) as c:
        for _ in range(10):  # free_max_live_sessions
            new_session(c)
        err = c.call_err("session.create", agent_id=1, config={"model": "m"})
        assert err["code"] == "quota_exceeded"
        err = c.call_err("session.resume", checkpoint_id=987654321)
        assert err["code"] == "not_found", err


# ---- the seeds' REST paths --------------------------------------------------------------------

def rest(server, verb, path, body=None, key=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request(verb, path, body=None if body is None else json.dumps(body).encode(),
                     headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else None
    finally:
        conn.close()


def test_seed_rest_paths(server, tenant):
    """Seed 003: `POST /v1/memory` "Store a new memory", `POST /v1/memory/search` "Search
    memories by semantic similarity"; seed 000: `POST /v1/sessions`, `POST
    /v1/sessions/{id}/checkpoint`, `POST /v1/sessions/{id}/resume`, `PATCH
    /v1/sessions/{id}/scratchpad`, `POST /v1/sessions/{parentId}/spawn`; seed 004: `GET
    /api/v1/session/{id}/scratchpad ?scope=session,carry_forward &category=decision,discovery
    &since=...`. Each runs the method of the same name with the path's id."""
    key = tenant[1]
    st, m = rest(server, "POST", "/v1/memory",
                 {"content": "Morpho USDC vault on Base has 2.3% base APY", "type": "fact",
                  "importance": 0.5}, key)
    assert st == 200 and m["id"] > 0, m
    st, s = rest(server, "POST", "/v1/memory/search", {"query": "USDC vault", "top_k": 3}, key)
    assert st == 200 and s["results"][0]["id"] == m["id"], s
    st, sess = rest(server, "POST", "/v1/sessions", {"agent_id": 1, "config": {"model": "m"}}, key)
    assert st == 200, sess
    sid = sess["session_id"]
    st, sp = rest(server, "PATCH", f"/v1/sessions/{sid}/scratchpad", {"content": "plan"}, key)
    assert st == 200 and sp["version"] == 1, sp
    with server.client(key=key) as c:
        assert c.call("session.scratchpad.get", session_id=sid)["content"] == "plan"
        note(c, sid, "d", "decided", category="decision", scope="session")
        note(c, sid, "x", "context", category="context", scope="session")
        note(c, sid, "t", "task", category="decision", scope="current_task")
    st, ck = rest(server, "POST", f"/v1/sessions/{sid}/checkpoint", {"label": "cp"}, key)
    assert st == 200 and ck["checkpoint_id"] > 0, ck
    st, r = rest(server, "POST", f"/v1/sessions/{sid}/resume",
                 {"checkpoint_id": ck["checkpoint_id"]}, key)
    assert st == 200 and r["session_id"] != sid, r
    st, child = rest(server, "POST", f"/v1/sessions/{sid}/spawn", {"task": "sub", "return_format": "summary"}, key)
    assert st == 200 and child["session_id"] > 0, child
    st, got = rest(server, "GET", f"/api/v1/session/{sid}/scratchpad"
                   "?scope=session,carry_forward&category=decision,discovery"
                   "&since=2026-02-24T10:00:00Z", key=key)
    assert st == 200 and [n["key"] for n in got["notes"]] == ["d"], got
    # the path's id and the body's must agree; a checkpoint of another session is refused
    st, e = rest(server, "POST", f"/v1/sessions/{sid}/checkpoint",
                 {"session_id": sid + 1, "label": "x"}, key)
    assert st == 400 and e["error"]["code"] == "invalid_argument", e
    st, e = rest(server, "POST", f"/v1/sessions/{sid + 100000}/resume",
                 {"checkpoint_id": ck["checkpoint_id"]}, key)
    assert st == 404, e
    # authentication as for /v1/rpc, and the documented errors for other verbs and paths
    st, e = rest(server, "POST", "/v1/memory", {"content": "x", "type": "fact", "importance": 0.5})
    assert st == 401, e
    st, e = rest(server, "GET", "/v1/memory", key=key)
    assert st == 405, e
    st, e = rest(server, "POST", "/v1/sessions/abc/checkpoint", {}, key)
    assert st == 404, e
    with server.client(key=key) as c:
        doc = json.loads(server.http_get("/v1/openapi.json")[1])
    for p in ("/v1/memory", "/v1/memory/search", "/v1/sessions",
              "/v1/sessions/{id}/checkpoint", "/v1/sessions/{id}/resume",
              "/v1/sessions/{id}/scratchpad", "/v1/sessions/{parentId}/spawn",
              "/api/v1/session/{id}/scratchpad"):
        assert p in doc["paths"], p
